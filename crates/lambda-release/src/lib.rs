//! The release function: frees the slot of one acquisition and fences it, so that a late retry
//! of the same acquire can never take a slot again. Idempotent: one write, no read, and a retry
//! frees nothing more. A slot freed while others wait is handed to the head of the line
//! (`lambda_common::HandOffs`); a hand-off that fails is logged, not the release's failure.
//!
//! It is a thin adapter: it reads the payload (`lambda_common::Resolver`), runs the core's
//! release flow ([`semaphore_core::flow::release`]: the token check, and a redriven run's
//! earlier runs, `r<n>` with n > 0) against the table and Step Functions, and answers (the
//! core's [`ReleaseAnswer`]). Its payload is the acquire answer (`{"semaphore": $.semaphore,
//! "error": $.error}`), never the execution input: with a failed child's cause both could pass
//! Step Functions' 256 KiB. After a failure it also names what the execution fails with: the
//! child's own error, or `SemaphoreRedriveRefused` when a redrive met a child that already ran.

use lambda_common::{
    error_type, metrics, ConfigError, HandOffs, HandlerError, Payload, Resolver, Settings,
    TaskCallbacks, RELEASE_PAYLOAD,
};
use lambda_runtime::LambdaEvent;
use semaphore_core::flow::release::{EarlierRuns, Refusal, ReleaseAnswer, Reply, Request};
use semaphore_core::{CleanupOutcome, ExecutionStatus, Holding, ItemStore, LockName, Semaphore};
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
    pub target: Request,
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
pub fn fail_with(failure: &Failure, target: &Request) -> (String, String) {
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

/// Validates the payload, then releases and hands the slot on (the core's
/// [`semaphore_core::flow::release`]). Nothing is sent to the table for bad input.
pub async fn release<S: ItemStore, C: TaskCallbacks, X: ExecutionStatus>(
    semaphore: &Semaphore<S>,
    resolver: &Resolver,
    hand_offs: &HandOffs<C, X>,
    payload: &Value,
) -> Result<ReleaseAnswer, HandlerError> {
    // Bad input is logged by the runtime with the error it answers.
    let ReleaseRequest { target, failure } = ReleaseRequest::parse(resolver, payload)?;
    let (lock, identity) = (&target.lock, &target.identity);
    let hand_off =
        |lock: LockName, known| async move { hand_offs.run(semaphore, &lock, known).await };
    let replied = |reply: &Reply, now_ms| emit_freed(hand_offs, &target, reply, now_ms);
    let flow =
        semaphore.release_and_hand_off(target.clone(), &hand_offs.executions, hand_off, replied);
    // Boxed: a deep future (the hand-off nests), kept off the caller's.
    let done = match Box::pin(flow).await {
        Ok(Ok(done)) => done,
        Ok(Err(refusal)) => return Err(refused(&target, &refusal)),
        Err(e) => {
            let e = HandlerError::from(e);
            tracing::error!(lock = %lock, error = %e, "release failed");
            return Err(e);
        }
    };
    if let EarlierRuns::NotInRun { run, current } = done.earlier {
        tracing::warn!(lock = %lock, holder = %identity.holder, run, current = ?current.map(|r| r.0), "the release names a run the execution is not in: its earlier runs are left alone");
    }
    let failed = failure.as_ref().map(|f| fail_with(f, &target));
    let answer = target.answer(&done, failed);
    tracing::info!(
        lock = %lock,
        holder = %identity.holder,
        acquisition = %identity.acquisition,
        outcome = answer.outcome.as_str(),
        count = answer.count,
        waiting = done.waiting,
        handed_off = answer.handed_off,
        caught = failure.as_ref().map(|f| f.error.as_str()),
        error = answer.error.as_deref(),
        "release"
    );
    Ok(answer)
}

/// The named error of a refusal, logged.
fn refused(target: &Request, refusal: &Refusal) -> HandlerError {
    let (lock, identity) = (&target.lock, &target.identity);
    let message = refusal.message(target);
    match refusal {
        Refusal::WrongToken { held } => {
            tracing::error!(lock = %lock, holder = %identity.holder, acquisition = %identity.acquisition, held = held.0, shown = target.token.0, "release refused: wrong token");
            HandlerError::WrongToken(message)
        }
        Refusal::RunUnknown { .. } | Refusal::OutOfStep => {
            let e = HandlerError::Store(message);
            tracing::error!(lock = %lock, error = %e, "release failed");
            e
        }
    }
}

/// The metrics of what a write freed, at the time its answer came: the release's own slot (how
/// long it was held, and the lock after it), then a redriven run's earlier runs' slots.
fn emit_freed<C, X>(hand_offs: &HandOffs<C, X>, target: &Request, reply: &Reply, now_ms: u64) {
    let (lock, holder) = (&target.lock, &target.identity.holder);
    let held_for = |h: &Holding| now_ms.saturating_sub(h.acquired_at_ms) as f64;
    match reply {
        Reply::Released { after, held, .. } => {
            let line = metrics::Line::of(lock)
                .values(metrics::TIME_HELD, held.as_ref().map(held_for))
                .value(metrics::WEIGHT_USED, after.used as f64)
                .values(metrics::LIMIT, after.limit.map(|l| f64::from(l.get())))
                .value(metrics::WAITING, after.waiting as f64);
            hand_offs.metrics.emit(now_ms, &line);
        }
        Reply::Freed(CleanupOutcome { freed, .. }) => {
            let times = freed.iter().map(|(_, h)| held_for(h));
            let line = metrics::Line::of(lock).values(metrics::TIME_HELD, times);
            hand_offs.metrics.emit(now_ms, &line);
            if !freed.is_empty() {
                let runs: Vec<String> = freed
                    .iter()
                    .map(|(slot, _)| slot.acquisition.to_string())
                    .collect();
                tracing::info!(lock = %lock, holder = %holder, run = target.run, freed = ?runs, "redriven run: freed the slots of its earlier runs");
            }
        }
        _ => {}
    }
}

/// The Lambda handler. An answer that is a failure, not a caller's mistake (a bad payload,
/// another slot's token), is counted (`Failures`, which the stack's alarm watches).
pub async fn handle<S: ItemStore, C: TaskCallbacks, X: ExecutionStatus>(
    semaphore: &Semaphore<S>,
    resolver: &Resolver,
    hand_offs: &HandOffs<C, X>,
    event: LambdaEvent<Value>,
) -> Result<ReleaseAnswer, HandlerError> {
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

    fn target() -> Request {
        Request {
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
