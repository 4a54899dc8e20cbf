//! The functions' metrics, without an API call: CloudWatch embedded metric format (EMF) lines,
//! JSON objects of their own on stdout among the JSON logs, from which CloudWatch Logs extracts
//! the metrics (the functions need no `cloudwatch:PutMetricData`).
//!
//! [`CATALOGUE`] is every metric the functions write, with its unit and dimensions: the
//! dashboard in template.yaml plots only these (`.ci/check_template.py dashboard` reads this
//! table), and docs/operations.md prices them. Each custom metric is one metric name with one set of
//! dimension values, so a lock costs one metric per name below (and per outcome for
//! `Acquisitions`) in each hour it is written.

use std::io::Write as _;
use std::sync::{Arc, Mutex};

use semaphore_core::{HandOff, LockName, TakenBackSlot};

use crate::error::HandlerError;
use serde_json::{json, Map, Value};

/// `METRIC_NAMESPACE` when unset.
pub const DEFAULT_NAMESPACE: &str = "StepFunctionsSemaphore";

/// The dimension naming the lock.
pub const LOCK: &str = "Lock";
/// The dimension naming an acquisition's outcome.
pub const OUTCOME: &str = "Outcome";
/// The dimension naming the function that wrote a [`FAILURES`] line, and its values (each
/// `pub const <NAME>_FUNCTION`: `.ci/check_template.py dashboard` reads them and wants an
/// alarm on each).
pub const FUNCTION: &str = "Function";
pub const ACQUIRE_FUNCTION: &str = "acquire";
pub const RELEASE_FUNCTION: &str = "release";

/// EMF allows at most 100 values for one metric in one line.
pub const MAX_VALUES: usize = 100;

/// A metric's CloudWatch unit, serialized as its name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum Unit {
    Count,
    Milliseconds,
    Seconds,
    Bytes,
}

/// One metric the functions write: its name, unit and dimension sets (each one a metric).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Metric {
    pub name: &'static str,
    pub unit: Unit,
    pub dimensions: &'static [&'static [&'static str]],
}

