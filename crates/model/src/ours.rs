//! The product's protocol, as the world sees it: every decision is made by the core's own
//! transitions ([`protocol::acquire`], [`protocol::release`], [`protocol::cleanup`]) and every
//! write is the core's conditional put ([`MemoryStore::put_now`]: store iff the version is still
//! the one read, else hand back the current item), exactly as `Semaphore::apply` runs them.
//!
//! Items are interned (each distinct item gets a small number) so that world states stay small
//! and cheap to hash; since the transitions are pure, each (call, phase, item) is decided once and
//! remembered.
//!
//! Time stands still: every transition runs at the same `now_ms` with the default fence window,
//! so no fence ever expires during a run. A write delayed for longer than the fence window is
//! therefore outside the model (see the crate documentation).

use std::cell::RefCell;
use std::collections::HashMap;
use std::hash::{Hash, Hasher};

use semaphore_core::item::{FenceKey, Identity, SemaphoreItem, Version};
use semaphore_core::protocol::{self, Context, Step};
use semaphore_core::{
    AcquireOutcome, AcquisitionId, HolderId, Limit, LockName, MemoryStore, PutResult,
    ReleaseOutcome, DEFAULT_FENCE_WINDOW,
};

use crate::hash::{hash_one, Build};
use crate::world::{exec_name, Advance, Answer, Next, Op, OpKind, Protocol};

/// The model's clock: a fixed instant (2023-11-14T22:13:20Z).
pub const NOW_MS: u64 = 1_700_000_000_000;

/// A deliberately broken protocol, to show that the checker notices. Each variant alters the
/// *result* of a real transition (or how its write is sent); the core itself is untouched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Variant {
    /// The product as it is.
    Real,
    /// Cleanup writes no execution fence (a zombie reading after the cleanup can acquire).
    CleanupWithoutFence,
    /// Cleanup writes nothing when the execution holds nothing (as the AWS sample does), so a
    /// write decided before the cleanup still finds the version it expects.
    CleanupSkipsWhenNothingHeld,
    /// Release writes no acquisition fence (a late retry of the acquire can land).
    ReleaseWithoutFence,
    /// Writes are not conditioned on the version read (a blind put).
    UnconditionalWrites,
}

impl Variant {
    pub const ALL: [Variant; 5] = [
        Variant::Real,
        Variant::CleanupWithoutFence,
        Variant::CleanupSkipsWhenNothingHeld,
        Variant::ReleaseWithoutFence,
        Variant::UnconditionalWrites,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Self::Real => "real",
            Self::CleanupWithoutFence => "cleanup-without-fence",
            Self::CleanupSkipsWhenNothingHeld => "cleanup-skips-when-nothing-held",
            Self::ReleaseWithoutFence => "release-without-fence",
            Self::UnconditionalWrites => "unconditional-writes",
        }
    }

    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|v| v.name() == name)
    }
}

/// Where one attempt (one `Semaphore::apply` call) is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Phase {
    /// About to read the item; `writes` sent so far.
    Read { writes: u8 },
    /// A conditional write of item `next` (interned), expecting `expected` (`None`: no item),
    /// is in flight; if it lands, the call answers `answer`.
    Flight {
        next: u32,
        expected: Option<u64>,
        answer: Answer,
        writes: u8,
    },
}

/// An item as a hash key.
#[derive(Clone, PartialEq, Eq)]
struct Key(SemaphoreItem);

impl Hash for Key {
    fn hash<H: Hasher>(&self, h: &mut H) {
        let item = &self.0;
        item.lock.hash(h);
        item.limit.hash(h);
        item.version.hash(h);
        for (identity, holding) in &item.holders {
            identity.hash(h);
            holding.token.hash(h);
            holding.acquired_at_ms.hash(h);
        }
        item.fences.hash(h);
    }
}

#[derive(Default)]
struct Interner {
    ids: HashMap<Key, u32, Build>,
    items: Vec<Interned>,
}

