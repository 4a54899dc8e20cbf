//! The acquire handler invoked with the payload the lock-protected state machine builds, against
//! a fresh table on the local server: answers checked field by field, the named errors, and
//! nothing written for bad input, for a request past its horizon, or on a version-1 item.

use std::collections::BTreeSet;

use lambda_common::Settings;
use lambda_runtime::{Context, Diagnostic, LambdaEvent};
use semaphore_core::{
    rfc3339_millis, Clock, DynamoStore, HolderId, LockName, Semaphore, SystemClock,
};
use semaphore_tests::legacy::put_version_1_item;
use semaphore_tests::observe::{observe, raw_item};
use semaphore_tests::server::repo_root;
use semaphore_tests::{fresh_table, sdk_config};
use serde_json::{json, Value};

const HOLDER: &str = "arn:aws:states:us-east-1:123456789012:execution:LockProtected:run-1";
const ACQUISITION: &str = "3f1c2a9e-5b7d-4c4c-8d8d-0123456789ab";

/// The payload the lock-protected machine sends to acquire, as JSON text, but for
/// `requested_at` (the acquire state's entry time, `$$.State.EnteredTime`): see
/// [`state_machine_payload`].
const STATE_MACHINE_PAYLOAD: &str = r#"{
    "lock": "demo-lock",
    "limit": 5,
    "holder": "arn:aws:states:us-east-1:123456789012:execution:LockProtected:run-1",
    "acquisition": "3f1c2a9e-5b7d-4c4c-8d8d-0123456789ab"
}"#;

/// A semaphore on a fresh table, built the way the function's `main` builds it.
async fn semaphore() -> Semaphore<DynamoStore> {
    let table = fresh_table().await.table().to_owned();
    semaphore_on(table)
}

fn semaphore_on(table: String) -> Semaphore<DynamoStore> {
    Settings::from_lookup(move |name| (name == "TABLE_NAME").then(|| table.clone()))
        .semaphore(&sdk_config())
        .expect("settings")
}

/// Invokes the handler as the runtime does: a JSON payload and a context.
async fn acquire(sem: &Semaphore<DynamoStore>, payload: Value) -> Result<Value, Diagnostic> {
    lambda_acquire::handle(sem, LambdaEvent::new(payload, Context::default()))
        .await
        .map(|answer| serde_json::to_value(answer).expect("the answer serializes"))
        .map_err(Diagnostic::from)
}

async fn release(sem: &Semaphore<DynamoStore>, payload: Value) -> Result<Value, Diagnostic> {
    lambda_release::handle(sem, LambdaEvent::new(payload, Context::default()))
        .await
        .map(|answer| serde_json::to_value(answer).expect("the answer serializes"))
        .map_err(Diagnostic::from)
}

/// Now, as Step Functions writes `$$.State.EnteredTime` (`2026-12-03T10:15:30.123Z`).
fn entered_time_now() -> String {
    rfc3339_millis(SystemClock.now_ms())
}

/// The machine's payload for an acquire state entered at `entered_time`.
fn state_machine_payload_entered_at(entered_time: &str) -> Value {
    let mut payload: Value =
        serde_json::from_str(STATE_MACHINE_PAYLOAD).expect("the payload is JSON");
    payload["requested_at"] = json!(entered_time);
    payload
}

/// The machine's payload for an acquire state entered just now.
fn state_machine_payload() -> Value {
    state_machine_payload_entered_at(&entered_time_now())
}

fn with(mut payload: Value, field: &str, value: Value) -> Value {
    payload[field] = value;
    payload
}

fn keys(v: &Value) -> BTreeSet<&str> {
    v.as_object()
        .expect("an object")
        .keys()
        .map(String::as_str)
        .collect()
}

