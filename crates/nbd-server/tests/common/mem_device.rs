//! An in-memory block device for tests and the `memserve` example: the
//! bytes in a `Vec<u8>`, plus a per-sector allocation map so that trim,
//! write-zeroes and block status behave like a real sparse device.

#![allow(dead_code)]

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

use nbd_server::{
    Allocation, BlockDevice, BlockSizes, ExportInfo, ExportProvider, Extent, ZeroFlags,
};

/// Granularity of the allocation map.
pub const SECTOR_BYTES: u64 = 512;

struct State {
    data: Vec<u8>,
    /// One entry per (possibly partial, at the end) sector.
    sectors: Vec<Allocation>,
}

pub struct MemDevice {
    size_bytes: u64,
    read_only: bool,
    block_sizes: BlockSizes,
    state: RwLock<State>,
    pub flushes: AtomicU64,
}

impl MemDevice {
    /// A device of `size_bytes` that starts as one big hole.
    pub fn new(size_bytes: u64) -> MemDevice {
        let sector_count = size_bytes.div_ceil(SECTOR_BYTES) as usize;
        MemDevice {
            size_bytes,
            read_only: false,
            block_sizes: BlockSizes::default(),
            state: RwLock::new(State {
                data: vec![0; size_bytes as usize],
                sectors: vec![Allocation::Hole; sector_count],
            }),
            flushes: AtomicU64::new(0),
        }
    }

    pub fn read_only(mut self) -> MemDevice {
        self.read_only = true;
        self
    }

    pub fn with_block_sizes(mut self, block_sizes: BlockSizes) -> MemDevice {
        self.block_sizes = block_sizes;
        self
    }

    /// Copy of the bytes at `[offset, offset + length)`.
    pub fn snapshot(&self, offset_bytes: u64, length_bytes: usize) -> Vec<u8> {
        let state = self.read_state();
        let start = offset_bytes as usize;
        state.data[start..start + length_bytes].to_vec()
    }

    /// Fills a range with bytes and marks it as data (test setup).
    pub fn fill(&self, offset_bytes: u64, bytes: &[u8]) {
        let mut state = self.write_state();
        state.store(offset_bytes, bytes);
    }

    pub fn allocation_at(&self, offset_bytes: u64) -> Allocation {
        self.read_state().sectors[(offset_bytes / SECTOR_BYTES) as usize]
    }

    fn read_state(&self) -> RwLockReadGuard<'_, State> {
        self.state.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn write_state(&self) -> RwLockWriteGuard<'_, State> {
        self.state.write().unwrap_or_else(PoisonError::into_inner)
    }

    fn check_range(&self, offset_bytes: u64, length_bytes: u64) -> io::Result<()> {
        match offset_bytes.checked_add(length_bytes) {
            Some(end) if end <= self.size_bytes => Ok(()),
            _ => Err(io::Error::new(io::ErrorKind::InvalidInput, "out of range")),
        }
    }

    fn zero_range(&self, offset_bytes: u64, length_bytes: u64, whole: Allocation) {
        let mut state = self.write_state();
        let start = offset_bytes as usize;
        let end = (offset_bytes + length_bytes) as usize;
        state.data[start..end].fill(0);
        let first_whole = offset_bytes.div_ceil(SECTOR_BYTES);
        let end_whole = if offset_bytes + length_bytes == self.size_bytes {
            state.sectors.len() as u64
        } else {
            (offset_bytes + length_bytes) / SECTOR_BYTES
        };
        for sector in first_whole..end_whole.max(first_whole) {
            state.sectors[sector as usize] = whole;
        }
    }
}

impl State {
    fn store(&mut self, offset_bytes: u64, bytes: &[u8]) {
        let start = offset_bytes as usize;
        self.data[start..start + bytes.len()].copy_from_slice(bytes);
        if bytes.is_empty() {
            return;
        }
        let first = offset_bytes / SECTOR_BYTES;
        let last = (offset_bytes + bytes.len() as u64 - 1) / SECTOR_BYTES;
        for sector in first..=last {
            self.sectors[sector as usize] = Allocation::Data;
        }
    }
}

impl BlockDevice for MemDevice {
    fn size_bytes(&self) -> u64 {
        self.size_bytes
    }

    fn block_sizes(&self) -> BlockSizes {
        self.block_sizes
    }

    fn is_read_only(&self) -> bool {
        self.read_only
    }

    async fn read(&self, offset_bytes: u64, buf: &mut [u8]) -> io::Result<()> {
        self.check_range(offset_bytes, buf.len() as u64)?;
        let state = self.read_state();
        let start = offset_bytes as usize;
        buf.copy_from_slice(&state.data[start..start + buf.len()]);
        Ok(())
    }

    async fn write(&self, offset_bytes: u64, data: &[u8], _fua: bool) -> io::Result<()> {
        self.check_range(offset_bytes, data.len() as u64)?;
        self.write_state().store(offset_bytes, data);
        Ok(())
    }

    async fn flush(&self) -> io::Result<()> {
        self.flushes.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    async fn trim(&self, offset_bytes: u64, length_bytes: u64, _fua: bool) -> io::Result<()> {
        self.check_range(offset_bytes, length_bytes)?;
        self.zero_range(offset_bytes, length_bytes, Allocation::Hole);
        Ok(())
    }

    async fn write_zeroes(
        &self,
        offset_bytes: u64,
        length_bytes: u64,
        flags: ZeroFlags,
    ) -> io::Result<()> {
        self.check_range(offset_bytes, length_bytes)?;
        let whole = if flags.no_hole {
            Allocation::Zero
        } else {
            Allocation::Hole
        };
        self.zero_range(offset_bytes, length_bytes, whole);
        Ok(())
    }

    async fn block_status(
        &self,
        offset_bytes: u64,
        length_bytes: u64,
        max_extents: usize,
    ) -> io::Result<Vec<Extent>> {
        self.check_range(offset_bytes, length_bytes)?;
        let state = self.read_state();
        let end = offset_bytes + length_bytes;
        let mut extents: Vec<Extent> = Vec::new();
        let mut position = offset_bytes;
        while position < end && extents.len() < max_extents {
            let allocation = state.sectors[(position / SECTOR_BYTES) as usize];
            let mut run_end = (position / SECTOR_BYTES + 1) * SECTOR_BYTES;
            while run_end < end && state.sectors[(run_end / SECTOR_BYTES) as usize] == allocation {
                run_end += SECTOR_BYTES;
            }
            let run_end = run_end.min(end);
            extents.push(Extent {
                length_bytes: run_end - position,
                allocation,
            });
            position = run_end;
        }
        Ok(extents)
    }
}

/// A provider over a fixed list of named devices.
pub struct Exports<D> {
    exports: Vec<(ExportInfo, Arc<D>)>,
}

impl<D> Exports<D> {
    pub fn new() -> Self {
        Exports {
            exports: Vec::new(),
        }
    }

    pub fn with(mut self, name: &str, description: &str, device: Arc<D>) -> Self {
        let info = ExportInfo {
            name: name.to_owned(),
            description: description.to_owned(),
        };
        self.exports.push((info, device));
        self
    }
}

impl<D: BlockDevice> ExportProvider for Exports<D> {
    type Device = D;

    async fn list(&self) -> io::Result<Vec<ExportInfo>> {
        Ok(self.exports.iter().map(|(info, _)| info.clone()).collect())
    }

    async fn open(&self, name: &str) -> io::Result<Arc<D>> {
        self.exports
            .iter()
            .find(|(info, _)| info.name == name)
            .map(|(_, device)| Arc::clone(device))
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, format!("no export {name:?}")))
    }
}
