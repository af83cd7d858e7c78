//! The extent map: which bytes of the volume live where.
//!
//! It owns the mapping from volume byte ranges to locations in segments
//! (`seq`, offset) or to "allocated zeros". Ranges that are not mapped read
//! as zeros (holes). Memory is O(extents): 24 bytes per extent plus B-tree
//! overhead; lookups are O(log n) and allocate nothing.
//!
//! Invariants (checked by `check_invariants` in tests): extents never
//! overlap, none is empty, each is at most `MAX_EXTENT_BYTES` long.

use std::collections::BTreeMap;

use super::segment_usage::SegmentUsage;

/// Longest single extent; longer ranges are split (keeps `len` in a u32).
pub const MAX_EXTENT_BYTES: u64 = (u32::MAX as u64) & !4095;

/// `seq` value that marks an extent of allocated zeros.
const ZERO_SEQ: u64 = u64::MAX;

/// Where a mapped range lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// Bytes at `offset` in the data area of segment `seq`.
    Data { seq: u64, offset: u64 },
    /// Allocated, reads as zeros (WRITE_ZEROES with NO_HOLE).
    Zero,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Ext {
    seq: u64,
    offset: u32,
    len: u32,
}

impl Ext {
    fn target(&self) -> Target {
        if self.seq == ZERO_SEQ {
            Target::Zero
        } else {
            Target::Data {
                seq: self.seq,
                offset: u64::from(self.offset),
            }
        }
    }

    /// The same extent with its first `skip` bytes cut off.
    fn advanced(&self, skip: u64) -> Ext {
        debug_assert!(skip < u64::from(self.len));
        let offset = if self.seq == ZERO_SEQ {
            0
        } else {
            self.offset + skip as u32
        };
        Ext {
            seq: self.seq,
            offset,
            len: self.len - skip as u32,
        }
    }
}

/// One piece of a lookup: `len` bytes at volume offset `start`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Piece {
    pub start: u64,
    pub len: u64,
    /// `None` for a hole.
    pub target: Option<Target>,
}

/// A serialisable extent, as checkpoints store it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExtentRecord {
    pub start: u64,
    pub len: u64,
    pub target: Target,
}

/// Allocation state of a range (for NBD block status).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Allocation {
    Data,
    Zero,
    Hole,
}

#[derive(Debug, Default, Clone)]
pub struct ExtentMap {
    map: BTreeMap<u64, Ext>,
    /// Live bytes per segment, kept in step with `map` by `punch` and
    /// `insert_merging` (the only two places that change it).
    usage: SegmentUsage,
}

impl ExtentMap {
    pub fn new() -> Self {
        Self::default()
    }

    /// Number of extents (what memory use is proportional to).
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Maps `[start, start+len)` to `target` (or unmaps it with `None`),
    /// replacing whatever was there.
    pub fn set(&mut self, start: u64, len: u64, target: Option<Target>) {
        if len == 0 {
            return;
        }
        self.punch(start, len);
        let Some(target) = target else { return };
        let mut done = 0u64;
        while done < len {
            let piece = (len - done).min(MAX_EXTENT_BYTES);
            let ext = match target {
                Target::Zero => Ext {
                    seq: ZERO_SEQ,
                    offset: 0,
                    len: piece as u32,
                },
                Target::Data { seq, offset } => {
                    assert!(
                        offset + done + piece <= u64::from(u32::MAX),
                        "segment offset"
                    );
                    Ext {
                        seq,
                        offset: (offset + done) as u32,
                        len: piece as u32,
                    }
                }
            };
            self.insert_merging(start + done, ext);
            done += piece;
        }
    }

    /// Removes every mapping inside `[start, start+len)`, splitting the
    /// extents that straddle its edges.
    fn punch(&mut self, start: u64, len: u64) {
        let end = start + len;
        if let Some((&k, &e)) = self.map.range(..start).next_back() {
            let e_end = k + u64::from(e.len);
            if e_end > start {
                self.unaccount(&e, e_end.min(end) - start);
                self.map.insert(
                    k,
                    Ext {
                        len: (start - k) as u32,
                        ..e
                    },
                );
                if e_end > end {
                    self.map.insert(end, e.advanced(end - k));
                }
            }
        }
        while let Some((&k, &e)) = self.map.range(start..end).next() {
            self.map.remove(&k);
            let e_end = k + u64::from(e.len);
            self.unaccount(&e, e_end.min(end) - k);
            if e_end > end {
                self.map.insert(end, e.advanced(end - k));
            }
        }
    }

