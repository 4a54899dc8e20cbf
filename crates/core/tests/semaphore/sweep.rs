//! What the sweeper reclaims (holders of ended or long-missing executions, the slots it scanned),
//! and what it leaves alone.

use std::collections::HashMap;
use std::sync::Arc;

use semaphore_core::dynamo::stored_size;
use semaphore_core::{
    missing_long_enough, AcquisitionId, ExecutionState, ExecutionStatus, HolderId, Identity,
    LargestItem, Limit, LockName, ManualClock, MemoryStore, PortError, Run, Semaphore,
    MISSING_EXECUTION_GRACE_MS,
};

struct Fixed(HashMap<String, ExecutionState>);

impl ExecutionStatus for Fixed {
    async fn describe(&self, holder: &HolderId) -> Result<ExecutionState, PortError> {
        self.0
            .get(holder.as_str())
            .cloned()
            .ok_or_else(|| PortError::new("throttled"))
    }
}

fn id(h: &str, a: &str) -> Identity {
    Identity::new(HolderId::new(h).unwrap(), AcquisitionId::new(a).unwrap())
}

#[tokio::test]
async fn only_holders_of_ended_or_missing_executions_are_reclaimed() {
    let clock = Arc::new(ManualClock::new(1_000_000));
    let sem = Semaphore::new(MemoryStore::new()).with_clock(clock.clone());
    let lock = LockName::new("l").unwrap();
    let limit = Limit::new(10).unwrap();
    for (h, a) in [
        ("run", "1"),
        ("done", "1"),
        ("done", "2"),
        ("gone", "1"),
        ("op", "1"),
        ("unknown", "1"),
    ] {
        sem.acquire(&lock, &id(h, a), limit).await.unwrap();
    }
    let states = Fixed(HashMap::from([
        ("run".to_owned(), ExecutionState::Running),
        (
            "done".to_owned(),
            ExecutionState::Ended {
                status: "SUCCEEDED".to_owned(),
                last_run: Run::FIRST,
            },
        ),
        ("gone".to_owned(), ExecutionState::Missing),
        ("op".to_owned(), ExecutionState::NotAnExecution),
    ]));
    // "gone" is believed gone only past the grace period (see the next test).
    clock.advance_ms(MISSING_EXECUTION_GRACE_MS);
    // A dry run reports the same slots and writes nothing.
    let before = sem.status(&lock).await.unwrap();
    let dry = sem.sweep_dry_run(&states).await.unwrap();
    assert_eq!(sem.status(&lock).await.unwrap(), before);
    let report = sem.sweep(&states).await.unwrap();
    assert_eq!(dry.reclaimed.len(), report.reclaimed.len());
    assert_eq!(dry.errors, report.errors);
    assert_eq!(report.locks, 1);
    assert_eq!(report.holders_checked, 5);
    let mut freed: Vec<_> = report
        .reclaimed
        .iter()
        .map(|r| (r.holder.as_str(), r.acquisition.as_str(), r.reason.as_str()))
        .collect();
    freed.sort();
    assert_eq!(
        freed,
        [
            ("done", "1", "execution status is SUCCEEDED"),
            ("done", "2", "execution status is SUCCEEDED"),
            ("gone", "1", "execution does not exist"),
        ]
    );
    assert_eq!(report.errors, ["unknown: throttled"]);
    let left: Vec<_> = sem
        .status(&lock)
        .await
        .unwrap()
        .holders
        .into_keys()
        .map(|i| i.holder.to_string())
        .collect();
    assert_eq!(left, ["op", "run", "unknown"]);
    // A second sweep finds nothing more to reclaim.
    assert!(sem.sweep(&states).await.unwrap().reclaimed.is_empty());
}

