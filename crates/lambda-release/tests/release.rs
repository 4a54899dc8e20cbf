//! The release handler invoked with the payload the lock-protected state machine builds, against
//! a fresh table on the local server.

use std::collections::BTreeSet;

use lambda_common::Settings;
use lambda_runtime::{Context, Diagnostic, LambdaEvent};
use semaphore_core::{
    AcquireOutcome, DynamoStore, FenceKey, FenceReason, Limit, LockName, Semaphore, SemaphoreItem,
};
use semaphore_tests::legacy::put_version_1_item;
use semaphore_tests::names::id;
use semaphore_tests::observe::raw_item;
use semaphore_tests::{fresh_table, sdk_config};
use serde_json::{json, Value};

const HOLDER: &str = "arn:aws:states:us-east-1:123456789012:execution:LockProtected:run-1";
const ACQUISITION: &str = "3f1c2a9e-5b7d-4c4c-8d8d-0123456789ab";

/// What the lock-protected machine's "Release slot" state sends, as JSON text.
const STATE_MACHINE_PAYLOAD: &str = r#"{
    "lock": "demo-lock",
    "holder": "arn:aws:states:us-east-1:123456789012:execution:LockProtected:run-1",
    "acquisition": "3f1c2a9e-5b7d-4c4c-8d8d-0123456789ab"
}"#;

async fn semaphore() -> Semaphore<DynamoStore> {
    let table = fresh_table().await.table().to_owned();
    Settings::from_lookup(move |name| (name == "TABLE_NAME").then(|| table.clone()))
        .semaphore(&sdk_config())
        .expect("settings")
}

async fn release(sem: &Semaphore<DynamoStore>, payload: Value) -> Result<Value, Diagnostic> {
    lambda_release::handle(sem, LambdaEvent::new(payload, Context::default()))
        .await
        .map(|answer| serde_json::to_value(answer).expect("the answer serializes"))
        .map_err(Diagnostic::from)
}

fn payload() -> Value {
    serde_json::from_str(STATE_MACHINE_PAYLOAD).expect("the payload is JSON")
}

fn lock() -> LockName {
    LockName::new("demo-lock").unwrap()
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

#[tokio::test]
async fn the_state_machines_payload_releases_once_and_then_answers_not_held() {
    let sem = semaphore().await;
    let limit = Limit::new(5).unwrap();
    sem.acquire(&lock(), &id(HOLDER, ACQUISITION), limit)
        .await
        .unwrap();
    let other = "arn:aws:states:us-east-1:123456789012:execution:LockProtected:run-2";
    sem.acquire(&lock(), &id(other, "a2"), limit).await.unwrap();

    let first = release(&sem, payload()).await.unwrap();
    assert_eq!(
        first
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect::<BTreeSet<_>>(),
        BTreeSet::from(["released", "outcome", "count"])
    );
    assert_eq!(first["released"], json!(true));
    assert_eq!(first["outcome"], json!("released"));
    assert_eq!(first["count"], json!(1));

    // A retried release (the response was lost) frees nothing and answers with the same count.
    // Version 1 read first and then wrote nothing; version 2's release never reads, so it sends
    // its one write again, which is idempotent: it removes a holder that is already gone and
    // adds a fence that is already there. Only the version moves, by one.
    let before = sem.status(&lock()).await.unwrap();
    let again = release(&sem, payload()).await.unwrap();
    assert_eq!(
        again,
        json!({"released": false, "outcome": "not_held", "count": 1})
    );
    let item = sem.status(&lock()).await.unwrap();
    assert_eq!(item.version.0, before.version.0 + 1);
    assert_eq!(
        (&item.holders, &item.fences.len(), &item.limit),
        (&before.holders, &before.fences.len(), &before.limit)
    );
    assert!(item.holders.contains_key(&id(other, "a2")));
    assert!(item.is_fenced(&FenceKey::acquisition(&id(HOLDER, ACQUISITION))));

    // The acquisition is fenced: a late attempt of the same acquire cannot take a slot (F3).
    assert_eq!(
        sem.acquire(&lock(), &id(HOLDER, ACQUISITION), limit)
            .await
            .unwrap(),
        AcquireOutcome::Fenced(FenceReason::AcquisitionReleased)
    );
}

#[tokio::test]
async fn releasing_what_was_never_acquired_fences_it() {
    let sem = semaphore().await;
    let answer = release(&sem, payload()).await.unwrap();
    assert_eq!(
        answer,
        json!({"released": false, "outcome": "not_held", "count": 0})
    );
    // An acquire still in flight from before the release cannot land after it (F1, F3).
    assert_eq!(
        sem.acquire(&lock(), &id(HOLDER, ACQUISITION), Limit::new(5).unwrap())
            .await
            .unwrap(),
        AcquireOutcome::Fenced(FenceReason::AcquisitionReleased)
    );
}

#[tokio::test]
async fn bad_payloads_are_semaphore_invalid_input_and_write_nothing() {
    let sem = semaphore().await;
    sem.acquire(&lock(), &id(HOLDER, ACQUISITION), Limit::new(5).unwrap())
        .await
        .unwrap();
    let before = items(&sem).await;

    let without = |field: &str| {
        let mut p = payload();
        p.as_object_mut().unwrap().remove(field);
        p
    };
    let with = |field: &str, value: Value| {
        let mut p = payload();
        p[field] = value;
        p
    };
    let cases: Vec<(Value, &str)> = vec![
        (
            without("lock"),
            "lock is missing: pass the semaphore's name, e.g. \"lock\": \"demo-lock\"",
        ),
        (
            with("lock", json!("")),
            "lock name is empty: pass the name of the semaphore, e.g. \"demo-lock\"",
        ),
        (
            without("holder"),
            "holder is missing: pass the execution ARN, e.g. \"holder.$\": \"$$.Execution.Id\"",
        ),
        (
            with("holder", json!(["not", "a", "string"])),
            "holder must be a JSON string; got an array [\"not\",\"a\",\"string\"]",
        ),
        (
            without("acquisition"),
            "acquisition is missing: pass an id made once per logical acquire, e.g. \
             \"acquisition.$\": \"States.UUID()\"",
        ),
        (
            with("acquisition", json!("has space")),
            "acquisition id contains ' '; use only letters, digits and . _ : - (a UUID fits)",
        ),
        (
            json!(17),
            "the payload must be a JSON object {\"lock\": string, \"holder\": string, \
             \"acquisition\": string}; got a number 17",
        ),
    ];
    for (bad, message) in cases {
        let err = release(&sem, bad.clone())
            .await
            .expect_err(&format!("{bad} must be refused"));
        assert_eq!(err.error_type, "SemaphoreInvalidInput", "{bad}");
        assert_eq!(err.error_message, message, "{bad}");
    }
    assert_eq!(items(&sem).await, before, "nothing was written");
}

#[tokio::test]
async fn a_version_1_item_is_the_named_error_semaphore_old_format_and_nothing_is_written() {
    let sem = semaphore().await;
    let (client, table) = (sem.store().client(), sem.store().table());
    let v1 = put_version_1_item(client, table, "demo-lock", HOLDER, ACQUISITION).await;
    let err = release(&sem, payload()).await.unwrap_err();
    assert_eq!(err.error_type, "SemaphoreOldFormat");
    assert!(
        err.error_message
            .contains("\"demo-lock\" was written by version 1"),
        "{}",
        err.error_message
    );
    assert_eq!(
        raw_item(client, table, "demo-lock").await,
        Some(v1),
        "the version-1 item is left exactly as it was"
    );
}
