//! Clean up after an ended execution: the cleanup function's flow, for one execution that ended
//! (FAILED, TIMED_OUT or ABORTED) without releasing what it held, on every lock its acquire
//! tasks asked for.
//!
//! It asks Step Functions first: an execution running again was redriven since it ended and
//! needs what it holds (F7), so it is left alone; else it ended in some run, the one its fences
//! stop. Then the caller says which locks and lines its acquire tasks used (it reads the
//! execution's history). The flow fences every lock, so that no delayed or zombie acquire of the
//! ended runs lands afterwards (F1-F3), and takes the execution out of every line it is found
//! in (F8). With the fences standing it asks Step Functions again: an execution redriven
//! meanwhile keeps what it holds, fenced (its new run is not). Then its work: while any still
//! runs under the slots, nothing is freed, and the cleanup is asked again later. Last it frees
//! what each fence saw, and moves each line that a freed slot can serve.
//!
//! A store call that fails on one lock does not keep the others from being cleaned: the lock is
//! named in [`Cleaned::failed`] and skipped from there on, and the cleanup asked again (every
//! step is idempotent).
//!
//! The flow is [`CleanupFlow`]: [`CleanupFlow::start`] gives its first [`Call`], and
//! [`CleanupFlow::resume`] takes each call's [`Reply`] and gives the next, until it is done with
//! what it [`Cleaned`], or a [`Refusal`].

pub mod answer;

use crate::input::{HolderId, LockName};
use crate::item::Run;
use crate::protocol::{CleanupOutcome, Fenced};
use crate::queue::WaiterId;

/// What the flow needs done next: an operation of [`crate::Semaphore`] on one lock, a question to
/// Step Functions, or one of the caller's.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Call {
    /// Whether the execution runs, and in which run it ended ([`crate::ExecutionStatus`]):
    /// [`Reply::Execution`]. Asked first, and again once the fences stand.
    Describe,
    /// Which locks and lines its acquire tasks used (the caller reads its history):
    /// [`Reply::Locks`].
    FindLocks,
    /// Fence the runs up to `run` on `lock` ([`crate::Semaphore::fence`]): [`Reply::Fenced`].
    Fence { lock: LockName, run: Run },
    /// Read the execution's record `id` in `lock`'s line ([`crate::Semaphore::waiter`]):
    /// [`Reply::InLine`].
    ReadWaiter { lock: LockName, id: WaiterId },
    /// Take it out of the line ([`crate::Semaphore::leave`]): [`Reply::InLine`].
    Leave { lock: LockName, id: WaiterId },
    /// Stop the execution's work where it can be stopped (the caller's), and say whether any
    /// still runs: [`Reply::WorkRuns`].
    StopWork,
    /// Free the slots a fence saw ([`crate::Semaphore::free`]): [`Reply::Freed`].
    Free(Fenced),
    /// Move `lock`'s line ([`crate::Semaphore::hand_off`]): [`Reply::HandedOff`].
    HandOff { lock: LockName },
}

impl Call {
    /// The lock and the step of a store call (the calls [`Reply::Failed`] may answer).
    pub fn lock_step(&self) -> Option<(&LockName, LockStep)> {
        match self {
            Self::Fence { lock, .. } => Some((lock, LockStep::Fence)),
            Self::ReadWaiter { lock, .. } => Some((lock, LockStep::ReadLine)),
            Self::Leave { lock, .. } => Some((lock, LockStep::LeaveLine)),
            Self::Free(fenced) => Some((&fenced.lock, LockStep::Free)),
            Self::Describe | Self::FindLocks | Self::StopWork | Self::HandOff { .. } => None,
        }
    }
}

/// What became of a [`Call`].
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Reply {
    Execution(Execution),
    /// `None`: they cannot be told (the execution's history is gone, or too long to read).
    Locks(Option<Locks>),
    Fenced(Fenced),
    /// Whether the record was in line when read, or when the leave landed.
    InLine(bool),
    WorkRuns(bool),
    Freed(CleanupOutcome),
    /// How many waiters the hand-off granted a slot.
    HandedOff {
        woken: usize,
    },
    /// The store call failed on its lock (the driver keeps the error).
    Failed,
}

