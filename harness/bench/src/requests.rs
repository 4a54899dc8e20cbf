//! (a) DynamoDB requests per uncontended critical section (acquire + release), counted exactly
//! by an SDK interceptor, for our protocol as the Lambdas run it and for the AWS sample's.
//!
//! Ours also pays, besides one write per call, a rotation of the lock's fences now and then: a
//! release rotates when a window has passed since the last rotation (or there was none) and the
//! lock's young generation holds at least 8 fences, so at most once per fence window and once
//! per 8 releases. How often depends on how often the lock is used, not on how fast the calls
//! are. So it is measured twice: back to back on the real clock (as fast as the server goes, a
//! few seconds: at most one window), and at fixed rates on a simulated clock (`ManualClock`,
//! still against the server), where the rotations are exactly those the rule predicts.

use semaphore_core::{Claim, Weight};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use local_aws::counter::{Counts, RequestCounter};
use local_aws::names::{self, id, limit};
use local_aws::sample::Sample;
use semaphore_core::{
    AcquireOutcome, Clock, DynamoStore, LockName, ManualClock, ReleaseOutcome, Semaphore,
    SystemClock, Timing,
};
use serde::Serialize;

use crate::common::{execution_arn, uuid};
use crate::rule::{rotations_between, FenceModel, BUSY_YOUNG_FENCES};
use crate::writes::{CountedStore, WriteCounter, WriteTally};

#[derive(Debug, Clone, Serialize)]
pub struct RequestRow {
    pub scenario: String,
    pub proto: &'static str,
    /// Simulated seconds between the starts of two sections; `None`: back to back, real clock.
    pub seconds_between_sections: Option<f64>,
    pub sections: usize,
    pub elapsed_s: f64,
    pub requests_per_section: f64,
    pub get_item: f64,
    pub put_item: f64,
    pub update_item: f64,
    pub failed_conditional_writes: f64,
    /// Fence rotations (ours), per section: each is one more `UpdateItem`.
    pub rotations_per_section: f64,
    pub rotations: u64,
    /// The rotations the rule predicts (simulated clock only): one at each release that finds a
    /// rotation due (a window since the previous one, or none yet) and, its own fence added, at
    /// least 8 young fences.
    pub expected_rotations: Option<u64>,
    /// Every request counted, per operation (`DynamoDB.UpdateItem`, ...), and the protocol's
    /// writes by kind.
    pub requests_by_operation: BTreeMap<String, u64>,
    pub writes: WriteTally,
    #[serde(skip)]
    pub counts: Counts,
    pub vs_sample: f64,
}

/// Makes a new `Semaphore` per call, as each Lambda invocation (or `semctl` process) is its own
/// caller; they share the HTTP client (connections are not what is measured) and the clock.
#[derive(Clone)]
struct Callers {
    counter: RequestCounter,
    client: aws_sdk_dynamodb::Client,
    table: String,
    writes: WriteCounter,
    clock: Arc<dyn Clock>,
}

impl Callers {
    fn fresh(&self) -> Semaphore<CountedStore<DynamoStore>> {
        Semaphore::new(
            self.writes
                .store(DynamoStore::new(self.client.clone(), &self.table)),
        )
        .with_clock(self.clock.clone())
        .with_timing(Timing::default())
    }

    async fn section(&self, lock: &LockName, n: usize) -> Result<()> {
        let who = id(&execution_arn("uncontended", n), &uuid());
        let token = match self.fresh().acquire(lock, &who, limit(5)).await {
            Ok(AcquireOutcome::Acquired { token, .. }) => token,
            other => bail!("uncontended acquire gave {other:?}"),
        };
        let claim = Claim::Slot {
            token,
            weight: Weight::ONE,
        };
        match self.fresh().release(lock, &who, claim).await {
            Ok(ReleaseOutcome::Released { .. }) => Ok(()),
            other => bail!("uncontended release gave {other:?}"),
        }
    }

    /// The row of `sections` sections started at `started`: the requests and writes counted
    /// since the last row.
    fn row(
        &self,
        scenario: String,
        proto: &'static str,
        spacing: Option<Duration>,
        sections: usize,
        started: Instant,
    ) -> RequestRow {
        let elapsed = started.elapsed();
        let (counts, writes) = (self.counter.take(), self.writes.take());
        let per = |n: u64| n as f64 / sections as f64;
        RequestRow {
            scenario,
            proto,
            seconds_between_sections: spacing.map(|d| d.as_secs_f64()),
            sections,
            elapsed_s: elapsed.as_secs_f64(),
            requests_per_section: per(counts.total()),
            get_item: per(counts.get("DynamoDB.GetItem")),
            put_item: per(counts.get("DynamoDB.PutItem")),
            update_item: per(counts.get("DynamoDB.UpdateItem")),
            failed_conditional_writes: per(counts.total_failed()),
            rotations_per_section: per(writes.rotation),
            rotations: writes.rotation,
            expected_rotations: None,
            requests_by_operation: counts.requests.clone(),
            counts,
            writes,
            vs_sample: f64::NAN,
        }
    }
}

