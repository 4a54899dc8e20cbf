//! Runs the model check for a configuration given on the command line.
//!
//! `cargo run --release -p semaphore-model --bin model-check -- --executions 4 --limit 2`
//! checks the product's protocol; `--protocol sample` the AWS sample's (which must fail);
//! `--variant <name>` a deliberately broken variant of the product's; `--queue` the waiting line
//! in its own world (`semaphore_model::queue`). Exit status: 0 if the result is the expected
//! one, 1 if not, 2 for bad arguments.

use std::process::ExitCode;

use semaphore_model::queue::MAX_WAITERS;
use semaphore_model::world::{MAX_EXECUTIONS, MAX_INCARNATIONS};
use semaphore_model::{
    explore, ours_world, sample_world, Config, QueueConfig, QueueVariant, QueueWorld, Report,
    Variant,
};

const USAGE: &str = "\
usage: model-check [options]
The world starts as the one `cargo test` checks (3 executions, limit 1, one retry each, one
death, lost and late events, late writes, a final sweep); options change it.
  --every-fault              start from every fault at once instead: duplicated and lost events,
                             lost writes, a sweep at any moment, work failures, release
                             timeouts, every execution may die
  --protocol ours|sample     which protocol to check (default: ours)
  --variant NAME             a broken variant of ours: real (default), cleanup-without-fence,
                             cleanup-skips-when-nothing-held, release-without-fence,
                             acquire-without-limit, acquire-checks-fences-when-sent,
                             rotation-without-horizon, release-without-weight-check; with
                             redrives (default 1 for these): redrive-without-guard,
                             redrive-reuses-acquisition,
                             cleanup-ignores-redrive, cleanup-checks-running-only-before-fence,
                             one-fence-for-every-run
  --executions N             executions contending (default 3)
  --limit N                  the lock's limit (default 1)
  --weights W,W,...          the weight each execution acquires with, exec-1 first (default 1
                             each; each from 1 to the limit; missing ones are 1)
  --retries N                Step Functions retries per execution (default 1)
  --polls N                  more acquires after 'full' before giving up (default: any
                             number; an execution may give up after any 'full')
  --ticks N                  times the clock moves on by the horizon (default 1)
  --rotations N              fence rotations per run, each at any moment it is due (default 2)
  --deaths N                 executions that may die (default 1; all with --every-fault)
  --duplicates N             cleanup events that may be delivered twice (default 0)
  --sweeps N                 sweeps at any moment, besides the final one (default 0)
  --redrives N               redrives of failed, aborted or timed-out executions per run, each
                             resuming where the execution stopped (default 0; at most 3; the
                             sample is always checked without: it has no redrive handling)
  --no-sweeper               no sweeper at all
  --no-lost-events           cleanup events are never lost
  --lost-writes              writes in flight may be lost
  --no-lost-writes           writes in flight are never lost
  --work-failures            the protected work may fail
  --release-timeouts         Step Functions may also time out and retry a running release
  --max-states N             stop after N states (the result is then incomplete)
  --exact                    identify states exactly, not up to renaming the executions and
                             version numbers (slower; for checking the reduction)
Exit status: 0 if ours passes (or the sample / a broken variant fails, as it must), 1 otherwise.

usage: model-check --queue [options]
The waiting line in its own world (default: 3 executions of weights 1, 2, 1 on a lock of limit
2, so a heavy head waits for both units and nobody passes it): executions that find the lock
full queue, park, are handed a slot and woken (or re-check on a fallback timeout), work and
release; hand-offs are one request per step; executions die, cleanup events are lost, Lambdas
crash between requests, parked tasks time out early (each bounded). Checks S1 (the weights held
at most the limit and equal to `used`), S3, L2 (grants in line order, no acquire passing the
line, a heavy head waiting), F8 (grants to the dead freed, nobody sleeping through a free slot) and L1
(no stall: the fallback re-checks let everyone finish).
  --variant NAME             a broken variant: real (default), hand-off-without-wake-retry,
                             newcomer-passes-the-line, dead-waiter-not-skipped,
                             grant-ignores-weight
  --executions N             executions contending (default 3, at most 4)
  --limit N                  the lock's limit (default 2)
  --weights W,W,...          the weight each execution acquires with, exec-1 first (default
                             1,2,1,1; each from 1 to the limit; missing ones are 1)
  --deaths N                 executions that may be stopped (default 1)
  --lost-events N            cleanup events that may be lost (default 1)
  --crashes N                wait, release or cleanup Lambdas that may crash (default 1)
  --timeouts N               early fallback timeouts of parked tasks, at any moment, racing
                             wake-ups (default 0; each multiplies the states by about 40)
  --strict-order             L2 as \"every grant goes to the head of the line as it lands\",
                             without the exception for queue writes that land after the
                             hand-off read the head (the real protocol does not meet it)
  --no-sweeper               no sweeper: the slots the design leaves to it (a holder that
                             died with its cleanup event lost) stall the line (L1 must fail)
  --max-states N             stop after N states (the result is then incomplete)
  --exact                    identify states exactly, not up to versions and executions that
                             are gone (slower; for checking the reduction)
