//! The store of a volume under another prefix of the same bucket (a
//! clone's parent, or a parent's clone, may live there).

use strata_store::Store;

use crate::error::VolumeError;

/// The store `prefix` names in `store`'s bucket (`None`: `store` itself).
pub(crate) fn store_for_prefix(store: &Store, prefix: Option<&str>) -> Result<Store, VolumeError> {
    match prefix {
        None => Ok(store.clone()),
        Some(p) => store.sibling(p).map_err(VolumeError::Invalid),
    }
}
