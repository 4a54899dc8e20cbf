//! What can go wrong in the local AWS's calls, each naming what failed and where to look: the
//! local run reports these to its user, the tests panic with them. An SDK's or the OS's own
//! error is the source, so that a report of the chain (anyhow's `{:#}`, the SDK's
//! `DisplayErrorContext`) says why.

use std::path::PathBuf;
use std::process::ExitStatus;
use std::time::Duration;

/// An error of any kind as a source (each SDK operation has an error type of its own).
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A call to the local server's AWS API (Step Functions, DynamoDB) failed.
    #[error("{call}")]
    Aws {
        call: String,
        #[source]
        source: BoxError,
    },
    /// A file, a socket or a process could not be made.
    #[error("{what}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    /// Text that is not what it should be: a stack description, a parameter, an endpoint.
    #[error("{what}")]
    Parse {
        what: String,
        #[source]
        source: BoxError,
    },
    /// A tool or a binary the run starts is not there.
    #[error("{} is missing: {fix}", path.display())]
    Missing { path: PathBuf, fix: String },
    /// A process the run started exited; the end of its log tells why.
    #[error("{what} exited ({status}); see {}:\n{tail}", log.display())]
    Exited {
        what: String,
        status: String,
        log: PathBuf,
        tail: String,
    },
    /// What the run waited for (an execution's end, a process to listen) did not come in time.
    #[error("waited {} s for {what}", after.as_secs())]
    Timeout { what: String, after: Duration },
    /// `local/deploy_stack.py` did not deploy template.yaml.
    #[error("local/deploy_stack.py failed ({status}):\n{stderr}")]
    Deploy { status: ExitStatus, stderr: String },
    /// The deployed stack has not what the run looks up in it.
    #[error("the stack has no {0}")]
    NotInStack(String),
    /// The event a rule's target gets cannot be made (the transformer is not one EventBridge
    /// would take, or the event lacks what the target reads).
    #[error("the event for the rule's target: {0}")]
    Event(String),
}

impl Error {
    /// For `map_err`: the `call` (its operation and what it was about) failed.
    pub fn aws<E: Into<BoxError>>(call: impl Into<String>) -> impl FnOnce(E) -> Self {
        let call = call.into();
        move |source| Error::Aws {
            call,
            source: source.into(),
        }
    }

    /// For `map_err`: `what` (a file, a socket, a process) could not be made.
    pub fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> Self {
        let what = what.into();
        move |source| Error::Io { what, source }
    }
}
