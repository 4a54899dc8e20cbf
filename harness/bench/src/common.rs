//! What every part of the bench shares: names that look like production's, the protocols
//! compared, the wait between polls of a full lock, and the executions and slots the Lambdas
//! and the sweeper are measured on.

use std::time::Duration;

use anyhow::{bail, Context, Result};
use local_aws::names::{id, limit};
use semaphore_core::{AcquireOutcome, DynamoStore, LockName, Semaphore};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// How long the bench's execution ARNs are: the state machine `LockProtected` in a 12-digit
/// account and a 31-character execution name. The holder map is keyed by the ARN, so item sizes
/// depend on it; BENCHMARKS.md states sizes for this length.
pub const ARN_LEN: usize = 93;

/// An execution ARN of [`ARN_LEN`] characters (the holder id the state machine sends), unique
/// per run: `tag` and `n` say where it comes from, random hex fills the rest of the name.
pub fn execution_arn(tag: &str, n: usize) -> String {
    let prefix =
        format!("arn:aws:states:us-east-1:123456789012:execution:LockProtected:{tag}-{n:06}-");
    // At least 8 random digits, so that ARNs of the same tag and number still differ between
    // runs on one table.
    let fill = ARN_LEN.saturating_sub(prefix.len()).max(8);
    prefix + &hex(fill)
}

fn hex(n: usize) -> String {
    (0..n)
        .map(|_| char::from_digit(fastrand::u32(0..16), 16).unwrap_or('0'))
        .collect()
}

/// An acquisition id as `States.UUID()` makes it.
pub fn uuid() -> String {
    format!("{}-{}-4{}-8{}-{}", hex(8), hex(4), hex(3), hex(3), hex(12))
}

/// Takes a slot of `lock` for each (holder, acquisition), as the acquire function would have.
pub async fn take_slots(
    sem: &Semaphore<DynamoStore>,
    lock: &LockName,
    holders: &[(String, String)],
) -> Result<Vec<u64>> {
    let mut tokens = Vec::with_capacity(holders.len());
    for (holder, acquisition) in holders {
        match sem
            .acquire(lock, &id(holder, acquisition), limit(1000))
            .await
            .with_context(|| format!("taking a slot of {lock}"))?
        {
            AcquireOutcome::Acquired { token, .. } => tokens.push(token.0),
            other => bail!("taking a slot of {lock} gave {other:?}"),
        }
    }
    Ok(tokens)
}

/// A state machine `<name>-<random>` of `definition` on the local Step Functions: its ARN.
pub async fn state_machine(
    sfn: &aws_sdk_sfn::Client,
    name: &str,
    definition: &Value,
    role: &str,
) -> Result<String> {
    Ok(sfn
        .create_state_machine()
        .name(format!("{name}-{}", &uuid()[..8]))
        .definition(definition.to_string())
        .role_arn(role)
        .send()
        .await
        .with_context(|| format!("create the state machine {name}"))?
        .state_machine_arn()
        .to_owned())
}

/// `n` executions of `machine` started with `input`: their ARNs.
pub async fn start_executions(
    sfn: &aws_sdk_sfn::Client,
    machine: &str,
    input: &Value,
    n: usize,
) -> Result<Vec<String>> {
    let mut arns = Vec::with_capacity(n);
    for _ in 0..n {
        arns.push(local_aws::sfn::start_execution(sfn, machine, &uuid(), input).await?);
    }
    Ok(arns)
}

/// The protocols compared, all against the same server in the same run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Proto {
    /// Our protocol exactly as the deployed Lambdas run it: `Semaphore` with the default
    /// `Timing`, one write per call, no read. A `Semaphore` keeps nothing between calls, so one
    /// per contender is the same as one per call (a Lambda invocation, a `semctl` process).
    Ours,
    /// The original AWS sample's protocol (`local_aws::sample::Sample`).
    Sample,
}

impl Proto {
    pub fn label(self) -> &'static str {
        match self {
            Self::Ours => "ours (as the Lambdas)",
            Self::Sample => "AWS sample",
        }
    }
}

/// How contenders behave: how long they hold a slot and how they wait before polling a full lock
/// again. The same for every protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Regime {
    /// The lock-protected state machine with time scaled down: one second of it lasts `unit_ms`.
    /// The work holds the slot 1 s (its default `work_seconds`), and after acquire attempt `a`
    /// the wait is a whole number of seconds drawn uniformly from 1..=a+4 (from 1..=15 after
    /// the tenth), as `States.MathRandom` draws it in `lock-protected.asl.json`.
    Deployment { unit_ms: u64 },
    /// A stress test: the slot is held `hold_ms` and a full lock is polled again after a
    /// full-jitter wait in [0, min(64 ms, 2 ms * 2^polls)]. The local server saturates.
    Saturated { hold_ms: u64 },
}

impl Regime {
    pub fn label(self) -> String {
        match self {
            Self::Deployment { unit_ms } => format!(
                "deployment-shaped (1 s of the state machine = {unit_ms} ms: hold {unit_ms} ms, waits 1..(a+4) x {unit_ms} ms)"
            ),
            Self::Saturated { hold_ms } => {
                format!("saturated (hold {hold_ms} ms, polls after 0..64 ms full jitter)")
            }
        }
    }

    pub fn short(self) -> &'static str {
        match self {
            Self::Deployment { .. } => "deployment-shaped",
            Self::Saturated { .. } => "saturated",
        }
    }

    pub fn hold(self) -> Duration {
        match self {
            Self::Deployment { unit_ms } => Duration::from_millis(unit_ms),
            Self::Saturated { hold_ms } => Duration::from_millis(hold_ms),
        }
    }

    /// The wait after `attempts` acquire attempts (1 after the first) found the lock full.
    pub fn poll_wait(self, attempts: u32) -> Duration {
        match self {
            Self::Deployment { unit_ms } => {
                let most = if attempts <= 10 {
                    u64::from(attempts) + 4
                } else {
                    15
                };
                Duration::from_millis(unit_ms * fastrand::u64(1..=most))
            }
            Self::Saturated { .. } => {
                let ceiling_us = (2_000u64 << attempts.saturating_sub(1).min(5)).min(64_000);
                Duration::from_micros(fastrand::u64(0..=ceiling_us))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_have_the_lengths_sizes_are_stated_for() {
        for tag in [
            "w0",
            "w49",
            "cycle",
            "quiet",
            "ended",
            "uncontended",
            "acquire",
        ] {
            assert_eq!(execution_arn(tag, 123).len(), ARN_LEN, "{tag}");
        }
        assert_eq!(uuid().len(), 36);
    }
}