#[tokio::test]
async fn the_state_machines_payload_takes_a_slot_and_is_answered_field_by_field() {
    let sem = semaphore().await;
    let first = acquire(&sem, state_machine_payload()).await.unwrap();
    assert_eq!(
        keys(&first),
        BTreeSet::from(["acquired", "outcome", "token", "count", "limit"])
    );
    assert_eq!(first["acquired"], json!(true));
    assert_eq!(first["outcome"], json!("acquired"));
    assert_eq!(first["token"], json!(1));
    assert_eq!(first["count"], json!(1));
    assert_eq!(first["limit"], json!(5));

    // A Step Functions retry of the same acquire (same payload) gets the same slot (F5).
    let retry = acquire(&sem, state_machine_payload()).await.unwrap();
    assert_eq!(
        retry,
        json!({"acquired": true, "outcome": "already_held", "token": 1, "count": 1, "limit": 5})
    );

    for run in 2..=5 {
        let payload = with(
            state_machine_payload(),
            "holder",
            json!(format!(
                "arn:aws:states:us-east-1:123456789012:execution:LockProtected:run-{run}"
            )),
        );
        let answer = acquire(&sem, payload).await.unwrap();
        assert_eq!(
            answer,
            json!({"acquired": true, "outcome": "acquired", "token": run, "count": run, "limit": 5})
        );
    }

    let sixth = with(
        state_machine_payload(),
        "holder",
        json!("arn:aws:states:us-east-1:123456789012:execution:LockProtected:run-6"),
    );
    let full = acquire(&sem, sixth).await.unwrap();
    // "token" is present and null: the machine's ResultSelector reads $.Payload.token.
    assert_eq!(
        full,
        json!({"acquired": false, "outcome": "full", "token": null, "count": 5, "limit": 5})
    );

    let seen = observe(sem.store().client(), sem.store().table(), "demo-lock")
        .await
        .expect("the item exists");
    seen.assert_safe(5);
    assert_eq!(seen.holders.len(), 5);
    assert!(seen.holders.iter().any(|h| h.starts_with(HOLDER)));
}

#[tokio::test]
async fn an_acquire_after_cleanup_or_release_is_the_named_error_semaphore_fenced() {
    let sem = semaphore().await;
    acquire(&sem, state_machine_payload()).await.unwrap();
    // What the cleanup function does when the execution is aborted.
    let lock = LockName::new("demo-lock").unwrap();
    let freed = sem
        .cleanup(&lock, &HolderId::new(HOLDER).unwrap())
        .await
        .unwrap();
    assert_eq!(freed.freed.len(), 1);

    // A zombie or late retry of the same acquire.
    let fenced = acquire(&sem, state_machine_payload()).await.unwrap_err();
    assert_eq!(fenced.error_type, "SemaphoreFenced");
    assert_eq!(
        fenced.error_message,
        format!(
            "acquisition {ACQUISITION} of {HOLDER} on lock \"demo-lock\" is fenced: the execution \
             was cleaned up after it ended; it can never hold a slot, a new acquire needs a new \
             acquisition id"
        )
    );
    // Any acquisition of the ended execution is refused.
    let other = with(state_machine_payload(), "acquisition", json!("another-one"));
    assert_eq!(
        acquire(&sem, other).await.unwrap_err().error_type,
        "SemaphoreFenced"
    );
    assert_eq!(sem.status(&lock).await.unwrap().count(), 0);

    // A released acquisition is fenced too, with its own reason.
    let run2 = json!({
        "lock": "demo-lock",
        "limit": 5,
        "holder": "arn:aws:states:us-east-1:123456789012:execution:LockProtected:run-2",
        "acquisition": "0b5c4a36-9c55-4d4f-a9a7-6f5d1b8e2c10",
        "requested_at": entered_time_now()
    });
    acquire(&sem, run2.clone()).await.unwrap();
    let released = release(&sem, run2.clone()).await.unwrap();
    assert_eq!(released["released"], json!(true));
    let late = acquire(&sem, run2).await.unwrap_err();
    assert_eq!(late.error_type, "SemaphoreFenced");
    assert!(
        late.error_message
            .contains("is fenced: this acquisition was already released"),
        "{}",
        late.error_message
    );
}

