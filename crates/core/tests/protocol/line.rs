//! The line's writes (queue, grant, re-park, leave) landed on the memory store, which applies
//! each to the lock's item and the waiter's record at once ([`Write::apply_with`]).

use semaphore_core::protocol::{
    acquire, acquired, cleanup_fence, enqueue, grant, granted, leave, queued, release,
    release_unheld, repark, rotation, was_queued, Grant,
};
use semaphore_core::{
    AcquireOutcome, AcquisitionId, Attempt, Change, Check, HolderId, Identity, MemoryStore,
    QueueOutcome, Run, SemaphoreItem, TaskToken, Waiter, Weight, Write, WriteResult,
};

use crate::{limit, lock, T};

const T0: u64 = 1_800_000_000_000;

fn id(h: &str) -> Identity {
    Identity::new(HolderId::new(h).unwrap(), AcquisitionId::new("r0").unwrap())
}
fn waiter(h: &str, n: i64, queued_at_ms: u64) -> Waiter {
    Waiter::new(
        lock(),
        id(h),
        Run::FIRST,
        limit(n),
        queued_at_ms,
        TaskToken::new(format!("{h}-task-0")).unwrap(),
        Attempt::new(queued_at_ms, 0),
        String::new(),
    )
}

fn take(store: &MemoryStore, who: &str, n: i64) {
    let write = acquire(&lock(), &id(who), Run::FIRST, None, limit(n), T0, T0, &T).unwrap();
    let result = store.write_now(&write);
    assert!(matches!(
        acquired(&write, &id(who), limit(n), result).unwrap(),
        AcquireOutcome::Acquired { .. }
    ));
}

fn queue(store: &MemoryStore, w: &Waiter) -> QueueOutcome {
    let write = enqueue(w, None, T0, T0, &T).unwrap();
    let result = store.write_now(&write);
    queued(&write, &w.identity, result).unwrap()
}

/// The release of `who`'s slot, showing its token.
fn release_held(store: &MemoryStore, who: &str) -> Write {
    let token = store.load_now(&lock()).unwrap().holders[&id(who)].token;
    release(&lock(), &id(who), token, Weight::ONE, 0)
}

fn version(store: &MemoryStore) -> u64 {
    store.load_now(&lock()).unwrap().version.0
}

#[test]
fn an_enqueue_past_its_horizon_is_not_sent_and_one_landing_after_a_later_rotation_is_expired() {
    let w = waiter("w", 1, T0);
    assert_eq!(
        enqueue(&w, None, T0, T0 + 8_000, &T),
        Err(QueueOutcome::Expired),
        "a horizon old"
    );
    let store = MemoryStore::new();
    take(&store, "a", 1);
    store.write_now(&release_unheld(&lock(), &id("x"), 0));
    // Decided at T0 (deadline T0 + 8 s); a rotation at the deadline lands first.
    let late = enqueue(&w, None, T0, T0, &T).unwrap();
    assert!(late.checks.contains(&Check::RotatedBefore {
        deadline_ms: T0 + 8_000
    }));
    let rotate = rotation(&store.load_now(&lock()).unwrap(), T0 + 8_000, &T).unwrap();
    store.write_now(&rotate);
    let before = version(&store);
    let result = store.write_now(&late);
    assert_eq!(
        queued(&late, &w.identity, result).unwrap(),
        QueueOutcome::Expired
    );
    assert_eq!(version(&store), before);
    assert!(store.waiters_now(&lock(), None, 10).is_empty());
}

