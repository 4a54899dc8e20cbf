//! The world the protocol runs in: executions driven by the lock-protected state machine, their
//! Lambda attempts (with Step Functions retries, deaths and zombies), DynamoDB requests that land
//! arbitrarily late or are lost, cleanup events that are lost, duplicated or reordered, a
//! sweeper, a clock, fence rotations and redrives. Which protocol decides what each request does
//! is a [`Protocol`]: the product's (the core's real transitions) or the original AWS sample's.
//!
//! Each step is one atomic thing happening at DynamoDB, or one decision of Step Functions,
//! EventBridge or an execution, so that every request may come between two others. A redriven
//! execution is a new incarnation with an acquisition of its own (`r{n}`) that resumes where it
//! stopped (F7). States are identified up to a renaming of the executions and, for the product's
//! protocol, up to what no check reads (see [`Protocol`]'s `item_key`): two states that differ
//! only so have the same future. docs/testing.md ("Model check: every interleaving of a small world")
//! describes the world step by step.

use std::fmt::{self, Debug};
use std::hash::Hash;

use crate::explore::{Model, Violation};
use crate::hash::{hash_one, Fingerprint};
use crate::plumbing::{exec_name, names, plural, weights_text, Emitting, Fate, Successors, Words};
use semaphore_core::item::Layout;

/// The size and the faults of the world.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Config {
    /// Executions contending for the lock (at most [`MAX_EXECUTIONS`]), `exec-1` ... `exec-K`.
    pub executions: u8,
    /// The lock's limit, as each execution asks for it.
    pub limit: u32,
    /// The limit the lock's operator configured it with before any execution started (F14):
    /// an acquisition takes the configured limit whatever it asks, so this, not `limit`, bounds
    /// the weight held (S1). `None`: not configured.
    pub configured_limit: Option<u32>,
    /// The weight each execution acquires with (`exec-1` first; 1 to `limit`): the limit
    /// bounds the sum of the weights held. The AWS sample is checked with weight 1 for all.
    pub weights: [u32; MAX_EXECUTIONS],
    /// Step Functions retries per execution: a new attempt of the acquire Task (or of the
    /// release Task, after an error, or after a timeout if `release_timeouts`) while the old
    /// one may still be running.
    pub retries: u8,
    /// Step Functions may also time out a running release attempt and retry it (not only
    /// acquire attempts).
    pub release_timeouts: bool,
    /// How many more times an execution told "full" acquires again before it gives up; `None`:
    /// any number of times, and it may give up after any "full" (a superset of every bound,
    /// with fewer states, since no count is kept).
    pub polls: Option<u8>,
    /// How many executions may die (be stopped or time out) in one run.
    pub deaths: u8,
    /// How many times in one run EventBridge may deliver a cleanup event twice.
    pub duplicates: u8,
    /// Cleanup events may be lost.
    pub lost_events: bool,
    /// Writes in flight may be lost (the attempt then fails with an error).
    pub lost_writes: bool,
    /// The protected work may fail (the execution releases, then fails, emitting an event).
    pub work_failures: bool,
    /// A sweeper runs (`sweeps` times at any moments, and once more when everything has ended).
    pub sweeper: bool,
    /// Sweeps at arbitrary moments while executions run (besides the final one).
    pub sweeps: u8,
    /// How many times the clock moves on, by one tick, at arbitrary moments. A tick is the
    /// protocol's horizon and fence window (see `ours`): an acquire requested a tick ago is
    /// expired, and fences may rotate once a tick after the last rotation.
    pub ticks: u8,
    /// How many fence rotations may happen in one run, each at any moment it is due.
    pub rotations: u8,
    /// How many times in one run Step Functions may redrive an execution that ended FAILED,
    /// ABORTED or TIMED_OUT (at most `MAX_INCARNATIONS - 1`; any executions, one at a time).
    pub redrives: u8,
    /// Where the lock keeps its holders ([`Layout`]): in the gate layout, a released
    /// acquisition is a tombstone, which a fence rotation's turn may drop once passed.
    pub layout: Layout,
    /// How many stray releases may be sent in one run, at any moment, each naming the slot of
    /// an execution doing its work but showing a token that is not that slot's (F15: another
    /// branch's or another execution's acquire answer, a bug in a consumer's machine).
    pub strays: u8,
}

impl Config {
    /// The weight execution `e` acquires with.
    pub fn weight(&self, e: u8) -> u32 {
        self.weights[usize::from(e)]
    }

    /// The sum of the weights of the executions in `execs` (bit e).
    pub fn weight_of(&self, execs: u32) -> u32 {
        (0..self.executions)
            .filter(|e| execs & (1 << e) != 0)
            .map(|e| self.weight(e))
            .sum()
    }

    /// The sum of the weights of the slots in a mask of slots (each of its execution's weight).
    pub fn weight_of_slots(&self, slots: u32) -> u32 {
        (0..self.executions)
            .map(|e| exec_part(slots, e).count_ones() * self.weight(e))
            .sum()
    }

    /// The world `cargo test` checks for a given limit: 3 executions, one Step Functions retry
    /// each (zombie attempts), one of them may die (a zombie of a dead execution), cleanup
    /// events may be lost, late and reordered, writes land arbitrarily late, and the final
    /// sweep. Duplicated events, lost writes and sweeps during the run multiply the states
    /// (see [`Config::every_fault`] and the `model-check` binary for those).
    pub fn small(limit: u32) -> Self {
        Self {
            executions: 3,
            limit,
            configured_limit: None,
            weights: [1; MAX_EXECUTIONS],
            retries: 1,
            release_timeouts: false,
            polls: None,
            deaths: 1,
            duplicates: 0,
            lost_events: true,
            lost_writes: false,
            work_failures: false,
            sweeper: true,
            sweeps: 0,
            ticks: 1,
            rotations: 2,
            redrives: 0,
            layout: Layout::Item,
            strays: 0,
        }
    }

    /// Every fault at once: duplicated and lost events, lost writes, a sweep at any moment,
    /// work failures, timeouts of release attempts, and as many deaths as executions.
    pub fn every_fault(executions: u8, limit: u32) -> Self {
        Self {
            executions,
            release_timeouts: true,
            deaths: executions,
            duplicates: 1,
            lost_writes: true,
            work_failures: true,
            sweeps: 1,
            ..Self::small(limit)
        }
    }
}

