//! Which stored segments a compaction pass rewrites.
//!
//! Ranked by live share, emptiest first: rewriting a segment that is a
//! fraction `u` live copies `u` to reclaim `1 - u`, so the emptiest give
//! the most space per byte copied. A segment is taken while
//!
//! - its live share is below the threshold (default 60%), or
//! - the volume's stored bytes exceed its live bytes by more than the
//!   space target (default 140%): then fuller segments go too, emptiest
//!   first, until the projected total meets the target, or
//! - it is small (under a quarter of a segment; FLUSH-heavy clients and the
//!   age sealer make these) and there are at least two to pack together,
//!
//! and the pass's copy budget allows. Segments with no live bytes are not
//! victims: nothing to copy; the next checkpoint makes them deletable.

use std::collections::BTreeMap;

use crate::map::SegmentUsage;
use crate::snapshot::SnapshotPins;

/// What a pass may take.
#[derive(Debug, Clone, Copy)]
pub(crate) struct VictimPolicy {
    pub live_threshold_percent: u32,
    pub space_target_percent: u32,
    /// Segments smaller than this are packed together.
    pub small_segment_bytes: u64,
    /// Live bytes a pass copies at most.
    pub max_copy_bytes: u64,
}

/// A segment chosen for compaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Victim {
    pub seq: u64,
    /// Logical bytes the segment holds (`State::gc_weights`): live and
    /// stored compare in one unit whether it is compressed or not.
    pub stored_bytes: u64,
    pub live_bytes: u64,
}

/// Picks victims among `stored` (seq -> logical bytes the segment holds,
/// `State::gc_weights`) by `usage`.
pub(crate) fn pick_victims(
    stored: &BTreeMap<u64, u64>,
    usage: &SegmentUsage,
    pins: &SnapshotPins,
    policy: &VictimPolicy,
) -> Vec<Victim> {
    // A segment a snapshot keeps is never a victim: rewriting it frees
    // nothing, and its data must stay where the snapshot's map says.
    let mut candidates: Vec<Victim> = stored
        .iter()
        .filter(|(&seq, _)| !pins.is_pinned(seq))
        .map(|(&seq, &stored_bytes)| Victim {
            seq,
            stored_bytes,
            live_bytes: usage.live_bytes(seq).min(stored_bytes),
        })
        .filter(|v| v.live_bytes > 0)
        .collect();
    let live_total: u64 = candidates.iter().map(|v| v.live_bytes).sum();
    let mut stored_total: u64 = candidates.iter().map(|v| v.stored_bytes).sum();
    let small = candidates
        .iter()
        .filter(|v| v.stored_bytes < policy.small_segment_bytes)
        .count();
    // Emptiest first; u128 cross-multiplication compares ratios exactly.
    candidates.sort_by(|a, b| {
        let l = u128::from(a.live_bytes) * u128::from(b.stored_bytes);
        let r = u128::from(b.live_bytes) * u128::from(a.stored_bytes);
        l.cmp(&r).then(a.seq.cmp(&b.seq))
    });
    let target_stored = live_total.saturating_mul(u64::from(policy.space_target_percent)) / 100;
    let mut out = Vec::new();
    let mut copy_bytes = 0u64;
    for v in candidates {
        let below_threshold =
            v.live_bytes * 100 < v.stored_bytes * u64::from(policy.live_threshold_percent);
        let over_target = stored_total > target_stored && v.live_bytes < v.stored_bytes;
        let packable = small >= 2 && v.stored_bytes < policy.small_segment_bytes;
        if !(below_threshold || over_target || packable) {
            continue;
        }
        if copy_bytes + v.live_bytes > policy.max_copy_bytes && !out.is_empty() {
            break;
        }
        copy_bytes += v.live_bytes;
        // After the rewrite the segment's live bytes sit in a new segment.
        stored_total = stored_total - v.stored_bytes + v.live_bytes;
        out.push(v);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn usage(live: &[(u64, u64)]) -> SegmentUsage {
        let mut u = SegmentUsage::default();
        for &(seq, bytes) in live {
            u.add(seq, bytes);
        }
        u
    }

    const POLICY: VictimPolicy = VictimPolicy {
        live_threshold_percent: 60,
        space_target_percent: 140,
        small_segment_bytes: 100,
        max_copy_bytes: 1 << 40,
    };

    #[test]
    fn emptiest_first_below_the_threshold_and_none_without_live_data() {
        let stored = BTreeMap::from([(1, 1000), (2, 1000), (3, 1000), (4, 1000)]);
        let u = usage(&[(1, 500), (2, 100), (3, 950)]);
        let seqs: Vec<u64> = pick_victims(&stored, &u, &SnapshotPins::default(), &POLICY)
            .iter()
            .map(|v| v.seq)
            .collect();
        // 4 has nothing live (deleted, not copied); 3 is 95% live and the
        // volume is within its space target once 1 and 2 are rewritten.
        assert_eq!(seqs, vec![2, 1]);
    }

    #[test]
    fn over_the_space_target_fuller_segments_go_too() {
        let stored = BTreeMap::from([(1, 1000), (2, 1000), (3, 1000)]);
        let u = usage(&[(1, 650), (2, 650), (3, 700)]);
        // stored 3000 > 1.4 x 2000 live: the emptiest go until the target
        // holds (after rewriting 1: 2650 <= 2800).
        let seqs: Vec<u64> = pick_victims(&stored, &u, &SnapshotPins::default(), &POLICY)
            .iter()
            .map(|v| v.seq)
            .collect();
        assert_eq!(seqs, vec![1]);
    }

    #[test]
    fn small_segments_are_packed_and_the_budget_bounds_a_pass() {
        let stored = BTreeMap::from([(1, 50), (2, 60), (3, 1000)]);
        let u = usage(&[(1, 50), (2, 60), (3, 1000)]);
        let seqs: Vec<u64> = pick_victims(&stored, &u, &SnapshotPins::default(), &POLICY)
            .iter()
            .map(|v| v.seq)
            .collect();
        assert_eq!(seqs, vec![1, 2]);
        let tight = VictimPolicy {
            max_copy_bytes: 55,
            ..POLICY
        };
        assert_eq!(
            pick_victims(&stored, &u, &SnapshotPins::default(), &tight).len(),
            1
        );
    }
}
