//! The [`Semaphore`]: the protocol bound to an [`ItemStore`], a [`Clock`] and the fences'
//! [`Timing`]. Each operation sends the protocol's writes to the store and turns what became of
//! them into an answer. No operation reads first, and none retries on a conflict: there are none
//! (see [`protocol`]).
//!
//! Its operations, one file per concern:
//! - [`slots`]: acquire, release, fence, free and cleanup of slots, and the fences' rotation;
//! - [`line`](mod@line): waiting in line, and the hand-off that moves it;
//! - [`sweep`]: the safety net that reclaims what ended executions hold, and moves stuck lines.

use std::sync::Arc;

use crate::clock::{Clock, SystemClock};
use crate::error::{Error, StoreError};
use crate::input::LockName;
use crate::item::SemaphoreItem;
use crate::ports::ItemStore;
use crate::protocol::{self, Timing};

pub mod line;
pub mod slots;
pub mod sweep;

/// A semaphore protocol bound to a store. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Semaphore<S> {
    store: S,
    clock: Arc<dyn Clock>,
    timing: Timing,
    busy_young_fences: usize,
}

impl<S: ItemStore> Semaphore<S> {
    pub fn new(store: S) -> Self {
        Self {
            store,
            clock: Arc::new(SystemClock),
            timing: Timing::default(),
            busy_young_fences: protocol::BUSY_YOUNG_FENCES,
        }
    }

    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    pub fn with_timing(mut self, timing: Timing) -> Self {
        self.timing = timing;
        self
    }

    /// How many young fences make a release or cleanup rotate the fences (once a window has
    /// passed); default [`protocol::BUSY_YOUNG_FENCES`]. `1` rotates whenever a rotation is due:
    /// more writes on a quiet lock, fences dropped sooner. Safety does not depend on it.
    pub fn with_busy_young_fences(mut self, fences: usize) -> Self {
        self.busy_young_fences = fences.max(1);
        self
    }

    pub fn timing(&self) -> Timing {
        self.timing
    }

    pub fn store(&self) -> &S {
        &self.store
    }

    pub fn now_ms(&self) -> u64 {
        self.clock.now_ms()
    }

    /// The lock's item, as read (consistently) now.
    pub async fn status(&self, lock: &LockName) -> Result<SemaphoreItem, Error> {
        self.store
            .load(lock)
            .await?
            .ok_or_else(|| Error::UnknownLock { lock: lock.clone() })
    }

    /// Every semaphore item, as read (consistently) now.
    pub async fn list(&self) -> Result<Vec<Result<SemaphoreItem, StoreError>>, Error> {
        Ok(self.store.list().await?)
    }
}
