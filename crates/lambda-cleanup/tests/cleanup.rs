//! The cleanup handler against the local server: real executions on its Step Functions (moto's
//! execution mode), whose histories hold the tasks that invoked the acquire function, a fresh
//! table, and the documented EventBridge "Step Functions Execution Status Change" event
//! (tests/fixtures/execution-aborted.json) pointed at them; duplicate, late and out-of-order
//! deliveries included (F4).
//!
//! No Lambda function exists on the local server, so every `lambda:invoke` task fails, after
//! Step Functions recorded it (`TaskScheduled` with its parameters, as on AWS) and caught the
//! failure: the history is what an execution that asked for its slots leaves, and the tests take
//! the slots themselves, as the acquire function would have.

use semaphore_core::Claim;
use std::collections::BTreeMap;
use std::time::{SystemTime, UNIX_EPOCH};

use lambda_cleanup::{Cleanup, Config};
use lambda_common::sfn::{Described, Executions, HistoryPage, SfnClient, SfnError};
use lambda_common::Settings;
use lambda_runtime::{Context, Diagnostic, LambdaEvent};
use local_aws::counter::RequestCounter;
use local_aws::foreign::{put_foreign_item, FOREIGN_FORMAT};
use local_aws::names::{id, lock};
use local_aws::observe::{observe, raw_item};
use local_aws::sfn::{
    client as sfn_client, create_machine, end_parent_while_child_runs, ended, start, status, stop,
    unique,
};
use local_aws::{all_items, endpoint, fresh_table, sdk_config};
use semaphore_core::{
    AcquireOutcome, DynamoStore, FenceReason, ItemStore, Limit, ManualClock, MemoryStore, Semaphore,
};
use serde_json::{json, Value};

/// The acquire function as the parent machine names it (it does not exist here).
const ACQUIRE: &str = "arn:aws:lambda:us-east-1:123456789012:function:semaphore-acquire";
/// Another function, whose payloads name locks too: not an acquire.
const RELEASE: &str = "arn:aws:lambda:us-east-1:123456789012:function:semaphore-release";
const DEFAULT_LOCK: &str = "demo-lock";
/// An execution that is not the one cleaned up.
const OTHER: &str = "arn:aws:states:us-east-1:123456789012:execution:LockProtected:run-2";

fn fixture() -> Value {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/execution-aborted.json"
    );
    serde_json::from_str(&std::fs::read_to_string(path).expect("read the fixture"))
        .expect("the fixture is JSON")
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// The documented event, of `execution` ending with `status` now.
fn event(execution: &str, status: &str) -> Value {
    let (machine, name) = execution
        .rsplit_once(':')
        .expect("an execution ARN ends with its name");
    let mut event = fixture();
    event["resources"] = json!([execution]);
    let detail = &mut event["detail"];
    detail["executionArn"] = json!(execution);
    detail["stateMachineArn"] = json!(machine.replace(":execution:", ":stateMachine:"));
    detail["name"] = json!(name);
    detail["status"] = json!(status);
    detail["stopDate"] = json!(now_ms());
    event
}

/// The lock-protected machine in small: three Lambda tasks (the acquire function with the
/// execution input and no lock, so the default lock; the acquire function named by name and
/// alias with the lock "orders"; another function with a lock in its payload), each failure
/// caught, then the work (`startExecution.sync:2` of the input's `child`), or a long wait (the
/// input's `hold`: the execution runs on), or a failure.
fn parent_definition() -> Value {
    let invoke = |function: &str, payload: Value, next: &str| {
        json!({
            "Type": "Task",
            "Resource": "arn:aws:states:::lambda:invoke",
            "Parameters": {"FunctionName": function, "Payload": payload},
            "ResultPath": "$.answer",
            "Catch": [{"ErrorEquals": ["States.ALL"], "ResultPath": "$.error", "Next": next}],
            "Next": next
        })
    };
    json!({
        "StartAt": "Acquire slot",
        "States": {
            "Acquire slot": invoke(
                ACQUIRE,
                json!({
                    "request.$": "$$.Execution.Input",
                    "execution.$": "$$.Execution.Id",
                    "redrive_count.$": "$$.Execution.RedriveCount",
                    "state.$": "$$.State"
                }),
                "Acquire another"
            ),
            "Acquire another": invoke(
                "semaphore-acquire:live",
                json!({
                    "request": {"lock": "orders"},
                    "execution.$": "$$.Execution.Id",
                    "redrive_count.$": "$$.Execution.RedriveCount",
                    "state.$": "$$.State"
                }),
                "Not an acquire"
            ),
            "Not an acquire": invoke(
                RELEASE,
                json!({"semaphore": {"lock": "not-mine", "holder.$": "$$.Execution.Id"}}),
                "What next?"
            ),
            "What next?": {
                "Type": "Choice",
                "Choices": [
                    {"Variable": "$.child", "IsPresent": true, "Next": "Protected work"},
                    {"Variable": "$.hold", "IsPresent": true, "Next": "Hold"}
                ],
                "Default": "Fail"
            },
            "Protected work": {
                "Type": "Task",
                "Resource": "arn:aws:states:::states:startExecution.sync:2",
                "Parameters": {
                    "StateMachineArn.$": "$.child.machine",
                    "Name.$": "$.child.name",
                    "Input": {}
                },
                "End": true
            },
            "Hold": {"Type": "Wait", "Seconds": 600, "End": true},
            "Fail": {"Type": "Fail", "Error": "WorkFailed", "Cause": "as planned"}
        }
    })
}

