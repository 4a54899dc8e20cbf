//! The metrics the acquire and release functions write, from the handlers run against a fresh
//! table on the local server: every line is EMF as the specification defines it
//! (`lambda_common::metrics::check_emf`) and carries the values of the operation that wrote it.

use std::sync::{Arc, Mutex};

use lambda_acquire::Config;
use lambda_common::{Metrics, Settings, SfnHandOffs};
use lambda_runtime::{Context, Diagnostic, LambdaEvent};
use local_aws::names::{id, lock};
use local_aws::{fresh_table, sdk_config};
use semaphore_core::{rfc3339_millis, DynamoStore, Semaphore};
use serde_json::{json, Value};

const LOCK: &str = "metered";

fn holder(n: u32) -> String {
    format!("arn:aws:states:us-east-1:123456789012:execution:LockProtected:run-{n}")
}

/// The functions' hand-offs as `main` builds them, their metric lines kept for the test.
fn hand_offs() -> (SfnHandOffs, Arc<Mutex<Vec<String>>>) {
    let mut hand_offs = Settings::from_lookup(|_| None)
        .hand_offs(&sdk_config())
        .expect("settings");
    let (metrics, kept) = Metrics::kept();
    hand_offs.metrics = metrics;
    (hand_offs, kept)
}

/// The lines written since the last call, each checked as EMF.
fn lines(kept: &Mutex<Vec<String>>) -> Vec<Value> {
    kept.lock()
        .unwrap()
        .drain(..)
        .map(|line| {
            assert!(!line.contains('\n'), "{line}");
            lambda_common::metrics::check_emf(&line).unwrap_or_else(|e| panic!("{e}: {line}"))
        })
        .collect()
}

/// The one line written since the last call.
fn line(kept: &Mutex<Vec<String>>) -> Value {
    let mut lines = lines(kept);
    assert_eq!(lines.len(), 1, "{lines:#?}");
    lines.remove(0)
}

/// The payload of execution `n`'s acquire state, asking for `weight`, entered at
/// `requested_at_ms` and retried `retries` times (a task token Step Functions does not know:
/// the function's own `SendTaskSuccess` fails, which changes nothing here).
fn payload(n: u32, weight: u32, requested_at_ms: u64, retries: u32) -> Value {
    json!({
        "request": {"lock": LOCK, "limit": 3, "weight": weight},
        "execution": holder(n), "redrive_count": 0,
        "state": {"EnteredTime": rfc3339_millis(requested_at_ms), "RetryCount": retries},
        "task_token": format!("token-{n}-{retries}")
    })
}

async fn acquire(
    sem: &Semaphore<DynamoStore>,
    hand_offs: &SfnHandOffs,
    payload: Value,
) -> Result<Value, Diagnostic> {
    let config = Config::from_settings(&Settings::from_lookup(|_| None)).unwrap();
    lambda_acquire::handle(
        sem,
        &config,
        hand_offs,
        LambdaEvent::new(payload, Context::default()),
    )
    .await
    .map(|answer| serde_json::to_value(answer).unwrap())
    .map_err(Diagnostic::from)
}

/// The release function's answer to `payload`, through its handler as Lambda runs it.
async fn release(
    sem: &Semaphore<DynamoStore>,
    hand_offs: &SfnHandOffs,
    payload: Value,
) -> Result<Value, Diagnostic> {
    let resolver = lambda_release::resolver(&Settings::from_lookup(|_| None)).unwrap();
    lambda_release::handle(
        sem,
        &resolver,
        hand_offs,
        LambdaEvent::new(payload, Context::default()),
    )
    .await
    .map(|answer| serde_json::to_value(answer).unwrap())
    .map_err(Diagnostic::from)
}

/// Every member of `line` but `_aws`, and the directives' dimension sets with their metrics.
fn shape(line: &Value) -> (Value, Vec<(Value, Vec<String>)>) {
    let mut members = line.clone();
    members.as_object_mut().unwrap().remove("_aws");
    let directives = line["_aws"]["CloudWatchMetrics"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| {
            assert_eq!(d["Namespace"], json!("StepFunctionsSemaphore"));
            let names = d["Metrics"]
                .as_array()
                .unwrap()
                .iter()
                .map(|m| m["Name"].as_str().unwrap().to_owned())
                .collect();
            (d["Dimensions"].clone(), names)
        })
        .collect();
    (members, directives)
}

