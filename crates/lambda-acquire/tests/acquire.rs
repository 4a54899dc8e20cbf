//! The acquire handler invoked with the payloads statemachines/lock-protected.asl.json (and the
//! docs/using.md's fragment, protect-your-workflow.asl.json) render, their context object filled in
//! with real values, against a fresh table on the local server. What the handler completes its
//! task with (`SendTaskSuccess` / `SendTaskFailure`, sent to the local server's Step Functions
//! and kept here) goes through the definition's states as Step Functions would apply them, so
//! every field they read must be there. Covered: the one acquire state (a free slot, a full
//! lock's line, a check after the state's timeout keeping the place, a slow earlier attempt that
//! cannot take the place back, the granted answer), defaults from the environment,
//! lock/limit/work from the input, bad input (nothing written), the redrive guard, the wait
//! budget, a start rate's deferral, the named errors and where each takes the machine.
//! tests/waiting.rs makes the same happen with real parked tasks.

use semaphore_core::flow::answer::child_execution_name;
use semaphore_core::Claim;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lambda_acquire::Config;
use lambda_common::{
    granted_answer, CallbackError, HandOffs, Resolver, Settings, TaskCallbacks, TaskWaker,
};
use lambda_runtime::{Context, Diagnostic, LambdaEvent};
use local_aws::asl::{self, Context as Ctx, ACQUIRE_STATE};
use local_aws::foreign::{put_foreign_item, FOREIGN_FORMAT};
use local_aws::names::{id, limit, lock};
use local_aws::observe::{assert_consistent, observe, raw_item, text, RawRecord};
use local_aws::{all_items, endpoint, fresh_table, sdk_config};
use semaphore_core::{
    protocol, rfc3339_millis, AcquireOutcome, Clock, DynamoStore, FenceKey, FenceReason,
    FencingToken, HolderId, ItemStore, LockName, ManualClock, QueueKey, Run, Semaphore,
    SystemClock, TaskToken, Timing, WriteResult,
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

/// What a task was completed with.
#[derive(Debug, Clone, PartialEq)]
enum Completion {
    Succeeded(Value),
    Failed { error: String, cause: String },
}

/// Task callbacks to the local server's Step Functions, as every function's `main` builds them,
/// that also keep what was sent, by token: the acquire state's output is what its task is
/// completed with, which a test plays through the definition's next states. The tokens here are
/// the test's own, which Step Functions refuses (its answer is passed on, as the function gets
/// it); tests/waiting.rs parks real tasks.
#[derive(Debug, Clone)]
struct Kept {
    sfn: aws_sdk_sfn::Client,
    sent: Arc<Mutex<Vec<(String, Completion)>>>,
}

impl Kept {
    fn new() -> Self {
        Self {
            sfn: aws_sdk_sfn::Client::new(&sdk_config()),
            sent: Arc::default(),
        }
    }

    /// What the task of `token` was last completed with.
    fn completion(&self, token: &str) -> Option<Completion> {
        self.sent
            .lock()
            .unwrap()
            .iter()
            .rev()
            .find(|(t, _)| t == token)
            .map(|(_, c)| c.clone())
    }
}

impl TaskCallbacks for Kept {
    async fn succeed(&self, token: &TaskToken, output: &str) -> Result<(), CallbackError> {
        let parsed = serde_json::from_str(output).expect("a task's output is JSON");
        self.sent
            .lock()
            .unwrap()
            .push((token.as_str().to_owned(), Completion::Succeeded(parsed)));
        self.sfn.succeed(token, output).await
    }

    async fn fail(&self, token: &TaskToken, error: &str, cause: &str) -> Result<(), CallbackError> {
        self.sent.lock().unwrap().push((
            token.as_str().to_owned(),
            Completion::Failed {
                error: error.to_owned(),
                cause: cause.to_owned(),
            },
        ));
        self.sfn.fail(token, error, cause).await
    }
}

/// A semaphore on a fresh table and the functions' hand-offs, as their `main`s build them.
struct World {
    sem: Semaphore<DynamoStore>,
    kept: Kept,
    hand_offs: HandOffs<Kept, lambda_common::SfnExecutions>,
}

impl World {
    fn on(sem: Semaphore<DynamoStore>) -> Self {
        let built = Settings::from_lookup(|_| None)
            .hand_offs(&sdk_config())
            .expect("settings");
        let kept = Kept::new();
        Self {
            hand_offs: HandOffs {
                waker: TaskWaker {
                    callbacks: kept.clone(),
                },
                executions: built.executions,
                metrics: built.metrics,
            },
            kept,
            sem,
        }
    }

    /// Now by the semaphore's clock, as Step Functions writes `$$.State.EnteredTime`.
    fn now(&self) -> String {
        rfc3339_millis(self.sem.now_ms())
    }

    /// Invokes the handler as the runtime does: a JSON payload and a context.
    async fn acquire(&self, config: &Config, payload: Value) -> Result<Value, Diagnostic> {
        lambda_acquire::handle(
            &self.sem,
            config,
            &self.hand_offs,
            LambdaEvent::new(payload, Context::default()),
        )
        .await
        .map(|answer| serde_json::to_value(answer).expect("the answer serializes"))
        .map_err(Diagnostic::from)
    }

    /// The token `holder`'s acquisition holds its slot of `lock` under: the one its acquire
    /// answered, which its release shows (F15).
    async fn token_of(&self, lock_name: &str, holder: &str, acquisition: &str) -> u64 {
        self.sem.status(&lock(lock_name)).await.unwrap().holders[&id(holder, acquisition)]
            .token
            .0
    }

    async fn release(&self, payload: Value) -> Result<Value, Diagnostic> {
        let resolver: Resolver =
            lambda_release::resolver(&settings(env())).expect("the test's settings");
        lambda_release::handle(
            &self.sem,
            &resolver,
            &self.hand_offs,
            LambdaEvent::new(payload, Context::default()),
        )
        .await
        .map(|answer| serde_json::to_value(answer).expect("the answer serializes"))
        .map_err(Diagnostic::from)
    }

    /// An attempt of `definition`'s acquire state, entered as `ctx` says (its task token), with
    /// the state input `input`: the payload it renders, the handler's own answer, and what the
    /// machine does next.
    async fn play(&self, config: &Config, definition: &Value, ctx: &Ctx, input: &Value) -> Played {
        let state = asl::state(definition, ACQUIRE_STATE);
        let payload = asl::render(&state["Parameters"]["Payload"], input, ctx);
        let answer = self.acquire(config, payload.clone()).await;
        // A plain `lambda:invoke` (the Express fragment's): the function's answer is the task's.
        let Some(token) = ctx.task_token.as_deref() else {
            let then = match &answer {
                Ok(output) => Then::Next {
                    state: asl::task_output(
                        state,
                        input,
                        ctx,
                        json!({"Payload": output, "StatusCode": 200}),
                    ),
                    next: state["Next"].as_str().expect("a Next").to_owned(),
                },
                Err(e) => route(state, &e.error_type, &e.error_message),
            };
            return Played {
                payload,
                answer,
                then,
            };
        };
        let then = match (self.kept.completion(token), &answer) {
            (Some(Completion::Succeeded(output)), _) => Then::Next {
                state: asl::task_output(state, input, ctx, output.clone()),
                next: state["Next"].as_str().expect("a Next").to_owned(),
            },
            (Some(Completion::Failed { error, cause }), _) => route(state, &error, &cause),
            // A function error fails the task too (whichever Step Functions sees first).
            (None, Err(e)) => route(state, &e.error_type, &e.error_message),
            (None, Ok(_)) => Then::Parked,
        };
        Played {
            payload,
            answer,
            then,
        }
    }

    /// The Express fragment's acquire state (`ctx` without a task token).
    async fn play_express(&self, config: &Config, ctx: &Ctx, input: &Value) -> Played {
        let definition = asl::definition("protect-your-express-workflow.asl.json");
        self.play(config, &definition, ctx, input).await
    }

    /// The standard fragment's acquire state.
    async fn play_fragment(&self, config: &Config, ctx: &Ctx, input: &Value) -> Played {
        let definition = asl::definition("protect-your-workflow.asl.json");
        self.play(config, &definition, ctx, input).await
    }

    /// The lock-protected machine's acquire state.
    async fn play_machine(&self, config: &Config, ctx: &Ctx, input: &Value) -> Played {
        let definition = asl::definition("lock-protected.asl.json");
        self.play(config, &definition, ctx, input).await
    }
}

async fn world() -> World {
    // Before any test takes its request time: the definitions it plays come from the stack.
    asl::deploy();
    World::on(semaphore_on(fresh_table().await.table().to_owned()))
}

fn semaphore_on(table: String) -> Semaphore<DynamoStore> {
    Settings::from_lookup(move |name| (name == "TABLE_NAME").then(|| table.clone()))
        .semaphore(&sdk_config())
        .expect("settings")
}

/// A world whose time moves only when the test says, with a fence window of 2 s (horizon 1 s +
/// skew 1 s).
async fn world_with_clock() -> (World, Arc<ManualClock>) {
    asl::deploy();
    let clock = Arc::new(ManualClock::new(SystemClock.now_ms()));
    let timing = Timing {
        horizon: Duration::from_secs(1),
        clock_skew: Duration::from_secs(1),
    };
    let sem = Semaphore::new(fresh_table().await)
        .with_clock(clock.clone())
        .with_timing(timing);
    (World::on(sem), clock)
}

/// An attempt of the acquire state played.
struct Played {
    payload: Value,
    answer: Result<Value, Diagnostic>,
    then: Then,
}

/// What the machine does after an attempt of its acquire state.
#[derive(Debug, Clone, PartialEq)]
enum Then {
    /// The task was completed with a slot: the machine goes on to `next` with `state`.
    Next { state: Value, next: String },
    /// The execution waits in line, parked: nothing completed its task.
    Parked,
    /// The task failed with `error` and the state's `Retry` tries it again.
    Retried { error: String },
    /// The task failed with `error` and the state's `Catch` sends the machine to `next`.
    Caught { error: String, next: String },
    /// The task failed with `error` and nothing handles it: the execution fails with it.
    Failed { error: String, cause: String },
}

impl Played {
    fn answer(&self) -> &Value {
        self.answer.as_ref().expect("an answer")
    }

    fn error(&self) -> &Diagnostic {
        self.answer.as_ref().expect_err("an error")
    }

    /// The state the machine goes on with, with a slot.
    fn state(&self) -> &Value {
        match &self.then {
            Then::Next { state, .. } => state,
            other => panic!("not completed with a slot: {other:?}"),
        }
    }
}

/// Where an error of the acquire state takes the machine: its `Retry` first, then its `Catch`.
fn route(state: &Value, error: &str, cause: &str) -> Then {
    fn matching<'a>(list: &'a Value, error: &str) -> Option<&'a Value> {
        list.as_array().expect("a list").iter().find(|r| {
            r["ErrorEquals"]
                .as_array()
                .expect("ErrorEquals")
                .iter()
                .any(|e| e == error || e == "States.ALL")
        })
    }
    if matching(&state["Retry"], error).is_some() {
        return Then::Retried {
            error: error.to_owned(),
        };
    }
    match state.get("Catch").and_then(|c| matching(c, error)) {
        Some(catcher) => Then::Caught {
            error: error.to_owned(),
            next: catcher["Next"].as_str().expect("a Next").to_owned(),
        },
        None => Then::Failed {
            error: error.to_owned(),
            cause: cause.to_owned(),
        },
    }
}

