//! The stack's machines run as a user would: one uncontended critical section (its state
//! transitions), the test runner, and docs/using.md's workflow fragment.

use std::collections::BTreeSet;
use std::time::Duration;

use anyhow::{bail, Context};
use serde_json::json;

use crate::report::{short, Check, TransitionsReport};
use crate::work::{children, work_state};
use local_aws::poller::LockItems;
use local_aws::sfn::{save_history, start_execution, states_entered, wait_ended, Client as Sfn};
use local_aws::stack::Machine;

/// Runs one critical section with no contention (the run's executions have not started) and
/// counts its state transitions: the lock-protected execution's states entered and its child's.
pub async fn count_transitions(
    sfn: &Sfn,
    protected: &Machine,
    work: &Machine,
    dir: &std::path::Path,
) -> anyhow::Result<TransitionsReport> {
    let arn = start_execution(sfn, &protected.arn, "probe-transitions", &json!({})).await?;
    let outcome = wait_ended(sfn, &arn, Duration::from_secs(120)).await?;
    if outcome.status != "SUCCEEDED" {
        bail!(
            "the transition probe {} ended {} {:?}: {:?} [history: {}]",
            short(&arn),
            outcome.status,
            outcome.error,
            outcome.cause,
            save_history(sfn, &arn, dir).await
        );
    }
    let work_state = work_state(protected)?;
    let parent = states_entered(sfn, &arn).await?;
    let child = children(sfn, &work.arn)
        .await?
        .into_iter()
        .find(|c| c.parent.as_deref() == Some(arn.as_str()))
        .with_context(|| format!("the transition probe {} started no child", short(&arn)))?;
    Ok(TransitionsReport {
        semaphore_share: parent.iter().filter(|s| **s != work_state).count(),
        work: states_entered(sfn, &child.arn).await?,
        protected: parent,
    })
}

/// The test runner (the stack's machine that starts many lock-protected executions at once,
/// each with `{work_seconds, fail}` in its input for the demo work): a few executions, every
/// second one failing on purpose. Returns whether it succeeded with exactly the planned
/// failures, and what it answered.
pub async fn run_test_runner(sfn: &Sfn, runner: &Machine) -> anyhow::Result<Check> {
    let input = json!({"executions": 4, "fail_every": 2, "work_seconds": 1});
    let arn = start_execution(sfn, &runner.arn, "probe-test-runner", &input).await?;
    let outcome = wait_ended(sfn, &arn, Duration::from_secs(180)).await?;
    let output = outcome.output_json();
    let ok = outcome.status == "SUCCEEDED"
        && output["succeeded"] == 2
        && output["failed"] == 2
        && output["planned_failures"] == 2;
    let summary = if outcome.status == "SUCCEEDED" {
        format!("{input} -> {output}")
    } else {
        format!(
            "{input} -> {} {}: {}",
            outcome.status,
            outcome.error.unwrap_or_default(),
            outcome.cause.unwrap_or_default()
        )
    };
    Ok(Check::new(
        "test runner",
        ok,
        format!(
            "{}: its lock-protected executions ran the demo work with their {{work_seconds, \
             fail}} input: {summary}",
            runner.name
        ),
    ))
}

/// Runs the copy-paste fragment of docs/using.md as the stack deploys it (`your-workflow`,
/// lock `example-lock`, limit 2): one more execution than the limit at once, so that one of
/// them waits in the fragment's loop. Ok when each succeeded with a fencing token of its own
/// and the lock holds nothing after.
pub async fn run_your_workflow_example(
    sfn: &Sfn,
    example: &Machine,
    item: &LockItems,
) -> anyhow::Result<Check> {
    const LOCK: &str = "example-lock";
    let mut arns = Vec::new();
    for n in 1..=3 {
        let name = format!("probe-your-workflow-{n}");
        arns.push(start_execution(sfn, &example.arn, &name, &json!({"order": n})).await?);
    }
    let mut tokens = BTreeSet::new();
    let mut ended = Vec::new();
    for arn in &arns {
        let outcome = wait_ended(sfn, arn, Duration::from_secs(120)).await?;
        let output = outcome.output_json();
        if let Some(token) = output["work"]["output"]["fencing_token"].as_u64() {
            tokens.insert(token);
        }
        ended.push(outcome.status);
    }
    let held = item.holders(LOCK).await?;
    let ok =
        ended.iter().all(|s| s == "SUCCEEDED") && tokens.len() == arns.len() && held.is_empty();
    Ok(Check::new(
        "your workflow",
        ok,
        format!(
            "{}, the fragment of docs/using.md deployed as it is: {} executions on {LOCK} (limit 2) \
             ended {}, {} distinct fencing tokens, {} held after",
            example.name,
            arns.len(),
            ended.join("/"),
            tokens.len(),
            held.len()
        ),
    ))
}
