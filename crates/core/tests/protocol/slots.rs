//! Acquire, release, cleanup and the rotation of the fences: each write landed on an item as a
//! store lands it.

use semaphore_core::protocol::{
    acquire, acquired, busy_rotation, cleanup_fence, cleanup_free, fenced_slots, freed, freed_seen,
    release, release_unheld, released, rotation, BUSY_YOUNG_FENCES,
};
use semaphore_core::{
    AcquireOutcome, AcquisitionId, Check, Claim, FenceReason, FencingToken, HolderId, Identity,
    ReleaseOutcome, Run, SemaphoreItem, Step, StoreError, Weight, Write, WriteResult,
};

use crate::{limit, lock, T};

fn id(h: &str, a: &str) -> Identity {
    Identity::new(HolderId::new(h).unwrap(), AcquisitionId::new(a).unwrap())
}

fn done<T>(step: Result<Step<T>, StoreError>) -> T {
    match step.unwrap() {
        Step::Done(done) => done,
        Step::Again(write) => panic!("refused, calling for {write:?}"),
    }
}

/// Applies a write as a store would and hands back its result.
fn land(write: &Write, item: &mut Option<SemaphoreItem>) -> WriteResult {
    match write.apply(item.as_ref()) {
        Ok(next) => WriteResult::Applied {
            before: item.replace(next),
        },
        Err(_) => WriteResult::Refused {
            current: item
                .clone()
                .unwrap_or_else(|| SemaphoreItem::empty(write.lock.clone())),
            waiter_refused: false,
        },
    }
}

fn take(item: &mut Option<SemaphoreItem>, who: &Identity, n: i64, at: u64) -> AcquireOutcome {
    match acquire(&lock(), who, Run::FIRST, None, limit(n), at, at, &T) {
        Ok(write) => {
            let result = land(&write, item);
            acquired(&write, who, limit(n), result).unwrap()
        }
        Err(answer) => answer,
    }
}

/// Lands a write, loses its answer, and answers the SDK's second attempt of it (F10).
fn land_unanswered(write: &Write, item: &mut Option<SemaphoreItem>) -> WriteResult {
    let _lost = land(write, item);
    match land(write, item) {
        WriteResult::Refused { current, .. } => WriteResult::Unsure { current },
        applied => applied,
    }
}

#[test]
fn a_release_or_cleanup_whose_answer_was_lost_says_what_its_first_attempt_did() {
    let mut item = None;
    let (a, b) = (id("a", "1"), id("a", "2"));
    for who in [&a, &b] {
        assert!(matches!(
            take(&mut item, who, 3, 0),
            AcquireOutcome::Acquired { .. }
        ));
    }
    // A retried acquire finds its own slot.
    let write = acquire(&lock(), &a, Run::FIRST, None, limit(3), 0, 0, &T).unwrap();
    let token = item.as_ref().unwrap().holders[&a].token;
    assert_eq!(
        acquired(&write, &a, limit(3), land_unanswered(&write, &mut item)).unwrap(),
        AcquireOutcome::AlreadyHeld { token, count: 2 }
    );
    // A release: the slot is gone and its own fence is there: it released.
    let claim = Claim::Slot {
        token,
        weight: Weight::ONE,
    };
    let write = release(&lock(), &a, token, Weight::ONE, 0);
    let (outcome, _) = done(released(
        &write,
        &a,
        claim,
        land_unanswered(&write, &mut item),
    ));
    assert_eq!(
        outcome,
        ReleaseOutcome::Released {
            token: Some(token),
            count: 1,
            waiting: 0
        }
    );
    // A duplicate release, answered, still says it held nothing, and writes nothing more: the
    // slot whose token it shows was freed by a write that fenced its acquisition.
    let result = land(&write, &mut item);
    let (outcome, _) = done(released(&write, &a, claim, result));
    assert!(matches!(outcome, ReleaseOutcome::NotHeld { .. }));
    // The operator's release of it (no token) fences it again, on the check that it holds
    // nothing.
    let Step::Again(unheld) =
        released(&write, &a, Claim::Operator, land(&write, &mut item)).unwrap()
    else {
        panic!("a refused operator's release sends the release of nothing held")
    };
    assert_eq!(unheld, release_unheld(&lock(), &a, 0));
    let (outcome, _) = done(released(
        &unheld,
        &a,
        Claim::Operator,
        land(&unheld, &mut item),
    ));
    assert!(matches!(outcome, ReleaseOutcome::NotHeld { .. }));
    // A cleanup: what it freed, as its fence saw it, rather than nothing.
    let fence = cleanup_fence(&lock(), &b.holder, Run::FIRST);
    let (slots, after) = fenced_slots(&fence, &b.holder, land(&fence, &mut item)).unwrap();
    let seen: Vec<_> = slots
        .iter()
        .map(|(id, _)| (id.clone(), after.holders[id]))
        .collect();
    let free = cleanup_free(&lock(), &slots);
    let (outcome, _) = done(freed_seen(&free, land_unanswered(&free, &mut item), &seen));
    assert_eq!(outcome.freed, seen);
    assert_eq!(outcome.count, 0);
    // Answered (a duplicate cleanup), it freed nothing.
    let (outcome, _) = done(freed_seen(&free, land(&free, &mut item), &seen));
    assert!(outcome.freed.is_empty());
}

