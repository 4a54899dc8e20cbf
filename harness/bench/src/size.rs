//! (c) Item size: how big the semaphore item gets, in bytes as DynamoDB counts them, on a quiet
//! lock and at a steady 10 critical sections per second, then through cleanups (simulated time
//! with a `ManualClock`, in memory, the default `Timing`); what one write then costs in write
//! units; and from that, on paper, how many critical sections per second one lock can take
//! before its partition's write throughput binds.
//!
//! The fences are the part that grows with the rate: each release (and cleanup) adds an 8-byte
//! fence, and a rotation, at most once per fence window W, drops the generation older than
//! that. A release or cleanup rotates only once the young generation holds at least 8 fences
//! (`BUSY_YOUNG_FENCES`), so a generation is the fences of one window or 8, whichever is more,
//! and the item carries at most 2 x max(8, rate x W + 1) of them (see `rule::worst_fences`): 16
//! on a quiet lock, about 2 x rate x W on a busy one.

use semaphore_core::Claim;
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use aws_sdk_dynamodb::types::AttributeValue;
use local_aws::names::{self, id};
use semaphore_core::dynamo::{item_size, stored_size, write_units};
use semaphore_core::{
    AcquireOutcome, Clock, FenceKey, FencingToken, HolderId, Holding, Identity, ItemStore, Limit,
    LockName, ManualClock, MemoryStore, Semaphore, SemaphoreItem, StoreError, Timing, Version,
    Write, WriteResult,
};
use serde::Serialize;

use crate::common::{execution_arn, uuid};
use crate::rule::{rotations_between, worst_fences, FenceModel, BUSY_YOUNG_FENCES};
use crate::writes::{CountedStore, WriteCounter};

/// What one partition takes: 1,000 write units per second ("Partitions and data distribution",
/// Amazon DynamoDB Developer Guide), on demand or provisioned alike.
pub const PARTITION_WCU_PER_SECOND: f64 = 1_000.0;

/// DynamoDB's item size limit.
const ITEM_LIMIT_BYTES: usize = 400 * 1024;

/// A start time with the digits of a real one (it is stored in holdings and `rotated_at`).
const T0_MS: u64 = 1_796_000_000_000;

#[derive(Debug, Clone, Serialize)]
pub struct SizePoint {
    pub phase: &'static str,
    pub operations: usize,
    pub simulated_seconds: f64,
    pub holders: usize,
    /// Fences kept (young + old).
    pub fences: usize,
    pub young: usize,
    pub old: usize,
    pub bytes: usize,
    /// What one write of the lock costs (billed on the larger of the item before and after).
    pub write_units_per_write: usize,
}

#[derive(Debug, Clone, Serialize)]
pub struct SizeModel {
    /// Bytes of the item with a limit, no holder and no fence (lock name "demo-lock").
    pub base_bytes: usize,
    /// Bytes one more holder adds (execution ARN of 93 characters, UUID acquisition id).
    pub holder_bytes: usize,
    /// Bytes one more fence adds (an 8-byte element of a binary set).
    pub fence_bytes: usize,
    /// Bytes the fence attributes themselves add once there are fences in both generations and
    /// a rotation time (their names and `rotated_at`).
    pub fence_attributes_bytes: usize,
    /// The AWS sample's item, for comparison: base and per holder.
    pub sample_base_bytes: usize,
    pub sample_holder_bytes: usize,
}

impl SizeModel {
    /// The item's bytes with `holders` slots held and `fences` fences kept.
    pub fn bytes(&self, holders: usize, fences: f64) -> f64 {
        let fenced = if fences > 0.0 {
            self.fence_attributes_bytes as f64
        } else {
            0.0
        };
        self.base_bytes as f64
            + fenced
            + (holders * self.holder_bytes) as f64
            + fences * self.fence_bytes as f64
    }
}

