//! The local run end to end: the README's first command, short, with chaos on, two locks with
//! their own limits, weighted permits and a start rate, and the demo work as each execution's
//! child; and the same chaos against the original sample's protocol (the sample mode), which
//! must leak, so that the check is shown able to fail.
//!
//! They need the local AWS tools (.venv with the pinned moto and cargo-lambda) and take a minute
//! or two each, so they are ignored by a plain `cargo test`; `bash local/test.sh` installs the
//! tools and runs them (CI does).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;
use std::time::Instant;

use serde_json::Value;

/// How long the proxy holds the acquire write of an execution stopped mid-acquire: past the end
/// of the contention, so that the write arrives when slots are free, as in the seed's scenario
/// (the sample's conditional write is refused anyway when the lock is full on arrival).
const HOLD_SECONDS: &str = "10";

/// One run at a time: each starts its own local AWS, and the machine has 2 cores.
static SERIAL: Mutex<()> = Mutex::new(());

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Runs local-run with `args` and `--json`; returns (exit code, report).
/// Runs local-run with `args`, a command line, and answers its exit code and JSON report.
fn local_run(name: &str, args: &str) -> (i32, Value) {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let root = root();
    for tool in [".venv/bin/python", ".venv/bin/cargo-lambda"] {
        assert!(
            root.join(tool).exists(),
            "{tool} is missing: run these tests with `bash local/test.sh`, which installs the \
             pinned moto and cargo-lambda"
        );
    }
    let json = std::env::temp_dir().join(format!("local-run-{name}-{}.json", std::process::id()));
    let _ = std::fs::remove_file(&json);
    let started = Instant::now();
    let status = Command::new(env!("CARGO_BIN_EXE_local-run"))
        .args(args.split_whitespace())
        .arg("--root")
        .arg(&root)
        .arg("--json")
        .arg(&json)
        .status()
        .expect("start local-run");
    eprintln!(
        "local-run {name}: {status} after {:.0} s",
        started.elapsed().as_secs_f64()
    );
    let report = std::fs::read_to_string(&json)
        .unwrap_or_else(|e| panic!("local-run {name} wrote no report ({status}): {e}"));
    let report: Value = serde_json::from_str(&report).expect("the report is JSON");
    let _ = std::fs::remove_file(&json);
    (status.code().unwrap_or(-1), report)
}

fn n(report: &Value, pointer: &str) -> u64 {
    report
        .pointer(pointer)
        .and_then(Value::as_u64)
        .unwrap_or_else(|| panic!("{pointer} missing from the report: {report:#}"))
}

/// The HTML report the run wrote beside its logs (its path in the JSON report, as at the end of
/// the text one), opened in headless Chromium: it loads without an error or an outside request,
/// and lays out and paints its `charts` charts.
fn check_html_report(report: &Value, charts: usize) {
    let path = report["html_report"]
        .as_str()
        .unwrap_or_else(|| panic!("the run wrote no HTML report: {report:#}"));
    assert!(
        Path::new(path).starts_with(report["logs"].as_str().expect("logs")),
        "{path} is not in the run's directory"
    );
    let Some(chromium) = semaphore_charts::browser::chromium().unwrap() else {
        eprintln!("SKIPPED the HTML report's check in a browser: no Chromium (apt-get install -y chromium, or set CHROMIUM=path)");
        return;
    };
    let probe = semaphore_charts::browser::check_page(&chromium, Path::new(path), charts, 2400)
        .unwrap_or_else(|e| panic!("the HTML report in Chromium: {e}"));
    eprintln!(
        "HTML report {path}: {} charts drawn in Chromium, no error",
        probe.svgs.len()
    );
}

