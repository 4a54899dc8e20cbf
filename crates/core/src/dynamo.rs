//! The DynamoDB rendering of the protocol: one item per lock, written whole with `PutItem`
//! conditioned on the version that was read.
//!
//! Writing the whole item keeps every transition in one place (`protocol`), makes the only
//! condition ever sent `version = :read` (or "no item yet"), and costs O(limit + live fences)
//! write units, which is what the item size is bounded by anyway.

use std::collections::{BTreeMap, HashMap};

use aws_sdk_dynamodb::client::Waiters;
use aws_sdk_dynamodb::error::{DisplayErrorContext, SdkError};
use aws_sdk_dynamodb::operation::create_table::CreateTableError;
use aws_sdk_dynamodb::operation::put_item::PutItemError;
use aws_sdk_dynamodb::primitives::Blob;
use aws_sdk_dynamodb::types::{
    AttributeDefinition, AttributeValue, BillingMode, KeySchemaElement, KeyType,
    ReturnValuesOnConditionCheckFailure, ScalarAttributeType,
};
use aws_sdk_dynamodb::Client;

use crate::error::StoreError;
use crate::input::{Limit, LockName};
use crate::item::{FenceKey, FencingToken, Holding, Identity, SemaphoreItem, Version};
use crate::store::{ItemStore, PutResult};

/// Attribute names of the semaphore item. `lock` is the table's only key; the template's table
/// and `semctl init` declare exactly this schema.
pub mod attr {
    pub const LOCK: &str = "lock";
    pub const LIMIT: &str = "limit";
    pub const COUNT: &str = "count";
    pub const VERSION: &str = "version";
    pub const HOLDERS: &str = "holders";
    pub const FENCES: &str = "fences";
    pub const TOKEN: &str = "token";
    pub const ACQUIRED_AT: &str = "acquired_at";
}

#[derive(Debug, Clone)]
pub struct DynamoStore {
    client: Client,
    table: String,
}

/// What `create_table` found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TableSetup {
    Created,
    AlreadyExisted,
}

impl DynamoStore {
    pub fn new(client: Client, table: impl Into<String>) -> Self {
        Self {
            client,
            table: table.into(),
        }
    }

    pub fn table(&self) -> &str {
        &self.table
    }

    pub fn client(&self) -> &Client {
        &self.client
    }

    /// Creates the table (on-demand, partition key `lock`) unless it exists.
    pub async fn create_table(&self) -> Result<TableSetup, StoreError> {
        let definition = AttributeDefinition::builder()
            .attribute_name(attr::LOCK)
            .attribute_type(ScalarAttributeType::S)
            .build()
            .map_err(|e| self.failed("CreateTable", e))?;
        let key = KeySchemaElement::builder()
            .attribute_name(attr::LOCK)
            .key_type(KeyType::Hash)
            .build()
            .map_err(|e| self.failed("CreateTable", e))?;
        let created = self
            .client
            .create_table()
            .table_name(&self.table)
            .attribute_definitions(definition)
            .key_schema(key)
            .billing_mode(BillingMode::PayPerRequest)
            .send()
            .await;
        match created {
            Ok(_) => {}
            Err(SdkError::ServiceError(e))
                if matches!(e.err(), CreateTableError::ResourceInUseException(_)) =>
            {
                return Ok(TableSetup::AlreadyExisted)
            }
            Err(e) => return Err(self.failed("CreateTable", DisplayErrorContext(e))),
        }
        self.client
            .wait_until_table_exists()
            .table_name(&self.table)
            .wait(std::time::Duration::from_secs(120))
            .await
            .map_err(|e| self.failed("DescribeTable", DisplayErrorContext(e)))?;
        Ok(TableSetup::Created)
    }

    fn failed(&self, operation: &'static str, e: impl std::fmt::Display) -> StoreError {
        let message = e.to_string();
        if message.contains("ResourceNotFoundException") {
            return StoreError::TableNotFound {
                table: self.table.clone(),
            };
        }
        StoreError::Dynamo {
            operation,
            table: self.table.clone(),
            message,
        }
    }
}

