//! What a handover did: the holder's report and the asker's outcome
//! (`engine/handover.rs` makes them; a standby's take reports them).

use serde::{Deserialize, Serialize};

/// What handing a volume over did.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct HandoverReport {
    pub volume: String,
    /// Whether this engine had the volume open (false: nothing to do).
    pub was_open: bool,
    /// Bytes uploaded by the close (what the journal held).
    pub bytes_uploaded: u64,
    /// From the request to the lease released (or handed over).
    pub elapsed_ms: u64,
    /// Whether the lease went straight to the successor the request named
    /// (`ownership/lease_transfer.rs`) rather than being released.
    #[serde(default)]
    pub transferred: bool,
}

/// How a handover request was carried, and what came of it.
#[derive(Debug, Clone, Serialize)]
pub struct HandoverOutcome {
    pub volume: String,
    /// Who held the volume (`None`: nobody; nothing was asked).
    pub holder: Option<String>,
    /// "control socket", "store", or "none".
    pub via: &'static str,
    /// The holder's own report, over the control socket.
    pub report: Option<HandoverReport>,
    /// From the request to the lease seen released.
    pub elapsed_ms: u64,
}
