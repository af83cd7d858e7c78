//! The Node service: kubelet's calls on the node a pod runs on. Stage
//! opens the volume here and gives it a device (`attach.rs`), and for a
//! mount volume a filesystem mounted at the staging path; publish
//! bind-mounts that (or the device) where the pod's container sees it;
//! unpublish and unstage undo each step that is there and succeed when
//! nothing is.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use parking_lot::Mutex;
use strata_volume::{Engine, VolumeError};
use tokio::sync::Mutex as AsyncMutex;
use tonic::{Request, Response, Status};

use crate::attach::{self, Attached};
use crate::capabilities::{self, fs_type, is_block, is_read_only};
use crate::controller::TOPOLOGY_HOST_KEY;
use crate::driver_config::DriverConfig;
use crate::ids;
use crate::mounts;
use crate::proto::node_server::Node;
use crate::proto::node_service_capability::{self, rpc};
use crate::proto::volume_capability::access_mode::Mode;
use crate::proto::*;
use crate::status::{from_volume_error, invalid, require};

/// A volume staged on this node.
struct Staged {
    staging_path: PathBuf,
    attached: Attached,
    /// The filesystem mounted at the staging path (`None`: block).
    fs_type: Option<String>,
    /// Where it is published, and whether one writer only may have it.
    targets: HashSet<PathBuf>,
    single_writer: bool,
}

pub struct NodeService {
    engine: Arc<Engine>,
    config: Arc<DriverConfig>,
    /// Where volume files are mounted (`<data-dir>/csi/files/<volume>`).
    files_dir: PathBuf,
    staged: Mutex<HashMap<String, Arc<AsyncMutex<Option<Staged>>>>>,
}

fn internal(what: &str, e: impl std::fmt::Display) -> Status {
    Status::internal(format!("{what}: {e}"))
}

impl NodeService {
    pub fn new(engine: Arc<Engine>, config: Arc<DriverConfig>) -> NodeService {
        let files_dir = engine.config().data_dir.join("csi").join("files");
        NodeService {
            engine,
            config,
            files_dir,
            staged: Mutex::new(HashMap::new()),
        }
    }

    /// The volume's slot: calls on one volume run one at a time.
    fn slot(&self, volume: &str) -> Arc<AsyncMutex<Option<Staged>>> {
        self.staged
            .lock()
            .entry(volume.to_string())
            .or_default()
            .clone()
    }

    /// Drops the volume's slot once unstaged, unless another call waits
    /// on it (the map would otherwise keep one entry per volume ever seen).
    fn forget_slot(&self, volume: &str) {
        let mut map = self.staged.lock();
        let unused = map
            .get(volume)
            .is_some_and(|s| Arc::strong_count(s) == 1 && s.try_lock().is_ok_and(|g| g.is_none()));
        if unused {
            map.remove(volume);
        }
    }

    fn check_volume_id(id: &str) -> Result<(), Status> {
        require("volume_id", id)?;
        if !ids::is_volume_id(id) {
            return Err(Status::not_found(format!("volume {id:?} does not exist")));
        }
        Ok(())
    }

    /// Opens the volume here, attaches it, and for a mount volume makes
    /// its filesystem if it has none and mounts it at `staging`.
    async fn stage(
        &self,
        id: &str,
        staging: &Path,
        cap: &VolumeCapability,
    ) -> Result<Staged, Status> {
        let volume = self.engine.open_volume(id).await.map_err(|e| match e {
            VolumeError::NotFound(_) => Status::not_found(format!("volume {id:?} does not exist")),
            e => from_volume_error(
                &format!("open volume {id:?} on node {}", self.config.node_id),
                &e,
            ),
        })?;
        let read_only = is_read_only(cap);
        let attached = match attach::attach(volume, &self.files_dir.join(id), read_only).await {
            Ok(a) => a,
            Err(e) => {
                let _ = self.engine.close_volume(id).await;
                return Err(internal(&format!("attach volume {id:?}"), e));
            }
        };
        let fs = fs_type(cap, &self.config.default_fs_type).map(str::to_string);
        if let Some(fs) = &fs {
            if let Err(e) = self
                .mount_fs(&attached.device, staging, fs, cap, read_only)
                .await
            {
                let _ = attached.detach().await;
                let _ = self.engine.close_volume(id).await;
                return Err(e);
            }
        }
        Ok(Staged {
            staging_path: staging.to_path_buf(),
            attached,
            fs_type: fs,
            targets: HashSet::new(),
            single_writer: cap
                .access_mode
                .as_ref()
                .is_some_and(|m| m.mode == Mode::SingleNodeSingleWriter as i32),
        })
    }

