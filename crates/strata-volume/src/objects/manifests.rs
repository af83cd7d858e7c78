//! Reading a volume's manifest.

use object_store::UpdateVersion;
use strata_store::{ObjectNames, Store};

use super::store_error::read_versioned;
use crate::error::VolumeError;
use crate::format::manifest::Manifest;

/// Reads and verifies a volume's manifest.
pub(crate) async fn read_manifest(store: &Store, name: &str) -> Result<Manifest, VolumeError> {
    Ok(read_manifest_versioned(store, name).await?.0)
}

/// Reads and verifies a volume's manifest, with its version (for a
/// conditional write).
pub(crate) async fn read_manifest_versioned(
    store: &Store,
    name: &str,
) -> Result<(Manifest, UpdateVersion), VolumeError> {
    let path = ObjectNames::new(name).manifest();
    let Some((m, version)) = read_versioned(store, &path, Manifest::decode, "").await? else {
        return Err(VolumeError::NotFound(name.to_string()));
    };
    if m.name != name {
        return Err(VolumeError::Corrupt {
            path: path.to_string(),
            detail: format!("manifest names volume {:?}", m.name),
        });
    }
    Ok((m, version))
}
