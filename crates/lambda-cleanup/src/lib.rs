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
//! Every step is idempotent, so duplicated, late and reordered events are harmless.

use std::collections::BTreeMap;

use aws_lambda_events::eventbridge::EventBridgeEvent;
use lambda_common::arn::{ExecutionArn, ExecutionKind, StateMachineArn};
use lambda_common::history::{self, AcquireFunction, ChildExecution, LockReading};
use lambda_common::sfn::{
    child_state, may_still_start, read_back, ChildState, Described, Executions, HistoryRead,
    SfnClient, SfnError, STEP_FUNCTIONS_ERROR,
};
use lambda_common::{metrics, ConfigError, HandlerError, Resolver, Settings, SfnHandOffs};
use lambda_runtime::{Diagnostic, LambdaEvent};
use semaphore_core::{DynamoStore, Fenced, HolderId, ItemStore, LockName, Run, Semaphore};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The event's `source` and `detail-type`.
pub const SOURCE: &str = "aws.states";
pub const DETAIL_TYPE: &str = "Step Functions Execution Status Change";
/// The statuses of an execution that ended without releasing what it held.
pub const ENDED_STATUSES: [&str; 3] = ["FAILED", "TIMED_OUT", "ABORTED"];

/// The wait before asking again while the work runs: 5 s at first, growing by a second per
/// 10 s since the execution ended, up to a minute. A long work costs a few calls a minute.
pub const RETRY_AFTER_MIN_SECONDS: u64 = 5;
pub const RETRY_AFTER_MAX_SECONDS: u64 = 60;

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
    /// What this call freed; empty when it held nothing (already released, a duplicate event,
    /// or its acquire had not landed yet: it is fenced now either way) or when it only fenced.
    pub freed: Vec<FreedSlot>,
    /// The acquisitions still held because the work still runs (deferred), or because the
    /// execution runs again: fenced, not freed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub kept: Vec<String>,
    /// Slots held on the lock after the cleanup; `None` when the execution was only fenced.
    pub count: Option<usize>,
}

/// What became of a child execution of the ended one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ChildAction {
    /// It had ended.
    Ended,
    /// It was running a state machine of the user's: stopped now.
    Stopped,
    /// It runs a Lambda function, which cannot be stopped, or its start was in flight when the
    /// parent ended: waited for, the slots kept.
    Waiting,
    /// It was never started.
    NotStarted,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChildWork {
    pub execution: String,
    /// As described before anything was done: RUNNING, SUCCEEDED, ..., or NOT_FOUND.
    pub status: String,
    pub action: ChildAction,
}

/// The answer. `deferred` and `retry_after_seconds` are always there: the cleanup state
/// machine waits that long and asks again while `deferred` is true.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CleanupSummary {
    pub execution: String,
    pub status: String,
    /// True when what the execution held is freed (or it held nothing).
    pub cleaned: bool,
    /// True while its work still runs: fenced, nothing freed; ask again.
    pub deferred: bool,
    /// How long to wait before asking again; 0 when not deferred.
    pub retry_after_seconds: u64,
    pub locks: Vec<LockCleanup>,
    pub children: Vec<ChildWork>,
    /// The locks whose line the execution was taken out of (it died waiting).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub left_line: Vec<String>,
    /// Waiters woken with the slots this cleanup freed.
    #[serde(default)]
    pub handed_off: usize,
    /// What the history did not tell (see `lambda_common::history::Footprint::notes`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub history_notes: Vec<String>,
    /// Why nothing (more) was done.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    /// The history was too long to judge (`note` says how much was read): nothing was done;
    /// the sweeper judges what the execution holds, or reports each slot it cannot.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub history_too_long: bool,
}

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

/// The wait before asking again, from how long ago the execution ended.
pub fn retry_after_seconds(stopped_ms: Option<u64>, now_ms: u64) -> u64 {
    let waited_s = stopped_ms.map_or(0, |stopped| now_ms.saturating_sub(stopped) / 1000);
    (RETRY_AFTER_MIN_SECONDS + waited_s / 10).min(RETRY_AFTER_MAX_SECONDS)
}

