//! What the store does about DynamoDB's answers that are not answers to the write itself (F10):
//! an attempt whose answer was lost (the SDK sends it again; the first may have landed), a
//! transaction throttled or in conflict, and the one client request token of a transaction.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use aws_sdk_dynamodb::config::interceptors::FinalizerInterceptorContextRef;
use aws_sdk_dynamodb::config::retry::RetryConfig;
use aws_sdk_dynamodb::config::{ConfigBag, Intercept, RuntimeComponents};
use aws_sdk_dynamodb::error::BoxError;

/// Notes whether an attempt of one request went without an answer: no response (a timeout, a
/// connection closed) or a server error (5xx: "the request may or may not have succeeded").
/// The SDK then sends the same request again; if the first attempt landed, the answer the
/// caller gets is to the second, and a conditional write is refused by its own first attempt.
#[derive(Debug, Clone, Default)]
pub(super) struct LostAnswers(Arc<AtomicBool>);

impl LostAnswers {
    pub(super) fn happened(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }
}

impl Intercept for LostAnswers {
    fn name(&self) -> &'static str {
        "LostAnswers"
    }

    fn read_after_attempt(
        &self,
        context: &FinalizerInterceptorContextRef<'_>,
        _runtime_components: &RuntimeComponents,
        _cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        let answered = context
            .response()
            .is_some_and(|response| response.status().as_u16() < 500);
        if !answered {
            self.0.store(true, Ordering::SeqCst);
        }
        Ok(())
    }
}

/// The SDK's standard retry mode, where the client's config names none: 3 attempts, backoff
/// from 1 s doubling up to 20 s (`aws_smithy_types::retry::RetryConfig::standard`).
fn standard() -> RetryConfig {
    RetryConfig::standard()
}

/// Attempts of each request by a holder that no Step Functions `Retry` stands behind (`semctl`,
/// a program holding a leased slot), unless it says otherwise.
pub const HOLDER_ATTEMPTS: u32 = 10;

/// The retries of such a holder: the SDK's standard mode (exponential backoff with full jitter,
/// as AWS advises for DynamoDB) with `max_attempts` attempts and at most 5 s between two. Three
/// attempts (the SDK's default) give up too soon under throttling: with 15% of writes throttled,
/// three in a row come once in 300 writes, and a release that gives up leaves its slot held
/// until a cleanup. Every write here is safe to send again (F10), so waiting longer costs only
/// time.
pub fn holder_retries(max_attempts: u32) -> RetryConfig {
    RetryConfig::standard()
        .with_max_attempts(max_attempts.max(1))
        .with_max_backoff(Duration::from_secs(5))
}

/// How many times in all a transaction cancelled for throttling is sent: as many as the SDK
/// sends a throttled request (the client's `max_attempts`, 3 in standard mode).
pub(super) fn throttle_attempts(config: Option<&RetryConfig>) -> u32 {
    config
        .cloned()
        .unwrap_or_else(standard)
        .max_attempts()
        .max(1)
}

/// The wait before sending again a transaction that DynamoDB cancelled for throttling
/// (`ThrottlingError` among its cancellation reasons) for the `throttled`-th time (from 0): the
/// SDK's standard backoff for a throttle, `jitter * min(initial * 2^throttled, max)`, from the
/// client's retry config, with `jitter` drawn from [0, 1) ("full jitter"). The SDK does not
/// retry such a cancellation itself (it is a `TransactionCanceledException`, not a throttling
/// error code), so the store does, as the SDK would a throttle.
pub fn throttle_backoff(config: Option<&RetryConfig>, throttled: u32, jitter: f64) -> Duration {
    let config = config.cloned().unwrap_or_else(standard);
    let exponential = config
        .initial_backoff()
        .checked_mul(2u32.saturating_pow(throttled))
        .unwrap_or(Duration::MAX)
        .min(config.max_backoff());
    exponential.mul_f64(jitter.clamp(0.0, 1.0))
}

/// How often a transaction is sent again when DynamoDB cancels it for a conflict with another
/// write of the same items in flight (nothing was written), or answers that it is still in
/// progress.
pub(super) const CONFLICT_ROUNDS: u32 = 5;

/// How often the keys a `BatchGetItem` left unread are asked for again: DynamoDB leaves keys
/// unprocessed when the table is throttled or the answer passes 16 MB, and asks callers to send
/// them again with a backoff.
pub(super) const UNREAD_KEY_ROUNDS: u32 = 5;

/// The wait before sending again, the `round`-th time (from 0), a write DynamoDB rejected for a
/// conflict with a transaction in flight, or keys it left unread: a few to a few hundred ms,
/// drawn at random so that callers that collided do not collide again.
pub(super) async fn backoff(round: u32) {
    let ms = fastrand::u64(5..=(20u64 << round.min(4)));
    tokio::time::sleep(std::time::Duration::from_millis(ms)).await;
}

/// A new client request token for a transaction: 32 hex digits (DynamoDB takes 1 to 36
/// characters).
pub(super) fn new_token() -> String {
    format!("{:016x}{:016x}", fastrand::u64(..), fastrand::u64(..))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_throttled_transaction_backs_off_as_the_sdk_backs_off_a_throttle() {
        let standard = RetryConfig::standard();
        // Full jitter of 1 s, 2 s, 4 s ... capped at 20 s.
        assert_eq!(
            throttle_backoff(Some(&standard), 0, 1.0),
            Duration::from_secs(1)
        );
        assert_eq!(throttle_backoff(None, 1, 1.0), Duration::from_secs(2));
        assert_eq!(throttle_backoff(None, 1, 0.5), Duration::from_secs(1));
        assert_eq!(throttle_backoff(None, 10, 1.0), Duration::from_secs(20));
        assert_eq!(throttle_backoff(None, 40, 1.0), Duration::from_secs(20));
        assert_eq!(throttle_backoff(None, 3, 0.0), Duration::ZERO);
        let quick = RetryConfig::standard()
            .with_initial_backoff(Duration::from_millis(10))
            .with_max_backoff(Duration::from_millis(50));
        assert_eq!(
            throttle_backoff(Some(&quick), 2, 1.0),
            Duration::from_millis(40)
        );
        assert_eq!(throttle_attempts(None), 3);
        assert_eq!(
            throttle_attempts(Some(&RetryConfig::standard().with_max_attempts(5))),
            5
        );
    }

    #[test]
    fn tokens_are_new_and_fit_dynamodb() {
        let (a, b) = (new_token(), new_token());
        assert_ne!(a, b);
        assert_eq!(a.len(), 32);
    }
}
