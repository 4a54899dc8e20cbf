//! F15: every number of a release payload that sizes a write has a bound, and past it the
//! release function answers `SemaphoreInvalidInput` with nothing written. The run in `r<n>`
//! sizes the fence a redriven run's release writes (one fence per earlier run): a release naming
//! `r4294967295` once fenced every run from 0 to 4,294,967,295 (an allocation of 274 GB, abort),
//! and `r20000` grew the lock's item to 160 KB. Runs are bounded by Step Functions' history
//! (`Run::MAX`), fencing tokens by what a lock can give (`FencingToken::MAX`), weights by the
//! largest limit. Each payload is sent to the real function code against the local server, and
//! all three tables are read raw before and after.

use lambda_common::{Resolver, Settings};
use lambda_runtime::{Context, Diagnostic, LambdaEvent};
use local_aws::names::{id, limit, lock};
use local_aws::observe::raw_tables;
use local_aws::{fresh_table, sdk_config};
use semaphore_core::input::{
    MAX_ACQUISITION_BYTES, MAX_HOLDER_BYTES, MAX_LIMIT, MAX_LOCK_NAME_BYTES,
};
use semaphore_core::{AcquireOutcome, DynamoStore, FencingToken, Run, Semaphore};
use serde_json::{json, Value};

const HOLDER: &str = "arn:aws:states:us-east-1:123456789012:execution:LockProtected:run-1";

async fn release(sem: &Semaphore<DynamoStore>, payload: Value) -> Result<Value, Diagnostic> {
    let hand_offs = Settings::from_lookup(|_| None)
        .hand_offs(&sdk_config())
        .expect("settings");
    lambda_release::handle(
        sem,
        &Resolver::default(),
        &hand_offs,
        LambdaEvent::new(payload, Context::default()),
    )
    .await
    .map(|answer| serde_json::to_value(answer).expect("the answer serializes"))
    .map_err(Diagnostic::from)
}

#[tokio::test]
async fn a_run_token_or_weight_past_its_bound_is_semaphore_invalid_input_and_writes_nothing() {
    let sem = Semaphore::new(fresh_table().await);
    let demo = lock("demo-lock");
    // Run 1 of the execution holds a slot, so a release that went past parsing would free it and
    // fence run 0; another holder holds one too.
    let AcquireOutcome::Acquired { token, .. } = sem
        .acquire_in_run(&demo, &id(HOLDER, "r1"), Run(1), limit(5), sem.now_ms())
        .await
        .unwrap()
    else {
        panic!("acquired")
    };
    sem.acquire(&demo, &id("another", "r0"), limit(5))
        .await
        .unwrap();
    let before = raw_tables(sem.store()).await;

    let answer = json!({"lock": "demo-lock", "holder": HOLDER, "acquisition": "r1",
                        "token": token.0, "weight": 1});
    let with = |field: &str, value: Value| {
        let mut answer = answer.clone();
        answer[field] = value;
        json!({ "semaphore": answer })
    };
    let late = |run: u64| {
        format!(
            "semaphore.acquisition r{run}: run {} is past the last run an execution can have \
             (12499): Step Functions stops redriving an execution before its history's 25,000 \
             events",
            run.min(u64::from(u32::MAX))
        )
    };
    let bad_token = |got: &str| {
        format!(
            "semaphore.token: token must be the fencing token of the acquire answer, a whole \
             number from 1 to 999999999999999; got {got}"
        )
    };
    let bad_weight = |got: &str| {
        format!(
            "semaphore.weight: weight must be a whole number from 1 to the limit (10000 at \
             most); got {got}"
        )
    };
    let cases: Vec<(Value, String)> = vec![
        // The crash of issue #37, then the first run past the bound, then digits past a u32.
        (
            with("acquisition", json!("r4294967295")),
            late(4_294_967_295),
        ),
        (
            with("acquisition", json!(format!("r{}", Run::MAX.0 + 1))),
            late(12_500),
        ),
        (with("acquisition", json!("r20000")), late(20_000)),
        (
            with("acquisition", json!("r99999999999999999999")),
            "semaphore.acquisition r99999999999999999999: run 4294967295 is past the last run \
             an execution can have (12499): Step Functions stops redriving an execution before \
             its history's 25,000 events"
                .to_owned(),
        ),
        (with("token", json!(0)), bad_token("0")),
        (
            with("token", json!(FencingToken::MAX + 1)),
            bad_token("1000000000000000"),
        ),
        (
            with("token", json!(u64::MAX)),
            bad_token("18446744073709551615"),
        ),
        (with("token", json!(-1)), bad_token("-1")),
        (with("token", json!(1e300)), bad_token("1e+300")),
        (with("token", json!("1")), bad_token("the string \"1\"")),
        (with("weight", json!(MAX_LIMIT + 1)), bad_weight("10001")),
        (
            with("weight", json!(u64::MAX)),
            bad_weight("18446744073709551615"),
        ),
        (
            with("lock", json!("l".repeat(MAX_LOCK_NAME_BYTES + 1))),
            "semaphore.lock: lock name is 257 bytes long; the maximum is 256 bytes".to_owned(),
        ),
        (
            with("holder", json!("h".repeat(MAX_HOLDER_BYTES + 1))),
            "semaphore.holder: holder is 513 bytes long; the maximum is 512 bytes".to_owned(),
        ),
        (
            with(
                "acquisition",
                json!(format!("r{}", "9".repeat(MAX_ACQUISITION_BYTES))),
            ),
            "semaphore.acquisition: acquisition id is 129 bytes long; the maximum is 128 bytes"
                .to_owned(),
        ),
    ];
    for (payload, message) in cases {
        let err = release(&sem, payload.clone())
            .await
            .expect_err(&format!("{payload} must be refused"));
        assert_eq!(err.error_type, "SemaphoreInvalidInput", "{payload}");
        assert_eq!(err.error_message, message, "{payload}");
    }
    assert_eq!(raw_tables(sem.store()).await, before, "nothing was written");

    // The same payload within its bounds is released (the refusals were the bounds).
    let released = release(&sem, json!({ "semaphore": answer })).await.unwrap();
    assert_eq!(released["outcome"], json!("released"));
    assert_ne!(raw_tables(sem.store()).await, before);
}
