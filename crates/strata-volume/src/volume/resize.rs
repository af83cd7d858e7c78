//! Resizing a volume, served or not: one seal point whose checkpoint
//! records the new size, named in the manifest write that changes the
//! size, so after a crash the volume has the old size or the new one.
//!
//! Writes wait from the start of a resize until the new size is named (a
//! write acknowledged in between would be checked against a size the store
//! does not have yet). Growing: new connections see the new size. Shrinking
//! (only when asked for) unmaps the cut range at the seal point, so its
//! space is garbage for the next GC pass; clients already connected get
//! errors for offsets past the new end.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::{MapEdit, Volume};
use crate::config::check_volume_size;
use crate::crash_point::crash_point;
use crate::error::VolumeError;
use crate::format::manifest::Manifest;
use crate::map::ExtentMap;

impl Volume {
    /// Makes the volume `new_size` bytes; shrinking needs `allow_shrink`.
    /// Returns the old size.
    pub async fn resize(
        self: &Arc<Self>,
        new_size: u64,
        allow_shrink: bool,
    ) -> Result<u64, VolumeError> {
        check_volume_size(new_size).map_err(VolumeError::Invalid)?;
        self.check_failed()?;
        let _pass = self.gc_pass.lock().await;
        let old = self.size_bytes();
        if new_size == old {
            return Ok(old);
        }
        if new_size < old && !allow_shrink {
            return Err(VolumeError::Invalid(format!(
                "shrinking volume {:?} from {old} to {new_size} bytes drops everything past {new_size}; add --allow-shrink to do that",
                self.name
            )));
        }
        self.state.lock().resizing = true;
        let result = self.resize_paused(old, new_size).await;
        self.state.lock().resizing = false;
        self.space.notify_waiters();
        result?;
        tracing::info!(volume = %self.name, old_bytes = old, new_bytes = new_size, "resized");
        Ok(old)
    }

    async fn resize_paused(self: &Arc<Self>, old: u64, new: u64) -> Result<(), VolumeError> {
        let job = {
            let mut st = self.state.lock();
            if let Some(detail) = &st.failed {
                return Err(VolumeError::Failed {
                    name: self.name.clone(),
                    detail: detail.clone(),
                });
            }
            let state = &mut *st;
            if let (Some(c), true) = (&mut state.changed, new < old) {
                c.mark(&state.map, new, old - new, false);
            }
            let cut: Option<MapEdit> = (new < old)
                .then(|| Box::new(move |m: &mut ExtentMap| m.set(new, old - new, None)) as MapEdit);
            self.seal_for_history_locked(&mut st, cut, new)
        };
        let seq = job.seq;
        let set_size = move |m: &mut Manifest| {
            crash_point("resize.before_manifest");
            m.size_bytes = new;
        };
        let stored = self.store_checkpoint_with(job, Some(&set_size)).await;
        let named = self.manifest.current().await.checkpoint_seq == Some(seq);
        let detail = match stored {
            Ok(()) if named => None,
            Ok(()) => Some("a newer checkpoint was named first".to_string()),
            Err(detail) => Some(detail),
        };
        if let Some(detail) = detail {
            // The store still has the old size; so must the volume.
            let detail = format!("resize to {new} bytes not done: {detail}");
            self.state.lock().failed.get_or_insert(detail.clone());
            return Err(VolumeError::NotDone {
                name: self.name.clone(),
                detail,
            });
        }
        {
            let _st = self.state.lock();
            self.size_bytes.store(new, Ordering::Release);
        }
        self.size_watch.send_replace(new);
        crash_point("resize.after_manifest");
        Ok(())
    }
}
