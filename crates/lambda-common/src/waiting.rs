//! Waking waiters: what every function that frees a slot (release, cleanup, sweeper) and the
//! acquire function's wait mode share to move a lock's line (see `semaphore_core::queue`).
//!
//! A parked execution waits in its acquire task (`.waitForTaskToken`); its waiter record carries
//! its task token and the answer the acquire function would give it with a slot (`context`, the
//! acquire answer with no token yet). Waking it is `SendTaskSuccess` of that answer with the
//! fencing token the grant made, so the machine goes on exactly as after an acquire that found a
//! slot free.

use std::future::Future;

use aws_sdk_sfn::error::DisplayErrorContext;
use semaphore_core::{
    Error as CoreError, ExecutionStatus, FencingToken, HandOff, ItemStore, LockName, PortError,
    Semaphore, SemaphoreItem, TaskToken, Waiter, Waker,
};
use serde_json::{Map, Value};

use crate::error::error_type;
use crate::metrics::Metrics;

/// The answer a granted waiter's task gets: its `context` (the acquire answer it was queued
/// with) with the slot filled in: `acquired`, `outcome` "acquired", `token`, and the work's
/// `semaphore.fencing_token`.
pub fn granted_answer(context: &str, token: FencingToken) -> Result<String, ContextError> {
    let mut fields = context_fields(context)?;
    fields.insert("acquired".to_owned(), Value::Bool(true));
    fields.insert("outcome".to_owned(), Value::from("acquired"));
    fields.insert("token".to_owned(), Value::from(token.0));
    if let Some(Value::Object(semaphore)) = fields
        .get_mut("work")
        .and_then(|work| work.get_mut("context"))
        .and_then(|context| context.get_mut("semaphore"))
    {
        semaphore.insert("fencing_token".to_owned(), Value::from(token.0));
    }
    Ok(Value::Object(fields).to_string())
}

/// The fields of a waiter's `context`, the acquire answer it was queued with.
fn context_fields(context: &str) -> Result<Map<String, Value>, ContextError> {
    match serde_json::from_str(context)? {
        Value::Object(fields) => Ok(fields),
        _ => Err(ContextError::NotAnObject),
    }
}

/// A waiter's `context` that is not the acquire answer it was queued with, so no answer can be
/// made of it.
#[derive(Debug, thiserror::Error)]
pub enum ContextError {
    #[error("the waiter's context is not JSON ({0})")]
    NotJson(#[from] serde_json::Error),
    #[error("the waiter's context is not a JSON object")]
    NotAnObject,
}

/// Sends task outcomes to Step Functions.
pub trait TaskCallbacks: Send + Sync {
    fn succeed(
        &self,
        token: &TaskToken,
        output: &str,
    ) -> impl Future<Output = Result<(), CallbackError>> + Send;

    fn fail(
        &self,
        token: &TaskToken,
        error: &str,
        cause: &str,
    ) -> impl Future<Output = Result<(), CallbackError>> + Send;
}

/// A task callback Step Functions did not take: the task no longer waits (it timed out, its
/// execution ended), or the call failed (throttled, denied, unreachable).
/// The SDK's error is in the message, whole, and not also a `source()`: a chain printed whole
/// would name it twice.
#[derive(Debug, thiserror::Error)]
#[error("Step Functions {operation} failed: {}", DisplayErrorContext(cause.as_ref()))]
pub struct CallbackError {
    pub operation: &'static str,
    pub cause: Box<dyn std::error::Error + Send + Sync>,
}

impl TaskCallbacks for aws_sdk_sfn::Client {
    async fn succeed(&self, token: &TaskToken, output: &str) -> Result<(), CallbackError> {
        self.send_task_success()
            .task_token(token.as_str())
            .output(output)
            .send()
            .await
            .map(|_| ())
            .map_err(|e| CallbackError {
                operation: "SendTaskSuccess",
                cause: e.into(),
            })
    }

