//! The DynamoDB rendering of the protocol: one item per lock, and each [`Write`] sent as one
//! `UpdateItem` whose condition is the write's checks and whose update expression is its changes.
//! Every expression string is built here, from the typed write, and nowhere else.
//!
//! A write that also names a waiter's record (see [`crate::queue`]) is sent as a
//! `TransactWriteItems` of that update and the record's put, delete or update in the queue
//! table (see [`queue`]).
//!
//! Every request asks for the item as it was before (`ReturnValues: ALL_OLD`) and, when refused,
//! as it is (`ReturnValuesOnConditionCheckFailure: ALL_OLD`): the caller then knows what the
//! write did, or why it was refused, without a read. Only the first write of a lock takes two
//! requests: the update is refused for want of an item, and the item the write would make of an
//! empty lock is put, on the condition that there still is none.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use aws_sdk_dynamodb::client::Waiters;
use aws_sdk_dynamodb::error::{DisplayErrorContext, SdkError};
use aws_sdk_dynamodb::operation::create_table::CreateTableError;
use aws_sdk_dynamodb::operation::put_item::PutItemError;
use aws_sdk_dynamodb::operation::update_item::UpdateItemError;
use aws_sdk_dynamodb::primitives::Blob;
use aws_sdk_dynamodb::types::{
    AttributeDefinition, AttributeValue, BillingMode, KeySchemaElement, KeyType, ReturnValue,
    ReturnValuesOnConditionCheckFailure, ScalarAttributeType,
};
use aws_sdk_dynamodb::Client;

use crate::error::StoreError;
use crate::input::{Limit, LockName, Rate, Weight};
use crate::item::{
    FenceKey, Fences, FencingToken, Holding, Identity, SemaphoreItem, Version,
    FENCES_PER_GENERATION, HELD_BYTES_BUDGET, MAX_HELD_BYTES,
};
use crate::protocol::WriteResult;
use crate::store::ItemStore;
use crate::write::{Change, Check, Write};

/// Attribute names of the semaphore item. `lock` is the table's only key; the template's table
/// and `semctl init` declare exactly this schema.
pub mod attr {
    pub const LOCK: &str = "lock";
    /// The item format: [`super::FORMAT`]. Every write checks it, so a write never lands on an
    /// item of another format (version 1's items have none), and a missing item is told apart.
    pub const FORMAT: &str = "format";
    pub const VERSION: &str = "version";
    pub const LIMIT: &str = "limit";
    /// Map: slot key (`holder#acquisition`) -> the holding, packed in one number (see
    /// [`super::TOKEN_SPAN`]).
    pub const HOLDERS: &str = "holders";
    /// Binary sets of 8-byte fence keys, and the time of the last rotation (epoch ms).
    pub const YOUNG: &str = "young";
    pub const OLD: &str = "old";
    pub const ROTATED_AT: &str = "rotated_at";
    /// How many waiters are in the lock's line (absent: none).
    pub const WAITING: &str = "waiting";
    /// The sum of the holders' weights (always there: the limit check reads it).
    pub const USED: &str = "used";
    /// The last acquisition's start rate, as its spacing in ms (absent: none).
    pub const SPACING: &str = "spacing_ms";
    /// When the last acquisition landed (epoch ms; absent: none yet).
    pub const STARTED_AT: &str = "started_at";
    /// The bytes of the holder map's entries (always there: the acquire's room check reads it).
    pub const HELD_BYTES: &str = "held_bytes";
}

/// The item format this version writes and reads. Format 2 (before weights) kept no `used`;
/// format 3 (before the item's size budget) kept no `held_bytes`, which every acquire's condition
/// reads and every removal subtracts from: a write of this version must not land on one.
pub const FORMAT: u64 = 4;

/// A holding is stored as one number,
/// `(weight - 1) * WEIGHT_SPAN + acquired_at_ms * TOKEN_SPAN + token`. The token is the version
/// the acquire's write makes, which only DynamoDB knows when the write lands; an update
/// expression can compute a number from the version (`#version + :c`) but cannot build a map
/// from it, so one number carries all three. Versions stay below
/// 10^15 (a thousand writes a second for 31,000 years), times below 10^13 ms (until the year
/// 2286), weights at most 1000: at most 31 digits (DynamoDB keeps 38). The weight leads, so "a
/// slot of weight w" is a range a condition can check (`BETWEEN`), which a release needs: it
/// subtracts the weight it removes from `used`.
pub const TOKEN_SPAN: u128 = 1_000_000_000_000_000;
/// See [`TOKEN_SPAN`]: `TOKEN_SPAN * 10^13`.
pub const WEIGHT_SPAN: u128 = TOKEN_SPAN * 10_000_000_000_000;

/// DynamoDB's limits on one expression string ("Constraints in Amazon DynamoDB", section
/// "Expression parameters"): "The maximum length of any expression string is 4 KB" (1 KB = 1024
/// bytes there), and at most 300 operators or functions in an expression. A request over either
/// is refused with a ValidationException, whatever its condition would have said.
pub const MAX_EXPRESSION_BYTES: usize = 4 * 1024;
/// See [`MAX_EXPRESSION_BYTES`].
pub const MAX_EXPRESSION_OPERATORS: usize = 300;

