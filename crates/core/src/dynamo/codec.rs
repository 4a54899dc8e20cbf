//! The DynamoDB form of the semaphore's values: a lock's item and a waiter's record as attribute
//! values, and back. Nothing here sends a request.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use aws_sdk_dynamodb::primitives::Blob;
use aws_sdk_dynamodb::types::AttributeValue;

use crate::error::{AttributeError, StoreError};
use crate::input::{
    AcquisitionId, HolderId, InputError, Lease, Limit, LockConfig, LockName, Rate, TaskToken,
    Terms, Weight,
};
use crate::item::{
    FenceKey, Fences, FencingToken, Holding, Identity, Layout, Run, SemaphoreItem, Version,
};
use crate::queue::{Attempt, QueueKey, Waiter, Wakeup};

/// Attribute names of the semaphore item. `lock` is the table's only key; the template's table
/// and `semctl init` declare exactly this schema.
pub mod attr {
    pub const LOCK: &str = "lock";
    /// The item format: [`FORMAT`](super::FORMAT) or [`GATE_FORMAT`](super::GATE_FORMAT).
    /// Every write checks it, so a write never lands on an item of another format, and a
    /// missing item is told apart.
    pub const FORMAT: &str = "format";
    pub const VERSION: &str = "version";
    pub const LIMIT: &str = "limit";
    /// Map: slot key (`holder#acquisition`) -> the holding, packed in one number (see
    /// [`super::TOKEN_SPAN`]).
    pub const HOLDERS: &str = "holders";
    /// Binary sets of 8-byte fence keys, and the time of the last rotation (epoch ms).
    pub const YOUNG: &str = "young";
    pub const OLD: &str = "old";
    pub const ROTATED_AT: &str = "rotated_at";
    /// How many waiters are in the lock's line (absent: none).
    pub const WAITING: &str = "waiting";
    /// The sum of the holders' weights (always there: the limit check reads it).
    pub const USED: &str = "used";
    /// The last acquisition's start rate, as its spacing in ms (absent: none).
    pub const SPACING: &str = "spacing_ms";
    /// When the last acquisition landed (epoch ms; absent: none yet).
    pub const STARTED_AT: &str = "started_at";
    /// The bytes of the holder map's entries (always there: the acquire's room check reads it).
    pub const HELD_BYTES: &str = "held_bytes";
    /// The operator's configuration (absent: none), a map of [`CONFIG_LIMIT`] and, if set,
    /// [`CONFIG_MAX_WEIGHT`] and [`SPACING`]: always written whole, so a write can check it
    /// is exactly the one it assumed by comparing the maps.
    pub const CONFIG: &str = "config";
    pub const CONFIG_LIMIT: &str = "limit";
    pub const CONFIG_MAX_WEIGHT: &str = "max_weight";
    /// Map: slot key -> when that holder's lease ends (epoch ms); only leased holders have an
    /// entry. Always there (perhaps empty), so that a write can set an entry in it.
    pub const LEASES: &str = "leases";
    /// How many hold a slot of a gate (absent: none; see `SemaphoreItem::gate_holders`).
    pub const HOLDINGS: &str = "holdings";
}

/// The waiters' table's local secondary index whose sort key is the place in line.
pub const LINE_INDEX: &str = "line";

/// Attribute names of a waiter's item.
pub mod queue_attr {
    /// Partition key: the lock's name.
    pub const LOCK: &str = "lock";
    /// Sort key: the waiter's id, [`WaiterId::render`](crate::queue::WaiterId::render).
    pub const WAITER: &str = "waiter";
    /// The sort key of the waiters' local secondary index, `line`: the waiter's place in line,
    /// [`QueueKey::render`](crate::queue::QueueKey::render).
    pub const PLACE: &str = "place";
    /// The attempt of the parked task whose token the record holds.
    pub const ATTEMPT: &str = "attempt";
    /// How often the waiter checked again since it was queued.
    pub const CHECKS: &str = "checks";
    pub const HOLDER: &str = "holder";
    pub const ACQUISITION: &str = "acquisition";
    pub const RUN: &str = "run";
    pub const LIMIT: &str = "limit";
    /// The waiter's weight, and its start rate as its spacing in ms (absent: none).
    pub const WEIGHT: &str = "weight";
    pub const SPACING: &str = "spacing_ms";
    /// The lease the waiter's slot is to be held under, in ms (absent: none).
    pub const LEASE: &str = "lease_ms";
    /// A parked waiter's task token; a polling waiter has `poll_until_ms` instead (epoch ms:
    /// until when its last poll keeps it in line).
    pub const TASK_TOKEN: &str = "task_token";
    pub const POLL_UNTIL: &str = "poll_until_ms";
    pub const CONTEXT: &str = "context";
}

