//! A forwarding proxy on 127.0.0.1 in front of the DynamoDB endpoint, whose [`Policy`] can hold
//! or delay chosen requests in flight: the way a delayed or reordered write (F1), a zombie's write
//! (F2) or a slow first attempt of a retried task (F3) is made to happen on demand. The tests'
//! [`HoldingProxy`] and local-run's delaying proxy are both this proxy with their own policy.
//! [`recognise`] tells the protocol's writes apart on the wire (an acquire is an `UpdateItem`
//! that SETs `#holders.#hN = #version + ...`), so a test can hold exactly the acquire it races;
//! it also reads an acquire's checks (the fences, the horizon and the room its condition names),
//! by which local-run's proxy tells why a held write was refused. [`crate::wire`] writes the
//! requests the product sends, for tests of a policy.
//!
//! It also plays the service's faults that a real server produces and the local one cannot (F10),
//! as canned answers that say so ([`Faults`]): an answer lost after the write landed
//! ([`Verdict::LoseAnswer`]), throttled or conflicting transactions, a transaction still in
//! progress ([`Canned`]).
//!
//! HTTP/1.1 both ways is hyper's: a server for the clients, a client (pooled connections) to the
//! server; each request's body is read whole, as a policy reads it.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use aws_sdk_sfn::error::DisplayErrorContext;
use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode, Uri};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::{TokioExecutor, TokioIo};
use semaphore_core::dynamo::{TIME_SPAN, VERSION_UNIT, WEIGHT_SPAN};
use semaphore_core::{FenceKey, Identity};
use serde_json::{Map, Value};
use tokio::net::TcpListener;
use tokio::sync::{oneshot, Notify};

use crate::wire;

/// What the proxy does with one request before it forwards it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Forward,
    /// Until [`ForwardingProxy::release_held`].
    Hold,
    Delay(Duration),
    /// Forward, let the write land, and answer the client a server error instead of the
    /// server's answer: a response lost after the write landed (F10). DynamoDB documents that
    /// an `InternalServerError` request "may or may not have succeeded"; the SDK sends it again.
    LoseAnswer,
    /// Forward a `BatchGetItem`, and answer only the first item read of each table, the other
    /// keys asked for as `UnprocessedKeys`: DynamoDB's partial result (a throttled table, an
    /// answer past 16 MB or more than 1 MB from one partition), which the local server, reading
    /// every key, never gives.
    PartialRead,
    /// Answer this instead of forwarding: nothing reaches the server.
    Answer(Canned),
}

/// A canned answer of DynamoDB's that the local server (moto, one request at a time, no
/// capacity limits) never gives: a test fault, not a server's behaviour.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Canned {
    /// `TransactionCanceledException` with every reason `ThrottlingError`: DynamoDB cancels a
    /// transaction whose table or index is throttled, and nothing of it is written.
    ThrottledTransaction,
    /// `TransactionCanceledException` with every reason `TransactionConflict`: another
    /// transaction on one of its items was in flight; nothing is written.
    ConflictedTransaction,
    /// `TransactionInProgressException`: a transaction with this client request token is still
    /// being processed (the first attempt of a request the SDK sent again).
    TransactionInProgress,
    /// `TransactionConflictException`: a single-item write met a transaction on its item.
    TransactionConflict,
    /// `ProvisionedThroughputExceededException`: a single-item request throttled (its
    /// partition's throughput, or an on-demand table's limits); nothing is written.
    Throttled,
}

impl Canned {
    /// The HTTP response, for a request with `body`.
    fn response(self, body: &[u8]) -> Response<Full<Bytes>> {
        let actions = serde_json::from_slice::<Value>(body)
            .ok()
            .and_then(|b| b.get("TransactItems")?.as_array().map(Vec::len))
            .unwrap_or(1);
        let reasons = |code: &str, message: &str| {
            Value::Array(vec![
                serde_json::json!({"Code": code, "Message": message});
                actions
            ])
        };
        let prefix = "com.amazonaws.dynamodb.v20120810#";
        let answer = match self {
            Self::ThrottledTransaction => serde_json::json!({
                "__type": format!("{prefix}TransactionCanceledException"),
                "message": "Transaction cancelled, please refer cancellation reasons for specific reasons [ThrottlingError]",
                "CancellationReasons": reasons("ThrottlingError", "Throughput exceeds the current capacity of your table or index."),
            }),
            Self::ConflictedTransaction => serde_json::json!({
                "__type": format!("{prefix}TransactionCanceledException"),
                "message": "Transaction cancelled, please refer cancellation reasons for specific reasons [TransactionConflict]",
                "CancellationReasons": reasons("TransactionConflict", "Transaction is ongoing for the item"),
            }),
            Self::TransactionInProgress => serde_json::json!({
                "__type": format!("{prefix}TransactionInProgressException"),
                "message": "The transaction with the given request token is already in progress.",
            }),
            Self::TransactionConflict => serde_json::json!({
                "__type": format!("{prefix}TransactionConflictException"),
                "message": "Transaction is ongoing for the item",
            }),
            Self::Throttled => serde_json::json!({
                "__type": format!("{prefix}ProvisionedThroughputExceededException"),
                "message": "The level of configured provisioned throughput for the table was exceeded. Consider increasing your provisioning level with the UpdateTable API.",
            }),
        };
        json_answer(StatusCode::BAD_REQUEST, &answer)
    }
}

