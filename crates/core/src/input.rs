//! Validated inputs. Every value that crosses into the protocol from outside (a state machine, an
//! operator, an EventBridge event) is parsed into one of these types first, so a bad value is a
//! named [`InputError`] before anything touches the table (fault F6).

use std::fmt;

/// The last run an execution can have (its redrive count). Step Functions keeps at most 25,000
/// events in a standard execution's history and refuses to redrive one whose history is full
/// ("Avoid reaching the history quota"; `DescribeExecution`'s `redriveStatusReason` "Execution
/// history event limit exceeded"), and every run adds at least two: its end
/// (`ExecutionFailed`, `ExecutionAborted` or `ExecutionTimedOut`) and the next one's
/// `ExecutionRedriven`. A cleanup fences a run and every run before it, so a larger run from a
/// payload would size a write (F15).
pub const MAX_RUN: u32 = 12_499;

/// The largest fencing token a lock gives: versions stay below 10^15 (a thousand writes a
/// second for 31,000 years; `dynamo::TOKEN_SPAN`).
pub const MAX_FENCING_TOKEN: u64 = 999_999_999_999_999;

/// Longest lock name accepted, in bytes. Lock names are DynamoDB partition keys (2048 bytes at
/// most); 256 keeps the item small and is far more than a readable name needs.
pub const MAX_LOCK_NAME_BYTES: usize = 256;
/// Longest holder id accepted, in bytes. Step Functions execution ARNs are at most about 260
/// bytes (80-character machine and execution names); 512 leaves room for Express ARNs and for
/// operator ids.
pub const MAX_HOLDER_BYTES: usize = 512;
/// Longest acquisition id accepted, in bytes. `States.UUID()` yields 36.
pub const MAX_ACQUISITION_BYTES: usize = 128;
/// Largest concurrency limit accepted. A lock in the item layout keeps every holder in its one
/// item (a few hundred bytes each, within DynamoDB's 400 KB) and answers "full" once that is
/// full, about 2,000 holders of execution ARNs; a gate keeps each holding in an item of its own
/// (see [`crate::item::Layout`]).
pub const MAX_LIMIT: u32 = 10_000;
/// Most acquisitions per second a start-rate limit may allow: one per millisecond, the
/// resolution of the times the lock's item keeps.
pub const MAX_RATE: f64 = 1000.0;
/// Longest task token accepted, in bytes. Step Functions' task tokens are at most 1024
/// characters today; `SendTaskSuccess` takes up to 2048.
pub const MAX_TASK_TOKEN_BYTES: usize = 2048;

