//! What both worlds ([`crate::world`] and [`crate::queue`]) are built with: executions' names
//! in traces, the words of a step (made only when a trace is printed), interning and memos of
//! what is pure (items, writes, landings), and the fan-out of a successor into one successor per
//! fate of the cleanup event its step emitted.

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};
use std::hash::{Hash, Hasher};

use clap::ValueEnum;
use semaphore_core::item::{FenceKey, Identity, SemaphoreItem};
use semaphore_core::{
    Change, Check, Claim, FencingToken, Holding, StoreError, TaskToken, Wakeup, Weight, Write,
};
use semaphore_core::{LockName, QueueKey, Waiter, WriteResult};

use crate::hash::Build;

/// The token a holder shows whose slot is gone: no slot has it (tokens start at 1). An identity
/// holds at most one slot, under one token, for ever (an acquisition lands once, and never after
/// its fence), so the token its acquire was answered is the one its slot has while it holds it,
/// and once the slot is gone every token is refused alike: the worlds take the token a holder
/// shows from the item as it is when the holder decides, and this one when it holds nothing.
pub const GONE: FencingToken = FencingToken(0);

/// The slot `identity` holds in `item`, as its holder shows it (see [`GONE`]); of `weight` when
/// it holds none.
pub fn shown(item: Option<&SemaphoreItem>, identity: &Identity, weight: Weight) -> Holding {
    item.and_then(|item| item.holders.get(identity).copied())
        .unwrap_or(Holding {
            token: GONE,
            acquired_at_ms: 0,
            weight,
        })
}

/// What a release's write shows of its slot (F15): the operator's claim for the release of an
/// acquisition that held nothing when it was decided (the fence alone), else the token its check
/// names. An operator's release decided on a read that found a slot sends that slot's release,
/// which is what the slot's holder sends: the worlds tell the two apart by the first write.
pub fn claim_of(write: &Write) -> Claim {
    write
        .checks
        .iter()
        .find_map(|check| match check {
            Check::HoldsSlot { token, weight, .. } => Some(Claim::Slot {
                token: *token,
                weight: *weight,
            }),
            _ => None,
        })
        .unwrap_or(Claim::Operator)
}

/// Execution `e`'s name in traces: `exec-1` for 0.
pub fn exec_name(e: u8) -> String {
    format!("exec-{}", e + 1)
}

/// The names of the executions of a mask (bit e), e.g. `exec-1, exec-3`.
pub fn names(mask: impl Into<u32>) -> String {
    let mask = mask.into();
    let names: Vec<String> = (0..32u8)
        .filter(|e| mask & (1 << e) != 0)
        .map(exec_name)
        .collect();
    names.join(", ")
}

/// `1 death`, `2 deaths`.
pub fn plural(n: u8, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

/// The executions' weights in a world's description: nothing if all are 1, else
/// `, weights 1, 2, 1`.
pub fn weights_text(weights: &[u32]) -> String {
    if weights.iter().all(|&w| w == 1) {
        return String::new();
    }
    let named: Vec<String> = weights.iter().map(u32::to_string).collect();
    format!(", weights {}", named.join(", "))
}

/// A world's variants (the product's protocol first, then each broken one), named on the
/// command line as clap's `ValueEnum` names them: in kebab case, e.g. `cleanup-without-fence`.
pub trait Variants: ValueEnum + Copy + 'static {
    /// Every variant, the product as it is first.
    fn all() -> impl Iterator<Item = Self> {
        Self::value_variants().iter().copied()
    }

    /// Its name on the command line.
    fn name(self) -> String {
        let name = self.to_possible_value().expect("no variant is skipped");
        name.get_name().to_owned()
    }

    fn parse(name: &str) -> Option<Self> {
        Self::from_str(name, false).ok()
    }
}

/// Words for a trace, produced only when a trace is being printed.
#[derive(Clone)]
pub struct Words(Option<String>);

impl Words {
    pub fn new(on: bool) -> Self {
        Self(on.then(String::new))
    }

    pub fn say(&mut self, words: impl FnOnce() -> String) {
        if let Some(text) = &mut self.0 {
            text.push_str(&words());
        }
    }

    pub fn log(&mut self) -> Option<&mut String> {
        self.0.as_mut()
    }

    pub fn into_string(self) -> String {
        self.0.unwrap_or_default()
    }
}

/// The core's reading of the result of one of its own writes, which the model hands it as the
/// write's landing made it: it cannot fail.
#[track_caller]
pub fn read<T>(reading: Result<T, StoreError>) -> T {
    reading.expect("the core reads its own write's result")
}

/// Appends `words()` to a step's log if one is kept: [`Words::say`] for the protocols, which
/// are handed the log itself.
pub fn say(log: Option<&mut String>, words: impl FnOnce() -> String) {
    if let Some(log) = log {
        log.push_str(&words());
    }
}

