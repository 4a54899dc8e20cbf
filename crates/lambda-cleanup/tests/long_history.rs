//! The cleanup of an execution whose history is as long as Step Functions lets one be: 25,000
//! events (the quota of a standard execution), made by the local server's Step Functions (moto's
//! execution mode) running a loop of a few thousand rounds between the acquire task (the oldest
//! events) and the work (the newest). The cleanup reads the history newest first, 1,000
//! events a page (the local server pages it as AWS does), back to `ExecutionStarted`: 25
//! `GetExecutionHistory` calls, the acquire found on the last page, the running work on the
//! first, the slot freed once the work is stopped. The sweeper, which needs only to know whether
//! the work still runs, reads one page. Without the local server's paging (moto answered every
//! event at once, oldest first) the sweeper would read `ExecutionStarted` first and free the
//! slot under the running work: this test fails.
//!
//! A history longer than that cannot be made on AWS (the execution fails at the quota): its
//! named outcome is shown on a canned answer ([`Endless`]), and says so.

use std::collections::BTreeMap;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use aws_sdk_sfn::primitives::DateTime;
use aws_sdk_sfn::types::{ExecutionStatus, HistoryEvent, HistoryEventType};
use lambda_cleanup::{Cleanup, Config};
use lambda_common::arn::ArnPatterns;
use lambda_common::sfn::{
    Described, Executions, HistoryPage, SfnClient, SfnError, MAX_HISTORY_EVENTS,
};
use lambda_common::{Settings, SfnExecutions};
use lambda_runtime::{Context, LambdaEvent};
use local_aws::counter::RequestCounter;
use local_aws::names::{id, lock};
use local_aws::sfn::{client as sfn_client, create_machine, execution_arn, start, status, unique};
use local_aws::{fresh_table, sdk_config};
use semaphore_core::{AcquireOutcome, ItemStore, Limit, MemoryStore, Run, Semaphore};
use serde_json::{json, Value};

const ACQUIRE: &str = "arn:aws:lambda:us-east-1:123456789012:function:semaphore-acquire";
const LOCK: &str = "long-history";

/// Rounds of the busy loop: 4 events each (a Pass and a Choice, each entered and exited); the
/// acquire task, the loop's start, the work's start and the execution's end make about 14 more
/// (24,998 in all).
const ROUNDS: usize = 6_246;

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// The lock-protected machine in small, made long: the acquire task first (the function does
/// not exist here: the task fails after Step Functions recorded it, and is caught), then
/// [`ROUNDS`] rounds of a loop, then the work (`startExecution.sync:2` of `$.child`).
fn long_parent() -> Value {
    json!({
        "StartAt": "Acquire slot",
        "States": {
            "Acquire slot": {
                "Type": "Task",
                "Resource": "arn:aws:states:::lambda:invoke",
                "Parameters": {
                    "FunctionName": ACQUIRE,
                    "Payload": {
                        "request": {"lock": LOCK},
                        "execution.$": "$$.Execution.Id",
                        "redrive_count.$": "$$.Execution.RedriveCount",
                        "state.$": "$$.State"
                    }
                },
                "ResultPath": "$.answer",
                "Catch": [{"ErrorEquals": ["States.ALL"], "ResultPath": "$.error", "Next": "Busy"}],
                "Next": "Busy"
            },
            // A loop, not a Map: the local server copies a Map's items for each iteration,
            // and 6,000 of them took it over ten minutes; the loop makes ~1,700 events a second.
            "Busy": {"Type": "Pass", "Result": 0, "ResultPath": "$.round", "Next": "Round"},
            "Round": {
                "Type": "Pass",
                "Parameters": {
                    "round.$": "States.MathAdd($.round, 1)",
                    "child.$": "$.child"
                },
                "Next": "Again?"
            },
            "Again?": {
                "Type": "Choice",
                "Choices": [{"Variable": "$.round", "NumericLessThan": ROUNDS, "Next": "Round"}],
                "Default": "Protected work"
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
            }
        }
    })
}

