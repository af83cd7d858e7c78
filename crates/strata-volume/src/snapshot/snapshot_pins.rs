//! The segments a volume's snapshots keep: for each, how many snapshots'
//! maps point into it. Garbage collection neither picks a pinned segment,
//! nor moves data out of it on a read, nor lists it for deletion: a
//! snapshot's map points at exact `(segment, offset)` places, and a diff
//! between snapshots compares those places (moved data would look
//! changed).
//!
//! Memory is one entry per pinned segment (not per snapshot): a snapshot's
//! segments are read back from its checkpoint when it is deleted.

use std::collections::BTreeMap;

use crate::map::SegmentUsage;

#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct SnapshotPins {
    /// Segment seq -> snapshots whose map points into it (at least 1).
    counts: BTreeMap<u64, u32>,
    /// A clone's segments up to this number are its ancestors': kept as
    /// if pinned (0: not a clone).
    inherited_upto: u64,
}

impl SnapshotPins {
    /// Pins every segment `usage` has live bytes in (one snapshot's map).
    pub fn pin(&mut self, usage: &SegmentUsage) {
        for (seq, _) in usage.iter() {
            *self.counts.entry(seq).or_insert(0) += 1;
        }
    }

    /// Undoes `pin` of the same usage (a snapshot deleted, or one whose
    /// creation failed).
    pub fn unpin(&mut self, usage: &SegmentUsage) {
        for (seq, _) in usage.iter() {
            if let Some(n) = self.counts.get_mut(&seq) {
                *n -= 1;
                if *n == 0 {
                    self.counts.remove(&seq);
                }
            }
        }
    }

    pub fn is_pinned(&self, seq: u64) -> bool {
        seq <= self.inherited_upto || self.counts.contains_key(&seq)
    }

    /// Keeps segments up to `seq` (a clone's ancestors').
    pub fn inherit_upto(&mut self, seq: u64) {
        self.inherited_upto = seq;
    }

    /// Segments pinned by snapshots.
    pub fn len(&self) -> usize {
        self.counts.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_segment_stays_pinned_until_its_last_snapshot_lets_go() {
        let mut a = SegmentUsage::default();
        a.add(1, 10);
        a.add(2, 10);
        let mut b = SegmentUsage::default();
        b.add(2, 5);
        b.add(3, 5);
        let mut pins = SnapshotPins::default();
        pins.pin(&a);
        pins.pin(&b);
        assert_eq!(pins.len(), 3);
        pins.unpin(&a);
        assert!(!pins.is_pinned(1));
        assert!(pins.is_pinned(2) && pins.is_pinned(3));
        pins.unpin(&b);
        assert_eq!(pins.len(), 0);
        // Unpinning what is not pinned changes nothing.
        pins.unpin(&b);
        assert_eq!(pins, SnapshotPins::default());
    }
}
