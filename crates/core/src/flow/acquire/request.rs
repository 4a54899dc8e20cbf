//! What one acquisition asks for ([`Request`]), how its caller waits ([`Waiting`]) and for how
//! long ([`Budget`]), and the answers made of it.

use std::time::Duration;

use crate::clock::rfc3339_millis;
use crate::flow::answer::{
    child_execution_name, AcquireAnswer, Outcome, SemaphoreContext, Work, WorkAnswer, WorkContext,
    WorkKind,
};
use crate::input::{LockName, TaskToken, Terms};
use crate::item::{FencingToken, Identity, Run, SemaphoreItem};
use crate::queue::{Attempt, WaiterId};

/// How an acquire's caller waits for its slot when the lock is full.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Waiting {
    /// Parked on its task's token (`$$.Task.Token`, a standard execution's
    /// `.waitForTaskToken`): whoever gives it its slot completes the task with it.
    Parked(TaskToken),
    /// No task token (an Express workflow, any other client): the function answers at once,
    /// `SemaphoreBusy` while it waits in line, and it asks again (its `Retry`). Its place is
    /// kept while it asks again within `poll_ms`; it holds its slot under a lease.
    Polls { poll_ms: u64 },
}

impl Waiting {
    /// How long a poller's place is kept without a poll, unless `poll_seconds` says otherwise.
    pub const DEFAULT_POLL_SECONDS: u64 = 60;
    /// The longest a poller may go between polls and keep its place: a dead poller at the head
    /// of the line holds everyone behind it back for this long.
    pub const MAX_POLL_SECONDS: u64 = 900;

    pub fn task_token(&self) -> Option<&TaskToken> {
        match self {
            Self::Parked(token) => Some(token),
            Self::Polls { .. } => None,
        }
    }
}

/// One acquisition's request: who asks for which lock on which terms, when, and how it waits.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Request {
    pub lock: LockName,
    /// The limit, weight, start rate and lease asked for.
    pub terms: Terms,
    pub identity: Identity,
    /// The execution's run (its redrive count): the run whose fence this acquire checks.
    pub run: Run,
    /// When the acquire was asked for (the acquire state's entry time; a poller's: this poll's,
    /// see [`Request::at`]), ms since the epoch: its horizon counts from it.
    pub requested_at_ms: u64,
    /// When the caller first asked (the acquire state's entry time): its place in line.
    pub asked_at_ms: u64,
    /// Which attempt of the acquire task this is: its entry time, then its retry count.
    pub attempt: Attempt,
    /// How the caller waits when the lock is full.
    pub waiting: Waiting,
    /// The work to run under the slot as a child execution (the lock-protected machine's);
    /// `None` otherwise.
    pub work: Option<Work>,
}

impl Request {
    /// The request as an invocation at `now_ms` runs it. A poller asks anew with each poll: its
    /// horizon counts from this poll (its first ask stays its place in line), so a late poll of a
    /// caller that has gone holds a slot no longer than its lease (F13).
    pub fn at(mut self, now_ms: u64) -> Self {
        if let Waiting::Polls { .. } = self.waiting {
            self.requested_at_ms = now_ms.max(self.asked_at_ms);
        }
        self
    }

    /// The record this acquisition waits in line under.
    pub fn waiter_id(&self) -> WaiterId {
        WaiterId::of(&self.identity)
    }

    /// The answer to this request, taken on `terms`, once it holds `token` (`None`: in line).
    pub fn answer(
        &self,
        terms: &Terms,
        outcome: Outcome,
        token: Option<FencingToken>,
        count: Option<usize>,
        queued_at_ms: Option<u64>,
    ) -> AcquireAnswer {
        let request = self;
        let identity = &request.identity;
        let child_name = child_execution_name(identity);
        let token = token.map(|token| token.0);
        AcquireAnswer {
            acquired: token.is_some(),
            outcome,
            token,
            count,
            limit: terms.limit.get(),
            weight: terms.weight.get(),
            rate: terms.rate.map(|rate| rate.as_per_second()),
            lock: request.lock.to_string(),
            holder: identity.holder.to_string(),
            acquisition: identity.acquisition.to_string(),
            queued_at: queued_at_ms.map(rfc3339_millis),
            work: request.work.as_ref().map(|work| WorkAnswer {
                state_machine: work.state_machine.clone(),
                name: child_name.clone(),
                context: WorkContext {
                    semaphore: SemaphoreContext {
                        lock: request.lock.to_string(),
                        fencing_token: token,
                        holder: identity.holder.to_string(),
                        acquisition: identity.acquisition.to_string(),
                        function: (work.kind == WorkKind::Function).then(|| work.arn.clone()),
                    },
                },
            }),
            child_name,
        }
    }

    /// The answer a waiter queued at `queued_at_ms` on `terms` gets with its slot, before the
    /// slot is known: what its record keeps (as JSON text) for the hand-off to fill in.
    pub fn waiting_answer(&self, terms: &Terms, queued_at_ms: u64) -> AcquireAnswer {
        self.answer(terms, Outcome::Acquired, None, None, Some(queued_at_ms))
    }

    /// The message of a poller answered while it waits in line since `queued_at_ms`.
    pub fn busy_message(&self, queued_at_ms: u64, poll_ms: u64) -> String {
        format!(
            "lock \"{}\" is full: {} is in its line since {} and holds no slot yet; ask again \
             within {} s with the same execution and state.EnteredTime and a larger \
             state.RetryCount to keep the place",
            self.lock,
            self.identity.holder,
            rfc3339_millis(queued_at_ms),
            poll_ms / 1000
        )
    }
}

/// How long a caller may wait in line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Budget {
    /// From when it was queued (`MAX_WAIT_SECONDS`).
    pub max_wait: Duration,
    /// How often a parked standard execution may check (each check adds to its history, which
    /// Step Functions caps at 25,000 events). A poller's polls keep no Standard history.
    pub max_checks: u64,
}

/// Where an invocation left its caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Taken {
    /// It holds a slot (`taken`: by this invocation's own write or hand-off; `queued_at_ms`:
    /// when it was put in line, if it waited).
    Holding {
        token: FencingToken,
        count: Option<usize>,
        taken: bool,
        queued_at_ms: Option<u64>,
    },
    /// In line (`new`: queued by this invocation, not a check finding it there): whoever grants
    /// it a slot completes its task.
    InLine { new: bool, queued_at_ms: u64 },
    /// A later attempt of its task has checked already: this invocation's task is over, and
    /// nothing is left to it.
    Superseded,
}

/// A flow that ended with its caller holding a slot or in line.
#[derive(Debug, Clone, PartialEq)]
pub struct Acquisition {
    pub taken: Taken,
    /// The lock as the acquire's write left it or saw it (the metrics'); `None` when the write
    /// that decided showed none.
    pub seen: Option<SemaphoreItem>,
    /// The terms taken: the operator's, on a lock it configured (F14), else the request's.
    pub terms: Terms,
}
