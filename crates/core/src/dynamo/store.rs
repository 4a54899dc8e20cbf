//! The [`DynamoStore`]: the [`ItemStore`] of a DynamoDB table of semaphore items and a table of
//! their waiters, sending each [`Write`] as the requests its [`expression`](super::expression)s
//! make.
//!
//! A write of the item alone is one `UpdateItem`, which hands back the item as it was before
//! (`ReturnValues: ALL_OLD`) or, when refused, as it is: the caller knows what the write did, or
//! why it was refused, without a read. A lock's first write is refused for want of an item, and
//! the item is then put on the condition that there still is none. A write that names a waiter's
//! record is one `TransactWriteItems` of the item and the record, so both change or neither
//! does. Waiters are keyed by lock and waiter id, so a waiter finds its own record with one
//! `GetItem`; a local secondary index on the place in line (`line`, keys only) gives the head
//! consistently, which a global one cannot, and a `BatchGetItem` its record.
//!
//! A gate lock keeps its holdings in a third table ([`super::gate`]). The item's format says the
//! layout and every write checks it: a write sent in the layout last seen and refused for the
//! other is sent again in the lock's own.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use aws_sdk_dynamodb::client::Waiters;
use aws_sdk_dynamodb::error::{DisplayErrorContext, SdkError};
use aws_sdk_dynamodb::operation::create_table::CreateTableError;
use aws_sdk_dynamodb::operation::put_item::PutItemError;
use aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsError;
use aws_sdk_dynamodb::operation::update_item::UpdateItemError;
use aws_sdk_dynamodb::types::{
    AttributeDefinition, AttributeValue, BillingMode, CancellationReason, KeySchemaElement,
    KeyType, KeysAndAttributes, LocalSecondaryIndex, Projection, ProjectionType, ReturnValue,
    ReturnValuesOnConditionCheckFailure, ScalarAttributeType, TransactWriteItem, Update,
};
use aws_sdk_dynamodb::Client;

use super::codec::{attr, decode, decode_waiter, encode, queue_attr, string, LINE_INDEX};
use super::expression::{line_after, record_action, render, ITEM_ABSENT};
use super::holdings::{holding_attr, Holdings};
use super::retry::{self, throttle_backoff, LostAnswers, CONFLICT_ROUNDS, UNREAD_KEY_ROUNDS};
use crate::error::StoreError;
use crate::input::{HolderId, LockName};
use crate::item::{Layout, SemaphoreItem};
use crate::ports::{ItemStore, ListCursor, ListPage};
use crate::protocol::WriteResult;
use crate::queue::{QueueKey, Waiter, WaiterId};
use crate::write::Write;

/// The semaphore items of one table and their waiters' records in another (see the module docs).
#[derive(Debug, Clone)]
pub struct DynamoStore {
    client: Client,
    table: String,
    queue_table: String,
    holdings_table: String,
    /// Each lock's layout as last seen (absent: assumed the item layout). No write relies on
    /// it: every write checks the format, which says the layout, and one refused for it is
    /// sent again in the other layout.
    pub(super) layouts: Arc<Mutex<HashMap<LockName, Layout>>>,
    /// Each gate's version as last seen: the next admission proposes a token above it.
    pub(super) versions: Arc<Mutex<HashMap<LockName, u64>>>,
    /// The gates whose last acquire sent from here was refused for want of room (full, or
    /// someone in line): the next reads the gate first (see `DynamoStore::write_gate`).
    pub(super) seen_full: Arc<Mutex<HashSet<LockName>>>,
}

/// What `create_table` found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TableSetup {
    Created,
    AlreadyExisted,
}

impl DynamoStore {
    /// The store of the semaphore items in `table`, with their waiters in the table named
    /// [`DynamoStore::default_queue_table`] (see [`DynamoStore::with_queue_table`]).
    pub fn new(client: Client, table: impl Into<String>) -> Self {
        let table = table.into();
        Self {
            client,
            queue_table: Self::default_queue_table(&table),
            holdings_table: Self::default_holdings_table(&table),
            table,
            layouts: Arc::default(),
            versions: Arc::default(),
            seen_full: Arc::default(),
        }
    }

