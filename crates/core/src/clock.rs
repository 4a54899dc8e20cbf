//! Wall-clock time, injectable so that fence expiry and start rates can be tested without
//! sleeping.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// A wait for [`Clock::sleep_until`].
pub type Sleep<'a> = Pin<Box<dyn Future<Output = ()> + Send + 'a>>;

pub trait Clock: Send + Sync + std::fmt::Debug {
    /// Milliseconds since the Unix epoch.
    fn now_ms(&self) -> u64;

    /// Returns once the clock reads `at_ms` or later.
    fn sleep_until(&self, at_ms: u64) -> Sleep<'_>;
}

#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> u64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
            .unwrap_or(0)
    }

    fn sleep_until(&self, at_ms: u64) -> Sleep<'_> {
        let wait = at_ms.saturating_sub(self.now_ms());
        Box::pin(tokio::time::sleep(std::time::Duration::from_millis(wait)))
    }
}

/// `ms` after the Unix epoch as RFC 3339 in UTC, always with three fractional digits
/// (`2026-12-02T21:00:00.500Z`), so every timestamp a notice or event carries has one width and
/// sorts as text.
pub fn rfc3339_millis(ms: u64) -> String {
    let days = ms / 86_400_000;
    let in_day = ms % 86_400_000;
    let (year, month, day) = civil_from_days(days);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        in_day / 3_600_000,
        in_day / 60_000 % 60,
        in_day / 1_000 % 60,
        in_day % 1_000
    )
}

/// Proleptic Gregorian date of a day count since 1970-01-01 (Howard Hinnant's algorithm).
fn civil_from_days(days: u64) -> (u64, u64, u64) {
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z % 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + u64::from(month <= 2);
    (year, month, day)
}

/// A clock that moves only when told to.
#[derive(Debug, Default)]
pub struct ManualClock(AtomicU64);

impl ManualClock {
    pub fn new(now_ms: u64) -> Self {
        Self(AtomicU64::new(now_ms))
    }

    pub fn advance_ms(&self, ms: u64) {
        self.0.fetch_add(ms, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> u64 {
        self.0.load(Ordering::SeqCst)
    }

    /// Moves the clock to `at_ms` (if it is behind) at once.
    fn sleep_until(&self, at_ms: u64) -> Sleep<'_> {
        self.0.fetch_max(at_ms, Ordering::SeqCst);
        Box::pin(std::future::ready(()))
    }
}

#[cfg(test)]
mod tests {
    use super::rfc3339_millis;

    #[test]
    fn rfc3339_has_one_width_whatever_the_milliseconds() {
        assert_eq!(rfc3339_millis(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339_millis(500), "1970-01-01T00:00:00.500Z");
        assert_eq!(rfc3339_millis(1_000), "1970-01-01T00:00:01.000Z");
        // 2024-02-29 (leap day) 23:59:59.999, and the millisecond after it.
        assert_eq!(
            rfc3339_millis(1_709_251_199_999),
            "2024-02-29T23:59:59.999Z"
        );
        assert_eq!(
            rfc3339_millis(1_709_251_200_000),
            "2024-03-01T00:00:00.000Z"
        );
        assert_eq!(
            rfc3339_millis(1_798_761_600_050),
            "2027-01-01T00:00:00.050Z"
        );
        assert_eq!(
            rfc3339_millis(4_107_542_400_000),
            "2100-03-01T00:00:00.000Z"
        );
    }
}
