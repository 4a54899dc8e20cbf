//! The [`Semaphore`]: each operation sends the protocol's writes to an [`ItemStore`] and turns
//! what became of them into an answer. No operation reads first, and none retries on a conflict:
//! there are none (see `protocol`). A release or cleanup whose slot went (or is of another
//! weight) meanwhile sends the write its refusal calls for.

use std::future::Future;
use std::sync::Arc;

use crate::clock::{Clock, SystemClock};
use crate::error::{Error, StoreError};
use crate::input::{HolderId, LockName, Terms, Weight};
use crate::item::{Holding, Identity, Run, SemaphoreItem};
use crate::protocol::{
    self, AcquireOutcome, CleanupOutcome, Grant, ReleaseOutcome, Step, Timing, WriteResult,
};
use crate::queue::{HandOff, QueueKey, QueueOutcome, TaskToken, Waiter, Wake, Waker};
use crate::sweep::{ExecutionState, ExecutionStatus};
use crate::write::Write;

/// Most grants (and skips of dead waiters) one hand-off makes before it leaves the rest to the
/// next one (a release, a waiter's fallback check, the sweeper): bounds one Lambda's work when
/// thousands of waiters died at once.
pub const MAX_HAND_OFF_STEPS: usize = 64;

/// The longest a hand-off waits for the start rate to allow its head's grant, in all: a head
/// that would wait longer is told to come back ([`Waker::defer`]), which costs it a few state
/// transitions and a second or more; sleeping this long in the Lambda costs less and keeps a
/// rate above one per second reachable while a line waits.
pub const RATE_WAIT_BUDGET_MS: u64 = 2_000;

