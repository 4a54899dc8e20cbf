//! The acquire function: the state a state machine takes a slot with. Invoked by a
//! `lambda:invoke.waitForTaskToken` task, it completes that task once the execution holds a
//! slot, and not before: at once when one is free (one conditional write, no read), else when
//! whoever frees one hands it to the head of the lock's line.
//!
//! It is a thin adapter: it reads the payload (`lambda_common::Resolver`), checks the caller and
//! the work against the deployment, runs the core's acquire-or-wait flow
//! ([`semaphore_core::flow::acquire`]) against the table and Step Functions, and answers (the
//! core's [`AcquireAnswer`]), completing or failing its own task. The answer, the errors and how
//! the lock-protected machine handles them are in docs/using.md.

use std::time::Duration;

use lambda_common::{
    metrics, ConfigError, Deployment, HandOffs, HandlerError, Resolver, Settings, TaskCallbacks,
    MAX_FALLBACK_CHECKS,
};
use lambda_runtime::LambdaEvent;
use semaphore_core::flow::acquire::{Acquisition, Budget, Refusal, Request, Taken, Waiting};
use semaphore_core::flow::answer::{AcquireAnswer, Outcome};
use semaphore_core::{ExecutionStatus, ItemStore, LockName, Semaphore};
use serde_json::Value;

/// What the function reads once per cold start besides the semaphore.
#[derive(Debug, Clone)]
pub struct Config {
    /// Defaults and allowed work (`DEFAULT_LOCK`, `DEFAULT_LIMIT`, `DEFAULT_WEIGHT`,
    /// `DEFAULT_RATE`, `DEFAULT_WORK`, `WORK_STATE_MACHINES`, `WORK_FUNCTIONS`,
    /// `WORK_FUNCTION_RUNNER`).
    pub resolver: Resolver,
    /// `MAX_WAIT_SECONDS`: how long an execution may wait in line, from when it was queued.
    pub max_wait: Duration,
    /// The protected machines (`PROTECTED_STATE_MACHINES`) a caller must be one of, and the work
    /// machines' types (set by `main`: `DescribeStateMachine`); see `lambda_common::deployment`.
    pub deployment: Deployment,
}

impl Config {
    pub fn from_settings<F: Fn(&str) -> Option<String>>(
        settings: &Settings<F>,
    ) -> Result<Self, ConfigError> {
        Ok(Self {
            resolver: settings.resolver()?,
            max_wait: settings.max_wait()?,
            deployment: Deployment {
                protected: settings.protected_machines()?,
                machine_types: None,
            },
        })
    }
}

/// Validates the payload, then takes a slot or waits in line (the core's
/// [`semaphore_core::flow::acquire`]). Nothing is sent to the table for bad input.
pub async fn acquire<S: ItemStore, C: TaskCallbacks, X: ExecutionStatus>(
    semaphore: &Semaphore<S>,
    config: &Config,
    hand_offs: &HandOffs<C, X>,
    payload: &Value,
) -> Result<AcquireAnswer, HandlerError> {
    // Bad input is logged by the runtime with the error it answers.
    let request = config.resolver.acquire(payload)?.at(semaphore.now_ms());
    let (lock, identity) = (&request.lock, &request.identity);
    let budget = Budget {
        max_wait: config.max_wait,
        max_checks: MAX_FALLBACK_CHECKS,
    };
    let result = async {
        // Before anything is written: a misconfigured stack is refused by name, not left to hang.
        // A poller holds under a lease, which frees its slot whoever it is (F13); a parked
        // caller whose end cannot be seen needs one too.
        if let Waiting::Parked(_) = request.waiting {
            let leased = request.terms.lease.is_some();
            config
                .deployment
                .check_caller(identity.holder.as_str(), leased)?;
        }
        if let Some(work) = &request.work {
            config.deployment.check_work(work).await?;
        }
        let hand_off = |lock: LockName| async move { hand_offs.run(semaphore, &lock, None).await };
        // Boxed: a deep future (the hand-off nests), kept off the caller's.
        let ran = Box::pin(semaphore.acquire_or_wait(request.clone(), budget, hand_off)).await;
        let ran = ran.inspect_err(|e| tracing::error!(%lock, error = %e, "acquire failed"))?;
        ran.map_err(|refusal| refused(&request, refusal))
    }
    .await;
    emit_metrics(semaphore, hand_offs, &request, &result);
    // F13: an acquire that found the lock full took back the slots whose lease had passed.
    hand_offs
        .metrics
        .taken_back(&semaphore.drain_taken_back(), semaphore.now_ms());
    let callbacks = &hand_offs.waker.callbacks;
    if let (Err(e), Some(task_token)) = (&result, request.waiting.task_token()) {
        if let Err(sent) = callbacks
            .fail(task_token, e.error_type(), e.message())
            .await
        {
            tracing::warn!(%lock, holder = %identity.holder, error = %sent, "could not fail the acquire task");
        }
    }
    let acquisition = result?;
    let terms = &acquisition.terms;
    let answer = |outcome, token, count, queued_at_ms| {
        request.answer(terms, outcome, token, count, queued_at_ms)
    };
    let response = match acquisition.taken {
        Taken::Holding {
            token,
            count,
            taken,
            queued_at_ms,
        } => {
            let outcome = if taken {
                Outcome::Acquired
            } else {
                Outcome::AlreadyHeld
            };
            answer(outcome, Some(token), count, queued_at_ms)
        }
        Taken::InLine { queued_at_ms, .. } => {
            if let Waiting::Polls { poll_ms } = request.waiting {
                return Err(HandlerError::Busy(
                    request.busy_message(queued_at_ms, poll_ms),
                ));
            }
            answer(Outcome::Queued, None, None, Some(queued_at_ms))
        }
        Taken::Superseded => {
            tracing::info!(%lock, holder = %identity.holder, "a later attempt checked already");
            if let Waiting::Polls { poll_ms } = request.waiting {
                let message = request.busy_message(request.asked_at_ms, poll_ms);
                return Err(HandlerError::Busy(message));
            }
            answer(Outcome::Queued, None, None, None)
        }
    };
    if let (true, Some(task_token)) = (response.acquired, request.waiting.task_token()) {
        // Complete our own task: the slot is ours.
        if let Err(e) = callbacks.succeed(task_token, &response.to_json()).await {
            // Its task timed out meanwhile: the state's next entry finds the slot held.
            tracing::warn!(%lock, holder = %identity.holder, error = %e, "could not complete the acquire task; its next check will");
        }
    }
    tracing::info!(
        lock = %lock,
        holder = %identity.holder,
        acquisition = %identity.acquisition,
        outcome = response.outcome.as_str(),
        token = response.token,
        count = response.count,
        limit = response.limit,
        weight = response.weight,
        rate = response.rate,
        queued_at = response.queued_at.as_deref(),
        work = response.work.as_ref().map(|w| w.state_machine.as_str()),
        at_ms = semaphore.now_ms(),
        "acquire"
    );
    Ok(response)
}

