//! The tail of the log in memory: the open segment that writes go into,
//! and sealed segments waiting for (or in) their upload.
//!
//! Owns segment *contents* before they are objects; the object's byte layout
//! is `format/segment.rs`.

use std::sync::Arc;

use bytes::Bytes;

use super::staged_segment::StagedSegment;
use crate::format::segment::{self, Entry, EntryKind, JournalSpan};

/// The tail of the log, in memory.
#[derive(Debug)]
pub struct OpenSegment {
    pub seq: u64,
    pub data: Vec<u8>,
    pub entries: Vec<Entry>,
    pub span: JournalSpan,
    /// Journal bytes the entries cost: what the write buffer budget counts.
    pub cost_bytes: u64,
    pub opened_at: std::time::Instant,
    /// Entries that are garbage collector copies.
    pub gc_copies: u32,
    /// Capacity an empty `data` takes on its first write (the segment
    /// size): an idle volume holds no segment buffer, and a written one
    /// fills one allocation without growing it.
    pub reserve_bytes: usize,
    /// CRCs of `data`'s 4 KiB chunks where a client's write gave them
    /// (`note_chunk_crcs`); the seal computes the others.
    pub chunk_crcs: Vec<Option<u32>>,
    /// The segment's file, once a bulk write went straight into it
    /// (`staged_segment.rs`).
    pub staged: Option<Arc<StagedSegment>>,
}

impl OpenSegment {
    /// A new open segment writing into `buffer` (emptied; recycled buffers
    /// avoid touching fresh memory for every segment).
    pub fn new(seq: u64, mut buffer: Vec<u8>, journal_id: [u8; 16]) -> Self {
        buffer.clear();
        OpenSegment {
            seq,
            data: buffer,
            entries: Vec::new(),
            span: JournalSpan {
                journal_id,
                ..JournalSpan::default()
            },
            cost_bytes: 0,
            opened_at: std::time::Instant::now(),
            gc_copies: 0,
            reserve_bytes: 0,
            chunk_crcs: Vec::new(),
            staged: None,
        }
    }

    /// Keeps the CRCs of the whole 4 KiB chunks of a write's bytes, pushed
    /// at `data_offset` (`format/chunk_crcs.rs`), as this segment's chunk
    /// table entries: only when the bytes start on a chunk boundary (each
    /// of those chunks is then exactly one of the write's). A chunk a write
    /// only partly fills is left to the seal, as are all of a write that
    /// starts mid-chunk.
    pub fn note_chunk_crcs(&mut self, data_offset: u64, crcs: &[u32]) {
        let chunk = segment::CHUNK_BYTES;
        if crcs.is_empty() || !data_offset.is_multiple_of(chunk) {
            return;
        }
        let first = (data_offset / chunk) as usize;
        let chunks = (self.data.len() as u64).div_ceil(chunk) as usize;
        debug_assert!(first + crcs.len() <= chunks);
        self.chunk_crcs.resize(chunks, None);
        for (slot, &crc) in self.chunk_crcs[first..].iter_mut().zip(crcs) {
            *slot = Some(crc);
        }
    }

