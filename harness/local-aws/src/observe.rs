//! An independent view of the table: raw `GetItem`, checked without the product's decoder, so
//! an invariant check cannot share a bug with the code it checks.

use std::collections::HashMap;

use aws_sdk_dynamodb::types::AttributeValue;
use aws_sdk_dynamodb::Client;
use semaphore_core::dynamo::item_size;

/// An item of a table as `GetItem` or `Query` hands it back.
pub type RawRecord = HashMap<String, AttributeValue>;

/// What the raw item says, decoded here ([`decode`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Observed {
    /// The holder map's keys, `<holder>#<acquisition>`.
    pub holders: Vec<String>,
    /// The holder entries that are packed numbers, unpacked.
    pub holdings: Vec<RawHolding>,
    /// The item's format (`format`): 7 for a lock of the item layout, 8 for a gate, whose
    /// holders are read from its holding items ([`decode_gate`]).
    pub format: Option<u64>,
    /// The leased holders' keys and when each lease ends (epoch ms).
    pub leases: Vec<(String, u64)>,
    pub version: i64,
    pub fences: usize,
    /// When the fences were last rotated (epoch ms), if ever.
    pub rotated_at: Option<u64>,
    /// Size of the item as DynamoDB counts it (attribute names plus values), in bytes.
    pub approx_bytes: usize,
    /// The lock's count of waiters in line (`waiting`; absent: 0).
    pub waiting: u64,
    /// The stored sum of the held weights (`used`).
    pub used: i64,
    /// Each holder's weight, read from its stored number: the digits above the 28 of its
    /// token and acquisition time, plus one.
    pub weights: Vec<u64>,
    /// When the last acquisition landed (`started_at`, epoch ms), if any did.
    pub started_at: Option<u64>,
    /// The start rate the item last carried, as its spacing (`spacing_ms`).
    pub spacing_ms: Option<u64>,
    /// The stored bytes of the holder map's entries (`held_bytes`).
    pub held_bytes: i64,
    /// A gate's count of its holders (`holdings`; absent: 0). Always 0 for the item layout.
    pub gate_holdings: u64,
    /// A gate's released holdings still kept as tombstones (fences). 0 for the item layout.
    pub tombstones: usize,
    /// Whether the item and the holders were read as of one moment: always for the item layout
    /// (one `GetItem`); for a gate, when its version was the same before and after the
    /// `Query` of its holdings. Only then are the gate's stored sums checked against them.
    pub snapshot: bool,
    /// What could not be read: a missing or non-number attribute, a holder entry that is not
    /// a number. Empty for an item the product wrote.
    pub malformed: Vec<String>,
}

/// One holder entry, unpacked from its number `(weight - 1) * 10^28 + token * 10^13 +
/// acquired_at_ms`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawHolding {
    pub key: String,
    pub weight: u64,
    pub acquired_at_ms: u64,
    pub token: u64,
}

/// What `held_bytes` counts per holder besides its key: its number at its largest (31 digits,
/// 17 bytes as DynamoDB sizes numbers) and 1 byte per map element.
const HELD_BYTES_PER_ENTRY: usize = 17 + 1;

/// The time part of a packed holder entry (its last 13 digits); the stored `version` is the
/// version times this.
const TIME_SPAN: u128 = 10u128.pow(13);
/// The weight part of a packed holder entry: `weight - 1` times this (after 15 digits of token
/// and 13 of time).
const WEIGHT_SPAN: u128 = 10u128.pow(28);

pub async fn raw_item(client: &Client, table: &str, lock: &str) -> Option<RawRecord> {
    client
        .get_item()
        .table_name(table)
        .key("lock", AttributeValue::S(lock.to_owned()))
        .consistent_read(true)
        .send()
        .await
        .expect("GetItem")
        .item
}

/// The lock's item read raw and decoded here; panics if it is malformed (see
/// [`Observed::malformed`]).
pub async fn observe(client: &Client, table: &str, lock: &str) -> Option<Observed> {
    let item = raw_item(client, table, lock).await?;
    let seen = decode(&item);
    assert!(seen.malformed.is_empty(), "{:?}: {item:?}", seen.malformed);
    Some(seen)
}

