//! `strata csi`, the Kubernetes CSI driver, without Kubernetes:
//! kubernetes-csi's csi-sanity against its endpoint (block and mount
//! volumes, snapshots, clones, expansion), the calls kubelet and the
//! sidecars make in their order with data written and read back through
//! the device, on the embedded store and on MinIO, and bad input answered
//! with the spec's codes.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use strata_csi::proto::controller_client::ControllerClient;
use strata_csi::proto::node_client::NodeClient;
use strata_csi::proto::volume_capability::access_mode::Mode;
use strata_csi::proto::volume_capability::{AccessMode, AccessType, BlockVolume, MountVolume};
use strata_csi::proto::volume_content_source::{SnapshotSource, Type as SourceType};
use strata_csi::proto::*;
use tonic::transport::{Channel, Endpoint, Uri};

use crate::common;
use common::*;

/// csi-sanity's pinned build (scripts/install-csi-sanity).
const CSI_SANITY_VERSION: &str = "v5.6.0";

fn csi_sanity() -> PathBuf {
    let cache = std::env::var_os("STRATA_TEST_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").expect("HOME")).join(".cache/strata-test")
        });
    let bin = cache
        .join(format!("csi-sanity-{CSI_SANITY_VERSION}"))
        .join("csi-sanity");
    assert!(
        bin.is_file(),
        "{} not found: run scripts/install-csi-sanity (scripts/install-test-deps does)",
        bin.display()
    );
    bin
}

/// Mount volumes here are xfs (`--default-fs-type xfs`): growing a
/// mounted ext4 needs CAP_SYS_RESOURCE, which this machine's sandbox does
/// not give even to root; xfs_growfs needs CAP_SYS_ADMIN only. An xfs
/// filesystem is at least 300 MiB.
const FS_VOLUME_BYTES: u64 = 320 * MIB;
const FS_GROWN_BYTES: u64 = 512 * MIB;

/// Unmounts what a test left mounted under its directory and detaches
/// the loop devices on files there, also when it panics (the driver's
/// FUSE files die with it).
struct Leftovers(PathBuf);

impl Drop for Leftovers {
    fn drop(&mut self) {
        let dir = self.0.display().to_string();
        // Before the unmounts: a loop device on a FUSE file names it only
        // while the FUSE mount is there.
        let loops = Command::new("losetup").arg("-a").output();
        let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
        let mut points: Vec<&str> = mounts
            .lines()
            .filter_map(|l| l.split(' ').nth(1))
            .filter(|m| m.starts_with(&dir))
            .collect();
        points.sort_by_key(|m| std::cmp::Reverse(m.len()));
        for m in points {
            let _ = Command::new("umount").arg("-l").arg(m).status();
        }
        let Ok(out) = loops else {
            return;
        };
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            if let Some((dev, rest)) = line.split_once(':') {
                if rest.contains(&dir) {
                    let _ = Command::new("losetup").arg("-d").arg(dev).status();
                }
            }
        }
    }
}

/// `strata csi` in `dir` as node `node-1`, its endpoint `dir/csi.sock`.
fn start_driver(dir: &Path, target: Target) -> (Server, PathBuf) {
    let endpoint = dir.join("csi.sock");
    let ep = format!("unix://{}", endpoint.display());
    let server = Server::start_csi(
        dir,
        target,
        &[
            "--endpoint",
            &ep,
            "--node-id",
            "node-1",
            "--default-fs-type",
            "xfs",
        ],
    );
    assert!(endpoint.exists(), "no CSI socket at {}", endpoint.display());
    (server, endpoint)
}

