//! The cleanup flow: each path from Step Functions' first word on an ended execution to what
//! its locks are left with, with the calls it makes on the way.

use semaphore_core::flow::cleanup::answer::CleanupSummary;
use semaphore_core::flow::cleanup::{
    Call, Cleaned, CleanupFlow, End, Execution, LeftLine, LockStep, Locks, Next, Refusal, Reply,
};
use semaphore_core::{
    AcquisitionId, CleanupOutcome, Fenced, FencingToken, HolderId, Holding, Identity, LockName,
    Run, WaiterId, Weight,
};

const EXECUTION: &str = "arn:aws:states:us-east-1:123456789012:execution:M:e1";
/// When the slots were taken, and the invocation's clock.
const TAKEN: u64 = 1_800_000_000_000;
const NOW: u64 = TAKEN + 30_000;

fn holder() -> HolderId {
    HolderId::new(EXECUTION).unwrap()
}

fn lock(name: &str) -> LockName {
    LockName::new(name).unwrap()
}

fn identity(acquisition: &str) -> Identity {
    Identity::new(holder(), AcquisitionId::new(acquisition).unwrap())
}

fn waiter(acquisition: &str) -> WaiterId {
    WaiterId::of(&identity(acquisition))
}

/// Its slot `acquisition` on a lock, taken at [`TAKEN`].
fn slot(acquisition: &str, token: u64) -> (Identity, Holding) {
    let holding = Holding {
        token: FencingToken(token),
        acquired_at_ms: TAKEN,
        weight: Weight::new(1).unwrap(),
    };
    (identity(acquisition), holding)
}

/// What the fence of `name` found: these slots of the execution, `waiting` in line.
fn fenced(name: &str, slots: Vec<(Identity, Holding)>, waiting: u64) -> Fenced {
    Fenced {
        lock: lock(name),
        count: slots.len() + 1,
        slots,
        waiting,
    }
}

/// The free of what `fence` saw: every slot of it.
fn freed(fence: &Fenced) -> CleanupOutcome {
    CleanupOutcome {
        freed: fence.slots.clone(),
        count: fence.count - fence.slots.len(),
        waiting: fence.waiting,
    }
}

fn ended(run: u32) -> Reply {
    Reply::Execution(Execution::Ended { run: Run(run) })
}

/// "orders" (slot r0, two waiting, and a record of the execution in its line) and "reports"
/// (slot r1, nobody waiting).
fn found() -> Locks {
    Locks {
        locks: vec![lock("orders"), lock("reports")],
        waiters: vec![(lock("orders"), waiter("r0"))],
    }
}

fn orders() -> Fenced {
    fenced("orders", vec![slot("r0", 7)], 2)
}

fn reports() -> Fenced {
    fenced("reports", vec![slot("r1", 3)], 0)
}

/// Drives a new flow with `script`: each call the flow makes, and the reply it is sent (at
/// [`NOW`]). The last reply must end the flow.
fn drive(script: Vec<(Call, Reply)>) -> Result<Cleaned, Refusal> {
    let (mut flow, mut call) = CleanupFlow::start(holder());
    let steps = script.len();
    for (at, (expected, reply)) in script.into_iter().enumerate() {
        assert_eq!(call, expected, "call {at}");
        match flow.resume(reply, NOW) {
            Next::Call(next) => call = next,
            Next::Done(done) => {
                assert_eq!(at + 1, steps, "done after {} of {steps} replies", at + 1);
                return done;
            }
        }
    }
    panic!("still calling {call:?}")
}

/// Up to the second question to Step Functions: asked, found, fenced both locks, out of the
/// line of "orders".
fn up_to_the_fences() -> Vec<(Call, Reply)> {
    vec![
        (Call::Describe, ended(0)),
        (Call::FindLocks, Reply::Locks(Some(found()))),
        (fence("orders", 0), Reply::Fenced(orders())),
        (fence("reports", 0), Reply::Fenced(reports())),
        (read_waiter("orders", "r0"), Reply::InLine(true)),
        (leave("orders", "r0"), Reply::InLine(true)),
    ]
}

fn fence(name: &str, run: u32) -> Call {
    Call::Fence {
        lock: lock(name),
        run: Run(run),
    }
}

