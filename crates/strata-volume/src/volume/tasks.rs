//! The background tasks of an open volume: lease renewal (fencing the
//! volume on a takeover) and the age sealer (so an idle volume's last
//! writes reach the store). Each holds a weak reference and ends with the
//! volume.

use std::sync::Arc;

use super::Volume;
use crate::ownership::RenewError;

impl Volume {
    /// Renews the store lease every third of its TTL while open (every
    /// second after a failure); fences the volume on a takeover.
    pub(crate) fn start_lease_renewal(self: &Arc<Self>) {
        let weak = Arc::downgrade(self);
        let ttl_ms = self.ownership.ttl_ms;
        tokio::spawn(async move {
            let mut delay_ms = ttl_ms / 3;
            loop {
                tokio::time::sleep(std::time::Duration::from_millis(delay_ms)).await;
                let Some(vol) = weak.upgrade() else { return };
                // Renewals go on while a close uploads what is left (its
                // uploads need a valid lease), until the lease is released.
                if vol.ownership.is_released() {
                    return;
                }
                delay_ms = match vol.ownership.renew(&vol.store, &vol.names).await {
                    Ok(()) => {
                        vol.space.notify_waiters();
                        ttl_ms / 3
                    }
                    Err(RenewError::Fenced(detail)) => {
                        vol.fence(detail);
                        return;
                    }
                    Err(RenewError::Store(e)) => {
                        let valid = vol.ownership.is_valid();
                        tracing::warn!(volume = %vol.name, error = %strata_store::ErrorText(&e), writes_allowed = valid, "cannot renew the lease; retrying (writes wait once it may have expired)");
                        (ttl_ms / 10).clamp(100, 1000)
                    }
                };
            }
        });
    }

    /// Seals segments that are old enough, so idle volumes reach the store.
    pub(crate) fn start_age_sealer(self: &Arc<Self>) {
        let weak = Arc::downgrade(self);
        let period =
            std::time::Duration::from_millis((self.config.segment_max_age_ms / 4).clamp(50, 1000));
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(period);
            loop {
                tick.tick().await;
                let Some(vol) = weak.upgrade() else { return };
                if vol.closed.load(std::sync::atomic::Ordering::Acquire) {
                    return;
                }
                vol.seal_if_old();
            }
        });
    }
}
