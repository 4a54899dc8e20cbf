//! An in-memory [`ItemStore`] with exactly the semantics the DynamoDB store relies on: a put
//! succeeds only at the expected version and a conflict hands back the current item. It backs
//! unit tests and the model checker, which therefore drive the same transitions as production.

use std::collections::BTreeMap;
use std::sync::Mutex;

use crate::error::StoreError;
use crate::input::LockName;
use crate::item::{SemaphoreItem, Version};
use crate::store::{ItemStore, PutResult};

#[derive(Debug, Default)]
pub struct MemoryStore {
    items: Mutex<BTreeMap<LockName, SemaphoreItem>>,
}

impl MemoryStore {
    pub fn new() -> Self {
        Self::default()
    }

    fn items(&self) -> std::sync::MutexGuard<'_, BTreeMap<LockName, SemaphoreItem>> {
        // A panic elsewhere while holding the lock leaves the map itself consistent (every
        // mutation is a single insert), so a poisoned lock is safe to keep using.
        self.items.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The conditional put as a plain function, for callers without an async runtime.
    pub fn put_now(&self, item: &SemaphoreItem, expected: Option<Version>) -> PutResult {
        let mut items = self.items();
        let current = items.get(&item.lock);
        if current.map(|c| c.version) != expected {
            return PutResult::Conflict(current.cloned());
        }
        items.insert(item.lock.clone(), item.clone());
        PutResult::Written
    }

    pub fn load_now(&self, lock: &LockName) -> Option<SemaphoreItem> {
        self.items().get(lock).cloned()
    }
}

impl ItemStore for MemoryStore {
    async fn load(&self, lock: &LockName) -> Result<Option<SemaphoreItem>, StoreError> {
        Ok(self.load_now(lock))
    }

    async fn put(
        &self,
        item: &SemaphoreItem,
        expected: Option<Version>,
    ) -> Result<PutResult, StoreError> {
        Ok(self.put_now(item, expected))
    }

    async fn list(&self) -> Result<Vec<SemaphoreItem>, StoreError> {
        Ok(self.items().values().cloned().collect())
    }
}
