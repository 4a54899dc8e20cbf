//! The acquire handler invoked with the payloads statemachines/lock-protected.asl.json renders
//! (its context object filled in with real values), against a fresh table on the local server.
//! Each answer goes through the definition's ResultSelector, Choice, Wait in line, Protected
//! work, Release and Fail states as Step Functions would apply them, so every field they read
//! must be there. Covered: defaults from the environment, lock/limit/work from the input, a full
//! lock's line (the wait task's payload, its record, a retried wait, a fallback check, a granted
//! answer through the wait state), bad input (nothing written), the redrive guard with its fence
//! rotations, the wait budget, the named errors, and the explicit shape callers' own machines
//! send.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use lambda_acquire::Config;
use lambda_common::{child_execution_name, deferred_answer, granted_answer, Resolver, Settings};
use lambda_runtime::{Context, Diagnostic, LambdaEvent};
use local_aws::asl::{self, Context as Ctx};
use local_aws::legacy::put_version_1_item;
use local_aws::names::{id, limit, lock};
use local_aws::observe::{assert_consistent, observe, raw_item, text, RawRecord};
use local_aws::{all_items, fresh_table, sdk_config};
use semaphore_core::{
    protocol, rfc3339_millis, AcquireOutcome, Clock, DynamoStore, FenceKey, FenceReason,
    FencingToken, HolderId, ItemStore, LockName, ManualClock, QueueKey, Run, Semaphore,
    SystemClock, Timing, WriteResult,
};
use serde_json::{json, Value};

const HOLDER: &str = "arn:aws:states:us-east-1:123456789012:execution:LockProtected:run-1";
const DEMO: &str = "arn:aws:states:us-east-1:123456789012:stateMachine:demo-work";
const MINE: &str = "arn:aws:states:us-east-1:123456789012:stateMachine:my-work";
const FUNCTION: &str = "arn:aws:lambda:us-east-1:123456789012:function:my-work";
const RUNNER: &str = "arn:aws:states:us-east-1:123456789012:stateMachine:work-function";

fn holder(n: u32) -> String {
    format!("arn:aws:states:us-east-1:123456789012:execution:LockProtected:run-{n}")
}

/// The acquire function's environment as the template sets it (but for the ARNs' account).
fn env() -> Vec<(&'static str, String)> {
    vec![
        ("DEFAULT_LOCK", "demo-lock".into()),
        ("DEFAULT_LIMIT", "5".into()),
        ("DEFAULT_WORK", DEMO.into()),
        ("WORK_STATE_MACHINES", format!("{DEMO},{MINE}")),
        ("WORK_FUNCTIONS", FUNCTION.into()),
        ("WORK_FUNCTION_RUNNER", RUNNER.into()),
        ("MAX_WAIT_SECONDS", "900".into()),
    ]
}

fn settings(vars: Vec<(&'static str, String)>) -> Settings<impl Fn(&str) -> Option<String>> {
    Settings::from_lookup(move |name| {
        vars.iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| v.clone())
    })
}

/// The configuration `main` reads at cold start, from [`env`] with `overrides`.
fn config_with(overrides: &[(&'static str, &str)]) -> Config {
    let mut vars = env();
    for (name, value) in overrides {
        vars.retain(|(k, _)| k != name);
        vars.push((name, (*value).to_owned()));
    }
    Config::from_settings(&settings(vars)).expect("the test's settings")
}

fn config() -> Config {
    config_with(&[])
}

/// The release function's resolver, from the same environment.
fn release_resolver() -> Resolver {
    lambda_release::resolver(&settings(env())).expect("the test's settings")
}

/// A semaphore on a fresh table, built the way the function's `main` builds it.
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
    semaphore_on(table)
}

fn semaphore_on(table: String) -> Semaphore<DynamoStore> {
    Settings::from_lookup(move |name| (name == "TABLE_NAME").then(|| table.clone()))
        .semaphore(&sdk_config())
        .expect("settings")
}

/// A semaphore on a fresh table whose time moves only when the test says, with a fence window of
/// 2 s (horizon 1 s + skew 1 s).
async fn semaphore_with_clock() -> (Semaphore<DynamoStore>, Arc<ManualClock>) {
    let clock = Arc::new(ManualClock::new(SystemClock.now_ms()));
    let timing = Timing {
        horizon: Duration::from_secs(1),
        clock_skew: Duration::from_secs(1),
    };
    let sem = Semaphore::new(fresh_table().await)
        .with_clock(clock.clone())
        .with_timing(timing);
    (sem, clock)
}

/// Invokes the handler as the runtime does: a JSON payload and a context.
async fn acquire(
    sem: &Semaphore<DynamoStore>,
    config: &Config,
    payload: Value,
) -> Result<Value, Diagnostic> {
    lambda_acquire::handle(
        sem,
        config,
        &hand_offs(),
        LambdaEvent::new(payload, Context::default()),
    )
    .await
    .map(|answer| serde_json::to_value(answer).expect("the answer serializes"))
    .map_err(Diagnostic::from)
}

async fn release(sem: &Semaphore<DynamoStore>, payload: Value) -> Result<Value, Diagnostic> {
    lambda_release::handle(
        sem,
        &release_resolver(),
        &hand_offs(),
        LambdaEvent::new(payload, Context::default()),
    )
    .await
    .map(|answer| serde_json::to_value(answer).expect("the answer serializes"))
    .map_err(Diagnostic::from)
}

/// Now by the semaphore's clock, as Step Functions writes `$$.State.EnteredTime`.
fn now(sem: &Semaphore<DynamoStore>) -> String {
    rfc3339_millis(sem.now_ms())
}

fn keys(v: &Value) -> BTreeSet<&str> {
    v.as_object()
        .expect("an object")
        .keys()
        .map(String::as_str)
        .collect()
}

/// The two states of `definition` that call the acquire function: the acquire state (a plain
/// `lambda:invoke`, "Acquire slot") and the wait state (`lambda:invoke.waitForTaskToken`, "Wait
/// in line").
fn acquire_states(definition: &Value) -> [(&str, &Value); 2] {
    let tasks = asl::tasks_calling(definition, &asl::function_arn("acquire"));
    let of = |resource: &str| {
        let found: Vec<(&str, &Value)> = tasks
            .iter()
            .copied()
            .filter(|(_, s)| s["Resource"] == json!(resource))
            .collect();
        assert_eq!(found.len(), 1, "exactly one {resource} task calls acquire");
        found[0]
    };
    assert_eq!(
        tasks.len(),
        2,
        "two states call acquire: acquire, wait in line"
    );
    [
        of("arn:aws:states:::lambda:invoke"),
        of("arn:aws:states:::lambda:invoke.waitForTaskToken"),
    ]
}

/// The acquire state of `definition`.
fn acquire_state(definition: &Value) -> (&str, &Value) {
    acquire_states(definition)[0]
}

/// The wait state of `definition`.
fn wait_state(definition: &Value) -> (&str, &Value) {
    acquire_states(definition)[1]
}

/// Grants the head of the lock's line a slot with the core's own grant write, as a hand-off
/// does, and wakes nobody: a hand-off's `SendTaskSuccess` needs a real parked task (see
/// tests/waiting.rs). Answers the granted waiter's fencing token and its stored context (what
/// the hand-off sends, filled in by `granted_answer`).
async fn grant_head(sem: &Semaphore<DynamoStore>, lock_name: &str) -> (FencingToken, String) {
    let lock = LockName::new(lock_name).unwrap();
    let head = sem
        .waiters(&lock, None, 1)
        .await
        .unwrap()
        .pop()
        .expect("someone in line");
    let write = protocol::grant(&head, sem.now_ms());
    let result = sem.store().write(&write).await.unwrap();
    assert_eq!(result, WriteResult::Landed, "the grant landed");
    let token = sem.status(&lock).await.unwrap().holders[&head.identity].token;
    (token, head.context)
}

/// Holders <= limit and `waiting` = the records in line, read raw; answers the records.
async fn consistent(sem: &Semaphore<DynamoStore>, lock_name: &str, limit: usize) -> Vec<RawRecord> {
    let store = sem.store();
    assert_consistent(
        store.client(),
        store.table(),
        store.queue_table(),
        lock_name,
        limit,
    )
    .await
    .1
}

/// The acquire state played: its payload rendered for `ctx`, the handler invoked, and (if it
/// answered) the state's output and the state the Choice after it goes to.
struct Played {
    payload: Value,
    answer: Result<Value, Diagnostic>,
    /// The state's output (`{"semaphore": answer}`) and where the machine goes next.
    next: Option<(Value, String)>,
}

async fn play_acquire(
    sem: &Semaphore<DynamoStore>,
    config: &Config,
    ctx: &Ctx,
    state_input: &Value,
) -> Played {
    let definition = asl::definition("lock-protected.asl.json");
    let (_, acquire_state) = acquire_state(&definition);
    let payload = asl::render(&acquire_state["Parameters"]["Payload"], state_input, ctx);
    let answer = acquire(sem, config, payload.clone()).await;
    let next = answer.as_ref().ok().map(|answer| {
        let output = asl::task_output(
            acquire_state,
            state_input,
            ctx,
            json!({"Payload": answer, "StatusCode": 200}),
        );
        let choice = asl::state(&definition, acquire_state["Next"].as_str().unwrap());
        let next = asl::choose(choice, &output).to_owned();
        (output, next)
    });
    Played {
        payload,
        answer,
        next,
    }
}

/// Where an error of the acquire state goes, and what the execution fails with when it goes to
/// "Fail without a slot" directly.
fn route_acquire_error(
    error: &Diagnostic,
    state_input: &Value,
) -> (String, Option<(String, String)>) {
    let definition = asl::definition("lock-protected.asl.json");
    let (_, acquire_state) = acquire_state(&definition);
    let catcher = asl::catcher(acquire_state, &error.error_type);
    let next = catcher["Next"].as_str().unwrap().to_owned();
    let output = asl::caught(
        catcher,
        state_input,
        &error.error_type,
        &json!({"errorType": error.error_type, "errorMessage": error.error_message}).to_string(),
    );
    let target = asl::state(&definition, &next);
    let failed = (target["Type"] == "Fail").then(|| asl::fail(target, &output));
    (next, failed)
}

/// Where `definition` goes once its wait state has completed with the output `state`: through
/// the Choice after it ("Slot granted?") to the work, to the start rate's Wait state, or back
/// in line.
fn after_wait<'a>(definition: &'a Value, state: &Value) -> &'a str {
    let (_, wait) = wait_state(definition);
    let choice = asl::state(definition, wait["Next"].as_str().expect("a Next"));
    assert_eq!(
        choice["Type"],
        json!("Choice"),
        "the wait state is followed by a Choice"
    );
    asl::choose(choice, state)
}