/// Grants the head of the lock's line a slot with the core's own grant write, as a hand-off
/// does, and wakes nobody (tests/waiting.rs wakes real tasks). Answers the granted waiter's
/// fencing token and the answer the hand-off sends its task (`granted_answer` of its record).
async fn grant_head(sem: &Semaphore<DynamoStore>, lock_name: &str) -> (FencingToken, Value) {
    let lock = LockName::new(lock_name).unwrap();
    let head = sem
        .waiters(&lock, None, 1)
        .await
        .unwrap()
        .pop()
        .expect("someone in line");
    let write = protocol::grant(&head, None, &head.terms, sem.now_ms());
    let result = sem.store().write(&write).await.unwrap();
    assert_eq!(
        result,
        WriteResult::Landed { after: None },
        "the grant landed"
    );
    let token = sem.status(&lock).await.unwrap().holders[&head.identity].token;
    let answer = granted_answer(&head.context, token).unwrap();
    (token, serde_json::from_str(&answer).unwrap())
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

/// The one record in line: its holder, place and task token.
fn in_line(records: &[RawRecord]) -> (String, String, String) {
    assert_eq!(records.len(), 1, "{records:?}");
    let r = &records[0];
    (
        text(r, "holder").to_owned(),
        text(r, "place").to_owned(),
        text(r, "task_token").to_owned(),
    )
}

#[tokio::test]
async fn a_critical_section_through_the_definition_with_the_defaults() {
    let w = world().await;
    let config = config();
    let definition = asl::definition("lock-protected.asl.json");
    let input = json!({"work_seconds": 0});
    let entered = w.now();
    let ctx = Ctx::new(HOLDER, input.clone(), &entered).with_task_token("token-1");

    let played = w.play(&config, &definition, &ctx, &input).await;
    assert_eq!(
        played.payload,
        json!({
            "request": input,
            "starts_work": true,
            "execution": HOLDER,
            "redrive_count": 0,
            "state": {"EnteredTime": entered, "RetryCount": 0},
            "task_token": "token-1"
        }),
        "the payload the definition renders: the execution input as the request, who asks, the \
         state's entry and attempt, the task's token"
    );
    let name = child_execution_name(&id(HOLDER, "r0"));
    assert!(name.starts_with("run-1-"), "{name}");
    let answer = json!({
        "acquired": true,
        "outcome": "acquired",
        "token": 1,
        "count": 1,
        "limit": 5,
        "weight": 1,
        "rate": null,
        "lock": "demo-lock",
        "holder": HOLDER,
        "acquisition": "r0",
        "child_name": name,
        "queued_at": null,
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
    });
    // The function completed its own task with the answer: the state's output, which carries
    // the answer only (the input is read again from the context object by the work's start).
    assert_eq!(
        played.then,
        Then::Next {
            state: json!({"semaphore": answer}),
            next: "Protected work".to_owned()
        }
    );
    // Its own answer (for the logs) is the same.
    assert_eq!(played.answer(), &answer);
    let state = played.state().clone();

    // A retry of the task (a Lambda error: a new attempt, with a new token) gets the same slot
    // (F5), and completes the new task with it.
    let retry = ctx.retried("token-2");
    let retried = w.play(&config, &definition, &retry, &input).await;
    assert_eq!(
        (
            &retried.state()["semaphore"]["outcome"],
            &retried.state()["semaphore"]["token"]
        ),
        (&json!("already_held"), &json!(1))
    );

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
    let release_state = asl::state(&definition, "Release slot");
    assert_eq!(work_state["Next"], json!("Release slot"));
    let release_ctx = ctx.entered(&w.now());
    let payload = asl::render(
        &release_state["Parameters"]["Payload"],
        &state,
        &release_ctx,
    );
    assert_eq!(
        payload,
        json!({"semaphore": state["semaphore"]}),
        "the release payload: the acquire answer, not the execution input"
    );
    let released = w.release(payload).await.unwrap();
    assert_eq!(
        released,
        json!({"released": true, "outcome": "released", "count": 0, "lock": "demo-lock",
               "acquisition": "r0", "handed_off": 0, "error": null, "cause": null})
    );
    let done = asl::task_output(
        release_state,
        &state,
        &release_ctx,
        json!({"Payload": released}),
    );
    assert_eq!(release_state["End"], json!(true));
    assert_eq!(
        (
            &done["semaphore"]["token"],
            &done["work"]["output"],
            &done["release"]["released"]
        ),
        (&json!(1), &child_output, &json!(true))
    );
    // The semaphore's share of an uncontended critical section: two state transitions.
    let semaphore_states: Vec<&str> = definition["States"]
        .as_object()
        .unwrap()
        .iter()
        .filter(|(_, s)| {
            s["Parameters"]["FunctionName"].as_str().is_some_and(|f| {
                f == asl::function_arn("acquire") || f == asl::function_arn("release")
            })
        })
        .map(|(name, _)| name.as_str())
        .collect();
    assert_eq!(
        semaphore_states,
        ["Acquire slot", "Release after failure", "Release slot"]
    );
}

#[tokio::test]
async fn a_full_lock_queues_the_execution_and_its_checks_keep_its_place_until_a_hand_off() {
    let w = world().await;
    let config = config();
    let definition = asl::definition("lock-protected.asl.json");
    let acquire_state = asl::state(&definition, ACQUIRE_STATE);
    let input = json!({"lock": "batch", "limit": 1, "work": MINE, "customer": 42});
    let first = Ctx::new(&holder(1), input.clone(), &w.now()).with_task_token("first-1");
    let played = w.play_machine(&config, &first, &input).await;
    let answer = &played.state()["semaphore"];
    assert_eq!(
        (&answer["lock"], &answer["limit"], &answer["outcome"]),
        (&json!("batch"), &json!(1), &json!("acquired"))
    );
    let start = asl::render(
        &asl::state(&definition, "Protected work")["Parameters"],
        played.state(),
        &first,
    );
    assert_eq!(start["StateMachineArn"], json!(MINE));
    assert_eq!(start["Input"]["customer"], json!(42));
    assert_eq!(start["Input"]["semaphore"]["lock"], json!("batch"));

    // A second execution finds the lock full: it is queued, at its request time, with its task's
    // token, and its task stays parked (no transitions while it waits).
    let second_ms = w.sem.now_ms();
    let second =
        Ctx::new(&holder(2), input.clone(), &rfc3339_millis(second_ms)).with_task_token("second-1");
    let played = w.play_machine(&config, &second, &input).await;
    assert_eq!(played.then, Then::Parked);
    let queued = played.answer();
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
            &json!(second.entered_time)
        )
    );
    let place = QueueKey::new(&id(&holder(2), "r0"), second_ms).render();
    assert_eq!(
        in_line(&consistent(&w.sem, "batch", 1).await),
        (holder(2), place.clone(), "second-1".to_owned())
    );
    let seen = observe(w.sem.store().client(), w.sem.store().table(), "batch")
        .await
        .unwrap();
    assert_eq!((seen.waiting, seen.holders.len()), (1, 1));

    // The same attempt invoked again (a request sent twice): still one record, the same task.
    let again = w.play_machine(&config, &second, &input).await;
    assert_eq!(again.then, Then::Parked);
    assert_eq!(
        in_line(&consistent(&w.sem, "batch", 1).await),
        (holder(2), place.clone(), "second-1".to_owned())
    );

    // The state's timeout: its Catch enters it again (the input unchanged), a new attempt with a
    // new token and a new entry time. The check finds its record by who it is and gives it the
    // new token: the same place, nothing more in line.
    let catcher = asl::catcher(acquire_state, "States.Timeout");
    assert_eq!(
        catcher["Next"],
        json!(ACQUIRE_STATE),
        "a timeout checks again"
    );
    let timed_out = asl::caught(catcher, &input, "States.Timeout", "");
    assert_eq!(timed_out, input, "nothing carried between the attempts");
    assert_eq!(
        asl::timeout_seconds(acquire_state, &timed_out),
        300,
        "a check every 300 s"
    );
    let check = second.entered(&w.now()).with_task_token("second-2");
    let checked = w.play_machine(&config, &check, &timed_out).await;
    assert_eq!(checked.then, Then::Parked);
    assert_eq!(checked.answer()["queued_at"], json!(second.entered_time));
    assert_eq!(
        in_line(&consistent(&w.sem, "batch", 1).await),
        (holder(2), place.clone(), "second-2".to_owned())
    );
    // The first attempt's invocation, slow, arrives after the check: its task is over, and it
    // does not give the record its dead token back.
    let slow = w.play_machine(&config, &second, &input).await;
    assert_eq!(slow.then, Then::Parked);
    assert_eq!(
        in_line(&consistent(&w.sem, "batch", 1).await),
        (holder(2), place.clone(), "second-2".to_owned())
    );

    // The first execution releases, and the slot is granted to the head of the line: its task
    // (the check's) gets the waiter's stored answer with the slot filled in, which goes on to
    // "Protected work".
    w.sem
        .release(&lock("batch"), &id(&holder(1), "r0"), Claim::Operator)
        .await
        .unwrap();
    let (token, granted) = grant_head(&w.sem, "batch").await;
    assert_eq!(
        (&granted["acquired"], &granted["outcome"], &granted["token"]),
        (&json!(true), &json!("acquired"), &json!(token.0))
    );
    let state = asl::task_output(acquire_state, &timed_out, &check, granted.clone());
    assert_eq!(state["semaphore"], granted);
    assert_eq!(acquire_state["Next"], json!("Protected work"));
    let start = asl::render(
        &asl::state(&definition, "Protected work")["Parameters"],
        &state,
        &check,
    );
    let name = child_execution_name(&id(&holder(2), "r0"));
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
    assert!(consistent(&w.sem, "batch", 1).await.is_empty());

    // Granted while its task had timed out (the hand-off's wake-up failed): the next check
    // finds the slot its own and completes its task with it.
    let late_check = second.entered(&w.now()).with_task_token("second-3");
    let found = w.play_machine(&config, &late_check, &timed_out).await;
    assert_eq!(
        (
            &found.state()["semaphore"]["outcome"],
            &found.state()["semaphore"]["token"]
        ),
        (&json!("already_held"), &json!(token.0))
    );

    // The default lock is another semaphore: not full.
    let other = Ctx::new(&holder(3), json!({}), &w.now()).with_task_token("other-1");
    let played = w.play_machine(&config, &other, &json!({})).await;
    let answer = &played.state()["semaphore"];
    assert_eq!(
        (&answer["lock"], &answer["limit"], &answer["outcome"]),
        (&json!("demo-lock"), &json!(5), &json!("acquired"))
    );
    let seen = observe(w.sem.store().client(), w.sem.store().table(), "batch")
        .await
        .expect("the item exists");
    seen.assert_safe(1);
}

