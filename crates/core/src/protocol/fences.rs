//! The fences' upkeep: the rotation that drops the old window, the gate's tombstones, and the
//! layout switch.

use super::timing::{millis, Timing};
use crate::input::LockName;
use crate::item::{Layout, SemaphoreItem};
use crate::write::{Change, Check, Write};

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
