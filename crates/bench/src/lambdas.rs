//! (d) The Lambdas: the arm64 bootstraps' sizes (from `sam build`, if present), and for each
//! handler binary built natively in release: init time (process start to its first
//! `GET /runtime/invocation/next` at the stand-in Runtime API) and peak memory (`VmHWM`) after a
//! few invocations, against the template's 128 MB.

use std::path::{Path, PathBuf};

use semaphore_core::{
    rfc3339_millis, AcquisitionId, Clock, DynamoStore, HolderId, Identity, Limit, LockName,
    Semaphore, SystemClock,
};
use semaphore_tests::runtime_api::{run_function, Answer};
use serde::Serialize;
use serde_json::{json, Value};

use crate::common::{execution_arn, uuid};
use crate::stats::{median, ms};

pub const MEMORY_SIZE_MB: f64 = 128.0;

#[derive(Debug, Clone, Serialize)]
pub struct Bootstrap {
    pub function: String,
    pub path: String,
    pub bytes: u64,
    pub mib: f64,
    /// ELF machine: "aarch64", "x86_64" or the number.
    pub machine: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct HandlerRun {
    pub function: &'static str,
    pub binary_bytes: u64,
    pub starts: usize,
    pub invocations_per_start: usize,
    pub init_ms: Vec<f64>,
    pub init_median_ms: f64,
    pub peak_rss_mib: Vec<f64>,
    pub peak_rss_median_mib: f64,
    pub peak_rss_max_mib: f64,
    pub headroom_of_128_mb: f64,
}

fn elf_machine(path: &Path) -> String {
    let Ok(bytes) = std::fs::read(path) else {
        return "unreadable".to_owned();
    };
    if bytes.len() < 20 || &bytes[..4] != b"\x7fELF" {
        return "not ELF".to_owned();
    }
    match u16::from_le_bytes([bytes[18], bytes[19]]) {
        0xB7 => "aarch64".to_owned(),
        0x3E => "x86_64".to_owned(),
        other => format!("e_machine {other:#x}"),
    }
}

/// `.aws-sam/build/<Function>/bootstrap` under the repository, as `.ci/sam-build.sh` leaves them.
pub fn bootstraps(repo: &Path) -> Vec<Bootstrap> {
    let mut found = Vec::new();
    let Ok(entries) = std::fs::read_dir(repo.join(".aws-sam/build")) else {
        return found;
    };
    for entry in entries.flatten() {
        let path = entry.path().join("bootstrap");
        if let Ok(meta) = std::fs::metadata(&path) {
            found.push(Bootstrap {
                function: entry.file_name().to_string_lossy().into_owned(),
                path: path.display().to_string(),
                bytes: meta.len(),
                mib: meta.len() as f64 / (1024.0 * 1024.0),
                machine: elf_machine(&path),
            });
        }
    }
    found.sort_by(|a, b| a.function.cmp(&b.function));
    found
}

/// Where the natively built handler binaries are: next to this bench binary (the same
/// `target/release`), unless told otherwise.
pub fn default_bin_dir() -> Option<PathBuf> {
    std::env::current_exe()
        .ok()?
        .parent()
        .map(Path::to_path_buf)
}

struct Setup {
    function: &'static str,
    env: Vec<(String, String)>,
    events: Vec<Value>,
}

fn status_change(execution: &str) -> Value {
    json!({
        "version": "0",
        "id": uuid(),
        "detail-type": "Step Functions Execution Status Change",
        "source": "aws.states",
        "account": "123456789012",
        "time": "2026-01-01T00:00:00Z",
        "region": "us-east-1",
        "resources": [execution],
        "detail": {
            "executionArn": execution,
            "stateMachineArn": "arn:aws:states:us-east-1:123456789012:stateMachine:LockProtected",
            "name": "run",
            "status": "ABORTED",
            "startDate": 1_767_225_600_000u64,
            "stopDate": 1_767_225_660_000u64,
            "input": "{}",
            "inputDetails": {"included": true},
            "output": null,
            "outputDetails": null,
            "error": null,
            "cause": null
        }
    })
}

/// Runs each handler `starts` times (a cold start each), `invocations` events per start.
pub async fn run(
    bin_dir: &Path,
    topic_arn: &str,
    starts: usize,
    invocations: usize,
) -> Result<Vec<HandlerRun>, String> {
    let mut results = Vec::new();
    for function in ["acquire", "release", "cleanup", "sweeper"] {
        // A table per function, so that the sweeper's scans see only its own holders.
        let store: DynamoStore = semaphore_tests::fresh_table().await;
        let table = store.table().to_owned();
        let sem = Semaphore::new(store);
        let exe = bin_dir.join(function);
        let binary_bytes = std::fs::metadata(&exe)
            .map_err(|e| {
                format!(
                    "{}: {e} (build it: cargo build --release -p lambda-{function})",
                    exe.display()
                )
            })?
            .len();
        let mut init_ms = Vec::new();
        let mut rss = Vec::new();
        for start in 0..starts {
            let lock = format!("lambda-{function}-{start}-{}", uuid());
            let setup = prepare(function, &sem, &lock, &table, topic_arn, invocations).await?;
            let exe = exe.clone();
            let run = tokio::task::spawn_blocking(move || {
                let env: Vec<(&str, &str)> = setup
                    .env
                    .iter()
                    .map(|(k, v)| (k.as_str(), v.as_str()))
                    .collect();
                (setup.function, run_function(&exe, &env, setup.events))
            })
            .await
            .map_err(|e| e.to_string())?;
            let (function, run) = run;
            let answered = run
                .answers
                .iter()
                .filter(|a| matches!(a, Answer::Response(_)))
                .count();
            // A refused or expired acquire answers too, but did not do what is measured.
            let refused = run.answers.iter().find(|a| {
                matches!(a, Answer::Response(v)
                    if function == "acquire" && v["acquired"] != Value::Bool(true))
            });
            if let Some(answer) = refused {
                return Err(format!("acquire did not take its slot: {answer:?}"));
            }
            if answered != invocations {
                return Err(format!(
                    "{function}: {answered} of {invocations} invocations answered: {:?}\nstdout: {}\nstderr: {}",
                    run.answers, run.stdout, run.stderr
                ));
            }
            init_ms.push(ms(run.init.ok_or("no GET /next seen")?));
            rss.push(run.peak_rss_kib.ok_or("no VmHWM")? as f64 / 1024.0);
        }
        let rss_max = rss.iter().copied().fold(0.0, f64::max);
        results.push(HandlerRun {
            function,
            binary_bytes,
            starts,
            invocations_per_start: invocations,
            init_median_ms: median(&init_ms).unwrap_or(f64::NAN),
            init_ms,
            peak_rss_median_mib: median(&rss).unwrap_or(f64::NAN),
            peak_rss_max_mib: rss_max,
            headroom_of_128_mb: MEMORY_SIZE_MB / rss_max,
            peak_rss_mib: rss,
        });
    }
    Ok(results)
}

async fn prepare(
    function: &'static str,
    sem: &Semaphore<DynamoStore>,
    lock: &str,
    table: &str,
    topic_arn: &str,
    invocations: usize,
) -> Result<Setup, String> {
    let mut env = vec![("TABLE_NAME".to_owned(), table.to_owned())];
    let holders: Vec<(String, String)> = (0..invocations)
        .map(|n| (execution_arn(function, n), uuid()))
        .collect();
    let lock_name = LockName::new(lock).map_err(|e| e.to_string())?;
    let take_slots = || async {
        for (holder, acquisition) in &holders {
            let who = Identity::new(
                HolderId::new(holder.as_str()).map_err(|e| e.to_string())?,
                AcquisitionId::new(acquisition.as_str()).map_err(|e| e.to_string())?,
            );
            sem.acquire(
                &lock_name,
                &who,
                Limit::new(1000).map_err(|e| e.to_string())?,
            )
            .await
            .map_err(|e| e.to_string())?;
        }
        Ok::<(), String>(())
    };
    let events = match function {
        // Requested now, as a state machine entering its acquire state: the function starts
        // within the horizon (seconds), so every attempt is answered "acquired".
        "acquire" => holders
            .iter()
            .map(|(h, a)| {
                json!({"lock": lock, "limit": 5, "holder": h, "acquisition": a,
                       "requested_at": rfc3339_millis(SystemClock.now_ms())})
            })
            .collect(),
        "release" => {
            take_slots().await?;
            holders
                .iter()
                .map(|(h, a)| json!({"lock": lock, "holder": h, "acquisition": a}))
                .collect()
        }
        "cleanup" => {
            take_slots().await?;
            env.push(("LOCK_NAMES".to_owned(), lock.to_owned()));
            holders.iter().map(|(h, _)| status_change(h)).collect()
        }
        _ => {
            // Holders whose executions do not exist: the first sweep reclaims them all (a
            // DescribeExecution, a cleanup and an SNS notice each), the next ones find none.
            take_slots().await?;
            env.push(("TOPIC_ARN".to_owned(), topic_arn.to_owned()));
            (0..invocations)
                .map(|_| json!({"source": "aws.events"}))
                .collect()
        }
    };
    Ok(Setup {
        function,
        env,
        events,
    })
}
