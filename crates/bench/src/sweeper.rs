//! (e) The sweeper: DynamoDB, Step Functions and SNS calls per sweep as holders grow, counted
//! by the interceptor on clients built as `Sweeper::from_settings` builds them. Executions are
//! real executions of a state machine on the local Step Functions (moto keeps them RUNNING).

use lambda_sweeper::{SfnExecutions, StateMachineArn, Sweeper, DEFAULT_NAMESPACE};
use semaphore_core::{
    AcquireOutcome, AcquisitionId, DynamoStore, HolderId, Identity, Limit, LockName, Semaphore,
    DEFAULT_FENCE_WINDOW, DEFAULT_ITEM_CACHE_LOCKS,
};
use semaphore_tests::counter::{Counts, RequestCounter};
use semaphore_tests::{fresh_table, sdk_config};
use serde::Serialize;
use serde_json::json;

use crate::common::uuid;

#[derive(Debug, Clone, Serialize)]
pub struct SweepRow {
    pub holders: usize,
    pub case: &'static str,
    pub reclaimed: usize,
    pub scan: u64,
    pub get_item: u64,
    pub put_item: u64,
    pub failed_put_item: u64,
    pub describe_execution: u64,
    pub publish: u64,
    pub dynamodb_total: u64,
    pub step_functions_total: u64,
    pub sns_total: u64,
}

fn row(holders: usize, case: &'static str, reclaimed: usize, c: &Counts) -> SweepRow {
    SweepRow {
        holders,
        case,
        reclaimed,
        scan: c.get("DynamoDB.Scan"),
        get_item: c.get("DynamoDB.GetItem"),
        put_item: c.get("DynamoDB.PutItem"),
        failed_put_item: c.failed("DynamoDB.PutItem"),
        describe_execution: c.get("SFN.DescribeExecution"),
        publish: c.get("SNS.Publish"),
        dynamodb_total: c.service_total("DynamoDB"),
        step_functions_total: c.service_total("SFN"),
        sns_total: c.service_total("SNS"),
    }
}

struct Local {
    sfn: aws_sdk_sfn::Client,
    machine_arn: String,
    topic_arn: String,
}

async fn local() -> Result<Local, String> {
    let sdk = sdk_config();
    let sfn = aws_sdk_sfn::Client::new(&sdk);
    let definition = json!({
        "StartAt": "Work",
        "States": { "Work": { "Type": "Wait", "Seconds": 3600, "End": true } }
    });
    let machine_arn = sfn
        .create_state_machine()
        .name(format!("LockProtected-{}", &uuid()[..8]))
        .definition(definition.to_string())
        .role_arn("arn:aws:iam::123456789012:role/semaphore-bench")
        .send()
        .await
        .map_err(|e| {
            format!(
                "create the state machine: {}",
                aws_sdk_sfn::error::DisplayErrorContext(e)
            )
        })?
        .state_machine_arn()
        .to_owned();
    Ok(Local {
        sfn,
        machine_arn,
        topic_arn: topic().await?,
    })
}

/// An SNS topic on the local server (also for the sweeper Lambda's run in `lambdas`).
pub async fn topic() -> Result<String, String> {
    Ok(aws_sdk_sns::Client::new(&sdk_config())
        .create_topic()
        .name(format!("semaphore-bench-{}", &uuid()[..8]))
        .send()
        .await
        .map_err(|e| {
            format!(
                "create the topic: {}",
                aws_sdk_sns::error::DisplayErrorContext(e)
            )
        })?
        .topic_arn()
        .unwrap_or_default()
        .to_owned())
}

impl Local {
    async fn start(&self, n: usize) -> Result<Vec<String>, String> {
        let mut arns = Vec::with_capacity(n);
        for _ in 0..n {
            arns.push(
                self.sfn
                    .start_execution()
                    .state_machine_arn(&self.machine_arn)
                    .name(uuid())
                    .input("{}")
                    .send()
                    .await
                    .map_err(|e| format!("start: {}", aws_sdk_sfn::error::DisplayErrorContext(e)))?
                    .execution_arn()
                    .to_owned(),
            );
        }
        Ok(arns)
    }

