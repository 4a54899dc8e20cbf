//! DynamoDB's answers that are not answers to the write (F10), made to happen against the local
//! server through the test proxy (`proxy::FaultyProxy`): an answer lost after the write landed
//! (the proxy forwards the write and answers the SDK a 500, so the SDK sends it again), a
//! transaction still in progress, throttled or conflicting transactions, a conflict of the
//! item-creating put. Every operation must still answer what its own write did, and a
//! transaction sent again must not take effect twice or read as refused by its own effects.
//!
//! The lost answer and the canned answers are the proxy's: moto, serving one request at a time
//! with no capacity limits, produces none of them (each canned answer says so in
//! `proxy::Canned`). That a committed transaction sent again with its client request token
//! succeeds without applying twice is the local server's (a guarded patch in
//! local/moto_server.py, as DynamoDB documents it).

use semaphore_core::Claim;
use std::sync::{Arc, Mutex};

use local_aws::names::{id, limit, lock};
use local_aws::observe::observe;
use local_aws::proxy::{recognise, Canned, FaultyProxy, ProtocolWrite, Verdict};
use local_aws::{client_for, endpoint, fresh_table};
use semaphore_core::{
    AcquireOutcome, Attempt, DynamoStore, ExecutionState, ExecutionStatus, FencingToken, HolderId,
    Identity, LockName, ManualClock, PortError, QueueOutcome, ReleaseOutcome, Run, Semaphore,
    StoreError, TaskToken, Waiter, Waker,
};

const T0: u64 = 1_800_000_000_000;
const TRANSACT: &str = "TransactWriteItems";

fn exec_id(name: &str) -> Identity {
    id(
        &format!("arn:aws:states:us-east-1:123456789012:execution:LockProtected:{name}"),
        "r0",
    )
}

fn waiter(l: &LockName, name: &str) -> Waiter {
    Waiter::new(
        l.clone(),
        exec_id(name),
        Run::FIRST,
        limit(1),
        T0,
        TaskToken::new(format!("{name}-task-0")).unwrap(),
        Attempt::new(T0, 0),
        "{}".to_owned(),
    )
}

/// The same table, reached directly and through a fresh faulty proxy.
async fn setup() -> (DynamoStore, FaultyProxy, Semaphore<DynamoStore>) {
    let store = fresh_table().await;
    let proxy = FaultyProxy::start(endpoint()).await;
    let faulty = DynamoStore::new(client_for(&proxy.endpoint()), store.table())
        .with_queue_table(store.queue_table());
    let sem = Semaphore::new(faulty).with_clock(Arc::new(ManualClock::new(T0)));
    (store, proxy, sem)
}

fn direct(store: &DynamoStore) -> Semaphore<DynamoStore> {
    Semaphore::new(store.clone()).with_clock(Arc::new(ManualClock::new(T0)))
}

#[derive(Default)]
struct Woken(Mutex<Vec<(Identity, FencingToken)>>);

impl Waker for Woken {
    async fn wake(&self, waiter: &Waiter, token: FencingToken) -> Result<(), PortError> {
        self.0
            .lock()
            .unwrap()
            .push((waiter.identity.clone(), token));
        Ok(())
    }
    async fn defer(&self, _waiter: &Waiter, _next_start_ms: u64) -> Result<(), PortError> {
        Ok(())
    }
}

struct AllRunning;

impl ExecutionStatus for AllRunning {
    async fn describe(&self, _holder: &HolderId) -> Result<ExecutionState, PortError> {
        Ok(ExecutionState::Running)
    }
}

/// One holder on a lock of one slot, and `w` queued behind it; then the holder's slot freed
/// without a hand-off, so that the next hand-off grants `w`.
async fn one_waiting(store: &DynamoStore, l: &LockName, w: &Waiter) {
    let sem = direct(store);
    let holder = exec_id("holder");
    assert!(matches!(
        sem.acquire_requested_at(l, &holder, limit(1), T0)
            .await
            .unwrap(),
        AcquireOutcome::Acquired { .. }
    ));
    assert_eq!(sem.enqueue(w, T0).await.unwrap(), QueueOutcome::Queued);
    sem.release(l, &holder, Claim::Operator).await.unwrap();
}

fn tokens(proxy: &FaultyProxy) -> Vec<String> {
    proxy
        .seen_of(TRANSACT)
        .into_iter()
        .map(|s| {
            s.token
                .expect("every transaction carries a client request token")
        })
        .collect()
}

