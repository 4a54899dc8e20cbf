//! The final report: what happened, and whether the invariants held.

use serde::Serialize;

use crate::Role;
use local_aws::delay::ProxyStats;
use local_aws::eventbridge::EventStats;
use local_aws::poller::PollStats;
pub use local_aws::sfn::short;

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
    /// Of them, started on the consumer stack's machine, and of those, succeeded.
    pub consumer: usize,
    pub consumer_succeeded: usize,
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
    /// When each successful sweep started (epoch ms), for the run's picture.
    #[serde(skip)]
    pub started_ms: Vec<i64>,
}

#[derive(Debug, Default, Clone, Serialize)]
pub struct CleanupCounts {
    pub started: usize,
    pub succeeded: usize,
    pub failed: usize,
    pub failures: Vec<String>,
}

/// One lock of the run: what its executions did and what the poller saw of it.
#[derive(Debug, Default, Clone, Serialize)]
pub struct LockReport {
    pub lock: String,
    pub limit: usize,
    /// The template's default lock (LockName, ConcurrencyLimit): its executions' input names
    /// neither. The others are named, with their limit, in the input.
    pub default: bool,
    pub executions: usize,
    pub succeeded: usize,
    pub max_holders: usize,
    /// The largest sum of the holders' weights one read saw (S1 bounds it by the limit).
    pub max_weight: u64,
    /// Executions per weight their input asked for (`--weights`); empty: no weights given.
    pub weights: std::collections::BTreeMap<u32, usize>,
    /// The start rate the run asked for (`--rate`), and what the poller saw of the starts.
    pub rate: Option<local_aws::observe::StartRate>,
    pub reads: u64,
    pub inconsistent_reads: u64,
    pub first_inconsistency: Option<String>,
    /// Holders when the last execution had ended, before the final sweep.
    pub holders_when_all_ended: usize,
    /// Holders at the very end (after the final sweep, when there is a sweeper).
    pub leaked_at_end: usize,
    pub leaked_holders: Vec<String>,
    /// Fencing tokens are the lock's versions: distinct per lock, not across locks.
    pub fencing_tokens_unique: Option<bool>,
}

/// The work under the lock: every child execution (the demo work) against the slot of the
/// execution that started it, as the poller saw that slot.
#[derive(Debug, Default, Clone, Serialize)]
pub struct WorkReport {
    /// The work machine whose executions were checked.
    pub machine: String,
    pub children: usize,
    /// Children that ended before their parent's slot was freed (or whose parent still held
    /// it when the child ended).
    pub ended_under_the_slot: usize,
    /// The smallest gap between a child's end and its parent's slot being freed, in ms.
    pub min_margin_ms: Option<i64>,
    /// Children that ran, or were still running, after their parent's slot was freed.
    pub violations: Vec<String>,
    /// The parents stopped mid-work: what became of their child and their slot.
    pub stopped_parents: Vec<String>,
    /// Of the stopped parents' children: stopped (ABORTED) and ended on their own.
    pub children_stopped: usize,
    pub children_ended_on_their_own: usize,
}

/// The redrive guard, tested through its ASL path (moto has no RedriveExecution): an execution
/// whose child execution name is already taken must fail with SemaphoreRedriveRefused after
/// releasing its slot.
#[derive(Debug, Default, Clone, Serialize)]
pub struct RedriveGuardReport {
    pub execution: String,
    pub child_name: String,
    pub status: String,
    pub error: Option<String>,
    pub cause: Option<String>,
    /// Slots it held on its lock once it had ended.
    pub held_after: usize,
    pub ok: bool,
}

/// A machine the stack does not protect calls the acquire function (#18 item 16): it must fail
/// with SemaphoreMisconfigured, and nothing be written for its lock.
#[derive(Debug, Default, Clone, Serialize)]
pub struct MisconfiguredReport {
    pub execution: String,
    pub status: String,
    pub error: Option<String>,
    /// Whether its lock's item exists after it ended.
    pub lock_written: bool,
    pub ok: bool,
}

