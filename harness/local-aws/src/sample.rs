//! The original AWS sample's protocol ("control concurrency with DynamoDB", 2021), implemented
//! here only so that the race tests can show they catch the leak it has.
//!
//! One item per lock: a counter plus one attribute per holding execution. Acquire is one
//! `UpdateItem` conditioned on "count below limit and not yet a holder"; release decrements if
//! the holder attribute exists; cleanup reads the item and, if the execution is a holder,
//! releases it. No version, no fence.

use aws_sdk_dynamodb::error::SdkError;
use aws_sdk_dynamodb::operation::update_item::UpdateItemError;
use aws_sdk_dynamodb::types::AttributeValue;
use aws_sdk_dynamodb::Client;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::mpsc;

use crate::eventbridge::Ended;
use crate::observe::RawRecord;
use crate::poller::now_ms;

pub struct Sample {
    pub client: Client,
    pub table: String,
}

fn s(v: &str) -> AttributeValue {
    AttributeValue::S(v.to_owned())
}
fn n(v: i64) -> AttributeValue {
    AttributeValue::N(v.to_string())
}

impl Sample {
    fn holder_attr(holder: &str) -> String {
        format!("holder:{holder}")
    }

    /// The sample's "initialize lock item" step.
    pub async fn init(&self, lock: &str) {
        let _ = self
            .client
            .put_item()
            .table_name(&self.table)
            .item("lock", s(lock))
            .item("count", n(0))
            .condition_expression("attribute_not_exists(#l)")
            .expression_attribute_names("#l", "lock")
            .send()
            .await;
    }

    /// Returns whether the slot was taken.
    pub async fn acquire(&self, lock: &str, holder: &str, limit: i64) -> bool {
        self.try_acquire(lock, holder, limit)
            .await
            .unwrap_or_else(|e| panic!("sample UpdateItem failed: {e}"))
    }

    /// Whether the slot was taken, or why the write failed other than by its condition (an
    /// item past DynamoDB's 400 KB, say).
    pub async fn try_acquire(&self, lock: &str, holder: &str, limit: i64) -> Result<bool, String> {
        let result = self
            .client
            .update_item()
            .table_name(&self.table)
            .key("lock", s(lock))
            .update_expression("SET #c = #c + :one, #h = :now")
            .condition_expression("#c < :limit AND attribute_not_exists(#h)")
            .expression_attribute_names("#c", "count")
            .expression_attribute_names("#h", Self::holder_attr(holder))
            .expression_attribute_values(":one", n(1))
            .expression_attribute_values(":limit", n(limit))
            .expression_attribute_values(":now", s("acquired"))
            .send()
            .await;
        try_conditional(result)
    }

    pub async fn release(&self, lock: &str, holder: &str) -> bool {
        let result = self
            .client
            .update_item()
            .table_name(&self.table)
            .key("lock", s(lock))
            .update_expression("SET #c = #c - :one REMOVE #h")
            .condition_expression("attribute_exists(#h)")
            .expression_attribute_names("#c", "count")
            .expression_attribute_names("#h", Self::holder_attr(holder))
            .expression_attribute_values(":one", n(1))
            .send()
            .await;
        conditional(result)
    }

    /// The sample's cleanup-from-incomplete: look, and release if held.
    pub async fn cleanup(&self, lock: &str, holder: &str) {
        if self.holders(lock).await.iter().any(|h| h == holder) {
            self.release(lock, holder).await;
        }
    }

    pub async fn holders(&self, lock: &str) -> Vec<String> {
        let item = crate::observe::raw_item(&self.client, &self.table, lock)
            .await
            .unwrap_or_default();
        read_item(&item).0
    }

    pub async fn count(&self, lock: &str) -> i64 {
        crate::observe::raw_item(&self.client, &self.table, lock)
            .await
            .and_then(|item| item.get("count")?.as_n().ok()?.parse().ok())
            .unwrap_or(0)
    }
}

/// The holding execution an acquire of the sample's sets, if this request (`operation` as in
/// `X-Amz-Target`, its JSON `body`) is one: the `UpdateItem` of [`Sample::acquire`],
/// which adds one to the count and names the `holder:<execution>` attribute `#h`.
pub fn acquiring(operation: Option<&str>, body: &[u8]) -> Option<String> {
    (operation? == "UpdateItem").then_some(())?;
    let body: serde_json::Value = serde_json::from_slice(body).ok()?;
    if !body.get("UpdateExpression")?.as_str()?.contains("+ :one") {
        return None;
    }
    let slot = body.get("ExpressionAttributeNames")?.get("#h")?.as_str()?;
    slot.strip_prefix("holder:").map(str::to_owned)
}

/// The sample's item read raw: its holders, and what is inconsistent in it (a stored count that
/// is not the number of holders).
pub fn read_item(item: &RawRecord) -> (Vec<String>, Option<String>) {
    let holders: Vec<String> = item
        .keys()
        .filter_map(|k| k.strip_prefix("holder:").map(str::to_owned))
        .collect();
    let count = item
        .get("count")
        .and_then(|c| c.as_n().ok()?.parse::<usize>().ok());
    let problem = (count != Some(holders.len()))
        .then(|| format!("count {count:?} with {} holders", holders.len()));
    (holders, problem)
}

