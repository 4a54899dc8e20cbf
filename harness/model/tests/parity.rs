//! Parity of the two renderings of the protocol: one scenario (acquires, releases and cleanups of
//! a few identities, including "already held", "full", "fenced", "expired", releasing what is not
//! held, duplicate cleanups, the first write of a lock, fence rotations a window apart, and
//! weighted slots: a heavy acquire that does not fit, a release that believes in the wrong
//! weight and is sent again as the refusal calls for, a duplicate weighted release) runs
//! against the in-memory store the model checker explores and against the DynamoDB store on the
//! local server, with the same clock; after every step the answers and the whole stored tables
//! must be equal.

use std::sync::Arc;
use std::time::Duration;

use local_aws::fresh_table;
use local_aws::names::{id, lock};
use semaphore_core::clock::Sleep;
use semaphore_core::{
    AcquireOutcome, Claim, CleanupOutcome, Clock, FenceReason, FencingToken, HolderId, ItemStore,
    Limit, ManualClock, MemoryStore, ReleaseOutcome, Semaphore, SemaphoreItem, Terms, Timing,
    Weight,
};

const TIMING: Timing = Timing {
    horizon: Duration::from_secs(2),
    clock_skew: Duration::from_secs(1),
};
/// The fence window: horizon + skew.
const WINDOW_MS: u64 = 3_000;

