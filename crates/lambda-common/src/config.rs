//! Configuration from the environment, read once per cold start.
//!
//! Every variable is read through a lookup function so that tests can pass their own map
//! instead of changing the process environment.

use std::time::Duration;

use semaphore_core::{
    ConfiguredOnly, DynamoStore, InputError, Limit, LockName, Rate, Semaphore, Timing, Weight,
};

use crate::arn::ArnPatterns;
use crate::executions::SfnExecutions;
use crate::request::{AllowedWork, Defaults, Resolver};
use crate::waiting::{HandOffs, SfnHandOffs};
use semaphore_core::flow::answer::WorkKind;

/// The variables the acquire and release functions read besides the table and timing.
pub mod var {
    /// The lock of an execution whose input and payload name none.
    pub const DEFAULT_LOCK: &str = "DEFAULT_LOCK";
    /// The limit of an execution whose input and payload name none.
    pub const DEFAULT_LIMIT: &str = "DEFAULT_LIMIT";
    /// The weight of an acquire whose payload and input name none (unset or empty: 1).
    pub const DEFAULT_WEIGHT: &str = "DEFAULT_WEIGHT";
    /// The start rate (acquisitions per second) of an acquire whose payload and input name
    /// none (unset or empty: no rate limit).
    pub const DEFAULT_RATE: &str = "DEFAULT_RATE";
    /// The work of an execution whose input names none: one of the allowed.
    pub const DEFAULT_WORK: &str = "DEFAULT_WORK";
    /// The state machines an execution's input may name as its work: comma-separated ARNs,
    /// each exact or a prefix ending in `*` (the stack's `WorkStateMachinePrefix`).
    pub const WORK_STATE_MACHINES: &str = "WORK_STATE_MACHINES";
    /// The Lambda functions an execution's input may name as its work, alike
    /// (`WorkFunctionPrefix`).
    pub const WORK_FUNCTIONS: &str = "WORK_FUNCTIONS";
    /// The state machine that runs a Lambda function as the work's child execution.
    pub const WORK_FUNCTION_RUNNER: &str = "WORK_FUNCTION_RUNNER";
    /// How long an execution may wait for a slot before `SemaphoreWaitTimeout`.
    pub const MAX_WAIT_SECONDS: &str = "MAX_WAIT_SECONDS";
    /// The state machines whose executions may take the semaphore, and whose executions the
    /// functions judge: comma-separated ARNs, each exact or a prefix ending in `*` (the
    /// stack's own machines and its `ProtectedStateMachinePrefix`).
    pub const PROTECTED_STATE_MACHINES: &str = "PROTECTED_STATE_MACHINES";
    /// "true": the acquire function takes only locks an operator configured (and the default
    /// lock, whose terms are the stack's parameters); "false" or unset: any (the stack's
    /// `RequireConfiguredLocks`).
    pub const REQUIRE_CONFIGURED_LOCKS: &str = "REQUIRE_CONFIGURED_LOCKS";
}

/// The wait budget when `MAX_WAIT_SECONDS` is unset: the template's default.
pub const DEFAULT_MAX_WAIT: Duration = Duration::from_secs(86_400);
/// The acquire function's timeout: template.yaml's `Globals: Function: Timeout` (the acquire
/// function sets none of its own). A test of local-run ties the two numbers together, and the
/// acquire states' `TimeoutSeconds` (their checks' period) are above it, so that one waiter's
/// invocations do not overlap (they would be harmless: a check gives the record its token only
/// over an earlier attempt's).
pub const ACQUIRE_FUNCTION_TIMEOUT: Duration = Duration::from_secs(10);
/// Wait budgets accepted, in whole seconds: up to a year, the longest a Standard execution runs.
pub const MAX_WAIT_RANGE: std::ops::RangeInclusive<u64> = 1..=31_536_000;

