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
//!  10  2  flags (version 1: 0, or FLAG_PADDED)
//!  12  4  header_bytes: fixed part + tables; the data area starts here
//!         (with FLAG_PADDED: fixed part + tables + zero padding, at most
//!         MAX_PADDED_HEADER_BYTES)
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
//! A padded header (version 1, flag bit 1) is written by a segment whose
//! data went into its file before the seal (`write/staged_segment.rs`):
//! the data area starts at a fixed reserve, and the tables the seal writes
//! are followed by zeros up to it. `tables_end()` is where the tables end
//! in either case; readers fetch only up to there. Older strata refuse the
//! flag rather than misread the data area's place.
//!
//! Every 4 KiB chunk of data is verified against its CRC when read from the
//! store, so a corrupt object is reported, never served.
//!
//! Version 2 (compressed and/or encrypted chunks, `segment_frames.rs`):
//! flags bit 0 = encrypted; the tables are a frame table (8 bytes per
//! chunk: stored length, codec, CRC of the stored frame), a salt, then the
//! chunk CRC table (of logical bytes) and the entry table, those two sealed
//! as one AEAD message when encrypted. The data area holds each chunk's
//! frame back to back. `data_bytes` and `chunk_count` stay logical: map
//! targets and entries address the logical data area in both versions.

use std::borrow::Cow;

use super::bytes::{array16, le_u32, le_u64};
use super::frame::{Compression, FramePlace, SegmentKey, FRAME_RECORD_BYTES, TAG_BYTES};
use super::segment_frames::{encode_frames, FrameTable, ENTRY_TABLE_INDEX, SALT_BYTES};

pub const CHUNK_BYTES: u64 = 4096;
pub const FIXED_HEADER_BYTES: usize = 104;
const MAGIC: &[u8; 8] = b"STRATSEG";
const VERSION: u16 = 1;
/// Compressed and/or encrypted frames (`segment_frames.rs`).
const VERSION_FRAMES: u16 = 2;
/// Flags of a version 2 segment: its frames and entry table are encrypted.
pub const FLAG_ENCRYPTED: u16 = 1;
/// Flags of a version 1 segment: zero padding follows the tables, and the
/// data area starts at `header_bytes` after it.
pub const FLAG_PADDED: u16 = 2;
/// Bound on a padded header (an untrusted `header_bytes`).
pub const MAX_PADDED_HEADER_BYTES: u32 = 16 << 20;
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
    encode_header_with(seq, volume_uuid, span, entries, data, &[])
}

/// The header (the whole object) of segment `seq` sealed empty, version 1
/// (an uncompressed volume's): no entries, no chunks, so zero bytes of
/// tables. A snapshot or a deletion with no write since the last seal
/// point seals one.
#[cfg(test)]
pub(crate) fn empty_segment_header(seq: u64, volume_uuid: &[u8; 16]) -> Vec<u8> {
    let span = JournalSpan {
        journal_id: [9; 16],
        first_jseq: 0,
        last_jseq: 3,
        end_lpos: 180,
    };
    let header = encode_header(seq, volume_uuid, &span, &[], &[]);
    assert_eq!(header.len(), FIXED_HEADER_BYTES);
    header
}

/// `encode_header`, given the CRCs of some chunks already (`known[i]`:
/// chunk `i`'s, computed from a client's write: `format/chunk_crcs.rs`);
/// the others are computed here.
pub fn encode_header_with(
    seq: u64,
    volume_uuid: &[u8; 16],
    span: &JournalSpan,
    entries: &[Entry],
    data: &[u8],
    known: &[Option<u32>],
) -> Vec<u8> {
    let chunk_count = data.len().div_ceil(CHUNK_BYTES as usize);
    let header_bytes = FIXED_HEADER_BYTES + 4 * chunk_count + ENTRY_BYTES * entries.len();
    let fixed = FixedHeader {
        version: VERSION,
        flags: 0,
        header_bytes: header_bytes as u32,
        seq,
        volume_uuid: *volume_uuid,
        span: *span,
        entry_count: entries.len() as u32,
        chunk_count: chunk_count as u32,
        data_bytes: data.len() as u64,
        tables_crc: 0,
    };
    let mut h = Vec::with_capacity(header_bytes);
    fixed.encode_into(&mut h);
    for (i, chunk) in data.chunks(CHUNK_BYTES as usize).enumerate() {
        let crc = match known.get(i).copied().flatten() {
            Some(crc) => {
                debug_assert_eq!(crc, crc32c::crc32c(chunk), "chunk {i}'s CRC");
                crc
            }
            None => crc32c::crc32c(chunk),
        };
        h.extend_from_slice(&crc.to_le_bytes());
    }
    for e in entries {
        encode_entry(&mut h, e);
    }
    debug_assert_eq!(h.len(), header_bytes);
    seal_checksums(&mut h);
    h
}

