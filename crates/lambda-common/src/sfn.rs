//! The Step Functions calls of the cleanup function and the sweeper (`DescribeExecution`,
//! `GetExecutionHistory`, `StopExecution`), behind [`Executions`] so that what they decide is
//! plain code over answers; [`SfnClient`] makes the calls with the AWS SDK. And the rule both
//! apply to an ended execution's children: [`ChildState`], [`may_still_start`].

use std::collections::HashSet;
use std::future::Future;
use std::time::Duration;

use aws_sdk_sfn::error::{DisplayErrorContext, SdkError};
use aws_sdk_sfn::operation::describe_execution::DescribeExecutionError;
use aws_sdk_sfn::operation::get_execution_history::GetExecutionHistoryError;
use aws_sdk_sfn::operation::stop_execution::StopExecutionError;
use aws_sdk_sfn::types::{ExecutionStatus, HistoryEvent};

use semaphore_core::Run;

use crate::history::{ChildExecution, Reader};

/// The Lambda error type of a failed Step Functions call: the caller retries.
pub const STEP_FUNCTIONS_ERROR: &str = "SemaphoreStepFunctionsError";

/// An execution as `DescribeExecution` tells it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Described {
    pub status: ExecutionStatus,
    pub state_machine_arn: String,
    /// Epoch milliseconds; `None` while it runs.
    pub stop_date_ms: Option<u64>,
    /// Its run: the redrive count (0 for an execution never redriven, and where the service
    /// does not say).
    pub run: Run,
}

impl Described {
    /// Running, or about to run again: a redrive in progress (`PENDING_REDRIVE`) resumes the
    /// same execution, same ARN.
    pub fn is_running(&self) -> bool {
        matches!(
            self.status,
            ExecutionStatus::Running | ExecutionStatus::PendingRedrive
        )
    }

    pub fn status(&self) -> &str {
        self.status.as_str()
    }
}

/// A Step Functions call that failed (throttled, denied, unreachable...): nothing can be
/// concluded from it, so the caller leaves everything as it is and tries again later.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("Step Functions {operation} of {execution} failed: {message}")]
pub struct SfnError {
    pub operation: &'static str,
    pub execution: String,
    pub message: String,
}

/// The calls, as the cleanup function and the sweeper need them.
pub trait Executions: Send + Sync {
    /// `None`: the execution does not exist.
    fn describe(
        &self,
        execution: &str,
    ) -> impl Future<Output = Result<Option<Described>, SfnError>> + Send;

    /// One page of the execution's history, newest first ([`HISTORY_PAGE_EVENTS`] events at
    /// most), from `next_token` (`None`: the newest); `None`: the execution does not exist.
    fn history_page(
        &self,
        execution: &str,
        next_token: Option<String>,
    ) -> impl Future<Output = Result<Option<HistoryPage>, SfnError>> + Send;

    /// Stops a running execution with this error and cause; one that does not exist is left
    /// as it is. (One that ended meanwhile may be an error: describe it again to tell.)
    fn stop(
        &self,
        execution: &str,
        error: &str,
        cause: &str,
    ) -> impl Future<Output = Result<(), SfnError>> + Send;
}

/// [`Executions`] through the AWS SDK.
#[derive(Debug, Clone)]
pub struct SfnClient {
    client: aws_sdk_sfn::Client,
}

impl SfnClient {
    pub fn new(client: aws_sdk_sfn::Client) -> Self {
        Self { client }
    }

    pub fn client(&self) -> &aws_sdk_sfn::Client {
        &self.client
    }

