//! An independent view of the table: raw `GetItem`, checked without the product's decoder, so
//! an invariant check cannot share a bug with the code it checks.

use std::collections::HashMap;

use aws_sdk_dynamodb::types::AttributeValue;
use aws_sdk_dynamodb::Client;
use semaphore_core::dynamo::item_size;

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
    })
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
