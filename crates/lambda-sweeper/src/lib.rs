//! The sweeper function, run on a schedule: the safety net for a lost status event (F4) and
//! anything unforeseen.
//!
//! Every holder whose execution has ended (`DescribeExecution`), or has not existed for longer
//! than `semaphore_core::MISSING_EXECUTION_GRACE_MS` (the API is eventually consistent), is
//! cleaned up as the cleanup function does, unless its work (a child execution named in the
//! history) still runs. A slot whose lease passed unrenewed is taken back (F13). Each slot
//! reclaimed or taken back is one SNS notice; metrics are EMF lines (`lambda_common::metrics`).
//! A holder that cannot be checked is listed in the answer's `errors`, not a failed sweep.

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

use lambda_common::metrics::{self, Line};
use semaphore_core::{LineSweep, LockName, Reclaimed, TakenBackSlot};

/// The sweep's answer.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SweepSummary {
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
    pub notices_published: usize,
    pub errors: Vec<String>,
}

/// Everything one sweep produced: the answer, the notices sent, and the metric lines (the
/// first: every lock's together).
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
    pub namespace: String,
    /// Wakes the waiters the sweep's hand-offs grant a slot.
    pub waker: TaskWaker<aws_sdk_sfn::Client>,
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
            namespace: settings.metrics().namespace().to_owned(),
            waker: TaskWaker {
                callbacks: aws_sdk_sfn::Client::new(sdk),
            },
        })
    }
}

impl<S: ItemStore, E: ExecutionStatus> Sweeper<S, E> {
    /// One sweep: reclaim, notify, and build the metric line (printing is the handler's).
    pub async fn sweep(&self) -> Result<SweepResult, HandlerError> {
        let started_ms = self.semaphore.now_ms();
        let swept_at = semaphore_core::rfc3339_millis(started_ms);
        let report = self
            .semaphore
            .sweep(&self.executions)
            .await
            .map_err(HandlerError::from)
            .inspect_err(|e| tracing::error!(error = %e, "sweep failed"))?;
        let (largest_item_bytes, largest_item_lock) = match &report.largest_item {
            Some(largest) => (largest.bytes, Some(largest.lock.to_string())),
            None => (0, None),
        };
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
        let mut errors = report.errors;
        errors.extend(lines.errors.iter().cloned());
        let mut summary = SweepSummary {
            locks: report.locks,
            largest_item_bytes,
            largest_item_lock,
            holders_checked: report.holders_checked,
            reclaimed: report.reclaimed.len(),
            taken_back: taken_back.len(),
            kept_not_found: report.too_young.len(),
            waiters_checked: lines.waiters_checked,
            waiters_removed: lines.removed.len(),
            woken: lines.woken,
            notices_published: 0,
            errors,
        };
        let mut notices = Vec::with_capacity(report.reclaimed.len() + taken_back.len());
        let every = report
            .reclaimed
            .iter()
            .map(|slot| Notice::new(slot, &swept_at))
            .chain(
                taken_back
                    .iter()
                    .map(|slot| Notice::taken_back(slot, &swept_at)),
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
                "freed a slot its holder did not release"
            );
            match self.publish(&notice).await {
                Ok(()) => summary.notices_published += 1,
                Err(e) => {
                    tracing::error!(lock = %notice.lock, holder = %notice.holder, error = %e, "notice not published");
                    summary.errors.push(format!(
                        "notice for {} on {} not published: {e}",
                        notice.holder, notice.lock
                    ));
                }
            }
            notices.push(notice);
        }
        for error in &summary.errors {
            tracing::warn!(error = %error, "sweep problem; the next sweep retries");
        }
        let emf = metric_lines(&report.reclaimed, &taken_back, &lines, &summary, started_ms)
            .iter()
            .map(|line| line.render(&self.namespace, started_ms))
            .collect();
        tracing::info!(
            locks = summary.locks,
            largest_item_bytes = summary.largest_item_bytes,
            largest_item_lock = summary.largest_item_lock.as_deref().unwrap_or(""),
            holders_checked = summary.holders_checked,
            reclaimed = summary.reclaimed,
            taken_back = summary.taken_back,
            waiters_checked = summary.waiters_checked,
            waiters_removed = summary.waiters_removed,
            woken = summary.woken,
            notices_published = summary.notices_published,
            errors = summary.errors.len(),
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

/// The sweep's metric lines: every lock's together first (zeros included, so that the alarms
/// see data rather than missing data), then one per lock with something to say.
fn metric_lines(
    reclaimed: &[Reclaimed],
    taken_back: &[TakenBackSlot],
    lines: &LineSweep,
    summary: &SweepSummary,
    now_ms: u64,
) -> Vec<Line> {
    let age = |since: u64| now_ms.saturating_sub(since) as f64 / 1000.0;
    let oldest = lines.oldest.iter().map(|(_, since)| *since).min();
    let mut out = vec![Line::stack_wide()
        .value(metrics::RECLAIMED_SLOTS_TOTAL, summary.reclaimed as f64)
        .value(
            metrics::LARGEST_ITEM_BYTES,
            summary.largest_item_bytes as f64,
        )
        .value(metrics::OLDEST_WAITER_AGE_TOTAL, oldest.map_or(0.0, age))];
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
    let result = sweeper.sweep().await?;
    for line in &result.emf {
        println!("{line}");
    }
    Ok(result.summary)
}
