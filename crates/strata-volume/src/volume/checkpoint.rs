//! Checkpoints of a volume: the extent map as of a seal point, stored once
//! every segment up to it is, then named in the manifest; the checkpoint it
//! replaces is deleted.

use bytes::Bytes;
use object_store::{PutMode, PutPayload};

use super::Volume;
use crate::format::checkpoint::{self, CheckpointInfo};
use crate::format::manifest::Manifest;
use crate::format::segment::JournalSpan;
use crate::write::segment_put::put_with_retry;
use crate::write::state::State;

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

    pub(crate) async fn store_checkpoint(&self, seq: u64, ckpt: Bytes) {
        // The checkpoint may only name segments that are all stored.
        self.wait_until(|st| st.durable_seq >= seq || st.failed.is_some())
            .await;
        let path = self.names.checkpoint(seq);
        let payload = || PutPayload::from(ckpt.clone());
        let put = put_with_retry(
            &self.store,
            &self.ownership,
            &self.name,
            &path,
            &payload,
            PutMode::Overwrite,
        );
        if let Err(e) = put.await {
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

    /// Names checkpoint `seq` in the manifest (If-Match on the version we
    /// wrote); returns the checkpoint it replaced. A newer epoch in the
    /// store means we were taken over: the volume is fenced.
    async fn write_manifest_checkpoint(&self, seq: u64) -> Result<Option<u64>, String> {
        let change = |m: &Manifest| {
            if m.checkpoint_seq.is_some_and(|p| p >= seq) {
                return None;
            }
            Some(Manifest {
                checkpoint_seq: Some(seq),
                ..m.clone()
            })
        };
        let update = self.manifest.update(&self.store, &self.ownership, change);
        match update.await {
            Ok(previous) => Ok(previous.and_then(|m| m.checkpoint_seq)),
            Err(refused) => Err(self.refused(refused)),
        }
    }
}
