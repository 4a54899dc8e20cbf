//! The cleanup function (cleanup-from-incomplete): given the EventBridge "Step Functions
//! Execution Status Change" event of an execution that ended FAILED, TIMED_OUT or ABORTED, it
//! fences the execution on every lock it asked for, so that no delayed or zombie acquire of it
//! lands afterwards (F1-F3), takes it out of every line (F8), and frees its slots once the work
//! it ran under them has ended.
//!
//! The locks come from the execution's history (every acquire task's payload, resolved as the
//! acquire function resolves it), so no list is configured and the event need not carry the
//! input. A redriven execution that runs again is left alone, and a child still running keeps
//! the slots (answer `deferred`, asked again) since freeing them would let others in under it.
//! Every step is idempotent, so duplicated, late and reordered events are harmless. The steps
//! are the core's flow ([`semaphore_core::flow::cleanup`]); this is its adapter: the event, the
//! history, the work, the answer, metrics and logs.

use std::sync::Mutex;

use aws_lambda_events::eventbridge::EventBridgeEvent;
use lambda_common::arn::{ExecutionArn, ExecutionKind, StateMachineArn};
use lambda_common::history::{self, AcquireFunction, ChildExecution, LockReading};
use lambda_common::sfn::{
    child_state, may_still_start, read_back, ChildState, Described, Executions, HistoryRead,
    SfnClient, SfnError, STEP_FUNCTIONS_ERROR,
};
use lambda_common::{metrics, ConfigError, HandlerError, Resolver, Settings, SfnHandOffs};
use lambda_runtime::{Diagnostic, LambdaEvent};
use semaphore_core::flow::cleanup::{Cleaned, End, Locks};
use semaphore_core::semaphore::flows::CleanupCalls;
use semaphore_core::{
    DynamoStore, ExecutionState, ExecutionStatus, HandOff, HolderId, ItemStore, LockName,
    PortError, Run, Semaphore,
};
use serde::{Deserialize, Serialize};
use serde_json::Value;

pub use semaphore_core::flow::cleanup::answer::{
    retry_after_seconds, ChildAction, ChildWork, CleanupSummary, FreedSlot, LockCleanup,
    RETRY_AFTER_MAX_SECONDS, RETRY_AFTER_MIN_SECONDS,
};

/// The event's `source` and `detail-type`.
pub const SOURCE: &str = "aws.states";
pub const DETAIL_TYPE: &str = "Step Functions Execution Status Change";
/// The statuses of an execution that ended without releasing what it held.
pub const ENDED_STATUSES: [&str; 3] = ["FAILED", "TIMED_OUT", "ABORTED"];

/// The error and cause a stopped child execution ends with.
pub const CHILD_STOP_ERROR: &str = "SemaphoreParentEnded";

/// The `detail` of a "Step Functions Execution Status Change" event, as documented in the Step
/// Functions developer guide. Fields Step Functions may add later are ignored. The stack's rule
/// passes only the execution's ARN, machine, name, status and dates (template.yaml,
/// `InputTransformer`); the optional fields are then absent.
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
    /// The execution's input as JSON text; absent when it is too large to be included. Not
    /// used: the history has every acquire payload.
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

/// The event; the cleanup state machine adds its last answer as `"cleanup"` on later loops,
/// which is ignored: every call starts again from Step Functions and the table.
pub type StatusChangeEvent = EventBridgeEvent<ExecutionStatusChange>;

/// A failed cleanup: the state machine retries it (except invalid input).
#[derive(Clone, PartialEq, Eq, thiserror::Error)]
pub enum CleanupError {
    #[error(transparent)]
    Handler(#[from] HandlerError),
    #[error(transparent)]
    StepFunctions(#[from] SfnError),
}

impl CleanupError {
    pub fn error_type(&self) -> &'static str {
        match self {
            Self::Handler(e) => e.error_type(),
            Self::StepFunctions(_) => STEP_FUNCTIONS_ERROR,
        }
    }
}

/// `SemaphoreStepFunctionsError: <message>`: how the runtime logs a handler's error.
impl std::fmt::Debug for CleanupError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {self}", self.error_type())
    }
}

/// How the runtime reports the error to Lambda: `errorType` is what `ErrorEquals` matches.
impl From<CleanupError> for Diagnostic {
    fn from(e: CleanupError) -> Self {
        Diagnostic {
            error_type: e.error_type().to_owned(),
            error_message: e.to_string(),
        }
    }
}

