//! [`SfnExecutions`]: the core's [`ExecutionStatus`] through Step Functions, for the sweeper and
//! for every hand-off whose wake-up failed (is the waiter's execution still running?).

use semaphore_core::{Clock, ExecutionState, ExecutionStatus, HolderId, PortError, SystemClock};

use crate::arn::{ArnPatterns, ExecutionArn, ExecutionKind};
use crate::history;
use crate::sfn::{
    child_state, may_still_start, ChildState, Described, Executions, SfnClient, SfnError,
};

/// A holder's execution in another region than the client's: only its own region's answer, "does
/// not exist" above all, may be taken for a verdict.
#[derive(Debug, thiserror::Error)]
#[error("an execution in region {region}, and this sweeper runs in {ours}: not checked")]
pub struct OtherRegion {
    /// The execution's.
    pub region: String,
    /// The client's.
    pub ours: String,
}

/// Execution states from `DescribeExecution`, and for an ended execution whether its work
/// still runs (from its history).
#[derive(Debug, Clone)]
pub struct SfnExecutions {
    sfn: SfnClient,
    /// When not empty, only executions of these state machines are judged; other holders are
    /// left alone like operator ids (the function may describe these machines' executions
    /// only).
    state_machines: ArnPatterns,
}

impl SfnExecutions {
    /// Judges the executions of these state machines, or every execution when empty.
    pub fn of_machines(client: aws_sdk_sfn::Client, state_machines: ArnPatterns) -> Self {
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
    ) -> Result<Option<String>, SfnError> {
        let Some(events) = self.sfn.history(parent).await? else {
            return Ok(None);
        };
        let now_ms = SystemClock.now_ms();
        for child in history::read(&events, None).children {
            match child_state(&self.sfn, &child).await? {
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
    async fn describe(&self, holder: &HolderId) -> Result<ExecutionState, PortError> {
        let Some(arn) = ExecutionArn::parse(holder.as_str()) else {
            return Ok(ExecutionState::NotAnExecution);
        };
        // DescribeExecution does not support Express executions: not ours to judge.
        if arn.kind == ExecutionKind::Express {
            return Ok(ExecutionState::NotAnExecution);
        }
        if !self.state_machines.is_empty() && !self.state_machines.covers(&arn) {
            return Ok(ExecutionState::NotAnExecution);
        }
        // This client can only answer for its own region: never take "does not exist" from
        // the wrong region for a verdict.
        let region = self.sfn.client().config().region().map(|r| r.as_ref());
        if region != Some(arn.region.as_str()) {
            return Err(PortError::new(OtherRegion {
                region: arn.region.clone(),
                ours: region.unwrap_or("no region").to_owned(),
            }));
        }
        // Only "does not exist" proves the execution is gone; any failure (throttling, access
        // denied...) leaves the holder alone until the next sweep.
        match self
            .sfn
            .describe(holder.as_str())
            .await
            .map_err(PortError::new)?
        {
            None => Ok(ExecutionState::Missing),
            Some(described) if described.is_running() => Ok(ExecutionState::Running),
            Some(described) => match self
                .running_work(holder.as_str(), &described)
                .await
                .map_err(PortError::new)?
            {
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
