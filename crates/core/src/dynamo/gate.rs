//! The [`DynamoStore`]'s writes of a gate lock (see [`Layout::Gate`]): the gate item in the
//! semaphore table, each holding an item of the holdings table ([`super::holdings`]).
//!
//! A write of the gate alone (a configuration, a rotation, a cleanup's fence) is one
//! `UpdateItem`, as in the item layout. A write that also names holdings or a waiter's record
//! is one `TransactWriteItems` with a client request token: the gate's update, each holding's
//! action, the record's action. A transaction hands back no values, so an admission's fencing
//! token is proposed by this store (above the gate's version as last seen, or its clock in
//! milliseconds if higher) and checked above the gate's version when it lands; one refused by
//! that check alone is sent again with a higher token. A write that landed is answered with the
//! gate as read just after it and the holdings as it left them (`WriteResult::Landed`); one
//! refused, with them as read just after the refusal, unless every check holds there (the lock
//! moved in between): then it is sent again. While a gate is full (an admission sent from here
//! was last refused for want of room), an admission is first checked on a read, and answered
//! from it when a check fails there: a refused transaction is billed as if it had written.

use std::collections::BTreeSet;

use aws_sdk_dynamodb::error::{DisplayErrorContext, ProvideErrorMetadata, SdkError};

use super::codec::{attr, decode, string};
use super::expression::{is_holdings, record_action, render_in};
use super::holdings::{self, add_to, decode_holding, holding_attr, Holdings};
use super::retry::{LostAnswers, CONFLICT_ROUNDS};
use super::store::Transacted;
use super::DynamoStore;
use crate::error::StoreError;
use crate::input::LockName;
use crate::item::{FencingToken, Identity, Layout, SemaphoreItem};
use crate::protocol::WriteResult;
use crate::write::{Change, Check, Write};

impl DynamoStore {
    /// The layout `lock` was last seen in (the item layout until seen otherwise).
    pub(super) fn layout_of(&self, lock: &LockName) -> Layout {
        self.layouts
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(lock)
            .copied()
            .unwrap_or_default()
    }

    pub(super) fn saw_layout(&self, lock: &LockName, layout: Layout) {
        self.layouts
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(lock.clone(), layout);
    }

    /// The token the next admission to `lock` proposes: above the gate's version as last seen,
    /// and at least this host's clock in milliseconds, so that a writer that has seen nothing
    /// yet is rarely refused.
    fn propose_token(&self, lock: &LockName) -> FencingToken {
        let seen = self
            .versions
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(lock)
            .copied()
            .unwrap_or_default();
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        FencingToken(seen.saturating_add(1).max(now_ms))
    }

    fn seen_full_mut(&self) -> std::sync::MutexGuard<'_, std::collections::HashSet<LockName>> {
        self.seen_full.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn was_full(&self, lock: &LockName) -> bool {
        self.seen_full_mut().contains(lock)
    }

    /// Remembers whether the admission `write` lacks room on `view` (the lock as just read:
    /// full, or someone in line), whatever check refuses it first: while the lock stays so,
    /// the admissions sent from here are answered from a read (see `write_gate`).
    fn note_room(&self, write: &Write, view: &SemaphoreItem) {
        let full = write.checks.iter().any(|c| {
            matches!(c, Check::Fits { .. } | Check::Room | Check::QueueEmpty) && !c.holds(view)
        });
        if full {
            self.seen_full_mut().insert(write.lock.clone());
        } else {
            self.seen_full_mut().remove(&write.lock);
        }
    }

    fn saw_version(&self, lock: &LockName, version: u64) {
        let mut versions = self.versions.lock().unwrap_or_else(|e| e.into_inner());
        let seen = versions.entry(lock.clone()).or_default();
        *seen = (*seen).max(version);
    }

