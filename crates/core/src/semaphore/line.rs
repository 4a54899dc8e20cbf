//! A [`Semaphore`]'s line: waiters queue, re-park and leave, and a hand-off moves the line
//! (see [`crate::queue`] for why a line, and who hands off when).

use super::Semaphore;
use crate::error::Error;
use crate::input::{terms_on, Limit, LockName};
use crate::item::{FencingToken, Identity, SemaphoreItem};
use crate::ports::{
    missing_long_enough, ExecutionState, ExecutionStatus, ItemStore, PortError, Waker,
};
use crate::protocol::{self, Grant, QueueOutcome, WriteResult};
use crate::queue::{Attempt, QueueKey, Waiter, WaiterId, Wakeup};

/// Most grants (and skips of dead waiters) one hand-off makes before it leaves the rest to the
/// next one (a release, a waiter's fallback check, the sweeper): bounds one Lambda's work when
/// thousands of waiters died at once.
pub const MAX_HAND_OFF_STEPS: usize = 64;

/// The longest a hand-off waits for the start rate to allow its head's grant, in all: a head
/// that would wait longer is told to come back ([`Waker::defer`]), which costs it a few state
/// transitions and a second or more; sleeping this long in the Lambda costs less and keeps a
/// rate above one per second reachable while a line waits.
pub const RATE_WAIT_BUDGET_MS: u64 = 2_000;

/// What a hand-off did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HandOff {
    /// Waiters granted a slot and woken, in the order they were granted.
    pub woken: Vec<(Identity, FencingToken)>,
    /// Waiters granted a slot whose wake-up failed while their execution still runs: they keep
    /// the slot, and find it when their parked task's fallback timeout makes them ask again.
    pub parked: Vec<Identity>,
    /// Waiters granted a slot whose execution had ended: the slot was freed again.
    pub freed: Vec<Identity>,
    /// Waiters removed from the line without a slot: their run was fenced (it ended and was
    /// cleaned up).
    pub skipped: Vec<Identity>,
    /// The head told to come back when the start rate allows (at that time, epoch ms).
    pub deferred: Option<(Identity, u64)>,
    /// For each of `woken`, in the same order: when it waited from and was woken, and the lock
    /// after its grant (the functions' metrics).
    pub wakes: Vec<Wake>,
}

/// When a woken waiter asked and got its slot, and the lock's item after its grant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Wake {
    /// Its place in line: when it first asked (epoch ms, Step Functions' clock).
    pub queued_at_ms: u64,
    /// When the hand-off began, right after the write that freed the slot landed.
    pub freed_at_ms: u64,
    /// When its parked task took the answer.
    pub woken_at_ms: u64,
    /// The weight held, the stored limit and the waiters in line after its grant.
    pub used: u64,
    pub limit: Option<Limit>,
    pub waiting: u64,
}

impl HandOff {
    pub fn is_empty(&self) -> bool {
        self.woken.is_empty()
            && self.parked.is_empty()
            && self.freed.is_empty()
            && self.skipped.is_empty()
            && self.deferred.is_none()
    }
}

impl<S: ItemStore> Semaphore<S> {
    /// Puts `waiter` in line for a request made at `requested_at_ms` (its wait state's entry
    /// time), if no slot can be taken without passing the line; [`QueueOutcome::Free`] says one
    /// can (acquire then). One write. The caller hands off next (see [`Semaphore::hand_off`]):
    /// a slot may have been freed between its "full" and its queueing (F8).
    pub async fn enqueue(
        &self,
        waiter: &Waiter,
        requested_at_ms: u64,
    ) -> Result<QueueOutcome, Error> {
        let mut answer = QueueOutcome::Expired;
        for _ in 0..super::CONFIG_ROUNDS {
            // F14: in line on the configuration's terms, as an acquire would take them.
            let config = self.acquiring_config(&waiter.lock).await?;
            let terms = terms_on(config.as_ref(), &waiter.lock, waiter.terms)?;
            let waiter = Waiter {
                terms,
                ..waiter.clone()
            };
            let write = match protocol::enqueue(
                &waiter,
                config,
                requested_at_ms,
                self.now_ms(),
                &self.timing,
            ) {
                Ok(write) => write,
                Err(answer) => return Ok(answer),
            };
            let result = self.store.write(&write).await?;
            answer = protocol::queued(&write, &waiter.identity, result)?;
            match answer {
                QueueOutcome::Configured(actual) => self.saw_config(&waiter.lock, actual),
                _ => return Ok(answer),
            }
        }
        Ok(answer)
    }

    /// Gives a queued waiter's record the wake-up of `attempt` (its parked task's token, or a
    /// poller's renewed time), keeping its place: `false` if it is not in line (granted, or
    /// never queued) or its record holds a later attempt's already. One write.
    pub async fn repark(
        &self,
        lock: &LockName,
        id: WaiterId,
        wakeup: Wakeup,
        attempt: Attempt,
    ) -> Result<bool, Error> {
        let write = protocol::repark(lock, id, wakeup, attempt);
        let result = self.store.write(&write).await?;
        Ok(protocol::was_queued(&write, &result)?)
    }

