//! The backoff of writes that must eventually succeed (segments,
//! checkpoints, the manifest): a store outage back-pressures writers rather
//! than losing data, since the journal still holds everything.
//!
//! A leaf. The store's retry layer has already retried each request with
//! jitter; this is the slower loop around a request that still failed.

use std::time::Duration;

const MIN_DELAY_MS: u64 = 100;
const MAX_DELAY_MS: u64 = 5_000;

/// Doubling delays from 100 ms up to 5 s.
pub(crate) struct Backoff {
    delay_ms: u64,
}

impl Backoff {
    pub(crate) fn new() -> Backoff {
        Backoff {
            delay_ms: MIN_DELAY_MS,
        }
    }

    /// The delay the next `wait` will sleep, for log lines.
    pub(crate) fn delay_ms(&self) -> u64 {
        self.delay_ms
    }

    /// Sleeps the current delay, then doubles it.
    pub(crate) async fn wait(&mut self) {
        tokio::time::sleep(Duration::from_millis(self.delay_ms)).await;
        self.delay_ms = (self.delay_ms * 2).min(MAX_DELAY_MS);
    }
}
