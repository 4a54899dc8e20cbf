//! Lock items in a format this version does not write, put raw, so that the tests can show every
//! entry point refuses them by name (`StoreError::UnknownFormat`, `SemaphoreUnknownFormat`) and
//! leaves them exactly as they are.

use std::collections::HashMap;

use aws_sdk_dynamodb::types::AttributeValue;
use aws_sdk_dynamodb::Client;
use semaphore_core::dynamo::{attr, encode};
use semaphore_core::{
    AcquisitionId, FencingToken, HolderId, Holding, Identity, Limit, LockName, SemaphoreItem,
    Version, Weight,
};

/// A format no version of this semaphore writes.
pub const FOREIGN_FORMAT: u64 = 99;

/// Puts, for `lock`, the item this version writes when `holder` (acquisition `acquisition`) holds
/// one slot of 5, but with `format` as its format (`None`: no format attribute). Returns the
/// attributes as put, to compare the item with afterwards.
pub async fn put_foreign_item(
    client: &Client,
    table: &str,
    lock: &str,
    holder: &str,
    acquisition: &str,
    format: Option<u64>,
) -> HashMap<String, AttributeValue> {
    let identity = Identity::new(
        HolderId::new(holder).expect("a holder id"),
        AcquisitionId::new(acquisition).expect("an acquisition id"),
    );
    let mut item = SemaphoreItem::empty(LockName::new(lock).expect("a lock name"));
    item.version = Version(3);
    item.limit = Some(Limit::new(5).expect("a limit"));
    item.used = 1;
    item.held_bytes = identity.held_bytes();
    item.holders.insert(
        identity,
        Holding {
            token: FencingToken(3),
            acquired_at_ms: 1_700_000_000_000,
            weight: Weight::ONE,
        },
    );
    let mut attrs = encode(&item);
    match format {
        Some(format) => attrs.insert(
            attr::FORMAT.to_owned(),
            AttributeValue::N(format.to_string()),
        ),
        None => attrs.remove(attr::FORMAT),
    };
    client
        .put_item()
        .table_name(table)
        .set_item(Some(attrs.clone()))
        .send()
        .await
        .expect("put the item of a foreign format");
    attrs
}
