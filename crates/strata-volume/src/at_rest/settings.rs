//! A volume's settings at rest: how new segments are compressed
//! (changeable while it is served: each frame records its codec) and, for
//! an encrypted volume, its data key, unwrapped at open with the user's
//! key. Unwrapping is the key check: a wrong or missing key stops the open
//! with a message naming the key the volume wants, never later as
//! unreadable data.

use std::sync::Arc;

use bytes::Bytes;
use parking_lot::Mutex;

use super::random::random_array;
use crate::error::VolumeError;
use crate::format::frame::Compression;
use crate::format::key_wrap::{self, Key, UnwrapError, KEY_BYTES};
use crate::format::manifest::{EncryptionRecord, Manifest, CIPHER_AES_256_GCM};
use crate::format::sealed_object::{seal, SealedKind};

/// What a volume's segments are written with, and the key to read them.
#[derive(Debug)]
pub(crate) struct AtRest {
    compression: Mutex<Compression>,
    data_key: Option<Arc<Key>>,
}

impl AtRest {
    /// The settings manifest `m` records; an encrypted volume's data key is
    /// unwrapped with `kek`.
    pub(crate) fn open(m: &Manifest, kek: Option<&Key>) -> Result<AtRest, VolumeError> {
        Ok(AtRest {
            compression: Mutex::new(compression_of(m)?),
            data_key: data_key_of(m, kek)?.map(Arc::new),
        })
    }

    pub(crate) fn compression(&self) -> Compression {
        *self.compression.lock()
    }

    pub(crate) fn set_compression(&self, compression: Compression) {
        *self.compression.lock() = compression;
    }

    pub(crate) fn data_key(&self) -> Option<&Arc<Key>> {
        self.data_key.as_ref()
    }

    /// `inner` (a checkpoint or snapshot delta) as stored: sealed whole for
    /// an encrypted volume (`format/sealed_object.rs`), as it is otherwise.
    pub(crate) fn seal_object(
        &self,
        inner: Bytes,
        kind: SealedKind,
        seq: u64,
        volume_uuid: &[u8; 16],
    ) -> Result<Bytes, VolumeError> {
        let Some(key) = &self.data_key else {
            return Ok(inner);
        };
        let salt = random_array()?;
        Ok(Bytes::from(seal(
            &inner,
            kind,
            seq,
            volume_uuid,
            key.bytes(),
            salt,
        )))
    }

    /// Whether new segments are written as frames (segment version 2);
    /// otherwise as version 1, whose reads are one `pread` with no copy.
    pub(crate) fn writes_frames(&self) -> bool {
        self.data_key.is_some() || self.compression() != Compression::None
    }
}

/// The compression manifest `m` records (none for volumes made before it
/// existed).
pub(crate) fn compression_of(m: &Manifest) -> Result<Compression, VolumeError> {
    match &m.compression {
        None => Ok(Compression::None),
        Some(c) => c
            .parse()
            .map_err(|e| VolumeError::Invalid(format!("volume {:?}: {e}", m.name))),
    }
}

/// The data key of volume `m` (`None` if it is not encrypted), unwrapped
/// with `kek`.
pub(crate) fn data_key_of(m: &Manifest, kek: Option<&Key>) -> Result<Option<Key>, VolumeError> {
    let Some(enc) = &m.encryption else {
        return Ok(None);
    };
    let uuid = m.uuid_bytes().map_err(VolumeError::Invalid)?;
    let key_error = |detail: String| VolumeError::Key {
        volume: m.name.clone(),
        detail,
    };
    let Some(kek) = kek else {
        return Err(key_error(format!(
            "it is encrypted: give its key with --key-file FILE or {} (the key with fingerprint {})",
            super::KEY_ENV,
            enc.key_fingerprint
        )));
    };
    match key_wrap::unwrap(kek, &enc.wrapped_key, &uuid) {
        Ok(key) => Ok(Some(key)),
        Err(UnwrapError::WrongKey) => Err(key_error(format!(
            "the key given (fingerprint {}) does not open it; it wants the key with fingerprint {} (wrong key file?)",
            kek.fingerprint(),
            enc.key_fingerprint
        ))),
        Err(UnwrapError::Malformed(detail)) => Err(VolumeError::Corrupt {
            path: format!("{}/manifest", m.name),
            detail: format!("wrapped data key: {detail}"),
        }),
    }
}

/// The record of `data_key` wrapped by `kek` for volume `uuid`.
pub(crate) fn wrap_record(
    kek: &Key,
    data_key: &Key,
    uuid: &[u8; 16],
) -> Result<EncryptionRecord, VolumeError> {
    Ok(EncryptionRecord {
        cipher: CIPHER_AES_256_GCM.to_string(),
        wrapped_key: key_wrap::wrap(kek, data_key, uuid, random_array()?),
        key_fingerprint: kek.fingerprint(),
    })
}

/// Records in new manifest `m` how its data is stored: `compression`,
/// and, given the user's key `kek`, encryption with `inherited` (a clone
/// shares its parent's data key, so it reads the parent's segments) or a
/// new random data key.
pub(crate) fn new_volume_at_rest(
    m: &mut Manifest,
    compression: Compression,
    kek: Option<&Key>,
    inherited: Option<&Key>,
) -> Result<(), VolumeError> {
    m.compression = Some(compression.to_string());
    let Some(kek) = kek else {
        return Ok(());
    };
    let uuid = m.uuid_bytes().map_err(VolumeError::Invalid)?;
    let data_key = match inherited {
        Some(k) => k.clone(),
        None => Key::from_bytes(random_array::<KEY_BYTES>()?),
    };
    m.encryption = Some(wrap_record(kek, &data_key, &uuid)?);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn manifest() -> Manifest {
        let uuid = uuid::Uuid::new_v4().simple().to_string();
        let json = format!(
            r#"{{"name":"v","uuid":"{uuid}","size_bytes":1073741824,"created_unix_ms":0,"checkpoint_seq":null}}"#
        );
        serde_json::from_str(&json).unwrap()
    }

    #[test]
    fn the_right_key_opens_a_wrong_or_missing_one_is_named() {
        let kek = Key::from_bytes([1; 32]);
        let mut m = manifest();
        new_volume_at_rest(&mut m, Compression::Lz4, Some(&kek), None).unwrap();
        let m = Manifest::decode(&m.encode()).unwrap();
        let at = AtRest::open(&m, Some(&kek)).unwrap();
        assert!(at.data_key().is_some() && at.writes_frames());
        assert_eq!(at.compression(), Compression::Lz4);
        let e = AtRest::open(&m, None).unwrap_err().to_string();
        assert!(
            e.contains("encrypted") && e.contains(&kek.fingerprint()),
            "{e}"
        );
        let other = Key::from_bytes([2; 32]);
        let e = AtRest::open(&m, Some(&other)).unwrap_err().to_string();
        assert!(
            e.contains("does not open") && e.contains(&kek.fingerprint()),
            "{e}"
        );
        // A wrapped key copied into another volume's manifest is refused.
        let mut m2 = manifest();
        m2.encryption = m.encryption.clone();
        m2.compression = m.compression.clone();
        assert!(AtRest::open(&m2, Some(&kek)).is_err());
        // Unencrypted: no key needed, none used.
        let mut plain = manifest();
        new_volume_at_rest(&mut plain, Compression::None, None, None).unwrap();
        let at = AtRest::open(&plain, Some(&kek)).unwrap();
        assert!(at.data_key().is_none() && !at.writes_frames());
    }
}
