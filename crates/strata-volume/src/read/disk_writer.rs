//! The one thread that writes the disk cache.
//!
//! Owns the queue of blocks on their way into `block_cache.rs`: data written
//! on this host (a segment's data area, once its upload is done) and
//! verified blocks fetched from the store. Reads and writes never wait for
//! it: a batch that would take the queue beyond its byte budget is dropped
//! (and counted), since a cache may always forget. One writer, not one task
//! per batch, because concurrent `pwrite`s to one file serialise on the
//! inode lock: profiled under a cold sequential read from MinIO, lock
//! spinning and page-cache work of parallel writers cost ~40% of the
//! server's CPU and made the read 2-3x slower.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Weak};

use bytes::Bytes;
use parking_lot::Mutex;

use super::background::BackgroundJob;
use super::block_cache::{BlockCache, BlockKey, BLOCK_BYTES};

/// Bytes queued for the writer at most.
pub(crate) const MAX_QUEUED_BYTES: u64 = 64 << 20;

/// Called once a batch's bytes are no longer referenced by the writer (a
/// written segment's buffer goes back to its volume's pool).
pub(crate) type OnDone = Box<dyn FnOnce() + Send>;

/// Consecutive blocks of one segment, from `first_block` on; every block
/// but the segment's last is whole.
pub(crate) struct Blocks {
    pub volume_key: u64,
    pub seq: u64,
    pub first_block: u32,
    pub bytes: Bytes,
    /// Written on this host (else fetched from the store).
    pub written: bool,
}

struct Batch {
    blocks: Blocks,
    on_done: Option<OnDone>,
    _job: BackgroundJob,
}

pub(crate) struct DiskWriter {
    disk: Arc<BlockCache>,
    queued_bytes: Arc<AtomicU64>,
    /// `None` when the tier is disabled or the thread could not start.
    tx: Mutex<Option<mpsc::Sender<Batch>>>,
}

impl DiskWriter {
    pub(crate) fn new(disk: Arc<BlockCache>) -> DiskWriter {
        let queued_bytes = Arc::new(AtomicU64::new(0));
        let tx = if disk.enabled() {
            let (tx, rx) = mpsc::channel::<Batch>();
            // Weak: the cache (and its file lock) goes when the caches do,
            // not when this thread next wakes up.
            let (d, q) = (Arc::downgrade(&disk), queued_bytes.clone());
            let spawned = std::thread::Builder::new()
                .name("strata-disk-cache".into())
                .spawn(move || run(&d, &q, rx));
            match spawned {
                Ok(_) => Some(tx),
                Err(e) => {
                    tracing::warn!(error = %e, "cannot start the disk cache writer; the disk cache stays empty");
                    None
                }
            }
        } else {
            None
        };
        DiskWriter {
            disk,
            queued_bytes,
            tx: Mutex::new(tx),
        }
    }

    /// Queues `blocks`, or drops them (counted) if the queue is full or the
    /// tier is off; `on_done` runs in either case once the bytes are
    /// released.
    pub(crate) fn submit(&self, blocks: Blocks, on_done: Option<OnDone>, job: BackgroundJob) {
        let bytes = blocks.bytes.len() as u64;
        let batch = Batch {
            blocks,
            on_done,
            _job: job,
        };
        let tx = self.tx.lock();
        let Some(tx) = tx.as_ref().filter(|_| self.disk.enabled()) else {
            finish(batch);
            return;
        };
        let queued = self.queued_bytes.fetch_add(bytes, Ordering::AcqRel);
        if queued + bytes > MAX_QUEUED_BYTES {
            self.queued_bytes.fetch_sub(bytes, Ordering::AcqRel);
            self.disk.skip_writes(bytes.div_ceil(BLOCK_BYTES));
            finish(batch);
            return;
        }
        if let Err(mpsc::SendError(batch)) = tx.send(batch) {
            self.queued_bytes.fetch_sub(bytes, Ordering::AcqRel);
            finish(batch);
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

fn run(disk: &Weak<BlockCache>, queued_bytes: &AtomicU64, rx: mpsc::Receiver<Batch>) {
    // Ends when the sender (the caches) is dropped.
    while let Ok(batch) = rx.recv() {
        if let Some(disk) = disk.upgrade() {
            write_blocks(&disk, &batch.blocks);
        }
        queued_bytes.fetch_sub(batch.blocks.bytes.len() as u64, Ordering::AcqRel);
        finish(batch);
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
        if b.written {
            disk.insert_written(&key, data);
        } else {
            disk.insert_fetched(&key, data);
        }
    }
}
