//! The functions' flows, free of I/O: each is a value that says which call comes next (a write
//! or read of the store, a hand-off, an outside call) and takes its answer, until it is done.
//!
//! A flow decides; it never waits. [`crate::semaphore`] drives a flow against a real store (the
//! Lambda functions, `semctl`), and the model checker drives the same flow one call at a time,
//! with every other process's calls allowed in between: what it checks is what ships.
//!
//! - [`acquire`]: acquire or wait in line (the acquire function, for parked and polling callers);
//! - [`answer`]: the acquire answer a caller gets back, and the work it starts under its slot;
//! - [`cleanup`]: clean up after an ended execution (the cleanup function: fence, leave the
//!   lines, free and hand off), and its answer;
//! - [`release`]: release a slot, free a redriven run's earlier runs, hand off (the release
//!   function).

pub mod acquire;
pub mod answer;
pub mod cleanup;
pub mod release;
