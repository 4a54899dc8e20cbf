//! TEST-ONLY sample mode: the original AWS sample's protocol under the same chaos, to show
//! that the run really catches the leak the seed describes.
//!
//! The sample's protocol (`crates/local-aws/src/sample.rs`: a counter plus one `holder:<execution>`
//! attribute, a conditional `UpdateItem` to acquire, a decrement to release, a read-then-release
//! cleanup) runs directly from here against the same local table, through the same delaying
//! proxy, with the same stops and the same imperfect status events; there is no sweeper, as in
//! the sample. Executions are tasks of this process rather than Step Functions executions: what
//! is compared is the protocol, and the sample's state machines and Lambdas are not part of
//! this project.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use local_aws::sample::Sample;
use local_aws::server::sdk_config_for;
use tokio::sync::mpsc;

use crate::driver::{self, Setup, Watch};
use crate::progress::{phase, Progress};
use crate::report::{ExecutionCounts, Report};
use crate::Role;
use local_aws::delay::{DelayProxy, WriteKind};
use local_aws::eventbridge::{Ended, Target};
use local_aws::poller::{now_ms, Layout, LockItems};
use local_aws::stack::{Deployed, Stack};

/// How long a sample execution waits for a slot before it gives up (the sample has no cap;
/// a run has to end).
const WAIT_CAP: Duration = Duration::from_secs(30);

/// An execution's end: its status and error.
type Status = (String, Option<String>);

struct Execution {
    arn: String,
    name: String,
    role: Role,
    stopped: AtomicBool,
    start_ms: i64,
}

impl Execution {
    fn ended(&self, status: &str, error: Option<&str>) -> Ended {
        Ended {
            arn: self.arn.clone(),
            machine_arn: self
                .arn
                .replace(":execution:", ":stateMachine:")
                .rsplit_once(':')
                .map(|(m, _)| m.to_owned())
                .unwrap_or_default(),
            name: self.name.clone(),
            status: status.to_owned(),
            start_ms: self.start_ms,
            stop_ms: now_ms(),
            input: Some("{}".to_owned()),
            error: error.map(str::to_owned),
            cause: None,
        }
    }
}

