//! The disk cache on a read: looking blocks up in `block_cache.rs`, reading
//! the chunks back (one `pread` per block), and verifying each against its
//! segment's CRC before it is served (what is read back from disk is
//! untrusted).
//!
//! Two ways in: `serve_from_disk` reads whole pieces whose blocks are all
//! cached straight into the client's buffer (the common case for data
//! written on this host: like the embedded store's reads, no RAM-cache
//! copy of what the page cache holds, no fetch bookkeeping); `fill_from_disk`
//! fills the chunks the RAM cache lacked for the pieces that took the
//! general path, and promotes them to RAM.

use std::sync::Arc;

use bytes::Bytes;

use super::block_cache::{BlockCache, BlockKey, DiskHit, BLOCK_BYTES, CHUNKS_PER_BLOCK};
use super::disk_streams::DiskPiece;
use super::fetch_plan::{SegmentChunks, StoredPiece};
use super::shared_caches::SharedCaches;
use super::volume_reader::VolumeReader;
use crate::format::segment::{SegmentIndex, CHUNK_BYTES};

/// Disk reads of at most this many bytes are `pread` on the calling worker
/// (microseconds from the page cache, like the embedded store's reads);
/// more go to the blocking pool so a cold disk cannot stall a worker long.
const INLINE_DISK_READ_BYTES: u64 = 64 << 10;
/// Cached blocks of a segment the kernel is asked to read ahead of a read
/// served from the disk cache (512 KiB).
const DISK_READ_AHEAD_BLOCKS: u64 = 8;

/// One `pread`: chunks `first..=last` of a block found in the cache, for
/// the positions `positions` of the read's chunk list.
struct BlockRead {
    key: BlockKey,
    hit: DiskHit,
    first: u64,
    last: u64,
    positions: Vec<usize>,
}

