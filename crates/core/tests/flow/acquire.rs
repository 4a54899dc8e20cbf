//! The acquire-or-wait flow: each path from its first acquire to a slot, a place in line or a
//! refusal, with the calls it makes on the way.

use std::time::Duration;

use semaphore_core::flow::acquire::{
    AcquireFlow, Acquisition, Budget, Call, Expiry, Next, OverBudget, Refusal, Reply, Request,
    Taken, Waiting, QUEUE_ROUNDS,
};
use semaphore_core::flow::answer::AcquireAnswer;
use semaphore_core::{
    AcquireOutcome, AcquisitionId, Attempt, FenceReason, FencingToken, HolderId, Identity, Limit,
    LockConfig, LockName, QueueOutcome, Run, SemaphoreItem, TaskToken, Terms, Waiter, Wakeup,
};

/// When the caller first asked (2027-01-15T08:00:00Z), and the invocation's clock.
const ASKED: u64 = 1_800_000_000_000;
const NOW: u64 = ASKED + 5_000;
const BUDGET: Budget = Budget {
    max_wait: Duration::from_secs(900),
    max_checks: 50,
};

fn limit(n: i64) -> Limit {
    Limit::new(n).unwrap()
}

fn request(waiting: Waiting, retry: u64) -> Request {
    Request {
        lock: LockName::new("orders").unwrap(),
        terms: Terms::from(limit(2)),
        identity: Identity::new(
            HolderId::new("arn:aws:states:us-east-1:123456789012:execution:M:e1").unwrap(),
            AcquisitionId::new("r0").unwrap(),
        ),
        run: Run::FIRST,
        requested_at_ms: ASKED,
        asked_at_ms: ASKED,
        attempt: Attempt::new(ASKED, retry),
        waiting,
        work: None,
    }
}

fn parked(retry: u64) -> Request {
    request(
        Waiting::Parked(TaskToken::new(format!("task-{retry}")).unwrap()),
        retry,
    )
}

fn polls() -> Request {
    request(Waiting::Polls { poll_ms: 60_000 }, 0)
}

fn full() -> Reply {
    Reply::Acquired {
        outcome: AcquireOutcome::Full {
            count: 2,
            used: 2,
            limit: limit(2),
        },
        seen: None,
    }
}

/// Its record in line, as an earlier attempt `retry` left it after `checks` checks.
fn record(request: &Request, retry: u64, checks: u32) -> Waiter {
    let mut waiter = Waiter::new(
        request.lock.clone(),
        request.identity.clone(),
        request.run,
        request.terms,
        ASKED,
        TaskToken::new(format!("task-{retry}")).unwrap(),
        Attempt::new(ASKED, retry),
        String::new(),
    );
    waiter.checks = checks;
    waiter
}

/// Sends `replies` in turn: what the flow does after the last.
fn run(flow: &mut AcquireFlow, replies: Vec<Reply>) -> Next {
    let mut last = None;
    for reply in replies {
        last = Some(flow.resume(reply, NOW));
    }
    last.expect("at least one reply")
}

fn done(next: Next) -> Result<Acquisition, Refusal> {
    match next {
        Next::Done(done) => done,
        Next::Call(call) => panic!("still calling {call:?}"),
    }
}

#[test]
fn a_free_slot_is_one_acquire_and_nothing_else() {
    let (mut flow, first) = AcquireFlow::start(parked(0), BUDGET);
    assert_eq!(
        first,
        Call::Acquire {
            terms: Terms::from(limit(2))
        }
    );
    let reply = Reply::Acquired {
        outcome: AcquireOutcome::Acquired {
            token: FencingToken(7),
            count: 1,
        },
        seen: None,
    };
    let acquisition = done(flow.resume(reply, NOW)).unwrap();
    assert_eq!(
        acquisition.taken,
        Taken::Holding {
            token: FencingToken(7),
            count: Some(1),
            taken: true,
            queued_at_ms: None
        }
    );
}

#[test]
fn a_full_lock_queues_the_caller_at_its_first_ask_then_hands_off() {
    let request = parked(0);
    let (mut flow, _) = AcquireFlow::start(request.clone(), BUDGET);
    assert_eq!(flow.resume(full(), NOW), Next::Call(Call::ReadWaiter));
    let Next::Call(Call::Enqueue(waiter)) = flow.resume(Reply::Waiter(None), NOW) else {
        panic!("not queued")
    };
    assert_eq!(waiter.key.queued_at_ms, ASKED);
    assert_eq!(
        waiter.wakeup,
        Wakeup::Task(TaskToken::new("task-0").unwrap())
    );
    // The answer its grant will send, kept in its record: the slot to be filled in.
    let kept: AcquireAnswer = serde_json::from_str(&waiter.context).unwrap();
    assert_eq!(kept, request.waiting_answer(&request.terms, ASKED));
    assert_eq!(kept.token, None);
    // F8: a slot freed between "full" and "queued" is handed on by the caller itself.
    assert_eq!(
        flow.resume(Reply::Queued(QueueOutcome::Queued), NOW),
        Next::Call(Call::HandOff)
    );
    let acquisition = done(flow.resume(Reply::HandedOff { granted: None }, NOW)).unwrap();
    assert_eq!(
        acquisition.taken,
        Taken::InLine {
            new: true,
            queued_at_ms: ASKED
        }
    );
}

