// The release's future nests the core's release rounds and the hand-off (with its start-rate
// wait) inside the runtime's service: its type is deeper than rustc's default limit of 128
// queries when its layout is computed.
#![recursion_limit = "256"]

use lambda_common::{init_tracing, load_aws_config, ConfigError, Settings};
use lambda_runtime::{service_fn, Error};

#[tokio::main]
async fn main() -> Result<(), Error> {
    init_tracing();
    // Read and checked once, at cold start: a bad variable stops the function with a message
    // naming it, before any invocation.
    let settings = Settings::from_env();
    let sdk = load_aws_config().await;
    let started = || -> Result<_, ConfigError> {
        Ok((
            settings.semaphore(&sdk)?,
            lambda_release::resolver(&settings)?,
            settings.hand_offs(&sdk)?,
        ))
    };
    let (semaphore, resolver, hand_offs) =
        &started().inspect_err(|e| tracing::error!(error = %e, "cannot start"))?;
    lambda_runtime::run(service_fn(move |event| {
        lambda_release::handle(semaphore, resolver, hand_offs, event)
    }))
    .await
}
