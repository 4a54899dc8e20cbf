//! `semctl`: inspect and operate a semaphore table by hand.
//!
//! Output is JSON on stdout. Exit status: 0 done, 2 the lock is full or its start rate is spent,
//! 3 fenced (this acquisition was released or its execution cleaned up), 4 expired (asked longer
//! ago than the acquire horizon: nothing taken, run it again), 1 any error (message on stderr;
//! nothing written on bad input). `top` draws a live view on the terminal instead.
//!
//! `list`, `sweep` and `release --all-of` without `--lock` go over the whole table: an item they
//! cannot read (of another format, say) is named in their output and on stderr with exit 1, and
//! the other locks are done anyway, so that a script notices and one bad item never hides the
//! rest from an operator.

mod top;

use std::process::ExitCode;
use std::time::Duration;

use aws_config::{BehaviorVersion, SdkConfig};
use clap::{Parser, Subcommand};
use lambda_common::HandOffs;
use lambda_sweeper::{ArnPatterns, ExecutionArn, SfnExecutions, StateMachineArn};
use semaphore_core::{
    rfc3339_millis, terms_on, AcquireOutcome, AcquisitionId, Claim, CleanupOutcome, Clock,
    DynamoStore, FencingToken, HeartbeatOutcome, HolderId, Identity, InputError, Layout, Lease,
    Limit, LockConfig, LockName, Rate, Reclaimed, ReleaseOutcome, Run, Semaphore, SemaphoreItem,
    StoreError, SystemClock, TableSetup, Terms, Timing, Weight,
};
use serde_json::{json, Value};

