//! A MemDevice wrapper whose reads can be held at a gate or slowed down,
//! counting how many reads are in the device at once; with a delay on every
//! read and write, recording the most data bytes it held at once.

use std::io;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use nbd_server::{BlockDevice, BlockSizes, Extent, ZeroFlags};
use tokio::sync::Semaphore;

use super::mem_device::MemDevice;

pub struct HookDevice {
    pub inner: MemDevice,
    /// Reads wait for a permit here (permits are not returned).
    pub gate: Option<Arc<Semaphore>>,
    /// Reads at this offset take this long.
    pub slow_read: Option<(u64, Duration)>,
    /// Every read and write takes this long.
    pub delay: Option<Duration>,
    pub reads_in_device: AtomicUsize,
    pub max_reads_in_device: AtomicUsize,
    /// Data bytes of the reads and writes in the device right now.
    pub bytes_in_device: AtomicUsize,
    pub max_bytes_in_device: AtomicUsize,
}

impl HookDevice {
    pub fn new(inner: MemDevice) -> HookDevice {
        HookDevice {
            inner,
            gate: None,
            slow_read: None,
            delay: None,
            reads_in_device: AtomicUsize::new(0),
            max_reads_in_device: AtomicUsize::new(0),
            bytes_in_device: AtomicUsize::new(0),
            max_bytes_in_device: AtomicUsize::new(0),
        }
    }

    /// A device whose every read and write takes `delay`.
    pub fn slow(inner: MemDevice, delay: Duration) -> HookDevice {
        HookDevice {
            delay: Some(delay),
            ..HookDevice::new(inner)
        }
    }

    /// Counts `bytes` as held until the guard drops, and waits the delay.
    async fn hold(&self, bytes: usize) -> InDevice<'_> {
        let now = self.bytes_in_device.fetch_add(bytes, Ordering::SeqCst) + bytes;
        self.max_bytes_in_device.fetch_max(now, Ordering::SeqCst);
        let held = InDevice(&self.bytes_in_device, bytes);
        if let Some(delay) = self.delay {
            tokio::time::sleep(delay).await;
        }
        held
    }

    pub fn gated(inner: MemDevice, gate: Arc<Semaphore>) -> HookDevice {
        HookDevice {
            gate: Some(gate),
            ..HookDevice::new(inner)
        }
    }

    /// Waits until `count` reads are inside the device (10 s at most).
    pub async fn wait_for_reads(&self, count: usize) {
        super::within(10, async {
            while self.reads_in_device.load(Ordering::SeqCst) < count {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await;
    }
}

/// Takes its amount off the counter when dropped.
struct InDevice<'a>(&'a AtomicUsize, usize);

impl Drop for InDevice<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(self.1, Ordering::SeqCst);
    }
}

impl BlockDevice for HookDevice {
    fn size_bytes(&self) -> u64 {
        self.inner.size_bytes()
    }

    fn block_sizes(&self) -> BlockSizes {
        self.inner.block_sizes()
    }

    async fn read(&self, offset_bytes: u64, buf: &mut [u8]) -> io::Result<()> {
        let now = self.reads_in_device.fetch_add(1, Ordering::SeqCst) + 1;
        self.max_reads_in_device.fetch_max(now, Ordering::SeqCst);
        // Counts down even when the read is cancelled.
        let _in_device = InDevice(&self.reads_in_device, 1);
        if let Some(gate) = &self.gate {
            gate.acquire().await.unwrap().forget();
        }
        if let Some((slow_offset, delay)) = self.slow_read {
            if slow_offset == offset_bytes {
                tokio::time::sleep(delay).await;
            }
        }
        let _held = self.hold(buf.len()).await;
        self.inner.read(offset_bytes, buf).await
    }

    async fn write(&self, offset_bytes: u64, data: &[u8], fua: bool) -> io::Result<()> {
        let _held = self.hold(data.len()).await;
        self.inner.write(offset_bytes, data, fua).await
    }

    async fn flush(&self) -> io::Result<()> {
        self.inner.flush().await
    }

    async fn trim(&self, offset_bytes: u64, length_bytes: u64, fua: bool) -> io::Result<()> {
        self.inner.trim(offset_bytes, length_bytes, fua).await
    }

    async fn write_zeroes(
        &self,
        offset_bytes: u64,
        length_bytes: u64,
        flags: ZeroFlags,
    ) -> io::Result<()> {
        self.inner
            .write_zeroes(offset_bytes, length_bytes, flags)
            .await
    }

    async fn block_status(
        &self,
        offset_bytes: u64,
        length_bytes: u64,
        max_extents: usize,
    ) -> io::Result<Vec<Extent>> {
        self.inner
            .block_status(offset_bytes, length_bytes, max_extents)
            .await
    }
}
