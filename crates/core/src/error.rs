use crate::input::{InputError, LockName};
use crate::item::{FenceKey, SlotKeyError};
use crate::queue::QueueKeyError;

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
    CorruptItem {
        lock: String,
        problem: AttributeError,
    },
    /// The lock's item has no `format`, or one this version does not write: another version
    /// (or another program) wrote it, and its attributes would be misread. Nothing is written to
    /// it; every write's condition checks the format, so none lands on such an item.
    #[error("the item for lock {lock:?} {}, not a format this version reads: nothing was written to it; run the version that wrote it, or delete the item once no execution uses the lock", format_found(.found.as_deref()))]
    UnknownFormat {
        lock: String,
        /// The item's `format` as stored (absent: it has none).
        found: Option<String>,
    },
    /// A write rendered an expression DynamoDB would refuse ("Constraints in Amazon DynamoDB",
    /// "Expression parameters": at most 4 KB per expression string, at most 300 operators or
    /// functions per expression). Caught before the request is sent, so nothing was written; the
    /// protocol splits what could grow (see `protocol::MAX_SLOTS_PER_FREE`), so this is a bug.
    #[error("lock {lock:?}: the {expression} of a write would be {bytes} bytes with {operators} operators, over DynamoDB's limit of {max_bytes} bytes and {max_operators} operators per expression; nothing was sent")]
    ExpressionTooLarge {
        lock: String,
        expression: &'static str,
        bytes: usize,
        operators: usize,
        /// The limits it is over (`dynamo::MAX_EXPRESSION_BYTES`, `MAX_EXPRESSION_OPERATORS`).
        max_bytes: usize,
        max_operators: usize,
    },
    #[error("lock {lock:?}: {problem} (a bug in this semaphore or a table that does not behave like DynamoDB)")]
    Unexpected { lock: String, problem: String },
    #[error("lock {lock:?} is in the {layout} layout, not the one its write was rendered for (the store sends it again in the lock's own)")]
    WrongLayout {
        lock: String,
        layout: crate::item::Layout,
    },
}

/// How [`StoreError::UnknownFormat`] names the format it found.
fn format_found(found: Option<&str>) -> String {
    match found {
        Some(format) => format!("is in format {format}"),
        None => "has no format attribute".to_owned(),
    }
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    InvalidInput(#[from] InputError),
    #[error("no semaphore named \"{lock}\": it is created by its first acquire")]
    UnknownLock { lock: LockName },
    #[error("lock {lock} cannot move to the {layout} layout while in use ({used} held, {waiting} waiting, {fences} fences or tombstones): stop its callers, wait for them to drain and for a sweep to rotate the fences away, then try again")]
    NotIdle {
        lock: LockName,
        layout: crate::item::Layout,
        used: u64,
        waiting: u64,
        fences: usize,
    },
    /// The semaphore takes only locks an operator configured (`RequireConfiguredLocks`), and
    /// this one is not: nothing was written.
    #[error("lock \"{lock}\" is not configured, and this stack takes only locks an operator configured (its RequireConfiguredLocks parameter): configure it first (`semctl lock set --lock {lock} --limit N`), or name a configured lock")]
    NotConfigured { lock: LockName },
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// What is wrong with a stored semaphore item or waiter record (the store's
/// [`StoreError::CorruptItem`]): the attribute, and how it is not what this version writes.
/// Each message holds its cause whole, as the store's other errors do, and none is also a
/// `source()`: a chain printed whole would say it twice.
#[derive(Debug, thiserror::Error)]
pub enum AttributeError {
    #[error("attribute {name} is missing")]
    Missing { name: &'static str },
    #[error("attribute {name} is missing or not {expected}")]
    NotA {
        name: &'static str,
        expected: &'static str,
    },
    #[error("attribute {name} is {value}, out of range")]
    OutOfRange { name: &'static str, value: u128 },
    #[error("attribute {name}: {problem}")]
    Invalid {
        name: &'static str,
        problem: InputError,
    },
    #[error(
        "attribute {name} holds a {bytes}-byte fence; fences are {} bytes",
        FenceKey::LEN
    )]
    FenceLength { name: &'static str, bytes: usize },
    #[error("holder key {key:?}: {problem}")]
    HolderKey { key: String, problem: SlotKeyError },
    #[error("holder {key:?} is not a whole number")]
    HolderValue { key: String },
    #[error("holder {key:?}: {problem}")]
    HolderWeight { key: String, problem: InputError },
    #[error(transparent)]
    Place(#[from] QueueKeyError),
    #[error("terms: {0}")]
    Terms(InputError),
    #[error("waiter: {0}")]
    Waiter(Box<AttributeError>),
}
