//! Release: the release function's flow. It frees the slot the acquire answer shows (its fencing
//! token: F15) and fences the acquisition, so that a late retry of the same acquire can never take
//! a slot again; one write, and a retry frees nothing more. Then it frees, then hands off: a slot
//! freed while others wait goes to the head of the line.
//!
//! A redriven run's release (its acquisition `r<n>`, n > 0) also frees what the earlier runs of
//! its execution hold, as a cleanup of runs 0..n-1 would (their fence, then the free of what it
//! saw): a zombie acquire of an earlier run may have landed, or an earlier run's slot been left
//! to it by that run's cleanup, which found the execution running again (F11); its own
//! acquisition holds none of that, so releasing only it left those slots to the sweeper, a false
//! leak notice. Safe: those runs have ended, and so has every child of theirs once a later run
//! reaches a release state (a redrive resumes where the run stopped; no state after the work
//! leads back to it), and no acquire of theirs lands after their fence. Only Step Functions may
//! say so (F15): the run a payload names is not believed, so a made-up `r<n>`, or a real
//! execution named in a run it is not in, neither frees its earlier runs' slots nor makes a
//! fence of n runs (a 12,500-run fence is 100 KB of the lock's item). One `DescribeExecution`,
//! for a redriven run's release only.
//!
//! The flow is [`ReleaseFlow`]: [`ReleaseFlow::start`] gives its first [`Call`], and
//! [`ReleaseFlow::resume`] takes each call's [`Reply`] and gives the next, until it is done with
//! a [`Release`] or a [`Refusal`].

use serde::{Deserialize, Serialize};

use crate::input::{LockName, Weight};
use crate::item::{Claim, FencingToken, Holding, Identity, Run, SemaphoreItem};
use crate::protocol::{CleanupOutcome, Fenced, ReleaseOutcome};

/// Whom a release is about: the acquire answer's lock, holder, acquisition and fencing token.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Request {
    pub lock: LockName,
    pub identity: Identity,
    /// The fencing token the acquire answered: the release frees only the slot taken under it
    /// (F15).
    pub token: FencingToken,
    /// The run of its execution the acquisition was made in (`r<n>`: n), if it names one; at
    /// most [`Run::MAX`].
    pub run: Option<u32>,
    /// The weight its acquire asked for (1 when the answer names none): what a release expects
    /// to free, checked by the store, which finds the right one if it is not.
    pub weight: Weight,
}

impl Request {
    /// What the release shows of its slot.
    pub fn claim(&self) -> Claim {
        Claim::Slot {
            token: self.token,
            weight: self.weight,
        }
    }

    /// The answer to this request once the flow released: `failed`, the error and cause to
    /// fail the execution with after a failure its payload passed on.
    pub fn answer(&self, release: &Release, failed: Option<(String, String)>) -> ReleaseAnswer {
        let (error, cause) = failed.unzip();
        ReleaseAnswer {
            released: release.released,
            outcome: release.outcome(),
            count: release.count,
            lock: self.lock.to_string(),
            acquisition: self.identity.acquisition.to_string(),
            handed_off: release.handed_off,
            error,
            cause,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    Released,
    NotHeld,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Released => "released",
            Self::NotHeld => "not_held",
        }
    }
}

/// The release function's answer (docs/using.md).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ReleaseAnswer {
    /// True when this call freed a slot; false when none was held (already released, cleaned
    /// up, or never acquired): the acquisition is fenced either way.
    pub released: bool,
    pub outcome: Outcome,
    /// Slots held now.
    pub count: usize,
    pub lock: String,
    pub acquisition: String,
    /// Waiters this release woke with a slot (0 or 1, more if slots were free).
    pub handed_off: usize,
    /// The error to fail the execution with; `null` without `"error"` in the payload.
    pub error: Option<String>,
    /// Its cause; `null` without `"error"` in the payload.
    pub cause: Option<String>,
}

/// What the flow needs done next: an operation of [`crate::Semaphore`] on the request's lock, or
/// a question to Step Functions.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Call {
    /// Free the slot the request's claim shows and fence the acquisition
    /// ([`crate::Semaphore::release_freeing`]): [`Reply::Released`].
    Release,
    /// Move the lock's line ([`crate::Semaphore::hand_off`]), from `known`, the lock as the
    /// release left it, if given: [`Reply::HandedOff`].
    HandOff { known: Option<Box<SemaphoreItem>> },
    /// Which run the request's execution is in now (`DescribeExecution`:
    /// [`crate::ExecutionStatus::current_run`]): [`Reply::Run`].
    CurrentRun,
    /// Fence the execution's runs up to `last_run` ([`crate::Semaphore::fence`]):
    /// [`Reply::Fenced`].
    Fence { last_run: Run },
    /// Free the slots a fence saw ([`crate::Semaphore::free`]): [`Reply::Freed`].
    Free(Fenced),
}

