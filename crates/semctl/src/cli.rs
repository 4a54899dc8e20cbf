//! The command line: its flags and subcommands, each checked into a [`Request`] before
//! anything reaches the table.

use clap::{Parser, Subcommand};
use lambda_sweeper::{ArnPatterns, ExecutionArn, StateMachineArn};
use semaphore_core::{
    AcquisitionId, Claim, FencingToken, HolderId, Identity, InputError, Layout, Lease, Limit,
    LockConfig, LockName, Rate, Terms, Timing, Weight,
};

use crate::output::Failure;
use crate::top;

#[derive(Parser)]
#[command(
    version,
    about = "Operate a Step Functions semaphore table in DynamoDB"
)]
pub(crate) struct Cli {
    /// AWS endpoint (DynamoDB, and Step Functions for `sweep`), e.g. a local server (default:
    /// AWS, or AWS_ENDPOINT_URL).
    #[arg(long, global = true)]
    pub(crate) endpoint_url: Option<String>,
    /// AWS region (default: the usual AWS environment and profile).
    #[arg(long, global = true)]
    pub(crate) region: Option<String>,
    /// The semaphore table.
    #[arg(long, global = true, env = "TABLE_NAME", default_value = "semaphores")]
    pub(crate) table: String,
    /// The waiters' table (the stack's QueueTable output; default: TABLE-queue, what
    /// `semctl init` creates).
    #[arg(long, global = true, env = "QUEUE_TABLE_NAME")]
    pub(crate) queue_table: Option<String>,
    /// The gates' holdings table (the stack's HoldingsTable output; default: TABLE-holdings,
    /// what `semctl init` creates).
    #[arg(long, global = true, env = "HOLDINGS_TABLE_NAME")]
    pub(crate) holdings_table: Option<String>,
    /// How long after its request an acquire may still land (whole seconds, 1-300); the
    /// deployed functions' AcquireHorizonSeconds. With the clock skew it makes the fence window.
    #[arg(long, global = true, env = "ACQUIRE_HORIZON_SECONDS", value_name = "SECONDS",
          allow_hyphen_values = true, default_value_t = Timing::DEFAULT_HORIZON.as_secs(),
          value_parser = |text: &str| seconds_in(text, Timing::HORIZON_RANGE))]
    pub(crate) horizon_seconds: u64,
    /// How far apart hosts' clocks may be (whole seconds, 1-60); the deployed functions'
    /// ClockSkewSeconds.
    #[arg(long, global = true, env = "CLOCK_SKEW_SECONDS", value_name = "SECONDS",
          allow_hyphen_values = true, default_value_t = Timing::DEFAULT_CLOCK_SKEW.as_secs(),
          value_parser = |text: &str| seconds_in(text, Timing::CLOCK_SKEW_RANGE))]
    pub(crate) clock_skew_seconds: u64,
    /// Attempts of each request to AWS before semctl gives up (1-20), with exponential backoff
    /// and jitter between them, capped at 5 s: throttles and lost answers are retried, as AWS
    /// advises for DynamoDB (the SDK's own default is 3). 1 fails fast.
    #[arg(long, global = true, env = "SEMCTL_MAX_ATTEMPTS", value_name = "N",
          default_value_t = semaphore_core::dynamo::HOLDER_ATTEMPTS,
          value_parser = clap::value_parser!(u32).range(1..=20))]
    pub(crate) max_attempts: u32,
    #[command(subcommand)]
    pub(crate) command: Command,
}

#[derive(Subcommand)]
pub(crate) enum Command {
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

/// What a release or heartbeat shows of its slot: `--token` (and `--weight`), else the
/// operator's claim.
pub(crate) fn claim(token: Option<&str>, weight: Option<&str>) -> Result<Claim, InputError> {
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

/// Whole seconds within `range`, for a flag or its environment variable.
pub(crate) fn seconds_in(text: &str, range: std::ops::RangeInclusive<u64>) -> Result<u64, String> {
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

#[derive(Subcommand)]
pub(crate) enum LockCommand {
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
pub(crate) enum Request {
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

pub(crate) const EXECUTION_ARN_FORM: &str =
    "arn:<partition>:states:<region>:<account>:execution:<machine>:<name>";

pub(crate) const STATE_MACHINE_ARN_FORM: &str =
    "arn:<partition>:states:<region>:<account>:stateMachine:<name>";

/// The execution `--all-of` names. An execution ARN only: a typo (an execution's name, its
/// machine's ARN) would otherwise fence a holder that never existed and free nothing, silently.
pub(crate) fn execution_holder(text: &str) -> Result<HolderId, Failure> {
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
pub(crate) fn state_machines(texts: &[String]) -> Result<ArnPatterns, Failure> {
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
    pub(crate) fn parse(command: Command) -> Result<Self, Failure> {
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
}

/// How many holders `status` and `list` show per lock.
#[derive(Debug, Clone, Copy, clap::Args)]
pub(crate) struct HoldersShown {
    /// Holders listed per lock, the longest held first (the others are counted in
    /// holders_omitted): a number, or "all". A lock of thousands of holders stays readable.
    #[arg(long, value_name = "N|all", default_value = "20", value_parser = holders_shown)]
    pub(crate) holders: usize,
}

pub(crate) fn holders_shown(text: &str) -> Result<usize, String> {
    match text.trim() {
        "all" => Ok(usize::MAX),
        n => n
            .parse()
            .map_err(|_| format!("expected a number of holders or \"all\", not {n:?}")),
    }
}
