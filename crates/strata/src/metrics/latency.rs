//! Latency histograms for Prometheus from the log2 histograms the NBD
//! server and the store keep (bucket `i` counts latencies in
//! `[2^(i-1), 2^i)` µs): merged two raw buckets to one, so each series
//! has a dozen buckets, not forty. The bounds are exact edges of the raw
//! buckets (2^k µs), so no sample is ever counted in the wrong bucket.

// The two crates keep their own histograms (neither depends on the
// other); this module reads both with one bucket meaning.
const _: () = assert!(nbd_server::LATENCY_BUCKETS == strata_store::LATENCY_BUCKETS);

/// Exponents `k` of the upper bounds, 2^k µs: 16 µs, 64 µs, 256 µs,
/// ~1 ms, ~4 ms, ~16 ms, ~65 ms, ~262 ms, ~1 s, ~4.2 s, ~16.8 s; then +Inf.
const BOUND_EXPONENTS: [usize; 11] = [4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24];

/// A histogram ready for `encode_histogram`: sum in seconds, count, and
/// per-bucket (not cumulative) counts with their upper bounds in seconds.
#[derive(Debug, Clone, PartialEq)]
pub struct Buckets {
    pub sum_seconds: f64,
    pub count: u64,
    pub buckets: Vec<(f64, u64)>,
}

impl Buckets {
    /// From raw log2 buckets and the sum of the samples in µs.
    pub fn from_log2(raw: &[u64], sum_us: u64) -> Buckets {
        let mut buckets = Vec::with_capacity(BOUND_EXPONENTS.len() + 1);
        let mut from = 0;
        for k in BOUND_EXPONENTS {
            let to = (k + 1).min(raw.len()).max(from);
            let bound_seconds = (1u64 << k) as f64 / 1e6;
            buckets.push((bound_seconds, raw[from..to].iter().sum()));
            from = to;
        }
        buckets.push((f64::INFINITY, raw[from..].iter().sum()));
        Buckets {
            sum_seconds: sum_us as f64 / 1e6,
            count: raw.iter().sum(),
            buckets,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merges_raw_buckets_at_their_edges() {
        let mut raw = [0u64; 40];
        raw[0] = 1; // 0 us
        raw[4] = 2; // [8, 16) us: le 16 us
        raw[5] = 3; // [16, 32) us: le 64 us
        raw[11] = 4; // [1024, 2048) us: le 4.096 ms
        raw[39] = 5; // days: +Inf
        let h = Buckets::from_log2(&raw, 2_000_000);
        assert_eq!(h.count, 15);
        assert_eq!(h.sum_seconds, 2.0);
        assert_eq!(h.buckets.len(), 12);
        assert_eq!(h.buckets[0], (0.000016, 3));
        assert_eq!(h.buckets[1], (0.000064, 3));
        assert_eq!(h.buckets[4], (0.004096, 4));
        assert_eq!(h.buckets[11], (f64::INFINITY, 5));
        let per_bucket: u64 = h.buckets.iter().map(|b| b.1).sum();
        assert_eq!(per_bucket, h.count, "every sample in one bucket");
    }
}
