use lambda_cleanup::Cleanup;
use lambda_common::{init_tracing, load_aws_config, Settings};
use lambda_runtime::{service_fn, Error};

#[tokio::main]
async fn main() -> Result<(), Error> {
    init_tracing();
    let cleanup = Cleanup::from_settings(&Settings::from_env(), &load_aws_config().await)
        .inspect_err(|e| tracing::error!(error = %e, "cannot start"))?;
    let cleanup = &cleanup;
    lambda_runtime::run(service_fn(move |event| {
        lambda_cleanup::handle(cleanup, event)
    }))
    .await
}
