//! F8 made to happen with real task tokens: executions parked in line on the local server's
//! Step Functions (moto's execution mode), woken by the real functions' hand-offs through
//! `SendTaskSuccess`, stopped with `StopExecution`, timed out by their wait's timeout.
//!
//! Each waiter is an execution of `sfn::parking_machine`: the lock-protected definition's own
//! "Wait in line" state, parked on a task moto completes without Lambda (see there). The test
//! plays the acquire state (the real handler, fast path: "full"), then invokes the real acquire
//! handler with each wait payload the execution parks with, exactly what Step Functions would
//! invoke the function with: the parking task's own token, its entry time, the place in line.
//! Release and cleanup are the real handlers too, with hand-offs through the local server's
//! Step Functions.
//!
//! Two deviations of moto from AWS matter here, and the local server's launcher
//! (`local/moto_server.py`) fixes both: a stopped execution parked on a task token stayed
//! RUNNING (and took `SendTaskSuccess`) until the task ended; and the token of a task that had
//! ended (timed out, completed) still took `SendTaskSuccess`, silently. With them fixed, every
//! failed wake-up here is a real one.
//!
//! Every test ends by reading the lock raw: no more holders than the limit, and its `waiting`
//! equals the records in its line.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use lambda_acquire::Config;
use lambda_cleanup::Cleanup;
use lambda_common::metrics::check_emf;
use lambda_common::{Metrics, Resolver, Settings, SfnHandOffs};
use lambda_runtime::{Context, Diagnostic, LambdaEvent};
use local_aws::asl::{self, Context as Ctx};
use local_aws::names::{id, limit};
use local_aws::observe::{assert_consistent, text, RawRecord};
use local_aws::sfn::{
    self, described, ended, execution_arn, park, parking_machine, status, stop, task_outputs,
    unique, Parked,
};
use local_aws::{fresh_table, sdk_config};
use semaphore_core::{
    protocol, rfc3339_millis, AcquireOutcome, DynamoStore, FenceKey, FencingToken, HolderId,
    Identity, ItemStore, LockName, Run, Semaphore, WriteResult,
};
use serde_json::{json, Value};

const DEMO: &str = "arn:aws:states:us-east-1:123456789012:stateMachine:demo-work";
/// Holds the lock's one slot when the tests begin (an operator's id: never judged).
const HOLDER: &str = "slot-holder";
const HELD: &str = "h1";

/// The functions' environment, as the template sets it.
fn settings(table: &str) -> Settings<impl Fn(&str) -> Option<String>> {
    let vars = BTreeMap::from([
        ("TABLE_NAME", table.to_owned()),
        ("DEFAULT_LOCK", "demo-lock".to_owned()),
        ("DEFAULT_LIMIT", "1".to_owned()),
        ("DEFAULT_WORK", DEMO.to_owned()),
        ("WORK_STATE_MACHINES", DEMO.to_owned()),
        // The acquire function as the deployed definition names it (no function runs on the
        // local server).
        ("ACQUIRE_FUNCTION_ARN", asl::function_arn("acquire")),
        ("MAX_WAIT_SECONDS", "3600".to_owned()),
    ]);
    Settings::from_lookup(move |name| vars.get(name).cloned())
}

/// One lock of limit 1 on a fresh table, the functions as their `main`s build them, and a
/// parking machine with the given fallbacks (first wait, later waits).
struct World {
    sfn: sfn::Client,
    table: String,
    sem: Semaphore<DynamoStore>,
    config: Config,
    definition: Value,
    machine: String,
    lock: String,
    input: Value,
    /// Where the functions' metric lines are kept (`World::metric_lines`).
    metrics: Metrics,
    kept: Arc<Mutex<Vec<String>>>,
}

/// A waiter: its parked execution, the wait payload it queued with, its acquire state's answer.
struct Waiter {
    parked: Parked,
    wait: Value,
    full: Value,
}

impl Waiter {
    fn execution(&self) -> &str {
        &self.parked.execution
    }