    /// Lets go of what a previous run of this node plugin left of volume
    /// `id` (it was restarted or killed with the volume staged): the
    /// filesystem mounted at `staging` from the volume's loop device, the
    /// loop devices, the volume file's dead FUSE mount. Their I/O died
    /// with that process, so nothing of them is reused; pods that still
    /// have them get I/O errors until they restart. Whether any was found.
    async fn clear_leftovers(&self, id: &str, staging: Option<&Path>) -> Result<bool, Status> {
        let files = self.files_dir.join(id);
        let devices = attach::loop_devices_of(&files);
        let fuse_mounted =
            mounts::is_mount_point(&files).map_err(|e| internal("read the mounts", e))?;
        if devices.is_empty() && !fuse_mounted {
            return Ok(false);
        }
        tracing::warn!(volume = %id, devices = ?devices, "a previous node plugin left this volume attached: its devices are dead; detaching them");
        if let Some(staging) = staging {
            let source =
                mounts::mount_source(staging).map_err(|e| internal("read the mounts", e))?;
            if source.is_some_and(|src| devices.iter().any(|d| d.as_os_str() == src.as_str())) {
                mounts::unmount_lazily(staging).await.map_err(|e| {
                    internal(
                        &format!("unmount the dead filesystem at {}", staging.display()),
                        e,
                    )
                })?;
            }
        }
        for device in &devices {
            attach::detach_device(device)
                .await
                .map_err(|e| internal(&format!("detach the dead {}", device.display()), e))?;
        }
        mounts::unmount_lazily(&files).await.map_err(|e| {
            internal(
                &format!("unmount the dead volume file at {}", files.display()),
                e,
            )
        })?;
        Ok(true)
    }

    async fn mount_fs(
        &self,
        device: &Path,
        staging: &Path,
        fs: &str,
        cap: &VolumeCapability,
        read_only: bool,
    ) -> Result<(), Status> {
        match mounts::fs_type_of(device).await.map_err(|e| internal("look for a filesystem", e))? {
            None if read_only => {
                return Err(Status::failed_precondition(format!(
                    "the volume has no filesystem and is staged read-only: stage it writable once so a {fs} filesystem is made"
                )))
            }
            None => mounts::make_fs(device, fs).await.map_err(|e| internal("make the filesystem", e))?,
            Some(have) if have == fs => {}
            Some(have) => {
                return Err(Status::failed_precondition(format!(
                    "the volume holds a {have} filesystem, not the {fs} the capability asks for"
                )))
            }
        }
        std::fs::create_dir_all(staging)
            .map_err(|e| internal(&format!("create {}", staging.display()), e))?;
        let mut options = match &cap.access_type {
            Some(volume_capability::AccessType::Mount(m)) => m.mount_flags.clone(),
            _ => Vec::new(),
        };
        if read_only {
            options.push("ro".to_string());
        }
        if fs == "xfs" && !options.iter().any(|o| o == "nouuid") {
            // A clone's filesystem is its source's, UUID included, and
            // xfs refuses a second mount of a UUID on one host.
            options.push("nouuid".to_string());
        }
        mounts::mount(device, staging, fs, &options)
            .await
            .map_err(|e| internal("mount the filesystem", e))
    }
}

fn capability(t: rpc::Type) -> NodeServiceCapability {
    NodeServiceCapability {
        r#type: Some(node_service_capability::Type::Rpc(
            node_service_capability::Rpc { r#type: t as i32 },
        )),
    }
}

/// What is at `path`: nothing, a directory, or something else.
enum PathKind {
    Missing,
    Dir,
    File,
    Other,
}

