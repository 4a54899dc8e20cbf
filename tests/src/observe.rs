//! An independent view of the table: raw `GetItem`, checked without the product's decoder, so
//! an invariant check cannot share a bug with the code it checks.

use std::collections::HashMap;

use aws_sdk_dynamodb::types::AttributeValue;
use aws_sdk_dynamodb::Client;
use semaphore_core::dynamo::item_size;

/// What the raw item says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Observed {
    pub count: i64,
    pub holders: Vec<String>,
    pub version: i64,
    pub fences: usize,
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
    // Fences are one binary attribute of 12-byte records (key, expiry).
    let fences = item
        .get("fences")
        .and_then(|v| v.as_b().ok())
        .map_or(0, |b| b.as_ref().len() / 12);
    let map_keys = |name: &str| -> Vec<String> {
        item.get(name)
            .and_then(|v| v.as_m().ok())
            .map(|m| m.keys().cloned().collect())
            .unwrap_or_default()
    };
    Some(Observed {
        count: number("count"),
        holders: map_keys("holders"),
        version: number("version"),
        fences,
        approx_bytes: item_size(&item),
    })
}

impl Observed {
    /// S1 on one stored state: the count equals the number of holders and is within the limit.
    pub fn assert_safe(&self, limit: i64) {
        assert_eq!(
            self.count,
            self.holders.len() as i64,
            "stored count disagrees with holders: {self:?}"
        );
        assert!(
            (0..=limit).contains(&self.count),
            "count {} outside 0..={limit}: {self:?}",
            self.count
        );
    }
}