#[derive(Parser)]
#[command(
    version,
    about = "Operate a Step Functions semaphore table in DynamoDB"
)]
struct Cli {
    /// AWS endpoint (DynamoDB, and Step Functions for `sweep`), e.g. a local server (default:
    /// AWS, or AWS_ENDPOINT_URL).
    #[arg(long, global = true)]
    endpoint_url: Option<String>,
    /// AWS region (default: the usual AWS environment and profile).
    #[arg(long, global = true)]
    region: Option<String>,
    /// The semaphore table.
    #[arg(long, global = true, env = "TABLE_NAME", default_value = "semaphores")]
    table: String,
    /// The waiters' table (the stack's QueueTable output; default: TABLE-queue, what
    /// `semctl init` creates).
    #[arg(long, global = true, env = "QUEUE_TABLE_NAME")]
    queue_table: Option<String>,
    /// The gates' holdings table (the stack's HoldingsTable output; default: TABLE-holdings,
    /// what `semctl init` creates).
    #[arg(long, global = true, env = "HOLDINGS_TABLE_NAME")]
    holdings_table: Option<String>,
    /// How long after its request an acquire may still land (whole seconds, 1-300); the
    /// deployed functions' AcquireHorizonSeconds. With the clock skew it makes the fence window.
    #[arg(long, global = true, env = "ACQUIRE_HORIZON_SECONDS", value_name = "SECONDS",
          allow_hyphen_values = true, default_value_t = Timing::DEFAULT_HORIZON.as_secs(),
          value_parser = |text: &str| seconds_in(text, Timing::HORIZON_RANGE))]
    horizon_seconds: u64,
    /// How far apart hosts' clocks may be (whole seconds, 1-60); the deployed functions'
    /// ClockSkewSeconds.
    #[arg(long, global = true, env = "CLOCK_SKEW_SECONDS", value_name = "SECONDS",
          allow_hyphen_values = true, default_value_t = Timing::DEFAULT_CLOCK_SKEW.as_secs(),
          value_parser = |text: &str| seconds_in(text, Timing::CLOCK_SKEW_RANGE))]
    clock_skew_seconds: u64,
    /// Attempts of each request to AWS before semctl gives up (1-20), with exponential backoff
    /// and jitter between them, capped at 5 s: throttles and lost answers are retried, as AWS
    /// advises for DynamoDB (the SDK's own default is 3). 1 fails fast.
    #[arg(long, global = true, env = "SEMCTL_MAX_ATTEMPTS", value_name = "N",
          default_value_t = semaphore_core::dynamo::HOLDER_ATTEMPTS,
          value_parser = clap::value_parser!(u32).range(1..=20))]
    max_attempts: u32,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Create the table (partition key `lock`, on-demand) unless it exists.
    Init,
    /// One attempt to take a slot, requested when semctl started. Exit 0 acquired or already
    /// held, 2 full (the weight does not fit, or others wait in line) or rate limited (the
    /// answer's next_start_at says when the next start may be), 3 fenced, 4 expired.
    Acquire {
        #[arg(long)]
        lock: String,
        #[arg(long)]
        holder: String,
        /// Positive whole number: the most weight held at once.
        #[arg(long, allow_hyphen_values = true)]
        limit: String,
        #[arg(long, default_value = AcquisitionId::DEFAULT)]
        acquisition: String,
        /// How many of the limit's units this acquisition takes: a whole number from 1 to the
        /// limit.
        #[arg(long, allow_hyphen_values = true, default_value = "1")]
        weight: String,
        /// At most this many acquisitions of the lock start per second (a number, e.g. 2 or
        /// 0.5, from one a day to 1000). Default: no start rate.
        #[arg(long, allow_hyphen_values = true)]
        rate: Option<String>,
        /// Hold the slot under a lease of this many seconds (1 to 86400), renewed by
        /// `heartbeat`: once it passes unrenewed (by more than the clock skew), the slot is
        /// taken back and this acquisition fenced (F13). Default: held until released.
        #[arg(long, allow_hyphen_values = true, value_name = "SECONDS")]
        lease: Option<String>,
    },
    /// Renew the lease of a slot taken with `acquire --lease`. Exit 0 renewed (the answer says
    /// until when), 3 taken back (or released, or cleaned up): the acquisition is fenced and
    /// its holder must stop; a new acquire needs a new acquisition id. 5: the acquisition holds
    /// its slot under another token than --token; nothing was renewed.
    Heartbeat {
        #[arg(long)]
        lock: String,
        #[arg(long)]
        holder: String,
        #[arg(long, default_value = AcquisitionId::DEFAULT)]
        acquisition: String,
        /// The fencing token the acquire answered: the heartbeat renews only the slot taken
        /// under it (F15). Without it the heartbeat acts as the operator: it renews whatever
        /// slot the acquisition holds (one read more), and its answer says so.
        #[arg(long, allow_hyphen_values = true)]
        token: Option<String>,
        /// The weight its acquire took (with --token; a wrong one costs a write more).
        #[arg(long, allow_hyphen_values = true, requires = "token")]
        weight: Option<String>,
        /// The lease from now, in seconds (1 to 86400).
        #[arg(
            long,
            allow_hyphen_values = true,
            value_name = "SECONDS",
            default_value = "60"
        )]
        lease: String,
    },
    /// Free the slot of one acquisition (a no-op, exit 0, when nothing is held). With --token,
    /// only the slot taken under that token: exit 5, nothing written, when the acquisition holds
    /// one under another token. With --all-of EXECUTION, for an execution that ended without
    /// its cleanup: fence it and free every slot it holds, on --lock or on every lock that
    /// holds it, and print what was freed on each.
    Release {
        /// The lock. With --all-of, only this lock; without it, every lock that holds the
        /// execution now (found by a scan of the table; a lock it holds nothing on is not
        /// fenced, and an acquire of it still in flight to one is the sweeper's).
        #[arg(long, required_unless_present = "all_of")]
        lock: Option<String>,
        /// The holder of the slot (required without --all-of).
        #[arg(long, required_unless_present = "all_of", conflicts_with = "all_of")]
        holder: Option<String>,
        /// The holder's acquisition whose slot is freed.
        #[arg(long, default_value = AcquisitionId::DEFAULT, conflicts_with = "all_of")]
        acquisition: String,
        /// The fencing token the acquire answered: the release frees only the slot taken under
        /// it (F15), in one write. Without it the release acts as the operator: it reads the
        /// slot and frees whatever the acquisition holds (or fences it if it holds nothing), and
        /// its answer says so.
        #[arg(long, allow_hyphen_values = true, conflicts_with = "all_of")]
        token: Option<String>,
        /// The weight its acquire took (with --token): then the release is one write. A wrong
        /// one costs a write more, never the wrong slot.
        #[arg(
            long,
            allow_hyphen_values = true,
            conflicts_with = "all_of",
            requires = "token"
        )]
        weight: Option<String>,
        /// The ARN of an execution that ended without its cleanup
        /// (arn:...:execution:MACHINE:NAME). Step Functions is not asked whether it has
        /// ended: freeing the slots of one that still runs lets its work run without them
        /// (`sweep --dry-run` shows what the sweeper judges ended). For a holder that is not
        /// an execution, use `cleanup`.
        #[arg(long, value_name = "EXECUTION")]
        all_of: Option<String>,
    },
    /// A lock's configuration by its operator (F14): its limit, the largest weight one
    /// acquisition may take, and its start rate. An acquisition of a configured lock takes the
    /// configured limit and rate whatever it asks for (one write more the first time a caller
    /// meets the configuration), and a larger weight is refused by name; no caller can raise
    /// them. Lowering the limit evicts nobody: it admits nobody until the weight held is under
    /// it.
    #[command(subcommand)]
    Lock(LockCommand),
    /// What cleanup-from-incomplete does for an ended execution: free all its slots and fence it.
    Cleanup {
        #[arg(long)]
        lock: String,
        #[arg(long)]
        holder: String,
    },
    /// The semaphore as stored: limit, count, used (the sum of the holders' weights), version,
    /// holders (each with its weight; the longest held first, at most --holders of them, the
    /// rest counted in holders_omitted), waiting, the start rate and last start, fences, last
    /// rotation, the fence window, item bytes and write units per write.
    Status {
        #[arg(long)]
        lock: String,
        #[command(flatten)]
        shown: HoldersShown,
    },
    /// Every lock in the table, sorted by name, each as `status` shows it (a JSON array). An
    /// item that cannot be read (of another format, say) is listed with an "error" naming it, the
    /// others as usual, and the exit status is 1.
    List {
        #[command(flatten)]
        shown: HoldersShown,
    },
    /// One sweep now, through the scheduled sweeper's own code: every holder that is a standard
    /// execution (of the --state-machine-arn machines, if given; others are left alone) is
    /// looked up in Step Functions at the same endpoint and region; one that has ended or no
    /// longer exists, and whose work (a child execution) no longer runs, is fenced and its
    /// slots freed; fences due a rotation are rotated. Prints what it reclaimed, holders
    /// checked and errors. Sends no SNS notice and no metric: that is the scheduled sweeper's
    /// job. Exit 1 if the sweep reported errors (a holder it could not check, an item it could
    /// not read); the others are swept all the same.
    Sweep {
        /// Write nothing: print what a sweep would reclaim now (and rotate nothing).
        #[arg(long)]
        dry_run: bool,
        /// Judge only the executions of this state machine (repeat the flag for several; an ARN
        /// ending in * covers every machine whose ARN begins so); the deployed sweeper's
        /// PROTECTED_STATE_MACHINES. Default: every execution.
        #[arg(long = "state-machine-arn", value_name = "ARN")]
        state_machine_arns: Vec<String>,
    },
    /// A live view of every lock in the table, refreshed every --interval: the weight used
    /// against the limit as a bar, the holders (the longest held first) with their weight and
    /// age, the line's length and its oldest waiter's age, and the start rate ("set": the rate
    /// the lock's last acquisition set; "seen": acquisitions seen in the last 10 s, a lower
    /// bound). q, Esc or Ctrl-C quits; the arrows scroll. Each refresh is one eventually
    /// consistent Scan of the table (a view needs no more; a stale page is caught up by the next
    /// refresh) and, per lock with waiters, a Query of its line's head.
    Top(top::Options),
}

