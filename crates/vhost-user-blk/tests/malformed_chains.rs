//! Every way a guest can break a descriptor chain or a virtio-blk request,
//! and the exact outcome of each: the walker's `ChainError`, the parser's
//! refusal (status IOERR = 1 or UNSUPP = 2, and why), or no request at all
//! when there is no status byte. Descriptors and requests are written into
//! a real `GuestMemoryMmap`; requests that pass run through `execute`
//! against a device backed by a `Vec<u8>` that records every call, so the
//! tests also check that nothing outside the volume or the guest's own
//! buffers is touched.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io;
use std::sync::Mutex;

use vhost_user_blk::chain::{walk, ChainError, Segment, Table, MAX_CHAIN_SEGMENTS};
use vhost_user_blk::config_space::Limits;
use vhost_user_blk::execute::{budget, execute, Outcome};
use vhost_user_blk::request::{parse, DeviceShape, Op, Range, Refusal, Request, Span};
use vhost_user_blk::BlockDevice;
use virtio_queue::desc::split::Descriptor;
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

// ---- guest memory and descriptors ----------------------------------------

/// Bytes of guest memory: one region at guest address 0.
const MEM_BYTES: u64 = 1 << 20;
/// Where the queue's descriptor table is, and its size.
const TABLE: u64 = 0x1000;
const QUEUE_SIZE: u32 = 16;
/// Where tests put indirect tables.
const INDIRECT: u64 = 0x4000;
/// Guest buffers live from here on.
const BUFS: u64 = 0x10000;
/// An address past guest memory.
const OUTSIDE: u64 = 2 << 20;

const NEXT: u16 = 1;
const WRITE: u16 = 2;
const INDIRECT_FLAG: u16 = 4;

const T_IN: u32 = 0;
const T_OUT: u32 = 1;
const T_FLUSH: u32 = 4;
const T_GET_ID: u32 = 8;
const T_DISCARD: u32 = 11;
const T_WRITE_ZEROES: u32 = 13;

const S_OK: u8 = 0;
const S_IOERR: u8 = 1;
const S_UNSUPP: u8 = 2;

/// Guest memory filled with a canary byte, so tests can tell what changed.
fn guest() -> GuestMemoryMmap {
    let mem = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), MEM_BYTES as usize)]).unwrap();
    mem.write_slice(&vec![0xa5; MEM_BYTES as usize], GuestAddress(0))
        .unwrap();
    mem
}

fn snapshot(mem: &GuestMemoryMmap) -> Vec<u8> {
    let mut all = vec![0u8; MEM_BYTES as usize];
    mem.read_slice(&mut all, GuestAddress(0)).unwrap();
    all
}

/// Asserts guest memory changed nowhere but in `allowed` (address, bytes).
fn assert_only_changed(before: &[u8], mem: &GuestMemoryMmap, allowed: &[(u64, u64)]) {
    let after = snapshot(mem);
    for (at, (b, a)) in before.iter().zip(&after).enumerate() {
        let at = at as u64;
        if b != a {
            assert!(
                allowed.iter().any(|&(s, n)| at >= s && at < s + n),
                "guest byte {at:#x} changed outside the request's buffers"
            );
        }
    }
}

fn put_desc(mem: &GuestMemoryMmap, table: u64, index: u16, d: (u64, u32, u16, u16)) {
    let (addr, len, flags, next) = d;
    mem.write_obj(
        Descriptor::new(addr, len, flags, next),
        GuestAddress(table + 16 * u64::from(index)),
    )
    .unwrap();
}

/// One guest buffer: address, bytes, device-writable.
type Buf = (u64, u32, bool);

const fn r(addr: u64, len: u32) -> Buf {
    (addr, len, false)
}

const fn w(addr: u64, len: u32) -> Buf {
    (addr, len, true)
}

/// Lays `bufs` as the chain 0 -> 1 -> ... of the table at `table`.
fn lay(mem: &GuestMemoryMmap, table: u64, bufs: &[Buf]) {
    for (i, &(addr, len, writable)) in bufs.iter().enumerate() {
        let last = i + 1 == bufs.len();
        let flags = if writable { WRITE } else { 0 } | if last { 0 } else { NEXT };
        put_desc(mem, table, i as u16, (addr, len, flags, i as u16 + 1));
    }
}

fn queue_table() -> Table {
    Table {
        addr: GuestAddress(TABLE),
        len: QUEUE_SIZE,
    }
}

/// `bufs` laid in the queue's table and walked from head 0.
fn walk_bufs(mem: &GuestMemoryMmap, bufs: &[Buf]) -> Result<Vec<Segment>, ChainError> {
    lay(mem, TABLE, bufs);
    walk(mem, queue_table(), 0, false)
}

fn segments(bufs: &[Buf]) -> Vec<Segment> {
    bufs.iter()
        .map(|&(addr, len, device_writable)| Segment {
            addr: GuestAddress(addr),
            len_bytes: len,
            device_writable,
        })
        .collect()
}

fn span(addr: u64, len: u32) -> Span {
    Span {
        addr: GuestAddress(addr),
        len_bytes: len,
    }
}

// ---- requests --------------------------------------------------------------

const CAPACITY_BYTES: u64 = 1 << 20;
const MAX_REQUEST_BYTES: u32 = 64 << 10;

fn shape() -> DeviceShape {
    DeviceShape {
        capacity_bytes: CAPACITY_BYTES,
        read_only: false,
        limits: Limits::new(128, MAX_REQUEST_BYTES),
    }
}

fn read_only() -> DeviceShape {
    DeviceShape {
        read_only: true,
        ..shape()
    }
}

/// The 16-byte request header at `addr`.
fn header(mem: &GuestMemoryMmap, addr: u64, kind: u32, sector: u64) {
    let mut h = [0u8; 16];
    h[0..4].copy_from_slice(&kind.to_le_bytes());
    h[8..16].copy_from_slice(&sector.to_le_bytes());
    mem.write_slice(&h, GuestAddress(addr)).unwrap();
}

/// Discard / write-zeroes ranges at `addr`: (sector, sectors, flags).
fn ranges(mem: &GuestMemoryMmap, addr: u64, list: &[(u64, u32, u32)]) {
    let mut raw = Vec::new();
    for &(sector, sectors, flags) in list {
        raw.extend_from_slice(&sector.to_le_bytes());
        raw.extend_from_slice(&sectors.to_le_bytes());
        raw.extend_from_slice(&flags.to_le_bytes());
    }
    mem.write_slice(&raw, GuestAddress(addr)).unwrap();
}

/// Walks and parses the chain `bufs` (which must walk).
fn request(mem: &GuestMemoryMmap, bufs: &[Buf], shape: &DeviceShape) -> Result<Request, String> {
    let segs = walk_bufs(mem, bufs).expect("the chain walks");
    parse(mem, &segs, shape)
}