    /// The executions of `state_machine` that are running, as `ListExecutions` (eventually
    /// consistent) lists them, newest first, in at most `max_pages` pages of 1,000: a sweep's way
    /// to clear many holders of one machine in a few calls. An execution missing here may still
    /// run (listed late, on a later page, or being redriven): ask it with `describe`.
    pub async fn running(
        &self,
        state_machine: &str,
        max_pages: usize,
    ) -> Result<HashSet<String>, SfnError> {
        let mut running = HashSet::new();
        let mut pages = self
            .client
            .list_executions()
            .state_machine_arn(state_machine)
            .status_filter(ExecutionStatus::Running)
            .max_results(1000)
            .into_paginator()
            .send();
        for _ in 0..max_pages {
            let Some(page) = pages.next().await else {
                break;
            };
            let page = page.map_err(|e| SfnError {
                operation: "ListExecutions",
                execution: state_machine.to_owned(),
                message: DisplayErrorContext(e).to_string(),
            })?;
            running.extend(
                page.executions()
                    .iter()
                    .map(|e| e.execution_arn().to_owned()),
            );
        }
        Ok(running)
    }
}

/// The call's answer; `None` when it says the execution does not exist (`missing`). Only that
/// answer proves it; any other failure (throttling, access denied...) proves nothing.
fn unless_missing<T, E, R>(
    answer: Result<T, SdkError<E, R>>,
    operation: &'static str,
    execution: &str,
    missing: impl Fn(&E) -> bool,
) -> Result<Option<T>, SfnError>
where
    E: std::error::Error + Send + Sync + 'static,
    R: std::fmt::Debug + Send + Sync + 'static,
{
    match answer {
        Ok(answer) => Ok(Some(answer)),
        Err(SdkError::ServiceError(e)) if missing(e.err()) => Ok(None),
        Err(e) => Err(SfnError {
            operation,
            execution: execution.to_owned(),
            message: DisplayErrorContext(e).to_string(),
        }),
    }
}

impl Executions for SfnClient {
    async fn describe(&self, execution: &str) -> Result<Option<Described>, SfnError> {
        let answer = self
            .client
            .describe_execution()
            .execution_arn(execution)
            .send()
            .await;
        let described = unless_missing(
            answer,
            "DescribeExecution",
            execution,
            DescribeExecutionError::is_execution_does_not_exist,
        )?;
        Ok(described.map(|out| Described {
            status: out.status().clone(),
            state_machine_arn: out.state_machine_arn().to_owned(),
            stop_date_ms: out
                .stop_date()
                .and_then(|d| d.to_millis().ok())
                .and_then(|ms| u64::try_from(ms).ok()),
            // Step Functions' own count: within Run::MAX, which its history limit makes.
            run: Run(out
                .redrive_count()
                .and_then(|n| u32::try_from(n).ok())
                .unwrap_or(0)
                .min(Run::MAX.0)),
        }))
    }

    async fn history_page(
        &self,
        execution: &str,
        next_token: Option<String>,
    ) -> Result<Option<HistoryPage>, SfnError> {
        // Execution data included (the default): the acquire payloads are what is read.
        let page = self
            .client
            .get_execution_history()
            .execution_arn(execution)
            .max_results(HISTORY_PAGE_EVENTS)
            .reverse_order(true)
            .set_next_token(next_token)
            .send()
            .await;
        let page = unless_missing(
            page,
            "GetExecutionHistory",
            execution,
            GetExecutionHistoryError::is_execution_does_not_exist,
        )?;
        Ok(page.map(|page| HistoryPage {
            next_token: page.next_token().map(str::to_owned),
            events: page.events,
        }))
    }

    async fn stop(&self, execution: &str, error: &str, cause: &str) -> Result<(), SfnError> {
        let answer = self
            .client
            .stop_execution()
            .execution_arn(execution)
            .error(error)
            .cause(cause)
            .send()
            .await;
        unless_missing(
            answer,
            "StopExecution",
            execution,
            StopExecutionError::is_execution_does_not_exist,
        )
        .map(|_| ())
    }
}

/// One page of a history, newest first.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct HistoryPage {
    pub events: Vec<HistoryEvent>,
    /// Where the next (older) page starts; `None`: this was the oldest.
    pub next_token: Option<String>,
}

