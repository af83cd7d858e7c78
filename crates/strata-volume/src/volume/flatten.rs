//! Flattening a clone: copying what it still reads from its ancestors into
//! segments of its own, then dropping the parent link, so the parent's
//! snapshot may be deleted.
//!
//! The copies go through the garbage collector's rule (`gc/read_rewrite.rs`):
//! appended to the open segment, each only where the map still points at
//! the ancestor's bytes it was read from, so a client writing meanwhile
//! wins. Once no extent points into an ancestor, one seal point is named
//! in the manifest write that drops `parent`; after a crash the volume is
//! still a clone (copies made so far are kept) or is flat. Refused while a
//! snapshot of the clone still reads from the ancestors (it cannot be
//! rewritten; delete it first).

use std::sync::Arc;
use std::time::Duration;

use strata_store::ObjectNames;

use super::Volume;
use crate::crash_point::crash_point;
use crate::error::VolumeError;
use crate::format::manifest::{Manifest, ParentRecord};
use crate::gc::{repoint_read, rewrite_cost_bytes, ReadPiece};
use crate::map::Target;
use crate::objects::store_for_prefix;
use crate::read::stored_pieces_in;

/// Bytes of the volume copied per step.
const WINDOW_BYTES: u64 = 4 << 20;
/// Passes over the volume before giving up on writers that keep racing.
const MAX_PASSES: u32 = 8;

impl Volume {
    /// Makes a clone independent of its parent. Returns the bytes copied.
    pub async fn flatten(self: &Arc<Self>) -> Result<u64, VolumeError> {
        self.check_failed()?;
        let _pass = self.gc_pass.lock().await;
        let current = self.manifest.current().await;
        let Some(parent) = current.parent.clone() else {
            return Err(VolumeError::Invalid(format!(
                "volume {:?} is not a clone: nothing to flatten",
                self.name
            )));
        };
        let base = self.lineage.base_seq();
        self.refuse_if_snapshots_read_ancestors(&current, base)
            .await?;
        let mut copied = 0u64;
        for _ in 0..MAX_PASSES {
            for start in (0..self.size_bytes()).step_by(WINDOW_BYTES as usize) {
                copied += self.flatten_window(start, base).await?;
            }
            if self.inherited_bytes(base) == 0 {
                return self.drop_parent(&parent).await.map(|()| copied);
            }
        }
        Err(VolumeError::NotDone {
            name: self.name.clone(),
            detail: format!("flatten did not finish in {MAX_PASSES} passes (writes kept racing the copies); run it again"),
        })
    }

    /// Bytes the map still points at in ancestors' segments.
    fn inherited_bytes(&self, base: u64) -> u64 {
        let st = self.state.lock();
        st.map
            .usage()
            .iter()
            .filter(|(seq, _)| *seq <= base)
            .map(|(_, b)| b)
            .sum()
    }

    /// Copies the inherited pieces of `[start, start + WINDOW_BYTES)`.
    async fn flatten_window(self: &Arc<Self>, start: u64, base: u64) -> Result<u64, VolumeError> {
        let len = WINDOW_BYTES.min(self.size_bytes() - start);
        let mut pieces = Vec::new();
        self.state.lock().map.lookup(start, len, |p| {
            if let Some(Target::Data { seq, offset }) = p.target {
                if seq <= base {
                    pieces.push(ReadPiece {
                        volume_offset: p.start,
                        seq,
                        segment_offset: offset,
                        len: p.len,
                        buf_offset: (p.start - start) as usize,
                    });
                }
            }
        });
        if pieces.is_empty() {
            return Ok(0);
        }
        let mut buf = vec![0u8; len as usize];
        let stored = stored_pieces_in(
            &mut buf,
            pieces
                .iter()
                .map(|p| (p.buf_offset, p.len as usize, p.seq, p.segment_offset)),
        );
        let reader = self.reader();
        self.lineage
            .read_pieces(&self.caches, &reader, stored)
            .await?;
        self.wait_for_room(rewrite_cost_bytes(&pieces)).await?;
        let mut st = self.state.lock();
        let outcome = repoint_read(&mut st, &pieces, &buf);
        if st.open.cost_bytes >= self.config.segment_bytes {
            self.seal_locked(&mut st, false);
        }
        Ok(outcome.copied_bytes)
    }

    /// Waits until the write buffer has `bytes` of room.
    async fn wait_for_room(&self, bytes: u64) -> Result<(), VolumeError> {
        loop {
            let notified = self.space.notified();
            {
                let st = self.state.lock();
                if let Some(detail) = &st.failed {
                    return Err(VolumeError::Failed {
                        name: self.name.clone(),
                        detail: detail.clone(),
                    });
                }
                if st.buffered_cost_bytes + bytes <= self.config.write_buffer_bytes {
                    return Ok(());
                }
            }
            let _ = tokio::time::timeout(Duration::from_millis(100), notified).await;
        }
    }

    async fn refuse_if_snapshots_read_ancestors(
        &self,
        m: &Manifest,
        base: u64,
    ) -> Result<(), VolumeError> {
        let mut reading = Vec::new();
        for s in &m.snapshots {
            let map = self.snapshot_map(s).await?;
            if map.usage().iter().any(|(seq, _)| seq <= base) {
                reading.push(s.name.as_str());
            }
        }
        if reading.is_empty() {
            return Ok(());
        }
        Err(VolumeError::Busy(format!(
            "snapshots of {:?} read from its parent ({}): delete them first, or keep the clone",
            self.name,
            reading.join(", ")
        )))
    }

    /// Names a seal point whose map has nothing inherited, dropping the
    /// parent in the same manifest write; then the marker under the parent.
    async fn drop_parent(self: &Arc<Self>, parent: &ParentRecord) -> Result<(), VolumeError> {
        let job = {
            let mut st = self.state.lock();
            let size = self.size_bytes();
            self.seal_for_history_locked(&mut st, None, size)
        };
        let seq = job.seq;
        let drop_link = |m: &mut Manifest| {
            crash_point("flatten.before_manifest");
            m.parent = None;
        };
        let stored = self.store_checkpoint_with(job, Some(&drop_link)).await;
        let named = self.manifest.current().await.checkpoint_seq == Some(seq);
        match stored {
            Ok(()) if named => {}
            Ok(()) => {
                return Err(VolumeError::NotDone {
                    name: self.name.clone(),
                    detail: "flatten not done: a newer checkpoint was named first; run it again"
                        .into(),
                })
            }
            Err(detail) => {
                return Err(VolumeError::NotDone {
                    name: self.name.clone(),
                    detail: format!("flatten not done: {detail}"),
                })
            }
        }
        crash_point("flatten.after_manifest");
        let marker = ObjectNames::new(&parent.volume).clone_marker(&parent.snapshot, &self.name);
        let pstore = store_for_prefix(&self.store, parent.prefix.as_deref())?;
        match pstore.delete(&marker).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
            Err(e) => {
                tracing::warn!(volume = %self.name, marker = %marker, error = %strata_store::ErrorText(&e), "flattened, but the marker under the parent stays; deleting the parent's snapshot removes it")
            }
        }
        tracing::info!(volume = %self.name, parent = %parent.volume, snapshot = %parent.snapshot, "flattened: no longer a clone");
        Ok(())
    }
}