/// Pads a version 1 header to `header_bytes` (zeros after its tables) and
/// marks it `FLAG_PADDED`: the data area then starts at `header_bytes`.
/// `false` (nothing changed) if the header is longer than that, is not
/// version 1, or `header_bytes` is above `MAX_PADDED_HEADER_BYTES`.
pub fn pad_header(h: &mut Vec<u8>, header_bytes: u32) -> bool {
    let fits = h.len() >= FIXED_HEADER_BYTES
        && h.len() <= header_bytes as usize
        && header_bytes <= MAX_PADDED_HEADER_BYTES
        && u16::from_le_bytes([h[8], h[9]]) == VERSION;
    if !fits {
        return false;
    }
    let flags = u16::from_le_bytes([h[10], h[11]]) | FLAG_PADDED;
    h[10..12].copy_from_slice(&flags.to_le_bytes());
    h[12..16].copy_from_slice(&header_bytes.to_le_bytes());
    let header_crc = crc32c::crc32c(&h[0..100]);
    h[100..104].copy_from_slice(&header_crc.to_le_bytes());
    h.resize(header_bytes as usize, 0);
    true
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
    pub version: u16,
    pub flags: u16,
    pub header_bytes: u32,
    pub seq: u64,
    pub volume_uuid: [u8; 16],
    pub span: JournalSpan,
    pub entry_count: u32,
    pub chunk_count: u32,
    pub data_bytes: u64,
    tables_crc: u32,
}

/// Fills in the CRC of the tables (bytes 104..) and of the fixed part of a
/// header whose tables are written.
fn seal_checksums(h: &mut [u8]) {
    let tables_crc = crc32c::crc32c(&h[FIXED_HEADER_BYTES..]);
    h[96..100].copy_from_slice(&tables_crc.to_le_bytes());
    let header_crc = crc32c::crc32c(&h[0..100]);
    h[100..104].copy_from_slice(&header_crc.to_le_bytes());
}

impl FixedHeader {
    /// Appends the 104 fixed bytes, checksums zero (`seal_checksums` fills
    /// them once the tables follow).
    fn encode_into(&self, h: &mut Vec<u8>) {
        h.extend_from_slice(MAGIC);
        h.extend_from_slice(&self.version.to_le_bytes());
        h.extend_from_slice(&self.flags.to_le_bytes());
        h.extend_from_slice(&self.header_bytes.to_le_bytes());
        h.extend_from_slice(&self.seq.to_le_bytes());
        h.extend_from_slice(&self.volume_uuid);
        self.span.encode_into(h);
        h.extend_from_slice(&self.entry_count.to_le_bytes());
        h.extend_from_slice(&self.chunk_count.to_le_bytes());
        h.extend_from_slice(&self.data_bytes.to_le_bytes());
        h.extend_from_slice(&[0u8; 8]);
    }

