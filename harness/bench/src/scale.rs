//! Scale (issue #28): locks of limit 10, 100, 1,000 and 10,000 filled to their limit by the
//! bench's own clients (not executions), then critical sections at the full lock, ours against
//! the AWS sample's: the item every section writes (bytes as DynamoDB counts them), write units
//! per section as DynamoDB bills them (1 KB units, rounded up per write), requests per section
//! and acquire latency. A lock that cannot be filled says where it stopped and why: ours keeps
//! its holders within the item's 300 KB holders budget (F9), the sample's item stops at
//! DynamoDB's 400 KB. Ours runs in both layouts: "ours" in the item layout (every holder in the
//! lock's one item), "ours-gate" in the gate layout (each holding an item of its own, written in
//! a transaction with the gate: 2 write units per KB of each item, and the sweep's drop of the
//! tombstone a release leaves, one unit, counted with its section).

use semaphore_core::{Claim, Weight};
use std::collections::HashMap;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use aws_sdk_dynamodb::types::AttributeValue;
use local_aws::counter::RequestCounter;
use local_aws::names::{self, id, limit};
use local_aws::observe::raw_item;
use local_aws::sample::Sample;
use semaphore_core::dynamo::{holding_key, item_size, queue_attr, write_units};
use semaphore_core::{
    AcquireOutcome, Attempt, DynamoStore, ExecutionState, ExecutionStatus, FencingToken, HolderId,
    Identity, Layout, LockName, PortError, QueueOutcome, ReleaseOutcome, Run, Semaphore, TaskToken,
    Waiter, WaiterId, Waker,
};
use serde::Serialize;

use crate::bill::WriteLog;
use crate::common::{execution_arn, uuid};
use crate::stats::{ms, quantile};

#[derive(Debug, Clone, Serialize)]
pub struct ScaleRow {
    pub proto: &'static str,
    pub limit: u32,
    /// Holders when the filling stopped: `limit - 1` (one slot left for the sections), or
    /// fewer when the item could take no more.
    pub holders: usize,
    /// Why the filling stopped short of the limit, if it did.
    pub stopped: Option<String>,
    pub sections: usize,
    /// The largest item the sections' writes met (the lock with a section's holder too), as
    /// DynamoDB sizes it.
    pub item_bytes: usize,
    /// A gate's holding item, held and as a tombstone, at its largest (0: no holding items).
    pub holding_bytes: usize,
    /// Write units one write of a section is billed: of its item, or for a gate's transaction,
    /// twice those of the gate and the holding.
    pub write_units_per_write: usize,
    pub write_units_per_section: f64,
    pub requests_per_section: f64,
    pub acquire_p50_ms: f64,
    pub acquire_p99_ms: f64,
    /// Sections that waited in line at the full lock (ours only; the sample has no line, it
    /// polls): each acquirer finds the lock full, queues, and is granted its slot by the release
    /// of the one before it. Per section: its refused acquire, its look for a record, its
    /// queueing and the hand-off after it, the release before it and the grant that release
    /// hands on, and (a gate) the drop of that release's tombstone.
    pub waited_sections: usize,
    /// The waiter's record as stored (with a 1,000-character task token).
    pub record_bytes: usize,
    pub waited_write_units_per_section: f64,
    pub waited_requests_per_section: f64,
}

/// Runs each limit of `limits` for ours and the sample's, `sections` sections each.
pub async fn run(
    endpoint: &str,
    table: &str,
    limits: &[u32],
    sections: usize,
) -> Result<Vec<ScaleRow>> {
    let counter = RequestCounter::new();
    let log = WriteLog::default();
    let counted = counter.dynamodb_client(endpoint);
    let clients = Clients {
        counted: aws_sdk_dynamodb::Client::from_conf(
            counted
                .config()
                .to_builder()
                .interceptor(log.clone())
                .build(),
        ),
        reader: local_aws::client_for(endpoint),
        log,
    };
    let mut rows = Vec::new();
    for &n in limits {
        rows.push(ours(&counter, &clients, table, n, sections, Layout::Item).await?);
        rows.push(ours(&counter, &clients, table, n, sections, Layout::Gate).await?);
        rows.push(sample(&counter, &clients, table, n, sections).await?);
    }
    Ok(rows)
}

