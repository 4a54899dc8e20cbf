//! The end-to-end scenario of this project's semaphore: real state machines on moto's
//! interpreter, real Lambda binaries behind cargo lambda's emulator, deployed from
//! template.yaml; probes of single paths first, then many executions under chaos, then the
//! invariants checked on what the poller, the histories and the logs saw.

mod deploy;
mod executions;
mod invariants;
mod probes;
mod settle;

use crate::driver::Setup;
use crate::report::Report;

pub async fn run(setup: &Setup<'_>) -> anyhow::Result<Report> {
    let (stage, held_rx) = deploy::deploy(setup).await?;
    let probes = probes::run(setup, &stage).await?;
    let run = executions::run(setup, &stage, held_rx).await?;
    let run = settle::settle(setup, &stage, run).await?;
    let (mut report, seen) = invariants::gather(setup, &stage, &probes, run).await?;
    invariants::check(&mut report, &probes, &seen);
    report.finish();
    Ok(report)
}
