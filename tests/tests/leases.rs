//! F13 against the real local server: a leased holder that dies (stops heartbeating) has its
//! slot taken back by the next acquire once the lease and the clock skew have passed, and is
//! fenced (its late release and heartbeat are refused); a take-back racing a heartbeat (either
//! held in flight by the proxy) never takes a renewed lease and never lets a taken-back slot be
//! renewed. Checked by the independent reader of the raw item ([`local_aws::observe`]).

use semaphore_core::Claim;
use std::sync::Arc;
use std::time::Duration;

use local_aws::names::{id, limit, lock};
use local_aws::observe::observe;
use local_aws::proxy::{Canned, FaultyProxy, HoldingProxy, Target, Verdict};
use local_aws::{client_for, endpoint, fresh_table};
use semaphore_core::{
    AcquireOutcome, Clock, DynamoStore, FenceKey, HeartbeatOutcome, Lease, LockName, ManualClock,
    ReleaseOutcome, Semaphore, Terms, Timing, Weight,
};

const T0: u64 = 1_800_000_000_000;

/// Horizon 8 s, skew 2 s: a lease is taken back 2 s after it ends.
fn timing() -> Timing {
    Timing {
        horizon: Duration::from_secs(8),
        clock_skew: Duration::from_secs(2),
    }
}

fn on(store: DynamoStore, clock: &Arc<ManualClock>) -> Semaphore<DynamoStore> {
    Semaphore::new(store)
        .with_clock(clock.clone())
        .with_timing(timing())
}

fn leased(n: i64, seconds: u64) -> Terms {
    Terms::new(limit(n), Weight::ONE, None)
        .unwrap()
        .with_lease(Some(Lease::ms(seconds * 1000).unwrap()))
}

fn lease(seconds: u64) -> Lease {
    Lease::ms(seconds * 1000).unwrap()
}

async fn raw(store: &DynamoStore, l: &LockName) -> local_aws::observe::Observed {
    observe(store.client(), store.table(), l.as_str())
        .await
        .expect("the lock's item exists")
}

fn to(clock: &ManualClock, at_ms: u64) {
    clock.advance_ms(at_ms - clock.now_ms());
}

#[tokio::test]
async fn a_dead_leased_holder_is_taken_back_by_the_next_acquire_and_fenced() {
    let store = fresh_table().await;
    let clock = Arc::new(ManualClock::new(T0));
    let sem = on(store.clone(), &clock);
    let l = lock("leased");
    let dead = id("dead", "a1");
    let AcquireOutcome::Acquired { token: old, .. } =
        sem.acquire(&l, &dead, leased(1, 30)).await.unwrap()
    else {
        panic!("the first acquire takes the slot")
    };
    let seen = raw(&store, &l).await;
    assert_eq!(seen.leases, vec![(dead.slot_key(), T0 + 30_000)]);
    seen.assert_safe(1);
    // The lease plus the skew passes: the next acquire takes the slot back, then takes it.
    to(&clock, T0 + 32_001);
    let next = id("next", "a1");
    let AcquireOutcome::Acquired { token: new, .. } =
        sem.acquire(&l, &next, leased(1, 30)).await.unwrap()
    else {
        panic!("taken back, then taken")
    };
    assert!(new.0 > old.0);
    let seen = raw(&store, &l).await;
    seen.assert_safe(1);
    assert_eq!(seen.holders, vec![next.slot_key()]);
    assert_eq!(seen.leases, vec![(next.slot_key(), T0 + 32_001 + 30_000)]);
    // The dead holder comes back: refused everything.
    assert_eq!(
        sem.heartbeat(&l, &dead, Claim::Operator, lease(30))
            .await
            .unwrap(),
        HeartbeatOutcome::Lost
    );
    assert!(matches!(
        sem.release(&l, &dead, Claim::Operator).await.unwrap(),
        ReleaseOutcome::NotHeld { .. }
    ));
    let item = sem.status(&l).await.unwrap();
    assert!(item.fences.contains(&FenceKey::acquisition(&dead)));
    assert_eq!(item.holders.len(), 1);
}

