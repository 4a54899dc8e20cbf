//! The core's flows, driven one call at a time with the replies each call could get, as the
//! model checker drives them: what each reply leads to, and where each flow ends.
//!
//! - `acquire`: acquire or wait in line (the acquire function's flow);
//! - `release`: release, a redriven run's earlier runs, hand off (the release function's flow).

mod acquire;
mod release;
