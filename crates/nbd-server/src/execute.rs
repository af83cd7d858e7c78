//! Running one validated request against the device and building its
//! reply. READ replies are one allocation: header and data in one buffer
//! the device fills in place.

use nbd_proto::consts::*;
use nbd_proto::{
    encode_block_status_chunk, encode_none_chunk, encode_offset_data_header_into, BlockDescriptor,
    SimpleReplyHeader, OFFSET_DATA_HEADER_BYTES,
};

use crate::device::{Allocation, BlockDevice, Extent, ZeroFlags};
use crate::export::Export;
use crate::metrics::NbdOp;
use crate::reply::Reply;

/// Most extents asked of the device for one BLOCK_STATUS without REQ_ONE.
const MAX_BLOCK_STATUS_EXTENTS: usize = 1024;

/// A validated request, ready for the device once WRITE data is read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Op {
    Read {
        offset_bytes: u64,
        length_bytes: u32,
    },
    Write {
        offset_bytes: u64,
        length_bytes: u32,
        fua: bool,
        /// Read from the connection after validation.
        data: Vec<u8>,
    },
    Flush,
    Trim {
        offset_bytes: u64,
        length_bytes: u32,
        fua: bool,
    },
    Cache {
        offset_bytes: u64,
        length_bytes: u32,
    },
    WriteZeroes {
        offset_bytes: u64,
        length_bytes: u32,
        flags: ZeroFlags,
    },
    BlockStatus {
        offset_bytes: u64,
        length_bytes: u32,
        req_one: bool,
    },
}

impl Op {
    /// The command, as metrics name it.
    pub(crate) fn kind(&self) -> NbdOp {
        match self {
            Op::Read { .. } => NbdOp::Read,
            Op::Write { .. } => NbdOp::Write,
            Op::Flush => NbdOp::Flush,
            Op::Trim { .. } => NbdOp::Trim,
            Op::Cache { .. } => NbdOp::Cache,
            Op::WriteZeroes { .. } => NbdOp::WriteZeroes,
            Op::BlockStatus { .. } => NbdOp::BlockStatus,
        }
    }

    /// The length its header gives (0 for FLUSH).
    pub(crate) fn length_bytes(&self) -> u32 {
        match self {
            Op::Flush => 0,
            Op::Read { length_bytes, .. }
            | Op::Write { length_bytes, .. }
            | Op::Trim { length_bytes, .. }
            | Op::Cache { length_bytes, .. }
            | Op::WriteZeroes { length_bytes, .. }
            | Op::BlockStatus { length_bytes, .. } => *length_bytes,
        }
    }

    /// Bytes of data the request carries or asks for: what it takes of the
    /// server's byte budget (see `budget`).
    /// What the device's rate limits count of this request (`None`:
    /// nothing; never held back).
    pub(crate) fn admission(&self) -> Option<(crate::device::Admission, u64)> {
        use crate::device::Admission;
        match self {
            Op::Read { length_bytes, .. } => Some((Admission::Read, u64::from(*length_bytes))),
            Op::Write { length_bytes, .. } => Some((Admission::Write, u64::from(*length_bytes))),
            Op::Trim { .. } | Op::WriteZeroes { .. } => Some((Admission::Write, 0)),
            _ => None,
        }
    }

    pub(crate) fn data_bytes(&self) -> u32 {
        match self {
            Op::Read { length_bytes, .. } | Op::Write { length_bytes, .. } => *length_bytes,
            _ => 0,
        }
    }
}

/// Runs `op` and returns the reply for `handle`.
pub(crate) async fn execute<D: BlockDevice>(export: &Export<D>, handle: u64, op: Op) -> Reply {
    let device = &*export.device;
    let result = match op {
        Op::Read {
            offset_bytes,
            length_bytes,
        } => return read(export, handle, offset_bytes, length_bytes).await,
        Op::BlockStatus {
            offset_bytes,
            length_bytes,
            req_one,
        } => return block_status(export, handle, offset_bytes, length_bytes, req_one).await,
        Op::Write { data, .. } if data.is_empty() => Ok(()),
        Op::Write {
            offset_bytes,
            data,
            fua,
            ..
        } => device.write(offset_bytes, &data, fua).await,
        Op::Flush => device.flush().await,
        Op::Trim {
            length_bytes: 0, ..
        }
        | Op::Cache {
            length_bytes: 0, ..
        }
        | Op::WriteZeroes {
            length_bytes: 0, ..
        } => Ok(()),
        Op::Trim {
            offset_bytes,
            length_bytes,
            fua,
        } => device.trim(offset_bytes, length_bytes.into(), fua).await,
        Op::Cache {
            offset_bytes,
            length_bytes,
        } => device.cache(offset_bytes, length_bytes.into()).await,
        Op::WriteZeroes {
            offset_bytes,
            length_bytes,
            flags,
        } => {
            device
                .write_zeroes(offset_bytes, length_bytes.into(), flags)
                .await
        }
    };
    match result {
        Ok(()) => Reply::ok(handle),
        Err(error) => Reply::io_error(export.structured_replies, handle, &error),
    }
}