#[tokio::test]
async fn each_acquire_and_release_writes_one_emf_line_with_its_outcome_and_the_lock_after_it() {
    let sem = Semaphore::new(fresh_table().await);
    let (hand_offs, kept) = hand_offs();

    // Taken: weight 2 of 3, asked 200 ms before the function ran.
    let started = sem.now_ms();
    let asked = started - 200;
    let answer = acquire(&sem, &hand_offs, payload(1, 2, asked, 0))
        .await
        .unwrap();
    assert_eq!(answer["outcome"], json!("acquired"));
    let acquired = line(&kept);
    let stamp = acquired["_aws"]["Timestamp"].as_u64().unwrap();
    assert!(stamp >= started && stamp <= sem.now_ms(), "{stamp}");
    let waited = acquired["WaitTime"].as_u64().unwrap();
    assert!(
        waited >= 200 && waited <= stamp - asked,
        "{waited} ms from asking to holding"
    );
    let (members, directives) = shape(&acquired);
    assert_eq!(
        members,
        json!({"Lock": LOCK, "Outcome": "acquired", "Acquisitions": 1, "WeightUsed": 2,
               "Limit": 3, "Waiting": 0, "WaitTime": waited})
    );
    assert_eq!(
        directives,
        [
            (
                json!([["Lock", "Outcome"]]),
                vec!["Acquisitions".to_owned()]
            ),
            (
                json!([["Lock"]]),
                ["WeightUsed", "Limit", "Waiting", "WaitTime"]
                    .map(str::to_owned)
                    .to_vec()
            )
        ]
    );

    // The same acquisition again (a retry of its task): already held, the lock as its refusal
    // handed it back.
    let now = sem.now_ms();
    acquire(&sem, &hand_offs, payload(1, 2, asked, 1))
        .await
        .unwrap();
    let (members, _) = shape(&line(&kept));
    assert_eq!(
        members,
        json!({"Lock": LOCK, "Outcome": "already_held", "Acquisitions": 1, "WeightUsed": 2,
               "Limit": 3, "Waiting": 0})
    );

    // Weight 2 more does not fit: queued, with the lock as its acquire's refusal saw it.
    let answer = acquire(&sem, &hand_offs, payload(2, 2, now, 0))
        .await
        .unwrap();
    assert_eq!(answer["outcome"], json!("queued"));
    let (members, _) = shape(&line(&kept));
    assert_eq!(
        members,
        json!({"Lock": LOCK, "Outcome": "queued", "Acquisitions": 1, "WeightUsed": 2,
               "Limit": 3, "Waiting": 0})
    );
    // Its check after its task timed out (a later entry of the state): in line still, no line
    // of its own (it asked once).
    acquire(&sem, &hand_offs, payload(2, 2, now + 1, 0))
        .await
        .unwrap();
    assert!(lines(&kept).is_empty());

    // Asked longer ago than the horizon: nothing sent, so nothing known of the lock.
    let horizon_ms = u64::try_from(sem.timing().horizon.as_millis()).unwrap();
    let err = acquire(&sem, &hand_offs, payload(4, 1, now - horizon_ms - 1_000, 0))
        .await
        .unwrap_err();
    assert_eq!(err.error_type, "SemaphoreExpired");
    let (members, _) = shape(&line(&kept));
    assert_eq!(
        members,
        json!({"Lock": LOCK, "Outcome": "expired", "Acquisitions": 1})
    );

    // The release: how long the slot was held, and the lock after it.
    let token = sem.status(&lock(LOCK)).await.unwrap().holders[&id(&holder(1), "r0")].token;
    let release = json!({"semaphore": {"lock": LOCK, "holder": holder(1), "acquisition": "r0",
                                       "weight": 2, "token": token.0}});
    let resolver = lambda_release::resolver(&Settings::from_lookup(|_| None)).unwrap();
    let answer = lambda_release::release(&sem, &resolver, &hand_offs, &release)
        .await
        .unwrap();
    assert!(answer.released);
    // (Its hand-off granted the slot to the one in line, whose task, the test's own, could not
    // be woken: it keeps the slot for its next check, and no grant is counted.)
    assert_eq!(answer.handed_off, 0);
    let released = line(&kept);
    let held = released["TimeHeld"].as_u64().unwrap();
    let released_at = released["_aws"]["Timestamp"].as_u64().unwrap();
    assert!(held <= released_at - started, "held {held} ms");
    let (members, directives) = shape(&released);
    assert_eq!(
        members,
        json!({"Lock": LOCK, "TimeHeld": held, "WeightUsed": 0, "Limit": 3, "Waiting": 1})
    );
    assert_eq!(directives.len(), 1);
    assert_eq!(directives[0].0, json!([["Lock"]]));
    // A duplicate release frees nothing: no time held.
    lambda_release::release(&sem, &resolver, &hand_offs, &release)
        .await
        .unwrap();
    let (members, _) = shape(&line(&kept));
    assert_eq!(
        members,
        json!({"Lock": LOCK, "WeightUsed": 2, "Limit": 3, "Waiting": 0})
    );

    // The released acquisition asks again: fenced for good (the named error), counted.
    let err = acquire(&sem, &hand_offs, payload(1, 2, sem.now_ms(), 2))
        .await
        .unwrap_err();
    assert_eq!(err.error_type, "SemaphoreFenced");
    let (members, _) = shape(&line(&kept));
    assert_eq!(members["Outcome"], json!("fenced"));
    assert_eq!(members["Acquisitions"], json!(1));
}

