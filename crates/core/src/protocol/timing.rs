//! How long fences are kept, and why that is enough: [`Timing`].

use std::time::Duration;

/// The two durations the fences are kept by.
///
/// - `horizon`: how long after it was requested an acquire may still land. An acquire's request
///   time is when its caller decided to ask (the Step Functions state's entry time), which comes
///   before any fence the acquire must meet, however long Lambda took to start it or the network
///   to deliver it. A write that lands later than `horizon` after its request is refused if a
///   rotation happened in between, and answered `Expired`: the caller asks again.
/// - `clock_skew`: how far apart two hosts' clocks may be (Step Functions, Lambda, an
///   operator's machine).
///
/// The fence window, the least time between two rotations, is `horizon + clock_skew`. Why that is
/// enough: a fence F written at time w (real time) and an acquire A requested at e < w. F is
/// dropped by the second rotation after w; the first stored its time r1 > w - skew/2 (by its
/// clock), and the second may run only once its clock reads r1 + window, so it stores
/// r2 > w - skew/2 + window. A's condition needs the last rotation before e + horizon, and
/// e + horizon < w + skew/2 + horizon (A's clock). With window = horizon + skew, r2 is past it:
/// A is refused by the rotation whenever F is gone, and by F while it is there. Nothing here
/// depends on how long a request can be delayed in the network, or on how long Lambda takes to
/// start a function: only on the clocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timing {
    pub horizon: Duration,
    pub clock_skew: Duration,
}

impl Timing {
    /// How long after its request an acquire may land by default: plenty for a Lambda's cold
    /// start and a few Step Functions retries of its Task.
    pub const DEFAULT_HORIZON: Duration = Duration::from_secs(8);
    /// The clock skew allowed for by default. Lambda and Step Functions hosts keep time with the
    /// Amazon Time Sync Service, to well under a millisecond; two seconds is a wide margin.
    pub const DEFAULT_CLOCK_SKEW: Duration = Duration::from_secs(2);

    /// Horizons accepted from configuration, in whole seconds: long enough for a cold start,
    /// short enough that fences stay few (the item carries those of one or two windows).
    pub const HORIZON_RANGE: std::ops::RangeInclusive<u64> = 1..=300;
    /// Clock skews allowed for, in whole seconds. Zero is left to tests and the model checker:
    /// no two hosts agree exactly.
    pub const CLOCK_SKEW_RANGE: std::ops::RangeInclusive<u64> = 1..=60;

    /// The least time between two rotations of the fences: every fence is kept at least this
    /// long, and at most about twice as long.
    pub fn window(&self) -> Duration {
        self.horizon + self.clock_skew
    }
}

impl Default for Timing {
    fn default() -> Self {
        Self {
            horizon: Self::DEFAULT_HORIZON,
            clock_skew: Self::DEFAULT_CLOCK_SKEW,
        }
    }
}

pub(crate) fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}