/// What Step Functions says of the execution.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Execution {
    /// Running, or about to run again (a redrive in progress).
    Running,
    /// Ended, in this run (its redrive count).
    Ended { run: Run },
    /// It does not exist (any more).
    Missing,
    /// Nothing can be told of it: not an execution Step Functions answers for.
    Untold,
}

/// The locks an ended execution's acquire tasks asked for, and the lines they may have put it
/// in.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct Locks {
    /// Each once, in the order first asked.
    pub locks: Vec<LockName>,
    /// Each once: the lock, and the record the execution would wait under.
    pub waiters: Vec<(LockName, WaiterId)>,
}

/// A store call on one lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LockStep {
    Fence,
    ReadLine,
    LeaveLine,
    Free,
}

impl LockStep {
    /// As the cleanup's error names it.
    pub fn describe(self) -> &'static str {
        match self {
            Self::Fence => "fencing",
            Self::ReadLine => "reading the line",
            Self::LeaveLine => "leaving the line",
            Self::Free => "freeing",
        }
    }
}

/// What the flow does next.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Next {
    Call(Call),
    Done(Result<Cleaned, Refusal>),
}

/// Where a cleanup stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum End {
    /// The execution runs again (redriven since it ended): nothing done.
    RunsAgain,
    /// It does not exist (any more): nothing can be read, nothing done; the sweeper frees what
    /// it holds.
    Missing,
    /// Which locks it used cannot be told: nothing done (the sweeper judges what it holds).
    LocksUntold,
    /// It asked for no lock: nothing to do.
    NoLocks,
    /// Fenced, then found running again (redriven while the cleanup ran): what it holds is kept,
    /// fenced; its release, or the cleanup of its next end, frees it.
    RedrivenMeanwhile,
    /// Fenced; its work still runs under the slots: nothing freed, ask again.
    WorkRuns,
    /// Fenced and freed, at `at_ms` (when the last free was answered: what the time held counts
    /// to).
    Freed { at_ms: u64 },
}

/// One lock the execution was fenced on.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct LockCleaned {
    pub fenced: Fenced,
    /// What its free did; `None` when it was not freed (kept, or its free failed).
    pub freed: Option<CleanupOutcome>,
}

/// A line the execution was taken out of.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct LeftLine {
    pub lock: LockName,
    pub id: WaiterId,
    /// When the leave was answered.
    pub at_ms: u64,
}

/// What a cleanup did, and where it stopped.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Cleaned {
    pub end: End,
    /// The locks fenced, in the order asked.
    pub locks: Vec<LockCleaned>,
    pub left_line: Vec<LeftLine>,
    /// The store calls that failed, in the order sent: their locks were skipped from there on.
    pub failed: Vec<(LockName, LockStep)>,
    /// Waiters granted the freed slots.
    pub handed_off: usize,
}

impl Cleaned {
    fn at(end: End) -> Self {
        Self {
            end,
            locks: Vec::new(),
            left_line: Vec::new(),
            failed: Vec::new(),
            handed_off: 0,
        }
    }

    /// Whether the cleanup must be asked again for the locks it failed on: a cleanup that went
    /// on to the work (deferred, or freed) owes each lock its fence and its free; one that found
    /// the execution redriven meanwhile owes nothing more.
    pub fn retry(&self) -> bool {
        !self.failed.is_empty() && matches!(self.end, End::WorkRuns | End::Freed { .. })
    }

    /// Whether all it held is freed (or it held nothing), with nothing left to retry.
    pub fn is_clean(&self) -> bool {
        matches!(self.end, End::NoLocks | End::Freed { .. }) && !self.retry()
    }
}

/// Why a cleanup stopped without an end of its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Refusal {
    /// Step Functions could not tell whether the execution runs: nothing (more) was done.
    Untold,
    /// A driver answered a call with another call's reply: a bug of the driver's.
    OutOfStep,
}

