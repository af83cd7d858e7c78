//! The Controller service: volumes and snapshots made, listed, grown and
//! deleted in the store (the provisioner's, snapshotter's and resizer's
//! calls). Idempotent as the spec asks: a retried call finds what the first
//! made and answers as it did; a call that conflicts with what exists is
//! ALREADY_EXISTS; deleting what is not there succeeds.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use parking_lot::Mutex;
use strata_volume::{Engine, SnapshotRecord, VolumeError, VolumeInfo};
use tonic::{Request, Response, Status};

use crate::capacity;
use crate::driver_config::DriverConfig;
use crate::ids::{self, clone_source_snapshot, parse_snapshot_id, snapshot_id, strata_name};
use crate::parameters::VolumeParameters;
use crate::proto::controller_server::Controller;
use crate::proto::controller_service_capability::{self, rpc};
use crate::proto::volume_content_source::{self as source, SnapshotSource, VolumeSource};
use crate::proto::*;
use crate::snapshot_names;
use crate::status::{from_volume_error, invalid, require};

/// How long a snapshot or an expansion of a volume held by another node
/// waits for that node to make it (it looks at its requests at each
/// renewal, every 10 s by default); after it, ABORTED, and the sidecar's
/// retry finds it made.
const HOLDER_WAIT: std::time::Duration = std::time::Duration::from_secs(25);

/// Entries a list call returns at most when the caller sets no maximum.
const MAX_LIST_ENTRIES: usize = 1000;
/// The topology key of a local store's volumes: the host they live on.
pub const TOPOLOGY_HOST_KEY: &str = "topology.csi.strata.dev/host";

pub struct ControllerService {
    engine: Arc<Engine>,
    config: Arc<DriverConfig>,
    /// Names with a call in flight: a second call for one is ABORTED, as
    /// the spec asks ("operation pending").
    in_flight: Arc<Mutex<HashSet<String>>>,
}

/// A name's turn; the name is free again when dropped.
struct Turn {
    name: String,
    set: Arc<Mutex<HashSet<String>>>,
}

impl Drop for Turn {
    fn drop(&mut self) {
        self.set.lock().remove(&self.name);
    }
}

impl ControllerService {
    pub fn new(engine: Arc<Engine>, config: Arc<DriverConfig>) -> ControllerService {
        ControllerService {
            engine,
            config,
            in_flight: Arc::new(Mutex::new(HashSet::new())),
        }
    }

    fn turn(&self, name: &str) -> Result<Turn, Status> {
        if !self.in_flight.lock().insert(name.to_string()) {
            return Err(Status::aborted(format!(
                "an operation on {name:?} is in progress: try again when it ends"
            )));
        }
        Ok(Turn {
            name: name.to_string(),
            set: self.in_flight.clone(),
        })
    }

    /// The topology a new volume is reachable from: this host, on a local
    /// store; anywhere on S3.
    fn topology(&self) -> Vec<Topology> {
        match &self.config.local_store {
            Some(_) => vec![Topology {
                segments: HashMap::from([(
                    TOPOLOGY_HOST_KEY.to_string(),
                    self.config.node_id.clone(),
                )]),
            }],
            None => Vec::new(),
        }
    }

    fn csi_volume(&self, info: &VolumeInfo, source: Option<VolumeContentSource>) -> Volume {
        Volume {
            capacity_bytes: info.size_bytes as i64,
            volume_id: info.name.clone(),
            volume_context: HashMap::new(),
            content_source: source,
            accessible_topology: self.topology(),
        }
    }

