//! F14 against the real local server: a lock its operator configured is taken on the
//! configuration's terms whatever a caller asks, a weight above the configured largest is
//! refused by name and writes nothing, a lower limit evicts nobody, and an acquire in flight
//! when the configuration changes (held by the proxy) is refused when it lands and sent again on
//! the new terms. Checked by an independent reader of the raw item ([`local_aws::observe`]).

use local_aws::names::{id, limit, lock};
use local_aws::observe::observe;
use local_aws::proxy::{HoldingProxy, Target};
use local_aws::{client_for, endpoint, fresh_table};
use semaphore_core::Claim;
use semaphore_core::{
    AcquireOutcome, DynamoStore, Error, InputError, LockConfig, LockName, Rate, Semaphore, Terms,
    Weight,
};

fn weight(n: i64) -> Weight {
    Weight::new(n).expect("a valid weight in the test")
}

fn asking(n: i64, w: i64) -> Terms {
    Terms::new(limit(n), weight(w), None).expect("weight within the limit")
}

fn config(n: i64, max_weight: Option<i64>, rate: Option<f64>) -> LockConfig {
    LockConfig::new(
        limit(n),
        max_weight.map(weight),
        rate.map(|r| Rate::per_second(r).unwrap()),
    )
    .expect("a valid configuration in the test")
}

async fn seen(store: &DynamoStore, l: &LockName) -> local_aws::observe::Observed {
    observe(store.client(), store.table(), l.as_str())
        .await
        .expect("the lock's item exists")
}

fn is_acquired(outcome: &AcquireOutcome) -> bool {
    matches!(outcome, AcquireOutcome::Acquired { .. })
}

#[tokio::test]
async fn a_configured_lock_is_taken_on_its_operators_terms_whatever_the_caller_asks() {
    let store = fresh_table().await;
    let proxy = HoldingProxy::start(endpoint()).await;
    let operator = Semaphore::new(store.clone());
    // A caller that has never seen the lock: it assumes no configuration.
    let caller = Semaphore::new(DynamoStore::new(
        client_for(&proxy.endpoint()),
        store.table(),
    ));
    let l = lock("configured");
    operator
        .configure(&l, Some(config(2, None, Some(5.0))))
        .await
        .unwrap();
    // Asking for 10, no rate: refused for the configuration it did not assume, sent again on
    // the operator's limit 2 and rate 5/s.
    let before = proxy.forwarded();
    let (outcome, item) = caller
        .acquire_seeing(
            &l,
            &id("a", "r0"),
            semaphore_core::Run::FIRST,
            asking(10, 1),
            caller.now_ms(),
        )
        .await
        .unwrap();
    assert!(is_acquired(&outcome), "{outcome:?}");
    assert_eq!(
        proxy.forwarded() - before,
        2,
        "one refused write, one on the configuration"
    );
    let item = item.expect("the item the write left");
    assert_eq!(item.limit, Some(limit(2)));
    assert_eq!(item.rate, Some(Rate::per_second(5.0).unwrap()));
    // Learnt: the next acquire assumes the configuration, one write.
    let before = proxy.forwarded();
    tokio::time::sleep(std::time::Duration::from_millis(250)).await;
    let b = caller
        .acquire(&l, &id("b", "r0"), asking(10, 1))
        .await
        .unwrap();
    assert!(is_acquired(&b), "{b:?}");
    assert_eq!(proxy.forwarded() - before, 1);
    // The configured limit holds, not the caller's 10.
    tokio::time::sleep(std::time::Duration::from_millis(250)).await;
    let c = caller
        .acquire(&l, &id("c", "r0"), asking(10, 1))
        .await
        .unwrap();
    assert!(matches!(c, AcquireOutcome::Full { used: 2, .. }), "{c:?}");
    let raw = seen(&store, &l).await;
    raw.assert_safe(2);
    assert_eq!((raw.used, raw.holders.len()), (2, 2));
}

