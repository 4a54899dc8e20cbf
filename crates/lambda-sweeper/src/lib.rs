//! The sweeper function, run on a schedule: the safety net for a lost status event (F4) and
//! anything unforeseen.
//!
//! Every holder whose execution has ended (`DescribeExecution`), or has not existed for longer
//! than `semaphore_core::MISSING_EXECUTION_GRACE_MS` (the API is eventually consistent), is
//! cleaned up as the cleanup function does, unless its work (a child execution named in the
//! history) still runs. A slot whose lease passed unrenewed is taken back (F13). Each slot
//! reclaimed or taken back is one SNS notice; metrics are EMF lines (`lambda_common::metrics`).
//! A holder that cannot be checked is listed in the answer's `errors`, not a failed sweep; one
//! whose history is too long to judge keeps its slot and is a `not_judged` notice. The table is
//! swept a page at a time, each page's notices and metric lines written before the next is read,
//! so the function's memory does not grow with the number of locks.

pub mod notice;

use aws_sdk_sns::error::DisplayErrorContext;
use lambda_common::{ConfigError, HandlerError, Settings, TaskWaker};
use lambda_runtime::LambdaEvent;
use semaphore_core::{DynamoStore, ExecutionStatus, ItemStore, Semaphore};
use serde::{Deserialize, Serialize};
use serde_json::Value;

pub use lambda_common::arn::{self, ArnPatterns, ExecutionArn, ExecutionKind, StateMachineArn};
pub use lambda_common::metrics::DEFAULT_NAMESPACE;
pub use lambda_common::SfnExecutions;
pub use notice::{human_duration, subject, Notice, NoticeKind};

use lambda_common::metrics::{self, Line, Metrics};
use semaphore_core::{LineSweep, LockName, Reclaimed, TakenBackSlot};

/// The sweep's answer: counts, the largest item, and at most [`KEPT_ERRORS`] errors, whatever
/// the number of locks.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SweepSummary {
    /// Pages of the table read (one `Scan` request each, at most 1 MB of items).
    #[serde(default)]
    pub pages: usize,
    pub locks: usize,
    /// The biggest semaphore item scanned (0 and `None` when there is none yet).
    pub largest_item_bytes: usize,
    pub largest_item_lock: Option<String>,
    pub holders_checked: usize,
    pub reclaimed: usize,
    /// Slots taken back because their lease had passed unrenewed (F13), by the sweep or its
    /// hand-offs.
    #[serde(default)]
    pub taken_back: usize,
    /// Holders whose execution was not found but which acquired less than
    /// `MISSING_EXECUTION_GRACE_MS` ago (DescribeExecution is eventually consistent): kept, a
    /// later sweep asks again.
    #[serde(default)]
    pub kept_not_found: usize,
    /// Waiters near the head of a line whose execution was checked.
    #[serde(default)]
    pub waiters_checked: usize,
    /// Of those, taken out of line because their execution had ended.
    #[serde(default)]
    pub waiters_removed: usize,
    /// Waiters woken with a slot the sweep handed on.
    #[serde(default)]
    pub woken: usize,
    /// Slots of ended executions kept because their history was too long to judge: each is a
    /// notice (`not_judged`) every sweep until an operator judges it.
    #[serde(default)]
    pub not_judged: usize,
    pub notices_published: usize,
    /// The first [`KEPT_ERRORS`] problems (each is also logged); `errors_left_out` counts the
    /// rest.
    pub errors: Vec<String>,
    #[serde(default)]
    pub errors_left_out: usize,
}

/// Errors a [`SweepSummary`] keeps: the answer of a sweep of 50,000 unreadable items stays
/// small (every one is logged).
pub const KEPT_ERRORS: usize = 100;

/// Notices a [`SweepResult`] keeps for its caller (every one is published).
pub const KEPT_NOTICES: usize = 100;

/// Per-lock metric lines a [`SweepResult`] keeps for its caller (every one is written).
pub const KEPT_LINES: usize = 100;