/// Bad input: what was wrong and what to pass instead. Nothing is written when one is returned.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InputError {
    #[error("lock name is empty: pass the name of the semaphore, e.g. \"demo-lock\"")]
    EmptyLockName,
    #[error("lock name is {len} bytes long; the maximum is {MAX_LOCK_NAME_BYTES} bytes")]
    LockNameTooLong { len: usize },
    #[error(
        "holder is empty: pass the execution ARN ($$.Execution.Id) or an operator id such as \"exec-1\""
    )]
    EmptyHolder,
    #[error("holder is {len} bytes long; the maximum is {MAX_HOLDER_BYTES} bytes")]
    HolderTooLong { len: usize },
    #[error(
        "acquisition id is empty: pass an id made once per logical acquire, e.g. States.UUID()"
    )]
    EmptyAcquisition,
    #[error("acquisition id is {len} bytes long; the maximum is {MAX_ACQUISITION_BYTES} bytes")]
    AcquisitionTooLong { len: usize },
    #[error(
        "acquisition id contains {found:?}; use only letters, digits and . _ : - (a UUID fits)"
    )]
    AcquisitionCharacter { found: char },
    #[error("{field} contains a control character at byte {at}; use printable characters only")]
    ControlCharacter { field: &'static str, at: usize },
    #[error("limit must be a whole number from 1 to {MAX_LIMIT}; got {got}")]
    InvalidLimit { got: String },
    #[error("weight must be a whole number from 1 to the limit ({MAX_LIMIT} at most); got {got}")]
    InvalidWeight { got: String },
    #[error("weight {weight} is above the limit {limit}: it could never be granted; ask for at most {limit}, or raise the limit")]
    WeightAboveLimit { weight: u32, limit: u32 },
    #[error("rate must be a number of acquisitions per second from {min} (one a day) to {MAX_RATE}; got {got}", min = Rate::MIN_PER_SECOND)]
    InvalidRate { got: String },
    #[error("weight {weight} is above the largest weight {max_weight} that lock {lock}'s operator allows (semctl lock show --lock {lock}): ask for at most {max_weight}")]
    WeightAboveConfigured {
        lock: String,
        weight: u32,
        max_weight: u32,
    },
    #[error("largest weight {max_weight} is above the limit {limit}: no acquisition could take it; configure at most {limit}")]
    MaxWeightAboveLimit { max_weight: u32, limit: u32 },
    #[error("lease must be a number of seconds from 1 to 86400 (a day); got {got}")]
    InvalidLease { got: String },
    #[error("layout must be \"item\" (holders in the lock's item: cheapest for small limits) or \"gate\" (each holding an item of its own: a cost per critical section flat in the limit and the rate); got {got:?}")]
    Layout { got: String },
    #[error("task token is {len} bytes long; the maximum is {MAX_TASK_TOKEN_BYTES} bytes")]
    TaskTokenTooLong { len: usize },
    #[error("run {run} is past the last run an execution can have ({MAX_RUN}): Step Functions stops redriving an execution before its history's 25,000 events")]
    RunTooLate { run: u32 },
    #[error("token must be the fencing token of the acquire answer, a whole number from 1 to {MAX_FENCING_TOKEN}; got {got}")]
    InvalidToken { got: String },
    #[error("{field} is missing: {hint}")]
    Missing {
        field: &'static str,
        hint: &'static str,
    },
}

fn reject_control(field: &'static str, s: &str) -> Result<(), InputError> {
    match s.char_indices().find(|(_, c)| c.is_control()) {
        Some((at, _)) => Err(InputError::ControlCharacter { field, at }),
        None => Ok(()),
    }
}

/// The name of one semaphore; one table item per name.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LockName(String);

