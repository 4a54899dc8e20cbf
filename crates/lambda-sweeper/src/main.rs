use lambda_common::{init_tracing, load_aws_config, Settings};
use lambda_runtime::{service_fn, Error};
use lambda_sweeper::Sweeper;

#[tokio::main]
async fn main() -> Result<(), Error> {
    init_tracing();
    let sweeper = Sweeper::from_settings(&Settings::from_env(), &load_aws_config().await)
        .inspect_err(|e| tracing::error!(error = %e, "cannot start"))?;
    let sweeper = &sweeper;
    lambda_runtime::run(service_fn(move |event| {
        lambda_sweeper::handle(sweeper, event)
    }))
    .await
}
