//! The one mapping from a store error to a `VolumeError`.

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
