//! The cleanup handler driven by the documented EventBridge "Step Functions Execution Status
//! Change" event (tests/fixtures/execution-aborted.json) against a fresh table on the local
//! server, including duplicate, late and out-of-order deliveries (F4).

use std::collections::BTreeMap;

use lambda_common::Settings;
use lambda_runtime::{Context, Diagnostic, LambdaEvent};
use semaphore_core::{
    AcquireOutcome, DynamoStore, FenceReason, Limit, LockName, Semaphore, SemaphoreItem,
};
use semaphore_tests::counter::RequestCounter;
use semaphore_tests::legacy::put_version_1_item;
use semaphore_tests::names::{id, lock};
use semaphore_tests::observe::{observe, raw_item};
use semaphore_tests::{endpoint, fresh_table, sdk_config};
use serde_json::{json, Value};

/// The execution of the fixture event.
const EXECUTION: &str = "arn:aws:states:us-east-1:123456789012:execution:LockProtected:run-1";
const OTHER: &str = "arn:aws:states:us-east-1:123456789012:execution:LockProtected:run-2";

fn fixture() -> Value {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/execution-aborted.json"
    );
    serde_json::from_str(&std::fs::read_to_string(path).expect("read the fixture"))
        .expect("the fixture is JSON")
}

fn with_detail(field: &str, value: Value) -> Value {
    let mut event = fixture();
    event["detail"][field] = value;
    event
}

/// The semaphore and the configured locks, built from settings as the function's `main` does.
async fn setup(lock_names: &str) -> (Semaphore<DynamoStore>, Vec<LockName>) {
    let table = fresh_table().await.table().to_owned();
    let lock_names = lock_names.to_owned();
    let settings = Settings::from_lookup(move |name| match name {
        "TABLE_NAME" => Some(table.clone()),
        "LOCK_NAMES" => Some(lock_names.clone()),
        _ => None,
    });
    (
        settings.semaphore(&sdk_config()).expect("settings"),
        settings.lock_names().expect("lock names"),
    )
}

async fn invoke(
    sem: &Semaphore<DynamoStore>,
    locks: &[LockName],
    event: Value,
) -> Result<Value, Diagnostic> {
    lambda_cleanup::handle(sem, locks, LambdaEvent::new(event, Context::default()))
        .await
        .map(|summary| serde_json::to_value(summary).expect("the summary serializes"))
        .map_err(Diagnostic::from)
}

async fn take(sem: &Semaphore<DynamoStore>, lock_name: &str, holder: &str, acquisition: &str) {
    let outcome = sem
        .acquire(
            &lock(lock_name),
            &id(holder, acquisition),
            Limit::new(5).unwrap(),
        )
        .await
        .unwrap();
    assert!(
        matches!(outcome, AcquireOutcome::Acquired { .. }),
        "{outcome:?}"
    );
}

/// The freed slots of the summary's lock entries, without the (time-dependent) durations.
fn freed(summary: &Value) -> Vec<(String, String, u64)> {
    summary["locks"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|entry| {
            entry["freed"].as_array().unwrap().iter().map(|slot| {
                assert!(slot["held_for_ms"].is_u64());
                (
                    entry["lock"].as_str().unwrap().to_owned(),
                    slot["acquisition"].as_str().unwrap().to_owned(),
                    slot["token"].as_u64().unwrap(),
                )
            })
        })
        .collect()
}

/// Slots held on the lock, read raw (the holder map: no count is stored).
async fn count_on(sem: &Semaphore<DynamoStore>, lock_name: &str) -> usize {
    let seen = observe(sem.store().client(), sem.store().table(), lock_name)
        .await
        .expect("the item exists");
    seen.assert_safe(5);
    seen.holders.len()
}

/// Every item of the table, each read correctly.
async fn items(sem: &Semaphore<DynamoStore>) -> Vec<SemaphoreItem> {
    sem.list()
        .await
        .unwrap()
        .into_iter()
        .map(|item| item.expect("an item of this version"))
        .collect()
}

