//! Counts the protocol's writes by kind, on the store side of `Semaphore`: the request counter
//! (an SDK interceptor) says how many requests went out, this says which operation of the
//! protocol each one was (an acquire, a release, a rotation of the fences, ...) and whether its
//! checks refused it. A rotation and an acquire are both one `UpdateItem`, so only here can the
//! bench tell them apart.

use std::sync::{Arc, Mutex};

use semaphore_core::{Change, ItemStore, LockName, SemaphoreItem, StoreError, Write, WriteResult};
use serde::Serialize;

/// Writes per kind (and refused ones per kind) since the last `take`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct WriteTally {
    pub loads: u64,
    pub lists: u64,
    pub acquire: u64,
    pub acquire_refused: u64,
    pub release: u64,
    pub cleanup_fence: u64,
    pub cleanup_free: u64,
    pub rotation: u64,
    /// Rotations that lost to another writer's rotation (its check names the last rotation).
    pub rotation_refused: u64,
    /// Refused writes that have no checks (release, cleanup): never expected.
    pub refused_unexpectedly: u64,
    /// Writes the store failed (`StoreError`), of any kind.
    pub errors: u64,
}

impl WriteTally {
    pub fn writes(&self) -> u64 {
        self.acquire + self.release + self.cleanup_fence + self.cleanup_free + self.rotation
    }

    pub fn refused(&self) -> u64 {
        self.acquire_refused + self.rotation_refused + self.refused_unexpectedly
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Acquire,
    Release,
    CleanupFence,
    CleanupFree,
    Rotation,
}

/// Which operation sent `write`, from its changes (see `semaphore_core::protocol`).
fn kind(write: &Write) -> Kind {
    let has = |f: fn(&Change) -> bool| write.changes.iter().any(f);
    if has(|c| matches!(c, Change::Rotate { .. })) {
        Kind::Rotation
    } else if has(|c| matches!(c, Change::PutHolder { .. })) {
        Kind::Acquire
    } else if has(|c| matches!(c, Change::FenceAcquisition { .. })) {
        // A release fences its acquisition, with its slot or alone (of a slot no longer held).
        Kind::Release
    } else if has(|c| matches!(c, Change::AddFence(_))) {
        Kind::CleanupFence
    } else {
        Kind::CleanupFree
    }
}

/// Shared by every store it wraps: several "processes" (one `Semaphore` each) count into one
/// tally, as the request counter does for their HTTP clients.
#[derive(Debug, Clone, Default)]
pub struct WriteCounter {
    tally: Arc<Mutex<WriteTally>>,
    /// When each acquire that landed says it started (`acquired_at_ms`, the writer's clock):
    /// the lock's starts, which a start rate spaces.
    starts: Arc<Mutex<Vec<u64>>>,
}

impl WriteCounter {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn store<S: ItemStore>(&self, inner: S) -> CountedStore<S> {
        CountedStore {
            inner,
            counter: self.clone(),
        }
    }

    /// The tally so far, and start again from zero.
    pub fn take(&self) -> WriteTally {
        std::mem::take(&mut *self.lock())
    }

