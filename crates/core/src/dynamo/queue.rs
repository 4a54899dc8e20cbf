//! The waiters' table: one item per waiter, partition key the lock, sort key its place in line
//! ([`QueueKey::render`], whose text order is the line's order), so the head is the first item a
//! `Query` returns. A write that names a waiter's record is one `TransactWriteItems`: the lock's
//! item updated as [`super::render`] says (its `waiting` count included) and the record put,
//! deleted or updated under its own check, so both change together or neither does.

use std::collections::HashMap;

use aws_sdk_dynamodb::error::{DisplayErrorContext, SdkError};
use aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsError;
use aws_sdk_dynamodb::types::{
    AttributeValue, Delete, Put, ReturnValuesOnConditionCheckFailure, TransactWriteItem, Update,
};

use super::{
    attr, decode, get_number, number, render, retry, string, throttle_backoff, DynamoStore,
};
use crate::error::StoreError;
use crate::input::{AcquisitionId, HolderId, Limit, LockName, Rate, Terms, Weight};
use crate::item::{Identity, Run, SemaphoreItem};
use crate::protocol::WriteResult;
use crate::queue::{QueueKey, TaskToken, Waiter};
use crate::store::ItemStore;
use crate::write::{Change, Check, Write};

/// Attribute names of a waiter's item.
pub mod queue_attr {
    /// Partition key: the lock's name.
    pub const LOCK: &str = "lock";
    /// Sort key: the waiter's place in line, [`crate::QueueKey::render`].
    pub const PLACE: &str = "place";
    pub const HOLDER: &str = "holder";
    pub const ACQUISITION: &str = "acquisition";
    pub const RUN: &str = "run";
    pub const LIMIT: &str = "limit";
    /// The waiter's weight (absent: 1) and start rate as its spacing in ms (absent: none).
    pub const WEIGHT: &str = "weight";
    pub const SPACING: &str = "spacing_ms";
    pub const TASK_TOKEN: &str = "task_token";
    pub const CONTEXT: &str = "context";
}

/// How often a transaction is sent again when DynamoDB cancels it for a conflict with another
/// write of the same items in flight (nothing was written), or answers that it is still in
/// progress.
pub(super) const CONFLICT_ROUNDS: u32 = 5;

pub fn encode_waiter(waiter: &Waiter) -> HashMap<String, AttributeValue> {
    let mut attrs = HashMap::from([
        (queue_attr::LOCK.to_owned(), string(waiter.lock.as_str())),
        (queue_attr::PLACE.to_owned(), string(&waiter.key.render())),
        (
            queue_attr::HOLDER.to_owned(),
            string(waiter.identity.holder.as_str()),
        ),
        (
            queue_attr::ACQUISITION.to_owned(),
            string(waiter.identity.acquisition.as_str()),
        ),
        (queue_attr::RUN.to_owned(), number(waiter.run.0)),
        (
            queue_attr::LIMIT.to_owned(),
            number(waiter.terms.limit.get()),
        ),
        (
            queue_attr::WEIGHT.to_owned(),
            number(waiter.terms.weight.get()),
        ),
        (
            queue_attr::TASK_TOKEN.to_owned(),
            string(waiter.task_token.as_str()),
        ),
        (queue_attr::CONTEXT.to_owned(), string(&waiter.context)),
    ]);
    if let Some(rate) = waiter.terms.rate {
        attrs.insert(queue_attr::SPACING.to_owned(), number(rate.spacing_ms()));
    }
    attrs
}