/// Events a page of `GetExecutionHistory` holds at most: "The default is 100 and the maximum
/// allowed page size is 1000" (AWS Step Functions API Reference, GetExecutionHistory,
/// `maxResults`: <https://docs.aws.amazon.com/step-functions/latest/apireference/API_GetExecutionHistory.html>).
pub const HISTORY_PAGE_EVENTS: i32 = 1000;

/// Events a history is read back at most: a standard execution's whole history. "Maximum
/// execution history size: 25,000 events. If the execution history reaches this quota, the
/// execution will fail" (AWS Step Functions Developer Guide, "Step Functions service quotas",
/// quotas related to state machine executions:
/// <https://docs.aws.amazon.com/step-functions/latest/dg/service-quotas.html>), a hard quota
/// ("Avoid reaching the history quota": <https://docs.aws.amazon.com/step-functions/latest/dg/bp-history-limit.html>).
/// A redriven execution keeps its history and adds to it, within the same quota.
pub const MAX_HISTORY_EVENTS: usize = 25_000;

/// Pages a history is read back at most: 25 full pages hold [`MAX_HISTORY_EVENTS`], and twice
/// that leaves room for pages answered short ("The actual number of results returned per call
/// might be fewer than the specified maximum", ibid.) while bounding the calls one judgement
/// spends of the account's `GetExecutionHistory` quota.
pub const MAX_HISTORY_PAGES: usize = 50;

/// A history read back to its bounds without reaching the start of the oldest run to judge:
/// nothing can be concluded from the part read (an acquire or a child before it would be
/// missed), so nothing is freed and this is said by name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "the history of {execution} is too long to judge: {events} events read in {pages} pages of \
     GetExecutionHistory without reaching the start of its {from} (at most {MAX_HISTORY_EVENTS} \
     events, Step Functions' quota for a standard execution, in at most {MAX_HISTORY_PAGES} \
     pages); what it holds is left as it is: check that its work has ended, then free its slots \
     with `semctl cleanup --holder {execution}`"
)]
pub struct HistoryTooLong {
    pub execution: String,
    pub events: usize,
    pub pages: usize,
    pub from: Run,
}

/// What a bounded read of a history came to ([`HistoryReading`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HistoryRead {
    /// Read back to the start of the oldest run to judge, or the history has no older page:
    /// in `pages` calls.
    Read {
        pages: usize,
    },
    /// The execution does not exist.
    NotFound,
    TooLong(HistoryTooLong),
}

/// A read of one execution's history, newest first, a page at a time into a [`Reader`], until
/// the reader has reached the start of the oldest run it judges or the history has no older
/// page; past [`MAX_HISTORY_EVENTS`] or [`MAX_HISTORY_PAGES`] without either,
/// [`HistoryRead::TooLong`]. Only one page is held at a time, and a caller that knows what it
/// needs after a page (a child found running) stops there.
#[derive(Debug)]
pub struct HistoryReading {
    execution: String,
    next_token: Option<String>,
    pages: usize,
}

impl HistoryReading {
    pub fn new(execution: &str) -> Self {
        Self {
            execution: execution.to_owned(),
            next_token: None,
            pages: 0,
        }
    }

    /// Reads the next page into `reader`; `None`: there is more to read.
    pub async fn step(
        &mut self,
        executions: &impl Executions,
        reader: &mut Reader<'_>,
    ) -> Result<Option<HistoryRead>, SfnError> {
        if self.pages >= MAX_HISTORY_PAGES || reader.events_read() >= MAX_HISTORY_EVENTS {
            let too_long = HistoryTooLong {
                execution: self.execution.clone(),
                events: reader.events_read(),
                pages: self.pages,
                from: reader.from_run(),
            };
            tracing::error!(
                execution = %self.execution,
                events = too_long.events,
                pages = self.pages,
                from_run = reader.from_run().0,
                "history too long to judge"
            );
            return Ok(Some(HistoryRead::TooLong(too_long)));
        }
        let token = self.next_token.take();
        let Some(page) = executions.history_page(&self.execution, token).await? else {
            return Ok(Some(HistoryRead::NotFound));
        };
        self.pages += 1;
        reader.read_newest_first(&page.events);
        if reader.reached_start() || page.next_token.is_none() {
            return Ok(Some(HistoryRead::Read { pages: self.pages }));
        }
        self.next_token = page.next_token;
        Ok(None)
    }

