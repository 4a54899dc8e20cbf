//! DynamoDB's JSON wire format, as a proxy in front of the server sees it: the values a request
//! or an answer carries, read back; and the requests `DynamoStore` sends, written out from a
//! [`Write`], so that a proxy's policy can be tested on exactly what the product would send.
//! Binary values travel as standard base64 with padding; the SDK's own codec is used both ways.

use std::collections::HashMap;

use aws_sdk_dynamodb::types::AttributeValue;
use aws_smithy_types::base64;
use semaphore_core::dynamo::{encode, render};
use semaphore_core::{FenceKey, Write};
use serde_json::{json, Map, Value};

/// A number attribute: `{"N": "42"}`.
pub fn number(value: &Value) -> Option<u128> {
    value.get("N")?.as_str()?.parse().ok()
}

/// A fence key as one binary attribute: `{"B": "<base64>"}` (an acquire's condition names each
/// key it must not find this way).
pub fn fence_key(value: &Value) -> Option<FenceKey> {
    decode_key(value.get("B")?)
}

/// The fence keys of a binary set: `{"BS": [...]}` (a fence generation of an item).
pub fn fence_keys(value: &Value) -> Option<Vec<FenceKey>> {
    value
        .get("BS")?
        .as_array()?
        .iter()
        .map(decode_key)
        .collect()
}

fn decode_key(encoded: &Value) -> Option<FenceKey> {
    let bytes = base64::decode(encoded.as_str()?).ok()?;
    Some(FenceKey::from_bytes(bytes.try_into().ok()?))
}

/// An attribute value as the wire carries it (the kinds the semaphore's items use).
pub fn attribute(value: &AttributeValue) -> Value {
    match value {
        AttributeValue::N(n) => json!({ "N": n }),
        AttributeValue::S(s) => json!({ "S": s }),
        AttributeValue::B(b) => json!({ "B": base64::encode(b) }),
        AttributeValue::Bs(set) => {
            json!({ "BS": set.iter().map(base64::encode).collect::<Vec<_>>() })
        }
        AttributeValue::M(m) => json!({ "M": attributes(m) }),
        other => panic!("not used by the semaphore: {other:?}"),
    }
}

/// A map of attributes (an item, or a request's values) as the wire carries it.
pub fn attributes(map: &HashMap<String, AttributeValue>) -> Map<String, Value> {
    map.iter().map(|(k, v)| (k.clone(), attribute(v))).collect()
}

/// The body of the `UpdateItem` the store sends for `write`.
pub fn update_body(write: &Write) -> Vec<u8> {
    let r = render(write).expect("the protocol's writes render");
    let body = json!({
        "TableName": "t",
        "Key": {"lock": {"S": write.lock.as_str()}},
        "ConditionExpression": r.condition,
        "UpdateExpression": r.update,
        "ExpressionAttributeNames": r.names,
        "ExpressionAttributeValues": attributes(&r.values),
        "ReturnValues": "ALL_OLD",
        "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
    });
    serde_json::to_vec(&body).expect("JSON")
}

/// The body of the `PutItem` the store sends when `write` is its lock's first: the item the write
/// makes of the empty lock.
pub fn put_body(write: &Write) -> Vec<u8> {
    let item = write
        .apply(None)
        .expect("the write applies to the empty lock");
    let body = json!({
        "TableName": "t",
        "Item": attributes(&encode(&item)),
        "ConditionExpression": "attribute_not_exists(#lock)",
        "ExpressionAttributeNames": {"#lock": "lock"},
    });
    serde_json::to_vec(&body).expect("JSON")
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use aws_sdk_dynamodb::primitives::Blob;

    use super::*;

    #[test]
    fn binaries_travel_as_standard_base64_with_padding() {
        let binary = |bytes: &[u8]| attribute(&AttributeValue::B(Blob::new(bytes)))["B"].clone();
        assert_eq!(binary(b""), "");
        assert_eq!(binary(b"f"), "Zg==");
        assert_eq!(binary(b"fo"), "Zm8=");
        assert_eq!(binary(b"foo"), "Zm9v");
        assert_eq!(binary(&[0xfb, 0xff, 0xbf, 1, 2, 3, 4, 5]), "+/+/AQIDBAU=");
    }

    #[test]
    fn fence_keys_read_back_as_written() {
        let keys = BTreeSet::from([
            FenceKey::from_bytes([0xfb, 0xff, 0xbf, 1, 2, 3, 4, 5]),
            FenceKey::from_bytes([0; FenceKey::LEN]),
        ]);
        let set = AttributeValue::Bs(keys.iter().map(|k| Blob::new(*k.as_bytes())).collect());
        let read: BTreeSet<_> = fence_keys(&attribute(&set)).unwrap().into_iter().collect();
        assert_eq!(read, keys);
        let one = keys.first().unwrap();
        let binary = AttributeValue::B(Blob::new(*one.as_bytes()));
        assert_eq!(fence_key(&attribute(&binary)), Some(*one));
        // Not a key: the wrong length, or not base64.
        assert_eq!(fence_key(&json!({"B": "Zm9v"})), None);
        assert_eq!(fence_key(&json!({"B": "not base64!"})), None);
    }
}
