//! The release handler invoked with the payloads statemachines/lock-protected.asl.json renders
//! for its "Release slot" and "Release after failure" states (the acquire answer, and what a
//! Catch caught), against a fresh table on the local server. The answers go through the
//! states' ResultSelectors and the Fail state's ErrorPath and CausePath as Step Functions
//! applies them, so every field they read must be there: the error normalisation is checked
//! end to end for a failed child (in moto's shape and in AWS's), a redrive that met the child
//! that already ran, and an error passed on as caught.

use std::collections::BTreeSet;

use lambda_common::{Resolver, Settings};
use lambda_runtime::{Context, Diagnostic, LambdaEvent};
use local_aws::asl::{self, Context as Ctx};
use local_aws::foreign::put_foreign_item;
use local_aws::names::{id, limit, lock};
use local_aws::observe::{observe, raw_item};
use local_aws::sfn::{client as sfn_client, create_machine, ended, start, unique};
use local_aws::{all_items, fresh_table, sdk_config};
use semaphore_core::flow::answer::child_execution_name;
use semaphore_core::{
    rfc3339_millis, AcquireOutcome, DynamoStore, ExecutionState, ExecutionStatus, FenceKey,
    FenceReason, HolderId, PortError, Run, Semaphore, Terms, Weight,
};
use serde_json::{json, Value};

const HOLDER: &str = "arn:aws:states:us-east-1:123456789012:execution:LockProtected:run-1";
const ACQUISITION: &str = "3f1c2a9e-5b7d-4c4c-8d8d-0123456789ab";
const DEMO: &str = "arn:aws:states:us-east-1:123456789012:stateMachine:demo-work";

/// Hand-offs through the local server's Step Functions, as the function's `main` builds them.
fn hand_offs() -> lambda_common::SfnHandOffs {
    Settings::from_lookup(|_| None)
        .hand_offs(&sdk_config())
        .expect("settings")
}

async fn semaphore() -> Semaphore<DynamoStore> {
    // Before any test takes its request time: the definitions it plays come from the stack.
    asl::deploy();
    let table = fresh_table().await.table().to_owned();
    Settings::from_lookup(move |name| (name == "TABLE_NAME").then(|| table.clone()))
        .semaphore(&sdk_config())
        .expect("settings")
}

/// The release function's resolver with `DEFAULT_LOCK` = demo-lock, as the template sets it.
fn resolver() -> Resolver {
    lambda_release::resolver(&Settings::from_lookup(|name| {
        (name == "DEFAULT_LOCK").then(|| "demo-lock".to_owned())
    }))
    .expect("settings")
}

async fn release_with(
    sem: &Semaphore<DynamoStore>,
    resolver: &Resolver,
    payload: Value,
) -> Result<Value, Diagnostic> {
    lambda_release::handle(
        sem,
        resolver,
        &hand_offs(),
        LambdaEvent::new(payload, Context::default()),
    )
    .await
    .map(|answer| serde_json::to_value(answer).expect("the answer serializes"))
    .map_err(Diagnostic::from)
}

async fn release(sem: &Semaphore<DynamoStore>, payload: Value) -> Result<Value, Diagnostic> {
    release_with(sem, &resolver(), payload).await
}

/// The fencing token an acquire answered.
fn token(outcome: AcquireOutcome) -> u64 {
    match outcome {
        AcquireOutcome::Acquired { token, .. } | AcquireOutcome::AlreadyHeld { token, .. } => {
            token.0
        }
        other => panic!("expected a slot, got {other:?}"),
    }
}

/// The token of the slot `holder`'s `acquisition` holds on `lock` now: the one its acquire
/// answered, which its release shows.
async fn held_token(
    sem: &Semaphore<DynamoStore>,
    lock_name: &str,
    holder: &str,
    acquisition: &str,
) -> u64 {
    sem.status(&lock(lock_name)).await.unwrap().holders[&id(holder, acquisition)]
        .token
        .0
}

/// The executions as the local server describes them, but for the run they are in: moto cannot
/// redrive an execution (its redriveCount is always 0), so a redriven one's run is canned.
struct InRun<X> {
    inner: X,
    run: Run,
}

impl<X: ExecutionStatus> ExecutionStatus for InRun<X> {
    async fn describe(&self, holder: &HolderId) -> Result<ExecutionState, PortError> {
        self.inner.describe(holder).await
    }

    async fn current_run(&self, _holder: &HolderId) -> Result<Option<Run>, PortError> {
        Ok(Some(self.run))
    }
}

fn now(sem: &Semaphore<DynamoStore>) -> String {
    rfc3339_millis(sem.now_ms())
}