/// A response with a JSON body, as DynamoDB answers.
fn json_answer(status: StatusCode, body: &Value) -> Response<Full<Bytes>> {
    Response::builder()
        .status(status)
        .header("Content-Type", "application/x-amz-json-1.0")
        .header(
            "x-amzn-RequestId",
            format!("proxy-{:016x}", fastrand::u64(..)),
        )
        .body(Full::from(body.to_string()))
        .expect("a status and two valid headers")
}

pub trait Policy: Send + Sync + 'static {
    /// `operation` is the last part of `X-Amz-Target` (`PutItem` for
    /// `DynamoDB_20120810.PutItem`); `body` is the request's JSON, unparsed, as most requests
    /// need no look at it.
    fn decide(&self, operation: Option<&str>, body: &[u8]) -> Verdict;

    /// The server's answer to a request that was held or delayed, once it comes back: what
    /// such a late write did is the point of holding it.
    fn answered(&self, _status: u16, _body: &[u8]) {}
}

struct Shared<P> {
    policy: P,
    held: Mutex<Vec<oneshot::Sender<()>>>,
    changed: Notify,
    forwarded: AtomicU64,
    upstream: SocketAddr,
    client: Client<HttpConnector, Full<Bytes>>,
}

pub struct ForwardingProxy<P> {
    addr: SocketAddr,
    shared: Arc<Shared<P>>,
}

impl<P: Policy> ForwardingProxy<P> {
    /// Listens on a free port of 127.0.0.1 and forwards to `upstream_endpoint`
    /// (`http://127.0.0.1:PORT`).
    pub async fn with_policy(upstream_endpoint: &str, policy: P) -> Result<Self, crate::Error> {
        let upstream: SocketAddr = upstream_endpoint
            .trim_start_matches("http://")
            .parse()
            .map_err(|e: std::net::AddrParseError| crate::Error::Parse {
                what: format!("{upstream_endpoint} is not http://127.0.0.1:PORT"),
                source: e.into(),
            })?;
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(crate::Error::io("proxy: listen on 127.0.0.1"))?;
        let addr = listener
            .local_addr()
            .map_err(crate::Error::io("proxy: its address"))?;
        let shared = Arc::new(Shared {
            policy,
            held: Mutex::new(Vec::new()),
            changed: Notify::new(),
            forwarded: AtomicU64::new(0),
            upstream,
            client: Client::builder(TokioExecutor::new()).build_http(),
        });
        let accept_shared = shared.clone();
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let shared = accept_shared.clone();
                let serve = service_fn(move |request| serve(request, shared.clone()));
                tokio::spawn(async move {
                    // A connection the client dropped mid-request is not the caller's concern.
                    let _ = http1::Builder::new()
                        .serve_connection(TokioIo::new(client), serve)
                        .await;
                });
            }
        });
        Ok(Self { addr, shared })
    }

    /// [`ForwardingProxy::with_policy`] with the policy's default (the tests' proxies).
    pub async fn start(upstream_endpoint: &str) -> Self
    where
        P: Default,
    {
        Self::with_policy(upstream_endpoint, P::default())
            .await
            .unwrap_or_else(|e| panic!("start the proxy: {}", DisplayErrorContext(e)))
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

/// Which requests [`HoldNext`] holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// Every request of one operation (as in `X-Amz-Target: DynamoDB_20120810.PutItem`).
    Operation(String),
    /// The protocol's acquire writes (see [`acquiring`]); `Some`: only those of this identity.
    Acquire(Option<Identity>),
}