fn path_kind(path: &Path) -> Result<PathKind, Status> {
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.is_dir() => Ok(PathKind::Dir),
        Ok(m) if m.is_file() => Ok(PathKind::File),
        Ok(_) => Ok(PathKind::Other),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(PathKind::Missing),
        Err(e) => Err(internal(&format!("look at {}", path.display()), e)),
    }
}

#[tonic::async_trait]
impl Node for NodeService {
    async fn node_stage_volume(
        &self,
        request: Request<NodeStageVolumeRequest>,
    ) -> Result<Response<NodeStageVolumeResponse>, Status> {
        let req = request.into_inner();
        Self::check_volume_id(&req.volume_id)?;
        require("staging_target_path", &req.staging_target_path)?;
        let cap = req
            .volume_capability
            .as_ref()
            .ok_or_else(|| invalid("volume_capability is required"))?;
        capabilities::check(cap).map_err(invalid)?;
        let staging = PathBuf::from(&req.staging_target_path);
        let slot = self.slot(&req.volume_id);
        let mut slot = slot.lock().await;
        if let Some(s) = slot.as_ref() {
            if s.staging_path == staging {
                return Ok(Response::new(NodeStageVolumeResponse {}));
            }
            return Err(Status::failed_precondition(format!(
                "volume {:?} is staged at {} already",
                req.volume_id,
                s.staging_path.display()
            )));
        }
        self.clear_leftovers(&req.volume_id, Some(&staging)).await?;
        let staged = self.stage(&req.volume_id, &staging, cap).await?;
        tracing::info!(volume = %req.volume_id, device = %staged.attached.device.display(), staging = %staging.display(), fs = ?staged.fs_type, "CSI volume staged");
        *slot = Some(staged);
        Ok(Response::new(NodeStageVolumeResponse {}))
    }

    async fn node_unstage_volume(
        &self,
        request: Request<NodeUnstageVolumeRequest>,
    ) -> Result<Response<NodeUnstageVolumeResponse>, Status> {
        let req = request.into_inner();
        require("volume_id", &req.volume_id)?;
        require("staging_target_path", &req.staging_target_path)?;
        if !ids::is_volume_id(&req.volume_id) {
            return Ok(Response::new(NodeUnstageVolumeResponse {}));
        }
        let entry = self.slot(&req.volume_id);
        let mut slot = entry.lock().await;
        let Some(staged) = slot.take() else {
            let staging = PathBuf::from(&req.staging_target_path);
            self.clear_leftovers(&req.volume_id, Some(&staging)).await?;
            drop(slot);
            drop(entry);
            self.forget_slot(&req.volume_id);
            return Ok(Response::new(NodeUnstageVolumeResponse {}));
        };
        if staged.fs_type.is_some() {
            if let Err(e) = mounts::unmount(&staged.staging_path).await {
                *slot = Some(staged);
                return Err(internal("unmount the staging path", e));
            }
        }
        let device = staged.attached.device.clone();
        staged
            .attached
            .detach()
            .await
            .map_err(|e| internal(&format!("detach {}", device.display()), e))?;
        self.engine
            .close_volume(&req.volume_id)
            .await
            .map_err(|e| from_volume_error(&format!("close volume {:?}", req.volume_id), &e))?;
        tracing::info!(volume = %req.volume_id, "CSI volume unstaged");
        drop(slot);
        drop(entry);
        self.forget_slot(&req.volume_id);
        Ok(Response::new(NodeUnstageVolumeResponse {}))
    }

