//! Segments: the immutable objects volume data lives in.
//!
//! This module owns the byte layout of a segment object: encoding its
//! header, and decoding and verifying what is read back from the store.
//! No I/O; the in-memory tail of the log is `write/open_segment.rs`.
//!
//! ## Object layout (little endian)
//!
//! ```text
//!   0  8  magic "STRATSEG"
//!   8  2  version (1)
//!  10  2  flags (0)
//!  12  4  header_bytes: fixed part + tables; the data area starts here
//!  16  8  seq
//!  24 16  volume uuid
//!  40 16  journal id of the journal the writes came through
//!  56  8  first_jseq  } journal records this segment holds
//!  64  8  last_jseq   }
//!  72  8  journal_end_lpos: journal position after last_jseq
//!  80  4  entry_count
//!  84  4  chunk_count = ceil(data_bytes / 4096)
//!  88  8  data_bytes
//!  96  4  CRC32C of the tables
//! 100  4  CRC32C of bytes [0, 100)
//! 104     chunk CRC32C table: chunk_count x u32, one per 4 KiB of data
//!         entry table: entry_count x 32 bytes:
//!           0 1 kind (1 write, 2 zero, 3 unmap)  1 7 zero
//!           8 8 volume offset  16 8 length  24 8 data offset (writes)
//! header_bytes  data area
//! ```
//! Every 4 KiB chunk of data is verified against its CRC when read from the
//! store, so a corrupt object is reported, never served.

use super::bytes::{array16, le_u32, le_u64};

pub const CHUNK_BYTES: u64 = 4096;
pub const FIXED_HEADER_BYTES: usize = 104;
const MAGIC: &[u8; 8] = b"STRATSEG";
const VERSION: u16 = 1;
const ENTRY_BYTES: usize = 32;
/// Bounds for decoding untrusted headers.
pub const MAX_SEGMENT_DATA_BYTES: u64 = 1 << 32;
pub const MAX_ENTRIES: u32 = 1 << 22;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryKind {
    Write,
    Zero,
    Unmap,
}

/// One logged operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    pub kind: EntryKind,
    pub offset: u64,
    pub len: u64,
    pub data_offset: u64,
}

/// The journal range a segment covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct JournalSpan {
    pub journal_id: [u8; 16],
    pub first_jseq: u64,
    pub last_jseq: u64,
    pub end_lpos: u64,
}

/// Bytes a journal span takes in a segment or checkpoint header.
pub const JOURNAL_SPAN_BYTES: usize = 40;

impl JournalSpan {
    /// Appends the 40-byte layout both headers share: journal id (16),
    /// first_jseq, last_jseq, end_lpos (8 each, little endian).
    pub fn encode_into(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.journal_id);
        out.extend_from_slice(&self.first_jseq.to_le_bytes());
        out.extend_from_slice(&self.last_jseq.to_le_bytes());
        out.extend_from_slice(&self.end_lpos.to_le_bytes());
    }

    /// Reads the layout of `encode_into` from the first 40 bytes of `b`
    /// (the caller has checked the length).
    pub fn decode(b: &[u8]) -> JournalSpan {
        JournalSpan {
            journal_id: array16(&b[0..16]),
            first_jseq: le_u64(&b[16..24]),
            last_jseq: le_u64(&b[24..32]),
            end_lpos: le_u64(&b[32..40]),
        }
    }
}

/// The header of segment `seq` of volume `volume_uuid` holding `entries`
/// and `data` (the data area follows it in the object).
pub fn encode_header(
    seq: u64,
    volume_uuid: &[u8; 16],
    span: &JournalSpan,
    entries: &[Entry],
    data: &[u8],
) -> Vec<u8> {
    let chunk_count = data.len().div_ceil(CHUNK_BYTES as usize);
    let header_bytes = FIXED_HEADER_BYTES + 4 * chunk_count + ENTRY_BYTES * entries.len();
    let mut h = Vec::with_capacity(header_bytes);
    h.extend_from_slice(MAGIC);
    h.extend_from_slice(&VERSION.to_le_bytes());
    h.extend_from_slice(&0u16.to_le_bytes());
    h.extend_from_slice(&(header_bytes as u32).to_le_bytes());
    h.extend_from_slice(&seq.to_le_bytes());
    h.extend_from_slice(volume_uuid);
    span.encode_into(&mut h);
    h.extend_from_slice(&(entries.len() as u32).to_le_bytes());
    h.extend_from_slice(&(chunk_count as u32).to_le_bytes());
    h.extend_from_slice(&(data.len() as u64).to_le_bytes());
    h.extend_from_slice(&[0u8; 8]);
    for chunk in data.chunks(CHUNK_BYTES as usize) {
        h.extend_from_slice(&crc32c::crc32c(chunk).to_le_bytes());
    }
    for e in entries {
        encode_entry(&mut h, e);
    }
    debug_assert_eq!(h.len(), header_bytes);
    let tables_crc = crc32c::crc32c(&h[FIXED_HEADER_BYTES..]);
    h[96..100].copy_from_slice(&tables_crc.to_le_bytes());
    let header_crc = crc32c::crc32c(&h[0..100]);
    h[100..104].copy_from_slice(&header_crc.to_le_bytes());
    h
}

