//! An in-memory [`ItemStore`] with exactly the semantics the DynamoDB store has: a write is
//! applied atomically iff its checks hold ([`Write::apply`]), creating the item if there is none,
//! and hands back the item as it was before (applied) or as it is (refused). It backs unit tests
//! and the model checker, which therefore drive the same writes as production.

use std::collections::BTreeMap;
use std::sync::Mutex;

use crate::error::StoreError;
use crate::input::LockName;
use crate::item::SemaphoreItem;
use crate::protocol::WriteResult;
use crate::store::ItemStore;
use crate::write::Write;

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

    /// The write as a plain function, for callers without an async runtime.
    pub fn write_now(&self, write: &Write) -> WriteResult {
        let mut items = self.items();
        let current = items.get(&write.lock);
        match write.apply(current) {
            Ok(next) => WriteResult::Applied {
                before: items.insert(write.lock.clone(), next),
            },
            Err(_) => WriteResult::Refused {
                current: current
                    .cloned()
                    .unwrap_or_else(|| SemaphoreItem::empty(write.lock.clone())),
            },
        }
    }

    pub fn load_now(&self, lock: &LockName) -> Option<SemaphoreItem> {
        self.items().get(lock).cloned()
    }

    /// Stores `item` as it is, whatever was there (to start a model or a test from a state).
    pub fn put_now(&self, item: SemaphoreItem) {
        self.items().insert(item.lock.clone(), item);
    }
}

impl ItemStore for MemoryStore {
    async fn load(&self, lock: &LockName) -> Result<Option<SemaphoreItem>, StoreError> {
        Ok(self.load_now(lock))
    }

    async fn write(&self, write: &Write) -> Result<WriteResult, StoreError> {
        Ok(self.write_now(write))
    }

    async fn list(&self) -> Result<Vec<Result<SemaphoreItem, StoreError>>, StoreError> {
        Ok(self.items().values().cloned().map(Ok).collect())
    }
}
