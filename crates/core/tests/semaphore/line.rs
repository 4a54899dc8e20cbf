//! The line through the [`Semaphore`]: queueing, hand-offs, re-parking and leaving.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

use semaphore_core::protocol::{self, Grant};
use semaphore_core::Claim;
use semaphore_core::{
    AcquireOutcome, AcquisitionId, Attempt, ExecutionState, ExecutionStatus, FenceReason,
    FencingToken, HandOff, HolderId, Identity, ItemStore, LockName, ManualClock, MemoryStore,
    PortError, QueueKey, QueueOutcome, ReleaseOutcome, Run, Semaphore, SemaphoreItem, StoreError,
    TaskToken, Waiter, Waker, Wakeup, Write, WriteResult, MISSING_EXECUTION_GRACE_MS,
};

use crate::{limit, lock};

const T0: u64 = 1_800_000_000_000;

fn id(h: &str) -> Identity {
    Identity::new(HolderId::new(h).unwrap(), AcquisitionId::new("r0").unwrap())
}
fn task_token(text: &str) -> TaskToken {
    TaskToken::new(text).unwrap()
}
/// The waiter of execution `h` (its first run) for `n` slots, in line from `queued_at_ms`.
fn waiter(h: &str, n: i64, queued_at_ms: u64) -> Waiter {
    Waiter::new(
        lock(),
        id(h),
        Run::FIRST,
        limit(n),
        queued_at_ms,
        task_token(&format!("{h}-task-0")),
        Attempt::new(queued_at_ms, 0),
        format!("context of {h}"),
    )
}

// Canned fakes, not under test: a memory test has no Step Functions to wake a parked task
// (`SendTaskSuccess`) or to say whether an execution still runs (`DescribeExecution`). Each
// records what it was asked and answers what the test told it to.

/// Records every wake-up asked for; fails those of the holders it was told to.
#[derive(Default)]
struct RecordingWaker {
    calls: Mutex<Vec<(Waiter, FencingToken)>>,
    failing: Mutex<BTreeSet<String>>,
    deferred: Mutex<Vec<(Identity, u64)>>,
}

impl RecordingWaker {
    fn fail_for(&self, who: &Identity) {
        let mut failing = self.failing.lock().unwrap();
        failing.insert(who.holder.as_str().to_owned());
    }
    /// (holder, task token woken, fencing token) of every wake-up asked for so far.
    fn calls(&self) -> Vec<(String, String, FencingToken)> {
        let calls = self.calls.lock().unwrap();
        calls
            .iter()
            .map(|(w, token)| {
                let holder = w.identity.holder.as_str().to_owned();
                (holder, w.task_token().unwrap().as_str().to_owned(), *token)
            })
            .collect()
    }
}

impl Waker for RecordingWaker {
    async fn wake(&self, waiter: &Waiter, token: FencingToken) -> Result<(), PortError> {
        self.calls.lock().unwrap().push((waiter.clone(), token));
        let failing = self.failing.lock().unwrap();
        if failing.contains(waiter.identity.holder.as_str()) {
            Err(PortError::new("TaskTimedOut (canned)"))
        } else {
            Ok(())
        }
    }

    async fn defer(&self, waiter: &Waiter, next_start_ms: u64) -> Result<(), PortError> {
        self.deferred
            .lock()
            .unwrap()
            .push((waiter.identity.clone(), next_start_ms));
        Ok(())
    }
}

/// Answers `describe` as told per holder (`Running` when not told); records who was asked.
#[derive(Default)]
struct CannedExecutions {
    answers: Mutex<BTreeMap<String, Result<ExecutionState, String>>>,
    asked: Mutex<Vec<String>>,
}

impl CannedExecutions {
    fn answer(&self, who: &Identity, answer: Result<ExecutionState, String>) {
        let mut answers = self.answers.lock().unwrap();
        answers.insert(who.holder.as_str().to_owned(), answer);
    }
    fn asked(&self) -> Vec<String> {
        self.asked.lock().unwrap().clone()
    }
}

