//! The waiting line against the real local server: the writes that queue, grant, re-park and
//! take waiters out of line, as `DynamoStore` sends them (one `TransactWriteItems` of the lock's
//! item and the waiter's record in `<table>-queue`), what their refusals hand back, the line's
//! order as a `Query` reads it, and a hand-off race made to happen: executions queueing while
//! others release and hand off, checked by an independent poller of the raw item.
//!
//! The waker and the execution status are canned fakes here (nothing wakes a parked Step
//! Functions task against moto): they record what they were asked and answer as told.

use semaphore_core::Claim;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use aws_sdk_dynamodb::types::AttributeValue;
use aws_sdk_dynamodb::Client;
use local_aws::counter::RequestCounter;
use local_aws::names::{id, limit, lock};
use local_aws::observe::{self, observe};
use local_aws::proxy::{FaultyProxy, HoldingProxy, Verdict};
use local_aws::{client_for, endpoint, fresh_table};
use semaphore_core::dynamo::decode_waiter;
use semaphore_core::protocol::{self, Grant};
use semaphore_core::{
    AcquireOutcome, Attempt, Change, Check, DynamoStore, ExecutionState, ExecutionStatus,
    FenceReason, FencingToken, HolderId, Identity, ItemStore, LockName, ManualClock, PortError,
    QueueKey, QueueOutcome, ReleaseOutcome, Run, Semaphore, SemaphoreItem, StoreError, TaskToken,
    Waiter, Waker, Wakeup, Write, WriteResult,
};

const T0: u64 = 1_800_000_000_000;

fn execution(name: &str) -> String {
    format!("arn:aws:states:us-east-1:123456789012:execution:LockProtected:{name}")
}

fn exec_id(name: &str) -> Identity {
    id(&execution(name), "r0")
}

fn task_token(text: &str) -> TaskToken {
    TaskToken::new(text).expect("a valid task token in the test")
}

/// The waiter of execution `name` (first run) on `l` for `n` slots, asked to wait at `queued_at`.
fn waiter(l: &LockName, name: &str, n: i64, queued_at_ms: u64) -> Waiter {
    Waiter::new(
        l.clone(),
        exec_id(name),
        Run::FIRST,
        limit(n),
        queued_at_ms,
        task_token(&format!("{name}-task-0")),
        Attempt::new(queued_at_ms, 0),
        format!("{{\"lock\":\"{l}\",\"who\":\"{name}\"}}"),
    )
}

fn manual(store: &DynamoStore) -> Semaphore<DynamoStore> {
    Semaphore::new(store.clone()).with_clock(Arc::new(ManualClock::new(T0)))
}

async fn hold<S: ItemStore>(sem: &Semaphore<S>, l: &LockName, who: &Identity, n: i64) {
    let outcome = sem.acquire(l, who, limit(n)).await.unwrap();
    assert!(
        matches!(outcome, AcquireOutcome::Acquired { .. }),
        "{outcome:?}"
    );
}

async fn release<S: ItemStore>(sem: &Semaphore<S>, l: &LockName, who: &Identity) {
    let outcome = sem.release(l, who, Claim::Operator).await.unwrap();
    assert!(
        matches!(outcome, ReleaseOutcome::Released { .. }),
        "{outcome:?}"
    );
}

// Raw reads, without the product's decoder.

/// The lock item's `waiting`, read raw (absent: 0).
async fn raw_waiting(client: &Client, table: &str, l: &LockName) -> i64 {
    let waiting = observe(client, table, l.as_str())
        .await
        .map_or(0, |seen| seen.waiting);
    i64::try_from(waiting).expect("waiting fits an i64")
}

fn place(record: &HashMap<String, AttributeValue>) -> String {
    record["place"].as_s().expect("place is a string").clone()
}

async fn raw_record(
    client: &Client,
    queue_table: &str,
    l: &LockName,
    key: QueueKey,
) -> Option<HashMap<String, AttributeValue>> {
    client
        .get_item()
        .table_name(queue_table)
        .key("lock", AttributeValue::S(l.to_string()))
        .key("waiter", AttributeValue::S(key.id.render()))
        .consistent_read(true)
        .send()
        .await
        .expect("GetItem of a waiter's record")
        .item
}

/// `waiting` on the lock's item is the number of records in its line (both read raw; call it
/// when nothing else writes the lock).
async fn assert_counted(store: &DynamoStore, l: &LockName) -> usize {
    let client = store.client();
    let records = observe::raw_line(client, store.queue_table(), l.as_str())
        .await
        .len();
    let waiting = raw_waiting(client, store.table(), l).await;
    assert_eq!(waiting, records as i64, "{l}: waiting vs. records in line");
    records
}

// Canned fakes: a recording waker and execution status, told which calls fail.

#[derive(Default)]
struct RecordingWaker {
    /// (holder, task token, fencing token) of every wake-up asked for.
    calls: Mutex<Vec<(String, String, FencingToken)>>,
    failing: Mutex<BTreeSet<String>>,
}

impl RecordingWaker {
    fn fail_for(&self, who: &Identity) {
        let mut failing = self.failing.lock().unwrap();
        failing.insert(who.holder.as_str().to_owned());
    }
    fn calls(&self) -> Vec<(String, String, FencingToken)> {
        self.calls.lock().unwrap().clone()
    }
}

