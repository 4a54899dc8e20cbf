//! The sweeper function, run on a schedule: the safety net for a lost status event (F4) and
//! anything unforeseen.
//!
//! For every holder of every semaphore it asks Step Functions (`DescribeExecution`) whether the
//! execution still runs. A holder whose execution has ended, or no longer exists, is released
//! through the same core cleanup as the cleanup function (so it is fenced too), unless the work
//! it ran under the slot still runs: an ended execution's history (`GetExecutionHistory`, read
//! as the cleanup function reads it) names its child executions, and while one of them runs (a
//! Lambda function invoked by the work-function runner cannot be stopped, and Step Functions
//! stops a user's child only on a best-effort basis) the slot is kept for the next sweep. For
//! each slot reclaimed an SNS notice goes to `TOPIC_ARN`, and every sweep prints the
//! `ReclaimedSlots` and `LargestItemBytes` metrics as an EMF log line (zeros included). The
//! cost grows with the current holders only (a history is read for ended holders only).
//!
//! Input: any JSON (the schedule's event). Answer: `{"locks": n, "largest_item_bytes": n,
//! "largest_item_lock": name or null, "holders_checked": n, "reclaimed": n,
//! "notices_published": n, "errors": [..]}`; a holder that could not be checked
//! or a notice that could not be published is listed in `errors` and does not fail the sweep.
//! Errors: `SemaphoreStoreError` when the table cannot be read.

pub mod notice;

use std::time::{SystemTime, UNIX_EPOCH};

use lambda_common::history;
use lambda_common::sfn::{
    child_state, may_still_start, ChildState, Described, Executions, SfnClient,
};
use lambda_common::{ConfigError, HandlerError, Settings};
use lambda_runtime::LambdaEvent;
use semaphore_core::{
    DynamoStore, ExecutionState, ExecutionStatus, HolderId, ItemStore, Semaphore,
};
use serde::{Deserialize, Serialize};
use serde_json::Value;

pub use lambda_common::arn::{self, ExecutionArn, ExecutionKind, StateMachineArn};
pub use notice::{
    emf_line, human_duration, subject, Notice, DEFAULT_NAMESPACE, ITEM_BYTES_METRIC_NAME,
    METRIC_NAME,
};

/// Execution states from `DescribeExecution`, and for an ended execution whether its work
/// still runs (from its history).
#[derive(Debug, Clone)]
pub struct SfnExecutions {
    sfn: SfnClient,
    /// When not empty, only executions of these state machines are judged; other holders are
    /// left alone like operator ids (the function may describe these machines' executions
    /// only).
    state_machines: Vec<StateMachineArn>,
}

impl SfnExecutions {
    /// Judges the executions of `state_machine`, or every execution when `None`.
    pub fn new(client: aws_sdk_sfn::Client, state_machine: Option<StateMachineArn>) -> Self {
        Self::of_machines(client, state_machine.into_iter().collect())
    }

    /// Judges the executions of these state machines, or every execution when empty.
    pub fn of_machines(client: aws_sdk_sfn::Client, state_machines: Vec<StateMachineArn>) -> Self {
        Self {
            sfn: SfnClient::new(client),
            state_machines,
        }
    }

    /// A child execution of the ended `parent` that still runs (or whose start was in flight
    /// when the parent ended, just now), if any.
    async fn running_work(
        &self,
        parent: &str,
        described: &Described,
    ) -> Result<Option<String>, String> {
        let Some(events) = self.sfn.history(parent).await.map_err(|e| e.to_string())? else {
            return Ok(None);
        };
        let now_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        for child in history::read(&events, None).children {
            match child_state(&self.sfn, &child)
                .await
                .map_err(|e| e.to_string())?
            {
                ChildState::Running { .. } => return Ok(Some(child.execution_arn)),
                ChildState::Missing if may_still_start(&child, described.stop_date_ms, now_ms) => {
                    return Ok(Some(child.execution_arn))
                }
                ChildState::Ended { .. } | ChildState::Missing => {}
            }
        }
        Ok(None)
    }
}

impl ExecutionStatus for SfnExecutions {
    async fn describe(&self, holder: &HolderId) -> Result<ExecutionState, String> {
        let Some(arn) = ExecutionArn::parse(holder.as_str()) else {
            return Ok(ExecutionState::NotAnExecution);
        };
        // DescribeExecution does not support Express executions: not ours to judge.
        if arn.kind == ExecutionKind::Express {
            return Ok(ExecutionState::NotAnExecution);
        }
        if !self.state_machines.is_empty() && !self.state_machines.iter().any(|m| m.owns(&arn)) {
            return Ok(ExecutionState::NotAnExecution);
        }
        // This client can only answer for its own region: never take "does not exist" from
        // the wrong region for a verdict.
        let region = self.sfn.client().config().region().map(|r| r.as_ref());
        if region != Some(arn.region.as_str()) {
            return Err(format!(
                "an execution in region {}, and this sweeper runs in {}: not checked",
                arn.region,
                region.unwrap_or("no region")
            ));
        }
        // Only "does not exist" proves the execution is gone; any failure (throttling, access
        // denied...) leaves the holder alone until the next sweep.
        match self
            .sfn
            .describe(holder.as_str())
            .await
            .map_err(|e| e.to_string())?
        {
            None => Ok(ExecutionState::Missing),
            Some(described) if described.is_running() => Ok(ExecutionState::Running),
            Some(described) => match self.running_work(holder.as_str(), &described).await? {
                // Its work still runs under the slot: the slot is not the sweeper's to take.
                Some(child) => {
                    tracing::info!(
                        holder = %holder,
                        status = described.status(),
                        child = %child,
                        "ended, but its work still runs: slot kept until it ends"
                    );
                    Ok(ExecutionState::Running)
                }
                None => Ok(ExecutionState::Ended {
                    status: described.status().to_owned(),
                    last_run: described.run,
                }),
            },
        }
    }
}

