use lambda_common::{init_tracing, load_aws_config, Settings};
use lambda_runtime::{service_fn, Error};

#[tokio::main]
async fn main() -> Result<(), Error> {
    init_tracing();
    let semaphore = Settings::from_env()
        .semaphore(&load_aws_config().await)
        .inspect_err(|e| tracing::error!(error = %e, "cannot start"))?;
    let semaphore = &semaphore;
    lambda_runtime::run(service_fn(move |event| {
        lambda_acquire::handle(semaphore, event)
    }))
    .await
}