/// Step Functions' hard quota of events in one Standard execution's history ("Maximum execution
/// history size: 25,000 events", Step Functions service quotas): past it the execution fails
/// outright, not with `SemaphoreWaitTimeout`, and holds whatever it held.
pub const HISTORY_EVENT_QUOTA: u64 = 25_000;
/// Events one check of a waiting execution adds to its history, counted from a real history
/// (moto's) by the local run's history probe (`harness/local-run`), which fails if a check adds
/// more: from the acquire state's timeout to the invocation of its next entry, or one retry of
/// it (see the probe's report for the event types).
pub const EVENTS_PER_FALLBACK_CHECK: u64 = 6;
/// The events of an execution left for everything but its checks: its start and end, the
/// acquire, the work and the release with every Retry attempt (at most 7 attempts of 3 to 4
/// events for each task: about 100), the wake-ups that found no slot, a redriven run's second
/// pass, and the states of a caller's own machine. A fifth of the quota.
pub const HISTORY_RESERVE: u64 = 5_000;
/// The most checks one wait may make after it was queued: what the quota leaves after the
/// reserve, less the first entry (which has as many events as a check). Its record counts them;
/// past this many the wait ends with `SemaphoreWaitTimeout` rather than the execution with
/// Step Functions' own failure (a wait of a day with checks every 300 s makes 288).
pub const MAX_FALLBACK_CHECKS: u64 =
    (HISTORY_EVENT_QUOTA - HISTORY_RESERVE) / EVENTS_PER_FALLBACK_CHECK - 1;
// The default wait (a day, checking every 300 s: the acquire states' timeout) ends on its
// budget of time, long before its budget of checks.
const _: () = assert!(DEFAULT_MAX_WAIT.as_secs() / 300 < MAX_FALLBACK_CHECKS);

/// A missing or malformed setting: the function cannot start.
#[derive(Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    #[error("environment variable {name} is not set: {hint}")]
    Missing {
        name: &'static str,
        hint: &'static str,
    },
    #[error("environment variable {name} is {value:?}: {problem}")]
    Invalid {
        name: &'static str,
        value: String,
        problem: String,
    },
}

/// An entry of a list of ARN patterns that is neither an ARN of the kind the list holds nor the
/// beginning of one followed by `*`.
#[derive(Debug, thiserror::Error)]
#[error("{part:?} is not an ARN of the form {}, nor the beginning of one followed by *", kind.form())]
pub struct NotAnArn {
    pub part: String,
    pub kind: WorkKind,
}

/// As its message: `main` returning the error prints it with `Debug`.
impl std::fmt::Debug for ConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(self, f)
    }
}

/// Reads settings from a variable lookup (the process environment in production).
pub struct Settings<F> {
    lookup: F,
}

impl Settings<fn(&str) -> Option<String>> {
    /// Settings from the process environment.
    pub fn from_env() -> Self {
        Self {
            lookup: |name| std::env::var(name).ok(),
        }
    }
}

impl<F: Fn(&str) -> Option<String>> Settings<F> {
    /// Settings from any lookup, e.g. a map in a test.
    pub fn from_lookup(lookup: F) -> Self {
        Self { lookup }
    }

    /// The variable's value; unset and blank are the same.
    pub fn optional(&self, name: &str) -> Option<String> {
        (self.lookup)(name)
            .map(|v| v.trim().to_owned())
            .filter(|v| !v.is_empty())
    }

    pub fn required(&self, name: &'static str, hint: &'static str) -> Result<String, ConfigError> {
        self.optional(name)
            .ok_or(ConfigError::Missing { name, hint })
    }

    /// `TABLE_NAME`: the semaphore table.
    pub fn table_name(&self) -> Result<String, ConfigError> {
        self.required(
            "TABLE_NAME",
            "set it to the semaphore table's name (template.yaml sets it for every function)",
        )
    }

    /// `ACQUIRE_HORIZON_SECONDS` and `CLOCK_SKEW_SECONDS`: the protocol's [`Timing`] (defaults
    /// [`Timing::DEFAULT_HORIZON`] and [`Timing::DEFAULT_CLOCK_SKEW`]). The fence window is
    /// their sum, so it cannot be set shorter than what they require.
    pub fn timing(&self) -> Result<Timing, ConfigError> {
        Ok(Timing {
            horizon: self.seconds(
                "ACQUIRE_HORIZON_SECONDS",
                Timing::DEFAULT_HORIZON,
                Timing::HORIZON_RANGE,
            )?,
            clock_skew: self.seconds(
                "CLOCK_SKEW_SECONDS",
                Timing::DEFAULT_CLOCK_SKEW,
                Timing::CLOCK_SKEW_RANGE,
            )?,
        })
    }