/// The request must be refused with `status`, for a reason saying `why`.
#[track_caller]
fn assert_refused(result: Result<Request, String>, status_addr: u64, status: u8, why: &str) {
    let req = result.expect("a request with a status byte");
    assert_eq!(req.status, GuestAddress(status_addr), "status byte address");
    match req.op {
        Err(Refusal { status: s, reason }) => {
            assert_eq!(s, status, "refusal status ({reason})");
            assert!(reason.contains(why), "reason {reason:?} lacks {why:?}");
        }
        Ok(op) => panic!("accepted {op:?}, expected a refusal with status {status}"),
    }
}

#[track_caller]
fn accepted(result: Result<Request, String>) -> (GuestAddress, Op) {
    let req = result.expect("a request with a status byte");
    match req.op {
        Ok(op) => (req.status, op),
        Err(r) => panic!("refused: {r:?}"),
    }
}

// ---- the device ------------------------------------------------------------

#[derive(Debug, Clone, PartialEq, Eq)]
enum Call {
    Read(u64, u64),
    Write(u64, u64),
    Flush,
    Discard(u64, u64),
    WriteZeroes(u64, u64, bool),
}

/// A volume in a `Vec<u8>` that records each call and refuses (and
/// records) any range outside it.
struct VecDevice {
    bytes: Mutex<Vec<u8>>,
    read_only: bool,
    id: String,
    calls: Mutex<Vec<Call>>,
}

impl VecDevice {
    fn new(size: u64) -> VecDevice {
        // A pattern, so that a read of the wrong place shows.
        let bytes = (0..size).map(|i| (i / 512 + i % 251) as u8).collect();
        VecDevice {
            bytes: Mutex::new(bytes),
            read_only: false,
            id: "vol-1".to_string(),
            calls: Mutex::new(Vec::new()),
        }
    }

    fn calls(&self) -> Vec<Call> {
        self.calls.lock().unwrap().clone()
    }

    fn contents(&self) -> Vec<u8> {
        self.bytes.lock().unwrap().clone()
    }

    fn range(&self, offset: u64, len: u64) -> io::Result<std::ops::Range<usize>> {
        let size = self.bytes.lock().unwrap().len() as u64;
        match offset.checked_add(len) {
            Some(end) if end <= size => Ok(offset as usize..end as usize),
            _ => Err(io::Error::other(format!(
                "{len} bytes at {offset}: outside the volume"
            ))),
        }
    }

    fn record(&self, call: Call) {
        self.calls.lock().unwrap().push(call);
    }
}

impl BlockDevice for VecDevice {
    fn size_bytes(&self) -> u64 {
        self.bytes.lock().unwrap().len() as u64
    }

    fn is_read_only(&self) -> bool {
        self.read_only
    }

    fn id(&self) -> String {
        self.id.clone()
    }

    async fn read(&self, offset_bytes: u64, buf: &mut [u8]) -> io::Result<()> {
        self.record(Call::Read(offset_bytes, buf.len() as u64));
        let range = self.range(offset_bytes, buf.len() as u64)?;
        buf.copy_from_slice(&self.bytes.lock().unwrap()[range]);
        Ok(())
    }

    async fn write(&self, offset_bytes: u64, data: &[u8]) -> io::Result<()> {
        self.record(Call::Write(offset_bytes, data.len() as u64));
        let range = self.range(offset_bytes, data.len() as u64)?;
        self.bytes.lock().unwrap()[range].copy_from_slice(data);
        Ok(())
    }

    async fn flush(&self) -> io::Result<()> {
        self.record(Call::Flush);
        Ok(())
    }

    async fn discard(&self, offset_bytes: u64, length_bytes: u64) -> io::Result<()> {
        self.record(Call::Discard(offset_bytes, length_bytes));
        let range = self.range(offset_bytes, length_bytes)?;
        self.bytes.lock().unwrap()[range].fill(0);
        Ok(())
    }

    async fn write_zeroes(
        &self,
        offset_bytes: u64,
        length_bytes: u64,
        may_unmap: bool,
    ) -> io::Result<()> {
        self.record(Call::WriteZeroes(offset_bytes, length_bytes, may_unmap));
        let range = self.range(offset_bytes, length_bytes)?;
        self.bytes.lock().unwrap()[range].fill(0);
        Ok(())
    }
}

async fn run(dev: &VecDevice, mem: &GuestMemoryMmap, op: &Op) -> Outcome {
    let budget = budget(4 << 20, MAX_REQUEST_BYTES);
    execute(dev, mem, op, &budget).await
}

// ---- chains: indices, loops, length ----------------------------------------

#[test]
fn a_head_past_the_table_is_refused() {
    let mem = guest();
    assert_eq!(
        walk(&mem, queue_table(), 16, false),
        Err(ChainError::IndexOutOfRange {
            index: 16,
            table_len: 16
        })
    );
    assert_eq!(
        walk(&mem, queue_table(), u16::MAX, true),
        Err(ChainError::IndexOutOfRange {
            index: u16::MAX,
            table_len: 16
        })
    );
}

#[test]
fn a_next_past_the_table_is_refused() {
    let mem = guest();
    put_desc(&mem, TABLE, 0, (BUFS, 16, NEXT, 1));
    put_desc(&mem, TABLE, 1, (BUFS + 16, 1, WRITE | NEXT, 16));
    assert_eq!(
        walk(&mem, queue_table(), 0, false),
        Err(ChainError::IndexOutOfRange {
            index: 16,
            table_len: 16
        })
    );
}

#[test]
fn a_loop_and_a_self_loop_are_refused() {
    let mem = guest();
    // a -> b -> a
    put_desc(&mem, TABLE, 3, (BUFS, 16, NEXT, 7));
    put_desc(&mem, TABLE, 7, (BUFS + 16, 16, NEXT, 3));
    assert_eq!(walk(&mem, queue_table(), 3, false), Err(ChainError::Loop));
    assert_eq!(walk(&mem, queue_table(), 7, false), Err(ChainError::Loop));
    // a -> a
    put_desc(&mem, TABLE, 5, (BUFS, 16, NEXT, 5));
    assert_eq!(walk(&mem, queue_table(), 5, false), Err(ChainError::Loop));
}

#[test]
fn a_chain_may_use_the_whole_table_but_not_more() {
    let mem = guest();
    let bufs: Vec<Buf> = (0..QUEUE_SIZE as u64)
        .map(|i| r(BUFS + 16 * i, 16))
        .collect();
    assert_eq!(walk_bufs(&mem, &bufs), Ok(segments(&bufs)));
    // The last descriptor goes on: the 17th would have to repeat one.
    put_desc(&mem, TABLE, 15, (BUFS, 16, NEXT, 0));
    assert_eq!(walk(&mem, queue_table(), 0, false), Err(ChainError::Loop));
    put_desc(&mem, TABLE, 15, (BUFS, 16, NEXT, 9));
    assert_eq!(walk(&mem, queue_table(), 0, false), Err(ChainError::Loop));
}

