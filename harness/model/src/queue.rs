//! The waiting line, model-checked: `K` executions of their own weights wait in one lock's line
//! through the acquire function (acquire; refused, check their record or queue, then hand off),
//! work and release, while deaths, crashes of a Lambda between two requests, early task timeouts
//! and lost cleanup events happen a bounded number of times. Every write is the core's own,
//! landed with [`Write::apply_with`]. The acquire function is the core's acquire flow
//! ([`semaphore_core::flow::acquire`]), run one call per step: the world makes each call as the
//! semaphore would (one request) and hands the flow its reply. The hand-off's control flow is
//! still restated one request per step, so that every other request may come between two of
//! them.
//!
//! Checked in every state: S1, S3, L1 and L2 (no acquire ahead of the line; every grant to the
//! head, but for a late queue write). In every stable state (only timers left): F8 (no grant to
//! the dead kept, no parked execution sleeping through a free slot) and that the timeouts let
//! every live execution finish (L1). The world, the properties and what is not covered are
//! described in docs/testing.md ("The waiting line (`model-check --queue`)").

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::hash::{Hash, Hasher};
use std::rc::Rc;
use std::time::Duration;

use clap::ValueEnum;
use semaphore_core::flow::acquire::{
    AcquireFlow, Broken, Budget, Call, Expiry, Next, Refusal, Reply, Request as FlowRequest, Taken,
    Waiting,
};
use semaphore_core::item::{Identity, Run, SemaphoreItem};
use semaphore_core::protocol::{self, Grant, Timing, WriteResult};
use semaphore_core::{
    AcquireOutcome, AcquisitionId, Attempt, Check, CleanupOutcome, FenceKey, FencingToken,
    HolderId, Holding, Limit, LockName, QueueKey, TaskToken, Terms, Waiter, WaiterId, Weight,
    Write,
};

use crate::explore::{Model, Violation};
use crate::hash::Fingerprint;
use crate::ours::MAX_ROUNDS;
use crate::plumbing::{
    claim_of, exec_name, land_on_line, names, plural, read, show_holders, show_write, shown,
    weights_text, Emitting, Fate, Interner, ItemKey, Memo, Naming, Successors, Variants, Words,
};

/// The most executions the queue world can have.
pub const MAX_WAITERS: usize = 4;

/// How many times the acquire flow queues again after a direct acquire told "full": the core's,
/// as the type the model counts rounds in.
pub const QUEUE_ROUNDS: u8 = semaphore_core::flow::acquire::QUEUE_ROUNDS as u8;

/// The model's clock (2023-11-14T22:13:20Z): execution `e` asked at `NOW_MS + e`; every later
/// request is made at [`LATER_MS`].
const NOW_MS: u64 = 1_700_000_000_000;
const LATER_MS: u64 = NOW_MS + 1_000;
/// No request expires here: time is the main world's concern.
const TIMING: Timing = Timing {
    horizon: Duration::from_secs(3_600),
    clock_skew: Duration::ZERO,
};

/// The size and the faults of the queue world.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueConfig {
    /// Executions contending for the lock (1 to [`MAX_WAITERS`]).
    pub executions: u8,
    /// The lock's limit.
    pub limit: u32,
    /// The weight each execution acquires with (`exec-1` first; 1 to `limit`).
    pub weights: [u32; MAX_WAITERS],
    /// Executions that may be stopped (at any point).
    pub deaths: u8,
    /// Cleanup events that may be lost.
    pub lost_events: u8,
    /// Lambdas (wait, release or cleanup) that may crash between two of their requests.
    pub crashes: u8,
    /// Fallback timeouts of parked tasks that may fire early, at any moment (racing a wake-up
    /// or the function still running).
    pub timeouts: u8,
    /// L2 without the exception for queue writes that land after the hand-off read the head.
    pub strict_order: bool,
    /// The sweeper runs (on its schedule): the liveness check may count on it for the slots the
    /// design leaves to it. Without it, a holder that dies with its cleanup event lost stalls
    /// the line for ever, which the check must find.
    pub sweeper: bool,
}

impl QueueConfig {
    /// The world `model-check --queue` checks: [`QueueConfig::small`] with a heavy execution
    /// in the middle: limit 2, `exec-2` of weight 2, the others of weight 1. Whenever `exec-2`
    /// is at the head of the line it waits for both units, and `exec-3`, behind it, whose
    /// weight would fit, must not pass it (L2).
    pub fn weighted() -> Self {
        Self {
            weights: [1, 2, 1, 1],
            ..Self::small(2)
        }
    }

    /// 3 executions of weight 1 for a limit, one death, one lost event, one crash, no early
    /// timeout (each early timeout multiplies the states by about 40; the tests check them with
    /// fewer executions or fewer faults).
    pub fn small(limit: u32) -> Self {
        Self {
            executions: 3,
            limit,
            weights: [1; MAX_WAITERS],
            deaths: 1,
            lost_events: 1,
            crashes: 1,
            timeouts: 0,
            strict_order: false,
            sweeper: true,
        }
    }
}

impl fmt::Display for QueueConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} executions, limit {}{}; {}, {}, {} (wait, release or cleanup Lambdas), {}; \
             late writes; fallback re-checks when stable{}; L2 {}",
            self.executions,
            self.limit,
            weights_text(&self.weights[..usize::from(self.executions)]),
            plural(self.deaths, "death", "deaths"),
            plural(
                self.lost_events,
                "lost cleanup event",
                "lost cleanup events"
            ),
            plural(self.crashes, "crash", "crashes"),
            plural(
                self.timeouts,
                "early fallback timeout",
                "early fallback timeouts"
            ),
            if self.sweeper {
                ", the sweeper for what is left to it"
            } else {
                ", no sweeper"
            },
            if self.strict_order {
                "strict (every grant to the head as it lands)"
            } else {
                "as defined (grants to the head, but for waiters queued after the head was read)"
            },
        )
    }
}

/// A deliberately broken variant of the line, to show that the checker notices. Each skips a
/// step of the hand-off, alters one of the core's writes, or is the core's acquire flow broken
/// behind its test-only switch ([`Broken`], the `broken-variants` feature).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum QueueVariant {
    /// The product as it is.
    Real,
    /// A failed wake-up of a waiter whose execution has ended leaves its slot held and the
    /// hand-off stops (no cleanup of its run, no next waiter).
    HandOffWithoutWakeRetry,
    /// The acquire's write does not check that nobody waits (`Check::QueueEmpty` removed): a
    /// newcomer can take a free slot ahead of the line.
    NewcomerPassesTheLine,
    /// A grant refused because the waiter is dead (its run or acquisition fenced) stops the
    /// hand-off and leaves the record in line.
    DeadWaiterNotSkipped,
    /// The grant's write checks that a slot of weight 1 fits instead of the head's weight (as
    /// a grant written before weights would): a hand-off that read the lock before another
    /// slot was taken grants a heavy head more than is free (S1).
    GrantIgnoresWeight,
    /// A check (the acquire task entered again after its timeout) that finds the execution in
    /// line leaves its record as it is, with the token of the attempt that timed out: the
    /// hand-off that grants it wakes a task that no longer waits, and nobody repeats the
    /// wake-up until the next timeout (F8).
    CheckKeepsOldToken,
    /// A check that finds the execution in line takes it out and queues it again at the check's
    /// own time, behind those who asked after it (L2: it loses its place).
    CheckTakesANewPlace,
}

impl Variants for QueueVariant {}

/// Where an execution is in the lock-protected state machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Stage {
    /// In its acquire state: parked on its task (the token is `Exec::token`) until it is
    /// completed with a slot.
    Waiting,
    /// Doing its protected work.
    Working,
    /// In "Release slot" (`failed: false`) or "Release after failure".
    Releasing {
        failed: bool,
    },
    Succeeded,
    /// Stopped, or failed: a cleanup event was emitted.
    Ended,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Exec {
    stage: Stage,
    /// The task token of its current acquire attempt: 0, then one more per attempt (a timeout
    /// entering the state again, a retry).
    token: u8,
    /// A queue write of it has landed: it was put in line, at that attempt's place.
    queued: bool,
}

impl Exec {
    fn alive(&self) -> bool {
        !matches!(self.stage, Stage::Succeeded | Stage::Ended)
    }
}

/// Which Lambda invocation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Task {
    /// The acquire function, invoked by an attempt of the acquire task with this token.
    Wait {
        token: u8,
    },
    Release,
    /// The cleanup of an ended execution.
    Cleanup,
    /// The sweeper's hand-off (in the liveness check only).
    Sweep,
}

/// One request of a hand-off, about to be made (a write: in flight).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Hand {
    /// Read the lock.
    ReadLock,
    /// Read the head of the line; `used`: the weight held, as last read.
    ReadHead { used: u8 },
    /// The grant of the head, as read (its task token), is in flight; `line_at_read`: who was
    /// in line when the head was read.
    Grant {
        head: u8,
        token: u8,
        line_at_read: u8,
    },
    /// Read the lock after a grant (the slot's fencing token).
    ReadGranted { head: u8, token: u8 },
    /// `SendTaskSuccess` to the head's token; (`waiting`, `used`): the lock as last read.
    Wake {
        head: u8,
        token: u8,
        waiting: u8,
        used: u8,
    },
    /// `DescribeExecution` of a head whose wake-up failed.
    Describe { head: u8, waiting: u8, used: u8 },
    /// The fence of the dead head's run is in flight (its cleanup).
    Fence { head: u8 },
    /// The free of the slots the fence saw is in flight, after `round` refused ones.
    Free { head: u8, round: u8 },
    /// The head's record is taken out of line (it was dead or held a slot).
    Leave { head: u8 },
}

impl Hand {
    /// The head whose grant this hand-off has landed and not dealt with yet (wake-up or free).
    fn granted_head(self) -> Option<u8> {
        match self {
            Self::ReadGranted { head, .. }
            | Self::Wake { head, .. }
            | Self::Describe { head, .. }
            | Self::Fence { head }
            | Self::Free { head, .. } => Some(head),
            _ => None,
        }
    }
}

/// A Lambda's next request (a write: in flight).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Step {
    /// The acquire function runs the core's acquire flow: the flow and the call it makes next,
    /// interned ([`QueueWorld::flow`]).
    Flow(u32),
    /// `SendTaskSuccess` to its own task.
    SelfWake,
    /// A release's write (`unheld`: the one for an acquisition that holds nothing), after
    /// `round` refused ones.
    Release {
        unheld: bool,
        round: u8,
    },
    /// The cleanup's fence of the run.
    Fence,
    /// The cleanup takes the place out of line; `slots`: its fence saw a slot.
    Leave {
        slots: bool,
    },
    /// The cleanup frees the slot its fence saw, after `round` refused writes.
    Free {
        round: u8,
    },
    Hand(Hand),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct Lambda {
    exec: u8,
    task: Task,
    step: Step,
}

