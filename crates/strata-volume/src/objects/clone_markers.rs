//! Reading the clone markers under a volume's prefix
//! (`format/clone_marker.rs`), each checked against the clone it names.

use object_store::path::Path;
use strata_store::Store;

use super::manifests::read_manifest;
use super::other_prefix::store_for_prefix;
use super::store_error::{is_not_found, read_whole, store_error};
use crate::error::VolumeError;
use crate::format::clone_marker::CloneMarker;

/// A marker found, and whether its clone exists (a volume of that name
/// with that uuid). A marker without its clone is left by a clone whose
/// creation failed or is under way, or by a deleted clone.
pub(crate) struct FoundMarker {
    pub path: Path,
    pub marker: CloneMarker,
    pub live: bool,
}

/// The markers under `prefix` (a volume's `clones/`, or one snapshot's).
pub(crate) async fn list_clone_markers(
    store: &Store,
    prefix: &Path,
) -> Result<Vec<FoundMarker>, VolumeError> {
    let found = read_clone_markers(store, prefix).await?;
    found.into_iter().map(|(_, marker)| marker).collect()
}

/// Each marker under `prefix`, read and checked on its own (a damaged one
/// does not hide the others); a marker deleted after the listing is left
/// out.
pub(crate) async fn read_clone_markers(
    store: &Store,
    prefix: &Path,
) -> Result<Vec<(Path, Result<FoundMarker, VolumeError>)>, VolumeError> {
    let listing = store
        .list_all(prefix)
        .await
        .map_err(store_error(store, "list", prefix))?;
    let mut out = Vec::new();
    for o in listing {
        match read_marker(store, o.location.clone()).await {
            Err(e) if is_not_found(&e) => {}
            found => out.push((o.location, found)),
        }
    }
    Ok(out)
}

/// One marker, and whether its clone exists.
async fn read_marker(store: &Store, path: Path) -> Result<FoundMarker, VolumeError> {
    let bytes = read_whole(store, &path).await?;
    let marker = CloneMarker::decode(&bytes).map_err(|detail| VolumeError::Corrupt {
        path: path.to_string(),
        detail,
    })?;
    let clone_store = store_for_prefix(store, marker.clone_prefix.as_deref())?;
    let live = match read_manifest(&clone_store, &marker.clone).await {
        // A flattened clone keeps its name and uuid but no parent.
        Ok(m) => m.uuid == marker.clone_uuid && m.parent.is_some(),
        Err(VolumeError::NotFound(_)) => false,
        Err(e) => return Err(e),
    };
    Ok(FoundMarker { path, marker, live })
}