/// An item and what the world asks about it, computed once.
struct Interned {
    item: SemaphoreItem,
    /// Bit i: `exec-(i+1)` holds a slot.
    holders: u32,
    /// The count the DynamoDB rendering stores for it.
    count: i64,
    /// What identifies it up to version numbers: the part about no execution in particular,
    /// and the part about each execution (see `Protocol::symmetric`).
    keys: (u64, Vec<u64>),
}

/// What a transition decided, reduced to what the world needs, with its answer in words.
enum Decision {
    Done(Answer, String),
    Write(SemaphoreItem, Answer, String),
}

/// A call, where it is, and the stored item: all that one step of it depends on.
type MemoKey = (Op, Phase, Option<u32>);

/// The product's protocol over the core's transitions and conditional put.
pub struct Ours {
    lock: LockName,
    limit: Limit,
    ctx: Context,
    identities: Vec<Identity>,
    fence_names: HashMap<FenceKey, String>,
    max_writes: u8,
    variant: Variant,
    interner: RefCell<Interner>,
    memo: RefCell<HashMap<MemoKey, Advance<u32, Phase>, Build>>,
}

impl Ours {
    pub fn new(executions: u8, limit: u32, max_writes: u8, variant: Variant) -> Self {
        let identities: Vec<Identity> = (0..executions)
            .map(|e| {
                Identity::new(
                    HolderId::new(exec_name(e)).expect("a valid holder"),
                    AcquisitionId::new("a1").expect("a valid acquisition"),
                )
            })
            .collect();
        let mut fence_names = HashMap::new();
        for identity in &identities {
            fence_names.insert(
                FenceKey::execution(&identity.holder),
                format!("{} (execution)", identity.holder),
            );
            fence_names.insert(
                FenceKey::acquisition(identity),
                format!("{}/{} (acquisition)", identity.holder, identity.acquisition),
            );
        }
        Self {
            lock: LockName::new("model").expect("a valid lock name"),
            limit: Limit::new(i64::from(limit)).expect("a limit from 1 to 1000"),
            ctx: Context {
                now_ms: NOW_MS,
                fence_window: DEFAULT_FENCE_WINDOW,
            },
            identities,
            fence_names,
            max_writes: max_writes.max(1),
            variant,
            interner: RefCell::default(),
            memo: RefCell::default(),
        }
    }

    /// Whether states may be identified without version numbers (see `identify_item`): not when
    /// writes are unconditional, since then a stale write lands.
    fn reduce(&self) -> bool {
        self.variant != Variant::UnconditionalWrites
    }

    /// Distinct items reached so far.
    pub fn items_seen(&self) -> usize {
        self.interner.borrow().items.len()
    }

    fn intern(&self, item: SemaphoreItem) -> u32 {
        let mut interner = self.interner.borrow_mut();
        let key = Key(item);
        if let Some(&id) = interner.ids.get(&key) {
            return id;
        }
        let holders = self
            .identities
            .iter()
            .enumerate()
            .filter(|(_, id)| key.0.holders.contains_key(id))
            .fold(0u32, |m, (e, _)| m | (1 << e));
        // The DynamoDB rendering stores a `count` attribute derived from the holders: encode the
        // item as the store would and read the number back.
        let count = semaphore_core::dynamo::encode(&key.0)
            .get(semaphore_core::dynamo::attr::COUNT)
            .and_then(|v| v.as_n().ok())
            .and_then(|n| n.parse().ok())
            .unwrap_or(-1);
        let keys = self.keys(&key.0);
        let id = u32::try_from(interner.items.len()).expect("fewer than 2^32 items");
        interner.items.push(Interned {
            item: key.0.clone(),
            holders,
            count,
            keys,
        });
        interner.ids.insert(key, id);
        id
    }

    fn item(&self, id: Option<u32>) -> Option<SemaphoreItem> {
        id.map(|id| self.interner.borrow().items[id as usize].item.clone())
    }

