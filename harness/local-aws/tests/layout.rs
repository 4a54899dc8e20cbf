//! A lock's layout in the DynamoDB store, against the local server (issue #28): a lock moved to
//! the gate layout is stored in the gate's format, its holdings each an item of the holdings
//! table; the same `Semaphore` calls acquire, release, clean up and sweep it; and a write
//! rendered for the other layout is refused by the format every write checks, and sent again in
//! the lock's own.
//!
//! Needs the repository's `.venv` and the local server (`bash tests/run.sh` starts it).

use semaphore_core::Claim;
use std::sync::Arc;
use std::time::Duration;

use aws_sdk_dynamodb::types::AttributeValue;
use local_aws::observe::raw_item;
use local_aws::proxy::{Canned, FaultyProxy, HoldingProxy, Verdict};
use local_aws::{client_for, endpoint, fresh_table};
use semaphore_core::dynamo::{holding_key, FORMAT, GATE_FORMAT};
use semaphore_core::protocol::Timing;
use semaphore_core::{
    AcquireOutcome, AcquisitionId, Clock, DynamoStore, Error, ExecutionState, ExecutionStatus,
    FenceReason, HolderId, Identity, Layout, Lease, Limit, LockName, ManualClock, PortError,
    ReleaseOutcome, Semaphore, SystemClock, Terms, Weight,
};

fn id(holder: &str) -> Identity {
    Identity::new(
        HolderId::new(holder).unwrap(),
        AcquisitionId::new("r0").unwrap(),
    )
}

fn limit(n: i64) -> Limit {
    Limit::new(n).unwrap()
}

/// Every execution asked about is still running: a sweep only keeps house.
struct AllRunning;

impl ExecutionStatus for AllRunning {
    async fn describe(&self, _: &HolderId) -> Result<ExecutionState, PortError> {
        Ok(ExecutionState::Running)
    }
}

/// The holding item of `identity` on `lock`, raw.
async fn holding(
    store: &DynamoStore,
    lock: &str,
    identity: &Identity,
) -> Option<std::collections::HashMap<String, AttributeValue>> {
    store
        .client()
        .get_item()
        .table_name(store.holdings_table())
        .set_key(Some(holding_key(&LockName::new(lock).unwrap(), identity)))
        .consistent_read(true)
        .send()
        .await
        .expect("GetItem")
        .item
}

/// A semaphore on `store` whose requests go through `endpoint` (a proxy's), having seen `gate`
/// (so its writes are sent as a gate's from the first).
async fn through(endpoint: String, store: &DynamoStore, gate: &LockName) -> Semaphore<DynamoStore> {
    let sem = Semaphore::new(
        DynamoStore::new(client_for(&endpoint), store.table())
            .with_queue_table(store.queue_table()),
    );
    sem.status(gate).await.unwrap();
    sem
}

/// `who`'s acquire of `gate` through a proxy that holds the first read after its write (the
/// transaction, then the reads that answer it); answers once that read is held.
async fn acquire_holding_the_read_after(
    store: &DynamoStore,
    gate: &LockName,
    who: Identity,
    n: i64,
) -> (
    HoldingProxy,
    tokio::task::JoinHandle<Result<AcquireOutcome, Error>>,
) {
    let proxy = HoldingProxy::start(endpoint()).await;
    let delayed = through(proxy.endpoint(), store, gate).await;
    proxy.hold_next("GetItem", 1);
    let acquiring = {
        let gate = gate.clone();
        tokio::spawn(async move { delayed.acquire(&gate, &who, limit(n)).await })
    };
    proxy.wait_held(1).await;
    (proxy, acquiring)
}

fn text(item: &std::collections::HashMap<String, AttributeValue>, name: &str) -> String {
    match &item[name] {
        AttributeValue::S(s) => s.clone(),
        AttributeValue::N(n) => n.clone(),
        other => panic!("{name}: {other:?}"),
    }
}

