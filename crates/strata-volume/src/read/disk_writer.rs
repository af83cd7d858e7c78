//! The one thread that writes the disk cache.
//!
//! Owns the queue of blocks on their way into `block_cache.rs`: data written
//! on this host (a segment's data area, once its upload is done) and
//! verified blocks fetched from the store. Reads and client writes never
//! wait for it: a fetched batch that would take the queue beyond its byte
//! budget is dropped (and counted), since a cache may always forget. A
//! written batch is what this host promised to keep readable locally, so
//! its upload task waits for room, up to `MAX_WRITTEN_WAIT_MS`: dropping
//! it under a burst of finished uploads left 80 MB of a 1 GiB fill out of
//! the cache in one fill of five, each later read of it a GET. A wait that
//! runs out puts the writer in `behind` mode (no more waits, drops
//! counted) until its queue is empty, so a stuck cache disk costs the
//! uploads one wait, not one per segment. One writer, not one task
//! per batch, because concurrent `pwrite`s to one file serialise on the
//! inode lock: profiled under a cold sequential read from MinIO, lock
//! spinning and page-cache work of parallel writers cost ~40% of the
//! server's CPU and made the read 2-3x slower.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Weak};

use bytes::Bytes;
use parking_lot::Mutex;
use tokio::sync::Notify;

use super::background::BackgroundJob;
use super::block_cache::{BlockCache, BlockKey, BLOCK_BYTES};

/// Bytes queued for the writer at most.
pub(crate) const MAX_QUEUED_BYTES: u64 = 64 << 20;
/// Longest wait of an upload for room in the queue (written data only).
const MAX_WRITTEN_WAIT_MS: u64 = 2_000;

/// Called once a batch's bytes are no longer referenced by the writer (a
/// written segment's buffer goes back to its volume's pool).
pub(crate) type OnDone = Box<dyn FnOnce() + Send>;

/// Where a batch's blocks come from: what decides how they enter the
/// cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BlockSource {
    /// Written on this host (its segment now in the store).
    Written,
    /// Fetched by a client read or read-ahead (second-fetch admission).
    Fetched,
    /// Fetched by hydration: into free slots only, never evicting.
    Hydrated,
}

/// Consecutive blocks of one segment, from `first_block` on; every block
/// but the segment's last is whole.
pub(crate) struct Blocks {
    pub volume_key: u64,
    pub seq: u64,
    pub first_block: u32,
    pub bytes: Bytes,
    pub source: BlockSource,
}

struct Batch {
    blocks: Blocks,
    on_done: Option<OnDone>,
    _job: BackgroundJob,
}

/// The queue's room, shared with the writer thread.
#[derive(Default)]
struct Queue {
    bytes: AtomicU64,
    /// Signalled whenever the writer has finished a batch.
    freed: Notify,
    /// A written batch's wait ran out; cleared when the queue empties.
    behind: AtomicBool,
}

impl Queue {
    /// Takes room for `bytes`, if there is some.
    fn reserve(&self, bytes: u64) -> bool {
        let queued = self.bytes.fetch_add(bytes, Ordering::AcqRel);
        if queued + bytes > MAX_QUEUED_BYTES && queued > 0 {
            self.bytes.fetch_sub(bytes, Ordering::AcqRel);
            return false;
        }
        true
    }

    fn release(&self, bytes: u64) {
        if self.bytes.fetch_sub(bytes, Ordering::AcqRel) == bytes {
            self.behind.store(false, Ordering::Release);
        }
        self.freed.notify_waiters();
    }
}

pub(crate) struct DiskWriter {
    disk: Arc<BlockCache>,
    queue: Arc<Queue>,
    /// `None` when the tier is disabled or the thread could not start.
    tx: Mutex<Option<mpsc::Sender<Batch>>>,
}

impl DiskWriter {
    pub(crate) fn new(disk: Arc<BlockCache>) -> DiskWriter {
        let queue = Arc::new(Queue::default());
        let tx = if disk.enabled() {
            let (tx, rx) = mpsc::channel::<Batch>();
            // Weak: the cache (and its file lock) goes when the caches do,
            // not when this thread next wakes up.
            let (d, q) = (Arc::downgrade(&disk), queue.clone());
            let spawned = std::thread::Builder::new()
                .name("strata-disk-cache".into())
                .spawn(move || run(&d, &q, rx));
            match spawned {
                Ok(_) => Some(tx),
                Err(e) => {
                    tracing::warn!(error = %strata_store::ErrorText(&e), "cannot start the disk cache writer; the disk cache stays empty");
                    None
                }
            }
        } else {
            None
        };
        DiskWriter {
            disk,
            queue,
            tx: Mutex::new(tx),
        }
    }

