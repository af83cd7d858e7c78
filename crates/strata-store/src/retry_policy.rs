//! When and how often to retry a failed object store request.
//!
//! This module owns [`RetryPolicy`]: how many attempts a request gets, the
//! deadline they must fit in, and the backoff schedule between them,
//! exponential with full jitter: before retry `k` (1-based) a uniform
//! random time in `[0, min(max_delay, base * 2^(k-1))]`. Which errors are
//! retried, and the retrying itself, are the business of
//! `RetryingObjectStore`.

use crate::env::{up_to_inclusive, Entropy};

/// When and how often to retry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Attempts in all, the first one included; 0 is treated as 1.
    pub max_attempts: u32,
    /// Upper bound of the first backoff sleep.
    pub base_delay_ms: u64,
    /// Cap on any one backoff sleep.
    pub max_delay_ms: u64,
    /// No retry sleep may end later than this after the first attempt began.
    /// Measured on the tokio clock, so `tokio::time::pause()` applies.
    pub deadline_ms: u64,
}

impl Default for RetryPolicy {
    fn default() -> RetryPolicy {
        RetryPolicy {
            max_attempts: 8,
            base_delay_ms: 50,
            max_delay_ms: 5_000,
            deadline_ms: 60_000,
        }
    }
}

impl RetryPolicy {
    /// Upper bound of the sleep before retry number `retry` (1-based).
    pub fn delay_cap_ms(&self, retry: u32) -> u64 {
        let shift = retry.saturating_sub(1).min(63);
        let exponential_ms = self.base_delay_ms.saturating_mul(1u64 << shift);
        exponential_ms.min(self.max_delay_ms)
    }

    /// The (full-jitter) sleep before retry number `retry` (1-based).
    pub fn backoff_delay_ms(&self, retry: u32, entropy: &dyn Entropy) -> u64 {
        up_to_inclusive(entropy, self.delay_cap_ms(retry))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::env::SplitMixEntropy;

    #[test]
    fn delay_caps_double_from_the_base_up_to_the_max() {
        let policy = RetryPolicy {
            max_attempts: 12,
            base_delay_ms: 50,
            max_delay_ms: 400,
            deadline_ms: 3_600_000,
        };
        let caps: Vec<u64> = (1..=5).map(|retry| policy.delay_cap_ms(retry)).collect();
        assert_eq!(caps, [50, 100, 200, 400, 400]);
        assert_eq!(policy.delay_cap_ms(0), 50, "retry 0 is treated as 1");
        assert_eq!(policy.delay_cap_ms(u32::MAX), 400, "no overflow");
    }

    #[test]
    fn backoff_delays_are_jittered_under_their_cap() {
        let policy = RetryPolicy::default();
        let entropy = SplitMixEntropy::seeded(7);
        for retry in 1..=10 {
            let cap_ms = policy.delay_cap_ms(retry);
            let delays: Vec<u64> = (0..20)
                .map(|_| policy.backoff_delay_ms(retry, &entropy))
                .collect();
            assert!(delays.iter().all(|&d| d <= cap_ms), "{retry}: {delays:?}");
        }
    }
}
