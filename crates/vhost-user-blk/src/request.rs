//! A virtio-blk request read from a chain's buffers and checked against
//! the device: what the guest asks, where its data and status byte are.
//!
//! Owns the rules of virtio 1.2 §5.2.6 a guest can break. The layout is
//! taken from byte offsets across the chain, not from descriptor
//! boundaries (a driver may split the 16-byte header or put data and
//! status in one buffer, as QEMU's own device allows): the header is the
//! first 16 device-readable bytes, the status the last device-writable
//! byte, the data what lies between. Every sector, length and segment is
//! checked here, before the device sees the request; guest addresses are
//! checked by `vm-memory` on each access.

use virtio_bindings::virtio_blk::{
    VIRTIO_BLK_ID_BYTES, VIRTIO_BLK_S_IOERR, VIRTIO_BLK_S_UNSUPP, VIRTIO_BLK_T_DISCARD,
    VIRTIO_BLK_T_FLUSH, VIRTIO_BLK_T_GET_ID, VIRTIO_BLK_T_IN, VIRTIO_BLK_T_OUT,
    VIRTIO_BLK_T_WRITE_ZEROES, VIRTIO_BLK_WRITE_ZEROES_FLAG_UNMAP,
};
use vm_memory::{Address, Bytes, GuestAddress, GuestMemory, Permissions};

use crate::chain::Segment;
use crate::config_space::Limits;

/// Bytes of a virtio-blk sector: every offset in a request counts these.
pub const SECTOR_BYTES: u64 = 512;
/// Bytes of the request header: type (le32), reserved (le32), sector (le64).
pub const HEADER_BYTES: u64 = 16;
/// Bytes of one discard / write-zeroes range: sector (le64),
/// num_sectors (le32), flags (le32).
pub const RANGE_BYTES: u64 = 16;

/// A run of guest memory: part of one or more of the chain's buffers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Span {
    pub addr: GuestAddress,
    pub len_bytes: u32,
}

/// One range of a DISCARD or WRITE_ZEROES request, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Range {
    pub offset_bytes: u64,
    pub length_bytes: u64,
    /// WRITE_ZEROES with VIRTIO_BLK_WRITE_ZEROES_FLAG_UNMAP.
    pub unmap: bool,
}

/// What a valid request asks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    /// Read `length_bytes` at `offset_bytes` into `data`.
    Read {
        offset_bytes: u64,
        data: Vec<Span>,
    },
    /// Write `data` at `offset_bytes`.
    Write {
        offset_bytes: u64,
        data: Vec<Span>,
    },
    Flush,
    /// Write the device id (at most 20 bytes) into `data`.
    GetId {
        data: Vec<Span>,
    },
    Discard {
        ranges: Vec<Range>,
    },
    WriteZeroes {
        ranges: Vec<Range>,
    },
}

/// A request whose status byte can be written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    pub status: GuestAddress,
    /// The request, or the status to answer at once and why.
    pub op: Result<Op, Refusal>,
}

/// A request refused with a status (IOERR or UNSUPP) and a reason for
/// the log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub status: u8,
    pub reason: String,
}

fn ioerr(reason: impl Into<String>) -> Refusal {
    Refusal {
        status: VIRTIO_BLK_S_IOERR as u8,
        reason: reason.into(),
    }
}

fn unsupp(reason: impl Into<String>) -> Refusal {
    Refusal {
        status: VIRTIO_BLK_S_UNSUPP as u8,
        reason: reason.into(),
    }
}

/// What the parser needs to know of the device.
#[derive(Debug, Clone, Copy)]
pub struct DeviceShape {
    pub capacity_bytes: u64,
    pub read_only: bool,
    pub limits: Limits,
}