/// What became of a [`Call`].
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Reply {
    /// The release's outcome, the lock as it left it, and the slot it freed as it was held
    /// (when it was taken), if the write that freed it was answered.
    Released {
        outcome: ReleaseOutcome,
        after: Box<SemaphoreItem>,
        held: Option<Holding>,
    },
    /// How many waiters the hand-off woke with a slot.
    HandedOff {
        woken: usize,
    },
    /// The run the execution is in (`None`: not an execution, or Step Functions cannot tell),
    /// or why Step Functions could not say.
    Run(Result<Option<Run>, String>),
    /// The slots the fenced runs hold (all they will ever hold), and the slots held and the
    /// waiters in line when the fence landed.
    Fenced(Fenced),
    Freed(CleanupOutcome),
}

/// What the flow does next.
#[derive(Debug, Clone, PartialEq)]
pub enum Next {
    Call(Call),
    Done(Result<Release, Refusal>),
}

/// What a release did.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Release {
    /// Whether it freed a slot: its own, or (a redriven run's) the earlier runs'.
    pub released: bool,
    /// Slots held, and waiters in line, after its last write.
    pub count: usize,
    pub waiting: u64,
    /// Waiters its hand-offs woke with a slot.
    pub handed_off: usize,
    pub earlier: EarlierRuns,
}

impl Release {
    pub fn outcome(&self) -> Outcome {
        if self.released {
            Outcome::Released
        } else {
            Outcome::NotHeld
        }
    }
}

/// What a release did to the earlier runs of its execution.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EarlierRuns {
    /// Nothing: its acquisition names no run after the first.
    NotRedriven,
    /// Nothing: Step Functions says the execution is not in the run its acquisition names
    /// (`current`: the run it is in, if it is an execution).
    NotInRun { run: u32, current: Option<Run> },
    /// Fenced, and `freed` slots they held freed.
    Fenced { run: u32, freed: usize },
}

/// Why a release failed.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Refusal {
    /// F15: the acquisition holds its slot under another token than the one shown, `held`: not
    /// this caller's to free. Nothing was written (`SemaphoreWrongToken`).
    WrongToken { held: FencingToken },
    /// Step Functions could not say which run a redriven run's execution is in (`problem`): its
    /// own slot's release stands, its earlier runs were not freed (`SemaphoreStoreError`; a
    /// retry frees them).
    RunUnknown { problem: String },
    /// A driver answered a call with another call's reply: a bug of the driver, nothing of the
    /// caller's.
    OutOfStep,
}

