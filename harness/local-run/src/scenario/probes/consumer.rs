//! A consumer in a stack of its own (examples/consumer), created after the semaphore's stack,
//! its machine named under the semaphore's ProtectedStateMachinePrefix: one of its executions
//! stopped while it works must be cleaned up by the semaphore's cleanup (the rule's prefix
//! matches it, the cleanup may read its history), with no change to the semaphore's stack and
//! before any sweep could have freed the slot.

use std::time::{Duration, Instant};

use anyhow::{ensure, Context};
use serde_json::json;

use crate::report::{short, Check};
use local_aws::eventbridge::{matches, status_change_event, target_input};
use local_aws::poller::LockItems;
use local_aws::sfn::{save_history, start_execution, states_entered, wait_ended, Client as Sfn};
use local_aws::stack::{Machine, Rule, Stack};

/// The consumer machine's work state (examples/consumer/orders.asl.json).
const WORK_STATE: &str = "Process the order";

/// What [`stopped_mid_work`] runs against.
pub struct ConsumerProbe<'a> {
    pub consumer: &'a Machine,
    pub consumer_stack: &'a str,
    pub cleanup: &'a Machine,
    pub rule: &'a Rule,
    pub stack: &'a Stack,
    pub items: &'a LockItems,
    pub dir: &'a std::path::Path,
}

/// Starts one execution of the consumer's machine on a lock of its own, stops it once it holds
/// the slot and works, plays its status event through the semaphore's rule (its real pattern
/// and transformer) to the cleanup machine, and checks that the cleanup freed the slot. The
/// compressed sweeper schedule has not started yet: nothing but the cleanup can free it.
pub async fn stopped_mid_work(sfn: &Sfn, probe: ConsumerProbe<'_>) -> anyhow::Result<Check> {
    let lock = "probe-consumer-lock";
    let name = "probe-consumer-stopped";
    let input = json!({"order": 7, "lock": lock, "limit": 1, "work_seconds": 3});
    let execution = start_execution(sfn, &probe.consumer.arn, name, &input).await?;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let holds = probe.items.holders(lock).await?.contains(&execution);
        if holds
            && states_entered(sfn, &execution)
                .await?
                .iter()
                .any(|s| s == WORK_STATE)
        {
            break;
        }
        ensure!(
            Instant::now() < deadline,
            "{name} did not hold its slot in {WORK_STATE:?} within 60 s [history: {}]",
            save_history(sfn, &execution, probe.dir).await
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    sfn.stop_execution()
        .execution_arn(&execution)
        .error("LocalRun.StopMidWork")
        .send()
        .await
        .with_context(|| format!("StopExecution {name}"))?;
    let ended = wait_ended(sfn, &execution, Duration::from_secs(30)).await?;
    let event = status_change_event(
        &ended,
        &probe.stack.region,
        &probe.stack.account,
        &format!("{name}-event"),
    );
    // The semaphore's rule decides, as EventBridge would: by the prefix in its pattern.
    let matched = matches(&probe.rule.pattern, &event);
    let (cleanup_status, freed) = if matched {
        let delivered = target_input(probe.rule.transformer.as_ref(), &event)?;
        let cleanup =
            start_execution(sfn, &probe.cleanup.arn, &format!("{name}-evt"), &delivered).await?;
        let cleaned = wait_ended(sfn, &cleanup, Duration::from_secs(120)).await?;
        let freed = cleaned.output_json()["locks"]
            .as_array()
            .is_some_and(|locks| {
                locks.iter().any(|l| {
                    l["lock"] == lock && l["freed"].as_array().is_some_and(|f| f.len() == 1)
                })
            });
        (cleaned.status, freed)
    } else {
        ("not started".to_owned(), false)
    };
    let held_after = probe.items.holders(lock).await?.len();
    let ok = ended.status == "ABORTED"
        && matched
        && cleanup_status == "SUCCEEDED"
        && freed
        && held_after == 0;
    Ok(Check::new(
        "consumer stack",
        ok,
        format!(
            "{}, the machine of stack {} (examples/consumer, deployed after the semaphore's, \
             named under its ProtectedStateMachinePrefix): {} stopped mid-work ({}); its status \
             event {} the semaphore's rule; the cleanup {} {}; {held_after} held after, no \
             sweep run yet",
            probe.consumer.name,
            probe.consumer_stack,
            short(&execution),
            ended.status,
            if matched { "matched" } else { "did NOT match" },
            cleanup_status,
            if freed {
                "and freed its slot"
            } else {
                "but freed no slot"
            },
        ),
    ))
}