    fn identity(&self) -> Identity {
        id(self.execution(), "r0")
    }
}

async fn world(fallbacks: [u64; 2]) -> World {
    let sfn = sfn::client();
    let table = fresh_table().await.table().to_owned();
    let settings = settings(&table);
    let definition = asl::definition("lock-protected.asl.json");
    let machine = sfn::create_machine(
        &sfn,
        &unique("Parking"),
        &parking_machine(&definition, "Wait in line", fallbacks),
    )
    .await;
    let lock = unique("f8");
    let (metrics, kept) = Metrics::kept();
    World {
        metrics,
        kept,
        sem: settings.semaphore(&sdk_config()).unwrap(),
        config: Config::from_settings(&settings).unwrap(),
        input: json!({"lock": lock, "limit": 1}),
        sfn,
        table,
        definition,
        machine,
        lock,
    }
}

impl World {
    fn lock(&self) -> LockName {
        LockName::new(self.lock.as_str()).unwrap()
    }

    /// The hand-offs as every function's `main` builds them: `SendTaskSuccess` and
    /// `DescribeExecution` through the local server.
    fn hand_offs(&self) -> SfnHandOffs {
        SfnHandOffs {
            metrics: self.metrics.clone(),
            ..settings(&self.table).hand_offs(&sdk_config()).unwrap()
        }
    }

    /// The metric lines the acquire and release functions wrote since the last call, each
    /// checked as EMF.
    fn metric_lines(&self) -> Vec<Value> {
        self.kept
            .lock()
            .unwrap()
            .drain(..)
            .map(|l| check_emf(&l).unwrap_or_else(|e| panic!("{e}: {l}")))
            .collect()
    }

    async fn acquire(&self, payload: Value) -> Result<Value, Diagnostic> {
        lambda_acquire::handle(
            &self.sem,
            &self.config,
            &self.hand_offs(),
            LambdaEvent::new(payload, Context::default()),
        )
        .await
        .map(|answer| serde_json::to_value(answer).unwrap())
        .map_err(Diagnostic::from)
    }

    async fn release(&self, payload: Value) -> Value {
        let resolver = Resolver {
            defaults: settings(&self.table).defaults().unwrap(),
            ..Resolver::default()
        };
        lambda_release::handle(
            &self.sem,
            &resolver,
            &self.hand_offs(),
            LambdaEvent::new(payload, Context::default()),
        )
        .await
        .map(|answer| serde_json::to_value(answer).unwrap())
        .unwrap()
    }

    /// The release of a waiter that took the slot, as "Release slot" sends it.
    async fn release_waiter(&self, waiter: &Waiter) -> Value {
        self.release(json!({"input": self.input, "holder": waiter.execution(), "redrive_count": 0}))
            .await
    }

