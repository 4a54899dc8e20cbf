//! The acquire function: one attempt to take a slot of a semaphore for a Step Functions
//! execution.
//!
//! Payload (what the lock-protected state machine sends):
//! `{"lock": "demo-lock", "limit": 5, "holder": "<$$.Execution.Id>", "acquisition":
//! "<States.UUID()>", "requested_at": "<$$.State.EnteredTime>"}`
//!
//! One conditional write, no read. `requested_at` is when the acquire was asked for: the state's
//! entry time comes before any release or cleanup this acquire must not outlive, however long
//! Lambda takes to start it (see `semaphore_core::Timing`).
//!
//! Answer: `{"acquired": bool, "outcome": "acquired"|"already_held"|"full"|"expired", "token":
//! n|null, "count": n|null, "limit": n}`. "Full" is an answer (the machine waits and tries again with
//! the same acquisition), not an error; so is "expired" (the request is older than the horizon:
//! the machine enters its acquire state again, which makes a new request time). Errors:
//! `SemaphoreFenced` (this acquisition was released or its execution cleaned up: it will never
//! get a slot), `SemaphoreInvalidInput` (nothing written), `SemaphoreOldFormat` (the lock's item
//! is of version 1), `SemaphoreStoreError` (retry).

use lambda_common::{HandlerError, Payload};
use lambda_runtime::LambdaEvent;
use semaphore_core::{AcquireOutcome, Identity, ItemStore, Limit, LockName, Semaphore};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The payload's fields, as named in errors.
pub const EXPECTED: &str = r#"{"lock": string, "limit": integer, "holder": string, "acquisition": string, "requested_at": RFC 3339 string}"#;

/// A validated acquire request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AcquireRequest {
    pub lock: LockName,
    pub limit: Limit,
    pub identity: Identity,
    pub requested_at_ms: u64,
}

impl AcquireRequest {
    pub fn parse(payload: &Value) -> Result<Self, HandlerError> {
        let p = Payload::new(payload, EXPECTED)?;
        Ok(Self {
            lock: p.lock()?,
            limit: p.limit()?,
            identity: p.identity()?,
            requested_at_ms: p.requested_at_ms()?,
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

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AcquireResponse {
    /// True when this identity holds a slot now (newly taken or already held).
    pub acquired: bool,
    pub outcome: Outcome,
    /// The fencing token of the held slot; `null` when full or expired.
    pub token: Option<u64>,
    /// Slots held now; `null` when expired (the request was too old to be sent, so nothing was
    /// read).
    pub count: Option<usize>,
    /// The limit the request asked for.
    pub limit: u32,
}

/// Validates the payload, then takes a slot. Nothing is sent to the table for bad input.
pub async fn acquire<S: ItemStore>(
    semaphore: &Semaphore<S>,
    payload: &Value,
) -> Result<AcquireResponse, HandlerError> {
    // Bad input is logged by the runtime with the error it answers.
    let request = AcquireRequest::parse(payload)?;
    let AcquireRequest {
        lock,
        limit,
        identity,
        requested_at_ms,
    } = &request;
    let outcome = semaphore
        .acquire_requested_at(lock, identity, *limit, *requested_at_ms)
        .await
        .map_err(HandlerError::from)
        .inspect_err(|e| tracing::error!(lock = %lock, error = %e, "acquire failed"))?;
    let response = match outcome {
        AcquireOutcome::Acquired { token, count } => AcquireResponse {
            acquired: true,
            outcome: Outcome::Acquired,
            token: Some(token.0),
            count: Some(count),
            limit: limit.get(),
        },
        AcquireOutcome::AlreadyHeld { token, count } => AcquireResponse {
            acquired: true,
            outcome: Outcome::AlreadyHeld,
            token: Some(token.0),
            count: Some(count),
            limit: limit.get(),
        },
        AcquireOutcome::Full { count, limit } => AcquireResponse {
            acquired: false,
            outcome: Outcome::Full,
            token: None,
            count: Some(count),
            limit: limit.get(),
        },
        AcquireOutcome::Expired => AcquireResponse {
            acquired: false,
            outcome: Outcome::Expired,
            token: None,
            count: None,
            limit: limit.get(),
        },
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
    tracing::info!(
        lock = %lock,
        holder = %identity.holder,
        acquisition = %identity.acquisition,
        outcome = response.outcome.as_str(),
        token = response.token,
        count = response.count,
        limit = response.limit,
        "acquire"
    );
    Ok(response)
}

/// The Lambda handler.
pub async fn handle<S: ItemStore>(
    semaphore: &Semaphore<S>,
    event: LambdaEvent<Value>,
) -> Result<AcquireResponse, HandlerError> {
    acquire(semaphore, &event.payload).await
}