impl Target {
    fn matches(&self, operation: Option<&str>, body: &[u8]) -> bool {
        match self {
            Self::Operation(wanted) => operation.is_some_and(|op| wanted.eq_ignore_ascii_case(op)),
            Self::Acquire(who) => acquiring(operation, body)
                .is_some_and(|identity| who.as_ref().is_none_or(|who| *who == identity)),
        }
    }
}

/// Holds the next N requests of one [`Target`], and records what the server answered to each
/// of them once they went.
#[derive(Default)]
pub struct HoldNext {
    /// What to hold, and how many more of them.
    to_hold: Mutex<Option<(Target, usize)>>,
    answers: Mutex<Vec<HeldAnswer>>,
}

/// What the server answered to a held request when it finally arrived.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeldAnswer {
    pub status: u16,
    /// Refused by its condition: the late write changed nothing.
    pub condition_failed: bool,
}

impl Policy for HoldNext {
    fn decide(&self, operation: Option<&str>, body: &[u8]) -> Verdict {
        let mut to_hold = self.to_hold.lock().unwrap();
        match to_hold.as_mut() {
            Some((target, remaining)) if *remaining > 0 && target.matches(operation, body) => {
                *remaining -= 1;
                Verdict::Hold
            }
            _ => Verdict::Forward,
        }
    }

    fn answered(&self, status: u16, body: &[u8]) {
        self.answers.lock().unwrap().push(HeldAnswer {
            status,
            condition_failed: String::from_utf8_lossy(body)
                .contains("ConditionalCheckFailedException"),
        });
    }
}

pub type HoldingProxy = ForwardingProxy<HoldNext>;

impl HoldingProxy {
    /// Hold the next `n` requests for `operation` (as in `X-Amz-Target: DynamoDB_20120810.PutItem`).
    pub fn hold_next(&self, operation: &str, n: usize) {
        self.hold(Target::Operation(operation.to_owned()), n);
    }

    /// Hold the next `n` acquire writes (of any identity), and nothing else: a release or a
    /// rotation sent through the same proxy goes on.
    pub fn hold_next_acquires(&self, n: usize) {
        self.hold(Target::Acquire(None), n);
    }

    pub fn hold(&self, target: Target, n: usize) {
        *self.policy().to_hold.lock().unwrap() = Some((target, n));
    }

    /// The server's answers to the held requests that went on, in the order they came back.
    pub fn held_answers(&self) -> Vec<HeldAnswer> {
        self.policy().answers.lock().unwrap().clone()
    }
}

/// Which requests a scripted fault of [`Faults`] meets.
pub type Matcher = Box<dyn Fn(Option<&str>, &[u8]) -> bool + Send + Sync>;

/// A request as the proxy saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seen {
    pub operation: Option<String>,
    /// A transaction's `ClientRequestToken`.
    pub token: Option<String>,
    /// What the proxy did with it.
    pub verdict: Verdict,
}

/// Scripted faults, each for the next request it matches ([`ForwardingProxy::fault`]), and a log
/// of every request: the service's faults a real server produces and the local one cannot
/// (see [`Verdict::LoseAnswer`], [`Canned`]).
#[derive(Default)]
pub struct Faults {
    script: Mutex<Vec<(Matcher, Verdict)>>,
    seen: Mutex<Vec<Seen>>,
}

impl Policy for Faults {
    fn decide(&self, operation: Option<&str>, body: &[u8]) -> Verdict {
        let mut script = self.script.lock().unwrap();
        let verdict = match script.iter().position(|(m, _)| m(operation, body)) {
            Some(i) => script.remove(i).1,
            None => Verdict::Forward,
        };
        let token = serde_json::from_slice::<Value>(body).ok().and_then(|b| {
            b.get("ClientRequestToken")
                .and_then(Value::as_str)
                .map(str::to_owned)
        });
        self.seen.lock().unwrap().push(Seen {
            operation: operation.map(str::to_owned),
            token,
            verdict,
        });
        verdict
    }
}

pub type FaultyProxy = ForwardingProxy<Faults>;

impl FaultyProxy {
    /// The next request that `matches` gets `verdict` (faults are met in the order scripted).
    pub fn fault(
        &self,
        matches: impl Fn(Option<&str>, &[u8]) -> bool + Send + Sync + 'static,
        verdict: Verdict,
    ) {
        self.policy()
            .script
            .lock()
            .unwrap()
            .push((Box::new(matches), verdict));
    }

    /// The next request of `operation` (as in `X-Amz-Target: DynamoDB_20120810.UpdateItem`)
    /// gets `verdict`.
    pub fn fault_next(&self, operation: &'static str, verdict: Verdict) {
        self.fault(
            move |op, _| op.is_some_and(|op| op.eq_ignore_ascii_case(operation)),
            verdict,
        );
    }