impl ItemStore for DynamoStore {
    async fn load(&self, lock: &LockName) -> Result<Option<SemaphoreItem>, StoreError> {
        let out = self
            .client
            .get_item()
            .table_name(&self.table)
            .key(attr::LOCK, AttributeValue::S(lock.as_str().to_owned()))
            // A stale read would only cost a failed conditional write; reading consistently
            // avoids paying for it.
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| self.failed("GetItem", DisplayErrorContext(e)))?;
        out.item().map(decode).transpose()
    }

    async fn put(
        &self,
        item: &SemaphoreItem,
        expected: Option<Version>,
    ) -> Result<PutResult, StoreError> {
        let request = self
            .client
            .put_item()
            .table_name(&self.table)
            .set_item(Some(encode(item)))
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld);
        let request = match expected {
            None => request
                .condition_expression("attribute_not_exists(#lock)")
                .expression_attribute_names("#lock", attr::LOCK),
            Some(version) => request
                .condition_expression("#version = :read")
                .expression_attribute_names("#version", attr::VERSION)
                .expression_attribute_values(":read", number(version.0)),
        };
        match request.send().await {
            Ok(_) => Ok(PutResult::Written),
            Err(SdkError::ServiceError(e)) => match e.into_err() {
                // The failed write hands back the item as it is now, so the retry needs no
                // second read.
                PutItemError::ConditionalCheckFailedException(failed) => {
                    Ok(PutResult::Conflict(failed.item().map(decode).transpose()?))
                }
                other => Err(self.failed("PutItem", DisplayErrorContext(other))),
            },
            Err(e) => Err(self.failed("PutItem", DisplayErrorContext(e))),
        }
    }

    async fn list(&self) -> Result<Vec<SemaphoreItem>, StoreError> {
        let mut items = Vec::new();
        let mut start = None;
        loop {
            let page = self
                .client
                .scan()
                .table_name(&self.table)
                .consistent_read(true)
                .set_exclusive_start_key(start)
                .send()
                .await
                .map_err(|e| self.failed("Scan", DisplayErrorContext(e)))?;
            for raw in page.items() {
                items.push(decode(raw)?);
            }
            match page.last_evaluated_key() {
                Some(key) if !key.is_empty() => start = Some(key.clone()),
                _ => return Ok(items),
            }
        }
    }
}

fn number(n: impl ToString) -> AttributeValue {
    AttributeValue::N(n.to_string())
}

fn string(s: &str) -> AttributeValue {
    AttributeValue::S(s.to_owned())
}

/// The DynamoDB attributes of an item.
pub fn encode(item: &SemaphoreItem) -> HashMap<String, AttributeValue> {
    let holders = item
        .holders
        .iter()
        .map(|(identity, holding)| {
            // Who holds it is the entry's key; repeating it in the value would double the
            // bytes every write pays for per holder.
            let entry = HashMap::from([
                (attr::TOKEN.to_owned(), number(holding.token.0)),
                (attr::ACQUIRED_AT.to_owned(), number(holding.acquired_at_ms)),
            ]);
            (identity.slot_key(), AttributeValue::M(entry))
        })
        .collect();
    let fences = encode_fences(&item.fences);
    let mut attrs = HashMap::from([
        (attr::LOCK.to_owned(), string(item.lock.as_str())),
        (attr::VERSION.to_owned(), number(item.version.0)),
        (attr::COUNT.to_owned(), number(item.count())),
        (attr::HOLDERS.to_owned(), AttributeValue::M(holders)),
        (
            attr::FENCES.to_owned(),
            AttributeValue::B(Blob::new(fences)),
        ),
    ]);
    if let Some(limit) = item.limit {
        attrs.insert(attr::LIMIT.to_owned(), number(limit.get()));
    }
    attrs
}

/// Reads an item back, checking that it is one of ours and that its stored count matches its
/// holders.
pub fn decode(attrs: &HashMap<String, AttributeValue>) -> Result<SemaphoreItem, StoreError> {
    let lock_name = attrs
        .get(attr::LOCK)
        .and_then(|v| v.as_s().ok())
        .cloned()
        .unwrap_or_default();
    let corrupt = |problem: String| StoreError::CorruptItem {
        lock: lock_name.clone(),
        problem,
    };
    let lock = LockName::new(lock_name.clone()).map_err(|e| corrupt(e.to_string()))?;
    let version = Version(get_number(attrs, attr::VERSION).map_err(&corrupt)?);
    let count = get_number(attrs, attr::COUNT).map_err(&corrupt)?;
    let limit = match attrs.get(attr::LIMIT) {
        None => None,
        Some(_) => {
            let n = get_number(attrs, attr::LIMIT).map_err(&corrupt)?;
            Some(
                i64::try_from(n)
                    .map_err(|e| e.to_string())
                    .and_then(|n| Limit::new(n).map_err(|e| e.to_string()))
                    .map_err(&corrupt)?,
            )
        }
    };
    let mut holders = BTreeMap::new();
    for (key, value) in get_map(attrs, attr::HOLDERS).map_err(&corrupt)? {
        let entry = value
            .as_m()
            .map_err(|_| corrupt(format!("holder {key:?} is not a map")))?;
        let identity = Identity::from_slot_key(key)
            .map_err(|problem| corrupt(format!("holder key {key:?}: {problem}")))?;
        let holding = Holding {
            token: FencingToken(get_number(entry, attr::TOKEN).map_err(&corrupt)?),
            acquired_at_ms: get_number(entry, attr::ACQUIRED_AT).map_err(&corrupt)?,
        };
        holders.insert(identity, holding);
    }
    let fences = attrs
        .get(attr::FENCES)
        .and_then(|v| v.as_b().ok())
        .ok_or_else(|| {
            corrupt(format!(
                "attribute {} is missing or not binary",
                attr::FENCES
            ))
        })
        .and_then(|blob| decode_fences(blob.as_ref()).map_err(&corrupt))?;
    if count != holders.len() as u64 {
        return Err(corrupt(format!(
            "count is {count} but {} holders are listed",
            holders.len()
        )));
    }
    Ok(SemaphoreItem {
        lock,
        limit,
        version,
        holders,
        fences,
    })
}