fn run_sanity(access: &str) {
    require_tools(&["mkfs.xfs", "xfs_growfs", "losetup", "mount", "blkid"]);
    let _s = serial();
    let dir = tempfile::tempdir().unwrap();
    let _leftovers = Leftovers(dir.path().to_path_buf());
    let (mut server, endpoint) = start_driver(dir.path(), Target::strata());
    let out = run_timeout(
        Command::new(csi_sanity())
            .arg(format!("--csi.endpoint=unix://{}", endpoint.display()))
            .arg(format!("--csi.testvolumeaccesstype={access}"))
            .arg(format!("--csi.testvolumesize={FS_VOLUME_BYTES}"))
            .arg(format!("--csi.testvolumeexpandsize={FS_GROWN_BYTES}"))
            .arg(format!(
                "--csi.mountdir={}",
                dir.path().join("target").display()
            ))
            .arg(format!(
                "--csi.stagingdir={}",
                dir.path().join("staging").display()
            ))
            .arg("-ginkgo.no-color"),
        Duration::from_secs(600),
    );
    let text = format!("{}{}", stdout_str(&out), stderr_str(&out));
    server.assert_alive();
    assert!(
        out.status.success(),
        "csi-sanity ({access} volumes) failed:\n{}\n--- strata csi's log:\n{}",
        tail(&text, 200),
        server.stderr()
    );
    assert!(
        text.contains("Passed"),
        "no summary from csi-sanity:\n{text}"
    );
}

fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

#[test]
fn csi_sanity_passes_for_mount_volumes() {
    run_sanity("mount");
}

#[test]
fn csi_sanity_passes_for_block_volumes() {
    run_sanity("block");
}

// ---------------------------------------------------------------------------
// The calls in kubelet's and the sidecars' order
// ---------------------------------------------------------------------------

async fn channel(endpoint: &Path) -> Channel {
    let path = endpoint.to_path_buf();
    Endpoint::try_from("http://localhost")
        .unwrap()
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let path = path.clone();
            async move {
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(
                    tokio::net::UnixStream::connect(path).await?,
                ))
            }
        }))
        .await
        .unwrap()
}

fn mount_cap() -> VolumeCapability {
    VolumeCapability {
        access_type: Some(AccessType::Mount(MountVolume {
            fs_type: String::new(),
            ..MountVolume::default()
        })),
        access_mode: Some(AccessMode {
            mode: Mode::SingleNodeWriter as i32,
        }),
    }
}

fn block_cap() -> VolumeCapability {
    VolumeCapability {
        access_type: Some(AccessType::Block(BlockVolume {})),
        access_mode: Some(AccessMode {
            mode: Mode::SingleNodeWriter as i32,
        }),
    }
}

fn size(bytes: u64) -> Option<CapacityRange> {
    Some(CapacityRange {
        required_bytes: bytes as i64,
        limit_bytes: 0,
    })
}

struct Kubelet {
    controller: ControllerClient<Channel>,
    node: NodeClient<Channel>,
    dir: PathBuf,
}

impl Kubelet {
    /// The controller's and the node's clients on one driver's endpoint.
    async fn connect(endpoint: &Path, dir: &Path) -> Kubelet {
        let ch = channel(endpoint).await;
        Kubelet {
            controller: ControllerClient::new(ch.clone()),
            node: NodeClient::new(ch),
            dir: dir.to_path_buf(),
        }
    }

    /// The provisioner's CreateVolume; the new volume's id.
    async fn create(&mut self, name: &str, bytes: u64, cap: &VolumeCapability) -> String {
        self.controller
            .create_volume(CreateVolumeRequest {
                name: name.into(),
                capacity_range: size(bytes),
                volume_capabilities: vec![cap.clone()],
                ..Default::default()
            })
            .await
            .unwrap_or_else(|e| panic!("create {name}: {e}"))
            .into_inner()
            .volume
            .unwrap()
            .volume_id
    }

    fn staging(&self, volume: &str) -> PathBuf {
        self.dir.join("staging").join(volume)
    }

    fn target(&self, volume: &str) -> PathBuf {
        self.dir.join("pods").join(volume)
    }