    /// Faults scripted and not met yet.
    pub fn pending(&self) -> usize {
        self.policy().script.lock().unwrap().len()
    }

    /// Every request so far, in order.
    pub fn seen(&self) -> Vec<Seen> {
        self.policy().seen.lock().unwrap().clone()
    }

    /// The requests of `operation` so far.
    pub fn seen_of(&self, operation: &str) -> Vec<Seen> {
        self.seen()
            .into_iter()
            .filter(|s| s.operation.as_deref() == Some(operation))
            .collect()
    }
}

/// One write of the protocol, recognised from the request a [`crate::proxy`] sees. The shapes are
/// those `semaphore_core::dynamo::render` sends (and `DynamoStore` puts for a lock's first write),
/// read back from the wire, so the proxy holds what it means to hold whatever the rest of the
/// request looks like. Placeholders are resolved by the request's own names and values, never by
/// how they are numbered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProtocolWrite {
    /// `UpdateItem` that SETs `#holders.#hN = #version + :v` (the slot's token is the version the
    /// write makes): an acquire of the identity whose slot key `#hN` names, with the checks its
    /// condition makes when it lands.
    Acquire {
        identity: Identity,
        /// The keys that refuse it (`NOT contains(#young, :v) AND NOT contains(#old, :v)`), in
        /// the condition's order.
        fences: Vec<FenceKey>,
        /// Its horizon (`#rotated_at < :v`): refused if the fences rotated at or after it.
        deadline_ms: Option<u64>,
        /// The most weight that may be held for it to land, its limit less its weight
        /// (`#used <= :v`).
        room: Option<u64>,
    },
    /// `UpdateItem` that REMOVEs one holder and ADDs a fence to `#young`: a release.
    Release(Identity),
    /// `UpdateItem` that ADDs a fence to `#young` and removes no holder: a cleanup's first write.
    CleanupFence,
    /// `UpdateItem` that REMOVEs holders and adds no fence: a cleanup's second write.
    CleanupFree(Vec<Identity>),
    /// `UpdateItem` that SETs `#rotated_at`: a rotation of the fences.
    Rotation,
    /// `PutItem` of a lock's first item; `acquiring`: the holder it puts with the item's own
    /// version as its token, when the first write is an acquire. The put checks only that there
    /// is no item yet: the write's own checks were met against the empty lock before it was sent.
    Create { acquiring: Option<Identity> },
}

/// The identity an acquire write is made for, if this request is one: an `UpdateItem` acquire,
/// or the `PutItem` that creates a lock's item with its first holder.
pub fn acquiring(operation: Option<&str>, body: &[u8]) -> Option<Identity> {
    match recognise(operation, body)? {
        ProtocolWrite::Acquire { identity, .. } => Some(identity),
        ProtocolWrite::Create { acquiring } => acquiring,
        _ => None,
    }
}

/// What this request is, if it is one of the protocol's writes.
pub fn recognise(operation: Option<&str>, body: &[u8]) -> Option<ProtocolWrite> {
    let body: Value = serde_json::from_slice(body).ok()?;
    match operation? {
        "UpdateItem" => recognise_update(&body),
        "PutItem" => {
            let item = body.get("Item")?;
            let version = wire::number(item.get("version")?)?;
            let acquiring =
                item.get("holders")?
                    .get("M")?
                    .as_object()?
                    .iter()
                    .find_map(|(key, packed)| {
                        // The holding's token (below its weight, above its time) is the
                        // version the put makes (stored times VERSION_UNIT).
                        let token = (wire::number(packed)? % WEIGHT_SPAN) / TIME_SPAN;
                        (token * VERSION_UNIT == version)
                            .then(|| Identity::from_slot_key(key).ok())
                            .flatten()
                    });
            Some(ProtocolWrite::Create { acquiring })
        }
        "TransactWriteItems" => recognise_gate_acquire(&body),
        _ => None,
    }
}

/// A gate's acquire: the `TransactWriteItems` whose `Put` makes a holding item `held` (its
/// `slot` the identity) and whose gate `Update` (keyed by `lock` alone) makes the acquire's
/// checks in its condition, as an item-layout acquire makes them.
fn recognise_gate_acquire(body: &Value) -> Option<ProtocolWrite> {
    let actions = body.get("TransactItems")?.as_array()?;
    let identity = actions.iter().find_map(|action| {
        let item = action.get("Put")?.get("Item")?;
        (item.get("state")?.get("S")?.as_str()? == "held").then_some(())?;
        Identity::from_slot_key(item.get("slot")?.get("S")?.as_str()?).ok()
    })?;
    let gate = actions.iter().find_map(|action| {
        let update = action.get("Update")?;
        let key = update.get("Key")?.as_object()?;
        (key.len() == 1 && key.contains_key("lock")).then_some(update)
    })?;
    Some(acquire_checks(
        identity,
        condition_of(gate),
        &Placeholders::of(gate)?,
    ))
}

