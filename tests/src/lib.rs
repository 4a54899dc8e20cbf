//! Test harness shared by the integration tests: the local DynamoDB-compatible server, a proxy
//! that holds requests in flight, the original AWS sample's protocol as a reference, and an
//! independent reader of the raw table.

pub mod observe;
pub mod proxy;
pub mod reference;
pub mod server;

pub use server::{client_for, endpoint, fresh_table, sdk_config};
