//! A stand-in for the Lambda Runtime API, so that a built function binary can be run as Lambda
//! runs it: events are handed out on `GET /2018-06-01/runtime/invocation/next` and the answers
//! collected from `POST .../response` and `POST .../error` (with the `errorType` a state machine
//! matches). The binary talks to the local server through `AWS_ENDPOINT_URL`.

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

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
    done: bool,
    first_next: Option<Instant>,
}

type Shared = Arc<(Mutex<State>, Condvar)>;

/// Runs the function binary `exe` with `env` (besides the Lambda variables, dummy credentials,
/// region us-east-1 and the local server's endpoint), invokes it once per event in order, and
/// stops it when every event is answered, it exits, or 60 s have passed.
pub fn run_function(exe: &Path, env: &[(&str, &str)], events: Vec<Value>) -> FunctionRun {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind the runtime API");
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
    {
        let shared = shared.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let shared = shared.clone();
                std::thread::spawn(move || serve(stream, &shared));
            }
        });
    }

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
    let mut stdout_pipe = child.stdout.take().expect("stdout");
    let mut stderr_pipe = child.stderr.take().expect("stderr");
    let stdout = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stdout_pipe.read_to_string(&mut s);
        s
    });
    let stderr = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stderr_pipe.read_to_string(&mut s);
        s
    });

    let deadline = Instant::now() + Duration::from_secs(60);
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
                state.done = true;
                ready.notify_all();
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

fn serve(stream: TcpStream, shared: &Shared) {
    let mut writer = match stream.try_clone() {
        Ok(w) => w,
        Err(_) => return,
    };
    let mut reader = BufReader::new(stream);
    // HTTP/1.1 keep-alive: one request after another on the same connection.
    while let Some((method, path, body)) = read_request(&mut reader) {
        let (lock, ready) = &**shared;
        if method == "GET" && path.ends_with("/runtime/invocation/next") {
            let next = {
                let mut state = lock.lock().expect("state");
                state.first_next.get_or_insert_with(Instant::now);
                loop {
                    if let Some(event) = state.events.pop_front() {
                        break Some(event);
                    }
                    if state.done {
                        break None;
                    }
                    state = ready
                        .wait_timeout(state, Duration::from_millis(100))
                        .expect("state")
                        .0;
                }
            };
            let Some((id, event)) = next else { return };
            let body = event.to_string();
            let deadline_ms = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_millis() + 60_000)
                .unwrap_or(0);
            let head = format!(
                "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\
                 Lambda-Runtime-Aws-Request-Id: {id}\r\n\
                 Lambda-Runtime-Deadline-Ms: {deadline_ms}\r\n\
                 Lambda-Runtime-Invoked-Function-Arn: arn:aws:lambda:us-east-1:123456789012:function:test-function\r\n\
                 Content-Length: {}\r\n\r\n",
                body.len()
            );
            if writer
                .write_all(head.as_bytes())
                .and_then(|_| writer.write_all(body.as_bytes()))
                .is_err()
            {
                return;
            }
        } else if method == "POST" {
            let value: Value = serde_json::from_slice(&body)
                .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&body).into_owned()));
            let answer = if path.ends_with("/response") {
                Answer::Response(value)
            } else if path.ends_with("/init/error") {
                Answer::InitError(value)
            } else {
                Answer::Error(value)
            };
            {
                let mut state = lock.lock().expect("state");
                state.answers.push(answer);
                ready.notify_all();
            }
            let ok = "{\"status\":\"OK\"}";
            let reply = format!(
                "HTTP/1.1 202 Accepted\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{ok}",
                ok.len()
            );
            if writer.write_all(reply.as_bytes()).is_err() {
                return;
            }
        } else {
            let _ = writer.write_all(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n");
        }
    }
}

/// Method, path and body of the next request; `None` when the connection closed.
fn read_request(reader: &mut BufReader<TcpStream>) -> Option<(String, String, Vec<u8>)> {
    let mut line = String::new();
    if reader.read_line(&mut line).ok()? == 0 {
        return None;
    }
    let mut parts = line.split_whitespace();
    let method = parts.next()?.to_owned();
    let path = parts.next()?.to_owned();
    let mut length = 0usize;
    let mut chunked = false;
    loop {
        let mut header = String::new();
        if reader.read_line(&mut header).ok()? == 0 {
            return None;
        }
        let header = header.trim_end();
        if header.is_empty() {
            break;
        }
        if let Some((name, value)) = header.split_once(':') {
            let (name, value) = (name.trim().to_ascii_lowercase(), value.trim());
            if name == "content-length" {
                length = value.parse().ok()?;
            } else if name == "transfer-encoding" && value.eq_ignore_ascii_case("chunked") {
                chunked = true;
            }
        }
    }
    let mut body = Vec::new();
    if chunked {
        loop {
            let mut size = String::new();
            reader.read_line(&mut size).ok()?;
            let size = usize::from_str_radix(size.trim().split(';').next()?, 16).ok()?;
            let mut chunk = vec![0; size + 2];
            reader.read_exact(&mut chunk).ok()?;
            if size == 0 {
                break;
            }
            body.extend_from_slice(&chunk[..size]);
        }
    } else {
        body.resize(length, 0);
        reader.read_exact(&mut body).ok()?;
    }
    Some((method, path, body))
}
