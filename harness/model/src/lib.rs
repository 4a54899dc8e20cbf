//! An exhaustive model check of the semaphore protocol: every interleaving of a small world is
//! explored, not a sample of them, because the races the protocol must win (a late acquire
//! against a fence, a zombie against a rotation, a grant against a death) are too rare to meet
//! by testing.
//!
//! A breadth-first explorer ([`explore`](mod@explore)) visits every reachable state of a small world
//! ([`world`]): executions whose writes land arbitrarily late, in any order, or are lost; Step
//! Functions retries, deaths, zombies and redrives (F7); cleanup events lost, duplicated and
//! reordered; a sweeper; a clock and fence rotations. Every write of the product's protocol is
//! the core's own, applied by `Write::apply` ([`ours`]), so what is explored is what is sent;
//! the same world runs the AWS sample's protocol ([`sample`]), where the checker finds its leak.
//! Worlds of their own check the line ([`queue`]), leases ([`lease`]) and pollers ([`poll`]).
//!
//! Checked in every reachable state: S1 (the weights held within the limit, and equal to the
//! stored `used`), S3 (no acquire lands after the release or cleanup that fenced it), S2 (an
//! ended execution holds nothing once its events are delivered; one sweep at the end leaves
//! nothing held) and L1 (no deadlock; a running execution is never fenced). The worlds, the
//! reductions that keep them small and what is not covered are described in docs/testing.md ("Model
//! check: every interleaving of a small world").

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