    async fn stage_and_publish(&mut self, volume: &str, cap: &VolumeCapability) -> PathBuf {
        let staging = self.staging(volume);
        std::fs::create_dir_all(&staging).unwrap();
        self.node
            .node_stage_volume(NodeStageVolumeRequest {
                volume_id: volume.into(),
                staging_target_path: staging.display().to_string(),
                volume_capability: Some(cap.clone()),
                ..Default::default()
            })
            .await
            .unwrap();
        let target = self.target(volume);
        std::fs::create_dir_all(target.parent().unwrap()).unwrap();
        self.node
            .node_publish_volume(NodePublishVolumeRequest {
                volume_id: volume.into(),
                staging_target_path: staging.display().to_string(),
                target_path: target.display().to_string(),
                volume_capability: Some(cap.clone()),
                ..Default::default()
            })
            .await
            .unwrap();
        target
    }

    async fn unpublish_and_unstage(&mut self, volume: &str) {
        self.node
            .node_unpublish_volume(NodeUnpublishVolumeRequest {
                volume_id: volume.into(),
                target_path: self.target(volume).display().to_string(),
            })
            .await
            .unwrap();
        assert!(
            !self.target(volume).exists(),
            "unpublish removes the target"
        );
        self.node
            .node_unstage_volume(NodeUnstageVolumeRequest {
                volume_id: volume.into(),
                staging_target_path: self.staging(volume).display().to_string(),
            })
            .await
            .unwrap();
    }
}

/// Bytes of a file of the pod's: 3 MiB of a pattern no two runs share.
fn pattern(seed: u8) -> Vec<u8> {
    (0..3 * MIB as usize)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 12) as u8)
        .collect()
}

fn fs_size_bytes(path: &Path) -> u64 {
    let out = run_ok(
        Command::new("df").arg("--output=size").arg("-B1").arg(path),
        Duration::from_secs(30),
    );
    stdout_str(&out)
        .lines()
        .nth(1)
        .and_then(|l| l.trim().parse().ok())
        .unwrap_or_else(|| panic!("df of {}: {}", path.display(), stdout_str(&out)))
}