    async fn stop(&self, arns: &[String]) -> Result<(), String> {
        for arn in arns {
            self.sfn
                .stop_execution()
                .execution_arn(arn)
                .send()
                .await
                .map_err(|e| format!("stop: {}", aws_sdk_sfn::error::DisplayErrorContext(e)))?;
        }
        Ok(())
    }

    /// The sweeper with counted clients, configured as `Sweeper::from_settings` configures it
    /// (`item_cache`: whether its semaphore keeps the item cache, as it does in production).
    fn sweeper(
        &self,
        counter: &RequestCounter,
        table: &str,
        item_cache: bool,
    ) -> Result<Sweeper<DynamoStore, SfnExecutions>, String> {
        let sdk = sdk_config();
        let ddb = aws_sdk_dynamodb::Client::from_conf(
            aws_sdk_dynamodb::config::Builder::from(&sdk)
                .interceptor(counter.clone())
                .build(),
        );
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
        let machine = StateMachineArn::parse(&self.machine_arn).ok_or("state machine ARN")?;
        let semaphore = Semaphore::new(DynamoStore::new(ddb, table))
            .with_fence_window(DEFAULT_FENCE_WINDOW)
            .with_item_cache(if item_cache {
                DEFAULT_ITEM_CACHE_LOCKS
            } else {
                0
            });
        Ok(Sweeper {
            semaphore,
            executions: SfnExecutions::new(sfn, Some(machine)),
            sns,
            topic_arn: self.topic_arn.clone(),
            namespace: DEFAULT_NAMESPACE.to_owned(),
        })
    }
}

async fn hold_slots(
    sem: &Semaphore<DynamoStore>,
    lock: &LockName,
    arns: &[String],
) -> Result<(), String> {
    for arn in arns {
        let who = Identity::new(
            HolderId::new(arn.as_str()).map_err(|e| e.to_string())?,
            AcquisitionId::new(uuid()).map_err(|e| e.to_string())?,
        );
        match sem
            .acquire(lock, &who, Limit::new(1000).map_err(|e| e.to_string())?)
            .await
            .map_err(|e| e.to_string())?
        {
            AcquireOutcome::Acquired { .. } => {}
            other => return Err(format!("taking a slot for the sweep gave {other:?}")),
        }
    }
    Ok(())
}

/// For each holder count: a sweep that finds every holder RUNNING, then (all stopped) a sweep
/// that reclaims them all, with the item cache as deployed and without it.
pub async fn run(holder_counts: &[usize]) -> Result<Vec<SweepRow>, String> {
    let local = local().await?;
    let mut rows = Vec::new();
    for &n in holder_counts {
        for item_cache in [true, false] {
            let store = fresh_table().await;
            let table = store.table().to_owned();
            let sem = Semaphore::new(store);
            let lock = LockName::new(format!("sweep-{n}")).map_err(|e| e.to_string())?;
            let arns = local.start(n).await?;
            hold_slots(&sem, &lock, &arns).await?;
            let counter = RequestCounter::new();
            let sweeper = local.sweeper(&counter, &table, item_cache)?;
            if item_cache {
                let report = sweeper.sweep().await.map_err(|e| e.to_string())?;
                rows.push(row(
                    n,
                    "all RUNNING: nothing to reclaim",
                    report.summary.reclaimed,
                    &counter.take(),
                ));
            }
            local.stop(&arns).await?;
            counter.take();
            let report = sweeper.sweep().await.map_err(|e| e.to_string())?;
            if !report.summary.errors.is_empty() {
                return Err(format!("sweep errors: {:?}", report.summary.errors));
            }
            let case = if item_cache {
                "all ABORTED: reclaim every slot (as deployed: item cache)"
            } else {
                "all ABORTED: reclaim every slot (item cache off)"
            };
            rows.push(row(n, case, report.summary.reclaimed, &counter.take()));
        }
    }
    Ok(rows)
}