    /// Whole seconds within `range`, or `default` when unset.
    fn seconds(
        &self,
        name: &'static str,
        default: Duration,
        range: std::ops::RangeInclusive<u64>,
    ) -> Result<Duration, ConfigError> {
        let Some(value) = self.optional(name) else {
            return Ok(default);
        };
        match value.parse::<u64>() {
            Ok(secs) if range.contains(&secs) => Ok(Duration::from_secs(secs)),
            _ => Err(ConfigError::Invalid {
                name,
                value,
                problem: format!(
                    "expected whole seconds from {} to {}, or unset for the default of {}",
                    range.start(),
                    range.end(),
                    default.as_secs()
                ),
            }),
        }
    }

    /// `REQUIRE_CONFIGURED_LOCKS` with `DEFAULT_LOCK`: which locks the acquire function takes
    /// only once an operator configured them (F14).
    pub fn configured_only(&self) -> Result<ConfiguredOnly, ConfigError> {
        let name = var::REQUIRE_CONFIGURED_LOCKS;
        match self.optional(name).as_deref() {
            None | Some("false") => Ok(ConfiguredOnly::No),
            Some("true") => Ok(ConfiguredOnly::Yes {
                except: self.defaults()?.lock,
            }),
            Some(other) => Err(ConfigError::Invalid {
                name,
                value: other.to_owned(),
                problem: "expected \"true\" or \"false\" (the stack's RequireConfiguredLocks)"
                    .to_owned(),
            }),
        }
    }

    /// `DEFAULT_LOCK`, `DEFAULT_LIMIT`, `DEFAULT_WEIGHT` and `DEFAULT_RATE`, each optional:
    /// without a lock or limit, a payload whose input does not name it is refused with
    /// `SemaphoreInvalidInput`.
    pub fn defaults(&self) -> Result<Defaults, ConfigError> {
        Ok(Defaults {
            lock: self.parsed(var::DEFAULT_LOCK, |value| LockName::new(value))?,
            limit: self.parsed(var::DEFAULT_LIMIT, Limit::parse)?,
            weight: self.parsed(var::DEFAULT_WEIGHT, Weight::parse)?,
            rate: self.parsed(var::DEFAULT_RATE, Rate::parse)?,
        })
    }

    /// The variable parsed by `parse` (its error is the problem to report); unset is `None`.
    fn parsed<T>(
        &self,
        name: &'static str,
        parse: impl Fn(&str) -> Result<T, InputError>,
    ) -> Result<Option<T>, ConfigError> {
        self.optional(name)
            .map(|value| {
                parse(&value).map_err(|e| ConfigError::Invalid {
                    name,
                    value,
                    problem: e.to_string(),
                })
            })
            .transpose()
    }

    /// `WORK_STATE_MACHINES` and `WORK_FUNCTIONS` ([`ArnPatterns`] of their kind),
    /// `DEFAULT_WORK` (one they match) and `WORK_FUNCTION_RUNNER` (a state machine ARN,
    /// required when functions are allowed). All unset allows no work: fine for callers that
    /// pass no execution input.
    pub fn allowed_work(&self) -> Result<AllowedWork, ConfigError> {
        let state_machines = self.patterns(var::WORK_STATE_MACHINES, WorkKind::StateMachine)?;
        let functions = self.patterns(var::WORK_FUNCTIONS, WorkKind::Function)?;
        let runner = self.optional(var::WORK_FUNCTION_RUNNER);
        match &runner {
            Some(runner) if WorkKind::of(runner) != Some(WorkKind::StateMachine) => {
                return Err(ConfigError::Invalid {
                    name: var::WORK_FUNCTION_RUNNER,
                    value: runner.clone(),
                    problem: format!(
                        "expected the ARN of the work-function state machine, {}",
                        WorkKind::StateMachine.form()
                    ),
                })
            }
            None if !functions.is_empty() => {
                return Err(ConfigError::Missing {
                    name: var::WORK_FUNCTION_RUNNER,
                    hint: "WORK_FUNCTIONS allows Lambda functions, which run as a child \
                           execution of the work-function state machine: set its ARN",
                })
            }
            _ => {}
        }
        let default = self.optional(var::DEFAULT_WORK);
        if let Some(default) = &default {
            if !state_machines.matches(default) && !functions.matches(default) {
                return Err(ConfigError::Invalid {
                    name: var::DEFAULT_WORK,
                    value: default.clone(),
                    problem: "it is in neither WORK_STATE_MACHINES nor WORK_FUNCTIONS; list it \
                              there too (the same lists bound what the lock-protected machine \
                              may start)"
                        .to_owned(),
                });
            }
        }
        Ok(AllowedWork {
            default,
            state_machines,
            functions,
            runner,
        })
    }

