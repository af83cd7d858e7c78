//! Snapshots and resizes of a volume another server holds, done by that
//! holder on request: only the holder writes a volume's manifest. A CSI
//! controller on one node snapshots and grows volumes that pods use on
//! other nodes this way.
//!
//! The request reaches the holder as a handover request does
//! (`handover.rs`): over its control socket when it is on this machine,
//! otherwise in its host record in the store, answered at its next
//! renewal (within TTL/3, 10 s by default). The asker then reads the
//! volume's manifest until the change is there, or its time is up (the
//! request stays queued: a later call finds the change made).

use std::time::{Duration, Instant};

use strata_store::{validate_volume_name, ObjectNames};

use super::control_client::{control_call, local_control_socket};
use super::Engine;
use crate::error::VolumeError;
use crate::format::host_record::{HandoverRequest, RequestKind};
use crate::format::manifest::{validate_snapshot_name, SnapshotRecord};
use crate::objects::read_manifest;
use crate::ownership::{push_request, read_lease, standing, Standing};

/// How often the asker reads the manifest while it waits.
const DONE_POLL: Duration = Duration::from_millis(200);

/// What a holder is asked to do.
#[derive(Debug, Clone, Copy)]
enum HolderOp<'a> {
    Snapshot(&'a str),
    Resize(u64),
}

impl HolderOp<'_> {
    fn describe(&self) -> String {
        match self {
            HolderOp::Snapshot(name) => format!("snapshot {name:?}"),
            HolderOp::Resize(size) => format!("resize to {size} bytes"),
        }
    }
}

impl Engine {
    /// Takes snapshot `name` of `volume`: here (`create_snapshot`), or,
    /// when another server holds the volume, by that server, waiting at
    /// most `timeout` for the manifest to show it.
    pub async fn create_snapshot_anywhere(
        &self,
        volume: &str,
        name: &str,
        timeout: Duration,
    ) -> Result<SnapshotRecord, VolumeError> {
        validate_snapshot_name(name).map_err(VolumeError::Invalid)?;
        let deadline = Instant::now() + timeout;
        match self.create_snapshot(volume, name).await {
            Err(VolumeError::Busy(_)) if self.served(volume).is_none() => {}
            done => return done,
        }
        let op = HolderOp::Snapshot(name);
        let holder = self.ask_holder(volume, op).await?;
        loop {
            let m = read_manifest(&self.store, volume).await?;
            if let Some(s) = m.snapshots.into_iter().find(|s| s.name == name) {
                tracing::info!(volume, snapshot = name, holder = %holder, "snapshot taken by the volume's holder");
                return Ok(s);
            }
            wait_or_give_up(volume, op, &holder, deadline).await?;
        }
    }

    /// Grows `volume` to `size_bytes` (never shrinks): here
    /// (`resize_volume`), or by the server that holds it, waiting at most
    /// `timeout` for the manifest to show the size.
    pub async fn grow_volume_anywhere(
        &self,
        volume: &str,
        size_bytes: u64,
        timeout: Duration,
    ) -> Result<(), VolumeError> {
        let deadline = Instant::now() + timeout;
        match self.resize_volume(volume, size_bytes, false).await {
            Err(VolumeError::Busy(_)) if self.served(volume).is_none() => {}
            done => return done.map(|_| ()),
        }
        let op = HolderOp::Resize(size_bytes);
        let holder = self.ask_holder(volume, op).await?;
        loop {
            if read_manifest(&self.store, volume).await?.size_bytes >= size_bytes {
                tracing::info!(volume, size_bytes, holder = %holder, "volume grown by its holder");
                return Ok(());
            }
            wait_or_give_up(volume, op, &holder, deadline).await?;
        }
    }