/// The item format this version writes and reads. Every write checks it: a write must not land
/// on an item of another format (whose attributes it would misread).
pub const FORMAT: u64 = 7;
/// The format of a gate lock's item (see [`Layout::Gate`]): the same attributes, its holders
/// kept elsewhere. Told apart by the format, so that a write rendered for the item layout is
/// refused by the format check every write makes, and never lands in a gate.
pub const GATE_FORMAT: u64 = 8;

/// The format an item of `layout` is stored in.
pub fn format_of(layout: Layout) -> u64 {
    match layout {
        Layout::Item => FORMAT,
        Layout::Gate => GATE_FORMAT,
    }
}

/// A holding is stored as one number,
/// `(weight - 1) * WEIGHT_SPAN + token * TIME_SPAN + acquired_at_ms`. The token is the version
/// the acquire's write makes, which only DynamoDB knows when the write lands; an update
/// expression can add the version to a number (`#version + :c`) but cannot build a map from it
/// or multiply it, so one number carries all three, and the version is stored times
/// [`TIME_SPAN`] (see [`VERSION_UNIT`]) so that the token it adds lands above the time. The
/// weight leads and the token follows, so "the slot taken under token t, of weight w" is a range
/// a condition can check (`BETWEEN`): a release shows the token of the slot it frees (F15) and
/// subtracts its weight from `used`. Times stay below 10^13 ms (until the year 2286), versions
/// below [`TOKEN_SPAN`] (a thousand writes a second for 31,000 years), weights at most 10,000: at
/// most 32 digits (DynamoDB keeps 38).
pub const TIME_SPAN: u128 = 10_000_000_000_000;
/// How many tokens (versions) there are room for: see [`TIME_SPAN`].
pub const TOKEN_SPAN: u128 = 1_000_000_000_000_000;
/// See [`TIME_SPAN`]: `TOKEN_SPAN * TIME_SPAN`.
pub const WEIGHT_SPAN: u128 = TOKEN_SPAN * TIME_SPAN;
/// The stored `version` attribute is the version times this (see [`TIME_SPAN`]); its trailing
/// zeros cost nothing, since DynamoDB sizes a number by its significant digits.
pub const VERSION_UNIT: u128 = TIME_SPAN;

/// The stored number of a holding.
pub(super) fn pack(holding: &Holding) -> u128 {
    weight_floor(holding.weight)
        + u128::from(holding.token.0) * TIME_SPAN
        + u128::from(holding.acquired_at_ms)
}

/// The holding a stored number packs (the inverse of [`pack`]); `Err` when the weight it leads
/// with is not one.
fn unpack(packed: u128) -> Result<Holding, InputError> {
    let rest = packed % WEIGHT_SPAN;
    // Below `WEIGHT_SPAN`, the token (< 10^15) and the time (< 10^13) each fit a u64.
    Ok(Holding {
        token: FencingToken((rest / TIME_SPAN) as u64),
        acquired_at_ms: (rest % TIME_SPAN) as u64,
        // A weight beyond an i64 is beyond the greatest weight too.
        weight: Weight::new(i64::try_from(packed / WEIGHT_SPAN + 1).unwrap_or(i64::MAX))?,
    })
}

/// The stored numbers of the slot taken under `token`, of `weight`, at any time: the range a
/// condition checks (see [`TIME_SPAN`]).
pub(super) fn slot_range(token: FencingToken, weight: Weight) -> (u128, u128) {
    let low = weight_floor(weight) + u128::from(token.0) * TIME_SPAN;
    (low, low + TIME_SPAN - 1)
}