    /// The item's keys (see [`Interned::keys`]): everything but the version and the tokens.
    fn keys(&self, item: &SemaphoreItem) -> (u64, Vec<u64>) {
        let per_exec: Vec<u64> = self
            .identities
            .iter()
            .map(|identity| {
                let fence = |key: &FenceKey| item.fences.get(key).copied();
                hash_one(&(
                    item.holders.get(identity).map(|h| h.acquired_at_ms),
                    fence(&FenceKey::execution(&identity.holder)),
                    fence(&FenceKey::acquisition(identity)),
                ))
            })
            .collect();
        let known_holders = self
            .identities
            .iter()
            .filter(|id| item.holders.contains_key(id))
            .count();
        let known_fences = item
            .fences
            .keys()
            .filter(|k| self.fence_names.contains_key(k))
            .count();
        // Anything not about one of the executions would have to be keyed here; the model's
        // items hold nothing else.
        assert_eq!(
            known_holders,
            item.holders.len(),
            "a holder from outside the model"
        );
        assert_eq!(
            known_fences,
            item.fences.len(),
            "a fence from outside the model"
        );
        let common = hash_one(&(1u8, &item.lock, item.limit));
        (common, per_exec)
    }

    fn show(&self, item: Option<&SemaphoreItem>) -> String {
        let Some(item) = item else {
            return "no item".to_owned();
        };
        let holders: Vec<String> = item
            .holders
            .iter()
            .map(|(id, h)| format!("{} token {}", id.holder, h.token.0))
            .collect();
        let mut text = format!("v{}, count {}", item.version.0, item.count());
        if !holders.is_empty() {
            text.push_str(&format!(" [{}]", holders.join(", ")));
        }
        if !item.fences.is_empty() {
            let fences: Vec<&str> = item
                .fences
                .keys()
                .map(|k| {
                    self.fence_names
                        .get(k)
                        .map_or("an unknown fence", String::as_str)
                })
                .collect();
            text.push_str(&format!(", fences: {}", fences.join(", ")));
        }
        text
    }

    /// The real transition for `op`, with the variant's alteration.
    fn decide(&self, op: Op, current: Option<&SemaphoreItem>) -> Decision {
        let identity = &self.identities[op.exec as usize];
        let (lock, ctx) = (&self.lock, &self.ctx);
        match op.kind {
            OpKind::Acquire => {
                let (step, answer) =
                    match protocol::acquire(current, lock, identity, self.limit, ctx) {
                        Step::Done(outcome) => (None, outcome),
                        Step::Write { next, outcome } => (Some(next), outcome),
                    };
                let (code, words) = match answer {
                    AcquireOutcome::Acquired { token, count } => (
                        Answer::Acquired,
                        format!("acquired (token {}, count {count})", token.0),
                    ),
                    AcquireOutcome::AlreadyHeld { token, .. } => (
                        Answer::Acquired,
                        format!("already held (token {})", token.0),
                    ),
                    AcquireOutcome::Full { count, limit } => {
                        (Answer::Full, format!("full ({count} of {limit})"))
                    }
                    AcquireOutcome::Fenced(reason) => {
                        (Answer::Fenced, format!("fenced: {}", reason.describe()))
                    }
                };
                match step {
                    None => Decision::Done(code, words),
                    Some(next) => Decision::Write(next, code, words),
                }
            }
            OpKind::Release => match protocol::release(current, lock, identity, ctx) {
                Step::Done(outcome) => Decision::Done(Answer::Done, release_words(&outcome)),
                Step::Write { mut next, outcome } => {
                    if self.variant == Variant::ReleaseWithoutFence {
                        next.fences.remove(&FenceKey::acquisition(identity));
                    }
                    Decision::Write(next, Answer::Done, release_words(&outcome))
                }
            },
            OpKind::Cleanup => match protocol::cleanup(current, lock, &identity.holder, ctx) {
                Step::Done(outcome) => Decision::Done(
                    Answer::Done,
                    format!("cleanup frees {} slot(s)", outcome.freed.len()),
                ),
                Step::Write { mut next, outcome } => {
                    let words = if outcome.freed.is_empty() {
                        format!("{} holds nothing, fence it", identity.holder)
                    } else {
                        format!("free {}'s slot and fence it", identity.holder)
                    };
                    match self.variant {
                        Variant::CleanupSkipsWhenNothingHeld if outcome.freed.is_empty() => {
                            return Decision::Done(
                                Answer::Done,
                                format!(
                                    "{} holds nothing: nothing to write (broken variant)",
                                    identity.holder
                                ),
                            )
                        }
                        Variant::CleanupWithoutFence => {
                            next.fences.remove(&FenceKey::execution(&identity.holder));
                        }
                        _ => {}
                    }
                    Decision::Write(next, Answer::Done, words)
                }
            },
        }
    }

