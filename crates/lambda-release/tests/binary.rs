//! The built `release` binary run as Lambda runs it (through a stand-in Runtime API) with the
//! lock-protected state machine's payloads: what goes over the wire, including the error a
//! failed execution is to fail with, and the `errorType` of bad input.

use std::path::Path;

use local_aws::fresh_table;
use local_aws::names::{id, limit, lock};
use local_aws::runtime_api::{run_function, Answer};
use semaphore_core::Semaphore;
use serde_json::{json, Value};

const EXE: &str = env!("CARGO_BIN_EXE_release");
const HOLDER: &str = "arn:aws:states:us-east-1:123456789012:execution:LockProtected:run-1";

/// What "Release slot" sends for run 0 of an execution that took a slot of demo-lock: the
/// acquire answer.
fn payload() -> Value {
    json!({"semaphore": {"acquired": true, "lock": "demo-lock", "holder": HOLDER,
                         "acquisition": "r0", "weight": 1, "token": 1}})
}

#[tokio::test(flavor = "multi_thread")]
async fn the_binary_releases_once_names_the_error_to_fail_with_and_names_bad_input() {
    let store = fresh_table().await;
    let table = store.table().to_owned();
    Semaphore::new(store)
        .acquire(&lock("demo-lock"), &id(HOLDER, "r0"), limit(5))
        .await
        .unwrap();
    let mut bad = payload();
    bad["semaphore"].as_object_mut().unwrap().remove("holder");
    // "Release after failure" after the work failed: the child's own error comes back.
    let mut failed = payload();
    failed["error"] = json!({
        "Error": "States.TaskFailed",
        "Cause": json!({"executionArn": "arn:child", "status": "FAILED",
                        "error": "WorkFailed", "cause": "asked to fail"}).to_string()
    });
    let run = tokio::task::spawn_blocking(move || {
        run_function(
            Path::new(EXE),
            &[
                ("TABLE_NAME", table.as_str()),
                ("DEFAULT_LOCK", "demo-lock"),
            ],
            vec![payload(), payload(), failed, bad],
        )
    })
    .await
    .unwrap();
    let answer = |released: bool, outcome: &str, error: Value, cause: Value| {
        Answer::Response(json!({
            "released": released, "outcome": outcome, "count": 0, "lock": "demo-lock",
            "acquisition": "r0", "handed_off": 0, "error": error, "cause": cause
        }))
    };
    assert_eq!(
        run.answers,
        [
            answer(true, "released", Value::Null, Value::Null),
            answer(false, "not_held", Value::Null, Value::Null),
            answer(
                false,
                "not_held",
                json!("WorkFailed"),
                json!("asked to fail")
            ),
            Answer::Error(json!({
                "errorType": "SemaphoreInvalidInput",
                "errorMessage": "semaphore.holder is missing: pass the acquire answer, \"semaphore.$\": \"$.semaphore\""
            })),
        ],
        "stdout: {}\nstderr: {}",
        run.stdout,
        run.stderr
    );
}

#[test]
fn a_bad_default_lock_stops_the_binary_with_a_message_naming_it() {
    let long = "x".repeat(300);
    let run = run_function(
        Path::new(EXE),
        &[("TABLE_NAME", "any-table"), ("DEFAULT_LOCK", long.as_str())],
        vec![payload()],
    );
    assert!(run.answers.is_empty(), "{:?}", run.answers);
    assert!(
        run.stdout.contains("environment variable DEFAULT_LOCK is"),
        "stdout: {}\nstderr: {}",
        run.stdout,
        run.stderr
    );
}
