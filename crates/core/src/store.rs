//! The runner that applies a transition to a store: read, decide, conditional write, and on a
//! version conflict decide again from the item the failed write handed back.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::clock::{Clock, SystemClock};
use crate::error::{Error, StoreError};
use crate::input::{HolderId, Limit, LockName};
use crate::item::{Identity, SemaphoreItem, Version};
use crate::protocol::{
    self, AcquireOutcome, CleanupOutcome, Context, ReleaseOutcome, Step, DEFAULT_FENCE_WINDOW,
};

/// The answer of a conditional write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PutResult {
    Written,
    /// The item was not at the expected version; here is what it is now (`None`: no item).
    Conflict(Option<SemaphoreItem>),
}

/// Somewhere semaphore items live. Implementations must make `put` atomic: store `item` only if
/// the stored version is `expected` (`None`: only if there is no item yet).
pub trait ItemStore: Send + Sync {
    fn load(
        &self,
        lock: &LockName,
    ) -> impl Future<Output = Result<Option<SemaphoreItem>, StoreError>> + Send;

    fn put(
        &self,
        item: &SemaphoreItem,
        expected: Option<Version>,
    ) -> impl Future<Output = Result<PutResult, StoreError>> + Send;

    /// Every semaphore item (the sweeper's view).
    fn list(&self) -> impl Future<Output = Result<Vec<SemaphoreItem>, StoreError>> + Send;
}

/// Bounds on the optimistic-concurrency loop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Writes attempted before giving up with [`Error::Contention`].
    pub max_attempts: u32,
    /// Backoff after the n-th conflict is uniform in [0, min(max_delay, base_delay * 2^n)]
    /// ("full jitter"), so contenders spread out instead of colliding again in lock step.
    pub base_delay: Duration,
    pub max_delay: Duration,
    /// No read or write is decided later than this after the call began. Fences must outlive
    /// it (see [`DEFAULT_FENCE_WINDOW`]).
    pub call_budget: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            max_attempts: 12,
            base_delay: Duration::from_millis(5),
            max_delay: Duration::from_millis(300),
            call_budget: Duration::from_secs(10),
        }
    }
}

impl RetryPolicy {
    fn backoff(&self, conflicts: u32) -> Duration {
        let ceiling = self
            .base_delay
            .saturating_mul(1u32 << conflicts.min(16))
            .min(self.max_delay);
        ceiling.mul_f64(fastrand::f64())
    }
}

/// A semaphore protocol bound to a store. Cheap to share: build one per process.
#[derive(Debug, Clone)]
pub struct Semaphore<S> {
    store: S,
    clock: Arc<dyn Clock>,
    fence_window: Duration,
    retry: RetryPolicy,
}

impl<S: ItemStore> Semaphore<S> {
    pub fn new(store: S) -> Self {
        Self {
            store,
            clock: Arc::new(SystemClock),
            fence_window: DEFAULT_FENCE_WINDOW,
            retry: RetryPolicy::default(),
        }
    }

    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    pub fn with_fence_window(mut self, window: Duration) -> Self {
        self.fence_window = window;
        self
    }

    pub fn with_retry(mut self, retry: RetryPolicy) -> Self {
        self.retry = retry;
        self
    }

    pub fn store(&self) -> &S {
        &self.store
    }

    pub fn now_ms(&self) -> u64 {
        self.clock.now_ms()
    }

    pub async fn acquire(
        &self,
        lock: &LockName,
        identity: &Identity,
        limit: Limit,
    ) -> Result<AcquireOutcome, Error> {
        self.apply(lock, |item, ctx| {
            protocol::acquire(item, lock, identity, limit, ctx)
        })
        .await
    }

    pub async fn release(
        &self,
        lock: &LockName,
        identity: &Identity,
    ) -> Result<ReleaseOutcome, Error> {
        self.apply(lock, |item, ctx| {
            protocol::release(item, lock, identity, ctx)
        })
        .await
    }

    pub async fn cleanup(
        &self,
        lock: &LockName,
        holder: &HolderId,
    ) -> Result<CleanupOutcome, Error> {
        self.apply(lock, |item, ctx| protocol::cleanup(item, lock, holder, ctx))
            .await
    }

    pub async fn status(&self, lock: &LockName) -> Result<SemaphoreItem, Error> {
        self.store
            .load(lock)
            .await?
            .ok_or_else(|| Error::UnknownLock { lock: lock.clone() })
    }

    pub async fn list(&self) -> Result<Vec<SemaphoreItem>, Error> {
        Ok(self.store.list().await?)
    }

    async fn apply<O>(
        &self,
        lock: &LockName,
        transition: impl Fn(Option<&SemaphoreItem>, &Context) -> Step<O>,
    ) -> Result<O, Error> {
        let started = Instant::now();
        let mut current = self.store.load(lock).await?;
        let mut attempts = 0;
        loop {
            let ctx = Context {
                now_ms: self.clock.now_ms(),
                fence_window: self.fence_window,
            };
            let (next, outcome) = match transition(current.as_ref(), &ctx) {
                Step::Done(outcome) => return Ok(outcome),
                Step::Write { next, outcome } => (next, outcome),
            };
            attempts += 1;
            let expected = current.as_ref().map(|item| item.version);
            match self.store.put(&next, expected).await? {
                PutResult::Written => return Ok(outcome),
                PutResult::Conflict(latest) => current = latest,
            }
            let delay = self.retry.backoff(attempts);
            if attempts >= self.retry.max_attempts
                || started.elapsed() + delay >= self.retry.call_budget
            {
                tracing::warn!(
                    lock = lock.as_str(),
                    attempts,
                    "giving up after version conflicts"
                );
                return Err(Error::Contention {
                    lock: lock.clone(),
                    attempts,
                    elapsed: started.elapsed(),
                });
            }
            tracing::debug!(
                lock = lock.as_str(),
                attempts,
                ?delay,
                "version conflict, retrying"
            );
            tokio::time::sleep(delay).await;
        }
    }
}
