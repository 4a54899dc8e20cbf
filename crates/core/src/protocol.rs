//! The protocol: each transition (acquire, release, cleanup) is one pure function from the item
//! it read to either an answer that needs no write, or the next item plus the answer to give once
//! that item is stored *on the condition that the version is still the one read*.
//!
//! The same functions drive the DynamoDB store and the in-memory store, so a model checker that
//! explores the in-memory store explores exactly what is sent to DynamoDB.

use std::time::Duration;

use crate::input::{HolderId, Limit, LockName};
use crate::item::{FenceKey, FencingToken, Holding, Identity, SemaphoreItem};

/// How long a fence is kept after the release or cleanup that wrote it.
///
/// A fence has to outlive every read that a still-running attempt of the fenced acquisition can
/// make; a write computed from an earlier read is already refused by the version check, and a
/// fence removed after a read bumps the version too. Every attempt starts before the fence is
/// written (Step Functions starts no new Task attempt once the acquire state has completed or the
/// execution has ended), its handler starts at most ~10 s later (Lambda init), and the store
/// stops reading once an acquire call is [`RetryPolicy::call_budget`](crate::RetryPolicy) old.
/// So reads end well within a minute of the fence. The default of five minutes leaves a wide
/// margin for clock skew between Lambda hosts. Raise it only if callers outlive that (an
/// operator script that sleeps between read and write is not such a caller: its write still
/// fails on the version).
pub const DEFAULT_FENCE_WINDOW: Duration = Duration::from_secs(300);

/// What a transition decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step<O> {
    /// The answer follows from the item as read; nothing is written.
    Done(O),
    /// Store `next` if the item is still at the version read, then answer `outcome`.
    Write { next: SemaphoreItem, outcome: O },
}

/// Why an acquire was refused for good.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FenceReason {
    /// Cleanup or the sweeper freed this execution: it has ended.
    ExecutionEnded,
    /// This acquisition was released: only a new acquisition may take a slot.
    AcquisitionReleased,
}

