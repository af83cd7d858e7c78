//! The frame table of a version 2 segment (`segment.rs` has the header
//! around it, `frame.rs` one frame): where each chunk's frame lies in the
//! data area, how to check it, and turning a run of stored frames back
//! into the chunks' bytes.
//!
//! ## Tables of a version 2 segment (after the 104-byte fixed header)
//!
//! ```text
//! chunk_count x 8   frame records (`frame.rs`), in chunk order; frames
//!                   are stored back to back in the data area
//! 32                salt: the segment key is HKDF(data key, salt);
//!                   zero when the segment is not encrypted
//! chunk_count x 4   CRC32C of each chunk's logical bytes (the local
//!                   disk cache checks what it reads back against them)
//! entry table       entry_count x 32 as in version 1
//! ```
//!
//! In an encrypted segment the CRC and entry tables are sealed as one AEAD
//! message (+16 bytes of tag) at chunk index `ENTRY_TABLE_INDEX`: neither
//! which ranges were written nor a checksum of plaintext (which would let
//! a bucket reader test guesses of the content) is in the clear.

use std::ops::Range;

use super::frame::{
    decode_frame_into, encode_frame_into, Codec, Compression, FramePlace, FrameRecord, SegmentKey,
    FRAME_LOGICAL_BYTES, FRAME_RECORD_BYTES, TAG_BYTES,
};

pub const SALT_BYTES: usize = 32;
/// The chunk index the entry table is sealed at (no frame has it).
pub const ENTRY_TABLE_INDEX: u64 = u64::MAX;

/// Where each chunk's frame lies, and the key to open them (encrypted
/// segments).
#[derive(Debug)]
pub struct FrameTable {
    records: Vec<FrameRecord>,
    /// End of each frame in the data area (start of the next).
    ends: Vec<u64>,
    pub salt: [u8; SALT_BYTES],
    key: Option<SegmentKey>,
    data_bytes: u64,
    volume_uuid: [u8; 16],
    seq: u64,
}

impl FrameTable {
    /// Decodes `chunk_count` records and the salt from `tables`.
    /// Each frame is at most its chunk's size (compressed frames are kept
    /// only when smaller), plus a tag when `encrypted`.
    pub fn decode(
        tables: &[u8],
        chunk_count: u32,
        data_bytes: u64,
        (volume_uuid, seq): ([u8; 16], u64),
        encrypted: bool,
    ) -> Result<FrameTable, String> {
        let n = chunk_count as usize * FRAME_RECORD_BYTES;
        let (records_raw, rest) = tables
            .split_at_checked(n)
            .ok_or("segment frame table truncated")?;
        let salt = rest
            .get(..SALT_BYTES)
            .ok_or("segment salt truncated")?
            .try_into()
            .map_err(|_| "segment salt truncated")?;
        let mut records = Vec::with_capacity(chunk_count as usize);
        let mut ends = Vec::with_capacity(chunk_count as usize);
        let mut end = 0u64;
        let tag = if encrypted { TAG_BYTES as u64 } else { 0 };
        for (i, raw) in records_raw.chunks_exact(FRAME_RECORD_BYTES).enumerate() {
            let r = FrameRecord::decode(raw)?;
            let logical = data_bytes
                .saturating_sub(i as u64 * FRAME_LOGICAL_BYTES as u64)
                .min(FRAME_LOGICAL_BYTES as u64);
            if r.stored_len == 0 || u64::from(r.stored_len) > logical + tag {
                return Err(format!(
                    "frame {i} claims {} stored bytes for a chunk of {logical}",
                    r.stored_len
                ));
            }
            end += u64::from(r.stored_len);
            records.push(r);
            ends.push(end);
        }
        Ok(FrameTable {
            records,
            ends,
            salt,
            key: None,
            data_bytes,
            volume_uuid,
            seq,
        })
    }

    /// Keeps the segment's key (derived from the volume's data key and
    /// this segment's salt) for decoding frames.
    pub fn set_key(&mut self, key: SegmentKey) {
        self.key = Some(key);
    }