impl Waker for RecordingWaker {
    async fn wake(&self, waiter: &Waiter, token: FencingToken) -> Result<(), PortError> {
        let holder = waiter.identity.holder.as_str().to_owned();
        let task = waiter
            .task_token()
            .map_or("(polls)", |t| t.as_str())
            .to_owned();
        self.calls
            .lock()
            .unwrap()
            .push((holder.clone(), task, token));
        if self.failing.lock().unwrap().contains(&holder) {
            Err(PortError::new("TaskTimedOut (canned)"))
        } else {
            Ok(())
        }
    }

    /// No lock here has a start rate: a deferral is a failure the test sees.
    async fn defer(&self, waiter: &Waiter, next_start_ms: u64) -> Result<(), PortError> {
        panic!(
            "{} deferred to {next_start_ms} on a lock without a rate",
            waiter.identity.holder
        )
    }
}

#[derive(Default)]
struct CannedExecutions {
    answers: Mutex<BTreeMap<String, ExecutionState>>,
    asked: AtomicUsize,
}

impl CannedExecutions {
    fn answer(&self, who: &Identity, state: ExecutionState) {
        let mut answers = self.answers.lock().unwrap();
        answers.insert(who.holder.as_str().to_owned(), state);
    }
}

impl ExecutionStatus for CannedExecutions {
    async fn describe(&self, holder: &HolderId) -> Result<ExecutionState, PortError> {
        self.asked.fetch_add(1, Ordering::SeqCst);
        let answers = self.answers.lock().unwrap();
        Ok(answers
            .get(holder.as_str())
            .cloned()
            .unwrap_or(ExecutionState::Running))
    }
}

fn holders_of(woken: &[(Identity, FencingToken)]) -> Vec<Identity> {
    woken.iter().map(|(who, _)| who.clone()).collect()
}

#[tokio::test]
async fn an_enqueue_lands_as_one_transaction_and_its_retry_writes_nothing() {
    let store = fresh_table().await;
    let counter = RequestCounter::new();
    let counted = DynamoStore::new(counter.dynamodb_client(endpoint()), store.table());
    assert_eq!(counted.queue_table(), format!("{}-queue", store.table()));
    let sem = manual(&counted);
    let l = lock("one-transaction");
    let client = store.client();
    hold(&sem, &l, &exec_id("a"), 1).await;
    let before = observe(client, store.table(), l.as_str()).await.unwrap();
    counter.take();

    let w = waiter(&l, "w", 1, T0 - 20);
    assert_eq!(sem.enqueue(&w, T0).await.unwrap(), QueueOutcome::Queued);
    let counts = counter.take();
    assert_eq!(
        counts.requests,
        BTreeMap::from([("DynamoDB.TransactWriteItems".to_owned(), 1)]),
        "one request, no read"
    );
    let after = observe(client, store.table(), l.as_str()).await.unwrap();
    assert_eq!(after.version, before.version + 1);
    assert_eq!(after.holders, before.holders);
    assert_eq!(raw_waiting(client, store.table(), &l).await, 1);
    let record = raw_record(client, store.queue_table(), &l, w.key)
        .await
        .expect("the waiter's record is in <table>-queue");
    let text = |name: &str| record[name].as_s().unwrap().clone();
    let number = |name: &str| record[name].as_n().unwrap().clone();
    assert_eq!(text("lock"), l.as_str());
    assert_eq!(text("place"), w.key.render());
    assert_eq!(text("holder"), execution("w"));
    assert_eq!(text("acquisition"), "r0");
    assert_eq!((number("run"), number("limit")), ("0".into(), "1".into()));
    assert_eq!(text("task_token"), "w-task-0");
    assert_eq!(text("context"), w.context);
    assert_eq!(decode_waiter(&record).unwrap(), w);

    // A retried attempt whose first one landed: refused by the record's own check.
    assert_eq!(
        sem.enqueue(&w, T0).await.unwrap(),
        QueueOutcome::AlreadyQueued
    );
    let counts = counter.take();
    assert_eq!(counts.get("DynamoDB.TransactWriteItems"), 1);
    // The item's own checks held, so the refusal handed nothing back: the item is read.
    assert_eq!(counts.get("DynamoDB.GetItem"), 1);
    assert_eq!(counts.total(), 2, "{counts:?}");
    let again = observe(client, store.table(), l.as_str()).await.unwrap();
    assert_eq!(again.version, after.version, "nothing was written");
    assert_eq!(
        raw_record(client, store.queue_table(), &l, w.key).await,
        Some(record)
    );
    assert_eq!(assert_counted(&store, &l).await, 1);
}

