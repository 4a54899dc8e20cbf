//! What the two modes' runs do alike: the planned executions, the watchers (poller,
//! event player, delaying proxy), the stopper, the settling and the report's common part. Each
//! mode (`versioned`, `sample`) keeps only how its executions run and what it checks.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::ValueEnum;
use serde_json::Value;
use tokio::sync::mpsc;

use crate::progress::Progress;
use crate::report::{LockReport, Report};
use crate::{plan_consumers, plan_locks, plan_roles, plan_weights, Args, LockSpec, Role};
use local_aws::delay::DelayProxy;
use local_aws::eventbridge::{Ended, Player, Target};
use local_aws::poller::{LockItems, Poller};
use local_aws::procs::Supervisor;
use local_aws::stack::Stack;

/// What a mode's run starts from.
#[derive(Clone, Copy)]
pub struct Setup<'a> {
    pub args: &'a Args,
    /// The repository (template.yaml, statemachines/, local/).
    pub root: &'a Path,
    /// Where the run's logs (and the histories of executions that went wrong) go.
    pub dir: &'a Path,
    pub seed: u64,
    pub supervisor: &'a Supervisor,
}

/// One planned execution of the run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Planned {
    pub arn: String,
    pub name: String,
    pub role: Role,
    /// Its lock: an index into the run's locks.
    pub lock: usize,
    /// The weight its input asks for (`--weights`); `None`: its input names none (1).
    pub weight: Option<u32>,
    /// Started on the consumer stack's machine rather than the lock-protected machine.
    pub consumer: bool,
}

/// The machines a run's executions are started on, by name.
pub struct Machines<'a> {
    pub protected: &'a str,
    /// The consumer stack's (`--consumer-share` of the executions); `None`: none.
    pub consumer: Option<&'a str>,
}

/// The run's executions, roles and locks chosen up front from the seed: executions `run-001`,
/// ... of the lock-protected machine, `--consumer-share` of them of the consumer's. The proxy
/// is offered the normal ones, to hold the first acquire writes of `--stop-mid-acquire` of
/// them: chosen as they come, since an execution admitted by a grant sends none (the stopper
/// gives those it holds the role).
pub fn plan_executions(
    setup: &Setup<'_>,
    stack: &Stack,
    machines: &Machines<'_>,
    locks: &[LockSpec],
    proxy: &DelayProxy,
) -> Vec<Planned> {
    let args = setup.args;
    let n = args.executions as usize;
    // Names of one width sort in order of start: run-001 ... and run-0001 past 999.
    let digits = n.to_string().len().max(3);
    let mut rng = fastrand::Rng::with_seed(setup.seed);
    let roles = plan_roles(n, args.shares(), &mut rng);
    let lock_of = plan_locks(n, locks, &mut rng);
    let weights = plan_weights(&lock_of, locks, &args.weights, setup.seed);
    let consumer = match machines.consumer {
        Some(_) => plan_consumers(&roles, args.consumer_share, setup.seed),
        None => vec![false; n],
    };
    let executions: Vec<Planned> = roles
        .into_iter()
        .zip(lock_of)
        .zip(weights)
        .zip(consumer)
        .enumerate()
        .map(|(i, (((role, lock), weight), consumer))| {
            let name = format!("run-{:0width$}", i + 1, width = digits);
            let machine = match machines.consumer {
                Some(machine) if consumer => machine,
                _ => machines.protected,
            };
            let arn = format!(
                "arn:{}:states:{}:{}:execution:{machine}:{name}",
                stack.partition, stack.region, stack.account
            );
            Planned {
                arn,
                name,
                role,
                lock,
                weight,
                consumer,
            }
        })
        .collect();
    proxy.hold_first(
        args.stopped_mid_acquire(n),
        executions
            .iter()
            .filter(|e| e.role == Role::Normal)
            .map(|e| e.arn.clone()),
    );
    executions
}

/// The executions the run stopped, each with the role it was stopped in.
pub type Stopped = Arc<std::sync::Mutex<BTreeMap<String, Role>>>;