/// What the function is configured with, besides the table.
#[derive(Debug, Clone)]
pub struct Config {
    /// `ACQUIRE_FUNCTION_ARN`: whose tasks' payloads name the locks.
    pub acquire: AcquireFunction,
    /// `DEFAULT_LOCK`, through the acquire function's own rule.
    pub resolver: Resolver,
    /// `WORK_FUNCTION_RUNNER`: the state machine that runs a Lambda function as the work; its
    /// running executions are waited for, not stopped. Unset: every running child is stopped.
    pub work_function_runner: Option<StateMachineArn>,
}

impl Config {
    pub fn from_settings<F: Fn(&str) -> Option<String>>(
        settings: &Settings<F>,
    ) -> Result<Self, ConfigError> {
        const ACQUIRE: &str = "ACQUIRE_FUNCTION_ARN";
        const RUNNER: &str = "WORK_FUNCTION_RUNNER";
        let reference = settings.required(
            ACQUIRE,
            "set it to the acquire function's ARN: the cleanup reads the locks an execution \
             took from the payloads of its tasks that invoked it",
        )?;
        let acquire = AcquireFunction::new(&reference).ok_or_else(|| ConfigError::Invalid {
            name: ACQUIRE,
            value: reference.clone(),
            problem: "expected a Lambda function ARN or name".to_owned(),
        })?;
        let work_function_runner = settings
            .optional(RUNNER)
            .map(|value| {
                StateMachineArn::parse(&value).ok_or_else(|| ConfigError::Invalid {
                    name: RUNNER,
                    value: value.clone(),
                    problem: "expected the work-function state machine's ARN, \
                              arn:<partition>:states:<region>:<account>:stateMachine:<name>"
                        .to_owned(),
                })
            })
            .transpose()?;
        Ok(Self {
            acquire,
            resolver: Resolver {
                defaults: settings.defaults()?,
                ..Resolver::default()
            },
            work_function_runner,
        })
    }

    fn is_runner(&self, state_machine: &str) -> bool {
        match (
            &self.work_function_runner,
            StateMachineArn::parse(state_machine),
        ) {
            (Some(runner), Some(machine)) => *runner == machine,
            _ => false,
        }
    }
}

/// The cleanup function's dependencies, built once per cold start.
#[derive(Debug, Clone)]
pub struct Cleanup<S, X> {
    pub semaphore: Semaphore<S>,
    pub executions: X,
    pub config: Config,
    /// Hands the freed slots on to the waiters in line.
    pub hand_offs: SfnHandOffs,
}

impl Cleanup<DynamoStore, SfnClient> {
    /// From `TABLE_NAME`, the timing (`ACQUIRE_HORIZON_SECONDS`, `CLOCK_SKEW_SECONDS`),
    /// `ACQUIRE_FUNCTION_ARN` (required), `DEFAULT_LOCK` and `WORK_FUNCTION_RUNNER`.
    pub fn from_settings<F: Fn(&str) -> Option<String>>(
        settings: &Settings<F>,
        sdk: &aws_config::SdkConfig,
    ) -> Result<Self, ConfigError> {
        Ok(Self {
            semaphore: settings.semaphore(sdk)?,
            executions: SfnClient::new(aws_sdk_sfn::Client::new(sdk)),
            config: Config::from_settings(settings)?,
            hand_offs: settings.hand_offs(sdk)?,
        })
    }
}

/// Longest excerpt of why the event could not be read quoted back: serde's reason quotes a
/// wrong string whole, and an event field may be 256 KB.
const MAX_REASON: usize = 300;

