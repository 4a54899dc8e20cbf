//! The local run's delaying proxy between the acquire Lambda and the local DynamoDB: the seed
//! race, live.
//!
//! Only the acquire function's `AWS_ENDPOINT_URL` points here; every other function talks to
//! the server directly. The proxy forwards each request as is, except the first acquire *writes*
//! of a few of the executions the run offers it (as many as it plans to stop mid-acquire): each
//! such write is held for a few seconds while the runner stops its execution (so that its status
//! event and the cleanup race the write),
//! then sent on; every second one, optionally, for longer than two fence windows (so the fences
//! it had to meet are rotated out before it lands, and the horizon is what refuses it). What the
//! server answers to each held write is recorded: landed, or refused, and why, read from the
//! item the refusal hands back: by a fence (a cleanup landed first), by the horizon (the fences
//! rotated after the request's horizon), or otherwise (the lock was full, or the identity
//! already held a slot).
//!
//! The forwarding itself is [`crate::proxy`], and the recognition of the writes and the reading
//! of a refusal are [`crate::refusal`]'s; this is the run's policy.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::proxy::{ForwardingProxy, Policy, Verdict};
use crate::refusal::{AcquireChecks, Refusal};
use crate::sfn::short;
use serde_json::Value;
use tokio::sync::mpsc;

/// Which protocol's acquire write to recognise.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteKind {
    /// Ours: an `UpdateItem` that sets a holder-map entry from the version
    /// (`SET ... #holders.#h0 = #version + :vN`, `#h0` naming `<execution>#<acquisition>`), or,
    /// as a lock's first write, the `PutItem` of the item that write makes.
    Versioned,
    /// The original sample's: `UpdateItem` with `#h` naming the `holder:<execution>` attribute.
    Sample,
}

#[derive(Debug, Default, Clone, serde::Serialize)]
pub struct ProxyStats {
    pub forwarded: u64,
    /// Acquire writes held in flight.
    pub held: u64,
    /// Of those, the ones held for the long time.
    pub held_long: u64,
    /// Held writes the server accepted when they finally arrived.
    pub landed: u64,
    /// Held writes refused because their execution or acquisition was fenced when they landed
    /// (a cleanup or release landed first).
    pub refused_by_fence: u64,
    /// Held writes refused because the fences rotated after their request's horizon: they
    /// could have missed a fence the rotation dropped.
    pub refused_by_horizon: u64,
    /// Held writes refused for another reason: the lock was full (its weight did not fit), its
    /// start rate was spent, or the identity already held a slot (for the sample's protocol:
    /// every refusal, it has no fences).
    pub refused_otherwise: u64,
    pub other_outcome: u64,
    /// One line per answered held write: whose, how long it was held, what became of it.
    pub writes: Vec<String>,
}

impl ProxyStats {
    pub fn refused(&self) -> u64 {
        self.refused_by_fence + self.refused_by_horizon + self.refused_otherwise
    }

    /// Every held write has had its answer.
    pub fn settled(&self) -> bool {
        self.held == self.landed + self.refused() + self.other_outcome
    }
}

/// An execution whose next acquire write is to be held.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Target {
    /// Not held yet: hold its write and tell the stopper.
    Armed,
    /// Its write was refused for want of an item (the lock's first write): hold the put that
    /// follows as long as that write was held, without telling the stopper again.
    Rearmed { long: bool },
}

/// Whose writes are still to be held: the first `count` of `executions` to send one. The choice
/// is made as the writes come, not up front, because an execution may never send an acquire
/// write: an admission to a gate its Lambda last saw full is answered from a read when it would
/// be refused, and the waiter is admitted later by a grant, which the release function sends.
#[derive(Debug, Default)]
struct Offered {
    executions: BTreeSet<String>,
    count: usize,
}

impl Offered {
    /// Whether `execution`'s write is one to hold; it is taken at most once.
    fn take(&mut self, execution: &str) -> bool {
        if self.count == 0 || !self.executions.remove(execution) {
            return false;
        }
        self.count -= 1;
        true
    }
}