#[tokio::test]
async fn a_gate_keeps_its_holdings_apart_and_answers_as_the_item_layout_does() {
    let store = fresh_table().await;
    let (client, table) = (store.client().clone(), store.table().to_owned());
    let clock = Arc::new(ManualClock::new(SystemClock.now_ms()));
    let timing = Timing {
        horizon: Duration::from_secs(8),
        clock_skew: Duration::from_secs(2),
    };
    let sem = Semaphore::new(store)
        .with_clock(clock.clone())
        .with_timing(timing);
    let raw = |lock: &'static str| {
        let (client, table) = (client.clone(), table.clone());
        async move { raw_item(&client, &table, lock).await.expect("an item") }
    };

    let gate = LockName::new("wide").unwrap();
    assert_eq!(
        sem.set_layout(&gate, Layout::Gate).await.unwrap().layout,
        Layout::Gate
    );
    assert_eq!(text(&raw("wide").await, "format"), GATE_FORMAT.to_string());

    // Admissions: each holding an item of its own, the gate only counting them.
    let requested_at = clock.now_ms();
    let AcquireOutcome::Acquired { token: first, .. } =
        sem.acquire(&gate, &id("exec-1"), limit(2)).await.unwrap()
    else {
        panic!("acquired")
    };
    let held = holding(sem.store(), "wide", &id("exec-1"))
        .await
        .expect("its holding");
    assert_eq!(
        (text(&held, "state"), text(&held, "token")),
        ("held".to_owned(), first.0.to_string())
    );
    assert_eq!(
        sem.acquire(&gate, &id("exec-1"), limit(2)).await.unwrap(),
        AcquireOutcome::AlreadyHeld {
            token: first,
            count: 1
        }
    );
    let AcquireOutcome::Acquired {
        token: second,
        count,
    } = sem.acquire(&gate, &id("exec-2"), limit(2)).await.unwrap()
    else {
        panic!("acquired")
    };
    assert!(second > first, "tokens rise: {first:?} then {second:?}");
    assert_eq!(count, 2);
    assert!(matches!(
        sem.acquire(&gate, &id("exec-3"), limit(2)).await.unwrap(),
        AcquireOutcome::Full { used: 2, .. }
    ));
    let stored = raw("wide").await;
    assert_eq!(
        (text(&stored, "used"), text(&stored, "holdings")),
        ("2".to_owned(), "2".to_owned())
    );
    match &stored["holders"] {
        AttributeValue::M(holders) => assert!(holders.is_empty(), "no holder in the gate"),
        other => panic!("{other:?}"),
    }
    let status = sem.status(&gate).await.unwrap();
    assert_eq!(
        (status.count(), status.holders.len(), status.used),
        (2, 2, 2)
    );

    // A release leaves a tombstone, which refuses the acquisition's late attempt.
    clock.advance_ms(1_000);
    assert!(matches!(
        sem.release(&gate, &id("exec-1"), Claim::Operator)
            .await
            .unwrap(),
        ReleaseOutcome::Released { waiting: 0, .. }
    ));
    let tombstone = holding(sem.store(), "wide", &id("exec-1"))
        .await
        .expect("a tombstone");
    assert_eq!(text(&tombstone, "state"), "released");
    assert_eq!(
        sem.acquire_requested_at(&gate, &id("exec-1"), limit(2), requested_at)
            .await
            .unwrap(),
        AcquireOutcome::Fenced(FenceReason::AcquisitionReleased)
    );
    assert!(matches!(
        sem.release(&gate, &id("exec-1"), Claim::Operator)
            .await
            .unwrap(),
        ReleaseOutcome::NotHeld { .. }
    ));

    // A lease, renewed by a heartbeat that touches only its holding.
    let leased = Terms::new(limit(2), Weight::ONE, None)
        .unwrap()
        .with_lease(Some(Lease::ms(30_000).unwrap()));
    assert!(matches!(
        sem.acquire(&gate, &id("lambda-1"), leased).await.unwrap(),
        AcquireOutcome::Acquired { .. }
    ));
    let version = text(&raw("wide").await, "version");
    clock.advance_ms(5_000);
    let renewed = sem
        .heartbeat(
            &gate,
            &id("lambda-1"),
            Claim::Operator,
            Lease::ms(30_000).unwrap(),
        )
        .await
        .unwrap();
    assert!(
        matches!(renewed, semaphore_core::HeartbeatOutcome::Renewed { .. }),
        "{renewed:?}"
    );
    assert_eq!(
        text(&raw("wide").await, "version"),
        version,
        "the gate untouched"
    );

    // A cleanup finds the execution's holdings once its fence landed, and frees them.
    let cleaned = sem
        .cleanup(&gate, &HolderId::new("exec-2").unwrap())
        .await
        .unwrap();
    assert_eq!(cleaned.freed.len(), 1);
    assert!(holding(sem.store(), "wide", &id("exec-2")).await.is_none());
    let status = sem.status(&gate).await.unwrap();
    assert_eq!((status.count(), status.used), (1, 1));

    // A window after the release, the sweep rotates (the tombstone makes a rotation due) and
    // drops the tombstone that rotation has passed.
    clock.advance_ms(timing.window().as_millis() as u64);
    let report = sem.sweep(&AllRunning).await.unwrap();
    assert_eq!(
        (report.rotated, report.tombstones_dropped),
        (1, 1),
        "{report:?}"
    );
    assert!(holding(sem.store(), "wide", &id("exec-1")).await.is_none());
    assert!(sem.status(&gate).await.unwrap().tombstones.is_empty());

    // A lease that passed unrenewed is taken back by the sweep, its holding left a tombstone.
    sem.drain_taken_back();
    clock.advance_ms(30_000 + timing.clock_skew.as_millis() as u64);
    sem.sweep(&AllRunning).await.unwrap();
    let taken = sem.drain_taken_back();
    assert_eq!(
        taken.iter().map(|t| t.identity.clone()).collect::<Vec<_>>(),
        [id("lambda-1")]
    );
    let fenced = holding(sem.store(), "wide", &id("lambda-1"))
        .await
        .expect("a tombstone");
    assert_eq!(text(&fenced, "state"), "released");
    let status = sem.status(&gate).await.unwrap();
    assert_eq!((status.count(), status.used), (0, 0));
    assert_eq!(
        sem.heartbeat(
            &gate,
            &id("lambda-1"),
            Claim::Operator,
            Lease::ms(30_000).unwrap()
        )
        .await
        .unwrap(),
        semaphore_core::HeartbeatOutcome::Lost
    );

    // A lock in use stays in its layout, and its writes are still the item layout's.
    let busy = LockName::new("busy").unwrap();
    sem.acquire(&busy, &id("exec-9"), limit(2)).await.unwrap();
    let refused = sem.set_layout(&busy, Layout::Gate).await.unwrap_err();
    assert!(
        matches!(refused, Error::NotIdle { used: 1, .. }),
        "{refused}"
    );
    assert_eq!(text(&raw("busy").await, "format"), FORMAT.to_string());
}

