//! The built `release` binary run as Lambda runs it (through a stand-in Runtime API) with the
//! state machine's payload.

use std::path::Path;

use semaphore_core::{AcquisitionId, HolderId, Identity, Limit, LockName, Semaphore};
use semaphore_tests::fresh_table;
use semaphore_tests::runtime_api::{run_function, Answer};
use serde_json::{json, Value};

const EXE: &str = env!("CARGO_BIN_EXE_release");

fn payload() -> Value {
    serde_json::from_str(
        r#"{"lock": "demo-lock",
            "holder": "arn:aws:states:us-east-1:123456789012:execution:LockProtected:run-1",
            "acquisition": "3f1c2a9e-5b7d-4c4c-8d8d-0123456789ab"}"#,
    )
    .unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn the_binary_releases_once_and_names_bad_input() {
    let store = fresh_table().await;
    let table = store.table().to_owned();
    Semaphore::new(store)
        .acquire(
            &LockName::new("demo-lock").unwrap(),
            &Identity::new(
                HolderId::new(payload()["holder"].as_str().unwrap()).unwrap(),
                AcquisitionId::new(payload()["acquisition"].as_str().unwrap()).unwrap(),
            ),
            Limit::new(5).unwrap(),
        )
        .await
        .unwrap();
    let mut bad = payload();
    bad.as_object_mut().unwrap().remove("lock");
    let run = tokio::task::spawn_blocking(move || {
        run_function(
            Path::new(EXE),
            &[("TABLE_NAME", table.as_str())],
            vec![payload(), payload(), bad],
        )
    })
    .await
    .unwrap();
    assert_eq!(
        run.answers,
        [
            Answer::Response(json!({"released": true, "outcome": "released", "count": 0})),
            Answer::Response(json!({"released": false, "outcome": "not_held", "count": 0})),
            Answer::Error(json!({
                "errorType": "SemaphoreInvalidInput",
                "errorMessage": "lock is missing: pass the semaphore's name, e.g. \"lock\": \"demo-lock\""
            })),
        ],
        "stdout: {}\nstderr: {}",
        run.stdout,
        run.stderr
    );
}
