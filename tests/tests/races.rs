//! The races the write-time checks must win, made to happen against the real local
//! server, not argued:
//!
//! - an acquire write held in flight while the fence it must meet is written *and removed again*
//!   (two rotations, a window apart) is refused when it finally lands, by the rotation check;
//! - a zombie acquire *sent* after the fence, with a request time from before it, is refused by
//!   the fence while it is there, and by the rotation check once two rotations dropped it, even
//!   when the zombie's own clock is wrong;
//! - acquirers racing for the last slot: one wins, the rest are answered "full", none gets an
//!   error, and each sent exactly one write and no read.
//!
//! Writers other than the held one share a `ManualClock` and a short `Timing` (a 3 s window), so
//! rotations happen exactly when the test says.

use semaphore_core::Claim;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use local_aws::counter::RequestCounter;
use local_aws::names::{id, limit, lock};
use local_aws::observe::observe;
use local_aws::proxy::{HeldAnswer, HoldingProxy};
use local_aws::{client_for, endpoint, fresh_table};
use semaphore_core::protocol;
use semaphore_core::{
    AcquireOutcome, Check, Clock, DynamoStore, FenceKey, FenceReason, Identity, LockName,
    ManualClock, Semaphore, SemaphoreItem, Timing,
};

const TIMING: Timing = Timing {
    horizon: Duration::from_secs(2),
    clock_skew: Duration::from_secs(1),
};
/// The fence window: horizon + skew.
const WINDOW_MS: u64 = 3_000;
const T0: u64 = 1_800_000_000_000;

const UPDATE: &str = "DynamoDB.UpdateItem";

/// The held write reached the table after what it raced and was refused there by its condition.
const REFUSED_BY_THE_TABLE: HeldAnswer = HeldAnswer {
    status: 400,
    condition_failed: true,
};

fn execution(name: &str) -> String {
    format!("arn:aws:states:us-east-1:123456789012:execution:LockProtected:{name}")
}

/// The writers that are not raced: on the store directly, on the shared clock, short timing, and
/// rotating whenever a rotation is due (not only once the lock is busy), so that the rotations
/// happen at the releases the tests name.
fn others(store: &DynamoStore, clock: &Arc<ManualClock>) -> Semaphore<DynamoStore> {
    Semaphore::new(store.clone())
        .with_clock(clock.clone())
        .with_timing(TIMING)
        .with_busy_young_fences(1)
}

/// The lock with one rotation behind it at the clock's time (a bystander's release rotates the
/// fences of a lock that never rotated), so the next one is due exactly a window later.
async fn lock_rotated_now(sem: &Semaphore<DynamoStore>, l: &LockName) {
    sem.release(l, &id(&execution("bystander-0"), "b"), Claim::Operator)
        .await
        .unwrap();
    let item = sem.status(l).await.unwrap();
    assert_eq!(item.fences.rotated_at_ms, Some(sem.now_ms()));
}

/// Moves the clock to the next rotation, a window after the last one, where a bystander's
/// release rotates the fences, as any release (or cleanup, or sweep) does once a window has
/// passed.
async fn rotate_a_window_later(
    sem: &Semaphore<DynamoStore>,
    clock: &ManualClock,
    l: &LockName,
    n: usize,
) {
    let last = sem.status(l).await.unwrap().fences.rotated_at_ms.unwrap();
    clock.advance_ms(last + WINDOW_MS - clock.now_ms());
    sem.release(
        l,
        &id(&execution(&format!("bystander-{n}")), "b"),
        Claim::Operator,
    )
    .await
    .unwrap();
    let item = sem.status(l).await.unwrap();
    assert_eq!(item.fences.rotated_at_ms, Some(clock.now_ms()), "rotated");
}

/// The checks of the acquire write for `exec` requested at `requested_at` that fail on `item`.
fn failing_checks(
    l: &LockName,
    exec: &Identity,
    slots: i64,
    requested_at: u64,
    item: &SemaphoreItem,
) -> Vec<Check> {
    let write = protocol::acquire(
        l,
        exec,
        semaphore_core::Run::FIRST,
        None,
        limit(slots),
        requested_at,
        requested_at,
        &TIMING,
    )
    .expect("a write is sent for a fresh request");
    write
        .checks
        .into_iter()
        .filter(|check| !check.holds(item))
        .collect()
}

/// The slot keys held now, read raw.
async fn holders(store: &DynamoStore, l: &LockName) -> Vec<String> {
    let seen = observe(store.client(), store.table(), l.as_str())
        .await
        .expect("the item exists");
    seen.assert_safe(1000);
    seen.holders
}

