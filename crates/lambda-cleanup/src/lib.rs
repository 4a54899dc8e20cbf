//! The cleanup function (cleanup-from-incomplete): given the EventBridge "Step Functions
//! Execution Status Change" event of an execution that ended FAILED, TIMED_OUT or ABORTED, it
//! frees every slot the execution holds on every lock it may hold, and fences the execution so
//! that a delayed, retried or zombie acquire of it can never land afterwards.
//!
//! The locks are `LOCK_NAMES` (configuration) plus the `"lock"` field of the execution's input,
//! when the event carries the input and it has one. Every status other than the three is
//! answered with a no-op. Duplicate, late and out-of-order events are harmless: the core cleanup
//! is idempotent, frees only what the execution holds, and its fence refuses acquires that land
//! after it.
//!
//! Per lock, the core cleanup is one write that fences the execution and, when that write shows
//! the execution held slots, a second that frees them; neither reads first nor conflicts.
//!
//! Errors: `SemaphoreInvalidInput` (not such an event; nothing written), `SemaphoreOldFormat` (a
//! lock's item is of version 1; nothing written to it), `SemaphoreStoreError` (retry: every lock
//! is cleaned again, which is harmless).

use aws_lambda_events::eventbridge::EventBridgeEvent;
use lambda_common::HandlerError;
use lambda_runtime::LambdaEvent;
use semaphore_core::{HolderId, ItemStore, LockName, Semaphore};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The event's `source` and `detail-type`.
pub const SOURCE: &str = "aws.states";
pub const DETAIL_TYPE: &str = "Step Functions Execution Status Change";
/// The statuses of an execution that ended without releasing what it held.
pub const ENDED_STATUSES: [&str; 3] = ["FAILED", "TIMED_OUT", "ABORTED"];

/// The `detail` of a "Step Functions Execution Status Change" event, as documented in the Step
/// Functions developer guide. Fields Step Functions may add later are ignored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ExecutionStatusChange {
    pub execution_arn: String,
    pub state_machine_arn: String,
    pub name: String,
    /// RUNNING, SUCCEEDED, FAILED, TIMED_OUT, ABORTED or PENDING_REDRIVE.
    pub status: String,
    /// Epoch milliseconds.
    pub start_date: Option<i64>,
    /// Epoch milliseconds; null while running.
    pub stop_date: Option<i64>,
    /// The execution's input as JSON text; absent when it is too large to be included.
    pub input: Option<String>,
    pub input_details: Option<DataDetails>,
    pub output: Option<String>,
    pub output_details: Option<DataDetails>,
    pub error: Option<String>,
    pub cause: Option<String>,
    pub state_machine_version_arn: Option<String>,
    pub state_machine_alias_arn: Option<String>,
    pub redrive_count: Option<u32>,
    pub redrive_date: Option<i64>,
    pub redrive_status: Option<String>,
    pub redrive_status_reason: Option<String>,
}

/// Whether the event includes the input or output (false when it was too large).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DataDetails {
    pub included: bool,
}

pub type StatusChangeEvent = EventBridgeEvent<ExecutionStatusChange>;

/// Where a lock name came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LockSource {
    Configuration,
    ExecutionInput,
}