/// A heartbeat held in flight while a writer takes the slot back: it lands on a slot that is
/// gone and is refused (the holder learns it lost the slot). And the other order: a take-back
/// held in flight while the heartbeat renews the lease is refused (the lease it read is not the
/// lease any more), and the holder keeps its slot.
#[tokio::test]
async fn a_take_back_racing_a_heartbeat_never_renews_a_lost_slot_nor_takes_a_renewed_one() {
    let store = fresh_table().await;
    let clock = Arc::new(ManualClock::new(T0));
    let direct = on(store.clone(), &clock);
    let proxy = HoldingProxy::start(endpoint()).await;
    let through = on(
        DynamoStore::new(client_for(&proxy.endpoint()), store.table()),
        &clock,
    );
    // 1. The heartbeat is late.
    let l = lock("heartbeat-late");
    let holder = id("holder", "a1");
    direct.acquire(&l, &holder, leased(1, 10)).await.unwrap();
    to(&clock, T0 + 12_001);
    proxy.hold(Target::Operation("UpdateItem".to_owned()), 1);
    let heartbeat = {
        let (l, holder) = (l.clone(), holder.clone());
        tokio::spawn(async move {
            through
                .heartbeat(&l, &holder, Claim::Operator, lease(10))
                .await
        })
    };
    proxy.wait_held(1).await;
    let taker = id("taker", "a1");
    assert!(matches!(
        direct.acquire(&l, &taker, leased(1, 10)).await.unwrap(),
        AcquireOutcome::Acquired { .. }
    ));
    proxy.release_held();
    assert_eq!(heartbeat.await.unwrap().unwrap(), HeartbeatOutcome::Lost);
    let seen = raw(&store, &l).await;
    seen.assert_safe(1);
    assert_eq!(seen.holders, vec![taker.slot_key()]);

    // 2. The take-back is late.
    let l = lock("take-back-late");
    let through = on(
        DynamoStore::new(client_for(&proxy.endpoint()), store.table()),
        &clock,
    );
    direct.acquire(&l, &holder, leased(1, 10)).await.unwrap();
    let read = direct.status(&l).await.unwrap();
    to(&clock, T0 + 12_001 + 12_001);
    proxy.hold(Target::Operation("UpdateItem".to_owned()), 1);
    let take_back = tokio::spawn(async move { through.take_back_expired(&read).await });
    proxy.wait_held(1).await;
    assert!(matches!(
        direct
            .heartbeat(&l, &holder, Claim::Operator, lease(10))
            .await
            .unwrap(),
        HeartbeatOutcome::Renewed { .. }
    ));
    proxy.release_held();
    let taken = take_back
        .await
        .unwrap()
        .unwrap()
        .expect("there was an expired lease");
    assert!(taken.slots.is_empty(), "{taken:?}");
    assert!(
        proxy.held_answers().iter().any(|a| a.condition_failed),
        "the held take-back was refused: {:?}",
        proxy.held_answers()
    );
    let seen = raw(&store, &l).await;
    assert_eq!(seen.holders, vec![holder.slot_key()]);
    assert_eq!(seen.leases, vec![(holder.slot_key(), T0 + 24_002 + 10_000)]);
}

