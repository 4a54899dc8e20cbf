//! The acquire function: one attempt to take a slot of a semaphore for a Step Functions
//! execution, and what the lock-protected state machine does next.
//!
//! Payload (what the lock-protected state machine sends; see `lambda_common::Resolver` for every
//! shape): `{"input": $$.Execution.Input, "holder": $$.Execution.Id, "redrive_count":
//! $$.Execution.RedriveCount, "started_at": $$.Execution.StartTime, "requested_at":
//! $$.State.EnteredTime}`. The lock, limit, weight, rate and work come from the payload, else
//! the execution input, else the function's `DEFAULT_LOCK`, `DEFAULT_LIMIT`, `DEFAULT_WEIGHT`
//! (else 1), `DEFAULT_RATE` (else none) and `DEFAULT_WORK`; the acquisition is
//! `r<redrive_count>`, one per run of the execution. A caller's own machine may send `{"lock",
//! "limit", "weight", "rate", "holder", "acquisition", "requested_at"}` instead.
//!
//! One conditional write, no read. `requested_at` is when the acquire was asked for: the state's
//! entry time comes before any release or cleanup this acquire must not outlive, however long
//! Lambda takes to start it (see `semaphore_core::Timing`).
//!
//! Answer (every outcome): `{"acquired", "outcome":
//! "acquired"|"already_held"|"full"|"rate_limited"|"expired"|"queued", "token", "count",
//! "limit", "weight", "rate", "next_start_at", "lock", "holder", "acquisition", "child_name",
//! "queued_at", "fallback_seconds", "work"}`. "Full" (the weight does not fit, or others wait)
//! and "rate_limited" (the lock's start rate is spent; `next_start_at` says when the next start
//! may land) are answers, not errors: the machine then waits in line (below), passing
//! `queued_at` (this request's time, its place in line) back. "Expired" (the request is older than the horizon) makes the machine
//! enter its acquire state again, which makes a new request time. `work` names the child
//! execution to start with the slot.
//!
//! Waiting in line: a payload with `task_token` (`$$.Task.Token` of a `.waitForTaskToken` task)
//! and `queued_at` parks the execution (see `semaphore_core::queue`). The function keeps the
//! waiter's place if it is in line already (a fallback check: the parked task timed out and was
//! entered again, with a new token), else queues it, then hands any free slot to the head of
//! the line (a slot may have been freed between "full" and "queued"). The task is completed by
//! whoever grants the waiter a slot (`SendTaskSuccess` of the answer above, `acquired`), by this
//! function when the slot is free or already held (it completes its own task), or with
//! `SendTaskFailure` (`SemaphoreFenced`, `SemaphoreWaitTimeout`, `SemaphoreInvalidInput`,
//! `SemaphoreStoreError`). Its own answer (`outcome` "queued" or "acquired") is for the logs. A
//! head of the line whose start the lock's rate holds back for more than 2 s is told to come
//! back instead (`SendTaskSuccess` of `lambda_common::deferred_answer`: `acquired` false,
//! "rate_limited", `wait_seconds`): the machine waits that long and enters its wait task again,
//! keeping its place.
//!
//! A redriven execution acquires in its new run (`redrive_count`), with its own acquisition: the
//! cleanup of an earlier run fenced that run only, so the new one waits its turn like any other.
//!
//! Errors: `SemaphoreFenced` (this acquisition was released or its execution cleaned up: it
//! will never get a slot), `SemaphoreInvalidInput` (nothing written), `SemaphoreMisconfigured`
//! (the caller is not a machine the stack protects, or is Express, or the work is an Express
//! machine: `lambda_common::deployment`; nothing written), `SemaphoreOldFormat` (the
//! lock's item is of version 1), `SemaphoreWaitTimeout` (waited longer than `MAX_WAIT_SECONDS`;
//! holds no slot), `SemaphoreStoreError` (retry).

use std::time::Duration;