// The catalogue, one `Metric { name, unit, dimensions }` literal each with the dimension
// names spelled out: `.ci/check_template.py dashboard` parses these literals.
/// Acquire answers and hand-off grants, one per acquisition: `Outcome` is `acquired`,
/// `already_held`, `full`, `rate_limited`, `expired`, `fenced`, `queued`, `timed_out` (the
/// acquire function) or `granted` (a hand-off).
pub const ACQUISITIONS: Metric = Metric {
    name: "Acquisitions",
    unit: Unit::Count,
    dimensions: &[&["Lock", "Outcome"]],
};
/// The weight held after a write that admitted (acquire, grant) or freed (release).
pub const WEIGHT_USED: Metric = Metric {
    name: "WeightUsed",
    unit: Unit::Count,
    dimensions: &[&["Lock"]],
};
/// The lock's limit (the last admitted acquisition's) after the same writes.
pub const LIMIT: Metric = Metric {
    name: "Limit",
    unit: Unit::Count,
    dimensions: &[&["Lock"]],
};
/// The waiters in line after an acquire, release, cleanup or grant.
pub const WAITING: Metric = Metric {
    name: "Waiting",
    unit: Unit::Count,
    dimensions: &[&["Lock"]],
};
/// From when an execution first asked to when it held its slot.
pub const WAIT_TIME: Metric = Metric {
    name: "WaitTime",
    unit: Unit::Milliseconds,
    dimensions: &[&["Lock"]],
};
/// From the write that freed a slot to the waiter it was handed to taking it.
pub const HAND_OFF_LATENCY: Metric = Metric {
    name: "HandOffLatency",
    unit: Unit::Milliseconds,
    dimensions: &[&["Lock"]],
};
/// How long a slot was held, when released, cleaned up or reclaimed.
pub const TIME_HELD: Metric = Metric {
    name: "TimeHeld",
    unit: Unit::Milliseconds,
    dimensions: &[&["Lock"]],
};
/// Slots the cleanup function freed (their execution ended without its release).
pub const SLOTS_FREED_BY_CLEANUP: Metric = Metric {
    name: "SlotsFreedByCleanup",
    unit: Unit::Count,
    dimensions: &[&["Lock"]],
};
/// Slots the sweeper reclaimed; without a dimension, every lock's, once per sweep (the alarm's).
pub const RECLAIMED_SLOTS: Metric = Metric {
    name: "ReclaimedSlots",
    unit: Unit::Count,
    dimensions: &[&["Lock"]],
};
pub const RECLAIMED_SLOTS_TOTAL: Metric = Metric {
    name: "ReclaimedSlots",
    unit: Unit::Count,
    dimensions: &[&[]],
};
/// Slots taken back because their lease passed unrenewed (F13), by whichever function's write
/// took them back (an acquire or a grant that found the lock full, a sweep).
pub const LEASES_TAKEN_BACK: Metric = Metric {
    name: "LeasesTakenBack",
    unit: Unit::Count,
    dimensions: &[&["Lock"]],
};
/// Waiters taken out of line because their execution had ended (cleanup, sweeper, hand-off).
pub const DEAD_WAITERS_REMOVED: Metric = Metric {
    name: "DeadWaitersRemoved",
    unit: Unit::Count,
    dimensions: &[&["Lock"]],
};
/// How long the first waiter in line has waited, at each sweep, in seconds (as the alarm's
/// threshold parameter); without a dimension, the oldest of every lock's (0 when nobody waits:
/// the alarm's).
pub const OLDEST_WAITER_AGE: Metric = Metric {
    name: "OldestWaiterAge",
    unit: Unit::Seconds,
    dimensions: &[&["Lock"]],
};
pub const OLDEST_WAITER_AGE_TOTAL: Metric = Metric {
    name: "OldestWaiterAge",
    unit: Unit::Seconds,
    dimensions: &[&[]],
};
/// The biggest semaphore item, once per sweep: what each write of the busiest lock costs.
pub const LARGEST_ITEM_BYTES: Metric = Metric {
    name: "LargestItemBytes",
    unit: Unit::Bytes,
    dimensions: &[&[]],
};

/// Slots of ended executions a sweep kept because it could not judge them (their history is
/// too long to read back to the run that took them), once per sweep (0 when none): each is also
/// a `not_judged` notice; someone must look.
pub const SLOTS_NOT_JUDGED: Metric = Metric {
    name: "SlotsNotJudged",
    unit: Unit::Count,
    dimensions: &[&[]],
};

/// Invocations of the acquire or release function answered with a failure, not an answer
/// (`crate::error_type::ANSWERS`): the semaphore could not do what it was asked. Written only
/// when one happens. The stack's alarms on the two functions watch this, not Lambda's `Errors`,
/// which counts every named answer alike (a poller in line is told `SemaphoreBusy` at every
/// poll).
pub const FAILURES: Metric = Metric {
    name: "Failures",
    unit: Unit::Count,
    dimensions: &[&["Function"]],
};

/// Every metric the functions write.
pub const CATALOGUE: &[Metric] = &[
    ACQUISITIONS,
    WEIGHT_USED,
    LIMIT,
    WAITING,
    WAIT_TIME,
    HAND_OFF_LATENCY,
    TIME_HELD,
    SLOTS_FREED_BY_CLEANUP,
    RECLAIMED_SLOTS,
    RECLAIMED_SLOTS_TOTAL,
    LEASES_TAKEN_BACK,
    DEAD_WAITERS_REMOVED,
    OLDEST_WAITER_AGE,
    OLDEST_WAITER_AGE_TOTAL,
    LARGEST_ITEM_BYTES,
    SLOTS_NOT_JUDGED,
    FAILURES,
];

/// One EMF line being built: dimension values and metric values.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Line {
    dimensions: Vec<(&'static str, String)>,
    values: Vec<(Metric, Vec<f64>)>,
}

impl Line {
    /// A line about `lock`.
    pub fn of(lock: &LockName) -> Self {
        Self::default().dimension(LOCK, lock.as_str())
    }

