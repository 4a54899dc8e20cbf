//! What an execution's history says about its use of the semaphore, read the same way by the
//! cleanup function and the sweeper:
//!
//! - the locks it asked for: every task that invoked the acquire function (a `lambda:invoke`
//!   Task, `TaskScheduled`, or a Lambda ARN as the Task's resource, `LambdaFunctionScheduled`)
//!   names its lock in its payload, resolved as the acquire function resolves it. The history
//!   keeps every payload, however large the execution input, so no list of lock names has to be
//!   configured and no event has to carry the input;
//! - the child executions its work ran in: every `states:startExecution.sync` (or `.sync:2`)
//!   task. The child's ARN comes from the event that reports the start (`TaskSubmitted`, and the
//!   `TaskSucceeded` / `TaskFailed` that end the task), else from the task's parameters
//!   (`StateMachineArn` and `Name`): an execution that ended while the `StartExecution` call was
//!   in flight has no such event, and its child may still appear.
//!
//! A history is read newest first, a page at a time ([`Reader`]), and only back to the event that
//! began the oldest run the reader must judge: what is kept is what was found (locks, lines,
//! children), never the events, so a history of 25,000 events with a large input in every
//! acquire payload costs one page of memory, not the whole history.
//!
//! Nothing here calls AWS: it reads events (see [`crate::sfn`] for the calls).

use std::collections::HashMap;

use aws_sdk_sfn::types::{HistoryEvent, HistoryEventType as Kind};
use semaphore_core::{LockName, Run, WaiterId};
use serde_json::Value;

use crate::arn::StateMachineArn;
use crate::error::HandlerError;

/// The acquire function, as `ACQUIRE_FUNCTION_ARN` names it. A task invokes it when the task's
/// `FunctionName` names the same function in any form Lambda accepts (name, partial ARN or ARN,
/// with or without a version or alias): the function name is unique in its account and region.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AcquireFunction {
    name: String,
}

impl AcquireFunction {
    /// `None` if `reference` names no function.
    pub fn new(reference: &str) -> Option<Self> {
        function_name(reference).map(|name| Self {
            name: name.to_owned(),
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// Whether a task invoking `function` (its `FunctionName`, or its resource ARN) invokes
    /// this function.
    pub fn is(&self, function: &str) -> bool {
        function_name(function) == Some(self.name.as_str())
    }
}

/// The function name in a reference Lambda's Invoke accepts: `name`, `name:qualifier`,
/// `account:function:name[:qualifier]` or `arn:...:function:name[:qualifier]`.
pub fn function_name(reference: &str) -> Option<&str> {
    let rest = reference
        .rsplit_once(":function:")
        .map_or(reference.trim(), |(_, rest)| rest);
    rest.split(':').next().filter(|name| !name.is_empty())
}

/// How an acquire payload's lock is resolved: the acquire function's own rule
/// (`Resolver::lock`). `Err` is why the payload names no lock, in which case the acquire refused
/// it and held nothing under it.
pub type LockOf<'a> = &'a (dyn Fn(&Value) -> Result<LockName, HandlerError> + Sync);

/// How an acquire payload's lock and waiter are resolved (`Resolver::waiter`): `None` for
/// an acquire payload that does not wait, or one that names no valid place.
pub type WaiterOf<'a> = &'a (dyn Fn(&Value) -> Option<(LockName, WaiterId)> + Sync);

/// What to look for to find the locks. Without it (the sweeper, which reads the table for
/// those), only the children are read.
#[derive(Clone, Copy)]
pub struct LockReading<'a> {
    pub acquire: &'a AcquireFunction,
    pub lock_of: LockOf<'a>,
    pub waiter_of: WaiterOf<'a>,
}

/// One child execution of a `startExecution.sync` task.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChildExecution {
    pub execution_arn: String,
    /// The task that starts it is past the start: an event reports the child started, or the
    /// task failed. False when the history ends with the task's `StartExecution` call in flight
    /// (the parent ended meanwhile): a child not found may still be started by that call.
    pub settled: bool,
}

/// What the history says.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Footprint {
    /// Every lock an acquire task asked for, once each, in the order first asked.
    pub locks: Vec<LockName>,
    /// Every line an acquire task may have put the execution in (lock and waiter), once each.
    pub waiters: Vec<(LockName, WaiterId)>,
    /// Every child execution of a `startExecution.sync` task, once each, in the order started.
    pub children: Vec<ChildExecution>,
    /// What could not be told: an acquire payload that is not JSON or names no valid lock, a
    /// start task that names no child. Reported, never guessed (the sweeper, which reads the
    /// table, frees anything such a task may hold once its execution has ended). At most
    /// [`KEPT_NOTES`], the newest, and then one saying how many more there were.
    pub notes: Vec<String>,
}