fn encode_entry(h: &mut Vec<u8>, e: &Entry) {
    let kind: u8 = match e.kind {
        EntryKind::Write => 1,
        EntryKind::Zero => 2,
        EntryKind::Unmap => 3,
    };
    h.push(kind);
    h.extend_from_slice(&[0u8; 7]);
    h.extend_from_slice(&e.offset.to_le_bytes());
    h.extend_from_slice(&e.len.to_le_bytes());
    h.extend_from_slice(&e.data_offset.to_le_bytes());
}

/// The fixed part of a segment header, verified.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FixedHeader {
    pub header_bytes: u32,
    pub seq: u64,
    pub volume_uuid: [u8; 16],
    pub span: JournalSpan,
    pub entry_count: u32,
    pub chunk_count: u32,
    pub data_bytes: u64,
    tables_crc: u32,
}

impl FixedHeader {
    pub fn decode(b: &[u8]) -> Result<FixedHeader, String> {
        if b.len() < FIXED_HEADER_BYTES {
            return Err(format!("segment header truncated ({} bytes)", b.len()));
        }
        if &b[0..8] != MAGIC {
            return Err("not a strata segment (bad magic)".into());
        }
        let version = u16::from_le_bytes([b[8], b[9]]);
        if version != VERSION {
            return Err(format!("unsupported segment version {version}"));
        }
        if crc32c::crc32c(&b[0..100]) != le_u32(&b[100..104]) {
            return Err("segment header checksum mismatch".into());
        }
        let h = FixedHeader {
            header_bytes: le_u32(&b[12..16]),
            seq: le_u64(&b[16..24]),
            volume_uuid: array16(&b[24..40]),
            span: JournalSpan::decode(&b[40..40 + JOURNAL_SPAN_BYTES]),
            entry_count: le_u32(&b[80..84]),
            chunk_count: le_u32(&b[84..88]),
            data_bytes: le_u64(&b[88..96]),
            tables_crc: le_u32(&b[96..100]),
        };
        if h.data_bytes > MAX_SEGMENT_DATA_BYTES || h.entry_count > MAX_ENTRIES {
            return Err("segment header has implausible sizes".into());
        }
        if u64::from(h.chunk_count) != h.data_bytes.div_ceil(CHUNK_BYTES) {
            return Err("segment chunk count does not match its data size".into());
        }
        let expect = FIXED_HEADER_BYTES as u64
            + 4 * u64::from(h.chunk_count)
            + ENTRY_BYTES as u64 * u64::from(h.entry_count);
        if u64::from(h.header_bytes) != expect {
            return Err("segment header size does not match its tables".into());
        }
        Ok(h)
    }
}

/// What reading a segment needs: where data starts and the chunk CRCs.
#[derive(Debug)]
pub struct SegmentIndex {
    pub fixed: FixedHeader,
    pub chunk_crcs: Vec<u32>,
}

impl SegmentIndex {
    /// Decodes the tables that follow a verified fixed header; also returns
    /// the entries (recovery needs them; reads do not).
    pub fn decode_tables(
        fixed: FixedHeader,
        tables: &[u8],
        volume_size_bytes: u64,
    ) -> Result<(SegmentIndex, Vec<Entry>), String> {
        if tables.len() != fixed.header_bytes as usize - FIXED_HEADER_BYTES {
            return Err("segment tables truncated".into());
        }
        if crc32c::crc32c(tables) != fixed.tables_crc {
            return Err("segment tables checksum mismatch".into());
        }
        let crc_bytes = 4 * fixed.chunk_count as usize;
        let chunk_crcs = tables[..crc_bytes].chunks_exact(4).map(le_u32).collect();
        let mut entries = Vec::with_capacity(fixed.entry_count as usize);
        for e in tables[crc_bytes..].chunks_exact(ENTRY_BYTES) {
            let kind = match e[0] {
                1 => EntryKind::Write,
                2 => EntryKind::Zero,
                3 => EntryKind::Unmap,
                k => return Err(format!("segment entry of unknown kind {k}")),
            };
            let entry = Entry {
                kind,
                offset: le_u64(&e[8..16]),
                len: le_u64(&e[16..24]),
                data_offset: le_u64(&e[24..32]),
            };
            let in_volume = entry
                .offset
                .checked_add(entry.len)
                .is_some_and(|end| end <= volume_size_bytes);
            let in_data = kind != EntryKind::Write
                || entry
                    .data_offset
                    .checked_add(entry.len)
                    .is_some_and(|end| end <= fixed.data_bytes);
            if !in_volume || !in_data || entry.len == 0 {
                return Err(format!("segment entry out of bounds: {entry:?}"));
            }
            entries.push(entry);
        }
        Ok((SegmentIndex { fixed, chunk_crcs }, entries))
    }

