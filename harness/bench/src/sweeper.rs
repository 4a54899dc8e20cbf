//! (e) The sweeper: DynamoDB, Step Functions and SNS calls per sweep as holders grow, counted
//! by the interceptor on clients built as `Sweeper::from_settings` builds them. Executions are
//! real executions of a state machine on the local Step Functions (moto's execution mode; they
//! wait, RUNNING, until stopped).

use std::time::Instant;

use anyhow::{bail, Context, Result};
use lambda_common::executions::LIST_ABOVE_HOLDERS;
use lambda_sweeper::{SfnExecutions, StateMachineArn, Sweeper};

use local_aws::counter::RequestCounter;
use local_aws::{fresh_table, sdk_config};
use semaphore_core::{DynamoStore, LockName, Semaphore, Timing};
use serde::Serialize;
use serde_json::json;

use crate::common::{start_executions, state_machine, take_slots, uuid};
use crate::rule::{rotations_between, BUSY_YOUNG_FENCES};
use crate::writes::{CountedStore, WriteCounter};

#[derive(Debug, Clone, Serialize)]
pub struct SweepRow {
    pub holders: usize,
    pub case: &'static str,
    pub reclaimed: usize,
    pub scan: u64,
    pub get_item: u64,
    pub put_item: u64,
    pub update_item: u64,
    pub failed_conditional_writes: u64,
    /// The protocol's writes: per reclaimed slot a fence and a free; and the lock's rotations (a
    /// cleanup's, once 8 young fences are kept, and the sweep's own when due on the scanned item).
    pub cleanup_fence: u64,
    pub cleanup_free: u64,
    pub rotations: u64,
    pub seconds: f64,
    pub describe_execution: u64,
    /// Pages of a machine's running executions: a machine with more than
    /// `LIST_ABOVE_HOLDERS` holders is listed, not described holder by holder.
    pub list_executions: u64,
    pub publish: u64,
    pub dynamodb_total: u64,
    pub step_functions_total: u64,
    pub sns_total: u64,
}

struct Local {
    sfn: aws_sdk_sfn::Client,
    machine_arn: String,
    topic_arn: String,
}

async fn local() -> Result<Local> {
    // Execution mode, as the lambdas part turns it on (it is the whole server's), before the
    // machine is made: one made before is not seen after, and the sweeps then meet the same
    // Step Functions whichever parts run.
    let sfn = local_aws::sfn::client();
    let definition = json!({
        "StartAt": "Work",
        "States": { "Work": { "Type": "Wait", "Seconds": 3600, "End": true } }
    });
    let role = "arn:aws:iam::123456789012:role/semaphore-bench";
    let machine_arn = state_machine(&sfn, "LockProtected", &definition, role).await?;
    Ok(Local {
        sfn,
        machine_arn,
        topic_arn: topic().await?,
    })
}

/// An SNS topic on the local server (also for the sweeper Lambda's run in `lambdas`).
pub async fn topic() -> Result<String> {
    Ok(aws_sdk_sns::Client::new(&sdk_config())
        .create_topic()
        .name(format!("semaphore-bench-{}", &uuid()[..8]))
        .send()
        .await
        .context("create the topic")?
        .topic_arn()
        .unwrap_or_default()
        .to_owned())
}

impl Local {
    async fn stop(&self, arns: &[String]) -> Result<()> {
        for arn in arns {
            self.sfn
                .stop_execution()
                .execution_arn(arn)
                .send()
                .await
                .with_context(|| format!("stop {arn}"))?;
        }
        Ok(())
    }