/// One slot freed by this cleanup.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FreedSlot {
    pub acquisition: String,
    pub token: u64,
    pub held_for_ms: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LockCleanup {
    pub lock: String,
    pub source: LockSource,
    /// What the execution held on this lock; empty when it held nothing (already released,
    /// a duplicate event, or its acquire had not landed yet; it is fenced now either way).
    pub freed: Vec<FreedSlot>,
    /// Slots held on the lock after the cleanup.
    pub count: usize,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CleanupSummary {
    pub execution: String,
    pub status: String,
    /// False when the status is not one that needs a cleanup.
    pub cleaned: bool,
    pub locks: Vec<LockCleanup>,
    /// Why nothing was done, or what was not known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    /// A `"lock"` in the execution input that is not a valid lock name: reported, not used.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input_lock_error: Option<String>,
}

/// Reads the event. Anything that is not a Step Functions status-change event is bad input.
pub fn parse_event(payload: Value) -> Result<StatusChangeEvent, HandlerError> {
    let event: StatusChangeEvent = serde_json::from_value(payload).map_err(|e| {
        HandlerError::InvalidInput(format!(
            "expected an EventBridge \"{DETAIL_TYPE}\" event from {SOURCE}: {e}"
        ))
    })?;
    if event.source != SOURCE || event.detail_type != DETAIL_TYPE {
        return Err(HandlerError::InvalidInput(format!(
            "expected an EventBridge \"{DETAIL_TYPE}\" event from {SOURCE}; got \"{}\" from {}",
            event.detail_type, event.source
        )));
    }
    Ok(event)
}

/// The `"lock"` of the execution input, if the event carries an input that has one.
/// `Err` is a message for the summary: the field is there but is not a lock name.
pub fn lock_from_input(detail: &ExecutionStatusChange) -> Result<Option<LockName>, String> {
    let Some(text) = detail.input.as_deref() else {
        return Ok(None);
    };
    let Ok(Value::Object(input)) = serde_json::from_str::<Value>(text) else {
        return Ok(None);
    };
    match input.get("lock") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(name)) => LockName::new(name.as_str())
            .map(Some)
            .map_err(|e| format!("the execution input's \"lock\" is not used: {e}")),
        Some(other) => Err(format!(
            "the execution input's \"lock\" is not used: it must be a string, got {other}"
        )),
    }
}

/// Frees and fences everything the ended execution holds on `configured` locks and on the lock
/// named by its input.
pub async fn cleanup<S: ItemStore>(
    semaphore: &Semaphore<S>,
    configured: &[LockName],
    event: &StatusChangeEvent,
) -> Result<CleanupSummary, HandlerError> {
    let detail = &event.detail;
    let mut summary = CleanupSummary {
        execution: detail.execution_arn.clone(),
        status: detail.status.clone(),
        cleaned: false,
        locks: Vec::new(),
        note: None,
        input_lock_error: None,
    };
    if !ENDED_STATUSES.contains(&detail.status.as_str()) {
        summary.note = Some(format!(
            "status {} needs no cleanup (only {} do): nothing done",
            detail.status,
            ENDED_STATUSES.join(", ")
        ));
        tracing::info!(execution = %detail.execution_arn, status = %detail.status, "ignored");
        return Ok(summary);
    }
    let holder = HolderId::new(detail.execution_arn.as_str()).map_err(|e| {
        HandlerError::InvalidInput(format!("the event's executionArn is not a holder id: {e}"))
    })?;

    let mut locks: Vec<(LockName, LockSource)> = configured
        .iter()
        .map(|l| (l.clone(), LockSource::Configuration))
        .collect();
    match lock_from_input(detail) {
        Ok(Some(lock)) if !configured.contains(&lock) => {
            locks.push((lock, LockSource::ExecutionInput))
        }
        Ok(_) => {}
        Err(message) => {
            tracing::warn!(execution = %detail.execution_arn, "{message}");
            summary.input_lock_error = Some(message);
        }
    }
    if detail.input.is_none() {
        summary.note = Some(
            "the event does not include the execution input: only the configured locks were cleaned"
                .to_owned(),
        );
    }
    if locks.is_empty() {
        tracing::warn!(execution = %detail.execution_arn, "no lock to clean: set LOCK_NAMES");
        summary.note = Some(
            "no lock to clean: LOCK_NAMES is empty and the execution input names none".to_owned(),
        );
    }

    let mut failures: Vec<(LockName, HandlerError)> = Vec::new();
    for (lock, source) in locks {
        match semaphore.cleanup(&lock, &holder).await {
            Ok(outcome) => {
                let now = semaphore.now_ms();
                let freed: Vec<FreedSlot> = outcome
                    .freed
                    .into_iter()
                    .map(|(identity, holding)| FreedSlot {
                        acquisition: identity.acquisition.to_string(),
                        token: holding.token.0,
                        held_for_ms: now.saturating_sub(holding.acquired_at_ms),
                    })
                    .collect();
                tracing::info!(
                    execution = %detail.execution_arn,
                    status = %detail.status,
                    lock = %lock,
                    freed = freed.len(),
                    count = outcome.count,
                    "cleaned up"
                );
                summary.locks.push(LockCleanup {
                    lock: lock.to_string(),
                    source,
                    freed,
                    count: outcome.count,
                });
            }
            Err(e) => {
                let e = HandlerError::from(e);
                tracing::error!(execution = %detail.execution_arn, lock = %lock, error = %e, "cleanup failed");
                failures.push((lock, e));
            }
        }
    }
    if let Some((_, first)) = failures.first() {
        let each: Vec<String> = failures
            .iter()
            .map(|(lock, e)| format!("lock \"{lock}\": {e}"))
            .collect();
        return Err(first.with_message(format!(
            "cleanup of {} failed on {} lock(s); retrying is safe: {}",
            detail.execution_arn,
            failures.len(),
            each.join("; ")
        )));
    }
    summary.cleaned = true;
    Ok(summary)
}

