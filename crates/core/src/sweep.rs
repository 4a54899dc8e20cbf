//! The sweeper's rule: a holder whose execution is no longer running is cleaned up through the
//! same [`protocol::cleanup`](crate::protocol::cleanup) as an EventBridge-driven cleanup. It is
//! the safety net for a status event that was lost (F4) and for anything unforeseen.

use std::collections::HashMap;
use std::future::Future;

use crate::dynamo;
use crate::error::Error;
use crate::input::{AcquisitionId, HolderId, LockName};
use crate::item::{FencingToken, Run, SemaphoreItem};
use crate::queue::Waker;
use crate::store::{ItemStore, Semaphore};

/// How long after a holder acquired (or a waiter queued) an answer of "execution does not exist"
/// is not believed (F11). `DescribeExecution` is eventually consistent: its API reference says
/// "the results are best effort and may not reflect very recent updates and changes", and the
/// Step Functions developer guide ("Read consistency in Step Functions") gives "within a few
/// seconds" for its control plane to converge. An execution that acquired a moment ago exists
/// (only a running execution can invoke the acquire), so "does not exist" for it is a stale
/// read, and freeing its slot would put a second execution in its place while it works (S1).
/// 60 s is an order of magnitude above "a few seconds", and well under the sweep period
/// (`SweepSchedule`, 5 minutes by default): a holder whose execution is really gone is
/// reclaimed by the next sweep after the grace, so the price is at most one sweep period.
pub const MISSING_EXECUTION_GRACE_MS: u64 = 60_000;

/// What the sweeper learns about a holder (from `DescribeExecution` in production).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExecutionState {
    Running,
    /// Ended with this status (SUCCEEDED, FAILED, TIMED_OUT, ABORTED, ...) in `last_run` (its
    /// redrive count: the runs up to it are fenced).
    Ended {
        status: String,
        last_run: Run,
    },
    /// The execution does not exist (any more): nothing can release its slot.
    Missing,
    /// The holder is not an execution (an operator's id): not the sweeper's to judge.
    NotAnExecution,
}

impl ExecutionState {
    /// The run to fence up to: a missing execution's history is gone, and with it any run that
    /// could still write.
    pub(crate) fn last_run(&self) -> Run {
        match self {
            Self::Ended { last_run, .. } => *last_run,
            Self::Running | Self::Missing | Self::NotAnExecution => Run::FIRST,
        }
    }

    pub(crate) fn reclaim_reason(&self) -> Option<String> {
        match self {
            Self::Ended { status, .. } => Some(format!("execution status is {status}")),
            Self::Missing => Some("execution does not exist".to_owned()),
            Self::Running | Self::NotAnExecution => None,
        }
    }
}

pub trait ExecutionStatus: Send + Sync {
    /// `Err` is a message: the holder is then left alone until the next sweep.
    fn describe(
        &self,
        holder: &HolderId,
    ) -> impl Future<Output = Result<ExecutionState, String>> + Send;
}

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