impl LockName {
    pub fn new(name: impl Into<String>) -> Result<Self, InputError> {
        let name = name.into();
        if name.is_empty() {
            return Err(InputError::EmptyLockName);
        }
        if name.len() > MAX_LOCK_NAME_BYTES {
            return Err(InputError::LockNameTooLong { len: name.len() });
        }
        reject_control("lock name", &name)?;
        Ok(Self(name))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// Who holds a slot: in production the Step Functions execution ARN, so the sweeper can ask
/// `DescribeExecution` whether it still runs; any printable id for operators and tests.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct HolderId(String);

impl HolderId {
    pub fn new(id: impl Into<String>) -> Result<Self, InputError> {
        let id = id.into();
        if id.is_empty() {
            return Err(InputError::EmptyHolder);
        }
        if id.len() > MAX_HOLDER_BYTES {
            return Err(InputError::HolderTooLong { len: id.len() });
        }
        reject_control("holder", &id)?;
        Ok(Self(id))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// One logical acquire by a holder. Step Functions retries of the same acquire share it (so a
/// retry whose first attempt already landed finds the slot held, F5); a later acquire by the same
/// execution uses a new one (so a late retry of the old one can be fenced without fencing the
/// new one, F3).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AcquisitionId(String);

impl AcquisitionId {
    /// Used when the caller does not name an acquisition (the `semctl` default).
    pub const DEFAULT: &'static str = "default";

    pub fn new(id: impl Into<String>) -> Result<Self, InputError> {
        let id = id.into();
        if id.is_empty() {
            return Err(InputError::EmptyAcquisition);
        }
        if id.len() > MAX_ACQUISITION_BYTES {
            return Err(InputError::AcquisitionTooLong { len: id.len() });
        }
        // '#' is excluded so that "holder#acquisition" is an unambiguous slot key.
        if let Some(found) = id
            .chars()
            .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | ':' | '-')))
        {
            return Err(InputError::AcquisitionCharacter { found });
        }
        Ok(Self(id))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// How many holders a semaphore admits at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Limit(u32);

impl Limit {
    pub fn new(n: i64) -> Result<Self, InputError> {
        match u32::try_from(n) {
            Ok(n) if (1..=MAX_LIMIT).contains(&n) => Ok(Self(n)),
            _ => Err(InputError::InvalidLimit { got: n.to_string() }),
        }
    }

    /// Parses text such as a CLI argument or an environment variable: "5" is fine, "0", "-1",
    /// "2.5" and "five" are not.
    pub fn parse(text: &str) -> Result<Self, InputError> {
        let invalid = || InputError::InvalidLimit {
            got: format!("{text:?}"),
        };
        let n = text.trim().parse::<i64>().map_err(|_| invalid())?;
        Self::new(n).map_err(|_| invalid())
    }

    pub fn get(self) -> u32 {
        self.0
    }
}

/// How many of a lock's `limit` units one acquisition takes: 1 unless it asks for more (a big job
/// takes 4 of 10, a small one 1). The limit bounds the sum of the weights held.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Weight(u32);

impl Weight {
    pub const ONE: Self = Self(1);

    pub fn new(n: i64) -> Result<Self, InputError> {
        match u32::try_from(n) {
            Ok(n) if (1..=MAX_LIMIT).contains(&n) => Ok(Self(n)),
            _ => Err(InputError::InvalidWeight { got: n.to_string() }),
        }
    }

    /// Parses text such as a CLI argument: "4" is fine, "0", "-1", "1.5" and "four" are not.
    pub fn parse(text: &str) -> Result<Self, InputError> {
        let invalid = || InputError::InvalidWeight {
            got: format!("{text:?}"),
        };
        let n = text.trim().parse::<i64>().map_err(|_| invalid())?;
        Self::new(n).map_err(|_| invalid())
    }

    pub fn get(self) -> u32 {
        self.0
    }
}

impl Default for Weight {
    fn default() -> Self {
        Self::ONE
    }
}

/// A start-rate limit: at most this many acquisitions of the lock per second, enforced as a
/// least spacing between two starts (`1 / rate`), which DynamoDB checks when an acquire lands.
/// Kept as that spacing, in whole milliseconds (the resolution of the times in the item).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Rate {
    spacing_ms: u64,
}

impl Rate {
    /// The slowest rate accepted: one start a day.
    pub const MIN_PER_SECOND: f64 = 1.0 / 86_400.0;

    /// `per_second` acquisitions per second, from one a day to [`MAX_RATE`].
    pub fn per_second(per_second: f64) -> Result<Self, InputError> {
        if !per_second.is_finite() || !(Self::MIN_PER_SECOND..=MAX_RATE).contains(&per_second) {
            return Err(InputError::InvalidRate {
                got: per_second.to_string(),
            });
        }
        // Rounded up: the achieved rate never exceeds the one asked for.
        let spacing_ms = (1000.0 / per_second).ceil() as u64;
        Ok(Self {
            spacing_ms: spacing_ms.max(1),
        })
    }

    /// Parses text such as a CLI argument: "2", "0.5" are fine; "0", "-1", "inf", "fast" are not.
    pub fn parse(text: &str) -> Result<Self, InputError> {
        let invalid = || InputError::InvalidRate {
            got: format!("{text:?}"),
        };
        let n = text.trim().parse::<f64>().map_err(|_| invalid())?;
        Self::per_second(n).map_err(|_| invalid())
    }

    /// The rate kept as its spacing (as stored).
    pub fn from_spacing_ms(spacing_ms: u64) -> Result<Self, InputError> {
        let max = (1000.0 / Self::MIN_PER_SECOND).ceil() as u64;
        if (1..=max).contains(&spacing_ms) {
            Ok(Self { spacing_ms })
        } else {
            Err(InputError::InvalidRate {
                got: format!("one per {spacing_ms} ms"),
            })
        }
    }

    /// The least time between two starts.
    pub fn spacing_ms(self) -> u64 {
        self.spacing_ms
    }

    /// Starts per second this rate allows.
    pub fn as_per_second(self) -> f64 {
        1000.0 / self.spacing_ms as f64
    }
}

impl fmt::Display for Rate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/s", (self.as_per_second() * 1000.0).round() / 1000.0)
    }
}