#[test]
fn more_than_max_chain_segments_is_too_long() {
    let mem = guest();
    // A table bigger than any queue this backend accepts, so the chain is
    // not a loop: only the segment limit stops it.
    let table = Table {
        addr: GuestAddress(BUFS),
        len: 2048,
    };
    let n = MAX_CHAIN_SEGMENTS as u16;
    for i in 0..n {
        put_desc(&mem, BUFS, i, (0x100, 1, NEXT, i + 1));
    }
    put_desc(&mem, BUFS, n, (0x100, 1, 0, 0));
    assert_eq!(walk(&mem, table, 0, false), Err(ChainError::TooLong));
    // One fewer is fine.
    put_desc(&mem, BUFS, n - 1, (0x100, 1, 0, 0));
    assert_eq!(
        walk(&mem, table, 0, false).unwrap().len(),
        MAX_CHAIN_SEGMENTS
    );
}

// ---- chains: tables outside memory ----------------------------------------

#[test]
fn a_descriptor_table_outside_guest_memory_is_refused() {
    let mem = guest();
    let outside = Table {
        addr: GuestAddress(OUTSIDE),
        len: 16,
    };
    assert_eq!(
        walk(&mem, outside, 0, false),
        Err(ChainError::TableNotInMemory(OUTSIDE))
    );
    // A table across the end of memory: its third descriptor is past it.
    let table = MEM_BYTES - 32;
    let straddling = Table {
        addr: GuestAddress(table),
        len: 16,
    };
    put_desc(&mem, table, 0, (BUFS, 16, NEXT, 1));
    put_desc(&mem, table, 1, (BUFS + 16, 16, NEXT, 2));
    assert_eq!(
        walk(&mem, straddling, 0, false),
        Err(ChainError::TableNotInMemory(MEM_BYTES))
    );
    // At the very top of the address space (the index's offset would wrap).
    let top = Table {
        addr: GuestAddress(u64::MAX - 15),
        len: 16,
    };
    assert_eq!(
        walk(&mem, top, 0, false),
        Err(ChainError::TableNotInMemory(u64::MAX - 15))
    );
    assert_eq!(
        walk(&mem, top, 3, false),
        Err(ChainError::TableNotInMemory(u64::MAX - 15))
    );
}

// ---- chains: indirect tables -----------------------------------------------

#[test]
fn a_valid_indirect_chain_walks_into_its_table() {
    let mem = guest();
    let bufs = [r(BUFS, 16), w(BUFS + 0x1000, 512), w(BUFS + 0x2000, 1)];
    lay(&mem, INDIRECT, &bufs);
    put_desc(&mem, TABLE, 2, (INDIRECT, 3 * 16, INDIRECT_FLAG, 0));
    assert_eq!(walk(&mem, queue_table(), 2, true), Ok(segments(&bufs)));
}

#[test]
fn an_indirect_descriptor_without_the_feature_is_refused() {
    let mem = guest();
    lay(&mem, INDIRECT, &[r(BUFS, 16), w(BUFS + 16, 1)]);
    put_desc(&mem, TABLE, 0, (INDIRECT, 32, INDIRECT_FLAG, 0));
    assert_eq!(
        walk(&mem, queue_table(), 0, false),
        Err(ChainError::IndirectNotAllowed)
    );
}

#[test]
fn an_indirect_descriptor_with_next_is_refused() {
    let mem = guest();
    lay(&mem, INDIRECT, &[r(BUFS, 16), w(BUFS + 16, 1)]);
    put_desc(&mem, TABLE, 0, (INDIRECT, 32, INDIRECT_FLAG | NEXT, 1));
    put_desc(&mem, TABLE, 1, (BUFS + 32, 1, WRITE, 0));
    assert_eq!(
        walk(&mem, queue_table(), 0, true),
        Err(ChainError::IndirectNotAllowed)
    );
}

#[test]
fn an_indirect_descriptor_after_direct_ones_is_refused() {
    let mem = guest();
    lay(&mem, INDIRECT, &[w(BUFS + 16, 1)]);
    put_desc(&mem, TABLE, 0, (BUFS, 16, NEXT, 1));
    put_desc(&mem, TABLE, 1, (INDIRECT, 16, INDIRECT_FLAG, 0));
    assert_eq!(
        walk(&mem, queue_table(), 0, true),
        Err(ChainError::IndirectNotAllowed)
    );
}

#[test]
fn a_nested_indirect_table_is_refused() {
    let mem = guest();
    let inner = INDIRECT + 0x1000;
    lay(&mem, inner, &[r(BUFS, 16), w(BUFS + 16, 1)]);
    put_desc(&mem, INDIRECT, 0, (inner, 32, INDIRECT_FLAG, 0));
    put_desc(&mem, TABLE, 0, (INDIRECT, 16, INDIRECT_FLAG, 0));
    assert_eq!(
        walk(&mem, queue_table(), 0, true),
        Err(ChainError::IndirectNotAllowed)
    );
    // Also after a buffer of the indirect table.
    put_desc(&mem, INDIRECT, 0, (BUFS, 16, NEXT, 1));
    put_desc(&mem, INDIRECT, 1, (inner, 32, INDIRECT_FLAG, 0));
    put_desc(&mem, TABLE, 0, (INDIRECT, 32, INDIRECT_FLAG, 0));
    assert_eq!(
        walk(&mem, queue_table(), 0, true),
        Err(ChainError::IndirectNotAllowed)
    );
}

#[test]
fn an_indirect_table_of_a_bad_length_is_refused() {
    let mem = guest();
    lay(&mem, INDIRECT, &[r(BUFS, 16), w(BUFS + 16, 1)]);
    let max = MAX_CHAIN_SEGMENTS as u32 * 16;
    for len_bytes in [0, 8, 24, 33, max + 16, u32::MAX - 15] {
        put_desc(&mem, TABLE, 0, (INDIRECT, len_bytes, INDIRECT_FLAG, 0));
        assert_eq!(
            walk(&mem, queue_table(), 0, true),
            Err(ChainError::BadIndirectTable { len_bytes }),
            "indirect table of {len_bytes} bytes"
        );
    }
    // The largest table allowed is fine (its chain ends at entry 1).
    put_desc(&mem, TABLE, 0, (INDIRECT, max, INDIRECT_FLAG, 0));
    assert_eq!(walk(&mem, queue_table(), 0, true).unwrap().len(), 2);
}

