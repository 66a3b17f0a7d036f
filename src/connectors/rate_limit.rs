//! Honouring a provider's rate limit: parsing when it resets and retrying up to a bound
//! (a `backon` retry, as every retry of threadgate: see [`crate::retry`]).

use std::future::Future;
use std::time::Duration;

use backon::{ConstantBuilder, Retryable as _};
use chrono::{DateTime, Utc};
use reqwest::header::HeaderMap;

use super::ConnectorError;

/// How long to wait when a provider says "too many requests" without saying until when.
pub(crate) const DEFAULT_RETRY_AFTER: Duration = Duration::from_secs(1);

/// The bound on retrying rate-limited requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RateLimitRetry {
    /// How many times a rate-limited request is sent again before giving up.
    pub max_retries: u32,
    /// The longest single wait accepted; a provider asking for more gives up at once.
    pub max_wait: Duration,
}

impl Default for RateLimitRetry {
    fn default() -> Self {
        Self {
            max_retries: 3,
            max_wait: Duration::from_secs(60),
        }
    }
}

impl RateLimitRetry {
    /// Never retry: a rate limit is returned to the caller at once.
    pub const NONE: Self = Self {
        max_retries: 0,
        max_wait: Duration::ZERO,
    };
}

/// Runs `attempt`, and while it fails with [`ConnectorError::RateLimited`] sleeps for
/// the provider's `retry_after` and runs it again, up to `policy`'s bound. A rate-limited
/// request did not happen, so retrying it is safe even for writes. Any other result is
/// returned as is; when the bound is reached the last `RateLimited` is returned.
pub async fn retry_rate_limited<T, F, Fut>(
    policy: RateLimitRetry,
    attempt: F,
) -> Result<T, ConnectorError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, ConnectorError>>,
{
    let bound = usize::try_from(policy.max_retries).unwrap_or(usize::MAX);
    let mut retries = 0u32;
    attempt
        .retry(ConstantBuilder::default().with_max_times(bound))
        .when(|e| matches!(e, ConnectorError::RateLimited { retry_after } if *retry_after <= policy.max_wait))
        // The wait is the provider's, as long as the bound leaves a retry.
        .adjust(|e, left| match e {
            ConnectorError::RateLimited { retry_after } => left.map(|_| *retry_after),
            _ => None,
        })
        .notify(|_, wait| {
            tracing::debug!(
                wait_ms = crate::clock::ms_u64(wait),
                retries,
                "rate limited, waiting before retrying"
            );
            retries += 1;
        })
        .await
}

/// How long to wait according to a response's headers: `x-ratelimit-reset` (an
/// RFC 3339 time as Plain sends it, or Unix seconds as GitHub sends it), then
/// `retry-after` (seconds), then [`DEFAULT_RETRY_AFTER`].
pub(crate) fn retry_after_from_headers(headers: &HeaderMap, now: DateTime<Utc>) -> Duration {
    let header = |name: &str| headers.get(name).and_then(|value| value.to_str().ok());
    if let Some(reset) = header("x-ratelimit-reset").and_then(|v| parse_reset(v.trim(), now)) {
        return reset;
    }
    if let Some(seconds) = header("retry-after").and_then(|v| v.trim().parse::<u64>().ok()) {
        return Duration::from_secs(seconds);
    }
    DEFAULT_RETRY_AFTER
}

/// The wait until `reset`: an RFC 3339 time, Unix seconds or milliseconds, or (for
/// small numbers) a number of seconds from now. A reset in the past means no wait.
fn parse_reset(reset: &str, now: DateTime<Utc>) -> Option<Duration> {
    let until = |at: DateTime<Utc>| (at - now).to_std().unwrap_or(Duration::ZERO);
    if let Ok(at) = DateTime::parse_from_rfc3339(reset) {
        return Some(until(at.with_timezone(&Utc)));
    }
    let number: i64 = reset.parse().ok()?;
    const UNIX_MILLIS_FLOOR: i64 = 100_000_000_000;
    const UNIX_SECONDS_FLOOR: i64 = 1_000_000_000;
    if number >= UNIX_MILLIS_FLOOR {
        return DateTime::from_timestamp_millis(number).map(until);
    }
    if number >= UNIX_SECONDS_FLOOR {
        return DateTime::from_timestamp(number, 0).map(until);
    }
    u64::try_from(number).ok().map(Duration::from_secs)
}

