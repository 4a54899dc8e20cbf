//! DynamoDB's size limits (F9), made to happen against the local server: moto enforces the
//! 400 KB item size by itself, and `local/moto_server.py` makes it refuse an expression over
//! 4 KB as DynamoDB does ("Constraints in Amazon DynamoDB", "Expression parameters").

use aws_sdk_dynamodb::error::{DisplayErrorContext, ProvideErrorMetadata};
use aws_sdk_dynamodb::types::{AttributeValue, TransactWriteItem, Update};
use semaphore_core::dynamo::MAX_EXPRESSION_BYTES;
use semaphore_core::{AcquireOutcome, Semaphore};
use semaphore_tests::fresh_table;
use semaphore_tests::names::{id, limit, lock};
use semaphore_tests::observe::observe;

/// One holder with 150 acquisitions on one lock: a cleanup that named every slot in one write
/// rendered a 6 KB condition, which DynamoDB refused after the fence had landed, leaving the
/// slots held for ever. The cleanup frees them in writes that each fit, and frees all 150.
#[tokio::test]
async fn a_holder_of_150_slots_on_one_lock_is_cleaned_up_in_full() {
    let store = fresh_table().await;
    let semaphore = Semaphore::new(store.clone());
    let l = lock("many-slots");
    let holder = "arn:aws:states:us-east-1:123456789012:execution:machine:one-holder";
    for n in 0..150 {
        let outcome = semaphore
            .acquire(&l, &id(holder, &format!("acquisition-{n}")), limit(200))
            .await
            .unwrap();
        assert!(
            matches!(outcome, AcquireOutcome::Acquired { .. }),
            "{outcome:?}"
        );
    }
    let cleaned = semaphore
        .cleanup(&l, &id(holder, "x").holder)
        .await
        .unwrap();
    assert_eq!(cleaned.freed.len(), 150);
    assert_eq!(cleaned.count, 0);
    let seen = observe(store.client(), store.table(), l.as_str())
        .await
        .unwrap();
    seen.assert_safe(200);
    assert!(seen.holders.is_empty(), "{seen:?}");
    assert_eq!(seen.used, 0);
}

/// A condition of `n` clauses on a missing attribute (each true), as long as asked.
fn condition(clauses: usize) -> String {
    vec!["attribute_not_exists(#missing)"; clauses].join(" AND ")
}

/// The local server refuses an expression over 4 KB with DynamoDB's error, and writes nothing;
/// one just within the limit lands. Without the patch the long one lands too: this is what
/// proves the patch is on.
#[tokio::test]
async fn the_local_server_refuses_an_expression_over_4_kb() {
    let store = fresh_table().await;
    let client = store.client();
    let clause = "attribute_not_exists(#missing) AND ".len();
    let fits = MAX_EXPRESSION_BYTES / clause;
    let update = |condition: String| {
        client
            .update_item()
            .table_name(store.table())
            .key("lock", AttributeValue::S("expression-limit".to_owned()))
            .condition_expression(condition)
            .update_expression("SET #n = :one")
            .expression_attribute_names("#missing", "missing")
            .expression_attribute_names("#n", "n")
            .expression_attribute_values(":one", AttributeValue::N("1".to_owned()))
    };
    let long = condition(fits + 1);
    assert!(long.len() > MAX_EXPRESSION_BYTES);
    let err = update(long.clone()).send().await.unwrap_err();
    assert_eq!(
        err.code(),
        Some("ValidationException"),
        "{}",
        DisplayErrorContext(&err)
    );
    let message = err.message().unwrap_or_default();
    assert!(
        message.starts_with(
            "Invalid ConditionExpression: Expression size has exceeded the maximum allowed size"
        ),
        "{message}"
    );
    let raw = semaphore_tests::observe::raw_item(client, store.table(), "expression-limit").await;
    assert!(raw.is_none(), "a refused write wrote {raw:?}");

    // In a transaction too, before any of its actions is applied.
    let action = Update::builder()
        .table_name(store.table())
        .key("lock", AttributeValue::S("expression-limit".to_owned()))
        .condition_expression(long)
        .update_expression("SET #n = :one")
        .expression_attribute_names("#missing", "missing")
        .expression_attribute_names("#n", "n")
        .expression_attribute_values(":one", AttributeValue::N("1".to_owned()))
        .build()
        .unwrap();
    let err = client
        .transact_write_items()
        .transact_items(TransactWriteItem::builder().update(action).build())
        .send()
        .await
        .unwrap_err();
    assert_eq!(
        err.code(),
        Some("ValidationException"),
        "{}",
        DisplayErrorContext(&err)
    );

    let short = condition(fits);
    assert!(short.len() <= MAX_EXPRESSION_BYTES);
    update(short).send().await.unwrap();
    let raw = semaphore_tests::observe::raw_item(client, store.table(), "expression-limit").await;
    assert!(raw.is_some());
}
