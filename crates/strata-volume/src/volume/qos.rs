//! A served volume's QoS: its clients' requests held to its limits
//! (`qos/`), and the limits changed live, kept in its manifest.

use std::sync::Arc;

use super::Volume;
use crate::error::VolumeError;
use crate::qos::{QosKind, QosLimits};

impl Volume {
    /// Waits until a client's request of `kind` moving `bytes` is within
    /// the volume's limits (at once when it has none). Never fails.
    pub async fn admit(&self, kind: QosKind, bytes: u64) {
        self.qos.admit(kind, bytes).await;
    }

    /// The limits in effect.
    pub fn qos_limits(&self) -> QosLimits {
        self.qos.limits()
    }

    /// Replaces the volume's limits (all `None`: none): stored in its
    /// manifest (one conditional write by the holder, so any server that
    /// opens it later applies them), then applied to requests at once,
    /// those already waiting included. Returns the previous limits.
    pub async fn set_qos(self: &Arc<Self>, limits: QosLimits) -> Result<QosLimits, VolumeError> {
        limits.validate().map_err(VolumeError::Invalid)?;
        self.check_failed()?;
        let stored = (!limits.is_unlimited()).then(|| limits.clone());
        let change = |m: &crate::format::manifest::Manifest| {
            let mut next = m.clone();
            next.qos = stored.clone();
            Some(next)
        };
        let update = self.manifest.update(&self.store, &self.ownership, change);
        if let Err(refused) = update.await {
            return Err(self.failed(format!("QoS limits not changed: {}", self.refused(refused))));
        }
        let previous = self.qos.limits();
        self.qos.set(limits);
        tracing::info!(volume = %self.name, "QoS limits changed");
        Ok(previous)
    }
}
