//! Rewriting what a fragmented read found, contiguously.
//!
//! A volume written randomly scatters neighbouring blocks over many
//! segments; a large read of it (backup, image copy, file scan) then costs
//! one piece per few KiB instead of one run. When such a read has been
//! served, its stored pieces are appended to the open segment in address
//! order, as one entry per run of neighbouring pieces, and the map set to
//! them: the next read of the range is one run in one segment, and the old
//! copies become garbage that compaction reclaims.
//!
//! The move is a GC copy (`repoint.rs`'s rules): it lands only where the map
//! still points exactly at the bytes the read returned (a write that came
//! in between wins), it is not journaled, and a crash before its segment is
//! stored leaves the map recovered pointing at the old pieces, which are
//! not deleted before a checkpoint that no longer needs them.

use crate::map::Target;
use crate::write::state::State;

use super::repoint::{append_copy, RepointOutcome, COPY_OVERHEAD_BYTES};

/// Reads shorter than this are never rewritten (a random 4 KiB read cannot
/// be fragmented, and a small one gains little).
const MIN_REWRITE_READ_BYTES: u64 = 128 << 10;
/// A read is fragmented when its stored runs average less than this.
const MIN_AVERAGE_RUN_BYTES: u64 = 64 << 10;

/// A stored piece a read returned: `len` bytes mapped at `volume_offset`,
/// read from `segment_offset` of segment `seq`, found at `buf_offset` of the
/// read's buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ReadPiece {
    pub volume_offset: u64,
    pub seq: u64,
    pub segment_offset: u64,
    pub len: u64,
    pub buf_offset: usize,
}

/// Whether a read of `read_bytes` whose stored pieces are `pieces` (in
/// address order) is fragmented enough to be worth rewriting: long, and
/// its pieces in more runs than one per `MIN_AVERAGE_RUN_BYTES`. Pieces
/// that continue the previous one in its segment count as one run.
pub(crate) fn is_fragmented(read_bytes: u64, pieces: &[ReadPiece]) -> bool {
    if read_bytes < MIN_REWRITE_READ_BYTES || pieces.len() < 2 {
        return false;
    }
    let stored_bytes: u64 = pieces.iter().map(|p| p.len).sum();
    let runs = 1 + pieces
        .windows(2)
        .filter(|w| !continues(&w[0], &w[1]))
        .count() as u64;
    stored_bytes >= MIN_REWRITE_READ_BYTES && runs * MIN_AVERAGE_RUN_BYTES > stored_bytes
}

/// `b` follows `a` both in the volume and in the same segment.
fn continues(a: &ReadPiece, b: &ReadPiece) -> bool {
    a.seq == b.seq
        && a.segment_offset + a.len == b.segment_offset
        && a.volume_offset + a.len == b.volume_offset
}

/// Bytes a rewrite of `pieces` adds to the write buffer at most.
pub(crate) fn rewrite_cost_bytes(pieces: &[ReadPiece]) -> u64 {
    pieces.iter().map(|p| p.len + COPY_OVERHEAD_BYTES).sum()
}

