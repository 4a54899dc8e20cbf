//! What a command prints and exits with: its JSON answer, its exit status, its errors.

use semaphore_core::{
    rfc3339_millis, Claim, CleanupOutcome, InputError, Layout, Limit, LockConfig, LockName, Rate,
    SemaphoreItem, StoreError, Timing, Weight,
};
use serde_json::{json, Value};

use crate::top;

pub(crate) const EXIT_ERROR: u8 = 1;

pub(crate) const EXIT_FULL: u8 = 2;

pub(crate) const EXIT_FENCED: u8 = 3;

pub(crate) const EXIT_EXPIRED: u8 = 4;

pub(crate) const EXIT_WRONG_TOKEN: u8 = 5;

/// Who a release or heartbeat acted as, for its answer.
pub(crate) fn acting_as(claim: Claim) -> Value {
    match claim {
        Claim::Slot { token, .. } => json!({"as": "holder", "shown_token": token.0}),
        Claim::Operator => json!({
            "as": "operator",
            "note": "no --token: acted on whatever slot the acquisition holds, as its operator"
        }),
    }
}

/// Why a command did not run (exit 1, nothing on stdout).
#[derive(Debug, thiserror::Error)]
pub(crate) enum Failure {
    #[error(transparent)]
    Input(#[from] InputError),
    /// A flag whose value is not what it must be; the message names the flag.
    #[error("{flag}: {problem}")]
    Argument { flag: &'static str, problem: String },
    #[error("no AWS region: pass --region or set AWS_REGION")]
    NoRegion,
    #[error("cannot start the async runtime: {0}")]
    Runtime(std::io::Error),
    #[error(transparent)]
    Semaphore(#[from] semaphore_core::Error),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Top(#[from] top::TopError),
    #[error("lock {lock:?}: its configuration changed under this acquire three times over; nothing was taken: run it again once its operator is done")]
    Changing { lock: String },
}

/// What a command printed, and its exit status.
pub(crate) struct Answer {
    /// JSON for stdout; `None` for `top`, which printed its own.
    pub(crate) output: Option<Value>,
    pub(crate) code: u8,
    /// Why the status is not 0 although there is an answer (items that could not be read,
    /// errors of a sweep): said on stderr.
    pub(crate) problem: Option<String>,
}

impl Answer {
    pub(crate) fn done(output: Value) -> Self {
        Self::exit(output, 0)
    }

    pub(crate) fn exit(output: Value, code: u8) -> Self {
        Self {
            output: Some(output),
            code,
            problem: None,
        }
    }

    /// Nothing more to print: exit 0, or 1 with `problem` on stderr.
    pub(crate) fn printed(problem: Option<String>) -> Self {
        Self {
            output: None,
            code: if problem.is_some() { EXIT_ERROR } else { 0 },
            problem,
        }
    }

    /// Exit 1 with `problem` on stderr if there are `errors`, else 0.
    pub(crate) fn unless_errors(output: Value, errors: &[String], what: &str) -> Self {
        if errors.is_empty() {
            return Self::done(output);
        }
        Self {
            output: Some(output),
            code: EXIT_ERROR,
            problem: Some(format!(
                "{what} ({} listed in the output): {}",
                errors.len(),
                errors.join("; ")
            )),
        }
    }
}

impl Failure {
    /// What a failed request may have left undone, for an error of the table (after
    /// `attempts` attempts): bad input never reaches it.
    pub(crate) fn left_undone(&self, attempts: u32) -> Option<String> {
        let store = matches!(
            self,
            Failure::Store(StoreError::Dynamo { .. })
                | Failure::Semaphore(semaphore_core::Error::Store(StoreError::Dynamo { .. }))
        );
        store.then(|| {
            format!(
                "the table did not answer after {attempts} attempts with backoff: the command's \
                 last write may or may not have landed (an acquire may hold a slot, a release or \
                 cleanup may not have freed one). Every command is safe to run again with the \
                 same arguments: it reads its own answer from the lock"
            )
        })
    }
}

/// The lock an item that could not be read belongs to, when the error knows it.
pub(crate) fn unreadable_lock(e: &StoreError) -> Option<&str> {
    match e {
        StoreError::UnknownFormat { lock, .. }
        | StoreError::CorruptItem { lock, .. }
        | StoreError::Unexpected { lock, .. }
        | StoreError::ExpressionTooLarge { lock, .. }
        | StoreError::WrongLayout { lock, .. } => Some(lock),
        StoreError::TableNotFound { .. } | StoreError::Dynamo { .. } => None,
    }
}

pub(crate) fn merge(into: &mut Value, from: Value) {
    if let (Value::Object(into), Value::Object(from)) = (into, from) {
        into.extend(from);
    }
}

/// What a cleanup did on one lock.
pub(crate) fn cleaned_json(lock: &LockName, outcome: &CleanupOutcome, now_ms: u64) -> Value {
    let freed: Vec<Value> = outcome
        .freed
        .iter()
        .map(|(identity, holding)| {
            json!({
                "acquisition": identity.acquisition.as_str(),
                "token": holding.token.0,
                "weight": holding.weight.get(),
                "held_ms": now_ms.saturating_sub(holding.acquired_at_ms),
            })
        })
        .collect();
    json!({"lock": lock.as_str(), "freed": freed, "count": outcome.count})
}

/// A lock's configuration as `lock set`, `show` and `unset` print it, and `status` includes it.
pub(crate) fn config_value(config: Option<&LockConfig>) -> Value {
    config.map_or(Value::Null, |config| {
        json!({
            "limit": config.limit.get(),
            "max_weight": config.max_weight.map(Weight::get),
            "rate": config.rate.map(Rate::as_per_second),
        })
    })
}

pub(crate) fn config_json(lock: &LockName, item: Option<&SemaphoreItem>) -> Value {
    json!({
        "lock": lock.as_str(),
        "configured": config_value(item.and_then(|i| i.config.as_ref())),
        // As the last acquisition took them, and the lock now.
        "limit": item.and_then(|i| i.limit).map(Limit::get),
        "rate": item.and_then(|i| i.rate).map(Rate::as_per_second),
        "used": item.map_or(0, |i| i.used),
        "waiting": item.map_or(0, |i| i.waiting),
        "layout": item.map_or(Layout::Item, |i| i.layout).as_str(),
        "exists": item.is_some(),
    })
}

pub(crate) fn status_json(
    item: &SemaphoreItem,
    now_ms: u64,
    timing: &Timing,
    shown: usize,
) -> Value {
    // A gate's own item, without the holdings kept in items of their own.
    let mut own = item.clone();
    if item.layout == Layout::Gate {
        own.holders.clear();
        own.leases.clear();
        own.tombstones.clear();
    }
    let item_bytes = semaphore_core::dynamo::stored_size(&own);
    // The longest held first: where a leak or a stuck holder shows.
    let mut held: Vec<_> = item.holders.iter().collect();
    held.sort_by_key(|(identity, holding)| (holding.acquired_at_ms, *identity));
    let holders: Vec<Value> = held
        .iter()
        .take(shown)
        .map(|(identity, holding)| {
            json!({
                "holder": identity.holder.as_str(),
                "acquisition": identity.acquisition.as_str(),
                "token": holding.token.0,
                "weight": holding.weight.get(),
                "acquired_at": rfc3339_millis(holding.acquired_at_ms),
                "acquired_at_ms": holding.acquired_at_ms,
                "held_ms": now_ms.saturating_sub(holding.acquired_at_ms),
                // F13: when its lease ends (null: held until released).
                "lease_until": item.leases.get(identity).map(|until| rfc3339_millis(*until)),
            })
        })
        .collect();
    let fences = &item.fences;
    json!({
        "lock": item.lock.as_str(),
        // Where it keeps its holders: "item" (in its one item) or "gate" (each in an item of
        // its own, a released acquisition's left as a tombstone until a sweep drops it).
        "layout": item.layout.as_str(),
        "tombstones": item.tombstones.len(),
        "limit": item.limit.map(Limit::get),
        // Its operator's configuration (null: none), which every acquisition takes (F14).
        "configured": config_value(item.config.as_ref()),
        "count": item.count(),
        // The sum of the holders' weights: what the limit bounds.
        "used": item.used,
        // Executions parked in the lock's line (their records are in the waiters' table).
        "waiting": item.waiting,
        "version": item.version.0,
        "holders": holders,
        // Holders not listed (see --holders).
        "holders_omitted": item.count().saturating_sub(shown),
        // The start rate the last acquisition asked for (acquisitions per second; null: none),
        // when the last acquisition started, and when the next may start at that rate.
        "rate": item.rate.map(Rate::as_per_second),
        "started_at": item.started_at_ms.map(rfc3339_millis),
        "started_at_ms": item.started_at_ms,
        "next_start_at": item.next_start_ms(item.rate).map(rfc3339_millis),
        // Two generations of fences; a rotation drops `old` and ages `young`, at most once per
        // fence window, so every fence is kept at least one window and at most about two.
        "fences": {"young": fences.young.len(), "old": fences.old.len()},
        "rotated_at": fences.rotated_at_ms.map(rfc3339_millis),
        "rotated_at_ms": fences.rotated_at_ms,
        // The window is not stored: it is this semctl's horizon plus clock skew, which should
        // be the deployed functions' (AcquireHorizonSeconds + ClockSkewSeconds).
        "fence_window_seconds": timing.window().as_secs(),
        // An UpdateItem is billed by the larger of the item before and after it, one write
        // unit per started KB: this size is what each write of the lock costs, and what bounds
        // one lock's rate (BENCHMARKS.md).
        "item_bytes": item_bytes,
        "write_units_per_write": semaphore_core::dynamo::write_units(item_bytes),
    })
}
