//! The acquire function: the state a state machine takes a slot with. Invoked by a
//! `lambda:invoke.waitForTaskToken` task, it completes that task once the execution holds a
//! slot, and not before: at once when one is free (one conditional write, no read), else when
//! whoever frees one hands it to the head of the lock's line.
//!
//! An invocation takes a free slot; or, for an execution already in line (its task timed out and
//! the state ran again), gives the record this attempt's task token and keeps its place; or
//! queues the execution. Either way it then hands off, since a slot may have been freed between
//! "full" and "queued" (F8). Past the wait budget the execution leaves the line instead
//! (`SemaphoreWaitTimeout`). The payload is read by `lambda_common::Resolver`; the answer, the
//! errors and how the lock-protected machine handles them are in docs/using.md.

use std::time::Duration;

use lambda_common::{
    child_execution_name, metrics, AcquireRequest, ConfigError, Deployment, HandOffs, HandlerError,
    Resolver, Settings, TaskCallbacks, Waiting, Work, WorkKind, MAX_FALLBACK_CHECKS,
};
use lambda_runtime::LambdaEvent;
use semaphore_core::{
    rfc3339_millis, terms_on, AcquireOutcome, ExecutionStatus, FencingToken, HandOff, Identity,
    ItemStore, QueueOutcome, Semaphore, SemaphoreItem, Waiter, WaiterId, Wakeup,
};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// How often one invocation tries to queue when the lock turns free and full again between its
/// writes (each round is a write that found the other state): then it answers
/// `SemaphoreExpired`, and the state enters itself again.
const QUEUE_ROUNDS: usize = 3;

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

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// A slot was taken for this execution now.
    Acquired,
    /// It held its slot already (granted while it checked, or an earlier attempt's write
    /// landed).
    AlreadyHeld,
    /// In line: the task completes when a slot is handed to it.
    Queued,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Acquired => "acquired",
            Self::AlreadyHeld => "already_held",
            Self::Queued => "queued",
        }
    }
}

/// What the work gets under `semaphore` in its input (merged into the execution input).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SemaphoreContext {
    pub lock: String,
    /// `null` until a slot is held (the work runs only with one).
    pub fencing_token: Option<u64>,
    pub holder: String,
    pub acquisition: String,
    /// The Lambda function the work-function runner invokes; absent for state machine work.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub function: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkContext {
    pub semaphore: SemaphoreContext,
}

/// The child execution the lock-protected machine starts once the slot is held.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkAnswer {
    /// The user's state machine, or the work-function runner for a Lambda function.
    pub state_machine: String,
    /// The child execution's name: deterministic per acquisition (the redrive guard).
    pub name: String,
    /// Merged into the execution input to make the work's input.
    pub context: WorkContext,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AcquireResponse {
    /// True when this execution holds a slot now (newly taken or already held).
    pub acquired: bool,
    pub outcome: Outcome,
    /// The fencing token of the held slot; `null` while in line.
    pub token: Option<u64>,
    /// Slots held now, as the write that took this one saw them; `null` while in line, or when
    /// a hand-off granted the slot.
    pub count: Option<usize>,
    /// The limit the request asked for.
    pub limit: u32,
    /// The weight the request asked for (1 unless it named one).
    pub weight: u32,
    /// The start rate the request asked for, acquisitions per second; `null`: none.
    pub rate: Option<f64>,
    pub lock: String,
    pub holder: String,
    pub acquisition: String,
    /// The name for a child execution run under this acquisition (as `work.name`): a caller's own
    /// machine that starts its work with `startExecution.sync:2` names it so, which makes a
    /// redrive into the work fail instead of running it again without a slot.
    pub child_name: String,
    /// When the execution was put in line (RFC 3339): its place. `null` if it never waited.
    pub queued_at: Option<String>,
    /// The work to run with the slot (the lock-protected machine's); `null` otherwise.
    pub work: Option<WorkAnswer>,
}