    /// Checks what a StorageClass asks against this driver's key.
    fn check_encryption(&self, p: &VolumeParameters) -> Result<(), Status> {
        let key = self.engine.config().key.as_deref();
        match (p.encrypted, key) {
            (Some(true), None) => {
                return Err(Status::invalid_argument(
                    "parameter encrypted=true, but this driver has no key: start `strata csi` with --key-file (a Secret mounted in its pod; `strata key generate FILE` makes one)",
                ))
            }
            (Some(false), Some(_)) => {
                return Err(Status::invalid_argument(
                    "parameter encrypted=false, but this driver encrypts every volume it makes (it was started with a key): use a driver without --key-file for unencrypted volumes, or leave the parameter out",
                ))
            }
            _ => {}
        }
        if let (Some(want), Some(key)) = (&p.key_fingerprint, key) {
            let have = key.fingerprint();
            if *want != have {
                return Err(Status::invalid_argument(format!(
                    "parameter keyFingerprint={want:?}, but this driver's key is {have:?}: give the driver the key the StorageClass names"
                )));
            }
        } else if p.key_fingerprint.is_some() {
            return Err(Status::invalid_argument(
                "parameter keyFingerprint is set, but this driver has no key: start `strata csi` with --key-file",
            ));
        }
        Ok(())
    }

    /// The parent a volume made from `source` has: (volume, snapshot).
    fn parent_of(
        &self,
        volume: &str,
        source: Option<&source::Type>,
    ) -> Result<Option<(String, String)>, Status> {
        match source {
            None => Ok(None),
            Some(source::Type::Snapshot(SnapshotSource { snapshot_id })) => {
                let (v, s) = parse_snapshot_id(snapshot_id).ok_or_else(|| {
                    Status::not_found(format!("snapshot {snapshot_id:?} does not exist"))
                })?;
                Ok(Some((v.to_string(), s.to_string())))
            }
            Some(source::Type::Volume(VolumeSource { volume_id })) => {
                if !ids::is_volume_id(volume_id) {
                    return Err(Status::not_found(format!(
                        "volume {volume_id:?} does not exist"
                    )));
                }
                Ok(Some((volume_id.clone(), clone_source_snapshot(volume))))
            }
        }
    }

    /// What CreateVolume answers for a volume that exists already: it, if
    /// it is what was asked (after growing it, if an earlier attempt made
    /// the clone and stopped before that), ALREADY_EXISTS otherwise.
    async fn existing(
        &self,
        info: VolumeInfo,
        req: &CreateVolumeRequest,
        parent: Option<(String, String)>,
    ) -> Result<Volume, Status> {
        let has = info
            .parent
            .as_ref()
            .map(|p| (p.volume.clone(), p.snapshot.clone()));
        if has != parent {
            return Err(Status::already_exists(format!(
                "volume {:?} exists already, made from {} rather than {}",
                info.name,
                describe_parent(has.as_ref()),
                describe_parent(parent.as_ref())
            )));
        }
        let range = req.capacity_range.as_ref();
        if !capacity::fits(info.size_bytes, range)? {
            let size = capacity::size_for(range)?;
            if parent.is_none() || info.size_bytes > size {
                return Err(Status::already_exists(format!(
                    "volume {:?} exists already with {} bytes, outside the capacity asked for",
                    info.name, info.size_bytes
                )));
            }
            self.grow(&info.name, size).await?;
            let info = self.info(&info.name).await?;
            return Ok(self.csi_volume(&info, req.volume_content_source.clone()));
        }
        Ok(self.csi_volume(&info, req.volume_content_source.clone()))
    }

    async fn info(&self, volume: &str) -> Result<VolumeInfo, Status> {
        self.engine
            .volume_info_with(volume, false)
            .await
            .map_err(|e| from_volume_error(&format!("volume {volume:?}"), &e))
    }

    async fn grow(&self, volume: &str, size_bytes: u64) -> Result<(), Status> {
        self.engine
            .grow_volume_anywhere(volume, size_bytes, HOLDER_WAIT)
            .await
            .map_err(|e| {
                from_volume_error(&format!("grow volume {volume:?} to {size_bytes} bytes"), &e)
            })
    }

