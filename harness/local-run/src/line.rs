//! The waiting line, as the run saw it: who waited, in which order they were granted, how long
//! a freed slot took to reach its waiter, and what waiting cost in state transitions, from the
//! executions' histories (Step Functions' clock) and the Lambda functions' log lines (this
//! machine's clock; both are this machine's here).
//!
//! Grant order is checked with the fencing tokens: a grant's token is the lock's version when
//! it landed, so tokens order the grants of a lock exactly. A violation is counted only when it
//! is certain from the times recorded:
//! - a waiter granted ahead of one with an earlier place in line that was already in line when
//!   the hand-off granting the later one started (L2);
//! - a newcomer whose fast acquire was sent while someone was already in line, and whose token
//!   is lower than that waiter's (it passed the line).

use std::collections::BTreeMap;
use std::path::Path;

use aws_sdk_sfn::types::{HistoryEvent, HistoryEventType};
use semaphore_core::{AcquisitionId, HolderId, Identity, QueueKey};
use serde::Serialize;
use serde_json::Value;

use crate::report::short;

/// The acquire state of the stack's machines (and of docs/using.md's fragment).
const ACQUIRE_STATE: &str = local_aws::asl::ACQUIRE_STATE;

/// One execution of the lock-protected machine, as its history tells it.
#[derive(Debug, Clone, Default)]
pub struct Trace {
    pub arn: String,
    pub lock: usize,
    /// Its fencing token, from its output (succeeded executions).
    pub token: Option<u64>,
    /// When its first acquire was sent (its acquire task first scheduled), epoch ms.
    pub acquire_sent_ms: Option<i64>,
    /// Attempts of its acquire task (each a state transition Step Functions bills): 1, plus an
    /// entry after every timeout (a check), plus every retry (a start-rate deferral, a
    /// function error).
    pub acquire_attempts: usize,
    /// Of those, retries of `SemaphoreRateLimited`: the hand-off told it, at the head of the
    /// line, that the lock's start rate holds it back.
    pub rate_waits: usize,
    /// When it entered its work (it held a slot), epoch ms.
    pub resumed_ms: Option<i64>,
    /// Events in its history (Step Functions fails an execution at 25,000).
    pub events: usize,
    /// The events of each check after a timeout, as indices into its history: from an entry
    /// of the acquire state whose task timed out to the next state entered (the same state
    /// again, by its Catch).
    pub fallback_checks: Vec<std::ops::Range<usize>>,
}

impl Trace {
    /// Events of its history outside its checks.
    pub fn events_outside_checks(&self) -> usize {
        self.events
            .saturating_sub(self.fallback_checks.iter().map(|c| c.len()).sum::<usize>())
    }

    /// State transitions its waiting cost: every attempt of its acquire task but the first.
    pub fn waiting_transitions(&self) -> usize {
        self.acquire_attempts.saturating_sub(1)
    }
}

/// Reads a history (every page, oldest first).
pub fn trace(arn: &str, lock: usize, events: &[HistoryEvent], output: Option<&Value>) -> Trace {
    let mut t = Trace {
        arn: arn.to_owned(),
        lock,
        token: output.and_then(|o| o["semaphore"]["token"].as_u64()),
        ..Trace::default()
    };
    let mut last_entered: Option<String> = None;
    t.events = events.len();
    // (index of the acquire state's entry, whether its task timed out) of the wait in progress.
    let mut waiting: Option<(usize, bool)> = None;
    for (i, e) in events.iter().enumerate() {
        let at = e.timestamp().to_millis().ok();
        if let Some(entered) = e.state_entered_event_details() {
            if let Some((start, true)) = waiting.take() {
                t.fallback_checks.push(start..i);
            }
            if entered.name() == ACQUIRE_STATE {
                waiting = Some((i, false));
            }
            if entered.name() == "Protected work" && t.resumed_ms.is_none() {
                t.resumed_ms = at;
            }
            last_entered = Some(entered.name().to_owned());
        }
        let in_acquire = last_entered.as_deref() == Some(ACQUIRE_STATE);
        match e.r#type() {
            HistoryEventType::TaskTimedOut => {
                if let Some((_, timed_out)) = waiting.as_mut() {
                    *timed_out = true;
                }
            }
            HistoryEventType::TaskScheduled if in_acquire => {
                t.acquire_attempts += 1;
                if t.acquire_sent_ms.is_none() {
                    t.acquire_sent_ms = at;
                }
            }
            HistoryEventType::TaskFailed if in_acquire => {
                let error = e.task_failed_event_details().and_then(|d| d.error());
                if error == Some(lambda_common::error_type::RATE_LIMITED) {
                    t.rate_waits += 1;
                }
            }
            _ => {}
        }
    }
    t
}