/// What landed when it must not have.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Bad {
    /// S3: a write of `exec` landed after a release or fence of it had.
    Resurrected { exec: u8, what: &'static str },
    /// L2: an acquire landed while someone was in line.
    PassedTheLine { exec: u8, line: u8 },
    /// L2: a grant landed while waiters were ahead of it.
    OutOfOrder { exec: u8, ahead: u8 },
    /// L2: a live execution was put in line again, after its record had left it without a
    /// grant: it lost the place it first had.
    LostPlace { exec: u8 },
    /// L1: a live execution was answered "fenced".
    Refused { exec: u8 },
    /// L1: a release or free of `exec`'s slot was refused [`MAX_ROUNDS`] times (the core then
    /// gives up with an error).
    Rounds { exec: u8 },
}

/// A state of the queue world.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct QueueState {
    /// The lock's item and line (interned).
    table: u32,
    execs: [Exec; MAX_WAITERS],
    /// Running Lambda invocations, sorted.
    lambdas: Vec<Lambda>,
    /// Cleanup events emitted and not delivered yet (bit e).
    events: u8,
    deaths_left: u8,
    lost_left: u8,
    crashes_left: u8,
    timeouts_left: u8,
    /// Executions a release or fence of which has landed (S3).
    retired: u8,
    /// Executions whose slot the design leaves to their cleanup or the sweeper: it held it when
    /// it ended, took it through a zombie request, or the hand-off that granted it crashed.
    sweepers: u8,
    /// Something happened (a crash) that the design heals only with a later check.
    relied: bool,
    bad: Option<Bad>,
    /// The execution that ended in the step being taken (its event's fate is chosen next).
    emitted: Option<u8>,
}

/// An acquire flow and the call it makes next.
type FlowAt = (AcquireFlow, Call);

/// A lock's item and line, as one key.
type TableKey = (Option<ItemKey>, BTreeMap<QueueKey, Waiter>);

/// An interned table and what the world asks about it.
struct Table {
    item: Option<SemaphoreItem>,
    line: BTreeMap<QueueKey, Waiter>,
    /// Executions holding a slot (bit e).
    holders: u8,
    /// Executions with a record in line (bit e).
    in_line: u8,
    /// The head of the line: (execution, task token).
    head: Option<(u8, u8)>,
    /// Everything but what no check reads (the version, fencing tokens, when slots were taken).
    shape: u64,
}

impl Table {
    fn count(&self) -> u8 {
        self.holders.count_ones() as u8
    }
    fn waiting(&self) -> u64 {
        self.item.as_ref().map_or(0, |item| item.waiting)
    }
    /// The weight held, as stored (`used`).
    fn used(&self) -> u64 {
        self.item.as_ref().map_or(0, |item| item.used)
    }
    /// The weight held, from the holders themselves.
    fn weight_held(&self) -> u64 {
        self.item.as_ref().map_or(0, SemaphoreItem::weight_held)
    }
}

/// A request that writes: which write, of which execution (and task token).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Request {
    /// The acquire write of execution `e`'s attempt of task token `token`.
    Acquire(u8, u8),
    Enqueue(u8, u8),
    Repark(u8, u8),
    Grant(u8, u8),
    Leave(u8),
    /// The release of a slot of the execution's weight, showing this token (the one its slot
    /// has, see `plumbing::GONE`).
    Release(u8, FencingToken),
    /// The release of an acquisition that holds nothing (its fence alone).
    ReleaseUnheld(u8),
    Fence(u8),
    /// The free of the slot (of the execution's weight, taken under this token) a fence saw.
    Free(u8, FencingToken),
}

/// The queue world, explorable by [`crate::explore::explore`].
pub struct QueueWorld {
    pub config: QueueConfig,
    pub variant: QueueVariant,
    lock: LockName,
    limit: Limit,
    /// Per execution, the weight it acquires with.
    weights: Vec<Weight>,
    identities: Vec<Identity>,
    /// What each fence is, in traces.
    fence_names: HashMap<FenceKey, String>,
    /// The tables (items and lines) reached.
    tables: RefCell<Interner<TableKey, Rc<Table>>>,
    /// The write each request sends.
    writes: Memo<Request, Rc<Write>>,
    /// What each request's write does to each table it lands on.
    landings: Memo<(u32, Request), (Rc<WriteResult>, u32)>,
    /// The acquire flows reached, each with the call it makes next.
    flows: RefCell<Interner<FlowAt, Rc<FlowAt>>>,
}

fn bit(e: u8) -> u8 {
    1 << e
}

fn task_token(e: u8, n: u8) -> TaskToken {
    TaskToken::new(format!("{}-task-{n}", exec_name(e))).expect("a valid task token")
}

impl QueueWorld {
    pub fn new(config: QueueConfig, variant: QueueVariant) -> Self {
        assert!(
            (1..=MAX_WAITERS).contains(&usize::from(config.executions)),
            "1 to {MAX_WAITERS} executions"
        );
        assert!(config.limit >= 1, "a limit of at least 1");
        let weights = config.weights[..usize::from(config.executions)]
            .iter()
            .map(|&w| {
                assert!(
                    (1..=config.limit).contains(&w),
                    "weights from 1 to the limit"
                );
                Weight::new(i64::from(w)).expect("a valid weight")
            })
            .collect();
        let identities: Vec<Identity> = (0..config.executions)
            .map(|e| {
                Identity::new(
                    HolderId::new(exec_name(e)).expect("a valid holder"),
                    AcquisitionId::new("r0").expect("a valid acquisition"),
                )
            })
            .collect();
        let fence_names = identities
            .iter()
            .flat_map(|id| {
                [
                    (
                        FenceKey::execution(&id.holder, Run::FIRST),
                        format!("{}'s run", id.holder),
                    ),
                    (
                        FenceKey::acquisition(id),
                        format!("{}/{}", id.holder, id.acquisition),
                    ),
                ]
            })
            .collect();
        let world = Self {
            config,
            variant,
            fence_names,
            lock: LockName::new("model").expect("a valid lock name"),
            limit: Limit::new(i64::from(config.limit)).expect("a valid limit"),
            weights,
            identities,
            tables: RefCell::default(),
            writes: Memo::default(),
            landings: Memo::default(),
            flows: RefCell::default(),
        };
        let empty = world.intern(None, BTreeMap::new());
        assert_eq!(empty, 0);
        world
    }

    fn n(&self) -> u8 {
        self.config.executions
    }

    /// The executions (bit e) that `pick` picks.
    fn which(&self, pick: impl Fn(u8) -> bool) -> u8 {
        (0..self.n())
            .filter(|&e| pick(e))
            .fold(0, |m, e| m | bit(e))
    }

    fn table(&self, id: u32) -> Rc<Table> {
        self.tables.borrow().get(id).clone()
    }

    fn exec_of(&self, identity: &Identity) -> u8 {
        self.identities
            .iter()
            .position(|i| i == identity)
            .expect("an identity of the model") as u8
    }

    fn token_number(token: &TaskToken) -> u8 {
        let (_, n) = token
            .as_str()
            .rsplit_once("-task-")
            .expect("a task token of the model");
        n.parse().expect("a task token of the model")
    }

