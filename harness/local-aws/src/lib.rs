//! The local AWS for the tests, the local run and the bench, so that every test runs against a
//! real DynamoDB-compatible server and real Step Functions executions, not mocks:
//!
//! - the local server (moto, patched by `local/moto_server.py`), started by [`server::LocalAws`]
//!   (the scripts call the `local-aws` binary);
//! - faults on the wire: a [`proxy`] that holds or fails requests in flight, [`refusal`] (why a
//!   held acquire write was refused), and [`delay`] (acquire writes of executions it stops);
//! - readers that do not trust the product: [`observe`] (the raw table, the one decoder the
//!   invariant checks use), [`poller`] and a request [`counter`];
//! - the original AWS sample's protocol ([`sample`]), to show its leak;
//! - inputs and items: validated [`names`] from literals, items of a format this version does
//!   not write ([`foreign`]), DynamoDB's JSON [`wire`] format;
//! - the app itself: enough of the States Language to play a definition ([`asl`]), a stand-in
//!   Lambda [`runtime_api`], real parked executions ([`sfn`]), the stack deployed from
//!   template.yaml ([`stack`]), our Lambdas behind cargo lambda's emulator ([`lambda`]) under one
//!   supervisor ([`procs`]), and EventBridge's status events ([`eventbridge`]). The
//!   `stand-in-work` binary is the work function the local run runs.

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
