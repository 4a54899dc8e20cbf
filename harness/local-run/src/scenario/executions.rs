//! Step 3: the run's executions, started in the background on the lock-protected machine,
//! with the chaos around them: status events played to the cleanup machine (dropped,
//! duplicated, late), executions stopped mid-acquire (their write held by the proxy) and
//! mid-work, the sweeper's schedule compressed; a live view, and a watch until every one ended.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use aws_sdk_sfn::error::DisplayErrorContext;
use aws_sdk_sfn::types::ExecutionStatus;
use serde_json::json;
use tokio::sync::mpsc;

use super::deploy::Stage;
use crate::driver::{self, Planned, Setup, Stopped, Watch};
use crate::progress::{phase, Progress};
use crate::Role;
use local_aws::eventbridge::Ended;
use local_aws::eventbridge::Target;
use local_aws::lambda;
use local_aws::sfn::{describe, list_executions, start_execution};
use local_aws::Error;

/// The executions as they ended, and what the steps after them go on with.
pub(super) struct Ran {
    pub executions: Vec<Planned>,
    pub watch: Watch,
    pub progress: Progress,
    pub outcomes: BTreeMap<String, Ended>,
    /// The executions the run stopped, and why.
    pub stopped: Stopped,
    /// Cleared to end the compressed schedule.
    pub sweeping: Arc<AtomicBool>,
    pub timed_out: bool,
    pub holders_when_all_ended: BTreeMap<String, usize>,
}