/// The operators and functions in an expression, counted generously (the `AND` of a `BETWEEN`
/// and the `=` of a `SET` action count too), so that a count within the limit is within it
/// however DynamoDB counts.
fn operators(expression: &str) -> usize {
    let words = expression
        .split(|c: char| c.is_whitespace() || c == ',' || c == ')')
        .filter(|w| {
            matches!(
                w.to_ascii_uppercase().as_str(),
                "AND"
                    | "OR"
                    | "NOT"
                    | "BETWEEN"
                    | "IN"
                    | "="
                    | "<>"
                    | "<"
                    | "<="
                    | ">"
                    | ">="
                    | "+"
                    | "-"
            )
        })
        .count();
    words + expression.matches('(').count()
}

/// The expression, or the typed error DynamoDB's limits call for: a request AWS would refuse is
/// never sent (and, for a cleanup, is never left to fail after its fence landed).
fn within_limits(
    lock: &LockName,
    expression: &'static str,
    text: String,
) -> Result<String, StoreError> {
    let operators = operators(&text);
    if text.len() > MAX_EXPRESSION_BYTES || operators > MAX_EXPRESSION_OPERATORS {
        return Err(StoreError::ExpressionTooLarge {
            lock: lock.to_string(),
            expression,
            bytes: text.len(),
            operators,
        });
    }
    Ok(text)
}

/// The stored number of a holding.
fn pack(holding: &Holding) -> u128 {
    weight_floor(holding.weight)
        + u128::from(holding.acquired_at_ms) * TOKEN_SPAN
        + u128::from(holding.token.0)
}

/// The least stored number of a holding of `weight`.
fn weight_floor(weight: Weight) -> u128 {
    u128::from(weight.get() - 1) * WEIGHT_SPAN
}

mod queue;
mod retry;

pub use queue::{decode_waiter, encode_waiter, queue_attr};
pub use retry::throttle_backoff;
use retry::LostAnswers;