/// F11: "does not exist" of a holder that acquired within the grace period is a stale read
/// of an eventually consistent DescribeExecution: kept, not fenced; believed after.
#[tokio::test]
async fn a_missing_execution_is_believed_only_past_the_grace_period() {
    let clock = Arc::new(ManualClock::new(1_000_000));
    let sem = Semaphore::new(MemoryStore::new()).with_clock(clock.clone());
    let lock = LockName::new("l").unwrap();
    sem.acquire(&lock, &id("gone", "1"), Limit::new(10).unwrap())
        .await
        .unwrap();
    let states = Fixed(HashMap::from([(
        "gone".to_owned(),
        ExecutionState::Missing,
    )]));
    clock.advance_ms(MISSING_EXECUTION_GRACE_MS - 1);
    let report = sem.sweep(&states).await.unwrap();
    assert!(report.reclaimed.is_empty());
    assert_eq!(
        report.too_young,
        [(lock.clone(), HolderId::new("gone").unwrap())]
    );
    assert!(sem
        .sweep_dry_run(&states)
        .await
        .unwrap()
        .reclaimed
        .is_empty());
    clock.advance_ms(1);
    let report = sem.sweep(&states).await.unwrap();
    assert_eq!(report.reclaimed.len(), 1);
    assert!(report.too_young.is_empty());
    assert!(missing_long_enough(0, MISSING_EXECUTION_GRACE_MS));
    assert!(
        !missing_long_enough(5_000, 1_000),
        "a clock behind counts as young"
    );
}

/// The execution is found ended, then redriven: its new incarnation takes a slot before the
/// sweep's fence lands. The sweep frees only what it scanned.
#[tokio::test]
async fn a_slot_taken_after_the_scan_by_a_redrive_is_not_freed() {
    struct RedrivenWhileAsked(Semaphore<Arc<MemoryStore>>);
    impl ExecutionStatus for RedrivenWhileAsked {
        async fn describe(&self, holder: &HolderId) -> Result<ExecutionState, PortError> {
            let lock = LockName::new("l").unwrap();
            let again = Identity::new(holder.clone(), AcquisitionId::new("r1").unwrap());
            self.0
                .acquire(&lock, &again, Limit::new(5).unwrap())
                .await
                .unwrap();
            Ok(ExecutionState::Ended {
                status: "ABORTED".to_owned(),
                last_run: Run::FIRST,
            })
        }
    }
    let store = Arc::new(MemoryStore::new());
    let sem = Semaphore::new(store.clone());
    let lock = LockName::new("l").unwrap();
    sem.acquire(&lock, &id("x", "r0"), Limit::new(5).unwrap())
        .await
        .unwrap();
    let report = sem
        .sweep(&RedrivenWhileAsked(Semaphore::new(store.clone())))
        .await
        .unwrap();
    let freed: Vec<&str> = report
        .reclaimed
        .iter()
        .map(|r| r.acquisition.as_str())
        .collect();
    assert_eq!(freed, ["r0"]);
    let left = sem.status(&lock).await.unwrap();
    assert_eq!(
        left.holders.keys().cloned().collect::<Vec<_>>(),
        [id("x", "r1")]
    );
}

#[tokio::test]
async fn a_sweep_reports_the_biggest_item_as_stored() {
    let sem = Semaphore::new(MemoryStore::new());
    let states = Fixed(HashMap::new());
    assert_eq!(sem.sweep(&states).await.unwrap().largest_item, None);
    let (small, big) = (
        LockName::new("small").unwrap(),
        LockName::new("big").unwrap(),
    );
    let limit = Limit::new(10).unwrap();
    sem.acquire(&small, &id("op", "1"), limit).await.unwrap();
    for n in 0..3 {
        sem.acquire(&big, &id(&format!("op-{n}"), "1"), limit)
            .await
            .unwrap();
    }
    let stored = sem.status(&big).await.unwrap();
    assert_eq!(
        sem.sweep(&states).await.unwrap().largest_item,
        Some(LargestItem {
            lock: big,
            bytes: stored_size(&stored),
        })
    );
}