Exit status: 0 if the real line passes (or a broken variant, --strict-order or --no-sweeper
fails, as it must), 1 otherwise.";

/// Parses `--weights 1,2,1`: one weight per execution, `exec-1` first; the rest are 1.
fn weights<const N: usize>(text: &str) -> Result<[u32; N], String> {
    let mut weights = [1; N];
    let parts: Vec<&str> = text.split(',').collect();
    if parts.len() > N {
        return Err(format!("--weights: at most {N} weights"));
    }
    for (weight, part) in weights.iter_mut().zip(parts) {
        *weight = part
            .trim()
            .parse()
            .ok()
            .filter(|&w| w >= 1)
            .ok_or(format!("--weights: {part:?} is not a whole number from 1"))?;
    }
    Ok(weights)
}

/// Checks that the first `executions` weights are within the limit.
fn within(weights: &[u32], executions: u8, limit: u32) -> Result<(), String> {
    match weights[..usize::from(executions)]
        .iter()
        .find(|&&w| w > limit)
    {
        Some(w) => Err(format!(
            "a weight of {w} is above the limit {limit}: pass --weights (or a larger --limit)"
        )),
        None => Ok(()),
    }
}

struct QueueArgs {
    config: QueueConfig,
    variant: QueueVariant,
    max_states: Option<u64>,
    exact: bool,
}

