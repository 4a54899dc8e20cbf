//! [`SfnExecutions`]: the core's [`ExecutionStatus`] through Step Functions, for the sweeper and
//! for every hand-off whose wake-up failed (is the waiter's execution still running?).

use std::collections::{HashMap, HashSet};

use semaphore_core::{
    Clock, ExecutionState, ExecutionStatus, HolderId, PortError, Run, SystemClock,
};

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

/// Holders of one state machine above which a sweep lists the machine's running executions
/// (`ListExecutions`, 1,000 a page) instead of describing each holder: 10,000 holders are then
/// about 10 calls, not 10,000 of the account's `DescribeExecution` calls (a bucket of 250-300,
/// refilled at 10-15 a second, shared with every cleanup).
pub const LIST_ABOVE_HOLDERS: usize = 10;

/// Pages of running executions a sweep reads per state machine; a holder not found in them is
/// described on its own.
pub const LIST_PAGES: usize = 20;

impl SfnExecutions {
    /// Whether `holder` is an execution this sweeper may judge: a standard execution of a
    /// machine it covers, in its own region. `Ok(None)`: not an execution of ours to judge.
    fn judged(&self, holder: &HolderId) -> Result<Option<ExecutionArn>, PortError> {
        let Some(arn) = ExecutionArn::parse(holder.as_str()) else {
            return Ok(None);
        };
        // DescribeExecution does not support Express executions: not ours to judge.
        if arn.kind == ExecutionKind::Express {
            return Ok(None);
        }
        if !self.state_machines.is_empty() && !self.state_machines.covers(&arn) {
            return Ok(None);
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
        Ok(Some(arn))
    }
}

impl ExecutionStatus for SfnExecutions {
    async fn describe_all<'a>(
        &'a self,
        holders: &'a [HolderId],
    ) -> Vec<Result<ExecutionState, PortError>> {
        // Machines with many holders: their running executions listed once. A Distributed Map
        // child is listed under its map run, not its machine: described on its own.
        let mut per_machine: HashMap<String, usize> = HashMap::new();
        for holder in holders {
            if let Ok(Some(arn)) = self.judged(holder) {
                if !arn.machine.contains('/') {
                    *per_machine
                        .entry(arn.state_machine().to_string())
                        .or_default() += 1;
                }
            }
        }
        let mut running = HashSet::new();
        for (machine, count) in per_machine {
            if count <= LIST_ABOVE_HOLDERS {
                continue;
            }
            match self.sfn.running(&machine, LIST_PAGES).await {
                Ok(listed) => running.extend(listed),
                // Nothing concluded: its holders are described one by one.
                Err(e) => tracing::warn!(%machine, error = %e, "could not list running executions"),
            }
        }
        // Listed running: kept. Anything else is described, so that only `DescribeExecution`
        // (and the grace for "does not exist") ever decides a slot is reclaimed; a list that
        // is stale (eventually consistent) only delays that to the next sweep.
        let mut states = Vec::with_capacity(holders.len());
        for holder in holders {
            states.push(if running.contains(holder.as_str()) {
                Ok(ExecutionState::Running)
            } else {
                self.describe(holder).await
            });
        }
        states
    }

    async fn current_run(&self, holder: &HolderId) -> Result<Option<Run>, PortError> {
        if self.judged(holder)?.is_none() {
            return Ok(None);
        }
        Ok(self
            .sfn
            .describe(holder.as_str())
            .await
            .map_err(PortError::new)?
            .map(|described| described.run))
    }

    async fn describe(&self, holder: &HolderId) -> Result<ExecutionState, PortError> {
        if self.judged(holder)?.is_none() {
            return Ok(ExecutionState::NotAnExecution);
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