/// An acquire write held in flight across the writing and the removal of the fence that must
/// refuse it. `fence` writes it (a cleanup or a release); the held write's request time is from
/// before the fence, as a Step Functions state's entry time is.
async fn held_across_fence_removal<F, Fut>(exec: Identity, fence_key: FenceKey, fence: F)
where
    F: FnOnce(Semaphore<DynamoStore>, Identity, u64) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let store = fresh_table().await;
    let clock = Arc::new(ManualClock::new(T0));
    let sem = others(&store, &clock);
    let l = lock("fence-removal");
    lock_rotated_now(&sem, &l).await;

    let proxy = HoldingProxy::start(endpoint()).await;
    let delayed = Semaphore::new(DynamoStore::new(
        client_for(&proxy.endpoint()),
        store.table(),
    ))
    .with_clock(clock.clone())
    .with_timing(TIMING);
    proxy.hold_next_acquires(1);
    clock.advance_ms(50);
    let requested_at = clock.now_ms();
    let acquiring = {
        let (l, exec) = (l.clone(), exec.clone());
        tokio::spawn(async move {
            delayed
                .acquire_requested_at(&l, &exec, limit(2), requested_at)
                .await
        })
    };
    proxy.wait_held(1).await;

    clock.advance_ms(50);
    fence(sem.clone(), exec.clone(), requested_at).await;
    assert!(sem.status(&l).await.unwrap().is_fenced(&fence_key));
    // The first rotation ages the fence (it is kept), the second drops it: a fence lasts at
    // least a window, and no longer than two.
    rotate_a_window_later(&sem, &clock, &l, 1).await;
    assert!(sem.status(&l).await.unwrap().is_fenced(&fence_key));
    rotate_a_window_later(&sem, &clock, &l, 2).await;
    let item = sem.status(&l).await.unwrap();
    assert!(
        !item.is_fenced(&fence_key),
        "two rotations dropped the fence: only the rotation check is left to refuse the write"
    );
    // On the item as it is now, every check of the held write holds but the rotation check:
    // without it, the write would land and the ended (or released) execution would hold a slot.
    let horizon = u64::try_from(TIMING.horizon.as_millis()).unwrap();
    assert_eq!(
        failing_checks(&l, &exec, 2, requested_at, &item),
        [Check::RotatedBefore {
            deadline_ms: requested_at + horizon
        }]
    );

    proxy.release_held();
    assert_eq!(
        acquiring.await.unwrap().unwrap(),
        AcquireOutcome::Expired,
        "the held write landed after a rotation past its request's horizon"
    );
    assert_eq!(proxy.held_answers(), [REFUSED_BY_THE_TABLE]);
    let exec_key = exec.slot_key();
    assert!(
        !holders(&store, &l).await.contains(&exec_key),
        "the execution holds nothing"
    );
}

/// F1 across a fence removal: the execution ended while its acquire write was in flight, was
/// cleaned up, and the cleanup's fence was rotated out before the write landed.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_acquire_held_in_flight_across_the_removal_of_its_cleanup_fence_is_refused() {
    let exec = id(&execution("ended"), "a1");
    let fence_key = FenceKey::execution(&exec.holder, semaphore_core::Run::FIRST);
    held_across_fence_removal(exec, fence_key, |sem, exec, _| async move {
        let cleaned = sem
            .cleanup(&lock("fence-removal"), &exec.holder)
            .await
            .unwrap();
        assert!(cleaned.freed.is_empty(), "its acquire has not landed yet");
    })
    .await;
}

/// F3 across a fence removal: the first attempt of an acquire is held in flight; Step Functions
/// retried it, the retry took the slot, the work ran and the slot was released (the release
/// fences the acquisition); the release's fence was rotated out before the first attempt landed.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_acquire_held_in_flight_across_the_removal_of_its_release_fence_is_refused() {
    let exec = id(&execution("succeeded"), "a1");
    let fence_key = FenceKey::acquisition(&exec);
    held_across_fence_removal(exec, fence_key, |sem, exec, requested_at| async move {
        let l = lock("fence-removal");
        // A Task's retry is in the same state: the same entry time, so the same request time.
        let retry = sem
            .acquire_requested_at(&l, &exec, limit(2), requested_at)
            .await
            .unwrap();
        assert!(
            matches!(retry, AcquireOutcome::Acquired { .. }),
            "{retry:?}"
        );
        sem.release(&l, &exec, Claim::Operator).await.unwrap();
    })
    .await;
}