    /// Makes volume `name` as a clone of `parent` (taking the snapshot
    /// first for a volume source), then grows it to `size`.
    async fn make_clone(
        &self,
        name: &str,
        parent: &(String, String),
        from_volume: bool,
        size: u64,
    ) -> Result<(), Status> {
        let (pv, ps) = parent;
        let snap = self.snapshot_record(pv, ps).await?;
        let snap = match (snap, from_volume) {
            (Some(s), _) => s,
            (None, true) => self
                .engine
                .create_snapshot_anywhere(pv, ps, HOLDER_WAIT)
                .await
                .map_err(|e| {
                    from_volume_error(&format!("snapshot volume {pv:?} to clone it"), &e)
                })?,
            (None, false) => {
                return Err(Status::not_found(format!(
                    "snapshot {:?} does not exist",
                    snapshot_id(pv, ps)
                )))
            }
        };
        if size < snap.size_bytes {
            return Err(Status::out_of_range(format!(
                "capacity_range: the source is {} bytes; a volume made from it must be at least that",
                snap.size_bytes
            )));
        }
        self.engine
            .create_clone(None, pv, ps, name)
            .await
            .map_err(|e| {
                from_volume_error(
                    &format!("clone {:?} as volume {name:?}", snapshot_id(pv, ps)),
                    &e,
                )
            })?;
        if size > snap.size_bytes {
            self.grow(name, size).await?;
        }
        Ok(())
    }

    /// Snapshot `snapshot` of `volume` if it exists; NOT_FOUND if the
    /// volume does not.
    async fn snapshot_record(
        &self,
        volume: &str,
        snapshot: &str,
    ) -> Result<Option<SnapshotRecord>, Status> {
        match self.engine.list_snapshots(volume).await {
            Ok(list) => Ok(list.into_iter().find(|s| s.name == snapshot)),
            Err(VolumeError::NotFound(_)) => Err(Status::not_found(format!(
                "volume {volume:?} does not exist"
            ))),
            Err(e) => Err(from_volume_error(
                &format!("list the snapshots of {volume:?}"),
                &e,
            )),
        }
    }

    fn csi_snapshot(volume: &str, s: &SnapshotRecord) -> Snapshot {
        let ms = s.created_unix_ms;
        Snapshot {
            size_bytes: s.size_bytes as i64,
            snapshot_id: snapshot_id(volume, &s.name),
            source_volume_id: volume.to_string(),
            creation_time: Some(prost_types::Timestamp {
                seconds: (ms / 1000) as i64,
                nanos: ((ms % 1000) * 1_000_000) as i32,
            }),
            ready_to_use: true,
            group_snapshot_id: String::new(),
            // Reachable wherever its volume is.
            accessible_topology: Vec::new(),
        }
    }
}

fn describe_parent(p: Option<&(String, String)>) -> String {
    match p {
        None => "nothing (empty)".to_string(),
        Some((v, s)) => format!("{v}@{s}"),
    }
}

fn capability(t: rpc::Type) -> ControllerServiceCapability {
    ControllerServiceCapability {
        r#type: Some(controller_service_capability::Type::Rpc(
            controller_service_capability::Rpc { r#type: t as i32 },
        )),
    }
}

/// What a page token starts with: a token is `after:` and the last id of
/// the page before (ids sort; one deleted meanwhile still sorts).
const TOKEN_PREFIX: &str = "after:";

/// A page of `items` (sorted by key) after the id `token` names, at most
/// `max` of them, and the next page's token.
fn page<T>(
    items: Vec<T>,
    key: impl Fn(&T) -> &str,
    token: &str,
    max: i32,
) -> Result<(Vec<T>, String), Status> {
    if max < 0 {
        return Err(invalid(format!(
            "max_entries must not be negative (got {max})"
        )));
    }
    let after = after_id(token)?;
    let max = if max == 0 {
        MAX_LIST_ENTRIES
    } else {
        max as usize
    };
    let mut rest: Vec<T> = items
        .into_iter()
        .filter(|i| after.is_none_or(|a| key(i) > a))
        .collect();
    let next = if rest.len() > max {
        rest.truncate(max);
        rest.last()
            .map(|i| format!("{TOKEN_PREFIX}{}", key(i)))
            .unwrap_or_default()
    } else {
        String::new()
    };
    Ok((rest, next))
}

