//! The blocks hydration still has to bring local, by stored segment: per
//! segment, a bitmap of its 64 KiB disk-cache blocks that hold data the
//! volume's extent map points at (live data), built by one pass over the
//! map (`hydrate.rs`), taken in units as hydration fetches them.
//!
//! Why by segment and not by volume address: a segment's GET brings
//! whatever lies in its range; kept only for the address window being
//! hydrated (as before), a randomly written segment was fetched once per
//! window it had data in (2.0x the stored bytes for 512 MiB of 64 KiB
//! random writes). With the whole volume's live blocks of a segment known,
//! one GET keeps every live block it brings: each stored byte is fetched
//! once.
//!
//! Bounded: at most `MAX_LIVE_WORDS` bitmap words (8 MiB: 4 TiB of stored
//! data in 64 KiB blocks). Segments past that are left out (`cutoff`) and
//! hydrated in a later round, after another pass over the map.
//!
//! Stale is safe: data written after the pass is local (this host wrote
//! it), and a block that died meanwhile only costs a disk-cache slot.

use std::collections::BTreeMap;

use crate::read::BLOCK_BYTES;

/// Bitmap words held at most (see the module doc).
pub(crate) const MAX_LIVE_WORDS: usize = 1 << 20;

#[derive(Default)]
struct SegmentBits {
    /// Bit `b` set: block `b` holds live data and was not taken yet.
    words: Vec<u64>,
    /// Live blocks and bytes when the pass ended (for progress).
    blocks: u64,
    bytes: u64,
    /// Set bits left.
    left: u64,
}

/// Blocks of one segment taken for fetching, and the bytes of live data
/// they stand for (the segment's live bytes, shared by its blocks).
pub(crate) struct Unit {
    pub seq: u64,
    /// Sorted, distinct.
    pub blocks: Vec<u64>,
    pub bytes: u64,
}

/// The live blocks of the segments one round hydrates.
pub(crate) struct LiveBlocks {
    segments: BTreeMap<u64, SegmentBits>,
    words: usize,
    /// Only segments in `from..=cutoff` are held.
    from: u64,
    cutoff: u64,
}

impl LiveBlocks {
    /// Holds segments from `from` on, as many as fit.
    pub fn new(from: u64) -> LiveBlocks {
        LiveBlocks {
            segments: BTreeMap::new(),
            words: 0,
            from,
            cutoff: u64::MAX,
        }
    }

    /// The last segment this round holds: `u64::MAX` when every segment
    /// from `from` on fit.
    pub fn cutoff(&self) -> u64 {
        self.cutoff
    }

    /// Segments with blocks left.
    pub fn segment_count(&self) -> usize {
        self.segments.len()
    }

    pub fn is_empty(&self) -> bool {
        self.segments.is_empty()
    }

    /// Notes a stored piece: `len` bytes at data offset `offset` of
    /// segment `seq`.
    pub fn add(&mut self, seq: u64, offset: u64, len: u64) {
        if seq < self.from || seq > self.cutoff || len == 0 {
            return;
        }
        let (first, last) = (offset / BLOCK_BYTES, (offset + len - 1) / BLOCK_BYTES);
        let s = self.segments.entry(seq).or_default();
        let need = usize::try_from(last / 64 + 1).unwrap_or(usize::MAX);
        if s.words.len() < need {
            self.words += need - s.words.len();
            s.words.resize(need, 0);
        }
        for b in first..=last {
            let (w, bit) = ((b / 64) as usize, 1u64 << (b % 64));
            if s.words[w] & bit == 0 {
                s.words[w] |= bit;
                s.blocks += 1;
                s.left += 1;
            }
        }
        s.bytes += len;
        // Over the bound: the highest segments wait for the next round
        // (one segment is always held: its bitmap is bounded by its size).
        while self.words > MAX_LIVE_WORDS && self.segments.len() > 1 {
            if let Some((dropped, bits)) = self.segments.pop_last() {
                self.words -= bits.words.len();
                self.cutoff = dropped - 1;
            }
        }
    }

    /// A reader's lead: what is left of segments `seq..seq + segments`
    /// (the reader's and the next ones: an imported image's segments are
    /// in address order), whole, in units of at most `unit_blocks`, at most
    /// `max_blocks` in all. Whole segments, not what lies after the reader:
    /// a file walk jumps back and forth within a directory's region.
    pub fn take_lead(
        &mut self,
        seq: u64,
        segments: u64,
        unit_blocks: u64,
        max_blocks: u64,
    ) -> Vec<Unit> {
        let seqs: Vec<u64> = self
            .segments
            .range(seq..seq.saturating_add(segments))
            .map(|(&s, _)| s)
            .collect();
        let mut out = Vec::new();
        let mut taken = 0u64;
        for s in seqs {
            while taken < max_blocks {
                let Some(first) = self.segments.get(&s).and_then(|b| next_set(&b.words, 0)) else {
                    break;
                };
                let Some(u) = self.take(s, first, unit_blocks.min(max_blocks - taken)) else {
                    break;
                };
                taken += u.blocks.len() as u64;
                out.push(u);
            }
        }
        out
    }

    /// The first `n` segments with blocks left.
    pub fn first_segments(&self, n: usize) -> Vec<u64> {
        self.segments.keys().take(n).copied().collect()
    }

    /// Up to `n` segments after `seq` with blocks left.
    pub fn segments_after(&self, seq: u64, n: usize) -> Vec<u64> {
        self.segments
            .range(seq.saturating_add(1)..)
            .take(n)
            .map(|(&s, _)| s)
            .collect()
    }

