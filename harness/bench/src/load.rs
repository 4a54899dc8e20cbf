//! (b) Latency and throughput under contention: C contenders on one lock of limit 5, each doing
//! critical sections back to back (acquire, hold, release), waiting before polling a full lock
//! again as the regime says, whatever the protocol. Every contender is its own "process": its own
//! `Semaphore` or its own sample client, sharing only the HTTP client. Requests are counted
//! exactly per run (and ours also by kind of write, to tell rotations and "full" answers from
//! anything else); the run is a fixed number of critical sections.
//!
//! Ours also runs in variants, measured against the same run's plain figures: a weighted one (each
//! critical section takes a weight drawn from 1-4 of a limit of 10; the weights held, not the
//! holders, are bounded) and a rate-limited one (limit 5, weight 1, at most R starts a second). A
//! contender answered "rate limited" waits until the next start the answer names plus a full jitter
//! of 1, 2, 4 ... 16 spacings (doubling with each such answer in a row), then asks again.

use semaphore_core::{Claim, FencingToken};
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, ensure, Context, Result};
use local_aws::counter::RequestCounter;
use local_aws::names::{self, id};
use local_aws::observe::{least_spacing, most_in_window, raw_item};
use local_aws::sample::Sample;
use semaphore_core::{
    AcquireOutcome, Clock, DynamoStore, Limit, Rate, ReleaseOutcome, Semaphore, SystemClock, Terms,
    Weight,
};
use serde::Serialize;

use crate::common::{execution_arn, uuid, Proto, Regime};
use crate::stats::{ms, quantile};
use crate::writes::{CountedStore, WriteCounter, WriteTally};
use semaphore_core::dynamo::item_size;

pub const LIMIT: i64 = 5;

/// The weighted variant's limit and the weights its critical sections draw from (uniformly).
pub const WEIGHTED_LIMIT: i64 = 10;
pub const WEIGHTS: [i64; 4] = [1, 2, 3, 4];

/// What the critical sections of a run ask for.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Variant {
    /// Weight 1 of [`LIMIT`], no start rate: the main tables.
    Plain,
    /// A weight drawn from [`WEIGHTS`] of [`WEIGHTED_LIMIT`].
    Weighted,
    /// Weight 1 of [`LIMIT`], at most this many starts a second.
    RateLimited(Rate),
}

impl Variant {
    pub fn name(self) -> String {
        match self {
            Self::Plain => "plain".to_owned(),
            Self::Weighted => "weighted".to_owned(),
            Self::RateLimited(rate) => format!("rate {rate}"),
        }
    }

    pub fn label(self) -> String {
        match self {
            Self::Plain => format!("weight 1 of {LIMIT}"),
            Self::Weighted => format!(
                "weights {}-{} of {WEIGHTED_LIMIT}",
                WEIGHTS[0],
                WEIGHTS[WEIGHTS.len() - 1]
            ),
            Self::RateLimited(rate) => format!("weight 1 of {LIMIT}, at most {rate} starts"),
        }
    }

    pub fn limit(self) -> i64 {
        match self {
            Self::Weighted => WEIGHTED_LIMIT,
            _ => LIMIT,
        }
    }

    pub fn rate(self) -> Option<Rate> {
        match self {
            Self::RateLimited(rate) => Some(rate),
            _ => None,
        }
    }

    /// The terms of one critical section (its weight drawn here).
    fn terms(self) -> Terms {
        let limit = Limit::new(self.limit()).expect("limit");
        let weight = match self {
            Self::Weighted => WEIGHTS[fastrand::usize(..WEIGHTS.len())],
            _ => 1,
        };
        Terms::new(limit, Weight::new(weight).expect("weight"), self.rate()).expect("terms")
    }
}

