//! Entry point of the fuzz target `parse_chain` (fuzz/) and of the stable
//! randomized test (tests/random_chains.rs): arbitrary bytes become a
//! guest's memory, a descriptor table, a head index and a device; the
//! chain at the head is walked, parsed and, when valid, run.
//!
//! Nothing may panic, and whatever the bytes: the device is asked for
//! nothing outside itself, past the request limit or off a sector, a
//! read-only device for no write; a status is IOERR or UNSUPP when
//! refused, OK or IOERR when run; the status byte is the chain's last
//! device-writable byte; what a request says it did, it did.
//!
//! Input layout: CONFIG_BYTES of settings (see `Config::from_bytes`), then
//! an image of guest memory: byte i of the image is guest address i, where
//! a region has it (REGIONS: two, with a hole between them).

use std::collections::BTreeMap;
use std::io;

use vm_memory::{Address, Bytes, GuestAddress, GuestMemoryMmap};

use crate::chain::{walk, Segment, Table, MAX_CHAIN_SEGMENTS};
use crate::config_space::Limits;
use crate::device::BlockDevice;
use crate::execute::{budget, execute};
use crate::request::{bytes_of, parse, read_spans, DeviceShape, Op, Span, SECTOR_BYTES};

/// Guest memory, (address, bytes): a hole between the two regions.
pub const REGIONS: [(u64, u64); 2] = [(0, 0x2000), (0x3000, 0x1000)];
/// Bytes of an image: up to the end of the last region.
pub const IMAGE_BYTES: usize = 0x4000;
/// Bytes of settings before the image.
pub const CONFIG_BYTES: usize = 10;

const S_OK: u8 = 0;
const S_IOERR: u8 = 1;
const S_UNSUPP: u8 = 2;

/// How far an input got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reached {
    /// The walker refused the chain.
    ChainRefused,
    /// The chain has no status byte.
    NoStatus,
    /// The parser refused the request (with this status).
    Refused(u8),
    /// The request ran (with this status).
    Ran(u8),
}

/// The settings of one input.
#[derive(Debug, Clone, Copy)]
struct Config {
    table: Table,
    head: u16,
    indirect: bool,
    shape: DeviceShape,
}

impl Config {
    /// Byte 0: descriptors in the table (0..=64); 1: head; 2: bit 0
    /// INDIRECT_DESC negotiated, bit 1 read-only device, bit 2 table far
    /// outside memory; 3-4: table address (le, below 0x4400); 5: capacity
    /// (0, n × 4 KiB, or 255: the largest); 6: max request bytes
    /// (512 << n%12); 7: max discard / write-zeroes ranges; 8: max sectors
    /// of one range (1 << n%25); 9: unused.
    fn from_bytes(c: &[u8; CONFIG_BYTES]) -> Config {
        let table_addr = if c[2] & 4 != 0 {
            1 << 40
        } else {
            u64::from(u16::from_le_bytes([c[3], c[4]])) % 0x4400
        };
        let capacity_bytes = match c[5] {
            255 => u64::MAX / SECTOR_BYTES * SECTOR_BYTES,
            n => u64::from(n) * 4096,
        };
        let max_request_bytes = 512u32 << (c[6] % 12);
        let ranges = u32::from(c[7] % 20);
        let sectors = 1u32 << (c[8] % 25);
        Config {
            table: Table {
                addr: GuestAddress(table_addr),
                len: u32::from(c[0] % 65),
            },
            head: u16::from(c[1]),
            indirect: c[2] & 1 != 0,
            shape: DeviceShape {
                capacity_bytes,
                read_only: c[2] & 2 != 0,
                limits: Limits {
                    max_discard_ranges: ranges,
                    max_write_zeroes_ranges: ranges,
                    max_discard_sectors: sectors,
                    max_write_zeroes_sectors: sectors,
                    ..Limits::new(128, max_request_bytes)
                },
            },
        }
    }
}