    /// The cleanup function, on the status-change event of `execution` ending ABORTED.
    async fn cleanup(&self, execution: &str) -> Value {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../lambda-cleanup/tests/fixtures/execution-aborted.json"
        );
        let mut event: Value =
            serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        let (machine, name) = execution.rsplit_once(':').unwrap();
        event["resources"] = json!([execution]);
        event["detail"]["executionArn"] = json!(execution);
        event["detail"]["stateMachineArn"] =
            json!(machine.replace(":execution:", ":stateMachine:"));
        event["detail"]["name"] = json!(name);
        event["detail"]["stopDate"] = json!(self.sem.now_ms());
        let cleanup = Cleanup::from_settings(&settings(&self.table), &sdk_config()).unwrap();
        lambda_cleanup::handle(&cleanup, LambdaEvent::new(event, Context::default()))
            .await
            .map(|summary| serde_json::to_value(summary).unwrap())
            .unwrap()
    }

    /// The slot taken by [`HOLDER`], so that the lock is full.
    async fn hold(&self) {
        let answer = self
            .acquire(json!({"lock": self.lock, "limit": 1, "holder": HOLDER,
                            "acquisition": HELD, "requested_at": rfc3339_millis(self.sem.now_ms())}))
            .await
            .unwrap();
        assert_eq!(answer["outcome"], json!("acquired"));
    }

    async fn release_holder(&self) -> Value {
        self.release(json!({"lock": self.lock, "holder": HOLDER, "acquisition": HELD}))
            .await
    }

    /// The acquire state of execution `name` of the parking machine, played now: the real
    /// handler with the payload the definition renders. Answers the execution ARN and the answer.
    async fn acquire_state(&self, name: &str) -> (String, Value) {
        let execution = execution_arn(&self.machine, name);
        let ctx = Ctx::new(
            &execution,
            self.input.clone(),
            &rfc3339_millis(self.sem.now_ms()),
        );
        let state = asl::state(&self.definition, "Acquire slot");
        let payload = asl::render(&state["Parameters"]["Payload"], &self.input, &ctx);
        (execution, self.acquire(payload).await.unwrap())
    }

    /// An execution that finds the lock full, parks, and whose first wait invocation queues it.
    async fn wait_in_line(&self) -> Waiter {
        let name = unique("waiter");
        let (execution, full) = self.acquire_state(&name).await;
        assert_eq!(full["outcome"], json!("full"), "{full}");
        let parked = park(&self.sfn, &self.machine, &name, &self.input, &full).await;
        let wait = parked.next_wait().await;
        assert_eq!(wait["holder"], json!(execution));
        // The answer it follows (its fallback_seconds set by the parking machine), not the
        // execution input.
        assert_eq!(
            (&wait["answer"]["lock"], &wait["answer"]["work"]),
            (&full["lock"], &full["work"])
        );
        assert!(
            wait.get("input").is_none() && wait.get("execution").is_none(),
            "{wait}"
        );
        assert_eq!(wait["queued_at"], full["queued_at"]);
        assert!(wait["task_token"].is_string(), "{wait}");
        let queued = self.acquire(wait.clone()).await.unwrap();
        assert_eq!(queued["outcome"], json!("queued"), "{queued}");
        Waiter { parked, wait, full }
    }

    /// Holders <= limit and `waiting` = the records in line, read raw: the records.
    async fn consistent(&self) -> Vec<RawRecord> {
        let store = self.sem.store();
        assert_consistent(
            store.client(),
            store.table(),
            store.queue_table(),
            &self.lock,
            1,
        )
        .await
        .1
    }

    /// The holders of the line's records, in line order.
    async fn line(&self) -> Vec<String> {
        self.consistent()
            .await
            .iter()
            .map(|record| text(record, "holder").to_owned())
            .collect()
    }

    /// The lock's holders and their tokens.
    async fn holders(&self) -> Vec<(Identity, FencingToken)> {
        self.sem
            .status(&self.lock())
            .await
            .unwrap()
            .holders
            .into_iter()
            .map(|(who, holding)| (who, holding.token))
            .collect()
    }

    /// The waiter's execution ends SUCCEEDED, its wait task completed with the granted answer
    /// for the slot of token `token`: what the definition's "Protected work" reads.
    async fn assert_granted(&self, waiter: &Waiter, token: FencingToken) {
        assert_eq!(ended(&self.sfn, waiter.execution()).await, "SUCCEEDED");
        let (_, output) = described(&self.sfn, waiter.execution()).await;
        let granted = &output.expect("an output")["semaphore"];
        assert_eq!(
            (
                &granted["acquired"],
                &granted["outcome"],
                &granted["token"],
                &granted["holder"],
                &granted["lock"]
            ),
            (
                &json!(true),
                &json!("acquired"),
                &json!(token.0),
                &json!(waiter.execution()),
                &json!(self.lock)
            ),
            "{granted}"
        );
        assert_eq!(granted["work"]["name"], waiter.full["work"]["name"]);
        assert_eq!(
            granted["work"]["context"]["semaphore"]["fencing_token"],
            json!(token.0)
        );
        // The history's record of the parked task: it succeeded with that answer.
        assert_eq!(
            task_outputs(&self.sfn, waiter.execution()).await.last(),
            Some(granted)
        );
    }
}

