//! The semaphore's ports: the interfaces through which it meets the outside world, each
//! implemented by an adapter elsewhere. Nothing here knows DynamoDB, Step Functions or Lambda.
//!
//! - [`ItemStore`]: where the semaphore items and the waiters' records live (the
//!   [`DynamoStore`](crate::dynamo::DynamoStore) in production, the
//!   [`MemoryStore`](crate::memory::MemoryStore) in tests and the model checker);
//! - [`ExecutionStatus`]: whether a holder's execution still runs (`DescribeExecution`), asked
//!   by the sweeper and by a hand-off whose wake-up failed;
//! - [`Waker`]: wakes a parked waiter whose slot was granted (`SendTaskSuccess`).
//!
//! Time, the fourth thing the semaphore takes from outside, is [`Clock`](crate::clock::Clock).

use std::future::Future;

use crate::error::StoreError;
use crate::input::{AcquisitionId, HolderId, LockName};
use crate::item::{FencingToken, Run, SemaphoreItem};
use crate::protocol::WriteResult;
use crate::queue::{QueueKey, Waiter, WaiterId};
use crate::write::Write;

/// Somewhere semaphore items live. `write` must be atomic: apply the write iff every check holds
/// on the item as it is when the write lands (creating the item from the empty one if there is
/// none), exactly as [`Write::apply`] says.
pub trait ItemStore: Send + Sync {
    fn load(
        &self,
        lock: &LockName,
    ) -> impl Future<Output = Result<Option<SemaphoreItem>, StoreError>> + Send;

    fn write(&self, write: &Write) -> impl Future<Output = Result<WriteResult, StoreError>> + Send;

    /// The lock as [`ItemStore::load`] reads it, but with only `holder`'s holdings certain to be
    /// there: what a cleanup frees. A store whose holdings are items of their own (a gate) reads
    /// the holder's alone, so a cleanup costs the same whatever the lock's holders.
    fn load_holder(
        &self,
        lock: &LockName,
        holder: &HolderId,
    ) -> impl Future<Output = Result<Option<SemaphoreItem>, StoreError>> + Send {
        let _ = holder;
        self.load(lock)
    }

    /// The lock as its line's hand-off reads it: the count, the weight in use, the line's
    /// length, the configuration, the rate. A store whose holdings are items of their own (a
    /// gate) leaves them out: a hand-off at a lock of 10,000 holders reads one item, not
    /// 10,000. (So on such a lock a passed lease is taken back by the sweep, not by the
    /// hand-off.)
    fn load_line(
        &self,
        lock: &LockName,
    ) -> impl Future<Output = Result<Option<SemaphoreItem>, StoreError>> + Send {
        self.load(lock)
    }

    /// One page of the semaphore items (the sweeper's view), from the one after `after` (`None`:
    /// from the first), each read on its own: an item that cannot be read (of another format,
    /// say) is an error in the page, not a failed page. A page is as much as the store reads at
    /// once (DynamoDB: one `Scan` request, at most 1 MB), so a caller that handles each page
    /// before asking for the next holds one page at a time, at any number of locks.
    fn list_page(
        &self,
        after: Option<&ListCursor>,
    ) -> impl Future<Output = Result<ListPage, StoreError>> + Send;

    /// Every semaphore item, every page put together: for a caller that shows them all (`semctl
    /// list`, `top`). Its memory grows with the table; the sweep reads page by page.
    fn list(
        &self,
    ) -> impl Future<Output = Result<Vec<Result<SemaphoreItem, StoreError>>, StoreError>> + Send
    {
        async move {
            let mut items = Vec::new();
            let mut after = None;
            loop {
                let page = self.list_page(after.as_ref()).await?;
                items.extend(page.items);
                match page.next {
                    Some(next) => after = Some(next),
                    None => return Ok(items),
                }
            }
        }
    }

