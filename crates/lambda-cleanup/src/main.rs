use lambda_common::{init_tracing, load_aws_config, Settings};
use lambda_runtime::{service_fn, Error};

#[tokio::main]
async fn main() -> Result<(), Error> {
    init_tracing();
    let settings = Settings::from_env();
    let (semaphore, locks) = settings
        .semaphore(&load_aws_config().await)
        .and_then(|semaphore| Ok((semaphore, settings.lock_names()?)))
        .inspect_err(|e| tracing::error!(error = %e, "cannot start"))?;
    let (semaphore, locks) = (&semaphore, locks.as_slice());
    lambda_runtime::run(service_fn(move |event| {
        lambda_cleanup::handle(semaphore, locks, event)
    }))
    .await
}
