//! DynamoDB's TransactWriteItems is all or nothing: "If any action fails, the entire transaction
//! is rolled back, and no changes are made" (Amazon DynamoDB Developer Guide, "TransactWriteItems
//! API"). The gate layout relies on it for every acquire and release (the gate's count and the
//! holding move together). The local server rolls back only the items a transaction names
//! (`patch_transaction_rollback_per_item` in local/moto_server.py, so that a lock of 10,000
//! holdings is not copied whole at each write): these tests fail if that roll-back misses an
//! item an earlier action of the cancelled transaction had already changed, created or deleted.

use std::collections::HashMap;

use aws_sdk_dynamodb::error::ProvideErrorMetadata;
use aws_sdk_dynamodb::types::{
    AttributeDefinition, AttributeValue, BillingMode, ConditionCheck, Delete, KeySchemaElement,
    KeyType, Put, ScalarAttributeType, TransactWriteItem, Update,
};
use aws_sdk_dynamodb::Client;
use local_aws::{client_for, endpoint};

fn s(value: &str) -> AttributeValue {
    AttributeValue::S(value.to_owned())
}

fn n(value: u32) -> AttributeValue {
    AttributeValue::N(value.to_string())
}

fn key(pk: &str) -> HashMap<String, AttributeValue> {
    HashMap::from([("pk".to_owned(), s(pk))])
}

async fn table_with(client: &Client, items: &[(&str, u32)]) -> String {
    let name = format!("transactions-{:016x}", fastrand::u64(..));
    client
        .create_table()
        .table_name(&name)
        .key_schema(
            KeySchemaElement::builder()
                .attribute_name("pk")
                .key_type(KeyType::Hash)
                .build()
                .unwrap(),
        )
        .attribute_definitions(
            AttributeDefinition::builder()
                .attribute_name("pk")
                .attribute_type(ScalarAttributeType::S)
                .build()
                .unwrap(),
        )
        .billing_mode(BillingMode::PayPerRequest)
        .send()
        .await
        .expect("create the table");
    for (pk, value) in items {
        client
            .put_item()
            .table_name(&name)
            .item("pk", s(pk))
            .item("n", n(*value))
            .send()
            .await
            .expect("put an item");
    }
    name
}

async fn value_of(client: &Client, table: &str, pk: &str) -> Option<u32> {
    let item = client
        .get_item()
        .table_name(table)
        .set_key(Some(key(pk)))
        .consistent_read(true)
        .send()
        .await
        .expect("get an item")
        .item?;
    match item.get("n") {
        Some(AttributeValue::N(text)) => Some(text.parse().expect("a number")),
        other => panic!("item {pk} has n = {other:?}"),
    }
}

fn update(table: &str, pk: &str, value: u32) -> TransactWriteItem {
    TransactWriteItem::builder()
        .update(
            Update::builder()
                .table_name(table)
                .set_key(Some(key(pk)))
                .update_expression("SET n = :n")
                .expression_attribute_values(":n", n(value))
                .build()
                .unwrap(),
        )
        .build()
}

fn put(table: &str, pk: &str, value: u32) -> TransactWriteItem {
    TransactWriteItem::builder()
        .put(
            Put::builder()
                .table_name(table)
                .item("pk", s(pk))
                .item("n", n(value))
                .build()
                .unwrap(),
        )
        .build()
}

fn delete(table: &str, pk: &str) -> TransactWriteItem {
    TransactWriteItem::builder()
        .delete(
            Delete::builder()
                .table_name(table)
                .set_key(Some(key(pk)))
                .build()
                .unwrap(),
        )
        .build()
}

fn must_exist(table: &str, pk: &str) -> TransactWriteItem {
    TransactWriteItem::builder()
        .condition_check(
            ConditionCheck::builder()
                .table_name(table)
                .set_key(Some(key(pk)))
                .condition_expression("attribute_exists(pk)")
                .build()
                .unwrap(),
        )
        .build()
}

/// An update, a put of a new item and a delete land before the last action's condition fails:
/// the transaction is cancelled, and each of the three items is as it was before it, in a table
/// with other items the transaction did not name (untouched too).
#[tokio::test]
async fn a_cancelled_transaction_leaves_every_item_it_named_as_it_was() {
    let client = client_for(endpoint());
    let table = table_with(&client, &[("a", 1), ("c", 3), ("other", 7)]).await;
    let err = client
        .transact_write_items()
        .transact_items(update(&table, "a", 2))
        .transact_items(put(&table, "b", 5))
        .transact_items(delete(&table, "c"))
        .transact_items(must_exist(&table, "missing"))
        .send()
        .await
        .expect_err("the last action's condition fails");
    assert_eq!(
        err.code(),
        Some("TransactionCanceledException"),
        "{}",
        aws_sdk_dynamodb::error::DisplayErrorContext(&err)
    );
    assert_eq!(value_of(&client, &table, "a").await, Some(1), "update kept");
    assert_eq!(value_of(&client, &table, "b").await, None, "put kept");
    assert_eq!(value_of(&client, &table, "c").await, Some(3), "delete kept");
    assert_eq!(value_of(&client, &table, "other").await, Some(7));
}

/// The same actions with a condition that holds: all of them land.
#[tokio::test]
async fn a_transaction_whose_conditions_hold_applies_every_action() {
    let client = client_for(endpoint());
    let table = table_with(&client, &[("a", 1), ("c", 3), ("present", 0)]).await;
    client
        .transact_write_items()
        .transact_items(update(&table, "a", 2))
        .transact_items(put(&table, "b", 5))
        .transact_items(delete(&table, "c"))
        .transact_items(must_exist(&table, "present"))
        .send()
        .await
        .expect("every condition holds");
    assert_eq!(value_of(&client, &table, "a").await, Some(2));
    assert_eq!(value_of(&client, &table, "b").await, Some(5));
    assert_eq!(value_of(&client, &table, "c").await, None);
}