impl ExecutionStatus for CannedExecutions {
    async fn describe(&self, holder: &HolderId) -> Result<ExecutionState, PortError> {
        self.asked.lock().unwrap().push(holder.as_str().to_owned());
        let answers = self.answers.lock().unwrap();
        answers
            .get(holder.as_str())
            .cloned()
            .unwrap_or(Ok(ExecutionState::Running))
            .map_err(PortError::new)
    }
}

fn ended() -> ExecutionState {
    ExecutionState::Ended {
        status: "FAILED".to_owned(),
        last_run: Run::FIRST,
    }
}

struct Fixture {
    store: Arc<MemoryStore>,
    clock: Arc<ManualClock>,
    sem: Semaphore<Arc<MemoryStore>>,
    waker: RecordingWaker,
    executions: CannedExecutions,
}

fn fixture() -> Fixture {
    let store = Arc::new(MemoryStore::new());
    let clock = Arc::new(ManualClock::new(T0));
    let sem = Semaphore::new(store.clone()).with_clock(clock.clone());
    Fixture {
        store,
        clock,
        sem,
        waker: RecordingWaker::default(),
        executions: CannedExecutions::default(),
    }
}

impl Fixture {
    async fn hold(&self, who: &Identity, n: i64) -> FencingToken {
        match self.sem.acquire(&lock(), who, limit(n)).await.unwrap() {
            AcquireOutcome::Acquired { token, .. } => token,
            other => panic!("{who:?} did not acquire: {other:?}"),
        }
    }
    async fn queue(&self, w: &Waiter) -> QueueOutcome {
        let outcome = self.sem.enqueue(w, self.sem.now_ms()).await.unwrap();
        self.assert_counted();
        outcome
    }
    async fn release(&self, who: &Identity) {
        let released = self
            .sem
            .release(&lock(), who, Claim::Operator)
            .await
            .unwrap();
        assert!(
            matches!(released, ReleaseOutcome::Released { .. }),
            "{released:?}"
        );
    }
    async fn hand_off(&self) -> HandOff {
        let report = self
            .sem
            .hand_off(&lock(), None, &self.waker, &self.executions)
            .await
            .unwrap();
        self.assert_counted();
        report
    }
    fn item(&self) -> SemaphoreItem {
        self.store.load_now(&lock()).expect("the lock has an item")
    }
    fn version(&self) -> u64 {
        self.store
            .load_now(&lock())
            .map_or(0, |item| item.version.0)
    }
    /// The line as stored, head first.
    fn line(&self) -> Vec<Waiter> {
        self.store.waiters_now(&lock(), None, usize::MAX)
    }
    fn line_holders(&self) -> Vec<String> {
        let line = self.line();
        line.iter()
            .map(|w| w.identity.holder.as_str().to_owned())
            .collect()
    }
    /// The lock's `waiting` is the number of waiters' records.
    fn assert_counted(&self) {
        let waiting = self.store.load_now(&lock()).map_or(0, |item| item.waiting);
        assert_eq!(
            usize::try_from(waiting).unwrap(),
            self.line().len(),
            "waiting vs. records in line"
        );
    }
}

fn holders_of(report: &[(Identity, FencingToken)]) -> Vec<&str> {
    report.iter().map(|(who, _)| who.holder.as_str()).collect()
}

fn names(ids: &[Identity]) -> Vec<&str> {
    ids.iter().map(|who| who.holder.as_str()).collect()
}

