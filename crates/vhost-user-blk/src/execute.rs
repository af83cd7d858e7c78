//! Running one parsed request against the device: data copied between
//! guest buffers and a buffer of the request's own (the device never sees
//! guest memory, which the guest may change under it), the status the
//! guest gets, and the bytes it was given.
//!
//! Memory: a request's buffer is taken from the server's byte budget
//! before it is allocated, so the data in flight is bounded by
//! configuration, not by what guests queue.
//!
//! Guest memory is written here only into a read's data buffers and
//! GET_ID's: `written_spans` says which, for the dirty log of a migration
//! (`dirty_log.rs`), and must change with any new write here.

use std::sync::Arc;

use tokio::sync::Semaphore;
use virtio_bindings::virtio_blk::{VIRTIO_BLK_ID_BYTES, VIRTIO_BLK_S_IOERR, VIRTIO_BLK_S_OK};
use vm_memory::GuestMemory;

use crate::device::{Admission, BlockDevice};
use crate::request::{bytes_of, read_spans, write_spans, Op, Span};

/// Bytes per permit of the byte budget (a semaphore counts permits).
pub const BUDGET_UNIT_BYTES: u64 = 4096;

/// What the guest gets back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    pub status: u8,
    /// Bytes written into the guest's device-writable data buffers.
    pub written_bytes: u32,
    /// Why the status is not OK.
    pub failure: Option<String>,
    /// The device's own method failed: the device has logged it (see
    /// `BlockDevice`), the backend does not log it again.
    pub device_error: bool,
}

impl Outcome {
    fn ok(written_bytes: u32) -> Outcome {
        Outcome {
            status: VIRTIO_BLK_S_OK as u8,
            written_bytes,
            failure: None,
            device_error: false,
        }
    }

    /// IOERR for something the backend found (guest memory, shutdown).
    fn ioerr(why: String) -> Outcome {
        Outcome {
            status: VIRTIO_BLK_S_IOERR as u8,
            written_bytes: 0,
            failure: Some(why),
            device_error: false,
        }
    }

    /// IOERR for a failed device method.
    fn device_failed(why: String) -> Outcome {
        Outcome {
            device_error: true,
            ..Outcome::ioerr(why)
        }
    }
}

/// Runs `op`. `budget` bounds the bytes of request buffers alive at once.
pub async fn execute<D: BlockDevice, M: GuestMemory>(
    device: &D,
    mem: &M,
    op: &Op,
    budget: &Semaphore,
) -> Outcome {
    match op {
        Op::Read { offset_bytes, data } => read(device, mem, *offset_bytes, data, budget).await,
        Op::Write { offset_bytes, data } => write(device, mem, *offset_bytes, data, budget).await,
        Op::Flush => match device.flush().await {
            Ok(()) => Outcome::ok(0),
            Err(e) => Outcome::device_failed(format!("flush: {e}")),
        },
        Op::GetId { data } => {
            let mut id = device.id().into_bytes();
            id.resize(VIRTIO_BLK_ID_BYTES as usize, 0);
            let n = bytes_of(data).min(id.len() as u64) as usize;
            match write_spans(mem, data, &id[..n]) {
                Ok(()) => Outcome::ok(n as u32),
                Err(e) => Outcome::ioerr(format!("get-id: {e}")),
            }
        }
        Op::Discard { ranges } | Op::WriteZeroes { ranges } => {
            let zeroes = matches!(op, Op::WriteZeroes { .. });
            for r in ranges {
                device.admit(Admission::Write, 0).await;
                let done = if zeroes {
                    device
                        .write_zeroes(r.offset_bytes, r.length_bytes, r.unmap)
                        .await
                } else {
                    device.discard(r.offset_bytes, r.length_bytes).await
                };
                if let Err(e) = done {
                    let what = if zeroes { "write-zeroes" } else { "discard" };
                    return Outcome::device_failed(format!(
                        "{what} of {} bytes at {}: {e}",
                        r.length_bytes, r.offset_bytes
                    ));
                }
            }
            Outcome::ok(0)
        }
    }
}

/// The guest buffers `execute` may write for `op` (a read's data, the id
/// of a GET_ID): what a migration's dirty log marks once it completes.
pub fn written_spans(op: Op) -> Vec<Span> {
    match op {
        Op::Read { data, .. } | Op::GetId { data } => data,
        Op::Write { .. } | Op::Flush | Op::Discard { .. } | Op::WriteZeroes { .. } => Vec::new(),
    }
}

async fn read<D: BlockDevice, M: GuestMemory>(
    device: &D,
    mem: &M,
    offset_bytes: u64,
    data: &[Span],
    budget: &Semaphore,
) -> Outcome {
    let len = bytes_of(data);
    let (_permit, mut buf) = match buffer(device, Admission::Read, len, budget).await {
        Ok(b) => b,
        Err(stopping) => return stopping,
    };
    if let Err(e) = device.read(offset_bytes, &mut buf).await {
        return Outcome::device_failed(format!("read of {len} bytes at {offset_bytes}: {e}"));
    }
    match write_spans(mem, data, &buf) {
        Ok(()) => Outcome::ok(len as u32),
        Err(e) => Outcome::ioerr(format!("read of {len} bytes at {offset_bytes}: {e}")),
    }
}

async fn write<D: BlockDevice, M: GuestMemory>(
    device: &D,
    mem: &M,
    offset_bytes: u64,
    data: &[Span],
    budget: &Semaphore,
) -> Outcome {
    let len = bytes_of(data);
    let (_permit, mut buf) = match buffer(device, Admission::Write, len, budget).await {
        Ok(b) => b,
        Err(stopping) => return stopping,
    };
    if let Err(e) = read_spans(mem, data, &mut buf) {
        return Outcome::ioerr(format!("write of {len} bytes at {offset_bytes}: {e}"));
    }
    match device.write(offset_bytes, &buf).await {
        Ok(()) => Outcome::ok(0),
        Err(e) => Outcome::device_failed(format!("write of {len} bytes at {offset_bytes}: {e}")),
    }
}

/// A request's buffer of `len` bytes, once the device's rate limits admit
/// it and the server's byte budget has room (in that order: a request held
/// back by its volume's limits holds no budget other volumes need).
async fn buffer<'a, D: BlockDevice>(
    device: &D,
    kind: Admission,
    len: u64,
    budget: &'a Semaphore,
) -> Result<(tokio::sync::SemaphorePermit<'a>, Vec<u8>), Outcome> {
    device.admit(kind, len).await;
    match budget.acquire_many(permits(len)).await {
        Ok(permit) => Ok((permit, vec![0u8; len as usize])),
        Err(_) => Err(Outcome::ioerr("the server is stopping".to_string())),
    }
}

/// Permits for `bytes` (at least one: an empty request still counts).
fn permits(bytes: u64) -> u32 {
    bytes.div_ceil(BUDGET_UNIT_BYTES).max(1) as u32
}

/// The byte budget of a server: `max_bytes` of request buffers at once
/// (at least one largest request, so any request can run).
pub fn budget(max_bytes: u64, max_request_bytes: u32) -> Arc<Semaphore> {
    let bytes = max_bytes.max(u64::from(max_request_bytes));
    Arc::new(Semaphore::new(permits(bytes) as usize))
}