/// What a variant run measured besides the plain figures: the weights held and, with a rate,
/// the starts (from the acquire writes that landed: their `acquired_at_ms`, one clock).
#[derive(Debug, Clone, Serialize)]
pub struct VariantFigures {
    pub variant: String,
    pub limit: i64,
    pub weights: Vec<i64>,
    /// The start rate asked for (acquisitions per second, as its spacing allows), if any.
    pub rate_per_s: Option<f64>,
    pub spacing_ms: Option<u64>,
    /// The largest sum of weights seen inside at once (bounded by `limit`).
    pub max_weight_seen: i64,
    /// Acquire calls answered "rate limited", per section.
    pub rate_limited_answers_per_section: f64,
    /// Starts on the lock (warm-up included), and the most in any 1 s and 10 s window.
    pub starts: usize,
    pub max_starts_in_1s: usize,
    pub max_starts_in_10s: usize,
    /// The least time between two consecutive starts.
    pub min_start_spacing_ms: Option<u64>,
    /// Starts per second from the first measured start to the last.
    pub achieved_start_rate_per_s: f64,
}

/// Error messages kept per run (the count is exact; these say what they were).
const ERROR_SAMPLES: usize = 5;

#[derive(Debug, Clone, Serialize)]
pub struct LoadRun {
    pub regime: Regime,
    pub proto: Proto,
    pub contenders: usize,
    pub sections: usize,
    pub elapsed_s: f64,
    pub throughput_per_s: f64,
    /// Calls that took the slot.
    pub acquire_p50_ms: f64,
    pub acquire_p99_ms: f64,
    pub release_p50_ms: f64,
    pub release_p99_ms: f64,
    pub requests_per_section: f64,
    pub get_item_per_section: f64,
    pub put_item_per_section: f64,
    pub update_item_per_section: f64,
    /// Conditional writes that failed their condition (counted on the wire): for ours, acquires
    /// that found the lock full and rotations that lost to another; for the sample, "full".
    pub failed_writes_per_section: f64,
    /// Acquire calls answered "full" (a poll), per section.
    pub full_answers_per_section: f64,
    /// Acquires answered "expired" (the request outlived the horizon: asked again at once).
    pub expired_answers: u64,
    /// Fence rotations (ours), per section.
    pub rotations_per_section: f64,
    /// Calls that failed with an error of any kind, in the whole run (each retried after a
    /// wait, as the state machine's `Retry` does).
    pub errors: u64,
    pub error_samples: Vec<String>,
    pub max_holders_seen: i64,
    pub item_bytes_at_end: usize,
    /// Ours: the protocol's writes by kind, for the whole run.
    pub writes: WriteTally,
    /// A variant's own figures (none for the plain runs of the main tables).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub variant: Option<VariantFigures>,
}

#[derive(Default)]
struct Tally {
    acquire_ms: Vec<f64>,
    release_ms: Vec<f64>,
    full: u64,
    rate_limited: u64,
    expired: u64,
    errors: u64,
    error_samples: Vec<String>,
}

impl Tally {
    fn error(&mut self, e: impl std::fmt::Display) {
        self.errors += 1;
        if self.error_samples.len() < ERROR_SAMPLES {
            self.error_samples.push(e.to_string());
        }
    }
}

/// What one run's contenders share: the lock, how they behave and what they ask for, and who is
/// inside (counted here, outside the protocol, to catch S1 violated).
struct Shared {
    lock: String,
    regime: Regime,
    variant: Variant,
    inside: AtomicI64,
    max_inside: AtomicI64,
    weight_inside: AtomicI64,
    max_weight_inside: AtomicI64,
    violations: AtomicU64,
}

impl Shared {
    fn enter(&self, weight: i64) {
        let now = self.inside.fetch_add(1, Ordering::SeqCst) + 1;
        self.max_inside.fetch_max(now, Ordering::SeqCst);
        let held = self.weight_inside.fetch_add(weight, Ordering::SeqCst) + weight;
        self.max_weight_inside.fetch_max(held, Ordering::SeqCst);
        let limit = self.variant.limit();
        if now > limit || held > limit {
            self.violations.fetch_add(1, Ordering::SeqCst);
        }
    }
    fn leave(&self, weight: i64) {
        self.inside.fetch_sub(1, Ordering::SeqCst);
        self.weight_inside.fetch_sub(weight, Ordering::SeqCst);
    }
}

