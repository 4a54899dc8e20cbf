//! Plays EventBridge: each ended execution becomes the documented "Step Functions Execution
//! Status Change" event; an event that matches the template's rule is delivered to its target
//! (the cleanup state machine) — imperfectly on purpose: a share is dropped, some are delivered
//! twice, some late. Retries of the real service are not played: a dropped event is one that
//! EventBridge never managed to deliver, which is what the sweeper is for.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::Serialize;
use serde_json::{json, Value};
use tokio::sync::mpsc;

/// An execution that ended, as DescribeExecution tells it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ended {
    pub arn: String,
    pub machine_arn: String,
    pub name: String,
    pub status: String,
    pub start_ms: i64,
    pub stop_ms: i64,
    pub input: Option<String>,
    pub error: Option<String>,
    pub cause: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EventChaos {
    pub drop: f64,
    pub duplicate: f64,
    pub late: f64,
    /// A late delivery comes 1 s to this much after the event.
    pub late_by: Duration,
}

#[derive(Debug, Default, Clone, Serialize)]
pub struct EventStats {
    /// Status-change events built (one per ended execution).
    pub emitted: u64,
    /// Of those, matching the rule's pattern.
    pub matched: u64,
    pub dropped: u64,
    /// Events delivered twice.
    pub duplicated: u64,
    /// Deliveries held back (late).
    pub late: u64,
    /// Deliveries made (a duplicated event counts twice).
    pub deliveries: u64,
    pub delivery_errors: u64,
}

fn pseudo_uuid(rng: &mut fastrand::Rng) -> String {
    let a = rng.u64(..);
    let b = rng.u64(..);
    format!(
        "{:08x}-{:04x}-4{:03x}-{:04x}-{:012x}",
        a >> 32,
        (a >> 16) & 0xffff,
        a & 0x0fff,
        (b >> 48) & 0x3fff | 0x8000,
        b & 0xffff_ffff_ffff
    )
}

/// The EventBridge event for an ended execution, field for field as the Step Functions
/// documentation shows it.
pub fn status_change_event(ended: &Ended, region: &str, account: &str, id: &str) -> Value {
    json!({
        "version": "0",
        "id": id,
        "detail-type": "Step Functions Execution Status Change",
        "source": "aws.states",
        "account": account,
        "time": semaphore_core::rfc3339_millis(u64::try_from(ended.stop_ms).unwrap_or(0)),
        "region": region,
        "resources": [ended.arn],
        "detail": {
            "executionArn": ended.arn,
            "stateMachineArn": ended.machine_arn,
            "name": ended.name,
            "status": ended.status,
            "startDate": ended.start_ms,
            "stopDate": ended.stop_ms,
            "input": ended.input,
            "inputDetails": {"included": ended.input.is_some()},
            "output": null,
            "outputDetails": null,
            "error": ended.error,
            "cause": ended.cause,
            "stateMachineVersionArn": null,
            "stateMachineAliasArn": null,
            "redriveCount": 0,
            "redriveDate": null,
            "redriveStatus": if ended.status == "ABORTED" || ended.status == "FAILED" || ended.status == "TIMED_OUT" { "REDRIVABLE" } else { "NOT_REDRIVABLE" },
            "redriveStatusReason": null
        }
    })
}

/// Where a matching event goes.
pub enum Target {
    /// Start the rule's target state machine with the event as input, as EventBridge does.
    StateMachine {
        client: aws_sdk_sfn::Client,
        arn: String,
    },
    /// The reference mode: the original sample's cleanup, run directly.
    Reference {
        protocol: Arc<semaphore_tests::reference::SampleProtocol>,
        lock: String,
    },
}

impl Target {
    async fn deliver(&self, event: &Value, delivery_name: &str) -> Result<(), String> {
        match self {
            Target::StateMachine { client, arn } => client
                .start_execution()
                .state_machine_arn(arn)
                .name(delivery_name)
                .input(event.to_string())
                .send()
                .await
                .map(|_| ())
                .map_err(|e| aws_sdk_sfn::error::DisplayErrorContext(e).to_string()),
            Target::Reference { protocol, lock } => {
                let holder = event["detail"]["executionArn"]
                    .as_str()
                    .ok_or("event without executionArn")?;
                protocol.cleanup(lock, holder).await;
                Ok(())
            }
        }
    }
}

pub struct Player {
    pub stats: Arc<Mutex<EventStats>>,
    /// Deliveries not made yet (late ones waiting included).
    pub pending: Arc<AtomicUsize>,
}