/// Distinct values numbered in the order they are first seen, so that world states can hold a
/// small number instead of the value (and hash it cheaply).
pub struct Interner<K, V> {
    ids: HashMap<K, u32, Build>,
    values: Vec<V>,
}

impl<K, V> Default for Interner<K, V> {
    fn default() -> Self {
        Self {
            ids: HashMap::default(),
            values: Vec::new(),
        }
    }
}

impl<K: Hash + Eq, V> Interner<K, V> {
    /// The number of `key`, with `make(&key)` stored as its value if it is new. `make` must not
    /// use `interner`.
    pub fn intern(interner: &RefCell<Self>, key: K, make: impl FnOnce(&K) -> V) -> u32 {
        if let Some(&id) = interner.borrow().ids.get(&key) {
            return id;
        }
        let value = make(&key);
        let mut interner = interner.borrow_mut();
        let id = u32::try_from(interner.values.len()).expect("fewer than 2^32 values");
        interner.values.push(value);
        interner.ids.insert(key, id);
        id
    }

    /// The value of number `id`.
    pub fn get(&self, id: u32) -> &V {
        &self.values[id as usize]
    }
}

/// Results of a pure function, each computed once.
pub struct Memo<K, V>(RefCell<HashMap<K, V, Build>>);

impl<K, V> Default for Memo<K, V> {
    fn default() -> Self {
        Self(RefCell::default())
    }
}

impl<K: Hash + Eq, V: Clone> Memo<K, V> {
    /// The result for `key`, computed by `compute` the first time (which may use the memo).
    pub fn get_or(&self, key: K, compute: impl FnOnce() -> V) -> V {
        if let Some(known) = self.0.borrow().get(&key) {
            return known.clone();
        }
        let value = compute();
        self.0.borrow_mut().insert(key, value.clone());
        value
    }
}

/// What becomes of a cleanup event, chosen when it is emitted. That loses no behaviour: a
/// pending event does nothing until it is delivered, so losing it later is the same as losing
/// it at once, and a second copy emitted now can still be delivered at any later moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fate {
    /// Delivered (once) at some later step.
    Delivered,
    Lost,
    /// EventBridge delivers it twice.
    Twice,
}

impl Fate {
    const ALL: [Fate; 3] = [Fate::Delivered, Fate::Lost, Fate::Twice];

    fn words(self) -> &'static str {
        match self {
            Self::Delivered => "",
            Self::Lost => " (it will be lost)",
            Self::Twice => " (EventBridge will deliver it twice)",
        }
    }
}

/// A world whose steps may end an execution, emitting a cleanup event whose fate is chosen as
/// the successor is added (see [`Successors::add`]).
pub trait Emitting {
    type State: Clone;

    /// The execution whose cleanup event the step just taken emitted, taken out of `s`.
    fn take_emitted(&self, s: &mut Self::State) -> Option<u8>;
    /// Whether the event may meet `fate` in `s` (it may always be delivered).
    fn allows(&self, s: &Self::State, fate: Fate) -> bool;
    /// Records that the event of execution `e` meets `fate`.
    fn doom(&self, s: &mut Self::State, e: u8, fate: Fate);
    /// Puts `s` in the form states are compared in (e.g. running requests sorted).
    fn normalize(&self, s: &mut Self::State);
}

/// The successors of a state being collected, each with its words if a trace is printed.
pub struct Successors<'a, S> {
    out: &'a mut Vec<S>,
    labels: Option<&'a mut Vec<String>>,
}

impl<'a, S> Successors<'a, S> {
    pub fn new(out: &'a mut Vec<S>, labels: Option<&'a mut Vec<String>>) -> Self {
        Self { out, labels }
    }

    /// Adds the successor `make` makes of a copy of `s`, with the words it says.
    pub fn make<W: Emitting<State = S>>(
        &mut self,
        world: &W,
        s: &S,
        make: impl FnOnce(&mut S, &mut Words),
    ) where
        S: Clone,
    {
        let mut t = s.clone();
        let mut words = Words::new(self.labels.is_some());
        make(&mut t, &mut words);
        self.add(world, t, words);
    }

    /// Adds successor `t`, once for each fate the world allows the cleanup event its step
    /// emitted (if it did), in the order of [`Fate`].
    pub fn add<W: Emitting<State = S>>(&mut self, world: &W, mut t: S, words: Words)
    where
        S: Clone,
    {
        let Some(e) = world.take_emitted(&mut t) else {
            self.push(world, t, words);
            return;
        };
        for fate in Fate::ALL {
            if fate == Fate::Delivered || world.allows(&t, fate) {
                let (mut t, mut words) = (t.clone(), words.clone());
                world.doom(&mut t, e, fate);
                words.say(|| fate.words().to_owned());
                self.push(world, t, words);
            }
        }
    }