#[test]
fn an_indirect_table_outside_guest_memory_is_refused() {
    let mem = guest();
    put_desc(&mem, TABLE, 0, (OUTSIDE, 32, INDIRECT_FLAG, 0));
    assert_eq!(
        walk(&mem, queue_table(), 0, true),
        Err(ChainError::TableNotInMemory(OUTSIDE))
    );
    // Across the end of memory: entry 0 is in it, entry 1 is not.
    let at = MEM_BYTES - 16;
    put_desc(&mem, at, 0, (BUFS, 16, NEXT, 1));
    put_desc(&mem, TABLE, 0, (at, 32, INDIRECT_FLAG, 0));
    assert_eq!(
        walk(&mem, queue_table(), 0, true),
        Err(ChainError::TableNotInMemory(MEM_BYTES))
    );
    // At the top of the address space.
    put_desc(&mem, TABLE, 0, (u64::MAX - 7, 32, INDIRECT_FLAG, 0));
    assert_eq!(
        walk(&mem, queue_table(), 0, true),
        Err(ChainError::TableNotInMemory(u64::MAX - 7))
    );
}

#[test]
fn an_indirect_table_with_a_bad_index_or_a_loop_is_refused() {
    let mem = guest();
    put_desc(&mem, TABLE, 0, (INDIRECT, 32, INDIRECT_FLAG, 0));
    put_desc(&mem, INDIRECT, 0, (BUFS, 16, NEXT, 2));
    assert_eq!(
        walk(&mem, queue_table(), 0, true),
        Err(ChainError::IndexOutOfRange {
            index: 2,
            table_len: 2
        })
    );
    put_desc(&mem, INDIRECT, 0, (BUFS, 16, NEXT, 1));
    put_desc(&mem, INDIRECT, 1, (BUFS, 16, NEXT, 0));
    assert_eq!(walk(&mem, queue_table(), 0, true), Err(ChainError::Loop));
    put_desc(&mem, INDIRECT, 0, (BUFS, 16, NEXT, 0));
    assert_eq!(walk(&mem, queue_table(), 0, true), Err(ChainError::Loop));
}

// ---- chains: buffer order ---------------------------------------------------

#[test]
fn a_readable_buffer_after_a_writable_one_is_refused() {
    let mem = guest();
    assert_eq!(
        walk_bufs(&mem, &[r(BUFS, 16), w(BUFS + 16, 512), r(BUFS + 0x1000, 1)]),
        Err(ChainError::ReadableAfterWritable)
    );
    // Inside an indirect table too.
    lay(&mem, INDIRECT, &[w(BUFS, 16), r(BUFS + 16, 1)]);
    put_desc(&mem, TABLE, 0, (INDIRECT, 32, INDIRECT_FLAG, 0));
    assert_eq!(
        walk(&mem, queue_table(), 0, true),
        Err(ChainError::ReadableAfterWritable)
    );
}

// ---- requests: layout ----------------------------------------------------------

#[test]
fn a_chain_without_a_writable_byte_has_no_status() {
    let mem = guest();
    header(&mem, BUFS, T_IN, 0);
    let err = request(&mem, &[r(BUFS, 16)], &shape()).unwrap_err();
    assert!(err.contains("no device-writable byte"), "{err}");
    // Zero-length writable buffers do not hold a status byte either.
    let err = request(
        &mem,
        &[r(BUFS, 16), w(BUFS + 16, 0), w(BUFS + 32, 0)],
        &shape(),
    )
    .unwrap_err();
    assert!(err.contains("no device-writable byte"), "{err}");
    // Nor does an empty chain.
    assert!(parse(&mem, &[], &shape()).is_err());
}

#[test]
fn a_header_shorter_than_16_bytes_is_an_ioerr() {
    let mem = guest();
    header(&mem, BUFS, T_IN, 0);
    let status = BUFS + 0x100;
    assert_refused(
        request(&mem, &[r(BUFS, 12), w(status, 1)], &shape()),
        status,
        S_IOERR,
        "request header of 12 bytes",
    );
    assert_refused(
        request(&mem, &[w(status, 1)], &shape()),
        status,
        S_IOERR,
        "request header of 0 bytes",
    );
}

#[test]
fn a_header_outside_guest_memory_is_an_ioerr() {
    let mem = guest();
    let status = BUFS;
    assert_refused(
        request(&mem, &[r(OUTSIDE, 16), w(status, 1)], &shape()),
        status,
        S_IOERR,
        "guest buffer at 0x200000",
    );
    // Across the end of memory.
    assert_refused(
        request(&mem, &[r(MEM_BYTES - 8, 16), w(status, 1)], &shape()),
        status,
        S_IOERR,
        "guest buffer at",
    );
}

#[test]
fn a_header_split_across_two_buffers_is_valid() {
    let mem = guest();
    // Type and half the sector in one buffer, the rest in another.
    let (a, b) = (BUFS + 0x100, BUFS + 0x900);
    let mut h = [0u8; 16];
    h[0..4].copy_from_slice(&T_IN.to_le_bytes());
    h[8..16].copy_from_slice(&0x0102u64.to_le_bytes());
    mem.write_slice(&h[..10], GuestAddress(a)).unwrap();
    mem.write_slice(&h[10..], GuestAddress(b)).unwrap();
    let (data, status) = (BUFS + 0x2000, BUFS + 0x3000);
    let (st, op) = accepted(request(
        &mem,
        &[r(a, 10), r(b, 6), w(data, 1024), w(status, 1)],
        &shape(),
    ));
    assert_eq!(st, GuestAddress(status));
    assert_eq!(
        op,
        Op::Read {
            offset_bytes: 0x0102 * 512,
            data: vec![span(data, 1024)]
        }
    );
    // Zero-length buffers anywhere are ignored.
    let (_, op2) = accepted(request(
        &mem,
        &[
            r(a, 10),
            r(OUTSIDE, 0),
            r(b, 6),
            w(data, 1024),
            w(OUTSIDE, 0),
            w(status, 1),
        ],
        &shape(),
    ));
    assert_eq!(op2, op);
}

#[test]
fn header_and_data_in_one_readable_buffer_are_split_at_16_bytes() {
    let mem = guest();
    header(&mem, BUFS, T_OUT, 4);
    let status = BUFS + 0x1000;
    let (st, op) = accepted(request(&mem, &[r(BUFS, 16 + 512), w(status, 1)], &shape()));
    assert_eq!(st, GuestAddress(status));
    assert_eq!(
        op,
        Op::Write {
            offset_bytes: 4 * 512,
            data: vec![span(BUFS + 16, 512)]
        }
    );
}

#[test]
fn data_and_status_in_one_writable_buffer_are_valid() {
    let mem = guest();
    header(&mem, BUFS, T_IN, 1);
    let data = BUFS + 0x1000;
    let (st, op) = accepted(request(&mem, &[r(BUFS, 16), w(data, 513)], &shape()));
    assert_eq!(st, GuestAddress(data + 512), "the status is the last byte");
    assert_eq!(
        op,
        Op::Read {
            offset_bytes: 512,
            data: vec![span(data, 512)]
        }
    );
    // Status split off the end of the last of several buffers.
    let (st, op) = accepted(request(
        &mem,
        &[r(BUFS, 16), w(data, 256), w(data + 0x1000, 257)],
        &shape(),
    ));
    assert_eq!(st, GuestAddress(data + 0x1000 + 256));
    assert_eq!(
        op,
        Op::Read {
            offset_bytes: 512,
            data: vec![span(data, 256), span(data + 0x1000, 256)]
        }
    );
}

