//! The release function: frees the slot of one acquisition and fences it, so that a late retry
//! of the same acquire can never take a slot again. Idempotent.
//!
//! Payload: `{"lock": "demo-lock", "holder": "<$$.Execution.Id>", "acquisition": "<id>"}`.
//! Answer: `{"released": bool, "outcome": "released"|"not_held", "count": n}`.
//! One write, no read, no condition: a retried or duplicated release frees nothing more and only
//! moves the version. Errors: `SemaphoreInvalidInput` (nothing written), `SemaphoreOldFormat`
//! (the lock's item is of version 1; nothing written), `SemaphoreStoreError` (retry).

use lambda_common::{HandlerError, Payload};
use lambda_runtime::LambdaEvent;
use semaphore_core::{Identity, ItemStore, LockName, ReleaseOutcome, Semaphore};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The payload's fields, as named in errors.
pub const EXPECTED: &str = r#"{"lock": string, "holder": string, "acquisition": string}"#;

/// A validated release request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReleaseRequest {
    pub lock: LockName,
    pub identity: Identity,
}

impl ReleaseRequest {
    pub fn parse(payload: &Value) -> Result<Self, HandlerError> {
        let p = Payload::new(payload, EXPECTED)?;
        Ok(Self {
            lock: p.lock()?,
            identity: p.identity()?,
        })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    Released,
    NotHeld,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Released => "released",
            Self::NotHeld => "not_held",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReleaseResponse {
    /// True when this call freed a slot; false when none was held (already released, cleaned
    /// up, or never acquired): the acquisition is fenced either way.
    pub released: bool,
    pub outcome: Outcome,
    /// Slots held now.
    pub count: usize,
}

/// Validates the payload, then releases. Nothing is sent to the table for bad input.
pub async fn release<S: ItemStore>(
    semaphore: &Semaphore<S>,
    payload: &Value,
) -> Result<ReleaseResponse, HandlerError> {
    // Bad input is logged by the runtime with the error it answers.
    let ReleaseRequest { lock, identity } = ReleaseRequest::parse(payload)?;
    let outcome = semaphore
        .release(&lock, &identity)
        .await
        .map_err(HandlerError::from)
        .inspect_err(|e| tracing::error!(lock = %lock, error = %e, "release failed"))?;
    let response = match outcome {
        ReleaseOutcome::Released { count, .. } => ReleaseResponse {
            released: true,
            outcome: Outcome::Released,
            count,
        },
        ReleaseOutcome::NotHeld { count } => ReleaseResponse {
            released: false,
            outcome: Outcome::NotHeld,
            count,
        },
    };
    tracing::info!(
        lock = %lock,
        holder = %identity.holder,
        acquisition = %identity.acquisition,
        outcome = response.outcome.as_str(),
        count = response.count,
        "release"
    );
    Ok(response)
}

/// The Lambda handler.
pub async fn handle<S: ItemStore>(
    semaphore: &Semaphore<S>,
    event: LambdaEvent<Value>,
) -> Result<ReleaseResponse, HandlerError> {
    release(semaphore, &event.payload).await
}