    /// The sweeper with counted clients, configured as `Sweeper::from_settings` configures it
    /// (the default timing), its store's writes counted by kind.
    fn sweeper(
        &self,
        counter: &RequestCounter,
        writes: &WriteCounter,
        table: &str,
    ) -> Result<Sweeper<CountedStore<DynamoStore>, SfnExecutions>> {
        let sdk = sdk_config();
        let ddb = counter.dynamodb_client(local_aws::endpoint());
        let sfn = aws_sdk_sfn::Client::from_conf(
            aws_sdk_sfn::config::Builder::from(&sdk)
                .interceptor(counter.clone())
                .build(),
        );
        let sns = aws_sdk_sns::Client::from_conf(
            aws_sdk_sns::config::Builder::from(&sdk)
                .interceptor(counter.clone())
                .build(),
        );
        let machine = StateMachineArn::parse(&self.machine_arn)
            .with_context(|| format!("{} is not a state machine ARN", self.machine_arn))?;
        let semaphore = Semaphore::new(writes.store(DynamoStore::new(ddb, table)))
            .with_timing(Timing::default());
        Ok(Sweeper {
            semaphore,
            waker: lambda_common::TaskWaker {
                callbacks: sfn.clone(),
            },
            executions: SfnExecutions::of_machines(sfn, machine.into()),
            sns,
            topic_arn: self.topic_arn.clone(),
            // The bench counts requests, not metric lines: none written.
            metrics: lambda_common::Metrics::default(),
        })
    }
}

/// For each holder count: a sweep that finds every holder RUNNING, then (all stopped) a sweep
/// that reclaims them all.
pub async fn run(holder_counts: &[usize]) -> Result<Vec<SweepRow>> {
    let local = local().await?;
    let mut rows = Vec::new();
    for &n in holder_counts {
        let store = fresh_table().await;
        let table = store.table().to_owned();
        let sem = Semaphore::new(store);
        let lock = LockName::new(format!("sweep-{n}"))?;
        let arns = start_executions(&local.sfn, &local.machine_arn, &json!({}), n).await?;
        let holders: Vec<(String, String)> = arns.iter().map(|a| (a.clone(), uuid())).collect();
        take_slots(&sem, &lock, &holders).await?;
        // `check` expects no rotation of the sweep's own: the item it scans has no fence (only
        // acquires wrote it), so no rotation is due on it.
        let scanned = sem.status(&lock).await.context("read the swept lock")?;
        if !scanned.fences.is_empty() {
            bail!("{lock} has fences before its sweeps: {:?}", scanned.fences);
        }
        let (counter, writes) = (RequestCounter::new(), WriteCounter::new());
        let sweeper = local.sweeper(&counter, &writes, &table)?;
        // The executions stopped between the two sweeps.
        for (case, stopped) in [
            ("all RUNNING: nothing to reclaim", false),
            ("all ABORTED: reclaim every slot", true),
        ] {
            if stopped {
                local.stop(&arns).await?;
                counter.take();
                writes.take();
            }
            let started = Instant::now();
            let report = sweeper.sweep().await.context("sweep")?;
            if !report.summary.errors.is_empty() {
                bail!("sweep errors: {:?}", report.summary.errors);
            }
            let (c, w) = (counter.take(), writes.take());
            rows.push(SweepRow {
                holders: n,
                case,
                reclaimed: report.summary.reclaimed,
                scan: c.get("DynamoDB.Scan"),
                get_item: c.get("DynamoDB.GetItem"),
                put_item: c.get("DynamoDB.PutItem"),
                update_item: c.get("DynamoDB.UpdateItem"),
                failed_conditional_writes: c.total_failed(),
                cleanup_fence: w.cleanup_fence,
                cleanup_free: w.cleanup_free,
                rotations: w.rotation,
                seconds: started.elapsed().as_secs_f64(),
                describe_execution: c.get("SFN.DescribeExecution"),
                list_executions: c.get("SFN.ListExecutions"),
                publish: c.get("SNS.Publish"),
                dynamodb_total: c.service_total("DynamoDB"),
                step_functions_total: c.service_total("SFN"),
                sns_total: c.service_total("SNS"),
            });
        }
    }
    Ok(rows)
}