    /// A line of dimensionless metrics.
    pub fn stack_wide() -> Self {
        Self::default()
    }

    pub fn dimension(mut self, name: &'static str, value: &str) -> Self {
        self.dimensions.push((name, value.to_owned()));
        self
    }

    /// One value of `metric`.
    pub fn value(self, metric: Metric, value: impl Into<f64>) -> Self {
        self.values(metric, [value.into()])
    }

    /// Values of `metric` (none: the metric is left out; beyond [`MAX_VALUES`]: the rest are
    /// dropped, as EMF allows no more).
    pub fn values(mut self, metric: Metric, values: impl IntoIterator<Item = f64>) -> Self {
        let values: Vec<f64> = values.into_iter().take(MAX_VALUES).collect();
        if !values.is_empty() {
            self.values.push((metric, values));
        }
        self
    }

    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }

    /// The line as CloudWatch reads it, in `namespace` at `timestamp_ms`: one directive per
    /// dimension set, every dimension and metric a member of the object.
    pub fn render(&self, namespace: &str, timestamp_ms: u64) -> String {
        let mut directives: Vec<(Vec<Vec<&str>>, Vec<Value>)> = Vec::new();
        let mut root = Map::new();
        for (metric, values) in &self.values {
            let sets: Vec<Vec<&str>> = metric.dimensions.iter().map(|set| set.to_vec()).collect();
            let declared = json!({"Name": metric.name, "Unit": metric.unit});
            match directives.iter_mut().find(|(d, _)| *d == sets) {
                Some((_, metrics)) => metrics.push(declared),
                None => directives.push((sets, vec![declared])),
            }
            let value = match values.as_slice() {
                [one] => number(*one),
                many => Value::Array(many.iter().copied().map(number).collect()),
            };
            root.insert(metric.name.to_owned(), value);
        }
        for (name, value) in &self.dimensions {
            let used = directives
                .iter()
                .any(|(sets, _)| sets.iter().any(|set| set.contains(name)));
            if used {
                root.insert((*name).to_owned(), Value::from(value.as_str()));
            }
        }
        let directives: Vec<Value> = directives
            .into_iter()
            .map(|(sets, metrics)| {
                json!({"Namespace": namespace, "Dimensions": sets, "Metrics": metrics})
            })
            .collect();
        root.insert(
            "_aws".to_owned(),
            json!({"Timestamp": timestamp_ms, "CloudWatchMetrics": directives}),
        );
        Value::Object(root).to_string()
    }
}

/// A whole number as an integer (as a count reads), anything else as it is.
fn number(value: f64) -> Value {
    const EXACT: f64 = 9_007_199_254_740_992.0; // 2^53: every integer below is an f64
    if value.fract() == 0.0 && (0.0..EXACT).contains(&value) {
        Value::from(value as u64)
    } else {
        Value::from(value)
    }
}

/// Where the lines go.
#[derive(Debug, Clone, Default)]
enum Sink {
    /// Written nowhere (`semctl`, and callers that set none).
    #[default]
    Off,
    Stdout,
    /// Kept, for a test to read what the function wrote.
    Kept(Arc<Mutex<Vec<String>>>),
}

/// Writes a function's metric lines in its namespace (`METRIC_NAMESPACE`); the default writes
/// none.
#[derive(Debug, Clone, Default)]
pub struct Metrics {
    namespace: String,
    sink: Sink,
}

impl Metrics {
    /// Lines on stdout, in `namespace`: what the functions do.
    pub fn stdout(namespace: impl Into<String>) -> Self {
        Self {
            namespace: namespace.into(),
            sink: Sink::Stdout,
        }
    }