/// The protocols' client, whose requests are counted and whose writes are logged for their
/// bill, and the bench's own reader, whose are not.
struct Clients {
    counted: aws_sdk_dynamodb::Client,
    reader: aws_sdk_dynamodb::Client,
    log: WriteLog,
}

impl Clients {
    /// The lock's item as DynamoDB sizes it now (0: none).
    async fn bytes(&self, table: &str, lock: &str) -> usize {
        raw_item(&self.reader, table, lock)
            .await
            .map_or(0, |item| item_size(&item))
    }

    /// The waiter record of `identity` in `lock`'s line as DynamoDB sizes it now, and its entry
    /// in the keys-only local index `line`: its keys and the 100 bytes DynamoDB adds to every
    /// index entry ("Item sizes" of local secondary indexes). `(0, 0)`: not in line.
    async fn record_bytes(
        &self,
        store: &DynamoStore,
        lock: &LockName,
        identity: &Identity,
    ) -> (usize, usize) {
        let key = [
            (queue_attr::LOCK, lock.to_string()),
            (queue_attr::WAITER, WaiterId::of(identity).render()),
        ]
        .map(|(name, value)| (name.to_owned(), AttributeValue::S(value)));
        let Some(record) = self.item(store.queue_table(), key.into()).await else {
            return (0, 0);
        };
        let entry: HashMap<_, _> = record
            .iter()
            .filter(|(name, _)| {
                [queue_attr::LOCK, queue_attr::WAITER, queue_attr::PLACE].contains(&name.as_str())
            })
            .map(|(name, value)| (name.clone(), value.clone()))
            .collect();
        (item_size(&record), item_size(&entry) + LSI_ENTRY_OVERHEAD)
    }

    /// `identity`'s holding item on gate `lock` as DynamoDB sizes it now (0: none).
    async fn holding_bytes(&self, table: &str, lock: &str, identity: &Identity) -> usize {
        let key = holding_key(&names::lock(lock), identity);
        self.size_of(&DynamoStore::default_holdings_table(table), key)
            .await
    }

    /// The item of `table` under `key` as DynamoDB sizes it now (0: none).
    async fn size_of(&self, table: &str, key: HashMap<String, AttributeValue>) -> usize {
        self.item(table, key)
            .await
            .map_or(0, |item| item_size(&item))
    }

    /// The item of `table` under `key`, read consistently now.
    async fn item(
        &self,
        table: &str,
        key: HashMap<String, AttributeValue>,
    ) -> Option<HashMap<String, AttributeValue>> {
        self.reader
            .get_item()
            .table_name(table)
            .set_key(Some(key))
            .consistent_read(true)
            .send()
            .await
            .ok()
            .and_then(|out| out.item)
    }
}

/// The bytes DynamoDB adds to every entry of a local secondary index when it sizes it.
const LSI_ENTRY_OVERHEAD: usize = 100;

