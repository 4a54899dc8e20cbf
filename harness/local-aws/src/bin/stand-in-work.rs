//! The stand-in for a user's Lambda function run as the work under the lock (the local run's
//! `WorkFunctionPrefix`): waits its event's `work_seconds` (default 1, at most 600), then answers
//! `{"worked_seconds", "fencing_token"}`, the token from the semaphore context it was given.

use std::time::Duration;

use lambda_runtime::{service_fn, Error, LambdaEvent};
use serde_json::{json, Value};

async fn work(event: LambdaEvent<Value>) -> Result<Value, Error> {
    let seconds = event.payload["work_seconds"]
        .as_f64()
        .unwrap_or(1.0)
        .clamp(0.0, 600.0);
    tokio::time::sleep(Duration::from_secs_f64(seconds)).await;
    Ok(json!({
        "worked_seconds": seconds,
        "fencing_token": event.payload["semaphore"]["fencing_token"],
    }))
}

#[tokio::main]
async fn main() -> Result<(), Error> {
    lambda_runtime::run(service_fn(work)).await
}
