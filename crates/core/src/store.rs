//! The [`Semaphore`]: each operation sends the protocol's writes to an [`ItemStore`] and turns
//! what became of them into an answer. No operation reads first, and none retries on a conflict:
//! there are none (see `protocol`).

use std::future::Future;
use std::sync::Arc;

use crate::clock::{Clock, SystemClock};
use crate::error::{Error, StoreError};
use crate::input::{HolderId, Limit, LockName};
use crate::item::{Identity, Run, SemaphoreItem};
use crate::protocol::{
    self, AcquireOutcome, CleanupOutcome, Grant, ReleaseOutcome, Timing, WriteResult,
};
use crate::queue::{HandOff, QueueKey, QueueOutcome, TaskToken, Waiter, Waker};
use crate::sweep::{ExecutionState, ExecutionStatus};
use crate::write::Write;

/// Most grants (and skips of dead waiters) one hand-off makes before it leaves the rest to the
/// next one (a release, a waiter's fallback check, the sweeper): bounds one Lambda's work when
/// thousands of waiters died at once.
pub const MAX_HAND_OFF_STEPS: usize = 256;

/// Somewhere semaphore items live. `write` must be atomic: apply the write iff every check holds
/// on the item as it is when the write lands (creating the item from the empty one if there is
/// none), exactly as [`Write::apply`] says.
pub trait ItemStore: Send + Sync {
    fn load(
        &self,
        lock: &LockName,
    ) -> impl Future<Output = Result<Option<SemaphoreItem>, StoreError>> + Send;

    fn write(&self, write: &Write) -> impl Future<Output = Result<WriteResult, StoreError>> + Send;

    /// Every semaphore item (the sweeper's view), each read on its own: an item that cannot be
    /// read (of version 1, say) is an error in the list, not a failed list.
    fn list(
        &self,
    ) -> impl Future<Output = Result<Vec<Result<SemaphoreItem, StoreError>>, StoreError>> + Send;

    /// The first `limit` waiters in `lock`'s line, in line order, after the one with key `after`
    /// (`None`: from the head), as read (consistently) now.
    fn waiters(
        &self,
        lock: &LockName,
        after: Option<QueueKey>,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<Waiter>, StoreError>> + Send;
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
}

/// What a [`Semaphore::fence`] found: the slots the fenced execution held on `lock` when its
/// fence landed (all it will ever hold there), and the slots held then in all.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fenced {
    pub lock: LockName,
    pub slots: Vec<Identity>,
    pub count: usize,
}

/// A semaphore protocol bound to a store. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Semaphore<S> {
    store: S,
    clock: Arc<dyn Clock>,
    timing: Timing,
    busy_young_fences: usize,
}

impl<S: ItemStore> Semaphore<S> {
    pub fn new(store: S) -> Self {
        Self {
            store,
            clock: Arc::new(SystemClock),
            timing: Timing::default(),
            busy_young_fences: protocol::BUSY_YOUNG_FENCES,
        }
    }

    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    pub fn with_timing(mut self, timing: Timing) -> Self {
        self.timing = timing;
        self
    }

    /// How many young fences make a release or cleanup rotate the fences (once a window has
    /// passed); default [`protocol::BUSY_YOUNG_FENCES`]. `1` rotates whenever a rotation is due:
    /// more writes on a quiet lock, fences dropped sooner. Safety does not depend on it.
    pub fn with_busy_young_fences(mut self, fences: usize) -> Self {
        self.busy_young_fences = fences.max(1);
        self
    }

    pub fn timing(&self) -> Timing {
        self.timing
    }

    pub fn store(&self) -> &S {
        &self.store
    }

    pub fn now_ms(&self) -> u64 {
        self.clock.now_ms()
    }

    /// Takes a slot for a request made now.
    pub async fn acquire(
        &self,
        lock: &LockName,
        identity: &Identity,
        limit: Limit,
    ) -> Result<AcquireOutcome, Error> {
        self.acquire_requested_at(lock, identity, limit, self.now_ms())
            .await
    }

