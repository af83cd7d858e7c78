//! Time and randomness for the store wrappers.
//!
//! This module owns the two effects the wrappers need besides the inner
//! store: waiting ([`Sleeper`]) and drawing random numbers ([`Entropy`]).
//! They sit behind traits so tests can make backoff and fault injection
//! deterministic (a seeded [`SplitMixEntropy`], a recording sleeper) without
//! touching the wrappers.

use std::fmt::Debug;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures::future::BoxFuture;

/// Waits for a duration. The production implementation is [`TokioSleeper`].
pub trait Sleeper: Send + Sync + Debug {
    fn sleep(&self, duration: Duration) -> BoxFuture<'static, ()>;
}

/// Sleeps on the tokio timer (so `tokio::time::pause()` applies in tests).
#[derive(Debug, Clone, Copy, Default)]
pub struct TokioSleeper;

impl Sleeper for TokioSleeper {
    fn sleep(&self, duration: Duration) -> BoxFuture<'static, ()> {
        Box::pin(tokio::time::sleep(duration))
    }
}

/// A source of uniformly distributed 64-bit numbers, shared between tasks.
pub trait Entropy: Send + Sync + Debug {
    fn next_u64(&self) -> u64;
}

/// SplitMix64 over an atomic counter: cheap, lock-free, and good enough for
/// jitter and fault decisions (not for anything secret). Seeded, it yields
/// the same sequence every run; tasks racing for numbers may interleave
/// differently, but each draw is still a fresh value of the sequence.
#[derive(Debug)]
pub struct SplitMixEntropy {
    state: AtomicU64,
}

/// The SplitMix64 increment (the golden ratio in 64-bit fixed point).
const SPLITMIX_GAMMA: u64 = 0x9e37_79b9_7f4a_7c15;

/// Distinguishes generators created in the same nanosecond.
static INSTANCE_COUNTER: AtomicU64 = AtomicU64::new(0);

impl SplitMixEntropy {
    /// A deterministic sequence, for tests and reproducible fault runs.
    pub fn seeded(seed: u64) -> SplitMixEntropy {
        SplitMixEntropy {
            state: AtomicU64::new(seed),
        }
    }

    /// A sequence seeded from the wall clock and a process-wide counter, so
    /// two stores never share jitter (which would re-synchronise retries).
    pub fn from_clock() -> SplitMixEntropy {
        let clock_ns = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        let instance = INSTANCE_COUNTER.fetch_add(1, Ordering::Relaxed);
        SplitMixEntropy::seeded(splitmix64(clock_ns ^ instance.rotate_left(32)))
    }
}

impl Entropy for SplitMixEntropy {
    fn next_u64(&self) -> u64 {
        let state = self
            .state
            .fetch_add(SPLITMIX_GAMMA, Ordering::Relaxed)
            .wrapping_add(SPLITMIX_GAMMA);
        splitmix64(state)
    }
}

/// The SplitMix64 output function.
fn splitmix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A uniform draw in `[0, 1)` (53 bits, the precision of an `f64`).
pub fn unit_interval(entropy: &dyn Entropy) -> f64 {
    (entropy.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
}

/// A uniform draw in `[0, max]` inclusive. Uses the multiply-shift
/// reduction; its bias (at most `max / 2^64`) is irrelevant here.
pub fn up_to_inclusive(entropy: &dyn Entropy, max: u64) -> u64 {
    if max == u64::MAX {
        return entropy.next_u64();
    }
    let span = u128::from(max) + 1;
    ((u128::from(entropy.next_u64()) * span) >> 64) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seeded_sequences_repeat_and_differ_by_seed() {
        let a = SplitMixEntropy::seeded(7);
        let b = SplitMixEntropy::seeded(7);
        let c = SplitMixEntropy::seeded(8);
        let seq_a: Vec<u64> = (0..5).map(|_| a.next_u64()).collect();
        let seq_b: Vec<u64> = (0..5).map(|_| b.next_u64()).collect();
        let seq_c: Vec<u64> = (0..5).map(|_| c.next_u64()).collect();
        assert_eq!(seq_a, seq_b);
        assert_ne!(seq_a, seq_c);
    }

    #[test]
    fn clock_seeded_generators_differ() {
        let a = SplitMixEntropy::from_clock();
        let b = SplitMixEntropy::from_clock();
        assert_ne!(a.next_u64(), b.next_u64());
    }

    #[test]
    fn draws_stay_in_range_and_spread() {
        let entropy = SplitMixEntropy::seeded(1);
        let mut below_half = 0;
        for _ in 0..10_000 {
            let x = unit_interval(&entropy);
            assert!((0.0..1.0).contains(&x));
            if x < 0.5 {
                below_half += 1;
            }
            assert!(up_to_inclusive(&entropy, 10) <= 10);
        }
        assert!((4_500..5_500).contains(&below_half), "{below_half}");
        assert_eq!(up_to_inclusive(&entropy, 0), 0);
        let seen_max = (0..1_000).any(|_| up_to_inclusive(&entropy, 3) == 3);
        assert!(seen_max, "the inclusive bound is reachable");
    }
}