#[tokio::test]
async fn a_weight_above_the_configured_largest_is_refused_by_name_and_writes_nothing() {
    let store = fresh_table().await;
    let sem = Semaphore::new(store.clone());
    let l = lock("max-weight");
    sem.configure(&l, Some(config(4, Some(2), None)))
        .await
        .unwrap();
    // A fresh caller learns the configuration from its refused write (which wrote nothing),
    // then refuses the weight by name before sending anything more.
    let caller = Semaphore::new(store.clone());
    let version = seen(&store, &l).await.version;
    let err = caller
        .acquire(&l, &id("heavy", "r0"), asking(4, 3))
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::InvalidInput(InputError::WeightAboveConfigured {
                weight: 3,
                max_weight: 2,
                ..
            })
        ),
        "{err}"
    );
    assert!(err.to_string().contains("semctl lock show"), "{err}");
    let raw = seen(&store, &l).await;
    assert_eq!((raw.version, raw.used), (version, 0), "nothing written");
    // Within the largest weight: taken.
    assert!(is_acquired(
        &caller
            .acquire(&l, &id("light", "r0"), asking(4, 2))
            .await
            .unwrap()
    ));
}

#[tokio::test]
async fn a_lower_configured_limit_evicts_nobody_and_admits_nobody_until_the_holders_drain() {
    let store = fresh_table().await;
    let sem = Semaphore::new(store.clone());
    let l = lock("lowered");
    for n in 0..3 {
        assert!(is_acquired(
            &sem.acquire(&l, &id(&format!("h{n}"), "r0"), asking(5, 1))
                .await
                .unwrap()
        ));
    }
    sem.configure(&l, Some(config(2, None, None)))
        .await
        .unwrap();
    assert_eq!(seen(&store, &l).await.holders.len(), 3, "nobody evicted");
    let refused = sem
        .acquire(&l, &id("new", "r0"), asking(5, 1))
        .await
        .unwrap();
    assert!(
        matches!(refused, AcquireOutcome::Full { .. }),
        "{refused:?}"
    );
    sem.release(&l, &id("h0", "r0"), Claim::Operator)
        .await
        .unwrap();
    let still = sem
        .acquire(&l, &id("new", "r0"), asking(5, 1))
        .await
        .unwrap();
    assert!(
        matches!(still, AcquireOutcome::Full { .. }),
        "2 held of 2: {still:?}"
    );
    sem.release(&l, &id("h1", "r0"), Claim::Operator)
        .await
        .unwrap();
    assert!(is_acquired(
        &sem.acquire(&l, &id("new", "r0"), asking(5, 1))
            .await
            .unwrap()
    ));
    seen(&store, &l).await.assert_safe(2);
    // Unconfigured again: the callers' own terms.
    sem.configure(&l, None).await.unwrap();
    assert!(is_acquired(
        &sem.acquire(&l, &id("more", "r0"), asking(5, 1))
            .await
            .unwrap()
    ));
    assert_eq!(seen(&store, &l).await.used, 3);
}

/// The race: an acquire decided before its lock was configured, its write held in flight while
/// the operator configures the lock lower and another execution takes the one slot. When it
/// lands it is refused (it assumed no configuration), and sent again on the operator's terms it
/// is told "full": the caller's limit never admits it.
#[tokio::test]
async fn an_acquire_in_flight_when_the_lock_is_configured_is_sent_again_on_its_terms() {
    let store = fresh_table().await;
    let proxy = HoldingProxy::start(endpoint()).await;
    let direct = Semaphore::new(store.clone());
    let through = Semaphore::new(DynamoStore::new(
        client_for(&proxy.endpoint()),
        store.table(),
    ));
    let l = lock("configured-in-flight");
    proxy.hold(Target::Operation("UpdateItem".to_owned()), 1);
    let late = {
        let l = l.clone();
        tokio::spawn(async move { through.acquire(&l, &id("late", "r0"), asking(10, 1)).await })
    };
    proxy.wait_held(1).await;
    direct
        .configure(&l, Some(config(1, None, None)))
        .await
        .unwrap();
    assert!(is_acquired(
        &direct
            .acquire(&l, &id("first", "r0"), asking(10, 1))
            .await
            .unwrap()
    ));
    proxy.release_held();
    let outcome = late.await.unwrap().unwrap();
    assert!(
        matches!(outcome, AcquireOutcome::Full { used: 1, .. }),
        "{outcome:?}"
    );
    assert!(
        proxy.held_answers().iter().any(|a| a.condition_failed),
        "the held write was refused: {:?}",
        proxy.held_answers()
    );
    let raw = seen(&store, &l).await;
    raw.assert_safe(1);
    assert_eq!(raw.holders.len(), 1);
}
