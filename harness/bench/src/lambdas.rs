//! (d) The Lambdas: the arm64 bootstraps' sizes (from `sam build`, if present), and for each
//! handler binary built natively in release: init time (process start to its first
//! `GET /runtime/invocation/next` at the stand-in Runtime API) and peak memory (`VmHWM`) after a
//! few invocations, against the template's 128 MB. Each invocation must do the work it stands
//! for: an acquire takes its slot, a cleanup frees the slot of a real ended execution.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, ensure, Context, Result};
use local_aws::eventbridge::{status_change_event, Ended};
use local_aws::runtime_api::{run_function, Answer};
use semaphore_core::{rfc3339_millis, Clock, DynamoStore, LockName, Semaphore, SystemClock};
use serde::Serialize;
use serde_json::{json, Value};

use crate::common::{execution_arn, start_executions, state_machine, take_slots, uuid};
use crate::stats::{median, ms};

/// The acquire function as the bench's protected machine names it (the cleanup function's
/// `ACQUIRE_FUNCTION_ARN`). The local server has no such function: the task fails after Step
/// Functions recorded it (`TaskScheduled`, payload and all), which is what the cleanup reads.
const ACQUIRE_FUNCTION_ARN: &str =
    "arn:aws:lambda:us-east-1:123456789012:function:semaphore-acquire";

/// How long an execution of the protected machine may take to fail.
const EXECUTION_TIMEOUT: Duration = Duration::from_secs(30);

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

/// The local Step Functions in execution mode, and a machine whose executions ask the acquire
/// function for the lock named in their input (passing the input, as `lock-protected.asl.json`
/// does) and then fail: what the cleanup function is invoked for, with the history it reads.
struct Protected {
    sfn: aws_sdk_sfn::Client,
    machine: String,
}

impl Protected {
    async fn new() -> Result<Self> {
        // Before the machine is made: one made before execution mode is not seen after.
        let sfn = local_aws::sfn::client();
        let definition = local_aws::sfn::acquire_only(ACQUIRE_FUNCTION_ARN);
        let machine =
            state_machine(&sfn, "BenchProtected", &definition, local_aws::sfn::ROLE).await?;
        Ok(Self { sfn, machine })
    }

    /// `n` executions that asked for `lock` and failed, as DescribeExecution tells them.
    async fn failed(&self, lock: &str, n: usize) -> Result<Vec<Ended>> {
        let started = start_executions(&self.sfn, &self.machine, &json!({"lock": lock}), n).await?;
        let mut ended = Vec::with_capacity(n);
        for execution in started {
            let e = local_aws::sfn::wait_ended(&self.sfn, &execution, EXECUTION_TIMEOUT).await?;
            ensure!(
                e.status == "FAILED",
                "{execution} is {}; expected FAILED: its acquire task fails, the local server \
                 has no Lambda",
                e.status
            );
            ended.push(e);
        }
        Ok(ended)
    }
}

/// Whether an answer did the work that is measured. A refused or expired acquire answers too,
/// as does a release that found nothing held, or a cleanup that found nothing to free (the
/// execution running again, no lock in its history, nothing held), but not through that path.
fn did_the_work(function: &str, answer: &Value) -> bool {
    match function {
        "acquire" => answer["acquired"] == Value::Bool(true),
        "release" => answer["released"] == Value::Bool(true),
        // One lock, read from the history, and the one slot the execution held on it, freed.
        "cleanup" => {
            answer["cleaned"] == Value::Bool(true)
                && answer["deferred"] == Value::Bool(false)
                && answer["locks"].as_array().is_some_and(|locks| {
                    locks.len() == 1 && locks[0]["freed"].as_array().is_some_and(|f| f.len() == 1)
                })
        }
        // The sweeper: the first sweep reclaims every slot, the next ones find none; either is
        // the work (a scan, and a DescribeExecution per holder).
        _ => true,
    }
}

