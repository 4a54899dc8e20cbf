//! The acquire function: one attempt to take a slot of a semaphore for a Step Functions
//! execution, and what the lock-protected state machine does next.
//!
//! Payload (what the lock-protected state machine sends; see `lambda_common::Resolver` for every
//! shape): `{"input": $$.Execution.Input, "holder": $$.Execution.Id, "redrive_count":
//! $$.Execution.RedriveCount, "started_at": $$.Execution.StartTime, "requested_at":
//! $$.State.EnteredTime}`. The lock, limit and work come from the execution input, else from the
//! function's `DEFAULT_LOCK`, `DEFAULT_LIMIT` and `DEFAULT_WORK`; the acquisition is
//! `r<redrive_count>`, one per run of the execution. A caller's own machine may send `{"lock",
//! "limit", "holder", "acquisition", "requested_at"}` instead.
//!
//! One conditional write, no read. `requested_at` is when the acquire was asked for: the state's
//! entry time comes before any release or cleanup this acquire must not outlive, however long
//! Lambda takes to start it (see `semaphore_core::Timing`).
//!
//! Answer (every outcome): `{"acquired", "outcome":
//! "acquired"|"already_held"|"full"|"expired", "token", "count", "limit", "lock", "holder",
//! "acquisition", "child_name", "wait_seconds", "work"}`. "Full" is an answer (the machine waits
//! `wait_seconds` and asks again with the same acquisition), not an error; so is "expired" (the
//! request is older than the horizon: the machine enters its acquire state again, which makes a
//! new request time). `work` names the child execution to start with the slot.
//!
//! A redriven execution acquires in its new run (`redrive_count`), with its own acquisition: the
//! cleanup of an earlier run fenced that run only, so the new one waits its turn like any other.
//!
//! Errors: `SemaphoreFenced` (this acquisition was released or its execution cleaned up: it
//! will never get a slot), `SemaphoreInvalidInput` (nothing written), `SemaphoreOldFormat` (the
//! lock's item is of version 1), `SemaphoreWaitTimeout` (waited longer than `MAX_WAIT_SECONDS`;
//! holds no slot), `SemaphoreStoreError` (retry).

use std::time::Duration;

use lambda_common::{
    child_execution_name, AcquireRequest, ConfigError, HandlerError, Resolver, Settings, Work,
    WorkKind,
};
use lambda_runtime::LambdaEvent;
use semaphore_core::{AcquireOutcome, ItemStore, Semaphore};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The shortest wait between two polls, in seconds.
pub const MIN_WAIT_SECONDS: u64 = 1;
/// The longest first wait: the waits are drawn from `MIN..=` this at first...
pub const FIRST_WAIT_SECONDS: u64 = 5;
/// ...and their upper end grows by a second per minute waited, up to this.
pub const LONGEST_WAIT_SECONDS: u64 = 15;

/// What the function reads once per cold start besides the semaphore.
#[derive(Debug, Clone)]
pub struct Config {
    /// Defaults and allowed work (`DEFAULT_LOCK`, `DEFAULT_LIMIT`, `DEFAULT_WORK`,
    /// `WORK_STATE_MACHINES`, `WORK_FUNCTIONS`, `WORK_FUNCTION_RUNNER`).
    pub resolver: Resolver,
    /// `MAX_WAIT_SECONDS`: past it, a full answer is `SemaphoreWaitTimeout`.
    pub max_wait: Duration,
}

