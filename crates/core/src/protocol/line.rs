//! The line's writes: queue, grant, re-park and leave; and what their results mean.

use super::result::{unexpected, WriteResult};
use super::slots::{spaced, take_slot, FenceReason};
use super::timing::{millis, Timing};
use crate::error::StoreError;
use crate::input::{LockConfig, LockName, Terms};
use crate::item::{FenceKey, FencingToken, Identity, SemaphoreItem};
use crate::queue::{Attempt, Waiter, WaiterId, Wakeup};
use crate::write::{Change, Check, Write};

/// What a waiter's attempt to queue found.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum QueueOutcome {
    /// In line.
    Queued,
    /// Its record was already there (a retried attempt whose first one landed).
    AlreadyQueued,
    /// A slot is free and nobody waits: take it with a plain acquire instead.
    Free,
    /// The waiter's identity already holds a slot (granted, or its earlier acquire landed).
    AlreadyHeld {
        token: FencingToken,
        count: usize,
    },
    Fenced(FenceReason),
    /// The request is older than the horizon and the fences rotated since: ask again.
    Expired,
    /// The lock's configuration is not the one the waiter assumed: ask again on its terms.
    Configured(Option<LockConfig>),
}

/// The write that puts a waiter in line, or the answer when none is worth sending (see
/// [`acquire`](super::acquire): the same horizon). Its checks are the acquire's, but for the limit: a waiter
/// queues only while a slot cannot be taken without passing the line, so no waiter queues
/// behind a free slot that nobody would hand it (F8).
pub fn enqueue(
    waiter: &Waiter,
    config: Option<LockConfig>,
    requested_at_ms: u64,
    now_ms: u64,
    timing: &Timing,
) -> Result<Write, QueueOutcome> {
    let requested_at_ms = requested_at_ms.min(now_ms);
    let deadline_ms = requested_at_ms.saturating_add(millis(timing.horizon));
    if now_ms >= deadline_ms {
        return Err(QueueOutcome::Expired);
    }
    let identity = &waiter.identity;
    Ok(Write {
        lock: waiter.lock.clone(),
        checks: vec![
            // A dead execution's late attempt to queue is refused like its late acquire (F1-F3).
            Check::NotFenced(FenceKey::execution(&identity.holder, waiter.run)),
            Check::NotReleased(identity.clone()),
            Check::NotHolding(identity.clone()),
            Check::RotatedBefore { deadline_ms },
            // F14, as for an acquire: the waiter's terms are the configuration's.
            Check::Configured(config),
            Check::NotQueued(waiter.id()),
            Check::Busy {
                terms: waiter.terms,
                now_ms,
            },
        ],
        changes: vec![Change::Enqueue(Box::new(waiter.clone()))],
    })
}

/// The answer to a waiter's attempt to queue from what became of its write.
pub fn queued(
    write: &Write,
    identity: &Identity,
    result: WriteResult,
) -> Result<QueueOutcome, StoreError> {
    let failed = result.failed_check(write);
    Ok(match (&result, failed) {
        (WriteResult::Applied { .. } | WriteResult::Landed { .. }, _) => QueueOutcome::Queued,
        (WriteResult::Refused { current, .. } | WriteResult::Unsure { current }, Some(check)) => {
            match check {
                Check::NotReleased(_) => QueueOutcome::Fenced(FenceReason::AcquisitionReleased),
                Check::NotFenced(_) => QueueOutcome::Fenced(FenceReason::ExecutionEnded),
                Check::NotHolding(_) => QueueOutcome::AlreadyHeld {
                    token: current.holders[identity].token,
                    count: current.count(),
                },
                Check::RotatedBefore { .. } => QueueOutcome::Expired,
                Check::Configured(_) => QueueOutcome::Configured(current.config),
                Check::NotQueued(_) => QueueOutcome::AlreadyQueued,
                Check::Busy { .. } => QueueOutcome::Free,
                _ => return Err(unexpected(write, "refused by a check a queue write lacks")),
            }
        }
        (WriteResult::Refused { .. } | WriteResult::Unsure { .. }, None) => {
            return Err(unexpected(
                write,
                "the queue write was refused but its checks hold on what was handed back",
            ))
        }
    })
}

