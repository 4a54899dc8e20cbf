//! The protocol: which [`Write`] each operation sends, and what its result means.
//!
//! None of them reads first. Each is one write whose checks DynamoDB evaluates when it lands, so
//! concurrent writers never invalidate each other's decisions, and every write increments the
//! version, so fencing tokens strictly increase per lock. The table of each operation's checks
//! and changes is in docs/design.md ("The writes").
//!
//! Why each rule holds (the faults are described in docs/design.md):
//! - **F1-F3, S3.** A release or cleanup fences before (or as) it frees. An acquire checks the
//!   fences when it lands, however late that is, so one that lands after the fence is refused.
//!   Fences are dropped only by a rotation, and an acquire is refused once a rotation happened
//!   after its request's horizon; a fence it could have met is older than its request, and is
//!   dropped only by a rotation at least a window after the fence, which is past the horizon
//!   (see [`Timing`]). So no acquire ever lands after a fence it should have met was dropped.
//! - **Cleanup in two writes.** Once the first write has landed the execution is fenced, so no
//!   acquire of it can land any more: the slots the first write saw (its item before the write)
//!   are all it will ever hold, and the second write removes them. A slot freed in between by a
//!   release is simply gone already (removing it again is a no-op).
//! - **F5.** A retried acquire whose first attempt landed fails "not holding": the item it is
//!   handed back shows the slot, and the answer is "already held" with the original token.
//! - **F4, S4.** A write that removes a slot checks that the slot is there with the weight it
//!   subtracts from `used`, so duplicated, late and reordered releases and cleanups each remove
//!   only what their identity holds, subtract its weight once, and add a fence that is already
//!   there. A release refused because the slot is gone (or of another weight) is sent again as
//!   the item handed back says: a fence alone, on the check that nothing is held, or the removal
//!   with the weight held; an acquire of the same acquisition can land between the two only
//!   once, so this ends within a few rounds (see [`Step`]).

use std::time::Duration;

use crate::error::StoreError;
use crate::input::{HolderId, Lease, Limit, LockConfig, LockName, Terms, Weight};
use crate::item::{Claim, FenceKey, FencingToken, Holding, Identity, Layout, Run, SemaphoreItem};
use crate::queue::{Attempt, Waiter, WaiterId, Wakeup};
use crate::write::{Change, Check, Write};

/// The two durations the fences are kept by.
///
/// - `horizon`: how long after it was requested an acquire may still land. An acquire's request
///   time is when its caller decided to ask (the Step Functions state's entry time), which comes
///   before any fence the acquire must meet, however long Lambda took to start it or the network
///   to deliver it. A write that lands later than `horizon` after its request is refused if a
///   rotation happened in between, and answered `Expired`: the caller asks again.
/// - `clock_skew`: how far apart two hosts' clocks may be (Step Functions, Lambda, an
///   operator's machine).
///
/// The fence window, the least time between two rotations, is `horizon + clock_skew`. Why that is
/// enough: a fence F written at time w (real time) and an acquire A requested at e < w. F is
/// dropped by the second rotation after w; the first stored its time r1 > w - skew/2 (by its
/// clock), and the second may run only once its clock reads r1 + window, so it stores
/// r2 > w - skew/2 + window. A's condition needs the last rotation before e + horizon, and
/// e + horizon < w + skew/2 + horizon (A's clock). With window = horizon + skew, r2 is past it:
/// A is refused by the rotation whenever F is gone, and by F while it is there. Nothing here
/// depends on how long a request can be delayed in the network, or on how long Lambda takes to
/// start a function: only on the clocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timing {
    pub horizon: Duration,
    pub clock_skew: Duration,
}

impl Timing {
    /// How long after its request an acquire may land by default: plenty for a Lambda's cold
    /// start and a few Step Functions retries of its Task.
    pub const DEFAULT_HORIZON: Duration = Duration::from_secs(8);
    /// The clock skew allowed for by default. Lambda and Step Functions hosts keep time with the
    /// Amazon Time Sync Service, to well under a millisecond; two seconds is a wide margin.
    pub const DEFAULT_CLOCK_SKEW: Duration = Duration::from_secs(2);