/// Our lock item (format 7) read without the product's decoder, so that an invariant check
/// cannot share a bug with the code it checks: the tests' reads, the local run's poller and the
/// bench's. What cannot be read is listed in [`Observed::malformed`], not fatal: a poller still
/// sees who holds.
pub fn decode(item: &RawRecord) -> Observed {
    let mut malformed = Vec::new();
    let mut optional = |name: &str| -> Option<u128> {
        let value = item.get(name)?;
        let number = value.as_n().ok().and_then(|n| n.parse().ok());
        if number.is_none() {
            malformed.push(format!("{name} is {value:?}, not a number"));
        }
        number
    };
    let gate_holdings = optional("holdings");
    let (format, rotated_at, started_at, spacing_ms, waiting) = (
        optional("format"),
        optional("rotated_at"),
        optional("started_at"),
        optional("spacing_ms"),
        optional("waiting"),
    );
    let (version, used, held_bytes) = (
        optional("version"),
        optional("used"),
        optional("held_bytes"),
    );
    for (name, value) in [
        ("version", version),
        ("used", used),
        ("held_bytes", held_bytes),
    ] {
        if value.is_none() && !item.contains_key(name) {
            malformed.push(format!("{name} is missing"));
        }
    }
    let entries = item.get("holders").and_then(|v| v.as_m().ok());
    let mut holdings = Vec::new();
    for (key, value) in entries.into_iter().flatten() {
        match value.as_n().ok().and_then(|n| n.parse::<u128>().ok()) {
            Some(packed) => holdings.push(RawHolding {
                key: key.clone(),
                weight: u64::try_from(packed / WEIGHT_SPAN + 1).unwrap_or(u64::MAX),
                token: u64::try_from((packed % WEIGHT_SPAN) / TIME_SPAN).unwrap_or(u64::MAX),
                acquired_at_ms: (packed % TIME_SPAN) as u64,
            }),
            None => malformed.push(format!("holder {key} is {value:?}, not a number")),
        }
    }
    // F13: when each leased holder's lease ends; a map always there.
    let mut leases = Vec::new();
    match item.get("leases").and_then(|v| v.as_m().ok()) {
        Some(map) => {
            for (key, value) in map {
                match value.as_n().ok().and_then(|n| n.parse::<u64>().ok()) {
                    Some(until) => leases.push((key.clone(), until)),
                    None => malformed.push(format!("lease {key} is {value:?}, not a number")),
                }
            }
        }
        None => malformed.push("leases is missing".to_owned()),
    }
    if version.is_some_and(|v| v % TIME_SPAN != 0) {
        malformed.push(format!(
            "version is {version:?}, not a whole number of versions (times {TIME_SPAN})"
        ));
    }
    let version = version.map(|v| v / TIME_SPAN);
    let small = |n: Option<u128>| n.and_then(|n| u64::try_from(n).ok());
    let signed = |n: Option<u128>| n.and_then(|n| i64::try_from(n).ok()).unwrap_or(0);
    Observed {
        leases,
        holders: entries
            .map(|m| m.keys().cloned().collect())
            .unwrap_or_default(),
        weights: holdings.iter().map(|h| h.weight).collect(),
        holdings,
        format: small(format),
        version: signed(version),
        // Fences are two binary sets of 8-byte keys (the young and the old generation).
        fences: ["young", "old"]
            .iter()
            .filter_map(|name| item.get(*name).and_then(|v| v.as_bs().ok()))
            .map(Vec::len)
            .sum(),
        rotated_at: small(rotated_at),
        approx_bytes: item_size(item),
        waiting: small(waiting).unwrap_or(0),
        used: signed(used),
        started_at: small(started_at),
        spacing_ms: small(spacing_ms),
        held_bytes: signed(held_bytes),
        gate_holdings: small(gate_holdings).unwrap_or(0),
        tombstones: 0,
        snapshot: true,
        malformed,
    }
}

/// The format of a gate's item; its holders are items of their own, in the holdings table.
pub const GATE_FORMAT: u64 = 8;
/// The format of a lock's item in the item layout.
pub const ITEM_FORMAT: u64 = 7;

