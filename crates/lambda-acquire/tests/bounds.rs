//! F15: every number or string of an acquire payload that sizes a write, an allocation or a loop
//! has a bound, and past it the acquire function answers `SemaphoreInvalidInput` with nothing
//! written. The redrive count is the run whose fences a cleanup or a redriven run's release
//! writes later (one per run up to it), so it is bounded by Step Functions' history
//! (`Run::MAX`); the others by the limits in `semaphore_core::input` and the acquire's own
//! (`Waiting::MAX_POLL_SECONDS`, the lease's day). Each payload is sent to the real function
//! code against the local server, and all three tables are read raw before and after.

use lambda_acquire::Config;
use lambda_common::Settings;
use lambda_runtime::{Context, Diagnostic, LambdaEvent};
use local_aws::names::{id, limit, lock};
use local_aws::observe::raw_tables;
use local_aws::{fresh_table, sdk_config};
use semaphore_core::flow::acquire::Waiting;
use semaphore_core::input::{
    MAX_HOLDER_BYTES, MAX_LIMIT, MAX_LOCK_NAME_BYTES, MAX_TASK_TOKEN_BYTES,
};
use semaphore_core::{rfc3339_millis, DynamoStore, Run, Semaphore};
use serde_json::{json, Value};

const HOLDER: &str = "arn:aws:states:us-east-1:123456789012:execution:LockProtected:run-1";
/// The work the acquire function allows: every machine whose name begins with `team-`.
const TEAM: &str = "arn:aws:states:us-east-1:123456789012:stateMachine:team-*";

async fn acquire(sem: &Semaphore<DynamoStore>, payload: Value) -> Result<Value, Diagnostic> {
    let settings = Settings::from_lookup(|name| match name {
        "DEFAULT_LOCK" => Some("demo-lock".to_owned()),
        "DEFAULT_LIMIT" => Some("1".to_owned()),
        "WORK_STATE_MACHINES" => Some(TEAM.to_owned()),
        _ => None,
    });
    let config = Config::from_settings(&settings).expect("settings");
    let hand_offs = Settings::from_lookup(|_| None)
        .hand_offs(&sdk_config())
        .expect("settings");
    lambda_acquire::handle(
        sem,
        &config,
        &hand_offs,
        LambdaEvent::new(payload, Context::default()),
    )
    .await
    .map(|answer| serde_json::to_value(answer).expect("the answer serializes"))
    .map_err(Diagnostic::from)
}