#[tokio::test]
async fn bad_payloads_are_semaphore_invalid_input_and_write_nothing() {
    let sem = semaphore().await;
    // One good acquire, so that "nothing written" also means "the existing item is unchanged".
    acquire(&sem, state_machine_payload()).await.unwrap();
    let before = sem
        .status(&LockName::new("demo-lock").unwrap())
        .await
        .unwrap();

    let good = state_machine_payload;
    let without = |field: &str| {
        let mut p = good();
        p.as_object_mut().unwrap().remove(field);
        p
    };
    let expected_shape = r#"{"lock": string, "limit": integer, "holder": string, "acquisition": string, "requested_at": RFC 3339 string}"#;
    let requested_at_error = |got: &str| {
        format!(
            "requested_at must be an RFC 3339 date-time such as \"2026-12-03T10:15:30.123Z\" \
             (Step Functions' $$.State.EnteredTime); got {got}: "
        )
    };
    let limit_error = |got: &str| format!("limit must be a whole number from 1 to 1000; got {got}");
    let cases: Vec<(Value, String)> = vec![
        (
            without("lock"),
            "lock is missing: pass the semaphore's name, e.g. \"lock\": \"demo-lock\"".into(),
        ),
        (
            with(good(), "lock", json!("")),
            "lock name is empty: pass the name of the semaphore, e.g. \"demo-lock\"".into(),
        ),
        (
            with(good(), "lock", json!("x".repeat(257))),
            "lock name is 257 bytes long; the maximum is 256 bytes".into(),
        ),
        (
            with(good(), "lock", json!(42)),
            "lock must be a JSON string; got a number 42".into(),
        ),
        (
            without("limit"),
            "limit is missing: pass the number of slots as a JSON number, a whole number from 1 \
             to 1000, e.g. \"limit\": 5"
                .into(),
        ),
        (with(good(), "limit", json!(0)), limit_error("0")),
        (with(good(), "limit", json!(-1)), limit_error("-1")),
        (with(good(), "limit", json!(2.5)), limit_error("2.5")),
        (with(good(), "limit", json!(1001)), limit_error("1001")),
        (
            with(good(), "limit", json!("5")),
            limit_error("the string \"5\""),
        ),
        (
            with(good(), "limit", json!("five")),
            limit_error("the string \"five\""),
        ),
        (
            without("holder"),
            "holder is missing: pass the execution ARN, e.g. \"holder.$\": \"$$.Execution.Id\""
                .into(),
        ),
        (
            with(good(), "holder", json!("")),
            "holder is empty: pass the execution ARN ($$.Execution.Id) or an operator id such as \
             \"exec-1\""
                .into(),
        ),
        (
            without("acquisition"),
            "acquisition is missing: pass an id made once per logical acquire, e.g. \
             \"acquisition.$\": \"States.UUID()\""
                .into(),
        ),
        (
            with(good(), "acquisition", json!("a#b")),
            "acquisition id contains '#'; use only letters, digits and . _ : - (a UUID fits)"
                .into(),
        ),
        (
            without("requested_at"),
            "requested_at is missing: pass when the acquire was asked for, as RFC 3339 text: the \
             acquire state's entry time, \"requested_at.$\": \"$$.State.EnteredTime\""
                .into(),
        ),
        (
            with(good(), "requested_at", json!(1_796_292_930_123u64)),
            "requested_at must be a JSON string; got a number 1796292930123".into(),
        ),
        (
            with(good(), "requested_at", json!("yesterday")),
            requested_at_error("\"yesterday\""),
        ),
        (
            with(good(), "requested_at", json!("2026-12-03 10:15:30")),
            requested_at_error("\"2026-12-03 10:15:30\""),
        ),
        (
            json!("demo-lock"),
            format!(
                "the payload must be a JSON object {expected_shape}; got a string \"demo-lock\""
            ),
        ),
        (
            json!(null),
            format!("the payload must be a JSON object {expected_shape}; got null null"),
        ),
    ];
    for (payload, message) in cases {
        let err = acquire(&sem, payload.clone())
            .await
            .expect_err(&format!("{payload} must be refused"));
        assert_eq!(err.error_type, "SemaphoreInvalidInput", "{payload}");
        // A date-time the parser refuses is quoted back with the parser's own reason after it.
        if message.starts_with("requested_at must be an RFC 3339") {
            assert!(
                err.error_message.starts_with(&message),
                "{payload}: {}",
                err.error_message
            );
        } else {
            assert_eq!(err.error_message, message, "{payload}");
        }
    }

    // Nothing was written: the one item is exactly as it was, and no other item appeared.
    assert_eq!(items(&sem).await, vec![before]);
}

/// Every item of the table, each read correctly.
async fn items(sem: &Semaphore<DynamoStore>) -> Vec<semaphore_core::SemaphoreItem> {
    sem.list()
        .await
        .unwrap()
        .into_iter()
        .map(|item| item.expect("an item of this version"))
        .collect()
}