impl Refusal {
    /// What the cleanup's caller is told, naming the execution.
    pub fn message(&self, holder: &HolderId) -> String {
        match self {
            Self::Untold => format!(
                "Step Functions cannot tell whether {holder} runs: nothing more was done; the \
                 sweeper judges what it holds"
            ),
            Self::OutOfStep => format!(
                "the cleanup of {holder} was driven out of step (a bug): nothing more was sent; \
                 retrying is safe"
            ),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum State {
    Describing,
    FindingLocks,
    /// Fencing the lock at this index of `locks`.
    Fencing(usize),
    /// Reading the record at this index of `waiters`.
    ReadingWaiter(usize),
    Leaving(usize),
    /// Asking Step Functions again, once the fences stand.
    Redescribing,
    StoppingWork,
    /// Freeing the lock at this index of the fenced ones.
    Freeing(usize),
    HandingOff(usize),
    Done,
}

/// The cleanup flow of one ended execution (see the module documentation).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CleanupFlow {
    holder: HolderId,
    /// The run it ended in: the fences stop it and every run before it.
    run: Run,
    found: Locks,
    cleaned: Cleaned,
    state: State,
}

impl CleanupFlow {
    /// The flow of the ended execution `holder`, and its first call: ask Step Functions.
    pub fn start(holder: HolderId) -> (Self, Call) {
        let flow = Self {
            holder,
            run: Run::FIRST,
            found: Locks::default(),
            cleaned: Cleaned::at(End::NoLocks),
            state: State::Describing,
        };
        (flow, Call::Describe)
    }

    pub fn holder(&self) -> &HolderId {
        &self.holder
    }

    /// Takes the reply to the last call, answered at `now_ms` (the caller's clock), and says
    /// what comes next.
    pub fn resume(&mut self, reply: Reply, now_ms: u64) -> Next {
        let state = std::mem::replace(&mut self.state, State::Done);
        let next = match (state, reply) {
            (State::Describing, Reply::Execution(execution)) => match execution {
                Execution::Running => self.end(End::RunsAgain),
                Execution::Missing => self.end(End::Missing),
                Execution::Untold => Next::Done(Err(Refusal::Untold)),
                Execution::Ended { run } => {
                    self.run = run;
                    self.call(State::FindingLocks, Call::FindLocks)
                }
            },
            (State::FindingLocks, Reply::Locks(None)) => self.end(End::LocksUntold),
            (State::FindingLocks, Reply::Locks(Some(found))) if found.locks.is_empty() => {
                self.end(End::NoLocks)
            }
            (State::FindingLocks, Reply::Locks(Some(found))) => {
                self.found = found;
                self.fence(0)
            }
            (State::Fencing(at), Reply::Fenced(fenced)) if self.is_lock(at, &fenced.lock) => {
                self.cleaned.locks.push(LockCleaned {
                    fenced,
                    freed: None,
                });
                self.fence(at + 1)
            }
            (State::Fencing(at), Reply::Failed) => {
                self.failed(self.found.locks[at].clone(), LockStep::Fence);
                self.fence(at + 1)
            }
            (State::ReadingWaiter(at), Reply::InLine(true)) => {
                let (lock, id) = self.found.waiters[at].clone();
                self.call(State::Leaving(at), Call::Leave { lock, id })
            }
            (State::ReadingWaiter(at), Reply::InLine(false)) => self.read_waiter(at + 1),
            (State::Leaving(at), Reply::InLine(in_line)) => {
                if in_line {
                    let (lock, id) = self.found.waiters[at].clone();
                    let at_ms = now_ms;
                    self.cleaned.left_line.push(LeftLine { lock, id, at_ms });
                }
                self.read_waiter(at + 1)
            }
            (State::ReadingWaiter(at), Reply::Failed) => {
                self.failed(self.found.waiters[at].0.clone(), LockStep::ReadLine);
                self.read_waiter(at + 1)
            }
            (State::Leaving(at), Reply::Failed) => {
                self.failed(self.found.waiters[at].0.clone(), LockStep::LeaveLine);
                self.read_waiter(at + 1)
            }
            (State::Redescribing, Reply::Execution(execution)) => match execution {
                Execution::Running => self.end(End::RedrivenMeanwhile),
                Execution::Untold => Next::Done(Err(Refusal::Untold)),
                // Ended (in the run fenced, or ended again since) or gone: the fences stand.
                Execution::Ended { .. } | Execution::Missing => {
                    self.call(State::StoppingWork, Call::StopWork)
                }
            },
            (State::StoppingWork, Reply::WorkRuns(true)) => self.end(End::WorkRuns),
            (State::StoppingWork, Reply::WorkRuns(false)) => self.free(0, now_ms),
            (State::Freeing(at), Reply::Freed(freed)) => {
                self.cleaned.locks[at].freed = Some(freed);
                self.free(at + 1, now_ms)
            }
            (State::Freeing(at), Reply::Failed) => {
                let lock = self.cleaned.locks[at].fenced.lock.clone();
                self.failed(lock, LockStep::Free);
                self.free(at + 1, now_ms)
            }
            (State::HandingOff(at), Reply::HandedOff { woken }) => {
                self.cleaned.handed_off += woken;
                self.hand_off(at + 1)
            }
            _ => Next::Done(Err(Refusal::OutOfStep)),
        };
        if let Next::Done(_) = next {
            self.state = State::Done;
        }
        next
    }

    fn call(&mut self, state: State, call: Call) -> Next {
        self.state = state;
        Next::Call(call)
    }

    fn end(&mut self, end: End) -> Next {
        self.cleaned.end = end;
        Next::Done(Ok(self.cleaned.clone()))
    }

    fn failed(&mut self, lock: LockName, step: LockStep) {
        self.cleaned.failed.push((lock, step));
    }

    fn is_lock(&self, at: usize, lock: &LockName) -> bool {
        self.found.locks.get(at) == Some(lock)
    }

    fn is_fenced(&self, lock: &LockName) -> bool {
        self.cleaned.locks.iter().any(|l| l.fenced.lock == *lock)
    }

    /// The fence of the lock at `at`; past the last, the lines.
    fn fence(&mut self, at: usize) -> Next {
        match self.found.locks.get(at) {
            Some(lock) => {
                let call = Call::Fence {
                    lock: lock.clone(),
                    run: self.run,
                };
                self.call(State::Fencing(at), call)
            }
            None => self.read_waiter(0),
        }
    }

    /// The read of the next record from `at` on a fenced lock: a fenced run queues no more, so
    /// these are all its places. Read first: every acquire task may have queued the execution,
    /// most did not, and a read costs less than a refused write. A lock whose fence failed is
    /// retried whole. Past the last, Step Functions again.
    fn read_waiter(&mut self, from: usize) -> Next {
        let next = (from..self.found.waiters.len()).find(|&at| {
            let (lock, _) = &self.found.waiters[at];
            self.is_fenced(lock)
        });
        match next {
            Some(at) => {
                let (lock, id) = self.found.waiters[at].clone();
                self.call(State::ReadingWaiter(at), Call::ReadWaiter { lock, id })
            }
            None => self.call(State::Redescribing, Call::Describe),
        }
    }

    /// The free of the fenced lock at `at` (a write per lock that held something); past the
    /// last, the hand-offs.
    fn free(&mut self, at: usize, now_ms: u64) -> Next {
        match self.cleaned.locks.get(at) {
            Some(lock) => {
                let call = Call::Free(lock.fenced.clone());
                self.call(State::Freeing(at), call)
            }
            None => {
                self.cleaned.end = End::Freed { at_ms: now_ms };
                self.hand_off(0)
            }
        }
    }

    /// The hand-off of the next lock from `from` that a freed slot can serve: it freed some, and
    /// someone waits.
    fn hand_off(&mut self, from: usize) -> Next {
        let next = (from..self.cleaned.locks.len()).find(|&at| {
            self.cleaned.locks[at]
                .freed
                .as_ref()
                .is_some_and(|freed| !freed.freed.is_empty() && freed.waiting > 0)
        });
        match next {
            Some(at) => {
                let lock = self.cleaned.locks[at].fenced.lock.clone();
                self.call(State::HandingOff(at), Call::HandOff { lock })
            }
            None => Next::Done(Ok(self.cleaned.clone())),
        }
    }
}
