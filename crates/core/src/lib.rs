//! A distributed semaphore for AWS Step Functions that cannot leak.
//!
//! One DynamoDB item per lock holds its holders, a version counter and a set of recent fences.
//! Each transition ([`protocol::acquire`], [`protocol::release`], [`protocol::cleanup`]) is a
//! pure function of the item it read; a [`Semaphore`] applies it to an [`ItemStore`] with a
//! write conditioned on the version read, retrying a bounded number of times on conflict.
//!
//! Which fault each rule defends against (see `DESIGN.md` for F1-F6):
//! - every write bumps the version and is conditioned on the version read, and cleanup always
//!   writes, so a delayed acquire computed before a cleanup cannot land after it (F1);
//! - release and cleanup leave fences that refuse a zombie or late retry which reads the item
//!   *after* them (F2, F3), for [`DEFAULT_FENCE_WINDOW`];
//! - an identity that already holds a slot is answered "already held", not given a second (F5);
//! - releasing or cleaning up what is not held is a no-op that never drives the count below
//!   zero (F4), and every input is validated before any request is sent (F6).

mod cache;
pub mod clock;
pub mod dynamo;
mod error;
pub mod input;
pub mod item;
pub mod memory;
pub mod protocol;
mod store;
pub mod sweep;

pub use cache::DEFAULT_ITEM_CACHE_LOCKS;
pub use clock::{rfc3339_millis, Clock, ManualClock, SystemClock};
pub use dynamo::{DynamoStore, TableSetup};
pub use error::{Error, StoreError};
pub use input::{AcquisitionId, HolderId, InputError, Limit, LockName};
pub use item::{FenceKey, FencingToken, Holding, Identity, SemaphoreItem, Version};
pub use memory::MemoryStore;
pub use protocol::{
    AcquireOutcome, CleanupOutcome, FenceReason, ReleaseOutcome, DEFAULT_FENCE_WINDOW,
};
pub use store::{ItemStore, PutResult, RetryPolicy, Semaphore};
pub use sweep::{ExecutionState, ExecutionStatus, LargestItem, Reclaimed, SweepReport};