    /// Sends `op` to the live holder of `volume`; returns who it is. An
    /// error when nobody holds it (the caller's own attempt said it was
    /// held: try again) or its holder cannot be asked.
    async fn ask_holder(&self, volume: &str, op: HolderOp<'_>) -> Result<String, VolumeError> {
        validate_volume_name(volume).map_err(VolumeError::Invalid)?;
        let names = ObjectNames::new(volume);
        let busy = |why: String| VolumeError::Busy(format!("volume {volume:?}: {why}"));
        let Some((lease, _)) = read_lease(&self.store, &names).await? else {
            return Err(busy("its holder let go of it meanwhile; try again".into()));
        };
        let record = match standing(&self.store, &lease).await? {
            Standing::Live { host: Some(r), .. } => r,
            Standing::Free => {
                return Err(busy("its holder let go of it meanwhile; try again".into()))
            }
            Standing::Live { host: None, detail } => {
                return Err(busy(format!(
                    "held by {detail}, a release that cannot do a {} on request: upgrade it, or stop it",
                    op.describe()
                )))
            }
            Standing::HostExpired(r, _) => {
                return Err(busy(format!(
                    "held by {}, whose host stopped renewing its liveness: the next server to open the volume takes it over",
                    r.holder
                )))
            }
        };
        let holder = lease.describe();
        if let Some(path) = local_control_socket(&record) {
            let request = match op {
                HolderOp::Snapshot(name) => serde_json::json!({
                    "op": "snapshot_create", "volume": volume, "snapshot": name}),
                HolderOp::Resize(size) => serde_json::json!({
                    "op": "resize", "volume": volume, "size_bytes": size, "allow_shrink": false}),
            };
            match control_call(&path, &request).await {
                Ok(_) => return Ok(holder),
                // The holder answered: what it says is the answer.
                Err(e) if e.starts_with("the holder refused") => {
                    return Err(VolumeError::NotDone {
                        name: volume.to_string(),
                        detail: format!("{} by {holder}: {e}", op.describe()),
                    })
                }
                Err(e) => {
                    tracing::info!(socket = %path, error = %e, "the holder's control socket did not answer; asking through the store")
                }
            }
        }
        let by = crate::ownership::holder_id(&self.config.data_dir)
            .unwrap_or_else(|_| "a strata command".into());
        let (kind, snapshot, size_bytes) = match op {
            HolderOp::Snapshot(name) => (RequestKind::Snapshot, Some(name.to_string()), None),
            HolderOp::Resize(size) => (RequestKind::Resize, None, Some(size)),
        };
        let request = HandoverRequest {
            volume: volume.to_string(),
            by,
            at_unix_ms: 0,
            kind,
            to: None,
            snapshot,
            size_bytes,
        };
        if push_request(&self.store, &record.id, request)
            .await?
            .is_none()
        {
            return Err(busy(format!(
                "its holder {holder} stopped meanwhile; try again"
            )));
        }
        Ok(holder)
    }

    /// The holder's side of a snapshot or resize request that came through
    /// the store: done only on a volume this engine serves (a request for
    /// one it let go of meanwhile is the next holder's to be asked).
    pub(crate) async fn answer_holder_op(&self, r: &HandoverRequest) -> Result<(), VolumeError> {
        if self.served(&r.volume).is_none() {
            return Err(VolumeError::Busy(format!(
                "volume {:?} is not served here (any more): not done",
                r.volume
            )));
        }
        match (r.kind, &r.snapshot, r.size_bytes) {
            (RequestKind::Snapshot, Some(name), _) => {
                let exists = self
                    .list_snapshots(&r.volume)
                    .await?
                    .iter()
                    .any(|s| s.name == *name);
                if !exists {
                    self.create_snapshot(&r.volume, name).await?;
                }
                Ok(())
            }
            (RequestKind::Resize, _, Some(size)) => {
                let vol = self.served(&r.volume).ok_or_else(|| {
                    VolumeError::Busy(format!("volume {:?} closed meanwhile", r.volume))
                })?;
                if vol.size_bytes() < size {
                    self.resize_volume(&r.volume, size, false).await?;
                }
                Ok(())
            }
            _ => Err(VolumeError::Invalid(format!(
                "a {:?} request without its snapshot name or size",
                r.kind
            ))),
        }
    }
}

/// Sleeps a poll, or gives up at `deadline` with an error that says the
/// holder still has the request.
async fn wait_or_give_up(
    volume: &str,
    op: HolderOp<'_>,
    holder: &str,
    deadline: Instant,
) -> Result<(), VolumeError> {
    if Instant::now() >= deadline {
        return Err(VolumeError::NotDone {
            name: volume.to_string(),
            detail: format!(
                "{} asked of its holder {holder}, not done yet (it looks at its requests at each renewal; its log says why if it failed): call again",
                op.describe()
            ),
        });
    }
    tokio::time::sleep(DONE_POLL).await;
    Ok(())
}