    async fn fail(&self, token: &TaskToken, error: &str, cause: &str) -> Result<(), CallbackError> {
        self.send_task_failure()
            .task_token(token.as_str())
            .error(error)
            .cause(cut(cause, 32_768))
            .send()
            .await
            .map(|_| ())
            .map_err(|e| CallbackError {
                operation: "SendTaskFailure",
                cause: e.into(),
            })
    }
}

fn cut(text: &str, max: usize) -> &str {
    let mut end = text.len().min(max);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// The core's [`Waker`] through task callbacks: `SendTaskSuccess` of the granted answer.
#[derive(Debug, Clone)]
pub struct TaskWaker<C> {
    pub callbacks: C,
}

impl<C: TaskCallbacks> Waker for TaskWaker<C> {
    /// A poller has nothing to wake: it finds its slot at its next poll.
    async fn wake(&self, waiter: &Waiter, token: FencingToken) -> Result<(), PortError> {
        let Some(task_token) = waiter.task_token() else {
            return Ok(());
        };
        let answer = granted_answer(&waiter.context, token).map_err(PortError::new)?;
        let sent = self.callbacks.succeed(task_token, &answer).await;
        sent.map_err(PortError::new)
    }

    /// Fails the head's task with `SemaphoreRateLimited`, which its acquire state retries: the
    /// retry checks again, keeping the head's place, and starts it once the rate allows. A
    /// poller finds out at its next poll.
    async fn defer(&self, waiter: &Waiter, next_start_ms: u64) -> Result<(), PortError> {
        let Some(task_token) = waiter.task_token() else {
            return Ok(());
        };
        let cause = format!(
            "the start rate of lock \"{}\" holds this execution, at the head of its line, back \
             until {}: it keeps its place and holds no slot meanwhile",
            waiter.lock,
            semaphore_core::rfc3339_millis(next_start_ms)
        );
        let sent = self
            .callbacks
            .fail(task_token, error_type::RATE_LIMITED, &cause)
            .await;
        sent.map_err(PortError::new)
    }
}

/// The hand-offs of a function on AWS: task callbacks and `DescribeExecution` through the SDK.
pub type SfnHandOffs = HandOffs<aws_sdk_sfn::Client, crate::SfnExecutions>;

/// What a function needs to move a line: a waker and a judge of executions, and where the
/// function writes its metrics (the hand-offs' and its own).
#[derive(Debug, Clone)]
pub struct HandOffs<C, X> {
    pub waker: TaskWaker<C>,
    pub executions: X,
    pub metrics: Metrics,
}

impl<C: TaskCallbacks, X: ExecutionStatus> HandOffs<C, X> {
    /// Without metrics (the functions set theirs: `Settings::hand_offs`).
    pub fn new(callbacks: C, executions: X) -> Self {
        Self {
            waker: TaskWaker { callbacks },
            executions,
            metrics: Metrics::default(),
        }
    }

    /// Hands the lock's free slots to the head of its line, if anyone waits (`known`: the item
    /// as the caller's own write left it, so a lock nobody waits on costs no request). A failure
    /// is logged, never raised: the caller's own write stands, and the waiters' fallback checks
    /// (or the sweeper) move the line.
    pub async fn run<S: ItemStore>(
        &self,
        semaphore: &Semaphore<S>,
        lock: &LockName,
        known: Option<SemaphoreItem>,
    ) -> HandOff {
        if known.as_ref().is_some_and(|item| item.waiting == 0) {
            return HandOff::default();
        }
        // Boxed: the hand-off's future nests deep (grant, wake, describe, cleanup), and inlined
        // into each function's own it outgrows the compiler's layout depth.
        let result: Result<HandOff, CoreError> =
            Box::pin(semaphore.hand_off(lock, known, &self.waker, &self.executions)).await;
        if let Ok(report) = &result {
            self.metrics.hand_off(lock, report, semaphore.now_ms());
        }
        // F13: a head that did not fit may have had expired leases taken back for it.
        self.metrics
            .taken_back(&semaphore.drain_taken_back(), semaphore.now_ms());
        match &result {
            Ok(report) if !report.is_empty() => tracing::info!(
                lock = %lock,
                woken = report.woken.len(),
                parked = report.parked.len(),
                freed = report.freed.len(),
                skipped = report.skipped.len(),
                deferred_until_ms = report.deferred.as_ref().map(|(_, at)| *at),
                "hand-off"
            ),
            Ok(_) => {}
            Err(e) => tracing::warn!(
                lock = %lock,
                error = %e,
                "hand-off failed; the waiters' fallback checks and the sweeper move the line"
            ),
        }
        result.unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_granted_answer_fills_in_the_slot_everywhere_the_machine_reads_it() {
        let context = json!({
            "acquired": false, "outcome": "full", "token": null,
            "lock": "l", "work": {"state_machine": "arn:sm", "name": "n",
                "context": {"semaphore": {"lock": "l", "fencing_token": null}}}
        });
        let answer: Value =
            serde_json::from_str(&granted_answer(&context.to_string(), FencingToken(42)).unwrap())
                .unwrap();
        assert_eq!(answer["acquired"], true);
        assert_eq!(answer["outcome"], "acquired");
        assert_eq!(answer["token"], 42);
        assert_eq!(answer["work"]["context"]["semaphore"]["fencing_token"], 42);
        assert_eq!(answer["lock"], "l");
        assert!(granted_answer("[1]", FencingToken(1)).is_err());
        assert!(granted_answer("not json", FencingToken(1)).is_err());
    }
}