fn work_answer(
    work: &Work,
    request: &AcquireRequest,
    child_name: &str,
    token: Option<u64>,
) -> WorkAnswer {
    WorkAnswer {
        state_machine: work.state_machine.clone(),
        name: child_name.to_owned(),
        context: WorkContext {
            semaphore: SemaphoreContext {
                lock: request.lock.to_string(),
                fencing_token: token,
                holder: request.identity.holder.to_string(),
                acquisition: request.identity.acquisition.to_string(),
                function: (work.kind == WorkKind::Function).then(|| work.arn.clone()),
            },
        },
    }
}

/// The answer to `request` once it holds `token` (`None`: the answer a waiter is queued with,
/// which the hand-off that grants it fills in: see `lambda_common::granted_answer`).
fn answer(
    request: &AcquireRequest,
    outcome: Outcome,
    token: Option<u64>,
    count: Option<usize>,
    queued_at_ms: Option<u64>,
) -> AcquireResponse {
    let identity = &request.identity;
    let child_name = child_execution_name(identity);
    AcquireResponse {
        acquired: token.is_some(),
        outcome,
        token,
        count,
        limit: request.terms.limit.get(),
        weight: request.terms.weight.get(),
        rate: request.terms.rate.map(|rate| rate.as_per_second()),
        lock: request.lock.to_string(),
        holder: identity.holder.to_string(),
        acquisition: identity.acquisition.to_string(),
        queued_at: queued_at_ms.map(rfc3339_millis),
        work: request
            .work
            .as_ref()
            .map(|work| work_answer(work, request, &child_name, token)),
        child_name,
    }
}

fn fenced(request: &AcquireRequest, reason: semaphore_core::FenceReason) -> HandlerError {
    let identity = &request.identity;
    let message = format!(
        "acquisition {} of {} on lock \"{}\" is fenced: {}; it can never hold a slot, a new \
         acquire needs a new acquisition id",
        identity.acquisition,
        identity.holder,
        request.lock,
        reason.describe()
    );
    tracing::warn!(lock = %request.lock, holder = %identity.holder, acquisition = %identity.acquisition, "{message}");
    HandlerError::Fenced(message)
}

/// A poller in line: it asks again to keep its place (and to find its slot once granted).
fn busy(request: &AcquireRequest, queued_at_ms: u64, poll_ms: u64) -> HandlerError {
    HandlerError::Busy(format!(
        "lock \"{}\" is full: {} is in its line since {} and holds no slot yet; ask again \
         within {} s with the same execution and state.EnteredTime and a larger \
         state.RetryCount to keep the place",
        request.lock,
        request.identity.holder,
        rfc3339_millis(queued_at_ms),
        poll_ms / 1000
    ))
}

fn expired(request: &AcquireRequest, why: &str) -> HandlerError {
    HandlerError::Expired(format!(
        "the acquire of {} on lock \"{}\" asked at {} {why}: nothing is held or queued; enter the \
         acquire state again (its Catch of SemaphoreExpired does)",
        request.identity.holder,
        request.lock,
        rfc3339_millis(request.requested_at_ms)
    ))
}

/// The error once a waiter queued at `queued_at_ms` has waited past `MAX_WAIT_SECONDS`, or (a
/// parked standard execution) checked more often than its execution's history has room for.
fn wait_budget(
    request: &AcquireRequest,
    config: &Config,
    waiter: &Waiter,
    now_ms: u64,
) -> Result<(), HandlerError> {
    let waited = Duration::from_millis(now_ms.saturating_sub(waiter.key.queued_at_ms));
    let identity = &request.identity;
    let why = if waited > config.max_wait {
        format!(
            "longer than the acquire function's MAX_WAIT_SECONDS of {} s. Start it again later, or \
             raise the limit or the stack's MaxWaitSeconds",
            config.max_wait.as_secs()
        )
    } else if waiter.task_token().is_some() && u64::from(waiter.checks) >= MAX_FALLBACK_CHECKS {
        // Only a parked standard execution's checks fill its history; a poller's polls (an
        // Express execution, a function, a script) keep no Standard history, and its wait is
        // bounded by MAX_WAIT_SECONDS alone.
        format!(
            "and checked {} times: more would pass Step Functions' 25,000 events of one \
             execution's history. Lengthen the acquire state's TimeoutSeconds",
            waiter.checks
        )
    } else {
        return Ok(());
    };
    let message = format!(
        "{} has waited {} s for a slot of lock \"{}\" (limit {}) {why}; it holds no slot",
        identity.holder,
        waited.as_secs(),
        request.lock,
        request.terms.limit,
    );
    tracing::warn!(lock = %request.lock, holder = %identity.holder, acquisition = %identity.acquisition, "{message}");
    Err(HandlerError::WaitTimeout(message))
}