    fn push<W: Emitting<State = S>>(&mut self, world: &W, mut t: S, words: Words) {
        world.normalize(&mut t);
        self.out.push(t);
        if let Some(labels) = self.labels.as_deref_mut() {
            labels.push(words.into_string());
        }
    }
}

/// A lock's item as a key of an [`Interner`] (the core's item is not `Hash`): hashed by what
/// tells the model's items apart, compared whole.
#[derive(Clone, PartialEq, Eq)]
pub struct ItemKey(pub SemaphoreItem);

impl Hash for ItemKey {
    fn hash<H: Hasher>(&self, h: &mut H) {
        let item = &self.0;
        (
            &item.lock,
            item.limit,
            item.version,
            &item.holders,
            &item.fences,
            item.waiting,
            item.used,
        )
            .hash(h);
    }
}

/// How a world names what the core's writes mention, for [`show_write`].
pub trait Naming {
    /// An identity (an execution's acquisition).
    fn who(&self, identity: &Identity) -> String;
    /// What a fence is.
    fn fence(&self, key: &FenceKey) -> String;
    /// A moment (epoch ms) on the world's clock, e.g. `tick 1`; `None` in a world without time.
    fn moment(&self, _at_ms: u64) -> Option<String> {
        None
    }
    /// A waiter's task token, e.g. `task 1`; `None` in a world without a line.
    fn task(&self, _token: &TaskToken) -> Option<String> {
        None
    }
}

/// An item's version and holders as both worlds show them, e.g. `v3, 2 held (used 3) [exec-1
/// token 1, exec-2 token 3 weight 2]`: the weight held (`used`, then `of`) is shown when it is
/// not the count or some execution's `weights` is not 1.
pub fn show_holders(
    naming: &impl Naming,
    item: &SemaphoreItem,
    weights: &[Weight],
    of: &str,
) -> String {
    let holders: Vec<String> = item
        .holders
        .iter()
        .map(|(id, h)| {
            let weight = if h.weight == Weight::ONE {
                String::new()
            } else {
                format!(" weight {}", h.weight)
            };
            format!("{} token {}{weight}", naming.who(id), h.token.0)
        })
        .collect();
    let mut text = format!("v{}, {} held", item.version.0, item.count());
    if item.used != item.count() as u64 || weights.iter().any(|&w| w != Weight::ONE) {
        text.push_str(&format!(" (used {}{of})", item.used));
    }
    if !holders.is_empty() {
        text.push_str(&format!(" [{}]", holders.join(", ")));
    }
    text
}

