//! Validated inputs. Every value that crosses into the protocol from outside (a state machine, an
//! operator, an EventBridge event) is parsed into one of these types first, so a bad value is a
//! named [`InputError`] before anything touches the table (fault F6).

use std::fmt;

/// Longest lock name accepted, in bytes. Lock names are DynamoDB partition keys (2048 bytes at
/// most); 256 keeps the item small and is far more than a readable name needs.
pub const MAX_LOCK_NAME_BYTES: usize = 256;
/// Longest holder id accepted, in bytes. Step Functions execution ARNs are at most about 260
/// bytes (80-character machine and execution names); 512 leaves room for Express ARNs and for
/// operator ids.
pub const MAX_HOLDER_BYTES: usize = 512;
/// Longest acquisition id accepted, in bytes. `States.UUID()` yields 36.
pub const MAX_ACQUISITION_BYTES: usize = 128;
/// Largest concurrency limit accepted. Every holder is a few hundred bytes of the one semaphore
/// item, and a DynamoDB item is at most 400 KB.
pub const MAX_LIMIT: u32 = 1000;

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
    #[error("task token is {len} bytes long; the maximum is {max} bytes", max = crate::queue::MAX_TASK_TOKEN_BYTES)]
    TaskTokenTooLong { len: usize },
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

    pub fn default_id() -> Self {
        Self(Self::DEFAULT.to_owned())
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

#[cfg(test)]
mod tests {
    use super::*;

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
        for bad in ["0", "-1", "2.5", "five", "", "1001"] {
            let err = Limit::parse(bad).unwrap_err();
            assert!(
                matches!(err, InputError::InvalidLimit { .. }),
                "{bad:?} gave {err:?}"
            );
        }
        assert!(Limit::new(i64::MAX).is_err());
    }
}