/// The state after "Acquire slot" took slot `token` for run 0 of `HOLDER` on demo-lock: its
/// ResultPath "$.semaphore" puts the answer there (the acquire's own tests check the answer).
fn acquired_state(token: u64) -> Value {
    let name = child_execution_name(&id(HOLDER, "r0"));
    json!({"semaphore": {
        "acquired": true, "outcome": "acquired", "token": token, "count": 1, "limit": 5,
        "weight": 1, "rate": null, "lock": "demo-lock", "holder": HOLDER, "acquisition": "r0",
        "child_name": name, "queued_at": null,
        "work": {"state_machine": DEMO, "name": name, "context": {"semaphore": {
            "lock": "demo-lock", "fencing_token": token, "holder": HOLDER, "acquisition": "r0"
        }}}
    }})
}

#[tokio::test]
async fn release_slot_resolves_the_lock_and_acquisition_as_the_acquire_did_and_is_idempotent() {
    let sem = semaphore().await;
    let definition = asl::definition("lock-protected.asl.json");
    let release_state = asl::state(&definition, "Release slot");
    // Run 0 of the execution holds a slot of the lock its input names.
    let input = json!({"lock": "batch", "limit": 2});
    sem.acquire(&lock("batch"), &id(HOLDER, "r0"), limit(2))
        .await
        .unwrap();
    let other = "arn:aws:states:us-east-1:123456789012:execution:LockProtected:run-2";
    sem.acquire(&lock("batch"), &id(other, "r0"), limit(2))
        .await
        .unwrap();

    let ctx = Ctx::new(HOLDER, input.clone(), &now(&sem));
    // After the work: the acquire answer (the lock the input named) and the work's output.
    let mut state = acquired_state(1);
    state["semaphore"]["lock"] = json!("batch");
    state["semaphore"]["limit"] = json!(2);
    state["work"] = json!({"output": {}});
    let payload = asl::render(&release_state["Parameters"]["Payload"], &state, &ctx);
    // The acquire answer, not the execution input (which may be near 256 KiB).
    assert_eq!(payload, json!({"semaphore": state["semaphore"]}));
    let first = release(&sem, payload.clone()).await.unwrap();
    assert_eq!(
        first
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect::<BTreeSet<_>>(),
        BTreeSet::from([
            "released",
            "outcome",
            "count",
            "lock",
            "acquisition",
            "handed_off",
            "error",
            "cause"
        ])
    );
    assert_eq!(
        first,
        json!({"released": true, "outcome": "released", "count": 1, "lock": "batch",
               "acquisition": "r0", "handed_off": 0, "error": null, "cause": null})
    );
    let output = asl::task_output(release_state, &state, &ctx, json!({"Payload": first}));
    assert_eq!(output["release"], json!({"released": true}));

    // A retried release (the response was lost) frees nothing and answers with the same count.
    // It sends its one write again, which is refused (the slot whose token it shows is gone,
    // and its fence there): nothing is written, not even the version.
    let before = sem.status(&lock("batch")).await.unwrap();
    let again = release(&sem, payload).await.unwrap();
    assert_eq!(
        (&again["released"], &again["outcome"], &again["count"]),
        (&json!(false), &json!("not_held"), &json!(1))
    );
    let item = sem.status(&lock("batch")).await.unwrap();
    assert_eq!(item.version, before.version);
    assert_eq!(
        (&item.holders, &item.fences.len(), &item.limit),
        (&before.holders, &before.fences.len(), &before.limit)
    );
    assert!(item.holders.contains_key(&id(other, "r0")));
    assert!(item.is_fenced(&FenceKey::acquisition(&id(HOLDER, "r0"))));

    // The acquisition is fenced: a late attempt of the same acquire cannot take a slot (F3).
    assert_eq!(
        sem.acquire(&lock("batch"), &id(HOLDER, "r0"), limit(2))
            .await
            .unwrap(),
        AcquireOutcome::Fenced(FenceReason::AcquisitionReleased)
    );
}

#[tokio::test]
async fn an_answer_naming_any_acquisition_is_released_without_any_default() {
    let sem = semaphore().await;
    let token = token(
        sem.acquire(&lock("demo-lock"), &id(HOLDER, ACQUISITION), limit(5))
            .await
            .unwrap(),
    );
    let payload = json!({"semaphore": {"lock": "demo-lock", "holder": HOLDER,
                                       "acquisition": ACQUISITION, "token": token}});
    // No default needed: everything is given.
    let bare = Resolver::default();
    assert_eq!(
        release_with(&sem, &bare, payload.clone()).await.unwrap(),
        json!({"released": true, "outcome": "released", "count": 0, "lock": "demo-lock",
               "acquisition": ACQUISITION, "handed_off": 0, "error": null, "cause": null})
    );
    assert_eq!(
        release_with(&sem, &bare, payload).await.unwrap()["outcome"],
        json!("not_held")
    );
}