    fn intern(&self, item: Option<SemaphoreItem>, line: BTreeMap<QueueKey, Waiter>) -> u32 {
        Interner::intern(&self.tables, (item.map(ItemKey), line), |(item, line)| {
            let item = item.as_ref().map(|ItemKey(item)| item.clone());
            let holders = item.as_ref().map_or(0, |item| {
                item.holders
                    .keys()
                    .fold(0, |m, id| m | bit(self.exec_of(id)))
            });
            let in_line = line
                .values()
                .fold(0, |m, w| m | bit(self.exec_of(&w.identity)));
            let head = line.values().next().map(|w| {
                (
                    self.exec_of(&w.identity),
                    Self::token_number(w.task_token().expect("the model's waiters park")),
                )
            });
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
                        item.waiting,
                        item.used,
                    )
                        .hash(&mut h);
                }
                for w in line.values() {
                    (w.key, &w.wakeup).hash(&mut h);
                }
                h.finish()
            };
            Rc::new(Table {
                item,
                line: line.clone(),
                holders,
                in_line,
                head,
                shape,
            })
        })
    }

    /// What execution `e` acquires on: the lock's limit and its weight, no rate.
    fn terms(&self, e: u8) -> Terms {
        Terms::new(self.limit, self.weights[e as usize], None)
            .expect("weights are checked against the limit")
    }

    /// When execution `e`'s attempt of task token `token` entered its acquire state: its request
    /// time and its place in line if it queues (the first at its own millisecond, `exec-1` first;
    /// any later one after every first).
    fn entered(e: u8, token: u8) -> u64 {
        let at = if token == 0 { NOW_MS } else { LATER_MS };
        at + u64::from(e)
    }

    /// The acquire request of execution `e`'s attempt of task token `token`, as the acquire
    /// function's payload reader makes it.
    fn flow_request(&self, e: u8, token: u8) -> FlowRequest {
        let entered = Self::entered(e, token);
        FlowRequest {
            lock: self.lock.clone(),
            terms: self.terms(e),
            identity: self.identities[e as usize].clone(),
            run: Run::FIRST,
            requested_at_ms: entered,
            asked_at_ms: entered,
            attempt: Attempt(u64::from(token)),
            waiting: Waiting::Parked(task_token(e, token)),
            work: None,
        }
    }

    /// The acquire flow of execution `e`'s attempt of task token `token` (broken as the
    /// variant says), at its first call.
    fn start_flow(&self, e: u8, token: u8) -> Step {
        // No wait is long enough to pass a budget here: time is the main world's concern.
        let budget = Budget {
            max_wait: Duration::from_secs(u64::from(u32::MAX)),
            max_checks: u64::MAX,
        };
        let (flow, call) = AcquireFlow::start(self.flow_request(e, token), budget);
        let flow = match self.variant {
            QueueVariant::CheckKeepsOldToken => flow.broken(Broken::CheckKeepsOldToken),
            QueueVariant::CheckTakesANewPlace => flow.broken(Broken::CheckTakesANewPlace),
            _ => flow,
        };
        Step::Flow(self.intern_flow(flow, call))
    }

    /// Whether Lambda `l` runs an acquire flow whose next call `pick` picks.
    #[cfg(test)]
    fn calling(&self, l: &Lambda, pick: impl Fn(&AcquireFlow, &Call) -> bool) -> bool {
        match l.step {
            Step::Flow(id) => {
                let flow = self.flow(id);
                pick(&flow.0, &flow.1)
            }
            _ => false,
        }
    }

    fn intern_flow(&self, flow: AcquireFlow, call: Call) -> u32 {
        Interner::intern(&self.flows, (flow, call), |key| Rc::new(key.clone()))
    }

    /// Interned flow `id` and the call it makes next.
    fn flow(&self, id: u32) -> Rc<FlowAt> {
        self.flows.borrow().get(id).clone()
    }

    /// The waiter record of execution `e` queued by the attempt of task token `token`, as its
    /// acquire flow makes it (with the answer its grant sends).
    fn waiter(&self, e: u8, token: u8) -> Waiter {
        let request = self.flow_request(e, token);
        let entered = Self::entered(e, token);
        let context = request.waiting_answer(&request.terms, entered).to_json();
        Waiter::new(
            self.lock.clone(),
            self.identities[e as usize].clone(),
            Run::FIRST,
            self.terms(e),
            entered,
            task_token(e, token),
            Attempt(u64::from(token)),
            context,
        )
    }

    /// Execution `e`'s record in line in table `t`, if it is there.
    fn record_of<'a>(t: &'a Table, e: u8, identity: &Identity) -> Option<&'a Waiter> {
        (t.in_line & bit(e) != 0)
            .then(|| t.line.values().find(|w| w.identity == *identity))
            .flatten()
    }

    /// The acquire write of execution `e`'s attempt of task token `token` (fast, or direct
    /// after "free"), as `Semaphore::acquire_seeing` sends the flow's `Call::Acquire`.
    fn acquire_write(&self, e: u8, token: u8) -> Write {
        let request = self.flow_request(e, token);
        let mut write = protocol::acquire(
            &self.lock,
            &request.identity,
            request.run,
            None,
            request.terms,
            request.requested_at_ms,
            LATER_MS,
            &TIMING,
        )
        .expect("no request expires in the queue world");
        if self.variant == QueueVariant::NewcomerPassesTheLine {
            write.checks.retain(|check| *check != Check::QueueEmpty);
        }
        write
    }

    /// The write a request sends: the core's, built once.
    fn write(&self, request: Request) -> Rc<Write> {
        self.writes
            .get_or(request, || Rc::new(self.make_write(request)))
    }

    fn make_write(&self, request: Request) -> Write {
        let lock = &self.lock;
        match request {
            Request::Acquire(e, token) => self.acquire_write(e, token),
            Request::Enqueue(e, token) => protocol::enqueue(
                &self.waiter(e, token),
                None,
                Self::entered(e, token),
                LATER_MS,
                &TIMING,
            )
            .expect("no request expires in the queue world"),
            Request::Repark(e, token) => protocol::repark(
                lock,
                WaiterId::of(&self.identities[e as usize]),
                semaphore_core::Wakeup::Task(task_token(e, token)),
                Attempt(u64::from(token)),
            ),
            Request::Grant(e, token) => {
                let mut write = protocol::grant(
                    &self.waiter(e, token),
                    None,
                    &self.waiter(e, token).terms,
                    LATER_MS,
                );
                if self.variant == QueueVariant::GrantIgnoresWeight {
                    for check in &mut write.checks {
                        if let Check::Fits { weight, .. } = check {
                            *weight = Weight::ONE;
                        }
                    }
                }
                write
            }
            Request::Leave(e) => protocol::leave(lock, WaiterId::of(&self.identities[e as usize])),
            Request::Release(e, token) => protocol::release(
                lock,
                &self.identities[e as usize],
                token,
                self.weights[e as usize],
                NOW_MS,
            ),
            Request::ReleaseUnheld(e) => {
                protocol::release_unheld(lock, &self.identities[e as usize], NOW_MS)
            }
            Request::Fence(e) => {
                protocol::cleanup_fence(lock, &self.identities[e as usize].holder, Run::FIRST)
            }
            Request::Free(e, token) => protocol::cleanup_free(
                lock,
                &[(
                    self.identities[e as usize].clone(),
                    Holding {
                        token,
                        acquired_at_ms: 0,
                        weight: self.weights[e as usize],
                    },
                )],
            ),
        }
    }

    /// The write lands on the lock's item and line as they are: [`Write::apply_with`], as the
    /// memory store applies it (`Applied` with the item before, `Landed` for a write that names a
    /// waiter's record, `Refused` with the item as it is). Decided once per table and request.
    fn land(&self, table: u32, request: Request) -> (Rc<WriteResult>, u32) {
        self.landings
            .get_or((table, request), || self.make_landing(table, request))
    }

    fn make_landing(&self, table: u32, request: Request) -> (Rc<WriteResult>, u32) {
        let write = self.write(request);
        let t = self.table(table);
        let (result, next) = land_on_line(&self.lock, &write, t.item.as_ref(), &t.line);
        let after = match next {
            Some((item, line)) => self.intern(Some(item), line),
            None => table,
        };
        (Rc::new(result), after)
    }

    /// Sends `request` of execution `e` in state `s`, and it lands, with what it did in words:
    /// the write, what became of it, and whether it landed. An acquire, queue write or grant
    /// that lands is checked against S3 and L2's "no acquire passes the line".
    fn send(
        &self,
        s: &mut QueueState,
        e: u8,
        request: Request,
        w: &mut Words,
    ) -> (Rc<Write>, WriteResult, bool) {
        let write = self.write(request);
        let before = self.table(s.table);
        let (result, after) = self.land(s.table, request);
        let result = (*result).clone();
        let landed = !matches!(result, WriteResult::Refused { .. });
        s.table = after;
        w.say(|| {
            format!(
                "({}) {}: {}",
                show_write(self, &write),
                if landed { "lands" } else { "is refused" },
                self.show(after)
            )
        });
        let what = match request {
            Request::Acquire(..) => Some("acquire"),
            Request::Enqueue(..) => Some("queue write"),
            Request::Grant(..) => Some("grant"),
            _ => None,
        };
        if landed && s.bad.is_none() {
            if let Some(what) = what {
                if s.retired & bit(e) != 0 {
                    s.bad = Some(Bad::Resurrected { exec: e, what });
                } else if what == "acquire" && before.waiting() > 0 {
                    s.bad = Some(Bad::PassedTheLine {
                        exec: e,
                        line: before.in_line,
                    });
                } else if what == "queue write" && s.execs[e as usize].queued {
                    // Its record left the line without a grant (a grant makes it hold, and a
                    // holder queues no more), and it was put in line again, at a later place.
                    s.bad = Some(Bad::LostPlace { exec: e });
                }
            }
        }
        if landed && matches!(request, Request::Enqueue(..)) {
            s.execs[e as usize].queued = true;
        }
        (write, result, landed)
    }

    fn show(&self, table: u32) -> String {
        let t = self.table(table);
        let Some(item) = &t.item else {
            return "no item".to_owned();
        };
        let of = format!(" of {}", self.limit);
        let mut text = show_holders(self, item, &self.weights, &of);
        let fences: Vec<String> = (0..self.n())
            .filter_map(|e| {
                let id = &self.identities[e as usize];
                let run = FenceKey::execution(&id.holder, Run::FIRST);
                let acq = FenceKey::acquisition(id);
                match (item.is_fenced(&run), item.is_fenced(&acq)) {
                    (true, true) => Some(format!("{} (run, acquisition)", id.holder)),
                    (true, false) => Some(format!("{} (run)", id.holder)),
                    (false, true) => Some(format!("{} (acquisition)", id.holder)),
                    (false, false) => None,
                }
            })
            .collect();
        if !fences.is_empty() {
            text.push_str(&format!(", fenced: {}", fences.join(", ")));
        }
        let line: Vec<String> = t
            .line
            .values()
            .map(|w| {
                format!(
                    "{} (task {})",
                    w.identity.holder,
                    Self::token_number(w.task_token().expect("the model's waiters park"))
                )
            })
            .collect();
        text.push_str(&format!(", waiting {}", item.waiting));
        if !line.is_empty() {
            text.push_str(&format!(", line: {}", line.join(" < ")));
        }
        text
    }

    fn lambda_name(&self, s: &QueueState, l: &Lambda) -> String {
        let who = exec_name(l.exec);
        let x = s.execs[l.exec as usize];
        let zombie = if x.alive() { "" } else { " (zombie)" };
        match l.task {
            Task::Wait { token } => format!(
                "{who}'s acquire function (task {token}){}",
                if !x.alive() {
                    " (zombie)"
                } else if x.stage != Stage::Waiting || x.token != token {
                    " (its task is over)"
                } else {
                    ""
                }
            ),
            Task::Release => format!("{who}'s release{zombie}"),
            Task::Cleanup => format!("the cleanup of {who}"),
            Task::Sweep => "the sweeper's hand-off".to_owned(),
        }
    }

    /// Whether execution `e` is parked on the acquire attempt of `token` (a wake-up with it
    /// lands).
    fn parked_on(s: &QueueState, e: u8, token: u8) -> bool {
        let x = s.execs[e as usize];
        x.stage == Stage::Waiting && x.token == token
    }

    fn spawn(s: &mut QueueState, exec: u8, task: Task, step: Step) {
        s.lambdas.push(Lambda { exec, task, step });
    }

    /// Execution `e` ends (stopped, or failed): its event is emitted, and a slot it holds is its
    /// cleanup's (or the sweeper's).
    fn end(&self, s: &mut QueueState, e: u8, w: &mut Words) {
        s.execs[e as usize].stage = Stage::Ended;
        if self.table(s.table).holders & bit(e) != 0 {
            s.sweepers |= bit(e);
        }
        debug_assert!(s.emitted.is_none(), "one step ends at most one execution");
        s.emitted = Some(e);
        w.say(|| format!("; a cleanup event for {} is emitted", exec_name(e)));
    }

    /// A Lambda has no more requests to make.
    fn done(&self, s: &mut QueueState, l: Lambda, w: &mut Words) {
        if l.task == Task::Release {
            let e = l.exec;
            if let Stage::Releasing { failed } = s.execs[e as usize].stage {
                if failed {
                    w.say(|| format!(" => {} fails", exec_name(e)));
                    self.end(s, e, w);
                } else {
                    w.say(|| format!(" => {} succeeds", exec_name(e)));
                    s.execs[e as usize].stage = Stage::Succeeded;
                }
            }
        }
    }

    /// Goes on with `l` at `step`, or ends it.
    fn next(&self, s: &mut QueueState, l: Lambda, step: Option<Step>, w: &mut Words) {
        match step {
            Some(step) => Self::spawn(s, l.exec, l.task, step),
            None => self.done(s, l, w),
        }
    }

    /// The hand-off's loop, on the lock as last read.
    fn hand_on(waiting: u64, used: u64, w: &mut Words) -> Option<Step> {
        if waiting == 0 {
            w.say(|| "; nobody waits: the hand-off is done".to_owned());
            return None;
        }
        w.say(|| "; it reads the head of the line".to_owned());
        Some(Step::Hand(Hand::ReadHead { used: used as u8 }))
    }

    /// The request that sends `write`, a write a refusal of one of execution `e`'s release or
    /// free writes called for: the model sends only requests it names, so a write of another
    /// shape (a slot of another weight than the execution's) would be a gap in the model.
    /// The token of the slot execution `e` holds in state `s` (`GONE` if none): what it shows.
    fn held_token(&self, s: &QueueState, e: u8) -> FencingToken {
        let table = self.table(s.table);
        shown(
            table.item.as_ref(),
            &self.identities[e as usize],
            self.weights[e as usize],
        )
        .token
    }

    fn request_for(&self, e: u8, write: &Write, candidates: &[Request]) -> Request {
        *candidates
            .iter()
            .find(|&&request| *self.write(request) == *write)
            .unwrap_or_else(|| panic!("{} sends a write the model lacks: {write:?}", exec_name(e)))
    }

    /// The next write of a release or a free that was refused, as `step` (the core's reading)
    /// calls for, or `None` when `MAX_ROUNDS` writes were refused (the core gives up: L1).
    fn round_again(&self, s: &mut QueueState, e: u8, round: u8, w: &mut Words) -> Option<u8> {
        if round + 1 >= MAX_ROUNDS {
            if s.bad.is_none() {
                s.bad = Some(Bad::Rounds { exec: e });
            }
            w.say(|| format!("; refused {MAX_ROUNDS} times: the core gives up"));
            return None;
        }
        w.say(|| "; the item handed back calls for another write".to_owned());
        Some(round + 1)
    }

    /// Execution `e`'s acquire write (fast, or direct after "free") lands, and what the core
    /// reads of it; a slot a zombie takes (`alive` false) is left to its cleanup or the sweeper.
    fn acquire(
        &self,
        s: &mut QueueState,
        e: u8,
        token: u8,
        alive: bool,
        w: &mut Words,
    ) -> AcquireOutcome {
        let (write, result, landed) = self.send(s, e, Request::Acquire(e, token), w);
        if landed && !alive {
            s.sweepers |= bit(e);
        }
        let identity = &self.identities[e as usize];
        let outcome = read(protocol::acquired(&write, identity, self.limit, result));
        w.say(|| format!(" => {outcome:?}"));
        outcome
    }

    /// The fence of execution `e`'s run (a cleanup's, or a hand-off's of a dead waiter's)
    /// lands: whether it saw a slot.
    fn fence(&self, s: &mut QueueState, e: u8, w: &mut Words) -> bool {
        let (write, result, _) = self.send(s, e, Request::Fence(e), w);
        s.retired |= bit(e);
        let holder = &self.identities[e as usize].holder;
        !read(protocol::fenced_slots(&write, holder, result))
            .0
            .is_empty()
    }

    /// Execution `e`'s record is taken out of line: whether it was in line.
    fn leave(&self, s: &mut QueueState, e: u8, w: &mut Words) -> bool {
        let (write, result, _) = self.send(s, e, Request::Leave(e), w);
        read(protocol::was_queued(&write, &result))
    }

    /// The free of the slot execution `e`'s fence saw, after `round` refused writes: what it
    /// freed and the item after, or the next round if it was refused (`None`: the core gives
    /// up).
    fn free(
        &self,
        s: &mut QueueState,
        e: u8,
        round: u8,
        w: &mut Words,
    ) -> Result<(CleanupOutcome, SemaphoreItem), Option<u8>> {
        let request = Request::Free(e, self.held_token(s, e));
        let (write, result, _) = self.send(s, e, request, w);
        match read(protocol::freed(&write, result)) {
            semaphore_core::Step::Done(done) => Ok(done),
            semaphore_core::Step::Again(next) => {
                self.request_for(e, &next, &[Request::Free(e, self.held_token(s, e))]);
                Err(self.round_again(s, e, round, w))
            }
        }
    }

    /// Makes `call` of execution `e`'s acquire flow (attempt of task token `token`) as the
    /// semaphore would, one request, and answers what it did.
    fn perform(
        &self,
        s: &mut QueueState,
        e: u8,
        token: u8,
        alive: bool,
        call: &Call,
        w: &mut Words,
    ) -> Reply {
        let identity = &self.identities[e as usize];
        match call {
            Call::Acquire { .. } => Reply::Acquired {
                outcome: self.acquire(s, e, token, alive, w),
                // What the acquire saw only tells the terms of a configured lock, and the line's
                // lock is not configured (F14 is `ours`').
                seen: None,
            },
            Call::ReadWaiter => {
                let t = self.table(s.table);
                let record = Self::record_of(&t, e, identity).cloned();
                w.say(|| match &record {
                    None => "reads its record: not in line".to_owned(),
                    Some(r) => format!(
                        "reads its record: in line with task {}",
                        Self::token_number(r.task_token().expect("the model's waiters park"))
                    ),
                });
                Reply::Waiter(record)
            }
            Call::Enqueue(waiter) => {
                debug_assert_eq!(*waiter, self.waiter(e, token), "the flow's record");
                let (write, result, _) = self.send(s, e, Request::Enqueue(e, token), w);
                let outcome = read(protocol::queued(&write, identity, result));
                w.say(|| format!(" => {outcome:?}"));
                Reply::Queued(outcome)
            }
            Call::Leave => {
                let was = self.leave(s, e, w);
                w.say(|| format!(" => {}", if was { "left" } else { "was not in line" }));
                Reply::InLine(was)
            }
            Call::Repark(wakeup) => {
                debug_assert_eq!(*wakeup, semaphore_core::Wakeup::Task(task_token(e, token)));
                let (write, result, _) = self.send(s, e, Request::Repark(e, token), w);
                let queued = read(protocol::was_queued(&write, &result));
                w.say(|| {
                    format!(
                        " => {}",
                        if queued {
                            "in line with its token"
                        } else {
                            "not in line with an earlier token"
                        }
                    )
                });
                Reply::InLine(queued)
            }
            Call::HandOff => unreachable!("a hand-off is the Lambda's own steps"),
        }
    }

    /// What the flow does next, in words.
    fn describe_call(flow: &AcquireFlow, call: &Call) -> String {
        match call {
            Call::Acquire { .. } if flow.queue_round().is_some() => "; it acquires directly",
            Call::Acquire { .. } => "; it acquires",
            Call::ReadWaiter => "; it checks its record in line",
            Call::Enqueue(_) if flow.queue_round() > Some(1) => "; it queues again",
            Call::Enqueue(_) => "; it queues",
            Call::Leave => "; it takes itself out of line",
            Call::Repark(_) => "; it keeps its place with its own token",
            Call::HandOff => "; it hands off: it reads the lock",
        }
        .to_owned()
    }

    /// Execution `e`'s acquire function answers as the flow ended (`current`: its task still
    /// waits): with its slot, its own task completes; refused for good, L1 is broken for a live
    /// execution; expired, its state's Catch enters it again.
    fn answered(
        &self,
        s: &mut QueueState,
        e: u8,
        current: bool,
        done: Result<semaphore_core::flow::acquire::Acquisition, Refusal>,
        w: &mut Words,
    ) -> Option<Step> {
        match done {
            Ok(done) => match done.taken {
                Taken::Holding { .. } => {
                    w.say(|| "; it completes its own task".to_owned());
                    Some(Step::SelfWake)
                }
                Taken::Superseded => {
                    w.say(|| ": a later attempt's: its own task is over".to_owned());
                    None
                }
                Taken::InLine { .. } => None,
            },
            Err(Refusal::Fenced(_)) => {
                self.refused(s, e, current, w);
                None
            }
            Err(Refusal::Expired(Expiry::Churn)) => {
                // The lock kept changing under it: nothing held, nothing queued. It answers
                // SemaphoreExpired, which the state catches into itself: a new attempt.
                w.say(|| "; it gives up queueing: SemaphoreExpired".to_owned());
                if current {
                    w.say(|| "; ".to_owned());
                    self.enter_again(s, e, "its Catch of SemaphoreExpired", w);
                }
                None
            }
            Err(other) => {
                unreachable!("{other:?}: no request expires or waits past its budget here")
            }
        }
    }

    fn refused(&self, s: &mut QueueState, e: u8, current: bool, w: &mut Words) {
        if current && s.bad.is_none() {
            s.bad = Some(Bad::Refused { exec: e });
        }
        w.say(|| {
            if current {
                format!(" => {} is refused", exec_name(e))
            } else {
                " (nobody waits for the answer)".to_owned()
            }
        });
    }

    /// One step of Lambda `l`, which the caller has taken out of `s.lambdas`.
    fn step(&self, s: &mut QueueState, l: Lambda, w: &mut Words) {
        let e = l.exec;
        let identity = &self.identities[e as usize];
        w.say(|| format!("{}: ", self.lambda_name(s, &l)));
        let alive = s.execs[e as usize].alive();
        match l.step {
            Step::Flow(id) => {
                let Task::Wait { token } = l.task else {
                    unreachable!("only an acquire function runs the acquire flow")
                };
                let current = Self::parked_on(s, e, token);
                let flow = self.flow(id);
                let (flow, call) = (&flow.0, &flow.1);
                let reply = self.perform(s, e, token, alive, call, w);
                let mut flow = flow.clone();
                let step = match flow.resume(reply, LATER_MS) {
                    Next::Call(call) => {
                        w.say(|| Self::describe_call(&flow, &call));
                        Some(match call {
                            // The hand-off's requests are the Lambda's next steps, from its read
                            // of the lock. Its answer ends the flow of a parked caller in line,
                            // whatever it is: a grant completes its task from the hand-off.
                            Call::HandOff => Step::Hand(Hand::ReadLock),
                            call => Step::Flow(self.intern_flow(flow, call)),
                        })
                    }
                    Next::Done(done) => self.answered(s, e, current, done, w),
                };
                self.next(s, l, step, w)
            }
            Step::SelfWake => {
                let Task::Wait { token } = l.task else {
                    unreachable!("only a wait function wakes itself")
                };
                if Self::parked_on(s, e, token) {
                    s.execs[e as usize].stage = Stage::Working;
                    w.say(|| {
                        format!(
                            "SendTaskSuccess (task {token}) => {} does its work",
                            exec_name(e)
                        )
                    });
                } else {
                    w.say(|| format!("SendTaskSuccess (task {token}) fails: no such task waits"));
                }
                self.done(s, l, w)
            }
            Step::Release { unheld, round } => {
                let request = if unheld {
                    Request::ReleaseUnheld(e)
                } else {
                    Request::Release(e, self.held_token(s, e))
                };
                let (write, result, landed) = self.send(s, e, request, w);
                if landed {
                    s.retired |= bit(e);
                }
                let claim = claim_of(&write);
                let step = match read(protocol::released(&write, identity, claim, result)) {
                    semaphore_core::Step::Done((outcome, after)) => {
                        w.say(|| format!(" => {outcome:?}"));
                        (after.waiting > 0).then(|| {
                            w.say(|| "; someone waits: it hands off: it reads the lock".to_owned());
                            Step::Hand(Hand::ReadLock)
                        })
                    }
                    semaphore_core::Step::Again(next) => {
                        let request = self.request_for(
                            e,
                            &next,
                            &[
                                Request::Release(e, self.held_token(s, e)),
                                Request::ReleaseUnheld(e),
                            ],
                        );
                        self.round_again(s, e, round, w).map(|round| Step::Release {
                            unheld: request == Request::ReleaseUnheld(e),
                            round,
                        })
                    }
                };
                self.next(s, l, step, w)
            }
            Step::Fence => {
                let slots = self.fence(s, e, w);
                w.say(|| format!(" => it saw {}", if slots { "a slot" } else { "no slot" }));
                // Its acquire tasks name the lock and who it is: it takes the execution out of
                // the line if it is in it.
                w.say(|| "; it takes it out of line if it is there".to_owned());
                let step = Some(Step::Leave { slots });
                self.next(s, l, step, w)
            }
            Step::Leave { slots } => {
                let was = self.leave(s, e, w);
                w.say(|| format!(" => {}", if was { "left" } else { "was not in line" }));
                self.next(s, l, slots.then_some(Step::Free { round: 0 }), w)
            }
            Step::Free { round } => {
                let step = match self.free(s, e, round, w) {
                    Ok((outcome, after)) => {
                        w.say(|| format!(" => freed {}", outcome.freed.len()));
                        (!outcome.freed.is_empty() && after.waiting > 0).then(|| {
                            w.say(|| "; someone waits: it hands off: it reads the lock".to_owned());
                            Step::Hand(Hand::ReadLock)
                        })
                    }
                    Err(round) => round.map(|round| Step::Free { round }),
                };
                self.next(s, l, step, w)
            }
            Step::Hand(hand) => {
                let step = self.hand_step(s, hand, w);
                self.next(s, l, step, w)
            }
        }
    }

    /// One request of a hand-off (see `Semaphore::hand_off`).
    fn hand_step(&self, s: &mut QueueState, hand: Hand, w: &mut Words) -> Option<Step> {
        match hand {
            Hand::ReadLock => {
                let t = self.table(s.table);
                w.say(|| format!("reads the lock: {}", self.show(s.table)));
                // No item: nothing to hand off.
                let item = t.item.as_ref()?;
                Self::hand_on(item.waiting, item.used, w)
            }
            Hand::ReadHead { used } => {
                let t = self.table(s.table);
                let Some((head, token)) = t.head else {
                    w.say(|| "reads the head: nobody in line: done".to_owned());
                    return None;
                };
                w.say(|| format!("reads the head: {} (task {token})", exec_name(head)));
                // A head whose weight does not fit waits; nobody passes it (L2).
                let weight = self.weights[head as usize];
                if u32::from(used) + weight.get() > self.limit.get() {
                    w.say(|| {
                        format!("; {used} used (as read): its weight {weight} does not fit, done")
                    });
                    return None;
                }
                w.say(|| format!("; {used} used (as read): it grants it a slot"));
                Some(Step::Hand(Hand::Grant {
                    head,
                    token,
                    line_at_read: t.in_line,
                }))
            }
            Hand::Grant {
                head,
                token,
                line_at_read,
            } => {
                let before = self.table(s.table);
                let (write, result, landed) = self.send(s, head, Request::Grant(head, token), w);
                if landed && s.bad.is_none() {
                    // Waiters ahead of the one granted, as the grant lands.
                    let place = |x: u8| {
                        Self::record_of(&before, x, &self.identities[x as usize]).map(|r| r.key)
                    };
                    let mut ahead =
                        self.which(|x| before.in_line & bit(x) != 0 && place(x) < place(head));
                    if !self.config.strict_order {
                        ahead &= line_at_read;
                    }
                    if ahead != 0 {
                        s.bad = Some(Bad::OutOfOrder { exec: head, ahead });
                    }
                }
                let grant = read(protocol::granted(&write, result));
                match grant {
                    Grant::Granted => {
                        w.say(|| " => granted; it reads the lock".to_owned());
                        Some(Step::Hand(Hand::ReadGranted { head, token }))
                    }
                    Grant::Moved { current } => {
                        w.say(|| " => moved".to_owned());
                        Self::hand_on(current.waiting, current.used, w)
                    }
                    Grant::Dead { .. } if self.variant == QueueVariant::DeadWaiterNotSkipped => {
                        w.say(|| " => dead; the hand-off stops (broken variant)".to_owned());
                        None
                    }
                    Grant::Dead { .. } | Grant::Holding { .. } => {
                        w.say(|| {
                            format!(
                                " => {}; it takes {} out of line",
                                if matches!(grant, Grant::Dead { .. }) {
                                    "dead"
                                } else {
                                    "holding"
                                },
                                exec_name(head)
                            )
                        });
                        Some(Step::Hand(Hand::Leave { head }))
                    }
                    Grant::NoSlot { .. } => {
                        w.say(|| " => no slot: done".to_owned());
                        None
                    }
                    Grant::TooSoon { .. } => unreachable!("no waiter of the model has a rate"),
                }
            }
            Hand::ReadGranted { head, token } => {
                let t = self.table(s.table);
                w.say(|| format!("reads the lock: {}", self.show(s.table)));
                if t.holders & bit(head) == 0 {
                    w.say(|| format!("; {} holds nothing any more", exec_name(head)));
                    return Self::hand_on(t.waiting(), t.used(), w);
                }
                w.say(|| format!("; it wakes {}", exec_name(head)));
                Some(Step::Hand(Hand::Wake {
                    head,
                    token,
                    waiting: t.waiting() as u8,
                    used: t.used() as u8,
                }))
            }
            Hand::Wake {
                head,
                token,
                waiting,
                used,
            } => {
                if Self::parked_on(s, head, token) {
                    s.execs[head as usize].stage = Stage::Working;
                    w.say(|| {
                        format!(
                            "SendTaskSuccess to {} (task {token}) => {} does its work",
                            exec_name(head),
                            exec_name(head)
                        )
                    });
                    Self::hand_on(waiting.into(), used.into(), w)
                } else {
                    w.say(|| {
                        format!(
                            "SendTaskSuccess to {} (task {token}) fails; DescribeExecution next",
                            exec_name(head)
                        )
                    });
                    Some(Step::Hand(Hand::Describe {
                        head,
                        waiting,
                        used,
                    }))
                }
            }
            Hand::Describe {
                head,
                waiting,
                used,
            } => {
                if s.execs[head as usize].alive() {
                    w.say(|| {
                        format!(
                            "DescribeExecution: {} is RUNNING: it keeps the slot (parked)",
                            exec_name(head)
                        )
                    });
                    return Self::hand_on(waiting.into(), used.into(), w);
                }
                if self.variant == QueueVariant::HandOffWithoutWakeRetry {
                    w.say(|| {
                        format!(
                            "DescribeExecution: {} has ended; the slot stays held and the \
                             hand-off stops (broken variant)",
                            exec_name(head)
                        )
                    });
                    return None;
                }
                w.say(|| {
                    format!(
                        "DescribeExecution: {} has ended: it cleans up its run",
                        exec_name(head)
                    )
                });
                Some(Step::Hand(Hand::Fence { head }))
            }
            Hand::Fence { head } => {
                if self.fence(s, head, w) {
                    w.say(|| " => it saw the slot; it frees it".to_owned());
                    Some(Step::Hand(Hand::Free { head, round: 0 }))
                } else {
                    w.say(|| " => it saw no slot; it reads the lock".to_owned());
                    Some(Step::Hand(Hand::ReadLock))
                }
            }
            Hand::Free { head, round } => match self.free(s, head, round, w) {
                Ok(_) => {
                    w.say(|| "; it reads the lock".to_owned());
                    Some(Step::Hand(Hand::ReadLock))
                }
                Err(round) => round.map(|round| Step::Hand(Hand::Free { head, round })),
            },
            Hand::Leave { head } => {
                self.leave(s, head, w);
                w.say(|| "; it reads the lock".to_owned());
                Some(Step::Hand(Hand::ReadLock))
            }
        }
    }

    /// Lambda `l` (taken out of `s.lambdas`) crashes before its next request.
    fn crash(&self, s: &mut QueueState, l: Lambda, w: &mut Words) {
        let e = l.exec;
        s.crashes_left -= 1;
        s.relied = true;
        w.say(|| format!("{} crashes", self.lambda_name(s, &l)));
        if let Step::Hand(hand) = l.step {
            if let Some(head) = hand.granted_head() {
                // The grant it landed is left to the head's fallback re-check (alive), or to
                // the head's cleanup and the sweeper (ended).
                s.sweepers |= bit(head);
                w.say(|| {
                    format!(
                        " with {}'s grant landed and not dealt with",
                        exec_name(head)
                    )
                });
            }
        }
        match l.task {
            Task::Release if matches!(s.execs[e as usize].stage, Stage::Releasing { .. }) => {
                w.say(|| format!("; its release task fails: {} fails", exec_name(e)));
                self.end(s, e, w);
            }
            Task::Wait { token } if Self::parked_on(s, e, token) => {
                w.say(|| "; ".to_owned());
                self.enter_again(
                    s,
                    e,
                    "the function's failure, which its Retry tries again",
                    w,
                );
            }
            _ => {}
        }
    }

    /// A timeout of execution `e`'s acquire task: its Catch enters the state again, a new
    /// attempt with a new token, whose acquire function checks.
    fn time_out(&self, s: &mut QueueState, e: u8, w: &mut Words) {
        self.enter_again(s, e, "its timeout", w);
    }

    /// Execution `e`'s acquire task ends without a slot (`why`) and a new attempt of it begins:
    /// a new token, and the acquire function invoked with it, which first checks the line.
    fn enter_again(&self, s: &mut QueueState, e: u8, why: &str, w: &mut Words) {
        let x = &mut s.execs[e as usize];
        let old = x.token;
        x.token += 1;
        let token = x.token;
        w.say(|| {
            format!(
                "{}'s acquire task (task {old}) ends on {why}: a new attempt (task {token}) \
                 invokes the acquire function",
                exec_name(e)
            )
        });
        Self::spawn(s, e, Task::Wait { token }, self.start_flow(e, token));
    }

    fn deliver(s: &mut QueueState, e: u8, w: &mut Words) {
        s.events &= !bit(e);
        w.say(|| format!("the cleanup event for {} is delivered", exec_name(e)));
        Self::spawn(s, e, Task::Cleanup, Step::Fence);
    }

    fn finish_work(s: &mut QueueState, e: u8, w: &mut Words) {
        w.say(|| format!("{} finishes its work and releases", exec_name(e)));
        Self::release(s, e, false);
    }

    /// Execution `e` enters "Release slot", or "Release after failure" if `failed`.
    fn release(s: &mut QueueState, e: u8, failed: bool) {
        s.execs[e as usize].stage = Stage::Releasing { failed };
        let step = Step::Release {
            unheld: false,
            round: 0,
        };
        Self::spawn(s, e, Task::Release, step);
    }

    /// Nothing is in flight, nothing pending and nobody works: only timers are left (fallback
    /// timeouts, the sweeper's schedule).
    fn stable(&self, s: &QueueState) -> bool {
        s.lambdas.is_empty()
            && s.events == 0
            && s.execs[..self.n() as usize]
                .iter()
                .all(|x| matches!(x.stage, Stage::Waiting | Stage::Succeeded | Stage::Ended))
    }

    /// S1, in any state.
    fn safety(&self, s: &QueueState) -> Result<(), Violation> {
        let t = self.table(s.table);
        if t.weight_held() > u64::from(self.config.limit) {
            return Err(Violation {
                property: "S1",
                detail: format!(
                    "{} slots of weight {} held with limit {}: {}",
                    t.count(),
                    t.weight_held(),
                    self.config.limit,
                    self.show(s.table)
                ),
            });
        }
        if t.used() != t.weight_held() {
            return Err(Violation {
                property: "S1",
                detail: format!(
                    "the lock records {} used but the holders' weights add up to {}: {}",
                    t.used(),
                    t.weight_held(),
                    self.show(s.table)
                ),
            });
        }
        if t.waiting() != t.line.len() as u64 {
            return Err(Violation {
                property: "S1",
                detail: format!(
                    "the lock counts {} waiting but {} records are in line: {}",
                    t.waiting(),
                    t.line.len(),
                    self.show(s.table)
                ),
            });
        }
        let without =
            self.which(|e| s.execs[e as usize].stage == Stage::Working && t.holders & bit(e) == 0);
        if without != 0 {
            return Err(Violation {
                property: "S1",
                detail: format!(
                    "{} does its work without holding a slot: {}",
                    names(without),
                    self.show(s.table)
                ),
            });
        }
        Ok(())
    }

    fn bad(&self, s: &QueueState, bad: Bad) -> Violation {
        let table = self.show(s.table);
        match bad {
            Bad::Resurrected { exec, what } => Violation {
                property: "S3",
                detail: format!(
                    "a {what} of {} landed after a release of it or a fence of its run had: {table}",
                    exec_name(exec)
                ),
            },
            Bad::PassedTheLine { exec, line } => Violation {
                property: "L2",
                detail: format!(
                    "an acquire of {} landed while {} waited in line: {table}",
                    exec_name(exec),
                    names(line)
                ),
            },
            Bad::OutOfOrder { exec, ahead } => Violation {
                property: "L2",
                detail: format!(
                    "a grant to {} landed while {} {} ahead of it in line{}: {table}",
                    exec_name(exec),
                    names(ahead),
                    if ahead.count_ones() == 1 { "was" } else { "were" },
                    if self.config.strict_order {
                        " (strict order)"
                    } else {
                        ", in line already when the hand-off read the head"
                    }
                ),
            },
            Bad::LostPlace { exec } => Violation {
                property: "L2",
                detail: format!(
                    "{} was put in line again after it had left it without a grant: it lost \
                     the place it first had, behind waiters that asked after it: {table}",
                    exec_name(exec)
                ),
            },
            Bad::Refused { exec } => Violation {
                property: "L1",
                detail: format!(
                    "{} was answered \"fenced\" while it was running: {table}",
                    exec_name(exec)
                ),
            },
            Bad::Rounds { exec } => Violation {
                property: "L1",
                detail: format!(
                    "a release or free of {}'s slot was refused {MAX_ROUNDS} times: {table}",
                    exec_name(exec)
                ),
            },
        }
    }

    /// The first step there is with no faults (a Lambda's next request, else someone finishing
    /// its work, else an event delivered), taken in `s`; `false` if there is none.
    fn first_step(&self, s: &mut QueueState, w: &mut Words) -> bool {
        if !s.lambdas.is_empty() {
            let l = s.lambdas.remove(0);
            self.step(s, l, w);
        } else if let Some(e) = (0..self.n()).find(|&e| s.execs[e as usize].stage == Stage::Working)
        {
            Self::finish_work(s, e, w);
        } else if let Some(e) = (0..self.n()).find(|&e| s.events & bit(e) != 0) {
            Self::deliver(s, e, w);
        } else {
            return false;
        }
        if let Some(e) = s.emitted.take() {
            self.doom(s, e, Fate::Delivered);
        }
        self.normalize(s);
        true
    }

    /// Runs `s` with no faults, always taking the first step there is, until it is stable.
    fn settle(&self, s: &mut QueueState, log: &mut Option<String>) -> Result<(), String> {
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

    /// What makes a difference to whether anyone ever finishes (task tokens do not).
    fn progress(&self, s: &QueueState) -> (Vec<Stage>, u8, u8) {
        let t = self.table(s.table);
        (
            s.execs[..self.n() as usize]
                .iter()
                .map(|x| x.stage)
                .collect(),
            t.holders,
            t.in_line,
        )
    }

    fn parked(&self, s: &QueueState) -> u8 {
        self.which(|e| s.execs[e as usize].stage == Stage::Waiting)
    }

    /// Ended executions holding a slot (bit e).
    fn dead_holders(&self, s: &QueueState) -> u8 {
        let t = self.table(s.table);
        self.which(|e| !s.execs[e as usize].alive() && t.holders & bit(e) != 0)
    }

    /// From stable state `s`: fires the fallback timeouts of the parked executions in turn,
    /// each re-check run to completion with no more faults, until every live execution has
    /// finished, or a round of them changes nothing twice (then, once, the sweeper, if the
    /// design leaves a slot to it). With `log`, what happened.
    fn heal(&self, s: &QueueState, log: &mut Option<String>) -> Result<(), String> {
        let mut t = s.clone();
        let mut swept = false;
        let mut idle = 0;
        for round in 1..=8 * usize::from(self.n()) + 8 {
            let before = self.progress(&t);
            if let Some(log) = log {
                log.push_str(&format!("\n  round {round}:"));
            }
            for e in 0..self.n() {
                if t.execs[e as usize].stage != Stage::Waiting {
                    continue;
                }
                let mut w = Words::new(log.is_some());
                self.time_out(&mut t, e, &mut w);
                if let Some(log) = log {
                    log.push_str(&format!("\n   - {}", w.into_string()));
                }
                t.lambdas.sort_unstable();
                self.settle(&mut t, log)?;
            }
            if self.parked(&t) == 0 {
                return Ok(());
            }
            idle = if self.progress(&t) == before {
                idle + 1
            } else {
                0
            };
            if idle < 2 {
                continue;
            }
            let dead = self.dead_holders(&t);
            if self.config.sweeper && !swept && dead != 0 && dead & !t.sweepers == 0 {
                swept = true;
                idle = 0;
                self.sweep(&mut t, log)?;
                continue;
            }
            let unswept = dead & !t.sweepers;
            return Err(format!(
                "{} {} parked for ever{}: {}",
                names(self.parked(&t)),
                if self.parked(&t).count_ones() == 1 {
                    "stays"
                } else {
                    "stay"
                },
                if unswept != 0 {
                    format!(
                        " ({} ended and holds a slot it was granted after it ended, which the \
                         hand-off should have freed)",
                        names(unswept)
                    )
                } else if dead != 0 && !self.config.sweeper {
                    format!(
                        " ({} ended holding a slot, and there is no sweeper)",
                        names(dead)
                    )
                } else {
                    String::new()
                },
                self.show(t.table)
            ));
        }
        Err(format!(
            "{} still parked after every round: {}",
            names(self.parked(&t)),
            self.show(t.table)
        ))
    }

    /// The sweeper: the cleanup of every ended execution that holds a slot or a place in line,
    /// then a hand-off.
    fn sweep(&self, t: &mut QueueState, log: &mut Option<String>) -> Result<(), String> {
        let table = self.table(t.table);
        let ended = self.which(|e| {
            !t.execs[e as usize].alive() && (table.holders | table.in_line) & bit(e) != 0
        });
        if let Some(log) = log {
            log.push_str(&format!("\n  the sweeper cleans up {}", names(ended)));
        }
        for e in 0..self.n() {
            if ended & bit(e) != 0 {
                Self::spawn(t, e, Task::Cleanup, Step::Fence);
            }
        }
        t.lambdas.sort_unstable();
        self.settle(t, log)?;
        Self::spawn(t, 0, Task::Sweep, Step::Hand(Hand::ReadLock));
        self.settle(t, log)
    }

    /// The properties of a stable state: F8 (dead grants freed, no sleeping through a free
    /// slot) and L1 (no stall).
    fn settled(&self, s: &QueueState) -> Result<(), Violation> {
        let t = self.table(s.table);
        let leaked = self.dead_holders(s) & !s.sweepers;
        if leaked != 0 {
            return Err(Violation {
                property: "F8",
                detail: format!(
                    "{} was granted a slot after it had ended, and holds it with nothing in \
                     flight or pending that could free it (the hand-off that granted it did not \
                     crash; only the sweeper could): {}",
                    names(leaked),
                    self.show(s.table)
                ),
            });
        }
        let parked = self.parked(s);
        if !s.relied && parked != 0 {
            let holding = parked & t.holders;
            let out_of_line = self.which(|e| {
                parked & bit(e) != 0
                    && Self::record_of(&t, e, &self.identities[e as usize]).is_none_or(|w| {
                        Self::token_number(w.task_token().expect("the model's waiters park"))
                            != s.execs[e as usize].token
                    })
            });
            let why = if holding != 0 {
                Some(format!(
                    "{} is parked holding a slot it was granted: its wake-up was lost",
                    names(holding)
                ))
            } else if out_of_line != 0 {
                Some(format!(
                    "{} is parked but not in line with its current task token: nobody will \
                     wake it",
                    names(out_of_line)
                ))
            } else if t.head.is_some_and(|(head, _)| {
                t.used() + u64::from(self.weights[head as usize].get())
                    <= u64::from(self.config.limit)
            }) {
                Some(format!(
                    "{} {} parked while the head of the line fits",
                    names(parked),
                    if parked.count_ones() == 1 {
                        "is"
                    } else {
                        "are"
                    }
                ))
            } else {
                None
            };
            if let Some(why) = why {
                return Err(Violation {
                    property: "F8",
                    detail: format!(
                        "{why}, though no crash happened that the design needs a later check \
                         for: {}",
                        self.show(s.table)
                    ),
                });
            }
        }
        if parked != 0 && self.heal(s, &mut None).is_err() {
            let mut log = Some(String::new());
            let why = self
                .heal(s, &mut log)
                .expect_err("the same run fails the same way");
            return Err(Violation {
                property: "L1",
                detail: format!(
                    "stall: with no more faults, the fallback re-checks of the parked executions \
                     (in turn, each to completion) never let every live execution finish: {why}\n  \
                     what they do:{}",
                    log.unwrap_or_default()
                ),
            });
        }
        Ok(())
    }
}

