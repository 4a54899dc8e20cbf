//! A gate lock's holdings in DynamoDB (see [`Layout::Gate`](crate::item::Layout::Gate)): one
//! item per holding in the holdings table (partition key `part`, the lock and one of
//! [`HOLDINGS_BUCKETS`] buckets chosen by the holder; sort key `slot`, the holding's
//! `holder#acquisition`, so one `Query` of a key prefix finds an execution's holdings), and how
//! a write's checks and changes of a holding become that item's condition and action in the
//! write's transaction.
//!
//! A holding item is held (its token, weight, when it was taken, its lease) or released: the
//! tombstone that fences its acquisition until a rotation lets the sweep drop it.

use std::collections::{BTreeSet, HashMap};

use aws_sdk_dynamodb::types::{
    AttributeValue, ConditionCheck, Delete, Put, ReturnValuesOnConditionCheckFailure,
    TransactWriteItem, Update,
};

use super::codec::{get_number, get_optional, get_text, number, string};
use crate::error::{AttributeError, StoreError};
use crate::input::{HolderId, LockName, Weight};
use crate::item::{FencingToken, Holding, Identity, SemaphoreItem};
use crate::write::{Change, Check, Write};

/// Attribute names of a holding item.
pub mod holding_attr {
    /// The partition key: `lock#bucket` ([`super::partition`]).
    pub const PART: &str = "part";
    /// The lock's name, as given.
    pub const LOCK: &str = "lock";
    /// `holder#acquisition` ([`crate::item::Identity::slot_key`]).
    pub const SLOT: &str = "slot";
    /// `held` or `released`.
    pub const STATE: &str = "state";
    pub const TOKEN: &str = "token";
    pub const WEIGHT: &str = "weight";
    pub const ACQUIRED_AT: &str = "acquired_at";
    /// When its lease ends (epoch ms; absent: held until released).
    pub const LEASE_UNTIL: &str = "lease_until";
    /// When it was released (epoch ms, the releaser's clock; a tombstone's).
    pub const RELEASED_AT: &str = "released_at";
}

const HELD: &str = "held";
const RELEASED: &str = "released";

/// What one holding item says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HoldingState {
    Held {
        holding: Holding,
        lease_until_ms: Option<u64>,
    },
    Released {
        at_ms: u64,
    },
}

/// Which of a gate's holdings a read of the lock reads with it.
#[derive(Debug, Clone, Copy)]
pub(super) enum Holdings<'a> {
    All,
    Of(&'a HolderId),
    None,
}

/// Partitions a lock's holdings are spread over. A critical section writes its holding three
/// times (the admission and the tombstone, each billed twice in their transactions, and the
/// drop: 5 write units of a 1 KB item); one partition takes 1,000 a second, so the holdings of
/// a lock on one partition key would stop at 200 sections a second, below the gate's 250. Four
/// keys take 800. A holder's holdings share its bucket, so a cleanup still reads them with one
/// `Query`; a read of the whole lock is four.
pub const HOLDINGS_BUCKETS: u32 = 4;

/// The bucket of `holder`'s holdings: FNV-1a of its id, stable across processes and versions
/// (every writer and reader must agree on it for as long as a holding lives).
fn bucket_of(holder: &str) -> u32 {
    let hash = holder
        .bytes()
        .fold(0xcbf2_9ce4_8422_2325_u64, |hash, byte| {
            (hash ^ u64::from(byte)).wrapping_mul(0x0000_0100_0000_01b3)
        });
    u32::try_from(hash % u64::from(HOLDINGS_BUCKETS)).unwrap_or_default()
}

/// The partition key of `holder`'s holdings on `lock`: `lock#bucket`. Distinct for distinct
/// locks, whatever their names hold: the bucket is the one digit after the last '#'.
pub fn partition(lock: &str, holder: &str) -> String {
    part(lock, bucket_of(holder))
}

/// Every partition key of `lock`'s holdings.
pub fn partitions(lock: &str) -> impl Iterator<Item = String> + '_ {
    (0..HOLDINGS_BUCKETS).map(move |bucket| part(lock, bucket))
}

fn part(lock: &str, bucket: u32) -> String {
    format!("{lock}#{bucket}")
}

/// The key of `identity`'s holding item on `lock`.
pub fn key(lock: &LockName, identity: &Identity) -> HashMap<String, AttributeValue> {
    HashMap::from([
        (
            holding_attr::PART.to_owned(),
            string(&partition(lock.as_str(), identity.holder.as_str())),
        ),
        (holding_attr::SLOT.to_owned(), string(&identity.slot_key())),
    ])
}