/// A store that last saw a lock in the item layout sends its write as the item layout's; the
/// gate's format refuses it, and the write is sent again as the gate's.
#[tokio::test]
async fn a_write_for_the_wrong_layout_is_refused_by_the_format_and_sent_again() {
    let store = fresh_table().await;
    let mover = Semaphore::new(store.clone());
    let gate = LockName::new("moved").unwrap();
    // Another process (a fresh store) has seen the lock in the item layout.
    let other = Semaphore::new(
        DynamoStore::new(store.client().clone(), store.table())
            .with_queue_table(store.queue_table()),
    );
    other.acquire(&gate, &id("exec-1"), limit(2)).await.unwrap();
    other
        .release(&gate, &id("exec-1"), Claim::Operator)
        .await
        .unwrap();
    // Idle once its fence is gone: drop it by hand (a sweep a window or two later would).
    store
        .client()
        .update_item()
        .table_name(store.table())
        .key("lock", AttributeValue::S("moved".into()))
        .update_expression("REMOVE #young, #old")
        .expression_attribute_names("#young", "young")
        .expression_attribute_names("#old", "old")
        .send()
        .await
        .expect("drop the fences");
    mover.set_layout(&gate, Layout::Gate).await.unwrap();
    assert!(matches!(
        other.acquire(&gate, &id("exec-2"), limit(2)).await.unwrap(),
        AcquireOutcome::Acquired { .. }
    ));
    assert!(holding(other.store(), "moved", &id("exec-2"))
        .await
        .is_some());
}

/// A gate's refused transaction is answered from the lock read just after the refusal. When the
/// lock moves in between (a release frees the room an acquire or a hand-off's grant lacked),
/// every check holds on that read and it names no reason: the write is sent again, and lands.
/// The proxy holds the read after the refusal while another client releases.
#[tokio::test]
async fn a_refusal_read_after_the_lock_moved_is_sent_again_and_lands() {
    let store = fresh_table().await;
    let sem = Semaphore::new(store.clone());
    let gate = LockName::new("moving").unwrap();
    sem.set_layout(&gate, Layout::Gate).await.unwrap();
    sem.acquire(&gate, &id("exec-1"), limit(1)).await.unwrap();

    let (proxy, acquiring) = acquire_holding_the_read_after(&store, &gate, id("exec-2"), 1).await;
    // The full gate refused it; before that refusal is read, the holder leaves.
    assert!(matches!(
        sem.release(&gate, &id("exec-1"), Claim::Operator)
            .await
            .unwrap(),
        ReleaseOutcome::Released { .. }
    ));
    proxy.release_held();
    let outcome = tokio::time::timeout(Duration::from_secs(30), acquiring)
        .await
        .expect("answered")
        .unwrap()
        .expect("an answer, not an error naming no failed check");
    assert!(
        matches!(outcome, AcquireOutcome::Acquired { .. }),
        "sent again once the room was there: {outcome:?}"
    );
    let status = sem.status(&gate).await.unwrap();
    assert_eq!(
        status.holders.keys().cloned().collect::<Vec<_>>(),
        [id("exec-2")]
    );
}

