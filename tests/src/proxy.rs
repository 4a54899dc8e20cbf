//! A forwarding proxy on 127.0.0.1 in front of the DynamoDB endpoint, whose [`Policy`] can hold
//! or delay chosen requests in flight: the way a delayed or reordered write (F1), a zombie's write
//! (F2) or a slow first attempt of a retried task (F3) is made to happen on demand. The tests'
//! [`HoldingProxy`] and local-run's delaying proxy are both this proxy with their own policy.
//!
//! Each client connection carries one request (the proxy asks the server to close after it),
//! which keeps the proxy a few lines of plain HTTP/1.1.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{oneshot, Notify};

/// What the proxy does with one request before it forwards it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Forward,
    /// Until [`ForwardingProxy::release_held`].
    Hold,
    Delay(Duration),
}

pub trait Policy: Send + Sync + 'static {
    /// `operation` is the last part of `X-Amz-Target` (`PutItem` for
    /// `DynamoDB_20120810.PutItem`); `body` is the request's JSON, unparsed, as most requests
    /// need no look at it.
    fn decide(&self, operation: Option<&str>, body: &[u8]) -> Verdict;

    /// The server's answer to a request that was held or delayed, once it comes back: what
    /// such a late write did is the point of holding it. `status` is 0 when the answer has no
    /// status line.
    fn answered(&self, _status: u16, _body: &[u8]) {}
}

struct Shared<P> {
    policy: P,
    held: Mutex<Vec<oneshot::Sender<()>>>,
    changed: Notify,
    forwarded: AtomicU64,
}

pub struct ForwardingProxy<P> {
    addr: SocketAddr,
    shared: Arc<Shared<P>>,
}

impl<P: Policy> ForwardingProxy<P> {
    /// Listens on a free port of 127.0.0.1 and forwards to `upstream_endpoint`
    /// (`http://127.0.0.1:PORT`).
    pub async fn with_policy(upstream_endpoint: &str, policy: P) -> Result<Self, String> {
        let upstream: SocketAddr = upstream_endpoint
            .trim_start_matches("http://")
            .parse()
            .map_err(|e| format!("{upstream_endpoint} is not http://127.0.0.1:PORT: {e}"))?;
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(|e| format!("proxy: cannot listen on 127.0.0.1: {e}"))?;
        let addr = listener
            .local_addr()
            .map_err(|e| format!("proxy address: {e}"))?;
        let shared = Arc::new(Shared {
            policy,
            held: Mutex::new(Vec::new()),
            changed: Notify::new(),
            forwarded: AtomicU64::new(0),
        });
        let accept_shared = shared.clone();
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let shared = accept_shared.clone();
                tokio::spawn(async move {
                    // A connection the client dropped mid-request is not the caller's concern.
                    let _ = serve(client, upstream, shared).await;
                });
            }
        });
        Ok(Self { addr, shared })
    }

    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn policy(&self) -> &P {
        &self.shared.policy
    }

    /// Requests sent on to the server so far (held and delayed ones once they went).
    pub fn forwarded(&self) -> u64 {
        self.shared.forwarded.load(Ordering::SeqCst)
    }

    /// Wait until `n` requests are being held.
    pub async fn wait_held(&self, n: usize) {
        loop {
            let notified = self.shared.changed.notified();
            if self.shared.held.lock().unwrap().len() >= n {
                return;
            }
            notified.await;
        }
    }

    /// Let every held request go on to the server, in the order they arrived.
    pub fn release_held(&self) {
        for gate in self.shared.held.lock().unwrap().drain(..) {
            let _ = gate.send(());
        }
    }
}

/// Holds the next N requests of one operation.
#[derive(Default)]
pub struct HoldNext {
    /// Operation name (e.g. "PutItem") and how many more of them to hold.
    to_hold: Mutex<Option<(String, usize)>>,
}

impl Policy for HoldNext {
    fn decide(&self, operation: Option<&str>, _body: &[u8]) -> Verdict {
        let mut to_hold = self.to_hold.lock().unwrap();
        match (to_hold.as_mut(), operation) {
            (Some((wanted, remaining)), Some(operation))
                if *remaining > 0 && wanted.eq_ignore_ascii_case(operation) =>
            {
                *remaining -= 1;
                Verdict::Hold
            }
            _ => Verdict::Forward,
        }
    }
}