    /// Bytes the frames take in the data area.
    pub fn stored_bytes(&self) -> u64 {
        self.ends.last().copied().unwrap_or(0)
    }

    /// Memory this table holds, for the index cache's budget.
    pub fn cost_bytes(&self) -> u64 {
        (self.records.len() * (std::mem::size_of::<FrameRecord>() + 8)) as u64
    }

    /// Byte range in the data area of chunks `[first, last]`.
    pub fn range(&self, first: u64, last: u64) -> Range<u64> {
        let start = match first {
            0 => 0,
            f => self.ends.get(f as usize - 1).copied().unwrap_or(0),
        };
        let end = self.ends.get(last as usize).copied().unwrap_or(start);
        start..end
    }

    /// Whether the `stored_len` bytes of frames from chunk `first` on are
    /// the chunks' bytes as they are: not encrypted, every frame raw (the
    /// caller then checks the chunk CRCs and skips decoding and a copy).
    pub fn stored_as_is(&self, first: u64, stored_len: usize) -> bool {
        if self.key.is_some() {
            return false;
        }
        let mut total = 0usize;
        for r in self.records.iter().skip(first as usize) {
            if total >= stored_len {
                break;
            }
            if r.codec != Codec::Raw {
                return false;
            }
            total += usize::from(r.stored_len);
        }
        total == stored_len
    }

    /// The logical bytes of the chunks whose stored frames `stored` holds,
    /// from chunk `first` on, each verified (and opened, if encrypted).
    pub fn decode_run(&self, first: u64, stored: &[u8]) -> Result<Vec<u8>, String> {
        // The chunks' logical size, so `out` is allocated once.
        let (mut n, mut chunks) = (0usize, 0u64);
        for r in self.records.iter().skip(first as usize) {
            if n >= stored.len() {
                break;
            }
            n += usize::from(r.stored_len);
            chunks += 1;
        }
        let logical_end = ((first + chunks) * FRAME_LOGICAL_BYTES as u64).min(self.data_bytes);
        let logical = logical_end.saturating_sub(first * FRAME_LOGICAL_BYTES as u64);
        let mut out = Vec::with_capacity(logical as usize);
        let mut at = 0usize;
        let mut chunk = first;
        while at < stored.len() {
            let record = self
                .records
                .get(chunk as usize)
                .ok_or("frame past the segment's end")?;
            let len = usize::from(record.stored_len);
            let frame = stored
                .get(at..at + len)
                .ok_or_else(|| format!("frame of chunk {chunk} cut short"))?;
            let logical = (self.data_bytes - chunk * FRAME_LOGICAL_BYTES as u64)
                .min(FRAME_LOGICAL_BYTES as u64) as usize;
            let place = FramePlace {
                volume_uuid: self.volume_uuid,
                seq: self.seq,
                chunk,
            };
            decode_frame_into(frame, record, logical, self.key.as_ref(), &place, &mut out)
                .map_err(|e| format!("chunk {chunk}: {e}"))?;
            at += len;
            chunk += 1;
        }
        Ok(out)
    }
}

/// The frames of `data` (a segment's logical data area): the records for
/// the table; the frames are appended to `out` (emptied first: a buffer
/// reused across segments, so no page is touched for the first time).
pub fn encode_frames(
    data: &[u8],
    compression: Compression,
    key: Option<&SegmentKey>,
    (volume_uuid, seq): ([u8; 16], u64),
    out: &mut Vec<u8>,
) -> Vec<FrameRecord> {
    out.clear();
    out.reserve(data.len() + data.len() / 64);
    let mut records = Vec::with_capacity(data.len().div_ceil(FRAME_LOGICAL_BYTES));
    for (i, chunk) in data.chunks(FRAME_LOGICAL_BYTES).enumerate() {
        let place = FramePlace {
            volume_uuid,
            seq,
            chunk: i as u64,
        };
        records.push(encode_frame_into(chunk, compression, key, &place, out));
    }
    records
}