/// Bytes of one stored fence: its key, then its expiry in seconds since the epoch (big-endian
/// `u32`, enough until 2106).
pub const FENCE_RECORD_LEN: usize = FenceKey::LEN + 4;

/// Fences as one binary attribute of fixed-size records. Fences are most of a busy lock's item
/// (rate x window of them), and every write pays for the whole item, so they are stored in
/// 12 bytes each: a map of hex keys to millisecond numbers took about 33.
fn encode_fences(fences: &BTreeMap<FenceKey, u64>) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(fences.len() * FENCE_RECORD_LEN);
    for (key, &expires_ms) in fences {
        // Expiries are whole seconds (`protocol`); rounding up keeps any other value safe, and
        // one past 2106 is stored as the largest, i.e. kept longer, never shorter.
        let seconds = u32::try_from(expires_ms.div_ceil(1_000)).unwrap_or(u32::MAX);
        bytes.extend_from_slice(key.as_bytes());
        bytes.extend_from_slice(&seconds.to_be_bytes());
    }
    bytes
}

fn decode_fences(bytes: &[u8]) -> Result<BTreeMap<FenceKey, u64>, String> {
    if !bytes.len().is_multiple_of(FENCE_RECORD_LEN) {
        return Err(format!(
            "attribute {} holds {} bytes, not a whole number of {FENCE_RECORD_LEN}-byte fences",
            attr::FENCES,
            bytes.len()
        ));
    }
    Ok(bytes
        .chunks_exact(FENCE_RECORD_LEN)
        .map(|record| {
            let (key, seconds) = record.split_at(FenceKey::LEN);
            let key: [u8; FenceKey::LEN] = key.try_into().unwrap_or_default();
            let seconds: [u8; 4] = seconds.try_into().unwrap_or_default();
            (
                FenceKey::from_bytes(key),
                u64::from(u32::from_be_bytes(seconds)) * 1_000,
            )
        })
        .collect())
}

/// The size DynamoDB bills for a value: strings their UTF-8 bytes; numbers 1 byte per two
/// significant digits plus 1; a map 3 bytes plus, per element, its name, its value and 1 byte
/// ("DynamoDB item sizes and formats", Amazon DynamoDB Developer Guide).
fn value_size(value: &AttributeValue) -> usize {
    match value {
        AttributeValue::S(s) => s.len(),
        AttributeValue::N(n) => number_size(n),
        AttributeValue::M(m) => {
            3 + m
                .iter()
                .map(|(k, v)| k.len() + value_size(v) + 1)
                .sum::<usize>()
        }
        AttributeValue::L(l) => 3 + l.iter().map(|v| value_size(v) + 1).sum::<usize>(),
        AttributeValue::Bool(_) | AttributeValue::Null(_) => 1,
        AttributeValue::B(b) => b.as_ref().len(),
        _ => 1,
    }
}

fn number_size(n: &str) -> usize {
    // "Leading and trailing zeroes are trimmed."
    let digits: String = n.chars().filter(|c| c.is_ascii_digit()).collect();
    let significant = digits
        .trim_start_matches('0')
        .trim_end_matches('0')
        .len()
        .max(1);
    significant.div_ceil(2) + 1
}

/// An item's size: attribute names plus values.
pub fn item_size(attrs: &HashMap<String, AttributeValue>) -> usize {
    attrs.iter().map(|(k, v)| k.len() + value_size(v)).sum()
}

/// The size `item` takes in the table: what every write of its lock pays for.
pub fn stored_size(item: &SemaphoreItem) -> usize {
    item_size(&encode(item))
}

/// Write units one standard write of an item of `bytes` costs: one per started KB.
pub fn write_units(bytes: usize) -> usize {
    bytes.div_ceil(1024).max(1)
}