    /// The gate of `lock` and the holdings of `named`, read consistently now (`None`: no item).
    pub(super) async fn gate_view(
        &self,
        lock: &LockName,
        named: &BTreeSet<Identity>,
    ) -> Result<Option<SemaphoreItem>, StoreError> {
        let out = self
            .client()
            .get_item()
            .table_name(self.table())
            .key(attr::LOCK, string(lock.as_str()))
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| self.failed_holdings("GetItem", DisplayErrorContext(e)))?;
        let Some(mut view) = out.item().map(decode).transpose()? else {
            return Ok(None);
        };
        if view.layout != Layout::Gate {
            return Ok(Some(view));
        }
        self.saw_version(lock, view.version.0);
        for identity in named {
            let out = self
                .client()
                .get_item()
                .table_name(self.holdings_table())
                .set_key(Some(holdings::key(lock, identity)))
                .consistent_read(true)
                .send()
                .await
                .map_err(|e| self.failed_holdings("GetItem", DisplayErrorContext(e)))?;
            if let Some(attrs) = out.item() {
                let (identity, state) = decode_holding(attrs)?;
                add_to(&mut view, identity, state);
            }
        }
        Ok(Some(view))
    }

    /// The lock just after a write that landed with these holding `actions`: the gate read now,
    /// each holding the write put (an admission, a tombstone) as it put it and each it deleted
    /// gone, without reading them back; only a holding it updated in place (a heartbeat) is
    /// read. One it only checked (a queueing's "not holding, not released": absent) is left
    /// out, as no answer to such a write reads it. A holding changed by another writer since (a
    /// cleanup's free just after an admission) is answered as this write left it: what its
    /// caller asked about.
    async fn landed_view(
        &self,
        lock: &LockName,
        actions: &[(Identity, aws_sdk_dynamodb::types::TransactWriteItem)],
    ) -> Result<Option<SemaphoreItem>, StoreError> {
        let unknown: BTreeSet<Identity> = actions
            .iter()
            .filter(|(_, a)| a.update().is_some())
            .map(|(identity, _)| identity.clone())
            .collect();
        let Some(mut view) = self.gate_view(lock, &unknown).await? else {
            return Ok(None);
        };
        for (_, action) in actions {
            if let Some(put) = action.put() {
                let (identity, state) = decode_holding(put.item())?;
                add_to(&mut view, identity, state);
            }
        }
        Ok(Some(view))
    }

    /// `view` (a gate read as an item of the layout in use) with `which` of its holdings: all
    /// of its lock's, or only a holder's, read by the key prefix `holder#` (a slot key is
    /// `holder#acquisition`) in its bucket, so a cleanup reads its execution's few, not the
    /// lock's thousands; or none.
    pub(super) async fn with_holdings(
        &self,
        mut view: SemaphoreItem,
        which: Holdings<'_>,
    ) -> Result<SemaphoreItem, StoreError> {
        let holder = match which {
            Holdings::None => return Ok(view),
            Holdings::All => None,
            Holdings::Of(holder) => Some(holder),
        };
        if view.layout != Layout::Gate {
            return Ok(view);
        }
        let parts: Vec<String> = match holder {
            None => holdings::partitions(view.lock.as_str()).collect(),
            Some(holder) => vec![holdings::partition(view.lock.as_str(), holder.as_str())],
        };
        for part in parts {
            let mut start = None;
            loop {
                let query = self
                    .client()
                    .query()
                    .table_name(self.holdings_table())
                    .expression_attribute_names("#part", holding_attr::PART)
                    .expression_attribute_values(":part", string(&part))
                    .consistent_read(true)
                    .set_exclusive_start_key(start);
                let query = match holder {
                    None => query.key_condition_expression("#part = :part"),
                    Some(holder) => query
                        .key_condition_expression("#part = :part AND begins_with(#slot, :holder)")
                        .expression_attribute_names("#slot", holding_attr::SLOT)
                        .expression_attribute_values(":holder", string(&format!("{holder}#"))),
                };
                let page = query
                    .send()
                    .await
                    .map_err(|e| self.failed_holdings("Query", DisplayErrorContext(e)))?;
                for attrs in page.items() {
                    let (identity, state) = decode_holding(attrs)?;
                    // A holder's id may hold '#': `a#` also begins `a#b#c`, holder `a#b`'s.
                    if holder.is_none_or(|holder| identity.holder == *holder) {
                        add_to(&mut view, identity, state);
                    }
                }
                match page.last_evaluated_key() {
                    Some(key) if !key.is_empty() => start = Some(key.clone()),
                    _ => break,
                }
            }
        }
        Ok(view)
    }

    /// Sends one holding's `action` as a plain request; answered as a transaction is.
    async fn write_holding(
        &self,
        write: &Write,
        identity: &Identity,
        action: aws_sdk_dynamodb::types::TransactWriteItem,
    ) -> Result<WriteResult, StoreError> {
        // Whether an attempt went unanswered (F10): a refusal may then be its own doing.
        let lost = LostAnswers::default();
        let sent: Result<(), (bool, String)> = if let Some(update) = action.update() {
            self.client()
                .update_item()
                .table_name(update.table_name())
                .set_key(Some(update.key().clone()))
                .update_expression(update.update_expression())
                .set_condition_expression(update.condition_expression().map(str::to_owned))
                .set_expression_attribute_names(update.expression_attribute_names().cloned())
                .set_expression_attribute_values(update.expression_attribute_values().cloned())
                .customize()
                .interceptor(lost.clone())
                .send()
                .await
                .map(|_| ())
                .map_err(refusal)
        } else if let Some(delete) = action.delete() {
            self.client()
                .delete_item()
                .table_name(delete.table_name())
                .set_key(Some(delete.key().clone()))
                .set_condition_expression(delete.condition_expression().map(str::to_owned))
                .set_expression_attribute_names(delete.expression_attribute_names().cloned())
                .set_expression_attribute_values(delete.expression_attribute_values().cloned())
                .customize()
                .interceptor(lost.clone())
                .send()
                .await
                .map(|_| ())
                .map_err(refusal)
        } else if let Some(put) = action.put() {
            self.client()
                .put_item()
                .table_name(put.table_name())
                .set_item(Some(put.item().clone()))
                .set_condition_expression(put.condition_expression().map(str::to_owned))
                .set_expression_attribute_names(put.expression_attribute_names().cloned())
                .set_expression_attribute_values(put.expression_attribute_values().cloned())
                .customize()
                .interceptor(lost.clone())
                .send()
                .await
                .map(|_| ())
                .map_err(refusal)
        } else {
            return Err(StoreError::Unexpected {
                lock: write.lock.to_string(),
                problem: "a holding checked and not changed, alone".to_owned(),
            });
        };
        match sent {
            Ok(()) => Ok(WriteResult::Landed {
                after: self
                    .landed_view(&write.lock, &[(identity.clone(), action)])
                    .await?,
            }),
            Err((true, _)) => {
                let named = BTreeSet::from([identity.clone()]);
                let current = self
                    .gate_view(&write.lock, &named)
                    .await?
                    .unwrap_or_else(|| SemaphoreItem::empty(write.lock.clone()));
                Ok(if lost.happened() {
                    WriteResult::Unsure { current }
                } else {
                    WriteResult::Refused {
                        current,
                        waiter_refused: false,
                    }
                })
            }
            Err((false, message)) => Err(self.failed_holdings("a holding's write", message)),
        }
    }

    fn failed_holdings(&self, operation: &'static str, e: impl std::fmt::Display) -> StoreError {
        StoreError::Dynamo {
            operation,
            table: self.holdings_table().to_owned(),
            message: e.to_string(),
        }
    }

    /// Sends `write` to a gate (see the module docs).
    pub(super) async fn write_gate(&self, write: &Write) -> Result<WriteResult, StoreError> {
        let named = holdings::named(write);
        let waiter = write.waiter_id();
        if named.is_empty() && waiter.is_none() {
            let rendered = render_in(write, Layout::Gate, None)?;
            return self.send_update(write, &rendered, Layout::Gate).await;
        }
        let touches_gate = write
            .checks
            .iter()
            .any(|c| c.waiter_id().is_none() && !is_holdings(c))
            || write.changes.iter().any(|c| {
                !matches!(
                    c,
                    Change::SetLease { .. }
                        | Change::FenceAcquisition { .. }
                        | Change::DropTombstone(_)
                        | Change::Repark { .. }
                )
            });
        // One holding alone (a heartbeat, a drop, a release of nothing held): one plain
        // request, billed once, not a transaction's twice.
        if let (false, None, [identity]) = (
            touches_gate,
            waiter,
            named.iter().collect::<Vec<_>>().as_slice(),
        ) {
            let action = holdings::action(self.holdings_table(), write, identity, None)?;
            return self.write_holding(write, identity, action).await;
        }
        let admits = write
            .changes
            .iter()
            .any(|c| matches!(c, Change::PutHolder { .. }));
        // An admission that asks for room itself, not a grant of room a release made for a
        // waiter: only its refusals say whether the gate is full.
        let acquire = admits && waiter.is_none();
        // An admission to a gate last seen without room is checked on a consistent read first
        // and, if a check fails there, answered as refused without being sent: the same
        // answer the write would have had at the moment of the read (nothing was written), for
        // no write units (a refused transaction is billed as if it had written its items).
        if acquire && self.was_full(&write.lock) {
            if let Some(view) = self.gate_view(&write.lock, &named).await? {
                if view.layout == Layout::Gate {
                    self.note_room(write, &view);
                    if !write.checks.iter().all(|c| c.holds(&view)) {
                        return Ok(WriteResult::Refused {
                            current: view,
                            waiter_refused: false,
                        });
                    }
                }
            }
        }
        let mut token = admits.then(|| self.propose_token(&write.lock));
        for _ in 0..CONFLICT_ROUNDS {
            let mut actions = Vec::new();
            if touches_gate {
                actions.push(self.item_action(write, render_in(write, Layout::Gate, token)?)?);
            }
            let mut holding_actions = Vec::with_capacity(named.len());
            for identity in &named {
                let action = holdings::action(self.holdings_table(), write, identity, token)?;
                actions.push(action.clone());
                holding_actions.push((identity.clone(), action));
            }
            if let Some(key) = waiter {
                actions.push(record_action(self.queue_table(), write, key)?);
            }
            let reasons = match self
                .send_transaction(actions, self.holdings_table())
                .await?
            {
                Transacted::Committed => {
                    // An acquire that lands found room; a grant only took the room a release
                    // made for it, and says nothing of the next acquire's.
                    if acquire {
                        self.seen_full_mut().remove(&write.lock);
                    }
                    let after = self.landed_view(&write.lock, &holding_actions).await?;
                    return Ok(WriteResult::Landed { after });
                }
                Transacted::Refused(reasons) => reasons,
            };
            let codes: Vec<&str> = reasons.iter().map(|r| r.code().unwrap_or("None")).collect();
            let Some(view) = self.gate_view(&write.lock, &named).await? else {
                return Err(StoreError::Unexpected {
                    lock: write.lock.to_string(),
                    problem: "a gate's write was refused and the gate is gone".to_owned(),
                });
            };
            if view.layout != Layout::Gate {
                return Err(StoreError::WrongLayout {
                    lock: write.lock.to_string(),
                    layout: view.layout,
                });
            }
            let waiter_refused =
                waiter.is_some() && codes.last() == Some(&"ConditionalCheckFailed");
            let others_hold = write
                .checks
                .iter()
                .filter(|c| c.waiter_id().is_none())
                .all(|c| c.holds(&view));
            if others_hold && !waiter_refused {
                // Every check holds on the lock as read after the refusal: either the proposed
                // token alone was refused (another admission landed with a higher one), or the
                // lock moved between the refusal and the read (a release freed the room a grant
                // lacked). Answering the read as the refusal would name no failed check; the
                // write is sent again instead, above the version read.
                token = token.map(|t| FencingToken(t.0.max(view.version.0.saturating_add(1))));
                continue;
            }
            if acquire {
                self.note_room(write, &view);
            }
            return Ok(WriteResult::Refused {
                current: view,
                waiter_refused,
            });
        }
        Err(self.failed_holdings(
            "TransactWriteItems",
            format!(
                "refused {CONFLICT_ROUNDS} times while each of its checks held on the lock read \
                 just after (the lock kept changing under it, or other admissions kept taking \
                 its token); send it again later"
            ),
        ))
    }
}

/// A plain request's error: whether its condition refused it, and the error in words.
fn refusal<E, R>(e: SdkError<E, R>) -> (bool, String)
where
    E: ProvideErrorMetadata + std::error::Error + 'static,
    R: std::fmt::Debug,
{
    let refused = e.code() == Some("ConditionalCheckFailedException");
    (refused, DisplayErrorContext(e).to_string())
}
