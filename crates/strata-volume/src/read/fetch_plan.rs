//! Planning the fetch of stored chunks: which chunks one GET brings
//! (coalescing), what a read waits for, and the bytes a fetch returns.
//!
//! Pure bookkeeping over chunk numbers and claims; no I/O.

use std::ops::Range;

use bytes::Bytes;

use super::inflight::{Claim, Waiter};
use crate::format::segment::CHUNK_BYTES;

/// Chunks this close in a segment share one GET: fetching 64 KiB more
/// costs less than a second request to a remote store (1-10 ms each).
pub const MAX_GAP_BYTES: u64 = 64 << 10;
/// Largest single GET (bounds the buffer one fetch holds).
pub const MAX_GET_BYTES: u64 = 8 << 20;
/// How far apart chunks may be and still share one GET, and the largest
/// GET: clients' reads use `MAX_GAP_BYTES` and `MAX_GET_BYTES`, hydration
/// its own (`hydration.rs`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Coalescing {
    pub max_gap_bytes: u64,
    pub max_get_bytes: u64,
}
pub(crate) type ChunkKey = ([u8; 16], u64, u64);
pub(crate) type IndexKey = ([u8; 16], u64);

/// Who a fetch is for: what happens to its bytes once verified.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FetchKind {
    /// A client's read: the chunks asked for go to RAM.
    Read,
    /// Read-ahead of a sequential reader: the run is kept whole.
    ReadAhead,
    /// Hydration: kept whole until on disk, into free disk slots only.
    Hydrate,
}

/// Verified bytes of consecutive chunks, from `first_chunk` on.
#[derive(Clone)]
pub(crate) struct RunBytes {
    pub first_chunk: u64,
    pub bytes: Bytes,
}

impl RunBytes {
    /// The `len` bytes at segment offset `offset`, if the run holds them all.
    pub fn bytes_at(&self, offset: u64, len: usize) -> Option<Bytes> {
        let at = offset.checked_sub(self.first_chunk * CHUNK_BYTES)?;
        let at = usize::try_from(at).ok()?;
        let end = at.checked_add(len).filter(|&e| e <= self.bytes.len())?;
        Some(self.bytes.slice(at..end))
    }

    pub fn chunk(&self, chunk: u64) -> Option<Bytes> {
        let at = chunk.checked_sub(self.first_chunk)? * CHUNK_BYTES;
        let at = usize::try_from(at).ok()?;
        if at >= self.bytes.len() {
            return None;
        }
        let end = (at + CHUNK_BYTES as usize).min(self.bytes.len());
        Some(self.bytes.slice(at..end))
    }
}

/// What a segment read must fetch itself and what it waits for.
pub(crate) struct FetchPlan {
    pub runs: Vec<(Range<u64>, Claim<ChunkKey, RunBytes>)>,
    pub waits: Vec<(usize, Waiter<RunBytes>)>,
}

/// Groups sorted, distinct chunk numbers into runs to fetch with one GET
/// each: a chunk joins the previous run if at most `max_gap_chunks` lie
/// between them and the run stays within `max_run_chunks`. Returns each
/// run's chunk range and the slice of `chunks` it covers.
pub(crate) fn coalesce(
    chunks: &[u64],
    max_gap_chunks: u64,
    max_run_chunks: u64,
) -> Vec<(Range<u64>, Range<usize>)> {
    assert!(max_run_chunks >= 1);
    let mut runs: Vec<(Range<u64>, Range<usize>)> = Vec::new();
    for (i, &c) in chunks.iter().enumerate() {
        match runs.last_mut() {
            Some((run, covered))
                if c >= run.end
                    && c - run.end <= max_gap_chunks
                    && c + 1 - run.start <= max_run_chunks =>
            {
                run.end = c + 1;
                covered.end = i + 1;
            }
            _ => runs.push((c..c + 1, i..i + 1)),
        }
    }
    runs
}