pub fn decode_waiter(attrs: &HashMap<String, AttributeValue>) -> Result<Waiter, StoreError> {
    let text = |name: &str| {
        attrs
            .get(name)
            .and_then(|v| v.as_s().ok())
            .cloned()
            .ok_or_else(|| format!("attribute {name} is missing or not a string"))
    };
    let lock_name = text(queue_attr::LOCK).unwrap_or_default();
    let corrupt = |problem: String| StoreError::CorruptItem {
        lock: lock_name.clone(),
        problem: format!("waiter: {problem}"),
    };
    let lock = LockName::new(lock_name.clone()).map_err(|e| corrupt(e.to_string()))?;
    let key = QueueKey::parse(&text(queue_attr::PLACE).map_err(&corrupt)?).map_err(&corrupt)?;
    let identity = Identity::new(
        HolderId::new(text(queue_attr::HOLDER).map_err(&corrupt)?)
            .map_err(|e| corrupt(e.to_string()))?,
        AcquisitionId::new(text(queue_attr::ACQUISITION).map_err(&corrupt)?)
            .map_err(|e| corrupt(e.to_string()))?,
    );
    let run = get_number(attrs, queue_attr::RUN)
        .and_then(|n| u32::try_from(n).map_err(|e| e.to_string()))
        .map_err(&corrupt)?;
    let limit = get_number(attrs, queue_attr::LIMIT)
        .and_then(|n| i64::try_from(n).map_err(|e| e.to_string()))
        .and_then(|n| Limit::new(n).map_err(|e| e.to_string()))
        .map_err(&corrupt)?;
    let weight = match attrs.get(queue_attr::WEIGHT) {
        None => Weight::ONE,
        Some(_) => get_number(attrs, queue_attr::WEIGHT)
            .and_then(|n| i64::try_from(n).map_err(|e| e.to_string()))
            .and_then(|n| Weight::new(n).map_err(|e| e.to_string()))
            .map_err(&corrupt)?,
    };
    let rate = match attrs.get(queue_attr::SPACING) {
        None => None,
        Some(_) => Some(
            get_number(attrs, queue_attr::SPACING)
                .and_then(|n| u64::try_from(n).map_err(|e| e.to_string()))
                .and_then(|n| Rate::from_spacing_ms(n).map_err(|e| e.to_string()))
                .map_err(&corrupt)?,
        ),
    };
    let terms = Terms::new(limit, weight, rate).map_err(|e| corrupt(e.to_string()))?;
    let task_token = TaskToken::new(text(queue_attr::TASK_TOKEN).map_err(&corrupt)?)
        .map_err(|e| corrupt(e.to_string()))?;
    Ok(Waiter {
        lock,
        key,
        identity,
        run: Run(run),
        terms,
        task_token,
        context: text(queue_attr::CONTEXT).map_err(&corrupt)?,
    })
}

/// The action on the waiter's record a write asks for, with its check.
fn record_action(
    store: &DynamoStore,
    write: &Write,
    key: QueueKey,
) -> Result<TransactWriteItem, StoreError> {
    let record_key = HashMap::from([
        (queue_attr::LOCK.to_owned(), string(write.lock.as_str())),
        (queue_attr::PLACE.to_owned(), string(&key.render())),
    ]);
    let place = format!("#{}", queue_attr::PLACE);
    let exists = format!("attribute_exists({place})");
    let token_name = format!("#{}", queue_attr::TASK_TOKEN);
    let mut names = HashMap::from([(place.clone(), queue_attr::PLACE.to_owned())]);
    let mut values = HashMap::new();
    let condition = match write.checks.iter().find(|c| c.waiter_key().is_some()) {
        Some(Check::NotQueued(_)) => format!("attribute_not_exists({place})"),
        Some(Check::Queued(_)) => exists,
        Some(Check::QueuedWith { task_token, .. }) => {
            names.insert(token_name.clone(), queue_attr::TASK_TOKEN.to_owned());
            values.insert(":token".to_owned(), string(task_token.as_str()));
            format!("{exists} AND {token_name} = :token")
        }
        _ => exists,
    };
    let unexpected = |problem: &str| StoreError::Unexpected {
        lock: write.lock.to_string(),
        problem: problem.to_owned(),
    };
    let built = |e: aws_sdk_dynamodb::error::BuildError| unexpected(&e.to_string());
    let on_failure = ReturnValuesOnConditionCheckFailure::AllOld;
    let values = (!values.is_empty()).then_some(values);
    let change = write
        .changes
        .iter()
        .find(|change| {
            matches!(
                change,
                Change::Enqueue(_) | Change::Dequeue(_) | Change::Repark { .. }
            )
        })
        .ok_or_else(|| unexpected("a write checks a waiter's record but changes none"))?;
    let action = TransactWriteItem::builder();
    Ok(match change {
        Change::Enqueue(waiter) => action.put(
            Put::builder()
                .table_name(store.queue_table())
                .set_item(Some(encode_waiter(waiter)))
                .condition_expression(condition)
                .set_expression_attribute_names(Some(names))
                .set_expression_attribute_values(values)
                .return_values_on_condition_check_failure(on_failure)
                .build()
                .map_err(built)?,
        ),
        Change::Dequeue(_) => action.delete(
            Delete::builder()
                .table_name(store.queue_table())
                .set_key(Some(record_key))
                .condition_expression(condition)
                .set_expression_attribute_names(Some(names))
                .set_expression_attribute_values(values)
                .return_values_on_condition_check_failure(on_failure)
                .build()
                .map_err(built)?,
        ),
        Change::Repark { task_token, .. } => {
            names.insert(token_name.clone(), queue_attr::TASK_TOKEN.to_owned());
            let mut values = values.unwrap_or_default();
            values.insert(":new_token".to_owned(), string(task_token.as_str()));
            action.update(
                Update::builder()
                    .table_name(store.queue_table())
                    .set_key(Some(record_key))
                    .condition_expression(condition)
                    .update_expression(format!("SET {token_name} = :new_token"))
                    .set_expression_attribute_names(Some(names))
                    .set_expression_attribute_values(Some(values))
                    .return_values_on_condition_check_failure(on_failure)
                    .build()
                    .map_err(built)?,
            )
        }
        _ => unreachable!("found as a change of a waiter's record"),
    }
    .build())
}