    /// Takes up to `max_blocks` blocks' span of the lowest segment's live
    /// blocks, from its first one left.
    pub fn take_next(&mut self, max_blocks: u64) -> Option<Unit> {
        let (&seq, s) = self.segments.iter().next()?;
        let first = next_set(&s.words, 0)?;
        self.take(seq, first, max_blocks)
    }

    /// Takes the live blocks of `seq` in `first..first + max_blocks`.
    fn take(&mut self, seq: u64, first: u64, max_blocks: u64) -> Option<Unit> {
        let s = self.segments.get_mut(&seq)?;
        let end = first.saturating_add(max_blocks);
        let mut blocks = Vec::new();
        let mut b = first;
        while let Some(n) = next_set(&s.words, b).filter(|&n| n < end) {
            s.words[(n / 64) as usize] &= !(1u64 << (n % 64));
            blocks.push(n);
            b = n + 1;
        }
        s.left -= blocks.len() as u64;
        let bytes =
            (u128::from(s.bytes) * blocks.len() as u128 / u128::from(s.blocks.max(1))) as u64;
        if s.left == 0 {
            if let Some(gone) = self.segments.remove(&seq) {
                self.words -= gone.words.len();
            }
        }
        (!blocks.is_empty()).then_some(Unit { seq, blocks, bytes })
    }
}

/// The first set bit at or after `from`.
fn next_set(words: &[u64], from: u64) -> Option<u64> {
    let mut w = usize::try_from(from / 64).ok()?;
    let mut word = words.get(w)? & (u64::MAX << (from % 64));
    loop {
        if word != 0 {
            return Some(w as u64 * 64 + u64::from(word.trailing_zeros()));
        }
        w += 1;
        word = *words.get(w)?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const B: u64 = BLOCK_BYTES;

    #[test]
    fn pieces_of_many_windows_of_one_segment_are_taken_once() {
        let mut live = LiveBlocks::new(0);
        // Two pieces in one block, one spanning two, one far out.
        live.add(5, 0, 100);
        live.add(5, 200, 100);
        live.add(5, 3 * B - 1, 2);
        live.add(5, 100 * B, B);
        live.add(6, 0, B);
        let u = live.take_next(64).expect("a unit");
        assert_eq!((u.seq, u.blocks.clone()), (5, vec![0, 2, 3]));
        let u = live.take_next(64).expect("a unit");
        assert_eq!((u.seq, u.blocks.clone()), (5, vec![100]));
        let u = live.take_next(64).expect("a unit");
        assert_eq!((u.seq, u.blocks.clone()), (6, vec![0]));
        assert!(live.take_next(64).is_none());
        assert!(live.is_empty());
        assert_eq!(live.words, 0);
    }

    #[test]
    fn a_lead_takes_the_readers_segment_whole_and_the_next_ones() {
        let mut live = LiveBlocks::new(0);
        for seq in [1, 2, 3, 7] {
            live.add(seq, 0, 8 * B);
        }
        // Units of 5 blocks, 12 at most: segment 1 whole, then 2's first 4.
        let got: Vec<(u64, usize)> = live
            .take_lead(1, 3, 5, 12)
            .iter()
            .map(|u| (u.seq, u.blocks.len()))
            .collect();
        assert_eq!(got, vec![(1, 5), (1, 3), (2, 4)]);
        // Again: the rest of 2, and 3 (7 is past the 3 segments).
        let got: Vec<(u64, usize)> = live
            .take_lead(1, 3, 8, 64)
            .iter()
            .map(|u| (u.seq, u.blocks.len()))
            .collect();
        assert_eq!(got, vec![(2, 4), (3, 8)]);
        assert!(live.take_lead(1, 3, 8, 64).is_empty(), "taken already");
        assert_eq!(live.segments_after(1, 2), vec![7]);
        assert_eq!(live.first_segments(1), vec![7]);
        assert_eq!(live.take_lead(5, 3, 8, 64).len(), 1, "segment 7");
    }

    #[test]
    fn bytes_are_shared_by_a_segments_blocks() {
        let mut live = LiveBlocks::new(0);
        live.add(1, 0, 4 * B);
        let u = live.take_next(2).expect("a unit");
        assert_eq!(u.bytes, 2 * B);
    }

    #[test]
    fn segments_over_the_bound_wait_for_a_later_round() {
        let mut live = LiveBlocks::new(10);
        live.add(9, 0, B);
        assert!(live.is_empty(), "before the round's first segment");
        let per_segment = 64 * 1024 * B; // 1,024 words each
        let fit = MAX_LIVE_WORDS as u64 / 1024;
        for seq in 10..10 + fit + 5 {
            live.add(seq, per_segment - B, B);
        }
        assert_eq!(live.cutoff(), 10 + fit - 1);
        assert!(live.words <= MAX_LIVE_WORDS);
        live.add(10 + fit + 3, 0, B);
        assert_eq!(live.segments.len() as u64, fit);
    }

    #[test]
    fn next_set_finds_bits_across_words() {
        let words = [0u64, 1 << 3, 0, 1 << 63];
        assert_eq!(next_set(&words, 0), Some(67));
        assert_eq!(next_set(&words, 67), Some(67));
        assert_eq!(next_set(&words, 68), Some(255));
        assert_eq!(next_set(&words, 256), None);
        assert_eq!(next_set(&[], 0), None);
    }
}
