//! The protocol's writes and what their results mean, through the crate's public API: each write
//! landed as a store lands it ([`Write::apply`](semaphore_core::Write::apply) on an item, or the
//! memory store, which applies it to the item and a waiter's record at once), and its result
//! read as the protocol reads it.
//!
//! - `slots`: acquire, release, cleanup and the rotation of the fences;
//! - `line`: queueing, grants, re-parking and leaving.

use std::time::Duration;

use semaphore_core::{Limit, LockName, Timing};

mod line;
mod slots;

const T: Timing = Timing {
    horizon: Duration::from_secs(8),
    clock_skew: Duration::from_secs(2),
};

fn lock() -> LockName {
    LockName::new("l").unwrap()
}

fn limit(n: i64) -> Limit {
    Limit::new(n).unwrap()
}