/// A write being held, and when it was let go (its answer comes back just after).
#[derive(Debug, Clone)]
struct Pending {
    write: AcquireChecks,
    long: bool,
    let_go_at: Instant,
}

#[derive(Default)]
struct State {
    offered: Offered,
    /// Held once and to be held again (see [`Target::Rearmed`]).
    targets: BTreeMap<String, Target>,
    /// Held writes still waiting for their answer.
    pending: Vec<Pending>,
    stats: ProxyStats,
}

impl State {
    /// The held write an answer belongs to. The proxy's callback does not say which request an
    /// answer is for, so: among the writes already let go (else all), the one let go first
    /// whose checks `fit` the item handed back, else the one let go first. Writes held alike
    /// are let go in the order they came, so this is exact unless two are let go at once.
    fn take(&mut self, fits: impl Fn(&AcquireChecks) -> bool) -> Option<Pending> {
        let now = Instant::now();
        let mut order: Vec<usize> = (0..self.pending.len())
            .filter(|&i| self.pending[i].let_go_at <= now)
            .collect();
        if order.is_empty() {
            order = (0..self.pending.len()).collect();
        }
        order.sort_by_key(|&i| self.pending[i].let_go_at);
        let chosen = order
            .iter()
            .copied()
            .find(|&i| fits(&self.pending[i].write))
            .or_else(|| order.first().copied())?;
        Some(self.pending.remove(chosen))
    }
}

struct DelayAcquireWrites {
    kind: WriteKind,
    hold_for: Duration,
    /// Every second held write is held this long instead.
    long_hold_for: Option<Duration>,
    state: Mutex<State>,
    held_tx: mpsc::UnboundedSender<String>,
}

impl Policy for DelayAcquireWrites {
    fn decide(&self, operation: Option<&str>, body: &[u8]) -> Verdict {
        let write = match self.kind {
            WriteKind::Versioned => AcquireChecks::ours(operation, body),
            WriteKind::Sample => AcquireChecks::sample(operation, body),
        };
        let Some(write) = write else {
            return Verdict::Forward;
        };
        let mut state = self.state.lock().expect("proxy lock");
        let target = match state.targets.remove(&write.holder) {
            Some(target) => target,
            None if state.offered.take(&write.holder) => Target::Armed,
            None => return Verdict::Forward,
        };
        state.stats.held += 1;
        let long = match target {
            Target::Armed => {
                let _ = self.held_tx.send(write.holder.clone());
                self.long_hold_for.is_some() && state.stats.held.is_multiple_of(2)
            }
            Target::Rearmed { long } => long,
        };
        let hold = match (long, self.long_hold_for) {
            (true, Some(long_hold)) => {
                state.stats.held_long += 1;
                long_hold
            }
            _ => self.hold_for,
        };
        state.pending.push(Pending {
            write,
            long,
            let_go_at: Instant::now() + hold,
        });
        Verdict::Delay(hold)
    }

