//! Hedged GETs: a read GET slower than the store's usual tail is sent a
//! second time, and the first answer wins (S3's performance guidance:
//! "aggressive timeouts and retries" for latency-sensitive reads; the
//! tail of a real store is much longer than its median).
//!
//! This file owns the latency record the hedge delay comes from
//! (`HedgePolicy`: the last `SAMPLES` small GETs' times, the delay
//! recomputed every `RECOMPUTE_EVERY` of them), the hedge budget
//! (at most one GET in `BUDGET_ONE_IN` is hedged), and the race itself
//! (`hedged`). The loser is dropped, which cancels its request: one answer
//! is ever used, and it is verified like any other (`segment_fetch.rs`).
//!
//! Only GETs of at most `MAX_HEDGED_BYTES` are hedged (a client's small
//! read; a large GET's time is its size, not the store's tail), and only
//! once `MIN_SAMPLES` times are known.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::Mutex;

/// Recent GET times kept.
const SAMPLES: usize = 256;
/// Times needed before any GET is hedged.
const MIN_SAMPLES: usize = 32;
/// The delay is recomputed every this many times (a sort of `SAMPLES`),
/// not on every GET.
const RECOMPUTE_EVERY: usize = 16;
/// At most one GET in this many is hedged (a store in trouble is not sent
/// twice the load).
const BUDGET_ONE_IN: u64 = 20;
/// Largest GET hedged.
pub(crate) const MAX_HEDGED_BYTES: u64 = 1 << 20;
/// Never hedge sooner than this (a store on this host answers in well
/// under it; a second request would be pure waste).
const MIN_HEDGE_DELAY: Duration = Duration::from_millis(5);

/// When to hedge, from recent GET times; and what was hedged.
pub(crate) struct HedgePolicy {
    /// A ring of recent small-GET times, microseconds, and how many were
    /// recorded.
    times_us: Mutex<(Vec<u64>, usize)>,
    /// The hedge delay from those times, recomputed every
    /// `RECOMPUTE_EVERY` records (0: not enough known): a GET only reads it.
    delay_us: AtomicU64,
    gets: AtomicU64,
    pub hedged: AtomicU64,
    /// Hedged GETs whose second request answered first.
    pub hedge_wins: AtomicU64,
}

impl Default for HedgePolicy {
    fn default() -> Self {
        HedgePolicy {
            times_us: Mutex::new((Vec::with_capacity(SAMPLES), 0)),
            delay_us: AtomicU64::new(0),
            gets: AtomicU64::new(0),
            hedged: AtomicU64::new(0),
            hedge_wins: AtomicU64::new(0),
        }
    }
}

impl HedgePolicy {
    /// Notes how long a (first-sent) small GET took.
    pub fn record(&self, took: Duration) {
        let us = took.as_micros().min(u128::from(u64::MAX)) as u64;
        let mut g = self.times_us.lock();
        let (times, recorded) = &mut *g;
        if times.len() < SAMPLES {
            times.push(us);
        } else {
            times[*recorded % SAMPLES] = us;
        }
        *recorded += 1;
        if times.len() < MIN_SAMPLES || *recorded % RECOMPUTE_EVERY != 0 {
            return;
        }
        let mut sorted = times.clone();
        drop(g);
        sorted.sort_unstable();
        let at = |q: usize| sorted[(sorted.len() - 1) * q / 100];
        let us = (2 * at(50)).max(at(95));
        let floor = MIN_HEDGE_DELAY.as_micros() as u64;
        self.delay_us.store(us.max(floor), Ordering::Relaxed);
    }

