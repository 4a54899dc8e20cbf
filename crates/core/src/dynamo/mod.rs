//! The DynamoDB adapter: the [`DynamoStore`], an [`ItemStore`](crate::ports::ItemStore) that keeps
//! a lock in one of two layouts (one item holding every slot, or, for large limits, a gate item
//! with one holding item per slot: `gate`, `holdings`) and one record per waiter, and sends each
//! [`Write`](crate::write::Write) as one conditional request (a transaction when it names a
//! waiter's record or a holding).
//!
//! - `codec`: the item and a waiter's record as attribute values, and back;
//! - `expression`: a write's checks and changes as DynamoDB expressions, within DynamoDB's
//!   limits on them;
//! - `size`: an item's size and the write units it costs, as DynamoDB counts them;
//! - `store`: the client: the tables, and the requests each write is sent as;
//! - `retry`: what the store does about answers that are not answers to the write (a lost
//!   answer, a throttle, a conflict).

mod codec;
mod expression;
mod gate;
mod holdings;
mod retry;
mod size;
mod store;

pub use codec::{
    attr, decode, decode_waiter, encode, encode_waiter, queue_attr, FORMAT, GATE_FORMAT, TIME_SPAN,
    TOKEN_SPAN, VERSION_UNIT, WEIGHT_SPAN,
};
pub use expression::{render, Rendered, MAX_EXPRESSION_BYTES, MAX_EXPRESSION_OPERATORS};
pub use holdings::{
    holding_attr, key as holding_key, partition as holdings_partition,
    partitions as holdings_partitions, HOLDINGS_BUCKETS,
};
pub use retry::{holder_retries, throttle_backoff, HOLDER_ATTEMPTS};
pub use size::{item_size, stored_size, write_units};
pub use store::{DynamoStore, TableSetup};