#[tokio::test]
async fn a_grant_whose_answer_was_lost_is_sent_again_with_its_token_and_wakes_the_waiter() {
    let (store, proxy, sem) = setup().await;
    let l = lock("lost-grant");
    let w = waiter(&l, "w");
    one_waiting(&store, &l, &w).await;

    proxy.fault_next(TRANSACT, Verdict::LoseAnswer);
    let woken = Woken::default();
    let report = sem.hand_off(&l, None, &woken, &AllRunning).await.unwrap();

    let item = direct(&store).status(&l).await.unwrap();
    let token = item.holders[&w.identity].token;
    assert_eq!(report.woken, [(w.identity.clone(), token)], "{report:?}");
    assert_eq!(*woken.0.lock().unwrap(), [(w.identity.clone(), token)]);
    assert_eq!((item.count(), item.waiting), (1, 0));
    let sent = tokens(&proxy);
    assert_eq!(sent.len(), 2, "the grant, and the SDK's second attempt");
    assert_eq!(sent[0], sent[1], "the SDK sends it again with its token");
}

#[tokio::test]
async fn a_grant_sent_again_after_transaction_in_progress_keeps_its_token_and_wakes_the_waiter() {
    let (store, proxy, sem) = setup().await;
    let l = lock("grant-in-progress");
    let w = waiter(&l, "w");
    one_waiting(&store, &l, &w).await;

    // The grant lands and its answer is lost; the SDK's further attempts (it takes
    // TransactionInProgressException for a throttle: 3 attempts in all) meet the first still in
    // progress, and the SDK gives up. The store sends it again: with a new token it would be
    // refused by its own removal of the waiter's record ("moved") and nobody would be woken.
    proxy.fault_next(TRANSACT, Verdict::LoseAnswer);
    for _ in 0..2 {
        proxy.fault_next(TRANSACT, Verdict::Answer(Canned::TransactionInProgress));
    }
    let woken = Woken::default();
    let report = sem.hand_off(&l, None, &woken, &AllRunning).await.unwrap();

    let item = direct(&store).status(&l).await.unwrap();
    let token = item.holders[&w.identity].token;
    assert_eq!(report.woken, [(w.identity.clone(), token)], "{report:?}");
    assert_eq!((item.count(), item.waiting), (1, 0));
    let sent = tokens(&proxy);
    assert_eq!(
        sent.len(),
        4,
        "3 by the SDK, 1 by the store: {:?}",
        proxy.seen()
    );
    assert!(sent.iter().all(|t| *t == sent[0]), "one token: {sent:?}");
    assert_eq!(proxy.pending(), 0);
}

#[tokio::test]
async fn an_enqueue_whose_answer_was_lost_is_queued_once() {
    let (store, proxy, sem) = setup().await;
    let l = lock("lost-enqueue");
    direct(&store)
        .acquire_requested_at(&l, &exec_id("holder"), limit(1), T0)
        .await
        .unwrap();
    let w = waiter(&l, "w");
    proxy.fault_next(TRANSACT, Verdict::LoseAnswer);
    assert_eq!(sem.enqueue(&w, T0).await.unwrap(), QueueOutcome::Queued);
    let item = direct(&store).status(&l).await.unwrap();
    assert_eq!(item.waiting, 1, "counted once");
    assert_eq!(direct(&store).waiters(&l, None, 10).await.unwrap(), [w]);
}

#[tokio::test]
async fn a_throttled_or_conflicting_transaction_is_sent_again_and_lands_once() {
    let (store, proxy, sem) = setup().await;
    let l = lock("throttled-enqueue");
    direct(&store)
        .acquire_requested_at(&l, &exec_id("holder"), limit(1), T0)
        .await
        .unwrap();
    proxy.fault_next(TRANSACT, Verdict::Answer(Canned::ThrottledTransaction));
    proxy.fault_next(TRANSACT, Verdict::Answer(Canned::ConflictedTransaction));
    proxy.fault_next(TRANSACT, Verdict::Answer(Canned::ThrottledTransaction));
    let w = waiter(&l, "w");
    assert_eq!(sem.enqueue(&w, T0).await.unwrap(), QueueOutcome::Queued);
    assert_eq!(direct(&store).status(&l).await.unwrap().waiting, 1);
    let sent = tokens(&proxy);
    assert_eq!(sent.len(), 4, "three cancelled, then landed");
    // Nothing of a cancelled transaction committed: each round may take a new token.
    assert_eq!(
        sent.iter().collect::<std::collections::BTreeSet<_>>().len(),
        4
    );
}

#[tokio::test]
async fn a_transaction_throttled_as_often_as_the_sdk_tries_fails_with_a_named_error_and_writes_nothing(
) {
    let (store, proxy, sem) = setup().await;
    let l = lock("throttled-out");
    direct(&store)
        .acquire_requested_at(&l, &exec_id("holder"), limit(1), T0)
        .await
        .unwrap();
    // The SDK's standard mode tries a throttled request 3 times.
    for _ in 0..3 {
        proxy.fault_next(TRANSACT, Verdict::Answer(Canned::ThrottledTransaction));
    }
    let err = sem.enqueue(&waiter(&l, "w"), T0).await.unwrap_err();
    assert!(
        matches!(
            &err,
            semaphore_core::Error::Store(StoreError::Dynamo { operation: "TransactWriteItems", message, .. })
                if message.contains("throttled 3 times")
        ),
        "{err}"
    );
    assert_eq!(proxy.pending(), 0);
    assert_eq!(proxy.seen_of(TRANSACT).len(), 3);
    assert_eq!(direct(&store).status(&l).await.unwrap().waiting, 0);
}

