//! `strata serve --loop-dir DIR`: every served volume also as a block
//! device of this host, for hosts whose kernel has no `nbd` module. The
//! device is the CSI node's (`strata_csi::attach`): the volume as the file
//! DIR/VOLUME/disk on a FUSE mount of this process, on a loop device with
//! direct I/O. Its cost against the NBD export is in docs/benchmarks.md
//! (the `strata-embedded-loop` rows).

use std::path::Path;

use anyhow::{bail, Context};
use strata_csi::Attached;
use strata_volume::Engine;

/// The devices of one server, detached at shutdown.
pub struct LoopDevices {
    attached: Vec<(String, Attached)>,
}

/// Attaches each volume of `served` under `dir` and prints
/// `loop VOLUME /dev/loopN`. On a failure, the devices already set up are
/// detached and the error names the volume.
pub async fn start(engine: &Engine, dir: &Path, served: &[String]) -> anyhow::Result<LoopDevices> {
    if !Path::new("/dev/fuse").exists() {
        bail!("--loop-dir {}: this host has no /dev/fuse (modprobe fuse; in a container, pass the device through)", dir.display());
    }
    std::fs::create_dir_all(dir)
        .with_context(|| format!("creating --loop-dir {}", dir.display()))?;
    let mut devices = LoopDevices {
        attached: Vec::new(),
    };
    for name in served {
        match attach_one(engine, dir, name).await {
            Ok(attached) => {
                println!("loop {name} {}", attached.device.display());
                devices.attached.push((name.clone(), attached));
            }
            Err(e) => {
                devices.shutdown().await;
                return Err(e);
            }
        }
    }
    Ok(devices)
}

async fn attach_one(engine: &Engine, dir: &Path, name: &str) -> anyhow::Result<Attached> {
    let volume = engine
        .open_volume(name)
        .await
        .with_context(|| format!("--loop-dir: opening volume {name:?}"))?;
    strata_csi::attach(volume, &dir.join(name), false)
        .await
        .map_err(|e| {
            anyhow::anyhow!("--loop-dir: attaching volume {name:?} as a loop device: {e} (needs root and free loop devices: losetup -f)")
        })
}

impl LoopDevices {
    /// Detaches every device, before the volumes close. A device still
    /// open (mounted, say) is detached lazily by the kernel: what is
    /// written to it after this is lost, so it is logged as an error.
    pub async fn shutdown(self) {
        for (name, attached) in self.attached {
            let device = attached.device.display().to_string();
            match attached.detach().await {
                Ok(()) => tracing::info!(volume = %name, device = %device, "loop device detached"),
                Err(e) => tracing::error!(volume = %name, device = %device, error = %e,
                    "the loop device is still in use (mounted?) and is detached lazily: unmount it before stopping strata; writes after this are lost"),
            }
        }
    }
}
