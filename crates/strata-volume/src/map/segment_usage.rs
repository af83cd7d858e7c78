//! Live bytes per segment: how many bytes of each segment's data the extent
//! map still points at.
//!
//! Kept by `ExtentMap` on every change (a write adds to its segment, an
//! overwrite, TRIM or WRITE_ZEROES takes from the segments it replaces), so
//! garbage collection can rank segments by what rewriting them reclaims
//! without scanning the map. Memory is O(segments with live data): one
//! B-tree entry (16 bytes plus overhead) each; a segment whose last live
//! byte goes is dropped from the table.

use std::collections::BTreeMap;

#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct SegmentUsage {
    live_bytes: BTreeMap<u64, u64>,
}

impl SegmentUsage {
    /// `bytes` of segment `seq` became live (the map points at them).
    pub(crate) fn add(&mut self, seq: u64, bytes: u64) {
        *self.live_bytes.entry(seq).or_insert(0) += bytes;
    }

    /// `bytes` of segment `seq` are no longer live.
    pub(crate) fn remove(&mut self, seq: u64, bytes: u64) {
        let Some(live) = self.live_bytes.get_mut(&seq) else {
            debug_assert!(false, "segment {seq} has no live bytes to remove");
            return;
        };
        debug_assert!(
            *live >= bytes,
            "segment {seq}: {live} live, {bytes} removed"
        );
        *live = live.saturating_sub(bytes);
        if *live == 0 {
            self.live_bytes.remove(&seq);
        }
    }

    /// Live bytes of segment `seq` (0 if the map points at none).
    pub fn live_bytes(&self, seq: u64) -> u64 {
        self.live_bytes.get(&seq).copied().unwrap_or(0)
    }

    /// Segments with live bytes, in sequence order.
    pub fn iter(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.live_bytes.iter().map(|(&s, &b)| (s, b))
    }

    /// Segments with live bytes.
    pub fn len(&self) -> usize {
        self.live_bytes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.live_bytes.is_empty()
    }

    /// Live bytes of all segments.
    pub fn total_live_bytes(&self) -> u64 {
        self.live_bytes.values().sum()
    }
}
