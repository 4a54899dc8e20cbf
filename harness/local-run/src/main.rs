//! `local-run`: the whole app on a local AWS, with chaos, a live view and a report.
//!
//! It starts moto's server on 127.0.0.1 (serialized, Step Functions execution mode on, Lambda
//! invokes bridged to `cargo lambda watch`), runs our four Lambda binaries as the emulator's
//! function instances, deploys table, topic and every state machine from `template.yaml`, then
//! starts many executions of the lock-protected machine, spread over several locks with their
//! own limits, each running the demo work as its child execution, while it plays EventBridge
//! (with dropped, duplicated and late events) and the sweeper's schedule (compressed), stops
//! some executions mid-acquire (their acquire write held in flight by a delaying proxy: the
//! seed race) or mid-work (their child keeps running: cleanup must stop it before it frees the
//! slot), and watches every lock with an independent poller. It ends with a report, per lock,
//! and exits 1 if an invariant failed.
//!
//! `--protocol sample` is a test-only mode: the same chaos against the original AWS sample's
//! protocol (no version, no fence, no sweeper), to show the leak the seed describes.

mod driver;
mod line;
mod picture;
mod progress;
mod report;
mod sample;
mod scenario;
mod work;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{ensure, Context};
use clap::{Parser, ValueEnum};

use local_aws::eventbridge::EventChaos;
use local_aws::procs::Supervisor;
use semaphore_core::{Layout, Limit, LockName};

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Protocol {
    /// This project: versioned, fenced conditional writes, cleanup machine and sweeper.
    Versioned,
    /// TEST-ONLY: the original AWS sample's protocol, to show the leak it has.
    Sample,
}

