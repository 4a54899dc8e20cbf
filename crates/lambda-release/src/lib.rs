//! The release function: frees the slot of one acquisition and fences it, so that a late retry
//! of the same acquire can never take a slot again. Idempotent: one write, no read, and a retry
//! frees nothing more. A slot freed while others wait is handed to the head of the line
//! (`lambda_common::HandOffs`); a hand-off that fails is logged, not the release's failure.
//!
//! Its payload is the acquire answer (`{"semaphore": $.semaphore, "error": $.error}`), never the
//! execution input: with a failed child's cause both could pass Step Functions' 256 KiB. After a
//! failure it also names what the execution fails with: the child's own error, or
//! `SemaphoreRedriveRefused` when a redrive met a child that already ran. The release of a
//! redriven run (`r<n>`, n > 0) also cleans up the earlier runs, whose child it may have worked
//! under.

use lambda_common::{
    error_type, metrics, ConfigError, HandOffs, HandlerError, Payload, Resolver, Settings, Target,
    TaskCallbacks, RELEASE_PAYLOAD,
};
use lambda_runtime::LambdaEvent;
use semaphore_core::{Claim, ExecutionStatus, ItemStore, ReleaseOutcome, Run, Semaphore};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The error Step Functions raises when `startExecution` names an execution that exists.
pub const EXECUTION_ALREADY_EXISTS: &str = "StepFunctions.ExecutionAlreadyExistsException";

/// The resolver the release needs: the defaults only (it starts no work). Read once per cold
/// start.
pub fn resolver<F: Fn(&str) -> Option<String>>(
    settings: &Settings<F>,
) -> Result<Resolver, ConfigError> {
    Ok(Resolver {
        defaults: settings.defaults()?,
        ..Resolver::default()
    })
}

/// What a `Catch` caught: `{"Error", "Cause"}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    pub error: String,
    pub cause: Option<String>,
}

impl Failure {
    /// The payload's `error`, if any.
    pub fn parse(payload: &Value) -> Result<Option<Self>, HandlerError> {
        const CAUGHT: &str =
            "what the Catch caught, \"error.$\": \"$.error\" with \"ResultPath\": \"$.error\"";
        let p = Payload::new(payload, RELEASE_PAYLOAD)?;
        let Some(caught) = p.object("error", "error.", CAUGHT)? else {
            return Ok(None);
        };
        Ok(Some(Self {
            error: caught
                .string(
                    "Error",
                    "pass what the Catch caught, {\"Error\", \"Cause\"}",
                )?
                .to_owned(),
            cause: caught.optional_string("Cause")?.map(str::to_owned),
        }))
    }
}

/// A validated release request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReleaseRequest {
    pub target: Target,
    pub failure: Option<Failure>,
}

impl ReleaseRequest {
    pub fn parse(resolver: &Resolver, payload: &Value) -> Result<Self, HandlerError> {
        Ok(Self {
            target: resolver.target(payload)?,
            failure: Failure::parse(payload)?,
        })
    }
}

/// The field of a JSON object whose name is `name` in any case (Step Functions' own cause
/// writes `Error`, the `DescribeExecution` API and moto `error`).
fn field<'a>(fields: &'a serde_json::Map<String, Value>, name: &str) -> Option<&'a str> {
    fields
        .iter()
        .find(|(key, _)| key.eq_ignore_ascii_case(name))
        .and_then(|(_, value)| value.as_str())
}

/// The child's own error and cause, if `cause` is a failed child execution's description.
fn child_failure(cause: &str) -> Option<(String, String)> {
    let Ok(Value::Object(child)) = serde_json::from_str::<Value>(cause) else {
        return None;
    };
    let error = field(&child, "error")?;
    let cause = match field(&child, "cause") {
        Some(cause) => cause.to_owned(),
        None => format!(
            "the work execution {} ended {} with the error {error} and no cause",
            field(&child, "executionArn").unwrap_or("(no ARN given)"),
            field(&child, "status").unwrap_or("FAILED"),
        ),
    };
    Some((error.to_owned(), cause))
}

/// The execution ARN quoted in Step Functions' "Execution Already Exists: 'arn:...'" cause.
fn quoted_execution_arn(cause: &str) -> Option<&str> {
    let start = cause.find("'arn:")? + 1;
    let len = cause[start..].find('\'')?;
    Some(&cause[start..start + len])
}