/// Runs one input; panics when a check fails.
pub fn parse_chain(data: &[u8]) -> Reached {
    let mut c = [0u8; CONFIG_BYTES];
    let n = data.len().min(CONFIG_BYTES);
    c[..n].copy_from_slice(&data[..n]);
    let config = Config::from_bytes(&c);
    let image = data.get(CONFIG_BYTES..).unwrap_or(&[]);
    let Some(mem) = guest_memory(image) else {
        panic!("guest memory of {REGIONS:?} could not be made");
    };

    let segments = match walk(&mem, config.table, config.head, config.indirect) {
        Ok(s) => s,
        Err(_) => return Reached::ChainRefused,
    };
    check_segments(&segments);
    let request = match parse(&mem, &segments, &config.shape) {
        Ok(r) => r,
        Err(_) => {
            assert!(
                segments
                    .iter()
                    .all(|s| !s.device_writable || s.len_bytes == 0)
                    || segments
                        .iter()
                        .any(|s| s.addr.checked_add(u64::from(s.len_bytes)).is_none()),
                "a chain with a status byte was refused: {segments:?}"
            );
            return Reached::NoStatus;
        }
    };
    let last = segments
        .iter()
        .rfind(|s| s.device_writable && s.len_bytes > 0);
    let expected_status = last.map(|s| s.addr.unchecked_add(u64::from(s.len_bytes) - 1));
    assert_eq!(Some(request.status), expected_status, "{segments:?}");

    let op = match request.op {
        Ok(op) => op,
        Err(refusal) => {
            assert!(
                refusal.status == S_IOERR || refusal.status == S_UNSUPP,
                "{refusal:?}"
            );
            let _ = mem.write_obj(refusal.status, request.status);
            return Reached::Refused(refusal.status);
        }
    };
    let device = MemDevice::new(&config.shape);
    let budget = budget(
        2 * u64::from(config.shape.limits.max_request_bytes),
        config.shape.limits.max_request_bytes,
    );
    let outcome = futures::executor::block_on(execute(&device, &mem, &op, &budget));
    assert!(
        outcome.status == S_OK || outcome.status == S_IOERR,
        "{outcome:?}"
    );
    assert_eq!(outcome.status == S_OK, outcome.failure.is_none());
    if outcome.status == S_OK {
        check_done(&device, &mem, &op, outcome.written_bytes);
    } else {
        assert_eq!(outcome.written_bytes, 0);
    }
    let _ = mem.write_obj(outcome.status, request.status);
    Reached::Ran(outcome.status)
}

/// The regions, filled from `image`.
fn guest_memory(image: &[u8]) -> Option<GuestMemoryMmap> {
    let ranges: Vec<(GuestAddress, usize)> = REGIONS
        .iter()
        .map(|&(a, n)| (GuestAddress(a), n as usize))
        .collect();
    let mem = GuestMemoryMmap::<()>::from_ranges(&ranges).ok()?;
    for &(start, len) in &REGIONS {
        let (start, end) = (start as usize, (start + len) as usize);
        if let Some(part) = image.get(start..end.min(image.len())) {
            mem.write_slice(part, GuestAddress(start as u64)).ok()?;
        }
    }
    Some(mem)
}

/// What a walked chain must be.
fn check_segments(segments: &[Segment]) {
    assert!(!segments.is_empty());
    assert!(segments.len() <= MAX_CHAIN_SEGMENTS);
    let first_writable = segments
        .iter()
        .position(|s| s.device_writable)
        .unwrap_or(segments.len());
    assert!(
        segments[first_writable..].iter().all(|s| s.device_writable),
        "a readable buffer after a writable one: {segments:?}"
    );
}

/// What a request that ran OK must have done.
fn check_done(device: &MemDevice, mem: &GuestMemoryMmap, op: &Op, written_bytes: u32) {
    match op {
        Op::Read { offset_bytes, data } => {
            let len = bytes_of(data);
            assert_eq!(u64::from(written_bytes), len);
            // The guest's buffers hold the device's bytes, unless two of
            // them overlap (the later one's bytes win).
            if !overlapping(data) {
                let mut got = vec![0u8; len as usize];
                assert!(read_spans(mem, data, &mut got).is_ok());
                assert_eq!(got, device.bytes(*offset_bytes, len), "read");
            }
        }
        Op::Write { offset_bytes, data } => {
            assert_eq!(written_bytes, 0);
            let len = bytes_of(data);
            let mut sent = vec![0u8; len as usize];
            assert!(read_spans(mem, data, &mut sent).is_ok());
            assert_eq!(device.bytes(*offset_bytes, len), sent, "write");
        }
        Op::GetId { data } => {
            assert_eq!(u64::from(written_bytes), bytes_of(data).min(20));
        }
        Op::Flush | Op::Discard { .. } | Op::WriteZeroes { .. } => {
            assert_eq!(written_bytes, 0);
        }
    }
}