#[tokio::test]
async fn lambda_work_runs_through_the_runner_which_invokes_the_function() {
    let w = world().await;
    let input = json!({"work": FUNCTION, "n": 1});
    let ctx = Ctx::new(HOLDER, input.clone(), &w.now()).with_task_token("t");
    let played = w.play_machine(&config(), &ctx, &input).await;
    let answer = &played.state()["semaphore"];
    assert_eq!(answer["work"]["state_machine"], json!(RUNNER));
    assert_eq!(
        answer["work"]["context"]["semaphore"]["function"],
        json!(FUNCTION)
    );
    let definition = asl::definition("lock-protected.asl.json");
    let start = asl::render(
        &asl::state(&definition, "Protected work")["Parameters"],
        played.state(),
        &ctx,
    );
    // The runner's one state invokes the function named in its input with the whole input.
    let runner = asl::definition("work-function.asl.json");
    let invoke = asl::state(&runner, runner["StartAt"].as_str().unwrap());
    let child_ctx = Ctx::new("arn:child", start["Input"].clone(), &w.now());
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
    let w = world().await;
    let config = config();
    // One good acquire, so that "nothing written" also means "the existing item is unchanged".
    let ctx = Ctx::new(HOLDER, json!({}), &w.now()).with_task_token("good");
    w.play_machine(&config, &ctx, &json!({})).await.state();
    let before = all_items(&w.sem).await;

    let other = "arn:aws:states:us-east-1:123456789012:stateMachine:not-allowed";
    let not_allowed = |arn: &str| {
        format!(
            "request.work is \"{arn}\", which this stack does not allow: name one it allows \
             (state machines: {DEMO}, {MINE}; Lambda functions: {FUNCTION}), or leave it out to \
             run the default, {DEMO}. To allow another, name it under the stack's \
             WorkStateMachinePrefix or WorkFunctionPrefix parameter (the acquire function's \
             WORK_STATE_MACHINES and WORK_FUNCTIONS)"
        )
    };
    let request_kind = |got: &str| {
        format!("request must be a JSON object (what the execution asks for); got {got}")
    };
    let weight = "weight must be a whole number from 1 to the limit (10000 at most)";
    let rate = "rate must be a number of acquisitions per second from 0.000011574074074074073 \
                (one a day) to 1000";
    let above = |weight: u32, limit: u32| {
        format!(
            "weight {weight} is above the limit {limit}: it could never be granted; ask for at \
             most {limit}, or raise the limit"
        )
    };
    let cases: Vec<(Value, String)> =
        vec![
        (json!("run me"), request_kind("a string \"run me\"")),
        (json!([1, 2]), request_kind("an array [1,2]")),
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
            "request.work must be a JSON string; got an object {\"arn\":\"arn:aws:states:\
             us-east-1:123456789012:stateMachine:my-work\"}"
                .into(),
        ),
        (
            json!({"limit": 0}),
            "request.limit: limit must be a whole number from 1 to 10000; got 0".into(),
        ),
        (
            json!({"limit": "5"}),
            "request.limit: limit must be a whole number from 1 to 10000; got the string \"5\""
                .into(),
        ),
        (
            json!({"limit": 10001}),
            "request.limit: limit must be a whole number from 1 to 10000; got 10001".into(),
        ),
        (
            json!({"lock": ""}),
            "request.lock: lock name is empty: pass the name of the semaphore, e.g. \
             \"demo-lock\""
                .into(),
        ),
        (
            json!({"lock": ["a"]}),
            "request.lock must be a JSON string; got an array [\"a\"]".into(),
        ),
        (
            json!({"weight": 0}),
            format!("request.weight: {weight}; got 0"),
        ),
        (
            json!({"weight": 2.5}),
            format!("request.weight: {weight}; got 2.5"),
        ),
        (
            json!({"weight": "4"}),
            format!("request.weight: {weight}; got the string \"4\""),
        ),
        // Above the default limit (5), and above the input's own limit.
        (json!({"weight": 6}), above(6, 5)),
        (json!({"lock": "small-lock", "limit": 2, "weight": 3}), above(3, 2)),
        (json!({"rate": 0}), format!("request.rate: {rate}; got 0")),
        (
            json!({"rate": "fast"}),
            format!("request.rate: {rate}; got the string \"fast\""),
        ),
        (
            json!({"rate": 1e9}),
            format!("request.rate: {rate}; got 1000000000"),
        ),
    ];
    for (n, (input, message)) in cases.into_iter().enumerate() {
        let ctx =
            Ctx::new(&holder(2), input.clone(), &w.now()).with_task_token(&format!("bad-{n}"));
        let played = w.play_machine(&config, &ctx, &input).await;
        let err = played.error();
        assert_eq!(err.error_type, "SemaphoreInvalidInput", "{input}");
        assert_eq!(err.error_message, message, "{input}");
        // Nothing in the acquire state handles it: the execution fails with it at once.
        assert_eq!(
            played.then,
            Then::Failed {
                error: "SemaphoreInvalidInput".to_owned(),
                cause: message
            },
            "{input}"
        );
    }
    // Without a default, an input without a lock is refused too.
    let config = config_with(&[("DEFAULT_LOCK", "")]);
    let ctx = Ctx::new(&holder(3), json!({}), &w.now()).with_task_token("no-lock");
    let played = w.play_machine(&config, &ctx, &json!({})).await;
    assert_eq!(
        (
            played.error().error_type.as_str(),
            played.error().error_message.as_str()
        ),
        (
            "SemaphoreInvalidInput",
            "lock is missing: pass \"lock\" in the request, e.g. \"lock\": \"demo-lock\", or set \
             the function's DEFAULT_LOCK"
        )
    );
    // A payload that is not one the acquire state renders.
    for (payload, message) in [
        (
            json!("demo-lock"),
            format!(
                "the payload must be a JSON object {}; got a string \"demo-lock\"",
                lambda_common::ACQUIRE_PAYLOAD
            ),
        ),
        (
            json!({"request": {}, "execution": HOLDER, "state": {"EnteredTime": "yesterday"},
                   "task_token": "t"}),
            "state.EnteredTime must be an RFC 3339 date-time".to_owned(),
        ),
        (
            json!({"request": {"lock": "l", "limit": 2}, "execution": HOLDER,
                   "state": {"EnteredTime": w.now()}}),
            "request.lease is missing: a caller without a task_token".to_owned(),
        ),
    ] {
        let err = w.acquire(&config, payload.clone()).await.unwrap_err();
        assert_eq!(err.error_type, "SemaphoreInvalidInput", "{payload}");
        assert!(
            err.error_message.starts_with(&message),
            "{payload}: {}",
            err.error_message
        );
    }
    assert_eq!(all_items(&w.sem).await, before, "nothing was written");
}

