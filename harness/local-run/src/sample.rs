//! TEST-ONLY sample mode: the original AWS sample's protocol under the same chaos, to show
//! that the run really catches the leak the seed describes.
//!
//! The sample's protocol (`harness/local-aws/src/sample.rs`: a counter plus one `holder:<execution>`
//! attribute, a conditional `UpdateItem` to acquire, a decrement to release, a read-then-release
//! cleanup) runs directly from here against the same local table, through the same delaying
//! proxy, with the same stops and the same imperfect status events; there is no sweeper, as in
//! the sample. Executions are tasks of this process rather than Step Functions executions: what
//! is compared is the protocol, and the sample's state machines and Lambdas are not part of
//! this project.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use local_aws::sample::{Execution, Sample, Status};
use local_aws::server::sdk_config_for;

use crate::driver::{self, Setup, Watch};
use crate::progress::{phase, Progress};
use crate::report::{ExecutionCounts, Report};
use crate::Role;
use local_aws::delay::{DelayProxy, WriteKind};
use local_aws::eventbridge::Target;
use local_aws::poller::{now_ms, Layout, LockItems};
use local_aws::stack::{Deployed, Stack};

pub async fn run(setup: &Setup<'_>) -> anyhow::Result<Report> {
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
    let deployed = Deployed::deploy(
        &python,
        root,
        &endpoint,
        &stack,
        &BTreeMap::new(),
        &BTreeMap::new(),
    )?;
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
    let machines = driver::Machines {
        protected: &machine,
        consumer: None,
    };
    let planned = driver::plan_executions(setup, &stack, &machines, &specs, &proxy);
    let n = planned.len();
    let executions: Vec<Arc<Execution>> = planned
        .iter()
        .map(|p| {
            Arc::new(Execution {
                arn: p.arn.clone(),
                name: p.name.clone(),
                fail: p.role == Role::Fail,
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
        holdings_table: None,
        layout: Layout::Sample,
    };
    let target = Target::Sample {
        protocol: direct.clone(),
        lock: lock.clone(),
    };
    let (watch, ended_tx) = Watch::start(setup, &stack, item, specs.clone(), proxy, None, target);

    // A stop is an ABORTED status event; the execution's task sees the flag and ends.
    let stopped_as = {
        let ended_tx = ended_tx.clone();
        let role_of = planned.iter().map(|p| (p.arn.clone(), p.role)).collect();
        watch.spawn_stopper(held_rx, role_of, seed, move |arn, _, delay| {
            let Some(e) = by_arn.get(&arn).cloned() else {
                return;
            };
            let ended_tx = ended_tx.clone();
            tokio::spawn(async move {
                tokio::time::sleep(delay).await;
                if !e.stopped.swap(true, Ordering::SeqCst) {
                    let _ = ended_tx.send(e.ended("ABORTED", None));
                }
            });
        })
    };

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
            let outcome = e
                .clone()
                .run(
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
    for (e, p) in executions.iter().zip(&planned) {
        let (status, error) = done
            .get(&e.arn)
            .cloned()
            .unwrap_or_else(|| ("RUNNING".to_owned(), None));
        let was_stopped = e.stopped.load(Ordering::SeqCst);
        let role = stopped_as
            .lock()
            .expect("stopped")
            .get(&e.arn)
            .copied()
            .unwrap_or(p.role);
        if !counts.count_planned(role, &status, error.as_deref(), was_stopped) {
            counts.unexpected_examples.push(format!(
                "{} ({role:?}): {status} {}",
                e.name,
                error.unwrap_or_default()
            ));
        }
    }
    report.executions = counts;
    report.locks[0].succeeded = report.executions.succeeded;

    report.lock_checks();
    report.progress_check(false);
    report.finish();
    Ok(report)
}