/// A gate lock read raw: its item (`gate`, read before the holdings), its holding items (one
/// `Query`), and whether the gate's version was the same when read again after them
/// (`snapshot`). Decoded here, not by the product: each holding item is `state` `held` (with
/// `token`, `weight`, `acquired_at` and perhaps `lease_until`) or `released` (a tombstone, with
/// `released_at`).
pub fn decode_gate(gate: &RawRecord, holdings: &[RawRecord], snapshot: bool) -> Observed {
    let mut seen = decode(gate);
    seen.snapshot = snapshot;
    for record in holdings {
        let slot = record.get("slot").and_then(|v| v.as_s().ok());
        let state = record.get("state").and_then(|v| v.as_s().ok());
        let number = |name: &str| -> Option<u64> {
            record
                .get(name)
                .and_then(|v| v.as_n().ok())
                .and_then(|n| n.parse().ok())
        };
        match (slot, state.map(String::as_str)) {
            (Some(_), Some("released")) if number("released_at").is_some() => seen.tombstones += 1,
            (Some(slot), Some("held")) => {
                match (number("token"), number("weight"), number("acquired_at")) {
                    (Some(token), Some(weight), Some(acquired_at_ms)) => {
                        seen.holders.push(slot.clone());
                        seen.weights.push(weight);
                        seen.holdings.push(RawHolding {
                            key: slot.clone(),
                            weight,
                            acquired_at_ms,
                            token,
                        });
                        if let Some(until) = number("lease_until") {
                            seen.leases.push((slot.clone(), until));
                        }
                    }
                    _ => seen
                        .malformed
                        .push(format!("holding {slot} lacks a number: {record:?}")),
                }
            }
            _ => seen.malformed.push(format!(
                "a holding item that is neither held nor released: {record:?}"
            )),
        }
    }
    seen
}

/// The holding items of gate `lock` in `holdings_table`, raw: every partition of its holdings
/// (`semaphore_core::dynamo::holdings_partitions`).
pub async fn raw_holdings(
    client: &Client,
    holdings_table: &str,
    lock: &str,
) -> Result<Vec<RawRecord>, crate::Error> {
    let mut records = Vec::new();
    for part in semaphore_core::dynamo::holdings_partitions(lock) {
        records.extend(query_lock(client, holdings_table, ("part", &part)).await?);
    }
    Ok(records)
}

/// Every item of the semaphore's three tables (locks, waiters, gate holdings) as `Scan` hands
/// them back, without the product's decoder: what a test compares before and after a request
/// to show that nothing was written.
pub async fn raw_tables(store: &semaphore_core::DynamoStore) -> Vec<(String, Vec<RawRecord>)> {
    let mut tables = Vec::new();
    for table in [store.table(), store.queue_table(), store.holdings_table()] {
        let items = store
            .client()
            .scan()
            .table_name(table)
            .consistent_read(true)
            .send()
            .await
            .expect("scan")
            .items()
            .to_vec();
        tables.push((table.to_owned(), items));
    }
    tables
}

/// The records of `lock`'s line in the waiters' table (`queue_table`), raw, in line order (by
/// `place`, the sort key of the table's local index `line`, which holds only the keys).
pub async fn raw_line(client: &Client, queue_table: &str, lock: &str) -> Vec<RawRecord> {
    let mut records = query_lock(client, queue_table, ("lock", lock))
        .await
        .expect("Query the waiters' table");
    records.sort_by(|a, b| text(a, "place").cmp(text(b, "place")));
    records
}

/// Every item of `table` whose partition key (`name`) is `lock`, raw, one consistent `Query` a
/// page.
async fn query_lock(
    client: &Client,
    table: &str,
    (name, lock): (&str, &str),
) -> Result<Vec<RawRecord>, crate::Error> {
    let mut records = Vec::new();
    let mut start = None;
    loop {
        let page = client
            .query()
            .table_name(table)
            .key_condition_expression("#key = :key")
            .expression_attribute_names("#key", name)
            .expression_attribute_values(":key", AttributeValue::S(lock.to_owned()))
            .consistent_read(true)
            .set_exclusive_start_key(start)
            .send()
            .await
            .map_err(crate::Error::aws(format!("Query {table} for {lock}")))?;
        records.extend(page.items.unwrap_or_default());
        start = page.last_evaluated_key;
        if start.is_none() {
            return Ok(records);
        }
    }
}

