//! The history and payload quotas (F9): a long wait in line with a big input, through fallback
//! checks, then its work and release; and the same input with a work that fails.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::bail;
use serde_json::json;

use crate::report::{short, HistoryProbeReport};
use crate::work::work_state;
use local_aws::sfn::{
    history, save_history, start_execution, states_entered, wait_ended, Client as Sfn,
};
use local_aws::stack::Machine;

/// The history probe's execution input: about 200 KiB, the size of input the issue asks to
/// see acquire, work and release (every task but the first acquire passes the acquire answer,
/// not the input).
pub const BIG_INPUT_BYTES: usize = 200 * 1024;

/// Issue 18, items 10 and 14: on a lock of its own (limit 1), a holder works for two fallback
/// periods and a bit; an execution with an input of [`BIG_INPUT_BYTES`] waits in line behind it
/// (at least two fallback checks), then acquires, runs its work and releases. Its history shows
/// the events one fallback check adds and the parameters each of its tasks was scheduled with
/// (the local server fails a task past Step Functions' 256 KiB). Then one with the same input
/// whose work fails must fail with the work's own error after its release.
pub async fn long_wait_with_a_big_input(
    sfn: &Sfn,
    protected: &Machine,
    fallback_seconds: u64,
    dir: &std::path::Path,
) -> anyhow::Result<HistoryProbeReport> {
    let lock = "probe-history-lock";
    let work_seconds = 2 * fallback_seconds + 6;
    let holder = start_execution(
        sfn,
        &protected.arn,
        "probe-history-holder",
        &json!({"lock": lock, "limit": 1, "work_seconds": work_seconds}),
    )
    .await?;
    // The waiter starts once the holder works, so that it waits for the whole work.
    let work_state = work_state(protected)?;
    let deadline = Instant::now() + Duration::from_secs(60);
    while !states_entered(sfn, &holder).await?.contains(&work_state) {
        if Instant::now() > deadline {
            bail!(
                "the history probe's holder {} did not reach its work in 60 s [history: {}]",
                short(&holder),
                save_history(sfn, &holder, dir).await
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let mut input = json!({"lock": lock, "limit": 1, "work_seconds": 0, "padding": ""});
    let padding = BIG_INPUT_BYTES.saturating_sub(input.to_string().len());
    input["padding"] = json!("x".repeat(padding));
    let input_bytes = input.to_string().len();
    let waiter = start_execution(sfn, &protected.arn, "probe-history-waiter", &input).await?;
    let within = Duration::from_secs(work_seconds + 120);
    let ended = wait_ended(sfn, &waiter, within).await?;
    let holder_ended = wait_ended(sfn, &holder, within).await?;
    if ended.status != "SUCCEEDED" || holder_ended.status != "SUCCEEDED" {
        save_history(sfn, &waiter, dir).await;
        save_history(sfn, &holder, dir).await;
    }
    // The same input, a work that fails: the release after the failure must still fit (the
    // failed child's cause carries the child's input).
    let mut failing_input = input.clone();
    failing_input["fail"] = json!(true);
    let failing =
        start_execution(sfn, &protected.arn, "probe-history-failing", &failing_input).await?;
    let failing_ended = wait_ended(sfn, &failing, within).await?;
    if failing_ended.error.as_deref() != Some("WorkFailed") {
        save_history(sfn, &failing, dir).await;
    }
    let events = history(sfn, &waiter).await?;
    let trace = crate::line::trace(&waiter, 0, &events, None);
    // The largest parameters any task was scheduled with, and the state it was in.
    let mut per_state: BTreeMap<String, usize> = BTreeMap::new();
    let mut state = String::new();
    for e in &events {
        if let Some(entered) = e.state_entered_event_details() {
            state = entered.name().to_owned();
        }
        if let Some(scheduled) = e.task_scheduled_event_details() {
            let bytes = per_state.entry(state.clone()).or_default();
            *bytes = (*bytes).max(scheduled.parameters().len());
        }
    }
    // The first fallback check's events, as the line's trace found them.
    let check_types = trace
        .fallback_checks
        .first()
        .map_or_else(Vec::new, |check| {
            events[check.clone()]
                .iter()
                .map(|e| e.r#type().as_str().to_owned())
                .collect()
        });
    let (largest_state, largest) = per_state
        .iter()
        .max_by_key(|(_, bytes)| **bytes)
        .map(|(state, bytes)| (state.clone(), *bytes))
        .unwrap_or_default();
    Ok(HistoryProbeReport {
        input_bytes,
        status: ended.status,
        error: ended.error,
        cause: ended.cause.map(|c| c.chars().take(300).collect()),
        events: trace.events,
        events_outside_checks: trace.events_outside_checks(),
        events_per_fallback_check: trace.fallback_checks.iter().map(|c| c.len()).collect(),
        fallback_check_event_types: check_types,
        holder_events: history(sfn, &holder).await?.len(),
        largest_task_parameters_bytes: largest,
        largest_task_parameters_state: largest_state,
        task_parameters_bytes: per_state,
        failing_status: failing_ended.status,
        failing_error: failing_ended.error,
    })
}
