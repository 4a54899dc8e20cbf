//! The refusal paths: the redrive guard (F7), run through its ASL path, and a machine the stack
//! does not protect (F12).

use std::time::Duration;

use anyhow::{ensure, Context};
use serde_json::{json, Value};

use crate::report::RedriveGuardReport;
use crate::work::work_state;
use local_aws::poller::now_ms;
use local_aws::poller::LockItems;
use local_aws::sfn::{start_execution, states_entered, wait_ended, Client as Sfn};
use local_aws::stack::Machine;

/// Invokes one of our functions through the server's Lambda bridge, as Step Functions does.
async fn invoke(endpoint: &str, function: &str, payload: &Value) -> anyhow::Result<Value> {
    use http_body_util::{BodyExt, Full};
    use hyper::body::Bytes;
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<Full<Bytes>>();
    let request = hyper::Request::post(format!(
        "{endpoint}/2015-03-31/functions/{function}/invocations"
    ))
    .header("content-type", "application/json")
    .body(Full::from(payload.to_string()))?;
    let answered = async {
        let response = client.request(request).await?;
        let status = response.status();
        let body = response.into_body().collect().await?.to_bytes();
        let body = String::from_utf8_lossy(&body);
        ensure!(status == hyper::StatusCode::OK, "HTTP {status}: {body}");
        serde_json::from_str(&body).with_context(|| format!("not JSON: {body}"))
    };
    answered.await.with_context(|| format!("invoke {function}"))
}

/// The redrive guard's ASL path. A redriven execution that failed in its work re-enters the
/// work state with the child name of its first run, already taken: the start fails, the slot is
/// released, and the execution fails with SemaphoreRedriveRefused. moto has no
/// RedriveExecution, so the same meeting is made directly: the child name of an execution about
/// to start is asked of the acquire function itself (on a lock of its own, released at once,
/// so its fence touches no lock of the run), a child of that name is run first, then the
/// execution.
pub async fn redrive_guard(
    sfn: &Sfn,
    endpoint: &str,
    protected: &Machine,
    work: &Machine,
    items: &LockItems,
    default_lock: &str,
) -> anyhow::Result<RedriveGuardReport> {
    let name = "probe-redrive-guard";
    let arn = protected.arn.replace(":stateMachine:", ":execution:") + ":" + name;
    // As the acquire state asks, but with a task token no task waits on: the function's own
    // answer (its invocation's result) names the child.
    let answer = invoke(
        endpoint,
        "acquire",
        &json!({
            "request": {"lock": "probe-child-name", "limit": 1},
            "starts_work": true,
            "execution": arn,
            "redrive_count": 0,
            "state": {"EnteredTime": semaphore_core::rfc3339_millis(now_ms() as u64)},
            "task_token": "probe-redrive-guard-token",
        }),
    )
    .await?;
    let child_name = answer["work"]["name"]
        .as_str()
        .with_context(|| format!("the acquire function's answer has no work.name: {answer}"))?
        .to_owned();
    invoke(endpoint, "release", &json!({"semaphore": answer})).await?;
    let first = start_execution(sfn, &work.arn, &child_name, &json!({"work_seconds": 0})).await?;
    wait_ended(sfn, &first, Duration::from_secs(60)).await?;
    let started = start_execution(sfn, &protected.arn, name, &json!({})).await?;
    let outcome = wait_ended(sfn, &started, Duration::from_secs(120)).await?;
    let entered = states_entered(sfn, &started).await?;
    let held_after = items
        .holders(default_lock)
        .await?
        .iter()
        .filter(|h| **h == started)
        .count();
    let ok = outcome.status == "FAILED"
        && outcome.error.as_deref() == Some("SemaphoreRedriveRefused")
        && entered.contains(&work_state(protected)?)
        && held_after == 0;
    Ok(RedriveGuardReport {
        execution: started,
        child_name,
        status: outcome.status,
        error: outcome.error,
        cause: outcome.cause,
        held_after,
        ok,
    })
}

/// #18 item 16 (F12): a machine that takes the semaphore without being one the stack protects
/// (here: the lock-protected definition deployed under another name, not in
/// ProtectedStateMachinePrefix) must fail at once with SemaphoreMisconfigured, the acquire
/// function having written nothing, instead of waiting in line for a wake-up that never comes.
pub async fn misconfigured_caller(
    sfn: &Sfn,
    protected: &Machine,
    items: &LockItems,
) -> anyhow::Result<crate::report::MisconfiguredReport> {
    let name = format!("{}-undeclared", protected.name);
    let machine = sfn
        .create_state_machine()
        .name(&name)
        .definition(&protected.definition)
        .role_arn(format!(
            "arn:aws:iam::{}:role/{name}",
            protected.arn.split(':').nth(4).unwrap_or_default()
        ))
        .send()
        .await
        .with_context(|| format!("CreateStateMachine {name}"))?
        .state_machine_arn()
        .to_owned();
    let lock = "probe-misconfigured";
    let started = start_execution(
        sfn,
        &machine,
        "probe-misconfigured-caller",
        &json!({"lock": lock, "limit": 1}),
    )
    .await?;
    let outcome = wait_ended(sfn, &started, Duration::from_secs(120)).await?;
    let lock_written = items.item(lock).await?.is_some();
    Ok(crate::report::MisconfiguredReport {
        ok: outcome.status == "FAILED"
            && outcome.error.as_deref() == Some("SemaphoreMisconfigured")
            && !lock_written,
        execution: started,
        status: outcome.status,
        error: outcome.error,
        lock_written,
    })
}