impl Refusal {
    /// What the caller is told, naming the acquisition and what to do.
    pub fn message(&self, request: &Request) -> String {
        let (lock, identity) = (&request.lock, &request.identity);
        match self {
            Self::WrongToken { held } => format!(
                "acquisition {} of {} on lock \"{lock}\" holds its slot under fencing token {}, \
                 and this release shows token {}: it is not this slot's acquire answer (a \
                 $.semaphore from another branch, iteration or execution?). Nothing was freed or \
                 written; pass the release the answer of the acquire whose slot it frees",
                identity.acquisition, identity.holder, held.0, request.token.0
            ),
            Self::RunUnknown { problem } => format!(
                "Step Functions could not say which run {} is in, so its earlier runs were not \
                 freed: {problem}",
                identity.holder
            ),
            Self::OutOfStep => format!(
                "the release of {} on lock \"{lock}\" was driven out of step (a bug): nothing \
                 more was sent; release it again",
                identity.holder
            ),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum State {
    /// The release is out.
    Releasing,
    /// Moving the line after the release.
    HandingOff,
    /// Asking Step Functions whether the execution is in redriven run `run`.
    AskingRun {
        run: u32,
    },
    /// Fencing runs 0..run-1.
    Fencing {
        run: u32,
    },
    /// Freeing what the fence saw.
    Freeing {
        run: u32,
    },
    /// Moving the line after the earlier runs' slots were freed.
    HandingOffEarlier,
    Done,
}

/// The release flow of one invocation (see the module documentation).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ReleaseFlow {
    request: Request,
    state: State,
    /// What it did so far.
    release: Release,
}

impl ReleaseFlow {
    /// The flow of `request`, and its first call: the release, one write (no read).
    pub fn start(request: Request) -> (Self, Call) {
        let flow = Self {
            request,
            state: State::Releasing,
            release: Release {
                released: false,
                count: 0,
                waiting: 0,
                handed_off: 0,
                earlier: EarlierRuns::NotRedriven,
            },
        };
        (flow, Call::Release)
    }

    pub fn request(&self) -> &Request {
        &self.request
    }

    /// Takes the reply to the last call, and says what comes next.
    pub fn resume(&mut self, reply: Reply) -> Next {
        let state = std::mem::replace(&mut self.state, State::Done);
        let next = match (state, reply) {
            (State::Releasing, Reply::Released { outcome, after, .. }) => match outcome {
                ReleaseOutcome::Released { count, waiting, .. } => {
                    self.released(true, count, waiting, after)
                }
                ReleaseOutcome::NotHeld { count, waiting } => {
                    self.released(false, count, waiting, after)
                }
                ReleaseOutcome::WrongToken { held, .. } => {
                    Self::refused(Refusal::WrongToken { held })
                }
            },
            (State::HandingOff, Reply::HandedOff { woken }) => {
                self.release.handed_off += woken;
                self.earlier_runs()
            }
            (State::AskingRun { .. }, Reply::Run(Err(problem))) => {
                Self::refused(Refusal::RunUnknown { problem })
            }
            (State::AskingRun { run }, Reply::Run(Ok(current))) => {
                if current.is_some_and(|current| current.0 >= run) {
                    let last_run = Run(run - 1);
                    self.call(State::Fencing { run }, Call::Fence { last_run })
                } else {
                    self.release.earlier = EarlierRuns::NotInRun { run, current };
                    self.done()
                }
            }
            (State::Fencing { run }, Reply::Fenced(fenced)) => {
                if fenced.slots.is_empty() {
                    // A free of nothing sends nothing.
                    let freed = CleanupOutcome {
                        freed: Vec::new(),
                        count: fenced.count,
                        waiting: fenced.waiting,
                    };
                    self.freed(run, freed)
                } else {
                    self.call(State::Freeing { run }, Call::Free(fenced))
                }
            }
            (State::Freeing { run }, Reply::Freed(freed)) => self.freed(run, freed),
            (State::HandingOffEarlier, Reply::HandedOff { woken }) => {
                self.release.handed_off += woken;
                self.done()
            }
            _ => Self::refused(Refusal::OutOfStep),
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

    fn refused(refusal: Refusal) -> Next {
        Next::Done(Err(refusal))
    }

    fn done(&self) -> Next {
        Next::Done(Ok(self.release.clone()))
    }

    /// Its own slot's release landed (`released`: it freed it), leaving `after`.
    fn released(
        &mut self,
        released: bool,
        count: usize,
        waiting: u64,
        after: Box<SemaphoreItem>,
    ) -> Next {
        let release = &mut self.release;
        (release.released, release.count, release.waiting) = (released, count, waiting);
        // From the item the release left: nobody waiting costs no request.
        if after.waiting > 0 {
            let known = Some(after);
            self.call(State::HandingOff, Call::HandOff { known })
        } else {
            self.earlier_runs()
        }
    }

    /// After its own slot: a redriven run asks Step Functions which run its execution is in.
    fn earlier_runs(&mut self) -> Next {
        match self.request.run.filter(|&run| run > 0) {
            Some(run) => self.call(State::AskingRun { run }, Call::CurrentRun),
            None => self.done(),
        }
    }

    /// The earlier runs' slots are `freed`: the line moves if anyone waits for them.
    fn freed(&mut self, run: u32, freed: CleanupOutcome) -> Next {
        let release = &mut self.release;
        release.earlier = EarlierRuns::Fenced {
            run,
            freed: freed.freed.len(),
        };
        (release.count, release.waiting) = (freed.count, freed.waiting);
        if freed.freed.is_empty() {
            return self.done();
        }
        release.released = true;
        if freed.waiting > 0 {
            self.call(State::HandingOffEarlier, Call::HandOff { known: None })
        } else {
            self.done()
        }
    }
}