#[tokio::test]
async fn enqueue_answers_queued_already_queued_free_already_held_fenced_and_expired() {
    let f = fixture();
    // No item yet: a slot is free and nobody waits. Nothing is written.
    assert_eq!(f.queue(&waiter("w", 1, T0)).await, QueueOutcome::Free);
    assert!(f.store.load_now(&lock()).is_none());

    let a_token = f.hold(&id("a"), 1).await;
    // Free for a waiter whose limit leaves a slot (1 of 2 held) while nobody waits.
    let version = f.version();
    assert_eq!(f.queue(&waiter("z", 2, T0)).await, QueueOutcome::Free);
    assert_eq!(f.version(), version, "a refused write changes nothing");

    let w = waiter("w", 1, T0);
    assert_eq!(f.queue(&w).await, QueueOutcome::Queued);
    assert_eq!(f.item().waiting, 1);
    assert_eq!(
        f.line(),
        std::slice::from_ref(&w),
        "the record is the waiter as queued"
    );

    // A retried attempt whose first one landed: its record is there.
    let version = f.version();
    assert_eq!(f.queue(&w).await, QueueOutcome::AlreadyQueued);
    assert_eq!(f.version(), version);
    assert_eq!(f.item().waiting, 1);

    // Now that someone waits, a waiter with room under its own limit queues too (behind).
    assert_eq!(f.queue(&waiter("z", 2, T0 + 1)).await, QueueOutcome::Queued);
    assert_eq!(f.line_holders(), ["w", "z"]);

    assert_eq!(
        f.queue(&waiter("a", 1, T0)).await,
        QueueOutcome::AlreadyHeld {
            token: a_token,
            count: 1
        }
    );

    // An execution that ended while its attempt to queue was in flight (cleaned up first).
    f.sem.cleanup(&lock(), &id("x").holder).await.unwrap();
    assert_eq!(
        f.queue(&waiter("x", 1, T0)).await,
        QueueOutcome::Fenced(FenceReason::ExecutionEnded)
    );
    // An acquisition released before its attempt to queue landed.
    f.sem
        .release(&lock(), &id("y"), Claim::Operator)
        .await
        .unwrap();
    assert_eq!(
        f.queue(&waiter("y", 1, T0)).await,
        QueueOutcome::Fenced(FenceReason::AcquisitionReleased)
    );

    // A request already past its horizon is not sent.
    let version = f.version();
    let horizon = u64::try_from(f.sem.timing().horizon.as_millis()).unwrap();
    let v = waiter("v", 1, T0);
    assert_eq!(
        f.sem.enqueue(&v, f.sem.now_ms() - horizon).await.unwrap(),
        QueueOutcome::Expired
    );
    assert_eq!(f.version(), version, "nothing was sent");
    // One sent in time but landing after a rotation at its deadline is refused: a writer
    // whose clock is a horizon ahead rotates the fences (there are some: x's and y's).
    let ahead = Semaphore::new(f.store.clone())
        .with_clock(Arc::new(ManualClock::new(f.sem.now_ms() + horizon)));
    assert!(ahead.rotate_if_due(&f.item()).await);
    assert_eq!(
        f.sem.enqueue(&v, f.sem.now_ms()).await.unwrap(),
        QueueOutcome::Expired
    );
    assert_eq!(f.line_holders(), ["w", "z"]);
    f.assert_counted();
}

#[tokio::test]
async fn a_newcomer_does_not_pass_the_line_even_when_a_slot_is_free() {
    let f = fixture();
    f.hold(&id("a"), 2).await;
    f.hold(&id("b"), 2).await;
    let w = waiter("w", 2, T0);
    assert_eq!(f.queue(&w).await, QueueOutcome::Queued);
    f.release(&id("a")).await;
    assert_eq!(f.item().count(), 1, "a slot is free");
    assert_eq!(
        f.sem.acquire(&lock(), &id("n"), limit(2)).await.unwrap(),
        AcquireOutcome::Full {
            count: 1,
            used: 1,
            limit: limit(2)
        },
        "the newcomer is refused while someone waits"
    );
    // It queues behind (its acquire was refused by the line, so queueing is allowed).
    assert_eq!(f.queue(&waiter("n", 2, T0 + 5)).await, QueueOutcome::Queued);
    let report = f.hand_off().await;
    assert_eq!(holders_of(&report.woken), ["w"], "{report:?}");
    assert_eq!(f.line_holders(), ["n"], "the lock is full again");
    // Once nobody waits, an acquire takes a free slot again.
    f.release(&id("b")).await;
    assert_eq!(holders_of(&f.hand_off().await.woken), ["n"]);
    f.release(&id("w")).await;
    assert!(matches!(
        f.sem.acquire(&lock(), &id("m"), limit(2)).await.unwrap(),
        AcquireOutcome::Acquired { count: 2, .. }
    ));
}