    fn answered(&self, status: u16, body: &[u8]) {
        let mut state = self.state.lock().expect("proxy lock");
        let answer: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
        let error = answer["__type"].as_str().unwrap_or_default();
        // A gate's acquire is a transaction: refused, it names the item whose condition
        // failed. Its holding item already there is a tombstone (a release fenced the
        // acquisition) or a holding (already held); else the gate's own checks failed.
        if status != 200 && error.ends_with("TransactionCanceledException") {
            let failed = answer["CancellationReasons"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|reason| reason["Code"] == "ConditionalCheckFailed")
                .find_map(|reason| reason["Item"].as_object());
            let holding = failed.filter(|item| item.contains_key("slot")).map(|item| {
                let text = |name: &str| item[name]["S"].as_str().unwrap_or_default().to_owned();
                (text("slot"), text("state"))
            });
            let (taken, why) = match (failed, holding) {
                (_, Some((slot, held_or_released))) => {
                    let why = if held_or_released == "released" {
                        Refusal::Fence
                    } else {
                        Refusal::Otherwise
                    };
                    (state.take(|w| w.slot == slot), why)
                }
                (Some(gate), None) => {
                    let taken = state.take(|w| w.refusal(gate).is_some());
                    let why = taken
                        .as_ref()
                        .and_then(|p| p.write.refusal(gate))
                        .unwrap_or(Refusal::Otherwise);
                    (taken, why)
                }
                (None, None) => (state.take(|_| true), Refusal::Otherwise),
            };
            let fate = state.stats.count_refusal(why);
            state.record(taken, fate);
            return;
        }
        let refused = status != 200 && error.ends_with("ConditionalCheckFailedException");
        // The item as it was before a write that landed (`ALL_OLD`; none for a put), or as it
        // was when one was refused.
        let item = answer
            .get(if refused { "Item" } else { "Attributes" })
            .and_then(Value::as_object);
        if refused && item.is_none() {
            // Refused for want of an item: the write was the lock's first, and the Lambda puts
            // the item next. Hold that put instead, so the race is still the one planned.
            if let Some(p) = state.take(|_| true) {
                state.stats.held -= 1;
                state.stats.held_long -= u64::from(p.long && self.long_hold_for.is_some());
                state
                    .targets
                    .insert(p.write.holder, Target::Rearmed { long: p.long });
            }
            return;
        }
        let (taken, fate) = if status == 200 {
            let taken = state.take(|w| item.is_none_or(|item| w.refusal(item).is_none()));
            state.stats.landed += 1;
            (taken, "landed")
        } else if let Some(item) = item {
            let taken = state.take(|w| w.refusal(item).is_some());
            let why = taken
                .as_ref()
                .and_then(|p| p.write.refusal(item))
                .unwrap_or(Refusal::Otherwise);
            let fate = state.stats.count_refusal(why);
            (taken, fate)
        } else {
            let taken = state.take(|_| true);
            state.stats.other_outcome += 1;
            (taken, "answered otherwise")
        };
        state.record(taken, fate);
    }
}

impl ProxyStats {
    /// Counts a held write refused for `why`; what to say of it.
    fn count_refusal(&mut self, why: Refusal) -> &'static str {
        match why {
            Refusal::Fence => {
                self.refused_by_fence += 1;
                "refused by a fence"
            }
            Refusal::Horizon => {
                self.refused_by_horizon += 1;
                "refused by the horizon"
            }
            Refusal::Otherwise => {
                self.refused_otherwise += 1;
                "refused (full, start rate or already held)"
            }
        }
    }
}

impl State {
    /// One line for the answered held write `taken`: whose, how long held, its `fate`.
    fn record(&mut self, taken: Option<Pending>, fate: &str) {
        if let Some(p) = taken {
            let held = if p.long { "long" } else { "short" };
            let line = format!("{} (held {held}): {fate}", short(&p.write.holder));
            self.stats.writes.push(line);
        }
    }
}

pub struct DelayProxy(ForwardingProxy<DelayAcquireWrites>);

impl DelayProxy {
    /// Starts the proxy in front of `upstream` (`http://127.0.0.1:PORT`); the execution ARN of
    /// each write it starts holding is sent to the returned receiver.
    pub async fn start(
        upstream: &str,
        kind: WriteKind,
        hold_for: Duration,
        long_hold_for: Option<Duration>,
    ) -> Result<(Arc<Self>, mpsc::UnboundedReceiver<String>), crate::Error> {
        let (held_tx, held_rx) = mpsc::unbounded_channel();
        let policy = DelayAcquireWrites {
            kind,
            hold_for,
            long_hold_for,
            state: Mutex::new(State::default()),
            held_tx,
        };
        let proxy = ForwardingProxy::with_policy(upstream, policy).await?;
        Ok((Arc::new(Self(proxy)), held_rx))
    }

