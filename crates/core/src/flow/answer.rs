//! The acquire answer: what a caller gets back once it holds a slot (or is in line), and the
//! work the lock-protected machine starts under the slot. A parked waiter's record keeps the
//! answer it will get ([`crate::flow::acquire::Request::waiting_answer`]) as JSON text, and the hand-off that grants it
//! sends it with the slot filled in. Its fields are in docs/using.md ("The answer").

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::item::Identity;

/// What an allowed work ARN names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WorkKind {
    /// `arn:<partition>:states:<region>:<account>:stateMachine:<name>[:<version or alias>]`,
    /// started as the child execution.
    StateMachine,
    /// `arn:<partition>:lambda:<region>:<account>:function:<name>[:<version or alias>]`, run by
    /// the work-function runner machine as the child execution.
    Function,
}

impl WorkKind {
    /// The kind of resource `arn` names, from its form; `None` if it is neither.
    pub fn of(arn: &str) -> Option<Self> {
        let parts: Vec<&str> = arn.split(':').collect();
        if !(7..=8).contains(&parts.len())
            || parts[0] != "arn"
            || parts.iter().skip(1).any(|p| p.is_empty())
        {
            return None;
        }
        match (parts[2], parts[5]) {
            ("states", "stateMachine") => Some(Self::StateMachine),
            ("lambda", "function") => Some(Self::Function),
            _ => None,
        }
    }

    /// The form of an ARN of this kind, for messages.
    pub fn form(self) -> &'static str {
        match self {
            Self::StateMachine => "arn:<partition>:states:<region>:<account>:stateMachine:<name>",
            Self::Function => "arn:<partition>:lambda:<region>:<account>:function:<name>",
        }
    }
}

/// The work an acquire resolved to.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Work {
    /// The state machine or Lambda function to run, as the input or `DEFAULT_WORK` named it.
    pub arn: String,
    pub kind: WorkKind,
    /// The state machine the lock-protected machine starts: `arn` itself, or for a Lambda
    /// function the runner (which invokes `arn`).
    pub state_machine: String,
}

/// The name of the work's child execution for an acquisition: the same for every attempt and
/// poll of one acquisition, so a redrive into the work after its slot was freed meets the name
/// of the child that already ran (Step Functions refuses to start a second execution with that
/// name). Readable and within Step Functions' rules (at most 80 characters of `0-9 A-Z a-z - _`):
/// the first 40 characters of the holder's execution name (its ARN's last part), `-`, and 16 hex
/// digits of SHA-256 of `holder#acquisition` (the slot key), which tell two holders apart.
pub fn child_execution_name(identity: &Identity) -> String {
    const READABLE: usize = 40;
    let execution = identity
        .holder
        .as_str()
        .rsplit(':')
        .next()
        .unwrap_or_default();
    // Anything outside CloudWatch's safe set becomes '-': the digest, not this part, makes the
    // name unique.
    let readable: String = execution
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '-'
            }
        })
        .take(READABLE)
        .collect();
    let digest = Sha256::digest(identity.slot_key().as_bytes());
    let hex: String = digest[..8].iter().map(|b| format!("{b:02x}")).collect();
    if readable.is_empty() {
        hex
    } else {
        format!("{readable}-{hex}")
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// A slot was taken for this execution now.
    Acquired,
    /// It held its slot already (granted while it checked, or an earlier attempt's write
    /// landed).
    AlreadyHeld,
    /// In line: the task completes when a slot is handed to it.
    Queued,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Acquired => "acquired",
            Self::AlreadyHeld => "already_held",
            Self::Queued => "queued",
        }
    }
}

/// What the work gets under `semaphore` in its input (merged into the execution input).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SemaphoreContext {
    pub lock: String,
    /// `null` until a slot is held (the work runs only with one).
    pub fencing_token: Option<u64>,
    pub holder: String,
    pub acquisition: String,
    /// The Lambda function the work-function runner invokes; absent for state machine work.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub function: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkContext {
    pub semaphore: SemaphoreContext,
}

