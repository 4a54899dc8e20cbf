//! The release flow: each path from its one write to an answer or a refusal, with the calls it
//! makes on the way (the hand-offs, and a redriven run's question to Step Functions, fence and
//! free of its earlier runs).

use semaphore_core::flow::release::{
    Call, EarlierRuns, Next, Outcome, Refusal, Release, ReleaseFlow, Reply, Request,
};
use semaphore_core::{
    AcquisitionId, CleanupOutcome, Fenced, FencingToken, HolderId, Holding, Identity, LockName,
    ReleaseOutcome, Run, SemaphoreItem, Weight,
};
use serde_json::json;

const HOLDER: &str = "arn:aws:states:us-east-1:123456789012:execution:M:e1";

fn identity(acquisition: &str) -> Identity {
    Identity::new(
        HolderId::new(HOLDER).unwrap(),
        AcquisitionId::new(acquisition).unwrap(),
    )
}

/// The release of `acquisition` (`r<n>` names run n) showing token 7.
fn request(acquisition: &str) -> Request {
    let run = acquisition.strip_prefix('r').and_then(|n| n.parse().ok());
    Request {
        lock: LockName::new("orders").unwrap(),
        identity: identity(acquisition),
        token: FencingToken(7),
        run,
        weight: Weight::ONE,
    }
}

/// The lock as a write left it: `count` slots held, `waiting` in line.
fn lock_after(count: usize, waiting: u64) -> SemaphoreItem {
    let mut item = SemaphoreItem::empty(LockName::new("orders").unwrap());
    item.used = count as u64;
    item.waiting = waiting;
    item
}

fn held(token: u64) -> Holding {
    Holding {
        token: FencingToken(token),
        acquired_at_ms: 1_800_000_000_000,
        weight: Weight::ONE,
    }
}

/// The release's own write freed its slot (`true`) or found none, leaving `waiting` in line.
fn released(freed: bool, waiting: u64) -> Reply {
    let outcome = if freed {
        ReleaseOutcome::Released {
            token: Some(FencingToken(7)),
            count: 1,
            waiting,
        }
    } else {
        ReleaseOutcome::NotHeld { count: 1, waiting }
    };
    Reply::Released {
        outcome,
        after: Box::new(lock_after(1, waiting)),
        held: freed.then(|| held(7)),
    }
}

fn done(next: Next) -> Result<Release, Refusal> {
    match next {
        Next::Done(done) => done,
        Next::Call(call) => panic!("still calling {call:?}"),
    }
}

/// What a fence of the request's lock found: `slots`, `count` held, `waiting` in line.
fn fenced(slots: Vec<(Identity, Holding)>, count: usize, waiting: u64) -> Fenced {
    Fenced {
        lock: LockName::new("orders").unwrap(),
        slots,
        count,
        waiting,
    }
}

#[test]
fn a_release_is_one_write_and_hands_off_only_when_someone_waits() {
    let request = request("r0");
    let (mut flow, first) = ReleaseFlow::start(request.clone());
    assert_eq!(first, Call::Release);
    let release = done(flow.resume(released(true, 0))).unwrap();
    assert_eq!(
        release,
        Release {
            released: true,
            count: 1,
            waiting: 0,
            handed_off: 0,
            earlier: EarlierRuns::NotRedriven
        }
    );
    // The answer the function gives, field for field.
    let answer = request.answer(&release, None);
    assert_eq!(
        serde_json::to_value(&answer).unwrap(),
        json!({"released": true, "outcome": "released", "count": 1, "lock": "orders",
               "acquisition": "r0", "handed_off": 0, "error": null, "cause": null})
    );

    // Someone waits: the line moves from the lock as the release left it.
    let (mut flow, _) = ReleaseFlow::start(request);
    assert_eq!(
        flow.resume(released(true, 2)),
        Next::Call(Call::HandOff {
            known: Some(Box::new(lock_after(1, 2)))
        })
    );
    let release = done(flow.resume(Reply::HandedOff { woken: 1 })).unwrap();
    assert_eq!((release.released, release.handed_off), (true, 1));
}

#[test]
fn a_release_that_finds_nothing_held_is_not_held_and_still_moves_a_line() {
    let (mut flow, _) = ReleaseFlow::start(request("r0"));
    let release = done(flow.resume(released(false, 0))).unwrap();
    assert_eq!(release.outcome(), Outcome::NotHeld);
    assert!(!release.released);
    let (mut flow, _) = ReleaseFlow::start(request("r0"));
    assert!(matches!(
        flow.resume(released(false, 1)),
        Next::Call(Call::HandOff { .. })
    ));
}

#[test]
fn the_wrong_token_is_refused_and_nothing_more_is_sent() {
    let request = request("r3");
    let (mut flow, _) = ReleaseFlow::start(request.clone());
    let wrong = Reply::Released {
        outcome: ReleaseOutcome::WrongToken {
            held: FencingToken(3),
            count: 1,
            waiting: 4,
        },
        after: Box::new(lock_after(1, 4)),
        held: None,
    };
    // No hand-off though four wait, and no question about its runs though it names run 3: the
    // store wrote nothing, and neither does the flow.
    let refusal = done(flow.resume(wrong)).unwrap_err();
    assert_eq!(
        refusal,
        Refusal::WrongToken {
            held: FencingToken(3)
        }
    );
    assert!(refusal.message(&request).contains(
        "holds its slot under fencing token 3, and this release shows token 7: it is not this \
         slot's acquire answer"
    ));
    assert_eq!(
        flow.resume(Reply::HandedOff { woken: 0 }),
        Next::Done(Err(Refusal::OutOfStep))
    );
}

