//! Sizes as DynamoDB counts and bills them ("DynamoDB item sizes and formats"): what a lock's
//! item takes in the table, and the write units each write of it costs.

use std::collections::HashMap;

use aws_sdk_dynamodb::types::AttributeValue;

use super::codec::encode;
use crate::item::SemaphoreItem;

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
        // Sets: the sum of their elements (DynamoDB documents no per-element overhead).
        AttributeValue::Bs(set) => set.iter().map(|b| b.as_ref().len()).sum(),
        AttributeValue::Ns(set) => set.iter().map(|n| number_size(n)).sum(),
        AttributeValue::Ss(set) => set.iter().map(String::len).sum(),
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

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use aws_sdk_dynamodb::primitives::Blob;

    use super::*;
    use crate::dynamo::codec::binary_set;
    use crate::item::FenceKey;

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
        assert_eq!(
            value_size(&binary_set(&BTreeSet::from([
                FenceKey::from_bytes([1; 8]),
                FenceKey::from_bytes([2; 8])
            ]))),
            16
        );
    }

    #[test]
    fn units_round_up_per_started_kilobyte() {
        assert_eq!(write_units(0), 1);
        assert_eq!(write_units(1024), 1);
        assert_eq!(write_units(1025), 2);
    }
}
