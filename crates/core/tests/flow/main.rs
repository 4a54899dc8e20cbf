//! The core's flows, driven one call at a time with the replies each call could get, as the
//! model checker drives them: what each reply leads to, and where each flow ends.
//!
//! - `acquire`: acquire or wait in line (the acquire function's flow);
//! - `cleanup`: clean up after an ended execution (the cleanup function's flow), and its answer;
//! - `release`: release, a redriven run's earlier runs, hand off (the release function's flow).

mod acquire;
mod cleanup;
mod release;
