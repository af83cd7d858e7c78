//! The ranges of a volume that changed since its newest snapshot, and the
//! snapshot deltas made of them (`format/snapshot_delta.rs`), so that a
//! diff between two snapshots reads only what changed between them.
//!
//! Owns three rules:
//!
//! - **Tracking** (`ChangedRanges`): every client write, zeroing, trim and
//!   shrink marks its range before it changes the map, remembering where
//!   the newest snapshot had its data there (the map before the first
//!   change since that snapshot is the snapshot's map there). Zeros over zeros
//!   change nothing and are not marked. Garbage collection, read rewrites
//!   and flatten move data without changing it and mark nothing. In memory
//!   only: a volume opened computes its set from its map and the newest
//!   snapshot's (`between`), which it reads at open anyway to pin it.
//! - **A delta at each snapshot** (`pieces`): the set's ranges looked up in
//!   the map at the seal point. The places it names are the new
//!   snapshot's, kept by its pins, so they stay readable while it lives.
//! - **Overlay** (`overlay`): deltas A->B and B->C make A->C: C's places,
//!   A's places. A piece at the same place in both (a rollback put it
//!   back) is no change. Deleting a snapshot merges its delta into the next
//!   one's, so the deltas always chain from each snapshot to the next.
//!
//! Memory: one entry per changed run, at most the map's extent count plus
//! one; bounded as the map is.

use std::collections::BTreeMap;

use super::diff::{differing, push_change, Change, ChangeKind, Place};
use crate::format::snapshot_delta::DeltaPiece;
use crate::map::{ExtentMap, Target};

/// Ranges changed since the snapshot at checkpoint `since_seq`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ChangedRanges {
    since_seq: u64,
    /// start -> (length, where the snapshot had the run's first byte).
    ranges: BTreeMap<u64, (u64, Place)>,
}

impl ChangedRanges {
    /// Nothing changed since the snapshot at `since_seq` (just taken).
    pub fn new(since_seq: u64) -> ChangedRanges {
        ChangedRanges {
            since_seq,
            ranges: BTreeMap::new(),
        }
    }

    /// What changed from `snapshot` (at checkpoint `since_seq`) to `live`,
    /// `size` the larger of their sizes.
    pub fn between(since_seq: u64, snapshot: &ExtentMap, live: &ExtentMap, size: u64) -> Self {
        let mut out = ChangedRanges::new(since_seq);
        differing(snapshot, live, size, |start, end, before, _| {
            out.insert(start, end - start, before)
        });
        out
    }

    pub fn since_seq(&self) -> u64 {
        self.since_seq
    }

    /// Marks `[start, start+len)` before an operation changes it in `map`
    /// (`map` as it is before the change); `writes_data` for writes, else
    /// zeros or a trim, which change nothing where there is no data.
    pub fn mark(&mut self, map: &ExtentMap, start: u64, len: u64, writes_data: bool) {
        for (gap_start, gap_len) in self.gaps(start, len) {
            map.lookup(gap_start, gap_len, |p| {
                let place = match p.target {
                    Some(Target::Data { seq, offset }) => Some((seq, offset)),
                    _ => None,
                };
                if writes_data || place.is_some() {
                    self.insert(p.start, p.len, place);
                }
            });
        }
    }

    /// Folds in older changes `(start, length, place then)`, relative to
    /// the snapshot at `since_seq`: the delta of the snapshot this set was
    /// relative to (being deleted), or the set a failed snapshot replaced.
    /// Where both changed, the older place wins.
    pub fn absorb_older(
        &mut self,
        since_seq: u64,
        older: impl IntoIterator<Item = (u64, u64, Place)>,
    ) {
        for (start, len, before) in older {
            self.punch(start, len);
            self.insert(start, len, before);
        }
        self.since_seq = since_seq;
    }