/// F8, waiters that die in line: two executions in line are stopped (StopExecution). The
/// second one's cleanup comes first and takes it out of line (its place read from the wait task
/// in its history). Then the slot frees: the release's hand-off grants the first dead waiter,
/// its `SendTaskSuccess` fails, `DescribeExecution` says ABORTED, so the grant is freed again
/// (its run fenced) and the slot goes to the live waiter behind it, whose execution takes the
/// granted answer and goes on. A stopped waiter's late wait invocation cannot queue again.
#[tokio::test]
async fn f8_waiters_stopped_in_line_are_taken_out_and_the_slot_goes_to_the_next_live_waiter() {
    let w = world([300, 300]).await;
    w.hold().await;
    let dead_first = w.wait_in_line().await;
    let dead_second = w.wait_in_line().await;
    let before_live = w.sem.now_ms();
    let live = w.wait_in_line().await;
    // The metrics so far: the holder took the slot; each waiter was answered full (the lock
    // as its refusal saw it), then queued.
    let outcomes: Vec<(Value, Value)> = w
        .metric_lines()
        .iter()
        .map(|l| (l["Outcome"].clone(), l["Waiting"].clone()))
        .collect();
    assert_eq!(
        outcomes,
        [
            (json!("acquired"), json!(0)),
            (json!("full"), json!(0)),
            (json!("queued"), Value::Null),
            (json!("full"), json!(1)),
            (json!("queued"), Value::Null),
            (json!("full"), json!(2)),
            (json!("queued"), Value::Null),
        ]
    );
    assert_eq!(
        w.line().await,
        [
            dead_first.execution(),
            dead_second.execution(),
            live.execution()
        ],
        "in the order they asked"
    );
    for dead in [&dead_first, &dead_second] {
        stop(&w.sfn, dead.execution()).await;
        assert_eq!(ended(&w.sfn, dead.execution()).await, "ABORTED");
    }

    // The second one's status event reaches the cleanup first.
    let cleaned = w.cleanup(dead_second.execution()).await;
    assert_eq!(cleaned["left_line"], json!([w.lock]), "{cleaned}");
    assert_eq!(cleaned["handed_off"], json!(0));
    assert_eq!(
        cleaned["locks"],
        json!([{"lock": w.lock, "freed": [], "count": 1}])
    );
    assert_eq!(w.line().await, [dead_first.execution(), live.execution()]);

    // The holder releases. Its hand-off grants the head, whose wake-up fails (stopped), so the
    // grant is freed again, and the live waiter behind it is granted the slot and woken.
    let released = w.release_holder().await;
    let after_release = w.sem.now_ms();
    assert_eq!(
        (&released["released"], &released["handed_off"]),
        (&json!(true), &json!(1)),
        "{released}"
    );
    // Its metrics: the release (the lock as it left it: two in line), then the hand-off's
    // grant (how long the live waiter waited since it asked, how long the hand-off took from
    // the free, the lock after the grant) and the dead head it freed again.
    let lines = w.metric_lines();
    assert_eq!(lines.len(), 2, "{lines:#?}");
    assert_eq!(
        (
            &lines[0]["WeightUsed"],
            &lines[0]["Limit"],
            &lines[0]["Waiting"]
        ),
        (&json!(0), &json!(1), &json!(2))
    );
    assert!(lines[0]["TimeHeld"].is_u64(), "{}", lines[0]);
    let granted = &lines[1];
    assert_eq!(
        (
            &granted["Lock"],
            &granted["Outcome"],
            &granted["Acquisitions"],
            &granted["DeadWaitersRemoved"]
        ),
        (&json!(w.lock), &json!("granted"), &json!(1), &json!(1))
    );
    assert_eq!(
        (
            &granted["WeightUsed"],
            &granted["Limit"],
            &granted["Waiting"]
        ),
        (&json!(1), &json!(1), &json!(0))
    );
    let (waited, latency) = (
        granted["WaitTime"].as_u64().unwrap(),
        granted["HandOffLatency"].as_u64().unwrap(),
    );
    assert!(
        latency <= waited && waited <= after_release - before_live,
        "waited {waited} ms, hand-off {latency} ms"
    );
    let holders = w.holders().await;
    assert_eq!(
        holders
            .iter()
            .map(|(who, _)| who.clone())
            .collect::<Vec<_>>(),
        [live.identity()]
    );
    let token = holders[0].1;
    let item = w.sem.status(&w.lock()).await.unwrap();
    assert!(
        item.is_fenced(&FenceKey::execution(
            &HolderId::new(dead_first.execution()).unwrap(),
            Run::FIRST
        )),
        "the dead waiter's grant was freed by a cleanup of its run (its own cleanup has not run)"
    );
    assert!(w.line().await.is_empty());
    w.assert_granted(&live, token).await;

    // The first one's own cleanup, late: out of line already, nothing held, nothing to hand on.
    let cleaned = w.cleanup(dead_first.execution()).await;
    assert_eq!(cleaned.get("left_line"), None, "{cleaned}");
    assert_eq!(cleaned["handed_off"], json!(0));
    assert_eq!(
        cleaned["locks"],
        json!([{"lock": w.lock, "freed": [], "count": 1}])
    );

    // A stopped waiter's late wait invocation (a zombie, or a retry in flight) is refused by its
    // run's fence: it does not queue again.
    let late = w.acquire(dead_second.wait.clone()).await.unwrap_err();
    assert_eq!(late.error_type, "SemaphoreFenced", "{}", late.error_message);
    assert!(w.line().await.is_empty());

    // The live waiter's work is done: its release frees the slot; nobody waits.
    let released = w.release_waiter(&live).await;
    assert_eq!(
        (
            &released["released"],
            &released["count"],
            &released["handed_off"]
        ),
        (&json!(true), &json!(0), &json!(0))
    );
    assert!(w.consistent().await.is_empty());
    assert!(w.holders().await.is_empty());
}

