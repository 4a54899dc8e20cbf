//! Step 5: the invariants. What the run saw is gathered (every execution's outcome against its
//! plan, the fencing tokens, the cleanups and when each finished, the sweeps and their notices,
//! the work against its parent's slot, the line from every history), then checked: per lock
//! (S1, start rate, S2, fencing tokens), then across the run.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use aws_sdk_sfn::types::ExecutionStatus;

use super::deploy::Stage;
use super::executions::Ran;
use super::probes::Probes;
use crate::driver::Setup;
use crate::line::{self, LineReport};
use crate::report::{
    short, CleanupCounts, ExecutionCounts, Report, StopParentReport, SweeperCounts, WorkReport,
};
use crate::work;
use local_aws::eventbridge::Ended;
use local_aws::lambda;
use local_aws::sfn::{clip, describe, history, json_of, list_executions, save_history};

/// What the checks need beside the report.
pub(super) struct Seen {
    timed_out: bool,
    /// Executions seen holding a slot after their cleanup had finished.
    resurrections: Vec<String>,
    cleaned_up: usize,
    reclaimed: usize,
    read_back: usize,
    line_report: LineReport,
    work_report: WorkReport,
}

pub(super) async fn gather(
    setup: &Setup<'_>,
    stage: &Stage,
    probes: &Probes,
    run: Ran,
) -> anyhow::Result<(Report, Seen)> {
    let Stage {
        locks,
        deployed,
        work_machine,
        cleanup_machine,
        sweeper_machine,
        timing,
        sdk,
        sfn,
        ..
    } = stage;
    let Ran {
        executions,
        watch,
        progress,
        outcomes,
        stopped,
        timed_out,
        holders_when_all_ended,
        ..
    } = run;
    let (args, dir, schedule, n) = (setup.args, setup.dir, &deployed.schedule, executions.len());
    let mut report = watch
        .finish(progress, setup, &executions, &holders_when_all_ended)
        .await?;
    let stopped = stopped.lock().expect("stopped").clone();
    let mut counts = ExecutionCounts {
        total: n,
        ..ExecutionCounts::default()
    };
    // Fencing tokens are a lock's versions: distinct per lock.
    let mut tokens: Vec<Vec<u64>> = vec![Vec::new(); locks.len()];
    for e in &executions {
        // Stopped mid-acquire is a role the run gave as it went (see `plan_executions`).
        let (arn, name) = (&e.arn, &e.name);
        let role = stopped.get(arn).unwrap_or(&e.role);
        let Some(o) = outcomes.get(arn) else {
            counts.unexpected += 1;
            counts
                .unexpected_examples
                .push(format!("{name}: still RUNNING at the timeout"));
            continue;
        };
        let was_stopped = stopped.contains_key(arn);
        let output = o.output_json();
        let lock = &locks[e.lock].name;
        // A success must name the lock it was planned to take: the default taken from the
        // template, or the one its input named.
        let wrong_lock =
            o.status == "SUCCEEDED" && output["semaphore"]["lock"].as_str() != Some(lock.as_str());
        if !wrong_lock && counts.count_planned(*role, &o.status, o.error.as_deref(), was_stopped) {
            if o.status == "SUCCEEDED" {
                report.locks[e.lock].succeeded += 1;
                counts.consumer_succeeded += usize::from(e.consumer);
                tokens[e.lock].extend(output["semaphore"]["token"].as_u64());
            }
        } else {
            if wrong_lock {
                counts.unexpected += 1;
            }
            let history = save_history(sfn, arn, dir).await;
            counts.unexpected_examples.push(format!(
                "{name} ({role:?}): {} {}{}: {} [history: {history}]",
                o.status,
                o.error.as_deref().unwrap_or(""),
                if was_stopped { " (stopped)" } else { "" },
                clip(o.cause.as_deref().unwrap_or(""), 300)
            ));
        }
    }
    counts.consumer = executions.iter().filter(|e| e.consumer).count();
    report.executions = counts;
    report.consumer_machine = Some(stage.consumer_machine.name.clone());
    for (l, tokens) in report.locks.iter_mut().zip(&tokens) {
        let distinct: BTreeSet<u64> = tokens.iter().copied().collect();
        l.fencing_tokens_unique =
            Some(distinct.len() == tokens.len() && tokens.len() == l.succeeded);
    }
    report.fenced_answers_in_logs = count_fenced(dir);
    report.expired_answers_in_logs = count_expired(dir);
    report.timing_seconds = Some(*timing);

    // When each execution's first cleanup finished, to check that no read after it saw the
    // execution holding a slot (S3).
    let mut cleanup = CleanupCounts::default();
    let mut cleaned_at: BTreeMap<String, i64> = BTreeMap::new();
    for (arn, name, status) in list_executions(sfn, &cleanup_machine.arn).await? {
        if name == "preflight" {
            continue;
        }
        cleanup.started += 1;
        match status {
            ExecutionStatus::Succeeded => {
                cleanup.succeeded += 1;
                let ended = describe(sfn, &arn).await?;
                let event = json_of(ended.input.as_deref());
                if let Some(target) = event["detail"]["executionArn"].as_str() {
                    let stop = ended.stop_ms;
                    let entry = cleaned_at.entry(target.to_owned()).or_insert(stop);
                    *entry = (*entry).min(stop);
                }
            }
            ExecutionStatus::Running => {}
            _ => {
                cleanup.failed += 1;
                let o = describe(sfn, &arn).await?;
                let history = save_history(sfn, &arn, dir).await;
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
    for (arn, name, status) in list_executions(sfn, &sweeper_machine.arn).await? {
        if name == "preflight" {
            continue;
        }
        sweeper.sweeps += 1;
        if status != ExecutionStatus::Succeeded {
            sweeper.failed_sweeps += 1;
            continue;
        }
        let ended = describe(sfn, &arn).await?;
        sweeper.started_ms.push(ended.start_ms);
        sweeper.reclaimed += ended.output_json()["reclaimed"].as_u64().unwrap_or(0) as usize;
    }
    let notices = deployed.notices(sdk).await;
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
    let children = work::children(sfn, &work_machine.arn).await?;
    let parent_status: BTreeMap<String, String> = outcomes
        .iter()
        .map(|(arn, o)| (arn.clone(), o.status.clone()))
        .collect();
    let work_report = work::report(
        work_machine,
        &children,
        &executions,
        locks,
        &stopped,
        &parent_status,
        &report.poller,
        &swept,
    );
    report.work = Some(work_report.clone());
    report.redrive_guard = Some(probes.redrive.clone());
    report.misconfigured_caller = Some(probes.misconfigured.clone());
    report.stopped_parent_probes = probes.stop_parent.clone();
    report.test_runner = Some(probes.test_runner.detail.clone());
    report.your_workflow_example = Some(probes.your_workflow.detail.clone());
    report.express_and_map = Some(probes.express.detail.clone());
    report.consumer_stack = Some(probes.consumer.detail.clone());
    report.transitions = Some(probes.transitions.clone());
    report.history_probe = Some(probes.history.clone());

    // The line: every execution's history, and the functions' hand-off log lines.
    let mut traces = Vec::with_capacity(executions.len());
    for e in &executions {
        let events = history(sfn, &e.arn).await?;
        let output = outcomes.get(&e.arn).map(Ended::output_json);
        traces.push(line::trace(&e.arn, e.lock, &events, output.as_ref()));
    }
    let line_report = line::report(&traces, dir);
    for arn in line_report.unexplained.iter().take(3) {
        save_history(sfn, arn, dir).await;
    }
    report.line = Some(line_report.clone());

    Ok((
        report,
        Seen {
            timed_out,
            resurrections,
            cleaned_up: cleaned_at.len(),
            reclaimed,
            read_back,
            line_report,
            work_report,
        },
    ))
}

pub(super) fn check(report: &mut Report, probes: &Probes, seen: &Seen) {
    let Probes {
        redrive,
        misconfigured,
        history: history_probe,
        stop_parent: stop_probes,
        test_runner,
        your_workflow,
        consumer,
        express,
        ..
    } = probes;
    let Seen {
        timed_out,
        resurrections,
        cleaned_up,
        reclaimed,
        read_back,
        line_report,
        work_report,
    } = seen;

    // The invariants, per lock first.
    report.lock_checks();
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
    report.checks.extend([
        StopParentReport::check(stop_probes),
        history_probe.check(),
        test_runner.clone(),
        your_workflow.clone(),
        express.clone(),
        consumer.clone(),
        misconfigured.check(),
        redrive.check(),
    ]);
    report.progress_check(*timed_out);
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
                cleaned_up,
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
}

/// Acquires answered `SemaphoreFenced`: the handler's own warning, one per fenced answer.
fn count_fenced(dir: &Path) -> usize {
    lambda::log_lines(dir, "acquire", |l| {
        l.contains(r#""level":"WARN""#) && l.contains(" is fenced: ")
    })
}

/// Acquires answered "expired": the handler's info line for its answer.
fn count_expired(dir: &Path) -> usize {
    lambda::log_lines(dir, "acquire", |l| {
        l.contains(r#""message":"acquire""#) && l.contains(r#""outcome":"expired""#)
    })
}