/// The locks whose writes failed, with why: the others go on (one lock's failure, e.g. an item
/// of a format this version does not read, must not keep the others from being freed), and the
/// answer is then this error, so that the state machine retries.
#[derive(Default)]
struct Failures(Vec<(LockName, &'static str, HandlerError)>);

impl Failures {
    /// Runs `operation` on every lock; answers the locks it succeeded on, with its result.
    async fn on_every_lock<T>(
        &mut self,
        execution: &str,
        locks: &[LockName],
        what: &'static str,
        operation: impl AsyncFn(&LockName) -> Result<T, semaphore_core::Error>,
    ) -> Vec<(LockName, T)> {
        let mut done = Vec::with_capacity(locks.len());
        for lock in locks {
            match operation(lock).await {
                Ok(value) => done.push((lock.clone(), value)),
                Err(e) => {
                    let e = HandlerError::from(e);
                    tracing::error!(execution, lock = %lock, error = %e, "{what} failed");
                    self.0.push((lock.clone(), what, e));
                }
            }
        }
        done
    }

    /// The error naming every failure, of the type of the first.
    fn into_error(self, execution: &str) -> Option<HandlerError> {
        let (_, _, first) = self.0.first()?;
        let each: Vec<String> = self
            .0
            .iter()
            .map(|(lock, what, e)| format!("{what} on lock \"{lock}\": {e}"))
            .collect();
        Some(first.with_message(format!(
            "cleanup of {execution} failed on {} lock(s), the others were done; retrying is \
             safe: {}",
            self.0.len(),
            each.join("; ")
        )))
    }
}

impl<S: ItemStore, X: Executions> Cleanup<S, X> {
    /// Handles one event (see the module documentation for the steps).
    pub async fn run(&self, event: &StatusChangeEvent) -> Result<CleanupSummary, CleanupError> {
        let detail = &event.detail;
        let arn = detail.execution_arn.as_str();
        let mut summary = CleanupSummary {
            execution: arn.to_owned(),
            status: detail.status.clone(),
            ..CleanupSummary::default()
        };
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

        // 1. Redriven since the event?
        let Some(described) = self.executions.describe(arn).await? else {
            return Ok(self.not_found(summary));
        };
        if described.is_running() {
            summary.note = Some(format!(
                "the execution is {} again: it was redriven since this event, and needs what \
                 it holds; its release, or the cleanup of its next end, frees it: nothing done",
                described.status()
            ));
            tracing::info!(
                execution = arn,
                status = described.status(),
                "redriven since the event: left alone"
            );
            return Ok(summary);
        }

        // 2. The locks and the children, from the history, read newest first back to the
        // execution's start (`ExecutionStarted`), every run's: the cleanup fences every run up
        // to the one that ended and frees what they hold, and a run before it may hold a slot
        // still, asked for by an acquire task of its own part of the history only (its cleanup
        // found the execution redriven and left the slot to the redriven run, which may carry
        // that run's `$.semaphore` into the work without an acquire of its own, F7/F11; a
        // redrive reruns only the failed branches of a Parallel or Map). Stopping at the start
        // of the run that ended would miss those acquires and leave their slots to the sweeper.
        // So the read is bounded by the history quota alone (25,000 events: 25 pages), and
        // only what it found is kept, never the events.
        let resolver = &self.config.resolver;
        let lock_of = |payload: &Value| resolver.lock(payload);
        let waiter_of = |payload: &Value| resolver.waiter(payload).ok();
        let mut reader = history::Reader::new(
            Some(LockReading {
                acquire: &self.config.acquire,
                lock_of: &lock_of,
                waiter_of: &waiter_of,
            }),
            Run::FIRST,
        );
        match read_back(&self.executions, arn, &mut reader).await? {
            HistoryRead::Read { pages } => {
                tracing::debug!(
                    execution = arn,
                    pages,
                    events = reader.events_read(),
                    "history read"
                );
            }
            HistoryRead::NotFound => return Ok(self.not_found(summary)),
            HistoryRead::TooLong(too_long) => {
                // Nothing can be concluded from the part read: an acquire or a child before it
                // would be missed. Nothing is written; the sweeper, which reads the table, judges
                // each slot the execution holds from the part of the history since that slot's
                // run began, and says so by notice and metric when it cannot either.
                summary.note = Some(too_long.to_string());
                summary.history_too_long = true;
                return Ok(summary);
            }
        }
        let footprint = reader.finish();
        summary.history_notes = footprint.notes;
        let locks = footprint.locks;
        if locks.is_empty() {
            summary.cleaned = true;
            summary.note = Some(format!(
                "no task of the execution invoked the acquire function ({}): it never asked \
                 for a slot",
                self.config.acquire.name()
            ));
            tracing::info!(
                execution = arn,
                "no acquire in the history: nothing to clean"
            );
            return Ok(summary);
        }

        // 3. Fence every lock: from now on nothing more of it lands.
        let mut failures = Failures::default();
        let fenced = failures
            .on_every_lock(arn, &locks, "fencing", async |lock| {
                self.semaphore.fence(lock, &holder, described.run).await
            })
            .await;
        summary.locks = fenced
            .iter()
            .map(|(lock, fence)| LockCleanup {
                lock: lock.to_string(),
                freed: Vec::new(),
                kept: fence
                    .slots
                    .iter()
                    .map(|(s, _)| s.acquisition.to_string())
                    .collect(),
                count: None,
            })
            .collect();
        let fenced: BTreeMap<LockName, Fenced> = fenced.into_iter().collect();
        let fenced_locks: Vec<LockName> = fenced.keys().cloned().collect();

        // 3b. Out of line: a fenced run queues no more, so these are all its places. Read
        // first: every acquire task may have queued the execution, and most did not, and a read
        // costs less than a refused transaction. A lock whose fence failed is retried whole.
        for (lock, id) in footprint
            .waiters
            .iter()
            .filter(|(lock, _)| fenced.contains_key(lock))
        {
            let in_line = match self.semaphore.waiter(lock, *id).await {
                Ok(record) => record.is_some(),
                Err(e) => {
                    let e = HandlerError::from(e);
                    tracing::error!(execution = arn, lock = %lock, error = %e, "reading the line failed");
                    failures.0.push((lock.clone(), "reading the line", e));
                    continue;
                }
            };
            if !in_line {
                continue;
            }
            match self.semaphore.leave(lock, *id).await {
                Ok(true) => {
                    summary.left_line.push(lock.to_string());
                    self.hand_offs.metrics.emit(
                        self.semaphore.now_ms(),
                        &metrics::Line::of(lock).value(metrics::DEAD_WAITERS_REMOVED, 1),
                    );
                    tracing::info!(execution = arn, lock = %lock, waiter = %id, "removed from the line");
                }
                Ok(false) => {}
                Err(e) => {
                    let e = HandlerError::from(e);
                    tracing::error!(execution = arn, lock = %lock, error = %e, "leaving the line failed");
                    failures.0.push((lock.clone(), "leaving the line", e));
                }
            }
        }

        // 4. Still ended once the fences stand?
        let stopped_ms = match self.executions.describe(arn).await? {
            Some(again) if again.is_running() => {
                summary.note = Some(format!(
                    "the execution was redriven while this cleanup ran ({} now): what it holds \
                     is kept, fenced; its release, or the cleanup of its next end, frees it",
                    again.status()
                ));
                tracing::warn!(execution = arn, "redriven during the cleanup: slots kept");
                return Ok(summary);
            }
            again => again.as_ref().unwrap_or(&described).stop_date_ms,
        }
        .or(detail.stop_date.and_then(|ms| u64::try_from(ms).ok()));

        // 5. The work.
        let now = self.semaphore.now_ms();
        let mut waiting = false;
        for child in &footprint.children {
            let work = self
                .settle_child(arn, described.status(), child, stopped_ms, now)
                .await?;
            waiting |= work.action == ChildAction::Waiting;
            summary.children.push(work);
        }
        if waiting {
            if let Some(e) = failures.into_error(arn) {
                return Err(e.into());
            }
            summary.deferred = true;
            summary.retry_after_seconds = retry_after_seconds(stopped_ms, now);
            tracing::info!(
                execution = arn,
                retry_after_seconds = summary.retry_after_seconds,
                "its work still runs: fenced, slots kept until it ends"
            );
            return Ok(summary);
        }

        // 6. Free what each fence saw (a second write per lock that held something).
        let outcomes = failures
            .on_every_lock(arn, &fenced_locks, "freeing", async |lock| {
                self.semaphore.free(&fenced[lock]).await
            })
            .await;
        let now = self.semaphore.now_ms();
        for (lock, outcome) in outcomes {
            let mut line = metrics::Line::of(&lock)
                .value(metrics::WAITING, outcome.waiting as f64)
                .values(
                    metrics::TIME_HELD,
                    outcome
                        .freed
                        .iter()
                        .map(|(_, h)| now.saturating_sub(h.acquired_at_ms) as f64),
                );
            if !outcome.freed.is_empty() {
                line = line.value(metrics::SLOTS_FREED_BY_CLEANUP, outcome.freed.len() as f64);
            }
            self.hand_offs.metrics.emit(now, &line);
            if !outcome.freed.is_empty() && outcome.waiting > 0 {
                let handed = self.hand_offs.run(&self.semaphore, &lock, None).await;
                summary.handed_off += handed.woken.len();
            }
            let Some(entry) = summary.locks.iter_mut().find(|e| e.lock == lock.as_str()) else {
                continue;
            };
            entry.kept.clear();
            entry.count = Some(outcome.count);
            entry.freed = outcome
                .freed
                .into_iter()
                .map(|(identity, holding)| FreedSlot {
                    acquisition: identity.acquisition.to_string(),
                    token: holding.token.0,
                    held_for_ms: now.saturating_sub(holding.acquired_at_ms),
                })
                .collect();
            tracing::info!(
                execution = arn,
                status = %detail.status,
                lock = %entry.lock,
                freed = entry.freed.len(),
                count = outcome.count,
                "cleaned up"
            );
        }
        if let Some(e) = failures.into_error(arn) {
            return Err(e.into());
        }
        summary.cleaned = true;
        Ok(summary)
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

    fn not_found(&self, mut summary: CleanupSummary) -> CleanupSummary {
        summary.note = Some(
            "the execution does not exist (any more): its history cannot be read; the sweeper \
             frees whatever it holds"
                .to_owned(),
        );
        tracing::warn!(execution = %summary.execution, "execution not found");
        summary
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