/// The rotations of `sections` releases `spacing` apart after the lock's first section (at time
/// 0, one more release; its rotation, if any, is not counted), by the rule (see [`rule`](crate::rule)): a
/// release rotates when a rotation is due (a window since the last one, or none yet) and the
/// young generation, its own fence added, holds at least `busy` fences.
pub fn predicted_rotations(
    sections: usize,
    spacing: Duration,
    window: Duration,
    busy: usize,
) -> u64 {
    let ms = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
    let mut fences = FenceModel::new(ms(window), busy);
    fences.fenced(0);
    let first = fences.rotations;
    for k in 1..=sections as u64 {
        fences.fenced(k * ms(spacing));
    }
    fences.rotations - first
}

/// Whether a lock's first section rotates: its release finds one young fence and no rotation.
pub fn first_section_rotates(busy: usize) -> bool {
    FenceModel::new(u64::MAX, busy).fenced(0)
}

/// What the part measured, and the first section of a lock apart (it creates the item).
pub struct Requests {
    pub rows: Vec<RequestRow>,
    pub first_section: RequestRow,
}

/// `sections` critical sections one after the other on a lock nobody else uses, back to back on
/// the real clock; then `(spacing, sections)` on a simulated clock for each of `rates`; then the
/// sample's.
pub async fn run(
    endpoint: &str,
    table: &str,
    sections: usize,
    rates: &[(Duration, usize)],
) -> Result<Requests> {
    let counter = RequestCounter::new();
    let window = Timing::default().window();
    let mut rows = Vec::new();

    let callers = Callers {
        counter: counter.clone(),
        client: counter.dynamodb_client(endpoint),
        table: table.to_owned(),
        writes: WriteCounter::new(),
        clock: Arc::new(SystemClock),
    };
    let lock = names::lock(&format!("requests-{}", uuid()));
    let started = Instant::now();
    callers.section(&lock, 0).await?;
    let mut first_section = callers.row(
        "ours: the first section on a new lock (creates the item; once per lock)".to_owned(),
        "ours",
        None,
        1,
        started,
    );
    let started = Instant::now();
    for n in 1..=sections {
        callers.section(&lock, n).await?;
    }
    let scenario = "ours, as the Lambdas run: back to back, real clock";
    rows.push(callers.row(scenario.to_owned(), "ours", None, sections, started));

    for &(spacing, n) in rates {
        let clock = Arc::new(ManualClock::new(SystemClock.now_ms()));
        let callers = Callers {
            clock: clock.clone(),
            ..callers.clone()
        };
        let lock = names::lock(&format!("requests-{}", uuid()));
        // Creates the item and leaves one young fence (too few to rotate): the rule's starting
        // point.
        callers.section(&lock, 0).await?;
        counter.take();
        callers.writes.take();
        let started = Instant::now();
        for k in 1..=n {
            clock.advance_ms(u64::try_from(spacing.as_millis()).unwrap_or(u64::MAX));
            callers.section(&lock, k).await?;
        }
        let scenario = format!(
            "ours, as the Lambdas run: {} on the lock (simulated clock)",
            rate_label(spacing)
        );
        let mut r = callers.row(scenario, "ours", Some(spacing), n, started);
        r.expected_rotations = Some(predicted_rotations(n, spacing, window, BUSY_YOUNG_FENCES));
        rows.push(r);
    }

    let sample = Sample {
        client: counter.dynamodb_client(endpoint),
        table: table.to_owned(),
    };
    let lock = format!("requests-{}", uuid());
    sample.init(&lock).await;
    counter.take();
    let started = Instant::now();
    for n in 1..=sections {
        let holder = execution_arn("uncontended", n);
        if !sample.acquire(&lock, &holder, 5).await {
            bail!("the sample's uncontended acquire was refused");
        }
        if !sample.release(&lock, &holder).await {
            bail!("the sample's uncontended release found no holder");
        }
    }
    // The sample writes through no counted store: its tally is empty.
    rows.push(callers.row("AWS sample".to_owned(), "sample", None, sections, started));
    let sample = rows
        .last()
        .map(|r| r.requests_per_section)
        .unwrap_or(f64::NAN);
    for r in rows.iter_mut().chain(std::iter::once(&mut first_section)) {
        r.vs_sample = crate::stats::ratio(r.requests_per_section, sample);
    }
    Ok(Requests {
        rows,
        first_section,
    })
}

/// "10 CS/s", "1 CS per 10 s", ...
pub fn rate_label(spacing: Duration) -> String {
    let s = spacing.as_secs_f64();
    if s < 1.0 {
        format!("{} CS/s", (1.0 / s).round())
    } else if s == 1.0 {
        "1 CS/s".to_owned()
    } else if s % 60.0 == 0.0 {
        format!("1 CS per {} min", s / 60.0)
    } else {
        format!("1 CS per {s} s")
    }
}