/// What must hold exactly: one scan; the holders' executions asked one `DescribeExecution` each
/// up to `LIST_ABOVE_HOLDERS` holders of the machine, above that one `ListExecutions` page (the
/// machine's running executions, under 1,000 here) and a `DescribeExecution` only of each holder
/// not listed running; and per reclaimed slot two writes (fence, free) and a notice. Nothing
/// read, nothing refused. Rotations, by the rule
/// (see `rule`): the swept lock had no fence before (only acquires wrote it), so the sweep's own
/// rotation, due on the scanned item only if it has a fence, never happens, and the first sweep
/// (nothing to reclaim) writes nothing; in the second, a cleanup rotates once the young fences,
/// its own added, number 8 and a window has passed since the last rotation: none with fewer
/// than 8 cleanups, one at the 8th (the lock never rotated), then at most one per window and one
/// per 8 more cleanups.
pub fn check(rows: &[SweepRow], problems: &mut Vec<String>) {
    let window = Timing::default().window().as_secs_f64();
    for r in rows {
        let n = r.holders as u64;
        let reclaiming = r.case.starts_with("all ABORTED");
        let slots = if reclaiming { n } else { 0 };
        // One cleanup per holder: each execution holds one slot.
        let (least, most) =
            rotations_between(0, slots as usize, r.seconds, window, BUSY_YOUNG_FENCES);
        let (listed, described) = if r.holders <= LIST_ABOVE_HOLDERS {
            (0, n)
        } else {
            (1, slots)
        };
        if r.scan != 1
            || r.describe_execution != described
            || r.list_executions != listed
            || r.get_item != 0
            || r.put_item != 0
            || r.failed_conditional_writes != 0
            || r.cleanup_fence != slots
            || r.cleanup_free != slots
            || r.update_item != 2 * slots + r.rotations
            || !(least..=most).contains(&r.rotations)
            || r.publish != slots
            || r.reclaimed as u64 != slots
        {
            problems.push(format!(
                "sweeper counts not as expected ({least} to {most} rotations): {r:?}"
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(holders: usize, case: &'static str, rotations: u64) -> SweepRow {
        let slots = if case.starts_with("all ABORTED") {
            holders as u64
        } else {
            0
        };
        let listed = holders > LIST_ABOVE_HOLDERS;
        let described = if listed { slots } else { holders as u64 };
        SweepRow {
            holders,
            case,
            reclaimed: slots as usize,
            scan: 1,
            get_item: 0,
            put_item: 0,
            update_item: 2 * slots + rotations,
            failed_conditional_writes: 0,
            cleanup_fence: slots,
            cleanup_free: slots,
            rotations,
            seconds: 0.5,
            describe_execution: described,
            list_executions: u64::from(listed),
            publish: slots,
            dynamodb_total: 1 + 2 * slots + rotations,
            step_functions_total: described + u64::from(listed),
            sns_total: slots,
        }
    }

    #[test]
    fn a_sweep_rotates_at_its_eighth_cleanup_and_not_for_a_lock_without_fences() {
        let ok = |r: SweepRow| {
            let mut problems = Vec::new();
            check(&[r], &mut problems);
            problems.is_empty()
        };
        let aborted = "all ABORTED: reclaim every slot";
        let running = "all RUNNING: nothing to reclaim";
        assert!(ok(row(10, running, 0)));
        assert!(!ok(row(10, running, 1)), "no fence scanned: nothing due");
        assert!(ok(row(1, aborted, 0)));
        assert!(!ok(row(1, aborted, 1)), "one young fence is not busy");
        assert!(ok(row(7, aborted, 0)));
        assert!(ok(row(10, aborted, 1)));
        assert!(!ok(row(10, aborted, 0)), "the 8th cleanup rotates");
        assert!(!ok(row(10, aborted, 2)), "within the window");
        assert!(!ok(row(100, aborted, 2)), "half a second: one window");
        assert!(ok(row(100, running, 0)));
        let mut described = row(100, running, 0);
        described.describe_execution = 100;
        assert!(
            !ok(described),
            "a machine of 100 holders is listed, not described"
        );
    }
}
