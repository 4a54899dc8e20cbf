//! A forwarding proxy on 127.0.0.1 that can hold chosen DynamoDB requests in flight until the
//! test lets them go: the way a delayed or reordered write (F1), a zombie's write (F2) or a
//! slow first attempt of a retried task (F3) is made to happen on demand.
//!
//! Each client connection carries one request (the proxy asks the server to close after it),
//! which keeps the proxy a few lines of plain HTTP/1.1.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{oneshot, Notify};

#[derive(Default)]
struct Shared {
    /// Operation name (e.g. "PutItem") and how many more of them to hold.
    to_hold: Mutex<Option<(String, usize)>>,
    held: Mutex<Vec<oneshot::Sender<()>>>,
    changed: Notify,
}

pub struct HoldingProxy {
    addr: SocketAddr,
    shared: Arc<Shared>,
}

impl HoldingProxy {
    pub async fn start(upstream_endpoint: &str) -> Self {
        let upstream: SocketAddr = upstream_endpoint
            .trim_start_matches("http://")
            .parse()
            .expect("upstream is http://127.0.0.1:PORT");
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
        let addr = listener.local_addr().expect("proxy address");
        let shared = Arc::new(Shared::default());
        let accept_shared = shared.clone();
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let shared = accept_shared.clone();
                tokio::spawn(async move {
                    // A connection the client dropped mid-request is not the test's concern.
                    let _ = serve(client, upstream, shared).await;
                });
            }
        });
        Self { addr, shared }
    }

    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Hold the next `n` requests for `operation` (as in `X-Amz-Target: DynamoDB_20120810.PutItem`).
    pub fn hold_next(&self, operation: &str, n: usize) {
        *self.shared.to_hold.lock().unwrap() = Some((operation.to_owned(), n));
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

fn should_hold(shared: &Shared, head: &str) -> bool {
    let mut to_hold = shared.to_hold.lock().unwrap();
    let Some((operation, remaining)) = to_hold.as_mut() else {
        return false;
    };
    let suffix = format!(".{}", operation.to_ascii_lowercase());
    let matches = head.lines().any(|line| {
        let line = line.to_ascii_lowercase();
        line.starts_with("x-amz-target:") && line.trim_end().ends_with(&suffix)
    });
    if !matches || *remaining == 0 {
        return false;
    }
    *remaining -= 1;
    true
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
    let body_len: usize = head
        .lines()
        .find_map(|l| {
            let (name, value) = l.split_once(':')?;
            name.eq_ignore_ascii_case("content-length")
                .then(|| value.trim().parse().ok())?
        })
        .unwrap_or(0);
    while buf.len() < head_end + body_len {
        let mut chunk = [0u8; 8192];
        let n = client.read(&mut chunk).await?;
        if n == 0 {
            return Ok(());
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    if should_hold(&shared, &head) {
        let (gate, released) = oneshot::channel();
        shared.held.lock().unwrap().push(gate);
        shared.changed.notify_waiters();
        let _ = released.await;
    }
    // Ask for one request per connection so the response ends at EOF.
    let head = head
        .lines()
        .filter(|l| !l.to_ascii_lowercase().starts_with("connection:"))
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join("\r\n");
    let mut upstream = TcpStream::connect(upstream).await?;
    upstream
        .write_all(format!("{head}\r\nConnection: close\r\n\r\n").as_bytes())
        .await?;
    upstream.write_all(&buf[head_end..]).await?;
    let mut response = Vec::new();
    upstream.read_to_end(&mut response).await?;
    client.write_all(&response).await?;
    client.shutdown().await
}
