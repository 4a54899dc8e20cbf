//! An independent poller of the table: reads the raw item of every lock of the run (consistent
//! `GetItem`s, one lock after the other) many times a second, decoded here without the
//! product's decoder, and records, per lock, who holds a slot and whether the item is
//! consistent. The invariant checks are made on what it saw, not on what the Lambdas say.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use aws_sdk_dynamodb::types::AttributeValue;
use serde::Serialize;
use tokio::sync::watch;

/// The item layout to read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// Ours (item format 4): `holders` map keyed `<holder>#<acquisition>`, each entry one number
    /// `(weight - 1) * 10^28 + acquired_at_ms * 10^15 + token`; `version`; `used`, the stored
    /// sum of the holders' weights (the acquire's condition checks it against the limit);
    /// `started_at`, the last start, and `spacing_ms`, the last acquisition's start rate.
    Versioned,
    /// The original sample's: `count` and one `holder:<execution>` attribute per holder.
    Reference,
}

/// The token part of a packed holder entry (its last 15 digits).
const TOKEN_SPAN: u128 = 1_000_000_000_000_000;
/// The weight part of a packed holder entry: `weight - 1` times this (after 13 digits of time).
const WEIGHT_SPAN: u128 = TOKEN_SPAN * 10_000_000_000_000;

/// What the poller saw of one lock.
#[derive(Debug, Default, Clone, Serialize)]
pub struct LockPoll {
    pub reads: u64,
    pub read_errors: u64,
    pub max_holders: usize,
    /// The largest sum of the holders' weights one read saw (ours; the sample's: holders).
    pub max_weight: u64,
    /// Reads of an inconsistent item. Ours: not format 4, a holder entry that is not a packed
    /// number of weight 1 to 1000, a token above the version, two holders with one token (every
    /// write bumps the version and a token is the version its acquire made), a stored `used`
    /// that differs from the sum of the holders' weights, or that sum above the lock's limit.
    /// The sample's: a stored count that differs from the number of holders.
    pub inconsistent_reads: u64,
    pub first_inconsistency: Option<String>,
    pub holders_now: usize,
    /// (seconds since start, holders) each time the number changed.
    pub timeline: Vec<(f64, usize)>,
    /// Every start of the lock a read saw (epoch ms, the writers' clock): each holder's
    /// `acquired_at` and the item's `started_at`.
    #[serde(skip)]
    pub starts: BTreeSet<u64>,
    /// The start rate the item last carried, as its spacing (ms).
    pub spacing_ms: Option<u64>,
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

pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or_default()
}

/// One read of a lock's raw item, decoded here (not by the product's decoder).
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
    /// What is inconsistent in it, if anything.
    pub problem: Option<String>,
}

/// Holders (execution ARNs, one per slot) of a raw item, and what is inconsistent in it, if
/// anything.
pub fn decode(
    layout: Layout,
    item: &std::collections::HashMap<String, AttributeValue>,
) -> (Vec<String>, Option<String>) {
    let read = read(layout, item, None);
    (read.holders, read.problem)
}

