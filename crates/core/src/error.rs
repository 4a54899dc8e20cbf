use std::time::Duration;

use crate::input::{InputError, LockName};

/// A failure of the table itself, as opposed to an answer of the protocol.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("table {table:?} does not exist: create it with `semctl init` or deploy the stack")]
    TableNotFound { table: String },
    #[error("DynamoDB {operation} on table {table:?} failed: {message}")]
    Dynamo {
        operation: &'static str,
        table: String,
        message: String,
    },
    #[error("the item for lock {lock:?} is not a semaphore item ({problem}); was it written by something else?")]
    CorruptItem { lock: String, problem: String },
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    InvalidInput(#[from] InputError),
    /// The bounded retry loop ran out: other writers changed the item between every read and
    /// write. Retryable by the caller (the state machine retries it with backoff).
    #[error("gave up on lock \"{lock}\" after {attempts} conflicting writes in {elapsed:?}: other writers keep changing it; retry later")]
    Contention {
        lock: LockName,
        attempts: u32,
        elapsed: Duration,
    },
    #[error("no semaphore named \"{lock}\": it is created by its first acquire")]
    UnknownLock { lock: LockName },
    #[error(transparent)]
    Store(#[from] StoreError),
}