/// Notes a [`Footprint`] keeps: a history of thousands of acquire checks whose payload names no
/// lock must not make an answer of thousands of lines.
pub const KEPT_NOTES: usize = 20;

/// A start task's events after its `TaskScheduled`, met first when reading newest first: kept by
/// the id of the event the earliest of them follows until the `TaskScheduled` is read.
#[derive(Debug, Default)]
struct StartTaskEnd {
    /// The child an event reports (the newest report).
    started: Option<String>,
    /// The task is past the start.
    settled: bool,
}

impl StartTaskEnd {
    /// This (from newer events) and `older`'s.
    fn and(self, older: StartTaskEnd) -> StartTaskEnd {
        StartTaskEnd {
            started: self.started.or(older.started),
            settled: self.settled || older.settled,
        }
    }
}

/// Reads a history newest first, page by page ([`Reader::read_newest_first`]), keeping what it
/// found and nothing of the events, until it reaches the event that began run `from_run`
/// ([`Reader::reached_start`]): `ExecutionStarted` for the first run, else the
/// `ExecutionRedriven` whose redrive count is that run's. Every event of that run and of every
/// later one is then read: each task of a run is scheduled after the run began (a redrive
/// schedules its tasks anew, in its own part of the history), so nothing a run asked for or
/// started lies before its start.
pub struct Reader<'a> {
    locks: Option<LockReading<'a>>,
    from_run: Run,
    /// What was found, each with the id of the event that first asked for it (the order a
    /// [`Footprint`] answers in, oldest first).
    found_locks: Vec<(i64, LockName)>,
    waiters: Vec<(i64, (LockName, WaiterId))>,
    children: Vec<(i64, ChildExecution)>,
    notes: Vec<(i64, String)>,
    notes_left_out: usize,
    pending: HashMap<i64, StartTaskEnd>,
    reached_start: bool,
    events_read: usize,
}

impl<'a> Reader<'a> {
    /// Looks for the locks too when `locks` says how (the cleanup); without it, only the
    /// children (the sweeper, which reads the table for the locks). Stops at the start of
    /// `from_run` ([`Run::FIRST`]: reads the whole history).
    pub fn new(locks: Option<LockReading<'a>>, from_run: Run) -> Self {
        Self {
            locks,
            from_run,
            found_locks: Vec::new(),
            waiters: Vec::new(),
            children: Vec::new(),
            notes: Vec::new(),
            notes_left_out: 0,
            pending: HashMap::new(),
            reached_start: false,
            events_read: 0,
        }
    }

