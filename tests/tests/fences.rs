//! Fences are bounded: the item holds only the fences of the last fence window, so its size and
//! the cost of a write never grow with history; and a fence refuses its identity for exactly
//! the window.

use std::sync::Arc;
use std::time::Duration;

use semaphore_core::{
    AcquireOutcome, AcquisitionId, FenceReason, HolderId, Identity, Limit, LockName, ManualClock,
    Semaphore,
};
use semaphore_tests::fresh_table;
use semaphore_tests::observe::observe;

const WINDOW: Duration = Duration::from_secs(60);

fn execution(n: usize) -> HolderId {
    HolderId::new(format!(
        "arn:aws:states:us-east-1:123456789012:execution:LockProtected:{n:08}-a-long-execution-name"
    ))
    .unwrap()
}

#[tokio::test]
async fn the_item_stays_bounded_after_many_acquire_release_and_cleanup_cycles() {
    let store = fresh_table().await;
    let clock = Arc::new(ManualClock::new(1_700_000_000_000));
    let sem = Semaphore::new(store.clone())
        .with_clock(clock.clone())
        .with_fence_window(WINDOW);
    let lock = LockName::new("bounded").unwrap();
    let limit = Limit::new(3).unwrap();
    let acquisition = AcquisitionId::new("3f1c2a9e-0000-4c4c-8d8d-123456789abc").unwrap();

    let mut sizes = Vec::new();
    // One critical section and one stray cleanup every 2 s: 30 of each live in a 60 s window.
    for n in 0..120 {
        let identity = Identity::new(execution(n), acquisition.clone());
        assert!(matches!(
            sem.acquire(&lock, &identity, limit).await.unwrap(),
            AcquireOutcome::Acquired { .. }
        ));
        sem.release(&lock, &identity).await.unwrap();
        sem.cleanup(&lock, &execution(100_000 + n)).await.unwrap();
        clock.advance_ms(2_000);
        if n % 30 == 29 {
            let seen = observe(store.client(), store.table(), lock.as_str())
                .await
                .unwrap();
            sizes.push((seen.fences, seen.approx_bytes));
        }
    }
    println!("(fences, item bytes) every 30 cycles: {sizes:?}");
    // After the first window the number of fences and the item size stop growing.
    let (fences, bytes) = sizes[1..]
        .iter()
        .fold((0, 0), |(f, b), &(f2, b2)| (f.max(f2), b.max(b2)));
    assert!(
        fences <= 62,
        "{fences} fences kept for a 60 s window of 2 per 2 s"
    );
    assert!(
        fences >= 58,
        "fences of the last window must all still be there, saw {fences}"
    );
    // Whatever the history, 60 live fences of 12 bytes: one write unit (1 KB) per write.
    assert!(bytes <= 1024, "item grew to {bytes} bytes");
    assert!(sizes.iter().all(|&(_, b)| b <= bytes + 64), "{sizes:?}");
}

#[tokio::test]
async fn a_fence_refuses_its_identity_for_the_window_and_no_longer() {
    let store = fresh_table().await;
    let clock = Arc::new(ManualClock::new(1_700_000_000_000));
    let sem = Semaphore::new(store.clone())
        .with_clock(clock.clone())
        .with_fence_window(WINDOW);
    let lock = LockName::new("window").unwrap();
    let limit = Limit::new(1).unwrap();
    let identity = Identity::new(execution(1), AcquisitionId::new("a").unwrap());

    sem.acquire(&lock, &identity, limit).await.unwrap();
    sem.cleanup(&lock, &identity.holder).await.unwrap();
    clock.advance_ms(WINDOW.as_millis() as u64 - 1);
    assert_eq!(
        sem.acquire(&lock, &identity, limit).await.unwrap(),
        AcquireOutcome::Fenced(FenceReason::ExecutionEnded)
    );
    // Past the window no write of the ended execution can still be in flight (see
    // DEFAULT_FENCE_WINDOW), so the fence goes and the id is just an id again.
    clock.advance_ms(1);
    assert!(matches!(
        sem.acquire(&lock, &identity, limit).await.unwrap(),
        AcquireOutcome::Acquired { .. }
    ));
    let seen = observe(store.client(), store.table(), lock.as_str())
        .await
        .unwrap();
    assert_eq!(seen.fences, 0, "the expired fence was dropped by the write");
}
