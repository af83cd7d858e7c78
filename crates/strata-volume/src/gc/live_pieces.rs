//! The pieces of a stored segment the extent map still points at.
//!
//! Found from the segment's own entry table: each write entry's volume
//! range is looked up, and a piece counts only where the map points at
//! exactly that entry's bytes. A later entry of the same segment over the
//! same range points at other bytes, so no byte is counted twice. Cost:
//! O(entries x log extents), never a scan of the whole map.

use crate::format::segment::{Entry, EntryKind};
use crate::map::{ExtentMap, Target};

/// A live piece: `len` bytes at `segment_offset` of the data area, mapped
/// at `volume_offset`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LivePiece {
    pub volume_offset: u64,
    pub segment_offset: u64,
    pub len: u64,
}

/// Live pieces of segment `seq` among `entries`, in data-area order,
/// neighbours merged.
pub(crate) fn live_pieces(map: &ExtentMap, seq: u64, entries: &[Entry]) -> Vec<LivePiece> {
    let mut out: Vec<LivePiece> = Vec::new();
    for e in entries.iter().filter(|e| e.kind == EntryKind::Write) {
        map.lookup(e.offset, e.len, |p| {
            let want = e.data_offset + (p.start - e.offset);
            if p.target == Some(Target::Data { seq, offset: want }) {
                out.push(LivePiece {
                    volume_offset: p.start,
                    segment_offset: want,
                    len: p.len,
                });
            }
        });
    }
    out.sort_by_key(|p| p.segment_offset);
    let mut merged: Vec<LivePiece> = Vec::with_capacity(out.len());
    for p in out {
        match merged.last_mut() {
            Some(last)
                if last.segment_offset + last.len == p.segment_offset
                    && last.volume_offset + last.len == p.volume_offset =>
            {
                last.len += p.len;
            }
            _ => merged.push(p),
        }
    }
    merged
}

/// `pieces` (read in data-area order, their bytes concatenated in
/// `data`) and their bytes reordered by volume offset: copies appended in
/// that order lay a volume's data out in address order again, so a later
/// sequential read finds it contiguous.
pub(crate) fn in_address_order(pieces: &[LivePiece], data: &[u8]) -> (Vec<LivePiece>, Vec<u8>) {
    let mut at = Vec::with_capacity(pieces.len());
    let mut offset = 0usize;
    for p in pieces {
        at.push(offset);
        offset += p.len as usize;
    }
    let mut order: Vec<usize> = (0..pieces.len()).collect();
    order.sort_by_key(|&i| pieces[i].volume_offset);
    let mut sorted = Vec::with_capacity(pieces.len());
    let mut bytes = Vec::with_capacity(data.len());
    for i in order {
        sorted.push(pieces[i]);
        bytes.extend_from_slice(&data[at[i]..at[i] + pieces[i].len as usize]);
    }
    (sorted, bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(offset: u64, len: u64, data_offset: u64) -> Entry {
        Entry {
            kind: EntryKind::Write,
            offset,
            len,
            data_offset,
        }
    }

    #[test]
    fn address_order_moves_each_piece_with_its_bytes() {
        let pieces = [
            LivePiece {
                volume_offset: 8192,
                segment_offset: 0,
                len: 2,
            },
            LivePiece {
                volume_offset: 0,
                segment_offset: 100,
                len: 3,
            },
            LivePiece {
                volume_offset: 4096,
                segment_offset: 200,
                len: 1,
            },
        ];
        let (sorted, bytes) = in_address_order(&pieces, b"aabbbc");
        let starts: Vec<u64> = sorted.iter().map(|p| p.volume_offset).collect();
        assert_eq!(starts, vec![0, 4096, 8192]);
        assert_eq!(bytes, b"bbbcaa");
    }

    #[test]
    fn only_what_the_map_still_points_at_counts_once() {
        let mut map = ExtentMap::new();
        let entries = [
            write(0, 8192, 0),
            write(4096, 4096, 8192),
            write(65536, 4096, 12288),
        ];
        for e in &entries {
            let target = Target::Data {
                seq: 5,
                offset: e.data_offset,
            };
            map.set(e.offset, e.len, Some(target));
        }
        // A later segment overwrites the third entry.
        map.set(65536, 4096, Some(Target::Data { seq: 6, offset: 0 }));
        let pieces = live_pieces(&map, 5, &entries);
        assert_eq!(
            pieces,
            vec![
                LivePiece {
                    volume_offset: 0,
                    segment_offset: 0,
                    len: 4096
                },
                LivePiece {
                    volume_offset: 4096,
                    segment_offset: 8192,
                    len: 4096
                },
            ]
        );
        let live: u64 = pieces.iter().map(|p| p.len).sum();
        assert_eq!(live, map.usage().live_bytes(5));
    }
}