    /// Reads `events`, newest first (a page of `GetExecutionHistory` with `reverseOrder`), up to
    /// the start of the run it reads from; the events past it are not looked at.
    pub fn read_newest_first<'e>(&mut self, events: impl IntoIterator<Item = &'e HistoryEvent>) {
        for event in events {
            if self.reached_start {
                return;
            }
            self.events_read += 1;
            self.event(event);
        }
    }

    /// Whether the read reached the event that began the run it reads from: nothing older is
    /// needed.
    pub fn reached_start(&self) -> bool {
        self.reached_start
    }

    /// Events read so far (up to the start).
    pub fn events_read(&self) -> usize {
        self.events_read
    }

    /// The run whose start ends the read.
    pub fn from_run(&self) -> Run {
        self.from_run
    }

    /// The children found so far, newest first: each is whole once found (its `TaskScheduled`,
    /// the first event of its task, is read after the rest of it).
    pub fn children(&self) -> impl Iterator<Item = &ChildExecution> {
        self.children.iter().map(|(_, child)| child)
    }

    /// What was found, in the order it was first asked for.
    pub fn finish(mut self) -> Footprint {
        // A start task whose `TaskScheduled` was not read (it lies past the start of the run
        // read from, which no task of that run can) but whose child was reported: kept, a
        // child too many is waited for, one too few could be worked in without a slot.
        let orphans: Vec<(i64, StartTaskEnd)> = self.pending.drain().collect();
        for (follows, end) in orphans {
            if let Some(arn) = end.started {
                self.child(follows, arn, true);
            }
        }
        let mut notes = in_order(self.notes);
        if self.notes_left_out > 0 {
            notes.push(format!(
                "{} more notes like these were left out",
                self.notes_left_out
            ));
        }
        Footprint {
            locks: in_order(self.found_locks),
            waiters: in_order(self.waiters),
            children: in_order(self.children),
            notes,
        }
    }

    fn event(&mut self, event: &HistoryEvent) {
        let id = event.id();
        match event.r#type() {
            Kind::ExecutionStarted => self.reached_start = true,
            Kind::ExecutionRedriven => {
                let count = event
                    .execution_redriven_event_details()
                    .and_then(|d| d.redrive_count());
                // A redrive whose count is not told is not taken for the start: read on.
                if self.from_run != Run::FIRST
                    && count.and_then(|n| u32::try_from(n).ok()) == Some(self.from_run.0)
                {
                    self.reached_start = true;
                }
            }
            Kind::TaskScheduled => {
                let end = self.pending.remove(&id);
                let Some(details) = event.task_scheduled_event_details() else {
                    return;
                };
                let (kind, resource) = (details.resource_type(), details.resource());
                if kind == "lambda" && resource.starts_with("invoke") {
                    if let Some(reading) = self.locks {
                        self.acquire_task(reading, id, details.parameters());
                    }
                } else if is_start(kind, resource) {
                    let end = end.unwrap_or_default();
                    match end
                        .started
                        .or_else(|| start_task_child(details.parameters()))
                    {
                        Some(arn) => self.child(id, arn, end.settled),
                        None => self.note(
                            id,
                            format!(
                                "the startExecution task of event {id} names no child execution \
                                 (no Name parameter, and no event reports the start)"
                            ),
                        ),
                    }
                }
            }
            Kind::LambdaFunctionScheduled => {
                let (Some(reading), Some(details)) =
                    (self.locks, event.lambda_function_scheduled_event_details())
                else {
                    return;
                };
                if reading.acquire.is(details.resource()) {
                    let payload = details.input().unwrap_or("{}");
                    self.resolve_lock(reading, id, payload);
                }
            }
            // A link of a task's chain (scheduled, started, submitted, then how it ended, each
            // naming the one before by `previousEventId`, also when branches of a Parallel or
            // Map state interleave): what its later events said passes on to the event it
            // follows.
            Kind::TaskStarted | Kind::TaskSubmitted => {
                let mut end = self.pending.remove(&id);
                if event.r#type() == &Kind::TaskSubmitted && start_task_event(event) {
                    let own = StartTaskEnd {
                        started: reported_child(event),
                        settled: true,
                    };
                    end = Some(end.unwrap_or_default().and(own));
                }
                if let Some(end) = end {
                    self.follows(event.previous_event_id(), end);
                }
            }
            Kind::TaskSucceeded
            | Kind::TaskFailed
            | Kind::TaskStartFailed
            | Kind::TaskSubmitFailed
            | Kind::TaskTimedOut
                if start_task_event(event) =>
            {
                let end = StartTaskEnd {
                    started: reported_child(event),
                    settled: true,
                };
                self.follows(event.previous_event_id(), end);
            }
            _ => {}
        }
    }

    /// `end`, from events newer than `previous`, for the task `previous` belongs to.
    fn follows(&mut self, previous: i64, end: StartTaskEnd) {
        let merged = match self.pending.remove(&previous) {
            // Already there: from a newer event, which wins.
            Some(newer) => newer.and(end),
            None => end,
        };
        self.pending.insert(previous, merged);
    }

    fn child(&mut self, id: i64, arn: String, settled: bool) {
        match self
            .children
            .iter_mut()
            .find(|(_, c)| c.execution_arn == arn)
        {
            // A redrive runs the same task again, with the same name.
            Some((first, child)) => {
                child.settled |= settled;
                *first = (*first).min(id);
            }
            None => self.children.push((
                id,
                ChildExecution {
                    execution_arn: arn,
                    settled,
                },
            )),
        }
    }

    fn note(&mut self, id: i64, note: String) {
        if self.notes.len() < KEPT_NOTES {
            self.notes.push((id, note));
        } else {
            self.notes_left_out += 1;
        }
    }

    /// A `lambda:invoke` task: if it invoked the acquire function, its payload's lock.
    fn acquire_task(&mut self, reading: LockReading<'_>, id: i64, parameters: &str) {
        let Ok(Value::Object(parameters)) = serde_json::from_str::<Value>(parameters) else {
            self.note(
                id,
                format!(
                    "the parameters of the Lambda task of event {id} are not a JSON object: if \
                     it invoked the acquire function, its lock is unknown"
                ),
            );
            return;
        };
        let Some(Value::String(function)) = parameters.get("FunctionName") else {
            return;
        };
        if !reading.acquire.is(function) {
            return;
        }
        match parameters.get("Payload") {
            Some(Value::String(text)) => self.resolve_lock(reading, id, text),
            Some(payload) => self.push_payload(reading, id, payload),
            None => self.push_payload(reading, id, &Value::Null),
        }
    }

    /// A payload given as JSON text.
    fn resolve_lock(&mut self, reading: LockReading<'_>, id: i64, text: &str) {
        match serde_json::from_str::<Value>(text) {
            Ok(payload) => self.push_payload(reading, id, &payload),
            Err(e) => self.note(
                id,
                format!("the acquire payload of event {id} is not JSON ({e}): its lock is unknown"),
            ),
        }
    }

    /// An acquire payload's lock and the waiter it may have put in line.
    fn push_payload(&mut self, reading: LockReading<'_>, id: i64, payload: &Value) {
        match (reading.lock_of)(payload) {
            Ok(lock) => first_asked(&mut self.found_locks, id, lock),
            Err(why) => self.note(
                id,
                format!(
                    "the acquire payload of event {id} names no lock, so the acquire refused it \
                     and held nothing: {why}"
                ),
            ),
        }
        if let Some(waiter) = (reading.waiter_of)(payload) {
            first_asked(&mut self.waiters, id, waiter);
        }
    }
}