#[tokio::test]
async fn a_number_or_string_past_its_bound_is_semaphore_invalid_input_and_writes_nothing() {
    let sem = Semaphore::new(fresh_table().await);
    // The lock is full (limit 1), so an acquire that went past parsing would queue, and its
    // redrive count would be its waiter's run.
    sem.acquire(&lock("demo-lock"), &id("another", "r0"), limit(1))
        .await
        .unwrap();
    let before = raw_tables(sem.store()).await;

    let entered = rfc3339_millis(sem.now_ms());
    // A standard execution's payload, as the acquire state renders it.
    let parked = json!({
        "request": {}, "execution": HOLDER, "redrive_count": 0,
        "state": {"EnteredTime": entered, "RetryCount": 0}, "task_token": "token-1"
    });
    // A poller's (no task token), under a lease.
    let mut polling = parked.clone();
    polling.as_object_mut().unwrap().remove("task_token");
    polling["request"] = json!({"lease": 60});
    let with = |base: &Value, path: &[&str], value: Value| {
        let mut payload = base.clone();
        let (last, parents) = path.split_last().unwrap();
        let mut at = &mut payload;
        for key in parents {
            at = &mut at[*key];
        }
        at[*last] = value;
        payload
    };
    let late = |run: u64| {
        format!(
            "redrive_count: run {run} is past the last run an execution can have (12499): Step \
             Functions stops redriving an execution before its history's 25,000 events"
        )
    };
    let not_a_count = |field: &str, source: &str, got: &str| {
        format!("{field} must be a whole number from 0 (Step Functions' {source}); got {got}")
    };
    let redrive = "$$.Execution.RedriveCount";
    let poll = |got: u64| {
        format!(
            "request.poll_seconds must be a whole number of seconds from 1 to 900 (how long the \
             caller's place in line is kept between two polls); got {got}"
        )
    };
    let lease = |got: &str| {
        format!(
            "request.lease: lease must be a number of seconds from 1 to 86400 (a day); got {got}"
        )
    };
    // The lock-protected machine's, which names the work to start.
    let starting = with(&parked, &["starts_work"], json!(true));
    let long_work = format!("{}{}", TEAM.trim_end_matches('*'), "w".repeat(100_000));
    let cases: Vec<(Value, String)> =
        vec![
        // The run of issue #37's crash, the first past the bound, and counts past a u32.
        (with(&parked, &["redrive_count"], json!(4_294_967_295u64)), late(4_294_967_295)),
        (
            with(&parked, &["redrive_count"], json!(Run::MAX.0 + 1)),
            late(12_500),
        ),
        (
            with(&parked, &["redrive_count"], json!(4_294_967_296u64)),
            not_a_count("redrive_count", redrive, "a number 4294967296"),
        ),
        (
            with(&parked, &["redrive_count"], json!(u64::MAX)),
            not_a_count("redrive_count", redrive, "a number 18446744073709551615"),
        ),
        (
            with(&parked, &["redrive_count"], json!(1e20)),
            not_a_count("redrive_count", redrive, "a number 1e+20"),
        ),
        (
            with(&parked, &["redrive_count"], json!("3")),
            not_a_count("redrive_count", redrive, "a string \"3\""),
        ),
        (
            with(&parked, &["state", "RetryCount"], json!(4_294_967_296u64)),
            not_a_count("state.RetryCount", "$$.State.RetryCount", "a number 4294967296"),
        ),
        (with(&polling, &["request", "poll_seconds"], json!(0)), poll(0)),
        (with(&polling, &["request", "poll_seconds"], json!(901)), poll(901)),
        (
            with(&polling, &["request", "poll_seconds"], json!(4_294_967_295u64)),
            poll(4_294_967_295),
        ),
        (
            with(&polling, &["request", "poll_seconds"], json!(4_294_967_296u64)),
            not_a_count("request.poll_seconds", "poll_seconds", "a number 4294967296"),
        ),
        (with(&polling, &["request", "lease"], json!(0)), lease("0")),
        (with(&polling, &["request", "lease"], json!(86_401)), lease("86401")),
        (
            with(&polling, &["request", "lease"], json!(u64::MAX)),
            lease("18446744073709551615"),
        ),
        (
            with(&parked, &["request", "limit"], json!(u64::from(MAX_LIMIT) + 1)),
            "request.limit: limit must be a whole number from 1 to 10000; got 10001".to_owned(),
        ),
        (
            with(&parked, &["request", "limit"], json!(u64::MAX)),
            "request.limit: limit must be a whole number from 1 to 10000; got \
             18446744073709551615"
                .to_owned(),
        ),
        (
            with(&parked, &["request", "weight"], json!(u64::from(u32::MAX) + 2)),
            "request.weight: weight must be a whole number from 1 to the limit (10000 at most); \
             got 4294967297"
                .to_owned(),
        ),
        (
            with(&parked, &["request", "rate"], json!(1e12)),
            "request.rate: rate must be a number of acquisitions per second from \
             0.000011574074074074073 (one a day) to 1000; got 1000000000000"
                .to_owned(),
        ),
        (
            with(&parked, &["request", "lock"], json!("l".repeat(MAX_LOCK_NAME_BYTES + 1))),
            "request.lock: lock name is 257 bytes long; the maximum is 256 bytes".to_owned(),
        ),
        (
            with(&parked, &["execution"], json!("h".repeat(MAX_HOLDER_BYTES + 1))),
            "holder is 513 bytes long; the maximum is 512 bytes".to_owned(),
        ),
        (
            with(&parked, &["task_token"], json!("t".repeat(MAX_TASK_TOKEN_BYTES + 1))),
            "task_token: task token is 2049 bytes long; the maximum is 2048 bytes".to_owned(),
        ),
        (
            with(&starting, &["request", "work"], json!(long_work)),
            format!(
                "request.work is {} bytes long; a state machine or Lambda function ARN is at \
                 most 256: name one this stack allows (state machines: {TEAM}; Lambda \
                 functions: none)",
                long_work.len()
            ),
        ),
    ];
    for (payload, message) in cases {
        let err = acquire(&sem, payload.clone()).await.expect_err("refused");
        let shown = payload.to_string();
        let shown = &shown[..shown.len().min(300)];
        assert_eq!(err.error_type, "SemaphoreInvalidInput", "{shown}");
        assert_eq!(err.error_message, message, "{shown}");
    }
    assert_eq!(raw_tables(sem.store()).await, before, "nothing was written");

    // At the bounds, each is accepted: the last run queues on the full lock, and a poller's
    // longest place and lease are taken.
    let last_run = with(&parked, &["redrive_count"], json!(Run::MAX.0));
    let queued = acquire(&sem, last_run).await.unwrap();
    assert_eq!(
        (&queued["outcome"], &queued["acquisition"]),
        (&json!("queued"), &json!("r12499"))
    );
    let longest = with(
        &polling,
        &["request"],
        json!({"poll_seconds": Waiting::MAX_POLL_SECONDS, "lease": 86_400}),
    );
    let longest = with(&longest, &["execution"], json!("a-script"));
    let err = acquire(&sem, longest).await.unwrap_err();
    assert_eq!(err.error_type, "SemaphoreBusy", "{}", err.error_message);
}