/// A stored piece of a read: `dst.len()` bytes at `offset` of segment
/// `seq`'s data.
pub(crate) struct StoredPiece<'a> {
    pub seq: u64,
    pub offset: u64,
    pub dst: &'a mut [u8],
}

/// Stored pieces with disjoint destinations in `buf`, from pieces given as
/// `(buf_offset, len, seq, segment_offset)` in order and not overlapping:
/// stored data then lands in `buf` with no extra copy.
pub(crate) fn stored_pieces_in<'a>(
    buf: &'a mut [u8],
    pieces: impl Iterator<Item = (usize, usize, u64, u64)>,
) -> Vec<StoredPiece<'a>> {
    let mut out = Vec::with_capacity(pieces.size_hint().0);
    let mut rest: &mut [u8] = buf;
    let mut consumed = 0usize;
    for (at, len, seq, offset) in pieces {
        let tail = std::mem::take(&mut rest);
        let (_, tail) = tail.split_at_mut(at - consumed);
        let (dst, tail) = tail.split_at_mut(len);
        out.push(StoredPiece { seq, offset, dst });
        rest = tail;
        consumed = at + len;
    }
    out
}

/// The chunks one read needs from one segment, and what has been found.
pub(crate) struct SegmentChunks {
    /// Chunk numbers, sorted and distinct.
    pub numbers: Vec<u64>,
    pub data: Vec<Option<Bytes>>,
}

impl SegmentChunks {
    pub fn missing(&self) -> Vec<usize> {
        (0..self.numbers.len())
            .filter(|&i| self.data[i].is_none())
            .collect()
    }

    pub fn fill_run(&mut self, run: &RunBytes) {
        let end = run.first_chunk + (run.bytes.len() as u64).div_ceil(CHUNK_BYTES);
        let from = self.numbers.partition_point(|&c| c < run.first_chunk);
        let to = self.numbers.partition_point(|&c| c < end);
        for pos in from..to {
            if self.data[pos].is_none() {
                self.data[pos] = run.chunk(self.numbers[pos]);
            }
        }
    }

    /// Copies each piece out of the chunks.
    pub fn copy_out(&self, pieces: &mut [StoredPiece<'_>]) -> Result<(), String> {
        for p in pieces {
            let end = p.offset + p.dst.len() as u64;
            let mut pos = p.offset;
            while pos < end {
                let c = pos / CHUNK_BYTES;
                let i = self
                    .numbers
                    .binary_search(&c)
                    .map_err(|_| "chunk missing after fetch".to_string())?;
                let chunk = self.data[i].as_ref().ok_or("chunk missing after fetch")?;
                let chunk_start = c * CHUNK_BYTES;
                let from = (pos - chunk_start) as usize;
                let to = (end.min(chunk_start + CHUNK_BYTES) - chunk_start) as usize;
                if to > chunk.len() {
                    return Err("chunk shorter than the map says".into());
                }
                let at = (pos - p.offset) as usize;
                p.dst[at..at + (to - from)].copy_from_slice(&chunk[from..to]);
                pos = chunk_start + to as u64;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn coalesce_joins_close_chunks_and_splits_far_or_long_runs() {
        let runs = |chunks: &[u64], gap, max| -> Vec<Range<u64>> {
            coalesce(chunks, gap, max)
                .into_iter()
                .map(|r| r.0)
                .collect()
        };
        assert_eq!(runs(&[], 16, 100), Vec::<Range<u64>>::new());
        assert_eq!(runs(&[3, 4, 5], 0, 100), vec![3..6]);
        assert_eq!(runs(&[3, 5], 0, 100), vec![3..4, 5..6]);
        assert_eq!(runs(&[3, 5, 21, 39], 16, 100), vec![3..22, 39..40]);
        assert_eq!(runs(&[0, 1, 2, 3, 4], 16, 2), vec![0..2, 2..4, 4..5]);
        let covered: Vec<Range<usize>> = coalesce(&[1, 2, 40, 41], 16, 100)
            .into_iter()
            .map(|r| r.1)
            .collect();
        assert_eq!(covered, vec![0..2, 2..4]);
    }
}
