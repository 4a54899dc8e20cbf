//! A [`Semaphore`]'s sweep, the sweeper's rule: a holder whose execution is no longer running is
//! cleaned up through the same fence and free as an EventBridge-driven cleanup. It is the safety
//! net for a status event that was lost (F4) and for anything unforeseen; [`Semaphore::sweep_lines`]
//! is the lines' (F8).

use std::collections::{BTreeMap, HashMap};

use super::line::HandOff;
use super::Semaphore;
use crate::dynamo::stored_size;
use crate::error::Error;
use crate::input::{AcquisitionId, HolderId, LockName};
use crate::item::{FencingToken, Holding, Identity, Run, SemaphoreItem};
use crate::ports::{
    missing_long_enough, ExecutionState, ExecutionStatus, HolderAsked, ItemStore, ListCursor,
    ListPage, PortError, Waker,
};
use crate::protocol::CleanupOutcome;
use crate::queue::Wakeup;

/// One slot the sweeper took back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reclaimed {
    pub lock: LockName,
    pub holder: HolderId,
    pub acquisition: AcquisitionId,
    pub token: FencingToken,
    pub held_for_ms: u64,
    pub reason: String,
}

/// A slot a sweep kept because its holder's execution, ended, could not be judged
/// ([`ExecutionState::Unjudged`]): said by name, every sweep, until someone judges it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unjudged {
    pub lock: LockName,
    pub holder: HolderId,
    pub acquisition: AcquisitionId,
    pub token: FencingToken,
    pub held_for_ms: u64,
    /// Why it could not be judged.
    pub why: String,
}

/// The biggest semaphore item a sweep scanned, in bytes as DynamoDB counts them. A write is billed
/// by the size of the item it changes, so this is what each write of the busiest lock costs; it
/// grows with that lock's holders and its rate (the fences of the last one or two windows), and
/// one lock's writes share one partition's throughput.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LargestItem {
    pub lock: LockName,
    pub bytes: usize,
}

/// What a sweep did: of one page of the table ([`Semaphore::sweep_page`]), or of every page put
/// together ([`Semaphore::sweep`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SweepReport {
    /// Pages of the table read.
    pub pages: usize,
    pub locks: usize,
    /// `None` when the table holds no semaphore yet.
    pub largest_item: Option<LargestItem>,
    pub holders_checked: usize,
    pub reclaimed: Vec<Reclaimed>,
    /// Locks whose fences were rotated by the sweep itself (a lock that went quiet keeps its
    /// fences until a write rotates them).
    pub rotated: usize,
    /// Holders that could not be checked or cleaned, and items that could not be read, with
    /// why; retried by the next sweep.
    pub errors: Vec<String>,
    /// Holders whose execution was "not found" but which acquired on the lock less than
    /// [`MISSING_EXECUTION_GRACE_MS`](crate::ports::MISSING_EXECUTION_GRACE_MS) ago: kept (not
    /// fenced, nothing freed), a later sweep asks again.
    pub too_young: Vec<(LockName, HolderId)>,
    /// Slots of ended executions that could not be judged (their history is too long to
    /// read): kept, reported by name.
    pub unjudged: Vec<Unjudged>,
    /// The locks someone waited on when the sweep read them: the lines
    /// [`Semaphore::sweep_lines`] visits, without reading the table again.
    pub lines: Vec<LockName>,
    /// Tombstones of gate locks dropped, once a rotation made every late attempt of their
    /// acquisitions expire (see [`crate::item::Layout::Gate`]).
    pub tombstones_dropped: usize,
    /// Where the next page of the table starts (`None`: this was the last, or every page is in
    /// this report).
    pub next: Option<ListCursor>,
}

