//! The journal file's byte layout: superblock and records.
//!
//! Encoding, decoding and verification only; the file itself (ring, group
//! commit, scan) belongs to `write/journal*.rs`.
//!
//! ## File layout
//!
//! ```text
//! [0, 4096)            superblock
//! [4096, 4096+ring)    ring of records; logical position `lpos` maps to
//!                      ring offset lpos % ring_bytes
//!
//! superblock (little endian):
//!   0  8  magic "STRATJNL"
//!   8  2  version (1)
//!  10  6  reserved, zero
//!  16 16  volume uuid
//!  32 16  journal id (random per journal file instance)
//!  48  8  ring_bytes
//!  56  8  start_jseq: sequence number of the first record ever written
//!  64  4  CRC32C of bytes [0, 64)
//!
//! record (8-byte aligned, never split by the ring's end):
//!   0  4  magic 0x4A524543
//!   4  1  kind: 1 write, 2 zero (allocated), 3 unmap, 4 wrap, 5 placed
//!   5  3  reserved, zero
//!   8  8  jseq (a wrap record carries the jseq of the record after it)
//!  16  8  volume byte offset
//!  24  8  length in bytes of the range
//!  32  4  payload bytes (= length for writes, 0 otherwise)
//!  36  4  CRC32C seeded with the journal id, over bytes [0, 36) and payload
//!  40  .. payload, then zero padding to a multiple of 8
//! ```
//!
//! A placed write (kind 5) is a write whose bytes are not in the record but
//! in the staged file of the segment they belong to
//! (`write/staged_segment.rs`); its payload says where (32 bytes):
//! ```text
//!   0  8  segment seq
//!   8  8  staged file tag (the file is `<segment object>#<tag>`)
//!  16  8  file offset of the bytes
//!  24  4  CRC32C of the bytes (unseeded)
//!  28  4  zero
//! ```
//! Replay reads the bytes there and checks them against the CRC. A file
//! that is gone or bytes that do not match end the replay, as a bad record
//! does: the record is appended under the volume lock and the bytes
//! written just after, outside it; no later write is acknowledged, and no
//! FLUSH syncs, until they are (`write/staged_segment.rs`), and a FLUSH
//! syncs staged files before the journal. So such a record is a write no
//! FLUSH covered, and so is every record after it.
//!
//! A record that does not fit before the ring's end is preceded by a wrap
//! record (or, with fewer than 40 bytes left, by nothing) and starts at ring
//! offset 0. Recovery scans from a position the store remembers (the
//! `journal_end_lpos` of the last segment it holds) and stops at the first
//! record whose magic, CRC or jseq is not the expected one; stale records
//! of an earlier lap have a smaller jseq, and those of an earlier journal
//! instance fail the CRC because the journal id seeds it.

use super::bytes::{array16, le_u32, le_u64};

pub const SUPERBLOCK_BYTES: u64 = 4096;
/// Bytes of the superblock that carry data (the rest of its 4 KiB is zero).
pub const SUPERBLOCK_USED_BYTES: usize = 68;
pub const RECORD_HEADER_BYTES: u64 = 40;
const JOURNAL_MAGIC: &[u8; 8] = b"STRATJNL";
const JOURNAL_VERSION: u16 = 1;
const RECORD_MAGIC: u32 = 0x4A52_4543;
/// Smallest ring accepted.
pub const MIN_RING_BYTES: u64 = 1 << 20;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum RecordKind {
    Write = 1,
    Zero = 2,
    Unmap = 3,
    Wrap = 4,
    Placed = 5,
}

impl RecordKind {
    fn from_u8(v: u8) -> Option<RecordKind> {
        Some(match v {
            1 => RecordKind::Write,
            2 => RecordKind::Zero,
            3 => RecordKind::Unmap,
            4 => RecordKind::Wrap,
            5 => RecordKind::Placed,
            _ => return None,
        })
    }
}