#[test]
fn a_poller_granted_by_its_own_hand_off_holds_its_slot_and_a_parked_caller_is_woken() {
    for (request, holds) in [(polls(), true), (parked(0), false)] {
        let (mut flow, _) = AcquireFlow::start(request, BUDGET);
        let next = run(
            &mut flow,
            vec![
                full(),
                Reply::Waiter(None),
                Reply::Queued(QueueOutcome::Queued),
            ],
        );
        assert_eq!(next, Next::Call(Call::HandOff));
        let granted = Some(FencingToken(9));
        let taken = done(flow.resume(Reply::HandedOff { granted }, NOW))
            .unwrap()
            .taken;
        if holds {
            assert_eq!(
                taken,
                Taken::Holding {
                    token: FencingToken(9),
                    count: None,
                    taken: true,
                    queued_at_ms: Some(ASKED)
                }
            );
        } else {
            // Its task was completed by the hand-off's wake-up: this invocation leaves it in line.
            assert_eq!(
                taken,
                Taken::InLine {
                    new: true,
                    queued_at_ms: ASKED
                }
            );
        }
    }
}

#[test]
fn a_lock_turning_free_and_full_under_every_queue_write_is_refused_after_its_rounds() {
    let (mut flow, _) = AcquireFlow::start(parked(0), BUDGET);
    flow.resume(full(), NOW);
    let mut next = flow.resume(Reply::Waiter(None), NOW);
    let mut writes = 0;
    while let Next::Call(Call::Enqueue(_)) = next {
        writes += 1;
        // Free when queueing, full again when acquiring.
        let free = flow.resume(Reply::Queued(QueueOutcome::Free), NOW);
        assert!(matches!(free, Next::Call(Call::Acquire { .. })), "{free:?}");
        next = flow.resume(full(), NOW);
    }
    assert_eq!(writes, QUEUE_ROUNDS);
    assert_eq!(done(next), Err(Refusal::Expired(Expiry::Churn)));
}

#[test]
fn a_check_of_a_record_keeps_its_place_with_this_attempts_wake_up() {
    let request = parked(2);
    let (mut flow, _) = AcquireFlow::start(request.clone(), BUDGET);
    flow.resume(full(), NOW);
    let next = flow.resume(Reply::Waiter(Some(record(&request, 1, 1))), NOW);
    assert_eq!(
        next,
        Next::Call(Call::Repark(Wakeup::Task(
            TaskToken::new("task-2").unwrap()
        )))
    );
    // A wake-up may have been lost: the line moves after the re-park.
    assert_eq!(
        flow.resume(Reply::InLine(true), NOW),
        Next::Call(Call::HandOff)
    );
    let taken = done(flow.resume(Reply::HandedOff { granted: None }, NOW))
        .unwrap()
        .taken;
    assert_eq!(
        taken,
        Taken::InLine {
            new: false,
            queued_at_ms: ASKED
        }
    );
}

#[test]
fn a_record_of_a_later_attempt_ends_this_invocation_and_its_own_attempts_moves_the_line() {
    let request = parked(1);
    let (mut flow, _) = AcquireFlow::start(request.clone(), BUDGET);
    flow.resume(full(), NOW);
    let later = flow.resume(Reply::Waiter(Some(record(&request, 2, 0))), NOW);
    assert_eq!(done(later).unwrap().taken, Taken::Superseded);

    let (mut flow, _) = AcquireFlow::start(request.clone(), BUDGET);
    flow.resume(full(), NOW);
    let own = flow.resume(Reply::Waiter(Some(record(&request, 1, 0))), NOW);
    assert_eq!(own, Next::Call(Call::HandOff));
}