    /// The first `limit` waiters in `lock`'s line, in line order, after the one with key `after`
    /// (`None`: from the head), as read (consistently) now.
    fn waiters(
        &self,
        lock: &LockName,
        after: Option<QueueKey>,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<Waiter>, StoreError>> + Send;

    /// The record of waiter `id` in `lock`'s line, as read (consistently) now; `None`: it is not
    /// in line.
    fn waiter(
        &self,
        lock: &LockName,
        id: WaiterId,
    ) -> impl Future<Output = Result<Option<Waiter>, StoreError>> + Send;
}

/// Where a listing goes on from: the key of the last item the page before read (DynamoDB's
/// `LastEvaluatedKey`, the lock's name as stored, which need not be a valid [`LockName`] if
/// something else wrote it).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct ListCursor(pub String);

/// One page of a listing ([`ItemStore::list_page`]).
#[derive(Debug, Default)]
pub struct ListPage {
    pub items: Vec<Result<SemaphoreItem, StoreError>>,
    /// Where the next page starts; `None`: this was the last.
    pub next: Option<ListCursor>,
}

/// A store shared by reference or by `Arc` (several semaphores on one store, as processes
/// share a table).
impl<P> ItemStore for P
where
    P: std::ops::Deref + Send + Sync,
    P::Target: ItemStore,
{
    fn load(
        &self,
        lock: &LockName,
    ) -> impl Future<Output = Result<Option<SemaphoreItem>, StoreError>> + Send {
        (**self).load(lock)
    }

    fn write(&self, write: &Write) -> impl Future<Output = Result<WriteResult, StoreError>> + Send {
        (**self).write(write)
    }

    fn load_holder(
        &self,
        lock: &LockName,
        holder: &HolderId,
    ) -> impl Future<Output = Result<Option<SemaphoreItem>, StoreError>> + Send {
        (**self).load_holder(lock, holder)
    }

    fn load_line(
        &self,
        lock: &LockName,
    ) -> impl Future<Output = Result<Option<SemaphoreItem>, StoreError>> + Send {
        (**self).load_line(lock)
    }

    fn list_page(
        &self,
        after: Option<&ListCursor>,
    ) -> impl Future<Output = Result<ListPage, StoreError>> + Send {
        (**self).list_page(after)
    }

    fn list(
        &self,
    ) -> impl Future<Output = Result<Vec<Result<SemaphoreItem, StoreError>>, StoreError>> + Send
    {
        (**self).list()
    }

    fn waiters(
        &self,
        lock: &LockName,
        after: Option<QueueKey>,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<Waiter>, StoreError>> + Send {
        (**self).waiters(lock, after, limit)
    }

    fn waiter(
        &self,
        lock: &LockName,
        id: WaiterId,
    ) -> impl Future<Output = Result<Option<Waiter>, StoreError>> + Send {
        (**self).waiter(lock, id)
    }
}

/// What [`ExecutionStatus`] tells of a holder's execution (from `DescribeExecution` in
/// production).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExecutionState {
    Running,
    /// Ended with this status (SUCCEEDED, FAILED, TIMED_OUT, ABORTED, ...) in `last_run` (its
    /// redrive count: the runs up to it are fenced).
    Ended {
        status: String,
        last_run: Run,
    },
    /// Ended with this status, but whether the work it ran under its slots still runs cannot be
    /// told (its history is longer than the adapter reads, `why`): its slots are kept, and the
    /// sweep reports them by name ([`SweepReport::unjudged`](crate::SweepReport::unjudged)),
    /// never guesses.
    Unjudged {
        status: String,
        why: String,
    },
    /// The execution does not exist (any more): nothing can release its slot.
    Missing,
    /// The holder is not an execution (an operator's id): not the sweeper's to judge.
    NotAnExecution,
}

impl ExecutionState {
    /// The run to fence up to: a missing execution's history is gone, and with it any run that
    /// could still write.
    pub(crate) fn last_run(&self) -> Run {
        match self {
            Self::Ended { last_run, .. } => *last_run,
            Self::Running | Self::Unjudged { .. } | Self::Missing | Self::NotAnExecution => {
                Run::FIRST
            }
        }
    }

    /// Why the execution's slots may be taken back (`None`: they may not).
    pub(crate) fn reclaim_reason(&self) -> Option<String> {
        match self {
            Self::Ended { status, .. } => Some(format!("execution status is {status}")),
            Self::Missing => Some("execution does not exist".to_owned()),
            Self::Running | Self::Unjudged { .. } | Self::NotAnExecution => None,
        }
    }
}

/// Why a port's call gave no answer: the adapter's own error, kept as the source, which names
/// the call that failed (`DescribeExecution` of which execution, `SendTaskSuccess`...) and why
/// (throttled, denied, a task that no longer waits...). Nothing can be concluded from it: the
/// caller leaves things as they are for a later try. Transparent, so that a chain printed
/// whole (anyhow's `{:#}`) names the adapter's error once.
#[derive(Debug, thiserror::Error)]
#[error(transparent)]
pub struct PortError {
    pub source: Box<dyn std::error::Error + Send + Sync>,
}

impl PortError {
    /// From any error, or a message (`&str` or `String`: a test's canned answer).
    pub fn new(source: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> Self {
        Self {
            source: source.into(),
        }
    }
}

/// Whether a holder's execution still runs (in production: `DescribeExecution`), asked by the
/// sweeper of every holder and waiter it checks, and by a hand-off of a granted waiter it could
/// not wake. "Does not exist" is believed only past [`MISSING_EXECUTION_GRACE_MS`].
pub trait ExecutionStatus: Send + Sync {
    /// `Err`: the holder is then left alone until the next sweep.
    fn describe(
        &self,
        holder: &HolderId,
    ) -> impl Future<Output = Result<ExecutionState, PortError>> + Send;