/// Stopping the parent while its work runs, one execution at a time: its status event goes to
/// the cleanup machine on time, and the poller of its lock watches when its slot is freed.
#[derive(Debug, Default, Clone, Serialize)]
pub struct StopParentReport {
    /// "state machine" (the demo work) or "Lambda function" (through the work-function runner).
    pub work: String,
    pub parent: String,
    pub child: String,
    pub child_status: String,
    /// How long after the parent was stopped its child ended.
    pub child_ended_after_stop_ms: i64,
    /// How long after the child ended the slot was freed (negative: freed while it ran).
    pub freed_after_child_ms: Option<i64>,
    /// How many times the cleanup answered "deferred" and waited for the work to end.
    pub cleanup_waits: usize,
    pub cleanup_status: String,
    /// The status event as EventBridge emits it, and as the cleanup machine got it (through
    /// the rule's input transformer), in bytes.
    pub event_bytes: usize,
    pub delivered_bytes: usize,
    pub ok: bool,
}

/// State transitions (states entered) of one uncontended critical section on the success path,
/// counted in the histories of a real local execution and its child.
#[derive(Debug, Default, Clone, Serialize)]
pub struct TransitionsReport {
    /// The lock-protected machine's states entered, in order.
    pub protected: Vec<String>,
    /// The work's states entered, in order.
    pub work: Vec<String>,
    /// The semaphore's share: the lock-protected machine's states other than the work.
    pub semaphore_share: usize,
}

/// The history probe: an execution with a big input that waits in line through fallback
/// checks, then acquires, works and releases (Step Functions' 256 KiB payloads and 25,000
/// history events, issue 18).
#[derive(Debug, Clone, Default, Serialize)]
pub struct HistoryProbeReport {
    /// The waiter's execution input, bytes of JSON.
    pub input_bytes: usize,
    pub status: String,
    pub error: Option<String>,
    pub cause: Option<String>,
    /// Events in the waiter's history.
    pub events: usize,
    /// The events of each of its fallback checks.
    pub events_per_fallback_check: Vec<usize>,
    /// The types of the events of its first fallback check, in order.
    pub fallback_check_event_types: Vec<String>,
    /// Its events outside the fallback checks.
    pub events_outside_checks: usize,
    /// The holder's history: a critical section with no wait.
    pub holder_events: usize,
    /// The largest parameters a task of the waiter was scheduled with, bytes, and its state.
    pub largest_task_parameters_bytes: usize,
    pub largest_task_parameters_state: String,
    /// Per state: the largest parameters a task of the waiter was scheduled with there, bytes.
    pub task_parameters_bytes: std::collections::BTreeMap<String, usize>,
    /// An execution with the same input whose work fails: how it ended (the work's own error,
    /// after its release; not States.DataLimitExceeded).
    pub failing_status: String,
    pub failing_error: Option<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Check {
    pub name: String,
    pub ok: bool,
    pub detail: String,
}

impl Check {
    pub fn new(name: &str, ok: bool, detail: String) -> Self {
        Self {
            name: name.to_owned(),
            ok,
            detail,
        }
    }

