//! Changing how a served volume stores its data: its compression (new
//! segments use the new setting at once; old ones keep theirs, each frame
//! says how it was written) and the user's key that wraps its data key
//! (`rekey`: one manifest write, no data rewritten). Both are conditional
//! manifest writes by the volume's holder, so they work while clients are
//! connected and never race the holder's own writes.

use std::sync::Arc;

use bytes::Bytes;
use object_store::{PutMode, PutPayload};

use super::Volume;
use crate::at_rest::wrap_record;
use crate::error::VolumeError;
use crate::format::frame::Compression;
use crate::format::key_wrap::Key;
use crate::format::sealed_object::SealedKind;
use crate::write::segment_put::put_with_retry;

impl Volume {
    /// Stores a map object (a checkpoint or a snapshot delta, `kind` of
    /// `seq`) at `path`, sealed whole for an encrypted volume, overwriting a
    /// retried attempt; returns the bytes stored.
    pub(crate) async fn put_map_object(
        &self,
        path: &object_store::path::Path,
        inner: Bytes,
        (kind, seq): (SealedKind, u64),
    ) -> Result<u64, String> {
        let bytes = self
            .at_rest
            .seal_object(inner, kind, seq, &self.uuid)
            .map_err(|e| format!("{path} not sealed: {e}"))?;
        let payload = || PutPayload::from(bytes.clone());
        let put = put_with_retry(
            &self.store,
            &self.ownership,
            &self.name,
            path,
            &payload,
            PutMode::Overwrite,
        );
        put.await.map_err(|e| format!("{path} not stored: {e}"))?;
        Ok(bytes.len() as u64)
    }

    /// The compression new segments are written with.
    pub fn compression(&self) -> Compression {
        self.at_rest.compression()
    }

    /// Whether the volume is encrypted.
    pub fn encrypted(&self) -> bool {
        self.at_rest.data_key().is_some()
    }

    /// Compresses segments sealed from now on with `compression`; returns
    /// the previous setting.
    pub async fn set_compression(
        self: &Arc<Self>,
        compression: Compression,
    ) -> Result<Compression, VolumeError> {
        self.check_failed()?;
        let text = compression.to_string();
        let change = |m: &crate::format::manifest::Manifest| {
            let mut next = m.clone();
            next.compression = Some(text.clone());
            Some(next)
        };
        let update = self.manifest.update(&self.store, &self.ownership, change);
        if let Err(refused) = update.await {
            return Err(self.failed(format!(
                "compression not changed: {}",
                self.refused(refused)
            )));
        }
        let previous = self.at_rest.compression();
        self.at_rest.set_compression(compression);
        tracing::info!(volume = %self.name, %previous, now = %compression, "compression changed");
        Ok(previous)
    }

    /// Wraps the volume's data key with `new_key` instead of the key it was
    /// opened with; returns the new key's fingerprint. The data is not
    /// rewritten: only the manifest changes, in one conditional write.
    pub async fn rekey(self: &Arc<Self>, new_key: &Key) -> Result<String, VolumeError> {
        self.check_failed()?;
        let Some(data_key) = self.at_rest.data_key() else {
            return Err(VolumeError::Invalid(format!(
                "volume {:?} is not encrypted: there is no key to change",
                self.name
            )));
        };
        let record = wrap_record(new_key, data_key, &self.uuid)?;
        let change = |m: &crate::format::manifest::Manifest| {
            let mut next = m.clone();
            next.encryption = Some(record.clone());
            Some(next)
        };
        let update = self.manifest.update(&self.store, &self.ownership, change);
        if let Err(refused) = update.await {
            return Err(self.failed(format!("key not changed: {}", self.refused(refused))));
        }
        tracing::info!(volume = %self.name, key = %new_key.fingerprint(), "volume rekeyed");
        Ok(new_key.fingerprint())
    }
}