/// A string attribute of a raw record.
pub fn text<'a>(record: &'a RawRecord, name: &str) -> &'a str {
    record
        .get(name)
        .and_then(|v| v.as_s().ok())
        .unwrap_or_else(|| panic!("attribute {name} missing or not a string: {record:?}"))
}

/// S1 and the line's count of one lock, read raw: no more holders than `limit`, and the item's
/// `waiting` is the number of records in its line. Answers what was read.
pub async fn assert_consistent(
    client: &Client,
    table: &str,
    queue_table: &str,
    lock: &str,
    limit: usize,
) -> (Option<Observed>, Vec<RawRecord>) {
    let seen = observe(client, table, lock).await;
    let line = raw_line(client, queue_table, lock).await;
    if let Some(seen) = &seen {
        seen.assert_safe(limit);
    }
    let waiting = seen.as_ref().map_or(0, |s| s.waiting);
    assert_eq!(
        waiting,
        line.len() as u64,
        "lock {lock}: waiting is {waiting}, and {} records are in line: {line:?}",
        line.len()
    );
    (seen, line)
}

impl Observed {
    /// The sum of the holders' weights, as their own numbers say.
    pub fn weight_held(&self) -> u64 {
        self.weights.iter().sum()
    }

    /// The holding executions, one per slot (each key's part before its acquisition).
    pub fn holder_executions(&self) -> Vec<String> {
        self.holders
            .iter()
            // Acquisition ids have no '#'; a key without one is kept whole, so it still counts.
            .map(|key| {
                key.rsplit_once('#')
                    .map_or(key.as_str(), |(h, _)| h)
                    .to_owned()
            })
            .collect()
    }

    /// Every start the item shows: each holder's acquisition and the item's last start.
    pub fn starts(&self) -> Vec<u64> {
        let held = self.holdings.iter().map(|h| h.acquired_at_ms);
        held.chain(self.started_at).collect()
    }

    /// What is inconsistent in this read, if anything (S1 and the item's own bookkeeping): it is
    /// malformed or of neither format (7, or a gate's 8); a lease is not a holder's; a holder's
    /// weight is not 1 to 10,000, or its token is one the version has not reached (on a read as
    /// of one moment), or shared with another (every write bumps the version and a token is the
    /// version its acquire made); `used` is not the sum of the holders' weights, `held_bytes` not
    /// the bytes of their entries, or a gate's count not its held holdings; with `limit`, that
    /// sum is above it.
    pub fn problem(&self, limit: Option<u64>) -> Option<String> {
        if let Some(first) = self.malformed.first() {
            return Some(first.clone());
        }
        let gate = match self.format {
            Some(ITEM_FORMAT) => false,
            Some(GATE_FORMAT) => true,
            other => {
                return Some(format!(
                    "format {other:?}, neither {ITEM_FORMAT} nor {GATE_FORMAT}"
                ))
            }
        };
        if let Some((key, _)) = self
            .leases
            .iter()
            .find(|(key, _)| !self.holders.contains(key))
        {
            return Some(format!("a lease of {key}, which holds no slot"));
        }
        let mut tokens = std::collections::BTreeMap::new();
        for h in &self.holdings {
            if !(1..=10_000).contains(&h.weight) {
                return Some(format!("holder {} has weight {}", h.key, h.weight));
            }
            // A holding read after its gate may be newer than the gate's version as read.
            let ahead = i64::try_from(h.token).map_or(true, |t| t > self.version);
            if h.token == 0 || (self.snapshot && ahead) {
                return Some(format!(
                    "holder {} has token {}, version {}",
                    h.key, h.token, self.version
                ));
            }
            if let Some(other) = tokens.insert(h.token, &h.key) {
                return Some(format!(
                    "holders {other} and {} share token {}",
                    h.key, h.token
                ));
            }
        }
        let weight = self.weight_held();
        if let Some(limit) = limit.filter(|&limit| weight > limit) {
            return Some(format!("weight {weight} held, above the limit {limit}"));
        }
        if !self.snapshot {
            return None;
        }
        if gate && self.gate_holdings != self.holders.len() as u64 {
            return Some(format!(
                "the gate counts {} holdings, and {} are held",
                self.gate_holdings,
                self.holders.len()
            ));
        }
        if u64::try_from(self.used).ok() != Some(weight) {
            return Some(format!(
                "used {} with holders of weights summing to {weight}",
                self.used
            ));
        }
        // A gate keeps no holder entries in its item: its `held_bytes` stays 0.
        let entries: usize = if gate {
            0
        } else {
            self.holders
                .iter()
                .map(|key| key.len() + HELD_BYTES_PER_ENTRY)
                .sum()
        };
        if usize::try_from(self.held_bytes).ok() != Some(entries) {
            return Some(format!(
                "held_bytes {} with holder entries of {entries} bytes",
                self.held_bytes
            ));
        }
        None
    }