/// Starts the long parent and stops it once its work (a child execution that waits) runs:
/// (parent, child).
async fn long_parent_stopped_while_its_work_runs(sfn: &aws_sdk_sfn::Client) -> (String, String) {
    let parent = create_machine(sfn, &unique("LongProtected"), &long_parent()).await;
    let work = create_machine(
        sfn,
        &unique("UserWork"),
        &json!({"StartAt": "W", "States": {"W": {"Type": "Wait", "Seconds": 600, "End": true}}}),
    )
    .await;
    let name = unique("work");
    let child = execution_arn(&work, &name);
    let input = json!({"child": {"machine": work, "name": name}});
    let building = Instant::now();
    let execution = start(sfn, &parent, &unique("run"), &input).await;
    let deadline = Instant::now() + Duration::from_secs(600);
    while status(sfn, &child).await.is_none() {
        assert_eq!(
            status(sfn, &execution).await.as_deref(),
            Some("RUNNING"),
            "{execution} ended before its work started"
        );
        assert!(
            Instant::now() < deadline,
            "{execution} never reached its work"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    sfn.stop_execution()
        .execution_arn(&execution)
        .send()
        .await
        .unwrap();
    while status(sfn, &execution).await.as_deref() == Some("RUNNING") {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    eprintln!(
        "a history of ~25,000 events made in {:.1?}",
        building.elapsed()
    );
    (execution, child)
}

fn event(execution: &str, status: &str) -> Value {
    let (machine, name) = execution.rsplit_once(':').unwrap();
    json!({
        "version": "0", "id": "e", "detail-type": "Step Functions Execution Status Change",
        "source": "aws.states", "account": "123456789012", "time": "2026-12-07T00:00:00Z",
        "region": "us-east-1", "resources": [execution],
        "detail": {
            "executionArn": execution,
            "stateMachineArn": machine.replace(":execution:", ":stateMachine:"),
            "name": name, "status": status, "startDate": now_ms(), "stopDate": now_ms()
        }
    })
}

fn settings(table: &str) -> Settings<impl Fn(&str) -> Option<String>> {
    let vars = BTreeMap::from([
        ("TABLE_NAME", table.to_owned()),
        ("ACQUIRE_FUNCTION_ARN", ACQUIRE.to_owned()),
    ]);
    Settings::from_lookup(move |name| vars.get(name).cloned())
}

async fn invoke<S: ItemStore, X: Executions>(cleanup: &Cleanup<S, X>, event: Value) -> Value {
    let summary = lambda_cleanup::handle(cleanup, LambdaEvent::new(event, Context::default()))
        .await
        .unwrap_or_else(|e| panic!("{e:?}"));
    serde_json::to_value(summary).unwrap()
}

async fn take<S: ItemStore>(sem: &Semaphore<S>, holder: &str) {
    let outcome = sem
        .acquire(&lock(LOCK), &id(holder, "r0"), Limit::new(5).unwrap())
        .await
        .unwrap();
    assert!(
        matches!(outcome, AcquireOutcome::Acquired { .. }),
        "{outcome:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_history_of_25_000_events_is_judged_by_the_sweeper_from_its_newest_page_and_by_the_cleanup_back_to_its_acquire(
) {
    let sfn = sfn_client();
    let (parent, child) = long_parent_stopped_while_its_work_runs(&sfn).await;
    let events = local_aws::sfn::history(&sfn, &parent).await.unwrap();
    assert!(
        (MAX_HISTORY_EVENTS - 100..=MAX_HISTORY_EVENTS).contains(&events.len()),
        "a history of {} events, not just under {MAX_HISTORY_EVENTS}: set ROUNDS so that it is",
        events.len()
    );

    let table = fresh_table().await.table().to_owned();
    let counter = RequestCounter::new();
    let counted = aws_sdk_sfn::Client::from_conf(
        aws_sdk_sfn::config::Builder::from(&sdk_config())
            .interceptor(counter.clone())
            .build(),
    );
    let cleanup = Cleanup {
        executions: SfnClient::new(counted.clone()),
        ..Cleanup::from_settings(&settings(&table), &sdk_config()).unwrap()
    };
    take(&cleanup.semaphore, &parent).await;

    // The sweeper (its rule and its Step Functions side, as the function runs them): the
    // parent ended, its work is on the newest page, and still runs: the slot is kept after
    // one page.
    let executions = SfnExecutions::of_machines(counted, ArnPatterns::default());
    let swept = cleanup.semaphore.sweep(&executions).await.unwrap();
    assert!(swept.reclaimed.is_empty(), "{swept:?}");
    assert!(swept.errors.is_empty(), "{swept:?}");
    let calls = counter.take().requests;
    assert_eq!(
        calls.get("SFN.GetExecutionHistory").copied(),
        Some(1),
        "the sweeper stops at the running work: {calls:?}"
    );
    eprintln!("the sweeper judged it from 1 GetExecutionHistory call");

    let summary = invoke(&cleanup, event(&parent, "ABORTED")).await;
    assert_eq!(summary["cleaned"], json!(true), "{summary:#}");
    assert_eq!(
        summary["children"],
        json!([{"execution": child, "status": "RUNNING", "action": "stopped"}])
    );
    assert_eq!(summary["locks"][0]["lock"], json!(LOCK), "{summary:#}");
    assert_eq!(summary["locks"][0]["count"], json!(0), "{summary:#}");
    let calls = counter.take().requests;
    // Every event back to ExecutionStarted, 1,000 a page: the acquire is on the last page.
    let pages = events.len().div_ceil(1000);
    assert_eq!(
        calls.get("SFN.GetExecutionHistory").copied(),
        Some(pages as u64),
        "{calls:?}"
    );
    eprintln!(
        "cleanup read {} events in {pages} GetExecutionHistory calls",
        events.len()
    );
}

/// Canned, and only here: no standard execution's history passes 25,000 events on AWS (it
/// fails at the quota), so the pages of one that does are made up: 1,000 events each, none of
/// them the execution's start. (`pages`: how many were asked for.)
struct Endless {
    pages: std::sync::atomic::AtomicUsize,
}

const ENDLESS: &str = "arn:aws:states:us-east-1:123456789012:execution:Protected:endless";

impl Executions for Endless {
    async fn describe(&self, _: &str) -> Result<Option<Described>, SfnError> {
        Ok(Some(Described {
            status: ExecutionStatus::Failed,
            state_machine_arn: "arn:aws:states:us-east-1:123456789012:stateMachine:Protected"
                .to_owned(),
            stop_date_ms: Some(now_ms()),
            run: Run::FIRST,
        }))
    }

    async fn history_page(
        &self,
        _: &str,
        next_token: Option<String>,
    ) -> Result<Option<HistoryPage>, SfnError> {
        let page: i64 = next_token.map_or(0, |t| t.parse().unwrap());
        self.pages.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let newest = 1_000_000 - page * 1000;
        let events = (0..1000)
            .map(|n| {
                HistoryEvent::builder()
                    .id(newest - n)
                    .previous_event_id(newest - n - 1)
                    .timestamp(DateTime::from_secs(0))
                    .r#type(HistoryEventType::PassStateEntered)
                    .build()
                    .unwrap()
            })
            .collect();
        Ok(Some(HistoryPage {
            events,
            next_token: Some((page + 1).to_string()),
        }))
    }

    async fn stop(&self, execution: &str, _: &str, _: &str) -> Result<(), SfnError> {
        panic!("nothing is stopped: {execution}")
    }
}

#[tokio::test]
async fn a_history_too_long_to_judge_is_said_so_by_name_and_nothing_is_freed() {
    let table = fresh_table().await.table().to_owned();
    let plain = Cleanup::from_settings(&settings(&table), &sdk_config()).unwrap();
    let cleanup = Cleanup {
        semaphore: Semaphore::new(MemoryStore::new()),
        executions: Endless {
            pages: Default::default(),
        },
        config: Config::from_settings(&settings(&table)).unwrap(),
        hand_offs: plain.hand_offs,
    };
    take(&cleanup.semaphore, ENDLESS).await;
    let summary = invoke(&cleanup, event(ENDLESS, "FAILED")).await;
    assert_eq!(summary["history_too_long"], json!(true), "{summary:#}");
    assert_eq!(summary["cleaned"], json!(false));
    assert_eq!(summary["deferred"], json!(false));
    let note = summary["note"].as_str().unwrap();
    assert!(
        note.starts_with(&format!(
            "the history of {ENDLESS} is too long to judge: 25000 events read in 25 pages"
        )),
        "{note}"
    );
    assert!(note.contains("semctl cleanup --holder"), "{note}");
    assert_eq!(
        cleanup
            .executions
            .pages
            .load(std::sync::atomic::Ordering::SeqCst),
        MAX_HISTORY_EVENTS / 1000,
        "no page past the quota is asked for"
    );
    // Nothing written: its slot is still held.
    assert_eq!(
        cleanup.semaphore.status(&lock(LOCK)).await.unwrap().count(),
        1
    );
}
