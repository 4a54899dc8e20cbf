//! Leases, model-checked (F13): a small world of holders whose end nobody can see (Express
//! executions, Lambda functions, containers), each taking a slot of one lock under a lease that
//! its heartbeats renew, and taking back, when told "full", the leases that passed more than the
//! clock skew ago by its own clock. Every write is the core's and is in flight until it lands,
//! at any later step; some holders' clocks are a skew ahead, the worst case the skew allows.
//!
//! A holder believes its lease ends a lease after it *sent* the request that set it (a write can
//! land later than it was sent), and works only while its own clock says so. Checked in every
//! state: S1 (those who believe they hold weigh at most the limit; `used` is the holders'
//! weights; every lease is a holder's) and S3 (no acquisition taken back or released holds
//! again). Its broken variants (a take-back without a fence, a heartbeat without its checks, a
//! take-back that ignores the skew) are each caught.

use std::fmt;
use std::hash::Hash;
use std::time::Duration;

use clap::ValueEnum;
use semaphore_core::protocol::{self, Step, Timing, WriteResult};
use semaphore_core::{
    AcquireOutcome, AcquisitionId, Change, HeartbeatOutcome, HolderId, Identity, Lease, Limit,
    LockName, Run, SemaphoreItem, Terms, Weight, Write,
};

use crate::explore::{Model, Violation};
use crate::plumbing::{claim_of, shown, Variants};

/// The model's clock at tick 0.
const NOW_MS: u64 = 1_700_000_000_000;
/// One tick: the lease unit and the clock skew.
const TICK_MS: u64 = 10_000;
/// At most this many holders.
pub const MAX_HOLDERS: usize = 3;

/// The lease world's size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseConfig {
    pub holders: u8,
    pub limit: u32,
    /// The lease, in ticks.
    pub lease_ticks: u8,
    /// How many times the clock moves on, one tick each.
    pub ticks: u8,
    /// Heartbeats each holder may send.
    pub heartbeats: u8,
    /// Second attempts of an acquire each holder may send while its first is in flight.
    pub retries: u8,
}

impl LeaseConfig {
    /// Two holders of one slot, a lease of one tick, three ticks, a heartbeat and a retry
    /// each.
    pub fn small() -> Self {
        Self {
            holders: 2,
            limit: 1,
            lease_ticks: 1,
            ticks: 3,
            heartbeats: 1,
            retries: 1,
        }
    }
}

impl fmt::Display for LeaseConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} holders, limit {}, a lease of {} tick(s) (the clock skew is one tick; h-2's clock \
             is a skew ahead), {} tick(s) of the clock, {} heartbeat(s) and {} retried acquire(s) \
             each; writes land late and in any order",
            self.holders, self.limit, self.lease_ticks, self.ticks, self.heartbeats, self.retries
        )
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, ValueEnum)]
pub enum LeaseVariant {
    /// The product as it is.
    Real,
    /// A take-back removes the slots without fencing their acquisitions.
    TakeBackWithoutFence,
    /// A heartbeat renews without checking that its slot is still held and not fenced.
    HeartbeatWithoutCheck,
    /// A take-back takes a lease as soon as it ended by the taker's clock, without the skew.
    TakeBackWithoutSkew,
}