    /// Every start recorded so far (not reset by `take`), in the order they landed.
    pub fn starts(&self) -> Vec<u64> {
        self.starts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, WriteTally> {
        // A panicking contender leaves whole counts behind: the tally stays usable.
        self.tally.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// An [`ItemStore`] that counts what passes through it into a [`WriteCounter`].
#[derive(Debug, Clone)]
pub struct CountedStore<S> {
    inner: S,
    counter: WriteCounter,
}

impl<S> CountedStore<S> {
    pub fn inner(&self) -> &S {
        &self.inner
    }
}

impl<S: ItemStore> ItemStore for CountedStore<S> {
    async fn load(&self, lock: &LockName) -> Result<Option<SemaphoreItem>, StoreError> {
        self.counter.lock().loads += 1;
        self.inner.load(lock).await
    }

    async fn write(&self, write: &Write) -> Result<WriteResult, StoreError> {
        let result = self.inner.write(write).await;
        let kind = kind(write);
        if kind == Kind::Acquire
            && matches!(
                result,
                Ok(WriteResult::Applied { .. } | WriteResult::Landed { .. })
            )
        {
            let started = write.changes.iter().find_map(|c| match c {
                Change::PutHolder { acquired_at_ms, .. } => Some(*acquired_at_ms),
                _ => None,
            });
            if let Some(at) = started {
                self.counter
                    .starts
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push(at);
            }
        }
        let t = &mut *self.counter.lock();
        // The write's count, and where a refusal of it is counted.
        let (count, refused) = match kind {
            Kind::Acquire => (&mut t.acquire, &mut t.acquire_refused),
            Kind::Rotation => (&mut t.rotation, &mut t.rotation_refused),
            Kind::Release => (&mut t.release, &mut t.refused_unexpectedly),
            Kind::CleanupFence => (&mut t.cleanup_fence, &mut t.refused_unexpectedly),
            Kind::CleanupFree => (&mut t.cleanup_free, &mut t.refused_unexpectedly),
        };
        *count += 1;
        match &result {
            Ok(WriteResult::Refused { .. } | WriteResult::Unsure { .. }) => *refused += 1,
            Ok(WriteResult::Applied { .. } | WriteResult::Landed { .. }) => {}
            Err(_) => t.errors += 1,
        }
        result
    }

    async fn list_page(
        &self,
        after: Option<&semaphore_core::ListCursor>,
    ) -> Result<semaphore_core::ListPage, StoreError> {
        self.counter.lock().lists += 1;
        self.inner.list_page(after).await
    }
    async fn waiters(
        &self,
        lock: &LockName,
        after: Option<semaphore_core::QueueKey>,
        limit: usize,
    ) -> Result<Vec<semaphore_core::Waiter>, StoreError> {
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

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use semaphore_core::{
        AcquireOutcome, AcquisitionId, Claim, HolderId, Identity, Limit, ManualClock, MemoryStore,
        Semaphore, Weight,
    };

    use super::*;

    #[tokio::test]
    async fn every_kind_of_write_is_filed_under_its_operation() {
        let counter = WriteCounter::new();
        let clock = Arc::new(ManualClock::new(1_000_000));
        // One young fence is enough to rotate, so that the release rotates too.
        let sem = Semaphore::new(counter.store(MemoryStore::new()))
            .with_clock(clock)
            .with_busy_young_fences(1);
        let lock = LockName::new("l").unwrap();
        let who = Identity::new(
            HolderId::new("h").unwrap(),
            AcquisitionId::new("a").unwrap(),
        );
        let one = Limit::new(1).unwrap();
        let AcquireOutcome::Acquired { token, .. } = sem.acquire(&lock, &who, one).await.unwrap()
        else {
            panic!("the first acquire takes the slot")
        };
        let other = Identity::new(
            HolderId::new("x").unwrap(),
            AcquisitionId::new("a").unwrap(),
        );
        sem.acquire(&lock, &other, one).await.unwrap(); // full: refused
        let claim = Claim::Slot {
            token,
            weight: Weight::ONE,
        };
        sem.release(&lock, &who, claim).await.unwrap(); // and the lock's first rotation (due, 1 fence)
        sem.acquire(&lock, &other, one).await.unwrap();
        sem.cleanup(&lock, &other.holder).await.unwrap(); // fence, free (no rotation: not due)
        let t = counter.take();
        assert_eq!(
            (t.acquire, t.acquire_refused, t.release, t.rotation),
            (3, 1, 1, 1)
        );
        assert_eq!((t.cleanup_fence, t.cleanup_free, t.refused()), (1, 1, 1));
        assert_eq!(t.writes(), 7);
        assert_eq!(counter.take(), WriteTally::default());
    }
}