/// Runs the semaphore's real state machines and Rust Lambdas on a local AWS (127.0.0.1), breaks
/// things on purpose, and reports whether the semaphore held.
#[derive(Debug, Parser)]
#[command(name = "local-run", version)]
pub struct Args {
    /// Executions of the lock-protected state machine to start at once.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub executions: u32,
    /// The locks the executions take, NAME:LIMIT, comma-separated. The first is the template's
    /// default (its LockName and ConcurrencyLimit are set to it, and its executions' input
    /// names neither); the others are named with their limit in their executions' input.
    /// Executions are spread over the locks in proportion to their limits.
    #[arg(
        long,
        default_value = "demo-lock:5,other-lock:2",
        value_delimiter = ','
    )]
    pub locks: Vec<LockSpec>,
    /// The first lock's limit, instead of the one --locks gives it.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub limit: Option<u32>,
    /// The layout of every lock of the run: `item` (its holders in its one item) or `gate`
    /// (each holding an item of its own, what `semctl lock set --layout gate` makes), set
    /// before any execution starts.
    #[arg(long, default_value_t = Layout::Item)]
    pub layout: Layout,
    /// Weighted permits: each execution's input gets a "weight" drawn from this list
    /// (comma-separated, repeats make a weight likelier; deterministic by --seed), among the
    /// weights that fit its lock's limit. Not given: no weight in the input (1).
    #[arg(long, value_delimiter = ',', value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub weights: Vec<u32>,
    /// A start-rate limit: each execution's input gets "rate": R (acquisitions per second) for
    /// its lock, and the report checks the starts the poller saw against it.
    #[arg(long, value_parser = parse_rate)]
    pub rate: Option<f64>,
    /// Seconds of protected work per execution (its "work_seconds" input).
    #[arg(long, default_value_t = 2)]
    pub work_seconds: u32,
    /// Share of executions whose work fails ("fail": true).
    #[arg(long, default_value_t = 0.10, value_parser = share)]
    pub fail_share: f64,
    /// Share of executions stopped while their acquire write is held in flight (the seed race):
    /// the first of the others to send an acquire write (one admitted by a grant sends none).
    #[arg(long, default_value_t = 0.05, value_parser = share)]
    pub stop_mid_acquire: f64,
    /// Share of executions stopped while they hold a slot. Their work is long (5 times
    /// --work-seconds, at least 10 s), so that their child execution still runs when they are
    /// stopped: the cleanup must stop it before it frees the slot.
    #[arg(long, default_value_t = 0.05, value_parser = share)]
    pub stop_mid_work: f64,
    /// Share of executions started on the consumer's machine instead (examples/consumer: a stack
    /// of its own, deployed after the semaphore's, its machine named under the semaphore's
    /// ProtectedStateMachinePrefix, its work a Lambda function). None of them is stopped
    /// mid-work: a stop ends the execution but not a running Lambda invocation, which the
    /// lock-protected machine avoids by running Lambda work as a child execution.
    #[arg(long, default_value_t = 0.20, value_parser = share)]
    pub consumer_share: f64,
    /// How long the delaying proxy holds such an acquire write, in seconds: long enough for the
    /// execution's cleanup to land first (the seed race), so its fence must refuse the write.
    #[arg(long, default_value_t = 4.0)]
    pub hold_seconds: f64,
    /// Every second held write is held this long instead (0: none). The default is past two
    /// fence windows at the template's defaults (8 s horizon + 2 s clock skew), so the fences
    /// the write had to meet are rotated out before it lands: only the horizon can refuse it.
    /// Our protocol only; the sample's has no fences to outlast.
    #[arg(long, default_value_t = 30.0)]
    pub long_hold_seconds: f64,
    /// Share of status-change events never delivered.
    #[arg(long, default_value_t = 0.15, value_parser = share)]
    pub drop_events: f64,
    /// Share of status-change events delivered twice.
    #[arg(long, default_value_t = 0.20, value_parser = share)]
    pub duplicate_events: f64,
    /// Share of deliveries made late.
    #[arg(long, default_value_t = 0.20, value_parser = share)]
    pub late_events: f64,
    /// A late delivery comes up to this many seconds after the event.
    #[arg(long, default_value_t = 8.0)]
    pub late_by: f64,
    /// No chaos at all: no stops, no held writes, every event delivered once, on time.
    #[arg(long)]
    pub calm: bool,
    /// The sweeper's schedule, compressed: one sweep every this many seconds.
    #[arg(long, default_value_t = 5.0)]
    pub sweep_every: f64,
    /// The acquire states' TimeoutSeconds, compressed (300 s in the definitions): how long a
    /// parked waiter waits before it checks again (the most a lost wake-up costs it). Short
    /// here, so that the run sees fallback checks; above the acquire function's timeout, so that
    /// one waiter's invocations do not overlap.
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u64).range(lambda_common::ACQUIRE_FUNCTION_TIMEOUT.as_secs() + 1..=86_400))]
    pub queue_fallback_seconds: u64,
    /// Give up waiting for the executions after this many seconds.
    #[arg(long, default_value_t = 900)]
    pub timeout: u64,
    /// Seed of every random choice (plan and chaos); random when not given.
    #[arg(long)]
    pub seed: Option<u64>,
    /// Also write the report as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Which protocol to run. `sample` is a TEST-ONLY mode: the original AWS sample's protocol,
    /// run directly against the same local table and chaos, to show its leak.
    #[arg(long, value_enum, default_value_t = Protocol::Versioned)]
    pub protocol: Protocol,
    /// Instances of the acquire function (Lambda concurrency).
    #[arg(long, default_value_t = 8)]
    pub acquire_instances: usize,
    /// The repository (template.yaml, statemachines/, local/moto_server.py).
    #[arg(long, default_value = concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))]
    pub root: PathBuf,
    /// Python with the pinned moto (default: ROOT/.venv/bin/python).
    #[arg(long)]
    pub python: Option<PathBuf>,
    /// The pinned cargo-lambda binary (default: ROOT/.venv/bin/cargo-lambda).
    #[arg(long)]
    pub cargo_lambda: Option<PathBuf>,
    /// Do not `cargo build` the Lambda binaries first.
    #[arg(long)]
    pub no_build: bool,
}

/// A share of executions or events: from 0 to 1.
fn share(text: &str) -> anyhow::Result<f64> {
    let v: f64 = text.trim().parse()?;
    ensure!((0.0..=1.0).contains(&v), "a share is from 0 to 1, not {v}");
    Ok(v)
}