    /// Takes a waiter out of line (it gave up, or its execution ended): `false` if it was not
    /// in line. One write.
    pub async fn leave(&self, lock: &LockName, id: WaiterId) -> Result<bool, Error> {
        let write = protocol::leave(lock, id);
        let result = self.store.write(&write).await?;
        Ok(protocol::was_queued(&write, &result)?)
    }

    /// Takes `waiter` out of line if it polls and stopped (its record's time ran out more than
    /// the clock skew ago, and no poll renewed it since it was read): `true` if it did. One
    /// write, none for a waiter that does not poll or still does.
    pub async fn leave_if_stopped(&self, waiter: &Waiter) -> Result<bool, Error> {
        if !waiter.stopped_polling(self.now_ms(), protocol::millis(self.timing.clock_skew)) {
            return Ok(false);
        }
        let write = protocol::leave_stopped(waiter);
        let result = self.store.write(&write).await?;
        let left = protocol::was_queued(&write, &result)?;
        if left {
            tracing::info!(lock = %waiter.lock, holder = %waiter.identity.holder, "took out of line a waiter that stopped polling");
        }
        Ok(left)
    }

    /// The record of waiter `id` in `lock`'s line, if it is in line. One read.
    pub async fn waiter(&self, lock: &LockName, id: WaiterId) -> Result<Option<Waiter>, Error> {
        Ok(self.store.waiter(lock, id).await?)
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
            None => match self.store.load_line(lock).await? {
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
            // F13: a poller that stopped polling is dead, and nobody would take its grant.
            if self.leave_if_stopped(&head).await? {
                report.skipped.push(head.identity.clone());
                item = self.line_view(lock).await?;
                continue;
            }
            // F14: granted on the lock's configuration, if any. A head whose weight the
            // configuration no longer admits (lowered since it queued) could never be granted:
            // it leaves the line rather than stall it, and its next check, finding neither
            // place nor slot, asks again and is refused by name.
            let terms = match terms_on(item.config.as_ref(), lock, head.terms) {
                Ok(terms) => terms,
                Err(_) => {
                    self.leave(lock, head.id()).await?;
                    report.skipped.push(head.identity.clone());
                    item = self.line_view(lock).await?;
                    continue;
                }
            };
            // A head whose weight does not fit waits; nobody passes it (L2). Unless a slot's
            // lease has passed: taken back (F13), the head may fit now.
            if !item.fits(&terms) {
                match self.take_back_expired(&item).await? {
                    Some(taken) if !taken.slots.is_empty() => {
                        item = taken.item;
                        continue;
                    }
                    _ => break,
                }
            }
            let write = protocol::grant(&head, item.config, &terms, self.now_ms());
            let result = self.store.write(&write).await?;
            // The lock as the grant left it: its token for the wake-up, its counts for the
            // next step; read again only where the store handed back neither.
            let landed = match &result {
                WriteResult::Applied { before } => write
                    .apply_with(before.as_ref(), Some(&head))
                    .ok()
                    .map(|(after, _)| after),
                WriteResult::Landed { after } => after.clone(),
                _ => None,
            };
            match protocol::granted(&write, result)? {
                Grant::Granted => {
                    let after = match landed {
                        Some(after) => after,
                        None => self.status(lock).await?,
                    };
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
                                item = self.line_view(lock).await?;
                            }
                        }
                    }
                }
                Grant::Moved { current } => item = current,
                Grant::Dead { .. } | Grant::Holding { .. } => {
                    self.leave(lock, head.id()).await?;
                    report.skipped.push(head.identity.clone());
                    item = self.line_view(lock).await?;
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

    /// The lock as a hand-off reads it ([`ItemStore::load_line`]).
    async fn line_view(&self, lock: &LockName) -> Result<SemaphoreItem, Error> {
        self.store
            .load_line(lock)
            .await?
            .ok_or_else(|| Error::UnknownLock { lock: lock.clone() })
    }

    /// A granted waiter's wake-up failed (`why`): if its execution has ended, free the slot again
    /// (a cleanup of its run) and answer `true`, the hand-off going on with the next waiter; if
    /// it may still run, it keeps the slot and finds it when its fallback check asks again.
    async fn settle_failed_wake<X: ExecutionStatus>(
        &self,
        lock: &LockName,
        head: &Waiter,
        why: &PortError,
        executions: &X,
        report: &mut HandOff,
    ) -> Result<bool, Error> {
        let holder = &head.identity.holder;
        let described = match executions.describe(holder).await {
            // F11: "not found" of a waiter that queued within the grace period may be a stale
            // read of an eventually consistent DescribeExecution: taken as may-still-run.
            Ok(ExecutionState::Missing)
                if !missing_long_enough(head.key.queued_at_ms, self.now_ms()) =>
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
            Ok(
                ExecutionState::Running
                | ExecutionState::Unjudged { .. }
                | ExecutionState::NotAnExecution,
            ) => {
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
}