/// F15: an answer whose slot no acquire ever took (a payload made up, or another stack's) holds
/// nothing and frees nothing, and writes nothing either: a release shows a token only once its
/// acquire took the slot, and whatever freed that slot fenced its acquisition, so nothing is
/// left to fence, and a caller cannot fence an acquisition that is not its own. (The operator's
/// release, `semctl release` without `--token`, fences an acquisition that holds nothing:
/// tests/tests/weights.rs.)
#[tokio::test]
async fn releasing_what_was_never_acquired_frees_and_writes_nothing() {
    let sem = semaphore().await;
    let answer = release(&sem, acquired_state(1)).await.unwrap();
    assert_eq!(
        (&answer["released"], &answer["outcome"], &answer["count"]),
        (&json!(false), &json!("not_held"), &json!(0))
    );
    assert!(all_items(&sem).await.is_empty(), "nothing was written");
    // Its acquire is not fenced by someone else's release of it.
    assert!(matches!(
        sem.acquire(&lock("demo-lock"), &id(HOLDER, "r0"), limit(5))
            .await
            .unwrap(),
        AcquireOutcome::Acquired { .. }
    ));
}

/// What moto's `startExecution.sync:2` puts in the Cause when the child fails: the child's
/// `DescribeExecution` output (keys as the API names them, input and output parsed) as JSON.
fn moto_child_cause(child: &str, error: Option<&str>, cause: Option<&str>, status: &str) -> String {
    let mut description = json!({
        "executionArn": child,
        "stateMachineArn": DEMO,
        "name": child.rsplit(':').next().unwrap(),
        "status": status,
        "startDate": "2026-12-03T10:15:30.123456+00:00",
        "stopDate": "2026-12-03T10:15:31.123456+00:00",
        "input": {"fail": true, "semaphore": {"lock": "demo-lock", "fencing_token": 1}},
        "inputDetails": {"included": true}
    });
    if let Some(error) = error {
        description["error"] = json!(error);
    }
    if let Some(cause) = cause {
        description["cause"] = json!(cause);
    }
    description.to_string()
}

/// The same failure as AWS's Step Functions words it: keys in PascalCase, input as text, dates
/// as epoch milliseconds.
fn aws_child_cause(child: &str, error: &str, cause: &str) -> String {
    json!({
        "ExecutionArn": child,
        "Input": "{\"fail\":true}",
        "InputDetails": {"Included": true},
        "Name": child.rsplit(':').next().unwrap(),
        "RedriveCount": 0,
        "RedriveStatus": "REDRIVABLE",
        "StartDate": 1_796_292_930_123u64,
        "StateMachineArn": DEMO,
        "Status": "FAILED",
        "StopDate": 1_796_292_931_123u64,
        "Error": error,
        "Cause": cause
    })
    .to_string()
}

/// The failure path played: "Protected work" (entered with `state`) fails with `error` and
/// `cause`; its Catch goes to "Release after failure", whose answer the Fail state fails with.
/// Answers the release's answer and the (error, cause) the execution fails with.
async fn fail_the_work(
    sem: &Semaphore<DynamoStore>,
    ctx: &Ctx,
    state: &Value,
    error: &str,
    cause: &str,
) -> (Value, (String, String)) {
    let definition = asl::definition("lock-protected.asl.json");
    let work = asl::state(&definition, "Protected work");
    let catcher = asl::catcher(work, error);
    let caught = asl::caught(catcher, state, error, cause);
    let release_state = asl::state(&definition, catcher["Next"].as_str().unwrap());
    let payload = asl::render(&release_state["Parameters"]["Payload"], &caught, ctx);
    // The acquire answer and what the Catch caught, not the execution input beside the
    // cause, which carries the child's input.
    assert_eq!(
        payload,
        json!({
            "semaphore": state["semaphore"],
            "error": {"Error": error, "Cause": cause}
        })
    );
    let answer = release(sem, payload).await.unwrap();
    let output = asl::task_output(release_state, &caught, ctx, json!({"Payload": answer}));
    let fail = asl::state(&definition, release_state["Next"].as_str().unwrap());
    (answer, asl::fail(fail, &output))
}

