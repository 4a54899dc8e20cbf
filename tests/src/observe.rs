//! An independent view of the table: raw `GetItem`, checked without the product's decoder, so
//! an invariant check cannot share a bug with the code it checks.

use std::collections::HashMap;

use aws_sdk_dynamodb::types::AttributeValue;
use aws_sdk_dynamodb::Client;
use semaphore_core::dynamo::item_size;

/// An item of a table as `GetItem` or `Query` hands it back.
pub type RawRecord = HashMap<String, AttributeValue>;

/// What the raw item says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Observed {
    pub holders: Vec<String>,
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
    /// acquisition time and token, plus one.
    pub weights: Vec<u64>,
    /// When the last acquisition landed (`started_at`, epoch ms), if any did.
    pub started_at: Option<u64>,
    /// The stored bytes of the holder map's entries (`held_bytes`).
    pub held_bytes: i64,
}

/// What `held_bytes` counts per holder besides its key: its number at its largest (31 digits,
/// 17 bytes as DynamoDB sizes numbers) and 1 byte per map element.
const HELD_BYTES_PER_ENTRY: usize = 17 + 1;

/// A stored holding's number is `(weight - 1) * 10^28 + acquired_at_ms * 10^15 + token`.
const WEIGHT_DIGITS: u32 = 28;

pub async fn raw_item(
    client: &Client,
    table: &str,
    lock: &str,
) -> Option<HashMap<String, AttributeValue>> {
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

pub async fn observe(client: &Client, table: &str, lock: &str) -> Option<Observed> {
    let item = raw_item(client, table, lock).await?;
    let number = |name: &str| -> i64 {
        item.get(name)
            .and_then(|v| v.as_n().ok())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("attribute {name} missing or not a number: {item:?}"))
    };
    // Fences are two binary sets of 8-byte keys (the young and the old generation).
    let fences = ["young", "old"]
        .iter()
        .filter_map(|name| item.get(*name).and_then(|v| v.as_bs().ok()))
        .map(Vec::len)
        .sum();
    let map_keys = |name: &str| -> Vec<String> {
        item.get(name)
            .and_then(|v| v.as_m().ok())
            .map(|m| m.keys().cloned().collect())
            .unwrap_or_default()
    };
    let weights = item
        .get("holders")
        .and_then(|v| v.as_m().ok())
        .map(|m| {
            m.values()
                .map(|v| {
                    let packed: u128 = v
                        .as_n()
                        .ok()
                        .and_then(|n| n.parse().ok())
                        .unwrap_or_else(|| panic!("a holder is not a number: {item:?}"));
                    u64::try_from(packed / 10u128.pow(WEIGHT_DIGITS)).expect("a weight") + 1
                })
                .collect()
        })
        .unwrap_or_default();
    Some(Observed {
        used: number("used"),
        held_bytes: number("held_bytes"),
        weights,
        started_at: item
            .get("started_at")
            .map(|v| v.as_n().ok().and_then(|n| n.parse().ok()))
            .map(|at| at.unwrap_or_else(|| panic!("started_at is not a number: {item:?}"))),
        holders: map_keys("holders"),
        version: number("version"),
        fences,
        rotated_at: item
            .get("rotated_at")
            .map(|v| v.as_n().ok().and_then(|n| n.parse().ok()))
            .map(|at| at.unwrap_or_else(|| panic!("rotated_at is not a number: {item:?}"))),
        approx_bytes: item_size(&item),
        waiting: item
            .get("waiting")
            .map(|v| v.as_n().ok().and_then(|n| n.parse().ok()))
            .map_or(0, |n| {
                n.unwrap_or_else(|| panic!("waiting is not a number: {item:?}"))
            }),
    })
}

/// The records of `lock`'s line in the waiters' table (`queue_table`), raw, in line order
/// (their sort key, `place`).
pub async fn raw_line(client: &Client, queue_table: &str, lock: &str) -> Vec<RawRecord> {
    let mut records = Vec::new();
    let mut start = None;
    loop {
        let page = client
            .query()
            .table_name(queue_table)
            .key_condition_expression("#lock = :lock")
            .expression_attribute_names("#lock", "lock")
            .expression_attribute_values(":lock", AttributeValue::S(lock.to_owned()))
            .consistent_read(true)
            .set_exclusive_start_key(start)
            .send()
            .await
            .expect("Query the waiters' table");
        records.extend(page.items.unwrap_or_default());
        start = page.last_evaluated_key;
        if start.is_none() {
            return records;
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

    /// S1 on this read: the stored `used` is the sum of the holders' weights, and that sum is
    /// within `limit` (with weight 1 everywhere: at most `limit` holders).
    pub fn assert_safe(&self, limit: usize) {
        assert_eq!(
            self.used,
            i64::try_from(self.weight_held()).expect("a sum of weights"),
            "stored used differs from the holders' weights: {self:?}"
        );
        let entries: usize = self
            .holders
            .iter()
            .map(|key| key.len() + HELD_BYTES_PER_ENTRY)
            .sum();
        assert_eq!(
            self.held_bytes,
            i64::try_from(entries).expect("a size"),
            "stored held_bytes differs from the holders' entries: {self:?}"
        );
        assert!(
            self.weight_held() <= limit as u64,
            "weight {} held with limit {limit}: {self:?}",
            self.weight_held()
        );
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
