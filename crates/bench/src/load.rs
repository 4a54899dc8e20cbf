//! (b) Latency and throughput under contention: C contenders on one lock of limit 5, each doing
//! critical sections back to back (acquire, hold, release), waiting before polling a full lock
//! again as the regime says, whatever the protocol. Every contender is its own "process": its own
//! `Semaphore` or its own sample client, sharing only the HTTP client. Requests are counted
//! exactly per run (and ours also by kind of write, to tell rotations and "full" answers from
//! anything else); the run is a fixed number of critical sections.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use semaphore_core::{
    AcquireOutcome, AcquisitionId, DynamoStore, HolderId, Identity, Limit, LockName,
    ReleaseOutcome, Semaphore,
};
use semaphore_tests::counter::RequestCounter;
use semaphore_tests::observe::raw_item;
use semaphore_tests::reference::SampleProtocol;
use serde::Serialize;

use crate::common::{execution_arn, uuid, Proto, Regime};
use crate::stats::{ms, quantile};
use crate::writes::{CountedStore, WriteCounter, WriteTally};
use semaphore_core::dynamo::item_size;

pub const LIMIT: i64 = 5;

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
}

#[derive(Default)]
struct Tally {
    acquire_ms: Vec<f64>,
    release_ms: Vec<f64>,
    full: u64,
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

struct Shared {
    inside: AtomicI64,
    max_inside: AtomicI64,
    violations: AtomicU64,
}

impl Shared {
    fn enter(&self) {
        let now = self.inside.fetch_add(1, Ordering::SeqCst) + 1;
        self.max_inside.fetch_max(now, Ordering::SeqCst);
        if now > LIMIT {
            self.violations.fetch_add(1, Ordering::SeqCst);
        }
    }
    fn leave(&self) {
        self.inside.fetch_sub(1, Ordering::SeqCst);
    }
}

enum Contender {
    Ours(Semaphore<CountedStore<DynamoStore>>),
    Sample(SampleProtocol),
}

enum Attempt {
    Took,
    Full,
    Expired,
    Failed,
}

async fn contend(
    contender: Arc<Contender>,
    lock: String,
    worker: usize,
    sections: usize,
    regime: Regime,
    shared: Arc<Shared>,
) -> Result<Tally, String> {
    let mut tally = Tally::default();
    let limit = Limit::new(LIMIT).expect("limit");
    let lock_name = LockName::new(lock.clone()).expect("lock");
    for n in 0..sections {
        let holder = execution_arn(&format!("w{worker}"), n);
        let identity = Identity::new(
            HolderId::new(holder.clone()).expect("holder"),
            AcquisitionId::new(uuid()).expect("acquisition"),
        );
        let mut polls = 0;
        loop {
            let started = Instant::now();
            // Each attempt is a new entry into the acquire state: its request time is now.
            let attempt = match &*contender {
                Contender::Ours(sem) => match sem.acquire(&lock_name, &identity, limit).await {
                    // Already held: an attempt that failed on the wire had landed (F5).
                    Ok(AcquireOutcome::Acquired { .. } | AcquireOutcome::AlreadyHeld { .. }) => {
                        Attempt::Took
                    }
                    Ok(AcquireOutcome::Full { .. }) => Attempt::Full,
                    Ok(AcquireOutcome::Expired) => Attempt::Expired,
                    Ok(AcquireOutcome::Fenced(reason)) => {
                        return Err(format!(
                            "worker {worker}: a fresh acquisition was fenced: {}",
                            reason.describe()
                        ))
                    }
                    Err(e) => {
                        tally.error(e);
                        Attempt::Failed
                    }
                },
                Contender::Sample(sample) => {
                    if sample.acquire(&lock, &holder, LIMIT).await {
                        Attempt::Took
                    } else {
                        Attempt::Full
                    }
                }
            };
            match attempt {
                Attempt::Took => {
                    tally.acquire_ms.push(ms(started.elapsed()));
                    break;
                }
                // As the state machine: "expired" enters the acquire state again at once.
                Attempt::Expired => tally.expired += 1,
                Attempt::Full | Attempt::Failed => {
                    if matches!(attempt, Attempt::Full) {
                        tally.full += 1;
                    }
                    polls += 1;
                    tokio::time::sleep(regime.poll_wait(polls)).await;
                }
            }
        }
        shared.enter();
        tokio::time::sleep(regime.hold()).await;
        shared.leave();
        let mut failures = 0;
        loop {
            let started = Instant::now();
            let done = match &*contender {
                Contender::Ours(sem) => match sem.release(&lock_name, &identity).await {
                    Ok(ReleaseOutcome::Released { .. }) => true,
                    // Only after a failed attempt that had landed; otherwise the slot was lost.
                    Ok(ReleaseOutcome::NotHeld { .. }) if failures > 0 => true,
                    Ok(ReleaseOutcome::NotHeld { .. }) => {
                        return Err(format!(
                            "worker {worker}: the release found its slot gone (S2 violated)"
                        ))
                    }
                    Err(e) => {
                        tally.error(e);
                        false
                    }
                },
                Contender::Sample(sample) => {
                    if !sample.release(&lock, &holder).await {
                        return Err(format!(
                            "worker {worker}: the sample's release found no holder"
                        ));
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
pub async fn run(
    regime: Regime,
    proto: Proto,
    contenders: usize,
    sections: usize,
    endpoint: &str,
    table: &str,
) -> Result<LoadRun, String> {
    let counter = RequestCounter::new();
    let writes = WriteCounter::new();
    let client = counter.dynamodb_client(endpoint);
    let lock = format!("load-{contenders}-{}", uuid());
    let make = || match proto {
        Proto::Ours => Contender::Ours(Semaphore::new(
            writes.store(DynamoStore::new(client.clone(), table)),
        )),
        Proto::Reference => Contender::Sample(SampleProtocol {
            client: client.clone(),
            table: table.to_owned(),
        }),
    };
    let shared = Arc::new(Shared {
        inside: AtomicI64::new(0),
        max_inside: AtomicI64::new(0),
        violations: AtomicU64::new(0),
    });

    // Warm-up, not counted: one critical section creates the item (ours: a refused update and a
    // put; the release adds the lock's first fence) and opens connections.
    let pool: Vec<Arc<Contender>> = (0..contenders).map(|_| Arc::new(make())).collect();
    if let Contender::Sample(sample) = &*pool[0] {
        sample.init(&lock).await;
    }
    contend(
        pool[0].clone(),
        lock.clone(),
        contenders,
        1,
        regime,
        shared.clone(),
    )
    .await?;
    counter.take();
    writes.take();

    let per = sections / contenders;
    let extra = sections % contenders;
    let started = Instant::now();
    let mut tasks = Vec::new();
    for (worker, contender) in pool.into_iter().enumerate() {
        let n = per + usize::from(worker < extra);
        tasks.push(tokio::spawn(contend(
            contender,
            lock.clone(),
            worker,
            n,
            regime,
            shared.clone(),
        )));
    }
    let mut tally = Tally::default();
    for task in tasks {
        let t = task
            .await
            .map_err(|e| format!("a contender panicked: {e}"))?
            .map_err(|e| format!("{}: {e}", proto.label()))?;
        tally.acquire_ms.extend(t.acquire_ms);
        tally.release_ms.extend(t.release_ms);
        tally.full += t.full;
        tally.expired += t.expired;
        tally.errors += t.errors;
        for e in t.error_samples {
            if tally.error_samples.len() < ERROR_SAMPLES {
                tally.error_samples.push(e);
            }
        }
    }
    let elapsed = started.elapsed();
    let counts = counter.take();
    let writes = writes.take();
    if shared.violations.load(Ordering::SeqCst) > 0 {
        return Err(format!(
            "{}: more than {LIMIT} holders inside at once (S1 violated)",
            proto.label()
        ));
    }
    let done = tally.release_ms.len();
    if done != sections {
        return Err(format!(
            "{}: {done} of {sections} sections done",
            proto.label()
        ));
    }
    let item_bytes_at_end = raw_item(&client, table, &lock)
        .await
        .map(|item| item_size(&item))
        .unwrap_or(0);
    let per_section = |n: u64| n as f64 / sections as f64;
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
    })
}

/// What must hold exactly in a run of ours, whatever the machine's speed: every request is one
/// of the protocol's writes (no read, no put once the item exists), and every refused write is
/// an acquire that found the lock full or a rotation that lost to another (no conflicts).
pub fn check(run: &LoadRun, problems: &mut Vec<String>) {
    let label = format!(
        "load {} C={} {}",
        run.regime.short(),
        run.contenders,
        run.proto.label()
    );
    if run.errors > 0 {
        problems.push(format!(
            "{label}: {} errors, e.g. {:?}",
            run.errors, run.error_samples
        ));
    }
    if run.max_holders_seen > LIMIT {
        problems.push(format!("{label}: {} holders inside", run.max_holders_seen));
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
    if w.release != sections
        || w.acquire != sections + full + run.expired_answers
        || w.acquire_refused != full + run.expired_answers
        || w.refused_unexpectedly != 0
    {
        problems.push(format!(
            "{label}: want {sections} releases and {sections} acquires besides the {full} \"full\" and {} \"expired\" answers (the only refusals); got {w:?}",
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