/// Runs each handler `starts` times (a cold start each), `invocations` events per start.
pub async fn run(
    bin_dir: &Path,
    topic_arn: &str,
    starts: usize,
    invocations: usize,
) -> Result<Vec<HandlerRun>> {
    let protected = Protected::new().await?;
    let mut results = Vec::new();
    for function in ["acquire", "release", "cleanup", "sweeper"] {
        // A table per function, so that the sweeper's scans see only its own holders.
        let store: DynamoStore = local_aws::fresh_table().await;
        let table = store.table().to_owned();
        let sem = Semaphore::new(store);
        let exe = bin_dir.join(function);
        let binary_bytes = std::fs::metadata(&exe)
            .with_context(|| {
                format!(
                    "{} (build it: cargo build --release -p lambda-{function})",
                    exe.display()
                )
            })?
            .len();
        let mut init_ms = Vec::new();
        let mut rss = Vec::new();
        for start in 0..starts {
            let lock = format!("lambda-{function}-{start}-{}", uuid());
            let (env, events) = prepare(
                function,
                &sem,
                &lock,
                &table,
                topic_arn,
                &protected,
                invocations,
            )
            .await?;
            let exe = exe.clone();
            let run = tokio::task::spawn_blocking(move || {
                let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
                run_function(&exe, &env, events)
            })
            .await
            .with_context(|| format!("running {function} panicked"))?;
            let answered = run
                .answers
                .iter()
                .filter(|a| matches!(a, Answer::Response(_)))
                .count();
            let idle = run
                .answers
                .iter()
                .find(|a| matches!(a, Answer::Response(v) if !did_the_work(function, v)));
            if let Some(answer) = idle {
                bail!(
                    "{function} did not do what is measured (an acquire takes its slot, a \
                     release frees it, a cleanup frees the one slot of its execution): \
                     {answer:?}"
                );
            }
            ensure!(
                answered == invocations,
                "{function}: {answered} of {invocations} invocations answered: {:?}\nstdout: {}\nstderr: {}",
                run.answers,
                run.stdout,
                run.stderr
            );
            init_ms.push(ms(run.init.context("no GET /next seen")?));
            rss.push(run.peak_rss_kib.context("no VmHWM")? as f64 / 1024.0);
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

/// What `function` is started with to do its work `invocations` times on `lock`: its
/// environment and its events (the slots a release or cleanup frees taken first).
async fn prepare(
    function: &'static str,
    sem: &Semaphore<DynamoStore>,
    lock: &str,
    table: &str,
    topic_arn: &str,
    protected: &Protected,
    invocations: usize,
) -> Result<(Vec<(&'static str, String)>, Vec<Value>)> {
    let mut env = vec![("TABLE_NAME", table.to_owned())];
    let holders: Vec<(String, String)> = (0..invocations)
        .map(|n| (execution_arn(function, n), uuid()))
        .collect();
    let lock_name = LockName::new(lock)?;
    let events = match function {
        // Requested now, as a state machine entering its acquire state: the function starts
        // within the horizon (seconds), so every attempt is answered "acquired".
        // The payload of the acquire state (its task token one Step Functions does not know:
        // the function's own SendTaskSuccess fails and is logged, its answer still returns).
        "acquire" => holders
            .iter()
            .enumerate()
            .map(|(n, (h, _))| {
                json!({"request": {"lock": lock, "limit": 5}, "execution": h,
                       "redrive_count": 0,
                       "state": {"EnteredTime": rfc3339_millis(SystemClock.now_ms()),
                                 "RetryCount": 0},
                       "task_token": format!("bench-token-{n}")})
            })
            .collect(),
        // The payload of the release state: the acquire answer.
        "release" => {
            let tokens = take_slots(sem, &lock_name, &holders).await?;
            holders
                .iter()
                .zip(tokens)
                .map(|((h, a), token)| {
                    json!({"semaphore": {"lock": lock, "holder": h, "acquisition": a,
                                         "token": token}})
                })
                .collect()
        }
        "cleanup" => {
            // Real executions that asked for the lock and failed, each holding the slot its
            // acquire took: the function reads the lock from each one's history
            // (DescribeExecution, GetExecutionHistory), fences it and frees its slot.
            let ended = protected.failed(lock, invocations).await?;
            let holders: Vec<(String, String)> =
                ended.iter().map(|e| (e.arn.clone(), uuid())).collect();
            take_slots(sem, &lock_name, &holders).await?;
            env.push(("ACQUIRE_FUNCTION_ARN", ACQUIRE_FUNCTION_ARN.to_owned()));
            // The documented "Execution Status Change" event of each, as EventBridge delivers it.
            ended
                .iter()
                .map(|e| status_change_event(e, "us-east-1", "123456789012", &uuid()))
                .collect()
        }
        _ => {
            // Holders whose executions do not exist: the first sweep reclaims them all (a
            // DescribeExecution, a cleanup and an SNS notice each), the next ones find none.
            take_slots(sem, &lock_name, &holders).await?;
            env.push(("TOPIC_ARN", topic_arn.to_owned()));
            (0..invocations)
                .map(|_| json!({"source": "aws.events"}))
                .collect()
        }
    };
    Ok((env, events))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_an_answer_that_did_the_measured_work_counts() {
        assert!(did_the_work("acquire", &json!({"acquired": true})));
        assert!(!did_the_work(
            "acquire",
            &json!({"acquired": false, "outcome": "full"})
        ));
        let cleaned = json!({
            "cleaned": true, "deferred": false,
            "locks": [{"lock": "l", "freed": [{"acquisition": "a", "token": 1}], "count": 0}]
        });
        assert!(did_the_work("cleanup", &cleaned));
        // Still running (nothing done), no acquire in the history, nothing held, work running.
        for idle in [
            json!({"cleaned": false, "deferred": false, "locks": [], "note": "running again"}),
            json!({"cleaned": true, "deferred": false, "locks": []}),
            json!({"cleaned": true, "deferred": false, "locks": [{"lock": "l", "freed": []}]}),
            json!({"cleaned": false, "deferred": true, "locks": [{"lock": "l", "freed": []}]}),
        ] {
            assert!(!did_the_work("cleanup", &idle), "{idle}");
        }
        assert!(did_the_work("release", &json!({"released": true})));
        assert!(!did_the_work(
            "release",
            &json!({"released": false, "outcome": "not_held"})
        ));
    }
}
