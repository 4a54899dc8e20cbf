//! An in-memory [`ItemStore`] with exactly the semantics the DynamoDB store has: a write is
//! applied atomically iff its checks hold ([`Write::apply`]), creating the item if there is none,
//! and hands back the item as it was before (applied) or as it is (refused). It backs unit tests
//! and the model checker, which therefore drive the same writes as production. A write that
//! names a waiter's record is applied to the item and the record at once and answered `Landed`,
//! as the DynamoDB store answers the transaction it sends for it.

use std::collections::BTreeMap;
use std::sync::Mutex;

use crate::error::StoreError;
use crate::input::LockName;
use crate::item::SemaphoreItem;
use crate::ports::{ItemStore, ListCursor, ListPage};
use crate::protocol::WriteResult;
use crate::queue::{QueueKey, Waiter, WaiterId};
use crate::write::Write;

/// Items a page of [`MemoryStore`]'s listing holds: few, so that the tests and the model checker,
/// with a handful of locks, go through several pages as a sweep of a large DynamoDB table does.
pub const MEMORY_PAGE_ITEMS: usize = 2;

#[derive(Debug, Default)]
struct Tables {
    items: BTreeMap<LockName, SemaphoreItem>,
    /// Each lock's waiters by id (their records' key), as DynamoDB keeps them.
    queues: BTreeMap<LockName, BTreeMap<WaiterId, Waiter>>,
}

#[derive(Debug, Default)]
pub struct MemoryStore {
    tables: Mutex<Tables>,
}

impl MemoryStore {
    pub fn new() -> Self {
        Self::default()
    }

    fn tables(&self) -> std::sync::MutexGuard<'_, Tables> {
        // A panic elsewhere while holding the lock leaves the maps themselves consistent (every
        // mutation is a single insert or remove), so a poisoned lock is safe to keep using.
        self.tables.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The write as a plain function, for callers without an async runtime.
    pub fn write_now(&self, write: &Write) -> WriteResult {
        let mut tables = self.tables();
        let Tables { items, queues } = &mut *tables;
        let current = items.get(&write.lock);
        let key = write.waiter_id();
        let queue = queues.entry(write.lock.clone()).or_default();
        let record = key.and_then(|key| queue.get(&key));
        match write.apply_with(current, record) {
            Ok((next, record)) => {
                let before = items.insert(write.lock.clone(), next);
                match key {
                    None => WriteResult::Applied { before },
                    Some(key) => {
                        match record {
                            Some(record) => queue.insert(key, record),
                            None => queue.remove(&key),
                        };
                        WriteResult::Landed { after: None }
                    }
                }
            }
            Err(_) => {
                let current = current
                    .cloned()
                    .unwrap_or_else(|| SemaphoreItem::empty(write.lock.clone()));
                let waiter_refused = write.checks.iter().any(|check| {
                    check.waiter_id().is_some() && !check.holds_with(&current, record)
                });
                WriteResult::Refused {
                    current,
                    waiter_refused,
                }
            }
        }
    }

    pub fn load_now(&self, lock: &LockName) -> Option<SemaphoreItem> {
        self.tables().items.get(lock).cloned()
    }

    /// The first `limit` waiters in `lock`'s line after `after` (from the head: `None`).
    pub fn waiters_now(
        &self,
        lock: &LockName,
        after: Option<QueueKey>,
        limit: usize,
    ) -> Vec<Waiter> {
        let tables = self.tables();
        let Some(queue) = tables.queues.get(lock) else {
            return Vec::new();
        };
        let mut line: Vec<&Waiter> = queue
            .values()
            .filter(|w| after.is_none_or(|after| w.key > after))
            .collect();
        line.sort_by_key(|w| w.key);
        line.into_iter().take(limit).cloned().collect()
    }

    /// The record of waiter `id` in `lock`'s line, if it is there.
    pub fn waiter_now(&self, lock: &LockName, id: WaiterId) -> Option<Waiter> {
        self.tables().queues.get(lock)?.get(&id).cloned()
    }

    /// Stores `item` as it is, whatever was there (to start a model or a test from a state).
    pub fn put_now(&self, item: SemaphoreItem) {
        self.tables().items.insert(item.lock.clone(), item);
    }
}

impl ItemStore for MemoryStore {
    async fn load(&self, lock: &LockName) -> Result<Option<SemaphoreItem>, StoreError> {
        Ok(self.load_now(lock))
    }

    async fn write(&self, write: &Write) -> Result<WriteResult, StoreError> {
        Ok(self.write_now(write))
    }

    async fn list_page(&self, after: Option<&ListCursor>) -> Result<ListPage, StoreError> {
        let tables = self.tables();
        let mut rest = tables
            .items
            .values()
            .filter(|item| after.is_none_or(|after| item.lock.as_str() > after.0.as_str()));
        let items: Vec<SemaphoreItem> = rest.by_ref().take(MEMORY_PAGE_ITEMS).cloned().collect();
        let next = match (rest.next(), items.last()) {
            (Some(_), Some(last)) => Some(ListCursor(last.lock.as_str().to_owned())),
            _ => None,
        };
        Ok(ListPage {
            items: items.into_iter().map(Ok).collect(),
            next,
        })
    }

    async fn waiters(
        &self,
        lock: &LockName,
        after: Option<QueueKey>,
        limit: usize,
    ) -> Result<Vec<Waiter>, StoreError> {
        Ok(self.waiters_now(lock, after, limit))
    }

    async fn waiter(&self, lock: &LockName, id: WaiterId) -> Result<Option<Waiter>, StoreError> {
        Ok(self.waiter_now(lock, id))
    }
}
