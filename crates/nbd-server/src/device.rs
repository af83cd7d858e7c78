//! The interface between the NBD server and whatever stores the bytes.
//!
//! This module owns the contract the server core relies on; it knows nothing
//! of the strata engine (the `strata` binary adapts the engine to it), the
//! way nbdkit's core knows nothing of its plugins.
//!
//! Errors are `std::io::Error`; the server maps their kind to an NBD errno:
//! `InvalidInput` -> EINVAL, `StorageFull` -> ENOSPC, `Unsupported` ->
//! ENOTSUP, `PermissionDenied`/`ReadOnlyFilesystem` -> EPERM, anything else -> EIO.

use std::future::Future;
use std::io;
use std::sync::Arc;

/// Allocation state of a range, as `base:allocation` reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Allocation {
    /// Stored data.
    Data,
    /// Allocated but known to read as zeros (NBD_STATE_ZERO).
    Zero,
    /// Not allocated; reads as zeros (NBD_STATE_HOLE | NBD_STATE_ZERO).
    Hole,
}

/// One run of `length_bytes` bytes with the same allocation state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Extent {
    pub length_bytes: u64,
    pub allocation: Allocation,
}

/// Flags of NBD_CMD_WRITE_ZEROES the device must honour.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ZeroFlags {
    /// Reply only once the zeroes are durable (NBD_CMD_FLAG_FUA).
    pub fua: bool,
    /// The range must stay allocated (NBD_CMD_FLAG_NO_HOLE).
    pub no_hole: bool,
    /// Fail with ENOTSUP rather than zero slowly (NBD_CMD_FLAG_FAST_ZERO).
    pub fast_zero: bool,
}

/// Block size constraints advertised with NBD_INFO_BLOCK_SIZE.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockSizes {
    pub minimum_bytes: u32,
    pub preferred_bytes: u32,
    pub maximum_bytes: u32,
}

impl Default for BlockSizes {
    fn default() -> Self {
        BlockSizes {
            minimum_bytes: 1,
            preferred_bytes: 4096,
            maximum_bytes: 32 * 1024 * 1024,
        }
    }
}

/// What a request asks of a device, for its rate limits (`admit`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// READ.
    Read,
    /// WRITE, TRIM and WRITE_ZEROES (the last two move no payload: 0
    /// bytes).
    Write,
}

/// A block device behind one export. All offsets and lengths have been
/// checked by the server against `size_bytes()` and the block sizes before a
/// method is called. Implementations are shared by every connection to the
/// export and must allow concurrent calls.
pub trait BlockDevice: Send + Sync + 'static {
    /// Size of the device; fixed while it is exported.
    fn size_bytes(&self) -> u64;

    /// Block size constraints for NBD_INFO_BLOCK_SIZE.
    fn block_sizes(&self) -> BlockSizes {
        BlockSizes::default()
    }

    /// Whether the device accepts writes (else NBD_FLAG_READ_ONLY).
    fn is_read_only(&self) -> bool {
        false
    }

    /// Fill `buf` with the bytes at `offset_bytes`.
    fn read(
        &self,
        offset_bytes: u64,
        buf: &mut [u8],
    ) -> impl Future<Output = io::Result<()>> + Send;

    /// Write `data` at `offset_bytes`. With `fua`, return only once durable.
    fn write(
        &self,
        offset_bytes: u64,
        data: &[u8],
        fua: bool,
    ) -> impl Future<Output = io::Result<()>> + Send;

    /// Make every write completed before this call durable, whichever
    /// connection sent it (this is what NBD_FLAG_CAN_MULTI_CONN promises).
    fn flush(&self) -> impl Future<Output = io::Result<()>> + Send;

    /// Discard a range: it reads as zeros afterwards and costs no storage.
    fn trim(
        &self,
        offset_bytes: u64,
        length_bytes: u64,
        fua: bool,
    ) -> impl Future<Output = io::Result<()>> + Send;

    /// Make a range read as zeros.
    fn write_zeroes(
        &self,
        offset_bytes: u64,
        length_bytes: u64,
        flags: ZeroFlags,
    ) -> impl Future<Output = io::Result<()>> + Send;

    /// Allocation of `[offset_bytes, offset_bytes + length_bytes)`, from
    /// `offset_bytes` on, in order, at most `max_extents` runs. The runs may
    /// cover less than the whole range but must cover at least one byte.
    fn block_status(
        &self,
        offset_bytes: u64,
        length_bytes: u64,
        max_extents: usize,
    ) -> impl Future<Output = io::Result<Vec<Extent>>> + Send;

    /// Waits until the device takes one more request of `kind` moving
    /// `bytes` (a rate limit of the device: IOPS, bandwidth). Called by the
    /// connection's reader before the request's payload is read or any
    /// server-wide byte budget taken, so a request held back here holds
    /// nothing other devices need, and the client is slowed by the socket
    /// itself. FLUSH, CACHE and BLOCK_STATUS are never held back. May
    /// delay, never fails. The default admits at once.
    fn admit(&self, _kind: Admission, _bytes: u64) -> impl Future<Output = ()> + Send {
        async {}
    }

    /// Hint that a range will be read soon (NBD_CMD_CACHE).
    fn cache(
        &self,
        _offset_bytes: u64,
        _length_bytes: u64,
    ) -> impl Future<Output = io::Result<()>> + Send {
        async { Ok(()) }
    }
}

/// What the server lists and opens: the set of exports.
pub trait ExportProvider: Send + Sync + 'static {
    type Device: BlockDevice;

    /// Export names and descriptions for NBD_OPT_LIST.
    fn list(&self) -> impl Future<Output = io::Result<Vec<ExportInfo>>> + Send;

    /// Open an export by name. `io::ErrorKind::NotFound` means no such export
    /// (the client gets NBD_REP_ERR_UNKNOWN); other errors are logged and
    /// reported as NBD_REP_ERR_UNKNOWN too, with the message as reply text.
    /// Called once per connection; the provider may share one device between
    /// connections.
    fn open(&self, name: &str) -> impl Future<Output = io::Result<Arc<Self::Device>>> + Send;

    /// The group whose counters a connection to export `name` adds to
    /// (`Server::metrics`): by default the export itself. A provider with
    /// many exports of one thing (snapshots of a volume) may group them,
    /// so that monitoring sees few series. Called once per connection,
    /// after `open` succeeded.
    fn metrics_group(&self, name: &str) -> String {
        name.to_string()
    }
}

/// One entry of NBD_OPT_LIST.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExportInfo {
    pub name: String,
    pub description: String,
}
