//! Waiting in line: a full lock queues its waiters, and whoever frees a slot hands it to the head.
//!
//! Each lock keeps a FIFO queue of waiters next to its item. A waiter is small in the lock's item
//! (it only counts them, `waiting`) and about 1-2 KB on its own (a Step Functions task token is up
//! to 1 KB), so waiters live in their own records, ordered by [`QueueKey`]: when the waiter first
//! asked to wait (its wait state's entry time), then a digest of its identity. Every write that
//! queues or unqueues a waiter changes the lock's `waiting` in the same atomic write, so `waiting`
//! is always the number of waiters, and an acquire that is not a waiter's checks `waiting = 0`:
//! a newcomer never takes a slot ahead of the line (L2).
//!
//! The hand-off ([`crate::Semaphore::hand_off`]) is how a queue moves: while a slot is free and
//! someone waits, grant the head (one write: take the slot for it and remove its record), then
//! wake it ([`Waker`]). Release, cleanup and the sweeper hand off after they free a slot; a waiter
//! hands off right after it queues (a slot may have freed between "full" and "queued", F8) and
//! whenever its parked task's fallback timeout makes it check again (a waker that crashed between
//! its grant and its wake-up, F8). A grant to a waiter that can no longer take it (its execution
//! ended) is freed again by the same hand-off, never leaked.

use std::future::Future;

use sha2::{Digest, Sha256};

use crate::input::{InputError, LockName, Terms};
use crate::item::{FencingToken, Identity, Run};

/// Longest task token accepted, in bytes. Step Functions' task tokens are at most 1024
/// characters today; `SendTaskSuccess` takes up to 2048.
pub const MAX_TASK_TOKEN_BYTES: usize = 2048;

/// Where a waiter stands in its lock's line: when it first asked to wait (epoch ms, Step
/// Functions' clock: the entry time of its first wait state), then an 8-byte digest of its
/// identity so that two waiters that asked in the same millisecond are still in one order.
///
/// The key is computed from what the execution's history records (the wait task's input), so a
/// cleanup that finds an ended execution's history finds its place in line too.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct QueueKey {
    pub queued_at_ms: u64,
    pub digest: [u8; 8],
}

impl QueueKey {
    /// Digits of the time in the rendered key: epoch ms stay below 10^15 until the year 33658.
    const TIME_DIGITS: usize = 15;

    pub fn new(identity: &Identity, queued_at_ms: u64) -> Self {
        let mut hasher = Sha256::new();
        hasher.update(identity.holder.as_str().as_bytes());
        hasher.update([0u8]);
        hasher.update(identity.acquisition.as_str().as_bytes());
        let mut digest = [0u8; 8];
        digest.copy_from_slice(&hasher.finalize()[..8]);
        Self {
            queued_at_ms,
            digest,
        }
    }

    /// The key as stored: text whose byte order is the line's order.
    pub fn render(&self) -> String {
        let hex: String = self.digest.iter().map(|b| format!("{b:02x}")).collect();
        format!(
            "{:0width$}#{hex}",
            self.queued_at_ms,
            width = Self::TIME_DIGITS
        )
    }

    /// The inverse of [`QueueKey::render`].
    pub fn parse(text: &str) -> Result<Self, String> {
        let (time, hex) = text
            .split_once('#')
            .ok_or_else(|| format!("queue key {text:?}: expected <ms>#<16 hex digits>"))?;
        let queued_at_ms = time
            .parse()
            .map_err(|e| format!("queue key {text:?}: time: {e}"))?;
        if hex.len() != 16 {
            return Err(format!("queue key {text:?}: expected 16 hex digits"));
        }
        let mut digest = [0u8; 8];
        for (i, byte) in digest.iter_mut().enumerate() {
            *byte = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16)
                .map_err(|e| format!("queue key {text:?}: digest: {e}"))?;
        }
        Ok(Self {
            queued_at_ms,
            digest,
        })
    }
}

impl std::fmt::Display for QueueKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.render())
    }
}

/// A Step Functions task token: what wakes a parked execution (`SendTaskSuccess`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TaskToken(String);

