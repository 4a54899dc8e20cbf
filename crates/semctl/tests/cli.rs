//! `semctl` driven as an operator would, against the real local server: the exit codes, the
//! zombie sequence, and every kind of bad input (F6) answered by a named error with nothing
//! written.

use std::process::Output;

use semaphore_tests::observe::{observe, raw_item};
use semaphore_tests::{endpoint, fresh_table};
use serde_json::Value;

struct Semctl {
    table: String,
}

impl Semctl {
    async fn new() -> Self {
        Self {
            table: fresh_table().await.table().to_owned(),
        }
    }

    fn run(&self, args: &[&str]) -> Output {
        std::process::Command::new(env!("CARGO_BIN_EXE_semctl"))
            .args(["--endpoint-url", endpoint(), "--table", &self.table])
            .args(args)
            .env("AWS_ACCESS_KEY_ID", "testing")
            .env("AWS_SECRET_ACCESS_KEY", "testing")
            .env("AWS_REGION", "us-east-1")
            .env_remove("AWS_PROFILE")
            .output()
            .expect("run semctl")
    }

    /// Runs, checks the exit code, parses stdout.
    fn json(&self, args: &[&str], code: i32) -> Value {
        let out = self.run(args);
        assert_eq!(
            out.status.code(),
            Some(code),
            "semctl {args:?}\nstdout: {}\nstderr: {}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).expect("stdout is JSON")
    }

    async fn raw(
        &self,
        lock: &str,
    ) -> Option<std::collections::HashMap<String, aws_sdk_dynamodb::types::AttributeValue>> {
        raw_item(&semaphore_tests::client_for(endpoint()), &self.table, lock).await
    }
}

#[tokio::test]
async fn init_is_idempotent() {
    let semctl = Semctl {
        table: format!("semctl-init-{:x}", fastrand::u64(..)),
    };
    assert_eq!(semctl.json(&["init"], 0)["outcome"], "created");
    assert_eq!(semctl.json(&["init"], 0)["outcome"], "already_existed");
}

#[tokio::test]
async fn acquire_full_release_and_status_report_what_happened() {
    let semctl = Semctl::new().await;
    let a = semctl.json(
        &[
            "acquire", "--lock", "L", "--holder", "exec-1", "--limit", "1",
        ],
        0,
    );
    assert_eq!(a["outcome"], "acquired");
    assert_eq!(a["token"], 1);
    let again = semctl.json(
        &[
            "acquire", "--lock", "L", "--holder", "exec-1", "--limit", "1",
        ],
        0,
    );
    assert_eq!(again["outcome"], "already_held");
    assert_eq!(again["token"], 1);
    let full = semctl.json(
        &[
            "acquire", "--lock", "L", "--holder", "exec-2", "--limit", "1",
        ],
        2,
    );
    assert_eq!(full["outcome"], "full");

    let status = semctl.json(&["status", "--lock", "L"], 0);
    assert_eq!(status["lock"], "L");
    assert_eq!(status["limit"], 1);
    assert_eq!(status["count"], 1);
    assert_eq!(status["version"], 1);
    assert_eq!(status["holders"][0]["holder"], "exec-1");
    assert_eq!(status["holders"][0]["acquisition"], "default");
    // The size of the item as stored, read back raw: what each write of this lock costs.
    let stored = observe(&semaphore_tests::client_for(endpoint()), &semctl.table, "L")
        .await
        .expect("the item exists");
    assert_eq!(status["item_bytes"], stored.approx_bytes);
    assert!(stored.approx_bytes > 50, "{stored:?}");
    assert_eq!(status["write_units_per_write"], 1);

    let released = semctl.json(&["release", "--lock", "L", "--holder", "exec-1"], 0);
    assert_eq!(released["outcome"], "released");
    let twice = semctl.json(&["release", "--lock", "L", "--holder", "exec-1"], 0);
    assert_eq!(twice["outcome"], "not_held");
    assert!(twice["message"].as_str().unwrap().contains("held nothing"));
    assert_eq!(semctl.json(&["status", "--lock", "L"], 0)["count"], 0);
}

#[tokio::test]
async fn acquire_after_cleanup_of_the_same_holder_is_the_zombie_case_and_exits_3() {
    let semctl = Semctl::new().await;
    let acquire = [
        "acquire", "--lock", "Z", "--holder", "exec-1", "--limit", "2",
    ];
    semctl.json(&acquire, 0);
    let cleaned = semctl.json(&["cleanup", "--lock", "Z", "--holder", "exec-1"], 0);
    assert_eq!(cleaned["freed"].as_array().unwrap().len(), 1);
    assert_eq!(cleaned["count"], 0);
    let zombie = semctl.json(&acquire, 3);
    assert_eq!(zombie["outcome"], "fenced");
    // Cleanup is idempotent.
    let again = semctl.json(&["cleanup", "--lock", "Z", "--holder", "exec-1"], 0);
    assert_eq!(again["freed"].as_array().unwrap().len(), 0);
    let status = semctl.json(&["status", "--lock", "Z"], 0);
    assert_eq!(status["count"], 0);
    assert_eq!(status["fences"], 1);
}

#[tokio::test]
async fn f6_every_bad_input_is_a_named_error_and_writes_nothing() {
    let semctl = Semctl::new().await;
    // An existing semaphore whose stored state must not move.
    semctl.json(
        &[
            "acquire", "--lock", "L", "--holder", "exec-1", "--limit", "3",
        ],
        0,
    );
    let before = observe(&semaphore_tests::client_for(endpoint()), &semctl.table, "L")
        .await
        .unwrap();

    let long_lock = "x".repeat(257);
    let long_holder = "h".repeat(513);
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (
            vec!["acquire", "--lock", "", "--holder", "h", "--limit", "1"],
            "lock name is empty",
        ),
        (
            vec![
                "acquire", "--lock", &long_lock, "--holder", "h", "--limit", "1",
            ],
            "lock name is 257 bytes",
        ),
        (
            vec!["acquire", "--lock", "L", "--holder", "h", "--limit", "0"],
            "limit must be a whole number",
        ),
        (
            vec!["acquire", "--lock", "L", "--holder", "h", "--limit", "-1"],
            "limit must be a whole number",
        ),
        (
            vec!["acquire", "--lock", "L", "--holder", "h", "--limit", "2.5"],
            "limit must be a whole number",
        ),
        (
            vec!["acquire", "--lock", "L", "--holder", "h", "--limit", "five"],
            "limit must be a whole number",
        ),
        (
            vec!["acquire", "--lock", "L", "--holder", "", "--limit", "1"],
            "holder is empty",
        ),
        (
            vec![
                "acquire",
                "--lock",
                "L",
                "--holder",
                &long_holder,
                "--limit",
                "1",
            ],
            "holder is 513 bytes",
        ),
        (
            vec![
                "acquire",
                "--lock",
                "L",
                "--holder",
                "h",
                "--limit",
                "1",
                "--acquisition",
                "a#b",
            ],
            "acquisition id contains '#'",
        ),
        (
            vec!["release", "--lock", "L", "--holder", ""],
            "holder is empty",
        ),
        (
            vec!["cleanup", "--lock", "", "--holder", "exec-1"],
            "lock name is empty",
        ),
        (
            vec!["cleanup", "--lock", "L", "--holder", "exec\u{7}1"],
            "control character",
        ),
        (
            vec!["status", "--lock", "never-acquired"],
            "no semaphore named \"never-acquired\"",
        ),
        (vec!["acquire", "--lock", "L", "--holder", "h"], "--limit"),
    ];
    for (args, expected) in cases {
        let out = semctl.run(&args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {stderr}");
        assert!(
            stderr.contains(expected),
            "{args:?}: expected {expected:?} in {stderr}"
        );
        assert!(out.stdout.is_empty(), "{args:?} printed a result");
    }

    let after = observe(&semaphore_tests::client_for(endpoint()), &semctl.table, "L")
        .await
        .unwrap();
    assert_eq!(before, after, "a rejected request changed the item");
    assert!(semctl.raw("never-acquired").await.is_none());
}

#[tokio::test]
async fn a_missing_table_is_reported_with_what_to_do() {
    let semctl = Semctl {
        table: "no-such-table".to_owned(),
    };
    let out = semctl.run(&["status", "--lock", "L"]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("does not exist") && stderr.contains("semctl init"),
        "{stderr}"
    );
}
