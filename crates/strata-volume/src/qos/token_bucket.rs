//! A token bucket: `rate` tokens a second, at most `capacity` saved.
//!
//! Time is passed in (`Instant`s), so tests drive it. A request that costs
//! more than the bucket can ever hold (a 32 MiB write under a 16 MiB/s
//! limit with no burst) is let through once the bucket is full and leaves
//! it in debt: the next requests wait for the debt to be repaid, so the
//! rate holds over time.

use std::time::{Duration, Instant};

#[derive(Debug, Clone)]
pub(crate) struct TokenBucket {
    rate_per_sec: f64,
    capacity: f64,
    /// May be negative (debt).
    tokens: f64,
    at: Instant,
}

impl TokenBucket {
    /// A full bucket.
    pub fn new(rate_per_sec: u64, capacity: u64, now: Instant) -> TokenBucket {
        assert!(rate_per_sec > 0 && capacity > 0);
        TokenBucket {
            rate_per_sec: rate_per_sec as f64,
            capacity: capacity as f64,
            tokens: capacity as f64,
            at: now,
        }
    }

    fn refill(&mut self, now: Instant) {
        let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
        self.tokens = (self.tokens + elapsed * self.rate_per_sec).min(self.capacity);
        self.at = now;
    }

    /// How long until `cost` may be taken (zero: now).
    pub fn wait_for(&mut self, cost: u64, now: Instant) -> Duration {
        self.refill(now);
        let need = (cost as f64).min(self.capacity);
        if self.tokens >= need {
            return Duration::ZERO;
        }
        Duration::from_secs_f64((need - self.tokens) / self.rate_per_sec)
    }

    /// Takes `cost` (after `wait_for` said zero).
    pub fn take(&mut self, cost: u64, now: Instant) {
        self.refill(now);
        self.tokens -= cost as f64;
    }

    /// The same bucket under another limit, keeping how full it was.
    pub fn retuned(&self, rate_per_sec: u64, capacity: u64, now: Instant) -> TokenBucket {
        let mut b = self.clone();
        b.refill(now);
        let fill = if self.capacity > 0.0 {
            b.tokens / self.capacity
        } else {
            1.0
        };
        TokenBucket {
            rate_per_sec: rate_per_sec as f64,
            capacity: capacity as f64,
            tokens: fill.min(1.0) * capacity as f64,
            at: now,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bucket_serves_its_burst_then_its_rate() {
        let t0 = Instant::now();
        let mut b = TokenBucket::new(100, 1000, t0);
        // The burst, at once.
        for _ in 0..1000 {
            assert_eq!(b.wait_for(1, t0), Duration::ZERO);
            b.take(1, t0);
        }
        // Then one every 10 ms.
        assert_eq!(b.wait_for(1, t0), Duration::from_millis(10));
        let t1 = t0 + Duration::from_millis(10);
        assert_eq!(b.wait_for(1, t1), Duration::ZERO);
        b.take(1, t1);
        // Over 10 s, 1,000 more requests and no more.
        let mut served = 0;
        let mut now = t1;
        let end = t1 + Duration::from_secs(10);
        while now < end {
            let w = b.wait_for(1, now);
            if w.is_zero() {
                b.take(1, now);
                served += 1;
            } else {
                now += w;
            }
        }
        assert!((999..=1001).contains(&served), "{served}");
        // Never more than the capacity saved.
        let later = end + Duration::from_secs(3600);
        b.refill(later);
        assert_eq!(b.tokens, 1000.0);
    }

    #[test]
    fn a_request_larger_than_the_bucket_passes_when_full_and_leaves_debt() {
        let t0 = Instant::now();
        let mut b = TokenBucket::new(16 << 20, 16 << 20, t0);
        assert_eq!(b.wait_for(32 << 20, t0), Duration::ZERO);
        b.take(32 << 20, t0);
        // 16 MiB of debt plus the next 4 KiB: a little over 1 s.
        let w = b.wait_for(4096, t0);
        assert!(
            w > Duration::from_secs(1) && w < Duration::from_millis(1001),
            "{w:?}"
        );
        // Retuned to a higher rate, half full stays half full.
        let mut c = TokenBucket::new(10, 10, t0);
        c.take(5, t0);
        let d = c.retuned(100, 100, t0);
        assert_eq!(d.tokens, 50.0);
    }
}