#[tokio::test]
async fn a_request_older_than_the_horizon_answers_expired_and_writes_nothing() {
    let sem = semaphore().await;
    acquire(&sem, state_machine_payload()).await.unwrap();
    let lock = LockName::new("demo-lock").unwrap();
    let before = sem.status(&lock).await.unwrap();

    // The acquire state was entered longer ago than the horizon (a Lambda that took that long to
    // run it): a rotation of the fences may have dropped one this acquire had to meet, so it
    // takes nothing.
    let horizon_ms = u64::try_from(sem.timing().horizon.as_millis()).unwrap();
    let entered = rfc3339_millis(SystemClock.now_ms() - horizon_ms - 1_000);
    let run2 = |entered: &str| {
        with(
            state_machine_payload_entered_at(entered),
            "holder",
            json!("arn:aws:states:us-east-1:123456789012:execution:LockProtected:run-2"),
        )
    };
    let expired = acquire(&sem, run2(&entered)).await.unwrap();
    assert_eq!(
        keys(&expired),
        BTreeSet::from(["acquired", "outcome", "token", "count", "limit"])
    );
    assert_eq!(expired["acquired"], json!(false));
    assert_eq!(expired["outcome"], json!("expired"));
    assert_eq!(expired["token"], json!(null));
    // Nothing was sent, so nothing is known of the holders.
    assert_eq!(expired["count"], json!(null));
    assert_eq!(expired["limit"], json!(5));
    assert_eq!(items(&sem).await, vec![before], "nothing was written");

    // The machine enters its acquire state again, which makes a new request time.
    let again = acquire(&sem, run2(&entered_time_now())).await.unwrap();
    assert_eq!(
        again,
        json!({"acquired": true, "outcome": "acquired", "token": 2, "count": 2, "limit": 5})
    );
}

#[tokio::test]
async fn a_version_1_item_is_the_named_error_semaphore_old_format_and_nothing_is_written() {
    let sem = semaphore().await;
    let (client, table) = (sem.store().client(), sem.store().table());
    let v1 = put_version_1_item(client, table, "demo-lock", HOLDER, "old-acquisition").await;

    let err = acquire(&sem, state_machine_payload()).await.unwrap_err();
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

#[tokio::test]
async fn a_missing_table_is_the_named_error_semaphore_store_error() {
    let sem = semaphore_on(format!("no-such-table-{:x}", fastrand::u64(..)));
    let err = acquire(&sem, state_machine_payload()).await.unwrap_err();
    assert_eq!(err.error_type, "SemaphoreStoreError");
    assert!(
        err.error_message.contains("does not exist"),
        "{}",
        err.error_message
    );
}

// ------------------------------------------------------------------------------------------
// The contract with statemachines/lock-protected.asl.json: the payloads are rendered from the
// definition itself (with the few expressions it uses evaluated here), sent to the handlers,
// and every field its ResultSelectors read is present in the answers.

/// What the context object (`$$`) holds for the state being rendered.
struct StateContext<'a> {
    /// `$$.State.EnteredTime`.
    entered_time: &'a str,
}

/// Evaluates the only expressions the definition's payload templates use. Anything else fails
/// loudly, so a change of the definition is noticed here.
fn evaluate(expression: &str, input: &Value, context: &StateContext) -> Value {
    if expression == "$$.Execution.Id" {
        return json!(HOLDER);
    }
    if expression == "$$.State.EnteredTime" {
        return json!(context.entered_time);
    }
    if expression == "States.UUID()" {
        return json!(ACQUISITION);
    }
    if let Some(text) = expression
        .strip_prefix("States.StringToJson('")
        .and_then(|rest| rest.strip_suffix("')"))
    {
        return serde_json::from_str(text).expect("StringToJson of JSON text");
    }
    if let Some(path) = expression.strip_prefix("$.") {
        let mut at = input;
        for key in path.split('.') {
            at = at
                .get(key)
                .unwrap_or_else(|| panic!("{expression} not found in {input}"));
        }
        return at.clone();
    }
    panic!("the test does not know how to evaluate {expression:?}; update evaluate()");
}

/// Renders an ASL payload template (keys ending in ".$" are expressions).
fn render(template: &Value, input: &Value, context: &StateContext) -> Value {
    match template {
        Value::Object(fields) => Value::Object(
            fields
                .iter()
                .map(|(key, value)| match key.strip_suffix(".$") {
                    Some(name) => (
                        name.to_owned(),
                        evaluate(value.as_str().expect("an expression"), input, context),
                    ),
                    None => (key.clone(), render(value, input, context)),
                })
                .collect(),
        ),
        other => other.clone(),
    }
}