#[tokio::test]
async fn a_critical_section_through_the_definition_with_the_defaults() {
    let sem = semaphore().await;
    let config = config();
    let definition = asl::definition("lock-protected.asl.json");
    let input = json!({"work_seconds": 0});
    let started = now(&sem);
    let ctx = Ctx::new(HOLDER, input.clone(), &started);

    let played = play_acquire(&sem, &config, &ctx, &input).await;
    assert_eq!(
        played.payload,
        json!({
            "execution": ctx.execution,
            "requested_at": started
        }),
        "the payload the definition renders: the whole execution context (its RedriveTime once \
         redriven) and the state's entry time"
    );
    let answer = played.answer.unwrap();
    assert_eq!(
        keys(&answer),
        BTreeSet::from([
            "acquired",
            "outcome",
            "token",
            "count",
            "limit",
            "weight",
            "rate",
            "next_start_at",
            "lock",
            "holder",
            "acquisition",
            "child_name",
            "queued_at",
            "fallback_seconds",
            "waiting_since",
            "work"
        ])
    );
    let name = child_execution_name(&id(HOLDER, "r0"));
    assert!(name.starts_with("run-1-"), "{name}");
    assert_eq!(
        answer,
        json!({
            "acquired": true,
            "outcome": "acquired",
            "token": 1,
            "count": 1,
            "limit": 5,
            "weight": 1,
            "rate": null,
            "next_start_at": null,
            "lock": "demo-lock",
            "holder": HOLDER,
            "acquisition": "r0",
            "child_name": name,
            "queued_at": null,
            "fallback_seconds": 0,
            "waiting_since": started,
            "work": {
                "state_machine": DEMO,
                "name": name,
                "context": {"semaphore": {
                    "lock": "demo-lock",
                    "fencing_token": 1,
                    "holder": HOLDER,
                    "acquisition": "r0"
                }}
            }
        })
    );
    let (state, next) = played.next.unwrap();
    assert_eq!(state, json!({"semaphore": answer}));
    assert_eq!(next, "Protected work");

    // A Step Functions retry of the same state entry gets the same slot (F5).
    let retry = play_acquire(&sem, &config, &ctx, &input).await;
    let retried = retry.answer.unwrap();
    assert_eq!(
        (
            &retried["outcome"],
            &retried["token"],
            &retried["acquisition"]
        ),
        (&json!("already_held"), &json!(1), &json!("r0"))
    );
    assert_eq!(retried["work"], answer["work"]);

    // The work is started as the definition says: the demo machine, named after the acquisition,
    // with the execution input plus the semaphore context.
    let work_state = asl::state(&definition, "Protected work");
    let start = asl::render(&work_state["Parameters"], &state, &ctx);
    assert_eq!(
        start,
        json!({
            "StateMachineArn": DEMO,
            "Name": name,
            "Input": {
                "work_seconds": 0,
                "semaphore": {"lock": "demo-lock", "fencing_token": 1, "holder": HOLDER, "acquisition": "r0"}
            }
        })
    );
    // What startExecution.sync:2 hands back when the child succeeded.
    let child_output = json!({"worked_seconds": 0, "fencing_token": 1});
    let state = asl::task_output(
        work_state,
        &state,
        &ctx,
        json!({"ExecutionArn": "arn:child", "Output": child_output, "Status": "SUCCEEDED"}),
    );
    let release_name = "Release slot";
    let release_state = asl::state(&definition, release_name);
    assert_eq!(work_state["Next"], json!(release_name));

    let release_ctx = ctx.entered(&now(&sem));
    let payload = asl::render(
        &release_state["Parameters"]["Payload"],
        &state,
        &release_ctx,
    );
    assert_eq!(
        payload,
        json!({"holder": HOLDER, "redrive_count": 0, "answer": state["semaphore"]}),
        "the release payload: the acquire answer, not the execution input"
    );
    let released = release(&sem, payload).await.unwrap();
    assert_eq!(
        released,
        json!({"released": true, "outcome": "released", "count": 0, "lock": "demo-lock",
               "acquisition": "r0", "handed_off": 0, "error": null, "cause": null})
    );
    let state = asl::task_output(
        release_state,
        &state,
        &release_ctx,
        json!({"Payload": released}),
    );
    let done = asl::state(&definition, release_state["Next"].as_str().unwrap());
    assert_eq!(
        asl::render(&done["Parameters"], &state, &release_ctx),
        json!({"lock": "demo-lock", "fencing_token": 1, "output": child_output, "released": true})
    );
}