#[tokio::test]
async fn a_query_reads_the_line_in_order_across_many_waiters_and_pages() {
    let store = fresh_table().await;
    let sem = manual(&store);
    let l = lock("line-order");
    hold(&sem, &l, &exec_id("holder"), 1).await;
    // 120 waiters, twelve per millisecond (their digests order them), queued in shuffled
    // order: more than one BatchGetItem (100 keys at most) reads their records.
    let mut rng = fastrand::Rng::with_seed(30);
    let mut times: Vec<u64> = (0..120).map(|n| T0 - 100 + n % 10).collect();
    rng.shuffle(&mut times);
    let mut waiters: Vec<Waiter> = times
        .iter()
        .enumerate()
        .map(|(n, at)| waiter(&l, &format!("exec-{n:02}"), 1, *at))
        .collect();
    for w in &waiters {
        assert_eq!(sem.enqueue(w, T0).await.unwrap(), QueueOutcome::Queued);
    }
    // Another lock's line shares the table, not the line.
    let other = lock("other-line");
    hold(&sem, &other, &exec_id("other-holder"), 1).await;
    let stranger = waiter(&other, "stranger", 1, T0 - 1_000);
    assert_eq!(
        sem.enqueue(&stranger, T0).await.unwrap(),
        QueueOutcome::Queued
    );

    waiters.sort_by_key(|w| w.key);
    let read = sem.waiters(&l, None, 200).await.unwrap();
    assert_eq!(read, waiters, "line order: entry time, then digest");
    let mut paged = Vec::new();
    let mut after = None;
    loop {
        let page = sem.waiters(&l, after, 7).await.unwrap();
        assert!(page.len() <= 7);
        let Some(last) = page.last() else { break };
        after = Some(last.key);
        paged.extend(page);
    }
    assert_eq!(paged, waiters, "pages read after a key continue the line");
    assert_eq!(sem.waiters(&l, None, 1).await.unwrap(), waiters[..1]);
    let raw: Vec<String> = observe::raw_line(store.client(), store.queue_table(), l.as_str())
        .await
        .iter()
        .map(place)
        .collect();
    let rendered: Vec<String> = waiters.iter().map(|w| w.key.render()).collect();
    assert_eq!(raw, rendered, "the stored sort key's order is the line's");
    assert_eq!(assert_counted(&store, &l).await, 120);
    assert_eq!(assert_counted(&store, &other).await, 1);
    assert_eq!(sem.waiters(&other, None, 100).await.unwrap(), [stranger]);
}

/// The line's index keeps only the keys, so a read of the line is a `Query` and then a read of
/// the records it names: a waiter that leaves in between is no longer in line, and the read
/// goes on to the one after it rather than answering an empty line or a record that is gone.
#[tokio::test]
async fn a_waiter_gone_between_the_query_and_its_record_read_is_left_out_and_the_next_is_read() {
    let store = fresh_table().await;
    let sem = manual(&store);
    let l = lock("line-race");
    hold(&sem, &l, &exec_id("holder"), 1).await;
    let (first, second) = (
        waiter(&l, "first", 1, T0 - 20),
        waiter(&l, "second", 1, T0 - 10),
    );
    for w in [&first, &second] {
        assert_eq!(sem.enqueue(w, T0).await.unwrap(), QueueOutcome::Queued);
    }

    let proxy = HoldingProxy::start(endpoint()).await;
    let reader = Semaphore::new(
        DynamoStore::new(client_for(&proxy.endpoint()), store.table())
            .with_queue_table(store.queue_table()),
    );
    proxy.hold_next("BatchGetItem", 1);
    let reading = {
        let l = l.clone();
        tokio::spawn(async move { reader.waiters(&l, None, 1).await })
    };
    // The Query named the head; its record read is held while the head leaves the line.
    proxy.wait_held(1).await;
    assert!(sem.leave(&l, first.key.id).await.unwrap(), "the head left");
    proxy.release_held();
    let read = reading.await.unwrap().unwrap();
    assert_eq!(read, [second], "the head as it is once the first left");
    assert_eq!(assert_counted(&store, &l).await, 1);
}

/// DynamoDB may answer a `BatchGetItem` in part (a throttled table, an answer past its size
/// limits), naming the keys it left unread; the local server reads every key, so the partial
/// answers are a canned fault. The line's read asks for the unread records again and answers
/// the whole line in order; records still unread after its last round are a named error.
#[tokio::test]
async fn records_a_partial_read_left_unread_are_asked_for_again() {
    let store = fresh_table().await;
    let sem = manual(&store);
    let l = lock("partial-read");
    hold(&sem, &l, &exec_id("holder"), 1).await;
    let line: Vec<Waiter> = (0..8u64)
        .map(|i| waiter(&l, &format!("w{i}"), 1, T0 - 100 + i))
        .collect();
    for w in &line {
        assert_eq!(sem.enqueue(w, T0).await.unwrap(), QueueOutcome::Queued);
    }
    let proxy = FaultyProxy::start(endpoint()).await;
    let reader = Semaphore::new(
        DynamoStore::new(client_for(&proxy.endpoint()), store.table())
            .with_queue_table(store.queue_table()),
    );

    for _ in 0..3 {
        proxy.fault_next("BatchGetItem", Verdict::PartialRead);
    }
    assert_eq!(reader.waiters(&l, None, 8).await.unwrap(), line);
    assert_eq!(
        proxy.seen_of("BatchGetItem").len(),
        4,
        "three partial answers, each one's unread keys asked for again"
    );

    // Six partial answers in a row (one read and five more rounds) leave two records unread.
    for _ in 0..6 {
        proxy.fault_next("BatchGetItem", Verdict::PartialRead);
    }
    let error = reader.waiters(&l, None, 8).await.unwrap_err().to_string();
    assert!(
        error.contains("2 waiters' records left unread 5 times"),
        "{error}"
    );
    assert_eq!(proxy.pending(), 0);
}