/// F2, sent after the fence: the acquire Lambda of an aborted execution keeps running and sends
/// its write (its request time from before the abort) after the cleanup. While the fence is
/// there the fence refuses it; once two rotations dropped the fence, the rotation check does.
/// Each refusal is one write the table refused, and no read.
#[tokio::test]
async fn a_zombie_acquire_sent_after_the_fence_is_refused_while_it_stands_and_after_it_is_gone() {
    let store = fresh_table().await;
    let clock = Arc::new(ManualClock::new(T0));
    let sem = others(&store, &clock);
    let l = lock("zombie");
    lock_rotated_now(&sem, &l).await;
    let exec = id(&execution("aborted"), "a1");
    clock.advance_ms(50);
    let requested_at = clock.now_ms();
    assert!(matches!(
        sem.acquire_requested_at(&l, &exec, limit(1), requested_at)
            .await
            .unwrap(),
        AcquireOutcome::Acquired { .. }
    ));
    clock.advance_ms(50);
    assert_eq!(sem.cleanup(&l, &exec.holder).await.unwrap().freed.len(), 1);

    // The zombie, a moment later, on a clock that agrees with everyone's.
    let counter = RequestCounter::new();
    let zombie = |zombie_clock: Arc<dyn Clock>| {
        Semaphore::new(DynamoStore::new(
            counter.dynamodb_client(endpoint()),
            store.table(),
        ))
        .with_clock(zombie_clock)
        .with_timing(TIMING)
    };
    clock.advance_ms(100);
    for acquisition in ["a1", "a2"] {
        assert_eq!(
            zombie(clock.clone())
                .acquire_requested_at(
                    &l,
                    &id(&execution("aborted"), acquisition),
                    limit(1),
                    requested_at
                )
                .await
                .unwrap(),
            AcquireOutcome::Fenced(FenceReason::ExecutionEnded)
        );
    }
    let sent = counter.take();
    assert_eq!(sent.requests, BTreeMap::from([(UPDATE.to_owned(), 2)]));
    assert_eq!(sent.failed(UPDATE), 2);

    rotate_a_window_later(&sem, &clock, &l, 1).await;
    rotate_a_window_later(&sem, &clock, &l, 2).await;
    let item = sem.status(&l).await.unwrap();
    assert!(!item.is_fenced(&FenceKey::execution(
        &exec.holder,
        semaphore_core::Run::FIRST
    )));
    let horizon = u64::try_from(TIMING.horizon.as_millis()).unwrap();
    assert_eq!(
        failing_checks(&l, &exec, 1, requested_at, &item),
        [Check::RotatedBefore {
            deadline_ms: requested_at + horizon
        }],
        "only the rotation check is left to refuse the zombie"
    );

    // Its clock says the request is past its horizon: nothing is sent at all.
    assert_eq!(
        zombie(clock.clone())
            .acquire_requested_at(&l, &exec, limit(1), requested_at)
            .await
            .unwrap(),
        AcquireOutcome::Expired
    );
    assert_eq!(
        counter.take().total(),
        0,
        "an expired request sends nothing"
    );
    // A zombie whose own clock lags (it believes it is still within the horizon) sends its
    // write: the table refuses it, since the rotation it checks is later than the request's
    // horizon. The zombie's clock is not what keeps it out.
    let lagging = Arc::new(ManualClock::new(requested_at + 500));
    assert_eq!(
        zombie(lagging)
            .acquire_requested_at(&l, &exec, limit(1), requested_at)
            .await
            .unwrap(),
        AcquireOutcome::Expired
    );
    let sent = counter.take();
    assert_eq!(sent.requests, BTreeMap::from([(UPDATE.to_owned(), 1)]));
    assert_eq!(sent.failed(UPDATE), 1);
    assert!(holders(&store, &l).await.is_empty());
}

/// Acquirers never conflict with each other: the limit is checked by the table when each write
/// lands. Twenty acquirers released at once for the one free slot of a lock: exactly one takes
/// it, nineteen are answered "full", none gets an error or a retry, and each sent exactly one
/// write and no read.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn acquirers_racing_for_the_last_slot_one_wins_the_rest_are_full_each_with_one_write() {
    const RACERS: usize = 20;
    let store = fresh_table().await;
    let sem = Semaphore::new(store.clone());
    let l = lock("last-slot");
    for n in 0..4 {
        assert!(matches!(
            sem.acquire(&l, &id(&execution(&format!("holder-{n}")), "a"), limit(5))
                .await
                .unwrap(),
            AcquireOutcome::Acquired { .. }
        ));
    }

    let start = Arc::new(tokio::sync::Barrier::new(RACERS));
    let racers: Vec<_> = (0..RACERS)
        .map(|n| {
            let counter = RequestCounter::new();
            let racer = Semaphore::new(DynamoStore::new(
                counter.dynamodb_client(endpoint()),
                store.table(),
            ));
            let (l, start) = (l.clone(), start.clone());
            let who = id(&execution(&format!("racer-{n}")), "a");
            tokio::spawn(async move {
                start.wait().await;
                let outcome = racer.acquire(&l, &who, limit(5)).await;
                (who, outcome, counter.take())
            })
        })
        .collect();

    let mut winners = Vec::new();
    for racer in racers {
        let (who, outcome, sent) = racer.await.unwrap();
        let outcome = outcome.unwrap_or_else(|e| panic!("{who:?} got an error: {e}"));
        assert_eq!(
            sent.requests,
            BTreeMap::from([(UPDATE.to_owned(), 1)]),
            "{who:?}: one write, no read"
        );
        match outcome {
            AcquireOutcome::Acquired { count, .. } => {
                assert_eq!(count, 5);
                assert_eq!(sent.total_failed(), 0);
                winners.push(who);
            }
            AcquireOutcome::Full {
                count,
                used,
                limit: l,
            } => {
                assert_eq!((count, used, l), (5, 5, limit(5)));
                assert_eq!(sent.failed(UPDATE), 1, "refused by the limit check");
            }
            other => panic!("{who:?}: {other:?}"),
        }
    }
    assert_eq!(winners.len(), 1, "exactly one racer takes the last slot");
    let held = holders(&store, &l).await;
    assert_eq!(held.len(), 5);
    assert!(held.contains(&winners[0].slot_key()));
}
