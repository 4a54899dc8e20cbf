//! Parity of the two renderings of the protocol: one scenario (acquires, releases and cleanups
//! of a few identities, including "already held", "full", "fenced", releasing what is not held,
//! duplicate cleanups and expired fences) runs against the in-memory store the model checker
//! explores and against the DynamoDB store on the local server, with the same clock; after
//! every step the answers and the whole stored tables must be equal.

use std::sync::Arc;
use std::time::Duration;

use semaphore_core::{
    AcquireOutcome, CleanupOutcome, FenceReason, HolderId, ItemStore, Limit, ManualClock,
    MemoryStore, ReleaseOutcome, Semaphore, SemaphoreItem,
};
use semaphore_tests::fresh_table;
use semaphore_tests::names::{id, lock};

const WINDOW: Duration = Duration::from_secs(10);

#[derive(Debug, Clone, Copy)]
enum Op {
    Acquire(&'static str, &'static str, &'static str, i64),
    Release(&'static str, &'static str, &'static str),
    Cleanup(&'static str, &'static str),
    /// Move the shared clock on by this many milliseconds.
    Wait(u64),
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Answer {
    Acquire(AcquireOutcome),
    Release(ReleaseOutcome),
    Cleanup(CleanupOutcome),
    Waited,
}

impl Answer {
    /// The answer's kind, to state what each step of the scenario is there for.
    fn kind(&self) -> String {
        match self {
            Self::Acquire(AcquireOutcome::Acquired { .. }) => "acquired".into(),
            Self::Acquire(AcquireOutcome::AlreadyHeld { .. }) => "already held".into(),
            Self::Acquire(AcquireOutcome::Full { .. }) => "full".into(),
            Self::Acquire(AcquireOutcome::Fenced(FenceReason::AcquisitionReleased)) => {
                "fenced: released".into()
            }
            Self::Acquire(AcquireOutcome::Fenced(FenceReason::ExecutionEnded)) => {
                "fenced: ended".into()
            }
            Self::Release(ReleaseOutcome::Released { .. }) => "released".into(),
            Self::Release(ReleaseOutcome::NotHeld { .. }) => "not held".into(),
            Self::Cleanup(c) => format!("freed {}", c.freed.len()),
            Self::Waited => "waited".into(),
        }
    }
}

async fn apply<S: ItemStore>(sem: &Semaphore<S>, clock: &ManualClock, op: Op) -> Answer {
    match op {
        Op::Acquire(l, h, a, limit) => Answer::Acquire(
            sem.acquire(&lock(l), &id(h, a), Limit::new(limit).unwrap())
                .await
                .unwrap(),
        ),
        Op::Release(l, h, a) => Answer::Release(sem.release(&lock(l), &id(h, a)).await.unwrap()),
        Op::Cleanup(l, h) => Answer::Cleanup(
            sem.cleanup(&lock(l), &HolderId::new(h).unwrap())
                .await
                .unwrap(),
        ),
        Op::Wait(ms) => {
            clock.advance_ms(ms);
            Answer::Waited
        }
    }
}

async fn table<S: ItemStore>(sem: &Semaphore<S>) -> Vec<SemaphoreItem> {
    let mut items = sem.list().await.unwrap();
    items.sort_by(|a, b| a.lock.cmp(&b.lock));
    items
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_and_dynamodb_stores_agree_after_every_step() {
    use Op::*;
    let scenario: &[(Op, &str)] = &[
        (Acquire("p", "a", "1", 2), "acquired"),
        (Acquire("p", "a", "1", 2), "already held"),
        (Acquire("p", "b", "1", 2), "acquired"),
        (Acquire("p", "c", "1", 2), "full"),
        (Acquire("p", "c", "1", 1), "full"),
        (Release("p", "a", "1"), "released"),
        (Release("p", "a", "1"), "not held"),
        (Acquire("p", "a", "1", 2), "fenced: released"),
        (Acquire("p", "a", "2", 2), "acquired"),
        (Cleanup("p", "b"), "freed 1"),
        (Acquire("p", "b", "1", 2), "fenced: ended"),
        (Acquire("p", "b", "2", 2), "fenced: ended"),
        (Release("p", "b", "1"), "not held"),
        (Wait(2_000), "waited"),
        (Cleanup("p", "b"), "freed 0"),
        (Release("p", "c", "1"), "not held"),
        (Acquire("p", "c", "1", 2), "fenced: released"),
        (Acquire("p", "c", "2", 3), "acquired"),
        (Cleanup("p", "nobody"), "freed 0"),
        (Release("q", "a", "1"), "not held"),
        (Cleanup("r", "a"), "freed 0"),
        (Acquire("q", "a", "1", 1), "fenced: released"),
        (Acquire("q", "b", "1", 1), "acquired"),
        (Acquire("q", "c", "1", 1), "full"),
        // Past the window of every fence written so far: they expire and the next write of
        // each item drops them.
        (Wait(WINDOW.as_millis() as u64 + 1), "waited"),
        (Acquire("p", "a", "1", 2), "full"),
        (Release("p", "c", "2"), "released"),
        (Acquire("p", "a", "1", 2), "acquired"),
        (Cleanup("p", "a"), "freed 2"),
        (Acquire("p", "b", "1", 2), "acquired"),
        (Cleanup("p", "b"), "freed 1"),
        (Acquire("q", "a", "1", 1), "full"),
        (Release("q", "b", "1"), "released"),
        (Acquire("q", "a", "1", 1), "acquired"),
    ];

    let clock = Arc::new(ManualClock::new(1_700_000_000_000));
    let memory = Semaphore::new(MemoryStore::new())
        .with_clock(clock.clone())
        .with_fence_window(WINDOW);
    let dynamo = Semaphore::new(fresh_table().await)
        .with_clock(clock.clone())
        .with_fence_window(WINDOW);

    for (n, &(op, expected)) in scenario.iter().enumerate() {
        let step = n + 1;
        // The clock moves only in Wait steps (once, for both), so both see the same now.
        let in_memory = apply(&memory, &clock, op).await;
        let in_dynamo = match op {
            Wait(_) => Answer::Waited,
            op => apply(&dynamo, &clock, op).await,
        };
        assert_eq!(
            in_memory.kind(),
            expected,
            "step {step} {op:?}: the scenario"
        );
        assert_eq!(
            in_memory, in_dynamo,
            "step {step} {op:?}: the answers differ"
        );
        let (in_memory, in_dynamo) = (table(&memory).await, table(&dynamo).await);
        assert_eq!(
            in_memory, in_dynamo,
            "step {step} {op:?}: the stored items differ"
        );
    }
    // Expired fences were dropped by the writes after the wait (r was not written again).
    let end = table(&memory).await;
    let now = memory.now_ms();
    let names: Vec<&str> = end.iter().map(|i| i.lock.as_str()).collect();
    assert_eq!(names, ["p", "q", "r"]);
    for item in &end[..2] {
        assert_eq!(item.live_fences(now), item.fences.len(), "{item:?}");
    }
    assert_eq!(end[2].live_fences(now), 0);
    assert_eq!(end[2].fences.len(), 1);
}