/// Where an invocation left the execution.
enum Taken {
    /// It holds a slot: complete its task now (`taken`: by this invocation's own write).
    Holding {
        token: FencingToken,
        count: Option<usize>,
        taken: bool,
        queued_at_ms: Option<u64>,
    },
    /// In line (`new`: queued by this invocation, not a check finding it there): whoever grants
    /// it a slot completes its task.
    InLine { new: bool, queued_at_ms: u64 },
    /// A later attempt of its task has checked already: this invocation's task is over, and
    /// nothing is left to it.
    Superseded,
}

/// Validates the payload, then takes a slot or waits in line (see the module documentation).
/// Nothing is sent to the table for bad input.
pub async fn acquire<S: ItemStore, C: TaskCallbacks, X: ExecutionStatus>(
    semaphore: &Semaphore<S>,
    config: &Config,
    hand_offs: &HandOffs<C, X>,
    payload: &Value,
) -> Result<AcquireResponse, HandlerError> {
    // Bad input is logged by the runtime with the error it answers.
    let mut request = config.resolver.acquire(payload)?;
    if let Waiting::Polls { .. } = request.waiting {
        // A poller asks anew with each poll: its horizon counts from this invocation (its
        // state's entry time is its first ask, and stays its place in line). A late poll of a
        // caller that has gone holds a slot no longer than its lease (F13).
        request.requested_at_ms = semaphore.now_ms().max(request.asked_at_ms);
    }
    let request = request;
    let (lock, identity) = (&request.lock, &request.identity);
    let callbacks = &hand_offs.waker.callbacks;
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
        // Boxed: a deep future (the hand-off nests), kept off the caller's.
        Box::pin(take(semaphore, config, hand_offs, &request)).await
    }
    .await;
    // F14: on a lock its operator configured, the answer says the terms it took.
    let configured = match &result {
        Ok((_, Some(item))) => terms_on(item.config.as_ref(), lock, request.terms).ok(),
        _ => None,
    };
    let request = AcquireRequest {
        terms: configured.unwrap_or(request.terms),
        ..request.clone()
    };
    emit_metrics(semaphore, hand_offs, &request, &result);
    // F13: an acquire that found the lock full took back the slots whose lease had passed.
    hand_offs
        .metrics
        .taken_back(&semaphore.drain_taken_back(), semaphore.now_ms());
    let result = result.map(|(taken, _)| taken);
    if let (Err(e), Some(task_token)) = (&result, request.waiting.task_token()) {
        if let Err(sent) = callbacks
            .fail(task_token, e.error_type(), e.message())
            .await
        {
            tracing::warn!(%lock, holder = %identity.holder, error = %sent, "could not fail the acquire task");
        }
    }
    let response = match result? {
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
            answer(&request, outcome, Some(token.0), count, queued_at_ms)
        }
        Taken::InLine { queued_at_ms, .. } => {
            if let Waiting::Polls { poll_ms } = request.waiting {
                return Err(busy(&request, queued_at_ms, poll_ms));
            }
            answer(&request, Outcome::Queued, None, None, Some(queued_at_ms))
        }
        Taken::Superseded => {
            if let Waiting::Polls { poll_ms } = request.waiting {
                return Err(busy(&request, request.asked_at_ms, poll_ms));
            }
            answer(&request, Outcome::Queued, None, None, None)
        }
    };
    if let (true, Some(task_token)) = (response.acquired, request.waiting.task_token()) {
        // Complete our own task: the slot is ours.
        let output = serde_json::to_string(&response)
            .map_err(|e| HandlerError::InvalidInput(e.to_string()))?;
        if let Err(e) = callbacks.succeed(task_token, &output).await {
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
    request: &AcquireRequest,
    result: &Result<(Taken, Option<SemaphoreItem>), HandlerError>,
) {
    let now_ms = semaphore.now_ms();
    let seen = result.as_ref().ok().and_then(|(_, seen)| seen.as_ref());
    let (outcome, waited_since) = match result.as_ref().map(|(taken, _)| taken) {
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

/// The answer a waiter queued at `queued_at_ms` gets with its slot, before the slot is known:
/// what its record keeps for the hand-off to fill in (`lambda_common::granted_answer`).
fn waiter_context(request: &AcquireRequest, queued_at_ms: u64) -> Result<String, HandlerError> {
    let waiting = answer(request, Outcome::Acquired, None, None, Some(queued_at_ms));
    serde_json::to_string(&waiting).map_err(|e| HandlerError::InvalidInput(e.to_string()))
}

/// Steps 1-3 of the module documentation, and the lock as the acquire's write left it or saw
/// it (the metrics').
async fn take<S: ItemStore, C: TaskCallbacks, X: ExecutionStatus>(
    semaphore: &Semaphore<S>,
    config: &Config,
    hand_offs: &HandOffs<C, X>,
    request: &AcquireRequest,
) -> Result<(Taken, Option<SemaphoreItem>), HandlerError> {
    let (lock, identity) = (&request.lock, &request.identity);
    let id = WaiterId::of(identity);
    let store_error = |e: semaphore_core::Error| {
        let e = HandlerError::from(e);
        tracing::error!(%lock, error = %e, "acquire failed");
        e
    };
    // 1. A free slot.
    let (acquired, seen) = semaphore
        .acquire_seeing(
            lock,
            identity,
            request.run,
            request.terms,
            request.requested_at_ms,
        )
        .await
        .map_err(store_error)?;
    let holding = |token: FencingToken, count, taken| Taken::Holding {
        token,
        count: Some(count),
        taken,
        queued_at_ms: None,
    };
    match acquired {
        AcquireOutcome::Acquired { token, count } => {
            return Ok((holding(token, count, true), seen))
        }
        AcquireOutcome::AlreadyHeld { token, count } => {
            return Ok((holding(token, count, false), seen))
        }
        AcquireOutcome::Fenced(reason) => return Err(fenced(request, reason)),
        // Full, or an operator reconfiguring the lock as it was asked: in line, where the
        // queue write learns the configuration again. Expired (a retry of the state past the
        // horizon: nothing was sent): a waiter still keeps its place below, which takes no
        // slot; anyone else enters the state again.
        AcquireOutcome::Expired
        | AcquireOutcome::Full { .. }
        | AcquireOutcome::RateLimited { .. }
        | AcquireOutcome::Configured(_) => {}
    }
    // 2. In line already: keep the place, with this attempt's token.
    if let Some(waiter) = semaphore.waiter(lock, id).await.map_err(store_error)? {
        if let Some(taken) = check(semaphore, config, hand_offs, request, &waiter).await? {
            return Ok((taken, seen));
        }
        // Granted since its acquire was refused: the slot is its own.
        let (acquired, seen) = semaphore
            .acquire_seeing(
                lock,
                identity,
                request.run,
                request.terms,
                request.requested_at_ms,
            )
            .await
            .map_err(store_error)?;
        match acquired {
            AcquireOutcome::AlreadyHeld { token, count } => {
                return Ok((holding(token, count, false), seen))
            }
            AcquireOutcome::Acquired { token, count } => {
                return Ok((holding(token, count, true), seen))
            }
            AcquireOutcome::Fenced(reason) => return Err(fenced(request, reason)),
            AcquireOutcome::Expired => {
                return Err(expired(request, "is older than the acquire horizon"))
            }
            // Out of line and no slot (a grant freed again, say): it queues anew below.
            AcquireOutcome::Full { .. }
            | AcquireOutcome::RateLimited { .. }
            | AcquireOutcome::Configured(_) => {}
        }
    }
    if acquired == AcquireOutcome::Expired {
        return Err(expired(request, "is older than the acquire horizon"));
    }
    // 3. Queue at this request's time, on the lock's configuration if its refusal showed one
    // (F14): the answer a hand-off sends says the terms taken.
    let configured = seen
        .as_ref()
        .and_then(|item| terms_on(item.config.as_ref(), lock, request.terms).ok());
    let request = &AcquireRequest {
        terms: configured.unwrap_or(request.terms),
        ..request.clone()
    };
    let context = waiter_context(request, request.asked_at_ms)?;
    let waiter = match &request.waiting {
        Waiting::Parked(task_token) => Waiter::new(
            lock.clone(),
            identity.clone(),
            request.run,
            request.terms,
            request.asked_at_ms,
            task_token.clone(),
            request.attempt,
            context,
        ),
        Waiting::Polls { poll_ms } => Waiter::polling(
            lock.clone(),
            identity.clone(),
            request.run,
            request.terms,
            request.asked_at_ms,
            semaphore.now_ms().saturating_add(*poll_ms),
            request.attempt,
            context,
        ),
    };
    for _ in 0..QUEUE_ROUNDS {
        match semaphore
            .enqueue(&waiter, request.requested_at_ms)
            .await
            .map_err(store_error)?
        {
            QueueOutcome::Queued => {
                tracing::info!(%lock, holder = %identity.holder, acquisition = %identity.acquisition, queued_at = request.asked_at_ms, in_line_at_ms = semaphore.now_ms(), "queued");
                // F8: a slot freed between our "full" and our queueing has no one else to hand
                // it on.
                let handed = hand_offs.run(semaphore, lock, None).await;
                let taken = in_line(request, &handed, true, request.asked_at_ms);
                return Ok((taken, seen));
            }
            QueueOutcome::AlreadyQueued => {
                // Another attempt of its task queued it since step 1 found no record (a slow
                // invocation of an earlier attempt): check again, as step 1 would.
                let Some(record) = semaphore.waiter(lock, id).await.map_err(store_error)? else {
                    continue;
                };
                if let Some(taken) = check(semaphore, config, hand_offs, request, &record).await? {
                    return Ok((taken, None));
                }
            }
            QueueOutcome::AlreadyHeld { token, count } => {
                return Ok((holding(token, count, false), None))
            }
            QueueOutcome::Fenced(reason) => return Err(fenced(request, reason)),
            QueueOutcome::Expired => {
                return Err(expired(request, "is older than the acquire horizon"))
            }
            QueueOutcome::Configured(_) => continue,
            QueueOutcome::Free => match semaphore
                .acquire_in_run(
                    lock,
                    identity,
                    request.run,
                    request.terms,
                    request.requested_at_ms,
                )
                .await
                .map_err(store_error)?
            {
                AcquireOutcome::Acquired { token, count } => {
                    return Ok((holding(token, count, true), None))
                }
                AcquireOutcome::AlreadyHeld { token, count } => {
                    return Ok((holding(token, count, false), None))
                }
                AcquireOutcome::Fenced(reason) => return Err(fenced(request, reason)),
                AcquireOutcome::Full { .. }
                | AcquireOutcome::RateLimited { .. }
                | AcquireOutcome::Configured(_) => continue,
                AcquireOutcome::Expired => {
                    return Err(expired(request, "is older than the acquire horizon"))
                }
            },
        }
    }
    Err(expired(
        request,
        "found the lock turning free and full again under it",
    ))
}

/// Where an invocation that left its caller in line and moved the line left it: a poller the
/// hand-off granted holds its slot now (a parked task was woken by the hand-off itself).
fn in_line(request: &AcquireRequest, handed: &HandOff, new: bool, queued_at_ms: u64) -> Taken {
    let granted = granted_to(handed, &request.identity);
    match (&request.waiting, granted) {
        (Waiting::Polls { .. }, Some(token)) => Taken::Holding {
            token,
            count: None,
            taken: true,
            queued_at_ms: Some(queued_at_ms),
        },
        _ => Taken::InLine { new, queued_at_ms },
    }
}

fn granted_to(handed: &HandOff, identity: &Identity) -> Option<FencingToken> {
    handed
        .woken
        .iter()
        .find(|(woken, _)| woken == identity)
        .map(|(_, token)| *token)
}

/// Step 1, a check of an execution found in line (`waiter`, as read): past its budget it leaves
/// the line; else its record gets this attempt's token and the line moves. `None`: it is not in
/// line any more (granted since it was read: the caller's acquire finds the slot held).
async fn check<S: ItemStore, C: TaskCallbacks, X: ExecutionStatus>(
    semaphore: &Semaphore<S>,
    config: &Config,
    hand_offs: &HandOffs<C, X>,
    request: &AcquireRequest,
    waiter: &Waiter,
) -> Result<Option<Taken>, HandlerError> {
    let (lock, identity) = (&request.lock, &request.identity);
    let id = waiter.id();
    let store_error = |e: semaphore_core::Error| {
        let e = HandlerError::from(e);
        tracing::error!(%lock, error = %e, "checking the line failed");
        e
    };
    if waiter.attempt > request.attempt {
        // A later attempt of the task has its token there: this one's task is over.
        tracing::info!(%lock, holder = %identity.holder, "a later attempt checked already");
        return Ok(Some(Taken::Superseded));
    }
    if waiter.attempt == request.attempt {
        // In line with this very attempt's token (its queue write landed, and the check or
        // the queueing was sent again): move the line, as after queueing.
        let handed = hand_offs.run(semaphore, lock, None).await;
        return Ok(Some(in_line(
            request,
            &handed,
            false,
            waiter.key.queued_at_ms,
        )));
    }
    if let Err(timeout) = wait_budget(request, config, waiter, semaphore.now_ms()) {
        if semaphore.leave(lock, id).await.map_err(store_error)? {
            return Err(timeout);
        }
        // Granted meanwhile: the slot is its own.
        return Ok(None);
    }
    // A poll keeps the poller's place for another poll window (F13).
    let wakeup = match &request.waiting {
        Waiting::Parked(task_token) => Wakeup::Task(task_token.clone()),
        Waiting::Polls { poll_ms } => Wakeup::Poll {
            until_ms: semaphore.now_ms().saturating_add(*poll_ms),
        },
    };
    if !semaphore
        .repark(lock, id, wakeup, request.attempt)
        .await
        .map_err(store_error)?
    {
        return Ok(None);
    }
    // A wake-up may have been lost (a waker that crashed between its grant and its wake-up,
    // or whose SendTaskSuccess went to a task that had timed out): move the line, which may
    // grant this very execution and complete its new task.
    let handed = hand_offs.run(semaphore, lock, None).await;
    Ok(Some(in_line(
        request,
        &handed,
        false,
        waiter.key.queued_at_ms,
    )))
}

/// The Lambda handler. An answer that is a failure, not the protocol working or a caller's
/// mistake, is counted (`Failures`, which the stack's alarm watches: Lambda's `Errors` counts
/// every poll of a poller in line too).
pub async fn handle<S: ItemStore, C: TaskCallbacks, X: ExecutionStatus>(
    semaphore: &Semaphore<S>,
    config: &Config,
    hand_offs: &HandOffs<C, X>,
    event: LambdaEvent<Value>,
) -> Result<AcquireResponse, HandlerError> {
    let answer = acquire(semaphore, config, hand_offs, &event.payload).await;
    hand_offs
        .metrics
        .answered(metrics::ACQUIRE_FUNCTION, &answer, semaphore.now_ms());
    answer
}
