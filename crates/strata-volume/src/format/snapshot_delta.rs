//! Snapshot deltas: what changed from one snapshot of a volume to the next,
//! so a diff reads what changed instead of two whole maps
//! (`snapshot/changed_ranges.rs` builds them, `engine/diffs.rs` reads them).
//!
//! A delta from checkpoint F to checkpoint T lists pieces covering every
//! range where the two snapshots' maps differ, in order: where each piece
//! lives in T's map (data at a place of a segment, allocated zeros, or a
//! hole) and where it lived in F's (a place, or zeros). A range it does
//! not list is at the same place, or zeros, in both.
//!
//! ## Object layout (little endian), `<volume>/deltas/<T>-<F>`
//!
//! ```text
//!   0  8  magic "STRATDLT"
//!   8  2  version (1)
//!  10  6  zero
//!  16  8  to: the newer snapshot's checkpoint seq
//!  24  8  from: the older snapshot's checkpoint seq (< to)
//!  32 16  volume uuid
//!  48  8  volume size in bytes at `to` (pieces may lie past it: a
//!         shrink between the snapshots cut them; every piece ends within
//!         `MAX_VOLUME_BYTES`)
//!  56  8  piece_count
//!  64  4  CRC32C of the pieces
//!  68  4  CRC32C of bytes [0, 68)
//!  72     piece_count x 40 bytes, sorted, non-overlapping, none empty,
//!         none at the same place in both:
//!           0 8 volume offset   8 8 length
//!          16 8 at `to`: segment seq (u64::MAX: zeros, u64::MAX - 1:
//!               a hole), at most `to`
//!          24 4 at `to`: data offset (0 for zeros and holes)
//!          28 4 at `from`: data offset (0 for zeros)
//!          32 8 at `from`: segment seq (u64::MAX: zeros), at most `from`
//! ```

use super::bytes::{array16, le_u32, le_u64};
use crate::map::Target;

const MAGIC: &[u8; 8] = b"STRATDLT";
const VERSION: u16 = 1;
const HEADER_BYTES: usize = 72;
const PIECE_BYTES: usize = 40;
const ZERO_SEQ: u64 = u64::MAX;
const HOLE_SEQ: u64 = u64::MAX - 1;
/// Every piece ends within the largest volume (`config::MAX_VOLUME_BYTES`;
/// `format/` depends on nothing above it, a test checks they agree).
pub const MAX_VOLUME_BYTES: u64 = 1 << 50;

/// One changed range: what the newer map has there, and where the older
/// had its data (`(seq, offset)`; `None`: zeros).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeltaPiece {
    pub start: u64,
    pub len: u64,
    /// `None`: a hole.
    pub after: Option<Target>,
    pub before: Option<(u64, u64)>,
}

impl DeltaPiece {
    pub fn end(&self) -> u64 {
        self.start + self.len
    }

    /// Where the newer map has the data (`None`: zeros).
    pub fn after_place(&self) -> Option<(u64, u64)> {
        match self.after {
            Some(Target::Data { seq, offset }) => Some((seq, offset)),
            _ => None,
        }
    }

    /// Whether the range is at the same place (or zeros) before and
    /// after: such a piece says nothing and is never stored.
    pub fn is_no_change(&self) -> bool {
        self.before == self.after_place()
    }

