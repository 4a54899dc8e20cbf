//! Step 2: one path at a time, before the run's executions start: one uncontended critical
//! section (its state transitions), the redrive guard, a machine the stack does not protect, a
//! long wait with a big input (the history and payload quotas), stopping the parent of running
//! work, the test runner, docs/using.md's workflow fragments (standard and Express) and the
//! Distributed Map example.

use serde_json::json;

mod consumer;
mod examples;
mod express;
mod guards;
mod history;
mod stop_parent;

use super::deploy::Stage;
use crate::driver::Setup;
use crate::progress::phase;
use crate::report::{
    Check, HistoryProbeReport, MisconfiguredReport, RedriveGuardReport, StopParentReport,
    TransitionsReport,
};
use stop_parent::StopParent;

/// Elements `"ab"` of the big-input probe's padding: 200,000 bytes of input (under
/// StartExecution's 262,144), 280,000 once escaped into the status event's `input` text.
const BIG_INPUT_ITEMS: usize = 40_000;

/// What the probes found; each is checked with the run's invariants.
pub(super) struct Probes {
    pub transitions: TransitionsReport,
    pub redrive: RedriveGuardReport,
    pub misconfigured: MisconfiguredReport,
    pub history: HistoryProbeReport,
    pub stop_parent: Vec<StopParentReport>,
    /// Whether the test runner did as planned, and what it answered.
    pub test_runner: Check,
    /// Whether docs/using.md's fragment did as planned, and how its executions ended.
    pub your_workflow: Check,
    /// Whether the consumer stack's machine, created after the deploy, was cleaned up.
    pub consumer: Check,
    /// Whether Express executions and a Distributed Map's Express children shared the example
    /// lock with standard executions, within its limit (#27).
    pub express: Check,
}

pub(super) async fn run(setup: &Setup<'_>, stage: &Stage) -> anyhow::Result<Probes> {
    let Stage {
        stack,
        locks,
        work_function,
        endpoint,
        deployed,
        protected,
        work_machine,
        runner_machine,
        cleanup_machine,
        consumer,
        consumer_machine,
        sfn,
        item,
        ..
    } = stage;
    let (dir, args, rule) = (setup.dir, setup.args, &deployed.rule);
    phase(
        "probes: one uncontended critical section, the redrive guard, stopping the parent, the \
         test runner, your workflow",
    );
    let transitions = examples::count_transitions(sfn, protected, work_machine, dir).await?;
    eprintln!(
        "    ok: one critical section entered {} states of {} and {} of {}",
        transitions.protected.len(),
        protected.name,
        transitions.work.len(),
        work_machine.name
    );
    let redrive =
        guards::redrive_guard(sfn, endpoint, protected, work_machine, item, &locks[0].name).await?;
    eprintln!("    {}", redrive.check().line());
    let misconfigured = guards::misconfigured_caller(sfn, protected, item).await?;
    eprintln!("    {}", misconfigured.check().line());
    let history_probe =
        history::long_wait_with_a_big_input(sfn, protected, args.queue_fallback_seconds, dir)
            .await?;
    eprintln!("    {}", history_probe.check().line());
    let mut stop_probes = Vec::new();
    for probe in [
        StopParent {
            protected,
            child_machine: work_machine,
            cleanup: cleanup_machine,
            transformer: rule.transformer.as_ref(),
            // Long enough that only a stop ends it in time.
            input: json!({"work_seconds": 60}),
            name: "probe-stop-parent-machine-work",
            work: "state machine",
            expect_stopped: true,
        },
        // #18 item 13: an input near the 256 KB limit, full of quotes as JSON inputs are. Its
        // status event carries it as escaped text, past the 256 KB StartExecution takes (the
        // local server enforces it): only the rule's input transformer gets it to the cleanup.
        StopParent {
            protected,
            child_machine: work_machine,
            cleanup: cleanup_machine,
            transformer: rule.transformer.as_ref(),
            input: json!({"work_seconds": 60, "pad": vec!["ab"; BIG_INPUT_ITEMS]}),
            name: "probe-stop-parent-big-input",
            work: "state machine (a ~200 KB input)",
            expect_stopped: true,
        },
        StopParent {
            protected,
            child_machine: runner_machine,
            cleanup: cleanup_machine,
            transformer: rule.transformer.as_ref(),
            input: json!({"work": work_function, "work_seconds": 6}),
            name: "probe-stop-parent-lambda-work",
            work: "Lambda function",
            expect_stopped: false,
        },
    ] {
        let stopped = stop_parent::stop_the_parent(sfn, probe, item, &locks[0].name, stack).await?;
        let line = if stopped.ok { "ok" } else { "NOT OK" };
        eprintln!("    {line}: {}", stopped.summary());
        stop_probes.push(stopped);
    }
    let test_runner =
        examples::run_test_runner(sfn, deployed.machine("TestRunnerStateMachine")?).await?;
    eprintln!("    {}", test_runner.line());
    let example = deployed.machine("YourWorkflowExampleStateMachine")?;
    let your_workflow = examples::run_your_workflow_example(sfn, example, item).await?;
    eprintln!("    {}", your_workflow.line());
    let express = express::express_and_map(
        sfn,
        express::Machines {
            express: deployed.machine("ExpressWorkflowExampleStateMachine")?,
            map: deployed.machine("DistributedMapExampleStateMachine")?,
            standard: example,
        },
        item,
    )
    .await?;
    eprintln!("    {}", express.line());
    let consumer = consumer::stopped_mid_work(
        sfn,
        consumer::ConsumerProbe {
            consumer: consumer_machine,
            consumer_stack: &consumer.stack.name,
            cleanup: cleanup_machine,
            rule,
            stack,
            items: item,
            dir,
        },
    )
    .await?;
    eprintln!("    {}", consumer.line());
    Ok(Probes {
        transitions,
        redrive,
        misconfigured,
        history: history_probe,
        stop_parent: stop_probes,
        test_runner,
        your_workflow,
        consumer,
        express,
    })
}