/// One execution of the sample's lock-protected machine; returns its status and error.
#[allow(clippy::too_many_arguments)]
async fn execute(
    e: Arc<Execution>,
    acquirer: Arc<Sample>,
    direct: Arc<Sample>,
    lock: String,
    limit: i64,
    work: Duration,
    ended: mpsc::UnboundedSender<Ended>,
    seed: u64,
) -> Status {
    let mut rng = fastrand::Rng::with_seed(seed);
    let started = Instant::now();
    loop {
        // A zombie: the call goes on even when the execution was stopped meanwhile.
        let acquired = acquirer.acquire(&lock, &e.arn, limit).await;
        if e.stopped.load(Ordering::SeqCst) {
            return ("ABORTED".to_owned(), None);
        }
        if acquired {
            break;
        }
        if started.elapsed() >= WAIT_CAP {
            let _ = ended.send(e.ended("FAILED", Some("SemaphoreWaitTimeout")));
            return ("FAILED".to_owned(), Some("SemaphoreWaitTimeout".to_owned()));
        }
        tokio::time::sleep(Duration::from_millis(rng.u64(500..2000))).await;
    }
    let work_end = Instant::now() + work;
    while Instant::now() < work_end {
        if e.stopped.load(Ordering::SeqCst) {
            return ("ABORTED".to_owned(), None);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    if e.role == Role::Fail {
        // The sample's machine ends FAILED; its cleanup machine is what frees the slot.
        let _ = ended.send(e.ended("FAILED", Some("WorkFailed")));
        return ("FAILED".to_owned(), Some("WorkFailed".to_owned()));
    }
    direct.release(&lock, &e.arn).await;
    ("SUCCEEDED".to_owned(), None)
}

pub async fn run(setup: &Setup<'_>) -> Result<Report, String> {
    let (args, root, dir, seed) = (setup.args, setup.root, setup.dir, setup.seed);
    let stack = Stack::default();

    phase(
        "starting the local AWS on 127.0.0.1 (the stack's table only: the sample's protocol runs from here)",
    );
    let python = args
        .python
        .clone()
        .unwrap_or_else(|| root.join(".venv/bin/python"));
    let endpoint = setup.supervisor.start_server(&python, dir, None)?;
    let deployed = Deployed::deploy(&python, root, &endpoint, &stack, &BTreeMap::new())?;
    // The sample takes one lock: the run's first, under the template's LockName.
    let mut spec = args.locks()?.remove(0);
    spec.name = deployed.parameter("LockName")?.to_owned();
    let lock = spec.name.clone();
    let limit = i64::from(spec.limit);
    let (proxy, held_rx) =
        DelayProxy::start(&endpoint, WriteKind::Sample, args.hold_for(), None).await?;
    eprintln!(
        "    moto server    {endpoint}; delay proxy {}",
        proxy.endpoint()
    );

    let sdk = sdk_config_for(&endpoint, &stack.region);
    let ddb = aws_sdk_dynamodb::Client::new(&sdk);
    let table = deployed.table("SemaphoreTable")?.to_owned();
    let direct = Arc::new(Sample {
        client: ddb.clone(),
        table: table.clone(),
    });
    let acquirer = Arc::new(Sample {
        client: aws_sdk_dynamodb::Client::new(&sdk_config_for(&proxy.endpoint(), &stack.region)),
        table: table.clone(),
    });
    direct.init(&lock).await;

    let machine = format!("{}-sample-lock-protected", stack.name);
    let specs = vec![spec];
    let planned = driver::plan_executions(setup, &stack, &machine, &specs, &proxy);
    let n = planned.len();
    let executions: Vec<Arc<Execution>> = planned
        .iter()
        .map(|p| {
            Arc::new(Execution {
                arn: p.arn.clone(),
                name: p.name.clone(),
                role: p.role,
                stopped: AtomicBool::new(false),
                start_ms: now_ms(),
            })
        })
        .collect();
    let by_arn: HashMap<String, Arc<Execution>> = executions
        .iter()
        .map(|e| (e.arn.clone(), e.clone()))
        .collect();

    let item = LockItems {
        client: ddb,
        table,
        layout: Layout::Sample,
    };
    let target = Target::Sample {
        protocol: direct.clone(),
        lock: lock.clone(),
    };
    let (watch, ended_tx) = Watch::start(setup, &stack, item, specs.clone(), proxy, None, target);

    // A stop is an ABORTED status event; the execution's task sees the flag and ends.
    {
        let ended_tx = ended_tx.clone();
        let role_of = planned.iter().map(|p| (p.arn.clone(), p.role)).collect();
        watch.spawn_stopper(held_rx, role_of, seed, move |arn, _, delay| {
            let Some(e) = by_arn.get(&arn).cloned() else {
                return;
            };
            if e.stopped.load(Ordering::SeqCst) {
                return;
            }
            let ended_tx = ended_tx.clone();
            tokio::spawn(async move {
                tokio::time::sleep(delay).await;
                if !e.stopped.swap(true, Ordering::SeqCst) {
                    let _ = ended_tx.send(e.ended("ABORTED", None));
                }
            });
        });
    }

    phase(&format!(
        "running {n} executions of the SAMPLE's protocol (limit {limit}, {} s of work each)",
        args.work_seconds
    ));
    let done: Arc<Mutex<BTreeMap<String, Status>>> = Arc::default();
    let mut tasks = Vec::new();
    for (i, e) in executions.iter().enumerate() {
        let (e, acquirer, direct, lock, ended_tx, done) = (
            e.clone(),
            acquirer.clone(),
            direct.clone(),
            lock.clone(),
            ended_tx.clone(),
            done.clone(),
        );
        let work = Duration::from_secs(u64::from(args.work_seconds));
        tasks.push(tokio::spawn(async move {
            let outcome = execute(
                e.clone(),
                acquirer,
                direct,
                lock,
                limit,
                work,
                ended_tx,
                seed.wrapping_add(i as u64),
            )
            .await;
            done.lock().expect("done").insert(e.arn.clone(), outcome);
        }));
    }
    drop(ended_tx);
    let progress = {
        let (done, poll, proxy) = (
            done.clone(),
            watch.poller.stats.clone(),
            watch.proxy.clone(),
        );
        let stopped_by = executions.clone();
        let lock = lock.clone();
        Progress::start(move || {
            // A stopped execution is done for its caller even if its zombie call is in flight.
            let finished = stopped_by
                .iter()
                .filter(|e| e.stopped.load(Ordering::SeqCst))
                .count()
                + done
                    .lock()
                    .expect("done")
                    .values()
                    .filter(|(s, _)| s != "ABORTED")
                    .count();
            let poll = poll.lock().expect("poll").lock(&lock);
            format!(
                "done {}/{n} | holders {} (max {}/{limit}) | held writes {} landed {}",
                finished.min(n),
                poll.holders_now,
                poll.max_holders,
                proxy.stats().held,
                proxy.stats().landed
            )
        })
    };
    for task in tasks {
        let _ = task.await;
    }
    let holders_when_all_ended = watch.holders_after_the_last_write().await;
    watch
        .settle(
            args,
            Duration::from_secs(30),
            Duration::from_millis(200),
            // The sample's cleanup runs inside its delivery: nothing more to wait for.
            || async { Ok(true) },
        )
        .await?;
    let mut report = watch
        .finish(progress, setup, &planned, &holders_when_all_ended)
        .await?;
    let done = done.lock().expect("done").clone();
    let mut counts = ExecutionCounts {
        total: n,
        ..ExecutionCounts::default()
    };
    for e in &executions {
        let (status, error) = done
            .get(&e.arn)
            .cloned()
            .unwrap_or_else(|| ("RUNNING".to_owned(), None));
        let was_stopped = e.stopped.load(Ordering::SeqCst);
        if !counts.count_planned(e.role, &status, error.as_deref(), was_stopped) {
            counts.unexpected_examples.push(format!(
                "{} ({:?}): {status} {}",
                e.name,
                e.role,
                error.unwrap_or_default()
            ));
        }
    }
    report.executions = counts;
    report.locks[0].succeeded = report.executions.succeeded;

    let l = report.locks[0].clone();
    report.check(
        "S1 safety",
        l.max_holders <= l.limit && l.inconsistent_reads == 0,
        format!(
            "at most {} of {} slots held at once over {} reads{}",
            l.max_holders,
            l.limit,
            l.reads,
            l.first_inconsistency
                .as_ref()
                .map(|m| format!(" EXCEPT: {m}"))
                .unwrap_or_default()
        ),
    );
    report.check(
        "S2 no leak",
        report.leaked_slots_at_end == 0,
        format!(
            "{} slots held at the end by executions that have all ended (no sweeper in the \
             sample){}",
            report.leaked_slots_at_end,
            if report.delayed_acquire_writes.landed > 0 {
                format!(
                    "; {} delayed acquire writes landed after their execution was stopped",
                    report.delayed_acquire_writes.landed
                )
            } else {
                String::new()
            }
        ),
    );
    report.check(
        "L1 progress",
        report.executions.unexpected == 0,
        format!(
            "{} of {n} executions ended as planned",
            n - report.executions.unexpected
        ),
    );
    report.finish();
    Ok(report)
}