/// The named error of a refusal, logged.
fn refused(request: &Request, refusal: Refusal) -> HandlerError {
    let message = refusal.message(request);
    let identity = &request.identity;
    match refusal {
        Refusal::Fenced(_) => {
            tracing::warn!(lock = %request.lock, holder = %identity.holder, acquisition = %identity.acquisition, "{message}");
            HandlerError::Fenced(message)
        }
        Refusal::WaitTimeout { .. } => {
            tracing::warn!(lock = %request.lock, holder = %identity.holder, acquisition = %identity.acquisition, "{message}");
            HandlerError::WaitTimeout(message)
        }
        Refusal::Expired(_) => HandlerError::Expired(message),
        Refusal::OutOfStep => HandlerError::Store(message),
    }
}

/// The `Outcome` of an acquisition refused for good (`SemaphoreFenced`).
const FENCED: &str = "fenced";
/// The `Outcome` of a wait past its budget (`SemaphoreWaitTimeout`).
const TIMED_OUT: &str = "timed_out";
/// The `Outcome` of a request too old to be written (`SemaphoreExpired`).
const EXPIRED: &str = "expired";

/// The invocation's `Acquisitions` line: a slot taken (with the wait from the request, or from
/// its place in line), already held, queued, refused, timed out or expired. A check that finds
/// the execution still in line writes none: it asked once.
fn emit_metrics<S: ItemStore, C: TaskCallbacks, X: ExecutionStatus>(
    semaphore: &Semaphore<S>,
    hand_offs: &HandOffs<C, X>,
    request: &Request,
    result: &Result<Acquisition, HandlerError>,
) {
    let now_ms = semaphore.now_ms();
    let seen = result.as_ref().ok().and_then(|done| done.seen.as_ref());
    let (outcome, waited_since) = match result.as_ref().map(|done| &done.taken) {
        Ok(Taken::InLine { new: false, .. } | Taken::Superseded) => return,
        Ok(Taken::InLine { new: true, .. }) => (Outcome::Queued.as_str(), None),
        Ok(Taken::Holding {
            taken: true,
            queued_at_ms,
            ..
        }) => (
            Outcome::Acquired.as_str(),
            Some(queued_at_ms.unwrap_or(request.requested_at_ms)),
        ),
        Ok(Taken::Holding { taken: false, .. }) => (Outcome::AlreadyHeld.as_str(), None),
        Err(HandlerError::Fenced(_)) => (FENCED, None),
        Err(HandlerError::WaitTimeout(_)) => (TIMED_OUT, None),
        Err(HandlerError::Expired(_)) => (EXPIRED, None),
        Err(_) => return,
    };
    let mut line = metrics::Line::of(&request.lock)
        .dimension(metrics::OUTCOME, outcome)
        .value(metrics::ACQUISITIONS, 1);
    // The lock as this invocation's write left it or saw it.
    if let Some(item) = seen {
        line = line
            .value(metrics::WEIGHT_USED, item.used as f64)
            .values(metrics::LIMIT, item.limit.map(|l| f64::from(l.get())))
            .value(metrics::WAITING, item.waiting as f64);
    }
    let line = line.values(
        metrics::WAIT_TIME,
        waited_since.map(|since| now_ms.saturating_sub(since) as f64),
    );
    hand_offs.metrics.emit(now_ms, &line);
}

/// The Lambda handler. An answer that is a failure, not the protocol working or a caller's
/// mistake, is counted (`Failures`, which the stack's alarm watches: Lambda's `Errors` counts
/// every poll of a poller in line too).
pub async fn handle<S: ItemStore, C: TaskCallbacks, X: ExecutionStatus>(
    semaphore: &Semaphore<S>,
    config: &Config,
    hand_offs: &HandOffs<C, X>,
    event: LambdaEvent<Value>,
) -> Result<AcquireAnswer, HandlerError> {
    let answer = acquire(semaphore, config, hand_offs, &event.payload).await;
    hand_offs
        .metrics
        .answered(metrics::ACQUIRE_FUNCTION, &answer, semaphore.now_ms());
    answer
}