/// The biggest semaphore item a sweep scanned, in bytes as DynamoDB counts them. A write is billed
/// by the size of the item it changes, so this is what each write of the busiest lock costs; it
/// grows with that lock's holders and its rate (the fences of the last one or two windows), and
/// one lock's writes share one partition's throughput.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LargestItem {
    pub lock: LockName,
    pub bytes: usize,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SweepReport {
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
    /// [`MISSING_EXECUTION_GRACE_MS`] ago: kept (not fenced, nothing freed), a later sweep
    /// asks again.
    pub too_young: Vec<(LockName, HolderId)>,
    /// The locks someone waited on when the sweep read them: the lines
    /// [`Semaphore::sweep_lines`] visits, without reading the table again.
    pub lines: Vec<LockName>,
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
    ) -> Result<crate::protocol::CleanupOutcome, Error> {
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
    /// and history are not visited.
    pub async fn sweep(&self, executions: &impl ExecutionStatus) -> Result<SweepReport, Error> {
        self.sweep_as(executions, SweepMode::Reclaim).await
    }

    /// What a sweep would reclaim now, without writing anything: the slots of the holders whose
    /// execution has ended, as they are held now (an operator's `semctl sweep --dry-run`).
    pub async fn sweep_dry_run(
        &self,
        executions: &impl ExecutionStatus,
    ) -> Result<SweepReport, Error> {
        self.sweep_as(executions, SweepMode::DryRun).await
    }

    async fn sweep_as(
        &self,
        executions: &impl ExecutionStatus,
        mode: SweepMode,
    ) -> Result<SweepReport, Error> {
        let listed = self.list().await?;
        let mut report = SweepReport {
            locks: listed.len(),
            ..SweepReport::default()
        };
        let mut items = Vec::new();
        for item in listed {
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
                bytes: dynamo::stored_size(item),
            })
            .max_by_key(|largest| largest.bytes);
        let mut states: HashMap<HolderId, Result<ExecutionState, String>> = HashMap::new();
        for item in &items {
            let mut holders: Vec<&HolderId> = item.holders.keys().map(|id| &id.holder).collect();
            holders.dedup();
            for holder in holders {
                if !states.contains_key(holder) {
                    report.holders_checked += 1;
                    states.insert(holder.clone(), executions.describe(holder).await);
                }
                let (reason, last_run) = match &states[holder] {
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
                if matches!(states[holder], Ok(ExecutionState::Missing))
                    && youngest.is_some_and(|at| !missing_long_enough(at, now))
                {
                    tracing::info!(lock = %item.lock, %holder, "execution not found but acquired within the grace period: kept for a later sweep");
                    report.too_young.push((item.lock.clone(), holder.clone()));
                    continue;
                }
                if mode == SweepMode::DryRun {
                    report
                        .reclaimed
                        .extend(item.slots_of(holder).map(|(identity, holding)| Reclaimed {
                            lock: item.lock.clone(),
                            holder: identity.holder.clone(),
                            acquisition: identity.acquisition.clone(),
                            token: holding.token,
                            held_for_ms: now.saturating_sub(holding.acquired_at_ms),
                            reason: reason.clone(),
                        }));
                    continue;
                }
                match self.reclaim(item, holder, last_run).await {
                    Ok(outcome) => report.reclaimed.extend(outcome.freed.into_iter().map(
                        |(identity, holding)| Reclaimed {
                            lock: item.lock.clone(),
                            holder: identity.holder,
                            acquisition: identity.acquisition,
                            token: holding.token,
                            held_for_ms: now.saturating_sub(holding.acquired_at_ms),
                            reason: reason.clone(),
                        },
                    )),
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
    pub hand_offs: Vec<(LockName, crate::queue::HandOff)>,
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
                let mut left = false;
                match executions.describe(&waiter.identity.holder).await {
                    // A waiter queued within the grace is not taken out on "not found".
                    Ok(ExecutionState::Missing)
                        if !missing_long_enough(waiter.key.queued_at_ms, self.now_ms()) => {}
                    Ok(state) if state.reclaim_reason().is_some() => {
                        match self.leave(lock, waiter.key).await {
                            Ok(true) => {
                                left = true;
                                report
                                    .removed
                                    .push((lock.clone(), waiter.identity.holder.clone()));
                            }
                            Ok(false) => {}
                            Err(e) => report.errors.push(format!("{lock}: {e}")),
                        }
                    }
                    Ok(_) => {}
                    Err(e) => report
                        .errors
                        .push(format!("{}: {e}", waiter.identity.holder)),
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

/// Whether "execution does not exist" is believed of one that acquired or queued at `since_ms`.
/// A clock behind `since_ms` (skew) counts as young.
pub fn missing_long_enough(since_ms: u64, now_ms: u64) -> bool {
    now_ms.saturating_sub(since_ms) >= MISSING_EXECUTION_GRACE_MS
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::input::Limit;
    use crate::item::Identity;
    use crate::memory::MemoryStore;

    struct Fixed(HashMap<String, ExecutionState>);

    impl ExecutionStatus for Fixed {
        async fn describe(&self, holder: &HolderId) -> Result<ExecutionState, String> {
            self.0
                .get(holder.as_str())
                .cloned()
                .ok_or_else(|| "throttled".to_owned())
        }
    }

    fn id(h: &str, a: &str) -> Identity {
        Identity::new(HolderId::new(h).unwrap(), AcquisitionId::new(a).unwrap())
    }

    #[tokio::test]
    async fn only_holders_of_ended_or_missing_executions_are_reclaimed() {
        let clock = std::sync::Arc::new(crate::clock::ManualClock::new(1_000_000));
        let sem = Semaphore::new(MemoryStore::new()).with_clock(clock.clone());
        let lock = LockName::new("l").unwrap();
        let limit = Limit::new(10).unwrap();
        for (h, a) in [
            ("run", "1"),
            ("done", "1"),
            ("done", "2"),
            ("gone", "1"),
            ("op", "1"),
            ("unknown", "1"),
        ] {
            sem.acquire(&lock, &id(h, a), limit).await.unwrap();
        }
        let states = Fixed(HashMap::from([
            ("run".to_owned(), ExecutionState::Running),
            (
                "done".to_owned(),
                ExecutionState::Ended {
                    status: "SUCCEEDED".to_owned(),
                    last_run: Run::FIRST,
                },
            ),
            ("gone".to_owned(), ExecutionState::Missing),
            ("op".to_owned(), ExecutionState::NotAnExecution),
        ]));
        // "gone" is believed gone only past the grace period (see the next test).
        clock.advance_ms(MISSING_EXECUTION_GRACE_MS);
        // A dry run reports the same slots and writes nothing.
        let before = sem.status(&lock).await.unwrap();
        let dry = sem.sweep_dry_run(&states).await.unwrap();
        assert_eq!(sem.status(&lock).await.unwrap(), before);
        let report = sem.sweep(&states).await.unwrap();
        assert_eq!(dry.reclaimed.len(), report.reclaimed.len());
        assert_eq!(dry.errors, report.errors);
        assert_eq!(report.locks, 1);
        assert_eq!(report.holders_checked, 5);
        let mut freed: Vec<_> = report
            .reclaimed
            .iter()
            .map(|r| (r.holder.as_str(), r.acquisition.as_str(), r.reason.as_str()))
            .collect();
        freed.sort();
        assert_eq!(
            freed,
            [
                ("done", "1", "execution status is SUCCEEDED"),
                ("done", "2", "execution status is SUCCEEDED"),
                ("gone", "1", "execution does not exist"),
            ]
        );
        assert_eq!(report.errors, ["unknown: throttled"]);
        let left: Vec<_> = sem
            .status(&lock)
            .await
            .unwrap()
            .holders
            .into_keys()
            .map(|i| i.holder.to_string())
            .collect();
        assert_eq!(left, ["op", "run", "unknown"]);
        // A second sweep finds nothing more to reclaim.
        assert!(sem.sweep(&states).await.unwrap().reclaimed.is_empty());
    }

    /// F11: "does not exist" of a holder that acquired within the grace period is a stale read
    /// of an eventually consistent DescribeExecution: kept, not fenced; believed after.
    #[tokio::test]
    async fn a_missing_execution_is_believed_only_past_the_grace_period() {
        let clock = std::sync::Arc::new(crate::clock::ManualClock::new(1_000_000));
        let sem = Semaphore::new(MemoryStore::new()).with_clock(clock.clone());
        let lock = LockName::new("l").unwrap();
        sem.acquire(&lock, &id("gone", "1"), Limit::new(10).unwrap())
            .await
            .unwrap();
        let states = Fixed(HashMap::from([(
            "gone".to_owned(),
            ExecutionState::Missing,
        )]));
        clock.advance_ms(MISSING_EXECUTION_GRACE_MS - 1);
        let report = sem.sweep(&states).await.unwrap();
        assert!(report.reclaimed.is_empty());
        assert_eq!(
            report.too_young,
            [(lock.clone(), HolderId::new("gone").unwrap())]
        );
        assert!(sem
            .sweep_dry_run(&states)
            .await
            .unwrap()
            .reclaimed
            .is_empty());
        clock.advance_ms(1);
        let report = sem.sweep(&states).await.unwrap();
        assert_eq!(report.reclaimed.len(), 1);
        assert!(report.too_young.is_empty());
        assert!(missing_long_enough(0, MISSING_EXECUTION_GRACE_MS));
        assert!(
            !missing_long_enough(5_000, 1_000),
            "a clock behind counts as young"
        );
    }

    /// The execution is found ended, then redriven: its new incarnation takes a slot before the
    /// sweep's fence lands. The sweep frees only what it scanned.
    #[tokio::test]
    async fn a_slot_taken_after_the_scan_by_a_redrive_is_not_freed() {
        struct RedrivenWhileAsked(Semaphore<std::sync::Arc<MemoryStore>>);
        impl ExecutionStatus for RedrivenWhileAsked {
            async fn describe(&self, holder: &HolderId) -> Result<ExecutionState, String> {
                let lock = LockName::new("l").unwrap();
                let again = Identity::new(holder.clone(), AcquisitionId::new("r1").unwrap());
                self.0
                    .acquire(&lock, &again, Limit::new(5).unwrap())
                    .await
                    .unwrap();
                Ok(ExecutionState::Ended {
                    status: "ABORTED".to_owned(),
                    last_run: Run::FIRST,
                })
            }
        }
        let store = std::sync::Arc::new(MemoryStore::new());
        let sem = Semaphore::new(store.clone());
        let lock = LockName::new("l").unwrap();
        sem.acquire(&lock, &id("x", "r0"), Limit::new(5).unwrap())
            .await
            .unwrap();
        let report = sem
            .sweep(&RedrivenWhileAsked(Semaphore::new(store.clone())))
            .await
            .unwrap();
        let freed: Vec<&str> = report
            .reclaimed
            .iter()
            .map(|r| r.acquisition.as_str())
            .collect();
        assert_eq!(freed, ["r0"]);
        let left = sem.status(&lock).await.unwrap();
        assert_eq!(
            left.holders.keys().cloned().collect::<Vec<_>>(),
            [id("x", "r1")]
        );
    }

    #[tokio::test]
    async fn a_sweep_reports_the_biggest_item_as_stored() {
        let sem = Semaphore::new(MemoryStore::new());
        let states = Fixed(HashMap::new());
        assert_eq!(sem.sweep(&states).await.unwrap().largest_item, None);
        let (small, big) = (
            LockName::new("small").unwrap(),
            LockName::new("big").unwrap(),
        );
        let limit = Limit::new(10).unwrap();
        sem.acquire(&small, &id("op", "1"), limit).await.unwrap();
        for n in 0..3 {
            sem.acquire(&big, &id(&format!("op-{n}"), "1"), limit)
                .await
                .unwrap();
        }
        let stored = sem.status(&big).await.unwrap();
        assert_eq!(
            sem.sweep(&states).await.unwrap().largest_item,
            Some(LargestItem {
                lock: big,
                bytes: dynamo::stored_size(&stored),
            })
        );
    }
}