/// Times the Lambda functions logged about one waiter.
#[derive(Debug, Clone, Default)]
struct Logged {
    /// Its place in line: when the attempt that queued it was asked (its first "queued" line).
    queued_at_ms: Option<u64>,
    /// First "queued" line: its record was in line by then.
    in_line_at_ms: Option<i64>,
    /// "handed off": the hand-off that granted it started (the slot had just been freed) and
    /// woke it.
    freed_at_ms: Option<i64>,
    woken_at_ms: Option<i64>,
    /// A check of its own (its task entered again, or retried) found the slot its own and
    /// completed its task.
    own_check: bool,
}

fn logged(dir: &Path) -> BTreeMap<String, Logged> {
    let mut by_holder: BTreeMap<String, Logged> = BTreeMap::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return by_holder;
    };
    for entry in entries.flatten() {
        if !entry.file_name().to_string_lossy().starts_with("lambda-") {
            continue;
        }
        for line in std::fs::read_to_string(entry.path())
            .unwrap_or_default()
            .lines()
        {
            let Ok(v) = serde_json::from_str::<Value>(line) else {
                continue;
            };
            let Some(holder) = v["holder"].as_str() else {
                continue;
            };
            let l = by_holder.entry(holder.to_owned()).or_default();
            match v["message"].as_str() {
                Some("queued") => {
                    if let Some(at) = v["in_line_at_ms"].as_i64() {
                        l.in_line_at_ms = Some(l.in_line_at_ms.map_or(at, |x| x.min(at)));
                    }
                    if l.queued_at_ms.is_none() {
                        l.queued_at_ms = v["queued_at"].as_u64();
                    }
                }
                Some("handed off") => {
                    l.freed_at_ms = v["freed_at_ms"].as_i64();
                    l.woken_at_ms = v["woken_at_ms"].as_i64();
                }
                Some("acquire") if v["outcome"] == "already_held" => l.own_check = true,
                _ => {}
            }
        }
    }
    by_holder
}

/// What the line report says.
#[derive(Debug, Clone, Default, Serialize)]
pub struct LineReport {
    /// Executions that waited in line and were then granted a slot.
    pub waiters_granted: usize,
    /// Of those, woken by a hand-off (release, cleanup, sweeper, another waiter's check)...
    pub woken_by_hand_off: usize,
    /// ...or that found the slot themselves (their first wait or a fallback check).
    pub granted_on_own_check: usize,
    /// Fallback checks (a parked task's timeout making it check again).
    pub fallback_checks: usize,
    /// Heads of the line told to come back when the start rate allows (`SemaphoreRateLimited`,
    /// retried by their acquire state, in their place).
    pub rate_waits: usize,
    /// Grant-order violations (see the module documentation): a later place granted ahead of
    /// an earlier one already in line.
    pub order_violations: usize,
    /// Newcomers whose fast acquire passed someone already in line.
    pub newcomers_passing: usize,
    pub violation_examples: Vec<String>,
    /// Waiters that entered their work with no log line saying how they got the slot (no
    /// hand-off woke them, no check of their own found it): their histories are saved.
    pub unexplained: Vec<String>,
    /// Pairs of granted waiters the order check compared (both in line when the later grant
    /// started).
    pub pairs_checked: usize,
    /// Slot freed (the hand-off started, right after the freeing write) to the waiter resumed
    /// (entered its work), ms.
    pub hand_off_p50_ms: Option<i64>,
    pub hand_off_p99_ms: Option<i64>,
    pub hand_off_max_ms: Option<i64>,
    /// From asking (queued_at) to entering its work, seconds.
    pub longest_wait_s: Option<f64>,
    pub mean_wait_s: Option<f64>,
    /// State transitions spent waiting (attempts of the acquire state after the first) per
    /// waiter-minute waited.
    pub transitions_waiting: usize,
    pub waiting_minutes: f64,
    pub transitions_per_waiting_minute: Option<f64>,
    /// What waiting by polling (3 transitions a poll, jittered waits of 1 to 5 s growing by a
    /// second per minute waited, up to 15 s) would cost for the same waits: what the line saves.
    pub polling_transitions: f64,
    pub polling_transitions_per_waiting_minute: Option<f64>,
    /// Each granted waiter's (lock, wait in s) and each hand-off's (lock, latency in ms): the
    /// distributions of the run's picture.
    #[serde(skip)]
    pub waits_s: Vec<(usize, f64)>,
    #[serde(skip)]
    pub hand_offs_ms: Vec<(usize, i64)>,
}

