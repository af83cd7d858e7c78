//! Reading a volume's manifest.

use object_store::UpdateVersion;
use strata_store::{ObjectNames, Store};

use super::store_error::store_error;
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
    let Some((bytes, version)) = store
        .get_versioned(&path)
        .await
        .map_err(store_error(store, "read", &path))?
    else {
        return Err(VolumeError::NotFound(name.to_string()));
    };
    let m = Manifest::decode(&bytes).map_err(|detail| VolumeError::Corrupt {
        path: path.to_string(),
        detail,
    })?;
    if m.name != name {
        return Err(VolumeError::Corrupt {
            path: path.to_string(),
            detail: format!("manifest names volume {:?}", m.name),
        });
    }
    Ok((m, version))
}