#[test]
fn a_grant_is_refused_by_the_first_of_its_checks_that_fails() {
    let store = MemoryStore::new();
    take(&store, "a", 1);
    let w = waiter("w", 1, T0);
    assert_eq!(queue(&store, &w), QueueOutcome::Queued);
    let grant_of = |w: &Waiter| grant(w, None, &w.terms, T0 + 1);
    let outcome = |write: &Write| {
        let before = version(&store);
        let result = store.write_now(write);
        let answer = granted(write, result).unwrap();
        assert_eq!(version(&store), before, "a refused grant changes nothing");
        answer
    };
    // Full: no slot. The record stays.
    assert!(matches!(
        outcome(&grant_of(&w)),
        Grant::NoSlot { current } if current.waiting == 1 && current.count() == 1
    ));
    // Read with another task token than the record's (it parked anew): moved, even while
    // full — the record's check comes first.
    let mut stale = w.clone();
    stale.wakeup = semaphore_core::Wakeup::Task(TaskToken::new("w-task-old").unwrap());
    assert!(matches!(outcome(&grant_of(&stale)), Grant::Moved { .. }));
    // A waiter that is not in line at all (granted or gone): moved.
    let gone = waiter("g", 1, T0);
    assert!(matches!(outcome(&grant_of(&gone)), Grant::Moved { .. }));

    store.write_now(&release_held(&store, "a"));
    // Its run was cleaned up while it waited: dead (checked before the limit and holding).
    store.write_now(&cleanup_fence(&lock(), &w.identity.holder, Run::FIRST));
    assert!(matches!(outcome(&grant_of(&w)), Grant::Dead { .. }));
    assert_eq!(
        store.waiters_now(&lock(), None, 10),
        std::slice::from_ref(&w)
    );
    let leave = leave(&lock(), w.id());
    assert!(was_queued(&leave, &store.write_now(&leave)).unwrap());

    // Asked to queue again (a check of a later attempt, or a late queue write of an earlier
    // one): in line once, at its first place; granted once, a grant of the other record read
    // finds it holding.
    let (first, again) = (waiter("v", 1, T0), waiter("v", 1, T0 + 5));
    take(&store, "b", 1);
    assert_eq!(queue(&store, &first), QueueOutcome::Queued);
    assert_eq!(queue(&store, &again), QueueOutcome::AlreadyQueued);
    assert_eq!(
        store.waiters_now(&lock(), None, 10),
        std::slice::from_ref(&first)
    );
    store.write_now(&release_held(&store, "b"));
    let result = store.write_now(&grant_of(&first));
    assert_eq!(result, WriteResult::Landed { after: None });
    let item = store.load_now(&lock()).unwrap();
    assert_eq!(
        item.holders[&first.identity].token.0, item.version.0,
        "the grant's token is the version it made"
    );
    assert_eq!(item.waiting, 0);
    assert!(matches!(
        outcome(&grant(&again, None, &again.terms, T0 + 2)),
        Grant::Moved { .. }
    ));
}

#[test]
fn leave_and_repark_name_the_record_and_say_whether_it_was_there() {
    let store = MemoryStore::new();
    take(&store, "a", 1);
    let w = waiter("w", 1, T0);
    queue(&store, &w);
    let token = TaskToken::new("w-task-1").unwrap();
    let attempt = Attempt::new(T0 + 300_000, 0);
    let repark = repark(
        &lock(),
        w.id(),
        semaphore_core::Wakeup::Task(token.clone()),
        attempt,
    );
    assert_eq!(repark.waiter_id(), Some(w.id()));
    assert_eq!(
        repark.checks,
        [Check::QueuedBefore {
            id: w.id(),
            attempt
        }]
    );
    assert!(was_queued(&repark, &store.write_now(&repark)).unwrap());
    let record = store.waiter_now(&lock(), w.id()).unwrap();
    assert_eq!(
        (record.task_token(), record.attempt),
        (Some(&token), attempt)
    );
    assert_eq!(record.key, w.key, "its place kept");
    assert_eq!(store.load_now(&lock()).unwrap().waiting, 1);
    // The same attempt again (a retried request), or an earlier one: not in line with an
    // earlier token, and nothing changes.
    assert!(!was_queued(&repark, &store.write_now(&repark)).unwrap());

    let leave = leave(&lock(), w.id());
    assert_eq!(leave.changes, [Change::Dequeue(w.id())]);
    assert!(was_queued(&leave, &store.write_now(&leave)).unwrap());
    assert_eq!(store.load_now(&lock()).unwrap().waiting, 0);
    let again = store.write_now(&leave);
    assert!(matches!(
        again,
        WriteResult::Refused {
            waiter_refused: true,
            ..
        }
    ));
    assert!(!was_queued(&leave, &again).unwrap());
    assert!(!was_queued(&repark, &store.write_now(&repark)).unwrap());
    assert_eq!(
        store.load_now(&lock()).unwrap().waiting,
        0,
        "not below zero"
    );
}

#[test]
fn results_that_contradict_the_write_are_errors_not_answers() {
    let w = waiter("w", 1, T0);
    let item = SemaphoreItem::empty(lock());
    let not_refused = |current: &SemaphoreItem| WriteResult::Refused {
        current: current.clone(),
        waiter_refused: false,
    };
    // Refused, but every item check holds on what was handed back and the record's
    // check did not fail: no answer can be made up from that.
    let mut busy = item.clone();
    busy.waiting = 1;
    let write = enqueue(&w, None, T0, T0, &T).unwrap();
    assert!(queued(&write, &w.identity, not_refused(&busy)).is_err());
    let write = grant(&w, None, &w.terms, T0);
    assert!(granted(&write, not_refused(&item)).is_err());
    let write = leave(&lock(), w.id());
    assert!(was_queued(&write, &not_refused(&item)).is_err());
    // An acquire names no record: it cannot have been sent as a transaction.
    let write = acquire(&lock(), &w.identity, Run::FIRST, None, limit(1), T0, T0, &T).unwrap();
    assert!(acquired(
        &write,
        &w.identity,
        limit(1),
        WriteResult::Landed { after: None }
    )
    .is_err());
    assert_eq!(write.waiter_id(), None);
    assert!(write.checks.contains(&Check::QueueEmpty));
}