    /// Queues written `blocks`, waiting for room up to
    /// `MAX_WRITTEN_WAIT_MS` unless the writer is behind; else drops them
    /// as `submit` does.
    pub(crate) async fn submit_written(
        &self,
        blocks: Blocks,
        on_done: Option<OnDone>,
        job: BackgroundJob,
    ) {
        let bytes = blocks.bytes.len() as u64;
        let deadline =
            tokio::time::Instant::now() + std::time::Duration::from_millis(MAX_WRITTEN_WAIT_MS);
        while self.disk.enabled() && !self.queue.behind.load(Ordering::Acquire) {
            let freed = self.queue.freed.notified();
            tokio::pin!(freed);
            freed.as_mut().enable();
            if self.queue.reserve(bytes) {
                return self.send_reserved(Batch::new(blocks, on_done, job), bytes);
            }
            if tokio::time::timeout_at(deadline, freed).await.is_err() {
                self.queue.behind.store(true, Ordering::Release);
                tracing::warn!(
                    wait_ms = MAX_WRITTEN_WAIT_MS,
                    "the disk cache's writer is behind: data uploaded meanwhile is not cached until it catches up (reads of it go to the store)"
                );
            }
        }
        self.submit(blocks, on_done, job);
    }

    /// Queues hydrated `blocks` once the queue is at most half full,
    /// waiting as long as that takes: hydration runs at the speed the
    /// cache disk takes, and leaves half the queue to written data and
    /// client reads. Returns false (blocks dropped) when the tier is off.
    pub(crate) async fn submit_hydrated(
        &self,
        blocks: Blocks,
        on_done: OnDone,
        job: BackgroundJob,
    ) -> bool {
        let bytes = blocks.bytes.len() as u64;
        loop {
            if !self.disk.enabled() {
                finish(Batch::new(blocks, Some(on_done), job));
                return false;
            }
            let freed = self.queue.freed.notified();
            tokio::pin!(freed);
            freed.as_mut().enable();
            if self.queue.bytes.load(Ordering::Acquire) + bytes <= MAX_QUEUED_BYTES / 2
                && self.queue.reserve(bytes)
            {
                self.send_reserved(Batch::new(blocks, Some(on_done), job), bytes);
                return true;
            }
            // Woken when the writer finishes a batch; the timeout only
            // guards against a wake-up lost to a race with `reserve`.
            let _ = tokio::time::timeout(std::time::Duration::from_millis(100), freed).await;
        }
    }

    /// Queues `blocks`, or drops them (counted) if the queue is full or the
    /// tier is off; `on_done` runs in either case once the bytes are
    /// released.
    pub(crate) fn submit(&self, blocks: Blocks, on_done: Option<OnDone>, job: BackgroundJob) {
        let bytes = blocks.bytes.len() as u64;
        let batch = Batch::new(blocks, on_done, job);
        if !self.disk.enabled() {
            return finish(batch);
        }
        if !self.queue.reserve(bytes) {
            self.disk.skip_writes(bytes.div_ceil(BLOCK_BYTES));
            return finish(batch);
        }
        self.send_reserved(batch, bytes);
    }

    /// Sends a batch whose room is taken.
    fn send_reserved(&self, batch: Batch, bytes: u64) {
        let tx = self.tx.lock();
        let Some(tx) = tx.as_ref() else {
            self.queue.release(bytes);
            return finish(batch);
        };
        if let Err(mpsc::SendError(batch)) = tx.send(batch) {
            self.queue.release(bytes);
            finish(batch);
        }
    }
}

impl Batch {
    fn new(blocks: Blocks, on_done: Option<OnDone>, job: BackgroundJob) -> Batch {
        Batch {
            blocks,
            on_done,
            _job: job,
        }
    }
}

/// Releases a batch's bytes, then tells its owner.
fn finish(batch: Batch) {
    let Batch {
        blocks, on_done, ..
    } = batch;
    drop(blocks);
    if let Some(done) = on_done {
        done();
    }
}

fn run(disk: &Weak<BlockCache>, queue: &Queue, rx: mpsc::Receiver<Batch>) {
    // Ends when the sender (the caches) is dropped.
    while let Ok(batch) = rx.recv() {
        if let Some(disk) = disk.upgrade() {
            write_blocks(&disk, &batch.blocks);
        }
        let bytes = batch.blocks.bytes.len() as u64;
        finish(batch);
        queue.release(bytes);
    }
}

