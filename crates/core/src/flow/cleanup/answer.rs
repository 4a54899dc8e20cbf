//! The cleanup answer: what the cleanup function tells its state machine of an ended execution
//! (the locks it fenced and freed, the lines it left, its work), and when to ask again while
//! its work runs.

use serde::{Deserialize, Serialize};

use super::{Cleaned, End, LockCleaned};

/// The wait before asking again while the work runs: 5 s at first, growing by a second per
/// 10 s since the execution ended, up to a minute. A long work costs a few calls a minute.
pub const RETRY_AFTER_MIN_SECONDS: u64 = 5;
pub const RETRY_AFTER_MAX_SECONDS: u64 = 60;

/// The wait before asking again, from how long ago the execution ended.
pub fn retry_after_seconds(stopped_ms: Option<u64>, now_ms: u64) -> u64 {
    let waited_s = stopped_ms.map_or(0, |stopped| now_ms.saturating_sub(stopped) / 1000);
    (RETRY_AFTER_MIN_SECONDS + waited_s / 10).min(RETRY_AFTER_MAX_SECONDS)
}

/// One slot freed by this cleanup.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FreedSlot {
    pub acquisition: String,
    pub token: u64,
    pub held_for_ms: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LockCleanup {
    pub lock: String,
    /// What this call freed; empty when it held nothing (already released, a duplicate event,
    /// or its acquire had not landed yet: it is fenced now either way) or when it only fenced.
    pub freed: Vec<FreedSlot>,
    /// The acquisitions still held because the work still runs (deferred), or because the
    /// execution runs again: fenced, not freed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub kept: Vec<String>,
    /// Slots held on the lock after the cleanup; `None` when the execution was only fenced.
    pub count: Option<usize>,
}

impl LockCleanup {
    /// A lock as the cleanup left it: freed at `freed_at_ms` (what each slot's time held counts
    /// to), or fenced only.
    pub fn of(lock: &LockCleaned, freed_at_ms: Option<u64>) -> Self {
        let fenced = &lock.fenced;
        let name = fenced.lock.to_string();
        match (&lock.freed, freed_at_ms) {
            (Some(freed), Some(at_ms)) => Self {
                lock: name,
                freed: (freed.freed.iter())
                    .map(|(identity, holding)| FreedSlot {
                        acquisition: identity.acquisition.to_string(),
                        token: holding.token.0,
                        held_for_ms: at_ms.saturating_sub(holding.acquired_at_ms),
                    })
                    .collect(),
                kept: Vec::new(),
                count: Some(freed.count),
            },
            _ => Self {
                lock: name,
                freed: Vec::new(),
                kept: (fenced.slots.iter())
                    .map(|(identity, _)| identity.acquisition.to_string())
                    .collect(),
                count: None,
            },
        }
    }
}

/// What became of a child execution of the ended one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ChildAction {
    /// It had ended.
    Ended,
    /// It was running a state machine of the user's: stopped now.
    Stopped,
    /// It runs a Lambda function, which cannot be stopped, or its start was in flight when the
    /// parent ended: waited for, the slots kept.
    Waiting,
    /// It was never started.
    NotStarted,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChildWork {
    pub execution: String,
    /// As described before anything was done: RUNNING, SUCCEEDED, ..., or NOT_FOUND.
    pub status: String,
    pub action: ChildAction,
}

/// The answer. `deferred` and `retry_after_seconds` are always there: the cleanup state
/// machine waits that long and asks again while `deferred` is true.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CleanupSummary {
    pub execution: String,
    pub status: String,
    /// True when what the execution held is freed (or it held nothing).
    pub cleaned: bool,
    /// True while its work still runs: fenced, nothing freed; ask again.
    pub deferred: bool,
    /// How long to wait before asking again; 0 when not deferred.
    pub retry_after_seconds: u64,
    pub locks: Vec<LockCleanup>,
    pub children: Vec<ChildWork>,
    /// The locks whose line the execution was taken out of (it died waiting).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub left_line: Vec<String>,
    /// Waiters woken with the slots this cleanup freed.
    #[serde(default)]
    pub handed_off: usize,
    /// What the history did not tell (the notes of the reading of the execution's history).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub history_notes: Vec<String>,
    /// Why nothing (more) was done.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    /// The history was too long to judge (`note` says how much was read): nothing was done;
    /// the sweeper judges what the execution holds, or reports each slot it cannot.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub history_too_long: bool,
}

impl CleanupSummary {
    /// The answer about `execution`, whose event said `status`, before anything is done.
    pub fn new(execution: &str, status: &str) -> Self {
        Self {
            execution: execution.to_owned(),
            status: status.to_owned(),
            ..Self::default()
        }
    }

    /// What `cleaned` did, in the answer: each lock fenced (freed, or kept), each line left, the
    /// waiters woken, and whether all is freed. `deferred` and the wait are the caller's, who
    /// knows when the execution ended.
    pub fn record(&mut self, cleaned: &Cleaned) {
        let freed_at_ms = match cleaned.end {
            End::Freed { at_ms } => Some(at_ms),
            _ => None,
        };
        self.locks = (cleaned.locks.iter())
            .map(|lock| LockCleanup::of(lock, freed_at_ms))
            .collect();
        self.left_line = (cleaned.left_line.iter())
            .map(|left| left.lock.to_string())
            .collect();
        self.handed_off = cleaned.handed_off;
        self.cleaned = cleaned.is_clean();
    }
}
