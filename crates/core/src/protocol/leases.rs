//! The leases' writes (F13): the heartbeat that renews one, and the take-back of slots whose
//! lease passed; and what their results mean.

use super::result::{Step, WriteResult};
use crate::input::{Lease, LockName, Weight};
use crate::item::{Claim, FencingToken, Holding, Identity, SemaphoreItem};
use crate::write::{Change, Check, Write};

/// Most slots one take-back removes (see [`take_back`]): it checks each slot's lease besides its
/// weight, so it names each slot twice as often as a cleanup's free does; half as many keep its
/// expressions as far within DynamoDB's 4 KB.
pub const MAX_SLOTS_PER_TAKE_BACK: usize = 25;

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
