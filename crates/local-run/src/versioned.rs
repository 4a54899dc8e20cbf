//! The run of this project's semaphore: real state machines on moto's interpreter, real Lambda
//! binaries behind cargo lambda's emulator, deployed from template.yaml.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use aws_sdk_sfn::types::ExecutionStatus;
use serde_json::{json, Value};

use crate::driver::{self, LockItems, Setup, Watch};
use crate::emulator;
use crate::events::{Ended, Target};
use crate::line;
use crate::poller::Layout;
use crate::progress::{phase, Progress};
use crate::proxy::{DelayProxy, WriteKind};
use crate::report::{short, CleanupCounts, ExecutionCounts, Report, SweeperCounts};
use crate::stack::{Deployed, Stack};
use crate::{work, Role};
use local_aws::server::sdk_config_for;

/// Elements `"ab"` of the big-input probe's padding: 200,000 bytes of input (under
/// StartExecution's 262,144), 280,000 once escaped into the status event's `input` text.
const BIG_INPUT_ITEMS: usize = 40_000;

pub(crate) type Sfn = aws_sdk_sfn::Client;

pub(crate) fn sfn_error(e: impl std::error::Error + 'static) -> String {
    aws_sdk_sfn::error::DisplayErrorContext(e).to_string()
}

fn millis(t: Option<&aws_sdk_sfn::primitives::DateTime>) -> i64 {
    t.and_then(|t| t.to_millis().ok()).unwrap_or_default()
}

/// What DescribeExecution said about an ended execution.
#[derive(Debug, Clone)]
pub(crate) struct Outcome {
    pub status: String,
    pub error: Option<String>,
    pub cause: Option<String>,
    pub output: Option<String>,
}

/// Saves an execution's history next to the logs (for executions that did not go as planned).
pub(crate) async fn save_history(sfn: &Sfn, arn: &str, dir: &Path) -> String {
    let file = dir.join(format!("history-{}.json", short(arn)));
    let history = sfn
        .get_execution_history()
        .execution_arn(arn)
        .max_results(1000)
        .send()
        .await;
    let text = match history {
        Ok(h) => h
            .events()
            .iter()
            .map(|e| event_line(e).to_string())
            .collect::<Vec<_>>()
            .join("\n"),
        Err(e) => format!("GetExecutionHistory failed: {}", sfn_error(e)),
    };
    let _ = std::fs::write(&file, text);
    file.display().to_string()
}

/// One history event as a JSON line, with what tells why an execution went wrong: the SDK's
/// `Debug` redacts exactly those fields (inputs, outputs, parameters, errors, causes).
fn event_line(e: &aws_sdk_sfn::types::HistoryEvent) -> Value {
    let mut line = json!({
        "id": e.id(),
        "type": e.r#type().as_str(),
        "timestamp": e.timestamp().to_millis().unwrap_or_default(),
    });
    if let Some(d) = e.state_entered_event_details() {
        line["state"] = json!(d.name());
        line["input"] = json!(d.input());
    }
    if let Some(d) = e.state_exited_event_details() {
        line["state"] = json!(d.name());
        line["output"] = json!(d.output());
    }
    if let Some(d) = e.task_scheduled_event_details() {
        line["resource"] = json!(format!("{}:{}", d.resource_type(), d.resource()));
        line["parameters"] = json!(d.parameters());
    }
    if let Some(d) = e.task_submitted_event_details() {
        line["output"] = json!(d.output());
    }
    if let Some(d) = e.task_succeeded_event_details() {
        line["output"] = json!(d.output());
    }
    let errors = [
        e.task_failed_event_details()
            .map(|d| (d.error(), d.cause())),
        e.task_start_failed_event_details()
            .map(|d| (d.error(), d.cause())),
        e.task_submit_failed_event_details()
            .map(|d| (d.error(), d.cause())),
        e.task_timed_out_event_details()
            .map(|d| (d.error(), d.cause())),
        e.lambda_function_failed_event_details()
            .map(|d| (d.error(), d.cause())),
        e.execution_failed_event_details()
            .map(|d| (d.error(), d.cause())),
        e.execution_aborted_event_details()
            .map(|d| (d.error(), d.cause())),
    ];
    if let Some((error, cause)) = errors.into_iter().flatten().next() {
        line["error"] = json!(error);
        line["cause"] = json!(cause);
    }
    line
}

fn clip(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        return text.to_owned();
    }
    format!("{}...", text.chars().take(max).collect::<String>())
}

/// Every execution of a machine: (ARN, name, status).
pub(crate) async fn list_executions(
    sfn: &Sfn,
    machine: &str,
) -> Result<Vec<(String, String, ExecutionStatus)>, String> {
    let mut out = Vec::new();
    let mut token = None;
    loop {
        let page = sfn
            .list_executions()
            .state_machine_arn(machine)
            .max_results(1000)
            .set_next_token(token)
            .send()
            .await
            .map_err(sfn_error)?;
        for e in page.executions() {
            out.push((
                e.execution_arn().to_owned(),
                e.name().to_owned(),
                e.status().clone(),
            ));
        }
        token = page.next_token().map(str::to_owned);
        if token.is_none() {
            return Ok(out);
        }
    }
}

pub(crate) async fn describe(sfn: &Sfn, arn: &str) -> Result<(Ended, Outcome), String> {
    let d = sfn
        .describe_execution()
        .execution_arn(arn)
        .send()
        .await
        .map_err(sfn_error)?;
    let ended = Ended {
        arn: d.execution_arn().to_owned(),
        machine_arn: d.state_machine_arn().to_owned(),
        name: d.name().unwrap_or_default().to_owned(),
        status: d.status().as_str().to_owned(),
        start_ms: millis(Some(d.start_date())),
        stop_ms: millis(d.stop_date()),
        input: d.input().map(str::to_owned),
        error: d.error().map(str::to_owned),
        cause: d.cause().map(str::to_owned),
    };
    let outcome = Outcome {
        status: ended.status.clone(),
        error: ended.error.clone(),
        cause: ended.cause.clone(),
        output: d.output().map(str::to_owned),
    };
    Ok((ended, outcome))
}

