//! The cleanup's writes: the fence of an ended execution's runs, then the free of the slots it
//! saw; and what their results mean.

use super::result::{applied, applied_before, unexpected, Step, WriteResult};
use super::slots::checked_token;
use crate::error::StoreError;
use crate::input::{HolderId, LockName};
use crate::item::{FenceKey, Holding, Identity, Run, SemaphoreItem};
use crate::write::{Change, Check, Write};

/// What a cleanup's fence found (`Semaphore::fence`): the slots the fenced execution held on `lock` when its
/// fence landed (all it will ever hold there), and the slots held and the waiters in line then.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Fenced {
    pub lock: LockName,
    /// As the fence found them (their weights, tokens and times): what a cleanup whose freeing
    /// write's answer was lost reports as freed (see [`freed_seen`]).
    pub slots: Vec<(Identity, Holding)>,
    pub count: usize,
    pub waiting: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CleanupOutcome {
    /// The slots that were freed, with when they were taken.
    pub freed: Vec<(Identity, Holding)>,
    pub count: usize,
    /// How many wait in line now (a hand-off moves them).
    pub waiting: u64,
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