impl SweepSummary {
    fn error(&mut self, error: String) {
        tracing::warn!(error = %error, "sweep problem; the next sweep retries");
        if self.errors.len() < KEPT_ERRORS {
            self.errors.push(error);
        } else {
            self.errors_left_out += 1;
        }
    }
}

/// What one sweep produced: the answer, the first [`KEPT_NOTICES`] notices sent, and the metric
/// lines (the first: every lock's together, then the first [`KEPT_LINES`] per-lock lines; every
/// line is written as the sweep goes, page by page, and every lock's last).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SweepResult {
    pub summary: SweepSummary,
    pub notices: Vec<Notice>,
    pub emf: Vec<String>,
}

/// The sweeper's dependencies, built once per cold start.
#[derive(Debug, Clone)]
pub struct Sweeper<S, E> {
    pub semaphore: Semaphore<S>,
    pub executions: E,
    pub sns: aws_sdk_sns::Client,
    pub topic_arn: String,
    /// Wakes the waiters the sweep's hand-offs grant a slot.
    pub waker: TaskWaker<aws_sdk_sfn::Client>,
    /// Where the metric lines are written (stdout, as EMF, in the function's namespace,
    /// `METRIC_NAMESPACE`).
    pub metrics: Metrics,
}

impl Sweeper<DynamoStore, SfnExecutions> {
    /// From `TABLE_NAME`, the timing (`ACQUIRE_HORIZON_SECONDS`, `CLOCK_SKEW_SECONDS`),
    /// `TOPIC_ARN` (required), `METRIC_NAMESPACE` (default [`DEFAULT_NAMESPACE`]), and
    /// `PROTECTED_STATE_MACHINES` (optional): the machines whose executions are judged (the
    /// stack's and those under its prefix); unset judges every execution.
    pub fn from_settings<F: Fn(&str) -> Option<String>>(
        settings: &Settings<F>,
        sdk: &aws_config::SdkConfig,
    ) -> Result<Self, ConfigError> {
        let semaphore = settings.semaphore(sdk)?;
        let topic_arn = settings.required(
            "TOPIC_ARN",
            "set it to the ARN of the SNS topic that gets a notice per reclaimed slot",
        )?;
        let state_machines = settings.protected_machines()?;
        Ok(Self {
            semaphore,
            executions: SfnExecutions::of_machines(aws_sdk_sfn::Client::new(sdk), state_machines),
            sns: aws_sdk_sns::Client::new(sdk),
            topic_arn,
            waker: TaskWaker {
                callbacks: aws_sdk_sfn::Client::new(sdk),
            },
            metrics: settings.metrics(),
        })
    }
}

