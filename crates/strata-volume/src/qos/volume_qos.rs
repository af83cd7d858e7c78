//! The token buckets of one served volume, and what they held back.
//!
//! A request waits until every bucket that applies to it has its cost
//! (one token for an IOPS limit, its bytes for a bandwidth limit), then
//! takes them all at once. Waits are slept in steps of at most
//! `MAX_SLEEP_MS` and checked again, so new limits (`set`) apply to
//! requests already waiting within that.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

use super::qos_limits::QosLimits;
use super::token_bucket::TokenBucket;

/// The longest single sleep of a held-back request.
const MAX_SLEEP_MS: u64 = 100;

/// What a request is, for the limits that apply to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QosKind {
    Read,
    /// WRITE, TRIM, WRITE_ZEROES.
    Write,
}

/// A volume's limits and what they did, for `volume info` and `/metrics`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct QosStats {
    pub limits: QosLimits,
    /// Requests that waited for a limit.
    pub throttled_requests: u64,
    /// Time they spent waiting, in total.
    pub wait_ms: u64,
}

/// One volume's buckets (`QOS_KEYS` order) and counters.
pub struct VolumeQos {
    /// Fast path: no limit set, no lock taken.
    limited: AtomicBool,
    state: Mutex<Buckets>,
    throttled_requests: AtomicU64,
    wait_ns: AtomicU64,
}

struct Buckets {
    limits: QosLimits,
    buckets: [Option<TokenBucket>; 6],
}

impl VolumeQos {
    pub fn new(limits: QosLimits) -> VolumeQos {
        let qos = VolumeQos {
            limited: AtomicBool::new(false),
            state: Mutex::new(Buckets {
                limits: QosLimits::default(),
                buckets: Default::default(),
            }),
            throttled_requests: AtomicU64::new(0),
            wait_ns: AtomicU64::new(0),
        };
        qos.set(limits);
        qos
    }

    /// Applies new limits at once (a bucket kept keeps how full it was; a
    /// new one starts full).
    pub fn set(&self, limits: QosLimits) {
        let now = Instant::now();
        let mut st = self.state.lock();
        for (i, (_, limit)) in limits.limits().into_iter().enumerate() {
            st.buckets[i] = limit.map(|l| match &st.buckets[i] {
                Some(b) => b.retuned(l.rate, l.burst, now),
                None => TokenBucket::new(l.rate, l.burst, now),
            });
        }
        self.limited
            .store(!limits.is_unlimited(), Ordering::Release);
        st.limits = limits;
    }

    pub fn limits(&self) -> QosLimits {
        self.state.lock().limits.clone()
    }

    pub fn stats(&self) -> QosStats {
        QosStats {
            limits: self.limits(),
            throttled_requests: self.throttled_requests.load(Ordering::Relaxed),
            wait_ms: self.wait_ns.load(Ordering::Relaxed) / 1_000_000,
        }
    }

    /// Waits until a request of `kind` moving `bytes` is within the limits,
    /// and counts it against them. Never fails.
    pub async fn admit(&self, kind: QosKind, bytes: u64) {
        if !self.limited.load(Ordering::Acquire) {
            return;
        }
        let mut since: Option<Instant> = None;
        loop {
            // tokio's clock: tests pause and advance it.
            let wait = self.try_take(kind, bytes, tokio::time::Instant::now().into_std());
            if wait.is_zero() {
                break;
            }
            since.get_or_insert_with(Instant::now);
            tokio::time::sleep(wait.min(Duration::from_millis(MAX_SLEEP_MS))).await;
        }
        if let Some(t) = since {
            self.throttled_requests.fetch_add(1, Ordering::Relaxed);
            let ns = u64::try_from(t.elapsed().as_nanos()).unwrap_or(u64::MAX);
            self.wait_ns.fetch_add(ns, Ordering::Relaxed);
        }
    }

    /// Takes the request's cost from every bucket that applies if all
    /// have it (zero), or says how long until they would.
    fn try_take(&self, kind: QosKind, bytes: u64, now: Instant) -> Duration {
        let costs = costs(kind, bytes);
        let mut st = self.state.lock();
        let mut wait = Duration::ZERO;
        for &(i, cost) in &costs {
            if let (Some(b), true) = (&mut st.buckets[i], cost > 0) {
                wait = wait.max(b.wait_for(cost, now));
            }
        }
        if wait.is_zero() {
            for &(i, cost) in &costs {
                if let (Some(b), true) = (&mut st.buckets[i], cost > 0) {
                    b.take(cost, now);
                }
            }
        }
        wait
    }
}

/// (bucket index in `QOS_KEYS` order, cost) of a request.
fn costs(kind: QosKind, bytes: u64) -> [(usize, u64); 4] {
    match kind {
        QosKind::Read => [(0, 1), (1, 1), (3, bytes), (4, bytes)],
        QosKind::Write => [(0, 1), (2, 1), (3, bytes), (5, bytes)],
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::qos::Limit;

    #[test]
    fn each_request_counts_against_the_limits_that_apply() {
        let q = VolumeQos::new(QosLimits {
            read_iops: Some(Limit::per_second(10)),
            write_bw: Some(Limit::per_second(1 << 20)),
            ..QosLimits::default()
        });
        let t = Instant::now();
        // Ten reads pass, the eleventh waits ~100 ms; writes are not
        // counted against reads.
        for _ in 0..10 {
            assert!(q.try_take(QosKind::Read, 4096, t).is_zero());
        }
        let w = q.try_take(QosKind::Read, 4096, t);
        assert!(
            w > Duration::from_millis(90) && w <= Duration::from_millis(100),
            "{w:?}"
        );
        assert!(q.try_take(QosKind::Write, 1 << 20, t).is_zero());
        let w = q.try_take(QosKind::Write, 512 << 10, t);
        assert!(w >= Duration::from_millis(499), "{w:?}");
        // A trim moves no bytes: not held back by the bandwidth limit.
        assert!(q.try_take(QosKind::Write, 0, t).is_zero());
        // Lifted: nothing waits.
        q.set(QosLimits::default());
        assert!(!q.limited.load(Ordering::Acquire));
    }

    #[tokio::test(start_paused = true)]
    async fn admit_holds_a_client_to_its_rate_and_counts_the_wait() {
        let q = VolumeQos::new(QosLimits {
            iops: Some(Limit {
                rate: 100,
                burst: 200,
            }),
            ..QosLimits::default()
        });
        let start = tokio::time::Instant::now();
        for _ in 0..400 {
            q.admit(QosKind::Write, 4096).await;
        }
        // 200 at once (the burst), 200 more at 100 a second.
        let took = start.elapsed();
        assert!(took >= Duration::from_millis(1990), "{took:?}");
        assert!(took <= Duration::from_millis(2100), "{took:?}");
        let s = q.stats();
        assert_eq!(s.throttled_requests, 200);
    }
}