    /// The check as the live log shows it when a probe has run.
    pub fn line(&self) -> String {
        format!("{}: {}", if self.ok { "ok" } else { "NOT OK" }, self.detail)
    }
}

impl RedriveGuardReport {
    pub fn check(&self) -> Check {
        Check::new(
            "F7 redrive guard",
            self.ok,
            format!(
                "{}: an execution that met its child's name {} already taken ended {} {} and \
                 held no slot ({} held after; moto 5.2.5 has no RedriveExecution, so the \
                 guard's path is run directly){}",
                short(&self.execution),
                self.child_name,
                self.status,
                self.error.as_deref().unwrap_or("(no error)"),
                self.held_after,
                match (self.ok, &self.cause) {
                    (false, Some(cause)) => format!(": {}", local_aws::sfn::clip(cause, 300)),
                    _ => String::new(),
                }
            ),
        )
    }
}

impl MisconfiguredReport {
    pub fn check(&self) -> Check {
        Check::new(
            "F12 not protected",
            self.ok,
            format!(
                "{}, an execution of a machine not under ProtectedStateMachinePrefix that asked for \
                 a slot, ended {} {}, its lock {}",
                short(&self.execution),
                self.status,
                self.error.as_deref().unwrap_or("(no error)"),
                if self.lock_written {
                    "WAS written"
                } else {
                    "untouched"
                }
            ),
        )
    }
}

impl StopParentReport {
    /// What happened, for the live log and the invariant's detail.
    pub fn summary(&self) -> String {
        format!(
            "{} work: {} stopped; its child {} ended {} ({} ms later){}; the slot freed {}; its \
             status event {} bytes, {} as delivered",
            self.work,
            short(&self.parent),
            short(&self.child),
            self.child_status,
            self.child_ended_after_stop_ms,
            match self.cleanup_waits {
                0 => String::new(),
                1 => ", the cleanup having waited for it once (deferred)".to_owned(),
                n => format!(", the cleanup having waited for it {n} times (deferred)"),
            },
            match self.freed_after_child_ms {
                Some(ms) if ms >= 0 => format!("{ms} ms after the child ended"),
                Some(ms) => format!("{} ms BEFORE the child ended", -ms),
                None => "never".to_owned(),
            },
            self.event_bytes,
            self.delivered_bytes
        )
    }

    /// S1 when the parent is stopped: over every such probe.
    pub fn check(probes: &[Self]) -> Check {
        let summaries: Vec<String> = probes.iter().map(Self::summary).collect();
        Check::new(
            "S1 stopping the parent",
            probes.iter().all(|p| p.ok),
            summaries.join("; "),
        )
    }
}

impl HistoryProbeReport {
    pub fn check(&self) -> Check {
        let per_check = lambda_common::EVENTS_PER_FALLBACK_CHECK as usize;
        Check::new(
            "F9 history and payload quotas",
            self.status == "SUCCEEDED"
                && self.events_per_fallback_check.len() >= 2
                && self
                    .events_per_fallback_check
                    .iter()
                    .all(|n| *n <= per_check)
                && self.events_outside_checks as u64 <= lambda_common::HISTORY_RESERVE
                && self.largest_task_parameters_bytes <= 256 * 1024
                && self.failing_error.as_deref() == Some("WorkFailed"),
            format!(
                "an execution with an input of {} bytes waited through {} fallback checks of \
                 {:?} events (the acquire function's bound assumes at most {per_check}), {} \
                 events outside them (at most {} reserved), and ended {}{}; its largest task \
                 parameters were {} bytes ({}; the local server fails a task past 262,144); one \
                 whose work failed ended {} {} (expected the work's own WorkFailed)",
                self.input_bytes,
                self.events_per_fallback_check.len(),
                self.events_per_fallback_check,
                self.events_outside_checks,
                lambda_common::HISTORY_RESERVE,
                self.status,
                self.error
                    .as_ref()
                    .map(|e| format!(" {e}: {}", self.cause.as_deref().unwrap_or("")))
                    .unwrap_or_default(),
                self.largest_task_parameters_bytes,
                self.largest_task_parameters_state,
                self.failing_status,
                self.failing_error.as_deref().unwrap_or("(no error)")
            ),
        )
    }
}

#[derive(Debug, Default, Clone, Serialize)]
pub struct Report {
    /// "versioned" (this project) or "sample" (the original sample's protocol; test-only).
    pub protocol: String,
    /// The locks' layout: "item" (holders in the lock's item) or "gate" (a holding item each).
    pub layout: String,
    pub seed: u64,
    /// Per lock; the first is the template's default lock.
    pub locks: Vec<LockReport>,
    pub executions: ExecutionCounts,
    pub poller: PollStats,
    /// Holders of every lock when the last execution had ended, before the final sweep.
    pub holders_when_all_ended: usize,
    /// Holders of every lock at the very end (after the final sweep, when there is a sweeper).
    pub leaked_slots_at_end: usize,
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
    pub work: Option<WorkReport>,
    pub redrive_guard: Option<RedriveGuardReport>,
    pub misconfigured_caller: Option<MisconfiguredReport>,
    pub stopped_parent_probes: Vec<StopParentReport>,
    /// The test runner's run: its input and answer.
    pub test_runner: Option<String>,
    pub your_workflow_example: Option<String>,
    /// The Express fragment and the Distributed Map example on the example lock (#27).
    pub express_and_map: Option<String>,
    /// The consumer stack's machine, created after the deploy: one execution stopped mid-work
    /// and cleaned up by the semaphore's cleanup.
    pub consumer_stack: Option<String>,
    /// The consumer stack's machine the run started some executions on.
    pub consumer_machine: Option<String>,
    pub transitions: Option<TransitionsReport>,
    /// A long wait with a big input: its history's events and its tasks' payload sizes.
    pub history_probe: Option<HistoryProbeReport>,
    /// The waiting line: grant order, hand-off latency, what waiting cost.
    pub line: Option<crate::line::LineReport>,
    pub wall_seconds: f64,
    pub logs: String,
    /// Each planned execution's lock (an index into `locks`), for the run's picture.
    #[serde(skip)]
    pub lock_of: std::collections::BTreeMap<String, usize>,
    /// The HTML report with the run's charts (`picture`), once written.
    pub html_report: Option<String>,
    pub checks: Vec<Check>,
    pub ok: bool,
}

impl Report {
    pub fn check(&mut self, name: &str, ok: bool, detail: String) {
        self.checks.push(Check::new(name, ok, detail));
    }

