//! Runs the model check for a configuration given on the command line.
//!
//! `cargo run --release -p semaphore-model --bin model-check -- --executions 4 --limit 2`
//! checks the product's protocol; `--protocol sample` the AWS sample's (which must fail);
//! `--variant <name>` a deliberately broken variant of the product's; `--queue` the waiting line
//! in its own world (`semaphore_model::queue`), `--leases` leases (`semaphore_model::lease`),
//! `--pollers` pollers in the line (`semaphore_model::poll`). Exit status: 0 if the result is the
//! expected one, 1 if not, 2 for bad arguments.

// The options' docs are their --help, where "[queue]" and "[pollers]" say which world an
// option applies to: plain text, not links.
#![allow(rustdoc::broken_intra_doc_links)]

use std::process::ExitCode;

use clap::error::ErrorKind;
use clap::{CommandFactory, Parser, ValueEnum};
use semaphore_core::item::Layout;
use semaphore_model::queue::MAX_WAITERS;
use semaphore_model::world::{MAX_EXECUTIONS, MAX_INCARNATIONS};
use semaphore_model::{
    explore, ours_world, sample_world, Config, LeaseConfig, LeaseVariant, LeaseWorld, Model,
    PollConfig, PollVariant, PollWorld, QueueConfig, QueueVariant, QueueWorld, Report, Variant,
    Variants,
};

/// Explores every reachable state of a small world of executions contending for one lock and
/// checks the protocol's properties in each (S1, S2, S3, L1; with --queue: S1, S3, L2, F8, L1;
/// with --leases: S1, S3; with --pollers: S1, S2, S3, L2, F8, L1).
///
/// Without --queue the world starts as the one `cargo test` checks (3 executions, limit 1, one
/// Step Functions retry each, one death, lost and late events, late writes, a tick of the clock,
/// two fence rotations, a final sweep); options change it.
///
/// With --queue, the waiting line in its own world (default: 3 executions of weights 1, 2, 1 on
/// a lock of limit 2, so a heavy head waits for both units and nobody passes it): executions
/// park on their one acquire task, which takes a slot or queues them, are handed a slot and
/// woken (or check again when the task times out, keeping their place), work and release;
/// hand-offs are one request per step; executions die, cleanup events are lost, Lambdas crash
/// between requests, parked tasks time out early (each bounded).
///
/// With --pollers, pollers in the line: a holder of the one slot, an Express execution that polls
/// for it under a lease (its place kept by each poll for a poll window; it may stop polling at any
/// point) and a standard execution parked on its task, in one line; hand-offs skip a poller that
/// stopped, grant a live one its slot under its lease, and it finds it at its next poll; the clock
/// moves by ticks, some clocks a skew ahead.
///
/// Exit status: 0 if the result is the expected one (the real protocol passes; the sample, a
/// broken variant, --strict-order, --no-sweeper or, with --pollers, a poll window longer than
/// the lease fails, as it must), 1 if not, 2 for bad arguments.
#[derive(Parser, Debug)]
#[command(name = "model-check", verbatim_doc_comment)]
struct Cli {
    /// Check the waiting line in its own world instead (the options marked [queue] apply).
    #[arg(long)]
    queue: bool,

    /// Check leases (F13) in their own world instead: two holders of one slot under leases of
    /// one tick, their heartbeats and take-backs, one holder's clock a skew ahead (only
    /// --variant applies: real, take-back-without-fence, heartbeat-without-check,
    /// take-back-without-skew).
    #[arg(long, conflicts_with = "queue")]
    leases: bool,

    /// Check pollers in their own world instead: a holder of the one slot, a poller (an Express
    /// execution: a lease, its place kept by its polls, it may stop polling at any point) and a
    /// parked standard execution in one line, with the lease world's clocks and skew (the options
    /// marked [pollers], --ticks [default: 2] and --deaths [0 or 1, default 1] apply; --variant:
    /// real, grant-without-lease, hand-off-grants-stopped-poller,
    /// leave-stopped-without-record-check, stopped-without-skew, poll-keeps-old-time,
    /// poller-counts-from-the-poll-that-found-it).
    #[arg(long, conflicts_with_all = ["queue", "leases"])]
    pollers: bool,

