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

/// Why a store write gave up.
enum PutError {
    /// A conditional write found the object changed or present.
    Conflict(object_store::Error),
    /// The volume was fenced while waiting.
    Fenced(String),
}

impl std::fmt::Display for PutError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PutError::Conflict(e) => write!(f, "conflict: {e}"),
            PutError::Fenced(d) => f.write_str(d),
        }
    }
}
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
    /// it was sealed. Gives up only when the volume is fenced.
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
            let expected = || [header.clone(), data.clone()];
            if let Err(detail) = self.put_segment(&path, payload, expected).await {
                tracing::error!(volume = %self.name, object = %path, %detail, "segment not uploaded");
                return;
            }
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

    /// Writes a segment object with If-None-Match: segments are never
    /// overwritten, so a writer that lost its lease cannot clobber the new
    /// holder's. An existing object with our exact bytes is our own earlier
    /// attempt (a reply lost after the write landed).
    async fn put_segment(
        &self,
        path: &object_store::path::Path,
        payload: impl Fn() -> PutPayload,
        expected: impl Fn() -> [Bytes; 2],
    ) -> Result<(), String> {
        let written = self.put_with_retry(path, &payload, PutMode::Create).await;
        match written {
            Err(PutError::Conflict(_)) => {
                let [h, d] = expected();
                let same = self
                    .store
                    .get_range(path, 0..(h.len() + d.len()) as u64)
                    .await
                    .is_ok_and(|got| {
                        got.len() == h.len() + d.len()
                            && got[..h.len()] == h[..]
                            && got[h.len()..] == d[..]
                    });
                if same {
                    return Ok(());
                }
                let detail = format!(
                    "segment {path} already exists with other content: another server wrote it after taking the volume over"
                );
                self.fence(detail.clone());
                Err(detail)
            }
            Err(PutError::Fenced(d)) => Err(d),
            Ok(()) => Ok(()),
        }
    }

    /// PUTs until it works: a store outage back-pressures writers rather than
    /// losing data (the journal still holds everything). Each attempt waits
    /// for a valid lease; a conditional write's conflict is returned.
    async fn put_with_retry(
        &self,
        path: &object_store::path::Path,
        payload: &impl Fn() -> PutPayload,
        mode: PutMode,
    ) -> Result<(), PutError> {
        let mut delay_ms = RETRY_MIN_MS;
        loop {
            self.ownership
                .wait_valid()
                .await
                .map_err(PutError::Fenced)?;
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
                Err(
                    e @ (object_store::Error::AlreadyExists { .. }
                    | object_store::Error::Precondition { .. }),
                ) => return Err(PutError::Conflict(e)),
                Err(e) => Err(e.to_string()),
            };
            match result {
                Ok(()) => return Ok(()),
                Err(e) => {
                    tracing::warn!(volume = %self.name, object = %path, error = %e, retry_in_ms = delay_ms, "store write failed; retrying");
                    tokio::time::sleep(Duration::from_millis(delay_ms)).await;
                    delay_ms = (delay_ms * 2).min(RETRY_MAX_MS);
                }
            }
        }
    }

    /// Writes the manifest with `checkpoint_seq`, conditional on the version
    /// we last wrote; a newer epoch in the store means we were taken over.
    async fn write_manifest_checkpoint(&self, seq: u64) -> Result<Option<u64>, String> {
        let mut guard = self.manifest.lock().await;
        let (manifest, version) = &mut *guard;
        let previous = manifest.checkpoint_seq;
        if previous.is_some_and(|p| p >= seq) {
            return Ok(None);
        }
        let mpath = self.names.manifest();
        let mut delay_ms = RETRY_MIN_MS;
        loop {
            self.ownership.wait_valid().await?;
            let mut next = manifest.clone();
            next.checkpoint_seq = Some(seq);
            let payload = PutPayload::from(Bytes::from(next.encode()));
            match self.store.put_if(&mpath, payload, Some(version)).await {
                Ok(v) => {
                    *manifest = next;
                    *version = v;
                    if let Err(e) = self.store.make_durable(&mpath).await {
                        tracing::warn!(volume = %self.name, error = %e, "manifest sync failed");
                    }
                    return Ok(previous);
                }
                Err(object_store::Error::Precondition { .. }) => {
                    match crate::recovery::read_manifest_versioned(&self.store, &self.name).await {
                        Ok((m, v)) if m.epoch == manifest.epoch => {
                            // Our own write whose reply was lost, or a
                            // stale version: continue from what is there.
                            if m == next {
                                *manifest = m;
                                *version = v;
                                return Ok(previous);
                            }
                            *version = v;
                        }
                        Ok((m, _)) => {
                            let detail = format!(
                                "the manifest's epoch is {} (ours {}): another server opened the volume",
                                m.epoch, manifest.epoch
                            );
                            self.fence(detail.clone());
                            return Err(detail);
                        }
                        Err(e) => {
                            tracing::warn!(volume = %self.name, error = %e, "cannot re-read the manifest; retrying")
                        }
                    }
                }
                Err(e) => {
                    tracing::warn!(volume = %self.name, object = %mpath, error = %e, retry_in_ms = delay_ms, "manifest write failed; retrying");
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

    pub(crate) async fn wait_until(&self, pred: impl Fn(&State) -> bool) {
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
        self.wait_until(|st| st.durable_seq >= seq || st.failed.is_some())
            .await;
        let path = self.names.checkpoint(seq);
        let payload = || PutPayload::from(ckpt.clone());
        if let Err(e) = self
            .put_with_retry(&path, &payload, PutMode::Overwrite)
            .await
        {
            tracing::error!(volume = %self.name, seq, error = %e, "checkpoint not stored");
            return;
        }
        let previous = match self.write_manifest_checkpoint(seq).await {
            Ok(p) => p,
            Err(detail) => {
                tracing::error!(volume = %self.name, seq, %detail, "manifest not updated");
                return;
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
        let done = |st: &State| {
            (st.sealed.is_empty() && st.checkpoint_done_seq >= target) || st.failed.is_some()
        };
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
        if let Some(detail) = self.state.lock().failed.clone() {
            // Not everything reached the store; the journal keeps it, so the
            // lease is kept until it expires (unless fenced: then it is not
            // ours anyway). A restart on this data directory takes it back.
            self.ownership.drop_local_lock();
            return Err(VolumeError::Failed {
                name: self.name.clone(),
                detail,
            });
        }
        // Everything is in the store: let another server take the volume.
        self.ownership.release(&self.store, &self.names).await?;
        tracing::info!(volume = %self.name, "closed cleanly");
        Ok(())
    }
}
