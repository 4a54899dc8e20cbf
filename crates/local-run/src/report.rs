//! The final report: what happened, and whether the invariants held.

use serde::Serialize;

use crate::events::EventStats;
use crate::poller::PollStats;
use crate::proxy::ProxyStats;
use crate::Role;

#[derive(Debug, Default, Clone, Serialize)]
pub struct ExecutionCounts {
    pub total: usize,
    pub succeeded: usize,
    /// Asked to fail ("fail": true) and FAILED with WorkFailed.
    pub failed_as_planned: usize,
    /// Stopped by the run while their acquire write was in flight.
    pub stopped_mid_acquire: usize,
    /// Stopped by the run while holding a slot.
    pub stopped_mid_work: usize,
    /// Anything else: a status or error the plan did not ask for, or still running.
    pub unexpected: usize,
    pub unexpected_examples: Vec<String>,
}

impl ExecutionCounts {
    /// Counts an execution that ended as its role planned; false (only `unexpected` counted) if
    /// it did not, for the caller to say why.
    pub fn count_planned(
        &mut self,
        role: Role,
        status: &str,
        error: Option<&str>,
        was_stopped: bool,
    ) -> bool {
        let planned = match (role, status, error) {
            (Role::Fail, "FAILED", Some("WorkFailed")) => &mut self.failed_as_planned,
            (Role::StopMidAcquire, "ABORTED", _) if was_stopped => &mut self.stopped_mid_acquire,
            (Role::StopMidWork, "ABORTED", _) if was_stopped => &mut self.stopped_mid_work,
            // A stop that came after the work was done: the execution simply succeeded.
            (Role::Normal | Role::StopMidWork, "SUCCEEDED", _) => &mut self.succeeded,
            _ => {
                self.unexpected += 1;
                return false;
            }
        };
        *planned += 1;
        true
    }
}

#[derive(Debug, Default, Clone, Serialize)]
pub struct SweeperCounts {
    /// The template's schedule, and how often the run played it.
    pub schedule: String,
    pub every_seconds: f64,
    pub sweeps: usize,
    pub failed_sweeps: usize,
    pub reclaimed: usize,
    /// Notices read back from the topic (SNS -> SQS).
    pub notices_read_back: usize,
    /// One line per notice: who held the slot, how long, why it was reclaimed.
    pub notices: Vec<String>,
}

#[derive(Debug, Default, Clone, Serialize)]
pub struct CleanupCounts {
    pub started: usize,
    pub succeeded: usize,
    pub failed: usize,
    pub failures: Vec<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Check {
    pub name: String,
    pub ok: bool,
    pub detail: String,
}

#[derive(Debug, Default, Clone, Serialize)]
pub struct Report {
    /// "versioned" (this project) or "reference" (the original sample's protocol; test-only).
    pub protocol: String,
    pub seed: u64,
    pub lock: String,
    pub limit: usize,
    pub executions: ExecutionCounts,
    pub max_concurrent_holders: usize,
    pub poller: PollStats,
    /// Holders when the last execution had ended, before the final sweep.
    pub holders_when_all_ended: usize,
    /// Holders at the very end (after the final sweep, when there is a sweeper).
    pub leaked_slots_at_end: usize,
    pub leaked_holders: Vec<String>,
    pub events: EventStats,
    pub cleanup_executions: CleanupCounts,
    pub delayed_acquire_writes: ProxyStats,
    pub hold_seconds: f64,
    /// How long every second held write was held instead, if any.
    pub long_hold_seconds: Option<f64>,
    /// Acquire answers `SemaphoreFenced`, counted in the acquire Lambda's logs.
    pub fenced_answers_in_logs: usize,
    /// Acquire answers "expired" (the request older than the horizon), counted in the acquire
    /// Lambda's logs.
    pub expired_answers_in_logs: usize,
    /// The protocol's timing, from the template's parameters: (horizon, clock skew) in seconds.
    /// The fence window is their sum.
    pub timing_seconds: Option<(u64, u64)>,
    pub sweeper: Option<SweeperCounts>,
    pub fencing_tokens_unique: Option<bool>,
    pub wall_seconds: f64,
    pub logs: String,
    pub checks: Vec<Check>,
    pub ok: bool,
}

impl Report {
    pub fn check(&mut self, name: &str, ok: bool, detail: String) {
        self.checks.push(Check {
            name: name.to_owned(),
            ok,
            detail,
        });
    }

    pub fn finish(&mut self) {
        self.ok = self.checks.iter().all(|c| c.ok);
    }