#[tokio::test]
async fn a_failed_child_releases_the_slot_and_fails_the_execution_with_the_childs_error() {
    let input = json!({"fail": true});
    let child = format!(
        "arn:aws:states:us-east-1:123456789012:execution:demo-work:{}",
        child_execution_name(&id(HOLDER, "r0"))
    );
    let asked = "The execution input asked the work to fail (\"fail\": true).";
    let causes = [
        moto_child_cause(&child, Some("WorkFailed"), Some(asked), "FAILED"),
        aws_child_cause(&child, "WorkFailed", asked),
    ];
    for cause in causes {
        // A table of its own for each: the release fences r0.
        let sem = semaphore().await;
        sem.acquire(&lock("demo-lock"), &id(HOLDER, "r0"), limit(5))
            .await
            .unwrap();
        let ctx = Ctx::new(HOLDER, input.clone(), &now(&sem));
        let (answer, failed) =
            fail_the_work(&sem, &ctx, &acquired_state(1), "States.TaskFailed", &cause).await;
        assert_eq!(
            (&answer["released"], &answer["acquisition"]),
            (&json!(true), &json!("r0")),
            "{cause}"
        );
        assert_eq!(
            failed,
            ("WorkFailed".to_owned(), asked.to_owned()),
            "{cause}"
        );
        assert_eq!(sem.status(&lock("demo-lock")).await.unwrap().count(), 0);
    }

    // A child that failed without a cause: its error, and a cause that says so.
    let sem = semaphore().await;
    let ctx = Ctx::new(HOLDER, input.clone(), &now(&sem));
    let cause = moto_child_cause(&child, Some("WorkFailed"), None, "FAILED");
    let (_, failed) =
        fail_the_work(&sem, &ctx, &acquired_state(1), "States.TaskFailed", &cause).await;
    assert_eq!(
        failed,
        (
            "WorkFailed".to_owned(),
            format!(
                "the work execution {child} ended FAILED with the error WorkFailed and no cause"
            )
        )
    );

    // A child stopped without an error (ABORTED): nothing of its own to say, so the error is
    // passed on as caught.
    let cause = moto_child_cause(&child, None, None, "ABORTED");
    let (_, failed) =
        fail_the_work(&sem, &ctx, &acquired_state(1), "States.TaskFailed", &cause).await;
    assert_eq!(failed, ("States.TaskFailed".to_owned(), cause));
}

#[tokio::test]
async fn a_redrive_that_meets_the_child_that_already_ran_fails_with_semaphore_redrive_refused() {
    let sem = semaphore().await;
    let input = json!({"work_seconds": 60});
    // Run 0 held a slot and started its child; it was aborted, and its cleanup freed the slot.
    sem.acquire(&lock("demo-lock"), &id(HOLDER, "r0"), limit(5))
        .await
        .unwrap();
    sem.cleanup(&lock("demo-lock"), &HolderId::new(HOLDER).unwrap())
        .await
        .unwrap();
    // Redriven from "Protected work", run 1 starts the child with the name it had (the state's
    // input is run 0's): Step Functions refuses, the execution exists.
    let name = child_execution_name(&id(HOLDER, "r0"));
    let child = format!("arn:aws:states:us-east-1:123456789012:execution:demo-work:{name}");
    // As moto words it (AWS's text has the same quoted ARN).
    let cause = format!(
        "Execution Already Exists: '{child}' (Service: AWSStepFunctions; Status Code: 400; Error \
         Code: ExecutionAlreadyExists; Request ID: 1a2b; Proxy: null)"
    );
    let ctx = Ctx::new(HOLDER, input.clone(), &now(&sem)).redriven(1);
    let before = sem.status(&lock("demo-lock")).await.unwrap();
    let (answer, failed) = fail_the_work(
        &sem,
        &ctx,
        &acquired_state(1),
        "StepFunctions.ExecutionAlreadyExistsException",
        &cause,
    )
    .await;
    // The state is run 0's: its answer names r0, whose slot the cleanup freed: nothing to
    // free, and nothing written (the cleanup's fence of run 0 refuses any acquire of r0).
    assert_eq!(
        (
            &answer["released"],
            &answer["acquisition"],
            &answer["count"]
        ),
        (&json!(false), &json!("r0"), &json!(before.count()))
    );
    assert_eq!(
        failed,
        (
            "SemaphoreRedriveRefused".to_owned(),
            format!(
                "{HOLDER} was redriven into its protected work, but the work's child execution \
                 {child} already ran: its slot was freed when the execution ended, so the work \
                 is not run again without one. Start a new execution to run the work again"
            )
        )
    );
    let holder = HolderId::new(HOLDER).unwrap();
    let item = sem.status(&lock("demo-lock")).await.unwrap();
    assert_eq!(item, before, "nothing was written");
    assert!(item.is_fenced(&FenceKey::execution(&holder, Run(0))));
    assert_eq!(
        sem.acquire(&lock("demo-lock"), &id(HOLDER, "r0"), limit(5))
            .await
            .unwrap(),
        AcquireOutcome::Fenced(FenceReason::ExecutionEnded)
    );
}

