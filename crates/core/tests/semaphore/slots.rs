//! Acquire, release, fence, free and cleanup, and the requests each costs.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use semaphore_core::protocol::BUSY_YOUNG_FENCES;
use semaphore_core::Claim;
use semaphore_core::{
    AcquireOutcome, AcquisitionId, FenceReason, FencingToken, HeartbeatOutcome, HolderId, Identity,
    ItemStore, Lease, LockName, ManualClock, MemoryStore, QueueKey, ReleaseOutcome, Run, Semaphore,
    SemaphoreItem, StoreError, Terms, Waiter, Weight, Write, WriteResult,
};

use crate::{limit, lock};

/// A memory store counting the requests sent to it and the writes refused.
#[derive(Clone, Default)]
struct Counted {
    inner: Arc<MemoryStore>,
    loads: Arc<AtomicUsize>,
    writes: Arc<AtomicUsize>,
    refused: Arc<AtomicUsize>,
}

impl Counted {
    /// (loads, writes, refused writes) since the last call.
    fn take(&self) -> (usize, usize, usize) {
        (
            self.loads.swap(0, Ordering::SeqCst),
            self.writes.swap(0, Ordering::SeqCst),
            self.refused.swap(0, Ordering::SeqCst),
        )
    }
}

impl ItemStore for Counted {
    async fn load(&self, lock: &LockName) -> Result<Option<SemaphoreItem>, StoreError> {
        self.loads.fetch_add(1, Ordering::SeqCst);
        self.inner.load(lock).await
    }
    async fn write(&self, write: &Write) -> Result<WriteResult, StoreError> {
        self.writes.fetch_add(1, Ordering::SeqCst);
        let result = self.inner.write(write).await;
        if matches!(result, Ok(WriteResult::Refused { .. })) {
            self.refused.fetch_add(1, Ordering::SeqCst);
        }
        result
    }
    async fn list_page(
        &self,
        after: Option<&semaphore_core::ListCursor>,
    ) -> Result<semaphore_core::ListPage, StoreError> {
        self.inner.list_page(after).await
    }
    async fn waiters(
        &self,
        lock: &LockName,
        after: Option<QueueKey>,
        limit: usize,
    ) -> Result<Vec<Waiter>, StoreError> {
        self.inner.waiters(lock, after, limit).await
    }

    async fn waiter(
        &self,
        lock: &LockName,
        id: semaphore_core::WaiterId,
    ) -> Result<Option<semaphore_core::Waiter>, StoreError> {
        self.inner.waiter(lock, id).await
    }
}

fn id(h: &str, a: &str) -> Identity {
    Identity::new(HolderId::new(h).unwrap(), AcquisitionId::new(a).unwrap())
}

#[tokio::test]
async fn an_uncontended_critical_section_is_two_writes_and_no_read() {
    let store = Counted::default();
    let clock = Arc::new(ManualClock::new(1_000_000));
    let sem = Semaphore::new(store.clone()).with_clock(clock.clone());
    let section = |n: String| {
        let sem = sem.clone();
        async move {
            let who = id(&n, "1");
            let AcquireOutcome::Acquired { token, .. } =
                sem.acquire(&lock(), &who, limit(5)).await.unwrap()
            else {
                panic!("expected acquired")
            };
            // The release shows the token the acquire answered: checked by its own write (F15).
            let claim = Claim::Slot {
                token,
                weight: Weight::ONE,
            };
            assert!(matches!(
                sem.release(&lock(), &who, claim).await.unwrap(),
                ReleaseOutcome::Released { .. }
            ));
        }
    };
    section("first".into()).await;
    store.take();
    for n in 0..BUSY_YOUNG_FENCES - 2 {
        section(format!("e{n}")).await;
    }
    assert_eq!(
        store.take(),
        (0, 2 * (BUSY_YOUNG_FENCES - 2), 0),
        "(loads, writes, refused)"
    );
    // The release that makes the young generation worth rotating also rotates it (this lock
    // never rotated): one more write, once per that many releases at most.
    section("busy".into()).await;
    assert_eq!(store.take(), (0, 3, 0));
    let item = store.inner.load_now(&lock()).unwrap();
    assert_eq!(item.fences.old.len(), BUSY_YOUNG_FENCES);
    assert!(item.fences.young.is_empty());
    // Within the window no rotation, however many fences.
    for n in 0..BUSY_YOUNG_FENCES + 1 {
        section(format!("w{n}")).await;
    }
    assert_eq!(store.take(), (0, 2 * (BUSY_YOUNG_FENCES + 1), 0));
    // A window later the next release rotates: the first window's fences are dropped.
    clock.advance_ms(u64::try_from(sem.timing().window().as_millis()).unwrap());
    section("late".into()).await;
    assert_eq!(store.take(), (0, 3, 0));
    let item = store.inner.load_now(&lock()).unwrap();
    assert_eq!(item.fences.old.len(), BUSY_YOUNG_FENCES + 2);
    assert!(item.fences.young.is_empty());
}