/// The Lambda handler.
pub async fn handle<S: ItemStore>(
    semaphore: &Semaphore<S>,
    configured: &[LockName],
    event: LambdaEvent<Value>,
) -> Result<CleanupSummary, HandlerError> {
    // Bad input is logged by the runtime with the error it answers.
    let event = parse_event(event.payload)?;
    cleanup(semaphore, configured, &event).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn detail(input: Option<&str>) -> ExecutionStatusChange {
        ExecutionStatusChange {
            execution_arn: "arn:aws:states:us-east-1:1:execution:m:e".into(),
            state_machine_arn: "arn:aws:states:us-east-1:1:stateMachine:m".into(),
            name: "e".into(),
            status: "FAILED".into(),
            start_date: None,
            stop_date: None,
            input: input.map(str::to_owned),
            input_details: None,
            output: None,
            output_details: None,
            error: None,
            cause: None,
            state_machine_version_arn: None,
            state_machine_alias_arn: None,
            redrive_count: None,
            redrive_date: None,
            redrive_status: None,
            redrive_status_reason: None,
        }
    }

    #[test]
    fn the_input_lock_is_read_only_from_a_json_object() {
        assert_eq!(lock_from_input(&detail(None)), Ok(None));
        assert_eq!(lock_from_input(&detail(Some("not json"))), Ok(None));
        assert_eq!(lock_from_input(&detail(Some("[1]"))), Ok(None));
        assert_eq!(lock_from_input(&detail(Some(r#"{"x": 1}"#))), Ok(None));
        assert_eq!(
            lock_from_input(&detail(Some(r#"{"lock": "orders"}"#))),
            Ok(Some(LockName::new("orders").unwrap()))
        );
        assert_eq!(
            lock_from_input(&detail(Some(r#"{"lock": 5}"#))),
            Err("the execution input's \"lock\" is not used: it must be a string, got 5".into())
        );
        assert_eq!(
            lock_from_input(&detail(Some(r#"{"lock": ""}"#))),
            Err("the execution input's \"lock\" is not used: lock name is empty: pass the name of the semaphore, e.g. \"demo-lock\"".into())
        );
    }

    #[test]
    fn other_events_are_invalid_input() {
        let scheduled = json!({
            "version": "0", "id": "1", "detail-type": "Scheduled Event", "source": "aws.events",
            "account": "1", "time": "2024-01-01T00:00:00Z", "region": "us-east-1",
            "resources": [], "detail": {}
        });
        let err = parse_event(scheduled).unwrap_err();
        assert_eq!(err.error_type(), "SemaphoreInvalidInput");
        assert!(
            err.message().contains("missing field `executionArn`"),
            "{err}"
        );

        let wrong_type = json!({
            "detail-type": "Something Else", "source": "aws.states",
            "detail": detail(None)
        });
        assert_eq!(
            parse_event(wrong_type).unwrap_err().message(),
            "expected an EventBridge \"Step Functions Execution Status Change\" event from \
             aws.states; got \"Something Else\" from aws.states"
        );
        assert!(parse_event(json!("ABORTED")).is_err());
    }
}