#[test]
fn a_redriven_runs_release_frees_its_earlier_runs_once_step_functions_says_it_is_in_that_run() {
    let (mut flow, _) = ReleaseFlow::start(request("r2"));
    assert_eq!(
        flow.resume(released(false, 0)),
        Next::Call(Call::CurrentRun)
    );
    assert_eq!(
        flow.resume(Reply::Run(Ok(Some(Run(2))))),
        Next::Call(Call::Fence { last_run: Run(1) })
    );
    // What the runs before it hold: a zombie acquire of run 0, run 1's slot left to it.
    let slots = vec![(identity("r0"), held(2)), (identity("r1"), held(5))];
    assert_eq!(
        flow.resume(Reply::Fenced(fenced(slots.clone(), 3, 1))),
        Next::Call(Call::Free(fenced(slots.clone(), 3, 1)))
    );
    let freed = CleanupOutcome {
        freed: slots,
        count: 1,
        waiting: 1,
    };
    assert_eq!(
        flow.resume(Reply::Freed(freed)),
        Next::Call(Call::HandOff { known: None })
    );
    let release = done(flow.resume(Reply::HandedOff { woken: 1 })).unwrap();
    assert_eq!(
        release,
        Release {
            released: true,
            count: 1,
            waiting: 1,
            handed_off: 1,
            earlier: EarlierRuns::Fenced { run: 2, freed: 2 }
        }
    );
}

#[test]
fn a_redriven_run_whose_execution_step_functions_puts_in_an_older_run_frees_only_its_own() {
    // The payload names r2; Step Functions says run 1, or knows no such execution: no fence of
    // runs on the payload's word, and its own slot is all it frees.
    for current in [Some(Run(1)), Some(Run(0)), None] {
        let (mut flow, _) = ReleaseFlow::start(request("r2"));
        assert_eq!(flow.resume(released(true, 0)), Next::Call(Call::CurrentRun));
        let release = done(flow.resume(Reply::Run(Ok(current)))).unwrap();
        assert_eq!(
            release,
            Release {
                released: true,
                count: 1,
                waiting: 0,
                handed_off: 0,
                earlier: EarlierRuns::NotInRun { run: 2, current }
            },
            "{current:?}"
        );
    }
    // A later run than it names (redriven again since): its earlier runs have ended too.
    let (mut flow, _) = ReleaseFlow::start(request("r2"));
    flow.resume(released(true, 0));
    assert_eq!(
        flow.resume(Reply::Run(Ok(Some(Run(3))))),
        Next::Call(Call::Fence { last_run: Run(1) })
    );
}

#[test]
fn a_fence_that_finds_nothing_held_frees_nothing_and_hands_off_nothing() {
    let (mut flow, _) = ReleaseFlow::start(request("r1"));
    flow.resume(released(false, 0));
    flow.resume(Reply::Run(Ok(Some(Run(1)))));
    let fenced = Reply::Fenced(fenced(Vec::new(), 2, 3));
    let release = done(flow.resume(fenced)).unwrap();
    assert_eq!(
        release,
        Release {
            released: false,
            count: 2,
            waiting: 3,
            handed_off: 0,
            earlier: EarlierRuns::Fenced { run: 1, freed: 0 }
        }
    );
}

#[test]
fn a_first_run_or_an_acquisition_of_no_run_never_asks_step_functions() {
    for acquisition in ["r0", "3f1c2a9e-5b7d-4c4c-8d8d-0123456789ab"] {
        let (mut flow, _) = ReleaseFlow::start(request(acquisition));
        let release = done(flow.resume(released(true, 0))).unwrap();
        assert_eq!(release.earlier, EarlierRuns::NotRedriven, "{acquisition}");
    }
}

#[test]
fn when_step_functions_cannot_say_the_run_the_release_stands_and_the_earlier_runs_wait() {
    let request = request("r1");
    let (mut flow, _) = ReleaseFlow::start(request.clone());
    flow.resume(released(true, 0));
    let problem = "throttled".to_owned();
    let refusal = done(flow.resume(Reply::Run(Err(problem)))).unwrap_err();
    assert_eq!(
        refusal.message(&request),
        format!(
            "Step Functions could not say which run {HOLDER} is in, so its earlier runs were not \
             freed: throttled"
        )
    );
}

#[test]
fn a_reply_out_of_step_ends_the_flow_with_nothing_more_sent() {
    let (mut flow, _) = ReleaseFlow::start(request("r1"));
    assert_eq!(
        flow.resume(Reply::Run(Ok(Some(Run(1))))),
        Next::Done(Err(Refusal::OutOfStep))
    );
    // Once done, any reply is out of step.
    let (mut flow, _) = ReleaseFlow::start(request("r0"));
    done(flow.resume(released(true, 0))).unwrap();
    let again = done(flow.resume(released(true, 0))).unwrap_err();
    assert_eq!(again, Refusal::OutOfStep);
    assert!(again
        .message(&request("r0"))
        .contains("was driven out of step (a bug)"));
}