    pub fn decode(b: &[u8]) -> Result<FixedHeader, String> {
        if b.len() < FIXED_HEADER_BYTES {
            return Err(format!("segment header truncated ({} bytes)", b.len()));
        }
        if &b[0..8] != MAGIC {
            return Err("not a strata segment (bad magic)".into());
        }
        let version = u16::from_le_bytes([b[8], b[9]]);
        if version != VERSION && version != VERSION_FRAMES {
            return Err(format!(
                "unsupported segment version {version} (this strata reads 1 and 2; a newer strata wrote it: upgrade)"
            ));
        }
        if crc32c::crc32c(&b[0..100]) != le_u32(&b[100..104]) {
            return Err("segment header checksum mismatch".into());
        }
        let flags = u16::from_le_bytes([b[10], b[11]]);
        let known = if version == VERSION {
            FLAG_PADDED
        } else {
            FLAG_ENCRYPTED
        };
        if flags & !known != 0 {
            return Err(format!("segment has unknown flags {flags:#x}"));
        }
        let h = FixedHeader {
            version,
            flags,
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
        let header_bytes = u64::from(h.header_bytes);
        let size_ok = if h.padded() {
            header_bytes >= h.expected_header_bytes() && h.header_bytes <= MAX_PADDED_HEADER_BYTES
        } else {
            header_bytes == h.expected_header_bytes()
        };
        if !size_ok {
            return Err("segment header size does not match its tables".into());
        }
        Ok(h)
    }

    /// Whether zero padding follows the tables (`FLAG_PADDED`).
    pub fn padded(&self) -> bool {
        self.version == VERSION && self.flags & FLAG_PADDED != 0
    }

    /// Where the tables end: `header_bytes`, less any padding. What a
    /// reader of the tables fetches, from `FIXED_HEADER_BYTES`.
    pub fn tables_end(&self) -> u64 {
        self.expected_header_bytes()
    }

    pub fn encrypted(&self) -> bool {
        self.flags & FLAG_ENCRYPTED != 0
    }

    /// Header size its counts imply.
    fn expected_header_bytes(&self) -> u64 {
        let chunks = u64::from(self.chunk_count);
        let entries = ENTRY_BYTES as u64 * u64::from(self.entry_count);
        if self.version == VERSION {
            return FIXED_HEADER_BYTES as u64 + 4 * chunks + entries;
        }
        let tag = if self.encrypted() {
            TAG_BYTES as u64
        } else {
            0
        };
        FIXED_HEADER_BYTES as u64
            + (FRAME_RECORD_BYTES as u64 + 4) * chunks
            + SALT_BYTES as u64
            + entries
            + tag
    }
}

/// What reading a segment needs: where data starts, the CRC of each
/// chunk's logical bytes (both versions: reads from the local disk cache
/// are checked against them), and for version 2 the frame table.
#[derive(Debug)]
pub struct SegmentIndex {
    pub fixed: FixedHeader,
    crcs: Vec<u32>,
    /// Version 2: where each chunk's frame lies and how to open it (boxed:
    /// the AES key schedule is large).
    frames: Option<Box<FrameTable>>,
}

impl SegmentIndex {
    /// Decodes the tables that follow a verified fixed header; also returns
    /// the entries (recovery needs them; reads do not). An encrypted
    /// segment needs the volume's data key.
    pub fn decode_tables(
        fixed: FixedHeader,
        tables: &[u8],
        volume_size_bytes: u64,
        data_key: Option<&[u8; 32]>,
    ) -> Result<(SegmentIndex, Vec<Entry>), String> {
        // The tables, or the tables and their padding (a whole header).
        let tables_bytes = fixed.tables_end() as usize - FIXED_HEADER_BYTES;
        if tables.len() != tables_bytes
            && tables.len() != fixed.header_bytes as usize - FIXED_HEADER_BYTES
        {
            return Err("segment tables truncated".into());
        }
        let tables = &tables[..tables_bytes];
        if crc32c::crc32c(tables) != fixed.tables_crc {
            return Err("segment tables checksum mismatch".into());
        }
        let (frames, crcs_and_entries) = if fixed.version == VERSION {
            (None, Cow::Borrowed(tables))
        } else {
            let (frames, rest) = frames_and_rest(&fixed, tables, data_key)?;
            (Some(Box::new(frames)), rest)
        };
        let crc_bytes = 4 * fixed.chunk_count as usize;
        let crcs = crcs_and_entries[..crc_bytes]
            .chunks_exact(4)
            .map(le_u32)
            .collect();
        let mut entries = Vec::with_capacity(fixed.entry_count as usize);
        for e in crcs_and_entries[crc_bytes..].chunks_exact(ENTRY_BYTES) {
            entries.push(decode_entry(e, &fixed, volume_size_bytes)?);
        }
        Ok((
            SegmentIndex {
                fixed,
                crcs,
                frames,
            },
            entries,
        ))
    }

