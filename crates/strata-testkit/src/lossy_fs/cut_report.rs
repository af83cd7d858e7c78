//! What is unsynced ([`Pending`]) and what a power cut kept and lost
//! ([`CutReport`]).

/// What is unsynced right now.
#[derive(Debug, Clone, Default)]
pub struct Pending {
    /// Files with at least one unsynced data op.
    pub files: usize,
    /// Unsynced data ops (writes, truncates/extends, punches), all files.
    pub data_ops: usize,
    /// Bytes of the unsynced writes.
    pub data_bytes: u64,
    /// Unsynced namespace ops.
    pub namespace_ops: usize,
}

/// What a power cut kept and lost. A data op counts as kept or lost by the
/// mode's decision, even when its file then vanished with its last durable
/// name; the torn write counts as lost (see `torn` for what of it stayed).
#[derive(Debug, Clone, Default)]
pub struct CutReport {
    pub data_ops_kept: usize,
    pub data_ops_lost: usize,
    pub namespace_ops_kept: usize,
    pub namespace_ops_lost: usize,
    /// The torn write: file path at the time (relative to the mount root,
    /// e.g. `"dir/file"`), offset, bytes kept of bytes written.
    pub torn: Option<(String, u64, u64, u64)>,
}