#[tokio::test]
async fn the_put_that_creates_a_lock_is_sent_again_after_a_transaction_conflict() {
    let (store, proxy, sem) = setup().await;
    let l = lock("put-conflict");
    let who = exec_id("first");
    proxy.fault_next("PutItem", Verdict::Answer(Canned::TransactionConflict));
    let outcome = sem
        .acquire_requested_at(&l, &who, limit(1), T0)
        .await
        .unwrap();
    let item = direct(&store).status(&l).await.unwrap();
    assert_eq!(
        outcome,
        AcquireOutcome::Acquired {
            token: item.holders[&who].token,
            count: 1
        }
    );
    assert_eq!(proxy.seen_of("PutItem").len(), 2);
}

#[tokio::test]
async fn an_acquire_whose_answer_was_lost_finds_its_own_slot_with_the_first_token() {
    let (store, proxy, sem) = setup().await;
    let l = lock("lost-acquire");
    let (other, who) = (exec_id("other"), exec_id("who"));
    direct(&store)
        .acquire_requested_at(&l, &other, limit(2), T0)
        .await
        .unwrap();
    proxy.fault_next("UpdateItem", Verdict::LoseAnswer);
    let outcome = sem
        .acquire_requested_at(&l, &who, limit(2), T0)
        .await
        .unwrap();
    let item = direct(&store).status(&l).await.unwrap();
    assert_eq!(
        outcome,
        AcquireOutcome::AlreadyHeld {
            token: item.holders[&who].token,
            count: 2
        }
    );
    observe(store.client(), store.table(), l.as_str())
        .await
        .unwrap()
        .assert_safe(2);
}

#[tokio::test]
async fn a_release_whose_answer_was_lost_says_it_released() {
    let (store, proxy, sem) = setup().await;
    let l = lock("lost-release");
    let who = exec_id("who");
    direct(&store)
        .acquire_requested_at(&l, &who, limit(1), T0)
        .await
        .unwrap();
    proxy.fault_next("UpdateItem", Verdict::LoseAnswer);
    let (outcome, after) = sem.release_seeing(&l, &who, Claim::Operator).await.unwrap();
    assert_eq!(
        outcome,
        ReleaseOutcome::Released {
            token: Some(semaphore_core::FencingToken(1)),
            count: 0,
            waiting: 0
        },
        "the first attempt freed the slot; the answer names the token it checked"
    );
    assert_eq!((after.count(), after.used), (0, 0));
    // A duplicate release (another call, answered) still says it held nothing.
    assert!(matches!(
        direct(&store)
            .release(&l, &who, Claim::Operator)
            .await
            .unwrap(),
        ReleaseOutcome::NotHeld { .. }
    ));
    assert_eq!(proxy.seen_of("UpdateItem").len(), 2, "{:?}", proxy.seen());
}

#[tokio::test]
async fn a_cleanup_whose_answers_were_lost_reports_what_it_freed() {
    let (store, proxy, sem) = setup().await;
    let l = lock("lost-cleanup");
    let holder = exec_id("ended").holder;
    let slots = [
        Identity::new(
            holder.clone(),
            semaphore_core::AcquisitionId::new("a1").unwrap(),
        ),
        Identity::new(
            holder.clone(),
            semaphore_core::AcquisitionId::new("a2").unwrap(),
        ),
    ];
    for slot in &slots {
        direct(&store)
            .acquire_requested_at(&l, slot, limit(3), T0)
            .await
            .unwrap();
    }
    let held = direct(&store).status(&l).await.unwrap().holders;
    // Both of the cleanup's writes land and lose their answers: the fence, then the free.
    proxy.fault(
        |op, body| recognise(op, body) == Some(ProtocolWrite::CleanupFence),
        Verdict::LoseAnswer,
    );
    proxy.fault(
        |op, body| matches!(recognise(op, body), Some(ProtocolWrite::CleanupFree(_))),
        Verdict::LoseAnswer,
    );
    let outcome = sem.cleanup(&l, &holder).await.unwrap();
    assert_eq!(proxy.pending(), 0);
    let expected: Vec<_> = slots.iter().map(|s| (s.clone(), held[s])).collect();
    assert_eq!(outcome.freed, expected);
    assert_eq!(outcome.count, 0);
    let item = direct(&store).status(&l).await.unwrap();
    assert_eq!((item.count(), item.used), (0, 0));
    // A duplicate cleanup (answered) freed nothing more.
    assert!(direct(&store)
        .cleanup(&l, &holder)
        .await
        .unwrap()
        .freed
        .is_empty());
}