/// Bytes a record with `payload_bytes` of payload occupies in the ring.
pub fn record_bytes(payload_bytes: usize) -> u64 {
    (RECORD_HEADER_BYTES + payload_bytes as u64 + 7) & !7
}

/// Payload bytes of a placed write's record.
pub const PLACED_PAYLOAD_BYTES: usize = 32;

/// Where a placed write's bytes are (see the module doc).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Placed {
    pub seq: u64,
    pub tag: u64,
    pub file_offset: u64,
    pub data_crc: u32,
}

impl Placed {
    pub fn encode(&self) -> [u8; PLACED_PAYLOAD_BYTES] {
        let mut b = [0u8; PLACED_PAYLOAD_BYTES];
        b[0..8].copy_from_slice(&self.seq.to_le_bytes());
        b[8..16].copy_from_slice(&self.tag.to_le_bytes());
        b[16..24].copy_from_slice(&self.file_offset.to_le_bytes());
        b[24..28].copy_from_slice(&self.data_crc.to_le_bytes());
        b
    }

    /// Decodes a placed write's payload (its record's CRC already checked).
    pub fn decode(b: &[u8]) -> Result<Placed, String> {
        if b.len() != PLACED_PAYLOAD_BYTES || le_u32(&b[28..32]) != 0 {
            return Err(format!(
                "placed write payload of {} bytes is malformed",
                b.len()
            ));
        }
        Ok(Placed {
            seq: le_u64(&b[0..8]),
            tag: le_u64(&b[8..16]),
            file_offset: le_u64(&b[16..24]),
            data_crc: le_u32(&b[24..28]),
        })
    }
}

/// The identity and geometry a superblock records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Superblock {
    pub volume_uuid: [u8; 16],
    pub journal_id: [u8; 16],
    pub ring_bytes: u64,
    pub start_jseq: u64,
}

impl Superblock {
    /// The whole 4 KiB superblock.
    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; SUPERBLOCK_BYTES as usize];
        b[0..8].copy_from_slice(JOURNAL_MAGIC);
        b[8..10].copy_from_slice(&JOURNAL_VERSION.to_le_bytes());
        b[16..32].copy_from_slice(&self.volume_uuid);
        b[32..48].copy_from_slice(&self.journal_id);
        b[48..56].copy_from_slice(&self.ring_bytes.to_le_bytes());
        b[56..64].copy_from_slice(&self.start_jseq.to_le_bytes());
        let crc = crc32c::crc32c(&b[0..64]);
        b[64..68].copy_from_slice(&crc.to_le_bytes());
        b
    }

    pub fn decode(b: &[u8]) -> Result<Superblock, String> {
        if b.len() < SUPERBLOCK_USED_BYTES || &b[0..8] != JOURNAL_MAGIC {
            return Err("bad superblock magic".into());
        }
        let version = u16::from_le_bytes([b[8], b[9]]);
        if version != JOURNAL_VERSION {
            return Err(format!("unsupported journal version {version}"));
        }
        if le_u32(&b[64..68]) != crc32c::crc32c(&b[0..64]) {
            return Err("superblock checksum mismatch".into());
        }
        let sb = Superblock {
            volume_uuid: array16(&b[16..32]),
            journal_id: array16(&b[32..48]),
            ring_bytes: le_u64(&b[48..56]),
            start_jseq: le_u64(&b[56..64]),
        };
        if sb.ring_bytes < MIN_RING_BYTES || !sb.ring_bytes.is_multiple_of(8) {
            return Err(format!("implausible ring size {}", sb.ring_bytes));
        }
        Ok(sb)
    }
}

/// A record header as read from the ring, before its payload is checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordHeader {
    pub kind: RecordKind,
    pub jseq: u64,
    pub offset: u64,
    pub len: u64,
    pub payload_bytes: u32,
    crc: u32,
}