    /// `bytes` of extent `e` left the map.
    fn unaccount(&mut self, e: &Ext, bytes: u64) {
        if e.seq != ZERO_SEQ {
            self.usage.remove(e.seq, bytes);
        }
    }

    /// Inserts into a punched range, merging with a contiguous predecessor.
    fn insert_merging(&mut self, start: u64, ext: Ext) {
        if ext.seq != ZERO_SEQ {
            self.usage.add(ext.seq, u64::from(ext.len));
        }
        if let Some((&k, prev)) = self.map.range_mut(..start).next_back() {
            let contiguous = k + u64::from(prev.len) == start
                && prev.seq == ext.seq
                && (ext.seq == ZERO_SEQ || prev.offset + prev.len == ext.offset)
                && u64::from(prev.len) + u64::from(ext.len) <= MAX_EXTENT_BYTES;
            if contiguous {
                prev.len += ext.len;
                return;
            }
        }
        self.map.insert(start, ext);
    }

    /// Allocation of `[start, start+len)` in at most `max_runs` runs of
    /// `(length, allocation)` (NBD block status).
    pub fn allocation(&self, start: u64, len: u64, max_runs: usize) -> Vec<(u64, Allocation)> {
        let mut out: Vec<(u64, Allocation)> = Vec::new();
        self.lookup(start, len, |p| {
            let a = match p.target {
                None => Allocation::Hole,
                Some(Target::Zero) => Allocation::Zero,
                Some(Target::Data { .. }) => Allocation::Data,
            };
            match out.last_mut() {
                Some(last) if last.1 == a => last.0 += p.len,
                _ => out.push((p.len, a)),
            }
        });
        out.truncate(max_runs.max(1));
        out
    }

    /// Calls `f` for each piece of `[start, start+len)` in order: mapped
    /// pieces and holes, together covering the range exactly.
    pub fn lookup(&self, start: u64, len: u64, mut f: impl FnMut(Piece)) {
        let end = start + len;
        // Fast path, one search: the range lies inside one extent or one
        // hole (most 4 KiB reads).
        match self.map.range(..end).next_back() {
            None => {
                return f(Piece {
                    start,
                    len,
                    target: None,
                })
            }
            Some((&k, e)) if k <= start => {
                let e_end = k + u64::from(e.len);
                if e_end >= end {
                    let target = Some(e.advanced(start - k).target());
                    return f(Piece { start, len, target });
                }
                if e_end <= start {
                    return f(Piece {
                        start,
                        len,
                        target: None,
                    });
                }
            }
            Some(_) => {}
        }
        let mut pos = start;
        if let Some((&k, e)) = self.map.range(..start).next_back() {
            let e_end = k + u64::from(e.len);
            if e_end > start {
                let piece_end = e_end.min(end);
                let target = e.advanced(start - k).target();
                f(Piece {
                    start,
                    len: piece_end - start,
                    target: Some(target),
                });
                pos = piece_end;
            }
        }
        for (&k, e) in self.map.range(pos..end) {
            if k > pos {
                f(Piece {
                    start: pos,
                    len: k - pos,
                    target: None,
                });
            }
            let piece_end = (k + u64::from(e.len)).min(end);
            f(Piece {
                start: k,
                len: piece_end - k,
                target: Some(e.target()),
            });
            pos = piece_end;
        }
        if pos < end {
            f(Piece {
                start: pos,
                len: end - pos,
                target: None,
            });
        }
    }