#[tokio::test]
async fn a_redriven_execution_acquires_in_its_new_run_while_the_old_runs_fence_stands() {
    let (w, clock) = world_with_clock().await;
    let config = config();
    let demo_lock = lock("demo-lock");
    let input = json!({"work_seconds": 5});
    let started_ms = w.sem.now_ms();
    let run0 = Ctx::new(HOLDER, input.clone(), &w.now()).with_task_token("r0-1");

    // Run 0 takes a slot and starts its work; then it is aborted, and its cleanup frees the slot
    // and fences run 0 of the execution.
    let played = w.play_machine(&config, &run0, &input).await;
    let answer = played.state()["semaphore"].clone();
    assert_eq!(
        (&answer["outcome"], &answer["acquisition"], &answer["token"]),
        (&json!("acquired"), &json!("r0"), &json!(1))
    );
    let cleaned = w
        .sem
        .cleanup(&demo_lock, &HolderId::new(HOLDER).unwrap())
        .await
        .unwrap();
    assert_eq!(cleaned.freed.len(), 1);
    let run0_fence = FenceKey::execution(&HolderId::new(HOLDER).unwrap(), Run::FIRST);

    // Redriven, it enters its acquire state again: run 1, acquisition r1, which no cleanup
    // fenced.
    clock.advance_ms(500);
    let run1 = run0.redriven(1).entered(&w.now()).with_task_token("r1-1");
    let played = w.play_machine(&config, &run1, &input).await;
    let redriven = &played.state()["semaphore"];
    assert_eq!(
        (
            &redriven["acquired"],
            &redriven["outcome"],
            &redriven["acquisition"]
        ),
        (&json!(true), &json!("acquired"), &json!("r1"))
    );
    // Its work is a new child: the old one's name belongs to run 0.
    assert_ne!(redriven["work"]["name"], answer["work"]["name"]);
    assert_eq!(
        redriven["work"]["name"],
        json!(child_execution_name(&id(HOLDER, "r1")))
    );
    // Run 0's fence still stands (no rotation happened): it keeps run 0's zombies out.
    let item = w.sem.status(&demo_lock).await.unwrap();
    assert!(item.is_fenced(&run0_fence));
    assert_eq!(item.fences.rotated_at_ms, None);
    let late = w
        .sem
        .acquire_requested_at(&demo_lock, &id(HOLDER, "r0"), limit(5), started_ms)
        .await
        .unwrap();
    assert_eq!(late, AcquireOutcome::Fenced(FenceReason::ExecutionEnded));

    // Run 1 ends too: its cleanup fences run 1 and frees its slot; a zombie acquire of run 1 is
    // refused by its own run's fence, and fails its task.
    let cleaned = w
        .sem
        .cleanup_run(&demo_lock, &HolderId::new(HOLDER).unwrap(), Run(1))
        .await
        .unwrap();
    assert_eq!(cleaned.freed.len(), 1);
    let zombie = w
        .play_machine(&config, &run1.with_task_token("r1-2"), &input)
        .await;
    assert_eq!(zombie.error().error_type, "SemaphoreFenced");
    assert!(matches!(zombie.then, Then::Failed { .. }));
    assert!(w.sem.status(&demo_lock).await.unwrap().holders.is_empty());
}

#[tokio::test]
async fn a_fence_is_final_for_a_run_that_was_not_redriven_or_an_acquisition_released() {
    let w = world().await;
    let config = config();
    let input = json!({});
    let ctx = Ctx::new(HOLDER, input.clone(), &w.now()).with_task_token("t1");
    w.play_machine(&config, &ctx, &input).await.state();
    w.sem
        .cleanup(&lock("demo-lock"), &HolderId::new(HOLDER).unwrap())
        .await
        .unwrap();

    // A zombie or late retry of run 0: the execution ended and was cleaned up.
    let played = w.play_machine(&config, &ctx.retried("t2"), &input).await;
    let err = played.error();
    assert_eq!(err.error_type, "SemaphoreFenced");
    assert_eq!(
        err.error_message,
        format!(
            "acquisition r0 of {HOLDER} on lock \"demo-lock\" is fenced: the execution was \
             cleaned up after it ended; it can never hold a slot, a new acquire needs a new \
             acquisition id"
        )
    );
    assert!(matches!(played.then, Then::Failed { .. }));

    // Run 1 released its slot; a late attempt of its acquire is fenced.
    let run = Ctx::new(&holder(2), input.clone(), &w.now())
        .redriven(1)
        .with_task_token("run1");
    let state = w.play_machine(&config, &run, &input).await.state().clone();
    let released = w
        .release(json!({"semaphore": state["semaphore"]}))
        .await
        .unwrap();
    assert_eq!(released["released"], json!(true));
    let late = w
        .play_machine(&config, &run.retried("run1-again"), &input)
        .await;
    assert_eq!(late.error().error_type, "SemaphoreFenced");
    assert!(
        late.error()
            .error_message
            .contains("is fenced: this acquisition was already released"),
        "{}",
        late.error().error_message
    );
    assert_eq!(w.sem.status(&lock("demo-lock")).await.unwrap().count(), 0);
}

#[tokio::test]
async fn waiting_past_the_budget_is_semaphore_wait_timeout_out_of_line_and_holding_nothing() {
    let (w, clock) = world_with_clock().await;
    let config = config_with(&[("MAX_WAIT_SECONDS", "60")]);
    let input = json!({"lock": "busy", "limit": 1});
    let holding = Ctx::new(&holder(1), input.clone(), &w.now()).with_task_token("h");
    w.play_machine(&config, &holding, &input).await.state();

    // Queued now; checked 30 s later (within the budget), it waits on.
    let patient = Ctx::new(&holder(2), input.clone(), &w.now()).with_task_token("p-1");
    assert_eq!(
        w.play_machine(&config, &patient, &input).await.then,
        Then::Parked
    );
    clock.advance_ms(30_000);
    let check = patient.entered(&w.now()).with_task_token("p-2");
    assert_eq!(
        w.play_machine(&config, &check, &input).await.then,
        Then::Parked
    );
    // 61 s after it was queued: the check takes it out of line, and the execution fails.
    clock.advance_ms(31_000);
    let check = patient.entered(&w.now()).with_task_token("p-3");
    let played = w.play_machine(&config, &check, &input).await;
    let err = played.error();
    assert_eq!(err.error_type, "SemaphoreWaitTimeout");
    assert_eq!(
        err.error_message,
        format!(
            "{} has waited 61 s for a slot of lock \"busy\" (limit 1) longer than the acquire \
             function's MAX_WAIT_SECONDS of 60 s. Start it again later, or raise the limit or \
             the stack's MaxWaitSeconds; it holds no slot",
            holder(2)
        )
    );
    assert!(matches!(played.then, Then::Failed { .. }));
    assert!(
        consistent(&w.sem, "busy", 1).await.is_empty(),
        "out of line, and the lock no longer counts it"
    );
    let item = w.sem.status(&lock("busy")).await.unwrap();
    assert_eq!(
        item.holders.keys().cloned().collect::<Vec<_>>(),
        [id(&holder(1), "r0")]
    );

    // However long an execution ran before it asked, a free slot is taken: the budget bounds
    // the wait in line only.
    let late = Ctx::new(&holder(3), json!({"lock": "free"}), &w.now()).with_task_token("late");
    let played = w
        .play_machine(&config, &late, &json!({"lock": "free"}))
        .await;
    assert_eq!(played.state()["semaphore"]["outcome"], json!("acquired"));

    // Granted just before its check past the budget: it is out of line already, so the check
    // finds the slot its own and goes on with it instead of failing.
    let granted = Ctx::new(&holder(4), input.clone(), &w.now()).with_task_token("g-1");
    assert_eq!(
        w.play_machine(&config, &granted, &input).await.then,
        Then::Parked
    );
    w.sem
        .release(&lock("busy"), &id(&holder(1), "r0"), Claim::Operator)
        .await
        .unwrap();
    let (token, _) = grant_head(&w.sem, "busy").await;
    clock.advance_ms(61_000);
    let check = granted.entered(&w.now()).with_task_token("g-2");
    let played = w.play_machine(&config, &check, &input).await;
    assert_eq!(
        (
            &played.state()["semaphore"]["outcome"],
            &played.state()["semaphore"]["token"]
        ),
        (&json!("already_held"), &json!(token.0))
    );

    // A wait checked more often than its execution's history has room for ends too, with a
    // message that says how to check less often.
    let counted = Ctx::new(&holder(5), input.clone(), &w.now()).with_task_token("c-1");
    assert_eq!(
        w.play_machine(&config, &counted, &input).await.then,
        Then::Parked
    );
    let waiter = semaphore_core::WaiterId::of(&id(&holder(5), "r0")).render();
    checked_to_the_budget(w.sem.store(), "busy", &waiter).await;
    clock.advance_ms(1_000);
    let check = counted.entered(&w.now()).with_task_token("c-2");
    let played = w.play_machine(&config, &check, &input).await;
    assert_eq!(played.error().error_type, "SemaphoreWaitTimeout");
    assert!(
        played
            .error()
            .error_message
            .contains("more would pass Step Functions' 25,000 events"),
        "{}",
        played.error().error_message
    );
    assert!(consistent(&w.sem, "busy", 1).await.is_empty());
}

