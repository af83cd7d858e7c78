//! Hydration's server-wide bounds: GETs in flight and bandwidth, shared
//! by every volume's hydration (`hydration.rs`), held by `SharedCaches`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

/// Hydration GETs in flight at once, server-wide.
pub const MAX_HYDRATION_GETS: usize = 8;
/// Volumes hydrating (or prefetching a profile) at once, server-wide: each
/// holds a window of pieces and a profile in memory; the rest wait.
pub const MAX_HYDRATING_VOLUMES: usize = 4;

/// A token bucket in bytes per second, shared by every volume's hydration
/// (0: no limit). Holds at most one second of burst.
pub(crate) struct RateLimit {
    bytes_per_sec: u64,
    bucket: Mutex<(f64, Instant)>,
}

impl RateLimit {
    pub fn new(bytes_per_sec: u64) -> RateLimit {
        RateLimit {
            bytes_per_sec,
            bucket: Mutex::new((bytes_per_sec as f64, Instant::now())),
        }
    }

    /// The limit (0: none).
    pub fn bytes_per_sec(&self) -> u64 {
        self.bytes_per_sec
    }

    /// Waits until `bytes` may be fetched.
    pub async fn take(&self, bytes: u64) {
        if self.bytes_per_sec == 0 {
            return;
        }
        let rate = self.bytes_per_sec as f64;
        let wait = {
            let mut b = self.bucket.lock();
            let now = Instant::now();
            let refill = now.duration_since(b.1).as_secs_f64() * rate;
            b.0 = (b.0 + refill).min(rate);
            b.1 = now;
            b.0 -= bytes as f64;
            if b.0 >= 0.0 {
                return;
            }
            Duration::from_secs_f64(-b.0 / rate)
        };
        tokio::time::sleep(wait).await;
    }
}

/// A server's hydration bounds, shared by its volumes: GETs in flight.
pub(crate) fn hydration_slots() -> Arc<tokio::sync::Semaphore> {
    Arc::new(tokio::sync::Semaphore::new(MAX_HYDRATION_GETS))
}

/// ... and volumes hydrating at once.
pub(crate) fn hydrating_volumes() -> Arc<tokio::sync::Semaphore> {
    Arc::new(tokio::sync::Semaphore::new(MAX_HYDRATING_VOLUMES))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_rate_limit_spreads_fetches_over_time() {
        let limit = RateLimit::new(1 << 20);
        let t = Instant::now();
        // One second of burst is free, the next MiB waits about a second.
        limit.take(1 << 20).await;
        limit.take(1 << 20).await;
        assert!(
            t.elapsed() >= Duration::from_millis(900),
            "{:?}",
            t.elapsed()
        );
        let free = RateLimit::new(0);
        let t = Instant::now();
        free.take(u64::MAX).await;
        assert!(t.elapsed() < Duration::from_millis(100));
    }
}