/// A request's (or a transaction action's) condition expression; empty when it has none.
fn condition_of(request: &Value) -> &str {
    request
        .get("ConditionExpression")
        .and_then(Value::as_str)
        .unwrap_or_default()
}

/// A request's placeholders, resolved by the maps it carries.
struct Placeholders<'a> {
    names: &'a Map<String, Value>,
    values: Option<&'a Map<String, Value>>,
}

impl<'a> Placeholders<'a> {
    /// The placeholders of a request, or of a transaction's action: its names (required) and
    /// values.
    fn of(request: &'a Value) -> Option<Self> {
        Some(Self {
            names: request.get("ExpressionAttributeNames")?.as_object()?,
            values: request
                .get("ExpressionAttributeValues")
                .and_then(Value::as_object),
        })
    }

    fn name(&self, placeholder: &str) -> Option<&str> {
        self.names.get(placeholder.trim()).and_then(Value::as_str)
    }

    fn value(&self, placeholder: &str) -> Option<&Value> {
        self.values?.get(placeholder.trim())
    }

    /// The identity whose slot `#holders.#hN` names.
    fn slot(&self, path: &str) -> Option<Identity> {
        let (map, entry) = path.trim().split_once('.')?;
        (self.name(map)? == "holders").then_some(())?;
        Identity::from_slot_key(self.name(entry)?).ok()
    }
}

fn recognise_update(body: &Value) -> Option<ProtocolWrite> {
    let p = Placeholders::of(body)?;
    let actions = clauses(body.get("UpdateExpression")?.as_str()?);
    let of = |keyword: &str| -> Vec<&str> {
        actions
            .iter()
            .filter(|(k, _)| *k == keyword)
            .map(|(_, action)| action.as_str())
            .collect()
    };
    let (set, remove, add) = (of("SET"), of("REMOVE"), of("ADD"));
    let acquire = set.iter().find_map(|action| {
        let (path, value) = action.split_once(" = ")?;
        let (version, _) = value.split_once(" + ")?;
        (p.name(version)? == "version").then_some(())?;
        p.slot(path)
    });
    if let Some(identity) = acquire {
        return Some(acquire_checks(identity, condition_of(body), &p));
    }
    let named = |action: &str, wanted: &str| {
        action
            .split_whitespace()
            .next()
            .and_then(|target| p.name(target))
            == Some(wanted)
    };
    if set.iter().any(|action| named(action, "rotated_at")) {
        return Some(ProtocolWrite::Rotation);
    }
    let removed: Vec<Identity> = remove.iter().filter_map(|path| p.slot(path)).collect();
    let fences = add.iter().any(|action| named(action, "young"));
    // A release of nothing held fences alone, on the check that the slot is absent.
    let unheld = body
        .get("ConditionExpression")
        .and_then(Value::as_str)
        .and_then(|c| c.split("attribute_not_exists(").nth(1))
        .and_then(|rest| rest.split(')').next())
        .and_then(|path| p.slot(path));
    match (removed.as_slice(), fences) {
        ([identity], true) => Some(ProtocolWrite::Release(identity.clone())),
        ([], true) => Some(match unheld {
            Some(identity) => ProtocolWrite::Release(identity),
            None => ProtocolWrite::CleanupFence,
        }),
        (_, false) if !removed.is_empty() => Some(ProtocolWrite::CleanupFree(removed)),
        _ => None,
    }
}