/// Gives waiter `waiter`'s record in `lock`'s line as many checks as a parked execution's
/// history has room for (`MAX_FALLBACK_CHECKS`), as a wait of that many checks would leave it.
async fn checked_to_the_budget(store: &semaphore_core::DynamoStore, lock: &str, waiter: &str) {
    use aws_sdk_dynamodb::types::AttributeValue;
    store
        .client()
        .update_item()
        .table_name(store.queue_table())
        .key("lock", AttributeValue::S(lock.into()))
        .key("waiter", AttributeValue::S(waiter.into()))
        .update_expression("SET checks = :n")
        .expression_attribute_values(
            ":n",
            AttributeValue::N(lambda_common::MAX_FALLBACK_CHECKS.to_string()),
        )
        .send()
        .await
        .expect("set the record's checks");
}

/// Weights and a start rate from the execution input: the answers carry them, the item keeps
/// the sum of the weights, and an acquire the rate holds back is queued like one that finds the
/// lock full. A head of the line the rate holds back longer than a hand-off waits is told so by
/// `SemaphoreRateLimited`, which the acquire state retries: the retry, a new attempt, checks,
/// keeps its place and is granted once the rate allows.
#[tokio::test]
async fn a_weight_and_a_start_rate_from_the_input_and_a_rate_limited_head_retries_in_its_place() {
    let (w, clock) = world_with_clock().await;
    let config = config();
    let definition = asl::definition("lock-protected.asl.json");
    let heavy = json!({"lock": "paced", "limit": 3, "weight": 2, "rate": 0.5});
    let first = Ctx::new(&holder(1), heavy.clone(), &w.now()).with_task_token("heavy");
    let started_ms = w.sem.now_ms();
    let played = w.play_machine(&config, &first, &heavy).await;
    let heavy_answer = played.state()["semaphore"].clone();
    assert_eq!(
        (
            &heavy_answer["outcome"],
            &heavy_answer["limit"],
            &heavy_answer["weight"],
            &heavy_answer["rate"]
        ),
        (&json!("acquired"), &json!(3), &json!(2), &json!(0.5))
    );
    let seen = observe(w.sem.store().client(), w.sem.store().table(), "paced")
        .await
        .unwrap();
    assert_eq!((seen.used, &seen.weights), (2, &vec![2]));
    assert_eq!(seen.started_at, Some(started_ms));
    seen.assert_safe(3);

    // A second execution, weight 1: it fits (2 + 1 <= 3), but one start every 2 s is spent: it
    // is queued, and its own hand-off finds the next start 1.5 s away, within what a hand-off
    // waits (2 s): it waits, grants it the slot and completes its task.
    clock.advance_ms(500);
    let light = json!({"lock": "paced", "limit": 3, "rate": 0.5});
    let second = Ctx::new(&holder(2), light.clone(), &w.now()).with_task_token("light-1");
    let played = w.play_machine(&config, &second, &light).await;
    let granted = &played.state()["semaphore"];
    assert_eq!(
        (&granted["outcome"], &granted["weight"]),
        (&json!("acquired"), &json!(1)),
        "{granted}"
    );
    assert!(
        w.sem.now_ms() >= started_ms + 2_000,
        "not before the rate allows"
    );
    assert_eq!(played.answer()["outcome"], json!("queued"));
    let seen = observe(w.sem.store().client(), w.sem.store().table(), "paced")
        .await
        .unwrap();
    assert_eq!((seen.used, seen.started_at), (3, Some(started_ms + 2_000)));

    // The heavy holder's release frees the weight its answer names.
    let released = w.release(json!({"semaphore": heavy_answer})).await.unwrap();
    assert_eq!(
        (&released["released"], &released["count"]),
        (&json!(true), &json!(1))
    );
    let seen = observe(w.sem.store().client(), w.sem.store().table(), "paced")
        .await
        .unwrap();
    assert_eq!((seen.used, &seen.weights), (1, &vec![1]));
    let acquire_state = asl::state(&definition, ACQUIRE_STATE);
    // The definition retries SemaphoreRateLimited (no Wait state of its own), and catches
    // SemaphoreExpired and its timeout into itself.
    assert_eq!(
        route(acquire_state, "SemaphoreRateLimited", ""),
        Then::Retried {
            error: "SemaphoreRateLimited".to_owned()
        }
    );
    for error in ["SemaphoreExpired", "States.Timeout"] {
        assert_eq!(
            route(acquire_state, error, ""),
            Then::Caught {
                error: error.to_owned(),
                next: ACQUIRE_STATE.to_owned()
            }
        );
    }
}

/// A head of the line the start rate holds back for longer than a hand-off waits: the
/// hand-off fails its task with `SemaphoreRateLimited`; the acquire state's retry is a new
/// attempt (a new token) whose check keeps the place and, once the rate allows, is granted.
#[tokio::test]
async fn a_rate_limited_head_is_retried_in_its_place_and_granted_when_the_rate_allows() {
    let (w, clock) = world_with_clock().await;
    let config = config();
    let slow = json!({"lock": "slow", "limit": 2, "rate": 0.1});
    let first = Ctx::new(&holder(1), slow.clone(), &w.now()).with_task_token("first");
    w.play_machine(&config, &first, &slow).await.state();
    let started_ms = w.sem.now_ms();

    // 10 s between starts: the second is queued, and its own hand-off, 10 s from the next
    // start, defers it: its task fails with SemaphoreRateLimited, which the state retries.
    let second_ms = w.sem.now_ms();
    let second = Ctx::new(&holder(2), slow.clone(), &w.now()).with_task_token("second-1");
    let played = w.play_machine(&config, &second, &slow).await;
    assert_eq!(
        played.then,
        Then::Retried {
            error: "SemaphoreRateLimited".to_owned()
        }
    );
    let Some(Completion::Failed { cause, .. }) = w.kept.completion("second-1") else {
        panic!("the task was failed")
    };
    assert!(
        cause.contains(&format!("until {}", rfc3339_millis(started_ms + 10_000))),
        "{cause}"
    );
    let place = QueueKey::new(&id(&holder(2), "r0"), second_ms).render();
    assert_eq!(
        in_line(&consistent(&w.sem, "slow", 2).await),
        (holder(2), place.clone(), "second-1".to_owned())
    );
    // A newcomer does not pass it.
    let newcomer = Ctx::new(&holder(3), slow.clone(), &w.now()).with_task_token("third-1");
    let played = w.play_machine(&config, &newcomer, &slow).await;
    assert_ne!(played.answer()["outcome"], json!("acquired"));

    // The retry, before the rate allows: a new attempt, same place, the new token; deferred
    // again.
    clock.advance_ms(4_000);
    let retry = second.retried("second-2");
    let played = w.play_machine(&config, &retry, &slow).await;
    assert_eq!(
        played.then,
        Then::Retried {
            error: "SemaphoreRateLimited".to_owned()
        }
    );
    let records = consistent(&w.sem, "slow", 2).await;
    assert_eq!(
        (text(&records[0], "place"), text(&records[0], "task_token")),
        (place.as_str(), "second-2")
    );
    // The next retry once the rate allows: granted, its task completed with the slot.
    clock.advance_ms(6_000);
    let retry = retry.retried("second-3");
    let played = w.play_machine(&config, &retry, &slow).await;
    assert_eq!(
        (
            &played.state()["semaphore"]["outcome"],
            &played.state()["semaphore"]["holder"]
        ),
        (&json!("acquired"), &json!(holder(2)))
    );
    assert_eq!(
        played.state()["semaphore"]["queued_at"],
        json!(rfc3339_millis(second_ms))
    );
    let item = w.sem.status(&lock("slow")).await.unwrap();
    assert!(item.started_at_ms.unwrap() >= started_ms + 10_000);
}

#[tokio::test]
async fn a_request_older_than_the_horizon_is_semaphore_expired_writes_nothing_and_is_asked_again() {
    let w = world().await;
    let config = config();
    let input = json!({});
    let run1 = Ctx::new(HOLDER, input.clone(), &w.now()).with_task_token("t1");
    w.play_machine(&config, &run1, &input).await.state();
    let before = all_items(&w.sem).await;

    // The acquire state was entered longer ago than the horizon (a Lambda that took that long to
    // run it): a rotation may have dropped a fence this acquire had to meet, so it takes nothing.
    let horizon_ms = u64::try_from(w.sem.timing().horizon.as_millis()).unwrap();
    let entered = rfc3339_millis(SystemClock.now_ms() - horizon_ms - 1_000);
    let run2 = Ctx::new(&holder(2), input.clone(), &entered).with_task_token("t2");
    let played = w.play_machine(&config, &run2, &input).await;
    assert_eq!(played.error().error_type, "SemaphoreExpired");
    assert_eq!(
        played.then,
        Then::Caught {
            error: "SemaphoreExpired".to_owned(),
            next: ACQUIRE_STATE.to_owned()
        },
        "the state catches it into itself, which makes a new request time"
    );
    assert_eq!(all_items(&w.sem).await, before, "nothing was written");
    let again = run2.entered(&w.now()).with_task_token("t3");
    let played = w.play_machine(&config, &again, &input).await;
    assert_eq!(
        (
            &played.state()["semaphore"]["outcome"],
            &played.state()["semaphore"]["token"]
        ),
        (&json!("acquired"), &json!(2))
    );
}