impl<S: ItemStore, E: ExecutionStatus> Sweeper<S, E> {
    /// One sweep, page by page of the table: each page's locks judged, reclaimed, their lines
    /// moved, notices published and metric lines written before the next page is read, so the
    /// sweep holds one page (and the counts) at any number of locks; then every lock's line.
    pub async fn sweep(&self) -> Result<SweepResult, HandlerError> {
        let started_ms = self.semaphore.now_ms();
        let swept_at = semaphore_core::rfc3339_millis(started_ms);
        let mut summary = SweepSummary::default();
        let mut notices = Vec::new();
        let mut lock_lines = Vec::new();
        let mut largest_item_bytes = None;
        let mut oldest_waiter: Option<u64> = None;
        let mut after = None;
        loop {
            let report = self
                .semaphore
                .sweep_page(&self.executions, after.as_ref())
                .await
                .map_err(HandlerError::from)
                .inspect_err(|e| tracing::error!(error = %e, "sweep failed"))?;
            // The lines after the holders: a slot the sweep freed goes to the head of its line.
            let lines = self
                .semaphore
                .sweep_lines(&report.lines, &self.executions, &self.waker)
                .await
                .map_err(HandlerError::from)
                .inspect_err(|e| tracing::error!(error = %e, "sweep of the lines failed"))?;
            for (lock, holder) in &lines.removed {
                tracing::warn!(lock = %lock, holder = %holder, "took a dead waiter out of line");
            }
            // F13: the sweep's take-backs and its hand-offs' (a head that did not fit).
            let taken_back = self.semaphore.drain_taken_back();
            summary.pages += report.pages;
            summary.locks += report.locks;
            if let Some(largest) = &report.largest_item {
                if largest_item_bytes.is_none_or(|bytes| largest.bytes > bytes) {
                    largest_item_bytes = Some(largest.bytes);
                    summary.largest_item_bytes = largest.bytes;
                    summary.largest_item_lock = Some(largest.lock.to_string());
                }
            }
            summary.holders_checked += report.holders_checked;
            summary.reclaimed += report.reclaimed.len();
            summary.taken_back += taken_back.len();
            summary.kept_not_found += report.too_young.len();
            summary.not_judged += report.unjudged.len();
            summary.waiters_checked += lines.waiters_checked;
            summary.waiters_removed += lines.removed.len();
            summary.woken += lines.woken;
            for error in report.errors.iter().chain(&lines.errors) {
                summary.error(error.clone());
            }
            if let Some(page_oldest) = lines.oldest.iter().map(|(_, since)| *since).min() {
                oldest_waiter = Some(oldest_waiter.map_or(page_oldest, |o| o.min(page_oldest)));
            }
            let every = report
                .reclaimed
                .iter()
                .map(|slot| Notice::new(slot, &swept_at))
                .chain(
                    taken_back
                        .iter()
                        .map(|slot| Notice::taken_back(slot, &swept_at)),
                )
                .chain(
                    report
                        .unjudged
                        .iter()
                        .map(|slot| Notice::not_judged(slot, &swept_at)),
                );
            for notice in every {
                tracing::warn!(
                    kind = notice.kind.as_str(),
                    lock = %notice.lock,
                    holder = %notice.holder,
                    acquisition = %notice.acquisition,
                    token = notice.token,
                    held_for_ms = notice.held_for_ms,
                    reason = %notice.reason,
                    "{}",
                    notice.kind.what()
                );
                match self.publish(&notice).await {
                    Ok(()) => summary.notices_published += 1,
                    Err(e) => {
                        tracing::error!(lock = %notice.lock, holder = %notice.holder, error = %e, "notice not published");
                        summary.error(format!(
                            "notice for {} on {} not published: {e}",
                            notice.holder, notice.lock
                        ));
                    }
                }
                if notices.len() < KEPT_NOTICES {
                    notices.push(notice);
                }
            }
            for line in lock_metric_lines(&report.reclaimed, &taken_back, &lines, started_ms) {
                self.metrics.emit(started_ms, &line);
                if lock_lines.len() < KEPT_LINES {
                    lock_lines.push(line.render(self.metrics.namespace(), started_ms));
                }
            }
            match report.next {
                Some(next) => after = Some(next),
                None => break,
            }
        }
        let every_lock = stack_wide_line(&summary, oldest_waiter, started_ms);
        self.metrics.emit(started_ms, &every_lock);
        let mut emf = vec![every_lock.render(self.metrics.namespace(), started_ms)];
        emf.extend(lock_lines);
        tracing::info!(
            pages = summary.pages,
            locks = summary.locks,
            largest_item_bytes = summary.largest_item_bytes,
            largest_item_lock = summary.largest_item_lock.as_deref().unwrap_or(""),
            holders_checked = summary.holders_checked,
            reclaimed = summary.reclaimed,
            taken_back = summary.taken_back,
            not_judged = summary.not_judged,
            waiters_checked = summary.waiters_checked,
            waiters_removed = summary.waiters_removed,
            woken = summary.woken,
            notices_published = summary.notices_published,
            errors = summary.errors.len() + summary.errors_left_out,
            "swept"
        );
        Ok(SweepResult {
            summary,
            notices,
            emf,
        })
    }