    /// [`ArnPatterns`] of `kind`; unset is none.
    fn patterns(&self, name: &'static str, kind: WorkKind) -> Result<ArnPatterns, ConfigError> {
        let Some(value) = self.optional(name) else {
            return Ok(ArnPatterns::default());
        };
        ArnPatterns::parse(&value, |arn| WorkKind::of(arn) == Some(kind)).map_err(|part| {
            ConfigError::Invalid {
                name,
                problem: NotAnArn { part, kind }.to_string(),
                value,
            }
        })
    }

    /// `MAX_WAIT_SECONDS`: how long an execution may wait for a slot (default
    /// [`DEFAULT_MAX_WAIT`]).
    pub fn max_wait(&self) -> Result<Duration, ConfigError> {
        self.seconds(var::MAX_WAIT_SECONDS, DEFAULT_MAX_WAIT, MAX_WAIT_RANGE)
    }

    /// The defaults and the allowed work: how the acquire and release functions resolve a
    /// payload.
    pub fn resolver(&self) -> Result<Resolver, ConfigError> {
        Ok(Resolver {
            defaults: self.defaults()?,
            work: self.allowed_work()?,
        })
    }

    /// The semaphore on `TABLE_NAME` (its waiters in `QUEUE_TABLE_NAME`, default
    /// `<TABLE_NAME>-queue`, its gates' holdings in `HOLDINGS_TABLE_NAME`, default
    /// `<TABLE_NAME>-holdings`) with the configured timing, using `sdk`'s region, credentials
    /// and endpoint.
    pub fn semaphore(
        &self,
        sdk: &aws_config::SdkConfig,
    ) -> Result<Semaphore<DynamoStore>, ConfigError> {
        let table = self.table_name()?;
        let timing = self.timing()?;
        let client = aws_sdk_dynamodb::Client::new(sdk);
        let mut store = DynamoStore::new(client, table);
        if let Some(queue_table) = self.optional("QUEUE_TABLE_NAME") {
            store = store.with_queue_table(queue_table);
        }
        if let Some(holdings_table) = self.optional("HOLDINGS_TABLE_NAME") {
            store = store.with_holdings_table(holdings_table);
        }
        Ok(Semaphore::new(store).with_timing(timing))
    }

    /// `PROTECTED_STATE_MACHINES` ([`ArnPatterns`] of state machines): the machines whose
    /// executions may take the semaphore and that the functions judge; unset: every execution
    /// (a deployment without the setting, such as a test's).
    pub fn protected_machines(&self) -> Result<ArnPatterns, ConfigError> {
        self.patterns(var::PROTECTED_STATE_MACHINES, WorkKind::StateMachine)
    }

    /// What moves a lock's line: `SendTaskSuccess` to wake a granted waiter, and
    /// `DescribeExecution` (of [`Settings::protected_machines`]' executions) when a wake-up
    /// fails.
    pub fn hand_offs(&self, sdk: &aws_config::SdkConfig) -> Result<SfnHandOffs, ConfigError> {
        let client = aws_sdk_sfn::Client::new(sdk);
        Ok(HandOffs {
            metrics: self.metrics(),
            ..HandOffs::new(
                client.clone(),
                SfnExecutions::of_machines(client, self.protected_machines()?),
            )
        })
    }