/// Reads the event. Anything that is not a Step Functions status-change event is bad input.
pub fn parse_event(payload: Value) -> Result<StatusChangeEvent, HandlerError> {
    let event: StatusChangeEvent = serde_json::from_value(payload).map_err(|e| {
        let mut reason = e.to_string();
        if reason.len() > MAX_REASON {
            reason.truncate(reason.floor_char_boundary(MAX_REASON));
            reason.push_str("...");
        }
        HandlerError::InvalidInput(format!(
            "expected an EventBridge \"{DETAIL_TYPE}\" event from {SOURCE}: {reason}"
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

/// The ended execution as the core asks of it (`DescribeExecution`: does it run again, in which
/// run did it end), keeping each answer whole: its status and stop date are the answer's and the
/// work's.
struct Parent<'a, X> {
    executions: &'a X,
    /// Each `DescribeExecution` answer, in order (`None`: not found).
    answers: Mutex<Vec<Option<Described>>>,
}

impl<X> Parent<'_, X> {
    /// The status Step Functions said in answer `at` (0: the first question).
    fn status(&self, at: usize) -> String {
        let answers = self.answers.lock().unwrap();
        let described = answers.get(at).and_then(Option::as_ref);
        described.map_or_else(String::new, |d| d.status().to_owned())
    }
}

impl<X: Executions> ExecutionStatus for Parent<'_, X> {
    async fn describe(&self, holder: &HolderId) -> Result<ExecutionState, PortError> {
        let described = self.executions.describe(holder.as_str()).await;
        let described = described.map_err(PortError::new)?;
        let state = match &described {
            None => ExecutionState::Missing,
            Some(d) if d.is_running() => ExecutionState::Running,
            Some(d) => ExecutionState::Ended {
                status: d.status().to_owned(),
                last_run: d.run,
            },
        };
        self.answers.lock().unwrap().push(described);
        Ok(state)
    }
}

/// The cleanup's own calls: the history, the work, the hand-offs; and the answer, as the history
/// and the work fill it in.
struct Calls<'a, S, X> {
    cleanup: &'a Cleanup<S, X>,
    parent: &'a Parent<'a, X>,
    /// The event's stop date: when Step Functions does not say it.
    stopped_ms: Option<u64>,
    children: Vec<ChildExecution>,
    summary: CleanupSummary,
}

impl<S: ItemStore, X: Executions> CleanupCalls for Calls<'_, S, X> {
    /// The locks and the children, from the history, read newest first back to the execution's
    /// start (`ExecutionStarted`), every run's: the cleanup fences every run up to the one that
    /// ended and frees what they hold, and a run before it may hold a slot still, asked for by an
    /// acquire task of its own part of the history only (its cleanup found the execution
    /// redriven and left the slot to the redriven run, which may carry that run's `$.semaphore`
    /// into the work without an acquire of its own, F7/F11; a redrive reruns only the failed
    /// branches of a Parallel or Map). Stopping at the start of the run that ended would miss
    /// those acquires and leave their slots to the sweeper. So the read is bounded by the history
    /// quota alone (25,000 events: 25 pages), and only what it found is kept, never the events.
    async fn find_locks(&mut self) -> Result<Option<Locks>, PortError> {
        let (config, arn) = (&self.cleanup.config, self.summary.execution.as_str());
        let lock_of = |payload: &Value| config.resolver.lock(payload);
        let waiter_of = |payload: &Value| config.resolver.waiter(payload).ok();
        let reading = LockReading {
            acquire: &config.acquire,
            lock_of: &lock_of,
            waiter_of: &waiter_of,
        };
        let mut reader = history::Reader::new(Some(reading), Run::FIRST);
        let read = read_back(&self.cleanup.executions, arn, &mut reader).await;
        match read.map_err(PortError::new)? {
            HistoryRead::Read { pages } => {
                let events = reader.events_read();
                tracing::debug!(execution = arn, pages, events, "history read");
            }
            HistoryRead::NotFound => return Ok(None),
            // Nothing can be concluded from the part read: an acquire or a child before it would
            // be missed. Nothing is written; the sweeper, which reads the table, judges each slot
            // the execution holds from the part of the history since that slot's run began, and
            // says so by notice and metric when it cannot either.
            HistoryRead::TooLong(too_long) => {
                self.summary.note = Some(too_long.to_string());
                self.summary.history_too_long = true;
                return Ok(None);
            }
        }
        let footprint = reader.finish();
        (self.summary.history_notes, self.children) = (footprint.notes, footprint.children);
        let (locks, waiters) = (footprint.locks, footprint.waiters);
        Ok(Some(Locks { locks, waiters }))
    }

    /// Each child of the execution settled; deferred if any still runs.
    async fn stop_work(&mut self) -> Result<bool, PortError> {
        let answers = self.parent.answers.lock().unwrap().clone();
        let stopped_ms = match &answers[..] {
            [_, Some(again), ..] => again.stop_date_ms,
            [first, ..] => first.as_ref().and_then(|d| d.stop_date_ms),
            [] => None,
        }
        .or(self.stopped_ms);
        let (now, status) = (self.cleanup.semaphore.now_ms(), self.parent.status(0));
        for child in &self.children {
            let arn = self.summary.execution.as_str();
            let settled = self
                .cleanup
                .settle_child(arn, &status, child, stopped_ms, now);
            let work = settled.await.map_err(PortError::new)?;
            self.summary.children.push(work);
        }
        let children = &self.summary.children;
        self.summary.deferred = children.iter().any(|c| c.action == ChildAction::Waiting);
        if self.summary.deferred {
            self.summary.retry_after_seconds = retry_after_seconds(stopped_ms, now);
        }
        Ok(self.summary.deferred)
    }

    async fn hand_off(&mut self, lock: LockName) -> HandOff {
        let cleanup = self.cleanup;
        cleanup.hand_offs.run(&cleanup.semaphore, &lock, None).await
    }
}