fn conditional<T>(result: Result<T, SdkError<UpdateItemError>>) -> bool {
    try_conditional(result).unwrap_or_else(|e| panic!("sample UpdateItem failed: {e}"))
}

fn try_conditional<T>(result: Result<T, SdkError<UpdateItemError>>) -> Result<bool, String> {
    match result {
        Ok(_) => Ok(true),
        Err(SdkError::ServiceError(e))
            if matches!(e.err(), UpdateItemError::ConditionalCheckFailedException(_)) =>
        {
            Ok(false)
        }
        Err(e) => Err(aws_sdk_dynamodb::error::DisplayErrorContext(e).to_string()),
    }
}

/// How long an execution played here waits for a slot before it gives up (the sample has no
/// cap; a run has to end).
const WAIT_CAP: Duration = Duration::from_secs(30);

/// An execution's end: its status and error.
pub type Status = (String, Option<String>);

/// An execution of the sample's lock-protected machine, played as a task of the local run's
/// sample mode rather than a Step Functions execution: what is compared is the protocol, and the
/// sample's state machines are not part of this project.
pub struct Execution {
    pub arn: String,
    pub name: String,
    /// Its work fails (the machine ends FAILED; the sample's cleanup is what frees the slot).
    pub fail: bool,
    /// Set when the run stops it: its task ends, its zombie call may still land.
    pub stopped: AtomicBool,
    pub start_ms: i64,
}

impl Execution {
    /// Its status event's content.
    pub fn ended(&self, status: &str, error: Option<&str>) -> Ended {
        Ended {
            arn: self.arn.clone(),
            machine_arn: self
                .arn
                .replace(":execution:", ":stateMachine:")
                .rsplit_once(':')
                .map(|(m, _)| m.to_owned())
                .unwrap_or_default(),
            name: self.name.clone(),
            status: status.to_owned(),
            start_ms: self.start_ms,
            stop_ms: now_ms(),
            input: Some("{}".to_owned()),
            output: None,
            error: error.map(str::to_owned),
            cause: None,
        }
    }

    /// Runs it: acquire through `acquirer` (polling, as the sample's machine does), work for
    /// `work`, release through `direct`; a failure or timeout is sent to `ended` as its status
    /// event. Returns its status and error.
    #[allow(clippy::too_many_arguments)]
    pub async fn run(
        self: Arc<Self>,
        acquirer: Arc<Sample>,
        direct: Arc<Sample>,
        lock: String,
        limit: i64,
        work: Duration,
        ended: mpsc::UnboundedSender<Ended>,
        seed: u64,
    ) -> Status {
        let mut rng = fastrand::Rng::with_seed(seed);
        let started = Instant::now();
        loop {
            // A zombie: the call goes on even when the execution was stopped meanwhile.
            let acquired = acquirer.acquire(&lock, &self.arn, limit).await;
            if self.stopped.load(Ordering::SeqCst) {
                return ("ABORTED".to_owned(), None);
            }
            if acquired {
                break;
            }
            if started.elapsed() >= WAIT_CAP {
                let _ = ended.send(self.ended("FAILED", Some("SemaphoreWaitTimeout")));
                return ("FAILED".to_owned(), Some("SemaphoreWaitTimeout".to_owned()));
            }
            tokio::time::sleep(Duration::from_millis(rng.u64(500..2000))).await;
        }
        let work_end = Instant::now() + work;
        while Instant::now() < work_end {
            if self.stopped.load(Ordering::SeqCst) {
                return ("ABORTED".to_owned(), None);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        if self.fail {
            let _ = ended.send(self.ended("FAILED", Some("WorkFailed")));
            return ("FAILED".to_owned(), Some("WorkFailed".to_owned()));
        }
        direct.release(&lock, &self.arn).await;
        ("SUCCEEDED".to_owned(), None)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    #[test]
    fn recognises_the_acquire_and_nothing_else() {
        let update = Some("UpdateItem");
        let acquire = serde_json::json!({
            "UpdateExpression": "SET #c = #c + :one, #h = :now",
            "ExpressionAttributeNames": {"#c": "count", "#h": "holder:arn:x"}
        });
        let bytes = serde_json::to_vec(&acquire).unwrap();
        assert_eq!(acquiring(update, &bytes).as_deref(), Some("arn:x"));
        assert_eq!(acquiring(Some("PutItem"), &bytes), None);
        let release = serde_json::json!({
            "UpdateExpression": "SET #c = #c - :one REMOVE #h",
            "ExpressionAttributeNames": {"#c": "count", "#h": "holder:arn:x"}
        });
        let bytes = serde_json::to_vec(&release).unwrap();
        assert_eq!(acquiring(update, &bytes), None);
    }

    #[test]
    fn reads_the_holders_and_checks_the_count() {
        let n = |v: &str| AttributeValue::N(v.to_owned());
        let item = HashMap::from([
            ("count".to_owned(), n("1")),
            ("holder:arn:x".to_owned(), n("5")),
        ]);
        assert_eq!(read_item(&item), (vec!["arn:x".to_owned()], None));
        let item = HashMap::from([
            ("count".to_owned(), n("2")),
            ("holder:arn:x".to_owned(), n("5")),
        ]);
        assert!(read_item(&item).1.is_some());
    }
}