    /// Lines kept in memory, in the default namespace, and the list they are kept in.
    pub fn kept() -> (Self, Arc<Mutex<Vec<String>>>) {
        let lines = Arc::new(Mutex::new(Vec::new()));
        let metrics = Self {
            namespace: DEFAULT_NAMESPACE.to_owned(),
            sink: Sink::Kept(lines.clone()),
        };
        (metrics, lines)
    }

    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// Writes `line` stamped `timestamp_ms` (nothing when it holds no value). A line that
    /// cannot be written is lost, never an error of the operation it describes.
    pub fn emit(&self, timestamp_ms: u64, line: &Line) {
        if line.is_empty() {
            return;
        }
        match &self.sink {
            Sink::Off => {}
            Sink::Stdout => {
                let text = line.render(&self.namespace, timestamp_ms);
                // One write of the whole line, so that no log line interleaves with it.
                let _ = std::io::stdout()
                    .lock()
                    .write_all(format!("{text}\n").as_bytes());
            }
            Sink::Kept(lines) => lines
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(line.render(&self.namespace, timestamp_ms)),
        }
    }

    /// The lines of the slots `taken` back ([`taken_back_lines`]).
    pub fn taken_back(&self, taken: &[TakenBackSlot], now_ms: u64) {
        for line in taken_back_lines(taken) {
            self.emit(now_ms, &line);
        }
    }

    /// The `Failures` line of `function` (a `*_FUNCTION`) when its invocation's `answer` is a
    /// failure ([`failure_line`]); nothing for a success or an answer.
    pub fn answered<T>(
        &self,
        function: &'static str,
        answer: &Result<T, HandlerError>,
        now_ms: u64,
    ) {
        if let Err(e) = answer {
            self.emit(now_ms, &failure_line(function, e));
        }
    }

    /// The line of a hand-off on `lock` ([`hand_off_line`]).
    pub fn hand_off(&self, lock: &LockName, report: &HandOff, now_ms: u64) {
        self.emit(now_ms, &hand_off_line(lock, report));
    }
}

/// `Failures` 1 for `function` when `error` is a failure ([`HandlerError::is_failure`]); empty
/// for an answer.
pub fn failure_line(function: &'static str, error: &HandlerError) -> Line {
    let line = Line::stack_wide().dimension(FUNCTION, function);
    if error.is_failure() {
        line.value(FAILURES, 1)
    } else {
        line
    }
}

/// The line a hand-off on `lock` makes: its grants (`Acquisitions` "granted", each one's wait
/// and hand-off latency, the lock after the last grant) and the dead waiters it skipped or
/// freed; empty when it did neither.
pub fn hand_off_line(lock: &LockName, report: &HandOff) -> Line {
    let mut line = Line::of(lock).dimension(OUTCOME, "granted");
    if !report.woken.is_empty() {
        line = line.value(ACQUISITIONS, report.woken.len() as f64);
    }
    line = line
        .values(
            WAIT_TIME,
            report
                .wakes
                .iter()
                .map(|w| w.woken_at_ms.saturating_sub(w.queued_at_ms) as f64),
        )
        .values(
            HAND_OFF_LATENCY,
            report
                .wakes
                .iter()
                .map(|w| w.woken_at_ms.saturating_sub(w.freed_at_ms) as f64),
        );
    if let Some(last) = report.wakes.last() {
        line = line
            .value(WEIGHT_USED, last.used as f64)
            .values(LIMIT, last.limit.map(|l| f64::from(l.get())))
            .value(WAITING, last.waiting as f64);
    }
    let dead = report.skipped.len() + report.freed.len();
    if dead > 0 {
        line = line.value(DEAD_WAITERS_REMOVED, dead as f64);
    }
    line
}

/// One line per lock of `taken`: its `LeasesTakenBack` and how long each slot was held.
pub fn taken_back_lines(taken: &[TakenBackSlot]) -> Vec<Line> {
    let mut locks: Vec<&LockName> = taken.iter().map(|slot| &slot.lock).collect();
    locks.sort();
    locks.dedup();
    locks
        .into_iter()
        .map(|lock| {
            let slots = || taken.iter().filter(move |slot| &slot.lock == lock);
            Line::of(lock)
                .value(LEASES_TAKEN_BACK, slots().count() as f64)
                .values(
                    TIME_HELD,
                    slots().map(|slot| {
                        slot.taken_at_ms.saturating_sub(slot.holding.acquired_at_ms) as f64
                    }),
                )
        })
        .collect()
}

