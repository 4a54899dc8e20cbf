//! `semctl`: inspect and operate a semaphore table by hand.
//!
//! Exit status: 0 done (acquired, already held, released, nothing held, cleaned, status),
//! 2 the lock is full, 3 refused because this holder/acquisition was released or cleaned up
//! (fenced), 4 expired (the request is older than the acquire horizon and the fences rotated
//! since: nothing was taken, run it again), 1 any error (message on stderr, nothing written;
//! also a lock whose item version 1 wrote). Output is JSON on stdout.

use std::process::ExitCode;
use std::time::Duration;

use aws_config::BehaviorVersion;
use clap::{Parser, Subcommand};
use semaphore_core::{
    rfc3339_millis, AcquireOutcome, AcquisitionId, Clock, DynamoStore, HolderId, Identity, Limit,
    LockName, ReleaseOutcome, Semaphore, SemaphoreItem, SystemClock, TableSetup, Timing,
};
use serde_json::{json, Value};

#[derive(Parser)]
#[command(
    version,
    about = "Operate a Step Functions semaphore table in DynamoDB"
)]
struct Cli {
    /// DynamoDB endpoint, e.g. a local server (default: AWS, or AWS_ENDPOINT_URL).
    #[arg(long, global = true)]
    endpoint_url: Option<String>,
    /// AWS region (default: the usual AWS environment and profile).
    #[arg(long, global = true)]
    region: Option<String>,
    /// The semaphore table.
    #[arg(long, global = true, env = "TABLE_NAME", default_value = "semaphores")]
    table: String,
    /// How long after its request an acquire may still land (whole seconds, 1-300); the
    /// deployed functions' AcquireHorizonSeconds. With the clock skew it makes the fence window.
    #[arg(long, global = true, env = "ACQUIRE_HORIZON_SECONDS", value_name = "SECONDS",
          allow_hyphen_values = true, default_value_t = Timing::DEFAULT_HORIZON.as_secs(),
          value_parser = horizon_seconds)]
    horizon_seconds: u64,
    /// How far apart hosts' clocks may be (whole seconds, 1-60); the deployed functions'
    /// ClockSkewSeconds.
    #[arg(long, global = true, env = "CLOCK_SKEW_SECONDS", value_name = "SECONDS",
          allow_hyphen_values = true, default_value_t = Timing::DEFAULT_CLOCK_SKEW.as_secs(),
          value_parser = clock_skew_seconds)]
    clock_skew_seconds: u64,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Create the table (partition key `lock`, on-demand) unless it exists.
    Init,
    /// One attempt to take a slot, requested when semctl started. Exit 0 acquired or already
    /// held, 2 full, 3 fenced, 4 expired.
    Acquire {
        #[arg(long)]
        lock: String,
        #[arg(long)]
        holder: String,
        /// Positive whole number.
        #[arg(long, allow_hyphen_values = true)]
        limit: String,
        #[arg(long, default_value = AcquisitionId::DEFAULT)]
        acquisition: String,
    },
    /// Free the slot of one acquisition (a no-op, exit 0, when nothing is held).
    Release {
        #[arg(long)]
        lock: String,
        #[arg(long)]
        holder: String,
        #[arg(long, default_value = AcquisitionId::DEFAULT)]
        acquisition: String,
    },
    /// What cleanup-from-incomplete does for an ended execution: free all its slots and fence it.
    Cleanup {
        #[arg(long)]
        lock: String,
        #[arg(long)]
        holder: String,
    },
    /// The semaphore as stored: limit, count, version, holders, fences, last rotation, the
    /// fence window, item bytes and write units per write.
    Status {
        #[arg(long)]
        lock: String,
    },
}

const EXIT_FULL: u8 = 2;
const EXIT_FENCED: u8 = 3;
const EXIT_EXPIRED: u8 = 4;

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

fn horizon_seconds(text: &str) -> Result<u64, String> {
    seconds_in(text, Timing::HORIZON_RANGE)
}

fn clock_skew_seconds(text: &str) -> Result<u64, String> {
    seconds_in(text, Timing::CLOCK_SKEW_RANGE)
}

