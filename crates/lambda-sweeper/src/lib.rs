//! The sweeper function, run on a schedule: the safety net for a lost status event (F4) and
//! anything unforeseen.
//!
//! For every holder of every semaphore it asks Step Functions (`DescribeExecution`) whether the
//! execution still runs. A holder whose execution has ended, or no longer exists, is released
//! through the same core cleanup as the cleanup function (so it is fenced too); for each slot so
//! reclaimed an SNS notice goes to `TOPIC_ARN`, and every sweep prints the `ReclaimedSlots` and
//! `LargestItemBytes` metrics as an EMF log line (zeros included). The cost grows with the
//! current holders only.
//!
//! Input: any JSON (the schedule's event). Answer: `{"locks": n, "largest_item_bytes": n,
//! "largest_item_lock": name or null, "holders_checked": n, "reclaimed": n,
//! "notices_published": n, "errors": [..]}`; a holder that could not be checked
//! or a notice that could not be published is listed in `errors` and does not fail the sweep.
//! Errors: `SemaphoreStoreError` when the table cannot be read.

pub mod arn;
pub mod notice;

use aws_sdk_sfn::error::{DisplayErrorContext, SdkError};
use aws_sdk_sfn::operation::describe_execution::DescribeExecutionError;
use aws_sdk_sfn::types::ExecutionStatus as SfnStatus;
use lambda_common::{ConfigError, HandlerError, Settings};
use lambda_runtime::LambdaEvent;
use semaphore_core::{
    DynamoStore, ExecutionState, ExecutionStatus, HolderId, ItemStore, Semaphore,
};
use serde::{Deserialize, Serialize};
use serde_json::Value;

pub use arn::{ExecutionArn, ExecutionKind, StateMachineArn};
pub use notice::{
    emf_line, human_duration, subject, Notice, DEFAULT_NAMESPACE, ITEM_BYTES_METRIC_NAME,
    METRIC_NAME,
};

/// Execution states from `DescribeExecution`.
#[derive(Debug, Clone)]
pub struct SfnExecutions {
    client: aws_sdk_sfn::Client,
    /// When set, only executions of this state machine are judged; other holders are left
    /// alone like operator ids (the function may describe this machine's executions only).
    state_machine: Option<StateMachineArn>,
}

impl SfnExecutions {
    pub fn new(client: aws_sdk_sfn::Client, state_machine: Option<StateMachineArn>) -> Self {
        Self {
            client,
            state_machine,
        }
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
        if let Some(machine) = &self.state_machine {
            if !machine.owns(&arn) {
                return Ok(ExecutionState::NotAnExecution);
            }
        }
        // This client can only answer for its own region: never take "does not exist" from
        // the wrong region for a verdict.
        let region = self.client.config().region().map(|r| r.as_ref());
        if region != Some(arn.region.as_str()) {
            return Err(format!(
                "an execution in region {}, and this sweeper runs in {}: not checked",
                arn.region,
                region.unwrap_or("no region")
            ));
        }
        let described = self
            .client
            .describe_execution()
            .execution_arn(holder.as_str())
            .send()
            .await;
        match described {
            Ok(execution) => Ok(match execution.status() {
                // A redrive in progress resumes the same execution (same ARN): still running.
                SfnStatus::Running | SfnStatus::PendingRedrive => ExecutionState::Running,
                ended => ExecutionState::Ended {
                    status: ended.as_str().to_owned(),
                },
            }),
            // Only this answer proves the execution is gone; anything else (throttling, access
            // denied, an ARN of another region...) leaves the holder alone until the next sweep.
            Err(SdkError::ServiceError(e))
                if matches!(e.err(), DescribeExecutionError::ExecutionDoesNotExist(_)) =>
            {
                Ok(ExecutionState::Missing)
            }
            Err(e) => Err(format!(
                "DescribeExecution failed: {}",
                DisplayErrorContext(e)
            )),
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
    /// `TOPIC_ARN` (required), `METRIC_NAMESPACE`
    /// (default [`DEFAULT_NAMESPACE`]) and `STATE_MACHINE_ARN` (optional: the lock-protected
    /// machine whose executions are judged).
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
        let state_machine = match settings.optional("STATE_MACHINE_ARN") {
            None => None,
            Some(value) => Some(StateMachineArn::parse(&value).ok_or_else(|| {
                ConfigError::Invalid {
                    name: "STATE_MACHINE_ARN",
                    value: value.clone(),
                    problem: "expected arn:<partition>:states:<region>:<account>:stateMachine:<name>, or unset to judge every execution".to_owned(),
                }
            })?),
        };
        Ok(Self {
            semaphore,
            executions: SfnExecutions::new(aws_sdk_sfn::Client::new(sdk), state_machine),
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
            .map_err(|e| DisplayErrorContext(e).to_string())
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
