//! What the sweeper tells operators: one SNS notice per reclaimed slot, and the `ReclaimedSlots`
//! metric as a CloudWatch embedded-metric-format (EMF) log line.

use semaphore_core::Reclaimed;
use serde::{Deserialize, Serialize};
use serde_json::json;

/// The metric's name; the alarm in template.yaml watches it (no dimensions).
pub const METRIC_NAME: &str = "ReclaimedSlots";
/// The size of the biggest semaphore item, once per sweep: what each write of the busiest lock
/// costs, which approaches a ceiling as that lock's rate grows (BENCHMARKS.md).
pub const ITEM_BYTES_METRIC_NAME: &str = "LargestItemBytes";
/// `METRIC_NAMESPACE` when unset.
pub const DEFAULT_NAMESPACE: &str = "StepFunctionsSemaphore";
/// SNS subjects must be ASCII, without control characters, and under 100 characters.
pub const MAX_SUBJECT_CHARS: usize = 99;

/// The JSON message of an SNS notice.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Notice {
    pub lock: String,
    pub holder: String,
    pub acquisition: String,
    pub token: u64,
    pub held_for_ms: u64,
    /// `held_for_ms` for people, e.g. "1h 2m 3s".
    pub held_for: String,
    /// Why it was reclaimed, e.g. "execution status is ABORTED".
    pub reason: String,
    /// When the sweep began (RFC 3339, UTC).
    pub swept_at: String,
}

impl Notice {
    pub fn new(slot: &Reclaimed, swept_at: &str) -> Self {
        Self {
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

    pub fn subject(&self) -> String {
        subject(&self.lock)
    }
}

/// "Semaphore slot reclaimed: <lock>", made a valid SNS subject: characters outside printable
/// ASCII become '?', and a long one is cut to [`MAX_SUBJECT_CHARS`] ending in "...".
pub fn subject(lock: &str) -> String {
    let text: String = format!("Semaphore slot reclaimed: {lock}")
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

/// The EMF log line that makes CloudWatch record, in `namespace` (no dimensions) at
/// `timestamp_ms`, `ReclaimedSlots` = `reclaimed` and `LargestItemBytes` = `largest_item_bytes`.
/// Printed on stdout once per sweep, zeros included, so that the alarms see data rather than
/// missing data.
pub fn emf_line(
    namespace: &str,
    reclaimed: usize,
    largest_item_bytes: usize,
    timestamp_ms: u64,
) -> String {
    json!({
        "_aws": {
            "Timestamp": timestamp_ms,
            "CloudWatchMetrics": [{
                "Namespace": namespace,
                "Dimensions": [[]],
                "Metrics": [
                    { "Name": METRIC_NAME, "Unit": "Count" },
                    { "Name": ITEM_BYTES_METRIC_NAME, "Unit": "Bytes" },
                ],
            }],
        },
        METRIC_NAME: reclaimed,
        ITEM_BYTES_METRIC_NAME: largest_item_bytes,
    })
    .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

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

    #[test]
    fn the_emf_line_declares_two_dimensionless_metrics() {
        let line = emf_line("StepFunctionsSemaphore", 0, 809, 1_700_000_000_000);
        assert!(!line.contains('\n'));
        let doc: Value = serde_json::from_str(&line).unwrap();
        assert_eq!(
            doc,
            json!({
                "_aws": {
                    "Timestamp": 1_700_000_000_000u64,
                    "CloudWatchMetrics": [{
                        "Namespace": "StepFunctionsSemaphore",
                        "Dimensions": [[]],
                        "Metrics": [
                            {"Name": "ReclaimedSlots", "Unit": "Count"},
                            {"Name": "LargestItemBytes", "Unit": "Bytes"}
                        ]
                    }]
                },
                "ReclaimedSlots": 0,
                "LargestItemBytes": 809
            })
        );
    }
}