fn lock_protected_definition() -> Value {
    let path = repo_root().join("statemachines/lock-protected.asl.json");
    let mut text = std::fs::read_to_string(&path).expect("read lock-protected.asl.json");
    for (name, value) in [
        ("LockName", "demo-lock"),
        ("ConcurrencyLimit", "5"),
        ("AcquireFunctionArn", "ACQUIRE"),
        ("ReleaseFunctionArn", "RELEASE"),
    ] {
        text = text.replace(&format!("${{{name}}}"), value);
    }
    serde_json::from_str(&text).expect("the definition is JSON")
}

/// The name and definition of the one Task that calls `function`.
fn task_calling<'a>(definition: &'a Value, function: &str) -> (&'a str, &'a Value) {
    let states = definition["States"].as_object().expect("States");
    let calling: Vec<(&str, &Value)> = states
        .iter()
        .filter(|(_, s)| s["Parameters"]["FunctionName"] == json!(function))
        .map(|(name, s)| (name.as_str(), s))
        .collect();
    assert_eq!(calling.len(), 1, "exactly one Task calls {function}");
    calling[0]
}

#[tokio::test]
async fn the_lock_protected_definitions_payloads_are_the_ones_tested_here() {
    let definition = lock_protected_definition();
    let states = definition["States"].as_object().unwrap();
    // The request is built once by a Pass state before the wait loop (so every attempt carries
    // the same acquisition id); the acquire Task sends it field by field, with its own entry
    // time as `requested_at`.
    let builders: Vec<&Value> = states
        .values()
        .filter(|s| s["Type"] == "Pass" && s["Parameters"].get("request").is_some())
        .collect();
    assert_eq!(builders.len(), 1, "one Pass state builds $.request");
    let entered = entered_time_now();
    let context = StateContext {
        entered_time: &entered,
    };
    let request = render(&builders[0]["Parameters"]["request"], &json!({}), &context);
    let input = json!({ "request": request });

    let (acquire_state, acquire_task) = task_calling(&definition, "ACQUIRE");
    let payload = render(&acquire_task["Parameters"]["Payload"], &input, &context);
    assert_eq!(
        payload,
        state_machine_payload_entered_at(&entered),
        "the payload tested above is the one the definition builds"
    );

    let sem = semaphore().await;
    let acquired = acquire(&sem, payload.clone()).await.unwrap();
    assert_eq!(acquired["outcome"], "acquired");
    for (field, selector) in acquire_task["ResultSelector"].as_object().unwrap() {
        let name = field.strip_suffix(".$").unwrap();
        let read = selector
            .as_str()
            .unwrap()
            .strip_prefix("$.Payload.")
            .unwrap();
        assert!(
            acquired.get(read).is_some(),
            "{name} reads $.Payload.{read}, absent from {acquired}"
        );
    }
    // Every answer that is not a slot is routed: "expired" enters the acquire state again (a new
    // entry time, so a new request time), anything else not acquired goes on waiting.
    let (_, routing) = states
        .iter()
        .find(|(_, s)| s["Type"] == "Choice" && s["Choices"][0]["Variable"] == "$.slot.acquired")
        .expect("a Choice on $.slot.acquired follows the acquire");
    assert_eq!(
        routing["Choices"][1],
        json!({"Variable": "$.slot.outcome", "StringEquals": "expired", "Next": acquire_state})
    );
    assert_ne!(routing["Default"], json!(acquire_state));

    let (_, release_task) = task_calling(&definition, "RELEASE");
    let release_payload = render(&release_task["Parameters"]["Payload"], &input, &context);
    assert_eq!(
        release_payload,
        json!({"lock": "demo-lock", "holder": HOLDER, "acquisition": ACQUISITION})
    );
    let released = release(&sem, release_payload).await.unwrap();
    assert_eq!(
        released,
        json!({"released": true, "outcome": "released", "count": 0})
    );
    for (_, selector) in release_task["ResultSelector"].as_object().unwrap() {
        let read = selector
            .as_str()
            .unwrap()
            .strip_prefix("$.Payload.")
            .unwrap();
        assert!(
            released.get(read).is_some(),
            "{read} absent from {released}"
        );
    }
}
