//! Stopping the parent while its work runs: the cleanup must stop the child (a state machine)
//! or wait for it (a Lambda function) before it frees the slot.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context};
use serde_json::Value;

use crate::report::StopParentReport;
use crate::work::children;
use local_aws::poller::now_ms;
use local_aws::poller::LockItems;
use local_aws::sfn::{start_execution, states_entered, wait_ended, Client as Sfn};
use local_aws::stack::Machine;

/// What [`stop_the_parent`] runs.
pub struct StopParent<'a> {
    pub protected: &'a Machine,
    /// The machine the child runs on: the demo work, or the work-function runner.
    pub child_machine: &'a Machine,
    pub cleanup: &'a Machine,
    /// The rule's input transformer: the cleanup gets what EventBridge would send it.
    pub transformer: Option<&'a local_aws::eventbridge::InputTransformer>,
    pub input: Value,
    pub name: &'a str,
    pub work: &'a str,
    /// The child must have been stopped (a state machine), or have ended on its own while the
    /// cleanup waited (a Lambda function, which cannot be stopped).
    pub expect_stopped: bool,
}

/// Stops an execution while its work runs and hands its status event to the cleanup machine
/// at once; a poller of its lock (every 50 ms) tells when its slot was freed. On AWS, Step
/// Functions also tries to stop a stopped parent's `.sync` child, best effort; moto does not,
/// so what is seen here is the cleanup's own guarantee: the child was stopped (or, for a
/// Lambda, had ended) before the slot was freed.
pub async fn stop_the_parent(
    sfn: &Sfn,
    probe: StopParent<'_>,
    items: &LockItems,
    lock: &str,
    stack: &local_aws::stack::Stack,
) -> anyhow::Result<StopParentReport> {
    let parent = start_execution(sfn, &probe.protected.arn, probe.name, &probe.input).await?;
    let freed = {
        let (items, lock, parent) = (items.clone(), lock.to_owned(), parent.clone());
        tokio::spawn(async move {
            let deadline = Instant::now() + Duration::from_secs(180);
            let mut held = false;
            while Instant::now() < deadline {
                if let Ok(holders) = items.holders(&lock).await {
                    let answered_ms = now_ms();
                    let holds = holders.contains(&parent);
                    if held && !holds {
                        return Some(answered_ms);
                    }
                    held |= holds;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            None
        })
    };
    // Stop it once its child runs (for a Lambda, once the runner has had time to invoke it).
    let deadline = Instant::now() + Duration::from_secs(60);
    let child = loop {
        let found = children(sfn, &probe.child_machine.arn)
            .await?
            .into_iter()
            .find(|c| c.parent.as_deref() == Some(parent.as_str()) && c.status == "RUNNING");
        if let Some(child) = found {
            break child;
        }
        ensure!(
            Instant::now() < deadline,
            "{}: no child started within 60 s",
            probe.name
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    tokio::time::sleep(Duration::from_millis(1000)).await;
    sfn.stop_execution()
        .execution_arn(&parent)
        .error("LocalRun.StopTheParent")
        .send()
        .await
        .with_context(|| format!("StopExecution {}", probe.name))?;
    // The event is emitted once the execution has ended (ABORTED, with its stop date).
    let ended = wait_ended(sfn, &parent, Duration::from_secs(30)).await?;
    let event = local_aws::eventbridge::status_change_event(
        &ended,
        &stack.region,
        &stack.account,
        &format!("{}-event", probe.name),
    );
    let delivered = local_aws::eventbridge::target_input(probe.transformer, &event)?;
    let cleanup_name = format!("{}-evt", probe.name);
    let cleanup = start_execution(sfn, &probe.cleanup.arn, &cleanup_name, &delivered)
        .await
        .with_context(|| {
            format!(
                "{}: the cleanup machine refused its status event ({} bytes as delivered)",
                probe.name,
                delivered.len(),
            )
        })?;
    let cleaned = wait_ended(sfn, &cleanup, Duration::from_secs(180)).await?;
    let child_ended = wait_ended(sfn, &child.arn, Duration::from_secs(60)).await?;
    let freed_ms = freed.await.unwrap_or(None);
    let waits = {
        let definition: Value =
            serde_json::from_str(&probe.cleanup.definition).unwrap_or(Value::Null);
        let wait_states: BTreeSet<String> = definition["States"]
            .as_object()
            .map(|states| {
                states
                    .iter()
                    .filter(|(_, s)| s["Type"] == "Wait")
                    .map(|(n, _)| n.clone())
                    .collect()
            })
            .unwrap_or_default();
        states_entered(sfn, &cleanup)
            .await?
            .iter()
            .filter(|s| wait_states.contains(*s))
            .count()
    };
    let freed_after_child_ms = freed_ms.map(|f| f - child_ended.stop_ms);
    let ended_as_expected = if probe.expect_stopped {
        child_ended.status == "ABORTED"
    } else {
        child_ended.status == "SUCCEEDED" && waits > 0
    };
    Ok(StopParentReport {
        work: probe.work.to_owned(),
        parent,
        child: child.arn,
        child_ended_after_stop_ms: child_ended.stop_ms - ended.stop_ms,
        ok: ended_as_expected
            && cleaned.status == "SUCCEEDED"
            && freed_after_child_ms.is_some_and(|ms| ms >= 0),
        child_status: child_ended.status,
        freed_after_child_ms,
        cleanup_waits: waits,
        cleanup_status: cleaned.status,
        event_bytes: event.to_string().len(),
        delivered_bytes: delivered.len(),
    })
}
