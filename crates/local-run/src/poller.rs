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
    /// Ours (item format 2): `holders` map keyed `<holder>#<acquisition>`, each entry one number
    /// `acquired_at_ms * 10^15 + token`; `version`; no stored count (the acquire's condition
    /// counts the map).
    Versioned,
    /// The original sample's: `count` and one `holder:<execution>` attribute per holder.
    Reference,
}

/// The token part of a packed holder entry (its last 15 digits).
const TOKEN_SPAN: u128 = 1_000_000_000_000_000;

/// What the poller saw of one lock.
#[derive(Debug, Default, Clone, Serialize)]
pub struct LockPoll {
    pub reads: u64,
    pub read_errors: u64,
    pub max_holders: usize,
    /// Reads of an inconsistent item. Ours: not format 2, a holder entry that is not a
    /// packed number, a token above the version, or two holders with one token (every write
    /// bumps the version and a token is the version its acquire made). The sample's: a stored
    /// count that differs from the number of holders.
    pub inconsistent_reads: u64,
    pub first_inconsistency: Option<String>,
    pub holders_now: usize,
    /// (seconds since start, holders) each time the number changed.
    pub timeline: Vec<(f64, usize)>,
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

/// Holders (execution ARNs, one per slot) of a raw item, and what is inconsistent in it, if
/// anything.
pub fn decode(
    layout: Layout,
    item: &std::collections::HashMap<String, AttributeValue>,
) -> (Vec<String>, Option<String>) {
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
            let problem = match (number("format"), number("version"), entries) {
                (format, _, _) if format != Some(2) => {
                    Some(format!("format {:?}, not 2", item.get("format")))
                }
                (_, Some(version), Some(entries)) => token_problem(version, entries),
                _ => Some("no version or no holders map".to_owned()),
            };
            (holders, problem)
        }
        Layout::Reference => {
            let holders: Vec<String> = item
                .keys()
                .filter_map(|k| k.strip_prefix("holder:").map(str::to_owned))
                .collect();
            let count = number("count");
            let problem = (count != Some(holders.len() as u128))
                .then(|| format!("count {count:?} with {} holders", holders.len()));
            (holders, problem)
        }
    }
}

/// What is wrong with our holder entries, if anything: each must be a packed number whose token
/// is one the version has reached, and no two may share one.
fn token_problem(
    version: u128,
    entries: &std::collections::HashMap<String, AttributeValue>,
) -> Option<String> {
    let mut tokens = BTreeMap::new();
    for (key, value) in entries {
        let Some(packed) = value.as_n().ok().and_then(|n| n.parse::<u128>().ok()) else {
            return Some(format!("holder {key} is {value:?}, not a number"));
        };
        let token = packed % TOKEN_SPAN;
        if token == 0 || token > version {
            return Some(format!("holder {key} has token {token}, version {version}"));
        }
        if let Some(other) = tokens.insert(token, key) {
            return Some(format!("holders {other} and {key} share token {token}"));
        }
    }
    None
}

pub struct Poller {
    pub stats: Arc<Mutex<PollStats>>,
    pub holders: watch::Receiver<BTreeSet<String>>,
    stop: Arc<std::sync::atomic::AtomicBool>,
}

impl Poller {
    pub fn start(
        client: aws_sdk_dynamodb::Client,
        table: String,
        locks: Vec<String>,
        layout: Layout,
        every: Duration,
    ) -> Self {
        let stats = Arc::new(Mutex::new(PollStats {
            locks: locks
                .iter()
                .map(|l| (l.clone(), LockPoll::default()))
                .collect(),
            ..PollStats::default()
        }));
        let (tx, rx) = watch::channel(BTreeSet::new());
        let tx = Arc::new(tx);
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        // Who each lock's last read saw; the union is what `holders` tells.
        let seen: Arc<Mutex<BTreeMap<String, BTreeSet<String>>>> = Arc::default();
        let started = Instant::now();
        // One loop per lock, so that a busy server slows each lock's reads, not their sum.
        for lock in locks {
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
                    let read = client
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
                        match read {
                            Err(_) => {
                                stats.read_errors += 1;
                                stats.locks.entry(lock.clone()).or_default().read_errors += 1;
                            }
                            Ok(out) => {
                                stats.reads += 1;
                                let (holders, problem) = out
                                    .item
                                    .as_ref()
                                    .map(|item| decode(layout, item))
                                    .unwrap_or_default();
                                let n = holders.len();
                                let poll = stats.locks.entry(lock.clone()).or_default();
                                poll.reads += 1;
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
            ("format".to_owned(), n("2")),
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

    #[test]
    fn reads_our_holders_and_checks_tokens_against_the_version() {
        let item = ours(
            "7",
            &[
                ("arn:x:run-1#a-1", "1767225600000000000000000003"),
                ("arn:x:run-2#a-9", "1767225600001000000000000007"),
            ],
        );
        let (mut holders, problem) = decode(Layout::Versioned, &item);
        holders.sort();
        assert_eq!(holders, ["arn:x:run-1", "arn:x:run-2"]);
        assert_eq!(problem, None);
        // A token the version has not reached yet, and two holders with one token.
        let ahead = ours("7", &[("a#1", "1767225600000000000000000008")]);
        assert!(decode(Layout::Versioned, &ahead)
            .1
            .unwrap()
            .contains("token 8"));
        let shared = ours("7", &[("a#1", "5"), ("b#1", "1000000000000005")]);
        assert!(decode(Layout::Versioned, &shared)
            .1
            .unwrap()
            .contains("share token 5"));
        // An item of another format (version 1 stored a count and no format).
        let mut old = ours("7", &[]);
        old.remove("format");
        old.insert("count".to_owned(), n("0"));
        assert!(decode(Layout::Versioned, &old).1.unwrap().contains("not 2"));
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
