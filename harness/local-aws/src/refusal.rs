//! Why an acquire write was refused, read from the item the refusal hands back
//! (`ReturnValuesOnConditionCheckFailure`): by a fence (a cleanup or release landed first), by
//! the horizon (the fences rotated after the request's horizon), or otherwise (the lock was
//! full, its start rate spent, or the identity already held a slot). For ours, the checks come
//! from the request as [`recognise`] reads it; the sample's write has no fence and no horizon.

use semaphore_core::{FenceKey, Identity};
use serde_json::{Map, Value};

use crate::proxy::{recognise, ProtocolWrite};
use crate::wire;

/// What an acquire write asks for, as read from its request: enough to tell from the item a
/// refusal hands back which of its checks failed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AcquireChecks {
    pub holder: String,
    /// The holder-map key (ours) or the attribute (the sample's) the write would set.
    pub slot: String,
    /// Fence keys that refuse it: the execution's and the acquisition's. Empty for the sample's
    /// protocol, and for a lock's first write (the put checks only that there is no item).
    pub fences: Vec<FenceKey>,
    /// The acquire's horizon: refused if the stored `rotated_at` is at or after it.
    pub deadline_ms: Option<u64>,
    /// The room under the limit its condition checks (`#used <= :vN`: the limit less its
    /// weight); `None` for the sample's and for a lock's first write.
    pub room: Option<u64>,
}

/// Why a refused acquire write was refused, checked in the order the acquire's answer names
/// them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    Fence,
    Horizon,
    Otherwise,
}

impl AcquireChecks {
    /// Our acquire write, if this request is one: the `UpdateItem` with its checks, or, as a
    /// lock's first write, the `PutItem` of the item that write makes (which checks nothing
    /// more: no fence, no rotation, and it is alone).
    pub fn ours(operation: Option<&str>, body: &[u8]) -> Option<Self> {
        match recognise(operation, body)? {
            ProtocolWrite::Acquire {
                identity,
                fences,
                deadline_ms,
                room,
            } => Some(Self {
                fences,
                deadline_ms,
                room,
                ..Self::of(&identity)
            }),
            ProtocolWrite::Create {
                acquiring: Some(identity),
            } => Some(Self::of(&identity)),
            _ => None,
        }
    }

    /// The original sample's acquire write, if this request is one.
    pub fn sample(operation: Option<&str>, body: &[u8]) -> Option<Self> {
        let holder = crate::sample::acquiring(operation, body)?;
        Some(Self {
            slot: format!("holder:{holder}"),
            holder,
            ..Self::default()
        })
    }

    /// Ours, for `identity`, with no checks yet.
    pub fn of(identity: &Identity) -> Self {
        Self {
            holder: identity.holder.to_string(),
            slot: identity.slot_key(),
            ..Self::default()
        }
    }

    /// Which check failed on `item` (the item as it was when the write was refused), if this
    /// write's checks fail there at all.
    pub fn refusal(&self, item: &Map<String, Value>) -> Option<Refusal> {
        let fenced = ["young", "old"].iter().any(|generation| {
            item.get(*generation)
                .and_then(wire::fence_keys)
                .is_some_and(|keys| keys.iter().any(|key| self.fences.contains(key)))
        });
        if fenced {
            return Some(Refusal::Fence);
        }
        let rotated_at = item.get("rotated_at").and_then(wire::number);
        if let (Some(deadline), Some(rotated)) = (self.deadline_ms, rotated_at) {
            if rotated >= u128::from(deadline) {
                return Some(Refusal::Horizon);
            }
        }
        // The sample's holders are attributes; ours are entries of the `holders` map.
        let holders = item
            .get("holders")
            .and_then(|h| h.get("M"))
            .and_then(Value::as_object);
        let holding =
            item.contains_key(&self.slot) || holders.is_some_and(|m| m.contains_key(&self.slot));
        // Without the room (the sample's write, a put), any refusal left is "full or held".
        // With a start rate, the last start may also have been too recent: no fence, no
        // rotation, room left and not held, so the only check left is the rate's.
        let used = item.get("used").and_then(wire::number).unwrap_or(0);
        let full = self.room.is_none_or(|room| used > u128::from(room));
        let rate_limited = item.contains_key("spacing_ms");
        (holding || full || rate_limited).then_some(Refusal::Otherwise)
    }
}

#[cfg(test)]
mod tests {
    use semaphore_core::protocol::{self, Timing};
    use semaphore_core::{AcquisitionId, HolderId, Limit, LockName, SemaphoreItem};

    /// A slot of weight 1, as a cleanup's fence sees it.
    fn one_slot() -> semaphore_core::Holding {
        semaphore_core::Holding {
            token: semaphore_core::FencingToken(1),
            acquired_at_ms: 0,
            weight: semaphore_core::Weight::ONE,
        }
    }

    use super::*;
    use crate::wire::{attributes, put_body, update_body};

    const ARN: &str = "arn:aws:states:us-east-1:123456789012:execution:m:run-007";

    fn identity() -> Identity {
        Identity::new(
            HolderId::new(ARN).unwrap(),
            AcquisitionId::new("5f1c-uuid").unwrap(),
        )
    }