    /// Pages read so far.
    pub fn pages(&self) -> usize {
        self.pages
    }
}

/// Reads `execution`'s history into `reader` as far as it needs ([`HistoryReading`]).
pub async fn read_back(
    executions: &impl Executions,
    execution: &str,
    reader: &mut Reader<'_>,
) -> Result<HistoryRead, SfnError> {
    let mut reading = HistoryReading::new(execution);
    loop {
        if let Some(read) = reading.step(executions, reader).await? {
            return Ok(read);
        }
    }
}

/// A child execution as Step Functions describes it now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChildState {
    /// Running (or about to run again after a redrive), an execution of this state machine.
    Running {
        state_machine: String,
    },
    Ended {
        status: String,
    },
    /// Not found: never started, or not yet.
    Missing,
}

/// Describes a child of an ended execution.
pub async fn child_state(
    executions: &impl Executions,
    child: &ChildExecution,
) -> Result<ChildState, SfnError> {
    Ok(match executions.describe(&child.execution_arn).await? {
        Some(d) if d.is_running() => ChildState::Running {
            state_machine: d.state_machine_arn,
        },
        Some(d) => ChildState::Ended {
            status: d.status().to_owned(),
        },
        None => ChildState::Missing,
    })
}

/// How long after its parent ended a missing child may still be started by the parent's
/// `StartExecution` call, if the history ends with that call in flight: one API call's time,
/// generously. A child is named after its acquisition, so it is found if it was started.
pub const START_IN_FLIGHT: Duration = Duration::from_secs(10);

/// Whether a child not found may still appear: its start was in flight when the parent ended
/// (the history does not settle it), and the parent ended less than [`START_IN_FLIGHT`] ago
/// (or it is not known when). Such a child must be waited for, as a running one is: its work
/// would otherwise run with the slot freed.
pub fn may_still_start(
    child: &ChildExecution,
    parent_stopped_ms: Option<u64>,
    now_ms: u64,
) -> bool {
    if child.settled {
        return false;
    }
    let grace = u64::try_from(START_IN_FLIGHT.as_millis()).unwrap_or(u64::MAX);
    parent_stopped_ms.is_none_or(|stopped| now_ms < stopped.saturating_add(grace))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_an_unsettled_start_of_a_parent_that_just_ended_may_still_start() {
        let child = |settled| ChildExecution {
            execution_arn: "arn:aws:states:us-east-1:123456789012:execution:w:c".to_owned(),
            settled,
        };
        let stopped = 1_000_000;
        assert!(may_still_start(
            &child(false),
            Some(stopped),
            stopped + 9_999
        ));
        assert!(!may_still_start(
            &child(false),
            Some(stopped),
            stopped + 10_000
        ));
        assert!(may_still_start(&child(false), None, stopped));
        assert!(!may_still_start(&child(true), Some(stopped), stopped));
        assert!(!may_still_start(&child(true), None, stopped));
    }

    #[test]
    fn running_includes_a_pending_redrive() {
        let described = |status| Described {
            status,
            state_machine_arn: String::new(),
            stop_date_ms: None,
            run: Run::FIRST,
        };
        assert!(described(ExecutionStatus::Running).is_running());
        assert!(described(ExecutionStatus::PendingRedrive).is_running());
        for ended in [
            ExecutionStatus::Succeeded,
            ExecutionStatus::Failed,
            ExecutionStatus::TimedOut,
            ExecutionStatus::Aborted,
        ] {
            assert!(!described(ended).is_running());
        }
    }
}
