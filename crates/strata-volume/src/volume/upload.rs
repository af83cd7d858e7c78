//! A sealed segment's way into the store: upload (parallel, bounded by
//! `--parallel-uploads`, retried until it works or the volume is fenced),
//! then durable once every earlier segment is, which frees its memory and
//! journal space; then the checkpoint taken when it was sealed, if any.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use bytes::Bytes;

use super::staged::Published;
use super::{CheckpointJob, Volume};
use crate::at_rest::encode_sealed;
use crate::config::MAX_VOLUME_BYTES;
use crate::crash_point::crash_point;
use crate::format::key_wrap::Key;
use crate::format::segment::{FixedHeader, SegmentIndex, FIXED_HEADER_BYTES};
use crate::read::OnDone;
use crate::write::open_segment::SealedSegment;
use crate::write::segment_put::put_segment;

impl Volume {
    /// Uploads one sealed segment, then (if given) the checkpoint taken when
    /// it was sealed. Gives up only when the volume is fenced.
    pub(crate) async fn upload(
        self: Arc<Self>,
        sealed: Arc<SealedSegment>,
        ckpt: Option<CheckpointJob>,
    ) {
        if let Some(staged) = sealed.staged.clone() {
            // Its staging name goes once the segment is durable, whichever
            // way it is stored.
            let name = staged.file.staging_path().to_path_buf();
            self.state
                .lock()
                .staged_unlink
                .entry(sealed.seq)
                .or_default()
                .push(name);
            match self.publish_staged(&sealed, &staged).await {
                Published::Stored(header, permit) => {
                    let object_bytes = header.len() as u64 + sealed.data.len() as u64;
                    self.after_stored(sealed, header, object_bytes, permit, ckpt)
                        .await;
                    return;
                }
                Published::Refused => return,
                Published::Fallback => {}
            }
        }
        let encoded = encode_sealed(&self.at_rest, self.uuid, &sealed, || self.take_buffer());
        let (header, stored) = match encoded.await {
            Ok(encoded) => encoded,
            Err(e) => {
                // Nothing written: the journal still holds the data, and
                // writes stop until a restart replays it.
                let detail = format!("segment {} could not be encoded: {e}", sealed.seq);
                tracing::error!(volume = %self.name, object = %self.names.segment(sealed.seq), %detail, "segment not uploaded");
                self.state.lock().failed.get_or_insert(detail);
                self.space.notify_waiters();
                return;
            }
        };
        let object_bytes = header.len() as u64 + stored.len() as u64;
        let path = self.names.segment(sealed.seq);
        // Held until the disk cache's writer has room for the data (below):
        // a writer that falls behind slows the uploads rather than lose
        // what this host wrote.
        let Ok(permit) = self.upload_slots.clone().acquire_owned().await else {
            return;
        };
        {
            // The server's uploads in flight, shared fairly by its volumes.
            let _host_slot = self
                .host_writes
                .uploads
                .acquire(&self.uploads_in_flight)
                .await;
            let put = put_segment(
                &self.store,
                &self.ownership,
                &self.name,
                &path,
                &header,
                &stored,
            );
            if let Err(refused) = put.await {
                let detail = self.refused(refused);
                tracing::error!(volume = %self.name, object = %path, %detail, "segment not uploaded");
                return;
            }
        }
        // Version 2 frames were encoded into a pool buffer: back to the pool
        // (the put's clones are gone). Version 1's data area shares the
        // segment's own buffer (`Bytes::from_owner`), which this refuses.
        if let Ok(frames) = stored.try_into_mut() {
            self.recycle_buffer(frames.into());
        }
        self.after_stored(sealed, header, object_bytes, permit, ckpt)
            .await;
    }

    /// What follows a segment's upload: counted, cached, durable once
    /// every earlier one is, its buffer recycled, then its checkpoint.
    async fn after_stored(
        self: Arc<Self>,
        sealed: Arc<SealedSegment>,
        header: Bytes,
        object_bytes: u64,
        permit: tokio::sync::OwnedSemaphorePermit,
        ckpt: Option<CheckpointJob>,
    ) {
        if sealed.gc_copies > 0 {
            crash_point("gc.after_copy_put");
        }
        self.segments_uploaded.fetch_add(1, Ordering::Relaxed);
        self.bytes_uploaded
            .fetch_add(object_bytes, Ordering::Relaxed);
        let seq = sealed.seq;
        let (data, on_done) = self.cache_uploaded(&sealed, &header);
        self.mark_uploaded(seq, object_bytes, sealed.data.len() as u64);
        self.caches
            .insert_written(&self.uuid, seq, data, on_done)
            .await;
        drop(permit);
        // Last holder of the buffer (the common case, unless the disk
        // cache's writer still has it): recycle it.
        if let Some(buffer) = Arc::into_inner(sealed).and_then(|s| Arc::into_inner(s.data)) {
            self.recycle_buffer(buffer);
        }
        if let Some(ckpt) = ckpt {
            self.store_checkpoint(ckpt).await;
        }
    }

    /// Keeps a segment now in the store readable from local disk: its index
    /// goes to the RAM index cache (no header GETs to read it back) and its
    /// data to the disk cache (written after the upload, never before: a
    /// segment lost to a crash before its upload may be written again
    /// under its sequence number with other data). Returns the data for the
    /// disk cache's writer and what it runs when done with it (recycles the
    /// buffer if it lets go of it last).
    fn cache_uploaded(
        self: &Arc<Self>,
        sealed: &Arc<SealedSegment>,
        header: &[u8],
    ) -> (Bytes, OnDone) {
        let key = self.at_rest.data_key().map(|k| &**k);
        if let Some(idx) = decode_index(header, MAX_VOLUME_BYTES, key) {
            self.caches
                .insert_index(self.uuid, sealed.seq, Arc::new(idx));
        }
        let data = sealed.data.clone();
        let seq = sealed.seq;
        if self.caches.disk_enabled() {
            // Readable from memory until its blocks are on disk: between
            // the upload (which ends `sealed`) and the writer's turn, a read
            // would otherwise GET what this host just wrote.
            self.state.lock().settling.insert(seq, data.clone());
        }
        let volume = Arc::downgrade(self);
        let on_done = Box::new(move || {
            let Some(volume) = volume.upgrade() else {
                return;
            };
            volume.state.lock().settling.remove(&seq);
            if let Some(buffer) = Arc::into_inner(data) {
                volume.recycle_buffer(buffer);
            }
        });
        (sealed.data_bytes(), on_done)
    }

    /// Records an upload; advances `durable_seq` over contiguous uploads,
    /// frees their memory and journal space.
    fn mark_uploaded(&self, seq: u64, object_bytes: u64, data_bytes: u64) {
        let release_lpos = self
            .state
            .lock()
            .mark_uploaded(seq, object_bytes, data_bytes);
        if let Some(lpos) = release_lpos {
            self.journal.release_to(lpos);
        }
        self.remove_durable_staging_names();
        self.space.notify_waiters();
        self.progress.notify_waiters();
        self.wake_quiet_gc();
    }
}

/// The index of a segment header this server just encoded (decoded as a
/// reader would, so what the cache holds is what a GET would give).
fn decode_index(
    header: &[u8],
    volume_size_bytes: u64,
    data_key: Option<&Key>,
) -> Option<SegmentIndex> {
    let fixed = FixedHeader::decode(header).ok()?;
    let tables = header.get(FIXED_HEADER_BYTES..fixed.header_bytes as usize)?;
    SegmentIndex::decode_tables(fixed, tables, volume_size_bytes, data_key.map(Key::bytes))
        .ok()
        .map(|(idx, _)| idx)
}
