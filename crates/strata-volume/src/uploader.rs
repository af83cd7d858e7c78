//! Getting sealed segments and checkpoints into the store.
//!
//! Owns the life of a sealed segment after the write path hands it over:
//! upload (parallel, bounded by a semaphore, retried with backoff), marking
//! it durable once every earlier segment is too, releasing its journal
//! space, and writing checkpoints and the manifest. Also the clean close.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use object_store::{PutMode, PutOptions, PutPayload};

use crate::checkpoint::{self, CheckpointInfo};
use crate::error::VolumeError;
use crate::segment::{JournalSpan, SealedSegment};
use crate::volume::{State, Volume};

const RETRY_MIN_MS: u64 = 100;
const RETRY_MAX_MS: u64 = 5_000;

impl Volume {
    pub(crate) fn encode_checkpoint(&self, st: &State, seq: u64, span: JournalSpan) -> Vec<u8> {
        let info = CheckpointInfo {
            seq,
            volume_uuid: self.uuid,
            span,
            volume_size_bytes: self.size_bytes,
        };
        checkpoint::encode(&info, &st.map)
    }

    /// Uploads one sealed segment, then (if given) the checkpoint taken when
    /// it was sealed.
    pub(crate) async fn upload(self: Arc<Self>, sealed: Arc<SealedSegment>, ckpt: Option<Vec<u8>>) {
        let header = Bytes::from(sealed.encode_header(&self.uuid));
        let object_bytes = header.len() as u64 + sealed.data.len() as u64;
        let path = self.names.segment(sealed.seq);
        {
            let Ok(_permit) = self.upload_slots.clone().acquire_owned().await else {
                return;
            };
            let data = sealed.data_bytes();
            let payload = || PutPayload::from_iter([header.clone(), data.clone()]);
            self.put_with_retry(&path, payload, PutMode::Overwrite)
                .await;
        }
        self.segments_uploaded.fetch_add(1, Ordering::Relaxed);
        self.bytes_uploaded
            .fetch_add(object_bytes, Ordering::Relaxed);
        let seq = sealed.seq;
        self.mark_uploaded(seq);
        // Last holder of the buffer (the common case): recycle it.
        if let Some(buffer) = Arc::into_inner(sealed).and_then(|s| Arc::into_inner(s.data)) {
            self.recycle_buffer(buffer);
        }
        if let Some(ckpt) = ckpt {
            self.store_checkpoint(seq, Bytes::from(ckpt)).await;
        }
    }

    /// PUTs until it works: a store outage back-pressures writers rather than
    /// losing data (the journal still holds everything).
    async fn put_with_retry(
        &self,
        path: &object_store::path::Path,
        payload: impl Fn() -> PutPayload,
        mode: PutMode,
    ) {
        let mut delay_ms = RETRY_MIN_MS;
        loop {
            let opts = PutOptions {
                mode: mode.clone(),
                ..PutOptions::default()
            };
            let put = self.store.put_opts(path, payload(), opts).await;
            let result = match put {
                Ok(_) => self
                    .store
                    .make_durable(path)
                    .await
                    .map_err(|e| e.to_string()),
                Err(e) => Err(e.to_string()),
            };
            match result {
                Ok(()) => return,
                Err(e) => {
                    tracing::warn!(volume = %self.name, object = %path, error = %e, retry_in_ms = delay_ms, "store write failed; retrying");
                    tokio::time::sleep(Duration::from_millis(delay_ms)).await;
                    delay_ms = (delay_ms * 2).min(RETRY_MAX_MS);
                }
            }
        }
    }