async fn ours(
    counter: &RequestCounter,
    clients: &Clients,
    table: &str,
    n: u32,
    sections: usize,
    layout: Layout,
) -> Result<ScaleRow> {
    let proto = match layout {
        Layout::Item => "ours",
        Layout::Gate => "ours-gate",
    };
    if let Err(e) = semaphore_core::Limit::new(i64::from(n)) {
        return Ok(row(
            proto,
            n,
            0,
            Some(format!("refused: {e}")),
            Billed::default(),
            0,
            &[],
            Waited::default(),
        ));
    }
    let sem = Semaphore::new(DynamoStore::new(clients.counted.clone(), table));
    let lock = names::lock(&format!("scale-{n}-{}", uuid()));
    if layout == Layout::Gate {
        sem.set_layout(&lock, layout).await?;
    }
    let mut stopped = None;
    let mut fillers = Vec::new();
    for i in 0..(n as usize).saturating_sub(1) {
        let who = id(&execution_arn("scale", i), "r0");
        match sem.acquire(&lock, &who, limit(i64::from(n))).await? {
            AcquireOutcome::Acquired { .. } => fillers.push(who),
            AcquireOutcome::Full { .. } => {
                stopped = Some(format!(
                    "full at {} holders: the item's holders budget (F9, 300 KB) binds before the limit",
                    fillers.len()
                ));
                // One slot back, for the sections.
                if let Some(last) = fillers.pop() {
                    sem.release(&lock, &last, Claim::Operator).await?;
                }
                break;
            }
            other => bail!("filling {lock} gave {other:?}"),
        }
    }
    counter.take();
    let mut acquires = Vec::with_capacity(sections);
    let (mut item_bytes, mut holding_bytes) = (0, 0);
    for s in 0..sections {
        let who = id(&execution_arn("scale-section", s), &uuid());
        let started = Instant::now();
        let token = match sem.acquire(&lock, &who, limit(i64::from(n))).await? {
            AcquireOutcome::Acquired { token, .. } => token,
            other => bail!("a section's acquire on the full {lock} gave {other:?}"),
        };
        acquires.push(started.elapsed());
        // The largest item the section's writes meet: the lock at its fullest (a gate's own
        // item and the section's holding).
        item_bytes = item_bytes.max(clients.bytes(table, lock.as_str()).await);
        holding_bytes = holding_bytes.max(clients.holding_bytes(table, lock.as_str(), &who).await);
        let claim = Claim::Slot {
            token,
            weight: Weight::ONE,
        };
        match sem.release(&lock, &who, claim).await? {
            ReleaseOutcome::Released { .. } => {}
            other => bail!("a section's release on {lock} gave {other:?}"),
        }
        holding_bytes = holding_bytes.max(clients.holding_bytes(table, lock.as_str(), &who).await);
    }
    let counts = counter.take();
    let billed = Billed {
        item_bytes,
        holding_bytes,
        writes: counts.get("DynamoDB.UpdateItem") + counts.get("DynamoDB.PutItem"),
        transactions: counts.get("DynamoDB.TransactWriteItems"),
        // Each section's release leaves a tombstone, which a sweep drops: one delete.
        drops: if layout == Layout::Gate {
            acquires.len() as u64
        } else {
            0
        },
    };
    let waited = waited(counter, clients, &sem, &lock, n, sections, billed).await?;
    Ok(row(
        proto,
        n,
        fillers.len(),
        stopped,
        billed,
        counts.total(),
        &acquires,
        waited,
    ))
}

/// Wakes nobody: the bench's waiters are records, not parked executions (the wake-up is Step
/// Functions' `SendTaskSuccess`, no DynamoDB request).
struct Woken;

impl Waker for Woken {
    async fn wake(&self, _: &Waiter, _: FencingToken) -> Result<(), PortError> {
        Ok(())
    }

    async fn defer(&self, _: &Waiter, _: u64) -> Result<(), PortError> {
        Err(PortError::new("no start rate in the scale part"))
    }
}

/// Every holder runs: a hand-off whose wake-up failed would ask.
struct Running;

impl ExecutionStatus for Running {
    async fn describe(&self, _: &HolderId) -> Result<ExecutionState, PortError> {
        Ok(ExecutionState::Running)
    }
}