/// The stored `version` attribute of `version` (see [`VERSION_UNIT`]).
pub(super) fn stored_version(version: u64) -> u128 {
    u128::from(version) * VERSION_UNIT
}

/// The least stored number of a holding of `weight`.
pub(super) fn weight_floor(weight: Weight) -> u128 {
    u128::from(weight.get() - 1) * WEIGHT_SPAN
}

pub(super) fn number(n: impl ToString) -> AttributeValue {
    AttributeValue::N(n.to_string())
}

pub(super) fn string(s: &str) -> AttributeValue {
    AttributeValue::S(s.to_owned())
}

/// A lock's configuration as the `config` map; the same configuration is always the same map.
pub(super) fn config_value(config: &LockConfig) -> AttributeValue {
    let mut map = HashMap::from([(attr::CONFIG_LIMIT.to_owned(), number(config.limit.get()))]);
    if let Some(max) = config.max_weight {
        map.insert(attr::CONFIG_MAX_WEIGHT.to_owned(), number(max.get()));
    }
    if let Some(rate) = config.rate {
        map.insert(attr::SPACING.to_owned(), number(rate.spacing_ms()));
    }
    AttributeValue::M(map)
}

fn get_leases(
    attrs: &HashMap<String, AttributeValue>,
) -> Result<BTreeMap<Identity, u64>, AttributeError> {
    let map = attrs
        .get(attr::LEASES)
        .and_then(|v| v.as_m().ok())
        .ok_or(AttributeError::NotA {
            name: attr::LEASES,
            expected: "a map",
        })?;
    map.iter()
        .map(|(key, value)| {
            let identity =
                Identity::from_slot_key(key).map_err(|problem| AttributeError::HolderKey {
                    key: key.clone(),
                    problem,
                })?;
            let until = value
                .as_n()
                .ok()
                .and_then(|n| n.parse::<u64>().ok())
                .ok_or_else(|| AttributeError::HolderValue { key: key.clone() })?;
            Ok((identity, until))
        })
        .collect()
}

fn get_config(
    attrs: &HashMap<String, AttributeValue>,
) -> Result<Option<LockConfig>, AttributeError> {
    let Some(value) = attrs.get(attr::CONFIG) else {
        return Ok(None);
    };
    let map = value.as_m().map_err(|_| AttributeError::NotA {
        name: attr::CONFIG,
        expected: "a map",
    })?;
    let limit = Limit::new(get_number(map, attr::CONFIG_LIMIT)?).map_err(invalid(attr::CONFIG))?;
    let max_weight = get_optional(map, attr::CONFIG_MAX_WEIGHT)?
        .map(Weight::new)
        .transpose()
        .map_err(invalid(attr::CONFIG))?;
    let rate = get_optional(map, attr::SPACING)?
        .map(Rate::from_spacing_ms)
        .transpose()
        .map_err(invalid(attr::CONFIG))?;
    LockConfig::new(limit, max_weight, rate)
        .map(Some)
        .map_err(invalid(attr::CONFIG))
}

pub(super) fn binary(key: &FenceKey) -> AttributeValue {
    AttributeValue::B(Blob::new(key.as_bytes().to_vec()))
}

pub(super) fn binary_set(keys: &BTreeSet<FenceKey>) -> AttributeValue {
    AttributeValue::Bs(
        keys.iter()
            .map(|key| Blob::new(key.as_bytes().to_vec()))
            .collect(),
    )
}