/// A Step Functions call that failed, as the port carried it.
fn step_functions(e: PortError, arn: &str) -> CleanupError {
    match e.source.downcast::<SfnError>() {
        Ok(e) => CleanupError::StepFunctions(*e),
        Err(other) => CleanupError::StepFunctions(SfnError {
            operation: "DescribeExecution",
            execution: arn.to_owned(),
            message: other.to_string(),
        }),
    }
}

impl<S: ItemStore, X: Executions> Cleanup<S, X> {
    /// Handles one event (see the module documentation).
    pub async fn run(&self, event: &StatusChangeEvent) -> Result<CleanupSummary, CleanupError> {
        let detail = &event.detail;
        let arn = detail.execution_arn.as_str();
        let mut summary = CleanupSummary::new(arn, &detail.status);
        if !ENDED_STATUSES.contains(&detail.status.as_str()) {
            summary.note = Some(format!(
                "status {} needs no cleanup (only {} do): nothing done",
                detail.status,
                ENDED_STATUSES.join(", ")
            ));
            tracing::info!(execution = arn, status = %detail.status, "ignored");
            return Ok(summary);
        }
        let holder = HolderId::new(arn).map_err(|e| {
            HandlerError::InvalidInput(format!("the event's executionArn is not a holder id: {e}"))
        })?;
        if ExecutionArn::parse(arn).map(|a| a.kind) != Some(ExecutionKind::Standard) {
            return Err(HandlerError::InvalidInput(format!(
                "the event's executionArn {arn:?} is not the ARN of a standard execution"
            ))
            .into());
        }
        let parent = Parent {
            executions: &self.executions,
            answers: Mutex::default(),
        };
        let mut calls = Calls {
            cleanup: self,
            parent: &parent,
            stopped_ms: detail.stop_date.and_then(|ms| u64::try_from(ms).ok()),
            children: Vec::new(),
            summary,
        };
        // Boxed: a deep future (the hand-off nests), kept off the caller's.
        let ran = self
            .semaphore
            .clean_up_after(holder.clone(), &parent, &mut calls);
        let ran = Box::pin(ran).await.map_err(|e| step_functions(e, arn))?;
        for failure in &ran.failures {
            let (lock, what, e) = (&failure.lock, failure.step.describe(), &failure.error);
            tracing::error!(execution = arn, lock = %lock, error = %e, "{what} failed");
        }
        let message = ran.failure_message(&holder);
        let first = ran.failures.into_iter().next();
        let cleaned = (ran.done)
            .map_err(|refusal| CleanupError::from(HandlerError::Store(refusal.message(&holder))))?;
        let mut summary = calls.summary;
        summary.record(&cleaned);
        self.report(&summary, &cleaned);
        if let (true, Some(first), Some(message)) = (cleaned.retry(), first, message) {
            return Err(HandlerError::from(first.error).with_message(message).into());
        }
        let note = match cleaned.end {
            End::RunsAgain => {
                let status = parent.status(0);
                tracing::info!(
                    execution = arn,
                    status,
                    "redriven since the event: left alone"
                );
                format!(
                    "the execution is {status} again: it was redriven since this event, and \
                     needs what it holds; its release, or the cleanup of its next end, frees it: \
                     nothing done"
                )
            }
            End::Missing | End::LocksUntold if !summary.history_too_long => {
                tracing::warn!(execution = arn, "execution not found");
                "the execution does not exist (any more): its history cannot be read; the \
                 sweeper frees whatever it holds"
                    .to_owned()
            }
            End::NoLocks => {
                tracing::info!(
                    execution = arn,
                    "no acquire in the history: nothing to clean"
                );
                format!(
                    "no task of the execution invoked the acquire function ({}): it never asked \
                     for a slot",
                    self.config.acquire.name()
                )
            }
            End::RedrivenMeanwhile => {
                tracing::warn!(execution = arn, "redriven during the cleanup: slots kept");
                format!(
                    "the execution was redriven while this cleanup ran ({} now): what it holds \
                     is kept, fenced; its release, or the cleanup of its next end, frees it",
                    parent.status(1)
                )
            }
            End::WorkRuns => {
                let retry_after_seconds = summary.retry_after_seconds;
                tracing::info!(
                    execution = arn,
                    retry_after_seconds,
                    "its work still runs: fenced, slots kept until it ends"
                );
                return Ok(summary);
            }
            // Too long: its reading said so. Freed: nothing to note.
            End::Missing | End::LocksUntold | End::Freed { .. } => return Ok(summary),
        };
        summary.note = Some(note);
        Ok(summary)
    }

