//! The built `cleanup` binary run as Lambda runs it (through a stand-in Runtime API) on the
//! documented status-change event.

use std::path::Path;

use semaphore_core::{AcquisitionId, HolderId, Identity, Limit, LockName, Semaphore};
use semaphore_tests::fresh_table;
use semaphore_tests::runtime_api::{run_function, Answer};
use serde_json::{json, Value};

const EXE: &str = env!("CARGO_BIN_EXE_cleanup");

fn fixture() -> Value {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/execution-aborted.json"
    );
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn the_binary_cleans_up_on_the_documented_event() {
    let store = fresh_table().await;
    let table = store.table().to_owned();
    let sem = Semaphore::new(store);
    let holder = fixture()["detail"]["executionArn"]
        .as_str()
        .unwrap()
        .to_owned();
    sem.acquire(
        &LockName::new("demo-lock").unwrap(),
        &Identity::new(
            HolderId::new(holder.as_str()).unwrap(),
            AcquisitionId::new("a1").unwrap(),
        ),
        Limit::new(5).unwrap(),
    )
    .await
    .unwrap();

    let mut not_an_event = fixture();
    not_an_event["detail-type"] = json!("Scheduled Event");
    let run = tokio::task::spawn_blocking(move || {
        run_function(
            Path::new(EXE),
            &[("TABLE_NAME", table.as_str()), ("LOCK_NAMES", "demo-lock")],
            vec![fixture(), fixture(), not_an_event],
        )
    })
    .await
    .unwrap();
    let [Answer::Response(first), Answer::Response(second), Answer::Error(error)] =
        run.answers.as_slice()
    else {
        panic!(
            "{:?}\nstdout: {}\nstderr: {}",
            run.answers, run.stdout, run.stderr
        );
    };
    assert_eq!(first["execution"], json!(holder));
    assert_eq!(first["status"], json!("ABORTED"));
    assert_eq!(first["cleaned"], json!(true));
    assert_eq!(first["locks"][0]["lock"], json!("demo-lock"));
    assert_eq!(first["locks"][0]["freed"][0]["acquisition"], json!("a1"));
    assert_eq!(first["locks"][0]["freed"][0]["token"], json!(1));
    assert_eq!(first["locks"][0]["count"], json!(0));
    assert_eq!(second["locks"][0]["freed"], json!([]));
    assert_eq!(error["errorType"], json!("SemaphoreInvalidInput"));
}
