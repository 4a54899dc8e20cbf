//! Runs the flows of [`crate::flow`] against the semaphore's store: each call a flow makes is one
//! of the semaphore's operations, and its reply is what that operation answered.

use std::future::Future;

use super::line::HandOff;
use super::Semaphore;
use crate::error::Error;
use crate::flow::acquire::{AcquireFlow, Acquisition, Budget, Call, Next, Refusal, Reply, Request};
use crate::flow::cleanup::{self, Cleaned, CleanupFlow, Execution, LockStep, Locks};
use crate::flow::release;
use crate::input::{HolderId, LockName};
use crate::item::SemaphoreItem;
use crate::ports::{ExecutionState, ExecutionStatus, ItemStore, PortError};
use crate::protocol::QueueOutcome;

impl<S: ItemStore> Semaphore<S> {
    /// Takes a slot for `request`, or waits in line for one (see [`crate::flow::acquire`]), within
    /// `budget`. `hand_off` moves the lock's line (the functions': grants, wake-ups and their
    /// metrics). A store error ends the flow where it stands: every write it sent stands, and the
    /// caller's next attempt finds them.
    pub async fn acquire_or_wait<H, F>(
        &self,
        request: Request,
        budget: Budget,
        hand_off: H,
    ) -> Result<Result<Acquisition, Refusal>, Error>
    where
        H: Fn(LockName) -> F,
        F: Future<Output = HandOff>,
    {
        let (mut flow, mut call) = AcquireFlow::start(request, budget);
        loop {
            let request = flow.request();
            let (lock, identity) = (&request.lock, &request.identity);
            let reply = match call {
                Call::Acquire { terms } => {
                    let (outcome, seen) = self
                        .acquire_seeing(lock, identity, request.run, terms, request.requested_at_ms)
                        .await?;
                    Reply::Acquired { outcome, seen }
                }
                Call::ReadWaiter => Reply::Waiter(self.waiter(lock, request.waiter_id()).await?),
                Call::Enqueue(waiter) => {
                    let outcome = self.enqueue(&waiter, request.requested_at_ms).await?;
                    if outcome == QueueOutcome::Queued {
                        tracing::info!(%lock, holder = %identity.holder, acquisition = %identity.acquisition, queued_at = request.asked_at_ms, in_line_at_ms = self.now_ms(), "queued");
                    }
                    Reply::Queued(outcome)
                }
                Call::Leave => Reply::InLine(self.leave(lock, request.waiter_id()).await?),
                Call::Repark(wakeup) => {
                    let id = request.waiter_id();
                    Reply::InLine(self.repark(lock, id, wakeup, request.attempt).await?)
                }
                Call::HandOff => {
                    let handed = hand_off(lock.clone()).await;
                    let granted = handed
                        .woken
                        .iter()
                        .find(|(woken, _)| woken == identity)
                        .map(|(_, token)| *token);
                    Reply::HandedOff { granted }
                }
            };
            match flow.resume(reply, self.now_ms()) {
                Next::Call(next) => call = next,
                Next::Done(done) => return Ok(done),
            }
        }
    }
}

impl<S: ItemStore> Semaphore<S> {
    /// Releases the slot `request` shows and hands it on (see [`crate::flow::release`]); a
    /// redriven run's release frees its earlier runs' slots too, once `executions` (Step
    /// Functions) says the execution is in that run. `hand_off` moves the lock's line from the
    /// lock as it is known, if it is (the functions': grants, wake-ups and their metrics);
    /// `replied` sees each reply as it comes, with the time it came at (the functions' metrics
    /// of what was freed). A store error ends the flow where it stands: every write it sent
    /// stands, and a retry of the release finds them.
    pub async fn release_and_hand_off<X, H, F, R>(
        &self,
        request: release::Request,
        executions: &X,
        hand_off: H,
        mut replied: R,
    ) -> Result<Result<release::Release, release::Refusal>, Error>
    where
        X: ExecutionStatus,
        H: Fn(LockName, Option<SemaphoreItem>) -> F,
        F: Future<Output = HandOff>,
        R: FnMut(&release::Reply, u64),
    {
        use release::{Call, Next, ReleaseFlow, Reply};

        let (mut flow, mut call) = ReleaseFlow::start(request);
        loop {
            let request = flow.request();
            let (lock, identity) = (&request.lock, &request.identity);
            let reply = match call {
                Call::Release => {
                    let (outcome, after, held) = self
                        .release_freeing(lock, identity, request.claim())
                        .await?;
                    let after = Box::new(after);
                    Reply::Released {
                        outcome,
                        after,
                        held,
                    }
                }
                Call::HandOff { known } => {
                    let handed = hand_off(lock.clone(), known.map(|known| *known)).await;
                    Reply::HandedOff {
                        woken: handed.woken.len(),
                    }
                }
                Call::CurrentRun => {
                    let run = executions.current_run(&identity.holder).await;
                    Reply::Run(run.map_err(|e| e.to_string()))
                }
                Call::Fence { last_run } => {
                    Reply::Fenced(self.fence(lock, &identity.holder, last_run).await?)
                }
                Call::Free(fenced) => Reply::Freed(self.free(&fenced).await?),
            };
            replied(&reply, self.now_ms());
            match flow.resume(reply) {
                Next::Call(next) => call = next,
                Next::Done(done) => return Ok(done),
            }
        }
    }
}