#[tokio::test]
async fn grant_leave_and_repark_refusals_say_whose_check_failed_and_hand_back_the_item() {
    let store = fresh_table().await;
    let sem = manual(&store);
    let l = lock("refusals");
    let a = exec_id("a");
    hold(&sem, &l, &a, 1).await;
    let w = waiter(&l, "w", 1, T0);
    assert_eq!(sem.enqueue(&w, T0).await.unwrap(), QueueOutcome::Queued);
    let record = raw_record(store.client(), store.queue_table(), &l, w.key).await;
    let item = sem.status(&l).await.unwrap();
    let refused = |current: &SemaphoreItem, waiter_refused| WriteResult::Refused {
        current: current.clone(),
        waiter_refused,
    };

    // Full, the record as read: only the lock item's check (the limit) fails.
    let grant = protocol::grant(&w, None, &w.terms, T0);
    let result = store.write(&grant).await.unwrap();
    assert_eq!(result, refused(&item, false));
    assert!(matches!(
        protocol::granted(&grant, result).unwrap(),
        Grant::NoSlot { .. }
    ));
    // Read before it parked anew (another task token), while full: both checks fail; the
    // item comes back with the refusal.
    let mut stale = w.clone();
    stale.wakeup = Wakeup::Task(task_token("w-task-old"));
    let stale_grant = protocol::grant(&stale, None, &stale.terms, T0);
    let result = store.write(&stale_grant).await.unwrap();
    assert_eq!(result, refused(&item, true));
    assert!(matches!(
        protocol::granted(&stale_grant, result).unwrap(),
        Grant::Moved { .. }
    ));
    // A waiter that is not in line: its grant, leave and re-park are refused by the record's
    // check alone; the lock's item is as it is.
    let g = waiter(&l, "g", 1, T0);
    let writes = [
        protocol::grant(&g, None, &g.terms, T0),
        protocol::leave(&l, g.id()),
        protocol::repark(
            &l,
            g.id(),
            Wakeup::Task(task_token("g-task-1")),
            Attempt::new(T0, 1),
        ),
    ];
    for write in &writes {
        let result = store.write(write).await.unwrap();
        assert_eq!(result, refused(&item, true), "{write:?}");
        assert_eq!(result.failed_check(write), Some(&write.checks[0]));
    }
    assert!(!sem.leave(&l, g.id()).await.unwrap());
    assert!(!sem
        .repark(
            &l,
            g.id(),
            Wakeup::Task(task_token("g-task-1")),
            Attempt::new(T0, 1)
        )
        .await
        .unwrap());
    assert_eq!(
        sem.status(&l).await.unwrap(),
        item,
        "no refusal wrote anything"
    );
    assert_eq!(
        raw_record(store.client(), store.queue_table(), &l, w.key).await,
        record
    );

    // A slot is free: the stale grant is refused by the record's check alone.
    release(&sem, &l, &a).await;
    let item = sem.status(&l).await.unwrap();
    let result = store.write(&stale_grant).await.unwrap();
    assert_eq!(result, refused(&item, true));
    // w's execution ended while it waited and was cleaned up: its grant meets the fence.
    sem.cleanup(&l, &w.identity.holder).await.unwrap();
    let item = sem.status(&l).await.unwrap();
    let result = store.write(&grant).await.unwrap();
    assert_eq!(result, refused(&item, false));
    assert!(matches!(
        protocol::granted(&grant, result).unwrap(),
        Grant::Dead { .. }
    ));

    // A lock without an item: both checks fail, and there is no item to hand back.
    let nowhere = lock("no-item-yet");
    let lost = waiter(&nowhere, "lost", 1, T0);
    for write in [
        protocol::grant(&lost, None, &lost.terms, T0),
        protocol::leave(&nowhere, lost.id()),
    ] {
        let result = store.write(&write).await.unwrap();
        assert_eq!(
            result,
            refused(&SemaphoreItem::empty(nowhere.clone()), true)
        );
    }
    assert!(sem.status(&nowhere).await.is_err(), "nothing was created");

    // Landed: a re-park changes the record's token, not the lock's holders or count.
    let repark = protocol::repark(
        &l,
        w.id(),
        Wakeup::Task(task_token("w-task-1")),
        Attempt::new(T0, 1),
    );
    assert_eq!(
        store.write(&repark).await.unwrap(),
        WriteResult::Landed { after: None }
    );
    let record = raw_record(store.client(), store.queue_table(), &l, w.key)
        .await
        .unwrap();
    assert_eq!(record["task_token"].as_s().unwrap(), "w-task-1");
    let after = sem.status(&l).await.unwrap();
    assert_eq!((&after.holders, after.waiting), (&item.holders, 1));
    // And leaving removes it and uncounts it.
    assert!(sem.leave(&l, w.id()).await.unwrap());
    assert!(raw_record(store.client(), store.queue_table(), &l, w.key)
        .await
        .is_none());
    assert_eq!(assert_counted(&store, &l).await, 0);
}