    /// The gates' holdings table of a semaphore table, unless told otherwise:
    /// `<table>-holdings`.
    pub fn default_holdings_table(table: &str) -> String {
        format!("{table}-holdings")
    }

    /// Keeps the gates' holdings in `holdings_table`.
    pub fn with_holdings_table(mut self, holdings_table: impl Into<String>) -> Self {
        self.holdings_table = holdings_table.into();
        self
    }

    pub fn holdings_table(&self) -> &str {
        &self.holdings_table
    }

    /// The waiters' table of a semaphore table, unless told otherwise: `<table>-queue`.
    pub fn default_queue_table(table: &str) -> String {
        format!("{table}-queue")
    }

    /// Keeps the waiters in `queue_table` (a stack names both of its tables).
    pub fn with_queue_table(mut self, queue_table: impl Into<String>) -> Self {
        self.queue_table = queue_table.into();
        self
    }

    /// Sends each request up to `max_attempts` times with backoff ([`super::retry::holder_retries`]),
    /// whatever the client's config said: for a holder with no Step Functions `Retry` behind
    /// it.
    pub fn with_retries(mut self, max_attempts: u32) -> Self {
        let config = self
            .client
            .config()
            .to_builder()
            .retry_config(super::retry::holder_retries(max_attempts))
            .build();
        self.client = Client::from_conf(config);
        self
    }

    pub fn table(&self) -> &str {
        &self.table
    }

    pub fn queue_table(&self) -> &str {
        &self.queue_table
    }

    pub fn client(&self) -> &Client {
        &self.client
    }

    /// Creates the table (on-demand, partition key `lock`), the waiters' table (partition key
    /// `lock`, sort key `waiter`, local index `line` on `place`) and the gates' holdings table
    /// (partition key `lock`, sort key `slot`), each unless it exists: `Created` if any was
    /// made.
    pub async fn create_table(&self) -> Result<TableSetup, StoreError> {
        let items = self
            .create_one(&self.table, &[(attr::LOCK, KeyType::Hash)], None)
            .await?;
        let queue = self
            .create_one(
                &self.queue_table,
                &[
                    (queue_attr::LOCK, KeyType::Hash),
                    (queue_attr::WAITER, KeyType::Range),
                ],
                Some((LINE_INDEX, queue_attr::PLACE)),
            )
            .await?;
        let holdings = self
            .create_one(
                &self.holdings_table,
                &[
                    (holding_attr::PART, KeyType::Hash),
                    (holding_attr::SLOT, KeyType::Range),
                ],
                None,
            )
            .await?;
        Ok(if [items, queue, holdings].contains(&TableSetup::Created) {
            TableSetup::Created
        } else {
            TableSetup::AlreadyExisted
        })
    }