/// Keeps `value` once, with the least id that asked for it.
fn first_asked<T: PartialEq>(found: &mut Vec<(i64, T)>, id: i64, value: T) {
    match found.iter_mut().find(|(_, v)| *v == value) {
        Some((first, _)) => *first = (*first).min(id),
        None => found.push((id, value)),
    }
}

/// The values, in the order of their ids.
fn in_order<T>(mut found: Vec<(i64, T)>) -> Vec<T> {
    found.sort_by_key(|(id, _)| *id);
    found.into_iter().map(|(_, value)| value).collect()
}

/// Reads a whole history given oldest first (every event, any order of pages put together).
pub fn read(events: &[HistoryEvent], locks: Option<LockReading<'_>>) -> Footprint {
    let mut reader = Reader::new(locks, Run::FIRST);
    reader.read_newest_first(events.iter().rev());
    reader.finish()
}

/// A task of the Step Functions integration that starts a child and waits for it.
fn is_start(kind: &str, resource: &str) -> bool {
    kind == "states" && resource.starts_with("startExecution.sync")
}

/// Whether a task event after the `TaskScheduled` is one of a start task (each names its
/// task's resource).
fn start_task_event(event: &HistoryEvent) -> bool {
    let resource = match event.r#type() {
        Kind::TaskStarted => event
            .task_started_event_details()
            .map(|d| (d.resource_type(), d.resource())),
        Kind::TaskSubmitted => event
            .task_submitted_event_details()
            .map(|d| (d.resource_type(), d.resource())),
        Kind::TaskSucceeded => event
            .task_succeeded_event_details()
            .map(|d| (d.resource_type(), d.resource())),
        Kind::TaskFailed => event
            .task_failed_event_details()
            .map(|d| (d.resource_type(), d.resource())),
        Kind::TaskStartFailed => event
            .task_start_failed_event_details()
            .map(|d| (d.resource_type(), d.resource())),
        Kind::TaskSubmitFailed => event
            .task_submit_failed_event_details()
            .map(|d| (d.resource_type(), d.resource())),
        Kind::TaskTimedOut => event
            .task_timed_out_event_details()
            .map(|d| (d.resource_type(), d.resource())),
        _ => None,
    };
    resource.is_some_and(|(kind, resource)| is_start(kind, resource))
}

/// The child a start task names in its parameters: `StateMachineArn` (any version or alias)
/// and `Name`.
fn start_task_child(parameters: &str) -> Option<String> {
    let parameters: Value = serde_json::from_str(parameters).ok()?;
    let machine = StateMachineArn::parse(parameters.get("StateMachineArn")?.as_str()?)?;
    let name = parameters.get("Name")?.as_str()?;
    (!name.is_empty()).then(|| machine.execution(name))
}