/// How long a slot is held without a heartbeat (F13): a holder whose end nobody can see (an
/// Express execution, a Lambda function, a container, a script) takes its slot with a lease,
/// which its heartbeats renew; once it has passed unrenewed (by more than the clock skew), the
/// slot is taken back and the holder fenced. From 1 s to a day, whole milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Lease {
    ms: u64,
}

impl Lease {
    /// The shortest lease: a heartbeat a second is as often as one should be sent.
    pub const MIN_MS: u64 = 1_000;
    /// The longest: a holder that may go silent for longer should not hold a lease at all.
    pub const MAX_MS: u64 = 86_400_000;

    pub fn ms(ms: u64) -> Result<Self, InputError> {
        if (Self::MIN_MS..=Self::MAX_MS).contains(&ms) {
            Ok(Self { ms })
        } else {
            Err(InputError::InvalidLease {
                got: format!("{ms} ms"),
            })
        }
    }

    /// Parses whole or fractional seconds, such as a CLI argument: "30", "2.5".
    pub fn parse_seconds(text: &str) -> Result<Self, InputError> {
        let invalid = || InputError::InvalidLease {
            got: format!("{text:?}"),
        };
        let seconds = text.trim().parse::<f64>().map_err(|_| invalid())?;
        if !seconds.is_finite() || seconds <= 0.0 {
            return Err(invalid());
        }
        Self::ms((seconds * 1000.0).round() as u64).map_err(|_| invalid())
    }

    pub fn as_ms(self) -> u64 {
        self.ms
    }
}

impl fmt::Display for Lease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} s", self.ms as f64 / 1000.0)
    }
}

/// What one acquisition asks for: the lock's limit as it sees it, its weight, the lock's start
/// rate, and a lease on the slot. Each acquire (and each waiter's grant) is checked against its
/// own terms when it lands, and sets the lock's stored limit and rate to them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Terms {
    pub limit: Limit,
    pub weight: Weight,
    pub rate: Option<Rate>,
    /// `None`: held until released (or cleaned up, for an execution whose end can be seen).
    pub lease: Option<Lease>,
}

impl Terms {
    /// Weight `weight` of a lock of `limit`, at most `rate` starts per second: a weight above
    /// the limit is refused (it could never be granted).
    pub fn new(limit: Limit, weight: Weight, rate: Option<Rate>) -> Result<Self, InputError> {
        if weight.get() > limit.get() {
            return Err(InputError::WeightAboveLimit {
                weight: weight.get(),
                limit: limit.get(),
            });
        }
        Ok(Self {
            limit,
            weight,
            rate,
            lease: None,
        })
    }

    /// The same terms, the slot held under `lease` (`None`: until released).
    pub fn with_lease(self, lease: Option<Lease>) -> Self {
        Self { lease, ..self }
    }

    /// The largest sum of weights held that still leaves room for this acquisition.
    pub fn room(&self) -> u64 {
        u64::from(self.limit.get() - self.weight.get())
    }
}

/// Weight 1, no rate limit: a plain slot of `limit`.
impl From<Limit> for Terms {
    fn from(limit: Limit) -> Self {
        Self {
            limit,
            weight: Weight::ONE,
            rate: None,
            lease: None,
        }
    }
}