    pub fn render(&self) -> String {
        let mut out = String::new();
        let mut line = |label: &str, text: String| {
            out.push_str(&format!("  {label:<18}{text}\n"));
        };
        let title = if self.protocol == "reference" {
            "the ORIGINAL SAMPLE's protocol (reference mode, test-only)"
        } else {
            "this project's versioned, fenced semaphore"
        };
        let e = &self.executions;
        let timing = self
            .timing_seconds
            .map(|(horizon, skew)| {
                format!(
                    ", fence window {} s (horizon {horizon} s + clock skew {skew} s)",
                    horizon + skew
                )
            })
            .unwrap_or_default();
        let mut head = format!(
            "Local run report: {title}\n  lock \"{}\", limit {}, seed {}{timing}\n",
            self.lock, self.limit, self.seed
        );
        head.push_str(&"-".repeat(78));
        head.push('\n');
        line(
            "executions",
            format!(
                "{}: {} succeeded, {} failed as planned, {} stopped mid-acquire, {} stopped \
                 mid-work, {} unexpected",
                e.total,
                e.succeeded,
                e.failed_as_planned,
                e.stopped_mid_acquire,
                e.stopped_mid_work,
                e.unexpected
            ),
        );
        for example in e.unexpected_examples.iter().take(5) {
            line("", format!("unexpected: {example}"));
        }
        line(
            "max holders seen",
            format!(
                "{} (limit {}; independent poller, {} reads, {} inconsistent)",
                self.max_concurrent_holders,
                self.limit,
                self.poller.reads,
                self.poller.inconsistent_reads
            ),
        );
        let after = if self.sweeper.is_some() {
            "after the final sweep"
        } else {
            "no sweeper in this protocol"
        };
        line(
            "leaked at end",
            format!(
                "{} ({after}; {} held when the last execution ended)",
                self.leaked_slots_at_end, self.holders_when_all_ended
            ),
        );
        for holder in self.leaked_holders.iter().take(5) {
            line("", format!("still held by {}", short(holder)));
        }
        let ev = &self.events;
        line(
            "status events",
            format!(
                "{} matched the rule: {} dropped, {} duplicated, {} delivered late; {} deliveries",
                ev.matched, ev.dropped, ev.duplicated, ev.late, ev.deliveries
            ),
        );
        let c = &self.cleanup_executions;
        if c.started > 0 {
            line(
                "cleanup runs",
                format!(
                    "{} cleanup executions: {} succeeded, {} failed",
                    c.started, c.succeeded, c.failed
                ),
            );
            for failure in c.failures.iter().take(5) {
                line("", format!("failed: {failure}"));
            }
        }
        let d = &self.delayed_acquire_writes;
        let fates = if self.protocol == "reference" {
            // The sample has no fences: its write is refused only by "full" or "held".
            format!("{} refused (full or already held)", d.refused())
        } else {
            format!(
                "{} refused by a fence, {} refused by the horizon, {} refused otherwise (full or \
                 already held)",
                d.refused_by_fence, d.refused_by_horizon, d.refused_otherwise
            )
        };
        line(
            "delayed writes",
            format!(
                "{} acquire writes held ({}) while their execution was stopped: {fates}, {} \
                 landed{}",
                d.held,
                match self.long_hold_seconds {
                    Some(long) => format!(
                        "{} for {:.0} s, {} for {long:.0} s",
                        d.held - d.held_long,
                        self.hold_seconds,
                        d.held_long
                    ),
                    None => format!("{:.0} s", self.hold_seconds),
                },
                d.landed,
                if d.other_outcome > 0 {
                    format!(", {} answered otherwise", d.other_outcome)
                } else {
                    String::new()
                }
            ),
        );
        for write in d.writes.iter().take(10) {
            line("", write.clone());
        }
        if self.protocol != "reference" {
            line(
                "acquire answers",
                format!(
                    "{} fenced (SemaphoreFenced), {} expired (the acquire state entered again); \
                     from the acquire Lambda's logs",
                    self.fenced_answers_in_logs, self.expired_answers_in_logs
                ),
            );
        }
        if let Some(s) = &self.sweeper {
            line(
                "sweeper",
                format!(
                    "{} sweeps (template: {}, played every {:.0} s), {} failed; {} slots reclaimed",
                    s.sweeps, s.schedule, s.every_seconds, s.failed_sweeps, s.reclaimed
                ),
            );
            line(
                "notices",
                format!(
                    "{} read back from the SNS topic (SQS subscription)",
                    s.notices_read_back
                ),
            );
            for notice in s.notices.iter().take(8) {
                line("", notice.clone());
            }
        }
        if let Some(unique) = self.fencing_tokens_unique {
            line(
                "fencing tokens",
                if unique {
                    format!("{} succeeded executions, all tokens distinct", e.succeeded)
                } else {
                    "DUPLICATE tokens among succeeded executions".to_owned()
                },
            );
        }
        line("wall time", format!("{:.0} s", self.wall_seconds));
        line("logs", self.logs.clone());
        let mut text = head + &out;
        text.push_str("Invariants\n");
        for check in &self.checks {
            text.push_str(&format!(
                "  {}  {}: {}\n",
                if check.ok { "ok  " } else { "FAIL" },
                check.name,
                check.detail
            ));
        }
        text.push_str(if self.ok {
            "RESULT: every invariant held\n"
        } else {
            "RESULT: an invariant FAILED\n"
        });
        text
    }
}

/// The execution name of an execution ARN.
pub fn short(arn: &str) -> &str {
    arn.rsplit(':').next().unwrap_or(arn)
}