impl fmt::Display for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let faults: Vec<String> = [
            Some(plural(self.deaths, "death", "deaths")),
            Some("late and reordered writes and events".to_owned()),
            self.lost_events.then(|| "lost events".to_owned()),
            (self.duplicates > 0)
                .then(|| plural(self.duplicates, "duplicated event", "duplicated events")),
            self.lost_writes.then(|| "lost writes".to_owned()),
            self.work_failures.then(|| "work failures".to_owned()),
            (self.ticks > 0).then(|| {
                format!(
                    "{}, {}",
                    plural(self.ticks, "tick of the clock", "ticks of the clock"),
                    plural(self.rotations, "fence rotation", "fence rotations")
                )
            }),
            (self.redrives > 0).then(|| plural(self.redrives, "redrive", "redrives")),
            (self.strays > 0).then(|| {
                plural(
                    self.strays,
                    "stray release (another slot's token)",
                    "stray releases (another slot's token)",
                )
            }),
        ]
        .into_iter()
        .flatten()
        .collect();
        let limit = match self.configured_limit {
            Some(configured) => format!(
                "{} asked, the lock configured with {configured} by its operator",
                self.limit
            ),
            None => self.limit.to_string(),
        };
        write!(
            f,
            "{} executions, limit {}{}; each with {} ({}), {} after \"full\"; {}; sweeper: {}",
            self.executions,
            limit,
            weights_text(&self.weights[..usize::from(self.executions)]),
            plural(
                self.retries,
                "Step Functions retry",
                "Step Functions retries"
            ),
            if self.release_timeouts {
                "acquire or release"
            } else {
                "acquire"
            },
            self.polls.map_or("any number of polls".to_owned(), |n| {
                plural(n, "poll", "polls")
            }),
            faults.join(", "),
            if !self.sweeper {
                "none".to_owned()
            } else if self.sweeps == 0 {
                "one sweep at the end".to_owned()
            } else {
                format!(
                    "{} at any moment and one at the end",
                    plural(self.sweeps, "sweep", "sweeps")
                )
            }
        )?;
        match self.layout {
            Layout::Item => Ok(()),
            Layout::Gate => write!(f, "; gate layout (tombstones dropped by rotations' turns)"),
        }
    }
}

/// What an attempt does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum OpKind {
    /// Acquire a slot for the acquisition of the execution's incarnation.
    Acquire,
    /// Release the acquisition of the execution's incarnation.
    Release,
    /// Clean up everything the (ended) execution holds.
    Cleanup,
    /// A stray release of the execution's acquisition (its slot), showing a token that is not
    /// its slot's: another slot's acquire answer, sent by a bug in a consumer's machine (F15).
    StrayRelease,
}

/// One call of the protocol on behalf of execution `exec`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Op {
    pub kind: OpKind,
    pub exec: u8,
    /// The incarnation that made the call: 0 for the first run, n after the n-th redrive. For a
    /// cleanup, the incarnation the execution was in when the cleanup began (what its
    /// `DescribeExecution` said): it fences that run and every run before it.
    pub inc: u8,
}

/// How a call ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Answer {
    /// Acquire: the identity holds a slot (newly or already).
    Acquired,
    /// Acquire: no slot free.
    Full,
    /// Acquire: refused for good.
    Fenced,
    /// Release or cleanup: done (whether or not anything was held).
    Done,
    /// Acquire: the request is older than the horizon; the state machine asks again.
    Expired,
    /// A request was lost: the caller sees an error.
    Lost,
    /// Acquire of a redriven incarnation refused by the fence of an earlier run's cleanup: only
    /// in the broken variant `one-fence-for-every-run` (the real fences are per run); not for
    /// good, the state machine waits and asks again until the fence is gone.
    Redriven,
    /// Cleanup: `DescribeExecution` says the execution runs again (it was redriven), so the
    /// cleanup stops; what earlier incarnations hold is left to a later event or the sweeper.
    Running,
}

/// Where an attempt goes after one step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Next<P> {
    Continue(P),
    Finished(Answer),
}

/// One atomic step of an attempt at the table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Advance<I, P> {
    /// The stored item after the step.
    pub store: Option<I>,
    /// Whether the step wrote (a write landed).
    pub wrote: bool,
    pub next: Next<P>,
}

/// A semaphore protocol: what is stored and what each request of each call does to it.
pub trait Protocol {
    /// The stored item (compact and hashable).
    type Item: Copy + Eq + Hash + Debug;
    /// Where an attempt is: about to read, or with a write in flight, and its bookkeeping.
    type Phase: Copy + Eq + Hash + Ord + Debug;

    fn name(&self) -> &'static str;
    /// The item before any execution starts.
    fn initial_item(&self) -> Option<Self::Item>;
    /// The phase of a new attempt of `op` whose request was made at tick `requested` (for an
    /// acquire: when its execution entered the acquire state; a Step Functions retry of the
    /// attempt keeps it).
    fn start(&self, op: Op, requested: u8) -> Self::Phase;
    /// What a new attempt of `op` has done so far, in words (e.g. "sent UpdateItem").
    fn describe_start(&self, op: Op) -> String;
    /// Whether the attempt has a write in flight (which may land or be lost).
    fn in_flight(&self, phase: Self::Phase) -> bool;
    /// The attempt's next atomic step against the stored item. `running`: whether the op's
    /// execution runs at this moment (what `DescribeExecution` would say; it can only run again
    /// after it ended if it was redriven). With `log`, appends what the step did in words.
    fn advance(
        &self,
        op: Op,
        phase: Self::Phase,
        store: Option<Self::Item>,
        now: u8,
        running: bool,
        log: Option<&mut String>,
    ) -> Advance<Self::Item, Self::Phase>;
    /// A rotation of the fences, if the protocol has them and one is due on `store` at tick
    /// `now`: the write in flight, decided from `store` as read now. By default none: a
    /// protocol without fences has nothing to rotate (and the methods about a rotation in
    /// flight below are never called).
    fn rotation(&self, _store: Option<Self::Item>, _now: u8) -> Option<Self::Phase> {
        None
    }
    /// The rotation in flight lands (or is refused): the item afterwards.
    fn land_rotation(
        &self,
        _phase: Self::Phase,
        store: Option<Self::Item>,
        _log: Option<&mut String>,
    ) -> Option<Self::Item> {
        store
    }
    /// The slots held: bit [`slot_bit`]`(e, k)` for the slot of `exec-(e+1)`'s acquisition
    /// `k` (the acquisition incarnation `k` uses, see `acquisition_of`).
    fn holders(&self, store: Option<Self::Item>) -> u32;
    /// Which of the execution's acquisitions incarnation `inc` acquires and releases with: its
    /// own, `inc`, unless the protocol reuses one.
    fn acquisition_of(&self, inc: u8) -> u8 {
        inc
    }
    /// Whether a redrive into the protected work is refused (the work task meets the child
    /// execution that already ran under the old acquisition) instead of running the work again.
    fn guards_redriven_work(&self) -> bool;
    /// Whether the write of release `op` in `phase` is its fence of the earlier runs of its
    /// execution (a redriven run's release frees what they hold once its own acquisition is
    /// released, with a cleanup's fence and free).
    fn release_fences_earlier_runs(&self, _op: Op, _phase: Self::Phase) -> bool {
        false
    }
    /// Whether an attempt in `phase` is a cleanup's free (its second write): the cleanup has
    /// settled the execution's work (stopped its child) before sending it.
    fn freeing(&self, _phase: Self::Phase) -> bool {
        false
    }
    /// The weight the item records as held (the sample's count attribute, ours' `used`): it
    /// must equal the sum of the holders' weights (S1).
    fn stored_used(&self, store: Option<Self::Item>) -> i64;
    fn describe(&self, store: Option<Self::Item>) -> String;

