//! Why an acquisition holds no slot and is not in line ([`Refusal`]), and what its caller is
//! told.

use std::time::Duration;

use super::request::Request;
use crate::clock::rfc3339_millis;
use crate::input::Limit;
use crate::protocol::FenceReason;

/// Why an acquisition holds no slot and is not in line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Refusal {
    /// For good: it can never hold a slot (`SemaphoreFenced`).
    Fenced(FenceReason),
    /// It waited past its budget and left the line (`SemaphoreWaitTimeout`).
    WaitTimeout {
        waited_ms: u64,
        limit: Limit,
        over: OverBudget,
    },
    /// Nothing was held or queued; ask again (`SemaphoreExpired`).
    Expired(Expiry),
    /// A driver answered a call with another call's reply: a bug of the driver, nothing of the
    /// caller's.
    OutOfStep,
}

/// Which budget a waiter passed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OverBudget {
    MaxWait(Duration),
    Checks(u32),
}

/// Why a request was too old to be written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Expiry {
    /// Older than the acquire horizon (see [`crate::Timing`]).
    Horizon,
    /// The lock turned free and full again under each of its [`QUEUE_ROUNDS`](super::QUEUE_ROUNDS) queue writes.
    Churn,
}

impl Refusal {
    /// What the caller is told, naming its lock and holder and what to do.
    pub fn message(&self, request: &Request) -> String {
        let (lock, identity) = (&request.lock, &request.identity);
        match self {
            Self::Fenced(reason) => format!(
                "acquisition {} of {} on lock \"{lock}\" is fenced: {}; it can never hold a slot, \
                 a new acquire needs a new acquisition id",
                identity.acquisition,
                identity.holder,
                reason.describe()
            ),
            Self::WaitTimeout {
                waited_ms,
                limit,
                over,
            } => {
                let why = match over {
                    OverBudget::MaxWait(max_wait) => format!(
                        "longer than the acquire function's MAX_WAIT_SECONDS of {} s. Start it \
                         again later, or raise the limit or the stack's MaxWaitSeconds",
                        max_wait.as_secs()
                    ),
                    OverBudget::Checks(checks) => format!(
                        "and checked {checks} times: more would pass Step Functions' 25,000 \
                         events of one execution's history. Lengthen the acquire state's \
                         TimeoutSeconds"
                    ),
                };
                format!(
                    "{} has waited {} s for a slot of lock \"{lock}\" (limit {limit}) {why}; it \
                     holds no slot",
                    identity.holder,
                    waited_ms / 1000,
                )
            }
            Self::Expired(expiry) => {
                let why = match expiry {
                    Expiry::Horizon => "is older than the acquire horizon",
                    Expiry::Churn => "found the lock turning free and full again under it",
                };
                format!(
                    "the acquire of {} on lock \"{lock}\" asked at {} {why}: nothing is held or \
                     queued; enter the acquire state again (its Catch of SemaphoreExpired does)",
                    identity.holder,
                    rfc3339_millis(request.requested_at_ms)
                )
            }
            Self::OutOfStep => format!(
                "the acquire of {} on lock \"{lock}\" was driven out of step (a bug): nothing \
                 more was sent; enter the acquire state again",
                identity.holder
            ),
        }
    }
}