    pub fn endpoint(&self) -> String {
        self.0.endpoint()
    }

    /// Hold the first acquire write of each of the first `count` of `executions` to send one.
    pub fn hold_first(&self, count: usize, executions: impl IntoIterator<Item = String>) {
        self.0.policy().state.lock().expect("proxy lock").offered = Offered {
            executions: executions.into_iter().collect(),
            count,
        };
    }

    pub fn stats(&self) -> ProxyStats {
        ProxyStats {
            forwarded: self.0.forwarded(),
            ..self
                .0
                .policy()
                .state
                .lock()
                .expect("proxy lock")
                .stats
                .clone()
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::wire::{attributes, put_body, update_body};
    use semaphore_core::protocol::{self, Timing};
    use semaphore_core::SemaphoreItem;
    use semaphore_core::{AcquisitionId, FenceKey, HolderId, Identity, Limit, LockName};
    use serde_json::json;

    use super::*;

    fn lock() -> LockName {
        LockName::new("demo-lock").unwrap()
    }

    fn policy(hold_for: Duration, long_hold_for: Duration) -> DelayAcquireWrites {
        let (held_tx, _) = mpsc::unbounded_channel();
        DelayAcquireWrites {
            kind: WriteKind::Versioned,
            hold_for,
            long_hold_for: Some(long_hold_for),
            state: Mutex::new(State::default()),
            held_tx,
        }
    }

    fn who(h: &str) -> Identity {
        Identity::new(HolderId::new(h).unwrap(), AcquisitionId::new("a").unwrap())
    }

    /// `id`'s acquire on a lock of 5.
    fn acquire_of(id: &Identity) -> semaphore_core::Write {
        protocol::acquire(
            &lock(),
            id,
            semaphore_core::Run::FIRST,
            None,
            Limit::new(5).unwrap(),
            1_000,
            1_500,
            &Timing::default(),
        )
        .unwrap()
    }

    fn acquire_body(id: &Identity) -> Vec<u8> {
        update_body(&acquire_of(id))
    }

    fn refused(item: &SemaphoreItem) -> Vec<u8> {
        serde_json::to_vec(&json!({
            "__type": "com.amazonaws.dynamodb.v20120810#ConditionalCheckFailedException",
            "Item": attributes(&semaphore_core::dynamo::encode(item)),
        }))
        .unwrap()
    }

    fn arm(policy: &DelayAcquireWrites, ids: &[&Identity]) {
        policy.state.lock().unwrap().offered = Offered {
            executions: ids.iter().map(|id| id.holder.to_string()).collect(),
            count: ids.len(),
        };
    }

    #[test]
    fn writes_are_held_short_and_long_in_turn_each_once_and_announced_once() {
        let (held_tx, mut held_rx) = mpsc::unbounded_channel();
        let policy = DelayAcquireWrites {
            held_tx,
            ..policy(Duration::from_secs(4), Duration::from_secs(30))
        };
        let (a, b) = (who("run-a"), who("run-b"));
        arm(&policy, &[&a, &b]);
        let update = Some("UpdateItem");
        assert_eq!(
            policy.decide(update, &acquire_body(&a)),
            Verdict::Delay(Duration::from_secs(4))
        );
        assert_eq!(
            policy.decide(update, &acquire_body(&b)),
            Verdict::Delay(Duration::from_secs(30))
        );
        assert_eq!(policy.decide(update, &acquire_body(&a)), Verdict::Forward);
        assert_eq!(held_rx.try_recv().unwrap(), "run-a");
        assert_eq!(held_rx.try_recv().unwrap(), "run-b");
        assert!(held_rx.try_recv().is_err());
    }

    #[test]
    fn the_first_writes_of_the_offered_executions_are_held_up_to_the_count() {
        let policy = policy(Duration::from_secs(4), Duration::from_secs(30));
        let (a, b, c, d) = (who("run-a"), who("run-b"), who("run-c"), who("run-d"));
        policy.state.lock().unwrap().offered = Offered {
            executions: [&a, &b, &c].map(|id| id.holder.to_string()).into(),
            count: 2,
        };
        let update = Some("UpdateItem");
        // d was not offered; c sends first, then b; a comes after the count is reached.
        assert_eq!(policy.decide(update, &acquire_body(&d)), Verdict::Forward);
        assert!(matches!(
            policy.decide(update, &acquire_body(&c)),
            Verdict::Delay(_)
        ));
        assert_eq!(policy.decide(update, &acquire_body(&c)), Verdict::Forward);
        assert!(matches!(
            policy.decide(update, &acquire_body(&b)),
            Verdict::Delay(_)
        ));
        assert_eq!(policy.decide(update, &acquire_body(&a)), Verdict::Forward);
        assert_eq!(policy.state.lock().unwrap().stats.held, 2);
    }

    #[test]
    fn an_answer_is_matched_to_the_write_let_go_first_whose_checks_fail_on_its_item() {
        // Short holds are let go at once, long ones in an hour: a and c come back, b does not.
        let policy = policy(Duration::ZERO, Duration::from_secs(3600));
        let (a, b, c) = (who("run-a"), who("run-b"), who("run-c"));
        arm(&policy, &[&a, &b, &c]);
        for id in [&a, &b, &c] {
            policy.decide(Some("UpdateItem"), &acquire_body(id));
        }
        // c's answer comes first. Its item fences c and b: b, held before c and fenced there
        // too, is still held, so the answer is c's.
        let mut item = SemaphoreItem::empty(lock());
        item.fences
            .young
            .insert(FenceKey::execution(&c.holder, semaphore_core::Run::FIRST));
        item.fences
            .young
            .insert(FenceKey::execution(&b.holder, semaphore_core::Run::FIRST));
        policy.answered(400, &refused(&item));
        // a's: nothing of a is fenced, but the fences rotated after its horizon.
        let mut item = SemaphoreItem::empty(lock());
        item.fences.rotated_at_ms = Some(9_000);
        policy.answered(400, &refused(&item));
        let state = policy.state.lock().unwrap();
        assert_eq!(
            state.stats.writes,
            [
                "run-c (held short): refused by a fence",
                "run-a (held short): refused by the horizon"
            ]
        );
        assert_eq!(
            (
                state.stats.refused_by_fence,
                state.stats.refused_by_horizon,
                state.stats.held_long
            ),
            (1, 1, 1)
        );
        assert_eq!(state.pending.len(), 1);
        assert_eq!(state.pending[0].write.holder, "run-b");
        assert!(!state.stats.settled(), "b has had no answer");
    }

    #[test]
    fn a_locks_first_write_refused_for_want_of_an_item_is_held_again_as_its_put() {
        let policy = policy(Duration::ZERO, Duration::from_secs(30));
        let c = who("run-c");
        arm(&policy, &[&c]);
        policy.decide(Some("UpdateItem"), &acquire_body(&c));
        policy.answered(
            400,
            br#"{"__type": "com.amazonaws.dynamodb.v20120810#ConditionalCheckFailedException"}"#,
        );
        {
            let state = policy.state.lock().unwrap();
            assert_eq!(state.stats.held, 0, "the refused update is not counted");
            assert_eq!(
                state.targets.get("run-c"),
                Some(&Target::Rearmed { long: false })
            );
        }
        assert_eq!(
            policy.decide(Some("PutItem"), &put_body(&acquire_of(&c))),
            Verdict::Delay(Duration::ZERO),
            "held as the refused update was"
        );
        policy.answered(200, b"{}");
        let stats = policy.state.lock().unwrap().stats.clone();
        assert_eq!((stats.held, stats.held_long, stats.landed), (1, 0, 1));
        assert!(stats.settled());
        assert_eq!(stats.writes, ["run-c (held short): landed"]);
    }
}
