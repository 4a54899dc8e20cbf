//! Each fault of the design brief (F1-F5) made to happen against the real local server.
//! Bad input (F6) is driven from outside, through `semctl`, in crates/semctl/tests. The races
//! of the write-time checks (fence removal, zombies sent after the fence, acquirers racing for
//! the last slot) are in races.rs.

use local_aws::names::{id, limit, lock};
use local_aws::observe::observe;
use local_aws::proxy::{HeldAnswer, HoldingProxy};
use local_aws::sample::Sample;
use local_aws::{client_for, endpoint, fresh_table};
use semaphore_core::Claim;
use semaphore_core::{
    AcquireOutcome, DynamoStore, FenceReason, HolderId, LockName, ReleaseOutcome, Semaphore,
};

/// A semaphore on `store`'s table whose requests go through `proxy`.
fn through(proxy: &HoldingProxy, store: &DynamoStore) -> Semaphore<DynamoStore> {
    Semaphore::new(DynamoStore::new(
        client_for(&proxy.endpoint()),
        store.table(),
    ))
}

/// The holders as stored, read raw. (No count is stored any more: the holder map is the count.)
async fn holders(store: &DynamoStore, lock: &LockName) -> Vec<String> {
    let seen = observe(store.client(), store.table(), lock.as_str())
        .await
        .expect("the item exists");
    seen.assert_safe(1000);
    let mut holders = seen.holders;
    holders.sort();
    holders
}