/// What watches the run: the poller of the lock item, the player of the executions' status
/// events, and the proxy that delays the chosen acquire writes.
pub struct Watch {
    pub item: LockItems,
    pub locks: Vec<LockSpec>,
    pub poller: Poller,
    pub player: Player,
    pub proxy: Arc<DelayProxy>,
}

impl Watch {
    /// Starts the poller and the player; each execution's end is to be sent on the returned
    /// sender, and is delivered to `target` when it matches `pattern` (with the run's chaos).
    pub fn start(
        setup: &Setup<'_>,
        stack: &Stack,
        item: LockItems,
        locks: Vec<LockSpec>,
        proxy: Arc<DelayProxy>,
        pattern: Option<Value>,
        target: Target,
    ) -> (Self, mpsc::UnboundedSender<Ended>) {
        let poller = Poller::start(
            item.clone(),
            locks.iter().map(|l| (l.name.clone(), l.limit)).collect(),
            Duration::from_millis(100),
        );
        let (ended_tx, ended_rx) = mpsc::unbounded_channel();
        let player = Player::start(
            ended_rx,
            pattern,
            target,
            setup.args.event_chaos(),
            setup.seed ^ 0x5eed,
            stack.region.clone(),
            stack.account.clone(),
        );
        let watch = Self {
            item,
            locks,
            poller,
            player,
            proxy,
        };
        (watch, ended_tx)
    }

    /// The stopper: an execution whose acquire write the proxy starts holding is stopped
    /// mid-acquire at once (so that its status event and cleanup race the write, as in the
    /// seed's scenario); one planned to be stopped mid-work, shortly after the poller first sees
    /// it hold a slot. `stop(arn, role, delay)` stops it after `delay`, and is called once per
    /// execution. Returns the executions stopped, each with the role it was stopped in: who is
    /// stopped mid-acquire is only known as the run goes.
    pub fn spawn_stopper(
        &self,
        mut held: mpsc::UnboundedReceiver<String>,
        role_of: HashMap<String, Role>,
        seed: u64,
        mut stop: impl FnMut(String, Role, Duration) + Send + 'static,
    ) -> Stopped {
        let mut holders = self.poller.holders.clone();
        let stopped = Stopped::default();
        let record = stopped.clone();
        tokio::spawn(async move {
            let mut rng = fastrand::Rng::with_seed(seed ^ 0x570b);
            loop {
                let candidates: Vec<(String, Role, Duration)> = tokio::select! {
                    held = held.recv() => match held {
                        Some(arn) => vec![(arn, Role::StopMidAcquire, Duration::from_millis(50))],
                        None => break,
                    },
                    changed = holders.changed() => {
                        if changed.is_err() { break; }
                        let now: Vec<String> = holders.borrow_and_update().iter().cloned().collect();
                        now.into_iter()
                            .filter(|arn| role_of.get(arn) == Some(&Role::StopMidWork))
                            .map(|arn| (arn, Role::StopMidWork, Duration::from_millis(rng.u64(100..600))))
                            .collect()
                    }
                };
                for (arn, role, delay) in candidates {
                    let first = record
                        .lock()
                        .expect("stopped")
                        .insert(arn.clone(), role)
                        .is_none();
                    if first {
                        stop(arn, role, delay);
                    }
                }
            }
        });
        stopped
    }

    /// Holders of each lock when the last execution has ended, after one more round of reads
    /// by the poller.
    pub async fn holders_after_the_last_write(&self) -> BTreeMap<String, usize> {
        tokio::time::sleep(Duration::from_millis(300) * (1 + self.locks.len() as u32)).await;
        let stats = self.poller.stats();
        self.locks
            .iter()
            .map(|l| (l.name.clone(), stats.lock(&l.name).holders_now))
            .collect()
    }

