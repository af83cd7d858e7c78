//! The interface between the vhost-user-blk backend and whatever stores
//! the bytes.
//!
//! Owns the contract the backend relies on; it knows nothing of the strata
//! engine (the `strata` binary adapts the engine to it, as it does for
//! `nbd-server`). Every offset and length has been checked against
//! `size_bytes()` and the request limits before a method is called;
//! implementations are shared by every queue of a connection and must
//! allow concurrent calls.
//!
//! A method that fails logs why (the guest only sees IOERR); the backend
//! logs what it refuses or fails itself (a malformed request, a guest
//! buffer it cannot reach), and not a device's failure a second time.

use std::future::Future;
use std::io;
use std::sync::Arc;

/// What a request asks of a device, for its rate limits (`admit`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    Read,
    /// WRITE, DISCARD and WRITE_ZEROES (the last two move no payload).
    Write,
}

pub trait BlockDevice: Send + Sync + 'static {
    /// The device's size now (a multiple of 512).
    fn size_bytes(&self) -> u64;

    /// Writes, discards and zeroes are refused (VIRTIO_BLK_F_RO).
    fn is_read_only(&self) -> bool;

    /// What VIRTIO_BLK_T_GET_ID answers (at most 20 bytes are sent).
    fn id(&self) -> String;

    /// Fill `buf` with the bytes at `offset_bytes`.
    fn read(
        &self,
        offset_bytes: u64,
        buf: &mut [u8],
    ) -> impl Future<Output = io::Result<()>> + Send;

    /// Write `data` at `offset_bytes` (durable at the next `flush`).
    fn write(&self, offset_bytes: u64, data: &[u8]) -> impl Future<Output = io::Result<()>> + Send;

    /// Make every write completed before this call durable, whichever
    /// queue sent it (VIRTIO_BLK_T_FLUSH).
    fn flush(&self) -> impl Future<Output = io::Result<()>> + Send;

    /// Discard a range: it reads as zeros afterwards and costs no storage.
    fn discard(
        &self,
        offset_bytes: u64,
        length_bytes: u64,
    ) -> impl Future<Output = io::Result<()>> + Send;

    /// Make a range read as zeros; `may_unmap`: it may also free storage.
    fn write_zeroes(
        &self,
        offset_bytes: u64,
        length_bytes: u64,
        may_unmap: bool,
    ) -> impl Future<Output = io::Result<()>> + Send;

    /// Waits until the device takes one more request of `kind` moving
    /// `bytes` (its rate limits). Called before the request's buffer is
    /// allocated. May delay, never fails; FLUSH and GET_ID are never held
    /// back. The default admits at once.
    fn admit(&self, _kind: Admission, _bytes: u64) -> impl Future<Output = ()> + Send {
        async {}
    }

    /// Follows the device's size, when it can change while served (an
    /// online resize): the backend then tells the frontend, which tells
    /// the guest (a configuration change). `None`: the size is fixed.
    fn size_watch(&self) -> Option<tokio::sync::watch::Receiver<u64>> {
        None
    }
}

/// The devices a server can serve, opened by name when a frontend connects
/// (so a socket nobody uses costs no opened volume).
pub trait DeviceProvider: Send + Sync + 'static {
    type Device: BlockDevice;

    /// Open the device served on a socket as `name`.
    fn open(&self, name: &str) -> impl Future<Output = io::Result<Arc<Self::Device>>> + Send;
}