impl RecordHeader {
    /// Decodes a header; `None` where no valid record starts (the end of
    /// the log during a scan, not an error).
    pub fn decode(h: &[u8]) -> Option<RecordHeader> {
        if h.len() < RECORD_HEADER_BYTES as usize || le_u32(&h[0..4]) != RECORD_MAGIC {
            return None;
        }
        let header = RecordHeader {
            kind: RecordKind::from_u8(h[4])?,
            jseq: le_u64(&h[8..16]),
            offset: le_u64(&h[16..24]),
            len: le_u64(&h[24..32]),
            payload_bytes: le_u32(&h[32..36]),
            crc: le_u32(&h[36..40]),
        };
        // A write carries exactly its range; nothing else carries bytes.
        let payload_ok = match header.kind {
            RecordKind::Write => header.len == u64::from(header.payload_bytes),
            RecordKind::Placed => {
                header.len > 0 && header.payload_bytes as usize == PLACED_PAYLOAD_BYTES
            }
            _ => true,
        };
        payload_ok.then_some(header)
    }

    /// Bytes the whole record occupies in the ring.
    pub fn record_bytes(&self) -> u64 {
        record_bytes(self.payload_bytes as usize)
    }

    /// Whether `payload` (and `raw_header`, the 40 bytes this was decoded
    /// from) match the record's checksum for journal `journal_id`.
    pub fn verify(&self, journal_id: &[u8; 16], raw_header: &[u8], payload: &[u8]) -> bool {
        raw_header.len() >= RECORD_HEADER_BYTES as usize
            && payload.len() == self.payload_bytes as usize
            && record_crc(journal_id, raw_header, payload) == self.crc
    }
}

fn record_crc(journal_id: &[u8; 16], header: &[u8], payload: &[u8]) -> u32 {
    record_crc_with(journal_id, header, payload, None)
}

/// The record CRC; with `chunk_crcs` (the CRCs of the payload's whole 4 KiB
/// chunks, `format/chunk_crcs.rs`) only the payload's tail is read.
fn record_crc_with(
    journal_id: &[u8; 16],
    header: &[u8],
    payload: &[u8],
    chunk_crcs: Option<&[u32]>,
) -> u32 {
    let crc = crc32c::crc32c(journal_id);
    let crc = crc32c::crc32c_append(crc, &header[0..36]);
    match chunk_crcs {
        Some(crcs) => super::chunk_crcs::append_with_chunk_crcs(crc, payload, crcs),
        None => crc32c::crc32c_append(crc, payload),
    }
}

/// Appends one whole record (header, payload, padding) to `out`.
#[allow(clippy::too_many_arguments)]
pub fn encode_record(
    out: &mut Vec<u8>,
    journal_id: &[u8; 16],
    kind: RecordKind,
    jseq: u64,
    offset: u64,
    len: u64,
    payload: &[u8],
) {
    encode_record_with(out, journal_id, kind, jseq, offset, len, payload, None);
}

