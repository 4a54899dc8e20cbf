//! The product's protocol, as the world sees it: every write is the core's own
//! ([`protocol::acquire`], [`protocol::release`] and [`protocol::release_unheld`],
//! [`protocol::cleanup_fence`] and [`protocol::cleanup_free`], [`protocol::rotation`]), every
//! landing is [`Write::apply`] (what the memory store does, and what the DynamoDB store renders:
//! applied iff its checks hold on the item as it is when it lands), and every answer is the
//! core's reading of the result
//! ([`protocol::acquired`], [`protocol::fenced_slots`], ...), including the write a refused
//! release or free calls for ([`Step::Again`]), sent as the attempt's next write.
//!
//! Items and writes are interned (each distinct one gets a small number) so that world states
//! stay small and cheap to hash; since everything is pure, each (call, phase, item, tick) is
//! decided once and remembered.
//!
//! Time: the world's ticks are seconds from [`NOW_MS`], and the protocol runs with a horizon of
//! one tick and no clock skew ([`TIMING`]), so its fence window is one tick too: a request made
//! at tick t expires at tick t + 1, and fences may rotate once a tick after the last rotation.
//! Clock skew is not modelled; `Timing`'s derivation adds it to the window.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::time::Duration;

use clap::ValueEnum;
use semaphore_core::item::{FenceKey, Identity, Layout, Run, SemaphoreItem};
use semaphore_core::protocol::{self, FenceReason, Step, Timing, WriteResult};
use semaphore_core::{
    AcquireOutcome, AcquisitionId, Change, Check, HolderId, Limit, LockConfig, LockName, Terms,
    Weight, Write,
};

use crate::hash::{hash_one, Build};
use crate::plumbing::{
    claim_of, exec_name, read, say, show_holders, show_write, shown, Interner, ItemKey, Memo,
    Naming, Variants, GONE,
};
use crate::world::{
    acquisition_name, slot_bit, Advance, Answer, Next, Op, OpKind, Protocol, MAX_INCARNATIONS,
};

/// The model's clock at tick 0 (2023-11-14T22:13:20Z).
pub const NOW_MS: u64 = 1_700_000_000_000;
/// One tick of the world's clock.
pub const TICK_MS: u64 = 1_000;
/// The protocol's timing in the model: horizon and fence window of one tick.
pub const TIMING: Timing = Timing {
    horizon: Duration::from_millis(TICK_MS),
    clock_skew: Duration::ZERO,
};

/// Most writes one release or one cleanup's free sends before the core gives up with an error:
/// the core's, as the type the model counts rounds in.
pub const MAX_ROUNDS: u8 = semaphore_core::MAX_ROUNDS as u8;

fn tick_ms(tick: u8) -> u64 {
    NOW_MS + u64::from(tick) * TICK_MS
}

/// A deliberately broken protocol, to show that the checker notices. Each variant alters a real
/// write (or how it is decided); the core itself is untouched.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Variant {
    /// The product as it is.
    Real,
    /// Cleanup writes no execution fence (a zombie acquire can land after it).
    CleanupWithoutFence,
    /// Cleanup reads first and writes nothing when the execution holds nothing (as the AWS
    /// sample does), so an acquire still in flight lands after it.
    CleanupSkipsWhenNothingHeld,
    /// Release writes no acquisition fence (a late retry of the acquire can land).
    ReleaseWithoutFence,
    /// The acquire's write does not check the limit.
    AcquireWithoutLimit,
    /// The acquire checks the fences when it is sent, on the item as it is then, not when its
    /// write lands.
    AcquireChecksFencesWhenSent,
    /// The acquire's write does not name the horizon: a rotation that drops fences does not
    /// invalidate acquires decided before it.
    RotationWithoutHorizon,
    /// A redrive into the protected work runs the work again (nothing ties the work task to the
    /// acquisition, e.g. its child execution gets a fresh name), without a slot of the new
    /// incarnation: the old one's is cleanup's to free, at any moment (S1).
    RedriveWithoutGuard,
    /// A redriven incarnation acquires (and releases) with the first incarnation's acquisition
    /// id instead of its own. Cleanup frees the slots its fence saw, by identity, with a second
    /// write that may land arbitrarily late: if the old incarnation held a slot when the fence
    /// landed and the redriven one takes a slot with the same identity once the fence is gone,
    /// that late free removes the new incarnation's slot while it works (S1). A fence keeps
    /// zombies of the old incarnation out, but nothing can tell the old slot from the new one.
    RedriveReusesAcquisition,
    /// Cleanup never asks whether the execution runs again: a late event of an old incarnation
    /// fences the run the execution is in now (the redriven one, running) and frees every slot
    /// of it: the running incarnation is refused (L1), or loses its slot while it works (S1).
    CleanupIgnoresRedrive,
    /// Cleanup (and the sweeper) ask whether the execution runs only before the fence, then
    /// free whatever the fence saw: an incarnation redriven between the question and the fence
    /// may take a slot the fence sees and frees, while it works (S1). Hence the real cleanup
    /// (and `Semaphore::sweep`) asks again once the fence has landed, before freeing.
    CleanupChecksRunningOnlyBeforeFence,
    /// One execution fence for every run, runs not told apart: a redriven run's acquire is refused
    /// while the fence of an earlier run's cleanup stands (answered "redriven": it waits for the
    /// fence to rotate out), and the cleanup of its own end adds the same key again, which keeps
    /// the age of the first. A rotation then drops it a window too early for an acquire the
    /// redriven run requested after the first fence (S3).
    OneFenceForEveryRun,
    /// The release's write without its check that the slot is held with the weight it
    /// subtracts (as a naive `REMOVE holder ADD used -weight` would be): a release of an
    /// acquisition that holds nothing (it gave up after "full", or its slot was cleaned up, or
    /// a duplicate) still subtracts its weight, `used` drifts below the weight held, and the
    /// limit is exceeded (S1).
    ReleaseWithoutWeightCheck,
    /// The acquire's write does not check that the lock's configuration is the one it assumed
    /// (F14): an execution that asks for its own, higher limit of a lock its operator
    /// configured lower takes a slot on its own terms, past the configured limit (S1).
    AcquireIgnoresConfiguration,
    /// The release of a redriven run frees only that run's own acquisition. A run redriven into the
    /// protected work while the first run's child still runs re-attaches to it (`StartExecution` of
    /// a running execution's name and input returns that execution) and works under the first run's
    /// slot; the cleanup of the first run, finding the execution running again, leaves that slot to
    /// it, but its release frees only its own (nothing): the execution succeeds still holding the
    /// first run's slot, which only the sweeper frees, with a leak notice (S2).
    ReleaseFreesOnlyItsRun,
    /// The release's write checks the slot's weight but not the token it shows (as it did before
    /// F15): a stray release (another slot's acquire answer naming this slot's acquisition, a bug
    /// in a consumer's machine) frees the slot of an execution still doing its work, and another
    /// takes it (S1).
    ReleaseIgnoresToken,
    /// A gate lock's tombstones are dropped at any moment, with no rotation to make the late
    /// attempts of their acquisitions expire first (as a TTL on the holding items alone would):
    /// a late acquire of a released acquisition lands once its tombstone is gone (S3).
    DropTombstoneEarly,
    /// A gate lock's tombstone is dropped once *a* rotation happened after its release, not
    /// a window after it: a rotation just after the release is no later than the horizon of
    /// an acquire requested just before it, which lands once the tombstone is gone (S3).
    DropTombstoneAtAnyRotation,
}