/// Issue 18, item 9 (F11). On AWS, StartExecution with the name and input of a RUNNING
/// execution succeeds and returns that execution; only a closed one, or other input, is
/// ExecutionAlreadyExists (StartExecution API reference: "idempotent"). The local server does
/// the same (moto 5.2.5's `_handle_name_input_idempotency`; this test fails if it stops doing
/// so). So a run redriven into "Protected work" while the first run's child still runs (the
/// parent was stopped mid-work, and neither Step Functions' best-effort stop nor the cleanup
/// has stopped the child yet) re-attaches to that child and works under the first run's slot.
/// The cleanup of the first run finds the execution RUNNING again and leaves its slots to it
/// (lambda-cleanup's `an_execution_running_again_since_the_event_is_left_alone`). Run 1's
/// "Release slot" must then free the first run's slot, which the state it resumed with names
/// (the answer of run 0's acquire): a release of any other acquisition would free nothing and
/// leave r0's slot to the sweeper, a false leak notice.
#[tokio::test]
async fn a_run_redriven_into_the_work_while_the_child_runs_re_attaches_and_its_release_frees_the_first_runs_slot(
) {
    let sem = semaphore().await;
    let sfn = sfn_client();
    let work = create_machine(
        &sfn,
        &unique("work"),
        &json!({"StartAt": "Work", "States": {
            "Work": {"Type": "Wait", "SecondsPath": "$.work_seconds", "End": true}
        }}),
    )
    .await;
    let demo = lock("demo-lock");
    // Run 0 took its slot and started its child, named after its acquisition; then it was
    // stopped mid-work, its child still running.
    sem.acquire(&demo, &id(HOLDER, "r0"), limit(5))
        .await
        .unwrap();
    let name = child_execution_name(&id(HOLDER, "r0"));
    let input = json!({"work_seconds": 3});
    let child = start(&sfn, &work, &name, &input).await;

    // Redriven from "Protected work", run 1 starts the child with the name and input it had
    // (the state's input is run 0's): the running child is returned, not refused.
    let again = sfn
        .start_execution()
        .state_machine_arn(&work)
        .name(&name)
        .input(input.to_string())
        .send()
        .await
        .expect("the name and input of a running execution: that execution");
    assert_eq!(again.execution_arn(), child);
    // Other input under that name is refused even while it runs.
    let other = sfn
        .start_execution()
        .state_machine_arn(&work)
        .name(&name)
        .input(json!({"work_seconds": 4}).to_string())
        .send()
        .await
        .expect_err("other input under a running execution's name");
    assert!(other.into_service_error().is_execution_already_exists());

    // Run 1 waits for the child (re-attached), which works under r0's slot; run 1 holds none.
    let item = sem.status(&demo).await.unwrap();
    assert_eq!(item.count(), 1);
    assert!(item.holders.contains_key(&id(HOLDER, "r0")));
    assert_eq!(ended(&sfn, &child).await, "SUCCEEDED");

    // Run 1's "Release slot", rendered from the definition, against the real function.
    let definition = asl::definition("lock-protected.asl.json");
    let release_state = asl::state(&definition, "Release slot");
    let ctx = Ctx::new(HOLDER, input.clone(), &now(&sem)).redriven(1);
    let mut state = acquired_state(1);
    state["work"] = json!({"output": {}});
    let payload = asl::render(&release_state["Parameters"]["Payload"], &state, &ctx);
    let answer = release(&sem, payload).await.unwrap();
    assert_eq!(
        (
            &answer["released"],
            &answer["count"],
            &answer["acquisition"]
        ),
        (&json!(true), &json!(0), &json!("r0"))
    );
    let item = sem.status(&demo).await.unwrap();
    assert_eq!(
        item.count(),
        0,
        "the first run's slot is freed by the run that used it"
    );
    assert!(item.is_fenced(&FenceKey::acquisition(&id(HOLDER, "r0"))));
    // No zombie acquire of the first run lands any more.
    assert!(matches!(
        sem.acquire(&demo, &id(HOLDER, "r0"), limit(5))
            .await
            .unwrap(),
        AcquireOutcome::Fenced(_)
    ));
    // Had run 1 acquired a slot of its own (redriven into "Acquire slot"), its answer would
    // name r1, and its release would free r1 and what the runs before it hold.
    sem.acquire(&demo, &id(HOLDER, "r1"), limit(5))
        .await
        .unwrap();
    sem.acquire(&demo, &id(HOLDER, "zombie-of-run-0"), limit(5))
        .await
        .unwrap();
    let mut state = acquired_state(3);
    state["semaphore"]["acquisition"] = json!("r1");
    let payload = asl::render(&release_state["Parameters"]["Payload"], &state, &ctx);
    // F15: the run an answer names is not believed. While Step Functions says the execution is
    // in run 0, r1's release frees r1 alone, and no run is fenced on its word.
    let answer = release(&sem, payload.clone()).await.unwrap();
    assert_eq!(answer["acquisition"], json!("r1"));
    let item = sem.status(&demo).await.unwrap();
    assert!(item.holders.contains_key(&id(HOLDER, "zombie-of-run-0")));
    // Once Step Functions says the execution is in run 1 (moto cannot redrive: RedriveExecution
    // is not emulated and every redriveCount is 0, so this one answer is canned; the rest is the
    // local server's), r1's release (here its retry: its own slot is gone) frees what the runs
    // before it hold.
    let answer = lambda_release::handle(
        &sem,
        &resolver(),
        &lambda_common::HandOffs::new(
            sfn.clone(),
            InRun {
                inner: hand_offs().executions,
                run: Run(1),
            },
        ),
        LambdaEvent::new(payload, Context::default()),
    )
    .await
    .map(|answer| serde_json::to_value(answer).expect("the answer serializes"))
    .unwrap();
    assert_eq!(answer["acquisition"], json!("r1"));
    let item = sem.status(&demo).await.unwrap();
    assert!(
        !item.holders.contains_key(&id(HOLDER, "r1")),
        "its own slot freed"
    );
    let holder = HolderId::new(HOLDER).unwrap();
    assert!(item.is_fenced(&FenceKey::execution(&holder, Run(0))));
    assert!(
        !item.holders.contains_key(&id(HOLDER, "zombie-of-run-0")),
        "what the earlier runs held is freed with it"
    );
    // The child has ended: a later redrive into the work meets its name taken (the guard).
    let closed = sfn
        .start_execution()
        .state_machine_arn(&work)
        .name(&name)
        .input(input.to_string())
        .send()
        .await
        .expect_err("the name of a closed execution");
    assert!(closed.into_service_error().is_execution_already_exists());
}