impl Config {
    pub fn from_settings<F: Fn(&str) -> Option<String>>(
        settings: &Settings<F>,
    ) -> Result<Self, ConfigError> {
        Ok(Self {
            resolver: settings.resolver()?,
            max_wait: settings.max_wait()?,
        })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    Acquired,
    AlreadyHeld,
    Full,
    Expired,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Acquired => "acquired",
            Self::AlreadyHeld => "already_held",
            Self::Full => "full",
            Self::Expired => "expired",
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

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
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
    pub lock: String,
    pub holder: String,
    pub acquisition: String,
    /// The name for a child execution run under this acquisition (as `work.name`): a caller's own
    /// machine that starts its work with `startExecution.sync:2` names it so, which makes a
    /// redrive into the work fail instead of running it again without a slot.
    pub child_name: String,
    /// Full: how long to wait before asking again (jittered, growing with how long the
    /// execution has waited); 0 otherwise.
    pub wait_seconds: u64,
    /// The work to run with the slot; `null` without an execution input.
    pub work: Option<WorkAnswer>,
}

/// Seconds to wait before the next poll: uniform in `1..=min(15, 5 + minutes waited)`, so
/// pollers spread out, and a long wait polls less often.
pub fn wait_seconds(waited: Duration) -> u64 {
    let upper = (FIRST_WAIT_SECONDS + waited.as_secs() / 60).min(LONGEST_WAIT_SECONDS);
    fastrand::u64(MIN_WAIT_SECONDS..=upper)
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

/// Validates the payload, then takes a slot. Nothing is sent to the table for bad input.
pub async fn acquire<S: ItemStore>(
    semaphore: &Semaphore<S>,
    config: &Config,
    payload: &Value,
) -> Result<AcquireResponse, HandlerError> {
    // Bad input is logged by the runtime with the error it answers.
    let request = config.resolver.acquire(payload)?;
    let AcquireRequest {
        lock,
        limit,
        identity,
        run,
        requested_at_ms,
        waiting_since_ms,
        ..
    } = &request;
    let answer = semaphore
        .acquire_in_run(lock, identity, *run, *limit, *requested_at_ms)
        .await
        .map_err(HandlerError::from)
        .inspect_err(|e| tracing::error!(lock = %lock, error = %e, "acquire failed"))?;
    let (outcome, token, count) = match answer {
        AcquireOutcome::Acquired { token, count } => {
            (Outcome::Acquired, Some(token.0), Some(count))
        }
        AcquireOutcome::AlreadyHeld { token, count } => {
            (Outcome::AlreadyHeld, Some(token.0), Some(count))
        }
        AcquireOutcome::Full { count, .. } => (Outcome::Full, None, Some(count)),
        AcquireOutcome::Expired => (Outcome::Expired, None, None),
        AcquireOutcome::Fenced(reason) => {
            let message = format!(
                "acquisition {} of {} on lock \"{lock}\" is fenced: {}; it can never hold a slot, \
                 a new acquire needs a new acquisition id",
                identity.acquisition,
                identity.holder,
                reason.describe()
            );
            tracing::warn!(lock = %lock, holder = %identity.holder, acquisition = %identity.acquisition, "{message}");
            return Err(HandlerError::Fenced(message));
        }
    };
    let waiting = outcome == Outcome::Full;
    let waited = waiting_since_ms
        .map(|since| Duration::from_millis(semaphore.now_ms().saturating_sub(since)))
        .unwrap_or_default();
    // Without a known start the wait has no budget (waited is 0 then).
    if waiting && waited > config.max_wait {
        let message = format!(
            "{} has waited {} s for a slot of lock \"{lock}\" (limit {limit}, {} held), longer than the acquire function's MAX_WAIT_SECONDS of \
             {} s; it holds no slot. Start it again later, or raise the limit or the stack's \
             MaxWaitSeconds",
            identity.holder,
            waited.as_secs(),
            count.unwrap_or_default(),
            config.max_wait.as_secs()
        );
        tracing::warn!(lock = %lock, holder = %identity.holder, acquisition = %identity.acquisition, "{message}");
        return Err(HandlerError::WaitTimeout(message));
    }
    let child_name = child_execution_name(identity);
    let response = AcquireResponse {
        acquired: token.is_some(),
        outcome,
        token,
        count,
        limit: limit.get(),
        lock: lock.to_string(),
        holder: identity.holder.to_string(),
        acquisition: identity.acquisition.to_string(),
        wait_seconds: if waiting { wait_seconds(waited) } else { 0 },
        work: request
            .work
            .as_ref()
            .map(|work| work_answer(work, &request, &child_name, token)),
        child_name,
    };
    tracing::info!(
        lock = %lock,
        holder = %identity.holder,
        acquisition = %identity.acquisition,
        outcome = response.outcome.as_str(),
        token = response.token,
        count = response.count,
        limit = response.limit,
        wait_seconds = response.wait_seconds,
        work = response.work.as_ref().map(|w| w.state_machine.as_str()),
        "acquire"
    );
    Ok(response)
}

/// The Lambda handler.
pub async fn handle<S: ItemStore>(
    semaphore: &Semaphore<S>,
    config: &Config,
    event: LambdaEvent<Value>,
) -> Result<AcquireResponse, HandlerError> {
    acquire(semaphore, config, &event.payload).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_are_jittered_and_grow_with_the_wait_up_to_fifteen_seconds() {
        let range = |waited_s: u64| {
            let draws: Vec<u64> = (0..2_000)
                .map(|_| wait_seconds(Duration::from_secs(waited_s)))
                .collect();
            (*draws.iter().min().unwrap(), *draws.iter().max().unwrap())
        };
        assert_eq!(range(0), (1, 5));
        assert_eq!(range(59), (1, 5));
        assert_eq!(range(3 * 60), (1, 8));
        assert_eq!(range(10 * 60), (1, 15));
        assert_eq!(range(10 * 3600), (1, 15));
    }
}