    /// Horizons accepted from configuration, in whole seconds: long enough for a cold start,
    /// short enough that fences stay few (the item carries those of one or two windows).
    pub const HORIZON_RANGE: std::ops::RangeInclusive<u64> = 1..=300;
    /// Clock skews allowed for, in whole seconds. Zero is left to tests and the model checker:
    /// no two hosts agree exactly.
    pub const CLOCK_SKEW_RANGE: std::ops::RangeInclusive<u64> = 1..=60;

    /// The least time between two rotations of the fences: every fence is kept at least this
    /// long, and at most about twice as long.
    pub fn window(&self) -> Duration {
        self.horizon + self.clock_skew
    }
}

impl Default for Timing {
    fn default() -> Self {
        Self {
            horizon: Self::DEFAULT_HORIZON,
            clock_skew: Self::DEFAULT_CLOCK_SKEW,
        }
    }
}

pub(crate) fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

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

#[derive(Debug, Clone, PartialEq, Eq)]
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

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CleanupOutcome {
    /// The slots that were freed, with when they were taken.
    pub freed: Vec<(Identity, Holding)>,
    pub count: usize,
    /// How many wait in line now (a hand-off moves them).
    pub waiting: u64,
}

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

/// What an operation of several rounds does next: it is done, or sends this write (its last one
/// was refused on a check whose answer the item handed back tells).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step<T> {
    Done(T),
    Again(Write),
}

/// What became of a write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WriteResult {
    /// Every check held and the changes were made. `before` is the item as it was just before
    /// (`None`: the write created it).
    Applied { before: Option<SemaphoreItem> },
    /// Every check held and the changes were made, to more than one item at once (the lock's
    /// and a waiter's record, or a gate and its holdings), which DynamoDB sends as a
    /// transaction, handing nothing back: the item as it was before is not known. `after`: the
    /// lock as read once the write had landed (a gate with the holdings the write named), when
    /// the store read it; a later write may show in it too.
    Landed { after: Option<SemaphoreItem> },
    /// A check failed and nothing changed; `current` is the item as it is, and `waiter_refused`
    /// says whether the write's check of a waiter's record failed.
    Refused {
        current: SemaphoreItem,
        waiter_refused: bool,
    },
    /// The write was sent more than once because an earlier attempt's answer was lost (F10:
    /// the store's client sent it again after a timeout or a server error), and the attempt
    /// answered was refused: `current` is the item as it is, which may carry this very write's
    /// changes, made by the attempt whose answer was lost. Each operation reads from `current`
    /// whether its own write landed (see [`released`] and [`freed_seen`]); one that cannot tell
    /// takes it as [`WriteResult::Refused`].
    Unsure { current: SemaphoreItem },
}

impl WriteResult {
    /// The first of the write's checks that failed (in the order the write lists them), from
    /// what a refusal handed back.
    pub fn failed_check<'w>(&self, write: &'w Write) -> Option<&'w Check> {
        let (current, waiter_refused) = match self {
            Self::Refused {
                current,
                waiter_refused,
            } => (current, *waiter_refused),
            Self::Unsure { current } => (current, false),
            Self::Applied { .. } | Self::Landed { .. } => return None,
        };
        write.checks.iter().find(|check| match check.waiter_id() {
            Some(_) => waiter_refused,
            None => !check.holds(current),
        })
    }

    /// The item a refusal handed back (`None`: the write landed).
    pub fn refused_item(&self) -> Option<&SemaphoreItem> {
        match self {
            Self::Refused { current, .. } | Self::Unsure { current } => Some(current),
            Self::Applied { .. } | Self::Landed { .. } => None,
        }
    }
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
fn spaced(terms: &Terms, now_ms: u64) -> Option<Check> {
    terms.rate.map(|rate| Check::Spaced { rate, now_ms })
}

