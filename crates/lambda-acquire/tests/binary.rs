//! The built `acquire` binary run as Lambda runs it (through a stand-in Runtime API), with the
//! state machine's payload: what goes over the wire, including the `errorType` a state machine
//! matches, and JSON logs on stdout.

use std::path::Path;

use semaphore_core::{
    rfc3339_millis, Clock, DynamoStore, HolderId, LockName, Semaphore, SystemClock, Timing,
};
use semaphore_tests::fresh_table;
use semaphore_tests::legacy::put_version_1_item;
use semaphore_tests::runtime_api::{run_function, Answer};
use serde_json::{json, Value};

const EXE: &str = env!("CARGO_BIN_EXE_acquire");
const HOLDER: &str = "arn:aws:states:us-east-1:123456789012:execution:LockProtected:run-1";

/// The state machine's payload for an acquire state entered `ago_ms` milliseconds ago.
fn payload_entered(ago_ms: u64) -> Value {
    let mut payload: Value = serde_json::from_str(
        r#"{"lock": "demo-lock", "limit": 5,
            "holder": "arn:aws:states:us-east-1:123456789012:execution:LockProtected:run-1",
            "acquisition": "3f1c2a9e-5b7d-4c4c-8d8d-0123456789ab"}"#,
    )
    .unwrap();
    payload["requested_at"] = json!(rfc3339_millis(SystemClock.now_ms() - ago_ms));
    payload
}

fn payload() -> Value {
    payload_entered(0)
}

fn error(error_type: &str, message: &str) -> Answer {
    Answer::Error(json!({"errorType": error_type, "errorMessage": message}))
}

#[tokio::test(flavor = "multi_thread")]
async fn the_binary_answers_the_state_machine_over_the_runtime_api() {
    let store: DynamoStore = fresh_table().await;
    let table = store.table().to_owned();
    let env = [("TABLE_NAME", table.as_str()), ("RUST_LOG", "info")];

    let mut bad = payload();
    bad["limit"] = json!("5");
    // Entered longer ago than the (default) horizon: answered "expired", nothing taken.
    let horizon_ms = u64::try_from(Timing::DEFAULT_HORIZON.as_millis()).unwrap();
    let mut expired = payload_entered(horizon_ms + 1_000);
    expired["holder"] =
        json!("arn:aws:states:us-east-1:123456789012:execution:LockProtected:run-2");
    // A lock whose item version 1 wrote.
    put_version_1_item(store.client(), &table, "old-lock", HOLDER, "a0").await;
    let mut old = payload();
    old["lock"] = json!("old-lock");
    let events = vec![payload(), payload(), bad, expired, old];
    let run = tokio::task::spawn_blocking({
        let env: Vec<(String, String)> = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move || {
            let env: Vec<(&str, &str)> =
                env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
            run_function(Path::new(EXE), &env, events)
        }
    })
    .await
    .unwrap();
    assert_eq!(
        run.answers[..3],
        [
            Answer::Response(
                json!({"acquired": true, "outcome": "acquired", "token": 1, "count": 1, "limit": 5})
            ),
            Answer::Response(
                json!({"acquired": true, "outcome": "already_held", "token": 1, "count": 1, "limit": 5})
            ),
            error(
                "SemaphoreInvalidInput",
                "limit must be a whole number from 1 to 1000; got the string \"5\""
            ),
        ],
        "stdout: {}\nstderr: {}",
        run.stdout,
        run.stderr
    );
    match &run.answers[3..] {
        [Answer::Response(expired), Answer::Error(old)] => {
            assert_eq!(
                (&expired["acquired"], &expired["outcome"], &expired["token"]),
                (&json!(false), &json!("expired"), &json!(null)),
                "{expired}"
            );
            assert_eq!(old["errorType"], "SemaphoreOldFormat", "{old}");
        }
        other => panic!("{other:?}\nstdout: {}\nstderr: {}", run.stdout, run.stderr),
    }
    // Logs are JSON lines.
    let lines: Vec<Value> = run
        .stdout
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|_| panic!("not a JSON log line: {l}")))
        .collect();
    assert!(lines
        .iter()
        .any(|l| l["message"] == "acquire" && l["outcome"] == "acquired"));
    assert!(lines.iter().all(|l| l.get("level").is_some()));

    // The execution is cleaned up; its late retry is refused with SemaphoreFenced.
    Semaphore::new(store)
        .cleanup(
            &LockName::new("demo-lock").unwrap(),
            &HolderId::new(HOLDER).unwrap(),
        )
        .await
        .unwrap();
    let run = tokio::task::spawn_blocking(move || {
        run_function(
            Path::new(EXE),
            &[("TABLE_NAME", table.as_str())],
            vec![payload()],
        )
    })
    .await
    .unwrap();
    match run.answers.as_slice() {
        [Answer::Error(e)] => assert_eq!(e["errorType"], "SemaphoreFenced", "{e}"),
        other => panic!("{other:?}\nstdout: {}\nstderr: {}", run.stdout, run.stderr),
    }
}

#[test]
fn without_table_name_the_binary_stops_with_a_clear_error() {
    let run = run_function(Path::new(EXE), &[], vec![payload()]);
    assert!(run.answers.is_empty(), "{:?}", run.answers);
    assert!(
        run.stdout
            .contains("environment variable TABLE_NAME is not set"),
        "stdout: {}\nstderr: {}",
        run.stdout,
        run.stderr
    );
}
