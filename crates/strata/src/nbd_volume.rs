//! The adapter between the NBD server and the engine: the one place that
//! knows both. The engine knows nothing of NBD, the server nothing of
//! volumes.

use std::collections::HashSet;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use nbd_server::{
    Allocation, BlockDevice, BlockSizes, ExportInfo, ExportProvider, Extent, ZeroFlags,
};
use strata_volume::{
    split_export_name, Engine, Export, ExportName, SnapshotView, Standby, Volume, VolumeError,
};

use crate::size::format_size;

/// A volume (or a snapshot of one, read-only) as an NBD block device.
pub struct NbdVolume {
    backing: Backing,
    max_request_bytes: u32,
    errors: ErrorLog,
}

enum Backing {
    Volume(Arc<Volume>),
    Snapshot(Arc<SnapshotView>),
    /// A volume another host holds (live migration's destination): reads
    /// from the store, and the first write takes the volume over.
    Standby(Arc<Standby>),
}

impl Backing {
    fn name(&self) -> String {
        match self {
            Backing::Volume(v) => v.name().to_string(),
            Backing::Snapshot(s) => s.export_name(),
            Backing::Standby(s) => s.name().to_string(),
        }
    }

    /// The writable volume (a standby's once it took it over); a write to
    /// a snapshot never gets here (the export is read-only and the server
    /// refuses it), but if one did it is refused, not applied.
    async fn writable(&self) -> Result<Arc<Volume>, VolumeError> {
        match self {
            Backing::Volume(v) => Ok(v.clone()),
            Backing::Standby(s) => s.volume_to_write().await,
            Backing::Snapshot(s) => Err(VolumeError::Invalid(format!(
                "{} is a snapshot: read-only",
                s.export_name()
            ))),
        }
    }

    /// The volume if writes may go to it now (QoS applies to it).
    fn volume_now(&self) -> Option<&Arc<Volume>> {
        match self {
            Backing::Volume(v) => Some(v),
            Backing::Standby(s) => s.taken(),
            Backing::Snapshot(_) => None,
        }
    }
}

/// Logs errors returned to clients: the client sees only EIO, the log says
/// what failed. At most one line per second per volume, with a count of the
/// lines suppressed, so a failing store cannot flood the log.
#[derive(Default)]
struct ErrorLog {
    last_unix_ms: AtomicU64,
    suppressed: AtomicU64,
}

impl NbdVolume {
    /// The export's name: the volume's, or `VOLUME@SNAPSHOT`.
    pub(crate) fn export_name(&self) -> String {
        self.backing.name()
    }

    /// The volume's size as resizes change it (a snapshot's is fixed).
    pub(crate) fn watch_size(&self) -> Option<tokio::sync::watch::Receiver<u64>> {
        match &self.backing {
            Backing::Volume(v) => Some(v.watch_size()),
            Backing::Snapshot(_) | Backing::Standby(_) => None,
        }
    }

    fn fail(
        &self,
        op: &'static str,
        offset_bytes: u64,
        length_bytes: u64,
        e: VolumeError,
    ) -> io::Error {
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        let last_ms = self.errors.last_unix_ms.load(Ordering::Relaxed);
        let due = now_ms.saturating_sub(last_ms) >= 1000
            && self
                .errors
                .last_unix_ms
                .compare_exchange(last_ms, now_ms, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok();
        if due {
            let suppressed = self.errors.suppressed.swap(0, Ordering::Relaxed);
            tracing::error!(volume = %self.backing.name(), op, offset_bytes, length_bytes, suppressed, error = %strata_store::ErrorText(&e), "request failed; the client gets an I/O error");
        } else {
            self.errors.suppressed.fetch_add(1, Ordering::Relaxed);
        }
        io::Error::from(e)
    }
}

impl BlockDevice for NbdVolume {
    fn size_bytes(&self) -> u64 {
        match &self.backing {
            Backing::Volume(v) => v.size_bytes(),
            Backing::Snapshot(s) => s.size_bytes(),
            Backing::Standby(s) => s.size_bytes(),
        }
    }

    fn is_read_only(&self) -> bool {
        matches!(self.backing, Backing::Snapshot(_))
    }

    fn block_sizes(&self) -> BlockSizes {
        BlockSizes {
            minimum_bytes: 1,
            preferred_bytes: 4096,
            maximum_bytes: self.max_request_bytes,
        }
    }

    async fn admit(&self, kind: nbd_server::Admission, bytes: u64) {
        // A snapshot export is read-only and not limited; a standby is
        // limited once it holds the volume.
        let Some(v) = self.backing.volume_now() else {
            return;
        };
        let kind = match kind {
            nbd_server::Admission::Read => strata_volume::QosKind::Read,
            nbd_server::Admission::Write => strata_volume::QosKind::Write,
        };
        v.admit(kind, bytes).await;
    }

    async fn read(&self, offset_bytes: u64, buf: &mut [u8]) -> io::Result<()> {
        let len = buf.len() as u64;
        let read = match &self.backing {
            Backing::Volume(v) => v.read(offset_bytes, buf).await,
            Backing::Snapshot(s) => s.read(offset_bytes, buf).await,
            Backing::Standby(s) => s.read(offset_bytes, buf).await,
        };
        read.map_err(|e| self.fail("read", offset_bytes, len, e))
    }

    async fn write(&self, offset_bytes: u64, data: &[u8], fua: bool) -> io::Result<()> {
        let len = data.len() as u64;
        let fail = |e| self.fail("write", offset_bytes, len, e);
        let volume = self.backing.writable().await.map_err(fail)?;
        volume.write(offset_bytes, data, fua).await.map_err(fail)?;
        if let Backing::Standby(s) = &self.backing {
            s.write_served();
        }
        Ok(())
    }