    /// The metrics and logs of what `cleaned` did: each line left, and per lock freed the slots
    /// and how long each was held, and the line's length after.
    fn report(&self, summary: &CleanupSummary, cleaned: &Cleaned) {
        let execution = summary.execution.as_str();
        let metrics = &self.hand_offs.metrics;
        for left in &cleaned.left_line {
            let line = metrics::Line::of(&left.lock).value(metrics::DEAD_WAITERS_REMOVED, 1);
            metrics.emit(left.at_ms, &line);
            tracing::info!(execution, lock = %left.lock, waiter = %left.id, "removed from the line");
        }
        let End::Freed { at_ms } = cleaned.end else {
            return;
        };
        for (lock, entry) in cleaned.locks.iter().zip(&summary.locks) {
            let Some(freed) = &lock.freed else { continue };
            let held = (freed.freed.iter()).map(|(_, h)| at_ms.saturating_sub(h.acquired_at_ms));
            let mut line = metrics::Line::of(&lock.fenced.lock)
                .value(metrics::WAITING, freed.waiting as f64)
                .values(metrics::TIME_HELD, held.map(|ms| ms as f64));
            if !freed.freed.is_empty() {
                line = line.value(metrics::SLOTS_FREED_BY_CLEANUP, freed.freed.len() as f64);
            }
            metrics.emit(at_ms, &line);
            tracing::info!(
                execution,
                status = %summary.status,
                lock = %entry.lock,
                freed = entry.freed.len(),
                count = freed.count,
                "cleaned up"
            );
        }
    }

    /// What to do about one child of the ended execution.
    async fn settle_child(
        &self,
        parent: &str,
        parent_status: &str,
        child: &ChildExecution,
        parent_stopped_ms: Option<u64>,
        now_ms: u64,
    ) -> Result<ChildWork, SfnError> {
        let execution = child.execution_arn.clone();
        let work = |status: &str, action| ChildWork {
            execution: execution.clone(),
            status: status.to_owned(),
            action,
        };
        Ok(match child_state(&self.executions, child).await? {
            ChildState::Running { state_machine } if self.config.is_runner(&state_machine) => {
                work("RUNNING", ChildAction::Waiting)
            }
            ChildState::Running { .. } => {
                let cause = format!(
                    "{parent}, which ran this execution as its work under a semaphore slot, \
                     ended {parent_status}; its slots are freed once this execution has stopped"
                );
                if let Err(e) = self
                    .executions
                    .stop(&child.execution_arn, CHILD_STOP_ERROR, &cause)
                    .await
                {
                    // It may have ended meanwhile, which is all that was wanted.
                    if self
                        .executions
                        .describe(&child.execution_arn)
                        .await?
                        .is_some_and(|d: Described| d.is_running())
                    {
                        return Err(e);
                    }
                }
                tracing::warn!(parent, child = %child.execution_arn, "stopped the work of the ended execution");
                work("RUNNING", ChildAction::Stopped)
            }
            ChildState::Ended { status } => work(&status, ChildAction::Ended),
            ChildState::Missing if may_still_start(child, parent_stopped_ms, now_ms) => {
                work("NOT_FOUND", ChildAction::Waiting)
            }
            ChildState::Missing => work("NOT_FOUND", ChildAction::NotStarted),
        })
    }
}

