//! What one refresh of `semctl top` reads: every item of the lock table, and the head of the line
//! of each lock that has waiters.

use std::collections::HashMap;

use aws_sdk_dynamodb::error::{DisplayErrorContext, SdkError};
use aws_sdk_dynamodb::operation::scan::ScanError;
use aws_sdk_dynamodb::types::AttributeValue;
use semaphore_core::{DynamoStore, Semaphore, SemaphoreItem, StoreError};

/// One lock as read.
pub struct LockRead {
    pub item: SemaphoreItem,
    /// When the head of the line asked to wait (epoch ms); `None` while nobody waits, or when
    /// the head's record was not found by the time it was asked for (the item's `waiting` was
    /// read a moment before: granted or gone meanwhile).
    pub oldest_queued_at_ms: Option<u64>,
    /// Why the line's head could not be read (the lock's own numbers are still shown).
    pub problem: Option<String>,
}

/// One item of the table: a lock, or one this version cannot read (of another format, say),
/// named when the error knows its lock.
pub enum Entry {
    Lock(Box<LockRead>),
    Unreadable { lock: Option<String>, error: String },
}

impl Entry {
    pub fn name(&self) -> Option<&str> {
        match self {
            Entry::Lock(lock) => Some(lock.item.lock.as_str()),
            Entry::Unreadable { lock, .. } => lock.as_deref(),
        }
    }
}

/// Every item of the table, sorted by lock name, and when they were read.
pub struct Reading {
    pub at_ms: u64,
    pub entries: Vec<Entry>,
}

impl Reading {
    /// The items that could not be read, each said in one line.
    pub fn unreadable(&self) -> Vec<&str> {
        self.entries
            .iter()
            .filter_map(|entry| match entry {
                Entry::Unreadable { error, .. } => Some(error.as_str()),
                Entry::Lock(_) => None,
            })
            .collect()
    }
}

/// Reads the whole table with a paginated Scan, each item decoded by the core's own decoder,
/// then asks each lock that has waiters for the head of its line (a Query of one record).
///
/// The Scan is eventually consistent, at half the read units of the consistent one that
/// `semctl list` and the sweeper use: a view refreshed every second or so only has to be about
/// right now, and the next refresh shows what a stale page missed. A Scan reads the whole table
/// (one read unit per 8 KB read at this consistency) however few locks are busy.
pub async fn read(semaphore: &Semaphore<DynamoStore>) -> Result<Reading, StoreError> {
    let store = semaphore.store();
    let attrs: Vec<HashMap<String, AttributeValue>> = store
        .client()
        .scan()
        .table_name(store.table())
        .into_paginator()
        .items()
        .send()
        .collect::<Result<_, _>>()
        .await
        .map_err(|e| scan_failed(store.table(), e))?;
    let at_ms = semaphore.now_ms();
    let mut entries = Vec::with_capacity(attrs.len());
    for item in attrs.iter().map(semaphore_core::dynamo::decode) {
        entries.push(match item {
            Ok(item) => Entry::Lock(Box::new(with_line(semaphore, item).await)),
            Err(e) => Entry::Unreadable {
                lock: crate::output::unreadable_lock(&e).map(str::to_owned),
                error: e.to_string(),
            },
        });
    }
    entries.sort_by(|a, b| a.name().cmp(&b.name()));
    Ok(Reading { at_ms, entries })
}

async fn with_line(semaphore: &Semaphore<DynamoStore>, item: SemaphoreItem) -> LockRead {
    let mut lock = LockRead {
        item,
        oldest_queued_at_ms: None,
        problem: None,
    };
    if lock.item.waiting > 0 {
        match semaphore.waiters(&lock.item.lock, None, 1).await {
            Ok(head) => lock.oldest_queued_at_ms = head.first().map(|w| w.key.queued_at_ms),
            Err(e) => lock.problem = Some(format!("the line's head: {e}")),
        }
    }
    lock
}

/// The core's own errors for a failed Scan, so that a missing table reads as `semctl list`'s.
fn scan_failed(table: &str, e: SdkError<ScanError>) -> StoreError {
    if let SdkError::ServiceError(service) = &e {
        if matches!(service.err(), ScanError::ResourceNotFoundException(_)) {
            return StoreError::TableNotFound {
                table: table.to_owned(),
            };
        }
    }
    StoreError::Dynamo {
        operation: "Scan",
        table: table.to_owned(),
        message: DisplayErrorContext(e).to_string(),
    }
}