impl VolumeReader {
    /// Serves the pieces whose blocks are all in the disk cache, verified,
    /// straight into their buffers; returns the others (and any whose read
    /// or verification failed) for the general path.
    pub(crate) fn serve_from_disk<'a>(
        &self,
        caches: &SharedCaches,
        idx: &SegmentIndex,
        seq: u64,
        pieces: Vec<StoredPiece<'a>>,
    ) -> Vec<StoredPiece<'a>> {
        let mut rest = Vec::new();
        let mut scratch = Vec::new();
        for mut p in pieces {
            if !self.piece_from_disk(caches, idx, seq, &mut p, &mut scratch) {
                rest.push(p);
            }
        }
        rest
    }

    /// Reads one piece from the disk cache, block by block; false (nothing
    /// counted as a miss: the general path looks again) if a block is
    /// absent, reused meanwhile, unreadable or fails verification.
    fn piece_from_disk(
        &self,
        caches: &SharedCaches,
        idx: &SegmentIndex,
        seq: u64,
        p: &mut StoredPiece<'_>,
        scratch: &mut Vec<u8>,
    ) -> bool {
        let disk = &caches.disk;
        let end = p.offset + p.dst.len() as u64;
        if p.dst.is_empty() || end > idx.fixed.data_bytes {
            return false;
        }
        let (first, last) = (p.offset / CHUNK_BYTES, (end - 1) / CHUNK_BYTES);
        self.disk_read_ahead(
            disk,
            DiskPiece {
                seq,
                offset_bytes: p.offset,
                end_bytes: end,
            },
            idx,
        );
        let mut chunk = first;
        while chunk <= last {
            let Some(key) = BlockKey::of_chunk(self.volume_key, seq, chunk) else {
                return false;
            };
            let span_last = last.min(key.first_chunk() + CHUNKS_PER_BLOCK - 1);
            let Some(hit) = disk.lookup(&key) else {
                return false;
            };
            let from = chunk * CHUNK_BYTES;
            let to = ((span_last + 1) * CHUNK_BYTES).min(idx.fixed.data_bytes);
            // Whole chunks of the piece: read and verified in the client's
            // buffer itself (no scratch, no copy).
            if from >= p.offset && to <= end {
                let at = (from - p.offset) as usize;
                let dst = &mut p.dst[at..at + (to - from) as usize];
                if !self.read_verified(disk, idx, seq, (&key, &hit), chunk, dst) {
                    return false;
                }
                disk.count_hits(span_last + 1 - chunk);
                chunk = span_last + 1;
                continue;
            }
            scratch.resize((to - from) as usize, 0);
            if !self.read_verified(disk, idx, seq, (&key, &hit), chunk, scratch) {
                return false;
            }
            // The part of the piece inside this span.
            let copy_from = p.offset.max(from);
            let copy_to = end.min(to);
            let src = &scratch[(copy_from - from) as usize..(copy_to - from) as usize];
            let at = (copy_from - p.offset) as usize;
            p.dst[at..at + src.len()].copy_from_slice(src);
            disk.count_hits(span_last + 1 - chunk);
            chunk = span_last + 1;
        }
        true
    }

    /// Starts the kernel reading the cached blocks after `piece` in its
    /// segment (up to `DISK_READ_AHEAD_BLOCKS` ahead, each block once per
    /// stream) when the piece looks sequential there (`disk_streams.rs`):
    /// data stored together is mostly read together (an image's files, a
    /// sequential reader), and the slots holding it are scattered.
    fn disk_read_ahead(&self, disk: &BlockCache, piece: DiskPiece, idx: &SegmentIndex) {
        let blocks = u64::from(idx.fixed.chunk_count).div_ceil(CHUNKS_PER_BLOCK);
        let Some((from, until)) =
            self.disk_read_ahead
                .lock()
                .note(piece, BLOCK_BYTES, DISK_READ_AHEAD_BLOCKS, blocks)
        else {
            return;
        };
        for b in from..until {
            let Ok(b) = u32::try_from(b) else { return };
            let key = BlockKey {
                volume_key: self.volume_key,
                seq: piece.seq,
                block: b,
            };
            disk.read_ahead(&key);
        }
    }

    /// Reads chunks `first..` of a cached block into `buf` (its length is
    /// the span) and verifies them; false, with the reason counted and a
    /// corrupt block dropped, if they cannot be served.
    fn read_verified(
        &self,
        disk: &BlockCache,
        idx: &SegmentIndex,
        seq: u64,
        (key, hit): (&BlockKey, &DiskHit),
        first: u64,
        buf: &mut [u8],
    ) -> bool {
        let in_block = first * CHUNK_BYTES - key.first_chunk() * CHUNK_BYTES;
        if let Err(e) = disk.read_at(hit, in_block, buf) {
            tracing::debug!(error = %strata_store::ErrorText(&e), "disk cache read failed");
            disk.count_io_error();
            return false;
        }
        self.trust(disk, idx, seq, (key, hit), first, buf)
    }

    /// Whether bytes read from a cached block (chunks `first..`) may be
    /// served: the slot still held the block and the chunks match their
    /// segment's CRCs; a block that fails is dropped and logged.
    fn trust(
        &self,
        disk: &BlockCache,
        idx: &SegmentIndex,
        seq: u64,
        (key, hit): (&BlockKey, &DiskHit),
        first: u64,
        bytes: &[u8],
    ) -> bool {
        if !disk.still_holds(hit, key) {
            return false;
        }
        if let Err(detail) = idx.verify(first, bytes) {
            tracing::warn!(volume = %self.name, seq, block = key.block, %detail, path = %disk.path().display(), "disk cache block failed verification; dropped, reading it from the store");
            disk.drop_corrupt(hit, key);
            return false;
        }
        true
    }

    /// Chunks of the disk cache, verified against the segment's CRCs; a
    /// verified chunk is promoted to RAM.
    pub(crate) async fn fill_from_disk(
        &self,
        caches: &SharedCaches,
        idx: &SegmentIndex,
        seq: u64,
        chunks: &mut SegmentChunks,
    ) {
        if !caches.disk.enabled() || chunks.data.iter().all(Option::is_some) {
            return;
        }
        let reads = self.plan_block_reads(&caches.disk, seq, chunks);
        if reads.is_empty() {
            return;
        }
        let data_bytes = idx.fixed.data_bytes;
        let results = read_blocks(&caches.disk, &reads, data_bytes).await;
        for (r, result) in reads.into_iter().zip(results) {
            let bytes = match result {
                Ok(b) => b,
                Err(e) => {
                    tracing::debug!(error = %strata_store::ErrorText(&e), "disk cache read failed");
                    caches.disk.count_io_error();
                    caches.disk.count_misses(r.positions.len() as u64);
                    continue;
                }
            };
            if !self.trust(&caches.disk, idx, seq, (&r.key, &r.hit), r.first, &bytes) {
                caches.disk.count_misses(r.positions.len() as u64);
                continue;
            }
            caches.disk.count_hits(r.positions.len() as u64);
            let bytes = Bytes::from(bytes);
            for pos in r.positions {
                let c = chunks.numbers[pos];
                let at = ((c - r.first) * CHUNK_BYTES) as usize;
                let end = (at + CHUNK_BYTES as usize).min(bytes.len());
                // Its own allocation in RAM: a slice would pin the block.
                let chunk = Bytes::copy_from_slice(&bytes[at..end]);
                caches
                    .chunks
                    .insert((self.uuid, seq, c), chunk.clone(), CHUNK_BYTES);
                chunks.data[pos] = Some(chunk);
            }
        }
    }

    /// Groups the missing chunks by block and looks each block up once.
    fn plan_block_reads(
        &self,
        disk: &BlockCache,
        seq: u64,
        chunks: &SegmentChunks,
    ) -> Vec<BlockRead> {
        let mut reads: Vec<BlockRead> = Vec::new();
        let mut missed_block = None;
        for pos in chunks.missing() {
            let c = chunks.numbers[pos];
            let block = c / CHUNKS_PER_BLOCK;
            if let Some(r) = reads
                .last_mut()
                .filter(|r| r.first / CHUNKS_PER_BLOCK == block)
            {
                r.last = c;
                r.positions.push(pos);
                continue;
            }
            if missed_block == Some(block) {
                disk.count_misses(1);
                continue;
            }
            let found = BlockKey::of_chunk(self.volume_key, seq, c)
                .and_then(|k| disk.lookup(&k).map(|h| (k, h)));
            match found {
                Some((key, hit)) => reads.push(BlockRead {
                    key,
                    hit,
                    first: c,
                    last: c,
                    positions: vec![pos],
                }),
                None => {
                    missed_block = Some(block);
                    disk.count_misses(1);
                }
            }
        }
        reads
    }
}

