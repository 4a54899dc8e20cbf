//! Weighted permits and the start-rate limit against the real local server: the limit bounds
//! the sum of the weights held (S1 generalised), a release or cleanup subtracts a weight once
//! however often it is sent and whatever weight its caller believes, a heavy head of the line
//! waits and nobody passes it (L2), a lowered limit admits nothing above it, and a start rate
//! holds under 50 contenders. Each race is made to happen (held requests, concurrent
//! contenders) and checked by an independent reader of the raw item
//! ([`local_aws::observe`]), not by the product's decoder.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use local_aws::names::{id, limit, lock};
use local_aws::observe::{least_spacing, most_in_window, observe};
use local_aws::proxy::{HoldingProxy, Target};
use local_aws::{client_for, endpoint, fresh_table};
use semaphore_core::{
    AcquireOutcome, Attempt, Claim, Clock, DynamoStore, ExecutionState, ExecutionStatus,
    FenceReason, FencingToken, HolderId, Identity, ItemStore, LockName, ManualClock, PortError,
    Rate, ReleaseOutcome, Run, Semaphore, TaskToken, Terms, Waiter, Waker, Weight,
};

const T0: u64 = 1_800_000_000_000;

fn weight(n: i64) -> Weight {
    Weight::new(n).expect("a valid weight in the test")
}

fn terms(n: i64, w: i64) -> Terms {
    Terms::new(limit(n), weight(w), None).expect("weight within the limit")
}

fn rated(n: i64, per_second: f64) -> Terms {
    Terms::new(
        limit(n),
        Weight::ONE,
        Some(Rate::per_second(per_second).unwrap()),
    )
    .unwrap()
}

async fn seen(store: &DynamoStore, l: &LockName) -> local_aws::observe::Observed {
    observe(store.client(), store.table(), l.as_str())
        .await
        .expect("the lock's item exists")
}

fn acquired(outcome: AcquireOutcome) -> FencingToken {
    match outcome {
        AcquireOutcome::Acquired { token, .. } => token,
        other => panic!("expected a slot, got {other:?}"),
    }
}

#[tokio::test]
async fn the_limit_bounds_the_sum_of_the_weights_held() {
    let store = fresh_table().await;
    let sem = Semaphore::new(store.clone());
    let l = lock("weighted");
    let big = id("big", "r0");
    acquired(sem.acquire(&l, &big, terms(10, 4)).await.unwrap());
    for n in 0..6 {
        acquired(
            sem.acquire(&l, &id(&format!("small-{n}"), "r0"), terms(10, 1))
                .await
                .unwrap(),
        );
    }
    let now = seen(&store, &l).await;
    now.assert_safe(10);
    assert_eq!((now.used, now.holders.len()), (10, 7));
    // Full by weight, though only 7 of 10 "slots" are holders.
    assert_eq!(
        sem.acquire(&l, &id("one-more", "r0"), terms(10, 1))
            .await
            .unwrap(),
        AcquireOutcome::Full {
            count: 7,
            used: 10,
            limit: limit(10)
        }
    );
    // Freeing the big one makes room for a weight of 4, not 5.
    let claim = shows(&sem, &l, &big, weight(4)).await;
    sem.release_seeing(&l, &big, claim).await.unwrap();
    assert!(matches!(
        sem.acquire(&l, &id("five", "r0"), terms(10, 5))
            .await
            .unwrap(),
        AcquireOutcome::Full { used: 6, .. }
    ));
    acquired(
        sem.acquire(&l, &id("four", "r0"), terms(10, 4))
            .await
            .unwrap(),
    );
    seen(&store, &l).await.assert_safe(10);
}