/// The DynamoDB attributes of an item. Empty fence generations are left out (DynamoDB has no
/// empty sets); the holder map is always there, since writes set and remove entries in it.
pub fn encode(item: &SemaphoreItem) -> HashMap<String, AttributeValue> {
    let holders = item
        .holders
        .iter()
        .map(|(identity, holding)| (identity.slot_key(), number(pack(holding))))
        .collect();
    let mut attrs = HashMap::from([
        (attr::LOCK.to_owned(), string(item.lock.as_str())),
        (attr::FORMAT.to_owned(), number(format_of(item.layout))),
        (
            attr::VERSION.to_owned(),
            number(stored_version(item.version.0)),
        ),
        (attr::HOLDERS.to_owned(), AttributeValue::M(holders)),
        (attr::USED.to_owned(), number(item.used)),
        (attr::HELD_BYTES.to_owned(), number(item.held_bytes)),
        (
            attr::LEASES.to_owned(),
            AttributeValue::M(
                item.leases
                    .iter()
                    .map(|(identity, until)| (identity.slot_key(), number(*until)))
                    .collect(),
            ),
        ),
    ]);
    if let Some(rate) = item.rate {
        attrs.insert(attr::SPACING.to_owned(), number(rate.spacing_ms()));
    }
    if let Some(at_ms) = item.started_at_ms {
        attrs.insert(attr::STARTED_AT.to_owned(), number(at_ms));
    }
    if let Some(limit) = item.limit {
        attrs.insert(attr::LIMIT.to_owned(), number(limit.get()));
    }
    for (name, keys) in [
        (attr::YOUNG, &item.fences.young),
        (attr::OLD, &item.fences.old),
    ] {
        if !keys.is_empty() {
            attrs.insert(name.to_owned(), binary_set(keys));
        }
    }
    if let Some(at_ms) = item.fences.rotated_at_ms {
        attrs.insert(attr::ROTATED_AT.to_owned(), number(at_ms));
    }
    if item.waiting > 0 {
        attrs.insert(attr::WAITING.to_owned(), number(item.waiting));
    }
    if let Some(config) = &item.config {
        attrs.insert(attr::CONFIG.to_owned(), config_value(config));
    }
    if item.gate_holders > 0 {
        attrs.insert(attr::HOLDINGS.to_owned(), number(item.gate_holders));
    }
    attrs
}

/// Reads an item back, checking that it is one of ours, in a format this version writes (any
/// other is [`StoreError::UnknownFormat`]).
pub fn decode(attrs: &HashMap<String, AttributeValue>) -> Result<SemaphoreItem, StoreError> {
    let lock = get_text(attrs, attr::LOCK).unwrap_or_default();
    let format = attrs.get(attr::FORMAT);
    let layout = match format.and_then(|v| v.as_n().ok()?.parse::<u64>().ok()) {
        Some(FORMAT) => Layout::Item,
        Some(GATE_FORMAT) => Layout::Gate,
        _ => {
            return Err(StoreError::UnknownFormat {
                lock,
                found: format.map(|v| match v {
                    AttributeValue::N(n) => n.clone(),
                    AttributeValue::S(s) => format!("{s:?}"),
                    other => format!("{other:?}"),
                }),
            })
        }
    };
    decode_item(attrs, layout).map_err(|problem| StoreError::CorruptItem { lock, problem })
}

fn decode_item(
    attrs: &HashMap<String, AttributeValue>,
    layout: Layout,
) -> Result<SemaphoreItem, AttributeError> {
    let lock = LockName::new(get_text(attrs, attr::LOCK)?).map_err(invalid(attr::LOCK))?;
    let stored: u128 = get_number(attrs, attr::VERSION)?;
    if !stored.is_multiple_of(VERSION_UNIT) || stored / VERSION_UNIT >= TOKEN_SPAN {
        return Err(AttributeError::OutOfRange {
            name: attr::VERSION,
            value: stored,
        });
    }
    let version = (stored / VERSION_UNIT) as u64;
    let limit = get_optional(attrs, attr::LIMIT)?
        .map(Limit::new)
        .transpose()
        .map_err(invalid(attr::LIMIT))?;
    let mut holders = BTreeMap::new();
    let map = attrs
        .get(attr::HOLDERS)
        .and_then(|v| v.as_m().ok())
        .ok_or(AttributeError::NotA {
            name: attr::HOLDERS,
            expected: "a map",
        })?;
    for (key, value) in map {
        let identity =
            Identity::from_slot_key(key).map_err(|problem| AttributeError::HolderKey {
                key: key.clone(),
                problem,
            })?;
        let packed = value
            .as_n()
            .ok()
            .and_then(|n| n.parse::<u128>().ok())
            .ok_or_else(|| AttributeError::HolderValue { key: key.clone() })?;
        let holding = unpack(packed).map_err(|problem| AttributeError::HolderWeight {
            key: key.clone(),
            problem,
        })?;
        holders.insert(identity, holding);
    }
    let used = get_number(attrs, attr::USED)?;
    let held_bytes = get_number(attrs, attr::HELD_BYTES)?;
    Ok(SemaphoreItem {
        lock,
        layout,
        limit,
        version: Version(version),
        holders,
        fences: Fences {
            young: get_fences(attrs, attr::YOUNG)?,
            old: get_fences(attrs, attr::OLD)?,
            rotated_at_ms: get_optional(attrs, attr::ROTATED_AT)?,
        },
        waiting: get_optional(attrs, attr::WAITING)?.unwrap_or(0),
        used,
        rate: get_optional(attrs, attr::SPACING)?
            .map(Rate::from_spacing_ms)
            .transpose()
            .map_err(invalid(attr::SPACING))?,
        started_at_ms: get_optional(attrs, attr::STARTED_AT)?,
        held_bytes,
        config: get_config(attrs)?,
        leases: get_leases(attrs)?,
        tombstones: BTreeMap::new(),
        gate_holders: get_optional(attrs, attr::HOLDINGS)?.unwrap_or(0),
    })
}

