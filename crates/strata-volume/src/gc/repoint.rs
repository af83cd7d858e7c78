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
const COPY_OVERHEAD_BYTES: u64 = 32;

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
            let bytes = &data[from..from + len as usize];
            let cost = len + COPY_OVERHEAD_BYTES;
            let data_offset = st.open.push_copy(start, bytes, cost);
            let target = Target::Data {
                seq: st.open.seq,
                offset: data_offset,
            };
            st.map.set(start, len, Some(target));
            st.buffered_cost_bytes += cost;
            out.copied_bytes += len;
        }
        at += p.len as usize;
    }
    out
}