    /// Memory the index holds beyond its fixed part.
    pub fn table_cost_bytes(&self) -> u64 {
        4 * self.crcs.len() as u64 + self.frames.as_ref().map_or(0, |f| f.cost_bytes())
    }

    /// Bytes the data area takes in the object (frames may be smaller or,
    /// encrypted, larger than the logical data).
    pub fn stored_data_bytes(&self) -> u64 {
        self.frames
            .as_ref()
            .map_or(self.fixed.data_bytes, |f| f.stored_bytes())
    }

    /// The logical bytes of whole chunks from `first_chunk` on, from what
    /// the object stores for them (`chunk_range`), verified: the same
    /// bytes for version 1, decoded frames for version 2.
    pub fn decode_run<'a>(
        &self,
        first_chunk: u64,
        stored: &'a [u8],
    ) -> Result<Cow<'a, [u8]>, String> {
        if self.stored_as_is(first_chunk, stored.len()) {
            self.verify(first_chunk, stored)?;
            return Ok(Cow::Borrowed(stored));
        }
        let Some(frames) = &self.frames else {
            // `stored_as_is` holds for every version 1 run.
            return Err("a version 1 run that is not stored as it is (a bug)".into());
        };
        let plain = frames.decode_run(first_chunk, stored)?;
        // The frame's own CRC and tag passed: a mismatch here is a codec
        // fault or a forged table, never served either way.
        self.verify(first_chunk, &plain)?;
        Ok(Cow::Owned(plain))
    }

    /// Whether the `stored_len` bytes from chunk `first_chunk` on are the
    /// chunks' logical bytes as they are (version 1, or raw unencrypted
    /// frames): they need `verify` only, no decoding, no copy.
    pub fn stored_as_is(&self, first_chunk: u64, stored_len: usize) -> bool {
        self.frames
            .as_ref()
            .is_none_or(|f| f.stored_as_is(first_chunk, stored_len))
    }

    /// Checks logical `bytes`, which hold whole chunks from chunk
    /// `first_chunk` on, against their CRCs.
    pub fn verify(&self, first_chunk: u64, bytes: &[u8]) -> Result<(), String> {
        for (i, chunk) in bytes.chunks(CHUNK_BYTES as usize).enumerate() {
            let idx = first_chunk as usize + i;
            let want = self
                .crcs
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

    /// Byte range in the object of chunks `[first, last]` as stored.
    pub fn chunk_range(&self, first: u64, last: u64) -> std::ops::Range<u64> {
        let base = u64::from(self.fixed.header_bytes);
        if let Some(f) = &self.frames {
            let r = f.range(first, last);
            return base + r.start..base + r.end;
        }
        let start = base + first * CHUNK_BYTES;
        let end = (base + (last + 1) * CHUNK_BYTES).min(base + self.fixed.data_bytes);
        start..end
    }
}

/// One 32-byte entry, checked against the volume and the data area.
fn decode_entry(e: &[u8], fixed: &FixedHeader, volume_size_bytes: u64) -> Result<Entry, String> {
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
    Ok(entry)
}

/// A version 2 segment's frame table, and its chunk CRC and entry tables
/// in the clear.
fn frames_and_rest<'a>(
    fixed: &FixedHeader,
    tables: &'a [u8],
    data_key: Option<&[u8; 32]>,
) -> Result<(FrameTable, Cow<'a, [u8]>), String> {
    let mut frames = FrameTable::decode(
        tables,
        fixed.chunk_count,
        fixed.data_bytes,
        (fixed.volume_uuid, fixed.seq),
        fixed.encrypted(),
    )?;
    let sealed_at = FRAME_RECORD_BYTES * fixed.chunk_count as usize + SALT_BYTES;
    let sealed = &tables[sealed_at..];
    if !fixed.encrypted() {
        return Ok((frames, Cow::Borrowed(sealed)));
    }
    let Some(data_key) = data_key else {
        return Err(format!(
            "segment {} is encrypted: the volume's key is needed to read it",
            fixed.seq
        ));
    };
    let key = SegmentKey::derive(data_key, &frames.salt);
    let place = FramePlace {
        volume_uuid: fixed.volume_uuid,
        seq: fixed.seq,
        chunk: ENTRY_TABLE_INDEX,
    };
    let mut buf = sealed.to_vec();
    let plain = key
        .open_message(&place, &mut buf)
        .map_err(|e| format!("segment tables: {e}"))?
        .to_vec();
    frames.set_key(key);
    Ok((frames, Cow::Owned(plain)))
}