    /// Before an entry is added: an empty segment's age starts now
    /// (`segment_max_age_ms` counts from its first entry, not from when it
    /// was opened), and its buffer gets capacity before `len` bytes land.
    fn before_entry(&mut self, len: usize) {
        if self.entries.is_empty() {
            self.opened_at = std::time::Instant::now();
        }
        if len > 0 && self.data.capacity() == 0 {
            self.data.reserve_exact(self.reserve_bytes.max(len));
        }
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Appends an operation; returns the data offset of a write's bytes.
    #[allow(clippy::too_many_arguments)]
    pub fn push(
        &mut self,
        kind: EntryKind,
        offset: u64,
        len: u64,
        data: &[u8],
        cost_bytes: u64,
        jseq: u64,
        end_lpos: u64,
    ) -> u64 {
        let data_offset = self.data.len() as u64;
        self.before_entry(data.len());
        if kind == EntryKind::Write {
            debug_assert_eq!(data.len() as u64, len);
            self.data.extend_from_slice(data);
        }
        self.entries.push(Entry {
            kind,
            offset,
            len,
            data_offset,
        });
        if self.span.first_jseq == 0 {
            self.span.first_jseq = jseq;
        }
        debug_assert!(jseq > self.span.last_jseq);
        self.span.last_jseq = jseq;
        self.span.end_lpos = end_lpos;
        self.cost_bytes += cost_bytes;
        data_offset
    }

    /// Appends a garbage collector's copy of live data: a write entry that
    /// is not in the journal, so the journal span does not move. Returns
    /// the data offset of the bytes.
    pub fn push_copy(&mut self, offset: u64, data: &[u8], cost_bytes: u64) -> u64 {
        let data_offset = self.data.len() as u64;
        self.before_entry(data.len());
        self.data.extend_from_slice(data);
        self.entries.push(Entry {
            kind: EntryKind::Write,
            offset,
            len: data.len() as u64,
            data_offset,
        });
        self.cost_bytes += cost_bytes;
        self.gc_copies += 1;
        data_offset
    }

    pub fn seal(self) -> SealedSegment {
        SealedSegment {
            seq: self.seq,
            data: Arc::new(self.data),
            entries: self.entries,
            span: self.span,
            cost_bytes: self.cost_bytes,
            gc_copies: self.gc_copies,
            chunk_crcs: self.chunk_crcs,
            staged: self.staged,
        }
    }
}

/// A sealed segment, in memory until its upload is done.
#[derive(Debug)]
pub struct SealedSegment {
    pub seq: u64,
    pub data: Arc<Vec<u8>>,
    pub entries: Vec<Entry>,
    pub span: JournalSpan,
    pub cost_bytes: u64,
    pub gc_copies: u32,
    /// `OpenSegment::chunk_crcs`.
    pub chunk_crcs: Vec<Option<u32>>,
    /// `OpenSegment::staged`.
    pub staged: Option<Arc<StagedSegment>>,
}

/// Lets a sealed segment's buffer be an upload payload without a copy.
struct SharedData(Arc<Vec<u8>>);

impl AsRef<[u8]> for SharedData {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

impl SealedSegment {
    /// The data area as `Bytes` sharing this segment's buffer.
    pub fn data_bytes(&self) -> Bytes {
        Bytes::from_owner(SharedData(self.data.clone()))
    }

    /// The header of the object (the data area follows it).
    pub fn encode_header(&self, volume_uuid: &[u8; 16]) -> Vec<u8> {
        segment::encode_header_with(
            self.seq,
            volume_uuid,
            &self.span,
            &self.entries,
            &self.data,
            &self.chunk_crcs,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::segment::{FixedHeader, SegmentIndex, FIXED_HEADER_BYTES};

    #[test]
    fn a_sealed_segment_encodes_what_was_pushed() {
        let mut s = OpenSegment::new(7, Vec::new(), [9; 16]);
        let data = vec![3u8; 5000];
        assert_eq!(s.push(EntryKind::Write, 4096, 5000, &data, 1, 1, 100), 0);
        s.push(EntryKind::Unmap, 0, 1 << 20, &[], 1, 2, 140);
        assert_eq!(s.push(EntryKind::Write, 0, 5000, &data, 1, 3, 180), 5000);
        let sealed = s.seal();
        let h = sealed.encode_header(&[5; 16]);
        let fixed = FixedHeader::decode(&h).unwrap();
        assert_eq!(
            (fixed.seq, fixed.span.first_jseq, fixed.span.last_jseq),
            (7, 1, 3)
        );
        let (idx, entries) =
            SegmentIndex::decode_tables(fixed, &h[FIXED_HEADER_BYTES..], 1 << 30, None).unwrap();
        assert_eq!(entries, sealed.entries);
        assert!(idx.verify(0, &sealed.data).is_ok());
        assert_eq!(sealed.data_bytes().len(), 10000);
    }

    #[test]
    fn chunk_crcs_from_writes_give_the_header_the_seal_would_compute() {
        use crate::format::chunk_crcs::whole_chunk_crcs;
        let mut s = OpenSegment::new(7, Vec::new(), [9; 16]);
        let mut jseq = 0;
        // Aligned, then a partial chunk, then unaligned, then a GC copy,
        // then aligned again after padding to a boundary.
        for (len, with_crcs) in [
            (65_536usize, true),
            (5000, true),
            (8192, true),
            (4096, false),
            (3192, false),
            (12_288, true),
        ] {
            let data: Vec<u8> = (0..len).map(|i| (i * 13 + len) as u8).collect();
            jseq += 1;
            let at = s.push(EntryKind::Write, 0, len as u64, &data, 1, jseq, jseq * 100);
            if with_crcs {
                s.note_chunk_crcs(at, &whole_chunk_crcs(&data));
            }
        }
        s.push_copy(1 << 20, &[5u8; 4096], 1);
        assert!(s.chunk_crcs.iter().filter(|c| c.is_some()).count() >= 19);
        let sealed = s.seal();
        let plain =
            segment::encode_header(7, &[5; 16], &sealed.span, &sealed.entries, &sealed.data);
        assert!(sealed.encode_header(&[5; 16]) == plain);
    }
}
