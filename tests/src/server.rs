//! The local server: moto behind the serializing launcher in `local/moto_server.py`.
//!
//! `tests/run.sh` starts one for the whole run and exports `SEMAPHORE_TEST_ENDPOINT`; a plain
//! `cargo test` without it starts one per test binary, which exits with the binary.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use aws_sdk_dynamodb::config::{BehaviorVersion, Credentials, Region, SharedCredentialsProvider};
use aws_sdk_dynamodb::Client;
use semaphore_core::{DynamoStore, Semaphore, SemaphoreItem};

pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ lives in the repository root")
        .to_path_buf()
}

/// The endpoint URL of the local server, starting it on first use.
pub fn endpoint() -> &'static str {
    static SERVER: OnceLock<Server> = OnceLock::new();
    &SERVER
        .get_or_init(|| match std::env::var("SEMAPHORE_TEST_ENDPOINT") {
            Ok(url) if !url.is_empty() => Server {
                url,
                _process: None,
            },
            _ => spawn_server(),
        })
        .url
}

struct Server {
    url: String,
    /// Kept for the life of the test binary; the server exits when its parent does.
    _process: Option<Child>,
}

fn spawn_server() -> Server {
    let root = repo_root();
    let python = std::env::var_os("SEMAPHORE_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join(".venv/bin/python"));
    assert!(
        python.exists(),
        "no Python with moto at {}: run `bash tests/run.sh` once (it creates .venv from \
         local/requirements.txt), or set SEMAPHORE_TEST_ENDPOINT to a running server",
        python.display()
    );
    let dir = root.join("target/local-aws");
    std::fs::create_dir_all(&dir).expect("create target/local-aws");
    let port_file = dir.join(format!("moto-{}.port", std::process::id()));
    let log = std::fs::File::create(dir.join(format!("moto-{}.log", std::process::id())))
        .expect("create the server log");
    let _ = std::fs::remove_file(&port_file);
    let mut process = Command::new(&python)
        .arg(root.join("local/moto_server.py"))
        .args(["--port", "0", "--port-file"])
        .arg(&port_file)
        .args(["--parent-pid", &std::process::id().to_string()])
        .stdout(log.try_clone().expect("log handle"))
        .stderr(log)
        .stdin(Stdio::null())
        .spawn()
        .expect("start local/moto_server.py");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Ok(port) = std::fs::read_to_string(&port_file) {
            return Server {
                url: format!("http://127.0.0.1:{}", port.trim()),
                _process: Some(process),
            };
        }
        let exited = process.try_wait().ok().flatten().is_some();
        if exited || Instant::now() >= deadline {
            let _ = process.kill();
            let _ = process.wait();
            panic!("the local server did not start within 60 s; see target/local-aws/moto-*.log");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A DynamoDB client for `endpoint_url` with dummy credentials: nothing here reaches AWS.
pub fn client_for(endpoint_url: &str) -> Client {
    let config = aws_sdk_dynamodb::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new("us-east-1"))
        .credentials_provider(Credentials::new("testing", "testing", None, None, "tests"))
        .endpoint_url(endpoint_url)
        .build();
    Client::from_conf(config)
}

/// An SDK configuration for the local server (dummy credentials, region us-east-1), to build
/// any other SDK client from, e.g. `aws_sdk_sfn::Client::new(&sdk_config())`.
pub fn sdk_config() -> aws_config::SdkConfig {
    aws_config::SdkConfig::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new("us-east-1"))
        .credentials_provider(SharedCredentialsProvider::new(Credentials::new(
            "testing", "testing", None, None, "tests",
        )))
        .endpoint_url(endpoint())
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
