//! The local server: moto behind the serializing launcher in `local/moto_server.py`, started one
//! way ([`LocalAws::start`]) by everything that needs it: the tests and the bench ([`endpoint`]),
//! the local run (with its Lambda bridge), and the scripts (the `local-aws` binary).
//!
//! `tests/run.sh` starts one for the whole run and exports `SEMAPHORE_TEST_ENDPOINT`; a plain
//! `cargo test` without it starts one per test binary, which exits with the binary.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use aws_sdk_dynamodb::config::{BehaviorVersion, Credentials, Region, SharedCredentialsProvider};
use aws_sdk_dynamodb::error::DisplayErrorContext;
use aws_sdk_dynamodb::Client;
use semaphore_core::{DynamoStore, Semaphore, SemaphoreItem};

use crate::Error;

/// Dummy credentials and the region of everything local: nothing here reaches AWS.
pub const ACCESS_KEY: &str = "testing";
pub const SECRET_KEY: &str = "testing";
pub const REGION: &str = "us-east-1";

/// How long moto may take to listen (its imports alone take seconds on a busy machine).
const START_TIMEOUT: Duration = Duration::from_secs(60);

pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .expect("harness/local-aws lives two levels below the repository root")
}

/// How to start the server.
#[derive(Debug, Clone)]
pub struct Options {
    /// The Python with the pinned moto.
    pub python: PathBuf,
    /// Where its port file and log go.
    pub dir: PathBuf,
    /// The server exits once this process is gone (a test binary cannot run destructors on
    /// exit; a script's shell has none).
    pub parent_pid: u32,
    /// Lambda invokes go to this emulator instead of moto (the local run's bridge).
    pub lambda_endpoint: Option<String>,
}

impl Options {
    /// The repository's `.venv` (or `SEMAPHORE_PYTHON`), files in `target/local-aws`, and this
    /// process as the parent.
    pub fn new() -> Self {
        let root = repo_root();
        Self {
            python: std::env::var_os("SEMAPHORE_PYTHON")
                .map(PathBuf::from)
                .unwrap_or_else(|| root.join(".venv/bin/python")),
            dir: target_dir(&root).join("local-aws"),
            parent_pid: std::process::id(),
            lambda_endpoint: None,
        }
    }
}

impl Default for Options {
    fn default() -> Self {
        Self::new()
    }
}

/// The shared target directory (`CARGO_TARGET_DIR`, else `<root>/target`).
pub fn target_dir(root: &Path) -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .map(|p| if p.is_absolute() { p } else { root.join(p) })
        .unwrap_or_else(|| root.join("target"))
}

/// A running server. Dropping it does not stop it: it stops when its parent process is gone
/// (or when whoever took [`LocalAws::into_process`] stops it).
pub struct LocalAws {
    endpoint: String,
    process: Child,
    log: PathBuf,
}