#[tokio::test]
async fn a_hand_off_over_dynamodb_grants_in_line_order_and_frees_skips_or_parks_the_rest() {
    let store = fresh_table().await;
    let sem = manual(&store);
    let (waker, executions) = (RecordingWaker::default(), CannedExecutions::default());
    let l = lock("hand-off");
    let (a, b) = (exec_id("a"), exec_id("b"));
    hold(&sem, &l, &a, 2).await;
    hold(&sem, &l, &b, 2).await;
    let mut rng = fastrand::Rng::with_seed(6);
    let mut times: Vec<u64> = (0..6).map(|n| T0 - 60 + n * 10).collect();
    rng.shuffle(&mut times);
    let mut line: Vec<Waiter> = times
        .iter()
        .enumerate()
        .map(|(n, at)| waiter(&l, &format!("w{n}"), 2, *at))
        .collect();
    for w in &line {
        assert_eq!(sem.enqueue(w, T0).await.unwrap(), QueueOutcome::Queued);
    }
    line.sort_by_key(|w| w.key);
    // The head's execution ended while it waited and was cleaned up; the second's wake-up
    // fails and its execution has ended; the next two are woken.
    sem.cleanup(&l, &line[0].identity.holder).await.unwrap();
    waker.fail_for(&line[1].identity);
    executions.answer(
        &line[1].identity,
        ExecutionState::Ended {
            status: "TIMED_OUT".to_owned(),
            last_run: Run::FIRST,
        },
    );

    release(&sem, &l, &a).await;
    release(&sem, &l, &b).await;
    let report = sem.hand_off(&l, None, &waker, &executions).await.unwrap();
    assert_eq!(report.skipped, [line[0].identity.clone()], "{report:?}");
    assert_eq!(report.freed, [line[1].identity.clone()]);
    assert_eq!(
        holders_of(&report.woken),
        [line[2].identity.clone(), line[3].identity.clone()]
    );
    assert!(report.parked.is_empty());
    let calls = waker.calls();
    let called: Vec<&str> = calls.iter().map(|c| c.0.as_str()).collect();
    let expected: Vec<&str> = line[1..4]
        .iter()
        .map(|w| w.identity.holder.as_str())
        .collect();
    assert_eq!(called, expected, "the dead head was not woken");
    for call in &calls {
        assert!(call.1.ends_with("-task-0"), "woken with its task token");
    }
    let item = sem.status(&l).await.unwrap();
    assert_eq!(item.count(), 2);
    for (who, token) in &report.woken {
        assert_eq!(
            item.holders[who].token, *token,
            "woken with its grant's token"
        );
    }
    assert!(report.woken[0].1 < report.woken[1].1);
    assert_eq!(
        sem.acquire(&l, &line[1].identity, limit(2)).await.unwrap(),
        AcquireOutcome::Fenced(FenceReason::ExecutionEnded),
        "the slot handed to the ended waiter was freed by a cleanup of it"
    );
    assert_eq!(assert_counted(&store, &l).await, 2);
    let raw: Vec<String> = observe::raw_line(store.client(), store.queue_table(), l.as_str())
        .await
        .iter()
        .map(place)
        .collect();
    assert_eq!(raw, [line[4].key.render(), line[5].key.render()]);

    // A wake-up that fails while the execution still runs: it keeps the slot, and finds it when
    // its fallback check asks again.
    waker.fail_for(&line[4].identity);
    release(&sem, &l, &line[2].identity).await;
    let report = sem.hand_off(&l, None, &waker, &executions).await.unwrap();
    assert_eq!(report.parked, [line[4].identity.clone()], "{report:?}");
    assert!(report.woken.is_empty());
    let token = waker.calls().last().unwrap().2;
    assert_eq!(
        sem.acquire(&l, &line[4].identity, limit(2)).await.unwrap(),
        AcquireOutcome::AlreadyHeld { token, count: 2 }
    );
    assert_eq!(assert_counted(&store, &l).await, 1, "line[5] waits on");
    assert_eq!(executions.asked.load(Ordering::SeqCst), 2);
}

/// F8, made to happen in each order, one step at a time: a slot frees between a newcomer's
/// "full" and its queueing. The newcomer is never left asleep beside a free slot.
#[tokio::test]
async fn a_slot_freed_between_full_and_queueing_is_taken_not_slept_through() {
    let store = fresh_table().await;
    let sem = manual(&store);
    let (waker, executions) = (RecordingWaker::default(), CannedExecutions::default());
    let l = lock("full-then-free");
    let full = AcquireOutcome::Full {
        count: 1,
        used: 1,
        limit: limit(1),
    };
    let h = exec_id("h");
    hold(&sem, &l, &h, 1).await;

    // The release (and its hand-off, which finds nobody waiting) lands first: the queue write is
    // refused, a slot being free with nobody waiting, and the newcomer acquires instead.
    let n1 = waiter(&l, "n1", 1, T0);
    assert_eq!(sem.acquire(&l, &n1.identity, limit(1)).await.unwrap(), full);
    release(&sem, &l, &h).await;
    let handed = sem.hand_off(&l, None, &waker, &executions).await.unwrap();
    assert!(handed.is_empty(), "{handed:?}");
    assert_eq!(sem.enqueue(&n1, T0).await.unwrap(), QueueOutcome::Free);
    assert_eq!(assert_counted(&store, &l).await, 0);
    hold(&sem, &l, &n1.identity, 1).await;

    // The queue write lands first: the release's hand-off grants the waiter and wakes it.
    let n2 = waiter(&l, "n2", 1, T0);
    assert_eq!(sem.acquire(&l, &n2.identity, limit(1)).await.unwrap(), full);
    assert_eq!(sem.enqueue(&n2, T0).await.unwrap(), QueueOutcome::Queued);
    release(&sem, &l, &n1.identity).await;
    let handed = sem.hand_off(&l, None, &waker, &executions).await.unwrap();
    assert_eq!(
        holders_of(&handed.woken),
        std::slice::from_ref(&n2.identity)
    );

    // The queue write lands, then a release whose hand-off never runs (its Lambda died after
    // the write): the waiter's own hand-off, right after it queued, grants it.
    let n3 = waiter(&l, "n3", 1, T0);
    assert_eq!(sem.acquire(&l, &n3.identity, limit(1)).await.unwrap(), full);
    assert_eq!(sem.enqueue(&n3, T0).await.unwrap(), QueueOutcome::Queued);
    release(&sem, &l, &n2.identity).await;
    let handed = sem.hand_off(&l, None, &waker, &executions).await.unwrap();
    assert_eq!(
        holders_of(&handed.woken),
        std::slice::from_ref(&n3.identity)
    );
    let item = sem.status(&l).await.unwrap();
    assert_eq!(item.holders[&n3.identity].token, handed.woken[0].1);
    assert_eq!(assert_counted(&store, &l).await, 0);
}

// The race: executions queueing while others release and hand off.

