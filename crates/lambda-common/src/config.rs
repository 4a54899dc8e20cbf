//! Configuration from the environment, read once per cold start.
//!
//! Every variable is read through a lookup function so that tests can pass their own map
//! instead of changing the process environment.

use std::time::Duration;

use semaphore_core::{DynamoStore, InputError, LockName, Semaphore, Timing};

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

    /// `LOCK_NAMES`: comma-separated lock names (blanks between commas are skipped,
    /// duplicates dropped). Unset means none.
    pub fn lock_names(&self) -> Result<Vec<LockName>, ConfigError> {
        const NAME: &str = "LOCK_NAMES";
        let Some(value) = self.optional(NAME) else {
            return Ok(Vec::new());
        };
        let mut locks: Vec<LockName> = Vec::new();
        for part in value.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let lock = LockName::new(part).map_err(|e: InputError| ConfigError::Invalid {
                name: NAME,
                value: value.clone(),
                problem: format!("{part:?}: {e}"),
            })?;
            if !locks.contains(&lock) {
                locks.push(lock);
            }
        }
        Ok(locks)
    }

    /// The semaphore on `TABLE_NAME` with the configured timing, using `sdk`'s region,
    /// credentials and endpoint.
    pub fn semaphore(
        &self,
        sdk: &aws_config::SdkConfig,
    ) -> Result<Semaphore<DynamoStore>, ConfigError> {
        let table = self.table_name()?;
        let timing = self.timing()?;
        let client = aws_sdk_dynamodb::Client::new(sdk);
        Ok(Semaphore::new(DynamoStore::new(client, table)).with_timing(timing))
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

    #[test]
    fn lock_names_are_split_validated_and_deduplicated() {
        let names = |v: &str| {
            settings(&[("LOCK_NAMES", v)])
                .lock_names()
                .map(|l| l.iter().map(|n| n.to_string()).collect::<Vec<_>>())
        };
        assert_eq!(names("a, b,,a ,c").unwrap(), ["a", "b", "c"]);
        assert_eq!(names("").unwrap(), Vec::<String>::new());
        assert!(settings(&[]).lock_names().unwrap().is_empty());
        let long = "x".repeat(300);
        let err = names(&format!("a,{long}")).unwrap_err();
        assert!(err.to_string().contains("300 bytes long"), "{err}");
    }
}