/// The held write did reach the table, after what it raced, and was refused there by its
/// condition: the race happened, and the table (not the client) refused it.
const REFUSED_BY_THE_TABLE: HeldAnswer = HeldAnswer {
    status: 400,
    condition_failed: true,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn f1_an_acquire_write_delayed_past_cleanup_is_rejected_and_the_slot_stays_free() {
    let store = fresh_table().await;
    let proxy = HoldingProxy::start(endpoint()).await;
    let direct = Semaphore::new(store.clone());
    let delayed = through(&proxy, &store);
    let l = lock("f1");
    let exec = id("arn:aws:states:us-east-1:123456789012:execution:m:e1", "a1");

    // Another execution holds a slot, so the lock item exists and its version moves.
    direct
        .acquire(&l, &id("other", "a"), limit(2))
        .await
        .unwrap();

    // The acquire's one write (an UpdateItem that sets its holder) is held in flight.
    proxy.hold_next_acquires(1);
    let acquiring = {
        let (l, exec) = (l.clone(), exec.clone());
        tokio::spawn(async move { delayed.acquire(&l, &exec, limit(2)).await })
    };
    proxy.wait_held(1).await;
    // The execution ended while its acquire write was in flight: cleanup finds nothing held.
    let cleaned = direct.cleanup(&l, &exec.holder).await.unwrap();
    assert!(cleaned.freed.is_empty());
    proxy.release_held();

    assert_eq!(
        acquiring.await.unwrap().unwrap(),
        AcquireOutcome::Fenced(FenceReason::ExecutionEnded)
    );
    assert_eq!(proxy.held_answers(), [REFUSED_BY_THE_TABLE]);
    assert_eq!(holders(&store, &l).await, ["other#a"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn f1_the_first_ever_acquire_of_a_lock_delayed_past_cleanup_is_rejected() {
    let store = fresh_table().await;
    let proxy = HoldingProxy::start(endpoint()).await;
    let delayed = through(&proxy, &store);
    let l = lock("f1-new");
    let exec = id("exec-1", "a1");

    // Held before the lock has an item: the cleanup below creates it.
    proxy.hold_next_acquires(1);
    let acquiring = {
        let (l, exec) = (l.clone(), exec.clone());
        tokio::spawn(async move { delayed.acquire(&l, &exec, limit(1)).await })
    };
    proxy.wait_held(1).await;
    Semaphore::new(store.clone())
        .cleanup(&l, &exec.holder)
        .await
        .unwrap();
    proxy.release_held();

    assert_eq!(
        acquiring.await.unwrap().unwrap(),
        AcquireOutcome::Fenced(FenceReason::ExecutionEnded)
    );
    assert_eq!(proxy.held_answers(), [REFUSED_BY_THE_TABLE]);
    assert!(holders(&store, &l).await.is_empty());
}

/// A lock's first write is two requests: the update, refused for want of an item, then a
/// `PutItem` of the item the write makes, conditioned on there still being none. Here that put is
/// the write held in flight while a cleanup creates the item: the put is refused, and the update
/// it falls back to meets the fence.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn f1_the_put_creating_a_lock_for_its_first_acquire_delayed_past_cleanup_is_rejected() {
    let store = fresh_table().await;
    let proxy = HoldingProxy::start(endpoint()).await;
    let delayed = through(&proxy, &store);
    let l = lock("f1-create");
    let exec = id("exec-1", "a1");

    proxy.hold_next("PutItem", 1);
    let acquiring = {
        let (l, exec) = (l.clone(), exec.clone());
        tokio::spawn(async move { delayed.acquire(&l, &exec, limit(1)).await })
    };
    proxy.wait_held(1).await;
    Semaphore::new(store.clone())
        .cleanup(&l, &exec.holder)
        .await
        .unwrap();
    proxy.release_held();

    assert_eq!(
        acquiring.await.unwrap().unwrap(),
        AcquireOutcome::Fenced(FenceReason::ExecutionEnded)
    );
    assert_eq!(proxy.held_answers(), [REFUSED_BY_THE_TABLE]);
    assert!(holders(&store, &l).await.is_empty());
}

/// The same race against the original sample's protocol: the slot leaks. This is what makes
/// the test above meaningful: the race really is produced.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn f1_the_same_race_leaks_a_slot_in_the_original_sample_protocol() {
    let store = fresh_table().await;
    let proxy = HoldingProxy::start(endpoint()).await;
    let direct = Sample {
        client: client_for(endpoint()),
        table: store.table().to_owned(),
    };
    let delayed = Sample {
        client: client_for(&proxy.endpoint()),
        table: store.table().to_owned(),
    };
    direct.init("seed").await;

    proxy.hold_next("UpdateItem", 1);
    let acquiring = tokio::spawn(async move { delayed.acquire("seed", "exec-1", 1).await });
    proxy.wait_held(1).await;
    direct.cleanup("seed", "exec-1").await;
    proxy.release_held();

    assert!(acquiring.await.unwrap(), "the delayed acquire lands");
    assert_eq!(direct.holders("seed").await, vec!["exec-1".to_owned()]);
    assert_eq!(
        direct.count("seed").await,
        1,
        "the ended execution's slot leaked"
    );
    assert!(
        !direct.acquire("seed", "exec-2", 1).await,
        "and with limit 1 nobody else can ever acquire"
    );
}

#[tokio::test]
async fn f2_a_zombie_that_reads_after_cleanup_cannot_take_a_slot() {
    let store = fresh_table().await;
    let sem = Semaphore::new(store.clone());
    let l = lock("f2");
    let exec = id("exec-1", "a1");

    assert!(matches!(
        sem.acquire(&l, &exec, limit(1)).await.unwrap(),
        AcquireOutcome::Acquired { .. }
    ));
    let cleaned = sem.cleanup(&l, &exec.holder).await.unwrap();
    assert_eq!(cleaned.freed.len(), 1);

    // The zombie Lambda keeps running, re-reads the item and tries again, with the same
    // acquisition or (a retried state) a new one.
    for acquisition in ["a1", "a2"] {
        assert_eq!(
            sem.acquire(&l, &id("exec-1", acquisition), limit(1))
                .await
                .unwrap(),
            AcquireOutcome::Fenced(FenceReason::ExecutionEnded)
        );
    }
    assert!(holders(&store, &l).await.is_empty());
    assert!(matches!(
        sem.acquire(&l, &id("exec-2", "b1"), limit(1))
            .await
            .unwrap(),
        AcquireOutcome::Acquired { .. }
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn f3_a_first_attempt_landing_after_its_retry_released_is_rejected() {
    let store = fresh_table().await;
    let proxy = HoldingProxy::start(endpoint()).await;
    let direct = Semaphore::new(store.clone());
    let slow = through(&proxy, &store);
    let l = lock("f3");
    let exec = id("exec-1", "a1");

    proxy.hold_next_acquires(1);
    let first_attempt = {
        let (l, exec) = (l.clone(), exec.clone());
        tokio::spawn(async move { slow.acquire(&l, &exec, limit(1)).await })
    };
    proxy.wait_held(1).await;
    // Step Functions gave up on the first attempt and retried: the retry acquires, the work
    // runs, the execution releases.
    let retry = direct.acquire(&l, &exec, limit(1)).await.unwrap();
    assert!(matches!(retry, AcquireOutcome::Acquired { .. }));
    assert!(matches!(
        direct.release(&l, &exec, Claim::Operator).await.unwrap(),
        ReleaseOutcome::Released { .. }
    ));
    proxy.release_held();

    assert_eq!(
        first_attempt.await.unwrap().unwrap(),
        AcquireOutcome::Fenced(FenceReason::AcquisitionReleased)
    );
    assert_eq!(proxy.held_answers(), [REFUSED_BY_THE_TABLE]);
    assert!(holders(&store, &l).await.is_empty());
    // The execution itself is not fenced: a later, new acquisition gets the lock.
    assert!(matches!(
        direct
            .acquire(&l, &id("exec-1", "a2"), limit(1))
            .await
            .unwrap(),
        AcquireOutcome::Acquired { .. }
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn f3_the_same_late_retry_leaks_a_slot_in_the_original_sample_protocol() {
    let store = fresh_table().await;
    let proxy = HoldingProxy::start(endpoint()).await;
    let direct = Sample {
        client: client_for(endpoint()),
        table: store.table().to_owned(),
    };
    let slow = Sample {
        client: client_for(&proxy.endpoint()),
        table: store.table().to_owned(),
    };
    direct.init("seed").await;

    proxy.hold_next("UpdateItem", 1);
    let first_attempt = tokio::spawn(async move { slow.acquire("seed", "exec-1", 1).await });
    proxy.wait_held(1).await;
    assert!(direct.acquire("seed", "exec-1", 1).await);
    assert!(direct.release("seed", "exec-1").await);
    proxy.release_held();

    assert!(first_attempt.await.unwrap());
    assert_eq!(
        direct.count("seed").await,
        1,
        "a SUCCEEDED execution holds a slot"
    );
}

#[tokio::test]
async fn f4_duplicate_late_and_out_of_order_releases_and_cleanups_are_no_ops() {
    let store = fresh_table().await;
    let sem = Semaphore::new(store.clone());
    let l = lock("f4");
    let a = id("exec-a", "1");
    let b = id("exec-b", "1");
    let version = |store: DynamoStore, l: LockName| async move {
        observe(store.client(), store.table(), l.as_str())
            .await
            .unwrap()
            .version
    };

    sem.acquire(&l, &a, limit(2)).await.unwrap();
    sem.acquire(&l, &b, limit(2)).await.unwrap();

    // A duplicated cleanup event: the second frees nothing, the other holder keeps its slot,
    // and it still bumps the version (cleanup always writes its fence; with nothing to free that
    // is its only write).
    assert_eq!(sem.cleanup(&l, &a.holder).await.unwrap().freed.len(), 1);
    let before = version(store.clone(), l.clone()).await;
    let again = sem.cleanup(&l, &a.holder).await.unwrap();
    assert!(again.freed.is_empty());
    assert_eq!(again.count, 1);
    assert_eq!(version(store.clone(), l.clone()).await, before + 1);

    // A cleanup for an execution that never held anything leaves the others alone.
    let stranger = sem
        .cleanup(&l, &HolderId::new("exec-never").unwrap())
        .await
        .unwrap();
    assert!(stranger.freed.is_empty());
    assert_eq!(stranger.count, 1);

    // Out of order: the release of a cleaned-up acquisition arrives late. The release never
    // reads: it always sends its one idempotent write, which frees nothing (the acquisition
    // holds nothing) and fences the acquisition. One write, so the version moves by exactly
    // one; the other holder is untouched.
    let before = version(store.clone(), l.clone()).await;
    assert_eq!(
        sem.release(&l, &a, Claim::Operator).await.unwrap(),
        ReleaseOutcome::NotHeld {
            count: 1,
            waiting: 0
        }
    );
    assert_eq!(version(store.clone(), l.clone()).await, before + 1);
    assert_eq!(holders(&store, &l).await, ["exec-b#1"]);

    // Release, then its duplicate, then a late cleanup event for the same execution.
    assert!(matches!(
        sem.release(&l, &b, Claim::Operator).await.unwrap(),
        ReleaseOutcome::Released { count: 0, .. }
    ));
    assert_eq!(
        sem.release(&l, &b, Claim::Operator).await.unwrap(),
        ReleaseOutcome::NotHeld {
            count: 0,
            waiting: 0
        }
    );
    assert!(sem.cleanup(&l, &b.holder).await.unwrap().freed.is_empty());
    assert!(holders(&store, &l).await.is_empty());

    // Releasing on a lock nobody ever acquired is a no-op too, and fences the acquisition in
    // case its acquire is still in flight.
    let fresh = lock("f4-untouched");
    assert_eq!(
        sem.release(&fresh, &a, Claim::Operator).await.unwrap(),
        ReleaseOutcome::NotHeld {
            count: 0,
            waiting: 0
        }
    );
    assert_eq!(
        sem.acquire(&fresh, &a, limit(1)).await.unwrap(),
        AcquireOutcome::Fenced(FenceReason::AcquisitionReleased)
    );
}

#[tokio::test]
async fn f5_a_retried_acquire_whose_first_answer_was_lost_keeps_one_slot() {
    let store = fresh_table().await;
    let sem = Semaphore::new(store.clone());
    let l = lock("f5");
    let exec = id("exec-1", "a1");

    let AcquireOutcome::Acquired { token, .. } = sem.acquire(&l, &exec, limit(3)).await.unwrap()
    else {
        panic!("first acquire must succeed")
    };
    // The answer was lost; Step Functions retries the task with the same acquisition id.
    assert_eq!(
        sem.acquire(&l, &exec, limit(3)).await.unwrap(),
        AcquireOutcome::AlreadyHeld { token, count: 1 }
    );
    assert_eq!(holders(&store, &l).await, ["exec-1#a1"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn f5_concurrent_attempts_of_one_acquisition_take_exactly_one_slot() {
    let store = fresh_table().await;
    let l = lock("f5-race");
    let exec = id("exec-1", "a1");
    let attempts: Vec<_> = (0..8)
        .map(|_| {
            let sem = Semaphore::new(DynamoStore::new(client_for(endpoint()), store.table()));
            let (l, exec) = (l.clone(), exec.clone());
            tokio::spawn(async move { sem.acquire(&l, &exec, limit(5)).await.unwrap() })
        })
        .collect();
    let mut tokens = Vec::new();
    let mut acquired = 0;
    for attempt in attempts {
        match attempt.await.unwrap() {
            AcquireOutcome::Acquired { token, .. } => {
                acquired += 1;
                tokens.push(token)
            }
            AcquireOutcome::AlreadyHeld { token, .. } => tokens.push(token),
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(acquired, 1);
    tokens.dedup();
    assert_eq!(
        tokens.len(),
        1,
        "every attempt reports the one slot's token"
    );
    assert_eq!(holders(&store, &l).await, ["exec-1#a1"]);
}