#[derive(Debug, Clone)]
pub struct DynamoStore {
    client: Client,
    table: String,
    queue_table: String,
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
            table,
        }
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

    pub fn table(&self) -> &str {
        &self.table
    }

    pub fn queue_table(&self) -> &str {
        &self.queue_table
    }

    pub fn client(&self) -> &Client {
        &self.client
    }

    /// Creates the table (on-demand, partition key `lock`) and the waiters' table (partition
    /// key `lock`, sort key `place`), each unless it exists: `Created` if either was made.
    pub async fn create_table(&self) -> Result<TableSetup, StoreError> {
        let items = self
            .create_one(&self.table, &[(attr::LOCK, KeyType::Hash)])
            .await?;
        let queue = self
            .create_one(
                &self.queue_table,
                &[
                    (queue_attr::LOCK, KeyType::Hash),
                    (queue_attr::PLACE, KeyType::Range),
                ],
            )
            .await?;
        Ok(
            if items == TableSetup::Created || queue == TableSetup::Created {
                TableSetup::Created
            } else {
                TableSetup::AlreadyExisted
            },
        )
    }

    async fn create_one(
        &self,
        table: &str,
        keys: &[(&str, KeyType)],
    ) -> Result<TableSetup, StoreError> {
        let mut create = self
            .client
            .create_table()
            .table_name(table)
            .billing_mode(BillingMode::PayPerRequest);
        for (name, kind) in keys {
            create = create
                .attribute_definitions(
                    AttributeDefinition::builder()
                        .attribute_name(*name)
                        .attribute_type(ScalarAttributeType::S)
                        .build()
                        .map_err(|e| self.failed("CreateTable", e))?,
                )
                .key_schema(
                    KeySchemaElement::builder()
                        .attribute_name(*name)
                        .key_type(kind.clone())
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

/// An `UpdateItem`'s expressions, as rendered from a [`Write`].
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Rendered {
    pub condition: String,
    pub update: String,
    pub names: HashMap<String, String>,
    pub values: HashMap<String, AttributeValue>,
}

/// Placeholders, each declared once and only when used (DynamoDB refuses unused ones).
#[derive(Default)]
struct Placeholders {
    names: HashMap<String, String>,
    values: HashMap<String, AttributeValue>,
    slots: HashMap<String, String>,
}

impl Placeholders {
    /// `#name` for a fixed attribute name.
    fn attr(&mut self, name: &str) -> String {
        let placeholder = format!("#{name}");
        self.names.insert(placeholder.clone(), name.to_owned());
        placeholder
    }

    /// `#holders.#hN` for a slot.
    fn slot(&mut self, identity: &Identity) -> String {
        let holders = self.attr(attr::HOLDERS);
        let key = identity.slot_key();
        let next = self.slots.len();
        let placeholder = self
            .slots
            .entry(key.clone())
            .or_insert_with(|| format!("#h{next}"))
            .clone();
        self.names.insert(placeholder.clone(), key);
        format!("{holders}.{placeholder}")
    }

    /// A new `:vN` for a value.
    fn value(&mut self, value: AttributeValue) -> String {
        let placeholder = format!(":v{}", self.values.len());
        self.values.insert(placeholder.clone(), value);
        placeholder
    }
}

/// The write as one `UpdateItem`: the format check and the write's checks as its condition, the
/// version increment and the write's changes as its update.
pub fn render(write: &Write) -> Result<Rendered, StoreError> {
    let mut p = Placeholders::default();
    let format = p.attr(attr::FORMAT);
    let format_value = p.value(number(FORMAT));
    let mut conditions = vec![format!("{format} = {format_value}")];
    for check in &write.checks {
        conditions.push(match check {
            Check::NotHolding(identity) => format!("attribute_not_exists({})", p.slot(identity)),
            Check::Fits { limit, weight } => {
                let used = p.attr(attr::USED);
                let room = p.value(number(limit.get() - weight.get()));
                format!("{used} <= {room}")
            }
            Check::Room => {
                let (held, young, old) = (
                    p.attr(attr::HELD_BYTES),
                    p.attr(attr::YOUNG),
                    p.attr(attr::OLD),
                );
                let room = p.value(number(HELD_BYTES_BUDGET - MAX_HELD_BYTES));
                let fences = p.value(number(FENCES_PER_GENERATION));
                // `size` of a missing set is no number to compare (moto refuses the request).
                format!(
                    "({held} <= {room} \
                     AND (attribute_not_exists({young}) OR size({young}) <= {fences}) \
                     AND (attribute_not_exists({old}) OR size({old}) <= {fences}))"
                )
            }
            Check::Spaced { rate, now_ms } => {
                let started = p.attr(attr::STARTED_AT);
                let since = p.value(number(now_ms.saturating_sub(rate.spacing_ms())));
                format!("(attribute_not_exists({started}) OR {started} <= {since})")
            }
            Check::HoldsWeight { identity, weight } => {
                let slot = p.slot(identity);
                let low = p.value(number(weight_floor(*weight)));
                let high = p.value(number(weight_floor(*weight) + WEIGHT_SPAN - 1));
                format!("{slot} BETWEEN {low} AND {high}")
            }
            Check::NotFenced(key) => {
                let (young, old) = (p.attr(attr::YOUNG), p.attr(attr::OLD));
                let key = p.value(binary(key));
                format!("NOT contains({young}, {key}) AND NOT contains({old}, {key})")
            }
            Check::RotatedBefore { deadline_ms } => {
                let rotated = p.attr(attr::ROTATED_AT);
                let deadline = p.value(number(deadline_ms));
                format!("(attribute_not_exists({rotated}) OR {rotated} < {deadline})")
            }
            Check::LastRotation(None) => {
                format!("attribute_not_exists({})", p.attr(attr::ROTATED_AT))
            }
            Check::LastRotation(Some(at_ms)) => {
                let rotated = p.attr(attr::ROTATED_AT);
                format!("{rotated} = {}", p.value(number(at_ms)))
            }
            Check::QueueEmpty => {
                let waiting = p.attr(attr::WAITING);
                let zero = p.value(number(0));
                format!("(attribute_not_exists({waiting}) OR {waiting} = {zero})")
            }
            Check::Busy { terms, now_ms } => {
                let (used, waiting) = (p.attr(attr::USED), p.attr(attr::WAITING));
                let room = p.value(number(terms.room()));
                let zero = p.value(number(0));
                let (held, young, old) = (
                    p.attr(attr::HELD_BYTES),
                    p.attr(attr::YOUNG),
                    p.attr(attr::OLD),
                );
                let held_room = p.value(number(HELD_BYTES_BUDGET - MAX_HELD_BYTES));
                let fences = p.value(number(FENCES_PER_GENERATION));
                // The negation of the acquire's checks of the weight, the room and the line.
                let mut busy = format!(
                    "{used} > {room} OR {held} > {held_room} \
                     OR (attribute_exists({young}) AND size({young}) > {fences}) \
                     OR (attribute_exists({old}) AND size({old}) > {fences}) \
                     OR {waiting} > {zero}"
                );
                if let Some(rate) = terms.rate {
                    let started = p.attr(attr::STARTED_AT);
                    let since = p.value(number(now_ms.saturating_sub(rate.spacing_ms())));
                    busy.push_str(&format!(" OR {started} > {since}"));
                }
                format!("({busy})")
            }
            // The waiter's record is another item: its check goes with its own action (see
            // `queue::transaction`).
            Check::NotQueued(_) | Check::Queued(_) | Check::QueuedWith { .. } => continue,
        });
    }

    let version = p.attr(attr::VERSION);
    let one = p.value(number(1));
    let mut set = vec![format!("{version} = {version} + {one}")];
    let (mut remove, mut add, mut delete) = (Vec::new(), Vec::new(), Vec::new());
    let mut fences_added = BTreeSet::new();
    let (mut waiting_by, mut used_by, mut bytes_by): (i64, i64, i64) = (0, 0, 0);
    for change in &write.changes {
        match change {
            Change::PutHolder {
                identity,
                acquired_at_ms,
                weight,
            } => {
                // The version before this write plus this constant is the holding: token = the
                // new version, see TOKEN_SPAN.
                let constant = pack(&Holding {
                    token: FencingToken(1),
                    acquired_at_ms: *acquired_at_ms,
                    weight: *weight,
                });
                let slot = p.slot(identity);
                let constant = p.value(number(constant));
                set.push(format!("{slot} = {version} + {constant}"));
                let started = p.attr(attr::STARTED_AT);
                set.push(format!("{started} = {}", p.value(number(acquired_at_ms))));
                used_by += i64::from(weight.get());
                bytes_by += identity.held_bytes() as i64;
            }
            Change::SetLimit(limit) => {
                let name = p.attr(attr::LIMIT);
                set.push(format!("{name} = {}", p.value(number(limit.get()))));
            }
            Change::SetRate(rate) => {
                let name = p.attr(attr::SPACING);
                match rate {
                    Some(rate) => {
                        set.push(format!("{name} = {}", p.value(number(rate.spacing_ms()))))
                    }
                    None => remove.push(name),
                }
            }
            Change::RemoveHolder { identity, weight } => {
                remove.push(p.slot(identity));
                used_by -= i64::from(weight.get());
                bytes_by -= identity.held_bytes() as i64;
            }
            Change::Enqueue(_) => waiting_by += 1,
            Change::Dequeue(_) => waiting_by -= 1,
            // Only the waiter's record changes (and the version, as for every write).
            Change::Repark { .. } => {}
            Change::AddFence(key) => {
                fences_added.insert(*key);
            }
            Change::Rotate { young_seen, at_ms } => {
                let old = p.attr(attr::OLD);
                if young_seen.is_empty() {
                    remove.push(old);
                } else {
                    let young = p.attr(attr::YOUNG);
                    let seen = p.value(binary_set(young_seen));
                    set.push(format!("{old} = {seen}"));
                    delete.push(format!("{young} {seen}"));
                }
                let rotated = p.attr(attr::ROTATED_AT);
                set.push(format!("{rotated} = {}", p.value(number(at_ms))));
            }
        }
    }
    if !fences_added.is_empty() {
        if !delete.is_empty() {
            // DynamoDB refuses two actions on one attribute; the protocol never asks for it.
            return Err(StoreError::Unexpected {
                lock: write.lock.to_string(),
                problem: "a write both adds fences and rotates them".to_owned(),
            });
        }
        let young = p.attr(attr::YOUNG);
        add.push(format!("{young} {}", p.value(binary_set(&fences_added))));
    }
    for (name, by) in [
        (attr::WAITING, waiting_by),
        (attr::USED, used_by),
        (attr::HELD_BYTES, bytes_by),
    ] {
        if by != 0 {
            let name = p.attr(name);
            add.push(format!("{name} {}", p.value(number(by))));
        }
    }
    let mut update = format!("SET {}", set.join(", "));
    for (keyword, clauses) in [("REMOVE", remove), ("ADD", add), ("DELETE", delete)] {
        if !clauses.is_empty() {
            update.push_str(&format!(" {keyword} {}", clauses.join(", ")));
        }
    }
    Ok(Rendered {
        condition: within_limits(&write.lock, "ConditionExpression", conditions.join(" AND "))?,
        update: within_limits(&write.lock, "UpdateExpression", update)?,
        names: p.names,
        values: p.values,
    })
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
                .condition_expression("attribute_not_exists(#lock)")
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
                        && conflicts < queue::CONFLICT_ROUNDS =>
                {
                    queue::backoff(conflicts).await;
                    conflicts += 1;
                    continue;
                }
                Err(e) => Err(self.failed("PutItem", DisplayErrorContext(e))),
            };
        }
    }
}