/// What a cleanup asks beyond the store and Step Functions' word on the execution: its caller's
/// (the cleanup function's: the execution's history and its work, and the hand-offs with their
/// wake-ups and metrics).
pub trait CleanupCalls: Send {
    /// Which locks and lines the execution's acquire tasks used; `None`: they cannot be told.
    fn find_locks(&mut self) -> impl Future<Output = Result<Option<Locks>, PortError>> + Send;

    /// Stops the execution's work where it can be stopped; whether any still runs.
    fn stop_work(&mut self) -> impl Future<Output = Result<bool, PortError>> + Send;

    /// Moves `lock`'s line.
    fn hand_off(&mut self, lock: LockName) -> impl Future<Output = HandOff> + Send;
}

/// A cleanup's store call that failed on its lock.
#[derive(Debug)]
pub struct LockFailure {
    pub lock: LockName,
    pub step: LockStep,
    pub error: Error,
}

/// What [`Semaphore::clean_up_after`] did: where the flow ended, and the store's error of each
/// of its [`Cleaned::failed`], in the same order.
#[derive(Debug)]
pub struct CleanedUp {
    pub done: Result<Cleaned, cleanup::Refusal>,
    pub failures: Vec<LockFailure>,
}

impl CleanedUp {
    /// The message naming every failure on `holder`'s locks, if any.
    pub fn failure_message(&self, holder: &HolderId) -> Option<String> {
        if self.failures.is_empty() {
            return None;
        }
        let each: Vec<String> = (self.failures.iter())
            .map(|f| format!("{} on lock \"{}\": {}", f.step.describe(), f.lock, f.error))
            .collect();
        Some(format!(
            "cleanup of {holder} failed on {} lock(s), the others were done; retrying is safe: {}",
            self.failures.len(),
            each.join("; ")
        ))
    }
}

impl<S: ItemStore> Semaphore<S> {
    /// Cleans up after `holder`'s ended execution (see [`crate::flow::cleanup`]): what
    /// `executions` says of it decides whether and which runs are fenced, and `calls` say which
    /// locks, whether its work runs, and move the lines. A store call that fails is one lock's
    /// failure, and the flow goes on with the others; a port's error ends it where it stands
    /// (every write it sent stands, and is idempotent).
    pub async fn clean_up_after<X, C>(
        &self,
        holder: HolderId,
        executions: &X,
        calls: &mut C,
    ) -> Result<CleanedUp, PortError>
    where
        X: ExecutionStatus,
        C: CleanupCalls,
    {
        let (mut flow, mut call) = CleanupFlow::start(holder);
        let mut failures = Vec::new();
        loop {
            let holder = flow.holder();
            let answer = match &call {
                cleanup::Call::Describe => {
                    let execution = match executions.describe(holder).await? {
                        ExecutionState::Running => Execution::Running,
                        ExecutionState::Ended { last_run, .. } => {
                            Execution::Ended { run: last_run }
                        }
                        ExecutionState::Missing => Execution::Missing,
                        ExecutionState::Unjudged { .. } | ExecutionState::NotAnExecution => {
                            Execution::Untold
                        }
                    };
                    Ok(cleanup::Reply::Execution(execution))
                }
                cleanup::Call::FindLocks => Ok(cleanup::Reply::Locks(calls.find_locks().await?)),
                cleanup::Call::Fence { lock, run } => self
                    .fence(lock, holder, *run)
                    .await
                    .map(cleanup::Reply::Fenced),
                cleanup::Call::ReadWaiter { lock, id } => (self.waiter(lock, *id).await)
                    .map(|record| cleanup::Reply::InLine(record.is_some())),
                cleanup::Call::Leave { lock, id } => {
                    self.leave(lock, *id).await.map(cleanup::Reply::InLine)
                }
                cleanup::Call::StopWork => Ok(cleanup::Reply::WorkRuns(calls.stop_work().await?)),
                cleanup::Call::Free(seen) => self.free(seen).await.map(cleanup::Reply::Freed),
                cleanup::Call::HandOff { lock } => {
                    let woken = calls.hand_off(lock.clone()).await.woken.len();
                    Ok(cleanup::Reply::HandedOff { woken })
                }
            };
            let reply = answer.unwrap_or_else(|error| {
                // Only the store calls answer an error here: each is one lock's.
                if let Some((lock, step)) = call.lock_step() {
                    let lock = lock.clone();
                    failures.push(LockFailure { lock, step, error });
                }
                cleanup::Reply::Failed
            });
            match flow.resume(reply, self.now_ms()) {
                cleanup::Next::Call(next) => call = next,
                cleanup::Next::Done(done) => return Ok(CleanedUp { done, failures }),
            }
        }
    }
}
