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
//! Nothing here calls AWS: it reads events (see [`crate::sfn`] for the calls).

use std::collections::HashMap;

use aws_sdk_sfn::types::{HistoryEvent, HistoryEventType as Kind};
use semaphore_core::{LockName, WaiterId};
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
    /// table, frees anything such a task may hold once its execution has ended).
    pub notes: Vec<String>,
}

/// One `startExecution.sync` task being read.
struct StartTask {
    /// From the task's parameters (`StateMachineArn` and `Name`).
    named: Option<String>,
    /// From an event reporting the start.
    started: Option<String>,
    settled: bool,
}

/// Reads an execution's history (every event, any order of pages put together, oldest first).
pub fn read(events: &[HistoryEvent], locks: Option<LockReading<'_>>) -> Footprint {
    let mut footprint = Footprint::default();
    let by_id: HashMap<i64, &HistoryEvent> = events.iter().map(|e| (e.id(), e)).collect();
    let mut tasks: Vec<(i64, StartTask)> = Vec::new();
    for event in events {
        match event.r#type() {
            Kind::TaskScheduled => {
                let Some(details) = event.task_scheduled_event_details() else {
                    continue;
                };
                let (kind, resource) = (details.resource_type(), details.resource());
                if kind == "lambda" && resource.starts_with("invoke") {
                    if let Some(reading) = locks {
                        acquire_task(&mut footprint, reading, event.id(), details.parameters());
                    }
                } else if kind == "states" && resource.starts_with("startExecution.sync") {
                    let named = start_task_child(details.parameters());
                    tasks.push((
                        event.id(),
                        StartTask {
                            named,
                            started: None,
                            settled: false,
                        },
                    ));
                }
            }
            Kind::LambdaFunctionScheduled => {
                let (Some(reading), Some(details)) =
                    (locks, event.lambda_function_scheduled_event_details())
                else {
                    continue;
                };
                if reading.acquire.is(details.resource()) {
                    let payload = details.input().unwrap_or("{}");
                    resolve_lock(&mut footprint, reading, event.id(), payload);
                }
            }
            Kind::TaskSubmitted
            | Kind::TaskSucceeded
            | Kind::TaskFailed
            | Kind::TaskStartFailed
            | Kind::TaskSubmitFailed
            | Kind::TaskTimedOut => {
                let Some(scheduled) = scheduled_by(event, &by_id) else {
                    continue;
                };
                let Some((_, task)) = tasks.iter_mut().find(|(id, _)| *id == scheduled) else {
                    continue;
                };
                task.settled = true;
                if let Some(arn) = reported_child(event) {
                    task.started = Some(arn);
                }
            }
            _ => {}
        }
    }
    for (id, task) in tasks {
        let Some(arn) = task.started.or(task.named) else {
            footprint.notes.push(format!(
                "the startExecution task of event {id} names no child execution (no Name \
                 parameter, and no event reports the start)"
            ));
            continue;
        };
        match footprint
            .children
            .iter_mut()
            .find(|c| c.execution_arn == arn)
        {
            // A redrive runs the same task again, with the same name.
            Some(child) => child.settled |= task.settled,
            None => footprint.children.push(ChildExecution {
                execution_arn: arn,
                settled: task.settled,
            }),
        }
    }
    footprint
}

/// A `lambda:invoke` task: if it invoked the acquire function, its payload's lock.
fn acquire_task(footprint: &mut Footprint, reading: LockReading<'_>, id: i64, parameters: &str) {
    let Ok(Value::Object(parameters)) = serde_json::from_str::<Value>(parameters) else {
        footprint.notes.push(format!(
            "the parameters of the Lambda task of event {id} are not a JSON object: if it \
             invoked the acquire function, its lock is unknown"
        ));
        return;
    };
    let Some(Value::String(function)) = parameters.get("FunctionName") else {
        return;
    };
    if !reading.acquire.is(function) {
        return;
    }
    match parameters.get("Payload") {
        Some(Value::String(text)) => resolve_lock(footprint, reading, id, text),
        Some(payload) => push_payload(footprint, reading, id, payload),
        None => push_payload(footprint, reading, id, &Value::Null),
    }
}

/// A payload given as JSON text.
fn resolve_lock(footprint: &mut Footprint, reading: LockReading<'_>, id: i64, text: &str) {
    match serde_json::from_str::<Value>(text) {
        Ok(payload) => push_payload(footprint, reading, id, &payload),
        Err(e) => footprint.notes.push(format!(
            "the acquire payload of event {id} is not JSON ({e}): its lock is unknown"
        )),
    }
}

/// An acquire payload's lock and the waiter it may have put in line.
fn push_payload(footprint: &mut Footprint, reading: LockReading<'_>, id: i64, payload: &Value) {
    push_lock(footprint, id, (reading.lock_of)(payload));
    if let Some(waiter) = (reading.waiter_of)(payload) {
        if !footprint.waiters.contains(&waiter) {
            footprint.waiters.push(waiter);
        }
    }
}

fn push_lock(footprint: &mut Footprint, id: i64, lock: Result<LockName, HandlerError>) {
    match lock {
        Ok(lock) if !footprint.locks.contains(&lock) => footprint.locks.push(lock),
        Ok(_) => {}
        Err(why) => footprint.notes.push(format!(
            "the acquire payload of event {id} names no lock, so the acquire refused it and \
             held nothing: {why}"
        )),
    }
}

/// The child a start task names in its parameters: `StateMachineArn` (any version or alias)
/// and `Name`.
fn start_task_child(parameters: &str) -> Option<String> {
    let parameters: Value = serde_json::from_str(parameters).ok()?;
    let machine = StateMachineArn::parse(parameters.get("StateMachineArn")?.as_str()?)?;
    let name = parameters.get("Name")?.as_str()?;
    (!name.is_empty()).then(|| machine.execution(name))
}

/// The `TaskScheduled` event an event of the same task follows: Step Functions chains a task's
/// events by `previousEventId` (scheduled, started, submitted, then how it ended), also when
/// branches of a Parallel or Map state interleave.
fn scheduled_by(event: &HistoryEvent, by_id: &HashMap<i64, &HistoryEvent>) -> Option<i64> {
    let mut at = event;
    for _ in 0..4 {
        let previous = by_id.get(&at.previous_event_id())?;
        match previous.r#type() {
            Kind::TaskScheduled => return Some(previous.id()),
            Kind::TaskStarted | Kind::TaskSubmitted => at = previous,
            _ => return None,
        }
    }
    None
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
}