    /// Metric lines on stdout in `METRIC_NAMESPACE` (default
    /// [`crate::metrics::DEFAULT_NAMESPACE`]).
    pub fn metrics(&self) -> crate::Metrics {
        crate::Metrics::stdout(
            self.optional("METRIC_NAMESPACE")
                .unwrap_or_else(|| crate::metrics::DEFAULT_NAMESPACE.to_owned()),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn settings(vars: &[(&str, &str)]) -> Settings<impl Fn(&str) -> Option<String>> {
        let map: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        Settings::from_lookup(move |name| map.get(name).cloned())
    }

    #[test]
    fn a_missing_table_name_is_a_clear_start_up_error() {
        let err = settings(&[]).table_name().unwrap_err();
        assert_eq!(
            err.to_string(),
            "environment variable TABLE_NAME is not set: set it to the semaphore table's name \
             (template.yaml sets it for every function)"
        );
        assert!(settings(&[("TABLE_NAME", "  ")]).table_name().is_err());
        assert_eq!(
            settings(&[("TABLE_NAME", "semaphores")])
                .table_name()
                .unwrap(),
            "semaphores"
        );
    }

    #[test]
    fn the_timing_defaults_and_rejects_nonsense() {
        assert_eq!(settings(&[]).timing().unwrap(), Timing::default());
        let timing = settings(&[
            ("ACQUIRE_HORIZON_SECONDS", "20"),
            ("CLOCK_SKEW_SECONDS", "5"),
        ])
        .timing()
        .unwrap();
        assert_eq!(timing.window(), Duration::from_secs(25));
        for (name, bad) in [
            ("ACQUIRE_HORIZON_SECONDS", "0"),
            ("ACQUIRE_HORIZON_SECONDS", "-5"),
            ("ACQUIRE_HORIZON_SECONDS", "2.5"),
            ("ACQUIRE_HORIZON_SECONDS", "301"),
            ("CLOCK_SKEW_SECONDS", "0"),
            ("CLOCK_SKEW_SECONDS", "five"),
        ] {
            let err = settings(&[(name, bad)]).timing().unwrap_err();
            assert!(
                matches!(err, ConfigError::Invalid { name: n, .. } if n == name),
                "{name}={bad}: {err}"
            );
        }
    }

    const DEMO: &str = "arn:aws:states:us-east-1:123456789012:stateMachine:demo-work";
    const RUNNER: &str = "arn:aws:states:us-east-1:123456789012:stateMachine:work-function";
    const FUNCTION: &str = "arn:aws:lambda:us-east-1:123456789012:function:mine";

    #[test]
    fn configured_only_is_off_unless_true_and_spares_the_default_lock() {
        assert_eq!(settings(&[]).configured_only().unwrap(), ConfiguredOnly::No);
        let off = settings(&[("REQUIRE_CONFIGURED_LOCKS", "false")]);
        assert_eq!(off.configured_only().unwrap(), ConfiguredOnly::No);
        let on = settings(&[
            ("REQUIRE_CONFIGURED_LOCKS", "true"),
            ("DEFAULT_LOCK", "demo-lock"),
        ]);
        assert_eq!(
            on.configured_only().unwrap(),
            ConfiguredOnly::Yes {
                except: Some(LockName::new("demo-lock").unwrap())
            }
        );
        let bad = settings(&[("REQUIRE_CONFIGURED_LOCKS", "yes")]).configured_only();
        assert!(bad
            .unwrap_err()
            .to_string()
            .contains("REQUIRE_CONFIGURED_LOCKS is \"yes\": expected \"true\" or \"false\""));
    }

    #[test]
    fn defaults_are_optional_and_checked() {
        let none = settings(&[]).defaults().unwrap();
        assert_eq!(none, Defaults::default());
        let set = settings(&[("DEFAULT_LOCK", "demo-lock"), ("DEFAULT_LIMIT", " 5 ")])
            .defaults()
            .unwrap();
        assert_eq!(set.lock.unwrap().as_str(), "demo-lock");
        assert_eq!(set.limit.unwrap().get(), 5);
        let err = settings(&[("DEFAULT_LIMIT", "0")]).defaults().unwrap_err();
        assert_eq!(
            err.to_string(),
            "environment variable DEFAULT_LIMIT is \"0\": limit must be a whole number from 1 \
             to 10000; got \"0\""
        );
        let long = "x".repeat(257);
        let err = settings(&[("DEFAULT_LOCK", &long)]).defaults().unwrap_err();
        assert!(err.to_string().contains("257 bytes long"), "{err}");
    }

    #[test]
    fn default_weight_and_rate_are_optional_empty_is_unset_and_bad_ones_are_named() {
        // The template passes an empty DefaultRate (and could pass an empty weight): unset.
        let empty = settings(&[("DEFAULT_WEIGHT", ""), ("DEFAULT_RATE", "  ")])
            .defaults()
            .unwrap();
        assert_eq!((empty.weight, empty.rate), (None, None));
        let set = settings(&[("DEFAULT_WEIGHT", "3"), ("DEFAULT_RATE", "0.5")])
            .defaults()
            .unwrap();
        assert_eq!(set.weight.unwrap().get(), 3);
        assert_eq!(set.rate.unwrap().spacing_ms(), 2_000);
        for (name, bad) in [
            ("DEFAULT_WEIGHT", "0"),
            ("DEFAULT_WEIGHT", "-1"),
            ("DEFAULT_WEIGHT", "2.5"),
            ("DEFAULT_WEIGHT", "10001"),
            ("DEFAULT_RATE", "0"),
            ("DEFAULT_RATE", "-2"),
            ("DEFAULT_RATE", "fast"),
            ("DEFAULT_RATE", "1e9"),
        ] {
            let err = settings(&[(name, bad)]).defaults().unwrap_err();
            assert!(
                matches!(err, ConfigError::Invalid { name: n, .. } if n == name),
                "{name}={bad}: {err}"
            );
            let field = if name == "DEFAULT_WEIGHT" {
                "weight must be"
            } else {
                "rate must be"
            };
            assert!(err.to_string().contains(field), "{err}");
        }
    }

    #[test]
    fn allowed_work_is_checked_when_read() {
        assert_eq!(
            settings(&[]).allowed_work().unwrap(),
            AllowedWork::default()
        );
        let work = settings(&[
            ("DEFAULT_WORK", DEMO),
            ("WORK_STATE_MACHINES", &format!("{DEMO}, ,{DEMO}")),
            ("WORK_FUNCTIONS", FUNCTION),
            ("WORK_FUNCTION_RUNNER", RUNNER),
        ])
        .allowed_work()
        .unwrap();
        assert_eq!(work.default.as_deref(), Some(DEMO));
        assert_eq!(work.state_machines.to_string(), DEMO);
        assert_eq!(work.functions.to_string(), FUNCTION);
        assert_eq!(work.runner.as_deref(), Some(RUNNER));

        let err = |vars: &[(&str, &str)]| settings(vars).allowed_work().unwrap_err().to_string();
        assert_eq!(
            err(&[("WORK_STATE_MACHINES", FUNCTION)]),
            format!(
                "environment variable WORK_STATE_MACHINES is \"{FUNCTION}\": \"{FUNCTION}\" is \
                 not an ARN of the form arn:<partition>:states:<region>:<account>:stateMachine:<name>, \
                 nor the beginning of one followed by *"
            )
        );
        assert!(
            err(&[("WORK_FUNCTIONS", DEMO), ("WORK_FUNCTION_RUNNER", RUNNER)])
                .contains("function:<name>")
        );
        assert!(err(&[("WORK_FUNCTIONS", FUNCTION)])
            .starts_with("environment variable WORK_FUNCTION_RUNNER is not set"));
        assert!(err(&[("WORK_FUNCTION_RUNNER", FUNCTION)])
            .contains("expected the ARN of the work-function state machine"));
        assert!(err(&[("DEFAULT_WORK", DEMO)])
            .contains("it is in neither WORK_STATE_MACHINES nor WORK_FUNCTIONS"));
    }

    #[test]
    fn the_wait_budget_defaults_to_the_templates() {
        assert_eq!(settings(&[]).max_wait().unwrap(), DEFAULT_MAX_WAIT);
        assert_eq!(
            settings(&[("MAX_WAIT_SECONDS", "60")]).max_wait().unwrap(),
            Duration::from_secs(60)
        );
        for bad in ["0", "-1", "1.5", "forever", "31536001"] {
            assert!(
                settings(&[("MAX_WAIT_SECONDS", bad)]).max_wait().is_err(),
                "{bad}"
            );
        }
    }

    #[test]
    fn protected_machines_name_the_entry_that_is_not_one() {
        let machine = "arn:aws:states:us-east-1:123456789012:stateMachine:m";
        let protected = |v: &str| {
            settings(&[("PROTECTED_STATE_MACHINES", v)])
                .protected_machines()
                .map(|p| p.to_string())
        };
        assert_eq!(
            protected(&format!("{machine}, {machine}*,{machine}")).unwrap(),
            format!("{machine}, {machine}*")
        );
        assert_eq!(
            settings(&[]).protected_machines().unwrap().to_string(),
            "none"
        );
        let err = protected(&format!("{machine},my-machine-*")).unwrap_err();
        assert!(
            err.to_string().contains(
                "\"my-machine-*\" is not an ARN of the form \
                 arn:<partition>:states:<region>:<account>:stateMachine:<name>, nor the \
                 beginning of one followed by *"
            ),
            "{err}"
        );
    }
}