fn read_waiter(name: &str, acquisition: &str) -> Call {
    let (lock, id) = (lock(name), waiter(acquisition));
    Call::ReadWaiter { lock, id }
}

fn leave(name: &str, acquisition: &str) -> Call {
    let (lock, id) = (lock(name), waiter(acquisition));
    Call::Leave { lock, id }
}

fn left_orders() -> Vec<LeftLine> {
    vec![LeftLine {
        lock: lock("orders"),
        id: waiter("r0"),
        at_ms: NOW,
    }]
}

#[test]
fn an_ended_execution_is_fenced_taken_out_of_line_and_freed_and_the_line_moves() {
    let mut script = up_to_the_fences();
    script.extend([
        (Call::Describe, ended(0)),
        (Call::StopWork, Reply::WorkRuns(false)),
        (Call::Free(orders()), Reply::Freed(freed(&orders()))),
        (Call::Free(reports()), Reply::Freed(freed(&reports()))),
        // A slot freed and someone waiting: only "orders" is handed off.
        (
            Call::HandOff {
                lock: lock("orders"),
            },
            Reply::HandedOff { woken: 1 },
        ),
    ]);
    let cleaned = drive(script).unwrap();
    assert_eq!(cleaned.end, End::Freed { at_ms: NOW });
    assert_eq!(cleaned.left_line, left_orders());
    assert_eq!(cleaned.handed_off, 1);
    assert!(cleaned.failed.is_empty());
    assert!(cleaned.is_clean() && !cleaned.retry());
    assert_eq!(cleaned.locks.len(), 2);
    assert_eq!(cleaned.locks[0].freed, Some(freed(&orders())));

    // The answer: what each lock freed, held for how long, and what is held after.
    let mut summary = CleanupSummary::new(EXECUTION, "FAILED");
    summary.record(&cleaned);
    let answer = serde_json::to_value(&summary).unwrap();
    assert_eq!(answer["cleaned"], true);
    assert_eq!(answer["left_line"], serde_json::json!(["orders"]));
    assert_eq!(answer["handed_off"], 1);
    assert_eq!(
        answer["locks"],
        serde_json::json!([
            {"lock": "orders", "freed": [{"acquisition": "r0", "token": 7, "held_for_ms": 30_000}], "count": 1},
            {"lock": "reports", "freed": [{"acquisition": "r1", "token": 3, "held_for_ms": 30_000}], "count": 1},
        ])
    );
}

#[test]
fn the_fences_stop_the_run_step_functions_says_it_ended_in() {
    let (mut flow, _) = CleanupFlow::start(holder());
    assert_eq!(flow.resume(ended(3), NOW), Next::Call(Call::FindLocks));
    let next = flow.resume(Reply::Locks(Some(found())), NOW);
    assert_eq!(next, Next::Call(fence("orders", 3)));
}

#[test]
fn an_execution_running_again_or_gone_is_left_alone() {
    for (execution, end) in [
        (Execution::Running, End::RunsAgain),
        (Execution::Missing, End::Missing),
    ] {
        let cleaned = drive(vec![(Call::Describe, Reply::Execution(execution))]).unwrap();
        assert_eq!(cleaned.end, end);
        assert!(cleaned.locks.is_empty() && !cleaned.is_clean());
    }
    let untold = drive(vec![(Call::Describe, Reply::Execution(Execution::Untold))]);
    assert_eq!(untold, Err(Refusal::Untold));
    assert!(Refusal::Untold.message(&holder()).contains(EXECUTION));
}

#[test]
fn locks_that_cannot_be_told_are_left_alone_and_no_lock_is_clean() {
    let untold = drive(vec![
        (Call::Describe, ended(0)),
        (Call::FindLocks, Reply::Locks(None)),
    ])
    .unwrap();
    assert_eq!(untold.end, End::LocksUntold);
    assert!(!untold.is_clean());

    let none = drive(vec![
        (Call::Describe, ended(0)),
        (Call::FindLocks, Reply::Locks(Some(Locks::default()))),
    ])
    .unwrap();
    assert_eq!(none.end, End::NoLocks);
    assert!(none.is_clean());
}