/// F8, a wake-up that fails while the waiter lives: its wait task timed out (its fallback check
/// is under way with a new token) just before the slot freed, so `SendTaskSuccess` to the token
/// in its record fails (TaskTimedOut). Its execution still runs: it keeps the slot ("parked" in
/// the hand-off's report), and its fallback check finds the slot and completes its own task
/// with it.
#[tokio::test]
async fn f8_a_failed_wake_up_of_a_live_waiter_leaves_it_the_slot_which_its_fallback_check_takes() {
    let w = world([2, 300]).await;
    w.hold().await;
    let waiter = w.wait_in_line().await;
    // Its first wait times out: the wait state is entered again, with a new token and the same
    // place; the first task, and its token, are closed.
    let check = waiter.parked.next_wait().await;
    assert_ne!(check["task_token"], waiter.wait["task_token"]);
    assert_eq!(check["queued_at"], waiter.wait["queued_at"]);

    // The holder's release, then its hand-off (what the release function runs after its write).
    w.sem.release(&w.lock(), &id(HOLDER, HELD)).await.unwrap();
    let report = w.hand_offs().run(&w.sem, &w.lock(), None).await;
    assert_eq!(report.parked, [waiter.identity()], "{report:?}");
    assert!(
        report.woken.is_empty() && report.freed.is_empty() && report.skipped.is_empty(),
        "{report:?}"
    );
    let holders = w.holders().await;
    assert_eq!(holders.len(), 1);
    assert_eq!(holders[0].0, waiter.identity(), "the slot stays with it");
    let token = holders[0].1;
    assert!(w.line().await.is_empty());
    assert_eq!(
        status(&w.sfn, waiter.execution()).await.as_deref(),
        Some("RUNNING")
    );

    // Its fallback check: the slot is its own, and it completes its own task with it.
    let answer = w.acquire(check).await.unwrap();
    assert_eq!(
        (&answer["acquired"], &answer["outcome"], &answer["token"]),
        (&json!(true), &json!("acquired"), &json!(token.0)),
        "{answer}"
    );
    w.assert_granted(&waiter, token).await;
    let released = w.release_waiter(&waiter).await;
    assert_eq!(released["released"], json!(true));
    assert!(w.consistent().await.is_empty());
}

