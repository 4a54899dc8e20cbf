//! The errors a handler answers with. Each has a fixed Lambda error type, which is the name a
//! state machine matches in `Retry` / `Catch` (`ErrorEquals`).

use lambda_runtime::Diagnostic;
use semaphore_core::{Error, InputError, StoreError};

/// The Lambda error types, as a state machine sees them.
pub mod error_type {
    /// Bad input: nothing was written. Do not retry; fix the payload.
    pub const INVALID_INPUT: &str = "SemaphoreInvalidInput";
    /// This acquisition was released, or its execution cleaned up: it can never hold a slot
    /// again. Do not retry with the same acquisition id.
    pub const FENCED: &str = "SemaphoreFenced";
    /// The lock's item is in a format this version does not read (another version wrote it):
    /// nothing was written to it. Retrying does not help; the message says what to do.
    pub const UNKNOWN_FORMAT: &str = "SemaphoreUnknownFormat";
    /// The table could not be read or written (missing table, throttling, permissions...).
    pub const STORE: &str = "SemaphoreStoreError";
    /// The execution waited longer than the acquire function's `MAX_WAIT_SECONDS` for a slot and
    /// holds none. Start it again later, or raise the limit or the wait budget.
    pub const WAIT_TIMEOUT: &str = "SemaphoreWaitTimeout";
    /// The stack is deployed in a way that would make this request hang or leak (a caller that
    /// is not a protected machine, an Express execution, Express work): nothing was written.
    /// Retrying does not help; fix the deployment (the message names the parameter).
    pub const MISCONFIGURED: &str = "SemaphoreMisconfigured";
    /// The check was asked too long ago (its request time, the acquire state's entry time, is
    /// past the horizon and the fences rotated since): nothing was taken or queued. The acquire
    /// state catches it and enters itself again, which makes a new request time.
    pub const EXPIRED: &str = "SemaphoreExpired";
    /// This execution is at the head of the lock's line and the lock's start rate holds its
    /// start back: nothing is held, its place is kept. The acquire state retries it (a retry's
    /// check finds its place and starts it once the rate allows).
    pub const RATE_LIMITED: &str = "SemaphoreRateLimited";
    /// A caller that polls (no task token: an Express workflow, any other client) is in the
    /// lock's line and holds no slot yet: ask again (the Express fragment's `Retry` does)
    /// within its `poll_seconds`, with the same `execution` and `state.EnteredTime` and a larger
    /// `state.RetryCount`, to keep its place.
    pub const BUSY: &str = "SemaphoreBusy";
    /// Not raised by a function: the error the release function names, for the execution to fail
    /// with, when a redrive met the work's child execution that already ran (its slot was freed
    /// when the execution ended, so the work is not run again). Start a new execution.
    pub const REDRIVE_REFUSED: &str = "SemaphoreRedriveRefused";
    /// A release (or heartbeat) showed a fencing token that is not the one of the slot it names:
    /// the acquisition holds its slot under another token, so this caller passed another slot's
    /// acquire answer (a `$.semaphore` from the wrong branch or execution). Nothing was written;
    /// the slot stays with its holder. Retrying does not help; pass this slot's own answer.
    pub const WRONG_TOKEN: &str = "SemaphoreWrongToken";
    /// The stack takes only locks an operator configured (`RequireConfiguredLocks`) and this
    /// one is not: nothing was written. Configure the lock, or name a configured one.
    pub const NOT_CONFIGURED: &str = "SemaphoreNotConfigured";

    /// The error types that are answers, not failures: the protocol working (a poller still in
    /// line, told so at every poll; a start rate holding a start back; a request past the
    /// horizon, asked again; an acquisition fenced for good; a wait past its budget) or a
    /// caller's mistake that only the caller can fix and that fails its own execution (its
    /// payload, its machine's type or prefix, a lock no operator configured, another slot's
    /// token). Lambda counts them in its `Errors` like any other. Every other type a function
    /// answers with is a failure (`is_failure`): the semaphore could not do what it was asked
    /// (`SemaphoreStoreError`: the table or Step Functions unreachable, throttled past the
    /// retries, a permission missing; `SemaphoreUnknownFormat`: an item another version wrote),
    /// and so is any type added later until it is listed here. The functions count failures in
    /// the `Failures` metric (`crate::metrics::FAILURES`), which the stack's alarms watch.
    pub const ANSWERS: &[&str] = &[
        BUSY,
        RATE_LIMITED,
        EXPIRED,
        FENCED,
        WAIT_TIMEOUT,
        INVALID_INPUT,
        MISCONFIGURED,
        NOT_CONFIGURED,
        WRONG_TOKEN,
    ];

