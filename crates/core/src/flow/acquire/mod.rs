//! Acquire or wait in line: the acquire function's flow, for a parked caller (a standard
//! execution's `.waitForTaskToken` task, woken by whoever grants it a slot) and a polling one
//! (anyone else: it asks again, under a lease).
//!
//! One invocation takes a free slot; or, for a caller already in line (its task timed out and
//! the state ran again, or a poller's next poll), gives its record this attempt's wake-up and
//! keeps its place; or queues it. Either way it then hands off, since a slot may have been freed
//! between "full" and "queued" (F8). Past the wait budget the caller leaves the line instead.
//!
//! The flow is [`AcquireFlow`]: [`AcquireFlow::start`] gives its first [`Call`], and
//! [`AcquireFlow::resume`] takes each call's [`Reply`] and gives the next, until it is done with
//! an [`Acquisition`] or a [`Refusal`].

mod refusal;
mod request;

pub use refusal::{Expiry, OverBudget, Refusal};
pub use request::{Acquisition, Budget, Request, Taken, Waiting};

use crate::input::{terms_on, Limit, Terms};
use crate::item::{FencingToken, SemaphoreItem};
use crate::protocol::{millis, AcquireOutcome, QueueOutcome};
use crate::queue::{Waiter, Wakeup};

/// How often one invocation tries to queue when the lock turns free and full again between its
/// writes (each round is a write that found the other state): then it is refused
/// ([`Expiry::Churn`]), and the caller asks again.
pub const QUEUE_ROUNDS: usize = 3;

/// What the flow needs done next. Each is one operation of [`crate::Semaphore`] on the
/// request's lock.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Call {
    /// Take a slot on `terms` for the request ([`crate::Semaphore::acquire_seeing`]): answer
    /// [`Reply::Acquired`].
    Acquire { terms: Terms },
    /// Read the request's record in line ([`crate::Semaphore::waiter`]): [`Reply::Waiter`].
    ReadWaiter,
    /// Put this waiter in line ([`crate::Semaphore::enqueue`]): [`Reply::Queued`].
    Enqueue(Waiter),
    /// Take the request's record out of line ([`crate::Semaphore::leave`]): [`Reply::InLine`].
    Leave,
    /// Give the request's record this wake-up of the request's attempt
    /// ([`crate::Semaphore::repark`]): [`Reply::InLine`].
    Repark(Wakeup),
    /// Move the lock's line ([`crate::Semaphore::hand_off`]): [`Reply::HandedOff`].
    HandOff,
}

/// What became of a [`Call`].
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Reply {
    /// The acquire's outcome, and the lock as its write left it or saw it.
    Acquired {
        outcome: AcquireOutcome,
        seen: Option<SemaphoreItem>,
    },
    Waiter(Option<Waiter>),
    Queued(QueueOutcome),
    /// Whether the record was in line when the leave or re-park landed.
    InLine(bool),
    /// The slot the hand-off granted this acquisition, if it did.
    HandedOff {
        granted: Option<FencingToken>,
    },
}

/// What the flow does next.
#[derive(Debug, Clone, PartialEq)]
pub enum Next {
    Call(Call),
    Done(Result<Acquisition, Refusal>),
}

/// A deliberately broken acquire flow, for the model checker to show that it notices
/// (`model-check --queue --variant ...`). Only builds with the `broken-variants` feature can
/// choose one (`AcquireFlow::broken`); the shipped flow has none.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Broken {
    /// A check that finds the caller in line leaves its record as it is, with the wake-up of
    /// the attempt that timed out (no re-park): the hand-off that grants it wakes a task that no
    /// longer waits (F8).
    CheckKeepsOldToken,
    /// A check that finds the caller in line takes it out and queues it again at this attempt's
    /// own time, behind those who asked after it (L2).
    CheckTakesANewPlace,
    /// A poll that finds its record in line keeps the place without renewing its time (the
    /// record's own wake-up again): a poller that polls in time is taken out of line as stopped
    /// (L2).
    PollKeepsOldTime,
}

/// A queueing under way: the record sent, and how many queue writes were sent.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Queueing {
    waiter: Waiter,
    round: usize,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum State {
    /// The first acquire is out.
    Acquiring,
    /// It was refused: is the caller in line already?
    ReadingWaiter,
    /// A record found in line, at its place `queued_at_ms`, is being checked (`queueing`: found
    /// by a queue write that met it, not by the first read): it leaves the line (past its budget:
    /// `timeout`), or takes this attempt's wake-up.
    Checking {
        queued_at_ms: u64,
        timeout: Option<Refusal>,
        queueing: Option<Queueing>,
    },
    /// [`Broken::CheckTakesANewPlace`]: the record found is taken out of line, to queue anew.
    Requeueing,
    /// The record was gone when checked (granted meanwhile): the acquire again finds the slot.
    Reacquiring,
    Enqueuing(Queueing),
    /// A queue write met the caller's record: reading it.
    ReadingQueued(Queueing),
    /// A queue write found a slot free and nobody waiting: taking it.
    AcquiringFree(Queueing),
    /// Moving the line after the caller was queued or checked, which may grant it its slot.
    HandingOff {
        new: bool,
        queued_at_ms: u64,
        seen: Option<SemaphoreItem>,
    },
    Done,
}