/// F8, a lost wake-up: the function that freed the slot crashed between its hand-off's grant
/// write (the core's own, sent here through the store) and the wake-up. The waiter holds the
/// slot and is out of line, and nobody tells it: its fallback check completes its task with the
/// slot. Nothing leaks: its release frees the slot for the next execution.
#[tokio::test]
async fn f8_a_hand_off_that_crashed_between_grant_and_wake_up_is_recovered_by_the_fallback_check() {
    let w = world([2, 300]).await;
    w.hold().await;
    let waiter = w.wait_in_line().await;
    w.sem.release(&w.lock(), &id(HOLDER, HELD)).await.unwrap();
    let head = w
        .sem
        .waiters(&w.lock(), None, 1)
        .await
        .unwrap()
        .pop()
        .expect("the waiter is in line");
    assert_eq!(head.identity, waiter.identity());
    let grant = protocol::grant(&head, w.sem.now_ms());
    assert_eq!(
        w.sem.store().write(&grant).await.unwrap(),
        WriteResult::Landed
    );
    // ... and the hand-off crashes: no SendTaskSuccess.
    let holders = w.holders().await;
    assert_eq!(holders.len(), 1);
    assert_eq!(holders[0].0, waiter.identity());
    let token = holders[0].1;
    assert!(w.line().await.is_empty(), "granted: out of line");

    // Its wait times out, and the fallback check finds the slot.
    let check = waiter.parked.next_wait().await;
    assert_eq!(check["queued_at"], waiter.wait["queued_at"]);
    let answer = w.acquire(check).await.unwrap();
    assert_eq!(
        (&answer["outcome"], &answer["token"]),
        (&json!("acquired"), &json!(token.0)),
        "{answer}"
    );
    w.assert_granted(&waiter, token).await;

    // Nothing leaked: released, the slot is free for a newcomer at once.
    let released = w.release_waiter(&waiter).await;
    assert_eq!(
        (&released["released"], &released["count"]),
        (&json!(true), &json!(0))
    );
    let newcomer = w
        .sem
        .acquire(&w.lock(), &id("newcomer", "n1"), limit(1))
        .await
        .unwrap();
    assert!(
        matches!(newcomer, AcquireOutcome::Acquired { .. }),
        "{newcomer:?}"
    );
    assert!(w.consistent().await.is_empty());
}

/// F8, a lost wake-up: the slot frees after the acquire state answered "full" and before the
/// wait invocation queues. The release sees nobody in line and hands nothing on; the wait
/// invocation then finds the slot free and takes it, completing its own task, instead of
/// parking behind a free slot.
#[tokio::test]
async fn f8_a_slot_freed_between_full_and_queued_is_taken_by_the_wait_invocation_itself() {
    let w = world([300, 300]).await;
    w.hold().await;
    let name = unique("waiter");
    let (execution, full) = w.acquire_state(&name).await;
    assert_eq!(full["outcome"], json!("full"));
    let parked = park(&w.sfn, &w.machine, &name, &w.input, &full).await;
    assert_eq!(parked.execution, execution);

    let released = w.release_holder().await;
    assert_eq!(
        (&released["released"], &released["handed_off"]),
        (&json!(true), &json!(0)),
        "nobody was in line yet"
    );

    let wait = parked.next_wait().await;
    let answer = w.acquire(wait.clone()).await.unwrap();
    assert_eq!(
        (&answer["acquired"], &answer["outcome"]),
        (&json!(true), &json!("acquired")),
        "{answer}"
    );
    let holders = w.holders().await;
    assert_eq!(holders.len(), 1);
    assert_eq!(holders[0].0, id(&execution, "r0"));
    let token = holders[0].1;
    assert_eq!(answer["token"], json!(token.0));
    assert!(w.line().await.is_empty(), "it never queued");
    let waiter = Waiter { parked, wait, full };
    w.assert_granted(&waiter, token).await;
    let released = w.release_waiter(&waiter).await;
    assert_eq!(released["released"], json!(true));
    assert!(w.consistent().await.is_empty());
}

