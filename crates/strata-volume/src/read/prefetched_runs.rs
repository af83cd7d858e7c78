//! Runs fetched by read-ahead, kept whole until readers take them.
//!
//! A read-ahead GET returns up to 8 MiB of verified chunks. Copying each
//! 4 KiB chunk into the RAM cache cost a cold sequential read ~20% of its
//! CPU (one allocation, one copy and one CLOCK insert and eviction per
//! chunk, profiled on MinIO); here the GET's buffer is kept as it is and
//! readers slice chunks out of it. Bounded by bytes (the whole buffer is
//! counted, so nothing is pinned beyond the budget); the oldest run goes
//! first, which for sequential readers is the one already read.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use parking_lot::Mutex;

use super::fetch_plan::{RunBytes, SegmentChunks, StoredPiece};
use crate::format::segment::CHUNK_BYTES;

struct Run {
    uuid: [u8; 16],
    seq: u64,
    run: RunBytes,
}

impl Run {
    fn chunks(&self) -> std::ops::Range<u64> {
        let n = (self.run.bytes.len() as u64).div_ceil(CHUNK_BYTES);
        self.run.first_chunk..self.run.first_chunk + n
    }
}

pub(crate) struct PrefetchedRuns {
    runs: Mutex<(VecDeque<Run>, u64)>,
    budget_bytes: u64,
    /// Chunks readers took from here.
    pub(crate) hits: AtomicU64,
}

impl PrefetchedRuns {
    pub(crate) fn new(budget_bytes: u64) -> Self {
        PrefetchedRuns {
            runs: Mutex::new((VecDeque::new(), 0)),
            budget_bytes,
            hits: AtomicU64::new(0),
        }
    }

    /// Keeps a verified run; drops the oldest beyond the budget.
    pub(crate) fn insert(&self, uuid: [u8; 16], seq: u64, run: RunBytes) {
        let bytes = run.bytes.len() as u64;
        if bytes == 0 || bytes > self.budget_bytes {
            return;
        }
        let mut g = self.runs.lock();
        let (runs, used) = &mut *g;
        while *used + bytes > self.budget_bytes {
            match runs.pop_front() {
                Some(old) => *used -= old.run.bytes.len() as u64,
                None => break,
            }
        }
        *used += bytes;
        runs.push_back(Run { uuid, seq, run });
    }

    /// Fills the missing chunks of `chunks` (of segment `seq`) that a kept
    /// run holds, as slices of it (no copy).
    pub(crate) fn fill(&self, uuid: &[u8; 16], seq: u64, chunks: &mut SegmentChunks) {
        if self.budget_bytes == 0 {
            return; // read-ahead is off: no lock on every read
        }
        let g = self.runs.lock();
        let mut taken = 0;
        for r in g.0.iter().filter(|r| r.seq == seq && r.uuid == *uuid) {
            let span = r.chunks();
            let from = chunks.numbers.partition_point(|&c| c < span.start);
            let to = chunks.numbers.partition_point(|&c| c < span.end);
            for pos in from..to {
                if chunks.data[pos].is_none() {
                    chunks.data[pos] = r.run.chunk(chunks.numbers[pos]);
                    taken += u64::from(chunks.data[pos].is_some());
                }
            }
        }
        drop(g);
        self.hits.fetch_add(taken, Ordering::Relaxed);
    }

