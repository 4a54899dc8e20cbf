//! (b) Latency and throughput under contention: C contenders on one lock of limit 5, each doing
//! critical sections back to back (acquire, hold, release), waiting before polling a full lock
//! again as the regime says, whatever the protocol. Every contender is its own "process": its own
//! `Semaphore` (own item cache) or its own sample client state, sharing only the HTTP client.
//! Requests are counted exactly per run; the run is a fixed number of critical sections.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use semaphore_core::{
    AcquireOutcome, AcquisitionId, DynamoStore, Error, HolderId, Identity, Limit, LockName,
    ReleaseOutcome, Semaphore,
};
use semaphore_tests::counter::RequestCounter;
use semaphore_tests::observe::raw_item;
use semaphore_tests::reference::SampleProtocol;
use serde::Serialize;

use crate::common::{execution_arn, uuid, Proto, Regime};
use crate::stats::{ms, quantile};
use semaphore_core::dynamo::item_size;

pub const LIMIT: i64 = 5;

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
    /// Conditional writes that failed their condition: version conflicts and stale caches
    /// for ours; "full" answers for the sample (its acquire is the conditional write).
    pub failed_writes_per_section: f64,
    /// Acquire calls answered "full" (a poll), per section.
    pub full_answers_per_section: f64,
    /// Calls that ran out of conflict retries (`Error::Contention`), in the whole run.
    pub contention_errors: u64,
    pub max_holders_seen: i64,
    pub item_bytes_at_end: usize,
}

#[derive(Default)]
struct Tally {
    acquire_ms: Vec<f64>,
    release_ms: Vec<f64>,
    full: u64,
    contention: u64,
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
    Ours(Semaphore<DynamoStore>),
    Sample(SampleProtocol),
}

async fn contend(
    contender: Arc<Contender>,
    lock: String,
    worker: usize,
    sections: usize,
    regime: Regime,
    shared: Arc<Shared>,
) -> Tally {
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
            let took = match &*contender {
                Contender::Ours(sem) => match sem.acquire(&lock_name, &identity, limit).await {
                    Ok(AcquireOutcome::Acquired { .. }) => true,
                    Ok(AcquireOutcome::Full { .. }) => {
                        tally.full += 1;
                        false
                    }
                    Err(Error::Contention { .. }) => {
                        tally.contention += 1;
                        false
                    }
                    other => panic!("worker {worker}: acquire gave {other:?}"),
                },
                Contender::Sample(sample) => {
                    let took = sample.acquire(&lock, &holder, LIMIT).await;
                    if !took {
                        tally.full += 1;
                    }
                    took
                }
            };
            if took {
                tally.acquire_ms.push(ms(started.elapsed()));
                break;
            }
            polls += 1;
            tokio::time::sleep(regime.poll_wait(polls)).await;
        }
        shared.enter();
        tokio::time::sleep(regime.hold()).await;
        shared.leave();
        loop {
            let started = Instant::now();
            let done = match &*contender {
                Contender::Ours(sem) => match sem.release(&lock_name, &identity).await {
                    Ok(ReleaseOutcome::Released { .. }) => true,
                    Err(Error::Contention { .. }) => {
                        tally.contention += 1;
                        false
                    }
                    other => panic!("worker {worker}: release gave {other:?}"),
                },
                Contender::Sample(sample) => {
                    assert!(
                        sample.release(&lock, &holder).await,
                        "worker {worker}: the sample's release found no holder"
                    );
                    true
                }
            };
            if done {
                tally.release_ms.push(ms(started.elapsed()));
                break;
            }
        }
    }
    tally
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
    let client = counter.dynamodb_client(endpoint);
    let lock = format!("load-{contenders}-{}", uuid());
    let make = || match proto {
        Proto::Ours => Contender::Ours(Semaphore::new(DynamoStore::new(client.clone(), table))),
        Proto::OursReadFirst => Contender::Ours(
            Semaphore::new(DynamoStore::new(client.clone(), table)).with_item_cache(0),
        ),
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

    // Warm-up, not counted: one critical section creates the item and opens connections, and
    // each of our contenders reads the lock once, as a process that has run before has seen it.
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
    .await;
    for contender in &pool {
        if let Contender::Ours(sem) = &**contender {
            sem.status(&LockName::new(lock.clone()).expect("lock"))
                .await
                .map_err(|e| e.to_string())?;
        }
    }
    counter.take();

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
            .map_err(|e| format!("a contender panicked: {e}"))?;
        tally.acquire_ms.extend(t.acquire_ms);
        tally.release_ms.extend(t.release_ms);
        tally.full += t.full;
        tally.contention += t.contention;
    }
    let elapsed = started.elapsed();
    let counts = counter.take();
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
        contention_errors: tally.contention,
        max_holders_seen: shared.max_inside.load(Ordering::SeqCst),
        item_bytes_at_end,
    })
}
