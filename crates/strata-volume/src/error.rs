//! Errors of the engine. Each says what failed and, where it can, what to do.
//!
//! A leaf: every folder may use it, it uses nothing of the crate (errors of
//! the store are said with `strata_store::error_text`).

#[derive(Debug, thiserror::Error)]
pub enum VolumeError {
    #[error("volume {0:?} does not exist")]
    NotFound(String),
    #[error("volume {0:?} already exists")]
    AlreadyExists(String),
    #[error(
        "volume {volume:?} has no snapshot {snapshot:?} (see `strata snapshot list {volume}`)"
    )]
    SnapshotNotFound { volume: String, snapshot: String },
    #[error("invalid argument: {0}")]
    Invalid(String),
    #[error("range {offset}+{len} is beyond the end of the volume ({size} bytes)")]
    OutOfRange { offset: u64, len: u64, size: u64 },
    /// The source is said with `strata_store::error_text`: object_store's
    /// wrapper texts left out, an explained failure's advice kept.
    #[error("object store {store}: {op}{}: {}", in_path(.path), strata_store::error_text(.source.as_ref()))]
    Store {
        store: String,
        op: &'static str,
        path: String,
        #[source]
        source: Box<object_store::Error>,
    },
    #[error("corrupt object {path}: {detail}")]
    Corrupt { path: String, detail: String },
    #[error(transparent)]
    Journal(#[from] JournalError),
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    /// Someone else is serving the volume.
    #[error("{0}")]
    Busy(String),
    #[error("volume {0:?} is closed")]
    Closed(String),
    #[error("volume {name:?} stopped accepting writes: {detail}")]
    Failed { name: String, detail: String },
    /// An encrypted volume's key is missing or wrong.
    #[error("volume {volume:?}: {detail}")]
    Key { volume: String, detail: String },
    /// An administrative operation (snapshot, rollback) did not happen.
    #[error("volume {name:?}: {detail}")]
    NotDone { name: String, detail: String },
}

/// " PATH", or nothing for the store's root (a listing of every volume).
fn in_path(path: &str) -> String {
    if path.is_empty() {
        String::new()
    } else {
        format!(" {path}")
    }
}

impl VolumeError {
    /// The `std::io::ErrorKind` a block client should see for this error.
    pub fn io_kind(&self) -> std::io::ErrorKind {
        use std::io::ErrorKind;
        match self {
            VolumeError::NotFound(_) | VolumeError::SnapshotNotFound { .. } => ErrorKind::NotFound,
            VolumeError::Invalid(_) => ErrorKind::InvalidInput,
            VolumeError::OutOfRange { .. } => ErrorKind::InvalidInput,
            VolumeError::Busy(_) => ErrorKind::ResourceBusy,
            VolumeError::Key { .. } => ErrorKind::PermissionDenied,
            _ => ErrorKind::Other,
        }
    }
}

impl From<VolumeError> for std::io::Error {
    fn from(e: VolumeError) -> Self {
        std::io::Error::new(e.io_kind(), e.to_string())
    }
}

/// Errors of a volume's local journal file.
#[derive(Debug, thiserror::Error)]
pub enum JournalError {
    #[error("journal {path}: {what}: {source}")]
    Io {
        path: std::path::PathBuf,
        what: &'static str,
        source: std::io::Error,
    },
    #[error("journal {path} is corrupt or foreign: {detail}")]
    Invalid {
        path: std::path::PathBuf,
        detail: String,
    },
    #[error("journal {path} failed earlier and accepts no more writes: {detail}")]
    Failed {
        path: std::path::PathBuf,
        detail: String,
    },
}