impl Model for QueueWorld {
    type State = QueueState;

    fn initial(&self) -> QueueState {
        let mut s = QueueState {
            table: 0,
            execs: [Exec {
                stage: Stage::Succeeded,
                token: 0,
                queued: false,
            }; MAX_WAITERS],
            lambdas: Vec::new(),
            events: 0,
            deaths_left: self.config.deaths,
            lost_left: self.config.lost_events,
            crashes_left: self.config.crashes,
            timeouts_left: self.config.timeouts,
            retired: 0,
            sweepers: 0,
            relied: false,
            bad: None,
            emitted: None,
        };
        for e in 0..self.n() {
            s.execs[e as usize].stage = Stage::Waiting;
            let step = self.start_flow(e, 0);
            Self::spawn(&mut s, e, Task::Wait { token: 0 }, step);
        }
        s.lambdas.sort_unstable();
        s
    }

    fn describe_initial(&self, _: &QueueState) -> String {
        format!(
            "the line ({}); lock limit {}, no item; {} enter their acquire state, in that \
             order (their places in line if they wait), and park on its task while its \
             function runs",
            if self.variant == QueueVariant::Real {
                "the product's protocol".to_owned()
            } else {
                format!("BROKEN variant {}", self.variant.name())
            },
            self.config.limit,
            names((1u8 << self.n()) - 1),
        )
    }