/// An acquire of `identity` with the checks its condition makes: each term of the condition
/// (`A AND B AND (C OR D)`) read for the fences it must not find, the rotation it must precede
/// and the room it needs under the limit.
fn acquire_checks(identity: Identity, condition: &str, p: &Placeholders) -> ProtocolWrite {
    let (mut fences, mut deadline_ms, mut room) = (Vec::new(), None, None);
    // The number a comparison `#name OP :v` of the attribute `name` is made with.
    let compared = |term: &str, op: &str, name: &str| {
        let (left, operand) = term.split_once(op)?;
        (p.name(left)? == name).then_some(())?;
        u64::try_from(wire::number(p.value(operand)?)?).ok()
    };
    for term in condition.split(" AND ") {
        let term = term.trim().trim_matches(|c| c == '(' || c == ')');
        let term = term.rsplit(" OR ").next().unwrap_or(term).trim();
        if let Some(args) = term.strip_prefix("NOT contains(") {
            let Some((set, key)) = args.split_once(',') else {
                continue;
            };
            let key = key.trim_end_matches(')');
            let fence = matches!(p.name(set), Some("young" | "old"))
                .then(|| p.value(key).and_then(wire::fence_key))
                .flatten();
            if let Some(fence) = fence.filter(|f| !fences.contains(f)) {
                fences.push(fence);
            }
        } else {
            room = compared(term, " <= ", "used").or(room);
            deadline_ms = compared(term, " < ", "rotated_at").or(deadline_ms);
        }
    }
    ProtocolWrite::Acquire {
        identity,
        fences,
        deadline_ms,
        room,
    }
}