/// Reads a holding item back.
pub fn decode_holding(
    attrs: &HashMap<String, AttributeValue>,
) -> Result<(Identity, HoldingState), StoreError> {
    let lock = get_text(attrs, holding_attr::LOCK).unwrap_or_default();
    let corrupt = |problem| StoreError::CorruptItem {
        lock: lock.clone(),
        problem,
    };
    let slot = get_text(attrs, holding_attr::SLOT).map_err(corrupt)?;
    let identity = Identity::from_slot_key(&slot).map_err(|problem| {
        corrupt(AttributeError::HolderKey {
            key: slot.clone(),
            problem,
        })
    })?;
    let state = match get_text(attrs, holding_attr::STATE)
        .map_err(corrupt)?
        .as_str()
    {
        RELEASED => HoldingState::Released {
            at_ms: get_number(attrs, holding_attr::RELEASED_AT).map_err(corrupt)?,
        },
        _ => {
            let weight: u32 = get_number(attrs, holding_attr::WEIGHT).map_err(corrupt)?;
            HoldingState::Held {
                holding: Holding {
                    token: FencingToken(get_number(attrs, holding_attr::TOKEN).map_err(corrupt)?),
                    acquired_at_ms: get_number(attrs, holding_attr::ACQUIRED_AT)
                        .map_err(corrupt)?,
                    weight: Weight::new(i64::from(weight)).map_err(|problem| {
                        corrupt(AttributeError::HolderWeight {
                            key: slot.clone(),
                            problem,
                        })
                    })?,
                },
                lease_until_ms: get_optional(attrs, holding_attr::LEASE_UNTIL).map_err(corrupt)?,
            }
        }
    };
    Ok((identity, state))
}

/// Puts what a holding item says into `view`, the lock as its gate and holdings show it.
pub fn add_to(view: &mut SemaphoreItem, identity: Identity, state: HoldingState) {
    match state {
        HoldingState::Held {
            holding,
            lease_until_ms,
        } => {
            if let Some(until) = lease_until_ms {
                view.leases.insert(identity.clone(), until);
            }
            view.holders.insert(identity, holding);
        }
        HoldingState::Released { at_ms } => {
            view.tombstones.insert(identity, at_ms);
        }
    }
}

/// The identities whose holdings `write` checks or changes.
pub fn named(write: &Write) -> BTreeSet<Identity> {
    let from_checks = write.checks.iter().filter_map(|check| match check {
        Check::NotHolding(id)
        | Check::NotReleased(id)
        | Check::HoldsSlot { identity: id, .. }
        | Check::LeaseUntil { identity: id, .. }
        | Check::TombstoneAt { identity: id, .. } => Some(id),
        _ => None,
    });
    let from_changes = write.changes.iter().filter_map(|change| match change {
        Change::PutHolder { identity, .. }
        | Change::RemoveHolder { identity, .. }
        | Change::SetLease { identity, .. }
        | Change::FenceAcquisition { identity, .. }
        | Change::DropTombstone(identity) => Some(identity),
        _ => None,
    });
    from_checks.chain(from_changes).cloned().collect()
}

/// Placeholders of one holding action.
#[derive(Default)]
struct Names {
    names: HashMap<String, String>,
    values: HashMap<String, AttributeValue>,
}

impl Names {
    fn attr(&mut self, name: &str) -> String {
        let placeholder = format!("#{name}");
        self.names.insert(placeholder.clone(), name.to_owned());
        placeholder
    }

    fn value(&mut self, value: AttributeValue) -> String {
        let placeholder = format!(":h{}", self.values.len());
        self.values.insert(placeholder.clone(), value);
        placeholder
    }
}

