//! Reading the clone markers under a volume's prefix
//! (`format/clone_marker.rs`), each checked against the clone it names.

use object_store::path::Path;
use strata_store::Store;

use super::manifests::read_manifest;
use super::other_prefix::store_for_prefix;
use super::store_error::store_error;
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
    let listing = store
        .list_all(prefix)
        .await
        .map_err(store_error(store, "list", prefix))?;
    let mut out = Vec::new();
    for o in listing {
        let bytes = store
            .object_store()
            .get(&o.location)
            .await
            .map_err(store_error(store, "read", &o.location))?
            .bytes()
            .await
            .map_err(store_error(store, "read", &o.location))?;
        let marker = CloneMarker::decode(&bytes).map_err(|detail| VolumeError::Corrupt {
            path: o.location.to_string(),
            detail,
        })?;
        let clone_store = store_for_prefix(store, marker.clone_prefix.as_deref())?;
        let live = match read_manifest(&clone_store, &marker.clone).await {
            // A flattened clone keeps its name and uuid but no parent.
            Ok(m) => m.uuid == marker.clone_uuid && m.parent.is_some(),
            Err(VolumeError::NotFound(_)) => false,
            Err(e) => return Err(e),
        };
        out.push(FoundMarker {
            path: o.location,
            marker,
            live,
        });
    }
    Ok(out)
}
