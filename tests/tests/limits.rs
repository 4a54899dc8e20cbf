//! DynamoDB's size limits (F9), made to happen against the local server: moto enforces the
//! 400 KB item size by itself, and `local/moto_server.py` makes it refuse an expression over
//! 4 KB as DynamoDB does ("Constraints in Amazon DynamoDB", "Expression parameters").

use aws_sdk_dynamodb::error::{DisplayErrorContext, ProvideErrorMetadata};
use aws_sdk_dynamodb::types::{AttributeValue, TransactWriteItem, Update};
use local_aws::fresh_table;
use local_aws::names::{id, limit, lock};
use local_aws::observe::observe;
use semaphore_core::dynamo::encode;
use semaphore_core::dynamo::MAX_EXPRESSION_BYTES;
use semaphore_core::item::{FenceKey, HELD_BYTES_BUDGET, MAX_HELD_BYTES};
use semaphore_core::Claim;
use semaphore_core::{
    AcquireOutcome, Attempt, QueueOutcome, Run, Semaphore, SemaphoreItem, TaskToken, Waiter,
};

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
    let raw = local_aws::observe::raw_item(client, store.table(), "expression-limit").await;
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
    let raw = local_aws::observe::raw_item(client, store.table(), "expression-limit").await;
    assert!(raw.is_some());
}

/// A lock filled with 480-character holder names: DynamoDB refuses any write that makes an item
/// over 400 KB (moto too: "Item size to update has exceeded the maximum allowed size"), which
/// the 815th acquire met. Admission stops at the item's budget first and answers `full`; a
/// release, a cleanup of a holder, and the fences of many cleanups of executions that hold
/// nothing still land.
#[tokio::test]
async fn a_lock_filled_with_the_longest_names_answers_full_and_release_and_cleanup_still_land() {
    let store = fresh_table().await;
    let semaphore = Semaphore::new(store.clone());
    let l = lock("big-names");
    let holder = |n: usize| format!("{n:0>480}");
    let mut admitted = 0;
    let full = loop {
        let outcome = semaphore
            .acquire(&l, &id(&holder(admitted), "a"), limit(1000))
            .await
            .unwrap_or_else(|e| panic!("acquire {}: {e}", admitted + 1));
        match outcome {
            AcquireOutcome::Acquired { .. } => admitted += 1,
            other => break other,
        }
        assert!(admitted < 1000, "the item's budget never stopped admission");
    };
    assert!(
        matches!(full, AcquireOutcome::Full { count, used: u, .. } if count == admitted && u == admitted as u64),
        "{full:?}"
    );
    let seen = observe(store.client(), store.table(), l.as_str())
        .await
        .unwrap();
    seen.assert_safe(1000);
    println!(
        "480-character holders admitted: {admitted}; item {} bytes, held_bytes {}",
        seen.approx_bytes, seen.held_bytes
    );
    // 500 bytes an entry (480 + '#' + 'a' + the number's 17 + 1), admitted while the room for
    // the largest entry (659 bytes) is left of 300 KB.
    assert_eq!(admitted, 614);
    assert!(seen.approx_bytes < 400 * 1024);

    // Fences of executions that hold nothing (a cleanup's first write) land on the full item.
    for n in 0..200 {
        let gone = format!("{:0>480}", format!("gone-{n}"));
        let cleaned = semaphore.cleanup(&l, &id(&gone, "a").holder).await.unwrap();
        assert!(cleaned.freed.is_empty());
    }
    // A release and a cleanup of holders land, and free their slots.
    let released = semaphore
        .release(&l, &id(&holder(0), "a"), Claim::Operator)
        .await
        .unwrap();
    assert!(
        matches!(released, semaphore_core::ReleaseOutcome::Released { .. }),
        "{released:?}"
    );
    let cleaned = semaphore
        .cleanup(&l, &id(&holder(1), "a").holder)
        .await
        .unwrap();
    assert_eq!(cleaned.freed.len(), 1);
    let seen = observe(store.client(), store.table(), l.as_str())
        .await
        .unwrap();
    seen.assert_safe(1000);
    assert_eq!(seen.holders.len(), admitted - 2);
    // Room again: the next acquire is admitted.
    let again = semaphore
        .acquire(&l, &id(&holder(admitted), "a"), limit(1000))
        .await
        .unwrap();
    assert!(
        matches!(again, AcquireOutcome::Acquired { .. }),
        "{again:?}"
    );
}

/// The room check and its negation (a waiter queues only while there is no room) as the local
/// server evaluates them, on items put at the budget's edges: the holders' bytes, and a fence
/// generation (`size()` of a binary set, the other one absent).
#[tokio::test]
async fn the_room_check_and_its_negation_hold_on_the_local_server() {
    let store = fresh_table().await;
    let semaphore = Semaphore::new(store.clone());
    let client = store.client();
    let waiter = |l: &semaphore_core::LockName, n: usize| {
        Waiter::new(
            l.clone(),
            id(&format!("waiter-{n}"), "a"),
            Run::FIRST,
            limit(10),
            semaphore.now_ms(),
            TaskToken::new(format!("task-{n}")).unwrap(),
            Attempt::new(semaphore.now_ms(), 0),
            String::new(),
        )
    };
    let edge = HELD_BYTES_BUDGET - MAX_HELD_BYTES;
    let fences = |n: u64| {
        (0..n)
            .map(|k| FenceKey::from_bytes(k.to_be_bytes()))
            .collect()
    };
    for (name, held_bytes, old_fences, room) in [
        ("bytes-at-the-edge", edge, 0, true),
        ("bytes-past-the-edge", edge + 1, 0, false),
        ("fences-at-the-edge", 0, 4096, true),
        ("fences-past-the-edge", 0, 4097, false),
    ] {
        // The same item under two locks: one for an acquire, one for a waiter's queueing.
        let (l, q) = (
            lock(&format!("{name}-acquire")),
            lock(&format!("{name}-queue")),
        );
        for l in [&l, &q] {
            let mut item = SemaphoreItem::empty(l.clone());
            item.held_bytes = held_bytes;
            item.fences.old = fences(old_fences);
            item.fences.rotated_at_ms = Some(1);
            client
                .put_item()
                .table_name(store.table())
                .set_item(Some(encode(&item)))
                .send()
                .await
                .unwrap();
        }
        let acquired = semaphore
            .acquire(&l, &id("newcomer", "a"), limit(10))
            .await
            .unwrap();
        let queued = semaphore
            .enqueue(&waiter(&q, 0), semaphore.now_ms())
            .await
            .unwrap();
        if room {
            assert_eq!(queued, QueueOutcome::Free, "{name}");
            assert!(
                matches!(acquired, AcquireOutcome::Acquired { .. }),
                "{name}: {acquired:?}"
            );
        } else {
            assert_eq!(queued, QueueOutcome::Queued, "{name}");
            assert!(
                matches!(acquired, AcquireOutcome::Full { .. }),
                "{name}: {acquired:?}"
            );
        }
    }
}
