//! The protocol: which [`Write`](crate::write::Write) each operation sends, and what its result means.
//!
//! None of them reads first. Each is one write whose checks DynamoDB evaluates when it lands, so
//! concurrent writers never invalidate each other's decisions, and every write increments the
//! version, so fencing tokens strictly increase per lock. The table of each operation's checks
//! and changes is in docs/design.md ("The writes").
//!
//! Why each rule holds (the faults are described in docs/design.md):
//! - **F1-F3, S3.** A release or cleanup fences before (or as) it frees. An acquire checks the
//!   fences when it lands, however late that is, so one that lands after the fence is refused.
//!   Fences are dropped only by a rotation, and an acquire is refused once a rotation happened
//!   after its request's horizon; a fence it could have met is older than its request, and is
//!   dropped only by a rotation at least a window after the fence, which is past the horizon
//!   (see [`Timing`]). So no acquire ever lands after a fence it should have met was dropped.
//! - **Cleanup in two writes.** Once the first write has landed the execution is fenced, so no
//!   acquire of it can land any more: the slots the first write saw (its item before the write)
//!   are all it will ever hold, and the second write removes them. A slot freed in between by a
//!   release is simply gone already (removing it again is a no-op).
//! - **F5.** A retried acquire whose first attempt landed fails "not holding": the item it is
//!   handed back shows the slot, and the answer is "already held" with the original token.
//! - **F4, S4.** A write that removes a slot checks that the slot is there with the weight it
//!   subtracts from `used`, so duplicated, late and reordered releases and cleanups each remove
//!   only what their identity holds, subtract its weight once, and add a fence that is already
//!   there. A release refused because the slot is gone (or of another weight) is sent again as
//!   the item handed back says: a fence alone, on the check that nothing is held, or the removal
//!   with the weight held; an acquire of the same acquisition can land between the two only
//!   once, so this ends within a few rounds (see [`Step`]).
//!
//! One file per concern, as [`crate::semaphore`]'s: [`timing`], [`result`], [`slots`], [`cleanup`],
//! [`fences`], [`line`](mod@line), [`leases`], [`config`](mod@config).

pub mod cleanup;
pub mod config;
pub mod fences;
pub mod leases;
pub mod line;
pub mod result;
pub mod slots;
pub mod timing;

pub use cleanup::*;
pub use config::*;
pub use fences::*;
pub use leases::*;
pub use line::*;
pub use result::*;
pub use slots::*;
pub use timing::*;
