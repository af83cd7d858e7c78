//! The one mapping from a store error to a `VolumeError`, and the whole-
//! object read every small object shares.

use strata_store::Store;

use crate::error::VolumeError;

/// Maps a store error of `op` on `path` to a `VolumeError` naming both.
pub(crate) fn store_error(
    store: &Store,
    op: &'static str,
    path: &object_store::path::Path,
) -> impl FnOnce(object_store::Error) -> VolumeError {
    let store = store.description().to_string();
    let path = path.to_string();
    move |source| VolumeError::Store {
        store,
        op,
        path,
        source: Box::new(source),
    }
}

/// Whether `e` says an object is not in the store (deleted, or never
/// written), as opposed to a store that failed or an object that is damaged.
pub(crate) fn is_not_found(e: &VolumeError) -> bool {
    matches!(e, VolumeError::Store { source, .. } if matches!(**source, object_store::Error::NotFound { .. }))
}

/// Whether a conditional write was refused because its condition did not
/// hold (the object changed, exists, or is gone): an answer to read back,
/// not a failure. Leases, host records and their requests ask on purpose.
pub(crate) fn is_condition_refused(e: &object_store::Error) -> bool {
    matches!(
        e,
        object_store::Error::AlreadyExists { .. }
            | object_store::Error::Precondition { .. }
            | object_store::Error::NotFound { .. }
    )
}

/// Object `path` and its version, decoded by `decode` (`None`: no such
/// object). A decode error names the object, with `hint` (what to do)
/// after it when not empty.
pub(crate) async fn read_versioned<T>(
    store: &Store,
    path: &object_store::path::Path,
    decode: impl FnOnce(&[u8]) -> Result<T, String>,
    hint: &str,
) -> Result<Option<(T, object_store::UpdateVersion)>, VolumeError> {
    let Some((bytes, version)) = store
        .get_versioned(path)
        .await
        .map_err(store_error(store, "read", path))?
    else {
        return Ok(None);
    };
    let value = decode(&bytes).map_err(|detail| VolumeError::Corrupt {
        path: path.to_string(),
        detail: if hint.is_empty() {
            detail
        } else {
            format!("{detail} ({hint})")
        },
    })?;
    Ok(Some((value, version)))
}

/// The whole of object `path`, any error mapped by `store_error`.
pub(crate) async fn read_whole(
    store: &Store,
    path: &object_store::path::Path,
) -> Result<bytes::Bytes, VolumeError> {
    store
        .object_store()
        .get(path)
        .await
        .map_err(store_error(store, "read", path))?
        .bytes()
        .await
        .map_err(store_error(store, "read", path))
}