/// The acquire-or-wait flow of one invocation (see the module documentation).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct AcquireFlow {
    request: Request,
    budget: Budget,
    state: State,
    /// The first acquire's answer said the request is past its horizon.
    first_expired: bool,
    /// The lock as the first acquire's write saw it.
    first_seen: Option<SemaphoreItem>,
    /// `None` but in the model checker's broken variants.
    broken: Option<Broken>,
}

impl AcquireFlow {
    /// The flow of `request` (as [`Request::at`] made it for this invocation), and its first
    /// call: an acquire, one conditional write (no read).
    pub fn start(request: Request, budget: Budget) -> (Self, Call) {
        let call = Call::Acquire {
            terms: request.terms,
        };
        let flow = Self {
            request,
            budget,
            state: State::Acquiring,
            first_expired: false,
            first_seen: None,
            broken: None,
        };
        (flow, call)
    }

    /// This flow, broken as `broken` says (the model checker's variants only).
    #[cfg(feature = "broken-variants")]
    pub fn broken(mut self, broken: Broken) -> Self {
        self.broken = Some(broken);
        self
    }

    pub fn request(&self) -> &Request {
        &self.request
    }

    /// How many queue writes it has sent, once it queues (`None`: it has not queued).
    pub fn queue_round(&self) -> Option<usize> {
        match &self.state {
            State::Enqueuing(queueing)
            | State::ReadingQueued(queueing)
            | State::AcquiringFree(queueing)
            | State::Checking {
                queueing: Some(queueing),
                ..
            } => Some(queueing.round + 1),
            _ => None,
        }
    }