/// A parking machine whose wait task goes on as the definition's does: through "Slot granted?"
/// to "Granted" (the work) or to the start rate's Wait state and back in line, so that moto
/// runs the definition's own rate_limited path. Like `sfn::parking_machine`, the wait state's
/// Lambda invoke fails (no Lambda here) and the task parks on an SQS message instead.
fn rate_parking_machine(definition: &Value) -> Value {
    let wait = asl::state(definition, "Wait in line");
    let choice_name = wait["Next"].as_str().expect("a Next");
    let mut choice = asl::state(definition, choice_name).clone();
    let mut pause_name = None;
    for rule in choice["Choices"].as_array_mut().unwrap() {
        if rule["Next"] == json!("Protected work") {
            rule["Next"] = json!("Granted");
        } else {
            pause_name = rule["Next"].as_str().map(str::to_owned);
        }
    }
    assert_eq!(choice["Default"], json!("Wait in line"));
    let pause_name = pause_name.expect("a rule to the start rate's Wait state");
    let pause = asl::state(definition, &pause_name).clone();
    assert_eq!(pause["Type"], json!("Wait"));
    assert_eq!(pause["Next"], json!("Wait in line"));
    let mut states = serde_json::Map::new();
    states.insert(
        "Acquire slot".into(),
        json!({"Type": "Pass", "Parameters": {"semaphore.$": "$.parked.answer"}, "Next": "Wait in line"}),
    );
    states.insert(
        "Wait in line".into(),
        json!({
            "Type": "Task",
            "Resource": wait["Resource"],
            "Parameters": wait["Parameters"],
            "ResultPath": "$.no_lambda_here",
            "Catch": [{"ErrorEquals": ["States.ALL"], "ResultPath": "$.no_lambda_here", "Next": "Parked"}],
            "Next": "Parked"
        }),
    );
    states.insert(
        "Parked".into(),
        json!({
            "Type": "Task",
            "Resource": "arn:aws:states:::sqs:sendMessage.waitForTaskToken",
            "Parameters": {
                "QueueUrl.$": "$$.Execution.Input.parked.queue",
                "MessageBody": wait["Parameters"]["Payload"]
            },
            "TimeoutSecondsPath": wait["TimeoutSecondsPath"],
            "ResultPath": wait["ResultPath"],
            "Next": choice_name
        }),
    );
    states.insert(choice_name.into(), choice);
    states.insert(pause_name, pause);
    states.insert("Granted".into(), json!({"Type": "Succeed"}));
    json!({"StartAt": "Acquire slot", "States": states})
}

