//! F8 made to happen with real task tokens: executions parked in line on the local server's
//! Step Functions (moto's execution mode), woken by the real functions' hand-offs through
//! `SendTaskSuccess`, stopped with `StopExecution`, timed out by their acquire state's timeout,
//! retried by its `Retry`.
//!
//! Each waiter is an execution of `sfn::parking_machine`: the lock-protected definition's own
//! "Acquire slot" state, parked on a task moto completes without Lambda (see there). The test
//! invokes the real acquire handler with each payload the execution parks with, exactly what
//! Step Functions would invoke the function with: the parked task's own token, its entry time
//! and retry count. Release and cleanup are the real handlers too, with hand-offs through the
//! local server's Step Functions.
//!
//! Three deviations of moto from AWS matter here, and the local server's launcher
//! (`local/moto_server.py`) fixes them: a stopped execution parked on a task token stayed
//! RUNNING (and took `SendTaskSuccess`) until the task ended; the token of a task that had ended
//! (timed out, completed) still took `SendTaskSuccess`, silently; and a retried callback task
//! kept its token, where AWS gives every attempt a new one. With them fixed, every failed
//! wake-up here is a real one.
//!
//! Every test ends by reading the lock raw: no more holders than the limit, and its `waiting`
//! equals the records in its line.