    fn successors(
        &self,
        s: &QueueState,
        out: &mut Vec<QueueState>,
        labels: Option<&mut Vec<String>>,
    ) {
        let mut successors = Successors::new(out, labels);
        for (i, &l) in s.lambdas.iter().enumerate() {
            if i > 0 && s.lambdas[i - 1] == l {
                continue;
            }
            successors.make(self, s, |t, w| {
                t.lambdas.remove(i);
                self.step(t, l, w);
            });
            if s.crashes_left > 0
                && matches!(l.task, Task::Wait { .. } | Task::Release | Task::Cleanup)
            {
                successors.make(self, s, |t, w| {
                    t.lambdas.remove(i);
                    self.crash(t, l, w);
                });
            }
        }
        for e in 0..self.n() {
            let x = s.execs[e as usize];
            if x.stage == Stage::Working {
                successors.make(self, s, |t, w| Self::finish_work(t, e, w));
            }
            if x.stage == Stage::Waiting && s.timeouts_left > 0 {
                // Not a fault the design needs a later check for: the check this timeout
                // makes keeps the place with the new token and moves the line itself.
                successors.make(self, s, |t, w| {
                    t.timeouts_left -= 1;
                    w.say(|| "early: ".to_owned());
                    self.time_out(t, e, w);
                });
            }
            if x.alive() && s.deaths_left > 0 {
                successors.make(self, s, |t, w| {
                    t.deaths_left -= 1;
                    w.say(|| format!("{} is stopped", exec_name(e)));
                    self.end(t, e, w);
                });
            }
        }
        for e in 0..self.n() {
            if s.events & bit(e) != 0 {
                successors.make(self, s, |t, w| Self::deliver(t, e, w));
            }
        }
    }