/// What must hold exactly, whatever the machine's speed.
pub fn check(requests: &Requests, problems: &mut Vec<String>) {
    let window = Timing::default().window().as_secs_f64();
    let f = &requests.first_section;
    // The first acquire's update is refused for want of an item, then the item is put; the
    // release adds the lock's first fence, and rotates only if one young fence is enough (the
    // lock has never rotated, so a rotation is due): not at the default 8.
    let rotation = u64::from(first_section_rotates(BUSY_YOUNG_FENCES));
    if (
        f.counts.get("DynamoDB.UpdateItem"),
        f.counts.get("DynamoDB.PutItem"),
        f.counts.total(),
        f.counts.total_failed(),
        f.rotations,
    ) != (2 + rotation, 1, 3 + rotation, 1, rotation)
    {
        problems.push(format!(
            "requests: a lock's first section must be {} UpdateItem (1 refused: no item yet) + 1 PutItem, {rotation} rotation(s); got {:?}, {} rotation(s)",
            2 + rotation,
            f.counts,
            f.rotations
        ));
    }
    for r in &requests.rows {
        let n = r.sections as u64;
        let c = &r.counts;
        if r.proto == "sample" {
            if (c.get("DynamoDB.UpdateItem"), c.total(), c.total_failed()) != (2 * n, 2 * n, 0) {
                problems.push(format!(
                    "requests: the sample must be exactly 2 UpdateItem per section: {c:?}"
                ));
            }
            continue;
        }
        // One write per call and a rotation now and then; nothing read, nothing refused.
        let want = 2 * n + r.rotations;
        if c.get("DynamoDB.UpdateItem") != want
            || c.total() != want
            || c.total_failed() != 0
            || r.writes.writes() != want
            || r.writes.refused() != 0
            || r.writes.loads != 0
        {
            problems.push(format!(
                "requests: {}: want exactly {want} UpdateItem (2 per section + {} rotations), no read, none refused; got {c:?}, {:?}",
                r.scenario, r.rotations, r.writes
            ));
        }
        match r.expected_rotations {
            Some(expected) if expected != r.rotations => problems.push(format!(
                "requests: {}: {} rotations, the rule says {expected}",
                r.scenario, r.rotations
            )),
            Some(_) => {}
            // Real clock, after the lock's first section (one young fence, and no rotation
            // unless one fence is enough): none until the young generation reaches the
            // threshold, then at most one per window and one per that many releases.
            None => {
                let (least, most) = if first_section_rotates(BUSY_YOUNG_FENCES) {
                    (0, 1 + (r.elapsed_s / window).floor() as u64)
                } else {
                    rotations_between(1, r.sections, r.elapsed_s, window, BUSY_YOUNG_FENCES)
                };
                if !(least..=most).contains(&r.rotations) {
                    problems.push(format!(
                        "requests: {}: {} rotations in {:.1} s, the rule allows {least} to {most} ({} young fences to rotate, one rotation per {window} s window)",
                        r.scenario, r.rotations, r.elapsed_s, BUSY_YOUNG_FENCES
                    ));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_release_rotates_once_due_with_eight_young_fences() {
        let w = Duration::from_secs(10);
        let ms = Duration::from_millis;
        let busy = BUSY_YOUNG_FENCES;
        assert_eq!(busy, 8, "the expectations below are worked out for 8");
        assert!(!first_section_rotates(busy));
        // The first section leaves one young fence: the 7th release after it makes 8 and rotates
        // (never rotated: due), then a window later once 8 more have come.
        assert_eq!(predicted_rotations(6, ms(100), w, busy), 0);
        assert_eq!(predicted_rotations(7, ms(100), w, busy), 1);
        assert_eq!(predicted_rotations(99, ms(100), w, busy), 1);
        assert_eq!(predicted_rotations(300, ms(100), w, busy), 3); // at 7, 107, 207
        assert_eq!(predicted_rotations(50, ms(1_000), w, busy), 5); // at 7, 17, 27, 37, 47
                                                                    // Quiet: every release finds a rotation due, and every 8th rotates.
        assert_eq!(predicted_rotations(20, ms(10_000), w, busy), 2); // at 7, 15
        assert_eq!(predicted_rotations(20, ms(60_000), w, busy), 2);
        assert_eq!(predicted_rotations(12, ms(100), w, busy), 1);
        assert_eq!(predicted_rotations(20, ms(1_000), w, busy), 2); // at 7, 17
        assert_eq!(predicted_rotations(16, ms(60_000), w, busy), 2);
        // One young fence (`with_busy_young_fences(1)`) is the old rule: the first section
        // rotates, then the first release a window later, or every release on a quiet lock.
        assert!(first_section_rotates(1));
        assert_eq!(predicted_rotations(300, ms(100), w, 1), 3);
        assert_eq!(predicted_rotations(99, ms(100), w, 1), 0);
        assert_eq!(predicted_rotations(50, ms(1_000), w, 1), 5);
        assert_eq!(predicted_rotations(20, ms(10_000), w, 1), 20);
        assert_eq!(predicted_rotations(20, ms(60_000), w, 1), 20);
        assert_eq!(rate_label(Duration::from_millis(100)), "10 CS/s");
        assert_eq!(rate_label(Duration::from_secs(60)), "1 CS per 1 min");
        assert_eq!(rate_label(Duration::from_secs(10)), "1 CS per 10 s");
    }
}
