//! Waiting in line: a full lock queues its waiters, and whoever frees a slot hands it to the head.
//!
//! Waiters live in records of their own next to the lock's item (a task token is up to 1 KB),
//! one per identity ([`WaiterId`]), ordered by [`QueueKey`]: when the waiter was put in line,
//! then its id. Every write that queues or unqueues a waiter changes the item's `waiting` in the
//! same atomic write, and an acquire that is not a waiter's checks `waiting = 0`: a newcomer
//! never takes a slot ahead of the line (L2). This module is the line's data; the writes are in
//! [`crate::protocol`] and the hand-off in [`crate::semaphore::line`]. See docs/design.md ("Waiting in
//! line") for who hands off when, and why no grant is ever leaked (F8).

use sha2::{Digest, Sha256};

use crate::input::{LockName, TaskToken, Terms};
use crate::item::{Identity, Run};

/// Who a waiter is, as its record is keyed: an 8-byte digest of its identity. A lock's line holds
/// at most one record per identity, so a waiter that checks again (its parked task timed out)
/// finds its own record, and its place with it, without being told where it stood; and a retried
/// or late queue write of the same waiter cannot put it in line twice.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct WaiterId(pub [u8; 8]);

impl WaiterId {
    pub fn of(identity: &Identity) -> Self {
        let mut hasher = Sha256::new();
        hasher.update(identity.holder.as_str().as_bytes());
        hasher.update([0u8]);
        hasher.update(identity.acquisition.as_str().as_bytes());
        let mut digest = [0u8; 8];
        digest.copy_from_slice(&hasher.finalize()[..8]);
        Self(digest)
    }

    /// The id as stored: 16 hex digits.
    pub fn render(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// The inverse of [`WaiterId::render`] (`None`: not 16 hex digits).
    fn parse(hex: &str) -> Option<Self> {
        // Not ASCII, the byte slices below could cut a character.
        if hex.len() != 16 || !hex.is_ascii() {
            return None;
        }
        let mut digest = [0u8; 8];
        for (i, byte) in digest.iter_mut().enumerate() {
            *byte = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).ok()?;
        }
        Some(Self(digest))
    }
}

impl std::fmt::Display for WaiterId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.render())
    }
}

/// Where a waiter stands in its lock's line: when it was first put in line (epoch ms, Step
/// Functions' clock: the entry time of the acquire state whose check queued it), then its
/// [`WaiterId`], so that two waiters that asked in the same millisecond are still in one order.
/// A waiter's later checks keep it: they find its record by its id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct QueueKey {
    pub queued_at_ms: u64,
    pub id: WaiterId,
}

impl QueueKey {
    /// Digits of the time in the rendered key: epoch ms stay below 10^15 until the year 33658.
    const TIME_DIGITS: usize = 15;

    pub fn new(identity: &Identity, queued_at_ms: u64) -> Self {
        Self {
            queued_at_ms,
            id: WaiterId::of(identity),
        }
    }

    /// The key as stored: text whose byte order is the line's order.
    pub fn render(&self) -> String {
        format!(
            "{:0width$}#{}",
            self.queued_at_ms,
            self.id.render(),
            width = Self::TIME_DIGITS
        )
    }

    /// The inverse of [`QueueKey::render`].
    pub fn parse(text: &str) -> Result<Self, QueueKeyError> {
        let error = || QueueKeyError {
            text: text.to_owned(),
        };
        let (time, hex) = text.split_once('#').ok_or_else(error)?;
        Ok(Self {
            queued_at_ms: time.parse().map_err(|_| error())?,
            id: WaiterId::parse(hex).ok_or_else(error)?,
        })
    }
}

/// A stored place in line that is not one [`QueueKey::render`] wrote.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("queue key {text:?}: expected <ms>#<16 hex digits>")]
pub struct QueueKeyError {
    pub text: String,
}

impl std::fmt::Display for QueueKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.render())
    }
}

/// Which attempt of a waiter's parked task a record's task token belongs to: later attempts are
/// larger. A Step Functions task attempt is its state's entry time and its retry count there, so
/// an attempt whose invocation is slow cannot give the record its (dead) token after a later
/// attempt gave it a live one: a wake-up would go to a task that no longer waits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Attempt(pub u64);

impl Attempt {
    /// Retries counted per state entry; more (a state retried a thousand times) count as the
    /// last, which keeps their order with the entries around them.
    const RETRIES: u64 = 1_000;

    /// The attempt of a task whose state was entered at `entered_at_ms` and retried
    /// `retry_count` times since.
    pub fn new(entered_at_ms: u64, retry_count: u64) -> Self {
        Self(
            entered_at_ms
                .saturating_mul(Self::RETRIES)
                .saturating_add(retry_count.min(Self::RETRIES - 1)),
        )
    }
}

/// How a waiter learns that it was granted its slot.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Wakeup {
    /// Parked on a Step Functions task token: the hand-off sends it the answer.
    Task(TaskToken),
    /// Polls (an Express workflow's `Retry`, a Lambda function, any client that cannot park on
    /// a task token): it finds its slot held at its next poll. Each poll renews the record to
    /// `until_ms` (the polling writer's clock); a record past it by more than the clock skew is
    /// a waiter that stopped polling, taken out of line like a dead execution's (F13).
    Poll { until_ms: u64 },
}