    /// Which protocol to check: the product's, or the AWS sample's (which must fail; it is
    /// checked without a sweeper and without redrives: it has neither).
    #[arg(long, value_enum, default_value_t = Protocol::Ours, conflicts_with = "queue")]
    protocol: Protocol,

    /// A deliberately broken variant of the protocol (or of the line, with --queue), which must
    /// be caught. Of ours: real, cleanup-without-fence, cleanup-skips-when-nothing-held,
    /// release-without-fence, acquire-without-limit, acquire-checks-fences-when-sent,
    /// rotation-without-horizon, release-without-weight-check; with redrives (one by default
    /// for these): redrive-without-guard, redrive-reuses-acquisition, cleanup-ignores-redrive,
    /// cleanup-checks-running-only-before-fence, one-fence-for-every-run,
    /// release-frees-only-its-run; in the gate layout: drop-tombstone-early,
    /// drop-tombstone-at-any-rotation. Of the line: real, hand-off-without-wake-retry,
    /// newcomer-passes-the-line, dead-waiter-not-skipped, grant-ignores-weight,
    /// check-keeps-old-token, check-takes-a-new-place.
    #[arg(long, value_name = "NAME", default_value = "real")]
    variant: String,

    /// Where the lock keeps its holders: item (all in the lock's item) or gate (each holding
    /// an item of its own, released acquisitions as tombstones that a rotation's turn drops).
    /// The product's protocol only; the variants drop-tombstone-early and
    /// drop-tombstone-at-any-rotation are checked in the gate layout.
    #[arg(long, value_name = "LAYOUT", default_value = "item", conflicts_with_all = ["queue", "leases", "pollers"])]
    layout: Layout,

    /// Executions contending [default: 3; at most 8, with --queue 4].
    #[arg(long, value_name = "N")]
    executions: Option<u8>,

    /// The lock's limit [default: 1, with --queue 2; from 1 to 100, with --queue at most the
    /// sum of the weights].
    #[arg(long, value_name = "N")]
    limit: Option<u32>,

    /// The lock configured by its operator with this limit before any execution starts (F14):
    /// the executions still ask for --limit, and the configured limit bounds what is held.
    /// The product's protocol only, not with --queue.
    #[arg(long, value_name = "N")]
    configured_limit: Option<u32>,

    /// The weight each execution acquires with, exec-1 first; missing ones are 1; each from 1
    /// to the limit [default: 1 each, with --queue 1,2,1,1].
    #[arg(long, value_name = "W,W,...", value_delimiter = ',', value_parser = clap::value_parser!(u32).range(1..))]
    weights: Option<Vec<u32>>,

    /// Executions that may die, at any point [default: 1; with --every-fault every execution;
    /// with --pollers, whether the parked execution may be stopped while it waits: 0 or 1].
    #[arg(long, value_name = "N")]
    deaths: Option<u8>,

    /// No sweeper at all (with --queue, the slots the design leaves to it, a holder that died
    /// with its cleanup event lost, stall the line: L1 must fail).
    #[arg(long)]
    no_sweeper: bool,

    /// Stop after N states (the result is then incomplete).
    #[arg(long, value_name = "N")]
    max_states: Option<u64>,

    /// Identify states exactly, not up to renaming the executions, version numbers and what no
    /// check reads (slower; for checking the reduction).
    #[arg(long)]
    exact: bool,

    /// Start from every fault at once: duplicated and lost events, lost writes, a sweep at any
    /// moment, work failures, release timeouts, every execution may die.
    #[arg(long, conflicts_with = "queue")]
    every_fault: bool,

    /// Step Functions retries per execution: a new attempt while the old one may still run
    /// [default: 1].
    #[arg(long, value_name = "N", conflicts_with = "queue")]
    retries: Option<u8>,

    /// More acquires after "full" before giving up [default: any number; an execution may give
    /// up after any "full"].
    #[arg(long, value_name = "N", conflicts_with = "queue")]
    polls: Option<u8>,

    /// Times the clock moves on by the horizon, at any moment [default: 1; with --pollers, by
    /// a tick (the lease, the poll window, the clock skew), default 2].
    #[arg(long, value_name = "N", conflicts_with = "queue")]
    ticks: Option<u8>,

    /// Fence rotations per run, each at any moment it is due [default: 2].
    #[arg(long, value_name = "N", conflicts_with = "queue")]
    rotations: Option<u8>,