#[derive(Debug, Clone, Copy)]
enum Op {
    Acquire(&'static str, &'static str, &'static str, i64),
    /// An acquire of this weight (of the limit).
    AcquireWeighing(&'static str, &'static str, &'static str, i64, i64),
    /// An acquire whose request was made this many milliseconds ago.
    AcquireAsked(&'static str, &'static str, &'static str, i64, u64),
    Release(&'static str, &'static str, &'static str),
    /// A release that believes its slot is of this weight.
    ReleaseWeighing(&'static str, &'static str, &'static str, i64),
    /// A release by a writer whose clock is this many milliseconds ahead.
    ReleaseAhead(&'static str, &'static str, &'static str, u64),
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
            Self::Acquire(AcquireOutcome::Expired) => "expired".into(),
            Self::Acquire(AcquireOutcome::Fenced(FenceReason::AcquisitionReleased)) => {
                "fenced: released".into()
            }
            Self::Acquire(AcquireOutcome::Fenced(FenceReason::ExecutionEnded)) => {
                "fenced: ended".into()
            }
            Self::Acquire(AcquireOutcome::RateLimited { .. }) => "rate limited".into(),
            Self::Acquire(AcquireOutcome::Configured(_)) => "configured otherwise".into(),
            Self::Release(ReleaseOutcome::Released { .. }) => "released".into(),
            Self::Release(ReleaseOutcome::NotHeld { .. }) => "not held".into(),
            Self::Release(ReleaseOutcome::WrongToken { .. }) => "wrong token".into(),
            Self::Cleanup(c) => format!("freed {}", c.freed.len()),
            Self::Waited => "waited".into(),
        }
    }
}

/// One store, seen by two writers: one on the shared clock, one on a clock ahead of it.
struct Writers<S> {
    on_time: Semaphore<S>,
    ahead: Semaphore<S>,
}

/// A clock a fixed number of milliseconds ahead of another.
#[derive(Debug)]
struct Ahead(Arc<ManualClock>, u64);

impl Clock for Ahead {
    fn now_ms(&self) -> u64 {
        self.0.now_ms() + self.1
    }

    fn sleep_until(&self, at_ms: u64) -> Sleep<'_> {
        self.0.sleep_until(at_ms.saturating_sub(self.1))
    }
}

fn writers<S: ItemStore + Copy>(store: S, clock: &Arc<ManualClock>, ahead_ms: u64) -> Writers<S> {
    Writers {
        // Every release rotates once a window has passed (not only a busy one), so that the
        // scenario's rotations happen at the steps it names.
        on_time: Semaphore::new(store)
            .with_clock(clock.clone())
            .with_timing(TIMING)
            .with_busy_young_fences(1),
        ahead: Semaphore::new(store)
            .with_clock(Arc::new(Ahead(clock.clone(), ahead_ms)))
            .with_timing(TIMING)
            .with_busy_young_fences(1),
    }
}

async fn apply<S: ItemStore>(writers: &Writers<S>, op: Op) -> Answer {
    let sem = &writers.on_time;
    match op {
        Op::ReleaseAhead(l, h, a, _) => Answer::Release(
            writers
                .ahead
                .release(&lock(l), &id(h, a), Claim::Operator)
                .await
                .unwrap(),
        ),
        Op::Acquire(l, h, a, limit) => Answer::Acquire(
            sem.acquire(&lock(l), &id(h, a), Limit::new(limit).unwrap())
                .await
                .unwrap(),
        ),
        Op::AcquireAsked(l, h, a, limit, ago) => Answer::Acquire(
            sem.acquire_requested_at(
                &lock(l),
                &id(h, a),
                Limit::new(limit).unwrap(),
                sem.now_ms() - ago,
            )
            .await
            .unwrap(),
        ),
        Op::AcquireWeighing(l, h, a, limit, weight) => {
            let terms = Terms::new(
                Limit::new(limit).unwrap(),
                Weight::new(weight).unwrap(),
                None,
            )
            .unwrap();
            Answer::Acquire(sem.acquire(&lock(l), &id(h, a), terms).await.unwrap())
        }
        Op::Release(l, h, a) => Answer::Release(
            sem.release(&lock(l), &id(h, a), Claim::Operator)
                .await
                .unwrap(),
        ),
        // The holder's release, showing its slot's token (the one its acquire was answered) and
        // believing it of `weight`.
        Op::ReleaseWeighing(l, h, a, weight) => {
            let token = sem
                .status(&lock(l))
                .await
                .ok()
                .and_then(|item| item.holders.get(&id(h, a)).map(|held| held.token))
                .unwrap_or(FencingToken(FencingToken::MAX));
            let claim = Claim::Slot {
                token,
                weight: Weight::new(weight).unwrap(),
            };
            Answer::Release(
                sem.release_seeing(&lock(l), &id(h, a), claim)
                    .await
                    .unwrap()
                    .0,
            )
        }
        Op::Cleanup(l, h) => Answer::Cleanup(
            sem.cleanup(&lock(l), &HolderId::new(h).unwrap())
                .await
                .unwrap(),
        ),
        Op::Wait(_) => Answer::Waited,
    }
}

async fn table<S: ItemStore>(sem: &Semaphore<S>) -> Vec<SemaphoreItem> {
    let mut items: Vec<SemaphoreItem> = sem
        .list()
        .await
        .unwrap()
        .into_iter()
        .map(Result::unwrap)
        .collect();
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
        (Acquire("p", "c", "1", 3), "acquired"),
        (Release("p", "c", "1"), "released"),
        (Release("p", "a", "1"), "released"),
        (Release("p", "a", "1"), "not held"),
        (Acquire("p", "a", "1", 2), "fenced: released"),
        (Acquire("p", "a", "2", 2), "acquired"),
        (Cleanup("p", "b"), "freed 1"),
        (Acquire("p", "b", "1", 2), "fenced: ended"),
        (Acquire("p", "b", "2", 2), "fenced: ended"),
        (Release("p", "b", "1"), "not held"),
        (Cleanup("p", "b"), "freed 0"),
        (Cleanup("p", "nobody"), "freed 0"),
        // The first write of a lock is a release or a cleanup: it still fences.
        (Release("q", "a", "1"), "not held"),
        (Cleanup("r", "a"), "freed 0"),
        (Acquire("q", "a", "1", 1), "fenced: released"),
        (Acquire("q", "b", "1", 1), "acquired"),
        (Acquire("q", "c", "1", 1), "full"),
        // Requests older than the horizon are answered without a write.
        (AcquireAsked("q", "d", "1", 1, 2_000), "expired"),
        // One window on: the next release of each lock rotates its fences (young -> old).
        (Wait(WINDOW_MS), "waited"),
        (Release("p", "a", "2"), "released"),
        (Acquire("p", "a", "1", 2), "fenced: released"),
        (Acquire("p", "b", "3", 2), "fenced: ended"),
        // A request made before that rotation, landing after it, inside its horizon: fine.
        (AcquireAsked("p", "e", "1", 2, 1_000), "acquired"),
        // Another window: the next rotation drops every fence written before the first one.
        (Wait(WINDOW_MS), "waited"),
        (Release("p", "e", "1"), "released"),
        (Acquire("p", "a", "1", 2), "acquired"),
        (Acquire("p", "b", "3", 2), "acquired"),
        (AcquireAsked("p", "c", "1", 2, 1_999), "full"),
        // A writer whose clock runs 3.5 s ahead releases, and rotates by its clock: a request
        // whose horizon ends before that rotation is refused by it (the fence of c's first
        // acquisition is long gone), and so is every request until this host's clock catches up
        // (a clock ahead by more than the skew allowed costs "expired" answers, not safety).
        (ReleaseAhead("p", "b", "3", 3_500), "released"),
        (AcquireAsked("p", "c", "1", 2, 1_999), "expired"),
        (Acquire("p", "c", "1", 2), "expired"),
        (Wait(1_501), "waited"),
        (Acquire("p", "c", "1", 2), "acquired"),
        (Cleanup("p", "a"), "freed 1"),
        // q's next release rotates its fences too (its last rotation is two windows old): the
        // fence of q/a/1 is dropped with it.
        (Release("q", "b", "1"), "released"),
        (Acquire("q", "a", "1", 1), "acquired"),
        (Acquire("q", "c", "1", 1), "full"),
        // Weights: the limit bounds the sum held (`used`), checked when the write lands.
        (AcquireWeighing("w", "a", "1", 3, 2), "acquired"),
        (AcquireWeighing("w", "b", "1", 3, 2), "full"),
        (Acquire("w", "b", "1", 3), "acquired"),
        (AcquireWeighing("w", "c", "1", 3, 1), "full"),
        // A release that believes in weight 1 is refused (a holds 2) and sent again with the
        // weight the item handed back: `used` goes down by 2, not 1.
        (ReleaseWeighing("w", "a", "1", 1), "released"),
        // A duplicate: refused (nothing held), sent again as a fence alone, subtracting nothing.
        (ReleaseWeighing("w", "a", "1", 2), "not held"),
        (AcquireWeighing("w", "c", "1", 3, 2), "acquired"),
        (AcquireWeighing("w", "d", "1", 3, 1), "full"),
        (Cleanup("w", "c"), "freed 1"),
        (Cleanup("w", "c"), "freed 0"),
        (AcquireWeighing("w", "d", "1", 3, 2), "acquired"),
    ];

    let clock = Arc::new(ManualClock::new(1_700_000_000_000));
    let ahead_ms = scenario
        .iter()
        .find_map(|(op, _)| match op {
            ReleaseAhead(.., ms) => Some(*ms),
            _ => None,
        })
        .unwrap_or(0);
    let (in_memory, in_dynamo) = (MemoryStore::new(), fresh_table().await);
    let (memory, dynamo) = (
        writers(&in_memory, &clock, ahead_ms),
        writers(&in_dynamo, &clock, ahead_ms),
    );

    for (n, &(op, expected)) in scenario.iter().enumerate() {
        let step = n + 1;
        if let Wait(ms) = op {
            clock.advance_ms(ms);
        }
        let in_memory = apply(&memory, op).await;
        let in_dynamo = apply(&dynamo, op).await;
        assert_eq!(
            in_memory.kind(),
            expected,
            "step {step} {op:?}: the scenario"
        );
        assert_eq!(
            in_memory, in_dynamo,
            "step {step} {op:?}: the answers differ"
        );
        let (in_memory, in_dynamo) = (table(&memory.on_time).await, table(&dynamo.on_time).await);
        assert_eq!(
            in_memory, in_dynamo,
            "step {step} {op:?}: the stored items differ"
        );
    }
    let end = table(&memory.on_time).await;
    let names: Vec<&str> = end.iter().map(|i| i.lock.as_str()).collect();
    assert_eq!(names, ["p", "q", "r", "w"]);
    let w = &end[3];
    assert_eq!((w.used, w.weight_held()), (3, 3), "{w:?}");
    // p rotated twice: the fences of its first window are gone.
    let p = &end[0];
    assert!(p.fences.rotated_at_ms.is_some());
    assert!(!p.is_fenced(&semaphore_core::FenceKey::acquisition(&id("a", "1"))));
}