/// F7: redriven between the fence and the free, the execution runs again: nothing of it is
/// freed (its new run may carry a slot into its work), and what it holds is reported kept.
#[test]
fn an_execution_redriven_between_the_fence_and_the_free_keeps_what_it_holds() {
    let mut script = up_to_the_fences();
    script.push((Call::Describe, Reply::Execution(Execution::Running)));
    let cleaned = drive(script).unwrap();
    assert_eq!(cleaned.end, End::RedrivenMeanwhile);
    assert!(cleaned.locks.iter().all(|lock| lock.freed.is_none()));
    assert!(!cleaned.is_clean() && !cleaned.retry());

    let mut summary = CleanupSummary::new(EXECUTION, "FAILED");
    summary.record(&cleaned);
    let kept: Vec<(&str, Vec<String>, Option<usize>)> = (summary.locks.iter())
        .map(|lock| (lock.lock.as_str(), lock.kept.clone(), lock.count))
        .collect();
    assert_eq!(
        kept,
        [
            ("orders", vec!["r0".to_owned()], None),
            ("reports", vec!["r1".to_owned()], None)
        ]
    );
    assert!(!summary.cleaned);
}

#[test]
fn while_its_work_runs_nothing_is_freed() {
    let mut script = up_to_the_fences();
    script.extend([
        (Call::Describe, ended(0)),
        (Call::StopWork, Reply::WorkRuns(true)),
    ]);
    let cleaned = drive(script).unwrap();
    assert_eq!(cleaned.end, End::WorkRuns);
    assert!(cleaned.locks.iter().all(|lock| lock.freed.is_none()));
    assert!(!cleaned.is_clean());
}

/// Gone by the second question (its history expired meanwhile): the fences stand, and it
/// cannot run again; what they saw is freed.
#[test]
fn an_execution_gone_once_the_fences_stand_is_freed() {
    let script = vec![
        (Call::Describe, ended(0)),
        (
            Call::FindLocks,
            Reply::Locks(Some(Locks {
                locks: vec![lock("reports")],
                waiters: Vec::new(),
            })),
        ),
        (fence("reports", 0), Reply::Fenced(reports())),
        (Call::Describe, Reply::Execution(Execution::Missing)),
        (Call::StopWork, Reply::WorkRuns(false)),
        (Call::Free(reports()), Reply::Freed(freed(&reports()))),
    ];
    assert_eq!(drive(script).unwrap().end, End::Freed { at_ms: NOW });
}

/// A free whose answer was lost (the store call failed): its lock is named, nothing is handed
/// off there, the other lock is freed and handed off all the same, and the cleanup is to be asked
/// again (its retry frees what is left, or finds it freed).
#[test]
fn a_lost_free_answer_names_its_lock_and_the_others_are_freed() {
    let reports = fenced("reports", vec![slot("r1", 3)], 1);
    let mut script = vec![
        (Call::Describe, ended(0)),
        (Call::FindLocks, Reply::Locks(Some(found()))),
        (fence("orders", 0), Reply::Fenced(orders())),
        (fence("reports", 0), Reply::Fenced(reports.clone())),
        (read_waiter("orders", "r0"), Reply::InLine(true)),
        (leave("orders", "r0"), Reply::InLine(true)),
    ];
    script.extend([
        (Call::Describe, ended(0)),
        (Call::StopWork, Reply::WorkRuns(false)),
        (Call::Free(orders()), Reply::Failed),
        (Call::Free(reports.clone()), Reply::Freed(freed(&reports))),
        (
            Call::HandOff {
                lock: lock("reports"),
            },
            Reply::HandedOff { woken: 1 },
        ),
    ]);
    let cleaned = drive(script).unwrap();
    assert_eq!(cleaned.failed, [(lock("orders"), LockStep::Free)]);
    assert_eq!(cleaned.locks[0].freed, None);
    assert!(cleaned.retry() && !cleaned.is_clean());
    assert_eq!(LockStep::Free.describe(), "freeing");
}