#[test]
fn a_buffer_whose_end_wraps_the_address_space_is_refused() {
    let mem = guest();
    header(&mem, BUFS, T_IN, 0);
    for bufs in [
        vec![r(BUFS, 16), w(u64::MAX - 10, 512), w(BUFS + 0x100, 1)],
        vec![r(BUFS, 16), w(u64::MAX - 10, 100)],
        vec![r(u64::MAX - 3, 16), w(BUFS + 0x100, 1)],
        vec![r(BUFS, 16), r(u64::MAX, 2), w(BUFS + 0x100, 1)],
    ] {
        let err = request(&mem, &bufs, &shape()).unwrap_err();
        assert!(err.contains("wraps the address space"), "{bufs:?}: {err}");
    }
    // Ending exactly at the top does not wrap: the buffer is only outside
    // guest memory.
    assert_refused(
        request(
            &mem,
            &[r(BUFS, 16), w(u64::MAX - 512, 512), w(BUFS + 0x100, 1)],
            &shape(),
        ),
        BUFS + 0x100,
        S_IOERR,
        "is not guest memory",
    );
}

#[test]
fn data_in_the_wrong_direction_is_an_ioerr() {
    let mem = guest();
    let status = BUFS + 0x2000;
    header(&mem, BUFS, T_IN, 0);
    assert_refused(
        request(&mem, &[r(BUFS, 16 + 512), w(status, 1)], &shape()),
        status,
        S_IOERR,
        "read request with 512 bytes of data in the wrong direction",
    );
    header(&mem, BUFS, T_OUT, 0);
    assert_refused(
        request(
            &mem,
            &[r(BUFS, 16), w(BUFS + 0x1000, 512), w(status, 1)],
            &shape(),
        ),
        status,
        S_IOERR,
        "write request with 512 bytes of data in the wrong direction",
    );
    header(&mem, BUFS, T_GET_ID, 0);
    assert_refused(
        request(&mem, &[r(BUFS, 32), w(status, 21)], &shape()),
        status + 20,
        S_IOERR,
        "get-id request with 16 bytes",
    );
    header(&mem, BUFS, T_DISCARD, 0);
    assert_refused(
        request(&mem, &[r(BUFS, 32), w(status, 17)], &shape()),
        status + 16,
        S_IOERR,
        "discard/write-zeroes request with 16 bytes",
    );
}

// ---- requests: data outside guest memory -------------------------------------

/// Data buffers (in the request's direction) that are not all guest memory.
fn outside_buffers(writable: bool) -> Vec<Vec<Buf>> {
    let b = |addr, len| (addr, len, writable);
    vec![
        vec![b(OUTSIDE, 1024)],
        // Across the end of memory.
        vec![b(MEM_BYTES - 512, 1024)],
        // The first buffer fine, the second outside.
        vec![b(BUFS + 0x1000, 512), b(OUTSIDE, 512)],
        // Ending at the very top of the address space.
        vec![b(u64::MAX - 1024, 1024)],
    ]
}

/// Refused when parsed, so the device never sees the request.
#[test]
fn a_read_or_write_with_data_outside_guest_memory_is_an_ioerr() {
    for (kind, writable) in [(T_IN, true), (T_OUT, false)] {
        for data in outside_buffers(writable) {
            let mem = guest();
            header(&mem, BUFS, kind, 8);
            let status = BUFS + 0x100;
            let mut bufs = vec![r(BUFS, 16)];
            bufs.extend(&data);
            bufs.push(w(status, 1));
            let result = request(&mem, &bufs, &shape());
            let bad = data.iter().find(|b| b.0 != BUFS + 0x1000).unwrap();
            assert_refused(
                result,
                status,
                S_IOERR,
                &format!(
                    "guest buffer at {:#x} ({} bytes) is not guest memory",
                    bad.0, bad.1
                ),
            );
        }
    }
}

/// Guest memory can be replaced (VHOST_USER_SET_MEM_TABLE) between the
/// parse and the run: `execute` checks every access again.
#[tokio::test]
async fn execute_ends_ioerr_when_data_is_not_in_guest_memory() {
    let dev = VecDevice::new(CAPACITY_BYTES);
    let volume = dev.contents();
    for writable in [true, false] {
        for data in outside_buffers(writable) {
            let mem = guest();
            let spans: Vec<Span> = data.iter().map(|b| span(b.0, b.1)).collect();
            let op = if writable {
                Op::Read {
                    offset_bytes: 4096,
                    data: spans,
                }
            } else {
                Op::Write {
                    offset_bytes: 4096,
                    data: spans,
                }
            };
            let before = snapshot(&mem);
            let out = run(&dev, &mem, &op).await;
            assert_eq!((out.status, out.written_bytes), (S_IOERR, 0), "{op:?}");
            let what = if writable { "read" } else { "write" };
            let failure = out.failure.unwrap();
            assert!(
                failure.contains(&format!("{what} of 1024 bytes at 4096")),
                "{failure}"
            );
            // Only the guest's own buffers (where in memory) may change.
            let allowed: Vec<(u64, u64)> = data.iter().map(|b| (b.0, u64::from(b.1))).collect();
            assert_only_changed(&before, &mem, &allowed);
        }
    }
    // Reads reached the device (into a buffer of their own), writes did
    // not: nothing of the volume changed.
    assert_eq!(dev.contents(), volume);
    assert_eq!(dev.calls(), vec![Call::Read(4096, 1024); 4]);
    let mem = guest();
    let out = run(
        &dev,
        &mem,
        &Op::GetId {
            data: vec![span(OUTSIDE, 20)],
        },
    )
    .await;
    assert_eq!(out.status, S_IOERR);
    assert!(out.failure.unwrap().starts_with("get-id"));
}

#[test]
fn get_id_and_discard_buffers_outside_guest_memory_are_an_ioerr() {
    let mem = guest();
    let status = BUFS + 0x100;
    header(&mem, BUFS, T_GET_ID, 0);
    assert_refused(
        request(&mem, &[r(BUFS, 16), w(OUTSIDE, 20), w(status, 1)], &shape()),
        status,
        S_IOERR,
        "guest buffer at 0x200000 (20 bytes) is not guest memory",
    );
    header(&mem, BUFS, T_DISCARD, 0);
    assert_refused(
        request(&mem, &[r(BUFS, 16), r(OUTSIDE, 16), w(status, 1)], &shape()),
        status,
        S_IOERR,
        "guest buffer at 0x200000 (16 bytes) is not guest memory",
    );
}