fn get_fences(
    attrs: &HashMap<String, AttributeValue>,
    name: &'static str,
) -> Result<BTreeSet<FenceKey>, AttributeError> {
    let Some(value) = attrs.get(name) else {
        return Ok(BTreeSet::new());
    };
    let blobs = value.as_bs().map_err(|_| AttributeError::NotA {
        name,
        expected: "a binary set",
    })?;
    blobs
        .iter()
        .map(|blob| {
            <[u8; FenceKey::LEN]>::try_from(blob.as_ref())
                .map(FenceKey::from_bytes)
                .map_err(|_| AttributeError::FenceLength {
                    name,
                    bytes: blob.as_ref().len(),
                })
        })
        .collect()
}

pub fn encode_waiter(waiter: &Waiter) -> HashMap<String, AttributeValue> {
    let mut attrs = HashMap::from([
        (queue_attr::LOCK.to_owned(), string(waiter.lock.as_str())),
        (queue_attr::WAITER.to_owned(), string(&waiter.id().render())),
        (queue_attr::PLACE.to_owned(), string(&waiter.key.render())),
        (queue_attr::ATTEMPT.to_owned(), number(waiter.attempt.0)),
        (queue_attr::CHECKS.to_owned(), number(waiter.checks)),
        (
            queue_attr::HOLDER.to_owned(),
            string(waiter.identity.holder.as_str()),
        ),
        (
            queue_attr::ACQUISITION.to_owned(),
            string(waiter.identity.acquisition.as_str()),
        ),
        (queue_attr::RUN.to_owned(), number(waiter.run.0)),
        (
            queue_attr::LIMIT.to_owned(),
            number(waiter.terms.limit.get()),
        ),
        (
            queue_attr::WEIGHT.to_owned(),
            number(waiter.terms.weight.get()),
        ),
        (queue_attr::CONTEXT.to_owned(), string(&waiter.context)),
    ]);
    match &waiter.wakeup {
        Wakeup::Task(token) => {
            attrs.insert(queue_attr::TASK_TOKEN.to_owned(), string(token.as_str()));
        }
        Wakeup::Poll { until_ms } => {
            attrs.insert(queue_attr::POLL_UNTIL.to_owned(), number(*until_ms));
        }
    }
    if let Some(rate) = waiter.terms.rate {
        attrs.insert(queue_attr::SPACING.to_owned(), number(rate.spacing_ms()));
    }
    if let Some(lease) = waiter.terms.lease {
        attrs.insert(queue_attr::LEASE.to_owned(), number(lease.as_ms()));
    }
    attrs
}

pub fn decode_waiter(attrs: &HashMap<String, AttributeValue>) -> Result<Waiter, StoreError> {
    decode_waiter_attrs(attrs).map_err(|problem| StoreError::CorruptItem {
        lock: get_text(attrs, queue_attr::LOCK).unwrap_or_default(),
        problem: AttributeError::Waiter(Box::new(problem)),
    })
}