impl LocalAws {
    /// Starts `local/moto_server.py` on a free port of 127.0.0.1 and waits until it listens
    /// (it writes its port to a file once it does), in a process group of its own.
    pub fn start(options: &Options) -> Result<Self, Error> {
        static STARTED: AtomicU32 = AtomicU32::new(0);
        if !options.python.exists() {
            return Err(Error::Missing {
                path: options.python.clone(),
                fix: "a Python with moto: run `bash tests/run.sh` or `bash local/run.sh` once \
                      (they create .venv from local/requirements.txt), or name another with \
                      SEMAPHORE_PYTHON"
                    .to_owned(),
            });
        }
        std::fs::create_dir_all(&options.dir)
            .map_err(Error::io(format!("create {}", options.dir.display())))?;
        let name = format!(
            "moto-{}-{}",
            std::process::id(),
            STARTED.fetch_add(1, Ordering::SeqCst)
        );
        let port_file = options.dir.join(format!("{name}.port"));
        let log = options.dir.join(format!("{name}.log"));
        let _ = std::fs::remove_file(&port_file);
        let out =
            std::fs::File::create(&log).map_err(Error::io(format!("create {}", log.display())))?;
        let err = out
            .try_clone()
            .map_err(Error::io(format!("open {}", log.display())))?;
        let mut command = Command::new(&options.python);
        command
            .arg(repo_root().join("local/moto_server.py"))
            .args(["--port", "0", "--port-file"])
            .arg(&port_file)
            .args(["--parent-pid", &options.parent_pid.to_string()]);
        if let Some(lambda) = &options.lambda_endpoint {
            command.args(["--lambda-endpoint", lambda]);
        }
        {
            use std::os::unix::process::CommandExt;
            // Its own group: a terminal's Ctrl-C goes to the parent, which the server watches.
            command.process_group(0);
        }
        let mut process = command
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .map_err(Error::io(format!("start {}", options.python.display())))?;
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            let port = std::fs::read_to_string(&port_file)
                .ok()
                .and_then(|p| p.trim().parse::<u16>().ok());
            if let Some(port) = port {
                return Ok(Self {
                    endpoint: format!("http://127.0.0.1:{port}"),
                    process,
                    log,
                });
            }
            if let Ok(Some(status)) = process.try_wait() {
                let tail = tail(&log, 20);
                return Err(Error::Exited {
                    what: "the local server (not yet listening)".to_owned(),
                    status: status.to_string(),
                    log,
                    tail,
                });
            }
            if Instant::now() >= deadline {
                let _ = process.kill();
                let _ = process.wait();
                return Err(Error::Timeout {
                    what: format!("the local server to listen; see {}", log.display()),
                    after: START_TIMEOUT,
                });
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// `http://127.0.0.1:PORT`.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    pub fn log(&self) -> &Path {
        &self.log
    }

    /// The server's process, for a supervisor that stops it (the process leads its group).
    pub fn into_process(self) -> Child {
        self.process
    }
}

/// The last `n` lines of a log file.
pub fn tail(path: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// The endpoint URL of the tests' local server: `SEMAPHORE_TEST_ENDPOINT`, or one started on
/// first use for this process.
pub fn endpoint() -> &'static str {
    static ENDPOINT: OnceLock<String> = OnceLock::new();
    ENDPOINT.get_or_init(|| match std::env::var("SEMAPHORE_TEST_ENDPOINT") {
        Ok(url) if !url.is_empty() => url,
        _ => LocalAws::start(&Options::new())
            .unwrap_or_else(|e| panic!("{}", DisplayErrorContext(e)))
            .endpoint
            .clone(),
    })
}

/// A DynamoDB client for `endpoint_url` with dummy credentials: nothing here reaches AWS.
pub fn client_for(endpoint_url: &str) -> Client {
    Client::new(&sdk_config_for(endpoint_url, REGION))
}

/// An SDK configuration for the tests' local server, to build any other SDK client from, e.g.
/// `aws_sdk_sfn::Client::new(&sdk_config())`.
pub fn sdk_config() -> aws_config::SdkConfig {
    sdk_config_for(endpoint(), REGION)
}

/// An SDK configuration for the local server at `endpoint_url`: dummy credentials, `region`.
pub fn sdk_config_for(endpoint_url: &str, region: &str) -> aws_config::SdkConfig {
    aws_config::SdkConfig::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new(region.to_owned()))
        .credentials_provider(SharedCredentialsProvider::new(Credentials::new(
            ACCESS_KEY,
            SECRET_KEY,
            None,
            None,
            "local-aws",
        )))
        .endpoint_url(endpoint_url)
        .build()
}

/// A new, empty table with the product's schema, so tests running side by side share nothing.
pub async fn fresh_table() -> DynamoStore {
    let name = format!("semaphore-test-{:016x}", fastrand::u64(..));
    let store = DynamoStore::new(client_for(endpoint()), name);
    store.create_table().await.expect("create the test table");
    store
}

/// Every item of the semaphore's table, each read with the product's decoder (a test that must
/// not share the decoder reads `observe::raw_item`).
pub async fn all_items(sem: &Semaphore<DynamoStore>) -> Vec<SemaphoreItem> {
    sem.list()
        .await
        .expect("list the table")
        .into_iter()
        .map(|item| item.expect("an item of this version"))
        .collect()
}
