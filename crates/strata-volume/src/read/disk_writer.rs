//! The one thread that writes the disk cache tier.
//!
//! Owns the queue of verified chunks on their way into `disk_cache.rs`.
//! Reads never wait for it: a batch that would take the queue beyond its
//! byte budget is dropped (and counted), since a cache may always forget.
//! One writer, not one task per batch, because concurrent `pwrite`s to one
//! file serialise on the inode lock: profiled under a cold sequential read
//! from MinIO, lock spinning and page-cache work of parallel writers cost
//! ~40% of the server's CPU and made the read 2-3x slower.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Weak};

use bytes::Bytes;
use parking_lot::Mutex;

use super::background::BackgroundJob;
use super::disk_cache::{DiskCache, DiskKey};

/// Chunk bytes queued for the writer at most.
pub(crate) const MAX_QUEUED_BYTES: u64 = 64 << 20;

struct Batch {
    disk_id: u32,
    seq: u64,
    chunks: Vec<(u64, Bytes)>,
    bytes: u64,
    _job: BackgroundJob,
}

pub(crate) struct DiskWriter {
    disk: Arc<DiskCache>,
    queued_bytes: Arc<AtomicU64>,
    /// `None` when the tier is disabled or the thread could not start.
    tx: Mutex<Option<mpsc::Sender<Batch>>>,
}

impl DiskWriter {
    pub(crate) fn new(disk: Arc<DiskCache>) -> DiskWriter {
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
                    tracing::warn!(error = %e, "cannot start the disk cache writer; the disk tier stays empty");
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

    /// Queues `chunks` of segment `seq` for the disk tier, or drops them
    /// (counted) if the queue is full.
    pub(crate) fn submit(
        &self,
        disk_id: u32,
        seq: u64,
        chunks: Vec<(u64, Bytes)>,
        job: BackgroundJob,
    ) {
        let bytes: u64 = chunks.iter().map(|(_, b)| b.len() as u64).sum();
        let tx = self.tx.lock();
        let Some(tx) = tx.as_ref() else { return };
        let queued = self.queued_bytes.fetch_add(bytes, Ordering::AcqRel);
        if queued + bytes > MAX_QUEUED_BYTES {
            self.queued_bytes.fetch_sub(bytes, Ordering::AcqRel);
            self.disk.skip_writes(chunks.len() as u64);
            return;
        }
        let batch = Batch {
            disk_id,
            seq,
            chunks,
            bytes,
            _job: job,
        };
        if tx.send(batch).is_err() {
            self.queued_bytes.fetch_sub(bytes, Ordering::AcqRel);
        }
    }
}

fn run(disk: &Weak<DiskCache>, queued_bytes: &AtomicU64, rx: mpsc::Receiver<Batch>) {
    // Ends when the sender (the caches) is dropped.
    while let Ok(batch) = rx.recv() {
        if let Some(disk) = disk.upgrade() {
            for (c, bytes) in &batch.chunks {
                if let Some(key) = DiskKey::new(batch.disk_id, batch.seq, *c) {
                    disk.insert(&key, bytes);
                }
            }
        }
        queued_bytes.fetch_sub(batch.bytes, Ordering::AcqRel);
    }
}