/// F13: an acquire that finds the lock full of weight under a lease that has passed takes it
/// back, takes the slot, and writes `LeasesTakenBack` (with how long the slot was held) for the
/// lock, beside its own `Acquisitions` line.
#[tokio::test]
async fn an_acquire_that_takes_back_a_lapsed_lease_counts_it() {
    let timing = semaphore_core::Timing {
        clock_skew: std::time::Duration::from_millis(500),
        ..semaphore_core::Timing::default()
    };
    let sem = Semaphore::new(fresh_table().await).with_timing(timing);
    let (hand_offs, kept) = hand_offs();
    let lock = semaphore_core::LockName::new(LOCK).unwrap();
    let leased = semaphore_core::Terms::new(
        semaphore_core::Limit::new(3).unwrap(),
        semaphore_core::Weight::new(3).unwrap(),
        None,
    )
    .unwrap()
    .with_lease(Some(semaphore_core::Lease::ms(1_000).unwrap()));
    let worker = local_aws::names::id("worker", "a1");
    assert!(matches!(
        sem.acquire(&lock, &worker, leased).await.unwrap(),
        semaphore_core::AcquireOutcome::Acquired { .. }
    ));
    tokio::time::sleep(std::time::Duration::from_millis(1_600)).await;
    let answer = acquire(&sem, &hand_offs, payload(1, 1, sem.now_ms(), 0))
        .await
        .unwrap();
    assert_eq!(answer["outcome"], json!("acquired"), "{answer}");
    let lines = lines(&kept);
    assert_eq!(lines.len(), 2, "{lines:#?}");
    assert_eq!(lines[0]["Outcome"], json!("acquired"));
    assert_eq!(lines[1]["Lock"], json!(LOCK));
    assert_eq!(lines[1]["LeasesTakenBack"], json!(1));
    let held = lines[1]["TimeHeld"].as_u64().unwrap();
    assert!((1_500..10_000).contains(&held), "{held} ms");
}