fn parse_rate(text: &str) -> anyhow::Result<f64> {
    semaphore_core::Rate::parse(text)?;
    Ok(text.trim().parse()?)
}

/// A lock of the run and its limit, valid as the acquire function takes them (core's
/// `LockName` and `Limit`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct LockSpec {
    pub name: String,
    pub limit: u32,
}

impl std::str::FromStr for LockSpec {
    type Err = anyhow::Error;

    fn from_str(part: &str) -> anyhow::Result<Self> {
        // The last colon: a lock name may have colons of its own.
        let (name, limit) = part
            .trim()
            .rsplit_once(':')
            .with_context(|| format!("{part:?} is not NAME:LIMIT"))?;
        // No context added: clap shows only the outermost message, and names the value itself.
        let (name, limit) = (LockName::new(name)?, Limit::parse(limit)?);
        Ok(Self {
            name: name.as_str().to_owned(),
            limit: limit.get(),
        })
    }
}

impl Args {
    /// The run's locks (`--locks`, the first one's limit replaced by `--limit` if given).
    pub fn locks(&self) -> anyhow::Result<Vec<LockSpec>> {
        let mut locks = self.locks.clone();
        for (i, lock) in locks.iter().enumerate() {
            let twice = locks[..i].iter().any(|l| l.name == lock.name);
            ensure!(!twice, "--locks: {} is named twice", lock.name);
        }
        if let (Some(first), Some(limit)) = (locks.first_mut(), self.limit) {
            first.limit = limit;
        }
        Ok(locks)
    }

    pub fn event_chaos(&self) -> EventChaos {
        if self.calm {
            return EventChaos {
                drop: 0.0,
                duplicate: 0.0,
                late: 0.0,
                late_by: Duration::ZERO,
            };
        }
        EventChaos {
            drop: self.drop_events,
            duplicate: self.duplicate_events,
            late: self.late_events,
            late_by: Duration::from_secs_f64(self.late_by.max(1.0)),
        }
    }

    /// How long the delaying proxy holds a chosen acquire write.
    pub fn hold_for(&self) -> Duration {
        Duration::from_secs_f64(self.hold_seconds)
    }

    /// How long every second held write is held instead, if any (our protocol only).
    pub fn long_hold_for(&self) -> Option<Duration> {
        (self.protocol == Protocol::Versioned && self.long_hold_seconds > 0.0)
            .then(|| Duration::from_secs_f64(self.long_hold_seconds))
    }

    /// The longest any write is held.
    pub fn longest_hold(&self) -> Duration {
        self.hold_for()
            .max(self.long_hold_for().unwrap_or_default())
    }

    /// (fail, stop mid-acquire, stop mid-work) shares.
    pub fn shares(&self) -> (f64, f64, f64) {
        if self.calm {
            (self.fail_share, 0.0, 0.0)
        } else {
            (self.fail_share, self.stop_mid_acquire, self.stop_mid_work)
        }
    }

    /// How many of `n` executions the run stops mid-acquire (chosen as it goes: see
    /// `driver::plan_executions`).
    pub fn stopped_mid_acquire(&self, n: usize) -> usize {
        share_of(n, self.shares().1)
    }

    fn validate(&self) -> anyhow::Result<()> {
        ensure!(
            self.fail_share + self.stop_mid_acquire + self.stop_mid_work <= 1.0,
            "--fail-share, --stop-mid-acquire and --stop-mid-work add up to more than 1"
        );
        for (name, v) in [
            ("--hold-seconds", self.hold_seconds),
            ("--long-hold-seconds", self.long_hold_seconds),
            ("--late-by", self.late_by),
            ("--sweep-every", self.sweep_every),
        ] {
            let in_range = (0.0..=600.0).contains(&v) && (name != "--sweep-every" || v >= 0.5);
            ensure!(in_range, "{name} out of range: {v}");
        }
        let locks = self.locks()?;
        ensure!(
            self.protocol == Protocol::Versioned
                || (self.weights.is_empty() && self.rate.is_none()),
            "--weights and --rate are this project's; the sample's protocol has neither"
        );
        ensure!(
            self.protocol == Protocol::Versioned || self.layout == Layout::Item,
            "--layout gate is this project's; the sample's protocol keeps each lock in one item"
        );
        if !self.weights.is_empty() {
            for lock in &locks {
                ensure!(
                    self.weights.iter().any(|w| *w <= lock.limit),
                    "--weights: none of {:?} fits {}'s limit {}",
                    self.weights,
                    lock.name,
                    lock.limit
                );
            }
        }
        ensure!(
            self.acquire_instances > 0,
            "--acquire-instances must be at least 1"
        );
        Ok(())
    }
}

