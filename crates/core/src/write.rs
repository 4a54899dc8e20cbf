//! Every write the protocol sends, as a plain value: the checks DynamoDB evaluates when the write
//! lands, and the changes it then makes. [`Write::apply`] is their meaning, as one pure function:
//! the in-memory store (and so the model checker) applies writes with it, and the DynamoDB store
//! renders the same value as one `UpdateItem` (see `dynamo::render`), so what is explored is what
//! is sent.
//!
//! No write is conditioned on the version. Acquirers do not conflict with each other: the limit,
//! the holder and the fences are checked when the write lands, against the item as it is then.
//! Release and cleanup check only the slots they remove (there, with the weight they subtract
//! from `used`), never anything another writer changes on its way. Only a rotation of the fences
//! names something it read (the time of the previous rotation), so that two rotations cannot both
//! drop fences.

use std::collections::BTreeSet;

use crate::input::{Limit, LockConfig, LockName, Rate, Terms, Weight};
use crate::item::{FenceKey, FencingToken, Holding, Identity, Layout, SemaphoreItem};
use crate::queue::{Attempt, Waiter, WaiterId, Wakeup};

/// A condition checked when the write lands. All of a write's checks must hold.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Check {
    /// The identity holds no slot (a retried acquire whose first attempt landed must not take a
    /// second one, F5).
    NotHolding(Identity),
    /// The weight fits: the weights held plus `weight` are at most `limit` (S1).
    Fits { limit: Limit, weight: Weight },
    /// The item has room for one more holder, of any identity (see
    /// [`crate::item::HELD_BYTES_BUDGET`]): DynamoDB refuses a write that makes an item over
    /// 400 KB, so admission stops first, and releases and cleanups, which shrink it, land.
    Room,
    /// The last start was at least the rate's spacing before `now_ms` (the writer's clock): a
    /// start-rate limit.
    Spaced { rate: Rate, now_ms: u64 },
    /// The identity holds the slot taken under `token`, of exactly this weight. A write that
    /// removes it subtracts that weight from `used`, so it must not land on a slot that is gone
    /// (a duplicate release would subtract twice) or of another weight; and it frees or renews
    /// only the slot whose token it shows (F15: a release or heartbeat carrying another slot's
    /// answer, from a bug in a consumer's machine or another tenant, must not free that slot).
    HoldsSlot {
        identity: Identity,
        token: FencingToken,
        weight: Weight,
    },
    /// The key is fenced in neither generation (F1-F3: a release or cleanup that landed first
    /// wins, however late this write lands).
    NotFenced(FenceKey),
    /// The acquisition was not released (nor taken back): its fence (item layout) or its
    /// tombstone (gate layout) is not there (F3: a late attempt of a released acquire must not
    /// take a slot again).
    NotReleased(Identity),
    /// The acquisition's tombstone is there, released at exactly `at_ms`: a drop removes only
    /// the tombstone it judged passed.
    TombstoneAt { identity: Identity, at_ms: u64 },
    /// The last rotation was at or after `at_ms` (rotations never move back, so a drop judged
    /// on a read stays sound whenever it lands).
    RotatedSince { at_ms: u64 },
    /// Nothing held, nobody in line, no fence and no tombstone: the lock may change layout.
    Idle,
    /// No rotation happened at or after `deadline_ms`: a write whose request is older than the
    /// horizon could have missed fences that a rotation dropped, so it must not land.
    RotatedBefore { deadline_ms: u64 },
    /// The last rotation is the one that was read (`None`: there was none yet), so concurrent
    /// rotations cannot both drop a generation.
    LastRotation(Option<u64>),
    /// Nobody waits in line: an acquire must not pass the queue (L2).
    QueueEmpty,
    /// A slot cannot be taken on `terms` at `now_ms` without passing the line: the weight does
    /// not fit, or someone waits, or the start rate is spent, or the item has no room. Queueing is allowed only then, so
    /// a waiter never queues behind a free slot that no one will hand it (F8).
    Busy { terms: Terms, now_ms: u64 },
    /// The identity's lease ends exactly at `until_ms`: a take-back takes only the lease it
    /// read as expired, never one a heartbeat renewed since (F13).
    LeaseUntil { identity: Identity, until_ms: u64 },
    /// The lock's operator configuration is exactly this (`None`: the lock is not configured):
    /// an acquisition or grant takes its terms from the configuration it assumed, so one that
    /// assumed another (a caller's own limit on a lock its operator configured, or a
    /// configuration changed meanwhile) must not land (F14).
    Configured(Option<LockConfig>),
    /// The waiter has no record in line (a retried or late queue write must not queue it twice,
    /// nor move it from its place).
    NotQueued(WaiterId),
    /// The waiter's record is there (with any task token).
    Queued(WaiterId),
    /// The waiter's record is there and holds the token of an attempt before `attempt`: a slow
    /// invocation of an attempt that timed out must not give the record its dead token after a
    /// later attempt gave it a live one.
    QueuedBefore { id: WaiterId, attempt: Attempt },
    /// The waiter's record is there with this wake-up: the grant wakes the token it read, so
    /// a waiter that parked anew since (a new token) is granted by a hand-off that read the new
    /// one, and is not woken with a token no task waits on; and a poller is granted only as
    /// alive as the hand-off judged it.
    QueuedWith { id: WaiterId, wakeup: Wakeup },
}