    /// What of the stored item is about no execution in particular and can make a difference
    /// from now on.
    fn item_key(&self, store: Option<Self::Item>) -> u64;
    /// What of the stored item is about execution `e` and can make a difference from now on;
    /// with `item_key`, this must determine the item up to what makes no difference.
    fn item_exec_key(&self, store: Option<Self::Item>, e: u8) -> u64;
    /// What of attempt `op`'s phase can make a difference from now on, up to the name of its
    /// execution.
    fn phase_key(&self, op: Op, phase: Self::Phase) -> u64;
    /// What of a rotation in flight is about execution `e` (the fences of it that it moves).
    fn rotation_exec_key(&self, _phase: Self::Phase, _e: u8) -> u64 {
        0
    }
    /// What of a rotation in flight is about no execution in particular.
    fn rotation_key(&self, _phase: Self::Phase) -> u64 {
        0
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum End {
    Succeeded,
    Failed,
    Died,
    /// Failed because a live acquire was answered "fenced" (must never happen).
    Refused,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Stage {
    Acquiring,
    /// Told "full", in the state machine's Wait state (only with unbounded polls).
    Waiting,
    Holding,
    Releasing {
        failed: bool,
    },
    Ended(End),
}

/// Where a redrive resumes an execution: the state it stopped in. Recorded only in worlds with
/// redrives, so that the states of other worlds stay as they were.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Resume {
    /// Not redrivable (it succeeded, or the world has no redrives), or still running.
    Never,
    /// The acquire state (its Task, or the Choice after it).
    Acquire,
    /// "Wait for a free slot", after "full" (or, in one broken variant, "redriven").
    Wait,
    /// "Protected work".
    Work,
    /// "Release slot" (`failed: false`) or "Release after failure".
    Release { failed: bool },
    /// A Fail state: "Fail with the error" (or "Fail without a slot").
    FailState,
}

impl Resume {
    /// Where an execution in `stage` is stopped (or its Task fails for good).
    fn stopped_in(stage: Stage) -> Self {
        match stage {
            Stage::Acquiring => Self::Acquire,
            Stage::Waiting => Self::Wait,
            Stage::Holding => Self::Work,
            Stage::Releasing { failed } => Self::Release { failed },
            Stage::Ended(_) => Self::Never,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Exec {
    stage: Stage,
    retries_left: u8,
    polls_left: u8,
    /// Lambda invocations so far (to number attempts in traces); 0 once ended.
    invocations: u8,
    /// Its incarnation: how many times it was redriven.
    inc: u8,
    /// Where a redrive would resume it, once it has ended.
    resume: Resume,
    /// The acquisition its work's child execution is named after, while that child runs: from
    /// its acquire until the work ends, and, in a world with redrives, after the execution
    /// died in its work, until the child ends on its own or a cleanup stops it before freeing
    /// (Step Functions' own stop of the child is best effort). A run redriven into the work
    /// while it runs re-attaches to it: `StartExecution` with the name and input of a running
    /// execution returns that execution. (Without redrives the child ends with its parent, as
    /// before.)
    child: Option<u8>,
}

impl Exec {
    /// Incarnation `inc` entering its acquire state with its whole budgets (a redriven state is
    /// scheduled anew, with its whole Retry budget: a superset of any smaller one).
    fn acquiring(config: &Config, inc: u8, child: Option<u8>) -> Self {
        Self {
            stage: Stage::Acquiring,
            retries_left: config.retries,
            polls_left: config.polls.unwrap_or(0),
            invocations: 0,
            inc,
            resume: Resume::Never,
            child,
        }
    }

    /// Incarnation `inc` ended `how`, with nothing left to do; a redrive resumes it at `resume`.
    fn ended(how: End, inc: u8, resume: Resume, child: Option<u8>) -> Self {
        Self {
            stage: Stage::Ended(how),
            retries_left: 0,
            polls_left: 0,
            invocations: 0,
            inc,
            resume,
            child,
        }
    }

    fn alive(&self) -> bool {
        !matches!(self.stage, Stage::Ended(_))
    }
}

/// Who waits for an attempt's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Role {
    /// The execution's current Task attempt.
    Awaited,
    /// Nobody: its execution died or Step Functions moved on to a newer attempt.
    Zombie,
    /// The cleanup machine, for a cleanup event.
    Event,
    /// The sweeper.
    Sweep,
    /// A stray release's sender (see [`OpKind::StrayRelease`]): nobody the world follows.
    Stray,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct Attempt<P> {
    op: Op,
    role: Role,
    /// The execution's invocation number (acquire and release attempts), 0 for cleanups.
    nth: u8,
    /// The tick its request was made (see `Protocol::start`).
    requested: u8,
    phase: P,
}

/// A state of the world.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct State<I, P> {
    store: Option<I>,
    /// The executions; entries from `Config::executions` on are unused.
    execs: [Exec; MAX_EXECUTIONS],
    /// Running attempts, sorted.
    attempts: Vec<Attempt<P>>,
    /// Cleanup events not delivered yet, per execution.
    events: [u8; MAX_EXECUTIONS],
    duplicates_left: u8,
    deaths_left: u8,
    sweeps_left: u8,
    strays_left: u8,
    /// Incarnations (bit [`slot_bit`]`(e, n)`) a release or cleanup write for which has landed
    /// (for S3): a release retires the incarnation that sent it, a cleanup every incarnation of
    /// its execution that had ended when its fence landed.
    retired: u32,
    /// Incarnations an acquire of which landed after they were retired (S3 violated).
    resurrected: u32,
    /// Ticks of the clock so far, and still to come.
    now: u8,
    ticks_left: u8,
    rotations_left: u8,
    /// A rotation of the fences in flight.
    rotation: Option<P>,
    /// Executions a cleanup event for which was lost, or stopped because the execution ran again
    /// (redriven): what they hold may be left to the sweeper.
    lost: u32,
    /// Redrives still to come in this run.
    redrives_left: u8,
    /// The event emitted by the step being taken (none between steps).
    emitted: Option<u8>,
}

impl<I, P> State<I, P> {
    /// Execution `e`'s incarnation: how many times it was redriven.
    pub fn incarnation(&self, e: u8) -> u8 {
        self.execs[e as usize].inc
    }

    /// Whether execution `e` is doing its protected work.
    pub fn working(&self, e: u8) -> bool {
        self.execs[e as usize].stage == Stage::Holding
    }

    /// The acquisition execution `e`'s running child execution (its work) is named after, if
    /// one runs.
    pub fn child(&self, e: u8) -> Option<u8> {
        self.execs[e as usize].child
    }

    /// Whether execution `e` has ended (in its current run).
    pub fn ended(&self, e: u8) -> bool {
        !self.execs[e as usize].alive()
    }

    /// Whether a release or cleanup for incarnation `k` of execution `e` has landed.
    pub fn retired(&self, e: u8, k: u8) -> bool {
        self.retired & slot_bit(e, k) != 0
    }
}

/// The world around a protocol, explorable by [`crate::explore::explore`].
pub struct World<P> {
    pub protocol: P,
    pub config: Config,
}

/// The most executions a world can have.
pub const MAX_EXECUTIONS: usize = 8;
/// The most incarnations of one execution (its first run and its redrives): slots and
/// incarnations of all executions fit one `u32` mask.
pub const MAX_INCARNATIONS: usize = 4;

/// The acquisition id of incarnation `n`, as the product makes it from the redrive count.
pub fn acquisition_name(n: u8) -> String {
    format!("r{n}")
}

/// The bit of execution `e`'s acquisition (or incarnation) `k` in a mask of slots or
/// incarnations.
pub fn slot_bit(e: u8, k: u8) -> u32 {
    debug_assert!(usize::from(k) < MAX_INCARNATIONS);
    1 << (usize::from(e) * MAX_INCARNATIONS + usize::from(k))
}

/// The bits of execution `e`'s acquisitions (or incarnations) `0..n`.
fn slots_below(e: u8, n: u8) -> u32 {
    (0..n).fold(0, |m, k| m | slot_bit(e, k))
}

/// The executions (bit e) that have any bit in a mask of slots or incarnations.
fn per_exec(slots: u32) -> u32 {
    (0..MAX_EXECUTIONS as u8)
        .filter(|&e| slots & slots_below(e, MAX_INCARNATIONS as u8) != 0)
        .fold(0, |m, e| m | (1 << e))
}

/// Execution `e`'s part of a mask of slots or incarnations, as bits `0..MAX_INCARNATIONS`.
fn exec_part(slots: u32, e: u8) -> u32 {
    (slots >> (usize::from(e) * MAX_INCARNATIONS)) & ((1 << MAX_INCARNATIONS) - 1)
}

/// Names the slots or incarnations of a mask: `exec-1/r0`.
fn slot_names(mask: u32) -> String {
    let mut names = Vec::new();
    for e in 0..MAX_EXECUTIONS as u8 {
        for k in 0..MAX_INCARNATIONS as u8 {
            if mask & slot_bit(e, k) != 0 {
                names.push(format!("{}/{}", exec_name(e), acquisition_name(k)));
            }
        }
    }
    names.join(", ")
}

impl<P: Protocol> World<P> {
    pub fn new(protocol: P, config: Config) -> Self {
        assert!(
            (1..=MAX_EXECUTIONS).contains(&usize::from(config.executions)),
            "1 to {MAX_EXECUTIONS} executions"
        );
        assert!(
            usize::from(config.redrives) < MAX_INCARNATIONS,
            "at most {} redrives",
            MAX_INCARNATIONS - 1
        );
        assert!(
            (0..config.executions).all(|e| (1..=config.limit).contains(&config.weight(e))),
            "every weight from 1 to the limit"
        );
        Self { protocol, config }
    }

    fn execs<'s>(&self, s: &'s State<P::Item, P::Phase>) -> &'s [Exec] {
        &s.execs[..self.config.executions as usize]
    }

    fn ended_mask(&self, s: &State<P::Item, P::Phase>) -> u32 {
        self.execs(s)
            .iter()
            .enumerate()
            .filter(|(_, x)| !x.alive())
            .fold(0, |m, (e, _)| m | (1 << e))
    }

    fn attempt_name(&self, a: &Attempt<P::Phase>) -> String {
        let exec = exec_name(a.op.exec);
        match (a.role, a.op.kind) {
            (Role::Event, _) => format!("cleanup (event) for {exec}"),
            (Role::Sweep, _) => format!("sweeper's cleanup of {exec}"),
            (Role::Stray, _) => format!("a stray release of {exec}'s slot"),
            (role, kind) => format!(
                "{exec}{} {} #{}{}",
                if a.op.inc > 0 {
                    format!(" (redrive {})", a.op.inc)
                } else {
                    String::new()
                },
                match kind {
                    OpKind::Acquire => "acquire",
                    OpKind::Release => "release",
                    OpKind::Cleanup => "cleanup",
                    OpKind::StrayRelease => "stray release",
                },
                a.nth,
                if role == Role::Zombie {
                    " (zombie)"
                } else {
                    ""
                }
            ),
        }
    }

    fn quiescent(&self, s: &State<P::Item, P::Phase>) -> bool {
        self.execs(s)
            .iter()
            .all(|x| !x.alive() && x.child.is_none())
            && s.attempts.is_empty()
            && s.events.iter().all(|&n| n == 0)
            && s.rotation.is_none()
    }

    /// Names incarnations (or slots) of a mask: by execution alone in a world without redrives
    /// (each execution has one), else `exec-1/r1`.
    fn incarnation_names(&self, mask: u32) -> String {
        if self.config.redrives == 0 {
            names(per_exec(mask))
        } else {
            slot_names(mask)
        }
    }

    /// A cleanup of execution `e` by `role`, for the incarnation it is in and a request made
    /// now.
    fn cleanup(&self, s: &State<P::Item, P::Phase>, e: u8, role: Role) -> Attempt<P::Phase> {
        let op = Op {
            kind: OpKind::Cleanup,
            exec: e,
            inc: s.execs[e as usize].inc,
        };
        Attempt {
            op,
            role,
            nth: 0,
            requested: s.now,
            phase: self.protocol.start(op, s.now),
        }
    }

    fn sweeping(s: &State<P::Item, P::Phase>) -> bool {
        s.attempts.iter().any(|a| a.role == Role::Sweep)
    }

    /// Starts a new invocation of `kind` for execution `e`, awaited by it, for a request made
    /// now (a state entered now).
    fn invoke(&self, s: &mut State<P::Item, P::Phase>, e: u8, kind: OpKind, words: &mut Words) {
        let now = s.now;
        self.invoke_requested(s, e, kind, now, words);
    }

    /// Starts a new invocation of `kind` for execution `e` for a request made at tick
    /// `requested` (a Step Functions retry keeps the state's entry time).
    fn invoke_requested(
        &self,
        s: &mut State<P::Item, P::Phase>,
        e: u8,
        kind: OpKind,
        requested: u8,
        words: &mut Words,
    ) {
        let x = &mut s.execs[e as usize];
        let op = Op {
            kind,
            exec: e,
            inc: x.inc,
        };
        x.invocations += 1;
        let attempt = Attempt {
            op,
            role: Role::Awaited,
            nth: x.invocations,
            requested,
            phase: self.protocol.start(op, requested),
        };
        words.say(|| {
            format!(
                "{} starts ({})",
                self.attempt_name(&attempt),
                self.protocol.describe_start(op)
            )
        });
        s.attempts.push(attempt);
    }

    /// Ends execution `e`, stopped in `resume`; its running attempts become zombies. FAILED
    /// (and a death) emits a cleanup event, SUCCEEDED does not.
    fn end(
        &self,
        s: &mut State<P::Item, P::Phase>,
        e: u8,
        how: End,
        resume: Resume,
        words: &mut Words,
    ) {
        let redrivable = self.config.redrives > 0 && how != End::Succeeded;
        let x = s.execs[e as usize];
        s.execs[e as usize] = Exec::ended(
            how,
            x.inc,
            if redrivable { resume } else { Resume::Never },
            // A child still running when its parent dies runs on (see `Exec::child`).
            x.child.filter(|_| self.config.redrives > 0),
        );
        if how != End::Succeeded {
            // What becomes of the event (delivered, lost, or delivered twice) is chosen when it
            // is emitted, see `Successors::add`.
            debug_assert!(s.emitted.is_none(), "one step ends at most one execution");
            s.emitted = Some(e);
            words.say(|| format!("; a cleanup event for {} is emitted", exec_name(e)));
        }
        for a in s.attempts.iter_mut() {
            if a.op.exec == e && a.role == Role::Awaited {
                let running = *a;
                a.role = Role::Zombie;
                words.say(|| {
                    format!(
                        "; {} keeps running as a zombie",
                        self.attempt_name(&running)
                    )
                });
            }
        }
    }

    /// Step Functions redrives ended execution `e`: its next incarnation runs from the state
    /// the last one stopped in, with the same ARN and input. The old incarnation's attempts keep
    /// running as zombies; its cleanup events stay pending.
    fn redrive(&self, s: &mut State<P::Item, P::Phase>, e: u8, words: &mut Words) {
        let x = s.execs[e as usize];
        let inc = x.inc + 1;
        s.redrives_left -= 1;
        s.execs[e as usize] = Exec::acquiring(&self.config, inc, x.child);
        let acquisition = acquisition_name(self.protocol.acquisition_of(inc));
        words.say(|| {
            format!(
                "Step Functions redrives {} (redrive {inc}: acquisition {acquisition}): ",
                exec_name(e)
            )
        });
        match x.resume {
            Resume::Acquire => {
                words.say(|| "it enters its acquire state again: ".to_owned());
                self.invoke(s, e, OpKind::Acquire, words);
            }
            Resume::Wait => {
                s.execs[e as usize].stage = Stage::Waiting;
                words.say(|| "it waits for a free slot again".to_owned());
            }
            Resume::Work if x.child.is_some() => {
                // The work task's StartExecution names the child of the acquisition in the
                // state's input, which still runs: Step Functions returns that execution and
                // the new run waits for it, working under the old run's slot.
                s.execs[e as usize].stage = Stage::Holding;
                words.say(|| {
                    format!(
                        "its protected work starts the child execution named after {}, which \
                         still runs: StartExecution returns it, and {} waits for it \
                         (re-attached)",
                        acquisition_name(self.protocol.acquisition_of(x.child.unwrap_or(0))),
                        exec_name(e)
                    )
                });
            }
            Resume::Work if self.protocol.guards_redriven_work() => {
                // The work task starts the child execution named after the old acquisition,
                // which exists already: ExecutionAlreadyExists, caught; "Release after failure"
                // names the error SemaphoreRedriveRefused and the execution fails with it.
                s.execs[e as usize].stage = Stage::Releasing { failed: true };
                words.say(|| {
                    "its protected work meets the child execution named after the old \
                     acquisition (ExecutionAlreadyExists) and does not run; Release after \
                     failure (SemaphoreRedriveRefused): "
                        .to_owned()
                });
                self.invoke(s, e, OpKind::Release, words);
            }
            Resume::Work => {
                s.execs[e as usize].stage = Stage::Holding;
                s.execs[e as usize].child = Some(inc);
                words.say(|| {
                    "it runs its protected work again (no guard: broken variant)".to_owned()
                });
            }
            Resume::Release { failed } => {
                s.execs[e as usize].stage = Stage::Releasing { failed };
                words.say(|| "it releases again: ".to_owned());
                self.invoke(s, e, OpKind::Release, words);
            }
            Resume::FailState => {
                words.say(|| format!("it resumes at its Fail state => {} fails", exec_name(e)));
                self.end(s, e, End::Failed, Resume::FailState, words);
            }
            Resume::Never => unreachable!("only a redrivable execution is redriven"),
        }
    }

    /// The execution's reaction to the answer of its current attempt.
    fn answered(
        &self,
        s: &mut State<P::Item, P::Phase>,
        a: Attempt<P::Phase>,
        answer: Answer,
        words: &mut Words,
    ) {
        let e = a.op.exec;
        let name = || exec_name(e);
        let x = s.execs[e as usize];
        match (a.op.kind, answer) {
            (OpKind::Acquire, Answer::Acquired) => {
                s.execs[e as usize].stage = Stage::Holding;
                s.execs[e as usize].child = Some(x.inc);
                words.say(|| format!(" => {} holds a slot and does its work", name()));
            }
            // "redriven" (one broken variant's) is answered as "full" is: wait, ask again.
            (OpKind::Acquire, Answer::Full | Answer::Redriven) if self.config.polls.is_none() => {
                s.execs[e as usize].stage = Stage::Waiting;
                words.say(|| format!(" => {} waits", name()));
            }
            (OpKind::Acquire, Answer::Full | Answer::Redriven) if x.polls_left > 0 => {
                s.execs[e as usize].polls_left -= 1;
                words.say(|| format!(" => {} waits, then ", name()));
                self.invoke(s, e, OpKind::Acquire, words);
            }
            (OpKind::Acquire, Answer::Full | Answer::Redriven) => {
                s.execs[e as usize].stage = Stage::Releasing { failed: true };
                words.say(|| format!(" => {} gives up waiting; ", name()));
                self.invoke(s, e, OpKind::Release, words);
            }
            (OpKind::Acquire, Answer::Expired) => {
                words.say(|| format!(" => {} enters its acquire state again: ", name()));
                self.invoke(s, e, OpKind::Acquire, words);
            }
            (OpKind::Acquire, Answer::Fenced) => {
                words.say(|| format!(" => {} is refused and fails", name()));
                self.end(s, e, End::Refused, Resume::FailState, words);
            }
            (kind, Answer::Lost) if x.retries_left > 0 => {
                s.execs[e as usize].retries_left -= 1;
                words.say(|| " => Step Functions retries the task: ".to_owned());
                self.invoke_requested(s, e, kind, a.requested, words);
            }
            (OpKind::Acquire, Answer::Lost) => {
                s.execs[e as usize].stage = Stage::Releasing { failed: true };
                words.say(|| " => acquire failed for good; ".to_owned());
                self.invoke(s, e, OpKind::Release, words);
            }
            (OpKind::Release, Answer::Done) => {
                if matches!(x.stage, Stage::Releasing { failed: true }) {
                    words.say(|| format!(" => {} fails", name()));
                    self.end(s, e, End::Failed, Resume::FailState, words);
                } else {
                    words.say(|| format!(" => {} succeeds", name()));
                    self.end(s, e, End::Succeeded, Resume::Never, words);
                }
            }
            (OpKind::Release, _) => {
                // The release Task has no Catch: the execution fails in it, and a redrive runs
                // it again.
                words.say(|| format!(" => release failed for good; {} fails", name()));
                self.end(s, e, End::Failed, Resume::stopped_in(x.stage), words);
            }
            (kind, answer) => unreachable!("{kind:?} answered {answer:?}"),
        }
    }

    /// What happens when attempt `a` has finished with `answer`.
    fn finished(
        &self,
        s: &mut State<P::Item, P::Phase>,
        a: Attempt<P::Phase>,
        answer: Answer,
        words: &mut Words,
    ) {
        match a.role {
            Role::Awaited => self.answered(s, a, answer, words),
            Role::Zombie => words.say(|| " (nobody waits for the answer)".to_owned()),
            Role::Event if answer == Answer::Lost => {
                s.events[a.op.exec as usize] += 1;
                words.say(|| " => the cleanup machine will retry it".to_owned());
            }
            // A cleanup that stopped because its execution runs again leaves what the old runs
            // hold to the execution itself: its release (which frees the earlier runs', see
            // `Protocol::release_fences_earlier_runs`), or the cleanup of its next end. Not to the
            // sweeper: a slot the sweeper reclaims is a leak notice (S2).
            Role::Event | Role::Sweep => {}
            Role::Stray => words.say(|| " (a stray: nobody waits for the answer)".to_owned()),
        }
    }

    /// One step of attempt `a`, which the caller has taken out of `s.attempts`.
    fn step(&self, s: &mut State<P::Item, P::Phase>, a: Attempt<P::Phase>, words: &mut Words) {
        let e = a.op.exec;
        let x = s.execs[e as usize];
        let advance = self
            .protocol
            .advance(a.op, a.phase, s.store, s.now, x.alive(), words.log());
        s.store = advance.store;
        // S3: from the moment a release or cleanup for an incarnation has landed, no acquire of
        // that incarnation may land. A cleanup is for the incarnation the execution had ended in
        // when the cleanup began, and every one before it; not for one redriven since.
        let incarnation = slot_bit(e, a.op.inc);
        if advance.wrote {
            match a.op.kind {
                OpKind::Release if self.protocol.release_fences_earlier_runs(a.op, a.phase) => {
                    s.retired |= slots_below(e, a.op.inc);
                }
                OpKind::Release | OpKind::StrayRelease => s.retired |= incarnation,
                OpKind::Cleanup => s.retired |= slots_below(e, a.op.inc + 1),
                OpKind::Acquire if s.retired & incarnation != 0 => s.resurrected |= incarnation,
                OpKind::Acquire => {}
            }
        }
        match advance.next {
            Next::Continue(phase) => {
                if a.op.kind == OpKind::Cleanup
                    && self.protocol.freeing(phase)
                    && !self.protocol.freeing(a.phase)
                {
                    // Before it frees, the cleanup settles the work: it stops a child still
                    // running, once it has found the execution not running (the real protocol
                    // asks in this very step). A broken variant that frees without asking
                    // again may find it running: its work is left as it is, to show the loss.
                    let x = &mut s.execs[e as usize];
                    let orphan = if x.alive() { None } else { x.child.take() };
                    if let Some(k) = orphan {
                        words.say(|| {
                            format!(
                                "; it stops {}'s child execution (of {}) before freeing",
                                exec_name(e),
                                acquisition_name(self.protocol.acquisition_of(k))
                            )
                        });
                    }
                }
                s.attempts.push(Attempt { phase, ..a });
            }
            Next::Finished(answer) => self.finished(s, a, answer, words),
        }
    }

    /// What identifies execution `e` in state `s`, apart from its name (see `identify`).
    fn exec_key(&self, s: &State<P::Item, P::Phase>, e: u8, holders: u32) -> u64 {
        let x = s.execs[e as usize];
        let pending = s.events[e as usize] > 0 || s.attempts.iter().any(|a| a.op.exec == e);
        // How an execution ended makes no difference to what happens next (its event, if any,
        // is already emitted), except that a refusal violates L1.
        let stage = match x.stage {
            Stage::Ended(how) => Err(how == End::Refused),
            stage => Ok(stage),
        };
        let redrivable = s.redrives_left > 0 && x.resume != Resume::Never;
        if stage.is_err() && !pending && holders & (1 << e) == 0 && !redrivable && x.child.is_none()
        {
            // Finished: nothing will ever act for this execution again, and only requests for
            // it could read what the item says about it.
            return hash_one(&stage);
        }
        // The attempts for this execution, as a multiset: sorted keys.
        let mut attempts = [0u64; 32];
        let mut n = 0;
        for a in s.attempts.iter().filter(|a| a.op.exec == e) {
            assert!(
                n < attempts.len(),
                "more than 32 attempts for one execution"
            );
            // The request time is carried over to a retry of an acquire only.
            let requested = (a.op.kind == OpKind::Acquire).then_some(a.requested);
            attempts[n] = hash_one(&(
                a.op.kind,
                a.op.inc,
                a.role,
                requested,
                self.protocol.phase_key(a.op, a.phase),
            ));
            n += 1;
        }
        let attempts = &mut attempts[..n];
        attempts.sort_unstable();
        let bit = |mask: u32| mask & (1 << e) != 0;
        let rotation = s
            .rotation
            .map(|phase| self.protocol.rotation_exec_key(phase, e));
        hash_one(&(
            (
                stage,
                x.retries_left,
                x.polls_left,
                x.inc,
                x.resume,
                x.child,
            ),
            // Executions of different weights are not interchangeable.
            self.config.weight(e),
            self.protocol.item_exec_key(s.store, e),
            &*attempts,
            s.events[e as usize],
            (
                exec_part(s.retired, e),
                exec_part(s.resurrected, e),
                bit(s.lost),
            ),
            rotation,
        ))
    }

    /// The last sweep, once everything has ended: every holder is cleaned up, one at a time,
    /// with nothing else running. Returns the item afterwards (as it is, without a sweeper) and
    /// what was done.
    fn final_sweep(
        &self,
        s: &State<P::Item, P::Phase>,
        logging: bool,
    ) -> (Option<P::Item>, String) {
        let (mut store, now) = (s.store, s.now);
        let mut log = String::new();
        if !self.config.sweeper {
            return (store, log);
        }
        let holders = per_exec(self.protocol.holders(store));
        for e in 0..self.config.executions {
            if holders & (1 << e) == 0 {
                continue;
            }
            let Attempt { op, mut phase, .. } = self.cleanup(s, e, Role::Sweep);
            if logging {
                log.push_str(&format!(" cleanup of {}:", exec_name(e)));
            }
            // The fence, then the free, landing at once: nothing else runs.
            for _ in 0..3 {
                let mut words = String::new();
                // Everything has ended: nothing runs again.
                let advance = self.protocol.advance(
                    op,
                    phase,
                    store,
                    now,
                    false,
                    logging.then_some(&mut words),
                );
                if logging {
                    log.push_str(&format!(" {words};"));
                }
                store = advance.store;
                match advance.next {
                    Next::Continue(next) => phase = next,
                    Next::Finished(_) => break,
                }
            }
        }
        (store, log)
    }
}

impl<P: Protocol> Emitting for World<P> {
    type State = State<P::Item, P::Phase>;

    fn take_emitted(&self, s: &mut Self::State) -> Option<u8> {
        s.emitted.take()
    }

    fn allows(&self, s: &Self::State, fate: Fate) -> bool {
        match fate {
            Fate::Delivered => true,
            Fate::Lost => self.config.lost_events,
            Fate::Twice => s.duplicates_left > 0,
        }
    }

    fn doom(&self, s: &mut Self::State, e: u8, fate: Fate) {
        match fate {
            Fate::Delivered => s.events[e as usize] += 1,
            Fate::Lost => s.lost |= 1 << e,
            Fate::Twice => {
                s.duplicates_left -= 1;
                s.events[e as usize] += 2;
            }
        }
    }

    fn normalize(&self, s: &mut Self::State) {
        s.attempts.sort_unstable();
    }
}

impl<P: Protocol> Model for World<P> {
    type State = State<P::Item, P::Phase>;

    fn initial(&self) -> Self::State {
        let c = &self.config;
        let mut s = State {
            store: self.protocol.initial_item(),
            execs: [Exec::ended(End::Succeeded, 0, Resume::Never, None); MAX_EXECUTIONS],
            attempts: Vec::new(),
            events: [0; MAX_EXECUTIONS],
            duplicates_left: c.duplicates,
            deaths_left: c.deaths,
            sweeps_left: if c.sweeper { c.sweeps } else { 0 },
            strays_left: c.strays,
            retired: 0,
            resurrected: 0,
            now: 0,
            ticks_left: c.ticks,
            rotations_left: c.rotations,
            rotation: None,
            lost: 0,
            redrives_left: c.redrives,
            emitted: None,
        };
        for x in &mut s.execs[..c.executions as usize] {
            *x = Exec::acquiring(c, 0, None);
        }
        for e in 0..c.executions {
            self.invoke(&mut s, e, OpKind::Acquire, &mut Words::new(false));
        }
        self.normalize(&mut s);
        s
    }

    fn describe_initial(&self, s: &Self::State) -> String {
        format!(
            "{}; the lock: {}; {} start, each with acquire #1 ({})",
            self.protocol.name(),
            self.protocol.describe(s.store),
            names((1u32 << self.config.executions) - 1),
            self.protocol.describe_start(Op {
                kind: OpKind::Acquire,
                exec: 0,
                inc: 0,
            }),
        )
    }

    fn successors(
        &self,
        s: &Self::State,
        out: &mut Vec<Self::State>,
        labels: Option<&mut Vec<String>>,
    ) {
        let mut successors = Successors::new(out, labels);

        // An attempt takes its next step at the table, or its write in flight is lost.
        for (i, &a) in s.attempts.iter().enumerate() {
            successors.make(self, s, |t, words| {
                t.attempts.remove(i);
                words.say(|| format!("{}: ", self.attempt_name(&a)));
                self.step(t, a, words);
            });
            if self.config.lost_writes && self.protocol.in_flight(a.phase) {
                successors.make(self, s, |t, words| {
                    t.attempts.remove(i);
                    words.say(|| {
                        format!(
                            "{}: its write is lost in the network",
                            self.attempt_name(&a)
                        )
                    });
                    self.finished(t, a, Answer::Lost, words);
                });
            }
        }

        for e in 0..self.config.executions {
            let x = s.execs[e as usize];
            if x.stage == Stage::Waiting {
                successors.make(self, s, |t, words| {
                    t.execs[e as usize].stage = Stage::Acquiring;
                    words.say(|| format!("{} is done waiting: ", exec_name(e)));
                    self.invoke(t, e, OpKind::Acquire, words);
                });
                successors.make(self, s, |t, words| {
                    t.execs[e as usize].stage = Stage::Releasing { failed: true };
                    words.say(|| format!("{} gives up waiting: ", exec_name(e)));
                    self.invoke(t, e, OpKind::Release, words);
                });
            }
            // F15: a release that names this execution's slot (it works under it) but shows
            // another slot's token is sent, at any moment.
            if x.stage == Stage::Holding && s.strays_left > 0 {
                successors.make(self, s, |t, words| {
                    t.strays_left -= 1;
                    let op = Op {
                        kind: OpKind::StrayRelease,
                        exec: e,
                        inc: x.inc,
                    };
                    let a = Attempt {
                        op,
                        role: Role::Stray,
                        nth: 0,
                        requested: t.now,
                        phase: self.protocol.start(op, t.now),
                    };
                    words.say(|| {
                        format!(
                            "a stray release names {}'s slot, showing another slot's token: ",
                            exec_name(e)
                        )
                    });
                    self.step(t, a, words);
                });
            }
            if x.stage == Stage::Holding {
                for failed in [false, true] {
                    if failed && !self.config.work_failures {
                        continue;
                    }
                    successors.make(self, s, |t, words| {
                        t.execs[e as usize].child = None;
                        t.execs[e as usize].stage = Stage::Releasing { failed };
                        words.say(|| match failed {
                            false => format!("{} finishes its work: ", exec_name(e)),
                            true => format!("{}'s work fails: ", exec_name(e)),
                        });
                        self.invoke(t, e, OpKind::Release, words);
                    });
                }
            }
            if !x.alive() {
                if let Some(k) = x.child {
                    successors.make(self, s, |t, words| {
                        t.execs[e as usize].child = None;
                        words.say(|| {
                            format!(
                                "the child execution of {} (of {}) ends on its own",
                                exec_name(e),
                                acquisition_name(self.protocol.acquisition_of(k))
                            )
                        });
                    });
                }
                continue;
            }
            // Step Functions gives up waiting for the current attempt (a timeout, or its
            // response was lost) and starts another with the same input.
            if x.retries_left > 0 {
                if let Some(i) = s.attempts.iter().position(|a| {
                    a.op.exec == e
                        && a.role == Role::Awaited
                        && (a.op.kind == OpKind::Acquire || self.config.release_timeouts)
                }) {
                    successors.make(self, s, |t, words| {
                        let old = t.attempts[i];
                        t.attempts[i].role = Role::Zombie;
                        t.execs[e as usize].retries_left -= 1;
                        // The retry is made within the same state entry: same request time.
                        words.say(|| {
                            format!(
                                "Step Functions times out {} (it keeps running as a zombie) and retries: ",
                                self.attempt_name(&old)
                            )
                        });
                        self.invoke_requested(t, e, old.op.kind, old.requested, words);
                    });
                }
            }
            if s.deaths_left > 0 {
                successors.make(self, s, |t, words| {
                    t.deaths_left -= 1;
                    words.say(|| format!("{} dies (stopped or timed out)", exec_name(e)));
                    self.end(t, e, End::Died, Resume::stopped_in(x.stage), words);
                });
            }
        }

        // Step Functions redrives an execution that ended FAILED, ABORTED or TIMED_OUT. (One
        // refused while running has violated L1 already: its state is not explored further.)
        if s.redrives_left > 0 {
            for e in 0..self.config.executions {
                let x = s.execs[e as usize];
                if x.resume != Resume::Never
                    && matches!(x.stage, Stage::Ended(End::Died | End::Failed))
                {
                    successors.make(self, s, |t, words| self.redrive(t, e, words));
                }
            }
        }

        // Cleanup events are delivered in any order and at any time; the cleanup reads at once.
        for e in 0..self.config.executions {
            if s.events[e as usize] == 0 {
                continue;
            }
            successors.make(self, s, |t, words| {
                t.events[e as usize] -= 1;
                words.say(|| {
                    format!(
                        "the cleanup event for {} is delivered; cleanup: ",
                        exec_name(e)
                    )
                });
                let a = self.cleanup(s, e, Role::Event);
                self.step(t, a, words);
            });
        }

        // The sweeper lists the lock and asks about every holder. A sweep that finds no holder
        // whose execution has ended does nothing but use up a sweep, so it is not explored: its
        // successor can do no more than the state it comes from.
        // An execution redriven since it ended runs: the sweeper leaves its slots alone (and
        // the model's sweeper asks `DescribeExecution` when it lists the lock).
        let ended = per_exec(self.protocol.holders(s.store)) & self.ended_mask(s);
        if self.config.sweeper && !Self::sweeping(s) && s.sweeps_left > 0 && ended != 0 {
            successors.make(self, s, |t, words| {
                t.sweeps_left -= 1;
                for e in (0..self.config.executions).filter(|e| ended & (1 << e) != 0) {
                    t.attempts.push(self.cleanup(s, e, Role::Sweep));
                }
                words.say(|| {
                    format!(
                        "the sweeper lists the lock ({}): {} ended; it cleans up {}",
                        self.protocol.describe(s.store),
                        names(ended),
                        if ended.count_ones() == 1 {
                            "it"
                        } else {
                            "them"
                        }
                    )
                });
            });
        }

        // The clock moves on by a tick.
        if s.ticks_left > 0 && !self.quiescent(s) {
            successors.make(self, s, |t, words| {
                t.ticks_left -= 1;
                t.now += 1;
                words.say(|| format!("a tick of the clock passes (now tick {})", t.now));
            });
        }

        // A writer that has just seen the item rotates its fences, if a rotation is due, and the
        // rotation lands at any later moment.
        if s.rotation.is_none() && s.rotations_left > 0 {
            if let Some(phase) = self.protocol.rotation(s.store, s.now) {
                successors.make(self, s, |t, words| {
                    t.rotations_left -= 1;
                    t.rotation = Some(phase);
                    words.say(|| {
                        format!(
                            "a writer sees {} and sends a rotation of the fences [in flight]",
                            self.protocol.describe(s.store)
                        )
                    });
                });
            }
        }
        if let Some(phase) = s.rotation {
            successors.make(self, s, |t, words| {
                t.rotation = None;
                words.say(|| "the rotation of the fences: ".to_owned());
                t.store = self.protocol.land_rotation(phase, s.store, words.log());
            });
        }
    }

    fn check(&self, s: &Self::State) -> Result<(), Violation> {
        let holders = self.protocol.holders(s.store);
        // F14: the operator's limit, not the one the executions ask for.
        let limit = self.config.configured_limit.unwrap_or(self.config.limit);
        let held = self.config.weight_of_slots(holders);
        if held > limit {
            return Err(Violation {
                property: "S1",
                detail: format!(
                    "{} slots of weight {held} held with limit {limit}: {}",
                    holders.count_ones(),
                    self.protocol.describe(s.store)
                ),
            });
        }
        let used = self.protocol.stored_used(s.store);
        if used != i64::from(held) {
            return Err(Violation {
                property: "S1",
                detail: format!(
                    "the item records {used} held but the holders' weights add up to {held}: {}",
                    self.protocol.describe(s.store)
                ),
            });
        }
        // The child execution is the work: while it runs (its parent working, re-attached, or
        // ended with the child not stopped yet), the acquisition it is named after holds a slot.
        let mut working = 0u32;
        let mut without = 0u32;
        for (e, x) in self.execs(s).iter().enumerate() {
            if let Some(k) = x.child {
                let e = e as u8;
                working |= 1 << e;
                if holders & slot_bit(e, self.protocol.acquisition_of(k)) == 0 {
                    without |= slot_bit(e, k);
                }
            }
        }
        if self.config.weight_of(working) > limit {
            return Err(Violation {
                property: "S1",
                detail: format!(
                    "{} are working under the lock (weight {}, limit {limit}), but the item is {}",
                    names(working),
                    self.config.weight_of(working),
                    self.protocol.describe(s.store)
                ),
            });
        }
        if without != 0 {
            return Err(Violation {
                property: "S1",
                detail: format!(
                    "{} {} working under the lock without holding a slot{}: {}",
                    self.incarnation_names(without),
                    if without.count_ones() == 1 {
                        "is"
                    } else {
                        "are"
                    },
                    if self.config.redrives > 0 {
                        " of the acquisition its child execution is named after"
                    } else {
                        ""
                    },
                    self.protocol.describe(s.store)
                ),
            });
        }
        if s.resurrected != 0 {
            return Err(Violation {
                property: "S3",
                detail: format!(
                    "an acquire of {} landed after a release or cleanup for it had: {}",
                    self.incarnation_names(s.resurrected),
                    self.protocol.describe(s.store)
                ),
            });
        }
        if let Some(e) = s
            .execs
            .iter()
            .position(|x| x.stage == Stage::Ended(End::Refused))
        {
            return Err(Violation {
                property: "L1",
                detail: format!(
                    "{} was refused (fenced) while it was running",
                    exec_name(e as u8)
                ),
            });
        }
        // S2, one execution at a time: once it has ended, none of its requests is running and
        // its cleanup events (if any) were all delivered, it holds nothing, unless an event for
        // it was lost (that is the sweeper's case, below).
        let mut settled = self.ended_mask(s) & !s.lost;
        for a in &s.attempts {
            settled &= !(1 << a.op.exec);
        }
        for (e, &n) in s.events.iter().enumerate() {
            if n > 0 {
                settled &= !(1 << e);
            }
        }
        if per_exec(holders) & settled != 0 {
            return Err(Violation {
                property: "S2",
                detail: format!(
                    "{} has ended, none of its requests is in flight and no cleanup event for it \
                     is pending or was lost, yet it holds a slot, for ever{}: {}",
                    names(per_exec(holders) & settled),
                    if self.config.sweeper {
                        " unless the sweeper reclaims it"
                    } else {
                        " (there is no sweeper)"
                    },
                    self.protocol.describe(s.store)
                ),
            });
        }
        // S2 at quiescence: everything has ended and every request and event is delivered or
        // lost; then one sweep (if there is a sweeper) must leave nothing held.
        if self.quiescent(s) {
            let left = per_exec(self.protocol.holders(self.final_sweep(s, false).0));
            if left != 0 {
                let (store, log) = self.final_sweep(s, true);
                return Err(Violation {
                    property: "S2",
                    detail: format!(
                        "everything has ended and every request and event is delivered or lost; {}, \
                         {} (ended) still holds a slot: {}",
                        if self.config.sweeper {
                            format!("after one more sweep ({log})")
                        } else {
                            "with no sweeper".to_owned()
                        },
                        names(left),
                        self.protocol.describe(store)
                    ),
                });
            }
        }
        Ok(())
    }

    fn may_stop(&self, s: &Self::State) -> bool {
        self.quiescent(s)
    }

    /// A state is identified by what can make a difference to its future and to its
    /// properties, up to a renaming of the executions: one key per execution (its stage and
    /// budgets, what the item says about it, its running attempts as a multiset of what the
    /// protocol says matters of their phases, its pending events and bits), taken as a multiset,
    /// plus what is about no execution in particular. Attempt numbers, which only name attempts
    /// in traces, are left out, and so is everything about an execution that has finished
    /// (ended, nothing running or pending for it, holding nothing): nothing reads it again.
    fn identify(&self, s: &Self::State, h: &mut Fingerprint) {
        let holders = per_exec(self.protocol.holders(s.store));
        let mut keys = [0u64; MAX_EXECUTIONS];
        let keys = &mut keys[..self.config.executions as usize];
        for (e, key) in keys.iter_mut().enumerate() {
            *key = self.exec_key(s, e as u8, holders);
        }
        keys.sort_unstable();
        (*keys).hash(h);
        (
            self.protocol.item_key(s.store),
            s.duplicates_left,
            s.deaths_left,
            s.sweeps_left,
            s.redrives_left,
            s.strays_left,
        )
            .hash(h);
        (
            s.now,
            s.ticks_left,
            s.rotations_left,
            s.rotation.map(|phase| self.protocol.rotation_key(phase)),
        )
            .hash(h);
        debug_assert!(s.emitted.is_none());
    }

    /// Everything but the attempt numbers (names in traces, which grow with every poll).
    fn identify_exactly(&self, s: &Self::State, h: &mut Fingerprint) {
        s.store.hash(h);
        for x in self.execs(s) {
            (
                x.stage,
                x.retries_left,
                x.polls_left,
                x.inc,
                x.resume,
                x.child,
            )
                .hash(h);
        }
        let mut attempts: Vec<_> = s
            .attempts
            .iter()
            .map(|a| (a.op, a.role, a.requested, a.phase))
            .collect();
        attempts.sort_unstable();
        attempts.hash(h);
        (
            s.events,
            s.duplicates_left,
            s.deaths_left,
            s.sweeps_left,
            s.retired,
            s.resurrected,
            s.lost,
            s.redrives_left,
            s.strays_left,
        )
            .hash(h);
        (s.now, s.ticks_left, s.rotations_left, s.rotation).hash(h);
    }
}