/// A lock's configuration by its operator (F14): its limit, the largest weight one acquisition
/// may take, and its start rate. An acquisition of a configured lock takes it on these terms,
/// whatever it asked for: no caller can raise the limit or the rate its operator set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LockConfig {
    pub limit: Limit,
    /// `None`: any weight up to the limit.
    pub max_weight: Option<Weight>,
    /// `None`: no start rate.
    pub rate: Option<Rate>,
}

impl LockConfig {
    /// A configuration; a largest weight above the limit is refused (nothing could take it).
    pub fn new(
        limit: Limit,
        max_weight: Option<Weight>,
        rate: Option<Rate>,
    ) -> Result<Self, InputError> {
        if let Some(max) = max_weight.filter(|max| max.get() > limit.get()) {
            return Err(InputError::MaxWeightAboveLimit {
                max_weight: max.get(),
                limit: limit.get(),
            });
        }
        Ok(Self {
            limit,
            max_weight,
            rate,
        })
    }

    /// The terms an acquisition of `weight` takes on `lock` so configured: the configured limit
    /// and rate; a weight above the configured largest (or the limit) is refused by name.
    pub fn terms(&self, lock: &LockName, weight: Weight) -> Result<Terms, InputError> {
        if let Some(max) = self.max_weight.filter(|max| weight.get() > max.get()) {
            return Err(InputError::WeightAboveConfigured {
                lock: lock.to_string(),
                weight: weight.get(),
                max_weight: max.get(),
            });
        }
        Terms::new(self.limit, weight, self.rate)
    }
}

/// What an acquisition takes on a lock configured with `config` (`None`: not configured, so
/// the terms it asked for): the one place where an operator's configuration wins over a
/// caller's terms.
pub fn terms_on(
    config: Option<&LockConfig>,
    lock: &LockName,
    asked: Terms,
) -> Result<Terms, InputError> {
    match config {
        Some(config) => Ok(config.terms(lock, asked.weight)?.with_lease(asked.lease)),
        None => Ok(asked),
    }
}

/// A Step Functions task token: what wakes a parked execution (`SendTaskSuccess`). A bearer
/// credential (whoever has it may complete or fail the task), so it is never printed: its
/// `Debug` shows its length and a digest, enough to tell two apart in a log or a trace.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TaskToken(String);

impl fmt::Debug for TaskToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use sha2::{Digest, Sha256};
        let digest = Sha256::digest(self.0.as_bytes());
        let short: String = digest[..4].iter().map(|b| format!("{b:02x}")).collect();
        write!(f, "TaskToken({} bytes, sha256 {short}…)", self.0.len())
    }
}