/// The sweep's answer.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SweepSummary {
    pub locks: usize,
    /// The biggest semaphore item scanned (0 and `None` when there is none yet).
    pub largest_item_bytes: usize,
    pub largest_item_lock: Option<String>,
    pub holders_checked: usize,
    pub reclaimed: usize,
    pub notices_published: usize,
    pub errors: Vec<String>,
}

/// Everything one sweep produced: the answer, the notices sent, and the metric line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SweepResult {
    pub summary: SweepSummary,
    pub notices: Vec<Notice>,
    pub emf: String,
}

/// The sweeper's dependencies, built once per cold start.
#[derive(Debug, Clone)]
pub struct Sweeper<S, E> {
    pub semaphore: Semaphore<S>,
    pub executions: E,
    pub sns: aws_sdk_sns::Client,
    pub topic_arn: String,
    pub namespace: String,
}

impl Sweeper<DynamoStore, SfnExecutions> {
    /// From `TABLE_NAME`, the timing (`ACQUIRE_HORIZON_SECONDS`, `CLOCK_SKEW_SECONDS`),
    /// `TOPIC_ARN` (required), `METRIC_NAMESPACE` (default [`DEFAULT_NAMESPACE`]), and
    /// `STATE_MACHINE_ARNS` (comma-separated) and `STATE_MACHINE_ARN` (one), both optional: the
    /// machines whose executions are judged (the lock-protected machine and the user's own
    /// machines that take the semaphore); none set judges every execution.
    pub fn from_settings<F: Fn(&str) -> Option<String>>(
        settings: &Settings<F>,
        sdk: &aws_config::SdkConfig,
    ) -> Result<Self, ConfigError> {
        let semaphore = settings.semaphore(sdk)?;
        let topic_arn = settings.required(
            "TOPIC_ARN",
            "set it to the ARN of the SNS topic that gets a notice per reclaimed slot",
        )?;
        let namespace = settings
            .optional("METRIC_NAMESPACE")
            .unwrap_or_else(|| DEFAULT_NAMESPACE.to_owned());
        let mut state_machines: Vec<StateMachineArn> = Vec::new();
        for name in ["STATE_MACHINE_ARN", "STATE_MACHINE_ARNS"] {
            for machine in settings.list(name, |part| {
                StateMachineArn::parse(part).ok_or_else(|| {
                    format!(
                        "{part:?}: expected arn:<partition>:states:<region>:<account>:stateMachine:<name>, or unset to judge every execution"
                    )
                })
            })? {
                if !state_machines.contains(&machine) {
                    state_machines.push(machine);
                }
            }
        }
        Ok(Self {
            semaphore,
            executions: SfnExecutions::of_machines(aws_sdk_sfn::Client::new(sdk), state_machines),
            sns: aws_sdk_sns::Client::new(sdk),
            topic_arn,
            namespace,
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
        let mut summary = SweepSummary {
            locks: report.locks,
            largest_item_bytes,
            largest_item_lock,
            holders_checked: report.holders_checked,
            reclaimed: report.reclaimed.len(),
            notices_published: 0,
            errors: report.errors,
        };
        let mut notices = Vec::with_capacity(report.reclaimed.len());
        for slot in &report.reclaimed {
            let notice = Notice::new(slot, &swept_at);
            tracing::warn!(
                lock = %notice.lock,
                holder = %notice.holder,
                acquisition = %notice.acquisition,
                token = notice.token,
                held_for_ms = notice.held_for_ms,
                reason = %notice.reason,
                "reclaimed a leaked slot"
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
        let emf = emf_line(
            &self.namespace,
            summary.reclaimed,
            summary.largest_item_bytes,
            started_ms,
        );
        tracing::info!(
            locks = summary.locks,
            largest_item_bytes = summary.largest_item_bytes,
            largest_item_lock = summary.largest_item_lock.as_deref().unwrap_or(""),
            holders_checked = summary.holders_checked,
            reclaimed = summary.reclaimed,
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

    async fn publish(&self, notice: &Notice) -> Result<(), String> {
        let message = serde_json::to_string(notice).map_err(|e| e.to_string())?;
        self.sns
            .publish()
            .topic_arn(&self.topic_arn)
            .subject(notice.subject())
            .message(message)
            .send()
            .await
            .map(|_| ())
            .map_err(|e| aws_sdk_sns::error::DisplayErrorContext(e).to_string())
    }
}

/// The Lambda handler: sweeps, prints the EMF metric line, answers the summary.
pub async fn handle<S: ItemStore, E: ExecutionStatus>(
    sweeper: &Sweeper<S, E>,
    _event: LambdaEvent<Value>,
) -> Result<SweepSummary, HandlerError> {
    let result = sweeper.sweep().await?;
    println!("{}", result.emf);
    Ok(result.summary)
}