    async fn node_publish_volume(
        &self,
        request: Request<NodePublishVolumeRequest>,
    ) -> Result<Response<NodePublishVolumeResponse>, Status> {
        let req = request.into_inner();
        Self::check_volume_id(&req.volume_id)?;
        if req.staging_target_path.is_empty() {
            return Err(invalid(
                "staging_target_path is required (this driver stages volumes)",
            ));
        }
        require("target_path", &req.target_path)?;
        let cap = req
            .volume_capability
            .as_ref()
            .ok_or_else(|| invalid("volume_capability is required"))?;
        capabilities::check(cap).map_err(invalid)?;
        let target = PathBuf::from(&req.target_path);
        let slot = self.slot(&req.volume_id);
        let mut slot = slot.lock().await;
        if slot.is_none() {
            // Staged by a previous run of this plugin (kubelet does not
            // stage again): stage anew where it was.
            let staging = PathBuf::from(&req.staging_target_path);
            if !self.clear_leftovers(&req.volume_id, Some(&staging)).await? {
                return Err(Status::failed_precondition(format!(
                    "volume {:?} is not staged on node {}: NodeStageVolume first",
                    req.volume_id, self.config.node_id
                )));
            }
            let staged = self.stage(&req.volume_id, &staging, cap).await?;
            tracing::info!(volume = %req.volume_id, staging = %staging.display(), "CSI volume staged again after a node plugin restart");
            *slot = Some(staged);
        }
        let Some(staged) = slot.as_mut() else {
            return Err(internal("publish", "the volume's stage vanished"));
        };
        if staged.targets.contains(&target) {
            return Ok(Response::new(NodePublishVolumeResponse {}));
        }
        if staged.single_writer && !staged.targets.is_empty() {
            return Err(Status::failed_precondition(format!(
                "volume {:?} is SINGLE_NODE_SINGLE_WRITER and published at another target already",
                req.volume_id
            )));
        }
        let read_only = req.readonly || is_read_only(cap);
        let block = is_block(cap);
        match (path_kind(&target)?, block) {
            (PathKind::Missing, true) => {
                std::fs::File::create(&target).map_err(|e| internal(&format!("create {}", target.display()), e))?;
            }
            (PathKind::Missing, false) => {
                std::fs::create_dir(&target).map_err(|e| internal(&format!("create {}", target.display()), e))?;
            }
            (PathKind::File, true) | (PathKind::Dir, false) => {}
            (_, true) => {
                return Err(Status::failed_precondition(format!(
                    "target_path {} exists and is not a file: a block volume is published on a file",
                    target.display()
                )))
            }
            (_, false) => {
                return Err(Status::failed_precondition(format!(
                    "target_path {} exists and is not a directory: a mount volume is published on a directory",
                    target.display()
                )))
            }
        }
        let source = if block {
            staged.attached.device.clone()
        } else {
            staged.staging_path.clone()
        };
        mounts::bind(&source, &target, read_only)
            .await
            .map_err(|e| {
                internal(
                    &format!("bind {} on {}", source.display(), target.display()),
                    e,
                )
            })?;
        staged.targets.insert(target);
        Ok(Response::new(NodePublishVolumeResponse {}))
    }

    async fn node_unpublish_volume(
        &self,
        request: Request<NodeUnpublishVolumeRequest>,
    ) -> Result<Response<NodeUnpublishVolumeResponse>, Status> {
        let req = request.into_inner();
        require("volume_id", &req.volume_id)?;
        require("target_path", &req.target_path)?;
        let target = PathBuf::from(&req.target_path);
        mounts::unmount(&target)
            .await
            .map_err(|e| internal(&format!("unmount {}", target.display()), e))?;
        match path_kind(&target)? {
            PathKind::Missing => {}
            PathKind::Dir => std::fs::remove_dir(&target)
                .map_err(|e| internal(&format!("remove {}", target.display()), e))?,
            _ => std::fs::remove_file(&target)
                .map_err(|e| internal(&format!("remove {}", target.display()), e))?,
        }
        if ids::is_volume_id(&req.volume_id) {
            if let Some(staged) = self.slot(&req.volume_id).lock().await.as_mut() {
                staged.targets.remove(&target);
            }
        }
        Ok(Response::new(NodeUnpublishVolumeResponse {}))
    }