/// An execution's role in the run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Normal,
    Fail,
    /// Not planned up front: given to the executions whose acquire write the proxy held (see
    /// `plan_executions`).
    StopMidAcquire,
    StopMidWork,
}

/// How many of `n` executions take a role of `share`.
pub fn share_of(n: usize, share: f64) -> usize {
    ((n as f64) * share).round() as usize
}

/// The roles chosen up front (to fail, to be stopped mid-work, the rest normal): exact counts,
/// shuffled. Those stopped mid-acquire are chosen among the normal ones as the run goes.
pub fn plan_roles(n: usize, shares: (f64, f64, f64), rng: &mut fastrand::Rng) -> Vec<Role> {
    let (fail, work) = (share_of(n, shares.0), share_of(n, shares.2));
    let mut roles = Vec::with_capacity(n);
    roles.extend(std::iter::repeat_n(Role::Fail, fail.min(n)));
    roles.extend(std::iter::repeat_n(Role::StopMidWork, work));
    roles.truncate(n);
    roles.resize(n, Role::Normal);
    rng.shuffle(&mut roles);
    roles
}

/// The weight of each of `n` executions, given its lock (`lock_of`): drawn uniformly from the
/// entries of `weights` that fit the lock's limit; `None` for every one when no weights are
/// given. Drawn from a generator of its own, so that the roles and locks of a seed stay the
/// same with or without weights.
pub fn plan_weights(
    lock_of: &[usize],
    locks: &[LockSpec],
    weights: &[u32],
    seed: u64,
) -> Vec<Option<u32>> {
    let mut rng = fastrand::Rng::with_seed(seed ^ 0x3e19_4700);
    lock_of
        .iter()
        .map(|&lock| {
            let fitting: Vec<u32> = weights
                .iter()
                .copied()
                .filter(|w| *w <= locks[lock].limit)
                .collect();
            (!fitting.is_empty()).then(|| fitting[rng.usize(..fitting.len())])
        })
        .collect()
}

/// Which of the executions (with these roles) start on the consumer's machine: `share` of
/// them, rounded, never one to be stopped mid-work (see `--consumer-share`). Drawn from a
/// generator of its own, so that the roles and locks of a seed stay the same.
pub fn plan_consumers(roles: &[Role], share: f64, seed: u64) -> Vec<bool> {
    let mut rng = fastrand::Rng::with_seed(seed ^ 0xc0_de_50_4e);
    let mut eligible: Vec<usize> = (0..roles.len())
        .filter(|&i| roles[i] != Role::StopMidWork)
        .collect();
    rng.shuffle(&mut eligible);
    let count = ((roles.len() as f64) * share).round() as usize;
    let mut consumer = vec![false; roles.len()];
    for i in eligible.into_iter().take(count) {
        consumer[i] = true;
    }
    consumer
}

