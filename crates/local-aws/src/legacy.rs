//! Items as version 1 of the semaphore stored them, written raw, so that every entry point can be
//! shown to refuse them by name (`SemaphoreOldFormat`, `StoreError::OldFormat`) and to leave them
//! exactly as they are. Version 2 does not migrate them: nothing was released with version 1.

use std::collections::HashMap;

use aws_sdk_dynamodb::primitives::Blob;
use aws_sdk_dynamodb::types::AttributeValue;
use aws_sdk_dynamodb::Client;

/// Puts, for `lock`, the item version 1 wrote after `holder` (acquisition `acquisition`) took a
/// slot at version 3 and one other acquisition was released: the whole item, with a stored
/// `count`, the holder map of `{token, acquired_at}` maps, and one binary `fences` attribute of
/// 12-byte records (8-byte key, 4-byte expiry in seconds); no `format`. Returns the attributes
/// as put, to compare the item with afterwards.
pub async fn put_version_1_item(
    client: &Client,
    table: &str,
    lock: &str,
    holder: &str,
    acquisition: &str,
) -> HashMap<String, AttributeValue> {
    let n = |v: &str| AttributeValue::N(v.to_owned());
    let holding = HashMap::from([
        ("token".to_owned(), n("3")),
        ("acquired_at".to_owned(), n("1700000000000")),
    ]);
    let mut fence = vec![7u8; 8];
    fence.extend_from_slice(&1_700_000_300u32.to_be_bytes());
    let item = HashMap::from([
        ("lock".to_owned(), AttributeValue::S(lock.to_owned())),
        ("version".to_owned(), n("3")),
        ("count".to_owned(), n("1")),
        ("limit".to_owned(), n("5")),
        (
            "holders".to_owned(),
            AttributeValue::M(HashMap::from([(
                format!("{holder}#{acquisition}"),
                AttributeValue::M(holding),
            )])),
        ),
        ("fences".to_owned(), AttributeValue::B(Blob::new(fence))),
    ]);
    client
        .put_item()
        .table_name(table)
        .set_item(Some(item.clone()))
        .send()
        .await
        .expect("put the version-1 item");
    item
}
