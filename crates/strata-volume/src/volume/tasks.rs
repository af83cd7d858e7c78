//! The background tasks of an open volume: lease re-claims after its host
//! was declared expired (fencing the volume on a takeover) and housekeeping (sealing old segments so an idle
//! volume's last writes reach the store; giving an idle volume's journal
//! space and buffers back). Each holds a weak reference and ends with the
//! volume.

use std::sync::Arc;

use super::Volume;
use crate::ownership::RenewError;

/// A journal with nothing the store lacks and no write for this long gives
/// its disk space back (`Journal::punch_if_idle`).
const JOURNAL_IDLE_MS: u64 = 30_000;
/// How soon a failed lease re-claim is tried again.
const RECLAIM_RETRY_MS: u64 = 500;
/// How often housekeeping looks again while uploads are under way.
const UPLOADS_RECHECK_MS: u64 = 1_000;

impl Volume {
    /// Re-claims the lease whenever the host starts a new incarnation
    /// (it was declared expired while paused or cut off); fences the
    /// volume if it was taken over meanwhile. Sleeps on the host's
    /// incarnation otherwise: an idle volume sends nothing.
    pub(crate) fn start_lease_reclaim(self: &Arc<Self>) {
        let weak = Arc::downgrade(self);
        let mut incarnation = self.ownership.host().watch_incarnation();
        tokio::spawn(async move {
            loop {
                if incarnation.changed().await.is_err() {
                    return;
                }
                loop {
                    let Some(vol) = weak.upgrade() else { return };
                    if vol.ownership.is_released() {
                        return;
                    }
                    match vol.ownership.reclaim(&vol.store, &vol.names).await {
                        Ok(()) => {
                            vol.space.notify_waiters();
                            break;
                        }
                        Err(RenewError::Fenced(detail)) => {
                            vol.fence(detail);
                            return;
                        }
                        Err(RenewError::Store(e)) => {
                            tracing::warn!(volume = %vol.name, error = %strata_store::ErrorText(&e), "cannot re-claim the lease after this host was declared expired; retrying (writes wait)");
                        }
                    }
                    drop(vol);
                    tokio::time::sleep(std::time::Duration::from_millis(RECLAIM_RETRY_MS)).await;
                }
            }
        });
    }

    /// The volume's housekeeping: seals the open segment once it is old
    /// enough (so an idle volume's last writes reach the store), then gives
    /// the journal's disk space and the segment buffers back once nothing
    /// was written for `JOURNAL_IDLE_MS`. Sleeps until the next of those is
    /// due, and while there is none, until a write lands in an empty open
    /// segment (`housekeeping` is notified): an idle volume runs nothing.
    pub(crate) fn start_housekeeping(self: &Arc<Self>) {
        let weak = Arc::downgrade(self);
        let wake = self.housekeeping.clone();
        tokio::spawn(async move {
            loop {
                let notified = wake.notified();
                tokio::pin!(notified);
                notified.as_mut().enable();
                let next = {
                    let Some(vol) = weak.upgrade() else { return };
                    if vol.closed.load(std::sync::atomic::Ordering::Acquire) {
                        return;
                    }
                    vol.seal_if_old();
                    if vol.journal.punch_if_idle(JOURNAL_IDLE_MS) {
                        vol.release_idle_buffers();
                    }
                    vol.next_housekeeping()
                };
                match next {
                    Some(after) => {
                        tokio::select! {
                            () = tokio::time::sleep(after) => {}
                            () = &mut notified => {}
                        }
                    }
                    None => notified.await,
                }
            }
        });
    }

    /// When housekeeping is next due (`None`: not until a write).
    fn next_housekeeping(&self) -> Option<std::time::Duration> {
        let max_age = std::time::Duration::from_millis(self.segment_max_age_ms());
        let st = self.state.lock();
        if !st.open.is_empty() {
            return Some(max_age.saturating_sub(st.open.opened_at.elapsed()));
        }
        if !st.sealed.is_empty() {
            // Uploads under way: the journal frees as they finish.
            return Some(std::time::Duration::from_millis(UPLOADS_RECHECK_MS));
        }
        drop(st);
        // A moment past the deadline, so the punch finds it passed.
        self.journal
            .until_idle(JOURNAL_IDLE_MS)
            .map(|d| d + std::time::Duration::from_millis(10))
    }
}