#[tokio::test]
async fn any_other_error_is_passed_on_as_caught() {
    let sem = semaphore().await;
    let definition = asl::definition("lock-protected.asl.json");
    let input = json!({});
    let ctx = Ctx::new(HOLDER, input.clone(), &now(&sem));
    // The acquire's own errors are not caught there: the execution fails with them, and its
    // cleanup frees anything a lost answer may hold.
    let acquire_state = asl::state(&definition, "Acquire slot");
    for error in [
        "SemaphoreWaitTimeout",
        "SemaphoreStoreError",
        "SemaphoreFenced",
    ] {
        assert!(
            acquire_state["Catch"].as_array().unwrap().iter().all(|c| {
                !c["ErrorEquals"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|e| e == error || e == "States.ALL")
            }),
            "{error}"
        );
    }

    // A timeout of the work's task, or any error whose cause is not a child's description.
    let (_, failed) = fail_the_work(
        &sem,
        &ctx,
        &acquired_state(1),
        "States.Timeout",
        "the task timed out",
    )
    .await;
    assert_eq!(
        failed,
        ("States.Timeout".to_owned(), "the task timed out".to_owned())
    );
}

/// A weighted slot is freed whole whatever weight the release is told: the execution input's
/// (as the acquire resolved it: one write), none (the default 1), or a wrong one in the
/// payload. The core finds the holder's real weight; the lock's `used` always equals the sum of
/// the weights held.
#[tokio::test]
async fn a_weighted_release_frees_the_slots_own_weight_even_when_told_another() {
    let sem = semaphore().await;
    let definition = asl::definition("lock-protected.asl.json");
    let release_state = asl::state(&definition, "Release slot");
    let terms = |weight: i64| Terms::new(limit(6), Weight::new(weight).unwrap(), None).unwrap();
    let other = "arn:aws:states:us-east-1:123456789012:execution:LockProtected:run-2";
    let third = "arn:aws:states:us-east-1:123456789012:execution:LockProtected:run-3";
    for (holder, weight) in [(HOLDER, 3), (other, 2), (third, 1)] {
        let taken = sem
            .acquire(&lock("weighted"), &id(holder, "r0"), terms(weight))
            .await
            .unwrap();
        assert!(
            matches!(taken, AcquireOutcome::Acquired { .. }),
            "{taken:?}"
        );
    }
    let used = |sem: &Semaphore<DynamoStore>| {
        let (client, table) = (sem.store().client().clone(), sem.store().table().to_owned());
        async move {
            let seen = observe(&client, &table, "weighted").await.unwrap();
            seen.assert_safe(6);
            let mut weights = seen.weights.clone();
            weights.sort_unstable();
            (seen.used, weights)
        }
    };
    assert_eq!(used(&sem).await, (6, vec![1, 2, 3]));

    // The answer it releases with says weight 1 (what an input naming none resolves to),
    // though it holds 3.
    let ctx = Ctx::new(HOLDER, json!({"lock": "weighted", "limit": 6}), &now(&sem));
    let told = json!({"semaphore": {"lock": "weighted", "limit": 6, "weight": 1,
                                    "holder": HOLDER, "acquisition": "r0",
                                    "token": held_token(&sem, "weighted", HOLDER, "r0").await}});
    let payload = asl::render(&release_state["Parameters"]["Payload"], &told, &ctx);
    let released = release(&sem, payload.clone()).await.unwrap();
    assert_eq!(
        (&released["released"], &released["count"]),
        (&json!(true), &json!(2))
    );
    assert_eq!(used(&sem).await, (3, vec![1, 2]));
    // Idempotent: again, nothing more is freed.
    let again = release(&sem, payload).await.unwrap();
    assert_eq!(again["outcome"], json!("not_held"));
    assert_eq!(used(&sem).await, (3, vec![1, 2]));

    // An answer with a wrong weight (4 for a slot of 2).
    let released = release(
        &sem,
        json!({"semaphore": {"lock": "weighted", "holder": other, "acquisition": "r0",
                             "weight": 4,
                             "token": held_token(&sem, "weighted", other, "r0").await}}),
    )
    .await
    .unwrap();
    assert_eq!(released["released"], json!(true));
    assert_eq!(used(&sem).await, (1, vec![1]));

    // The right weight, from the acquire answer (as the acquire resolved it from the input).
    let ctx = Ctx::new(
        third,
        json!({"lock": "weighted", "limit": 6, "weight": 1}),
        &now(&sem),
    );
    let answer = json!({"semaphore": {"lock": "weighted", "limit": 6, "weight": 1,
                                      "holder": third, "acquisition": "r0",
                                      "token": held_token(&sem, "weighted", third, "r0").await}});
    let payload = asl::render(&release_state["Parameters"]["Payload"], &answer, &ctx);
    let released = release(&sem, payload).await.unwrap();
    assert_eq!(
        (&released["released"], &released["count"]),
        (&json!(true), &json!(0))
    );
    assert_eq!(used(&sem).await, (0, vec![]));
    // All 6 units are free again: one acquisition of the whole limit fits.
    let whole = sem
        .acquire(&lock("weighted"), &id("whole", "w"), terms(6))
        .await
        .unwrap();
    assert!(
        matches!(whole, AcquireOutcome::Acquired { .. }),
        "{whole:?}"
    );
}