impl Variants for Variant {}

impl Variant {
    /// Whether the variant differs from the real protocol only in a world with redrives.
    /// The world a variant that differs from the real protocol only on a configured lock is
    /// checked in unless told otherwise: (the limit the executions ask for, the limit the lock
    /// is configured with).
    pub fn configured_world(self) -> Option<(u32, u32)> {
        (self == Self::AcquireIgnoresConfiguration).then_some((2, 1))
    }

    /// How many stray releases (F15) the world of a variant that differs from the real protocol
    /// only on them sends unless told otherwise.
    pub fn strays(self) -> u8 {
        u8::from(self == Self::ReleaseIgnoresToken)
    }

    /// Whether the variant breaks only the gate layout (its tombstones).
    pub fn needs_gate(self) -> bool {
        matches!(
            self,
            Self::DropTombstoneEarly | Self::DropTombstoneAtAnyRotation
        )
    }

    pub fn needs_redrives(self) -> bool {
        matches!(
            self,
            Self::RedriveWithoutGuard
                | Self::RedriveReusesAcquisition
                | Self::CleanupIgnoresRedrive
                | Self::CleanupChecksRunningOnlyBeforeFence
                | Self::OneFenceForEveryRun
                | Self::ReleaseFreesOnlyItsRun
        )
    }
}

/// Where one attempt (one operation's writes) is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Phase {
    /// About to send its first write, for a request made at tick `requested`.
    Start { requested: u8 },
    /// Write `write` (interned) is in flight; `second`: a cleanup's second write (its free);
    /// `round`: how many writes of the release, or of the free, were refused before it.
    Flight { write: u32, second: bool, round: u8 },
}

/// An item and what the world asks about it, computed once.
struct Interned {
    item: SemaphoreItem,
    /// The slots held (see `Protocol::holders`).
    holders: u32,
    /// What identifies it up to version numbers: the part about no execution in particular,
    /// and the part about each execution (see `Protocol::item_key`).
    keys: (u64, Vec<u64>),
}

/// A call, where it is, the stored item, the tick and (for a cleanup) whether its execution
/// runs: all that one step of it depends on.
type MemoKey = (Op, Phase, Option<u32>, u8, bool);

/// The product's protocol over the core's writes.
pub struct Ours {
    lock: LockName,
    limit: Limit,
    /// Per execution, the weight it acquires with.
    weights: Vec<Weight>,
    /// Per execution, the identity of each incarnation's acquisition: `exec-1#r0`, `exec-1#r1`...
    identities: Vec<Vec<Identity>>,
    /// Per identity, its execution and acquisition index.
    index: HashMap<Identity, (u8, u8), Build>,
    /// Each execution's fences of its runs and of its acquisitions (digests computed once).
    fences: Vec<(Vec<FenceKey>, Vec<FenceKey>)>,
    fence_names: HashMap<FenceKey, String>,
    variant: Variant,
    items: RefCell<Interner<ItemKey, Interned>>,
    writes: RefCell<Interner<Write, Write>>,
    memo: Memo<MemoKey, Advance<u32, Phase>>,
    /// The most writes one release or free has sent so far.
    most_rounds: Cell<u8>,
    /// The lock's configuration by its operator (F14), from before any execution started.
    configured: Option<LockConfig>,
    /// Where the lock keeps its holders and the fences of released acquisitions.
    layout: Layout,
}