/// `sections` sections that wait in line at the full `lock`, as the acquire and release
/// functions run them: each acquirer's acquire is refused (full), it looks for its record,
/// queues (a 1,000-character task token) and hands off (nothing free); the holder before it
/// releases and hands its slot on. Counted from the first queueing to the last grant: per
/// section one of each.
async fn waited(
    counter: &RequestCounter,
    clients: &Clients,
    sem: &Semaphore<DynamoStore>,
    lock: &LockName,
    n: u32,
    sections: usize,
    billed: Billed,
) -> Result<Waited> {
    let store = sem.store();
    let terms = limit(i64::from(n));
    let mut before = id(&execution_arn("scale-waited", 0), &uuid());
    // The token the holder before shows when it releases (F15): its acquire's, then its grant's.
    let mut before_token = match sem.acquire(lock, &before, terms).await? {
        AcquireOutcome::Acquired { token, .. } => token,
        other => bail!("the last slot of {lock} gave {other:?}"),
    };
    let token = TaskToken::new("A".repeat(1_000))?;
    let (mut record_bytes, mut entry_bytes, mut gate_bytes) = (0, 0, 0);
    counter.take();
    clients.log.take();
    for s in 1..=sections {
        let who = id(&execution_arn("scale-waited", s), &uuid());
        let now = sem.now_ms();
        match sem.acquire(lock, &who, terms).await? {
            AcquireOutcome::Full { .. } => {}
            other => bail!("a waited section's acquire on the full {lock} gave {other:?}"),
        }
        if sem.waiter(lock, WaiterId::of(&who)).await?.is_some() {
            bail!("{who:?} was in line before it queued");
        }
        let context = format!(
            r#"{{"acquired":true,"lock":"{lock}","holder":"{}","acquisition":"{}","queued_at_ms":{now}}}"#,
            who.holder, who.acquisition
        );
        let waiter = Waiter::new(
            lock.clone(),
            who.clone(),
            Run::FIRST,
            terms,
            now,
            token.clone(),
            Attempt::new(now, 0),
            context,
        );
        match sem.enqueue(&waiter, now).await? {
            QueueOutcome::Queued => {}
            other => bail!("a waited section's queueing on {lock} gave {other:?}"),
        }
        sem.hand_off(lock, None, &Woken, &Running).await?;
        let (record, entry) = clients.record_bytes(store, lock, &who).await;
        (record_bytes, entry_bytes) = (record_bytes.max(record), entry_bytes.max(entry));
        gate_bytes = gate_bytes.max(clients.bytes(store.table(), lock.as_str()).await);
        let claim = Claim::Slot {
            token: before_token,
            weight: Weight::ONE,
        };
        match sem.release(lock, &before, claim).await? {
            ReleaseOutcome::Released { .. } => {}
            other => bail!("a waited section's release on {lock} gave {other:?}"),
        }
        let handed = sem.hand_off(lock, None, &Woken, &Running).await?;
        let [(granted, token)] = handed.woken.as_slice() else {
            bail!(
                "the release on {lock} handed on to {:?}, not {who:?}",
                handed.woken
            );
        };
        if *granted != who {
            bail!("the release on {lock} handed on to {granted:?}, not {who:?}");
        }
        (before, before_token) = (who, *token);
    }
    let (counts, written) = (counter.take(), clients.log.take());
    sem.release(lock, &before, Claim::Operator).await?;
    let bytes = |table: &str| {
        if table == store.table() {
            gate_bytes.max(billed.item_bytes)
        } else if table == store.holdings_table() {
            billed.holding_bytes
        } else {
            record_bytes
        }
    };
    // A gate's release leaves a tombstone, which a sweep drops: one plain delete per section,
    // as in the uncontended sections.
    let drops = if billed.drops > 0 {
        sections as u64 * write_units(billed.holding_bytes) as u64
    } else {
        0
    };
    let units = written.units(bytes, &[(store.queue_table(), entry_bytes)]) + drops;
    Ok(Waited {
        sections,
        record_bytes,
        units_per_section: units as f64 / sections as f64,
        requests_per_section: counts.total() as f64 / sections as f64,
    })
}

/// What [`waited`] measured.
#[derive(Debug, Clone, Copy)]
struct Waited {
    sections: usize,
    record_bytes: usize,
    units_per_section: f64,
    requests_per_section: f64,
}

impl Default for Waited {
    fn default() -> Self {
        Self {
            sections: 0,
            record_bytes: 0,
            units_per_section: f64::NAN,
            requests_per_section: f64::NAN,
        }
    }
}

/// What a run's sections wrote, and the items they wrote, for DynamoDB's bill.
#[derive(Debug, Default, Clone, Copy)]
struct Billed {
    item_bytes: usize,
    holding_bytes: usize,
    /// Plain writes of the lock's item.
    writes: u64,
    /// Transactions over a gate and a holding (billed twice per KB of each).
    transactions: u64,
    /// Plain deletes of a tombstone.
    drops: u64,
}

impl Billed {
    /// Write units of one write of a section: its plain item's, or a transaction's.
    fn per_write(&self) -> usize {
        if self.transactions > 0 {
            2 * (write_units(self.item_bytes) + write_units(self.holding_bytes))
        } else {
            write_units(self.item_bytes)
        }
    }