    /// Takes the reply to the last call made at `now_ms` (the caller's clock), and says what
    /// comes next.
    pub fn resume(&mut self, reply: Reply, now_ms: u64) -> Next {
        let state = std::mem::replace(&mut self.state, State::Done);
        let next = match (state, reply) {
            (State::Acquiring, Reply::Acquired { outcome, seen }) => {
                self.first_seen = seen.clone();
                match outcome {
                    AcquireOutcome::Acquired { token, count } => {
                        self.holding(token, count, true, seen)
                    }
                    AcquireOutcome::AlreadyHeld { token, count } => {
                        self.holding(token, count, false, seen)
                    }
                    AcquireOutcome::Fenced(reason) => Self::refused(Refusal::Fenced(reason)),
                    // Full, or an operator reconfiguring the lock as it was asked: in line,
                    // where the queue write learns the configuration again. Expired (a retry of
                    // the state past the horizon: nothing was sent): a waiter still keeps its
                    // place, which takes no slot; anyone else asks again.
                    AcquireOutcome::Expired => {
                        self.first_expired = true;
                        self.call(State::ReadingWaiter, Call::ReadWaiter)
                    }
                    AcquireOutcome::Full { .. }
                    | AcquireOutcome::RateLimited { .. }
                    | AcquireOutcome::Configured(_) => {
                        self.call(State::ReadingWaiter, Call::ReadWaiter)
                    }
                }
            }
            (State::ReadingWaiter, Reply::Waiter(Some(record))) => self.check(record, None, now_ms),
            (State::ReadingWaiter, Reply::Waiter(None)) => self.queue_unless_expired(now_ms),
            (
                State::Checking {
                    queued_at_ms,
                    timeout,
                    queueing,
                },
                Reply::InLine(in_line),
            ) => match (in_line, timeout) {
                (true, Some(timeout)) => Self::refused(timeout),
                (true, None) => {
                    let seen = self.seen_unless(&queueing);
                    self.hand_off(false, queued_at_ms, seen)
                }
                // Granted since it was read: the slot is its own.
                (false, _) => match queueing {
                    None => self.call(
                        State::Reacquiring,
                        Call::Acquire {
                            terms: self.request.terms,
                        },
                    ),
                    Some(queueing) => self.next_round(queueing),
                },
            },
            (State::Requeueing, Reply::InLine(_)) => self.queue_unless_expired(now_ms),
            (State::Reacquiring, Reply::Acquired { outcome, seen }) => match outcome {
                AcquireOutcome::AlreadyHeld { token, count } => {
                    self.holding(token, count, false, seen)
                }
                AcquireOutcome::Acquired { token, count } => self.holding(token, count, true, seen),
                AcquireOutcome::Fenced(reason) => Self::refused(Refusal::Fenced(reason)),
                AcquireOutcome::Expired => Self::refused(Refusal::Expired(Expiry::Horizon)),
                // Out of line and no slot (a grant freed again, say): it queues anew.
                AcquireOutcome::Full { .. }
                | AcquireOutcome::RateLimited { .. }
                | AcquireOutcome::Configured(_) => self.queue_unless_expired(now_ms),
            },
            (State::Enqueuing(queueing), Reply::Queued(outcome)) => match outcome {
                // F8: a slot freed between our "full" and our queueing has no one else to
                // hand it on.
                QueueOutcome::Queued => {
                    let seen = self.first_seen.clone();
                    self.hand_off(true, self.request.asked_at_ms, seen)
                }
                // Another attempt of its task queued it since the first read found no record (a
                // slow invocation of an earlier attempt): check again, as the first read would.
                QueueOutcome::AlreadyQueued => {
                    self.call(State::ReadingQueued(queueing), Call::ReadWaiter)
                }
                QueueOutcome::AlreadyHeld { token, count } => {
                    self.holding(token, count, false, None)
                }
                QueueOutcome::Fenced(reason) => Self::refused(Refusal::Fenced(reason)),
                QueueOutcome::Expired => Self::refused(Refusal::Expired(Expiry::Horizon)),
                QueueOutcome::Configured(_) => self.next_round(queueing),
                QueueOutcome::Free => {
                    let terms = queueing.waiter.terms;
                    self.call(State::AcquiringFree(queueing), Call::Acquire { terms })
                }
            },
            (State::ReadingQueued(queueing), Reply::Waiter(record)) => match record {
                Some(record) => self.check(record, Some(queueing), now_ms),
                None => self.next_round(queueing),
            },
            (State::AcquiringFree(queueing), Reply::Acquired { outcome, .. }) => match outcome {
                AcquireOutcome::Acquired { token, count } => self.holding(token, count, true, None),
                AcquireOutcome::AlreadyHeld { token, count } => {
                    self.holding(token, count, false, None)
                }
                AcquireOutcome::Fenced(reason) => Self::refused(Refusal::Fenced(reason)),
                AcquireOutcome::Expired => Self::refused(Refusal::Expired(Expiry::Horizon)),
                AcquireOutcome::Full { .. }
                | AcquireOutcome::RateLimited { .. }
                | AcquireOutcome::Configured(_) => self.next_round(queueing),
            },
            (
                State::HandingOff {
                    new,
                    queued_at_ms,
                    seen,
                },
                Reply::HandedOff { granted },
            ) => {
                // A poller the hand-off granted holds its slot now (a parked task was woken by
                // the hand-off itself).
                let taken = match (&self.request.waiting, granted) {
                    (Waiting::Polls { .. }, Some(token)) => Taken::Holding {
                        token,
                        count: None,
                        taken: true,
                        queued_at_ms: Some(queued_at_ms),
                    },
                    _ => Taken::InLine { new, queued_at_ms },
                };
                self.done(taken, seen)
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

    fn done(&self, taken: Taken, seen: Option<SemaphoreItem>) -> Next {
        // F14: on a lock its operator configured, the answer says the terms it took.
        let terms = seen
            .as_ref()
            .and_then(|item| {
                terms_on(item.config.as_ref(), &self.request.lock, self.request.terms).ok()
            })
            .unwrap_or(self.request.terms);
        Next::Done(Ok(Acquisition { taken, seen, terms }))
    }

    fn holding(
        &self,
        token: FencingToken,
        count: usize,
        taken: bool,
        seen: Option<SemaphoreItem>,
    ) -> Next {
        let taken = Taken::Holding {
            token,
            count: Some(count),
            taken,
            queued_at_ms: None,
        };
        self.done(taken, seen)
    }

    /// What the flow reports it saw: the first acquire's view, unless a queue write decided.
    fn seen_unless(&self, queueing: &Option<Queueing>) -> Option<SemaphoreItem> {
        match queueing {
            None => self.first_seen.clone(),
            Some(_) => None,
        }
    }

    fn hand_off(&mut self, new: bool, queued_at_ms: u64, seen: Option<SemaphoreItem>) -> Next {
        let state = State::HandingOff {
            new,
            queued_at_ms,
            seen,
        };
        self.call(state, Call::HandOff)
    }

    /// A check of a record found in line (`record`, as read): a later attempt's record means
    /// this invocation's task is over; this very attempt's (its queue write landed, and the check
    /// or the queueing was sent again) moves the line, as after queueing; past its budget it
    /// leaves the line; else its record gets this attempt's wake-up.
    fn check(&mut self, record: Waiter, queueing: Option<Queueing>, now_ms: u64) -> Next {
        let request = &self.request;
        if record.attempt > request.attempt {
            let seen = self.seen_unless(&queueing);
            return self.done(Taken::Superseded, seen);
        }
        if record.attempt == request.attempt {
            let seen = self.seen_unless(&queueing);
            return self.hand_off(false, record.key.queued_at_ms, seen);
        }
        let limit = queueing
            .as_ref()
            .map_or(request.terms.limit, |queueing| queueing.waiter.terms.limit);
        let queued_at_ms = record.key.queued_at_ms;
        if let Some(timeout) = self.over_budget(&record, limit, now_ms) {
            let state = State::Checking {
                queued_at_ms,
                timeout: Some(timeout),
                queueing,
            };
            return self.call(state, Call::Leave);
        }
        match self.broken {
            Some(Broken::CheckKeepsOldToken) => {
                let seen = self.seen_unless(&queueing);
                return self.hand_off(false, queued_at_ms, seen);
            }
            Some(Broken::CheckTakesANewPlace) => return self.call(State::Requeueing, Call::Leave),
            Some(Broken::PollKeepsOldTime) | None => {}
        }
        // A poll keeps the poller's place for another poll window (F13). Then a wake-up may
        // have been lost (a waker that crashed between its grant and its wake-up, or whose
        // SendTaskSuccess went to a task that had timed out): the hand-off that follows may
        // grant this very execution and complete its new task.
        let wakeup = match self.broken {
            Some(Broken::PollKeepsOldTime) => record.wakeup.clone(),
            _ => self.wakeup(now_ms),
        };
        let state = State::Checking {
            queued_at_ms,
            timeout: None,
            queueing,
        };
        self.call(state, Call::Repark(wakeup))
    }

    /// The refusal once `record` has waited past `MAX_WAIT_SECONDS`, or (a parked standard
    /// execution) checked more often than its execution's history has room for.
    fn over_budget(&self, record: &Waiter, limit: Limit, now_ms: u64) -> Option<Refusal> {
        let waited_ms = now_ms.saturating_sub(record.key.queued_at_ms);
        let over = if waited_ms > millis(self.budget.max_wait) {
            OverBudget::MaxWait(self.budget.max_wait)
        } else if record.task_token().is_some()
            && u64::from(record.checks) >= self.budget.max_checks
        {
            // Only a parked standard execution's checks fill its history; a poller's polls keep
            // no Standard history, and its wait is bounded by MAX_WAIT_SECONDS alone.
            OverBudget::Checks(record.checks)
        } else {
            return None;
        };
        Some(Refusal::WaitTimeout {
            waited_ms,
            limit,
            over,
        })
    }

    fn wakeup(&self, now_ms: u64) -> Wakeup {
        match &self.request.waiting {
            Waiting::Parked(task_token) => Wakeup::Task(task_token.clone()),
            Waiting::Polls { poll_ms } => Wakeup::Poll {
                until_ms: now_ms.saturating_add(*poll_ms),
            },
        }
    }

    /// Not in line and no slot: a request past its horizon asks again; else it queues at its
    /// first ask's time, on the lock's configuration if the first refusal showed one (F14), so
    /// that the answer a hand-off sends says the terms taken.
    fn queue_unless_expired(&mut self, now_ms: u64) -> Next {
        if self.first_expired {
            return Self::refused(Refusal::Expired(Expiry::Horizon));
        }
        let request = &self.request;
        let terms = self
            .first_seen
            .as_ref()
            .and_then(|item| terms_on(item.config.as_ref(), &request.lock, request.terms).ok())
            .unwrap_or(request.terms);
        let context = request
            .waiting_answer(&terms, request.asked_at_ms)
            .to_json();
        let (lock, identity) = (request.lock.clone(), request.identity.clone());
        let waiter = match &request.waiting {
            Waiting::Parked(task_token) => Waiter::new(
                lock,
                identity,
                request.run,
                terms,
                request.asked_at_ms,
                task_token.clone(),
                request.attempt,
                context,
            ),
            Waiting::Polls { poll_ms } => Waiter::polling(
                lock,
                identity,
                request.run,
                terms,
                request.asked_at_ms,
                now_ms.saturating_add(*poll_ms),
                request.attempt,
                context,
            ),
        };
        let call = Call::Enqueue(waiter.clone());
        self.call(State::Enqueuing(Queueing { waiter, round: 0 }), call)
    }

    /// The next queue write, or the refusal once [`QUEUE_ROUNDS`] were sent.
    fn next_round(&mut self, queueing: Queueing) -> Next {
        let round = queueing.round + 1;
        if round >= QUEUE_ROUNDS {
            return Self::refused(Refusal::Expired(Expiry::Churn));
        }
        let call = Call::Enqueue(queueing.waiter.clone());
        self.call(
            State::Enqueuing(Queueing {
                waiter: queueing.waiter,
                round,
            }),
            call,
        )
    }
}