/// What an acquire or a grant changes: the slot, and the lock's limit and rate as the
/// acquisition asked for them. Its limit held when the write landed (`used + weight <= limit`),
/// so the stored limit is never below the weight held after it, even when this acquisition
/// lowered it.
fn take_slot(identity: &Identity, terms: &Terms, now_ms: u64) -> Vec<Change> {
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
fn released_at(write: &Write) -> u64 {
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
fn checked_token(write: &Write, identity: &Identity) -> Option<FencingToken> {
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

/// The first write of a cleanup: fence the execution's run that ended (`last_run`) and every
/// run before it (a cleanup of an earlier run may have found the execution redriven and fenced
/// nothing). Always written, even when it holds nothing, so that an acquire of it still in
/// flight is refused when it lands (F1). A run after `last_run` is not fenced: the execution
/// may have been redriven since, and its new run acquires (F7).
pub fn cleanup_fence(lock: &LockName, holder: &HolderId, last_run: Run) -> Write {
    Write {
        lock: lock.clone(),
        checks: Vec::new(),
        changes: last_run
            .and_earlier()
            .map(|run| Change::AddFence(FenceKey::execution(holder, run)))
            .collect(),
    }
}

/// The slots the fenced execution held when its fence landed (with their weights): all it can
/// ever hold from then on.
pub fn fenced_slots(
    write: &Write,
    holder: &HolderId,
    result: WriteResult,
) -> Result<(Vec<(Identity, Holding)>, SemaphoreItem), StoreError> {
    let before = applied_before(write, result)?;
    let after = applied(write, before.as_ref())?;
    let slots = after
        .slots_of(holder)
        .map(|(id, holding)| (id.clone(), *holding))
        .collect();
    Ok((slots, after))
}

/// Most slots one write of a cleanup removes. Each slot puts a `BETWEEN` check (about 40 bytes,
/// 3 operators) in the write's condition and a `REMOVE` in its update: DynamoDB refuses an
/// expression over 4 KB or 300 operators (`dynamo::MAX_EXPRESSION_BYTES`), which one write
/// naming every slot passed at about 100 slots, and then failed for ever after the fence had
/// landed (F9). 50 slots render to about 2.1 KB and 150 operators, whatever the identities'
/// lengths (their names go in placeholders).
///
/// Freeing the slots in several writes is as safe as in one: once the first write (the fence)
/// has landed, no acquire of the fenced runs can land, so the slots it saw are all the execution
/// will ever hold there, and they can only go (a release, or a chunk of this cleanup), never
/// come back. Each chunk removes its slots on the check that each is still held with the weight
/// it subtracts, as the single write did, so `used` stays the sum of the weights held after every
/// chunk; what another writer sees between two chunks (some slots freed, others not yet) is what
/// it would see had the execution released them one by one. A cleanup that fails between two
/// chunks leaves the rest held by a fenced execution, which the next cleanup or the sweeper
/// frees (S2), as after a failed single write.
pub const MAX_SLOTS_PER_FREE: usize = 50;

/// Most slots one take-back removes (see [`take_back`]): it checks each slot's lease besides its
/// weight, so it names each slot twice as often as a cleanup's free does; half as many keep its
/// expressions as far within DynamoDB's 4 KB.
pub const MAX_SLOTS_PER_TAKE_BACK: usize = 25;

/// A write of a cleanup's second step, when the first saw slots: remove them (at most
/// [`MAX_SLOTS_PER_FREE`]: the caller splits more), each on the check that it is still held with
/// its weight (a release may have freed it since).
pub fn cleanup_free(lock: &LockName, slots: &[(Identity, Holding)]) -> Write {
    let (checks, changes) = slots
        .iter()
        .map(|(identity, holding)| {
            let (identity, weight) = (identity.clone(), holding.weight);
            (
                Check::HoldsSlot {
                    identity: identity.clone(),
                    token: holding.token,
                    weight,
                },
                Change::RemoveHolder { identity, weight },
            )
        })
        .unzip();
    Write {
        lock: lock.clone(),
        checks,
        changes,
    }
}

/// What a cleanup's second write did: done (what it freed, and the item as it left it), or the
/// write to send instead when some of the slots were freed meanwhile (the rest, as the item
/// handed back shows them; none left: done, having freed nothing).
pub fn freed(
    write: &Write,
    result: WriteResult,
) -> Result<Step<(CleanupOutcome, SemaphoreItem)>, StoreError> {
    freed_seen(write, result, &[])
}

/// [`freed`] by a cleanup that saw the slots it frees (`seen`: as its fence found them). When
/// its write's first attempt freed them but the answer was lost (F10), the attempt answered is
/// refused and finds every one of them gone: reported as freed, with the holdings seen, instead
/// of as freed by someone else. A slot missing from `seen` is not claimed.
pub fn freed_seen(
    write: &Write,
    result: WriteResult,
    seen: &[(Identity, Holding)],
) -> Result<Step<(CleanupOutcome, SemaphoreItem)>, StoreError> {
    let slots: Vec<&Identity> = write
        .changes
        .iter()
        .filter_map(|change| match change {
            Change::RemoveHolder { identity, .. } => Some(identity),
            _ => None,
        })
        .collect();
    let before = match result {
        WriteResult::Applied { before } => before,
        // A gate's free: every slot it names was held with its weight (its checks), as seen.
        WriteResult::Landed { after: Some(after) } => {
            let freed = as_seen(&slots, seen);
            let outcome = CleanupOutcome {
                freed,
                count: after.count(),
                waiting: after.waiting,
            };
            return Ok(Step::Done((outcome, after)));
        }
        WriteResult::Landed { after: None } => {
            return Err(unexpected(
                write,
                "a cleanup landed without the lock read after it",
            ))
        }
        WriteResult::Unsure { current }
            if slots.iter().all(|id| {
                !current.holders.contains_key(*id) && seen.iter().any(|(s, _)| s == *id)
            }) =>
        {
            let freed = as_seen(&slots, seen);
            let outcome = CleanupOutcome {
                freed,
                count: current.count(),
                waiting: current.waiting,
            };
            return Ok(Step::Done((outcome, current)));
        }
        WriteResult::Refused { current, .. } | WriteResult::Unsure { current } => {
            // Those of its slots still held under the token it checked (a fenced execution's slots
            // only go, so a slot there is the one it saw).
            let still: Vec<_> = slots
                .iter()
                .filter_map(|id| {
                    let held = current.holders.get(*id)?;
                    (checked_token(write, id) == Some(held.token)).then(|| ((*id).clone(), *held))
                })
                .collect();
            if still.is_empty() {
                let outcome = CleanupOutcome {
                    freed: Vec::new(),
                    count: current.count(),
                    waiting: current.waiting,
                };
                return Ok(Step::Done((outcome, current)));
            }
            return Ok(Step::Again(cleanup_free(&write.lock, &still)));
        }
    };
    let after = applied(write, before.as_ref())?;
    let freed = before
        .iter()
        .flat_map(|item| {
            slots
                .iter()
                .filter_map(|id| item.holders.get(*id).map(|h| ((*id).clone(), *h)))
        })
        .collect();
    let count = after.count();
    Ok(Step::Done((
        CleanupOutcome {
            freed,
            count,
            waiting: after.waiting,
        },
        after,
    )))
}

/// The slots `slots` as a cleanup's fence saw them (`seen`); one it did not see is not claimed.
fn as_seen(slots: &[&Identity], seen: &[(Identity, Holding)]) -> Vec<(Identity, Holding)> {
    slots
        .iter()
        .filter_map(|id| seen.iter().find(|(s, _)| s == *id).cloned())
        .collect()
}

/// Young fences that make a rotation worth a write to the writer that has just added one.
///
/// Rotating less often never drops a fence early (a rotation is only ever allowed a window after
/// the last one), so this is a matter of cost alone: a lock used less than once per window would
/// otherwise pay a rotation on every release (3 writes per critical section instead of 2), and
/// waiting for 8 young fences caps that at one rotation per 8 releases while a quiet lock's item
/// carries at most about 16 fences (128 bytes). The sweeper rotates whatever is due, so the fences
/// of a lock that went quiet are still dropped.
pub const BUSY_YOUNG_FENCES: usize = 8;

/// A rotation of the fences, if one is due on `item` (as just written or read) at `now_ms`: there
/// are fences, and a window has passed since the last rotation.
pub fn rotation(item: &SemaphoreItem, now_ms: u64, timing: &Timing) -> Option<Write> {
    let fences = &item.fences;
    // A gate lock's tombstones wait for a rotation too (see `drop_tombstones`).
    if fences.is_empty() && item.tombstones.is_empty() {
        return None;
    }
    let due = fences
        .rotated_at_ms
        .is_none_or(|last| now_ms >= last.saturating_add(millis(timing.window())));
    due.then(|| Write {
        lock: item.lock.clone(),
        checks: vec![Check::LastRotation(fences.rotated_at_ms)],
        changes: vec![Change::Rotate {
            young_seen: fences.young.clone(),
            at_ms: now_ms,
        }],
    })
}

/// The writes that drop a gate lock's tombstones passed on `item` (as read): each released at
/// least a fence window before the last rotation ([`SemaphoreItem::passed_tombstones`]). Each
/// names the tombstone as read, and the rotation it was judged by: rotations never move back, so
/// the drop stays sound however late it lands, and one that lands on a tombstone written again
/// since (another release of the same acquisition keeps the first time, so none) is refused.
pub fn drop_tombstones(item: &SemaphoreItem, timing: &Timing) -> Vec<Write> {
    let window_ms = millis(timing.window());
    item.passed_tombstones(window_ms)
        .into_iter()
        .map(|(identity, at_ms)| Write {
            lock: item.lock.clone(),
            checks: vec![
                Check::TombstoneAt {
                    identity: identity.clone(),
                    at_ms,
                },
                Check::RotatedSince {
                    at_ms: at_ms.saturating_add(window_ms),
                },
            ],
            changes: vec![Change::DropTombstone(identity)],
        })
        .collect()
}

/// Moves `lock` to `layout`, only while it is idle: nothing held, nobody waiting, no fence and
/// no tombstone left where the new layout would not look (creating the lock if it has no item).
pub fn set_layout(lock: &LockName, layout: Layout) -> Write {
    Write {
        lock: lock.clone(),
        checks: vec![Check::Idle],
        changes: vec![Change::SetLayout(layout)],
    }
}

/// A rotation if one is due and the young generation holds at least `busy` fences (by default
/// [`BUSY_YOUNG_FENCES`]): what a release or cleanup sends after its own write.
pub fn busy_rotation(
    item: &SemaphoreItem,
    now_ms: u64,
    timing: &Timing,
    busy: usize,
) -> Option<Write> {
    if item.fences.young.len() < busy {
        return None;
    }
    rotation(item, now_ms, timing)
}

/// The write that puts a waiter in line, or the answer when none is worth sending (see
/// [`acquire`]: the same horizon). Its checks are the acquire's, but for the limit: a waiter
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

/// What a heartbeat found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HeartbeatOutcome {
    /// The slot is still held: its lease ends at `until_ms` now.
    Renewed { until_ms: u64 },
    /// The slot is not held any more (taken back once its lease passed, released, or cleaned
    /// up), and the acquisition is fenced: its holder must stop using it (F13).
    Lost,
    /// The identity holds a slot under another token than the one shown (F15): not this
    /// caller's to renew. Nothing was written.
    WrongToken { held: FencingToken },
}

/// Renews the identity's lease to end `lease` after `now_ms`, if it still holds the slot taken
/// under `token` (of `weight`) and its acquisition is not fenced: a heartbeat never brings back a
/// slot taken back (F13), nor renews another's (F15).
pub fn heartbeat(
    lock: &LockName,
    identity: &Identity,
    token: FencingToken,
    weight: Weight,
    lease: Lease,
    now_ms: u64,
) -> Write {
    Write {
        lock: lock.clone(),
        checks: vec![
            Check::NotReleased(identity.clone()),
            Check::HoldsSlot {
                identity: identity.clone(),
                token,
                weight,
            },
        ],
        changes: vec![Change::SetLease {
            identity: identity.clone(),
            until_ms: now_ms.saturating_add(lease.as_ms()),
        }],
    }
}

/// What a heartbeat's write did: the answer, or the heartbeat to send instead when the slot the
/// claim covers is held with another weight than believed.
pub fn heartbeat_answered(
    write: &Write,
    identity: &Identity,
    claim: Claim,
    result: &WriteResult,
) -> Step<HeartbeatOutcome> {
    let until_ms = write
        .changes
        .iter()
        .find_map(|c| match c {
            Change::SetLease { until_ms, .. } => Some(*until_ms),
            _ => None,
        })
        .unwrap_or_default();
    let current = match result {
        WriteResult::Applied { .. } | WriteResult::Landed { .. } => {
            return Step::Done(HeartbeatOutcome::Renewed { until_ms })
        }
        // Sent again after a lost answer and refused: an attempt whose answer was lost may have
        // renewed it, which the slot's lease as handed back shows.
        WriteResult::Unsure { current }
            if current.leases.get(identity) == Some(&until_ms)
                && current
                    .holders
                    .get(identity)
                    .is_some_and(|h| claim.covers(h)) =>
        {
            return Step::Done(HeartbeatOutcome::Renewed { until_ms })
        }
        WriteResult::Refused { current, .. } | WriteResult::Unsure { current } => current,
    };
    match current.holders.get(identity) {
        _ if current.is_released(identity) => Step::Done(HeartbeatOutcome::Lost),
        None => Step::Done(HeartbeatOutcome::Lost),
        Some(holding) if !claim.covers(holding) => Step::Done(HeartbeatOutcome::WrongToken {
            held: holding.token,
        }),
        Some(holding) => {
            let mut again = write.clone();
            for check in &mut again.checks {
                if let Check::HoldsSlot { token, weight, .. } = check {
                    (*token, *weight) = (holding.token, holding.weight);
                }
            }
            Step::Again(again)
        }
    }
}

/// Takes back the slots of `expired` (each with its weight and the end of its lease as read,
/// already past it by more than the clock skew by the taking writer's clock), at most
/// [`MAX_SLOTS_PER_TAKE_BACK`] of them: removes each and fences its acquisition, so that its holder's
/// release, heartbeat and any late acquire of it are refused (F13). Each is checked to still
/// hold its slot of that weight under the very lease read: one a heartbeat renewed meanwhile is
/// not taken. Refused as a whole if any was renewed or freed; [`take_back_again`] says what to
/// send instead.
pub fn take_back(lock: &LockName, expired: &[(Identity, Holding, u64)], now_ms: u64) -> Write {
    let expired = &expired[..expired.len().min(MAX_SLOTS_PER_TAKE_BACK)];
    let mut checks = Vec::with_capacity(expired.len() * 2);
    let mut changes = Vec::with_capacity(expired.len() * 2);
    for (identity, holding, until_ms) in expired {
        checks.push(Check::LeaseUntil {
            identity: identity.clone(),
            until_ms: *until_ms,
        });
        checks.push(Check::HoldsSlot {
            identity: identity.clone(),
            token: holding.token,
            weight: holding.weight,
        });
        changes.push(Change::RemoveHolder {
            identity: identity.clone(),
            weight: holding.weight,
        });
        changes.push(Change::FenceAcquisition {
            identity: identity.clone(),
            at_ms: now_ms,
        });
    }
    Write {
        lock: lock.clone(),
        checks,
        changes,
    }
}

/// After a take-back was refused: the take-back of those of its slots still expired on the item
/// handed back (by `now_ms`, with `skew_ms`), or `None` when none is.
pub fn take_back_again(
    write: &Write,
    current: &SemaphoreItem,
    now_ms: u64,
    skew_ms: u64,
) -> Option<Write> {
    let expired: Vec<(Identity, Holding, u64)> = current
        .expired_leases(now_ms, skew_ms)
        .into_iter()
        .filter(|(identity, ..)| {
            write.changes.iter().any(
                |c| matches!(c, Change::RemoveHolder { identity: taken, .. } if taken == identity),
            )
        })
        .collect();
    (!expired.is_empty()).then(|| take_back(&write.lock, &expired, now_ms))
}

/// Sets (`None`: removes) the lock's operator configuration (F14). It needs no check: it takes
/// nothing from a holder (a lower limit only stops admissions until the weight held is under
/// it), and every acquisition or grant in flight that assumed the configuration it replaces is
/// refused when it lands and asks again on this one.
pub fn configure(lock: &LockName, config: Option<LockConfig>) -> Write {
    Write {
        lock: lock.clone(),
        checks: Vec::new(),
        changes: vec![Change::Configure(config)],
    }
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

/// The item before a write that has no checks (it cannot be refused).
fn applied_before(write: &Write, result: WriteResult) -> Result<Option<SemaphoreItem>, StoreError> {
    match result {
        WriteResult::Applied { before } => Ok(before),
        WriteResult::Landed { .. } => {
            Err(unexpected(write, "an item write was sent as a transaction"))
        }
        WriteResult::Refused { .. } | WriteResult::Unsure { .. } => {
            Err(unexpected(write, "a write without checks was refused"))
        }
    }
}

fn applied(write: &Write, before: Option<&SemaphoreItem>) -> Result<SemaphoreItem, StoreError> {
    write.apply(before).map_err(|check| {
        unexpected(
            write,
            &format!("the write landed, but {check:?} fails on the item it replaced"),
        )
    })
}

pub(crate) fn unexpected(write: &Write, problem: &str) -> StoreError {
    StoreError::Unexpected {
        lock: write.lock.to_string(),
        problem: problem.to_owned(),
    }
}