/// One simulated run of acquire/release cycles at a fixed rate.
#[derive(Debug, Clone, Serialize)]
pub struct Steady {
    pub lock: &'static str,
    pub cs_per_second: f64,
    pub cycles: usize,
    pub simulated_seconds: f64,
    /// The item with its `limit` holders before any release (no fence yet).
    pub bytes_without_fences: usize,
    /// Largest and last item seen, after any write (the largest: just after the fencing write
    /// that completes a generation, before the rotation it makes).
    pub max_bytes: usize,
    pub final_bytes: usize,
    pub max_fences: usize,
    pub max_write_units_per_write: usize,
    /// The worst case of the model at this rate: base + holders + 8 x 2 max(8, rate x W + 1).
    pub model_max_bytes: f64,
    pub writes_per_section: f64,
    pub rotations: u64,
    pub rotations_per_section: f64,
}

/// The per-lock ceiling, on paper, from the model and the defaults.
#[derive(Debug, Clone, Serialize)]
pub struct Ceiling {
    pub formula: String,
    pub holders: usize,
    pub window_seconds: f64,
    pub partition_wcu_per_second: f64,
    /// The largest rate (to 0.1 CS/s) whose writes fit the partition.
    pub cs_per_second: f64,
    pub item_bytes_at_ceiling: f64,
    pub write_units_per_write_at_ceiling: usize,
    pub wcu_per_second_at_ceiling: f64,
    /// The sample: two writes of one unit per critical section (its item stays under 1 KB).
    pub sample_cs_per_second: f64,
    /// The rate at which the item would reach DynamoDB's 400 KB (far past the ceiling).
    pub cs_per_second_for_400kb: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct SizeReport {
    pub limit: i64,
    pub horizon_seconds: f64,
    pub clock_skew_seconds: f64,
    pub window_seconds: f64,
    pub quiet: Steady,
    pub steady: Steady,
    pub cleanups: usize,
    pub cleanups_per_second: f64,
    pub points: Vec<SizePoint>,
    pub model: SizeModel,
    pub ceiling: Ceiling,
    /// Whether the fences kept, the most ever kept and the rotations made were exactly those the
    /// rule predicts, after every phase.
    pub fences_as_predicted: bool,
    pub mismatches: Vec<String>,
}

/// The bytes of the empty item, one holder, one fence, and the fence attributes, measured on
/// encoded items.
pub fn model() -> SizeModel {
    let mut item = SemaphoreItem::empty(names::lock("demo-lock"));
    item.limit = Some(names::limit(5));
    item.version = Version(123_456);
    // A lock that has had an acquisition keeps when it last started.
    item.started_at_ms = Some(T0_MS + 100);
    let base = stored_size(&item);
    let who = id(&execution_arn("model", 1), &uuid());
    item.holders.insert(
        who.clone(),
        Holding {
            token: FencingToken(123_456),
            acquired_at_ms: T0_MS + 123,
            weight: semaphore_core::Weight::ONE,
        },
    );
    item.used = 1;
    let with_holder = stored_size(&item);
    let fence = |n: usize| {
        FenceKey::execution(
            &HolderId::new(format!("h{n}")).expect("holder"),
            semaphore_core::Run::FIRST,
        )
    };
    item.fences.young.insert(fence(0));
    item.fences.old.insert(fence(1));
    item.fences.rotated_at_ms = Some(T0_MS + 456);
    let with_attributes = stored_size(&item);
    item.fences.young.insert(fence(2));
    let with_fence = stored_size(&item);
    let fence_bytes = with_fence - with_attributes;

    // The sample's item: {"LockName": S, "currentlockcount": N, "<execution ARN>": S(entered time)}.
    let mut sample = HashMap::from([
        (
            "LockName".to_owned(),
            AttributeValue::S("demo-lock".to_owned()),
        ),
        (
            "currentlockcount".to_owned(),
            AttributeValue::N("5".to_owned()),
        ),
    ]);
    let sample_base = item_size(&sample);
    sample.insert(
        execution_arn("model", 1),
        AttributeValue::S("2026-01-01T00:00:00.000Z".to_owned()),
    );
    SizeModel {
        base_bytes: base,
        holder_bytes: with_holder - base,
        fence_bytes,
        fence_attributes_bytes: with_attributes - with_holder - 2 * fence_bytes,
        sample_base_bytes: sample_base,
        sample_holder_bytes: item_size(&sample) - sample_base,
    }
}

/// Write units per second of one lock at `rate` critical sections per second, at the model's
/// worst case: two writes per section and a rotation per window (every rotation, a writer's or
/// the sweeper's, comes at least a window after the last; near the ceiling a writer's comes once
/// per window exactly, its 8 young fences long since kept), each billed on an item with
/// `holders` slots and the most fences the rule lets it carry at that rate.
fn wcu_per_second(
    model: &SizeModel,
    holders: usize,
    window_s: f64,
    rate: f64,
) -> (f64, f64, usize) {
    let bytes = model.bytes(holders, worst_fences(rate, window_s, BUSY_YOUNG_FENCES));
    let units = write_units(bytes.ceil() as usize);
    ((2.0 * rate + 1.0 / window_s) * units as f64, bytes, units)
}

pub fn ceiling(model: &SizeModel, holders: usize, window: Duration) -> Ceiling {
    let w = window.as_secs_f64();
    // Write units per second only grow with the rate: the last rate that fits is the ceiling.
    let mut rate = 0.0;
    while wcu_per_second(model, holders, w, rate + 0.1).0 <= PARTITION_WCU_PER_SECOND {
        rate += 0.1;
    }
    let rate = (rate * 10.0_f64).round() / 10.0;
    let (wcu, bytes, units) = wcu_per_second(model, holders, w, rate);
    let room =
        ITEM_LIMIT_BYTES as f64 - model.bytes(holders, 0.0) - model.fence_attributes_bytes as f64;
    let sample_units = write_units(model.sample_base_bytes + holders * model.sample_holder_bytes);
    let busy = BUSY_YOUNG_FENCES;
    Ceiling {
        formula: format!(
            "WCU/s = (2 r + 1/W) x ceil(S / 1 KB) <= {PARTITION_WCU_PER_SECOND}, S = {} + {holders} x {} + {} x 2 max({busy}, r W + 1) bytes, W = {w} s",
            model.base_bytes + model.fence_attributes_bytes,
            model.holder_bytes,
            model.fence_bytes
        ),
        holders,
        window_seconds: w,
        partition_wcu_per_second: PARTITION_WCU_PER_SECOND,
        cs_per_second: rate,
        item_bytes_at_ceiling: bytes,
        write_units_per_write_at_ceiling: units,
        wcu_per_second_at_ceiling: wcu,
        sample_cs_per_second: PARTITION_WCU_PER_SECOND / (2.0 * sample_units as f64),
        // 2 (r W + 1) fences fill the room (far more than 2 x 8: the threshold plays no part).
        cs_per_second_for_400kb: (room / model.fence_bytes as f64 - 2.0) / (2.0 * w),
    }
}

/// The memory store, noting the largest item any write leaves: a release or cleanup that rotates
/// is two writes, and the item between them (its fence added, the generations not yet rotated)
/// is the largest the lock's item ever is.
#[derive(Debug, Default)]
struct Watched {
    inner: MemoryStore,
    /// Bytes and fences of the largest item written since the last `take`.
    largest: Mutex<(usize, usize)>,
}

impl Watched {
    fn take(&self) -> (usize, usize) {
        std::mem::take(&mut *self.largest.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

impl ItemStore for Watched {
    async fn load(&self, lock: &LockName) -> Result<Option<SemaphoreItem>, StoreError> {
        self.inner.load(lock).await
    }

    async fn write(&self, write: &Write) -> Result<WriteResult, StoreError> {
        let result = self.inner.write(write).await;
        if let (Ok(WriteResult::Applied { .. }), Some(item)) =
            (&result, self.inner.load_now(&write.lock))
        {
            let mut largest = self.largest.lock().unwrap_or_else(|p| p.into_inner());
            largest.0 = largest.0.max(stored_size(&item));
            largest.1 = largest.1.max(item.fences.len());
        }
        result
    }

    async fn list_page(
        &self,
        after: Option<&semaphore_core::ListCursor>,
    ) -> Result<semaphore_core::ListPage, StoreError> {
        self.inner.list_page(after).await
    }
    async fn waiters(
        &self,
        lock: &LockName,
        after: Option<semaphore_core::QueueKey>,
        limit: usize,
    ) -> Result<Vec<semaphore_core::Waiter>, StoreError> {
        self.inner.waiters(lock, after, limit).await
    }

    async fn waiter(
        &self,
        lock: &LockName,
        id: semaphore_core::WaiterId,
    ) -> Result<Option<semaphore_core::Waiter>, StoreError> {
        self.inner.waiter(lock, id).await
    }
}

struct Sim {
    sem: Semaphore<CountedStore<Watched>>,
    clock: Arc<ManualClock>,
    writes: WriteCounter,
    window_ms: u64,
    points: Vec<SizePoint>,
    mismatches: Vec<String>,
}

/// One lock driven by the simulation.
struct Lock {
    name: LockName,
    limit: Limit,
    held: VecDeque<Identity>,
    fences: FenceModel,
    max_bytes: usize,
    max_fences: usize,
}

impl Sim {
    fn item(&self, lock: &Lock) -> SemaphoreItem {
        self.sem
            .store()
            .inner()
            .inner
            .load_now(&lock.name)
            .expect("the item exists")
    }

    /// Folds the largest item the lock's last writes left into its maxima.
    fn watch(&self, lock: &mut Lock) {
        let (bytes, fences) = self.sem.store().inner().take();
        lock.max_bytes = lock.max_bytes.max(bytes);
        lock.max_fences = lock.max_fences.max(fences);
    }

    fn point(&mut self, phase: &'static str, operations: usize, lock: &Lock) {
        let item = self.item(lock);
        let bytes = stored_size(&item);
        self.points.push(SizePoint {
            phase,
            operations,
            simulated_seconds: (self.clock.now_ms() - T0_MS) as f64 / 1_000.0,
            holders: item.count(),
            fences: item.fences.len(),
            young: item.fences.young.len(),
            old: item.fences.old.len(),
            bytes,
            write_units_per_write: write_units(bytes),
        });
    }

    /// Checks the stored fences, and the most ever stored, against the rule's prediction.
    fn verify(&mut self, phase: &str, lock: &Lock) {
        let item = self.item(lock);
        let (young, old) = (item.fences.young.len(), item.fences.old.len());
        if (young, old) != (lock.fences.young, lock.fences.old) {
            self.mismatches.push(format!(
                "{}, {phase}: {young} young and {old} old fences stored, the rule predicts {} and {}",
                lock.name, lock.fences.young, lock.fences.old
            ));
        }
        if lock.max_fences != lock.fences.max_fences {
            self.mismatches.push(format!(
                "{}, {phase}: at most {} fences stored, the rule predicts {}",
                lock.name, lock.max_fences, lock.fences.max_fences
            ));
        }
    }

    async fn acquire(&mut self, lock: &mut Lock, tag: &str, n: usize) {
        let who = id(&execution_arn(tag, n), &uuid());
        match self
            .sem
            .acquire(&lock.name, &who, lock.limit)
            .await
            .expect("acquire")
        {
            AcquireOutcome::Acquired { .. } => lock.held.push_back(who),
            other => panic!("{}: acquire {n}: {other:?}", lock.name),
        }
        self.watch(lock);
    }
}

/// A run at `cs_per_second` on a fresh lock: `limit` holders taken, then `cycles` cycles, the
/// item sampled `samples` times.
async fn steady(
    sim: &mut Sim,
    name: &'static str,
    phase: &'static str,
    limit: i64,
    cycles: usize,
    cs_per_second: f64,
    samples: usize,
) -> (Steady, Lock) {
    let mut lock = Lock {
        name: names::lock(name),
        limit: names::limit(limit),
        held: VecDeque::new(),
        fences: FenceModel::new(sim.window_ms, BUSY_YOUNG_FENCES),
        max_bytes: 0,
        max_fences: 0,
    };
    let started_ms = sim.clock.now_ms();
    for n in 0..limit as usize {
        sim.acquire(&mut lock, "holder", n).await;
    }
    let bytes_without_fences = stored_size(&sim.item(&lock));
    sim.point(phase, 0, &lock);
    sim.writes.take();
    let step_ms = (1_000.0 / cs_per_second).round() as u64;
    let every = (cycles / samples.max(1)).max(1);
    let tag = if name.starts_with("quiet") {
        "quiet"
    } else {
        "cycle"
    };
    // Each cycle releases the oldest holder if the lock is full and acquires for a new execution.
    for n in 0..cycles {
        if lock.held.len() >= lock.limit.get() as usize {
            let oldest = lock.held.pop_front().expect("a holder");
            sim.sem
                .release(&lock.name, &oldest, Claim::Operator)
                .await
                .expect("release");
            lock.fences.fenced(sim.clock.now_ms());
            sim.watch(&mut lock);
        }
        sim.acquire(&mut lock, tag, n).await;
        sim.clock.advance_ms(step_ms);
        if (n + 1) % every == 0 {
            sim.point(phase, n + 1, &lock);
        }
    }
    sim.verify(phase, &lock);
    let writes = sim.writes.take();
    if writes.rotation != lock.fences.rotations {
        sim.mismatches.push(format!(
            "{name}: {} rotations, the rule predicts {}",
            writes.rotation, lock.fences.rotations
        ));
    }
    let window_s = sim.window_ms as f64 / 1_000.0;
    let model = model();
    let final_bytes = stored_size(&sim.item(&lock));
    let report = Steady {
        lock: name,
        cs_per_second,
        cycles,
        simulated_seconds: (sim.clock.now_ms() - started_ms) as f64 / 1_000.0,
        bytes_without_fences,
        max_bytes: lock.max_bytes,
        final_bytes,
        max_fences: lock.max_fences,
        max_write_units_per_write: write_units(lock.max_bytes),
        model_max_bytes: model.bytes(
            limit as usize,
            worst_fences(cs_per_second, window_s, BUSY_YOUNG_FENCES),
        ),
        writes_per_section: writes.writes() as f64 / cycles as f64,
        rotations: writes.rotation,
        rotations_per_section: writes.rotation as f64 / cycles as f64,
    };
    (report, lock)
}

/// A quiet lock (`limit` holders, one critical section a minute, `quiet_cycles` of them); then
/// `cycles` cycles at `cycles_per_second` on another lock, then `cleanups` cleanups of ended
/// executions (holding nothing) on it at `cleanups_per_second`, sampling the item `samples`
/// times per phase.
pub async fn run(
    limit: i64,
    quiet_cycles: usize,
    cycles: usize,
    cycles_per_second: f64,
    cleanups: usize,
    cleanups_per_second: f64,
    samples: usize,
) -> SizeReport {
    let timing = Timing::default();
    let clock = Arc::new(ManualClock::new(T0_MS));
    let writes = WriteCounter::new();
    let mut sim = Sim {
        sem: Semaphore::new(writes.store(Watched::default()))
            .with_clock(clock.clone())
            .with_timing(timing),
        clock: clock.clone(),
        writes,
        window_ms: u64::try_from(timing.window().as_millis()).unwrap_or(u64::MAX),
        points: Vec::new(),
        mismatches: Vec::new(),
    };
    let (quiet, _) = steady(
        &mut sim,
        "quiet-lock",
        "quiet lock: 1 CS a minute",
        limit,
        quiet_cycles,
        1.0 / 60.0,
        samples,
    )
    .await;
    let (steady_report, mut lock) = steady(
        &mut sim,
        "demo-lock",
        "acquire/release cycles",
        limit,
        cycles,
        cycles_per_second,
        samples,
    )
    .await;
    let step_ms = (1_000.0 / cleanups_per_second).round() as u64;
    let every = (cleanups / samples.max(1)).max(1);
    for n in 0..cleanups {
        // A stray cleanup of an execution that ended (its status event), holding nothing.
        let ended = HolderId::new(execution_arn("ended", n)).expect("holder");
        sim.sem.cleanup(&lock.name, &ended).await.expect("cleanup");
        lock.fences.fenced(clock.now_ms());
        sim.watch(&mut lock);
        clock.advance_ms(step_ms);
        if (n + 1) % every == 0 {
            sim.point("cleanups", n + 1, &lock);
        }
    }
    sim.verify("cleanups", &lock);
    let model = model();
    let ceiling = ceiling(&model, limit as usize, timing.window());
    SizeReport {
        limit,
        horizon_seconds: timing.horizon.as_secs_f64(),
        clock_skew_seconds: timing.clock_skew.as_secs_f64(),
        window_seconds: timing.window().as_secs_f64(),
        quiet,
        steady: steady_report,
        cleanups,
        cleanups_per_second,
        points: sim.points,
        model,
        ceiling,
        fences_as_predicted: sim.mismatches.is_empty(),
        mismatches: sim.mismatches,
    }
}

/// What must hold exactly, or within the model's bound.
pub fn check(report: &SizeReport, problems: &mut Vec<String>) {
    for m in &report.mismatches {
        problems.push(format!("item size: {m}"));
    }
    let busy = BUSY_YOUNG_FENCES;
    let w = report.window_seconds;
    for s in [&report.quiet, &report.steady] {
        if s.max_bytes as f64 > s.model_max_bytes {
            problems.push(format!(
                "item size: {} reached {} bytes, over the model's worst case of {:.0}",
                s.lock, s.max_bytes, s.model_max_bytes
            ));
        }
        let worst = worst_fences(s.cs_per_second, w, busy);
        if s.max_fences as f64 > worst {
            problems.push(format!(
                "item size: {} carried {} fences, over the rule's worst case of {worst:.0}",
                s.lock, s.max_fences
            ));
        }
        // Under one release per (window / (8 - 1)) every 8th release finds a rotation due, so
        // each generation is exactly 8 fences, and the worst case is reached from the 16th on.
        if s.cs_per_second * w + 1.0 <= busy as f64
            && s.cycles >= 2 * busy
            && s.max_fences as f64 != worst
        {
            problems.push(format!(
                "item size: {} carried at most {} fences in {} releases, the rule says exactly {worst:.0}",
                s.lock, s.max_fences, s.cycles
            ));
        }
        // Every cycle releases one slot (the lock is full); the lock had no fence before.
        let (least, most) = rotations_between(0, s.cycles, s.simulated_seconds, w, busy);
        if !(least..=most).contains(&s.rotations) {
            problems.push(format!(
                "item size: {}: {} rotations in {} releases and {} simulated s, the rule allows {least} to {most} (one per window, one per {busy} releases)",
                s.lock, s.rotations, s.cycles, s.simulated_seconds
            ));
        }
    }
    if report.model.fence_bytes != semaphore_core::FenceKey::LEN {
        problems.push(format!(
            "item size: a fence costs {} bytes, not {}",
            report.model.fence_bytes,
            semaphore_core::FenceKey::LEN
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ceiling_is_where_the_partition_fills() {
        let m = model();
        let c = ceiling(&m, 5, Duration::from_secs(10));
        assert!(c.wcu_per_second_at_ceiling <= PARTITION_WCU_PER_SECOND);
        let (over, _, _) = wcu_per_second(&m, 5, 10.0, c.cs_per_second + 0.1);
        assert!(over > PARTITION_WCU_PER_SECOND, "{c:?}");
        assert_eq!(c.sample_cs_per_second, 500.0);
        // Near the ceiling 8 young fences come long before a window has passed: a generation is
        // a window's releases, and a writer rotates once per window.
        assert!(c.cs_per_second * c.window_seconds + 1.0 > BUSY_YOUNG_FENCES as f64);
    }

    #[tokio::test]
    async fn the_simulated_lock_follows_the_rule_and_reaches_its_worst_case() {
        let report = run(5, 2 * BUSY_YOUNG_FENCES + 1, 300, 10.0, 30, 10.0, 5).await;
        assert_eq!(report.mismatches, Vec::<String>::new());
        assert_eq!(report.quiet.max_fences, 2 * BUSY_YOUNG_FENCES);
        assert_eq!(report.quiet.rotations, 2);
        // 10 CS/s: the first generation is 8 fences, the next ones a window's (100) each.
        assert_eq!(report.steady.rotations, 3);
        assert_eq!(report.steady.max_fences, 200);
        let mut problems = Vec::new();
        check(&report, &mut problems);
        assert_eq!(problems, Vec::<String>::new());
    }
}