#[test]
fn acquire_answers_follow_from_the_checks_that_failed() {
    let mut item = None;
    let (a, b, c) = (id("a", "1"), id("b", "1"), id("c", "1"));
    assert_eq!(
        take(&mut item, &a, 2, 0),
        AcquireOutcome::Acquired {
            token: FencingToken(1),
            count: 1
        }
    );
    assert_eq!(
        take(&mut item, &a, 2, 0),
        AcquireOutcome::AlreadyHeld {
            token: FencingToken(1),
            count: 1
        }
    );
    take(&mut item, &b, 2, 0);
    assert_eq!(
        take(&mut item, &c, 2, 0),
        AcquireOutcome::Full {
            count: 2,
            used: 2,
            limit: limit(2)
        }
    );
    let write = release(&lock(), &a, FencingToken(1), Weight::ONE, 0);
    let claim = Claim::Slot {
        token: FencingToken(1),
        weight: Weight::ONE,
    };
    let (outcome, _) = done(released(&write, &a, claim, land(&write, &mut item)));
    assert_eq!(
        outcome,
        ReleaseOutcome::Released {
            token: Some(FencingToken(1)),
            count: 1,
            waiting: 0
        }
    );
    assert_eq!(
        take(&mut item, &a, 2, 0),
        AcquireOutcome::Fenced(FenceReason::AcquisitionReleased)
    );
    let write = cleanup_fence(&lock(), &b.holder, Run::FIRST);
    let (slots, _) = fenced_slots(&write, &b.holder, land(&write, &mut item)).unwrap();
    assert_eq!(
        slots
            .iter()
            .map(|(id, h)| (id.clone(), h.token, h.weight))
            .collect::<Vec<_>>(),
        [(b.clone(), FencingToken(2), Weight::ONE)]
    );
    assert_eq!(
        take(&mut item, &id("b", "2"), 2, 0),
        AcquireOutcome::Fenced(FenceReason::ExecutionEnded)
    );
    let write = cleanup_free(&lock(), &slots);
    let (outcome, after) = done(freed(&write, land(&write, &mut item)));
    assert_eq!(outcome.freed.len(), 1);
    assert_eq!(after.count(), 0);
    assert_eq!(after.version.0, 5, "refused writes change nothing");
}

#[test]
fn an_acquire_past_its_horizon_is_not_sent_and_one_that_lands_after_a_later_rotation_is_refused() {
    assert_eq!(
        acquire(
            &lock(),
            &id("a", "1"),
            Run::FIRST,
            None,
            limit(1),
            1_000,
            9_000,
            &T
        ),
        Err(AcquireOutcome::Expired)
    );
    let mut item = None;
    let write = release_unheld(&lock(), &id("x", "1"), 0);
    land(&write, &mut item);
    // Decided at 1 s (request at 1 s, deadline 9 s); a rotation at 9 s lands first.
    let late = acquire(
        &lock(),
        &id("a", "1"),
        Run::FIRST,
        None,
        limit(1),
        1_000,
        1_000,
        &T,
    )
    .unwrap();
    let rotate = rotation(item.as_ref().unwrap(), 9_000, &T).unwrap();
    land(&rotate, &mut item);
    let result = land(&late, &mut item);
    assert_eq!(
        acquired(&late, &id("a", "1"), limit(1), result).unwrap(),
        AcquireOutcome::Expired
    );
    // A request time ahead of this host's clock counts as now.
    let ahead = acquire(
        &lock(),
        &id("a", "1"),
        Run::FIRST,
        None,
        limit(1),
        50_000,
        10_000,
        &T,
    )
    .unwrap();
    assert!(ahead.checks.contains(&Check::RotatedBefore {
        deadline_ms: 18_000
    }));
}

#[test]
fn a_writer_rotates_only_once_young_fences_are_worth_a_write() {
    let mut item = None;
    for n in 0..BUSY_YOUNG_FENCES {
        let now = item
            .as_ref()
            .unwrap_or(&SemaphoreItem::empty(lock()))
            .clone();
        assert!(
            busy_rotation(&now, 1_000, &T, BUSY_YOUNG_FENCES).is_none(),
            "{n} young fences"
        );
        let write = release_unheld(&lock(), &id(&format!("e{n}"), "1"), 0);
        land(&write, &mut item);
    }
    let now = item.as_ref().unwrap();
    assert!(busy_rotation(now, 1_000, &T, BUSY_YOUNG_FENCES).is_some());
    // A window later, one fence is enough for the sweeper, not for a writer.
    let mut one = None;
    land(&release_unheld(&lock(), &id("x", "1"), 0), &mut one);
    let one = one.unwrap();
    assert!(rotation(&one, 1_000, &T).is_some());
    assert!(busy_rotation(&one, 1_000, &T, BUSY_YOUNG_FENCES).is_none());
    assert!(busy_rotation(&one, 1_000, &T, 1).is_some());
}

#[test]
fn rotations_are_due_a_window_apart_and_only_with_fences() {
    let mut item = None;
    let write = cleanup_fence(&lock(), &HolderId::new("x").unwrap(), Run::FIRST);
    land(&write, &mut item);
    let first = rotation(item.as_ref().unwrap(), 1_000, &T).expect("never rotated: due");
    land(&first, &mut item);
    let now = item.as_ref().unwrap();
    assert!(rotation(now, 10_999, &T).is_none(), "less than a window");
    let second = rotation(now, 11_000, &T).expect("a window later");
    land(&second, &mut item);
    let now = item.as_ref().unwrap();
    assert!(now.fences.is_empty());
    assert!(rotation(now, 99_000, &T).is_none(), "nothing to rotate");
}