fn decode_waiter_attrs(attrs: &HashMap<String, AttributeValue>) -> Result<Waiter, AttributeError> {
    let text = |name| get_text(attrs, name);
    let limit =
        Limit::new(get_number(attrs, queue_attr::LIMIT)?).map_err(invalid(queue_attr::LIMIT))?;
    let weight =
        Weight::new(get_number(attrs, queue_attr::WEIGHT)?).map_err(invalid(queue_attr::WEIGHT))?;
    let rate = get_optional(attrs, queue_attr::SPACING)?
        .map(Rate::from_spacing_ms)
        .transpose()
        .map_err(invalid(queue_attr::SPACING))?;
    Ok(Waiter {
        lock: LockName::new(text(queue_attr::LOCK)?).map_err(invalid(queue_attr::LOCK))?,
        key: QueueKey::parse(&text(queue_attr::PLACE)?)?,
        identity: Identity::new(
            HolderId::new(text(queue_attr::HOLDER)?).map_err(invalid(queue_attr::HOLDER))?,
            AcquisitionId::new(text(queue_attr::ACQUISITION)?)
                .map_err(invalid(queue_attr::ACQUISITION))?,
        ),
        // F15: a run sizes the fences written for it; none past the last an execution has.
        run: Run::new(get_number(attrs, queue_attr::RUN)?).map_err(invalid(queue_attr::RUN))?,
        terms: Terms::new(limit, weight, rate)
            .map_err(AttributeError::Terms)?
            .with_lease(
                get_optional(attrs, queue_attr::LEASE)?
                    .map(Lease::ms)
                    .transpose()
                    .map_err(invalid(queue_attr::LEASE))?,
            ),
        wakeup: match get_optional(attrs, queue_attr::POLL_UNTIL)? {
            Some(until_ms) => Wakeup::Poll { until_ms },
            None => Wakeup::Task(
                TaskToken::new(text(queue_attr::TASK_TOKEN)?)
                    .map_err(invalid(queue_attr::TASK_TOKEN))?,
            ),
        },
        attempt: Attempt(get_number(attrs, queue_attr::ATTEMPT)?),
        checks: get_number(attrs, queue_attr::CHECKS)?,
        context: text(queue_attr::CONTEXT)?,
    })
}

/// The attribute `name`, a string.
pub(super) fn get_text(
    attrs: &HashMap<String, AttributeValue>,
    name: &'static str,
) -> Result<String, AttributeError> {
    attrs
        .get(name)
        .and_then(|v| v.as_s().ok())
        .cloned()
        .ok_or(AttributeError::NotA {
            name,
            expected: "a string",
        })
}

/// The attribute `name`, a whole number that fits a `T`.
pub(super) fn get_number<T: TryFrom<u128>>(
    attrs: &HashMap<String, AttributeValue>,
    name: &'static str,
) -> Result<T, AttributeError> {
    get_optional(attrs, name)?.ok_or(AttributeError::Missing { name })
}

/// The attribute `name`, a whole number that fits a `T`, if it is there.
pub(super) fn get_optional<T: TryFrom<u128>>(
    attrs: &HashMap<String, AttributeValue>,
    name: &'static str,
) -> Result<Option<T>, AttributeError> {
    let Some(value) = attrs.get(name) else {
        return Ok(None);
    };
    let n: u128 = value
        .as_n()
        .ok()
        .and_then(|n| n.parse().ok())
        .ok_or(AttributeError::NotA {
            name,
            expected: "a whole number",
        })?;
    T::try_from(n)
        .map(Some)
        .map_err(|_| AttributeError::OutOfRange { name, value: n })
}