#[tokio::test]
async fn the_protect_your_workflow_fragment_reads_only_what_the_answers_give() {
    let w = world().await;
    let config = config();
    let fragment = asl::definition("protect-your-workflow.asl.json");
    let states: Vec<&str> = fragment["States"]
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(
        states,
        [
            "Acquire slot",
            "Fail with the error",
            "Release after failure",
            "Release slot",
            "Your work"
        ],
        "three states of the semaphore around yours"
    );
    let input = json!({"order": 7, "lock": "not-the-semaphore's"});
    let ctx = Ctx::new(HOLDER, input.clone(), &w.now()).with_task_token("f1");
    let played = w.play(&config, &fragment, &ctx, &input).await;
    let Then::Next { state, next } = played.then.clone() else {
        panic!("{:?}", played.then)
    };
    let answer = state["semaphore"].clone();
    assert_eq!(
        (&answer["outcome"], &answer["lock"], &answer["work"]),
        (&json!("acquired"), &json!("example-lock"), &json!(null)),
        "the fragment's request names its lock; its input is its own"
    );
    // Your work: one branch of a Parallel state (so that one Catch covers all its states),
    // whose placeholder passes the fencing token on.
    let work_state = asl::state(&fragment, &next);
    assert_eq!(work_state["Type"], json!("Parallel"));
    let branch = &work_state["Branches"][0];
    let placeholder = &branch["States"][branch["StartAt"].as_str().unwrap()];
    let branch_output = asl::render(&placeholder["Parameters"], &state, &ctx);
    assert_eq!(branch_output["fencing_token"], answer["token"]);
    // Its work succeeded: the release after it.
    let after_work = asl::task_output(work_state, &state, &ctx, json!([branch_output]));
    let release_state = asl::state(&fragment, work_state["Next"].as_str().unwrap());
    let payload = asl::render(&release_state["Parameters"]["Payload"], &after_work, &ctx);
    assert_eq!(payload, json!({"semaphore": answer}));
    let released = w.release(payload).await.unwrap();
    assert_eq!(
        (&released["released"], &released["acquisition"]),
        (&json!(true), &json!("r0"))
    );
    // Its work failed: the release after failure names the error to fail with.
    let catcher = asl::catcher(work_state, "MyError");
    let failed = asl::caught(catcher, &state, "MyError", "my cause");
    let release_state = asl::state(&fragment, catcher["Next"].as_str().unwrap());
    let payload = asl::render(&release_state["Parameters"]["Payload"], &failed, &ctx);
    let released = w.release(payload).await.unwrap();
    let failed = asl::task_output(release_state, &failed, &ctx, json!({"Payload": released}));
    let fail = asl::state(&fragment, release_state["Next"].as_str().unwrap());
    assert_eq!(
        asl::fail(fail, &failed),
        ("MyError".to_owned(), "my cause".to_owned())
    );

    // Two executions hold both slots; a third finds the lock full and waits in line.
    for n in [2, 3] {
        let ctx = Ctx::new(&holder(n), input.clone(), &w.now()).with_task_token(&format!("f{n}"));
        w.play(&config, &fragment, &ctx, &input).await.state();
    }
    let third = Ctx::new(&holder(4), input.clone(), &w.now()).with_task_token("f4");
    assert_eq!(
        w.play(&config, &fragment, &third, &input).await.then,
        Then::Parked
    );
    assert_eq!(consistent(&w.sem, "example-lock", 2).await.len(), 1);

    // A slot is freed and granted to it: the granted answer gives "Your work" its fencing token.
    w.sem
        .release(
            &lock("example-lock"),
            &id(&holder(2), "r0"),
            Claim::Operator,
        )
        .await
        .unwrap();
    let (token, granted) = grant_head(&w.sem, "example-lock").await;
    let acquire_state = asl::state(&fragment, ACQUIRE_STATE);
    let state = asl::task_output(acquire_state, &input, &third, granted.clone());
    assert_eq!(state["semaphore"], granted);
    assert_eq!(
        (
            &granted["acquired"],
            &granted["token"],
            &granted["child_name"]
        ),
        (
            &json!(true),
            &json!(token.0),
            &json!(child_execution_name(&id(&holder(4), "r0")))
        )
    );
    let branch_output = asl::render(&placeholder["Parameters"], &state, &third);
    assert_eq!(branch_output, json!({"fencing_token": token.0}));
    let after_work = asl::task_output(work_state, &state, &third, json!([branch_output]));
    let release_state = asl::state(&fragment, work_state["Next"].as_str().unwrap());
    let payload = asl::render(&release_state["Parameters"]["Payload"], &after_work, &third);
    let released = w.release(payload).await.unwrap();
    assert_eq!(released["released"], json!(true));
    assert!(consistent(&w.sem, "example-lock", 2).await.is_empty());
}

#[tokio::test]
async fn an_item_of_a_foreign_format_is_the_named_error_semaphore_unknown_format_and_nothing_is_written(
) {
    let w = world().await;
    let (client, table) = (w.sem.store().client(), w.sem.store().table());
    let foreign = put_foreign_item(
        client,
        table,
        "demo-lock",
        HOLDER,
        "other-acquisition",
        Some(FOREIGN_FORMAT),
    )
    .await;
    let input = json!({});
    let ctx = Ctx::new(HOLDER, input.clone(), &w.now()).with_task_token("t");
    let played = w.play_machine(&config(), &ctx, &input).await;
    assert_eq!(played.error().error_type, "SemaphoreUnknownFormat");
    assert!(
        played
            .error()
            .error_message
            .contains("\"demo-lock\" is in format 99, not a format this version reads"),
        "{}",
        played.error().error_message
    );
    assert!(matches!(played.then, Then::Failed { .. }));
    assert_eq!(
        raw_item(client, table, "demo-lock").await,
        Some(foreign),
        "the item is left exactly as it was"
    );
}

#[tokio::test]
async fn a_missing_table_is_the_named_error_semaphore_store_error_which_is_retried() {
    asl::deploy();
    let w = World::on(semaphore_on(format!(
        "no-such-table-{:x}",
        fastrand::u64(..)
    )));
    let input = json!({});
    let ctx = Ctx::new(HOLDER, input.clone(), &w.now()).with_task_token("t");
    let played = w.play_machine(&config(), &ctx, &input).await;
    assert_eq!(played.error().error_type, "SemaphoreStoreError");
    assert!(
        played.error().error_message.contains("does not exist"),
        "{}",
        played.error().error_message
    );
    assert_eq!(
        played.then,
        Then::Retried {
            error: "SemaphoreStoreError".to_owned()
        }
    );
}

/// An uncontended acquire through the function is one conditional write and no read, as the
/// AWS sample's is: the execution's record in line is read only when the write is refused (a
/// waiter that checks again, or a lock that is full).
#[tokio::test]
async fn an_uncontended_acquire_is_one_write_and_no_read() {
    asl::deploy();
    let table = fresh_table().await.table().to_owned();
    let counter = local_aws::counter::RequestCounter::new();
    let sem = Semaphore::new(DynamoStore::new(
        counter.dynamodb_client(endpoint()),
        &table,
    ));
    let w = World::on(sem);
    let config = config();
    // The lock's first write creates its item (a refused update, then a put): not counted.
    let warm = Ctx::new(HOLDER, json!({}), &w.now()).with_task_token("warm");
    w.play_machine(&config, &warm, &json!({})).await.state();
    counter.take();
    let holder = "arn:aws:states:us-east-1:123456789012:execution:LockProtected:run-2";
    let ctx = Ctx::new(holder, json!({}), &w.now()).with_task_token("uncontended");
    let played = w.play_machine(&config, &ctx, &json!({})).await;
    assert_eq!(played.state()["semaphore"]["outcome"], json!("acquired"));
    let sent = counter.take();
    assert_eq!(
        (
            sent.get("DynamoDB.UpdateItem"),
            sent.service_total("DynamoDB")
        ),
        (1, 1),
        "{sent:?}"
    );
    // Full: now it looks for its own record, then queues.
    let full = json!({"lock": "one", "limit": 1});
    let first = Ctx::new(HOLDER, full.clone(), &w.now()).with_task_token("one-1");
    w.play_machine(&config, &first, &full).await.state();
    counter.take();
    let second = Ctx::new(holder, full.clone(), &w.now()).with_task_token("one-2");
    assert_eq!(
        w.play_machine(&config, &second, &full).await.answer()["outcome"],
        json!("queued")
    );
    // The refused acquire, its record looked for (none), the queue transaction, and the
    // hand-off that follows it (the lock, and the head of its line, the index's key then the
    // record: itself, which does not fit).
    let sent = counter.take();
    assert_eq!(
        sent.requests,
        std::collections::BTreeMap::from([
            ("DynamoDB.UpdateItem".to_owned(), 1),
            ("DynamoDB.GetItem".to_owned(), 2),
            ("DynamoDB.TransactWriteItems".to_owned(), 1),
            ("DynamoDB.Query".to_owned(), 1),
            ("DynamoDB.BatchGetItem".to_owned(), 1),
        ]),
        "{sent:?}"
    );
    assert_eq!(sent.failed("DynamoDB.UpdateItem"), 1);
}