#[tokio::test]
async fn lock_limit_and_work_come_from_the_input_and_a_full_lock_waits() {
    let sem = semaphore().await;
    let config = config();
    let definition = asl::definition("lock-protected.asl.json");
    let input = json!({"lock": "batch", "limit": 1, "work": MINE, "customer": 42});
    let first = Ctx::new(&holder(1), input.clone(), &now(&sem));
    let played = play_acquire(&sem, &config, &first, &input).await;
    let answer = played.answer.unwrap();
    assert_eq!(
        (&answer["lock"], &answer["limit"], &answer["outcome"]),
        (&json!("batch"), &json!(1), &json!("acquired"))
    );
    assert_eq!(answer["work"]["state_machine"], json!(MINE));
    let (state, _) = played.next.unwrap();
    let start = asl::render(
        &asl::state(&definition, "Protected work")["Parameters"],
        &state,
        &first,
    );
    assert_eq!(start["StateMachineArn"], json!(MINE));
    assert_eq!(start["Input"]["customer"], json!(42));
    assert_eq!(start["Input"]["semaphore"]["lock"], json!("batch"));

    // A second execution with the same input finds the lock full: its request time is its place
    // in line, and the machine waits in line with it.
    let second_ms = sem.now_ms();
    let second = Ctx::new(&holder(2), input.clone(), &rfc3339_millis(second_ms));
    let played = play_acquire(&sem, &config, &second, &input).await;
    let full = played.answer.unwrap();
    assert_eq!(
        (
            &full["acquired"],
            &full["outcome"],
            &full["token"],
            &full["count"]
        ),
        (&json!(false), &json!("full"), &json!(null), &json!(1))
    );
    assert_eq!(full["queued_at"], json!(second.entered_time));
    assert_eq!(full["fallback_seconds"], json!(config.fallback.as_secs()));
    // Nothing held yet: the work's context has no token.
    assert_eq!(
        full["work"]["context"]["semaphore"]["fencing_token"],
        json!(null)
    );
    let (state, next) = played.next.unwrap();
    let (wait_name, wait) = wait_state(&definition);
    assert_eq!(next, wait_name);
    // Parked until woken; its timeout (the fallback check) is the answer's fallback_seconds.
    assert_eq!(
        asl::timeout_seconds(wait, &state),
        config.fallback.as_secs()
    );

    // The wait task's payload: the execution's id, run and start, the full answer (instead of
    // the execution input, which may be near 256 KiB), the wait state's entry time, the task's
    // token and the place in line, the full answer's queued_at.
    let parked = second.entered(&now(&sem)).with_task_token("task-token-1");
    let payload = asl::render(&wait["Parameters"]["Payload"], &state, &parked);
    assert_eq!(
        payload,
        json!({
            "holder": second.execution["Id"],
            "redrive_count": 0,
            "started_at": second.execution["StartTime"],
            "answer": state["semaphore"],
            "requested_at": parked.entered_time,
            "task_token": "task-token-1",
            "queued_at": full["queued_at"]
        })
    );
    let queued = acquire(&sem, &config, payload.clone()).await.unwrap();
    assert_eq!(
        (
            &queued["acquired"],
            &queued["outcome"],
            &queued["token"],
            &queued["queued_at"]
        ),
        (
            &json!(false),
            &json!("queued"),
            &json!(null),
            &full["queued_at"]
        )
    );
    // In line: one record, at the place its first request named, with the task's token; the
    // lock counts it.
    let place = QueueKey::new(&id(&holder(2), "r0"), second_ms).render();
    let in_line = |records: &[RawRecord], token: &str| {
        assert_eq!(records.len(), 1, "{records:?}");
        assert_eq!(
            (
                text(&records[0], "place"),
                text(&records[0], "holder"),
                text(&records[0], "acquisition"),
                text(&records[0], "task_token")
            ),
            (place.as_str(), holder(2).as_str(), "r0", token)
        );
    };
    in_line(&consistent(&sem, "batch", 1).await, "task-token-1");
    let seen = observe(sem.store().client(), sem.store().table(), "batch")
        .await
        .unwrap();
    assert_eq!((seen.waiting, seen.holders.len()), (1, 1));

    // Step Functions retries the invocation (same payload): still one record.
    let retried = acquire(&sem, &config, payload).await.unwrap();
    assert_eq!(retried["outcome"], json!("queued"));
    in_line(&consistent(&sem, "batch", 1).await, "task-token-1");

    // The fallback timeout: the wait state is entered again (its Catch of States.Timeout), with
    // a new token and the same queued_at: same place, the new token stored.
    let catcher = asl::catcher(wait, "States.Timeout");
    assert_eq!(catcher["Next"], json!(wait_name), "a timeout waits again");
    let timed_out = asl::caught(catcher, &state, "States.Timeout", "");
    let again = second.entered(&now(&sem)).with_task_token("task-token-2");
    let payload = asl::render(&wait["Parameters"]["Payload"], &timed_out, &again);
    assert_eq!(payload["queued_at"], full["queued_at"]);
    assert_eq!(payload["requested_at"], json!(again.entered_time));
    let checked = acquire(&sem, &config, payload).await.unwrap();
    assert_eq!(checked["outcome"], json!("queued"));
    in_line(&consistent(&sem, "batch", 1).await, "task-token-2");

    // The first execution releases, and the slot is granted to the head of the line: the task
    // gets the waiter's stored answer with the slot filled in (what the hand-off sends with
    // SendTaskSuccess), and the wait state hands it to "Protected work".
    sem.release(&lock("batch"), &id(&holder(1), "r0"))
        .await
        .unwrap();
    let (token, context) = grant_head(&sem, "batch").await;
    let granted: Value = serde_json::from_str(&granted_answer(&context, token).unwrap()).unwrap();
    assert_eq!(
        (&granted["acquired"], &granted["outcome"], &granted["token"]),
        (&json!(true), &json!("acquired"), &json!(token.0))
    );
    let state = asl::task_output(wait, &timed_out, &again, granted.clone());
    assert_eq!(state["semaphore"], granted);
    assert_eq!(after_wait(&definition, &state), "Protected work");
    let start = asl::render(
        &asl::state(&definition, "Protected work")["Parameters"],
        &state,
        &again,
    );
    let name = child_execution_name(&id(&holder(2), "r0"));
    assert_eq!(full["work"]["name"], json!(name));
    assert_eq!(
        start,
        json!({
            "StateMachineArn": MINE,
            "Name": name,
            "Input": {
                "lock": "batch", "limit": 1, "work": MINE, "customer": 42,
                "semaphore": {"lock": "batch", "fencing_token": token.0, "holder": holder(2),
                              "acquisition": "r0"}
            }
        })
    );
    assert!(consistent(&sem, "batch", 1).await.is_empty());

    // The default lock is another semaphore: not full.
    let other = Ctx::new(&holder(3), json!({}), &now(&sem));
    let answer = play_acquire(&sem, &config, &other, &json!({}))
        .await
        .answer
        .unwrap();
    assert_eq!(
        (&answer["lock"], &answer["limit"], &answer["outcome"]),
        (&json!("demo-lock"), &json!(5), &json!("acquired"))
    );
    let seen = observe(sem.store().client(), sem.store().table(), "batch")
        .await
        .expect("the item exists");
    seen.assert_safe(1);
}

#[tokio::test]
async fn lambda_work_runs_through_the_runner_which_invokes_the_function() {
    let sem = semaphore().await;
    let input = json!({"work": FUNCTION, "n": 1});
    let ctx = Ctx::new(HOLDER, input.clone(), &now(&sem));
    let played = play_acquire(&sem, &config(), &ctx, &input).await;
    let answer = played.answer.unwrap();
    assert_eq!(answer["work"]["state_machine"], json!(RUNNER));
    assert_eq!(
        answer["work"]["context"]["semaphore"]["function"],
        json!(FUNCTION)
    );
    let (state, _) = played.next.unwrap();
    let definition = asl::definition("lock-protected.asl.json");
    let start = asl::render(
        &asl::state(&definition, "Protected work")["Parameters"],
        &state,
        &ctx,
    );
    // The runner's one state invokes the function named in its input with the whole input.
    let runner = asl::definition("work-function.asl.json");
    let invoke = asl::state(&runner, runner["StartAt"].as_str().unwrap());
    let child_ctx = Ctx::new("arn:child", start["Input"].clone(), &now(&sem));
    let parameters = asl::render(&invoke["Parameters"], &start["Input"], &child_ctx);
    assert_eq!(parameters["FunctionName"], json!(FUNCTION));
    assert_eq!(parameters["Payload"], start["Input"]);
    assert_eq!(
        parameters["Payload"]["semaphore"]["fencing_token"],
        json!(1)
    );
}