impl TaskToken {
    pub fn new(token: impl Into<String>) -> Result<Self, InputError> {
        let token = token.into();
        if token.is_empty() {
            return Err(InputError::Missing {
                field: "task_token",
                hint: "pass $$.Task.Token from a .waitForTaskToken task",
            });
        }
        if token.len() > MAX_TASK_TOKEN_BYTES {
            return Err(InputError::TaskTokenTooLong { len: token.len() });
        }
        if let Some((at, _)) = token.char_indices().find(|(_, c)| c.is_control()) {
            return Err(InputError::ControlCharacter {
                field: "task_token",
                at,
            });
        }
        Ok(Self(token))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// One execution waiting in line for a slot of `lock`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Waiter {
    pub lock: LockName,
    pub key: QueueKey,
    pub identity: Identity,
    /// The run of the execution that queued: a grant checks that run's fence, so a waiter whose
    /// run was cleaned up is skipped, not granted.
    pub run: Run,
    /// The limit, weight and rate the waiter asked for: its grant takes a slot only while its
    /// weight fits under its limit, and a spacing after the last start if it has a rate.
    pub terms: Terms,
    /// Wakes the parked task; replaced when the task's fallback timeout parks it anew.
    pub task_token: TaskToken,
    /// What the waiter's caller wants back when the slot is granted (opaque here: the acquire
    /// function keeps its answer in it, so the waker can send it with the token).
    pub context: String,
}

impl Waiter {
    /// The waiter of `identity` that asked to wait at `queued_at_ms`.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        lock: LockName,
        identity: Identity,
        run: Run,
        terms: impl Into<Terms>,
        queued_at_ms: u64,
        task_token: TaskToken,
        context: String,
    ) -> Self {
        Self {
            key: QueueKey::new(&identity, queued_at_ms),
            lock,
            identity,
            run,
            terms: terms.into(),
            task_token,
            context,
        }
    }
}

/// Wakes a waiter whose slot was granted (in production: `SendTaskSuccess` with its token).
pub trait Waker: Send + Sync {
    /// `Ok`: the parked task took the answer. `Err(why)`: it did not (its execution ended, its
    /// token timed out, or the call failed); the hand-off then asks whether the execution still
    /// runs, and frees the slot if it does not.
    fn wake(
        &self,
        waiter: &Waiter,
        token: FencingToken,
    ) -> impl Future<Output = Result<(), String>> + Send;

    /// Tells the head of the line, whose grant the lock's start rate refused, to check again at
    /// `next_start_ms` (in production: `SendTaskSuccess` with a "rate limited" answer; its state
    /// machine waits until then and enters its wait task again, keeping its place). Nobody else
    /// would: no slot is freed when the rate frees up. `Err(why)`: it did not take it (its task
    /// was woken already, or its execution ended); its record stays, and whoever next moves the
    /// line, or its fallback check, tries again.
    fn defer(
        &self,
        waiter: &Waiter,
        next_start_ms: u64,
    ) -> impl Future<Output = Result<(), String>> + Send;
}

/// What a waiter's attempt to queue found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum QueueOutcome {
    /// In line.
    Queued,
    /// Its record was already there (a retried attempt whose first one landed).
    AlreadyQueued,
    /// A slot is free and nobody waits: take it with a plain acquire instead.
    Free,
    /// The waiter's identity already holds a slot (granted, or its earlier acquire landed).
    AlreadyHeld {
        token: FencingToken,
        count: usize,
    },
    Fenced(crate::protocol::FenceReason),
    /// The request is older than the horizon and the fences rotated since: ask again.
    Expired,
}

/// What a hand-off did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HandOff {
    /// Waiters granted a slot and woken, in the order they were granted.
    pub woken: Vec<(Identity, FencingToken)>,
    /// Waiters granted a slot whose wake-up failed while their execution still runs: they keep
    /// the slot, and find it when their parked task's fallback timeout makes them ask again.
    pub parked: Vec<Identity>,
    /// Waiters granted a slot whose execution had ended: the slot was freed again.
    pub freed: Vec<Identity>,
    /// Waiters removed from the line without a slot: their run was fenced (it ended and was
    /// cleaned up).
    pub skipped: Vec<Identity>,
    /// The head told to come back when the start rate allows (at that time, epoch ms).
    pub deferred: Option<(Identity, u64)>,
    /// For each of `woken`, in the same order: when it waited from and was woken, and the lock
    /// after its grant (the functions' metrics).
    pub wakes: Vec<Wake>,
}

/// When a woken waiter asked and got its slot, and the lock's item after its grant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Wake {
    /// Its place in line: when it first asked (epoch ms, Step Functions' clock).
    pub queued_at_ms: u64,
    /// When the hand-off began, right after the write that freed the slot landed.
    pub freed_at_ms: u64,
    /// When its parked task took the answer.
    pub woken_at_ms: u64,
    /// The weight held, the stored limit and the waiters in line after its grant.
    pub used: u64,
    pub limit: Option<crate::input::Limit>,
    pub waiting: u64,
}