/// F14 through the acquire function: a lock its operator configured (`semctl lock set`: here
/// `Semaphore::configure`, the same write) is taken on its limit whatever the input asks, and
/// the answer says so; the execution beyond it waits in line. The stack's default lock is
/// configured by its parameters: an input's "limit" does not raise it either.
#[tokio::test]
async fn a_configured_lock_cannot_be_raised_by_the_input() {
    let w = world().await;
    let config = config();
    let owned = LockName::new("owned").unwrap();
    w.sem
        .configure(
            &owned,
            Some(semaphore_core::LockConfig::new(limit(1), None, None).unwrap()),
        )
        .await
        .unwrap();
    let input = json!({"lock": "owned", "limit": 100});
    let first = Ctx::new(HOLDER, input.clone(), &w.now()).with_task_token("first");
    let played = w.play_machine(&config, &first, &input).await;
    let answer = &played.state()["semaphore"];
    assert_eq!(
        (&answer["outcome"], &answer["limit"]),
        (&json!("acquired"), &json!(1)),
        "{answer}"
    );
    let second_holder = "arn:aws:states:us-east-1:123456789012:execution:LockProtected:run-2";
    let second = Ctx::new(second_holder, input.clone(), &w.now()).with_task_token("second");
    let played = w.play_machine(&config, &second, &input).await;
    assert_eq!(
        played.answer()["outcome"],
        json!("queued"),
        "the configured limit holds"
    );
    assert_eq!(played.answer()["limit"], json!(1));
    let item = w.sem.status(&owned).await.unwrap();
    assert_eq!(
        (item.used, item.waiting, item.limit),
        (1, 1, Some(limit(1)))
    );
    // The default lock (DEFAULT_LOCK, DEFAULT_LIMIT 5): an input's limit 100 is not taken.
    let raise = json!({"limit": 100});
    let third_holder = "arn:aws:states:us-east-1:123456789012:execution:LockProtected:run-3";
    let third = Ctx::new(third_holder, raise.clone(), &w.now()).with_task_token("third");
    let played = w.play_machine(&config, &third, &raise).await;
    assert_eq!(
        (
            &played.state()["semaphore"]["lock"],
            &played.state()["semaphore"]["limit"]
        ),
        (&json!("demo-lock"), &json!(5))
    );
}

/// #18 item 16 (F12), (b): a machine that calls the acquire function without being one the
/// stack protects (PROTECTED_STATE_MACHINES) would wait in line for ever (no `SendTaskSuccess` to its
/// tasks) and its failures would never be cleaned up; an Express execution cannot be described
/// at all. Each is refused by name before anything is written, and the definition fails at once.
#[tokio::test]
async fn a_caller_the_stack_does_not_protect_is_misconfigured_and_writes_nothing() {
    let w = world().await;
    // The stack's own machine, and every machine whose name starts with "team-" (the stack's
    // ProtectedStateMachinePrefix), however long after the deploy it was created.
    let protected = "arn:aws:states:us-east-1:123456789012:stateMachine:LockProtected,\
                     arn:aws:states:us-east-1:123456789012:stateMachine:team-*";
    let config = config_with(&[("PROTECTED_STATE_MACHINES", protected)]);
    // A protected caller goes on as before (and leaves an item, so "nothing written" below
    // also means "the existing item is unchanged").
    let ctx = Ctx::new(HOLDER, json!({}), &w.now()).with_task_token("t");
    w.play_machine(&config, &ctx, &json!({})).await.state();

    let under_prefix = "arn:aws:states:us-east-1:123456789012:execution:team-orders:run-1";
    let ctx = Ctx::new(under_prefix, json!({}), &w.now()).with_task_token("team");
    let played = w.play_machine(&config, &ctx, &json!({})).await;
    assert_eq!(played.state()["semaphore"]["outcome"], json!("acquired"));
    let before = all_items(&w.sem).await;

    let rogue = "arn:aws:states:us-east-1:123456789012:execution:NotDeclared:run-1";
    let near_miss = "arn:aws:states:us-east-1:123456789012:execution:team:run-1";
    let express =
        "arn:aws:states:us-east-1:123456789012:express:LockProtected:run-2:0b1c7e93-5f5c-4bd8";
    for (caller, says) in [
        (
            rogue,
            format!(
                "{rogue} is an execution of state machine NotDeclared, which this stack does not \
                 protect"
            ),
        ),
        (
            near_miss,
            format!(
                "{near_miss} is an execution of state machine team, which this stack does not \
                 protect"
            ),
        ),
        (
            express,
            format!("{express} is an execution of an Express state machine, which cannot take"),
        ),
    ] {
        let ctx = Ctx::new(caller, json!({}), &w.now()).with_task_token(caller);
        let played = w.play_machine(&config, &ctx, &json!({})).await;
        assert_eq!(played.error().error_type, "SemaphoreMisconfigured");
        assert!(
            played.error().error_message.starts_with(&says),
            "{}",
            played.error().error_message
        );
        assert!(matches!(played.then, Then::Failed { .. }));
    }
    assert_eq!(all_items(&w.sem).await, before, "a refused caller wrote");
    // Without the list (a deployment that does not set it) every standard execution may call.
    let ctx = Ctx::new(rogue, json!({}), &w.now()).with_task_token("rogue-ok");
    let played = w.play_machine(&config_with(&[]), &ctx, &json!({})).await;
    assert_eq!(played.state()["semaphore"]["outcome"], json!("acquired"));
}

/// F13, every holder can end: a parked caller (a task token) whose holder is not an execution
/// ARN (a script's own id) cannot be seen to end by the cleanup or the sweeper, so it holds only
/// under a lease; without one it is refused by name and nothing is written.
#[tokio::test]
async fn a_parked_holder_nobody_can_see_end_needs_a_lease() {
    let w = world().await;
    let config = config_with(&[]);
    let ctx = Ctx::new("batch-script-7", json!({}), &w.now()).with_task_token("script");
    let before = all_items(&w.sem).await;
    let played = w.play_machine(&config, &ctx, &json!({})).await;
    assert_eq!(played.error().error_type, "SemaphoreInvalidInput");
    assert!(
        played.error().error_message.starts_with(
            "request.lease is missing: the holder batch-script-7 is not a standard execution's ARN"
        ),
        "{}",
        played.error().error_message
    );
    assert_eq!(all_items(&w.sem).await, before, "a refused caller wrote");
    // With a lease it may hold: the lease ends what nobody can see end.
    let leased = w.play_machine(&config, &ctx, &json!({"lease": 120})).await;
    assert_eq!(leased.state()["semaphore"]["outcome"], json!("acquired"));
}

/// #18 item 16 (F12), (a): an Express state machine as the work cannot be described or stopped,
/// so a cleanup would free its slot while it runs. Its type comes from DescribeStateMachine
/// (real machines on the local server), asked once per machine per function instance; the
/// acquire is refused by name before anything is written, and the definition fails at once.
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
    let w = world().await;
    let input = json!({"work": standard});
    let ctx = Ctx::new(HOLDER, input.clone(), &w.now()).with_task_token("standard");
    w.play_machine(&config, &ctx, &input).await.state();
    let before = all_items(&w.sem).await;

    for n in 0..2 {
        let input = json!({"work": express});
        let ctx = Ctx::new(&holder(10 + n), input.clone(), &w.now())
            .with_task_token(&format!("express-{n}"));
        let played = w.play_machine(&config, &ctx, &input).await;
        assert_eq!(played.error().error_type, "SemaphoreMisconfigured");
        assert!(
            played.error().error_message.starts_with(&format!(
                "the work {express} is an Express state machine, which cannot run under this \
                 semaphore"
            )),
            "{}",
            played.error().error_message
        );
        assert!(matches!(played.then, Then::Failed { .. }));
    }
    assert_eq!(all_items(&w.sem).await, before, "a refused acquire wrote");
    // Each machine's type was asked once: the second refusal came from the instance's memory.
    assert_eq!(
        counter.take().requests.get("SFN.DescribeStateMachine"),
        Some(&2)
    );
}

/// An Express execution's context: its ARN (`...:express:<machine>:<name>:<uuid>`), no
/// redrive count, and no task token (an Express workflow cannot park on one).
fn express(name: &str, entered: &str) -> Ctx {
    let arn = format!(
        "arn:aws:states:us-east-1:123456789012:express:example-your-express:{name}:{:08x}",
        fastrand::u32(..)
    );
    let mut ctx = Ctx::new(&arn, json!({}), entered);
    ctx.execution
        .as_object_mut()
        .unwrap()
        .remove("RedriveCount");
    ctx
}

/// The same Express acquire state polled again by its `Retry`: one more `RetryCount`, still
/// no task token.
fn polled(ctx: &Ctx) -> Ctx {
    let mut next = ctx.clone();
    next.retry_count += 1;
    next
}