impl DynamoStore {
    fn failed_queue(&self, operation: &'static str, e: impl std::fmt::Display) -> StoreError {
        let message = e.to_string();
        if message.contains("ResourceNotFoundException") {
            return StoreError::TableNotFound {
                table: format!("{} or {}", self.table(), self.queue_table()),
            };
        }
        StoreError::Dynamo {
            operation,
            table: self.queue_table().to_owned(),
            message,
        }
    }

    /// Sends a write that names a waiter's record as one transaction (see the module docs).
    pub(super) async fn transact(&self, write: &Write) -> Result<WriteResult, StoreError> {
        let key = write.waiter_key().ok_or_else(|| StoreError::Unexpected {
            lock: write.lock.to_string(),
            problem: "a transaction for a write without a waiter".to_owned(),
        })?;
        if !write.touches_item() {
            return self.write_record_alone(write, key).await;
        }
        let rendered = render(write)?;
        let item_update = Update::builder()
            .table_name(self.table())
            .set_key(Some(HashMap::from([(
                attr::LOCK.to_owned(),
                string(write.lock.as_str()),
            )])))
            .condition_expression(&rendered.condition)
            .update_expression(&rendered.update)
            .set_expression_attribute_names(Some(rendered.names.clone()))
            .set_expression_attribute_values(Some(rendered.values.clone()))
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            .build()
            .map_err(|e| StoreError::Unexpected {
                lock: write.lock.to_string(),
                problem: e.to_string(),
            })?;
        let actions = vec![
            TransactWriteItem::builder().update(item_update).build(),
            record_action(self, write, key)?,
        ];
        // One client request token for the write, kept until DynamoDB says the transaction did
        // not commit (F10). The SDK sends a request whose answer was lost again with the same
        // token, and DynamoDB answers a committed one success again without applying it twice
        // (the token is good for 10 minutes); after TransactionInProgressException (that
        // attempt was still in flight) it is sent again with the same token, which completes
        // it. A new token would make a committed grant read as refused by its own record's
        // removal ("moved"), and the waiter it granted would not be woken. After a
        // cancellation nothing committed, and the next round gets a new token.
        let mut token = retry::new_token();
        let throttle_attempts = retry::throttle_attempts(self.client().config().retry_config());
        let (mut rounds, mut throttled) = (0, 0);
        while rounds < CONFLICT_ROUNDS {
            let round = rounds;
            rounds += 1;
            let sent = self
                .client()
                .transact_write_items()
                .set_transact_items(Some(actions.clone()))
                .client_request_token(&token)
                .send()
                .await;
            let cancelled = match sent {
                Ok(_) => return Ok(WriteResult::Landed),
                Err(SdkError::ServiceError(e)) => match e.into_err() {
                    TransactWriteItemsError::TransactionCanceledException(cancelled) => cancelled,
                    TransactWriteItemsError::TransactionInProgressException(_) => {
                        backoff(round).await;
                        continue;
                    }
                    other => {
                        return Err(
                            self.failed_queue("TransactWriteItems", DisplayErrorContext(other))
                        )
                    }
                },
                Err(e) => {
                    return Err(self.failed_queue("TransactWriteItems", DisplayErrorContext(e)))
                }
            };
            let reasons = cancelled.cancellation_reasons();
            let code = |i: usize| reasons.get(i).and_then(|r| r.code()).unwrap_or("None");
            if [code(0), code(1)].contains(&"ThrottlingError") {
                // Throttled: waits as the SDK waits for a throttle, as often as it would try.
                throttled += 1;
                if throttled >= throttle_attempts {
                    return Err(self.failed_queue(
                        "TransactWriteItems",
                        format!("throttled {throttled} times: cancelled: {reasons:?}"),
                    ));
                }
                token = retry::new_token();
                rounds -= 1;
                let wait = throttle_backoff(
                    self.client().config().retry_config(),
                    throttled - 1,
                    fastrand::f64(),
                );
                tokio::time::sleep(wait).await;
                continue;
            }
            if [code(0), code(1)].contains(&"TransactionConflict") {
                token = retry::new_token();
                backoff(round).await;
                continue;
            }
            let item_refused = code(0) == "ConditionalCheckFailed";
            let waiter_refused = code(1) == "ConditionalCheckFailed";
            if !item_refused && !waiter_refused {
                return Err(
                    self.failed_queue("TransactWriteItems", format!("cancelled: {:?}", reasons))
                );
            }
            // The item as it is: handed back when its own check failed (absent: no item yet),
            // else read.
            let current = match reasons.first().and_then(|r| r.item()) {
                Some(attrs) if item_refused => decode(attrs)?,
                _ if item_refused => SemaphoreItem::empty(write.lock.clone()),
                _ => self
                    .load(&write.lock)
                    .await?
                    .unwrap_or_else(|| SemaphoreItem::empty(write.lock.clone())),
            };
            return Ok(WriteResult::Refused {
                current,
                waiter_refused,
            });
        }
        Err(StoreError::Dynamo {
            operation: "TransactWriteItems",
            table: self.table().to_owned(),
            message: format!("cancelled by conflicting writes {CONFLICT_ROUNDS} times"),
        })
    }

