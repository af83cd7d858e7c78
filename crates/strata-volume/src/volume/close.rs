//! The clean close of a volume: seal what is open, wait for every upload
//! and a final checkpoint, stop the journal, release the lease (or hand
//! it to a standby's host). Afterwards the store alone holds the volume;
//! the journal has nothing to replay.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use super::Volume;
use crate::crash_point::crash_point;
use crate::error::VolumeError;
use crate::format::manifest::Manifest;
use crate::ownership::Successor;
use crate::write::state::State;

impl Volume {
    /// Clean close: seals what is open, waits for every upload and a final
    /// checkpoint, stops the journal. Afterwards the store alone holds the
    /// volume; the journal has nothing to replay.
    pub async fn close(self: &Arc<Self>) -> Result<(), VolumeError> {
        self.close_handing_to(None).await.map(|_| ())
    }

    /// `close`, handing the lease to `to` (a standby's host) instead of
    /// releasing it: the final checkpoint's manifest write carries the
    /// successor's epoch, then the lease names it (`lease_transfer.rs`).
    /// True if the lease went to `to`; false if it was released or was
    /// not ours any more. With `to`, the caller runs `finish_close` after.
    pub async fn close_handing_to(
        self: &Arc<Self>,
        to: Option<&Successor>,
    ) -> Result<bool, VolumeError> {
        if self.closed.swap(true, Ordering::AcqRel) {
            return Ok(false);
        }
        self.standby_watch.lock().take();
        let successor_epoch = self.ownership.epoch + 1;
        if to.is_some() {
            self.successor_epoch
                .store(successor_epoch, Ordering::Release);
        }
        let started = std::time::Instant::now();
        self.store_profile_at_close().await;
        // A garbage collection pass in flight ends first (it stops at its
        // next step): nothing is deleted once the lease may be released.
        let _gc = self.gc_pass.lock().await;
        let target = {
            let mut st = self.state.lock();
            self.checkpoint_locked(&mut st);
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
        let stored_ms = started.elapsed().as_millis() as u64;
        // Everything stored: nothing in the journal is needed any more (a
        // failed close keeps it, synced, for the restart to replay).
        let all_stored = self.state.lock().failed.is_none();
        self.journal.stop(!all_stored);
        self.space.notify_waiters();
        // Housekeeping sees the volume closed and ends.
        self.housekeeping.notify_one();
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
        let transferred = match to {
            Some(to) => self.transfer_lease(to, successor_epoch).await?,
            None => {
                self.wait_for_tasks().await;
                self.punch_journal();
                // Let another server take the volume.
                self.ownership.release(&self.store, &self.names).await?;
                false
            }
        };
        self.closed_cleanly.store(true, Ordering::Release);
        tracing::info!(volume = %self.name, transferred, stored_ms, elapsed_ms = started.elapsed().as_millis() as u64, "closed cleanly");
        Ok(transferred)
    }

    /// The last steps of a close that hands the volume over: the manifest
    /// at the successor's epoch (the final checkpoint's write carried it,
    /// unless no checkpoint was needed), then the lease naming it. The
    /// tasks that outlive their store work (handing data to the disk
    /// cache) are left to `finish_close`, which the caller runs after
    /// answering: the successor does not wait for them.
    async fn transfer_lease(&self, to: &Successor, epoch: u64) -> Result<bool, VolumeError> {
        let bump = |m: &Manifest| (m.epoch < epoch).then(|| Manifest { epoch, ..m.clone() });
        if let Err(refused) = self
            .manifest
            .update(&self.store, &self.ownership, bump)
            .await
        {
            let detail = self.refused(refused);
            self.ownership.drop_local_lock();
            return Err(VolumeError::Failed {
                name: self.name.clone(),
                detail,
            });
        }
        crash_point("handover.after_manifest");
        let transferred = self
            .ownership
            .transfer(&self.store, &self.names, to, epoch)
            .await?;
        crash_point("handover.after_lease");
        Ok(transferred)
    }

    /// What a close that handed the volume over left to do here (local
    /// only): the tasks handing data to the disk cache end, the journal's
    /// space goes back. `Engine::hand_over_to` runs it after answering,
    /// and a new open of the volume on this engine waits for it.
    pub(crate) async fn finish_close(&self) {
        self.wait_for_tasks().await;
        self.punch_journal();
    }

    /// Everything is in the store: the journal's space goes back to the
    /// filesystem (a closed volume's journal is its 4 KiB superblock).
    fn punch_journal(&self) {
        self.journal.punch_if_idle(0);
    }

    /// Waits (bounded) for upload and checkpoint tasks still holding the
    /// volume after their work is done (handing data to the disk cache).
    async fn wait_for_tasks(&self) {
        let idle = async {
            loop {
                let progress = self.progress.notified();
                if self.tasks_in_flight.load(Ordering::Acquire) == 0 {
                    return;
                }
                progress.await;
            }
        };
        if tokio::time::timeout(TASKS_TIMEOUT, idle).await.is_err() {
            let tasks = self.tasks_in_flight.load(Ordering::Acquire);
            tracing::warn!(volume = %self.name, tasks, "closing with upload tasks still running");
        }
    }
}

/// How long a close waits for tasks that finished their store work.
const TASKS_TIMEOUT: Duration = Duration::from_secs(30);