use lambda_common::{
    child_execution_name, granted_answer, metrics, AcquireRequest, ConfigError, Deployment,
    HandOffs, HandlerError, Resolver, Settings, TaskCallbacks, WaitRequest, Work, WorkKind,
};
use lambda_runtime::LambdaEvent;
use semaphore_core::{
    rfc3339_millis, AcquireOutcome, Attempt, ExecutionStatus, FencingToken, ItemStore,
    QueueOutcome, Semaphore, Waiter,
};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// How often one invocation tries to queue when the lock turns free and full again between its
/// writes (each round is a write that found the other state): then the fallback check goes on.
const QUEUE_ROUNDS: usize = 3;

/// What the function reads once per cold start besides the semaphore.
#[derive(Debug, Clone)]
pub struct Config {
    /// Defaults and allowed work (`DEFAULT_LOCK`, `DEFAULT_LIMIT`, `DEFAULT_WEIGHT`,
    /// `DEFAULT_RATE`, `DEFAULT_WORK`, `WORK_STATE_MACHINES`, `WORK_FUNCTIONS`,
    /// `WORK_FUNCTION_RUNNER`).
    pub resolver: Resolver,
    /// `MAX_WAIT_SECONDS`: past it, a full answer is `SemaphoreWaitTimeout`.
    pub max_wait: Duration,
    /// `QUEUE_FALLBACK_SECONDS`: how long a parked execution waits before it checks again (its
    /// wait task's timeout): the most a lost wake-up costs. Lengthened where `max_wait` would
    /// otherwise let one wait's checks pass Step Functions' history quota
    /// (`lambda_common::history_safe_fallback`).
    pub fallback: Duration,
    /// The protected machines (`STATE_MACHINE_ARNS`) a caller must be one of, and the work
    /// machines' types (set by `main`: `DescribeStateMachine`); see `lambda_common::deployment`.
    pub deployment: Deployment,
}