/// A write in words: `if CHECKS: CHANGES` (`no checks: CHANGES`).
pub fn show_write(naming: &impl Naming, write: &Write) -> String {
    let checks: Vec<String> = write
        .checks
        .iter()
        .map(|check| match check {
            Check::NotHolding(_) => "not holding".to_owned(),
            Check::Fits { limit, weight } => format!("used + {weight} <= {limit}"),
            Check::Room => "room in the item".to_owned(),
            Check::HoldsSlot {
                identity,
                token,
                weight,
            } if *token == GONE => {
                format!(
                    "{} holds weight {weight} under a token no slot has",
                    naming.who(identity)
                )
            }
            Check::HoldsSlot {
                identity, weight, ..
            } => {
                format!("{} holds its slot (weight {weight})", naming.who(identity))
            }
            Check::Spaced { rate, .. } => format!("spaced by {rate}"),
            Check::NotFenced(key) => format!("{} not fenced", naming.fence(key)),
            Check::NotReleased(identity) => format!("{} not released", naming.who(identity)),
            Check::TombstoneAt { identity, at_ms } => naming.moment(*at_ms).map_or(
                format!("{}'s tombstone as read", naming.who(identity)),
                |at| format!("{}'s tombstone of {at}", naming.who(identity)),
            ),
            Check::RotatedSince { at_ms } => naming
                .moment(*at_ms)
                .map_or("rotated since".to_owned(), |at| {
                    format!("rotated since {at}")
                }),
            Check::Idle => "idle".to_owned(),
            Check::RotatedBefore { deadline_ms } => naming
                .moment(*deadline_ms)
                .map_or("in time".to_owned(), |at| format!("no rotation since {at}")),
            Check::LastRotation(at) => match at {
                None => "last rotation none".to_owned(),
                Some(at) => naming.moment(*at).map_or("last rotation".to_owned(), |at| {
                    format!("last rotation at {at}")
                }),
            },
            Check::QueueEmpty => "nobody in line".to_owned(),
            Check::Configured(None) => "not configured".to_owned(),
            Check::LeaseUntil { identity, until_ms } => naming
                .moment(*until_ms)
                .map_or(format!("{}'s lease as read", naming.who(identity)), |at| {
                    format!("{}'s lease ends at {at}", naming.who(identity))
                }),
            Check::Configured(Some(c)) => format!("configured with limit {}", c.limit),
            Check::Busy { terms, .. } => {
                format!("{} does not fit or someone in line", terms.weight)
            }
            Check::NotQueued(_) => "not in line".to_owned(),
            Check::Queued(_) => "in line".to_owned(),
            Check::QueuedBefore { .. } => "in line with an earlier task".to_owned(),
            Check::QueuedWith {
                wakeup: Wakeup::Task(task_token),
                ..
            } => naming
                .task(task_token)
                .map_or("in line".to_owned(), |task| format!("in line with {task}")),
            Check::QueuedWith { .. } => "in line, polling".to_owned(),
        })
        .collect();
    let changes: Vec<String> = write
        .changes
        .iter()
        .map(|change| match change {
            Change::PutHolder {
                identity, weight, ..
            } if *weight == Weight::ONE => format!("take a slot for {}", naming.who(identity)),
            Change::PutHolder {
                identity, weight, ..
            } => format!(
                "take a slot of weight {weight} for {}",
                naming.who(identity)
            ),
            Change::SetLimit(limit) => format!("limit {limit}"),
            Change::Configure(None) => "remove the configuration".to_owned(),
            Change::SetLease { identity, until_ms } => naming
                .moment(*until_ms)
                .map_or(format!("renew {}'s lease", naming.who(identity)), |at| {
                    format!("{}'s lease until {at}", naming.who(identity))
                }),
            Change::Configure(Some(c)) => format!("configure limit {}", c.limit),
            Change::SetRate(None) => "no rate".to_owned(),
            Change::SetRate(Some(rate)) => format!("rate {rate}"),
            Change::RemoveHolder { identity, weight } => {
                format!("free {}'s slot, used - {weight}", naming.who(identity))
            }
            Change::AddFence(key) => format!("fence {}", naming.fence(key)),
            Change::FenceAcquisition { identity, .. } => {
                format!("fence {}'s acquisition", naming.who(identity))
            }
            Change::DropTombstone(identity) => {
                format!("drop {}'s tombstone", naming.who(identity))
            }
            Change::SetLayout(layout) => format!("{layout} layout"),
            Change::Rotate { young_seen, .. } => {
                format!("rotate (drop old, age {} young)", young_seen.len())
            }
            Change::Enqueue(w) => match w.task_token().and_then(|t| naming.task(t)) {
                Some(task) => format!("queue {} ({task})", naming.who(&w.identity)),
                None => format!("queue {}", naming.who(&w.identity)),
            },
            Change::Dequeue(_) => "take out of line".to_owned(),
            Change::Repark {
                wakeup: Wakeup::Task(task_token),
                ..
            } => naming
                .task(task_token)
                .unwrap_or_else(|| "new task token".to_owned()),
            Change::Repark { .. } => "renew its poll".to_owned(),
        })
        .collect();
    if checks.is_empty() {
        format!("no checks: {}", changes.join(", "))
    } else {
        format!("if {}: {}", checks.join(", "), changes.join(", "))
    }
}

/// `write` landing on `lock`'s item and line as they are ([`Write::apply_with`], as the memory
/// store applies it): `Applied` with the item before, `Landed` for a write that names a
/// waiter's record, `Refused` with the item as it is; and the item and line after it, `None`
/// when it was refused (nothing changed).
#[allow(clippy::type_complexity)]
pub fn land_on_line(
    lock: &LockName,
    write: &Write,
    item: Option<&SemaphoreItem>,
    line: &BTreeMap<QueueKey, Waiter>,
) -> (
    WriteResult,
    Option<(SemaphoreItem, BTreeMap<QueueKey, Waiter>)>,
) {
    // A record is keyed by its waiter's id; the line is ordered by place.
    let id = write.waiter_id();
    let (key, record) = match id.and_then(|id| line.iter().find(|(k, _)| k.id == id)) {
        Some((key, record)) => (Some(*key), Some(record)),
        None => (None, None),
    };
    match write.apply_with(item, record) {
        Ok((next, record)) => {
            let mut line = line.clone();
            let result = match id {
                None => WriteResult::Applied {
                    before: item.cloned(),
                },
                Some(_) => {
                    if let Some(key) = key {
                        line.remove(&key);
                    }
                    if let Some(record) = record {
                        line.insert(record.key, record);
                    }
                    WriteResult::Landed { after: None }
                }
            };
            (result, Some((next, line)))
        }
        Err(_) => {
            let current = item
                .cloned()
                .unwrap_or_else(|| SemaphoreItem::empty(lock.clone()));
            let waiter_refused = write
                .checks
                .iter()
                .any(|check| check.waiter_id().is_some() && !check.holds_with(&current, record));
            (
                WriteResult::Refused {
                    current,
                    waiter_refused,
                },
                None,
            )
        }
    }
}
