//! F15 through semctl: every number an operator passes that sizes a write, a loop or an
//! allocation is bounded, and past its bound the command exits 1 with a message naming the flag
//! or the value, prints nothing, and writes nothing (all three tables read raw before and
//! after). A count that only limits what is shown (`--holders`) takes any size without
//! allocating by it.

use std::process::{Command, Output};

use local_aws::observe::raw_tables;
use local_aws::{endpoint, fresh_table};
use semaphore_core::{AcquisitionId, HolderId, Identity, Limit, LockName, Semaphore};
use serde_json::Value;

fn semctl(table: &str, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_semctl"))
        .args(["--endpoint-url", endpoint(), "--table", table])
        .args(args)
        .env("AWS_ACCESS_KEY_ID", "testing")
        .env("AWS_SECRET_ACCESS_KEY", "testing")
        .env("AWS_REGION", "us-east-1")
        .env_remove("AWS_PROFILE")
        .env_remove("ACQUIRE_HORIZON_SECONDS")
        .env_remove("CLOCK_SKEW_SECONDS")
        .env_remove("SEMCTL_MAX_ATTEMPTS")
        .output()
        .expect("run semctl")
}

#[tokio::test]
async fn a_number_past_its_bound_is_exit_1_with_its_name_and_writes_nothing() {
    let sem = Semaphore::new(fresh_table().await);
    let store = sem.store();
    let table = store.table().to_owned();
    let held = Identity::new(
        HolderId::new("exec-1").unwrap(),
        AcquisitionId::new(AcquisitionId::DEFAULT).unwrap(),
    );
    sem.acquire(&LockName::new("L").unwrap(), &held, Limit::new(3).unwrap())
        .await
        .unwrap();
    let before = raw_tables(store).await;

    let slot = ["--lock", "L", "--holder", "exec-1"];
    let with = |command: &[&'static str], extra: &[&'static str]| -> Vec<&'static str> {
        command.iter().chain(&slot).chain(extra).copied().collect()
    };
    let acquire = |extra: &[&'static str]| {
        let mut args = with(&["acquire"], &["--limit", "3"]);
        args.extend(extra);
        args
    };
    let token = "token must be the fencing token of the acquire answer, a whole number from 1 \
                 to 999999999999999";
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (with(&["release"], &["--token", "0"]), token),
        (with(&["release"], &["--token", "1000000000000000"]), token),
        (
            with(&["release"], &["--token", "18446744073709551616"]),
            token,
        ),
        (with(&["release"], &["--token", "-1"]), token),
        (with(&["release"], &["--token", "7x"]), token),
        (with(&["heartbeat"], &["--token", "0"]), token),
        (
            with(&["heartbeat"], &["--token", "1000000000000000"]),
            token,
        ),
        (
            with(&["release"], &["--token", "1", "--weight", "10001"]),
            "weight must be a whole number from 1 to the limit (10000 at most)",
        ),
        (
            acquire(&["--weight", "4294967297"]),
            "weight must be a whole number",
        ),
        (
            with(&["acquire"], &["--limit", "10001"]),
            "limit must be a whole number from 1 to 10000",
        ),
        (
            with(&["acquire"], &["--limit", "18446744073709551616"]),
            "limit must be a whole number from 1 to 10000",
        ),
        (
            acquire(&["--rate", "1e9"]),
            "rate must be a number of acquisitions",
        ),
        (
            acquire(&["--rate", "inf"]),
            "rate must be a number of acquisitions",
        ),
        (
            acquire(&["--lease", "86401"]),
            "lease must be a number of seconds",
        ),
        (
            acquire(&["--lease", "1e300"]),
            "lease must be a number of seconds",
        ),
        (
            with(&["heartbeat"], &["--lease", "1e300"]),
            "lease must be a number of seconds",
        ),
        (
            with(&["release", "--max-attempts", "0"], &[]),
            "0 is not in 1..=20",
        ),
        (
            with(&["release", "--max-attempts", "21"], &[]),
            "21 is not in 1..=20",
        ),
        (
            with(&["release", "--max-attempts", "4294967296"], &[]),
            "--max-attempts",
        ),
        (
            with(&["release", "--clock-skew-seconds", "61"], &[]),
            "expected whole seconds from 1 to 60",
        ),
        (
            with(
                &["release", "--horizon-seconds", "18446744073709551616"],
                &[],
            ),
            "expected whole seconds from 1 to 300",
        ),
        (
            vec!["status", "--lock", "L", "--holders", "18446744073709551616"],
            "expected a number of holders or \"all\"",
        ),
        (
            vec!["top", "--once", "--interval", "0"],
            "expected seconds from 0.5 to 10",
        ),
        (
            vec!["top", "--once", "--interval", "1e300"],
            "expected seconds from 0.5 to 10",
        ),
        (
            vec!["top", "--once", "--interval", "NaN"],
            "expected seconds from 0.5 to 10",
        ),
        (
            vec!["top", "--once", "--holders", "18446744073709551616"],
            "--holders",
        ),
    ];
    for (args, expected) in cases {
        let out = semctl(&table, &args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {stderr}");
        assert!(
            stderr.contains(expected),
            "{args:?}: expected {expected:?} in {stderr}"
        );
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
        assert!(out.stdout.is_empty(), "{args:?} printed a result");
    }
    assert_eq!(raw_tables(store).await, before, "nothing was written");

    // A count that only limits what is shown takes any size: nothing is sized by it.
    let out = semctl(
        &table,
        &["status", "--lock", "L", "--holders", "1000000000000000"],
    );
    assert_eq!(out.status.code(), Some(0));
    let status: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(status["holders"].as_array().map(Vec::len), Some(1));
    assert_eq!(status["holders_omitted"], 0);
}
