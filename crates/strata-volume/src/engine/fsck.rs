//! `fsck` of a volume, snapshot or clone of this engine's store, opened
//! with the engine's key (`fsck/`). Reads only: no lease, no cache, so it
//! runs beside the server that serves the volume.

use super::Engine;
use crate::error::VolumeError;
use crate::fsck::{fsck, FsckOptions, FsckReport, ProgressFn};

impl Engine {
    /// Checks volume `volume`, or its snapshot `snapshot`. `Err` when the
    /// check could not run; what it found is in the report.
    pub async fn fsck(
        &self,
        volume: &str,
        snapshot: Option<&str>,
        options: FsckOptions,
        progress: ProgressFn<'_>,
    ) -> Result<FsckReport, VolumeError> {
        let key = self.config.key.as_deref();
        fsck(&self.store, key, volume, snapshot, options, progress).await
    }
}