impl HandOff {
    pub fn is_empty(&self) -> bool {
        self.woken.is_empty()
            && self.parked.is_empty()
            && self.freed.is_empty()
            && self.skipped.is_empty()
            && self.deferred.is_none()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::input::{AcquisitionId, HolderId};

    fn id(h: &str) -> Identity {
        Identity::new(HolderId::new(h).unwrap(), AcquisitionId::new("r0").unwrap())
    }

    #[test]
    fn keys_sort_by_time_then_identity_and_render_in_the_same_order() {
        let a = QueueKey::new(&id("a"), 1_000);
        let b = QueueKey::new(&id("b"), 999);
        let c = QueueKey::new(&id("c"), 1_000);
        let mut keys = [a, b, c];
        keys.sort();
        assert_eq!(keys[0], b);
        let mut rendered: Vec<String> = keys.iter().map(QueueKey::render).collect();
        let in_order = rendered.clone();
        rendered.sort();
        assert_eq!(rendered, in_order, "text order is the line's order");
        for key in keys {
            assert_eq!(QueueKey::parse(&key.render()), Ok(key));
        }
        assert!(QueueKey::parse("12#zz").is_err());
        assert!(QueueKey::parse("no-separator").is_err());
    }

    #[test]
    fn task_tokens_are_bounded_and_printable() {
        assert!(TaskToken::new("AQB8AAAAKgAAAAMAAAAA").is_ok());
        assert!(matches!(
            TaskToken::new(""),
            Err(InputError::Missing { .. })
        ));
        assert!(matches!(
            TaskToken::new("x".repeat(MAX_TASK_TOKEN_BYTES + 1)),
            Err(InputError::TaskTokenTooLong { .. })
        ));
        assert!(matches!(
            TaskToken::new("a\nb"),
            Err(InputError::ControlCharacter { .. })
        ));
    }
}

/// A waiter's record and the lock's count, changed by one write.
#[cfg(test)]
mod record_tests {
    use super::*;
    use crate::input::{AcquisitionId, HolderId};
    use crate::item::SemaphoreItem;
    use crate::write::{Change, Check, Write};

    fn lock() -> LockName {
        LockName::new("l").unwrap()
    }
    fn id(h: &str, a: &str) -> Identity {
        Identity::new(HolderId::new(h).unwrap(), AcquisitionId::new(a).unwrap())
    }
    fn waiter(who: Identity, queued_at_ms: u64, token: &str) -> Waiter {
        Waiter::new(
            lock(),
            who,
            Run::FIRST,
            crate::Limit::new(1).unwrap(),
            queued_at_ms,
            TaskToken::new(token).unwrap(),
            "{}".to_owned(),
        )
    }

    #[test]
    fn a_waiters_place_depends_on_its_identity_and_entry_time_only() {
        let w = waiter(id("x", "r0"), 1_000, "t1");
        let mut other = waiter(id("x", "r0"), 1_000, "t2");
        other.terms.limit = crate::Limit::new(7).unwrap();
        assert_eq!(w.key, other.key, "token and limit do not move it");
        assert_ne!(w.key.digest, waiter(id("x", "r1"), 1_000, "t1").key.digest);
        assert_ne!(w.key.digest, waiter(id("y", "r0"), 1_000, "t1").key.digest);
        assert!(w.key < waiter(id("a", "r0"), 1_001, "t1").key, "time first");
        let rendered = w.key.render();
        assert_eq!(
            rendered.len(),
            15 + 1 + 16,
            "one width: text order is line order"
        );
        assert!(rendered.starts_with("000000000001000#"));
    }

    #[test]
    fn queue_changes_move_the_record_and_the_count_together() {
        let w = waiter(id("x", "r0"), 1_000, "t1");
        let item = SemaphoreItem::empty(lock());
        let write = |checks, changes| Write {
            lock: lock(),
            checks,
            changes,
        };
        let enqueue = write(
            vec![Check::NotQueued(w.key)],
            vec![Change::Enqueue(Box::new(w.clone()))],
        );
        assert_eq!(enqueue.waiter_key(), Some(w.key));
        let (item, record) = enqueue.apply_with(Some(&item), None).unwrap();
        assert_eq!((item.waiting, record.as_ref()), (1, Some(&w)));
        assert_eq!(
            enqueue.apply_with(Some(&item), record.as_ref()),
            Err(&Check::NotQueued(w.key)),
            "queued once"
        );

        let token = TaskToken::new("t2").unwrap();
        let repark = write(
            vec![Check::Queued(w.key)],
            vec![Change::Repark {
                key: w.key,
                task_token: token.clone(),
            }],
        );
        let (item, record) = repark.apply_with(Some(&item), record.as_ref()).unwrap();
        let record = record.unwrap();
        assert_eq!(record.task_token, token);
        assert_eq!(
            (record.key, item.waiting),
            (w.key, 1),
            "same place, same count"
        );

        // A grant names the token it read: the old one no longer matches.
        let stale = Check::QueuedWith {
            key: w.key,
            task_token: w.task_token.clone(),
        };
        assert!(!stale.holds_with(&item, Some(&record)));
        assert!(
            !stale.holds(&item),
            "a record's check never holds on the item alone"
        );
        let dequeue = write(
            vec![Check::QueuedWith {
                key: w.key,
                task_token: token,
            }],
            vec![Change::Dequeue(w.key)],
        );
        let (item, gone) = dequeue.apply_with(Some(&item), Some(&record)).unwrap();
        assert_eq!((item.waiting, gone), (0, None));
        assert!(dequeue.apply_with(Some(&item), None).is_err());
    }
}