/// How a value of attribute `name` that is not a valid input reads.
pub(super) fn invalid(name: &'static str) -> impl Fn(InputError) -> AttributeError {
    move |problem| AttributeError::Invalid { name, problem }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn identity() -> Identity {
        Identity::new(
            HolderId::new("arn:aws:states:us-east-1:1:execution:m:e#1").unwrap(),
            AcquisitionId::new("u-1").unwrap(),
        )
    }

    #[test]
    fn an_item_survives_encoding() {
        let mut item = SemaphoreItem::empty(LockName::new("l").unwrap());
        item.version = Version(7);
        item.limit = Some(Limit::new(3).unwrap());
        let id = identity();
        item.holders.insert(
            id.clone(),
            Holding {
                token: FencingToken(6),
                acquired_at_ms: 1_700_000_000_123,
                weight: Weight::new(4).unwrap(),
            },
        );
        item.fences.young.insert(FenceKey::acquisition(&id));
        item.fences
            .old
            .insert(FenceKey::execution(&id.holder, Run::FIRST));
        item.fences.rotated_at_ms = Some(1_700_000_000_000);
        assert_eq!(decode(&encode(&item)).unwrap(), item);
        // A configuration, whole and in part (F14).
        for config in [
            LockConfig::new(
                Limit::new(3).unwrap(),
                Some(Weight::new(2).unwrap()),
                Some(Rate::per_second(4.0).unwrap()),
            ),
            LockConfig::new(Limit::new(3).unwrap(), None, None),
        ] {
            item.config = Some(config.unwrap());
            assert_eq!(decode(&encode(&item)).unwrap(), item);
        }
        // One that is not a configuration is named, not read as none.
        let mut attrs = encode(&item);
        attrs.insert(
            attr::CONFIG.to_owned(),
            AttributeValue::M(HashMap::from([(attr::CONFIG_LIMIT.to_owned(), number(0))])),
        );
        assert!(decode(&attrs).unwrap_err().to_string().contains("config"));
        let empty = SemaphoreItem::empty(LockName::new("l").unwrap());
        assert_eq!(decode(&encode(&empty)).unwrap(), empty);
    }

    #[test]
    fn a_holding_is_one_number_of_its_weight_then_its_token_then_its_time() {
        let mut item = SemaphoreItem::empty(LockName::new("l").unwrap());
        item.version = Version(42);
        item.holders.insert(
            identity(),
            Holding {
                token: FencingToken(42),
                acquired_at_ms: 1_796_000_123_456,
                weight: Weight::ONE,
            },
        );
        let attrs = encode(&item);
        let entry = &attrs[attr::HOLDERS].as_m().unwrap()[&identity().slot_key()];
        assert_eq!(entry.as_n().unwrap(), "421796000123456");
        // The version is stored times TIME_SPAN, so that `#version + :c` puts a token above the
        // time.
        assert_eq!(attrs[attr::VERSION].as_n().unwrap(), "420000000000000");
        assert_eq!(decode(&attrs).unwrap(), item);
        // A stored version that is not a whole number of versions is corrupt, not rounded.
        let mut odd = attrs.clone();
        odd.insert(attr::VERSION.to_owned(), number(420_000_000_000_001u128));
        assert!(decode(&odd).unwrap_err().to_string().contains("version"));
    }

    #[test]
    fn an_item_of_another_format_or_none_is_named_as_such() {
        let mut attrs = encode(&SemaphoreItem::empty(LockName::new("other-lock").unwrap()));
        for (format, found) in [
            (Some(number(99)), Some("99")),
            (Some(string("5")), Some("\"5\"")),
            (None, None),
        ] {
            match format {
                Some(format) => attrs.insert(attr::FORMAT.to_owned(), format),
                None => attrs.remove(attr::FORMAT),
            };
            let err = decode(&attrs).unwrap_err();
            assert!(
                matches!(
                    err,
                    StoreError::UnknownFormat { ref lock, found: ref f }
                        if lock == "other-lock" && f.as_deref() == found
                ),
                "{err:?}"
            );
            assert!(
                err.to_string().contains("not a format this version reads"),
                "{err}"
            );
        }
    }

    #[test]
    fn a_corrupt_item_names_its_attribute_and_what_is_wrong() {
        let mut attrs = encode(&SemaphoreItem::empty(LockName::new("l").unwrap()));
        attrs.insert(attr::USED.to_owned(), string("many"));
        let err = decode(&attrs).unwrap_err();
        assert!(
            matches!(
                err,
                StoreError::CorruptItem {
                    problem: AttributeError::NotA {
                        name: attr::USED,
                        ..
                    },
                    ..
                }
            ),
            "{err:?}"
        );
        assert!(
            err.to_string()
                .contains("attribute used is missing or not a whole number"),
            "{err}"
        );
    }
}
