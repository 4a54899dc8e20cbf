//! The local server's Step Functions with real executions: moto's execution mode (on from the
//! server's start, `local/moto_server.py`) runs the definitions with its States Language
//! interpreter and records their histories as AWS does (`TaskScheduled` with the task's
//! parameters, and so on).

use std::path::Path;
use std::time::{Duration, Instant};

use aws_sdk_sfn::error::DisplayErrorContext;
use aws_sdk_sfn::types::{ExecutionStatus, HistoryEvent};
use serde_json::{json, Value};

use crate::eventbridge::Ended;
use crate::server::sdk_config;
use crate::Error;

/// The Step Functions client, for tests that do not depend on the SDK themselves.
pub type Client = aws_sdk_sfn::Client;

/// The role every test state machine is made with (moto does not check it).
pub const ROLE: &str = "arn:aws:iam::123456789012:role/semaphore-test";

/// A Step Functions client for the local server (which runs the executions it starts).
pub fn client() -> aws_sdk_sfn::Client {
    aws_sdk_sfn::Client::new(&sdk_config())
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
                "Resource": "arn:aws:states:::lambda:invoke.waitForTaskToken",
                "Parameters": {
                    "FunctionName": acquire_function,
                    "Payload": {
                        "request.$": "$$.Execution.Input",
                        "execution.$": "$$.Execution.Id",
                        "redrive_count.$": "$$.Execution.RedriveCount",
                        "state.$": "$$.State",
                        "task_token.$": "$$.Task.Token"
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
    start_execution(sfn, machine, name, input)
        .await
        .unwrap_or_else(|e| panic!("{}", DisplayErrorContext(e)))
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
    wait_ended(sfn, execution, Duration::from_secs(30))
        .await
        .unwrap_or_else(|e| panic!("{}", DisplayErrorContext(e)))
        .status
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
    let child = execution_arn(child_machine, child_name);
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

/// The ARN an execution named `name` of `machine` gets.
pub fn execution_arn(machine: &str, name: &str) -> String {
    format!(
        "{}:{name}",
        machine.replace(":stateMachine:", ":execution:")
    )
}

/// The execution's status and output (`None` while it has none).
pub async fn described(sfn: &aws_sdk_sfn::Client, execution: &str) -> (String, Option<Value>) {
    let outcome = describe(sfn, execution)
        .await
        .unwrap_or_else(|e| panic!("{}", DisplayErrorContext(e)));
    let output = outcome
        .output
        .map(|text| serde_json::from_str(&text).expect("an execution's output is JSON"));
    (outcome.status, output)
}

/// The output of every task of the execution that succeeded (`TaskSucceeded`), oldest first:
/// for a `.waitForTaskToken` task, what `SendTaskSuccess` sent.
pub async fn task_outputs(sfn: &aws_sdk_sfn::Client, execution: &str) -> Vec<Value> {
    let events = history(sfn, execution)
        .await
        .unwrap_or_else(|e| panic!("{}", DisplayErrorContext(e)));
    events
        .iter()
        .filter_map(|e| e.task_succeeded_event_details()?.output())
        .map(|output| serde_json::from_str(output).expect("a task's output is JSON"))
        .collect()
}

/// A machine that plays `definition`'s acquire state (`acquire_state`, a
/// `lambda:invoke.waitForTaskToken` task of the acquire function) with real task tokens that the
/// local server can park on and complete: what the acquire function would be invoked with
/// reaches the test as an SQS message, and the execution waits until `SendTaskSuccess` (or
/// `SendTaskFailure`, or the state's timeout) ends the task, as on AWS.
///
/// Why a stand-in: no Lambda runs on the local server (moto would need Docker), so the acquire
/// state itself fails at once there. It is played anyway, first, so that the history records
/// the scheduled acquire task with its payload as AWS records it (what the cleanup function
/// reads an execution's lock from); its failure is caught. The execution then parks on
/// `sqs:sendMessage.waitForTaskToken`, which moto runs locally, with the acquire state's own
/// payload as the message (rendered for this task: its `$$.Task.Token`, its entry time), the
/// state's `ResultSelector`, `ResultPath` and `Retry` (a retry is a new attempt, with a new token and payload),
/// and a timeout of `timeouts[0]` seconds the first time and `timeouts[1]` later (short ones
/// make a test's check come soon): a timeout enters the acquire state again, as the
/// definition's `Catch` of `States.Timeout` does. The task's output ends the execution
/// (SUCCEEDED, its output the state with the task's result).
pub fn parking_machine(definition: &Value, acquire_state: &str, timeouts: [u64; 2]) -> Value {
    let acquire = &definition["States"][acquire_state];
    assert_eq!(
        acquire["Resource"], "arn:aws:states:::lambda:invoke.waitForTaskToken",
        "{acquire_state} is an acquire state: {acquire}"
    );
    let payload = acquire["Parameters"]["Payload"].clone();
    let timeout = |seconds: u64| {
        serde_json::json!({
            "Type": "Pass",
            "Result": seconds,
            "ResultPath": "$.parked.timeout",
            "Next": acquire_state
        })
    };
    let mut parked = serde_json::json!({
        "Type": "Task",
        "Resource": "arn:aws:states:::sqs:sendMessage.waitForTaskToken",
        "Parameters": {
            "QueueUrl.$": "$$.Execution.Input.parked.queue",
            "MessageBody": payload
        },
        "TimeoutSecondsPath": "$.parked.timeout",
        "ResultPath": acquire["ResultPath"],
        "Retry": acquire["Retry"],
        "Catch": [{"ErrorEquals": ["States.Timeout"], "ResultPath": null, "Next": "Later timeout"}],
        "Next": "Granted"
    });
    if let Some(selector) = acquire.get("ResultSelector") {
        parked["ResultSelector"] = selector.clone();
    }
    serde_json::json!({
        "Comment": format!("{acquire_state} of the definition, parked on an SQS task (harness/local-aws/src/sfn.rs)"),
        "StartAt": "First timeout",
        "States": {
            "First timeout": timeout(timeouts[0]),
            acquire_state: {
                "Type": "Task",
                "Resource": acquire["Resource"],
                "Parameters": acquire["Parameters"],
                "ResultPath": "$.no_lambda_here",
                "Catch": [{"ErrorEquals": ["States.ALL"], "ResultPath": "$.no_lambda_here", "Next": "Parked"}],
                "Next": "Parked"
            },
            "Parked": parked,
            "Later timeout": timeout(timeouts[1]),
            "Granted": {"Type": "Succeed"}
        }
    })
}

/// An execution of a [`parking_machine`]: its wait tasks' payloads arrive on its own queue.
pub struct Parked {
    pub execution: String,
    queue_url: String,
    sqs: aws_sdk_sqs::Client,
}

/// Starts an execution named `name` of `machine` (a [`parking_machine`]) with the execution
/// input `input` (an object).
pub async fn park(sfn: &aws_sdk_sfn::Client, machine: &str, name: &str, input: &Value) -> Parked {
    let sqs = aws_sdk_sqs::Client::new(&crate::server::sdk_config());
    let queue_url = sqs
        .create_queue()
        .queue_name(unique("parked"))
        .send()
        .await
        .unwrap_or_else(|e| panic!("create a queue: {}", DisplayErrorContext(e)))
        .queue_url()
        .expect("a queue URL")
        .to_owned();
    let mut input = input.clone();
    input["parked"] = serde_json::json!({"queue": queue_url});
    let execution = start(sfn, machine, name, &input).await;
    assert_eq!(execution, execution_arn(machine, name));
    Parked {
        execution,
        queue_url,
        sqs,
    }
}

impl Parked {
    /// The payload of the next acquire task the execution parked on (its `task_token` is the
    /// task's): what the acquire function would be invoked with. Panics after 30 s.
    pub async fn next_acquire(&self) -> Value {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            // No long polling: the local server serializes its requests, and a long poll would
            // hold every other one back.
            let received = self
                .sqs
                .receive_message()
                .queue_url(&self.queue_url)
                .max_number_of_messages(1)
                .send()
                .await
                .unwrap_or_else(|e| panic!("receive: {}", DisplayErrorContext(e)));
            if let Some(message) = received.messages().first() {
                self.sqs
                    .delete_message()
                    .queue_url(&self.queue_url)
                    .receipt_handle(message.receipt_handle().expect("a receipt handle"))
                    .send()
                    .await
                    .unwrap_or_else(|e| panic!("delete: {}", DisplayErrorContext(e)));
                let body = message.body().expect("a message body");
                return serde_json::from_str(body).expect("the acquire payload is JSON");
            }
            assert!(
                Instant::now() < deadline,
                "{} parked on no new task within 30 s",
                self.execution
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

// The calls the local run makes, which answer its errors rather than panic.

/// The last part of an ARN: an execution's or a state machine's name.
pub fn short(arn: &str) -> &str {
    arn.rsplit(':').next().unwrap_or(arn)
}

fn millis(t: Option<&aws_sdk_sfn::primitives::DateTime>) -> i64 {
    t.and_then(|t| t.to_millis().ok()).unwrap_or_default()
}

/// Text that is JSON, parsed; `Null` when it is missing or not JSON.
pub fn json_of(text: Option<&str>) -> Value {
    text.and_then(|t| serde_json::from_str(t).ok())
        .unwrap_or(Value::Null)
}

/// Starts an execution of `machine` with `input` (JSON, or its text); its ARN.
pub async fn start_execution(
    sfn: &Client,
    machine: &str,
    name: &str,
    input: impl std::fmt::Display,
) -> Result<String, Error> {
    sfn.start_execution()
        .state_machine_arn(machine)
        .name(name)
        .input(input.to_string())
        .send()
        .await
        .map(|s| s.execution_arn().to_owned())
        .map_err(Error::aws(format!("StartExecution {name}")))
}

/// Saves an execution's history next to the logs (for executions that did not go as planned).
pub async fn save_history(sfn: &Client, arn: &str, dir: &Path) -> String {
    let file = dir.join(format!("history-{}.json", short(arn)));
    let text = match history(sfn, arn).await {
        Ok(events) => events
            .iter()
            .map(|e| event_line(e).to_string())
            .collect::<Vec<_>>()
            .join("\n"),
        Err(e) => format!("{}", DisplayErrorContext(e)),
    };
    let _ = std::fs::write(&file, text);
    file.display().to_string()
}

/// One history event as a JSON line, with what tells why an execution went wrong: the SDK's
/// `Debug` redacts exactly those fields (inputs, outputs, parameters, errors, causes).
fn event_line(e: &HistoryEvent) -> Value {
    let mut line = json!({
        "id": e.id(),
        "type": e.r#type().as_str(),
        "timestamp": e.timestamp().to_millis().unwrap_or_default(),
    });
    if let Some(d) = e.state_entered_event_details() {
        line["state"] = json!(d.name());
        line["input"] = json!(d.input());
    }
    if let Some(d) = e.state_exited_event_details() {
        line["state"] = json!(d.name());
        line["output"] = json!(d.output());
    }
    if let Some(d) = e.task_scheduled_event_details() {
        line["resource"] = json!(format!("{}:{}", d.resource_type(), d.resource()));
        line["parameters"] = json!(d.parameters());
    }
    if let Some(d) = e.task_submitted_event_details() {
        line["output"] = json!(d.output());
    }
    if let Some(d) = e.task_succeeded_event_details() {
        line["output"] = json!(d.output());
    }
    let errors = [
        e.task_failed_event_details()
            .map(|d| (d.error(), d.cause())),
        e.task_start_failed_event_details()
            .map(|d| (d.error(), d.cause())),
        e.task_submit_failed_event_details()
            .map(|d| (d.error(), d.cause())),
        e.task_timed_out_event_details()
            .map(|d| (d.error(), d.cause())),
        e.lambda_function_failed_event_details()
            .map(|d| (d.error(), d.cause())),
        e.execution_failed_event_details()
            .map(|d| (d.error(), d.cause())),
        e.execution_aborted_event_details()
            .map(|d| (d.error(), d.cause())),
    ];
    if let Some((error, cause)) = errors.into_iter().flatten().next() {
        line["error"] = json!(error);
        line["cause"] = json!(cause);
    }
    line
}

pub fn clip(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        return text.to_owned();
    }
    format!("{}...", text.chars().take(max).collect::<String>())
}

/// Every execution of a machine: (ARN, name, status).
pub async fn list_executions(
    sfn: &Client,
    machine: &str,
) -> Result<Vec<(String, String, ExecutionStatus)>, Error> {
    sfn.list_executions()
        .state_machine_arn(machine)
        .max_results(1000)
        .into_paginator()
        .items()
        .send()
        .collect::<Result<Vec<_>, _>>()
        .await
        .map_err(Error::aws(format!("ListExecutions {machine}")))
        .map(|executions| {
            executions
                .into_iter()
                .map(|e| (e.execution_arn, e.name, e.status))
                .collect()
        })
}

/// Whether any execution of `machine` is still running.
pub async fn any_running(sfn: &Client, machine: &str) -> Result<bool, Error> {
    Ok(list_executions(sfn, machine)
        .await?
        .iter()
        .any(|(_, _, s)| *s == ExecutionStatus::Running))
}

pub async fn describe(sfn: &Client, arn: &str) -> Result<Ended, Error> {
    let d = sfn
        .describe_execution()
        .execution_arn(arn)
        .send()
        .await
        .map_err(Error::aws(format!("DescribeExecution {arn}")))?;
    Ok(Ended {
        arn: d.execution_arn().to_owned(),
        machine_arn: d.state_machine_arn().to_owned(),
        name: d.name().unwrap_or_default().to_owned(),
        status: d.status().as_str().to_owned(),
        start_ms: millis(Some(d.start_date())),
        stop_ms: millis(d.stop_date()),
        input: d.input().map(str::to_owned),
        output: d.output().map(str::to_owned),
        error: d.error().map(str::to_owned),
        cause: d.cause().map(str::to_owned),
    })
}

/// Waits until the execution is no longer RUNNING.
pub async fn wait_ended(sfn: &Client, arn: &str, timeout: Duration) -> Result<Ended, Error> {
    let deadline = Instant::now() + timeout;
    loop {
        let ended = describe(sfn, arn).await?;
        if ended.status != "RUNNING" {
            return Ok(ended);
        }
        if Instant::now() >= deadline {
            return Err(Error::Timeout {
                what: format!("{arn} to end (still RUNNING)"),
                after: timeout,
            });
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Every event of an execution's history, oldest first.
pub async fn history(sfn: &Client, arn: &str) -> Result<Vec<HistoryEvent>, Error> {
    sfn.get_execution_history()
        .execution_arn(arn)
        .max_results(1000)
        .into_paginator()
        .items()
        .send()
        .collect::<Result<Vec<_>, _>>()
        .await
        .map_err(Error::aws(format!("GetExecutionHistory {arn}")))
}

/// The names of the states an execution entered, in order (one per state transition).
pub async fn states_entered(sfn: &Client, arn: &str) -> Result<Vec<String>, Error> {
    Ok(history(sfn, arn)
        .await?
        .iter()
        .filter_map(|e| e.state_entered_event_details())
        .map(|d| d.name().to_owned())
        .collect())
}