    /// Waits until every held write has had its answer, every status event is delivered and
    /// `settled_too` says the mode's own work is done; or until `grace` after the last held
    /// write and late delivery can be due.
    pub async fn settle<F, Fut>(
        &self,
        args: &Args,
        grace: Duration,
        every: Duration,
        mut settled_too: F,
    ) -> anyhow::Result<()>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = anyhow::Result<bool>>,
    {
        let deadline = Instant::now() + args.longest_hold() + args.event_chaos().late_by + grace;
        loop {
            let writes_settled = self.proxy.stats().settled();
            let deliveries_settled = self
                .player
                .pending
                .load(std::sync::atomic::Ordering::SeqCst)
                == 0;
            let mode_settled = settled_too().await?;
            if (writes_settled && deliveries_settled && mode_settled) || Instant::now() >= deadline
            {
                return Ok(());
            }
            tokio::time::sleep(every).await;
        }
    }

    /// Lets the poller read the items after the last writes, stops it and the live view, and
    /// starts the report with what both modes record alike: the run's settings, what the
    /// poller, the player and the proxy saw, and who still holds a slot of each lock at the end.
    /// `planned` is each planned execution's lock (an index into the run's locks).
    pub async fn finish(
        &self,
        progress: Progress,
        setup: &Setup<'_>,
        planned: &[Planned],
        holders_when_all_ended: &BTreeMap<String, usize>,
    ) -> anyhow::Result<Report> {
        tokio::time::sleep(Duration::from_millis(300)).await;
        progress.finish().await;
        self.poller.stop();
        let args = setup.args;
        let poll = self.poller.stats();
        let mut locks = Vec::new();
        for (i, spec) in self.locks.iter().enumerate() {
            let leaked = self.item.holders(&spec.name).await?;
            let seen = poll.lock(&spec.name);
            locks.push(LockReport {
                lock: spec.name.clone(),
                limit: spec.limit as usize,
                default: i == 0,
                executions: planned.iter().filter(|e| e.lock == i).count(),
                max_holders: seen.max_holders,
                max_weight: seen.max_weight,
                weights: planned
                    .iter()
                    .filter(|e| e.lock == i)
                    .filter_map(|e| e.weight)
                    .fold(BTreeMap::new(), |mut counts, w| {
                        *counts.entry(w).or_insert(0) += 1;
                        counts
                    }),
                rate: args.rate.map(|rate| {
                    let spacing_ms = semaphore_core::Rate::per_second(rate)
                        .map(semaphore_core::Rate::spacing_ms)
                        .unwrap_or_default();
                    // The starts of the run: from the poller's start on (a probe's before it
                    // had no rate).
                    let from = u64::try_from(poll.started_ms).unwrap_or_default();
                    let starts: Vec<u64> =
                        seen.starts.iter().copied().filter(|t| *t >= from).collect();
                    local_aws::observe::StartRate::of(rate, spacing_ms, &starts)
                }),
                reads: seen.reads,
                inconsistent_reads: seen.inconsistent_reads,
                first_inconsistency: seen.first_inconsistency.clone(),
                holders_when_all_ended: holders_when_all_ended
                    .get(&spec.name)
                    .copied()
                    .unwrap_or_default(),
                leaked_at_end: leaked.len(),
                leaked_holders: leaked,
                ..LockReport::default()
            });
        }
        Ok(Report {
            // Its name on the command line (clap's): "versioned" or "sample".
            protocol: args
                .protocol
                .to_possible_value()
                .map(|v| v.get_name().to_owned())
                .unwrap_or_default(),
            layout: match args.protocol {
                crate::Protocol::Versioned => args.layout.to_string(),
                crate::Protocol::Sample => String::new(),
            },
            seed: setup.seed,
            hold_seconds: args.hold_seconds,
            long_hold_seconds: args.long_hold_for().map(|d| d.as_secs_f64()),
            holders_when_all_ended: holders_when_all_ended.values().sum(),
            leaked_slots_at_end: locks.iter().map(|l| l.leaked_at_end).sum(),
            locks,
            poller: poll,
            events: self.player.stats(),
            delayed_acquire_writes: self.proxy.stats(),
            logs: setup.dir.display().to_string(),
            lock_of: planned.iter().map(|e| (e.arn.clone(), e.lock)).collect(),
            ..Report::default()
        })
    }
}
