//! An independent poller of the table: reads the raw lock item (consistent `GetItem`) many
//! times a second, decoded here without the product's decoder, and records who holds a slot.
//! The invariant checks are made on what it saw, not on what the Lambdas say.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use aws_sdk_dynamodb::types::AttributeValue;
use serde::Serialize;
use tokio::sync::watch;

/// The item layout to read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// Ours: `holders` map keyed `<holder>#<acquisition>`, and `count`.
    Versioned,
    /// The original sample's: `count` and one `holder:<execution>` attribute per holder.
    Reference,
}

#[derive(Debug, Default, Clone, Serialize)]
pub struct PollStats {
    pub reads: u64,
    pub read_errors: u64,
    pub max_holders: usize,
    /// Reads where the stored count differed from the number of holders.
    pub count_mismatches: u64,
    pub first_mismatch: Option<String>,
    pub holders_now: usize,
    /// (seconds since start, holders) each time the number changed.
    pub timeline: Vec<(f64, usize)>,
    /// For each execution seen holding a slot: when the last read that saw it was sent
    /// (milliseconds since the epoch).
    #[serde(skip)]
    pub last_seen_ms: BTreeMap<String, i64>,
}

pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or_default()
}

/// Holders (execution ARNs, one per slot) and the stored count of a raw item.
pub fn decode(
    layout: Layout,
    item: &std::collections::HashMap<String, AttributeValue>,
) -> (Vec<String>, Option<i64>) {
    let count = item
        .get("count")
        .and_then(|v| v.as_n().ok())
        .and_then(|n| n.parse().ok());
    let holders = match layout {
        Layout::Versioned => item
            .get("holders")
            .and_then(|v| v.as_m().ok())
            .map(|m| {
                // Keys are `<holder>#<acquisition>`; acquisition ids have no '#'. A key without
                // one is kept whole, so it still counts as a holder and shows up in the report.
                m.keys()
                    .map(|key| key.rsplit_once('#').map_or(key.as_str(), |(h, _)| h))
                    .map(str::to_owned)
                    .collect()
            })
            .unwrap_or_default(),
        Layout::Reference => item
            .keys()
            .filter_map(|k| k.strip_prefix("holder:").map(str::to_owned))
            .collect(),
    };
    (holders, count)
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
        lock: String,
        layout: Layout,
        every: Duration,
    ) -> Self {
        let stats = Arc::new(Mutex::new(PollStats::default()));
        let (tx, rx) = watch::channel(BTreeSet::new());
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (task_stats, task_stop) = (stats.clone(), stop.clone());
        tokio::spawn(async move {
            let started = Instant::now();
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
                {
                    let mut stats = task_stats.lock().expect("poll stats");
                    match read {
                        Err(_) => stats.read_errors += 1,
                        Ok(out) => {
                            stats.reads += 1;
                            let (holders, count) = out
                                .item
                                .as_ref()
                                .map(|item| decode(layout, item))
                                .unwrap_or_default();
                            let n = holders.len();
                            if out.item.is_some() && count != Some(n as i64) {
                                stats.count_mismatches += 1;
                                if stats.first_mismatch.is_none() {
                                    stats.first_mismatch =
                                        Some(format!("count {count:?} with {n} holders"));
                                }
                            }
                            for holder in &holders {
                                stats.last_seen_ms.insert(holder.clone(), sent_ms);
                            }
                            stats.max_holders = stats.max_holders.max(n);
                            stats.holders_now = n;
                            if n != last {
                                last = n;
                                stats.timeline.push((started.elapsed().as_secs_f64(), n));
                            }
                            let _ = tx.send(holders.into_iter().collect());
                        }
                    }
                }
                tokio::time::sleep(every).await;
            }
        });
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