/// Every event the test needs to judge the order of grants, stamped with one counter.
#[derive(Default)]
struct LineLog {
    clock: AtomicU64,
    /// When each waiter's enqueue had landed (its call returned).
    queued: Mutex<BTreeMap<QueueKey, u64>>,
    /// Each grant that landed: the waiter's key, and when the hand-off that sent it read the
    /// head of the line.
    grants: Mutex<Vec<(QueueKey, u64)>>,
    /// Grants refused because the record had moved (another hand-off granted it first).
    moved: AtomicUsize,
    /// Grants refused for want of a slot (another hand-off took it first).
    no_slot: AtomicUsize,
}

impl LineLog {
    fn tick(&self) -> u64 {
        self.clock.fetch_add(1, Ordering::SeqCst)
    }
}

/// One execution's view of the store: stamps its reads of the head of the line, its plain
/// acquires, and the enqueues and grants that landed.
struct Traced {
    inner: DynamoStore,
    log: Arc<LineLog>,
    head_read_at: AtomicU64,
    acquire_sent_at: AtomicU64,
}

impl Traced {
    fn new(table: &str, log: &Arc<LineLog>) -> Self {
        Self {
            inner: DynamoStore::new(client_for(endpoint()), table),
            log: log.clone(),
            head_read_at: AtomicU64::new(0),
            acquire_sent_at: AtomicU64::new(0),
        }
    }
}

impl ItemStore for Traced {
    async fn load(&self, l: &LockName) -> Result<Option<SemaphoreItem>, StoreError> {
        self.inner.load(l).await
    }

    async fn write(&self, write: &Write) -> Result<WriteResult, StoreError> {
        if write.checks.contains(&Check::QueueEmpty) {
            self.acquire_sent_at
                .store(self.log.tick(), Ordering::SeqCst);
        }
        let result = self.inner.write(write).await?;
        let enqueued = write.changes.iter().find_map(|change| match change {
            Change::Enqueue(waiter) => Some(waiter.key),
            _ => None,
        });
        let granted = write.checks.iter().find_map(|check| match check {
            Check::QueuedWith { id, .. } => Some(*id),
            _ => None,
        });
        match (&result, enqueued, granted) {
            (WriteResult::Landed { .. }, Some(key), _) => {
                let at = self.log.tick();
                self.log.queued.lock().unwrap().insert(key, at);
            }
            (WriteResult::Landed { .. }, _, Some(id)) => {
                let read_at = self.head_read_at.load(Ordering::SeqCst);
                let queued = self.log.queued.lock().unwrap();
                let key = *queued
                    .keys()
                    .find(|key| key.id == id)
                    .expect("a waiter granted was queued first");
                drop(queued);
                self.log.grants.lock().unwrap().push((key, read_at));
            }
            (WriteResult::Refused { waiter_refused, .. }, _, Some(_)) => {
                let counter = match waiter_refused {
                    true => &self.log.moved,
                    false => &self.log.no_slot,
                };
                counter.fetch_add(1, Ordering::SeqCst);
            }
            _ => {}
        }
        Ok(result)
    }

    async fn list_page(
        &self,
        after: Option<&semaphore_core::ListCursor>,
    ) -> Result<semaphore_core::ListPage, StoreError> {
        self.inner.list_page(after).await
    }

    async fn waiters(
        &self,
        l: &LockName,
        after: Option<QueueKey>,
        n: usize,
    ) -> Result<Vec<Waiter>, StoreError> {
        self.head_read_at.store(self.log.tick(), Ordering::SeqCst);
        self.inner.waiters(l, after, n).await
    }

    async fn waiter(
        &self,
        lock: &LockName,
        id: semaphore_core::WaiterId,
    ) -> Result<Option<semaphore_core::Waiter>, StoreError> {
        self.inner.waiter(lock, id).await
    }
}

/// Wakes a waiting execution through its channel (what `SendTaskSuccess` does for a parked
/// task); records every wake-up.
#[derive(Default)]
struct ChannelWaker {
    parked: Mutex<HashMap<Identity, tokio::sync::oneshot::Sender<FencingToken>>>,
    woken: Mutex<Vec<(Identity, FencingToken)>>,
}

impl Waker for ChannelWaker {
    async fn wake(&self, waiter: &Waiter, token: FencingToken) -> Result<(), PortError> {
        self.woken
            .lock()
            .unwrap()
            .push((waiter.identity.clone(), token));
        let parked = self.parked.lock().unwrap().remove(&waiter.identity);
        match parked {
            Some(task) => task
                .send(token)
                .map_err(|_| PortError::new("the waiting task is gone")),
            None => Err(PortError::new(format!(
                "{} was woken twice",
                waiter.identity.holder
            ))),
        }
    }

    async fn defer(&self, waiter: &Waiter, next_start_ms: u64) -> Result<(), PortError> {
        panic!(
            "{} deferred to {next_start_ms} on a lock without a rate",
            waiter.identity.holder
        )
    }
}

const EXECUTIONS: usize = 40;
const LIMIT: i64 = 3;
/// The first ones arrive at once; the others trickle in, one every `TRICKLE_MS`, once the
/// burst's line is nearly drained (at most `DRAINED` wait).
const BURST: usize = 24;
const TRICKLE_MS: u64 = 80;
const DRAINED: i64 = 2;
/// The lock starts full (held by blockers), which release once this many wait in line, while
/// the rest of the burst is still queueing.
const LINE_BEFORE_RELEASE: i64 = 10;