/// Parses a chain. `Err` when there is no status byte to answer in (no
/// device-writable byte): the chain can only be returned unused.
pub fn parse<M: GuestMemory>(
    mem: &M,
    segments: &[Segment],
    shape: &DeviceShape,
) -> Result<Request, String> {
    let (readable, writable) = split_spans(segments)?;
    let writable_bytes: u64 = writable.iter().map(|s| u64::from(s.len_bytes)).sum();
    if writable_bytes == 0 {
        return Err("no device-writable byte for the status".to_string());
    }
    let (data_out, status) = take_tail(&writable, 1);
    let status = status
        .first()
        .map(|s| s.addr)
        .ok_or_else(|| "no status byte".to_string())?;
    let op = parse_op(mem, &readable, data_out, shape);
    Ok(Request { status, op })
}

/// The chain's buffers as device-readable and device-writable spans
/// (zero-length buffers dropped); the walker already refused a readable
/// buffer after a writable one.
fn split_spans(segments: &[Segment]) -> Result<(Vec<Span>, Vec<Span>), String> {
    let mut readable = Vec::new();
    let mut writable = Vec::new();
    for s in segments.iter().filter(|s| s.len_bytes > 0) {
        // A buffer that wraps past the end of the address space is never
        // memory; refuse it here so no sum below can overflow either.
        if s.addr.checked_add(u64::from(s.len_bytes)).is_none() {
            return Err(format!(
                "buffer at {:#x} of {} bytes wraps the address space",
                s.addr.raw_value(),
                s.len_bytes
            ));
        }
        let span = Span {
            addr: s.addr,
            len_bytes: s.len_bytes,
        };
        if s.device_writable {
            writable.push(span);
        } else {
            readable.push(span);
        }
    }
    Ok((readable, writable))
}

fn parse_op<M: GuestMemory>(
    mem: &M,
    readable: &[Span],
    data_out: Vec<Span>,
    shape: &DeviceShape,
) -> Result<Op, Refusal> {
    let readable_bytes: u64 = readable.iter().map(|s| u64::from(s.len_bytes)).sum();
    if readable_bytes < HEADER_BYTES {
        return Err(ioerr(format!(
            "request header of {readable_bytes} bytes, 16 needed"
        )));
    }
    let (header, data_in) = take_head(readable, HEADER_BYTES);
    let mut raw = [0u8; HEADER_BYTES as usize];
    read_spans(mem, &header, &mut raw).map_err(ioerr)?;
    let kind = u32::from_le_bytes([raw[0], raw[1], raw[2], raw[3]]);
    let sector = u64::from_le_bytes([
        raw[8], raw[9], raw[10], raw[11], raw[12], raw[13], raw[14], raw[15],
    ]);
    let in_bytes = bytes_of(&data_in);
    let out_bytes = bytes_of(&data_out);
    // Checked before the device does any work for the request.
    in_memory(mem, &data_in, Permissions::Read).and(in_memory(
        mem,
        &data_out,
        Permissions::Write,
    ))?;
    match kind {
        VIRTIO_BLK_T_IN => {
            expect_none(in_bytes, "read")?;
            let offset_bytes = check_io(sector, out_bytes, shape, "read")?;
            Ok(Op::Read {
                offset_bytes,
                data: data_out,
            })
        }
        VIRTIO_BLK_T_OUT => {
            expect_none(out_bytes, "write")?;
            writable(shape, "write")?;
            let offset_bytes = check_io(sector, in_bytes, shape, "write")?;
            Ok(Op::Write {
                offset_bytes,
                data: data_in,
            })
        }
        VIRTIO_BLK_T_FLUSH => {
            expect_none(in_bytes, "flush")?;
            Ok(Op::Flush)
        }
        VIRTIO_BLK_T_GET_ID => {
            expect_none(in_bytes, "get-id")?;
            let (id, _) = take_head(&data_out, u64::from(VIRTIO_BLK_ID_BYTES));
            Ok(Op::GetId { data: id })
        }
        VIRTIO_BLK_T_DISCARD | VIRTIO_BLK_T_WRITE_ZEROES => {
            let zeroes = kind == VIRTIO_BLK_T_WRITE_ZEROES;
            expect_none(out_bytes, "discard/write-zeroes")?;
            writable(shape, "discard/write-zeroes")?;
            let ranges = parse_ranges(mem, &data_in, in_bytes, zeroes, shape)?;
            Ok(if zeroes {
                Op::WriteZeroes { ranges }
            } else {
                Op::Discard { ranges }
            })
        }
        other => Err(unsupp(format!("request type {other} is not supported"))),
    }
}