pub type HoldingProxy = ForwardingProxy<HoldNext>;

impl HoldingProxy {
    pub async fn start(upstream_endpoint: &str) -> Self {
        Self::with_policy(upstream_endpoint, HoldNext::default())
            .await
            .expect("start the holding proxy")
    }

    /// Hold the next `n` requests for `operation` (as in `X-Amz-Target: DynamoDB_20120810.PutItem`).
    pub fn hold_next(&self, operation: &str, n: usize) {
        *self.policy().to_hold.lock().unwrap() = Some((operation.to_owned(), n));
    }
}

fn header<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    head.lines().find_map(|line| {
        let (n, v) = line.split_once(':')?;
        n.trim().eq_ignore_ascii_case(name).then(|| v.trim())
    })
}

/// Appends what the client sends until `buf` holds `done(buf)`; false if the client closed first.
async fn read_until(
    client: &mut TcpStream,
    buf: &mut Vec<u8>,
    done: impl Fn(&[u8]) -> bool,
) -> std::io::Result<bool> {
    while !done(buf) {
        let mut chunk = [0u8; 8192];
        let n = client.read(&mut chunk).await?;
        if n == 0 {
            return Ok(false);
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    Ok(true)
}

fn end_of_head(buf: &[u8]) -> Option<usize> {
    buf.windows(4).position(|w| w == b"\r\n\r\n").map(|p| p + 4)
}

async fn serve<P: Policy>(
    mut client: TcpStream,
    upstream: SocketAddr,
    shared: Arc<Shared<P>>,
) -> std::io::Result<()> {
    let mut buf = Vec::new();
    if !read_until(&mut client, &mut buf, |b| end_of_head(b).is_some()).await? {
        return Ok(());
    }
    let head_end = end_of_head(&buf).expect("read up to the head's end");
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    let body_len: usize = header(&head, "content-length")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let end = head_end + body_len;
    if !read_until(&mut client, &mut buf, |b| b.len() >= end).await? {
        return Ok(());
    }
    let body = &buf[head_end..end];
    let operation = header(&head, "x-amz-target")
        .and_then(|t| t.rsplit_once('.'))
        .map(|(_, op)| op);
    let verdict = shared.policy.decide(operation, body);
    match verdict {
        Verdict::Forward => {}
        Verdict::Hold => {
            let (gate, released) = oneshot::channel();
            shared.held.lock().unwrap().push(gate);
            shared.changed.notify_waiters();
            let _ = released.await;
        }
        Verdict::Delay(pause) => tokio::time::sleep(pause).await,
    }
    shared.forwarded.fetch_add(1, Ordering::SeqCst);
    // Ask for one request per connection so the response ends at EOF.
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
    if verdict != Verdict::Forward {
        let (answer_head, answer_body) =
            response.split_at(end_of_head(&response).unwrap_or(response.len()));
        let status = std::str::from_utf8(answer_head)
            .ok()
            .and_then(|h| h.split_whitespace().nth(1)?.parse().ok())
            .unwrap_or(0);
        shared.policy.answered(status, answer_body);
    }
    client.write_all(&response).await?;
    client.shutdown().await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holds_only_the_next_n_requests_of_the_operation() {
        let policy = HoldNext::default();
        assert_eq!(policy.decide(Some("PutItem"), b"{}"), Verdict::Forward);
        *policy.to_hold.lock().unwrap() = Some(("PutItem".to_owned(), 2));
        assert_eq!(policy.decide(Some("GetItem"), b"{}"), Verdict::Forward);
        assert_eq!(policy.decide(None, b"{}"), Verdict::Forward);
        assert_eq!(policy.decide(Some("putitem"), b"{}"), Verdict::Hold);
        assert_eq!(policy.decide(Some("PutItem"), b"{}"), Verdict::Hold);
        assert_eq!(policy.decide(Some("PutItem"), b"{}"), Verdict::Forward);
    }
}
