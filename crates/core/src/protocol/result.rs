//! What became of a write ([`WriteResult`]), and what an operation of several writes does next
//! ([`Step`]).

use crate::error::StoreError;
use crate::item::SemaphoreItem;
use crate::write::{Check, Write};

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
    /// whether its own write landed (see [`released`](super::released) and [`freed_seen`](super::freed_seen)); one that cannot tell
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

/// The item before a write that has no checks (it cannot be refused).
pub(super) fn applied_before(
    write: &Write,
    result: WriteResult,
) -> Result<Option<SemaphoreItem>, StoreError> {
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

pub(super) fn applied(
    write: &Write,
    before: Option<&SemaphoreItem>,
) -> Result<SemaphoreItem, StoreError> {
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