/// `Failures`, the metric the stack's alarms on the two functions watch (Lambda's `Errors`
/// counts every named answer): an answer that is the protocol working or a caller's mistake
/// writes none, through the handler as Lambda runs it; a table that cannot be reached writes
/// one per invocation, for the function that failed.
#[tokio::test]
async fn only_a_failure_of_the_semaphore_writes_failures_for_its_function() {
    let sem = Semaphore::new(fresh_table().await);
    let (hand_offs, kept) = hand_offs();
    let failures = |lines: &[Value]| -> Vec<Value> {
        lines
            .iter()
            .filter(|l| l.get("Failures").is_some())
            .cloned()
            .collect()
    };
    // Weight 3 of 3: the lock is full.
    let answer = acquire(&sem, &hand_offs, payload(1, 3, sem.now_ms(), 0))
        .await
        .unwrap();
    assert_eq!(answer["outcome"], json!("acquired"));
    assert!(failures(&lines(&kept)).is_empty());

    // A poller in line is told SemaphoreBusy at each poll; a request past the horizon, a
    // payload without a lock, an Express caller: each a named error, none a failure.
    let poll = |retries: u32| {
        json!({"request": {"lock": LOCK, "limit": 3, "lease": 60, "poll_seconds": 30},
               "execution": "poller-1",
               "state": {"EnteredTime": rfc3339_millis(sem.now_ms()), "RetryCount": retries}})
    };
    let horizon_ms = u64::try_from(sem.timing().horizon.as_millis()).unwrap();
    let express = "arn:aws:states:us-east-1:123456789012:express:LockProtected:e-1:id-1";
    let mut express_payload = payload(3, 1, sem.now_ms(), 0);
    express_payload["execution"] = json!(express);
    let mut no_lock = payload(4, 1, sem.now_ms(), 0);
    no_lock["request"].as_object_mut().unwrap().remove("lock");
    for (what, payload, error_type) in [
        ("a poll", poll(0), "SemaphoreBusy"),
        ("the next poll", poll(1), "SemaphoreBusy"),
        (
            "an old request",
            payload(2, 1, sem.now_ms() - horizon_ms - 1_000, 0),
            "SemaphoreExpired",
        ),
        ("no lock", no_lock, "SemaphoreInvalidInput"),
        (
            "an Express caller",
            express_payload,
            "SemaphoreMisconfigured",
        ),
    ] {
        let err = acquire(&sem, &hand_offs, payload).await.unwrap_err();
        assert_eq!(err.error_type, error_type, "{what}: {}", err.error_message);
        let written = lines(&kept);
        assert!(failures(&written).is_empty(), "{what}: {written:#?}");
    }

    // A release showing another slot's token, and one without its acquire answer: the caller's
    // mistakes.
    let token = sem.status(&lock(LOCK)).await.unwrap().holders[&id(&holder(1), "r0")].token;
    let wrong = json!({"semaphore": {"lock": LOCK, "holder": holder(1), "acquisition": "r0",
                                     "weight": 3, "token": token.0 + 1}});
    for (what, payload, error_type) in [
        ("another slot's token", wrong, "SemaphoreWrongToken"),
        ("no answer", json!({}), "SemaphoreInvalidInput"),
    ] {
        let err = release(&sem, &hand_offs, payload).await.unwrap_err();
        assert_eq!(err.error_type, error_type, "{what}: {}", err.error_message);
        let written = lines(&kept);
        assert!(failures(&written).is_empty(), "{what}: {written:#?}");
    }

    // The same requests against a table that does not exist: SemaphoreStoreError, one
    // `Failures` line each, for its function.
    let table = format!("no-such-table-{:x}", fastrand::u64(..));
    let missing = Settings::from_lookup(move |name| (name == "TABLE_NAME").then(|| table.clone()))
        .semaphore(&sdk_config())
        .expect("settings");
    let err = acquire(&missing, &hand_offs, payload(5, 1, missing.now_ms(), 0))
        .await
        .unwrap_err();
    assert_eq!(
        err.error_type, "SemaphoreStoreError",
        "{}",
        err.error_message
    );
    let failed = line(&kept);
    let (members, directives) = shape(&failed);
    assert_eq!(members, json!({"Function": "acquire", "Failures": 1}));
    assert_eq!(
        directives,
        [(json!([["Function"]]), vec!["Failures".to_owned()])]
    );
    let release_payload = json!({"semaphore": {"lock": LOCK, "holder": holder(1),
                                               "acquisition": "r0", "weight": 3, "token": token.0}});
    let err = release(&missing, &hand_offs, release_payload)
        .await
        .unwrap_err();
    assert_eq!(
        err.error_type, "SemaphoreStoreError",
        "{}",
        err.error_message
    );
    let (members, _) = shape(&line(&kept));
    assert_eq!(members, json!({"Function": "release", "Failures": 1}));
}