fn write_blocks(disk: &BlockCache, b: &Blocks) {
    for (i, data) in b.bytes.chunks(BLOCK_BYTES as usize).enumerate() {
        let Some(block) = u32::try_from(i)
            .ok()
            .and_then(|i| b.first_block.checked_add(i))
        else {
            return;
        };
        let key = BlockKey {
            volume_key: b.volume_key,
            seq: b.seq,
            block,
        };
        match b.source {
            BlockSource::Written => disk.insert_written(&key, data),
            BlockSource::Fetched => disk.insert_fetched(&key, data),
            BlockSource::Hydrated => disk.insert_hydrated(&key, data),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use crate::read::background::Background;

    /// `batches` segments of 16 MiB submitted at once (4x the queue's
    /// budget, as when parallel uploads finish together); returns the
    /// blocks the cache holds once the writer is done, and those dropped.
    async fn burst(written: bool, batches: u64) -> (u64, u64) {
        let dir = tempfile::tempdir().unwrap();
        let disk = Arc::new(BlockCache::open(dir.path(), 1 << 30).unwrap());
        let writer = DiskWriter::new(disk.clone());
        let background = Arc::new(Background::default());
        let segment = Bytes::from(vec![7u8; 16 << 20]);
        for seq in 0..batches {
            let blocks = Blocks {
                volume_key: 1,
                seq,
                first_block: 0,
                bytes: segment.clone(),
                source: if written {
                    BlockSource::Written
                } else {
                    BlockSource::Fetched
                },
            };
            if written {
                writer
                    .submit_written(blocks, None, background.start())
                    .await;
            } else {
                writer.submit(blocks, None, background.start());
            }
        }
        background.settle().await;
        let s = disk.stats();
        (s.used_bytes / BLOCK_BYTES, s.skipped_writes)
    }

    /// A writer that makes no progress (its thread stuck) costs one wait
    /// of `MAX_WRITTEN_WAIT_MS`, then written data is dropped at once
    /// (counted) until the queue empties; after that, it waits again.
    #[tokio::test]
    async fn a_stuck_writer_costs_one_wait_then_drops_until_it_catches_up() {
        let dir = tempfile::tempdir().unwrap();
        let disk = Arc::new(BlockCache::open(dir.path(), 1 << 30).unwrap());
        let writer = DiskWriter::new(disk.clone());
        let background = Arc::new(Background::default());
        let segment = |seq| Blocks {
            volume_key: 1,
            seq,
            first_block: 0,
            bytes: Bytes::from(vec![7u8; (MAX_QUEUED_BYTES / 2) as usize]),
            source: BlockSource::Written,
        };
        // The first batch's callback holds the writer thread.
        let (unblock, blocked) = std::sync::mpsc::channel::<()>();
        let hold: OnDone = Box::new(move || {
            let _ = blocked.recv();
        });
        writer
            .submit_written(segment(0), Some(hold), background.start())
            .await;
        writer
            .submit_written(segment(1), None, background.start())
            .await;
        let t = std::time::Instant::now();
        writer
            .submit_written(segment(2), None, background.start())
            .await;
        let waited = t.elapsed();
        assert!(
            waited >= std::time::Duration::from_millis(MAX_WRITTEN_WAIT_MS),
            "{waited:?}"
        );
        let t = std::time::Instant::now();
        writer
            .submit_written(segment(3), None, background.start())
            .await;
        assert!(
            t.elapsed() < std::time::Duration::from_millis(500),
            "behind: no second wait"
        );
        let per_segment = MAX_QUEUED_BYTES / 2 / BLOCK_BYTES;
        assert_eq!(disk.stats().skipped_writes, 2 * per_segment);
        unblock.send(()).unwrap();
        background.settle().await;
        // Caught up: data is cached again.
        writer
            .submit_written(segment(4), None, background.start())
            .await;
        background.settle().await;
        let s = disk.stats();
        assert_eq!(s.skipped_writes, 2 * per_segment);
        assert_eq!(s.written_insertions, 3 * per_segment, "{s:?}");
    }

    #[tokio::test]
    async fn data_written_here_waits_for_room_and_fetched_data_is_dropped() {
        let blocks_per_segment = (16 << 20) / BLOCK_BYTES;
        assert_eq!(burst(true, 16).await, (16 * blocks_per_segment, 0));
        let (cached, skipped) = burst(false, 16).await;
        assert!(
            skipped > 0,
            "a burst of fetched data beyond the budget is dropped"
        );
        assert_eq!(cached + skipped, 16 * blocks_per_segment);
    }
}