async fn kubelet_order(target: Target) {
    let dir = tempfile::tempdir().unwrap();
    let _leftovers = Leftovers(dir.path().to_path_buf());
    let (mut server, endpoint) = start_driver(dir.path(), target);
    let mut k = Kubelet::connect(&endpoint, dir.path()).await;
    // The provisioner: a 320 MiB xfs volume, then kubelet stages and
    // publishes it and the pod writes a file.
    let params = HashMap::from([("compression".to_string(), "lz4".to_string())]);
    let vol = k
        .controller
        .create_volume(CreateVolumeRequest {
            name: "pvc-data".into(),
            capacity_range: size(FS_VOLUME_BYTES),
            volume_capabilities: vec![mount_cap()],
            parameters: params.clone(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    assert_eq!(vol.capacity_bytes, FS_VOLUME_BYTES as i64);
    let id = vol.volume_id.clone();
    let mnt = k.stage_and_publish(&id, &mount_cap()).await;
    let data = pattern(7);
    std::fs::write(mnt.join("file"), &data).unwrap();
    run_ok(
        Command::new("sync").arg("-f").arg(mnt.join("file")),
        Duration::from_secs(60),
    );
    // The snapshotter, then a volume from the snapshot, published beside.
    let snap = k
        .controller
        .create_snapshot(CreateSnapshotRequest {
            source_volume_id: id.clone(),
            name: "snapshot-1".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .snapshot
        .unwrap();
    assert!(snap.ready_to_use);
    let clone = k
        .controller
        .create_volume(CreateVolumeRequest {
            name: "pvc-restored".into(),
            capacity_range: size(FS_VOLUME_BYTES),
            volume_capabilities: vec![mount_cap()],
            volume_content_source: Some(VolumeContentSource {
                r#type: Some(SourceType::Snapshot(SnapshotSource {
                    snapshot_id: snap.snapshot_id.clone(),
                })),
            }),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    let clone_mnt = k.stage_and_publish(&clone.volume_id, &mount_cap()).await;
    assert!(
        std::fs::read(clone_mnt.join("file")).unwrap() == data,
        "the clone reads what the snapshot holds"
    );
    // The resizer, online: the controller grows the volume, the node the
    // filesystem the pod has mounted.
    let before = fs_size_bytes(&mnt);
    let grown = k
        .controller
        .controller_expand_volume(ControllerExpandVolumeRequest {
            volume_id: id.clone(),
            capacity_range: size(FS_GROWN_BYTES),
            volume_capability: Some(mount_cap()),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(grown.capacity_bytes, FS_GROWN_BYTES as i64);
    assert!(grown.node_expansion_required);
    k.node
        .node_expand_volume(NodeExpandVolumeRequest {
            volume_id: id.clone(),
            volume_path: mnt.display().to_string(),
            capacity_range: size(FS_GROWN_BYTES),
            staging_target_path: k.staging(&id).display().to_string(),
            volume_capability: Some(mount_cap()),
            ..Default::default()
        })
        .await
        .unwrap();
    let after = fs_size_bytes(&mnt);
    assert!(
        after > before + 150 * MIB,
        "the filesystem grew online: {before} -> {after} bytes"
    );
    assert!(std::fs::read(mnt.join("file")).unwrap() == data);
    // Stats kubelet shows.
    let stats = k
        .node
        .node_get_volume_stats(NodeGetVolumeStatsRequest {
            volume_id: id.clone(),
            volume_path: mnt.display().to_string(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(
        stats.usage.iter().any(|u| u.used >= 3 * MIB as i64),
        "{stats:?}"
    );
    // Teardown, in kubelet's order, then the provisioner's deletes.
    k.unpublish_and_unstage(&clone.volume_id).await;
    k.unpublish_and_unstage(&id).await;
    for v in [&clone.volume_id, &id] {
        k.controller
            .delete_volume(DeleteVolumeRequest {
                volume_id: v.clone(),
                ..Default::default()
            })
            .await
            .unwrap_or_else(|e| panic!("delete {v}: {e}"));
    }
    let err = k
        .controller
        .delete_snapshot(DeleteSnapshotRequest {
            snapshot_id: snap.snapshot_id.clone(),
            ..Default::default()
        })
        .await;
    assert!(
        err.is_ok(),
        "the snapshot of a deleted volume went with it: {err:?}"
    );
    let left = k
        .controller
        .list_volumes(ListVolumesRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert!(left.entries.is_empty(), "nothing left: {left:?}");
    server.assert_alive();
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

#[test]
fn a_volume_goes_through_kubelets_calls_on_the_embedded_store() {
    require_tools(&["mkfs.xfs", "xfs_growfs", "losetup", "mount", "blkid", "df"]);
    let _s = serial();
    runtime().block_on(kubelet_order(Target::strata()));
}

#[test]
fn a_volume_goes_through_kubelets_calls_on_s3() {
    require_tools(&["mkfs.xfs", "xfs_growfs", "losetup", "mount", "blkid", "df"]);
    let _s = serial();
    let store = S3Store::on_shared_minio("csi");
    runtime().block_on(kubelet_order(Target::strata_s3(&store, &[])));
}

/// Loop devices whose backing file lies under `dir`.
fn loop_devices_under(dir: &Path) -> Vec<String> {
    let out = run_ok(Command::new("losetup").arg("-a"), Duration::from_secs(30));
    let dir = dir.display().to_string();
    stdout_str(&out)
        .lines()
        .filter(|l| l.contains(&dir))
        .filter_map(|l| l.split_once(':').map(|(d, _)| d.to_string()))
        .collect()
}

/// No mount and, within a few seconds (the kernel frees a loop device
/// set to autoclear at its last close), no loop device under `dir`.
fn assert_nothing_attached_under(dir: &Path) {
    let left = mounts_under(dir);
    assert!(left.is_empty(), "mounts left: {left:?}");
    let t0 = std::time::Instant::now();
    let mut devices = loop_devices_under(dir);
    while !devices.is_empty() && t0.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(100));
        devices = loop_devices_under(dir);
    }
    assert!(devices.is_empty(), "loop devices left: {devices:?}");
}

fn mounts_under(dir: &Path) -> Vec<String> {
    let dir = dir.display().to_string();
    std::fs::read_to_string("/proc/self/mounts")
        .unwrap()
        .lines()
        .filter_map(|l| l.split(' ').nth(1))
        .filter(|m| m.starts_with(&dir))
        .map(str::to_string)
        .collect()
}

/// The node plugin killed with a volume staged and published (a crash, an
/// upgrade of the DaemonSet): its loop device and FUSE file die with it.
/// The restarted plugin stages the volume again when kubelet publishes it
/// to a new pod (kubelet does not stage again), the pod reads what was
/// synced before the kill, and unpublish + unstage leave no mount and no
/// loop device of either run.
async fn node_plugin_restart(server: &mut Server, endpoint: &Path, dir: &Path) {
    let mut k = Kubelet::connect(endpoint, dir).await;
    let id = k.create("pvc-restart", FS_VOLUME_BYTES, &mount_cap()).await;
    let mnt = k.stage_and_publish(&id, &mount_cap()).await;
    let data = pattern(11);
    std::fs::write(mnt.join("file"), &data).unwrap();
    run_ok(
        Command::new("sync").arg("-f").arg(mnt.join("file")),
        Duration::from_secs(60),
    );
    assert_eq!(loop_devices_under(dir).len(), 1);
    server.crash_restart();
    k = Kubelet::connect(endpoint, dir).await;
    // A new pod on this node: kubelet publishes from the staging path it
    // staged before the restart.
    let new_target = dir.join("pods").join("new-pod");
    k.node
        .node_publish_volume(NodePublishVolumeRequest {
            volume_id: id.clone(),
            staging_target_path: k.staging(&id).display().to_string(),
            target_path: new_target.display().to_string(),
            volume_capability: Some(mount_cap()),
            ..Default::default()
        })
        .await
        .unwrap();
    assert!(
        std::fs::read(new_target.join("file")).unwrap() == data,
        "the new pod reads what was synced before the kill"
    );
    // The old pod goes, then the new one, then the volume.
    k.node
        .node_unpublish_volume(NodeUnpublishVolumeRequest {
            volume_id: id.clone(),
            target_path: new_target.display().to_string(),
        })
        .await
        .unwrap();
    k.unpublish_and_unstage(&id).await;
    assert_nothing_attached_under(dir);
    server.assert_alive();
}

/// A plugin killed with a volume staged, restarted, then told to unstage
/// it (the pod went while it was down): the dead mount, device and FUSE
/// file go.
async fn unstage_after_a_restart(server: &mut Server, endpoint: &Path, dir: &Path) {
    let mut k = Kubelet::connect(endpoint, dir).await;
    let id = k.create("pvc-unstage", FS_VOLUME_BYTES, &block_cap()).await;
    k.stage_and_publish(&id, &block_cap()).await;
    server.crash_restart();
    k = Kubelet::connect(endpoint, dir).await;
    k.unpublish_and_unstage(&id).await;
    assert_nothing_attached_under(dir);
}

#[test]
fn a_restarted_node_plugin_lets_go_of_its_dead_devices() {
    require_tools(&["mkfs.xfs", "losetup", "mount", "blkid", "sync"]);
    let _s = serial();
    let dir = tempfile::tempdir().unwrap();
    let _leftovers = Leftovers(dir.path().to_path_buf());
    let (mut server, endpoint) = start_driver(dir.path(), Target::strata());
    let rt = runtime();
    rt.block_on(node_plugin_restart(&mut server, &endpoint, dir.path()));
    rt.block_on(unstage_after_a_restart(&mut server, &endpoint, dir.path()));
    server.stop();
}

/// A cluster on S3: the controller on one node (A), a pod's volume staged
/// on another (B). Only B may write the volume's manifest, so A asks B
/// for the snapshot and the expansion; with B's control socket gone, as
/// on another machine, through B's host record in the store (B renews,
/// and finds requests, every second with a 3 s TTL). The clone made from
/// that snapshot reads what the pod wrote; the device grows online.
#[test]
fn a_volume_in_use_on_another_node_is_snapshotted_and_grown_by_that_node() {
    require_tools(&["losetup", "mount", "blockdev"]);
    let _s = serial();
    let store = S3Store::on_shared_minio("csi-two-nodes");
    let tmp = tempfile::tempdir().unwrap();
    let _leftovers = Leftovers(tmp.path().to_path_buf());
    let driver = |name: &str, role: &str| {
        let dir = tmp.path().join(name);
        std::fs::create_dir_all(&dir).unwrap();
        let endpoint = dir.join("csi.sock");
        let ep = format!("unix://{}", endpoint.display());
        let node_id = format!("node-{name}");
        let server = Server::start_csi(
            &dir,
            Target::strata_s3(&store, &[]),
            &[
                role,
                "--endpoint",
                &ep,
                "--node-id",
                &node_id,
                "--lease-ttl-ms",
                "3000",
            ],
        );
        (server, endpoint)
    };
    let (mut a, a_endpoint) = driver("a", "--controller");
    let (mut b, b_endpoint) = driver("b", "--node");
    runtime().block_on(async {
        let mut k = Kubelet {
            controller: ControllerClient::new(channel(&a_endpoint).await),
            node: NodeClient::new(channel(&b_endpoint).await),
            dir: tmp.path().join("b"),
        };
        let create = |name: &str, source: Option<VolumeContentSource>| CreateVolumeRequest {
            name: name.into(),
            capacity_range: size(64 * MIB),
            volume_capabilities: vec![block_cap()],
            volume_content_source: source,
            ..Default::default()
        };
        k.controller
            .create_volume(create("pvc-busy", None))
            .await
            .unwrap();
        let device = k.stage_and_publish("pvc-busy", &block_cap()).await;
        let data = pattern(23);
        {
            use std::io::{Seek, SeekFrom, Write};
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .open(&device)
                .unwrap();
            f.seek(SeekFrom::Start(8 * MIB)).unwrap();
            f.write_all(&data).unwrap();
            f.sync_all().unwrap();
        }
        let socket = b.data_dir().join("control.sock");
        std::fs::remove_file(&socket)
            .unwrap_or_else(|e| panic!("remove {}: {e}", socket.display()));
        let snap = k
            .controller
            .create_snapshot(CreateSnapshotRequest {
                source_volume_id: "pvc-busy".into(),
                name: "while-in-use".into(),
                ..Default::default()
            })
            .await
            .unwrap_or_else(|e| panic!("snapshot of a volume node B holds: {e}"))
            .into_inner()
            .snapshot
            .unwrap();
        assert!(snap.ready_to_use);
        let source = VolumeContentSource {
            r#type: Some(SourceType::Snapshot(SnapshotSource {
                snapshot_id: snap.snapshot_id.clone(),
            })),
        };
        k.controller
            .create_volume(create("pvc-copy", Some(source)))
            .await
            .unwrap();
        let copy = k.stage_and_publish("pvc-copy", &block_cap()).await;
        let read = {
            use std::io::{Read, Seek, SeekFrom};
            let mut f = std::fs::File::open(&copy).unwrap();
            f.seek(SeekFrom::Start(8 * MIB)).unwrap();
            let mut buf = vec![0u8; data.len()];
            f.read_exact(&mut buf).unwrap();
            buf
        };
        assert!(
            read == data,
            "the clone reads what the pod wrote before the snapshot"
        );
        let grown = k
            .controller
            .controller_expand_volume(ControllerExpandVolumeRequest {
                volume_id: "pvc-busy".into(),
                capacity_range: size(128 * MIB),
                volume_capability: Some(block_cap()),
                ..Default::default()
            })
            .await
            .unwrap_or_else(|e| panic!("expansion of a volume node B holds: {e}"))
            .into_inner();
        assert_eq!(grown.capacity_bytes, (128 * MIB) as i64);
        k.node
            .node_expand_volume(NodeExpandVolumeRequest {
                volume_id: "pvc-busy".into(),
                volume_path: device.display().to_string(),
                capacity_range: size(128 * MIB),
                staging_target_path: k.staging("pvc-busy").display().to_string(),
                volume_capability: Some(block_cap()),
                ..Default::default()
            })
            .await
            .unwrap();
        let out = run_ok(
            Command::new("blockdev").arg("--getsize64").arg(&device),
            Duration::from_secs(30),
        );
        assert_eq!(
            stdout_str(&out).trim(),
            (128 * MIB).to_string(),
            "the pod's device grew"
        );
        k.unpublish_and_unstage("pvc-copy").await;
        k.unpublish_and_unstage("pvc-busy").await;
        for v in ["pvc-copy", "pvc-busy"] {
            k.controller
                .delete_volume(DeleteVolumeRequest {
                    volume_id: v.into(),
                    ..Default::default()
                })
                .await
                .unwrap_or_else(|e| panic!("delete {v}: {e}"));
        }
    });
    a.assert_alive();
    b.assert_alive();
    let b_log = b.stderr();
    assert!(
        b_log.contains("request through the store"),
        "node B got the requests through the store: {}",
        tail(&b_log, 30)
    );
}

// ---------------------------------------------------------------------------
// Bad input
// ---------------------------------------------------------------------------

/// A snapshot asked for while its volume is being deleted (every store
/// call 300 ms late here, so the delete takes seconds): ABORTED, as the
/// spec names for an operation pending on the volume; once the delete
/// ends, NOT_FOUND; and neither leaves the snapshot's name claimed.
#[test]
fn a_snapshot_of_a_volume_being_deleted_is_refused_and_claims_nothing() {
    let _s = serial();
    let dir = tempfile::tempdir().unwrap();
    let _leftovers = Leftovers(dir.path().to_path_buf());
    let target = Target::strata().with_env("STRATA_FAULTS", "latency_ms=300");
    let (mut server, endpoint) = start_driver(dir.path(), target);
    runtime().block_on(async {
        let ch = channel(&endpoint).await;
        let mut c = ControllerClient::new(ch.clone());
        c.create_volume(CreateVolumeRequest {
            name: "doomed".into(),
            capacity_range: size(MIB),
            volume_capabilities: vec![block_cap()],
            ..Default::default()
        })
        .await
        .unwrap();
        let mut deleter = ControllerClient::new(ch.clone());
        let delete = tokio::spawn(async move {
            deleter
                .delete_volume(DeleteVolumeRequest {
                    volume_id: "doomed".into(),
                    ..Default::default()
                })
                .await
        });
        tokio::time::sleep(Duration::from_millis(400)).await;
        assert!(!delete.is_finished(), "the delete is still running");
        let snap = CreateSnapshotRequest {
            source_volume_id: "doomed".into(),
            name: "last-words".into(),
            ..Default::default()
        };
        let e = c.create_snapshot(snap.clone()).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::Aborted, "{e}");
        assert!(e.message().contains("try again"), "{e}");
        delete.await.unwrap().unwrap();
        let e = c.create_snapshot(snap).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::NotFound, "{e}");
        let listed = c
            .list_snapshots(ListSnapshotsRequest::default())
            .await
            .unwrap()
            .into_inner();
        assert!(listed.entries.is_empty(), "{listed:?}");
    });
    let claims = server.store_dir().join(".csi/snapshot-names");
    let claimed: Vec<_> = std::fs::read_dir(&claims)
        .map(|d| d.filter_map(Result::ok).map(|e| e.file_name()).collect())
        .unwrap_or_default();
    assert!(
        claimed.is_empty(),
        "claims left in {}: {claimed:?}",
        claims.display()
    );
    server.assert_alive();
}

#[test]
fn bad_input_gets_the_specs_code_and_leaves_nothing_made() {
    let _s = serial();
    let dir = tempfile::tempdir().unwrap();
    let _leftovers = Leftovers(dir.path().to_path_buf());
    let (mut server, endpoint) = start_driver(dir.path(), Target::strata());
    runtime().block_on(async {
        let ch = channel(&endpoint).await;
        let mut c = ControllerClient::new(ch.clone());
        let mut n = NodeClient::new(ch);
        let create = |name: &str, params: &[(&str, &str)], bytes: u64| CreateVolumeRequest {
            name: name.into(),
            capacity_range: size(bytes),
            volume_capabilities: vec![block_cap()],
            parameters: params
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            ..Default::default()
        };
        // An unknown parameter: named, with what is accepted.
        let e = c
            .create_volume(create("v1", &[("replicas", "3")], MIB))
            .await
            .unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e}");
        assert!(
            e.message().contains("replicas") && e.message().contains("compression"),
            "{e}"
        );
        // Over the largest volume.
        let e = c
            .create_volume(create("v2", &[], 1 << 51))
            .await
            .unwrap_err();
        assert_eq!(e.code(), tonic::Code::OutOfRange, "{e}");
        // encrypted=true on a driver without a key.
        let e = c
            .create_volume(create("v3", &[("encrypted", "true")], MIB))
            .await
            .unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e}");
        assert!(e.message().contains("--key-file"), "{e}");
        let listed = c
            .list_volumes(ListVolumesRequest::default())
            .await
            .unwrap()
            .into_inner();
        assert!(listed.entries.is_empty(), "nothing made: {listed:?}");
        // The same name again with another size.
        c.create_volume(create("v4", &[], MIB)).await.unwrap();
        let e = c
            .create_volume(create("v4", &[], 2 * MIB))
            .await
            .unwrap_err();
        assert_eq!(e.code(), tonic::Code::AlreadyExists, "{e}");
        // A snapshot name taken by another volume's snapshot.
        c.create_volume(create("v5", &[], MIB)).await.unwrap();
        let snap = |v: &str| CreateSnapshotRequest {
            source_volume_id: v.into(),
            name: "daily".into(),
            ..Default::default()
        };
        c.create_snapshot(snap("v4")).await.unwrap();
        c.create_snapshot(snap("v4")).await.expect("idempotent");
        let e = c.create_snapshot(snap("v5")).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::AlreadyExists, "{e}");
        assert!(e.message().contains("v4"), "{e}");
        // A snapshot of a volume that does not exist.
        let e = c.create_snapshot(snap("gone")).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::NotFound, "{e}");
        // A publish to a path that is a file, for a mount volume.
        c.create_volume(CreateVolumeRequest {
            volume_capabilities: vec![mount_cap()],
            ..create("v6", &[], FS_VOLUME_BYTES)
        })
        .await
        .unwrap();
        let staging = dir.path().join("staging-v6");
        std::fs::create_dir_all(&staging).unwrap();
        n.node_stage_volume(NodeStageVolumeRequest {
            volume_id: "v6".into(),
            staging_target_path: staging.display().to_string(),
            volume_capability: Some(mount_cap()),
            ..Default::default()
        })
        .await
        .unwrap();
        let file = dir.path().join("a-file");
        std::fs::write(&file, b"not a directory").unwrap();
        let e = n
            .node_publish_volume(NodePublishVolumeRequest {
                volume_id: "v6".into(),
                staging_target_path: staging.display().to_string(),
                target_path: file.display().to_string(),
                volume_capability: Some(mount_cap()),
                ..Default::default()
            })
            .await
            .unwrap_err();
        assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{e}");
        assert!(e.message().contains("not a directory"), "{e}");
        assert_eq!(
            std::fs::read(&file).unwrap(),
            b"not a directory",
            "left alone"
        );
        // A volume in use is not deleted.
        let e = c
            .delete_volume(DeleteVolumeRequest {
                volume_id: "v6".into(),
                ..Default::default()
            })
            .await
            .unwrap_err();
        assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{e}");
        n.node_unstage_volume(NodeUnstageVolumeRequest {
            volume_id: "v6".into(),
            staging_target_path: staging.display().to_string(),
        })
        .await
        .unwrap();
    });
    server.assert_alive();
}
