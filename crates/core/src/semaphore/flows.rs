//! Runs the flows of [`crate::flow`] against the semaphore's store: each call a flow makes is one
//! of the semaphore's operations, and its reply is what that operation answered.

use std::future::Future;

use super::line::HandOff;
use super::Semaphore;
use crate::error::Error;
use crate::flow::acquire::{AcquireFlow, Acquisition, Budget, Call, Next, Refusal, Reply, Request};
use crate::input::LockName;
use crate::ports::ItemStore;
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

// The release flow's names, apart from the acquire flow's above.
use crate::flow::release;
use crate::item::SemaphoreItem;
use crate::ports::ExecutionStatus;

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
                    let fenced = self.fence(lock, &identity.holder, last_run).await?;
                    Reply::Fenced {
                        slots: fenced.slots,
                        count: fenced.count,
                        waiting: fenced.waiting,
                    }
                }
                Call::Free {
                    slots,
                    count,
                    waiting,
                } => {
                    let fenced = super::slots::Fenced {
                        lock: lock.clone(),
                        slots,
                        count,
                        waiting,
                    };
                    Reply::Freed(self.free(&fenced).await?)
                }
            };
            replied(&reply, self.now_ms());
            match flow.resume(reply) {
                Next::Call(next) => call = next,
                Next::Done(done) => return Ok(done),
            }
        }
    }
}