impl ItemStore for DynamoStore {
    async fn load(&self, lock: &LockName) -> Result<Option<SemaphoreItem>, StoreError> {
        let out = self
            .client
            .get_item()
            .table_name(&self.table)
            .set_key(Some(self.key(lock)))
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| self.failed("GetItem", DisplayErrorContext(e)))?;
        out.item().map(decode).transpose()
    }

    async fn write(&self, write: &Write) -> Result<WriteResult, StoreError> {
        if write.waiter_key().is_some() {
            return self.transact(write).await;
        }
        let rendered = render(write)?;
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
                                    current: decode(current)?,
                                })
                            }
                            Some(current) => {
                                return Ok(WriteResult::Refused {
                                    current: decode(current)?,
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
                        if conflicts < queue::CONFLICT_ROUNDS =>
                    {
                        queue::backoff(conflicts).await;
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

    async fn waiters(
        &self,
        lock: &LockName,
        after: Option<crate::queue::QueueKey>,
        limit: usize,
    ) -> Result<Vec<crate::queue::Waiter>, StoreError> {
        self.query_waiters(lock, after, limit).await
    }

    async fn list(&self) -> Result<Vec<Result<SemaphoreItem, StoreError>>, StoreError> {
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
            items.extend(page.items().iter().map(decode));
            match page.last_evaluated_key() {
                Some(key) if !key.is_empty() => start = Some(key.clone()),
                _ => return Ok(items),
            }
        }
    }
}

pub(crate) fn number(n: impl ToString) -> AttributeValue {
    AttributeValue::N(n.to_string())
}

pub(crate) fn string(s: &str) -> AttributeValue {
    AttributeValue::S(s.to_owned())
}

fn binary(key: &FenceKey) -> AttributeValue {
    AttributeValue::B(Blob::new(key.as_bytes().to_vec()))
}

fn binary_set(keys: &BTreeSet<FenceKey>) -> AttributeValue {
    AttributeValue::Bs(
        keys.iter()
            .map(|key| Blob::new(key.as_bytes().to_vec()))
            .collect(),
    )
}

/// The DynamoDB attributes of an item. Empty fence generations are left out (DynamoDB has no
/// empty sets); the holder map is always there, since writes set and remove entries in it.
pub fn encode(item: &SemaphoreItem) -> HashMap<String, AttributeValue> {
    let holders = item
        .holders
        .iter()
        .map(|(identity, holding)| (identity.slot_key(), number(pack(holding))))
        .collect();
    let mut attrs = HashMap::from([
        (attr::LOCK.to_owned(), string(item.lock.as_str())),
        (attr::FORMAT.to_owned(), number(FORMAT)),
        (attr::VERSION.to_owned(), number(item.version.0)),
        (attr::HOLDERS.to_owned(), AttributeValue::M(holders)),
        (attr::USED.to_owned(), number(item.used)),
        (attr::HELD_BYTES.to_owned(), number(item.held_bytes)),
    ]);
    if let Some(rate) = item.rate {
        attrs.insert(attr::SPACING.to_owned(), number(rate.spacing_ms()));
    }
    if let Some(at_ms) = item.started_at_ms {
        attrs.insert(attr::STARTED_AT.to_owned(), number(at_ms));
    }
    if let Some(limit) = item.limit {
        attrs.insert(attr::LIMIT.to_owned(), number(limit.get()));
    }
    for (name, keys) in [
        (attr::YOUNG, &item.fences.young),
        (attr::OLD, &item.fences.old),
    ] {
        if !keys.is_empty() {
            attrs.insert(name.to_owned(), binary_set(keys));
        }
    }
    if let Some(at_ms) = item.fences.rotated_at_ms {
        attrs.insert(attr::ROTATED_AT.to_owned(), number(at_ms));
    }
    if item.waiting > 0 {
        attrs.insert(attr::WAITING.to_owned(), number(item.waiting));
    }
    attrs
}

/// Reads an item back, checking that it is one of ours, of this format.
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
    match attrs.get(attr::FORMAT) {
        Some(_) => {
            let format = get_number(attrs, attr::FORMAT).map_err(&corrupt)?;
            if format == 2 {
                return Err(corrupt(
                    "item format 2, written before weighted permits (it keeps no `used`): delete \
                     the item once no execution uses the lock, or use a new lock name"
                        .to_owned(),
                ));
            }
            if format == 3 {
                return Err(corrupt(
                    "item format 3, written before the item's size budget (it keeps no \
                     `held_bytes`): delete the item once no execution uses the lock, or use a \
                     new lock name"
                        .to_owned(),
                ));
            }
            if format != u128::from(FORMAT) {
                return Err(corrupt(format!(
                    "item format {format}, where this version reads format {FORMAT}"
                )));
            }
        }
        // Version 1's items: a `count` and a binary `fences` attribute, no format.
        None if attrs.contains_key("count") || attrs.contains_key("fences") => {
            return Err(StoreError::OldFormat { lock: lock_name })
        }
        None => return Err(corrupt(format!("attribute {} is missing", attr::FORMAT))),
    }
    let lock = LockName::new(lock_name.clone()).map_err(|e| corrupt(e.to_string()))?;
    let version = get_number(attrs, attr::VERSION).map_err(&corrupt)?;
    if version >= TOKEN_SPAN {
        return Err(corrupt(format!("version {version} is out of range")));
    }
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
        let identity = Identity::from_slot_key(key)
            .map_err(|problem| corrupt(format!("holder key {key:?}: {problem}")))?;
        let packed = value
            .as_n()
            .ok()
            .and_then(|n| n.parse::<u128>().ok())
            .ok_or_else(|| corrupt(format!("holder {key:?} is not a whole number")))?;
        let (weight, rest) = (packed / WEIGHT_SPAN + 1, packed % WEIGHT_SPAN);
        let (token, acquired_at_ms) = (rest % TOKEN_SPAN, rest / TOKEN_SPAN);
        let holding = Holding {
            token: FencingToken(u64::try_from(token).map_err(|e| corrupt(e.to_string()))?),
            acquired_at_ms: u64::try_from(acquired_at_ms).map_err(|e| corrupt(e.to_string()))?,
            weight: i64::try_from(weight)
                .map_err(|e| e.to_string())
                .and_then(|w| Weight::new(w).map_err(|e| e.to_string()))
                .map_err(|problem| corrupt(format!("holder {key:?}: {problem}")))?,
        };
        holders.insert(identity, holding);
    }
    let mut fences = Fences {
        young: get_fences(attrs, attr::YOUNG).map_err(&corrupt)?,
        old: get_fences(attrs, attr::OLD).map_err(&corrupt)?,
        rotated_at_ms: None,
    };
    if attrs.contains_key(attr::ROTATED_AT) {
        let at = get_number(attrs, attr::ROTATED_AT).map_err(&corrupt)?;
        fences.rotated_at_ms = Some(u64::try_from(at).map_err(|e| corrupt(e.to_string()))?);
    }
    let optional = |name: &str| -> Result<Option<u64>, StoreError> {
        match attrs.get(name) {
            None => Ok(None),
            Some(_) => {
                let n = get_number(attrs, name).map_err(&corrupt)?;
                Ok(Some(u64::try_from(n).map_err(|e| corrupt(e.to_string()))?))
            }
        }
    };
    let waiting = optional(attr::WAITING)?.unwrap_or(0);
    let used = optional(attr::USED)?
        .ok_or_else(|| corrupt(format!("attribute {} is missing", attr::USED)))?;
    let rate = optional(attr::SPACING)?
        .map(Rate::from_spacing_ms)
        .transpose()
        .map_err(|e| corrupt(e.to_string()))?;
    let started_at_ms = optional(attr::STARTED_AT)?;
    let held_bytes = optional(attr::HELD_BYTES)?
        .ok_or_else(|| corrupt(format!("attribute {} is missing", attr::HELD_BYTES)))?;
    Ok(SemaphoreItem {
        lock,
        limit,
        version: Version(u64::try_from(version).map_err(|e| corrupt(e.to_string()))?),
        holders,
        fences,
        waiting,
        used,
        rate,
        started_at_ms,
        held_bytes,
    })
}