    fn check(&self, s: &QueueState) -> Result<(), Violation> {
        if let Some(bad) = s.bad {
            return Err(self.bad(s, bad));
        }
        self.safety(s)?;
        if self.stable(s) {
            self.settled(s)?;
        }
        Ok(())
    }

    /// Every state without a successor is stable (a Lambda can always take its next step); the
    /// stable states' properties are checked by `check`.
    fn may_stop(&self, s: &QueueState) -> bool {
        self.stable(s)
    }

    /// Everything but what nothing reads any more: the version and fencing tokens in the item,
    /// and all about an execution that is gone (ended or succeeded, with no Lambda of its own
    /// running, no event pending, no slot and no place in line: whatever else refers to it
    /// only asks whether it runs, and it does not).
    fn identify(&self, s: &QueueState, h: &mut Fingerprint) {
        let t = self.table(s.table);
        t.shape.hash(h);
        for e in 0..self.n() {
            let x = s.execs[e as usize];
            let gone = !x.alive()
                && (s.events | t.holders | t.in_line) & bit(e) == 0
                && s.lambdas.iter().all(|l| l.exec != e);
            if gone {
                u8::MAX.hash(h);
            } else {
                (x, s.retired & bit(e), s.sweepers & bit(e)).hash(h);
            }
        }
        s.lambdas.hash(h);
        (
            s.events,
            s.deaths_left,
            s.lost_left,
            s.crashes_left,
            s.timeouts_left,
            s.relied,
            s.bad,
        )
            .hash(h);
    }
}