/// Waits until the execution is no longer RUNNING.
pub(crate) async fn wait_ended(sfn: &Sfn, arn: &str, timeout: Duration) -> Result<Outcome, String> {
    let deadline = Instant::now() + timeout;
    loop {
        let (_, outcome) = describe(sfn, arn).await?;
        if outcome.status != "RUNNING" {
            return Ok(outcome);
        }
        if Instant::now() >= deadline {
            return Err(format!("{arn} still RUNNING after {} s", timeout.as_secs()));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

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
) -> Result<(), String> {
    let hint = format!(
        "moto's Step Functions execution mode and local/moto_server.py's Lambda bridge are \
         written for the moto pinned in local/requirements.txt; see {}/moto-*.log and the \
         lambda-*.log files there",
        dir.display()
    );
    let sweep = sfn
        .start_execution()
        .state_machine_arn(sweeper)
        .name("preflight")
        .input(sweep_input)
        .send()
        .await
        .map_err(sfn_error)?;
    let bad = sfn
        .start_execution()
        .state_machine_arn(cleanup)
        .name("preflight")
        .input(r#"{"not": "an event"}"#)
        .send()
        .await
        .map_err(sfn_error)?;
    let swept = wait_ended(sfn, sweep.execution_arn(), Duration::from_secs(120)).await?;
    let summary: Option<Value> = swept
        .output
        .as_deref()
        .and_then(|o| serde_json::from_str(o).ok());
    match &summary {
        Some(s) if swept.status == "SUCCEEDED" && s.get("reclaimed").is_some() => {
            eprintln!("    ok: a sweep succeeded with {s}");
        }
        _ => return Err(format!("the preflight sweep went wrong: {swept:?}; {hint}")),
    }
    let refused = wait_ended(sfn, bad.execution_arn(), Duration::from_secs(120)).await?;
    if refused.status == "FAILED" && refused.error.as_deref() == Some("SemaphoreInvalidInput") {
        eprintln!(
            "    ok: a cleanup of a non-event failed with SemaphoreInvalidInput, not retried"
        );
        Ok(())
    } else {
        Err(format!(
            "the preflight cleanup of a non-event should fail with SemaphoreInvalidInput: \
             {refused:?}; {hint}"
        ))
    }
}

/// Reads every notice from the queue until it stays empty.
async fn read_notices(sqs: &aws_sdk_sqs::Client, queue_url: &str) -> Vec<Value> {
    let mut notices = Vec::new();
    let mut empty_rounds = 0;
    while empty_rounds < 2 {
        let received = sqs
            .receive_message()
            .queue_url(queue_url)
            .max_number_of_messages(10)
            .wait_time_seconds(1)
            .send()
            .await;
        let Ok(received) = received else {
            empty_rounds += 1;
            continue;
        };
        let messages = received.messages();
        if messages.is_empty() {
            empty_rounds += 1;
            continue;
        }
        empty_rounds = 0;
        for m in messages {
            let envelope: Value = m
                .body()
                .and_then(|b| serde_json::from_str(b).ok())
                .unwrap_or(Value::Null);
            let notice = envelope["Message"]
                .as_str()
                .and_then(|s| serde_json::from_str(s).ok())
                .unwrap_or(envelope);
            notices.push(notice);
            if let Some(handle) = m.receipt_handle() {
                let _ = sqs
                    .delete_message()
                    .queue_url(queue_url)
                    .receipt_handle(handle)
                    .send()
                    .await;
            }
        }
    }
    notices
}

/// Lines of the acquire Lambda's logs that `matches` (one JSON object per line).
fn count_acquire_log_lines(dir: &Path, matches: impl Fn(&str) -> bool) -> usize {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with("lambda-acquire-")
        })
        .map(|e| {
            std::fs::read_to_string(e.path())
                .unwrap_or_default()
                .lines()
                .filter(|l| matches(l))
                .count()
        })
        .sum()
}

/// Acquires answered `SemaphoreFenced`: the handler's own warning, one per fenced answer.
fn count_fenced(dir: &Path) -> usize {
    count_acquire_log_lines(dir, |l| {
        l.contains(r#""level":"WARN""#) && l.contains(" is fenced: ")
    })
}

/// Acquires answered "expired": the handler's info line for its answer.
fn count_expired(dir: &Path) -> usize {
    count_acquire_log_lines(dir, |l| {
        l.contains(r#""message":"acquire""#) && l.contains(r#""outcome":"expired""#)
    })
}

pub async fn run(setup: &Setup<'_>) -> Result<Report, String> {
    let (args, root, dir, seed) = (setup.args, setup.root, setup.dir, setup.seed);
    let stack = Stack::default();
    let locks = args.locks()?;
    // The first lock is the template's default: its executions name no lock and no limit, so
    // the acquire function's defaults (DEFAULT_LOCK, DEFAULT_LIMIT) are what they take.
    // A Lambda function of the user's, allowed as work: served from this process.
    let work_function = format!(
        "arn:{}:lambda:{}:{}:function:{}",
        stack.partition,
        stack.region,
        stack.account,
        work::WORK_FUNCTION
    );
    let overrides = BTreeMap::from([
        ("LockName".to_owned(), locks[0].name.clone()),
        ("ConcurrencyLimit".to_owned(), locks[0].limit.to_string()),
        ("WorkFunctionArns".to_owned(), work_function.clone()),
        (
            "QueueFallbackSeconds".to_owned(),
            args.queue_fallback_seconds.to_string(),
        ),
        // No execution waits longer than the run: with a day's wait the acquire function would
        // lengthen a short fallback to keep a day of checks within the history quota.
        ("MaxWaitSeconds".to_owned(), args.timeout.to_string()),
    ]);
    phase("starting the local AWS on 127.0.0.1");
    let python = args
        .python
        .clone()
        .unwrap_or_else(|| root.join(".venv/bin/python"));
    let cargo_lambda = args
        .cargo_lambda
        .clone()
        .unwrap_or_else(|| root.join(".venv/bin/cargo-lambda"));
    let emulator_port = emulator::free_port()?;
    let emulator = format!("http://127.0.0.1:{emulator_port}");
    let endpoint = setup
        .supervisor
        .start_server(&python, dir, Some(&emulator))?;
    eprintln!("    moto server    {endpoint} (serialized; Step Functions execution mode on; Lambda invokes -> {emulator})");

    phase("deploying template.yaml: the SAM transform, then moto's CloudFormation");
    let deployed = Deployed::deploy(&python, root, &endpoint, &stack, &overrides)?;
    for (logical_id, table) in &deployed.tables {
        eprintln!("    table          {table} ({logical_id})");
    }
    for topic in &deployed.topics {
        eprintln!(
            "    topic          {} -> SQS (the notices read back)",
            short(topic)
        );
    }
    for machine in &deployed.machines {
        eprintln!(
            "    state machine  {} ({})",
            machine.name, machine.definition_uri
        );
    }
    for skipped in &deployed.skipped {
        eprintln!(
            "    not emulated   {} ({})",
            skipped.logical_id, skipped.kind
        );
    }
    let protected = deployed.machine("LockProtectedStateMachine")?.clone();
    // The work the executions run: the template's default work (the acquire function's
    // DEFAULT_WORK), the demo work.
    let work_machine = deployed.machine_named_by("DEFAULT_WORK")?.clone();
    // The machine that runs a Lambda function as the work.
    let runner_machine = deployed.machine_named_by("WORK_FUNCTION_RUNNER")?.clone();
    let cleanup_machine = deployed.rule_target()?.clone();
    let rule = deployed.rule.clone();
    let sweeper_machine = deployed.scheduled()?.clone();
    let schedule = deployed.schedule.clone();
    let timing = deployed.timing_seconds()?;

    let mut binaries: Vec<&str> = deployed
        .functions
        .iter()
        .map(|f| f.binary.as_str())
        .collect();
    binaries.push(work::WORK_FUNCTION);
    if !args.no_build {
        phase(&format!("cargo build --bin {}", binaries.join(" --bin ")));
        emulator::build_functions(root, dir, &binaries)?;
    }
    emulator::start_emulator(setup.supervisor, &cargo_lambda, root, dir, emulator_port)?;
    eprintln!("    Lambda API     {emulator} (cargo lambda watch --only-lambda-apis)");
    eprintln!(
        "    function       {} x2 (Lambda work, the kit's stand-in)",
        work::WORK_FUNCTION
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
    emulator::start_work_function(
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
        emulator::start_functions(
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
    let sdk = sdk_config_for(&endpoint, &stack.region);
    let sfn = Sfn::new(&sdk);

    phase(
        "preflight: Step Functions -> Lambda bridge -> emulator -> our Lambdas, answers and errors",
    );
    preflight(
        &sfn,
        &sweeper_machine.arn,
        &schedule.input,
        &cleanup_machine.arn,
        dir,
    )
    .await?;

    let item = LockItems {
        ddb: aws_sdk_dynamodb::Client::new(&sdk),
        table: deployed.table("SemaphoreTable")?.to_owned(),
        locks: locks.clone(),
        layout: Layout::Versioned,
    };
    phase(
        "probes: one uncontended critical section, the redrive guard, stopping the parent, the \
         test runner, your workflow",
    );
    let transitions = work::count_transitions(&sfn, &protected, &work_machine, dir).await?;
    eprintln!(
        "    ok: one critical section entered {} states of {} and {} of {}",
        transitions.protected.len(),
        protected.name,
        transitions.work.len(),
        work_machine.name
    );
    let redrive = work::redrive_guard(
        &sfn,
        &endpoint,
        &protected,
        &work_machine,
        &item,
        &locks[0].name,
    )
    .await?;
    eprintln!(
        "    {}: an execution whose child name was taken ended {} {}",
        if redrive.ok { "ok" } else { "NOT OK" },
        redrive.status,
        redrive.error.as_deref().unwrap_or("")
    );
    let misconfigured = work::misconfigured_caller(&sfn, &protected, &item).await?;
    eprintln!(
        "    {}: a machine the stack does not protect ended {} {}",
        if misconfigured.ok { "ok" } else { "NOT OK" },
        misconfigured.status,
        misconfigured.error.as_deref().unwrap_or("")
    );
    let history_probe =
        work::long_wait_with_a_big_input(&sfn, &protected, args.queue_fallback_seconds, dir)
            .await?;
    eprintln!(
        "    {}: an input of {} bytes waited through {} fallback checks ({:?} events each: {}) \
         and ended {}; {} events in all; task parameters, bytes: {:?}",
        if history_probe.status == "SUCCEEDED" {
            "ok"
        } else {
            "NOT OK"
        },
        history_probe.input_bytes,
        history_probe.events_per_fallback_check.len(),
        history_probe.events_per_fallback_check,
        history_probe.fallback_check_event_types.join(", "),
        history_probe.status,
        history_probe.events,
        history_probe.task_parameters_bytes
    );
    let mut stop_probes = Vec::new();
    for probe in [
        work::StopParent {
            protected: &protected,
            child_machine: &work_machine,
            cleanup: &cleanup_machine,
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
        work::StopParent {
            protected: &protected,
            child_machine: &work_machine,
            cleanup: &cleanup_machine,
            transformer: rule.transformer.as_ref(),
            input: json!({"work_seconds": 60, "pad": vec!["ab"; BIG_INPUT_ITEMS]}),
            name: "probe-stop-parent-big-input",
            work: "state machine (a ~200 KB input)",
            expect_stopped: true,
        },
        work::StopParent {
            protected: &protected,
            child_machine: &runner_machine,
            cleanup: &cleanup_machine,
            transformer: rule.transformer.as_ref(),
            input: json!({"work": work_function, "work_seconds": 6}),
            name: "probe-stop-parent-lambda-work",
            work: "Lambda function",
            expect_stopped: false,
        },
    ] {
        let stopped = work::stop_the_parent(&sfn, probe, &item, &locks[0].name, &stack).await?;
        eprintln!(
            "    {}: {} work: its child ended {} {} ms after the stop, the slot freed {:?} ms \
             after the child ended (cleanup waited {} times)",
            if stopped.ok { "ok" } else { "NOT OK" },
            stopped.work,
            stopped.child_status,
            stopped.child_ended_after_stop_ms,
            stopped.freed_after_child_ms,
            stopped.cleanup_waits
        );
        stop_probes.push(stopped);
    }
    let test_runner = deployed.machine("TestRunnerStateMachine")?;
    let (test_runner_ok, test_runner_run) = work::run_test_runner(&sfn, test_runner).await?;
    eprintln!(
        "    {}: {}: {test_runner_run}",
        if test_runner_ok { "ok" } else { "NOT OK" },
        test_runner.name
    );
    let example = deployed.machine("YourWorkflowExampleStateMachine")?;
    let (example_ok, example_run) = work::run_your_workflow_example(&sfn, example, &item).await?;
    eprintln!(
        "    {}: {}: {example_run}",
        if example_ok { "ok" } else { "NOT OK" },
        example.name
    );

    // The run's plan.
    let executions = driver::plan_executions(setup, &stack, &protected.name, &locks, &proxy);
    let n = executions.len();
    let planned_arns: BTreeSet<String> = executions.iter().map(|e| e.arn.clone()).collect();
    let target = Target::StateMachine {
        client: sfn.clone(),
        arn: cleanup_machine.arn.clone(),
        transformer: rule.transformer.clone(),
    };
    let pattern = Some(rule.pattern.clone());
    let (watch, ended_tx) = Watch::start(setup, &stack, item, proxy, pattern, target);

    // A stop is a StopExecution, as an operator's would be.
    let stopped: Arc<Mutex<BTreeMap<String, Role>>> = Arc::default();
    {
        let (sfn, stopped) = (sfn.clone(), stopped.clone());
        let role_of = executions.iter().map(|e| (e.arn.clone(), e.role)).collect();
        watch.spawn_stopper(held_rx, role_of, seed, move |arn, role, delay| {
            if stopped
                .lock()
                .expect("stopped")
                .insert(arn.clone(), role)
                .is_some()
            {
                return;
            }
            let sfn = sfn.clone();
            tokio::spawn(async move {
                tokio::time::sleep(delay).await;
                if let Err(e) = sfn
                    .stop_execution()
                    .execution_arn(&arn)
                    .error("LocalRun.Chaos")
                    .cause(format!("{role:?}"))
                    .send()
                    .await
                {
                    eprintln!("StopExecution {arn}: {}", sfn_error(e));
                }
            });
        });
    }

    // The schedule, compressed.
    let sweep_every = Duration::from_secs_f64(args.sweep_every);
    let sweeping = Arc::new(std::sync::atomic::AtomicBool::new(true));
    {
        let (sfn, sweeping, arn, input) = (
            sfn.clone(),
            sweeping.clone(),
            sweeper_machine.arn.clone(),
            schedule.input.clone(),
        );
        tokio::spawn(async move {
            let mut n = 0u32;
            loop {
                tokio::time::sleep(sweep_every).await;
                if !sweeping.load(std::sync::atomic::Ordering::SeqCst) {
                    break;
                }
                n += 1;
                let _ = sfn
                    .start_execution()
                    .state_machine_arn(&arn)
                    .name(format!("sweep-{n:04}"))
                    .input(&input)
                    .send()
                    .await;
            }
        });
    }

    let planned = |role| executions.iter().filter(|e| e.role == role).count();
    let spread: Vec<String> = locks
        .iter()
        .enumerate()
        .map(|(i, l)| {
            let on = executions.iter().filter(|e| e.lock == i).count();
            format!("{on} on {} (limit {})", l.name, l.limit)
        })
        .collect();
    let mut asked = Vec::new();
    if !args.weights.is_empty() {
        asked.push(format!("weights drawn from {:?}", args.weights));
    }
    if let Some(rate) = args.rate {
        asked.push(format!("at most {rate} starts/s"));
    }
    let terms = if asked.is_empty() {
        String::new()
    } else {
        format!("; {}", asked.join(", "))
    };
    phase(&format!(
        "starting {n} executions of {} ({}{terms}; {} as work, {} s each; {} fail, {} stopped \
         mid-acquire, {} stopped mid-work)",
        protected.name,
        spread.join(", "),
        work_machine.name,
        args.work_seconds,
        planned(Role::Fail),
        planned(Role::StopMidAcquire),
        planned(Role::StopMidWork),
    ));
    // Started in the background, so that the watcher below plays each status event as soon as
    // its execution ends (starting 100 executions on moto takes several seconds).
    let started = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let start_error: Arc<Mutex<Option<String>>> = Arc::default();
    {
        let (sfn, machine, started, start_error) = (
            sfn.clone(),
            protected.arn.clone(),
            started.clone(),
            start_error.clone(),
        );
        let inputs: Vec<(String, String)> = executions
            .iter()
            .map(|e| {
                // What the demo work reads; the semaphore reads lock and limit. An execution
                // to be stopped mid-work works long, so that its child still runs when it is
                // stopped: the cleanup must stop the child before it frees the slot (or a
                // sweep must wait for it, when the event was dropped).
                let work_seconds = if e.role == Role::StopMidWork {
                    (args.work_seconds * 5).max(10)
                } else {
                    args.work_seconds
                };
                let mut input = json!({"work_seconds": work_seconds, "fail": e.role == Role::Fail});
                if e.lock > 0 {
                    input["lock"] = json!(locks[e.lock].name);
                    input["limit"] = json!(locks[e.lock].limit);
                }
                if let Some(weight) = e.weight {
                    input["weight"] = json!(weight);
                }
                if let Some(rate) = args.rate {
                    input["rate"] = json!(rate);
                }
                (e.name.clone(), input.to_string())
            })
            .collect();
        tokio::spawn(async move {
            for (name, input) in inputs {
                let result = sfn
                    .start_execution()
                    .state_machine_arn(&machine)
                    .name(&name)
                    .input(input)
                    .send()
                    .await;
                if let Err(e) = result {
                    *start_error.lock().expect("start error") =
                        Some(format!("StartExecution {name}: {}", sfn_error(e)));
                    return;
                }
                started.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }
        });
    }

    // Slots reclaimed by the sweeper so far, from the sweeps' answers (for the live view).
    let reclaimed_live = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    {
        let (sfn, arn, reclaimed, sweeping) = (
            sfn.clone(),
            sweeper_machine.arn.clone(),
            reclaimed_live.clone(),
            sweeping.clone(),
        );
        tokio::spawn(async move {
            let mut counted = BTreeSet::new();
            while sweeping.load(std::sync::atomic::Ordering::SeqCst) {
                tokio::time::sleep(Duration::from_secs(2)).await;
                let Ok(sweeps) = list_executions(&sfn, &arn).await else {
                    continue;
                };
                for (arn, name, status) in sweeps {
                    if status != ExecutionStatus::Succeeded
                        || name == "preflight"
                        || !counted.insert(arn.clone())
                    {
                        continue;
                    }
                    if let Ok((_, o)) = describe(&sfn, &arn).await {
                        let n = o
                            .output
                            .as_deref()
                            .and_then(|s| serde_json::from_str::<Value>(s).ok())
                            .and_then(|v| v["reclaimed"].as_u64())
                            .unwrap_or(0);
                        reclaimed.fetch_add(n as usize, std::sync::atomic::Ordering::SeqCst);
                    }
                }
            }
        });
    }

    let outcomes: Arc<Mutex<BTreeMap<String, Outcome>>> = Arc::default();
    let progress = {
        let (outcomes, poll, proxy, events, reclaimed, started) = (
            outcomes.clone(),
            watch.poller.stats.clone(),
            watch.proxy.clone(),
            watch.player.stats.clone(),
            reclaimed_live.clone(),
            started.clone(),
        );
        let locks = locks.clone();
        let weighted = !args.weights.is_empty();
        Progress::start(move || {
            let done = outcomes.lock().expect("outcomes").len();
            let started = started.load(std::sync::atomic::Ordering::SeqCst);
            let starting = if started < n {
                format!("started {started}/{n} | ")
            } else {
                String::new()
            };
            let poll = poll.lock().expect("poll").clone();
            let proxy = proxy.stats();
            let events = events.lock().expect("events").clone();
            let holders: Vec<String> = locks
                .iter()
                .map(|l| {
                    let seen = poll.lock(&l.name);
                    format!(
                        "{} {} (max {}/{}{})",
                        l.name,
                        seen.holders_now,
                        seen.max_holders,
                        l.limit,
                        if weighted {
                            format!(", weight {}", seen.max_weight)
                        } else {
                            String::new()
                        }
                    )
                })
                .collect();
            format!(
                "{starting}done {done}/{n} | holders {} | reclaimed by sweeper {} | delayed \
                 writes refused {} | events {} dropped {} dup {} late",
                holders.join(", "),
                reclaimed.load(std::sync::atomic::Ordering::SeqCst),
                proxy.refused(),
                events.dropped,
                events.duplicated,
                events.late
            )
        })
    };

    // Watch the executions end; each ended one is an event for the player.
    let deadline = Instant::now() + Duration::from_secs(args.timeout);
    let mut timed_out = false;
    loop {
        let failed_start = start_error.lock().expect("start error").clone();
        if let Some(e) = failed_start {
            progress.finish().await;
            return Err(e);
        }
        if let Some((name, status, log)) = setup.supervisor.exited() {
            progress.finish().await;
            return Err(format!(
                "{name} exited ({status}); see {}:\n{}",
                log.display(),
                local_aws::server::tail(&log, 20)
            ));
        }
        let listed = list_executions(&sfn, &protected.arn).await?;
        for (arn, _, status) in listed {
            // The probes' executions are not the run's (their status events are not played).
            if status == ExecutionStatus::Running
                || !planned_arns.contains(&arn)
                || outcomes.lock().expect("outcomes").contains_key(&arn)
            {
                continue;
            }
            let (ended, outcome) = describe(&sfn, &arn).await?;
            outcomes.lock().expect("outcomes").insert(arn, outcome);
            let _ = ended_tx.send(ended);
        }
        if outcomes.lock().expect("outcomes").len() >= n {
            break;
        }
        if Instant::now() >= deadline {
            timed_out = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(400)).await;
    }
    let holders_when_all_ended = watch.holders_after_the_last_write().await;
    progress.note(&format!(
        "==> all executions ended{}; settling: late events, held writes, cleanups",
        if timed_out { " or timed out" } else { "" }
    ));

    // Settle: the cleanups the last deliveries started have to end too, and the children of
    // stopped executions (a cleanup waits for them, or a sweep, whose event was dropped).
    let (sfn_ref, cleanup_arn, work_arn) = (
        &sfn,
        cleanup_machine.arn.as_str(),
        work_machine.arn.as_str(),
    );
    let cleanups_settled = move || async move {
        Ok(!work::any_running(sfn_ref, cleanup_arn).await?
            && !work::any_running(sfn_ref, work_arn).await?)
    };
    watch
        .settle(
            args,
            Duration::from_secs(60),
            Duration::from_millis(300),
            cleanups_settled,
        )
        .await?;

    // The final sweep, after the schedule's last one.
    sweeping.store(false, std::sync::atomic::Ordering::SeqCst);
    let sweep_deadline = Instant::now() + Duration::from_secs(120);
    while list_executions(&sfn, &sweeper_machine.arn)
        .await?
        .iter()
        .any(|(_, _, s)| *s == ExecutionStatus::Running)
        && Instant::now() < sweep_deadline
    {
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    progress.note("==> final sweep");
    let final_sweep = sfn
        .start_execution()
        .state_machine_arn(&sweeper_machine.arn)
        .name("sweep-final")
        .input(&schedule.input)
        .send()
        .await
        .map_err(sfn_error)?;
    wait_ended(&sfn, final_sweep.execution_arn(), Duration::from_secs(120)).await?;

    // Gather.
    let mut report = watch
        .finish(progress, setup, &executions, &holders_when_all_ended)
        .await?;
    let outcomes = outcomes.lock().expect("outcomes").clone();
    let stopped = stopped.lock().expect("stopped").clone();
    let mut counts = ExecutionCounts {
        total: n,
        ..ExecutionCounts::default()
    };
    // Fencing tokens are a lock's versions: distinct per lock.
    let mut tokens: Vec<Vec<u64>> = vec![Vec::new(); locks.len()];
    for e in &executions {
        let (arn, name, role) = (&e.arn, &e.name, &e.role);
        let Some(o) = outcomes.get(arn) else {
            counts.unexpected += 1;
            counts
                .unexpected_examples
                .push(format!("{name}: still RUNNING at the timeout"));
            continue;
        };
        let was_stopped = stopped.contains_key(arn);
        let output = o
            .output
            .as_deref()
            .and_then(|s| serde_json::from_str::<Value>(s).ok())
            .unwrap_or(Value::Null);
        let lock = &locks[e.lock].name;
        // A success must name the lock it was planned to take: the default taken from the
        // template, or the one its input named.
        let wrong_lock = o.status == "SUCCEEDED" && output["lock"].as_str() != Some(lock.as_str());
        if !wrong_lock && counts.count_planned(*role, &o.status, o.error.as_deref(), was_stopped) {
            if o.status == "SUCCEEDED" {
                report.locks[e.lock].succeeded += 1;
                tokens[e.lock].extend(output["fencing_token"].as_u64());
            }
        } else {
            if wrong_lock {
                counts.unexpected += 1;
            }
            let history = save_history(&sfn, arn, dir).await;
            counts.unexpected_examples.push(format!(
                "{name} ({role:?}): {} {}{}: {} [history: {history}]",
                o.status,
                o.error.as_deref().unwrap_or(""),
                if was_stopped { " (stopped)" } else { "" },
                clip(o.cause.as_deref().unwrap_or(""), 300)
            ));
        }
    }
    report.executions = counts;
    for (l, tokens) in report.locks.iter_mut().zip(&tokens) {
        let distinct: BTreeSet<u64> = tokens.iter().copied().collect();
        l.fencing_tokens_unique =
            Some(distinct.len() == tokens.len() && tokens.len() == l.succeeded);
    }
    report.fenced_answers_in_logs = count_fenced(dir);
    report.expired_answers_in_logs = count_expired(dir);
    report.timing_seconds = Some(timing);

    // When each execution's first cleanup finished, to check that no read after it saw the
    // execution holding a slot (S3).
    let mut cleanup = CleanupCounts::default();
    let mut cleaned_at: BTreeMap<String, i64> = BTreeMap::new();
    for (arn, name, status) in list_executions(&sfn, &cleanup_machine.arn).await? {
        if name == "preflight" {
            continue;
        }
        cleanup.started += 1;
        match status {
            ExecutionStatus::Succeeded => {
                cleanup.succeeded += 1;
                let d = sfn
                    .describe_execution()
                    .execution_arn(&arn)
                    .send()
                    .await
                    .map_err(sfn_error)?;
                let event: Value = d
                    .input()
                    .and_then(|i| serde_json::from_str(i).ok())
                    .unwrap_or(Value::Null);
                if let Some(target) = event["detail"]["executionArn"].as_str() {
                    let stop = millis(d.stop_date());
                    let entry = cleaned_at.entry(target.to_owned()).or_insert(stop);
                    *entry = (*entry).min(stop);
                }
            }
            ExecutionStatus::Running => {}
            _ => {
                cleanup.failed += 1;
                let (_, o) = describe(&sfn, &arn).await?;
                let history = save_history(&sfn, &arn, dir).await;
                cleanup.failures.push(format!(
                    "{}: {} {}: {} [history: {history}]",
                    short(&arn),
                    o.status,
                    o.error.as_deref().unwrap_or(""),
                    clip(o.cause.as_deref().unwrap_or(""), 300)
                ));
            }
        }
    }
    report.cleanup_executions = cleanup;
    // A read sent 50 ms after the cleanup's end (moto stamps the end after the Lambda answered).
    let resurrections: Vec<String> = cleaned_at
        .iter()
        .filter_map(|(arn, cleaned)| {
            let seen = *report.poller.last_seen_ms.get(arn)?;
            (seen > cleaned + 50).then(|| format!("{} ({} ms after)", short(arn), seen - cleaned))
        })
        .collect();

    let mut sweeper = SweeperCounts {
        schedule: schedule.expression.clone(),
        every_seconds: args.sweep_every,
        ..SweeperCounts::default()
    };
    for (arn, name, status) in list_executions(&sfn, &sweeper_machine.arn).await? {
        if name == "preflight" {
            continue;
        }
        sweeper.sweeps += 1;
        if status != ExecutionStatus::Succeeded {
            sweeper.failed_sweeps += 1;
            continue;
        }
        let (ended, o) = describe(&sfn, &arn).await?;
        sweeper.started_ms.push(ended.start_ms);
        let summary: Value = o
            .output
            .as_deref()
            .and_then(|s| serde_json::from_str(s).ok())
            .unwrap_or(Value::Null);
        sweeper.reclaimed += summary["reclaimed"].as_u64().unwrap_or(0) as usize;
    }
    let sqs = aws_sdk_sqs::Client::new(&sdk);
    let notices = read_notices(&sqs, &deployed.notice_queue_url).await;
    sweeper.notices_read_back = notices.len();
    sweeper.notices = notices
        .iter()
        .map(|n| {
            format!(
                "{} held a slot of \"{}\" for {}: reclaimed, {}",
                short(n["holder"].as_str().unwrap_or("?")),
                n["lock"].as_str().unwrap_or("?"),
                n["held_for"].as_str().unwrap_or("?"),
                n["reason"].as_str().unwrap_or("?")
            )
        })
        .collect();
    let (reclaimed, read_back) = (sweeper.reclaimed, sweeper.notices_read_back);
    let swept: BTreeSet<String> = notices
        .iter()
        .filter_map(|n| n["holder"].as_str().map(str::to_owned))
        .collect();
    report.sweeper = Some(sweeper);

    // The work: every child of the run's executions against its parent's slot.
    let children = work::children(&sfn, &work_machine.arn).await?;
    let parent_status: BTreeMap<String, String> = outcomes
        .iter()
        .map(|(arn, o)| (arn.clone(), o.status.clone()))
        .collect();
    let work_report = work::report(
        &work_machine,
        &children,
        &executions,
        &locks,
        &stopped,
        &parent_status,
        &report.poller,
        &swept,
    );
    report.work = Some(work_report.clone());
    report.redrive_guard = Some(redrive.clone());
    report.misconfigured_caller = Some(misconfigured.clone());
    report.stopped_parent_probes = stop_probes.clone();
    report.test_runner = Some(test_runner_run.clone());
    report.your_workflow_example = Some(example_run.clone());
    report.transitions = Some(transitions);
    report.history_probe = Some(history_probe.clone());

    // The line: every execution's history, and the functions' hand-off log lines.
    let mut traces = Vec::with_capacity(executions.len());
    for e in &executions {
        let events = history(&sfn, &e.arn).await?;
        let output = outcomes
            .get(&e.arn)
            .and_then(|o| o.output.as_deref())
            .and_then(|s| serde_json::from_str::<Value>(s).ok());
        traces.push(line::trace(&e.arn, e.lock, &events, output.as_ref()));
    }
    let line_report = line::report(&traces, dir);
    for arn in line_report.unexplained.iter().take(3) {
        save_history(&sfn, arn, dir).await;
    }
    report.line = Some(line_report.clone());

    // The invariants, per lock first.
    for l in report.locks.clone() {
        report.check(
            &format!("S1 safety [{}]", l.lock),
            l.max_holders <= l.limit && l.max_weight <= l.limit as u64 && l.inconsistent_reads == 0,
            format!(
                "at most {} holders and weight {} of {} held at once over {} reads; every read \
                 consistent (format 4, used = the sum of the holders' weights <= the limit, \
                 held_bytes = their entries' bytes, each holder's token distinct and within \
                 the version){}",
                l.max_holders,
                l.max_weight,
                l.limit,
                l.reads,
                l.first_inconsistency
                    .as_ref()
                    .map(|m| format!(" EXCEPT: {m}"))
                    .unwrap_or_default()
            ),
        );
        if let Some(r) = &l.rate {
            report.check(
                &format!("start rate [{}]", l.lock),
                r.ok() && r.starts > 0,
                format!(
                    "{} starts at {}/s (spacing {} ms): at most {} in any 1 s (<= {:.0}), {} in \
                     any 10 s (<= {:.0}), least spacing {} (>= {} ms); achieved {}",
                    r.starts,
                    r.rate_per_s,
                    r.spacing_ms,
                    r.max_in_1s,
                    r.bound(1.0),
                    r.max_in_10s,
                    r.bound(10.0),
                    r.min_spacing_ms
                        .map_or("-".to_owned(), |ms| format!("{ms} ms")),
                    r.spacing_ms,
                    r.achieved_per_s
                        .map_or("-".to_owned(), |a| format!("{a:.2}/s"))
                ),
            );
        }
        report.check(
            &format!("S2 no leak [{}]", l.lock),
            l.leaked_at_end == 0,
            format!(
                "{} slots held at the end, after the final sweep",
                l.leaked_at_end
            ),
        );
        report.check(
            &format!("fencing tokens [{}]", l.lock),
            l.fencing_tokens_unique == Some(true),
            format!(
                "each of its {} succeeded executions returned a distinct fencing token",
                l.succeeded
            ),
        );
    }
    report.check(
        "S1 work under the slot",
        work_report.violations.is_empty() && work_report.children > 0,
        format!(
            "{} of {} child executions ended while their parent held its slot; {} parents \
             stopped mid-work: {} children stopped before the slot was freed, {} ended first",
            work_report.ended_under_the_slot,
            work_report.children,
            work_report.stopped_parents.len(),
            work_report.children_stopped,
            work_report.children_ended_on_their_own
        ),
    );
    report.check(
        "S1 stopping the parent",
        stop_probes.iter().all(|p| p.ok),
        stop_probes
            .iter()
            .map(|p| {
                format!(
                    "{} work: child {} {}, slot freed {}",
                    p.work,
                    if p.child_status == "ABORTED" {
                        "stopped by the cleanup"
                    } else {
                        "waited for by the cleanup"
                    },
                    p.child_status,
                    p.freed_after_child_ms
                        .map(|ms| format!("{ms} ms after it ended"))
                        .unwrap_or_else(|| "never".to_owned())
                )
            })
            .collect::<Vec<_>>()
            .join("; "),
    );
    let per_check = lambda_common::EVENTS_PER_FALLBACK_CHECK as usize;
    report.check(
        "F9 history and payload quotas",
        history_probe.status == "SUCCEEDED"
            && history_probe.events_per_fallback_check.len() >= 2
            && history_probe
                .events_per_fallback_check
                .iter()
                .all(|n| *n <= per_check)
            && history_probe.events_outside_checks as u64 <= lambda_common::HISTORY_RESERVE
            && history_probe.largest_task_parameters_bytes <= 256 * 1024
            && history_probe.failing_error.as_deref() == Some("WorkFailed"),
        format!(
            "an execution with an input of {} bytes waited through {} fallback checks of {:?} \
             events (the acquire function's bound assumes at most {per_check}), {} events \
             outside them (at most {} reserved), and ended {}{}; its largest task parameters \
             were {} bytes ({}; the local server fails a task past 262,144); one whose work \
             failed ended {} {:?} (expected the work's own WorkFailed)",
            history_probe.input_bytes,
            history_probe.events_per_fallback_check.len(),
            history_probe.events_per_fallback_check,
            history_probe.events_outside_checks,
            lambda_common::HISTORY_RESERVE,
            history_probe.status,
            history_probe
                .error
                .as_ref()
                .map(|e| format!(" {e}: {}", history_probe.cause.as_deref().unwrap_or("")))
                .unwrap_or_default(),
            history_probe.largest_task_parameters_bytes,
            history_probe.largest_task_parameters_state,
            history_probe.failing_status,
            history_probe.failing_error
        ),
    );
    report.check(
        "test runner",
        test_runner_ok,
        format!(
            "its lock-protected executions ran the demo work with their {{work_seconds, fail}} \
             input: {test_runner_run}"
        ),
    );
    report.check(
        "your workflow",
        example_ok,
        format!("the README's fragment, deployed as it is: {example_run}"),
    );
    report.check(
        "F12 not protected",
        misconfigured.ok,
        format!(
            "an execution of a machine not in ProtectedStateMachineArns that asked for a slot \
             ended {} {}, its lock {}",
            misconfigured.status,
            misconfigured.error.as_deref().unwrap_or("(no error)"),
            if misconfigured.lock_written {
                "written"
            } else {
                "untouched"
            }
        ),
    );
    report.check(
        "F7 redrive guard",
        redrive.ok,
        format!(
            "an execution that met its child's name already taken ended {} {} and held no slot \
             ({} held after){}",
            redrive.status,
            redrive.error.as_deref().unwrap_or("(no error)"),
            redrive.held_after,
            if redrive.ok {
                String::new()
            } else {
                format!(": {}", clip(redrive.cause.as_deref().unwrap_or(""), 300))
            }
        ),
    );
    report.check(
        "L1 progress",
        report.executions.unexpected == 0 && !timed_out,
        format!(
            "{} of {n} executions ended as planned{}",
            n - report.executions.unexpected,
            if timed_out {
                " (TIMED OUT waiting)"
            } else {
                ""
            }
        ),
    );
    report.check(
        "cleanups",
        report.cleanup_executions.failed == 0,
        format!(
            "{} of {} cleanup executions succeeded (a failure would raise the template's \
             CleanupFailuresAlarm)",
            report.cleanup_executions.succeeded, report.cleanup_executions.started
        ),
    );
    report.check(
        "sweeper notices",
        reclaimed == read_back
            && report
                .sweeper
                .as_ref()
                .is_some_and(|s| s.failed_sweeps == 0),
        format!("{reclaimed} slots reclaimed, {read_back} notices read back from the topic"),
    );
    report.check(
        "S3 no resurrection",
        resurrections.is_empty(),
        if resurrections.is_empty() {
            format!(
                "no execution was seen holding a slot after its cleanup had finished ({} \
                 cleaned up; delayed acquire writes: {} refused by a fence, {} by the horizon)",
                cleaned_at.len(),
                report.delayed_acquire_writes.refused_by_fence,
                report.delayed_acquire_writes.refused_by_horizon
            )
        } else {
            format!(
                "seen holding after their cleanup: {}",
                resurrections.join(", ")
            )
        },
    );
    report.check(
        "L2 fairness",
        line_report.order_violations == 0 && line_report.newcomers_passing == 0,
        format!(
            "{} waiters granted in line order ({} pairs both in line checked by fencing token: \
             {} granted out of order; {} newcomers passed the line){}",
            line_report.waiters_granted,
            line_report.pairs_checked,
            line_report.order_violations,
            line_report.newcomers_passing,
            if line_report.violation_examples.is_empty() {
                String::new()
            } else {
                format!(": {}", line_report.violation_examples.join("; "))
            }
        ),
    );
    report.finish();
    Ok(report)
}

/// Every event of an execution's history, oldest first.
pub(crate) async fn history(
    sfn: &Sfn,
    arn: &str,
) -> Result<Vec<aws_sdk_sfn::types::HistoryEvent>, String> {
    sfn.get_execution_history()
        .execution_arn(arn)
        .max_results(1000)
        .into_paginator()
        .items()
        .send()
        .collect::<Result<Vec<_>, _>>()
        .await
        .map_err(sfn_error)
}