    /// A write of the waiter's record alone (a new task token): one conditional `UpdateItem`
    /// of the record, no transaction.
    async fn write_record_alone(
        &self,
        write: &Write,
        key: QueueKey,
    ) -> Result<WriteResult, StoreError> {
        let action = record_action(self, write, key)?;
        let Some(update) = action.update() else {
            return Err(StoreError::Unexpected {
                lock: write.lock.to_string(),
                problem: "a write of a waiter's record alone that is not an update".to_owned(),
            });
        };
        let mut conflicts = 0;
        let sent = loop {
            let sent = self
                .client()
                .update_item()
                .table_name(update.table_name())
                .set_key(Some(update.key().clone()))
                .condition_expression(update.condition_expression().unwrap_or_default())
                .update_expression(update.update_expression())
                .set_expression_attribute_names(update.expression_attribute_names().cloned())
                .set_expression_attribute_values(update.expression_attribute_values().cloned())
                .send()
                .await;
            // Rejected, not applied, for a transaction on the record in flight: send it again.
            match &sent {
                Err(SdkError::ServiceError(e))
                    if e.err().is_transaction_conflict_exception()
                        && conflicts < CONFLICT_ROUNDS =>
                {
                    backoff(conflicts).await;
                    conflicts += 1;
                }
                _ => break sent,
            }
        };
        match sent {
            Ok(_) => Ok(WriteResult::Landed),
            Err(SdkError::ServiceError(e))
                if matches!(
                    e.err(),
                    aws_sdk_dynamodb::operation::update_item::UpdateItemError::ConditionalCheckFailedException(_)
                ) =>
            {
                let current = self
                    .load(&write.lock)
                    .await?
                    .unwrap_or_else(|| SemaphoreItem::empty(write.lock.clone()));
                Ok(WriteResult::Refused {
                    current,
                    waiter_refused: true,
                })
            }
            Err(e) => Err(self.failed_queue("UpdateItem", DisplayErrorContext(e))),
        }
    }

    pub(super) async fn query_waiters(
        &self,
        lock: &LockName,
        after: Option<QueueKey>,
        limit: usize,
    ) -> Result<Vec<Waiter>, StoreError> {
        let mut waiters = Vec::new();
        let mut start: Option<HashMap<String, AttributeValue>> = None;
        let mut condition = "#lock = :lock".to_owned();
        let mut values = HashMap::from([(":lock".to_owned(), string(lock.as_str()))]);
        let mut names = HashMap::from([("#lock".to_owned(), queue_attr::LOCK.to_owned())]);
        if let Some(after) = after {
            condition.push_str(" AND #place > :after");
            values.insert(":after".to_owned(), string(&after.render()));
            names.insert("#place".to_owned(), queue_attr::PLACE.to_owned());
        }
        while waiters.len() < limit {
            let page = self
                .client()
                .query()
                .table_name(self.queue_table())
                .key_condition_expression(&condition)
                .set_expression_attribute_names(Some(names.clone()))
                .set_expression_attribute_values(Some(values.clone()))
                .consistent_read(true)
                .limit(i32::try_from(limit - waiters.len()).unwrap_or(i32::MAX))
                .set_exclusive_start_key(start)
                .send()
                .await
                .map_err(|e| self.failed_queue("Query", DisplayErrorContext(e)))?;
            for attrs in page.items() {
                waiters.push(decode_waiter(attrs)?);
            }
            match page.last_evaluated_key() {
                Some(key) if !key.is_empty() => start = Some(key.clone()),
                _ => break,
            }
        }
        waiters.truncate(limit);
        Ok(waiters)
    }
}

pub(super) async fn backoff(round: u32) {
    let ms = fastrand::u64(5..=(20u64 << round.min(4)));
    tokio::time::sleep(std::time::Duration::from_millis(ms)).await;
}
