//! The built `sweeper` binary run as Lambda runs it (through a stand-in Runtime API): the summary
//! it answers and the EMF metric line it prints on stdout.

use std::path::Path;

use lambda_common::metrics::check_emf;
use local_aws::runtime_api::{run_function, Answer};
use local_aws::{fresh_table, sdk_config};
use semaphore_core::{AcquisitionId, Clock, HolderId, Identity, Limit, LockName, Semaphore};
use serde_json::{json, Value};

const EXE: &str = env!("CARGO_BIN_EXE_sweeper");

#[tokio::test(flavor = "multi_thread")]
async fn the_binary_sweeps_and_prints_the_metric() {
    let store = fresh_table().await;
    let table = store.table().to_owned();
    // Acquired two minutes ago (a clock behind): "does not exist" is believed of it only past
    // the grace period (MISSING_EXECUTION_GRACE_MS).
    let two_minutes_ago = semaphore_core::SystemClock.now_ms() - 120_000;
    let sem = Semaphore::new(store).with_clock(std::sync::Arc::new(
        semaphore_core::ManualClock::new(two_minutes_ago),
    ));
    let sfn = local_aws::sfn::client();
    let machine = format!("Sweep-{:x}", fastrand::u64(..));
    let machine_arn = sfn
        .create_state_machine()
        .name(&machine)
        .definition(
            r#"{"StartAt": "W", "States": {"W": {"Type": "Wait", "Seconds": 3600, "End": true}}}"#,
        )
        .role_arn("arn:aws:iam::123456789012:role/semaphore-test")
        .send()
        .await
        .unwrap()
        .state_machine_arn()
        .to_owned();
    let gone = format!("arn:aws:states:us-east-1:123456789012:execution:{machine}:gone");
    sem.acquire(
        &LockName::new("demo-lock").unwrap(),
        &Identity::new(
            HolderId::new(gone.as_str()).unwrap(),
            AcquisitionId::new("g1").unwrap(),
        ),
        Limit::new(5).unwrap(),
    )
    .await
    .unwrap();
    let topic_arn = aws_sdk_sns::Client::new(&sdk_config())
        .create_topic()
        .name(format!("sweeper-binary-{:x}", fastrand::u64(..)))
        .send()
        .await
        .unwrap()
        .topic_arn()
        .unwrap()
        .to_owned();

    // The item as stored before the sweep, read back raw: the size the sweep must report.
    let stored_bytes = local_aws::observe::observe(sem.store().client(), &table, "demo-lock")
        .await
        .expect("the item exists")
        .approx_bytes;

    let run = tokio::task::spawn_blocking(move || {
        run_function(
            Path::new(EXE),
            &[
                ("TABLE_NAME", table.as_str()),
                ("TOPIC_ARN", topic_arn.as_str()),
                ("PROTECTED_STATE_MACHINES", machine_arn.as_str()),
                ("METRIC_NAMESPACE", "Test/Semaphore"),
            ],
            vec![json!({"source": "aws.events", "detail-type": "Scheduled Event", "detail": {}})],
        )
    })
    .await
    .unwrap();
    assert_eq!(
        run.answers,
        [Answer::Response(json!({
            "pages": 1,
            "locks": 1,
            "largest_item_bytes": stored_bytes,
            "largest_item_lock": "demo-lock",
            "holders_checked": 1,
            "reclaimed": 1,
            "taken_back": 0,
            "kept_not_found": 0,
            "waiters_checked": 0,
            "waiters_removed": 0,
            "woken": 0,
            "not_judged": 0,
            "notices_published": 1,
            "errors": [],
            "errors_left_out": 0
        }))],
        "stdout: {}\nstderr: {}",
        run.stdout,
        run.stderr
    );
    // Two EMF lines, JSON objects of their own on stdout among the JSON logs, written as the
    // sweep goes: the lock that lost a slot (its page's), then every lock's together.
    let emf: Vec<Value> = run
        .stdout
        .lines()
        .filter(|l| l.contains("\"_aws\""))
        .map(|l| check_emf(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    assert_eq!(emf.len(), 2, "{}", run.stdout);
    assert_eq!(emf[1]["ReclaimedSlots"], json!(1));
    assert_eq!(emf[1]["LargestItemBytes"], json!(stored_bytes));
    assert_eq!(emf[1]["SlotsNotJudged"], json!(0));
    assert_eq!(emf[0]["ReclaimedSlots"], json!(1));
    assert_eq!(emf[0]["Lock"], json!("demo-lock"));
    for line in &emf {
        assert_eq!(
            line["_aws"]["CloudWatchMetrics"][0]["Namespace"],
            json!("Test/Semaphore")
        );
    }
}
