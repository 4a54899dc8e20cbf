//! What the sweeper tells operators by SNS: one notice per slot it reclaimed from an ended
//! execution or took back from a lease that passed unrenewed, and per slot it kept because it
//! could not judge its holder (its metrics are `lambda_common::metrics`').

use semaphore_core::{rfc3339_millis, Reclaimed, TakenBackSlot, Unjudged};
use serde::{Deserialize, Serialize};
/// SNS subjects must be ASCII, without control characters, and under 100 characters.
pub const MAX_SUBJECT_CHARS: usize = 99;

/// The JSON message of an SNS notice.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Notice {
    /// `execution_ended` (its holder's execution is no longer running), `lease_passed` (its
    /// lease ended more than the clock skew ago, unrenewed: F13), or `not_judged` (its holder's
    /// execution ended but its history is too long to tell whether its work still runs: the
    /// slot is kept; check the work, then `semctl cleanup --holder`).
    pub kind: NoticeKind,
    pub lock: String,
    pub holder: String,
    pub acquisition: String,
    pub token: u64,
    pub held_for_ms: u64,
    /// `held_for_ms` for people, e.g. "1h 2m 3s".
    pub held_for: String,
    /// Why it was reclaimed, e.g. "execution status is ABORTED" (or why it was not judged).
    pub reason: String,
    /// When the sweep began (RFC 3339, UTC).
    pub swept_at: String,
}

/// Why a slot was freed without its holder's release.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NoticeKind {
    ExecutionEnded,
    LeasePassed,
    NotJudged,
}

impl NoticeKind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::ExecutionEnded => "execution_ended",
            Self::LeasePassed => "lease_passed",
            Self::NotJudged => "not_judged",
        }
    }

    /// What happened to the slot, for the log.
    pub fn what(self) -> &'static str {
        match self {
            Self::ExecutionEnded | Self::LeasePassed => "freed a slot its holder did not release",
            Self::NotJudged => "kept a slot of an ended execution that could not be judged",
        }
    }
}

impl Notice {
    pub fn new(slot: &Reclaimed, swept_at: &str) -> Self {
        Self {
            kind: NoticeKind::ExecutionEnded,
            lock: slot.lock.to_string(),
            holder: slot.holder.to_string(),
            acquisition: slot.acquisition.to_string(),
            token: slot.token.0,
            held_for_ms: slot.held_for_ms,
            held_for: human_duration(slot.held_for_ms),
            reason: slot.reason.clone(),
            swept_at: swept_at.to_owned(),
        }
    }

    /// A slot taken back from a lapsed lease, by the sweep or by a write of the lock's that
    /// found it full.
    pub fn taken_back(slot: &TakenBackSlot, swept_at: &str) -> Self {
        let held_for_ms = slot.taken_at_ms.saturating_sub(slot.holding.acquired_at_ms);
        Self {
            kind: NoticeKind::LeasePassed,
            lock: slot.lock.to_string(),
            holder: slot.identity.holder.to_string(),
            acquisition: slot.identity.acquisition.to_string(),
            token: slot.holding.token.0,
            held_for_ms,
            held_for: human_duration(held_for_ms),
            reason: format!(
                "its lease ended at {} and was not renewed",
                rfc3339_millis(slot.lease_until_ms)
            ),
            swept_at: swept_at.to_owned(),
        }
    }

    /// A slot kept because its holder could not be judged.
    pub fn not_judged(slot: &Unjudged, swept_at: &str) -> Self {
        Self {
            kind: NoticeKind::NotJudged,
            lock: slot.lock.to_string(),
            holder: slot.holder.to_string(),
            acquisition: slot.acquisition.to_string(),
            token: slot.token.0,
            held_for_ms: slot.held_for_ms,
            held_for: human_duration(slot.held_for_ms),
            reason: slot.why.clone(),
            swept_at: swept_at.to_owned(),
        }
    }

    pub fn subject(&self) -> String {
        match self.kind {
            NoticeKind::ExecutionEnded | NoticeKind::LeasePassed => subject(&self.lock),
            NoticeKind::NotJudged => {
                valid_subject(&format!("Semaphore slot not judged: {}", self.lock))
            }
        }
    }
}

/// `Semaphore slot reclaimed: <lock>`, made a valid SNS subject: characters outside printable
/// ASCII become '?', and a long one is cut to [`MAX_SUBJECT_CHARS`] ending in "...".
pub fn subject(lock: &str) -> String {
    valid_subject(&format!("Semaphore slot reclaimed: {lock}"))
}

fn valid_subject(text: &str) -> String {
    let text: String = text
        .chars()
        .map(|c| {
            if c == ' ' || c.is_ascii_graphic() {
                c
            } else {
                '?'
            }
        })
        .collect();
    if text.len() <= MAX_SUBJECT_CHARS {
        return text;
    }
    // All ASCII now, so byte and character positions agree.
    format!("{}...", &text[..MAX_SUBJECT_CHARS - 3])
}

/// "250ms", "4.2s", "3m 5s", "2h 0m 7s", "1d 3h 0m 0s".
pub fn human_duration(ms: u64) -> String {
    if ms < 1_000 {
        return format!("{ms}ms");
    }
    let secs = ms / 1_000;
    if secs < 60 {
        return format!("{secs}.{}s", (ms % 1_000) / 100);
    }
    let units = [
        (secs / 86_400, "d"),
        (secs / 3_600 % 24, "h"),
        (secs / 60 % 60, "m"),
        (secs % 60, "s"),
    ];
    let first = units.iter().position(|(n, _)| *n > 0).unwrap_or(3);
    units[first..]
        .iter()
        .map(|(n, unit)| format!("{n}{unit}"))
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subjects_are_valid_for_sns() {
        assert_eq!(subject("demo-lock"), "Semaphore slot reclaimed: demo-lock");
        assert_eq!(subject("caf\u{e9}\tx"), "Semaphore slot reclaimed: caf??x");
        let long = subject(&"l".repeat(300));
        assert_eq!(long.len(), MAX_SUBJECT_CHARS);
        assert!(long.ends_with("lll..."));
        let wide = subject(&"\u{1F512}".repeat(100));
        assert!(wide.is_ascii() && wide.len() == MAX_SUBJECT_CHARS);
    }

    #[test]
    fn durations_read_like_a_person_would_write_them() {
        assert_eq!(human_duration(0), "0ms");
        assert_eq!(human_duration(250), "250ms");
        assert_eq!(human_duration(4_250), "4.2s");
        assert_eq!(human_duration(185_000), "3m 5s");
        assert_eq!(human_duration(7_207_000), "2h 0m 7s");
        assert_eq!(human_duration(97_200_000), "1d 3h 0m 0s");
    }
}