impl Variants for LeaseVariant {}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Stage {
    Idle,
    Acquiring,
    /// Holding, believing its lease ends at this time (epoch ms).
    Working {
        until_ms: u64,
    },
    Releasing,
    Done,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Kind {
    Acquire,
    /// A take-back the holder sent after its acquire was told "full"; the acquire again after.
    TakeBack,
    Heartbeat,
    Release,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct Flight {
    holder: u8,
    kind: Kind,
    /// The holder's clock when it decided the write.
    sent_ms: u64,
    write: WriteKey,
}

/// A write, ordered so that flights can be kept sorted (states that differ only in the order
/// of their flights are one state).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct WriteKey(Write);

impl PartialOrd for WriteKey {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for WriteKey {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        format!("{:?}", self.0).cmp(&format!("{:?}", other.0))
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct LeaseState {
    item: SemaphoreItem,
    now: u8,
    stages: [Stage; MAX_HOLDERS],
    heartbeats_left: [u8; MAX_HOLDERS],
    retries_left: [u8; MAX_HOLDERS],
    /// Holders whose acquisition was taken back or released (bit h).
    retired: u8,
    flights: Vec<Flight>,
}

pub struct LeaseWorld {
    config: LeaseConfig,
    variant: LeaseVariant,
    lock: LockName,
    timing: Timing,
}

impl LeaseWorld {
    pub fn new(config: LeaseConfig, variant: LeaseVariant) -> Self {
        assert!((1..=MAX_HOLDERS).contains(&usize::from(config.holders)));
        Self {
            config,
            variant,
            lock: LockName::new("model").expect("a lock name"),
            // The horizon is long enough that no acquire of this world expires: the fences and
            // the horizon are the main world's; here the leases are.
            timing: Timing {
                horizon: Duration::from_millis(TICK_MS * 100),
                clock_skew: Duration::from_millis(TICK_MS),
            },
        }
    }

    fn identity(&self, h: u8) -> Identity {
        Identity::new(
            HolderId::new(format!("h-{}", h + 1)).expect("a holder"),
            AcquisitionId::new("a").expect("an acquisition"),
        )
    }

    /// Holder `h`'s clock: true time, or (h-2's) a skew ahead.
    fn clock(&self, s: &LeaseState, h: u8) -> u64 {
        let offset = if h == 1 { TICK_MS } else { 0 };
        NOW_MS + u64::from(s.now) * TICK_MS + offset
    }

    fn lease(&self) -> Lease {
        Lease::ms(u64::from(self.config.lease_ticks) * TICK_MS).expect("a lease")
    }

    fn terms(&self) -> Terms {
        Terms::new(
            Limit::new(i64::from(self.config.limit)).expect("a limit"),
            Weight::ONE,
            None,
        )
        .expect("weight 1")
        .with_lease(Some(self.lease()))
    }

    fn acquire(&self, s: &LeaseState, h: u8) -> Write {
        let now = self.clock(s, h);
        protocol::acquire(
            &self.lock,
            &self.identity(h),
            Run::FIRST,
            None,
            self.terms(),
            now,
            now,
            &self.timing,
        )
        .expect("no acquire expires here")
    }

    fn heartbeat(&self, s: &LeaseState, h: u8) -> Write {
        let identity = self.identity(h);
        let held = shown(Some(&s.item), &identity, Weight::ONE);
        let mut write = protocol::heartbeat(
            &self.lock,
            &identity,
            held.token,
            held.weight,
            self.lease(),
            self.clock(s, h),
        );
        if self.variant == LeaseVariant::HeartbeatWithoutCheck {
            write.checks.clear();
        }
        write
    }

    /// The take-back holder `h` sends after being told "full", deciding by its own clock; `None`
    /// when no lease has expired by it.
    fn take_back(&self, s: &LeaseState, h: u8) -> Option<Write> {
        let skew = match self.variant {
            LeaseVariant::TakeBackWithoutSkew => 0,
            _ => TICK_MS,
        };
        let expired = s.item.expired_leases(self.clock(s, h), skew);
        if expired.is_empty() {
            return None;
        }
        let mut write = protocol::take_back(&self.lock, &expired, NOW_MS);
        if self.variant == LeaseVariant::TakeBackWithoutFence {
            write
                .changes
                .retain(|c| !matches!(c, Change::FenceAcquisition { .. }));
        }
        Some(write)
    }

    fn send(&self, s: &mut LeaseState, h: u8, kind: Kind, write: Write) {
        let sent_ms = self.clock(s, h);
        s.flights.push(Flight {
            holder: h,
            kind,
            sent_ms,
            write: WriteKey(write),
        });
        s.flights.sort();
    }

    fn who(&self, h: u8) -> String {
        format!("h-{}", h + 1)
    }

    /// Flight `i` lands (or is refused): the item after it, and what its holder does next.
    fn land(&self, s: &mut LeaseState, i: usize) -> String {
        let flight = s.flights.remove(i);
        let h = flight.holder;
        let write = flight.write.0;
        let result = match write.apply(Some(&s.item)) {
            Ok(after) => {
                let before = std::mem::replace(&mut s.item, after);
                WriteResult::Applied {
                    before: Some(before),
                }
            }
            Err(_) => WriteResult::Refused {
                current: s.item.clone(),
                waiter_refused: false,
            },
        };
        let landed = matches!(result, WriteResult::Applied { .. });
        let identity = self.identity(h);
        let mut words = format!(
            "{}'s {:?} {}",
            self.who(h),
            flight.kind,
            if landed { "lands" } else { "is refused" }
        );
        match flight.kind {
            Kind::Acquire => {
                let outcome = protocol::acquired(&write, &identity, self.terms().limit, result)
                    .expect("an acquire's answer");
                words.push_str(&format!(": {outcome:?}"));
                if s.stages[h as usize] != Stage::Acquiring {
                    return words + " (nobody waits for it)";
                }
                match outcome {
                    AcquireOutcome::Acquired { .. } | AcquireOutcome::AlreadyHeld { .. } => {
                        s.stages[h as usize] = Stage::Working {
                            until_ms: flight.sent_ms + self.lease().as_ms(),
                        };
                    }
                    AcquireOutcome::Full { .. } => match self.take_back(s, h) {
                        Some(take_back) => {
                            words.push_str("; it takes back an expired lease");
                            self.send(s, h, Kind::TakeBack, take_back);
                        }
                        None => s.stages[h as usize] = Stage::Idle,
                    },
                    AcquireOutcome::Fenced(_) => s.stages[h as usize] = Stage::Done,
                    other => unreachable!("no {other:?} in this world"),
                }
            }
            Kind::TakeBack => {
                if landed {
                    for change in &write.changes {
                        if let Change::RemoveHolder { identity, .. } = change {
                            let taken = self.index(identity);
                            s.retired |= 1 << taken;
                        }
                    }
                }
                // The same invocation asks again (on a refusal too: the item tells).
                words.push_str("; it acquires again");
                let again = self.acquire(s, h);
                self.send(s, h, Kind::Acquire, again);
            }
            Kind::Heartbeat => {
                let claim = claim_of(&write);
                let outcome = match protocol::heartbeat_answered(&write, &identity, claim, &result)
                {
                    semaphore_core::Step::Done(outcome) => outcome,
                    semaphore_core::Step::Again(_) => {
                        unreachable!("a holder's heartbeat shows its weight")
                    }
                };
                words.push_str(&format!(": {outcome:?}"));
                if let Stage::Working { .. } = s.stages[h as usize] {
                    match outcome {
                        HeartbeatOutcome::Renewed { .. } => {
                            s.stages[h as usize] = Stage::Working {
                                until_ms: flight.sent_ms + self.lease().as_ms(),
                            };
                        }
                        HeartbeatOutcome::Lost | HeartbeatOutcome::WrongToken { .. } => {
                            s.stages[h as usize] = Stage::Done
                        }
                    }
                }
            }
            Kind::Release => {
                if landed {
                    s.retired |= 1 << h;
                }
                match protocol::released(&write, &identity, claim_of(&write), result)
                    .expect("a release's answer")
                {
                    Step::Done(_) => s.stages[h as usize] = Stage::Done,
                    Step::Again(next) => {
                        if next
                            .changes
                            .iter()
                            .any(|c| matches!(c, Change::FenceAcquisition { .. }))
                        {
                            s.retired |= 1 << h;
                        }
                        self.send(s, h, Kind::Release, next)
                    }
                }
            }
        }
        words
    }

    fn index(&self, identity: &Identity) -> u8 {
        (0..self.config.holders)
            .find(|&h| self.identity(h) == *identity)
            .expect("a holder of the world")
    }
}

impl Model for LeaseWorld {
    type State = LeaseState;

    fn initial(&self) -> LeaseState {
        LeaseState {
            item: SemaphoreItem::empty(self.lock.clone()),
            now: 0,
            stages: [Stage::Idle; MAX_HOLDERS],
            heartbeats_left: [self.config.heartbeats; MAX_HOLDERS],
            retries_left: [self.config.retries; MAX_HOLDERS],
            retired: 0,
            flights: Vec::new(),
        }
    }

    fn successors(
        &self,
        s: &LeaseState,
        out: &mut Vec<LeaseState>,
        mut labels: Option<&mut Vec<String>>,
    ) {
        let mut push = |t: LeaseState, label: String| {
            out.push(t);
            if let Some(labels) = labels.as_deref_mut() {
                labels.push(label);
            }
        };
        for h in 0..self.config.holders {
            let i = h as usize;
            let in_flight = s.flights.iter().any(|f| f.holder == h);
            match s.stages[i] {
                Stage::Idle => {
                    let mut t = s.clone();
                    t.stages[i] = Stage::Acquiring;
                    let write = self.acquire(&t, h);
                    self.send(&mut t, h, Kind::Acquire, write);
                    push(t, format!("{} sends its acquire", self.who(h)));
                }
                Stage::Acquiring if in_flight && s.retries_left[i] > 0 => {
                    // A retry of the acquire while the first attempt is still in flight.
                    let mut t = s.clone();
                    t.retries_left[i] -= 1;
                    let write = self.acquire(&t, h);
                    self.send(&mut t, h, Kind::Acquire, write);
                    push(t, format!("{} retries its acquire", self.who(h)));
                }
                Stage::Working { .. } => {
                    if s.heartbeats_left[i] > 0 {
                        let mut t = s.clone();
                        t.heartbeats_left[i] -= 1;
                        let write = self.heartbeat(&t, h);
                        self.send(&mut t, h, Kind::Heartbeat, write);
                        push(t, format!("{} sends a heartbeat", self.who(h)));
                    }
                    let mut t = s.clone();
                    t.stages[i] = Stage::Releasing;
                    let identity = self.identity(h);
                    let held = shown(Some(&t.item), &identity, Weight::ONE);
                    let write =
                        protocol::release(&self.lock, &identity, held.token, held.weight, NOW_MS);
                    self.send(&mut t, h, Kind::Release, write);
                    push(t, format!("{} releases", self.who(h)));
                }
                _ => {}
            }
        }
        for i in 0..s.flights.len() {
            if i > 0 && s.flights[i] == s.flights[i - 1] {
                continue;
            }
            let mut t = s.clone();
            let words = self.land(&mut t, i);
            push(t, words);
        }
        if s.now < self.config.ticks {
            let mut t = s.clone();
            t.now += 1;
            let now = t.now;
            push(t, format!("a tick of the clock (now tick {now})"));
        }
    }

    fn check(&self, s: &LeaseState) -> Result<(), Violation> {
        let limit = u64::from(self.config.limit);
        let weights: u64 = s
            .item
            .holders
            .values()
            .map(|h| u64::from(h.weight.get()))
            .sum();
        if s.item.used != weights || weights > limit {
            return Err(Violation {
                property: "S1",
                detail: format!(
                    "the item records {} used, its holders weigh {weights}, limit {limit}",
                    s.item.used
                ),
            });
        }
        if let Some(orphan) = s
            .item
            .leases
            .keys()
            .find(|id| !s.item.holders.contains_key(*id))
        {
            return Err(Violation {
                property: "S1",
                detail: format!(
                    "the item keeps a lease of {}, which holds no slot",
                    orphan.holder
                ),
            });
        }
        // Who works believing its lease runs, by its own clock.
        let believing: Vec<String> = (0..self.config.holders)
            .filter(|&h| {
                matches!(s.stages[h as usize], Stage::Working { until_ms } if self.clock(s, h) <= until_ms)
            })
            .map(|h| self.who(h))
            .collect();
        if believing.len() as u64 > limit {
            return Err(Violation {
                property: "S1",
                detail: format!(
                    "{} work at once believing their leases run, with limit {limit}",
                    believing.join(" and ")
                ),
            });
        }
        for h in 0..self.config.holders {
            if s.retired & (1 << h) != 0 && s.item.holders.contains_key(&self.identity(h)) {
                return Err(Violation {
                    property: "S3",
                    detail: format!(
                        "{}'s acquisition holds a slot again after it was taken back or released",
                        self.who(h)
                    ),
                });
            }
        }
        Ok(())
    }

    fn may_stop(&self, _: &LeaseState) -> bool {
        true
    }

    fn describe_initial(&self, _: &LeaseState) -> String {
        format!(
            "leases ({} variant): {}",
            match self.variant {
                LeaseVariant::Real => "the product's".to_owned(),
                other => format!("BROKEN {}", other.name()),
            },
            self.config
        )
    }
}