impl Config {
    pub fn from_settings<F: Fn(&str) -> Option<String>>(
        settings: &Settings<F>,
    ) -> Result<Self, ConfigError> {
        let (max_wait, fallback) = settings.waiting()?;
        Ok(Self {
            resolver: settings.resolver()?,
            max_wait,
            fallback,
            deployment: Deployment {
                protected: settings.state_machines()?,
                machine_types: None,
            },
        })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    Acquired,
    AlreadyHeld,
    Full,
    /// The lock's start rate is spent: wait in line as for `Full` (the line's hand-offs start
    /// waiters at the rate).
    RateLimited,
    Expired,
    /// In line (a wait payload): the task completes when a slot is handed to it.
    Queued,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Acquired => "acquired",
            Self::AlreadyHeld => "already_held",
            Self::Full => "full",
            Self::RateLimited => "rate_limited",
            Self::Expired => "expired",
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
    /// True when this identity holds a slot now (newly taken or already held).
    pub acquired: bool,
    pub outcome: Outcome,
    /// The fencing token of the held slot; `null` otherwise.
    pub token: Option<u64>,
    /// Slots held now; `null` when expired (nothing was sent).
    pub count: Option<usize>,
    /// The limit the request asked for.
    pub limit: u32,
    /// The weight the request asked for (1 unless it named one): pass it to the release.
    pub weight: u32,
    /// The start rate the request asked for, acquisitions per second; `null`: none.
    pub rate: Option<f64>,
    /// Rate limited: when the next start may land (RFC 3339). `null` otherwise.
    pub next_start_at: Option<String>,
    pub lock: String,
    pub holder: String,
    pub acquisition: String,
    /// The name for a child execution run under this acquisition (as `work.name`): a caller's own
    /// machine that starts its work with `startExecution.sync:2` names it so, which makes a
    /// redrive into the work fail instead of running it again without a slot.
    pub child_name: String,
    /// Full (or queued): the request time that is the execution's place in line, RFC 3339: pass
    /// it back as the wait payload's `queued_at`. `null` otherwise.
    pub queued_at: Option<String>,
    /// Full: the timeout of the wait task (`TimeoutSecondsPath`), after which a parked
    /// execution checks again. 0 otherwise.
    pub fallback_seconds: u64,
    /// Since when this run of the execution has waited (its start, or its redrive), RFC 3339:
    /// the wait budget's start, which a later task that passes this answer back instead of the
    /// execution node and input (`"answer.$": "$.semaphore"`) keeps. `null` when unknown.
    pub waiting_since: Option<String>,
    /// The work to run with the slot; `null` without an execution input.
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
fn holding_answer(
    request: &AcquireRequest,
    outcome: Outcome,
    token: Option<u64>,
    count: Option<usize>,
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
        next_start_at: None,
        lock: request.lock.to_string(),
        holder: identity.holder.to_string(),
        acquisition: identity.acquisition.to_string(),
        queued_at: None,
        fallback_seconds: 0,
        waiting_since: request.waiting_since_ms.map(rfc3339_millis),
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

/// How long the execution has waited, and the error once that is past `MAX_WAIT_SECONDS`.
fn wait_budget(
    request: &AcquireRequest,
    config: &Config,
    now_ms: u64,
    count: Option<usize>,
) -> Result<(), HandlerError> {
    // Without a known start the wait has no budget.
    let Some(since) = request.waiting_since_ms else {
        return Ok(());
    };
    let waited = Duration::from_millis(now_ms.saturating_sub(since));
    if waited <= config.max_wait {
        return Ok(());
    }
    let identity = &request.identity;
    let message = format!(
        "{} has waited {} s for a slot of lock \"{}\" (limit {}{}), longer than the acquire \
         function's MAX_WAIT_SECONDS of {} s; it holds no slot. Start it again later, or raise \
         the limit or the stack's MaxWaitSeconds",
        identity.holder,
        waited.as_secs(),
        request.lock,
        request.terms.limit,
        count.map_or(String::new(), |n| format!(", {n} held")),
        config.max_wait.as_secs()
    );
    tracing::warn!(lock = %request.lock, holder = %identity.holder, acquisition = %identity.acquisition, "{message}");
    Err(HandlerError::WaitTimeout(message))
}

/// Validates the payload, then takes a slot (or, for a wait payload, waits in line). Nothing is
/// sent to the table for bad input.
pub async fn acquire<S: ItemStore, C: TaskCallbacks, X: ExecutionStatus>(
    semaphore: &Semaphore<S>,
    config: &Config,
    hand_offs: &HandOffs<C, X>,
    payload: &Value,
) -> Result<AcquireResponse, HandlerError> {
    // Bad input is logged by the runtime with the error it answers.
    let request = config.resolver.acquire(payload)?;
    // Before anything is written: a misconfigured stack is refused by name, not left to hang.
    config
        .deployment
        .check_caller(request.identity.holder.as_str())?;
    if let Some(work) = &request.work {
        config.deployment.check_work(work).await?;
    }
    if let Some(wait) = &request.wait {
        // Boxed: a deep future, kept off the fast path's.
        return Box::pin(wait_in_line(semaphore, config, hand_offs, &request, wait)).await;
    }
    let AcquireRequest {
        lock,
        terms,
        identity,
        run,
        requested_at_ms,
        ..
    } = &request;
    let (answer, seen) = semaphore
        .acquire_seeing(lock, identity, *run, *terms, *requested_at_ms)
        .await
        .map_err(HandlerError::from)
        .inspect_err(|e| tracing::error!(lock = %lock, error = %e, "acquire failed"))?;
    let now_ms = semaphore.now_ms();
    let mut line = metrics::Line::of(lock)
        .dimension(metrics::OUTCOME, outcome_of(&answer))
        .value(metrics::ACQUISITIONS, 1);
    if let Some(item) = &seen {
        line = line
            .value(metrics::WEIGHT_USED, item.used as f64)
            .values(metrics::LIMIT, item.limit.map(|l| f64::from(l.get())))
            .value(metrics::WAITING, item.waiting as f64);
    }
    let waited = matches!(answer, AcquireOutcome::Acquired { .. })
        .then(|| now_ms.saturating_sub(*requested_at_ms) as f64);
    hand_offs
        .metrics
        .emit(now_ms, &line.values(metrics::WAIT_TIME, waited));
    let response = match answer {
        AcquireOutcome::Acquired { token, count } => {
            holding_answer(&request, Outcome::Acquired, Some(token.0), Some(count))
        }
        AcquireOutcome::AlreadyHeld { token, count } => {
            holding_answer(&request, Outcome::AlreadyHeld, Some(token.0), Some(count))
        }
        AcquireOutcome::Full { count, .. } => {
            wait_budget(&request, config, semaphore.now_ms(), Some(count))?;
            AcquireResponse {
                queued_at: Some(rfc3339_millis(*requested_at_ms)),
                fallback_seconds: config.fallback.as_secs(),
                ..holding_answer(&request, Outcome::Full, None, Some(count))
            }
        }
        AcquireOutcome::RateLimited { next_start_ms } => {
            wait_budget(&request, config, semaphore.now_ms(), None)?;
            AcquireResponse {
                queued_at: Some(rfc3339_millis(*requested_at_ms)),
                fallback_seconds: config.fallback.as_secs(),
                next_start_at: Some(rfc3339_millis(next_start_ms)),
                ..holding_answer(&request, Outcome::RateLimited, None, None)
            }
        }
        AcquireOutcome::Expired => holding_answer(&request, Outcome::Expired, None, None),
        AcquireOutcome::Fenced(reason) => return Err(fenced(&request, reason)),
    };
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
        work = response.work.as_ref().map(|w| w.state_machine.as_str()),
        "acquire"
    );
    Ok(response)
}

/// The `Outcome` dimension of an acquire's `Acquisitions` metric.
fn outcome_of(answer: &AcquireOutcome) -> &'static str {
    match answer {
        AcquireOutcome::Acquired { .. } => Outcome::Acquired.as_str(),
        AcquireOutcome::AlreadyHeld { .. } => Outcome::AlreadyHeld.as_str(),
        AcquireOutcome::Full { .. } => Outcome::Full.as_str(),
        AcquireOutcome::RateLimited { .. } => Outcome::RateLimited.as_str(),
        AcquireOutcome::Expired => Outcome::Expired.as_str(),
        AcquireOutcome::Fenced(_) => FENCED,
    }
}

/// The `Outcome` of an acquisition refused for good (`SemaphoreFenced`).
const FENCED: &str = "fenced";
/// The `Outcome` of a wait past `MAX_WAIT_SECONDS` (`SemaphoreWaitTimeout`).
const TIMED_OUT: &str = "timed_out";

/// The wait mode's `Acquisitions` line: a waiter queued, holding (with its wait from its place
/// in line), refused, timed out, or not queued this time ("expired"). A fallback check that
/// finds it still in line writes none: it asked once.
fn wait_metrics<S: ItemStore, C: TaskCallbacks, X: ExecutionStatus>(
    semaphore: &Semaphore<S>,
    hand_offs: &HandOffs<C, X>,
    request: &AcquireRequest,
    wait: &WaitRequest,
    result: &Result<Queued, HandlerError>,
) {
    let outcome = match result {
        Ok(Queued::InLine { new: false }) => return,
        Ok(Queued::InLine { new: true }) => Outcome::Queued.as_str(),
        Ok(Queued::Holding { taken: true, .. }) => Outcome::Acquired.as_str(),
        Ok(Queued::Holding { taken: false, .. }) => Outcome::AlreadyHeld.as_str(),
        Ok(Queued::NotYet) => Outcome::Expired.as_str(),
        Err(HandlerError::Fenced(_)) => FENCED,
        Err(HandlerError::WaitTimeout(_)) => TIMED_OUT,
        Err(_) => return,
    };
    let now_ms = semaphore.now_ms();
    let waited = matches!(result, Ok(Queued::Holding { taken: true, .. }))
        .then(|| now_ms.saturating_sub(wait.queued_at_ms) as f64);
    let line = metrics::Line::of(&request.lock)
        .dimension(metrics::OUTCOME, outcome)
        .value(metrics::ACQUISITIONS, 1)
        .values(metrics::WAIT_TIME, waited);
    hand_offs.metrics.emit(now_ms, &line);
}

/// The wait mode (see the module documentation). Every final answer also completes the parked
/// task, so the machine goes on whether Step Functions takes the task's outcome from the
/// callback or from this invocation's error.
async fn wait_in_line<S: ItemStore, C: TaskCallbacks, X: ExecutionStatus>(
    semaphore: &Semaphore<S>,
    config: &Config,
    hand_offs: &HandOffs<C, X>,
    request: &AcquireRequest,
    wait: &WaitRequest,
) -> Result<AcquireResponse, HandlerError> {
    let callbacks = &hand_offs.waker.callbacks;
    let result = queue(semaphore, config, hand_offs, request, wait).await;
    wait_metrics(semaphore, hand_offs, request, wait, &result);
    let (lock, identity) = (&request.lock, &request.identity);
    match &result {
        Ok(Queued::InLine { .. }) => {}
        Ok(Queued::NotYet) => {
            tracing::info!(lock = %lock, holder = %identity.holder, "not queued this time; the fallback check asks again");
            return Ok(holding_answer(request, Outcome::Expired, None, None));
        }
        Ok(Queued::Holding { token, count, .. }) => {
            // Complete our own task: the slot is ours already.
            let answer = granted_answer(&waiter_context(request, wait, config)?, *token)
                .map_err(|e| HandlerError::InvalidInput(e.to_string()))?;
            if let Err(e) = callbacks.succeed(&wait.task_token, &answer).await {
                // Its fallback check finds the slot held and completes the task then.
                tracing::warn!(lock = %lock, holder = %identity.holder, error = %e, "could not complete the waiting task; its fallback check will");
            }
            tracing::info!(lock = %lock, holder = %identity.holder, acquisition = %identity.acquisition, token = token.0, count, at_ms = semaphore.now_ms(), "acquire (waited)");
            return Ok(holding_answer(
                request,
                Outcome::Acquired,
                Some(token.0),
                Some(*count),
            ));
        }
        Err(e) => {
            if let Err(sent) = callbacks
                .fail(&wait.task_token, e.error_type(), e.message())
                .await
            {
                tracing::warn!(lock = %lock, holder = %identity.holder, error = %sent, "could not fail the waiting task");
            }
        }
    }
    result?;
    tracing::info!(lock = %lock, holder = %identity.holder, acquisition = %identity.acquisition, queued_at = wait.queued_at_ms, in_line_at_ms = semaphore.now_ms(), "queued");
    Ok(AcquireResponse {
        queued_at: Some(rfc3339_millis(wait.queued_at_ms)),
        ..holding_answer(request, Outcome::Queued, None, None)
    })
}

/// The answer a waiter gets with its slot, before the slot is known: what its record keeps for
/// the hand-off to fill in (`lambda_common::granted_answer`). It keeps the waiter's place and
/// fallback too: a head the start rate defers (`lambda_common::deferred_answer`) enters its
/// wait task again with them.
fn waiter_context(
    request: &AcquireRequest,
    wait: &WaitRequest,
    config: &Config,
) -> Result<String, HandlerError> {
    serde_json::to_string(&AcquireResponse {
        queued_at: Some(rfc3339_millis(wait.queued_at_ms)),
        fallback_seconds: config.fallback.as_secs(),
        ..holding_answer(request, Outcome::Acquired, None, None)
    })
    .map_err(|e| HandlerError::InvalidInput(e.to_string()))
}

/// Where a wait left the execution.
enum Queued {
    /// In line (`new`: queued by this call, not a fallback check finding it there): whoever
    /// grants it a slot completes its task.
    InLine { new: bool },
    /// It holds a slot (`taken`: by this call's own acquire): complete its task now.
    Holding {
        token: FencingToken,
        count: usize,
        taken: bool,
    },
    /// Not in line this time (its request went past the horizon, or the lock kept turning
    /// free and full under it): the parked task's fallback timeout asks again.
    NotYet,
}

async fn queue<S: ItemStore, C: TaskCallbacks, X: ExecutionStatus>(
    semaphore: &Semaphore<S>,
    config: &Config,
    hand_offs: &HandOffs<C, X>,
    request: &AcquireRequest,
    wait: &WaitRequest,
) -> Result<Queued, HandlerError> {
    let (lock, identity) = (&request.lock, &request.identity);
    let id = wait.key(identity).id;
    let attempt = Attempt::new(request.requested_at_ms, 0);
    let store_error = |e: semaphore_core::Error| {
        let e = HandlerError::from(e);
        tracing::error!(lock = %lock, error = %e, "waiting in line failed");
        e
    };
    if let Err(timeout) = wait_budget(request, config, semaphore.now_ms(), None) {
        // Out of line first; a slot granted meanwhile is freed by the release the machine
        // runs after this error.
        semaphore.leave(lock, id).await.map_err(store_error)?;
        return Err(timeout);
    }
    // A fallback check: still in line, with the new task's token from now on.
    if semaphore
        .repark(lock, id, wait.task_token.clone(), attempt)
        .await
        .map_err(store_error)?
    {
        hand_offs.run(semaphore, lock, None).await;
        return Ok(Queued::InLine { new: false });
    }
    let context = waiter_context(request, wait, config)?;
    let waiter = Waiter::new(
        lock.clone(),
        identity.clone(),
        request.run,
        request.terms,
        wait.queued_at_ms,
        wait.task_token.clone(),
        attempt,
        context,
    );
    for _ in 0..QUEUE_ROUNDS {
        match semaphore
            .enqueue(&waiter, request.requested_at_ms)
            .await
            .map_err(store_error)?
        {
            QueueOutcome::AlreadyQueued => {
                // Its record landed since the re-park above found none: a queue write of its
                // earlier task, which timed out before it landed, so the record carries that
                // task's token. This task's token from now on, or its wake-up would fail.
                semaphore
                    .repark(lock, id, wait.task_token.clone(), attempt)
                    .await
                    .map_err(store_error)?;
                hand_offs.run(semaphore, lock, None).await;
                return Ok(Queued::InLine { new: false });
            }
            QueueOutcome::Queued => {
                // F8: a slot freed between our "full" and our queueing has no one else to
                // hand it on.
                hand_offs.run(semaphore, lock, None).await;
                return Ok(Queued::InLine { new: true });
            }
            QueueOutcome::AlreadyHeld { token, count } => {
                return Ok(Queued::Holding {
                    token,
                    count,
                    taken: false,
                })
            }
            QueueOutcome::Fenced(reason) => return Err(fenced(request, reason)),
            QueueOutcome::Expired => break,
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
                    return Ok(Queued::Holding {
                        token,
                        count,
                        taken: true,
                    })
                }
                AcquireOutcome::AlreadyHeld { token, count } => {
                    return Ok(Queued::Holding {
                        token,
                        count,
                        taken: false,
                    })
                }
                AcquireOutcome::Fenced(reason) => return Err(fenced(request, reason)),
                AcquireOutcome::Full { .. } | AcquireOutcome::RateLimited { .. } => continue,
                AcquireOutcome::Expired => break,
            },
        }
    }
    // The request went past its horizon, or the lock kept changing under it: nothing is held
    // and nothing queued; the parked task's fallback timeout asks again.
    Ok(Queued::NotYet)
}

/// The Lambda handler.
pub async fn handle<S: ItemStore, C: TaskCallbacks, X: ExecutionStatus>(
    semaphore: &Semaphore<S>,
    config: &Config,
    hand_offs: &HandOffs<C, X>,
    event: LambdaEvent<Value>,
) -> Result<AcquireResponse, HandlerError> {
    acquire(semaphore, config, hand_offs, &event.payload).await
}
