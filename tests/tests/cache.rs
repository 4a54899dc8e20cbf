//! The item cache against the real local server: what it saves, what a stale cache costs, and
//! that the F1 race is still refused when the delayed acquire was written from the cache.
//! Requests are counted exactly by an SDK interceptor (`semaphore_tests::counter`).

use semaphore_core::{
    AcquireOutcome, DynamoStore, FenceReason, HolderId, ReleaseOutcome, Semaphore,
};
use semaphore_tests::counter::RequestCounter;
use semaphore_tests::names::{id, limit, lock};
use semaphore_tests::observe::observe;
use semaphore_tests::proxy::HoldingProxy;
use semaphore_tests::{endpoint, fresh_table};

const GET: &str = "DynamoDB.GetItem";
const PUT: &str = "DynamoDB.PutItem";

/// A semaphore on `store`'s table whose requests go to `endpoint_url` and are counted.
fn counted(
    counter: &RequestCounter,
    endpoint_url: &str,
    store: &DynamoStore,
) -> Semaphore<DynamoStore> {
    Semaphore::new(DynamoStore::new(
        counter.dynamodb_client(endpoint_url),
        store.table(),
    ))
}

#[tokio::test]
async fn one_process_pays_one_put_item_per_acquire_and_per_release() {
    let store = fresh_table().await;
    let counter = RequestCounter::new();
    let sem = counted(&counter, endpoint(), &store);
    let l = lock("cached");
    sem.acquire(&l, &id("warm-up", "a"), limit(5))
        .await
        .unwrap();
    counter.take();
    for n in 0..5 {
        let who = id(&format!("exec-{n}"), "a");
        assert!(matches!(
            sem.acquire(&l, &who, limit(5)).await.unwrap(),
            AcquireOutcome::Acquired { .. }
        ));
        assert!(matches!(
            sem.release(&l, &who).await.unwrap(),
            ReleaseOutcome::Released { .. }
        ));
    }
    let counts = counter.take();
    assert_eq!((counts.get(GET), counts.get(PUT)), (0, 10), "{counts:?}");
    assert_eq!(counts.total(), 10, "{counts:?}");

    // Without the cache every call reads first.
    let reading = counted(&counter, endpoint(), &store).with_item_cache(0);
    let who = id("exec-r", "a");
    reading.acquire(&l, &who, limit(5)).await.unwrap();
    reading.release(&l, &who).await.unwrap();
    let counts = counter.take();
    assert_eq!((counts.get(GET), counts.get(PUT)), (2, 2), "{counts:?}");
}

#[tokio::test]
async fn a_stale_cache_costs_one_failed_put_item_and_answers_from_the_item_it_hands_back() {
    let store = fresh_table().await;
    let counter = RequestCounter::new();
    let stale = counted(&counter, endpoint(), &store);
    let other = Semaphore::new(store.clone());
    let l = lock("stale");
    stale.acquire(&l, &id("a", "1"), limit(2)).await.unwrap();
    other.acquire(&l, &id("b", "1"), limit(2)).await.unwrap();
    counter.take();

    // From the stale cache: the write fails, DynamoDB hands back the item (ALL_OLD), the lock
    // is full, and that is answered with no read.
    assert_eq!(
        stale.acquire(&l, &id("c", "1"), limit(2)).await.unwrap(),
        AcquireOutcome::Full {
            count: 2,
            limit: limit(2)
        }
    );
    let counts = counter.take();
    assert_eq!(
        (counts.get(GET), counts.get(PUT), counts.failed(PUT)),
        (0, 1, 1),
        "{counts:?}"
    );

    // "Already held" is never answered from the cache: the holder was cleaned up elsewhere.
    other
        .cleanup(&l, &HolderId::new("a").unwrap())
        .await
        .unwrap();
    counter.take();
    assert_eq!(
        stale.acquire(&l, &id("a", "1"), limit(2)).await.unwrap(),
        AcquireOutcome::Fenced(FenceReason::ExecutionEnded)
    );
    let counts = counter.take();
    assert_eq!((counts.get(GET), counts.get(PUT)), (1, 0), "{counts:?}");
    let seen = observe(store.client(), store.table(), l.as_str())
        .await
        .unwrap();
    seen.assert_safe(2);
    assert_eq!(seen.holders, ["b#1"]);
}

/// F1 with the acquire's first attempt written from the cache (no read in the call): held in
/// flight past the cleanup, it fails on the version and the slot stays free.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn f1_a_delayed_acquire_written_from_the_cache_is_rejected_after_cleanup() {
    let store = fresh_table().await;
    let proxy = HoldingProxy::start(endpoint()).await;
    let counter = RequestCounter::new();
    let delayed = counted(&counter, &proxy.endpoint(), &store);
    let direct = Semaphore::new(store.clone());
    let l = lock("f1-cached");
    let exec = id("arn:aws:states:us-east-1:123456789012:execution:m:e1", "a1");

    // The delayed process has seen the lock before: its cache is warm and current.
    delayed
        .acquire(&l, &id("other", "a"), limit(2))
        .await
        .unwrap();
    counter.take();

    proxy.hold_next("PutItem", 1);
    let acquiring = {
        let (l, exec, delayed) = (l.clone(), exec.clone(), delayed.clone());
        tokio::spawn(async move { delayed.acquire(&l, &exec, limit(2)).await })
    };
    proxy.wait_held(1).await;
    let cleaned = direct.cleanup(&l, &exec.holder).await.unwrap();
    assert!(cleaned.freed.is_empty());
    proxy.release_held();

    assert_eq!(
        acquiring.await.unwrap().unwrap(),
        AcquireOutcome::Fenced(FenceReason::ExecutionEnded)
    );
    let counts = counter.take();
    assert_eq!(
        (counts.get(GET), counts.get(PUT), counts.failed(PUT)),
        (0, 1, 1),
        "the held write was the call's first request, from the cache: {counts:?}"
    );
    let seen = observe(store.client(), store.table(), l.as_str())
        .await
        .unwrap();
    seen.assert_safe(2);
    assert_eq!(seen.holders, ["other#a"]);
}