#[tokio::test]
async fn a_release_subtracts_the_weight_held_once_whatever_its_caller_believes() {
    let store = fresh_table().await;
    let sem = Semaphore::new(store.clone());
    let l = lock("wrong-weight");
    let heavy = id("heavy", "r0");
    let token = acquired(sem.acquire(&l, &heavy, terms(5, 3)).await.unwrap());
    // Believed weight 1 (its input lost the weight): refused, sent again with the weight held.
    let claim = Claim::Slot {
        token,
        weight: Weight::ONE,
    };
    let (outcome, after) = sem.release_seeing(&l, &heavy, claim).await.unwrap();
    assert_eq!(
        outcome,
        ReleaseOutcome::Released {
            token: Some(token),
            count: 0,
            waiting: 0
        }
    );
    assert_eq!(after.used, 0);
    // A duplicate, and a duplicate that believes the right weight: nothing more is subtracted.
    for belief in [Weight::ONE, weight(3)] {
        let claim = Claim::Slot {
            token,
            weight: belief,
        };
        let (outcome, _) = sem.release_seeing(&l, &heavy, claim).await.unwrap();
        assert_eq!(
            outcome,
            ReleaseOutcome::NotHeld {
                count: 0,
                waiting: 0
            }
        );
    }
    let now = seen(&store, &l).await;
    now.assert_safe(5);
    assert_eq!(now.used, 0);
    // The whole limit is there to take, and no more.
    acquired(
        sem.acquire(&l, &id("all", "r0"), terms(5, 5))
            .await
            .unwrap(),
    );
    seen(&store, &l).await.assert_safe(5);
}

#[tokio::test]
async fn concurrent_duplicate_releases_subtract_once() {
    let store = fresh_table().await;
    let sem = Semaphore::new(store.clone());
    let l = lock("duplicates");
    let heavy = id("heavy", "r0");
    let token = acquired(sem.acquire(&l, &heavy, terms(6, 3)).await.unwrap());
    acquired(
        sem.acquire(&l, &id("other", "r0"), terms(6, 2))
            .await
            .unwrap(),
    );
    let releases = (0..8).map(|n| {
        let (sem, l, heavy) = (sem.clone(), l.clone(), heavy.clone());
        // Half believe the right weight, half do not.
        let belief = if n % 2 == 0 { weight(3) } else { Weight::ONE };
        let claim = Claim::Slot {
            token,
            weight: belief,
        };
        tokio::spawn(async move { sem.release_seeing(&l, &heavy, claim).await })
    });
    let mut released = 0;
    for release in releases {
        if let ReleaseOutcome::Released { .. } = release.await.unwrap().unwrap().0 {
            released += 1;
        }
    }
    assert_eq!(released, 1, "one of the duplicates freed the slot");
    let now = seen(&store, &l).await;
    now.assert_safe(6);
    assert_eq!(now.used, 2, "the other holder's weight, and only it");
}

/// The operator's release (no token) of an acquisition that holds nothing yet sends its fence
/// alone, on the check that nothing is held. An acquire of it that lands between the release's
/// read and that fence (held here in flight) is still freed: the fence is refused, and the
/// release sent again removes the slot with its weight.
#[tokio::test]
async fn an_acquire_landing_between_a_releases_rounds_is_freed_by_the_release() {
    let store = fresh_table().await;
    let proxy = HoldingProxy::start(endpoint()).await;
    let through = Semaphore::new(DynamoStore::new(
        client_for(&proxy.endpoint()),
        store.table(),
    ));
    let direct = Semaphore::new(store.clone());
    let l = lock("between-rounds");
    let late = id("late", "r0");
    acquired(
        direct
            .acquire(&l, &id("other", "r0"), terms(5, 1))
            .await
            .unwrap(),
    );
    // The release's write (its fence alone, after a read that found nothing held) is held.
    proxy.hold(Target::Operation("UpdateItem".to_owned()), 1);
    let release = {
        let (l, late) = (l.clone(), late.clone());
        tokio::spawn(async move { through.release_seeing(&l, &late, Claim::Operator).await })
    };
    proxy.wait_held(1).await;
    // Now the acquire lands, ahead of the held fence.
    acquired(direct.acquire(&l, &late, terms(5, 2)).await.unwrap());
    assert_eq!(seen(&store, &l).await.used, 3);
    proxy.release_held();
    let (outcome, after) = release.await.unwrap().unwrap();
    assert!(
        matches!(outcome, ReleaseOutcome::Released { .. }),
        "{outcome:?}"
    );
    assert!(
        proxy.held_answers().iter().any(|a| a.condition_failed),
        "the held fence was refused: {:?}",
        proxy.held_answers()
    );
    assert_eq!(after.used, 1);
    let now = seen(&store, &l).await;
    now.assert_safe(5);
    assert_eq!(now.holders.len(), 1);
    // And the released acquisition is fenced for good (S3).
    assert_eq!(
        direct.acquire(&l, &late, terms(5, 2)).await.unwrap(),
        AcquireOutcome::Fenced(FenceReason::AcquisitionReleased)
    );
}

