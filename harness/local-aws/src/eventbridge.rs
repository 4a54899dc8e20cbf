//! Plays EventBridge: each ended execution becomes the documented "Step Functions Execution
//! Status Change" event; an event that matches the template's rule is delivered to its target
//! (the cleanup state machine) — imperfectly on purpose: a share is dropped, some are delivered
//! twice, some late. Retries of the real service are not played: a dropped event is one that
//! EventBridge never managed to deliver, which is what the sweeper is for. What the target gets
//! is what EventBridge would send it: the event through the rule's `InputTransformer`, when the
//! template gives one ([`InputTransformer::apply`]); a delivery the target refuses (the local
//! server enforces StartExecution's 256 KB input) is counted as a dead letter.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use aws_sdk_sfn::error::DisplayErrorContext;
use serde::Serialize;
use serde_json::{json, Value};
use tokio::sync::mpsc;

use crate::Error;

/// An execution as DescribeExecution tells it (`crate::sfn::describe`); once it ended, what its
/// status event is made from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ended {
    pub arn: String,
    pub machine_arn: String,
    pub name: String,
    pub status: String,
    pub start_ms: i64,
    /// 0 while it runs.
    pub stop_ms: i64,
    pub input: Option<String>,
    /// Not put in the status event: its `output` is null here (the cleanup reads none).
    pub output: Option<String>,
    pub error: Option<String>,
    pub cause: Option<String>,
}

impl Ended {
    /// The execution's output as JSON (`Null` when it has none).
    pub fn output_json(&self) -> Value {
        crate::sfn::json_of(self.output.as_deref())
    }
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
    /// Every ended execution played, (its end in epoch ms, its ARN, its status), and every
    /// delivery made, (when, the ARN): the failures, stops and cleanups of the run's picture.
    #[serde(skip)]
    pub ended: Vec<(i64, String, String)>,
    #[serde(skip)]
    pub delivered: Vec<(i64, String)>,
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

/// A rule target's `InputTransformer` (EventBridge API reference, "InputTransformer"; user
/// guide, "Amazon EventBridge input transformation"): variables from JSON paths of the event in
/// dot notation, put into a template as `<name>`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize)]
pub struct InputTransformer {
    pub paths: BTreeMap<String, String>,
    pub template: String,
}

impl InputTransformer {
    /// What EventBridge sends the target for `event`. A placeholder inside a JSON string takes
    /// the value's text (a string without its quotes, escaped for the string it is in); outside
    /// one, the value as JSON (strings quoted), as in the API reference's example
    /// `{"myInstance": <instance>, "myStatus": "<instance> is in state \"<status>\""}`. A path
    /// the event does not have creates no variable (the user guide's tutorial): its placeholder
    /// stays as written, which here is a delivery error, as the target would refuse it. A
    /// template that is not a JSON object is text: values go in as text, and it is delivered
    /// as a JSON string.
    pub fn apply(&self, event: &Value) -> Result<Value, Error> {
        let mut variables = BTreeMap::new();
        for (name, path) in &self.paths {
            if let Some(value) = json_path(event, path)? {
                variables.insert(name.as_str(), value);
            }
        }
        let json_template = self.template.trim_start().starts_with('{');
        let mut out = String::with_capacity(self.template.len());
        let mut in_string = false;
        let mut escaped = false;
        let mut rest = self.template.as_str();
        while let Some(c) = rest.chars().next() {
            if c == '<' {
                if let Some(end) = rest.find('>') {
                    if let Some(value) = variables.get(&rest[1..end]) {
                        let json = value.to_string();
                        if !json_template {
                            match value {
                                Value::String(text) => out.push_str(text),
                                _ => out.push_str(&json),
                            }
                        } else if !in_string {
                            out.push_str(&json);
                        } else if let Value::String(text) = value {
                            let quoted = Value::String(text.clone()).to_string();
                            out.push_str(&quoted[1..quoted.len() - 1]);
                        } else {
                            let quoted = Value::String(json).to_string();
                            out.push_str(&quoted[1..quoted.len() - 1]);
                        }
                        rest = &rest[end + 1..];
                        escaped = false;
                        continue;
                    }
                }
            }
            match c {
                '\\' if in_string => escaped = !escaped,
                '"' if !escaped => in_string = !in_string,
                _ => escaped = false,
            }
            out.push(c);
            rest = &rest[c.len_utf8()..];
        }
        if json_template {
            serde_json::from_str(&out).map_err(|e| {
                Error::Event(format!(
                    "the input transformer made no JSON ({e}), as the target would get it: {out}"
                ))
            })
        } else {
            Ok(Value::String(out))
        }
    }
}

/// A JSON path in dot notation (`$`, `$.detail.status`, `$.detail-type`), as EventBridge
/// supports them for the transformer; `None` when the event has no such field.
fn json_path<'a>(event: &'a Value, path: &str) -> Result<Option<&'a Value>, Error> {
    let rest = path
        .strip_prefix('$')
        .ok_or_else(|| Error::Event(format!("input path {path:?} does not start with $")))?;
    let mut at = event;
    for key in rest.split('.').skip(1) {
        match at.get(key) {
            Some(next) => at = next,
            None => return Ok(None),
        }
    }
    if !rest.is_empty() && !rest.starts_with('.') {
        return Err(Error::Event(format!(
            "input path {path:?}: only dot notation is emulated"
        )));
    }
    Ok(Some(at))
}

