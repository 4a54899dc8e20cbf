//! `semctl` driven as an operator would, against the real local server: the exit codes, the
//! zombie sequence, an expired request, what one critical section costs in requests, a lock
//! written by version 1, and every kind of bad input (F6) answered by a named error with nothing
//! written.

use std::collections::HashMap;
use std::process::Output;
use std::sync::Mutex;
use std::time::Duration;

use aws_sdk_dynamodb::primitives::Blob;
use aws_sdk_dynamodb::types::AttributeValue;
use semaphore_core::{AcquisitionId, DynamoStore, HolderId, Identity, Limit, LockName, Semaphore};
use semaphore_tests::observe::{observe, raw_item};
use semaphore_tests::proxy::{ForwardingProxy, HoldingProxy, Policy, Verdict};
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

    fn command(&self, endpoint_url: &str, args: &[&str]) -> std::process::Command {
        let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_semctl"));
        command
            .args(["--endpoint-url", endpoint_url, "--table", &self.table])
            .args(args)
            .env("AWS_ACCESS_KEY_ID", "testing")
            .env("AWS_SECRET_ACCESS_KEY", "testing")
            .env("AWS_REGION", "us-east-1")
            .env_remove("AWS_PROFILE")
            // The defaults, unless a test says otherwise: not whatever the shell exports.
            .env_remove("ACQUIRE_HORIZON_SECONDS")
            .env_remove("CLOCK_SKEW_SECONDS");
        command
    }

    fn run(&self, args: &[&str]) -> Output {
        self.command(endpoint(), args).output().expect("run semctl")
    }

    /// Runs semctl against `endpoint_url` (a proxy served by this test's runtime) without
    /// blocking the runtime, and checks the exit code; returns stdout as JSON.
    async fn json_via(&self, endpoint_url: &str, args: &[&str], code: i32) -> Value {
        let mut command = self.command(endpoint_url, args);
        let out = tokio::task::spawn_blocking(move || command.output().expect("run semctl"))
            .await
            .expect("semctl's runner");
        assert_eq!(
            out.status.code(),
            Some(code),
            "semctl {args:?}\nstdout: {}\nstderr: {}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).expect("stdout is JSON")
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

/// `status`'s fences, last rotation and version are the stored item's, read raw.
fn assert_matches_stored(status: &Value, raw: &HashMap<String, AttributeValue>) {
    let set_len = |name: &str| {
        raw.get(name)
            .and_then(|v| v.as_bs().ok())
            .map_or(0, Vec::len)
    };
    let number = |name: &str| {
        raw.get(name)
            .and_then(|v| v.as_n().ok())
            .map(|n| n.parse::<u64>().unwrap())
    };
    assert_eq!(
        status["fences"],
        serde_json::json!({"young": set_len("young"), "old": set_len("old")}),
        "{status:#}"
    );
    assert_eq!(
        status["rotated_at_ms"].as_u64(),
        number("rotated_at"),
        "{status:#}"
    );
    assert_eq!(
        status["rotated_at"].is_string(),
        number("rotated_at").is_some()
    );
    assert_eq!(status["version"].as_u64(), number("version"), "{status:#}");
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
    assert_eq!(status["holders"][0]["token"], 1);
    let acquired_at = status["holders"][0]["acquired_at"].as_str().unwrap();
    assert!(
        acquired_at.len() == 24 && acquired_at.ends_with('Z'),
        "RFC 3339 in UTC: {acquired_at}"
    );
    assert_eq!(status["fences"], serde_json::json!({"young": 0, "old": 0}));
    assert_eq!(status["rotated_at"], Value::Null, "never rotated");
    // The defaults: an 8 s horizon plus 2 s of clock skew.
    assert_eq!(status["fence_window_seconds"], 10);
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
    let status = semctl.json(&["status", "--lock", "L"], 0);
    assert_eq!(status["count"], 0);
    // The fences and their last rotation as stored: whether a release also rotated them is
    // the core's housekeeping policy, what status prints is the item.
    assert_matches_stored(&status, &semctl.raw("L").await.unwrap());
    let fences = &status["fences"];
    assert!(
        fences["young"].as_u64().unwrap() + fences["old"].as_u64().unwrap() >= 1,
        "the released acquisition is fenced: {status:#}"
    );
    assert_eq!(
        semctl.json(
            &[
                "status",
                "--lock",
                "L",
                "--horizon-seconds",
                "20",
                "--clock-skew-seconds",
                "5"
            ],
            0
        )["fence_window_seconds"],
        25
    );
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
    assert_matches_stored(&status, &semctl.raw("Z").await.unwrap());
    let fences = &status["fences"];
    assert!(
        fences["young"].as_u64().unwrap() + fences["old"].as_u64().unwrap() >= 1,
        "the cleaned-up execution is fenced: {status:#}"
    );
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
        // The timing, checked against the same ranges as the Lambdas' settings.
        (
            vec![
                "acquire",
                "--lock",
                "L",
                "--holder",
                "h",
                "--limit",
                "3",
                "--horizon-seconds",
                "0",
            ],
            "expected whole seconds from 1 to 300",
        ),
        (
            vec![
                "acquire",
                "--lock",
                "L",
                "--holder",
                "h",
                "--limit",
                "3",
                "--horizon-seconds",
                "301",
            ],
            "expected whole seconds from 1 to 300",
        ),
        (
            vec![
                "release",
                "--lock",
                "L",
                "--holder",
                "exec-1",
                "--horizon-seconds",
                "2.5",
            ],
            "expected whole seconds from 1 to 300",
        ),
        (
            vec![
                "cleanup",
                "--lock",
                "L",
                "--holder",
                "exec-1",
                "--clock-skew-seconds",
                "0",
            ],
            "expected whole seconds from 1 to 60",
        ),
        (
            vec!["status", "--lock", "L", "--clock-skew-seconds", "61"],
            "expected whole seconds from 1 to 60",
        ),
        (
            vec![
                "release",
                "--lock",
                "L",
                "--holder",
                "exec-1",
                "--clock-skew-seconds",
                "-1",
            ],
            "expected whole seconds from 1 to 60",
        ),
        // The flag it replaced is gone, not ignored.
        (
            vec![
                "release",
                "--lock",
                "L",
                "--holder",
                "exec-1",
                "--fence-window-seconds",
                "300",
            ],
            "--fence-window-seconds",
        ),
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

    // The same ranges from the environment, as a deployment's settings would come.
    for (name, value, expected) in [
        (
            "ACQUIRE_HORIZON_SECONDS",
            "0",
            "expected whole seconds from 1 to 300",
        ),
        (
            "ACQUIRE_HORIZON_SECONDS",
            "eight",
            "expected whole seconds from 1 to 300",
        ),
        (
            "CLOCK_SKEW_SECONDS",
            "600",
            "expected whole seconds from 1 to 60",
        ),
    ] {
        let out = semctl
            .command(
                endpoint(),
                &["release", "--lock", "L", "--holder", "exec-1"],
            )
            .env(name, value)
            .output()
            .expect("run semctl");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{name}={value}: {stderr}");
        assert!(
            stderr.contains(expected),
            "{name}={value}: expected {expected:?} in {stderr}"
        );
        assert!(out.stdout.is_empty(), "{name}={value} printed a result");
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

/// Records the operation of every request it forwards.
#[derive(Default)]
struct Recording(Mutex<Vec<String>>);

impl Policy for Recording {
    fn decide(&self, operation: Option<&str>, _body: &[u8]) -> Verdict {
        self.0
            .lock()
            .unwrap()
            .push(operation.unwrap_or("(none)").to_owned());
        Verdict::Forward
    }
}

impl Recording {
    fn take(&self) -> Vec<String> {
        std::mem::take(&mut *self.0.lock().unwrap())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_uncontended_acquire_then_release_each_a_fresh_process_is_at_most_three_requests() {
    let semctl = Semctl::new().await;
    // The lock exists (its first write, which takes two requests, is not what is measured).
    let warm = ["--lock", "L", "--holder", "warm-up"];
    semctl.json(&[&["acquire"], &warm[..], &["--limit", "5"]].concat(), 0);
    semctl.json(&[&["release"], &warm[..]].concat(), 0);

    let proxy = ForwardingProxy::with_policy(endpoint(), Recording::default())
        .await
        .expect("start the counting proxy");
    let me = ["--lock", "L", "--holder", "exec-1", "--acquisition", "a-1"];
    let acquired = semctl
        .json_via(
            &proxy.endpoint(),
            &[&["acquire"], &me[..], &["--limit", "5"]].concat(),
            0,
        )
        .await;
    assert_eq!(acquired["outcome"], "acquired");
    let acquire_requests = proxy.policy().take();
    let released = semctl
        .json_via(&proxy.endpoint(), &[&["release"], &me[..]].concat(), 0)
        .await;
    assert_eq!(released["outcome"], "released");
    let release_requests = proxy.policy().take();
    eprintln!("acquire: {acquire_requests:?}; release: {release_requests:?}");

    // No read: one conditional UpdateItem takes the slot.
    assert_eq!(acquire_requests, ["UpdateItem"]);
    // One UpdateItem frees it and fences the acquisition; at most one more rotates the fences,
    // when a rotation is due.
    assert!(
        (1..=2).contains(&release_requests.len())
            && release_requests.iter().all(|op| op == "UpdateItem"),
        "{release_requests:?}"
    );
    let total = acquire_requests.len() + release_requests.len();
    assert!(
        total <= 3,
        "{total} DynamoDB requests for one critical section"
    );
    assert_eq!(total as u64, proxy.forwarded());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_that_lands_after_a_rotation_past_its_horizon_is_expired_and_exits_4() {
    let semctl = Semctl::new().await;
    let store = DynamoStore::new(semaphore_tests::client_for(endpoint()), &semctl.table);
    let direct = Semaphore::new(store);
    let lock = LockName::new("X").unwrap();
    // The lock exists, with no rotation yet.
    let other = Identity::new(
        HolderId::new("exec-0").unwrap(),
        AcquisitionId::new("a").unwrap(),
    );
    direct
        .acquire(&lock, &other, Limit::new(3).unwrap())
        .await
        .unwrap();
    let before = observe(&semaphore_tests::client_for(endpoint()), &semctl.table, "X")
        .await
        .unwrap();

    // semctl's acquire write is held in flight past its 3 s horizon (counted from the start of
    // its process, before the write was held)...
    let proxy = HoldingProxy::start(endpoint()).await;
    proxy.hold_next("UpdateItem", 1);
    let args = [
        "acquire",
        "--lock",
        "X",
        "--holder",
        "exec-1",
        "--limit",
        "3",
        "--horizon-seconds",
        "3",
        "--clock-skew-seconds",
        "1",
    ];
    let endpoint_url = proxy.endpoint();
    let answer = {
        let semctl = Semctl {
            table: semctl.table.clone(),
        };
        tokio::spawn(async move { semctl.json_via(&endpoint_url, &args, 4).await })
    };
    proxy.wait_held(1).await;
    tokio::time::sleep(Duration::from_millis(3_200)).await;
    // ...while a release fences another acquisition and the fences are rotated (the lock's
    // first rotation is due at once; the sweeper rotates what is due), later than that horizon.
    direct.release(&lock, &other).await.unwrap();
    let item = direct.status(&lock).await.unwrap();
    assert!(direct.rotate_if_due(&item).await, "a rotation was due");
    let rotated = observe(&semaphore_tests::client_for(endpoint()), &semctl.table, "X")
        .await
        .unwrap();
    assert!(rotated.version > before.version, "released and rotated");
    proxy.release_held();

    let expired = answer.await.expect("semctl's task");
    assert_eq!(expired["outcome"], "expired");
    assert!(
        expired["message"]
            .as_str()
            .unwrap()
            .contains("run the command again"),
        "{expired:#}"
    );
    let after = observe(&semaphore_tests::client_for(endpoint()), &semctl.table, "X")
        .await
        .unwrap();
    assert_eq!(after, rotated, "the expired write changed nothing");
}

/// An item as version 1 wrote it: a stored count, holders as maps, fences as one binary
/// attribute of 12-byte records, no format.
fn version_1_item(lock: &str) -> HashMap<String, AttributeValue> {
    let n = |v: &str| AttributeValue::N(v.to_owned());
    let holding = AttributeValue::M(HashMap::from([
        ("token".to_owned(), n("3")),
        ("acquired_at".to_owned(), n("1767225600000")),
    ]));
    HashMap::from([
        ("lock".to_owned(), AttributeValue::S(lock.to_owned())),
        ("version".to_owned(), n("3")),
        ("count".to_owned(), n("1")),
        ("limit".to_owned(), n("2")),
        (
            "holders".to_owned(),
            AttributeValue::M(HashMap::from([("exec-1#default".to_owned(), holding)])),
        ),
        (
            "fences".to_owned(),
            AttributeValue::B(Blob::new(vec![7; 12])),
        ),
    ])
}

#[tokio::test]
async fn a_lock_written_by_version_1_is_a_named_error_for_every_command_and_is_left_alone() {
    let semctl = Semctl::new().await;
    let client = semaphore_tests::client_for(endpoint());
    client
        .put_item()
        .table_name(&semctl.table)
        .set_item(Some(version_1_item("v1-lock")))
        .send()
        .await
        .expect("put a version-1 item");
    let stored = semctl.raw("v1-lock").await.unwrap();

    let lock = ["--lock", "v1-lock"];
    for args in [
        [
            &["acquire"],
            &lock[..],
            &["--holder", "exec-2", "--limit", "2"],
        ]
        .concat(),
        // The holder version 1 recorded: not freed, not fenced by version 2.
        [&["release"], &lock[..], &["--holder", "exec-1"]].concat(),
        [&["cleanup"], &lock[..], &["--holder", "exec-1"]].concat(),
        [&["status"], &lock[..]].concat(),
    ] {
        let out = semctl.run(&args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {stderr}");
        assert!(
            stderr.contains("the item for lock \"v1-lock\" was written by version 1"),
            "{args:?}: {stderr}"
        );
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
        assert!(out.stdout.is_empty(), "{args:?} printed a result");
        assert_eq!(
            semctl.raw("v1-lock").await.as_ref(),
            Some(&stored),
            "{args:?} changed the version-1 item"
        );
    }
}
