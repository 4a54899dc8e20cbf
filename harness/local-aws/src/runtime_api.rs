//! A stand-in for the Lambda Runtime API, so that a built function binary can be run as Lambda
//! runs it: events are handed out on `GET /2018-06-01/runtime/invocation/next` and the answers
//! collected from `POST .../response` and `POST .../error` (with the `errorType` a state machine
//! matches). The binary talks to the local server through `AWS_ENDPOINT_URL`. The API's
//! HTTP/1.1 is hyper's, on a runtime of its own that lives as long as one run.

use std::collections::VecDeque;
use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::Value;

use crate::server::endpoint;

/// What the function answered to one event.
#[derive(Debug, Clone, PartialEq)]
pub enum Answer {
    /// `POST /runtime/invocation/{id}/response`: the handler's output.
    Response(Value),
    /// `POST /runtime/invocation/{id}/error`: `{"errorType": ..., "errorMessage": ...}`.
    Error(Value),
    /// `POST /runtime/init/error`: the function could not start.
    InitError(Value),
}

/// Everything one run of the binary produced.
#[derive(Debug, Clone)]
pub struct FunctionRun {
    pub answers: Vec<Answer>,
    pub stdout: String,
    pub stderr: String,
    /// From starting the process to its first `GET /runtime/invocation/next`: the function's
    /// init (cold start) as Lambda would bill it, minus the sandbox's own start.
    pub init: Option<Duration>,
    /// The process's peak resident memory (`VmHWM`, KiB) when it was stopped (Linux only).
    pub peak_rss_kib: Option<u64>,
}

#[derive(Default)]
struct State {
    events: VecDeque<(String, Value)>,
    answers: Vec<Answer>,
    first_next: Option<Instant>,
}

type Shared = Arc<(Mutex<State>, Condvar)>;

/// Runs the function binary `exe` with `env` (besides the Lambda variables, dummy credentials,
/// region us-east-1 and the local server's endpoint), invokes it once per event in order, and
/// stops it when every event is answered, it exits, or 60 s have passed.
pub fn run_function(exe: &Path, env: &[(&str, &str)], events: Vec<Value>) -> FunctionRun {
    run_function_for(exe, env, events, Duration::from_secs(60))
}

/// [`run_function`], stopped after `wait` instead of 60 s (a sweep of a large table on the
/// local server, whose `Scan` takes seconds a page).
pub fn run_function_for(
    exe: &Path,
    env: &[(&str, &str)],
    events: Vec<Value>,
    wait: Duration,
) -> FunctionRun {
    // Dropped at the end of the run, which ends the API's connections with it.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_io()
        .build()
        .expect("a runtime for the runtime API");
    let listener = runtime
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .expect("bind the runtime API");
    let address = listener.local_addr().expect("local address");
    let wanted = events.len();
    let shared: Shared = Arc::new((
        Mutex::new(State {
            events: events
                .into_iter()
                .enumerate()
                .map(|(n, e)| (format!("request-{n}"), e))
                .collect(),
            ..State::default()
        }),
        Condvar::new(),
    ));
    let accept_shared = shared.clone();
    runtime.spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let shared = accept_shared.clone();
            let serve = service_fn(move |request| serve(request, shared.clone()));
            // HTTP/1.1 keep-alive: one request after another on the same connection.
            tokio::spawn(http1::Builder::new().serve_connection(TokioIo::new(stream), serve));
        }
    });

    let spawned = Instant::now();
    let mut child = Command::new(exe)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("AWS_LAMBDA_RUNTIME_API", address.to_string())
        .env("AWS_LAMBDA_FUNCTION_NAME", "test-function")
        .env("AWS_LAMBDA_FUNCTION_MEMORY_SIZE", "128")
        .env("AWS_LAMBDA_FUNCTION_VERSION", "$LATEST")
        .env("AWS_ACCESS_KEY_ID", "testing")
        .env("AWS_SECRET_ACCESS_KEY", "testing")
        .env("AWS_REGION", "us-east-1")
        .env("AWS_ENDPOINT_URL", endpoint())
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the function binary");
    let read_all = |mut pipe: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut s = String::new();
            let _ = pipe.read_to_string(&mut s);
            s
        })
    };
    let stdout = read_all(Box::new(child.stdout.take().expect("stdout")));
    let stderr = read_all(Box::new(child.stderr.take().expect("stderr")));

    let deadline = Instant::now() + wait;
    {
        let (lock, ready) = &*shared;
        let mut state = lock.lock().expect("state");
        loop {
            let init_failed = state
                .answers
                .iter()
                .any(|a| matches!(a, Answer::InitError(_)));
            let exited = child.try_wait().ok().flatten().is_some();
            if state.answers.len() >= wanted || init_failed || exited || Instant::now() >= deadline
            {
                break;
            }
            state = ready
                .wait_timeout(state, Duration::from_millis(100))
                .expect("state")
                .0;
        }
    }
    let peak_rss_kib = peak_rss_kib(child.id());
    let _ = child.kill();
    let _ = child.wait();
    let (answers, first_next) = {
        let state = shared.0.lock().expect("state");
        (state.answers.clone(), state.first_next)
    };
    FunctionRun {
        answers,
        stdout: stdout.join().unwrap_or_default(),
        stderr: stderr.join().unwrap_or_default(),
        init: first_next.map(|t| t.saturating_duration_since(spawned)),
        peak_rss_kib,
    }
}

/// `VmHWM` of a running process, from `/proc/<pid>/status`.
fn peak_rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()
}

/// One request of the function: the next event (none left: no answer, until the run ends), or
/// its answer to one.
async fn serve(request: Request<Incoming>, shared: Shared) -> hyper::Result<Response<Full<Bytes>>> {
    let (method, path) = (request.method().clone(), request.uri().path().to_owned());
    let body = request.into_body().collect().await?.to_bytes();
    let (lock, ready) = &*shared;
    let reply = Response::builder().header("Content-Type", "application/json");
    let reply = if method == Method::GET && path.ends_with("/runtime/invocation/next") {
        let next = {
            let mut state = lock.lock().expect("state");
            state.first_next.get_or_insert_with(Instant::now);
            state.events.pop_front()
        };
        let Some((id, event)) = next else {
            return std::future::pending().await;
        };
        let deadline_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() + 60_000)
            .unwrap_or(0);
        reply
            .header("Lambda-Runtime-Aws-Request-Id", id)
            .header("Lambda-Runtime-Deadline-Ms", deadline_ms.to_string())
            .header(
                "Lambda-Runtime-Invoked-Function-Arn",
                "arn:aws:lambda:us-east-1:123456789012:function:test-function",
            )
            .body(Full::from(event.to_string()))
    } else if method == Method::POST {
        let value: Value = serde_json::from_slice(&body)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&body).into_owned()));
        let answer = if path.ends_with("/response") {
            Answer::Response(value)
        } else if path.ends_with("/init/error") {
            Answer::InitError(value)
        } else {
            Answer::Error(value)
        };
        lock.lock().expect("state").answers.push(answer);
        ready.notify_all();
        reply
            .status(StatusCode::ACCEPTED)
            .body(Full::from("{\"status\":\"OK\"}"))
    } else {
        Response::builder()
            .status(StatusCode::NOT_FOUND)
            .body(Full::default())
    };
    Ok(reply.expect("a status and valid headers"))
}