#[test]
#[ignore = "needs the local AWS tools and ~1 minute: run by `bash local/test.sh`"]
fn a_short_chaos_run_of_the_real_app_keeps_every_invariant() {
    let (code, report) = local_run(
        "short",
        &format!(
            "--executions 20 --locks demo-lock:3,other-lock:2 --work-seconds 1 --fail-share \
             0.1 --stop-mid-acquire 0.15 --stop-mid-work 0.15 --hold-seconds {HOLD_SECONDS} \
             --drop-events 0.3 --duplicate-events 0.3 --late-events 0.3 --late-by 6 \
             --sweep-every 3 --queue-fallback-seconds 11 --weights 1,2 --rate 5"
        ),
    );
    // Every invariant the run checks (S1, S2, fencing tokens and the start rate per lock, the
    // work under the slot, the probes, L1, S3, L2...) held; what follows is what they do not say.
    let checks = report["checks"].as_array().expect("checks");
    for check in checks {
        assert_eq!(check["ok"], true, "invariant failed: {check:#}");
    }
    assert_eq!(code, 0, "exit status with every invariant held: {report:#}");
    assert_eq!(report["ok"], true);
    // A fifth of the executions ran on the consumer's machine, in a stack of its own deployed
    // after the semaphore's, and its probe (an execution stopped mid-work, freed by the
    // cleanup through the rule's prefix) was among the checks that held.
    assert_eq!(n(&report, "/executions/consumer"), 4, "{report:#}");
    assert!(
        n(&report, "/executions/consumer_succeeded") >= 1,
        "{report:#}"
    );
    assert!(
        checks.iter().any(|c| c["name"] == "consumer stack"),
        "no consumer stack check: {report:#}"
    );
    // Each lock held at its own limit: the default one (its executions' input names no lock)
    // and the one the input names with its limit.
    let locks = report["locks"].as_array().expect("locks");
    assert_eq!(locks.len(), 2, "{report:#}");
    for (lock, (name, limit)) in locks.iter().zip([("demo-lock", 3), ("other-lock", 2)]) {
        assert_eq!(lock["lock"], name);
        assert_eq!(n(lock, "/limit"), limit);
        assert!(n(lock, "/max_holders") >= 1, "{lock:#}");
        assert!(n(lock, "/executions") >= 1, "{lock:#}");
        // The weights held, not only the holders, stayed within the limit on every read (and
        // `used` equalled the holders' weights: an inconsistent read otherwise); the inputs
        // asked for both weights.
        assert!(n(lock, "/max_weight") >= 1, "{lock:#}");
        let asked: u64 = ["/weights/1", "/weights/2"]
            .iter()
            .map(|w| lock.pointer(w).and_then(Value::as_u64).unwrap_or(0))
            .sum();
        assert_eq!(asked, n(lock, "/executions"), "{lock:#}");
        // Its starts kept the rate: at most 5 x window + 1 in any window, 200 ms apart.
        assert!(n(lock, "/rate/max_in_1s") <= 6, "{lock:#}");
        assert!(n(lock, "/rate/max_in_10s") <= 51, "{lock:#}");
        assert!(n(lock, "/rate/min_spacing_ms") >= 200, "{lock:#}");
    }
    // The work ran as child executions, each within its parent's slot, the stopped parents'
    // children included.
    assert!(n(&report, "/work/children") >= 10, "{report:#}");
    assert_eq!(
        n(&report, "/work/ended_under_the_slot"),
        n(&report, "/work/children")
    );
    assert_eq!(report["work"]["violations"], serde_json::json!([]));
    // The redrive guard's path, and the cost of a critical section (issue 26: two transitions
    // are the semaphore's, its acquire and its release state).
    assert_eq!(report["redrive_guard"]["error"], "SemaphoreRedriveRefused");
    assert_eq!(
        report["transitions"]["protected"],
        serde_json::json!(["Acquire slot", "Protected work", "Release slot"]),
        "{report:#}"
    );
    assert_eq!(n(&report, "/transitions/semaphore_share"), 2, "{report:#}");
    assert_eq!(n(&report, "/executions/total"), 20);
    assert_eq!(n(&report, "/executions/unexpected"), 0);
    assert_eq!(n(&report, "/executions/failed_as_planned"), 2);
    // The seed race happened: 3 executions were stopped while their acquire write was held,
    // and every such write was refused (by the fence its cleanup wrote, by the horizon once the
    // fences rotated, or as full) or, its cleanup event dropped, landed and was then reclaimed.
    assert_eq!(
        n(&report, "/executions/stopped_mid_acquire"),
        3,
        "{report:#}"
    );
    let held = n(&report, "/delayed_acquire_writes/held");
    assert_eq!(held, 3);
    assert_eq!(
        n(&report, "/delayed_acquire_writes/refused_by_fence")
            + n(&report, "/delayed_acquire_writes/refused_by_horizon")
            + n(&report, "/delayed_acquire_writes/refused_otherwise")
            + n(&report, "/delayed_acquire_writes/landed"),
        held,
        "{report:#}"
    );
    assert_eq!(n(&report, "/delayed_acquire_writes/other_outcome"), 0);
    // Every second held write was held past two fence windows (the default
    // --long-hold-seconds): one that lands after its fences were rotated out must be refused by
    // the horizon, or S3 fails.
    assert_eq!(n(&report, "/delayed_acquire_writes/held_long"), 1);
    // EventBridge was played: every failed or stopped execution matched the template's rule.
    assert!(n(&report, "/events/matched") >= 2 + 3);
    assert_eq!(
        n(&report, "/sweeper/reclaimed"),
        n(&report, "/sweeper/notices_read_back")
    );
    assert!(n(&report, "/sweeper/sweeps") >= 1);
    // Waiting in line (issue 11): executions waited, each was granted in line order, no
    // newcomer passed the line, and each waiter's slot came from a hand-off or its own check.
    assert!(n(&report, "/line/waiters_granted") >= 5, "{report:#}");
    assert_eq!(
        report["line"]["unexplained"],
        serde_json::json!([]),
        "{report:#}"
    );
    assert!(n(&report, "/line/woken_by_hand_off") >= 1, "{report:#}");
    // Step Functions' quotas (issue 18, items 10 and 14), from the real history of an
    // execution with a ~200 KiB input that waited in line through fallback checks: it
    // acquired, worked and released; each check added at most the events the acquire
    // function's bound on the fallback assumes (a change of the machine that adds events to a
    // check fails here); only the acquire state (each of its attempts: its request is the
    // input) and the work's start carry the input, the release is scheduled with the acquire
    // answer instead (the local server fails a task whose parameters pass 256 KiB).
    let probe = &report["history_probe"];
    assert_eq!(probe["status"], "SUCCEEDED", "{probe:#}");
    assert!(n(probe, "/input_bytes") >= 200 * 1024, "{probe:#}");
    let checks = probe["events_per_fallback_check"]
        .as_array()
        .expect("checks");
    assert!(checks.len() >= 2, "{probe:#}");
    for events in checks {
        assert!(
            events.as_u64().unwrap() <= lambda_common::EVENTS_PER_FALLBACK_CHECK,
            "{probe:#}"
        );
    }
    assert!(n(probe, "/events_outside_checks") <= lambda_common::HISTORY_RESERVE);
    let sizes = probe["task_parameters_bytes"].as_object().expect("sizes");
    for (state, bytes) in sizes {
        let bytes = bytes.as_u64().unwrap();
        if state == "Acquire slot" || state == "Protected work" {
            assert!(bytes > 200 * 1024, "{state}: {bytes} bytes: {probe:#}");
        } else {
            assert!(
                bytes < 8 * 1024,
                "{state} carries the input: {bytes} bytes: {probe:#}"
            );
        }
    }
    for state in ["Acquire slot", "Release slot"] {
        assert!(sizes.contains_key(state), "no {state} task: {probe:#}");
    }
    // The same input with a work that fails: it releases (the failed child's cause, which
    // carries the child's input, is not sent beside the execution input) and fails with the
    // work's own error, not the terminal States.DataLimitExceeded.
    assert_eq!(
        (&probe["failing_status"], &probe["failing_error"]),
        (
            &serde_json::json!("FAILED"),
            &serde_json::json!("WorkFailed")
        ),
        "{probe:#}"
    );
    // The picture: a timeline per lock, then the distributions of the waits and the
    // hand-offs (there were both, as checked above).
    check_html_report(&report, locks.len() + 2);
}