    /// All extents in volume order.
    pub fn iter(&self) -> impl Iterator<Item = ExtentRecord> + '_ {
        self.map.iter().map(|(&start, e)| ExtentRecord {
            start,
            len: u64::from(e.len),
            target: e.target(),
        })
    }

    /// Bytes mapped to segment data (not zeros).
    pub fn data_bytes(&self) -> u64 {
        self.map
            .values()
            .filter(|e| e.seq != ZERO_SEQ)
            .map(|e| u64::from(e.len))
            .sum()
    }

    /// Live bytes per segment, as kept on every change.
    pub fn usage(&self) -> &SegmentUsage {
        &self.usage
    }

    /// Live bytes per segment computed from the extents alone (to check the
    /// kept table against: a difference is a bug).
    pub fn recompute_usage(&self) -> SegmentUsage {
        let mut usage = SegmentUsage::default();
        for e in self.map.values().filter(|e| e.seq != ZERO_SEQ) {
            usage.add(e.seq, u64::from(e.len));
        }
        usage
    }

    /// Panics unless extents are non-empty, ordered, non-overlapping, and
    /// the kept usage equals a recomputation. O(extents): tests and fuzzing.
    pub fn check_invariants(&self) {
        let mut prev_end = 0u64;
        for (&k, e) in &self.map {
            assert!(e.len > 0, "empty extent at {k}");
            assert!(k >= prev_end, "overlap at {k}");
            prev_end = k + u64::from(e.len);
        }
        assert_eq!(
            self.usage,
            self.recompute_usage(),
            "live bytes per segment drifted"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Reference model: one entry per byte.
    fn model_get(model: &[Option<(u64, u64)>], i: usize) -> Option<(u64, u64)> {
        model[i]
    }

    fn resolve(map: &ExtentMap, size: u64) -> Vec<Option<(u64, u64)>> {
        let mut out = Vec::new();
        map.lookup(0, size, |p| {
            for i in 0..p.len {
                out.push(p.target.map(|t| match t {
                    Target::Data { seq, offset } => (seq, offset + i),
                    Target::Zero => (u64::MAX, 0),
                }));
            }
        });
        out
    }

    #[test]
    fn random_sets_match_a_byte_model() {
        let size = 4096u64;
        let mut map = ExtentMap::new();
        let mut model: Vec<Option<(u64, u64)>> = vec![None; size as usize];
        let mut rng = 0x9e3779b97f4a7c15u64;
        let mut next = || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        for step in 0..5000u64 {
            let start = next() % size;
            let len = 1 + next() % (size - start).min(300);
            let kind = next() % 4;
            let target = match kind {
                0 => None,
                1 => Some(Target::Zero),
                _ => Some(Target::Data {
                    seq: step % 3,
                    offset: next() % 1000,
                }),
            };
            map.set(start, len, target);
            for i in 0..len {
                model[(start + i) as usize] = target.map(|t| match t {
                    Target::Data { seq, offset } => (seq, offset + i),
                    Target::Zero => (u64::MAX, 0),
                });
            }
            map.check_invariants();
            if step % 97 == 0 {
                let mut live = [0u64; 3];
                for (seq, _) in model.iter().flatten().filter(|t| t.0 != u64::MAX) {
                    live[*seq as usize] += 1;
                }
                for seq in 0..3 {
                    assert_eq!(map.usage().live_bytes(seq), live[seq as usize], "seq {seq}");
                }
                let got = resolve(&map, size);
                for (i, got) in got.iter().enumerate() {
                    assert_eq!(*got, model_get(&model, i), "byte {i} step {step}");
                }
                // Sub-range lookups (the fast paths): pieces cover the range
                // exactly, in order, and agree with the model.
                for _ in 0..50 {
                    let s0 = next() % size;
                    let l0 = 1 + next() % (size - s0).min(64);
                    let mut pos = s0;
                    map.lookup(s0, l0, |p| {
                        assert_eq!(p.start, pos, "pieces in order, no gap");
                        for i in 0..p.len {
                            let want = model_get(&model, (p.start + i) as usize);
                            let got = p.target.map(|t| match t {
                                Target::Data { seq, offset } => (seq, offset + i),
                                Target::Zero => (u64::MAX, 0),
                            });
                            assert_eq!(got, want, "byte {} of lookup({s0}, {l0})", p.start + i);
                        }
                        pos += p.len;
                    });
                    assert_eq!(pos, s0 + l0, "pieces cover the range");
                }
            }
        }
    }

    #[test]
    fn sequential_writes_merge_into_one_extent() {
        let mut map = ExtentMap::new();
        for i in 0..100u64 {
            map.set(
                i * 4096,
                4096,
                Some(Target::Data {
                    seq: 1,
                    offset: i * 4096,
                }),
            );
        }
        assert_eq!(map.len(), 1);
        map.set(4096, 4096, None);
        assert_eq!(map.len(), 2);
        assert_eq!(map.data_bytes(), 99 * 4096);
    }

    #[test]
    fn huge_zero_ranges_split() {
        let mut map = ExtentMap::new();
        map.set(0, 3 * MAX_EXTENT_BYTES + 5, Some(Target::Zero));
        map.check_invariants();
        let mut total = 0;
        map.lookup(0, 3 * MAX_EXTENT_BYTES + 5, |p| {
            assert_eq!(p.target, Some(Target::Zero));
            total += p.len;
        });
        assert_eq!(total, 3 * MAX_EXTENT_BYTES + 5);
    }
}
