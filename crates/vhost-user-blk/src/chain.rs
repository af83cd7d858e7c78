//! Walking one descriptor chain of a split virtqueue, from its head index,
//! into a bounded list of guest buffers.
//!
//! Owns the rules of virtio 1.2 §2.7.5 (the descriptor table) that a guest
//! can break: indices past the table, loops, an indirect table that is
//! empty, misaligned, too long or nested, a chain that mixes the INDIRECT
//! and NEXT flags, and a device-readable buffer after a device-writable
//! one. Every broken rule is an error, never a panic; nothing here reads
//! guest memory outside what `vm-memory` checks.
//!
//! Why not `virtio_queue::DescriptorChain`: its constructor is private to
//! the crate, and a restarted backend must rebuild the chains of requests
//! the old process had taken (inflight tracking gives their head indices,
//! not an available-ring position). One walker serves both paths.

use virtio_bindings::virtio_ring::{VRING_DESC_F_INDIRECT, VRING_DESC_F_NEXT, VRING_DESC_F_WRITE};
use virtio_queue::desc::split::Descriptor;
use vm_memory::{Address, Bytes, GuestAddress, GuestMemory};

/// Bytes of one split-ring descriptor.
pub const DESCRIPTOR_BYTES: u64 = 16;

/// At most this many buffers in one chain, indirect tables included.
/// Linux's virtio-blk puts at most seg_max + 2; QEMU's own limit is 1024
/// (VIRTQUEUE_MAX_SIZE).
pub const MAX_CHAIN_SEGMENTS: usize = 1024;

/// One guest buffer of a chain, as the guest described it (not yet
/// checked against guest memory: the request parser does that when it
/// reads or writes it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Segment {
    pub addr: GuestAddress,
    pub len_bytes: u32,
    /// VRING_DESC_F_WRITE: the device writes it (read data, status).
    pub device_writable: bool,
}

/// Why a chain cannot be used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChainError {
    /// A descriptor index at or past the table's size.
    IndexOutOfRange { index: u16, table_len: u32 },
    /// More descriptors than the table holds: the chain loops.
    Loop,
    /// More than MAX_CHAIN_SEGMENTS buffers.
    TooLong,
    /// The descriptor table (or an indirect one) is not in guest memory.
    TableNotInMemory(u64),
    /// An indirect table whose length is 0, not a multiple of 16 or too big.
    BadIndirectTable { len_bytes: u32 },
    /// INDIRECT without the feature, inside an indirect table, or with NEXT.
    IndirectNotAllowed,
    /// A device-readable buffer after a device-writable one.
    ReadableAfterWritable,
}

impl std::fmt::Display for ChainError {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        match self {
            ChainError::IndexOutOfRange { index, table_len } => {
                write!(f, "descriptor index {index} past a table of {table_len}")
            }
            ChainError::Loop => write!(f, "the descriptor chain loops"),
            ChainError::TooLong => write!(f, "more than {MAX_CHAIN_SEGMENTS} descriptors"),
            ChainError::TableNotInMemory(a) => {
                write!(f, "descriptor table at {a:#x} is not in guest memory")
            }
            ChainError::BadIndirectTable { len_bytes } => {
                write!(f, "indirect descriptor table of {len_bytes} bytes")
            }
            ChainError::IndirectNotAllowed => write!(f, "indirect descriptor not allowed here"),
            ChainError::ReadableAfterWritable => {
                write!(
                    f,
                    "a device-readable descriptor after a device-writable one"
                )
            }
        }
    }
}

/// Where a chain's descriptors live.
#[derive(Debug, Clone, Copy)]
pub struct Table {
    pub addr: GuestAddress,
    /// Descriptors in the table (the queue size, or an indirect table's).
    pub len: u32,
}

/// The buffers of the chain starting at `head` in `table`, in order.
/// `indirect_allowed`: VIRTIO_RING_F_INDIRECT_DESC was negotiated.
pub fn walk<M: GuestMemory>(
    mem: &M,
    table: Table,
    head: u16,
    indirect_allowed: bool,
) -> Result<Vec<Segment>, ChainError> {
    let mut out = Vec::new();
    let mut index = head;
    // A chain visits each descriptor of the table at most once.
    let mut budget = table.len;
    loop {
        let desc = read_descriptor(mem, table, index)?;
        budget = budget.checked_sub(1).ok_or(ChainError::Loop)?;
        let flags = u32::from(desc.flags());
        if flags & VRING_DESC_F_INDIRECT != 0 {
            if !indirect_allowed || flags & VRING_DESC_F_NEXT != 0 || !out.is_empty() {
                return Err(ChainError::IndirectNotAllowed);
            }
            return walk_indirect(mem, desc, out);
        }
        push(&mut out, &desc)?;
        if flags & VRING_DESC_F_NEXT == 0 {
            return Ok(out);
        }
        index = desc.next();
        if budget == 0 {
            return Err(ChainError::Loop);
        }
    }
}

/// An indirect table: the whole chain is in it (virtio 1.2 §2.7.5.3.1:
/// the driver must not set INDIRECT together with NEXT, nor nest tables).
fn walk_indirect<M: GuestMemory>(
    mem: &M,
    desc: Descriptor,
    mut out: Vec<Segment>,
) -> Result<Vec<Segment>, ChainError> {
    let len_bytes = desc.len();
    let count = u64::from(len_bytes) / DESCRIPTOR_BYTES;
    if len_bytes == 0
        || !u64::from(len_bytes).is_multiple_of(DESCRIPTOR_BYTES)
        || count > MAX_CHAIN_SEGMENTS as u64
    {
        return Err(ChainError::BadIndirectTable { len_bytes });
    }
    let table = Table {
        addr: desc.addr(),
        len: count as u32,
    };
    let mut index = 0u16;
    let mut budget = table.len;
    loop {
        let d = read_descriptor(mem, table, index)?;
        budget = budget.checked_sub(1).ok_or(ChainError::Loop)?;
        let flags = u32::from(d.flags());
        if flags & VRING_DESC_F_INDIRECT != 0 {
            return Err(ChainError::IndirectNotAllowed);
        }
        push(&mut out, &d)?;
        if flags & VRING_DESC_F_NEXT == 0 {
            return Ok(out);
        }
        index = d.next();
        if budget == 0 {
            return Err(ChainError::Loop);
        }
    }
}

fn read_descriptor<M: GuestMemory>(
    mem: &M,
    table: Table,
    index: u16,
) -> Result<Descriptor, ChainError> {
    if u32::from(index) >= table.len {
        return Err(ChainError::IndexOutOfRange {
            index,
            table_len: table.len,
        });
    }
    let addr = table
        .addr
        .checked_add(u64::from(index) * DESCRIPTOR_BYTES)
        .ok_or(ChainError::TableNotInMemory(table.addr.raw_value()))?;
    mem.read_obj::<Descriptor>(addr)
        .map_err(|_| ChainError::TableNotInMemory(addr.raw_value()))
}

fn push(out: &mut Vec<Segment>, desc: &Descriptor) -> Result<(), ChainError> {
    if out.len() >= MAX_CHAIN_SEGMENTS {
        return Err(ChainError::TooLong);
    }
    let device_writable = u32::from(desc.flags()) & VRING_DESC_F_WRITE != 0;
    if !device_writable && out.last().is_some_and(|s: &Segment| s.device_writable) {
        return Err(ChainError::ReadableAfterWritable);
    }
    out.push(Segment {
        addr: desc.addr(),
        len_bytes: desc.len(),
        device_writable,
    });
    Ok(())
}
