//! The [`Semaphore`]: the protocol bound to an [`ItemStore`], a [`Clock`] and the fences'
//! [`Timing`]. Each operation sends the protocol's writes to the store and turns what became of
//! them into an answer. No operation reads first, and none retries on a conflict: there are none
//! (see [`protocol`]).
//!
//! Its operations, one file per concern:
//! - [`slots`]: acquire, release, fence, free and cleanup of slots, and the fences' rotation;
//! - [`line`](mod@line): waiting in line, and the hand-off that moves it;
//! - [`sweep`]: the safety net that reclaims what ended executions hold, and moves stuck lines;
//! - [`flows`]: the flows of [`crate::flow`], each call run as one of the operations above.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use crate::clock::{Clock, SystemClock};
use crate::error::{Error, StoreError};
use crate::input::{LockConfig, LockName};
use crate::item::{SemaphoreItem, TakenBackSlot};
use crate::ports::ItemStore;
use crate::protocol::{self, Timing};

pub mod flows;
pub mod line;
pub mod slots;
pub mod sweep;

/// How many times one acquire or queueing asks again because the lock's configuration was not
/// the one it assumed (F14): once to learn it, once more if an operator changed it meanwhile.
pub const CONFIG_ROUNDS: usize = 3;

/// Which locks an acquisition may take only once an operator configured them
/// (`RequireConfiguredLocks`): on a shared stack, no caller then creates a lock with a limit of
/// its own choosing (F14).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum ConfiguredOnly {
    /// Any lock: an unconfigured lock takes its caller's terms.
    #[default]
    No,
    /// Every lock but `except` (the stack's default lock, whose terms are the stack's own
    /// parameters whatever a caller asks).
    Yes { except: Option<LockName> },
}

/// A semaphore protocol bound to a store. Cheap to clone (clones share what they learnt of the
/// locks' configurations, and the slots they took back).
#[derive(Debug, Clone)]
pub struct Semaphore<S> {
    store: S,
    clock: Arc<dyn Clock>,
    timing: Timing,
    busy_young_fences: usize,
    /// The configuration of each lock as last seen (absent: assumed unconfigured). No write
    /// relies on it: each checks the configuration it assumed when it lands, and a wrong guess
    /// costs one write more (F14).
    configs: Arc<Mutex<HashMap<LockName, Option<LockConfig>>>>,
    /// Slots taken back by this semaphore's writes and not yet collected
    /// ([`Semaphore::drain_taken_back`]): a take-back happens inside an acquire, a hand-off or a
    /// sweep, and the function that sent it reports it (its metric, the sweeper's notice).
    taken_back: Arc<Mutex<VecDeque<TakenBackSlot>>>,
    configured_only: ConfiguredOnly,
}

/// Most take-backs kept for [`Semaphore::drain_taken_back`]: a program that never collects
/// them (the client, `semctl`) keeps only the latest.
pub const KEPT_TAKE_BACKS: usize = 256;

impl<S: ItemStore> Semaphore<S> {
    pub fn new(store: S) -> Self {
        Self {
            store,
            clock: Arc::new(SystemClock),
            timing: Timing::default(),
            busy_young_fences: protocol::BUSY_YOUNG_FENCES,
            configs: Arc::default(),
            taken_back: Arc::default(),
            configured_only: ConfiguredOnly::No,
        }
    }

    /// Takes only locks an operator configured, but `except` (see [`ConfiguredOnly`]).
    pub fn with_configured_only(mut self, configured_only: ConfiguredOnly) -> Self {
        self.configured_only = configured_only;
        self
    }

    /// The configuration an acquisition of `lock` assumes: as last seen; and when only
    /// configured locks may be taken, read first if never seen, and none is
    /// [`Error::NotConfigured`] (nothing written). The write checks the configuration it
    /// assumes, so one an operator removed meanwhile is refused, learnt, and refused here.
    async fn acquiring_config(&self, lock: &LockName) -> Result<Option<LockConfig>, Error> {
        let required = match &self.configured_only {
            ConfiguredOnly::No => false,
            ConfiguredOnly::Yes { except } => except.as_ref() != Some(lock),
        };
        if !required {
            return Ok(self.assumed_config(lock));
        }
        let known = self.configs.lock().expect("configs").get(lock).copied();
        let config = match known {
            Some(config) => config,
            None => {
                let config = self.store.load(lock).await?.and_then(|item| item.config);
                self.saw_config(lock, config);
                config
            }
        };
        match config {
            Some(config) => Ok(Some(config)),
            None => Err(Error::NotConfigured { lock: lock.clone() }),
        }
    }

    /// The slots this semaphore (and its clones) took back since the last call, oldest first
    /// (at most [`KEPT_TAKE_BACKS`]).
    pub fn drain_taken_back(&self) -> Vec<TakenBackSlot> {
        self.taken_back
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .drain(..)
            .collect()
    }

    fn noted_taken_back(&self, slots: &[TakenBackSlot]) {
        let mut kept = self.taken_back.lock().unwrap_or_else(|e| e.into_inner());
        kept.extend(slots.iter().cloned());
        let over = kept.len().saturating_sub(KEPT_TAKE_BACKS);
        kept.drain(..over);
    }

    /// The configuration of `lock` as last seen (`None`: not configured, or never seen).
    fn assumed_config(&self, lock: &LockName) -> Option<LockConfig> {
        self.configs
            .lock()
            .expect("configs")
            .get(lock)
            .copied()
            .flatten()
    }

    /// Remembers the configuration of `lock` a write found.
    fn saw_config(&self, lock: &LockName, config: Option<LockConfig>) {
        self.configs
            .lock()
            .expect("configs")
            .insert(lock.clone(), config);
    }

    /// Sets (`None`: removes) the operator configuration of `lock` (F14), creating its item if
    /// it has none; the item as it is after. Nobody is evicted: a limit below the weight held
    /// admits nobody until the holders drain under it. One write.
    pub async fn configure(
        &self,
        lock: &LockName,
        config: Option<LockConfig>,
    ) -> Result<SemaphoreItem, Error> {
        let write = protocol::configure(lock, config);
        match self.store.write(&write).await? {
            protocol::WriteResult::Applied { before } => {
                self.saw_config(lock, config);
                write.apply(before.as_ref()).map_err(|_| {
                    StoreError::Unexpected {
                        lock: lock.to_string(),
                        problem: "a configuration has no check to fail".to_owned(),
                    }
                    .into()
                })
            }
            _ => Err(StoreError::Unexpected {
                lock: lock.to_string(),
                problem: "a configuration, which checks nothing, was refused".to_owned(),
            }
            .into()),
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