/// Most writes one release or cleanup sends (see [`Semaphore::release_seeing`]): a chain of
/// refusals is at most three long (the slot gone, then an acquire of it landing, then a
/// duplicate release removing it), so this is never reached but by a store that misbehaves.
pub const MAX_ROUNDS: usize = 8;

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
/// fence landed (all it will ever hold there), and the slots held and the waiters in line then.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fenced {
    pub lock: LockName,
    /// As the fence found them (their weights, tokens and times): what a cleanup whose freeing
    /// write's answer was lost reports as freed (see [`protocol::freed_seen`]).
    pub slots: Vec<(Identity, Holding)>,
    pub count: usize,
    pub waiting: u64,
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

    /// Takes a slot on `terms` (a [`Limit`] alone: weight 1, no rate) for a request made now.
    pub async fn acquire(
        &self,
        lock: &LockName,
        identity: &Identity,
        terms: impl Into<Terms>,
    ) -> Result<AcquireOutcome, Error> {
        self.acquire_requested_at(lock, identity, terms, self.now_ms())
            .await
    }

    /// Takes a slot for a request made at `requested_at_ms` by the first run of the execution.
    pub async fn acquire_requested_at(
        &self,
        lock: &LockName,
        identity: &Identity,
        terms: impl Into<Terms>,
        requested_at_ms: u64,
    ) -> Result<AcquireOutcome, Error> {
        self.acquire_in_run(lock, identity, Run::FIRST, terms, requested_at_ms)
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
        terms: impl Into<Terms>,
        requested_at_ms: u64,
    ) -> Result<AcquireOutcome, Error> {
        Ok(self
            .acquire_seeing(lock, identity, run, terms, requested_at_ms)
            .await?
            .0)
    }

    /// [`Semaphore::acquire_in_run`], also answering the lock's item as the write left it (taken)
    /// or handed it back (refused): what the functions' metrics read the weight in use, the
    /// limit and the line's length from, without reading it again. `None` when nothing was sent
    /// (expired).
    pub async fn acquire_seeing(
        &self,
        lock: &LockName,
        identity: &Identity,
        run: Run,
        terms: impl Into<Terms>,
        requested_at_ms: u64,
    ) -> Result<(AcquireOutcome, Option<SemaphoreItem>), Error> {
        let terms = terms.into();
        let write = match protocol::acquire(
            lock,
            identity,
            run,
            terms,
            requested_at_ms,
            self.now_ms(),
            &self.timing,
        ) {
            Ok(write) => write,
            Err(answer) => return Ok((answer, None)),
        };
        let result = self.store.write(&write).await?;
        let seen = match &result {
            WriteResult::Applied { before } => write.apply(before.as_ref()).ok(),
            other => other.refused_item().cloned(),
        };
        Ok((
            protocol::acquired(&write, identity, terms.limit, result)?,
            seen,
        ))
    }

    /// Frees the identity's slot, if held, and fences the acquisition. One write for a slot of
    /// weight 1 (and, about once per fence window per lock, a rotation of the fences); see
    /// [`Semaphore::release_seeing`] for others.
    pub async fn release(
        &self,
        lock: &LockName,
        identity: &Identity,
    ) -> Result<ReleaseOutcome, Error> {
        Ok(self.release_seeing(lock, identity, Weight::ONE).await?.0)
    }

    /// [`Semaphore::release`] of a slot believed to be of `weight` (its acquire's), also
    /// answering the lock's item as the release left it: what a [`Semaphore::hand_off`] of the
    /// freed slot starts from, without reading it again. One write when the belief is right;
    /// when it is not (another weight, or nothing held) the refusal hands back the item, and the
    /// write it calls for is sent instead.
    pub async fn release_seeing(
        &self,
        lock: &LockName,
        identity: &Identity,
        weight: Weight,
    ) -> Result<(ReleaseOutcome, SemaphoreItem), Error> {
        let (outcome, after, _) = self.release_freeing(lock, identity, weight).await?;
        Ok((outcome, after))
    }

    /// [`Semaphore::release_seeing`], also answering the slot it freed as it was held (when it
    /// was taken: the functions' time-held metric), if the write that freed it was answered.
    pub async fn release_freeing(
        &self,
        lock: &LockName,
        identity: &Identity,
        weight: Weight,
    ) -> Result<(ReleaseOutcome, SemaphoreItem, Option<Holding>), Error> {
        let mut write = protocol::release(lock, identity, weight);
        let freed = std::sync::Mutex::new(None);
        let (outcome, after) = self
            .rounds(&mut write, |write, result| {
                if let WriteResult::Applied { before: Some(item) } = &result {
                    *freed.lock().unwrap_or_else(|e| e.into_inner()) =
                        item.holders.get(identity).copied();
                }
                protocol::released(write, identity, result)
            })
            .await?;
        self.rotate_if_busy(&after).await;
        let freed = freed.into_inner().unwrap_or_else(|e| e.into_inner());
        let freed = freed.filter(|_| matches!(outcome, ReleaseOutcome::Released { .. }));
        Ok((outcome, after, freed))
    }

    /// Sends `write`, then each write its refusal calls for, until `step` says done. An
    /// acquisition lands at most once and never after its fence, and a fenced execution's slots
    /// only go, so every chain of refusals is short; [`MAX_ROUNDS`] bounds it all the same.
    async fn rounds<T>(
        &self,
        write: &mut Write,
        step: impl Fn(&Write, WriteResult) -> Result<Step<T>, StoreError>,
    ) -> Result<T, Error> {
        for _ in 0..MAX_ROUNDS {
            let result = self.store.write(write).await?;
            match step(write, result)? {
                Step::Done(done) => return Ok(done),
                Step::Again(next) => *write = next,
            }
        }
        Err(StoreError::Unexpected {
            lock: write.lock.to_string(),
            problem: format!("still refused after {MAX_ROUNDS} rounds"),
        }
        .into())
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
        let (_, after) = protocol::fenced_slots(&fence, holder, result)?;
        self.rotate_if_busy(&after).await;
        let slots = after
            .slots_of(holder)
            .map(|(id, holding)| (id.clone(), *holding))
            .collect();
        Ok(Fenced {
            lock: lock.clone(),
            slots,
            count: after.count(),
            waiting: after.waiting,
        })
    }

    /// Frees the slots a [`Semaphore::fence`] saw: one write per [`protocol::MAX_SLOTS_PER_FREE`]
    /// of them (why several writes are as safe as one: see there), none when it saw none. Only
    /// those slots: one taken since (by a redriven execution, whose new acquisition is another
    /// slot) is left alone, and one freed since by a release is a no-op.
    pub async fn free(&self, fenced: &Fenced) -> Result<CleanupOutcome, Error> {
        let mut outcome = CleanupOutcome {
            freed: Vec::new(),
            count: fenced.count,
            waiting: fenced.waiting,
        };
        let mut last = None;
        for chunk in fenced.slots.chunks(protocol::MAX_SLOTS_PER_FREE) {
            let weights: Vec<_> = chunk
                .iter()
                .map(|(id, holding)| (id.clone(), holding.weight))
                .collect();
            let mut free = protocol::cleanup_free(&fenced.lock, &weights);
            let (chunk_outcome, after) = self
                .rounds(&mut free, |write, result| {
                    protocol::freed_seen(write, result, chunk)
                })
                .await?;
            outcome.freed.extend(chunk_outcome.freed);
            (outcome.count, outcome.waiting) = (chunk_outcome.count, chunk_outcome.waiting);
            last = Some(after);
        }
        if let Some(after) = last {
            self.rotate_if_busy(&after).await;
        }
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
            Ok(WriteResult::Refused { .. } | WriteResult::Unsure { .. }) => false,
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
        let write = match protocol::enqueue(waiter, requested_at_ms, self.now_ms(), &self.timing) {
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
        // The caller's write that freed a slot (if any) has just landed.
        let freed_at_ms = self.now_ms();
        let mut rate_wait_left_ms = RATE_WAIT_BUDGET_MS;
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
            // A head whose weight does not fit waits; nobody passes it (L2).
            if !item.fits(&head.terms) {
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
                        Ok(()) => {
                            // With the times: the local run's hand-off latency (slot freed to
                            // waiter resumed) and its grant-order check read them.
                            let woken_at_ms = self.now_ms();
                            tracing::info!(
                                %lock,
                                holder = %head.identity.holder,
                                acquisition = %head.identity.acquisition,
                                token = token.0,
                                freed_at_ms,
                                woken_at_ms,
                                "handed off"
                            );
                            report.woken.push((head.identity.clone(), token));
                            report.wakes.push(Wake {
                                queued_at_ms: head.key.queued_at_ms,
                                freed_at_ms,
                                woken_at_ms,
                                used: item.used,
                                limit: item.limit,
                                waiting: item.waiting,
                            });
                        }
                        Err(why) => {
                            if self
                                .settle_failed_wake(lock, &head, &why, executions, &mut report)
                                .await?
                            {
                                item = self.status(lock).await?;
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
                Grant::TooSoon {
                    next_start_ms,
                    current,
                } => {
                    let wait_ms = next_start_ms.saturating_sub(self.now_ms());
                    if wait_ms <= rate_wait_left_ms {
                        rate_wait_left_ms -= wait_ms;
                        self.clock.sleep_until(next_start_ms).await;
                        item = current;
                        continue;
                    }
                    // No release will come when the rate frees up: the head comes back itself.
                    match waker.defer(&head, next_start_ms).await {
                        Ok(()) => {
                            report.deferred = Some((head.identity.clone(), next_start_ms));
                        }
                        Err(why) => {
                            tracing::info!(%lock, holder = %head.identity.holder, %why, next_start_ms, "head of the line not told when the rate allows its start; its next check finds out");
                        }
                    }
                    break;
                }
            }
        }
        Ok(report)
    }

    /// A granted waiter's wake-up failed (`why`): if its execution has ended, free the slot again
    /// (a cleanup of its run) and answer `true`, the hand-off going on with the next waiter; if
    /// it may still run, it keeps the slot and finds it when its fallback check asks again.
    async fn settle_failed_wake<X: ExecutionStatus>(
        &self,
        lock: &LockName,
        head: &Waiter,
        why: &str,
        executions: &X,
        report: &mut HandOff,
    ) -> Result<bool, Error> {
        let holder = &head.identity.holder;
        let described = match executions.describe(holder).await {
            // F11: "not found" of a waiter that queued within the grace period may be a stale
            // read of an eventually consistent DescribeExecution: taken as may-still-run.
            Ok(ExecutionState::Missing)
                if !crate::sweep::missing_long_enough(head.key.queued_at_ms, self.now_ms()) =>
            {
                Ok(ExecutionState::Running)
            }
            other => other,
        };
        match described {
            Ok(state @ (ExecutionState::Ended { .. } | ExecutionState::Missing)) => {
                tracing::info!(%lock, %holder, %why, "granted waiter's execution has ended: freeing its slot");
                self.cleanup_run(lock, holder, state.last_run()).await?;
                report.freed.push(head.identity.clone());
                Ok(true)
            }
            Ok(ExecutionState::Running | ExecutionState::NotAnExecution) => {
                tracing::info!(%lock, %holder, %why, "granted waiter not woken; it keeps the slot and finds it when it checks again");
                report.parked.push(head.identity.clone());
                Ok(false)
            }
            Err(e) => {
                tracing::warn!(%lock, %holder, %why, error = %e, "granted waiter not woken and its execution not described; the sweeper checks it");
                report.parked.push(head.identity.clone());
                Ok(false)
            }
        }
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
    fn limit(n: i64) -> crate::Limit {
        crate::Limit::new(n).unwrap()
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
        let slots = sem.fence(&lock(), &holder, Run::FIRST).await.unwrap().slots;
        assert_eq!(
            slots
                .iter()
                .map(|(id, holding)| (id.clone(), holding.weight))
                .collect::<Vec<_>>(),
            [(held.clone(), Weight::ONE)]
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

/// The line through the [`Semaphore`]: queueing, hand-offs, re-parking and leaving, on the
/// memory store (which applies the same writes as the DynamoDB store), with a manual clock.
#[cfg(test)]
mod queue_tests {
    use std::collections::{BTreeMap, BTreeSet};
    use std::sync::Mutex;

    use super::*;
    use crate::clock::ManualClock;
    use crate::input::AcquisitionId;
    use crate::item::FencingToken;
    use crate::memory::MemoryStore;
    use crate::protocol::FenceReason;

    const T0: u64 = 1_800_000_000_000;

    fn lock() -> LockName {
        LockName::new("l").unwrap()
    }
    fn id(h: &str) -> Identity {
        Identity::new(HolderId::new(h).unwrap(), AcquisitionId::new("r0").unwrap())
    }
    fn limit(n: i64) -> crate::Limit {
        crate::Limit::new(n).unwrap()
    }
    fn task_token(text: &str) -> TaskToken {
        TaskToken::new(text).unwrap()
    }
    /// The waiter of execution `h` (its first run) for `n` slots, in line from `queued_at_ms`.
    fn waiter(h: &str, n: i64, queued_at_ms: u64) -> Waiter {
        Waiter::new(
            lock(),
            id(h),
            Run::FIRST,
            limit(n),
            queued_at_ms,
            task_token(&format!("{h}-task-0")),
            format!("context of {h}"),
        )
    }

    // Canned fakes, not under test: a memory test has no Step Functions to wake a parked task
    // (`SendTaskSuccess`) or to say whether an execution still runs (`DescribeExecution`). Each
    // records what it was asked and answers what the test told it to.

    /// Records every wake-up asked for; fails those of the holders it was told to.
    #[derive(Default)]
    struct RecordingWaker {
        calls: Mutex<Vec<(Waiter, FencingToken)>>,
        failing: Mutex<BTreeSet<String>>,
        deferred: Mutex<Vec<(Identity, u64)>>,
    }

    impl RecordingWaker {
        fn fail_for(&self, who: &Identity) {
            let mut failing = self.failing.lock().unwrap();
            failing.insert(who.holder.as_str().to_owned());
        }
        /// (holder, task token woken, fencing token) of every wake-up asked for so far.
        fn calls(&self) -> Vec<(String, String, FencingToken)> {
            let calls = self.calls.lock().unwrap();
            calls
                .iter()
                .map(|(w, token)| {
                    let holder = w.identity.holder.as_str().to_owned();
                    (holder, w.task_token.as_str().to_owned(), *token)
                })
                .collect()
        }
    }

    impl Waker for RecordingWaker {
        async fn wake(&self, waiter: &Waiter, token: FencingToken) -> Result<(), String> {
            self.calls.lock().unwrap().push((waiter.clone(), token));
            let failing = self.failing.lock().unwrap();
            if failing.contains(waiter.identity.holder.as_str()) {
                Err("TaskTimedOut (canned)".to_owned())
            } else {
                Ok(())
            }
        }

        async fn defer(&self, waiter: &Waiter, next_start_ms: u64) -> Result<(), String> {
            self.deferred
                .lock()
                .unwrap()
                .push((waiter.identity.clone(), next_start_ms));
            Ok(())
        }
    }

    /// Answers `describe` as told per holder (`Running` when not told); records who was asked.
    #[derive(Default)]
    struct CannedExecutions {
        answers: Mutex<BTreeMap<String, Result<ExecutionState, String>>>,
        asked: Mutex<Vec<String>>,
    }

    impl CannedExecutions {
        fn answer(&self, who: &Identity, answer: Result<ExecutionState, String>) {
            let mut answers = self.answers.lock().unwrap();
            answers.insert(who.holder.as_str().to_owned(), answer);
        }
        fn asked(&self) -> Vec<String> {
            self.asked.lock().unwrap().clone()
        }
    }

    impl ExecutionStatus for CannedExecutions {
        async fn describe(&self, holder: &HolderId) -> Result<ExecutionState, String> {
            self.asked.lock().unwrap().push(holder.as_str().to_owned());
            let answers = self.answers.lock().unwrap();
            answers
                .get(holder.as_str())
                .cloned()
                .unwrap_or(Ok(ExecutionState::Running))
        }
    }

    fn ended() -> ExecutionState {
        ExecutionState::Ended {
            status: "FAILED".to_owned(),
            last_run: Run::FIRST,
        }
    }

    struct Fixture {
        store: Arc<MemoryStore>,
        clock: Arc<ManualClock>,
        sem: Semaphore<Arc<MemoryStore>>,
        waker: RecordingWaker,
        executions: CannedExecutions,
    }

    fn fixture() -> Fixture {
        let store = Arc::new(MemoryStore::new());
        let clock = Arc::new(ManualClock::new(T0));
        let sem = Semaphore::new(store.clone()).with_clock(clock.clone());
        Fixture {
            store,
            clock,
            sem,
            waker: RecordingWaker::default(),
            executions: CannedExecutions::default(),
        }
    }

    impl Fixture {
        async fn hold(&self, who: &Identity, n: i64) -> FencingToken {
            match self.sem.acquire(&lock(), who, limit(n)).await.unwrap() {
                AcquireOutcome::Acquired { token, .. } => token,
                other => panic!("{who:?} did not acquire: {other:?}"),
            }
        }
        async fn queue(&self, w: &Waiter) -> QueueOutcome {
            let outcome = self.sem.enqueue(w, self.sem.now_ms()).await.unwrap();
            self.assert_counted();
            outcome
        }
        async fn release(&self, who: &Identity) {
            let released = self.sem.release(&lock(), who).await.unwrap();
            assert!(
                matches!(released, ReleaseOutcome::Released { .. }),
                "{released:?}"
            );
        }
        async fn hand_off(&self) -> HandOff {
            let report = self
                .sem
                .hand_off(&lock(), None, &self.waker, &self.executions)
                .await
                .unwrap();
            self.assert_counted();
            report
        }
        fn item(&self) -> SemaphoreItem {
            self.store.load_now(&lock()).expect("the lock has an item")
        }
        fn version(&self) -> u64 {
            self.store
                .load_now(&lock())
                .map_or(0, |item| item.version.0)
        }
        /// The line as stored, head first.
        fn line(&self) -> Vec<Waiter> {
            self.store.waiters_now(&lock(), None, usize::MAX)
        }
        fn line_holders(&self) -> Vec<String> {
            let line = self.line();
            line.iter()
                .map(|w| w.identity.holder.as_str().to_owned())
                .collect()
        }
        /// The lock's `waiting` is the number of waiters' records.
        fn assert_counted(&self) {
            let waiting = self.store.load_now(&lock()).map_or(0, |item| item.waiting);
            assert_eq!(
                usize::try_from(waiting).unwrap(),
                self.line().len(),
                "waiting vs. records in line"
            );
        }
    }

    fn holders_of(report: &[(Identity, FencingToken)]) -> Vec<&str> {
        report.iter().map(|(who, _)| who.holder.as_str()).collect()
    }

    fn names(ids: &[Identity]) -> Vec<&str> {
        ids.iter().map(|who| who.holder.as_str()).collect()
    }

    #[tokio::test]
    async fn enqueue_answers_queued_already_queued_free_already_held_fenced_and_expired() {
        let f = fixture();
        // No item yet: a slot is free and nobody waits. Nothing is written.
        assert_eq!(f.queue(&waiter("w", 1, T0)).await, QueueOutcome::Free);
        assert!(f.store.load_now(&lock()).is_none());

        let a_token = f.hold(&id("a"), 1).await;
        // Free for a waiter whose limit leaves a slot (1 of 2 held) while nobody waits.
        let version = f.version();
        assert_eq!(f.queue(&waiter("z", 2, T0)).await, QueueOutcome::Free);
        assert_eq!(f.version(), version, "a refused write changes nothing");

        let w = waiter("w", 1, T0);
        assert_eq!(f.queue(&w).await, QueueOutcome::Queued);
        assert_eq!(f.item().waiting, 1);
        assert_eq!(
            f.line(),
            std::slice::from_ref(&w),
            "the record is the waiter as queued"
        );

        // A retried attempt whose first one landed: its record is there.
        let version = f.version();
        assert_eq!(f.queue(&w).await, QueueOutcome::AlreadyQueued);
        assert_eq!(f.version(), version);
        assert_eq!(f.item().waiting, 1);

        // Now that someone waits, a waiter with room under its own limit queues too (behind).
        assert_eq!(f.queue(&waiter("z", 2, T0 + 1)).await, QueueOutcome::Queued);
        assert_eq!(f.line_holders(), ["w", "z"]);

        assert_eq!(
            f.queue(&waiter("a", 1, T0)).await,
            QueueOutcome::AlreadyHeld {
                token: a_token,
                count: 1
            }
        );

        // An execution that ended while its attempt to queue was in flight (cleaned up first).
        f.sem.cleanup(&lock(), &id("x").holder).await.unwrap();
        assert_eq!(
            f.queue(&waiter("x", 1, T0)).await,
            QueueOutcome::Fenced(FenceReason::ExecutionEnded)
        );
        // An acquisition released before its attempt to queue landed.
        f.sem.release(&lock(), &id("y")).await.unwrap();
        assert_eq!(
            f.queue(&waiter("y", 1, T0)).await,
            QueueOutcome::Fenced(FenceReason::AcquisitionReleased)
        );

        // A request already past its horizon is not sent.
        let version = f.version();
        let horizon = u64::try_from(f.sem.timing().horizon.as_millis()).unwrap();
        let v = waiter("v", 1, T0);
        assert_eq!(
            f.sem.enqueue(&v, f.sem.now_ms() - horizon).await.unwrap(),
            QueueOutcome::Expired
        );
        assert_eq!(f.version(), version, "nothing was sent");
        // One sent in time but landing after a rotation at its deadline is refused: a writer
        // whose clock is a horizon ahead rotates the fences (there are some: x's and y's).
        let ahead = Semaphore::new(f.store.clone())
            .with_clock(Arc::new(ManualClock::new(f.sem.now_ms() + horizon)));
        assert!(ahead.rotate_if_due(&f.item()).await);
        assert_eq!(
            f.sem.enqueue(&v, f.sem.now_ms()).await.unwrap(),
            QueueOutcome::Expired
        );
        assert_eq!(f.line_holders(), ["w", "z"]);
        f.assert_counted();
    }

    #[tokio::test]
    async fn a_newcomer_does_not_pass_the_line_even_when_a_slot_is_free() {
        let f = fixture();
        f.hold(&id("a"), 2).await;
        f.hold(&id("b"), 2).await;
        let w = waiter("w", 2, T0);
        assert_eq!(f.queue(&w).await, QueueOutcome::Queued);
        f.release(&id("a")).await;
        assert_eq!(f.item().count(), 1, "a slot is free");
        assert_eq!(
            f.sem.acquire(&lock(), &id("n"), limit(2)).await.unwrap(),
            AcquireOutcome::Full {
                count: 1,
                used: 1,
                limit: limit(2)
            },
            "the newcomer is refused while someone waits"
        );
        // It queues behind (its acquire was refused by the line, so queueing is allowed).
        assert_eq!(f.queue(&waiter("n", 2, T0 + 5)).await, QueueOutcome::Queued);
        let report = f.hand_off().await;
        assert_eq!(holders_of(&report.woken), ["w"], "{report:?}");
        assert_eq!(f.line_holders(), ["n"], "the lock is full again");
        // Once nobody waits, an acquire takes a free slot again.
        f.release(&id("b")).await;
        assert_eq!(holders_of(&f.hand_off().await.woken), ["n"]);
        f.release(&id("w")).await;
        assert!(matches!(
            f.sem.acquire(&lock(), &id("m"), limit(2)).await.unwrap(),
            AcquireOutcome::Acquired { count: 2, .. }
        ));
    }

    #[tokio::test]
    async fn a_hand_off_grants_in_line_order_wakes_with_the_grants_token_and_stops_at_the_limit() {
        let f = fixture();
        for h in ["a", "b", "c"] {
            f.hold(&id(h), 3).await;
        }
        // Queued in this order, with these entry times: the line is by time, then digest.
        let queued = [
            waiter("w1", 3, T0 + 500),
            waiter("w2", 3, T0 + 300),
            waiter("w3", 3, T0 + 400),
            waiter("w4", 3, T0 + 300),
            waiter("w5", 3, T0 + 100),
            waiter("w6", 3, T0 + 900),
        ];
        for w in &queued {
            assert_eq!(f.queue(w).await, QueueOutcome::Queued);
        }
        let mut expected = queued.to_vec();
        expected.sort_by_key(|w| w.key);
        assert_eq!(f.line(), expected);
        assert_eq!(expected[0].identity, id("w5"));
        assert_eq!(
            expected[1].key.queued_at_ms, expected[2].key.queued_at_ms,
            "two waiters asked in the same millisecond: their digests order them"
        );

        // Full: a hand-off grants nothing and writes nothing.
        let version = f.version();
        assert!(f.hand_off().await.is_empty());
        assert_eq!(f.version(), version);

        f.release(&id("a")).await;
        f.release(&id("b")).await;
        let report = f.hand_off().await;
        let first_two: Vec<&str> = expected[..2]
            .iter()
            .map(|w| w.identity.holder.as_str())
            .collect();
        assert_eq!(
            holders_of(&report.woken),
            first_two,
            "two free slots, two grants"
        );
        assert!(report.parked.is_empty() && report.freed.is_empty() && report.skipped.is_empty());
        let item = f.item();
        assert_eq!(item.count(), 3, "stopped at the limit");
        for (who, token) in &report.woken {
            assert_eq!(
                item.holders[who].token, *token,
                "woken with its grant's token"
            );
        }
        assert!(report.woken[0].1 < report.woken[1].1, "tokens increase");
        // The waker was handed each waiter as queued (its task token and context).
        let calls = f.waker.calls();
        assert_eq!(calls.len(), 2);
        for (call, w) in calls.iter().zip(&expected) {
            assert_eq!(call.0, w.identity.holder.as_str());
            assert_eq!(call.1, w.task_token.as_str());
        }
        assert_eq!(f.line(), expected[2..]);

        // A release that hands the item it saw to the hand-off (no read of the item).
        f.release(&id("c")).await;
        let report = f
            .sem
            .hand_off(&lock(), Some(f.item()), &f.waker, &f.executions)
            .await
            .unwrap();
        assert_eq!(report.woken.len(), 1);
        assert_eq!(report.woken[0].0, expected[2].identity);
        assert_eq!(f.line(), expected[3..]);
        assert_eq!(f.item().waiting, 3);
        assert!(f.executions.asked().is_empty(), "every wake-up succeeded");
    }

    #[tokio::test]
    async fn a_granted_waiter_that_cannot_be_woken_and_has_ended_gives_its_slot_to_the_next() {
        for state in [ended(), ExecutionState::Missing] {
            let f = fixture();
            f.hold(&id("a"), 1).await;
            let (w1, w2) = (waiter("w1", 1, T0), waiter("w2", 1, T0 + 1));
            f.queue(&w1).await;
            f.queue(&w2).await;
            f.waker.fail_for(&w1.identity);
            f.executions.answer(&w1.identity, Ok(state.clone()));
            f.release(&id("a")).await;
            if state == ExecutionState::Missing {
                // Believed only past the grace period (see the next test).
                f.clock.advance_ms(crate::sweep::MISSING_EXECUTION_GRACE_MS);
            }
            let report = f.hand_off().await;
            assert_eq!(names(&report.freed), ["w1"], "{state:?}: {report:?}");
            assert_eq!(holders_of(&report.woken), ["w2"]);
            assert!(report.parked.is_empty() && report.skipped.is_empty());
            assert_eq!(f.executions.asked(), ["w1"]);
            let calls = f.waker.calls();
            assert_eq!(
                calls.iter().map(|c| c.0.as_str()).collect::<Vec<_>>(),
                ["w1", "w2"]
            );
            let item = f.item();
            assert_eq!(item.holders.keys().collect::<Vec<_>>(), [&w2.identity]);
            assert_eq!(item.holders[&w2.identity].token, report.woken[0].1);
            assert!(f.line().is_empty());
            // The ended execution was cleaned up: nothing of it lands any more.
            assert_eq!(
                f.sem
                    .acquire(&lock(), &w1.identity, limit(1))
                    .await
                    .unwrap(),
                AcquireOutcome::Fenced(FenceReason::ExecutionEnded)
            );
            assert_eq!(
                f.queue(&w1).await,
                QueueOutcome::Fenced(FenceReason::ExecutionEnded)
            );
        }
    }

    #[tokio::test]
    async fn a_granted_waiter_that_cannot_be_woken_but_may_still_run_keeps_its_slot() {
        let answers = [
            Ok(ExecutionState::Running),
            Ok(ExecutionState::NotAnExecution),
            Err("ThrottlingException (canned)".to_owned()),
            // F11: queued within the grace period, "not found" is not believed.
            Ok(ExecutionState::Missing),
        ];
        for answer in answers {
            let f = fixture();
            f.hold(&id("a"), 1).await;
            let (w1, w2) = (waiter("w1", 1, T0), waiter("w2", 1, T0 + 1));
            f.queue(&w1).await;
            f.queue(&w2).await;
            f.waker.fail_for(&w1.identity);
            f.executions.answer(&w1.identity, answer.clone());
            f.release(&id("a")).await;
            let report = f.hand_off().await;
            assert_eq!(names(&report.parked), ["w1"], "{answer:?}: {report:?}");
            assert!(report.woken.is_empty() && report.freed.is_empty());
            let token = f.waker.calls()[0].2;
            assert_eq!(f.item().holders[&w1.identity].token, token);
            assert_eq!(f.line_holders(), ["w2"], "the lock is full: w2 waits on");
            // Its parked task's fallback timeout makes it ask again: it finds its slot, with the
            // token of its grant, whether it acquires or queues.
            assert_eq!(
                f.sem
                    .acquire(&lock(), &w1.identity, limit(1))
                    .await
                    .unwrap(),
                AcquireOutcome::AlreadyHeld { token, count: 1 }
            );
            assert_eq!(
                f.queue(&w1).await,
                QueueOutcome::AlreadyHeld { token, count: 1 }
            );
            f.release(&w1.identity).await;
            assert_eq!(holders_of(&f.hand_off().await.woken), ["w2"]);
        }
    }

    #[tokio::test]
    async fn a_waiter_whose_run_was_cleaned_up_is_skipped_and_its_record_removed() {
        let f = fixture();
        f.hold(&id("a"), 1).await;
        let (w1, w2, w3) = (
            waiter("w1", 1, T0),
            waiter("w2", 1, T0 + 1),
            waiter("w3", 1, T0 + 2),
        );
        for w in [&w1, &w2, &w3] {
            f.queue(w).await;
        }
        // w1's execution ended while it waited and was cleaned up (it held nothing); w2's
        // acquisition was released (its caller gave up).
        let cleaned = f.sem.cleanup(&lock(), &w1.identity.holder).await.unwrap();
        assert!(cleaned.freed.is_empty());
        f.sem.release(&lock(), &w2.identity).await.unwrap();
        assert_eq!(f.line().len(), 3, "neither fence touches the line");
        f.release(&id("a")).await;
        let report = f.hand_off().await;
        assert_eq!(names(&report.skipped), ["w1", "w2"], "{report:?}");
        assert_eq!(holders_of(&report.woken), ["w3"]);
        let woken: Vec<String> = f.waker.calls().into_iter().map(|c| c.0).collect();
        assert_eq!(woken, ["w3"], "the dead were not woken");
        assert!(f.line().is_empty());
        assert_eq!(f.item().waiting, 0);
        assert_eq!(f.item().holders.keys().collect::<Vec<_>>(), [&w3.identity]);
    }

    #[tokio::test]
    async fn a_waiter_queued_twice_is_granted_once_and_its_second_record_removed() {
        let f = fixture();
        f.hold(&id("a"), 2).await;
        f.hold(&id("b"), 2).await;
        // Its wait state was entered again (a new entry time): a second record, a new place.
        let (first, again) = (waiter("w", 2, T0), waiter("w", 2, T0 + 50));
        let other = waiter("o", 2, T0 + 100);
        for w in [&first, &again, &other] {
            assert_eq!(f.queue(w).await, QueueOutcome::Queued);
        }
        f.release(&id("a")).await;
        f.release(&id("b")).await;
        let report = f.hand_off().await;
        assert_eq!(holders_of(&report.woken), ["w", "o"], "{report:?}");
        assert_eq!(names(&report.skipped), ["w"]);
        assert!(f.line().is_empty());
        assert_eq!(f.item().count(), 2);
    }

    #[tokio::test]
    async fn a_reparked_waiter_keeps_its_place_and_is_woken_with_its_new_token() {
        let f = fixture();
        f.hold(&id("a"), 1).await;
        let (w1, w2) = (waiter("w1", 1, T0), waiter("w2", 1, T0 + 1));
        f.queue(&w1).await;
        f.queue(&w2).await;
        let read = f.sem.waiters(&lock(), None, 1).await.unwrap();
        assert_eq!(read, std::slice::from_ref(&w1));

        // Its task's fallback timeout parked it anew, with a new task token.
        let holders = f.item().holders;
        assert!(f
            .sem
            .repark(&lock(), w1.key, task_token("w1-task-1"))
            .await
            .unwrap());
        assert_eq!(f.item().holders, holders);
        assert_eq!(f.line_holders(), ["w1", "w2"], "same place");
        assert_eq!(f.line()[0].task_token, task_token("w1-task-1"));
        assert_eq!(f.item().waiting, 2, "re-parking does not count anew");

        // A grant from the read made before the re-park is refused: the record moved on.
        f.release(&id("a")).await;
        let stale = protocol::grant(&read[0], f.sem.now_ms());
        let result = f.store.write_now(&stale);
        assert!(
            matches!(
                result,
                WriteResult::Refused {
                    waiter_refused: true,
                    ..
                }
            ),
            "{result:?}"
        );
        assert!(matches!(
            protocol::granted(&stale, result).unwrap(),
            Grant::Moved { .. }
        ));
        assert_eq!(f.item().count(), 0, "the stale grant took nothing");
        assert_eq!(f.line().len(), 2);

        let report = f.hand_off().await;
        assert_eq!(holders_of(&report.woken), ["w1"]);
        let calls = f.waker.calls();
        assert_eq!(calls.len(), 1);
        assert_eq!(
            calls[0].1, "w1-task-1",
            "woken with the token its task waits on"
        );

        // Granted, it is no longer in line: re-parking finds nothing and writes nothing.
        let version = f.version();
        assert!(!f
            .sem
            .repark(&lock(), w1.key, task_token("w1-task-2"))
            .await
            .unwrap());
        assert_eq!(f.version(), version);
    }

    /// A memory store that lands one more write right after the first read of the line: a
    /// writer acting between a hand-off's read of the head and its grant.
    struct Interposed {
        inner: Arc<MemoryStore>,
        after_first_read: Mutex<Option<Write>>,
    }

    impl ItemStore for Interposed {
        async fn load(&self, lock: &LockName) -> Result<Option<SemaphoreItem>, StoreError> {
            self.inner.load(lock).await
        }
        async fn write(&self, write: &Write) -> Result<WriteResult, StoreError> {
            self.inner.write(write).await
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
            let read = self.inner.waiters(lock, after, limit).await;
            let interposed = self.after_first_read.lock().unwrap().take();
            if let Some(write) = interposed {
                let landed = self.inner.write_now(&write);
                assert_eq!(landed, WriteResult::Landed);
            }
            read
        }
    }

    #[tokio::test]
    async fn a_hand_off_that_read_the_head_before_it_parked_anew_reads_again_and_wakes_the_new_token(
    ) {
        let f = fixture();
        f.hold(&id("a"), 1).await;
        let w1 = waiter("w1", 1, T0);
        f.queue(&w1).await;
        f.release(&id("a")).await;
        let store = Interposed {
            inner: f.store.clone(),
            after_first_read: Mutex::new(Some(protocol::repark(
                &lock(),
                w1.key,
                task_token("w1-task-1"),
            ))),
        };
        let sem = Semaphore::new(store).with_clock(f.clock.clone());
        let report = sem
            .hand_off(&lock(), None, &f.waker, &f.executions)
            .await
            .unwrap();
        assert_eq!(holders_of(&report.woken), ["w1"], "{report:?}");
        let calls = f.waker.calls();
        assert_eq!(calls.len(), 1, "woken once");
        assert_eq!(calls[0].1, "w1-task-1");
        assert!(f.line().is_empty());
        f.assert_counted();
    }

    #[tokio::test]
    async fn leaving_removes_the_record_and_uncounts_it() {
        let f = fixture();
        f.hold(&id("a"), 1).await;
        let line = [
            waiter("w1", 1, T0),
            waiter("w2", 1, T0 + 1),
            waiter("w3", 1, T0 + 2),
        ];
        for w in &line {
            f.queue(w).await;
        }
        assert!(f.sem.leave(&lock(), line[1].key).await.unwrap());
        assert_eq!(f.line_holders(), ["w1", "w3"]);
        assert_eq!(f.item().waiting, 2);
        let version = f.version();
        assert!(!f.sem.leave(&lock(), line[1].key).await.unwrap(), "gone");
        assert_eq!(f.version(), version, "a second leave writes nothing");
        assert_eq!(f.item().waiting, 2);
        for w in [&line[0], &line[2]] {
            assert!(f.sem.leave(&lock(), w.key).await.unwrap());
            f.assert_counted();
        }
        assert_eq!(f.item().waiting, 0);
        // With nobody in line, a free slot is taken by a plain acquire again.
        f.release(&id("a")).await;
        assert!(f.hand_off().await.is_empty());
        f.hold(&id("n"), 1).await;
    }

    /// Random sequences of every queue operation, interleaved with acquires, releases,
    /// cleanups and hand-offs whose wake-ups sometimes fail: after every step the lock's
    /// `waiting` is the number of records, no more than `limit` hold, and a hand-off only ever
    /// takes waiters off the head of the line.
    #[tokio::test]
    async fn waiting_always_equals_the_number_of_records() {
        const LIMIT: i64 = 2;
        // Waiters woken, parked, freed and skipped by the hand-offs, over every sequence.
        let mut seen = [0; 4];
        for seed in 0..40 {
            let mut rng = fastrand::Rng::with_seed(seed);
            let f = fixture();
            let executions: Vec<String> = (0..12).map(|n| format!("e{n}")).collect();
            // Each execution's waiters: a few entry times each, so one can be in line twice.
            let waiter_of = |rng: &mut fastrand::Rng| {
                let h = &executions[rng.usize(..executions.len())];
                waiter(h, LIMIT, T0 + rng.u64(0..4) * 10)
            };
            for step in 0..150 {
                let at = format!("seed {seed}, step {step}");
                match rng.u8(0..8) {
                    0 | 1 => {
                        let w = waiter_of(&mut rng);
                        f.sem.enqueue(&w, f.sem.now_ms()).await.unwrap();
                    }
                    2 => {
                        let w = waiter_of(&mut rng);
                        f.sem
                            .acquire(&lock(), &w.identity, limit(LIMIT))
                            .await
                            .unwrap();
                    }
                    3 => {
                        let w = waiter_of(&mut rng);
                        f.sem.leave(&lock(), w.key).await.unwrap();
                    }
                    4 => {
                        let w = waiter_of(&mut rng);
                        let token = task_token(&format!("{}-task-{step}", w.identity.holder));
                        f.sem.repark(&lock(), w.key, token).await.unwrap();
                    }
                    5 => {
                        // Mostly a holder's release (what frees slots), at times anyone's.
                        let holders: Vec<Identity> = f
                            .store
                            .load_now(&lock())
                            .map(|item| item.holders.into_keys().collect())
                            .unwrap_or_default();
                        let who = match rng.u8(0..4) {
                            0 => waiter_of(&mut rng).identity,
                            _ if holders.is_empty() => continue,
                            _ => holders[rng.usize(..holders.len())].clone(),
                        };
                        f.sem.release(&lock(), &who).await.unwrap();
                    }
                    6 if rng.u8(0..3) == 0 => {
                        let w = waiter_of(&mut rng);
                        f.sem.cleanup(&lock(), &w.identity.holder).await.unwrap();
                    }
                    6 => continue,
                    _ => {
                        let w = waiter_of(&mut rng);
                        if rng.bool() {
                            f.waker.fail_for(&w.identity);
                            let answer = if rng.bool() {
                                Ok(ended())
                            } else {
                                Ok(ExecutionState::Running)
                            };
                            f.executions.answer(&w.identity, answer);
                        }
                        let before = f.line();
                        let report = f.hand_off().await;
                        let after = f.line();
                        assert!(before.ends_with(&after), "{at}: only the head is taken off");
                        let taken = before.len() - after.len();
                        let granted = report.woken.len() + report.parked.len() + report.freed.len();
                        assert_eq!(taken, granted + report.skipped.len(), "{at}: {report:?}");
                        seen[0] += report.woken.len();
                        seen[1] += report.parked.len();
                        seen[2] += report.freed.len();
                        seen[3] += report.skipped.len();
                    }
                }
                f.assert_counted();
                if let Some(item) = f.store.load_now(&lock()) {
                    assert!(item.count() <= LIMIT as usize, "{at}: {item:?}");
                }
            }
        }
        println!("woken, parked, freed, skipped: {seen:?}");
        assert!(
            seen.iter().all(|n| *n >= 10),
            "woken, parked, freed, skipped: {seen:?}"
        );
    }
}