/// Appends the parts of `pieces` (the read's bytes are `buf`) the map still
/// points at to the open segment, one entry per run of volume neighbours,
/// and points the map at them.
pub(crate) fn repoint_read(st: &mut State, pieces: &[ReadPiece], buf: &[u8]) -> RepointOutcome {
    let mut out = RepointOutcome::default();
    // (volume start, len, buffer offset) still pointing where they were read.
    let mut still: Vec<(u64, u64, usize)> = Vec::with_capacity(pieces.len());
    for p in pieces {
        let mut kept = 0;
        st.map.lookup(p.volume_offset, p.len, |q| {
            let delta = q.start - p.volume_offset;
            let want = Target::Data {
                seq: p.seq,
                offset: p.segment_offset + delta,
            };
            if q.target == Some(want) {
                kept += q.len;
                let from = p.buf_offset + delta as usize;
                match still.last_mut() {
                    Some(last)
                        if last.0 + last.1 == q.start && last.2 + last.1 as usize == from =>
                    {
                        last.1 += q.len
                    }
                    _ => still.push((q.start, q.len, from)),
                }
            }
        });
        out.superseded_bytes += p.len - kept;
    }
    for (start, len, from) in still {
        append_copy(st, start, &buf[from..from + len as usize]);
        out.copied_bytes += len;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::segment::EntryKind;

    fn piece(volume_offset: u64, seq: u64, segment_offset: u64, len: u64) -> ReadPiece {
        ReadPiece {
            volume_offset,
            seq,
            segment_offset,
            len,
            buf_offset: volume_offset as usize,
        }
    }

    #[test]
    fn only_long_reads_of_scattered_pieces_are_fragmented() {
        // 64 pieces of 4 KiB, each in another place: fragmented.
        let scattered: Vec<ReadPiece> = (0..64)
            .map(|i| piece(i * 4096, 3 + i % 2, (63 - i) * 4096, 4096))
            .collect();
        assert!(is_fragmented(256 << 10, &scattered));
        // The same read laid out contiguously: one run.
        let contiguous: Vec<ReadPiece> = (0..64)
            .map(|i| piece(i * 4096, 3, i * 4096, 4096))
            .collect();
        assert!(!is_fragmented(256 << 10, &contiguous));
        // Four runs of 64 KiB: not below the average run length.
        let runs: Vec<ReadPiece> = (0..4).map(|i| piece(i * 65536, 3 + i, 0, 65536)).collect();
        assert!(!is_fragmented(256 << 10, &runs));
        // A short read is never rewritten.
        assert!(!is_fragmented(64 << 10, &scattered[..16]));
    }

    /// Three 4 KiB pieces of segments 3 and 4 read at [0, 12 KiB); a user
    /// write replaces the middle one before the rewrite: the write wins and
    /// the other two move, each its own run (they are no longer neighbours).
    #[test]
    fn rewrite_moves_what_is_unchanged_in_runs_and_a_write_wins() {
        let mut st = State::for_tests(9);
        st.map.set(
            0,
            4096,
            Some(Target::Data {
                seq: 3,
                offset: 8192,
            }),
        );
        st.map
            .set(4096, 4096, Some(Target::Data { seq: 4, offset: 0 }));
        st.map
            .set(8192, 4096, Some(Target::Data { seq: 3, offset: 0 }));
        let pieces = [
            piece(0, 3, 8192, 4096),
            piece(4096, 4, 0, 4096),
            piece(8192, 3, 0, 4096),
        ];
        let buf: Vec<u8> = (0..12288u32).map(|i| (i / 4096) as u8 + 1).collect();
        let all = {
            let mut st2 = State::for_tests(9);
            st2.map = st.map.clone();
            let out = repoint_read(&mut st2, &pieces, &buf);
            let mut got = Vec::new();
            st2.map
                .lookup(0, 12288, |p| got.push((p.start, p.len, p.target)));
            assert_eq!(out.copied_bytes, 12288);
            assert_eq!(st2.open.entries.len(), 1, "one entry for the whole run");
            got
        };
        assert_eq!(
            all,
            vec![(0, 12288, Some(Target::Data { seq: 9, offset: 0 }))]
        );

        let at = st
            .open
            .push(EntryKind::Write, 4096, 4096, &[0xaa; 4096], 1, 4097, 1);
        st.map
            .set(4096, 4096, Some(Target::Data { seq: 9, offset: at }));
        let out = repoint_read(&mut st, &pieces, &buf);
        assert_eq!(
            out,
            RepointOutcome {
                copied_bytes: 8192,
                superseded_bytes: 4096
            }
        );
        assert_eq!(st.map.usage().live_bytes(3), 0);
        assert_eq!(st.map.usage().live_bytes(4), 0);
        let mut got = Vec::new();
        st.map
            .lookup(0, 12288, |p| got.push((p.start, p.len, p.target)));
        assert_eq!(
            got,
            vec![
                (
                    0,
                    4096,
                    Some(Target::Data {
                        seq: 9,
                        offset: 4096
                    })
                ),
                (4096, 4096, Some(Target::Data { seq: 9, offset: at })),
                (
                    8192,
                    4096,
                    Some(Target::Data {
                        seq: 9,
                        offset: 8192
                    })
                ),
            ]
        );
        // The bytes moved are the ones the read returned.
        assert_eq!(st.open.data[4096..8192], buf[..4096]);
        assert_eq!(st.open.data[8192..12288], buf[8192..]);
    }
}