/// A change the write makes once every check holds. Every write also increments the version.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Change {
    /// Takes a slot of `weight` (added to `used`); its token is the version this write makes,
    /// and `acquired_at_ms` is the lock's last start.
    PutHolder {
        identity: Identity,
        acquired_at_ms: u64,
        weight: Weight,
    },
    SetLimit(Limit),
    SetRate(Option<Rate>),
    /// Frees the identity's slot if it holds one, and subtracts `weight` from `used` whether
    /// it did or not (as DynamoDB's `ADD` does): the write's checks must make sure it did.
    RemoveHolder {
        identity: Identity,
        weight: Weight,
    },
    /// Adds a fence to the young generation.
    AddFence(FenceKey),
    /// Fences the acquisition, released at `at_ms` by the writer's clock: a key in the young
    /// generation (item layout), or its holding item left as a tombstone (gate layout).
    FenceAcquisition {
        identity: Identity,
        at_ms: u64,
    },
    /// Removes a gate lock's tombstone (see [`SemaphoreItem::passed_tombstones`]).
    DropTombstone(Identity),
    /// Moves the lock to another layout (only while [`Check::Idle`] holds).
    SetLayout(Layout),
    /// Drops the old generation, moves `young_seen` (what the rotating writer read in the young
    /// generation) to the old one, and records the time.
    Rotate {
        young_seen: BTreeSet<FenceKey>,
        at_ms: u64,
    },
    /// Puts the waiter's record in line and counts it in `waiting`.
    Enqueue(Box<Waiter>),
    /// Removes the waiter's record from the line and uncounts it (a grant, or a waiter that
    /// left or died).
    Dequeue(WaiterId),
    /// Sets the identity's lease to end at `until_ms` (its acquire, grant or heartbeat).
    SetLease {
        identity: Identity,
        until_ms: u64,
    },
    /// Sets (or, `None`, removes) the lock's operator configuration (F14). It takes nothing from
    /// anyone: a lower limit admits nobody until the weight held is under it.
    Configure(Option<LockConfig>),
    /// Gives the waiter's record the wake-up of a later attempt (a parked task's token, or a
    /// poller's renewed time), keeping its place, and counts the check.
    Repark {
        id: WaiterId,
        wakeup: Wakeup,
        attempt: Attempt,
    },
}

/// One conditional write of one lock's item.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Write {
    pub lock: LockName,
    pub checks: Vec<Check>,
    pub changes: Vec<Change>,
}

impl Check {
    /// The waiter record the check is about, if it is about one.
    pub fn waiter_id(&self) -> Option<WaiterId> {
        match self {
            Self::NotQueued(id)
            | Self::Queued(id)
            | Self::QueuedBefore { id, .. }
            | Self::QueuedWith { id, .. } => Some(*id),
            _ => None,
        }
    }