const EXIT_ERROR: u8 = 1;
const EXIT_FULL: u8 = 2;
const EXIT_FENCED: u8 = 3;
const EXIT_EXPIRED: u8 = 4;
const EXIT_WRONG_TOKEN: u8 = 5;

/// What a release or heartbeat shows of its slot: `--token` (and `--weight`), else the
/// operator's claim.
fn claim(token: Option<&str>, weight: Option<&str>) -> Result<Claim, InputError> {
    let Some(token) = token else {
        return Ok(Claim::Operator);
    };
    let invalid = || InputError::InvalidToken {
        got: format!("{token:?}"),
    };
    let token = FencingToken::new(token.trim().parse::<u64>().map_err(|_| invalid())?)?;
    let weight = weight.map(Weight::parse).transpose()?.unwrap_or_default();
    Ok(Claim::Slot { token, weight })
}

/// Who a release or heartbeat acted as, for its answer.
fn acting_as(claim: Claim) -> Value {
    match claim {
        Claim::Slot { token, .. } => json!({"as": "holder", "shown_token": token.0}),
        Claim::Operator => json!({
            "as": "operator",
            "note": "no --token: acted on whatever slot the acquisition holds, as its operator"
        }),
    }
}

/// Whole seconds within `range`, for a flag or its environment variable.
fn seconds_in(text: &str, range: std::ops::RangeInclusive<u64>) -> Result<u64, String> {
    text.trim()
        .parse::<u64>()
        .ok()
        .filter(|secs| range.contains(secs))
        .ok_or_else(|| {
            format!(
                "expected whole seconds from {} to {}",
                range.start(),
                range.end()
            )
        })
}