    /// Takes a slot for a request made at `requested_at_ms` by the first run of the execution.
    pub async fn acquire_requested_at(
        &self,
        lock: &LockName,
        identity: &Identity,
        limit: Limit,
        requested_at_ms: u64,
    ) -> Result<AcquireOutcome, Error> {
        self.acquire_in_run(lock, identity, Run::FIRST, limit, requested_at_ms)
            .await
    }

    /// Takes a slot for a request made at `requested_at_ms` (for a state machine: when it entered
    /// its acquire state, which is before any fence this acquire must meet; see [`Timing`]) by
    /// `run` of the execution (a redriven execution acquires in its new run, which no cleanup
    /// of an earlier run fenced). One write; nothing is sent if the request is already past its
    /// horizon.
    pub async fn acquire_in_run(
        &self,
        lock: &LockName,
        identity: &Identity,
        run: Run,
        limit: Limit,
        requested_at_ms: u64,
    ) -> Result<AcquireOutcome, Error> {
        let write = match protocol::acquire(
            lock,
            identity,
            run,
            limit,
            requested_at_ms,
            self.now_ms(),
            &self.timing,
        ) {
            Ok(write) => write,
            Err(answer) => return Ok(answer),
        };
        let result = self.store.write(&write).await?;
        Ok(protocol::acquired(&write, identity, limit, result)?)
    }

    /// Frees the identity's slot, if held, and fences the acquisition. One write (and, about once
    /// per fence window per lock, a rotation of the fences).
    pub async fn release(
        &self,
        lock: &LockName,
        identity: &Identity,
    ) -> Result<ReleaseOutcome, Error> {
        let write = protocol::release(lock, identity);
        let result = self.store.write(&write).await?;
        let (outcome, after) = protocol::released(&write, identity, result)?;
        self.rotate_if_busy(&after).await;
        Ok(outcome)
    }

    /// Fences the execution's ended `last_run` and every run before it, without freeing
    /// anything: from now on no acquire of those runs lands (F1), while the slots the execution
    /// holds stay held, e.g. because its work may still be running. Answers the slots it holds:
    /// all those runs will ever hold; [`Semaphore::free`] frees them. One write.
    pub async fn fence(
        &self,
        lock: &LockName,
        holder: &HolderId,
        last_run: Run,
    ) -> Result<Fenced, Error> {
        let fence = protocol::cleanup_fence(lock, holder, last_run);
        let result = self.store.write(&fence).await?;
        let (slots, after) = protocol::fenced_slots(&fence, holder, result)?;
        self.rotate_if_busy(&after).await;
        Ok(Fenced {
            lock: lock.clone(),
            slots,
            count: after.count(),
        })
    }

    /// Frees the slots a [`Semaphore::fence`] saw: one write, none when it saw none. Only those
    /// slots: one taken since (by a redriven execution, whose new acquisition is another slot)
    /// is left alone, and one freed since by a release is a no-op.
    pub async fn free(&self, fenced: &Fenced) -> Result<CleanupOutcome, Error> {
        if fenced.slots.is_empty() {
            return Ok(CleanupOutcome {
                freed: Vec::new(),
                count: fenced.count,
            });
        }
        let free = protocol::cleanup_free(&fenced.lock, &fenced.slots);
        let result = self.store.write(&free).await?;
        let (outcome, after) = protocol::freed(&free, &fenced.slots, result)?;
        self.rotate_if_busy(&after).await;
        Ok(outcome)
    }

    /// Fences an execution that ended in its first run, then frees every slot it held.
    pub async fn cleanup(
        &self,
        lock: &LockName,
        holder: &HolderId,
    ) -> Result<CleanupOutcome, Error> {
        self.cleanup_run(lock, holder, Run::FIRST).await
    }