#[tokio::test]
async fn cleanup_frees_an_ended_executions_weights_once() {
    let store = fresh_table().await;
    let sem = Semaphore::new(store.clone());
    let l = lock("cleanup-weights");
    let holder = HolderId::new("ended").unwrap();
    let (a, b) = (
        Identity::new(
            holder.clone(),
            semaphore_core::AcquisitionId::new("a").unwrap(),
        ),
        Identity::new(
            holder.clone(),
            semaphore_core::AcquisitionId::new("b").unwrap(),
        ),
    );
    acquired(sem.acquire(&l, &a, terms(8, 3)).await.unwrap());
    acquired(sem.acquire(&l, &b, terms(8, 2)).await.unwrap());
    acquired(
        sem.acquire(&l, &id("alive", "r0"), terms(8, 1))
            .await
            .unwrap(),
    );
    // The cleanup's fence sees both slots; one is released before its free lands.
    let fenced = sem.fence(&l, &holder, Run::FIRST).await.unwrap();
    assert_eq!(fenced.slots.len(), 2);
    let claim = shows(&sem, &l, &a, weight(3)).await;
    sem.release_seeing(&l, &a, claim).await.unwrap();
    let outcome = sem.free(&fenced).await.unwrap();
    assert_eq!(
        outcome
            .freed
            .iter()
            .map(|(id, h)| (id.clone(), h.weight))
            .collect::<Vec<_>>(),
        [(b.clone(), weight(2))]
    );
    // A duplicate cleanup frees nothing more.
    let again = sem.cleanup(&l, &holder).await.unwrap();
    assert!(again.freed.is_empty());
    let now = seen(&store, &l).await;
    now.assert_safe(8);
    assert_eq!(now.used, 1);
}

/// A later acquire that asks for a lower limit is checked against its own limit: it lands only
/// if the weight held plus its own fits under it, so the stored limit (the last admitted
/// acquisition's) is never below the weight held; nobody is evicted, and holders of the higher
/// limit drain.
#[tokio::test]
async fn a_lowered_limit_admits_nothing_above_it() {
    let store = fresh_table().await;
    let sem = Semaphore::new(store.clone());
    let l = lock("lowered");
    for n in 0..3 {
        acquired(
            sem.acquire(&l, &id(&format!("h{n}"), "r0"), terms(5, 1))
                .await
                .unwrap(),
        );
    }
    assert!(matches!(
        sem.acquire(&l, &id("low", "r0"), terms(2, 1))
            .await
            .unwrap(),
        AcquireOutcome::Full { used: 3, .. }
    ));
    let item = sem.status(&l).await.unwrap();
    assert_eq!(item.limit, Some(limit(5)), "a refused acquire sets nothing");
    // A higher-limit acquire still fits: 4 of 5.
    acquired(
        sem.acquire(&l, &id("high", "r0"), terms(5, 1))
            .await
            .unwrap(),
    );
    for n in 0..3 {
        sem.release(&l, &id(&format!("h{n}"), "r0"), Claim::Operator)
            .await
            .unwrap();
    }
    // 1 held: the lower limit admits one more (2 of 2) and becomes the lock's.
    acquired(
        sem.acquire(&l, &id("low", "r0"), terms(2, 1))
            .await
            .unwrap(),
    );
    let item = sem.status(&l).await.unwrap();
    assert_eq!((item.limit, item.used), (Some(limit(2)), 2));
    assert!(matches!(
        sem.acquire(&l, &id("low-2", "r0"), terms(2, 1))
            .await
            .unwrap(),
        AcquireOutcome::Full { .. }
    ));
    seen(&store, &l).await.assert_safe(2);
}

/// Waits on nothing; records whom the hand-off woke or deferred.
#[derive(Default)]
struct Recorder {
    woken: Mutex<Vec<Identity>>,
    deferred: Mutex<Vec<(Identity, u64)>>,
}

impl Waker for Recorder {
    async fn wake(&self, waiter: &Waiter, _token: FencingToken) -> Result<(), PortError> {
        self.woken.lock().unwrap().push(waiter.identity.clone());
        Ok(())
    }