    /// S1 on this read: the stored `used` is the sum of the holders' weights, and that sum is
    /// within `limit` (with weight 1 everywhere: at most `limit` holders); and the rest of
    /// [`Observed::problem`].
    pub fn assert_safe(&self, limit: usize) {
        if let Some(problem) = self.problem(Some(limit as u64)) {
            panic!("{problem}: {self:?}");
        }
    }
}

/// A lock's starts under a start-rate limit, as the poller saw them: every holder's
/// `acquired_at` and the item's `started_at` (the writers' clock: this machine's, for all).
#[derive(Debug, Default, Clone, serde::Serialize)]
pub struct StartRate {
    /// Acquisitions per second asked for, and the spacing it is kept as.
    pub rate_per_s: f64,
    pub spacing_ms: u64,
    /// Starts seen from the poller's start on.
    pub starts: usize,
    pub max_in_1s: usize,
    pub max_in_10s: usize,
    /// The least time between two consecutive starts.
    pub min_spacing_ms: Option<u64>,
    /// Starts per second from the first seen to the last.
    pub achieved_per_s: Option<f64>,
}

impl StartRate {
    /// At most rate x window + 1 starts in any 1 s and 10 s window, never two closer than the
    /// spacing.
    pub fn ok(&self) -> bool {
        self.max_in_1s as f64 <= self.bound(1.0)
            && self.max_in_10s as f64 <= self.bound(10.0)
            && self.min_spacing_ms.is_none_or(|s| s >= self.spacing_ms)
    }

    /// The most starts the rate allows in any window of `seconds` (clocks agree here: one host).
    pub fn bound(&self, seconds: f64) -> f64 {
        self.rate_per_s * seconds + 1.0
    }

    /// From the starts seen (sorted or not).
    pub fn of(rate_per_s: f64, spacing_ms: u64, starts: &[u64]) -> Self {
        let mut starts = starts.to_vec();
        starts.sort_unstable();
        let achieved_per_s = match (starts.first(), starts.last()) {
            (Some(a), Some(b)) if b > a => {
                Some((starts.len() - 1) as f64 * 1000.0 / (b - a) as f64)
            }
            _ => None,
        };
        Self {
            rate_per_s,
            spacing_ms,
            starts: starts.len(),
            max_in_1s: most_in_window(&starts, 1_000),
            max_in_10s: most_in_window(&starts, 10_000),
            min_spacing_ms: least_spacing(&starts),
            achieved_per_s,
        }
    }
}

/// The most of `starts` (sorted start times, epoch ms) in any window of `window_ms`:
/// `[t, t + window_ms)`. The start-rate check of the tests, the local run and the bench.
pub fn most_in_window(starts: &[u64], window_ms: u64) -> usize {
    let mut most = 0;
    let mut first = 0;
    for (last, &t) in starts.iter().enumerate() {
        while starts[first] + window_ms <= t {
            first += 1;
        }
        most = most.max(last + 1 - first);
    }
    most
}