fn overlapping(spans: &[Span]) -> bool {
    let mut sorted: Vec<(u64, u64)> = spans
        .iter()
        .map(|s| {
            (
                s.addr.raw_value(),
                s.addr.raw_value().saturating_add(u64::from(s.len_bytes)),
            )
        })
        .collect();
    sorted.sort_unstable();
    sorted.windows(2).any(|w| w[1].0 < w[0].1)
}

/// A sparse in-memory device of any size that checks every call against
/// the contract of `BlockDevice`.
struct MemDevice {
    shape: DeviceShape,
    sectors: parking_lot::Mutex<BTreeMap<u64, Box<[u8; 512]>>>,
}

impl MemDevice {
    fn new(shape: &DeviceShape) -> MemDevice {
        MemDevice {
            shape: *shape,
            sectors: parking_lot::Mutex::new(BTreeMap::new()),
        }
    }

    /// Asserts a call's range is whole sectors inside the device.
    fn check(&self, what: &str, offset: u64, len: u64) {
        assert!(
            offset.is_multiple_of(SECTOR_BYTES) && len.is_multiple_of(SECTOR_BYTES),
            "{what} of {len} bytes at {offset}: not whole sectors"
        );
        assert!(
            offset
                .checked_add(len)
                .is_some_and(|end| end <= self.shape.capacity_bytes),
            "{what} of {len} bytes at {offset}: past the device's {} bytes",
            self.shape.capacity_bytes
        );
    }

    fn check_data(&self, what: &str, offset: u64, len: u64) {
        self.check(what, offset, len);
        assert!(
            len <= u64::from(self.shape.limits.max_request_bytes),
            "{what} of {len} bytes: past the request limit"
        );
    }

    fn check_writable(&self, what: &str) {
        assert!(!self.shape.read_only, "{what} on a read-only device");
    }

    /// `len` bytes at `offset` (whole sectors).
    fn bytes(&self, offset: u64, len: u64) -> Vec<u8> {
        let sectors = self.sectors.lock();
        let first = offset / SECTOR_BYTES;
        let mut out = Vec::with_capacity(len as usize);
        for s in first..first + len / SECTOR_BYTES {
            match sectors.get(&s) {
                Some(b) => out.extend_from_slice(&b[..]),
                None => out.extend_from_slice(&[0u8; 512]),
            }
        }
        out
    }

    fn zero(&self, offset: u64, len: u64) {
        let mut sectors = self.sectors.lock();
        let first = offset / SECTOR_BYTES;
        let end = first + len / SECTOR_BYTES;
        let gone: Vec<u64> = sectors.range(first..end).map(|(k, _)| *k).collect();
        for k in gone {
            sectors.remove(&k);
        }
    }
}

impl BlockDevice for MemDevice {
    fn size_bytes(&self) -> u64 {
        self.shape.capacity_bytes
    }

    fn is_read_only(&self) -> bool {
        self.shape.read_only
    }

    fn id(&self) -> String {
        "fuzz-device-with-a-long-id".to_string()
    }

    async fn read(&self, offset_bytes: u64, buf: &mut [u8]) -> io::Result<()> {
        self.check_data("read", offset_bytes, buf.len() as u64);
        buf.copy_from_slice(&self.bytes(offset_bytes, buf.len() as u64));
        Ok(())
    }

    async fn write(&self, offset_bytes: u64, data: &[u8]) -> io::Result<()> {
        self.check_writable("write");
        self.check_data("write", offset_bytes, data.len() as u64);
        let mut sectors = self.sectors.lock();
        for (i, chunk) in data.chunks_exact(SECTOR_BYTES as usize).enumerate() {
            let mut b = Box::new([0u8; 512]);
            b.copy_from_slice(chunk);
            sectors.insert(offset_bytes / SECTOR_BYTES + i as u64, b);
        }
        Ok(())
    }

    async fn flush(&self) -> io::Result<()> {
        Ok(())
    }