/// The child execution the lock-protected machine starts once the slot is held.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkAnswer {
    /// The user's state machine, or the work-function runner for a Lambda function.
    pub state_machine: String,
    /// The child execution's name: deterministic per acquisition (the redrive guard).
    pub name: String,
    /// Merged into the execution input to make the work's input.
    pub context: WorkContext,
}

/// The acquire function's answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AcquireAnswer {
    /// True when this execution holds a slot now (newly taken or already held).
    pub acquired: bool,
    pub outcome: Outcome,
    /// The fencing token of the held slot; `null` while in line.
    pub token: Option<u64>,
    /// Slots held now, as the write that took this one saw them; `null` while in line, or when
    /// a hand-off granted the slot.
    pub count: Option<usize>,
    /// The limit the request asked for (the operator's, on a lock it configured).
    pub limit: u32,
    /// The weight the request asked for (1 unless it named one).
    pub weight: u32,
    /// The start rate the request asked for, acquisitions per second; `null`: none.
    pub rate: Option<f64>,
    pub lock: String,
    pub holder: String,
    pub acquisition: String,
    /// The name for a child execution run under this acquisition (as `work.name`): a caller's own
    /// machine that starts its work with `startExecution.sync:2` names it so, which makes a
    /// redrive into the work fail instead of running it again without a slot.
    pub child_name: String,
    /// When the execution was put in line (RFC 3339): its place. `null` if it never waited.
    pub queued_at: Option<String>,
    /// The work to run with the slot (the lock-protected machine's); `null` otherwise.
    pub work: Option<WorkAnswer>,
}

impl AcquireAnswer {
    /// The answer as the task's output (or a waiter's record) keeps it.
    pub fn to_json(&self) -> String {
        // Strings, numbers and options only: nothing here can fail to serialize.
        serde_json::to_string(self).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::input::{AcquisitionId, HolderId};

    const HOLDER: &str = "arn:aws:states:us-east-1:123456789012:execution:LockProtected:run-1";
    const MINE: &str = "arn:aws:states:us-east-1:123456789012:stateMachine:mine";
    const FUNCTION: &str = "arn:aws:lambda:us-east-1:123456789012:function:mine";

    #[test]
    fn child_names_are_deterministic_short_and_safe() {
        let id = |holder: &str, acquisition: &str| {
            Identity::new(
                HolderId::new(holder).unwrap(),
                AcquisitionId::new(acquisition).unwrap(),
            )
        };
        let name = child_execution_name(&id(HOLDER, "r0"));
        assert_eq!(name, child_execution_name(&id(HOLDER, "r0")));
        assert!(name.starts_with("run-1-"), "{name}");
        assert_eq!(name.len(), "run-1-".len() + 16);
        assert_ne!(name, child_execution_name(&id(HOLDER, "r1")));
        let long = format!(
            "arn:aws:states:us-east-1:123456789012:execution:M:{}",
            "é x".repeat(40)
        );
        let name = child_execution_name(&id(&long, "r0"));
        assert_eq!(name.len(), 40 + 1 + 16, "{name}");
        assert!(name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_'));
        assert_eq!(child_execution_name(&id("x:", "a")).len(), 16);
    }

    #[test]
    fn work_arns_are_told_apart_by_form() {
        assert_eq!(WorkKind::of(MINE), Some(WorkKind::StateMachine));
        assert_eq!(
            WorkKind::of(&format!("{MINE}:prod")),
            Some(WorkKind::StateMachine)
        );
        assert_eq!(WorkKind::of(FUNCTION), Some(WorkKind::Function));
        assert_eq!(
            WorkKind::of(&format!("{FUNCTION}:$LATEST")),
            Some(WorkKind::Function)
        );
        for bad in [
            "mine",
            "arn:aws:states:us-east-1:123456789012:execution:mine:x",
            "arn:aws:states:us-east-1::stateMachine:mine",
            "arn:aws:s3:::bucket",
        ] {
            assert_eq!(WorkKind::of(bad), None, "{bad}");
        }
    }
}