    /// Fences the execution's ended `last_run` and the runs before it, then frees every slot it
    /// held: [`Semaphore::fence`] then [`Semaphore::free`]. One write, two when it held
    /// something.
    pub async fn cleanup_run(
        &self,
        lock: &LockName,
        holder: &HolderId,
        last_run: Run,
    ) -> Result<CleanupOutcome, Error> {
        let fenced = self.fence(lock, holder, last_run).await?;
        self.free(&fenced).await
    }

    async fn rotate_if_busy(&self, item: &SemaphoreItem) -> bool {
        self.rotate(protocol::busy_rotation(
            item,
            self.now_ms(),
            &self.timing,
            self.busy_young_fences,
        ))
        .await
    }

    /// Rotates the lock's fences if a rotation is due on `item` (there is a fence, and a window
    /// has passed since the last rotation), as the sweeper does for every lock it passes.
    pub async fn rotate_if_due(&self, item: &SemaphoreItem) -> bool {
        self.rotate(protocol::rotation(item, self.now_ms(), &self.timing))
            .await
    }

    /// Sends a rotation. Housekeeping: one refused (another writer rotated first) or failed
    /// changes no answer, and a later write tries again.
    async fn rotate(&self, rotation: Option<Write>) -> bool {
        let Some(write) = rotation else {
            return false;
        };
        match self.store.write(&write).await {
            Ok(WriteResult::Applied { .. } | WriteResult::Landed) => true,
            Ok(WriteResult::Refused { .. }) => false,
            Err(e) => {
                tracing::warn!(lock = %write.lock, error = %e, "fence rotation failed; a later write retries it");
                false
            }
        }
    }

    /// Puts `waiter` in line for a request made at `requested_at_ms` (its wait state's entry
    /// time), if no slot can be taken without passing the line; [`QueueOutcome::Free`] says one
    /// can (acquire then). One write. The caller hands off next (see [`Semaphore::hand_off`]):
    /// a slot may have been freed between its "full" and its queueing (F8).
    pub async fn enqueue(
        &self,
        waiter: &Waiter,
        requested_at_ms: u64,
    ) -> Result<QueueOutcome, Error> {
        let write =
            match protocol::enqueue(waiter, requested_at_ms, self.now_ms(), &self.timing) {
                Ok(write) => write,
                Err(answer) => return Ok(answer),
            };
        let result = self.store.write(&write).await?;
        Ok(protocol::queued(&write, &waiter.identity, result)?)
    }

    /// Gives a queued waiter's record the token of its new parked task, keeping its place:
    /// `false` if it is not in line (granted, or never queued). One write.
    pub async fn repark(
        &self,
        lock: &LockName,
        key: QueueKey,
        task_token: TaskToken,
    ) -> Result<bool, Error> {
        let write = protocol::repark(lock, key, task_token);
        let result = self.store.write(&write).await?;
        Ok(protocol::was_queued(&write, &result)?)
    }

    /// Takes a waiter out of line (it gave up, or its execution ended): `false` if it was not
    /// in line. One write.
    pub async fn leave(&self, lock: &LockName, key: QueueKey) -> Result<bool, Error> {
        let write = protocol::leave(lock, key);
        let result = self.store.write(&write).await?;
        Ok(protocol::was_queued(&write, &result)?)
    }

    /// The first `limit` waiters in line after `after` (`None`: from the head).
    pub async fn waiters(
        &self,
        lock: &LockName,
        after: Option<QueueKey>,
        limit: usize,
    ) -> Result<Vec<Waiter>, Error> {
        Ok(self.store.waiters(lock, after, limit).await?)
    }

