//! The sweeper against the local server's Step Functions (real executions: moto's execution
//! mode), SNS and SQS: one execution stopped (ABORTED), one left RUNNING, one that never
//! existed, one that ended while its work (a child execution) still runs; the notices are read
//! back from an SQS queue subscribed to the topic and checked field by field, and the EMF line
//! is checked. The lines: executions parked in line on real task tokens (`sfn::park`), one of
//! them stopped, swept.

use semaphore_core::Claim;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use aws_sdk_sqs::types::QueueAttributeName;
use lambda_common::executions::LIST_ABOVE_HOLDERS;
use lambda_common::metrics::check_emf;
use lambda_common::Settings;
use lambda_runtime::{Context, LambdaEvent};
use lambda_sweeper::{ArnPatterns, Notice, SfnExecutions, Sweeper};
use local_aws::counter::RequestCounter;
use local_aws::foreign::{put_foreign_item, FOREIGN_FORMAT};
use local_aws::names::id;
use local_aws::observe::{assert_consistent, observe, raw_item};
use local_aws::sfn::{
    client as sfn_client, create_machine, described, end_parent_while_child_runs, ended, park,
    parking_machine, status, stop, unique,
};
use local_aws::{endpoint, fresh_table, sdk_config};
use semaphore_core::{
    AcquireOutcome, Attempt, DynamoStore, ExecutionState, ExecutionStatus, FenceReason, HolderId,
    Limit, LockName, ManualClock, PortError, QueueOutcome, Run, Semaphore, TaskToken, Waiter,
    MISSING_EXECUTION_GRACE_MS,
};
use serde_json::{json, Value};

const ACCOUNT_REGION: &str = "us-east-1:123456789012";

struct Local {
    sfn: aws_sdk_sfn::Client,
    sqs: aws_sdk_sqs::Client,
    machine_arn: String,
    machine_name: String,
    topic_arn: String,
    queue_url: String,
}

/// A trivial state machine whose executions wait (moto keeps them RUNNING until stopped), an
/// SNS topic and an SQS queue subscribed to it.
async fn local() -> Local {
    let sdk = sdk_config();
    let sfn = sfn_client();
    let sns = aws_sdk_sns::Client::new(&sdk);
    let sqs = aws_sdk_sqs::Client::new(&sdk);
    let suffix = format!("{:x}", fastrand::u64(..));

    let machine_name = format!("LockProtected-{suffix}");
    let definition = json!({
        "StartAt": "Work",
        "States": { "Work": { "Type": "Wait", "Seconds": 3600, "End": true } }
    });
    let machine_arn = sfn
        .create_state_machine()
        .name(&machine_name)
        .definition(definition.to_string())
        .role_arn("arn:aws:iam::123456789012:role/semaphore-test")
        .send()
        .await
        .expect("create the state machine")
        .state_machine_arn()
        .to_owned();

    let topic_arn = sns
        .create_topic()
        .name(format!("semaphore-alerts-{suffix}"))
        .send()
        .await
        .expect("create the topic")
        .topic_arn()
        .expect("a topic ARN")
        .to_owned();
    let queue_url = sqs
        .create_queue()
        .queue_name(format!("semaphore-notices-{suffix}"))
        .send()
        .await
        .expect("create the queue")
        .queue_url()
        .expect("a queue URL")
        .to_owned();
    let queue_arn = sqs
        .get_queue_attributes()
        .queue_url(&queue_url)
        .attribute_names(QueueAttributeName::QueueArn)
        .send()
        .await
        .expect("queue attributes")
        .attributes()
        .and_then(|a| a.get(&QueueAttributeName::QueueArn))
        .expect("the queue ARN")
        .to_owned();
    sns.subscribe()
        .topic_arn(&topic_arn)
        .protocol("sqs")
        .endpoint(queue_arn)
        .send()
        .await
        .expect("subscribe the queue");

    Local {
        sfn,
        sqs,
        machine_arn,
        machine_name,
        topic_arn,
        queue_url,
    }
}

impl Local {
    async fn start(&self, name: &str) -> String {
        self.sfn
            .start_execution()
            .state_machine_arn(&self.machine_arn)
            .name(name)
            .input("{}")
            .send()
            .await
            .expect("start an execution")
            .execution_arn()
            .to_owned()
    }

    async fn stop(&self, execution: &str) {
        self.sfn
            .stop_execution()
            .execution_arn(execution)
            .send()
            .await
            .expect("stop the execution");
    }

    async fn status(&self, execution: &str) -> String {
        self.sfn
            .describe_execution()
            .execution_arn(execution)
            .send()
            .await
            .expect("describe")
            .status()
            .as_str()
            .to_owned()
    }

    /// Receives and deletes messages until `want` arrived or `wait` is over.
    async fn notices(&self, want: usize, wait: Duration) -> Vec<Value> {
        let mut got = Vec::new();
        let deadline = Instant::now() + wait;
        while got.len() < want && Instant::now() < deadline {
            let received = self
                .sqs
                .receive_message()
                .queue_url(&self.queue_url)
                .max_number_of_messages(10)
                .wait_time_seconds(1)
                .send()
                .await
                .expect("receive");
            for message in received.messages() {
                got.push(
                    serde_json::from_str(message.body().expect("a body"))
                        .expect("the SNS envelope is JSON"),
                );
                self.sqs
                    .delete_message()
                    .queue_url(&self.queue_url)
                    .receipt_handle(message.receipt_handle().expect("a receipt handle"))
                    .send()
                    .await
                    .expect("delete");
            }
        }
        got
    }

    /// The sweeper as the function's `main` builds it, on `table`.
    fn sweeper(&self, table: &str) -> Sweeper<DynamoStore, SfnExecutions> {
        let vars = BTreeMap::from([
            ("TABLE_NAME", table.to_owned()),
            ("TOPIC_ARN", self.topic_arn.clone()),
            ("PROTECTED_STATE_MACHINES", self.machine_arn.clone()),
        ]);
        let settings = Settings::from_lookup(move |name| vars.get(name).cloned());
        Sweeper::from_settings(&settings, &sdk_config()).expect("settings")
    }
}