    /// Checks `bytes`, which hold whole chunks from chunk `first_chunk` on.
    pub fn verify(&self, first_chunk: u64, bytes: &[u8]) -> Result<(), String> {
        for (i, chunk) in bytes.chunks(CHUNK_BYTES as usize).enumerate() {
            let idx = first_chunk as usize + i;
            let want = self
                .chunk_crcs
                .get(idx)
                .copied()
                .ok_or("chunk index past the segment's end")?;
            if crc32c::crc32c(chunk) != want {
                return Err(format!(
                    "checksum mismatch in chunk {idx} (bytes {}..)",
                    idx as u64 * CHUNK_BYTES
                ));
            }
        }
        Ok(())
    }

    /// Byte range in the object of chunks `[first, last]`.
    pub fn chunk_range(&self, first: u64, last: u64) -> std::ops::Range<u64> {
        let start = u64::from(self.fixed.header_bytes) + first * CHUNK_BYTES;
        let end = (u64::from(self.fixed.header_bytes) + (last + 1) * CHUNK_BYTES)
            .min(u64::from(self.fixed.header_bytes) + self.fixed.data_bytes);
        start..end
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Sample {
        entries: Vec<Entry>,
        data: Vec<u8>,
        header: Vec<u8>,
    }

    fn sample() -> Sample {
        let data: Vec<u8> = (0..10000u32).map(|i| (i * 7) as u8).collect();
        let entries = vec![
            Entry {
                kind: EntryKind::Write,
                offset: 4096,
                len: data.len() as u64,
                data_offset: 0,
            },
            Entry {
                kind: EntryKind::Unmap,
                offset: 0,
                len: 1 << 20,
                data_offset: 10000,
            },
            Entry {
                kind: EntryKind::Zero,
                offset: 1 << 20,
                len: 512,
                data_offset: 10000,
            },
        ];
        let span = JournalSpan {
            journal_id: [9; 16],
            first_jseq: 1,
            last_jseq: 3,
            end_lpos: 180,
        };
        let header = encode_header(7, &[5; 16], &span, &entries, &data);
        Sample {
            entries,
            data,
            header,
        }
    }

    #[test]
    fn header_round_trips_and_verifies_chunks() {
        let s = sample();
        let h = s.header.clone();
        let fixed = FixedHeader::decode(&h).unwrap();
        assert_eq!(fixed.seq, 7);
        assert_eq!(fixed.span.last_jseq, 3);
        assert_eq!(fixed.span.end_lpos, 180);
        let (idx, entries) =
            SegmentIndex::decode_tables(fixed, &h[FIXED_HEADER_BYTES..], 1 << 30).unwrap();
        assert_eq!(entries, s.entries);
        assert!(idx.verify(0, &s.data).is_ok());
        assert!(idx.verify(1, &s.data[4096..8192]).is_ok());
        let mut bad = s.data.to_vec();
        bad[5000] ^= 1;
        assert!(idx.verify(0, &bad).unwrap_err().contains("chunk 1"));
        assert_eq!(
            idx.chunk_range(2, 2),
            (h.len() as u64 + 8192)..(h.len() as u64 + 10000)
        );
    }

    #[test]
    fn corrupt_headers_are_rejected() {
        let s = sample();
        let h = s.header.clone();
        for i in [0usize, 9, 13, 50, 99, 101] {
            let mut b = h.clone();
            b[i] ^= 0x40;
            assert!(FixedHeader::decode(&b).is_err(), "byte {i}");
        }
        let fixed = FixedHeader::decode(&h).unwrap();
        let mut t = h[FIXED_HEADER_BYTES..].to_vec();
        t[3] ^= 1;
        assert!(SegmentIndex::decode_tables(fixed, &t, 1 << 30).is_err());
        // Entries outside a smaller volume are rejected.
        assert!(SegmentIndex::decode_tables(fixed, &h[FIXED_HEADER_BYTES..], 8192).is_err());
        assert!(FixedHeader::decode(&h[..50]).is_err());
    }
}