/// `identity`'s holding action in `write`'s transaction (in `table`), with its check: a put of
/// the holding an admission takes (its token `token`), of the tombstone a release leaves, a
/// delete of what a cleanup frees or a drop sheds, an update of a lease or of a tombstone of
/// nothing held, or a check alone.
pub fn action(
    table: &str,
    write: &Write,
    identity: &Identity,
    token: Option<FencingToken>,
) -> Result<TransactWriteItem, StoreError> {
    let unexpected = |problem: String| StoreError::Unexpected {
        lock: write.lock.to_string(),
        problem,
    };
    let mut n = Names::default();
    let mut conditions = Vec::new();
    for check in &write.checks {
        match check {
            Check::NotHolding(id) if id == identity => {
                let (slot, state) = (n.attr(holding_attr::SLOT), n.attr(holding_attr::STATE));
                let held = n.value(string(HELD));
                conditions.push(format!(
                    "(attribute_not_exists({slot}) OR {state} <> {held})"
                ));
            }
            Check::NotReleased(id) if id == identity => {
                let (slot, state) = (n.attr(holding_attr::SLOT), n.attr(holding_attr::STATE));
                let released = n.value(string(RELEASED));
                conditions.push(format!(
                    "(attribute_not_exists({slot}) OR {state} <> {released})"
                ));
            }
            Check::HoldsSlot {
                identity: id,
                token,
                weight,
            } if id == identity => {
                let (state, token_name, weight_name) = (
                    n.attr(holding_attr::STATE),
                    n.attr(holding_attr::TOKEN),
                    n.attr(holding_attr::WEIGHT),
                );
                let held = n.value(string(HELD));
                let token = n.value(number(token.0));
                let weight = n.value(number(weight.get()));
                conditions.push(format!(
                    "{state} = {held} AND {token_name} = {token} AND {weight_name} = {weight}"
                ));
            }
            Check::LeaseUntil {
                identity: id,
                until_ms,
            } if id == identity => {
                let name = n.attr(holding_attr::LEASE_UNTIL);
                let until = n.value(number(until_ms));
                conditions.push(format!("{name} = {until}"));
            }
            Check::TombstoneAt {
                identity: id,
                at_ms,
            } if id == identity => {
                let (state, name) = (
                    n.attr(holding_attr::STATE),
                    n.attr(holding_attr::RELEASED_AT),
                );
                let released = n.value(string(RELEASED));
                let at = n.value(number(at_ms));
                conditions.push(format!("{state} = {released} AND {name} = {at}"));
            }
            _ => {}
        }
    }
    let mine = |change: &&Change| match change {
        Change::PutHolder { identity: id, .. }
        | Change::RemoveHolder { identity: id, .. }
        | Change::SetLease { identity: id, .. }
        | Change::FenceAcquisition { identity: id, .. }
        | Change::DropTombstone(id) => id == identity,
        _ => false,
    };
    let changes: Vec<&Change> = write.changes.iter().filter(mine).collect();
    let lease = changes.iter().find_map(|c| match c {
        Change::SetLease { until_ms, .. } => Some(*until_ms),
        _ => None,
    });
    let put = changes.iter().find_map(|c| match c {
        Change::PutHolder {
            acquired_at_ms,
            weight,
            ..
        } => Some((*acquired_at_ms, *weight)),
        _ => None,
    });
    let released = changes.iter().find_map(|c| match c {
        Change::FenceAcquisition { at_ms, .. } => Some(*at_ms),
        _ => None,
    });
    let removes = changes
        .iter()
        .any(|c| matches!(c, Change::RemoveHolder { .. } | Change::DropTombstone(_)));
    let condition = (!conditions.is_empty()).then(|| conditions.join(" AND "));
    let key = key(&write.lock, identity);
    let on_failure = ReturnValuesOnConditionCheckFailure::AllOld;
    let built = |e: aws_sdk_dynamodb::error::BuildError| unexpected(e.to_string());
    let (names, values) = (
        Some(n.names.clone()).filter(|_| condition.is_some()),
        Some(n.values.clone()).filter(|v| !v.is_empty()),
    );
    let action = TransactWriteItem::builder();
    // An admission puts the holding, under its token (and lease); a release or a take-back puts
    // the tombstone in the holding's place.
    let put = match (put, released, removes) {
        (Some((acquired_at_ms, weight)), _, _) => {
            let token = token.ok_or_else(|| unexpected("an admission without a token".into()))?;
            let mut item = key.clone();
            item.insert(holding_attr::LOCK.to_owned(), string(write.lock.as_str()));
            item.insert(holding_attr::STATE.to_owned(), string(HELD));
            item.insert(holding_attr::TOKEN.to_owned(), number(token.0));
            item.insert(holding_attr::WEIGHT.to_owned(), number(weight.get()));
            item.insert(holding_attr::ACQUIRED_AT.to_owned(), number(acquired_at_ms));
            if let Some(until) = lease {
                item.insert(holding_attr::LEASE_UNTIL.to_owned(), number(until));
            }
            Some(item)
        }
        (None, Some(at_ms), true) => {
            let mut item = key.clone();
            item.insert(holding_attr::LOCK.to_owned(), string(write.lock.as_str()));
            item.insert(holding_attr::STATE.to_owned(), string(RELEASED));
            item.insert(holding_attr::RELEASED_AT.to_owned(), number(at_ms));
            Some(item)
        }
        _ => None,
    };
    if let Some(item) = put {
        return Ok(action
            .put(
                Put::builder()
                    .table_name(table)
                    .set_item(Some(item))
                    .set_condition_expression(condition)
                    .set_expression_attribute_names(names)
                    .set_expression_attribute_values(values)
                    .return_values_on_condition_check_failure(on_failure)
                    .build()
                    .map_err(built)?,
            )
            .build());
    }
    Ok(match (released, removes) {
        // The release of an acquisition that holds nothing: a tombstone, keeping the time of a
        // tombstone already there.
        (Some(at_ms), _) => {
            let (state, at_name) = (
                n.attr(holding_attr::STATE),
                n.attr(holding_attr::RELEASED_AT),
            );
            let (released, at) = (n.value(string(RELEASED)), n.value(number(at_ms)));
            let (lock_name, lock) = (
                n.attr(holding_attr::LOCK),
                n.value(string(write.lock.as_str())),
            );
            let update = format!(
                "SET {state} = {released}, {at_name} = if_not_exists({at_name}, {at}), \
                 {lock_name} = {lock}"
            );
            action.update(
                Update::builder()
                    .table_name(table)
                    .set_key(Some(key))
                    .update_expression(update)
                    .set_condition_expression(condition)
                    .set_expression_attribute_names(Some(n.names))
                    .set_expression_attribute_values(Some(n.values))
                    .return_values_on_condition_check_failure(on_failure)
                    .build()
                    .map_err(built)?,
            )
        }
        // A cleanup's free, a drop.
        (None, true) => action.delete(
            Delete::builder()
                .table_name(table)
                .set_key(Some(key))
                .set_condition_expression(condition)
                .set_expression_attribute_names(names)
                .set_expression_attribute_values(values)
                .return_values_on_condition_check_failure(on_failure)
                .build()
                .map_err(built)?,
        ),
        // A heartbeat.
        (None, false) if lease.is_some() => {
            let name = n.attr(holding_attr::LEASE_UNTIL);
            let until = n.value(number(lease.unwrap_or_default()));
            action.update(
                Update::builder()
                    .table_name(table)
                    .set_key(Some(key))
                    .update_expression(format!("SET {name} = {until}"))
                    .set_condition_expression(condition)
                    .set_expression_attribute_names(Some(n.names))
                    .set_expression_attribute_values(Some(n.values))
                    .return_values_on_condition_check_failure(on_failure)
                    .build()
                    .map_err(built)?,
            )
        }
        // Checked, not changed (a queueing's "not holding, not released").
        (None, false) => {
            action.condition_check(
                ConditionCheck::builder()
                    .table_name(table)
                    .set_key(Some(key))
                    .condition_expression(condition.ok_or_else(|| {
                        unexpected("a holding neither checked nor changed".into())
                    })?)
                    .set_expression_attribute_names(names)
                    .set_expression_attribute_values(values)
                    .return_values_on_condition_check_failure(on_failure)
                    .build()
                    .map_err(built)?,
            )
        }
    }
    .build())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_holder_s_bucket_is_pinned_and_holders_spread_over_every_bucket() {
        // Every writer and reader of a holding must find it under the same key for as long as
        // it lives: the hash is FNV-1a, pinned here (a change of it fails this test).
        // FNV-1a 64 modulo 4, computed apart (Python's own arithmetic).
        let arn = "arn:aws:states:us-east-1:123456789012:execution:orders:o-1";
        assert_eq!(partition("orders-lock", arn), "orders-lock#1");
        assert_eq!(["exec-1", "exec-2", "exec-3"].map(bucket_of), [2, 3, 0]);
        let mut used = [0usize; HOLDINGS_BUCKETS as usize];
        for n in 0..400 {
            used[bucket_of(&format!(
                "arn:aws:states:us-east-1:123456789012:execution:m:e-{n}"
            )) as usize] += 1;
        }
        assert!(used.iter().all(|&n| (60..=140).contains(&n)), "{used:?}");
        assert_eq!(
            partitions("l").collect::<Vec<_>>(),
            ["l#0", "l#1", "l#2", "l#3"]
        );
    }

    #[test]
    fn distinct_locks_never_share_a_partition_whatever_their_names_hold() {
        let of = |lock: &str| partitions(lock).collect::<BTreeSet<_>>();
        for (a, b) in [("a", "a#0"), ("a#1", "a"), ("x#", "x"), ("l#0#1", "l#0")] {
            assert!(of(a).is_disjoint(&of(b)), "{a} and {b}");
        }
    }
}