    /// Cleanup events that may be delivered twice [default: 0].
    #[arg(long, value_name = "N", conflicts_with = "queue")]
    duplicates: Option<u8>,

    /// Sweeps at any moment, besides the final one [default: 0].
    #[arg(long, value_name = "N", conflicts_with = "queue")]
    sweeps: Option<u8>,

    /// Redrives of failed, aborted or timed-out executions per run, each resuming where the
    /// execution stopped [default: 0, 1 for the redrive variants; at most 3].
    #[arg(long, value_name = "N", conflicts_with = "queue")]
    redrives: Option<u8>,

    /// Stray releases per run (F15): a release naming the slot of an execution at work but
    /// showing another slot's token [default: 0, 1 for release-ignores-token].
    #[arg(long, value_name = "N", conflicts_with = "queue")]
    strays: Option<u8>,

    /// Cleanup events are never lost.
    #[arg(long, conflicts_with = "queue")]
    no_lost_events: bool,

    /// Writes in flight may be lost (the attempt fails with an error).
    #[arg(long, conflicts_with_all = ["queue", "no_lost_writes"])]
    lost_writes: bool,

    /// Writes in flight are never lost (the default, but with --every-fault).
    #[arg(long, conflicts_with = "queue")]
    no_lost_writes: bool,

    /// The protected work may fail.
    #[arg(long, conflicts_with = "queue")]
    work_failures: bool,

    /// Step Functions may also time out and retry a running release.
    #[arg(long, conflicts_with = "queue")]
    release_timeouts: bool,

    /// [pollers] How many times the poller invokes the acquire function, its first ask
    /// included [default: 3].
    #[arg(long, value_name = "N", requires = "pollers", value_parser = clap::value_parser!(u8).range(1..=8))]
    poller_polls: Option<u8>,

    /// [pollers] The poller's lease, in ticks [default: 1].
    #[arg(long, value_name = "N", requires = "pollers", value_parser = clap::value_parser!(u8).range(1..=3))]
    lease_ticks: Option<u8>,

    /// [pollers] How long a poll keeps the poller's place, in ticks [default: 1].
    #[arg(long, value_name = "N", requires = "pollers", value_parser = clap::value_parser!(u8).range(1..=3))]
    poll_ticks: Option<u8>,

    /// [queue] Cleanup events that may be lost [default: 1].
    #[arg(long, value_name = "N", requires = "queue")]
    lost_events: Option<u8>,

    /// [queue] Wait, release or cleanup Lambdas that may crash between two requests
    /// [default: 1].
    #[arg(long, value_name = "N", requires = "queue")]
    crashes: Option<u8>,

    /// [queue] Early fallback timeouts of parked tasks, at any moment, racing wake-ups
    /// [default: 0; each multiplies the states by about 40].
    #[arg(long, value_name = "N", requires = "queue")]
    timeouts: Option<u8>,

    /// [queue] L2 as "every grant goes to the head of the line as it lands", without the
    /// exception for queue writes that land after the hand-off read the head (the real
    /// protocol does not meet it: L2 must fail).
    #[arg(long, requires = "queue")]
    strict_order: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Protocol {
    /// The product's protocol.
    Ours,
    /// The original AWS sample's.
    Sample,
}

/// A bad combination of arguments: the message, and exit status 2.
fn usage_error(message: String) -> ! {
    Cli::command()
        .error(ErrorKind::ValueValidation, message)
        .exit()
}

/// `--weights`, one per execution up to `N`, the rest 1.
fn weights<const N: usize>(given: Option<&[u32]>, default: [u32; N]) -> [u32; N] {
    let Some(given) = given else {
        return default;
    };
    if given.len() > N {
        usage_error(format!("--weights: at most {N} weights"));
    }
    let mut weights = [1; N];
    weights[..given.len()].copy_from_slice(given);
    weights
}

/// Checks that the first `executions` weights are within the limit.
fn within(weights: &[u32], executions: u8, limit: u32) {
    if let Some(w) = weights[..usize::from(executions)]
        .iter()
        .find(|&&w| w > limit)
    {
        usage_error(format!(
            "a weight of {w} is above the limit {limit}: pass --weights (or a larger --limit)"
        ));
    }
}

impl Cli {
    fn queue_config(&self) -> (QueueConfig, QueueVariant) {
        let variant = QueueVariant::parse(&self.variant).unwrap_or_else(|| {
            usage_error(format!(
                "--variant: unknown variant of the line {:?}",
                self.variant
            ))
        });
        if self.configured_limit.is_some() {
            usage_error("--configured-limit is not a setting of the line's world (--queue)".into());
        }
        let default = QueueConfig::weighted();
        let config = QueueConfig {
            executions: self.executions.unwrap_or(default.executions),
            limit: self.limit.unwrap_or(default.limit),
            weights: weights(self.weights.as_deref(), default.weights),
            deaths: self.deaths.unwrap_or(default.deaths),
            lost_events: self.lost_events.unwrap_or(default.lost_events),
            crashes: self.crashes.unwrap_or(default.crashes),
            timeouts: self.timeouts.unwrap_or(default.timeouts),
            strict_order: self.strict_order,
            sweeper: !self.no_sweeper,
        };
        if !(1..=MAX_WAITERS).contains(&usize::from(config.executions)) {
            usage_error(format!(
                "--executions must be from 1 to {MAX_WAITERS} with --queue"
            ));
        }
        let total: u32 = config.weights[..usize::from(config.executions)]
            .iter()
            .sum();
        if !(1..=total).contains(&config.limit) {
            usage_error(
                "--limit must be from 1 to the sum of the executions' weights with --queue".into(),
            );
        }
        within(&config.weights, config.executions, config.limit);
        (config, variant)
    }