impl TaskToken {
    pub fn new(token: impl Into<String>) -> Result<Self, InputError> {
        let token = token.into();
        if token.is_empty() {
            return Err(InputError::Missing {
                field: "task_token",
                hint: "pass $$.Task.Token from a .waitForTaskToken task",
            });
        }
        if token.len() > MAX_TASK_TOKEN_BYTES {
            return Err(InputError::TaskTokenTooLong { len: token.len() });
        }
        reject_control("task_token", &token)?;
        Ok(Self(token))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

macro_rules! display_as_str {
    ($($t:ty),*) => {$(
        impl fmt::Display for $t {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }
    )*};
}
display_as_str!(LockName, HolderId, AcquisitionId);

impl fmt::Display for Limit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl fmt::Display for Weight {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn task_tokens_are_bounded_and_printable() {
        assert!(TaskToken::new("AQB8AAAAKgAAAAMAAAAA").is_ok());
        assert!(matches!(
            TaskToken::new(""),
            Err(InputError::Missing { .. })
        ));
        assert!(matches!(
            TaskToken::new("x".repeat(MAX_TASK_TOKEN_BYTES + 1)),
            Err(InputError::TaskTokenTooLong { .. })
        ));
        assert_eq!(
            TaskToken::new("a\nb"),
            Err(InputError::ControlCharacter {
                field: "task_token",
                at: 1
            })
        );
    }

    #[test]
    fn lock_names_are_bounded_and_printable() {
        assert_eq!(LockName::new(""), Err(InputError::EmptyLockName));
        assert_eq!(
            LockName::new("x".repeat(MAX_LOCK_NAME_BYTES + 1)),
            Err(InputError::LockNameTooLong {
                len: MAX_LOCK_NAME_BYTES + 1
            })
        );
        assert!(LockName::new("x".repeat(MAX_LOCK_NAME_BYTES)).is_ok());
        assert_eq!(
            LockName::new("a\nb"),
            Err(InputError::ControlCharacter {
                field: "lock name",
                at: 1
            })
        );
    }

    #[test]
    fn holders_accept_execution_arns_and_plain_ids() {
        let arn = "arn:aws:states:us-east-1:123456789012:execution:LockProtected:run-42";
        assert_eq!(HolderId::new(arn).unwrap().as_str(), arn);
        assert!(HolderId::new("exec-1").is_ok());
        assert_eq!(HolderId::new(""), Err(InputError::EmptyHolder));
        assert!(matches!(
            HolderId::new("h".repeat(MAX_HOLDER_BYTES + 1)),
            Err(InputError::HolderTooLong { .. })
        ));
    }

    #[test]
    fn acquisition_ids_cannot_contain_the_slot_key_separator() {
        assert!(AcquisitionId::new("3f1c2a9e-0000-4c4c-8d8d-123456789abc").is_ok());
        assert_eq!(
            AcquisitionId::new("a#b"),
            Err(InputError::AcquisitionCharacter { found: '#' })
        );
        assert_eq!(AcquisitionId::new(""), Err(InputError::EmptyAcquisition));
    }

    #[test]
    fn limits_are_positive_whole_numbers() {
        assert_eq!(Limit::new(5).unwrap().get(), 5);
        assert_eq!(Limit::parse(" 3 ").unwrap().get(), 3);
        for bad in ["0", "-1", "2.5", "five", "", "10001"] {
            let err = Limit::parse(bad).unwrap_err();
            assert!(
                matches!(err, InputError::InvalidLimit { .. }),
                "{bad:?} gave {err:?}"
            );
        }
        assert!(Limit::new(i64::MAX).is_err());
    }

    #[test]
    fn weights_are_positive_and_never_above_the_limit() {
        assert_eq!(Weight::parse("4").unwrap().get(), 4);
        for bad in ["0", "-1", "1.5", "four", "", "10001"] {
            assert!(
                matches!(Weight::parse(bad), Err(InputError::InvalidWeight { .. })),
                "{bad:?}"
            );
        }
        let limit = Limit::new(3).unwrap();
        assert_eq!(
            Terms::new(limit, Weight::new(4).unwrap(), None),
            Err(InputError::WeightAboveLimit {
                weight: 4,
                limit: 3
            })
        );
        let terms = Terms::new(limit, Weight::new(3).unwrap(), None).unwrap();
        assert_eq!(terms.room(), 0);
        assert_eq!(Terms::from(limit).room(), 2);
    }

    #[test]
    fn rates_are_finite_positive_and_kept_as_a_spacing_rounded_up() {
        assert_eq!(Rate::parse("2").unwrap().spacing_ms(), 500);
        assert_eq!(Rate::parse("0.5").unwrap().spacing_ms(), 2_000);
        assert_eq!(Rate::parse("3").unwrap().spacing_ms(), 334, "never faster");
        assert_eq!(Rate::parse("1000").unwrap().spacing_ms(), 1);
        assert_eq!(Rate::parse("2").unwrap().to_string(), "2/s");
        for bad in ["0", "-1", "inf", "NaN", "1001", "0.00001", "fast", ""] {
            assert!(
                matches!(Rate::parse(bad), Err(InputError::InvalidRate { .. })),
                "{bad:?}"
            );
        }
        assert_eq!(
            Rate::from_spacing_ms(500).unwrap(),
            Rate::per_second(2.0).unwrap()
        );
        assert!(Rate::from_spacing_ms(0).is_err());
    }
}
