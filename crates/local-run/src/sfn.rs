//! The Step Functions calls the scenario and its probes share: start, describe, list, wait for
//! the end, read and save a history.

use std::path::Path;
use std::time::{Duration, Instant};

use aws_sdk_sfn::types::{ExecutionStatus, HistoryEvent};
use serde_json::{json, Value};

use crate::events::Ended;
use crate::report::short;

pub(crate) type Sfn = aws_sdk_sfn::Client;

pub(crate) fn sfn_error(e: impl std::error::Error + 'static) -> String {
    aws_sdk_sfn::error::DisplayErrorContext(e).to_string()
}

fn millis(t: Option<&aws_sdk_sfn::primitives::DateTime>) -> i64 {
    t.and_then(|t| t.to_millis().ok()).unwrap_or_default()
}

/// Text that is JSON, parsed; `Null` when it is missing or not JSON.
pub(crate) fn json_of(text: Option<&str>) -> Value {
    text.and_then(|t| serde_json::from_str(t).ok())
        .unwrap_or(Value::Null)
}

/// What DescribeExecution said about an ended execution.
#[derive(Debug, Clone)]
pub(crate) struct Outcome {
    pub status: String,
    pub error: Option<String>,
    pub cause: Option<String>,
    pub output: Option<String>,
}

impl Outcome {
    /// The execution's output as JSON (`Null` when it has none).
    pub fn output_json(&self) -> Value {
        json_of(self.output.as_deref())
    }
}

/// Starts an execution of `machine`; its ARN.
pub(crate) async fn start(
    sfn: &Sfn,
    machine: &str,
    name: &str,
    input: &Value,
) -> Result<String, String> {
    sfn.start_execution()
        .state_machine_arn(machine)
        .name(name)
        .input(input.to_string())
        .send()
        .await
        .map(|s| s.execution_arn().to_owned())
        .map_err(|e| format!("StartExecution {name}: {}", sfn_error(e)))
}

/// Saves an execution's history next to the logs (for executions that did not go as planned).
pub(crate) async fn save_history(sfn: &Sfn, arn: &str, dir: &Path) -> String {
    let file = dir.join(format!("history-{}.json", short(arn)));
    let text = match history(sfn, arn).await {
        Ok(events) => events
            .iter()
            .map(|e| event_line(e).to_string())
            .collect::<Vec<_>>()
            .join("\n"),
        Err(e) => format!("GetExecutionHistory failed: {e}"),
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

pub(crate) fn clip(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        return text.to_owned();
    }
    format!("{}...", text.chars().take(max).collect::<String>())
}

/// Every execution of a machine: (ARN, name, status).
pub(crate) async fn list_executions(
    sfn: &Sfn,
    machine: &str,
) -> Result<Vec<(String, String, ExecutionStatus)>, String> {
    sfn.list_executions()
        .state_machine_arn(machine)
        .max_results(1000)
        .into_paginator()
        .items()
        .send()
        .collect::<Result<Vec<_>, _>>()
        .await
        .map_err(sfn_error)
        .map(|executions| {
            executions
                .into_iter()
                .map(|e| (e.execution_arn, e.name, e.status))
                .collect()
        })
}

/// Whether any execution of `machine` is still running.
pub(crate) async fn any_running(sfn: &Sfn, machine: &str) -> Result<bool, String> {
    Ok(list_executions(sfn, machine)
        .await?
        .iter()
        .any(|(_, _, s)| *s == ExecutionStatus::Running))
}

pub(crate) async fn describe(sfn: &Sfn, arn: &str) -> Result<(Ended, Outcome), String> {
    let d = sfn
        .describe_execution()
        .execution_arn(arn)
        .send()
        .await
        .map_err(sfn_error)?;
    let ended = Ended {
        arn: d.execution_arn().to_owned(),
        machine_arn: d.state_machine_arn().to_owned(),
        name: d.name().unwrap_or_default().to_owned(),
        status: d.status().as_str().to_owned(),
        start_ms: millis(Some(d.start_date())),
        stop_ms: millis(d.stop_date()),
        input: d.input().map(str::to_owned),
        error: d.error().map(str::to_owned),
        cause: d.cause().map(str::to_owned),
    };
    let outcome = Outcome {
        status: ended.status.clone(),
        error: ended.error.clone(),
        cause: ended.cause.clone(),
        output: d.output().map(str::to_owned),
    };
    Ok((ended, outcome))
}

/// Waits until the execution is no longer RUNNING.
pub(crate) async fn wait_ended(sfn: &Sfn, arn: &str, timeout: Duration) -> Result<Outcome, String> {
    let deadline = Instant::now() + timeout;
    loop {
        let (_, outcome) = describe(sfn, arn).await?;
        if outcome.status != "RUNNING" {
            return Ok(outcome);
        }
        if Instant::now() >= deadline {
            return Err(format!("{arn} still RUNNING after {} s", timeout.as_secs()));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Every event of an execution's history, oldest first.
pub(crate) async fn history(sfn: &Sfn, arn: &str) -> Result<Vec<HistoryEvent>, String> {
    sfn.get_execution_history()
        .execution_arn(arn)
        .max_results(1000)
        .into_paginator()
        .items()
        .send()
        .collect::<Result<Vec<_>, _>>()
        .await
        .map_err(|e| format!("GetExecutionHistory {arn}: {}", sfn_error(e)))
}

/// The names of the states an execution entered, in order (one per state transition).
pub(crate) async fn states_entered(sfn: &Sfn, arn: &str) -> Result<Vec<String>, String> {
    Ok(history(sfn, arn)
        .await?
        .iter()
        .filter_map(|e| e.state_entered_event_details())
        .map(|d| d.name().to_owned())
        .collect())
}
