//! S1 under load: many executions acquiring and releasing at once on a few locks, while an
//! independent poller reads the raw item and checks every state it sees. The fence window is
//! short (1.5 s), so the fences are rotated several times while the load runs: rotations
//! interleave with acquires and releases and change nothing of S1.

use semaphore_core::Claim;
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use local_aws::observe::observe;
use local_aws::{client_for, endpoint, fresh_table};
use semaphore_core::{
    AcquireOutcome, AcquisitionId, DynamoStore, HolderId, Identity, Limit, LockName,
    ReleaseOutcome, Semaphore, Timing,
};

const ROUNDS: usize = 3;
const TIMING: Timing = Timing {
    horizon: Duration::from_secs(1),
    clock_skew: Duration::from_millis(500),
};

struct LockUnderTest {
    name: &'static str,
    limit: i64,
    workers: usize,
    /// Holders according to the holders themselves: incremented after an acquire returned,
    /// decremented before the release is sent, so it never overstates the real holders.
    inside: AtomicI64,
    max_inside: AtomicI64,
    max_stored: AtomicUsize,
    /// Every time of a rotation the poller saw (each stands for at least a window).
    rotations: Mutex<BTreeSet<u64>>,
    /// Acquires answered "expired" (a write that took longer than the horizon to land, with a
    /// rotation in between): asked again, as the state machine does.
    expired: AtomicUsize,
}

impl LockUnderTest {
    fn new(name: &'static str, limit: i64, workers: usize) -> Arc<Self> {
        Arc::new(Self {
            name,
            limit,
            workers,
            inside: AtomicI64::new(0),
            max_inside: AtomicI64::new(0),
            max_stored: AtomicUsize::new(0),
            rotations: Mutex::new(BTreeSet::new()),
            expired: AtomicUsize::new(0),
        })
    }
}

async fn worker(table: String, lock: Arc<LockUnderTest>, worker: usize) -> usize {
    let sem = Semaphore::new(DynamoStore::new(client_for(endpoint()), table)).with_timing(TIMING);
    let name = LockName::new(lock.name).unwrap();
    let limit = Limit::new(lock.limit).unwrap();
    let holder = HolderId::new(format!(
        "arn:aws:states:us-east-1:123456789012:execution:LoadTest:{}-{worker}",
        lock.name
    ))
    .unwrap();
    let mut waits = 0;
    for round in 0..ROUNDS {
        let identity = Identity::new(
            holder.clone(),
            AcquisitionId::new(format!("round-{round}")).unwrap(),
        );
        let mut backoff_ms = 100;
        loop {
            match sem.acquire(&name, &identity, limit).await {
                Ok(AcquireOutcome::Acquired { .. }) => break,
                Ok(AcquireOutcome::Expired) => {
                    lock.expired.fetch_add(1, Ordering::SeqCst);
                }
                Ok(AcquireOutcome::Full { .. }) => {
                    // Waiters ask again after a jittered backoff, so the serialized local server
                    // is not flooded (this drives the core's acquire alone; the state machines
                    // wait in line instead: crates/lambda-acquire/tests/waiting.rs).
                    waits += 1;
                    let delay = backoff_ms / 2 + fastrand::u64(0..=backoff_ms / 2);
                    tokio::time::sleep(Duration::from_millis(delay)).await;
                    backoff_ms = (backoff_ms * 2).min(1_000);
                }
                other => panic!("worker {worker}: unexpected {other:?}"),
            }
        }
        let now = lock.inside.fetch_add(1, Ordering::SeqCst) + 1;
        lock.max_inside.fetch_max(now, Ordering::SeqCst);
        assert!(now <= lock.limit, "{now} holders of {} inside", lock.name);
        tokio::time::sleep(Duration::from_millis(fastrand::u64(200..400))).await;
        lock.inside.fetch_sub(1, Ordering::SeqCst);
        // Releases never conflict (no condition): one attempt, no retry loop.
        match sem.release(&name, &identity, Claim::Operator).await {
            Ok(ReleaseOutcome::Released { .. }) => {}
            other => panic!("worker {worker}: release gave {other:?}"),
        }
    }
    waits
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn s1_no_more_than_limit_hold_while_fences_rotate_under_load() {
    let store = fresh_table().await;
    let locks = [
        LockUnderTest::new("hot", 5, 32),
        // A second lock with its own limit runs at the same time and must stay independent.
        LockUnderTest::new("side", 2, 8),
    ];

    let done = Arc::new(AtomicBool::new(false));
    let poller = {
        let (done, locks, table) = (done.clone(), locks.clone(), store.table().to_owned());
        tokio::spawn(async move {
            let client = client_for(endpoint());
            let mut samples = 0;
            while !done.load(Ordering::SeqCst) {
                for lock in &locks {
                    if let Some(seen) = observe(&client, &table, lock.name).await {
                        seen.assert_safe(lock.limit as usize);
                        lock.max_stored
                            .fetch_max(seen.holders.len(), Ordering::SeqCst);
                        if let Some(at) = seen.rotated_at {
                            lock.rotations.lock().unwrap().insert(at);
                        }
                        samples += 1;
                    }
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            samples
        })
    };

    let mut workers = Vec::new();
    for lock in &locks {
        for w in 0..lock.workers {
            workers.push(tokio::spawn(worker(
                store.table().to_owned(),
                lock.clone(),
                w,
            )));
        }
    }
    let all = async {
        let mut waits = 0;
        for w in workers {
            waits += w.await.expect("a worker failed");
        }
        waits
    };
    // L1 at this scale: every worker finishes all its rounds.
    let waits = tokio::time::timeout(Duration::from_secs(240), all)
        .await
        .expect("workers did not all finish: starvation or livelock");
    done.store(true, Ordering::SeqCst);
    let samples = poller.await.expect("the poller saw an unsafe state");

    for lock in &locks {
        let end = observe(store.client(), store.table(), lock.name)
            .await
            .unwrap();
        assert!(end.holders.is_empty(), "{} leaked: {end:?}", lock.name);
        let max_inside = lock.max_inside.load(Ordering::SeqCst);
        let max_stored = lock.max_stored.load(Ordering::SeqCst);
        // The last rotation may come with the last release, after the poller's last look.
        let rotations = {
            let mut seen = lock.rotations.lock().unwrap();
            seen.extend(end.rotated_at);
            seen.len()
        };
        let releases = lock.workers * ROUNDS;
        println!(
            "{}: limit {}, {} workers x {ROUNDS} rounds, max inside {max_inside}, max stored \
             {max_stored}, {rotations} rotations seen, {} fences of {releases} releases kept, \
             {} acquires expired",
            lock.name,
            lock.limit,
            lock.workers,
            end.fences,
            lock.expired.load(Ordering::SeqCst)
        );
        // The contention was real: the independent poller saw the lock full, and holders
        // overlapped; neither ever exceeded the limit.
        assert_eq!(
            max_stored as i64, lock.limit,
            "{} never filled up",
            lock.name
        );
        // The releases of a lock span more than a window, so its fences were rotated more than
        // once while it was under load, and the second rotation dropped fences: the item keeps
        // fewer fences than there were releases.
        assert!(rotations >= 2, "{}: {rotations} rotations", lock.name);
        assert!(
            end.fences < releases,
            "{}: {} fences",
            lock.name,
            end.fences
        );
        assert!(
            max_inside >= 2,
            "{} never had two holders at once",
            lock.name
        );
    }
    println!("poller samples: {samples}, waits on a full lock: {waits}");
    assert!(samples > 10, "the poller barely ran");
    assert!(waits > 0, "nobody ever found the lock full");
}