/// The child execution an event of a start task reports: `ExecutionArn` in the
/// `StartExecution` answer (`TaskSubmitted`), in the child's `DescribeExecution` output
/// (`TaskSucceeded`), or in the failed child's, which is the failure's cause as JSON text.
fn reported_child(event: &HistoryEvent) -> Option<String> {
    let text = match event.r#type() {
        Kind::TaskSubmitted => event.task_submitted_event_details()?.output()?,
        Kind::TaskSucceeded => event.task_succeeded_event_details()?.output()?,
        Kind::TaskFailed => event.task_failed_event_details()?.cause()?,
        _ => return None,
    };
    let value: Value = serde_json::from_str(text).ok()?;
    ["ExecutionArn", "executionArn"]
        .iter()
        .find_map(|key| value.get(key)?.as_str())
        .map(str::to_owned)
}

#[cfg(test)]
mod tests {
    //! Canned events, built with the SDK's own types: moto 5.2.5 (the local server) fails every
    //! `states:startExecution` task before it starts the child, so a `TaskSubmitted` naming a
    //! child, and a history that ends with the start in flight, cannot be recorded locally.
    //! Everything else is read from real histories in the cleanup and sweeper tests.

    use super::*;
    use aws_sdk_sfn::primitives::DateTime;
    use aws_sdk_sfn::types::{
        LambdaFunctionScheduledEventDetails, TaskFailedEventDetails, TaskScheduledEventDetails,
        TaskStartedEventDetails, TaskSubmittedEventDetails,
    };
    use serde_json::json;

    const ACQUIRE: &str = "arn:aws:lambda:us-east-1:123456789012:function:stack-acquire";
    const WORK: &str = "arn:aws:states:us-east-1:123456789012:stateMachine:work";

    fn event(
        id: i64,
        previous: i64,
        kind: Kind,
    ) -> aws_sdk_sfn::types::builders::HistoryEventBuilder {
        HistoryEvent::builder()
            .id(id)
            .previous_event_id(previous)
            .timestamp(DateTime::from_secs(0))
            .r#type(kind)
    }

    fn scheduled(id: i64, kind: &str, resource: &str, parameters: Value) -> HistoryEvent {
        event(id, id - 1, Kind::TaskScheduled)
            .task_scheduled_event_details(
                TaskScheduledEventDetails::builder()
                    .resource_type(kind)
                    .resource(resource)
                    .region("us-east-1")
                    .parameters(parameters.to_string())
                    .build()
                    .unwrap(),
            )
            .build()
            .unwrap()
    }

    fn started(id: i64, kind: &str, resource: &str) -> HistoryEvent {
        event(id, id - 1, Kind::TaskStarted)
            .task_started_event_details(
                TaskStartedEventDetails::builder()
                    .resource_type(kind)
                    .resource(resource)
                    .build()
                    .unwrap(),
            )
            .build()
            .unwrap()
    }

    fn submitted(id: i64, output: Value) -> HistoryEvent {
        event(id, id - 1, Kind::TaskSubmitted)
            .task_submitted_event_details(
                TaskSubmittedEventDetails::builder()
                    .resource_type("states")
                    .resource("startExecution.sync:2")
                    .output(output.to_string())
                    .build()
                    .unwrap(),
            )
            .build()
            .unwrap()
    }

    fn failed(id: i64, cause: &str) -> HistoryEvent {
        event(id, id - 1, Kind::TaskFailed)
            .task_failed_event_details(
                TaskFailedEventDetails::builder()
                    .resource_type("states")
                    .resource("startExecution.sync:2")
                    .error("States.TaskFailed")
                    .cause(cause)
                    .build()
                    .unwrap(),
            )
            .build()
            .unwrap()
    }

    /// The acquire function's rule in small: the payload's lock, else its input's, else
    /// "demo-lock".
    fn lock_of(payload: &Value) -> Result<LockName, HandlerError> {
        let named = payload.get("request").and_then(|r| r.get("lock"));
        match named {
            None => Ok(LockName::new("demo-lock").unwrap()),
            Some(Value::String(s)) => Ok(LockName::new(s.as_str())?),
            Some(other) => Err(HandlerError::InvalidInput(format!(
                "lock must be a string, got {other}"
            ))),
        }
    }

