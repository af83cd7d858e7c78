//! Checkpoints of a volume: the extent map as of a seal point, stored once
//! every segment up to it is, then named in the manifest. The same
//! manifest write lists what the checkpoint leaves unreferenced (stored
//! segments with no live bytes, and the checkpoint it replaces) as pending
//! deletions (`gc/pending_deletions.rs`); nothing is deleted here.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use bytes::Bytes;

use super::{CheckpointJob, MapEdit, Volume};
use crate::clock::now_ms;
use crate::crash_point::crash_point;
use crate::format::checkpoint::{self, CheckpointInfo};
use crate::format::manifest::Manifest;
use crate::format::sealed_object::SealedKind;
use crate::format::segment::JournalSpan;
use crate::gc::{add_pending, deletion_candidates, Unreferenced};
use crate::write::state::State;

impl Volume {
    /// The checkpoint of the map as it is now, at seal point `seq`, and
    /// what it leaves unreferenced.
    pub(crate) fn encode_checkpoint(
        &self,
        st: &State,
        seq: u64,
        span: JournalSpan,
    ) -> CheckpointJob {
        self.encode_checkpoint_sized(st, seq, span, self.size_bytes())
    }

    /// `encode_checkpoint` recording a volume size of `size_bytes` (a
    /// resize's checkpoint records the size it makes).
    fn encode_checkpoint_sized(
        &self,
        st: &State,
        seq: u64,
        span: JournalSpan,
        size_bytes: u64,
    ) -> CheckpointJob {
        let info = CheckpointInfo {
            seq,
            volume_uuid: self.uuid,
            span,
            volume_size_bytes: size_bytes,
        };
        CheckpointJob {
            seq,
            bytes: Bytes::from(checkpoint::encode(&info, &st.map)),
            unreferenced: deletion_candidates(&st.stored, st.map.usage(), &st.pins, seq),
        }
    }

    /// Takes a checkpoint now: seals what is open (with a checkpoint), or
    /// checkpoints the last sealed segment if none covers it yet. Returns
    /// the checkpoint's seq, if one was started.
    pub(crate) fn checkpoint_locked(self: &Arc<Self>, st: &mut State) -> Option<u64> {
        if st.failed.is_some() {
            return None;
        }
        if !st.open.is_empty() {
            self.seal_locked(st, true);
            return Some(st.checkpoint_requested_seq);
        }
        if st.segments_since_checkpoint == 0 {
            return None;
        }
        let seq = st.open.seq - 1;
        st.segments_since_checkpoint = 0;
        st.checkpoint_requested_seq = seq;
        let job = self.encode_checkpoint(st, seq, st.last_sealed_span);
        self.spawn_tracked(|vol| async move { vol.store_checkpoint(job).await });
        Some(seq)
    }

    /// Seals the open segment, even an empty one, and encodes the
    /// checkpoint of that seal point, recording volume size `size_bytes`,
    /// for the caller to store (with what it adds to the manifest); `edit`
    /// first changes the map (a rollback replaces it, a shrink cuts it).
    /// Snapshots, rollbacks and resizes need a seal point of their own; so
    /// does garbage that appears with no new segment (a snapshot deleted).
    pub(crate) fn seal_for_history_locked(
        self: &Arc<Self>,
        st: &mut State,
        edit: Option<MapEdit>,
        size_bytes: u64,
    ) -> CheckpointJob {
        let sealed = st.seal_open(self.take_buffer());
        if let Some(edit) = edit {
            edit(&mut st.map);
        }
        st.segments_since_checkpoint = 0;
        st.checkpoint_requested_seq = sealed.seq;
        let job = self.encode_checkpoint_sized(st, sealed.seq, sealed.span, size_bytes);
        self.spawn_tracked(|vol| async move { vol.upload(sealed, None).await });
        job
    }

    pub(crate) async fn store_checkpoint(&self, job: CheckpointJob) {
        let _ = self.store_checkpoint_with(job, None).await;
    }

