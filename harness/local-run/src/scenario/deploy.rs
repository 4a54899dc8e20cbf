//! Step 1: the local AWS, the stack deployed from template.yaml, our Lambda binaries behind the
//! emulator (the acquire function's writes through the delaying proxy), and a preflight that
//! answers and errors come back through the bridge as Step Functions expects.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, ensure};
use serde_json::json;
use tokio::sync::mpsc;

use crate::driver::Setup;
use crate::progress::phase;
use crate::LockSpec;
use local_aws::delay::{DelayProxy, WriteKind};
use local_aws::lambda;
use local_aws::poller::{Layout, LockItems};
use local_aws::server::sdk_config_for;
use local_aws::sfn::{start_execution, wait_ended, Client as Sfn};
use local_aws::stack::{ConsumerDeployed, Deployed, Machine, Stack};

/// The deployed stack and the clients the later steps use.
pub(super) struct Stage {
    pub stack: Stack,
    pub locks: Vec<LockSpec>,
    /// A Lambda function of the user's, allowed as work: served from this process.
    pub work_function: String,
    pub endpoint: String,
    pub deployed: Deployed,
    pub protected: Machine,
    /// The work the executions run: the template's default work (the acquire function's
    /// DEFAULT_WORK), the demo work.
    pub work_machine: Machine,
    /// The machine that runs a Lambda function as the work.
    pub runner_machine: Machine,
    pub cleanup_machine: Machine,
    pub sweeper_machine: Machine,
    /// The consumer's stack (examples/consumer), deployed after the semaphore's.
    pub consumer: ConsumerDeployed,
    /// Its machine, named under the semaphore's ProtectedStateMachinePrefix.
    pub consumer_machine: Machine,
    pub timing: (u64, u64),
    pub proxy: Arc<DelayProxy>,
    pub sdk: aws_config::SdkConfig,
    pub sfn: Sfn,
    /// The lock items, read raw.
    pub item: LockItems,
}