    async fn publish(&self, notice: &Notice) -> Result<(), PublishError> {
        let message = serde_json::to_string(notice)?;
        self.sns
            .publish()
            .topic_arn(&self.topic_arn)
            .subject(notice.subject())
            .message(message)
            .send()
            .await
            .map(|_| ())
            .map_err(|e| PublishError::Sns {
                topic: self.topic_arn.clone(),
                cause: e.into(),
            })
    }
}

/// A reclaim notice that did not reach its topic; the slot is reclaimed all the same.
#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    #[error("the notice could not be written as JSON: {0}")]
    Json(#[from] serde_json::Error),
    /// The SDK's error is in the message, whole, and not also a `source()` (a chain printed
    /// whole would name it twice).
    #[error("SNS Publish to {topic} failed: {}", DisplayErrorContext(cause.as_ref()))]
    Sns {
        topic: String,
        cause: Box<dyn std::error::Error + Send + Sync>,
    },
}

/// Every lock's line, once per sweep (zeros included, so that the alarms see data rather than
/// missing data).
fn stack_wide_line(summary: &SweepSummary, oldest_waiter: Option<u64>, now_ms: u64) -> Line {
    let age = |since: u64| now_ms.saturating_sub(since) as f64 / 1000.0;
    Line::stack_wide()
        .value(metrics::RECLAIMED_SLOTS_TOTAL, summary.reclaimed as f64)
        .value(
            metrics::LARGEST_ITEM_BYTES,
            summary.largest_item_bytes as f64,
        )
        .value(
            metrics::OLDEST_WAITER_AGE_TOTAL,
            oldest_waiter.map_or(0.0, age),
        )
        .value(metrics::SLOTS_NOT_JUDGED, summary.not_judged as f64)
}

/// A page's per-lock lines: one per lock with something to say, then the take-backs' and the
/// hand-offs'.
fn lock_metric_lines(
    reclaimed: &[Reclaimed],
    taken_back: &[TakenBackSlot],
    lines: &LineSweep,
    now_ms: u64,
) -> Vec<Line> {
    let age = |since: u64| now_ms.saturating_sub(since) as f64 / 1000.0;
    let mut out = Vec::new();
    let mut locks: Vec<&LockName> = reclaimed.iter().map(|slot| &slot.lock).collect();
    locks.extend(lines.oldest.iter().map(|(lock, _)| lock));
    locks.extend(lines.removed.iter().map(|(lock, _)| lock));
    locks.sort();
    locks.dedup();
    for lock in locks {
        let held: Vec<f64> = reclaimed
            .iter()
            .filter(|slot| &slot.lock == lock)
            .map(|slot| slot.held_for_ms as f64)
            .collect();
        let removed = lines.removed.iter().filter(|(l, _)| l == lock).count();
        let mut line = Line::of(lock).values(
            metrics::OLDEST_WAITER_AGE,
            lines
                .oldest
                .iter()
                .filter(|(l, _)| l == lock)
                .map(|(_, since)| age(*since)),
        );
        if !held.is_empty() {
            line = line
                .value(metrics::RECLAIMED_SLOTS, held.len() as f64)
                .values(metrics::TIME_HELD, held);
        }
        if removed > 0 {
            line = line.value(metrics::DEAD_WAITERS_REMOVED, removed as f64);
        }
        out.push(line);
    }
    out.extend(metrics::taken_back_lines(taken_back));
    out.extend(
        lines
            .hand_offs
            .iter()
            .map(|(lock, handed)| metrics::hand_off_line(lock, handed))
            .filter(|line| !line.is_empty()),
    );
    out
}

/// The Lambda handler: sweeps, prints the EMF metric lines, answers the summary.
pub async fn handle<S: ItemStore, E: ExecutionStatus>(
    sweeper: &Sweeper<S, E>,
    _event: LambdaEvent<Value>,
) -> Result<SweepSummary, HandlerError> {
    // The metric lines are written as the sweep goes.
    Ok(sweeper.sweep().await?.summary)
}