    /// The changed runs: `(start, length, place then)`.
    pub fn runs(&self) -> impl Iterator<Item = (u64, u64, Place)> + '_ {
        self.ranges.iter().map(|(&s, &(l, b))| (s, l, b))
    }

    /// The delta of a snapshot taken now: each changed range as `map` has
    /// it, without ranges that read zeros both times. Ranges past the
    /// volume's end stay (a shrink cut them; a later grow must not make a
    /// diff across both forget it).
    pub fn pieces(&self, map: &ExtentMap) -> Vec<DeltaPiece> {
        let mut out = Vec::new();
        for (&start, &(len, before)) in &self.ranges {
            map.lookup(start, len, |p| {
                let piece = DeltaPiece {
                    start: p.start,
                    len: p.len,
                    after: p.target,
                    before: advanced(before, p.start - start),
                };
                if !piece.is_no_change() {
                    push_piece(&mut out, piece);
                }
            });
        }
        out
    }

    /// The parts of `[start, start+len)` not marked yet.
    fn gaps(&self, start: u64, len: u64) -> Vec<(u64, u64)> {
        let end = start + len;
        let mut out = Vec::new();
        let mut pos = start;
        if let Some((&k, &(l, _))) = self.ranges.range(..start).next_back() {
            pos = pos.max(k + l);
        }
        for (&k, &(l, _)) in self.ranges.range(start..end) {
            if k > pos {
                out.push((pos, k - pos));
            }
            pos = pos.max(k + l);
        }
        if pos < end {
            out.push((pos, end - pos));
        }
        out
    }

    /// Removes `[start, start+len)` from the set, splitting runs.
    fn punch(&mut self, start: u64, len: u64) {
        let end = start + len;
        if let Some((&k, &(l, b))) = self.ranges.range(..start).next_back() {
            if k + l > start {
                self.ranges.insert(k, (start - k, b));
                if k + l > end {
                    self.ranges.insert(end, (k + l - end, advanced(b, end - k)));
                }
            }
        }
        let inside: Vec<u64> = self.ranges.range(start..end).map(|(&k, _)| k).collect();
        for k in inside {
            if let Some((l, b)) = self.ranges.remove(&k) {
                if k + l > end {
                    self.ranges.insert(end, (k + l - end, advanced(b, end - k)));
                }
            }
        }
    }

    /// Adds a run over unmarked space, merged with neighbours it
    /// continues (zeros after zeros, or data right after data).
    fn insert(&mut self, start: u64, len: u64, before: Place) {
        let (mut start, mut len, mut before) = (start, len, before);
        if let Some((&k, &(l, b))) = self.ranges.range(..start).next_back() {
            debug_assert!(k + l <= start, "insert over a marked range");
            if k + l == start && advanced(b, l) == before {
                self.ranges.remove(&k);
                len += start - k;
                start = k;
                before = b;
            }
        }
        if let Some(&(l, b)) = self.ranges.get(&(start + len)) {
            if advanced(before, len) == b {
                self.ranges.remove(&(start + len));
                len += l;
            }
        }
        self.ranges.insert(start, (len, before));
    }
}

/// `place` moved on by `by` bytes (zeros stay zeros).
fn advanced(place: Place, by: u64) -> Place {
    place.map(|(seq, offset)| (seq, offset + by))
}

/// Appends `p`, merged with the last piece when it continues it.
fn push_piece(out: &mut Vec<DeltaPiece>, p: DeltaPiece) {
    if let Some(last) = out.last_mut() {
        let after_continues = match (last.after, p.after) {
            (
                Some(Target::Data {
                    seq: s1,
                    offset: o1,
                }),
                Some(Target::Data {
                    seq: s2,
                    offset: o2,
                }),
            ) => s1 == s2 && o1 + last.len == o2,
            (a, b) => a == b,
        };
        let continues = after_continues && advanced(last.before, last.len) == p.before;
        let fits = last.len + p.len <= u64::from(u32::MAX) & !4095;
        if last.end() == p.start && continues && fits {
            last.len += p.len;
            return;
        }
    }
    out.push(p);
}

/// Deltas `older` (A->B) and `newer` (B->C) as one (A->C): C's contents
/// where `newer` has a piece, B's (`older`'s) elsewhere; A's before-state
/// wherever `older` has a piece. Ranges at the same place (or zeros) in A
/// and C drop.
pub(crate) fn overlay(older: &[DeltaPiece], newer: &[DeltaPiece]) -> Vec<DeltaPiece> {
    let mut out = Vec::new();
    let (mut i, mut j, mut pos) = (0usize, 0usize, 0u64);
    loop {
        while older.get(i).is_some_and(|p| p.end() <= pos) {
            i += 1;
        }
        while newer.get(j).is_some_and(|p| p.end() <= pos) {
            j += 1;
        }
        let (o, n) = (older.get(i), newer.get(j));
        let next = [o, n].into_iter().flatten().map(|p| p.start).min();
        let Some(next) = next else { break };
        pos = pos.max(next);
        let in_o = o.filter(|p| p.start <= pos);
        let in_n = n.filter(|p| p.start <= pos);
        let mut end = u64::MAX;
        for p in [o, n].into_iter().flatten() {
            end = end.min(if p.start <= pos { p.end() } else { p.start });
        }
        let piece = match (in_o, in_n) {
            (_, Some(n)) => DeltaPiece {
                before: match in_o {
                    Some(o) => o.clipped(pos, end).before,
                    None => n.clipped(pos, end).before,
                },
                ..n.clipped(pos, end)
            },
            (Some(o), None) => o.clipped(pos, end),
            (None, None) => unreachable!("pos is the start of a piece"),
        };
        if !piece.is_no_change() {
            push_piece(&mut out, piece);
        }
        pos = end;
    }
    out
}

/// The changes a delta lists within `[0, size)`.
pub(crate) fn changes_of(pieces: &[DeltaPiece], size: u64) -> Vec<Change> {
    let mut out = Vec::new();
    for p in pieces.iter().filter(|p| p.start < size) {
        let kind = match p.after {
            Some(Target::Data { .. }) => ChangeKind::Data,
            _ => ChangeKind::Zero,
        };
        if !p.is_no_change() {
            push_change(&mut out, p.start, p.len.min(size - p.start), kind);
        }
    }
    out
}