    /// Whether a function's answer of this type means the semaphore failed (see [`ANSWERS`]).
    pub fn is_failure(error_type: &str) -> bool {
        !ANSWERS.contains(&error_type)
    }
}

#[derive(Clone, PartialEq, Eq, thiserror::Error)]
pub enum HandlerError {
    #[error("{0}")]
    InvalidInput(String),
    #[error("{0}")]
    Fenced(String),
    #[error("{0}")]
    UnknownFormat(String),
    #[error("{0}")]
    Store(String),
    #[error("{0}")]
    WaitTimeout(String),
    #[error("{0}")]
    Misconfigured(String),
    #[error("{0}")]
    Expired(String),
    #[error("{0}")]
    Busy(String),
    #[error("{0}")]
    WrongToken(String),
    #[error("{0}")]
    NotConfigured(String),
}

impl HandlerError {
    /// Each kind in one row: its Lambda error type, how to make one, and this one's message.
    fn kind(&self) -> (&'static str, fn(String) -> Self, &str) {
        match self {
            Self::InvalidInput(m) => (error_type::INVALID_INPUT, Self::InvalidInput, m),
            Self::Fenced(m) => (error_type::FENCED, Self::Fenced, m),
            Self::UnknownFormat(m) => (error_type::UNKNOWN_FORMAT, Self::UnknownFormat, m),
            Self::Store(m) => (error_type::STORE, Self::Store, m),
            Self::WaitTimeout(m) => (error_type::WAIT_TIMEOUT, Self::WaitTimeout, m),
            Self::Misconfigured(m) => (error_type::MISCONFIGURED, Self::Misconfigured, m),
            Self::Expired(m) => (error_type::EXPIRED, Self::Expired, m),
            Self::Busy(m) => (error_type::BUSY, Self::Busy, m),
            Self::WrongToken(m) => (error_type::WRONG_TOKEN, Self::WrongToken, m),
            Self::NotConfigured(m) => (error_type::NOT_CONFIGURED, Self::NotConfigured, m),
        }
    }

    pub fn error_type(&self) -> &'static str {
        self.kind().0
    }

    /// The same kind of error with another message.
    pub fn with_message(&self, message: String) -> Self {
        (self.kind().1)(message)
    }

    pub fn message(&self) -> &str {
        self.kind().2
    }

    /// Whether this answer is a failure of the semaphore, not an answer to its caller
    /// ([`error_type::ANSWERS`]).
    pub fn is_failure(&self) -> bool {
        error_type::is_failure(self.error_type())
    }
}

/// `SemaphoreFenced: <message>`: how the runtime logs a handler's error.
impl std::fmt::Debug for HandlerError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.error_type(), self.message())
    }
}

impl From<InputError> for HandlerError {
    fn from(e: InputError) -> Self {
        Self::InvalidInput(e.to_string())
    }
}

impl From<Error> for HandlerError {
    fn from(e: Error) -> Self {
        let message = e.to_string();
        match e {
            Error::InvalidInput(_) | Error::UnknownLock { .. } | Error::NotIdle { .. } => {
                Self::InvalidInput(message)
            }
            Error::NotConfigured { .. } => Self::NotConfigured(message),
            Error::Store(StoreError::UnknownFormat { .. }) => Self::UnknownFormat(message),
            Error::Store(_) => Self::Store(message),
        }
    }
}