/// What one execution did.
#[derive(Debug)]
struct Ran {
    identity: Identity,
    /// Its key if it got in line (a hand-off then granted it), `None` if it acquired.
    queued: Option<QueueKey>,
    token: FencingToken,
    /// When its acquire that took the slot was sent (if it acquired).
    acquire_sent_at: u64,
    /// Its attempts to queue answered `Free`: a slot freed between its "full" and its queueing.
    free: usize,
}

struct Race {
    table: String,
    lock: LockName,
    log: Arc<LineLog>,
    waker: Arc<ChannelWaker>,
    executions: Arc<CannedExecutions>,
    /// Holders according to the holders themselves (raised after the slot is theirs, lowered
    /// before they release it): never above the limit.
    inside: AtomicI64,
    max_inside: AtomicI64,
    /// Set once the burst's line is nearly drained: the trickle starts.
    drained: AtomicBool,
}

impl Race {
    fn semaphore(&self) -> Semaphore<Traced> {
        Semaphore::new(Traced::new(&self.table, &self.log))
    }

    async fn hand_off(&self, sem: &Semaphore<Traced>) {
        sem.hand_off(&self.lock, None, &*self.waker, &*self.executions)
            .await
            .unwrap();
    }
}

async fn run_execution(race: Arc<Race>, n: usize) -> Ran {
    if n >= BURST {
        while !race.drained.load(Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        tokio::time::sleep(Duration::from_millis((n - BURST) as u64 * TRICKLE_MS)).await;
    }
    let sem = race.semaphore();
    let identity = exec_id(&format!("run-{n:02}"));
    let (parked, wake_up) = tokio::sync::oneshot::channel();
    race.waker
        .parked
        .lock()
        .unwrap()
        .insert(identity.clone(), parked);
    let (mut queued, mut free) = (None, 0);
    let token = loop {
        match sem
            .acquire(&race.lock, &identity, limit(LIMIT))
            .await
            .unwrap()
        {
            AcquireOutcome::Acquired { token, .. } => break token,
            AcquireOutcome::Full { .. } => {}
            other => panic!("{n}: acquire answered {other:?}"),
        }
        // Full: get in line, some after a pause, so that slots free up in between.
        tokio::time::sleep(Duration::from_millis(fastrand::u64(0..10))).await;
        let now = sem.now_ms();
        let w = Waiter::new(
            race.lock.clone(),
            identity.clone(),
            Run::FIRST,
            limit(LIMIT),
            now,
            task_token(&format!("run-{n:02}-task-0")),
            Attempt::new(now, 0),
            String::new(),
        );
        match sem.enqueue(&w, now).await.unwrap() {
            QueueOutcome::Queued => {
                queued = Some(w.key);
                // A slot may have freed between the "full" and the queueing (F8).
                race.hand_off(&sem).await;
                break tokio::time::timeout(Duration::from_secs(30), wake_up)
                    .await
                    .unwrap_or_else(|_| panic!("{n} was never woken"))
                    .expect("the waker keeps the channel until it wakes");
            }
            QueueOutcome::Free => free += 1,
            other => panic!("{n}: enqueue answered {other:?}"),
        }
    };
    let now = race.inside.fetch_add(1, Ordering::SeqCst) + 1;
    race.max_inside.fetch_max(now, Ordering::SeqCst);
    assert!(now <= LIMIT, "{now} inside");
    tokio::time::sleep(Duration::from_millis(fastrand::u64(5..40))).await;
    race.inside.fetch_sub(1, Ordering::SeqCst);
    release(&sem, &race.lock, &identity).await;
    race.hand_off(&sem).await;
    Ran {
        identity,
        queued,
        token,
        acquire_sent_at: sem.store().acquire_sent_at.load(Ordering::SeqCst),
        free,
    }
}

/// L2, S1 and L1 under a real race, 40 executions on a lock of 3. The lock starts full; 24
/// executions arrive at once and queue; once 10 wait, the blockers release and hand off while
/// the rest of the burst is still queueing (each queued waiter also hands off right after it
/// queued), and 16 more trickle in while the line drains (some of them find a slot free between
/// their "full" and their queueing, or take one at once when the line is empty). An independent
/// poller reads the raw item throughout.
///
/// Line order is checked exactly as the protocol promises it, whatever the interleaving: when a
/// hand-off read the head of the line and granted waiter `b`, every waiter `a` ahead of `b` (an
/// earlier key) whose enqueue had landed before that read was granted before `b` (a smaller
/// token); and no plain acquire passed a waiter whose enqueue landed before it was sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn executions_queueing_while_others_release_and_hand_off_are_granted_once_in_line_order() {
    let store = fresh_table().await;
    let l = lock("race");
    let race = Arc::new(Race {
        table: store.table().to_owned(),
        lock: l.clone(),
        log: Arc::default(),
        waker: Arc::default(),
        executions: Arc::default(),
        inside: AtomicI64::new(0),
        max_inside: AtomicI64::new(0),
        drained: AtomicBool::new(false),
    });
    let blockers: Vec<Identity> = (0..LIMIT)
        .map(|n| exec_id(&format!("blocker-{n}")))
        .collect();
    let sem = race.semaphore();
    for who in &blockers {
        hold(&sem, &l, who, LIMIT).await;
    }

    let done = Arc::new(AtomicBool::new(false));
    let poller = {
        let (done, table, l) = (done.clone(), store.table().to_owned(), l.clone());
        tokio::spawn(async move {
            let client = client_for(endpoint());
            let (mut samples, mut max_holders, mut max_waiting) = (0, 0, 0);
            while !done.load(Ordering::SeqCst) {
                let seen = observe(&client, &table, l.as_str()).await.unwrap();
                seen.assert_safe(LIMIT as usize);
                max_holders = max_holders.max(seen.holders.len());
                let waiting = raw_waiting(&client, &table, &l).await;
                assert!(
                    (0..=EXECUTIONS as i64).contains(&waiting),
                    "waiting {waiting}"
                );
                max_waiting = max_waiting.max(waiting);
                samples += 1;
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            (samples, max_holders, max_waiting)
        })
    };

    let tasks: Vec<_> = (0..EXECUTIONS)
        .map(|n| tokio::spawn(run_execution(race.clone(), n)))
        .collect();
    // The blockers release, each with its hand-off, at once, while the burst still queues.
    let client = store.client();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while raw_waiting(client, store.table(), &l).await < LINE_BEFORE_RELEASE {
        assert!(tokio::time::Instant::now() < deadline, "no line formed");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let releases: Vec<_> = blockers
        .iter()
        .map(|who| {
            let (race, who) = (race.clone(), who.clone());
            tokio::spawn(async move {
                let sem = race.semaphore();
                release(&sem, &race.lock, &who).await;
                race.hand_off(&sem).await;
            })
        })
        .collect();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while raw_waiting(client, store.table(), &l).await > DRAINED {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the line never drained"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    race.drained.store(true, Ordering::SeqCst);
    let all = async {
        for release in releases {
            release.await.expect("a blocker's release failed");
        }
        let mut ran = Vec::new();
        for task in tasks {
            ran.push(task.await.expect("an execution failed"));
        }
        ran
    };
    let ran = tokio::time::timeout(Duration::from_secs(60), all)
        .await
        .expect("the executions did not all finish: a lost wake-up or a stall");
    done.store(true, Ordering::SeqCst);
    let (samples, max_holders, max_waiting) = poller.await.expect("the poller saw an unsafe state");

    // Every waiter was granted exactly once, and woken with its grant's token.
    let woken = race.waker.woken.lock().unwrap().clone();
    let woken_ids: BTreeSet<&Identity> = woken.iter().map(|(who, _)| who).collect();
    assert_eq!(woken_ids.len(), woken.len(), "a waiter was woken twice");
    let waiters: Vec<&Ran> = ran.iter().filter(|r| r.queued.is_some()).collect();
    let waiter_ids: BTreeSet<&Identity> = waiters.iter().map(|r| &r.identity).collect();
    assert_eq!(woken_ids, waiter_ids, "woken = queued");
    for (who, token) in &woken {
        let r = ran.iter().find(|r| &r.identity == who).unwrap();
        assert_eq!(r.token, *token, "{who:?} got its grant's token");
    }
    let tokens: BTreeSet<FencingToken> = ran.iter().map(|r| r.token).collect();
    assert_eq!(tokens.len(), EXECUTIONS, "fencing tokens are distinct");
    let grants = race.log.grants.lock().unwrap().clone();
    assert_eq!(grants.len(), waiters.len(), "one grant landed per waiter");

    // Line order among waiters, and no plain acquire ahead of the line.
    let queued = race.log.queued.lock().unwrap().clone();
    let token_of: BTreeMap<QueueKey, FencingToken> = waiters
        .iter()
        .map(|r| (r.queued.unwrap(), r.token))
        .collect();
    let mut pairs_checked = 0;
    for (b, head_read_at) in &grants {
        for (a, landed_at) in queued.range(..*b) {
            if landed_at < head_read_at {
                pairs_checked += 1;
                assert!(
                    token_of[a] < token_of[b],
                    "{a} was in line ahead of {b} when the head was read, but was granted after"
                );
            }
        }
    }
    let direct: Vec<&Ran> = ran.iter().filter(|r| r.queued.is_none()).collect();
    let mut passes_checked = 0;
    for d in &direct {
        for (a, landed_at) in &queued {
            if *landed_at < d.acquire_sent_at {
                passes_checked += 1;
                assert!(
                    token_of[a] < d.token,
                    "{:?} acquired ahead of {a}, in line before it asked",
                    d.identity
                );
            }
        }
    }

    // The end: nothing held, nobody in line, the count agrees.
    let end = observe(client, store.table(), l.as_str()).await.unwrap();
    assert!(end.holders.is_empty(), "leaked: {end:?}");
    assert_eq!(assert_counted(&store, &l).await, 0);
    assert_eq!(race.executions.asked.load(Ordering::SeqCst), 0);

    let free: usize = ran.iter().map(|r| r.free).sum();
    let (moved, no_slot) = (
        race.log.moved.load(Ordering::SeqCst),
        race.log.no_slot.load(Ordering::SeqCst),
    );
    println!(
        "{EXECUTIONS} executions, limit {LIMIT}: {} acquired, {} queued and granted; {free} \
         attempts to queue found a slot free; grants refused: {moved} moved (granted by another \
         hand-off), {no_slot} no slot; line order checked on {pairs_checked} pairs, no pass on \
         {passes_checked}; poller: {samples} reads, max holders {max_holders}, max waiting {max_waiting}; max \
         inside {}",
        direct.len(),
        waiters.len(),
        race.max_inside.load(Ordering::SeqCst)
    );
    // By construction: a line of 10 formed before any slot freed, and was granted from.
    assert!(waiters.len() >= LINE_BEFORE_RELEASE as usize);
    assert!(pairs_checked >= 45, "order barely checked: {pairs_checked}");
    assert!(samples >= 10, "the poller barely ran: {samples}");
}