/// One execution (or other holder) waiting in line for a slot of `lock`.
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
    /// Wakes the parked task, or says until when the poller is alive; replaced when a later
    /// attempt checks again.
    pub wakeup: Wakeup,
    /// The attempt `wakeup` belongs to.
    pub attempt: Attempt,
    /// How often a later attempt of its task gave the record its token since it was queued:
    /// each check adds to its execution's history, which Step Functions caps.
    pub checks: u32,
    /// What the waiter's caller wants back when the slot is granted (opaque here: the acquire
    /// function keeps its answer in it, so the waker can send it with the token).
    pub context: String,
}

impl Waiter {
    /// The waiter of `identity` put in line at `queued_at_ms`, parked on `task_token` of
    /// `attempt`.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        lock: LockName,
        identity: Identity,
        run: Run,
        terms: impl Into<Terms>,
        queued_at_ms: u64,
        task_token: TaskToken,
        attempt: Attempt,
        context: String,
    ) -> Self {
        let key = QueueKey::new(&identity, queued_at_ms);
        Self::in_line(
            lock,
            identity,
            run,
            terms.into(),
            key,
            Wakeup::Task(task_token),
            attempt,
            context,
        )
    }

    /// The waiter of `identity` put in line at `queued_at_ms`, polling and alive until
    /// `until_ms` unless it polls again.
    #[allow(clippy::too_many_arguments)]
    pub fn polling(
        lock: LockName,
        identity: Identity,
        run: Run,
        terms: impl Into<Terms>,
        queued_at_ms: u64,
        until_ms: u64,
        attempt: Attempt,
        context: String,
    ) -> Self {
        let key = QueueKey::new(&identity, queued_at_ms);
        let wakeup = Wakeup::Poll { until_ms };
        Self::in_line(
            lock,
            identity,
            run,
            terms.into(),
            key,
            wakeup,
            attempt,
            context,
        )
    }

    #[allow(clippy::too_many_arguments)]
    fn in_line(
        lock: LockName,
        identity: Identity,
        run: Run,
        terms: Terms,
        key: QueueKey,
        wakeup: Wakeup,
        attempt: Attempt,
        context: String,
    ) -> Self {
        Self {
            key,
            lock,
            identity,
            run,
            terms,
            wakeup,
            attempt,
            checks: 0,
            context,
        }
    }

    /// The key of its record.
    pub fn id(&self) -> WaiterId {
        self.key.id
    }

    /// The task token to wake, if it is parked on one.
    pub fn task_token(&self) -> Option<&TaskToken> {
        match &self.wakeup {
            Wakeup::Task(token) => Some(token),
            Wakeup::Poll { .. } => None,
        }
    }

    /// Whether it polls, and stopped: its record's time ran out more than `skew_ms` before
    /// `now_ms` (by the clock of the writer that judges it).
    pub fn stopped_polling(&self, now_ms: u64, skew_ms: u64) -> bool {
        matches!(self.wakeup, Wakeup::Poll { until_ms } if until_ms.saturating_add(skew_ms) < now_ms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::input::{AcquisitionId, HolderId, Limit};

    fn id(h: &str, a: &str) -> Identity {
        Identity::new(HolderId::new(h).unwrap(), AcquisitionId::new(a).unwrap())
    }

    fn waiter(who: Identity, queued_at_ms: u64, token: &str) -> Waiter {
        Waiter::new(
            LockName::new("l").unwrap(),
            who,
            Run::FIRST,
            Limit::new(1).unwrap(),
            queued_at_ms,
            TaskToken::new(token).unwrap(),
            Attempt::new(queued_at_ms, 0),
            "{}".to_owned(),
        )
    }

    #[test]
    fn keys_sort_by_time_then_identity_and_render_in_the_same_order() {
        let a = QueueKey::new(&id("a", "r0"), 1_000);
        let b = QueueKey::new(&id("b", "r0"), 999);
        let c = QueueKey::new(&id("c", "r0"), 1_000);
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
        assert!(QueueKey::parse("12#€€€€€0").is_err());
    }

    #[test]
    fn a_waiters_id_is_its_identity_and_its_place_its_time_then_its_id() {
        let w = waiter(id("x", "r0"), 1_000, "t1");
        let mut other = waiter(id("x", "r0"), 2_000, "t2");
        other.terms.limit = Limit::new(7).unwrap();
        assert_eq!(
            w.id(),
            other.id(),
            "one record per identity, wherever it stands"
        );
        assert_ne!(w.id(), waiter(id("x", "r1"), 1_000, "t1").id());
        assert_ne!(w.id(), waiter(id("y", "r0"), 1_000, "t1").id());
        assert!(w.key < waiter(id("a", "r0"), 1_001, "t1").key, "time first");
        let rendered = w.key.render();
        assert_eq!(
            rendered.len(),
            15 + 1 + 16,
            "one width: text order is line order"
        );
        assert!(rendered.starts_with("000000000001000#"));
        assert!(rendered.ends_with(&w.id().render()));
    }

    #[test]
    fn attempts_order_by_entry_then_retry() {
        assert!(Attempt::new(1_000, 0) < Attempt::new(1_000, 1));
        assert!(Attempt::new(1_000, 5) < Attempt::new(1_001, 0));
        assert_eq!(Attempt::new(1_000, 5_000), Attempt::new(1_000, 999));
        assert!(Attempt::new(1_000, 5_000) < Attempt::new(1_001, 0));
    }
}