    /// Decides from `current` (just read, or handed back by a failed write) and sends the write
    /// if there is one.
    fn decide_and_send(
        &self,
        op: Op,
        current: Option<u32>,
        writes: u8,
        log: Option<&mut String>,
    ) -> Advance<u32, Phase> {
        let item = self.item(current);
        let (next, words) = match self.decide(op, item.as_ref()) {
            Decision::Done(answer, words) => (Next::Finished(answer), format!("{words}; no write")),
            Decision::Write(next, answer, words) => {
                let expected = item.as_ref().map(|i| i.version.0);
                let text = format!(
                    "{words}; sends a write if {}: {} [in flight]",
                    condition(expected),
                    self.show(Some(&next))
                );
                (
                    Next::Continue(Phase::Flight {
                        next: self.intern(next),
                        expected,
                        answer,
                        writes: writes + 1,
                    }),
                    text,
                )
            }
        };
        if let Some(log) = log {
            log.push_str(&words);
        }
        Advance {
            store: current,
            wrote: false,
            next,
        }
    }

    fn compute(
        &self,
        op: Op,
        phase: Phase,
        store: Option<u32>,
        mut log: Option<&mut String>,
    ) -> Advance<u32, Phase> {
        match phase {
            Phase::Read { writes } => {
                if let Some(log) = log.as_deref_mut() {
                    log.push_str(&format!(
                        "reads {} -> ",
                        self.show(self.item(store).as_ref())
                    ));
                }
                self.decide_and_send(op, store, writes, log)
            }
            Phase::Flight {
                next,
                expected,
                answer,
                writes,
            } => {
                let current = self.item(store);
                let next_item = self.item(Some(next)).expect("an interned item");
                let (expected, condition) = match self.variant {
                    Variant::UnconditionalWrites => (
                        current.as_ref().map(|i| i.version.0),
                        "unconditional".to_owned(),
                    ),
                    _ => (expected, format!("if {}", condition(expected))),
                };
                // The core's conditional put, on a store holding exactly the current item.
                let table = MemoryStore::new();
                if let Some(item) = &current {
                    assert_eq!(table.put_now(item, None), PutResult::Written);
                }
                let result = table.put_now(&next_item, expected.map(Version));
                let after = table.load_now(&self.lock);
                match result {
                    PutResult::Written => {
                        if let Some(log) = log {
                            log.push_str(&format!(
                                "its write ({condition}) lands: {}",
                                self.show(after.as_ref())
                            ));
                        }
                        Advance {
                            store: after.map(|item| self.intern(item)),
                            wrote: true,
                            next: Next::Finished(answer),
                        }
                    }
                    PutResult::Conflict(latest) => {
                        if let Some(log) = log.as_deref_mut() {
                            log.push_str(&format!(
                                "its write ({condition}) is rejected, the item is {} -> ",
                                self.show(latest.as_ref())
                            ));
                        }
                        if writes >= self.max_writes {
                            if let Some(log) = log {
                                log.push_str(&format!(
                                    "gives up after {writes} writes (contention)"
                                ));
                            }
                            return Advance {
                                store,
                                wrote: false,
                                next: Next::Finished(Answer::Contention),
                            };
                        }
                        let latest = latest.map(|item| self.intern(item));
                        debug_assert_eq!(latest, store);
                        self.decide_and_send(op, latest, writes, log)
                    }
                }
            }
        }
    }
}