/// The least gap between consecutive `starts` (sorted).
pub fn least_spacing(starts: &[u64]) -> Option<u64> {
    starts.windows(2).map(|w| w[1] - w[0]).min()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn n(v: &str) -> AttributeValue {
        AttributeValue::N(v.to_owned())
    }

    /// The stored number of a holding of `weight` taken under `token` at `at_ms`.
    fn packed(weight: u128, token: u128, at_ms: u128) -> String {
        ((weight - 1) * WEIGHT_SPAN + token * TIME_SPAN + at_ms).to_string()
    }

    /// An item of format 7 at `version` with `holders` (key, packed number) and `used`, no
    /// lease; `held_bytes` as the product counts it.
    fn ours(version: u128, holders: &[(&str, &str)], used: &str) -> RawRecord {
        let entries: usize = holders.iter().map(|(k, _)| k.len() + 18).sum();
        HashMap::from([
            ("lock".to_owned(), AttributeValue::S("l".to_owned())),
            ("format".to_owned(), n("7")),
            ("leases".to_owned(), AttributeValue::M(HashMap::new())),
            ("version".to_owned(), n(&(version * TIME_SPAN).to_string())),
            ("used".to_owned(), n(used)),
            ("held_bytes".to_owned(), n(&entries.to_string())),
            (
                "holders".to_owned(),
                AttributeValue::M(
                    holders
                        .iter()
                        .map(|(k, v)| ((*k).to_owned(), n(v)))
                        .collect(),
                ),
            ),
        ])
    }

    #[test]
    fn reads_the_holders_and_checks_their_tokens_against_the_version() {
        let item = ours(
            7,
            &[
                ("arn:x:run-1#a-1", &packed(1, 3, 1767225600000)),
                ("arn:x:run-2#a-9", &packed(1, 7, 1767225600001)),
            ],
            "2",
        );
        let seen = decode(&item);
        let mut holders = seen.holder_executions();
        holders.sort();
        assert_eq!(holders, ["arn:x:run-1", "arn:x:run-2"]);
        assert_eq!(seen.problem(None), None);
        // A token the version has not reached yet, and two holders with one token.
        let ahead = ours(7, &[("a#1", &packed(1, 8, 1767225600000))], "1");
        assert!(decode(&ahead).problem(None).unwrap().contains("token 8"));
        let shared = ours(
            7,
            &[("a#1", &packed(1, 5, 0)), ("b#1", &packed(1, 5, 1))],
            "2",
        );
        assert!(decode(&shared)
            .problem(None)
            .unwrap()
            .contains("share token 5"));
        // An item without a format.
        let mut old = ours(7, &[], "0");
        old.remove("format");
        assert!(decode(&old)
            .problem(None)
            .unwrap()
            .contains("neither 7 nor 8"));
        // A stored version that is not a whole number of versions.
        let mut odd_version = ours(7, &[], "0");
        odd_version.insert("version".to_owned(), n("70000000000001"));
        assert!(decode(&odd_version).malformed[0].contains("not a whole number of versions"));
        let mut no_leases = ours(7, &[], "0");
        no_leases.remove("leases");
        assert_eq!(decode(&no_leases).malformed, ["leases is missing"]);
        // A lease of someone who holds no slot.
        let mut orphan = ours(7, &[("a#1", &packed(1, 5, 0))], "1");
        orphan.insert(
            "leases".to_owned(),
            AttributeValue::M(HashMap::from([("b#1".to_owned(), n("9"))])),
        );
        assert!(decode(&orphan)
            .problem(None)
            .unwrap()
            .contains("a lease of b#1, which holds no slot"));
        old.remove("held_bytes");
        assert_eq!(decode(&old).malformed, ["held_bytes is missing"]);
        // A holder that is not a number still counts as a holder.
        let odd = ours(7, &[("a#1", &packed(1, 5, 0))], "1");
        let mut odd = odd;
        odd.insert(
            "holders".to_owned(),
            AttributeValue::M(HashMap::from([(
                "a#1".to_owned(),
                AttributeValue::S("x".to_owned()),
            )])),
        );
        let seen = decode(&odd);
        assert_eq!(seen.holder_executions(), ["a"]);
        assert!(seen.problem(None).unwrap().contains("not a number"));
    }

    fn holding(slot: &str, fields: &[(&str, &str)]) -> RawRecord {
        let mut record = HashMap::from([
            ("lock".to_owned(), AttributeValue::S("l".to_owned())),
            ("slot".to_owned(), AttributeValue::S(slot.to_owned())),
        ]);
        for (name, value) in fields {
            let value = if *name == "state" {
                AttributeValue::S((*value).to_owned())
            } else {
                n(value)
            };
            record.insert((*name).to_owned(), value);
        }
        record
    }

    #[test]
    fn reads_a_gates_holders_from_its_holding_items_and_checks_its_sums_on_a_snapshot() {
        let mut gate = ours(9, &[], "3");
        gate.insert("format".to_owned(), n("8"));
        gate.insert("held_bytes".to_owned(), n("0"));
        gate.insert("holdings".to_owned(), n("2"));
        let held = |slot: &str, token: &str, weight: &str| {
            let fields = [
                ("state", "held"),
                ("token", token),
                ("weight", weight),
                ("acquired_at", "1767225600000"),
            ];
            holding(slot, &fields)
        };
        let tombstone = holding(
            "arn:x:run-3#a",
            &[("state", "released"), ("released_at", "1767225601000")],
        );
        let holdings = [
            held("arn:x:run-1#a", "4", "2"),
            held("arn:x:run-2#a", "7", "1"),
            tombstone.clone(),
        ];
        let seen = decode_gate(&gate, &holdings, true);
        let mut holders = seen.holder_executions();
        holders.sort();
        assert_eq!(holders, ["arn:x:run-1", "arn:x:run-2"]);
        assert_eq!((seen.weight_held(), seen.tombstones), (3, 1));
        assert_eq!(seen.problem(Some(3)), None);
        assert!(seen.problem(Some(2)).unwrap().contains("above the limit 2"));
        // One holding more than the gate counts: caught on a snapshot, not across a write.
        let extra = [holdings.to_vec(), vec![held("arn:x:run-4#a", "8", "1")]].concat();
        assert!(decode_gate(&gate, &extra, true)
            .problem(None)
            .unwrap()
            .contains("the gate counts 2 holdings, and 3 are held"));
        assert_eq!(decode_gate(&gate, &extra, false).problem(Some(4)), None);
        // S1 whatever the snapshot: the holdings' own weights above the limit.
        assert!(decode_gate(&gate, &extra, false)
            .problem(Some(3))
            .unwrap()
            .contains("above the limit 3"));
        // Tokens against the version, as in the item layout.
        let ahead = [held("arn:x:run-1#a", "10", "3")];
        gate.insert("holdings".to_owned(), n("1"));
        assert!(decode_gate(&gate, &ahead, true)
            .problem(None)
            .unwrap()
            .contains("token 10"));
        let odd = [holding("arn:x:run-5#a", &[("state", "held")])];
        assert!(!decode_gate(&gate, &odd, true).malformed.is_empty());
    }

    #[test]
    fn reads_weights_and_starts_and_checks_used_held_bytes_and_the_limit() {
        // Weight 4 (3 leads) taken at 1767225600000, weight 1 at 1767225600500.
        let mut item = ours(
            9,
            &[
                ("arn:x:run-1#a", &packed(4, 3, 1767225600000)),
                ("arn:x:run-2#a", &packed(1, 9, 1767225600500)),
            ],
            "5",
        );
        item.insert("started_at".to_owned(), n("1767225600500"));
        item.insert("spacing_ms".to_owned(), n("500"));
        let seen = decode(&item);
        assert_eq!((seen.weight_held(), seen.problem(Some(5))), (5, None));
        let mut starts = seen.starts();
        starts.sort_unstable();
        assert_eq!(starts, [1767225600000, 1767225600500, 1767225600500]);
        assert_eq!(seen.spacing_ms, Some(500));
        // Above the limit, and stored sums that are not the holders'.
        assert!(seen.problem(Some(4)).unwrap().contains("above the limit 4"));
        let mut wrong = item.clone();
        wrong.insert("used".to_owned(), n("4"));
        assert!(decode(&wrong).problem(Some(5)).unwrap().contains("used 4"));
        let mut wrong = item.clone();
        wrong.insert("held_bytes".to_owned(), n("1"));
        assert!(decode(&wrong)
            .problem(Some(5))
            .unwrap()
            .contains("held_bytes 1"));
        item.remove("used");
        assert!(decode(&item).problem(None).is_some());
    }

    #[test]
    fn starts_are_counted_per_window_and_spaced() {
        let starts = [0, 500, 1_000, 1_499, 2_600, 12_000];
        assert_eq!(most_in_window(&starts, 1_000), 3);
        assert_eq!(most_in_window(&starts, 10_000), 5);
        assert_eq!(most_in_window(&[], 1_000), 0);
        assert_eq!(least_spacing(&starts), Some(499));
        assert_eq!(least_spacing(&[7]), None);
    }
}
