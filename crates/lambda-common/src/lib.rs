//! What the four Lambda functions (acquire, release, cleanup, sweeper) share, so that each of them
//! is a thin adapter over `semaphore-core`:
//!
//! - [`Settings`]: configuration from the environment, read once per cold start, with a clear
//!   error when something required is missing or malformed;
//! - [`init_tracing`]: JSON logs for CloudWatch;
//! - [`Payload`]: validation of a state machine's JSON payload into the core's input types;
//! - [`Resolver`]: which lock, limit, acquisition and work a payload asks for, from its request
//!   and the function's defaults: one set of rules for acquire, release and the cleanup
//!   function's reading of an ended execution's acquire payloads;
//! - [`metrics`]: the functions' metrics as CloudWatch embedded-metric-format log lines;
//! - [`HandlerError`]: the named errors a state machine can `Retry` or `Catch` (their names in
//!   [`error_type`]);
//! - [`history`], [`sfn`] and [`arn`] (the cleanup function and the sweeper): what an ended
//!   execution's history says (the locks its acquire tasks asked for, the child executions its
//!   work ran in), the Step Functions calls behind a trait, and Step Functions ARNs.

pub mod arn;
mod config;
pub mod deployment;
mod error;
pub mod executions;
pub mod history;
pub mod metrics;
mod payload;
mod request;
pub mod sfn;
pub mod waiting;

pub use config::{
    var, ConfigError, NotAnArn, Settings, ACQUIRE_FUNCTION_TIMEOUT, DEFAULT_MAX_WAIT,
    EVENTS_PER_FALLBACK_CHECK, HISTORY_EVENT_QUOTA, HISTORY_RESERVE, MAX_FALLBACK_CHECKS,
    MAX_WAIT_RANGE,
};
pub use deployment::{Deployment, MachineTypes};
pub use error::{error_type, HandlerError};
pub use executions::{OtherRegion, SfnExecutions};
pub use metrics::Metrics;
pub use payload::{kind, quoted, Payload};
pub use request::{
    incarnation_acquisition, AllowedWork, Defaults, Resolver, ACQUIRE_PAYLOAD,
    EXPRESS_LEASE_SECONDS, MAX_WORK_ARN_BYTES, RELEASE_PAYLOAD, RESERVED_INPUT_KEY,
};
pub use waiting::{
    granted_answer, CallbackError, ContextError, HandOffs, SfnHandOffs, TaskCallbacks, TaskWaker,
};

/// Installs the JSON log subscriber: one JSON object per line on stdout, level from `RUST_LOG`
/// (default `info`), no ANSI colours and no timestamp (CloudWatch stamps every line). The
/// runtime's span carrying the request id is kept on each line. Calling it twice is harmless.
pub fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .json()
        .with_env_filter(filter)
        .with_ansi(false)
        .without_time()
        .with_target(false)
        .with_span_list(false)
        .with_current_span(true)
        .flatten_event(true)
        .try_init();
}

/// The AWS configuration of the function (region, credentials and, for local runs,
/// `AWS_ENDPOINT_URL`) from the environment. Build it once per cold start.
pub async fn load_aws_config() -> aws_config::SdkConfig {
    aws_config::load_defaults(aws_config::BehaviorVersion::latest()).await
}