impl Naming for QueueWorld {
    fn who(&self, identity: &Identity) -> String {
        identity.holder.to_string()
    }

    fn fence(&self, key: &FenceKey) -> String {
        self.fence_names
            .get(key)
            .map_or("?".to_owned(), String::clone)
    }

    fn task(&self, token: &TaskToken) -> Option<String> {
        Some(format!("task {}", Self::token_number(token)))
    }
}

impl Emitting for QueueWorld {
    type State = QueueState;

    fn take_emitted(&self, s: &mut QueueState) -> Option<u8> {
        s.emitted.take()
    }

    fn allows(&self, s: &QueueState, fate: Fate) -> bool {
        match fate {
            Fate::Delivered => true,
            Fate::Lost => s.lost_left > 0,
            Fate::Twice => false,
        }
    }

    fn doom(&self, s: &mut QueueState, e: u8, fate: Fate) {
        match fate {
            Fate::Delivered => s.events |= bit(e),
            Fate::Lost => s.lost_left -= 1,
            Fate::Twice => unreachable!("EventBridge delivers a cleanup event once here"),
        }
    }

    fn normalize(&self, s: &mut QueueState) {
        s.lambdas.sort_unstable();
    }
}

/// Witnesses that the behaviours the checks are about do happen in the queue world, so that a
/// check that passes is not vacuous about them.
#[cfg(test)]
mod tests {
    use super::*;
    use crate::explore::{explore, Reach};

    fn config(
        executions: u8,
        deaths: u8,
        lost_events: u8,
        crashes: u8,
        timeouts: u8,
    ) -> QueueConfig {
        QueueConfig {
            executions,
            limit: 1,
            weights: [1; MAX_WAITERS],
            deaths,
            lost_events,
            crashes,
            timeouts,
            strict_order: false,
            sweeper: true,
        }
    }

    /// One step a witness must meet.
    type Milestone<'w> = Box<dyn Fn(&QueueState) -> bool + 'w>;

