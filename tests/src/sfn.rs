//! The local server's Step Functions with real executions: moto's execution mode runs the
//! definitions with its States Language interpreter and records their histories as AWS does
//! (`TaskScheduled` with the task's parameters, and so on).
//!
//! The mode is one setting of the whole server, and a state machine made before it is turned
//! on is not seen after: every test that uses Step Functions calls [`execution_mode`] before it
//! makes one (it is idempotent; test binaries run one after another).

use std::time::{Duration, Instant};

use aws_sdk_sfn::error::DisplayErrorContext;
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::OnceCell;

use crate::server::{endpoint, sdk_config};

/// The role every test state machine is made with (moto does not check it).
pub const ROLE: &str = "arn:aws:iam::123456789012:role/semaphore-test";

/// Turns on moto's execution mode, once per test binary, and answers a Step Functions client.
pub async fn execution_mode() -> aws_sdk_sfn::Client {
    static ON: OnceCell<()> = OnceCell::const_new();
    ON.get_or_init(|| async {
        let body = r#"{"stepfunctions": {"execute_state_machine": true}}"#;
        let (status, answer) = post(endpoint(), "/moto-api/config", body).await;
        assert!(
            (200..300).contains(&status),
            "POST /moto-api/config answered {status}: {answer}"
        );
    })
    .await;
    aws_sdk_sfn::Client::new(&sdk_config())
}

/// A plain HTTP/1.1 POST to the local server; (status, body).
async fn post(endpoint: &str, path: &str, body: &str) -> (u16, String) {
    let addr = endpoint.trim_start_matches("http://");
    let mut stream = tokio::net::TcpStream::connect(addr)
        .await
        .expect("connect to the local server");
    let request = format!(
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).await.expect("send");
    let mut response = Vec::new();
    stream.read_to_end(&mut response).await.expect("receive");
    let text = String::from_utf8_lossy(&response).into_owned();
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .expect("an HTTP status");
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    (status, body)
}

/// A name no other test uses: `prefix` and 12 hex digits.
pub fn unique(prefix: &str) -> String {
    format!("{prefix}-{:012x}", fastrand::u64(..) >> 16)
}

/// A machine of one Task that invokes `acquire_function` as the lock-protected machine's
/// acquire state does (execution input, id and the state's entry time) and ends. Its history
/// records the payload a cleanup reads the lock from; where no such function runs, the invoke
/// fails and the execution ends FAILED.
pub fn acquire_only(acquire_function: &str) -> Value {
    serde_json::json!({
        "StartAt": "Acquire slot",
        "States": {
            "Acquire slot": {
                "Type": "Task",
                "Resource": "arn:aws:states:::lambda:invoke",
                "Parameters": {
                    "FunctionName": acquire_function,
                    "Payload": {
                        "input.$": "$$.Execution.Input",
                        "holder.$": "$$.Execution.Id",
                        "requested_at.$": "$$.State.EnteredTime"
                    }
                },
                "End": true
            }
        }
    })
}

/// Makes a state machine; answers its ARN.
pub async fn create_machine(sfn: &aws_sdk_sfn::Client, name: &str, definition: &Value) -> String {
    sfn.create_state_machine()
        .name(name)
        .definition(definition.to_string())
        .role_arn(ROLE)
        .send()
        .await
        .unwrap_or_else(|e| panic!("create {name}: {}", DisplayErrorContext(e)))
        .state_machine_arn()
        .to_owned()
}

/// Starts an execution; answers its ARN.
pub async fn start(sfn: &aws_sdk_sfn::Client, machine: &str, name: &str, input: &Value) -> String {
    sfn.start_execution()
        .state_machine_arn(machine)
        .name(name)
        .input(input.to_string())
        .send()
        .await
        .unwrap_or_else(|e| panic!("start {name}: {}", DisplayErrorContext(e)))
        .execution_arn()
        .to_owned()
}

pub async fn stop(sfn: &aws_sdk_sfn::Client, execution: &str) {
    sfn.stop_execution()
        .execution_arn(execution)
        .send()
        .await
        .unwrap_or_else(|e| panic!("stop {execution}: {}", DisplayErrorContext(e)));
}

/// The execution's status, or `None` if it does not exist.
pub async fn status(sfn: &aws_sdk_sfn::Client, execution: &str) -> Option<String> {
    match sfn
        .describe_execution()
        .execution_arn(execution)
        .send()
        .await
    {
        Ok(described) => Some(described.status().as_str().to_owned()),
        Err(e)
            if e.as_service_error()
                .is_some_and(|e| e.is_execution_does_not_exist()) =>
        {
            None
        }
        Err(e) => panic!("describe {execution}: {}", DisplayErrorContext(e)),
    }
}

/// Polls until `done` holds for the execution's status (`None`: it does not exist), or panics
/// after `within`.
pub async fn wait_for(
    sfn: &aws_sdk_sfn::Client,
    execution: &str,
    within: Duration,
    done: impl Fn(Option<&str>) -> bool,
) -> Option<String> {
    let deadline = Instant::now() + within;
    loop {
        let now = status(sfn, execution).await;
        if done(now.as_deref()) {
            return now;
        }
        assert!(
            Instant::now() < deadline,
            "{execution} is still {now:?} after {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits until the execution has ended; answers how.
pub async fn ended(sfn: &aws_sdk_sfn::Client, execution: &str) -> String {
    wait_for(
        sfn,
        execution,
        Duration::from_secs(30),
        |s| matches!(s, Some(s) if s != "RUNNING"),
    )
    .await
    .expect("it exists")
}

/// Starts `parent` (a machine whose work is a `states:startExecution.sync:2` task of
/// `child_machine` named `child_name`) with `input`, and has it end while the child runs:
/// answers (parent, child) execution ARNs, the parent ended, the child RUNNING.
///
/// On AWS the parent starts the child and runs until it is stopped. Moto 5.2.5 instead fails
/// every `states:startExecution` task before it starts the child (it sends the parameters in
/// the wrong case), after recording the task as scheduled with the child's state machine and
/// name; the parent then fails, and the child is started here, as Step Functions would have
/// started it. Either way the history is the parent's own.
pub async fn end_parent_while_child_runs(
    sfn: &aws_sdk_sfn::Client,
    parent: &str,
    input: &Value,
    child_machine: &str,
    child_name: &str,
) -> (String, String) {
    let child = format!(
        "{}:{child_name}",
        child_machine.replace(":stateMachine:", ":execution:")
    );
    let execution = start(sfn, parent, &unique("run"), input).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let parent_status = status(sfn, &execution).await;
        if status(sfn, &child).await.is_some() {
            if parent_status.as_deref() == Some("RUNNING") {
                stop(sfn, &execution).await;
            }
            break;
        }
        if parent_status.as_deref() != Some("RUNNING") {
            start(sfn, child_machine, child_name, &serde_json::json!({})).await;
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{execution} never reached its work"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    ended(sfn, &execution).await;
    assert_eq!(status(sfn, &child).await.as_deref(), Some("RUNNING"));
    (execution, child)
}