impl Player {
    /// Plays every ended execution received on `ended` until the channel closes.
    #[allow(clippy::too_many_arguments)]
    pub fn start(
        mut ended: mpsc::UnboundedReceiver<Ended>,
        pattern: Option<Value>,
        target: Target,
        chaos: EventChaos,
        seed: u64,
        region: String,
        account: String,
    ) -> Self {
        let stats = Arc::new(Mutex::new(EventStats::default()));
        let pending = Arc::new(AtomicUsize::new(0));
        let target = Arc::new(target);
        let (task_stats, task_pending) = (stats.clone(), pending.clone());
        tokio::spawn(async move {
            let mut rng = fastrand::Rng::with_seed(seed);
            let mut serial = 0u64;
            while let Some(ended) = ended.recv().await {
                let id = pseudo_uuid(&mut rng);
                let event = status_change_event(&ended, &region, &account, &id);
                let mut stats = task_stats.lock().expect("event stats");
                stats.emitted += 1;
                if let Some(pattern) = &pattern {
                    if !crate::template::matches(pattern, &event) {
                        continue;
                    }
                }
                stats.matched += 1;
                if rng.f64() < chaos.drop {
                    stats.dropped += 1;
                    continue;
                }
                let copies = if rng.f64() < chaos.duplicate {
                    stats.duplicated += 1;
                    2
                } else {
                    1
                };
                for _ in 0..copies {
                    let delay = if rng.f64() < chaos.late {
                        stats.late += 1;
                        let spread = chaos.late_by.saturating_sub(Duration::from_secs(1));
                        Duration::from_secs(1) + spread.mul_f64(rng.f64())
                    } else {
                        // EventBridge's usual sub-second latency.
                        Duration::from_millis(rng.u64(50..400))
                    };
                    serial += 1;
                    let name = delivery_name(&ended.name, serial);
                    let (event, target, stats, pending) = (
                        event.clone(),
                        target.clone(),
                        task_stats.clone(),
                        task_pending.clone(),
                    );
                    pending.fetch_add(1, Ordering::SeqCst);
                    tokio::spawn(async move {
                        tokio::time::sleep(delay).await;
                        let result = target.deliver(&event, &name).await;
                        {
                            let mut stats = stats.lock().expect("event stats");
                            stats.deliveries += 1;
                            if let Err(e) = result {
                                stats.delivery_errors += 1;
                                eprintln!("event delivery {name} failed: {e}");
                            }
                        }
                        pending.fetch_sub(1, Ordering::SeqCst);
                    });
                }
            }
        });
        Self { stats, pending }
    }

    pub fn stats(&self) -> EventStats {
        self.stats.lock().expect("event stats").clone()
    }
}

/// A unique execution name for a delivery (at most 80 characters).
fn delivery_name(execution: &str, serial: u64) -> String {
    let suffix = format!("-evt{serial}");
    let keep = 80usize.saturating_sub(suffix.len());
    let base: String = execution.chars().take(keep).collect();
    format!("{base}{suffix}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_event_is_the_documented_shape() {
        let ended = Ended {
            arn: "arn:aws:states:us-east-1:123456789012:execution:m:run-1".to_owned(),
            machine_arn: "arn:aws:states:us-east-1:123456789012:stateMachine:m".to_owned(),
            name: "run-1".to_owned(),
            status: "ABORTED".to_owned(),
            start_ms: 1_551_225_014_968,
            stop_ms: 1_551_225_017_576,
            input: Some("{}".to_owned()),
            error: None,
            cause: None,
        };
        let event = status_change_event(&ended, "us-east-1", "123456789012", "id-1");
        assert_eq!(
            event["detail-type"],
            "Step Functions Execution Status Change"
        );
        assert_eq!(event["source"], "aws.states");
        assert_eq!(event["time"], "2019-02-26T23:50:17.576Z");
        assert_eq!(event["resources"][0], ended.arn);
        assert_eq!(event["detail"]["status"], "ABORTED");
        assert_eq!(event["detail"]["stopDate"], 1_551_225_017_576i64);
        assert_eq!(event["detail"]["inputDetails"]["included"], true);
        assert_eq!(delivery_name("run-1", 7), "run-1-evt7");
        assert_eq!(delivery_name(&"x".repeat(100), 1).len(), 80);
        let mut rng = fastrand::Rng::with_seed(1);
        assert_eq!(pseudo_uuid(&mut rng).len(), 36);
    }
}