/// How the runtime reports the error to Lambda: `errorType` is what `ErrorEquals` matches.
impl From<HandlerError> for Diagnostic {
    fn from(e: HandlerError) -> Self {
        Diagnostic {
            error_type: e.error_type().to_owned(),
            error_message: e.message().to_owned(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use semaphore_core::LockName;

    fn diagnose(e: impl Into<HandlerError>) -> Diagnostic {
        e.into().into()
    }

    #[test]
    fn core_errors_map_to_named_error_types() {
        let lock = LockName::new("demo-lock").unwrap();
        let foreign = diagnose(Error::Store(StoreError::UnknownFormat {
            lock: "demo-lock".to_owned(),
            found: Some("99".to_owned()),
        }));
        assert_eq!(foreign.error_type, "SemaphoreUnknownFormat");
        assert!(
            foreign.error_message.contains("is in format 99"),
            "{}",
            foreign.error_message
        );

        let store = diagnose(Error::Store(StoreError::TableNotFound {
            table: "t".to_owned(),
        }));
        assert_eq!(store.error_type, "SemaphoreStoreError");
        assert!(store.error_message.contains("table \"t\" does not exist"));

        let input = diagnose(Error::InvalidInput(InputError::EmptyLockName));
        assert_eq!(input.error_type, "SemaphoreInvalidInput");
        assert_eq!(input.error_message, InputError::EmptyLockName.to_string());

        let unknown = diagnose(Error::UnknownLock { lock });
        assert_eq!(unknown.error_type, "SemaphoreInvalidInput");

        let waited = diagnose(HandlerError::WaitTimeout("waited 901 s".to_owned()));
        assert_eq!(
            (waited.error_type.as_str(), waited.error_message.as_str()),
            ("SemaphoreWaitTimeout", "waited 901 s")
        );

        let fenced = diagnose(HandlerError::Fenced("gone".to_owned()));
        assert_eq!(
            (fenced.error_type.as_str(), fenced.error_message.as_str()),
            ("SemaphoreFenced", "gone")
        );
    }

    /// The alarms page an operator for failures only: every kind of answer is classified, a
    /// store failure and an item of another format are failures, a poll, a fence or a caller's
    /// mistake is not, and a type nobody listed is a failure until someone does.
    #[test]
    fn only_what_the_semaphore_could_not_do_is_a_failure() {
        let m = || "m".to_owned();
        let kinds = [
            (HandlerError::Store(m()), true),
            (HandlerError::UnknownFormat(m()), true),
            (HandlerError::Busy(m()), false),
            (HandlerError::Expired(m()), false),
            (HandlerError::Fenced(m()), false),
            (HandlerError::WaitTimeout(m()), false),
            (HandlerError::InvalidInput(m()), false),
            (HandlerError::Misconfigured(m()), false),
            (HandlerError::NotConfigured(m()), false),
            (HandlerError::WrongToken(m()), false),
        ];
        for (e, failure) in &kinds {
            assert_eq!(e.is_failure(), *failure, "{e:?}");
        }
        // The core's errors as the functions answer them: a missing table and a foreign item
        // are failures, a payload's mistake is not.
        let missing = HandlerError::from(Error::Store(StoreError::TableNotFound {
            table: "t".to_owned(),
        }));
        assert!(missing.is_failure(), "{missing:?}");
        let foreign = HandlerError::from(Error::Store(StoreError::UnknownFormat {
            lock: "l".to_owned(),
            found: None,
        }));
        assert!(foreign.is_failure(), "{foreign:?}");
        assert!(!HandlerError::from(InputError::EmptyLockName).is_failure());
        // Sent by the hand-off as a task's failure, never a function's error, but an answer.
        assert!(!error_type::is_failure(error_type::RATE_LIMITED));
        assert!(error_type::is_failure("SemaphoreSomethingNew"));
        // Each listed type is one a kind of answer has (or the hand-off's), listed once.
        let mut listed = error_type::ANSWERS.to_vec();
        listed.sort_unstable();
        listed.dedup();
        assert_eq!(listed.len(), error_type::ANSWERS.len());
        for listed in error_type::ANSWERS {
            assert!(
                *listed == error_type::RATE_LIMITED
                    || kinds.iter().any(|(e, _)| e.error_type() == *listed),
                "{listed}"
            );
        }
    }
}