    /// Whether the check holds on `item` and the waiter's record `waiter` (`None`: absent; a
    /// check that is not about a waiter ignores it).
    pub fn holds_with(&self, item: &SemaphoreItem, waiter: Option<&Waiter>) -> bool {
        match self {
            Self::NotQueued(_) => waiter.is_none(),
            Self::Queued(_) => waiter.is_some(),
            Self::QueuedBefore { attempt, .. } => waiter.is_some_and(|w| w.attempt < *attempt),
            Self::QueuedWith { wakeup, .. } => waiter.is_some_and(|w| w.wakeup == *wakeup),
            _ => self.holds(item),
        }
    }

    /// Whether the check holds on `item`. A check of a waiter's record does not hold here: use
    /// [`Check::holds_with`].
    pub fn holds(&self, item: &SemaphoreItem) -> bool {
        match self {
            Self::QueueEmpty => item.waiting == 0,
            Self::Busy { terms, now_ms } => {
                !item.fits(terms)
                    || !item.has_room()
                    || item.waiting > 0
                    || item
                        .next_start_ms(terms.rate)
                        .is_some_and(|next| next > *now_ms)
            }
            Self::NotQueued(_)
            | Self::Queued(_)
            | Self::QueuedBefore { .. }
            | Self::QueuedWith { .. } => false,
            Self::NotHolding(identity) => !item.holders.contains_key(identity),
            Self::Fits { limit, weight } => {
                item.used + u64::from(weight.get()) <= u64::from(limit.get())
            }
            Self::Room => item.has_room(),
            Self::Spaced { rate, now_ms } => item
                .next_start_ms(Some(*rate))
                .is_none_or(|next| next <= *now_ms),
            Self::HoldsSlot {
                identity,
                token,
                weight,
            } => item
                .holders
                .get(identity)
                .is_some_and(|h| h.token == *token && h.weight == *weight),
            Self::NotFenced(key) => !item.fences.contains(key),
            Self::NotReleased(identity) => !item.is_released(identity),
            Self::TombstoneAt { identity, at_ms } => item.tombstones.get(identity) == Some(at_ms),
            Self::RotatedSince { at_ms } => item
                .fences
                .rotated_at_ms
                .is_some_and(|rotated| rotated >= *at_ms),
            Self::Idle => item.is_idle(),
            Self::RotatedBefore { deadline_ms } => item
                .fences
                .rotated_at_ms
                .is_none_or(|rotated| rotated < *deadline_ms),
            Self::LastRotation(seen) => item.fences.rotated_at_ms == *seen,
            Self::Configured(config) => item.config == *config,
            Self::LeaseUntil { identity, until_ms } => item.leases.get(identity) == Some(until_ms),
        }
    }
}

impl Write {
    /// The waiter record the write checks or changes, if any: at most one per write.
    pub fn waiter_id(&self) -> Option<WaiterId> {
        let from_checks = self.checks.iter().find_map(Check::waiter_id);
        from_checks.or_else(|| {
            self.changes.iter().find_map(|change| match change {
                Change::Enqueue(waiter) => Some(waiter.id()),
                Change::Dequeue(id) | Change::Repark { id, .. } => Some(*id),
                _ => None,
            })
        })
    }

    /// Whether the write checks or changes the lock's item. A write that only gives a waiter's
    /// record a new task token does not: the lock is the same, so its version does not move,
    /// and a parked waiter's fallback check costs no write of the lock's (hot) item.
    ///
    /// Nor does a drop of a gate lock's tombstone: it deletes the holding item alone, on its
    /// own check (the rotation it names was read, and never moves back).
    pub fn touches_item(&self) -> bool {
        self.checks.iter().any(|c| {
            c.waiter_id().is_none()
                && !matches!(c, Check::TombstoneAt { .. } | Check::RotatedSince { .. })
        }) || self
            .changes
            .iter()
            .any(|c| !matches!(c, Change::Repark { .. } | Change::DropTombstone(_)))
    }

    /// What the write does to `item` (`None`: the lock has no item yet, and the write creates
    /// it from the empty one): the item after it, or the first check that fails (the item is
    /// then unchanged). For a write without a waiter record.
    pub fn apply(&self, item: Option<&SemaphoreItem>) -> Result<SemaphoreItem, &Check> {
        self.apply_with(item, None).map(|(item, _)| item)
    }