// ---- requests: sectors and lengths ----------------------------------------------

#[test]
fn reads_and_writes_must_be_whole_sectors() {
    let mem = guest();
    let status = BUFS + 0x4000;
    header(&mem, BUFS, T_IN, 0);
    assert_refused(
        request(
            &mem,
            &[r(BUFS, 16), w(BUFS + 0x1000, 500), w(status, 1)],
            &shape(),
        ),
        status,
        S_IOERR,
        "read of 500 bytes: not whole 512-byte sectors",
    );
    header(&mem, BUFS, T_OUT, 0);
    assert_refused(
        request(&mem, &[r(BUFS, 16 + 513), w(status, 1)], &shape()),
        status,
        S_IOERR,
        "write of 513 bytes: not whole 512-byte sectors",
    );
}

#[test]
fn reads_and_writes_past_the_end_are_an_ioerr() {
    let mem = guest();
    let status = BUFS + 0x4000;
    let last = CAPACITY_BYTES / 512 - 1;
    for (kind, what) in [(T_IN, "read"), (T_OUT, "write")] {
        let bufs = |len: u32| {
            if kind == T_IN {
                vec![r(BUFS, 16), w(BUFS + 0x1000, len), w(status, 1)]
            } else {
                vec![r(BUFS, 16), r(BUFS + 0x1000, len), w(status, 1)]
            }
        };
        // The last sector is fine.
        header(&mem, BUFS, kind, last);
        accepted(request(&mem, &bufs(512), &shape()));
        // Two sectors from the last one are not.
        assert_refused(
            request(&mem, &bufs(1024), &shape()),
            status,
            S_IOERR,
            &format!("{what} of 1024 bytes at sector {last}: past the end of the device"),
        );
        header(&mem, BUFS, kind, last + 1);
        assert_refused(
            request(&mem, &bufs(512), &shape()),
            status,
            S_IOERR,
            "past the end of the device",
        );
        // sector * 512 overflows, and sector * 512 + length does.
        for sector in [u64::MAX, u64::MAX / 256, u64::MAX / 512] {
            header(&mem, BUFS, kind, sector);
            assert_refused(
                request(&mem, &bufs(1024), &shape()),
                status,
                S_IOERR,
                &format!("at sector {sector}: past the end of the device"),
            );
        }
    }
}

#[test]
fn reads_and_writes_past_the_end_of_a_huge_device_do_not_overflow() {
    let mem = guest();
    let status = BUFS + 0x4000;
    let huge = DeviceShape {
        capacity_bytes: u64::MAX / 512 * 512,
        ..shape()
    };
    header(&mem, BUFS, T_IN, u64::MAX / 512 - 1);
    let (_, op) = accepted(request(
        &mem,
        &[r(BUFS, 16), w(BUFS + 0x1000, 512), w(status, 1)],
        &huge,
    ));
    assert_eq!(
        op,
        Op::Read {
            offset_bytes: (u64::MAX / 512 - 1) * 512,
            data: vec![span(BUFS + 0x1000, 512)]
        }
    );
    assert_refused(
        request(
            &mem,
            &[r(BUFS, 16), w(BUFS + 0x1000, 1024), w(status, 1)],
            &huge,
        ),
        status,
        S_IOERR,
        "past the end of the device",
    );
}

#[test]
fn a_request_bigger_than_max_request_bytes_is_an_ioerr() {
    let mem = guest();
    let status = BUFS + 0x40000;
    let big = MAX_REQUEST_BYTES + 512;
    header(&mem, BUFS, T_IN, 0);
    assert_refused(
        request(
            &mem,
            &[r(BUFS, 16), w(BUFS + 0x1000, big), w(status, 1)],
            &shape(),
        ),
        status,
        S_IOERR,
        &format!("read of {big} bytes: more than the {MAX_REQUEST_BYTES} a request may move"),
    );
    // Exactly the limit, over several buffers, is fine.
    let half = MAX_REQUEST_BYTES / 2;
    accepted(request(
        &mem,
        &[
            r(BUFS, 16),
            w(BUFS + 0x1000, half),
            w(BUFS + 0x20000, half),
            w(status, 1),
        ],
        &shape(),
    ));
    header(&mem, BUFS, T_OUT, 0);
    assert_refused(
        request(&mem, &[r(BUFS, 16 + big), w(status, 1)], &shape()),
        status,
        S_IOERR,
        &format!("write of {big} bytes: more than"),
    );
}

// ---- requests: read-only devices ---------------------------------------------------

#[test]
fn writes_discards_and_zeroes_to_a_read_only_device_are_an_ioerr() {
    let mem = guest();
    let status = BUFS + 0x4000;
    header(&mem, BUFS, T_OUT, 0);
    assert_refused(
        request(&mem, &[r(BUFS, 16 + 512), w(status, 1)], &read_only()),
        status,
        S_IOERR,
        "write to a read-only device",
    );
    ranges(&mem, BUFS + 16, &[(0, 8, 0)]);
    for kind in [T_DISCARD, T_WRITE_ZEROES] {
        header(&mem, BUFS, kind, 0);
        assert_refused(
            request(&mem, &[r(BUFS, 32), w(status, 1)], &read_only()),
            status,
            S_IOERR,
            "discard/write-zeroes to a read-only device",
        );
    }
    // Reads, flushes and GET_ID are fine.
    header(&mem, BUFS, T_IN, 0);
    accepted(request(
        &mem,
        &[r(BUFS, 16), w(BUFS + 0x1000, 512), w(status, 1)],
        &read_only(),
    ));
    header(&mem, BUFS, T_FLUSH, 0);
    assert_eq!(
        accepted(request(&mem, &[r(BUFS, 16), w(status, 1)], &read_only())).1,
        Op::Flush
    );
}

// ---- requests: discard and write-zeroes ----------------------------------------------

#[test]
fn discard_ranges_must_be_a_nonzero_multiple_of_16_bytes() {
    let mem = guest();
    let status = BUFS + 0x4000;
    ranges(&mem, BUFS + 16, &[(0, 8, 0), (64, 8, 0)]);
    for kind in [T_DISCARD, T_WRITE_ZEROES] {
        header(&mem, BUFS, kind, 0);
        let what = if kind == T_DISCARD {
            "discard"
        } else {
            "write-zeroes"
        };
        for bytes in [0u32, 8, 24, 31] {
            assert_refused(
                request(&mem, &[r(BUFS, 16 + bytes), w(status, 1)], &shape()),
                status,
                S_IOERR,
                &format!("{what} with {bytes} bytes of ranges: a non-zero multiple of 16 needed"),
            );
        }
    }
}