/// A lock whose fence failed is retried whole: neither its line nor its slots are touched
/// (without the fence, a late acquire could still land after the free).
#[test]
fn a_failed_fence_leaves_its_lock_to_the_retry() {
    let script = vec![
        (Call::Describe, ended(0)),
        (Call::FindLocks, Reply::Locks(Some(found()))),
        (fence("orders", 0), Reply::Failed),
        (fence("reports", 0), Reply::Fenced(reports())),
        // No read of the line of "orders".
        (Call::Describe, ended(0)),
        (Call::StopWork, Reply::WorkRuns(false)),
        (Call::Free(reports()), Reply::Freed(freed(&reports()))),
    ];
    let cleaned = drive(script).unwrap();
    assert_eq!(cleaned.failed, [(lock("orders"), LockStep::Fence)]);
    assert_eq!(cleaned.locks.len(), 1);
    assert!(cleaned.retry());
}

/// The execution's record is read before it is taken out: one not in line costs no write, and
/// one granted (or gone) between the read and the leave is not counted as taken out. A failed
/// read or leave is its lock's failure; the lock is freed all the same.
#[test]
fn a_waiter_is_taken_out_of_line_only_if_it_is_there() {
    let two_lines = Locks {
        locks: vec![lock("orders"), lock("reports")],
        waiters: vec![
            (lock("orders"), waiter("r0")),
            (lock("reports"), waiter("r1")),
        ],
    };
    for (line, left) in [
        (
            vec![(read_waiter("orders", "r0"), Reply::InLine(false))],
            false,
        ),
        (
            vec![
                (read_waiter("orders", "r0"), Reply::InLine(true)),
                (leave("orders", "r0"), Reply::InLine(false)),
            ],
            false,
        ),
        (
            vec![
                (read_waiter("orders", "r0"), Reply::InLine(true)),
                (leave("orders", "r0"), Reply::InLine(true)),
            ],
            true,
        ),
    ] {
        let mut script = vec![
            (Call::Describe, ended(0)),
            (Call::FindLocks, Reply::Locks(Some(two_lines.clone()))),
            (fence("orders", 0), Reply::Fenced(orders())),
            (fence("reports", 0), Reply::Fenced(reports())),
        ];
        script.extend(line);
        script.extend([
            (read_waiter("reports", "r1"), Reply::Failed),
            (Call::Describe, ended(0)),
            (Call::StopWork, Reply::WorkRuns(true)),
        ]);
        let cleaned = drive(script).unwrap();
        assert_eq!(cleaned.left_line.len(), usize::from(left));
        assert_eq!(cleaned.failed, [(lock("reports"), LockStep::ReadLine)]);
        // Deferred with a failure: asked again.
        assert!(cleaned.retry());
    }
}

/// A reply that is not the answer to the call made (a driver's bug) ends the flow by name,
/// never with a panic, and sends nothing more.
#[test]
fn a_reply_out_of_step_ends_the_flow() {
    let out_of_step = [
        vec![(Call::Describe, Reply::Failed)],
        vec![(Call::Describe, Reply::Fenced(orders()))],
        vec![
            (Call::Describe, ended(0)),
            (Call::FindLocks, Reply::Execution(Execution::Running)),
        ],
        // The fence of another lock than the one asked.
        vec![
            (Call::Describe, ended(0)),
            (Call::FindLocks, Reply::Locks(Some(found()))),
            (fence("orders", 0), Reply::Fenced(reports())),
        ],
        vec![
            (Call::Describe, ended(0)),
            (Call::FindLocks, Reply::Locks(Some(found()))),
            (fence("orders", 0), Reply::Fenced(orders())),
            (fence("reports", 0), Reply::Fenced(reports())),
            (read_waiter("orders", "r0"), Reply::WorkRuns(false)),
        ],
    ];
    for script in out_of_step {
        assert_eq!(drive(script), Err(Refusal::OutOfStep));
    }
    // Once done, done.
    let (mut flow, _) = CleanupFlow::start(holder());
    let next = flow.resume(Reply::Execution(Execution::Running), NOW);
    assert!(matches!(next, Next::Done(Ok(_))));
    assert_eq!(
        flow.resume(Reply::Execution(Execution::Running), NOW),
        Next::Done(Err(Refusal::OutOfStep))
    );
    assert!(Refusal::OutOfStep
        .message(&holder())
        .contains("out of step"));
}