    async fn defer(&self, waiter: &Waiter, next_start_ms: u64) -> Result<(), PortError> {
        self.deferred
            .lock()
            .unwrap()
            .push((waiter.identity.clone(), next_start_ms));
        Ok(())
    }
}

struct AllRunning;

impl ExecutionStatus for AllRunning {
    async fn describe(&self, _holder: &HolderId) -> Result<ExecutionState, PortError> {
        Ok(ExecutionState::Running)
    }
}

fn waiter(l: &LockName, name: &str, t: Terms, queued_at_ms: u64) -> Waiter {
    Waiter::new(
        l.clone(),
        id(name, "r0"),
        Run::FIRST,
        t,
        queued_at_ms,
        TaskToken::new(format!("{name}-task")).unwrap(),
        Attempt::new(queued_at_ms, 0),
        "{}".to_owned(),
    )
}

#[tokio::test]
async fn a_heavy_head_waits_and_nobody_passes_it() {
    let store = fresh_table().await;
    let sem = Semaphore::new(store.clone()).with_clock(Arc::new(ManualClock::new(T0)));
    let l = lock("heavy-head");
    for n in 0..3 {
        acquired(
            sem.acquire_requested_at(&l, &id(&format!("h{n}"), "r0"), terms(4, 1), T0)
                .await
                .unwrap(),
        );
    }
    let (heavy, light) = (
        waiter(&l, "heavy", terms(4, 2), T0),
        waiter(&l, "light", terms(4, 1), T0 + 1),
    );
    for w in [&heavy, &light] {
        assert_eq!(
            sem.enqueue(w, T0).await.unwrap(),
            semaphore_core::QueueOutcome::Queued
        );
    }
    let recorder = Recorder::default();
    // One of 4 is free: the light waiter would fit, the heavy head does not; nobody is granted.
    let report = sem
        .hand_off(&l, None, &recorder, &AllRunning)
        .await
        .unwrap();
    assert!(report.woken.is_empty(), "{report:?}");
    let claim = shows(&sem, &l, &id("h0", "r0"), Weight::ONE).await;
    let (_, after) = sem
        .release_seeing(&l, &id("h0", "r0"), claim)
        .await
        .unwrap();
    let report = sem
        .hand_off(&l, Some(after), &recorder, &AllRunning)
        .await
        .unwrap();
    assert_eq!(
        report
            .woken
            .iter()
            .map(|(who, _)| who.clone())
            .collect::<Vec<_>>(),
        std::slice::from_ref(&heavy.identity),
        "the head, and not the one behind it, which no longer fits"
    );
    let now = seen(&store, &l).await;
    now.assert_safe(4);
    assert_eq!((now.used, now.waiting), (4, 1));
}

/// With a start rate, a hand-off whose head may not start yet waits for it (a short wait, by
/// the clock) or tells it when to come back (a long one); a newcomer is refused with the time
/// of the next start.
#[tokio::test]
async fn the_line_starts_waiters_at_the_rate() {
    let store = fresh_table().await;
    let clock = Arc::new(ManualClock::new(T0));
    let sem = Semaphore::new(store.clone()).with_clock(clock.clone());
    let l = lock("rated-line");
    let fast = rated(10, 1.0);
    acquired(
        sem.acquire_requested_at(&l, &id("first", "r0"), fast, T0)
            .await
            .unwrap(),
    );
    assert_eq!(
        sem.acquire_requested_at(&l, &id("second", "r0"), fast, T0)
            .await
            .unwrap(),
        AcquireOutcome::RateLimited {
            next_start_ms: T0 + 1_000
        }
    );
    let second = waiter(&l, "second", fast, T0);
    assert_eq!(
        sem.enqueue(&second, T0).await.unwrap(),
        semaphore_core::QueueOutcome::Queued,
        "a spent rate lets it queue, though slots are free"
    );
    let recorder = Recorder::default();
    let report = sem
        .hand_off(&l, None, &recorder, &AllRunning)
        .await
        .unwrap();
    assert_eq!(report.woken.len(), 1, "{report:?}");
    assert_eq!(clock.now_ms(), T0 + 1_000, "it waited one spacing");
    let now = seen(&store, &l).await;
    assert_eq!(now.started_at, Some(T0 + 1_000));

    // One start a minute: the next head is told to come back, not waited for.
    let slow = rated(10, 1.0 / 60.0);
    let third = waiter(&l, "third", slow, T0 + 1_000);
    assert_eq!(
        sem.enqueue(&third, T0 + 1_000).await.unwrap(),
        semaphore_core::QueueOutcome::Queued
    );
    let report = sem
        .hand_off(&l, None, &recorder, &AllRunning)
        .await
        .unwrap();
    assert!(report.woken.is_empty());
    assert_eq!(
        report.deferred,
        Some((third.identity.clone(), T0 + 1_000 + 60_000))
    );
    assert_eq!(recorder.deferred.lock().unwrap().len(), 1);
    assert_eq!(seen(&store, &l).await.waiting, 1, "it keeps its place");
}