#[cfg(test)]
mod tests {
    use super::*;
    use reqwest::header::HeaderValue;
    use std::sync::atomic::{AtomicU32, Ordering};

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.insert(*name, HeaderValue::from_str(value).unwrap());
        }
        map
    }

    #[test]
    fn reset_header_forms() {
        let now = DateTime::parse_from_rfc3339("2026-01-06T15:29:58Z")
            .unwrap()
            .with_timezone(&Utc);
        let check = |pairs: &[(&'static str, &str)], expected: Duration| {
            assert_eq!(
                retry_after_from_headers(&headers(pairs), now),
                expected,
                "{pairs:?}"
            );
        };
        check(
            &[("x-ratelimit-reset", "2026-01-06T15:30:00.000Z")],
            Duration::from_secs(2),
        );
        check(
            &[("x-ratelimit-reset", "1767713403")],
            Duration::from_secs(5),
        );
        check(
            &[("x-ratelimit-reset", "1767713398500")],
            Duration::from_millis(500),
        );
        check(
            &[("x-ratelimit-reset", "2020-01-01T00:00:00Z")],
            Duration::ZERO,
        );
        check(&[("x-ratelimit-reset", "7")], Duration::from_secs(7));
        check(&[("retry-after", "3")], Duration::from_secs(3));
        check(&[("x-ratelimit-reset", "soon")], DEFAULT_RETRY_AFTER);
        check(&[], DEFAULT_RETRY_AFTER);
    }

    #[tokio::test]
    async fn retries_until_success_waiting_as_told() {
        let calls = AtomicU32::new(0);
        let result = retry_rate_limited(RateLimitRetry::default(), || async {
            if calls.fetch_add(1, Ordering::SeqCst) < 2 {
                Err(ConnectorError::RateLimited {
                    retry_after: Duration::from_millis(5),
                })
            } else {
                Ok("done")
            }
        })
        .await;
        assert_eq!(result, Ok("done"));
        assert_eq!(calls.load(Ordering::SeqCst), 3);
    }

    #[tokio::test]
    async fn gives_up_past_the_bound() {
        let calls = AtomicU32::new(0);
        let policy = RateLimitRetry {
            max_retries: 2,
            max_wait: Duration::from_secs(30),
        };
        let limited = || async {
            calls.fetch_add(1, Ordering::SeqCst);
            Err::<(), _>(ConnectorError::RateLimited {
                retry_after: Duration::from_millis(1),
            })
        };
        let result = retry_rate_limited(policy, limited).await;
        assert!(matches!(result, Err(ConnectorError::RateLimited { .. })));
        assert_eq!(calls.load(Ordering::SeqCst), 3);

        calls.store(0, Ordering::SeqCst);
        let too_long = || async {
            calls.fetch_add(1, Ordering::SeqCst);
            Err::<(), _>(ConnectorError::RateLimited {
                retry_after: Duration::from_secs(31),
            })
        };
        let result = retry_rate_limited(policy, too_long).await;
        assert!(matches!(result, Err(ConnectorError::RateLimited { .. })));
        assert_eq!(calls.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn other_errors_are_not_retried() {
        let calls = AtomicU32::new(0);
        let result: Result<(), _> = retry_rate_limited(RateLimitRetry::default(), || async {
            calls.fetch_add(1, Ordering::SeqCst);
            Err(ConnectorError::unknown("reset"))
        })
        .await;
        assert!(matches!(result, Err(ConnectorError::Unknown { .. })));
        assert_eq!(calls.load(Ordering::SeqCst), 1);
    }
}