#[tokio::test]
async fn a_hand_off_grants_in_line_order_wakes_with_the_grants_token_and_stops_at_the_limit() {
    let f = fixture();
    for h in ["a", "b", "c"] {
        f.hold(&id(h), 3).await;
    }
    // Queued in this order, with these entry times: the line is by time, then digest.
    let queued = [
        waiter("w1", 3, T0 + 500),
        waiter("w2", 3, T0 + 300),
        waiter("w3", 3, T0 + 400),
        waiter("w4", 3, T0 + 300),
        waiter("w5", 3, T0 + 100),
        waiter("w6", 3, T0 + 900),
    ];
    for w in &queued {
        assert_eq!(f.queue(w).await, QueueOutcome::Queued);
    }
    let mut expected = queued.to_vec();
    expected.sort_by_key(|w| w.key);
    assert_eq!(f.line(), expected);
    assert_eq!(expected[0].identity, id("w5"));
    assert_eq!(
        expected[1].key.queued_at_ms, expected[2].key.queued_at_ms,
        "two waiters asked in the same millisecond: their digests order them"
    );

    // Full: a hand-off grants nothing and writes nothing.
    let version = f.version();
    assert!(f.hand_off().await.is_empty());
    assert_eq!(f.version(), version);

    f.release(&id("a")).await;
    f.release(&id("b")).await;
    let report = f.hand_off().await;
    let first_two: Vec<&str> = expected[..2]
        .iter()
        .map(|w| w.identity.holder.as_str())
        .collect();
    assert_eq!(
        holders_of(&report.woken),
        first_two,
        "two free slots, two grants"
    );
    assert!(report.parked.is_empty() && report.freed.is_empty() && report.skipped.is_empty());
    let item = f.item();
    assert_eq!(item.count(), 3, "stopped at the limit");
    for (who, token) in &report.woken {
        assert_eq!(
            item.holders[who].token, *token,
            "woken with its grant's token"
        );
    }
    assert!(report.woken[0].1 < report.woken[1].1, "tokens increase");
    // The waker was handed each waiter as queued (its task token and context).
    let calls = f.waker.calls();
    assert_eq!(calls.len(), 2);
    for (call, w) in calls.iter().zip(&expected) {
        assert_eq!(call.0, w.identity.holder.as_str());
        assert_eq!(call.1, w.task_token().unwrap().as_str());
    }
    assert_eq!(f.line(), expected[2..]);

    // A release that hands the item it saw to the hand-off (no read of the item).
    f.release(&id("c")).await;
    let report = f
        .sem
        .hand_off(&lock(), Some(f.item()), &f.waker, &f.executions)
        .await
        .unwrap();
    assert_eq!(report.woken.len(), 1);
    assert_eq!(report.woken[0].0, expected[2].identity);
    assert_eq!(f.line(), expected[3..]);
    assert_eq!(f.item().waiting, 3);
    assert!(f.executions.asked().is_empty(), "every wake-up succeeded");
}

