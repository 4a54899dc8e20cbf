//! The delaying proxy between the acquire Lambda and the local DynamoDB: the seed race, live.
//!
//! Only the acquire function's `AWS_ENDPOINT_URL` points here; every other function talks to
//! the server directly. The proxy forwards each request as is, except the acquire *write* of an
//! execution the run chose for "stopped mid-acquire": that write is held for a few seconds
//! while the runner stops the execution (so its status event and the cleanup race the write),
//! then sent on. What the server answers to each held write is recorded: accepted, or refused
//! by the version check (a stale write).
//!
//! The forwarding itself is the test harness's proxy (`semaphore_tests::proxy`); this is its
//! policy.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use semaphore_core::Identity;
use semaphore_tests::proxy::{ForwardingProxy, Policy, Verdict};
use serde_json::Value;
use tokio::sync::mpsc;

/// Which protocol's acquire write to recognise.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteKind {
    /// Ours: `PutItem` of the whole item; the new holder's token equals the item's version.
    Versioned,
    /// The original sample's: `UpdateItem` with `#h` naming the `holder:<execution>` attribute.
    Reference,
}

#[derive(Debug, Default, Clone, serde::Serialize)]
pub struct ProxyStats {
    pub forwarded: u64,
    /// Acquire writes held in flight.
    pub held: u64,
    /// Held writes the server accepted when they finally arrived.
    pub landed: u64,
    /// Held writes refused by their condition (for ours: the version moved on).
    pub rejected_stale: u64,
    pub other_outcome: u64,
}

impl ProxyStats {
    /// Every held write has had its answer.
    pub fn settled(&self) -> bool {
        self.held == self.landed + self.rejected_stale + self.other_outcome
    }
}

struct DelayAcquireWrites {
    kind: WriteKind,
    hold_for: Duration,
    /// Executions whose next acquire write is to be held (each once).
    targets: Mutex<BTreeSet<String>>,
    stats: Mutex<ProxyStats>,
    held_tx: mpsc::UnboundedSender<String>,
}

impl Policy for DelayAcquireWrites {
    fn decide(&self, operation: Option<&str>, body: &[u8]) -> Verdict {
        let Some(holder) = acquiring_holder(self.kind, operation, body) else {
            return Verdict::Forward;
        };
        if !self.targets.lock().expect("proxy lock").remove(&holder) {
            return Verdict::Forward;
        }
        self.stats.lock().expect("proxy lock").held += 1;
        let _ = self.held_tx.send(holder);
        Verdict::Delay(self.hold_for)
    }

    fn answered(&self, status: u16, body: &[u8]) {
        let mut stats = self.stats.lock().expect("proxy lock");
        if status == 200 {
            stats.landed += 1;
        } else if String::from_utf8_lossy(body).contains("ConditionalCheckFailed") {
            stats.rejected_stale += 1;
        } else {
            stats.other_outcome += 1;
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
    ) -> Result<(Arc<Self>, mpsc::UnboundedReceiver<String>), String> {
        let (held_tx, held_rx) = mpsc::unbounded_channel();
        let policy = DelayAcquireWrites {
            kind,
            hold_for,
            targets: Mutex::new(BTreeSet::new()),
            stats: Mutex::new(ProxyStats::default()),
            held_tx,
        };
        let proxy = ForwardingProxy::with_policy(upstream, policy).await?;
        Ok((Arc::new(Self(proxy)), held_rx))
    }

    pub fn endpoint(&self) -> String {
        self.0.endpoint()
    }

    /// Hold the next acquire write made for `execution`.
    pub fn target(&self, execution: &str) {
        self.0
            .policy()
            .targets
            .lock()
            .expect("proxy lock")
            .insert(execution.to_owned());
    }

    pub fn stats(&self) -> ProxyStats {
        ProxyStats {
            forwarded: self.0.forwarded(),
            ..self.0.policy().stats.lock().expect("proxy lock").clone()
        }
    }
}

/// The execution an acquire write is made for, if this request is one.
fn acquiring_holder(kind: WriteKind, operation: Option<&str>, body: &[u8]) -> Option<String> {
    let acquires_with = match kind {
        WriteKind::Versioned => "PutItem",
        WriteKind::Reference => "UpdateItem",
    };
    if operation != Some(acquires_with) {
        return None;
    }
    let body: Value = serde_json::from_slice(body).ok()?;
    match kind {
        WriteKind::Versioned => {
            let item = body.get("Item")?;
            let version = item.get("version")?.get("N")?.as_str()?;
            item.get("holders")?
                .get("M")?
                .as_object()?
                .iter()
                .find_map(|(key, h)| {
                    if h.get("M")?.get("token")?.get("N")?.as_str()? != version {
                        return None;
                    }
                    let identity = Identity::from_slot_key(key).ok()?;
                    Some(identity.holder.to_string())
                })
        }
        WriteKind::Reference => {
            let update = body.get("UpdateExpression")?.as_str()?;
            if !update.contains("+ :one") {
                return None;
            }
            body.get("ExpressionAttributeNames")?
                .get("#h")?
                .as_str()?
                .strip_prefix("holder:")
                .map(str::to_owned)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recognises_the_acquire_write_of_each_protocol() {
        let put = Some("PutItem");
        let body = serde_json::json!({
            "TableName": "t",
            "Item": {
                "version": {"N": "7"},
                "holders": {"M": {
                    "old#a": {"M": {"token": {"N": "3"}, "acquired_at": {"N": "1"}}},
                    "new#b": {"M": {"token": {"N": "7"}, "acquired_at": {"N": "2"}}}
                }}
            }
        });
        let bytes = serde_json::to_vec(&body).unwrap();
        assert_eq!(
            acquiring_holder(WriteKind::Versioned, put, &bytes).as_deref(),
            Some("new")
        );
        // A release writes no holder at the new version.
        let release = serde_json::json!({"Item": {"version": {"N": "8"}, "holders": {"M": {}}}});
        let bytes = serde_json::to_vec(&release).unwrap();
        assert_eq!(acquiring_holder(WriteKind::Versioned, put, &bytes), None);

        let update = Some("UpdateItem");
        let acquire = serde_json::json!({
            "UpdateExpression": "SET #c = #c + :one, #h = :now",
            "ExpressionAttributeNames": {"#c": "count", "#h": "holder:arn:x"}
        });
        let bytes = serde_json::to_vec(&acquire).unwrap();
        assert_eq!(
            acquiring_holder(WriteKind::Reference, update, &bytes).as_deref(),
            Some("arn:x")
        );
        // Only the protocol's own acquire operation counts.
        assert_eq!(acquiring_holder(WriteKind::Versioned, update, &bytes), None);
        let release = serde_json::json!({
            "UpdateExpression": "SET #c = #c - :one REMOVE #h",
            "ExpressionAttributeNames": {"#c": "count", "#h": "holder:arn:x"}
        });
        let bytes = serde_json::to_vec(&release).unwrap();
        assert_eq!(acquiring_holder(WriteKind::Reference, update, &bytes), None);
    }
}