#[test]
fn more_ranges_than_allowed_are_an_ioerr() {
    let mem = guest();
    let status = BUFS + 0x4000;
    let limit = shape().limits.max_discard_ranges;
    let list: Vec<(u64, u32, u32)> = (0..u64::from(limit) + 1).map(|i| (i * 8, 8, 0)).collect();
    ranges(&mem, BUFS + 16, &list);
    header(&mem, BUFS, T_DISCARD, 0);
    let bytes = 16 * (limit + 1);
    assert_refused(
        request(&mem, &[r(BUFS, 16 + bytes), w(status, 1)], &shape()),
        status,
        S_IOERR,
        &format!("discard of {} ranges: at most {limit}", limit + 1),
    );
    // The limit itself is fine.
    let (_, op) = accepted(request(
        &mem,
        &[r(BUFS, 16 + bytes - 16), w(status, 1)],
        &shape(),
    ));
    let Op::Discard { ranges: got } = op else {
        panic!("{op:?}")
    };
    assert_eq!(got.len(), limit as usize);
    // Write-zeroes has its own limit.
    let tight = DeviceShape {
        limits: Limits {
            max_write_zeroes_ranges: 1,
            ..shape().limits
        },
        ..shape()
    };
    header(&mem, BUFS, T_WRITE_ZEROES, 0);
    assert_refused(
        request(&mem, &[r(BUFS, 48), w(status, 1)], &tight),
        status,
        S_IOERR,
        "write-zeroes of 2 ranges: at most 1",
    );
}

#[test]
fn discard_with_unmap_or_unknown_flags_is_unsupported() {
    let mem = guest();
    let status = BUFS + 0x4000;
    header(&mem, BUFS, T_DISCARD, 0);
    for flags in [1u32, 2, 0x8000_0000] {
        ranges(&mem, BUFS + 16, &[(0, 8, 0), (8, 8, flags)]);
        assert_refused(
            request(&mem, &[r(BUFS, 48), w(status, 1)], &shape()),
            status,
            S_UNSUPP,
            &format!("discard range with flags {flags:#x}"),
        );
    }
    header(&mem, BUFS, T_WRITE_ZEROES, 0);
    for flags in [2u32, 3, 0x100] {
        ranges(&mem, BUFS + 16, &[(0, 8, flags)]);
        assert_refused(
            request(&mem, &[r(BUFS, 32), w(status, 1)], &shape()),
            status,
            S_UNSUPP,
            &format!("write-zeroes range with flags {flags:#x}"),
        );
    }
}

#[test]
fn a_discard_range_past_the_end_or_too_big_is_an_ioerr() {
    let mem = guest();
    let status = BUFS + 0x4000;
    let sectors = CAPACITY_BYTES / 512;
    header(&mem, BUFS, T_DISCARD, 0);
    ranges(&mem, BUFS + 16, &[(0, 8, 0), (sectors - 4, 8, 0)]);
    assert_refused(
        request(&mem, &[r(BUFS, 48), w(status, 1)], &shape()),
        status,
        S_IOERR,
        &format!(
            "discard of 4096 bytes at sector {}: past the end",
            sectors - 4
        ),
    );
    ranges(&mem, BUFS + 16, &[(u64::MAX / 2, 8, 0)]);
    assert_refused(
        request(&mem, &[r(BUFS, 32), w(status, 1)], &shape()),
        status,
        S_IOERR,
        "past the end of the device",
    );
    let tight = DeviceShape {
        limits: Limits {
            max_discard_sectors: 8,
            ..shape().limits
        },
        ..shape()
    };
    ranges(&mem, BUFS + 16, &[(0, 9, 0)]);
    assert_refused(
        request(&mem, &[r(BUFS, 32), w(status, 1)], &tight),
        status,
        S_IOERR,
        "discard range of 9 sectors: at most 8",
    );
    // Up to the very end is fine, and so is a range of 0 sectors.
    ranges(&mem, BUFS + 16, &[(sectors - 8, 8, 0), (sectors, 0, 0)]);
    let (_, op) = accepted(request(&mem, &[r(BUFS, 48), w(status, 1)], &shape()));
    assert_eq!(
        op,
        Op::Discard {
            ranges: vec![
                Range {
                    offset_bytes: CAPACITY_BYTES - 4096,
                    length_bytes: 4096,
                    unmap: false
                },
                Range {
                    offset_bytes: CAPACITY_BYTES,
                    length_bytes: 0,
                    unmap: false
                }
            ]
        }
    );
}

#[tokio::test]
async fn write_zeroes_with_unmap_is_valid() {
    let mem = guest();
    let status = BUFS + 0x4000;
    header(&mem, BUFS, T_WRITE_ZEROES, 0);
    // Ranges split across two buffers, the second range with UNMAP.
    let (a, b) = (BUFS + 0x1000, BUFS + 0x2000);
    ranges(&mem, a, &[(2, 4, 0)]);
    ranges(&mem, b, &[(16, 8, 1)]);
    let (_, op) = accepted(request(
        &mem,
        &[r(BUFS, 16), r(a, 16), r(b, 16), w(status, 1)],
        &shape(),
    ));
    assert_eq!(
        op,
        Op::WriteZeroes {
            ranges: vec![
                Range {
                    offset_bytes: 1024,
                    length_bytes: 2048,
                    unmap: false
                },
                Range {
                    offset_bytes: 8192,
                    length_bytes: 4096,
                    unmap: true
                }
            ]
        }
    );
    let dev = VecDevice::new(CAPACITY_BYTES);
    let out = run(&dev, &mem, &op).await;
    assert_eq!((out.status, out.written_bytes), (S_OK, 0));
    assert_eq!(
        dev.calls(),
        vec![
            Call::WriteZeroes(1024, 2048, false),
            Call::WriteZeroes(8192, 4096, true)
        ]
    );
    let v = dev.contents();
    assert!(v[1024..3072].iter().all(|&b| b == 0));
    assert!(v[8192..12288].iter().all(|&b| b == 0));
    assert_ne!(v[3072], 0, "zeroed past the range");
}

// ---- requests: other types --------------------------------------------------------

#[test]
fn an_unknown_request_type_is_unsupported() {
    let mem = guest();
    let status = BUFS + 0x4000;
    // SCSI_CMD, GET_LIFETIME, SECURE_ERASE, a zone command, nonsense.
    for kind in [2u32, 10, 14, 16, 99, u32::MAX] {
        header(&mem, BUFS, kind, 0);
        assert_refused(
            request(&mem, &[r(BUFS, 16), w(status, 1)], &shape()),
            status,
            S_UNSUPP,
            &format!("request type {kind} is not supported"),
        );
    }
}