    /// Moves the line: while a slot is free and someone waits, grants the head a slot (one
    /// write that takes the slot for it and removes its record) and wakes it. `known` is the
    /// lock's item if the caller has just seen it (a release's or cleanup's write hands it
    /// back), else it is read.
    ///
    /// A waiter that cannot take its grant does not keep it: if the wake-up fails, `executions`
    /// says whether its execution still runs. If not, the slot is freed again (a cleanup of its
    /// run) and the hand-off goes on with the next waiter; if it does, it keeps the slot and
    /// finds it when its parked task's fallback timeout makes it ask again. A waiter whose run
    /// was cleaned up is removed from the line without a slot (F8).
    pub async fn hand_off<W: Waker, X: ExecutionStatus>(
        &self,
        lock: &LockName,
        known: Option<SemaphoreItem>,
        waker: &W,
        executions: &X,
    ) -> Result<HandOff, Error> {
        let mut report = HandOff::default();
        let mut item = match known {
            Some(item) => item,
            None => match self.store.load(lock).await? {
                Some(item) => item,
                None => return Ok(report),
            },
        };
        for _ in 0..MAX_HAND_OFF_STEPS {
            if item.waiting == 0 {
                break;
            }
            let Some(head) = self.store.waiters(lock, None, 1).await?.pop() else {
                break;
            };
            if item.count() >= head.limit.get() as usize {
                break;
            }
            let write = protocol::grant(&head, self.now_ms());
            let result = self.store.write(&write).await?;
            match protocol::granted(&write, result)? {
                Grant::Granted => {
                    let after = self.status(lock).await?;
                    let Some(token) = after.holders.get(&head.identity).map(|h| h.token) else {
                        // Freed already (its execution ended and was cleaned up): nothing to
                        // wake.
                        item = after;
                        continue;
                    };
                    item = after;
                    match waker.wake(&head, token).await {
                        Ok(()) => report.woken.push((head.identity.clone(), token)),
                        Err(why) => {
                            let holder = &head.identity.holder;
                            match executions.describe(holder).await {
                                Ok(
                                    state @ (ExecutionState::Ended { .. }
                                    | ExecutionState::Missing),
                                ) => {
                                    tracing::info!(%lock, %holder, %why, "granted waiter's execution has ended: freeing its slot");
                                    self.cleanup_run(lock, holder, state.last_run()).await?;
                                    report.freed.push(head.identity.clone());
                                    item = self.status(lock).await?;
                                }
                                Ok(ExecutionState::Running | ExecutionState::NotAnExecution) => {
                                    tracing::info!(%lock, %holder, %why, "granted waiter not woken; it keeps the slot and finds it when it checks again");
                                    report.parked.push(head.identity.clone());
                                }
                                Err(e) => {
                                    tracing::warn!(%lock, %holder, %why, error = %e, "granted waiter not woken and its execution not described; the sweeper checks it");
                                    report.parked.push(head.identity.clone());
                                }
                            }
                        }
                    }
                }
                Grant::Moved { current } => item = current,
                Grant::Dead { .. } | Grant::Holding { .. } => {
                    self.leave(lock, head.key).await?;
                    report.skipped.push(head.identity.clone());
                    item = self.status(lock).await?;
                }
                Grant::NoSlot { .. } => break,
            }
        }
        Ok(report)
    }

    pub async fn status(&self, lock: &LockName) -> Result<SemaphoreItem, Error> {
        self.store
            .load(lock)
            .await?
            .ok_or_else(|| Error::UnknownLock { lock: lock.clone() })
    }

