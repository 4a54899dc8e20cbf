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
    /// Version 1 wrote whole items with a binary `fences` attribute and a `count`; its items are
    /// not migrated (nothing was released with it), and version 2 refuses to touch them.
    #[error("the item for lock {lock:?} was written by version 1 of this semaphore, whose item format version 2 does not read: use a new lock name or a new table, or delete the item once no execution uses the lock")]
    OldFormat { lock: String },
    #[error("lock {lock:?}: {problem} (a bug in this semaphore or a table that does not behave like DynamoDB)")]
    Unexpected { lock: String, problem: String },
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    InvalidInput(#[from] InputError),
    #[error("no semaphore named \"{lock}\": it is created by its first acquire")]
    UnknownLock { lock: LockName },
    #[error(transparent)]
    Store(#[from] StoreError),
}