impl SweepReport {
    /// Adds a later page's report to this one.
    pub fn absorb(&mut self, page: SweepReport) {
        self.pages += page.pages;
        self.locks += page.locks;
        let bytes = |largest: &Option<LargestItem>| largest.as_ref().map(|l| l.bytes);
        if bytes(&page.largest_item) > bytes(&self.largest_item) {
            self.largest_item = page.largest_item;
        }
        self.holders_checked += page.holders_checked;
        self.reclaimed.extend(page.reclaimed);
        self.rotated += page.rotated;
        self.errors.extend(page.errors);
        self.too_young.extend(page.too_young);
        self.unjudged.extend(page.unjudged);
        self.lines.extend(page.lines);
        self.tombstones_dropped += page.tombstones_dropped;
        self.next = page.next;
    }
}

impl<S: ItemStore> Semaphore<S> {
    /// Fences `holder` and frees the slots it held *when the sweep scanned the lock*: the
    /// execution was found ended after that scan, so a slot it took since can only be a
    /// redriven execution's (alive again), which must not be freed.
    async fn reclaim(
        &self,
        scanned: &SemaphoreItem,
        holder: &HolderId,
        last_run: Run,
    ) -> Result<CleanupOutcome, Error> {
        let mut fenced = self.fence(&scanned.lock, holder, last_run).await?;
        fenced
            .slots
            .retain(|(slot, _)| scanned.holders.contains_key(slot));
        self.free(&fenced).await
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SweepMode {
    Reclaim,
    DryRun,
}

impl<S: ItemStore> Semaphore<S> {
    /// Checks every current holder once and cleans up those whose execution has ended, and
    /// rotates the fences of locks where a rotation is due (so a lock that went quiet sheds its
    /// fences too). The cost grows with the number of current holders and locks only: fences
    /// and history are not visited. Every page's details are kept in the report: a caller that
    /// must hold little at any number of locks (the sweeper function) sweeps page by page
    /// ([`Semaphore::sweep_page`]).
    pub async fn sweep(&self, executions: &impl ExecutionStatus) -> Result<SweepReport, Error> {
        self.sweep_pages(executions, SweepMode::Reclaim).await
    }

    /// What a sweep would reclaim now, without writing anything: the slots of the holders whose
    /// execution has ended, as they are held now (an operator's `semctl sweep --dry-run`).
    pub async fn sweep_dry_run(
        &self,
        executions: &impl ExecutionStatus,
    ) -> Result<SweepReport, Error> {
        self.sweep_pages(executions, SweepMode::DryRun).await
    }

    /// The sweep of one page of the table, the one after `after` (`None`: the first): its
    /// locks judged, reclaimed and rotated before the report is answered, so that a caller that
    /// sweeps the next page (`report.next`) only once it has handled this one holds one page of
    /// locks at a time.
    pub async fn sweep_page(
        &self,
        executions: &impl ExecutionStatus,
        after: Option<&ListCursor>,
    ) -> Result<SweepReport, Error> {
        let page = self.store.list_page(after).await?;
        self.sweep_listed(executions, page, SweepMode::Reclaim)
            .await
    }

    async fn sweep_pages(
        &self,
        executions: &impl ExecutionStatus,
        mode: SweepMode,
    ) -> Result<SweepReport, Error> {
        let mut report = SweepReport::default();
        let mut after = None;
        loop {
            let page = self.store.list_page(after.as_ref()).await?;
            report.absorb(self.sweep_listed(executions, page, mode).await?);
            match report.next.take() {
                Some(next) => after = Some(next),
                None => return Ok(report),
            }
        }
    }

    async fn sweep_listed(
        &self,
        executions: &impl ExecutionStatus,
        listed: ListPage,
        mode: SweepMode,
    ) -> Result<SweepReport, Error> {
        let mut report = SweepReport {
            pages: 1,
            locks: listed.items.len(),
            next: listed.next,
            ..SweepReport::default()
        };
        let mut items = Vec::new();
        for item in listed.items {
            match item {
                Ok(item) => items.push(item),
                Err(e) => report.errors.push(e.to_string()),
            }
        }
        report.lines = items
            .iter()
            .filter(|item| item.waiting > 0)
            .map(|item| item.lock.clone())
            .collect();
        report.largest_item = items
            .iter()
            .map(|item| LargestItem {
                lock: item.lock.clone(),
                bytes: stored_size(item),
            })
            .max_by_key(|largest| largest.bytes);
        // Each holder with what it holds on this page's locks (the key's order: a holder's
        // acquisitions together).
        let mut holding: BTreeMap<&HolderId, Vec<AcquisitionId>> = BTreeMap::new();
        for id in items.iter().flat_map(|item| item.holders.keys()) {
            let acquisitions = holding.entry(&id.holder).or_default();
            if !acquisitions.contains(&id.acquisition) {
                acquisitions.push(id.acquisition.clone());
            }
        }
        let asked: Vec<HolderAsked> = holding
            .into_iter()
            .map(|(holder, holding)| HolderAsked {
                holder: holder.clone(),
                holding,
            })
            .collect();
        report.holders_checked = asked.len();
        let described = executions.describe_all(&asked).await;
        let states: HashMap<HolderId, Result<ExecutionState, PortError>> = asked
            .into_iter()
            .map(|asked| asked.holder)
            .zip(described)
            .collect();
        for item in &items {
            // F13: leases that passed unrenewed, whoever the holder is.
            if mode == SweepMode::Reclaim {
                // What it took back is collected with every other take-back of this
                // semaphore's ([`Semaphore::drain_taken_back`]), with the hand-offs'.
                if let Err(e) = self.take_back_expired(item).await {
                    report
                        .errors
                        .push(format!("taking back expired leases on {}: {e}", item.lock));
                }
            }
            let mut holders: Vec<&HolderId> = item.holders.keys().map(|id| &id.holder).collect();
            holders.dedup();
            for holder in holders {
                let Some(state) = states.get(holder) else {
                    report
                        .errors
                        .push(format!("{holder}: its execution's state was not answered"));
                    continue;
                };
                let (reason, last_run) = match state {
                    Ok(ExecutionState::Unjudged { why, .. }) => {
                        let now = self.now_ms();
                        tracing::error!(lock = %item.lock, %holder, %why, "execution ended but cannot be judged: its slots are kept");
                        report
                            .unjudged
                            .extend(item.slots_of(holder).map(|(identity, holding)| Unjudged {
                                lock: item.lock.clone(),
                                holder: identity.holder.clone(),
                                acquisition: identity.acquisition.clone(),
                                token: holding.token,
                                held_for_ms: now.saturating_sub(holding.acquired_at_ms),
                                why: why.clone(),
                            }));
                        continue;
                    }
                    Ok(state) => match state.reclaim_reason() {
                        Some(reason) => (reason, state.last_run()),
                        None => continue,
                    },
                    Err(e) => {
                        report.errors.push(format!("{holder}: {e}"));
                        continue;
                    }
                };
                let now = self.now_ms();
                let youngest = item.slots_of(holder).map(|(_, h)| h.acquired_at_ms).max();
                if matches!(state, Ok(ExecutionState::Missing))
                    && youngest.is_some_and(|at| !missing_long_enough(at, now))
                {
                    tracing::info!(lock = %item.lock, %holder, "execution not found but acquired within the grace period: kept for a later sweep");
                    report.too_young.push((item.lock.clone(), holder.clone()));
                    continue;
                }
                let reclaimed = |(identity, holding): (&Identity, &Holding)| Reclaimed {
                    lock: item.lock.clone(),
                    holder: identity.holder.clone(),
                    acquisition: identity.acquisition.clone(),
                    token: holding.token,
                    held_for_ms: now.saturating_sub(holding.acquired_at_ms),
                    reason: reason.clone(),
                };
                if mode == SweepMode::DryRun {
                    report
                        .reclaimed
                        .extend(item.slots_of(holder).map(reclaimed));
                    continue;
                }
                match self.reclaim(item, holder, last_run).await {
                    Ok(outcome) => report
                        .reclaimed
                        .extend(outcome.freed.iter().map(|(i, h)| reclaimed((i, h)))),
                    Err(e) => report
                        .errors
                        .push(format!("{holder} on {}: {e}", item.lock)),
                }
            }
            // From the item as scanned: fences added since stay young, and a rotation that
            // happened since makes this one refused, harmlessly.
            if mode == SweepMode::Reclaim && self.rotate_if_due(item).await {
                report.rotated += 1;
            }
            if mode == SweepMode::Reclaim && !item.tombstones.is_empty() {
                match self.drop_passed_tombstones(&item.lock).await {
                    Ok(dropped) => report.tombstones_dropped += dropped,
                    Err(e) => report
                        .errors
                        .push(format!("tombstones of {}: {e}", item.lock)),
                }
            }
        }
        Ok(report)
    }
}

/// Waiters a sweep checks per lock, from the head of its line: those next to be granted, where
/// a dead one would cost the live ones behind it a failed grant (dead waiters further back are
/// skipped by the hand-off, or checked by a later sweep once nearer the head).
pub const WAITERS_CHECKED_PER_LOCK: usize = 100;

/// What a sweep of the lines did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LineSweep {
    pub waiters_checked: usize,
    /// Waiters taken out of line: their execution had ended.
    pub removed: Vec<(LockName, HolderId)>,
    /// Waiters granted a slot and woken by the sweep's hand-offs.
    pub woken: usize,
    pub errors: Vec<String>,
    /// Per lock visited, when the first waiter it left in line asked (epoch ms): the oldest
    /// waiter's age for the functions' metrics.
    pub oldest: Vec<(LockName, u64)>,
    /// What each lock's hand-off did.
    pub hand_offs: Vec<(LockName, HandOff)>,
}

impl<S: ItemStore> Semaphore<S> {
    /// The lines' safety net (F8): for every lock of `lines` (the locks someone waited on when
    /// [`Semaphore::sweep`] read the table: its report's `lines`, so the table is read once per
    /// sweep), takes out of line the waiters near the head whose execution has ended (its
    /// cleanup event was lost), then hands free slots to the head (a waker that crashed between
    /// a release and its hand-off left the slot free with someone waiting). A line that formed
    /// since that read moves without it: its first waiter hands off right after it queues.
    pub async fn sweep_lines<W: Waker>(
        &self,
        lines: &[LockName],
        executions: &impl ExecutionStatus,
        waker: &W,
    ) -> Result<LineSweep, Error> {
        let mut report = LineSweep::default();
        for lock in lines {
            let waiters = self.waiters(lock, None, WAITERS_CHECKED_PER_LOCK).await?;
            let mut oldest = None;
            for waiter in waiters {
                report.waiters_checked += 1;
                // F13: a poller is judged by its record's time (an Express execution cannot be
                // described), never by its execution.
                let dead = match &waiter.wakeup {
                    Wakeup::Poll { .. } => self
                        .leave_if_stopped(&waiter)
                        .await
                        .map_err(|e| format!("{lock}: {e}")),
                    Wakeup::Task(_) => match executions.describe(&waiter.identity.holder).await {
                        // A waiter queued within the grace is not taken out on "not found".
                        Ok(ExecutionState::Missing)
                            if !missing_long_enough(waiter.key.queued_at_ms, self.now_ms()) =>
                        {
                            Ok(false)
                        }
                        Ok(state) if state.reclaim_reason().is_some() => self
                            .leave(lock, waiter.id())
                            .await
                            .map_err(|e| format!("{lock}: {e}")),
                        Ok(_) => Ok(false),
                        Err(e) => Err(format!("{}: {e}", waiter.identity.holder)),
                    },
                };
                let left = match dead {
                    Ok(left) => left,
                    Err(e) => {
                        report.errors.push(e);
                        false
                    }
                };
                if left {
                    report
                        .removed
                        .push((lock.clone(), waiter.identity.holder.clone()));
                }
                if !left && oldest.is_none() {
                    oldest = Some(waiter.key.queued_at_ms);
                }
            }
            if let Some(since) = oldest {
                report.oldest.push((lock.clone(), since));
            }
            match self.hand_off(lock, None, waker, executions).await {
                Ok(handed) => {
                    report.woken += handed.woken.len();
                    report.hand_offs.push((lock.clone(), handed));
                }
                Err(e) => report.errors.push(format!("{lock}: {e}")),
            }
        }
        Ok(report)
    }
}
