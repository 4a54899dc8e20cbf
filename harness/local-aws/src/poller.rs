//! An independent poller of the table: reads the raw item of every lock of the run (consistent
//! `GetItem`s, one lock after the other) many times a second, decoded here without the
//! product's decoder, and records, per lock, who holds a slot and whether the item is
//! consistent. The invariant checks are made on what it saw, not on what the Lambdas say.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::observe::{self, RawRecord};
use crate::Error;
use aws_sdk_dynamodb::types::AttributeValue;
use serde::Serialize;
use tokio::sync::watch;

/// The item layout to read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// Ours (item format 7): `holders` map keyed `<holder>#<acquisition>`, each entry one number
    /// `(weight - 1) * 10^28 + token * 10^13 + acquired_at_ms`; `version` (times 10^13); `used`, the stored
    /// sum of the holders' weights (the acquire's condition checks it against the limit);
    /// `started_at`, the last start, and `spacing_ms`, the last acquisition's start rate.
    Versioned,
    /// The original sample's: `count` and one `holder:<execution>` attribute per holder.
    Sample,
}

/// What the poller saw of one lock.
#[derive(Debug, Default, Clone, Serialize)]
pub struct LockPoll {
    pub reads: u64,
    pub read_errors: u64,
    pub max_holders: usize,
    /// The largest sum of the holders' weights one read saw (ours; the sample's: holders).
    pub max_weight: u64,
    /// Reads of an inconsistent item (`crate::observe::Observed::problem`). Ours: not
    /// format 7, a holder entry that is not a packed number of weight 1 to 10,000, a token above
    /// the version, two holders with one token, a stored `used` or `held_bytes` that differs
    /// from the holders' own, or their weights above the lock's limit. The sample's: a stored
    /// count that differs from the number of holders.
    pub inconsistent_reads: u64,
    pub first_inconsistency: Option<String>,
    pub holders_now: usize,
    /// The weight in use and the line's length, each time either changed (the run's picture).
    #[serde(skip)]
    pub samples: Vec<Sample>,
    /// Every start of the lock a read saw (epoch ms, the writers' clock): each holder's
    /// `acquired_at` and the item's `started_at`.
    #[serde(skip)]
    pub starts: BTreeSet<u64>,
    /// The start rate the item last carried, as its spacing (ms).
    pub spacing_ms: Option<u64>,
}

/// One read of a lock, kept when it differed from the one before.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Sample {
    /// When its answer came (epoch ms).
    pub at_ms: i64,
    /// The sum of the holders' weights.
    pub weight: u64,
    /// The item's count of waiters in line (the sample's protocol has none: 0).
    pub waiting: u64,
}

#[derive(Debug, Default, Clone, Serialize)]
pub struct PollStats {
    /// Per lock, in the order the run names them.
    pub locks: BTreeMap<String, LockPoll>,
    /// Reads of all locks together.
    pub reads: u64,
    pub read_errors: u64,
    pub inconsistent_reads: u64,
    /// Slots held on all locks, as of the last round of reads.
    pub holders_now: usize,
    /// When the poller started (epoch ms).
    pub started_ms: i64,
    /// For each execution seen holding a slot: when the last read that saw it was sent
    /// (milliseconds since the epoch).
    #[serde(skip)]
    pub last_seen_ms: BTreeMap<String, i64>,
    /// For each execution seen holding a slot and then no longer: when the answer came to the
    /// first read of its lock that no longer saw it, after the last that did (milliseconds
    /// since the epoch). That read was served after the slot was freed, so anything that
    /// happened before the slot was freed happened before this.
    #[serde(skip)]
    pub gone_ms: BTreeMap<String, i64>,
}

impl PollStats {
    pub fn lock(&self, lock: &str) -> LockPoll {
        self.locks.get(lock).cloned().unwrap_or_default()
    }
}

/// How long a watcher of the run waits before its next round of reads that took `took`: at
/// least `every`, and three times as long as they took, so that it keeps at most a quarter of
/// the local server (which serves one request at a time) from the run it watches.
pub fn paced(every: Duration, took: Duration) -> Duration {
    every.max(took * 3)
}

pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or_default()
}

