//! Requests through the store answered within `REQUEST_POLL_MS` while they
//! matter: a host holding a volume that has a standby (a live migration
//! under way) looks at its own record that often, not only at its renewal
//! (every TTL/3, 10 s by default), so a standby on another machine takes
//! the volume at the switchover in a poll and a few round trips.
//!
//! Cost: one GET per `REQUEST_POLL_MS` per host while any of its volumes
//! has a standby (seconds, during a migration), nothing otherwise. A look
//! that finds requests queues them at once and starts a renewal, which
//! writes the record without them (its If-Match fails, it reads them back:
//! `take_requests` queues each request once).

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Duration;

use super::host_liveness::{read_host_record, HostLiveness};

/// How often a host with a standby looks at its record for requests.
pub const REQUEST_POLL_MS: u64 = 100;

/// Keeps its host looking for requests while it lives (one per volume
/// with a standby).
pub struct RequestWatch {
    host: Weak<HostLiveness>,
}

impl HostLiveness {
    /// Looks at this host's record every `REQUEST_POLL_MS` until the
    /// returned watch (and every other) is dropped.
    pub fn watch_requests(self: &Arc<Self>) -> RequestWatch {
        self.request_watchers.fetch_add(1, Ordering::AcqRel);
        if !self.request_poll_running.swap(true, Ordering::AcqRel) {
            tokio::spawn(poll_requests(Arc::downgrade(self)));
        }
        RequestWatch {
            host: Arc::downgrade(self),
        }
    }

    /// One look: requests found are answered at once, and a renewal
    /// started to clear them from the record.
    async fn look_for_requests(self: &Arc<Self>) {
        match read_host_record(self.store(), &self.id).await {
            Ok(Some((r, _))) if !r.handover_requests.is_empty() => {
                self.take_requests(&r.handover_requests);
                let host = self.clone();
                tokio::spawn(async move {
                    if let Err(e) = host.renew().await {
                        tracing::debug!(host = %host.holder, error = %e, "renewal for a request found by a look failed; the next renewal tries again");
                    }
                });
            }
            Ok(_) => {}
            Err(e) => {
                tracing::debug!(host = %self.holder, error = %e, "cannot look at this host's record for requests; trying again");
            }
        }
    }
}

impl Drop for RequestWatch {
    fn drop(&mut self) {
        if let Some(host) = self.host.upgrade() {
            host.request_watchers.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

/// The look, every `REQUEST_POLL_MS`, while anyone watches.
async fn poll_requests(host: Weak<HostLiveness>) {
    loop {
        tokio::time::sleep(Duration::from_millis(REQUEST_POLL_MS)).await;
        let Some(h) = host.upgrade() else { return };
        if h.is_stopped() {
            h.request_poll_running.store(false, Ordering::Release);
            return;
        }
        if h.request_watchers.load(Ordering::Acquire) == 0 {
            h.request_poll_running.store(false, Ordering::Release);
            // A watch that came between the load and the store found the
            // poll running and did not start one: go on for it.
            if h.request_watchers.load(Ordering::Acquire) == 0
                || h.request_poll_running.swap(true, Ordering::AcqRel)
            {
                return;
            }
        }
        h.look_for_requests().await;
    }
}
