//! A distributed semaphore for AWS Step Functions that cannot leak.
//!
//! Each lock is a DynamoDB item holding its holders, the sum of their weights, a version counter
//! and the fences of the last window or two (or, for large limits, a gate item and one holding
//! item per slot: the store's layouts). Every operation is a conditional write that reads
//! nothing first, described as a plain [`Write`] (checks + changes): DynamoDB checks the limit,
//! the holder and the fences when it lands, so concurrent writers never invalidate each other's
//! decisions and a late acquire can never land after the release or cleanup that fenced it.
//! [`protocol`] says which writes each operation sends and why each rule holds (faults F1-F14:
//! see docs/design.md), [`Write::apply`] is their meaning, the [`MemoryStore`] applies them with
//! it and the [`DynamoStore`] renders them as expressions. A [`Semaphore`] runs an operation
//! against a store.
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
//! | [`flow`] | the functions' flows, free of I/O: which call comes next, from the answers so far |
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

pub mod flow;

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
    Claim, FenceKey, Fences, FencingToken, Holding, Identity, Layout, Run, SemaphoreItem,
    SlotKeyError, TakenBackSlot, Version,
};
pub use memory::MemoryStore;
pub use ports::{
    missing_long_enough, ExecutionState, ExecutionStatus, HolderAsked, ItemStore, ListCursor,
    ListPage, PortError, Waker, MISSING_EXECUTION_GRACE_MS,
};
pub use protocol::{
    AcquireOutcome, CleanupOutcome, FenceReason, Fenced, HeartbeatOutcome, QueueOutcome,
    ReleaseOutcome, Step, Timing, WriteResult,
};
pub use queue::{Attempt, QueueKey, QueueKeyError, Waiter, WaiterId, Wakeup};
pub use semaphore::line::{HandOff, Wake};
pub use semaphore::slots::{TakenBack, MAX_ROUNDS};
pub use semaphore::sweep::{LargestItem, LineSweep, Reclaimed, SweepReport, Unjudged};
pub use semaphore::{ConfiguredOnly, Semaphore, KEPT_TAKE_BACKS};
pub use write::{Change, Check, Write};