#[tokio::test]
async fn a_granted_waiter_that_cannot_be_woken_and_has_ended_gives_its_slot_to_the_next() {
    for state in [ended(), ExecutionState::Missing] {
        let f = fixture();
        f.hold(&id("a"), 1).await;
        let (w1, w2) = (waiter("w1", 1, T0), waiter("w2", 1, T0 + 1));
        f.queue(&w1).await;
        f.queue(&w2).await;
        f.waker.fail_for(&w1.identity);
        f.executions.answer(&w1.identity, Ok(state.clone()));
        f.release(&id("a")).await;
        if state == ExecutionState::Missing {
            // Believed only past the grace period (see the next test).
            f.clock.advance_ms(MISSING_EXECUTION_GRACE_MS);
        }
        let report = f.hand_off().await;
        assert_eq!(names(&report.freed), ["w1"], "{state:?}: {report:?}");
        assert_eq!(holders_of(&report.woken), ["w2"]);
        assert!(report.parked.is_empty() && report.skipped.is_empty());
        assert_eq!(f.executions.asked(), ["w1"]);
        let calls = f.waker.calls();
        assert_eq!(
            calls.iter().map(|c| c.0.as_str()).collect::<Vec<_>>(),
            ["w1", "w2"]
        );
        let item = f.item();
        assert_eq!(item.holders.keys().collect::<Vec<_>>(), [&w2.identity]);
        assert_eq!(item.holders[&w2.identity].token, report.woken[0].1);
        assert!(f.line().is_empty());
        // The ended execution was cleaned up: nothing of it lands any more.
        assert_eq!(
            f.sem
                .acquire(&lock(), &w1.identity, limit(1))
                .await
                .unwrap(),
            AcquireOutcome::Fenced(FenceReason::ExecutionEnded)
        );
        assert_eq!(
            f.queue(&w1).await,
            QueueOutcome::Fenced(FenceReason::ExecutionEnded)
        );
    }
}

#[tokio::test]
async fn a_granted_waiter_that_cannot_be_woken_but_may_still_run_keeps_its_slot() {
    let answers = [
        Ok(ExecutionState::Running),
        Ok(ExecutionState::NotAnExecution),
        Err("ThrottlingException (canned)".to_owned()),
        // F11: queued within the grace period, "not found" is not believed.
        Ok(ExecutionState::Missing),
    ];
    for answer in answers {
        let f = fixture();
        f.hold(&id("a"), 1).await;
        let (w1, w2) = (waiter("w1", 1, T0), waiter("w2", 1, T0 + 1));
        f.queue(&w1).await;
        f.queue(&w2).await;
        f.waker.fail_for(&w1.identity);
        f.executions.answer(&w1.identity, answer.clone());
        f.release(&id("a")).await;
        let report = f.hand_off().await;
        assert_eq!(names(&report.parked), ["w1"], "{answer:?}: {report:?}");
        assert!(report.woken.is_empty() && report.freed.is_empty());
        let token = f.waker.calls()[0].2;
        assert_eq!(f.item().holders[&w1.identity].token, token);
        assert_eq!(f.line_holders(), ["w2"], "the lock is full: w2 waits on");
        // Its parked task's fallback timeout makes it ask again: it finds its slot, with the
        // token of its grant, whether it acquires or queues.
        assert_eq!(
            f.sem
                .acquire(&lock(), &w1.identity, limit(1))
                .await
                .unwrap(),
            AcquireOutcome::AlreadyHeld { token, count: 1 }
        );
        assert_eq!(
            f.queue(&w1).await,
            QueueOutcome::AlreadyHeld { token, count: 1 }
        );
        f.release(&w1.identity).await;
        assert_eq!(holders_of(&f.hand_off().await.woken), ["w2"]);
    }
}

#[tokio::test]
async fn a_waiter_whose_run_was_cleaned_up_is_skipped_and_its_record_removed() {
    let f = fixture();
    f.hold(&id("a"), 1).await;
    let (w1, w2, w3) = (
        waiter("w1", 1, T0),
        waiter("w2", 1, T0 + 1),
        waiter("w3", 1, T0 + 2),
    );
    for w in [&w1, &w2, &w3] {
        f.queue(w).await;
    }
    // w1's execution ended while it waited and was cleaned up (it held nothing); w2's
    // acquisition was released (its caller gave up).
    let cleaned = f.sem.cleanup(&lock(), &w1.identity.holder).await.unwrap();
    assert!(cleaned.freed.is_empty());
    f.sem
        .release(&lock(), &w2.identity, Claim::Operator)
        .await
        .unwrap();
    assert_eq!(f.line().len(), 3, "neither fence touches the line");
    f.release(&id("a")).await;
    let report = f.hand_off().await;
    assert_eq!(names(&report.skipped), ["w1", "w2"], "{report:?}");
    assert_eq!(holders_of(&report.woken), ["w3"]);
    let woken: Vec<String> = f.waker.calls().into_iter().map(|c| c.0).collect();
    assert_eq!(woken, ["w3"], "the dead were not woken");
    assert!(f.line().is_empty());
    assert_eq!(f.item().waiting, 0);
    assert_eq!(f.item().holders.keys().collect::<Vec<_>>(), [&w3.identity]);
}

