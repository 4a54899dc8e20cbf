//! A [`Semaphore`]'s slots: acquire, release, fence, free and cleanup, and the rotation of the
//! fences a release or cleanup sends once they are worth a write. A release or cleanup whose slot
//! went (or is of another weight) meanwhile sends the write its refusal calls for.

use super::Semaphore;
use crate::error::{Error, StoreError};
use crate::input::{terms_on, HolderId, Lease, LockName, Terms};
use crate::item::{Claim, Holding, Identity, Run, SemaphoreItem, TakenBackSlot};
use crate::ports::ItemStore;
use crate::protocol::{
    self, millis, unexpected, AcquireOutcome, CleanupOutcome, Fenced, HeartbeatOutcome,
    ReleaseOutcome, Step, WriteResult,
};
use crate::write::Write;

/// Most writes one release or cleanup sends (see [`Semaphore::release_seeing`]): a chain of
/// refusals is short (a release showing its token is refused at most once, for a wrong weight;
/// the operator's fence alone, then the removal of a slot an acquire landed meanwhile; a
/// cleanup's free, then the rest of its slots), so this is never reached but by a store that
/// misbehaves.
pub const MAX_ROUNDS: usize = 8;

/// What a take-back of expired leases did: the slots it took back (each fenced), and the lock
/// as the last write left it or handed it back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TakenBack {
    pub slots: Vec<TakenBackSlot>,
    pub item: SemaphoreItem,
}

impl<S: ItemStore> Semaphore<S> {
    /// Renews the lease of `identity`'s slot on `lock` that `claim` shows to end `lease` from
    /// now (F13). One write (the operator's claim reads the slot first).
    /// [`HeartbeatOutcome::Lost`]: the slot was taken back (or released, or cleaned up), and
    /// the acquisition is fenced: its holder must stop. [`HeartbeatOutcome::WrongToken`]: the
    /// identity holds a slot under another token (F15); nothing was written.
    pub async fn heartbeat(
        &self,
        lock: &LockName,
        identity: &Identity,
        claim: Claim,
        lease: Lease,
    ) -> Result<HeartbeatOutcome, Error> {
        let (token, weight) = match claim {
            Claim::Slot { token, weight } => (token, weight),
            Claim::Operator => match self.held(lock, identity).await? {
                Some(holding) => (holding.token, holding.weight),
                None => return Ok(HeartbeatOutcome::Lost),
            },
        };
        let mut write = protocol::heartbeat(lock, identity, token, weight, lease, self.now_ms());
        self.rounds(&mut write, |write, result| {
            Ok(protocol::heartbeat_answered(
                write, identity, claim, &result,
            ))
        })
        .await
    }

    /// The slot `identity` holds on `lock` now, read (the operator's claim).
    async fn held(&self, lock: &LockName, identity: &Identity) -> Result<Option<Holding>, Error> {
        Ok(self
            .store
            .load_holder(lock, &identity.holder)
            .await?
            .and_then(|item| item.holders.get(identity).copied()))
    }

    /// Takes back every slot of the lock `item` shows whose lease ended more than the clock
    /// skew ago (by this writer's clock), in writes of at most
    /// [`protocol::MAX_SLOTS_PER_TAKE_BACK`] slots, each checked to be the very lease read (a
    /// heartbeat that lands first keeps its slot). `None` when none had expired: nothing sent.
    pub async fn take_back_expired(
        &self,
        item: &SemaphoreItem,
    ) -> Result<Option<TakenBack>, Error> {
        let now_ms = self.now_ms();
        let skew_ms = millis(self.timing.clock_skew);
        let expired = item.expired_leases(now_ms, skew_ms);
        if expired.is_empty() {
            return Ok(None);
        }
        let mut taken = Vec::new();
        let mut write = protocol::take_back(&item.lock, &expired, now_ms);
        let mut current = item.clone();
        // The lock as the write in flight was decided on.
        let mut judged = item.clone();
        for _ in 0..MAX_ROUNDS * 4 {
            let result = self.store.write(&write).await?;
            let next = match &result {
                WriteResult::Applied { before } => {
                    current = write
                        .apply(before.as_ref())
                        .map_err(|_| unexpected(&write, "a take-back landed but does not apply"))?;
                    if let Some(before) = before.as_ref() {
                        taken.extend(taken_by(&write, before, now_ms));
                    }
                    // The next chunk, if there were more.
                    let rest = current.expired_leases(now_ms, skew_ms);
                    (!rest.is_empty()).then(|| protocol::take_back(&item.lock, &rest, now_ms))
                }
                WriteResult::Refused { current: seen, .. }
                | WriteResult::Unsure { current: seen } => {
                    current = seen.clone();
                    judged = seen.clone();
                    protocol::take_back_again(&write, seen, now_ms, skew_ms)
                }
                // A gate's take-back: every slot it names was held under the lease read (its
                // checks held), as the view it was judged on shows them.
                WriteResult::Landed { after: Some(after) } => {
                    let took = taken_by(&write, &judged, now_ms);
                    let named: Vec<Identity> = took.iter().map(|t| t.identity.clone()).collect();
                    taken.extend(took);
                    current = after.clone();
                    // The next chunk, if there were more.
                    let rest: Vec<_> = judged
                        .expired_leases(now_ms, skew_ms)
                        .into_iter()
                        .filter(|(identity, ..)| !named.contains(identity))
                        .collect();
                    for identity in &named {
                        judged.holders.remove(identity);
                        judged.leases.remove(identity);
                    }
                    (!rest.is_empty()).then(|| protocol::take_back(&item.lock, &rest, now_ms))
                }
                WriteResult::Landed { after: None } => {
                    return Err(unexpected(&write, "a take-back landed unread").into())
                }
            };
            match next {
                Some(next) => write = next,
                None => break,
            }
        }
        self.noted_taken_back(&taken);
        Ok(Some(TakenBack {
            slots: taken,
            item: current,
        }))
    }