/// A raw item as the poller reads it; with `limit`, a sum of weights above it is a problem too.
pub fn read(
    layout: Layout,
    item: &std::collections::HashMap<String, AttributeValue>,
    limit: Option<u32>,
) -> Read {
    let number = |name: &str| -> Option<u128> {
        item.get(name)
            .and_then(|v| v.as_n().ok())
            .and_then(|n| n.parse().ok())
    };
    match layout {
        Layout::Versioned => {
            let entries = item.get("holders").and_then(|v| v.as_m().ok());
            // Keys are `<holder>#<acquisition>`; acquisition ids have no '#'. A key without
            // one is kept whole, so it still counts as a holder and shows up in the report.
            let holders = entries
                .map(|m| {
                    m.keys()
                        .map(|key| key.rsplit_once('#').map_or(key.as_str(), |(h, _)| h))
                        .map(str::to_owned)
                        .collect()
                })
                .unwrap_or_default();
            let mut read = Read {
                holders,
                spacing_ms: number("spacing_ms").and_then(|n| u64::try_from(n).ok()),
                ..Read::default()
            };
            let started_at = number("started_at").and_then(|n| u64::try_from(n).ok());
            read.starts.extend(started_at);
            read.problem = match (number("format"), number("version"), entries) {
                (format, _, _) if format != Some(4) => {
                    Some(format!("format {:?}, not 4", item.get("format")))
                }
                (_, Some(version), Some(entries)) => match holdings(version, entries) {
                    Err(problem) => Some(problem),
                    Ok(held) => {
                        read.weight_held = held.iter().map(|h| h.weight).sum();
                        read.starts.extend(held.iter().map(|h| h.acquired_at_ms));
                        let used = number("used");
                        if used != Some(u128::from(read.weight_held)) {
                            Some(format!(
                                "used {used:?} with holders of weights summing to {}",
                                read.weight_held
                            ))
                        } else if limit.is_some_and(|l| read.weight_held > u64::from(l)) {
                            Some(format!(
                                "weight {} held, above the limit {}",
                                read.weight_held,
                                limit.unwrap_or_default()
                            ))
                        } else {
                            None
                        }
                    }
                },
                _ => Some("no version or no holders map".to_owned()),
            };
            read
        }
        Layout::Reference => {
            let holders: Vec<String> = item
                .keys()
                .filter_map(|k| k.strip_prefix("holder:").map(str::to_owned))
                .collect();
            let count = number("count");
            let problem = (count != Some(holders.len() as u128))
                .then(|| format!("count {count:?} with {} holders", holders.len()));
            Read {
                weight_held: holders.len() as u64,
                holders,
                problem,
                ..Read::default()
            }
        }
    }
}

/// One holder entry of ours, unpacked.
struct Held {
    weight: u64,
    acquired_at_ms: u64,
}

/// Our holder entries unpacked, or what is wrong with them: each must be a packed number of a
/// weight from 1 to 1000 and a token the version has reached, and no two may share a token.
fn holdings(
    version: u128,
    entries: &std::collections::HashMap<String, AttributeValue>,
) -> Result<Vec<Held>, String> {
    let mut tokens = BTreeMap::new();
    let mut held = Vec::with_capacity(entries.len());
    for (key, value) in entries {
        let Some(packed) = value.as_n().ok().and_then(|n| n.parse::<u128>().ok()) else {
            return Err(format!("holder {key} is {value:?}, not a number"));
        };
        let weight = packed / WEIGHT_SPAN + 1;
        let token = packed % TOKEN_SPAN;
        if weight > 1000 {
            return Err(format!("holder {key} has weight {weight}"));
        }
        if token == 0 || token > version {
            return Err(format!("holder {key} has token {token}, version {version}"));
        }
        if let Some(other) = tokens.insert(token, key) {
            return Err(format!("holders {other} and {key} share token {token}"));
        }
        held.push(Held {
            weight: weight as u64,
            acquired_at_ms: ((packed % WEIGHT_SPAN) / TOKEN_SPAN) as u64,
        });
    }
    Ok(held)
}

pub struct Poller {
    pub stats: Arc<Mutex<PollStats>>,
    pub holders: watch::Receiver<BTreeSet<String>>,
    stop: Arc<std::sync::atomic::AtomicBool>,
}