#[tokio::test]
async fn bad_payloads_are_semaphore_invalid_input_and_write_nothing() {
    let sem = semaphore().await;
    sem.acquire(&lock("demo-lock"), &id(HOLDER, "r0"), limit(5))
        .await
        .unwrap();
    let before = all_items(&sem).await;

    let answer = || acquired_state(1);
    let with = |field: &str, value: Value| {
        let mut p = answer();
        p["semaphore"][field] = value;
        p
    };
    let without = |field: &str| {
        let mut p = answer();
        p["semaphore"].as_object_mut().unwrap().remove(field);
        p
    };
    let with_error = |error: Value| {
        let mut p = answer();
        p["error"] = error;
        p
    };
    let shape = lambda_common::RELEASE_PAYLOAD;
    let hint = "pass the acquire answer, \"semaphore.$\": \"$.semaphore\"";
    let cases: Vec<(Value, String)> =
        vec![
        (
            json!({"semaphore": "x"}),
            format!("semaphore must be a JSON object ({hint}); got a string \"x\""),
        ),
        (json!({}), format!("semaphore is missing: {hint}")),
        (
            with("lock", json!("")),
            "semaphore.lock: lock name is empty: pass the name of the semaphore, e.g. \
             \"demo-lock\""
                .into(),
        ),
        (without("lock"), format!("semaphore.lock is missing: {hint}")),
        (without("holder"), format!("semaphore.holder is missing: {hint}")),
        (
            with("holder", json!(["not", "a", "string"])),
            "semaphore.holder must be a JSON string; got an array [\"not\",\"a\",\"string\"]"
                .into(),
        ),
        (
            without("acquisition"),
            format!("semaphore.acquisition is missing: {hint}"),
        ),
        (
            with("acquisition", json!("has space")),
            "semaphore.acquisition: acquisition id contains ' '; use only letters, digits and . \
             _ : - (a UUID fits)"
                .into(),
        ),
        (
            with_error(json!("States.ALL")),
            "error must be a JSON object (what the Catch caught, \"error.$\": \"$.error\" with \
             \"ResultPath\": \"$.error\"); got a string \"States.ALL\""
                .into(),
        ),
        (
            with_error(json!({"Cause": "c"})),
            "error.Error is missing: pass what the Catch caught, {\"Error\", \"Cause\"}".into(),
        ),
        (
            with_error(json!({"Error": "E", "Cause": 5})),
            "error.Cause must be a JSON string; got a number 5".into(),
        ),
        (
            json!(17),
            format!("the payload must be a JSON object {shape}; got a number 17"),
        ),
        (
            with("weight", json!(0)),
            "semaphore.weight: weight must be a whole number from 1 to the limit (10000 at most); \
             got 0"
                .into(),
        ),
        (
            with("weight", json!("4")),
            "semaphore.weight: weight must be a whole number from 1 to the limit (10000 at most); \
             got the string \"4\""
                .into(),
        ),
        // F15: the token is what the release shows of its slot.
        (
            without("token"),
            "semaphore.token is missing: pass the acquire answer whole, \"semaphore.$\": \
             \"$.semaphore\": its token is the fencing token of the slot to free"
                .into(),
        ),
        (
            with("token", json!(0)),
            "semaphore.token: token must be the fencing token of the acquire answer, a whole \
             number from 1 to 999999999999999; got 0"
                .into(),
        ),
        (
            with("token", json!(null)),
            "semaphore.token is missing: pass the acquire answer whole, \"semaphore.$\": \
             \"$.semaphore\": its token is the fencing token of the slot to free"
                .into(),
        ),
        // F15: the run an acquisition r<n> names bounds the fences its release writes: a run no
        // execution can have (Step Functions' 25,000 events) is refused, never a fence of
        // 4,294,967,295 runs (which aborted the function) or 20,000 (a 160 KB item).
        (
            with("acquisition", json!("r4294967295")),
            "semaphore.acquisition r4294967295: run 4294967295 is past the last run an \
             execution can have (12499): Step Functions stops redriving an execution before its \
             history's 25,000 events"
                .into(),
        ),
        (
            with("acquisition", json!("r20000")),
            "semaphore.acquisition r20000: run 20000 is past the last run an execution can have \
             (12499): Step Functions stops redriving an execution before its history's 25,000 \
             events"
                .into(),
        ),
    ];
    for (bad, message) in cases {
        let err = release(&sem, bad.clone())
            .await
            .expect_err(&format!("{bad} must be refused"));
        assert_eq!(err.error_type, "SemaphoreInvalidInput", "{bad}");
        assert_eq!(err.error_message, message, "{bad}");
    }
    assert_eq!(all_items(&sem).await, before, "nothing was written");
}