/// One read of a lock's raw item, decoded by the kit (not by the product's decoder).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Read {
    /// Holders (execution ARNs, one per slot).
    pub holders: Vec<String>,
    /// The sum of the holders' weights (ours; the sample's: one per holder).
    pub weight_held: u64,
    /// The starts the item shows: each holder's `acquired_at` and the item's `started_at`.
    pub starts: Vec<u64>,
    /// The item's start rate, as its spacing (ms).
    pub spacing_ms: Option<u64>,
    /// Waiters in line (ours: the item's `waiting` count).
    pub waiting: u64,
    /// What is inconsistent in it, if anything.
    pub problem: Option<String>,
}

/// A raw item as the poller reads it ([`crate::observe::decode`] for ours); with `limit`, a
/// sum of weights above it is a problem too. A gate's holders are not in its item: see
/// [`LockItems::read`].
pub fn read(layout: Layout, item: &RawRecord, limit: Option<u32>) -> Read {
    match layout {
        Layout::Versioned => read_observed(&observe::decode(item), limit),
        Layout::Sample => {
            let (holders, problem) = crate::sample::read_item(item);
            Read {
                weight_held: holders.len() as u64,
                holders,
                problem,
                ..Read::default()
            }
        }
    }
}

fn read_observed(seen: &observe::Observed, limit: Option<u32>) -> Read {
    Read {
        holders: seen.holder_executions(),
        weight_held: seen.weight_held(),
        starts: seen.starts(),
        spacing_ms: seen.spacing_ms,
        waiting: seen.waiting,
        problem: seen.problem(limit.map(u64::from)),
    }
}

/// The lock items of a run, read raw (consistent reads), as the poller and the checks read them.
#[derive(Clone)]
pub struct LockItems {
    pub client: aws_sdk_dynamodb::Client,
    pub table: String,
    /// Where gate locks keep their holdings (ours; the sample's: none).
    pub holdings_table: Option<String>,
    pub layout: Layout,
}

impl LockItems {
    /// The product's store on these tables, for what an operator does (`semctl lock set`),
    /// never for the checks' reads.
    pub fn operator_store(&self) -> semaphore_core::DynamoStore {
        let store = semaphore_core::DynamoStore::new(self.client.clone(), &self.table);
        match &self.holdings_table {
            Some(holdings) => store.with_holdings_table(holdings),
            None => store,
        }
    }

    /// The item of `lock` now, raw; `None` when it has none.
    pub async fn item(&self, lock: &str) -> Result<Option<RawRecord>, Error> {
        self.client
            .get_item()
            .table_name(&self.table)
            .key("lock", AttributeValue::S(lock.to_owned()))
            .consistent_read(true)
            .send()
            .await
            .map(|answer| answer.item)
            .map_err(Error::aws(format!("GetItem {lock}")))
    }

    /// `lock` read now ([`read`]), `None` when it has no item. A gate (format 8) is read as
    /// its item, the `Query` of its holding items, and its item again: the stored sums are
    /// checked against the holdings only when the gate's version did not move in between (the
    /// local server serves one request at a time, so one `Query` is one moment's holdings, and
    /// S1 is checked on them whatever the gate did).
    pub async fn read(&self, lock: &str, limit: Option<u32>) -> Result<Option<Read>, Error> {
        let Some(item) = self.item(lock).await? else {
            return Ok(None);
        };
        let version = |item: &RawRecord| item.get("version").cloned();
        let is_gate = item
            .get("format")
            .and_then(|f| f.as_n().ok())
            .is_some_and(|f| f == &observe::GATE_FORMAT.to_string());
        if self.layout == Layout::Sample || !is_gate {
            return Ok(Some(read(self.layout, &item, limit)));
        }
        let Some(holdings_table) = &self.holdings_table else {
            return Ok(Some(Read {
                problem: Some(format!("{lock} is a gate, and no holdings table was named")),
                ..Read::default()
            }));
        };
        let holdings = observe::raw_holdings(&self.client, holdings_table, lock).await?;
        let again = self.item(lock).await?;
        let snapshot = again.as_ref().map(version) == Some(version(&item));
        let seen = observe::decode_gate(&item, &holdings, snapshot);
        Ok(Some(read_observed(&seen, limit)))
    }

    /// Who holds a slot of `lock` now.
    pub async fn holders(&self, lock: &str) -> Result<Vec<String>, Error> {
        Ok(self
            .read(lock, None)
            .await?
            .map(|read| read.holders)
            .unwrap_or_default())
    }
}