/// 50 contenders take and give back slots of a lock limited to 5 starts a second, as fast as
/// they can, for about three seconds; every start's time is read back from the table. No two
/// starts are closer than the spacing (200 ms), so no second holds more than 5 + 1.
#[tokio::test]
async fn fifty_contenders_start_no_faster_than_the_rate() {
    const CONTENDERS: usize = 50;
    const PER_SECOND: f64 = 5.0;
    const RUN: Duration = Duration::from_millis(3_000);
    let store = fresh_table().await;
    let sem = Semaphore::new(store.clone());
    let l = lock("rate-50");
    let t = rated(CONTENDERS as i64, PER_SECOND);
    let starts = Arc::new(Mutex::new(BTreeMap::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let tasks: Vec<_> = (0..CONTENDERS)
        .map(|n| {
            let (sem, l, starts, stop) = (sem.clone(), l.clone(), starts.clone(), stop.clone());
            tokio::spawn(async move {
                let mut round = 0;
                while !stop.load(Ordering::Relaxed) {
                    let who = id(&format!("c{n}"), &format!("r{round}"));
                    match sem.acquire(&l, &who, t).await.unwrap() {
                        AcquireOutcome::Acquired { .. } => {
                            let item = sem.status(&l).await.unwrap();
                            let at = item.holders[&who].acquired_at_ms;
                            starts.lock().unwrap().insert(at, who.clone());
                            sem.release(&l, &who, Claim::Operator).await.unwrap();
                            round += 1;
                        }
                        AcquireOutcome::RateLimited { .. } => {
                            tokio::time::sleep(Duration::from_millis(20)).await
                        }
                        other => panic!("{who:?}: {other:?}"),
                    }
                }
            })
        })
        .collect();
    tokio::time::sleep(RUN).await;
    stop.store(true, Ordering::Relaxed);
    for task in tasks {
        task.await.unwrap();
    }
    let starts: Vec<u64> = starts.lock().unwrap().keys().copied().collect();
    let spacing = Rate::per_second(PER_SECOND).unwrap().spacing_ms();
    assert!(
        starts.len() >= 5,
        "the rate was reached at all: {} starts",
        starts.len()
    );
    let closest = least_spacing(&starts).unwrap();
    assert!(
        closest >= spacing,
        "two starts {closest} ms apart, spacing {spacing} ms"
    );
    let most_in_a_second = most_in_window(&starts, 1_000);
    assert!(
        most_in_a_second <= PER_SECOND as usize + 1,
        "{most_in_a_second} starts in one second"
    );
    let achieved = (starts.len() - 1) as f64 * 1_000.0
        / (starts.last().unwrap() - starts.first().unwrap()) as f64;
    eprintln!(
        "{} starts, closest {closest} ms apart, at most {most_in_a_second} in a second, {achieved:.2}/s achieved (rate {PER_SECOND}/s)",
        starts.len()
    );
}

/// What `who`'s holder shows when it releases (F15): the token of its slot (read here: the one
/// its acquire answered) and the weight it believes it holds.
async fn shows<S: ItemStore>(
    sem: &Semaphore<S>,
    l: &LockName,
    who: &Identity,
    belief: Weight,
) -> Claim {
    let token = sem
        .status(l)
        .await
        .ok()
        .and_then(|item| item.holders.get(who).map(|held| held.token))
        .unwrap_or(FencingToken(FencingToken::MAX));
    Claim::Slot {
        token,
        weight: belief,
    }
}