/// The error and cause to fail the execution with after `failure`.
pub fn fail_with(failure: &Failure, target: &Target) -> (String, String) {
    let caught_cause = failure.cause.as_deref().unwrap_or_default();
    if failure.error == EXECUTION_ALREADY_EXISTS {
        let child = match quoted_execution_arn(caught_cause) {
            Some(arn) => format!("the work's child execution {arn}"),
            None => {
                "the work's child execution (named after an earlier run's acquisition)".to_owned()
            }
        };
        return (
            error_type::REDRIVE_REFUSED.to_owned(),
            format!(
                "{} was redriven into its protected work, but {child} already ran: its slot was \
                 freed when the execution ended, so the work is not run again without one. Start \
                 a new execution to run the work again",
                target.identity.holder
            ),
        );
    }
    if let Some(child) = child_failure(caught_cause) {
        return child;
    }
    (failure.error.clone(), caught_cause.to_owned())
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
    pub lock: String,
    pub acquisition: String,
    /// Waiters this release woke with a slot (0 or 1, more if slots were free).
    pub handed_off: usize,
    /// The error to fail the execution with; `null` without `"error"` in the payload.
    pub error: Option<String>,
    /// Its cause; `null` without `"error"` in the payload.
    pub cause: Option<String>,
}

/// Validates the payload, then releases and hands the slot on. Nothing is sent to the table for
/// bad input.
pub async fn release<S: ItemStore, C: TaskCallbacks, X: ExecutionStatus>(
    semaphore: &Semaphore<S>,
    resolver: &Resolver,
    hand_offs: &HandOffs<C, X>,
    payload: &Value,
) -> Result<ReleaseResponse, HandlerError> {
    // Bad input is logged by the runtime with the error it answers.
    let ReleaseRequest { target, failure } = ReleaseRequest::parse(resolver, payload)?;
    let Target {
        lock,
        identity,
        token,
        weight,
        ..
    } = &target;
    let failed = |e: semaphore_core::Error| {
        let e = HandlerError::from(e);
        tracing::error!(lock = %lock, error = %e, "release failed");
        e
    };
    // F15: only the slot taken under the token the answer shows; a slot of this acquisition
    // held under another token is not this caller's, and nothing is written.
    let claim = Claim::Slot {
        token: *token,
        weight: *weight,
    };
    let (outcome, after, held) = semaphore
        .release_freeing(lock, identity, claim)
        .await
        .map_err(failed)?;
    let now_ms = semaphore.now_ms();
    hand_offs.metrics.emit(
        now_ms,
        &metrics::Line::of(lock)
            .values(
                metrics::TIME_HELD,
                held.map(|h| now_ms.saturating_sub(h.acquired_at_ms) as f64),
            )
            .value(metrics::WEIGHT_USED, after.used as f64)
            .values(metrics::LIMIT, after.limit.map(|l| f64::from(l.get())))
            .value(metrics::WAITING, after.waiting as f64),
    );
    let (mut released, mut count, mut waiting) = match outcome {
        ReleaseOutcome::Released { count, waiting, .. } => (true, count, waiting),
        ReleaseOutcome::NotHeld { count, waiting } => (false, count, waiting),
        ReleaseOutcome::WrongToken { held, .. } => {
            let e = HandlerError::WrongToken(format!(
                "acquisition {} of {} on lock \"{lock}\" holds its slot under fencing token {}, \
                 and this release shows token {}: it is not this slot's acquire answer (a \
                 $.semaphore from another branch, iteration or execution?). Nothing was freed or \
                 written; pass the release the answer of the acquire whose slot it frees",
                identity.acquisition, identity.holder, held.0, token.0
            ));
            tracing::error!(lock = %lock, holder = %identity.holder, acquisition = %identity.acquisition, held = held.0, shown = token.0, "release refused: wrong token");
            return Err(e);
        }
    };
    // Starts from the item the release left: nobody waiting costs no request.
    let mut handed_off = hand_offs
        .run(semaphore, lock, Some(after))
        .await
        .woken
        .len();
    // A redriven run n also frees what the earlier runs of its execution hold, as a cleanup of
    // runs 0..n-1 would (their fence, then the free of what it saw): a zombie acquire of an
    // earlier run may have landed, or an earlier run's slot been left to it by that run's
    // cleanup, which found the execution running again (F11); its own acquisition holds none
    // of that, so releasing only it left those slots to the sweeper, a false leak notice.
    // Safe: those runs have ended, and so has every child of theirs once a later run reaches a
    // release state (a redrive resumes where the run stopped; no state after the work leads
    // back to it), and no acquire of theirs lands after their fence. Only Step Functions may
    // say so (F15): the run a payload names is not believed, so a made-up `r<n>`, or a real
    // execution named in a run it is not in, neither frees its earlier runs' slots nor makes a
    // fence of n runs (a 12,500-run fence is 100 KB of the lock's item). One DescribeExecution,
    // for a redriven run's release only.
    let redriven = match target.run.filter(|&n| n > 0) {
        Some(n) => {
            let run = hand_offs
                .executions
                .current_run(&identity.holder)
                .await
                .map_err(|e| {
                    let e = HandlerError::Store(format!(
                        "Step Functions could not say which run {} is in, so its earlier runs \
                         were not freed: {e}",
                        identity.holder
                    ));
                    tracing::error!(lock = %lock, error = %e, "release failed");
                    e
                })?;
            let in_run = run.is_some_and(|run| run.0 >= n);
            if !in_run {
                tracing::warn!(lock = %lock, holder = %identity.holder, run = n, current = ?run.map(|r| r.0), "the release names a run the execution is not in: its earlier runs are left alone");
            }
            in_run.then_some(n)
        }
        None => None,
    };
    if let Some(n) = redriven {
        let fenced = semaphore
            .fence(lock, &identity.holder, Run(n - 1))
            .await
            .map_err(failed)?;
        let freed = semaphore.free(&fenced).await.map_err(failed)?;
        let now_ms = semaphore.now_ms();
        hand_offs.metrics.emit(
            now_ms,
            &metrics::Line::of(lock).values(
                metrics::TIME_HELD,
                freed
                    .freed
                    .iter()
                    .map(|(_, h)| now_ms.saturating_sub(h.acquired_at_ms) as f64),
            ),
        );
        if !freed.freed.is_empty() {
            let runs: Vec<String> = freed
                .freed
                .iter()
                .map(|(slot, _)| slot.acquisition.to_string())
                .collect();
            tracing::info!(lock = %lock, holder = %identity.holder, run = n, freed = ?runs, "redriven run: freed the slots of its earlier runs");
            released = true;
            if freed.waiting > 0 {
                handed_off += hand_offs.run(semaphore, lock, None).await.woken.len();
            }
        }
        (count, waiting) = (freed.count, freed.waiting);
    }
    let outcome = if released {
        Outcome::Released
    } else {
        Outcome::NotHeld
    };
    let (error, cause) = failure.as_ref().map(|f| fail_with(f, &target)).unzip();
    tracing::info!(
        lock = %lock,
        holder = %identity.holder,
        acquisition = %identity.acquisition,
        outcome = outcome.as_str(),
        count,
        waiting,
        handed_off,
        caught = failure.as_ref().map(|f| f.error.as_str()),
        error = error.as_deref(),
        "release"
    );
    Ok(ReleaseResponse {
        released,
        outcome,
        count,
        lock: lock.to_string(),
        acquisition: identity.acquisition.to_string(),
        handed_off,
        error,
        cause,
    })
}