    /// Creates `table` with the string `keys`, and a local secondary index `(name, sort key)`
    /// projecting the keys alone.
    async fn create_one(
        &self,
        table: &str,
        keys: &[(&str, KeyType)],
        local_index: Option<(&str, &str)>,
    ) -> Result<TableSetup, StoreError> {
        let mut create = self
            .client
            .create_table()
            .table_name(table)
            .billing_mode(BillingMode::PayPerRequest);
        let definition = |name: &str| {
            AttributeDefinition::builder()
                .attribute_name(name)
                .attribute_type(ScalarAttributeType::S)
                .build()
                .map_err(|e| self.failed("CreateTable", e))
        };
        let element = |name: &str, kind: KeyType| {
            KeySchemaElement::builder()
                .attribute_name(name)
                .key_type(kind)
                .build()
                .map_err(|e| self.failed("CreateTable", e))
        };
        for (name, kind) in keys {
            create = create
                .attribute_definitions(definition(name)?)
                .key_schema(element(name, kind.clone())?);
        }
        if let (Some((index, sort_key)), Some((partition_key, _))) = (local_index, keys.first()) {
            create = create
                .attribute_definitions(definition(sort_key)?)
                .local_secondary_indexes(
                    LocalSecondaryIndex::builder()
                        .index_name(index)
                        .key_schema(element(partition_key, KeyType::Hash)?)
                        .key_schema(element(sort_key, KeyType::Range)?)
                        .projection(
                            Projection::builder()
                                .projection_type(ProjectionType::KeysOnly)
                                .build(),
                        )
                        .build()
                        .map_err(|e| self.failed("CreateTable", e))?,
                );
        }
        match create.send().await {
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
            .table_name(table)
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

impl DynamoStore {
    /// Sends `write`, rendered for `layout` as `rendered`, as one `UpdateItem` of the lock's
    /// item (see the module docs).
    pub(super) async fn send_update(
        &self,
        write: &Write,
        rendered: &super::expression::Rendered,
        layout: Layout,
    ) -> Result<WriteResult, StoreError> {
        let (mut creates, mut conflicts) = (0, 0);
        // Whether an attempt of this write went unanswered (F10): the SDK sent it again, and a
        // refusal may then be the first attempt's own doing.
        let lost = LostAnswers::default();
        while creates < CREATE_ROUNDS {
            let sent = self
                .client
                .update_item()
                .table_name(&self.table)
                .set_key(Some(self.key(&write.lock)))
                .condition_expression(&rendered.condition)
                .update_expression(&rendered.update)
                .set_expression_attribute_names(Some(rendered.names.clone()))
                .set_expression_attribute_values(Some(rendered.values.clone()))
                .return_values(ReturnValue::AllOld)
                .return_values_on_condition_check_failure(
                    ReturnValuesOnConditionCheckFailure::AllOld,
                )
                .customize()
                .interceptor(lost.clone())
                .send()
                .await;
            match sent {
                Ok(out) => {
                    let before = out.attributes().map(decode).transpose()?;
                    return Ok(WriteResult::Applied { before });
                }
                Err(SdkError::ServiceError(e)) => match e.into_err() {
                    UpdateItemError::ConditionalCheckFailedException(failed) => {
                        match failed.item() {
                            // Refused: the item handed back says which check failed (or that
                            // it is of another format, which `decode` names).
                            Some(current) if lost.happened() => {
                                return Ok(WriteResult::Unsure {
                                    current: in_layout(write, decode(current)?, layout)?,
                                })
                            }
                            Some(current) => {
                                return Ok(WriteResult::Refused {
                                    current: in_layout(write, decode(current)?, layout)?,
                                    waiter_refused: false,
                                })
                            }
                            None => {
                                creates += 1;
                                if let Some(result) = self.create(write).await? {
                                    return Ok(result);
                                }
                            }
                        }
                    }
                    // A transaction of the waiting line on this item was in flight: DynamoDB
                    // rejected the write without applying it, so sending it again is safe.
                    UpdateItemError::TransactionConflictException(_)
                        if conflicts < CONFLICT_ROUNDS =>
                    {
                        retry::backoff(conflicts).await;
                        conflicts += 1;
                    }
                    other => return Err(self.failed("UpdateItem", DisplayErrorContext(other))),
                },
                Err(e) => return Err(self.failed("UpdateItem", DisplayErrorContext(e))),
            }
        }
        Err(StoreError::Unexpected {
            lock: write.lock.to_string(),
            problem: format!(
                "the item was missing for the update and present for the put, {CREATE_ROUNDS} times"
            ),
        })
    }
}

/// `current`, handed back by a refusal of a write rendered for `layout`, if its lock is in
/// that layout; else the error that has the write sent again in the lock's own (every write
/// checks the format, which says the layout). A change of layout is answered from the item as
/// it is.
fn in_layout(
    write: &Write,
    current: SemaphoreItem,
    layout: Layout,
) -> Result<SemaphoreItem, StoreError> {
    let changes_layout = write
        .changes
        .iter()
        .all(|c| matches!(c, crate::write::Change::SetLayout(_)));
    match current.layout {
        found if found == layout => Ok(current),
        _ if changes_layout => Ok(current),
        found => Err(StoreError::WrongLayout {
            lock: write.lock.to_string(),
            layout: found,
        }),
    }
}

/// A transaction's cancellation reasons as their codes, one per action (`None` for an action
/// that did not fail). Never the reasons whole: with `ALL_OLD` each carries its item, and a
/// waiter's record holds its task token, a bearer credential that must not reach a log.
fn reason_codes(reasons: &[CancellationReason]) -> String {
    let codes: Vec<&str> = reasons.iter().map(|r| r.code().unwrap_or("None")).collect();
    format!("[{}]", codes.join(", "))
}

/// What became of a transaction ([`DynamoStore::send_transaction`]).
pub(super) enum Transacted {
    Committed,
    /// Refused by a condition: the cancellation reasons, one per action.
    Refused(Vec<CancellationReason>),
}

/// How often a write is tried when its lock's item is being created concurrently.
const CREATE_ROUNDS: usize = 3;

impl DynamoStore {
    fn key(&self, lock: &LockName) -> HashMap<String, AttributeValue> {
        HashMap::from([(attr::LOCK.to_owned(), string(lock.as_str()))])
    }

    /// The lock has no item yet: put the one the write makes of the empty lock, unless another
    /// writer created it meanwhile (`None`: try the update again).
    async fn create(&self, write: &Write) -> Result<Option<WriteResult>, StoreError> {
        let item = match write.apply(None) {
            Ok(item) => item,
            Err(_) => {
                return Ok(Some(WriteResult::Refused {
                    current: SemaphoreItem::empty(write.lock.clone()),
                    waiter_refused: false,
                }))
            }
        };
        let mut conflicts = 0;
        loop {
            let put = self
                .client
                .put_item()
                .table_name(&self.table)
                .set_item(Some(encode(&item)))
                .condition_expression(ITEM_ABSENT)
                .expression_attribute_names("#lock", attr::LOCK)
                .send()
                .await;
            return match put {
                Ok(_) => Ok(Some(WriteResult::Applied { before: None })),
                // Someone created it, or this put's own first attempt did and its answer was
                // lost: the caller sends the update, which answers either way.
                Err(SdkError::ServiceError(e))
                    if matches!(e.err(), PutItemError::ConditionalCheckFailedException(_)) =>
                {
                    Ok(None)
                }
                // A transaction on the key was in flight: rejected without being applied, so
                // sending it again is safe (as for the update, see `write`).
                Err(SdkError::ServiceError(e))
                    if matches!(e.err(), PutItemError::TransactionConflictException(_))
                        && conflicts < CONFLICT_ROUNDS =>
                {
                    retry::backoff(conflicts).await;
                    conflicts += 1;
                    continue;
                }
                Err(e) => Err(self.failed("PutItem", DisplayErrorContext(e))),
            };
        }
    }
}

impl DynamoStore {
    /// The lock's item, read consistently, with the `holdings` asked for when it is a gate.
    async fn read_lock(
        &self,
        lock: &LockName,
        holdings: Holdings<'_>,
    ) -> Result<Option<SemaphoreItem>, StoreError> {
        let out = self
            .client
            .get_item()
            .table_name(&self.table)
            .set_key(Some(self.key(lock)))
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| self.failed("GetItem", DisplayErrorContext(e)))?;
        match out.item().map(decode).transpose()? {
            Some(item) => {
                self.saw_layout(lock, item.layout);
                Ok(Some(self.with_holdings(item, holdings).await?))
            }
            None => Ok(None),
        }
    }
}

impl ItemStore for DynamoStore {
    async fn load(&self, lock: &LockName) -> Result<Option<SemaphoreItem>, StoreError> {
        self.read_lock(lock, Holdings::All).await
    }

    async fn load_holder(
        &self,
        lock: &LockName,
        holder: &HolderId,
    ) -> Result<Option<SemaphoreItem>, StoreError> {
        self.read_lock(lock, Holdings::Of(holder)).await
    }

    async fn load_line(&self, lock: &LockName) -> Result<Option<SemaphoreItem>, StoreError> {
        self.read_lock(lock, Holdings::None).await
    }

    async fn write(&self, write: &Write) -> Result<WriteResult, StoreError> {
        // Rendered for the layout last seen; the format every write checks refuses one rendered
        // for the other, which is then sent again as the lock's layout says.
        let mut layout = self.layout_of(&write.lock);
        for _ in 0..2 {
            let sent = match layout {
                Layout::Item if write.waiter_id().is_some() => self.transact(write).await,
                Layout::Item => self.send_update(write, &render(write)?, Layout::Item).await,
                Layout::Gate => self.write_gate(write).await,
            };
            match sent {
                Err(StoreError::WrongLayout { layout: found, .. }) if found != layout => {
                    self.saw_layout(&write.lock, found);
                    layout = found;
                }
                other => return other,
            }
        }
        Err(StoreError::Unexpected {
            lock: write.lock.to_string(),
            problem: "its layout changed under each write sent for it".to_owned(),
        })
    }
    async fn waiters(
        &self,
        lock: &LockName,
        after: Option<QueueKey>,
        limit: usize,
    ) -> Result<Vec<Waiter>, StoreError> {
        self.query_waiters(lock, after, limit).await
    }

    async fn waiter(&self, lock: &LockName, id: WaiterId) -> Result<Option<Waiter>, StoreError> {
        let got = self
            .client
            .get_item()
            .table_name(self.queue_table())
            .key(queue_attr::LOCK, string(lock.as_str()))
            .key(queue_attr::WAITER, string(&id.render()))
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| self.failed_queue("GetItem", DisplayErrorContext(e)))?;
        got.item().map(decode_waiter).transpose()
    }

    async fn list_page(&self, after: Option<&ListCursor>) -> Result<ListPage, StoreError> {
        // One Scan request: DynamoDB reads at most 1 MB of items per request ("A single Scan
        // request can retrieve a maximum of 1 MB of data", Amazon DynamoDB Developer Guide,
        // "Scanning tables in DynamoDB": docs.aws.amazon.com/amazondynamodb/latest/developerguide/Scan.html),
        // and says where to go on in LastEvaluatedKey: the table's only key, the lock's name.
        let page = self
            .client
            .scan()
            .table_name(&self.table)
            .consistent_read(true)
            .set_exclusive_start_key(
                after.map(|after| HashMap::from([(attr::LOCK.to_owned(), string(&after.0))])),
            )
            .send()
            .await
            .map_err(|e| self.failed("Scan", DisplayErrorContext(e)))?;
        let mut items = Vec::with_capacity(page.items().len());
        for attrs in page.items() {
            items.push(match decode(attrs) {
                Ok(item) => self.with_holdings(item, Holdings::All).await,
                Err(e) => Err(e),
            });
        }
        let next = match page.last_evaluated_key() {
            Some(key) if !key.is_empty() => match key.get(attr::LOCK) {
                Some(AttributeValue::S(lock)) => Some(ListCursor(lock.clone())),
                _ => {
                    return Err(StoreError::Unexpected {
                        lock: String::new(),
                        problem: format!(
                            "a Scan of {} answered a LastEvaluatedKey without the string key \
                             {}: {key:?}",
                            self.table,
                            attr::LOCK
                        ),
                    })
                }
            },
            _ => None,
        };
        Ok(ListPage { items, next })
    }
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
    async fn transact(&self, write: &Write) -> Result<WriteResult, StoreError> {
        let key = write.waiter_id().ok_or_else(|| StoreError::Unexpected {
            lock: write.lock.to_string(),
            problem: "a transaction for a write without a waiter".to_owned(),
        })?;
        if !write.touches_item() {
            return self.write_record_alone(write, key).await;
        }
        let actions = vec![
            self.item_action(write, render(write)?)?,
            record_action(self.queue_table(), write, key)?,
        ];
        let reasons = match self.send_transaction(actions, self.queue_table()).await? {
            Transacted::Committed => return Ok(WriteResult::Landed { after: None }),
            Transacted::Refused(reasons) => reasons,
        };
        let code = |i: usize| reasons.get(i).and_then(|r| r.code()).unwrap_or("None");
        let item_refused = code(0) == "ConditionalCheckFailed";
        let waiter_refused = code(1) == "ConditionalCheckFailed";
        // The item as it is: handed back when its own check failed (absent: no item yet),
        // else read.
        let current = match reasons.first().and_then(|r| r.item()) {
            Some(attrs) if item_refused => in_layout(write, decode(attrs)?, Layout::Item)?,
            _ if item_refused => SemaphoreItem::empty(write.lock.clone()),
            _ => self
                .load(&write.lock)
                .await?
                .unwrap_or_else(|| SemaphoreItem::empty(write.lock.clone())),
        };
        Ok(WriteResult::Refused {
            current,
            waiter_refused,
        })
    }

    /// The update of the lock's item, `rendered` from `write`, as one action of a transaction.
    pub(super) fn item_action(
        &self,
        write: &Write,
        rendered: super::expression::Rendered,
    ) -> Result<TransactWriteItem, StoreError> {
        let update = Update::builder()
            .table_name(self.table())
            .set_key(Some(self.key(&write.lock)))
            .condition_expression(rendered.condition)
            .update_expression(rendered.update)
            .set_expression_attribute_names(Some(rendered.names))
            .set_expression_attribute_values(Some(rendered.values))
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            .build()
            .map_err(|e| StoreError::Unexpected {
                lock: write.lock.to_string(),
                problem: e.to_string(),
            })?;
        Ok(TransactWriteItem::builder().update(update).build())
    }

    /// Sends `actions` as one transaction until it commits or a condition refuses it (the
    /// cancellation reasons then, one per action, each refused one with its item handed back).
    /// Throttles and conflicts are sent again; `table` names the request in an error.
    ///
    /// One client request token for the transaction, kept until DynamoDB says it did not commit
    /// (F10). The SDK sends a request whose answer was lost again with the same token, and
    /// DynamoDB answers a committed one success again without applying it twice (the token is
    /// good for 10 minutes); after TransactionInProgressException (that attempt was still in
    /// flight) it is sent again with the same token, which completes it. A new token would make
    /// a committed grant read as refused by its own record's removal ("moved"), and the waiter
    /// it granted would not be woken. After a cancellation nothing committed, and the next round
    /// gets a new token.
    pub(super) async fn send_transaction(
        &self,
        actions: Vec<TransactWriteItem>,
        table: &str,
    ) -> Result<Transacted, StoreError> {
        let failed = |message: String| StoreError::Dynamo {
            operation: "TransactWriteItems",
            table: table.to_owned(),
            message,
        };
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
                Ok(_) => return Ok(Transacted::Committed),
                Err(SdkError::ServiceError(e)) => match e.into_err() {
                    TransactWriteItemsError::TransactionCanceledException(cancelled) => cancelled,
                    TransactWriteItemsError::TransactionInProgressException(_) => {
                        retry::backoff(round).await;
                        continue;
                    }
                    other => return Err(failed(DisplayErrorContext(other).to_string())),
                },
                Err(e) => return Err(failed(DisplayErrorContext(e).to_string())),
            };
            let reasons = cancelled.cancellation_reasons();
            let has = |code: &str| reasons.iter().any(|r| r.code() == Some(code));
            if has("ThrottlingError") {
                // Throttled: waits as the SDK waits for a throttle, as often as it would try.
                throttled += 1;
                if throttled >= throttle_attempts {
                    return Err(failed(format!(
                        "throttled {throttled} times: cancelled: {}",
                        reason_codes(reasons)
                    )));
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
            if has("TransactionConflict") {
                token = retry::new_token();
                retry::backoff(round).await;
                continue;
            }
            if !has("ConditionalCheckFailed") {
                return Err(failed(format!("cancelled: {}", reason_codes(reasons))));
            }
            return Ok(Transacted::Refused(reasons.to_vec()));
        }
        Err(failed(format!(
            "cancelled by conflicting writes {CONFLICT_ROUNDS} times"
        )))
    }

    /// A write of the waiter's record alone (a new task token): one conditional `UpdateItem`
    /// of the record, no transaction.
    async fn write_record_alone(
        &self,
        write: &Write,
        key: WaiterId,
    ) -> Result<WriteResult, StoreError> {
        let action = record_action(self.queue_table(), write, key)?;
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
                    retry::backoff(conflicts).await;
                    conflicts += 1;
                }
                _ => break sent,
            }
        };
        match sent {
            Ok(_) => Ok(WriteResult::Landed { after: None }),
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

    async fn query_waiters(
        &self,
        lock: &LockName,
        after: Option<QueueKey>,
        limit: usize,
    ) -> Result<Vec<Waiter>, StoreError> {
        let mut waiters = Vec::new();
        let mut start: Option<HashMap<String, AttributeValue>> = None;
        let key = line_after(lock, after);
        while waiters.len() < limit {
            let page = self
                .client()
                .query()
                .table_name(self.queue_table())
                .index_name(LINE_INDEX)
                .key_condition_expression(&key.expression)
                .set_expression_attribute_names(Some(key.names.clone()))
                .set_expression_attribute_values(Some(key.values.clone()))
                .consistent_read(true)
                .limit(i32::try_from(limit - waiters.len()).unwrap_or(i32::MAX))
                .set_exclusive_start_key(start)
                .send()
                .await
                .map_err(|e| self.failed_queue("Query", DisplayErrorContext(e)))?;
            waiters.extend(self.records(page.items()).await?);
            match page.last_evaluated_key() {
                Some(key) if !key.is_empty() => start = Some(key.clone()),
                _ => break,
            }
        }
        waiters.truncate(limit);
        Ok(waiters)
    }

    /// The records the entries of the `line` index name, read consistently from the table, in
    /// the entries' order. The index keeps only the keys (every write of a record would
    /// otherwise write its task token, up to 1 KB, a second time); a record gone between the
    /// `Query` and this read (granted, or it left) is no longer in line, and is left out.
    async fn records(
        &self,
        entries: &[HashMap<String, AttributeValue>],
    ) -> Result<Vec<Waiter>, StoreError> {
        let table = self.queue_table();
        let primary = |entry: &HashMap<String, AttributeValue>| {
            [queue_attr::LOCK, queue_attr::WAITER]
                .into_iter()
                .filter_map(|name| Some((name.to_owned(), entry.get(name)?.clone())))
                .collect::<HashMap<_, _>>()
        };
        let waiter_of = |attrs: &HashMap<String, AttributeValue>| {
            attrs
                .get(queue_attr::WAITER)
                .and_then(|v| v.as_s().ok())
                .cloned()
                .unwrap_or_default()
        };
        let mut found = HashMap::new();
        // BatchGetItem takes at most 100 keys a request.
        for chunk in entries.chunks(100) {
            let mut pending = Some(chunk.iter().map(primary).collect::<Vec<_>>());
            let mut round = 0;
            while let Some(keys) = pending.take() {
                let request = KeysAndAttributes::builder()
                    .set_keys(Some(keys))
                    .consistent_read(true)
                    .build()
                    .map_err(|e| self.failed_queue("BatchGetItem", e))?;
                let got = self
                    .client
                    .batch_get_item()
                    .request_items(table, request)
                    .send()
                    .await
                    .map_err(|e| self.failed_queue("BatchGetItem", DisplayErrorContext(e)))?;
                for attrs in got
                    .responses()
                    .and_then(|r| r.get(table))
                    .into_iter()
                    .flatten()
                {
                    found.insert(waiter_of(attrs), decode_waiter(attrs)?);
                }
                // Keys DynamoDB left unread (throttled, or past 16 MB) are asked for again.
                let Some(left) = got
                    .unprocessed_keys()
                    .and_then(|u| u.get(table))
                    .filter(|left| !left.keys().is_empty())
                else {
                    continue;
                };
                if round == UNREAD_KEY_ROUNDS {
                    return Err(self.failed_queue(
                        "BatchGetItem",
                        format!(
                            "{} waiters' records left unread {UNREAD_KEY_ROUNDS} times",
                            left.keys().len()
                        ),
                    ));
                }
                retry::backoff(round).await;
                round += 1;
                pending = Some(left.keys().to_vec());
            }
        }
        Ok(entries
            .iter()
            .filter_map(|entry| found.remove(&waiter_of(entry)))
            .collect())
    }
}