fn parse_queue() -> Result<QueueArgs, String> {
    let mut args = QueueArgs {
        config: QueueConfig::weighted(),
        variant: QueueVariant::Real,
        max_states: None,
        exact: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = |name: &str| -> Result<u64, String> {
            let text = it.next().ok_or(format!("{name} needs a value"))?;
            text.parse()
                .map_err(|_| format!("{name}: {text:?} is not a whole number"))
        };
        let small =
            |n: u64, name: &str| u8::try_from(n).map_err(|_| format!("{name}: {n} is too large"));
        let c = &mut args.config;
        match flag.as_str() {
            "--queue" => {}
            "--variant" => {
                let name = it.next().unwrap_or_default();
                args.variant = QueueVariant::parse(&name)
                    .ok_or(format!("--variant: unknown variant of the line {name:?}"))?;
            }
            "--executions" => c.executions = small(value(&flag)?, &flag)?,
            "--limit" => {
                c.limit = u32::try_from(value(&flag)?).map_err(|_| "--limit is too large")?
            }
            "--deaths" => c.deaths = small(value(&flag)?, &flag)?,
            "--lost-events" => c.lost_events = small(value(&flag)?, &flag)?,
            "--crashes" => c.crashes = small(value(&flag)?, &flag)?,
            "--timeouts" => c.timeouts = small(value(&flag)?, &flag)?,
            "--weights" => c.weights = weights(&it.next().unwrap_or_default())?,
            "--strict-order" => c.strict_order = true,
            "--no-sweeper" => c.sweeper = false,
            "--exact" => args.exact = true,
            "--max-states" => args.max_states = Some(value(&flag)?),
            "-h" | "--help" => {
                println!("{USAGE}");
                std::process::exit(0);
            }
            other => return Err(format!("unknown option {other:?} (with --queue)")),
        }
    }
    let c = &args.config;
    if !(1..=MAX_WAITERS).contains(&usize::from(c.executions)) {
        return Err(format!(
            "--executions must be from 1 to {MAX_WAITERS} with --queue"
        ));
    }
    if !(1..=c.weights[..usize::from(c.executions)].iter().sum()).contains(&c.limit) {
        return Err(
            "--limit must be from 1 to the sum of the executions' weights with --queue".into(),
        );
    }
    within(&c.weights, c.executions, c.limit)?;
    Ok(args)
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

fn queue_main() -> ExitCode {
    let args = match parse_queue() {
        Ok(args) => args,
        Err(problem) => {
            eprintln!("model-check: {problem}");
            eprintln!("{USAGE}");
            return ExitCode::from(2);
        }
    };
    let world = QueueWorld::new(args.config, args.variant);
    let world = if args.exact { world.exact() } else { world };
    let report = explore(&world, args.max_states);
    println!(
        "model check of the waiting line, variant {}",
        args.variant.name()
    );
    println!("world: {}", args.config);
    let as_expected = print_report(
        &report,
        "no violation of S1, S3, L2, F8 or L1 in any reachable state",
        args.variant != QueueVariant::Real || args.config.strict_order || !args.config.sweeper,
    );
    if as_expected {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

struct Args {
    sample: bool,
    exact: bool,
    variant: Variant,
    config: Config,
    max_states: Option<u64>,
}

fn parse() -> Result<Args, String> {
    let every_fault = std::env::args().any(|a| a == "--every-fault");
    let mut args = Args {
        sample: false,
        exact: false,
        variant: Variant::Real,
        config: if every_fault {
            Config::every_fault(3, 1)
        } else {
            Config::small(1)
        },
        max_states: None,
    };
    let mut deaths = None;
    let mut redrives = None;
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = |name: &str| -> Result<u64, String> {
            let text = it.next().ok_or(format!("{name} needs a value"))?;
            text.parse()
                .map_err(|_| format!("{name}: {text:?} is not a whole number"))
        };
        let small =
            |n: u64, name: &str| u8::try_from(n).map_err(|_| format!("{name}: {n} is too large"));
        let c = &mut args.config;
        match flag.as_str() {
            "--protocol" => {
                args.sample = match it.next().as_deref() {
                    Some("ours") => false,
                    Some("sample") => true,
                    other => {
                        return Err(format!(
                            "--protocol: expected ours or sample, got {other:?}"
                        ))
                    }
                }
            }
            "--variant" => {
                let name = it.next().unwrap_or_default();
                args.variant =
                    Variant::parse(&name).ok_or(format!("--variant: unknown variant {name:?}"))?;
            }
            "--executions" => c.executions = small(value(&flag)?, &flag)?,
            "--limit" => {
                c.limit = u32::try_from(value(&flag)?).map_err(|_| "--limit is too large")?
            }
            "--retries" => c.retries = small(value(&flag)?, &flag)?,
            "--weights" => c.weights = weights(&it.next().unwrap_or_default())?,
            "--polls" => c.polls = Some(small(value(&flag)?, &flag)?),
            "--ticks" => c.ticks = small(value(&flag)?, &flag)?,
            "--rotations" => c.rotations = small(value(&flag)?, &flag)?,
            "--deaths" => deaths = Some(small(value(&flag)?, &flag)?),
            "--duplicates" => c.duplicates = small(value(&flag)?, &flag)?,
            "--sweeps" => c.sweeps = small(value(&flag)?, &flag)?,
            "--redrives" => redrives = Some(small(value(&flag)?, &flag)?),
            "--no-sweeper" => c.sweeper = false,
            "--no-lost-events" => c.lost_events = false,
            "--no-lost-writes" => c.lost_writes = false,
            "--lost-writes" => c.lost_writes = true,
            "--every-fault" => {}
            "--exact" => args.exact = true,
            "--work-failures" => c.work_failures = true,
            "--release-timeouts" => c.release_timeouts = true,
            "--max-states" => args.max_states = Some(value(&flag)?),
            "-h" | "--help" => {
                println!("{USAGE}");
                std::process::exit(0);
            }
            other => return Err(format!("unknown option {other:?}")),
        }
    }
    let c = &mut args.config;
    if !(1..=MAX_EXECUTIONS).contains(&usize::from(c.executions)) {
        return Err(format!("--executions must be from 1 to {MAX_EXECUTIONS}"));
    }
    if !(1..=100).contains(&c.limit) {
        return Err("--limit must be from 1 to 100".into());
    }
    if !args.sample {
        within(&c.weights, c.executions, c.limit)?;
    }
    if let Some(deaths) = deaths {
        c.deaths = deaths;
    } else if every_fault {
        c.deaths = c.executions;
    }
    // A variant that differs from the real protocol only when executions are redriven is
    // checked with a redrive unless told otherwise.
    c.redrives = redrives.unwrap_or(u8::from(args.variant.needs_redrives()));
    if usize::from(c.redrives) >= MAX_INCARNATIONS {
        return Err(format!(
            "--redrives must be at most {}",
            MAX_INCARNATIONS - 1
        ));
    }
    Ok(args)
}

fn main() -> ExitCode {
    if std::env::args().any(|a| a == "--queue") {
        return queue_main();
    }
    let args = match parse() {
        Ok(args) => args,
        Err(problem) => {
            if !problem.is_empty() {
                eprintln!("model-check: {problem}");
            }
            eprintln!("{USAGE}");
            return ExitCode::from(2);
        }
    };
    let (what, config, report, must_fail) = if args.sample {
        let world = sample_world(args.config);
        let world = if args.exact { world.exact() } else { world };
        (
            "the AWS sample's protocol".to_owned(),
            world.config,
            explore(&world, args.max_states),
            true,
        )
    } else {
        let world = ours_world(args.config, args.variant);
        let world = if args.exact { world.exact() } else { world };
        (
            format!("the product's protocol, variant {}", args.variant.name()),
            world.config,
            explore(&world, args.max_states),
            args.variant != Variant::Real,
        )
    };
    println!("model check of {what}");
    println!("world: {config}");
    let as_expected = print_report(
        &report,
        "no violation of S1, S2, S3 or L1 in any reachable state",
        must_fail,
    );
    if as_expected {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