/// Every byte of `spans` is guest memory.
fn in_memory<M: GuestMemory>(mem: &M, spans: &[Span], access: Permissions) -> Result<(), Refusal> {
    match spans
        .iter()
        .find(|s| !mem.check_range(s.addr, s.len_bytes as usize, access))
    {
        None => Ok(()),
        Some(s) => Err(ioerr(format!(
            "guest buffer at {:#x} ({} bytes) is not guest memory",
            s.addr.raw_value(),
            s.len_bytes
        ))),
    }
}

fn expect_none(bytes: u64, what: &str) -> Result<(), Refusal> {
    if bytes == 0 {
        Ok(())
    } else {
        Err(ioerr(format!(
            "{what} request with {bytes} bytes of data in the wrong direction"
        )))
    }
}

fn writable(shape: &DeviceShape, what: &str) -> Result<(), Refusal> {
    if shape.read_only {
        Err(ioerr(format!("{what} to a read-only device")))
    } else {
        Ok(())
    }
}

/// A read or write: whole sectors, within the request limit and the
/// device. Returns the byte offset.
fn check_io(sector: u64, len_bytes: u64, shape: &DeviceShape, what: &str) -> Result<u64, Refusal> {
    if !len_bytes.is_multiple_of(SECTOR_BYTES) {
        return Err(ioerr(format!(
            "{what} of {len_bytes} bytes: not whole 512-byte sectors"
        )));
    }
    if len_bytes > u64::from(shape.limits.max_request_bytes) {
        return Err(ioerr(format!(
            "{what} of {len_bytes} bytes: more than the {} a request may move",
            shape.limits.max_request_bytes
        )));
    }
    within_device(sector, len_bytes, shape.capacity_bytes, what)
}

fn within_device(
    sector: u64,
    len_bytes: u64,
    capacity_bytes: u64,
    what: &str,
) -> Result<u64, Refusal> {
    let end = sector
        .checked_mul(SECTOR_BYTES)
        .and_then(|o| o.checked_add(len_bytes).map(|e| (o, e)));
    match end {
        Some((offset, end)) if end <= capacity_bytes => Ok(offset),
        _ => Err(ioerr(format!(
            "{what} of {len_bytes} bytes at sector {sector}: past the end of the device ({capacity_bytes} bytes)"
        ))),
    }
}

