//! The deterministic random numbers a power cut draws: SplitMix64 (Steele,
//! Lea & Flood 2014), a few lines and good enough to pick which unsynced
//! operations survive. Inline so the same seed gives the same cut on every
//! machine and every version of every RNG crate.

/// SplitMix64: 64 bits of state, one add and a mix per draw.
#[derive(Debug, Clone)]
pub(crate) struct SplitMix64 {
    state: u64,
}

impl SplitMix64 {
    pub(crate) fn new(seed: u64) -> SplitMix64 {
        SplitMix64 { state: seed }
    }

    pub(crate) fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A fair coin.
    pub(crate) fn coin(&mut self) -> bool {
        self.next_u64() >> 63 == 1
    }

    /// Uniform in `0..n` (0 when `n` is 0). The modulo bias is below 2^-32
    /// for every `n` a cut uses, which is irrelevant here.
    pub(crate) fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            return 0;
        }
        self.next_u64() % n
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_sequence_and_both_coin_sides() {
        let mut a = SplitMix64::new(7);
        let mut b = SplitMix64::new(7);
        let xs: Vec<u64> = (0..8).map(|_| a.next_u64()).collect();
        let ys: Vec<u64> = (0..8).map(|_| b.next_u64()).collect();
        assert_eq!(xs, ys);
        let heads = (0..1000).filter(|_| a.coin()).count();
        assert!((400..600).contains(&heads), "{heads}");
        assert!((0..100).all(|_| a.below(3) < 3));
        assert_eq!(a.below(0), 0);
    }
}
