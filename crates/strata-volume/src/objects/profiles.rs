//! Reading a snapshot's access profile (`format/access_profile.rs`):
//! bounded (a HEAD first, nothing over `MAX_PROFILE_BYTES` fetched),
//! opened with the volume's data key when sealed (an encrypted volume's,
//! `format/sealed_object.rs`), verified, and checked to be of the snapshot
//! asked for.

use strata_store::{ObjectNames, Store};

use super::checkpoints::unseal;
use super::store_error::store_error;
use crate::error::VolumeError;
use crate::format::access_profile::{AccessProfile, MAX_PROFILE_BYTES};
use crate::format::key_wrap::Key;
use crate::format::sealed_object::SealedKind;

/// What a sealed profile adds to the profile itself (its envelope's header
/// and tag).
const SEALED_OVERHEAD_BYTES: u64 = 4096;

/// The profile of the snapshot at `checkpoint_seq` of volume `uuid`:
/// `None` when there is none; `Corrupt` when it does not verify.
pub(crate) async fn read_profile(
    store: &Store,
    names: &ObjectNames,
    uuid: &[u8; 16],
    checkpoint_seq: u64,
    data_key: Option<&Key>,
) -> Result<Option<AccessProfile>, VolumeError> {
    let path = names.profile(checkpoint_seq);
    let corrupt = |detail: String| VolumeError::Corrupt {
        path: path.to_string(),
        detail,
    };
    let size = match store.object_store().head(&path).await {
        Ok(meta) => meta.size,
        Err(object_store::Error::NotFound { .. }) => return Ok(None),
        Err(e) => return Err(store_error(store, "read", &path)(e)),
    };
    if size > MAX_PROFILE_BYTES as u64 + SEALED_OVERHEAD_BYTES {
        return Err(corrupt(format!(
            "{size} bytes, over the {MAX_PROFILE_BYTES} a profile may have"
        )));
    }
    let bytes = match store.get_range(&path, 0..size).await {
        Ok(b) => b,
        Err(object_store::Error::NotFound { .. }) => return Ok(None),
        Err(e) => return Err(store_error(store, "read", &path)(e)),
    };
    let kind = SealedKind::AccessProfile;
    let bytes = unseal(&bytes, kind, checkpoint_seq, uuid, data_key).map_err(&corrupt)?;
    let profile = AccessProfile::decode(&bytes).map_err(corrupt)?;
    profile.check_for(uuid, checkpoint_seq).map_err(corrupt)?;
    Ok(Some(profile))
}