#[tokio::test]
async fn a_waiter_asked_to_queue_twice_is_in_line_once_at_its_first_place() {
    let f = fixture();
    f.hold(&id("a"), 2).await;
    f.hold(&id("b"), 2).await;
    // A later check (or a late queue write of an earlier one) asks again, later: it is in line
    // already, and stays where it was, ahead of one that asked in between.
    let (first, again) = (waiter("w", 2, T0), waiter("w", 2, T0 + 50));
    let other = waiter("o", 2, T0 + 20);
    assert_eq!(f.queue(&first).await, QueueOutcome::Queued);
    assert_eq!(f.queue(&other).await, QueueOutcome::Queued);
    assert_eq!(f.queue(&again).await, QueueOutcome::AlreadyQueued);
    assert_eq!(f.line_holders(), ["w", "o"]);
    assert_eq!(f.item().waiting, 2);
    f.release(&id("a")).await;
    f.release(&id("b")).await;
    let report = f.hand_off().await;
    assert_eq!(holders_of(&report.woken), ["w", "o"], "{report:?}");
    assert!(report.skipped.is_empty());
    assert!(f.line().is_empty());
    assert_eq!(f.item().count(), 2);
}

#[tokio::test]
async fn a_reparked_waiter_keeps_its_place_and_is_woken_with_its_new_token() {
    let f = fixture();
    f.hold(&id("a"), 1).await;
    let (w1, w2) = (waiter("w1", 1, T0), waiter("w2", 1, T0 + 1));
    f.queue(&w1).await;
    f.queue(&w2).await;
    let read = f.sem.waiters(&lock(), None, 1).await.unwrap();
    assert_eq!(read, std::slice::from_ref(&w1));

    // Its task's fallback timeout parked it anew, with a new task token.
    let holders = f.item().holders;
    assert!(f
        .sem
        .repark(
            &lock(),
            w1.id(),
            Wakeup::Task(task_token("w1-task-1")),
            Attempt::new(T0 + 300_000, 0)
        )
        .await
        .unwrap());
    assert_eq!(f.item().holders, holders);
    assert_eq!(f.line_holders(), ["w1", "w2"], "same place");
    assert_eq!(f.line()[0].task_token(), Some(&task_token("w1-task-1")));
    assert_eq!(f.item().waiting, 2, "re-parking does not count anew");

    // A grant from the read made before the re-park is refused: the record moved on.
    f.release(&id("a")).await;
    let stale = protocol::grant(&read[0], None, &read[0].terms, f.sem.now_ms());
    let result = f.store.write_now(&stale);
    assert!(
        matches!(
            result,
            WriteResult::Refused {
                waiter_refused: true,
                ..
            }
        ),
        "{result:?}"
    );
    assert!(matches!(
        protocol::granted(&stale, result).unwrap(),
        Grant::Moved { .. }
    ));
    assert_eq!(f.item().count(), 0, "the stale grant took nothing");
    assert_eq!(f.line().len(), 2);

    let report = f.hand_off().await;
    assert_eq!(holders_of(&report.woken), ["w1"]);
    let calls = f.waker.calls();
    assert_eq!(calls.len(), 1);
    assert_eq!(
        calls[0].1, "w1-task-1",
        "woken with the token its task waits on"
    );

    // Granted, it is no longer in line: re-parking finds nothing and writes nothing.
    let version = f.version();
    assert!(!f
        .sem
        .repark(
            &lock(),
            w1.id(),
            Wakeup::Task(task_token("w1-task-2")),
            Attempt::new(T0 + 600_000, 0)
        )
        .await
        .unwrap());
    assert_eq!(f.version(), version);
}