impl Poller {
    /// Polls each of `locks` (name, limit).
    pub fn start(
        client: aws_sdk_dynamodb::Client,
        table: String,
        locks: Vec<(String, u32)>,
        layout: Layout,
        every: Duration,
    ) -> Self {
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
        let started = Instant::now();
        // One loop per lock, so that a busy server slows each lock's reads, not their sum.
        for (lock, limit) in locks {
            let (client, table, task_stats, task_stop, seen, tx) = (
                client.clone(),
                table.clone(),
                stats.clone(),
                stop.clone(),
                seen.clone(),
                tx.clone(),
            );
            tokio::spawn(async move {
                let mut last = usize::MAX;
                while !task_stop.load(std::sync::atomic::Ordering::SeqCst) {
                    let sent_ms = now_ms();
                    let answer = client
                        .get_item()
                        .table_name(&table)
                        .key("lock", AttributeValue::S(lock.clone()))
                        .consistent_read(true)
                        .send()
                        .await;
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
                                    problem,
                                } = out
                                    .item
                                    .as_ref()
                                    .map(|item| read(layout, item, Some(limit)))
                                    .unwrap_or_default();
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
                                if n != last {
                                    last = n;
                                    poll.timeline.push((started.elapsed().as_secs_f64(), n));
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
                    tokio::time::sleep(every).await;
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

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn n(v: &str) -> AttributeValue {
        AttributeValue::N(v.to_owned())
    }

    fn ours(version: &str, holders: &[(&str, &str)]) -> HashMap<String, AttributeValue> {
        HashMap::from([
            ("lock".to_owned(), AttributeValue::S("l".to_owned())),
            ("format".to_owned(), n("4")),
            ("version".to_owned(), n(version)),
            (
                "holders".to_owned(),
                AttributeValue::M(
                    holders
                        .iter()
                        .map(|(k, v)| ((*k).to_owned(), n(v)))
                        .collect(),
                ),
            ),
        ])
    }

    fn with_used(
        mut item: HashMap<String, AttributeValue>,
        used: &str,
    ) -> HashMap<String, AttributeValue> {
        item.insert("used".to_owned(), n(used));
        item
    }

    #[test]
    fn reads_our_holders_and_checks_tokens_against_the_version() {
        let item = with_used(
            ours(
                "7",
                &[
                    ("arn:x:run-1#a-1", "1767225600000000000000000003"),
                    ("arn:x:run-2#a-9", "1767225600001000000000000007"),
                ],
            ),
            "2",
        );
        let (mut holders, problem) = decode(Layout::Versioned, &item);
        holders.sort();
        assert_eq!(holders, ["arn:x:run-1", "arn:x:run-2"]);
        assert_eq!(problem, None);
        // A token the version has not reached yet, and two holders with one token.
        let ahead = with_used(ours("7", &[("a#1", "1767225600000000000000000008")]), "1");
        assert!(decode(Layout::Versioned, &ahead)
            .1
            .unwrap()
            .contains("token 8"));
        let shared = with_used(ours("7", &[("a#1", "5"), ("b#1", "1000000000000005")]), "2");
        assert!(decode(Layout::Versioned, &shared)
            .1
            .unwrap()
            .contains("share token 5"));
        // An item of another format (version 1 stored a count and no format; 2 had no `used`, 3 no
        // `held_bytes`).
        let mut old = ours("7", &[]);
        old.remove("format");
        old.insert("count".to_owned(), n("0"));
        assert!(decode(Layout::Versioned, &old).1.unwrap().contains("not 4"));
    }

    #[test]
    fn reads_weights_and_starts_and_checks_used_and_the_limit() {
        // Weight 4 (3 leads) taken at 1767225600000, weight 1 at 1767225600500.
        let item = with_used(
            ours(
                "9",
                &[
                    ("arn:x:run-1#a", "31767225600000000000000000003"),
                    ("arn:x:run-2#a", "1767225600500000000000000009"),
                ],
            ),
            "5",
        );
        let mut item = item;
        item.insert("started_at".to_owned(), n("1767225600500"));
        item.insert("spacing_ms".to_owned(), n("500"));
        let r = read(Layout::Versioned, &item, Some(5));
        assert_eq!((r.weight_held, r.problem.as_deref()), (5, None));
        let mut starts = r.starts.clone();
        starts.sort_unstable();
        assert_eq!(starts, [1767225600000, 1767225600500, 1767225600500]);
        assert_eq!(r.spacing_ms, Some(500));
        // Above the limit, and a stored sum that is not the holders'.
        assert!(read(Layout::Versioned, &item, Some(4))
            .problem
            .unwrap()
            .contains("above the limit 4"));
        let wrong = with_used(item.clone(), "4");
        assert!(read(Layout::Versioned, &wrong, Some(5))
            .problem
            .unwrap()
            .contains("used Some(4)"));
        let mut missing = item;
        missing.remove("used");
        assert!(read(Layout::Versioned, &missing, None).problem.is_some());
    }

    #[test]
    fn reads_the_samples_holders_and_checks_its_count() {
        let item = HashMap::from([
            ("count".to_owned(), n("1")),
            ("holder:arn:x".to_owned(), n("5")),
        ]);
        assert_eq!(
            decode(Layout::Reference, &item),
            (vec!["arn:x".to_owned()], None)
        );
        let item = HashMap::from([
            ("count".to_owned(), n("2")),
            ("holder:arn:x".to_owned(), n("5")),
        ]);
        assert!(decode(Layout::Reference, &item).1.is_some());
    }
}