    /// The part of the piece in `[from, to)` (which must overlap it).
    pub fn clipped(&self, from: u64, to: u64) -> DeltaPiece {
        let start = self.start.max(from);
        let end = self.end().min(to);
        let skip = start - self.start;
        let after = match self.after {
            Some(Target::Data { seq, offset }) => Some(Target::Data {
                seq,
                offset: offset + skip,
            }),
            other => other,
        };
        DeltaPiece {
            start,
            len: end - start,
            after,
            before: self.before.map(|(seq, offset)| (seq, offset + skip)),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeltaInfo {
    pub to_seq: u64,
    pub from_seq: u64,
    pub volume_uuid: [u8; 16],
    pub volume_size_bytes: u64,
}

pub fn encode(info: &DeltaInfo, pieces: &[DeltaPiece]) -> Vec<u8> {
    let mut b = Vec::with_capacity(HEADER_BYTES + PIECE_BYTES * pieces.len());
    b.extend_from_slice(MAGIC);
    b.extend_from_slice(&VERSION.to_le_bytes());
    b.extend_from_slice(&[0u8; 6]);
    b.extend_from_slice(&info.to_seq.to_le_bytes());
    b.extend_from_slice(&info.from_seq.to_le_bytes());
    b.extend_from_slice(&info.volume_uuid);
    b.extend_from_slice(&info.volume_size_bytes.to_le_bytes());
    b.extend_from_slice(&(pieces.len() as u64).to_le_bytes());
    b.extend_from_slice(&[0u8; 8]);
    for p in pieces {
        let (seq, offset) = match p.after {
            Some(Target::Data { seq, offset }) => (seq, offset as u32),
            Some(Target::Zero) => (ZERO_SEQ, 0),
            None => (HOLE_SEQ, 0),
        };
        b.extend_from_slice(&p.start.to_le_bytes());
        b.extend_from_slice(&p.len.to_le_bytes());
        b.extend_from_slice(&seq.to_le_bytes());
        b.extend_from_slice(&offset.to_le_bytes());
        let (before_seq, before_offset) = p.before.unwrap_or((ZERO_SEQ, 0));
        b.extend_from_slice(&(before_offset as u32).to_le_bytes());
        b.extend_from_slice(&before_seq.to_le_bytes());
    }
    let body_crc = crc32c::crc32c(&b[HEADER_BYTES..]);
    b[64..68].copy_from_slice(&body_crc.to_le_bytes());
    let header_crc = crc32c::crc32c(&b[0..68]);
    b[68..72].copy_from_slice(&header_crc.to_le_bytes());
    b
}

/// Verifies and loads a delta: checksums, order, bounds.
pub fn decode(b: &[u8]) -> Result<(DeltaInfo, Vec<DeltaPiece>), String> {
    if b.len() < HEADER_BYTES || &b[0..8] != MAGIC {
        return Err("not a strata snapshot delta (bad magic or truncated)".into());
    }
    let version = u16::from_le_bytes([b[8], b[9]]);
    if version != VERSION {
        return Err(format!(
            "unsupported snapshot delta version {version} (this strata reads {VERSION}; a newer strata wrote it: upgrade)"
        ));
    }
    if crc32c::crc32c(&b[0..68]) != le_u32(&b[68..72]) {
        return Err("snapshot delta header checksum mismatch".into());
    }
    let info = DeltaInfo {
        to_seq: le_u64(&b[16..24]),
        from_seq: le_u64(&b[24..32]),
        volume_uuid: array16(&b[32..48]),
        volume_size_bytes: le_u64(&b[48..56]),
    };
    if info.from_seq >= info.to_seq {
        return Err("snapshot delta goes backwards".into());
    }
    let count = le_u64(&b[56..64]);
    let body = &b[HEADER_BYTES..];
    if count.checked_mul(PIECE_BYTES as u64) != Some(body.len() as u64) {
        return Err("snapshot delta length does not match its piece count".into());
    }
    if crc32c::crc32c(body) != le_u32(&b[64..68]) {
        return Err("snapshot delta checksum mismatch".into());
    }
    let mut pieces = Vec::with_capacity(count as usize);
    let mut next_start = 0u64;
    for raw in body.chunks_exact(PIECE_BYTES) {
        let p = decode_piece(raw, &info)?;
        if p.start < next_start {
            return Err("snapshot delta pieces overlap or are out of order".into());
        }
        next_start = p.end();
        pieces.push(p);
    }
    Ok((info, pieces))
}

fn decode_piece(raw: &[u8], info: &DeltaInfo) -> Result<DeltaPiece, String> {
    let (start, len, seq) = (
        le_u64(&raw[0..8]),
        le_u64(&raw[8..16]),
        le_u64(&raw[16..24]),
    );
    let offset = u64::from(le_u32(&raw[24..28]));
    let end = start.checked_add(len);
    if len == 0 || end.is_none_or(|e| e > MAX_VOLUME_BYTES) {
        return Err(format!(
            "snapshot delta piece {start}+{len} is empty or past the largest volume"
        ));
    }
    let after = match seq {
        ZERO_SEQ | HOLE_SEQ if offset != 0 => {
            return Err("snapshot delta piece of zeros has a data offset".into())
        }
        ZERO_SEQ => Some(Target::Zero),
        HOLE_SEQ => None,
        s if s == 0 || s > info.to_seq => {
            return Err(format!(
                "snapshot delta piece points into segment {s}, not written by checkpoint {}",
                info.to_seq
            ))
        }
        s if offset
            .checked_add(len)
            .is_none_or(|e| e > u64::from(u32::MAX)) =>
        {
            return Err(format!(
                "snapshot delta piece in segment {s} ends past 4 GiB"
            ))
        }
        s => Some(Target::Data { seq: s, offset }),
    };
    let (before_seq, before_offset) = (le_u64(&raw[32..40]), u64::from(le_u32(&raw[28..32])));
    let before = match before_seq {
        ZERO_SEQ if before_offset == 0 => None,
        s if s != 0 && s <= info.from_seq && before_offset + len <= u64::from(u32::MAX) => {
            Some((s, before_offset))
        }
        s => {
            return Err(format!(
                "snapshot delta piece {start}+{len} was at segment {s} offset {before_offset}: not a place of checkpoint {}",
                info.from_seq
            ))
        }
    };
    let piece = DeltaPiece {
        start,
        len,
        after,
        before,
    };
    if piece.is_no_change() {
        return Err(format!("snapshot delta piece {start}+{len} did not change"));
    }
    Ok(piece)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> (DeltaInfo, Vec<DeltaPiece>) {
        let info = DeltaInfo {
            to_seq: 9,
            from_seq: 4,
            volume_uuid: [7; 16],
            volume_size_bytes: 1 << 30,
        };
        let pieces = vec![
            DeltaPiece {
                start: 0,
                len: 4096,
                after: Some(Target::Data {
                    seq: 9,
                    offset: 8192,
                }),
                before: None,
            },
            DeltaPiece {
                start: 8192,
                len: 1 << 20,
                after: Some(Target::Zero),
                before: Some((3, 4096)),
            },
            DeltaPiece {
                start: 2 << 20,
                len: 5,
                after: None,
                before: Some((4, 0)),
            },
        ];
        (info, pieces)
    }

    #[test]
    fn round_trip_and_every_flipped_byte_is_caught() {
        let (info, pieces) = sample();
        let b = encode(&info, &pieces);
        assert_eq!(b.len(), HEADER_BYTES + 3 * PIECE_BYTES);
        assert_eq!(decode(&b).unwrap(), (info, pieces));
        for i in 0..b.len() {
            let mut c = b.clone();
            c[i] ^= 0x10;
            assert!(decode(&c).is_err(), "byte {i}");
        }
        assert!(decode(&b[..b.len() - 1]).is_err());
    }

    #[test]
    fn bad_pieces_are_refused_with_a_reason() {
        let (info, mut pieces) = sample();
        pieces[1].start = 100; // overlaps the first
        assert!(decode(&encode(&info, &pieces))
            .unwrap_err()
            .contains("overlap"));
        let (info, mut pieces) = sample();
        pieces[0].after = Some(Target::Data { seq: 10, offset: 0 });
        assert!(decode(&encode(&info, &pieces))
            .unwrap_err()
            .contains("segment 10"));
        let (info, mut pieces) = sample();
        pieces[2].len = MAX_VOLUME_BYTES;
        assert!(decode(&encode(&info, &pieces))
            .unwrap_err()
            .contains("past the largest volume"));
        let (info, mut pieces) = sample();
        pieces[1].before = Some((9, 0));
        assert!(decode(&encode(&info, &pieces))
            .unwrap_err()
            .contains("not a place of"));
        let (info, mut pieces) = sample();
        pieces[1].after = None;
        pieces[1].before = None;
        assert!(decode(&encode(&info, &pieces))
            .unwrap_err()
            .contains("did not change"));
        let (mut info, pieces) = sample();
        info.from_seq = 9;
        assert!(decode(&encode(&info, &pieces))
            .unwrap_err()
            .contains("backwards"));
    }
}
