//! Moving copied pieces into the open segment, under the volume lock.
//!
//! A copy lands only where the map still points exactly at the bytes it
//! was read from: a user write (or TRIM) that replaced part of a piece
//! while it was being read wins, and only the untouched sub-ranges move.
//! Nothing new ever points into a sealed segment, so "still points at
//! (seq, offset)" means "nobody wrote here since the copy was read".
//!
//! The copy is appended to the open segment as an ordinary write entry and
//! the map set to it in the same step, so it takes its place in the one
//! log order: recovery replaying segments applies it after every write that
//! preceded it and before every write that followed. It is not journaled:
//! if the process dies before its segment is stored, the map recovered
//! still points at the old segment, which is not deleted before a
//! checkpoint that no longer needs it is named by the manifest.

use super::live_pieces::LivePiece;
use crate::map::Target;
use crate::write::state::State;

/// Bytes a copy costs in the write buffer beyond its data (entry table).
pub(super) const COPY_OVERHEAD_BYTES: u64 = 32;

/// What a repoint did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RepointOutcome {
    /// Bytes now pointing at the open segment.
    pub copied_bytes: u64,
    /// Bytes a user write replaced in the meantime (not copied).
    pub superseded_bytes: u64,
}

/// Appends the still-live parts of `pieces` of segment `seq` (their bytes
/// concatenated in `data`) to the open segment and points the map at them.
pub(crate) fn repoint(
    st: &mut State,
    seq: u64,
    pieces: &[LivePiece],
    data: &[u8],
) -> RepointOutcome {
    let mut out = RepointOutcome::default();
    let mut at = 0usize;
    let mut still: Vec<(u64, u64, usize)> = Vec::new();
    for p in pieces {
        still.clear();
        st.map.lookup(p.volume_offset, p.len, |q| {
            let want = p.segment_offset + (q.start - p.volume_offset);
            if q.target == Some(Target::Data { seq, offset: want }) {
                still.push((q.start, q.len, at + (q.start - p.volume_offset) as usize));
            }
        });
        let kept: u64 = still.iter().map(|s| s.1).sum();
        out.superseded_bytes += p.len - kept;
        for &(start, len, from) in &still {
            append_copy(st, start, &data[from..from + len as usize]);
            out.copied_bytes += len;
        }
        at += p.len as usize;
    }
    out
}

/// Appends `bytes`, to be mapped at `start`, to the open segment as a copy
/// entry and points the map at them.
pub(super) fn append_copy(st: &mut State, start: u64, bytes: &[u8]) {
    let len = bytes.len() as u64;
    let cost = len + COPY_OVERHEAD_BYTES;
    let data_offset = st.open.push_copy(start, bytes, cost);
    let target = Target::Data {
        seq: st.open.seq,
        offset: data_offset,
    };
    st.map.set(start, len, Some(target));
    st.add_buffered(cost);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::segment::EntryKind;

    /// Segment 3 holds A = [0, 8 KiB) and B = [8, 16 KiB); the copy of
    /// both was read; then a user write lands on half of A (the same range)
    /// and one right after B (a neighbour) before the repoint.
    #[test]
    fn a_user_write_between_read_and_repoint_wins_and_neighbours_move() {
        let mut st = State::for_tests(9);
        st.map
            .set(0, 16384, Some(Target::Data { seq: 3, offset: 0 }));
        let pieces = [LivePiece {
            volume_offset: 0,
            segment_offset: 0,
            len: 16384,
        }];
        let copied: Vec<u8> = (0..16384u32).map(|i| (i / 4096) as u8 + 1).collect();
        // The user writes, in the open segment (as the write path does).
        for (offset, byte) in [(0u64, 0xaau8), (16384, 0xbb)] {
            let at = st.open.push(
                EntryKind::Write,
                offset,
                4096,
                &[byte; 4096],
                1,
                offset + 1,
                1,
            );
            st.map
                .set(offset, 4096, Some(Target::Data { seq: 9, offset: at }));
        }
        let before = st.map.usage().live_bytes(3);
        let out = repoint(&mut st, 3, &pieces, &copied);
        assert_eq!(
            out,
            RepointOutcome {
                copied_bytes: 12288,
                superseded_bytes: 4096
            }
        );
        assert_eq!(before, 12288);
        assert_eq!(st.map.usage().live_bytes(3), 0);
        assert_eq!(st.map.usage().live_bytes(9), 12288 + 8192);
        // Every 4 KiB block reads what the map now says: the user's write
        // where it landed, the copied bytes elsewhere.
        let mut got = Vec::new();
        st.map
            .lookup(0, 20480, |p| got.push((p.start, p.len, p.target)));
        for (start, len, target) in got {
            let Some(Target::Data { seq: 9, offset }) = target else {
                panic!("{start}: {target:?}");
            };
            let bytes = &st.open.data[offset as usize..(offset + len) as usize];
            for (i, b) in bytes.iter().enumerate() {
                let at = start + i as u64;
                let want = match at {
                    0..4096 => 0xaa,
                    16384.. => 0xbb,
                    _ => (at / 4096) as u8 + 1,
                };
                assert_eq!(*b, want, "byte {at}");
            }
        }
        st.map.check_invariants();
        assert_eq!(st.open.gc_copies, 1);
    }
}
