//! The consumer example's work: processes an order under the slot. Waits `work_seconds` (0 to
//! 30, default 1) and answers with the order and the fencing token it was given, which a real
//! work passes to whatever it writes so that a late write of a holder that lost its slot can be
//! refused; fails with `WorkFailed` when asked to (`"fail": true`), so that the workflow's
//! release after a failure can be seen.

use std::time::Duration;

use lambda_runtime::{service_fn, Diagnostic, Error, LambdaEvent};
use serde::Deserialize;
use serde_json::{json, Value};

#[derive(Debug, Deserialize)]
struct Order {
    #[serde(default)]
    order: Value,
    #[serde(default = "one")]
    work_seconds: f64,
    #[serde(default)]
    fail: bool,
    fencing_token: u64,
}

fn one() -> f64 {
    1.0
}

/// A named error, which a state machine's `Catch` matches by its `errorType`.
fn error(error_type: &str, message: String) -> Diagnostic {
    Diagnostic {
        error_type: error_type.to_owned(),
        error_message: message,
    }
}

async fn process(event: LambdaEvent<Order>) -> Result<Value, Diagnostic> {
    let order = event.payload;
    if !(0.0..=30.0).contains(&order.work_seconds) {
        return Err(error(
            "InvalidOrder",
            format!(
                "work_seconds must be from 0 to 30, got {}",
                order.work_seconds
            ),
        ));
    }
    tracing::info!(order = %order.order, fencing_token = order.fencing_token, "processing");
    tokio::time::sleep(Duration::from_secs_f64(order.work_seconds)).await;
    if order.fail {
        return Err(error(
            "WorkFailed",
            "the order asked its work to fail (\"fail\": true)".to_owned(),
        ));
    }
    Ok(json!({"order": order.order, "fencing_token": order.fencing_token}))
}

#[tokio::main]
async fn main() -> Result<(), Error> {
    tracing_subscriber::fmt()
        .json()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .without_time()
        .init();
    lambda_runtime::run(service_fn(process)).await
}
