//! A holder that is not a state machine (a Lambda function, a container, a script) holding a
//! slot under a lease (F13): [`Semaphore::acquire_leased`] takes the slot, a background task
//! renews its lease, and [`LeasedSlot::release`] frees it.
//!
//! The holder counts its lease from when it *sent* each request that set it (the acquire, then
//! every heartbeat answered "renewed"): the write may land later than it was sent, and the
//! semaphore's take-back counts from the lease the write set. [`LeasedSlot::is_held`] is what
//! the holder checks before each piece of work: false once the lease has passed by its own
//! clock, or once a heartbeat was answered that the slot was taken back. A process paused past
//! its lease still believes it holds when it wakes, until it checks: pass
//! [`LeasedSlot::token`] to what the work writes, which should refuse a lower token than one it
//! has seen.
//!
//! Build its store with [`DynamoStore::with_retries`]`(`[`HOLDER_ATTEMPTS`](crate::dynamo::HOLDER_ATTEMPTS)`)`:
//! no Step Functions `Retry` stands behind this holder, and the SDK's default three attempts give
//! up on a release or a heartbeat too soon under throttling.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::dynamo::DynamoStore;
use crate::error::Error;
use crate::input::{Lease, LockName, Terms, Weight};
use crate::item::{Claim, FencingToken, Identity, Run};
use crate::protocol::{AcquireOutcome, HeartbeatOutcome, ReleaseOutcome};
use crate::semaphore::Semaphore;

/// What the holder knows of its slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SlotState {
    /// Held, its lease ending at `until_ms` by the holder's clock (counted from the send of
    /// the request that set it).
    Held { until_ms: u64 },
    /// Taken back (its lease passed unrenewed), released or cleaned up: the acquisition is
    /// fenced.
    Lost,
}

/// A slot held under a lease, renewed in the background every third of the lease.
pub struct LeasedSlot {
    semaphore: Semaphore<DynamoStore>,
    lock: LockName,
    identity: Identity,
    token: FencingToken,
    /// Its weight: with its token, what its heartbeats and its release show (F15).
    weight: Weight,
    state: watch::Receiver<SlotState>,
    heartbeats: JoinHandle<()>,
}

impl Semaphore<DynamoStore> {
    /// Takes a slot of `lock` for `identity` on `terms` (which must carry a lease) and starts
    /// renewing its lease in the background; the refusal (full, rate limited, fenced, expired)
    /// when no slot was taken.
    pub async fn acquire_leased(
        &self,
        lock: &LockName,
        identity: &Identity,
        terms: Terms,
    ) -> Result<Result<LeasedSlot, AcquireOutcome>, Error> {
        let lease = terms.lease.ok_or(Error::InvalidInput(
            crate::input::InputError::InvalidLease {
                got: "none: acquire_leased needs terms with a lease".to_owned(),
            },
        ))?;
        let sent_ms = self.now_ms();
        let (outcome, _) = self
            .acquire_seeing(lock, identity, Run::FIRST, terms, sent_ms)
            .await?;
        let token = match outcome {
            AcquireOutcome::Acquired { token, .. } | AcquireOutcome::AlreadyHeld { token, .. } => {
                token
            }
            refused => return Ok(Err(refused)),
        };
        let (tx, state) = watch::channel(SlotState::Held {
            until_ms: sent_ms + lease.as_ms(),
        });
        let claim = Claim::Slot {
            token,
            weight: terms.weight,
        };
        let heartbeats = tokio::spawn(renew(
            self.clone(),
            lock.clone(),
            identity.clone(),
            claim,
            lease,
            Arc::new(tx),
        ));
        Ok(Ok(LeasedSlot {
            semaphore: self.clone(),
            lock: lock.clone(),
            identity: identity.clone(),
            token,
            weight: terms.weight,
            state,
            heartbeats,
        }))
    }
}

/// Renews the lease every third of it until the slot is lost or the holder lets go.
async fn renew(
    semaphore: Semaphore<DynamoStore>,
    lock: LockName,
    identity: Identity,
    claim: Claim,
    lease: Lease,
    state: Arc<watch::Sender<SlotState>>,
) {
    let every = Duration::from_millis((lease.as_ms() / 3).max(1));
    loop {
        tokio::time::sleep(every).await;
        let sent_ms = semaphore.now_ms();
        match semaphore.heartbeat(&lock, &identity, claim, lease).await {
            Ok(HeartbeatOutcome::Renewed { .. }) => {
                state.send_replace(SlotState::Held {
                    until_ms: sent_ms + lease.as_ms(),
                });
            }
            Ok(HeartbeatOutcome::Lost) => {
                tracing::warn!(%lock, holder = %identity.holder, "the slot was taken back: its lease had passed");
                state.send_replace(SlotState::Lost);
                return;
            }
            // Another slot of this identity: not the one taken (it cannot be, an acquisition
            // holds once), so this one is gone.
            Ok(HeartbeatOutcome::WrongToken { held }) => {
                tracing::error!(%lock, holder = %identity.holder, held = held.0, "the identity holds a slot under another token");
                state.send_replace(SlotState::Lost);
                return;
            }
            // The next heartbeat tries again; meanwhile the lease runs on, and `is_held` says
            // when it has passed.
            Err(e) => {
                tracing::warn!(%lock, holder = %identity.holder, error = %e, "heartbeat failed")
            }
        }
    }
}

impl LeasedSlot {
    /// The slot's fencing token: pass it to what the work writes.
    pub fn token(&self) -> FencingToken {
        self.token
    }

    /// What the holder knows of its slot now.
    pub fn state(&self) -> SlotState {
        *self.state.borrow()
    }

    /// Whether the slot may still be used: its lease runs by this holder's clock, and no
    /// heartbeat was answered that it was lost. Check it before each piece of work.
    pub fn is_held(&self) -> bool {
        match self.state() {
            SlotState::Held { until_ms } => self.semaphore.now_ms() <= until_ms,
            SlotState::Lost => false,
        }
    }

    /// Stops the heartbeats and frees the slot (`NotHeld` if it was taken back meanwhile).
    pub async fn release(self) -> Result<ReleaseOutcome, Error> {
        self.heartbeats.abort();
        self.semaphore
            .release(
                &self.lock,
                &self.identity,
                Claim::Slot {
                    token: self.token,
                    weight: self.weight,
                },
            )
            .await
    }
}

impl Drop for LeasedSlot {
    /// A slot dropped without `release` stops being renewed: its lease runs out and it is
    /// taken back.
    fn drop(&mut self) {
        self.heartbeats.abort();
    }
}
