//! Pollers, model-checked: a waiter that cannot park on a task token (an Express workflow, a
//! Lambda function, any client) waits in the same line as parked executions, keeps its place by
//! polling, and holds its slot under a lease. That needs both the lease world's clocks and the
//! queue world's step-by-step Lambdas, so pollers get a world of their own built from the two:
//! a holder of the one slot, a poller that may stop polling for ever at any point, and a parked
//! execution that may be stopped, some clocks a skew ahead. Every write is the core's, and the
//! acquire function is the core's acquire flow ([`semaphore_core::flow::acquire`]), run one call
//! per step with the clock of the step that makes it; the take-back inside an acquire
//! (`Semaphore::acquire_seeing`) and the hand-off are still restated one request per step.
//!
//! Checked: S1, S2 for leases, S3, L1, L2 and F8 for pollers (a hand-off skips a poller it can
//! tell is gone) in every state, and in every quiet state that a stopped poller ends up holding
//! nothing and out of line. The world, the properties, what a poller must do and what is not
//! covered are described in docs/testing.md ("Pollers (`model-check --pollers`)").

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::hash::{Hash, Hasher};
use std::rc::Rc;
use std::time::Duration;

use clap::ValueEnum;
use semaphore_core::flow::acquire::{
    AcquireFlow, Broken, Budget, Call, Next, Refusal, Reply, Request as FlowRequest, Taken, Waiting,
};
use semaphore_core::item::{Identity, Run, SemaphoreItem};
use semaphore_core::protocol::{self, Grant, Timing, WriteResult};
use semaphore_core::{
    AcquireOutcome, AcquisitionId, Attempt, Change, FenceKey, HolderId, Lease, Limit, LockName,
    QueueKey, QueueOutcome, TaskToken, Terms, Waiter, WaiterId, Wakeup, Weight, Write,
};

use crate::explore::{Model, Violation};
use crate::hash::{Build, Fingerprint};
use crate::ours::MAX_ROUNDS;
use crate::plumbing::{
    claim_of, land_on_line, read, show_write, shown, Interner, ItemKey, Naming, Variants, Words,
};

/// The model's clock at tick 0.
const NOW_MS: u64 = 1_700_000_000_000;
/// One tick: the lease, the poll window and the clock skew are counted in it.
const TICK_MS: u64 = 10_000;
/// The skew every writer allows for (one tick), and the horizon: long enough that no request
/// expires here (the main world checks the horizon).
const TIMING: Timing = Timing {
    horizon: Duration::from_millis(TICK_MS * 100),
    clock_skew: Duration::from_millis(TICK_MS),
};

/// The pollers' world's size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PollConfig {
    /// The poller's lease, in ticks.
    pub lease_ticks: u8,
    /// How long a poll keeps the poller's place, in ticks (`poll_seconds`).
    pub poll_ticks: u8,
    /// How many times the clock moves on, one tick each.
    pub ticks: u8,
    /// How many times the poller invokes the acquire function (its first ask included).
    pub polls: u8,
    /// How many times the parked execution may be stopped (0 or 1).
    pub deaths: u8,
}

impl PollConfig {
    /// A lease and a poll window of one tick each, two ticks (enough for a record or a lease
    /// to run out by more than the skew, by a clock a skew ahead), three polls (the ask, and a
    /// renewal at each tick), the parked execution may be stopped.
    pub fn small() -> Self {
        Self {
            lease_ticks: 1,
            poll_ticks: 1,
            ticks: 2,
            polls: 3,
            deaths: 1,
        }
    }
}

impl fmt::Display for PollConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "limit 1: holder holds the slot, poller polls for it (a lease of {} tick(s), its \
             place kept {} tick(s) by each poll, at most {} polls, it may stop polling at any \
             point), exec parks on its task for it ({}); the clock skew is one tick, exec's \
             functions and the sweeper's clock a skew ahead; {} tick(s) of the clock",
            self.lease_ticks,
            self.poll_ticks,
            self.polls,
            if self.deaths > 0 {
                "it may be stopped while it waits, its cleanup event delivered late"
            } else {
                "it runs to the end"
            },
            self.ticks
        )
    }
}

/// A deliberately broken variant of the pollers' protocol (or of what a poller must do), to
/// show that the checker notices: the model alters one of the core's writes, or breaks the
/// core's acquire flow behind its test-only switch ([`Broken`], the `broken-variants` feature).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, ValueEnum)]
pub enum PollVariant {
    /// The product as it is.
    Real,
    /// A grant takes the slot for a poller without setting its lease: if the poller stops, its
    /// slot is held for ever (S2).
    GrantWithoutLease,
    /// A hand-off grants the head without asking whether it is a poller that stopped: the slot
    /// goes to a waiter that is gone, and everyone behind it waits a whole lease (F8).
    HandOffGrantsStoppedPoller,
    /// A stopped poller is taken out of line with a plain `leave`, without the check that its
    /// record is the one judged stopped: a poll that renewed it meanwhile loses its place (L2).
    LeaveStoppedWithoutRecordCheck,
    /// A record is judged stopped as soon as its time ran out by the judge's clock, without
    /// the clock skew: a judge whose clock is ahead takes out of line a poller that polls in
    /// time (L2).
    StoppedWithoutSkew,
    /// A poll that finds its record in line keeps the place without renewing its time: a
    /// poller that polls in time is taken out of line as stopped (L2).
    PollKeepsOldTime,
    /// The poller counts the lease of a slot it finds granted (`already_held`) from the poll
    /// that found it, not from the one before: it goes on working after the lease the grant
    /// set has passed and the slot was taken back (S1).
    PollerCountsFromThePollThatFoundIt,
}

impl Variants for PollVariant {}

/// The three holders, and the sweeper.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Who {
    Poller,
    Exec,
    Holder,
    /// The sweeper (in the quiet states' check only).
    Sweeper,
}

impl Who {
    fn bit(self) -> u8 {
        1 << (self as u8)
    }