/// How a version 2 segment is written: its compression, and for an
/// encrypted volume its data key with a fresh random salt for this object.
#[derive(Debug, Clone, Copy)]
pub struct FrameSettings<'a> {
    pub compression: Compression,
    pub encryption: Option<(&'a [u8; 32], [u8; SALT_BYTES])>,
}

/// A version 2 segment of `entries` and logical `data`: its header and
/// its data area (the frames).
pub fn encode_segment_v2(
    seq: u64,
    volume_uuid: &[u8; 16],
    span: &JournalSpan,
    entries: &[Entry],
    data: &[u8],
    settings: FrameSettings<'_>,
) -> (Vec<u8>, Vec<u8>) {
    let mut frames = Vec::new();
    let header =
        encode_segment_v2_into(seq, volume_uuid, span, entries, data, settings, &mut frames);
    (header, frames)
}

/// `encode_segment_v2`, its frames written into `frames` (a reused
/// buffer); returns the header.
pub fn encode_segment_v2_into(
    seq: u64,
    volume_uuid: &[u8; 16],
    span: &JournalSpan,
    entries: &[Entry],
    data: &[u8],
    settings: FrameSettings<'_>,
    frames: &mut Vec<u8>,
) -> Vec<u8> {
    let key = settings
        .encryption
        .map(|(dek, salt)| (SegmentKey::derive(dek, &salt), salt));
    let records = encode_frames(
        data,
        settings.compression,
        key.as_ref().map(|(k, _)| k),
        (*volume_uuid, seq),
        frames,
    );
    let mut entry_table =
        Vec::with_capacity(4 * records.len() + ENTRY_BYTES * entries.len() + TAG_BYTES);
    for chunk in data.chunks(CHUNK_BYTES as usize) {
        entry_table.extend_from_slice(&crc32c::crc32c(chunk).to_le_bytes());
    }
    for e in entries {
        encode_entry(&mut entry_table, e);
    }
    let salt = key.as_ref().map(|(_, s)| *s).unwrap_or([0u8; SALT_BYTES]);
    if let Some((k, _)) = &key {
        let place = FramePlace {
            volume_uuid: *volume_uuid,
            seq,
            chunk: ENTRY_TABLE_INDEX,
        };
        k.seal_message(&place, &mut entry_table);
    }
    let flags = if key.is_some() { FLAG_ENCRYPTED } else { 0 };
    let header_bytes =
        FIXED_HEADER_BYTES + FRAME_RECORD_BYTES * records.len() + SALT_BYTES + entry_table.len();
    let fixed = FixedHeader {
        version: VERSION_FRAMES,
        flags,
        header_bytes: header_bytes as u32,
        seq,
        volume_uuid: *volume_uuid,
        span: *span,
        entry_count: entries.len() as u32,
        chunk_count: records.len() as u32,
        data_bytes: data.len() as u64,
        tables_crc: 0,
    };
    let mut h = Vec::with_capacity(header_bytes);
    fixed.encode_into(&mut h);
    for r in &records {
        h.extend_from_slice(&r.encode());
    }
    h.extend_from_slice(&salt);
    h.extend_from_slice(&entry_table);
    debug_assert_eq!(h.len(), header_bytes);
    seal_checksums(&mut h);
    h
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
    fn a_padded_header_reads_as_the_plain_one_with_data_after_the_reserve() {
        let s = sample();
        let mut h = s.header.clone();
        let plain = FixedHeader::decode(&h).unwrap();
        assert!(!pad_header(&mut h, plain.header_bytes - 1), "too small");
        assert!(!pad_header(&mut h, MAX_PADDED_HEADER_BYTES + 4096));
        assert!(pad_header(&mut h, 8192));
        assert_eq!(h.len(), 8192);
        let fixed = FixedHeader::decode(&h).unwrap();
        assert!(fixed.padded() && !plain.padded());
        assert_eq!(
            (fixed.header_bytes, fixed.tables_end()),
            (8192, plain.tables_end())
        );
        // The tables alone, or the whole padded header: the same index.
        let tables = &h[FIXED_HEADER_BYTES..fixed.tables_end() as usize];
        for t in [tables, &h[FIXED_HEADER_BYTES..]] {
            let (idx, entries) = SegmentIndex::decode_tables(fixed, t, 1 << 30, None).unwrap();
            assert_eq!(entries, s.entries);
            assert!(idx.verify(0, &s.data).is_ok());
        }
        // Anything else is truncated.
        assert!(SegmentIndex::decode_tables(fixed, &tables[1..], 1 << 30, None).is_err());
        // The flag on a version 2 header, a header_bytes below the tables
        // or past the bound: rejected (checksums made good).
        let forge = |f: &dyn Fn(&mut Vec<u8>)| {
            let mut b = h.clone();
            f(&mut b);
            let crc = crc32c::crc32c(&b[0..100]);
            b[100..104].copy_from_slice(&crc.to_le_bytes());
            FixedHeader::decode(&b)
        };
        assert!(forge(&|b| b[8..10].copy_from_slice(&VERSION_FRAMES.to_le_bytes())).is_err());
        let small = (plain.header_bytes - 8).to_le_bytes();
        assert!(forge(&|b| b[12..16].copy_from_slice(&small)).is_err());
        let big = (MAX_PADDED_HEADER_BYTES + 8).to_le_bytes();
        assert!(forge(&|b| b[12..16].copy_from_slice(&big)).is_err());
        // Unpadded, a header_bytes past the tables is rejected as before.
        let mut unflagged = h.clone();
        unflagged[10..12].copy_from_slice(&0u16.to_le_bytes());
        let crc = crc32c::crc32c(&unflagged[0..100]);
        unflagged[100..104].copy_from_slice(&crc.to_le_bytes());
        assert!(FixedHeader::decode(&unflagged).is_err());
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
            SegmentIndex::decode_tables(fixed, &h[FIXED_HEADER_BYTES..], 1 << 30, None).unwrap();
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
        assert!(SegmentIndex::decode_tables(fixed, &t, 1 << 30, None).is_err());
        // Entries outside a smaller volume are rejected.
        assert!(SegmentIndex::decode_tables(fixed, &h[FIXED_HEADER_BYTES..], 8192, None).is_err());
        assert!(FixedHeader::decode(&h[..50]).is_err());
    }

    fn span() -> JournalSpan {
        JournalSpan {
            journal_id: [9; 16],
            first_jseq: 1,
            last_jseq: 3,
            end_lpos: 180,
        }
    }

    /// Text-like data that compresses, with a random tail that does not,
    /// and a partial last chunk.
    fn v2_data() -> Vec<u8> {
        let mut d: Vec<u8> = b"strata segment version 2 "
            .iter()
            .cycle()
            .take(3 * 4096)
            .copied()
            .collect();
        let mut x = 7u64;
        d.extend((0..5000).map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        }));
        d
    }

    #[test]
    fn version_2_round_trips_compressed_and_encrypted() {
        let s = sample();
        let data = v2_data();
        let dek = [4u8; 32];
        for (compression, encryption) in [
            (Compression::Lz4, None),
            (Compression::Zstd { level: 3 }, None),
            (Compression::None, Some((&dek, [6u8; 32]))),
            (Compression::Lz4, Some((&dek, [6u8; 32]))),
        ] {
            let settings = FrameSettings {
                compression,
                encryption,
            };
            let (h, stored) = encode_segment_v2(7, &[5; 16], &span(), &s.entries, &data, settings);
            let fixed = FixedHeader::decode(&h).unwrap();
            assert_eq!(
                (fixed.version, fixed.encrypted()),
                (2, encryption.is_some())
            );
            assert_eq!(fixed.data_bytes, data.len() as u64);
            let key = encryption.map(|(k, _)| k);
            let (idx, entries) =
                SegmentIndex::decode_tables(fixed, &h[FIXED_HEADER_BYTES..], 1 << 30, key).unwrap();
            assert_eq!(entries, s.entries);
            let all = idx.chunk_range(0, 4);
            assert_eq!(all.end - all.start, stored.len() as u64);
            let got = idx.decode_run(0, &stored).unwrap();
            assert!(*got == data[..], "{compression} {}", key.is_some());
            // Any run of chunks alone, from its own range.
            for (first, last) in [(1u64, 2u64), (4, 4), (0, 0)] {
                let r = idx.chunk_range(first, last);
                let part =
                    &stored[(r.start - h.len() as u64) as usize..(r.end - h.len() as u64) as usize];
                let got = idx.decode_run(first, part).unwrap();
                let want_end = (((last + 1) * 4096) as usize).min(data.len());
                assert!(*got == data[first as usize * 4096..want_end]);
            }
            if compression != Compression::None {
                assert!(
                    stored.len() < data.len() - 8000,
                    "{compression}: {}",
                    stored.len()
                );
            }
        }
    }

    #[test]
    fn encrypted_version_2_needs_the_key_and_refuses_tampering() {
        let s = sample();
        let data = v2_data();
        let dek = [4u8; 32];
        let settings = FrameSettings {
            compression: Compression::Lz4,
            encryption: Some((&dek, [6u8; 32])),
        };
        let (h, stored) = encode_segment_v2(7, &[5; 16], &span(), &s.entries, &data, settings);
        let fixed = FixedHeader::decode(&h).unwrap();
        let tables = &h[FIXED_HEADER_BYTES..];
        let e = SegmentIndex::decode_tables(fixed, tables, 1 << 30, None).unwrap_err();
        assert!(e.contains("key is needed"), "{e}");
        let e = SegmentIndex::decode_tables(fixed, tables, 1 << 30, Some(&[5u8; 32])).unwrap_err();
        assert!(e.contains("authentication"), "{e}");
        // Entries are not in the clear.
        let plain = encode_header(7, &[5; 16], &span(), &s.entries, &data);
        let entry_bytes = &plain[plain.len() - 32..];
        assert!(!h.windows(32).any(|w| w == entry_bytes));
        let (idx, _) = SegmentIndex::decode_tables(fixed, tables, 1 << 30, Some(&dek)).unwrap();
        // Frames of another segment of the same volume (same key here: same
        // salt), copied over this one's with a frame table rewritten to
        // match (CRCs are not a secret): each frame is refused.
        let (h8, other) = encode_segment_v2(8, &[5; 16], &span(), &s.entries, &data, settings);
        let mut forged = h.clone();
        let records = FIXED_HEADER_BYTES..FIXED_HEADER_BYTES + 5 * FRAME_RECORD_BYTES;
        forged[records.clone()].copy_from_slice(&h8[records]);
        let tables_crc = crc32c::crc32c(&forged[FIXED_HEADER_BYTES..]);
        forged[96..100].copy_from_slice(&tables_crc.to_le_bytes());
        let header_crc = crc32c::crc32c(&forged[0..100]);
        forged[100..104].copy_from_slice(&header_crc.to_le_bytes());
        let fixed_forged = FixedHeader::decode(&forged).unwrap();
        let (idx_forged, _) = SegmentIndex::decode_tables(
            fixed_forged,
            &forged[FIXED_HEADER_BYTES..],
            1 << 30,
            Some(&dek),
        )
        .unwrap();
        let e = idx_forged.decode_run(0, &other).unwrap_err();
        assert!(e.contains("authentication"), "{e}");
        // Unforged, the CRC of the stored frame catches it first.
        let e = idx.decode_run(0, &other).unwrap_err();
        assert!(e.contains("checksum"), "{e}");
        // A flipped bit: damage.
        let mut bad = stored.clone();
        bad[3] ^= 1;
        let e = idx.decode_run(0, &bad).unwrap_err();
        assert!(e.contains("checksum"), "{e}");
        // Stored frames are not logical chunks; version 3 is for a newer
        // strata.
        assert!(idx.verify(0, &stored).is_err());
        assert!(idx.verify(0, &data).is_ok());
        let mut v3 = h.clone();
        v3[8] = 3;
        let crc = crc32c::crc32c(&v3[0..100]);
        v3[100..104].copy_from_slice(&crc.to_le_bytes());
        assert!(FixedHeader::decode(&v3).unwrap_err().contains("upgrade"));
    }
}
