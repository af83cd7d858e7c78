//! A node's block device for a volume: the volume as a file on this
//! process's FUSE mount (`volume_file.rs`), set up as a loop device with
//! direct I/O.
//!
//! Why not the kernel's NBD client: many nodes' kernels have no `nbd`
//! module (managed Kubernetes images, this project's CI machine), and an
//! NBD client learns the size once, so an online expansion would need a
//! reconnect. The loop device re-reads its file's size (`losetup -c`).
//! The cost (README, *Kubernetes*; docs/benchmarks.md): a FUSE round trip
//! per request, about half the NBD export's IOPS on random 4 KiB, and
//! faster than it on sequential 1 MiB.
//!
//! A device lives as long as this process: a loop device cannot be moved
//! to a new file, so after a node plugin restart the old devices are dead
//! (I/O errors in the pods that still have them). [`loop_devices_of`]
//! finds them, and the node service lets go of them when kubelet stages,
//! publishes or unstages the volume again (`node.rs`).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use strata_volume::Volume;

use crate::command::run;

/// Unmount attempts of a volume file while the loop device lets go.
const UNMOUNT_TRIES: u32 = 50;
const UNMOUNT_RETRY: std::time::Duration = std::time::Duration::from_millis(100);
use crate::volume_file::{self, VolumeFile};

/// A volume's device on this node.
#[derive(Debug)]
pub struct Attached {
    /// `/dev/loopN`.
    pub device: PathBuf,
    file: Option<VolumeFile>,
}

/// Mounts `volume`'s file at `mount_dir` (made if missing; must be empty)
/// and sets up a loop device on it.
pub async fn attach(
    volume: Arc<Volume>,
    mount_dir: &Path,
    read_only: bool,
) -> Result<Attached, String> {
    std::fs::create_dir_all(mount_dir)
        .map_err(|e| format!("create {}: {e}", mount_dir.display()))?;
    let runtime = tokio::runtime::Handle::current();
    let dir = mount_dir.to_path_buf();
    let file =
        tokio::task::spawn_blocking(move || volume_file::mount(volume, runtime, &dir, read_only))
            .await
            .map_err(|e| format!("mounting the volume file failed: {e}"))?
            .map_err(|e| format!("mount the volume as a file at {}: {e}", mount_dir.display()))?;
    let path = file.path().to_string_lossy().into_owned();
    let mut args = vec!["--find", "--show", "--direct-io=on"];
    if read_only {
        args.push("--read-only");
    }
    args.push(&path);
    let device = match run("losetup", &args).await {
        Ok(out) => PathBuf::from(out.trim()),
        Err(e) => {
            let mut file = file;
            let _ = tokio::task::spawn_blocking(move || file.unmount()).await;
            return Err(format!("set up a loop device on {path}: {e}"));
        }
    };
    let attached = Attached {
        device,
        file: Some(file),
    };
    if !attached.device.to_string_lossy().starts_with("/dev/loop") {
        let printed = attached.device.display().to_string();
        let _ = attached.detach().await;
        return Err(format!("losetup printed {printed:?}, not a loop device"));
    }
    Ok(attached)
}

/// The loop devices set up on `mount_dir`'s volume file (by this process
/// or, after a restart, by a previous one), from sysfs.
pub fn loop_devices_of(mount_dir: &Path) -> Vec<PathBuf> {
    let file = mount_dir.join(volume_file::FILE_NAME);
    let want = file.to_string_lossy();
    let Ok(entries) = std::fs::read_dir("/sys/block") else {
        return Vec::new();
    };
    let mut devices: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().starts_with("loop"))
        .filter(|e| {
            std::fs::read_to_string(e.path().join("loop/backing_file"))
                .is_ok_and(|b| b.trim_end_matches('\n') == want)
        })
        .map(|e| Path::new("/dev").join(e.file_name()))
        .collect();
    devices.sort();
    devices
}

/// Detaches a loop device; one still open is detached by the kernel at
/// its last close (`losetup -d` sets autoclear).
pub async fn detach_device(device: &Path) -> Result<(), String> {
    run("losetup", &["-d", &device.to_string_lossy()])
        .await
        .map(|_| ())
}

impl Attached {
    /// Makes the device's size the volume's (after a resize).
    pub async fn refresh_size(&self) -> Result<(), String> {
        run("losetup", &["-c", &self.device.to_string_lossy()])
            .await
            .map(|_| ())
    }

    /// Detaches the loop device, then unmounts the file (the kernel lets
    /// go of it asynchronously: a few tries while it is busy; after the
    /// last, it is detached lazily).
    pub async fn detach(mut self) -> Result<(), String> {
        detach_device(&self.device).await?;
        let Some(mut file) = self.file.take() else {
            return Ok(());
        };
        let mut last = String::new();
        for _ in 0..UNMOUNT_TRIES {
            let (back, result) = tokio::task::spawn_blocking(move || {
                let r = file.unmount();
                (file, r)
            })
            .await
            .map_err(|e| format!("unmounting the volume file failed: {e}"))?;
            file = back;
            match result {
                Ok(()) => return Ok(()),
                Err(e) => last = e.to_string(),
            }
            tokio::time::sleep(UNMOUNT_RETRY).await;
        }
        Err(format!("{last} (detached lazily)"))
    }
}
