//! TEST-ONLY reference mode: the original AWS sample's protocol under the same chaos, to show
//! that the run really catches the leak the seed describes.
//!
//! The sample's protocol (`tests/src/reference.rs`: a counter plus one `holder:<execution>`
//! attribute, a conditional `UpdateItem` to acquire, a decrement to release, a read-then-release
//! cleanup) runs directly from here against the same local table, through the same delaying
//! proxy, with the same stops and the same imperfect status events; there is no sweeper, as in
//! the sample. Executions are tasks of this process rather than Step Functions executions: what
//! is compared is the protocol, and the sample's state machines and Lambdas are not part of
//! this project.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use aws_sdk_dynamodb::types::{
    AttributeDefinition, AttributeValue, BillingMode, KeySchemaElement, KeyType,
    ScalarAttributeType,
};
use semaphore_tests::reference::SampleProtocol;
use tokio::sync::mpsc;

use crate::events::{Ended, Player, Target};
use crate::local_aws::{self, sdk_config};
use crate::poller::{now_ms, Layout, Poller};
use crate::procs::Supervisor;
use crate::progress::{phase, Progress};
use crate::proxy::{DelayProxy, WriteKind};
use crate::report::{ExecutionCounts, Report};
use crate::template::{Stack, Template};
use crate::{plan_roles, Args, Role};

/// How long a reference execution waits for a slot before it gives up (the sample has no cap;
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
    acquirer: Arc<SampleProtocol>,
    direct: Arc<SampleProtocol>,
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