    /// Stores checkpoint `job` once every segment up to it is stored, then
    /// names it in the manifest with `extra` applied in the same
    /// conditional write (a snapshot, a rollback: they happen exactly when
    /// the checkpoint is named). Errors are logged and returned.
    pub(crate) async fn store_checkpoint_with(
        &self,
        job: CheckpointJob,
        extra: Option<&(dyn Fn(&mut Manifest) + Send + Sync)>,
    ) -> Result<(), String> {
        let seq = job.seq;
        // The checkpoint may only name segments that are all stored.
        self.wait_until(|st| st.durable_seq >= seq || st.failed.is_some())
            .await;
        if let Some(detail) = &self.state.lock().failed {
            return Err(detail.clone());
        }
        let path = self.names.checkpoint(seq);
        let kind = (SealedKind::Checkpoint, seq);
        if let Err(e) = self.put_map_object(&path, job.bytes.clone(), kind).await {
            tracing::error!(volume = %self.name, object = %path, error = %e, "checkpoint not stored");
            return Err(format!("checkpoint {seq}: {e}"));
        }
        let named = self
            .write_manifest_checkpoint(seq, &job.unreferenced, extra)
            .await;
        let written = match named {
            Ok(written) => written,
            Err(detail) => {
                tracing::error!(volume = %self.name, object = %self.names.manifest(), checkpoint = seq, %detail, "manifest not updated");
                return Err(format!("manifest not updated: {detail}"));
            }
        };
        if !job.unreferenced.segments.is_empty() {
            crash_point("gc.after_checkpoint");
            // Dead for good (the map never points back into a segment), so
            // nothing cached of them will be read again.
            self.caches
                .forget_segments(&self.uuid, &job.unreferenced.segments);
        }
        {
            let mut st = self.state.lock();
            st.checkpoint_done_seq = st.checkpoint_done_seq.max(seq);
        }
        self.progress.notify_waiters();
        if !written {
            // A newer checkpoint is named already (nothing to do for a
            // plain one); what `extra` adds was not written.
            return Err(format!("a checkpoint at or after {seq} is named already"));
        }
        Ok(())
    }

    /// Names checkpoint `seq` in the manifest (If-Match on the version we
    /// wrote), applies `extra`, and lists what it leaves unreferenced, with
    /// the checkpoint it replaces, as pending deletions. False if a newer
    /// checkpoint is named already (nothing written). A newer epoch in the store means we
    /// were taken over: the volume is fenced.
    async fn write_manifest_checkpoint(
        &self,
        seq: u64,
        unreferenced: &Unreferenced,
        extra: Option<&(dyn Fn(&mut Manifest) + Send + Sync)>,
    ) -> Result<bool, String> {
        let now = now_ms();
        let change = |m: &Manifest| {
            if m.checkpoint_seq.is_some_and(|p| p >= seq) {
                // A newer checkpoint was named first (its writes raced
                // ours to the store): `extra` still goes in, naming this
                // checkpoint's object (a snapshot keeps it from GC).
                let mut next = m.clone();
                extra?(&mut next);
                return Some(next);
            }
            let mut next = Manifest {
                checkpoint_seq: Some(seq),
                ..m.clone()
            };
            // A close handing the volume over names its final checkpoint
            // and the successor's epoch in one write (`close.rs`).
            let successor_epoch = self.successor_epoch.load(Ordering::Acquire);
            if successor_epoch > next.epoch {
                next.epoch = successor_epoch;
            }
            if let Some(extra) = extra {
                extra(&mut next);
            }
            add_pending(&mut next, unreferenced, m.checkpoint_seq, now);
            Some(next)
        };
        let update = self.manifest.update(&self.store, &self.ownership, change);
        match update.await {
            Ok(written) => Ok(written.is_some()),
            Err(refused) => Err(self.refused(refused)),
        }
    }
}