fn get_fences(
    attrs: &HashMap<String, AttributeValue>,
    name: &str,
) -> Result<BTreeSet<FenceKey>, String> {
    let Some(value) = attrs.get(name) else {
        return Ok(BTreeSet::new());
    };
    let blobs = value
        .as_bs()
        .map_err(|_| format!("attribute {name} is not a binary set"))?;
    blobs
        .iter()
        .map(|blob| {
            <[u8; FenceKey::LEN]>::try_from(blob.as_ref())
                .map(FenceKey::from_bytes)
                .map_err(|_| {
                    format!(
                        "attribute {name} holds a {}-byte fence; fences are {} bytes",
                        blob.as_ref().len(),
                        FenceKey::LEN
                    )
                })
        })
        .collect()
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

/// Read units one strongly consistent read of an item of `bytes` costs: one per started 4 KB.
pub fn read_units(bytes: usize) -> usize {
    bytes.div_ceil(4096).max(1)
}

pub(crate) fn get_number(
    attrs: &HashMap<String, AttributeValue>,
    name: &str,
) -> Result<u128, String> {
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

    fn identity() -> Identity {
        Identity::new(
            HolderId::new("arn:aws:states:us-east-1:1:execution:m:e#1").unwrap(),
            AcquisitionId::new("u-1").unwrap(),
        )
    }

    #[test]
    fn an_item_survives_encoding() {
        let mut item = SemaphoreItem::empty(LockName::new("l").unwrap());
        item.version = Version(7);
        item.limit = Some(Limit::new(3).unwrap());
        let id = identity();
        item.holders.insert(
            id.clone(),
            Holding {
                token: FencingToken(6),
                acquired_at_ms: 1_700_000_000_123,
                weight: Weight::new(4).unwrap(),
            },
        );
        item.fences.young.insert(FenceKey::acquisition(&id));
        item.fences
            .old
            .insert(FenceKey::execution(&id.holder, crate::Run::FIRST));
        item.fences.rotated_at_ms = Some(1_700_000_000_000);
        assert_eq!(decode(&encode(&item)).unwrap(), item);
        let empty = SemaphoreItem::empty(LockName::new("l").unwrap());
        assert_eq!(decode(&encode(&empty)).unwrap(), empty);
    }

    #[test]
    fn a_holding_is_one_number_whose_last_fifteen_digits_are_the_token() {
        let mut item = SemaphoreItem::empty(LockName::new("l").unwrap());
        item.holders.insert(
            identity(),
            Holding {
                token: FencingToken(42),
                acquired_at_ms: 1_796_000_123_456,
                weight: Weight::ONE,
            },
        );
        let attrs = encode(&item);
        let entry = &attrs[attr::HOLDERS].as_m().unwrap()[&identity().slot_key()];
        assert_eq!(entry.as_n().unwrap(), "1796000123456000000000000042");
    }

    #[test]
    fn an_acquire_renders_as_one_update_with_every_check_in_its_condition() {
        let lock = LockName::new("l").unwrap();
        let write = crate::protocol::acquire(
            &lock,
            &identity(),
            crate::Run::FIRST,
            Limit::new(5).unwrap(),
            1_000,
            1_500,
            &crate::protocol::Timing::default(),
        )
        .unwrap();
        let r = render(&write).unwrap();
        assert_eq!(
            r.condition,
            "#format = :v0 AND NOT contains(#young, :v1) AND NOT contains(#old, :v1) \
             AND NOT contains(#young, :v2) AND NOT contains(#old, :v2) \
             AND attribute_not_exists(#holders.#h0) \
             AND (attribute_not_exists(#rotated_at) OR #rotated_at < :v3) \
             AND #used <= :v4 \
             AND (#held_bytes <= :v5 AND (attribute_not_exists(#young) OR size(#young) <= :v6) \
             AND (attribute_not_exists(#old) OR size(#old) <= :v6)) \
             AND (attribute_not_exists(#waiting) OR #waiting = :v7)"
        );
        assert_eq!(
            r.update,
            "SET #version = #version + :v8, #holders.#h0 = #version + :v9, #started_at = :v10, \
             #limit = :v11 REMOVE #spacing_ms ADD #used :v12, #held_bytes :v13"
        );
        assert_eq!(r.values[":v4"], number(4), "room: limit 5 less weight 1");
        assert_eq!(
            r.values[":v5"],
            number(HELD_BYTES_BUDGET - MAX_HELD_BYTES),
            "room for the largest entry"
        );
        assert_eq!(r.values[":v6"], number(FENCES_PER_GENERATION));
        assert_eq!(r.values[":v12"], number(1));
        assert_eq!(r.values[":v13"], number(identity().held_bytes()));
        assert_eq!(
            identity().held_bytes(),
            identity().slot_key().len() as u64 + 18
        );
        assert_eq!(r.names["#h0"], identity().slot_key());
        assert_eq!(r.values[":v3"], number(9_000));
        assert_eq!(r.values[":v9"], number(1_500u128 * TOKEN_SPAN + 1));
    }

    #[test]
    fn a_weighted_rate_limited_acquire_checks_room_and_spacing_and_adds_its_weight() {
        let lock = LockName::new("l").unwrap();
        let terms = crate::Terms::new(
            Limit::new(10).unwrap(),
            Weight::new(4).unwrap(),
            Some(Rate::per_second(2.0).unwrap()),
        )
        .unwrap();
        let write = crate::protocol::acquire(
            &lock,
            &identity(),
            crate::Run::FIRST,
            terms,
            1_000,
            1_500,
            &crate::protocol::Timing::default(),
        )
        .unwrap();
        let r = render(&write).unwrap();
        assert!(
            r.condition.ends_with(
                "AND (attribute_not_exists(#waiting) OR #waiting = :v7) \
                 AND (attribute_not_exists(#started_at) OR #started_at <= :v8)"
            ),
            "{}",
            r.condition
        );
        assert!(r
            .condition
            .contains("AND #used <= :v4 AND (#held_bytes <= :v5 "));
        assert_eq!(r.values[":v4"], number(6));
        assert_eq!(
            r.values[":v8"],
            number(1_000),
            "now less the 500 ms spacing"
        );
        assert!(r.update.contains("#spacing_ms = "), "{}", r.update);
        assert!(
            r.update.ends_with("ADD #used :v14, #held_bytes :v15"),
            "{}",
            r.update
        );
        assert_eq!(r.values[":v14"], number(4));
        assert_eq!(
            r.values[":v10"],
            number(3 * WEIGHT_SPAN + 1_500 * TOKEN_SPAN + 1),
            "the holding leads with its weight"
        );
    }

    /// DynamoDB refuses a request that declares a placeholder it does not use.
    #[test]
    fn every_kind_of_write_uses_every_placeholder_it_declares() {
        let lock = LockName::new("l").unwrap();
        let timing = crate::protocol::Timing::default();
        let holder = identity().holder;
        let mut quiet = SemaphoreItem::empty(lock.clone());
        quiet
            .fences
            .old
            .insert(FenceKey::execution(&holder, crate::Run::FIRST));
        quiet.fences.rotated_at_ms = Some(1);
        let mut busy = quiet.clone();
        busy.fences.young.insert(FenceKey::acquisition(&identity()));
        let writes = [
            crate::protocol::acquire(
                &lock,
                &identity(),
                crate::Run::FIRST,
                Limit::new(5).unwrap(),
                1,
                2,
                &timing,
            )
            .unwrap(),
            crate::protocol::release(&lock, &identity(), Weight::new(3).unwrap()),
            crate::protocol::release_unheld(&lock, &identity()),
            crate::protocol::cleanup_fence(&lock, &holder, crate::Run::FIRST),
            crate::protocol::cleanup_free(&lock, &[(identity(), Weight::ONE)]),
            crate::protocol::rotation(&busy, 60_000, &timing).unwrap(),
            crate::protocol::rotation(&quiet, 60_000, &timing).unwrap(),
        ];
        for write in &writes {
            let r = render(write).unwrap();
            for name in r.names.keys().chain(r.values.keys()) {
                assert!(
                    r.condition.contains(name.as_str()) || r.update.contains(name.as_str()),
                    "{name} unused in {r:?}"
                );
            }
        }
    }

    #[test]
    fn release_cleanup_and_rotation_render_without_checks_or_with_the_last_rotation() {
        let lock = LockName::new("l").unwrap();
        let r = render(&crate::protocol::release(
            &lock,
            &identity(),
            Weight::new(2).unwrap(),
        ))
        .unwrap();
        assert_eq!(
            r.condition,
            "#format = :v0 AND #holders.#h0 BETWEEN :v1 AND :v2"
        );
        assert_eq!(r.values[":v1"], number(WEIGHT_SPAN));
        assert_eq!(r.values[":v2"], number(2 * WEIGHT_SPAN - 1));
        assert_eq!(
            r.update,
            "SET #version = #version + :v3 REMOVE #holders.#h0 ADD #young :v4, #used :v5, \
             #held_bytes :v6"
        );
        assert_eq!(r.values[":v5"], number(-2));
        assert_eq!(r.values[":v6"], number(-(identity().held_bytes() as i64)));
        let mut item = SemaphoreItem::empty(lock.clone());
        item.fences.young.insert(FenceKey::acquisition(&identity()));
        item.fences.rotated_at_ms = Some(5);
        let rotation =
            crate::protocol::rotation(&item, 60_000, &crate::protocol::Timing::default()).unwrap();
        let r = render(&rotation).unwrap();
        assert_eq!(r.condition, "#format = :v0 AND #rotated_at = :v1");
        assert_eq!(
            r.update,
            "SET #version = #version + :v2, #old = :v3, #rotated_at = :v4 DELETE #young :v3"
        );
    }

    /// The slots of one holder, with the longest identities and weights accepted.
    fn slots(n: usize) -> Vec<(Identity, Weight)> {
        (0..n)
            .map(|i| {
                let holder = format!("{i:0>width$}", width = crate::input::MAX_HOLDER_BYTES);
                let acquisition = format!("{i:0>w$}", w = crate::input::MAX_ACQUISITION_BYTES);
                let identity = Identity::new(
                    HolderId::new(holder).unwrap(),
                    AcquisitionId::new(acquisition).unwrap(),
                );
                (identity, Weight::new(1000).unwrap())
            })
            .collect()
    }

    #[test]
    fn a_cleanup_write_of_the_most_slots_it_removes_fits_dynamodbs_expression_limits() {
        let lock = LockName::new("l".repeat(crate::input::MAX_LOCK_NAME_BYTES)).unwrap();
        let chunk = slots(crate::protocol::MAX_SLOTS_PER_FREE);
        let r = render(&crate::protocol::cleanup_free(&lock, &chunk)).unwrap();
        for expression in [&r.condition, &r.update] {
            assert!(
                expression.len() <= MAX_EXPRESSION_BYTES,
                "{}",
                expression.len()
            );
            assert!(operators(expression) <= MAX_EXPRESSION_OPERATORS);
        }
    }

    /// The limit the issue met: one write naming 150 slots is a ConditionExpression of about
    /// 6 KB, which DynamoDB refuses. It is a typed error here, and no request is sent.
    #[test]
    fn a_write_over_4_kb_is_a_typed_error_not_a_request() {
        let lock = LockName::new("l").unwrap();
        let err = render(&crate::protocol::cleanup_free(&lock, &slots(150))).unwrap_err();
        match err {
            StoreError::ExpressionTooLarge {
                expression, bytes, ..
            } => {
                assert_eq!(expression, "ConditionExpression");
                assert!(bytes > MAX_EXPRESSION_BYTES, "{bytes}");
            }
            other => panic!("expected ExpressionTooLarge, got {other:?}"),
        }
    }

    #[test]
    fn operators_are_counted_generously() {
        assert_eq!(operators("a = :b"), 1);
        assert_eq!(
            operators("#h BETWEEN :a AND :b AND attribute_not_exists(#x)"),
            4
        );
        assert_eq!(operators("NOT contains(#y, :k) OR size(#o) <= :n"), 5);
    }

    #[test]
    fn a_version_1_item_is_named_as_such() {
        let attrs = HashMap::from([
            (attr::LOCK.to_owned(), string("old-lock")),
            ("version".to_owned(), number(3)),
            ("count".to_owned(), number(0)),
            ("holders".to_owned(), AttributeValue::M(HashMap::new())),
            ("fences".to_owned(), AttributeValue::B(Blob::new(vec![]))),
        ]);
        let err = decode(&attrs).unwrap_err();
        assert!(matches!(err, StoreError::OldFormat { ref lock } if lock == "old-lock"));
        assert!(err.to_string().contains("version 1"), "{err}");
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
        assert_eq!(read_units(4096), 1);
        assert_eq!(read_units(4097), 2);
    }
}
