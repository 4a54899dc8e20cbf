//! The local AWS: moto's server (serialized, with its Step Functions execution mode and the
//! Lambda bridge), `cargo lambda watch` as the Lambda control plane, and our Lambda binaries as
//! its function instances. Everything listens on 127.0.0.1.

use std::collections::BTreeMap;
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use aws_config::{BehaviorVersion, Region, SdkConfig};
use aws_sdk_dynamodb::config::{Credentials, SharedCredentialsProvider};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::procs::Supervisor;
use crate::stack::Function;

/// Dummy credentials: nothing here reaches AWS.
pub const ACCESS_KEY: &str = "testing";
pub const SECRET_KEY: &str = "testing";

/// A free TCP port on 127.0.0.1 (for tools that cannot report the port they picked).
pub fn free_port() -> Result<u16, String> {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| format!("no free port on 127.0.0.1: {e}"))
}

pub fn sdk_config(endpoint: &str, region: &str) -> SdkConfig {
    SdkConfig::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new(region.to_owned()))
        .credentials_provider(SharedCredentialsProvider::new(Credentials::new(
            ACCESS_KEY,
            SECRET_KEY,
            None,
            None,
            "local-run",
        )))
        .endpoint_url(endpoint)
        .build()
}

fn wait_for<T>(
    supervisor: &Supervisor,
    what: &str,
    timeout: Duration,
    mut ready: impl FnMut() -> Option<T>,
) -> Result<T, String> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(value) = ready() {
            return Ok(value);
        }
        if let Some((name, status, log)) = supervisor.exited() {
            return Err(format!(
                "{name} exited ({status}) while waiting for {what}; see {}:\n{}",
                log.display(),
                tail(&log, 20)
            ));
        }
        if Instant::now() >= deadline {
            return Err(format!("{what}: not ready after {} s", timeout.as_secs()));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The last `n` lines of a log file.
pub fn tail(path: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// Starts `local/moto_server.py`; with `lambda_endpoint`, its Lambda bridge forwards invokes
/// there. Returns the server's endpoint URL.
pub fn start_server(
    supervisor: &Supervisor,
    python: &Path,
    root: &Path,
    run_dir: &Path,
    lambda_endpoint: Option<&str>,
) -> Result<String, String> {
    if !python.exists() {
        return Err(format!(
            "no Python with moto at {}: run `bash local/run.sh` (it creates .venv from \
             local/requirements.txt), or pass --python",
            python.display()
        ));
    }
    let port_file = run_dir.join("moto.port");
    let _ = std::fs::remove_file(&port_file);
    let mut command = Command::new(python);
    command
        .arg(root.join("local/moto_server.py"))
        .args(["--port", "0", "--port-file"])
        .arg(&port_file)
        .args(["--parent-pid", &std::process::id().to_string()]);
    if let Some(endpoint) = lambda_endpoint {
        command.args(["--lambda-endpoint", endpoint]);
    }
    supervisor.spawn("moto server", command, &run_dir.join("moto.log"))?;
    let port = wait_for(
        supervisor,
        "the moto server",
        Duration::from_secs(60),
        || {
            std::fs::read_to_string(&port_file)
                .ok()
                .and_then(|p| p.trim().parse::<u16>().ok())
        },
    )?;
    Ok(format!("http://127.0.0.1:{port}"))
}

/// A plain HTTP/1.1 request to the local server; returns (status, body).
pub async fn http(
    endpoint: &str,
    method: &str,
    path: &str,
    body: &str,
) -> Result<(u16, String), String> {
    http_with_headers(endpoint, method, path, body)
        .await
        .map(|(status, _, body)| (status, body))
}

/// A plain HTTP/1.1 request; returns (status, headers with lower-case names, body).
pub async fn http_with_headers(
    endpoint: &str,
    method: &str,
    path: &str,
    body: &str,
) -> Result<(u16, BTreeMap<String, String>, String), String> {
    let addr = endpoint.trim_start_matches("http://");
    let mut stream = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| format!("{endpoint}: {e}"))?;
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    stream
        .write_all(request.as_bytes())
        .await
        .map_err(|e| format!("{endpoint}{path}: {e}"))?;
    let mut response = Vec::new();
    stream
        .read_to_end(&mut response)
        .await
        .map_err(|e| format!("{endpoint}{path}: {e}"))?;
    let text = String::from_utf8_lossy(&response).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((text.as_str(), ""));
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("{endpoint}{path}: not an HTTP response"))?;
    let headers: BTreeMap<String, String> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    let body = if headers
        .get("transfer-encoding")
        .is_some_and(|t| t.eq_ignore_ascii_case("chunked"))
    {
        dechunk(body)
    } else {
        body.to_owned()
    };
    Ok((status, headers, body))
}

/// The body of a chunked response.
fn dechunk(mut rest: &str) -> String {
    let mut out = String::new();
    while let Some((size, after)) = rest.split_once("\r\n") {
        let size = usize::from_str_radix(size.split(';').next().unwrap_or("").trim(), 16);
        match size {
            Ok(n) if n > 0 && after.len() >= n => {
                out.push_str(&after[..n]);
                rest = after[n..].trim_start_matches("\r\n");
            }
            _ => break,
        }
    }
    out
}