    /// Takes a slot on `terms` (a [`Limit`](crate::input::Limit) alone: weight 1, no rate) for a request made now.
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
    /// its acquire state, which is before any fence this acquire must meet; see [`Timing`](crate::protocol::Timing)) by
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
    ///
    /// On a lock its operator configured (F14), the terms are the configuration's, whatever
    /// `terms` asked for but the weight (the item's `limit` and `rate` say which were taken):
    /// the write assumes the configuration last seen and lands only on it; a refusal for
    /// another configuration is sent again on that one. A weight above the configured largest
    /// is [`InputError::WeightAboveConfigured`](crate::InputError::WeightAboveConfigured), and
    /// nothing is taken.
    pub async fn acquire_seeing(
        &self,
        lock: &LockName,
        identity: &Identity,
        run: Run,
        terms: impl Into<Terms>,
        requested_at_ms: u64,
    ) -> Result<(AcquireOutcome, Option<SemaphoreItem>), Error> {
        let asked = terms.into();
        let mut last = (AcquireOutcome::Expired, None);
        for _ in 0..super::CONFIG_ROUNDS {
            let config = self.acquiring_config(lock).await?;
            let terms = terms_on(config.as_ref(), lock, asked)?;
            let write = match protocol::acquire(
                lock,
                identity,
                run,
                config,
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
            let outcome = protocol::acquired(&write, identity, terms.limit, result)?;
            if let AcquireOutcome::Configured(actual) = outcome {
                self.saw_config(lock, actual);
                last = (outcome, seen);
                continue;
            }
            // F13: full, but holding a slot whose lease has passed: taken back, and asked again.
            if let (AcquireOutcome::Full { .. }, Some(item)) = (&outcome, &seen) {
                if let Some(taken) = self.take_back_expired(item).await? {
                    if !taken.slots.is_empty() {
                        last = (outcome, Some(taken.item));
                        continue;
                    }
                }
            }
            return Ok((outcome, seen));
        }
        Ok(last)
    }

    /// Frees the identity's slot that `claim` shows, if held, and fences the acquisition. One
    /// write (and, about once per fence window per lock, a rotation of the fences); see
    /// [`Semaphore::release_seeing`].
    pub async fn release(
        &self,
        lock: &LockName,
        identity: &Identity,
        claim: Claim,
    ) -> Result<ReleaseOutcome, Error> {
        Ok(self.release_seeing(lock, identity, claim).await?.0)
    }

    /// [`Semaphore::release`], also answering the lock's item as the release left it: what a
    /// [`Semaphore::hand_off`] of the freed slot starts from, without reading it again. One
    /// write when the claim's weight is right; when it is not, the refusal hands back the item,
    /// and the write it calls for is sent instead. A claim of a slot held under another token is
    /// [`ReleaseOutcome::WrongToken`], with nothing written (F15); the operator's claim reads
    /// the slot first, and fences an acquisition that holds none.
    pub async fn release_seeing(
        &self,
        lock: &LockName,
        identity: &Identity,
        claim: Claim,
    ) -> Result<(ReleaseOutcome, SemaphoreItem), Error> {
        let (outcome, after, _) = self.release_freeing(lock, identity, claim).await?;
        Ok((outcome, after))
    }

    /// [`Semaphore::release_seeing`], also answering the slot it freed as it was held (when it
    /// was taken: the functions' time-held metric), if the write that freed it was answered.
    pub async fn release_freeing(
        &self,
        lock: &LockName,
        identity: &Identity,
        claim: Claim,
    ) -> Result<(ReleaseOutcome, SemaphoreItem, Option<Holding>), Error> {
        let now_ms = self.now_ms();
        let mut write = match claim {
            Claim::Slot { token, weight } => {
                protocol::release(lock, identity, token, weight, now_ms)
            }
            Claim::Operator => match self.held(lock, identity).await? {
                Some(holding) => {
                    protocol::release(lock, identity, holding.token, holding.weight, now_ms)
                }
                None => protocol::release_unheld(lock, identity, now_ms),
            },
        };
        let freed = std::sync::Mutex::new(None);
        let (outcome, after) = self
            .rounds(&mut write, |write, result| {
                if let WriteResult::Applied { before: Some(item) } = &result {
                    *freed.lock().unwrap_or_else(|e| e.into_inner()) =
                        item.holders.get(identity).copied();
                }
                protocol::released(write, identity, claim, result)
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
        let (_, mut after) = protocol::fenced_slots(&fence, holder, result)?;
        self.rotate_if_busy(&after).await;
        // A gate's fence lands on the gate alone: the holder's holdings are read once it has,
        // and no acquire of a fenced run can add to them any more.
        if after.layout == crate::item::Layout::Gate {
            after = self
                .store
                .load_holder(lock, holder)
                .await?
                .ok_or_else(|| Error::UnknownLock { lock: lock.clone() })?;
        }
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
            let mut free = protocol::cleanup_free(&fenced.lock, chunk);
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

    /// Drops the tombstones of gate lock `lock` that a rotation has passed (read now, after
    /// any rotation the caller just sent); how many. Housekeeping: a drop refused (the
    /// tombstone is not as read) changes nothing, and a later sweep tries again.
    pub async fn drop_passed_tombstones(&self, lock: &LockName) -> Result<usize, Error> {
        let item = self.status(lock).await?;
        let mut dropped = 0;
        for write in protocol::drop_tombstones(&item, &self.timing) {
            if matches!(
                self.store.write(&write).await?,
                WriteResult::Applied { .. } | WriteResult::Landed { .. }
            ) {
                dropped += 1;
            }
        }
        Ok(dropped)
    }

    /// Moves `lock` to `layout` (see [`crate::item::Layout`]); the item as it is after.
    /// Refused with [`Error::NotIdle`] unless nothing is held, nobody waits, and its fences and
    /// tombstones are gone (a rotation a window or two after the last release drops them).
    pub async fn set_layout(
        &self,
        lock: &LockName,
        layout: crate::item::Layout,
    ) -> Result<SemaphoreItem, Error> {
        let write = protocol::set_layout(lock, layout);
        match self.store.write(&write).await? {
            WriteResult::Applied { before } => write.apply(before.as_ref()).map_err(|_| {
                unexpected(&write, "a layout change landed but does not apply").into()
            }),
            WriteResult::Refused { current, .. } | WriteResult::Unsure { current }
                if current.layout == layout =>
            {
                Ok(current)
            }
            WriteResult::Refused { current, .. } | WriteResult::Unsure { current } => {
                Err(Error::NotIdle {
                    lock: lock.clone(),
                    layout,
                    used: current.used,
                    waiting: current.waiting,
                    fences: current.fences.len() + current.tombstones.len(),
                })
            }
            WriteResult::Landed { .. } => {
                Err(unexpected(&write, "a layout change was sent as a transaction").into())
            }
        }
    }

    /// Sends a rotation. Housekeeping: one refused (another writer rotated first) or failed
    /// changes no answer, and a later write tries again.
    async fn rotate(&self, rotation: Option<Write>) -> bool {
        let Some(write) = rotation else {
            return false;
        };
        match self.store.write(&write).await {
            Ok(WriteResult::Applied { .. } | WriteResult::Landed { .. }) => true,
            Ok(WriteResult::Refused { .. } | WriteResult::Unsure { .. }) => false,
            Err(e) => {
                tracing::warn!(lock = %write.lock, error = %e, "fence rotation failed; a later write retries it");
                false
            }
        }
    }
}

/// The slots `write`, a take-back that landed, took, as `seen` (the lock it was decided on, or
/// as it was just before) showed them: each is logged, for whoever collects them.
fn taken_by(write: &Write, seen: &SemaphoreItem, now_ms: u64) -> Vec<TakenBackSlot> {
    write
        .changes
        .iter()
        .filter_map(|change| match change {
            crate::write::Change::RemoveHolder { identity, .. } => Some(identity),
            _ => None,
        })
        .filter_map(|identity| {
            let (holding, until) = (seen.holders.get(identity)?, seen.leases.get(identity)?);
            tracing::warn!(lock = %write.lock, holder = %identity.holder, acquisition = %identity.acquisition, token = holding.token.0, lease_until_ms = until, "took back a slot whose lease had passed");
            Some(TakenBackSlot {
                lock: write.lock.clone(),
                identity: identity.clone(),
                holding: *holding,
                lease_until_ms: *until,
                taken_at_ms: now_ms,
            })
        })
        .collect()
}