pub struct Poller {
    pub stats: Arc<Mutex<PollStats>>,
    pub holders: watch::Receiver<BTreeSet<String>>,
    stop: Arc<std::sync::atomic::AtomicBool>,
}

impl Poller {
    /// Polls each of `locks` (name, limit).
    pub fn start(items: LockItems, locks: Vec<(String, u32)>, every: Duration) -> Self {
        let stats = Arc::new(Mutex::new(PollStats {
            locks: locks
                .iter()
                .map(|(l, _)| (l.clone(), LockPoll::default()))
                .collect(),
            started_ms: now_ms(),
            ..PollStats::default()
        }));
        let (tx, rx) = watch::channel(BTreeSet::new());
        let tx = Arc::new(tx);
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        // Who each lock's last read saw; the union is what `holders` tells.
        let seen: Arc<Mutex<BTreeMap<String, BTreeSet<String>>>> = Arc::default();
        // One loop per lock, so that a busy server slows each lock's reads, not their sum.
        for (lock, limit) in locks {
            let (items, task_stats, task_stop, seen, tx) = (
                items.clone(),
                stats.clone(),
                stop.clone(),
                seen.clone(),
                tx.clone(),
            );
            tokio::spawn(async move {
                while !task_stop.load(std::sync::atomic::Ordering::SeqCst) {
                    let sent_ms = now_ms();
                    let answer = items.read(&lock, Some(limit)).await;
                    let answered_ms = now_ms();
                    {
                        let mut stats = task_stats.lock().expect("poll stats");
                        let stats = &mut *stats;
                        match answer {
                            Err(_) => {
                                stats.read_errors += 1;
                                stats.locks.entry(lock.clone()).or_default().read_errors += 1;
                            }
                            Ok(out) => {
                                stats.reads += 1;
                                let Read {
                                    holders,
                                    weight_held,
                                    starts,
                                    spacing_ms,
                                    waiting,
                                    problem,
                                } = out.unwrap_or_default();
                                let n = holders.len();
                                let poll = stats.locks.entry(lock.clone()).or_default();
                                poll.reads += 1;
                                poll.max_weight = poll.max_weight.max(weight_held);
                                poll.starts.extend(starts);
                                if spacing_ms.is_some() {
                                    poll.spacing_ms = spacing_ms;
                                }
                                if let Some(problem) = problem {
                                    poll.inconsistent_reads += 1;
                                    stats.inconsistent_reads += 1;
                                    if poll.first_inconsistency.is_none() {
                                        poll.first_inconsistency = Some(problem);
                                    }
                                }
                                poll.max_holders = poll.max_holders.max(n);
                                poll.holders_now = n;
                                let sample = Sample {
                                    at_ms: answered_ms,
                                    weight: weight_held,
                                    waiting,
                                };
                                if poll.samples.last().is_none_or(|last| {
                                    (last.weight, last.waiting) != (sample.weight, sample.waiting)
                                }) {
                                    poll.samples.push(sample);
                                }
                                let now: BTreeSet<String> = holders.into_iter().collect();
                                let mut seen = seen.lock().expect("seen");
                                let before = seen.entry(lock.clone()).or_default();
                                for gone in before.difference(&now) {
                                    stats.gone_ms.insert(gone.clone(), answered_ms);
                                }
                                for holder in &now {
                                    stats.last_seen_ms.insert(holder.clone(), sent_ms);
                                    stats.gone_ms.remove(holder);
                                }
                                *before = now;
                                stats.holders_now = seen.values().map(BTreeSet::len).sum();
                                let _ = tx.send(seen.values().flatten().cloned().collect());
                            }
                        }
                    }
                    // A lock whose read takes long (a gate's Query of 1,000 holdings) is read
                    // less often.
                    let took = Duration::from_millis(
                        u64::try_from(now_ms().saturating_sub(sent_ms)).unwrap_or_default(),
                    );
                    tokio::time::sleep(paced(every, took)).await;
                }
            });
        }
        Self {
            stats,
            holders: rx,
            stop,
        }
    }

    pub fn stats(&self) -> PollStats {
        self.stats.lock().expect("poll stats").clone()
    }

    pub fn stop(&self) {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}