enum Contender {
    Ours(Semaphore<CountedStore<DynamoStore>>),
    Sample(Sample),
}

enum Attempt {
    /// A slot, under this token (the sample's: none).
    Took(Option<FencingToken>),
    Full,
    /// The start rate is spent until then (epoch ms).
    RateLimited(u64),
    Expired,
    Failed,
}

async fn contend(
    contender: Arc<Contender>,
    shared: Arc<Shared>,
    worker: usize,
    sections: usize,
) -> Result<Tally> {
    let mut tally = Tally::default();
    let (lock, regime, variant) = (&shared.lock, shared.regime, shared.variant);
    let lock_name = names::lock(lock);
    for n in 0..sections {
        let terms = variant.terms();
        let weight = i64::from(terms.weight.get());
        let holder = execution_arn(&format!("w{worker}"), n);
        let identity = id(&holder, &uuid());
        let mut polls = 0;
        let mut rate_polls: u32 = 0;
        let token = loop {
            let started = Instant::now();
            // Each attempt is a new entry into the acquire state: its request time is now.
            let attempt = match &*contender {
                Contender::Ours(sem) => match sem.acquire(&lock_name, &identity, terms).await {
                    // Already held: an attempt that failed on the wire had landed (F5).
                    Ok(
                        AcquireOutcome::Acquired { token, .. }
                        | AcquireOutcome::AlreadyHeld { token, .. },
                    ) => Attempt::Took(Some(token)),
                    Ok(AcquireOutcome::Full { .. }) => Attempt::Full,
                    Ok(AcquireOutcome::RateLimited { next_start_ms }) => {
                        Attempt::RateLimited(next_start_ms)
                    }
                    Ok(AcquireOutcome::Expired) => Attempt::Expired,
                    // The bench configures no lock: a configuration changing under one
                    // acquire three times over is not its world.
                    Ok(AcquireOutcome::Configured(_)) => {
                        bail!("worker {worker}: the bench's unconfigured lock was configured")
                    }
                    Ok(AcquireOutcome::Fenced(reason)) => bail!(
                        "worker {worker}: a fresh acquisition was fenced: {}",
                        reason.describe()
                    ),
                    Err(e) => {
                        tally.error(e);
                        Attempt::Failed
                    }
                },
                Contender::Sample(sample) => {
                    if sample.acquire(lock, &holder, LIMIT).await {
                        Attempt::Took(None)
                    } else {
                        Attempt::Full
                    }
                }
            };
            match attempt {
                Attempt::Took(token) => {
                    tally.acquire_ms.push(ms(started.elapsed()));
                    break token;
                }
                // As the state machine: "expired" enters the acquire state again at once.
                Attempt::Expired => tally.expired += 1,
                // Until the start the answer names, then a full jitter of 1, 2, 4 ... 16
                // spacings (doubling with each such answer in a row), so that the contenders
                // refused together do not all ask again at the same instant.
                Attempt::RateLimited(next_start_ms) => {
                    tally.rate_limited += 1;
                    rate_polls += 1;
                    let spacing = variant.rate().map_or(1, |r| r.spacing_ms()).max(1);
                    let spread = spacing << (rate_polls - 1).min(4);
                    let wait = next_start_ms.saturating_sub(SystemClock.now_ms())
                        + fastrand::u64(0..spread);
                    tokio::time::sleep(std::time::Duration::from_millis(wait)).await;
                }
                Attempt::Full | Attempt::Failed => {
                    if matches!(attempt, Attempt::Full) {
                        tally.full += 1;
                    }
                    polls += 1;
                    tokio::time::sleep(regime.poll_wait(polls)).await;
                }
            }
        };
        shared.enter(weight);
        tokio::time::sleep(regime.hold()).await;
        shared.leave(weight);
        let mut failures = 0;
        loop {
            let started = Instant::now();
            let done = match &*contender {
                // The holder's release, showing the token its acquire was answered (F15).
                Contender::Ours(sem) => match sem
                    .release_seeing(
                        &lock_name,
                        &identity,
                        Claim::Slot {
                            token: token.context("our acquire answers a token")?,
                            weight: terms.weight,
                        },
                    )
                    .await
                    .map(|(outcome, _)| outcome)
                {
                    Ok(ReleaseOutcome::Released { .. }) => true,
                    // Only after a failed attempt that had landed; otherwise the slot was lost.
                    Ok(ReleaseOutcome::NotHeld { .. }) if failures > 0 => true,
                    Ok(ReleaseOutcome::NotHeld { .. }) => {
                        bail!("worker {worker}: the release found its slot gone (S2 violated)")
                    }
                    Ok(ReleaseOutcome::WrongToken { held, .. }) => bail!(
                        "worker {worker}: its slot is held under token {} (F15 violated)",
                        held.0
                    ),
                    Err(e) => {
                        tally.error(e);
                        false
                    }
                },
                Contender::Sample(sample) => {
                    if !sample.release(lock, &holder).await {
                        bail!("worker {worker}: the sample's release found no holder");
                    }
                    true
                }
            };
            if done {
                tally.release_ms.push(ms(started.elapsed()));
                break;
            }
            failures += 1;
            tokio::time::sleep(regime.poll_wait(failures)).await;
        }
    }
    Ok(tally)
}