#[test]
#[ignore = "needs the local AWS tools and ~1 minute: run by `bash local/test.sh`"]
fn the_same_chaos_on_gate_locks_keeps_every_invariant() {
    // Both locks in the gate layout (each holding an item of its own): the run's independent
    // reader reads the gates and their holding items, and the seed race is made on the gate's
    // acquire transaction, held in flight past its execution's cleanup. Work of 2 s: a gate's
    // read is three requests (the gate, its holdings, the gate again), paced to a quarter of
    // the server, so on a loaded machine a hold of 1 s can fall between two reads, and "work
    // under the slot" needs each parent seen holding.
    let (code, report) = local_run(
        "gate",
        &format!(
            "--layout gate --executions 20 --locks demo-lock:3,other-lock:2 --work-seconds 2 \
             --fail-share 0.1 --stop-mid-acquire 0.15 --stop-mid-work 0.15 --hold-seconds \
             {HOLD_SECONDS} --drop-events 0.3 --duplicate-events 0.3 --late-events 0.3 \
             --late-by 6 --sweep-every 3 --queue-fallback-seconds 11 --weights 1,2"
        ),
    );
    for check in report["checks"].as_array().expect("checks") {
        assert_eq!(check["ok"], true, "invariant failed: {check:#}");
    }
    assert_eq!(code, 0, "exit status with every invariant held: {report:#}");
    assert_eq!(report["layout"], "gate");
    for lock in report["locks"].as_array().expect("locks") {
        assert!(n(lock, "/max_holders") >= 1, "{lock:#}");
        assert!(n(lock, "/reads") >= 1, "{lock:#}");
        assert_eq!(n(lock, "/inconsistent_reads"), 0, "{lock:#}");
    }
    assert_eq!(n(&report, "/executions/unexpected"), 0);
    assert_eq!(n(&report, "/executions/stopped_mid_acquire"), 3);
    // The gate's acquire writes were held (the proxy knows its transaction), and each was
    // refused by the acquisition's tombstone or the execution's fence, by the horizon, or
    // otherwise, or landed and was reclaimed; none went unexplained.
    let held = n(&report, "/delayed_acquire_writes/held");
    assert_eq!(held, 3, "{report:#}");
    assert_eq!(
        n(&report, "/delayed_acquire_writes/refused_by_fence")
            + n(&report, "/delayed_acquire_writes/refused_by_horizon")
            + n(&report, "/delayed_acquire_writes/refused_otherwise")
            + n(&report, "/delayed_acquire_writes/landed"),
        held,
        "{report:#}"
    );
    assert_eq!(n(&report, "/delayed_acquire_writes/other_outcome"), 0);
    assert!(n(&report, "/line/waiters_granted") >= 1, "{report:#}");
}