/// F15: a release or heartbeat frees or renews only the slot whose token it shows. One that
/// shows another token (a `$.semaphore` from the wrong branch, another tenant's payload) is
/// refused by name and writes nothing; its owner's release still frees it.
#[tokio::test]
async fn a_release_or_heartbeat_showing_another_slots_token_is_refused_and_writes_nothing() {
    let store = Counted::default();
    let sem = Semaphore::new(store.clone());
    let (a, b) = (id("a", "1"), id("b", "1"));
    let leased = Terms::new(limit(5), Weight::new(2).unwrap(), None)
        .unwrap()
        .with_lease(Some(Lease::ms(60_000).unwrap()));
    let AcquireOutcome::Acquired { token: held, .. } =
        sem.acquire(&lock(), &a, leased).await.unwrap()
    else {
        panic!("expected acquired")
    };
    let AcquireOutcome::Acquired { token: other, .. } =
        sem.acquire(&lock(), &b, limit(5)).await.unwrap()
    else {
        panic!("expected acquired")
    };
    let before = store.inner.load_now(&lock()).unwrap();
    store.take();
    for shown in [other, FencingToken(held.0 + 1_000)] {
        let claim = Claim::Slot {
            token: shown,
            weight: Weight::new(2).unwrap(),
        };
        assert!(matches!(
            sem.release(&lock(), &a, claim).await.unwrap(),
            ReleaseOutcome::WrongToken { held: h, count: 2, .. } if h == held
        ));
        assert_eq!(
            sem.heartbeat(&lock(), &a, claim, Lease::ms(60_000).unwrap())
                .await
                .unwrap(),
            HeartbeatOutcome::WrongToken { held }
        );
    }
    // Each was one write, refused: nothing changed, not even the version.
    assert_eq!(store.take(), (0, 4, 4), "(loads, writes, refused)");
    assert_eq!(store.inner.load_now(&lock()).unwrap(), before);
    // The owner's release, with its token but the wrong weight, frees it in one write more.
    let claim = Claim::Slot {
        token: held,
        weight: Weight::ONE,
    };
    assert!(matches!(
        sem.release(&lock(), &a, claim).await.unwrap(),
        ReleaseOutcome::Released { token: Some(t), count: 1, .. } if t == held
    ));
    assert_eq!(store.take(), (0, 2, 1));
    // Released again (a retry, S4): not held, and nothing written.
    assert!(matches!(
        sem.release(&lock(), &a, claim).await.unwrap(),
        ReleaseOutcome::NotHeld { count: 1, .. }
    ));
    assert_eq!(store.take(), (0, 1, 1));
    // The operator (semctl without --token) reads the slot first and frees whatever is held.
    assert!(matches!(
        sem.release(&lock(), &b, Claim::Operator).await.unwrap(),
        ReleaseOutcome::Released { token: Some(t), count: 0, .. } if t == other
    ));
    assert_eq!(store.take(), (1, 1, 0));
}

#[tokio::test]
async fn a_retried_acquire_is_answered_already_held_with_the_first_token() {
    let sem = Semaphore::new(MemoryStore::new());
    let who = id("a", "1");
    let AcquireOutcome::Acquired { token, .. } =
        sem.acquire(&lock(), &who, limit(1)).await.unwrap()
    else {
        panic!("expected acquired")
    };
    sem.acquire(&lock(), &id("b", "1"), limit(2)).await.unwrap();
    assert_eq!(
        sem.acquire(&lock(), &who, limit(1)).await.unwrap(),
        AcquireOutcome::AlreadyHeld { token, count: 2 }
    );
}

#[tokio::test]
async fn a_fence_alone_keeps_the_slots_and_refuses_new_acquires() {
    let sem = Semaphore::new(MemoryStore::new());
    let holder = HolderId::new("x").unwrap();
    let held = Identity::new(holder.clone(), AcquisitionId::new("1").unwrap());
    sem.acquire(&lock(), &held, limit(2)).await.unwrap();
    let slots = sem.fence(&lock(), &holder, Run::FIRST).await.unwrap().slots;
    assert_eq!(
        slots
            .iter()
            .map(|(id, holding)| (id.clone(), holding.weight))
            .collect::<Vec<_>>(),
        [(held.clone(), Weight::ONE)]
    );
    let item = sem.status(&lock()).await.unwrap();
    assert!(item.holders.contains_key(&held), "the slot stays held");
    assert_eq!(
        sem.acquire(
            &lock(),
            &Identity::new(holder.clone(), AcquisitionId::new("2").unwrap()),
            limit(2)
        )
        .await
        .unwrap(),
        AcquireOutcome::Fenced(FenceReason::ExecutionEnded)
    );
    let out = sem.cleanup(&lock(), &holder).await.unwrap();
    assert_eq!(out.freed.len(), 1);
}