/// The text a target is sent for `event`: the event, or what the transformer makes of it.
pub fn target_input(
    transformer: Option<&InputTransformer>,
    event: &Value,
) -> Result<String, Error> {
    Ok(match transformer.map(|t| t.apply(event)).transpose()? {
        None => event.to_string(),
        Some(Value::String(text)) => text,
        Some(input) => input.to_string(),
    })
}

/// Where a matching event goes.
pub enum Target {
    /// Start the rule's target state machine with the event as input (through the target's
    /// input transformer, if it has one), as EventBridge does.
    StateMachine {
        client: aws_sdk_sfn::Client,
        arn: String,
        transformer: Option<InputTransformer>,
    },
    /// The sample mode: the original sample's cleanup, run directly.
    Sample {
        protocol: Arc<crate::sample::Sample>,
        lock: String,
    },
}

impl Target {
    async fn deliver(&self, event: &Value, delivery_name: &str) -> Result<(), Error> {
        match self {
            Target::StateMachine {
                client,
                arn,
                transformer,
            } => {
                let input = target_input(transformer.as_ref(), event)?;
                crate::sfn::start_execution(client, arn, delivery_name, input).await?;
                Ok(())
            }
            Target::Sample { protocol, lock } => {
                let holder = event["detail"]["executionArn"]
                    .as_str()
                    .ok_or_else(|| Error::Event("no detail.executionArn".to_owned()))?;
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
                let played = (ended.stop_ms, ended.arn.clone(), ended.status.clone());
                stats.ended.push(played);
                if let Some(pattern) = &pattern {
                    if !matches(pattern, &event) {
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
                    let (arn, event, target, stats, pending) = (
                        ended.arn.clone(),
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
                            match result {
                                Ok(()) => stats.delivered.push((crate::poller::now_ms(), arn)),
                                Err(e) => {
                                    stats.delivery_errors += 1;
                                    let e = DisplayErrorContext(e);
                                    eprintln!("event delivery {name} failed: {e}");
                                }
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

/// Does `event` match the EventBridge `pattern`? Supports what rule patterns of this kind use:
/// nested objects, lists of exact values (strings, numbers, booleans, null), and the content
/// filters `{"prefix": "..."}` and `{"anything-but": [...]}` (EventBridge's "Content filtering in
/// Amazon EventBridge event patterns"); any other filter matches nothing, so a pattern this
/// does not understand fails a test rather than passing one.
pub fn matches(pattern: &Value, event: &Value) -> bool {
    match pattern {
        Value::Object(fields) => fields.iter().all(|(key, want)| {
            let got = event.get(key).unwrap_or(&Value::Null);
            match want {
                Value::Object(_) => matches(want, got),
                Value::Array(options) => options.iter().any(|o| match got {
                    Value::Array(items) => items.iter().any(|item| matches_one(o, item)),
                    single => matches_one(o, single),
                }),
                exact => got == exact,
            }
        }),
        _ => false,
    }
}

/// One option of a pattern's list against one value of the event.
fn matches_one(option: &Value, got: &Value) -> bool {
    let Value::Object(filter) = option else {
        return option == got;
    };
    match (
        filter.get("prefix"),
        filter.get("anything-but"),
        filter.len(),
    ) {
        (Some(Value::String(prefix)), None, 1) => {
            got.as_str().is_some_and(|g| g.starts_with(prefix.as_str()))
        }
        (None, Some(Value::Array(excluded)), 1) => !got.is_null() && !excluded.contains(got),
        (None, Some(excluded), 1) if !excluded.is_object() => !got.is_null() && got != excluded,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The cleanup rule's transformer, as the deployed stack has it.
    fn cleanup_rule_transformer() -> InputTransformer {
        let rule = &crate::stack::tests::deployed().rule;
        assert!(
            rule.dead_letter_queue
                .as_deref()
                .is_some_and(|q| q.contains(":sqs:") && q.contains("CleanupEventsDeadLetterQueue")),
            "the rule has a dead-letter queue: {rule:?}"
        );
        rule.transformer
            .clone()
            .expect("the rule transforms the event")
    }

    #[test]
    fn rule_patterns_match_like_eventbridge() {
        let pattern = json!({
            "source": ["aws.states"],
            "detail": {"status": ["FAILED", "ABORTED"], "stateMachineArn": ["m"]}
        });
        let event = |status: &str, machine: &str| json!({"source": "aws.states", "detail": {"status": status, "stateMachineArn": machine}});
        assert!(matches(&pattern, &event("FAILED", "m")));
        assert!(matches(&pattern, &event("ABORTED", "m")));
        assert!(!matches(&pattern, &event("SUCCEEDED", "m")));
        assert!(!matches(&pattern, &event("FAILED", "other")));
        // A prefix (ProtectedStateMachinePrefix), beside exact values.
        let prefixed = json!({"detail": {"stateMachineArn": ["m", {"prefix": "team-"}]}});
        assert!(matches(&prefixed, &event("FAILED", "team-orders")));
        assert!(matches(&prefixed, &event("FAILED", "team-")));
        assert!(matches(&prefixed, &event("FAILED", "m")));
        assert!(!matches(&prefixed, &event("FAILED", "my-team-orders")));
        // Every machine but one ("*": not the cleanup machine itself); a missing field is not
        // "anything but".
        let every = json!({"detail": {"stateMachineArn": [{"anything-but": ["cleanup"]}]}});
        assert!(matches(&every, &event("FAILED", "any")));
        assert!(!matches(&every, &event("FAILED", "cleanup")));
        assert!(!matches(&every, &json!({"detail": {}})));
        // A filter this matcher does not know matches nothing.
        let numeric = json!({"detail": {"stateMachineArn": [{"numeric": [">", 0]}]}});
        assert!(!matches(&numeric, &event("FAILED", "m")));
    }

    /// An ended execution whose input is `items` times `"ab"` in a list: 5 bytes each as JSON,
    /// 7 once escaped into the event's `input` text.
    fn ended_with_input(items: usize) -> Ended {
        Ended {
            arn: "arn:aws:states:us-east-1:123456789012:execution:m:big".to_owned(),
            machine_arn: "arn:aws:states:us-east-1:123456789012:stateMachine:m".to_owned(),
            name: "big".to_owned(),
            status: "FAILED".to_owned(),
            start_ms: 1_551_225_014_968,
            stop_ms: 1_551_225_017_576,
            input: Some(json!({"pad": vec!["ab"; items]}).to_string()),
            output: None,
            error: Some("States.TaskFailed".to_owned()),
            cause: Some("a \"quoted\" <cause>".to_owned()),
        }
    }

    #[test]
    fn the_transformer_puts_values_in_as_eventbridge_does() {
        let event = status_change_event(&ended_with_input(1), "us-east-1", "1", "id-1");
        let paths = |pairs: &[(&str, &str)]| {
            pairs
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect()
        };
        let t = InputTransformer {
            paths: paths(&[
                ("status", "$.detail.status"),
                ("stop", "$.detail.stopDate"),
                ("cause", "$.detail.cause"),
                ("type", "$.detail-type"),
            ]),
            template: r#"{"s": <status>, "n": <stop>, "c": <cause>, "text": "<status> at <stop>: <cause>", "t": <type>, "kept": "<other>"}"#.to_owned(),
        };
        assert_eq!(
            t.apply(&event).unwrap(),
            json!({
                "s": "FAILED", "n": 1_551_225_017_576i64, "c": "a \"quoted\" <cause>",
                "text": "FAILED at 1551225017576: a \"quoted\" <cause>",
                "t": "Step Functions Execution Status Change", "kept": "<other>"
            })
        );
        // A text template is delivered as text.
        let text = InputTransformer {
            paths: paths(&[("status", "$.detail.status")]),
            template: "ended <status>".to_owned(),
        };
        assert_eq!(text.apply(&event).unwrap(), json!("ended FAILED"));
        // A path the event lacks creates no variable: its placeholder stays, no JSON results.
        let missing = InputTransformer {
            paths: paths(&[("x", "$.detail.nothing")]),
            template: r#"{"x": <x>}"#.to_owned(),
        };
        assert!(missing
            .apply(&event)
            .unwrap_err()
            .to_string()
            .contains("no JSON"));
    }

    #[test]
    fn the_cleanup_gets_only_who_ended_how_and_when() {
        let ended = ended_with_input(40_000);
        let event = status_change_event(&ended, "us-east-1", "123456789012", "id-1");
        let full = target_input(None, &event).unwrap();
        let small = target_input(Some(&cleanup_rule_transformer()), &event).unwrap();
        assert!(full.len() > 262_144, "{} bytes", full.len());
        assert!(small.len() < 1_024, "{} bytes: {small}", small.len());
        let small: Value = serde_json::from_str(&small).unwrap();
        assert_eq!(
            small,
            json!({
                "id": "id-1",
                "time": event["time"],
                "source": "aws.states",
                "detail-type": "Step Functions Execution Status Change",
                "detail": {
                    "executionArn": ended.arn, "stateMachineArn": ended.machine_arn,
                    "name": "big", "status": "FAILED",
                    "startDate": ended.start_ms, "stopDate": ended.stop_ms
                }
            })
        );
        // The cleanup function reads it as the event it is.
        let read = lambda_cleanup::parse_event(small).expect("the cleanup reads it");
        assert_eq!(read.detail.execution_arn, ended.arn);
        assert_eq!(read.detail.stop_date, Some(ended.stop_ms));
        assert_eq!(read.detail.input, None);
    }

    /// #18 item 13 against the local server, which refuses a StartExecution input over 256 KB
    /// as AWS does (local/moto_server.py): the status event of an execution with a 200 KB input
    /// cannot start the cleanup machine as it is, and does through the rule's transformer.
    #[tokio::test]
    async fn a_big_status_event_starts_the_cleanup_machine_only_through_the_transformer() {
        let sfn = crate::sfn::client();
        let machine = crate::sfn::create_machine(
            &sfn,
            &crate::sfn::unique("cleanup-stand-in"),
            &json!({"StartAt": "P", "States": {"P": {"Type": "Pass", "End": true}}}),
        )
        .await;
        let event = status_change_event(&ended_with_input(40_000), "us-east-1", "1", "id-1");
        let target = |transformer| Target::StateMachine {
            client: sfn.clone(),
            arn: machine.clone(),
            transformer,
        };
        let refused = target(None)
            .deliver(&event, &crate::sfn::unique("whole"))
            .await
            .unwrap_err();
        let refused = DisplayErrorContext(refused).to_string();
        assert!(
            refused.contains("ValidationException") && refused.contains("262144"),
            "{refused}"
        );
        target(Some(cleanup_rule_transformer()))
            .deliver(&event, &crate::sfn::unique("transformed"))
            .await
            .expect("the transformed event starts the cleanup machine");
        // The limit is the API's, not the event's: an input of 262,144 bytes starts.
        let at_limit = format!("\"{}\"", "x".repeat(262_142));
        sfn.start_execution()
            .state_machine_arn(&machine)
            .name(crate::sfn::unique("at-limit"))
            .input(at_limit)
            .send()
            .await
            .expect("an input of exactly 262,144 bytes is accepted");
    }

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
            output: None,
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
