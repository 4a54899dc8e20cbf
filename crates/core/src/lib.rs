//! A distributed semaphore for AWS Step Functions that cannot leak.
//!
//! One DynamoDB item per lock holds its holders (with their weights and the sum of them), a
//! version counter and the fences of the last window or two. Every operation is one conditional
//! write (cleanup: two; a release or cleanup whose slot went meanwhile, one more) described as a plain
//! [`Write`] (checks + changes): [`protocol`] says which writes each operation sends and what
//! their results mean, [`Write::apply`] is their meaning, the [`MemoryStore`] applies them with
//! it and the [`DynamoStore`] renders them as `UpdateItem` expressions. A [`Semaphore`] runs an
//! operation against a store.
//!
//! Which fault each rule defends against (see `DESIGN.md` for F1-F6, and `protocol` for why):
//! - release and cleanup fence the acquisition or the execution's ended runs; an acquire checks
//!   the fences when its write lands, however late, so one that lands after them is refused
//!   (F1-F3); a redriven execution is a new run, which no earlier cleanup fenced (F7);
//! - fences are dropped only by a rotation, and an acquire whose request is older than the
//!   horizon is refused once a rotation happened, so dropping fences reopens nothing (F1);
//! - an identity that already holds a slot is answered "already held", not given a second (F5);
//! - the limit bounds the sum of the weights held, stored as `used`; a write that removes a slot
//!   checks it is there with the weight it subtracts, so duplicates and reorderings each remove
//!   only what their identity holds and subtract it once (F4, S1); a start rate is a least
//!   spacing since the last start, checked when the write lands;
//! - every input is validated before any request is sent (F6).

pub mod clock;
pub mod dynamo;
mod error;
pub mod input;
pub mod item;
pub mod memory;
pub mod protocol;
pub mod queue;
mod store;
pub mod sweep;
pub mod write;

pub use clock::{rfc3339_millis, Clock, ManualClock, SystemClock};
pub use dynamo::{DynamoStore, TableSetup};
pub use error::{Error, StoreError};
pub use input::{AcquisitionId, HolderId, InputError, Limit, LockName, Rate, Terms, Weight};
pub use item::{FenceKey, Fences, FencingToken, Holding, Identity, Run, SemaphoreItem, Version};
pub use memory::MemoryStore;
pub use protocol::{
    AcquireOutcome, CleanupOutcome, FenceReason, ReleaseOutcome, Step, Timing, WriteResult,
};
pub use queue::{HandOff, QueueKey, QueueOutcome, TaskToken, Waiter, Wake, Waker};
pub use store::{Fenced, ItemStore, Semaphore, MAX_ROUNDS};
pub use sweep::{
    missing_long_enough, ExecutionState, ExecutionStatus, LargestItem, LineSweep, Reclaimed,
    SweepReport, MISSING_EXECUTION_GRACE_MS,
};
pub use write::{Change, Check, Write};