/// Grants the waiter (as read at the head of the line) a slot on `terms` (its own, or the
/// lock's configuration `config` as read with its weight: [`crate::input::terms_on`]): takes
/// the slot for it and removes its record, in one write. Not sent on a stale read: the record
/// must still carry the task token that was read (else the waiter parked anew; read the head
/// again), and the lock its configuration (else read it again).
pub fn grant(waiter: &Waiter, config: Option<LockConfig>, terms: &Terms, now_ms: u64) -> Write {
    let identity = &waiter.identity;
    let mut checks = vec![
        Check::QueuedWith {
            id: waiter.id(),
            wakeup: waiter.wakeup.clone(),
        },
        Check::Configured(config),
        // A waiter whose run was cleaned up is dead: skipped, never granted (F8).
        Check::NotFenced(FenceKey::execution(&identity.holder, waiter.run)),
        Check::NotReleased(identity.clone()),
        Check::NotHolding(identity.clone()),
        // A head whose weight does not fit waits, and nobody passes it (L2).
        Check::Fits {
            limit: terms.limit,
            weight: terms.weight,
        },
        // Nor does one for whom the item has no room (F9: see `acquire`).
        Check::Room,
    ];
    checks.extend(spaced(terms, now_ms));
    let mut changes = vec![Change::Dequeue(waiter.id())];
    changes.extend(take_slot(identity, terms, now_ms));
    Write {
        lock: waiter.lock.clone(),
        checks,
        changes,
    }
}

/// What became of a grant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Grant {
    /// The waiter holds a slot now and is out of the line: wake it.
    Granted,
    /// Its record changed or went since it was read (it parked anew, left, or another hand-off
    /// granted it): read the head again.
    Moved { current: SemaphoreItem },
    /// Its run or acquisition is fenced (it ended and was cleaned up, or released): remove its
    /// record without a slot.
    Dead { current: SemaphoreItem },
    /// It holds a slot already: remove its record.
    Holding { current: SemaphoreItem },
    /// Its weight does not fit, or the item has no room for another holder.
    NoSlot { current: SemaphoreItem },
    /// The start rate is spent until `next_start_ms`: tell the waiter to come back then.
    TooSoon {
        current: SemaphoreItem,
        next_start_ms: u64,
    },
}

pub fn granted(write: &Write, result: WriteResult) -> Result<Grant, StoreError> {
    let failed = result.failed_check(write).cloned();
    Ok(match result {
        WriteResult::Applied { .. } | WriteResult::Landed { .. } => Grant::Granted,
        WriteResult::Refused { current, .. } | WriteResult::Unsure { current } => match failed {
            Some(Check::QueuedWith { .. } | Check::Configured(_)) => Grant::Moved { current },
            Some(Check::NotFenced(_) | Check::NotReleased(_)) => Grant::Dead { current },
            Some(Check::NotHolding(_)) => Grant::Holding { current },
            Some(Check::Fits { .. } | Check::Room) => Grant::NoSlot { current },
            Some(Check::Spaced { rate, .. }) => Grant::TooSoon {
                next_start_ms: current.next_start_ms(Some(rate)).unwrap_or_default(),
                current,
            },
            _ => {
                return Err(unexpected(
                    write,
                    "the grant was refused but its checks hold on what was handed back",
                ))
            }
        },
    })
}

/// Takes the waiter's record out of the line, if it is there (it left, or its execution
/// ended).
pub fn leave(lock: &LockName, id: WaiterId) -> Write {
    Write {
        lock: lock.clone(),
        checks: vec![Check::Queued(id)],
        changes: vec![Change::Dequeue(id)],
    }
}

/// Takes out of line a waiter that stopped polling (F13), on the check that its record still
/// holds the wake-up judged expired: a poll that renewed it first keeps its place.
pub fn leave_stopped(waiter: &Waiter) -> Write {
    Write {
        lock: waiter.lock.clone(),
        checks: vec![Check::QueuedWith {
            id: waiter.id(),
            wakeup: waiter.wakeup.clone(),
        }],
        changes: vec![Change::Dequeue(waiter.id())],
    }
}

/// Gives the waiter's record the wake-up of `attempt` (its parked task's token, or a poller's
/// renewed time), keeping its place, if it is in line with the wake-up of an earlier attempt.
pub fn repark(lock: &LockName, id: WaiterId, wakeup: Wakeup, attempt: Attempt) -> Write {
    Write {
        lock: lock.clone(),
        checks: vec![Check::QueuedBefore { id, attempt }],
        changes: vec![Change::Repark {
            id,
            wakeup,
            attempt,
        }],
    }
}

/// Whether a [`leave`] found the waiter in line, or a [`repark`] found it in line with the token
/// of an earlier attempt.
pub fn was_queued(write: &Write, result: &WriteResult) -> Result<bool, StoreError> {
    match result {
        WriteResult::Applied { .. } | WriteResult::Landed { .. } => Ok(true),
        refused => match refused.failed_check(write) {
            Some(Check::Queued(_) | Check::QueuedBefore { .. } | Check::QueuedWith { .. }) => {
                Ok(false)
            }
            _ => Err(unexpected(write, "refused by a check it does not have")),
        },
    }
}
