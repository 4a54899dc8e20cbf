use lambda_common::{init_tracing, load_aws_config, ConfigError, Settings};
use lambda_runtime::{service_fn, Error};

#[tokio::main]
async fn main() -> Result<(), Error> {
    init_tracing();
    // Everything is read and checked once, at cold start: a bad variable stops the function
    // with a message naming it, before any invocation.
    let settings = Settings::from_env();
    let sdk = load_aws_config().await;
    let started = || -> Result<_, ConfigError> {
        let semaphore = settings
            .semaphore(&sdk)?
            .with_configured_only(settings.configured_only()?);
        let mut config = lambda_acquire::Config::from_settings(&settings)?;
        config.deployment.machine_types = Some(lambda_common::MachineTypes::from_sdk(&sdk));
        Ok((semaphore, config, settings.hand_offs(&sdk)?))
    };
    let (semaphore, config, hand_offs) =
        &started().inspect_err(|e| tracing::error!(error = %e, "cannot start"))?;
    lambda_runtime::run(service_fn(move |event| {
        lambda_acquire::handle(semaphore, config, hand_offs, event)
    }))
    .await
}