/// A start rate with a real parked task: an execution that asks within the rate's spacing of
/// the last start is answered "rate_limited" and waits in line; its wait invocation queues it,
/// and its hand-off finds the next start more than 2 s away, so it defers the head
/// (`SendTaskSuccess` with "rate_limited" and wait_seconds) instead of sleeping. The definition's
/// Wait state waits that long and enters the line again with the same place; that wait
/// invocation's hand-off grants it the slot once the rate allows, and the execution goes on to
/// its work with it. Nothing was held while it waited.
#[tokio::test]
async fn a_head_of_the_line_held_back_by_the_start_rate_waits_and_is_granted_when_it_allows() {
    let sfn = sfn::client();
    let table = fresh_table().await.table().to_owned();
    let settings = settings(&table);
    let definition = asl::definition("lock-protected.asl.json");
    let machine =
        sfn::create_machine(&sfn, &unique("Paced"), &rate_parking_machine(&definition)).await;
    let lock = unique("paced");
    // One start every 5 s; room for both.
    let (metrics, kept) = Metrics::kept();
    let w = World {
        metrics,
        kept,
        sem: settings.semaphore(&sdk_config()).unwrap(),
        config: Config::from_settings(&settings).unwrap(),
        input: json!({"lock": lock, "limit": 2, "rate": 0.2}),
        sfn,
        table,
        definition,
        machine,
        lock,
    };
    let first = w
        .acquire(
            json!({"lock": w.lock, "limit": 2, "rate": 0.2, "holder": HOLDER,
                        "acquisition": HELD, "requested_at": rfc3339_millis(w.sem.now_ms())}),
        )
        .await
        .unwrap();
    assert_eq!(first["outcome"], json!("acquired"));
    let started_ms = w
        .sem
        .status(&w.lock())
        .await
        .unwrap()
        .started_at_ms
        .unwrap();

    let name = unique("paced");
    let (execution, limited) = w.acquire_state(&name).await;
    assert_eq!(
        (&limited["acquired"], &limited["outcome"]),
        (&json!(false), &json!("rate_limited")),
        "{limited}"
    );
    assert_eq!(
        limited["next_start_at"],
        json!(rfc3339_millis(started_ms + 5_000))
    );
    let parked = park(&w.sfn, &w.machine, &name, &w.input, &limited).await;
    let wait = parked.next_wait().await;
    assert_eq!(wait["queued_at"], limited["queued_at"]);
    let queued = w.acquire(wait.clone()).await.unwrap();
    assert_eq!(queued["outcome"], json!("queued"), "{queued}");
    assert!(
        w.sem.now_ms() < started_ms + 3_000,
        "the test needs the first wait within 3 s of the first start, so that the next start \
         is more than 2 s away and the hand-off defers the head"
    );
    // Deferred: still in line (its record keeps its place), nothing held.
    let waiter = Waiter {
        parked,
        wait,
        full: limited,
    };
    assert_eq!(w.line().await, std::slice::from_ref(&execution));
    assert_eq!(
        w.holders()
            .await
            .into_iter()
            .map(|(who, _)| who)
            .collect::<Vec<_>>(),
        [id(HOLDER, HELD)]
    );
    let deferred = task_outputs(&w.sfn, &execution)
        .await
        .last()
        .cloned()
        .expect("the wait task succeeded with the deferral");
    assert_eq!(
        (
            &deferred["acquired"],
            &deferred["outcome"],
            &deferred["next_start_at"],
            &deferred["queued_at"],
            &deferred["fallback_seconds"]
        ),
        (
            &json!(false),
            &json!("rate_limited"),
            &waiter.full["next_start_at"],
            &waiter.full["queued_at"],
            &waiter.full["fallback_seconds"]
        ),
        "{deferred}"
    );
    let wait_seconds = deferred["wait_seconds"].as_u64().expect("wait_seconds");
    assert!((3..=5).contains(&wait_seconds), "{deferred}");

    // After the Wait state: in line again, same place, a new task.
    let check = waiter.parked.next_wait().await;
    assert!(
        w.sem.now_ms() + 1_000 >= started_ms + 5_000,
        "the Wait state waited wait_seconds"
    );
    assert_ne!(check["task_token"], waiter.wait["task_token"]);
    assert_eq!(check["queued_at"], waiter.wait["queued_at"]);
    w.acquire(check).await.unwrap();
    let holders = w.holders().await;
    let token = holders
        .iter()
        .find(|(who, _)| *who == waiter.identity())
        .expect("granted")
        .1;
    w.assert_granted(&waiter, token).await;
    let item = w.sem.status(&w.lock()).await.unwrap();
    assert!(
        item.started_at_ms.unwrap() >= started_ms + 5_000,
        "started no sooner than the rate allows: {item:?}"
    );
    assert_eq!((item.count(), item.used, item.waiting), (2, 2, 0));
}