/// A memory store that lands one more write right after the first read of the line: a
/// writer acting between a hand-off's read of the head and its grant.
struct Interposed {
    inner: Arc<MemoryStore>,
    after_first_read: Mutex<Option<Write>>,
}

impl ItemStore for Interposed {
    async fn load(&self, lock: &LockName) -> Result<Option<SemaphoreItem>, StoreError> {
        self.inner.load(lock).await
    }
    async fn write(&self, write: &Write) -> Result<WriteResult, StoreError> {
        self.inner.write(write).await
    }
    async fn list_page(
        &self,
        after: Option<&semaphore_core::ListCursor>,
    ) -> Result<semaphore_core::ListPage, StoreError> {
        self.inner.list_page(after).await
    }
    async fn waiters(
        &self,
        lock: &LockName,
        after: Option<QueueKey>,
        limit: usize,
    ) -> Result<Vec<Waiter>, StoreError> {
        let read = self.inner.waiters(lock, after, limit).await;
        let interposed = self.after_first_read.lock().unwrap().take();
        if let Some(write) = interposed {
            let landed = self.inner.write_now(&write);
            assert_eq!(landed, WriteResult::Landed { after: None });
        }
        read
    }

    async fn waiter(
        &self,
        lock: &LockName,
        id: semaphore_core::WaiterId,
    ) -> Result<Option<semaphore_core::Waiter>, StoreError> {
        self.inner.waiter(lock, id).await
    }
}

#[tokio::test]
async fn a_hand_off_that_read_the_head_before_it_parked_anew_reads_again_and_wakes_the_new_token() {
    let f = fixture();
    f.hold(&id("a"), 1).await;
    let w1 = waiter("w1", 1, T0);
    f.queue(&w1).await;
    f.release(&id("a")).await;
    let store = Interposed {
        inner: f.store.clone(),
        after_first_read: Mutex::new(Some(protocol::repark(
            &lock(),
            w1.id(),
            Wakeup::Task(task_token("w1-task-1")),
            Attempt::new(T0 + 300_000, 0),
        ))),
    };
    let sem = Semaphore::new(store).with_clock(f.clock.clone());
    let report = sem
        .hand_off(&lock(), None, &f.waker, &f.executions)
        .await
        .unwrap();
    assert_eq!(holders_of(&report.woken), ["w1"], "{report:?}");
    let calls = f.waker.calls();
    assert_eq!(calls.len(), 1, "woken once");
    assert_eq!(calls[0].1, "w1-task-1");
    assert!(f.line().is_empty());
    f.assert_counted();
}

#[tokio::test]
async fn leaving_removes_the_record_and_uncounts_it() {
    let f = fixture();
    f.hold(&id("a"), 1).await;
    let line = [
        waiter("w1", 1, T0),
        waiter("w2", 1, T0 + 1),
        waiter("w3", 1, T0 + 2),
    ];
    for w in &line {
        f.queue(w).await;
    }
    assert!(f.sem.leave(&lock(), line[1].id()).await.unwrap());
    assert_eq!(f.line_holders(), ["w1", "w3"]);
    assert_eq!(f.item().waiting, 2);
    let version = f.version();
    assert!(!f.sem.leave(&lock(), line[1].id()).await.unwrap(), "gone");
    assert_eq!(f.version(), version, "a second leave writes nothing");
    assert_eq!(f.item().waiting, 2);
    for w in [&line[0], &line[2]] {
        assert!(f.sem.leave(&lock(), w.id()).await.unwrap());
        f.assert_counted();
    }
    assert_eq!(f.item().waiting, 0);
    // With nobody in line, a free slot is taken by a plain acquire again.
    f.release(&id("a")).await;
    assert!(f.hand_off().await.is_empty());
    f.hold(&id("n"), 1).await;
}