#[tokio::test]
async fn bad_input_is_semaphore_invalid_input_fails_without_a_slot_and_writes_nothing() {
    let sem = semaphore().await;
    let config = config();
    // One good acquire, so that "nothing written" also means "the existing item is unchanged".
    let ctx = Ctx::new(HOLDER, json!({}), &now(&sem));
    play_acquire(&sem, &config, &ctx, &json!({}))
        .await
        .answer
        .unwrap();
    let before = all_items(&sem).await;

    let other = "arn:aws:states:us-east-1:123456789012:stateMachine:not-allowed";
    let not_allowed = |arn: &str| {
        format!(
            "input.work is \"{arn}\", which this stack does not allow: name one it allows (state \
             machines: {DEMO}, {MINE}; Lambda functions: {FUNCTION}), or leave it out to run the \
             default, {DEMO}. To allow another, add it to the stack's WorkStateMachineArns or \
             WorkFunctionArns parameter (the acquire function's WORK_STATE_MACHINES and \
             WORK_FUNCTIONS)"
        )
    };
    let input_kind = |got: &str| {
        format!(
            "execution.Input must be a JSON object (the execution input, \"input.$\": \
             \"$$.Execution.Input\"); got {got}"
        )
    };
    let cases: Vec<(Value, String)> = vec![
        (json!("run me"), input_kind("a string \"run me\"")),
        (json!([1, 2]), input_kind("an array [1,2]")),
        (
            json!({"semaphore": {"lock": "x"}}),
            "the execution input has the key \"semaphore\", which is reserved: the work's input \
             is the execution input plus \"semaphore\": {lock, fencing_token, holder, \
             acquisition}; rename that key of the input"
                .into(),
        ),
        (json!({"work": other}), not_allowed(other)),
        (json!({"work": "my-work"}), not_allowed("my-work")),
        (
            json!({"work": {"arn": MINE}}),
            "input.work must be a JSON string; got an object {\"arn\":\"arn:aws:states:us-east-1:\
             123456789012:stateMachine:my-work\"}"
                .into(),
        ),
        (
            json!({"limit": 0}),
            "input.limit: limit must be a whole number from 1 to 1000; got 0".into(),
        ),
        (
            json!({"limit": "5"}),
            "input.limit: limit must be a whole number from 1 to 1000; got the string \"5\"".into(),
        ),
        (
            json!({"limit": 2.5}),
            "input.limit: limit must be a whole number from 1 to 1000; got 2.5".into(),
        ),
        (
            json!({"limit": 1001}),
            "input.limit: limit must be a whole number from 1 to 1000; got 1001".into(),
        ),
        (
            json!({"lock": ""}),
            "input.lock: lock name is empty: pass the name of the semaphore, e.g. \"demo-lock\""
                .into(),
        ),
        (
            json!({"lock": ["a"]}),
            "input.lock must be a JSON string; got an array [\"a\"]".into(),
        ),
    ];
    let weight = "weight must be a whole number from 1 to the limit (1000 at most)";
    let rate = "rate must be a number of acquisitions per second from 0.000011574074074074073 \
                (one a day) to 1000";
    let above = |weight: u32, limit: u32| {
        format!(
            "weight {weight} is above the limit {limit}: it could never be granted; ask for at \
             most {limit}, or raise the limit"
        )
    };
    let cases = cases.into_iter().chain([
        (
            json!({"weight": 0}),
            format!("input.weight: {weight}; got 0"),
        ),
        (
            json!({"weight": -1}),
            format!("input.weight: {weight}; got -1"),
        ),
        (
            json!({"weight": 2.5}),
            format!("input.weight: {weight}; got 2.5"),
        ),
        (
            json!({"weight": "4"}),
            format!("input.weight: {weight}; got the string \"4\""),
        ),
        (
            json!({"weight": 1001}),
            format!("input.weight: {weight}; got 1001"),
        ),
        // Above the default limit (5), and above the input's own limit.
        (json!({"weight": 6}), above(6, 5)),
        (json!({"limit": 2, "weight": 3}), above(3, 2)),
        (json!({"rate": 0}), format!("input.rate: {rate}; got 0")),
        (json!({"rate": -1}), format!("input.rate: {rate}; got -1")),
        (
            json!({"rate": -0.5}),
            format!("input.rate: {rate}; got -0.5"),
        ),
        (
            json!({"rate": "fast"}),
            format!("input.rate: {rate}; got the string \"fast\""),
        ),
        (
            json!({"rate": "2"}),
            format!("input.rate: {rate}; got the string \"2\""),
        ),
        (
            json!({"rate": 1e9}),
            format!("input.rate: {rate}; got 1000000000"),
        ),
        (
            json!({"rate": [2]}),
            format!("input.rate: {rate}; got an array [2]"),
        ),
    ]);
    for (input, message) in cases {
        let ctx = Ctx::new(&holder(2), input.clone(), &now(&sem));
        let err = play_acquire(&sem, &config, &ctx, &input)
            .await
            .answer
            .expect_err(&format!("{input} must be refused"));
        assert_eq!(err.error_type, "SemaphoreInvalidInput", "{input}");
        assert_eq!(err.error_message, message, "{input}");
        // The definition fails the execution at once, with the error and its message, whatever
        // the input (the catcher replaces the state with the error: an input that is not an
        // object could not take an "error" field).
        let (next, failed) = route_acquire_error(&err, &input);
        assert_eq!(next, "Fail without a slot", "{input}");
        let (error, cause) = failed.expect("a Fail state");
        assert_eq!(error, "SemaphoreInvalidInput");
        let cause: Value = serde_json::from_str(&cause).expect("Lambda's error JSON");
        assert_eq!(cause["errorMessage"], json!(message));
    }

    // Without a default, an input without a lock is refused too.
    let config = config_with(&[("DEFAULT_LOCK", "")]);
    let ctx = Ctx::new(&holder(3), json!({}), &now(&sem));
    let err = play_acquire(&sem, &config, &ctx, &json!({}))
        .await
        .answer
        .unwrap_err();
    assert_eq!(
        (err.error_type.as_str(), err.error_message.as_str()),
        (
            "SemaphoreInvalidInput",
            "lock is missing: pass \"lock\" in the execution input or in the payload, e.g. \
             \"lock\": \"demo-lock\", or set the function's DEFAULT_LOCK"
        )
    );

    assert_eq!(all_items(&sem).await, before, "nothing was written");
}

#[tokio::test]
async fn a_redriven_execution_acquires_in_its_new_run_while_the_old_runs_fence_stands() {
    let (sem, clock) = semaphore_with_clock().await;
    let config = config();
    let demo_lock = lock("demo-lock");
    let input = json!({"work_seconds": 5});
    let started_ms = sem.now_ms();
    let run0 = Ctx::new(HOLDER, input.clone(), &now(&sem));

    // Run 0 takes a slot and starts its work; then it is aborted, and its cleanup frees the slot
    // and fences run 0 of the execution.
    let answer = play_acquire(&sem, &config, &run0, &input)
        .await
        .answer
        .unwrap();
    assert_eq!(
        (&answer["outcome"], &answer["acquisition"], &answer["token"]),
        (&json!("acquired"), &json!("r0"), &json!(1))
    );
    let first_child = answer["work"]["name"].clone();
    let cleaned = sem
        .cleanup(&demo_lock, &HolderId::new(HOLDER).unwrap())
        .await
        .unwrap();
    assert_eq!(
        cleaned
            .freed
            .iter()
            .map(|(who, _)| who.clone())
            .collect::<Vec<_>>(),
        [id(HOLDER, "r0")]
    );
    let run0_fence = FenceKey::execution(&HolderId::new(HOLDER).unwrap(), Run::FIRST);

    // Redriven, it enters its acquire state again (a redrive from "Acquire slot" after an abort
    // there): run 1, acquisition r1, which no cleanup fenced.
    clock.advance_ms(500);
    let run1 = run0.redriven(1).entered(&now(&sem));
    let played = play_acquire(&sem, &config, &run1, &input).await;
    let answer = played.answer.unwrap();
    assert_eq!(
        (
            &answer["acquired"],
            &answer["outcome"],
            &answer["acquisition"],
            &answer["queued_at"]
        ),
        (&json!(true), &json!("acquired"), &json!("r1"), &json!(null))
    );
    assert_eq!(played.next.unwrap().1, "Protected work");
    // Its work is a new child: the old one's name belongs to run 0.
    assert_ne!(answer["work"]["name"], first_child);
    assert_eq!(
        answer["work"]["name"],
        json!(child_execution_name(&id(HOLDER, "r1")))
    );
    // Run 0's fence still stands (no rotation happened): it keeps run 0's zombies out.
    let item = sem.status(&demo_lock).await.unwrap();
    assert!(item.is_fenced(&run0_fence));
    assert_eq!(item.fences.rotated_at_ms, None);
    let late = sem
        .acquire_requested_at(&demo_lock, &id(HOLDER, "r0"), limit(5), started_ms)
        .await
        .unwrap();
    assert_eq!(late, AcquireOutcome::Fenced(FenceReason::ExecutionEnded));

    // Run 1 ends too (aborted in its work): its cleanup fences run 1 and, again, run 0, and
    // frees its slot; a zombie acquire of run 1 is refused by its own run's fence.
    let cleaned = sem
        .cleanup_run(&demo_lock, &HolderId::new(HOLDER).unwrap(), Run(1))
        .await
        .unwrap();
    assert_eq!(cleaned.freed.len(), 1);
    let err = play_acquire(&sem, &config, &run1, &input)
        .await
        .answer
        .unwrap_err();
    assert_eq!(err.error_type, "SemaphoreFenced");
    let item = sem.status(&demo_lock).await.unwrap();
    assert!(item.holders.is_empty());
    assert!(item.is_fenced(&FenceKey::execution(
        &HolderId::new(HOLDER).unwrap(),
        Run(1)
    )));
}

#[tokio::test]
async fn a_fence_is_final_for_a_run_that_was_not_redriven_or_an_acquisition_released() {
    let sem = semaphore().await;
    let config = config();
    let input = json!({});
    let ctx = Ctx::new(HOLDER, input.clone(), &now(&sem));
    play_acquire(&sem, &config, &ctx, &input)
        .await
        .answer
        .unwrap();
    sem.cleanup(&lock("demo-lock"), &HolderId::new(HOLDER).unwrap())
        .await
        .unwrap();

    // A zombie or late retry of run 0: the execution ended and was cleaned up.
    let err = play_acquire(&sem, &config, &ctx, &input)
        .await
        .answer
        .unwrap_err();
    assert_eq!(err.error_type, "SemaphoreFenced");
    assert_eq!(
        err.error_message,
        format!(
            "acquisition r0 of {HOLDER} on lock \"demo-lock\" is fenced: the execution was \
             cleaned up after it ended; it can never hold a slot, a new acquire needs a new \
             acquisition id"
        )
    );
    assert_eq!(route_acquire_error(&err, &input).0, "Fail without a slot");

    // Run 1 released its slot; a late attempt of its acquire is fenced, redriven or not.
    let run = Ctx::new(&holder(2), input.clone(), &now(&sem)).redriven(1);
    play_acquire(&sem, &config, &run, &input)
        .await
        .answer
        .unwrap();
    let released = release(
        &sem,
        json!({"input": input, "holder": holder(2), "redrive_count": 1}),
    )
    .await
    .unwrap();
    assert_eq!(released["released"], json!(true));
    let err = play_acquire(&sem, &config, &run, &input)
        .await
        .answer
        .unwrap_err();
    assert_eq!(err.error_type, "SemaphoreFenced");
    assert!(
        err.error_message
            .contains("is fenced: this acquisition was already released"),
        "{}",
        err.error_message
    );
    assert_eq!(sem.status(&lock("demo-lock")).await.unwrap().count(), 0);
}