/// Turns on moto's Step Functions execution mode (real ASL interpretation). Must come before
/// any state machine is created.
pub async fn enable_step_functions_execution(endpoint: &str) -> Result<(), String> {
    let (status, body) = http(
        endpoint,
        "POST",
        "/moto-api/config",
        r#"{"stepfunctions": {"execute_state_machine": true}}"#,
    )
    .await?;
    if !(200..300).contains(&status) {
        return Err(format!(
            "POST /moto-api/config answered {status}: {body}; moto is pinned in \
             local/requirements.txt"
        ));
    }
    Ok(())
}

/// Starts `cargo lambda watch --only-lambda-apis` on 127.0.0.1:`port`: the Lambda invoke API
/// (what the bridge forwards to) and the runtime API our function instances poll. It starts no
/// function itself; [`start_functions`] does, with each function's own environment.
pub fn start_emulator(
    supervisor: &Supervisor,
    cargo_lambda: &Path,
    root: &Path,
    run_dir: &Path,
    port: u16,
) -> Result<(), String> {
    if !cargo_lambda.exists() {
        return Err(format!(
            "no cargo-lambda at {}: run `bash local/run.sh` (it installs the pinned \
             cargo-lambda into .venv), or pass --cargo-lambda",
            cargo_lambda.display()
        ));
    }
    let mut command = Command::new(cargo_lambda);
    command
        .current_dir(root)
        .args(["lambda", "watch", "--only-lambda-apis", "--invoke-address"])
        .arg("127.0.0.1")
        .arg("--invoke-port")
        .arg(port.to_string());
    supervisor.spawn(
        "cargo lambda watch",
        command,
        &run_dir.join("cargo-lambda-watch.log"),
    )?;
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    wait_for(
        supervisor,
        "the Lambda emulator (cargo lambda watch)",
        Duration::from_secs(120),
        || std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(200)).ok(),
    )?;
    Ok(())
}

/// Where the function binaries are: the shared target directory.
pub fn target_dir(root: &Path) -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .map(|p| if p.is_absolute() { p } else { root.join(p) })
        .unwrap_or_else(|| root.join("target"))
}

/// `cargo build` of the function binaries, so that no invoke waits for a compile.
pub fn build_functions(root: &Path, run_dir: &Path, binaries: &[&str]) -> Result<(), String> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let log_path = run_dir.join("cargo-build.log");
    let log = std::fs::File::create(&log_path).map_err(|e| e.to_string())?;
    let mut command = Command::new(cargo);
    command.current_dir(root).args(["build", "--locked"]);
    for binary in binaries {
        command.args(["--bin", binary]);
    }
    let status = command
        .stdout(log.try_clone().map_err(|e| e.to_string())?)
        .stderr(log)
        .status()
        .map_err(|e| format!("cannot run cargo: {e}"))?;
    if !status.success() {
        return Err(format!(
            "cargo build of the Lambda binaries failed ({status}); see {}:\n{}",
            log_path.display(),
            tail(&log_path, 30)
        ));
    }
    Ok(())
}

/// Starts `instances` processes of a function, as Lambda would run them: the template's
/// environment plus the runtime's own variables, and `endpoint` as `AWS_ENDPOINT_URL`.
#[allow(clippy::too_many_arguments)]
pub fn start_functions(
    supervisor: &Supervisor,
    binary_dir: &Path,
    run_dir: &Path,
    function: &Function,
    instances: usize,
    emulator_port: u16,
    endpoint: &str,
    region: &str,
) -> Result<(), String> {
    let binary = binary_dir.join(&function.binary);
    if !binary.exists() {
        return Err(format!(
            "{} is missing: build it with `cargo build --bin {}`",
            binary.display(),
            function.binary
        ));
    }
    let mut env: BTreeMap<String, String> = function.environment.clone();
    let runtime: [(&str, String); 10] = [
        (
            "AWS_LAMBDA_RUNTIME_API",
            format!("http://127.0.0.1:{emulator_port}/.rt/{}", function.binary),
        ),
        ("AWS_LAMBDA_FUNCTION_NAME", function.name.clone()),
        ("AWS_LAMBDA_FUNCTION_VERSION", "$LATEST".to_owned()),
        (
            "AWS_LAMBDA_FUNCTION_MEMORY_SIZE",
            function.memory_mb.to_string(),
        ),
        ("AWS_REGION", region.to_owned()),
        ("AWS_DEFAULT_REGION", region.to_owned()),
        ("AWS_ACCESS_KEY_ID", ACCESS_KEY.to_owned()),
        ("AWS_SECRET_ACCESS_KEY", SECRET_KEY.to_owned()),
        ("AWS_ENDPOINT_URL", endpoint.to_owned()),
        // No ~/.aws files: only the variables above configure the SDK.
        ("AWS_CONFIG_FILE", "/dev/null".to_owned()),
    ];
    env.extend(runtime.into_iter().map(|(k, v)| (k.to_owned(), v)));
    env.insert(
        "AWS_SHARED_CREDENTIALS_FILE".to_owned(),
        "/dev/null".to_owned(),
    );
    for i in 1..=instances {
        let mut command = Command::new(&binary);
        command.env_clear().envs(&env);
        supervisor.spawn(
            &format!("{} Lambda #{i}", function.binary),
            command,
            &run_dir.join(format!("lambda-{}-{i}.log", function.binary)),
        )?;
    }
    Ok(())
}