/// Reads each block's chunk span (see `INLINE_DISK_READ_BYTES`); a span
/// ends at the segment's data end.
async fn read_blocks(
    disk: &Arc<BlockCache>,
    reads: &[BlockRead],
    data_bytes: u64,
) -> Vec<std::io::Result<Vec<u8>>> {
    let jobs: Vec<(DiskHit, u64, usize)> = reads
        .iter()
        .map(|r| {
            let from = r.first * CHUNK_BYTES;
            let to = ((r.last + 1) * CHUNK_BYTES).min(data_bytes).max(from);
            let in_block = from - r.key.first_chunk() * CHUNK_BYTES;
            (r.hit, in_block, (to - from) as usize)
        })
        .collect();
    let read_one = |disk: &BlockCache, (hit, at, len): &(DiskHit, u64, usize)| {
        let mut buf = vec![0u8; *len];
        disk.read_at(hit, *at, &mut buf).map(|()| buf)
    };
    let total: u64 = jobs.iter().map(|j| j.2 as u64).sum();
    if total <= INLINE_DISK_READ_BYTES {
        return jobs.iter().map(|j| read_one(disk, j)).collect();
    }
    let n = jobs.len();
    let disk = disk.clone();
    let read_all = move || jobs.iter().map(|j| read_one(&disk, j)).collect();
    match tokio::task::spawn_blocking(read_all).await {
        Ok(reads) => reads,
        Err(e) => (0..n)
            .map(|_| Err(std::io::Error::other(e.to_string())))
            .collect(),
    }
}