/// One run: `contenders` contenders share `sections` critical sections on a fresh lock.
#[allow(clippy::too_many_arguments)]
pub async fn run(
    regime: Regime,
    proto: Proto,
    variant: Variant,
    contenders: usize,
    sections: usize,
    endpoint: &str,
    table: &str,
) -> Result<LoadRun> {
    let counter = RequestCounter::new();
    let writes = WriteCounter::new();
    let client = counter.dynamodb_client(endpoint);
    let make = || match proto {
        Proto::Ours => Contender::Ours(Semaphore::new(
            writes.store(DynamoStore::new(client.clone(), table)),
        )),
        Proto::Sample => Contender::Sample(Sample {
            client: client.clone(),
            table: table.to_owned(),
        }),
    };
    ensure!(
        proto == Proto::Ours || variant == Variant::Plain,
        "the sample's protocol has neither weights nor a start rate"
    );
    let shared = Arc::new(Shared {
        lock: format!("load-{contenders}-{}", uuid()),
        regime,
        variant,
        inside: AtomicI64::default(),
        max_inside: AtomicI64::default(),
        weight_inside: AtomicI64::default(),
        max_weight_inside: AtomicI64::default(),
        violations: AtomicU64::default(),
    });

    // Warm-up, not counted: one critical section creates the item (ours: a refused update and a
    // put; the release adds the lock's first fence) and opens connections.
    let pool: Vec<Arc<Contender>> = (0..contenders).map(|_| Arc::new(make())).collect();
    if let Contender::Sample(sample) = &*pool[0] {
        sample.init(&shared.lock).await;
    }
    contend(pool[0].clone(), shared.clone(), contenders, 1).await?;
    counter.take();
    writes.take();
    // The warm-up's start stays among the lock's starts: the rate spaces the first measured
    // one from it too.
    let measured_from = writes.starts().len();

    let per = sections / contenders;
    let extra = sections % contenders;
    let started = Instant::now();
    let mut tasks = Vec::new();
    for (worker, contender) in pool.into_iter().enumerate() {
        let n = per + usize::from(worker < extra);
        tasks.push(tokio::spawn(contend(contender, shared.clone(), worker, n)));
    }
    let mut tally = Tally::default();
    for task in tasks {
        let t = task
            .await
            .context("a contender panicked")?
            .context(proto.label())?;
        tally.acquire_ms.extend(t.acquire_ms);
        tally.release_ms.extend(t.release_ms);
        tally.full += t.full;
        tally.rate_limited += t.rate_limited;
        tally.expired += t.expired;
        tally.errors += t.errors;
        tally.error_samples.extend(t.error_samples);
        tally.error_samples.truncate(ERROR_SAMPLES);
    }
    let elapsed = started.elapsed();
    let counts = counter.take();
    let mut starts = writes.starts();
    let writes = writes.take();
    ensure!(
        shared.violations.load(Ordering::SeqCst) == 0,
        "{} {}: more than {} holders or weight inside at once (S1 violated)",
        proto.label(),
        variant.name(),
        variant.limit()
    );
    let done = tally.release_ms.len();
    ensure!(
        done == sections,
        "{}: {done} of {sections} sections done",
        proto.label()
    );
    let item_bytes_at_end = raw_item(&client, table, &shared.lock)
        .await
        .map(|item| item_size(&item))
        .unwrap_or(0);
    let per_section = |n: u64| n as f64 / sections as f64;
    let figures = (variant != Variant::Plain).then(|| {
        starts.sort_unstable();
        let measured = &starts[measured_from.min(starts.len())..];
        let span_s = match (measured.first(), measured.last()) {
            (Some(a), Some(b)) if b > a => (b - a) as f64 / 1000.0,
            _ => f64::NAN,
        };
        VariantFigures {
            variant: variant.name(),
            limit: variant.limit(),
            weights: match variant {
                Variant::Weighted => WEIGHTS.to_vec(),
                _ => vec![1],
            },
            rate_per_s: variant.rate().map(Rate::as_per_second),
            spacing_ms: variant.rate().map(Rate::spacing_ms),
            max_weight_seen: shared.max_weight_inside.load(Ordering::SeqCst),
            rate_limited_answers_per_section: per_section(tally.rate_limited),
            starts: starts.len(),
            max_starts_in_1s: most_in_window(&starts, 1_000),
            max_starts_in_10s: most_in_window(&starts, 10_000),
            min_start_spacing_ms: least_spacing(&starts),
            achieved_start_rate_per_s: measured.len().saturating_sub(1) as f64 / span_s,
        }
    });
    Ok(LoadRun {
        regime,
        proto,
        contenders,
        sections,
        elapsed_s: elapsed.as_secs_f64(),
        throughput_per_s: sections as f64 / elapsed.as_secs_f64(),
        acquire_p50_ms: quantile(&tally.acquire_ms, 0.5).unwrap_or(f64::NAN),
        acquire_p99_ms: quantile(&tally.acquire_ms, 0.99).unwrap_or(f64::NAN),
        release_p50_ms: quantile(&tally.release_ms, 0.5).unwrap_or(f64::NAN),
        release_p99_ms: quantile(&tally.release_ms, 0.99).unwrap_or(f64::NAN),
        requests_per_section: per_section(counts.total()),
        get_item_per_section: per_section(counts.get("DynamoDB.GetItem")),
        put_item_per_section: per_section(counts.get("DynamoDB.PutItem")),
        update_item_per_section: per_section(counts.get("DynamoDB.UpdateItem")),
        failed_writes_per_section: per_section(counts.total_failed()),
        full_answers_per_section: per_section(tally.full),
        expired_answers: tally.expired,
        rotations_per_section: per_section(writes.rotation),
        errors: tally.errors,
        error_samples: tally.error_samples,
        max_holders_seen: shared.max_inside.load(Ordering::SeqCst),
        item_bytes_at_end,
        writes,
        variant: figures,
    })
}