/// Ten minutes of work.
fn long_work() -> Value {
    json!({"StartAt": "Work", "States": {"Work": {"Type": "Wait", "Seconds": 600, "End": true}}})
}

struct World {
    sfn: aws_sdk_sfn::Client,
    table: String,
    /// The lock-protected machine in small.
    parent: String,
    /// A user's state machine as the work.
    work: String,
    /// The work-function runner: while it runs, the Lambda function it invoked runs.
    runner: String,
}

async fn world() -> World {
    let sfn = sfn_client();
    let table = fresh_table().await.table().to_owned();
    let parent = create_machine(&sfn, &unique("Protected"), &parent_definition()).await;
    let work = create_machine(&sfn, &unique("UserWork"), &long_work()).await;
    let runner = create_machine(&sfn, &unique("WorkFunction"), &long_work()).await;
    World {
        sfn,
        table,
        parent,
        work,
        runner,
    }
}

impl World {
    fn settings(&self, table: &str) -> Settings<impl Fn(&str) -> Option<String>> {
        let vars = BTreeMap::from([
            ("TABLE_NAME", table.to_owned()),
            ("ACQUIRE_FUNCTION_ARN", ACQUIRE.to_owned()),
            ("DEFAULT_LOCK", DEFAULT_LOCK.to_owned()),
            ("WORK_FUNCTION_RUNNER", self.runner.clone()),
        ]);
        Settings::from_lookup(move |name| vars.get(name).cloned())
    }

    /// The function as its `main` builds it.
    fn cleanup(&self) -> Cleanup<DynamoStore, SfnClient> {
        Cleanup::from_settings(&self.settings(&self.table), &sdk_config()).expect("settings")
    }

    /// The function with every DynamoDB and Step Functions request counted.
    fn counted(&self, counter: &RequestCounter) -> Cleanup<DynamoStore, SfnClient> {
        let sfn = aws_sdk_sfn::config::Builder::from(&sdk_config())
            .interceptor(counter.clone())
            .build();
        let plain = self.cleanup();
        Cleanup {
            semaphore: Semaphore::new(DynamoStore::new(
                counter.dynamodb_client(endpoint()),
                &self.table,
            ))
            .with_timing(plain.semaphore.timing()),
            executions: SfnClient::new(aws_sdk_sfn::Client::from_conf(sfn)),
            config: plain.config,
            hand_offs: plain.hand_offs,
        }
    }

    /// An execution of the parent machine that asked for its locks and failed.
    async fn ended_parent(&self, input: Value) -> String {
        let execution = start(&self.sfn, &self.parent, &unique("run"), &input).await;
        assert_eq!(ended(&self.sfn, &execution).await, "FAILED");
        execution
    }

    /// An execution of the parent machine that asked for its locks and ended while its work,
    /// a child execution of `machine`, runs: (parent, child).
    async fn parent_with_running_child(&self, machine: &str) -> (String, String) {
        let name = unique("work");
        let input = json!({"child": {"machine": machine, "name": name}});
        end_parent_while_child_runs(&self.sfn, &self.parent, &input, machine, &name).await
    }
}

async fn invoke<S: ItemStore, X: Executions>(
    cleanup: &Cleanup<S, X>,
    event: Value,
) -> Result<Value, Diagnostic> {
    lambda_cleanup::handle(cleanup, LambdaEvent::new(event, Context::default()))
        .await
        .map(|summary| serde_json::to_value(summary).expect("the summary serializes"))
        .map_err(Diagnostic::from)
}

async fn take<S: ItemStore>(sem: &Semaphore<S>, lock_name: &str, holder: &str, acquisition: &str) {
    let outcome = sem
        .acquire(
            &lock(lock_name),
            &id(holder, acquisition),
            Limit::new(5).unwrap(),
        )
        .await
        .unwrap();
    assert!(
        matches!(outcome, AcquireOutcome::Acquired { .. }),
        "{outcome:?}"
    );
}

/// A late acquire of `holder` with a new acquisition: refused once the execution is fenced.
async fn late_acquire<S: ItemStore>(
    sem: &Semaphore<S>,
    lock_name: &str,
    holder: &str,
) -> AcquireOutcome {
    sem.acquire(
        &lock(lock_name),
        &id(holder, &unique("late")),
        Limit::new(5).unwrap(),
    )
    .await
    .unwrap()
}