    fn footprint(events: &[HistoryEvent]) -> Footprint {
        let acquire = AcquireFunction::new(ACQUIRE).unwrap();
        read(
            events,
            Some(LockReading {
                acquire: &acquire,
                lock_of: &lock_of,
                waiter_of: &waiter_of,
            }),
        )
    }

    /// The acquire function's rule, through the real resolver.
    fn waiter_of(payload: &Value) -> Option<(LockName, WaiterId)> {
        let resolver = crate::Resolver {
            defaults: crate::Defaults {
                lock: Some(LockName::new("demo-lock").unwrap()),
                limit: None,
                ..crate::Defaults::default()
            },
            ..crate::Resolver::default()
        };
        resolver.waiter(payload).ok()
    }

    #[test]
    fn an_acquire_task_names_the_line_it_may_have_joined() {
        let holder = "arn:aws:states:us-east-1:123456789012:execution:LockProtected:run-1";
        let wait = |id, entered: &str| {
            invoke(
                id,
                ACQUIRE,
                serde_json::json!({
                    "request": {"lock": "l"}, "execution": holder, "redrive_count": 0,
                    "state": {"EnteredTime": entered, "RetryCount": 0},
                    "task_token": "token-1"
                }),
            )
        };
        let read = footprint(&[
            wait(1, "2026-12-03T10:15:30.123Z"),
            wait(5, "2026-12-03T10:20:30.123Z"),
        ]);
        let identity = semaphore_core::Identity::new(
            semaphore_core::HolderId::new(holder).unwrap(),
            semaphore_core::AcquisitionId::new("r0").unwrap(),
        );
        assert_eq!(
            read.waiters,
            vec![(LockName::new("l").unwrap(), WaiterId::of(&identity))],
            "one waiter, however often the task was entered"
        );
        assert_eq!(read.locks, vec![LockName::new("l").unwrap()]);
    }

    fn invoke(id: i64, function: &str, payload: Value) -> HistoryEvent {
        scheduled(
            id,
            "lambda",
            "invoke",
            json!({"FunctionName": function, "Payload": payload}),
        )
    }

    #[test]
    fn function_names_are_read_from_every_form_lambda_accepts() {
        for reference in [
            "stack-acquire",
            "stack-acquire:live",
            "123456789012:function:stack-acquire",
            ACQUIRE,
            "arn:aws:lambda:us-east-1:123456789012:function:stack-acquire:$LATEST",
        ] {
            assert_eq!(
                function_name(reference),
                Some("stack-acquire"),
                "{reference}"
            );
        }
        assert_eq!(
            function_name("arn:aws:lambda:us-east-1:1:function:my-function:prod"),
            Some("my-function")
        );
        assert_eq!(function_name(""), None);
        assert_eq!(function_name("arn:aws:lambda:us-east-1:1:function:"), None);
        let acquire = AcquireFunction::new(ACQUIRE).unwrap();
        assert!(acquire.is("stack-acquire:live"));
        assert!(!acquire.is("stack-acquire-2"));
        assert!(!acquire.is("stack-release"));
    }

    #[test]
    fn locks_come_from_the_acquire_tasks_only_once_each() {
        let events = [
            invoke(
                3,
                ACQUIRE,
                json!({"request": {"work_seconds": 1}, "execution": "h"}),
            ),
            invoke(
                8,
                "stack-acquire:live",
                json!({"request": {"lock": "orders"}, "execution": "h"}),
            ),
            invoke(13, ACQUIRE, json!({"request": {"lock": "orders"}})),
            // Another function's payload is not an acquire.
            invoke(18, "stack-release", json!({"lock": "not-mine"})),
            // A payload given as JSON text.
            invoke(
                23,
                ACQUIRE,
                Value::String(json!({"request": {"lock": "texts"}}).to_string()),
            ),
            // Refused by the acquire: nothing held.
            invoke(28, ACQUIRE, json!({"request": {"lock": 7}})),
            scheduled(33, "lambda", "invoke", json!("not an object")),
            event(38, 37, Kind::LambdaFunctionScheduled)
                .lambda_function_scheduled_event_details(
                    LambdaFunctionScheduledEventDetails::builder()
                        .resource(ACQUIRE)
                        .input(json!({"request": {"lock": "legacy"}}).to_string())
                        .build()
                        .unwrap(),
                )
                .build()
                .unwrap(),
        ];
        let read = footprint(&events);
        let locks: Vec<&str> = read.locks.iter().map(LockName::as_str).collect();
        assert_eq!(locks, ["demo-lock", "orders", "texts", "legacy"]);
        assert!(read.children.is_empty());
        assert_eq!(read.notes.len(), 2, "{:?}", read.notes);
        assert!(read.notes[0].starts_with("the acquire payload of event 28 names no lock"));
        assert!(read.notes[1].starts_with("the parameters of the Lambda task of event 33"));
        // Without a lock reading, the locks are not looked for.
        assert_eq!(read_children(&events), Footprint::default());
    }

