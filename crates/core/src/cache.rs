//! The last item a [`Semaphore`](crate::Semaphore) saw for each lock, used in place of the read
//! for the first write attempt of the next call.
//!
//! Why it is safe: a cached item may be stale, so it is only ever the basis of a *conditional
//! write*. That write succeeds only if the stored item is still at the cached version, and every
//! version is written exactly once (each write is conditioned on the previous version), so a
//! successful write from the cache is the very write a fresh read would have led to. A stale
//! cache makes the write fail, and the failure hands back the current item (`ALL_OLD`), from
//! which the call decides again, as after any conflict. An answer that writes nothing ("full",
//! "already held", "fenced", a duplicate release) is never given from the cache: the item is read
//! first. So the cache changes what a call costs, never what it answers.
//!
//! What it costs: a hit saves the `GetItem` (one strongly consistent read, one round trip); a
//! miss costs a failed conditional write instead of the read (write units sized on the stored
//! item, and the same two round trips). It pays where one process keeps writing the same lock
//! (acquire then release, a sweep's cleanups after its scan); it does not where each call comes
//! from a different process, such as separate acquire and release Lambda functions, which
//! therefore turn it off.

use std::collections::HashMap;
use std::sync::Mutex;

use crate::input::LockName;
use crate::item::SemaphoreItem;

/// Locks a [`Semaphore`](crate::Semaphore) remembers by default.
pub const DEFAULT_ITEM_CACHE_LOCKS: usize = 64;

#[derive(Debug, Default)]
struct Entries {
    items: HashMap<LockName, (SemaphoreItem, u64)>,
    /// Increases on every use, so the least recently used entry is the one to evict.
    clock: u64,
}

/// A bounded map from lock to the newest item seen for it (least recently used evicted).
#[derive(Debug)]
pub(crate) struct ItemCache {
    capacity: usize,
    entries: Mutex<Entries>,
}

impl ItemCache {
    pub(crate) fn new(capacity: usize) -> Self {
        Self {
            capacity,
            entries: Mutex::new(Entries::default()),
        }
    }

    pub(crate) fn capacity(&self) -> usize {
        self.capacity
    }

    fn entries(&self) -> std::sync::MutexGuard<'_, Entries> {
        // Every mutation below leaves the map consistent, so a poisoned lock is safe to reuse.
        self.entries.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn get(&self, lock: &LockName) -> Option<SemaphoreItem> {
        if self.capacity == 0 {
            return None;
        }
        let mut entries = self.entries();
        entries.clock += 1;
        let now = entries.clock;
        let (item, used) = entries.items.get_mut(lock)?;
        *used = now;
        Some(item.clone())
    }

    /// Remembers `item` as what its lock holds now, unless a newer version is already known
    /// (tasks sharing one semaphore may report what they saw out of order).
    pub(crate) fn put(&self, item: &SemaphoreItem) {
        if self.capacity == 0 {
            return;
        }
        let mut entries = self.entries();
        entries.clock += 1;
        let now = entries.clock;
        if let Some((known, used)) = entries.items.get_mut(&item.lock) {
            if known.version <= item.version {
                *known = item.clone();
            }
            *used = now;
            return;
        }
        if entries.items.len() >= self.capacity {
            let oldest = entries
                .items
                .iter()
                .min_by_key(|(_, (_, used))| *used)
                .map(|(lock, _)| lock.clone());
            if let Some(oldest) = oldest {
                entries.items.remove(&oldest);
            }
        }
        entries.items.insert(item.lock.clone(), (item.clone(), now));
    }

    /// Forgets the lock: after an error the stored state is unknown.
    pub(crate) fn forget(&self, lock: &LockName) {
        if self.capacity == 0 {
            return;
        }
        self.entries().items.remove(lock);
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.entries().items.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::item::Version;

    fn item(lock: &str, version: u64) -> SemaphoreItem {
        let mut item = SemaphoreItem::empty(LockName::new(lock).unwrap());
        item.version = Version(version);
        item
    }

    #[test]
    fn keeps_the_newest_version_and_evicts_the_least_recently_used() {
        let cache = ItemCache::new(2);
        cache.put(&item("a", 2));
        cache.put(&item("a", 1));
        assert_eq!(cache.get(&LockName::new("a").unwrap()), Some(item("a", 2)));
        cache.put(&item("b", 1));
        // "a" was used more recently than "b": "b" goes.
        cache.get(&LockName::new("a").unwrap());
        cache.put(&item("c", 1));
        assert_eq!(cache.len(), 2);
        assert_eq!(cache.get(&LockName::new("b").unwrap()), None);
        assert!(cache.get(&LockName::new("a").unwrap()).is_some());
        cache.forget(&LockName::new("a").unwrap());
        assert_eq!(cache.get(&LockName::new("a").unwrap()), None);
    }

    #[test]
    fn a_zero_capacity_cache_remembers_nothing() {
        let cache = ItemCache::new(0);
        cache.put(&item("a", 1));
        assert_eq!(cache.get(&LockName::new("a").unwrap()), None);
        assert_eq!(cache.len(), 0);
    }
}
