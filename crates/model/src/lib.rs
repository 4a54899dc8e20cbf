//! An exhaustive model check of the semaphore protocol.
//!
//! A breadth-first explorer ([`explore`]) visits every reachable state of a small world
//! ([`world`]): `K` executions run by the lock-protected state machine, each of whose Lambda
//! attempts sends its write when it decides; writes land arbitrarily late and in any order, or
//! are lost; Step Functions retries attempts while the old ones keep running; executions die at
//! any point and leave zombies; cleanup events are lost, duplicated and reordered; a sweeper runs
//! at any moment; the clock moves on and the fences rotate at any moment they are due; Step
//! Functions redrives failed and stopped executions, which run again from where they stopped as
//! a new incarnation with an acquisition of its own (F7); executions may acquire with different
//! weights (`Config::weights`). A release is one write, or several: a refused one (its slot is
//! gone, or of another weight) is followed by the write the core's reading of the refusal calls
//! for, and so is a cleanup's refused free, each a step of its own, so that an acquire may land
//! between the rounds. Every write
//! of the product's protocol is the core's own, applied by the core's `Write::apply` ([`ours`]);
//! the same world also runs the AWS sample's protocol ([`sample`]), where the checker finds the
//! seed race.
//!
//! Properties checked in every reachable state:
//! - **S1**: the weights held add up to at most `limit`, and the item's stored sum (`used`)
//!   equals them; the live executions working under the lock weigh at most `limit` together,
//!   and each of them holds a slot of its current incarnation (a slot an earlier incarnation
//!   left does not count: cleanup and the sweeper may free it at any time).
//! - **S3**: no acquire of an incarnation lands after a release by that incarnation, or a
//!   cleanup of its execution after it had ended, has landed (an incarnation redriven since a
//!   cleanup may acquire: that is not a resurrection).
//! - **S2**: an execution that has ended, with none of its requests in flight and every cleanup
//!   event for it delivered, holds nothing; and once everything has ended and every request
//!   and event is delivered or lost, one sweep leaves nothing held.
//! - **L1** (what is expressible here): no deadlock (every state short of the end has a
//!   successor), and a running execution is never refused (fenced).
//!
//! How the state space is kept small, without losing behaviours:
//! - states are identified up to a renaming of the executions, and (for the product's
//!   protocol) up to what no check reads: the version, the tokens, when a slot was taken (see
//!   `Ours::item_key`); an execution that has finished is identified by that alone. A test
//!   explores small worlds both ways and compares the verdicts;
//! - the fate of a cleanup event (delivered, lost, delivered twice) is chosen when it is
//!   emitted, which is equivalent to choosing it later;
//! - a sweep that finds no holder whose execution has ended is not explored (it changes
//!   nothing), and the sweeper's cleanups of several holders may overlap (a superset of the
//!   real one-at-a-time order);
//! - an execution told "full" (or "redriven") may wait and poll any number of times, or give up
//!   (a superset of every bound on polls, with no counter to tell states apart);
//! - a cleanup's second `DescribeExecution`, once its fence has landed, is taken at the moment
//!   the fence lands: a redrive between the two could only make it answer "running" and free
//!   less, and no acquire of the execution can land in between;
//! - a rotation is allowed whenever one is due, whatever the number of fences (a superset of
//!   the production rule, which also waits for a few young fences).
//!
//! Not covered: start rates (no execution asks for one: `Grant::TooSoon`, `Waker::defer` and
//! `RateLimited` are not explored), clock skew (the horizon and the fence window are one tick each, and the
//! window's derivation adds the skew: `Timing`); starvation and fairness (a waiting execution
//! may poll for ever; backoff and jitter are real-time matters), partitions other than delayed
//! or lost requests, a failing read, several locks, and several acquisitions per incarnation.
//! Redrive: the child execution of the protected work is not modelled (its own life, the
//! cleanup's deferral while it runs, a redriven parent attaching to a child still running,
//! which `StartExecution` allows for the same name and input); a redrive into the work always
//! meets a child that has ended, so a parent stopped after entering the work but before the
//! child was started, whose redrive would start it without a slot, is not in the model either.
//! The sample's protocol is checked without redrives (it has no redrive handling).

pub mod explore;
pub mod hash;
pub mod lease;
pub mod ours;
pub mod plumbing;
pub mod poll;
pub mod queue;
pub mod sample;
pub mod world;

pub use explore::{explore, Counterexample, Exact, Model, Reach, Report, Violation};
pub use lease::{LeaseConfig, LeaseVariant, LeaseWorld};
pub use ours::{Ours, Variant};
pub use plumbing::Variants;
pub use poll::{PollConfig, PollVariant, PollWorld};
pub use queue::{QueueConfig, QueueVariant, QueueWorld};
pub use sample::Sample;
pub use world::{Config, World};

/// Checks the product's protocol (or a broken `variant` of it) in the world `config`.
pub fn check_ours(config: Config, variant: Variant, max_states: Option<u64>) -> Report {
    explore(&ours_world(config, variant), max_states)
}

/// The world `config` around the product's protocol (or a broken `variant` of it).
pub fn ours_world(config: Config, variant: Variant) -> World<Ours> {
    let protocol = Ours::new(
        config.executions,
        config.limit,
        &config.weights[..usize::from(config.executions)],
        config.redrives + 1,
        variant,
    )
    .configured(config.configured_limit)
    .in_layout(config.layout);
    World::new(protocol, config)
}

/// Checks leases (or a broken `variant` of them) in the lease world `config`.
pub fn check_leases(config: LeaseConfig, variant: LeaseVariant, max_states: Option<u64>) -> Report {
    explore(&LeaseWorld::new(config, variant), max_states)
}

/// Checks pollers (or a broken `variant` of their protocol) in the pollers' world `config`.
pub fn check_pollers(config: PollConfig, variant: PollVariant, max_states: Option<u64>) -> Report {
    explore(&PollWorld::new(config, variant), max_states)
}

/// Checks the waiting line (or a broken `variant` of it) in the queue world `config`.
pub fn check_queue(config: QueueConfig, variant: QueueVariant, max_states: Option<u64>) -> Report {
    explore(&QueueWorld::new(config, variant), max_states)
}

/// Checks the AWS sample's protocol in the world `config`, without a sweeper (the sample has
/// none).
pub fn check_sample(config: Config, max_states: Option<u64>) -> Report {
    explore(&sample_world(config), max_states)
}

/// The world `config` around the AWS sample's protocol, without a sweeper (it has none) and
/// without redrives: the sample has no redrive handling at all (a redrive into its work runs it
/// again without a slot, F7, by design), and it leaks without any redrive already.
pub fn sample_world(config: Config) -> World<Sample> {
    let config = Config {
        weights: [1; world::MAX_EXECUTIONS],
        sweeper: false,
        ticks: 0,
        rotations: 0,
        redrives: 0,
        ..config
    };
    World::new(Sample::new(config.limit), config)
}