    async fn flush(&self) -> io::Result<()> {
        let fail = |e| self.fail("flush", 0, 0, e);
        let volume = match &self.backing {
            Backing::Snapshot(_) => return Ok(()), // nothing to make durable
            // A standby has nothing of its own to make durable: its first
            // FLUSH is no reason to take the volume (QEMU's destination
            // may flush before the switchover).
            Backing::Standby(s) => match s.taken() {
                Some(v) => v.clone(),
                None => return Ok(()),
            },
            Backing::Volume(v) => v.clone(),
        };
        volume.flush().await.map_err(fail)
    }

    async fn trim(&self, offset_bytes: u64, length_bytes: u64, fua: bool) -> io::Result<()> {
        let fail = |e| self.fail("trim", offset_bytes, length_bytes, e);
        let volume = self.backing.writable().await.map_err(fail)?;
        volume
            .trim(offset_bytes, length_bytes, fua)
            .await
            .map_err(fail)
    }

    async fn write_zeroes(
        &self,
        offset_bytes: u64,
        length_bytes: u64,
        flags: ZeroFlags,
    ) -> io::Result<()> {
        // Zeroing is always fast here (it only changes the map), so
        // FAST_ZERO never needs to fail.
        let fail = |e| self.fail("write_zeroes", offset_bytes, length_bytes, e);
        let volume = self.backing.writable().await.map_err(fail)?;
        volume
            .write_zeroes(offset_bytes, length_bytes, flags.no_hole, flags.fua)
            .await
            .map_err(fail)
    }

    async fn block_status(
        &self,
        offset_bytes: u64,
        length_bytes: u64,
        max_extents: usize,
    ) -> io::Result<Vec<Extent>> {
        let runs = match &self.backing {
            Backing::Volume(v) => v.block_status(offset_bytes, length_bytes, max_extents),
            Backing::Snapshot(s) => s.block_status(offset_bytes, length_bytes, max_extents),
            Backing::Standby(s) => {
                s.block_status(offset_bytes, length_bytes, max_extents)
                    .await
            }
        };
        let runs = runs.map_err(io::Error::from)?;
        Ok(runs
            .into_iter()
            .map(|(length_bytes, a)| Extent {
                length_bytes,
                allocation: match a {
                    strata_volume::Allocation::Data => Allocation::Data,
                    strata_volume::Allocation::Zero => Allocation::Zero,
                    strata_volume::Allocation::Hole => Allocation::Hole,
                },
            })
            .collect())
    }
}

/// The volumes of the engine's store, exported under their names (every
/// one, or only those in `only`), and their snapshots, read-only, as
/// `VOL@SNAP`.
pub struct VolumeExports {
    pub engine: Arc<Engine>,
    pub max_request_bytes: u32,
    pub only: Option<HashSet<String>>,
}

impl VolumeExports {
    pub(crate) fn serves(&self, name: &str) -> bool {
        self.only.as_ref().is_none_or(|o| o.contains(name))
    }
}

impl ExportProvider for VolumeExports {
    type Device = NbdVolume;

    async fn list(&self) -> io::Result<Vec<ExportInfo>> {
        let volumes = self.engine.list_volumes().await.map_err(io::Error::from)?;
        let mut out = Vec::new();
        for v in volumes.into_iter().filter(|v| self.serves(&v.name)) {
            for s in &v.snapshots {
                out.push(ExportInfo {
                    name: format!("{}@{}", v.name, s.name),
                    description: format!(
                        "strata snapshot of {}, {}, read-only",
                        v.name,
                        format_size(s.size_bytes)
                    ),
                });
            }
            out.push(ExportInfo {
                description: format!("strata volume, {}", format_size(v.size_bytes)),
                name: v.name,
            });
        }
        Ok(out)
    }

    /// Counted under the volume: `VOL@SNAP` under `VOL`, so monitoring
    /// sees one series per volume however many snapshots are read.
    fn metrics_group(&self, name: &str) -> String {
        match split_export_name(name) {
            Ok(ExportName::Volume(v)) | Ok(ExportName::Snapshot { volume: v, .. }) => v.to_string(),
            Err(_) => name.to_string(),
        }
    }

    async fn open(&self, name: &str) -> io::Result<Arc<NbdVolume>> {
        let not_found = |e: String| io::Error::new(io::ErrorKind::NotFound, e);
        let export = split_export_name(name).map_err(not_found)?;
        let volume = match export {
            ExportName::Volume(v) | ExportName::Snapshot { volume: v, .. } => v,
        };
        if !self.serves(volume) {
            return Err(not_found(format!(
                "this server does not serve volume {volume:?} (see its --volume options)"
            )));
        }
        // Said in the log: the client only hears "no such export", and a
        // snapshot that exists but could not be opened must be told apart.
        let lookup_error = |e: VolumeError| {
            tracing::info!(export = %name, error = %e, "export not opened");
            match e {
                VolumeError::Invalid(_) => not_found(e.to_string()),
                e => io::Error::from(e),
            }
        };
        let backing = match export {
            ExportName::Volume(v) => match self.engine.open_export(v).await {
                Ok(Export::Volume(v)) => Backing::Volume(v),
                Ok(Export::Standby(s)) => Backing::Standby(s),
                Err(e) => return Err(lookup_error(e)),
            },
            ExportName::Snapshot { volume, snapshot } => Backing::Snapshot(
                self.engine
                    .open_snapshot(volume, snapshot)
                    .await
                    .map_err(lookup_error)?,
            ),
        };
        Ok(Arc::new(NbdVolume {
            backing,
            max_request_bytes: self.max_request_bytes,
            errors: ErrorLog::default(),
        }))
    }
}
