//! A distributed semaphore for AWS Step Functions that cannot leak.
//!
//! One DynamoDB item per lock holds its holders (with their weights and the sum of them), a
//! version counter and the fences of the last window or two. Every operation is one conditional
//! write (cleanup: two; a release or cleanup whose slot went meanwhile, one more) described as a
//! plain [`Write`] (checks + changes): [`protocol`] says which writes each operation sends and
//! what their results mean, [`Write::apply`] is their meaning, the [`MemoryStore`] applies them
//! with it and the [`DynamoStore`] renders them as `UpdateItem` expressions. A [`Semaphore`] runs
//! an operation against a store.
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
//!
//! # Module map
//!
//! Each module uses only those listed before it (`tests/module_graph.rs` keeps it so: it fails
//! on any cycle among them):
//!
//! | module | what it is |
//! |---|---|
//! | [`input`] | validated inputs: lock names, holder and acquisition ids, limits, weights, rates, task tokens |
//! | [`item`] | the semaphore item: holders, fences, version, as plain values |
//! | [`queue`] | the line's data: a waiter and its place in line |
//! | [`write`](mod@write) | a write as a value: its checks, its changes, and [`Write::apply`], their meaning |
//! | `error` | the errors: bad input, a store that failed |
//! | [`protocol`] | which writes each operation sends, and what their results mean |
//! | [`clock`] | time, injectable |
//! | [`ports`] | the interfaces to the outside world: [`ItemStore`], [`ExecutionStatus`], [`Waker`] |
//! | [`memory`] | an in-memory [`ItemStore`], for tests and the model checker |
//! | [`dynamo`] | the DynamoDB [`ItemStore`]: codec, expressions, sizes, the client |
//! | [`semaphore`] | the [`Semaphore`]: the protocol run against a store: its [`slots`](semaphore::slots), its [`line`](semaphore::line) and its [`sweep`](semaphore::sweep) |
//! | [`client`] | a slot held under a lease by a program (F13): acquire, a background heartbeat, release |
//!
//! The types callers use are re-exported here, at the crate's root.

pub mod input;
pub mod item;
pub mod queue;
pub mod write;

mod error;
pub mod protocol;

pub mod clock;
pub mod ports;

pub mod dynamo;
pub mod memory;

pub mod semaphore;

pub mod client;

pub use client::{LeasedSlot, SlotState};
pub use clock::{rfc3339_millis, Clock, ManualClock, SystemClock};
pub use dynamo::{DynamoStore, TableSetup};
pub use error::{AttributeError, Error, StoreError};
pub use input::{
    terms_on, AcquisitionId, HolderId, InputError, Lease, Limit, LockConfig, LockName, Rate,
    TaskToken, Terms, Weight,
};
pub use item::{
    FenceKey, Fences, FencingToken, Holding, Identity, Layout, Run, SemaphoreItem, SlotKeyError,
    TakenBackSlot, Version,
};
pub use memory::MemoryStore;
pub use ports::{
    missing_long_enough, ExecutionState, ExecutionStatus, ItemStore, PortError, Waker,
    MISSING_EXECUTION_GRACE_MS,
};
pub use protocol::{
    AcquireOutcome, CleanupOutcome, FenceReason, HeartbeatOutcome, QueueOutcome, ReleaseOutcome,
    Step, Timing, WriteResult,
};
pub use queue::{Attempt, QueueKey, QueueKeyError, Waiter, WaiterId, Wakeup};
pub use semaphore::line::{HandOff, Wake};
pub use semaphore::slots::{Fenced, TakenBack, MAX_ROUNDS};
pub use semaphore::sweep::{LargestItem, LineSweep, Reclaimed, SweepReport};
pub use semaphore::{Semaphore, KEPT_TAKE_BACKS};
pub use write::{Change, Check, Write};
