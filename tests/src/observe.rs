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
}

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
    Some(Observed {
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
    /// S1 on one stored state: no more holders than the limit. (No count is stored: the acquire's
    /// condition counts the holder map itself, `size(holders)`.)
    pub fn assert_safe(&self, limit: usize) {
        assert!(
            self.holders.len() <= limit,
            "{} holders with limit {limit}: {self:?}",
            self.holders.len()
        );
    }
}