    fn name(self) -> &'static str {
        match self {
            Self::Poller => "poller",
            Self::Exec => "exec",
            Self::Holder => "holder",
            Self::Sweeper => "the sweeper",
        }
    }

    /// How far ahead of true time its writers' clocks are, in ticks.
    fn ahead(self) -> u64 {
        match self {
            Self::Poller | Self::Holder => 0,
            Self::Exec | Self::Sweeper => 1,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum PollerStage {
    /// Has not asked yet.
    Idle,
    /// A poll (an invocation of the acquire function) runs.
    Polling,
    /// Told "busy" (or "expired"): it polls again.
    Between,
    /// Holding, believing its lease ends at this tick (by its own clock).
    Working {
        until: u8,
    },
    Releasing,
    Done,
    /// Answered "fenced".
    Refused,
    /// It stopped polling for ever (or died while holding).
    Stopped,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Poller {
    stage: PollerStage,
    /// Its polls so far (the current or last one is poll `n - 1`).
    n: u8,
    /// When it sent its current (or last) poll, and the one before.
    sent: u8,
    prev: Option<u8>,
    /// Until when (tick) its last renewal keeps its place: its next poll must renew it by then.
    due: Option<u8>,
    /// It missed its poll window: a tick passed while it waited for its slot with its place
    /// not renewed since its time ran out, or a record of it landed with its time run out.
    late: bool,
    /// When it first asked: its place in line (see [`PollWorld::place_ms`]).
    place: Option<u8>,
}

impl Poller {
    fn alive(self) -> bool {
        !matches!(
            self.stage,
            PollerStage::Done | PollerStage::Refused | PollerStage::Stopped
        )
    }

    /// Waiting for its slot: it has asked and not yet found it.
    fn waiting(self) -> bool {
        matches!(self.stage, PollerStage::Polling | PollerStage::Between)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum ExecStage {
    Idle,
    /// In its acquire state, parked on its task (`Exec::token`).
    Waiting,
    Working,
    Releasing,
    Succeeded,
    /// Stopped (or failed): its cleanup event is emitted.
    Ended,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Exec {
    stage: ExecStage,
    /// The task token of its current acquire attempt.
    token: u8,
    place: Option<u8>,
}

impl Exec {
    fn alive(self) -> bool {
        !matches!(self.stage, ExecStage::Succeeded | ExecStage::Ended)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum HolderStage {
    Holding,
    Releasing,
    Done,
}

/// Which invocation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Task {
    /// The poller's poll `n` (the acquire function, without a task token).
    Poll {
        n: u8,
    },
    /// The parked execution's acquire function, for the attempt of task `token`.
    Acquire {
        token: u8,
    },
    Release,
    /// The cleanup of the parked execution.
    Cleanup,
    /// The sweeper's hand-off.
    Sweep,
}

/// What a take-back goes on with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum After {
    /// The acquire flow `flow`'s acquire (`acquire_seeing`): again, or on as "full".
    Flow(u32),
    /// The hand-off: on from the item after it, or done if it took nothing.
    HandOn,
}

/// One request of a hand-off, about to be made. Table numbers are the lock as it was read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Hand {
    ReadLock,
    /// Read the head, the lock as last read being `seen`.
    ReadHead {
        seen: u32,
    },
    /// Take out of line the head of table `head`, judged stopped at tick `at`.
    LeaveStopped {
        seen: u32,
        head: u32,
        at: u8,
    },
    /// The grant of the head of table `head`, decided at tick `at`; `line_at_read`: who was in
    /// line when the head was read.
    Grant {
        head: u32,
        at: u8,
        line_at_read: u8,
    },
    /// Read the lock after a grant to `head` (with task `token`, for the parked execution).
    ReadGranted {
        head: Who,
        token: u8,
    },
    /// `SendTaskSuccess` to the parked execution's task `token`.
    Wake {
        seen: u32,
        token: u8,
    },
    /// `DescribeExecution` of the parked execution, whose wake-up failed.
    Describe {
        seen: u32,
    },
    /// The cleanup of its run: the fence, then the free.
    Fence,
    Free {
        round: u8,
    },
    /// The head's record out of line (dead or holding).
    Leave {
        head: Who,
    },
}

/// An invocation's next request, with what it decided (and when, for what depends on its
/// clock).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Step {
    /// The acquire function runs the core's acquire flow: the flow and the call it makes next
    /// (interned, [`PollWorld::flow`]), decided at tick `at`.
    Flow {
        id: u32,
        at: u8,
    },
    /// The take-back of the leases that had passed on table `seen` by tick `at`.
    TakeBack {
        seen: u32,
        at: u8,
        then: After,
    },
    /// `SendTaskSuccess` to its own task.
    SelfWake,
    Release {
        unheld: bool,
        round: u8,
    },
    /// The parked execution's cleanup: fence, out of line, free.
    Fence,
    Leave {
        slots: bool,
    },
    Free {
        round: u8,
    },
    Hand(Hand),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct Lambda {
    who: Who,
    task: Task,
    step: Step,
    /// Its hand-off granted the poller a slot (the poll answers with it).
    granted_poller: bool,
}

/// What an acquire function invocation answers.
enum Answer {
    Holding { taken: bool },
    InLine,
    Fenced,
    Expired,
}

/// What landed when it must not have.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Bad {
    /// S3.
    Resurrected { who: Who, what: &'static str },
    /// L2: an acquire landed while someone was in line.
    PassedTheLine { who: Who },
    /// L2: a grant landed while waiters were ahead of it.
    OutOfOrder { who: Who, ahead: u8 },
    /// L2: a live waiter left the line without its grant.
    LostPlace { who: Who },
    /// L2: a poller's record was taken out of line as stopped though, as it was when the
    /// removal landed, its time had not run out (by more than the skew, by the remover's
    /// clock): it had been renewed since it was judged, or was judged without the skew.
    RemovedAlive,
    /// F8: a poller the hand-off could tell had stopped was granted a slot.
    GrantedStopped,
    /// L1: a live holder was answered "fenced".
    Refused { who: Who },
    /// L1: a release or free was refused [`MAX_ROUNDS`] times.
    Rounds { who: Who },
}

/// What a write did to a table: its result, and the table after it.
type Landing = (Rc<WriteResult>, u32);

/// A lock's item and line, as one key.
type TableKey = (Option<ItemKey>, BTreeMap<QueueKey, Waiter>);

struct Table {
    item: Option<SemaphoreItem>,
    line: BTreeMap<QueueKey, Waiter>,
    /// Who holds a slot, and who is in line (bit per [`Who`]).
    holders: u8,
    in_line: u8,
    /// Everything but what nothing reads (the version, fencing tokens, when slots were taken).
    shape: u64,
    /// What a hand-off reads of the lock it read (the weight held, who waits, and the leases
    /// with the weights of their slots), and of the head it read (its record).
    seen: u64,
    head: u64,
}

impl Table {
    fn waiting(&self) -> u64 {
        self.item.as_ref().map_or(0, |item| item.waiting)
    }

    fn used(&self) -> u64 {
        self.item.as_ref().map_or(0, |item| item.used)
    }

    fn head(&self) -> Option<&Waiter> {
        self.line.values().next()
    }
}

/// A state of the pollers' world.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PollState {
    table: u32,
    /// True time, in ticks.
    now: u8,
    poller: Poller,
    exec: Exec,
    holder: HolderStage,
    /// Running invocations, sorted.
    lambdas: Vec<Lambda>,
    /// The parked execution's cleanup event is pending.
    event: bool,
    polls_left: u8,
    deaths_left: u8,
    /// How many have asked: the next to ask is placed behind them.
    asks: u8,
    /// Who was released, taken back or fenced (S3).
    retired: u8,
    bad: Option<Bad>,
}

/// The pollers' world, explorable by [`crate::explore::explore`].
pub struct PollWorld {
    pub config: PollConfig,
    pub variant: PollVariant,
    lock: LockName,
    limit: Limit,
    /// The poller's, exec's and holder's identities, records' ids and fences (acquisition,
    /// run), computed once.
    ids: [Identity; 3],
    waiter_ids: [WaiterId; 3],
    fence_keys: [(FenceKey, FenceKey); 3],
    tables: RefCell<Interner<TableKey, Rc<Table>>>,
    /// What each write does to each table it lands on.
    landings: RefCell<HashMap<(u32, Write), Landing, Build>>,
    /// The acquire flows reached, each with the call it makes next.
    flows: RefCell<Interner<FlowAt, Rc<FlowAt>>>,
}

/// An acquire flow and the call it makes next.
type FlowAt = (AcquireFlow, Call);

fn identity(who: Who) -> Identity {
    Identity::new(
        HolderId::new(who.name()).expect("a holder"),
        AcquisitionId::new(if who == Who::Poller { "a" } else { "r0" }).expect("an acquisition"),
    )
}

fn task_token(n: u8) -> TaskToken {
    TaskToken::new(format!("exec-task-{n}")).expect("a task token")
}

fn token_number(token: &TaskToken) -> u8 {
    token
        .as_str()
        .rsplit_once("-task-")
        .and_then(|(_, n)| n.parse().ok())
        .expect("a task token of the model")
}

impl PollWorld {
    pub fn new(config: PollConfig, variant: PollVariant) -> Self {
        assert!(config.lease_ticks >= 1 && config.poll_ticks >= 1 && config.polls >= 1);
        let ids = [Who::Poller, Who::Exec, Who::Holder].map(identity);
        let world = Self {
            config,
            variant,
            lock: LockName::new("model").expect("a lock name"),
            limit: Limit::new(1).expect("a limit"),
            waiter_ids: ids.clone().map(|id| WaiterId::of(&id)),
            fence_keys: ids.clone().map(|id| {
                (
                    FenceKey::acquisition(&id),
                    FenceKey::execution(&id.holder, Run::FIRST),
                )
            }),
            ids,
            tables: RefCell::default(),
            landings: RefCell::default(),
            flows: RefCell::default(),
        };
        let empty = world.intern(None, BTreeMap::new());
        assert_eq!(empty, 0);
        world
    }

    fn id(&self, who: Who) -> &Identity {
        &self.ids[who as usize]
    }

    fn table(&self, id: u32) -> Rc<Table> {
        self.tables.borrow().get(id).clone()
    }

    fn who_of(identity: &Identity) -> Who {
        [Who::Poller, Who::Exec, Who::Holder]
            .into_iter()
            .find(|&who| identity.holder.as_str() == who.name())
            .expect("a holder of the model")
    }

    fn intern(&self, item: Option<SemaphoreItem>, line: BTreeMap<QueueKey, Waiter>) -> u32 {
        Interner::intern(&self.tables, (item.map(ItemKey), line), |(item, line)| {
            let item = item.as_ref().map(|ItemKey(item)| item.clone());
            let holders = item.as_ref().map_or(0, |item| {
                item.holders
                    .keys()
                    .fold(0, |m, id| m | Self::who_of(id).bit())
            });
            let in_line = line
                .values()
                .fold(0, |m, w| m | Self::who_of(&w.identity).bit());
            let shape = {
                let mut h = Fingerprint::default();
                if let Some(item) = &item {
                    (
                        item.limit,
                        item.holders
                            .iter()
                            .map(|(id, h)| (id, h.weight))
                            .collect::<Vec<_>>(),
                        &item.fences,
                        &item.leases,
                        item.waiting,
                        item.used,
                    )
                        .hash(&mut h);
                }
                for w in line.values() {
                    (w.key, &w.wakeup, w.attempt, w.run, w.terms).hash(&mut h);
                }
                h.finish()
            };
            let seen = {
                let mut h = Fingerprint::default();
                if let Some(item) = &item {
                    (item.used, item.waiting).hash(&mut h);
                    Self::hash_leases(item, &mut h);
                }
                h.finish()
            };
            let head = {
                let mut h = Fingerprint::default();
                line.values().next().hash(&mut h);
                h.finish()
            };
            Rc::new(Table {
                item,
                line: line.clone(),
                holders,
                in_line,
                shape,
                seen,
                head,
            })
        })
    }

    /// `who`'s clock at true tick `at`, in epoch ms.
    fn clock(who: Who, at: u8) -> u64 {
        NOW_MS + (u64::from(at) + who.ahead()) * TICK_MS
    }

    /// The place (epoch ms) of the `place`-th to ask: only the order of places matters (an
    /// entry time is when a waiter first asked, so the first to ask is first in line), so
    /// they are the first milliseconds of the model's time, whenever they asked.
    fn place_ms(place: u8) -> u64 {
        NOW_MS + u64::from(place)
    }

    fn lease(&self) -> Lease {
        Lease::ms(u64::from(self.config.lease_ticks) * TICK_MS).expect("a lease")
    }

    fn terms(&self, who: Who) -> Terms {
        let terms = Terms::new(self.limit, Weight::ONE, None).expect("weight 1");
        match who {
            Who::Poller => terms.with_lease(Some(self.lease())),
            _ => terms,
        }
    }

    /// The skew a judge of a poller's record allows for.
    fn judging_skew(&self) -> u64 {
        match self.variant {
            PollVariant::StoppedWithoutSkew => 0,
            _ => TICK_MS,
        }
    }

    /// Whether `who` judges `head` stopped at tick `at`.
    fn judged_stopped(&self, who: Who, head: &Waiter, at: u8) -> bool {
        head.stopped_polling(Self::clock(who, at), self.judging_skew())
    }

    // ---- the core's writes ----

    /// The take-back of the leases that had passed on `seen` by `who`'s clock at `at`, if any.
    fn take_back_write(&self, seen: u32, who: Who, at: u8) -> Option<Write> {
        let t = self.table(seen);
        let item = t.item.as_ref()?;
        let expired = item.expired_leases(Self::clock(who, at), TICK_MS);
        (!expired.is_empty()).then(|| protocol::take_back(&self.lock, &expired, NOW_MS))
    }

    /// What `write` does to table `table` ([`Write::apply_with`], as the memory store applies
    /// it: `Applied` with the item before, `Landed` for a write that names a waiter's record,
    /// `Refused` with the item as it is), and the table after it. Worked out once per table
    /// and write.
    fn land(&self, table: u32, write: &Write) -> Landing {
        let key = (table, write.clone());
        if let Some(known) = self.landings.borrow().get(&key) {
            return known.clone();
        }
        let landing = self.make_landing(table, write);
        self.landings.borrow_mut().insert(key, landing.clone());
        landing
    }

    fn make_landing(&self, table: u32, write: &Write) -> Landing {
        let t = self.table(table);
        let (result, next) = land_on_line(&self.lock, write, t.item.as_ref(), &t.line);
        let after = match next {
            Some((item, line)) => self.intern(Some(item), line),
            None => table,
        };
        (Rc::new(result), after)
    }

    /// The write lands on the lock's item and line as they are ([`Write::apply_with`], as the
    /// memory store applies it), with what it did in words; checks S3 and L2 on what landed.
    fn send(&self, s: &mut PollState, who: Who, write: &Write, w: &mut Words) -> WriteResult {
        let t = self.table(s.table);
        let (result, after) = self.land(s.table, write);
        let result = (*result).clone();
        let landed = !matches!(result, WriteResult::Refused { .. });
        s.table = after;
        w.say(|| {
            format!(
                "({}) {}: {}",
                show_write(self, write),
                if landed { "lands" } else { "is refused" },
                self.show(after)
            )
        });
        if landed {
            self.landed(s, who, write, &t);
        }
        result
    }

    /// What a write of `who` that landed on `before` must not have done.
    fn landed(&self, s: &mut PollState, who: Who, write: &Write, before: &Table) {
        let after = self.table(s.table);
        let takes = write
            .changes
            .iter()
            .any(|c| matches!(c, Change::PutHolder { .. }));
        let queues = write
            .changes
            .iter()
            .any(|c| matches!(c, Change::Enqueue(_)));
        let fences = write.changes.iter().filter_map(|c| match c {
            Change::AddFence(key) => Some(*key),
            Change::FenceAcquisition { identity, .. } => Some(FenceKey::acquisition(identity)),
            _ => None,
        });
        let mut retire = 0;
        for key in fences {
            for x in [Who::Poller, Who::Exec, Who::Holder] {
                let (acquisition, run) = self.fence_keys[x as usize];
                if key == acquisition || key == run {
                    retire |= x.bit();
                }
            }
        }
        if s.bad.is_none() && (takes || queues) && s.retired & who.bit() != 0 {
            let what = if queues {
                "queue write"
            } else if write
                .changes
                .iter()
                .any(|c| matches!(c, Change::Dequeue(_)))
            {
                "grant"
            } else {
                "acquire"
            };
            s.bad = Some(Bad::Resurrected { who, what });
        }
        s.retired |= retire;
        if s.bad.is_none() && takes && before.waiting() > 0 {
            let granted = write
                .changes
                .iter()
                .any(|c| matches!(c, Change::Dequeue(_)));
            if !granted {
                s.bad = Some(Bad::PassedTheLine { who });
            }
        }
        // Who left the line without a grant.
        let left = before.in_line & !after.in_line & !after.holders;
        for x in [Who::Poller, Who::Exec] {
            if s.bad.is_none() && left & x.bit() != 0 {
                let live = match x {
                    Who::Poller => s.poller.alive() && !s.poller.late,
                    _ => s.exec.alive(),
                };
                if live {
                    s.bad = Some(Bad::LostPlace { who: x });
                }
            }
        }
    }

    // ---- traces ----

    fn tick_name(at_ms: u64) -> String {
        let since = at_ms.saturating_sub(NOW_MS);
        let (tick, rest) = (since / TICK_MS, since % TICK_MS);
        if rest == 0 {
            format!("tick {tick}")
        } else {
            format!("tick {tick} (+{rest} ms)")
        }
    }

    fn show(&self, table: u32) -> String {
        let t = self.table(table);
        let Some(item) = &t.item else {
            return "no item".to_owned();
        };
        let holders: Vec<String> = item
            .holders
            .iter()
            .map(|(id, h)| {
                let lease = item.leases.get(id).map_or(String::new(), |u| {
                    format!(", lease until {}", Self::tick_name(*u))
                });
                format!("{} token {}{lease}", id.holder, h.token.0)
            })
            .collect();
        let mut text = format!("v{}, {} held", item.version.0, item.count());
        if !holders.is_empty() {
            text.push_str(&format!(" [{}]", holders.join("; ")));
        }
        let fenced: Vec<String> = [Who::Poller, Who::Exec, Who::Holder]
            .into_iter()
            .filter(|&x| {
                let (acquisition, run) = self.fence_keys[x as usize];
                item.is_fenced(&acquisition) || item.is_fenced(&run)
            })
            .map(|x| x.name().to_owned())
            .collect();
        if !fenced.is_empty() {
            text.push_str(&format!(", fenced: {}", fenced.join(", ")));
        }
        text.push_str(&format!(", waiting {}", item.waiting));
        let line: Vec<String> = t.line.values().map(Self::show_waiter).collect();
        if !line.is_empty() {
            text.push_str(&format!(", line: {}", line.join(" < ")));
        }
        text
    }

    fn show_waiter(w: &Waiter) -> String {
        match &w.wakeup {
            Wakeup::Task(token) => {
                format!("{} (task {})", w.identity.holder, token_number(token))
            }
            Wakeup::Poll { until_ms } => format!(
                "{} (poll {}, until {})",
                w.identity.holder,
                w.attempt.0,
                Self::tick_name(*until_ms)
            ),
        }
    }

    fn lambda_name(&self, s: &PollState, l: &Lambda) -> String {
        match (l.who, l.task) {
            (Who::Poller, Task::Poll { n }) => format!(
                "poller's poll {n}{}",
                if s.poller.alive() { "" } else { " (zombie)" }
            ),
            (Who::Exec, Task::Acquire { token }) => format!(
                "exec's acquire function (task {token}){}",
                if !s.exec.alive() {
                    " (zombie)"
                } else if s.exec.stage != ExecStage::Waiting || s.exec.token != token {
                    " (its task is over)"
                } else {
                    ""
                }
            ),
            (who, Task::Release) => format!("{}'s release", who.name()),
            (_, Task::Cleanup) => "the cleanup of exec".to_owned(),
            (_, Task::Sweep) => "the sweeper's hand-off".to_owned(),
            (who, task) => unreachable!("{who:?} does not run {task:?}"),
        }
    }

    // ---- the invocations ----

    fn spawn(s: &mut PollState, who: Who, task: Task, step: Step) {
        s.lambdas.push(Lambda {
            who,
            task,
            step,
            granted_poller: false,
        });
        s.lambdas.sort_unstable();
    }

    /// Goes on with `l` at `step`, or ends it.
    fn next(&self, s: &mut PollState, mut l: Lambda, step: Option<Step>, w: &mut Words) {
        match step {
            Some(step) => {
                l.step = step;
                s.lambdas.push(l);
                s.lambdas.sort_unstable();
            }
            None => self.done(s, l, w),
        }
    }

    /// An invocation has no more requests to make.
    fn done(&self, s: &mut PollState, l: Lambda, w: &mut Words) {
        match l.task {
            Task::Poll { .. } | Task::Acquire { .. } => {
                // Its hand-off is over: it was in line.
                let answer = if l.granted_poller && l.who == Who::Poller {
                    Answer::Holding { taken: true }
                } else {
                    Answer::InLine
                };
                self.answer(s, l, answer, w);
            }
            Task::Release => match l.who {
                Who::Poller if s.poller.stage == PollerStage::Releasing => {
                    s.poller.stage = PollerStage::Done;
                    w.say(|| " => poller is done".to_owned());
                }
                Who::Exec if s.exec.stage == ExecStage::Releasing => {
                    s.exec.stage = ExecStage::Succeeded;
                    w.say(|| " => exec succeeds".to_owned());
                }
                Who::Holder => {
                    s.holder = HolderStage::Done;
                    w.say(|| " => holder succeeds".to_owned());
                }
                _ => {}
            },
            Task::Cleanup | Task::Sweep => {}
        }
    }

    /// The acquire function of `l` answers.
    fn answer(&self, s: &mut PollState, l: Lambda, answer: Answer, w: &mut Words) {
        match l.task {
            Task::Poll { n } => {
                let current = s.poller.stage == PollerStage::Polling && s.poller.n == n + 1;
                if !current {
                    w.say(|| " (nobody waits for its answer)".to_owned());
                    return;
                }
                match answer {
                    Answer::Holding { taken } => {
                        let from = if taken
                            || self.variant == PollVariant::PollerCountsFromThePollThatFoundIt
                        {
                            s.poller.sent
                        } else {
                            s.poller.prev.unwrap_or(s.poller.sent)
                        };
                        let until = from + self.config.lease_ticks;
                        s.poller.stage = PollerStage::Working { until };
                        w.say(|| {
                            format!(
                                " => poller holds its slot ({}), its lease running until tick \
                                 {until} as it counts it, and works",
                                if taken { "acquired" } else { "already_held" }
                            )
                        });
                    }
                    Answer::InLine | Answer::Expired => {
                        s.poller.stage = PollerStage::Between;
                        w.say(|| " => SemaphoreBusy: poller will poll again".to_owned());
                    }
                    Answer::Fenced => {
                        s.poller.stage = PollerStage::Refused;
                        if !s.poller.late && s.bad.is_none() {
                            s.bad = Some(Bad::Refused { who: Who::Poller });
                        }
                        w.say(|| " => SemaphoreFenced: poller is refused".to_owned());
                    }
                }
            }
            Task::Acquire { token } => {
                let current = s.exec.stage == ExecStage::Waiting && s.exec.token == token;
                match answer {
                    Answer::Holding { .. } => {
                        w.say(|| "; it completes its own task".to_owned());
                        Self::spawn(s, Who::Exec, l.task, Step::SelfWake);
                    }
                    Answer::InLine => {
                        w.say(|| " => exec stays parked".to_owned());
                    }
                    Answer::Fenced => {
                        if current && s.bad.is_none() {
                            s.bad = Some(Bad::Refused { who: Who::Exec });
                        }
                        w.say(|| " => SemaphoreFenced".to_owned());
                        if current {
                            s.exec.stage = ExecStage::Ended;
                            s.event = true;
                            w.say(|| ": exec fails; its cleanup event is emitted".to_owned());
                        }
                    }
                    Answer::Expired => {
                        w.say(|| " => SemaphoreExpired".to_owned());
                        if current {
                            s.exec.token += 1;
                            let token = s.exec.token;
                            s.exec.place = Some(s.asks);
                            s.asks += 1;
                            w.say(|| format!("; its Catch enters the state again (task {token})"));
                            let (task, at) = (Task::Acquire { token }, s.now);
                            let step = self.start_flow(s, Who::Exec, task, at);
                            Self::spawn(s, Who::Exec, task, step);
                        }
                    }
                }
            }
            other => unreachable!("{other:?} does not answer"),
        }
    }

    /// The acquire request of `who`'s invocation of `task`, as the acquire function's payload
    /// reader makes it (and `Request::at` for a poll decided at tick `at`).
    fn flow_request(&self, s: &PollState, who: Who, task: Task, at: u8) -> FlowRequest {
        let (place, attempt, waiting) = match (who, task) {
            (Who::Poller, Task::Poll { n }) => (
                s.poller.place.expect("it asked"),
                n,
                Waiting::Polls {
                    poll_ms: u64::from(self.config.poll_ticks) * TICK_MS,
                },
            ),
            (Who::Exec, Task::Acquire { token }) => (
                s.exec.place.expect("it asked"),
                token,
                Waiting::Parked(task_token(token)),
            ),
            other => unreachable!("{other:?} does not acquire"),
        };
        let asked = Self::place_ms(place);
        FlowRequest {
            lock: self.lock.clone(),
            terms: self.terms(who),
            identity: self.id(who).clone(),
            run: Run::FIRST,
            requested_at_ms: asked,
            asked_at_ms: asked,
            attempt: Attempt(u64::from(attempt)),
            waiting,
            work: None,
        }
        .at(Self::clock(who, at))
    }

    /// The acquire flow of `who`'s invocation of `task`, begun at tick `at` (broken as the
    /// variant says), at its first call.
    fn start_flow(&self, s: &PollState, who: Who, task: Task, at: u8) -> Step {
        // No wait here is long enough to pass a budget.
        let budget = Budget {
            max_wait: Duration::from_secs(u64::from(u32::MAX)),
            max_checks: u64::MAX,
        };
        let (flow, call) = AcquireFlow::start(self.flow_request(s, who, task, at), budget);
        let flow = match (self.variant, who) {
            (PollVariant::PollKeepsOldTime, Who::Poller) => flow.broken(Broken::PollKeepsOldTime),
            _ => flow,
        };
        Step::Flow {
            id: self.intern_flow(flow, call),
            at,
        }
    }

    fn intern_flow(&self, flow: AcquireFlow, call: Call) -> u32 {
        Interner::intern(&self.flows, (flow, call), |key| Rc::new(key.clone()))
    }

    /// Interned flow `id` and the call it makes next.
    fn flow(&self, id: u32) -> Rc<FlowAt> {
        self.flows.borrow().get(id).clone()
    }

    /// The tick at which `who`'s record `waiter` was built: when its poll window began.
    fn built_at(&self, who: Who, waiter: &Waiter) -> u8 {
        match &waiter.wakeup {
            Wakeup::Poll { until_ms } => {
                let from = until_ms - u64::from(self.config.poll_ticks) * TICK_MS;
                u8::try_from((from - Self::clock(who, 0)) / TICK_MS).expect("a tick")
            }
            Wakeup::Task(_) => 0,
        }
    }

    /// The flow of `l` goes on from `reply`, got at tick `now`: its next call, decided now,
    /// or its answer.
    fn resume(&self, s: &mut PollState, l: Lambda, id: u32, reply: Reply, w: &mut Words) {
        let mut flow = self.flow(id).0.clone();
        let now = s.now;
        match flow.resume(reply, Self::clock(l.who, now)) {
            Next::Call(Call::HandOff) => {
                w.say(|| "; it hands off: it reads the lock".to_owned());
                self.next(s, l, Some(Step::Hand(Hand::ReadLock)), w);
            }
            Next::Call(call) => {
                w.say(|| Self::describe_call(&flow, &call));
                let step = Step::Flow {
                    id: self.intern_flow(flow, call),
                    at: now,
                };
                self.next(s, l, Some(step), w);
            }
            Next::Done(done) => {
                let answer = match done {
                    Ok(done) => match done.taken {
                        Taken::Holding { taken, .. } => Answer::Holding { taken },
                        Taken::InLine { .. } => Answer::InLine,
                        Taken::Superseded => {
                            w.say(|| ": a later attempt's; its own is over".to_owned());
                            Answer::InLine
                        }
                    },
                    Err(Refusal::Fenced(_)) => Answer::Fenced,
                    Err(Refusal::Expired(_)) => {
                        w.say(|| "; it gives up queueing".to_owned());
                        Answer::Expired
                    }
                    Err(other) => unreachable!("{other:?}: no wait passes its budget here"),
                };
                self.answer(s, l, answer, w);
            }
        }
    }

    /// What the flow does next, in words.
    fn describe_call(flow: &AcquireFlow, call: &Call) -> String {
        match call {
            Call::Acquire { .. } if flow.queue_round().is_some() => "; it acquires directly",
            Call::Acquire { .. } => "; it acquires again",
            Call::ReadWaiter => "; it reads its record in line",
            Call::Enqueue(_) if flow.queue_round() > Some(1) => "; it queues again",
            Call::Enqueue(_) => "; it queues",
            Call::Leave => "; it takes itself out of line",
            Call::Repark(_) => "; it keeps its place, renewed",
            Call::HandOff => "; it hands off: it reads the lock",
        }
        .to_owned()
    }

    /// Makes call `call` of `l`'s flow `id`, decided at tick `at`, as the semaphore would (one
    /// request), and hands the flow its reply.
    fn run_flow(&self, s: &mut PollState, l: Lambda, id: u32, at: u8, w: &mut Words) {
        let who = l.who;
        let flow = self.flow(id);
        let (flow, call) = (&flow.0, &flow.1);
        let request = flow.request();
        let reply = match call {
            Call::Acquire { terms } => {
                let write = protocol::acquire(
                    &self.lock,
                    self.id(who),
                    Run::FIRST,
                    None,
                    *terms,
                    request.requested_at_ms,
                    Self::clock(who, at),
                    &TIMING,
                )
                .expect("no request expires here");
                let result = self.send(s, who, &write, w);
                let seen = s.table;
                let outcome = read(protocol::acquired(&write, self.id(who), self.limit, result));
                w.say(|| format!(" => {outcome:?}"));
                if let AcquireOutcome::Full { .. } = outcome {
                    // `acquire_seeing`: leases that passed, taken back, then again.
                    let now = s.now;
                    if self.take_back_write(seen, who, now).is_some() {
                        w.say(|| "; it takes back the leases that passed".to_owned());
                        let step = Step::TakeBack {
                            seen,
                            at: now,
                            then: After::Flow(id),
                        };
                        return self.next(s, l, Some(step), w);
                    }
                }
                Reply::Acquired {
                    outcome,
                    // What the acquire saw tells only a configured lock's terms, and this lock
                    // is not configured.
                    seen: None,
                }
            }
            Call::ReadWaiter => {
                let t = self.table(s.table);
                let record = t
                    .line
                    .values()
                    .find(|r| r.id() == self.waiter_ids[who as usize])
                    .cloned();
                w.say(|| match &record {
                    None => "reads its record: not in line".to_owned(),
                    Some(r) => format!("reads its record: {}", Self::show_waiter(r)),
                });
                Reply::Waiter(record)
            }
            Call::Enqueue(waiter) => {
                let write = protocol::enqueue(
                    waiter,
                    None,
                    request.requested_at_ms,
                    Self::clock(who, at),
                    &TIMING,
                )
                .expect("no request expires here");
                let result = self.send(s, who, &write, w);
                let outcome = read(protocol::queued(&write, self.id(who), result));
                w.say(|| format!(" => {outcome:?}"));
                if outcome == QueueOutcome::Queued {
                    self.renewed(s, who, self.built_at(who, waiter), w);
                }
                Reply::Queued(outcome)
            }
            Call::Repark(wakeup) => {
                let write = protocol::repark(
                    &self.lock,
                    self.waiter_ids[who as usize],
                    wakeup.clone(),
                    request.attempt,
                );
                let result = self.send(s, who, &write, w);
                let kept = read(protocol::was_queued(&write, &result));
                if kept {
                    self.renewed(s, who, at, w);
                    w.say(|| " => kept".to_owned());
                } else {
                    w.say(|| " => not in line any more".to_owned());
                }
                Reply::InLine(kept)
            }
            Call::Leave | Call::HandOff => {
                unreachable!("no budget passes here, and a hand-off is the Lambda's own steps")
            }
        };
        self.resume(s, l, id, reply, w);
    }

    /// One step of invocation `l`, which the caller has taken out of `s.lambdas`.
    fn step(&self, s: &mut PollState, l: Lambda, w: &mut Words) {
        let who = l.who;
        w.say(|| format!("{}: ", self.lambda_name(s, &l)));
        match l.step {
            Step::Flow { id, at } => self.run_flow(s, l, id, at, w),
            Step::TakeBack { seen, at, then } => {
                let write = self
                    .take_back_write(seen, who, at)
                    .expect("decided on leases that passed");
                let result = self.send(s, who, &write, w);
                let taken = matches!(result, WriteResult::Applied { .. });
                if !taken {
                    if let Some(current) = result.refused_item() {
                        if protocol::take_back_again(&write, current, Self::clock(who, at), TICK_MS)
                            .is_some()
                        {
                            w.say(|| "; it takes back what is still to take".to_owned());
                            let seen = s.table;
                            return self.next(s, l, Some(Step::TakeBack { seen, at, then }), w);
                        }
                    }
                }
                match then {
                    After::Flow(id) if taken => {
                        w.say(|| "; it acquires again".to_owned());
                        let now = s.now;
                        self.next(s, l, Some(Step::Flow { id, at: now }), w);
                    }
                    After::Flow(id) => {
                        // Nothing taken back: the acquire stands as "full".
                        let current = self.table(s.table);
                        let item = current.item.as_ref().expect("the lock was read");
                        let outcome = AcquireOutcome::Full {
                            count: item.count(),
                            used: item.used,
                            limit: self.limit,
                        };
                        let reply = Reply::Acquired {
                            outcome,
                            seen: None,
                        };
                        self.resume(s, l, id, reply, w);
                    }
                    After::HandOn if taken => {
                        let step = self.hand_on(s.table, w);
                        self.next(s, l, step, w);
                    }
                    After::HandOn => {
                        w.say(|| "; nothing taken back: the hand-off is done".to_owned());
                        self.next(s, l, None, w);
                    }
                }
            }
            Step::SelfWake => {
                let Task::Acquire { token } = l.task else {
                    unreachable!("only exec wakes itself")
                };
                if s.exec.stage == ExecStage::Waiting && s.exec.token == token {
                    s.exec.stage = ExecStage::Working;
                    w.say(|| format!("SendTaskSuccess (task {token}) => exec does its work"));
                } else {
                    w.say(|| format!("SendTaskSuccess (task {token}) fails: no such task waits"));
                }
            }
            Step::Release { unheld, round } => {
                let id = self.id(who).clone();
                let write = if unheld {
                    protocol::release_unheld(&self.lock, &id, NOW_MS)
                } else {
                    let held = shown(self.table(s.table).item.as_ref(), &id, Weight::ONE);
                    protocol::release(&self.lock, &id, held.token, held.weight, NOW_MS)
                };
                let result = self.send(s, who, &write, w);
                match read(protocol::released(&write, &id, claim_of(&write), result)) {
                    semaphore_core::Step::Done((outcome, after)) => {
                        w.say(|| format!(" => {outcome:?}"));
                        let step = if after.waiting > 0 {
                            w.say(|| "; someone waits: it hands off".to_owned());
                            Some(Step::Hand(Hand::ReadHead { seen: s.table }))
                        } else {
                            None
                        };
                        self.next(s, l, step, w);
                    }
                    semaphore_core::Step::Again(next) => {
                        let unheld = next
                            .checks
                            .iter()
                            .any(|c| matches!(c, semaphore_core::Check::NotHolding(_)));
                        let step = self
                            .round_again(s, who, round, w)
                            .map(|round| Step::Release { unheld, round });
                        self.next(s, l, step, w);
                    }
                }
            }
            Step::Fence => {
                let slots = self.fence(s, w);
                w.say(|| "; it takes exec out of line if it is there".to_owned());
                self.next(s, l, Some(Step::Leave { slots }), w);
            }
            Step::Leave { slots } => {
                let write = protocol::leave(&self.lock, self.waiter_ids[Who::Exec as usize]);
                let result = self.send(s, who, &write, w);
                let was = read(protocol::was_queued(&write, &result));
                w.say(|| format!(" => {}", if was { "left" } else { "was not in line" }));
                self.next(s, l, slots.then_some(Step::Free { round: 0 }), w);
            }
            Step::Free { round } => {
                let step = match self.free(s, round, w) {
                    Ok(hand) => hand.then(|| {
                        w.say(|| "; someone waits: it hands off: it reads the lock".to_owned());
                        Step::Hand(Hand::ReadLock)
                    }),
                    Err(round) => round.map(|round| Step::Free { round }),
                };
                self.next(s, l, step, w);
            }
            Step::Hand(hand) => self.hand_step(s, l, hand, w),
        }
    }

    /// The next write of a release or free refused `round + 1` times, or `None` when the core
    /// gives up (L1).
    fn round_again(&self, s: &mut PollState, who: Who, round: u8, w: &mut Words) -> Option<u8> {
        if round + 1 >= MAX_ROUNDS {
            if s.bad.is_none() {
                s.bad = Some(Bad::Rounds { who });
            }
            w.say(|| format!("; refused {MAX_ROUNDS} times: the core gives up"));
            return None;
        }
        w.say(|| "; the item handed back calls for another write".to_owned());
        Some(round + 1)
    }

    /// The fence of the parked execution's run lands: whether it saw a slot.
    fn fence(&self, s: &mut PollState, w: &mut Words) -> bool {
        let holder = self.id(Who::Exec).holder.clone();
        let write = protocol::cleanup_fence(&self.lock, &holder, Run::FIRST);
        let result = self.send(s, Who::Exec, &write, w);
        let slots = !read(protocol::fenced_slots(&write, &holder, result))
            .0
            .is_empty();
        w.say(|| format!(" => it saw {}", if slots { "a slot" } else { "no slot" }));
        slots
    }

    /// The free of the slot the fence saw: whether to hand off (it freed it and someone waits),
    /// or the next round.
    fn free(&self, s: &mut PollState, round: u8, w: &mut Words) -> Result<bool, Option<u8>> {
        let id = self.id(Who::Exec).clone();
        let held = shown(self.table(s.table).item.as_ref(), &id, Weight::ONE);
        let write = protocol::cleanup_free(&self.lock, &[(id, held)]);
        let result = self.send(s, Who::Exec, &write, w);
        match read(protocol::freed(&write, result)) {
            semaphore_core::Step::Done((outcome, after)) => {
                w.say(|| format!(" => freed {}", outcome.freed.len()));
                Ok(!outcome.freed.is_empty() && after.waiting > 0)
            }
            semaphore_core::Step::Again(_) => Err(self.round_again(s, Who::Exec, round, w)),
        }
    }

    /// The hand-off's loop, on the lock as last read (`seen`).
    fn hand_on(&self, seen: u32, w: &mut Words) -> Option<Step> {
        if self.table(seen).waiting() == 0 {
            w.say(|| "; nobody waits: the hand-off is done".to_owned());
            return None;
        }
        w.say(|| "; it reads the head of the line".to_owned());
        Some(Step::Hand(Hand::ReadHead { seen }))
    }

    /// The hand-off has read `head`'s record (the head of table `head`) on the lock as read
    /// (`seen`), and asked whether it stopped polling (`judge`): what it does next, decided now.
    fn decide(
        &self,
        s: &PollState,
        who: Who,
        seen: u32,
        head: u32,
        judge: bool,
        w: &mut Words,
    ) -> Option<Step> {
        let h = self.table(head);
        let record = h.head().expect("a head was read");
        let now = s.now;
        if judge
            && self.variant != PollVariant::HandOffGrantsStoppedPoller
            && self.judged_stopped(who, record, now)
        {
            w.say(|| "; it stopped polling: it takes it out of line".to_owned());
            return Some(Step::Hand(Hand::LeaveStopped {
                seen,
                head,
                at: now,
            }));
        }
        let t = self.table(seen);
        let item = t.item.as_ref().expect("the lock was read");
        if !item.fits(&record.terms) {
            if self.take_back_write(seen, who, now).is_some() {
                w.say(|| "; it does not fit: it takes back the leases that passed".to_owned());
                return Some(Step::TakeBack {
                    seen,
                    at: now,
                    then: After::HandOn,
                });
            }
            w.say(|| "; it does not fit: done".to_owned());
            return None;
        }
        w.say(|| "; it grants it a slot".to_owned());
        Some(Step::Hand(Hand::Grant {
            head,
            at: now,
            line_at_read: h.in_line,
        }))
    }

    /// One request of a hand-off (see `Semaphore::hand_off`).
    fn hand_step(&self, s: &mut PollState, mut l: Lambda, hand: Hand, w: &mut Words) {
        let who = l.who;
        let step = match hand {
            Hand::ReadLock => {
                w.say(|| format!("reads the lock: {}", self.show(s.table)));
                match self.table(s.table).item {
                    None => None,
                    Some(_) => self.hand_on(s.table, w),
                }
            }
            Hand::ReadHead { seen } => {
                let t = self.table(s.table);
                match t.head() {
                    None => {
                        w.say(|| "reads the head: nobody in line: done".to_owned());
                        None
                    }
                    Some(head) => {
                        w.say(|| format!("reads the head: {}", Self::show_waiter(head)));
                        self.decide(s, who, seen, s.table, true, w)
                    }
                }
            }
            Hand::LeaveStopped { seen, head, at } => {
                let h = self.table(head);
                let record = h.head().expect("a head was read").clone();
                let write = match self.variant {
                    PollVariant::LeaveStoppedWithoutRecordCheck => {
                        protocol::leave(&self.lock, record.id())
                    }
                    _ => protocol::leave_stopped(&record),
                };
                let before = self.table(s.table);
                let result = self.send(s, who, &write, w);
                if !matches!(result, WriteResult::Refused { .. }) && s.bad.is_none() {
                    // The record it removed, as it was when the removal landed.
                    let removed = before.line.values().find(|r| r.id() == record.id());
                    if removed.is_some_and(|r| !r.stopped_polling(Self::clock(who, at), TICK_MS)) {
                        s.bad = Some(Bad::RemovedAlive);
                    }
                }
                if read(protocol::was_queued(&write, &result)) {
                    w.say(|| " => out of line; it reads the lock".to_owned());
                    Some(Step::Hand(Hand::ReadLock))
                } else {
                    w.say(|| " => not as judged any more".to_owned());
                    self.decide(s, who, seen, head, false, w)
                }
            }
            Hand::Grant {
                head,
                at,
                line_at_read,
            } => {
                let h = self.table(head);
                let record = h.head().expect("a head was read").clone();
                let granted = Self::who_of(&record.identity);
                let mut write = protocol::grant(&record, None, &record.terms, Self::clock(who, at));
                if self.variant == PollVariant::GrantWithoutLease {
                    write
                        .changes
                        .retain(|c| !matches!(c, Change::SetLease { .. }));
                }
                let before = self.table(s.table);
                let result = self.send(s, granted, &write, w);
                let landed = !matches!(result, WriteResult::Refused { .. });
                if landed && s.bad.is_none() {
                    let place = |x: Who| {
                        before
                            .line
                            .values()
                            .find(|r| Self::who_of(&r.identity) == x)
                            .map(|r| r.key)
                    };
                    let ahead = [Who::Poller, Who::Exec]
                        .into_iter()
                        .filter(|&x| {
                            before.in_line & line_at_read & x.bit() != 0
                                && place(x) < place(granted)
                        })
                        .fold(0, |m, x| m | x.bit());
                    if ahead != 0 {
                        s.bad = Some(Bad::OutOfOrder {
                            who: granted,
                            ahead,
                        });
                    } else if record.stopped_polling(Self::clock(who, at), TICK_MS) {
                        s.bad = Some(Bad::GrantedStopped);
                    }
                }
                match read(protocol::granted(&write, result)) {
                    Grant::Granted => {
                        w.say(|| " => granted; it reads the lock".to_owned());
                        let token = record.task_token().map_or(0, token_number);
                        Some(Step::Hand(Hand::ReadGranted {
                            head: granted,
                            token,
                        }))
                    }
                    Grant::Moved { .. } => {
                        w.say(|| " => moved".to_owned());
                        self.hand_on(s.table, w)
                    }
                    Grant::Dead { .. } | Grant::Holding { .. } => {
                        w.say(|| format!("; it takes {} out of line", granted.name()));
                        Some(Step::Hand(Hand::Leave { head: granted }))
                    }
                    Grant::NoSlot { .. } => {
                        w.say(|| " => no slot: done".to_owned());
                        None
                    }
                    Grant::TooSoon { .. } => unreachable!("no rate here"),
                }
            }
            Hand::ReadGranted { head, token } => {
                let t = self.table(s.table);
                w.say(|| format!("reads the lock: {}", self.show(s.table)));
                if t.holders & head.bit() == 0 {
                    w.say(|| format!("; {} holds nothing any more", head.name()));
                    self.hand_on(s.table, w)
                } else if head == Who::Poller {
                    // A poller has nothing to wake: it finds its slot at its next poll.
                    w.say(|| "; poller has nothing to wake".to_owned());
                    l.granted_poller = true;
                    self.hand_on(s.table, w)
                } else {
                    w.say(|| "; it wakes exec".to_owned());
                    Some(Step::Hand(Hand::Wake {
                        seen: s.table,
                        token,
                    }))
                }
            }
            Hand::Wake { seen, token } => {
                if s.exec.stage == ExecStage::Waiting && s.exec.token == token {
                    s.exec.stage = ExecStage::Working;
                    w.say(|| {
                        format!("SendTaskSuccess to exec (task {token}) => exec does its work")
                    });
                    self.hand_on(seen, w)
                } else {
                    w.say(|| {
                        format!(
                            "SendTaskSuccess to exec (task {token}) fails; DescribeExecution next"
                        )
                    });
                    Some(Step::Hand(Hand::Describe { seen }))
                }
            }
            Hand::Describe { seen } => {
                if s.exec.alive() {
                    w.say(|| "DescribeExecution: exec is RUNNING: it keeps the slot".to_owned());
                    self.hand_on(seen, w)
                } else {
                    w.say(|| "DescribeExecution: exec has ended: it cleans up its run".to_owned());
                    Some(Step::Hand(Hand::Fence))
                }
            }
            Hand::Fence => {
                if self.fence(s, w) {
                    Some(Step::Hand(Hand::Free { round: 0 }))
                } else {
                    Some(Step::Hand(Hand::ReadLock))
                }
            }
            Hand::Free { round } => match self.free(s, round, w) {
                Ok(_) => {
                    w.say(|| "; it reads the lock".to_owned());
                    Some(Step::Hand(Hand::ReadLock))
                }
                Err(round) => round.map(|round| Step::Hand(Hand::Free { round })),
            },
            Hand::Leave { head } => {
                let write = protocol::leave(&self.lock, self.waiter_ids[head as usize]);
                self.send(s, who, &write, w);
                w.say(|| "; it reads the lock".to_owned());
                Some(Step::Hand(Hand::ReadLock))
            }
        };
        self.next(s, l, step, w);
    }

    // ---- the world's own steps ----

    /// The poller sends a poll (its first ask, or a later poll).
    fn poll(&self, s: &mut PollState, w: &mut Words) {
        let p = &mut s.poller;
        if p.place.is_none() {
            p.place = Some(s.asks);
            s.asks += 1;
        }
        let n = p.n;
        p.prev = (n > 0).then_some(p.sent);
        p.sent = s.now;
        p.n += 1;
        p.stage = PollerStage::Polling;
        w.say(|| {
            format!(
                "poller {} (poll {n}, RetryCount {n}): its acquire function acquires",
                if n == 0 { "asks" } else { "polls again" }
            )
        });
        let (task, at) = (Task::Poll { n }, s.now);
        let step = self.start_flow(s, Who::Poller, task, at);
        Self::spawn(s, Who::Poller, task, step);
    }

    /// A record of `who` built at tick `at` landed (queued or renewed): a poller's place is
    /// kept until a poll window after it, and a poller whose record lands with its time run
    /// out already did not poll in time (its request was too slow for its window).
    fn renewed(&self, s: &mut PollState, who: Who, at: u8, w: &mut Words) {
        let p = &mut s.poller;
        if who != Who::Poller || !p.alive() {
            return;
        }
        let due = at + self.config.poll_ticks;
        p.due = Some(due);
        if due < s.now && !p.late {
            p.late = true;
            w.say(|| " (with its time run out: poller is late from now on)".to_owned());
        }
    }

    /// The clock moves on by a tick; a live poller waiting for its slot whose place ran out
    /// unrenewed is late from now on.
    fn tick(&self, s: &mut PollState, w: &mut Words) {
        let p = &mut s.poller;
        if p.alive() && p.waiting() && p.due.is_some_and(|due| due <= s.now) && !p.late {
            p.late = true;
            w.say(|| "; poller missed its poll window (it is late from now on)".to_owned());
        }
        s.now += 1;
    }

    fn stable(&self, s: &PollState) -> bool {
        s.lambdas.is_empty()
            && !s.event
            && s.holder == HolderStage::Done
            && matches!(
                s.poller.stage,
                PollerStage::Between
                    | PollerStage::Done
                    | PollerStage::Refused
                    | PollerStage::Stopped
            )
            && matches!(
                s.exec.stage,
                ExecStage::Waiting | ExecStage::Succeeded | ExecStage::Ended
            )
    }

    fn finish_work(s: &mut PollState, who: Who, w: &mut Words) {
        w.say(|| format!("{} finishes its work and releases", who.name()));
        match who {
            Who::Poller => s.poller.stage = PollerStage::Releasing,
            Who::Exec => s.exec.stage = ExecStage::Releasing,
            _ => s.holder = HolderStage::Releasing,
        }
        Self::spawn(
            s,
            who,
            Task::Release,
            Step::Release {
                unheld: false,
                round: 0,
            },
        );
    }

    fn deliver(s: &mut PollState, w: &mut Words) {
        s.event = false;
        w.say(|| "the cleanup event for exec is delivered".to_owned());
        Self::spawn(s, Who::Exec, Task::Cleanup, Step::Fence);
    }

    // ---- properties ----

    fn safety(&self, s: &PollState) -> Result<(), Violation> {
        let t = self.table(s.table);
        let violation = |property, detail: String| {
            Err(Violation {
                property,
                detail: format!("{detail}: {}", self.show(s.table)),
            })
        };
        if let Some(item) = &t.item {
            let held = item.weight_held();
            if held > 1 || item.used != held {
                return violation("S1", format!("{held} held, {} used, limit 1", item.used));
            }
            if item.waiting != t.line.len() as u64 {
                return violation(
                    "S1",
                    format!("{} waiting, {} records in line", item.waiting, t.line.len()),
                );
            }
            if let Some(orphan) = item
                .leases
                .keys()
                .find(|id| !item.holders.contains_key(*id))
            {
                return violation(
                    "S1",
                    format!("a lease of {}, which holds no slot", orphan.holder),
                );
            }
            if t.holders & Who::Poller.bit() != 0 && !item.leases.contains_key(self.id(Who::Poller))
            {
                return violation(
                    "S2",
                    "poller holds a slot without a lease: if it stops, nobody can free it"
                        .to_owned(),
                );
            }
        }
        let mut working = Vec::new();
        if s.holder == HolderStage::Holding {
            working.push("holder");
        }
        if s.exec.stage == ExecStage::Working {
            working.push("exec");
            if t.holders & Who::Exec.bit() == 0 {
                return violation("S1", "exec works without holding a slot".to_owned());
            }
        }
        if let PollerStage::Working { until } = s.poller.stage {
            if s.now <= until {
                working.push("poller (its lease running, by its clock)");
            }
        }
        if working.len() > 1 {
            return violation(
                "S1",
                format!("{} work at once, limit 1", working.join(" and ")),
            );
        }
        Ok(())
    }

    fn bad(&self, s: &PollState, bad: Bad) -> Violation {
        let table = self.show(s.table);
        let (property, detail) = match bad {
            Bad::Resurrected { who, what } => (
                "S3",
                format!(
                    "a {what} of {} landed after its release, take-back or fence had",
                    who.name()
                ),
            ),
            Bad::PassedTheLine { who } => (
                "L2",
                format!(
                    "an acquire of {} landed while others waited in line",
                    who.name()
                ),
            ),
            Bad::OutOfOrder { who, ahead } => (
                "L2",
                format!(
                    "a grant to {} landed while {} was ahead of it in line, in line already when \
                     the hand-off read the head",
                    who.name(),
                    [Who::Poller, Who::Exec]
                        .into_iter()
                        .filter(|x| ahead & x.bit() != 0)
                        .map(Who::name)
                        .collect::<Vec<_>>()
                        .join(" and ")
                ),
            ),
            Bad::LostPlace { who } => (
                "L2",
                format!(
                    "{} was taken out of line without a grant while {}",
                    who.name(),
                    if who == Who::Poller {
                        "it polled in time"
                    } else {
                        "it ran"
                    }
                ),
            ),
            Bad::RemovedAlive => (
                "L2",
                "poller's record was taken out of line as stopped though, as it was when the \
                 removal landed, its time had not run out more than the clock skew before by the \
                 remover's clock (a poll renewed it since it was judged, or it was judged without \
                 the skew)"
                    .to_owned(),
            ),
            Bad::GrantedStopped => (
                "F8",
                "poller was granted a slot though its record's time had run out more than the \
                 clock skew before, by the granting hand-off's clock: a waiter gone as far as \
                 anyone can tell holds the slot until its lease passes, ahead of those behind it"
                    .to_owned(),
            ),
            Bad::Refused { who } => (
                "L1",
                format!(
                    "{} was answered \"fenced\" while it ran in time",
                    who.name()
                ),
            ),
            Bad::Rounds { who } => (
                "L1",
                format!(
                    "a release or free of {} was refused {MAX_ROUNDS} times",
                    who.name()
                ),
            ),
        };
        Violation {
            property,
            detail: format!("{detail}: {table}"),
        }
    }

    /// The first step there is with no faults and no tick, taken in `s`; `false` if none.
    fn first_step(&self, s: &mut PollState, w: &mut Words) -> bool {
        if !s.lambdas.is_empty() {
            let l = s.lambdas.remove(0);
            self.step(s, l, w);
        } else if matches!(s.poller.stage, PollerStage::Working { .. }) {
            Self::finish_work(s, Who::Poller, w);
        } else if s.exec.stage == ExecStage::Working {
            Self::finish_work(s, Who::Exec, w);
        } else if s.holder == HolderStage::Holding {
            Self::finish_work(s, Who::Holder, w);
        } else if s.event {
            Self::deliver(s, w);
        } else {
            return false;
        }
        true
    }

    /// Runs `s` with no faults, taking the first step there is, until it is stable.
    fn settle(&self, s: &mut PollState, log: &mut Option<String>) -> Result<(), String> {
        for _ in 0..10_000 {
            if self.stable(s) {
                return Ok(());
            }
            let mut w = Words::new(log.is_some());
            if !self.first_step(s, &mut w) {
                return Err("nothing can happen, yet it is not stable".to_owned());
            }
            if let Some(log) = log {
                log.push_str(&format!("\n   - {}", w.into_string()));
            }
            if let Some(bad) = s.bad {
                let v = self.bad(s, bad);
                return Err(format!("{} violated: {}", v.property, v.detail));
            }
            self.safety(s)
                .map_err(|v| format!("{} violated: {}", v.property, v.detail))?;
        }
        Err("it does not settle in 10,000 steps".to_owned())
    }

    /// The sweeper, at its clock: it takes back the leases that passed, takes out of line the
    /// pollers that stopped and the ended executions, then hands off.
    fn sweep(&self, t: &mut PollState, log: &mut Option<String>) -> Result<(), String> {
        let mut w = Words::new(log.is_some());
        w.say(|| "the sweeper: ".to_owned());
        let now = t.now;
        let mut seen = t.table;
        while let Some(write) = self.take_back_write(seen, Who::Sweeper, now) {
            let result = self.send(t, Who::Sweeper, &write, &mut w);
            if matches!(result, WriteResult::Applied { .. }) {
                break;
            }
            seen = t.table;
        }
        let line: Vec<Waiter> = self.table(t.table).line.values().cloned().collect();
        for waiter in line {
            let write = match waiter.wakeup {
                Wakeup::Poll { .. } if self.judged_stopped(Who::Sweeper, &waiter, now) => {
                    match self.variant {
                        PollVariant::LeaveStoppedWithoutRecordCheck => {
                            protocol::leave(&self.lock, waiter.id())
                        }
                        _ => protocol::leave_stopped(&waiter),
                    }
                }
                Wakeup::Task(_) if !t.exec.alive() => protocol::leave(&self.lock, waiter.id()),
                _ => continue,
            };
            w.say(|| "; ".to_owned());
            self.send(t, Who::Sweeper, &write, &mut w);
        }
        if let Some(log) = log {
            log.push_str(&format!("\n   - {}", w.into_string()));
        }
        Self::spawn(t, Who::Sweeper, Task::Sweep, Step::Hand(Hand::ReadLock));
        self.settle(t, log)
    }

    /// Who lives and has not finished.
    fn unfinished(&self, s: &PollState) -> Vec<&'static str> {
        let mut names = Vec::new();
        if s.poller.alive() {
            names.push("poller");
        }
        if s.exec.alive() {
            names.push("exec");
        }
        names
    }

    /// From quiet state `s`: time passes beyond every lease and poll window, a live poller
    /// polls at once, the sweeper runs, and everything runs to completion, a few rounds.
    fn heal(&self, s: &PollState, log: &mut Option<String>) -> Result<(), String> {
        let mut t = s.clone();
        let beyond = self.config.lease_ticks + self.config.poll_ticks + 2;
        for round in 1..=4 {
            if let Some(log) = log {
                log.push_str(&format!("\n  round {round}: {beyond} ticks pass"));
            }
            t.now = t.now.saturating_add(beyond);
            if t.poller.stage == PollerStage::Between {
                let mut w = Words::new(log.is_some());
                self.poll(&mut t, &mut w);
                if let Some(log) = log {
                    log.push_str(&format!("\n   - {}", w.into_string()));
                }
                self.settle(&mut t, log)?;
            }
            self.sweep(&mut t, log)?;
            let table = self.table(t.table);
            if t.poller.stage == PollerStage::Stopped
                && (table.holders | table.in_line) & Who::Poller.bit() != 0
            {
                return Err(format!(
                    "S2: poller stopped polling, and a sweep after its lease and its poll window \
                     leaves it {}: {}",
                    if table.holders & Who::Poller.bit() != 0 {
                        "holding a slot"
                    } else {
                        "in line"
                    },
                    self.show(t.table)
                ));
            }
            if self.unfinished(&t).is_empty() {
                return Ok(());
            }
        }
        Err(format!(
            "L1: {} never finish: {}",
            self.unfinished(&t).join(" and "),
            self.show(t.table)
        ))
    }

    /// The properties of a quiet state.
    fn settled(&self, s: &PollState) -> Result<(), Violation> {
        let t = self.table(s.table);
        if s.exec.stage == ExecStage::Waiting
            && t.head()
                .is_some_and(|h| Self::who_of(&h.identity) == Who::Exec)
            && t.used() == 0
        {
            return Err(Violation {
                property: "F8",
                detail: format!(
                    "exec is parked at the head of the line while the slot is free: {}",
                    self.show(s.table)
                ),
            });
        }
        if self.heal(s, &mut None).is_err() {
            let mut log = Some(String::new());
            let why = self
                .heal(s, &mut log)
                .expect_err("the same run fails the same way");
            let property = if why.starts_with("S2") { "S2" } else { "L1" };
            return Err(Violation {
                property,
                detail: format!("{why}\n  what happens:{}", log.unwrap_or_default()),
            });
        }
        Ok(())
    }

    /// Feeds an invocation's step with what it will read of the tables it read (not their
    /// numbers, nor all of them), and without the moments of decisions that do not depend on
    /// them (the parked execution's writes do not depend on its clock: no lease, no rate, no
    /// request expires).
    fn identify_step(&self, l: &Lambda, h: &mut Fingerprint) {
        let seen = |id: u32, h: &mut Fingerprint| self.table(id).seen.hash(h);
        let head = |id: u32, h: &mut Fingerprint| self.table(id).head.hash(h);
        let waits = |id: u32, h: &mut Fingerprint| (self.table(id).waiting() > 0).hash(h);
        let timeless = l.who == Who::Exec;
        let cleared = match l.step {
            Step::Flow { id, .. } if timeless => Step::Flow { id, at: 0 },
            Step::TakeBack { seen: id, at, then } => {
                if let Some(item) = &self.table(id).item {
                    Self::hash_leases(item, h);
                }
                Step::TakeBack { seen: 0, at, then }
            }
            Step::Hand(hand) => Step::Hand(match hand {
                Hand::ReadHead { seen: id } => {
                    seen(id, h);
                    Hand::ReadHead { seen: 0 }
                }
                Hand::LeaveStopped {
                    seen: id,
                    head: of,
                    at,
                } => {
                    seen(id, h);
                    head(of, h);
                    Hand::LeaveStopped {
                        seen: 0,
                        head: 0,
                        at,
                    }
                }
                Hand::Grant {
                    head: of,
                    at,
                    line_at_read,
                } => {
                    head(of, h);
                    let parked = self
                        .table(of)
                        .head()
                        .is_some_and(|r| r.task_token().is_some());
                    Hand::Grant {
                        head: 0,
                        at: if parked { 0 } else { at },
                        line_at_read,
                    }
                }
                Hand::Wake { seen: id, token } => {
                    waits(id, h);
                    Hand::Wake { seen: 0, token }
                }
                Hand::Describe { seen: id } => {
                    waits(id, h);
                    Hand::Describe { seen: 0 }
                }
                other => other,
            }),
            other => other,
        };
        cleared.hash(h);
    }

    /// Feeds the leases of `item`, with the weights of their slots: what a take-back reads.
    fn hash_leases(item: &SemaphoreItem, h: &mut Fingerprint) {
        for (identity, until) in &item.leases {
            (
                identity,
                until,
                item.holders.get(identity).map(|h| h.weight),
            )
                .hash(h);
        }
    }
}

impl Model for PollWorld {
    type State = PollState;

    fn initial(&self) -> PollState {
        let holds = protocol::acquire(
            &self.lock,
            self.id(Who::Holder),
            Run::FIRST,
            None,
            self.terms(Who::Holder),
            NOW_MS,
            NOW_MS,
            &TIMING,
        )
        .expect("in time")
        .apply(None)
        .expect("the first acquire lands");
        PollState {
            table: self.intern(Some(holds), BTreeMap::new()),
            now: 0,
            poller: Poller {
                stage: PollerStage::Idle,
                n: 0,
                sent: 0,
                prev: None,
                due: None,
                late: false,
                place: None,
            },
            exec: Exec {
                stage: ExecStage::Idle,
                token: 0,
                place: None,
            },
            holder: HolderStage::Holding,
            lambdas: Vec::new(),
            event: false,
            polls_left: self.config.polls,
            deaths_left: self.config.deaths,
            asks: 0,
            retired: 0,
            bad: None,
        }
    }

    fn describe_initial(&self, s: &PollState) -> String {
        format!(
            "pollers ({}): {}; the lock: {}",
            match self.variant {
                PollVariant::Real => "the product's protocol".to_owned(),
                other => format!("BROKEN variant {}", other.name()),
            },
            self.config,
            self.show(s.table)
        )
    }

    fn successors(
        &self,
        s: &PollState,
        out: &mut Vec<PollState>,
        mut labels: Option<&mut Vec<String>>,
    ) {
        let on = labels.is_some();
        let mut push = |t: PollState, w: Words| {
            out.push(t);
            if let Some(labels) = labels.as_deref_mut() {
                labels.push(w.into_string());
            }
        };
        let make = |f: &dyn Fn(&mut PollState, &mut Words)| {
            let mut t = s.clone();
            let mut w = Words::new(on);
            f(&mut t, &mut w);
            (t, w)
        };
        for (i, &l) in s.lambdas.iter().enumerate() {
            if i > 0 && s.lambdas[i - 1] == l {
                continue;
            }
            let (t, w) = make(&|t, w| {
                t.lambdas.remove(i);
                self.step(t, l, w);
            });
            push(t, w);
        }
        let p = s.poller;
        match p.stage {
            // Both ask before the clock first moves (in either order); their writes land at
            // any later step, any tick.
            PollerStage::Idle if s.polls_left > 0 => {
                let (t, w) = make(&|t, w| {
                    t.polls_left -= 1;
                    self.poll(t, w);
                });
                push(t, w);
            }
            PollerStage::Between if s.polls_left > 0 => {
                let (t, w) = make(&|t, w| {
                    t.polls_left -= 1;
                    self.poll(t, w);
                });
                push(t, w);
            }
            PollerStage::Working { .. } => {
                let (t, w) = make(&|t, w| Self::finish_work(t, Who::Poller, w));
                push(t, w);
            }
            _ => {}
        }
        // (Stopping while its release is on its way changes nothing: it holds nothing more.)
        if p.alive() && !matches!(p.stage, PollerStage::Idle | PollerStage::Releasing) {
            let (t, w) = make(&|t, w| {
                t.poller.stage = PollerStage::Stopped;
                w.say(|| "poller stops polling for ever (it dies)".to_owned());
            });
            push(t, w);
        }
        match s.exec.stage {
            ExecStage::Idle => {
                let (t, w) = make(&|t, w| {
                    t.exec.stage = ExecStage::Waiting;
                    t.exec.place = Some(t.asks);
                    t.asks += 1;
                    w.say(|| {
                        "exec enters its acquire state and parks on its task (task 0); its \
                         acquire function acquires"
                            .to_owned()
                    });
                    let (task, at) = (Task::Acquire { token: 0 }, t.now);
                    let step = self.start_flow(t, Who::Exec, task, at);
                    Self::spawn(t, Who::Exec, task, step);
                });
                push(t, w);
            }
            ExecStage::Working => {
                let (t, w) = make(&|t, w| Self::finish_work(t, Who::Exec, w));
                push(t, w);
            }
            _ => {}
        }
        // Stopped while parked (in line, or granted and not yet woken): a dead waiter. (Its
        // death while it works is the queue world's.)
        if s.exec.stage == ExecStage::Waiting
            && s.deaths_left > 0
            && !s
                .lambdas
                .iter()
                .any(|l| matches!(l.task, Task::Acquire { .. }))
        {
            let (t, w) = make(&|t, w| {
                t.deaths_left -= 1;
                t.exec.stage = ExecStage::Ended;
                t.event = true;
                w.say(|| "exec is stopped; its cleanup event is emitted".to_owned());
            });
            push(t, w);
        }
        if s.holder == HolderStage::Holding {
            let (t, w) = make(&|t, w| Self::finish_work(t, Who::Holder, w));
            push(t, w);
        }
        if s.event {
            let (t, w) = make(&|t, w| Self::deliver(t, w));
            push(t, w);
        }
        let asked = s.poller.stage != PollerStage::Idle && s.exec.stage != ExecStage::Idle;
        if asked && s.now < self.config.ticks {
            let (t, w) = make(&|t, w| {
                w.say(|| format!("a tick of the clock (now tick {})", t.now + 1));
                self.tick(t, w);
            });
            push(t, w);
        }
    }

    fn check(&self, s: &PollState) -> Result<(), Violation> {
        if let Some(bad) = s.bad {
            return Err(self.bad(s, bad));
        }
        self.safety(s)?;
        if self.stable(s) {
            self.settled(s)?;
        }
        Ok(())
    }

    fn may_stop(&self, s: &PollState) -> bool {
        self.stable(s)
    }

    /// Everything but what nothing reads: the version and fencing tokens of the item and of
    /// the items the invocations read.
    fn identify(&self, s: &PollState, h: &mut Fingerprint) {
        let t = self.table(s.table);
        t.shape.hash(h);
        let runs = |who: Who| s.lambdas.iter().any(|l| l.who == who);
        // The poller: all of it while it waits for its slot or a poll of it runs; once it holds
        // or is gone, what it believes and where it is only.
        let p = s.poller;
        if (p.alive() && p.waiting()) || runs(Who::Poller) {
            (p, s.polls_left).hash(h);
        } else {
            (p.stage, p.alive() && s.polls_left > 0).hash(h);
        }
        // The parked execution, unless it is gone (ended or succeeded, holding nothing, out of
        // line, nothing of it running or pending).
        let gone = !s.exec.alive()
            && !runs(Who::Exec)
            && !s.event
            && (t.holders | t.in_line) & Who::Exec.bit() == 0;
        if gone {
            u8::MAX.hash(h);
        } else {
            (s.exec, s.deaths_left).hash(h);
        }
        // Who asks next, while someone may still ask.
        let asking = p.stage == PollerStage::Idle
            || s.exec.stage == ExecStage::Idle
            || s.lambdas
                .iter()
                .any(|l| matches!(l.task, Task::Acquire { .. }));
        if asking {
            s.asks.hash(h);
        }
        (s.now, s.holder, s.event, s.retired, s.bad).hash(h);
        s.lambdas.len().hash(h);
        for l in &s.lambdas {
            (l.who, l.task).hash(h);
            if matches!(l.task, Task::Poll { .. }) {
                l.granted_poller.hash(h);
            }
            self.identify_step(l, h);
        }
    }
}

impl Naming for PollWorld {
    fn who(&self, identity: &Identity) -> String {
        identity.holder.to_string()
    }

    fn fence(&self, key: &FenceKey) -> String {
        [Who::Poller, Who::Exec, Who::Holder]
            .into_iter()
            .find_map(|x| {
                let (acquisition, run) = self.fence_keys[x as usize];
                if *key == acquisition {
                    Some(format!("{}'s acquisition", x.name()))
                } else if *key == run {
                    Some(format!("{}'s run", x.name()))
                } else {
                    None
                }
            })
            .unwrap_or_else(|| "?".to_owned())
    }

    fn moment(&self, at_ms: u64) -> Option<String> {
        Some(Self::tick_name(at_ms))
    }

    fn task(&self, token: &TaskToken) -> Option<String> {
        Some(format!("task {}", token_number(token)))
    }
}

/// Witnesses that the behaviours the checks are about do happen in the pollers' world, so that
/// a check that passes is not vacuous about them; and the step-by-step hand-off compared with
/// the core's.
#[cfg(test)]
mod tests {
    use super::*;
    use crate::explore::{explore, Reach};

    /// One step a witness must meet.
    type Milestone<'w> = Box<dyn Fn(&PollState) -> bool + 'w>;

    /// A shortest path through `steps`, in words; panics if there is none.
    fn witness(world: &PollWorld, what: &'static str, steps: Vec<Milestone<'_>>) -> String {
        let reach = Reach {
            model: world,
            steps,
            what,
        };
        let report = explore(&reach, None);
        let Some(cex) = report.counterexample.clone() else {
            panic!("not reachable: {what} ({report})")
        };
        assert_eq!(cex.violation.property, "reached", "{cex}");
        let text = cex.to_string();
        println!("{what}:\n{text}");
        text
    }

    fn world() -> PollWorld {
        PollWorld::new(PollConfig::small(), PollVariant::Real)
    }

    fn holds(world: &PollWorld, s: &PollState, who: Who) -> bool {
        world.table(s.table).holders & who.bit() != 0
    }

    fn in_line(world: &PollWorld, s: &PollState, who: Who) -> bool {
        world.table(s.table).in_line & who.bit() != 0
    }

    fn first_in_line(world: &PollWorld, s: &PollState) -> Option<Who> {
        world
            .table(s.table)
            .head()
            .map(|h| PollWorld::who_of(&h.identity))
    }

    #[test]
    fn a_poller_granted_by_a_hand_off_finds_its_slot_at_its_next_poll() {
        let world = world();
        let text = witness(
            &world,
            "the poller granted while it waits between polls, then working",
            vec![
                Box::new(|s| {
                    s.poller.stage == PollerStage::Between && holds(&world, s, Who::Poller)
                }),
                Box::new(|s| matches!(s.poller.stage, PollerStage::Working { .. })),
            ],
        );
        assert!(
            text.contains("take out of line, take a slot for poller"),
            "{text}"
        );
        assert!(text.contains("(already_held)"), "{text}");
    }

    #[test]
    fn a_hand_off_takes_a_stopped_poller_out_of_line_and_grants_the_execution_behind_it() {
        let world = world();
        let text = witness(
            &world,
            "the poller ahead of exec in line, stopped; then exec works",
            vec![
                Box::new(|s| {
                    first_in_line(&world, s) == Some(Who::Poller) && in_line(&world, s, Who::Exec)
                }),
                Box::new(|s| s.poller.stage == PollerStage::Stopped),
                Box::new(|s| {
                    s.exec.stage == ExecStage::Working
                        && !holds(&world, s, Who::Poller)
                        && !in_line(&world, s, Who::Poller)
                }),
            ],
        );
        assert!(
            text.contains("it stopped polling: it takes it out of line"),
            "{text}"
        );
    }

    #[test]
    fn a_poll_that_renews_its_record_first_keeps_its_place() {
        let world = world();
        // A hand-off about to take the poller out of line as stopped, on a record the poller
        // has renewed since.
        let renewed = |s: &PollState| {
            s.lambdas.iter().any(|l| match l.step {
                Step::Hand(Hand::LeaveStopped { head, .. }) => {
                    let judged = world.table(head).head().cloned();
                    let now = world
                        .table(s.table)
                        .line
                        .values()
                        .find(|r| PollWorld::who_of(&r.identity) == Who::Poller)
                        .cloned();
                    now.is_some() && now != judged
                }
                _ => false,
            })
        };
        let text = witness(
            &world,
            "a removal of the poller's record as stopped, decided before a poll renewed it, \
             refused: the poller keeps its place",
            vec![
                Box::new(renewed),
                Box::new(|s| {
                    !s.lambdas
                        .iter()
                        .any(|l| matches!(l.step, Step::Hand(Hand::LeaveStopped { .. })))
                        && in_line(&world, s, Who::Poller)
                }),
            ],
        );
        assert!(text.contains("not as judged any more"), "{text}");
    }

    #[test]
    fn a_slot_granted_to_a_poller_that_stopped_is_taken_back_once_its_lease_passed() {
        let world = world();
        let text = witness(
            &world,
            "the poller granted a slot, then stopped; exec works after it",
            vec![
                Box::new(|s| {
                    s.poller.stage == PollerStage::Stopped && holds(&world, s, Who::Poller)
                }),
                Box::new(|s| s.exec.stage == ExecStage::Working),
            ],
        );
        assert!(text.contains("takes back the leases that passed"), "{text}");
        assert!(text.contains("fence poller's acquisition"), "{text}");
    }

    #[test]
    fn the_line_serves_either_kind_first_in_the_order_they_asked() {
        let world = world();
        // exec asked first: it is granted while the poller waits behind it.
        witness(
            &world,
            "exec ahead of the poller in line, then exec works while the poller is in line",
            vec![
                Box::new(|s| {
                    first_in_line(&world, s) == Some(Who::Exec) && in_line(&world, s, Who::Poller)
                }),
                Box::new(|s| s.exec.stage == ExecStage::Working && in_line(&world, s, Who::Poller)),
            ],
        );
        // The poller asked first: it is granted while exec waits behind it.
        let text = witness(
            &world,
            "the poller ahead of exec in line, then the poller holds while exec is in line",
            vec![
                Box::new(|s| {
                    first_in_line(&world, s) == Some(Who::Poller) && in_line(&world, s, Who::Exec)
                }),
                Box::new(|s| holds(&world, s, Who::Poller) && in_line(&world, s, Who::Exec)),
            ],
        );
        assert!(
            text.contains("poller has nothing to wake") || text.contains("granted"),
            "{text}"
        );
    }

    #[test]
    fn a_dead_execution_ahead_of_a_poller_is_skipped() {
        let world = world();
        let text = witness(
            &world,
            "exec stopped at the head of the line, the poller behind it; then the poller holds",
            vec![
                Box::new(|s| {
                    s.exec.stage == ExecStage::Ended
                        && first_in_line(&world, s) == Some(Who::Exec)
                        && in_line(&world, s, Who::Poller)
                }),
                Box::new(|s| holds(&world, s, Who::Poller)),
            ],
        );
        assert!(text.contains("exec is stopped"), "{text}");
    }

    #[test]
    fn a_quiet_state_with_a_stopped_poller_holding_its_slot_is_reached() {
        // The quiet states' check (a sweep after the lease leaves a stopped poller holding
        // nothing) is not vacuous. (A stopped poller is never left in line in a quiet state:
        // the last hand-off grants it, or takes it out of line.)
        let world = world();
        witness(
            &world,
            "a quiet state, the poller stopped holding a slot, exec parked behind it",
            vec![Box::new(|s| {
                world.stable(s)
                    && s.poller.stage == PollerStage::Stopped
                    && holds(&world, s, Who::Poller)
                    && in_line(&world, s, Who::Exec)
            })],
        );
    }

    /// The hand-off as the model runs it, one request per step, run alone from every distinct
    /// lock, line, clock and parked execution a small world reaches, by a writer on time and
    /// one a skew ahead: it must do exactly what the core's `Semaphore::hand_off` does from the
    /// same item and line at the same clock (the same writes, so the same item, versions
    /// included, and line), with a waker and `DescribeExecution` that answer as the world would
    /// (a poller has nothing to wake).
    #[test]
    fn the_hand_off_step_by_step_is_the_cores_hand_off() {
        use std::collections::{HashSet, VecDeque};
        use std::sync::{Arc, Mutex};

        use semaphore_core::{
            ExecutionState, ExecutionStatus, FencingToken, ManualClock, MemoryStore, PortError,
            Semaphore, Waker,
        };

        struct Parked(Mutex<Option<String>>);
        impl Waker for Parked {
            async fn wake(&self, waiter: &Waiter, _: FencingToken) -> Result<(), PortError> {
                let Some(token) = waiter.task_token() else {
                    return Ok(());
                };
                let mut parked = self.0.lock().unwrap();
                if parked.as_deref() == Some(token.as_str()) {
                    *parked = None;
                    Ok(())
                } else {
                    Err(PortError::new("no such task waits"))
                }
            }
            async fn defer(&self, _: &Waiter, _: u64) -> Result<(), PortError> {
                unreachable!("no rate here")
            }
        }
        struct Alive(bool);
        impl ExecutionStatus for Alive {
            async fn describe(&self, holder: &HolderId) -> Result<ExecutionState, PortError> {
                assert_eq!(holder.as_str(), "exec", "only exec is described");
                Ok(if self.0 {
                    ExecutionState::Running
                } else {
                    ExecutionState::Ended {
                        status: "ABORTED".to_owned(),
                        last_run: Run::FIRST,
                    }
                })
            }
        }

        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let world = world();
        let fp = |s: &PollState| {
            let mut h = Fingerprint::default();
            world.identify(s, &mut h);
            h.finish128()
        };
        let mut seen = HashSet::new();
        let mut starts = HashSet::new();
        let mut frontier = VecDeque::from([world.initial()]);
        let mut compared = 0;
        // Hand-offs that woke exec, granted the poller, took a stopped poller out of line,
        // took back a lease, freed a dead waiter's grant; breadth first from the start, up to
        // a bound.
        let mut kinds = [0; 5];
        while let Some(s) = frontier.pop_front() {
            if seen.len() > 300_000 {
                break;
            }
            let mut next = Vec::new();
            world.successors(&s, &mut next, None);
            for t in next {
                if seen.insert(fp(&t)) {
                    frontier.push_back(t);
                }
            }
            let table = world.table(s.table);
            let (Some(item), false) = (&table.item, table.line.is_empty()) else {
                continue;
            };
            for who in [Who::Holder, Who::Sweeper] {
                if !starts.insert((s.table, s.now, s.exec, who)) {
                    continue;
                }
                compared += 1;

                // The model, alone.
                let mut t = s.clone();
                t.bad = None;
                t.lambdas = vec![Lambda {
                    who,
                    task: Task::Sweep,
                    step: Step::Hand(Hand::ReadLock),
                    granted_poller: false,
                }];
                let mut took_back = false;
                let mut left_stopped = false;
                while let Some(l) = t.lambdas.pop() {
                    match l.step {
                        Step::TakeBack { .. } => took_back = true,
                        Step::Hand(Hand::LeaveStopped { .. }) => left_stopped = true,
                        _ => {}
                    }
                    world.step(&mut t, l, &mut Words::new(false));
                }
                // (Alone, a grant the hand-off reads back is the poller's: nothing frees it.)
                let granted_poller = table.holders & Who::Poller.bit() == 0
                    && world.table(t.table).holders & Who::Poller.bit() != 0;
                let woke_exec =
                    s.exec.stage == ExecStage::Waiting && t.exec.stage == ExecStage::Working;
                let model = world.table(t.table);

                // The core, on a memory store holding the same item and line.
                let store = MemoryStore::new();
                let mut start = item.clone();
                start.waiting -= table.line.len() as u64;
                start.version.0 -= table.line.len() as u64;
                store.put_now(start);
                for waiter in table.line.values() {
                    store.write_now(&Write {
                        lock: world.lock.clone(),
                        checks: Vec::new(),
                        changes: vec![Change::Enqueue(Box::new(waiter.clone()))],
                    });
                }
                assert_eq!(store.load_now(&world.lock).as_ref(), Some(item));
                let parked = (s.exec.stage == ExecStage::Waiting)
                    .then(|| task_token(s.exec.token).as_str().to_owned());
                let semaphore = Semaphore::new(&store)
                    .with_clock(Arc::new(ManualClock::new(PollWorld::clock(who, s.now))))
                    .with_timing(TIMING);
                let report = runtime
                    .block_on(semaphore.hand_off(
                        &world.lock,
                        None,
                        &Parked(Mutex::new(parked)),
                        &Alive(s.exec.alive()),
                    ))
                    .unwrap();
                let woken: Vec<&str> = report
                    .woken
                    .iter()
                    .map(|(id, _)| id.holder.as_str())
                    .collect();
                let context =
                    || format!("by {who:?} at tick {} from {}", s.now, world.show(s.table));
                assert_eq!(
                    (woken.contains(&"exec"), woken.contains(&"poller")),
                    (woke_exec, granted_poller),
                    "{}",
                    context()
                );
                assert_eq!(
                    store.load_now(&world.lock).as_ref(),
                    model.item.as_ref(),
                    "{}",
                    context()
                );
                let line: Vec<Waiter> = model.line.values().cloned().collect();
                assert_eq!(
                    store.waiters_now(&world.lock, None, 10),
                    line,
                    "{}",
                    context()
                );
                for (kind, happened) in [
                    woke_exec,
                    granted_poller,
                    left_stopped
                        && report
                            .skipped
                            .iter()
                            .any(|id| id.holder.as_str() == "poller"),
                    took_back,
                    !report.freed.is_empty(),
                ]
                .into_iter()
                .enumerate()
                {
                    kinds[kind] += usize::from(happened);
                }
            }
        }
        println!(
            "{compared} hand-offs compared; (woke exec, granted the poller, took a stopped \
             poller out of line, took back a lease, freed a dead waiter's grant): {kinds:?}"
        );
        // Pinned, as the queue world's: a change to the model that changes them must be seen.
        assert_eq!((compared, kinds), (1_818, [100, 320, 94, 19, 78]));
    }
}