    /// A shortest path through `steps`, in words; panics if there is none.
    fn witness(world: &QueueWorld, what: &'static str, steps: Vec<Milestone<'_>>) -> String {
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

    fn held(world: &QueueWorld, s: &QueueState) -> u8 {
        world.table(s.table).holders
    }

    fn all_succeeded(world: &QueueWorld, s: &QueueState) -> bool {
        s.execs[..world.n() as usize]
            .iter()
            .all(|x| x.stage == Stage::Succeeded)
    }

    /// Nothing runs any more, and someone's work was done.
    fn all_done(world: &QueueWorld, s: &QueueState) -> bool {
        let execs = &s.execs[..world.n() as usize];
        s.lambdas.is_empty()
            && execs.iter().all(|x| !x.alive())
            && execs.iter().any(|x| x.stage == Stage::Succeeded)
    }

    fn lambda_at(s: &QueueState, f: impl Fn(&Lambda) -> bool) -> bool {
        s.lambdas.iter().any(f)
    }

    #[test]
    fn a_lost_wake_up_is_healed_by_the_waiters_fallback_re_check() {
        let world = QueueWorld::new(config(2, 0, 0, 1, 1), QueueVariant::Real);
        let text = witness(
            &world,
            "a waiter parked holding a slot granted to it (its waker crashed), then everyone done",
            vec![
                Box::new(|s| {
                    s.lambdas.is_empty()
                        && (0..world.n()).any(|e| {
                            s.execs[e as usize].stage == Stage::Waiting
                                && held(&world, s) & bit(e) != 0
                        })
                }),
                Box::new(|s| all_done(&world, s) && held(&world, s) == 0),
            ],
        );
        assert!(text.contains("crashes with"), "{text}");
        assert!(text.contains("ends on its timeout"), "{text}");
        assert!(text.contains("completes its own task"), "{text}");
    }

    #[test]
    fn a_grant_to_a_waiter_that_ended_is_freed_by_the_hand_off_itself() {
        let world = QueueWorld::new(config(2, 1, 1, 0, 0), QueueVariant::Real);
        let text = witness(
            &world,
            "an ended waiter granted a slot with its cleanup event lost, then nothing held",
            vec![
                Box::new(|s| {
                    (0..world.n()).any(|e| {
                        s.execs[e as usize].stage == Stage::Ended
                            && held(&world, s) & bit(e) != 0
                            && s.sweepers & bit(e) == 0
                            && s.events & bit(e) == 0
                            && s.lambdas
                                .iter()
                                .all(|l| !(l.exec == e && l.task == Task::Cleanup))
                    })
                }),
                Box::new(|s| held(&world, s) == 0 && s.lambdas.is_empty()),
            ],
        );
        assert!(text.contains("it will be lost"), "{text}");
        assert!(text.contains("has ended: it cleans up its run"), "{text}");
    }

    #[test]
    fn a_waiter_whose_slot_freed_before_it_queued_is_handed_one_by_its_own_hand_off() {
        let world = QueueWorld::new(config(3, 0, 0, 0, 0), QueueVariant::Real);
        witness(
            &world,
            "a wait function's own hand-off lands a grant",
            vec![Box::new(|s| {
                lambda_at(s, |l| {
                    matches!(l.task, Task::Wait { .. })
                        && matches!(l.step, Step::Hand(Hand::ReadGranted { .. }))
                })
            })],
        );
        let text = witness(
            &world,
            "a queue write refused as free, then a direct acquire",
            vec![Box::new(|s| {
                lambda_at(s, |l| {
                    world.calling(l, |flow, call| {
                        matches!(call, Call::Acquire { .. }) && flow.queue_round().is_some()
                    })
                })
            })],
        );
        assert!(text.contains("Free; it acquires directly"), "{text}");
    }

    #[test]
    fn a_wake_up_racing_a_fallback_timeout_fails_and_the_waiter_keeps_its_slot() {
        let world = QueueWorld::new(config(2, 0, 0, 0, 1), QueueVariant::Real);
        let text = witness(
            &world,
            "a wake-up of a live waiter fails (its task timed out), then everyone done",
            vec![
                Box::new(|s| {
                    lambda_at(s, |l| match l.step {
                        Step::Hand(Hand::Describe { head, .. }) => s.execs[head as usize].alive(),
                        _ => false,
                    })
                }),
                Box::new(|s| all_succeeded(&world, s)),
            ],
        );
        assert!(
            text.contains("is RUNNING: it keeps the slot (parked)"),
            "{text}"
        );
    }

    #[test]
    fn a_dead_waiter_is_skipped_and_taken_out_of_line() {
        let world = QueueWorld::new(config(3, 1, 0, 0, 0), QueueVariant::Real);
        let text = witness(
            &world,
            "a grant refused as dead, the record taken out of line, then everyone else done",
            vec![
                Box::new(|s| lambda_at(s, |l| matches!(l.step, Step::Hand(Hand::Leave { .. })))),
                Box::new(|s| {
                    s.lambdas.is_empty() && s.execs[..world.n() as usize].iter().all(|x| !x.alive())
                }),
            ],
        );
        assert!(text.contains("=> dead; it takes"), "{text}");
    }

    /// The hand-off as the model runs it, one request per step, run alone from every state a
    /// small world reaches: it must do exactly what the core's `Semaphore::hand_off` does from the
    /// same item and line (the same writes, so the same item, versions included, and line),
    /// with a waker and `DescribeExecution` that answer as the model's world would.
    #[test]
    fn the_hand_off_step_by_step_is_the_cores_hand_off() {
        use std::collections::HashSet;
        use std::sync::{Arc, Mutex};

        use semaphore_core::{
            Change, ExecutionState, ExecutionStatus, FencingToken, ManualClock, MemoryStore,
            PortError, Semaphore, Waker,
        };

        struct Parked(Mutex<Vec<(String, String)>>);
        impl Waker for Parked {
            async fn wake(&self, waiter: &Waiter, _: FencingToken) -> Result<(), PortError> {
                let mut parked = self.0.lock().unwrap();
                let who = (
                    waiter.identity.holder.to_string(),
                    waiter
                        .task_token()
                        .expect("the model's waiters park")
                        .as_str()
                        .to_owned(),
                );
                match parked.iter().position(|p| *p == who) {
                    Some(i) => {
                        parked.remove(i);
                        Ok(())
                    }
                    None => Err(PortError::new("no such task waits")),
                }
            }
            async fn defer(&self, _: &Waiter, _: u64) -> Result<(), PortError> {
                unreachable!("no waiter of the model has a rate")
            }
        }
        struct Alive(Vec<String>);
        impl ExecutionStatus for Alive {
            async fn describe(&self, holder: &HolderId) -> Result<ExecutionState, PortError> {
                Ok(if self.0.iter().any(|h| h == holder.as_str()) {
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
        // Weights 1, 2, 1 on limit 2: a heavy head that does not fit stops the hand-off.
        // Pinned: the hand-offs compared, and how many (woke, kept a slot for a waiter not woken,
        // freed a dead waiter's grant, skipped a dead waiter).
        for (limit, weights, expected) in [
            (1, [1; MAX_WAITERS], (2_479, [382, 80, 84, 46])),
            (2, [1; MAX_WAITERS], (2_818, [838, 195, 207, 128])),
            (2, [1, 2, 1, 1], (3_060, [384, 80, 95, 51])),
        ] {
            let world = QueueWorld::new(
                QueueConfig {
                    limit,
                    weights,
                    ..config(3, 1, 1, 0, 1)
                },
                QueueVariant::Real,
            );
            // Every distinct (item, line, who is parked on which token, who runs), breadth
            // first from the start, up to a bound.
            let mut seen = HashSet::new();
            let mut starts = HashSet::new();
            let mut frontier = std::collections::VecDeque::from([world.initial()]);
            let mut compared = 0;
            // Hand-offs that woke, kept a slot for a waiter not woken, freed a dead waiter's
            // grant, and skipped a dead waiter.
            let mut kinds = [0; 4];
            while let Some(s) = frontier.pop_front() {
                if seen.len() > 300_000 {
                    break;
                }
                let mut next = Vec::new();
                world.successors(&s, &mut next, None);
                for t in next {
                    if seen.insert(t.clone()) {
                        frontier.push_back(t);
                    }
                }
                let table = world.table(s.table);
                let (Some(item), false) = (&table.item, table.line.is_empty()) else {
                    continue;
                };
                let alive: Vec<bool> = s.execs.iter().map(|x| x.alive()).collect();
                if !starts.insert((s.table, s.execs, alive)) {
                    continue;
                }
                compared += 1;

                // The model, alone.
                let mut t = s.clone();
                t.lambdas = vec![Lambda {
                    exec: 0,
                    task: Task::Sweep,
                    step: Step::Hand(Hand::ReadLock),
                }];
                let mut woken = Vec::new();
                while let Some(l) = t.lambdas.pop() {
                    let before: Vec<Stage> = t.execs.iter().map(|x| x.stage).collect();
                    world.step(&mut t, l, &mut Words::new(false));
                    t.emitted = None;
                    for e in 0..world.n() {
                        if before[e as usize] == Stage::Waiting
                            && t.execs[e as usize].stage == Stage::Working
                        {
                            woken.push(exec_name(e));
                        }
                    }
                }
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
                let parked = (0..world.n())
                    .filter(|&e| s.execs[e as usize].stage == Stage::Waiting)
                    .map(|e| {
                        (
                            exec_name(e),
                            task_token(e, s.execs[e as usize].token).as_str().to_owned(),
                        )
                    })
                    .collect();
                let alive = (0..world.n())
                    .filter(|&e| s.execs[e as usize].alive())
                    .map(exec_name)
                    .collect();
                let semaphore = Semaphore::new(&store)
                    .with_clock(Arc::new(ManualClock::new(LATER_MS)))
                    .with_timing(TIMING);
                let report = runtime
                    .block_on(semaphore.hand_off(
                        &world.lock,
                        None,
                        &Parked(Mutex::new(parked)),
                        &Alive(alive),
                    ))
                    .unwrap();
                for (kind, happened) in [
                    !report.woken.is_empty(),
                    !report.parked.is_empty(),
                    !report.freed.is_empty(),
                    !report.skipped.is_empty(),
                ]
                .into_iter()
                .enumerate()
                {
                    kinds[kind] += usize::from(happened);
                }
                let core_woken: Vec<String> = report
                    .woken
                    .iter()
                    .map(|(id, _)| id.holder.to_string())
                    .collect();
                let context = || format!("from {}", world.show(s.table));
                assert_eq!(core_woken, woken, "{}", context());
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
            }
            println!(
                "limit {limit}, weights {weights:?}: {compared} hand-offs compared; (woke, parked, \
                 freed, skipped): {kinds:?}"
            );
            assert_eq!((compared, kinds), expected);
        }
    }

    #[test]
    fn a_record_queued_late_by_an_earlier_attempt_gets_the_later_attempts_token_from_its_check() {
        // The acquire function of task 0 queues the waiter; its task times out before that
        // write lands, and the function of task 1 finds no record yet, acquires ("full"),
        // queues too, and is answered "already queued" once the first write has landed: it
        // checks its record, finds task 0's token, and puts its own there, in the same place.
        let world = QueueWorld::new(config(2, 0, 0, 0, 1), QueueVariant::Real);
        let text = witness(
            &world,
            "a check after AlreadyQueued gives the record the current token",
            vec![
                Box::new(|s| {
                    (0..world.n()).any(|e| {
                        let queueing = |token| {
                            s.lambdas.iter().any(|l| {
                                l.exec == e
                                    && l.task == Task::Wait { token }
                                    && world.calling(l, |_, call| matches!(call, Call::Enqueue(_)))
                            })
                        };
                        queueing(0) && queueing(1)
                    })
                }),
                Box::new(|s| {
                    let t = world.table(s.table);
                    (0..world.n()).any(|e| {
                        let x = s.execs[e as usize];
                        x.stage == Stage::Waiting
                            && x.token > 0
                            && QueueWorld::record_of(&t, e, &world.identities[e as usize])
                                .is_some_and(|w| {
                                    QueueWorld::token_number(
                                        w.task_token().expect("the model's waiters park"),
                                    ) == x.token
                                        && w.key.queued_at_ms == NOW_MS + u64::from(e)
                                })
                            && s.lambdas
                                .iter()
                                .any(|l| l.exec == e && l.step == Step::Hand(Hand::ReadLock))
                    })
                }),
            ],
        );
        assert!(
            text.contains("AlreadyQueued; it checks its record in line"),
            "{text}"
        );
        assert!(
            text.contains("it keeps its place with its own token"),
            "{text}"
        );
    }
}