/// Expected transitions of waiting by polling over `seconds`: 3 per poll, each wait
/// uniform in 1..=min(15, 5 + minutes waited) (its mean (1 + upper) / 2).
pub fn polling_transitions(seconds: f64) -> f64 {
    let (mut t, mut polls) = (0.0, 0.0);
    while t < seconds {
        let upper = (5.0 + (t / 60.0).floor()).min(15.0);
        t += (1.0 + upper) / 2.0;
        polls += 1.0;
    }
    3.0 * polls
}

fn percentile(sorted: &[i64], p: f64) -> Option<i64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    Some(sorted[rank.clamp(1, sorted.len()) - 1])
}

fn key(arn: &str, queued_at_ms: u64) -> Option<QueueKey> {
    let identity = Identity::new(HolderId::new(arn).ok()?, AcquisitionId::new("r0").ok()?);
    Some(QueueKey::new(&identity, queued_at_ms))
}

/// The report from the traces of the run's executions and the logs in `dir`.
pub fn report(traces: &[Trace], dir: &Path) -> LineReport {
    let logs = logged(dir);
    let none = Logged::default();
    let log = |arn: &str| logs.get(arn).unwrap_or(&none);
    let mut r = LineReport::default();
    for t in traces {
        r.fallback_checks += t.fallback_checks.len();
        r.rate_waits += t.rate_waits;
        r.transitions_waiting += t.waiting_transitions();
        let l = log(&t.arn);
        let (Some(queued_at), Some(resumed)) = (l.queued_at_ms, t.resumed_ms) else {
            continue;
        };
        r.waiters_granted += 1;
        if let Some(freed) = l.freed_at_ms {
            r.woken_by_hand_off += 1;
            r.hand_offs_ms.push((t.lock, resumed - freed));
        } else if l.own_check {
            r.granted_on_own_check += 1;
        } else {
            r.unexplained.push(t.arn.clone());
        }
        let waited_s = (resumed - queued_at as i64).max(0) as f64 / 1000.0;
        r.waits_s.push((t.lock, waited_s));
        r.polling_transitions += polling_transitions(waited_s);
    }
    // L2 among granted waiters of one lock: A earlier in line than B, A in line when the
    // hand-off that granted B started, B granted first (lower token).
    let waiters: Vec<(&Trace, QueueKey, u64)> = traces
        .iter()
        .filter_map(|t| {
            let key = key(&t.arn, log(&t.arn).queued_at_ms?)?;
            Some((t, key, t.token?))
        })
        .collect();
    for (a, key_a, token_a) in &waiters {
        let Some(a_in_line) = log(&a.arn).in_line_at_ms else {
            continue;
        };
        for (b, key_b, token_b) in &waiters {
            if a.lock != b.lock || key_a >= key_b {
                continue;
            }
            let Some(b_freed) = log(&b.arn).freed_at_ms else {
                continue;
            };
            if a_in_line >= b_freed {
                continue;
            }
            r.pairs_checked += 1;
            if token_b < token_a {
                r.order_violations += 1;
                if r.violation_examples.len() < 5 {
                    r.violation_examples.push(format!(
                        "{} (place {key_b}) granted token {token_b} before {} (place {key_a}, in line since {a_in_line}) got {token_a}",
                        short(&b.arn),
                        short(&a.arn)
                    ));
                }
            }
        }
    }
    // Newcomers: acquires that took a slot without waiting, sent while someone was in line, who
    // got a lower token.
    for f in traces.iter().filter(|t| log(&t.arn).queued_at_ms.is_none()) {
        let (Some(sent), Some(token_f)) = (f.acquire_sent_ms, f.token) else {
            continue;
        };
        for (a, _, token_a) in waiters.iter().filter(|(a, ..)| a.lock == f.lock) {
            let Some(a_in_line) = log(&a.arn).in_line_at_ms else {
                continue;
            };
            if a_in_line < sent && token_f < *token_a {
                r.newcomers_passing += 1;
                if r.violation_examples.len() < 5 {
                    r.violation_examples.push(format!(
                        "newcomer {} (acquire sent at {sent}, token {token_f}) passed {} (in line since {a_in_line}, token {token_a})",
                        short(&f.arn),
                        short(&a.arn)
                    ));
                }
            }
        }
    }
    let mut latencies: Vec<i64> = r.hand_offs_ms.iter().map(|(_, ms)| *ms).collect();
    let waits: Vec<f64> = r.waits_s.iter().map(|(_, s)| *s).collect();
    latencies.sort_unstable();
    r.hand_off_p50_ms = percentile(&latencies, 50.0);
    r.hand_off_p99_ms = percentile(&latencies, 99.0);
    r.hand_off_max_ms = latencies.last().copied();
    r.longest_wait_s = waits.iter().copied().reduce(f64::max);
    if !waits.is_empty() {
        r.mean_wait_s = Some(waits.iter().sum::<f64>() / waits.len() as f64);
    }
    r.waiting_minutes = waits.iter().sum::<f64>() / 60.0;
    if r.waiting_minutes > 0.0 {
        r.transitions_per_waiting_minute = Some(r.transitions_waiting as f64 / r.waiting_minutes);
        r.polling_transitions_per_waiting_minute = Some(r.polling_transitions / r.waiting_minutes);
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn polling_costs_three_transitions_a_poll_with_waits_that_grow() {
        // The first minute: waits average 3 s, 20 polls, 60 transitions.
        assert_eq!(polling_transitions(60.0), 60.0);
        // An hour: the waits reach their 15 s cap (a mean of 8 s) after ten minutes: 500 polls.
        assert_eq!(polling_transitions(3600.0), 1500.0);
    }

    /// A check runs from the acquire state's entry whose task timed out to the next state
    /// entered; an attempt that ended otherwise is none, and every attempt (an entry or a
    /// retry) is a transition of waiting but the first.
    #[test]
    fn a_fallback_check_spans_a_timed_out_wait() {
        use aws_sdk_sfn::primitives::DateTime;
        use aws_sdk_sfn::types::StateEnteredEventDetails;
        use HistoryEventType::*;
        let event = |id: i64, kind: HistoryEventType, state: Option<&str>| {
            HistoryEvent::builder()
                .id(id)
                .r#type(kind)
                .timestamp(DateTime::from_millis(id))
                .set_state_entered_event_details(
                    state.map(|s| StateEnteredEventDetails::builder().name(s).build().unwrap()),
                )
                .build()
                .unwrap()
        };
        let events = [
            event(1, TaskStateEntered, Some("Acquire slot")),
            event(2, TaskScheduled, None),
            event(3, TaskTimedOut, None),
            event(4, TaskStateEntered, Some("Acquire slot")),
            event(5, TaskScheduled, None),
            event(6, TaskFailed, None),
            event(7, TaskScheduled, None),
            event(8, TaskSucceeded, None),
            event(9, TaskStateEntered, Some("Protected work")),
        ];
        let t = trace("arn", 0, &events, None);
        assert_eq!(t.fallback_checks.len(), 1);
        assert_eq!(t.fallback_checks[0], 0..3);
        assert_eq!((t.acquire_attempts, t.waiting_transitions()), (3, 2));
        assert_eq!(t.acquire_sent_ms, Some(2));
        assert_eq!(t.resumed_ms, Some(9));
        assert_eq!(t.events_outside_checks(), 6);
    }

    #[test]
    fn percentiles_are_nearest_rank() {
        let v = [10, 20, 30, 40, 50, 60, 70, 80, 90, 100];
        assert_eq!(percentile(&v, 50.0), Some(50));
        assert_eq!(percentile(&v, 99.0), Some(100));
        assert_eq!(percentile(&[], 50.0), None);
    }
}
