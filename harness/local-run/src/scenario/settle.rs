//! Step 4: settle. The cleanups the last deliveries started have to end, the held writes land,
//! the children of stopped executions end (a cleanup waits for them, or a sweep, whose event
//! was dropped); then the schedule stops and a final sweep runs after its last one.

use std::sync::atomic::Ordering::SeqCst;
use std::time::{Duration, Instant};

use super::deploy::Stage;
use super::executions::Ran;
use crate::driver::Setup;
use local_aws::sfn::{any_running, start_execution, wait_ended};

pub(super) async fn settle(setup: &Setup<'_>, stage: &Stage, run: Ran) -> anyhow::Result<Ran> {
    let Stage {
        deployed,
        work_machine,
        cleanup_machine,
        sweeper_machine,
        sfn,
        ..
    } = stage;
    let (args, schedule, watch, progress) =
        (setup.args, &deployed.schedule, &run.watch, &run.progress);
    let (sfn_ref, cleanup_arn, work_arn) = (
        &sfn,
        cleanup_machine.arn.as_str(),
        work_machine.arn.as_str(),
    );
    let cleanups_settled = move || async move {
        Ok(!any_running(sfn_ref, cleanup_arn).await? && !any_running(sfn_ref, work_arn).await?)
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
    run.sweeping.store(false, SeqCst);
    let sweep_deadline = Instant::now() + Duration::from_secs(120);
    while any_running(sfn, &sweeper_machine.arn).await? && Instant::now() < sweep_deadline {
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    progress.note("==> final sweep");
    let final_sweep =
        start_execution(sfn, &sweeper_machine.arn, "sweep-final", &schedule.input).await?;
    wait_ended(sfn, &final_sweep, Duration::from_secs(120)).await?;
    Ok(run)
}