#[tokio::test]
async fn waiting_longer_than_the_budget_is_semaphore_wait_timeout_and_the_slot_is_released() {
    let (sem, clock) = semaphore_with_clock().await;
    let config = config_with(&[("MAX_WAIT_SECONDS", "60")]);
    let definition = asl::definition("lock-protected.asl.json");
    let input = json!({"lock": "busy", "limit": 1});
    let holding = Ctx::new(&holder(1), input.clone(), &now(&sem));
    play_acquire(&sem, &config, &holding, &input)
        .await
        .answer
        .unwrap();

    // Started 30 s ago: within the budget, waits.
    let start = now(&sem);
    clock.advance_ms(30_000);
    let waiter = Ctx::new(&holder(2), input.clone(), &start).entered(&now(&sem));
    let full = play_acquire(&sem, &config, &waiter, &input)
        .await
        .answer
        .unwrap();
    assert_eq!(full["outcome"], json!("full"));

    // 61 s: over it (an execution that enters its acquire state that late, e.g. after
    // "expired" answers). The answer names the wait and the lock; nothing is held.
    clock.advance_ms(31_000);
    let waiter = waiter.entered(&now(&sem));
    let err = play_acquire(&sem, &config, &waiter, &input)
        .await
        .answer
        .unwrap_err();
    assert_eq!(err.error_type, "SemaphoreWaitTimeout");
    assert_eq!(
        err.error_message,
        format!(
            "{} has waited 61 s for a slot of lock \"busy\" (limit 1, 1 held), longer than the \
             acquire function's MAX_WAIT_SECONDS of 60 s; it holds no slot. Start it again later, \
             or raise the limit or the stack's MaxWaitSeconds",
            holder(2)
        )
    );
    // The definition releases (an earlier attempt's lost answer may hold a slot), then fails
    // with the acquire's error as caught.
    let (next, failed) = route_acquire_error(&err, &input);
    assert_eq!(next, "Release after failure");
    assert!(failed.is_none());
    let catcher = asl::catcher(acquire_state(&definition).1, &err.error_type);
    let cause = json!({"errorType": err.error_type, "errorMessage": err.error_message}).to_string();
    let state = asl::caught(catcher, &input, &err.error_type, &cause);
    let release_state = asl::state(&definition, &next);
    let payload = asl::render(&release_state["Parameters"]["Payload"], &state, &waiter);
    let released = release(&sem, payload).await.unwrap();
    assert_eq!(
        (
            &released["released"],
            &released["error"],
            &released["cause"]
        ),
        (&json!(false), &json!("SemaphoreWaitTimeout"), &json!(cause))
    );
    let state = asl::task_output(release_state, &state, &waiter, json!({"Payload": released}));
    let fail = asl::state(&definition, release_state["Next"].as_str().unwrap());
    assert_eq!(
        asl::fail(fail, &state),
        ("SemaphoreWaitTimeout".to_owned(), cause)
    );

    // However long an execution waited, a free slot is taken: the budget bounds waiting only.
    let late =
        Ctx::new(&holder(3), json!({"lock": "free", "limit": 1}), &start).entered(&now(&sem));
    let answer = play_acquire(&sem, &config, &late, &json!({}))
        .await
        .answer
        .unwrap();
    assert_eq!(answer["outcome"], json!("acquired"));

    // A redriven run's payload carries its first start only: the wait is not timed from it.
    let redriven = Ctx::new(&holder(4), input.clone(), &start)
        .redriven(1)
        .entered(&now(&sem));
    let answer = play_acquire(&sem, &config, &redriven, &input)
        .await
        .answer
        .unwrap();
    assert_eq!(answer["outcome"], json!("full"));
    // With the whole execution node, its redrive time is known, and the budget counts from it.
    let mut node = redriven.execution.clone();
    node["RedriveTime"] = json!(rfc3339_millis(sem.now_ms() - 61_000));
    let err = acquire(
        &sem,
        &config,
        json!({"execution": node, "requested_at": now(&sem)}),
    )
    .await
    .unwrap_err();
    assert_eq!(err.error_type, "SemaphoreWaitTimeout");
    assert!(
        err.error_message.contains("has waited 61 s"),
        "{}",
        err.error_message
    );

    // Waiting in line is bounded the same way: an execution queued within the budget is taken
    // out of line by the first fallback check past it, which fails its task with
    // SemaphoreWaitTimeout; the definition then releases (a grant may have landed) and fails.
    let started = now(&sem);
    let patient = Ctx::new(&holder(5), input.clone(), &started);
    let full = play_acquire(&sem, &config, &patient, &input).await;
    let (state, next) = full.next.unwrap();
    let (wait_name, wait) = wait_state(&definition);
    assert_eq!(next, wait_name);
    let parked = patient.entered(&now(&sem)).with_task_token("patient-1");
    let payload = asl::render(&wait["Parameters"]["Payload"], &state, &parked);
    let queued = acquire(&sem, &config, payload).await.unwrap();
    assert_eq!(queued["outcome"], json!("queued"));
    assert_eq!(consistent(&sem, "busy", 1).await.len(), 1);
    clock.advance_ms(61_000);
    let timed_out = asl::caught(
        asl::catcher(wait, "States.Timeout"),
        &state,
        "States.Timeout",
        "",
    );
    let check = patient.entered(&now(&sem)).with_task_token("patient-2");
    let payload = asl::render(&wait["Parameters"]["Payload"], &timed_out, &check);
    let err = acquire(&sem, &config, payload).await.unwrap_err();
    assert_eq!(err.error_type, "SemaphoreWaitTimeout");
    assert!(
        err.error_message.contains("has waited 61 s"),
        "{}",
        err.error_message
    );
    assert!(
        consistent(&sem, "busy", 1).await.is_empty(),
        "out of line, and the lock no longer counts it"
    );
    let catcher = asl::catcher(wait, &err.error_type);
    assert_eq!(catcher["Next"], json!("Release after failure"));
    let cause = json!({"errorType": err.error_type, "errorMessage": err.error_message}).to_string();
    let state = asl::caught(catcher, &timed_out, &err.error_type, &cause);
    let release_state = asl::state(&definition, "Release after failure");
    let payload = asl::render(&release_state["Parameters"]["Payload"], &state, &check);
    let released = release(&sem, payload).await.unwrap();
    assert_eq!(
        (&released["released"], &released["error"]),
        (&json!(false), &json!("SemaphoreWaitTimeout"))
    );
    let item = sem.status(&lock("busy")).await.unwrap();
    assert_eq!(
        item.holders.keys().cloned().collect::<Vec<_>>(),
        [id(&holder(1), "r0")]
    );
}

