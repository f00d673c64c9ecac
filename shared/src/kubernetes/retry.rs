//! Client-side rate limiting and retries for Kubernetes API calls.
//!
//! Transport-level retries in kube are turned off (see [`super::client`]) so
//! that the adapter decides: a PDB's 429 on eviction is an answer ("blocked"),
//! not a reason to retry, while throttling 429s, 5xx and dropped connections are.

use std::num::NonZeroU32;
use std::time::Duration;

use tokio::sync::Mutex;
use tokio::time::Instant;

/// A token bucket: `qps` requests per second on average, bursts up to `burst`.
#[derive(Debug)]
pub struct RateLimiter {
    qps: f64,
    burst: f64,
    state: Mutex<(f64, Instant)>,
}

impl RateLimiter {
    /// A limiter allowing `qps` per second with bursts of `burst` (both at least 1).
    pub fn new(qps: f64, burst: u32) -> Self {
        let burst = f64::from(burst.max(1));
        RateLimiter {
            qps: qps.max(0.001),
            burst,
            state: Mutex::new((burst, Instant::now())),
        }
    }

    /// Waits until a request may be sent.
    pub async fn acquire(&self) {
        let wait = {
            let mut s = self.state.lock().await;
            let now = Instant::now();
            let (tokens, wait) = take_token(s.0, now.duration_since(s.1), self.qps, self.burst);
            *s = (tokens, now);
            wait
        };
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
        }
    }
}

/// Refills a bucket holding `tokens` after `elapsed`, takes one token, and
/// says how long to wait (a negative balance is debt paid back at `qps`).
pub fn take_token(tokens: f64, elapsed: Duration, qps: f64, burst: f64) -> (f64, Duration) {
    let left = (tokens + elapsed.as_secs_f64() * qps).min(burst) - 1.0;
    let wait = if left < 0.0 {
        Duration::from_secs_f64(-left / qps)
    } else {
        Duration::ZERO
    };
    (left, wait)
}

/// Karpenter's client rate (its `KUBE_CLIENT_QPS` default).
pub const DEFAULT_QPS: NonZeroU32 = NonZeroU32::MIN.saturating_add(199);
/// Karpenter's client burst (its `KUBE_CLIENT_BURST` default).
pub const DEFAULT_BURST: NonZeroU32 = NonZeroU32::MIN.saturating_add(299);

impl Default for RateLimiter {
    /// Karpenter's rate: [`DEFAULT_QPS`] with bursts of [`DEFAULT_BURST`].
    fn default() -> Self {
        RateLimiter::new(f64::from(DEFAULT_QPS.get()), DEFAULT_BURST.get())
    }
}

/// How many times and how patiently to retry transient failures.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Attempts in total (the first try included).
    pub attempts: u32,
    /// Delay before the first retry; doubled each time.
    pub base_delay: Duration,
    /// Longest delay between attempts.
    pub max_delay: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            attempts: 5,
            base_delay: Duration::from_millis(100),
            max_delay: Duration::from_secs(2),
        }
    }
}

impl RetryPolicy {
    /// The delay before retry number `retry` (from 0).
    pub fn delay(&self, retry: u32) -> Duration {
        let d = self
            .base_delay
            .saturating_mul(1u32.checked_shl(retry.min(16)).unwrap_or(u32::MAX));
        d.min(self.max_delay)
    }
}

/// Whether a failure is worth another try: throttling, server errors, and
/// connection-level failures. 409 is not: conflicts need a fresh read first.
pub fn is_transient(e: &kube::Error) -> bool {
    match e {
        kube::Error::Api(s) => s.code == 429 || (500..=599).contains(&s.code),
        kube::Error::HyperError(_) | kube::Error::Service(_) => true,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_double_and_cap() {
        let p = RetryPolicy {
            attempts: 10,
            base_delay: Duration::from_millis(100),
            max_delay: Duration::from_millis(500),
        };
        let d: Vec<u128> = (0..5).map(|i| p.delay(i).as_millis()).collect();
        assert_eq!(d, vec![100, 200, 400, 500, 500]);
        assert_eq!(p.delay(1000), Duration::from_millis(500));
    }

    #[test]
    fn transient_errors_are_throttling_and_server_errors() {
        let api = |code: u16| {
            kube::Error::Api(Box::new(kube::core::Status {
                code,
                ..Default::default()
            }))
        };
        assert!(is_transient(&api(429)));
        assert!(is_transient(&api(503)));
        assert!(!is_transient(&api(409)));
        assert!(!is_transient(&api(404)));
    }

    #[test]
    fn bucket_allows_the_burst_then_spaces_requests() {
        let (qps, burst) = (10.0, 2.0);
        let (t, w) = take_token(burst, Duration::ZERO, qps, burst);
        assert_eq!(w, Duration::ZERO);
        let (t, w) = take_token(t, Duration::ZERO, qps, burst);
        assert_eq!(w, Duration::ZERO);
        let (t, w) = take_token(t, Duration::ZERO, qps, burst);
        assert_eq!(w, Duration::from_millis(100));
        // Debt accumulates: the next caller waits behind the previous one.
        let (_, w) = take_token(t, Duration::ZERO, qps, burst);
        assert_eq!(w, Duration::from_millis(200));
        // Idle time refills, but never beyond the burst.
        let (t, _) = take_token(0.0, Duration::from_secs(60), qps, burst);
        assert_eq!(t, 1.0);
    }
}