    fn read_children(events: &[HistoryEvent]) -> Footprint {
        read(events, None)
    }

    fn start(id: i64, name: Option<&str>) -> HistoryEvent {
        let mut parameters = json!({"StateMachineArn": WORK, "Input": {}});
        if let Some(name) = name {
            parameters["Name"] = json!(name);
        }
        scheduled(id, "states", "startExecution.sync:2", parameters)
    }

    #[test]
    fn children_come_from_the_start_and_the_events_that_report_it() {
        let child =
            |name: &str| format!("arn:aws:states:us-east-1:123456789012:execution:work:{name}");
        let events = [
            // Started, reported by TaskSubmitted.
            start(1, Some("a")),
            started(2, "states", "startExecution.sync:2"),
            submitted(3, json!({"ExecutionArn": child("a"), "StartDate": 0})),
            // No name: only the report says which child.
            start(4, None),
            started(5, "states", "startExecution.sync:2"),
            submitted(6, json!({"ExecutionArn": child("generated")})),
            failed(
                7,
                &json!({"ExecutionArn": child("generated"), "Status": "FAILED"}).to_string(),
            ),
            // Failed to start (the name was taken): settled, the name's child is the one.
            start(8, Some("a")),
            started(9, "states", "startExecution.sync:2"),
            failed(10, "Execution Already Exists: ..."),
            // The parent ended during the StartExecution call: not settled.
            start(11, Some("b")),
            started(12, "states", "startExecution.sync:2"),
            // Neither a name nor a report.
            start(13, None),
        ];
        let read = read_children(&events);
        assert_eq!(
            read.children,
            [
                ChildExecution {
                    execution_arn: child("a"),
                    settled: true
                },
                ChildExecution {
                    execution_arn: child("generated"),
                    settled: true
                },
                ChildExecution {
                    execution_arn: child("b"),
                    settled: false
                },
            ]
        );
        assert_eq!(
            read.notes,
            [
                "the startExecution task of event 13 names no child execution (no Name parameter, \
              and no event reports the start)"
            ]
        );
    }

    #[test]
    fn a_lambda_task_is_never_a_child_and_a_start_task_never_a_lock() {
        let events = [
            scheduled(
                1,
                "states",
                "startExecution.sync:2",
                json!({"StateMachineArn": WORK, "Name": "a", "FunctionName": ACQUIRE, "Payload": {"lock": "x"}}),
            ),
            started(2, "states", "startExecution.sync:2"),
            // A Lambda task's outcome does not settle the start task before it.
            invoke(3, ACQUIRE, json!({"request": {"lock": "orders"}})),
            started(4, "lambda", "invoke"),
            failed(
                5,
                &json!({"ExecutionArn": "arn:aws:states:us-east-1:123456789012:execution:work:z"})
                    .to_string(),
            ),
        ];
        let read = footprint(&events);
        assert_eq!(read.locks, [LockName::new("orders").unwrap()]);
        assert_eq!(
            read.children,
            [ChildExecution {
                execution_arn: "arn:aws:states:us-east-1:123456789012:execution:work:a".to_owned(),
                settled: false
            }]
        );
    }

    fn execution_started(id: i64) -> HistoryEvent {
        event(id, 0, Kind::ExecutionStarted).build().unwrap()
    }

    fn redriven(id: i64, count: i32) -> HistoryEvent {
        event(id, id - 1, Kind::ExecutionRedriven)
            .execution_redriven_event_details(
                aws_sdk_sfn::types::ExecutionRedrivenEventDetails::builder()
                    .redrive_count(count)
                    .build(),
            )
            .build()
            .unwrap()
    }