/// Why a command did not run (exit 1, nothing on stdout).
#[derive(Debug, thiserror::Error)]
enum Failure {
    #[error(transparent)]
    Input(#[from] InputError),
    /// A flag whose value is not what it must be; the message names the flag.
    #[error("{flag}: {problem}")]
    Argument { flag: &'static str, problem: String },
    #[error("no AWS region: pass --region or set AWS_REGION")]
    NoRegion,
    #[error("cannot start the async runtime: {0}")]
    Runtime(std::io::Error),
    #[error(transparent)]
    Semaphore(#[from] semaphore_core::Error),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Top(#[from] top::TopError),
    #[error("lock {lock:?}: its configuration changed under this acquire three times over; nothing was taken: run it again once its operator is done")]
    Changing { lock: String },
}

/// What a command printed, and its exit status.
struct Answer {
    /// JSON for stdout; `None` for `top`, which printed its own.
    output: Option<Value>,
    code: u8,
    /// Why the status is not 0 although there is an answer (items that could not be read,
    /// errors of a sweep): said on stderr.
    problem: Option<String>,
}

impl Answer {
    fn done(output: Value) -> Self {
        Self::exit(output, 0)
    }

    fn exit(output: Value, code: u8) -> Self {
        Self {
            output: Some(output),
            code,
            problem: None,
        }
    }

    /// Nothing more to print: exit 0, or 1 with `problem` on stderr.
    fn printed(problem: Option<String>) -> Self {
        Self {
            output: None,
            code: if problem.is_some() { EXIT_ERROR } else { 0 },
            problem,
        }
    }

    /// Exit 1 with `problem` on stderr if there are `errors`, else 0.
    fn unless_errors(output: Value, errors: &[String], what: &str) -> Self {
        if errors.is_empty() {
            return Self::done(output);
        }
        Self {
            output: Some(output),
            code: EXIT_ERROR,
            problem: Some(format!(
                "{what} ({} listed in the output): {}",
                errors.len(),
                errors.join("; ")
            )),
        }
    }
}

fn main() -> ExitCode {
    // The acquire's request time: when the operator asked, before anything else ran. A fence
    // written after this moment is one the acquire must meet (see `Timing`).
    let requested_at_ms = SystemClock.now_ms();
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) if !e.use_stderr() => {
            // --help and --version.
            let _ = e.print();
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            // clap exits 2 on a usage error, which here means "full"; report it as an error.
            let _ = e.print();
            return ExitCode::FAILURE;
        }
    };
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("SEMCTL_LOG")
                .unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let max_attempts = cli.max_attempts;
    let answer = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(Failure::Runtime)
        .and_then(|runtime| runtime.block_on(run(cli, requested_at_ms)));
    match answer {
        Ok(answer) => {
            if let Some(output) = &answer.output {
                println!(
                    "{}",
                    serde_json::to_string_pretty(output).unwrap_or_default()
                );
            }
            if let Some(problem) = answer.problem {
                eprintln!("semctl: error: {problem}");
            }
            ExitCode::from(answer.code)
        }
        Err(e) => {
            eprintln!("semctl: error: {e}");
            if let Some(undone) = e.left_undone(max_attempts) {
                eprintln!("semctl: {undone}");
            }
            ExitCode::FAILURE
        }
    }
}

impl Failure {
    /// What a failed request may have left undone, for an error of the table (after
    /// `attempts` attempts): bad input never reaches it.
    fn left_undone(&self, attempts: u32) -> Option<String> {
        let store = matches!(
            self,
            Failure::Store(StoreError::Dynamo { .. })
                | Failure::Semaphore(semaphore_core::Error::Store(StoreError::Dynamo { .. }))
        );
        store.then(|| {
            format!(
                "the table did not answer after {attempts} attempts with backoff: the command's \
                 last write may or may not have landed (an acquire may hold a slot, a release or \
                 cleanup may not have freed one). Every command is safe to run again with the \
                 same arguments: it reads its own answer from the lock"
            )
        })
    }
}

async fn run(cli: Cli, requested_at_ms: u64) -> Result<Answer, Failure> {
    // Validate everything before building a client, so bad input never reaches the table.
    let request = Request::parse(cli.command)?;
    // Throttles and lost answers are retried longer than the SDK's three attempts: every
    // command is safe to send again (it reads its own answer from the lock, F10), and a person
    // at a terminal would rather wait a few seconds than retry by hand.
    let mut loader = aws_config::defaults(BehaviorVersion::latest())
        .retry_config(semaphore_core::dynamo::holder_retries(cli.max_attempts));
    if let Some(url) = &cli.endpoint_url {
        loader = loader.endpoint_url(url);
    }
    if let Some(region) = cli.region {
        loader = loader.region(aws_config::Region::new(region));
    }
    let config = loader.load().await;
    if config.region().is_none() {
        return Err(Failure::NoRegion);
    }
    let mut store = DynamoStore::new(aws_sdk_dynamodb::Client::new(&config), &cli.table);
    if let Some(queue_table) = &cli.queue_table {
        store = store.with_queue_table(queue_table);
    }
    if let Some(holdings_table) = &cli.holdings_table {
        store = store.with_holdings_table(holdings_table);
    }
    let semaphore = Semaphore::new(store).with_timing(Timing {
        horizon: Duration::from_secs(cli.horizon_seconds),
        clock_skew: Duration::from_secs(cli.clock_skew_seconds),
    });
    request.execute(&semaphore, &config, requested_at_ms).await
}

#[derive(Subcommand)]
enum LockCommand {
    /// Configure the lock (creating its item if it has none). Prints the configuration and the
    /// lock as it is after; exit 0.
    Set {
        #[arg(long)]
        lock: String,
        /// The most weight held at once: a whole number from 1 to 10000.
        #[arg(long, allow_hyphen_values = true)]
        limit: String,
        /// The largest weight one acquisition may take (1 to the limit). Default: the limit.
        #[arg(long, allow_hyphen_values = true)]
        max_weight: Option<String>,
        /// At most this many acquisitions start per second (e.g. 2 or 0.5, from one a day to
        /// 1000). Default: no start rate.
        #[arg(long, allow_hyphen_values = true)]
        rate: Option<String>,
        /// Where the lock keeps its holders: "item" (all in the lock's one item: the cheapest
        /// for a small limit) or "gate" (each holding an item of its own: a cost per critical
        /// section flat in the limit and the rate). Changed only while the lock is idle:
        /// nothing held, nobody waiting, its fences rotated away. Default: unchanged.
        #[arg(long, value_name = "item|gate")]
        layout: Option<Layout>,
    },
    /// The lock's configuration (null: not configured: each acquisition takes the limit and
    /// rate it asks for), with the limit and rate the last acquisition took, the weight used
    /// and the line's length.
    Show {
        #[arg(long)]
        lock: String,
    },
    /// Remove the configuration: acquisitions take their own terms again.
    Unset {
        #[arg(long)]
        lock: String,
    },
}

/// A command with its inputs validated.
enum Request {
    Init,
    Acquire(LockName, Identity, Terms),
    Heartbeat(LockName, Identity, Claim, Lease),
    /// With the weight to expect (1 unless given; the core finds the real one).
    Release(LockName, Identity, Claim),
    /// Every slot of an execution, on one lock or (`None`) on every lock holding it.
    ReleaseAllOf(HolderId, Option<LockName>),
    Cleanup(LockName, HolderId),
    Status(LockName, usize),
    /// Set (`Some`) or remove (`None`) the lock's configuration.
    Configure(LockName, Option<LockConfig>),
    /// Move the lock to a layout, then configure it.
    Lay(LockName, Layout, LockConfig),
    ShowConfig(LockName),
    List(usize),
    Sweep {
        dry_run: bool,
        state_machines: ArnPatterns,
    },
    Top(top::Options),
}

const EXECUTION_ARN_FORM: &str =
    "arn:<partition>:states:<region>:<account>:execution:<machine>:<name>";
const STATE_MACHINE_ARN_FORM: &str =
    "arn:<partition>:states:<region>:<account>:stateMachine:<name>";

/// The execution `--all-of` names. An execution ARN only: a typo (an execution's name, its
/// machine's ARN) would otherwise fence a holder that never existed and free nothing, silently.
fn execution_holder(text: &str) -> Result<HolderId, Failure> {
    let bad = |problem: String| Failure::Argument {
        flag: "--all-of",
        problem,
    };
    if ExecutionArn::parse(text).is_none() {
        let hint = if StateMachineArn::parse(text).is_some() {
            "that is a state machine's ARN; pass the ARN of one of its executions"
        } else {
            "for a holder that is not an execution, use `semctl cleanup --lock L --holder H`"
        };
        return Err(bad(format!(
            "{text:?} is not an execution ARN ({EXECUTION_ARN_FORM}); {hint}"
        )));
    }
    HolderId::new(text).map_err(|e| bad(e.to_string()))
}

/// The machines of `--state-machine-arn`, each an ARN or the beginning of one followed by `*`.
fn state_machines(texts: &[String]) -> Result<ArnPatterns, Failure> {
    ArnPatterns::parse(&texts.join(","), |arn| {
        StateMachineArn::parse(arn).is_some()
    })
    .map_err(|text| Failure::Argument {
        flag: "--state-machine-arn",
        problem: format!(
            "{text:?} is not a state machine ARN ({STATE_MACHINE_ARN_FORM}) nor the \
                 beginning of one followed by *; leave the flag out to judge every execution"
        ),
    })
}

impl Request {
    fn parse(command: Command) -> Result<Self, Failure> {
        let identity = |holder: &str, acquisition: &str| {
            Ok::<_, InputError>(Identity::new(
                HolderId::new(holder)?,
                AcquisitionId::new(acquisition)?,
            ))
        };
        Ok(match command {
            Command::Init => Self::Init,
            Command::Acquire {
                lock,
                holder,
                limit,
                acquisition,
                weight,
                rate,
                lease,
            } => Self::Acquire(
                LockName::new(lock)?,
                identity(&holder, &acquisition)?,
                Terms::new(
                    Limit::parse(&limit)?,
                    Weight::parse(&weight)?,
                    rate.as_deref().map(Rate::parse).transpose()?,
                )?
                .with_lease(lease.as_deref().map(Lease::parse_seconds).transpose()?),
            ),
            Command::Heartbeat {
                lock,
                holder,
                acquisition,
                token,
                weight,
                lease,
            } => Self::Heartbeat(
                LockName::new(lock)?,
                identity(&holder, &acquisition)?,
                claim(token.as_deref(), weight.as_deref())?,
                Lease::parse_seconds(&lease)?,
            ),
            Command::Release {
                lock,
                all_of: Some(execution),
                ..
            } => Self::ReleaseAllOf(
                execution_holder(&execution)?,
                lock.map(LockName::new).transpose()?,
            ),
            // clap requires both without --all-of; an empty value is the core's error.
            Command::Release {
                lock,
                holder,
                acquisition,
                all_of: None,
                token,
                weight,
            } => Self::Release(
                LockName::new(lock.unwrap_or_default())?,
                identity(&holder.unwrap_or_default(), &acquisition)?,
                claim(token.as_deref(), weight.as_deref())?,
            ),
            Command::Cleanup { lock, holder } => {
                Self::Cleanup(LockName::new(lock)?, HolderId::new(holder)?)
            }
            Command::Status { lock, shown } => Self::Status(LockName::new(lock)?, shown.holders),
            Command::Lock(LockCommand::Set {
                lock,
                limit,
                max_weight,
                rate,
                layout,
            }) => {
                let (lock, config) = (
                    LockName::new(lock)?,
                    LockConfig::new(
                        Limit::parse(&limit)?,
                        max_weight.as_deref().map(Weight::parse).transpose()?,
                        rate.as_deref().map(Rate::parse).transpose()?,
                    )?,
                );
                match layout {
                    Some(layout) => Self::Lay(lock, layout, config),
                    None => Self::Configure(lock, Some(config)),
                }
            }
            Command::Lock(LockCommand::Unset { lock }) => {
                Self::Configure(LockName::new(lock)?, None)
            }
            Command::Lock(LockCommand::Show { lock }) => Self::ShowConfig(LockName::new(lock)?),
            Command::List { shown } => Self::List(shown.holders),
            Command::Top(options) => Self::Top(options),
            Command::Sweep {
                dry_run,
                state_machine_arns,
            } => Self::Sweep {
                dry_run,
                state_machines: state_machines(&state_machine_arns)?,
            },
        })
    }