/// Which lock each of `n` executions takes: counts in proportion to the limits (largest
/// remainder, so they add up to `n`), shuffled.
pub fn plan_locks(n: usize, locks: &[LockSpec], rng: &mut fastrand::Rng) -> Vec<usize> {
    let total: u64 = locks.iter().map(|l| u64::from(l.limit)).sum::<u64>().max(1);
    let exact: Vec<(usize, u64, u64)> = locks
        .iter()
        .enumerate()
        .map(|(i, l)| {
            let share = n as u64 * u64::from(l.limit);
            (i, share / total, share % total)
        })
        .collect();
    let mut counts: Vec<usize> = exact.iter().map(|(_, q, _)| *q as usize).collect();
    let mut by_remainder = exact.clone();
    by_remainder.sort_by(|a, b| b.2.cmp(&a.2).then(a.0.cmp(&b.0)));
    let missing = n - counts.iter().sum::<usize>();
    for (i, _, _) in by_remainder.into_iter().take(missing) {
        counts[i] += 1;
    }
    let mut plan: Vec<usize> = counts
        .iter()
        .enumerate()
        .flat_map(|(i, c)| std::iter::repeat_n(i, *c))
        .collect();
    rng.shuffle(&mut plan);
    plan
}

fn run_dir(root: &std::path::Path) -> anyhow::Result<PathBuf> {
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or_default();
    let dir = local_aws::server::target_dir(root)
        .join("local-run")
        .join(format!("{stamp}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
    Ok(dir)
}

async fn run(args: &Args, supervisor: &Supervisor) -> anyhow::Result<report::Report> {
    args.validate()?;
    let root = args
        .root
        .canonicalize()
        .with_context(|| format!("--root {}", args.root.display()))?;
    let dir = run_dir(&root)?;
    let seed = args.seed.unwrap_or_else(|| fastrand::u64(..));
    progress::phase(&format!(
        "local run ({:?} protocol), seed {seed}, logs in {}",
        args.protocol,
        dir.display()
    ));
    let setup = driver::Setup {
        args,
        root: &root,
        dir: &dir,
        seed,
        supervisor,
    };
    match args.protocol {
        Protocol::Versioned => scenario::run(&setup).await,
        Protocol::Sample => sample::run(&setup).await,
    }
}

async fn shutdown_signal() -> &'static str {
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(s) => s,
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
            return "Ctrl-C";
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => "Ctrl-C",
        _ = term.recv() => "SIGTERM",
    }
}

