//! The runner that applies a transition to a store: read, decide, conditional write, and on a
//! version conflict decide again from the item the failed write handed back.
//!
//! The read of a call's first attempt may come from the semaphore's cache of the last item it saw
//! for the lock (see [`Semaphore::with_item_cache`]): then an uncontended acquire or release by
//! one process is a single conditional write.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::cache::{ItemCache, DEFAULT_ITEM_CACHE_LOCKS};
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
    /// A call's first conflict is retried at once from the item the failed write handed back
    /// (as current as a read). After the n-th further conflict it waits a time uniform in
    /// [0, min(max_delay, base_delay * 2^n)] ("full jitter"), so contenders spread out instead
    /// of colliding again in lock step, and reads the item again before the next write.
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

/// A semaphore protocol bound to a store. Cheap to share: build one per process (clones share
/// the item cache).
#[derive(Debug, Clone)]
pub struct Semaphore<S> {
    store: S,
    clock: Arc<dyn Clock>,
    fence_window: Duration,
    retry: RetryPolicy,
    cache: Arc<ItemCache>,
}

impl<S: ItemStore> Semaphore<S> {
    pub fn new(store: S) -> Self {
        Self {
            store,
            clock: Arc::new(SystemClock),
            fence_window: DEFAULT_FENCE_WINDOW,
            retry: RetryPolicy::default(),
            cache: Arc::new(ItemCache::new(DEFAULT_ITEM_CACHE_LOCKS)),
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

    /// Remember the last item seen for up to `locks` locks (default
    /// [`DEFAULT_ITEM_CACHE_LOCKS`]) and use it instead of a read for a call's first write
    /// attempt; `0` turns this off, so that every call reads first.
    ///
    /// A stale item costs one failed conditional write, which hands back the current item, in
    /// place of the read; a fresh one saves the read. No answer is ever given from the cache
    /// alone: an answer that writes nothing ("full", "already held", "fenced", a duplicate
    /// release) is re-read first, and a write from the cache lands only if the item is still at
    /// the cached version. Turn it off where calls on a lock come from different processes in
    /// turn (the acquire and release Lambda functions): there it would almost always be stale.
    pub fn with_item_cache(mut self, locks: usize) -> Self {
        self.cache = Arc::new(ItemCache::new(locks));
        self
    }

    /// How many locks' items this semaphore remembers (0: it reads before every first write).
    pub fn item_cache_capacity(&self) -> usize {
        self.cache.capacity()
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
        self.load(lock)
            .await?
            .ok_or_else(|| Error::UnknownLock { lock: lock.clone() })
    }

    /// Every semaphore item, as read (consistently) now; they also refresh the item cache, so
    /// that a sweep's cleanups after the scan need no further reads.
    pub async fn list(&self) -> Result<Vec<SemaphoreItem>, Error> {
        let items = self.store.list().await?;
        for item in &items {
            self.cache.put(item);
        }
        Ok(items)
    }

    async fn load(&self, lock: &LockName) -> Result<Option<SemaphoreItem>, StoreError> {
        match self.store.load(lock).await {
            Ok(Some(item)) => {
                self.cache.put(&item);
                Ok(Some(item))
            }
            Ok(None) => {
                self.cache.forget(lock);
                Ok(None)
            }
            Err(e) => {
                self.cache.forget(lock);
                Err(e)
            }
        }
    }

    async fn put(
        &self,
        next: &SemaphoreItem,
        expected: Option<Version>,
    ) -> Result<PutResult, StoreError> {
        let result = self.store.put(next, expected).await;
        match &result {
            Ok(PutResult::Written) => self.cache.put(next),
            Ok(PutResult::Conflict(Some(latest))) => self.cache.put(latest),
            // No item, or an error: whether the write landed is unknown (a timeout).
            Ok(PutResult::Conflict(None)) | Err(_) => self.cache.forget(&next.lock),
        }
        result
    }

    async fn apply<O>(
        &self,
        lock: &LockName,
        transition: impl Fn(Option<&SemaphoreItem>, &Context) -> Step<O>,
    ) -> Result<O, Error> {
        let started = Instant::now();
        // The item to decide from, and whether it is known to be current: read just now or
        // handed back by a failed write, rather than remembered from an earlier call.
        let (mut current, mut verified) = match self.cache.get(lock) {
            Some(remembered) => (Some(remembered), false),
            None => (self.load(lock).await?, true),
        };
        let mut attempts = 0;
        // Conflicts of writes decided from a current item: real contention, not a stale cache.
        let mut contended = 0;
        loop {
            let ctx = Context {
                now_ms: self.clock.now_ms(),
                fence_window: self.fence_window,
            };
            let (next, outcome) = match transition(current.as_ref(), &ctx) {
                Step::Done(outcome) if verified => return Ok(outcome),
                Step::Done(_) => {
                    // An answer that writes nothing is only as true as the read it came from,
                    // and a remembered item may be stale: read, and decide again.
                    current = self.load(lock).await?;
                    verified = true;
                    continue;
                }
                Step::Write { next, outcome } => (next, outcome),
            };
            attempts += 1;
            let expected = current.as_ref().map(|item| item.version);
            let stale_cache = !verified;
            match self.put(&next, expected).await? {
                PutResult::Written => return Ok(outcome),
                PutResult::Conflict(latest) => {
                    current = latest;
                    verified = true;
                }
            }
            if !stale_cache {
                contended += 1;
            }
            let delay = if contended <= 1 {
                // A stale cache (the item changed since this semaphore last saw it, not
                // necessarily now), or a first conflict: the item the failed write handed
                // back is as current as a read would be, so retry from it at once.
                Duration::ZERO
            } else {
                // Others keep writing: back off, with jitter, before trying again.
                self.retry.backoff(contended - 1)
            };
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
                stale_cache,
                "version conflict, retrying"
            );
            if !delay.is_zero() {
                tokio::time::sleep(delay).await;
                // The item the failed write handed back is as old as the wait now, and others
                // kept writing meanwhile: a write from it would almost surely conflict again
                // (and each conflict would wait longer). Read it again.
                current = self.load(lock).await?;
                verified = true;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;
    use crate::input::AcquisitionId;
    use crate::item::FencingToken;
    use crate::memory::MemoryStore;
    use crate::protocol::FenceReason;

    /// A memory store shared by several semaphores (as processes share a table), counting the
    /// reads and writes sent to it and the writes that failed their condition.
    #[derive(Clone, Default)]
    struct Counted {
        inner: Arc<MemoryStore>,
        loads: Arc<AtomicUsize>,
        puts: Arc<AtomicUsize>,
        conflicts: Arc<AtomicUsize>,
    }

    impl Counted {
        /// (loads, puts, failed puts) since the last call.
        fn take(&self) -> (usize, usize, usize) {
            (
                self.loads.swap(0, Ordering::SeqCst),
                self.puts.swap(0, Ordering::SeqCst),
                self.conflicts.swap(0, Ordering::SeqCst),
            )
        }
    }

    impl ItemStore for Counted {
        async fn load(&self, lock: &LockName) -> Result<Option<SemaphoreItem>, StoreError> {
            self.loads.fetch_add(1, Ordering::SeqCst);
            self.inner.load(lock).await
        }
        async fn put(
            &self,
            item: &SemaphoreItem,
            expected: Option<Version>,
        ) -> Result<PutResult, StoreError> {
            self.puts.fetch_add(1, Ordering::SeqCst);
            let result = self.inner.put(item, expected).await;
            if matches!(result, Ok(PutResult::Conflict(_))) {
                self.conflicts.fetch_add(1, Ordering::SeqCst);
            }
            result
        }
        async fn list(&self) -> Result<Vec<SemaphoreItem>, StoreError> {
            self.inner.list().await
        }
    }

    fn lock() -> LockName {
        LockName::new("l").unwrap()
    }
    fn id(h: &str, a: &str) -> Identity {
        Identity::new(HolderId::new(h).unwrap(), AcquisitionId::new(a).unwrap())
    }
    fn limit(n: i64) -> Limit {
        Limit::new(n).unwrap()
    }
    fn acquired(outcome: AcquireOutcome) -> u64 {
        match outcome {
            AcquireOutcome::Acquired { token, .. } => token.0,
            other => panic!("expected acquired, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn an_uncontended_critical_section_is_two_writes_with_the_cache_and_four_requests_without(
    ) {
        let store = Counted::default();
        let cached = Semaphore::new(store.clone());
        cached
            .acquire(&lock(), &id("warm", "1"), limit(5))
            .await
            .unwrap();
        store.take();
        for n in 0..10 {
            let who = id(&format!("e{n}"), "1");
            acquired(cached.acquire(&lock(), &who, limit(5)).await.unwrap());
            cached.release(&lock(), &who).await.unwrap();
        }
        assert_eq!(
            store.take(),
            (0, 20, 0),
            "(loads, puts, conflicts) for 10 sections"
        );

        let reading = Semaphore::new(store.clone()).with_item_cache(0);
        assert_eq!(reading.item_cache_capacity(), 0);
        for n in 0..10 {
            let who = id(&format!("r{n}"), "1");
            acquired(reading.acquire(&lock(), &who, limit(5)).await.unwrap());
            reading.release(&lock(), &who).await.unwrap();
        }
        assert_eq!(store.take(), (20, 20, 0));
    }

    #[tokio::test]
    async fn a_stale_cache_costs_one_failed_write_and_gives_the_same_answer() {
        let store = Counted::default();
        let a = Semaphore::new(store.clone());
        let b = Semaphore::new(store.clone());
        acquired(a.acquire(&lock(), &id("a", "1"), limit(2)).await.unwrap());
        // Another process takes the second slot: a's cache is now one version behind.
        let b_token = acquired(b.acquire(&lock(), &id("b", "1"), limit(2)).await.unwrap());
        store.take();
        // Written from the stale cache: the write fails, hands back the item, and the retry
        // from it finds the lock full. No read was needed.
        assert_eq!(
            a.acquire(&lock(), &id("c", "1"), limit(2)).await.unwrap(),
            AcquireOutcome::Full {
                count: 2,
                limit: limit(2)
            }
        );
        assert_eq!(store.take(), (0, 1, 1));
        // And a release from a stale cache frees the right slot.
        let c = Semaphore::new(store.clone());
        c.status(&lock()).await.unwrap();
        a.release(&lock(), &id("a", "1")).await.unwrap();
        store.take();
        assert_eq!(
            c.release(&lock(), &id("b", "1")).await.unwrap(),
            ReleaseOutcome::Released {
                token: FencingToken(b_token),
                count: 0
            }
        );
        assert_eq!(store.take(), (0, 2, 1));
        let item = store.inner.load_now(&lock()).unwrap();
        assert!(item.holders.is_empty());
    }

    #[tokio::test]
    async fn an_answer_that_writes_nothing_is_never_taken_from_the_cache() {
        let store = Counted::default();
        let a = Semaphore::new(store.clone());
        let b = Semaphore::new(store.clone());
        let exec = id("exec-1", "1");
        acquired(a.acquire(&lock(), &exec, limit(1)).await.unwrap());

        // The execution ended and was cleaned up elsewhere. a's cache still shows it holding a
        // slot: answering "already held" from it would hand out a slot nobody holds.
        b.cleanup(&lock(), &exec.holder).await.unwrap();
        store.take();
        assert_eq!(
            a.acquire(&lock(), &exec, limit(1)).await.unwrap(),
            AcquireOutcome::Fenced(FenceReason::ExecutionEnded)
        );
        assert_eq!(store.take(), (1, 0, 0), "one read, no write");

        // a's cache now shows the lock full after another acquire; it is freed elsewhere, and
        // "full" is not believed without a read.
        let other = id("exec-2", "1");
        acquired(a.acquire(&lock(), &other, limit(1)).await.unwrap());
        b.release(&lock(), &other).await.unwrap();
        store.take();
        acquired(
            a.acquire(&lock(), &id("exec-3", "1"), limit(1))
                .await
                .unwrap(),
        );
        assert_eq!(store.take(), (1, 1, 0));
    }

    #[tokio::test]
    async fn an_acquire_written_from_a_cache_older_than_a_cleanup_is_refused_f1() {
        let store = Counted::default();
        let late = Semaphore::new(store.clone());
        let cleaner = Semaphore::new(store.clone());
        let exec = id("arn:aws:states:us-east-1:123456789012:execution:m:e1", "a1");
        // The late acquirer has seen the lock (its cache is warm) before the execution ended.
        acquired(
            late.acquire(&lock(), &id("other", "a"), limit(2))
                .await
                .unwrap(),
        );
        let cleaned = cleaner.cleanup(&lock(), &exec.holder).await.unwrap();
        assert!(cleaned.freed.is_empty());
        store.take();
        // Its write, computed from the item before the cleanup, fails on the version; the item
        // handed back carries the fence.
        assert_eq!(
            late.acquire(&lock(), &exec, limit(2)).await.unwrap(),
            AcquireOutcome::Fenced(FenceReason::ExecutionEnded)
        );
        assert_eq!(store.take(), (0, 1, 1));
        let item = store.inner.load_now(&lock()).unwrap();
        assert_eq!(item.holders.len(), 1);
        assert!(!item.holders.contains_key(&exec));
    }

    #[tokio::test]
    async fn a_sweep_reads_once_and_its_cleanups_write_from_the_scanned_items() {
        use crate::sweep::{ExecutionState, ExecutionStatus};
        struct AllEnded;
        impl ExecutionStatus for AllEnded {
            async fn describe(&self, _: &HolderId) -> Result<ExecutionState, String> {
                Ok(ExecutionState::Ended {
                    status: "ABORTED".to_owned(),
                })
            }
        }
        let store = Counted::default();
        let writer = Semaphore::new(store.clone());
        for n in 0..5 {
            acquired(
                writer
                    .acquire(&lock(), &id(&format!("e{n}"), "1"), limit(5))
                    .await
                    .unwrap(),
            );
        }
        store.take();
        let sweeper = Semaphore::new(store.clone());
        let report = sweeper.sweep(&AllEnded).await.unwrap();
        assert_eq!(report.reclaimed.len(), 5);
        assert_eq!(store.take(), (0, 5, 0), "the scan stands in for every read");
    }
}
