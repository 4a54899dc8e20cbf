//! The delaying proxy between the acquire Lambda and the local DynamoDB: the seed race, live.
//!
//! Only the acquire function's `AWS_ENDPOINT_URL` points here; every other function talks to
//! the server directly. The proxy forwards each request as is, except the acquire *write* of an
//! execution the run chose for "stopped mid-acquire": that write is held for a few seconds
//! while the runner stops the execution (so its status event and the cleanup race the write),
//! then sent on. What the server answers to each held write is recorded: accepted, or refused
//! by the version check (a stale write).
//!
//! One request per client connection, which keeps this a few lines of plain HTTP/1.1.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
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

struct Shared {
    kind: WriteKind,
    hold_for: Duration,
    /// Executions whose next acquire write is to be held (each once).
    targets: Mutex<BTreeSet<String>>,
    stats: Mutex<ProxyStats>,
    held_tx: mpsc::UnboundedSender<String>,
}

pub struct DelayProxy {
    addr: SocketAddr,
    shared: Arc<Shared>,
}

impl DelayProxy {
    /// Starts the proxy; the execution ARN of each write it starts holding is sent to the
    /// returned receiver.
    pub async fn start(
        upstream: SocketAddr,
        kind: WriteKind,
        hold_for: Duration,
    ) -> Result<(Self, mpsc::UnboundedReceiver<String>), String> {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(|e| format!("proxy: cannot listen on 127.0.0.1: {e}"))?;
        let addr = listener
            .local_addr()
            .map_err(|e| format!("proxy address: {e}"))?;
        let (held_tx, held_rx) = mpsc::unbounded_channel();
        let shared = Arc::new(Shared {
            kind,
            hold_for,
            targets: Mutex::new(BTreeSet::new()),
            stats: Mutex::new(ProxyStats::default()),
            held_tx,
        });
        let accept_shared = shared.clone();
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let shared = accept_shared.clone();
                tokio::spawn(async move {
                    let _ = serve(client, upstream, shared).await;
                });
            }
        });
        Ok((Self { addr, shared }, held_rx))
    }

    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Hold the next acquire write made for `execution`.
    pub fn target(&self, execution: &str) {
        self.shared
            .targets
            .lock()
            .expect("proxy lock")
            .insert(execution.to_owned());
    }

    pub fn stats(&self) -> ProxyStats {
        self.shared.stats.lock().expect("proxy lock").clone()
    }
}

fn header<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    head.lines().find_map(|line| {
        let (n, v) = line.split_once(':')?;
        n.trim().eq_ignore_ascii_case(name).then(|| v.trim())
    })
}

/// The execution an acquire write is made for, if this request is one.
fn acquiring_holder(kind: WriteKind, head: &str, body: &[u8]) -> Option<String> {
    let target = header(head, "x-amz-target")?;
    let body: Value = serde_json::from_slice(body).ok()?;
    match kind {
        WriteKind::Versioned => {
            if !target.ends_with(".PutItem") {
                return None;
            }
            let item = body.get("Item")?;
            let version = item.get("version")?.get("N")?.as_str()?;
            item.get("holders")?
                .get("M")?
                .as_object()?
                .values()
                .find_map(|h| {
                    let h = h.get("M")?;
                    (h.get("token")?.get("N")?.as_str()? == version)
                        .then(|| h.get("holder")?.get("S")?.as_str().map(str::to_owned))?
                })
        }
        WriteKind::Reference => {
            if !target.ends_with(".UpdateItem") {
                return None;
            }
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

async fn serve(
    mut client: TcpStream,
    upstream: SocketAddr,
    shared: Arc<Shared>,
) -> std::io::Result<()> {
    let mut buf = Vec::new();
    let head_end = loop {
        let mut chunk = [0u8; 8192];
        let n = client.read(&mut chunk).await?;
        if n == 0 {
            return Ok(());
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Some(pos) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break pos + 4;
        }
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    let body_len: usize = header(&head, "content-length")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    while buf.len() < head_end + body_len {
        let mut chunk = [0u8; 8192];
        let n = client.read(&mut chunk).await?;
        if n == 0 {
            return Ok(());
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    let body = &buf[head_end..head_end + body_len];
    let mut held = false;
    if let Some(holder) = acquiring_holder(shared.kind, &head, body) {
        if shared.targets.lock().expect("proxy lock").remove(&holder) {
            held = true;
            shared.stats.lock().expect("proxy lock").held += 1;
            let _ = shared.held_tx.send(holder);
            tokio::time::sleep(shared.hold_for).await;
        }
    }
    shared.stats.lock().expect("proxy lock").forwarded += 1;
    let head = head
        .lines()
        .filter(|l| !l.to_ascii_lowercase().starts_with("connection:"))
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join("\r\n");
    let mut server = TcpStream::connect(upstream).await?;
    server
        .write_all(format!("{head}\r\nConnection: close\r\n\r\n").as_bytes())
        .await?;
    server.write_all(body).await?;
    let mut response = Vec::new();
    server.read_to_end(&mut response).await?;
    if held {
        let text = String::from_utf8_lossy(&response);
        let status_ok = text.starts_with("HTTP/1.1 200") || text.starts_with("HTTP/1.0 200");
        let mut stats = shared.stats.lock().expect("proxy lock");
        if status_ok {
            stats.landed += 1;
        } else if text.contains("ConditionalCheckFailed") {
            stats.rejected_stale += 1;
        } else {
            stats.other_outcome += 1;
        }
    }
    client.write_all(&response).await?;
    client.shutdown().await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recognises_the_acquire_write_of_each_protocol() {
        let head = "POST / HTTP/1.1\r\nX-Amz-Target: DynamoDB_20120810.PutItem\r\n";
        let body = serde_json::json!({
            "TableName": "t",
            "Item": {
                "version": {"N": "7"},
                "holders": {"M": {
                    "old#a": {"M": {"holder": {"S": "old"}, "token": {"N": "3"}}},
                    "new#b": {"M": {"holder": {"S": "new"}, "token": {"N": "7"}}}
                }}
            }
        });
        let bytes = serde_json::to_vec(&body).unwrap();
        assert_eq!(
            acquiring_holder(WriteKind::Versioned, head, &bytes).as_deref(),
            Some("new")
        );
        // A release writes no holder at the new version.
        let release = serde_json::json!({"Item": {"version": {"N": "8"}, "holders": {"M": {}}}});
        let bytes = serde_json::to_vec(&release).unwrap();
        assert_eq!(acquiring_holder(WriteKind::Versioned, head, &bytes), None);

        let head = "POST / HTTP/1.1\r\nx-amz-target: DynamoDB_20120810.UpdateItem\r\n";
        let acquire = serde_json::json!({
            "UpdateExpression": "SET #c = #c + :one, #h = :now",
            "ExpressionAttributeNames": {"#c": "count", "#h": "holder:arn:x"}
        });
        let bytes = serde_json::to_vec(&acquire).unwrap();
        assert_eq!(
            acquiring_holder(WriteKind::Reference, head, &bytes).as_deref(),
            Some("arn:x")
        );
        let release = serde_json::json!({
            "UpdateExpression": "SET #c = #c - :one REMOVE #h",
            "ExpressionAttributeNames": {"#c": "count", "#h": "holder:arn:x"}
        });
        let bytes = serde_json::to_vec(&release).unwrap();
        assert_eq!(acquiring_holder(WriteKind::Reference, head, &bytes), None);
    }
}