/// F15: a release frees only the slot whose fencing token it shows. One that names another
/// execution's slot (a `$.semaphore` taken from the wrong branch of a Map or Parallel, another
/// tenant) with its own token, or with a token 1,000 above the slot's, is SemaphoreWrongToken,
/// and writes nothing: the slot stays with its holder, whose own release then frees it.
#[tokio::test]
async fn a_release_showing_another_slots_token_is_semaphore_wrong_token_and_writes_nothing() {
    let sem = semaphore().await;
    let other = "arn:aws:states:us-east-1:123456789012:execution:LockProtected:run-2";
    let mine = token(
        sem.acquire(&lock("demo-lock"), &id(HOLDER, "r0"), limit(5))
            .await
            .unwrap(),
    );
    let theirs = token(
        sem.acquire(&lock("demo-lock"), &id(other, "r0"), limit(5))
            .await
            .unwrap(),
    );
    let before = all_items(&sem).await;
    for shown in [mine, theirs + 1_000] {
        let payload = json!({"semaphore": {"lock": "demo-lock", "holder": other,
                                           "acquisition": "r0", "token": shown}});
        let err = release(&sem, payload).await.unwrap_err();
        assert_eq!(
            err.error_type, "SemaphoreWrongToken",
            "{}",
            err.error_message
        );
        assert!(
            err.error_message.contains(&format!(
                "holds its slot under fencing token {theirs}, and this release shows token {shown}"
            )),
            "{}",
            err.error_message
        );
        assert_eq!(all_items(&sem).await, before, "nothing was written");
    }
    // Its own answer frees it.
    let payload = json!({"semaphore": {"lock": "demo-lock", "holder": other,
                                       "acquisition": "r0", "token": theirs}});
    assert_eq!(
        release(&sem, payload).await.unwrap()["outcome"],
        json!("released")
    );
    let item = sem.status(&lock("demo-lock")).await.unwrap();
    assert_eq!(
        item.holders.keys().cloned().collect::<Vec<_>>(),
        [id(HOLDER, "r0")]
    );
}

#[tokio::test]
async fn an_item_without_a_format_is_the_named_error_semaphore_unknown_format_and_nothing_is_written(
) {
    let sem = semaphore().await;
    let (client, table) = (sem.store().client(), sem.store().table());
    // The slot this release frees, held in an item of no format.
    let foreign = put_foreign_item(client, table, "demo-lock", HOLDER, "r0", None).await;
    let err = release(&sem, acquired_state(1)).await.unwrap_err();
    assert_eq!(err.error_type, "SemaphoreUnknownFormat");
    assert!(
        err.error_message
            .contains("\"demo-lock\" has no format attribute, not a format this version reads"),
        "{}",
        err.error_message
    );
    assert_eq!(
        raw_item(client, table, "demo-lock").await,
        Some(foreign),
        "the item is left exactly as it was"
    );
}