    fn config(&self) -> (Config, Variant) {
        let variant = Variant::parse(&self.variant).unwrap_or_else(|| {
            usage_error(format!("--variant: unknown variant {:?}", self.variant))
        });
        let executions = self.executions.unwrap_or(3);
        let default = if self.every_fault {
            Config::every_fault(executions, 1)
        } else {
            Config {
                executions,
                ..Config::small(1)
            }
        };
        let config = Config {
            executions,
            // A variant that differs from the real protocol only on a configured lock is
            // checked on one unless told otherwise.
            limit: self.limit.unwrap_or(
                variant
                    .configured_world()
                    .map_or(default.limit, |(asked, _)| asked),
            ),
            configured_limit: self
                .configured_limit
                .or(variant.configured_world().map(|(_, configured)| configured)),
            weights: weights(self.weights.as_deref(), default.weights),
            retries: self.retries.unwrap_or(default.retries),
            release_timeouts: default.release_timeouts || self.release_timeouts,
            polls: self.polls.or(default.polls),
            deaths: self.deaths.unwrap_or(default.deaths),
            duplicates: self.duplicates.unwrap_or(default.duplicates),
            lost_events: default.lost_events && !self.no_lost_events,
            lost_writes: (default.lost_writes || self.lost_writes) && !self.no_lost_writes,
            work_failures: default.work_failures || self.work_failures,
            sweeper: default.sweeper && !self.no_sweeper,
            sweeps: self.sweeps.unwrap_or(default.sweeps),
            ticks: self.ticks.unwrap_or(default.ticks),
            rotations: self.rotations.unwrap_or(default.rotations),
            // A variant that differs from the real protocol only when executions are redriven
            // is checked with a redrive unless told otherwise.
            redrives: self.redrives.unwrap_or(u8::from(variant.needs_redrives())),
            // A variant of the gate's tombstones is checked in the gate layout.
            layout: if variant.needs_gate() {
                Layout::Gate
            } else {
                self.layout
            },
            // A variant that differs from the real protocol only on a stray release is checked
            // with one unless told otherwise.
            strays: self.strays.unwrap_or(variant.strays()),
        };
        if !(1..=MAX_EXECUTIONS).contains(&usize::from(config.executions)) {
            usage_error(format!("--executions must be from 1 to {MAX_EXECUTIONS}"));
        }
        if !(1..=100).contains(&config.limit) {
            usage_error("--limit must be from 1 to 100".into());
        }
        if self.protocol == Protocol::Ours {
            within(
                &config.weights,
                config.executions,
                config
                    .configured_limit
                    .unwrap_or(config.limit)
                    .min(config.limit),
            );
        }
        if config.configured_limit.is_some() && self.protocol != Protocol::Ours {
            usage_error("--configured-limit is for the product's protocol only".into());
        }
        if config
            .configured_limit
            .is_some_and(|c| !(1..=100).contains(&c))
        {
            usage_error("--configured-limit must be from 1 to 100".into());
        }
        if usize::from(config.redrives) >= MAX_INCARNATIONS {
            usage_error(format!(
                "--redrives must be at most {}",
                MAX_INCARNATIONS - 1
            ));
        }
        (config, variant)
    }
}

/// Explores `model`, identifying states exactly if asked.
fn run<M: Model>(model: M, exact: bool, max_states: Option<u64>) -> Report {
    if exact {
        explore(&model.exact(), max_states)
    } else {
        explore(&model, max_states)
    }
}

/// Prints what the exploration found; whether it is what was expected.
fn print_report(report: &Report, passed: &str, must_fail: bool) -> bool {
    println!("states explored: {}", report.states);
    println!("transitions:     {}", report.transitions);
    println!("max depth:       {}", report.max_depth);
    println!("time:            {:.2?}", report.elapsed);
    match &report.counterexample {
        Some(cex) => {
            println!(
                "result:          {} VIOLATED; counterexample ({} steps):",
                cex.violation.property,
                cex.steps.len()
            );
            println!("{cex}");
        }
        None if report.complete => println!("result:          {passed}"),
        None => {
            println!("result:          INCOMPLETE: stopped at --max-states, no violation so far")
        }
    }
    if must_fail {
        report.counterexample.is_some()
    } else {
        report.passed()
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let as_expected = if cli.pollers {
        let variant = PollVariant::parse(&cli.variant).unwrap_or_else(|| {
            usage_error(format!(
                "--variant with --pollers: unknown variant {:?}",
                cli.variant
            ))
        });
        let default = PollConfig::small();
        let config = PollConfig {
            ticks: cli.ticks.unwrap_or(default.ticks),
            deaths: cli.deaths.unwrap_or(default.deaths),
            polls: cli.poller_polls.unwrap_or(default.polls),
            lease_ticks: cli.lease_ticks.unwrap_or(default.lease_ticks),
            poll_ticks: cli.poll_ticks.unwrap_or(default.poll_ticks),
        };
        if config.deaths > 1 {
            usage_error("--deaths must be 0 or 1 with --pollers".into());
        }
        if config.ticks > 8 {
            usage_error("--ticks must be at most 8 with --pollers".into());
        }
        let report = run(PollWorld::new(config, variant), cli.exact, cli.max_states);
        println!("model check of pollers, variant {}", variant.name());
        println!("world: {config}");
        print_report(
            &report,
            "no violation of S1, S2, S3, L2, F8 or L1 in any reachable state",
            variant != PollVariant::Real || config.poll_ticks > config.lease_ticks,
        )
    } else if cli.leases {
        let variant = LeaseVariant::parse(&cli.variant).unwrap_or_else(|| {
            usage_error(format!(
                "--variant with --leases: unknown variant {:?}",
                cli.variant
            ))
        });
        let config = LeaseConfig::small();
        let report = run(LeaseWorld::new(config, variant), cli.exact, cli.max_states);
        println!("model check of leases, variant {}", variant.name());
        println!("world: {config}");
        print_report(
            &report,
            "no violation of S1 or S3 in any reachable state",
            variant != LeaseVariant::Real,
        )
    } else if cli.queue {
        let (config, variant) = cli.queue_config();
        let report = run(QueueWorld::new(config, variant), cli.exact, cli.max_states);
        println!(
            "model check of the waiting line, variant {}",
            variant.name()
        );
        println!("world: {config}");
        print_report(
            &report,
            "no violation of S1, S3, L2, F8 or L1 in any reachable state",
            variant != QueueVariant::Real || config.strict_order || !config.sweeper,
        )
    } else {
        let (config, variant) = cli.config();
        let (what, config, report, must_fail) = match cli.protocol {
            Protocol::Sample => {
                let world = sample_world(config);
                let config = world.config;
                (
                    "the AWS sample's protocol".to_owned(),
                    config,
                    run(world, cli.exact, cli.max_states),
                    true,
                )
            }
            Protocol::Ours => (
                format!("the product's protocol, variant {}", variant.name()),
                config,
                run(ours_world(config, variant), cli.exact, cli.max_states),
                variant != Variant::Real,
            ),
        };
        println!("model check of {what}");
        println!("world: {config}");
        print_report(
            &report,
            "no violation of S1, S2, S3 or L1 in any reachable state",
            must_fail,
        )
    };
    if as_expected {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