pub(super) async fn run(
    setup: &Setup<'_>,
    stage: &Stage,
    held_rx: mpsc::UnboundedReceiver<String>,
) -> anyhow::Result<Ran> {
    let Stage {
        stack,
        locks,
        deployed,
        protected,
        work_machine,
        cleanup_machine,
        sweeper_machine,
        consumer_machine,
        proxy,
        sfn,
        item,
        ..
    } = stage;
    let (args, seed) = (setup.args, setup.seed);
    let (rule, schedule) = (&deployed.rule, &deployed.schedule);
    // The run's plan.
    let machines = driver::Machines {
        protected: &protected.name,
        consumer: Some(&consumer_machine.name),
    };
    let executions = driver::plan_executions(setup, stack, &machines, locks, proxy);
    let n = executions.len();
    let planned_arns: BTreeSet<String> = executions.iter().map(|e| e.arn.clone()).collect();
    let target = Target::StateMachine {
        client: sfn.clone(),
        arn: cleanup_machine.arn.clone(),
        transformer: rule.transformer.clone(),
    };
    let pattern = Some(rule.pattern.clone());
    let (watch, ended_tx) = Watch::start(
        setup,
        stack,
        item.clone(),
        locks.clone(),
        proxy.clone(),
        pattern,
        target,
    );

    // F14: every lock but the template's default is configured by its operator with its limit
    // (what `semctl lock set --lock L --limit N` writes) before the run, and its executions
    // ask for one more: the poller's S1 at the configured limit shows that none raised it.
    let operator = semaphore_core::Semaphore::new(item.operator_store());
    for spec in locks.iter().skip(1) {
        // Its rate too, when the run asks for one (`--rate`): the configuration's is taken.
        let config = semaphore_core::LockConfig::new(
            semaphore_core::Limit::new(i64::from(spec.limit))?,
            None,
            args.rate
                .map(semaphore_core::Rate::per_second)
                .transpose()?,
        )?;
        operator
            .configure(&semaphore_core::LockName::new(&spec.name)?, Some(config))
            .await?;
    }

    // A stop is a StopExecution, as an operator's would be.
    let stopped = {
        let sfn = sfn.clone();
        let role_of = executions.iter().map(|e| (e.arn.clone(), e.role)).collect();
        watch.spawn_stopper(held_rx, role_of, seed, move |arn, role, delay| {
            let sfn = sfn.clone();
            tokio::spawn(async move {
                tokio::time::sleep(delay).await;
                if let Err(e) = sfn
                    .stop_execution()
                    .execution_arn(&arn)
                    .error("LocalRun.Chaos")
                    .cause(format!("{role:?}"))
                    .send()
                    .await
                {
                    eprintln!("StopExecution {arn}: {}", DisplayErrorContext(e));
                }
            });
        })
    };

    // The schedule, compressed.
    let sweep_every = Duration::from_secs_f64(args.sweep_every);
    let sweeping = Arc::new(AtomicBool::new(true));
    {
        let (sfn, sweeping, arn, input) = (
            sfn.clone(),
            sweeping.clone(),
            sweeper_machine.arn.clone(),
            schedule.input.clone(),
        );
        tokio::spawn(async move {
            let mut n = 0u32;
            loop {
                tokio::time::sleep(sweep_every).await;
                if !sweeping.load(SeqCst) {
                    break;
                }
                n += 1;
                let _ = start_execution(&sfn, &arn, &format!("sweep-{n:04}"), &input).await;
            }
        });
    }

    let planned = |role| executions.iter().filter(|e| e.role == role).count();
    let spread: Vec<String> = locks
        .iter()
        .enumerate()
        .map(|(i, l)| {
            let on = executions.iter().filter(|e| e.lock == i).count();
            format!("{on} on {} (limit {})", l.name, l.limit)
        })
        .collect();
    let mut asked = Vec::new();
    if !args.weights.is_empty() {
        asked.push(format!("weights drawn from {:?}", args.weights));
    }
    if let Some(rate) = args.rate {
        asked.push(format!("at most {rate} starts/s"));
    }
    let terms = if asked.is_empty() {
        String::new()
    } else {
        format!("; {}", asked.join(", "))
    };
    let on_consumer = executions.iter().filter(|e| e.consumer).count();
    phase(&format!(
        "starting {n} executions, {} of {} and {on_consumer} of the consumer's {} ({}{terms}; \
         {} as work, {} s each; {} fail, {} stopped mid-acquire, {} stopped mid-work)",
        n - on_consumer,
        protected.name,
        consumer_machine.name,
        spread.join(", "),
        work_machine.name,
        args.work_seconds,
        planned(Role::Fail),
        args.stopped_mid_acquire(n),
        planned(Role::StopMidWork),
    ));
    // Started in the background, so that the watcher below plays each status event as soon as
    // its execution ends (starting 100 executions on moto takes several seconds).
    let started = Arc::new(AtomicUsize::new(0));
    let start_error: Arc<Mutex<Option<Error>>> = Arc::default();
    {
        let (sfn, started, start_error) = (sfn.clone(), started.clone(), start_error.clone());
        let machine_of = |e: &Planned| {
            if e.consumer {
                consumer_machine.arn.clone()
            } else {
                protected.arn.clone()
            }
        };
        let inputs: Vec<(String, String, String)> = executions
            .iter()
            .map(|e| {
                // What the demo work reads; the semaphore reads lock and limit. An execution
                // to be stopped mid-work works long, so that its child still runs when it is
                // stopped: the cleanup must stop the child before it frees the slot (or a
                // sweep must wait for it, when the event was dropped).
                let work_seconds = if e.role == Role::StopMidWork {
                    (args.work_seconds * 5).max(10)
                } else {
                    args.work_seconds
                };
                let mut input = json!({"work_seconds": work_seconds, "fail": e.role == Role::Fail});
                if e.lock > 0 {
                    // More than its operator's limit: the configuration's is taken.
                    input["lock"] = json!(locks[e.lock].name);
                    input["limit"] = json!(locks[e.lock].limit + 1);
                }
                if let Some(weight) = e.weight {
                    input["weight"] = json!(weight);
                }
                if let Some(rate) = args.rate {
                    input["rate"] = json!(rate);
                }
                // The consumer's machine takes the default lock only when named: its own
                // default is another lock.
                if e.consumer && e.lock == 0 {
                    input["lock"] = json!(locks[0].name);
                    input["limit"] = json!(locks[0].limit);
                }
                (machine_of(e), e.name.clone(), input.to_string())
            })
            .collect();
        tokio::spawn(async move {
            for (machine, name, input) in inputs {
                if let Err(e) = start_execution(&sfn, &machine, &name, input).await {
                    *start_error.lock().expect("start error") = Some(e);
                    return;
                }
                started.fetch_add(1, SeqCst);
            }
        });
    }

    let outcomes: Arc<Mutex<BTreeMap<String, Ended>>> = Arc::default();
    let progress = {
        let (outcomes, poll, proxy, events, started) = (
            outcomes.clone(),
            watch.poller.stats.clone(),
            watch.proxy.clone(),
            watch.player.stats.clone(),
            started.clone(),
        );
        let dir = setup.dir.to_owned();
        let locks = locks.clone();
        let weighted = !args.weights.is_empty();
        Progress::start(move || {
            let done = outcomes.lock().expect("outcomes").len();
            let started = started.load(SeqCst);
            let starting = if started < n {
                format!("started {started}/{n} | ")
            } else {
                String::new()
            };
            let poll = poll.lock().expect("poll").clone();
            let proxy = proxy.stats();
            let events = events.lock().expect("events").clone();
            let holders: Vec<String> = locks
                .iter()
                .map(|l| {
                    let seen = poll.lock(&l.name);
                    format!(
                        "{} {} (max {}/{}{})",
                        l.name,
                        seen.holders_now,
                        seen.max_holders,
                        l.limit,
                        if weighted {
                            format!(", weight {}", seen.max_weight)
                        } else {
                            String::new()
                        }
                    )
                })
                .collect();
            format!(
                "{starting}done {done}/{n} | holders {} | reclaimed by sweeper {} | delayed \
                 writes refused {} | events {} dropped {} dup {} late",
                holders.join(", "),
                // The sweeper's own warning, one per slot it reclaimed.
                lambda::log_lines(&dir, "sweeper", |l| l
                    .contains(r#""message":"reclaimed a leaked slot""#)),
                proxy.refused(),
                events.dropped,
                events.duplicated,
                events.late
            )
        })
    };

    // Watch the executions end; each ended one is an event for the player.
    let deadline = Instant::now() + Duration::from_secs(args.timeout);
    let mut timed_out = false;
    loop {
        let failed_start = start_error.lock().expect("start error").take();
        if let Some(e) = failed_start {
            progress.finish().await;
            return Err(e.into());
        }
        if let Some((what, status, log)) = setup.supervisor.exited() {
            progress.finish().await;
            let tail = local_aws::server::tail(&log, 20);
            return Err(Error::Exited {
                what,
                status,
                log,
                tail,
            }
            .into());
        }
        let listing = Instant::now();
        let mut listed = list_executions(sfn, &protected.arn).await?;
        listed.extend(list_executions(sfn, &consumer_machine.arn).await?);
        for (arn, _, status) in listed {
            // The probes' executions are not the run's (their status events are not played).
            if status == ExecutionStatus::Running
                || !planned_arns.contains(&arn)
                || outcomes.lock().expect("outcomes").contains_key(&arn)
            {
                continue;
            }
            let ended = describe(sfn, &arn).await?;
            outcomes
                .lock()
                .expect("outcomes")
                .insert(arn, ended.clone());
            let _ = ended_tx.send(ended);
        }
        if outcomes.lock().expect("outcomes").len() >= n {
            break;
        }
        if Instant::now() >= deadline {
            timed_out = true;
            break;
        }
        // The listings take longer the more executions there are (13 pages at 1,300).
        let took = listing.elapsed();
        tokio::time::sleep(local_aws::poller::paced(Duration::from_millis(400), took)).await;
    }
    let holders_when_all_ended = watch.holders_after_the_last_write().await;
    progress.note(&format!(
        "==> all executions ended{}; settling: late events, held writes, cleanups",
        if timed_out { " or timed out" } else { "" }
    ));
    let outcomes = outcomes.lock().expect("outcomes").clone();
    Ok(Ran {
        executions,
        watch,
        progress,
        outcomes,
        stopped,
        sweeping,
        timed_out,
        holders_when_all_ended,
    })
}