/// The Lambda handler. An answer that is a failure, not a caller's mistake (a bad payload,
/// another slot's token), is counted (`Failures`, which the stack's alarm watches).
pub async fn handle<S: ItemStore, C: TaskCallbacks, X: ExecutionStatus>(
    semaphore: &Semaphore<S>,
    resolver: &Resolver,
    hand_offs: &HandOffs<C, X>,
    event: LambdaEvent<Value>,
) -> Result<ReleaseResponse, HandlerError> {
    let answer = release(semaphore, resolver, hand_offs, &event.payload).await;
    hand_offs
        .metrics
        .answered(metrics::RELEASE_FUNCTION, &answer, semaphore.now_ms());
    answer
}

#[cfg(test)]
mod tests {
    use super::*;
    use semaphore_core::{AcquisitionId, HolderId, Identity, LockName};
    use serde_json::json;

    const HOLDER: &str = "arn:aws:states:us-east-1:123456789012:execution:LockProtected:run-1";

    fn target() -> Target {
        Target {
            lock: LockName::new("demo-lock").unwrap(),
            identity: Identity::new(
                HolderId::new(HOLDER).unwrap(),
                AcquisitionId::new("r1").unwrap(),
            ),
            token: semaphore_core::FencingToken(7),
            run: Some(1),
            weight: semaphore_core::Weight::ONE,
        }
    }

    fn caught(error: &str, cause: &str) -> Failure {
        Failure {
            error: error.to_owned(),
            cause: Some(cause.to_owned()),
        }
    }

    #[test]
    fn a_child_description_without_a_cause_is_described() {
        let description = json!({"executionArn": "arn:x", "status": "FAILED", "error": "Boom"});
        assert_eq!(
            fail_with(
                &caught("States.TaskFailed", &description.to_string()),
                &target()
            ),
            (
                "Boom".to_owned(),
                "the work execution arn:x ended FAILED with the error Boom and no cause".to_owned()
            )
        );
        // Not a description: passed on as caught.
        for cause in [
            "not json",
            "[1]",
            "{\"errorType\": \"X\", \"errorMessage\": \"m\"}",
        ] {
            assert_eq!(
                fail_with(&caught("Some.Error", cause), &target()),
                ("Some.Error".to_owned(), cause.to_owned()),
                "{cause}"
            );
        }
        assert_eq!(
            fail_with(
                &Failure {
                    error: "E".to_owned(),
                    cause: None
                },
                &target()
            ),
            ("E".to_owned(), String::new())
        );
    }

    #[test]
    fn an_existing_child_without_its_arn_in_the_cause_is_still_refused_by_name() {
        let (error, cause) = fail_with(&caught(EXECUTION_ALREADY_EXISTS, "exists"), &target());
        assert_eq!(error, "SemaphoreRedriveRefused");
        assert!(
            cause.contains("named after an earlier run's acquisition"),
            "{cause}"
        );
        assert!(cause.ends_with("Start a new execution to run the work again"));
    }
}