    /// Records an upload; advances `durable_seq` over contiguous uploads,
    /// frees their memory and journal space.
    fn mark_uploaded(&self, seq: u64) {
        let mut st = self.state.lock();
        st.uploaded.insert(seq);
        let mut release_lpos = None;
        loop {
            let next = st.durable_seq + 1;
            if !st.uploaded.remove(&next) {
                break;
            }
            st.durable_seq += 1;
            let durable = st.durable_seq;
            if let Some(s) = st.sealed.remove(&durable) {
                st.buffered_cost_bytes -= s.cost_bytes;
                release_lpos = Some(s.span.end_lpos);
            }
        }
        drop(st);
        if let Some(lpos) = release_lpos {
            self.journal.release_to(lpos);
        }
        self.space.notify_waiters();
        self.progress.notify_waiters();
    }

    async fn wait_until(&self, pred: impl Fn(&State) -> bool) {
        loop {
            let notified = self.progress.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if pred(&self.state.lock()) {
                return;
            }
            notified.await;
        }
    }

    async fn store_checkpoint(&self, seq: u64, ckpt: Bytes) {
        // The checkpoint may only name segments that are all stored.
        self.wait_until(|st| st.durable_seq >= seq).await;
        let path = self.names.checkpoint(seq);
        self.put_with_retry(&path, || PutPayload::from(ckpt.clone()), PutMode::Overwrite)
            .await;
        let previous = {
            let mut manifest = self.manifest.lock().await;
            let previous = manifest.checkpoint_seq;
            if previous.is_some_and(|p| p >= seq) {
                None
            } else {
                manifest.checkpoint_seq = Some(seq);
                let body = Bytes::from(manifest.encode());
                let mpath = self.names.manifest();
                self.put_with_retry(
                    &mpath,
                    || PutPayload::from(body.clone()),
                    PutMode::Overwrite,
                )
                .await;
                previous
            }
        };
        if let Some(old) = previous {
            if let Err(e) = self.store.delete(&self.names.checkpoint(old)).await {
                tracing::warn!(volume = %self.name, error = %e, "could not delete old checkpoint {old}");
            }
        }
        {
            let mut st = self.state.lock();
            st.checkpoint_done_seq = st.checkpoint_done_seq.max(seq);
        }
        self.progress.notify_waiters();
    }

    /// Clean close: seals what is open, waits for every upload and a final
    /// checkpoint, stops the journal. Afterwards the store alone holds the
    /// volume; the journal has nothing to replay.
    pub async fn close(self: &Arc<Self>) -> Result<(), VolumeError> {
        if self.closed.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        let target = {
            let mut st = self.state.lock();
            if st.failed.is_none() {
                if !st.open.is_empty() {
                    self.seal_locked(&mut st, true);
                } else if st.segments_since_checkpoint > 0 {
                    // Nothing open: the map is exactly the state after the
                    // newest sealed segment, so checkpoint that.
                    let seq = st.open.seq - 1;
                    st.segments_since_checkpoint = 0;
                    st.checkpoint_requested_seq = seq;
                    let ckpt = Bytes::from(self.encode_checkpoint(&st, seq, st.last_sealed_span));
                    let vol = self.clone();
                    tokio::spawn(async move { vol.store_checkpoint(seq, ckpt).await });
                }
            }
            st.checkpoint_requested_seq
        };
        let done = |st: &State| st.sealed.is_empty() && st.checkpoint_done_seq >= target;
        loop {
            let wait = self.wait_until(done);
            match tokio::time::timeout(Duration::from_secs(5), wait).await {
                Ok(()) => break,
                Err(_) => {
                    let (segments, bytes) = {
                        let st = self.state.lock();
                        (st.sealed.len(), st.buffered_cost_bytes)
                    };
                    tracing::info!(volume = %self.name, segments, bytes, "closing: waiting for uploads to the store (the journal keeps the data if you kill the server)");
                }
            }
        }
        self.journal.shutdown();
        self.space.notify_waiters();
        // Everything is in the store: let another server take the volume.
        let released = crate::lease::release(&self.store, &self.names, &self.holder).await;
        self.local_lock.lock().take();
        released?;
        tracing::info!(volume = %self.name, "closed cleanly");
        Ok(())
    }
}