async fn read<D: BlockDevice>(
    export: &Export<D>,
    handle: u64,
    offset_bytes: u64,
    length_bytes: u32,
) -> Reply {
    let structured = export.structured_replies;
    if length_bytes == 0 {
        return match structured {
            true => Reply::Bytes(encode_none_chunk(handle).to_vec()),
            false => Reply::ok(handle),
        };
    }
    let header_bytes = match structured {
        true => OFFSET_DATA_HEADER_BYTES,
        false => SIMPLE_REPLY_HEADER_BYTES,
    };
    let mut buffer = vec![0u8; header_bytes + length_bytes as usize];
    let (header, data) = buffer.split_at_mut(header_bytes);
    if let Err(error) = export.device.read(offset_bytes, data).await {
        return Reply::io_error(structured, handle, &error);
    }
    let encoded = match structured {
        true => encode_offset_data_header_into(header, handle, offset_bytes, length_bytes),
        false => SimpleReplyHeader { error: 0, handle }.encode_into(header),
    };
    match encoded {
        Ok(()) => Reply::Bytes(buffer),
        Err(error) => Reply::error(structured, handle, EIO, &error.to_string()),
    }
}

async fn block_status<D: BlockDevice>(
    export: &Export<D>,
    handle: u64,
    offset_bytes: u64,
    length_bytes: u32,
    req_one: bool,
) -> Reply {
    let structured = export.structured_replies;
    let Some(context_id) = export.base_allocation_id.filter(|_| structured) else {
        return Reply::error(structured, handle, EINVAL, "no metadata context");
    };
    let max_extents = if req_one { 1 } else { MAX_BLOCK_STATUS_EXTENTS };
    let extents = match export
        .device
        .block_status(offset_bytes, length_bytes.into(), max_extents)
        .await
    {
        Ok(extents) => extents,
        Err(error) => return Reply::io_error(structured, handle, &error),
    };
    let descriptors = descriptors(&extents, length_bytes, req_one);
    match encode_block_status_chunk(handle, context_id, &descriptors) {
        Ok(chunk) => Reply::Bytes(chunk),
        Err(_) => Reply::error(true, handle, EIO, "device reported no extents"),
    }
}

/// `base:allocation` flags of an allocation state.
fn status_flags(allocation: Allocation) -> u32 {
    match allocation {
        Allocation::Data => 0,
        Allocation::Zero => STATE_ZERO,
        Allocation::Hole => STATE_HOLE | STATE_ZERO,
    }
}

/// Device extents as descriptors: zero-length runs dropped, neighbours with
/// equal status merged, clipped to the request; with `req_one`, only the
/// first run.
fn descriptors(extents: &[Extent], length_bytes: u32, req_one: bool) -> Vec<BlockDescriptor> {
    let mut remaining_bytes = length_bytes;
    let mut out: Vec<BlockDescriptor> = Vec::new();
    for extent in extents {
        let run_bytes = u32::try_from(extent.length_bytes)
            .unwrap_or(u32::MAX)
            .min(remaining_bytes);
        if run_bytes == 0 {
            if remaining_bytes == 0 {
                break;
            }
            continue;
        }
        let status_flags = status_flags(extent.allocation);
        match out.last_mut() {
            Some(last) if last.status_flags == status_flags => last.length_bytes += run_bytes,
            Some(_) if req_one => break,
            _ => out.push(BlockDescriptor {
                length_bytes: run_bytes,
                status_flags,
            }),
        }
        remaining_bytes -= run_bytes;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn extent(length_bytes: u64, allocation: Allocation) -> Extent {
        Extent {
            length_bytes,
            allocation,
        }
    }

    fn pairs(descriptors: &[BlockDescriptor]) -> Vec<(u32, u32)> {
        descriptors
            .iter()
            .map(|d| (d.length_bytes, d.status_flags))
            .collect()
    }

    #[test]
    fn merges_clips_and_skips() {
        let extents = [
            extent(0, Allocation::Hole),
            extent(512, Allocation::Data),
            extent(512, Allocation::Data),
            extent(1024, Allocation::Hole),
            extent(1 << 40, Allocation::Zero),
        ];
        assert_eq!(
            pairs(&descriptors(&extents, 3000, false)),
            vec![(1024, 0), (1024, 3), (952, 2)]
        );
        assert_eq!(pairs(&descriptors(&extents, 3000, true)), vec![(1024, 0)]);
        assert_eq!(pairs(&descriptors(&extents, 100, false)), vec![(100, 0)]);
        assert!(descriptors(&[], 100, false).is_empty());
        assert!(descriptors(&[extent(0, Allocation::Data)], 100, false).is_empty());
    }
}
