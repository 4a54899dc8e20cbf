//! The built `cleanup` binary run as Lambda runs it (through a stand-in Runtime API) on the
//! documented status-change event of a real execution on the local Step Functions, whose
//! history holds its acquire task.

use std::path::Path;

use local_aws::fresh_table;
use local_aws::runtime_api::{run_function, Answer};
use local_aws::sfn::{acquire_only, client as sfn_client, create_machine, ended, start, unique};
use semaphore_core::{AcquisitionId, HolderId, Identity, Limit, LockName, Semaphore};
use serde_json::{json, Value};

const EXE: &str = env!("CARGO_BIN_EXE_cleanup");
const ACQUIRE: &str = "arn:aws:lambda:us-east-1:123456789012:function:semaphore-acquire";

fn fixture() -> Value {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/execution-aborted.json"
    );
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn the_binary_cleans_up_on_the_documented_event() {
    let sfn = sfn_client();
    // One acquire task (there is no such Lambda here: the task fails after it was recorded,
    // payload and all), then the execution fails.
    let definition = acquire_only(ACQUIRE);
    let machine = create_machine(&sfn, &unique("Binary"), &definition).await;
    let execution = start(&sfn, &machine, "run-1", &json!({})).await;
    assert_eq!(ended(&sfn, &execution).await, "FAILED");

    let store = fresh_table().await;
    let table = store.table().to_owned();
    let sem = Semaphore::new(store);
    sem.acquire(
        &LockName::new("demo-lock").unwrap(),
        &Identity::new(
            HolderId::new(execution.as_str()).unwrap(),
            AcquisitionId::new("r0").unwrap(),
        ),
        Limit::new(5).unwrap(),
    )
    .await
    .unwrap();

    let mut event = fixture();
    event["resources"] = json!([execution]);
    event["detail"]["executionArn"] = json!(execution);
    event["detail"]["stateMachineArn"] = json!(machine);
    event["detail"]["status"] = json!("FAILED");
    let mut not_an_event = fixture();
    not_an_event["detail-type"] = json!("Scheduled Event");
    let events = vec![event.clone(), event, not_an_event];
    let run = tokio::task::spawn_blocking(move || {
        run_function(
            Path::new(EXE),
            &[
                ("TABLE_NAME", table.as_str()),
                ("ACQUIRE_FUNCTION_ARN", ACQUIRE),
                ("DEFAULT_LOCK", "demo-lock"),
            ],
            events,
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
    assert_eq!(first["execution"], json!(execution));
    assert_eq!(first["status"], json!("FAILED"));
    assert_eq!(first["cleaned"], json!(true));
    assert_eq!(first["deferred"], json!(false));
    assert_eq!(first["retry_after_seconds"], json!(0));
    assert_eq!(first["locks"][0]["lock"], json!("demo-lock"));
    assert_eq!(first["locks"][0]["freed"][0]["acquisition"], json!("r0"));
    assert_eq!(first["locks"][0]["freed"][0]["token"], json!(1));
    assert_eq!(first["locks"][0]["count"], json!(0));
    assert_eq!(second["locks"][0]["freed"], json!([]));
    assert_eq!(error["errorType"], json!("SemaphoreInvalidInput"));

    // Without ACQUIRE_FUNCTION_ARN the function does not start, and says why.
    let run = tokio::task::spawn_blocking(|| {
        run_function(Path::new(EXE), &[("TABLE_NAME", "t")], vec![fixture()])
    })
    .await
    .unwrap();
    assert!(
        run.stderr.contains("ACQUIRE_FUNCTION_ARN is not set")
            || run.stdout.contains("ACQUIRE_FUNCTION_ARN is not set"),
        "{:?}\nstdout: {}\nstderr: {}",
        run.answers,
        run.stdout,
        run.stderr
    );
}
