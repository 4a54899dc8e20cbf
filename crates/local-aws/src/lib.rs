//! The local AWS for the tests, the local run and the bench: the local server (moto, patched and
//! serialized by `local/moto_server.py`) started one way ([`server::LocalAws`]; the scripts call
//! the `local-aws` binary), a proxy that holds or fails requests in flight (and, in `refusal`,
//! why an acquire write it held was refused), the original AWS sample's protocol (to show its
//! leak), an independent reader of the raw table (the one decoder of raw items the invariant
//! checks use), a stand-in Lambda Runtime API to run the built function binaries, an exact
//! counter of the requests an SDK client sends, validated test inputs from literals, items of a
//! format this version does not write, DynamoDB's JSON wire format, enough of the States Language to play a
//! definition's states against the Lambda handlers, and real executions of the local server's
//! Step Functions, parked in line on real task tokens (`sfn::park`). The `stand-in-work` binary
//! is the Lambda function the local run runs as a user's work.
//!
//! For the whole app on this local AWS (the local run), also: the stack deployed from
//! template.yaml as `sam deploy` would make it ([`stack`]), our Lambda binaries run behind
//! cargo lambda's emulator ([`lambda`]) under one supervisor of processes ([`procs`]), EventBridge
//! played for the executions' status events ([`eventbridge`]), the proxy that holds the acquire
//! writes of executions it stops ([`delay`]), and an independent poller of the
//! lock items ([`poller`]).

pub mod asl;
pub mod counter;
pub mod delay;
pub mod error;
pub mod eventbridge;
pub mod foreign;
pub mod lambda;
pub mod names;
pub mod observe;
pub mod poller;
pub mod procs;
pub mod proxy;
pub mod refusal;
pub mod runtime_api;
pub mod sample;
pub mod server;
pub mod sfn;
pub mod stack;
pub mod wire;

pub use error::Error;
pub use server::{all_items, client_for, endpoint, fresh_table, sdk_config, LocalAws};