/// While a gate is full, an admission is checked on a read first and answered from it, for no
/// write units: the first refusal is a transaction (billed as if it wrote), the next ones two
/// reads and no write. The read includes the asker's own holding, so a retry of an acquire
/// that landed is still `already held` with its token, not `full`; and once a release makes
/// room, the read finds every check holding and the write is sent and lands.
#[tokio::test]
async fn admissions_to_a_full_gate_are_answered_from_a_read_and_write_nothing() {
    let store = fresh_table().await;
    let gate = LockName::new("busy-gate").unwrap();
    Semaphore::new(store.clone())
        .set_layout(&gate, Layout::Gate)
        .await
        .unwrap();
    let counter = local_aws::counter::RequestCounter::new();
    let sem = Semaphore::new(
        DynamoStore::new(counter.dynamodb_client(endpoint()), store.table())
            .with_queue_table(store.queue_table()),
    );
    let AcquireOutcome::Acquired { token, .. } =
        sem.acquire(&gate, &id("exec-1"), limit(1)).await.unwrap()
    else {
        panic!("the first admission")
    };
    counter.take();

    let full = |outcome: &AcquireOutcome| matches!(outcome, AcquireOutcome::Full { .. });
    let first = sem.acquire(&gate, &id("exec-2"), limit(1)).await.unwrap();
    assert!(full(&first), "{first:?}");
    let sent = counter.take();
    assert_eq!(sent.get("DynamoDB.TransactWriteItems"), 1, "{sent:?}");

    let again = sem.acquire(&gate, &id("exec-3"), limit(1)).await.unwrap();
    assert!(full(&again), "{again:?}");
    let sent = counter.take();
    assert_eq!(
        sent.requests,
        std::collections::BTreeMap::from([("DynamoDB.GetItem".to_owned(), 2)]),
        "the gate and the asker's holding read, nothing written: {sent:?}"
    );

    let retried = sem.acquire(&gate, &id("exec-1"), limit(1)).await.unwrap();
    assert_eq!(
        retried,
        AcquireOutcome::AlreadyHeld { token, count: 1 },
        "the holder's retry on its full gate"
    );
    assert_eq!(counter.take().service_total("DynamoDB"), 2);

    assert!(matches!(
        sem.release(&gate, &id("exec-1"), Claim::Operator)
            .await
            .unwrap(),
        ReleaseOutcome::Released { .. }
    ));
    counter.take();
    let taken = sem.acquire(&gate, &id("exec-2"), limit(1)).await.unwrap();
    assert!(
        matches!(taken, AcquireOutcome::Acquired { .. }),
        "{taken:?}"
    );
    let sent = counter.take();
    assert_eq!(
        (
            sent.get("DynamoDB.GetItem"),
            sent.get("DynamoDB.TransactWriteItems")
        ),
        (3, 1),
        "read first (the gate and the holding), then sent, then the gate read after: {sent:?}"
    );
    // Room seen: the next admission goes straight to its write again.
    let next = sem.acquire(&gate, &id("exec-3"), limit(2)).await.unwrap();
    assert!(matches!(next, AcquireOutcome::Acquired { .. }), "{next:?}");
    let sent = counter.take();
    assert_eq!(
        (
            sent.get("DynamoDB.GetItem"),
            sent.get("DynamoDB.TransactWriteItems")
        ),
        (1, 1),
        "{sent:?}"
    );
}