async fn take(sem: &Semaphore<DynamoStore>, lock: &str, holder: &str, acquisition: &str) -> u64 {
    match sem
        .acquire(
            &LockName::new(lock).unwrap(),
            &id(holder, acquisition),
            Limit::new(10).unwrap(),
        )
        .await
        .unwrap()
    {
        AcquireOutcome::Acquired { token, .. } => token.0,
        other => panic!("{other:?}"),
    }
}

/// `take`, acquired as if past the grace period ago: a sweep believes "does not exist" of it
/// (`MISSING_EXECUTION_GRACE_MS`; the grace has a test of its own).
async fn take_past_grace(
    sem: &Semaphore<DynamoStore>,
    lock: &str,
    holder: &str,
    acquisition: &str,
) -> u64 {
    let long_ago = now_ms() - MISSING_EXECUTION_GRACE_MS - 1_000;
    let sem = sem.clone().with_clock(Arc::new(ManualClock::new(long_ago)));
    take(&sem, lock, holder, acquisition).await
}

/// The sweeper's Step Functions side judging `machines` (ARN patterns), its calls counted.
fn counted_executions(machines: &str) -> (RequestCounter, SfnExecutions) {
    let counter = RequestCounter::new();
    let counted = aws_sdk_sfn::config::Builder::from(&sdk_config())
        .interceptor(counter.clone())
        .build();
    let executions = SfnExecutions::of_machines(
        aws_sdk_sfn::Client::from_conf(counted),
        ArnPatterns::parse(machines, |_| true).unwrap(),
    );
    (counter, executions)
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

#[tokio::test]
async fn only_ended_and_missing_executions_are_reclaimed_and_each_is_announced() {
    let local = local().await;
    let running = local.start("running").await;
    let aborted = local.start("aborted").await;
    local.stop(&aborted).await;
    assert_eq!(local.status(&running).await, "RUNNING");
    assert_eq!(local.status(&aborted).await, "ABORTED");
    let missing = format!(
        "arn:aws:states:{ACCOUNT_REGION}:execution:{}:never-started",
        local.machine_name
    );
    // Left alone: an operator's id, and an execution of a machine this sweeper does not judge.
    let operator = "operator-1";
    let foreign = format!("arn:aws:states:{ACCOUNT_REGION}:execution:SomeOtherMachine:run-9");

    let table = fresh_table().await.table().to_owned();
    let sweeper = local.sweeper(&table);
    let sem = &sweeper.semaphore;
    take(sem, "demo-lock", &running, "r1").await;
    let aborted_token = take(sem, "demo-lock", &aborted, "a1").await;
    let missing_token = take_past_grace(sem, "demo-lock", &missing, "m1").await;
    take(sem, "demo-lock", operator, "op").await;
    take(sem, "demo-lock", &foreign, "f1").await;
    let orders_token = take(sem, "orders", &aborted, "o1").await;
    // demo-lock, with 5 holders, is the bigger item; its size as stored, read back raw.
    let demo_bytes = observe(sem.store().client(), &table, "demo-lock")
        .await
        .expect("the item exists")
        .approx_bytes;
    let before_sweep = now_ms();

    let result = sweeper.sweep().await.expect("the sweep");
    let summary = serde_json::to_value(&result.summary).unwrap();
    assert_eq!(
        summary,
        json!({
            "pages": 1,
            "locks": 2,
            "largest_item_bytes": demo_bytes,
            "largest_item_lock": "demo-lock",
            "holders_checked": 5,
            "reclaimed": 3,
            "taken_back": 0,
            "kept_not_found": 0,
            "waiters_checked": 0,
            "waiters_removed": 0,
            "woken": 0,
            "not_judged": 0,
            "notices_published": 3,
            "errors": [],
            "errors_left_out": 0
        })
    );

    // What is left: the running execution, the operator and the other machine's execution.
    let demo = sem
        .status(&LockName::new("demo-lock").unwrap())
        .await
        .unwrap();
    let mut left: Vec<String> = demo.holders.keys().map(|i| i.holder.to_string()).collect();
    left.sort();
    let mut expected = vec![running.clone(), operator.to_owned(), foreign.clone()];
    expected.sort();
    assert_eq!(left, expected);
    assert_eq!(demo.count(), 3);
    let orders = sem.status(&LockName::new("orders").unwrap()).await.unwrap();
    assert_eq!(orders.count(), 0);
    // Reclaimed holders are fenced like a cleanup: a zombie acquire cannot come back.
    assert_eq!(
        sem.acquire(
            &LockName::new("demo-lock").unwrap(),
            &id(&aborted, "a2"),
            Limit::new(10).unwrap()
        )
        .await
        .unwrap(),
        AcquireOutcome::Fenced(FenceReason::ExecutionEnded)
    );

    // The EMF lines, each valid EMF in the default namespace: every lock's together
    // (dimensionless: the alarms'), then one per lock that lost slots.
    let emf: Vec<Value> = result
        .emf
        .iter()
        .map(|line| {
            assert!(!line.contains('\n'));
            check_emf(line).unwrap_or_else(|e| panic!("{e}: {line}"))
        })
        .collect();
    assert_eq!(emf.len(), 3, "{emf:#?}");
    assert_eq!(emf[0]["ReclaimedSlots"], json!(3));
    assert_eq!(emf[0]["LargestItemBytes"], json!(demo_bytes));
    assert_eq!(emf[0]["OldestWaiterAge"], json!(0), "nobody waits");
    assert_eq!(
        emf[0]["_aws"]["CloudWatchMetrics"],
        json!([{
            "Namespace": "StepFunctionsSemaphore",
            "Dimensions": [[]],
            "Metrics": [
                {"Name": "ReclaimedSlots", "Unit": "Count"},
                {"Name": "LargestItemBytes", "Unit": "Bytes"},
                {"Name": "OldestWaiterAge", "Unit": "Seconds"},
                {"Name": "SlotsNotJudged", "Unit": "Count"}
            ]
        }])
    );
    assert_eq!(emf[0]["SlotsNotJudged"], json!(0));
    for line in &emf {
        let stamp = line["_aws"]["Timestamp"]
            .as_u64()
            .expect("a millisecond timestamp");
        assert!(stamp >= before_sweep && stamp <= now_ms(), "{stamp}");
    }
    let per_lock: BTreeMap<&str, &Value> = emf[1..]
        .iter()
        .map(|line| (line["Lock"].as_str().expect("a Lock dimension"), line))
        .collect();
    assert_eq!(per_lock["demo-lock"]["ReclaimedSlots"], json!(2));
    assert_eq!(per_lock["orders"]["ReclaimedSlots"], json!(1));
    assert_eq!(
        per_lock["orders"]["_aws"]["CloudWatchMetrics"][0]["Dimensions"],
        json!([["Lock"]])
    );

    // The notices, as delivered through SNS to the subscribed queue.
    let envelopes = local.notices(3, Duration::from_secs(10)).await;
    assert_eq!(envelopes.len(), 3, "{envelopes:#?}");
    let mut notices: Vec<(Value, Notice)> = envelopes
        .into_iter()
        .map(|envelope| {
            let notice: Notice =
                serde_json::from_str(envelope["Message"].as_str().expect("a message"))
                    .expect("the message is a notice");
            (envelope, notice)
        })
        .collect();
    notices.sort_by(|a, b| (&a.1.lock, a.1.token).cmp(&(&b.1.lock, b.1.token)));
    // Each lock's TimeHeld values are its notices' held_for_ms.
    for (lock, line) in &per_lock {
        let mut metric: Vec<u64> = match &line["TimeHeld"] {
            Value::Array(values) => values.iter().map(|v| v.as_u64().unwrap()).collect(),
            one => vec![one.as_u64().expect("TimeHeld")],
        };
        let mut held: Vec<u64> = notices
            .iter()
            .filter(|(_, n)| n.lock == *lock)
            .map(|(_, n)| n.held_for_ms)
            .collect();
        metric.sort_unstable();
        held.sort_unstable();
        assert_eq!(metric, held, "{lock}");
    }
    let expect = [
        (
            "demo-lock",
            &aborted,
            "a1",
            aborted_token,
            "execution status is ABORTED",
        ),
        (
            "demo-lock",
            &missing,
            "m1",
            missing_token,
            "execution does not exist",
        ),
        (
            "orders",
            &aborted,
            "o1",
            orders_token,
            "execution status is ABORTED",
        ),
    ];
    for ((envelope, notice), (lock, holder, acquisition, token, reason)) in
        notices.iter().zip(expect)
    {
        assert_eq!(envelope["Type"], json!("Notification"));
        assert_eq!(envelope["TopicArn"], json!(local.topic_arn));
        assert_eq!(
            envelope["Subject"],
            json!(format!("Semaphore slot reclaimed: {lock}"))
        );
        // Every field of the message, as JSON (no field more, none less).
        let message: Value = serde_json::from_str(envelope["Message"].as_str().unwrap()).unwrap();
        assert_eq!(
            message.as_object().unwrap().keys().collect::<Vec<_>>(),
            [
                "acquisition",
                "held_for",
                "held_for_ms",
                "holder",
                "kind",
                "lock",
                "reason",
                "swept_at",
                "token"
            ]
        );
        assert_eq!(message["kind"], "execution_ended");
        assert_eq!(notice.lock, lock);
        assert_eq!(&notice.holder, holder);
        assert_eq!(notice.acquisition, acquisition);
        assert_eq!(notice.token, token);
        assert_eq!(notice.reason, reason);
        assert!(
            notice.held_for_ms < MISSING_EXECUTION_GRACE_MS + 60_000,
            "{}",
            notice.held_for_ms
        );
        assert_eq!(
            notice.held_for,
            lambda_sweeper::human_duration(notice.held_for_ms)
        );
        assert_eq!(notice.swept_at.len(), "2024-01-01T00:00:00.000Z".len());
        assert!(
            notice.swept_at.starts_with("20") && notice.swept_at.ends_with('Z'),
            "{}",
            notice.swept_at
        );
        assert_eq!(
            notice,
            &result
                .notices
                .iter()
                .find(|n| n == &notice)
                .cloned()
                .unwrap()
        );
    }

    // A second sweep (through the handler, as the schedule invokes it) finds nothing more.
    let again = lambda_sweeper::handle(
        &sweeper,
        LambdaEvent::new(json!({"source": "aws.events"}), Context::default()),
    )
    .await
    .expect("the second sweep");
    assert_eq!(again.reclaimed, 0);
    assert_eq!(again.notices_published, 0);
    assert_eq!(again.holders_checked, 3);
    assert!(again.errors.is_empty(), "{:?}", again.errors);
    assert!(
        local.notices(1, Duration::from_secs(2)).await.is_empty(),
        "no new notice"
    );
    assert_eq!(local.status(&running).await, "RUNNING");
}

/// F11: DescribeExecution is eventually consistent, so "does not exist" right after an execution
/// started (and acquired) may be a stale read. A holder that acquired within
/// MISSING_EXECUTION_GRACE_MS is kept, neither fenced nor freed; one older is reclaimed; the
/// young one is reclaimed by a sweep once the grace has passed.
#[tokio::test]
async fn a_holder_not_found_is_kept_within_the_grace_period_and_reclaimed_after() {
    let local = local().await;
    let not_found = |name: &str| {
        format!(
            "arn:aws:states:{ACCOUNT_REGION}:execution:{}:{name}",
            local.machine_name
        )
    };
    let (young, old) = (not_found("just-started"), not_found("long-gone"));
    let table = fresh_table().await.table().to_owned();
    let clock = Arc::new(ManualClock::new(now_ms()));
    let mut sweeper = local.sweeper(&table);
    sweeper.semaphore = sweeper.semaphore.clone().with_clock(clock.clone());
    let sem = &sweeper.semaphore;
    take(sem, "demo-lock", &old, "o1").await;
    clock.advance_ms(MISSING_EXECUTION_GRACE_MS);
    take(sem, "demo-lock", &young, "y1").await;
    let lock = LockName::new("demo-lock").unwrap();

    let first = sweeper.sweep().await.expect("the sweep");
    assert_eq!(first.summary.holders_checked, 2);
    assert_eq!(first.summary.reclaimed, 1);
    assert_eq!(first.summary.kept_not_found, 1);
    assert!(
        first.summary.errors.is_empty(),
        "{:?}",
        first.summary.errors
    );
    let held: Vec<String> = sem
        .status(&lock)
        .await
        .unwrap()
        .holders
        .keys()
        .map(|i| i.holder.to_string())
        .collect();
    assert_eq!(held, std::slice::from_ref(&young));
    // Kept means not fenced either: its next acquire (a retry, another lock) still lands.
    assert!(matches!(
        sem.acquire(&lock, &id(&young, "y2"), Limit::new(10).unwrap())
            .await
            .unwrap(),
        AcquireOutcome::Acquired { .. }
    ));

    // One millisecond short of the grace: still kept.
    clock.advance_ms(MISSING_EXECUTION_GRACE_MS - 1);
    let second = sweeper.sweep().await.expect("the sweep");
    assert_eq!(
        (second.summary.reclaimed, second.summary.kept_not_found),
        (0, 1)
    );
    // Past it (y2, taken a moment after y1, with it): both its slots go, and it is fenced.
    clock.advance_ms(1_000);
    let third = sweeper.sweep().await.expect("the sweep");
    assert_eq!(
        (third.summary.reclaimed, third.summary.kept_not_found),
        (2, 0)
    );
    assert_eq!(sem.status(&lock).await.unwrap().count(), 0);
    assert_eq!(
        sem.acquire(&lock, &id(&young, "y3"), Limit::new(10).unwrap())
            .await
            .unwrap(),
        AcquireOutcome::Fenced(FenceReason::ExecutionEnded)
    );
}

#[tokio::test]
async fn every_sweep_emits_the_metric_even_when_nothing_leaked() {
    let local = local().await;
    let table = fresh_table().await.table().to_owned();
    let sweeper = local.sweeper(&table);
    let result = sweeper.sweep().await.unwrap();
    assert_eq!(
        result.summary,
        lambda_sweeper::SweepSummary {
            pages: 1,
            ..Default::default()
        },
        "an empty table is one page"
    );
    assert_eq!(result.emf.len(), 1, "{:?}", result.emf);
    let emf = check_emf(&result.emf[0]).unwrap();
    assert_eq!(emf["ReclaimedSlots"], json!(0));
    assert_eq!(emf["LargestItemBytes"], json!(0));
    assert_eq!(emf["OldestWaiterAge"], json!(0));
}

#[tokio::test]
async fn what_cannot_be_checked_or_announced_is_reported_without_failing_the_sweep() {
    let local = local().await;
    let table = fresh_table().await.table().to_owned();
    // No PROTECTED_STATE_MACHINES: every standard execution ARN is described. The topic is missing.
    let vars = BTreeMap::from([
        ("TABLE_NAME", table.clone()),
        (
            "TOPIC_ARN",
            "arn:aws:sns:us-east-1:123456789012:no-such-topic".to_owned(),
        ),
    ]);
    let settings = Settings::from_lookup(move |name| vars.get(name).cloned());
    let sweeper = Sweeper::from_settings(&settings, &sdk_config()).unwrap();
    let gone = format!(
        "arn:aws:states:{ACCOUNT_REGION}:execution:{}:never-started",
        local.machine_name
    );
    // An execution of another region cannot be checked from here: kept and reported.
    let unknown = "arn:aws:states:eu-west-1:123456789012:execution:LockProtected:run-1";
    take_past_grace(&sweeper.semaphore, "demo-lock", &gone, "g1").await;
    take(&sweeper.semaphore, "demo-lock", unknown, "u1").await;

    let result = sweeper.sweep().await.unwrap();
    // Reclaimed although its notice could not be published: the metric still counts it.
    assert_eq!(result.summary.holders_checked, 2);
    assert_eq!(result.summary.reclaimed, 1);
    assert_eq!(result.summary.notices_published, 0);
    assert_eq!(
        result.summary.errors.len(),
        2,
        "{:?}",
        result.summary.errors
    );
    assert!(
        result.summary.errors[0].starts_with(&format!(
            "{unknown}: an execution in region eu-west-1, and this sweeper runs in us-east-1"
        )),
        "{:?}",
        result.summary.errors
    );
    assert!(
        result.summary.errors[1]
            .starts_with(&format!("notice for {gone} on demo-lock not published: ")),
        "{:?}",
        result.summary.errors
    );
    let emf = check_emf(&result.emf[0]).unwrap();
    assert_eq!(emf["ReclaimedSlots"], json!(1));
    let left = sweeper
        .semaphore
        .status(&LockName::new("demo-lock").unwrap())
        .await
        .unwrap();
    assert_eq!(
        left.holders.keys().cloned().collect::<Vec<_>>(),
        [id(unknown, "u1")]
    );
}

/// A sweep reads the table once (one `Scan`) and reclaims through the same cleanup as the
/// cleanup function: per ended execution one write that fences it and one that frees the slots
/// the fence's answer showed. No read per holder, no conflict.
#[tokio::test]
async fn a_sweep_reads_the_table_once_and_reclaims_with_two_writes_per_ended_execution() {
    let local = local().await;
    let table = fresh_table().await.table().to_owned();
    let counter = RequestCounter::new();
    let mut sweeper = local.sweeper(&table);
    sweeper.semaphore = Semaphore::new(DynamoStore::new(
        counter.dynamodb_client(endpoint()),
        &table,
    ))
    .with_timing(sweeper.semaphore.timing());
    let running = local.start("running").await;
    let missing = |name: &str| {
        format!(
            "arn:aws:states:{ACCOUNT_REGION}:execution:{}:{name}",
            local.machine_name
        )
    };
    let sem = &sweeper.semaphore;
    take(sem, "demo-lock", &running, "r1").await;
    take_past_grace(sem, "demo-lock", &missing("gone-1"), "x1").await;
    take_past_grace(sem, "demo-lock", &missing("gone-1"), "x2").await;
    take_past_grace(sem, "demo-lock", &missing("gone-2"), "y1").await;
    counter.take();

    let result = sweeper.sweep().await.unwrap();
    assert_eq!(result.summary.reclaimed, 3);
    assert!(
        result.summary.errors.is_empty(),
        "{:?}",
        result.summary.errors
    );
    let sent = counter.take();
    assert_eq!(
        sent.requests,
        BTreeMap::from([
            ("DynamoDB.Scan".to_owned(), 1),
            // gone-1: fence, free both slots; gone-2: fence, free. (The lock had no fence when
            // it was scanned: nothing to rotate.)
            ("DynamoDB.UpdateItem".to_owned(), 4),
        ])
    );
    assert_eq!(sent.total_failed(), 0);
    let left = sem
        .status(&LockName::new("demo-lock").unwrap())
        .await
        .unwrap();
    assert_eq!(
        left.holders.keys().cloned().collect::<Vec<_>>(),
        [id(&running, "r1")]
    );
}

/// A lock that went quiet gets no release or cleanup busy enough to rotate its fences: the sweeps
/// rotate whatever is due, at most once a window, so its fences are gone a window after the first
/// sweep that finds them.
#[tokio::test]
async fn sweeps_rotate_the_fences_of_a_lock_that_went_quiet() {
    let local = local().await;
    let table = fresh_table().await.table().to_owned();
    let clock = Arc::new(ManualClock::new(now_ms()));
    let mut sweeper = local.sweeper(&table);
    sweeper.semaphore = sweeper.semaphore.clone().with_clock(clock.clone());
    let sem = &sweeper.semaphore;
    let window = u64::try_from(sem.timing().window().as_millis()).unwrap();
    let quiet = LockName::new("quiet").unwrap();
    let fences = || async { sem.status(&quiet).await.unwrap().fences };

    // The lock's last writes: a release and a cleanup, two young fences (too few for a writer
    // to rotate them).
    sem.release(&quiet, &id("operator-1", "r1"), Claim::Operator)
        .await
        .unwrap();
    sem.cleanup(&quiet, &HolderId::new("operator-2").unwrap())
        .await
        .unwrap();
    let before = fences().await;
    assert_eq!((before.young.len(), before.rotated_at_ms), (2, None));

    let sweep = || async {
        let summary = sweeper.sweep().await.unwrap().summary;
        assert_eq!((summary.reclaimed, summary.errors.len()), (0, 0));
    };
    sweep().await;
    let first = fences().await;
    assert_eq!(
        (first.young.len(), first.old.len()),
        (0, 2),
        "the first sweep rotates them: kept, now old"
    );
    clock.advance_ms(window - 1);
    sweep().await;
    assert_eq!(
        fences().await.len(),
        2,
        "less than a window since that rotation"
    );
    clock.advance_ms(1);
    sweep().await;
    assert!(
        fences().await.is_empty(),
        "a window later the next sweep drops them"
    );
}

/// An item of a format this version does not read: the sweep names it in its errors, leaves it
/// exactly as it is (its holders are not judged), and sweeps every other lock.
#[tokio::test]
async fn an_item_of_a_foreign_format_is_reported_and_left_alone_and_the_other_locks_are_swept() {
    let local = local().await;
    let table = fresh_table().await.table().to_owned();
    let sweeper = local.sweeper(&table);
    let sem = &sweeper.semaphore;
    let gone = format!(
        "arn:aws:states:{ACCOUNT_REGION}:execution:{}:never-started",
        local.machine_name
    );
    let foreign = put_foreign_item(
        sem.store().client(),
        &table,
        "old-lock",
        &gone,
        "g0",
        Some(FOREIGN_FORMAT),
    )
    .await;
    take_past_grace(sem, "demo-lock", &gone, "g1").await;

    let summary = sweeper.sweep().await.unwrap().summary;
    assert_eq!(summary.locks, 2);
    assert_eq!(summary.largest_item_lock.as_deref(), Some("demo-lock"));
    assert_eq!(summary.holders_checked, 1);
    assert_eq!(summary.reclaimed, 1);
    assert_eq!(summary.errors.len(), 1, "{:?}", summary.errors);
    assert!(
        summary.errors[0].starts_with("the item for lock \"old-lock\" is in format 99"),
        "{:?}",
        summary.errors
    );
    assert_eq!(
        raw_item(sem.store().client(), &table, "old-lock").await,
        Some(foreign)
    );
    let demo = sem
        .status(&LockName::new("demo-lock").unwrap())
        .await
        .unwrap();
    assert_eq!(demo.count(), 0);
}

/// An execution that ended while the work it ran under its slot (a child execution: here the
/// work-function runner, whose Lambda function cannot be stopped) still runs keeps the slot: the
/// work is protected by it. The sweeper reads the ended holder's history for its children (and
/// only an ended holder's), and reclaims the slot by the first sweep after the work ended.
#[tokio::test]
async fn an_ended_holder_keeps_its_slot_while_its_work_runs_and_loses_it_after() {
    let local = local().await;
    let sfn = &local.sfn;
    let runner = create_machine(
        sfn,
        &unique("WorkFunction"),
        &json!({"StartAt": "Invoke", "States": {"Invoke": {"Type": "Wait", "Seconds": 600, "End": true}}}),
    )
    .await;
    let parent_machine = create_machine(
        sfn,
        &unique("Protected"),
        &json!({
            "StartAt": "Protected work",
            "States": {
                "Protected work": {
                    "Type": "Task",
                    "Resource": "arn:aws:states:::states:startExecution.sync:2",
                    "Parameters": {"StateMachineArn.$": "$.machine", "Name.$": "$.name", "Input": {}},
                    "End": true
                }
            }
        }),
    )
    .await;
    let name = unique("work");
    let (parent, child) = end_parent_while_child_runs(
        sfn,
        &parent_machine,
        &json!({"machine": runner, "name": name}),
        &runner,
        &name,
    )
    .await;

    // Both machines judged (the list form of the setting), Step Functions calls counted.
    let table = fresh_table().await.table().to_owned();
    let vars = BTreeMap::from([
        ("TABLE_NAME", table.clone()),
        ("TOPIC_ARN", local.topic_arn.clone()),
        (
            "PROTECTED_STATE_MACHINES",
            format!("{}, {parent_machine}", local.machine_arn),
        ),
    ]);
    let settings = Settings::from_lookup(move |name| vars.get(name).cloned());
    let mut sweeper = Sweeper::from_settings(&settings, &sdk_config()).expect("settings");
    let (counter, executions) =
        counted_executions(&format!("{},{parent_machine}", local.machine_arn));
    sweeper.executions = executions;
    let token = take(&sweeper.semaphore, "demo-lock", &parent, "r0").await;

    let kept = sweeper.sweep().await.unwrap().summary;
    assert_eq!(
        (kept.holders_checked, kept.reclaimed, kept.errors.len()),
        (1, 0, 0),
        "{kept:?}"
    );
    assert_eq!(
        counter.take().requests,
        BTreeMap::from([
            // The parent, then its child.
            ("SFN.DescribeExecution".to_owned(), 2),
            ("SFN.GetExecutionHistory".to_owned(), 1),
        ])
    );
    let held = sweeper
        .semaphore
        .status(&LockName::new("demo-lock").unwrap())
        .await
        .unwrap();
    assert_eq!(
        held.holders.keys().cloned().collect::<Vec<_>>(),
        [id(&parent, "r0")]
    );
    assert_eq!(status(sfn, &child).await.as_deref(), Some("RUNNING"));

    // The Lambda function returns: the runner's execution ends.
    stop(sfn, &child).await;
    ended(sfn, &child).await;
    let result = sweeper.sweep().await.unwrap();
    assert_eq!(
        (result.summary.reclaimed, result.summary.notices_published),
        (1, 1),
        "{:?}",
        result.summary
    );
    let notice = &result.notices[0];
    assert_eq!(
        (notice.holder.as_str(), notice.token),
        (parent.as_str(), token)
    );
    let parent_status = status(sfn, &parent).await.unwrap();
    assert_eq!(
        notice.reason,
        format!("execution status is {parent_status}")
    );
    let envelopes = local.notices(1, Duration::from_secs(10)).await;
    assert_eq!(envelopes.len(), 1, "{envelopes:#?}");
    // A later sweep, like a late or duplicated event, finds nothing more.
    assert_eq!(sweeper.sweep().await.unwrap().summary.reclaimed, 0);
}

#[test]
fn a_missing_topic_or_a_bad_state_machine_arn_stops_the_cold_start() {
    let build = |vars: &[(&'static str, &'static str)]| {
        let vars: BTreeMap<&str, String> =
            vars.iter().map(|(k, v)| (*k, (*v).to_owned())).collect();
        let settings = Settings::from_lookup(move |name| vars.get(name).cloned());
        Sweeper::from_settings(&settings, &sdk_config()).map(|_| ())
    };
    assert_eq!(
        build(&[("TABLE_NAME", "t")]).unwrap_err().to_string(),
        "environment variable TOPIC_ARN is not set: set it to the ARN of the SNS topic that gets a \
         notice per reclaimed slot"
    );
    assert_eq!(
        build(&[("TOPIC_ARN", "arn:aws:sns:us-east-1:123456789012:t")])
            .unwrap_err()
            .to_string(),
        "environment variable TABLE_NAME is not set: set it to the semaphore table's name \
         (template.yaml sets it for every function)"
    );
    let err = build(&[
        ("TABLE_NAME", "t"),
        ("TOPIC_ARN", "arn:aws:sns:us-east-1:123456789012:t"),
        (
            "PROTECTED_STATE_MACHINES",
            "arn:aws:states:us-east-1:123456789012:stateMachine:A, B*",
        ),
    ])
    .unwrap_err();
    assert!(
        err.to_string()
            .starts_with("environment variable PROTECTED_STATE_MACHINES is \"arn:aws:states:us-east-1:123456789012:stateMachine:A, B*\": \"B*\" is not an ARN"),
        "{err}"
    );
}

/// F8 for the lines, with a lost status event: the holder of a full lock and the first waiter
/// in its line were both stopped, and no cleanup ran for either. One sweep reclaims the slot,
/// takes the dead waiter out of line (DescribeExecution: ABORTED), and hands the slot to the
/// live waiter behind it, whose parked execution (a real task token) goes on with the granted
/// answer. The lines are read from the sweep's one Scan.
#[tokio::test]
async fn a_sweep_takes_dead_waiters_out_of_line_and_wakes_the_next_live_one_with_the_slot() {
    let local = local().await;
    let sfn = &local.sfn;
    let definition = local_aws::asl::definition("lock-protected.asl.json");
    let parking = create_machine(
        sfn,
        &unique("Parking"),
        &parking_machine(&definition, local_aws::asl::ACQUIRE_STATE, [300, 300]),
    )
    .await;
    let table = fresh_table().await.table().to_owned();
    let vars = BTreeMap::from([
        ("TABLE_NAME", table.clone()),
        ("TOPIC_ARN", local.topic_arn.clone()),
        (
            "PROTECTED_STATE_MACHINES",
            format!("{},{parking}", local.machine_arn),
        ),
    ]);
    let settings = Settings::from_lookup(move |name| vars.get(name).cloned());
    let mut sweeper = Sweeper::from_settings(&settings, &sdk_config()).unwrap();
    let counter = RequestCounter::new();
    sweeper.semaphore = Semaphore::new(DynamoStore::new(
        counter.dynamodb_client(endpoint()),
        &table,
    ))
    .with_timing(sweeper.semaphore.timing());
    let sem = &sweeper.semaphore;
    let lock = LockName::new("lined").unwrap();
    let one = Limit::new(1).unwrap();

    let holder = local.start(&unique("holder")).await;
    let AcquireOutcome::Acquired { .. } =
        sem.acquire(&lock, &id(&holder, "r0"), one).await.unwrap()
    else {
        panic!("the first acquire takes the slot")
    };
    // Two executions wait in line, each parked on its acquire task's real token.
    let mut waiters = Vec::new();
    let mut places = Vec::new();
    for _ in 0..2 {
        let queued_at_ms = now_ms();
        places.push(queued_at_ms);
        let input = json!({"lock": "lined", "limit": 1});
        let parked = park(sfn, &parking, &unique("waiter"), &input).await;
        let wait = parked.next_acquire().await;
        let who = id(&parked.execution, "r0");
        let context = json!({"acquired": false, "outcome": "full", "token": null,
                             "lock": "lined", "holder": parked.execution});
        let waiter = Waiter::new(
            lock.clone(),
            who,
            Run::FIRST,
            one,
            queued_at_ms,
            TaskToken::new(wait["task_token"].as_str().unwrap()).unwrap(),
            Attempt::new(queued_at_ms, 0),
            context.to_string(),
        );
        assert_eq!(
            sem.enqueue(&waiter, sem.now_ms()).await.unwrap(),
            QueueOutcome::Queued
        );
        waiters.push(parked);
    }
    let (dead, live) = (&waiters[0], &waiters[1]);
    local.stop(&holder).await;
    stop(sfn, &dead.execution).await;
    assert_eq!(ended(sfn, &dead.execution).await, "ABORTED");
    counter.take();

    let before_sweep = now_ms();
    let result = sweeper.sweep().await.unwrap();
    let summary = result.summary.clone();
    // The metrics: the live waiter is the oldest left in line (the dead one, ahead of it, was
    // taken out), and the slot was handed to it.
    let emf: Vec<Value> = result.emf.iter().map(|l| check_emf(l).unwrap()).collect();
    let stamp = emf[0]["_aws"]["Timestamp"].as_u64().unwrap();
    assert!(stamp >= before_sweep, "{stamp}");
    let live_age = stamp - places[1];
    let seconds = |v: &Value| (v.as_f64().expect("a number") * 1000.0).round() as u64;
    assert_eq!(seconds(&emf[0]["OldestWaiterAge"]), live_age, "{emf:#?}");
    assert_eq!(emf[0]["ReclaimedSlots"], json!(1));
    let lined = &emf[1];
    assert_eq!(lined["Lock"], json!("lined"));
    assert_eq!(seconds(&lined["OldestWaiterAge"]), live_age);
    assert_eq!(lined["ReclaimedSlots"], json!(1));
    assert_eq!(lined["DeadWaitersRemoved"], json!(1));
    let granted = &emf[2];
    assert_eq!(
        (
            &granted["Lock"],
            &granted["Outcome"],
            &granted["Acquisitions"]
        ),
        (&json!("lined"), &json!("granted"), &json!(1)),
        "{granted}"
    );
    // Granted after the sweep began, so it waited at least as long as the sweep saw it wait.
    let waited = granted["WaitTime"].as_u64().unwrap();
    assert!(
        waited >= live_age && waited < live_age + 60_000,
        "{waited} {live_age}"
    );
    let latency = granted["HandOffLatency"].as_u64().unwrap();
    assert!(latency < 60_000, "{latency}");
    assert_eq!(
        (
            &granted["WeightUsed"],
            &granted["Limit"],
            &granted["Waiting"]
        ),
        (&json!(1), &json!(1), &json!(0))
    );
    assert_eq!(emf.len(), 3, "{emf:#?}");
    assert_eq!(
        (
            summary.reclaimed,
            summary.waiters_checked,
            summary.waiters_removed,
            summary.woken
        ),
        (1, 2, 1, 1),
        "{summary:?}"
    );
    assert!(summary.errors.is_empty(), "{:?}", summary.errors);
    assert_eq!(
        counter.take().requests.get("DynamoDB.Scan"),
        Some(&1),
        "one read of the table, for the holders and the lines"
    );
    let item = sem.status(&lock).await.unwrap();
    let token = item.holders[&id(&live.execution, "r0")].token;
    assert_eq!((item.count(), item.waiting), (1, 0));
    assert_eq!(ended(sfn, &live.execution).await, "SUCCEEDED");
    let (_, output) = described(sfn, &live.execution).await;
    let granted = &output.unwrap()["semaphore"];
    assert_eq!(
        (&granted["acquired"], &granted["outcome"], &granted["token"]),
        (&json!(true), &json!("acquired"), &json!(token.0)),
        "{granted}"
    );
    let store = sem.store();
    assert_consistent(
        store.client(),
        store.table(),
        store.queue_table(),
        "lined",
        1,
    )
    .await;
}

/// F13: a holder that is not an execution (a worker under a lease of 1 s) stops renewing; the
/// sweep after its lease and the clock skew (1 s) takes the slot back, fences it, publishes a
/// `lease_passed` notice naming it and writes `LeasesTakenBack` for its lock. The unleased
/// holder beside it is not the lease's to take.
#[tokio::test]
async fn a_lapsed_lease_is_taken_back_announced_and_counted() {
    let local = local().await;
    let table = fresh_table().await.table().to_owned();
    let vars = BTreeMap::from([
        ("TABLE_NAME", table.clone()),
        ("TOPIC_ARN", local.topic_arn.clone()),
        ("PROTECTED_STATE_MACHINES", local.machine_arn.clone()),
        ("CLOCK_SKEW_SECONDS", "1".to_owned()),
    ]);
    let settings = Settings::from_lookup(move |name| vars.get(name).cloned());
    let sweeper = Sweeper::from_settings(&settings, &sdk_config()).expect("settings");
    let lock = LockName::new("leased-work").unwrap();
    let leased =
        semaphore_core::Terms::new(Limit::new(2).unwrap(), semaphore_core::Weight::ONE, None)
            .unwrap()
            .with_lease(Some(semaphore_core::Lease::ms(1_000).unwrap()));
    let AcquireOutcome::Acquired { token, .. } = sweeper
        .semaphore
        .acquire(&lock, &id("worker-7", "a1"), leased)
        .await
        .unwrap()
    else {
        panic!("a free lock")
    };
    let running = local.start(&unique("running")).await;
    sweeper
        .semaphore
        .acquire(&lock, &id(&running, "a1"), Limit::new(2).unwrap())
        .await
        .unwrap();
    let early = sweeper.sweep().await.unwrap();
    assert_eq!(early.summary.taken_back, 0, "within its lease");
    tokio::time::sleep(Duration::from_millis(2_200)).await;
    let result = sweeper.sweep().await.unwrap();
    assert_eq!(result.summary.taken_back, 1, "{:?}", result.summary);
    assert_eq!(result.summary.reclaimed, 0);
    assert_eq!(result.summary.notices_published, 1, "{:?}", result.summary);
    let item = sweeper.semaphore.status(&lock).await.unwrap();
    assert_eq!(
        item.holders
            .keys()
            .map(|i| i.holder.to_string())
            .collect::<Vec<_>>(),
        vec![running.clone()]
    );
    assert_eq!(
        sweeper
            .semaphore
            .heartbeat(
                &lock,
                &id("worker-7", "a1"),
                Claim::Operator,
                semaphore_core::Lease::ms(1_000).unwrap()
            )
            .await
            .unwrap(),
        semaphore_core::HeartbeatOutcome::Lost,
        "taken back, the acquisition is fenced"
    );
    let notices = local.notices(1, Duration::from_secs(10)).await;
    assert_eq!(notices.len(), 1, "{notices:?}");
    let message: Value = serde_json::from_str(notices[0]["Message"].as_str().unwrap()).unwrap();
    assert_eq!(message["kind"], "lease_passed");
    assert_eq!(message["lock"], "leased-work");
    assert_eq!(message["holder"], "worker-7");
    assert_eq!(message["token"], json!(token.0));
    assert!(
        message["reason"]
            .as_str()
            .unwrap()
            .starts_with("its lease ended at "),
        "{message}"
    );
    let line = result
        .emf
        .iter()
        .map(|line| check_emf(line).unwrap())
        .find(|emf| emf["Lock"] == "leased-work")
        .expect("a line for the lock");
    assert_eq!(line["LeasesTakenBack"], json!(1));
    local.stop(&running).await;
}

/// A machine with many holders is asked once for its running executions (`ListExecutions`),
/// not once per holder: only the holders it does not list running are described, and only
/// those that ended are reclaimed. (DescribeExecution's quota, 10-15 a second for the account,
/// would make a sweep of 10,000 holders last over ten minutes.)
#[tokio::test]
async fn many_holders_of_one_machine_are_checked_with_one_listing_and_the_ended_described() {
    let local = local().await;
    let mut sweeper = local.sweeper(fresh_table().await.table());
    let (counter, executions) = counted_executions(&local.machine_arn);
    sweeper.executions = executions;
    let holders = LIST_ABOVE_HOLDERS * 2 + 5;
    let lock = LockName::new("wide-lock").unwrap();
    let mut executions = Vec::new();
    for n in 0..holders {
        let execution = local.start(&format!("holder-{n}")).await;
        let taken = sweeper
            .semaphore
            .acquire(&lock, &id(&execution, "r0"), Limit::new(100).unwrap())
            .await
            .unwrap();
        assert!(
            matches!(taken, AcquireOutcome::Acquired { .. }),
            "{taken:?}"
        );
        executions.push(execution);
    }
    let ended = [3, 11, 20];
    for n in ended {
        local.stop(&executions[n]).await;
    }
    counter.take();

    let swept = sweeper.sweep().await.unwrap().summary;
    assert_eq!(
        (swept.holders_checked, swept.reclaimed, swept.errors.len()),
        (holders, ended.len(), 0),
        "{swept:?}"
    );
    let calls = counter.take().requests;
    assert_eq!(calls.get("SFN.ListExecutions"), Some(&1), "{calls:?}");
    assert_eq!(
        calls.get("SFN.DescribeExecution"),
        Some(&(ended.len() as u64)),
        "only the holders not listed running are described: {calls:?}"
    );
    let held = sweeper.semaphore.status(&lock).await.unwrap();
    let mut left: Vec<String> = held.holders.keys().map(|i| i.holder.to_string()).collect();
    left.sort();
    let mut running: Vec<String> = executions
        .iter()
        .enumerate()
        .filter(|(n, _)| !ended.contains(n))
        .map(|(_, e)| e.clone())
        .collect();
    running.sort();
    assert_eq!(left, running, "the running holders keep their slots");
}

/// Canned, and only here: an execution whose history is too long to judge cannot be made on
/// AWS (a standard execution fails at 25,000 events; the adapter's bound is shown against a
/// canned history in `crates/lambda-cleanup/tests/long_history.rs`), so the adapter's answer
/// is: ended, not judged. The slot is kept, and said so by name every sweep: a `not_judged`
/// notice naming the slot and why, and `SlotsNotJudged` in every lock's metric line.
#[tokio::test]
async fn a_holder_that_cannot_be_judged_keeps_its_slot_and_is_announced() {
    struct TooLong;
    const WHY: &str = "the history of it is too long to judge: 25000 events read in 25 pages";
    impl ExecutionStatus for TooLong {
        async fn describe(&self, _: &HolderId) -> Result<ExecutionState, PortError> {
            Ok(ExecutionState::Unjudged {
                status: "FAILED".to_owned(),
                why: WHY.to_owned(),
            })
        }
    }
    let local = local().await;
    let table = fresh_table().await.table().to_owned();
    let plain = local.sweeper(&table);
    let sweeper = Sweeper {
        semaphore: plain.semaphore,
        executions: TooLong,
        sns: plain.sns,
        topic_arn: plain.topic_arn,
        waker: plain.waker,
        metrics: plain.metrics,
    };
    let holder = format!(
        "{}:long-one",
        local.machine_arn.replace(":stateMachine:", ":execution:")
    );
    let token = take(&sweeper.semaphore, "judged-lock", &holder, "r0").await;
    for _ in 0..2 {
        let result = sweeper.sweep().await.unwrap();
        assert_eq!(result.summary.not_judged, 1, "{:?}", result.summary);
        assert_eq!(result.summary.reclaimed, 0);
        assert_eq!(result.summary.notices_published, 1);
        assert_eq!(
            result.notices[0].subject(),
            "Semaphore slot not judged: judged-lock"
        );
        let every_lock = check_emf(&result.emf[0]).unwrap();
        assert_eq!(every_lock["SlotsNotJudged"], json!(1));
        let notices = local.notices(1, Duration::from_secs(10)).await;
        assert_eq!(notices.len(), 1, "{notices:?}");
        let message: Value = serde_json::from_str(notices[0]["Message"].as_str().unwrap()).unwrap();
        assert_eq!(message["kind"], "not_judged");
        assert_eq!(message["lock"], "judged-lock");
        assert_eq!(message["holder"], json!(holder));
        assert_eq!(message["acquisition"], "r0");
        assert_eq!(message["token"], json!(token));
        assert_eq!(message["reason"], WHY);
        // Kept.
        let item = sweeper
            .semaphore
            .status(&LockName::new("judged-lock").unwrap())
            .await
            .unwrap();
        assert_eq!(item.count(), 1);
    }
}