    /// A history of two runs (moto cannot redrive: canned): run 0 started child "a" and asked
    /// for "early"; run 1 started child "b" and asked for "late".
    fn two_runs() -> Vec<HistoryEvent> {
        vec![
            execution_started(1),
            invoke(2, ACQUIRE, json!({"request": {"lock": "early"}})),
            start(3, Some("a")),
            started(4, "states", "startExecution.sync:2"),
            failed(5, "the work failed"),
            redriven(6, 1),
            invoke(7, ACQUIRE, json!({"request": {"lock": "late"}})),
            start(8, Some("b")),
            started(9, "states", "startExecution.sync:2"),
        ]
    }

    fn child(name: &str) -> String {
        format!("arn:aws:states:us-east-1:123456789012:execution:work:{name}")
    }

    #[test]
    fn a_read_from_a_redriven_run_stops_at_the_event_that_began_it() {
        let events = two_runs();
        let mut reader = Reader::new(None, Run(1));
        reader.read_newest_first(events.iter().rev());
        assert!(reader.reached_start());
        assert_eq!(reader.events_read(), 4, "events 9 to 6, nothing before");
        assert_eq!(
            reader.finish().children,
            [ChildExecution {
                execution_arn: child("b"),
                settled: false
            }]
        );

        // From the first run: every run's, to ExecutionStarted.
        let acquire = AcquireFunction::new(ACQUIRE).unwrap();
        let reading = LockReading {
            acquire: &acquire,
            lock_of: &lock_of,
            waiter_of: &waiter_of,
        };
        let mut reader = Reader::new(Some(reading), Run::FIRST);
        reader.read_newest_first(events.iter().rev());
        assert!(reader.reached_start());
        assert_eq!(reader.events_read(), events.len());
        let read = reader.finish();
        let locks: Vec<&str> = read.locks.iter().map(LockName::as_str).collect();
        assert_eq!(locks, ["early", "late"], "in the order first asked");
        assert_eq!(
            read.children,
            [
                ChildExecution {
                    execution_arn: child("a"),
                    settled: true
                },
                ChildExecution {
                    execution_arn: child("b"),
                    settled: false
                },
            ]
        );

        // A redrive that does not say its count is not taken for the start of run 1.
        let mut untold = two_runs();
        untold[5] = event(6, 5, Kind::ExecutionRedriven).build().unwrap();
        let mut reader = Reader::new(None, Run(1));
        reader.read_newest_first(untold.iter().rev());
        assert_eq!(reader.events_read(), untold.len());
        assert_eq!(reader.finish().children.len(), 2);
    }

    #[test]
    fn pages_read_newest_first_find_what_the_whole_history_says() {
        let events = two_runs();
        let acquire = AcquireFunction::new(ACQUIRE).unwrap();
        let reading = LockReading {
            acquire: &acquire,
            lock_of: &lock_of,
            waiter_of: &waiter_of,
        };
        let newest_first: Vec<HistoryEvent> = events.iter().rev().cloned().collect();
        for size in 1..=events.len() {
            let mut reader = Reader::new(Some(reading), Run::FIRST);
            for page in newest_first.chunks(size) {
                assert!(!reader.reached_start());
                reader.read_newest_first(page);
            }
            assert_eq!(reader.finish(), footprint(&events), "pages of {size}");
        }
    }

    #[test]
    fn a_start_whose_scheduling_was_not_read_still_names_its_child() {
        // The task's later events only, as a read that stopped before its TaskScheduled sees
        // them: the reported child is kept, settled.
        let events = [
            started(12, "states", "startExecution.sync:2"),
            submitted(13, json!({"ExecutionArn": child("orphan")})),
        ];
        assert_eq!(
            read_children(&events).children,
            [ChildExecution {
                execution_arn: child("orphan"),
                settled: true
            }]
        );
    }

    #[test]
    fn notes_are_kept_up_to_a_bound() {
        let events: Vec<HistoryEvent> = (1..=30)
            .map(|id| invoke(id, ACQUIRE, json!({"request": {"lock": 7}})))
            .collect();
        let read = footprint(&events);
        assert_eq!(read.notes.len(), KEPT_NOTES + 1, "{:?}", read.notes);
        assert!(
            read.notes[0].starts_with("the acquire payload of event 11 names no lock"),
            "the newest are kept: {}",
            read.notes[0]
        );
        assert_eq!(
            read.notes[KEPT_NOTES],
            "10 more notes like these were left out"
        );
    }
}