/// Read units one strongly consistent read of an item of `bytes` costs: one per started 4 KB.
pub fn read_units(bytes: usize) -> usize {
    bytes.div_ceil(4096).max(1)
}

fn get_number(attrs: &HashMap<String, AttributeValue>, name: &str) -> Result<u64, String> {
    attrs
        .get(name)
        .and_then(|v| v.as_n().ok())
        .and_then(|n| n.parse().ok())
        .ok_or_else(|| format!("attribute {name} is missing or not a whole number"))
}

fn get_map<'a>(
    attrs: &'a HashMap<String, AttributeValue>,
    name: &str,
) -> Result<&'a HashMap<String, AttributeValue>, String> {
    attrs
        .get(name)
        .and_then(|v| v.as_m().ok())
        .ok_or_else(|| format!("attribute {name} is missing or not a map"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::input::{AcquisitionId, HolderId};

    #[test]
    fn an_item_survives_encoding() {
        let mut item = SemaphoreItem::empty(LockName::new("l").unwrap());
        item.version = Version(7);
        item.limit = Some(Limit::new(3).unwrap());
        let id = Identity::new(
            HolderId::new("arn:aws:states:us-east-1:1:execution:m:e#1").unwrap(),
            AcquisitionId::new("u-1").unwrap(),
        );
        item.holders.insert(
            id.clone(),
            Holding {
                token: FencingToken(6),
                acquired_at_ms: 1_700_000_000_000,
            },
        );
        item.fences
            .insert(FenceKey::acquisition(&id), 1_700_000_300_000);
        item.fences
            .insert(FenceKey::execution(&id.holder), 1_700_000_301_000);
        assert_eq!(decode(&encode(&item)).unwrap(), item);
    }

    #[test]
    fn a_fence_is_twelve_bytes_and_its_expiry_never_shortens() {
        let mut fences = BTreeMap::new();
        let key = FenceKey::execution(&HolderId::new("exec-1").unwrap());
        fences.insert(key, 1_700_000_000_001);
        let bytes = encode_fences(&fences);
        assert_eq!(bytes.len(), FENCE_RECORD_LEN);
        assert_eq!(&bytes[..8], key.as_bytes());
        // A millisecond past a second is kept to the end of that second.
        assert_eq!(decode_fences(&bytes).unwrap()[&key], 1_700_000_001_000);
        let err = decode_fences(&bytes[..11]).unwrap_err();
        assert!(
            err.contains("not a whole number of 12-byte fences"),
            "{err}"
        );
    }

    #[test]
    fn a_holder_entry_does_not_repeat_its_key() {
        let mut item = SemaphoreItem::empty(LockName::new("l").unwrap());
        let id = Identity::new(
            HolderId::new("exec-1").unwrap(),
            AcquisitionId::new("a-1").unwrap(),
        );
        item.holders.insert(
            id.clone(),
            Holding {
                token: FencingToken(1),
                acquired_at_ms: 5,
            },
        );
        let attrs = encode(&item);
        let entry = attrs[attr::HOLDERS].as_m().unwrap()[&id.slot_key()]
            .as_m()
            .unwrap();
        let mut names: Vec<&str> = entry.keys().map(String::as_str).collect();
        names.sort_unstable();
        assert_eq!(names, [attr::ACQUIRED_AT, attr::TOKEN]);
    }

    #[test]
    fn sizes_follow_the_documented_rules() {
        assert_eq!(number_size("5"), 2);
        assert_eq!(number_size("1767225612345"), 8);
        assert_eq!(number_size("1767225600000"), 5);
        assert_eq!(number_size("100"), 2);
        assert_eq!(
            value_size(&AttributeValue::M(HashMap::from([(
                "ab".to_owned(),
                AttributeValue::S("xyz".to_owned())
            )]))),
            3 + 2 + 3 + 1
        );
        assert_eq!(value_size(&AttributeValue::B(Blob::new(vec![0; 24]))), 24);
    }

    #[test]
    fn units_round_up_per_started_kilobyte() {
        assert_eq!(write_units(0), 1);
        assert_eq!(write_units(1024), 1);
        assert_eq!(write_units(1025), 2);
        assert_eq!(read_units(4096), 1);
        assert_eq!(read_units(4097), 2);
    }

    #[test]
    fn a_count_that_disagrees_with_the_holders_is_reported() {
        let item = SemaphoreItem::empty(LockName::new("l").unwrap());
        let mut attrs = encode(&item);
        attrs.insert(attr::COUNT.to_owned(), number(1));
        let err = decode(&attrs).unwrap_err();
        assert!(
            err.to_string().contains("count is 1 but 0 holders"),
            "{err}"
        );
    }
}