fn condition(expected: Option<u64>) -> String {
    match expected {
        None => "there is no item yet".to_owned(),
        Some(v) => format!("still v{v}"),
    }
}

fn release_words(outcome: &ReleaseOutcome) -> String {
    match outcome {
        ReleaseOutcome::Released { token, count } => {
            format!("released (token {}, count {count}), fence it", token.0)
        }
        ReleaseOutcome::NotHeld { .. } => "not held".to_owned(),
    }
}

impl Protocol for Ours {
    type Item = u32;
    type Phase = Phase;

    fn name(&self) -> &'static str {
        match self.variant {
            Variant::Real => "the product's protocol (core transitions, versioned conditional put)",
            _ => "a BROKEN variant of the product's protocol",
        }
    }

    fn initial_item(&self) -> Option<u32> {
        None
    }

    fn start(&self, _op: Op) -> Phase {
        Phase::Read { writes: 0 }
    }

    fn describe_start(&self, _op: Op) -> String {
        "about to read the item".to_owned()
    }

    fn in_flight(&self, phase: Phase) -> bool {
        matches!(phase, Phase::Flight { .. })
    }

    fn advance(
        &self,
        op: Op,
        phase: Phase,
        store: Option<u32>,
        log: Option<&mut String>,
    ) -> Advance<u32, Phase> {
        if log.is_some() {
            return self.compute(op, phase, store, log);
        }
        let key = (op, phase, store);
        if let Some(&known) = self.memo.borrow().get(&key) {
            return known;
        }
        let advance = self.compute(op, phase, store, None);
        self.memo.borrow_mut().insert(key, advance);
        advance
    }

    fn holders(&self, store: Option<u32>) -> u32 {
        store.map_or(0, |id| self.interner.borrow().items[id as usize].holders)
    }

    fn stored_count(&self, store: Option<u32>) -> i64 {
        store.map_or(0, |id| self.interner.borrow().items[id as usize].count)
    }

    fn describe(&self, store: Option<u32>) -> String {
        self.show(self.item(store).as_ref())
    }

    /// Whether states may be identified without version numbers: not when writes are
    /// unconditional (a stale write then lands, and what it carries matters).
    ///
    /// Otherwise, no transition branches on the value of a version: only the conditional put
    /// compares versions, for equality. Every landed write stores a new, higher version, so
    /// each version is stored at most once; hence a write in flight lands iff it expects the
    /// version stored now ("fresh"), the item it carries is then what its transition makes of
    /// the current item, a stale write stays stale, and what it carries never matters (it is
    /// rejected and the call decides again from the current item). Tokens are versions and
    /// are only reported, never compared. So a state is identified by the item without its
    /// version and tokens, and by whether each write in flight is fresh.
    fn symmetric(&self) -> bool {
        self.reduce()
    }

    fn item_key(&self, store: Option<u32>) -> u64 {
        store.map_or(0, |id| self.interner.borrow().items[id as usize].keys.0)
    }

    fn item_exec_key(&self, store: Option<u32>, e: u8) -> u64 {
        store.map_or(0, |id| {
            self.interner.borrow().items[id as usize].keys.1[e as usize]
        })
    }

    fn phase_key(&self, phase: Phase, store: Option<u32>) -> u64 {
        match phase {
            Phase::Read { writes } => hash_one(&(0u8, writes)),
            Phase::Flight {
                expected, writes, ..
            } => {
                let current =
                    store.map(|id| self.interner.borrow().items[id as usize].item.version.0);
                hash_one(&(1u8, expected == current, writes))
            }
        }
    }
}