/// Weights and a start rate from the execution input: the answers carry them, the item keeps
/// the sum of the weights, and an acquire the rate holds back answers "rate_limited" with when
/// the next start may be, writes nothing, and is sent to wait in line like "full". A head of
/// the line the rate defers (`deferred_answer`, what the hand-off sends) waits wait_seconds in
/// the definition's Wait state and enters the line again with its place; no answer without a
/// slot reaches the work.
#[tokio::test]
async fn a_weight_and_a_start_rate_from_the_input_and_a_rate_limited_answer_waits_in_line() {
    let (sem, clock) = semaphore_with_clock().await;
    let config = config();
    let definition = asl::definition("lock-protected.asl.json");
    let heavy = json!({"lock": "paced", "limit": 3, "weight": 2, "rate": 0.5});
    let first = Ctx::new(&holder(1), heavy.clone(), &now(&sem));
    let started_ms = sem.now_ms();
    let played = play_acquire(&sem, &config, &first, &heavy).await;
    let answer = played.answer.unwrap();
    let heavy_answer = answer.clone();
    assert_eq!(
        (
            &answer["outcome"],
            &answer["limit"],
            &answer["weight"],
            &answer["rate"],
            &answer["next_start_at"]
        ),
        (
            &json!("acquired"),
            &json!(3),
            &json!(2),
            &json!(0.5),
            &json!(null)
        )
    );
    assert_eq!(played.next.unwrap().1, "Protected work");
    let seen = observe(sem.store().client(), sem.store().table(), "paced")
        .await
        .unwrap();
    assert_eq!((seen.used, &seen.weights), (2, &vec![2]));
    assert_eq!(seen.started_at, Some(started_ms));
    seen.assert_safe(3);
    let before = all_items(&sem).await;

    // A second execution, weight 1: it fits (2 + 1 <= 3), but one start every 2 s is spent.
    clock.advance_ms(500);
    let light = json!({"lock": "paced", "limit": 3, "rate": 0.5});
    let second = Ctx::new(&holder(2), light.clone(), &now(&sem));
    let played = play_acquire(&sem, &config, &second, &light).await;
    let limited = played.answer.unwrap();
    assert_eq!(
        (
            &limited["acquired"],
            &limited["outcome"],
            &limited["token"],
            &limited["weight"],
            &limited["rate"]
        ),
        (
            &json!(false),
            &json!("rate_limited"),
            &json!(null),
            &json!(1),
            &json!(0.5)
        ),
        "{limited}"
    );
    assert_eq!(
        limited["next_start_at"],
        json!(rfc3339_millis(started_ms + 2_000))
    );
    // Answered like "full": its place in line and the wait task's timeout.
    assert_eq!(limited["queued_at"], json!(second.entered_time));
    assert_eq!(
        limited["fallback_seconds"],
        json!(config.fallback.as_secs())
    );
    assert_eq!(all_items(&sem).await, before, "nothing was written");
    let (state, next) = played.next.unwrap();
    let (wait_name, wait) = wait_state(&definition);
    assert_eq!(next, wait_name, "rate_limited waits in line");
    let parked = second.entered(&now(&sem)).with_task_token("paced-1");
    let payload = asl::render(&wait["Parameters"]["Payload"], &state, &parked);
    assert_eq!(payload["queued_at"], limited["queued_at"]);
    assert_eq!(
        asl::timeout_seconds(wait, &state),
        config.fallback.as_secs()
    );

    // A head of the line the rate defers (the hand-off's SendTaskSuccess): acquired false,
    // "rate_limited", wait_seconds. The machine waits that long, then enters the line again
    // with the same place and fallback.
    let deferred: Value = serde_json::from_str(
        &deferred_answer(
            &serde_json::to_string(&limited).unwrap(),
            started_ms + 2_000,
            sem.now_ms(),
        )
        .unwrap(),
    )
    .unwrap();
    assert_eq!(
        (
            &deferred["acquired"],
            &deferred["outcome"],
            &deferred["wait_seconds"],
            &deferred["next_start_at"]
        ),
        (
            &json!(false),
            &json!("rate_limited"),
            &json!(2),
            &limited["next_start_at"]
        )
    );
    let state = asl::task_output(wait, &state, &parked, deferred.clone());
    let pause_name = after_wait(&definition, &state);
    assert_eq!(pause_name, "Wait for the start rate");
    let pause = asl::state(&definition, pause_name);
    assert_eq!(pause["Type"], json!("Wait"));
    let seconds_path = pause["SecondsPath"].as_str().unwrap();
    assert_eq!(asl::read(&state, seconds_path), Some(&json!(2)));
    assert_eq!(pause["Next"], json!(wait_name));
    let again = second.entered(&now(&sem)).with_task_token("paced-2");
    let payload = asl::render(&wait["Parameters"]["Payload"], &state, &again);
    assert_eq!(
        payload["queued_at"], limited["queued_at"],
        "its place is kept"
    );
    assert_eq!(
        asl::timeout_seconds(wait, &state),
        config.fallback.as_secs()
    );
    // Any other answer without a slot goes back in line, never to the work.
    for outcome in ["full", "queued", "expired", "acquired"] {
        let mut other = deferred.clone();
        other["outcome"] = json!(outcome);
        let state = asl::task_output(wait, &state, &parked, other);
        assert_eq!(after_wait(&definition, &state), wait_name, "{outcome}");
    }
    // The same in the copy-paste fragment.
    let fragment = asl::definition("protect-your-workflow.asl.json");
    let (fragment_wait_name, fragment_wait) = wait_state(&fragment);
    let state = asl::task_output(fragment_wait, &json!({}), &parked, deferred.clone());
    let pause_name = after_wait(&fragment, &state);
    let pause = asl::state(&fragment, pause_name);
    assert_eq!(
        (
            &pause["Type"],
            asl::read(&state, pause["SecondsPath"].as_str().unwrap()),
            &pause["Next"]
        ),
        (&json!("Wait"), Some(&json!(2)), &json!(fragment_wait_name))
    );
    let payload = asl::render(&fragment_wait["Parameters"]["Payload"], &state, &again);
    assert_eq!(payload["queued_at"], limited["queued_at"]);
    let mut granted = deferred.clone();
    granted["outcome"] = json!("queued");
    let state = asl::task_output(fragment_wait, &json!({}), &parked, granted);
    assert_eq!(after_wait(&fragment, &state), fragment_wait_name);

    // Once the spacing has passed, a new request takes its slot (weight 1: 3 of 3 used).
    clock.advance_ms(1_500);
    let third = second.entered(&now(&sem));
    let answer = play_acquire(&sem, &config, &third, &light)
        .await
        .answer
        .unwrap();
    assert_eq!(
        (&answer["outcome"], &answer["count"]),
        (&json!("acquired"), &json!(2))
    );
    let seen = observe(sem.store().client(), sem.store().table(), "paced")
        .await
        .unwrap();
    let mut weights = seen.weights.clone();
    weights.sort_unstable();
    assert_eq!((seen.used, weights), (3, vec![1, 2]));
    assert_eq!(seen.started_at, Some(started_ms + 2_000));
    seen.assert_safe(3);

    // Full now for any weight (and the rate is spent again): nothing more is taken.
    clock.advance_ms(2_000);
    let fourth = Ctx::new(&holder(3), light.clone(), &now(&sem));
    let full = play_acquire(&sem, &config, &fourth, &light)
        .await
        .answer
        .unwrap();
    assert_eq!(
        (&full["acquired"], &full["outcome"], &full["count"]),
        (&json!(false), &json!("full"), &json!(2))
    );

    // The heavy holder's release frees its weight 2, read from its acquire answer (which the
    // acquire resolved from the input).
    let release_ctx = first.entered(&now(&sem));
    let release_state = asl::state(&definition, "Release slot");
    let payload = asl::render(
        &release_state["Parameters"]["Payload"],
        &json!({"semaphore": heavy_answer, "work": {"output": {}}}),
        &release_ctx,
    );
    assert_eq!(payload["answer"]["weight"], json!(2));
    let released = release(&sem, payload).await.unwrap();
    assert_eq!(
        (&released["released"], &released["count"]),
        (&json!(true), &json!(1))
    );
    let seen = observe(sem.store().client(), sem.store().table(), "paced")
        .await
        .unwrap();
    assert_eq!((seen.used, &seen.weights), (1, &vec![1]));
}

#[tokio::test]
async fn a_request_older_than_the_horizon_answers_expired_writes_nothing_and_is_asked_again() {
    let sem = semaphore().await;
    let config = config();
    let input = json!({});
    let run1 = Ctx::new(HOLDER, input.clone(), &now(&sem));
    play_acquire(&sem, &config, &run1, &input)
        .await
        .answer
        .unwrap();
    let before = all_items(&sem).await;

    // The acquire state was entered longer ago than the horizon (a Lambda that took that long to
    // run it): a rotation may have dropped a fence this acquire had to meet, so it takes nothing.
    let horizon_ms = u64::try_from(sem.timing().horizon.as_millis()).unwrap();
    let entered = rfc3339_millis(SystemClock.now_ms() - horizon_ms - 1_000);
    let run2 = Ctx::new(&holder(2), input.clone(), &entered);
    let played = play_acquire(&sem, &config, &run2, &input).await;
    let expired = played.answer.unwrap();
    assert_eq!(
        (
            &expired["acquired"],
            &expired["outcome"],
            &expired["token"],
            &expired["count"],
            &expired["queued_at"],
            &expired["fallback_seconds"]
        ),
        (
            &json!(false),
            &json!("expired"),
            &json!(null),
            &json!(null),
            &json!(null),
            &json!(0)
        )
    );
    assert_eq!(all_items(&sem).await, before, "nothing was written");
    // The machine enters its acquire state again, which makes a new request time.
    assert_eq!(
        played.next.unwrap().1,
        acquire_state(&asl::definition("lock-protected.asl.json")).0
    );
    let again = play_acquire(&sem, &config, &run2.entered(&now(&sem)), &input)
        .await
        .answer
        .unwrap();
    assert_eq!(
        (&again["outcome"], &again["token"]),
        (&json!("acquired"), &json!(2))
    );
}

/// The explicit shape a caller's own machine sends (every value given, no input).
fn explicit_payload(requested_at: &str) -> Value {
    json!({
        "lock": "demo-lock",
        "limit": 5,
        "holder": HOLDER,
        "acquisition": "3f1c2a9e-5b7d-4c4c-8d8d-0123456789ab",
        "requested_at": requested_at
    })
}