/// Random sequences of every queue operation, interleaved with acquires, releases,
/// cleanups and hand-offs whose wake-ups sometimes fail: after every step the lock's
/// `waiting` is the number of records, no more than `limit` hold, and a hand-off only ever
/// takes waiters off the head of the line.
#[tokio::test]
async fn waiting_always_equals_the_number_of_records() {
    const LIMIT: i64 = 2;
    // Waiters woken, parked, freed and skipped by the hand-offs, over every sequence.
    let mut seen = [0; 4];
    for seed in 0..40 {
        let mut rng = fastrand::Rng::with_seed(seed);
        let f = fixture();
        let executions: Vec<String> = (0..12).map(|n| format!("e{n}")).collect();
        // Each execution asks at one of a few entry times: queued once, whichever it is.
        let waiter_of = |rng: &mut fastrand::Rng| {
            let h = &executions[rng.usize(..executions.len())];
            waiter(h, LIMIT, T0 + rng.u64(0..4) * 10)
        };
        for step in 0..150 {
            let at = format!("seed {seed}, step {step}");
            match rng.u8(0..8) {
                0 | 1 => {
                    let w = waiter_of(&mut rng);
                    f.sem.enqueue(&w, f.sem.now_ms()).await.unwrap();
                }
                2 => {
                    let w = waiter_of(&mut rng);
                    f.sem
                        .acquire(&lock(), &w.identity, limit(LIMIT))
                        .await
                        .unwrap();
                }
                3 => {
                    let w = waiter_of(&mut rng);
                    f.sem.leave(&lock(), w.id()).await.unwrap();
                }
                4 => {
                    let w = waiter_of(&mut rng);
                    let token = task_token(&format!("{}-task-{step}", w.identity.holder));
                    let attempt = Attempt::new(T0 + step as u64, 0);
                    f.sem
                        .repark(&lock(), w.id(), Wakeup::Task(token), attempt)
                        .await
                        .unwrap();
                }
                5 => {
                    // Mostly a holder's release (what frees slots), at times anyone's.
                    let holders: Vec<Identity> = f
                        .store
                        .load_now(&lock())
                        .map(|item| item.holders.into_keys().collect())
                        .unwrap_or_default();
                    let who = match rng.u8(0..4) {
                        0 => waiter_of(&mut rng).identity,
                        _ if holders.is_empty() => continue,
                        _ => holders[rng.usize(..holders.len())].clone(),
                    };
                    f.sem.release(&lock(), &who, Claim::Operator).await.unwrap();
                }
                6 if rng.u8(0..3) == 0 => {
                    let w = waiter_of(&mut rng);
                    f.sem.cleanup(&lock(), &w.identity.holder).await.unwrap();
                }
                6 => continue,
                _ => {
                    let w = waiter_of(&mut rng);
                    if rng.bool() {
                        f.waker.fail_for(&w.identity);
                        let answer = if rng.bool() {
                            Ok(ended())
                        } else {
                            Ok(ExecutionState::Running)
                        };
                        f.executions.answer(&w.identity, answer);
                    }
                    let before = f.line();
                    let report = f.hand_off().await;
                    let after = f.line();
                    assert!(before.ends_with(&after), "{at}: only the head is taken off");
                    let taken = before.len() - after.len();
                    let granted = report.woken.len() + report.parked.len() + report.freed.len();
                    assert_eq!(taken, granted + report.skipped.len(), "{at}: {report:?}");
                    seen[0] += report.woken.len();
                    seen[1] += report.parked.len();
                    seen[2] += report.freed.len();
                    seen[3] += report.skipped.len();
                }
            }
            f.assert_counted();
            if let Some(item) = f.store.load_now(&lock()) {
                assert!(item.count() <= LIMIT as usize, "{at}: {item:?}");
            }
        }
    }
    println!("woken, parked, freed, skipped: {seen:?}");
    assert!(
        seen.iter().all(|n| *n >= 10),
        "woken, parked, freed, skipped: {seen:?}"
    );
}
