//! The expressions DynamoDB evaluates for a [`Write`]: its checks as a condition and its changes
//! as an update of the lock's item, and the check and change of the waiter's record it names.
//! Every expression a write is sent with is built here, from the typed write, and nowhere else,
//! within DynamoDB's limits on an expression.

use std::collections::{BTreeSet, HashMap};

use aws_sdk_dynamodb::types::{
    AttributeValue, Delete, Put, ReturnValuesOnConditionCheckFailure, TransactWriteItem, Update,
};

use super::codec::{
    attr, binary, binary_set, config_value, encode_waiter, format_of, number, pack, queue_attr,
    slot_range, stored_version, string,
};
use crate::error::StoreError;
use crate::input::{LockName, Rate};
use crate::item::{
    FenceKey, FencingToken, Holding, Identity, Layout, FENCES_PER_GENERATION, HELD_BYTES_BUDGET,
    MAX_HELD_BYTES,
};
use crate::queue::{QueueKey, WaiterId, Wakeup};
use crate::write::{Change, Check, Write};

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
            max_bytes: MAX_EXPRESSION_BYTES,
            max_operators: MAX_EXPRESSION_OPERATORS,
        });
    }
    Ok(text)
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
        self.entry(attr::HOLDERS, identity)
    }

    /// `#leases.#hN` for a slot's lease (the same `#hN` as its slot).
    fn lease(&mut self, identity: &Identity) -> String {
        self.entry(attr::LEASES, identity)
    }

    /// `#<map>.#hN` for the entry of a slot in one of the item's maps keyed by slot.
    fn entry(&mut self, map: &str, identity: &Identity) -> String {
        let holders = self.attr(map);
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

/// Whether a check is rendered as itself or as its negation (a refusal's reason, `Check::Busy`).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Holds {
    Yes,
    No,
}

/// `Check::Room`: the holders' bytes within the budget and each fence generation within its
/// bound, or its negation. `size` of a missing set is no number to compare (moto refuses the
/// request), hence the existence tests.
fn room(p: &mut Placeholders, holds: Holds) -> String {
    let (held, young, old) = (
        p.attr(attr::HELD_BYTES),
        p.attr(attr::YOUNG),
        p.attr(attr::OLD),
    );
    let budget = p.value(number(HELD_BYTES_BUDGET - MAX_HELD_BYTES));
    let fences = p.value(number(FENCES_PER_GENERATION));
    match holds {
        Holds::Yes => format!(
            "{held} <= {budget} \
             AND (attribute_not_exists({young}) OR size({young}) <= {fences}) \
             AND (attribute_not_exists({old}) OR size({old}) <= {fences})"
        ),
        Holds::No => format!(
            "{held} > {budget} \
             OR (attribute_exists({young}) AND size({young}) > {fences}) \
             OR (attribute_exists({old}) AND size({old}) > {fences})"
        ),
    }
}

/// `Check::Spaced`: no start since `now_ms` less the rate's spacing, or its negation (a start
/// there: a missing `started_at` compares as false).
fn spaced(p: &mut Placeholders, rate: &Rate, now_ms: u64, holds: Holds) -> String {
    let started = p.attr(attr::STARTED_AT);
    let since = p.value(number(now_ms.saturating_sub(rate.spacing_ms())));
    match holds {
        Holds::Yes => format!("attribute_not_exists({started}) OR {started} <= {since}"),
        Holds::No => format!("{started} > {since}"),
    }
}

/// `Check::NotFenced`: the key in neither generation.
fn not_fenced(p: &mut Placeholders, key: &FenceKey) -> String {
    let (young, old) = (p.attr(attr::YOUNG), p.attr(attr::OLD));
    let key = p.value(binary(key));
    format!("NOT contains({young}, {key}) AND NOT contains({old}, {key})")
}

/// A write only a gate lock sends, rendered for the item layout: sent again as a gate's.
fn gate_only(write: &Write) -> StoreError {
    StoreError::WrongLayout {
        lock: write.lock.to_string(),
        layout: Layout::Gate,
    }
}

/// The write as one `UpdateItem`: the format check and the write's checks as its condition, the
/// version increment and the write's changes as its update.
pub fn render(write: &Write) -> Result<Rendered, StoreError> {
    render_in(write, Layout::Item, None)
}