#[tokio::main]
async fn main() {
    let args = Args::parse();
    let supervisor = Arc::new(Supervisor::new());
    let started = std::time::Instant::now();
    let outcome = tokio::select! {
        result = run(&args, &supervisor) => Some(result),
        signal = shutdown_signal() => {
            eprintln!("\n{signal}: stopping every process this run started");
            None
        }
    };
    supervisor.stop_all();
    let code = match outcome {
        None => 130,
        Some(Err(e)) => {
            eprintln!("local-run failed: {e:#}");
            2
        }
        Some(Ok(mut report)) => {
            report.wall_seconds = started.elapsed().as_secs_f64();
            report.html_report = picture::write(&report);
            print!("{}", report.render());
            if let Some(path) = &args.json {
                let json = serde_json::to_string_pretty(&report).expect("report serializes");
                if let Err(e) = std::fs::write(path, json + "\n") {
                    eprintln!("cannot write {}: {e}", path.display());
                    std::process::exit(2);
                }
            }
            if report.ok {
                0
            } else {
                1
            }
        }
    };
    std::process::exit(code);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roles_are_exact_counts() {
        let mut rng = fastrand::Rng::with_seed(7);
        let roles = plan_roles(100, (0.1, 0.05, 0.05), &mut rng);
        let n = |r| roles.iter().filter(|x| **x == r).count();
        assert_eq!(
            (
                n(Role::Fail),
                n(Role::StopMidAcquire),
                n(Role::StopMidWork),
                n(Role::Normal)
            ),
            (10, 0, 5, 85)
        );
        let roles = plan_roles(3, (0.5, 0.5, 0.5), &mut rng);
        assert_eq!(roles.len(), 3);
    }

    #[test]
    fn locks_are_spread_in_proportion_to_their_limits() {
        let locks = |spec: &str| {
            Args::parse_from(["local-run", "--locks", spec])
                .locks()
                .unwrap()
        };
        let mut rng = fastrand::Rng::with_seed(7);
        let plan = plan_locks(100, &locks("a:5,b:2"), &mut rng);
        assert_eq!(plan.len(), 100);
        assert_eq!(plan.iter().filter(|l| **l == 1).count(), 29);
        let plan = plan_locks(3, &locks("a:1,b:1,c:1,d:1"), &mut rng);
        assert_eq!(plan.len(), 3);
    }

    #[test]
    fn weights_are_drawn_by_seed_among_those_that_fit_the_lock() {
        let locks = Args::parse_from(["local-run", "--locks", "a:5,b:2"])
            .locks()
            .unwrap();
        let lock_of: Vec<usize> = (0..200).map(|i| i % 2).collect();
        let plan = plan_weights(&lock_of, &locks, &[1, 1, 2, 4], 12);
        assert_eq!(plan, plan_weights(&lock_of, &locks, &[1, 1, 2, 4], 12));
        for (lock, weight) in lock_of.iter().zip(&plan) {
            let weight = weight.unwrap();
            assert!(weight <= locks[*lock].limit, "{weight} on {lock}");
        }
        assert!(plan.contains(&Some(4)) && plan.contains(&Some(2)));
        assert!(plan_weights(&lock_of, &locks, &[], 12)
            .iter()
            .all(Option::is_none));
    }

    #[test]
    fn the_cli_parses_and_validates() {
        let args = Args::parse_from(["local-run", "--executions", "20", "--limit", "3"]);
        assert!(args.validate().is_ok());
        // --limit sets the first lock's limit; the default run has a second lock.
        assert_eq!(
            args.locks().unwrap(),
            [
                LockSpec {
                    name: "demo-lock".to_owned(),
                    limit: 3
                },
                LockSpec {
                    name: "other-lock".to_owned(),
                    limit: 2
                }
            ]
        );
        // Refused as clap parses them, or (a lock named twice) by validate.
        let refused = |args: &[&str]| {
            let args = std::iter::once("local-run").chain(args.iter().copied());
            Args::try_parse_from(args).map_or(true, |a| a.validate().is_err())
        };
        for bad in ["a", "a:0", "a:10001", "a:1,a:2", "a\tb:1", ":1", ""] {
            assert!(refused(&["--locks", bad]), "{bad:?}");
        }
        // Any name the acquire function takes (core's LockName), colons included.
        let named = Args::parse_from(["local-run", "--locks", "team a:job:3"]);
        assert_eq!(named.locks().unwrap()[0].name, "team a:job");
        assert!(refused(&["--drop-events", "1.5"]));
        // A gate of 1,000 and the executions to fill it; the layout is ours alone.
        let gate = [
            "--layout",
            "gate",
            "--limit",
            "1000",
            "--executions",
            "1500",
        ];
        let wide = Args::parse_from(std::iter::once("local-run").chain(gate));
        assert!(wide.validate().is_ok());
        assert_eq!(
            (wide.layout, wide.locks().unwrap()[0].limit),
            (Layout::Gate, 1000)
        );
        assert!(refused(&["--layout", "gate", "--protocol", "sample"]));
        assert!(refused(&["--layout", "shards"]));
        assert!(refused(&["--limit", "10001"]));
        let weighted = Args::parse_from(["local-run", "--weights", "1,1,2,4", "--rate", "2"]);
        assert!(weighted.validate().is_ok());
        assert_eq!(
            (weighted.weights.as_slice(), weighted.rate),
            (&[1, 1, 2, 4][..], Some(2.0))
        );
        for bad in [
            &["--rate", "0"][..],
            &["--rate", "fast"],
            &["--weights", "0"],
        ] {
            let args = std::iter::once("local-run").chain(bad.iter().copied());
            assert!(Args::try_parse_from(args).is_err(), "{bad:?}");
        }
        // A weight that fits no limit of a lock is refused up front.
        let unfit = Args::parse_from(["local-run", "--weights", "3,4", "--locks", "a:5,b:2"]);
        assert!(unfit.validate().is_err());
        let sample = Args::parse_from(["local-run", "--protocol", "sample"]);
        assert_eq!(sample.protocol, Protocol::Sample);
        let calm = Args::parse_from(["local-run", "--calm"]);
        assert_eq!(calm.shares().1, 0.0);
        assert_eq!(calm.event_chaos().drop, 0.0);
    }
}
