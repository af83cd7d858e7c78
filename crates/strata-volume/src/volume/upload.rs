//! A sealed segment's way into the store: upload (parallel, bounded by
//! `--parallel-uploads`, retried until it works or the volume is fenced),
//! then durable once every earlier segment is, which frees its memory and
//! journal space; then the checkpoint taken when it was sealed, if any.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use bytes::Bytes;

use super::{CheckpointJob, Volume};
use crate::crash_point::crash_point;
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
        let header = Bytes::from(sealed.encode_header(&self.uuid));
        let object_bytes = header.len() as u64 + sealed.data.len() as u64;
        let path = self.names.segment(sealed.seq);
        {
            let Ok(_permit) = self.upload_slots.clone().acquire_owned().await else {
                return;
            };
            let data = sealed.data_bytes();
            let put = put_segment(
                &self.store,
                &self.ownership,
                &self.name,
                &path,
                &header,
                &data,
            );
            if let Err(refused) = put.await {
                let detail = self.refused(refused);
                tracing::error!(volume = %self.name, object = %path, %detail, "segment not uploaded");
                return;
            }
        }
        if sealed.gc_copies > 0 {
            crash_point("gc.after_copy_put");
        }
        self.segments_uploaded.fetch_add(1, Ordering::Relaxed);
        self.bytes_uploaded
            .fetch_add(object_bytes, Ordering::Relaxed);
        let seq = sealed.seq;
        self.mark_uploaded(seq, object_bytes);
        // Last holder of the buffer (the common case): recycle it.
        if let Some(buffer) = Arc::into_inner(sealed).and_then(|s| Arc::into_inner(s.data)) {
            self.recycle_buffer(buffer);
        }
        if let Some(ckpt) = ckpt {
            self.store_checkpoint(ckpt).await;
        }
    }

    /// Records an upload; advances `durable_seq` over contiguous uploads,
    /// frees their memory and journal space.
    fn mark_uploaded(&self, seq: u64, object_bytes: u64) {
        let release_lpos = self.state.lock().mark_uploaded(seq, object_bytes);
        if let Some(lpos) = release_lpos {
            self.journal.release_to(lpos);
        }
        self.space.notify_waiters();
        self.progress.notify_waiters();
    }
}