    /// Every semaphore item, as read (consistently) now.
    pub async fn list(&self) -> Result<Vec<Result<SemaphoreItem, StoreError>>, Error> {
        Ok(self.store.list().await?)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;
    use crate::clock::ManualClock;
    use crate::input::AcquisitionId;
    use crate::memory::MemoryStore;
    use crate::protocol::FenceReason;

    /// A memory store counting the requests sent to it and the writes refused.
    #[derive(Clone, Default)]
    struct Counted {
        inner: Arc<MemoryStore>,
        loads: Arc<AtomicUsize>,
        writes: Arc<AtomicUsize>,
        refused: Arc<AtomicUsize>,
    }

    impl Counted {
        /// (loads, writes, refused writes) since the last call.
        fn take(&self) -> (usize, usize, usize) {
            (
                self.loads.swap(0, Ordering::SeqCst),
                self.writes.swap(0, Ordering::SeqCst),
                self.refused.swap(0, Ordering::SeqCst),
            )
        }
    }

    impl ItemStore for Counted {
        async fn load(&self, lock: &LockName) -> Result<Option<SemaphoreItem>, StoreError> {
            self.loads.fetch_add(1, Ordering::SeqCst);
            self.inner.load(lock).await
        }
        async fn write(&self, write: &Write) -> Result<WriteResult, StoreError> {
            self.writes.fetch_add(1, Ordering::SeqCst);
            let result = self.inner.write(write).await;
            if matches!(result, Ok(WriteResult::Refused { .. })) {
                self.refused.fetch_add(1, Ordering::SeqCst);
            }
            result
        }
        async fn list(&self) -> Result<Vec<Result<SemaphoreItem, StoreError>>, StoreError> {
            self.inner.list().await
        }
        async fn waiters(
            &self,
            lock: &LockName,
            after: Option<QueueKey>,
            limit: usize,
        ) -> Result<Vec<Waiter>, StoreError> {
            self.inner.waiters(lock, after, limit).await
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

    #[tokio::test]
    async fn an_uncontended_critical_section_is_two_writes_and_no_read() {
        let store = Counted::default();
        let clock = Arc::new(ManualClock::new(1_000_000));
        let sem = Semaphore::new(store.clone()).with_clock(clock.clone());
        let section = |n: String| {
            let sem = sem.clone();
            async move {
                let who = id(&n, "1");
                assert!(matches!(
                    sem.acquire(&lock(), &who, limit(5)).await.unwrap(),
                    AcquireOutcome::Acquired { .. }
                ));
                sem.release(&lock(), &who).await.unwrap();
            }
        };
        section("first".into()).await;
        store.take();
        for n in 0..protocol::BUSY_YOUNG_FENCES - 2 {
            section(format!("e{n}")).await;
        }
        assert_eq!(
            store.take(),
            (0, 2 * (protocol::BUSY_YOUNG_FENCES - 2), 0),
            "(loads, writes, refused)"
        );
        // The release that makes the young generation worth rotating also rotates it (this lock
        // never rotated): one more write, once per that many releases at most.
        section("busy".into()).await;
        assert_eq!(store.take(), (0, 3, 0));
        let item = store.inner.load_now(&lock()).unwrap();
        assert_eq!(item.fences.old.len(), protocol::BUSY_YOUNG_FENCES);
        assert!(item.fences.young.is_empty());
        // Within the window no rotation, however many fences.
        for n in 0..protocol::BUSY_YOUNG_FENCES + 1 {
            section(format!("w{n}")).await;
        }
        assert_eq!(store.take(), (0, 2 * (protocol::BUSY_YOUNG_FENCES + 1), 0));
        // A window later the next release rotates: the first window's fences are dropped.
        clock.advance_ms(u64::try_from(sem.timing().window().as_millis()).unwrap());
        section("late".into()).await;
        assert_eq!(store.take(), (0, 3, 0));
        let item = store.inner.load_now(&lock()).unwrap();
        assert_eq!(item.fences.old.len(), protocol::BUSY_YOUNG_FENCES + 2);
        assert!(item.fences.young.is_empty());
    }

    #[tokio::test]
    async fn a_retried_acquire_is_answered_already_held_with_the_first_token() {
        let sem = Semaphore::new(MemoryStore::new());
        let who = id("a", "1");
        let AcquireOutcome::Acquired { token, .. } =
            sem.acquire(&lock(), &who, limit(1)).await.unwrap()
        else {
            panic!("expected acquired")
        };
        sem.acquire(&lock(), &id("b", "1"), limit(2)).await.unwrap();
        assert_eq!(
            sem.acquire(&lock(), &who, limit(1)).await.unwrap(),
            AcquireOutcome::AlreadyHeld { token, count: 2 }
        );
    }

    #[tokio::test]
    async fn a_fence_alone_keeps_the_slots_and_refuses_new_acquires() {
        let sem = Semaphore::new(MemoryStore::new());
        let holder = HolderId::new("x").unwrap();
        let held = Identity::new(holder.clone(), AcquisitionId::new("1").unwrap());
        sem.acquire(&lock(), &held, limit(2)).await.unwrap();
        assert_eq!(
            sem.fence(&lock(), &holder, Run::FIRST).await.unwrap().slots,
            std::slice::from_ref(&held)
        );
        let item = sem.status(&lock()).await.unwrap();
        assert!(item.holders.contains_key(&held), "the slot stays held");
        assert_eq!(
            sem.acquire(
                &lock(),
                &Identity::new(holder.clone(), AcquisitionId::new("2").unwrap()),
                limit(2)
            )
            .await
            .unwrap(),
            AcquireOutcome::Fenced(FenceReason::ExecutionEnded)
        );
        let out = sem.cleanup(&lock(), &holder).await.unwrap();
        assert_eq!(out.freed.len(), 1);
    }

    #[tokio::test]
    async fn cleanup_fences_first_then_frees_what_the_fence_saw() {
        let store = Counted::default();
        let sem = Semaphore::new(store.clone());
        let holder = HolderId::new("x").unwrap();
        for a in ["1", "2"] {
            sem.acquire(
                &lock(),
                &Identity::new(holder.clone(), AcquisitionId::new(a).unwrap()),
                limit(3),
            )
            .await
            .unwrap();
        }
        store.take();
        let out = sem.cleanup(&lock(), &holder).await.unwrap();
        assert_eq!(out.freed.len(), 2);
        assert_eq!(out.count, 0);
        // The fence, then the free.
        assert_eq!(store.take(), (0, 2, 0));
        assert_eq!(
            sem.acquire(
                &lock(),
                &Identity::new(holder.clone(), AcquisitionId::new("3").unwrap()),
                limit(3)
            )
            .await
            .unwrap(),
            AcquireOutcome::Fenced(FenceReason::ExecutionEnded)
        );
        // A duplicate cleanup of an execution that holds nothing is one write.
        let again = sem.cleanup(&lock(), &holder).await.unwrap();
        assert!(again.freed.is_empty());
        assert_eq!(
            store.take(),
            (0, 2, 1),
            "the refused acquire, then one fence write"
        );
        assert_eq!(
            sem.status(&lock()).await.unwrap().version.0,
            5,
            "every write that landed bumped the version"
        );
    }
    #[tokio::test]
    async fn a_cleanup_fences_the_run_that_ended_and_the_runs_before_it_never_a_later_one() {
        let sem = Semaphore::new(MemoryStore::new());
        let holder = HolderId::new("x").unwrap();
        let run = |n: u32, acquisition: &str| {
            (
                Run(n),
                Identity::new(holder.clone(), AcquisitionId::new(acquisition).unwrap()),
            )
        };
        let (run0, first) = run(0, "r0");
        let (run1, second) = run(1, "r1");
        let (run2, third) = run(2, "r2");
        let now = sem.now_ms();
        // Run 1 ended: its cleanup fences runs 0 and 1 (run 0's own cleanup may have found the
        // execution redriven and fenced nothing).
        sem.cleanup_run(&lock(), &holder, run1).await.unwrap();
        for (run, identity) in [(run0, &first), (run1, &second)] {
            assert_eq!(
                sem.acquire_in_run(&lock(), identity, run, limit(5), now)
                    .await
                    .unwrap(),
                AcquireOutcome::Fenced(FenceReason::ExecutionEnded),
                "{run}"
            );
        }
        // Run 2, redriven after that cleanup, is not fenced.
        assert!(matches!(
            sem.acquire_in_run(&lock(), &third, run2, limit(5), now)
                .await
                .unwrap(),
            AcquireOutcome::Acquired { .. }
        ));
        let item = sem.status(&lock()).await.unwrap();
        assert_eq!(item.fences.young.len(), 2);
    }
}
