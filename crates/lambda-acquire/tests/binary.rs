//! The built `acquire` binary run as Lambda runs it (through a stand-in Runtime API), with the
//! state machine's payload: what goes over the wire, including the `errorType` a state machine
//! matches, and JSON logs on stdout.

use std::path::Path;

use local_aws::foreign::put_foreign_item;
use local_aws::fresh_table;
use local_aws::names::id;
use local_aws::runtime_api::{run_function, Answer};
use semaphore_core::flow::answer::child_execution_name;
use semaphore_core::{
    rfc3339_millis, Clock, DynamoStore, HolderId, LockName, Semaphore, SystemClock, Timing,
};
use serde_json::{json, Value};

const EXE: &str = env!("CARGO_BIN_EXE_acquire");
const HOLDER: &str = "arn:aws:states:us-east-1:123456789012:execution:LockProtected:run-1";
const DEMO: &str = "arn:aws:states:us-east-1:123456789012:stateMachine:demo-work";

/// The function's environment as the template sets it, on `table`.
fn env(table: &str) -> Vec<(String, String)> {
    [
        ("TABLE_NAME", table),
        ("RUST_LOG", "info"),
        ("DEFAULT_LOCK", "demo-lock"),
        ("DEFAULT_LIMIT", "5"),
        ("MAX_WAIT_SECONDS", "900"),
        ("DEFAULT_WORK", DEMO),
        ("WORK_STATE_MACHINES", DEMO),
        ("WORK_FUNCTIONS", ""),
        (
            "WORK_FUNCTION_RUNNER",
            "arn:aws:states:us-east-1:123456789012:stateMachine:work-function",
        ),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect()
}

/// The lock-protected machine's payload for an acquire state entered `ago_ms` milliseconds ago
/// (a task token Step Functions does not know: the function's own `SendTaskSuccess` fails and
/// is logged, and its answer still goes over the wire).
fn payload_entered(ago_ms: u64, input: Value) -> Value {
    let entered = rfc3339_millis(SystemClock.now_ms() - ago_ms);
    json!({
        "request": input,
        "starts_work": true,
        "execution": HOLDER,
        "redrive_count": 0,
        "state": {"EnteredTime": entered, "RetryCount": 0},
        "task_token": "token-of-the-test"
    })
}

fn payload() -> Value {
    payload_entered(0, json!({}))
}

fn error(error_type: &str, message: &str) -> Answer {
    Answer::Error(json!({"errorType": error_type, "errorMessage": message}))
}

/// Runs the binary with `env` on `events`, off the async runtime.
async fn run(
    env: Vec<(String, String)>,
    events: Vec<Value>,
) -> local_aws::runtime_api::FunctionRun {
    tokio::task::spawn_blocking(move || {
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        run_function(Path::new(EXE), &env, events)
    })
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn the_binary_answers_the_state_machine_over_the_runtime_api() {
    let store: DynamoStore = fresh_table().await;
    let table = store.table().to_owned();

    let bad = payload_entered(0, json!({"limit": "5"}));
    // Entered longer ago than the (default) horizon: answered "expired", nothing taken.
    let horizon_ms = u64::try_from(Timing::DEFAULT_HORIZON.as_millis()).unwrap();
    let mut expired = payload_entered(horizon_ms + 1_000, json!({}));
    expired["execution"] =
        json!("arn:aws:states:us-east-1:123456789012:execution:LockProtected:run-2");
    // A lock whose item has no format.
    put_foreign_item(store.client(), &table, "old-lock", HOLDER, "a0", None).await;
    let old = payload_entered(0, json!({"lock": "old-lock"}));
    let run1 = run(env(&table), vec![payload(), payload(), bad, expired, old]).await;
    let name = child_execution_name(&id(HOLDER, "r0"));
    let answer = |outcome: &str| {
        json!({
            "acquired": true, "outcome": outcome, "token": 1, "count": 1, "limit": 5,
            "weight": 1, "rate": null, "lock": "demo-lock", "holder": HOLDER,
            "acquisition": "r0", "child_name": name, "queued_at": null,
            "work": {"state_machine": DEMO, "name": name, "context": {"semaphore": {
                "lock": "demo-lock", "fencing_token": 1, "holder": HOLDER, "acquisition": "r0"
            }}}
        })
    };
    assert_eq!(
        run1.answers[..3],
        [
            Answer::Response(answer("acquired")),
            Answer::Response(answer("already_held")),
            error(
                "SemaphoreInvalidInput",
                "request.limit: limit must be a whole number from 1 to 10000; got the string \"5\""
            ),
        ],
        "stdout: {}\nstderr: {}",
        run1.stdout,
        run1.stderr
    );
    match &run1.answers[3..] {
        [Answer::Error(expired), Answer::Error(old)] => {
            assert_eq!(expired["errorType"], "SemaphoreExpired", "{expired}");
            assert_eq!(old["errorType"], "SemaphoreUnknownFormat", "{old}");
        }
        other => panic!(
            "{other:?}\nstdout: {}\nstderr: {}",
            run1.stdout, run1.stderr
        ),
    }
    // Logs are JSON lines.
    let lines: Vec<Value> = run1
        .stdout
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|_| panic!("not a JSON log line: {l}")))
        .collect();
    assert!(lines
        .iter()
        .any(|l| l["message"] == "acquire" && l["outcome"] == "acquired"));
    // Each a log event, or an EMF metric line: one per answer that reached the table's
    // semaphore (invalid input aside), and the failure (the item of another format) counted
    // in `Failures`, which the stack's alarm watches.
    let (metrics, logs): (Vec<&Value>, Vec<&Value>) =
        lines.iter().partition(|l| l.get("_aws").is_some());
    assert!(logs.iter().all(|l| l.get("level").is_some()));
    let outcomes: Vec<(&Value, &Value)> = metrics
        .iter()
        .map(|l| {
            lambda_common::metrics::check_emf(&l.to_string()).unwrap();
            (&l["Outcome"], &l["Failures"])
        })
        .collect();
    assert_eq!(
        outcomes,
        [
            (&json!("acquired"), &Value::Null),
            (&json!("already_held"), &Value::Null),
            (&json!("expired"), &Value::Null),
            (&Value::Null, &json!(1)),
        ],
        "{}",
        run1.stdout
    );
    assert_eq!(metrics[3]["Function"], json!("acquire"));

    // The execution is cleaned up. Its late retry is refused with SemaphoreFenced; the same
    // execution redriven (run 1, its own acquisition, not fenced) takes a slot.
    Semaphore::new(store)
        .cleanup(
            &LockName::new("demo-lock").unwrap(),
            &HolderId::new(HOLDER).unwrap(),
        )
        .await
        .unwrap();
    let mut redriven = payload();
    redriven["redrive_count"] = json!(1);
    let run2 = run(env(&table), vec![payload(), redriven]).await;
    match run2.answers.as_slice() {
        [Answer::Error(e), Answer::Response(redriven)] => {
            assert_eq!(e["errorType"], "SemaphoreFenced", "{e}");
            assert_eq!(
                (&redriven["outcome"], &redriven["acquisition"]),
                (&json!("acquired"), &json!("r1")),
                "{redriven}"
            );
        }
        other => panic!(
            "{other:?}\nstdout: {}\nstderr: {}",
            run2.stdout, run2.stderr
        ),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_bad_setting_stops_the_binary_with_a_message_naming_it() {
    for (name, value, says) in [
        (
            "DEFAULT_LIMIT",
            "0",
            "environment variable DEFAULT_LIMIT is",
        ),
        (
            "MAX_WAIT_SECONDS",
            "soon",
            "environment variable MAX_WAIT_SECONDS is",
        ),
        (
            "WORK_STATE_MACHINES",
            "my-work",
            "is not an ARN of the form",
        ),
        (
            "WORK_FUNCTIONS",
            "arn:aws:lambda:us-east-1:123456789012:function:f",
            "WORK_FUNCTION_RUNNER",
        ),
    ] {
        let mut env = env("any-table");
        env.retain(|(k, _)| {
            k != name && !(name == "WORK_FUNCTIONS" && k == "WORK_FUNCTION_RUNNER")
        });
        env.push((name.to_owned(), value.to_owned()));
        let run = run(env, vec![payload()]).await;
        assert!(run.answers.is_empty(), "{name}: {:?}", run.answers);
        assert!(
            run.stdout.contains(says),
            "{name}={value}: stdout: {}\nstderr: {}",
            run.stdout,
            run.stderr
        );
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