pub async fn run(
    args: &Args,
    root: &Path,
    dir: &Path,
    seed: u64,
    supervisor: &Supervisor,
) -> Result<Report, String> {
    let stack = Stack::default();
    let template = Template::load(&root.join("template.yaml"), stack.clone(), &BTreeMap::new())?;
    let plan = template.plan()?;
    let lock = plan
        .parameters
        .get("LockName")
        .cloned()
        .ok_or("template.yaml has no LockName parameter")?;
    let limit = i64::from(args.limit);

    phase(
        "starting the local AWS on 127.0.0.1 (DynamoDB only: the sample's protocol runs from here)",
    );
    let python = args
        .python
        .clone()
        .unwrap_or_else(|| root.join(".venv/bin/python"));
    let endpoint = local_aws::start_server(supervisor, &python, root, dir, None)?;
    let upstream = endpoint
        .trim_start_matches("http://")
        .parse()
        .map_err(|e| format!("{endpoint}: {e}"))?;
    let hold_for = Duration::from_secs_f64(args.hold_seconds);
    let (proxy, mut held_rx) = DelayProxy::start(upstream, WriteKind::Reference, hold_for).await?;
    let proxy = Arc::new(proxy);
    eprintln!(
        "    moto server    {endpoint}; delay proxy {}",
        proxy.endpoint()
    );

    let sdk = sdk_config(&endpoint, &stack.region);
    let ddb = aws_sdk_dynamodb::Client::new(&sdk);
    let t = &plan.table;
    let mut create = ddb
        .create_table()
        .table_name(&t.name)
        .billing_mode(BillingMode::from(t.billing_mode.as_str()));
    for (name, kind) in &t.attributes {
        create = create.attribute_definitions(
            AttributeDefinition::builder()
                .attribute_name(name)
                .attribute_type(ScalarAttributeType::from(kind.as_str()))
                .build()
                .map_err(|e| e.to_string())?,
        );
    }
    for (name, kind) in &t.key_schema {
        create = create.key_schema(
            KeySchemaElement::builder()
                .attribute_name(name)
                .key_type(KeyType::from(kind.as_str()))
                .build()
                .map_err(|e| e.to_string())?,
        );
    }
    create.send().await.map_err(|e| {
        format!(
            "CreateTable: {}",
            aws_sdk_dynamodb::error::DisplayErrorContext(e)
        )
    })?;
    let direct = Arc::new(SampleProtocol {
        client: ddb.clone(),
        table: t.name.clone(),
    });
    let acquirer = Arc::new(SampleProtocol {
        client: aws_sdk_dynamodb::Client::new(&sdk_config(&proxy.endpoint(), &stack.region)),
        table: t.name.clone(),
    });
    direct.init(&lock).await;

    let mut rng = fastrand::Rng::with_seed(seed);
    let n = args.executions as usize;
    let roles = plan_roles(n, args.shares(), &mut rng);
    let executions: Vec<Arc<Execution>> = roles
        .iter()
        .enumerate()
        .map(|(i, role)| {
            let name = format!("run-{:03}", i + 1);
            Arc::new(Execution {
                arn: format!(
                    "arn:{}:states:{}:{}:execution:{}-reference-lock-protected:{name}",
                    stack.partition, stack.region, stack.account, stack.name
                ),
                name,
                role: *role,
                stopped: AtomicBool::new(false),
                start_ms: now_ms(),
            })
        })
        .collect();
    let by_arn: HashMap<String, Arc<Execution>> = executions
        .iter()
        .map(|e| (e.arn.clone(), e.clone()))
        .collect();
    for e in &executions {
        if e.role == Role::StopMidAcquire {
            proxy.target(&e.arn);
        }
    }

    let poller = Poller::start(
        ddb.clone(),
        t.name.clone(),
        lock.clone(),
        Layout::Reference,
        Duration::from_millis(100),
    );
    let (ended_tx, ended_rx) = mpsc::unbounded_channel();
    let player = Player::start(
        ended_rx,
        None,
        Target::Reference {
            protocol: direct.clone(),
            lock: lock.clone(),
        },
        args.event_chaos(),
        seed ^ 0x5eed,
        stack.region.clone(),
        stack.account.clone(),
    );

    // The stopper, as in the real run: mid-acquire when the proxy holds the write, mid-work
    // when the poller sees the execution hold a slot. A stop is an ABORTED status event.
    {
        let (by_arn, ended_tx) = (by_arn.clone(), ended_tx.clone());
        let mut holders = poller.holders.clone();
        tokio::spawn(async move {
            let mut rng = fastrand::Rng::with_seed(seed ^ 0x570b);
            loop {
                let candidates: Vec<(String, Role, Duration)> = tokio::select! {
                    held = held_rx.recv() => match held {
                        Some(arn) => vec![(arn, Role::StopMidAcquire, Duration::from_millis(50))],
                        None => break,
                    },
                    changed = holders.changed() => {
                        if changed.is_err() { break; }
                        let now: Vec<String> = holders.borrow_and_update().iter().cloned().collect();
                        now.into_iter()
                            .map(|arn| (arn, Role::StopMidWork, Duration::from_millis(rng.u64(100..600))))
                            .collect()
                    }
                };
                for (arn, role, delay) in candidates {
                    let Some(e) = by_arn.get(&arn).cloned() else {
                        continue;
                    };
                    if e.role != role || e.stopped.load(Ordering::SeqCst) {
                        continue;
                    }
                    let ended_tx = ended_tx.clone();
                    tokio::spawn(async move {
                        tokio::time::sleep(delay).await;
                        if !e.stopped.swap(true, Ordering::SeqCst) {
                            let _ = ended_tx.send(e.ended("ABORTED", None));
                        }
                    });
                }
            }
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
        let (done, poll, proxy) = (done.clone(), poller.stats.clone(), proxy.clone());
        let stopped_by = executions.clone();
        let limit = args.limit;
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
            let poll = poll.lock().expect("poll").clone();
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
    // One more read by the poller after the last write.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let holders_when_all_ended = poller.stats().holders_now;
    let settle_deadline =
        Instant::now() + hold_for + args.event_chaos().late_by + Duration::from_secs(30);
    loop {
        let p = proxy.stats();
        let settled = p.held == p.landed + p.rejected_stale + p.other_outcome
            && player.pending.load(Ordering::SeqCst) == 0;
        if settled || Instant::now() >= settle_deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    progress.finish().await;
    poller.stop();

    let mut report = Report {
        protocol: "reference".to_owned(),
        seed,
        lock: lock.clone(),
        limit: args.limit as usize,
        hold_seconds: args.hold_seconds,
        holders_when_all_ended,
        logs: dir.display().to_string(),
        ..Report::default()
    };
    let item = ddb
        .get_item()
        .table_name(&t.name)
        .key("lock", AttributeValue::S(lock.clone()))
        .consistent_read(true)
        .send()
        .await
        .map_err(|e| {
            format!(
                "GetItem: {}",
                aws_sdk_dynamodb::error::DisplayErrorContext(e)
            )
        })?;
    let (leaked, _) = item
        .item
        .as_ref()
        .map(|i| crate::poller::decode(Layout::Reference, i))
        .unwrap_or_default();
    report.leaked_slots_at_end = leaked.len();
    report.leaked_holders = leaked;

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
        match (e.role, status.as_str(), error.as_deref()) {
            (Role::Fail, "FAILED", Some("WorkFailed")) => counts.failed_as_planned += 1,
            (Role::StopMidAcquire, "ABORTED", _) => counts.stopped_mid_acquire += 1,
            (Role::StopMidWork, "ABORTED", _) => counts.stopped_mid_work += 1,
            (Role::Normal | Role::StopMidWork, "SUCCEEDED", _) => counts.succeeded += 1,
            _ => {
                counts.unexpected += 1;
                counts.unexpected_examples.push(format!(
                    "{} ({:?}): {status} {}",
                    e.name,
                    e.role,
                    error.unwrap_or_default()
                ));
            }
        }
    }
    report.executions = counts;
    let poll = poller.stats();
    report.max_concurrent_holders = poll.max_holders;
    report.poller = poll;
    report.events = player.stats();
    report.delayed_acquire_writes = proxy.stats();

    let limit = args.limit as usize;
    report.check(
        "S1 safety",
        report.max_concurrent_holders <= limit && report.poller.count_mismatches == 0,
        format!(
            "at most {} of {limit} slots held at once over {} reads",
            report.max_concurrent_holders, report.poller.reads
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
