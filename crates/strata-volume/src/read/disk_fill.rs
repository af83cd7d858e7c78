//! The disk tier on a read: looking chunks up in `disk_cache.rs`, reading
//! them back, and verifying each against its segment's CRC before it is
//! served or promoted to RAM (what is read back from disk is untrusted).

use std::sync::Arc;

use bytes::Bytes;

use super::disk_cache::{DiskCache, DiskHit, DiskKey};
use super::fetch_plan::SegmentChunks;
use super::shared_caches::SharedCaches;
use super::volume_reader::VolumeReader;
use crate::format::segment::{SegmentIndex, CHUNK_BYTES};

/// Disk-tier reads of at most this many chunks are `pread` on the calling
/// worker (microseconds from the page cache, like the embedded store's
/// reads); more go to the blocking pool so a cold disk cannot stall a
/// worker for long.
const INLINE_DISK_READ_CHUNKS: usize = 4;

impl VolumeReader {
    /// Chunks of the disk tier, verified against the segment's CRCs; a
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
        let mut hits: Vec<(usize, DiskKey, DiskHit, usize)> = Vec::new();
        for pos in chunks.missing() {
            let c = chunks.numbers[pos];
            let found = DiskKey::new(self.disk_id, seq, c)
                .and_then(|k| caches.disk.lookup(&k).map(|h| (k, h)));
            match found {
                Some((key, hit)) => hits.push((pos, key, hit, chunk_len(idx, c))),
                None => caches.disk.count_miss(),
            }
        }
        if hits.is_empty() {
            return;
        }
        let reads = read_disk_slots(&caches.disk, &hits).await;
        for ((pos, key, hit, _), read) in hits.into_iter().zip(reads) {
            let c = chunks.numbers[pos];
            let bytes = match read {
                Ok(b) => b,
                Err(e) => {
                    tracing::debug!(error = %e, "disk cache read failed");
                    caches.disk.count_io_error();
                    caches.disk.count_miss();
                    continue;
                }
            };
            if !caches.disk.still_holds(&hit, &key) {
                caches.disk.count_miss();
                continue;
            }
            if let Err(detail) = idx.verify(c, &bytes) {
                tracing::warn!(volume = %self.name, seq, chunk = c, %detail, path = %caches.disk.path().display(), "disk cache entry failed verification; reading it from the store");
                caches.disk.drop_corrupt(&hit, &key);
                continue;
            }
            caches.disk.count_hit();
            let bytes = Bytes::from(bytes);
            caches
                .chunks
                .insert((self.uuid, seq, c), bytes.clone(), CHUNK_BYTES);
            chunks.data[pos] = Some(bytes);
        }
    }
}

/// Bytes of chunk `c` of a segment (the last one may be short).
fn chunk_len(idx: &SegmentIndex, c: u64) -> usize {
    (idx.fixed.data_bytes - c * CHUNK_BYTES).min(CHUNK_BYTES) as usize
}

/// Reads the slots of `hits` (see `INLINE_DISK_READ_CHUNKS`).
async fn read_disk_slots(
    disk: &Arc<DiskCache>,
    hits: &[(usize, DiskKey, DiskHit, usize)],
) -> Vec<std::io::Result<Vec<u8>>> {
    let jobs: Vec<(DiskHit, usize)> = hits.iter().map(|h| (h.2, h.3)).collect();
    if jobs.len() <= INLINE_DISK_READ_CHUNKS {
        return jobs.iter().map(|(hit, len)| disk.read(hit, *len)).collect();
    }
    let n = jobs.len();
    let disk = disk.clone();
    let read_all = move || jobs.iter().map(|(hit, len)| disk.read(hit, *len)).collect();
    match tokio::task::spawn_blocking(read_all).await {
        Ok(reads) => reads,
        Err(e) => (0..n)
            .map(|_| Err(std::io::Error::other(e.to_string())))
            .collect(),
    }
}