#[test]
fn a_waiter_past_its_budget_leaves_the_line_unless_it_was_granted_meanwhile() {
    let request = parked(1);
    let late = ASKED + 901_000;
    // Past MAX_WAIT_SECONDS: it leaves, and is told so.
    let (mut flow, _) = AcquireFlow::start(request.clone(), BUDGET);
    flow.resume(full(), late);
    let next = flow.resume(Reply::Waiter(Some(record(&request, 0, 0))), late);
    assert_eq!(next, Next::Call(Call::Leave));
    let refusal = done(flow.resume(Reply::InLine(true), late)).unwrap_err();
    assert_eq!(
        refusal,
        Refusal::WaitTimeout {
            waited_ms: 901_000,
            limit: limit(2),
            over: OverBudget::MaxWait(BUDGET.max_wait)
        }
    );
    assert!(refusal
        .message(&request)
        .contains("MAX_WAIT_SECONDS of 900 s"));
    // Granted between the read and the leave: the slot is its own, found by the acquire again.
    let (mut flow, _) = AcquireFlow::start(request.clone(), BUDGET);
    flow.resume(full(), late);
    flow.resume(Reply::Waiter(Some(record(&request, 0, 0))), late);
    let again = flow.resume(Reply::InLine(false), late);
    assert!(
        matches!(again, Next::Call(Call::Acquire { .. })),
        "{again:?}"
    );
    let held = Reply::Acquired {
        outcome: AcquireOutcome::AlreadyHeld {
            token: FencingToken(4),
            count: 2,
        },
        seen: None,
    };
    let taken = done(flow.resume(held, late)).unwrap().taken;
    assert!(
        matches!(taken, Taken::Holding { taken: false, .. }),
        "{taken:?}"
    );
}

#[test]
fn only_a_parked_callers_checks_are_bounded_by_its_history() {
    for (request, leaves) in [(parked(1), true), (polls(), false)] {
        let (mut flow, _) = AcquireFlow::start(request.clone(), BUDGET);
        flow.resume(full(), NOW);
        let mut kept = record(&request, 0, 50);
        if !leaves {
            kept.wakeup = Wakeup::Poll { until_ms: NOW };
            kept.attempt = Attempt::new(ASKED - 1, 0);
        }
        let next = flow.resume(Reply::Waiter(Some(kept)), NOW);
        if leaves {
            assert_eq!(next, Next::Call(Call::Leave));
            let refusal = done(flow.resume(Reply::InLine(true), NOW)).unwrap_err();
            assert!(matches!(
                refusal,
                Refusal::WaitTimeout {
                    over: OverBudget::Checks(50),
                    ..
                }
            ));
        } else {
            // A poll keeps its place for another window.
            assert_eq!(
                next,
                Next::Call(Call::Repark(Wakeup::Poll {
                    until_ms: NOW + 60_000
                }))
            );
        }
    }
}

#[test]
fn a_request_past_its_horizon_keeps_a_waiters_place_but_queues_nobody() {
    let expired = Reply::Acquired {
        outcome: AcquireOutcome::Expired,
        seen: None,
    };
    let (mut flow, _) = AcquireFlow::start(parked(0), BUDGET);
    flow.resume(expired, NOW);
    let refusal = done(flow.resume(Reply::Waiter(None), NOW)).unwrap_err();
    assert_eq!(refusal, Refusal::Expired(Expiry::Horizon));
}

#[test]
fn on_a_configured_lock_the_caller_queues_and_is_answered_on_the_operators_terms() {
    let request = parked(0);
    let mut item = SemaphoreItem::empty(request.lock.clone());
    item.config = Some(LockConfig::new(limit(1), None, None).unwrap());
    let (mut flow, _) = AcquireFlow::start(request, BUDGET);
    let refused = Reply::Acquired {
        outcome: AcquireOutcome::Full {
            count: 1,
            used: 1,
            limit: limit(1),
        },
        seen: Some(item),
    };
    flow.resume(refused, NOW);
    let Next::Call(Call::Enqueue(waiter)) = flow.resume(Reply::Waiter(None), NOW) else {
        panic!("not queued")
    };
    assert_eq!(waiter.terms.limit, limit(1));
    flow.resume(Reply::Queued(QueueOutcome::Queued), NOW);
    let acquisition = done(flow.resume(Reply::HandedOff { granted: None }, NOW)).unwrap();
    assert_eq!(acquisition.terms.limit, limit(1));
}

#[test]
fn a_fenced_acquisition_is_refused_for_good_and_a_reply_out_of_step_ends_the_flow() {
    let (mut flow, _) = AcquireFlow::start(parked(0), BUDGET);
    let fenced = Reply::Acquired {
        outcome: AcquireOutcome::Fenced(FenceReason::ExecutionEnded),
        seen: None,
    };
    assert_eq!(
        done(flow.resume(fenced, NOW)),
        Err(Refusal::Fenced(FenceReason::ExecutionEnded))
    );
    let (mut flow, _) = AcquireFlow::start(parked(0), BUDGET);
    assert_eq!(
        done(flow.resume(Reply::InLine(true), NOW)),
        Err(Refusal::OutOfStep)
    );
}
