//! What every part of the bench shares: names that look like production's, the protocol
//! variants compared, and the wait between polls of a full lock.

use std::time::Duration;

use serde::Serialize;

/// An execution ARN of the realistic length (the holder id the state machine sends).
pub fn execution_arn(tag: &str, n: usize) -> String {
    format!(
        "arn:aws:states:us-east-1:123456789012:execution:LockProtected:{tag}-{n:06}-{:08x}",
        fastrand::u32(..)
    )
}

/// An acquisition id as `States.UUID()` makes it.
pub fn uuid() -> String {
    let hex = |n: usize| -> String {
        (0..n)
            .map(|_| char::from_digit(fastrand::u32(0..16), 16).unwrap_or('0'))
            .collect()
    };
    format!("{}-{}-4{}-8{}-{}", hex(8), hex(4), hex(3), hex(3), hex(12))
}

/// The protocols compared, all against the same server in the same run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Proto {
    /// Our protocol with `Semaphore`'s defaults (the item cache on): a long-lived process.
    Ours,
    /// Our protocol reading before every call's first write (item cache off), as the acquire,
    /// release and cleanup Lambda functions run it.
    OursReadFirst,
    /// The original AWS sample's protocol (`semaphore_tests::reference::SampleProtocol`).
    Reference,
}

impl Proto {
    pub fn label(self) -> &'static str {
        match self {
            Self::Ours => "ours (item cache, default)",
            Self::OursReadFirst => "ours (read first, as the Lambdas)",
            Self::Reference => "AWS sample (reference)",
        }
    }
}

/// How contenders behave: how long they hold a slot and how they wait before polling a full lock
/// again. The same for every protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
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