    async fn node_get_volume_stats(
        &self,
        request: Request<NodeGetVolumeStatsRequest>,
    ) -> Result<Response<NodeGetVolumeStatsResponse>, Status> {
        let req = request.into_inner();
        Self::check_volume_id(&req.volume_id)?;
        require("volume_path", &req.volume_path)?;
        let path = PathBuf::from(&req.volume_path);
        let slot = self.slot(&req.volume_id);
        let slot = slot.lock().await;
        let Some(staged) = slot.as_ref() else {
            return Err(Status::not_found(format!(
                "volume {:?} is not staged on node {}",
                req.volume_id, self.config.node_id
            )));
        };
        if !staged.targets.contains(&path) && staged.staging_path != path {
            return Err(Status::not_found(format!(
                "volume {:?} is not published at {}",
                req.volume_id,
                path.display()
            )));
        }
        let usage = if staged.fs_type.is_some() {
            let s = crate::fs_stats::statvfs(&path)
                .map_err(|e| internal(&format!("statvfs {}", path.display()), e))?;
            vec![
                VolumeUsage {
                    available: s.available_bytes as i64,
                    total: s.total_bytes as i64,
                    used: s.used_bytes as i64,
                    unit: volume_usage::Unit::Bytes as i32,
                },
                VolumeUsage {
                    available: s.available_inodes as i64,
                    total: s.total_inodes as i64,
                    used: s.used_inodes as i64,
                    unit: volume_usage::Unit::Inodes as i32,
                },
            ]
        } else {
            let size = self
                .engine
                .served(&req.volume_id)
                .map(|v| v.size_bytes())
                .unwrap_or_default();
            vec![VolumeUsage {
                available: 0,
                total: size as i64,
                used: 0,
                unit: volume_usage::Unit::Bytes as i32,
            }]
        };
        Ok(Response::new(NodeGetVolumeStatsResponse { usage }))
    }

    async fn node_expand_volume(
        &self,
        request: Request<NodeExpandVolumeRequest>,
    ) -> Result<Response<NodeExpandVolumeResponse>, Status> {
        let req = request.into_inner();
        Self::check_volume_id(&req.volume_id)?;
        require("volume_path", &req.volume_path)?;
        let slot = self.slot(&req.volume_id);
        let slot = slot.lock().await;
        let Some(staged) = slot.as_ref() else {
            return Err(Status::not_found(format!(
                "volume {:?} is not staged on node {}",
                req.volume_id, self.config.node_id
            )));
        };
        let size = self
            .engine
            .served(&req.volume_id)
            .map(|v| v.size_bytes())
            .unwrap_or_default();
        if let Some(range) = &req.capacity_range {
            if range.required_bytes > 0 && (range.required_bytes as u64) > size {
                return Err(Status::out_of_range(format!(
                    "volume {:?} is {size} bytes, less than the {} asked for: ControllerExpandVolume first",
                    req.volume_id, range.required_bytes
                )));
            }
        }
        staged
            .attached
            .refresh_size()
            .await
            .map_err(|e| internal("refresh the device's size", e))?;
        if staged.fs_type.is_some() {
            mounts::grow_fs(&staged.attached.device, &staged.staging_path)
                .await
                .map_err(|e| internal("grow the filesystem", e))?;
        }
        Ok(Response::new(NodeExpandVolumeResponse {
            capacity_bytes: size as i64,
        }))
    }

    async fn node_get_capabilities(
        &self,
        _request: Request<NodeGetCapabilitiesRequest>,
    ) -> Result<Response<NodeGetCapabilitiesResponse>, Status> {
        Ok(Response::new(NodeGetCapabilitiesResponse {
            capabilities: vec![
                capability(rpc::Type::StageUnstageVolume),
                capability(rpc::Type::GetVolumeStats),
                capability(rpc::Type::ExpandVolume),
                capability(rpc::Type::SingleNodeMultiWriter),
            ],
        }))
    }

    async fn node_get_info(
        &self,
        _request: Request<NodeGetInfoRequest>,
    ) -> Result<Response<NodeGetInfoResponse>, Status> {
        let accessible_topology = self.config.local_store.as_ref().map(|_| Topology {
            segments: HashMap::from([(TOPOLOGY_HOST_KEY.to_string(), self.config.node_id.clone())]),
        });
        Ok(Response::new(NodeGetInfoResponse {
            node_id: self.config.node_id.clone(),
            max_volumes_per_node: 0,
            accessible_topology,
        }))
    }
}