impl FenceReason {
    pub fn describe(self) -> &'static str {
        match self {
            Self::ExecutionEnded => "the execution was cleaned up after it ended",
            Self::AcquisitionReleased => "this acquisition was already released",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AcquireOutcome {
    Acquired {
        token: FencingToken,
        count: usize,
    },
    /// The same identity already holds a slot (a retried acquire whose first attempt landed):
    /// the answer carries the original token and no second slot is taken (F5).
    AlreadyHeld {
        token: FencingToken,
        count: usize,
    },
    Full {
        count: usize,
        limit: Limit,
    },
    Fenced(FenceReason),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReleaseOutcome {
    Released {
        token: FencingToken,
        count: usize,
    },
    /// Nothing was held by this identity; it is fenced now, so a late acquire cannot take it.
    NotHeld {
        count: usize,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CleanupOutcome {
    /// The slots that were freed, with when they were taken.
    pub freed: Vec<(Identity, Holding)>,
    pub count: usize,
}

/// Everything a transition needs besides the item and the request.
#[derive(Debug, Clone, Copy)]
pub struct Context {
    pub now_ms: u64,
    pub fence_window: Duration,
}

impl Context {
    /// When a fence written now expires: the window from now, rounded up to a whole second
    /// because the table stores fence expiries in seconds (4 bytes instead of 8). Rounding up
    /// only ever lengthens a fence.
    fn fence_expiry(&self) -> u64 {
        let exact = self
            .now_ms
            .saturating_add(u64::try_from(self.fence_window.as_millis()).unwrap_or(u64::MAX));
        exact.div_ceil(1_000).saturating_mul(1_000)
    }
}

/// The item as it will be written next: the version bumped and expired fences dropped, so the
/// item never grows with history.
fn successor(current: Option<&SemaphoreItem>, lock: &LockName, ctx: &Context) -> SemaphoreItem {
    let mut next = current
        .cloned()
        .unwrap_or_else(|| SemaphoreItem::empty(lock.clone()));
    next.version = next.version.next();
    next.fences.retain(|_, &mut expires| expires > ctx.now_ms);
    next
}

fn fence(item: &mut SemaphoreItem, key: FenceKey, ctx: &Context) {
    let expiry = ctx.fence_expiry();
    let slot = item.fences.entry(key).or_insert(expiry);
    // A late duplicate of a cleanup event extends the fence rather than shortening it.
    *slot = (*slot).max(expiry);
}

/// Take a slot for `identity` if the lock has room and the identity is not fenced.
pub fn acquire(
    current: Option<&SemaphoreItem>,
    lock: &LockName,
    identity: &Identity,
    limit: Limit,
    ctx: &Context,
) -> Step<AcquireOutcome> {
    if let Some(item) = current {
        // Fences first: a zombie or late retry must not even see "already held" or "full" and
        // keep waiting for a slot it may never have again (F2, F3).
        if item.is_fenced(&FenceKey::execution(&identity.holder), ctx.now_ms) {
            return Step::Done(AcquireOutcome::Fenced(FenceReason::ExecutionEnded));
        }
        if item.is_fenced(&FenceKey::acquisition(identity), ctx.now_ms) {
            return Step::Done(AcquireOutcome::Fenced(FenceReason::AcquisitionReleased));
        }
        if let Some(holding) = item.holders.get(identity) {
            return Step::Done(AcquireOutcome::AlreadyHeld {
                token: holding.token,
                count: item.count(),
            });
        }
        if item.count() >= limit.get() as usize {
            return Step::Done(AcquireOutcome::Full {
                count: item.count(),
                limit,
            });
        }
    }
    let mut next = successor(current, lock, ctx);
    let token = FencingToken(next.version.0);
    next.limit = Some(limit);
    next.holders.insert(
        identity.clone(),
        Holding {
            token,
            acquired_at_ms: ctx.now_ms,
        },
    );
    let count = next.count();
    Step::Write {
        next,
        outcome: AcquireOutcome::Acquired { token, count },
    }
}

/// Free the slot of `identity`, if held, and fence the acquisition so that a late attempt of
/// the same acquire cannot take a slot again (F3).
pub fn release(
    current: Option<&SemaphoreItem>,
    lock: &LockName,
    identity: &Identity,
    ctx: &Context,
) -> Step<ReleaseOutcome> {
    let key = FenceKey::acquisition(identity);
    if let Some(item) = current {
        let fenced = item.is_fenced(&key, ctx.now_ms)
            || item.is_fenced(&FenceKey::execution(&identity.holder), ctx.now_ms);
        if fenced && !item.holders.contains_key(identity) {
            // Released or cleaned up before: a duplicate is a no-op and writes nothing.
            return Step::Done(ReleaseOutcome::NotHeld {
                count: item.count(),
            });
        }
    }
    // Even when nothing is held, the fence and the version bump are written: an acquire of this
    // identity may still be in flight and must not land after the release (F1, F3).
    let mut next = successor(current, lock, ctx);
    let freed = next.holders.remove(identity);
    fence(&mut next, key, ctx);
    let count = next.count();
    let outcome = match freed {
        Some(holding) => ReleaseOutcome::Released {
            token: holding.token,
            count,
        },
        None => ReleaseOutcome::NotHeld { count },
    };
    Step::Write { next, outcome }
}

/// Free every slot an ended execution holds and fence the execution. Always writes, even when
/// nothing is held, so that an acquire computed before the cleanup can never land after it (F1).
pub fn cleanup(
    current: Option<&SemaphoreItem>,
    lock: &LockName,
    holder: &HolderId,
    ctx: &Context,
) -> Step<CleanupOutcome> {
    let mut next = successor(current, lock, ctx);
    let mut freed = Vec::new();
    next.holders.retain(|identity, holding| {
        let ended = identity.holder == *holder;
        if ended {
            freed.push((identity.clone(), holding.clone()));
        }
        !ended
    });
    fence(&mut next, FenceKey::execution(holder), ctx);
    let count = next.count();
    Step::Write {
        next,
        outcome: CleanupOutcome { freed, count },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::input::AcquisitionId;
    use crate::item::Version;

    fn lock() -> LockName {
        LockName::new("l").unwrap()
    }
    fn id(h: &str, a: &str) -> Identity {
        Identity::new(HolderId::new(h).unwrap(), AcquisitionId::new(a).unwrap())
    }
    fn ctx(now_ms: u64) -> Context {
        Context {
            now_ms,
            fence_window: Duration::from_secs(10),
        }
    }
    fn written<O>(step: Step<O>) -> (SemaphoreItem, O) {
        match step {
            Step::Write { next, outcome } => (next, outcome),
            Step::Done(_) => panic!("expected a write"),
        }
    }
    fn limit(n: i64) -> Limit {
        Limit::new(n).unwrap()
    }

    #[test]
    fn every_write_bumps_the_version_and_the_token_is_the_new_version() {
        let (item, out) = written(acquire(None, &lock(), &id("a", "1"), limit(2), &ctx(0)));
        assert_eq!(item.version, Version(1));
        assert_eq!(
            out,
            AcquireOutcome::Acquired {
                token: FencingToken(1),
                count: 1
            }
        );
        let (item, out) = written(acquire(
            Some(&item),
            &lock(),
            &id("b", "1"),
            limit(2),
            &ctx(0),
        ));
        assert_eq!(item.version, Version(2));
        assert_eq!(
            out,
            AcquireOutcome::Acquired {
                token: FencingToken(2),
                count: 2
            }
        );
        let (item, _) = written(cleanup(
            Some(&item),
            &lock(),
            &HolderId::new("nobody").unwrap(),
            &ctx(0),
        ));
        assert_eq!(item.version, Version(3));
    }

    #[test]
    fn a_full_lock_and_a_held_identity_write_nothing() {
        let (item, _) = written(acquire(None, &lock(), &id("a", "1"), limit(1), &ctx(0)));
        assert_eq!(
            acquire(Some(&item), &lock(), &id("b", "1"), limit(1), &ctx(0)),
            Step::Done(AcquireOutcome::Full {
                count: 1,
                limit: limit(1)
            })
        );
        assert_eq!(
            acquire(Some(&item), &lock(), &id("a", "1"), limit(1), &ctx(0)),
            Step::Done(AcquireOutcome::AlreadyHeld {
                token: FencingToken(1),
                count: 1
            })
        );
    }

    #[test]
    fn fences_refuse_the_identity_until_they_expire_and_are_then_dropped() {
        let (item, _) = written(acquire(None, &lock(), &id("a", "1"), limit(1), &ctx(0)));
        let (item, _) = written(release(Some(&item), &lock(), &id("a", "1"), &ctx(0)));
        assert_eq!(
            acquire(Some(&item), &lock(), &id("a", "1"), limit(1), &ctx(9_999)),
            Step::Done(AcquireOutcome::Fenced(FenceReason::AcquisitionReleased))
        );
        // The same execution may take the lock again with a new acquisition.
        let (item, _) = written(acquire(
            Some(&item),
            &lock(),
            &id("a", "2"),
            limit(1),
            &ctx(1),
        ));
        assert_eq!(item.fences.len(), 1);
        let (item, _) = written(release(Some(&item), &lock(), &id("a", "2"), &ctx(20_000)));
        // The first fence expired at 10 000 and was dropped by this write.
        assert_eq!(item.fences.len(), 1);
        assert!(item.is_fenced(&FenceKey::acquisition(&id("a", "2")), 20_000));
    }

    #[test]
    fn a_fence_lasts_the_window_rounded_up_to_the_second_it_is_stored_in() {
        // Written at 1.5 s with a 10 s window: in force until 12 s, not only until 11.5 s.
        let (item, _) = written(acquire(None, &lock(), &id("a", "1"), limit(1), &ctx(0)));
        let (item, _) = written(release(Some(&item), &lock(), &id("a", "1"), &ctx(1_500)));
        let key = FenceKey::acquisition(&id("a", "1"));
        assert_eq!(item.fences[&key], 12_000);
        assert!(item.is_fenced(&key, 11_999));
        assert!(!item.is_fenced(&key, 12_000));
    }

    #[test]
    fn cleanup_frees_every_slot_of_the_execution_and_fences_all_its_acquisitions() {
        let (item, _) = written(acquire(None, &lock(), &id("a", "1"), limit(3), &ctx(0)));
        let (item, _) = written(acquire(
            Some(&item),
            &lock(),
            &id("a", "2"),
            limit(3),
            &ctx(0),
        ));
        let (item, _) = written(acquire(
            Some(&item),
            &lock(),
            &id("b", "1"),
            limit(3),
            &ctx(0),
        ));
        let (item, out) = written(cleanup(
            Some(&item),
            &lock(),
            &HolderId::new("a").unwrap(),
            &ctx(0),
        ));
        assert_eq!(out.freed.len(), 2);
        assert_eq!(out.count, 1);
        assert_eq!(
            acquire(Some(&item), &lock(), &id("a", "3"), limit(3), &ctx(0)),
            Step::Done(AcquireOutcome::Fenced(FenceReason::ExecutionEnded))
        );
    }

    #[test]
    fn a_duplicate_release_writes_nothing_but_a_first_release_of_nothing_fences() {
        let (item, out) = written(release(None, &lock(), &id("a", "1"), &ctx(0)));
        assert_eq!(out, ReleaseOutcome::NotHeld { count: 0 });
        assert_eq!(item.version, Version(1));
        assert_eq!(
            release(Some(&item), &lock(), &id("a", "1"), &ctx(0)),
            Step::Done(ReleaseOutcome::NotHeld { count: 0 })
        );
    }

    #[test]
    fn a_late_duplicate_cleanup_extends_the_fence() {
        let h = HolderId::new("a").unwrap();
        let (item, _) = written(cleanup(None, &lock(), &h, &ctx(0)));
        let (item, _) = written(cleanup(Some(&item), &lock(), &h, &ctx(5_000)));
        assert_eq!(item.fences[&FenceKey::execution(&h)], 15_000);
    }
}