/// #27 items 2 and 4, with docs/using.md's two fragments as deployed sharing "example-lock"
/// (limit 2): an Express execution that finds the lock full is put in line and answered
/// `SemaphoreBusy`, which its `Retry` retries; a standard execution that asks after it parks
/// behind it; each poll keeps the Express execution's place; the hand-off of a freed slot grants
/// it (nobody to wake: its next poll finds the slot, under its lease) and not the standard one
/// that asked later (L2 across both kinds); the next freed slot wakes the standard one.
#[tokio::test]
async fn an_express_execution_polls_in_line_keeps_its_place_and_finds_its_slot() {
    let w = world().await;
    let config = config();
    let l = lock("example-lock");
    for holder in ["h1", "h2"] {
        w.sem.acquire(&l, &id(holder, "a"), limit(2)).await.unwrap();
    }
    let e = express("orders-1", &w.now());
    let first = w.play_express(&config, &e, &json!({})).await;
    assert_eq!(
        first.then,
        Then::Retried {
            error: "SemaphoreBusy".to_owned()
        },
        "{:?}",
        first.answer
    );
    assert_eq!(first.payload["request"]["lease"], json!(302));
    assert!(first.payload.get("task_token").is_none());
    let records = consistent(&w.sem, "example-lock", 2).await;
    assert_eq!(records.len(), 1);
    assert!(
        !records[0].contains_key("task_token") && records[0].contains_key("poll_until_ms"),
        "a poller's record: {records:?}"
    );
    let place = text(&records[0], "place").to_owned();

    // A standard execution asks after it: parked behind it.
    tokio::time::sleep(Duration::from_millis(5)).await;
    let s = Ctx::new(&holder(7), json!({}), &w.now()).with_task_token("s-task-1");
    let standard = w.play_fragment(&config, &s, &json!({})).await;
    assert_eq!(standard.then, Then::Parked);

    // Polls keep the place, and renew it.
    let mut polls = e.clone();
    for _ in 0..3 {
        polls = polled(&polls);
        let again = w.play_express(&config, &polls, &json!({})).await;
        assert!(
            matches!(again.then, Then::Retried { .. }),
            "{:?}",
            again.answer
        );
    }
    let records = consistent(&w.sem, "example-lock", 2).await;
    let express_record = records
        .iter()
        .find(|r| text(r, "holder").contains(":express:"))
        .expect("still in line");
    assert_eq!(text(express_record, "place"), place, "its place kept");
    assert_eq!(
        express_record["checks"].as_n().unwrap(),
        "3",
        "each poll renewed the record"
    );
    // A poller's polls are not a Standard history's events: past the parked executions' budget
    // of checks it still polls (only MAX_WAIT_SECONDS ends its wait).
    checked_to_the_budget(
        w.sem.store(),
        "example-lock",
        text(express_record, "waiter"),
    )
    .await;
    polls = polled(&polls);
    let past_budget = w.play_express(&config, &polls, &json!({})).await;
    assert_eq!(
        past_budget.then,
        Then::Retried {
            error: "SemaphoreBusy".to_owned()
        },
        "{:?}",
        past_budget.answer
    );

    // A slot freed: the hand-off grants the head, the Express execution; nothing to wake.
    let released = w
        .release(
            json!({"semaphore": {"lock": "example-lock", "holder": "h1", "acquisition": "a",
                                      "token": w.token_of("example-lock", "h1", "a").await}}),
        )
        .await
        .unwrap();
    assert_eq!(released["handed_off"], json!(1));
    assert!(
        w.kept.completion("s-task-1").is_none(),
        "the later standard execution waits"
    );
    let item = w.sem.status(&l).await.unwrap();
    let express_id = id(e.execution["Id"].as_str().unwrap(), "r0");
    let granted = item.holders[&express_id].token;
    assert!(
        item.leases.contains_key(&express_id),
        "granted under its lease: {item:?}"
    );
    // Its next poll finds the slot: the state goes on with the answer.
    polls = polled(&polls);
    let found = w.play_express(&config, &polls, &json!({})).await;
    let state = found.state().clone();
    assert_eq!(
        state["acquire"]["Payload"]["outcome"],
        json!("already_held")
    );
    assert_eq!(state["acquire"]["Payload"]["token"], json!(granted.0));

    // The Express execution's release (its fragment's payload) hands the slot to the standard
    // one, woken through its task token.
    let release = asl::render(
        &asl::state(
            &asl::definition("protect-your-express-workflow.asl.json"),
            "Release slot",
        )["Parameters"]["Payload"],
        &state,
        &polls,
    );
    let released = w.release(release).await.unwrap();
    assert_eq!(released["released"], json!(true));
    assert!(matches!(
        w.kept.completion("s-task-1"),
        Some(Completion::Succeeded(_))
    ));
    let records = consistent(&w.sem, "example-lock", 2).await;
    assert!(records.is_empty(), "{records:?}");
}

/// #27 items 2 and 4 (F13), on a clock the test moves: an Express execution that stops polling
/// (its execution ended, or timed out at 5 minutes) loses its place once its record's time and
/// the skew have passed: the next hand-off skips it and grants the standard execution behind
/// it. One that held a slot and died without its release has it taken back by the next acquire
/// that finds the lock full, once its lease (302 s) and the skew have passed; its late release
/// frees nothing.
#[tokio::test]
async fn an_express_execution_that_stops_polling_loses_its_place_and_a_dead_ones_slot_is_taken_back(
) {
    let (w, clock) = world_with_clock().await;
    let config = config();
    let l = lock("example-lock");
    // One slot held by a standard holder, the other by an Express execution that then dies.
    w.sem.acquire(&l, &id("h1", "a"), limit(2)).await.unwrap();
    let dead = express("dies-holding", &w.now());
    let held = w.play_express(&config, &dead, &json!({})).await;
    let dead_answer = held.state()["acquire"]["Payload"].clone();
    assert_eq!(dead_answer["outcome"], json!("acquired"));

    // A poller in line, then a standard execution behind it.
    clock.advance_ms(10);
    let quitter = express("stops-polling", &w.now());
    let busy = w.play_express(&config, &quitter, &json!({})).await;
    assert!(
        matches!(busy.then, Then::Retried { .. }),
        "{:?}",
        busy.answer
    );
    clock.advance_ms(10);
    let s = Ctx::new(&holder(8), json!({}), &w.now()).with_task_token("s8-task-1");
    assert_eq!(
        w.play_fragment(&config, &s, &json!({})).await.then,
        Then::Parked
    );

    // The poller stops: 30 s of poll_seconds and 1 s of skew later, a freed slot skips it.
    clock.advance_ms(32_000);
    let released = w
        .release(
            json!({"semaphore": {"lock": "example-lock", "holder": "h1", "acquisition": "a",
                                      "token": w.token_of("example-lock", "h1", "a").await}}),
        )
        .await
        .unwrap();
    assert_eq!(released["released"], json!(true));
    // Granted to the standard execution behind it (its task token is the test's, which the
    // local server does not know: the wake-up is sent and fails, and it keeps the slot).
    assert!(matches!(
        w.kept.completion("s8-task-1"),
        Some(Completion::Succeeded(_))
    ));
    assert!(w
        .sem
        .status(&l)
        .await
        .unwrap()
        .holders
        .contains_key(&id(&holder(8), "r0")));
    let records = consistent(&w.sem, "example-lock", 2).await;
    assert!(
        records.is_empty(),
        "the poller that stopped is out of line: {records:?}"
    );

    // The dead Express holder's lease (302 s) and the skew pass: the next acquire that finds
    // the lock full takes its slot back and takes it.
    clock.advance_ms(304_000);
    let next = express("next", &w.now());
    let taken = w.play_express(&config, &next, &json!({})).await;
    assert_eq!(
        taken.state()["acquire"]["Payload"]["outcome"],
        json!("acquired"),
        "{:?}",
        taken.answer
    );
    let late = w.release(json!({"semaphore": dead_answer})).await.unwrap();
    assert_eq!(
        late["released"],
        json!(false),
        "taken back: its late release frees nothing"
    );
    consistent(&w.sem, "example-lock", 2).await;
}

/// A caller without a task token must hold under a lease: refused by name, nothing written;
/// and `poll_seconds` out of range, or beside a task token, likewise.
#[tokio::test]
async fn a_caller_without_a_task_token_needs_a_lease_and_writes_nothing_without_one() {
    let w = world().await;
    let config = config();
    let before = all_items(&w.sem).await;
    let entered = w.now();
    let base = json!({
        "execution": "worker-1",
        "state": {"EnteredTime": entered, "RetryCount": 0}
    });
    for (request, says) in [
        (json!({"lock": "l", "limit": 2}), "request.lease is missing"),
        (
            json!({"lock": "l", "limit": 2, "lease": 0}),
            "lease must be",
        ),
        (
            json!({"lock": "l", "limit": 2, "lease": 60, "poll_seconds": 0}),
            "request.poll_seconds must be",
        ),
        (
            json!({"lock": "l", "limit": 2, "lease": 60, "poll_seconds": 901}),
            "request.poll_seconds must be",
        ),
        (
            json!({"lock": "l", "limit": 2, "lease": 10, "poll_seconds": 30}),
            "request.poll_seconds (30 s) must be at most the lease (10 s)",
        ),
    ] {
        let mut payload = base.clone();
        payload["request"] = request.clone();
        let err = w.acquire(&config, payload).await.unwrap_err();
        assert_eq!(err.error_type, "SemaphoreInvalidInput", "{request}");
        assert!(
            err.error_message.contains(says),
            "{request}: {}",
            err.error_message
        );
    }
    let mut parked = base.clone();
    parked["request"] = json!({"lock": "l", "limit": 2, "poll_seconds": 5});
    parked["task_token"] = json!("t");
    let err = w.acquire(&config, parked).await.unwrap_err();
    assert!(err
        .error_message
        .contains("poll_seconds is for a caller without a task_token"));
    assert_eq!(all_items(&w.sem).await, before, "a refused request wrote");
    // Any client (here a worker id, as `aws lambda invoke` would send it) with a lease: taken.
    let mut worker = base.clone();
    worker["request"] = json!({"lock": "l", "limit": 2, "lease": 60});
    let answer = w.acquire(&config, worker).await.unwrap();
    assert_eq!(answer["outcome"], json!("acquired"));
    assert_eq!(answer["holder"], json!("worker-1"));
}
