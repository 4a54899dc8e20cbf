//! The run of this project's semaphore: real state machines on moto's interpreter, real Lambda
//! binaries behind cargo lambda's emulator, deployed from template.yaml.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use aws_sdk_sfn::types::ExecutionStatus;
use serde_json::{json, Value};

use crate::driver::{self, LockItem, Setup, Watch};
use crate::events::{Ended, Target};
use crate::local_aws::{self, sdk_config};
use crate::poller::Layout;
use crate::progress::{phase, Progress};
use crate::proxy::{DelayProxy, WriteKind};
use crate::report::{short, CleanupCounts, ExecutionCounts, Report, SweeperCounts};
use crate::template::{Plan, Stack, Template};
use crate::Role;

type Sfn = aws_sdk_sfn::Client;

fn sfn_error(e: impl std::error::Error + 'static) -> String {
    aws_sdk_sfn::error::DisplayErrorContext(e).to_string()
}

fn millis(t: Option<&aws_sdk_sfn::primitives::DateTime>) -> i64 {
    t.and_then(|t| t.to_millis().ok()).unwrap_or_default()
}

/// What DescribeExecution said about an ended execution.
#[derive(Debug, Clone)]
struct Outcome {
    status: String,
    error: Option<String>,
    cause: Option<String>,
    output: Option<String>,
}

/// Saves an execution's history next to the logs (for executions that did not go as planned).
async fn save_history(sfn: &Sfn, arn: &str, dir: &Path) -> String {
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
            .map(|e| format!("{e:?}"))
            .collect::<Vec<_>>()
            .join("\n"),
        Err(e) => format!("GetExecutionHistory failed: {}", sfn_error(e)),
    };
    let _ = std::fs::write(&file, text);
    file.display().to_string()
}

fn clip(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        return text.to_owned();
    }
    format!("{}...", text.chars().take(max).collect::<String>())
}