/// (lock, acquisition, token) of every slot the summary freed (durations checked, not kept).
fn freed(summary: &Value) -> Vec<(String, String, u64)> {
    summary["locks"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|entry| {
            entry["freed"].as_array().unwrap().iter().map(|slot| {
                assert!(slot["held_for_ms"].is_u64());
                (
                    entry["lock"].as_str().unwrap().to_owned(),
                    slot["acquisition"].as_str().unwrap().to_owned(),
                    slot["token"].as_u64().unwrap(),
                )
            })
        })
        .collect()
}

fn triple(lock: &str, acquisition: &str, token: u64) -> (String, String, u64) {
    (lock.to_owned(), acquisition.to_owned(), token)
}

/// The holders of a lock, read raw (the holder map: no count is stored).
async fn holders(sem: &Semaphore<DynamoStore>, lock_name: &str) -> Vec<String> {
    let Some(seen) = observe(sem.store().client(), sem.store().table(), lock_name).await else {
        return Vec::new();
    };
    seen.assert_safe(5);
    let mut holders = seen.holders;
    holders.sort();
    holders
}

#[test]
fn the_documented_event_is_read_into_the_typed_event() {
    let event = lambda_cleanup::parse_event(fixture()).expect("the documented event parses");
    assert_eq!(event.source, "aws.states");
    assert_eq!(event.detail_type, "Step Functions Execution Status Change");
    let execution = "arn:aws:states:us-east-1:123456789012:execution:LockProtected:run-1";
    assert_eq!(
        event.resources.as_deref(),
        Some(&[execution.to_owned()][..])
    );
    let detail = &event.detail;
    assert_eq!(detail.execution_arn, execution);
    assert_eq!(
        detail.state_machine_arn,
        "arn:aws:states:us-east-1:123456789012:stateMachine:LockProtected"
    );
    assert_eq!(detail.name, "run-1");
    assert_eq!(detail.status, "ABORTED");
    assert_eq!(detail.start_date, Some(1551225014968));
    assert_eq!(detail.stop_date, Some(1551225017576));
    assert_eq!(
        detail.input.as_deref(),
        Some(r#"{"work_seconds": 30, "fail": false}"#)
    );
    assert_eq!(
        detail.input_details.as_ref().map(|d| d.included),
        Some(true)
    );
    assert_eq!(detail.output, None);
    assert_eq!(detail.redrive_count, Some(0));
}

/// Two locks, one of them not the default, found in the history with no lock configured and
/// no execution input in the event; another function's payload is not read as an acquire.
/// Per lock: the fence, then the cleanup's own fence and the free (the fence before asking
/// Step Functions again is what keeps a redrive's new slot safe); no read. A duplicate event
/// finds nothing held.
#[tokio::test]
async fn the_locks_are_read_from_the_history_and_freed_without_configuration() {
    let w = world().await;
    let parent = w.ended_parent(json!({})).await;
    let cleanup = w.cleanup();
    let sem = &cleanup.semaphore;
    take(sem, DEFAULT_LOCK, &parent, "r0").await;
    take(sem, "orders", &parent, "o1").await;
    take(sem, "not-mine", &parent, "x1").await;
    take(sem, DEFAULT_LOCK, OTHER, "b1").await;
    let counter = RequestCounter::new();
    let counted = w.counted(&counter);

    let mut no_input = event(&parent, "FAILED");
    no_input["detail"]["input"] = Value::Null;
    no_input["detail"]["inputDetails"] = json!({"included": false});
    let mut summary = invoke(&counted, no_input.clone()).await.unwrap();
    assert_eq!(
        freed(&summary),
        [triple(DEFAULT_LOCK, "r0", 1), triple("orders", "o1", 1)]
    );
    for entry in summary["locks"].as_array_mut().unwrap() {
        entry.as_object_mut().unwrap().remove("freed");
    }
    assert_eq!(
        summary,
        json!({
            "execution": parent,
            "status": "FAILED",
            "cleaned": true,
            "deferred": false,
            "retry_after_seconds": 0,
            "handed_off": 0,
            "locks": [
                {"lock": DEFAULT_LOCK, "count": 1},
                {"lock": "orders", "count": 0}
            ],
            "children": []
        })
    );
    let sent = counter.take();
    assert_eq!(
        sent.requests,
        BTreeMap::from([
            // Per lock: the fence, then the free of what it saw.
            ("DynamoDB.UpdateItem".to_owned(), 4),
            // Per lock: whether the execution is in its line (every acquire task may have
            // queued it).
            ("DynamoDB.GetItem".to_owned(), 2),
            ("SFN.DescribeExecution".to_owned(), 2),
            ("SFN.GetExecutionHistory".to_owned(), 1),
        ])
    );
    assert_eq!(sent.total_failed(), 0);

    // What the history does not name is not touched; the other execution keeps its slot.
    assert_eq!(holders(sem, "not-mine").await, [format!("{parent}#x1")]);
    assert_eq!(holders(sem, DEFAULT_LOCK).await, [format!("{OTHER}#b1")]);
    assert!(holders(sem, "orders").await.is_empty());
    // A zombie acquire of the ended execution, with any acquisition, is refused on both.
    for lock_name in [DEFAULT_LOCK, "orders"] {
        assert_eq!(
            late_acquire(sem, lock_name, &parent).await,
            AcquireOutcome::Fenced(FenceReason::ExecutionEnded)
        );
    }

    // The same event again: nothing held, both fences written again (one write each), nothing
    // freed.
    let again = invoke(&counted, no_input).await.unwrap();
    assert_eq!(again["cleaned"], json!(true));
    assert!(freed(&again).is_empty());
    assert_eq!(
        counter.take().requests.get("DynamoDB.UpdateItem").copied(),
        Some(2)
    );
    assert_eq!(holders(sem, DEFAULT_LOCK).await, [format!("{OTHER}#b1")]);
}

/// The cleanup's metrics: per lock it freed slots on, one EMF line with how many and how long
/// each was held (as its answer says), and the line's length after.
#[tokio::test]
async fn the_cleanup_writes_per_lock_the_slots_it_freed_and_how_long_they_were_held() {
    let w = world().await;
    let parent = w.ended_parent(json!({})).await;
    let mut cleanup = w.cleanup();
    let (metrics, kept) = lambda_common::Metrics::kept();
    cleanup.hand_offs.metrics = metrics;
    let sem = &cleanup.semaphore;
    take(sem, DEFAULT_LOCK, &parent, "r0").await;
    take(sem, "orders", &parent, "o1").await;
    let before = now_ms();

    let summary = invoke(&cleanup, event(&parent, "FAILED")).await.unwrap();
    let lines: Vec<Value> = kept
        .lock()
        .unwrap()
        .iter()
        .map(|line| {
            lambda_common::metrics::check_emf(line).unwrap_or_else(|e| panic!("{e}: {line}"))
        })
        .collect();
    assert_eq!(lines.len(), 2, "{lines:#?}");
    for (line, entry) in lines.iter().zip(summary["locks"].as_array().unwrap()) {
        let stamp = line["_aws"]["Timestamp"].as_u64().unwrap();
        assert!(stamp >= before && stamp <= now_ms(), "{stamp}");
        let mut members = line.clone();
        members.as_object_mut().unwrap().remove("_aws");
        assert_eq!(
            members,
            json!({
                "Lock": entry["lock"],
                "SlotsFreedByCleanup": 1,
                "TimeHeld": entry["freed"][0]["held_for_ms"],
                "Waiting": 0
            })
        );
        assert_eq!(
            line["_aws"]["CloudWatchMetrics"][0]["Dimensions"],
            json!([["Lock"]])
        );
    }
    // A duplicate event frees nothing: no slot counted, no time held.
    kept.lock().unwrap().clear();
    invoke(&cleanup, event(&parent, "FAILED")).await.unwrap();
    for line in kept.lock().unwrap().iter() {
        let line = lambda_common::metrics::check_emf(line).unwrap();
        assert!(line.get("SlotsFreedByCleanup").is_none() && line.get("TimeHeld").is_none());
    }
}

/// F7: an execution redriven since its status event runs again with the same ARN and needs
/// its slots (a redriven execution keeps its history, acquire tasks included): the cleanup
/// leaves it alone, writes nothing and does not fence it. (Moto cannot redrive: an execution
/// that is still running when its FAILED event is handled is the same situation for the
/// cleanup, which asks Step Functions first.)
#[tokio::test]
async fn an_execution_running_again_since_the_event_is_left_alone() {
    let w = world().await;
    let parent = start(&w.sfn, &w.parent, &unique("run"), &json!({"hold": true})).await;
    let cleanup = w.cleanup();
    let sem = &cleanup.semaphore;
    take(sem, DEFAULT_LOCK, &parent, "r1").await;
    let before = all_items(sem).await;
    let counter = RequestCounter::new();

    let summary = invoke(&w.counted(&counter), event(&parent, "FAILED"))
        .await
        .unwrap();
    assert_eq!(summary["cleaned"], json!(false));
    assert_eq!(summary["deferred"], json!(false));
    assert_eq!(summary["retry_after_seconds"], json!(0));
    assert_eq!(summary["locks"], json!([]));
    assert!(
        summary["note"]
            .as_str()
            .unwrap()
            .starts_with("the execution is RUNNING again: it was redriven since this event"),
        "{summary}"
    );
    assert_eq!(
        counter.take().requests,
        BTreeMap::from([("SFN.DescribeExecution".to_owned(), 1)])
    );
    assert_eq!(all_items(sem).await, before);
    // Not fenced: the running execution can still acquire.
    assert!(matches!(
        late_acquire(sem, "orders", &parent).await,
        AcquireOutcome::Acquired { .. }
    ));
    stop(&w.sfn, &parent).await;
}

/// The work is a user's state machine still running when its parent ended: stopped, then the
/// slots freed. A late duplicate finds it ended and frees nothing more.
#[tokio::test]
async fn a_running_child_state_machine_is_stopped_and_the_slots_freed() {
    let w = world().await;
    let (parent, child) = w.parent_with_running_child(&w.work).await;
    let cleanup = w.cleanup();
    let sem = &cleanup.semaphore;
    take(sem, DEFAULT_LOCK, &parent, "r0").await;
    take(sem, "orders", &parent, "o1").await;

    let summary = invoke(&cleanup, event(&parent, "ABORTED")).await.unwrap();
    assert_eq!(summary["cleaned"], json!(true));
    assert_eq!(summary["deferred"], json!(false));
    assert_eq!(
        summary["children"],
        json!([{"execution": child, "status": "RUNNING", "action": "stopped"}])
    );
    assert_eq!(
        freed(&summary),
        [triple(DEFAULT_LOCK, "r0", 1), triple("orders", "o1", 1)]
    );
    assert_eq!(status(&w.sfn, &child).await.as_deref(), Some("ABORTED"));
    assert!(holders(sem, DEFAULT_LOCK).await.is_empty());

    let late = invoke(&cleanup, event(&parent, "ABORTED")).await.unwrap();
    assert_eq!(
        late["children"],
        json!([{"execution": child, "status": "ABORTED", "action": "ended"}])
    );
    assert!(freed(&late).is_empty());
}

/// The work is a Lambda function run by the work-function runner, which cannot stop it: while
/// the runner's execution runs, the answer is deferred, the slots stay held (its work is
/// protected by them) and the execution is fenced (a late acquire of it is refused). Asking
/// again changes nothing; once the child has ended, the next call frees the slots.
#[tokio::test]
async fn a_running_work_function_defers_the_cleanup_until_it_ends() {
    let w = world().await;
    let (parent, child) = w.parent_with_running_child(&w.runner).await;
    let cleanup = w.cleanup();
    let sem = &cleanup.semaphore;
    take(sem, DEFAULT_LOCK, &parent, "r0").await;
    take(sem, "orders", &parent, "o1").await;
    take(sem, DEFAULT_LOCK, OTHER, "b1").await;

    let first = invoke(&cleanup, event(&parent, "FAILED")).await.unwrap();
    assert_eq!(
        first,
        json!({
            "execution": parent,
            "status": "FAILED",
            "cleaned": false,
            "deferred": true,
            "retry_after_seconds": 5,
            "handed_off": 0,
            "locks": [
                {"lock": DEFAULT_LOCK, "freed": [], "kept": ["r0"], "count": null},
                {"lock": "orders", "freed": [], "kept": ["o1"], "count": null}
            ],
            "children": [{"execution": child, "status": "RUNNING", "action": "waiting"}]
        })
    );
    assert_eq!(status(&w.sfn, &child).await.as_deref(), Some("RUNNING"));
    // (Sorted: OTHER's machine sorts first.)
    assert_eq!(
        holders(sem, DEFAULT_LOCK).await,
        [format!("{OTHER}#b1"), format!("{parent}#r0")]
    );
    assert_eq!(holders(sem, "orders").await, [format!("{parent}#o1")]);
    for lock_name in [DEFAULT_LOCK, "orders"] {
        assert_eq!(
            late_acquire(sem, lock_name, &parent).await,
            AcquireOutcome::Fenced(FenceReason::ExecutionEnded)
        );
    }

    // The cleanup machine's next loop: the event plus the last answer.
    let mut next = event(&parent, "FAILED");
    next["cleanup"] = json!({"deferred": true, "retry_after_seconds": 5, "summary": first});
    let second = invoke(&cleanup, next.clone()).await.unwrap();
    assert_eq!(second["deferred"], json!(true));
    assert_eq!(holders(sem, "orders").await, [format!("{parent}#o1")]);

    // The Lambda function returns: the runner's execution ends.
    stop(&w.sfn, &child).await;
    ended(&w.sfn, &child).await;
    let last = invoke(&cleanup, next).await.unwrap();
    assert_eq!(last["cleaned"], json!(true));
    assert_eq!(last["deferred"], json!(false));
    assert_eq!(last["retry_after_seconds"], json!(0));
    assert_eq!(
        last["children"],
        json!([{"execution": child, "status": "ABORTED", "action": "ended"}])
    );
    assert_eq!(
        freed(&last),
        [triple(DEFAULT_LOCK, "r0", 1), triple("orders", "o1", 1)]
    );
    assert_eq!(holders(sem, DEFAULT_LOCK).await, [format!("{OTHER}#b1")]);
    assert!(holders(sem, "orders").await.is_empty());
}

/// Late and out-of-order events: one handled before the execution's acquire lands fences it
/// (the acquire is then refused: F1, F4), one after the execution released frees nothing, and
/// a late retry of the released acquire is still refused (F3).
#[tokio::test]
async fn early_and_late_events_are_harmless() {
    let w = world().await;
    let cleanup = w.cleanup();
    let sem = &cleanup.semaphore;

    let early = w.ended_parent(json!({})).await;
    let summary = invoke(&cleanup, event(&early, "FAILED")).await.unwrap();
    assert_eq!(summary["cleaned"], json!(true));
    assert!(freed(&summary).is_empty());
    assert_eq!(
        summary["locks"],
        json!([
            {"lock": DEFAULT_LOCK, "freed": [], "count": 0},
            {"lock": "orders", "freed": [], "count": 0}
        ])
    );
    for lock_name in [DEFAULT_LOCK, "orders"] {
        assert_eq!(
            late_acquire(sem, lock_name, &early).await,
            AcquireOutcome::Fenced(FenceReason::ExecutionEnded)
        );
    }

    let released = w.ended_parent(json!({})).await;
    take(sem, "orders", &released, "o1").await;
    sem.release(&lock("orders"), &id(&released, "o1"), Claim::Operator)
        .await
        .unwrap();
    let late = invoke(&cleanup, event(&released, "TIMED_OUT"))
        .await
        .unwrap();
    assert_eq!(late["cleaned"], json!(true));
    assert!(freed(&late).is_empty());
    assert!(matches!(
        sem.acquire(
            &lock("orders"),
            &id(&released, "o1"),
            Limit::new(5).unwrap()
        )
        .await
        .unwrap(),
        AcquireOutcome::Fenced(_)
    ));
    assert!(holders(sem, "orders").await.is_empty());
}

/// What template.yaml's input transformer passes on of the event (#18 item 13): who ended,
/// how and when, no input, output, error or cause (local-run's events tests build it from the
/// template itself and check that this function reads it).
fn transformed(event: &Value) -> Value {
    let d = &event["detail"];
    json!({
        "id": event["id"], "time": event["time"], "source": event["source"],
        "detail-type": event["detail-type"],
        "detail": {
            "executionArn": d["executionArn"], "stateMachineArn": d["stateMachineArn"],
            "name": d["name"], "status": d["status"], "startDate": d["startDate"],
            "stopDate": d["stopDate"]
        }
    })
}

/// The rule passes the cleanup only what it needs; events already in flight when that was
/// deployed still come whole. Both shapes free the same slots, with the same answer.
#[tokio::test]
async fn the_transformed_event_and_the_whole_one_clean_up_alike() {
    let w = world().await;
    let cleanup = w.cleanup();
    let sem = &cleanup.semaphore;
    let mut answers = Vec::new();
    for shape in ["transformed", "whole"] {
        let execution = w.ended_parent(json!({})).await;
        take(sem, DEFAULT_LOCK, &execution, "d1").await;
        take(sem, "orders", &execution, "o1").await;
        let whole = event(&execution, "FAILED");
        let given = if shape == "transformed" {
            transformed(&whole)
        } else {
            whole
        };
        let mut summary = invoke(&cleanup, given).await.expect(shape);
        assert_eq!(summary["cleaned"], json!(true), "{shape}: {summary:#}");
        let mut slots: Vec<(String, String)> = freed(&summary)
            .into_iter()
            .map(|(lock, acquisition, _)| (lock, acquisition))
            .collect();
        slots.sort();
        assert_eq!(
            slots,
            [
                (DEFAULT_LOCK.to_owned(), "d1".to_owned()),
                ("orders".to_owned(), "o1".to_owned())
            ],
            "{shape}"
        );
        assert!(holders(sem, DEFAULT_LOCK).await.is_empty(), "{shape}");
        assert_eq!(
            late_acquire(sem, "orders", &execution).await,
            AcquireOutcome::Fenced(FenceReason::ExecutionEnded),
            "{shape}"
        );
        // The same answer but for the execution's name and the slots' times and tokens.
        summary["execution"] = json!(null);
        for entry in summary["locks"].as_array_mut().unwrap() {
            entry["freed"] = json!(null);
        }
        answers.push(summary);
    }
    assert_eq!(answers[0], answers[1]);
}

#[tokio::test]
async fn other_statuses_are_a_no_op_that_writes_and_asks_nothing() {
    let w = world().await;
    let parent = w.ended_parent(json!({})).await;
    let counter = RequestCounter::new();
    let cleanup = w.counted(&counter);
    for status in ["RUNNING", "SUCCEEDED", "PENDING_REDRIVE"] {
        let summary = invoke(&cleanup, event(&parent, status)).await.unwrap();
        assert_eq!(
            summary,
            json!({
                "execution": parent,
                "status": status,
                "cleaned": false,
                "deferred": false,
                "retry_after_seconds": 0,
                "handed_off": 0,
                "locks": [],
                "children": [],
                "note": format!("status {status} needs no cleanup (only FAILED, TIMED_OUT, ABORTED do): nothing done"),
            })
        );
    }
    assert_eq!(counter.take().total(), 0);
}

/// An execution that does not exist (the fixture's, which never ran here) has no history to
/// read: reported, nothing written (the sweeper frees what such a holder holds). One that never
/// invoked the acquire function has nothing to clean.
#[tokio::test]
async fn an_execution_without_a_history_or_without_an_acquire_is_reported() {
    let w = world().await;
    let cleanup = w.cleanup();
    let summary = invoke(&cleanup, fixture()).await.unwrap();
    assert_eq!(summary["cleaned"], json!(false));
    assert_eq!(summary["deferred"], json!(false));
    assert!(
        summary["note"]
            .as_str()
            .unwrap()
            .starts_with("the execution does not exist (any more)"),
        "{summary}"
    );

    let no_acquire = start(&w.sfn, &w.work, &unique("work"), &json!({})).await;
    stop(&w.sfn, &no_acquire).await;
    // As EventBridge would: the event once the execution has ended (a cleanup that still finds
    // it running takes it for redriven, and leaves it).
    assert_eq!(ended(&w.sfn, &no_acquire).await, "ABORTED");
    let summary = invoke(&cleanup, event(&no_acquire, "ABORTED"))
        .await
        .unwrap();
    assert_eq!(summary["cleaned"], json!(true));
    assert_eq!(
        summary["note"],
        json!("no task of the execution invoked the acquire function (semaphore-acquire): it never asked for a slot")
    );
    assert!(all_items(&cleanup.semaphore).await.is_empty());
}

#[tokio::test]
async fn what_is_not_a_status_change_event_is_invalid_input_and_writes_nothing() {
    let w = world().await;
    let counter = RequestCounter::new();
    let cleanup = w.counted(&counter);
    let mut no_arn = fixture();
    no_arn["detail"]
        .as_object_mut()
        .unwrap()
        .remove("executionArn");
    let mut other_source = fixture();
    other_source["source"] = json!("my.app");
    let with_arn = |arn: &str| {
        let mut event = fixture();
        event["detail"]["executionArn"] = json!(arn);
        event
    };
    // F15: numbers and strings past their bounds; a reason that quotes a 100 KB value is cut.
    let with_redrive_count = |count: Value| {
        let mut event = fixture();
        event["detail"]["redriveCount"] = count;
        event
    };
    for event in [
        no_arn,
        other_source,
        json!({"lock": "demo-lock"}),
        json!("ABORTED"),
        with_arn(""),
        with_arn("run-1"),
        with_arn("arn:aws:states:us-east-1:123456789012:express:M:e:5f1c2a9e"),
        with_arn(&format!(
            "arn:aws:states:us-east-1:123456789012:execution:M:{}",
            "e".repeat(500)
        )),
        with_redrive_count(json!(4_294_967_296u64)),
        with_redrive_count(json!("r".repeat(100_000))),
    ] {
        let err = invoke(&cleanup, event.clone()).await.unwrap_err();
        let shown: String = event.to_string().chars().take(200).collect();
        assert_eq!(err.error_type, "SemaphoreInvalidInput", "{shown}");
        assert!(
            err.error_message.len() < 1_000,
            "{shown}: {}",
            err.error_message.len()
        );
    }
    assert_eq!(counter.take().total(), 0, "nothing was asked or written");
}

/// An item of a foreign format on one lock: `SemaphoreUnknownFormat`, the item left as it is, and
/// the other lock freed anyway.
#[tokio::test]
async fn an_item_of_a_foreign_format_is_the_named_error_and_the_other_locks_are_freed() {
    let w = world().await;
    let parent = w.ended_parent(json!({"lock": "old-lock"})).await;
    let cleanup = w.cleanup();
    let sem = &cleanup.semaphore;
    let (client, table) = (sem.store().client(), sem.store().table());
    let foreign = put_foreign_item(
        client,
        table,
        "old-lock",
        &parent,
        "a0",
        Some(FOREIGN_FORMAT),
    )
    .await;
    take(sem, "orders", &parent, "o1").await;

    let err = invoke(&cleanup, event(&parent, "FAILED"))
        .await
        .unwrap_err();
    assert_eq!(err.error_type, "SemaphoreUnknownFormat");
    assert!(
        err.error_message.starts_with(&format!(
            "cleanup of {parent} failed on 1 lock(s), the others were done; retrying is safe: \
             fencing on lock \"old-lock\": the item for lock \"old-lock\" is in format 99, not a \
             format this version reads"
        )),
        "{}",
        err.error_message
    );
    assert_eq!(raw_item(client, table, "old-lock").await, Some(foreign));
    assert!(holders(sem, "orders").await.is_empty());
}

#[tokio::test]
async fn store_and_step_functions_failures_are_named_errors_the_machine_retries() {
    let w = world().await;
    let parent = w.ended_parent(json!({})).await;

    let no_table =
        Cleanup::from_settings(&w.settings("no-such-semaphore-table"), &sdk_config()).unwrap();
    let err = invoke(&no_table, event(&parent, "FAILED"))
        .await
        .unwrap_err();
    assert_eq!(err.error_type, "SemaphoreStoreError");
    assert!(
        err.error_message.starts_with(&format!(
            "cleanup of {parent} failed on 2 lock(s), the others were done; retrying is safe: \
             fencing on lock \"demo-lock\": "
        )),
        "{}",
        err.error_message
    );

    // Step Functions unreachable: nothing can be concluded, nothing is written.
    let unreachable = aws_sdk_sfn::config::Builder::from(&sdk_config())
        .endpoint_url("http://127.0.0.1:9")
        .retry_config(aws_sdk_sfn::config::retry::RetryConfig::disabled())
        .build();
    let plain = w.cleanup();
    let cleanup = Cleanup {
        executions: SfnClient::new(aws_sdk_sfn::Client::from_conf(unreachable)),
        ..plain
    };
    let err = invoke(&cleanup, event(&parent, "FAILED"))
        .await
        .unwrap_err();
    assert_eq!(err.error_type, "SemaphoreStepFunctionsError");
    assert!(
        err.error_message.starts_with(&format!(
            "Step Functions DescribeExecution of {parent} failed: "
        )),
        "{}",
        err.error_message
    );
    assert!(all_items(&cleanup.semaphore).await.is_empty());
}

/// Canned, and only here: moto cannot end an execution while its `StartExecution` call is in
/// flight, so this history (the acquire task, then the work's start task with no event after
/// it) and these answers are made up. A child that is not found while its start was in flight
/// when the parent ended may still be started by that call: it is waited for, like running
/// work, for `START_IN_FLIGHT` after the parent ended; then it is taken as never started.
#[tokio::test]
async fn a_child_whose_start_was_in_flight_is_waited_for_briefly() {
    use aws_sdk_sfn::primitives::DateTime;
    use aws_sdk_sfn::types::{
        ExecutionStatus, HistoryEvent, HistoryEventType, TaskScheduledEventDetails,
        TaskStartedEventDetails,
    };

    const PARENT: &str = "arn:aws:states:us-east-1:123456789012:execution:Protected:run-1";
    const CHILD: &str = "arn:aws:states:us-east-1:123456789012:execution:UserWork:w-1";
    let stopped = 1_800_000_000_000;

    struct Canned {
        stopped: u64,
        events: Vec<HistoryEvent>,
    }

    impl Executions for Canned {
        async fn describe(&self, execution: &str) -> Result<Option<Described>, SfnError> {
            Ok((execution == PARENT).then(|| Described {
                status: ExecutionStatus::Aborted,
                state_machine_arn: "arn:aws:states:us-east-1:123456789012:stateMachine:Protected"
                    .to_owned(),
                stop_date_ms: Some(self.stopped),
                run: semaphore_core::Run::FIRST,
            }))
        }

        async fn history_page(
            &self,
            _: &str,
            _: Option<String>,
        ) -> Result<Option<HistoryPage>, SfnError> {
            Ok(Some(HistoryPage {
                events: self.events.iter().rev().cloned().collect(),
                next_token: None,
            }))
        }

        async fn stop(&self, execution: &str, _: &str, _: &str) -> Result<(), SfnError> {
            panic!("nothing runs, nothing is stopped: {execution}")
        }
    }

    let task = |id: i64, kind: &str, resource: &str, parameters: Value| {
        HistoryEvent::builder()
            .id(id)
            .previous_event_id(id - 1)
            .timestamp(DateTime::from_millis(1_799_999_990_000))
            .r#type(HistoryEventType::TaskScheduled)
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
    };
    let events = vec![
        task(
            3,
            "lambda",
            "invoke",
            json!({"FunctionName": ACQUIRE, "Payload": {"request": {"lock": "orders"}}}),
        ),
        task(
            8,
            "states",
            "startExecution.sync:2",
            json!({
                "StateMachineArn": "arn:aws:states:us-east-1:123456789012:stateMachine:UserWork",
                "Name": "w-1",
                "Input": {}
            }),
        ),
        HistoryEvent::builder()
            .id(9)
            .previous_event_id(8)
            .timestamp(DateTime::from_millis(1_799_999_990_000))
            .r#type(HistoryEventType::TaskStarted)
            .task_started_event_details(
                TaskStartedEventDetails::builder()
                    .resource_type("states")
                    .resource("startExecution.sync:2")
                    .build()
                    .unwrap(),
            )
            .build()
            .unwrap(),
    ];
    let clock = std::sync::Arc::new(ManualClock::new(stopped + 1_000));
    let w = world().await;
    let cleanup = Cleanup {
        semaphore: Semaphore::new(MemoryStore::new()).with_clock(clock.clone()),
        executions: Canned { stopped, events },
        config: Config::from_settings(&w.settings(&w.table)).unwrap(),
        hand_offs: Settings::from_lookup(|_| None)
            .hand_offs(&sdk_config())
            .unwrap(),
    };
    let sem = &cleanup.semaphore;
    take(sem, "orders", PARENT, "r0").await;

    let first = invoke(&cleanup, event(PARENT, "ABORTED")).await.unwrap();
    assert_eq!(first["deferred"], json!(true));
    assert_eq!(first["retry_after_seconds"], json!(5));
    assert_eq!(
        first["children"],
        json!([{"execution": CHILD, "status": "NOT_FOUND", "action": "waiting"}])
    );
    assert_eq!(first["locks"][0]["kept"], json!(["r0"]));
    assert_eq!(sem.status(&lock("orders")).await.unwrap().count(), 1);

    clock.advance_ms(9_000);
    let second = invoke(&cleanup, event(PARENT, "ABORTED")).await.unwrap();
    assert_eq!(second["cleaned"], json!(true));
    assert_eq!(
        second["children"],
        json!([{"execution": CHILD, "status": "NOT_FOUND", "action": "not_started"}])
    );
    assert_eq!(freed(&second), [triple("orders", "r0", 1)]);
}