    /// Copies every piece (of segment `seq`) that one kept run holds whole
    /// straight into its buffer: one copy, no per-chunk lookups (a 1 MiB
    /// sequential read is 256 chunks: a RAM-cache probe, a slice and a
    /// refcount each on the general path). Returns the pieces it did not
    /// serve, in order.
    pub(crate) fn serve<'a>(
        &self,
        uuid: &[u8; 16],
        seq: u64,
        pieces: Vec<StoredPiece<'a>>,
    ) -> Vec<StoredPiece<'a>> {
        if self.budget_bytes == 0 {
            return pieces;
        }
        // Slices under the lock (a refcount each), copies after it: other
        // readers do not wait for this one's memcpy.
        let found: Vec<Option<Bytes>> = {
            let g = self.runs.lock();
            let runs = || g.0.iter().rev().filter(|r| r.seq == seq && r.uuid == *uuid);
            pieces
                .iter()
                .map(|p| runs().find_map(|r| r.run.bytes_at(p.offset, p.dst.len())))
                .collect()
        };
        let mut rest = Vec::new();
        let mut taken = 0;
        for (p, bytes) in pieces.into_iter().zip(found) {
            match bytes {
                Some(bytes) => {
                    p.dst.copy_from_slice(&bytes);
                    let end = p.offset + p.dst.len() as u64;
                    taken += (end - 1) / CHUNK_BYTES - p.offset / CHUNK_BYTES + 1;
                }
                None => rest.push(p),
            }
        }
        self.hits.fetch_add(taken, Ordering::Relaxed);
        rest
    }

    /// For each of the sorted chunk `numbers` of segment `seq`, whether a
    /// kept run holds it.
    pub(crate) fn covered(&self, uuid: &[u8; 16], seq: u64, numbers: &[u64]) -> Vec<bool> {
        let mut out = vec![false; numbers.len()];
        if self.budget_bytes == 0 {
            return out;
        }
        let g = self.runs.lock();
        for r in g.0.iter().filter(|r| r.seq == seq && r.uuid == *uuid) {
            let span = r.chunks();
            let from = numbers.partition_point(|&c| c < span.start);
            let to = numbers.partition_point(|&c| c < span.end);
            out[from..to].iter_mut().for_each(|b| *b = true);
        }
        out
    }

    pub(crate) fn used_bytes(&self) -> u64 {
        self.runs.lock().1
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    #[test]
    fn keeps_runs_within_budget_and_fills_from_them() {
        let p = PrefetchedRuns::new(3 * CHUNK_BYTES);
        let run = |first: u64, n: usize, b: u8| RunBytes {
            first_chunk: first,
            bytes: Bytes::from(vec![b; n * CHUNK_BYTES as usize]),
        };
        p.insert([1; 16], 5, run(10, 2, 7));
        p.insert([1; 16], 5, run(20, 1, 8));
        assert_eq!(p.used_bytes(), 3 * CHUNK_BYTES);
        let mut c = SegmentChunks {
            numbers: vec![9, 10, 11, 20],
            data: vec![None; 4],
        };
        p.fill(&[1; 16], 5, &mut c);
        assert!(c.data[0].is_none());
        assert_eq!(c.data[1].as_deref(), Some(&[7u8; 4096][..]));
        assert_eq!(c.data[3].as_deref(), Some(&[8u8; 4096][..]));
        assert_eq!(
            p.covered(&[1; 16], 5, &[10, 12, 20]),
            vec![true, false, true]
        );
        assert_eq!(p.covered(&[2; 16], 5, &[10]), vec![false]);
        // A third run pushes the oldest out.
        p.insert([1; 16], 5, run(30, 1, 9));
        assert_eq!(
            p.covered(&[1; 16], 5, &[10, 20, 30]),
            vec![false, true, true]
        );
        assert!(p.used_bytes() <= 3 * CHUNK_BYTES);
    }

    #[test]
    fn serves_whole_pieces_from_one_run_and_returns_the_rest() {
        let p = PrefetchedRuns::new(64 * CHUNK_BYTES);
        let bytes: Vec<u8> = (0..8 * CHUNK_BYTES).map(|i| (i % 251) as u8).collect();
        let run = RunBytes {
            first_chunk: 2,
            bytes: Bytes::from(bytes.clone()),
        };
        p.insert([1; 16], 5, run);
        let base = 2 * CHUNK_BYTES;
        let end = base + 8 * CHUNK_BYTES;
        let (mut a, mut b, mut c) = (vec![0u8; 5000], vec![0u8; 10], vec![0u8; 8]);
        fn piece(offset: u64, dst: &mut [u8]) -> StoredPiece<'_> {
            StoredPiece {
                seq: 5,
                offset,
                dst,
            }
        }
        // The second runs past the run's end: not served.
        let pieces = vec![
            piece(base + 100, &mut a),
            piece(end - 5, &mut b),
            piece(end - 8, &mut c),
        ];
        let rest = p.serve(&[1; 16], 5, pieces);
        let left: Vec<(u64, usize)> = rest.iter().map(|r| (r.offset, r.dst.len())).collect();
        assert_eq!(left, [(end - 5, 10)]);
        drop(rest);
        assert_eq!(a, bytes[100..5100]);
        assert_eq!(c, bytes[bytes.len() - 8..]);
        assert_eq!(b, [0u8; 10]);
        assert_eq!(p.hits.load(Ordering::Relaxed), 2 + 1);
        // Another volume's or segment's pieces are never served from it.
        let mut d = vec![0u8; 4];
        assert_eq!(p.serve(&[2; 16], 5, vec![piece(base, &mut d)]).len(), 1);
        let mut e = vec![0u8; 4];
        assert_eq!(p.serve(&[1; 16], 6, vec![piece(base, &mut e)]).len(), 1);
    }
}