    /// Per lock: S1 (holders, weight, every read consistent), the start rate if one was asked
    /// for, S2 (no slot held at the end) and, where the protocol has them, fencing tokens.
    pub fn lock_checks(&mut self) {
        let (consistent, after) = if self.protocol == "sample" {
            (
                "the stored count = the holders",
                "no sweeper in this protocol",
            )
        } else if self.layout == "gate" {
            (
                "format 8, the held holding items' weights <= the limit, their count and sum = the \
                 gate's (on reads whose gate version did not move), each token distinct and within \
                 the version",
                "after the final sweep",
            )
        } else {
            (
                "format 7, used = the sum of the holders' weights <= the limit, held_bytes = \
                 their entries' bytes, each holder's token distinct and within the version",
                "after the final sweep",
            )
        };
        for l in self.locks.clone() {
            self.check(
                &format!("S1 safety [{}]", l.lock),
                l.max_holders <= l.limit
                    && l.max_weight <= l.limit as u64
                    && l.inconsistent_reads == 0,
                format!(
                    "at most {} holders and weight {} of {} held at once over {} reads; every read \
                     consistent ({}){}",
                    l.max_holders,
                    l.max_weight,
                    l.limit,
                    l.reads,
                    consistent,
                    l.first_inconsistency
                        .as_ref()
                        .map(|m| format!(" EXCEPT: {m}"))
                        .unwrap_or_default()
                ),
            );
            if let Some(r) = &l.rate {
                self.check(
                    &format!("start rate [{}]", l.lock),
                    r.ok() && r.starts > 0,
                    format!(
                        "{} starts at {}/s (spacing {} ms): at most {} in any 1 s (<= {:.0}), {} in \
                         any 10 s (<= {:.0}), least spacing {} (>= {} ms); achieved {}",
                        r.starts,
                        r.rate_per_s,
                        r.spacing_ms,
                        r.max_in_1s,
                        r.bound(1.0),
                        r.max_in_10s,
                        r.bound(10.0),
                        r.min_spacing_ms
                            .map_or("-".to_owned(), |ms| format!("{ms} ms")),
                        r.spacing_ms,
                        r.achieved_per_s
                            .map_or("-".to_owned(), |a| format!("{a:.2}/s"))
                    ),
                );
            }
            self.check(
                &format!("S2 no leak [{}]", l.lock),
                l.leaked_at_end == 0,
                format!(
                    "{} slots held at the end, {after} ({} when the last execution ended){}",
                    l.leaked_at_end,
                    l.holders_when_all_ended,
                    held_by(&l.leaked_holders)
                ),
            );
            if l.fencing_tokens_unique.is_none() {
                continue;
            }
            self.check(
                &format!("fencing tokens [{}]", l.lock),
                l.fencing_tokens_unique == Some(true),
                format!(
                    "each of its {} succeeded executions returned a distinct fencing token",
                    l.succeeded
                ),
            );
        }
    }

