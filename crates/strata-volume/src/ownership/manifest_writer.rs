//! Every manifest write after the open: conditional on the version this
//! writer last wrote (If-Match), so a writer that was taken over fails its
//! next write instead of clobbering the new holder's manifest.
//!
//! A conflict is read back: our own write whose reply was lost (same epoch,
//! same content) counts as done; the same epoch with other content is a
//! stale version of ours and is retried; a newer epoch means another server
//! opened the volume and this one must stop (the caller fences).

use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use object_store::{PutPayload, UpdateVersion};
use strata_store::{ObjectNames, Store};

use super::right_to_write::{Ownership, WriteRefused};
use crate::backoff::Backoff;
use crate::format::manifest::Manifest;
use crate::objects::read_manifest_versioned;

/// The manifest as this writer last wrote it, and its version.
pub(crate) struct ManifestWriter {
    volume: String,
    current: tokio::sync::Mutex<(Manifest, UpdateVersion)>,
    /// Snapshots in `current`, readable without the (async) lock.
    snapshots: AtomicU64,
}

impl ManifestWriter {
    pub(crate) fn new(volume: &str, manifest: Manifest, version: UpdateVersion) -> Self {
        ManifestWriter {
            volume: volume.to_string(),
            snapshots: AtomicU64::new(manifest.snapshots.len() as u64),
            current: tokio::sync::Mutex::new((manifest, version)),
        }
    }

    /// Snapshots in the manifest as last written.
    pub(crate) fn snapshot_count(&self) -> u64 {
        self.snapshots.load(Ordering::Relaxed)
    }

    /// The manifest as this writer last wrote (or read) it.
    pub(crate) async fn current(&self) -> Manifest {
        self.current.lock().await.0.clone()
    }

    /// Writes `change(current)` unless it is `None` (nothing to do); retries
    /// store errors until it succeeds. Returns the manifest it replaced.
    pub(crate) async fn update(
        &self,
        store: &Store,
        ownership: &Ownership,
        change: impl Fn(&Manifest) -> Option<Manifest>,
    ) -> Result<Option<Manifest>, WriteRefused> {
        let mut guard = self.current.lock().await;
        let (manifest, version) = &mut *guard;
        let Some(next) = change(manifest) else {
            return Ok(None);
        };
        let path = ObjectNames::new(&self.volume).manifest();
        let mut backoff = Backoff::new();
        loop {
            ownership.wait_valid().await.map_err(WriteRefused::Fenced)?;
            let payload = PutPayload::from(Bytes::from(next.encode()));
            match store.put_if(&path, payload, Some(version)).await {
                Ok(v) => {
                    let snapshots = next.snapshots.len() as u64;
                    self.snapshots.store(snapshots, Ordering::Relaxed);
                    let previous = std::mem::replace(manifest, next);
                    *version = v;
                    return Ok(Some(previous));
                }
                Err(object_store::Error::Precondition { .. }) => {
                    if let Some(previous) = self
                        .resolve_conflict(store, manifest, version, &next)
                        .await?
                    {
                        return Ok(Some(previous));
                    }
                }
                Err(e) => {
                    tracing::warn!(volume = %self.volume, object = %path, error = %strata_store::ErrorText(&e), retry_in_ms = backoff.delay_ms(), "manifest write failed; retrying");
                    backoff.wait().await;
                }
            }
        }
    }

    /// After a failed If-Match: `Some(previous)` if the store already holds
    /// `next` (our write, reply lost), `None` to retry with the version now
    /// in the store, or an error if another server took the volume.
    async fn resolve_conflict(
        &self,
        store: &Store,
        manifest: &mut Manifest,
        version: &mut UpdateVersion,
        next: &Manifest,
    ) -> Result<Option<Manifest>, WriteRefused> {
        match read_manifest_versioned(store, &self.volume).await {
            Ok((m, v)) if m.epoch == manifest.epoch => {
                *version = v;
                if m == *next {
                    let snapshots = m.snapshots.len() as u64;
                    self.snapshots.store(snapshots, Ordering::Relaxed);
                    return Ok(Some(std::mem::replace(manifest, m)));
                }
                Ok(None)
            }
            Ok((m, _)) => Err(WriteRefused::TakenOver(format!(
                "the manifest's epoch is {} (ours {}): another server opened the volume",
                m.epoch, manifest.epoch
            ))),
            Err(e) => {
                tracing::warn!(volume = %self.volume, error = %strata_store::ErrorText(&e), "cannot re-read the manifest; retrying");
                Ok(None)
            }
        }
    }
}