/// Deploys the stack and starts its functions; the receiver of the executions whose acquire
/// write the proxy holds.
pub(super) async fn deploy(
    setup: &Setup<'_>,
) -> anyhow::Result<(Stage, mpsc::UnboundedReceiver<String>)> {
    let (args, root, dir) = (setup.args, setup.root, setup.dir);
    let stack = Stack::default();
    let locks = args.locks()?;
    // The first lock is the template's default: its executions name no lock and no limit, so
    // the acquire function's defaults (DEFAULT_LOCK, DEFAULT_LIMIT) are what they take.
    let work_function = format!(
        "arn:{}:lambda:{}:{}:function:{}",
        stack.partition,
        stack.region,
        stack.account,
        lambda::WORK_FUNCTION
    );
    let mut overrides = BTreeMap::from([
        ("LockName".to_owned(), locks[0].name.clone()),
        ("ConcurrencyLimit".to_owned(), locks[0].limit.to_string()),
        (
            "WorkFunctionPrefix".to_owned(),
            lambda::WORK_FUNCTION.to_owned(),
        ),
        // The consumer stack's machines are named with it (examples/consumer).
        (
            "ProtectedStateMachinePrefix".to_owned(),
            CONSUMER_PREFIX.to_owned(),
        ),
        // No execution waits longer than the run.
        ("MaxWaitSeconds".to_owned(), args.timeout.to_string()),
    ]);
    // The default lock's start rate is the stack's (F14: its limit and rate are the template's
    // parameters, whatever an input asks).
    if let Some(rate) = args.rate {
        overrides.insert("DefaultRate".to_owned(), rate.to_string());
    }
    // The acquire states' checks, compressed like the sweeper's schedule.
    let state_timeouts = BTreeMap::from([(
        local_aws::asl::ACQUIRE_STATE.to_owned(),
        args.queue_fallback_seconds,
    )]);
    phase("starting the local AWS on 127.0.0.1");
    let python = args
        .python
        .clone()
        .unwrap_or_else(|| root.join(".venv/bin/python"));
    let cargo_lambda = args
        .cargo_lambda
        .clone()
        .unwrap_or_else(|| root.join(".venv/bin/cargo-lambda"));
    let emulator_port = lambda::free_port()?;
    let emulator = format!("http://127.0.0.1:{emulator_port}");
    let endpoint = setup
        .supervisor
        .start_server(&python, dir, Some(&emulator))?;
    eprintln!("    moto server    {endpoint} (serialized; Step Functions execution mode on; Lambda invokes -> {emulator})");

    phase("deploying template.yaml: the SAM transform, then moto's CloudFormation");
    let deployed = Deployed::deploy(
        &python,
        root,
        &endpoint,
        &stack,
        &overrides,
        &state_timeouts,
    )?;
    for line in deployed.resources() {
        eprintln!("    {line}");
    }
    let protected = deployed.machine("LockProtectedStateMachine")?.clone();
    let work_machine = deployed.machine_named_by("DEFAULT_WORK")?.clone();
    let runner_machine = deployed.machine_named_by("WORK_FUNCTION_RUNNER")?.clone();
    let cleanup_machine = deployed.rule_target()?.clone();
    let sweeper_machine = deployed.scheduled()?.clone();
    let timing = deployed.timing_seconds()?;

    phase("deploying examples/consumer/template.yaml as a stack of its own, importing the semaphore's exports");
    let consumer_stack = Stack {
        name: format!("{}-consumer", stack.name),
        ..stack.clone()
    };
    let consumer = ConsumerDeployed::deploy(
        &python,
        root,
        &root.join("examples/consumer/template.yaml"),
        &endpoint,
        &consumer_stack,
        &BTreeMap::from([("SemaphoreStackName".to_owned(), stack.name.clone())]),
        &state_timeouts,
    )?;
    let consumer_machine = consumer.machine("OrdersStateMachine")?.clone();
    ensure!(
        consumer_machine.name.starts_with(CONSUMER_PREFIX),
        "the consumer's machine {} is not named under the semaphore's prefix {CONSUMER_PREFIX}",
        consumer_machine.name
    );
    eprintln!(
        "    stack          {}: machine {}, function {}",
        consumer_stack.name,
        consumer_machine.name,
        consumer
            .functions
            .iter()
            .map(|f| f.name.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    );

    let mut binaries: Vec<&str> = deployed
        .functions
        .iter()
        .chain(&consumer.functions)
        .map(|f| f.binary.as_str())
        .collect();
    binaries.push(lambda::WORK_FUNCTION);
    if !args.no_build {
        phase(&format!("cargo build --bin {}", binaries.join(" --bin ")));
        lambda::build_functions(root, dir, &binaries)?;
    }
    lambda::start_emulator(setup.supervisor, &cargo_lambda, root, dir, emulator_port)?;
    eprintln!("    Lambda API     {emulator} (cargo lambda watch --only-lambda-apis)");
    eprintln!(
        "    function       {} x2 (Lambda work, the kit's stand-in)",
        lambda::WORK_FUNCTION
    );
    let (proxy, held_rx) = DelayProxy::start(
        &endpoint,
        WriteKind::Versioned,
        args.hold_for(),
        args.long_hold_for(),
    )
    .await?;
    eprintln!(
        "    delay proxy    {} (acquire Lambda -> DynamoDB)",
        proxy.endpoint()
    );
    let binary_dir = local_aws::server::target_dir(root).join("debug");
    lambda::start_work_function(
        setup.supervisor,
        &binary_dir,
        dir,
        emulator_port,
        &stack.region,
    )?;
    for function in &deployed.functions {
        let (instances, via) = match function.binary.as_str() {
            "acquire" => (args.acquire_instances, proxy.endpoint()),
            "release" => (4, endpoint.clone()),
            _ => (2, endpoint.clone()),
        };
        lambda::start_functions(
            setup.supervisor,
            &binary_dir,
            dir,
            function,
            instances,
            emulator_port,
            &via,
            &stack.region,
        )?;
        eprintln!(
            "    function       {} x{instances} ({}, AWS_ENDPOINT_URL {via})",
            function.name, function.binary
        );
    }
    for function in &consumer.functions {
        lambda::start_functions(
            setup.supervisor,
            &binary_dir,
            dir,
            function,
            2,
            emulator_port,
            &endpoint,
            &stack.region,
        )?;
        eprintln!(
            "    function       {} x2 ({}, the consumer's work)",
            function.name, function.binary
        );
    }
    let sdk = sdk_config_for(&endpoint, &stack.region);
    let sfn = Sfn::new(&sdk);

    phase(
        "preflight: Step Functions -> Lambda bridge -> emulator -> our Lambdas, answers and errors",
    );
    preflight(
        &sfn,
        &sweeper_machine.arn,
        &deployed.schedule.input,
        &cleanup_machine.arn,
        dir,
    )
    .await?;

    let item = LockItems {
        client: aws_sdk_dynamodb::Client::new(&sdk),
        table: deployed.table("SemaphoreTable")?.to_owned(),
        holdings_table: Some(deployed.table("HoldingsTable")?.to_owned()),
        layout: Layout::Versioned,
    };
    // Every lock of the run in the run's layout (`--layout`), as `semctl lock set --layout`
    // makes it, before anything takes it (the probes take the default lock too).
    if args.layout != semaphore_core::Layout::Item {
        let operator = semaphore_core::Semaphore::new(item.operator_store());
        for spec in &locks {
            operator
                .set_layout(&semaphore_core::LockName::new(&spec.name)?, args.layout)
                .await?;
        }
    }
    Ok((
        Stage {
            stack,
            locks,
            work_function,
            endpoint,
            protected,
            work_machine,
            runner_machine,
            cleanup_machine,
            sweeper_machine,
            consumer,
            consumer_machine,
            timing,
            proxy,
            sfn,
            item,
            sdk,
            deployed,
        },
        held_rx,
    ))
}

/// The semaphore stack's ProtectedStateMachinePrefix in the run: the consumer stack's machine
/// is named with it, and nothing else of the semaphore's stack changes for it.
pub(super) const CONSUMER_PREFIX: &str = "team-";

/// Checks, through the real machines, that a Lambda's answer and a Lambda's named error both
/// come back through the bridge as Step Functions expects: a sweep must succeed with the
/// sweeper's summary, and a cleanup of a non-event must fail with `SemaphoreInvalidInput` (its
/// Retry excludes that error). Either going wrong means the moto pin and the bridge disagree.
async fn preflight(
    sfn: &Sfn,
    sweeper: &str,
    sweep_input: &str,
    cleanup: &str,
    dir: &Path,
) -> anyhow::Result<()> {
    let hint = format!(
        "moto's Step Functions execution mode and local/moto_server.py's Lambda bridge are \
         written for the moto pinned in local/requirements.txt; see {}/moto-*.log and the \
         lambda-*.log files there",
        dir.display()
    );
    let sweep = start_execution(sfn, sweeper, "preflight", &sweep_input).await?;
    let bad = start_execution(sfn, cleanup, "preflight", &json!({"not": "an event"})).await?;
    let swept = wait_ended(sfn, &sweep, Duration::from_secs(120)).await?;
    let summary = swept.output_json();
    match &summary {
        s if swept.status == "SUCCEEDED" && s.get("reclaimed").is_some() => {
            eprintln!("    ok: a sweep succeeded with {s}");
        }
        _ => bail!("the preflight sweep went wrong: {swept:?}; {hint}"),
    }
    let refused = wait_ended(sfn, &bad, Duration::from_secs(120)).await?;
    ensure!(
        refused.status == "FAILED" && refused.error.as_deref() == Some("SemaphoreInvalidInput"),
        "the preflight cleanup of a non-event should fail with SemaphoreInvalidInput: \
         {refused:?}; {hint}"
    );
    eprintln!("    ok: a cleanup of a non-event failed with SemaphoreInvalidInput, not retried");
    Ok(())
}