/// `encode_record`, given the CRCs of the payload's whole 4 KiB chunks
/// (`format/chunk_crcs.rs`): the same bytes, without a CRC pass over them.
#[allow(clippy::too_many_arguments)]
pub fn encode_record_with(
    out: &mut Vec<u8>,
    journal_id: &[u8; 16],
    kind: RecordKind,
    jseq: u64,
    offset: u64,
    len: u64,
    payload: &[u8],
    chunk_crcs: Option<&[u32]>,
) {
    let mut h = [0u8; RECORD_HEADER_BYTES as usize];
    h[0..4].copy_from_slice(&RECORD_MAGIC.to_le_bytes());
    h[4] = kind as u8;
    h[8..16].copy_from_slice(&jseq.to_le_bytes());
    h[16..24].copy_from_slice(&offset.to_le_bytes());
    h[24..32].copy_from_slice(&len.to_le_bytes());
    h[32..36].copy_from_slice(&(payload.len() as u32).to_le_bytes());
    let crc = record_crc_with(journal_id, &h, payload, chunk_crcs);
    h[36..40].copy_from_slice(&crc.to_le_bytes());
    out.extend_from_slice(&h);
    out.extend_from_slice(payload);
    let pad = record_bytes(payload.len()) - RECORD_HEADER_BYTES - payload.len() as u64;
    out.extend(std::iter::repeat_n(0u8, pad as usize));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placed_records_round_trip_and_carry_exactly_their_pointer() {
        let p = Placed {
            seq: 9,
            tag: 1_234_567_890_123_456,
            file_offset: 90_112,
            data_crc: 0xdead_beef,
        };
        assert_eq!(Placed::decode(&p.encode()), Ok(p));
        let mut bad = p.encode();
        bad[30] = 1;
        assert!(Placed::decode(&bad).is_err());
        assert!(Placed::decode(&bad[..31]).is_err());
        let mut out = Vec::new();
        encode_record(
            &mut out,
            &[3; 16],
            RecordKind::Placed,
            4,
            8192,
            1 << 20,
            &p.encode(),
        );
        let h = RecordHeader::decode(&out).unwrap();
        assert_eq!(
            (h.kind, h.len, h.payload_bytes),
            (RecordKind::Placed, 1 << 20, 32)
        );
        assert!(h.verify(&[3; 16], &out[..40], &out[40..72]));
        // A placed record of another payload size, or of no length, is no
        // record.
        for (len, payload) in [(1 << 20, &[0u8; 24][..]), (0, &p.encode()[..])] {
            let mut out = Vec::new();
            encode_record(&mut out, &[3; 16], RecordKind::Placed, 4, 0, len, payload);
            assert!(RecordHeader::decode(&out).is_none());
        }
    }

    #[test]
    fn records_and_superblocks_round_trip_and_reject_corruption() {
        let sb = Superblock {
            volume_uuid: [1; 16],
            journal_id: [2; 16],
            ring_bytes: MIN_RING_BYTES,
            start_jseq: 5,
        };
        assert_eq!(Superblock::decode(&sb.encode()).unwrap(), sb);
        let mut bad = sb.encode();
        bad[20] ^= 1;
        assert!(Superblock::decode(&bad).is_err());
        let mut out = Vec::new();
        encode_record(
            &mut out,
            &sb.journal_id,
            RecordKind::Write,
            9,
            512,
            3,
            b"abc",
        );
        assert_eq!(out.len() as u64, record_bytes(3));
        let h = RecordHeader::decode(&out).unwrap();
        assert_eq!(
            (h.kind, h.jseq, h.offset, h.len),
            (RecordKind::Write, 9, 512, 3)
        );
        assert!(h.verify(&sb.journal_id, &out, &out[40..43]));
        assert!(!h.verify(&[3; 16], &out, &out[40..43]), "other journal");
        assert!(!h.verify(&sb.journal_id, &out, b"abd"), "payload");
        let mut bad = out.clone();
        bad[4] = 9;
        assert!(RecordHeader::decode(&bad).is_none(), "unknown kind");
    }

    #[test]
    fn a_record_encoded_from_chunk_crcs_is_the_same_record() {
        let payload: Vec<u8> = (0..(70u32 << 10) + 123)
            .map(|i| (i * 7 + i / 4096) as u8)
            .collect();
        for len in [0usize, 100, 4096, 8192, 8193, payload.len()] {
            let p = &payload[..len];
            let crcs = crate::format::chunk_crcs::whole_chunk_crcs(p);
            let (mut plain, mut with) = (Vec::new(), Vec::new());
            encode_record(
                &mut plain,
                &[3; 16],
                RecordKind::Write,
                9,
                4096,
                len as u64,
                p,
            );
            encode_record_with(
                &mut with,
                &[3; 16],
                RecordKind::Write,
                9,
                4096,
                len as u64,
                p,
                Some(&crcs),
            );
            assert!(plain == with, "len {len}");
        }
    }
}
