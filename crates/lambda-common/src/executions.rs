//! [`SfnExecutions`]: the core's [`ExecutionStatus`] through Step Functions, for the sweeper and
//! for every hand-off whose wake-up failed (is the waiter's execution still running?).

use std::collections::{HashMap, HashSet};

use semaphore_core::{
    AcquisitionId, Clock, ExecutionState, ExecutionStatus, HolderAsked, HolderId, PortError, Run,
    SystemClock,
};

use crate::arn::{ArnPatterns, ExecutionArn, ExecutionKind};
use crate::history::Reader;
use crate::sfn::{
    child_state, may_still_start, ChildState, Described, Executions, HistoryRead, HistoryReading,
    HistoryTooLong, SfnClient, SfnError,
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

    /// What the ended `parent`'s work is doing: a child execution that still runs (or whose
    /// start was in flight when the parent ended, just now), if any, read from the history
    /// newest first back to the start of run `from_run` (the oldest run whose slot is held:
    /// work under a slot is started by a task of the run that took it, or of a later one), and
    /// no further once a child is found running.
    async fn running_work(
        &self,
        parent: &str,
        described: &Described,
        from_run: Run,
    ) -> Result<Work, SfnError> {
        let mut reader = Reader::new(None, from_run);
        let mut reading = HistoryReading::new(parent);
        let now_ms = SystemClock.now_ms();
        let mut checked = 0;
        let read = loop {
            let read = reading.step(&self.sfn, &mut reader).await?;
            // The children of the page, newest first: the first found running ends the read.
            for child in reader.children().skip(checked) {
                checked += 1;
                let runs = match child_state(&self.sfn, child).await? {
                    ChildState::Running { .. } => true,
                    ChildState::Missing => may_still_start(child, described.stop_date_ms, now_ms),
                    ChildState::Ended { .. } => false,
                };
                if runs {
                    tracing::debug!(parent, pages = reading.pages(), child = %child.execution_arn, "history read up to running work");
                    return Ok(Work::Running(child.execution_arn.clone()));
                }
            }
            if let Some(read) = read {
                break read;
            }
        };
        Ok(match read {
            HistoryRead::Read { pages } => {
                tracing::debug!(parent, pages, events = reader.events_read(), "history read");
                Work::Ended
            }
            HistoryRead::NotFound => Work::Ended,
            HistoryRead::TooLong(too_long) => Work::Unjudged(too_long),
        })
    }
}

/// What an ended execution's work is doing.
enum Work {
    /// This child still runs (or may still start).
    Running(String),
    Ended,
    /// Its history could not be read back far enough.
    Unjudged(HistoryTooLong),
}

/// The oldest run a holder holds a slot of: `r<n>` is an acquisition of run n (the acquire
/// function's rule); another acquisition, or none, is taken for the first run, so the whole
/// history is read.
fn oldest_run(holding: &[AcquisitionId]) -> Run {
    holding
        .iter()
        .map(|acquisition| crate::request::incarnation_of(acquisition).map(Run))
        .min()
        .flatten()
        .unwrap_or(Run::FIRST)
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
        holders: &'a [HolderAsked],
    ) -> Vec<Result<ExecutionState, PortError>> {
        // Machines with many holders: their running executions listed once. A Distributed Map
        // child is listed under its map run, not its machine: described on its own.
        let mut per_machine: HashMap<String, usize> = HashMap::new();
        for HolderAsked { holder, .. } in holders {
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
        for HolderAsked { holder, holding } in holders {
            states.push(if running.contains(holder.as_str()) {
                Ok(ExecutionState::Running)
            } else {
                self.describe_holding(holder, holding).await
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
        self.describe_holding(holder, &[]).await
    }

    async fn describe_holding(
        &self,
        holder: &HolderId,
        holding: &[AcquisitionId],
    ) -> Result<ExecutionState, PortError> {
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
                .running_work(holder.as_str(), &described, oldest_run(holding))
                .await
                .map_err(PortError::new)?
            {
                // Its work still runs under the slot: the slot is not the sweeper's to take.
                Work::Running(child) => {
                    tracing::info!(
                        holder = %holder,
                        status = described.status(),
                        child = %child,
                        "ended, but its work still runs: slot kept until it ends"
                    );
                    Ok(ExecutionState::Running)
                }
                Work::Unjudged(too_long) => Ok(ExecutionState::Unjudged {
                    status: described.status().to_owned(),
                    why: too_long.to_string(),
                }),
                Work::Ended => Ok(ExecutionState::Ended {
                    status: described.status().to_owned(),
                    last_run: described.run,
                }),
            },
        }
    }
}
