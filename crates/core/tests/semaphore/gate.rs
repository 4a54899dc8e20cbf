//! The gate layout ([`Layout::Gate`]): the same operations, with holders out of the lock's item
//! and released acquisitions kept as tombstones until a rotation lets them go.

use std::sync::Arc;
use std::time::Duration;

use semaphore_core::protocol::Timing;
use semaphore_core::Claim;
use semaphore_core::{
    AcquireOutcome, AcquisitionId, Clock, Error, ExecutionState, ExecutionStatus, FenceReason,
    HolderId, Identity, Layout, ManualClock, MemoryStore, PortError, Semaphore,
};

use crate::{limit, lock};

fn id(h: &str, a: &str) -> Identity {
    Identity::new(HolderId::new(h).unwrap(), AcquisitionId::new(a).unwrap())
}

/// Every execution asked about is still running: a sweep only keeps house.
struct AllRunning;

impl ExecutionStatus for AllRunning {
    async fn describe(&self, _: &HolderId) -> Result<ExecutionState, PortError> {
        Ok(ExecutionState::Running)
    }
}

const WINDOW_MS: u64 = 10_000;

fn gate() -> (Semaphore<Arc<MemoryStore>>, Arc<ManualClock>) {
    let clock = Arc::new(ManualClock::new(1_000_000));
    let sem = Semaphore::new(Arc::new(MemoryStore::new()))
        .with_clock(clock.clone())
        .with_timing(Timing {
            horizon: Duration::from_millis(WINDOW_MS - 2_000),
            clock_skew: Duration::from_secs(2),
        });
    (sem, clock)
}

#[tokio::test]
async fn a_released_acquisition_is_a_tombstone_that_refuses_its_late_attempts_until_a_rotation_expires_them(
) {
    let (sem, clock) = gate();
    assert_eq!(
        sem.set_layout(&lock(), Layout::Gate).await.unwrap().layout,
        Layout::Gate
    );
    let a = id("exec-a", "r0");
    let requested_at = clock.now_ms();
    assert!(matches!(
        sem.acquire(&lock(), &a, limit(2)).await.unwrap(),
        AcquireOutcome::Acquired { .. }
    ));
    let item = sem.status(&lock()).await.unwrap();
    assert_eq!(
        (item.used, item.held_bytes),
        (1, 0),
        "no holder bytes in a gate"
    );
    clock.advance_ms(1_000);
    sem.release(&lock(), &a, Claim::Operator).await.unwrap();
    let released_at = clock.now_ms();
    let item = sem.status(&lock()).await.unwrap();
    assert_eq!(item.tombstones.get(&a), Some(&released_at));
    assert!(
        item.fences.is_empty(),
        "the gate keeps no acquisition fence"
    );

    // A late attempt of the released acquisition, requested before the release.
    assert_eq!(
        sem.acquire_requested_at(&lock(), &a, limit(2), requested_at)
            .await
            .unwrap(),
        AcquireOutcome::Fenced(FenceReason::AcquisitionReleased)
    );

    // A sweep before a window has passed since the release rotates (the tombstone makes one
    // due), but keeps the tombstone: that rotation is too close to the release.
    clock.advance_ms(WINDOW_MS - 1_000);
    let report = sem.sweep(&AllRunning).await.unwrap();
    assert_eq!((report.rotated, report.tombstones_dropped), (1, 0));
    assert!(sem
        .status(&lock())
        .await
        .unwrap()
        .tombstones
        .contains_key(&a));

    // The next rotation, a window later, is past it: the sweep drops it, and the late attempt
    // is now refused by the rotation it could not have been decided after.
    clock.advance_ms(WINDOW_MS);
    let report = sem.sweep(&AllRunning).await.unwrap();
    assert_eq!((report.rotated, report.tombstones_dropped), (1, 1));
    let item = sem.status(&lock()).await.unwrap();
    assert!(item.tombstones.is_empty());
    assert!(item.fences.rotated_at_ms.unwrap() >= released_at + WINDOW_MS);
    assert_eq!(
        sem.acquire_requested_at(&lock(), &a, limit(2), requested_at)
            .await
            .unwrap(),
        AcquireOutcome::Expired
    );
    assert_eq!(sem.status(&lock()).await.unwrap().used, 0);
}

#[tokio::test]
async fn a_gate_holds_a_thousand_holders_of_the_longest_names_which_one_item_cannot() {
    let long = |n: usize| {
        let holder = format!(
            "{n:04}{}",
            "h".repeat(semaphore_core::input::MAX_HOLDER_BYTES - 4)
        );
        id(
            &holder,
            &"a".repeat(semaphore_core::input::MAX_ACQUISITION_BYTES),
        )
    };
    let (item_lock, _) = gate();
    let mut admitted = 0;
    for n in 0..1000 {
        match item_lock
            .acquire(&lock(), &long(n), limit(1000))
            .await
            .unwrap()
        {
            AcquireOutcome::Acquired { .. } => admitted += 1,
            AcquireOutcome::Full { .. } => break,
            other => panic!("{other:?}"),
        }
    }
    assert!(
        admitted < 1000,
        "the item layout stops at its 300 KB holders' budget: {admitted} admitted"
    );

    let (sem, _) = gate();
    sem.set_layout(&lock(), Layout::Gate).await.unwrap();
    for n in 0..1000 {
        assert!(matches!(
            sem.acquire(&lock(), &long(n), limit(1000)).await.unwrap(),
            AcquireOutcome::Acquired { .. }
        ));
    }
    assert!(matches!(
        sem.acquire(&lock(), &long(1000), limit(1000))
            .await
            .unwrap(),
        AcquireOutcome::Full { used: 1000, .. }
    ));
    assert_eq!(sem.status(&lock()).await.unwrap().count(), 1000);
}

#[tokio::test]
async fn a_lock_changes_layout_only_while_idle() {
    let (sem, clock) = gate();
    let a = id("exec-a", "r0");
    sem.acquire(&lock(), &a, limit(1)).await.unwrap();
    let refused = sem.set_layout(&lock(), Layout::Gate).await.unwrap_err();
    assert!(
        matches!(refused, Error::NotIdle { used: 1, .. }),
        "{refused}"
    );
    assert_eq!(sem.status(&lock()).await.unwrap().layout, Layout::Item);

    // Released, the acquisition's fence is still there: still not idle until rotations drop it.
    sem.release(&lock(), &a, Claim::Operator).await.unwrap();
    assert!(matches!(
        sem.set_layout(&lock(), Layout::Gate).await.unwrap_err(),
        Error::NotIdle { fences: 1, .. }
    ));
    for _ in 0..2 {
        clock.advance_ms(WINDOW_MS);
        sem.sweep(&AllRunning).await.unwrap();
    }
    assert_eq!(
        sem.set_layout(&lock(), Layout::Gate).await.unwrap().layout,
        Layout::Gate
    );
    // Asking again for the layout it has is answered, not refused, even while in use.
    sem.acquire(&lock(), &id("exec-b", "r0"), limit(1))
        .await
        .unwrap();
    assert_eq!(
        sem.set_layout(&lock(), Layout::Gate).await.unwrap().layout,
        Layout::Gate
    );
}
