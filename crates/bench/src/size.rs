//! (c) Item size: how big the semaphore item gets, in bytes as DynamoDB counts them, after many
//! acquire/release cycles and cleanups at a realistic pace (simulated time, in memory), and
//! what one whole-item `PutItem` then costs in write units.

use std::collections::HashMap;
use std::sync::Arc;

use aws_sdk_dynamodb::types::AttributeValue;
use semaphore_core::dynamo::{item_size, read_units, stored_size, write_units};
use semaphore_core::{
    AcquireOutcome, HolderId, Identity, Limit, LockName, ManualClock, MemoryStore, Semaphore,
    SemaphoreItem, DEFAULT_FENCE_WINDOW,
};
use semaphore_tests::names::id;
use serde::Serialize;

use crate::common::{execution_arn, uuid};

#[derive(Debug, Clone, Serialize)]
pub struct SizePoint {
    pub phase: &'static str,
    pub operations: usize,
    pub simulated_seconds: f64,
    pub holders: usize,
    pub live_fences: usize,
    pub bytes: usize,
    pub write_units_per_put: usize,
    pub read_units_per_get: usize,
}

#[derive(Debug, Clone, Serialize)]
pub struct SizeModel {
    /// Bytes of the item with no holder and no fence (lock name "demo-lock", limit set).
    pub base_bytes: usize,
    /// Bytes one more holder adds (execution ARN of 93 characters, UUID acquisition id).
    pub holder_bytes: usize,
    /// Bytes one more fence adds.
    pub fence_bytes: usize,
    /// The AWS sample's item, for comparison: base and per holder.
    pub sample_base_bytes: usize,
    pub sample_holder_bytes: usize,
}

#[derive(Debug, Clone, Serialize)]
pub struct SizeReport {
    pub limit: i64,
    pub cycles: usize,
    pub cycles_per_second: f64,
    pub cleanups: usize,
    pub cleanups_per_second: f64,
    pub fence_window_seconds: u64,
    pub points: Vec<SizePoint>,
    pub model: SizeModel,
    /// Fences that should be live at the end: the releases and cleanups of the last window.
    pub expected_live_fences: usize,
    /// The largest per-lock release rate (releases + cleanups per second) at which the item
    /// still fits DynamoDB's 400 KB item limit with this window, from the model.
    pub max_fencing_rate_per_second_for_400kb: f64,
}

/// The bytes of one holder, one fence, and the empty item, measured on encoded items.
pub fn model() -> SizeModel {
    let lock = LockName::new("demo-lock").expect("lock");
    let mut item = SemaphoreItem::empty(lock);
    item.limit = Some(Limit::new(5).expect("limit"));
    item.version = semaphore_core::Version(123_456);
    let base = stored_size(&item);
    let who = id(&execution_arn("model", 1), &uuid());
    item.holders.insert(
        who.clone(),
        semaphore_core::Holding {
            token: semaphore_core::FencingToken(123_456),
            acquired_at_ms: 1_767_225_600_000,
        },
    );
    let with_holder = stored_size(&item);
    item.fences.insert(
        semaphore_core::FenceKey::acquisition(&who),
        1_767_225_600_000 + 300_000,
    );
    let with_fence = stored_size(&item);

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
        fence_bytes: with_fence - with_holder,
        sample_base_bytes: sample_base,
        sample_holder_bytes: item_size(&sample) - sample_base,
    }
}

/// `cycles` acquire/release cycles at `cycles_per_second` of simulated time with up to `limit`
/// holders at once (each cycle acquires a new execution's slot and releases the oldest), then
/// `cleanups` cleanups of ended executions at `cleanups_per_second`, sampling the item.
pub async fn run(
    limit: i64,
    cycles: usize,
    cycles_per_second: f64,
    cleanups: usize,
    cleanups_per_second: f64,
    samples: usize,
) -> SizeReport {
    let clock = Arc::new(ManualClock::new(1_767_225_600_000));
    let sem = Semaphore::new(MemoryStore::new()).with_clock(clock.clone());
    let lock = LockName::new("demo-lock").expect("lock");
    let lim = Limit::new(limit).expect("limit");
    let window = DEFAULT_FENCE_WINDOW;
    let step_ms = (1_000.0 / cycles_per_second) as u64;
    let cleanup_step_ms = (1_000.0 / cleanups_per_second) as u64;
    let mut points = Vec::new();
    let mut held: std::collections::VecDeque<Identity> = Default::default();
    let started_ms = 1_767_225_600_000u64;
    let sample = |phase: &'static str, operations: usize, sem: &Semaphore<MemoryStore>| {
        let item = sem.store().load_now(&lock).expect("the item exists");
        let now = clock_now(&clock);
        let bytes = stored_size(&item);
        SizePoint {
            phase,
            operations,
            simulated_seconds: (now - started_ms) as f64 / 1_000.0,
            holders: item.count(),
            live_fences: item.live_fences(now),
            bytes,
            write_units_per_put: write_units(bytes),
            read_units_per_get: read_units(bytes),
        }
    };
    let mut fenced_at: Vec<u64> = Vec::new();
    let every = (cycles / samples.max(1)).max(1);
    for n in 0..cycles {
        if held.len() as i64 >= limit {
            let oldest = held.pop_front().expect("a holder");
            sem.release(&lock, &oldest).await.expect("release");
            fenced_at.push(clock_now(&clock));
        }
        let who = id(&execution_arn("cycle", n), &uuid());
        match sem.acquire(&lock, &who, lim).await.expect("acquire") {
            AcquireOutcome::Acquired { .. } => held.push_back(who),
            other => panic!("cycle {n}: {other:?}"),
        }
        clock.advance_ms(step_ms);
        if (n + 1) % every == 0 {
            points.push(sample("acquire/release cycles", n + 1, &sem));
        }
    }
    let every = (cleanups / samples.max(1)).max(1);
    for n in 0..cleanups {
        // A stray cleanup of an execution that ended (its status event), holding nothing.
        let ended = HolderId::new(execution_arn("ended", n)).expect("holder");
        sem.cleanup(&lock, &ended).await.expect("cleanup");
        fenced_at.push(clock_now(&clock));
        clock.advance_ms(cleanup_step_ms);
        if (n + 1) % every == 0 {
            points.push(sample("cleanups", n + 1, &sem));
        }
    }
    let end = clock_now(&clock);
    let window_ms = window.as_millis() as u64;
    let expected_live_fences = fenced_at.iter().filter(|&&t| t + window_ms > end).count();
    let model = model();
    let room = 400 * 1024 - model.base_bytes - limit as usize * model.holder_bytes;
    let max_rate = room as f64 / (model.fence_bytes as f64 * window.as_secs_f64());
    SizeReport {
        limit,
        cycles,
        cycles_per_second,
        cleanups,
        cleanups_per_second,
        fence_window_seconds: window.as_secs(),
        points,
        expected_live_fences,
        model,
        max_fencing_rate_per_second_for_400kb: max_rate,
    }
}

fn clock_now(clock: &ManualClock) -> u64 {
    use semaphore_core::Clock;
    clock.now_ms()
}
