//! The [`Semaphore`](semaphore_core::Semaphore) through the crate's public API, on the memory
//! store (which applies the same writes the DynamoDB store sends, with the same meaning,
//! [`Write::apply`](semaphore_core::Write::apply)) and a manual clock. One file per concern, as
//! in `src/semaphore/`:
//!
//! - `slots`: acquire, release, fence, free, cleanup, and what each costs in requests;
//! - `line`: queueing, hand-offs, re-parking and leaving;
//! - `sweep`: what the sweeper reclaims, and what it leaves alone;
//! - `leases`: leased slots, their heartbeats, and their take-back (F13);
//! - `gate`: the gate layout (holders out of the lock's item, tombstones for released acquisitions).

use semaphore_core::{Limit, LockName};

mod gate;
mod leases;
mod line;
mod slots;
mod sweep;

fn lock() -> LockName {
    LockName::new("l").unwrap()
}

fn limit(n: i64) -> Limit {
    Limit::new(n).unwrap()
}
