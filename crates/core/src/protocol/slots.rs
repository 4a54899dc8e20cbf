//! The slots' writes: acquire, release, the cleanup's fence and free, and the rotation of the
//! fences; and what their results mean.

use super::result::{applied, unexpected, Step, WriteResult};
use super::timing::{millis, Timing};
use crate::error::StoreError;
use crate::input::{Limit, LockConfig, LockName, Terms, Weight};
use crate::item::{Claim, FenceKey, FencingToken, Identity, Run, SemaphoreItem};
use crate::write::{Change, Check, Write};

/// Why an acquire was refused for good.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FenceReason {
    /// Cleanup or the sweeper freed this execution: it has ended.
    ExecutionEnded,
    /// This acquisition was released: only a new acquisition may take a slot.
    AcquisitionReleased,
}

impl FenceReason {
    pub fn describe(self) -> &'static str {
        match self {
            Self::ExecutionEnded => "the execution was cleaned up after it ended",
            Self::AcquisitionReleased => "this acquisition was already released",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum AcquireOutcome {
    Acquired {
        token: FencingToken,
        count: usize,
    },
    /// The same identity already holds a slot (a retried acquire whose first attempt landed):
    /// the answer carries the original token and no second slot is taken (F5).
    AlreadyHeld {
        token: FencingToken,
        count: usize,
    },
    /// The weight does not fit (`used` of `limit` held), or someone waits in line.
    Full {
        count: usize,
        used: u64,
        limit: Limit,
    },
    /// The lock's start rate is spent: the next acquisition may start at `next_start_ms` (by
    /// the clock of the writer of the last start). Nothing was taken.
    RateLimited {
        next_start_ms: u64,
    },
    Fenced(FenceReason),
    /// The request is older than the horizon (see [`Timing`]) and the fences rotated since:
    /// nothing was taken. Ask again with a new request time.
    Expired,
    /// The lock's operator configuration is not the one the request assumed (F14): nothing
    /// was taken; ask again on this one's terms (`None`: the lock is no longer configured).
    Configured(Option<LockConfig>),
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum ReleaseOutcome {
    /// `waiting`: how many wait in line now (a hand-off moves them). `token`: the slot's
    /// fencing token, `None` when the release's first attempt freed the slot but its answer was
    /// lost, so that the attempt answered found the slot gone and its own fence there
    /// ([`WriteResult::Unsure`]): the token went with the slot.
    Released {
        token: Option<FencingToken>,
        count: usize,
        waiting: u64,
    },
    /// Nothing was held by this identity. A release that showed a token writes nothing then:
    /// the slot it showed was freed by a write that fenced the acquisition (a release, cleanup,
    /// take-back or sweep). The operator's release fences it, so a late acquire cannot take it.
    NotHeld { count: usize, waiting: u64 },
    /// The identity holds a slot, under another token than the one shown (F15): not this
    /// caller's to free. Nothing was written.
    WrongToken {
        held: FencingToken,
        count: usize,
        waiting: u64,
    },
}

/// The acquire write, or the answer when none is worth sending: a request already past its
/// horizon by this host's clock would be refused anyway once a rotation happens. `config` is
/// the lock's configuration the request assumes (`None`: not configured) and `terms` the terms
/// it takes under it ([`crate::input::terms_on`]): the write lands only on that configuration.
#[allow(clippy::too_many_arguments)]
pub fn acquire(
    lock: &LockName,
    identity: &Identity,
    run: Run,
    config: Option<LockConfig>,
    terms: impl Into<Terms>,
    requested_at_ms: u64,
    now_ms: u64,
    timing: &Timing,
) -> Result<Write, AcquireOutcome> {
    let terms = terms.into();
    // A request time ahead of this host's clock is taken as now: a later one would stretch the
    // horizon beyond what the fence window was derived for.
    let requested_at_ms = requested_at_ms.min(now_ms);
    let deadline_ms = requested_at_ms.saturating_add(millis(timing.horizon));
    if now_ms >= deadline_ms {
        return Err(AcquireOutcome::Expired);
    }
    let mut checks = vec![
        // Fences first: refusing a zombie must not depend on whether it also looks "full".
        Check::NotFenced(FenceKey::execution(&identity.holder, run)),
        Check::NotReleased(identity.clone()),
        Check::NotHolding(identity.clone()),
        Check::RotatedBefore { deadline_ms },
        // F14: the terms are the operator's, if it configured the lock. Before the limit, so
        // that a refusal on both says which terms to ask again on.
        Check::Configured(config),
        Check::Fits {
            limit: terms.limit,
            weight: terms.weight,
        },
        // F9: the item stays under DynamoDB's 400 KB, so that releases and cleanups land.
        Check::Room,
        // L2: a newcomer does not pass the line.
        Check::QueueEmpty,
    ];
    checks.extend(spaced(&terms, now_ms));
    Ok(Write {
        lock: lock.clone(),
        checks,
        changes: take_slot(identity, &terms, now_ms),
    })
}

/// The start-rate check of an acquisition on `terms` landing at `now_ms`, if it has a rate.
pub(super) fn spaced(terms: &Terms, now_ms: u64) -> Option<Check> {
    terms.rate.map(|rate| Check::Spaced { rate, now_ms })
}

/// What an acquire or a grant changes: the slot, and the lock's limit and rate as the
/// acquisition asked for them. Its limit held when the write landed (`used + weight <= limit`),
/// so the stored limit is never below the weight held after it, even when this acquisition
/// lowered it.
pub(super) fn take_slot(identity: &Identity, terms: &Terms, now_ms: u64) -> Vec<Change> {
    let mut changes = vec![
        Change::PutHolder {
            identity: identity.clone(),
            acquired_at_ms: now_ms,
            weight: terms.weight,
        },
        Change::SetLimit(terms.limit),
        Change::SetRate(terms.rate),
    ];
    // F13: a leased slot's lease runs from when the slot is taken, by the taking writer's clock.
    if let Some(lease) = terms.lease {
        changes.push(Change::SetLease {
            identity: identity.clone(),
            until_ms: now_ms.saturating_add(lease.as_ms()),
        });
    }
    changes
}

/// The answer to an acquire from what became of its write.
pub fn acquired(
    write: &Write,
    identity: &Identity,
    limit: Limit,
    result: WriteResult,
) -> Result<AcquireOutcome, StoreError> {
    match result {
        WriteResult::Applied { before } => {
            let after = applied(write, before.as_ref())?;
            let holding = after.holders.get(identity).ok_or_else(|| {
                unexpected(
                    write,
                    "the acquire landed but its holder is not in the item",
                )
            })?;
            Ok(AcquireOutcome::Acquired {
                token: holding.token,
                count: after.count(),
            })
        }
        WriteResult::Landed { after: Some(after) } => {
            let holding = after.holders.get(identity).ok_or_else(|| {
                unexpected(
                    write,
                    "the acquire landed but its holding is not there after it",
                )
            })?;
            Ok(AcquireOutcome::Acquired {
                token: holding.token,
                count: after.count(),
            })
        }
        WriteResult::Landed { after: None } => Err(unexpected(
            write,
            "an acquire landed without the lock read after it",
        )),
        // An acquire whose first attempt landed unanswered is refused by its own slot
        // (`NotHolding`): already held, with the first attempt's token (F5, F10).
        refused @ (WriteResult::Refused { .. } | WriteResult::Unsure { .. }) => {
            let failed = refused.failed_check(write);
            let current = refused.refused_item().expect("matched as refused");
            Ok(match failed {
                Some(Check::NotReleased(_)) => {
                    AcquireOutcome::Fenced(FenceReason::AcquisitionReleased)
                }
                Some(Check::NotFenced(_)) => AcquireOutcome::Fenced(FenceReason::ExecutionEnded),
                Some(Check::NotHolding(_)) => AcquireOutcome::AlreadyHeld {
                    token: current.holders[identity].token,
                    count: current.count(),
                },
                Some(Check::RotatedBefore { .. }) => AcquireOutcome::Expired,
                Some(Check::Configured(_)) => AcquireOutcome::Configured(current.config),
                Some(Check::Fits { .. } | Check::Room | Check::QueueEmpty) => {
                    AcquireOutcome::Full {
                        count: current.count(),
                        used: current.used,
                        limit,
                    }
                }
                Some(Check::Spaced { rate, .. }) => AcquireOutcome::RateLimited {
                    next_start_ms: current.next_start_ms(Some(*rate)).unwrap_or_default(),
                },
                Some(
                    Check::LastRotation(_)
                    | Check::TombstoneAt { .. }
                    | Check::RotatedSince { .. }
                    | Check::Idle
                    | Check::LeaseUntil { .. }
                    | Check::Busy { .. }
                    | Check::HoldsSlot { .. }
                    | Check::NotQueued(_)
                    | Check::QueuedBefore { .. }
                    | Check::Queued(_)
                    | Check::QueuedWith { .. },
                )
                | None => {
                    return Err(unexpected(
                        write,
                        "the acquire was refused but its checks hold on the item handed back",
                    ))
                }
            })
        }
    }
}

/// Frees the identity's slot taken under `token`, of `weight` (what the caller believes it
/// holds: its acquire's answer), and fences the acquisition, so that a late attempt of the same
/// acquire cannot take a slot again (F3). Refused if the identity holds no such slot;
/// [`released`] then says what to send instead, if anything.
pub fn release(
    lock: &LockName,
    identity: &Identity,
    token: FencingToken,
    weight: Weight,
    now_ms: u64,
) -> Write {
    Write {
        lock: lock.clone(),
        checks: vec![Check::HoldsSlot {
            identity: identity.clone(),
            token,
            weight,
        }],
        changes: vec![
            Change::RemoveHolder {
                identity: identity.clone(),
                weight,
            },
            Change::FenceAcquisition {
                identity: identity.clone(),
                at_ms: now_ms,
            },
        ],
    }
}

/// The operator's release of an acquisition that holds nothing: its fence alone, on the check
/// that it still holds nothing (an acquire of it that lands first is then removed by the release
/// sent instead). An operator may release an acquisition whose acquire is still in flight.
pub fn release_unheld(lock: &LockName, identity: &Identity, now_ms: u64) -> Write {
    Write {
        lock: lock.clone(),
        checks: vec![Check::NotHolding(identity.clone())],
        changes: vec![Change::FenceAcquisition {
            identity: identity.clone(),
            at_ms: now_ms,
        }],
    }
}

/// When the write fences an acquisition (0: it fences none).
pub(super) fn released_at(write: &Write) -> u64 {
    write
        .changes
        .iter()
        .find_map(|c| match c {
            Change::FenceAcquisition { at_ms, .. } => Some(*at_ms),
            _ => None,
        })
        .unwrap_or_default()
}

/// The token the write checks the identity's slot against, if it checks one.
pub(super) fn checked_token(write: &Write, identity: &Identity) -> Option<FencingToken> {
    write.checks.iter().find_map(|check| match check {
        Check::HoldsSlot {
            identity: id,
            token,
            ..
        } if id == identity => Some(*token),
        _ => None,
    })
}

/// What a release's write did: done (the answer, and the item as the write left it), or the
/// write to send instead, from the item handed back. `claim` is what the caller showed: a
/// refusal for a slot under another token is [`ReleaseOutcome::WrongToken`], and nothing more
/// is sent (F15).
pub fn released(
    write: &Write,
    identity: &Identity,
    claim: Claim,
    result: WriteResult,
) -> Result<Step<(ReleaseOutcome, SemaphoreItem)>, StoreError> {
    let removes = write
        .changes
        .iter()
        .any(|c| matches!(c, Change::RemoveHolder { .. }));
    let before = match result {
        WriteResult::Applied { before } => before,
        // A gate's release (its check held: the slot was there, or it was not), the slot's
        // token the one it checked.
        WriteResult::Landed { after: Some(after) } => {
            let (count, waiting) = (after.count(), after.waiting);
            let outcome = if removes {
                ReleaseOutcome::Released {
                    token: checked_token(write, identity),
                    count,
                    waiting,
                }
            } else {
                ReleaseOutcome::NotHeld { count, waiting }
            };
            return Ok(Step::Done((outcome, after)));
        }
        WriteResult::Landed { after: None } => {
            return Err(unexpected(
                write,
                "a release landed without the lock read after it",
            ))
        }
        // The first attempt of this very write freed the slot and fenced the acquisition, and
        // its answer was lost (F10): the slot is gone and the fence there. Said as released, or
        // the caller would take it for a release of nothing and hand the freed slot to nobody.
        WriteResult::Unsure { current }
            if removes
                && !current.holders.contains_key(identity)
                && current.is_released(identity) =>
        {
            let outcome = ReleaseOutcome::Released {
                token: checked_token(write, identity),
                count: current.count(),
                waiting: current.waiting,
            };
            return Ok(Step::Done((outcome, current)));
        }
        WriteResult::Refused { current, .. } | WriteResult::Unsure { current } => {
            let (count, waiting) = (current.count(), current.waiting);
            // The same release time: the acquisition was released when it was first decided.
            let at_ms = released_at(write);
            return Ok(match (current.holders.get(identity), claim) {
                // Its slot, of another weight than believed: freed with the weight it holds.
                (Some(holding), _) if claim.covers(holding) => Step::Again(release(
                    &write.lock,
                    identity,
                    holding.token,
                    holding.weight,
                    at_ms,
                )),
                (Some(holding), _) => Step::Done((
                    ReleaseOutcome::WrongToken {
                        held: holding.token,
                        count,
                        waiting,
                    },
                    current,
                )),
                // A slot whose token was shown was taken by this acquisition, so whatever freed
                // it fenced the acquisition: nothing to write (and nothing a wrong caller could
                // fence).
                (None, Claim::Slot { .. }) => {
                    Step::Done((ReleaseOutcome::NotHeld { count, waiting }, current))
                }
                (None, Claim::Operator) => {
                    Step::Again(release_unheld(&write.lock, identity, at_ms))
                }
            });
        }
    };
    let after = applied(write, before.as_ref())?;
    let (count, waiting) = (after.count(), after.waiting);
    let outcome = match before.as_ref().and_then(|item| item.holders.get(identity)) {
        Some(holding) => ReleaseOutcome::Released {
            token: Some(holding.token),
            count,
            waiting,
        },
        None => ReleaseOutcome::NotHeld { count, waiting },
    };
    Ok(Step::Done((outcome, after)))
}