/// The client a program links (`semaphore_core::client`): its background heartbeats keep a
/// slot past its lease for as long as it runs; dropped without a release (the program died), its
/// lease runs out and the next acquire takes the slot back; and its `is_held` turns false once
/// the slot is lost.
#[tokio::test]
async fn the_client_keeps_a_slot_with_heartbeats_and_loses_it_when_they_stop() {
    let store = fresh_table().await;
    let timing = Timing {
        horizon: Duration::from_secs(8),
        clock_skew: Duration::from_millis(500),
    };
    let sem = Semaphore::new(store.clone()).with_timing(timing);
    let l = lock("client");
    let one_second = Terms::new(limit(1), Weight::ONE, None)
        .unwrap()
        .with_lease(Some(Lease::ms(1_000).unwrap()));
    let slot = sem
        .acquire_leased(&l, &id("worker", "a1"), one_second)
        .await
        .unwrap()
        .expect("a free lock");
    // Three leases long: kept by its heartbeats.
    for _ in 0..6 {
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert!(slot.is_held());
        let other = sem
            .acquire(&l, &id("other", "a1"), one_second)
            .await
            .unwrap();
        assert!(matches!(other, AcquireOutcome::Full { .. }), "{other:?}");
    }
    assert!(matches!(
        slot.release().await.unwrap(),
        ReleaseOutcome::Released { .. }
    ));
    // A program that dies: its heartbeats stop, and the slot is taken back.
    let dying = sem
        .acquire_leased(&l, &id("dying", "a1"), one_second)
        .await
        .unwrap()
        .expect("released before");
    let token = dying.token();
    drop(dying);
    tokio::time::sleep(Duration::from_millis(1_700)).await;
    let AcquireOutcome::Acquired { token: next, .. } = sem
        .acquire(&l, &id("next", "a1"), one_second)
        .await
        .unwrap()
    else {
        panic!("taken back once the lease and the skew passed")
    };
    assert!(next.0 > token.0);
    // A holder whose slot is taken back while it runs (its heartbeat held back by the proxy)
    // learns it: `is_held` is false.
    sem.release(&l, &id("next", "a1"), Claim::Operator)
        .await
        .unwrap();
    let proxy = HoldingProxy::start(endpoint()).await;
    let slow = Semaphore::new(DynamoStore::new(
        client_for(&proxy.endpoint()),
        store.table(),
    ))
    .with_timing(timing);
    let held = slow
        .acquire_leased(&l, &id("slow", "a1"), one_second)
        .await
        .unwrap()
        .expect("free");
    proxy.hold(Target::Operation("UpdateItem".to_owned()), 1);
    proxy.wait_held(1).await;
    tokio::time::sleep(Duration::from_millis(1_700)).await;
    assert!(!held.is_held(), "its lease passed by its own clock");
    assert!(matches!(
        sem.acquire(&l, &id("taker", "a1"), one_second)
            .await
            .unwrap(),
        AcquireOutcome::Acquired { .. }
    ));
    proxy.release_held();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(held.state(), semaphore_core::SlotState::Lost);
}

/// Issue #27 item 7: a client built as its docs say (`DynamoStore::with_retries(HOLDER_ATTEMPTS)`)
/// rides out four throttles in a row on its heartbeat and on its release (the SDK's default
/// gives up after three): the slot stays held, then is freed. The lease (15 s) is longer than
/// the backoff of four throttles (at most 1 + 2 + 4 + 5 s): a heartbeat counts its lease from
/// its first attempt, since any attempt may be the one that lands. Throttles are the test proxy's
/// canned answers: the local server never throttles.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_client_retries_throttled_heartbeats_and_releases_past_three_attempts() {
    let store = fresh_table().await;
    let proxy = FaultyProxy::start(endpoint()).await;
    let patient = DynamoStore::new(client_for(&proxy.endpoint()), store.table())
        .with_retries(semaphore_core::dynamo::HOLDER_ATTEMPTS);
    let sem = Semaphore::new(patient);
    let l = lock("patient");
    let fifteen_seconds = Terms::new(limit(1), Weight::ONE, None)
        .unwrap()
        .with_lease(Some(Lease::ms(15_000).unwrap()));
    let slot = sem
        .acquire_leased(&l, &id("worker", "a1"), fifteen_seconds)
        .await
        .unwrap()
        .expect("a free lock");
    for _ in 0..4 {
        proxy.fault_next("UpdateItem", Verdict::Answer(Canned::Throttled));
    }
    // The first heartbeat is sent after 5 s, meets the four throttles and then renews.
    let acquired = slot.state();
    for _ in 0..300 {
        if slot.state() != acquired {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(proxy.pending(), 0, "the heartbeat met every throttle");
    assert!(
        matches!(slot.state(), semaphore_core::SlotState::Held { until_ms } if acquired != semaphore_core::SlotState::Held { until_ms }),
        "renewed: {acquired:?} then {:?}",
        slot.state()
    );
    assert!(slot.is_held(), "{:?}", slot.state());
    for _ in 0..4 {
        proxy.fault_next("UpdateItem", Verdict::Answer(Canned::Throttled));
    }
    let released = slot.release().await.unwrap();
    assert!(
        matches!(released, ReleaseOutcome::Released { .. }),
        "{released:?}"
    );
    assert_eq!(proxy.pending(), 0);
    let after = Semaphore::new(store).status(&l).await.unwrap();
    assert!(after.holders.is_empty(), "{after:?}");
}