#[tokio::test]
async fn the_explicit_shape_of_callers_own_machines_keeps_working() {
    let sem = semaphore().await;
    // Without any default or allowed work: the explicit shape needs none.
    let bare = Config::from_settings(&settings(Vec::new())).unwrap();
    let answer = acquire(&sem, &bare, explicit_payload(&now(&sem)))
        .await
        .unwrap();
    let name = child_execution_name(&id(HOLDER, "3f1c2a9e-5b7d-4c4c-8d8d-0123456789ab"));
    assert_eq!(
        answer,
        json!({
            "acquired": true, "outcome": "acquired", "token": 1, "count": 1, "limit": 5,
            "weight": 1, "rate": null, "next_start_at": null,
            "lock": "demo-lock", "holder": HOLDER,
            "acquisition": "3f1c2a9e-5b7d-4c4c-8d8d-0123456789ab", "child_name": name,
            "queued_at": null, "fallback_seconds": 0, "waiting_since": null, "work": null
        })
    );
    let released = release(
        &sem,
        json!({"lock": "demo-lock", "holder": HOLDER,
               "acquisition": "3f1c2a9e-5b7d-4c4c-8d8d-0123456789ab"}),
    )
    .await
    .unwrap();
    assert_eq!(released["released"], json!(true));

    let good = || explicit_payload(&now(&sem));
    let with = |field: &str, value: Value| {
        let mut p = good();
        p[field] = value;
        p
    };
    let without = |field: &str| {
        let mut p = good();
        p.as_object_mut().unwrap().remove(field);
        p
    };
    let before = all_items(&sem).await;
    let requested_at_error = |got: &str| {
        format!(
            "requested_at must be an RFC 3339 date-time such as \"2026-12-03T10:15:30.123Z\" \
             (Step Functions' $$.State.EnteredTime); got {got}: "
        )
    };
    let shape = lambda_common::ACQUIRE_PAYLOAD;
    let cases: Vec<(Value, String)> = vec![
        (
            without("lock"),
            "lock is missing: pass \"lock\" in the execution input or in the payload, e.g. \
             \"lock\": \"demo-lock\", or set the function's DEFAULT_LOCK"
                .into(),
        ),
        (
            with("lock", json!("x".repeat(257))),
            "lock name is 257 bytes long; the maximum is 256 bytes".into(),
        ),
        (
            without("limit"),
            "limit is missing: pass \"limit\" in the execution input or in the payload, a whole \
             number from 1 to 1000, e.g. \"limit\": 5, or set the function's DEFAULT_LIMIT"
                .into(),
        ),
        (
            with("limit", json!(-1)),
            "limit must be a whole number from 1 to 1000; got -1".into(),
        ),
        (
            without("holder"),
            "holder is missing: pass the execution ARN, e.g. \"holder.$\": \"$$.Execution.Id\""
                .into(),
        ),
        (
            with("holder", json!("")),
            "holder is empty: pass the execution ARN ($$.Execution.Id) or an operator id such as \
             \"exec-1\""
                .into(),
        ),
        (
            without("acquisition"),
            "acquisition is missing: pass \"redrive_count.$\": \"$$.Execution.RedriveCount\" (the \
             acquisition is then r<count>, one per run of the execution), or an id made once per \
             logical acquire, \"acquisition.$\": \"States.UUID()\""
                .into(),
        ),
        (
            with("acquisition", json!("a#b")),
            "acquisition id contains '#'; use only letters, digits and . _ : - (a UUID fits)"
                .into(),
        ),
        (
            with("redrive_count", json!("1")),
            "redrive_count must be a whole number from 0 (Step Functions' \
             $$.Execution.RedriveCount); got a string \"1\""
                .into(),
        ),
        (
            without("requested_at"),
            "requested_at is missing: pass when the acquire was asked for, as RFC 3339 text: the \
             acquire state's entry time, \"requested_at.$\": \"$$.State.EnteredTime\""
                .into(),
        ),
        (
            with("requested_at", json!("yesterday")),
            requested_at_error("\"yesterday\""),
        ),
        (
            with("started_at", json!(12)),
            "started_at must be a JSON string; got a number 12".into(),
        ),
        (
            json!("demo-lock"),
            format!("the payload must be a JSON object {shape}; got a string \"demo-lock\""),
        ),
        (
            json!(null),
            format!("the payload must be a JSON object {shape}; got null null"),
        ),
    ];
    for (payload, message) in cases {
        let err = acquire(&sem, &bare, payload.clone())
            .await
            .expect_err(&format!("{payload} must be refused"));
        assert_eq!(err.error_type, "SemaphoreInvalidInput", "{payload}");
        // A date-time the parser refuses is quoted back with the parser's own reason after it.
        if message.starts_with("requested_at must be an RFC 3339") {
            assert!(
                err.error_message.starts_with(&message),
                "{payload}: {}",
                err.error_message
            );
        } else {
            assert_eq!(err.error_message, message, "{payload}");
        }
    }
    assert_eq!(all_items(&sem).await, before, "nothing was written");
}

#[tokio::test]
async fn the_protect_your_workflow_fragment_reads_only_what_the_answers_give() {
    let sem = semaphore().await;
    let config = config();
    let fragment = asl::definition("protect-your-workflow.asl.json");
    let input = json!({"order": 7});
    let ctx = Ctx::new(HOLDER, input.clone(), &now(&sem));
    let (_, acquire_state) = acquire_state(&fragment);
    let payload = asl::render(&acquire_state["Parameters"]["Payload"], &input, &ctx);
    let answer = acquire(&sem, &config, payload).await.unwrap();
    assert_eq!(answer["outcome"], json!("acquired"));
    let state = asl::task_output(acquire_state, &input, &ctx, json!({"Payload": answer}));
    let choice = asl::state(&fragment, acquire_state["Next"].as_str().unwrap());
    let work = asl::choose(choice, &state);
    // Your work: one branch of a Parallel state (so that one Catch covers all its states),
    // whose placeholder passes the fencing token on.
    let work_state = asl::state(&fragment, work);
    assert_eq!(work_state["Type"], json!("Parallel"));
    let branch = &work_state["Branches"][0];
    let placeholder = &branch["States"][branch["StartAt"].as_str().unwrap()];
    assert_eq!(placeholder["Type"], json!("Pass"));
    let branch_output = asl::render(&placeholder["Parameters"], &state, &ctx);
    assert_eq!(branch_output["fencing_token"], answer["token"]);
    // Its work succeeded: the release after it.
    let after_work = asl::task_output(work_state, &state, &ctx, json!([branch_output]));
    assert_eq!(
        after_work["work"]["output"]["fencing_token"],
        answer["token"]
    );
    let release_state = asl::state(&fragment, work_state["Next"].as_str().unwrap());
    let payload = asl::render(&release_state["Parameters"]["Payload"], &after_work, &ctx);
    let released = release(&sem, payload).await.unwrap();
    assert_eq!(
        (&released["released"], &released["acquisition"]),
        (&json!(true), &json!("r0"))
    );
    asl::task_output(
        release_state,
        &after_work,
        &ctx,
        json!({"Payload": released}),
    );
    // Its work failed: the release after failure names the error to fail with.
    let catcher = asl::catcher(work_state, "MyError");
    let failed = asl::caught(catcher, &state, "MyError", "my cause");
    let release_state = asl::state(&fragment, catcher["Next"].as_str().unwrap());
    let payload = asl::render(&release_state["Parameters"]["Payload"], &failed, &ctx);
    let released = release(&sem, payload).await.unwrap();
    let failed = asl::task_output(release_state, &failed, &ctx, json!({"Payload": released}));
    let fail = asl::state(&fragment, release_state["Next"].as_str().unwrap());
    assert_eq!(
        asl::fail(fail, &failed),
        ("MyError".to_owned(), "my cause".to_owned())
    );

    // Two executions hold both slots; a third finds the lock full and waits in line.
    for n in [2, 3] {
        let ctx = Ctx::new(&holder(n), input.clone(), &now(&sem));
        let payload = asl::render(&acquire_state["Parameters"]["Payload"], &input, &ctx);
        let answer = acquire(&sem, &config, payload).await.unwrap();
        assert_eq!(answer["outcome"], json!("acquired"));
    }
    let third = Ctx::new(&holder(4), input.clone(), &now(&sem));
    let payload = asl::render(&acquire_state["Parameters"]["Payload"], &input, &third);
    let full = acquire(&sem, &config, payload).await.unwrap();
    assert_eq!(full["outcome"], json!("full"));
    let state = asl::task_output(acquire_state, &input, &third, json!({"Payload": full}));
    let (wait_name, wait) = wait_state(&fragment);
    assert_eq!(asl::choose(choice, &state), wait_name);
    assert_eq!(
        asl::timeout_seconds(wait, &state),
        config.fallback.as_secs()
    );
    let parked = third.entered(&now(&sem)).with_task_token("fragment-token");
    let payload = asl::render(&wait["Parameters"]["Payload"], &state, &parked);
    assert_eq!(
        payload,
        json!({
            "lock": "example-lock", "limit": 2, "weight": 1, "holder": holder(4),
            "redrive_count": 0,
            "started_at": third.entered_time, "requested_at": parked.entered_time,
            "task_token": "fragment-token", "queued_at": full["queued_at"]
        })
    );
    let queued = acquire(&sem, &config, payload).await.unwrap();
    assert_eq!(queued["outcome"], json!("queued"));
    assert_eq!(consistent(&sem, "example-lock", 2).await.len(), 1);
    assert_eq!(
        asl::catcher(wait, "States.Timeout")["Next"],
        json!(wait_name)
    );

    // A slot is freed and granted to it: the granted answer, through the wait state's
    // ResultSelector and ResultPath, gives "Your work" its fencing token.
    sem.release(&lock("example-lock"), &id(&holder(2), "r0"))
        .await
        .unwrap();
    let (token, context) = grant_head(&sem, "example-lock").await;
    let granted: Value = serde_json::from_str(&granted_answer(&context, token).unwrap()).unwrap();
    let state = asl::task_output(wait, &state, &parked, granted.clone());
    // The whole answer (no ResultSelector: a rate_limited one carries wait_seconds, which a
    // granted one does not have).
    assert_eq!(state["semaphore"], granted);
    assert_eq!(
        (
            &granted["acquired"],
            &granted["outcome"],
            &granted["token"],
            &granted["child_name"]
        ),
        (
            &json!(true),
            &json!("acquired"),
            &json!(token.0),
            &json!(child_execution_name(&id(&holder(4), "r0")))
        )
    );
    assert_eq!(after_wait(&fragment, &state), work);
    let branch_output = asl::render(&placeholder["Parameters"], &state, &parked);
    assert_eq!(branch_output, json!({"fencing_token": token.0}));
    let after_work = asl::task_output(work_state, &state, &parked, json!([branch_output]));
    let release_state = asl::state(&fragment, work_state["Next"].as_str().unwrap());
    let payload = asl::render(
        &release_state["Parameters"]["Payload"],
        &after_work,
        &parked,
    );
    let released = release(&sem, payload).await.unwrap();
    assert_eq!(
        (&released["released"], &released["acquisition"]),
        (&json!(true), &json!("r0"))
    );
    assert!(consistent(&sem, "example-lock", 2).await.is_empty());
}