/// Why a line is not EMF as the specification defines it.
#[derive(Debug, thiserror::Error)]
pub enum EmfError {
    #[error("not JSON: {0}")]
    NotJson(#[from] serde_json::Error),
    /// A part of the document missing or of the wrong shape, as it reads ("no _aws object").
    #[error("{0}")]
    Shape(&'static str),
    #[error("a directive's Namespace is {0:?}")]
    Namespace(Value),
    #[error("dimension {0} is not a string member")]
    Dimension(String),
    #[error("a directive declares {0} metrics")]
    MetricCount(usize),
    #[error("metric {0} has no Unit")]
    NoUnit(String),
    #[error("metric {0} is not a number or array of numbers member")]
    Metric(String),
}

/// The document of an EMF line, or why the line is not EMF.
pub fn check_emf(line: &str) -> Result<Value, EmfError> {
    use EmfError::Shape;
    let doc: Value = serde_json::from_str(line)?;
    let root = doc.as_object().ok_or(Shape("not a JSON object"))?;
    let aws = root
        .get("_aws")
        .and_then(Value::as_object)
        .ok_or(Shape("no _aws object"))?;
    if !aws.get("Timestamp").is_some_and(Value::is_u64) {
        return Err(Shape("_aws.Timestamp is not a number of milliseconds"));
    }
    let directives = aws
        .get("CloudWatchMetrics")
        .and_then(Value::as_array)
        .ok_or(Shape("_aws.CloudWatchMetrics is not an array"))?;
    if directives.is_empty() {
        return Err(Shape("_aws.CloudWatchMetrics is empty"));
    }
    for directive in directives {
        let namespace = directive["Namespace"].as_str().unwrap_or_default();
        if namespace.is_empty() || namespace.len() > 255 {
            return Err(EmfError::Namespace(directive["Namespace"].clone()));
        }
        let sets = directive["Dimensions"]
            .as_array()
            .ok_or(Shape("a directive has no Dimensions array"))?;
        for set in sets {
            let names = set
                .as_array()
                .ok_or(Shape("a dimension set is not an array"))?;
            if names.len() > 30 {
                return Err(Shape("a dimension set names more than 30 dimensions"));
            }
            for name in names {
                let name = name
                    .as_str()
                    .ok_or(Shape("a dimension name is not a string"))?;
                if !root.get(name).is_some_and(Value::is_string) {
                    return Err(EmfError::Dimension(name.to_owned()));
                }
            }
        }
        let metrics = directive["Metrics"]
            .as_array()
            .ok_or(Shape("a directive has no Metrics array"))?;
        if metrics.is_empty() || metrics.len() > 100 {
            return Err(EmfError::MetricCount(metrics.len()));
        }
        for metric in metrics {
            let name = metric["Name"]
                .as_str()
                .ok_or(Shape("a metric has no Name"))?;
            if metric["Unit"].as_str().is_none() {
                return Err(EmfError::NoUnit(name.to_owned()));
            }
            let ok = match root.get(name) {
                Some(Value::Number(_)) => true,
                Some(Value::Array(values)) => {
                    !values.is_empty()
                        && values.len() <= MAX_VALUES
                        && values.iter().all(Value::is_number)
                }
                _ => false,
            };
            if !ok {
                return Err(EmfError::Metric(name.to_owned()));
            }
        }
    }
    Ok(doc)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_groups_its_metrics_by_dimension_set_and_names_only_what_it_uses() {
        let lock = LockName::new("demo-lock").unwrap();
        let line = Line::of(&lock)
            .dimension(OUTCOME, "acquired")
            .value(ACQUISITIONS, 1)
            .value(WEIGHT_USED, 3)
            .values(WAIT_TIME, [12.0, 40.0])
            .render("NS", 1_700_000_000_000);
        let doc = check_emf(&line).unwrap();
        assert_eq!(
            doc,
            json!({
                "_aws": {"Timestamp": 1_700_000_000_000u64, "CloudWatchMetrics": [
                    {"Namespace": "NS", "Dimensions": [["Lock", "Outcome"]],
                     "Metrics": [{"Name": "Acquisitions", "Unit": "Count"}]},
                    {"Namespace": "NS", "Dimensions": [["Lock"]],
                     "Metrics": [{"Name": "WeightUsed", "Unit": "Count"},
                                 {"Name": "WaitTime", "Unit": "Milliseconds"}]}
                ]},
                "Lock": "demo-lock", "Outcome": "acquired",
                "Acquisitions": 1, "WeightUsed": 3, "WaitTime": [12, 40]
            })
        );
        // Without Acquisitions, the Outcome dimension is not written.
        let line = Line::of(&lock)
            .dimension(OUTCOME, "granted")
            .value(WAITING, 0);
        let doc = check_emf(&line.render("NS", 1)).unwrap();
        assert!(doc.get("Outcome").is_none(), "{doc}");
        assert!(Line::of(&lock).is_empty());
    }

    #[test]
    fn the_check_refuses_what_the_specification_refuses() {
        let good = Line::stack_wide()
            .value(LARGEST_ITEM_BYTES, 9)
            .render("NS", 5);
        assert!(check_emf(&good).is_ok());
        let mut doc: Value = serde_json::from_str(&good).unwrap();
        doc.as_object_mut().unwrap().remove("LargestItemBytes");
        assert!(matches!(
            check_emf(&doc.to_string()),
            Err(EmfError::Metric(name)) if name == "LargestItemBytes"
        ));
        let missing_dim = json!({"_aws": {"Timestamp": 1, "CloudWatchMetrics": [
            {"Namespace": "NS", "Dimensions": [["Lock"]], "Metrics": [{"Name": "M", "Unit": "Count"}]}
        ]}, "M": 1});
        assert!(matches!(
            check_emf(&missing_dim.to_string()),
            Err(EmfError::Dimension(name)) if name == "Lock"
        ));
        let no_stamp = json!({"_aws": {"CloudWatchMetrics": []}});
        assert!(check_emf(&no_stamp.to_string()).is_err());
        assert!(matches!(check_emf("not json"), Err(EmfError::NotJson(_))));
    }

    #[test]
    fn values_beyond_what_emf_allows_are_dropped() {
        let lock = LockName::new("l").unwrap();
        let line = Line::of(&lock).values(TIME_HELD, (0..150).map(f64::from));
        let doc = check_emf(&line.render("NS", 1)).unwrap();
        assert_eq!(doc["TimeHeld"].as_array().unwrap().len(), MAX_VALUES);
    }

    #[test]
    fn a_failure_is_counted_for_its_function_and_an_answer_is_not() {
        let store = HandlerError::Store("table gone".to_owned());
        let doc = check_emf(&failure_line(RELEASE_FUNCTION, &store).render("NS", 3)).unwrap();
        assert_eq!(
            doc,
            json!({
                "_aws": {"Timestamp": 3, "CloudWatchMetrics": [
                    {"Namespace": "NS", "Dimensions": [["Function"]],
                     "Metrics": [{"Name": "Failures", "Unit": "Count"}]}
                ]},
                "Function": "release", "Failures": 1
            })
        );
        let busy = HandlerError::Busy("in line".to_owned());
        assert!(failure_line(ACQUIRE_FUNCTION, &busy).is_empty());
        let (metrics, kept) = Metrics::kept();
        metrics.answered(ACQUIRE_FUNCTION, &Ok::<(), _>(()), 1);
        metrics.answered::<()>(ACQUIRE_FUNCTION, &Err(busy), 2);
        assert!(kept.lock().unwrap().is_empty());
        metrics.answered::<()>(ACQUIRE_FUNCTION, &Err(store), 4);
        let lines = kept.lock().unwrap().clone();
        assert_eq!(lines.len(), 1, "{lines:?}");
        assert_eq!(check_emf(&lines[0]).unwrap()["Function"], "acquire");
    }

    #[test]
    fn every_metric_name_has_one_unit() {
        for a in CATALOGUE {
            for b in CATALOGUE {
                if a.name == b.name {
                    assert_eq!(a.unit, b.unit, "{}", a.name);
                }
            }
        }
    }
}