    fn total(&self) -> f64 {
        let plain = self.writes as f64 * write_units(self.item_bytes) as f64;
        let transacted = self.transactions as f64
            * 2.0
            * (write_units(self.item_bytes) + write_units(self.holding_bytes)) as f64;
        plain + transacted + self.drops as f64 * write_units(self.holding_bytes) as f64
    }
}

async fn sample(
    counter: &RequestCounter,
    clients: &Clients,
    table: &str,
    n: u32,
    sections: usize,
) -> Result<ScaleRow> {
    let sample = Sample {
        client: clients.counted.clone(),
        table: table.to_owned(),
    };
    let lock = format!("scale-sample-{n}-{}", uuid());
    sample.init(&lock).await;
    let mut stopped = None;
    let mut holders = 0;
    for i in 0..(n as usize).saturating_sub(1) {
        match sample
            .try_acquire(&lock, &execution_arn("scale", i), i64::from(n))
            .await
        {
            Ok(true) => holders += 1,
            Ok(false) => bail!("the sample's {lock} was full at {holders} holders of {n}"),
            Err(e) if e.contains("exceeded the maximum allowed size") => {
                stopped = Some(format!(
                    "refused at {holders} holders: the item would pass DynamoDB's 400 KB"
                ));
                break;
            }
            Err(e) => bail!("filling the sample's {lock}: {e}"),
        }
    }
    // Room for the sections' holders at the item's limit: two slots back.
    for _ in 0..2 {
        if stopped.is_some() && holders > 0 {
            sample
                .release(&lock, &execution_arn("scale", holders - 1))
                .await;
            holders -= 1;
        }
    }
    counter.take();
    let mut acquires = Vec::with_capacity(sections);
    let mut item_bytes = 0;
    for s in 0..sections {
        let holder = execution_arn("scale-section", s);
        let started = Instant::now();
        match sample.try_acquire(&lock, &holder, i64::from(n)).await {
            Ok(true) => {}
            Ok(false) => bail!("a section's acquire on the sample's full {lock} was refused"),
            // The local server keeps refusing writes of an item that once reached 400 KB,
            // even with room made: no section runs on it.
            Err(e) if e.contains("exceeded the maximum allowed size") => {
                stopped = stopped.map(|s| format!("{s}; no section could write it after"));
                acquires.clear();
                break;
            }
            Err(e) => bail!("a section's acquire on the sample's full {lock} failed: {e}"),
        }
        acquires.push(started.elapsed());
        item_bytes = item_bytes.max(clients.bytes(table, &lock).await);
        if !sample.release(&lock, &holder).await {
            bail!("a section's release on the sample's {lock} was refused");
        }
    }
    let counts = counter.take();
    let billed = Billed {
        item_bytes,
        writes: counts.get("DynamoDB.UpdateItem") + counts.get("DynamoDB.PutItem"),
        ..Billed::default()
    };
    Ok(row(
        "sample",
        n,
        holders,
        stopped,
        billed,
        counts.total(),
        &acquires,
        Waited::default(),
    ))
}

#[allow(clippy::too_many_arguments)]
fn row(
    proto: &'static str,
    n: u32,
    holders: usize,
    stopped: Option<String>,
    billed: Billed,
    requests: u64,
    acquires: &[Duration],
    waited: Waited,
) -> ScaleRow {
    // No section ran: nothing per section to say.
    let sections = if acquires.is_empty() {
        f64::NAN
    } else {
        acquires.len() as f64
    };
    let latencies: Vec<f64> = acquires.iter().copied().map(ms).collect();
    ScaleRow {
        proto,
        limit: n,
        holders,
        stopped,
        sections: acquires.len(),
        item_bytes: billed.item_bytes,
        holding_bytes: billed.holding_bytes,
        write_units_per_write: if acquires.is_empty() {
            0
        } else {
            billed.per_write()
        },
        write_units_per_section: billed.total() / sections,
        requests_per_section: requests as f64 / sections,
        acquire_p50_ms: quantile(&latencies, 0.5).unwrap_or(f64::NAN),
        acquire_p99_ms: quantile(&latencies, 0.99).unwrap_or(f64::NAN),
        waited_sections: waited.sections,
        record_bytes: waited.record_bytes,
        waited_write_units_per_section: waited.units_per_section,
        waited_requests_per_section: waited.requests_per_section,
    }
}