/// The newer snapshot's data in a delta, as a map (holes elsewhere): what
/// an export of the changes reads through.
pub(crate) fn data_map(pieces: &[DeltaPiece]) -> ExtentMap {
    let mut map = ExtentMap::new();
    for p in pieces {
        if let Some(t @ Target::Data { .. }) = p.after {
            map.set(p.start, p.len, Some(t));
        }
    }
    map
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::snapshot::diff_maps;

    /// A small deterministic generator (no extra dependency for tests).
    struct Lcg(u64, u64);
    impl Lcg {
        fn next(&mut self, n: u64) -> u64 {
            self.0 = self
                .0
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (self.0 >> 33) % n
        }
    }

    const SIZE: u64 = 64 * 4096;

    /// One random operation on `map`, marked in `changed` first, as the
    /// write path does; `seq` is the segment written to.
    fn random_op(rng: &mut Lcg, map: &mut ExtentMap, changed: &mut ChangedRanges, seq: u64) {
        // Every write goes to a place of its own, as in a segment.
        rng.1 += 1 << 16;
        let start = rng.next(64) * 4096;
        let len = (1 + rng.next(8)).min(64 - start / 4096) * 4096;
        let target = match rng.next(4) {
            0 => Some(Target::Zero),
            1 => None,
            _ => Some(Target::Data { seq, offset: rng.1 }),
        };
        let writes = matches!(target, Some(Target::Data { .. }));
        changed.mark(map, start, len, writes);
        map.set(start, len, target);
    }

    /// Random histories: the deltas, alone and overlaid, say exactly what
    /// the full comparison of the two maps says.
    #[test]
    fn deltas_agree_with_comparing_whole_maps() {
        for round in 0..300 {
            let mut rng = Lcg(round, 0);
            let mut map = ExtentMap::new();
            let mut changed = ChangedRanges::new(0);
            let mut seq = 1;
            for _ in 0..rng.next(30) {
                random_op(&mut rng, &mut map, &mut changed, seq);
            }
            // Snapshots 1..=4, each with its delta from the previous.
            let mut snaps = vec![map.clone()];
            let mut deltas = Vec::new();
            changed = ChangedRanges::new(1);
            for s in 2..=4 {
                for _ in 0..rng.next(20) {
                    seq += 1;
                    random_op(&mut rng, &mut map, &mut changed, seq);
                }
                deltas.push(changed.pieces(&map));
                snaps.push(map.clone());
                changed = ChangedRanges::new(s);
            }
            for (k, d) in deltas.iter().enumerate() {
                let full = diff_maps(&snaps[k], &snaps[k + 1], SIZE);
                assert_eq!(changes_of(d, SIZE), full, "round {round} delta {k}");
            }
            let two = overlay(&deltas[0], &deltas[1]);
            let all = overlay(&two, &deltas[2]);
            assert_eq!(
                changes_of(&two, SIZE),
                diff_maps(&snaps[0], &snaps[2], SIZE),
                "round {round} 0->2"
            );
            assert_eq!(
                changes_of(&all, SIZE),
                diff_maps(&snaps[0], &snaps[3], SIZE),
                "round {round} 0->3"
            );
            // The set recomputed from the maps gives the same delta.
            let again = ChangedRanges::between(1, &snaps[0], &snaps[1], SIZE);
            assert_eq!(
                changes_of(&again.pieces(&snaps[1]), SIZE),
                changes_of(&deltas[0], SIZE),
                "round {round} between"
            );
            // The newest snapshot deleted: live changes relative to the one before.
            for _ in 0..rng.next(10) {
                seq += 1;
                random_op(&mut rng, &mut map, &mut changed, seq);
            }
            let older = deltas[2].iter().map(|p| (p.start, p.len, p.before));
            changed.absorb_older(3, older);
            assert_eq!(changed.since_seq(), 3);
            assert_eq!(
                changes_of(&changed.pieces(&map), SIZE),
                diff_maps(&snaps[2], &map, SIZE),
                "round {round} absorb"
            );
        }
    }

    #[test]
    fn zeros_over_zeros_mark_nothing_and_runs_merge() {
        let mut map = ExtentMap::new();
        let mut c = ChangedRanges::new(1);
        c.mark(&map, 0, 8192, false);
        assert_eq!(c.runs().count(), 0);
        c.mark(&map, 0, 4096, true);
        map.set(0, 4096, Some(Target::Data { seq: 2, offset: 0 }));
        c.mark(&map, 4096, 4096, true);
        map.set(
            4096,
            4096,
            Some(Target::Data {
                seq: 2,
                offset: 4096,
            }),
        );
        assert_eq!(c.runs().count(), 1);
        let p = c.pieces(&map);
        assert_eq!(p.len(), 1, "{p:?}");
        assert_eq!(p[0].len, 8192);
        // Written then trimmed: zeros before and after, no change left.
        c.mark(&map, 0, 8192, false);
        map.set(0, 8192, None);
        assert!(c.pieces(&map).is_empty());
    }
}