    fn lock() -> LockName {
        LockName::new("demo-lock").unwrap()
    }

    fn acquire(requested_at_ms: u64) -> semaphore_core::Write {
        protocol::acquire(
            &lock(),
            &identity(),
            semaphore_core::Run::FIRST,
            None,
            Limit::new(2).unwrap(),
            requested_at_ms,
            requested_at_ms + 500,
            &Timing::default(),
        )
        .unwrap()
    }

    /// How each write is read (its fences, horizon and limit) is the recogniser's, tested in
    /// `proxy`; this is which of them are acquire writes, and what their checks keep.
    #[test]
    fn reads_our_acquire_as_an_update_or_as_a_locks_first_write_and_nothing_else() {
        let update = Some("UpdateItem");
        let held =
            AcquireChecks::ours(update, &update_body(&acquire(1_000))).expect("the acquire write");
        assert_eq!(
            held,
            AcquireChecks {
                holder: ARN.to_owned(),
                slot: identity().slot_key(),
                fences: vec![
                    FenceKey::execution(&identity().holder, semaphore_core::Run::FIRST),
                    FenceKey::acquisition(&identity())
                ],
                deadline_ms: Some(9_000),
                room: Some(1),
            },
            "requested at 1 s, horizon 8 s"
        );
        // Release, cleanup and rotation set no holder entry.
        let release = protocol::release(
            &lock(),
            &identity(),
            semaphore_core::FencingToken(1),
            semaphore_core::Weight::ONE,
            0,
        );
        let cleanup =
            protocol::cleanup_fence(&lock(), &identity().holder, semaphore_core::Run::FIRST);
        let free = protocol::cleanup_free(&lock(), &[(identity(), one_slot())]);
        let mut item = SemaphoreItem::empty(lock());
        item.fences.young.insert(FenceKey::acquisition(&identity()));
        let rotation = protocol::rotation(&item, 60_000, &Timing::default()).unwrap();
        for write in [&release, &cleanup, &free, &rotation] {
            assert_eq!(
                AcquireChecks::ours(update, &update_body(write)),
                None,
                "{write:?}"
            );
        }
        // Only the protocol's own acquire operation counts.
        let body = update_body(&acquire(1_000));
        assert_eq!(AcquireChecks::sample(update, &body), None);
        assert_eq!(AcquireChecks::ours(Some("GetItem"), &body), None);
        // As a lock's first write: the put of the item it makes, which checks nothing more.
        let put = Some("PutItem");
        let held = AcquireChecks::ours(put, &put_body(&acquire(1_000)));
        assert_eq!(held, Some(AcquireChecks::of(&identity())));
        assert_eq!(held.unwrap().holder, ARN);
        // The first write of a lock made by a release holds nobody.
        assert_eq!(
            AcquireChecks::ours(
                put,
                &put_body(&protocol::release_unheld(&lock(), &identity(), 0))
            ),
            None
        );
    }

    /// The refusal's reason, from the item as the refusal hands it back.
    fn refusal_on(edit: impl FnOnce(&mut SemaphoreItem)) -> Option<Refusal> {
        let held = AcquireChecks::ours(Some("UpdateItem"), &update_body(&acquire(1_000))).unwrap();
        let mut item = SemaphoreItem::empty(lock());
        edit(&mut item);
        held.refusal(&attributes(&semaphore_core::dynamo::encode(&item)))
    }

    #[test]
    fn tells_a_refusal_by_a_fence_from_one_by_the_horizon_and_from_a_full_lock() {
        let holding = |token| semaphore_core::Holding {
            token: semaphore_core::FencingToken(token),
            acquired_at_ms: 5,
            weight: semaphore_core::Weight::ONE,
        };
        let other =
            |h: &str| Identity::new(HolderId::new(h).unwrap(), AcquisitionId::new("a").unwrap());
        assert_eq!(refusal_on(|_| {}), None, "every check holds");
        assert_eq!(
            refusal_on(|i| {
                i.fences.old.insert(FenceKey::execution(
                    &identity().holder,
                    semaphore_core::Run::FIRST,
                ));
                // A rotation past the horizon too: the fence is what the answer names first.
                i.fences.rotated_at_ms = Some(9_000);
            }),
            Some(Refusal::Fence)
        );
        assert_eq!(
            refusal_on(|i| {
                i.fences.young.insert(FenceKey::acquisition(&identity()));
            }),
            Some(Refusal::Fence)
        );
        assert_eq!(
            refusal_on(|i| i.fences.rotated_at_ms = Some(9_000)),
            Some(Refusal::Horizon)
        );
        assert_eq!(refusal_on(|i| i.fences.rotated_at_ms = Some(8_999)), None);
        assert_eq!(
            refusal_on(|i| {
                i.holders.insert(other("x"), holding(1));
                i.holders.insert(other("y"), holding(2));
                i.used = 2;
            }),
            Some(Refusal::Otherwise),
            "full"
        );
        assert_eq!(
            refusal_on(|i| {
                i.holders.insert(identity(), holding(1));
            }),
            Some(Refusal::Otherwise),
            "already held"
        );
    }
}