/// What must hold exactly in a run of ours, whatever the machine's speed: every request is one
/// of the protocol's writes (no read, no put once the item exists), and every refused write is
/// an acquire that found the lock full (or its start rate spent) or a rotation that lost to
/// another (no conflicts). A variant's weights held stay within its limit, and its starts
/// within its rate: at most rate x window + 1 in any window, never closer than the spacing.
pub fn check(run: &LoadRun, problems: &mut Vec<String>) {
    let label = format!(
        "load {} C={} {}{}",
        run.regime.short(),
        run.contenders,
        run.proto.label(),
        run.variant
            .as_ref()
            .map(|v| format!(" {}", v.variant))
            .unwrap_or_default()
    );
    if run.errors > 0 {
        problems.push(format!(
            "{label}: {} errors, e.g. {:?}",
            run.errors, run.error_samples
        ));
    }
    let limit = run.variant.as_ref().map_or(LIMIT, |v| v.limit);
    if run.max_holders_seen > limit {
        problems.push(format!("{label}: {} holders inside", run.max_holders_seen));
    }
    let mut rate_limited = 0;
    if let Some(v) = &run.variant {
        if v.max_weight_seen > v.limit {
            problems.push(format!(
                "{label}: weight {} held inside at once, limit {}",
                v.max_weight_seen, v.limit
            ));
        }
        rate_limited = (v.rate_limited_answers_per_section * run.sections as f64).round() as u64;
        if let (Some(rate), Some(spacing)) = (v.rate_per_s, v.spacing_ms) {
            for (window_s, most) in [(1.0, v.max_starts_in_1s), (10.0, v.max_starts_in_10s)] {
                if most as f64 > rate * window_s + 1.0 {
                    problems.push(format!(
                        "{label}: {most} starts in {window_s} s, above {rate}/s x {window_s} s + 1"
                    ));
                }
            }
            if v.min_start_spacing_ms.is_some_and(|least| least < spacing) {
                problems.push(format!(
                    "{label}: two starts {:?} ms apart, the spacing is {spacing} ms",
                    v.min_start_spacing_ms
                ));
            }
        } else if rate_limited > 0 {
            problems.push(format!(
                "{label}: {rate_limited} \"rate limited\" answers without a rate"
            ));
        }
    }
    if run.proto != Proto::Ours {
        return;
    }
    let w = &run.writes;
    let sections = run.sections as u64;
    let full = (run.full_answers_per_section * run.sections as f64).round() as u64;
    if run.get_item_per_section != 0.0 || run.put_item_per_section != 0.0 || w.loads != 0 {
        problems.push(format!(
            "{label}: ours read or put: {} GetItem, {} PutItem per section",
            run.get_item_per_section, run.put_item_per_section
        ));
    }
    let refusals = full + rate_limited + run.expired_answers;
    if w.release != sections
        || w.acquire != sections + refusals
        || w.acquire_refused != refusals
        || w.refused_unexpectedly != 0
    {
        problems.push(format!(
            "{label}: want {sections} releases and {sections} acquires besides the {full} \"full\", {rate_limited} \"rate limited\" and {} \"expired\" answers (the only refusals); got {w:?}",
            run.expired_answers
        ));
    }
    let failed_on_the_wire = (run.failed_writes_per_section * run.sections as f64).round() as u64;
    if failed_on_the_wire != w.refused() {
        problems.push(format!(
            "{label}: {failed_on_the_wire} failed conditional writes on the wire, {} refused by the protocol's checks",
            w.refused()
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn variants_draw_weights_within_their_limit() {
        for _ in 0..100 {
            let terms = Variant::Weighted.terms();
            assert!(WEIGHTS.contains(&i64::from(terms.weight.get())));
            assert_eq!(i64::from(terms.limit.get()), WEIGHTED_LIMIT);
        }
        let rate = Rate::parse("5").unwrap();
        let terms = Variant::RateLimited(rate).terms();
        assert_eq!((terms.weight, terms.rate), (Weight::ONE, Some(rate)));
        assert_eq!(
            Variant::Plain.terms(),
            Terms::from(Limit::new(LIMIT).unwrap())
        );
    }
}