    /// L1: every execution ended as its role planned, before the run's timeout.
    pub fn progress_check(&mut self, timed_out: bool) {
        let (n, unexpected) = (self.executions.total, self.executions.unexpected);
        self.check(
            "L1 progress",
            unexpected == 0 && !timed_out,
            format!(
                "{} of {n} executions ended as planned{}",
                n - unexpected,
                if timed_out {
                    " (TIMED OUT waiting)"
                } else {
                    ""
                }
            ),
        );
    }

    pub fn finish(&mut self) {
        self.ok = self.checks.iter().all(|c| c.ok);
    }

    pub fn render(&self) -> String {
        let mut out = String::new();
        let mut line = |label: &str, text: String| {
            out.push_str(&format!("  {label:<18}{text}\n"));
        };
        let title = if self.protocol == "sample" {
            "the ORIGINAL SAMPLE's protocol (sample mode, test-only)"
        } else if self.layout == "gate" {
            "this project's versioned, fenced semaphore, gate layout"
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
        let locks: Vec<String> = self
            .locks
            .iter()
            .map(|l| {
                format!(
                    "\"{}\" limit {}{}",
                    l.lock,
                    l.limit,
                    if l.default && self.locks.len() > 1 {
                        " (the template's default)"
                    } else {
                        ""
                    }
                )
            })
            .collect();
        let mut head = format!(
            "Local run report: {title}\n  {} {}, seed {}{timing}\n",
            if self.locks.len() == 1 {
                "lock"
            } else {
                "locks"
            },
            locks.join(", "),
            self.seed
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
        if let Some(machine) = &self.consumer_machine {
            line(
                "consumer stack",
                format!(
                    "{} of them on {machine} (examples/consumer, a stack of its own deployed after \
                     the semaphore's, under its prefix; its work a Lambda function): {} succeeded",
                    e.consumer, e.consumer_succeeded
                ),
            );
        }
        for example in e.unexpected_examples.iter().take(5) {
            line("", format!("unexpected: {example}"));
        }
        for l in &self.locks {
            let chosen = if l.default {
                "input names no lock"
            } else {
                "configured by its operator with its limit; the input names it and asks for one more"
            };
            line(
                &format!("lock {}", l.lock),
                format!(
                    "{} executions ({chosen}), {} succeeded{}",
                    l.executions,
                    l.succeeded,
                    match l.fencing_tokens_unique {
                        Some(true) => ", their fencing tokens all distinct",
                        Some(false) => ", DUPLICATE fencing tokens",
                        None => "",
                    }
                ),
            );
            if !l.weights.is_empty() {
                let asked: Vec<String> = l
                    .weights
                    .iter()
                    .map(|(w, n)| format!("{n} x weight {w}"))
                    .collect();
                line(
                    "  max weight held",
                    format!(
                        "{}/{} (inputs asked for {}; every read: used = the holders' weights)",
                        l.max_weight,
                        l.limit,
                        asked.join(", ")
                    ),
                );
            }
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
        let fates = if self.protocol == "sample" {
            // The sample has no fences: its write is refused only by "full" or "held".
            format!("{} refused (full or already held)", d.refused())
        } else {
            format!(
                "{} refused by a fence, {} refused by the horizon, {} refused otherwise (full, \
                 start rate or already held)",
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
        if self.protocol != "sample" {
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
        if let Some(w) = &self.work {
            line(
                "work",
                format!(
                    "{} child executions ({}): {} ended while their parent held its slot{}, {} \
                     did not",
                    w.children,
                    w.machine,
                    w.ended_under_the_slot,
                    w.min_margin_ms
                        .map(|m| format!(" (closest: {m} ms before the slot was freed)"))
                        .unwrap_or_default(),
                    w.violations.len()
                ),
            );
            for v in w.violations.iter().take(5) {
                line("", format!("NOT under the slot: {v}"));
            }
            line(
                "stopped parents",
                format!(
                    "{} parents stopped mid-work, their child still running (moto, like AWS \
                     at times, does not stop it): {} children stopped by the cleanup before it \
                     freed the slot, {} ended on their own first",
                    w.stopped_parents.len(),
                    w.children_stopped,
                    w.children_ended_on_their_own
                ),
            );
            for s in w.stopped_parents.iter().take(10) {
                line("", s.clone());
            }
        }
        if let Some(t) = &self.transitions {
            line(
                "transitions",
                format!(
                    "one uncontended critical section: {} in the lock-protected machine ({}), \
                     {} in the work ({}); the semaphore's share {}",
                    t.protected.len(),
                    t.protected.join(", "),
                    t.work.len(),
                    t.work.join(", "),
                    t.semaphore_share
                ),
            );
        }
        if let Some(l) = &self.line {
            line(
                "waiting line",
                format!(
                    "{} executions waited and were granted a slot: {} woken by a hand-off, {} \
                     found it on their own check; {} fallback checks, {} waits for the start rate",
                    l.waiters_granted,
                    l.woken_by_hand_off,
                    l.granted_on_own_check,
                    l.fallback_checks,
                    l.rate_waits
                ),
            );
            let ms = |v: Option<i64>| v.map_or("-".to_owned(), |v| format!("{v} ms"));
            line(
                "hand-off",
                format!(
                    "slot freed to waiter resumed: p50 {}, p99 {}, max {}",
                    ms(l.hand_off_p50_ms),
                    ms(l.hand_off_p99_ms),
                    ms(l.hand_off_max_ms)
                ),
            );
            let s = |v: Option<f64>| v.map_or("-".to_owned(), |v| format!("{v:.1} s"));
            line(
                "waits",
                format!(
                    "longest {}, mean {} (from asking to entering the work)",
                    s(l.longest_wait_s),
                    s(l.mean_wait_s)
                ),
            );
            let per = |v: Option<f64>| v.map_or("-".to_owned(), |v| format!("{v:.2}"));
            line(
                "waiting cost",
                format!(
                    "{} transitions over {:.1} waiter-minutes: {} per waiting minute (attempts \
                     of the acquire state after the first: checks and retries); polling in \
                     a Wait loop would have made {:.0}: {} per waiting minute",
                    l.transitions_waiting,
                    l.waiting_minutes,
                    per(l.transitions_per_waiting_minute),
                    l.polling_transitions,
                    per(l.polling_transitions_per_waiting_minute)
                ),
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
        if let Some(path) = &self.html_report {
            text.push_str(&format!("HTML report: {path}\n"));
        }
        text
    }
}

/// ": still held by a, b, ..." for the first five holders left at the end; empty for none.
pub fn held_by(holders: &[String]) -> String {
    if holders.is_empty() {
        return String::new();
    }
    let names: Vec<&str> = holders.iter().take(5).map(|h| short(h)).collect();
    format!(": still held by {}", names.join(", "))
}