/// A gate's cleanup reads the ended execution's holdings alone (by the key prefix `holder#`),
/// not the lock's: its cost does not grow with the lock's holders. Shown with a holding of
/// another holder that cannot be read (its fields missing): a read of the whole lock fails on
/// it, the cleanup never meets it. A holder whose id extends the cleaned one's past a '#'
/// shares the prefix and keeps its slot.
#[tokio::test]
async fn a_gate_cleanup_reads_only_its_execution_s_holdings() {
    let store = fresh_table().await;
    let sem = Semaphore::new(store.clone());
    let gate = LockName::new("many").unwrap();
    sem.set_layout(&gate, Layout::Gate).await.unwrap();
    let ended = HolderId::new("exec-x").unwrap();
    let slots = [
        Identity::new(ended.clone(), AcquisitionId::new("r0").unwrap()),
        Identity::new(ended.clone(), AcquisitionId::new("r1").unwrap()),
        Identity::new(
            HolderId::new("exec-x#y").unwrap(),
            AcquisitionId::new("r0").unwrap(),
        ),
        id("exec-z"),
    ];
    for slot in &slots {
        sem.acquire(&gate, slot, limit(10)).await.unwrap();
    }
    store
        .client()
        .put_item()
        .table_name(store.holdings_table())
        .set_item(Some(holding_key(&gate, &id("exec-unreadable"))))
        .send()
        .await
        .expect("put an unreadable holding");
    assert!(
        sem.status(&gate).await.is_err(),
        "a read of every holding meets the unreadable one"
    );

    let cleaned = sem.cleanup(&gate, &ended).await.unwrap();
    let mut freed: Vec<Identity> = cleaned.freed.iter().map(|(i, _)| i.clone()).collect();
    freed.sort();
    assert_eq!(freed, slots[..2]);
    for slot in &slots[..2] {
        assert!(holding(sem.store(), "many", slot).await.is_none());
    }
    for slot in &slots[2..] {
        assert!(
            holding(sem.store(), "many", slot).await.is_some(),
            "{slot:?} keeps its slot"
        );
    }
}

/// An admission that landed is answered with its holding as it put it, not as read back: a
/// cleanup that frees it between the landing and the read (the execution ended at once) leaves
/// the acquire answered "acquired" with its token, as it was, where reading the holding back
/// found nothing and answered an error. The proxy holds the read after the landing.
#[tokio::test]
async fn an_admission_freed_before_it_was_read_back_is_answered_acquired() {
    let store = fresh_table().await;
    let sem = Semaphore::new(store.clone());
    let gate = LockName::new("quick").unwrap();
    sem.set_layout(&gate, Layout::Gate).await.unwrap();

    let (proxy, acquiring) = acquire_holding_the_read_after(&store, &gate, id("exec-1"), 2).await;
    let cleaned = sem
        .cleanup(&gate, &HolderId::new("exec-1").unwrap())
        .await
        .unwrap();
    assert_eq!(cleaned.freed.len(), 1, "the admission had landed");
    proxy.release_held();
    let outcome = tokio::time::timeout(Duration::from_secs(30), acquiring)
        .await
        .expect("answered")
        .unwrap()
        .expect("an answer, not 'landed but its holding is not there'");
    let AcquireOutcome::Acquired { token, .. } = outcome else {
        panic!("acquired: {outcome:?}")
    };
    assert_eq!(token, cleaned.freed[0].1.token, "the token it landed with");
    assert!(holding(sem.store(), "quick", &id("exec-1")).await.is_none());
}

/// A gate's transactions all update the one gate item, and DynamoDB cancels a transaction that
/// meets another in flight on an item (`TransactionConflict`), which the local server, one
/// request at a time, never does: the proxy answers it (a canned fault). The admission is sent
/// again, under a new client request token, and lands once.
#[tokio::test]
async fn a_gate_admission_cancelled_by_conflicts_is_sent_again_and_lands_once() {
    let store = fresh_table().await;
    let sem = Semaphore::new(store.clone());
    let gate = LockName::new("hot").unwrap();
    sem.set_layout(&gate, Layout::Gate).await.unwrap();
    let proxy = FaultyProxy::start(endpoint()).await;
    let faulty = through(proxy.endpoint(), &store, &gate).await;
    for _ in 0..2 {
        proxy.fault_next(
            "TransactWriteItems",
            Verdict::Answer(Canned::ConflictedTransaction),
        );
    }
    let AcquireOutcome::Acquired { token, count } = faulty
        .acquire(&gate, &id("exec-1"), limit(3))
        .await
        .unwrap()
    else {
        panic!("acquired")
    };
    assert_eq!(count, 1);
    let sent: Vec<_> = proxy
        .seen_of("TransactWriteItems")
        .into_iter()
        .map(|s| s.token)
        .collect();
    assert_eq!(sent.len(), 3, "two cancelled, then landed");
    assert_eq!(
        sent.iter().collect::<std::collections::BTreeSet<_>>().len(),
        3,
        "a new client request token each time: {sent:?}"
    );
    let status = sem.status(&gate).await.unwrap();
    assert_eq!((status.count(), status.used), (1, 1));
    assert_eq!(status.holders[&id("exec-1")].token, token);
}