#[tokio::test]
async fn cleanup_fences_first_then_frees_what_the_fence_saw() {
    let store = Counted::default();
    let sem = Semaphore::new(store.clone());
    let holder = HolderId::new("x").unwrap();
    for a in ["1", "2"] {
        sem.acquire(
            &lock(),
            &Identity::new(holder.clone(), AcquisitionId::new(a).unwrap()),
            limit(3),
        )
        .await
        .unwrap();
    }
    store.take();
    let out = sem.cleanup(&lock(), &holder).await.unwrap();
    assert_eq!(out.freed.len(), 2);
    assert_eq!(out.count, 0);
    // The fence, then the free.
    assert_eq!(store.take(), (0, 2, 0));
    assert_eq!(
        sem.acquire(
            &lock(),
            &Identity::new(holder.clone(), AcquisitionId::new("3").unwrap()),
            limit(3)
        )
        .await
        .unwrap(),
        AcquireOutcome::Fenced(FenceReason::ExecutionEnded)
    );
    // A duplicate cleanup of an execution that holds nothing is one write.
    let again = sem.cleanup(&lock(), &holder).await.unwrap();
    assert!(again.freed.is_empty());
    assert_eq!(
        store.take(),
        (0, 2, 1),
        "the refused acquire, then one fence write"
    );
    assert_eq!(
        sem.status(&lock()).await.unwrap().version.0,
        5,
        "every write that landed bumped the version"
    );
}
#[tokio::test]
async fn a_cleanup_fences_the_run_that_ended_and_the_runs_before_it_never_a_later_one() {
    let sem = Semaphore::new(MemoryStore::new());
    let holder = HolderId::new("x").unwrap();
    let run = |n: u32, acquisition: &str| {
        (
            Run(n),
            Identity::new(holder.clone(), AcquisitionId::new(acquisition).unwrap()),
        )
    };
    let (run0, first) = run(0, "r0");
    let (run1, second) = run(1, "r1");
    let (run2, third) = run(2, "r2");
    let now = sem.now_ms();
    // Run 1 ended: its cleanup fences runs 0 and 1 (run 0's own cleanup may have found the
    // execution redriven and fenced nothing).
    sem.cleanup_run(&lock(), &holder, run1).await.unwrap();
    for (run, identity) in [(run0, &first), (run1, &second)] {
        assert_eq!(
            sem.acquire_in_run(&lock(), identity, run, limit(5), now)
                .await
                .unwrap(),
            AcquireOutcome::Fenced(FenceReason::ExecutionEnded),
            "{run}"
        );
    }
    // Run 2, redriven after that cleanup, is not fenced.
    assert!(matches!(
        sem.acquire_in_run(&lock(), &third, run2, limit(5), now)
            .await
            .unwrap(),
        AcquireOutcome::Acquired { .. }
    ));
    let item = sem.status(&lock()).await.unwrap();
    assert_eq!(item.fences.young.len(), 2);
}

/// RequireConfiguredLocks (F14 on a shared stack): an acquire of a lock no operator configured
/// is refused by name and writes nothing, but the exempt default lock; once configured it takes
/// the configuration's terms; one whose configuration was removed since this instance saw it is
/// refused too (the write assumed the configuration, its refusal taught the removal).
#[tokio::test]
async fn only_configured_locks_are_taken_when_required_and_nothing_is_written_otherwise() {
    use semaphore_core::{ConfiguredOnly, Error, LockConfig};
    let store = Arc::new(MemoryStore::new());
    let default = LockName::new("default-lock").unwrap();
    let sem = Semaphore::new(store.clone()).with_configured_only(ConfiguredOnly::Yes {
        except: Some(default.clone()),
    });
    let other = LockName::new("other").unwrap();
    let who = id("a", "1");
    let refused = sem.acquire(&other, &who, limit(50)).await.unwrap_err();
    assert!(
        matches!(&refused, Error::NotConfigured { lock } if lock == &other),
        "{refused:?}"
    );
    assert!(refused.to_string().contains("semctl lock set --lock other"));
    assert_eq!(store.load_now(&other), None, "nothing written");
    // The default lock's terms are the stack's own parameters: exempt.
    assert!(matches!(
        sem.acquire(&default, &who, limit(5)).await.unwrap(),
        AcquireOutcome::Acquired { .. }
    ));
    // Configured by its operator (another instance): taken, on the configuration's limit.
    let operator = Semaphore::new(store.clone());
    let config = LockConfig::new(limit(2), None, None).unwrap();
    operator.configure(&other, Some(config)).await.unwrap();
    let fresh = Semaphore::new(store.clone()).with_configured_only(ConfiguredOnly::Yes {
        except: Some(default.clone()),
    });
    assert!(matches!(
        fresh.acquire(&other, &who, limit(50)).await.unwrap(),
        AcquireOutcome::Acquired { .. }
    ));
    assert_eq!(store.load_now(&other).unwrap().limit, Some(limit(2)));
    // The operator removes the configuration; the instance that saw it assumes it, is refused,
    // learns the removal, and refuses the acquire: nothing written.
    operator.configure(&other, None).await.unwrap();
    let before = store.load_now(&other);
    let refused = fresh
        .acquire(&other, &id("b", "1"), limit(50))
        .await
        .unwrap_err();
    assert!(
        matches!(refused, Error::NotConfigured { .. }),
        "{refused:?}"
    );
    assert_eq!(store.load_now(&other), before, "nothing written");
}