/// The actions of an update expression with their keyword: `SET a = b, c = d REMOVE e` gives
/// `[("SET", "a = b"), ("SET", "c = d"), ("REMOVE", "e")]`. Enough for the expressions the
/// protocol renders (no function calls with commas in them).
fn clauses(expression: &str) -> Vec<(&'static str, String)> {
    const KEYWORDS: [&str; 4] = ["SET", "REMOVE", "ADD", "DELETE"];
    let mut sections: Vec<(&'static str, Vec<&str>)> = Vec::new();
    for word in expression.split_whitespace() {
        match KEYWORDS.iter().find(|k| k.eq_ignore_ascii_case(word)) {
            Some(keyword) => sections.push((keyword, Vec::new())),
            None => {
                if let Some((_, words)) = sections.last_mut() {
                    words.push(word);
                }
            }
        }
    }
    sections
        .into_iter()
        .flat_map(|(keyword, words)| {
            words
                .join(" ")
                .split(',')
                .map(|action| (keyword, action.trim().to_owned()))
                .collect::<Vec<_>>()
        })
        .collect()
}

/// Why a request got no answer at all (the client sees its connection closed, as before any
/// answer from a server that went away).
type Failure = Box<dyn std::error::Error + Send + Sync>;

async fn serve<P: Policy>(
    request: Request<Incoming>,
    shared: Arc<Shared<P>>,
) -> Result<Response<Full<Bytes>>, Failure> {
    let (mut head, body) = request.into_parts();
    let body = body.collect().await?.to_bytes();
    let operation = head
        .headers
        .get("x-amz-target")
        .and_then(|t| t.to_str().ok())
        .and_then(|t| t.rsplit_once('.'))
        .map(|(_, op)| op);
    let verdict = shared.policy.decide(operation, &body);
    match verdict {
        Verdict::Forward | Verdict::LoseAnswer | Verdict::PartialRead => {}
        Verdict::Hold => {
            let (gate, released) = oneshot::channel();
            shared.held.lock().unwrap().push(gate);
            shared.changed.notify_waiters();
            let _ = released.await;
        }
        Verdict::Delay(pause) => tokio::time::sleep(pause).await,
        Verdict::Answer(canned) => return Ok(canned.response(&body)),
    }
    shared.forwarded.fetch_add(1, Ordering::SeqCst);
    let path = head.uri.path_and_query().map_or("/", |p| p.as_str());
    head.uri = Uri::try_from(format!("http://{}{path}", shared.upstream))?;
    let response = shared
        .client
        .request(Request::from_parts(head, Full::new(body.clone())))
        .await?;
    let (answer_head, answer_body) = response.into_parts();
    let answer_body = answer_body.collect().await?.to_bytes();
    if verdict != Verdict::Forward {
        shared
            .policy
            .answered(answer_head.status.as_u16(), &answer_body);
    }
    if verdict == Verdict::LoseAnswer {
        let lost = serde_json::json!({
            "__type": "com.amazonaws.dynamodb.v20120810#InternalServerError",
            "message": "Internal server error (the test proxy lost the answer to a write that landed)",
        });
        return Ok(json_answer(StatusCode::INTERNAL_SERVER_ERROR, &lost));
    }
    if verdict == Verdict::PartialRead && answer_head.status == StatusCode::OK {
        if let Some(partial) = partial_read(&body, &answer_body) {
            return Ok(json_answer(StatusCode::OK, &partial));
        }
    }
    Ok(Response::from_parts(answer_head, Full::new(answer_body)))
}

/// The `BatchGetItem` answer `answer` to `request` cut to its first item of each table, every
/// other key asked for left unread (see [`Verdict::PartialRead`]); `None` if either is not JSON.
fn partial_read(request: &[u8], answer: &[u8]) -> Option<Value> {
    let request: Value = serde_json::from_slice(request).ok()?;
    let mut answer: Value = serde_json::from_slice(answer).ok()?;
    let mut unread = serde_json::Map::new();
    for (table, asked) in request["RequestItems"].as_object()? {
        let items = answer["Responses"][table].as_array_mut()?;
        items.truncate(1);
        // A key was read if the item kept has each of its attributes, equal.
        let read = |key: &Value| {
            key.as_object().is_some_and(|key| {
                items.first().is_some_and(|item| {
                    key.iter()
                        .all(|(name, value)| item.get(name) == Some(value))
                })
            })
        };
        let left: Vec<Value> = asked["Keys"]
            .as_array()?
            .iter()
            .filter(|key| !read(key))
            .cloned()
            .collect();
        if !left.is_empty() {
            let mut keys = asked.clone();
            keys["Keys"] = Value::Array(left);
            unread.insert(table.clone(), keys);
        }
    }
    answer["UnprocessedKeys"] = Value::Object(unread);
    Some(answer)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    /// A slot of weight 1, as a cleanup's fence sees it.
    fn held() -> semaphore_core::Holding {
        semaphore_core::Holding {
            token: semaphore_core::FencingToken(1),
            acquired_at_ms: 0,
            weight: semaphore_core::Weight::ONE,
        }
    }

    use super::*;
    use semaphore_core::protocol::{self, Timing};
    use semaphore_core::Write;

    use crate::names::{id, limit, lock};
    use crate::wire::{put_body, update_body};

    /// An acquire requested at 1 s: its horizon (8 s by default) is at 9 s.
    fn acquire_write(holder: &str) -> Write {
        protocol::acquire(
            &lock("l"),
            &id(holder, "a1"),
            semaphore_core::Run::FIRST,
            None,
            limit(2),
            1_000,
            1_000,
            &Timing::default(),
        )
        .unwrap()
    }

    #[test]
    fn holds_only_the_next_n_requests_of_the_operation() {
        let policy = HoldNext::default();
        assert_eq!(policy.decide(Some("PutItem"), b"{}"), Verdict::Forward);
        *policy.to_hold.lock().unwrap() = Some((Target::Operation("PutItem".to_owned()), 2));
        assert_eq!(policy.decide(Some("GetItem"), b"{}"), Verdict::Forward);
        assert_eq!(policy.decide(None, b"{}"), Verdict::Forward);
        assert_eq!(policy.decide(Some("putitem"), b"{}"), Verdict::Hold);
        assert_eq!(policy.decide(Some("PutItem"), b"{}"), Verdict::Hold);
        assert_eq!(policy.decide(Some("PutItem"), b"{}"), Verdict::Forward);
    }

    #[test]
    fn holds_acquire_writes_and_lets_releases_cleanups_and_rotations_pass() {
        let policy = HoldNext::default();
        *policy.to_hold.lock().unwrap() = Some((Target::Acquire(Some(id("e1", "a1"))), 1));
        let release = update_body(&protocol::release(
            &lock("l"),
            &id("e1", "a1"),
            semaphore_core::FencingToken(1),
            semaphore_core::Weight::ONE,
            0,
        ));
        let fence = update_body(&protocol::cleanup_fence(
            &lock("l"),
            &id("e1", "a1").holder,
            semaphore_core::Run::FIRST,
        ));
        for other in [&release, &fence] {
            assert_eq!(policy.decide(Some("UpdateItem"), other), Verdict::Forward);
        }
        let someone_else = update_body(&acquire_write("e2"));
        assert_eq!(
            policy.decide(Some("UpdateItem"), &someone_else),
            Verdict::Forward
        );
        let mine = update_body(&acquire_write("e1"));
        assert_eq!(policy.decide(Some("UpdateItem"), &mine), Verdict::Hold);
        assert_eq!(policy.decide(Some("UpdateItem"), &mine), Verdict::Forward);
    }

    #[test]
    fn every_write_the_protocol_renders_is_recognised() {
        let (l, who) = (
            lock("l"),
            id("arn:aws:states:us-east-1:1:execution:m:e#1", "a1"),
        );
        let update = |write: &Write| recognise(Some("UpdateItem"), &update_body(write));
        let acquire = ProtocolWrite::Acquire {
            identity: who.clone(),
            fences: vec![
                FenceKey::execution(&who.holder, semaphore_core::Run::FIRST),
                FenceKey::acquisition(&who),
            ],
            deadline_ms: Some(9_000),
            room: Some(1),
        };
        assert_eq!(
            update(&acquire_write("arn:aws:states:us-east-1:1:execution:m:e#1")),
            Some(acquire.clone()),
            "requested at 1 s, horizon 8 s"
        );
        assert_eq!(
            update(&protocol::release(
                &l,
                &who,
                semaphore_core::FencingToken(1),
                semaphore_core::Weight::ONE,
                0
            )),
            Some(ProtocolWrite::Release(who.clone()))
        );
        assert_eq!(
            update(&protocol::release_unheld(&l, &who, 0)),
            Some(ProtocolWrite::Release(who.clone()))
        );
        assert_eq!(
            update(&protocol::cleanup_fence(
                &l,
                &who.holder,
                semaphore_core::Run::FIRST
            )),
            Some(ProtocolWrite::CleanupFence)
        );
        let both = [
            who.clone(),
            id("arn:aws:states:us-east-1:1:execution:m:e#1", "a2"),
        ];
        let weighted = both
            .iter()
            .map(|id| (id.clone(), held()))
            .collect::<Vec<_>>();
        assert_eq!(
            update(&protocol::cleanup_free(&l, &weighted)),
            Some(ProtocolWrite::CleanupFree(both.to_vec()))
        );
        let mut item = semaphore_core::SemaphoreItem::empty(l.clone());
        item.fences.young = BTreeSet::from([FenceKey::acquisition(&who)]);
        let rotation = protocol::rotation(&item, 1_000, &Timing::default()).unwrap();
        assert_eq!(update(&rotation), Some(ProtocolWrite::Rotation));

        // A lock's first write puts the item the write makes of the empty lock.
        let put = |write: &Write| recognise(Some("PutItem"), &put_body(write));
        let first = acquire_write("arn:aws:states:us-east-1:1:execution:m:e#1");
        assert_eq!(
            put(&first),
            Some(ProtocolWrite::Create {
                acquiring: Some(who.clone())
            })
        );
        assert_eq!(
            acquiring(Some("PutItem"), &put_body(&first)),
            Some(who.clone())
        );
        assert_eq!(
            acquiring(Some("UpdateItem"), &update_body(&first)),
            Some(who.clone())
        );
        assert_eq!(
            put(&protocol::release_unheld(&l, &who, 0)),
            Some(ProtocolWrite::Create { acquiring: None })
        );
        assert_eq!(recognise(Some("GetItem"), b"{}"), None);
        assert_eq!(
            recognise(Some("UpdateItem"), &put_body(&first)),
            None,
            "the operation is the request's, not a guess from its body"
        );
    }

    #[test]
    fn placeholders_are_resolved_by_name_not_by_number() {
        let body = update_body(&acquire_write("e1"));
        let expected = recognise(Some("UpdateItem"), &body);
        let mut body: Value = serde_json::from_slice(&body).unwrap();
        // Number the values the other way round, and give the names other spellings.
        let values = body["ExpressionAttributeValues"]
            .as_object()
            .unwrap()
            .clone();
        let names = body["ExpressionAttributeNames"]
            .as_object()
            .unwrap()
            .clone();
        // The longest first, so `:v1` is never replaced inside `:v10`.
        let renamed = |text: &str| {
            let text = (0..values.len()).rev().fold(text.to_owned(), |text, n| {
                text.replace(&format!(":v{n}"), &format!(":x{}", values.len() - 1 - n))
            });
            names.keys().fold(text, |text, name| {
                text.replace(name, &format!("#n_{}", &name[1..]))
            })
        };
        for expression in ["ConditionExpression", "UpdateExpression"] {
            body[expression] = Value::from(renamed(body[expression].as_str().unwrap()));
        }
        let rekey = |map: &Map<String, Value>| -> Map<String, Value> {
            map.iter().map(|(k, v)| (renamed(k), v.clone())).collect()
        };
        body["ExpressionAttributeValues"] = Value::Object(rekey(&values));
        body["ExpressionAttributeNames"] = Value::Object(rekey(&names));
        let body = serde_json::to_vec(&body).unwrap();
        assert!(!String::from_utf8_lossy(&body).contains(":v0"));
        assert_eq!(recognise(Some("UpdateItem"), &body), expected);
        assert!(matches!(
            expected,
            Some(ProtocolWrite::Acquire { ref fences, deadline_ms: Some(_), room: Some(1), .. })
                if fences.len() == 2
        ));
    }
}