    /// What the write does to `item` and to the record of the waiter it names (`waiter`, as it
    /// is: `None` if absent): both after it, or the first check that fails (nothing changes).
    pub fn apply_with(
        &self,
        item: Option<&SemaphoreItem>,
        waiter: Option<&Waiter>,
    ) -> Result<(SemaphoreItem, Option<Waiter>), &Check> {
        let mut next = item
            .cloned()
            .unwrap_or_else(|| SemaphoreItem::empty(self.lock.clone()));
        let mut record = waiter.cloned();
        if let Some(failed) = self
            .checks
            .iter()
            .find(|check| !check.holds_with(&next, waiter))
        {
            return Err(failed);
        }
        if self.touches_item() {
            next.version = next.version.next();
        }
        for change in &self.changes {
            match change {
                Change::PutHolder {
                    identity,
                    acquired_at_ms,
                    weight,
                } => {
                    next.holders.insert(
                        identity.clone(),
                        Holding {
                            token: FencingToken(next.version.0),
                            acquired_at_ms: *acquired_at_ms,
                            weight: *weight,
                        },
                    );
                    next.used += u64::from(weight.get());
                    match next.layout {
                        Layout::Item => next.held_bytes += identity.held_bytes(),
                        Layout::Gate => next.gate_holders += 1,
                    }
                    next.started_at_ms = Some(*acquired_at_ms);
                }
                Change::SetLimit(limit) => next.limit = Some(*limit),
                Change::Configure(config) => next.config = *config,
                Change::SetLease { identity, until_ms } => {
                    next.leases.insert(identity.clone(), *until_ms);
                }
                Change::SetRate(rate) => next.rate = *rate,
                Change::RemoveHolder { identity, weight } => {
                    if next.holders.remove(identity).is_some() && next.layout == Layout::Gate {
                        next.gate_holders = next.gate_holders.saturating_sub(1);
                    }
                    next.leases.remove(identity);
                    next.used = next.used.saturating_sub(u64::from(weight.get()));
                    if next.layout == Layout::Item {
                        next.held_bytes = next.held_bytes.saturating_sub(identity.held_bytes());
                    }
                }
                Change::AddFence(key) => {
                    next.fences.young.insert(*key);
                }
                Change::FenceAcquisition { identity, at_ms } => match next.layout {
                    Layout::Item => {
                        next.fences.young.insert(FenceKey::acquisition(identity));
                    }
                    // A tombstone keeps the time of the first release: a duplicate is no later
                    // than the acquisition's last attempt either, and it must not put off the
                    // drop (nor move under a drop judged on the first).
                    Layout::Gate => {
                        next.tombstones.entry(identity.clone()).or_insert(*at_ms);
                    }
                },
                Change::DropTombstone(identity) => {
                    next.tombstones.remove(identity);
                }
                Change::SetLayout(layout) => next.layout = *layout,
                Change::Rotate { young_seen, at_ms } => {
                    next.fences.old = young_seen.clone();
                    next.fences.young.retain(|key| !young_seen.contains(key));
                    next.fences.rotated_at_ms = Some(*at_ms);
                }
                Change::Enqueue(waiter) => {
                    next.waiting += 1;
                    record = Some((**waiter).clone());
                }
                Change::Dequeue(_) => {
                    next.waiting = next.waiting.saturating_sub(1);
                    record = None;
                }
                Change::Repark {
                    wakeup, attempt, ..
                } => {
                    if let Some(record) = record.as_mut() {
                        record.wakeup = wakeup.clone();
                        record.attempt = *attempt;
                        record.checks = record.checks.saturating_add(1);
                    }
                }
            }
        }
        Ok((next, record))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::input::{AcquisitionId, HolderId};
    use crate::item::{Run, Version};

    fn lock() -> LockName {
        LockName::new("l").unwrap()
    }
    fn id(h: &str) -> Identity {
        Identity::new(HolderId::new(h).unwrap(), AcquisitionId::new("a").unwrap())
    }
    fn write(checks: Vec<Check>, changes: Vec<Change>) -> Write {
        Write {
            lock: lock(),
            checks,
            changes,
        }
    }

    #[test]
    fn a_write_creates_the_item_bumps_the_version_and_tokens_are_the_new_version() {
        let take = |who: &str| {
            write(
                vec![Check::Fits {
                    limit: Limit::new(2).unwrap(),
                    weight: Weight::ONE,
                }],
                vec![Change::PutHolder {
                    identity: id(who),
                    acquired_at_ms: 7,
                    weight: Weight::ONE,
                }],
            )
        };
        let item = take("a").apply(None).unwrap();
        assert_eq!(item.version, Version(1));
        assert_eq!(item.holders[&id("a")].token, FencingToken(1));
        let item = take("b").apply(Some(&item)).unwrap();
        assert_eq!(item.holders[&id("b")].token, FencingToken(2));
        assert_eq!(item.used, 2);
        assert_eq!(
            take("c").apply(Some(&item)),
            Err(&Check::Fits {
                limit: Limit::new(2).unwrap(),
                weight: Weight::ONE
            })
        );
    }

    #[test]
    fn held_bytes_follow_the_holders_and_admission_stops_at_the_items_budget() {
        use crate::item::{FENCES_PER_GENERATION, HELD_BYTES_BUDGET, MAX_HELD_BYTES};
        let (a, b) = (id("a"), id(&"b".repeat(300)));
        let terms = Terms::new(Limit::new(10).unwrap(), Weight::ONE, None).unwrap();
        let put = |who: &Identity| {
            write(
                vec![Check::Room],
                vec![Change::PutHolder {
                    identity: who.clone(),
                    acquired_at_ms: 1,
                    weight: Weight::ONE,
                }],
            )
        };
        let remove = |who: &Identity, item: &SemaphoreItem| {
            write(
                vec![Check::HoldsSlot {
                    identity: who.clone(),
                    token: item.holders[who].token,
                    weight: Weight::ONE,
                }],
                vec![Change::RemoveHolder {
                    identity: who.clone(),
                    weight: Weight::ONE,
                }],
            )
        };
        let item = put(&a).apply(None).unwrap();
        let item = put(&b).apply(Some(&item)).unwrap();
        assert_eq!(item.held_bytes, a.held_bytes() + b.held_bytes());
        assert_eq!(item.held_bytes, item.bytes_held());
        let item = remove(&b, &item).apply(Some(&item)).unwrap();
        assert_eq!(item.held_bytes, a.held_bytes());

        // Past the budget (less room for the largest entry), nothing is admitted, queueing is
        // allowed, and a removal still lands.
        let mut full = item.clone();
        full.held_bytes = HELD_BYTES_BUDGET - MAX_HELD_BYTES + 1;
        assert_eq!(put(&b).apply(Some(&full)), Err(&Check::Room));
        let busy = Check::Busy { terms, now_ms: 1 };
        assert!(busy.holds(&full) && !busy.holds(&item));
        assert!(remove(&a, &full).apply(Some(&full)).is_ok());
        full.held_bytes -= 1;
        assert!(put(&b).apply(Some(&full)).is_ok());

        // So past a generation's fence budget.
        let mut fenced = item.clone();
        fenced.fences.old = (0..=FENCES_PER_GENERATION as u64)
            .map(|n| FenceKey::from_bytes(n.to_be_bytes()))
            .collect();
        assert_eq!(put(&b).apply(Some(&fenced)), Err(&Check::Room));
        assert!(busy.holds(&fenced));
        fenced.fences.old.pop_first();
        assert!(put(&b).apply(Some(&fenced)).is_ok());
    }

    #[test]
    fn a_rotation_keeps_what_came_after_the_read_and_drops_the_old_generation() {
        let (f1, f2, f3) = (
            FenceKey::execution(&HolderId::new("1").unwrap(), Run::FIRST),
            FenceKey::execution(&HolderId::new("2").unwrap(), Run::FIRST),
            FenceKey::execution(&HolderId::new("3").unwrap(), Run::FIRST),
        );
        let add = |key| write(vec![], vec![Change::AddFence(key)]);
        let item = add(f1).apply(None).unwrap();
        let seen = item.fences.young.clone();
        // A fence added between the rotation's read and its write stays young.
        let item = add(f2).apply(Some(&item)).unwrap();
        let rotate = |seen: BTreeSet<FenceKey>, last, at_ms| {
            write(
                vec![Check::LastRotation(last)],
                vec![Change::Rotate {
                    young_seen: seen,
                    at_ms,
                }],
            )
        };
        let item = rotate(seen, None, 100).apply(Some(&item)).unwrap();
        assert_eq!(item.fences.old, BTreeSet::from([f1]));
        assert_eq!(item.fences.young, BTreeSet::from([f2]));
        assert!(item.is_fenced(&f1) && item.is_fenced(&f2));
        // A second rotator that read before the first one landed is refused.
        assert_eq!(
            rotate(BTreeSet::new(), None, 101).apply(Some(&item)),
            Err(&Check::LastRotation(None))
        );
        let item = add(f3).apply(Some(&item)).unwrap();
        let item = rotate(item.fences.young.clone(), Some(100), 200)
            .apply(Some(&item))
            .unwrap();
        assert!(!item.is_fenced(&f1));
        assert_eq!(item.fences.old, BTreeSet::from([f2, f3]));
        assert!(item.fences.young.is_empty());
        assert!(Check::RotatedBefore { deadline_ms: 201 }.holds(&item));
        assert!(!Check::RotatedBefore { deadline_ms: 200 }.holds(&item));
    }

    /// A waiter's record and the lock's count, changed by one write.
    #[test]
    fn queue_changes_move_the_record_and_the_count_together() {
        let w = Waiter::new(
            lock(),
            id("x"),
            Run::FIRST,
            Limit::new(1).unwrap(),
            1_000,
            crate::input::TaskToken::new("t1").unwrap(),
            Attempt::new(1_000, 0),
            "{}".to_owned(),
        );
        let item = SemaphoreItem::empty(lock());
        let enqueue = write(
            vec![Check::NotQueued(w.id())],
            vec![Change::Enqueue(Box::new(w.clone()))],
        );
        assert_eq!(enqueue.waiter_id(), Some(w.id()));
        let (item, record) = enqueue.apply_with(Some(&item), None).unwrap();
        assert_eq!((item.waiting, record.as_ref()), (1, Some(&w)));
        assert_eq!(
            enqueue.apply_with(Some(&item), record.as_ref()),
            Err(&Check::NotQueued(w.id())),
            "queued once"
        );

        let token = crate::input::TaskToken::new("t2").unwrap();
        let repark = |attempt| {
            write(
                vec![Check::QueuedBefore {
                    id: w.id(),
                    attempt,
                }],
                vec![Change::Repark {
                    id: w.id(),
                    wakeup: Wakeup::Task(token.clone()),
                    attempt,
                }],
            )
        };
        let later = Attempt::new(301_000, 0);
        let (item, record) = repark(later)
            .apply_with(Some(&item), record.as_ref())
            .unwrap();
        let record = record.unwrap();
        assert_eq!(
            (record.task_token(), record.attempt, record.checks),
            (Some(&token), later, 1)
        );
        assert_eq!(
            (record.key, item.waiting),
            (w.key, 1),
            "same place, same count"
        );
        // An attempt no later than the record's (a slow invocation of one that timed out)
        // leaves the live token where it is.
        for stale in [later, Attempt::new(1_000, 3)] {
            assert!(repark(stale)
                .apply_with(Some(&item), Some(&record))
                .is_err());
        }

        // A grant names the token it read: the old one no longer matches.
        let stale = Check::QueuedWith {
            id: w.id(),
            wakeup: w.wakeup.clone(),
        };
        assert!(!stale.holds_with(&item, Some(&record)));
        assert!(
            !stale.holds(&item),
            "a record's check never holds on the item alone"
        );
        let dequeue = write(
            vec![Check::QueuedWith {
                id: w.id(),
                wakeup: Wakeup::Task(token),
            }],
            vec![Change::Dequeue(w.id())],
        );
        let (item, gone) = dequeue.apply_with(Some(&item), Some(&record)).unwrap();
        assert_eq!((item.waiting, gone), (0, None));
        assert!(dequeue.apply_with(Some(&item), None).is_err());
    }
}