/// Every execution of a machine: (ARN, name, status).
async fn list_executions(
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

async fn describe(sfn: &Sfn, arn: &str) -> Result<(Ended, Outcome), String> {
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
async fn wait_ended(sfn: &Sfn, arn: &str, timeout: Duration) -> Result<Outcome, String> {
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
         written for the moto pinned in local/requirements.txt; see {}/moto.log and the \
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

struct Deployed {
    queue_url: String,
}

async fn deploy(plan: &Plan, sdk: &aws_config::SdkConfig) -> Result<Deployed, String> {
    let t = &plan.table;
    driver::create_table(&aws_sdk_dynamodb::Client::new(sdk), t).await?;
    eprintln!("    table          {} (key {:?})", t.name, t.key_schema);

    let sns = aws_sdk_sns::Client::new(sdk);
    let sqs = aws_sdk_sqs::Client::new(sdk);
    let queue = sqs
        .create_queue()
        .queue_name(format!("{}-notices", plan.stack.name))
        .send()
        .await
        .map_err(|e| {
            format!(
                "CreateQueue: {}",
                aws_sdk_sqs::error::DisplayErrorContext(e)
            )
        })?;
    let queue_url = queue.queue_url().unwrap_or_default().to_owned();
    let attributes = sqs
        .get_queue_attributes()
        .queue_url(&queue_url)
        .attribute_names(aws_sdk_sqs::types::QueueAttributeName::QueueArn)
        .send()
        .await
        .map_err(|e| {
            format!(
                "GetQueueAttributes: {}",
                aws_sdk_sqs::error::DisplayErrorContext(e)
            )
        })?;
    let queue_arn = attributes
        .attributes()
        .and_then(|a| a.get(&aws_sdk_sqs::types::QueueAttributeName::QueueArn))
        .cloned()
        .ok_or("the queue has no ARN")?;
    for topic in &plan.topics {
        let created = sns
            .create_topic()
            .name(&topic.name)
            .send()
            .await
            .map_err(|e| {
                format!(
                    "CreateTopic {}: {}",
                    topic.name,
                    aws_sdk_sns::error::DisplayErrorContext(e)
                )
            })?;
        if created.topic_arn() != Some(topic.arn.as_str()) {
            return Err(format!(
                "topic {} was created as {:?}, not the {} the template resolves to",
                topic.logical_id,
                created.topic_arn(),
                topic.arn
            ));
        }
        sns.subscribe()
            .topic_arn(&topic.arn)
            .protocol("sqs")
            .endpoint(&queue_arn)
            .send()
            .await
            .map_err(|e| format!("Subscribe: {}", aws_sdk_sns::error::DisplayErrorContext(e)))?;
        eprintln!(
            "    topic          {} -> SQS {}",
            topic.name,
            short(&queue_arn)
        );
    }

    let sfn = Sfn::new(sdk);
    for machine in &plan.machines {
        let created = sfn
            .create_state_machine()
            .name(&machine.name)
            .definition(&machine.definition)
            .role_arn(format!(
                "arn:{}:iam::{}:role/{}-{}",
                plan.stack.partition, plan.stack.account, plan.stack.name, machine.logical_id
            ))
            .r#type(aws_sdk_sfn::types::StateMachineType::from(
                machine.machine_type.as_str(),
            ))
            .send()
            .await
            .map_err(|e| format!("CreateStateMachine {}: {}", machine.name, sfn_error(e)))?;
        if created.state_machine_arn() != machine.arn {
            return Err(format!(
                "state machine {} was created as {}, not the {} the template resolves to",
                machine.logical_id,
                created.state_machine_arn(),
                machine.arn
            ));
        }
        let subs: Vec<String> = machine.substitutions.keys().cloned().collect();
        eprintln!(
            "    state machine  {} ({}, substitutions: {})",
            machine.name,
            machine.definition_uri,
            subs.join(", ")
        );
    }
    for (id, kind) in &plan.skipped {
        eprintln!("    not emulated   {id} ({kind})");
    }
    Ok(Deployed { queue_url })
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
    let mut overrides = BTreeMap::new();
    overrides.insert("ConcurrencyLimit".to_owned(), args.limit.to_string());
    let template = Template::load(&root.join("template.yaml"), stack.clone(), &overrides)?;
    let plan = template.plan()?;
    let protected = plan.machine("LockProtectedStateMachine")?.clone();
    let (cleanup_machine, rule) = plan.rule_target()?;
    let (cleanup_machine, rule) = (cleanup_machine.clone(), rule.clone());
    let (sweeper_machine, schedule) = plan.scheduled()?;
    let (sweeper_machine, schedule) = (sweeper_machine.clone(), schedule.clone());
    let lock = plan.lock_name()?;
    let timing = plan.timing_seconds()?;

    let binaries: Vec<&str> = plan.functions.iter().map(|f| f.binary.as_str()).collect();
    if !args.no_build {
        phase(&format!("cargo build --bin {}", binaries.join(" --bin ")));
        local_aws::build_functions(root, dir, &binaries)?;
    }

    phase("starting the local AWS on 127.0.0.1");
    let python = args
        .python
        .clone()
        .unwrap_or_else(|| root.join(".venv/bin/python"));
    let cargo_lambda = args
        .cargo_lambda
        .clone()
        .unwrap_or_else(|| root.join(".venv/bin/cargo-lambda"));
    let emulator_port = local_aws::free_port()?;
    let emulator = format!("http://127.0.0.1:{emulator_port}");
    let endpoint = local_aws::start_server(setup.supervisor, &python, root, dir, Some(&emulator))?;
    local_aws::enable_step_functions_execution(&endpoint).await?;
    eprintln!("    moto server    {endpoint} (serialized; Step Functions execution mode on; Lambda invokes -> {emulator})");
    local_aws::start_emulator(setup.supervisor, &cargo_lambda, root, dir, emulator_port)?;
    eprintln!("    Lambda API     {emulator} (cargo lambda watch --only-lambda-apis)");
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
    let binary_dir = local_aws::target_dir(root).join("debug");
    for function in &plan.functions {
        let (instances, via) = match function.binary.as_str() {
            "acquire" => (args.acquire_instances, proxy.endpoint()),
            "release" => (4, endpoint.clone()),
            _ => (2, endpoint.clone()),
        };
        local_aws::start_functions(
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
            "    function       {} x{instances} (AWS_ENDPOINT_URL {via})",
            function.binary
        );
    }

    phase("deploying from template.yaml");
    let sdk = sdk_config(&endpoint, &stack.region);
    let deployed = deploy(&plan, &sdk).await?;
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

    // The run's plan.
    let executions = driver::plan_executions(setup, &stack, &protected.name, &proxy);
    let n = executions.len();
    let item = LockItem {
        ddb: aws_sdk_dynamodb::Client::new(&sdk),
        table: plan.table.name.clone(),
        lock: lock.clone(),
        layout: Layout::Versioned,
    };
    let target = Target::StateMachine {
        client: sfn.clone(),
        arn: cleanup_machine.arn.clone(),
    };
    let pattern = Some(rule.pattern.clone());
    let (watch, ended_tx) = Watch::start(setup, &stack, item, proxy, pattern, target);

    // A stop is a StopExecution, as an operator's would be.
    let stopped: Arc<Mutex<BTreeMap<String, Role>>> = Arc::default();
    {
        let (sfn, stopped) = (sfn.clone(), stopped.clone());
        let role_of = executions.iter().map(|(a, _, r)| (a.clone(), *r)).collect();
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

    let planned = |role| executions.iter().filter(|e| e.2 == role).count();
    phase(&format!(
        "starting {n} executions of {} (limit {}, {} s of work each; {} fail, {} stopped \
         mid-acquire, {} stopped mid-work)",
        protected.name,
        args.limit,
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
            .map(|(_, name, role)| {
                let input = json!({"work_seconds": args.work_seconds, "fail": *role == Role::Fail});
                (name.clone(), input.to_string())
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
        let limit = args.limit;
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
            format!(
                "{starting}done {done}/{n} | holders {} (max {}/{limit}) | reclaimed by sweeper \
                 {} | delayed writes refused {} | events {} dropped {} dup {} late",
                poll.holders_now,
                poll.max_holders,
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
                local_aws::tail(&log, 20)
            ));
        }
        let listed = list_executions(&sfn, &protected.arn).await?;
        for (arn, _, status) in listed {
            if status == ExecutionStatus::Running
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

    // Settle: the cleanups the last deliveries started have to end too.
    let (sfn_ref, cleanup_arn) = (&sfn, cleanup_machine.arn.as_str());
    let cleanups_settled = move || async move {
        let cleanups = list_executions(sfn_ref, cleanup_arn).await?;
        Ok(cleanups
            .iter()
            .all(|(_, _, s)| *s != ExecutionStatus::Running))
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
        .finish(progress, setup, holders_when_all_ended)
        .await?;
    let outcomes = outcomes.lock().expect("outcomes").clone();
    let stopped = stopped.lock().expect("stopped").clone();
    let mut counts = ExecutionCounts {
        total: n,
        ..ExecutionCounts::default()
    };
    let mut tokens = Vec::new();
    for (arn, name, role) in &executions {
        let Some(o) = outcomes.get(arn) else {
            counts.unexpected += 1;
            counts
                .unexpected_examples
                .push(format!("{name}: still RUNNING at the timeout"));
            continue;
        };
        let was_stopped = stopped.contains_key(arn);
        let token = o
            .output
            .as_deref()
            .and_then(|s| serde_json::from_str::<Value>(s).ok())
            .and_then(|v| v["fencing_token"].as_u64());
        if counts.count_planned(*role, &o.status, o.error.as_deref(), was_stopped) {
            if o.status == "SUCCEEDED" {
                tokens.extend(token);
            }
        } else {
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
    let distinct: BTreeSet<u64> = tokens.iter().copied().collect();
    report.fencing_tokens_unique =
        Some(distinct.len() == tokens.len() && tokens.len() == report.executions.succeeded);
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
        let (_, o) = describe(&sfn, &arn).await?;
        let summary: Value = o
            .output
            .as_deref()
            .and_then(|s| serde_json::from_str(s).ok())
            .unwrap_or(Value::Null);
        sweeper.reclaimed += summary["reclaimed"].as_u64().unwrap_or(0) as usize;
    }
    let sqs = aws_sdk_sqs::Client::new(&sdk);
    let notices = read_notices(&sqs, &deployed.queue_url).await;
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
    report.sweeper = Some(sweeper);

    // The invariants.
    let limit = args.limit as usize;
    report.check(
        "S1 safety",
        report.max_concurrent_holders <= limit && report.poller.inconsistent_reads == 0,
        format!(
            "at most {} of {limit} slots held at once over {} reads; every read consistent \
             (format 2, each holder's token distinct and within the version){}",
            report.max_concurrent_holders,
            report.poller.reads,
            report
                .poller
                .first_inconsistency
                .as_ref()
                .map(|m| format!(" EXCEPT: {m}"))
                .unwrap_or_default()
        ),
    );
    report.check(
        "S2 no leak",
        report.leaked_slots_at_end == 0,
        format!(
            "{} slots held at the end, after the final sweep",
            report.leaked_slots_at_end
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
        "fencing tokens",
        report.fencing_tokens_unique == Some(true),
        "every succeeded execution returned a distinct fencing token".to_owned(),
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
    report.finish();
    Ok(report)
}