impl Ours {
    /// Execution `e`'s acquire `write` (which assumed another configuration) as the same
    /// acquire sends it again on the lock's configuration `config`, as `Semaphore::acquire`
    /// does: the configuration assumed, and its terms with the execution's weight.
    fn on_config(&self, write: &Write, config: Option<LockConfig>, e: usize) -> Write {
        let terms = match &config {
            Some(config) => config
                .terms(&self.lock, self.weights[e])
                .expect("the world checks every weight against the configured limit"),
            None => self.terms(e as u8),
        };
        let mut again = write.clone();
        for check in &mut again.checks {
            match check {
                Check::Configured(assumed) => *assumed = config,
                Check::Fits { limit, .. } => *limit = terms.limit,
                _ => {}
            }
        }
        for change in &mut again.changes {
            if let Change::SetLimit(limit) = change {
                *limit = terms.limit;
            }
        }
        again
    }
    /// The protocol for `executions` executions of `weights` (one each) and up to
    /// `incarnations` incarnations each (one more than the world's redrives).
    pub fn new(
        executions: u8,
        limit: u32,
        weights: &[u32],
        incarnations: u8,
        variant: Variant,
    ) -> Self {
        assert!((1..=MAX_INCARNATIONS).contains(&usize::from(incarnations)));
        assert_eq!(weights.len(), usize::from(executions), "one weight each");
        let weights = weights
            .iter()
            .map(|&w| Weight::new(i64::from(w)).expect("a weight from 1 to 1000"))
            .collect();
        let identities: Vec<Vec<Identity>> = (0..executions)
            .map(|e| {
                let holder = HolderId::new(exec_name(e)).expect("a valid holder");
                (0..incarnations)
                    .map(|k| {
                        Identity::new(
                            holder.clone(),
                            AcquisitionId::new(acquisition_name(k)).expect("a valid acquisition"),
                        )
                    })
                    .collect()
            })
            .collect();
        let mut index = HashMap::default();
        let mut fence_names = HashMap::new();
        for (e, mine) in identities.iter().enumerate() {
            for k in 0..incarnations {
                let name = if k == 0 {
                    format!("{} (execution)", mine[0].holder)
                } else {
                    format!("{} run {k} (execution)", mine[0].holder)
                };
                fence_names.insert(
                    FenceKey::execution(&mine[0].holder, Run(u32::from(k))),
                    name,
                );
            }
            for (k, identity) in mine.iter().enumerate() {
                index.insert(identity.clone(), (e as u8, k as u8));
                fence_names.insert(
                    FenceKey::acquisition(identity),
                    format!("{}/{} (acquisition)", identity.holder, identity.acquisition),
                );
            }
        }
        let fences = identities
            .iter()
            .map(|mine| {
                (
                    (0..incarnations)
                        .map(|k| FenceKey::execution(&mine[0].holder, Run(u32::from(k))))
                        .collect(),
                    mine.iter().map(FenceKey::acquisition).collect(),
                )
            })
            .collect();
        Self {
            lock: LockName::new("model").expect("a valid lock name"),
            limit: Limit::new(i64::from(limit)).expect("a limit from 1 to 1000"),
            weights,
            identities,
            index,
            fences,
            fence_names,
            variant,
            items: RefCell::default(),
            writes: RefCell::default(),
            memo: Memo::default(),
            most_rounds: Cell::new(0),
            configured: None,
            layout: Layout::Item,
        }
    }

    /// The lock in `layout` from before any execution starts.
    pub fn in_layout(mut self, layout: Layout) -> Self {
        self.layout = layout;
        self
    }

    /// The lock configured by its operator with `limit` before any execution starts (F14);
    /// `None`: not configured.
    pub fn configured(mut self, limit: Option<u32>) -> Self {
        self.configured = limit.map(|limit| {
            LockConfig::new(
                Limit::new(i64::from(limit)).expect("a limit from 1 to 1000"),
                None,
                None,
            )
            .expect("no largest weight")
        });
        self
    }

    /// The most writes one release, or one cleanup's free, has sent in the states explored so
    /// far (the core gives up after [`MAX_ROUNDS`]).
    pub fn most_rounds(&self) -> u8 {
        self.most_rounds.get()
    }

    /// What execution `e` acquires on: the lock's limit and its weight, no rate.
    fn terms(&self, e: u8) -> Terms {
        Terms::new(self.limit, self.weights[usize::from(e)], None)
            .expect("the world checks that every weight is within the limit")
    }

    /// The identity `op`'s incarnation acquires and releases with (for a cleanup: the
    /// execution's first; a cleanup only uses the holder).
    fn identity(&self, op: Op) -> &Identity {
        &self.identities[op.exec as usize][self.acquisition_of(op.inc) as usize]
    }

    /// The acquisition index of one of execution `e`'s identities.
    fn acquisition_index(&self, identity: &Identity, e: usize) -> u8 {
        let (exec, k) = self.index[identity];
        assert_eq!(
            usize::from(exec),
            e,
            "a write of one execution names another"
        );
        k
    }

    /// Whether a cleanup asks `DescribeExecution` again once its fence has landed, and frees
    /// nothing if the execution runs again by then.
    fn rechecks_after_fence(&self) -> bool {
        !matches!(
            self.variant,
            Variant::CleanupIgnoresRedrive | Variant::CleanupChecksRunningOnlyBeforeFence
        )
    }

    /// Whether `op` is the release of a redriven run, which, once its own acquisition is
    /// released, frees what the earlier runs of its execution hold (the cleanup's two writes for
    /// runs 0..n-1, sent by the execution itself, with no `DescribeExecution`): a slot an earlier
    /// run took that no cleanup freed, because the execution ran again when it asked (a child
    /// re-attached to, or a zombie acquire).
    fn clears_runs(&self, op: Op) -> bool {
        op.kind == OpKind::Release && op.inc > 0 && self.variant != Variant::ReleaseFreesOnlyItsRun
    }

    /// Whether `write` is a cleanup's fence (no check, fences only): for a release of a
    /// redriven run with `second`, its fence of the earlier runs rather than their free.
    fn is_fence(write: &Write) -> bool {
        write.checks.is_empty()
            && write
                .changes
                .iter()
                .all(|c| matches!(c, Change::AddFence(_)))
    }

    fn intern(&self, item: SemaphoreItem) -> u32 {
        Interner::intern(&self.items, ItemKey(item), |ItemKey(item)| Interned {
            item: item.clone(),
            holders: item
                .holders
                .keys()
                .map(|id| {
                    let (e, k) = self.index[id];
                    slot_bit(e, k)
                })
                .fold(0u32, |m, bit| m | bit),
            keys: self.keys(item),
        })
    }

    fn intern_write(&self, write: Write) -> u32 {
        Interner::intern(&self.writes, write, Write::clone)
    }

