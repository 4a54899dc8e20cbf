//! The Lambda side of the local AWS: `cargo lambda watch` as the Lambda control plane, and our
//! Lambda binaries as its function instances, whose invokes the server's Lambda bridge
//! ([`crate::server::LocalAws`]) forwards to it. Everything listens on 127.0.0.1.

use std::collections::BTreeMap;
use std::net::{SocketAddr, TcpListener};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::server::{tail, ACCESS_KEY, SECRET_KEY};

use crate::procs::Supervisor;
use crate::stack::Function;
use crate::Error;

/// The stand-in for a user's Lambda function run as the work (WorkFunctionPrefix): this crate's
/// `stand-in-work` binary, a `lambda_runtime` function that waits its event's `work_seconds`.
/// Named after its binary: the emulator routes invokes only to names of the workspace's binaries.
pub const WORK_FUNCTION: &str = "stand-in-work";

/// A free TCP port on 127.0.0.1 (for tools that cannot report the port they picked).
pub fn free_port() -> Result<u16, Error> {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(Error::io("find a free port on 127.0.0.1"))
}

fn wait_for<T>(
    supervisor: &Supervisor,
    what: &str,
    timeout: Duration,
    mut ready: impl FnMut() -> Option<T>,
) -> Result<T, Error> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(value) = ready() {
            return Ok(value);
        }
        if let Some((name, status, log)) = supervisor.exited() {
            return Err(Error::Exited {
                what: format!("{name} (while waiting for {what})"),
                status,
                tail: tail(&log, 20),
                log,
            });
        }
        if Instant::now() >= deadline {
            return Err(Error::Timeout {
                what: what.to_owned(),
                after: timeout,
            });
        }
        std::thread::sleep(Duration::from_millis(100));
    }
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
) -> Result<(), Error> {
    if !cargo_lambda.exists() {
        return Err(Error::Missing {
            path: cargo_lambda.to_owned(),
            fix: "run `bash local/run.sh` (it installs the pinned cargo-lambda into .venv), or \
                  pass --cargo-lambda"
                .to_owned(),
        });
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
        "the Lambda emulator (cargo lambda watch) to listen",
        Duration::from_secs(120),
        || std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(200)).ok(),
    )?;
    Ok(())
}

/// `cargo build` of the function binaries, so that no invoke waits for a compile.
pub fn build_functions(root: &Path, run_dir: &Path, binaries: &[&str]) -> Result<(), Error> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let log_path = run_dir.join("cargo-build.log");
    let create = || Error::io(format!("create {}", log_path.display()));
    let log = std::fs::File::create(&log_path).map_err(create())?;
    let mut command = Command::new(cargo);
    command.current_dir(root).args(["build", "--locked"]);
    for binary in binaries {
        command.args(["--bin", binary]);
    }
    let status = command
        .stdout(log.try_clone().map_err(create())?)
        .stderr(log)
        .status()
        .map_err(Error::io("run cargo"))?;
    if !status.success() {
        return Err(Error::Exited {
            what: "cargo build of the Lambda binaries".to_owned(),
            status: status.to_string(),
            tail: tail(&log_path, 30),
            log: log_path,
        });
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
) -> Result<(), Error> {
    let instance = Instance {
        binary: &function.binary,
        name: &function.name,
        environment: &function.environment,
        memory_mb: function.memory_mb,
        emulator_port,
        endpoint,
        region,
    };
    spawn(supervisor, binary_dir, run_dir, &instance, instances)
}

/// Starts two instances of [`WORK_FUNCTION`] (one invoke at a time each; the run invokes it
/// from one probe).
pub fn start_work_function(
    supervisor: &Supervisor,
    binary_dir: &Path,
    run_dir: &Path,
    emulator_port: u16,
    region: &str,
) -> Result<(), Error> {
    let instance = Instance {
        binary: WORK_FUNCTION,
        name: WORK_FUNCTION,
        environment: &BTreeMap::new(),
        memory_mb: 128,
        emulator_port,
        // It calls no AWS service.
        endpoint: "http://127.0.0.1:9",
        region,
    };
    spawn(supervisor, binary_dir, run_dir, &instance, 2)
}

/// One function's processes: what each is started with.
struct Instance<'a> {
    binary: &'a str,
    /// The deployed function's name (CloudFormation's), which the runtime reports.
    name: &'a str,
    environment: &'a BTreeMap<String, String>,
    memory_mb: u32,
    emulator_port: u16,
    endpoint: &'a str,
    region: &'a str,
}

fn spawn(
    supervisor: &Supervisor,
    binary_dir: &Path,
    run_dir: &Path,
    function: &Instance<'_>,
    instances: usize,
) -> Result<(), Error> {
    let name = function.binary;
    let binary = binary_dir.join(name);
    if !binary.exists() {
        return Err(Error::Missing {
            path: binary,
            fix: format!("build it with `cargo build --bin {name}`"),
        });
    }
    let mut env = function.environment.clone();
    let runtime: [(&str, String); 11] = [
        (
            "AWS_LAMBDA_RUNTIME_API",
            format!("http://127.0.0.1:{}/.rt/{name}", function.emulator_port),
        ),
        ("AWS_LAMBDA_FUNCTION_NAME", function.name.to_owned()),
        ("AWS_LAMBDA_FUNCTION_VERSION", "$LATEST".to_owned()),
        (
            "AWS_LAMBDA_FUNCTION_MEMORY_SIZE",
            function.memory_mb.to_string(),
        ),
        ("AWS_REGION", function.region.to_owned()),
        ("AWS_DEFAULT_REGION", function.region.to_owned()),
        ("AWS_ACCESS_KEY_ID", ACCESS_KEY.to_owned()),
        ("AWS_SECRET_ACCESS_KEY", SECRET_KEY.to_owned()),
        ("AWS_ENDPOINT_URL", function.endpoint.to_owned()),
        // No ~/.aws files: only the variables above configure the SDK.
        ("AWS_CONFIG_FILE", "/dev/null".to_owned()),
        ("AWS_SHARED_CREDENTIALS_FILE", "/dev/null".to_owned()),
    ];
    env.extend(runtime.into_iter().map(|(k, v)| (k.to_owned(), v)));
    for i in 1..=instances {
        let mut command = Command::new(&binary);
        command.env_clear().envs(&env);
        supervisor.spawn(
            &format!("{name} Lambda #{i}"),
            command,
            &run_dir.join(format!("lambda-{name}-{i}.log")),
        )?;
    }
    Ok(())
}

/// Lines of the logs of `binary`'s instances in `run_dir` (where [`start_functions`] writes
/// them) that `matches`.
pub fn log_lines(run_dir: &Path, binary: &str, matches: impl Fn(&str) -> bool) -> usize {
    let Ok(entries) = std::fs::read_dir(run_dir) else {
        return 0;
    };
    let prefix = format!("lambda-{binary}-");
    entries
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
        .map(|e| {
            let text = std::fs::read_to_string(e.path()).unwrap_or_default();
            text.lines().filter(|l| matches(l)).count()
        })
        .sum()
}