/// The Lambda handler.
pub async fn handle<S: ItemStore, X: Executions>(
    cleanup: &Cleanup<S, X>,
    event: LambdaEvent<Value>,
) -> Result<CleanupSummary, CleanupError> {
    // Bad input is logged by the runtime with the error it answers.
    let event = parse_event(event.payload)?;
    cleanup.run(&event).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn detail() -> ExecutionStatusChange {
        ExecutionStatusChange {
            execution_arn: "arn:aws:states:us-east-1:1:execution:m:e".into(),
            state_machine_arn: "arn:aws:states:us-east-1:1:stateMachine:m".into(),
            name: "e".into(),
            status: "FAILED".into(),
            start_date: None,
            stop_date: None,
            input: None,
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
            "detail": detail()
        });
        assert_eq!(
            parse_event(wrong_type).unwrap_err().message(),
            "expected an EventBridge \"Step Functions Execution Status Change\" event from \
             aws.states; got \"Something Else\" from aws.states"
        );
        assert!(parse_event(json!("ABORTED")).is_err());
        // The cleanup machine's later loops add the last answer: read as the event.
        let mut again = json!({
            "detail-type": DETAIL_TYPE, "source": SOURCE, "detail": detail()
        });
        again["cleanup"] = json!({"deferred": true, "retry_after_seconds": 5});
        assert_eq!(parse_event(again).unwrap().detail, detail());
    }

    #[test]
    fn the_wait_grows_from_5_seconds_to_a_minute() {
        let stopped = 1_000_000;
        assert_eq!(retry_after_seconds(Some(stopped), stopped), 5);
        assert_eq!(retry_after_seconds(Some(stopped), stopped + 9_999), 5);
        assert_eq!(retry_after_seconds(Some(stopped), stopped + 100_000), 15);
        assert_eq!(retry_after_seconds(Some(stopped), stopped + 550_000), 60);
        assert_eq!(retry_after_seconds(Some(stopped), stopped + 86_400_000), 60);
        assert_eq!(retry_after_seconds(None, stopped), 5);
        // A clock behind the stop date waits the least, not a wrapped-around long time.
        assert_eq!(retry_after_seconds(Some(stopped), stopped - 5_000), 5);
    }

    #[test]
    fn the_configuration_names_what_is_missing_or_wrong() {
        let config = |vars: &'static [(&'static str, &'static str)]| {
            Config::from_settings(&Settings::from_lookup(move |name| {
                vars.iter()
                    .find(|(k, _)| *k == name)
                    .map(|(_, v)| (*v).to_owned())
            }))
        };
        let err = config(&[]).unwrap_err().to_string();
        assert!(
            err.starts_with("environment variable ACQUIRE_FUNCTION_ARN is not set"),
            "{err}"
        );
        let err = config(&[
            ("ACQUIRE_FUNCTION_ARN", "acquire"),
            ("WORK_FUNCTION_RUNNER", "runner"),
        ])
        .unwrap_err()
        .to_string();
        assert!(
            err.starts_with("environment variable WORK_FUNCTION_RUNNER is \"runner\""),
            "{err}"
        );
        let ok = config(&[
            (
                "ACQUIRE_FUNCTION_ARN",
                "arn:aws:lambda:us-east-1:123456789012:function:s-acquire",
            ),
            ("DEFAULT_LOCK", "demo-lock"),
            (
                "WORK_FUNCTION_RUNNER",
                "arn:aws:states:us-east-1:123456789012:stateMachine:s-work-function",
            ),
        ])
        .unwrap();
        assert_eq!(ok.acquire.name(), "s-acquire");
        assert_eq!(
            ok.resolver.lock(&json!({"request": {}})).unwrap().as_str(),
            "demo-lock"
        );
        assert!(ok.is_runner("arn:aws:states:us-east-1:123456789012:stateMachine:s-work-function"));
        assert!(!ok.is_runner("arn:aws:states:us-east-1:123456789012:stateMachine:demo-work"));
    }
}