    /// How long a GET of `bytes` waits before it is hedged: twice the
    /// median or the 95th percentile, whichever is later; `None` when the
    /// GET is large, too few times are known, or the budget is spent.
    pub fn delay_for(&self, bytes: u64) -> Option<Duration> {
        let n = self.gets.fetch_add(1, Ordering::Relaxed) + 1;
        if bytes > MAX_HEDGED_BYTES {
            return None;
        }
        if self.hedged.load(Ordering::Relaxed) * BUDGET_ONE_IN >= n {
            return None;
        }
        match self.delay_us.load(Ordering::Relaxed) {
            0 => None,
            us => Some(Duration::from_micros(us)),
        }
    }
}

/// How a hedged request went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Race {
    /// Sent once.
    Once,
    /// Sent twice; the first request answered first.
    FirstWon,
    /// Sent twice; the second answered first.
    SecondWon,
}

/// Runs `send()`; if it has not answered after `delay`, runs it again and
/// returns whichever answers first, dropping (cancelling) the other.
pub(crate) async fn hedged<F, Fut, T>(send: F, delay: Option<Duration>) -> (T, Race)
where
    F: Fn() -> Fut,
    Fut: Future<Output = T>,
{
    let first = send();
    let Some(delay) = delay else {
        return (first.await, Race::Once);
    };
    tokio::pin!(first);
    tokio::select! {
        answer = &mut first => return (answer, Race::Once),
        () = tokio::time::sleep(delay) => {}
    }
    let second = send();
    tokio::pin!(second);
    tokio::select! {
        answer = &mut first => (answer, Race::FirstWon),
        answer = &mut second => (answer, Race::SecondWon),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::sync::atomic::AtomicU32;
    use std::sync::Arc;

    use super::*;

    /// Counts requests dropped before they answered.
    struct Dropped(Arc<AtomicU32>, bool);
    impl Drop for Dropped {
        fn drop(&mut self) {
            if !self.1 {
                self.0.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    #[tokio::test]
    async fn the_first_answer_wins_and_the_other_request_is_dropped() {
        // The first request answers "slow" after 300 ms, the hedge "fast"
        // at once: one answer comes back, the hedge's, and the first
        // request is dropped unanswered.
        let sent = Arc::new(AtomicU32::new(0));
        let dropped = Arc::new(AtomicU32::new(0));
        let send = || {
            let n = sent.fetch_add(1, Ordering::Relaxed);
            let dropped = dropped.clone();
            async move {
                let mut guard = Dropped(dropped, false);
                if n == 0 {
                    tokio::time::sleep(Duration::from_millis(300)).await;
                    guard.1 = true;
                    "slow"
                } else {
                    guard.1 = true;
                    "fast"
                }
            }
        };
        let (answer, race) = hedged(send, Some(Duration::from_millis(10))).await;
        assert_eq!((answer, race), ("fast", Race::SecondWon));
        assert_eq!(sent.load(Ordering::Relaxed), 2);
        assert_eq!(dropped.load(Ordering::Relaxed), 1, "the loser is dropped");

        // A request that answers before the delay is never sent twice.
        let sent = AtomicU32::new(0);
        let send = || {
            sent.fetch_add(1, Ordering::Relaxed);
            async { "only" }
        };
        let (answer, race) = hedged(send, Some(Duration::from_millis(50))).await;
        assert_eq!((answer, race), ("only", Race::Once));
        assert_eq!(sent.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn the_delay_follows_the_tail_within_a_budget() {
        let p = HedgePolicy::default();
        assert_eq!(p.delay_for(4096), None, "no times known yet");
        for i in 0..100u64 {
            // 20 ms, and one in ten 100 ms.
            let ms = if i % 10 == 0 { 100 } else { 20 };
            p.record(Duration::from_millis(ms));
        }
        let d = p.delay_for(4096).unwrap();
        assert_eq!(d, Duration::from_millis(100), "p95 is later than 2 x p50");
        assert_eq!(p.delay_for(8 << 20), None, "large GETs are not hedged");
        // The budget: one in BUDGET_ONE_IN.
        p.hedged
            .store(p.gets.load(Ordering::Relaxed), Ordering::Relaxed);
        assert_eq!(p.delay_for(4096), None);
    }
}