#[tokio::test]
async fn a_version_1_item_is_the_named_error_semaphore_old_format_and_nothing_is_written() {
    let sem = semaphore().await;
    let (client, table) = (sem.store().client(), sem.store().table());
    let v1 = put_version_1_item(client, table, "demo-lock", HOLDER, "old-acquisition").await;
    let input = json!({});
    let ctx = Ctx::new(HOLDER, input.clone(), &now(&sem));
    let err = play_acquire(&sem, &config(), &ctx, &input)
        .await
        .answer
        .unwrap_err();
    assert_eq!(err.error_type, "SemaphoreOldFormat");
    assert!(
        err.error_message
            .contains("\"demo-lock\" was written by version 1"),
        "{}",
        err.error_message
    );
    assert_eq!(route_acquire_error(&err, &input).0, "Fail without a slot");
    assert_eq!(
        raw_item(client, table, "demo-lock").await,
        Some(v1),
        "the version-1 item is left exactly as it was"
    );
}

#[tokio::test]
async fn a_missing_table_is_the_named_error_semaphore_store_error_which_is_retried() {
    let sem = semaphore_on(format!("no-such-table-{:x}", fastrand::u64(..)));
    let input = json!({});
    let ctx = Ctx::new(HOLDER, input.clone(), &now(&sem));
    let err = play_acquire(&sem, &config(), &ctx, &input)
        .await
        .answer
        .unwrap_err();
    assert_eq!(err.error_type, "SemaphoreStoreError");
    assert!(
        err.error_message.contains("does not exist"),
        "{}",
        err.error_message
    );
    let definition = asl::definition("lock-protected.asl.json");
    // Both states that call the function retry it.
    for (_, state) in acquire_states(&definition) {
        let retried = state["Retry"].as_array().unwrap().iter().any(|r| {
            r["ErrorEquals"]
                .as_array()
                .unwrap()
                .contains(&json!("SemaphoreStoreError"))
        });
        assert!(retried);
    }
}

/// #18 item 16 (F12), (b): a machine that calls the acquire function without being one the
/// stack protects (STATE_MACHINE_ARNS) would wait in line for ever (no `SendTaskSuccess` to its
/// tasks) and its failures would never be cleaned up; an Express execution cannot be described
/// at all. Each is refused by name before anything is written, and the definition fails at once.
#[tokio::test]
async fn a_caller_the_stack_does_not_protect_is_misconfigured_and_writes_nothing() {
    let sem = semaphore().await;
    let protected = "arn:aws:states:us-east-1:123456789012:stateMachine:LockProtected";
    let config = config_with(&[("STATE_MACHINE_ARNS", protected)]);
    // A protected caller goes on as before (and leaves an item, so "nothing written" below
    // also means "the existing item is unchanged").
    let ctx = Ctx::new(HOLDER, json!({}), &now(&sem));
    let played = play_acquire(&sem, &config, &ctx, &json!({})).await;
    assert_eq!(played.answer.unwrap()["outcome"], json!("acquired"));
    let before = all_items(&sem).await;

    let rogue = "arn:aws:states:us-east-1:123456789012:execution:NotDeclared:run-1";
    let express =
        "arn:aws:states:us-east-1:123456789012:express:LockProtected:run-2:0b1c7e93-5f5c-4bd8";
    for (caller, says) in [
        (
            rogue,
            format!(
                "{rogue} is an execution of state machine NotDeclared, which this stack does not \
                 protect (its STATE_MACHINE_ARNS: {protected}): its waiters would never be woken \
                 and a slot it holds when it fails would not be cleaned up. Add its ARN to the \
                 stack's ProtectedStateMachineArns parameter"
            ),
        ),
        (
            express,
            format!("{express} is an execution of an Express state machine, which cannot take"),
        ),
    ] {
        let ctx = Ctx::new(caller, json!({}), &now(&sem));
        let err = play_acquire(&sem, &config, &ctx, &json!({}))
            .await
            .answer
            .expect_err(caller);
        assert_eq!(err.error_type, "SemaphoreMisconfigured", "{caller}");
        assert!(
            err.error_message.starts_with(&says),
            "{}",
            err.error_message
        );
        let (next, failed) = route_acquire_error(&err, &json!({}));
        assert_eq!(next, "Fail without a slot", "{caller}");
        assert_eq!(failed.expect("a Fail state").0, "SemaphoreMisconfigured");
    }
    assert_eq!(all_items(&sem).await, before, "a refused caller wrote");
    // Without the list (a deployment that does not set it) every standard execution may call.
    let ctx = Ctx::new(rogue, json!({}), &now(&sem));
    let played = play_acquire(&sem, &config_with(&[]), &ctx, &json!({})).await;
    assert_eq!(played.answer.unwrap()["outcome"], json!("acquired"));
}

/// #18 item 16 (F12), (a): an Express state machine as the work cannot be described or stopped,
/// so a cleanup would free its slot while it runs. Its type comes from DescribeStateMachine
/// (real machines on the local server), asked once per machine per function instance; the
/// acquire is refused by name before anything is written, and the definition fails at once.
/// (c), work the stack does not allow, is `SemaphoreInvalidInput` (see
/// `bad_input_is_semaphore_invalid_input_fails_without_a_slot_and_writes_nothing`).
#[tokio::test]
async fn express_work_is_misconfigured_and_writes_nothing() {
    use aws_sdk_sfn::types::StateMachineType;
    let sfn = local_aws::sfn::client();
    let definition = json!({"StartAt": "P", "States": {"P": {"Type": "Pass", "End": true}}});
    let create = |kind: StateMachineType| {
        let sfn = sfn.clone();
        let definition = definition.to_string();
        async move {
            sfn.create_state_machine()
                .name(local_aws::sfn::unique("work"))
                .definition(definition)
                .role_arn("arn:aws:iam::123456789012:role/semaphore-test")
                .r#type(kind)
                .send()
                .await
                .expect("create a machine")
                .state_machine_arn()
                .to_owned()
        }
    };
    let express = create(StateMachineType::Express).await;
    let standard = create(StateMachineType::Standard).await;
    let counter = local_aws::counter::RequestCounter::new();
    let counted = aws_sdk_sfn::Client::from_conf(
        aws_sdk_sfn::config::Builder::from(&sdk_config())
            .interceptor(counter.clone())
            .build(),
    );
    let allowed = format!("{DEMO},{express},{standard}");
    let mut config = config_with(&[("WORK_STATE_MACHINES", &allowed)]);
    config.deployment.machine_types = Some(lambda_common::MachineTypes::new(counted));
    let sem = semaphore().await;
    let ctx = Ctx::new(HOLDER, json!({"work": standard}), &now(&sem));
    let played = play_acquire(&sem, &config, &ctx, &json!({"work": standard})).await;
    assert_eq!(played.answer.unwrap()["outcome"], json!("acquired"));
    let before = all_items(&sem).await;

    for n in 0..2 {
        let input = json!({"work": express});
        let ctx = Ctx::new(&holder(10 + n), input.clone(), &now(&sem));
        let err = play_acquire(&sem, &config, &ctx, &input)
            .await
            .answer
            .expect_err("Express work is refused");
        assert_eq!(err.error_type, "SemaphoreMisconfigured");
        assert!(
            err.error_message.starts_with(&format!(
                "the work {express} is an Express state machine, which cannot run under this \
                 semaphore"
            )),
            "{}",
            err.error_message
        );
        let (next, failed) = route_acquire_error(&err, &input);
        assert_eq!(next, "Fail without a slot");
        assert_eq!(failed.expect("a Fail state").0, "SemaphoreMisconfigured");
    }
    assert_eq!(all_items(&sem).await, before, "a refused acquire wrote");
    // Each machine's type was asked once: the second refusal came from the instance's memory.
    assert_eq!(
        counter.take().requests.get("SFN.DescribeStateMachine"),
        Some(&2)
    );
}