fn parse_ranges<M: GuestMemory>(
    mem: &M,
    data: &[Span],
    bytes: u64,
    zeroes: bool,
    shape: &DeviceShape,
) -> Result<Vec<Range>, Refusal> {
    let (what, max_ranges, max_sectors) = if zeroes {
        let l = &shape.limits;
        (
            "write-zeroes",
            l.max_write_zeroes_ranges,
            l.max_write_zeroes_sectors,
        )
    } else {
        let l = &shape.limits;
        ("discard", l.max_discard_ranges, l.max_discard_sectors)
    };
    if bytes == 0 || !bytes.is_multiple_of(RANGE_BYTES) {
        return Err(ioerr(format!(
            "{what} with {bytes} bytes of ranges: a non-zero multiple of 16 needed"
        )));
    }
    let count = bytes / RANGE_BYTES;
    if count > u64::from(max_ranges) {
        return Err(ioerr(format!(
            "{what} of {count} ranges: at most {max_ranges}"
        )));
    }
    let mut raw = vec![0u8; bytes as usize];
    read_spans(mem, data, &mut raw).map_err(ioerr)?;
    let mut ranges = Vec::with_capacity(count as usize);
    for chunk in raw.chunks_exact(RANGE_BYTES as usize) {
        let sector = u64::from_le_bytes(chunk[0..8].try_into().unwrap_or([0; 8]));
        let sectors = u32::from_le_bytes(chunk[8..12].try_into().unwrap_or([0; 4]));
        let flags = u32::from_le_bytes(chunk[12..16].try_into().unwrap_or([0; 4]));
        let allowed = if zeroes {
            VIRTIO_BLK_WRITE_ZEROES_FLAG_UNMAP
        } else {
            0
        };
        if flags & !allowed != 0 {
            return Err(unsupp(format!("{what} range with flags {flags:#x}")));
        }
        if sectors > max_sectors {
            return Err(ioerr(format!(
                "{what} range of {sectors} sectors: at most {max_sectors}"
            )));
        }
        let length_bytes = u64::from(sectors) * SECTOR_BYTES;
        let offset_bytes = within_device(sector, length_bytes, shape.capacity_bytes, what)?;
        ranges.push(Range {
            offset_bytes,
            length_bytes,
            unmap: flags & VIRTIO_BLK_WRITE_ZEROES_FLAG_UNMAP != 0,
        });
    }
    Ok(ranges)
}

/// Total bytes of `spans` (each fits a u32, and there are at most
/// MAX_CHAIN_SEGMENTS: no overflow in u64).
pub fn bytes_of(spans: &[Span]) -> u64 {
    spans.iter().map(|s| u64::from(s.len_bytes)).sum()
}

/// The first `n` bytes of `spans`, and the rest.
fn take_head(spans: &[Span], n: u64) -> (Vec<Span>, Vec<Span>) {
    let mut head = Vec::new();
    let mut tail = Vec::new();
    let mut left = n;
    for s in spans {
        let len = u64::from(s.len_bytes);
        if left == 0 {
            tail.push(*s);
        } else if len <= left {
            head.push(*s);
            left -= len;
        } else {
            head.push(Span {
                addr: s.addr,
                len_bytes: left as u32,
            });
            tail.push(Span {
                // Cannot wrap: split_spans refused buffers that do.
                addr: s.addr.unchecked_add(left),
                len_bytes: (len - left) as u32,
            });
            left = 0;
        }
    }
    (head, tail)
}

/// All but the last `n` bytes of `spans`, and those `n`.
fn take_tail(spans: &[Span], n: u64) -> (Vec<Span>, Vec<Span>) {
    let total = bytes_of(spans);
    take_head(spans, total.saturating_sub(n))
}

/// Copies guest memory at `spans` into `buf` (their total length).
pub fn read_spans<M: GuestMemory>(mem: &M, spans: &[Span], buf: &mut [u8]) -> Result<(), String> {
    let mut at = 0usize;
    for s in spans {
        let len = s.len_bytes as usize;
        let dst = buf
            .get_mut(at..at + len)
            .ok_or_else(|| "guest buffers longer than the request".to_string())?;
        mem.read_slice(dst, s.addr).map_err(|e| {
            format!(
                "guest buffer at {:#x} ({len} bytes): {e}",
                s.addr.raw_value()
            )
        })?;
        at += len;
    }
    Ok(())
}

/// Copies `buf` into guest memory at `spans`, as far as both go.
pub fn write_spans<M: GuestMemory>(mem: &M, spans: &[Span], buf: &[u8]) -> Result<(), String> {
    let mut at = 0usize;
    for s in spans {
        if at >= buf.len() {
            break;
        }
        let len = (s.len_bytes as usize).min(buf.len() - at);
        mem.write_slice(&buf[at..at + len], s.addr).map_err(|e| {
            format!(
                "guest buffer at {:#x} ({len} bytes): {e}",
                s.addr.raw_value()
            )
        })?;
        at += len;
    }
    Ok(())
}
