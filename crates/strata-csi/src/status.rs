//! The spec's error codes for the engine's errors. The message is the
//! engine's own: it names what failed and what to do.

use strata_volume::VolumeError;
use tonic::{Code, Status};

/// The gRPC status for `e`, `what` saying which call on what failed.
pub fn from_volume_error(what: &str, e: &VolumeError) -> Status {
    let code = match e {
        VolumeError::NotFound(_) | VolumeError::SnapshotNotFound { .. } => Code::NotFound,
        VolumeError::AlreadyExists(_) => Code::AlreadyExists,
        VolumeError::Invalid(_) => Code::InvalidArgument,
        VolumeError::OutOfRange { .. } => Code::OutOfRange,
        // In use: a clone reads it, another host holds it.
        VolumeError::Busy(_) => Code::FailedPrecondition,
        // A driver without the volume's key, or with another one.
        VolumeError::Key { .. } => Code::FailedPrecondition,
        // The store failed after its retries, or the volume is closing:
        // the sidecars call again.
        VolumeError::Store { .. } | VolumeError::Closed(_) => Code::Unavailable,
        VolumeError::NotDone { .. } => Code::Aborted,
        VolumeError::Corrupt { .. }
        | VolumeError::Journal(_)
        | VolumeError::Io { .. }
        | VolumeError::Failed { .. } => Code::Internal,
    };
    Status::new(code, format!("{what}: {}", strata_store::ErrorText(e)))
}

/// INVALID_ARGUMENT with `msg`.
pub fn invalid(msg: impl Into<String>) -> Status {
    Status::invalid_argument(msg)
}

/// INVALID_ARGUMENT if the required field `name` is empty.
pub fn require(name: &str, value: &str) -> Result<(), Status> {
    if value.is_empty() {
        return Err(invalid(format!("{name} is required")));
    }
    Ok(())
}