type Failure = Box<dyn std::error::Error>;

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
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("semctl: error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli, requested_at_ms)) {
        Ok((output, code)) => {
            println!(
                "{}",
                serde_json::to_string_pretty(&output).unwrap_or_default()
            );
            ExitCode::from(code)
        }
        Err(e) => {
            eprintln!("semctl: error: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli, requested_at_ms: u64) -> Result<(Value, u8), Failure> {
    // Validate everything before building a client, so bad input never reaches the table.
    let command = cli.command;
    let request = Request::parse(&command)?;
    let mut loader = aws_config::defaults(BehaviorVersion::latest());
    if let Some(url) = &cli.endpoint_url {
        loader = loader.endpoint_url(url);
    }
    if let Some(region) = cli.region {
        loader = loader.region(aws_config::Region::new(region));
    }
    let config = loader.load().await;
    if config.region().is_none() {
        return Err("no AWS region: pass --region or set AWS_REGION".into());
    }
    let store = DynamoStore::new(aws_sdk_dynamodb::Client::new(&config), &cli.table);
    let semaphore = Semaphore::new(store).with_timing(Timing {
        horizon: Duration::from_secs(cli.horizon_seconds),
        clock_skew: Duration::from_secs(cli.clock_skew_seconds),
    });
    request.execute(&semaphore, requested_at_ms).await
}

/// A command with its inputs validated.
enum Request {
    Init,
    Acquire(LockName, Identity, Limit),
    Release(LockName, Identity),
    Cleanup(LockName, HolderId),
    Status(LockName),
}

impl Request {
    fn parse(command: &Command) -> Result<Self, semaphore_core::InputError> {
        let identity = |holder: &str, acquisition: &str| {
            Ok::<_, semaphore_core::InputError>(Identity::new(
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
            } => Self::Acquire(
                LockName::new(lock.as_str())?,
                identity(holder, acquisition)?,
                Limit::parse(limit)?,
            ),
            Command::Release {
                lock,
                holder,
                acquisition,
            } => Self::Release(
                LockName::new(lock.as_str())?,
                identity(holder, acquisition)?,
            ),
            Command::Cleanup { lock, holder } => Self::Cleanup(
                LockName::new(lock.as_str())?,
                HolderId::new(holder.as_str())?,
            ),
            Command::Status { lock } => Self::Status(LockName::new(lock.as_str())?),
        })
    }

    async fn execute(
        self,
        semaphore: &Semaphore<DynamoStore>,
        requested_at_ms: u64,
    ) -> Result<(Value, u8), Failure> {
        Ok(match self {
            Self::Init => {
                let table = semaphore.store().table();
                let outcome = match semaphore.store().create_table().await? {
                    TableSetup::Created => "created",
                    TableSetup::AlreadyExisted => "already_existed",
                };
                (json!({"table": table, "outcome": outcome}), 0)
            }
            Self::Acquire(lock, identity, limit) => {
                let outcome = semaphore
                    .acquire_requested_at(&lock, &identity, limit, requested_at_ms)
                    .await?;
                let mut out = json!({
                    "lock": lock.as_str(),
                    "holder": identity.holder.as_str(),
                    "acquisition": identity.acquisition.as_str(),
                    "limit": limit.get(),
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
                    AcquireOutcome::Full { count, .. } => {
                        (json!({"outcome": "full", "count": count}), EXIT_FULL)
                    }
                    AcquireOutcome::Fenced(reason) => (
                        json!({"outcome": "fenced", "reason": reason.describe()}),
                        EXIT_FENCED,
                    ),
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
                (out, code)
            }
            Self::Release(lock, identity) => {
                let outcome = semaphore.release(&lock, &identity).await?;
                let mut out = json!({
                    "lock": lock.as_str(),
                    "holder": identity.holder.as_str(),
                    "acquisition": identity.acquisition.as_str(),
                });
                merge(
                    &mut out,
                    match outcome {
                        ReleaseOutcome::Released { token, count } => {
                            json!({"outcome": "released", "token": token.0, "count": count})
                        }
                        ReleaseOutcome::NotHeld { count } => json!({
                            "outcome": "not_held",
                            "count": count,
                            "message": format!("{} held nothing on {lock}; nothing to release", identity.slot_key()),
                        }),
                    },
                );
                (out, 0)
            }
            Self::Cleanup(lock, holder) => {
                let now = semaphore.now_ms();
                let outcome = semaphore.cleanup(&lock, &holder).await?;
                let freed: Vec<Value> = outcome
                    .freed
                    .iter()
                    .map(|(identity, holding)| {
                        json!({
                            "acquisition": identity.acquisition.as_str(),
                            "token": holding.token.0,
                            "held_ms": now.saturating_sub(holding.acquired_at_ms),
                        })
                    })
                    .collect();
                (
                    json!({
                        "lock": lock.as_str(),
                        "holder": holder.as_str(),
                        "outcome": "cleaned",
                        "freed": freed,
                        "count": outcome.count,
                    }),
                    0,
                )
            }
            Self::Status(lock) => {
                let item = semaphore.status(&lock).await?;
                (
                    status_json(&item, semaphore.now_ms(), &semaphore.timing()),
                    0,
                )
            }
        })
    }
}

fn merge(into: &mut Value, from: Value) {
    if let (Value::Object(into), Value::Object(from)) = (into, from) {
        into.extend(from);
    }
}

fn status_json(item: &SemaphoreItem, now_ms: u64, timing: &Timing) -> Value {
    let item_bytes = semaphore_core::dynamo::stored_size(item);
    let holders: Vec<Value> = item
        .holders
        .iter()
        .map(|(identity, holding)| {
            json!({
                "holder": identity.holder.as_str(),
                "acquisition": identity.acquisition.as_str(),
                "token": holding.token.0,
                "acquired_at": rfc3339_millis(holding.acquired_at_ms),
                "acquired_at_ms": holding.acquired_at_ms,
                "held_ms": now_ms.saturating_sub(holding.acquired_at_ms),
            })
        })
        .collect();
    let fences = &item.fences;
    json!({
        "lock": item.lock.as_str(),
        "limit": item.limit.map(Limit::get),
        "count": item.count(),
        "version": item.version.0,
        "holders": holders,
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