    fn interned(&self, id: u32) -> std::cell::Ref<'_, Interned> {
        std::cell::Ref::map(self.items.borrow(), |items| items.get(id))
    }

    fn item(&self, id: Option<u32>) -> Option<SemaphoreItem> {
        id.map(|id| self.interned(id).item.clone())
    }

    fn write(&self, id: u32) -> Write {
        self.writes.borrow().get(id).clone()
    }

    /// What a fence key means, relative to execution `e`: 1 + 2k the fence of its run k, 2 + 2k
    /// the fence of its acquisition k, 0 neither.
    fn fence_role(&self, key: &FenceKey, e: usize) -> u8 {
        let (runs, acquisitions) = &self.fences[e];
        if let Some(k) = runs.iter().position(|run| run == key) {
            1 + 2 * k as u8
        } else if let Some(k) = acquisitions.iter().position(|acq| acq == key) {
            2 + 2 * k as u8
        } else {
            0
        }
    }

    /// The run whose execution fence incarnation `inc` checks and its cleanup writes: its own
    /// (in the broken variant, the first run's, for every run).
    fn run_of(&self, inc: u8) -> Run {
        if self.variant == Variant::OneFenceForEveryRun {
            Run::FIRST
        } else {
            Run(u32::from(inc))
        }
    }

    /// The item's keys (see [`Interned::keys`]): everything but the version, the tokens and when
    /// slots were taken, which no check ever reads.
    fn keys(&self, item: &SemaphoreItem) -> (u64, Vec<u64>) {
        let fences = &item.fences;
        let fenced = |key| (fences.young.contains(key), fences.old.contains(key));
        let per_exec: Vec<u64> = self
            .identities
            .iter()
            .zip(&self.fences)
            .map(|(mine, (runs, acquisitions))| {
                // When a slot was taken is only ever reported, never checked.
                let acquisitions: Vec<_> = mine
                    .iter()
                    .zip(acquisitions)
                    .map(|(identity, acq)| {
                        let weight = item.holders.get(identity).map(|h| h.weight);
                        (weight, fenced(acq), item.tombstones.get(identity))
                    })
                    .collect();
                let runs: Vec<_> = runs.iter().map(fenced).collect();
                hash_one(&(runs, acquisitions))
            })
            .collect();
        let known_holders = item
            .holders
            .keys()
            .filter(|id| self.index.contains_key(*id))
            .count();
        // Anything not about one of the executions would have to be keyed here; the model's
        // items hold nothing else.
        assert_eq!(
            known_holders,
            item.holders.len(),
            "a holder from outside the model"
        );
        assert!(
            item.fences
                .young
                .iter()
                .chain(&item.fences.old)
                .all(|k| self.fence_names.contains_key(k)),
            "a fence from outside the model"
        );
        // The last start (`started_at_ms`) is read only by a start rate, which no execution here
        // asks for; `used` is read by every acquire's limit check.
        let common = hash_one(&(
            1u8,
            item.layout,
            &item.lock,
            item.limit,
            item.fences.rotated_at_ms,
            item.used,
            item.rate,
            item.config,
        ));
        (common, per_exec)
    }

    /// A write of execution `e`'s, with `e`'s identity and fences abstracted away, so that the
    /// same write of another execution has the same key.
    fn write_key(&self, write: &Write, e: usize) -> u64 {
        let mut h = crate::hash::Fingerprint::default();
        for check in &write.checks {
            match check {
                Check::NotHolding(identity) => {
                    (1u8, self.acquisition_index(identity, e)).hash(&mut h)
                }
                Check::Fits { limit, weight } => (2u8, limit, weight).hash(&mut h),
                // The same for every identity: room for the largest entry.
                Check::Room => 17u8.hash(&mut h),
                // The token is the one the identity's slot has (or GONE): the same relation for
                // every execution, whatever the versions (see `plumbing::GONE`).
                Check::HoldsSlot {
                    identity,
                    token,
                    weight,
                } => (
                    15u8,
                    self.acquisition_index(identity, e),
                    weight,
                    *token == GONE,
                )
                    .hash(&mut h),
                Check::Spaced { rate, now_ms } => (16u8, rate, now_ms).hash(&mut h),
                Check::NotFenced(key) => (3u8, self.fence_role(key, e)).hash(&mut h),
                Check::NotReleased(identity) => {
                    (23u8, self.acquisition_index(identity, e)).hash(&mut h)
                }
                Check::TombstoneAt { identity, at_ms } => {
                    (24u8, self.acquisition_index(identity, e), at_ms).hash(&mut h)
                }
                Check::RotatedSince { at_ms } => (25u8, at_ms).hash(&mut h),
                Check::Idle => 26u8.hash(&mut h),
                Check::RotatedBefore { deadline_ms } => (4u8, deadline_ms).hash(&mut h),
                Check::LastRotation(at) => (5u8, at).hash(&mut h),
                Check::Configured(config) => (18u8, config).hash(&mut h),
                Check::LeaseUntil { identity, until_ms } => {
                    (21u8, self.acquisition_index(identity, e), until_ms).hash(&mut h)
                }
                // This world has no line (see `queue` for the one that has): these hold the
                // same way for every execution.
                Check::QueueEmpty => 11u8.hash(&mut h),
                Check::Busy { terms, now_ms } => (12u8, terms, now_ms).hash(&mut h),
                Check::NotQueued(_)
                | Check::Queued(_)
                | Check::QueuedBefore { .. }
                | Check::QueuedWith { .. } => 13u8.hash(&mut h),
            }
        }
        for change in &write.changes {
            match change {
                // When the slot is taken (the last start) is read by no check here (no rate).
                Change::PutHolder {
                    identity, weight, ..
                } => (6u8, self.acquisition_index(identity, e), weight).hash(&mut h),
                Change::SetLimit(limit) => (7u8, limit).hash(&mut h),
                Change::SetRate(rate) => (17u8, rate).hash(&mut h),
                Change::Configure(config) => (19u8, config).hash(&mut h),
                Change::SetLease { identity, until_ms } => {
                    (22u8, self.acquisition_index(identity, e), until_ms).hash(&mut h)
                }
                Change::RemoveHolder { identity, weight } => {
                    (8u8, self.acquisition_index(identity, e), weight).hash(&mut h)
                }
                Change::AddFence(key) => (9u8, self.fence_role(key, e)).hash(&mut h),
                // The release time only dates a tombstone (the gate layout).
                Change::FenceAcquisition { identity, at_ms } => (
                    27u8,
                    self.acquisition_index(identity, e),
                    (self.layout == Layout::Gate).then_some(*at_ms),
                )
                    .hash(&mut h),
                Change::DropTombstone(identity) => {
                    (28u8, self.acquisition_index(identity, e)).hash(&mut h)
                }
                Change::SetLayout(layout) => (29u8, layout).hash(&mut h),
                Change::Rotate { at_ms, .. } => (10u8, at_ms).hash(&mut h),
                Change::Enqueue(_) | Change::Dequeue(_) | Change::Repark { .. } => {
                    14u8.hash(&mut h)
                }
            }
        }
        h.finish()
    }

    fn show(&self, item: Option<&SemaphoreItem>) -> String {
        let Some(item) = item else {
            return "no item".to_owned();
        };
        let mut text = show_holders(self, item, &self.weights, "");
        if let Some(config) = &item.config {
            text.push_str(&format!(", configured with limit {}", config.limit));
        }
        for (generation, keys) in [("young", &item.fences.young), ("old", &item.fences.old)] {
            if !keys.is_empty() {
                let names: Vec<&str> = keys
                    .iter()
                    .map(|k| {
                        self.fence_names
                            .get(k)
                            .map_or("an unknown fence", String::as_str)
                    })
                    .collect();
                text.push_str(&format!(", {generation} fences: {}", names.join(", ")));
            }
        }
        if !item.tombstones.is_empty() {
            let stones: Vec<String> = item
                .tombstones
                .iter()
                .map(|(identity, at)| {
                    format!(
                        "{}/{} (released at tick {})",
                        identity.holder,
                        identity.acquisition,
                        at.saturating_sub(NOW_MS) / TICK_MS
                    )
                })
                .collect();
            text.push_str(&format!(", tombstones: {}", stones.join(", ")));
        }
        if let Some(at) = item.fences.rotated_at_ms {
            text.push_str(&format!(
                ", rotated at tick {}",
                at.saturating_sub(NOW_MS) / TICK_MS
            ));
        }
        text
    }

    /// Sends the first write of `op` for a request made at tick `requested`, or answers at once.
    /// `running`: whether `op`'s execution runs (for a cleanup, what `DescribeExecution` says).
    fn send(
        &self,
        op: Op,
        requested: u8,
        store: Option<u32>,
        now: u8,
        running: bool,
        log: Option<&mut String>,
    ) -> Advance<u32, Phase> {
        let identity = self.identity(op);
        let current = self.item(store);
        let finished = |answer, words: String, log: Option<&mut String>| {
            say(log, || words);
            Advance {
                store,
                wrote: false,
                next: Next::Finished(answer),
            }
        };
        let write = match op.kind {
            OpKind::Acquire => {
                let (runs, _) = &self.fences[op.exec as usize];
                let execution = &runs[self.run_of(op.inc).0 as usize];
                let fenced = current
                    .as_ref()
                    .is_some_and(|item| item.is_fenced(execution) || item.is_released(identity));
                if self.variant == Variant::AcquireChecksFencesWhenSent && fenced {
                    return finished(
                        Answer::Fenced,
                        "sees itself fenced; no write (broken variant)".to_owned(),
                        log,
                    );
                }
                let sent = protocol::acquire(
                    &self.lock,
                    identity,
                    self.run_of(op.inc),
                    None,
                    self.terms(op.exec),
                    tick_ms(requested),
                    tick_ms(now),
                    &TIMING,
                );
                let Ok(mut write) = sent else {
                    return finished(
                        Answer::Expired,
                        format!("its request (tick {requested}) is past its horizon; no write"),
                        log,
                    );
                };
                write.checks.retain(|check| match check {
                    Check::Configured(_) => self.variant != Variant::AcquireIgnoresConfiguration,
                    Check::Fits { .. } => self.variant != Variant::AcquireWithoutLimit,
                    Check::NotFenced(_) | Check::NotReleased(_) => {
                        self.variant != Variant::AcquireChecksFencesWhenSent
                    }
                    Check::RotatedBefore { .. } => self.variant != Variant::RotationWithoutHorizon,
                    _ => true,
                });
                write
            }
            // The release believes it holds a slot of its acquire's weight (the weight is in the
            // execution's input), and shows the token its acquire was answered (F15). One that was
            // never answered a slot (it gave up, or its acquire failed) releases as the operator
            // does: the fence alone, on the check that it holds nothing.
            OpKind::Release => {
                let weight = self.weights[usize::from(op.exec)];
                let write = match current.as_ref().and_then(|item| item.holders.get(identity)) {
                    Some(held) => {
                        protocol::release(&self.lock, identity, held.token, weight, tick_ms(now))
                    }
                    None => protocol::release_unheld(&self.lock, identity, tick_ms(now)),
                };
                self.release_write(write)
            }
            // F15: another slot's acquire answer names this one's acquisition: its token is not
            // this slot's (from this slot's point of view, as good as one no slot has). A store
            // that checked the weight only (the broken variant) frees the slot whatever the token.
            OpKind::StrayRelease => {
                let weight = self.weights[usize::from(op.exec)];
                let shown = match self.variant {
                    Variant::ReleaseIgnoresToken => shown(current.as_ref(), identity, weight).token,
                    _ => GONE,
                };
                protocol::release(&self.lock, identity, shown, weight, tick_ms(now))
            }
            // The execution was redriven since its event (or since the sweeper listed it): the
            // cleanup asks DescribeExecution first, and stops.
            OpKind::Cleanup if running && self.variant != Variant::CleanupIgnoresRedrive => {
                return finished(
                    Answer::Running,
                    format!(
                        "DescribeExecution: {} is RUNNING (redriven): nothing to do",
                        identity.holder
                    ),
                    log,
                );
            }
            OpKind::Cleanup => {
                let holds = current
                    .as_ref()
                    .is_some_and(|item| item.slots_of(&identity.holder).next().is_some());
                if self.variant == Variant::CleanupSkipsWhenNothingHeld && !holds {
                    return finished(
                        Answer::Done,
                        format!(
                            "reads {}: {} holds nothing, nothing to write (broken variant)",
                            self.show(current.as_ref()),
                            identity.holder
                        ),
                        log,
                    );
                }
                // The run the execution ended in (what DescribeExecution said when the cleanup
                // began) and every run before it.
                let mut write =
                    protocol::cleanup_fence(&self.lock, &identity.holder, self.run_of(op.inc));
                if self.variant == Variant::CleanupWithoutFence {
                    write.changes.clear();
                }
                write
            }
        };
        self.in_flight(write, false, 0, store, log)
    }

    /// The drop of the first tombstone `item` may shed (see `protocol::drop_tombstones`), as
    /// the variant judges it.
    fn tombstone_drop(&self, item: &SemaphoreItem) -> Option<Write> {
        let drop = |identity: &Identity, at_ms: u64| Write {
            lock: item.lock.clone(),
            checks: vec![Check::TombstoneAt {
                identity: identity.clone(),
                at_ms,
            }],
            changes: vec![Change::DropTombstone(identity.clone())],
        };
        match self.variant {
            Variant::DropTombstoneEarly => {
                let (identity, at_ms) = item.tombstones.iter().next()?;
                Some(drop(identity, *at_ms))
            }
            Variant::DropTombstoneAtAnyRotation => {
                let rotated = item.fences.rotated_at_ms?;
                let (identity, at_ms) = item.tombstones.iter().find(|(_, at)| **at <= rotated)?;
                Some(drop(identity, *at_ms))
            }
            _ => protocol::drop_tombstones(item, &TIMING).into_iter().next(),
        }
    }

    /// A release's write (the first, or one a refusal called for) as the variant sends it.
    fn release_write(&self, mut write: Write) -> Write {
        match self.variant {
            Variant::ReleaseWithoutFence => {
                write
                    .changes
                    .retain(|c| !matches!(c, Change::FenceAcquisition { .. }));
            }
            Variant::ReleaseWithoutWeightCheck => {
                write
                    .checks
                    .retain(|c| !matches!(c, Check::HoldsSlot { .. }));
            }
            _ => {}
        }
        write
    }

    fn in_flight(
        &self,
        write: Write,
        second: bool,
        round: u8,
        store: Option<u32>,
        log: Option<&mut String>,
    ) -> Advance<u32, Phase> {
        if round + 1 > self.most_rounds.get() {
            self.most_rounds.set(round + 1);
        }
        say(log, || {
            format!("sends {} [in flight]", show_write(self, &write))
        });
        Advance {
            store,
            wrote: false,
            next: Next::Continue(Phase::Flight {
                write: self.intern_write(write),
                second,
                round,
            }),
        }
    }

    /// The write a refusal calls for, sent as the next round; after [`MAX_ROUNDS`] writes the
    /// core gives up with an error, which the caller sees as a failed request.
    fn again(
        &self,
        write: Write,
        second: bool,
        round: u8,
        store: Option<u32>,
        mut log: Option<&mut String>,
    ) -> Advance<u32, Phase> {
        if round + 1 >= MAX_ROUNDS {
            say(log, || {
                format!("; refused {MAX_ROUNDS} times: the core gives up")
            });
            return Advance {
                store,
                wrote: false,
                next: Next::Finished(Answer::Lost),
            };
        }
        say(log.as_deref_mut(), || {
            "; the item handed back calls for another write: it ".to_owned()
        });
        self.in_flight(write, second, round + 1, store, log)
    }

    /// The write lands on the item as it is: the core's `Write::apply`, as the memory store
    /// applies it.
    fn land(&self, write: &Write, store: Option<u32>) -> (WriteResult, Option<u32>) {
        let current = self.item(store);
        match write.apply(current.as_ref()) {
            Ok(next) => (
                WriteResult::Applied { before: current },
                Some(self.intern(next)),
            ),
            Err(_) => (
                WriteResult::Refused {
                    current: current.unwrap_or_else(|| SemaphoreItem::empty(self.lock.clone())),
                    waiter_refused: false,
                },
                store,
            ),
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn arrive(
        &self,
        op: Op,
        write: u32,
        second: bool,
        round: u8,
        store: Option<u32>,
        running: bool,
        mut log: Option<&mut String>,
    ) -> Advance<u32, Phase> {
        let identity = self.identity(op);
        let write = self.write(write);
        let (result, after) = self.land(&write, store);
        let wrote = matches!(result, WriteResult::Applied { .. });
        say(log.as_deref_mut(), || {
            format!(
                "its write ({}) {}: {} -> ",
                show_write(self, &write),
                if wrote { "lands" } else { "is refused" },
                self.show(self.item(after).as_ref())
            )
        });
        let answer = match op.kind {
            OpKind::StrayRelease => {
                match read(protocol::released(
                    &write,
                    identity,
                    claim_of(&write),
                    result,
                )) {
                    Step::Done((outcome, _)) => {
                        say(log, || format!("{outcome:?}"));
                        Answer::Done
                    }
                    Step::Again(next) => return self.again(next, false, round, after, log),
                }
            }
            OpKind::Acquire => {
                let outcome = read(protocol::acquired(&write, identity, self.limit, result));
                // F14: the lock is configured otherwise than this write assumed: the same
                // acquire sends it again on the configuration's terms (`Semaphore::acquire`).
                if let AcquireOutcome::Configured(actual) = &outcome {
                    say(log.as_deref_mut(), || {
                        format!("{outcome:?}; sends it again on the lock's configuration: ")
                    });
                    let again = self.on_config(&write, *actual, usize::from(op.exec));
                    return self.again(again, false, round, after, log);
                }
                let answer = match outcome {
                    AcquireOutcome::Acquired { .. } | AcquireOutcome::AlreadyHeld { .. } => {
                        Answer::Acquired
                    }
                    AcquireOutcome::Full { .. } => Answer::Full,
                    // One fence for every run: a redriven execution that was cleaned up
                    // before its redrive waits for the fence to go, and asks again.
                    AcquireOutcome::Fenced(FenceReason::ExecutionEnded)
                        if op.inc > 0 && self.variant == Variant::OneFenceForEveryRun =>
                    {
                        Answer::Redriven
                    }
                    AcquireOutcome::Fenced(_) => Answer::Fenced,
                    AcquireOutcome::Expired => Answer::Expired,
                    AcquireOutcome::RateLimited { .. } => {
                        unreachable!("no execution of the model asks for a start rate")
                    }
                    AcquireOutcome::Configured(_) => unreachable!("sent again above"),
                };
                say(log, || {
                    if answer == Answer::Redriven {
                        format!("{outcome:?}: outcome \"redriven\"")
                    } else {
                        format!("{outcome:?}")
                    }
                });
                answer
            }
            OpKind::Release if !second => {
                match read(protocol::released(
                    &write,
                    identity,
                    claim_of(&write),
                    result,
                )) {
                    // Whatever its own slot's outcome: the release function frees the earlier runs
                    // once its token freed its slot, or else once Step Functions says the
                    // execution is in this run (F15), which a run of this world always is.
                    Step::Done((outcome, _)) if self.clears_runs(op) => {
                        say(log.as_deref_mut(), || {
                            format!("{outcome:?}; then the earlier runs: it ")
                        });
                        let fence = protocol::cleanup_fence(
                            &self.lock,
                            &identity.holder,
                            self.run_of(op.inc - 1),
                        );
                        let mut advance = self.in_flight(fence, true, 0, after, log);
                        advance.wrote = wrote;
                        return advance;
                    }
                    Step::Done((outcome, _)) => {
                        say(log, || format!("{outcome:?}"));
                        Answer::Done
                    }
                    Step::Again(next) => {
                        let next = self.release_write(next);
                        return self.again(next, false, round, after, log);
                    }
                }
            }
            OpKind::Cleanup | OpKind::Release
                if (op.kind == OpKind::Cleanup && !second) || Self::is_fence(&write) =>
            {
                let (slots, _) = read(protocol::fenced_slots(&write, &identity.holder, result));
                // Asked once the fence has landed (modelled at that moment: a redrive after it
                // can only make the answer "running", and no acquire of the execution can land
                // in between): every slot the fence saw is of an incarnation that has ended,
                // unless the execution runs again, when one of them may be the new one's.
                if !slots.is_empty() && running && self.rechecks_after_fence() {
                    let names: Vec<String> = slots.iter().map(|(id, _)| self.who(id)).collect();
                    say(log, || {
                        format!(
                            "it saw {}; DescribeExecution: {} is RUNNING again (redriven): \
                             nothing freed",
                            names.join(", "),
                            identity.holder
                        )
                    });
                    return Advance {
                        store: after,
                        wrote,
                        next: Next::Finished(Answer::Running),
                    };
                }
                if !slots.is_empty() {
                    let free = protocol::cleanup_free(&self.lock, &slots);
                    let mut advance = self.in_flight(free, true, 0, after, log);
                    advance.wrote = wrote;
                    return advance;
                }
                say(log, || "it held nothing".to_owned());
                Answer::Done
            }
            OpKind::Cleanup | OpKind::Release => match read(protocol::freed(&write, result)) {
                Step::Done((outcome, _)) => {
                    say(log, || format!("freed {}", outcome.freed.len()));
                    Answer::Done
                }
                Step::Again(next) => return self.again(next, true, round, after, log),
            },
        };
        Advance {
            store: after,
            wrote,
            next: Next::Finished(answer),
        }
    }
}

impl Naming for Ours {
    /// By its execution alone when every execution has one acquisition.
    fn who(&self, identity: &Identity) -> String {
        if self.identities.first().is_some_and(|mine| mine.len() > 1) {
            format!("{}/{}", identity.holder, identity.acquisition)
        } else {
            identity.holder.to_string()
        }
    }

    fn fence(&self, key: &FenceKey) -> String {
        self.fence_names
            .get(key)
            .map_or("?".to_owned(), String::clone)
    }

    fn moment(&self, at_ms: u64) -> Option<String> {
        Some(format!("tick {}", at_ms.saturating_sub(NOW_MS) / TICK_MS))
    }
}

impl Protocol for Ours {
    type Item = u32;
    type Phase = Phase;

    fn name(&self) -> &'static str {
        match self.variant {
            Variant::Real => "the product's protocol (the core's writes, checked when they land)",
            _ => "a BROKEN variant of the product's protocol",
        }
    }

    fn initial_item(&self) -> Option<u32> {
        // The layout and the operator's configuration, written before any execution asks.
        let mut item = None;
        if self.layout != Layout::Item {
            let write = protocol::set_layout(&self.lock, self.layout);
            item = Some(write.apply(None).expect("a new lock is idle"));
        }
        if let Some(config) = self.configured {
            let write = protocol::configure(&self.lock, Some(config));
            item = Some(
                write
                    .apply(item.as_ref())
                    .expect("a configuration checks nothing"),
            );
        }
        item.map(|item| self.intern(item))
    }

    fn start(&self, op: Op, requested: u8) -> Phase {
        // Only an acquire's write depends on when it was requested.
        let requested = if op.kind == OpKind::Acquire {
            requested
        } else {
            0
        };
        Phase::Start { requested }
    }

    fn describe_start(&self, _op: Op) -> String {
        "about to send its write".to_owned()
    }

    fn in_flight(&self, phase: Phase) -> bool {
        matches!(phase, Phase::Flight { .. })
    }

    fn advance(
        &self,
        op: Op,
        phase: Phase,
        store: Option<u32>,
        now: u8,
        running: bool,
        log: Option<&mut String>,
    ) -> Advance<u32, Phase> {
        // Only a cleanup asks whether its execution runs.
        let running = running && op.kind == OpKind::Cleanup;
        let compute = |log| match phase {
            Phase::Start { requested } => self.send(op, requested, store, now, running, log),
            Phase::Flight {
                write,
                second,
                round,
            } => self.arrive(op, write, second, round, store, running, log),
        };
        if log.is_some() {
            return compute(log);
        }
        self.memo
            .get_or((op, phase, store, now, running), || compute(None))
    }

    fn rotation(&self, store: Option<u32>, now: u8) -> Option<Phase> {
        let item = self.item(store)?;
        // The sweeper's housekeeping: a rotation when one is due, else the drop of a tombstone.
        let write = protocol::rotation(&item, tick_ms(now), &TIMING)
            .or_else(|| self.tombstone_drop(&item))?;
        Some(Phase::Flight {
            write: self.intern_write(write),
            second: false,
            round: 0,
        })
    }

    fn land_rotation(
        &self,
        phase: Phase,
        store: Option<u32>,
        log: Option<&mut String>,
    ) -> Option<u32> {
        let Phase::Flight { write, .. } = phase else {
            return store;
        };
        let write = self.write(write);
        let (result, after) = self.land(&write, store);
        say(log, || {
            format!(
                "{} {}: {}",
                show_write(self, &write),
                if matches!(result, WriteResult::Applied { .. }) {
                    "lands"
                } else {
                    "is refused"
                },
                self.show(self.item(after).as_ref())
            )
        });
        after
    }

    fn holders(&self, store: Option<u32>) -> u32 {
        store.map_or(0, |id| self.interned(id).holders)
    }

    fn acquisition_of(&self, inc: u8) -> u8 {
        if self.variant == Variant::RedriveReusesAcquisition {
            0
        } else {
            inc
        }
    }

    /// The work task starts the child execution under a name made from the holder and the
    /// acquisition, so a redrive into it meets the child that already ran and fails.
    fn guards_redriven_work(&self) -> bool {
        self.variant != Variant::RedriveWithoutGuard
    }

    fn release_fences_earlier_runs(&self, op: Op, phase: Phase) -> bool {
        match phase {
            Phase::Flight {
                write,
                second: true,
                ..
            } => self.clears_runs(op) && Self::is_fence(&self.write(write)),
            _ => false,
        }
    }

    fn freeing(&self, phase: Phase) -> bool {
        matches!(phase, Phase::Flight { second: true, .. })
    }

    /// `used`: the sum of the held weights, which the acquire's condition checks.
    fn stored_used(&self, store: Option<u32>) -> i64 {
        self.item(store)
            .map_or(0, |item| i64::try_from(item.used).expect("a small sum"))
    }

    fn describe(&self, store: Option<u32>) -> String {
        self.show(self.item(store).as_ref())
    }

    /// States are identified without version numbers: no check reads the version or a token
    /// (they are only reported), so two states that differ only there have the same future.
    /// What is kept of an item is its holders (with their weights), its fences and its last
    /// rotation; of a write, its checks and changes up to the execution's name.
    fn item_key(&self, store: Option<u32>) -> u64 {
        store.map_or(0, |id| self.interned(id).keys.0)
    }

    fn item_exec_key(&self, store: Option<u32>, e: u8) -> u64 {
        store.map_or(0, |id| self.interned(id).keys.1[e as usize])
    }

    fn phase_key(&self, op: Op, phase: Phase) -> u64 {
        match phase {
            Phase::Start { requested } => hash_one(&(0u8, requested)),
            // A write in flight mentions its own execution only (its identity, its fences).
            Phase::Flight {
                write,
                second,
                round,
            } => hash_one(&(
                1u8,
                second,
                round,
                self.write_key(&self.write(write), op.exec as usize),
            )),
        }
    }

    fn rotation_exec_key(&self, phase: Phase, e: u8) -> u64 {
        let Phase::Flight { write, .. } = phase else {
            return 0;
        };
        let write = self.write(write);
        let mut roles: Vec<u8> = write
            .changes
            .iter()
            .filter_map(|c| match c {
                Change::Rotate { young_seen, .. } => Some(young_seen),
                _ => None,
            })
            .flat_map(|seen| seen.iter().map(|key| self.fence_role(key, e as usize)))
            .filter(|&role| role != 0)
            .collect();
        // The fences are a set ordered by their digests, which differ from one execution to
        // another: sorted, the roles key the same set the same way for every execution.
        roles.sort_unstable();
        // A tombstone drop in flight is about the execution whose tombstone it names.
        let mine = |identity: &Identity| self.index.get(identity).map(|(x, _)| *x) == Some(e);
        let drop: Vec<(u8, u64)> = write
            .checks
            .iter()
            .filter_map(|c| match c {
                Check::TombstoneAt { identity, at_ms } if mine(identity) => {
                    Some((self.acquisition_index(identity, e as usize), *at_ms))
                }
                _ => None,
            })
            .collect();
        hash_one(&(roles, drop))
    }

    fn rotation_key(&self, phase: Phase) -> u64 {
        let Phase::Flight { write, .. } = phase else {
            return 0;
        };
        let write = self.write(write);
        let at: Vec<u64> = write
            .changes
            .iter()
            .filter_map(|c| match c {
                Change::Rotate { at_ms, .. } => Some(*at_ms),
                _ => None,
            })
            .collect();
        // A tombstone drop's own check names an execution: `rotation_exec_key` keys it.
        let checks: Vec<&Check> = write
            .checks
            .iter()
            .filter(|c| !matches!(c, Check::TombstoneAt { .. }))
            .collect();
        hash_one(&(checks, at))
    }
}