/// Whether the check or change is a holding's: in a gate, its holding item's
/// (see [`super::holdings`]), not the gate's.
pub(super) fn is_holdings(check: &Check) -> bool {
    matches!(
        check,
        Check::NotHolding(_)
            | Check::NotReleased(_)
            | Check::HoldsSlot { .. }
            | Check::LeaseUntil { .. }
            | Check::TombstoneAt { .. }
            | Check::RotatedSince { .. }
    )
}

/// The write's part on the lock's item in `layout`. In a gate, the checks and changes of the
/// holdings are left to their own items, an admission adds its weight to `used` and sets the
/// version to `token` (proposed by the writer: a transaction hands back no version to take a
/// token from), on the check that the version is below it, so that tokens still rise with
/// every admission; every other write bumps the version by one.
pub(super) fn render_in(
    write: &Write,
    layout: Layout,
    token: Option<FencingToken>,
) -> Result<Rendered, StoreError> {
    let gate = layout == Layout::Gate;
    let mut p = Placeholders::default();
    // Every write checks the format: it must not land on an item of another format (whose
    // attributes it would misread and corrupt), nor in a lock of the other layout; such an item
    // is handed back with the refusal and named by `decode`.
    let format = p.attr(attr::FORMAT);
    let format_value = p.value(number(format_of(layout)));
    let mut conditions = vec![format!("{format} = {format_value}")];
    for check in &write.checks {
        if gate && is_holdings(check) {
            continue;
        }
        conditions.push(match check {
            Check::NotHolding(identity) => format!("attribute_not_exists({})", p.slot(identity)),
            Check::Fits { limit, weight } => {
                let used = p.attr(attr::USED);
                let room = p.value(number(limit.get() - weight.get()));
                format!("{used} <= {room}")
            }
            Check::Room => format!("({})", room(&mut p, Holds::Yes)),
            Check::Spaced { rate, now_ms } => {
                format!("({})", spaced(&mut p, rate, *now_ms, Holds::Yes))
            }
            Check::HoldsSlot {
                identity,
                token,
                weight,
            } => {
                let slot = p.slot(identity);
                let (low, high) = slot_range(*token, *weight);
                let (low, high) = (p.value(number(low)), p.value(number(high)));
                format!("{slot} BETWEEN {low} AND {high}")
            }
            Check::NotFenced(key) => not_fenced(&mut p, key),
            Check::NotReleased(identity) => not_fenced(&mut p, &FenceKey::acquisition(identity)),
            Check::TombstoneAt { .. } | Check::RotatedSince { .. } => return Err(gate_only(write)),
            // Nothing held, nobody in line, no fence: an empty set is no attribute in DynamoDB.
            Check::Idle => {
                let (used, holders, waiting) = (
                    p.attr(attr::USED),
                    p.attr(attr::HOLDERS),
                    p.attr(attr::WAITING),
                );
                let (young, old) = (p.attr(attr::YOUNG), p.attr(attr::OLD));
                let zero = p.value(number(0));
                format!(
                    "{used} = {zero} AND size({holders}) = {zero} \
                     AND (attribute_not_exists({waiting}) OR {waiting} = {zero}) \
                     AND attribute_not_exists({young}) AND attribute_not_exists({old})"
                )
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
            Check::LeaseUntil { identity, until_ms } => {
                let lease = p.lease(identity);
                format!("{lease} = {}", p.value(number(until_ms)))
            }
            // The whole map at once: a configuration is always written whole.
            Check::Configured(None) => {
                format!("attribute_not_exists({})", p.attr(attr::CONFIG))
            }
            Check::Configured(Some(config)) => {
                let name = p.attr(attr::CONFIG);
                format!("{name} = {}", p.value(config_value(config)))
            }
            Check::QueueEmpty => {
                let waiting = p.attr(attr::WAITING);
                let zero = p.value(number(0));
                format!("(attribute_not_exists({waiting}) OR {waiting} = {zero})")
            }
            Check::Busy { terms, now_ms } => {
                let (used, waiting) = (p.attr(attr::USED), p.attr(attr::WAITING));
                let room_left = p.value(number(terms.room()));
                let zero = p.value(number(0));
                // The negation of the acquire's checks of the weight, the room and the line,
                // rendered by the same functions as those checks.
                let no_room = room(&mut p, Holds::No);
                let mut busy = format!("{used} > {room_left} OR {no_room} OR {waiting} > {zero}");
                if let Some(rate) = &terms.rate {
                    busy.push_str(" OR ");
                    busy.push_str(&spaced(&mut p, rate, *now_ms, Holds::No));
                }
                format!("({busy})")
            }
            // The waiter's record is another item: its check goes with its own action (see
            // `record_action`).
            Check::NotQueued(_)
            | Check::Queued(_)
            | Check::QueuedBefore { .. }
            | Check::QueuedWith { .. } => continue,
        });
    }

    let version = p.attr(attr::VERSION);
    let mut set = Vec::new();
    match token.filter(|_| gate) {
        Some(token) => {
            let token = p.value(number(stored_version(token.0)));
            conditions.push(format!("{version} < {token}"));
            set.push(format!("{version} = {token}"));
        }
        None => {
            let one = p.value(number(stored_version(1)));
            set.push(format!("{version} = {version} + {one}"));
        }
    }
    let (mut remove, mut add, mut delete) = (Vec::new(), Vec::new(), Vec::new());
    let mut fences_added = BTreeSet::new();
    let (mut waiting_by, mut used_by, mut bytes_by, mut holdings_by): (i64, i64, i64, i64) =
        (0, 0, 0, 0);
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
                if !gate {
                    let slot = p.slot(identity);
                    let constant = p.value(number(constant));
                    set.push(format!("{slot} = {version} + {constant}"));
                    bytes_by += identity.held_bytes() as i64;
                } else {
                    holdings_by += 1;
                }
                let started = p.attr(attr::STARTED_AT);
                set.push(format!("{started} = {}", p.value(number(acquired_at_ms))));
                used_by += i64::from(weight.get());
            }
            Change::SetLimit(limit) => {
                let name = p.attr(attr::LIMIT);
                set.push(format!("{name} = {}", p.value(number(limit.get()))));
            }
            Change::SetLease { .. }
            | Change::FenceAcquisition { .. }
            | Change::DropTombstone(_)
                if gate => {}
            Change::SetLease { identity, until_ms } => {
                let lease = p.lease(identity);
                set.push(format!("{lease} = {}", p.value(number(until_ms))));
            }
            Change::Configure(config) => {
                let name = p.attr(attr::CONFIG);
                match config {
                    Some(config) => set.push(format!("{name} = {}", p.value(config_value(config)))),
                    None => remove.push(name),
                }
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
            Change::RemoveHolder { weight, .. } if gate => {
                used_by -= i64::from(weight.get());
                holdings_by -= 1;
            }
            Change::RemoveHolder { identity, weight } => {
                remove.push(p.slot(identity));
                // Its lease, if it had one (a REMOVE of a missing map entry is no error).
                remove.push(p.lease(identity));
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
            Change::FenceAcquisition { identity, .. } => {
                fences_added.insert(FenceKey::acquisition(identity));
            }
            Change::DropTombstone(_) => return Err(gate_only(write)),
            // The format says the layout (see `GATE_FORMAT`).
            Change::SetLayout(layout) => {
                let format = p.attr(attr::FORMAT);
                set.push(format!(
                    "{format} = {}",
                    p.value(number(format_of(*layout)))
                ));
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
        (attr::HOLDINGS, holdings_by),
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

/// The action on the waiter's record (in `queue_table`) a write asks for, with its check.
pub(super) fn record_action(
    queue_table: &str,
    write: &Write,
    id: WaiterId,
) -> Result<TransactWriteItem, StoreError> {
    let record_key = HashMap::from([
        (queue_attr::LOCK.to_owned(), string(write.lock.as_str())),
        (queue_attr::WAITER.to_owned(), string(&id.render())),
    ]);
    let place = format!("#{}", queue_attr::PLACE);
    let exists = format!("attribute_exists({place})");
    let mut names = HashMap::from([(place.clone(), queue_attr::PLACE.to_owned())]);
    let mut values = HashMap::new();
    let attempt_name = format!("#{}", queue_attr::ATTEMPT);
    let condition = match write.checks.iter().find(|c| c.waiter_id().is_some()) {
        Some(Check::NotQueued(_)) => format!("attribute_not_exists({place})"),
        Some(Check::Queued(_)) => exists,
        Some(Check::QueuedBefore { attempt, .. }) => {
            names.insert(attempt_name.clone(), queue_attr::ATTEMPT.to_owned());
            values.insert(":attempt".to_owned(), number(attempt.0));
            format!("{exists} AND {attempt_name} < :attempt")
        }
        Some(Check::QueuedWith { wakeup, .. }) => {
            let (name, value) = wakeup_attr(wakeup);
            names.insert(format!("#{name}"), name.to_owned());
            values.insert(":wakeup".to_owned(), value);
            format!("{exists} AND #{name} = :wakeup")
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
                .table_name(queue_table)
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
                .table_name(queue_table)
                .set_key(Some(record_key))
                .condition_expression(condition)
                .set_expression_attribute_names(Some(names))
                .set_expression_attribute_values(values)
                .return_values_on_condition_check_failure(on_failure)
                .build()
                .map_err(built)?,
        ),
        Change::Repark {
            wakeup, attempt, ..
        } => {
            let checks_name = format!("#{}", queue_attr::CHECKS);
            let (name, value) = wakeup_attr(wakeup);
            let token_name = format!("#{name}");
            names.insert(token_name.clone(), name.to_owned());
            names.insert(attempt_name.clone(), queue_attr::ATTEMPT.to_owned());
            names.insert(checks_name.clone(), queue_attr::CHECKS.to_owned());
            let mut values = values.unwrap_or_default();
            values.insert(":new_token".to_owned(), value);
            values.insert(":new_attempt".to_owned(), number(attempt.0));
            values.insert(":one".to_owned(), number(1));
            action.update(
                Update::builder()
                    .table_name(queue_table)
                    .set_key(Some(record_key))
                    .condition_expression(condition)
                    .update_expression(format!(
                        "SET {token_name} = :new_token, {attempt_name} = :new_attempt \
                         ADD {checks_name} :one"
                    ))
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

/// The attribute of a waiter's record that holds its wake-up, and its value.
fn wakeup_attr(wakeup: &Wakeup) -> (&'static str, AttributeValue) {
    match wakeup {
        Wakeup::Task(token) => (queue_attr::TASK_TOKEN, string(token.as_str())),
        Wakeup::Poll { until_ms } => (queue_attr::POLL_UNTIL, number(*until_ms)),
    }
}

/// The key condition of a `Query` of `lock`'s line, after the waiter with key `after` (`None`:
/// from the head), and its placeholders.
pub(super) fn line_after(lock: &LockName, after: Option<QueueKey>) -> KeyCondition {
    let mut condition = "#lock = :lock".to_owned();
    let mut values = HashMap::from([(":lock".to_owned(), string(lock.as_str()))]);
    let mut names = HashMap::from([("#lock".to_owned(), queue_attr::LOCK.to_owned())]);
    if let Some(after) = after {
        condition.push_str(" AND #place > :after");
        values.insert(":after".to_owned(), string(&after.render()));
        names.insert("#place".to_owned(), queue_attr::PLACE.to_owned());
    }
    KeyCondition {
        expression: condition,
        names,
        values,
    }
}

/// A `Query`'s key condition expression, with its placeholders.
pub(super) struct KeyCondition {
    pub expression: String,
    pub names: HashMap<String, String>,
    pub values: HashMap<String, AttributeValue>,
}

/// The condition of the put that creates a lock's item: that there still is none (`#lock`
/// names [`attr::LOCK`]).
pub(super) const ITEM_ABSENT: &str = "attribute_not_exists(#lock)";

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dynamo::codec::{TIME_SPAN, WEIGHT_SPAN};
    use crate::input::{AcquisitionId, HolderId, Limit, LockConfig, Rate, Terms, Weight};
    use crate::item::{FenceKey, Run, SemaphoreItem};
    use crate::protocol::{self, Timing};

    fn identity() -> Identity {
        Identity::new(
            HolderId::new("arn:aws:states:us-east-1:1:execution:m:e#1").unwrap(),
            AcquisitionId::new("u-1").unwrap(),
        )
    }

    #[test]
    fn an_acquire_renders_as_one_update_with_every_check_in_its_condition() {
        let lock = LockName::new("l").unwrap();
        let write = protocol::acquire(
            &lock,
            &identity(),
            Run::FIRST,
            None,
            Limit::new(5).unwrap(),
            1_000,
            1_500,
            &Timing::default(),
        )
        .unwrap();
        let r = render(&write).unwrap();
        assert_eq!(
            r.condition,
            "#format = :v0 AND NOT contains(#young, :v1) AND NOT contains(#old, :v1) \
             AND NOT contains(#young, :v2) AND NOT contains(#old, :v2) \
             AND attribute_not_exists(#holders.#h0) \
             AND (attribute_not_exists(#rotated_at) OR #rotated_at < :v3) \
             AND attribute_not_exists(#config) \
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
        assert_eq!(
            r.values[":v8"],
            number(TIME_SPAN),
            "the version is stored times TIME_SPAN"
        );
        assert_eq!(
            r.values[":v9"],
            number(TIME_SPAN + 1_500),
            "the version before the write, one more, then the time"
        );
    }

    #[test]
    fn a_weighted_rate_limited_acquire_checks_room_and_spacing_and_adds_its_weight() {
        let lock = LockName::new("l").unwrap();
        let terms = Terms::new(
            Limit::new(10).unwrap(),
            Weight::new(4).unwrap(),
            Some(Rate::per_second(2.0).unwrap()),
        )
        .unwrap();
        let write = protocol::acquire(
            &lock,
            &identity(),
            Run::FIRST,
            None,
            terms,
            1_000,
            1_500,
            &Timing::default(),
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
            number(3 * WEIGHT_SPAN + TIME_SPAN + 1_500),
            "the holding leads with its weight"
        );
    }

    /// DynamoDB refuses a request that declares a placeholder it does not use.
    #[test]
    fn every_kind_of_write_uses_every_placeholder_it_declares() {
        let lock = LockName::new("l").unwrap();
        let timing = Timing::default();
        let holder = identity().holder;
        let mut quiet = SemaphoreItem::empty(lock.clone());
        quiet
            .fences
            .old
            .insert(FenceKey::execution(&holder, Run::FIRST));
        quiet.fences.rotated_at_ms = Some(1);
        let mut busy = quiet.clone();
        busy.fences.young.insert(FenceKey::acquisition(&identity()));
        let writes = [
            protocol::acquire(
                &lock,
                &identity(),
                Run::FIRST,
                None,
                Limit::new(5).unwrap(),
                1,
                2,
                &timing,
            )
            .unwrap(),
            protocol::release(
                &lock,
                &identity(),
                FencingToken(4),
                Weight::new(3).unwrap(),
                0,
            ),
            protocol::release_unheld(&lock, &identity(), 0),
            protocol::cleanup_fence(&lock, &holder, Run::FIRST),
            protocol::cleanup_free(&lock, &[(identity(), holding(1))]),
            protocol::rotation(&busy, 60_000, &timing).unwrap(),
            protocol::rotation(&quiet, 60_000, &timing).unwrap(),
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
        let r = render(&protocol::release(
            &lock,
            &identity(),
            FencingToken(7),
            Weight::new(2).unwrap(),
            0,
        ))
        .unwrap();
        assert_eq!(
            r.condition,
            "#format = :v0 AND #holders.#h0 BETWEEN :v1 AND :v2"
        );
        // The slot of weight 2 taken under token 7, at any time (F15).
        assert_eq!(r.values[":v1"], number(WEIGHT_SPAN + 7 * TIME_SPAN));
        assert_eq!(r.values[":v2"], number(WEIGHT_SPAN + 8 * TIME_SPAN - 1));
        assert_eq!(
            r.update,
            "SET #version = #version + :v3 REMOVE #holders.#h0, #leases.#h0 ADD #young :v4, \
             #used :v5, #held_bytes :v6"
        );
        assert_eq!(r.values[":v5"], number(-2));
        assert_eq!(r.values[":v6"], number(-(identity().held_bytes() as i64)));
        let mut item = SemaphoreItem::empty(lock.clone());
        item.fences.young.insert(FenceKey::acquisition(&identity()));
        item.fences.rotated_at_ms = Some(5);
        let rotation = protocol::rotation(&item, 60_000, &Timing::default()).unwrap();
        let r = render(&rotation).unwrap();
        assert_eq!(r.condition, "#format = :v0 AND #rotated_at = :v1");
        assert_eq!(
            r.update,
            "SET #version = #version + :v2, #old = :v3, #rotated_at = :v4 DELETE #young :v3"
        );
    }

    /// A holding of `weight` under the largest token and time a holding number keeps.
    fn holding(weight: u32) -> Holding {
        Holding {
            token: FencingToken((crate::dynamo::codec::TOKEN_SPAN - 1) as u64),
            acquired_at_ms: (TIME_SPAN - 1) as u64,
            weight: Weight::new(i64::from(weight)).unwrap(),
        }
    }

    /// The slots of one holder, with the longest identities, weights and tokens accepted.
    fn slots(n: usize) -> Vec<(Identity, Holding)> {
        (0..n)
            .map(|i| {
                let holder = format!("{i:0>width$}", width = crate::input::MAX_HOLDER_BYTES);
                let acquisition = format!("{i:0>w$}", w = crate::input::MAX_ACQUISITION_BYTES);
                let identity = Identity::new(
                    HolderId::new(holder).unwrap(),
                    AcquisitionId::new(acquisition).unwrap(),
                );
                (identity, holding(10_000))
            })
            .collect()
    }

    #[test]
    fn a_cleanup_write_of_the_most_slots_it_removes_fits_dynamodbs_expression_limits() {
        let lock = LockName::new("l".repeat(crate::input::MAX_LOCK_NAME_BYTES)).unwrap();
        let chunk = slots(protocol::MAX_SLOTS_PER_FREE);
        let free = render(&protocol::cleanup_free(&lock, &chunk)).unwrap();
        // A take-back of the most expired leases one write takes (F13): each slot's lease is
        // checked too, and its acquisition fenced.
        let expired: Vec<(Identity, Holding, u64)> = slots(protocol::MAX_SLOTS_PER_TAKE_BACK)
            .into_iter()
            .map(|(identity, holding)| (identity, holding, u64::MAX / 2))
            .collect();
        let back = render(&protocol::take_back(&lock, &expired, 0)).unwrap();
        for expression in [&free.condition, &free.update, &back.condition, &back.update] {
            assert!(
                expression.len() <= MAX_EXPRESSION_BYTES,
                "{}",
                expression.len()
            );
            assert!(operators(expression) <= MAX_EXPRESSION_OPERATORS);
        }
    }

    /// The limit a large cleanup meets: one write naming 150 slots is a ConditionExpression of
    /// about 6 KB, which DynamoDB refuses. It is a typed error here, and no request is sent.
    #[test]
    fn a_write_over_4_kb_is_a_typed_error_not_a_request() {
        let lock = LockName::new("l").unwrap();
        let err = render(&protocol::cleanup_free(&lock, &slots(150))).unwrap_err();
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
    fn a_configuration_is_checked_and_set_as_one_map() {
        let lock = LockName::new("l").unwrap();
        let config = LockConfig::new(Limit::new(2).unwrap(), None, None).unwrap();
        let set = render(&protocol::configure(&lock, Some(config))).unwrap();
        assert_eq!(set.condition, "#format = :v0");
        assert_eq!(set.update, "SET #version = #version + :v1, #config = :v2");
        assert_eq!(set.values[":v2"], config_value(&config));
        let unset = render(&protocol::configure(&lock, None)).unwrap();
        assert_eq!(unset.update, "SET #version = #version + :v1 REMOVE #config");
        // An acquire on the configuration it assumes: the whole map, compared at once.
        let write = protocol::acquire(
            &lock,
            &identity(),
            Run::FIRST,
            Some(config),
            Limit::new(2).unwrap(),
            1_000,
            1_500,
            &Timing::default(),
        )
        .unwrap();
        let r = render(&write).unwrap();
        assert!(
            r.condition.contains("AND #config = :v4 AND"),
            "{}",
            r.condition
        );
        assert_eq!(r.values[":v4"], config_value(&config));
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
}
