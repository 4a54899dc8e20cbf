//! Leased slots (F13): a holder whose end nobody can see holds its slot under a lease that its
//! heartbeats renew; once the lease has passed unrenewed by more than the clock skew, the next
//! acquire that finds the lock full (or a hand-off, or the sweeper) takes the slot back and
//! fences its acquisition: its release, heartbeat and late acquire are refused, and its token is
//! below every later holder's.

use std::sync::Arc;
use std::time::Duration;

use semaphore_core::Claim;
use semaphore_core::{
    AcquireOutcome, AcquisitionId, Clock, ExecutionState, ExecutionStatus, FenceReason,
    HeartbeatOutcome, HolderId, Identity, Lease, ManualClock, MemoryStore, PortError,
    ReleaseOutcome, Semaphore, Terms, Timing, Weight,
};

use crate::{limit, lock};

const T0: u64 = 1_800_000_000_000;

fn id(holder: &str) -> Identity {
    Identity::new(
        HolderId::new(holder).unwrap(),
        AcquisitionId::new("a").unwrap(),
    )
}

/// A semaphore of fence window 10 s (horizon 8 s, skew 2 s) on a clock the test moves.
fn semaphore() -> (Semaphore<Arc<MemoryStore>>, Arc<ManualClock>) {
    let clock = Arc::new(ManualClock::new(T0));
    let sem = Semaphore::new(Arc::new(MemoryStore::default()))
        .with_clock(clock.clone())
        .with_timing(Timing {
            horizon: Duration::from_secs(8),
            clock_skew: Duration::from_secs(2),
        });
    (sem, clock)
}

/// Moves the clock on to `at_ms`.
fn to(clock: &ManualClock, at_ms: u64) {
    clock.advance_ms(at_ms - clock.now_ms());
}

/// Every holder's execution runs: what the sweeper takes back is the leases' doing alone.
struct AllRunning;

impl ExecutionStatus for AllRunning {
    async fn describe(&self, _: &HolderId) -> Result<ExecutionState, PortError> {
        Ok(ExecutionState::Running)
    }
}

fn leased(n: i64, seconds: u64) -> Terms {
    Terms::new(limit(n), Weight::ONE, None)
        .unwrap()
        .with_lease(Some(Lease::ms(seconds * 1000).unwrap()))
}

/// What a holder of weight 1 shows of its slot: the token its acquire answered.
fn slot(token: u64) -> Claim {
    Claim::Slot {
        token: semaphore_core::FencingToken(token),
        weight: semaphore_core::Weight::ONE,
    }
}

fn token(outcome: AcquireOutcome) -> u64 {
    match outcome {
        AcquireOutcome::Acquired { token, .. } => token.0,
        other => panic!("expected a slot, got {other:?}"),
    }
}

#[tokio::test]
async fn a_lease_that_passes_unrenewed_is_taken_back_by_the_next_acquire_and_its_holder_fenced() {
    let (sem, clock) = semaphore();
    let l = lock();
    let zombie = id("zombie");
    let old = token(sem.acquire(&l, &zombie, leased(1, 30)).await.unwrap());
    let item = sem.status(&l).await.unwrap();
    assert_eq!(item.leases[&zombie], T0 + 30_000);
    // Within the lease, and within the skew after it: full, nothing taken back.
    for at in [T0 + 29_000, T0 + 31_999] {
        to(&clock, at);
        let full = sem.acquire(&l, &id("next"), leased(1, 30)).await.unwrap();
        assert!(
            matches!(full, AcquireOutcome::Full { .. }),
            "{at}: {full:?}"
        );
    }
    // Past the lease and the skew: the same acquire takes it back, then the slot.
    to(&clock, T0 + 32_001);
    let new = token(sem.acquire(&l, &id("next"), leased(1, 30)).await.unwrap());
    assert!(
        new > old,
        "the new holder's token {new} is above the old one's {old}"
    );
    let item = sem.status(&l).await.unwrap();
    assert_eq!(
        item.holders.keys().cloned().collect::<Vec<_>>(),
        vec![id("next")]
    );
    assert!(!item.leases.contains_key(&zombie));
    assert_eq!(item.used, 1);
    // The zombie wakes up: its heartbeat, its release and a late acquire are all refused.
    assert_eq!(
        sem.heartbeat(&l, &zombie, slot(old), Lease::ms(30_000).unwrap())
            .await
            .unwrap(),
        HeartbeatOutcome::Lost
    );
    assert!(matches!(
        sem.release(&l, &zombie, slot(old)).await.unwrap(),
        ReleaseOutcome::NotHeld { .. }
    ));
    to(&clock, T0 + 200_000);
    sem.release(&l, &id("next"), Claim::Operator).await.unwrap();
    assert_eq!(
        sem.acquire(&l, &zombie, leased(1, 30)).await.unwrap(),
        AcquireOutcome::Fenced(FenceReason::AcquisitionReleased)
    );
}

#[tokio::test]
async fn a_heartbeat_keeps_a_long_holder_and_a_take_back_never_takes_a_renewed_lease() {
    let (sem, clock) = semaphore();
    let l = lock();
    let long = id("long");
    let held = slot(token(sem.acquire(&l, &long, leased(1, 10)).await.unwrap()));
    // Renewed every 8 s for a minute: never taken back.
    for n in 1..=7 {
        to(&clock, T0 + n * 8_000);
        assert_eq!(
            sem.heartbeat(&l, &long, held, Lease::ms(10_000).unwrap())
                .await
                .unwrap(),
            HeartbeatOutcome::Renewed {
                until_ms: T0 + n * 8_000 + 10_000
            }
        );
        let full = sem.acquire(&l, &id("other"), leased(1, 10)).await.unwrap();
        assert!(matches!(full, AcquireOutcome::Full { .. }), "{full:?}");
    }
    // A take-back decided on an old read (the lease as it was before the last heartbeat) is
    // refused: the renewed lease stands.
    let stale = sem.status(&l).await.unwrap();
    to(&clock, T0 + 56_000 + 12_001);
    let mut renewed_item = stale.clone();
    // What a writer read before the heartbeat: the lease ending at T0 + 66 s.
    assert_eq!(renewed_item.leases[&long], T0 + 66_000);
    sem.heartbeat(&l, &long, Claim::Operator, Lease::ms(10_000).unwrap())
        .await
        .unwrap();
    renewed_item.leases.insert(long.clone(), T0 + 66_000);
    let taken = sem.take_back_expired(&renewed_item).await.unwrap().unwrap();
    assert!(taken.slots.is_empty(), "{taken:?}");
    assert!(sem.status(&l).await.unwrap().holders.contains_key(&long));
}

#[tokio::test]
async fn the_sweeper_takes_back_expired_leases_of_a_quiet_lock() {
    let (sem, clock) = semaphore();
    let l = lock();
    token(sem.acquire(&l, &id("quiet"), leased(3, 5)).await.unwrap());
    token(sem.acquire(&l, &id("unleased"), limit(3)).await.unwrap());
    to(&clock, T0 + 7_001);
    sem.sweep(&AllRunning).await.unwrap();
    assert_eq!(
        sem.drain_taken_back()
            .iter()
            .map(|slot| slot.identity.clone())
            .collect::<Vec<_>>(),
        vec![id("quiet")]
    );
    let item = sem.status(&l).await.unwrap();
    assert_eq!(
        item.holders.keys().cloned().collect::<Vec<_>>(),
        vec![id("unleased")],
        "a holder without a lease is not the lease's to take"
    );
}