    /// The run `holder`'s execution is in now (its redrive count), ended or not; `None` when
    /// it is not an execution, does not exist, or the adapter cannot tell. What a redriven
    /// run's release asks before it frees the earlier runs when its own slot was not freed with
    /// its token (F15): only Step Functions may say those runs have ended.
    fn current_run(
        &self,
        holder: &HolderId,
    ) -> impl Future<Output = Result<Option<Run>, PortError>> + Send {
        let _ = holder;
        async { Ok(None) }
    }

    /// As [`ExecutionStatus::describe`], of a holder known to hold only `holding` (the
    /// acquisitions a sweep read on its locks): an adapter that reads the execution's history
    /// to judge it (is its work still running?) needs only the part since the oldest of them
    /// was made. By default, `describe`.
    fn describe_holding(
        &self,
        holder: &HolderId,
        holding: &[AcquisitionId],
    ) -> impl Future<Output = Result<ExecutionState, PortError>> + Send {
        let _ = holding;
        self.describe(holder)
    }

    /// The states of every holder a sweep checks, asked together: each described in turn unless
    /// the adapter can answer many with fewer calls (a sweep of 10,000 holders would otherwise
    /// spend 10,000 of the account's `DescribeExecution` calls, refilled at 10-15 a second).
    fn describe_all<'a>(
        &'a self,
        holders: &'a [HolderAsked],
    ) -> impl Future<Output = Vec<Result<ExecutionState, PortError>>> + Send + 'a {
        async move {
            let mut states = Vec::with_capacity(holders.len());
            for asked in holders {
                states.push(self.describe_holding(&asked.holder, &asked.holding).await);
            }
            states
        }
    }
}

/// A holder a sweep asks about ([`ExecutionStatus::describe_all`]), with the acquisitions it
/// holds on the locks the sweep read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HolderAsked {
    pub holder: HolderId,
    pub holding: Vec<AcquisitionId>,
}

/// How long after a holder acquired (or a waiter queued) an answer of "execution does not exist"
/// is not believed (F11). `DescribeExecution` is eventually consistent: its API reference says
/// "the results are best effort and may not reflect very recent updates and changes", and the
/// Step Functions developer guide ("Read consistency in Step Functions") gives "within a few
/// seconds" for its control plane to converge. An execution that acquired a moment ago exists
/// (only a running execution can invoke the acquire), so "does not exist" for it is a stale
/// read, and freeing its slot would put a second execution in its place while it works (S1).
/// 60 s is an order of magnitude above "a few seconds", and well under the sweep period
/// (`SweepPeriodMinutes`, 5 by default): a holder whose execution is really gone is
/// reclaimed by the next sweep after the grace, so the price is at most one sweep period.
pub const MISSING_EXECUTION_GRACE_MS: u64 = 60_000;

/// Whether "execution does not exist" is believed of one that acquired or queued at `since_ms`.
/// A clock behind `since_ms` (skew) counts as young.
pub fn missing_long_enough(since_ms: u64, now_ms: u64) -> bool {
    now_ms.saturating_sub(since_ms) >= MISSING_EXECUTION_GRACE_MS
}

/// Wakes a waiter whose slot was granted (in production: `SendTaskSuccess` with its token).
pub trait Waker: Send + Sync {
    /// `Ok`: the parked task took the answer. `Err`: it did not (its execution ended, its
    /// token timed out, or the call failed); the hand-off then asks whether the execution still
    /// runs, and frees the slot if it does not.
    fn wake(
        &self,
        waiter: &Waiter,
        token: FencingToken,
    ) -> impl Future<Output = Result<(), PortError>> + Send;

    /// Tells the head of the line, whose grant the lock's start rate refused, to check again at
    /// `next_start_ms` (in production: `SendTaskSuccess` with a "rate limited" answer; its state
    /// machine waits until then and enters its wait task again, keeping its place). Nobody else
    /// would: no slot is freed when the rate frees up. `Err`: it did not take it (its task
    /// was woken already, or its execution ended); its record stays, and whoever next moves the
    /// line, or its fallback check, tries again.
    fn defer(
        &self,
        waiter: &Waiter,
        next_start_ms: u64,
    ) -> impl Future<Output = Result<(), PortError>> + Send;
}