/// The id a starting token names (`None`: from the start); ABORTED for a
/// token this driver did not give out, as the spec asks.
fn after_id(token: &str) -> Result<Option<&str>, Status> {
    if token.is_empty() {
        return Ok(None);
    }
    match token.strip_prefix(TOKEN_PREFIX) {
        Some(id) if ids::is_volume_id(id) || parse_snapshot_id(id).is_some() => Ok(Some(id)),
        _ => Err(Status::aborted(format!(
            "starting_token {token:?} is not one this driver gave out: list from the start"
        ))),
    }
}

#[tonic::async_trait]
impl Controller for ControllerService {
    async fn create_volume(
        &self,
        request: Request<CreateVolumeRequest>,
    ) -> Result<Response<CreateVolumeResponse>, Status> {
        let req = request.into_inner();
        if req.name.is_empty() {
            return Err(invalid("name is required: the volume's name (the PV's)"));
        }
        if req.volume_capabilities.is_empty() {
            return Err(invalid(
                "volume_capabilities is required: block or mount, and an access mode",
            ));
        }
        for cap in &req.volume_capabilities {
            crate::capabilities::check(cap).map_err(invalid)?;
        }
        let params =
            VolumeParameters::parse(&req.parameters, self.config.parse_qos).map_err(invalid)?;
        self.check_encryption(&params)?;
        let size = capacity::size_for(req.capacity_range.as_ref())?;
        let name = strata_name("volume", &req.name);
        let _turn = self.turn(&name)?;
        let source = req
            .volume_content_source
            .as_ref()
            .and_then(|s| s.r#type.as_ref());
        let parent = self.parent_of(&name, source)?;
        match self.engine.volume_info_with(&name, false).await {
            Ok(info) => {
                let volume = self.existing(info, &req, parent).await?;
                return Ok(Response::new(CreateVolumeResponse {
                    volume: Some(volume),
                }));
            }
            Err(VolumeError::NotFound(_)) => {}
            Err(e) => return Err(from_volume_error(&format!("volume {name:?}"), &e)),
        }
        match &parent {
            None => {
                let compression = params
                    .compression
                    .unwrap_or(self.engine.config().compression);
                self.engine
                    .create_volume_limited(&name, size, compression, params.qos.clone())
                    .await
                    .map_err(|e| from_volume_error(&format!("create volume {name:?}"), &e))?;
            }
            Some(p) => {
                let from_volume = matches!(source, Some(source::Type::Volume(_)));
                self.make_clone(&name, p, from_volume, size).await?;
                if !params.qos.is_unlimited() {
                    self.engine
                        .set_volume_qos(&name, params.qos.clone())
                        .await
                        .map_err(|e| from_volume_error(&format!("set the QoS of {name:?}"), &e))?;
                }
            }
        }
        let info = self.info(&name).await?;
        tracing::info!(volume = %name, csi_name = %req.name, size_bytes = info.size_bytes, source = %describe_parent(parent.as_ref()), "CSI volume created");
        Ok(Response::new(CreateVolumeResponse {
            volume: Some(self.csi_volume(&info, req.volume_content_source.clone())),
        }))
    }

    async fn delete_volume(
        &self,
        request: Request<DeleteVolumeRequest>,
    ) -> Result<Response<DeleteVolumeResponse>, Status> {
        let id = request.into_inner().volume_id;
        require("volume_id", &id)?;
        if !ids::is_volume_id(&id) {
            // No volume can have that id: nothing to delete.
            return Ok(Response::new(DeleteVolumeResponse {}));
        }
        let _turn = self.turn(&id)?;
        if self.engine.served(&id).is_some() {
            return Err(Status::failed_precondition(format!(
                "volume {id:?} is staged on node {} (a pod uses it): unstage it first",
                self.config.node_id
            )));
        }
        let info = match self.engine.volume_info_with(&id, false).await {
            Ok(info) => info,
            Err(VolumeError::NotFound(_)) => return Ok(Response::new(DeleteVolumeResponse {})),
            Err(e) => return Err(from_volume_error(&format!("volume {id:?}"), &e)),
        };
        match self.engine.delete_volume(&id).await {
            Ok(()) | Err(VolumeError::NotFound(_)) => {}
            Err(e) => return Err(from_volume_error(&format!("delete volume {id:?}"), &e)),
        }
        // Its snapshots went with it: their names are free again.
        for s in &info.snapshots {
            if snapshot_names::claimed_by(self.engine.store(), &s.name).await? == Some(id.clone()) {
                snapshot_names::release(self.engine.store(), &s.name).await?;
            }
        }
        // A clone of a volume (not of a snapshot) had its own snapshot of
        // the source: it goes with the clone.
        if let Some(p) = info
            .parent
            .filter(|p| p.snapshot == clone_source_snapshot(&id))
        {
            if let Err(e) = self.engine.delete_snapshot(&p.volume, &p.snapshot).await {
                tracing::warn!(volume = %id, snapshot = %snapshot_id(&p.volume, &p.snapshot), error = %strata_store::ErrorText(&e), "the clone is deleted but the snapshot it was made from is not: `strata snapshot delete` it");
            }
        }
        tracing::info!(volume = %id, "CSI volume deleted");
        Ok(Response::new(DeleteVolumeResponse {}))
    }

    async fn validate_volume_capabilities(
        &self,
        request: Request<ValidateVolumeCapabilitiesRequest>,
    ) -> Result<Response<ValidateVolumeCapabilitiesResponse>, Status> {
        let req = request.into_inner();
        require("volume_id", &req.volume_id)?;
        if req.volume_capabilities.is_empty() {
            return Err(invalid("volume_capabilities is required"));
        }
        if !ids::is_volume_id(&req.volume_id) {
            return Err(Status::not_found(format!(
                "volume {:?} does not exist",
                req.volume_id
            )));
        }
        self.info(&req.volume_id).await?;
        if let Err(msg) = VolumeParameters::parse(&req.parameters, self.config.parse_qos) {
            return Ok(Response::new(ValidateVolumeCapabilitiesResponse {
                confirmed: None,
                message: msg,
            }));
        }
        for cap in &req.volume_capabilities {
            if let Err(msg) = crate::capabilities::check(cap) {
                return Ok(Response::new(ValidateVolumeCapabilitiesResponse {
                    confirmed: None,
                    message: msg,
                }));
            }
        }
        Ok(Response::new(ValidateVolumeCapabilitiesResponse {
            confirmed: Some(validate_volume_capabilities_response::Confirmed {
                volume_context: req.volume_context,
                volume_capabilities: req.volume_capabilities,
                parameters: req.parameters,
                mutable_parameters: req.mutable_parameters,
            }),
            message: String::new(),
        }))
    }

    async fn list_volumes(
        &self,
        request: Request<ListVolumesRequest>,
    ) -> Result<Response<ListVolumesResponse>, Status> {
        let req = request.into_inner();
        let all = self
            .engine
            .list_volumes()
            .await
            .map_err(|e| from_volume_error("list volumes", &e))?;
        let (infos, next_token) = page(
            all,
            |i| i.name.as_str(),
            &req.starting_token,
            req.max_entries,
        )?;
        let entries = infos
            .iter()
            .map(|info| list_volumes_response::Entry {
                volume: Some(self.csi_volume(info, None)),
                status: None,
            })
            .collect();
        Ok(Response::new(ListVolumesResponse {
            entries,
            next_token,
        }))
    }

    async fn get_capacity(
        &self,
        _request: Request<GetCapacityRequest>,
    ) -> Result<Response<GetCapacityResponse>, Status> {
        let Some(dir) = &self.config.local_store else {
            return Err(Status::unimplemented(
                "capacity is not reported for an S3 store: it has no fixed size",
            ));
        };
        let free = crate::fs_stats::statvfs(dir).map_err(|e| {
            Status::internal(format!("free space of the store {}: {e}", dir.display()))
        })?;
        Ok(Response::new(GetCapacityResponse {
            available_capacity: free.available_bytes.min(i64::MAX as u64) as i64,
            maximum_volume_size: Some(strata_volume::MAX_VOLUME_BYTES as i64),
            minimum_volume_size: Some(capacity::SIZE_STEP_BYTES as i64),
        }))
    }

    async fn controller_get_capabilities(
        &self,
        _request: Request<ControllerGetCapabilitiesRequest>,
    ) -> Result<Response<ControllerGetCapabilitiesResponse>, Status> {
        let mut capabilities = vec![
            capability(rpc::Type::CreateDeleteVolume),
            capability(rpc::Type::ListVolumes),
            capability(rpc::Type::CreateDeleteSnapshot),
            capability(rpc::Type::ListSnapshots),
            capability(rpc::Type::CloneVolume),
            capability(rpc::Type::ExpandVolume),
            capability(rpc::Type::SingleNodeMultiWriter),
        ];
        if self.config.local_store.is_some() {
            capabilities.push(capability(rpc::Type::GetCapacity));
        }
        Ok(Response::new(ControllerGetCapabilitiesResponse {
            capabilities,
        }))
    }

    async fn create_snapshot(
        &self,
        request: Request<CreateSnapshotRequest>,
    ) -> Result<Response<CreateSnapshotResponse>, Status> {
        let req = request.into_inner();
        if req.name.is_empty() {
            return Err(invalid("name is required: the snapshot's name"));
        }
        require("source_volume_id", &req.source_volume_id)?;
        let volume = req.source_volume_id.as_str();
        if !ids::is_volume_id(volume) {
            return Err(Status::not_found(format!(
                "volume {volume:?} does not exist"
            )));
        }
        let name = strata_name("snapshot", &req.name);
        let _turn = self.turn(&snapshot_id(volume, &name))?;
        // The volume's turn too: a snapshot waits out (ABORTED, retried by
        // the snapshotter) a delete or an expansion of its volume.
        let _volume_turn = self.turn(volume)?;
        // Before the claim: a snapshot of nothing claims no name.
        let existing = self.snapshot_record(volume, &name).await?;
        snapshot_names::claim(self.engine.store(), &name, volume).await?;
        let record = match existing {
            Some(s) => s,
            None => match self
                .engine
                .create_snapshot_anywhere(volume, &name, HOLDER_WAIT)
                .await
            {
                Ok(record) => record,
                // Asked of the volume's holder and not made yet: the
                // claim stays for the retry that finds it made.
                Err(e @ VolumeError::NotDone { .. }) => {
                    return Err(from_volume_error(
                        &format!("snapshot volume {volume:?}"),
                        &e,
                    ))
                }
                Err(e) => {
                    // Nothing half made: the name goes back.
                    if let Err(release) = snapshot_names::release(self.engine.store(), &name).await
                    {
                        tracing::warn!(snapshot = %name, error = %release.message(), "the failed snapshot's name is still claimed: DeleteSnapshot frees it");
                    }
                    return Err(from_volume_error(
                        &format!("snapshot volume {volume:?}"),
                        &e,
                    ));
                }
            },
        };
        tracing::info!(snapshot = %snapshot_id(volume, &name), csi_name = %req.name, "CSI snapshot created");
        Ok(Response::new(CreateSnapshotResponse {
            snapshot: Some(Self::csi_snapshot(volume, &record)),
        }))
    }

    async fn delete_snapshot(
        &self,
        request: Request<DeleteSnapshotRequest>,
    ) -> Result<Response<DeleteSnapshotResponse>, Status> {
        let id = request.into_inner().snapshot_id;
        require("snapshot_id", &id)?;
        let Some((volume, name)) = parse_snapshot_id(&id) else {
            return Ok(Response::new(DeleteSnapshotResponse {}));
        };
        let _turn = self.turn(&id)?;
        match self.engine.delete_snapshot(volume, name).await {
            Ok(()) | Err(VolumeError::NotFound(_)) | Err(VolumeError::SnapshotNotFound { .. }) => {}
            Err(e) => return Err(from_volume_error(&format!("delete snapshot {id:?}"), &e)),
        }
        if snapshot_names::claimed_by(self.engine.store(), name).await? == Some(volume.to_string())
        {
            snapshot_names::release(self.engine.store(), name).await?;
        }
        tracing::info!(snapshot = %id, "CSI snapshot deleted");
        Ok(Response::new(DeleteSnapshotResponse {}))
    }

    async fn list_snapshots(
        &self,
        request: Request<ListSnapshotsRequest>,
    ) -> Result<Response<ListSnapshotsResponse>, Status> {
        let req = request.into_inner();
        let volumes: Vec<String> = if !req.snapshot_id.is_empty() {
            match parse_snapshot_id(&req.snapshot_id) {
                Some((v, _)) => vec![v.to_string()],
                None => Vec::new(),
            }
        } else if !req.source_volume_id.is_empty() {
            if ids::is_volume_id(&req.source_volume_id) {
                vec![req.source_volume_id.clone()]
            } else {
                Vec::new()
            }
        } else {
            self.engine
                .list_volumes()
                .await
                .map_err(|e| from_volume_error("list volumes", &e))?
                .into_iter()
                .map(|i| i.name)
                .collect()
        };
        let mut all = Vec::new();
        for v in &volumes {
            match self.engine.list_snapshots(v).await {
                Ok(list) => all.extend(
                    list.iter()
                        .filter(|s| !s.deleting)
                        .map(|s| Self::csi_snapshot(v, s)),
                ),
                Err(VolumeError::NotFound(_)) => {}
                Err(e) => {
                    return Err(from_volume_error(
                        &format!("list the snapshots of {v:?}"),
                        &e,
                    ))
                }
            }
        }
        if !req.snapshot_id.is_empty() {
            all.retain(|s| s.snapshot_id == req.snapshot_id);
        }
        all.sort_by(|a, b| a.snapshot_id.cmp(&b.snapshot_id));
        let (snaps, next_token) = page(
            all,
            |s| s.snapshot_id.as_str(),
            &req.starting_token,
            req.max_entries,
        )?;
        let entries = snaps
            .into_iter()
            .map(|s| list_snapshots_response::Entry { snapshot: Some(s) })
            .collect();
        Ok(Response::new(ListSnapshotsResponse {
            entries,
            next_token,
        }))
    }

    async fn controller_expand_volume(
        &self,
        request: Request<ControllerExpandVolumeRequest>,
    ) -> Result<Response<ControllerExpandVolumeResponse>, Status> {
        let req = request.into_inner();
        require("volume_id", &req.volume_id)?;
        let Some(range) = req.capacity_range.as_ref() else {
            return Err(invalid("capacity_range is required: the size to grow to"));
        };
        if !ids::is_volume_id(&req.volume_id) {
            return Err(Status::not_found(format!(
                "volume {:?} does not exist",
                req.volume_id
            )));
        }
        let _turn = self.turn(&req.volume_id)?;
        let info = self.info(&req.volume_id).await?;
        let size = capacity::size_for(Some(range))?;
        if size > info.size_bytes {
            self.grow(&req.volume_id, size).await?;
        }
        let block = req
            .volume_capability
            .as_ref()
            .is_some_and(crate::capabilities::is_block);
        Ok(Response::new(ControllerExpandVolumeResponse {
            capacity_bytes: size.max(info.size_bytes) as i64,
            // A filesystem grows on the node that mounts it.
            node_expansion_required: !block,
        }))
    }
}