#[test]
#[ignore = "needs the local AWS tools and ~1 minute: run by `bash local/test.sh`"]
fn the_same_race_leaks_slots_in_the_original_sample_protocol() {
    // The same held writes; every status event delivered on time (some twice), so the cleanup
    // always runs before the write lands: the leak is the seed race alone (F1).
    let (code, report) = local_run(
        "sample",
        &format!(
            "--protocol sample --executions 20 --locks demo-lock:3 --work-seconds 1 \
             --fail-share 0.1 --stop-mid-acquire 0.1 --stop-mid-work 0.1 --hold-seconds \
             {HOLD_SECONDS} --drop-events 0 --duplicate-events 0.3 --late-events 0"
        ),
    );
    assert_eq!(code, 1, "the sample run must fail its check: {report:#}");
    assert_eq!(report["ok"], false);
    let s2 = report["checks"]
        .as_array()
        .expect("checks")
        .iter()
        .find(|c| {
            c["name"]
                .as_str()
                .is_some_and(|n| n.starts_with("S2 no leak"))
        })
        .expect("an S2 check");
    assert_eq!(s2["ok"], false, "{s2:#}");
    // Both stopped-mid-acquire executions' writes landed after their cleanup: both slots leak.
    assert_eq!(n(&report, "/delayed_acquire_writes/held"), 2);
    assert_eq!(n(&report, "/delayed_acquire_writes/landed"), 2);
    assert_eq!(n(&report, "/leaked_slots_at_end"), 2, "{report:#}");
    // Safety itself held: the sample's flaw is the leak, not over-admission.
    assert!(n(&report, "/locks/0/max_holders") <= 3);
    // Its picture too: its one lock's timeline (the sample has no line to measure).
    check_html_report(&report, 1);
}