use semaphore_core::Claim;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use lambda_acquire::Config;
use lambda_cleanup::Cleanup;
use lambda_common::metrics::check_emf;
use lambda_common::{Metrics, Resolver, Settings, SfnHandOffs, TaskCallbacks};
use lambda_runtime::{Context, Diagnostic, LambdaEvent};
use local_aws::asl::{self, ACQUIRE_STATE};
use local_aws::names::{id, limit};
use local_aws::observe::{assert_consistent, text, RawRecord};
use local_aws::sfn::{
    self, described, ended, park, parking_machine, status, stop, task_outputs, unique, Parked,
};
use local_aws::{fresh_table, sdk_config};
use semaphore_core::{
    protocol, AcquireOutcome, DynamoStore, FenceKey, FencingToken, HolderId, Identity, ItemStore,
    LockName, QueueKey, Run, Semaphore, SemaphoreItem, StoreError, TaskToken, WaiterId, Write,
    WriteResult,
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

/// An RFC 3339 time (Step Functions' `EnteredTime`, moto's with microseconds) in ms.
fn ms(time: &Value) -> u64 {
    let text = time.as_str().expect("a time");
    aws_sdk_dynamodb::primitives::DateTime::from_str(
        text,
        aws_sdk_dynamodb::primitives::DateTimeFormat::DateTimeWithOffset,
    )
    .unwrap_or_else(|e| panic!("{text}: {e}"))
    .to_millis()
    .unwrap() as u64
}

/// One lock on a fresh table, the functions as their `main`s build them, and a parking machine
/// whose acquire task times out after the given seconds (first, later).
struct World<S: ItemStore = DynamoStore> {
    sfn: sfn::Client,
    table: String,
    sem: Semaphore<S>,
    config: Config,
    machine: String,
    lock: String,
    input: Value,
    /// Where the functions' metric lines are kept (`World::metric_lines`).
    metrics: Metrics,
    kept: Arc<Mutex<Vec<String>>>,
}

/// A waiter: its parked execution and the payload its first acquire task was invoked with.
struct Waiter {
    parked: Parked,
    first: Value,
}

impl Waiter {
    fn execution(&self) -> &str {
        &self.parked.execution
    }

    fn identity(&self) -> Identity {
        id(self.execution(), "r0")
    }
}

async fn world(input: Value, timeouts: [u64; 2]) -> World {
    let table = fresh_table().await.table().to_owned();
    let sem = settings(&table).semaphore(&sdk_config()).unwrap();
    world_on(table, sem, input, timeouts).await
}

async fn world_on<S: ItemStore>(
    table: String,
    sem: Semaphore<S>,
    input: Value,
    timeouts: [u64; 2],
) -> World<S> {
    let sfn = sfn::client();
    let definition = asl::definition("lock-protected.asl.json");
    let machine = sfn::create_machine(
        &sfn,
        &unique("Parking"),
        &parking_machine(&definition, ACQUIRE_STATE, timeouts),
    )
    .await;
    let (metrics, kept) = Metrics::kept();
    World {
        metrics,
        kept,
        config: Config::from_settings(&settings(&table)).unwrap(),
        lock: input["lock"]
            .as_str()
            .expect("the input names a lock")
            .to_owned(),
        input,
        sem,
        sfn,
        table,
        machine,
    }
}

impl<S: ItemStore> World<S> {
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

    /// The release of `holder`'s acquisition `acquisition`, as "Release slot" sends it: the
    /// acquire answer (of which the release reads the lock, holder and acquisition).
    async fn release_of(&self, holder: &str, acquisition: &str) -> Value {
        let token = self.token_of(holder, acquisition).await;
        self.release(json!({"semaphore": {"lock": self.lock, "holder": holder,
                                          "acquisition": acquisition, "token": token}}))
            .await
    }

    /// The token `holder`'s acquisition holds its slot under: the one its acquire answered,
    /// which its release shows (F15); one no slot has when it holds none.
    async fn token_of(&self, holder: &str, acquisition: &str) -> u64 {
        let lock = LockName::new(self.lock.as_str()).unwrap();
        self.sem
            .status(&lock)
            .await
            .ok()
            .and_then(|item| {
                item.holders
                    .get(&id(holder, acquisition))
                    .map(|h| h.token.0)
            })
            .unwrap_or(semaphore_core::FencingToken::MAX)
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

    /// The slot taken by [`HOLDER`] (an operator's acquire, through the core), so that the lock
    /// is full.
    async fn hold(&self) {
        let limit = limit(self.input["limit"].as_i64().unwrap_or(1));
        let answer = self
            .sem
            .acquire(&self.lock(), &id(HOLDER, HELD), limit)
            .await
            .unwrap();
        assert!(
            matches!(answer, AcquireOutcome::Acquired { .. }),
            "{answer:?}"
        );
    }

    /// An execution parked on its acquire task: the payload of its first attempt, as the
    /// acquire state renders it.
    async fn start(&self) -> (Parked, Value) {
        let parked = park(&self.sfn, &self.machine, &unique("waiter"), &self.input).await;
        let payload = parked.next_acquire().await;
        assert_eq!(payload["execution"], json!(parked.execution));
        assert_eq!(payload["request"]["lock"], json!(self.lock));
        assert_eq!(payload["starts_work"], json!(true));
        assert_eq!(payload["state"]["RetryCount"], json!(0));
        assert!(payload["task_token"].is_string(), "{payload}");
        (parked, payload)
    }

    /// An execution that finds the lock full and is queued by its acquire task.
    async fn wait_in_line(&self) -> Waiter {
        let (parked, first) = self.start().await;
        let queued = self.acquire(first.clone()).await.unwrap();
        assert_eq!(queued["outcome"], json!("queued"), "{queued}");
        assert_eq!(ms(&queued["queued_at"]), ms(&first["state"]["EnteredTime"]));
        Waiter { parked, first }
    }

    /// Holders <= limit and `waiting` = the records in line, read raw: the records.
    async fn consistent(&self) -> Vec<RawRecord> {
        let client = aws_sdk_dynamodb::Client::new(&sdk_config());
        assert_consistent(
            &client,
            &self.table,
            &DynamoStore::default_queue_table(&self.table),
            &self.lock,
            self.input["limit"].as_u64().unwrap_or(1) as usize,
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

    /// The waiter's execution ends SUCCEEDED, its acquire task completed with the granted answer
    /// for the slot of token `token`: what the definition's "Protected work" reads.
    async fn assert_granted(&self, waiter: &Waiter, token: FencingToken) {
        assert_eq!(ended(&self.sfn, waiter.execution()).await, "SUCCEEDED");
        let (_, output) = described(&self.sfn, waiter.execution()).await;
        let granted = &output.expect("an output")["semaphore"];
        assert_eq!(
            (
                &granted["acquired"],
                &granted["token"],
                &granted["holder"],
                &granted["lock"]
            ),
            (
                &json!(true),
                &json!(token.0),
                &json!(waiter.execution()),
                &json!(self.lock)
            ),
            "{granted}"
        );
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
/// second one's cleanup comes first and takes it out of line (its record found by who it is).
/// Then the slot frees: the release's hand-off grants the first dead waiter, its
/// `SendTaskSuccess` fails, `DescribeExecution` says ABORTED, so the grant is freed again (its
/// run fenced) and the slot goes to the live waiter behind it, whose execution takes the
/// granted answer and goes on. A stopped waiter's late acquire invocation cannot queue again.
#[tokio::test]
async fn f8_waiters_stopped_in_line_are_taken_out_and_the_slot_goes_to_the_next_live_waiter() {
    let w = world(json!({"lock": unique("f8"), "limit": 1}), [300, 300]).await;
    w.hold().await;
    let dead_first = w.wait_in_line().await;
    let dead_second = w.wait_in_line().await;
    let before_live = w.sem.now_ms();
    let live = w.wait_in_line().await;
    // The metrics so far: each waiter queued, with the lock as its acquire saw it.
    let outcomes: Vec<(Value, Value)> = w
        .metric_lines()
        .iter()
        .map(|l| (l["Outcome"].clone(), l["Waiting"].clone()))
        .collect();
    assert_eq!(
        outcomes,
        [
            (json!("queued"), json!(0)),
            (json!("queued"), json!(1)),
            (json!("queued"), json!(2)),
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
    let released = w.release_of(HOLDER, HELD).await;
    let after_release = w.sem.now_ms();
    assert_eq!(
        (&released["released"], &released["handed_off"]),
        (&json!(true), &json!(1)),
        "{released}"
    );
    // Its metrics: the release (the lock as it left it: two in line), then the hand-off's
    // grant (how long the live waiter waited since it was queued, how long the hand-off took
    // from the free, the lock after the grant) and the dead head it freed again.
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
    let granted = &lines[1];
    assert_eq!(
        (
            &granted["Outcome"],
            &granted["Acquisitions"],
            &granted["DeadWaitersRemoved"]
        ),
        (&json!("granted"), &json!(1), &json!(1))
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

    // A stopped waiter's late acquire invocation (a zombie, or a retry in flight) is refused by
    // its run's fence: it does not queue again.
    let late = w.acquire(dead_second.first.clone()).await.unwrap_err();
    assert_eq!(late.error_type, "SemaphoreFenced", "{}", late.error_message);
    assert!(w.line().await.is_empty());

    // The live waiter's work is done: its release frees the slot; nobody waits.
    let released = w.release_of(live.execution(), "r0").await;
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

/// The one-state wait's own check: the acquire task of the head of the line times out, and the
/// state's Catch enters it again, a new attempt with a new token. Its invocation finds its
/// record by who it is, keeps its place ahead of the waiter behind it, and gives the record the
/// new token, which is the one the next hand-off wakes; the first task's token is closed.
#[tokio::test]
async fn a_check_after_a_timeout_keeps_the_place_and_the_hand_off_wakes_the_new_task() {
    let w = world(json!({"lock": unique("check"), "limit": 1}), [2, 300]).await;
    w.hold().await;
    let head = w.wait_in_line().await;
    let behind = w.wait_in_line().await;
    let place = QueueKey::new(&head.identity(), ms(&head.first["state"]["EnteredTime"])).render();
    // Its first task times out: the state is entered again, a new token and entry time.
    let check = head.parked.next_acquire().await;
    assert_ne!(check["task_token"], head.first["task_token"]);
    assert_ne!(
        check["state"]["EnteredTime"],
        head.first["state"]["EnteredTime"]
    );
    let checked = w.acquire(check.clone()).await.unwrap();
    assert_eq!(checked["outcome"], json!("queued"), "{checked}");
    assert_eq!(
        ms(&checked["queued_at"]),
        ms(&head.first["state"]["EnteredTime"]),
        "its place: when it was first queued"
    );
    let records = w.consistent().await;
    assert_eq!(
        records
            .iter()
            .map(|r| (text(r, "holder"), text(r, "place")))
            .collect::<Vec<_>>()[0],
        (head.execution(), place.as_str()),
        "the same place, at the head"
    );
    assert_eq!(
        text(&records[0], "task_token"),
        check["task_token"].as_str().unwrap()
    );
    assert_eq!(w.line().await, [head.execution(), behind.execution()]);
    // The first task is over: a wake-up sent to its token fails, as on AWS.
    let first_token = TaskToken::new(head.first["task_token"].as_str().unwrap()).unwrap();
    let hand_offs = w.hand_offs();
    assert!(hand_offs
        .waker
        .callbacks
        .succeed(&first_token, "{}")
        .await
        .is_err());

    // The slot frees: the release's hand-off wakes the head's new task.
    let released = w.release_of(HOLDER, HELD).await;
    assert_eq!(released["handed_off"], json!(1), "{released}");
    let token = w.holders().await[0].1;
    w.assert_granted(&head, token).await;
    assert_eq!(w.line().await, [behind.execution()]);
    assert_eq!(
        status(&w.sfn, behind.execution()).await.as_deref(),
        Some("RUNNING")
    );
    stop(&w.sfn, behind.execution()).await;
    let status = ended(&w.sfn, behind.execution()).await;
    // Its own parked task times out two seconds after it parked, as the head's did: on a
    // loaded machine that can come first, and its acquire state, entered again, fails on the
    // local server (no Lambda runs there). Either way it ended with its record in line.
    if status != "ABORTED" && status != "FAILED" {
        let dir = std::env::temp_dir();
        panic!(
            "{status}: {}",
            sfn::save_history(&w.sfn, behind.execution(), &dir).await
        );
    }
    let cleaned = w.cleanup(behind.execution()).await;
    assert_eq!(cleaned["left_line"], json!([w.lock]), "{cleaned}");
    assert!(w.line().await.is_empty());
}

/// F8, a wake-up that fails while the waiter lives: its acquire task timed out (its check is
/// under way with a new token) just before the slot freed, so `SendTaskSuccess` to the token in
/// its record fails (TaskTimedOut). Its execution still runs: it keeps the slot ("parked" in the
/// hand-off's report), and its check finds the slot and completes its own task with it.
#[tokio::test]
async fn f8_a_failed_wake_up_of_a_live_waiter_leaves_it_the_slot_which_its_check_takes() {
    let w = world(json!({"lock": unique("wake"), "limit": 1}), [2, 300]).await;
    w.hold().await;
    let waiter = w.wait_in_line().await;
    // Its first task times out: the state is entered again, with a new token; the first task,
    // and its token, are closed.
    let check = waiter.parked.next_acquire().await;
    assert_ne!(check["task_token"], waiter.first["task_token"]);

    // The holder's release, then its hand-off (what the release function runs after its write).
    w.sem
        .release(&w.lock(), &id(HOLDER, HELD), Claim::Operator)
        .await
        .unwrap();
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

    // Its check: the slot is its own, and it completes its own task with it.
    let answer = w.acquire(check).await.unwrap();
    assert_eq!(
        (&answer["acquired"], &answer["outcome"], &answer["token"]),
        (&json!(true), &json!("already_held"), &json!(token.0)),
        "{answer}"
    );
    w.assert_granted(&waiter, token).await;
    let released = w.release_of(waiter.execution(), "r0").await;
    assert_eq!(released["released"], json!(true));
    assert!(w.consistent().await.is_empty());
}

/// F8, a lost wake-up: the function that freed the slot crashed between its hand-off's grant
/// write (the core's own, sent here through the store) and the wake-up. The waiter holds the
/// slot and is out of line, and nobody tells it: its check completes its task with the slot.
/// Nothing leaks: its release frees the slot for the next execution.
#[tokio::test]
async fn f8_a_hand_off_that_crashed_between_grant_and_wake_up_is_recovered_by_the_check() {
    let w = world(json!({"lock": unique("crash"), "limit": 1}), [2, 300]).await;
    w.hold().await;
    let waiter = w.wait_in_line().await;
    w.sem
        .release(&w.lock(), &id(HOLDER, HELD), Claim::Operator)
        .await
        .unwrap();
    let head = w
        .sem
        .waiters(&w.lock(), None, 1)
        .await
        .unwrap()
        .pop()
        .expect("the waiter is in line");
    assert_eq!(head.identity, waiter.identity());
    let grant = protocol::grant(&head, None, &head.terms, w.sem.now_ms());
    assert_eq!(
        w.sem.store().write(&grant).await.unwrap(),
        WriteResult::Landed { after: None }
    );
    // ... and the hand-off crashes: no SendTaskSuccess.
    let holders = w.holders().await;
    assert_eq!(holders.len(), 1);
    assert_eq!(holders[0].0, waiter.identity());
    let token = holders[0].1;
    assert!(w.line().await.is_empty(), "granted: out of line");

    // Its task times out, and the check finds the slot.
    let check = waiter.parked.next_acquire().await;
    let answer = w.acquire(check).await.unwrap();
    assert_eq!(
        (&answer["outcome"], &answer["token"]),
        (&json!("already_held"), &json!(token.0)),
        "{answer}"
    );
    w.assert_granted(&waiter, token).await;

    // Nothing leaked: released, the slot is free for a newcomer at once.
    let released = w.release_of(waiter.execution(), "r0").await;
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

/// The DynamoDB store with one more write landed right after the first acquire write it sends
/// is refused: a writer acting between an acquire's "full" and its queue write (here, the
/// holder's release, held until then).
struct ReleaseAfterFull {
    inner: DynamoStore,
    /// Who releases, once: its holder's release, showing the token of its slot as the refusal
    /// handed it back.
    release: Mutex<Option<Identity>>,
}

impl ItemStore for ReleaseAfterFull {
    async fn load(&self, lock: &LockName) -> Result<Option<SemaphoreItem>, StoreError> {
        self.inner.load(lock).await
    }

    async fn write(&self, write: &Write) -> Result<WriteResult, StoreError> {
        let result = self.inner.write(write).await?;
        let is_acquire = write.checks.contains(&semaphore_core::Check::QueueEmpty);
        if let (true, WriteResult::Refused { current, .. }) = (is_acquire, &result) {
            let pending = self.release.lock().unwrap().take();
            if let Some(who) = pending {
                let held = current.holders[&who];
                let release = protocol::release(&write.lock, &who, held.token, held.weight, 0);
                self.inner.write(&release).await?;
            }
        }
        Ok(result)
    }

    async fn list_page(
        &self,
        after: Option<&semaphore_core::ListCursor>,
    ) -> Result<semaphore_core::ListPage, StoreError> {
        self.inner.list_page(after).await
    }

    async fn waiters(
        &self,
        lock: &LockName,
        after: Option<QueueKey>,
        limit: usize,
    ) -> Result<Vec<semaphore_core::Waiter>, StoreError> {
        self.inner.waiters(lock, after, limit).await
    }

    async fn waiter(
        &self,
        lock: &LockName,
        id: WaiterId,
    ) -> Result<Option<semaphore_core::Waiter>, StoreError> {
        self.inner.waiter(lock, id).await
    }
}

/// F8, a lost wake-up: the slot frees after the acquire found the lock full and before its
/// queue write. The release sees nobody in line and hands nothing on; the queue write then
/// finds the slot free (it queues only behind a busy lock), the invocation takes the slot and
/// completes its own task, instead of parking behind a free slot.
#[tokio::test]
async fn f8_a_slot_freed_between_full_and_queued_is_taken_by_the_same_invocation() {
    let table = fresh_table().await.table().to_owned();
    let lock_name = unique("between");
    let store = ReleaseAfterFull {
        inner: settings(&table)
            .semaphore(&sdk_config())
            .unwrap()
            .store()
            .clone(),
        release: Mutex::new(Some(id(HOLDER, HELD))),
    };
    let sem = Semaphore::new(store);
    let w = world_on(
        table,
        sem,
        json!({"lock": lock_name, "limit": 1}),
        [300, 300],
    )
    .await;
    w.hold().await;
    let (parked, first) = w.start().await;
    let answer = w.acquire(first.clone()).await.unwrap();
    assert_eq!(
        (&answer["acquired"], &answer["outcome"]),
        (&json!(true), &json!("acquired")),
        "{answer}"
    );
    assert!(
        w.sem.store().release.lock().unwrap().is_none(),
        "the release landed between the two writes"
    );
    let holders = w.holders().await;
    assert_eq!(holders.len(), 1);
    let waiter = Waiter { parked, first };
    assert_eq!(holders[0].0, waiter.identity());
    let token = holders[0].1;
    assert!(w.line().await.is_empty(), "it never queued");
    w.assert_granted(&waiter, token).await;
    assert!(w.consistent().await.is_empty());
}

/// A start rate with real parked tasks: an execution that asks within the rate's spacing of the
/// last start is queued; its own hand-off finds the next start more than 2 s away, so it fails
/// its task with `SemaphoreRateLimited` instead of sleeping. The state's Retry makes a new
/// attempt, with a new token (AWS's, and the local server's once patched), whose check keeps
/// the place and gives the record that token; once the rate allows, a check's hand-off grants
/// it the slot and the execution goes on with it. Nothing was held while it waited.
#[tokio::test]
async fn a_head_of_the_line_held_back_by_the_start_rate_is_retried_and_granted_when_it_allows() {
    let w = world(
        json!({"lock": unique("paced"), "limit": 2, "rate": 0.2}),
        [300, 300],
    )
    .await;
    // One start every 5 s; room for both.
    w.hold().await;
    let started_ms = w
        .sem
        .status(&w.lock())
        .await
        .unwrap()
        .started_at_ms
        .unwrap();
    let (parked, first) = w.start().await;
    let queued = w.acquire(first.clone()).await.unwrap();
    assert_eq!(queued["outcome"], json!("queued"), "{queued}");
    assert!(
        w.sem.now_ms() < started_ms + 3_000,
        "the test needs the first attempt within 3 s of the first start, so that the next \
         start is more than 2 s away and the hand-off defers the head"
    );
    let waiter = Waiter { parked, first };
    assert_eq!(w.line().await, [waiter.execution()]);
    assert_eq!(
        w.holders()
            .await
            .into_iter()
            .map(|(who, _)| who)
            .collect::<Vec<_>>(),
        [id(HOLDER, HELD)],
        "nothing held while deferred"
    );

    // Retried until granted: each retry a new attempt, with a new token, in the same place.
    let mut tokens = vec![waiter.first["task_token"].clone()];
    for retry in 1.. {
        assert!(retry < 10, "granted within a few retries");
        let attempt = waiter.parked.next_acquire().await;
        assert_eq!(attempt["state"]["RetryCount"], json!(retry));
        assert_eq!(
            attempt["state"]["EnteredTime"], waiter.first["state"]["EnteredTime"],
            "a retry of the same state entry"
        );
        assert!(!tokens.contains(&attempt["task_token"]), "a new token");
        tokens.push(attempt["task_token"].clone());
        let answer = w.acquire(attempt).await.unwrap();
        assert_eq!(
            ms(&answer["queued_at"]),
            ms(&waiter.first["state"]["EnteredTime"])
        );
        if status(&w.sfn, waiter.execution()).await.as_deref() != Some("RUNNING")
            || w.holders().await.len() == 2
        {
            break;
        }
    }
    let token = w
        .holders()
        .await
        .into_iter()
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
