//! Write units as DynamoDB bills them, from the writes a client sends: an interceptor notes, for
//! every write request, the table of each item it writes (a transaction, each of its actions);
//! [`Billed::units`] prices them with the item sizes the bench measured per table. DynamoDB bills
//! a plain write one unit per KB of its item (rounded up), an action of a transaction two
//! ("Transactional write requests require two write capacity units to perform one write per
//! second for items up to 1 KB"; a `ConditionCheck` among them too), and a write of an item a
//! local secondary index holds once more for its index entry, by the entry's size (the waiters'
//! `line` index keeps only the keys; counted for every write of a record, though an update that
//! changes no key writes no entry). A refused write is billed as one that landed.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use aws_sdk_dynamodb::config::interceptors::BeforeSerializationInterceptorContextRef;
use aws_sdk_dynamodb::config::{ConfigBag, Intercept};
use aws_sdk_dynamodb::operation::delete_item::DeleteItemInput;
use aws_sdk_dynamodb::operation::put_item::PutItemInput;
use aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsInput;
use aws_sdk_dynamodb::operation::update_item::UpdateItemInput;
use semaphore_core::dynamo::write_units;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Items written, by (table, in a transaction?).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Billed {
    pub writes: BTreeMap<(String, bool), u64>,
}

impl Billed {
    /// Write units of every item written, an item of `table` sized `bytes(table)`; a write of
    /// a table in `indexed` (table, bytes of an index entry) writes its local index entry too.
    pub fn units(&self, bytes: impl Fn(&str) -> usize, indexed: &[(&str, usize)]) -> u64 {
        self.writes
            .iter()
            .map(|((table, transactional), n)| {
                let units = write_units(bytes(table)) as u64;
                let base = if *transactional { 2 * units } else { units };
                let index = indexed
                    .iter()
                    .find(|(name, _)| name == table)
                    .map_or(0, |(_, entry)| write_units(*entry) as u64);
                n * (base + index)
            })
            .sum()
    }
}

/// Add it to a client's config with `.interceptor(log.clone())`; clones share what they saw.
#[derive(Debug, Clone, Default)]
pub struct WriteLog(Arc<Mutex<Billed>>);

impl WriteLog {
    /// What was written since the last take.
    pub fn take(&self) -> Billed {
        std::mem::take(&mut *self.0.lock().unwrap_or_else(|e| e.into_inner()))
    }

    fn note(&self, table: Option<&str>, transactional: bool) {
        let mut billed = self.0.lock().unwrap_or_else(|e| e.into_inner());
        *billed
            .writes
            .entry((table.unwrap_or_default().to_owned(), transactional))
            .or_default() += 1;
    }
}

impl Intercept for WriteLog {
    fn name(&self) -> &'static str {
        "WriteLog"
    }

    fn read_before_execution(
        &self,
        context: &BeforeSerializationInterceptorContextRef<'_>,
        _cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        let input = context.input();
        if let Some(transaction) = input.downcast_ref::<TransactWriteItemsInput>() {
            for action in transaction.transact_items() {
                let table = action
                    .put()
                    .map(|a| a.table_name())
                    .or(action.update().map(|a| a.table_name()))
                    .or(action.delete().map(|a| a.table_name()))
                    .or(action.condition_check().map(|a| a.table_name()));
                self.note(table, true);
            }
        } else if let Some(update) = input.downcast_ref::<UpdateItemInput>() {
            self.note(update.table_name(), false);
        } else if let Some(put) = input.downcast_ref::<PutItemInput>() {
            self.note(put.table_name(), false);
        } else if let Some(delete) = input.downcast_ref::<DeleteItemInput>() {
            self.note(delete.table_name(), false);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transactions_bill_twice_and_an_indexed_table_once_more() {
        let billed = Billed {
            writes: BTreeMap::from([
                (("gate".to_owned(), true), 2),
                (("holdings".to_owned(), false), 1),
                (("queue".to_owned(), true), 1),
            ]),
        };
        let bytes = |table: &str| match table {
            "gate" => 150,
            "holdings" => 1_500,
            _ => 1_300,
        };
        // gate 2 × 2 × 1, holdings 1 × 2, queue 1 × (2 × 2 + 1: an index entry of 300 bytes).
        assert_eq!(billed.units(bytes, &[("queue", 300)]), 4 + 2 + 5);
    }
}