    async fn execute(
        self,
        semaphore: &Semaphore<DynamoStore>,
        sdk: &SdkConfig,
        requested_at_ms: u64,
    ) -> Result<Answer, Failure> {
        Ok(match self {
            Self::Init => {
                let table = semaphore.store().table();
                let outcome = match semaphore.store().create_table().await? {
                    TableSetup::Created => "created",
                    TableSetup::AlreadyExisted => "already_existed",
                };
                Answer::done(json!({"table": table, "outcome": outcome}))
            }
            Self::Acquire(lock, identity, asked) => {
                let (outcome, seen) = semaphore
                    .acquire_seeing(&lock, &identity, Run::FIRST, asked, requested_at_ms)
                    .await?;
                // On a configured lock, its operator's terms (F14), not the ones asked for.
                let config = seen.as_ref().and_then(|item| item.config);
                let terms = terms_on(config.as_ref(), &lock, asked)?;
                let mut out = json!({
                    "lock": lock.as_str(),
                    "holder": identity.holder.as_str(),
                    "acquisition": identity.acquisition.as_str(),
                    "limit": terms.limit.get(),
                    "weight": terms.weight.get(),
                    "rate": terms.rate.map(Rate::as_per_second),
                    "configured": config.is_some(),
                    // F13: when the slot's lease ends (null: none, or nothing held).
                    "lease_until": seen
                        .as_ref()
                        .and_then(|item| item.leases.get(&identity))
                        .map(|until| rfc3339_millis(*until)),
                });
                let (fields, code) = match outcome {
                    AcquireOutcome::Acquired { token, count } => (
                        json!({"outcome": "acquired", "token": token.0, "count": count}),
                        0,
                    ),
                    AcquireOutcome::AlreadyHeld { token, count } => (
                        json!({"outcome": "already_held", "token": token.0, "count": count}),
                        0,
                    ),
                    AcquireOutcome::Full { count, used, limit } => (
                        json!({
                            "outcome": "full",
                            "count": count,
                            "used": used,
                            "message": format!(
                                "{used} of {limit} held, or others wait in line: weight {} \
                                 does not fit now; nothing was taken",
                                terms.weight
                            ),
                        }),
                        EXIT_FULL,
                    ),
                    AcquireOutcome::RateLimited { next_start_ms } => (
                        json!({
                            "outcome": "rate_limited",
                            "next_start_at": rfc3339_millis(next_start_ms),
                            "next_start_at_ms": next_start_ms,
                            "message": format!(
                                "the start rate{} is spent: the next acquisition may start at \
                                 {} (in {} ms); nothing was taken",
                                terms.rate.map_or(String::new(), |rate| format!(" ({rate})")),
                                rfc3339_millis(next_start_ms),
                                next_start_ms.saturating_sub(semaphore.now_ms())
                            ),
                        }),
                        EXIT_FULL,
                    ),
                    AcquireOutcome::Fenced(reason) => (
                        json!({"outcome": "fenced", "reason": reason.describe()}),
                        EXIT_FENCED,
                    ),
                    AcquireOutcome::Configured(_) => {
                        return Err(Failure::Changing {
                            lock: lock.to_string(),
                        })
                    }
                    AcquireOutcome::Expired => (
                        json!({
                            "outcome": "expired",
                            "message": format!(
                                "the request is older than the acquire horizon ({} s) and the \
                                 fences rotated since: nothing was taken; run the command again",
                                semaphore.timing().horizon.as_secs()
                            ),
                        }),
                        EXIT_EXPIRED,
                    ),
                };
                merge(&mut out, fields);
                Answer::exit(out, code)
            }
            Self::Release(lock, identity, claim) => {
                // A wrong weight costs one write more: the core finds the slot's own.
                let (outcome, after) = semaphore.release_seeing(&lock, &identity, claim).await?;
                let waiting = after.waiting;
                let used = after.used;
                // Someone waits in line: the freed slot goes to the head, as a release by the
                // state machine hands it on (nobody waiting: no request).
                let sfn = aws_sdk_sfn::Client::new(sdk);
                let handed_off = HandOffs::new(
                    sfn.clone(),
                    SfnExecutions::of_machines(sfn, ArnPatterns::default()),
                )
                .run(semaphore, &lock, Some(after))
                .await
                .woken
                .len();
                let mut out = json!({
                    "lock": lock.as_str(),
                    "holder": identity.holder.as_str(),
                    "acquisition": identity.acquisition.as_str(),
                    "waiting": waiting,
                    // The sum of the weights held after the release (before any hand-off).
                    "used": used,
                    "handed_off": handed_off,
                });
                merge(
                    &mut out,
                    match outcome {
                        ReleaseOutcome::Released { token, count, .. } => {
                            json!({"outcome": "released", "token": token.map(|t| t.0), "count": count})
                        }
                        ReleaseOutcome::NotHeld { count, .. } => json!({
                            "outcome": "not_held",
                            "count": count,
                            "message": format!("{} held nothing on {lock}; nothing to release", identity.slot_key()),
                        }),
                        ReleaseOutcome::WrongToken { held, count, .. } => {
                            merge(&mut out, acting_as(claim));
                            merge(
                                &mut out,
                                json!({
                                    "outcome": "wrong_token",
                                    "held_token": held.0,
                                    "count": count,
                                    "message": format!(
                                        "{} holds its slot on {lock} under token {}, not the one \
                                         shown: nothing was released; pass the token its \
                                         acquire answered",
                                        identity.slot_key(),
                                        held.0
                                    ),
                                }),
                            );
                            return Ok(Answer::exit(out, EXIT_WRONG_TOKEN));
                        }
                    },
                );
                merge(&mut out, acting_as(claim));
                Answer::done(out)
            }
            Self::ReleaseAllOf(holder, Some(lock)) => {
                // One lock, named: the same as `cleanup`, also when it holds nothing there (the
                // fence still stops a late acquire of it).
                let outcome = semaphore.cleanup(&lock, &holder).await?;
                let cleaned = cleaned_json(&lock, &outcome, semaphore.now_ms());
                Answer::done(json!({
                    "holder": holder.as_str(),
                    "outcome": "cleaned",
                    "locks": [cleaned],
                    "errors": [],
                }))
            }
            Self::ReleaseAllOf(holder, None) => release_everywhere(semaphore, &holder).await?,
            Self::Cleanup(lock, holder) => {
                let outcome = semaphore.cleanup(&lock, &holder).await?;
                let mut out = cleaned_json(&lock, &outcome, semaphore.now_ms());
                merge(
                    &mut out,
                    json!({"holder": holder.as_str(), "outcome": "cleaned"}),
                );
                Answer::done(out)
            }
            Self::Heartbeat(lock, identity, claim, lease) => {
                let outcome = semaphore.heartbeat(&lock, &identity, claim, lease).await?;
                let mut out = json!({
                    "lock": lock.as_str(),
                    "holder": identity.holder.as_str(),
                    "acquisition": identity.acquisition.as_str(),
                });
                merge(&mut out, acting_as(claim));
                match outcome {
                    HeartbeatOutcome::Renewed { until_ms } => {
                        merge(
                            &mut out,
                            json!({"outcome": "renewed", "lease_until": rfc3339_millis(until_ms), "lease_until_ms": until_ms}),
                        );
                        Answer::done(out)
                    }
                    HeartbeatOutcome::Lost => {
                        merge(
                            &mut out,
                            json!({
                                "outcome": "lost",
                                "message": "the slot is not held any more (its lease passed and it \
                                            was taken back, or it was released or cleaned up): \
                                            stop using it; a new acquire needs a new acquisition id",
                            }),
                        );
                        Answer::exit(out, EXIT_FENCED)
                    }
                    HeartbeatOutcome::WrongToken { held } => {
                        merge(
                            &mut out,
                            json!({
                                "outcome": "wrong_token",
                                "held_token": held.0,
                                "message": "the acquisition holds its slot under another token \
                                            than --token: nothing was renewed",
                            }),
                        );
                        Answer::exit(out, EXIT_WRONG_TOKEN)
                    }
                }
            }
            Self::Configure(lock, config) => {
                let item = semaphore.configure(&lock, config).await?;
                Answer::done(config_json(&lock, Some(&item)))
            }
            Self::Lay(lock, layout, config) => {
                semaphore.set_layout(&lock, layout).await?;
                let item = semaphore.configure(&lock, Some(config)).await?;
                Answer::done(config_json(&lock, Some(&item)))
            }
            Self::ShowConfig(lock) => {
                let item = match semaphore.status(&lock).await {
                    Ok(item) => Some(item),
                    Err(semaphore_core::Error::UnknownLock { .. }) => None,
                    Err(e) => return Err(e.into()),
                };
                Answer::done(config_json(&lock, item.as_ref()))
            }
            Self::Status(lock, shown) => {
                let item = semaphore.status(&lock).await?;
                Answer::done(status_json(
                    &item,
                    semaphore.now_ms(),
                    &semaphore.timing(),
                    shown,
                ))
            }
            Self::List(shown) => list(semaphore, shown).await?,
            Self::Top(options) => Answer::printed(top::run(semaphore, &options).await?),
            Self::Sweep {
                dry_run,
                state_machines,
            } => {
                let executions =
                    SfnExecutions::of_machines(aws_sdk_sfn::Client::new(sdk), state_machines);
                sweep(semaphore, &executions, dry_run).await?
            }
        })
    }
}

/// The lock an item that could not be read belongs to, when the error knows it.
fn unreadable_lock(e: &StoreError) -> Option<&str> {
    match e {
        StoreError::UnknownFormat { lock, .. }
        | StoreError::CorruptItem { lock, .. }
        | StoreError::Unexpected { lock, .. }
        | StoreError::ExpressionTooLarge { lock, .. }
        | StoreError::WrongLayout { lock, .. } => Some(lock),
        StoreError::TableNotFound { .. } | StoreError::Dynamo { .. } => None,
    }
}

async fn list(semaphore: &Semaphore<DynamoStore>, shown: usize) -> Result<Answer, Failure> {
    let now = semaphore.now_ms();
    let timing = semaphore.timing();
    let mut entries: Vec<(Option<String>, Value)> = Vec::new();
    let mut errors = Vec::new();
    for item in semaphore.list().await? {
        match item {
            Ok(item) => entries.push((
                Some(item.lock.to_string()),
                status_json(&item, now, &timing, shown),
            )),
            Err(e) => {
                let lock = unreadable_lock(&e).map(str::to_owned);
                entries.push((lock.clone(), json!({"lock": lock, "error": e.to_string()})));
                errors.push(e.to_string());
            }
        }
    }
    entries.sort_by(|a, b| a.0.cmp(&b.0));
    let output = Value::Array(entries.into_iter().map(|(_, entry)| entry).collect());
    Ok(Answer::unless_errors(
        output,
        &errors,
        "some items could not be read; the other locks are listed",
    ))
}

/// Fences `holder` and frees its slots on every lock that holds it now, found by a scan. A lock
/// that fails goes into "errors" and the others are still done (like the cleanup function):
/// an operator freeing an execution's slots wants every slot it can get back.
async fn release_everywhere(
    semaphore: &Semaphore<DynamoStore>,
    holder: &HolderId,
) -> Result<Answer, Failure> {
    let mut errors = Vec::new();
    let mut locks = Vec::new();
    for item in semaphore.list().await? {
        match item {
            Ok(item) if item.slots_of(holder).next().is_some() => locks.push(item.lock),
            Ok(_) => {}
            // It may hold a slot there, which this semaphore cannot free: say so.
            Err(e) => errors.push(e.to_string()),
        }
    }
    locks.sort();
    let mut cleaned = Vec::with_capacity(locks.len());
    for lock in &locks {
        match semaphore.cleanup(lock, holder).await {
            Ok(outcome) => cleaned.push(cleaned_json(lock, &outcome, semaphore.now_ms())),
            Err(e) => errors.push(format!("lock \"{lock}\": {e}")),
        }
    }
    let mut output = json!({
        "holder": holder.as_str(),
        "outcome": "cleaned",
        "locks": cleaned,
        "errors": errors,
    });
    if locks.is_empty() {
        merge(
            &mut output,
            json!({"message": format!("{holder} holds no slot on any lock: nothing written")}),
        );
    }
    Ok(Answer::unless_errors(
        output,
        &errors,
        "some locks could not be read or cleaned; the others were",
    ))
}

async fn sweep(
    semaphore: &Semaphore<DynamoStore>,
    executions: &SfnExecutions,
    dry_run: bool,
) -> Result<Answer, Failure> {
    let report = if dry_run {
        semaphore.sweep_dry_run(executions).await?
    } else {
        semaphore.sweep(executions).await?
    };
    let mut slots: Vec<&Reclaimed> = report.reclaimed.iter().collect();
    slots.sort_by(|a, b| {
        (&a.lock, &a.holder, &a.acquisition).cmp(&(&b.lock, &b.holder, &b.acquisition))
    });
    let slots: Vec<Value> = slots
        .into_iter()
        .map(|slot| {
            json!({
                "lock": slot.lock.as_str(),
                "holder": slot.holder.as_str(),
                "acquisition": slot.acquisition.as_str(),
                "token": slot.token.0,
                "held_for_ms": slot.held_for_ms,
                "reason": slot.reason,
            })
        })
        .collect();
    let mut output = json!({
        "dry_run": dry_run,
        "locks": report.locks,
        "holders_checked": report.holders_checked,
        "largest_item": report.largest_item.as_ref().map(|largest| json!({
            "lock": largest.lock.as_str(),
            "bytes": largest.bytes,
        })),
        // Not found, but acquired within the grace period (DescribeExecution is eventually
        // consistent): kept, a later sweep asks again.
        "kept_not_found": report.too_young.iter().map(|(lock, holder)| json!({
            "lock": lock.as_str(),
            "holder": holder.as_str(),
        })).collect::<Vec<_>>(),
        "errors": report.errors,
    });
    // Distinct keys, so that a dry run's output is never read as slots taken back.
    let fields = if dry_run {
        json!({"would_reclaim": slots})
    } else {
        json!({
            "reclaimed": slots,
            "rotated": report.rotated,
            // F13: leases that passed unrenewed, whoever held them; each fenced.
            "taken_back": semaphore.drain_taken_back().iter().map(|slot| json!({
                "lock": slot.lock.as_str(),
                "holder": slot.identity.holder.as_str(),
                "acquisition": slot.identity.acquisition.as_str(),
                "token": slot.holding.token.0,
                "weight": slot.holding.weight.get(),
                "lease_until": rfc3339_millis(slot.lease_until_ms),
            })).collect::<Vec<_>>(),
        })
    };
    merge(&mut output, fields);
    Ok(Answer::unless_errors(
        output,
        &report.errors,
        "the sweep reported errors; the rest was swept, and the next sweep retries them",
    ))
}

fn merge(into: &mut Value, from: Value) {
    if let (Value::Object(into), Value::Object(from)) = (into, from) {
        into.extend(from);
    }
}

/// What a cleanup did on one lock.
fn cleaned_json(lock: &LockName, outcome: &CleanupOutcome, now_ms: u64) -> Value {
    let freed: Vec<Value> = outcome
        .freed
        .iter()
        .map(|(identity, holding)| {
            json!({
                "acquisition": identity.acquisition.as_str(),
                "token": holding.token.0,
                "weight": holding.weight.get(),
                "held_ms": now_ms.saturating_sub(holding.acquired_at_ms),
            })
        })
        .collect();
    json!({"lock": lock.as_str(), "freed": freed, "count": outcome.count})
}
/// A lock's configuration as `lock set`, `show` and `unset` print it, and `status` includes it.
fn config_value(config: Option<&LockConfig>) -> Value {
    config.map_or(Value::Null, |config| {
        json!({
            "limit": config.limit.get(),
            "max_weight": config.max_weight.map(Weight::get),
            "rate": config.rate.map(Rate::as_per_second),
        })
    })
}

fn config_json(lock: &LockName, item: Option<&SemaphoreItem>) -> Value {
    json!({
        "lock": lock.as_str(),
        "configured": config_value(item.and_then(|i| i.config.as_ref())),
        // As the last acquisition took them, and the lock now.
        "limit": item.and_then(|i| i.limit).map(Limit::get),
        "rate": item.and_then(|i| i.rate).map(Rate::as_per_second),
        "used": item.map_or(0, |i| i.used),
        "waiting": item.map_or(0, |i| i.waiting),
        "layout": item.map_or(Layout::Item, |i| i.layout).as_str(),
        "exists": item.is_some(),
    })
}

/// How many holders `status` and `list` show per lock.
#[derive(Debug, Clone, Copy, clap::Args)]
struct HoldersShown {
    /// Holders listed per lock, the longest held first (the others are counted in
    /// holders_omitted): a number, or "all". A lock of thousands of holders stays readable.
    #[arg(long, value_name = "N|all", default_value = "20", value_parser = holders_shown)]
    holders: usize,
}

fn holders_shown(text: &str) -> Result<usize, String> {
    match text.trim() {
        "all" => Ok(usize::MAX),
        n => n
            .parse()
            .map_err(|_| format!("expected a number of holders or \"all\", not {n:?}")),
    }
}

fn status_json(item: &SemaphoreItem, now_ms: u64, timing: &Timing, shown: usize) -> Value {
    // A gate's own item, without the holdings kept in items of their own.
    let mut own = item.clone();
    if item.layout == Layout::Gate {
        own.holders.clear();
        own.leases.clear();
        own.tombstones.clear();
    }
    let item_bytes = semaphore_core::dynamo::stored_size(&own);
    // The longest held first: where a leak or a stuck holder shows.
    let mut held: Vec<_> = item.holders.iter().collect();
    held.sort_by_key(|(identity, holding)| (holding.acquired_at_ms, *identity));
    let holders: Vec<Value> = held
        .iter()
        .take(shown)
        .map(|(identity, holding)| {
            json!({
                "holder": identity.holder.as_str(),
                "acquisition": identity.acquisition.as_str(),
                "token": holding.token.0,
                "weight": holding.weight.get(),
                "acquired_at": rfc3339_millis(holding.acquired_at_ms),
                "acquired_at_ms": holding.acquired_at_ms,
                "held_ms": now_ms.saturating_sub(holding.acquired_at_ms),
                // F13: when its lease ends (null: held until released).
                "lease_until": item.leases.get(identity).map(|until| rfc3339_millis(*until)),
            })
        })
        .collect();
    let fences = &item.fences;
    json!({
        "lock": item.lock.as_str(),
        // Where it keeps its holders: "item" (in its one item) or "gate" (each in an item of
        // its own, a released acquisition's left as a tombstone until a sweep drops it).
        "layout": item.layout.as_str(),
        "tombstones": item.tombstones.len(),
        "limit": item.limit.map(Limit::get),
        // Its operator's configuration (null: none), which every acquisition takes (F14).
        "configured": config_value(item.config.as_ref()),
        "count": item.count(),
        // The sum of the holders' weights: what the limit bounds.
        "used": item.used,
        // Executions parked in the lock's line (their records are in the waiters' table).
        "waiting": item.waiting,
        "version": item.version.0,
        "holders": holders,
        // Holders not listed (see --holders).
        "holders_omitted": item.count().saturating_sub(shown),
        // The start rate the last acquisition asked for (acquisitions per second; null: none),
        // when the last acquisition started, and when the next may start at that rate.
        "rate": item.rate.map(Rate::as_per_second),
        "started_at": item.started_at_ms.map(rfc3339_millis),
        "started_at_ms": item.started_at_ms,
        "next_start_at": item.next_start_ms(item.rate).map(rfc3339_millis),
        // Two generations of fences; a rotation drops `old` and ages `young`, at most once per
        // fence window, so every fence is kept at least one window and at most about two.
        "fences": {"young": fences.young.len(), "old": fences.old.len()},
        "rotated_at": fences.rotated_at_ms.map(rfc3339_millis),
        "rotated_at_ms": fences.rotated_at_ms,
        // The window is not stored: it is this semctl's horizon plus clock skew, which should
        // be the deployed functions' (AcquireHorizonSeconds + ClockSkewSeconds).
        "fence_window_seconds": timing.window().as_secs(),
        // An UpdateItem is billed by the larger of the item before and after it, one write
        // unit per started KB: this size is what each write of the lock costs, and what bounds
        // one lock's rate (BENCHMARKS.md).
        "item_bytes": item_bytes,
        "write_units_per_write": semaphore_core::dynamo::write_units(item_bytes),
    })
}