#[test]
fn the_documented_event_is_read_into_the_typed_event() {
    let event = lambda_cleanup::parse_event(fixture()).expect("the documented event parses");
    assert_eq!(event.source, "aws.states");
    assert_eq!(event.detail_type, "Step Functions Execution Status Change");
    assert_eq!(
        event.resources.as_deref(),
        Some(&[EXECUTION.to_owned()][..])
    );
    let detail = &event.detail;
    assert_eq!(detail.execution_arn, EXECUTION);
    assert_eq!(
        detail.state_machine_arn,
        "arn:aws:states:us-east-1:123456789012:stateMachine:LockProtected"
    );
    assert_eq!(detail.name, "run-1");
    assert_eq!(detail.status, "ABORTED");
    assert_eq!(detail.start_date, Some(1551225014968));
    assert_eq!(detail.stop_date, Some(1551225017576));
    assert_eq!(
        detail.input.as_deref(),
        Some(r#"{"work_seconds": 30, "fail": false}"#)
    );
    assert_eq!(
        detail.input_details.as_ref().map(|d| d.included),
        Some(true)
    );
    assert_eq!(detail.output, None);
    assert_eq!(detail.output_details, None);
    assert_eq!(detail.redrive_count, Some(0));
}

#[tokio::test]
async fn the_documented_aborted_event_frees_and_fences_the_execution() {
    let (sem, locks) = setup("demo-lock").await;
    take(&sem, "demo-lock", EXECUTION, "a1").await;
    take(&sem, "demo-lock", EXECUTION, "a2").await;
    take(&sem, "demo-lock", OTHER, "b1").await;

    let summary = invoke(&sem, &locks, fixture()).await.unwrap();
    assert_eq!(summary["execution"], json!(EXECUTION));
    assert_eq!(summary["status"], json!("ABORTED"));
    assert_eq!(summary["cleaned"], json!(true));
    assert_eq!(summary["locks"].as_array().unwrap().len(), 1);
    assert_eq!(summary["locks"][0]["lock"], json!("demo-lock"));
    assert_eq!(summary["locks"][0]["source"], json!("configuration"));
    assert_eq!(summary["locks"][0]["count"], json!(1));
    assert_eq!(
        freed(&summary),
        [
            ("demo-lock".to_owned(), "a1".to_owned(), 1),
            ("demo-lock".to_owned(), "a2".to_owned(), 2)
        ]
    );
    assert!(summary.get("note").is_none());
    assert!(summary.get("input_lock_error").is_none());

    assert_eq!(count_on(&sem, "demo-lock").await, 1);
    // A zombie acquire of the aborted execution, with any acquisition id, is refused.
    assert_eq!(
        sem.acquire(
            &lock("demo-lock"),
            &id(EXECUTION, "a3"),
            Limit::new(5).unwrap()
        )
        .await
        .unwrap(),
        AcquireOutcome::Fenced(FenceReason::ExecutionEnded)
    );
}

/// Cleanup never reads and never conflicts: per lock, one write fences the execution, and the
/// item it hands back says which slots the execution held then (all it can ever hold, since the
/// fence refuses every later acquire of it), which a second write frees. A duplicate event finds
/// nothing held: the fence alone, one write.
#[tokio::test]
async fn the_event_is_two_writes_per_lock_without_a_read_and_its_duplicate_is_one() {
    let (sem, locks) = setup("demo-lock").await;
    take(&sem, "demo-lock", EXECUTION, "a1").await;
    take(&sem, "demo-lock", EXECUTION, "a2").await;
    take(&sem, "demo-lock", OTHER, "b1").await;
    let counter = RequestCounter::new();
    let counted = Semaphore::new(DynamoStore::new(
        counter.dynamodb_client(endpoint()),
        sem.store().table(),
    ))
    .with_timing(sem.timing());
    const UPDATE: &str = "DynamoDB.UpdateItem";

    let summary = invoke(&counted, &locks, fixture()).await.unwrap();
    assert_eq!(
        freed(&summary),
        [
            ("demo-lock".to_owned(), "a1".to_owned(), 1),
            ("demo-lock".to_owned(), "a2".to_owned(), 2)
        ]
    );
    let sent = counter.take();
    // The fence and the free (one young fence is not worth a rotation).
    assert_eq!(sent.requests, BTreeMap::from([(UPDATE.to_owned(), 2)]));
    assert_eq!(sent.total_failed(), 0);

    let duplicate = invoke(&counted, &locks, fixture()).await.unwrap();
    assert_eq!(duplicate["locks"][0]["freed"], json!([]));
    let sent = counter.take();
    assert_eq!(sent.requests, BTreeMap::from([(UPDATE.to_owned(), 1)]));
    assert_eq!(sent.total_failed(), 0);
    assert_eq!(count_on(&sem, "demo-lock").await, 1);
}

#[tokio::test]
async fn a_version_1_item_is_the_named_error_semaphore_old_format_and_other_locks_are_cleaned() {
    let (sem, locks) = setup("old-lock,demo-lock").await;
    let (client, table) = (sem.store().client(), sem.store().table());
    let v1 = put_version_1_item(client, table, "old-lock", EXECUTION, "a0").await;
    take(&sem, "demo-lock", EXECUTION, "a1").await;

    let err = invoke(&sem, &locks, fixture()).await.unwrap_err();
    assert_eq!(err.error_type, "SemaphoreOldFormat");
    assert!(
        err.error_message.starts_with(&format!(
            "cleanup of {EXECUTION} failed on 1 lock(s); retrying is safe: lock \"old-lock\": \
             the item for lock \"old-lock\" was written by version 1"
        )),
        "{}",
        err.error_message
    );
    assert_eq!(
        raw_item(client, table, "old-lock").await,
        Some(v1),
        "the version-1 item is left exactly as it was"
    );
    // The failure on one lock does not keep the others from being cleaned.
    assert_eq!(count_on(&sem, "demo-lock").await, 0);
}

#[tokio::test]
async fn failed_and_timed_out_executions_are_cleaned_too() {
    for status in ["FAILED", "TIMED_OUT"] {
        let (sem, locks) = setup("demo-lock").await;
        take(&sem, "demo-lock", EXECUTION, "a1").await;
        let summary = invoke(&sem, &locks, with_detail("status", json!(status)))
            .await
            .unwrap();
        assert_eq!(summary["status"], json!(status));
        assert_eq!(summary["cleaned"], json!(true));
        assert_eq!(
            freed(&summary),
            [("demo-lock".to_owned(), "a1".to_owned(), 1)]
        );
        assert_eq!(count_on(&sem, "demo-lock").await, 0);
    }
}

#[tokio::test]
async fn the_same_event_twice_is_harmless() {
    let (sem, locks) = setup("demo-lock").await;
    take(&sem, "demo-lock", EXECUTION, "a1").await;
    take(&sem, "demo-lock", OTHER, "b1").await;

    let first = invoke(&sem, &locks, fixture()).await.unwrap();
    assert_eq!(freed(&first).len(), 1);
    let second = invoke(&sem, &locks, fixture()).await.unwrap();
    assert_eq!(second["cleaned"], json!(true));
    assert_eq!(second["locks"][0]["freed"], json!([]));
    assert_eq!(second["locks"][0]["count"], json!(1));

    let item = sem.status(&lock("demo-lock")).await.unwrap();
    assert_eq!(
        item.holders.keys().cloned().collect::<Vec<_>>(),
        [id(OTHER, "b1")],
        "the other execution keeps its slot"
    );
    assert_eq!(count_on(&sem, "demo-lock").await, 1);
}

#[tokio::test]
async fn an_event_after_the_execution_released_frees_nothing_and_keeps_late_acquires_out() {
    let (sem, locks) = setup("demo-lock").await;
    take(&sem, "demo-lock", EXECUTION, "a1").await;
    sem.release(&lock("demo-lock"), &id(EXECUTION, "a1"))
        .await
        .unwrap();

    let late = invoke(&sem, &locks, fixture()).await.unwrap();
    assert_eq!(late["cleaned"], json!(true));
    assert_eq!(late["locks"][0]["freed"], json!([]));
    assert_eq!(late["locks"][0]["count"], json!(0));
    // A late retry of the released acquire still cannot take a slot (F3).
    assert!(matches!(
        sem.acquire(
            &lock("demo-lock"),
            &id(EXECUTION, "a1"),
            Limit::new(5).unwrap()
        )
        .await
        .unwrap(),
        AcquireOutcome::Fenced(_)
    ));
    assert_eq!(count_on(&sem, "demo-lock").await, 0);
}

#[tokio::test]
async fn an_event_before_the_acquire_lands_fences_the_acquire() {
    let (sem, locks) = setup("demo-lock").await;
    // Out of order: the status event is handled before the execution's acquire reaches the
    // table (F1, F4).
    let early = invoke(&sem, &locks, fixture()).await.unwrap();
    assert_eq!(early["cleaned"], json!(true));
    assert_eq!(early["locks"][0]["freed"], json!([]));
    assert_eq!(
        sem.acquire(
            &lock("demo-lock"),
            &id(EXECUTION, "a1"),
            Limit::new(5).unwrap()
        )
        .await
        .unwrap(),
        AcquireOutcome::Fenced(FenceReason::ExecutionEnded)
    );
    assert_eq!(count_on(&sem, "demo-lock").await, 0);
}

#[tokio::test]
async fn the_lock_named_in_the_execution_input_is_cleaned_too() {
    let (sem, locks) = setup("demo-lock").await;
    take(&sem, "demo-lock", EXECUTION, "a1").await;
    take(&sem, "orders", EXECUTION, "o1").await;

    let event = with_detail("input", json!(r#"{"lock": "orders", "work_seconds": 5}"#));
    let summary = invoke(&sem, &locks, event).await.unwrap();
    assert_eq!(summary["locks"][0]["source"], json!("configuration"));
    assert_eq!(summary["locks"][1]["lock"], json!("orders"));
    assert_eq!(summary["locks"][1]["source"], json!("execution_input"));
    assert_eq!(
        freed(&summary),
        [
            ("demo-lock".to_owned(), "a1".to_owned(), 1),
            ("orders".to_owned(), "o1".to_owned(), 1)
        ]
    );

    // An invalid lock in the input is reported; the configured locks are still cleaned.
    let (sem, locks) = setup("demo-lock").await;
    take(&sem, "demo-lock", EXECUTION, "a1").await;
    let bad = with_detail("input", json!(r#"{"lock": ""}"#));
    let summary = invoke(&sem, &locks, bad).await.unwrap();
    assert_eq!(summary["cleaned"], json!(true));
    assert_eq!(
        summary["input_lock_error"],
        json!("the execution input's \"lock\" is not used: lock name is empty: pass the name of the semaphore, e.g. \"demo-lock\"")
    );
    assert_eq!(
        freed(&summary),
        [("demo-lock".to_owned(), "a1".to_owned(), 1)]
    );
}

#[tokio::test]
async fn without_any_lock_name_the_answer_says_so() {
    let (sem, locks) = setup("").await;
    assert!(locks.is_empty());
    let summary = invoke(&sem, &locks, fixture()).await.unwrap();
    assert_eq!(summary["locks"], json!([]));
    assert_eq!(
        summary["note"],
        json!("no lock to clean: LOCK_NAMES is empty and the execution input names none")
    );
}

#[tokio::test]
async fn other_statuses_are_a_no_op_that_writes_nothing() {
    let (sem, locks) = setup("demo-lock").await;
    take(&sem, "demo-lock", EXECUTION, "a1").await;
    let before = items(&sem).await;
    for status in ["RUNNING", "SUCCEEDED", "PENDING_REDRIVE"] {
        let summary = invoke(&sem, &locks, with_detail("status", json!(status)))
            .await
            .unwrap();
        assert_eq!(
            summary,
            json!({
                "execution": EXECUTION,
                "status": status,
                "cleaned": false,
                "locks": [],
                "note": format!("status {status} needs no cleanup (only FAILED, TIMED_OUT, ABORTED do): nothing done"),
            })
        );
    }
    assert_eq!(items(&sem).await, before);
}

#[tokio::test]
async fn what_is_not_a_status_change_event_is_invalid_input_and_writes_nothing() {
    let (sem, locks) = setup("demo-lock").await;
    let mut no_arn = fixture();
    no_arn["detail"]
        .as_object_mut()
        .unwrap()
        .remove("executionArn");
    let mut other_source = fixture();
    other_source["source"] = json!("my.app");
    for event in [
        no_arn,
        other_source,
        json!({"lock": "demo-lock"}),
        json!("ABORTED"),
        with_detail("executionArn", json!("")),
    ] {
        let err = invoke(&sem, &locks, event.clone()).await.unwrap_err();
        assert_eq!(err.error_type, "SemaphoreInvalidInput", "{event}");
    }
    assert!(items(&sem).await.is_empty(), "nothing was written");
}

#[tokio::test]
async fn a_store_failure_is_a_named_error_the_machine_retries() {
    let settings = Settings::from_lookup(|name| {
        (name == "TABLE_NAME").then(|| "no-such-semaphore-table".to_owned())
    });
    let sem = settings.semaphore(&sdk_config()).unwrap();
    let err = invoke(&sem, &[lock("demo-lock"), lock("orders")], fixture())
        .await
        .unwrap_err();
    assert_eq!(err.error_type, "SemaphoreStoreError");
    assert!(
        err.error_message.starts_with(&format!(
            "cleanup of {EXECUTION} failed on 2 lock(s); retrying is safe: lock \"demo-lock\": "
        )),
        "{}",
        err.error_message
    );
}