    async fn discard(&self, offset_bytes: u64, length_bytes: u64) -> io::Result<()> {
        self.check_writable("discard");
        self.check("discard", offset_bytes, length_bytes);
        self.zero(offset_bytes, length_bytes);
        Ok(())
    }

    async fn write_zeroes(
        &self,
        offset_bytes: u64,
        length_bytes: u64,
        _may_unmap: bool,
    ) -> io::Result<()> {
        self.check_writable("write-zeroes");
        self.check("write-zeroes", offset_bytes, length_bytes);
        self.zero(offset_bytes, length_bytes);
        Ok(())
    }
}

/// A small xorshift64* generator: deterministic, no dependencies.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, bound: u64) -> u64 {
        self.next() % bound.max(1)
    }

    fn one_in(&mut self, n: u64) -> bool {
        self.below(n) == 0
    }
}

/// Where the sample generator puts buffers: free parts of the regions
/// (the table takes 0..0x400).
const FREE: [(u64, u64); 2] = [(0x400, 0x2000), (0x3000, 0x4000)];

/// An input that is mostly a well-formed request (of every type, direct
/// or indirect, header and status split or merged with data), then lightly
/// mutated: random bytes alone rarely get past the walker. Seeds for the
/// fuzzer and cases for the randomized test.
pub fn sample_input(seed: u64) -> Vec<u8> {
    let mut g = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
    let queue_size = 1 + g.below(64) as u16;
    let head = if g.one_in(16) {
        g.below(256) as u16
    } else {
        g.below(u64::from(queue_size)) as u16
    };
    let indirect = g.one_in(2);
    let read_only = g.one_in(8);
    let capacity = [g.below(256) as u8, 16, 255][g.below(3) as usize];
    let mut config = [
        queue_size as u8,
        head as u8,
        u8::from(indirect) | (u8::from(read_only) << 1),
        0,
        0,
        capacity,
        6 + g.below(6) as u8,
        1 + g.below(20) as u8,
        g.below(25) as u8,
        0,
    ];
    if g.one_in(32) {
        config[2] |= 4;
    }
    let capacity_sectors = Config::from_bytes(&config).shape.capacity_bytes / SECTOR_BYTES;
    let mut image = vec![0u8; IMAGE_BYTES];
    let mut next_free = FREE[0].0;
    let mut alloc = |g: &mut Rng, len: u64| -> u64 {
        if g.one_in(40) {
            // Somewhere bad: the hole, past the end, far away, wrapping.
            return [
                0x2000 - len / 2,
                0x2800,
                0x4000 - len / 2,
                1 << 40,
                u64::MAX - len / 2,
            ][g.below(5) as usize];
        }
        let mut at = next_free;
        if at < FREE[0].1 && at + len > FREE[0].1 {
            at = FREE[1].0;
        }
        next_free = at.wrapping_add(len);
        at
    };
    let sector = |g: &mut Rng| -> u64 {
        match g.below(8) {
            0 => g.next(),
            1 => capacity_sectors.saturating_sub(g.below(4)),
            _ => g.below(capacity_sectors.clamp(1, 256)),
        }
    };
    let sector_len = |g: &mut Rng| -> u32 {
        if g.one_in(16) {
            g.below(2048) as u32
        } else {
            512 * (1 + g.below(3) as u32)
        }
    };

    let kind: u32 = match g.below(20) {
        0..=5 => 0,
        6..=11 => 1,
        12 => 4,
        13 => 8,
        14 | 15 => 11,
        16 | 17 => 13,
        _ => g.below(32) as u32,
    };
    let mut header = [0u8; 16];
    header[0..4].copy_from_slice(&kind.to_le_bytes());
    header[8..16].copy_from_slice(&sector(&mut g).to_le_bytes());
    // (address, bytes, device-writable, contents)
    let mut bufs: Vec<(u64, u32, bool, Vec<u8>)> = Vec::new();
    let mut readable = header.to_vec();
    match kind {
        1 => {
            for _ in 0..1 + g.below(3) {
                let len = sector_len(&mut g);
                readable.extend((0..len).map(|_| g.next() as u8));
            }
        }
        11 | 13 => {
            for _ in 0..1 + g.below(4) {
                let flags: u32 = match g.below(8) {
                    0 => 1,
                    1 => g.next() as u32,
                    _ => 0,
                };
                readable.extend_from_slice(&sector(&mut g).to_le_bytes());
                readable.extend_from_slice(&(g.below(64) as u32).to_le_bytes());
                readable.extend_from_slice(&flags.to_le_bytes());
            }
        }
        _ => {}
    }
    // The readable bytes in 1..=3 buffers, cut anywhere.
    let pieces = 1 + g.below(3) as usize;
    let mut cuts: Vec<usize> = (1..pieces)
        .map(|_| g.below(readable.len() as u64) as usize)
        .collect();
    cuts.push(0);
    cuts.push(readable.len());
    cuts.sort_unstable();
    for w in cuts.windows(2) {
        let part = readable[w[0]..w[1]].to_vec();
        let at = alloc(&mut g, part.len() as u64);
        bufs.push((at, part.len() as u32, false, part));
    }
    // Device-writable: data, then the status byte (or both in one).
    let mut writable: Vec<u32> = match kind {
        0 => (0..1 + g.below(3)).map(|_| sector_len(&mut g)).collect(),
        8 => vec![1 + g.below(32) as u32],
        _ => Vec::new(),
    };
    let merged = !writable.is_empty() && g.one_in(3);
    match writable.last_mut() {
        Some(last) if merged => *last += 1,
        // Now and then no status byte at all.
        _ if g.one_in(30) => writable.clear(),
        _ => writable.push(1),
    }
    for len in writable {
        let at = alloc(&mut g, u64::from(len));
        bufs.push((at, len, true, Vec::new()));
    }
    for (at, _, _, bytes) in &bufs {
        put(&mut image, *at, bytes);
    }

    // The descriptors: direct from the head, or one indirect table.
    let desc = |addr: u64, len: u32, flags: u16, next: u16| {
        let mut d = [0u8; 16];
        d[0..8].copy_from_slice(&addr.to_le_bytes());
        d[8..12].copy_from_slice(&len.to_le_bytes());
        d[12..14].copy_from_slice(&flags.to_le_bytes());
        d[14..16].copy_from_slice(&next.to_le_bytes());
        d
    };
    let table = if g.one_in(8) { g.below(0x4400) } else { 0 };
    config[3..5].copy_from_slice(&(table as u16).to_le_bytes());
    let flags_of = |writable: bool, more: bool| u16::from(writable) * 2 + u16::from(more);
    if indirect && g.one_in(3) {
        let at = alloc(&mut g, 16 * bufs.len() as u64);
        for (i, (addr, len, w, _)) in bufs.iter().enumerate() {
            let more = i + 1 < bufs.len();
            put(
                &mut image,
                at.wrapping_add(16 * i as u64),
                &desc(*addr, *len, flags_of(*w, more), i as u16 + 1),
            );
        }
        let entry = desc(at, 16 * bufs.len() as u32, 4, 0);
        put(&mut image, table + 16 * u64::from(head), &entry);
    } else {
        // Distinct indices from the head on (repeating when the queue is
        // too small: a loop).
        let mut order = vec![head];
        let mut unused: Vec<u16> = (0..queue_size).filter(|&i| i != head).collect();
        for _ in 1..bufs.len() {
            let i = if unused.is_empty() {
                g.below(u64::from(queue_size)) as u16
            } else {
                unused.swap_remove(g.below(unused.len() as u64) as usize)
            };
            order.push(i);
        }
        for (i, (addr, len, w, _)) in bufs.iter().enumerate() {
            let more = i + 1 < bufs.len();
            let next = order.get(i + 1).copied().unwrap_or(0);
            put(
                &mut image,
                table + 16 * u64::from(order[i]),
                &desc(*addr, *len, flags_of(*w, more), next),
            );
        }
    }

    let mut input = config.to_vec();
    input.extend_from_slice(&image);
    for _ in 0..g.below(4) {
        let at = g.below(input.len() as u64) as usize;
        input[at] = g.next() as u8;
    }
    input
}

/// Writes `bytes` at guest address `at` of the image, as far as it goes.
fn put(image: &mut [u8], at: u64, bytes: &[u8]) {
    for (i, b) in bytes.iter().enumerate() {
        if let Some(slot) = at
            .checked_add(i as u64)
            .and_then(|a| image.get_mut(a as usize))
        {
            *slot = *b;
        }
    }
}
