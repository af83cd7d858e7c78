//! Standby mode: how a holder serves a volume while another host stands by
//! to take it (the destination of a live migration).
//!
//! The standby reads what the store holds (`standby/standby_view.rs`), so
//! the holder makes the store current on every FLUSH: in standby mode a
//! FLUSH and a FUA write complete once their data is in the store
//! (`--durability remote`), whatever the volume's durability, and the open
//! segment is sealed and uploaded after at most `STANDBY_SEAL_AGE_MS`, so
//! what is left to upload at the switchover is at most that much of writes
//! (plus the write buffer a FLUSH empties anyway). Background garbage
//! collection pauses meanwhile (`gc.rs`): it would rewrite the small
//! segments this makes, and a handover waits for a pass in flight. QEMU FLUSHes before it
//! stops a migrating VM's disks, so every read the VM makes on the
//! destination sees every write it made here.
//!
//! Entered when a standby registers (control socket or store request),
//! left when it says it is gone or the volume is handed over or closed.

use std::sync::Arc;

use super::Volume;
use crate::config::Durability;
use crate::error::VolumeError;

/// Longest a write waits in the open segment while a standby exists.
pub(crate) const STANDBY_SEAL_AGE_MS: u64 = 1000;

impl Volume {
    /// Enters standby mode for host `by` (a standby registered): from now
    /// on FLUSH uploads, and what the journal holds is uploaded before this
    /// returns (the standby then reads every write acknowledged so far). A
    /// second standby is refused (one volume moves to one place).
    pub async fn standby_registered(self: &Arc<Self>, by: &str) -> Result<(), VolumeError> {
        let starts = self.standby.register(by).map_err(|other| {
            VolumeError::Busy(format!(
                "volume {:?} already has a standby ({other}); one volume moves to one host at a time",
                self.name
            ))
        })?;
        if starts {
            *self.standby_watch.lock() = Some(self.ownership.host().watch_requests());
            tracing::info!(volume = %self.name, standby = %by, "a standby registered: every FLUSH now uploads, segments seal after {STANDBY_SEAL_AGE_MS} ms");
        }
        self.housekeeping.notify_one();
        self.flush_to_store().await
    }

    /// Leaves standby mode (the standby said it is gone).
    pub fn standby_gone(&self, by: &str) {
        if self.standby.unregister(by) {
            self.standby_watch.lock().take();
            tracing::info!(volume = %self.name, standby = %by, "the standby is gone: FLUSH is back to this volume's durability");
        }
    }

    /// The host standing by, if any.
    pub fn standby_host(&self) -> Option<String> {
        self.standby.by()
    }

    /// What FLUSH and FUA mean now.
    pub(crate) fn durability(&self) -> Durability {
        if self.standby.is_on() {
            Durability::Remote
        } else {
            self.config.durability
        }
    }

    /// How old the open segment may get before it is sealed.
    pub(crate) fn segment_max_age_ms(&self) -> u64 {
        if self.standby.is_on() {
            self.config.segment_max_age_ms.min(STANDBY_SEAL_AGE_MS)
        } else {
            self.config.segment_max_age_ms
        }
    }
}
