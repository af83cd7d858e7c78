//! What a [`super::LossyFs`] handle, its mount and the FUSE threads share.

use std::sync::atomic::AtomicBool;

use parking_lot::Mutex;

use super::model::Model;

/// What the handle, the mount and the FUSE threads share.
pub(crate) struct Shared {
    pub(crate) model: Mutex<Model>,
    /// A FUSE session is running (set under the model lock by `mount`,
    /// cleared when the session thread ends).
    pub(crate) mounted: AtomicBool,
    /// Owns the backing files; removed when the last clone drops.
    pub(crate) _backing: tempfile::TempDir,
}