#[tokio::test]
async fn get_id_fills_20_bytes_or_fewer() {
    let mut dev = VecDevice::new(CAPACITY_BYTES);
    dev.id = "a-volume-name-longer-than-twenty".to_string();
    let status = BUFS + 0x4000;
    let id = BUFS + 0x1000;

    // A 20-byte buffer: the id cut to 20 bytes.
    let mem = guest();
    header(&mem, BUFS, T_GET_ID, 0);
    let (_, op) = accepted(request(
        &mem,
        &[r(BUFS, 16), w(id, 20), w(status, 1)],
        &shape(),
    ));
    let before = snapshot(&mem);
    assert_eq!(
        op,
        Op::GetId {
            data: vec![span(id, 20)]
        }
    );
    let out = run(&dev, &mem, &op).await;
    assert_eq!((out.status, out.written_bytes), (S_OK, 20));
    let mut got = [0u8; 20];
    mem.read_slice(&mut got, GuestAddress(id)).unwrap();
    assert_eq!(&got, b"a-volume-name-longer");
    assert_only_changed(&before, &mem, &[(id, 20)]);

    // A 4-byte buffer: the id truncated to 4 bytes, nothing past them.
    let mem = guest();
    header(&mem, BUFS, T_GET_ID, 0);
    let (_, op) = accepted(request(
        &mem,
        &[r(BUFS, 16), w(id, 4), w(status, 1)],
        &shape(),
    ));
    let before = snapshot(&mem);
    let out = run(&dev, &mem, &op).await;
    assert_eq!((out.status, out.written_bytes), (S_OK, 4));
    let mut got = [0u8; 5];
    mem.read_slice(&mut got, GuestAddress(id)).unwrap();
    assert_eq!(&got, b"a-vo\xa5");
    assert_only_changed(&before, &mem, &[(id, 4)]);

    // A 32-byte buffer: a short id padded with zeros to 20, no further.
    dev.id = "vol".to_string();
    let mem = guest();
    header(&mem, BUFS, T_GET_ID, 0);
    let (_, op) = accepted(request(&mem, &[r(BUFS, 16), w(id, 33)], &shape()));
    let before = snapshot(&mem);
    assert_eq!(
        op,
        Op::GetId {
            data: vec![span(id, 20)]
        }
    );
    let out = run(&dev, &mem, &op).await;
    assert_eq!((out.status, out.written_bytes), (S_OK, 20));
    let mut got = [0u8; 21];
    mem.read_slice(&mut got, GuestAddress(id)).unwrap();
    assert_eq!(&got[..3], b"vol");
    assert!(got[3..20].iter().all(|&b| b == 0));
    assert_eq!(got[20], 0xa5);
    assert_only_changed(&before, &mem, &[(id, 20)]);
}

#[tokio::test]
async fn flush_with_data_is_an_ioerr_and_without_is_a_flush() {
    let mem = guest();
    let status = BUFS + 0x4000;
    header(&mem, BUFS, T_FLUSH, 77);
    assert_refused(
        request(
            &mem,
            &[r(BUFS, 16), r(BUFS + 0x1000, 512), w(status, 1)],
            &shape(),
        ),
        status,
        S_IOERR,
        "flush request with 512 bytes of data in the wrong direction",
    );
    let (st, op) = accepted(request(&mem, &[r(BUFS, 16), w(status, 1)], &shape()));
    assert_eq!((st, &op), (GuestAddress(status), &Op::Flush));
    let dev = VecDevice::new(CAPACITY_BYTES);
    let out = run(&dev, &mem, &op).await;
    assert_eq!((out.status, out.written_bytes), (S_OK, 0));
    assert_eq!(dev.calls(), vec![Call::Flush]);
}

// ---- a valid write and read over scattered buffers ------------------------------------

#[tokio::test]
async fn a_write_then_a_read_over_three_scattered_buffers_round_trip() {
    let mem = guest();
    let dev = VecDevice::new(CAPACITY_BYTES);
    let sector = 100u64;
    // Three buffers out of order in memory, of 512, 1024 and 512 bytes.
    let out_bufs = [
        (BUFS + 0x9000, 512u32),
        (BUFS + 0x2000, 1024),
        (BUFS + 0x5200, 512),
    ];
    let payload: Vec<u8> = (0..2048u32).map(|i| (i * 7 + 3) as u8).collect();
    let mut at = 0;
    for &(addr, len) in &out_bufs {
        mem.write_slice(&payload[at..at + len as usize], GuestAddress(addr))
            .unwrap();
        at += len as usize;
    }
    // Header in the indirect table's chain: a real driver's layout.
    let hdr = BUFS + 0x100;
    header(&mem, hdr, T_OUT, sector);
    let status = BUFS + 0x180;
    let mut bufs = vec![r(hdr, 16)];
    bufs.extend(out_bufs.iter().map(|&(a, l)| r(a, l)));
    bufs.push(w(status, 1));
    lay(&mem, INDIRECT, &bufs);
    put_desc(
        &mem,
        TABLE,
        4,
        (INDIRECT, 16 * bufs.len() as u32, INDIRECT_FLAG, 0),
    );
    let segs = walk(&mem, queue_table(), 4, true).unwrap();
    let (st, op) = accepted(parse(&mem, &segs, &shape()));
    assert_eq!(st, GuestAddress(status));
    let before = snapshot(&mem);
    let out = run(&dev, &mem, &op).await;
    assert_eq!(
        (out.status, out.written_bytes, out.failure),
        (S_OK, 0, None)
    );
    assert_only_changed(&before, &mem, &[]);
    let volume = dev.contents();
    let at = (sector * 512) as usize;
    assert_eq!(&volume[at..at + 2048], &payload[..]);

    // Read it back into three other scattered buffers: 1024, 512, 512.
    let in_bufs = [
        (BUFS + 0x30000, 1024u32),
        (BUFS + 0x7000, 512),
        (BUFS + 0x20000, 512),
    ];
    header(&mem, hdr, T_IN, sector);
    let mut bufs = vec![r(hdr, 16)];
    bufs.extend(in_bufs.iter().map(|&(a, l)| w(a, l)));
    bufs.push(w(status, 1));
    let (st, op) = accepted(request(&mem, &bufs, &shape()));
    assert_eq!(st, GuestAddress(status));
    let before = snapshot(&mem);
    let out = run(&dev, &mem, &op).await;
    assert_eq!(
        (out.status, out.written_bytes, out.failure),
        (S_OK, 2048, None)
    );
    let mut got = Vec::new();
    for &(addr, len) in &in_bufs {
        let mut part = vec![0u8; len as usize];
        mem.read_slice(&mut part, GuestAddress(addr)).unwrap();
        got.extend(part);
    }
    assert_eq!(got, payload);
    let allowed: Vec<(u64, u64)> = in_bufs.iter().map(|&(a, l)| (a, u64::from(l))).collect();
    assert_only_changed(&before, &mem, &allowed);
    assert_eq!(dev.contents(), volume, "a read changed the volume");
    assert_eq!(
        dev.calls(),
        vec![
            Call::Write(sector * 512, 2048),
            Call::Read(sector * 512, 2048)
        ]
    );
}
