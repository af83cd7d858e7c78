//! The adapter between the vhost-user-blk backend and the engine: the
//! same volume device NBD serves (`nbd_volume.rs`: errors logged, rate
//! limits, snapshots read-only), seen through vhost-user-blk's
//! `BlockDevice`. Neither server crate knows the engine, nor each other.

use std::io;
use std::sync::Arc;

use nbd_server::{BlockDevice as NbdDevice, ExportProvider, ZeroFlags};
use vhost_user_blk::{Admission, BlockDevice, DeviceProvider};

use crate::nbd_volume::{NbdVolume, VolumeExports};

impl BlockDevice for NbdVolume {
    fn size_bytes(&self) -> u64 {
        NbdDevice::size_bytes(self)
    }

    fn is_read_only(&self) -> bool {
        NbdDevice::is_read_only(self)
    }

    fn id(&self) -> String {
        self.export_name()
    }

    async fn read(&self, offset_bytes: u64, buf: &mut [u8]) -> io::Result<()> {
        NbdDevice::read(self, offset_bytes, buf).await
    }

    async fn write(&self, offset_bytes: u64, data: &[u8]) -> io::Result<()> {
        // virtio-blk has no FUA: durability comes with the next FLUSH,
        // which the guest sends (VIRTIO_BLK_F_FLUSH is offered).
        NbdDevice::write(self, offset_bytes, data, false).await
    }

    async fn flush(&self) -> io::Result<()> {
        NbdDevice::flush(self).await
    }

    async fn discard(&self, offset_bytes: u64, length_bytes: u64) -> io::Result<()> {
        NbdDevice::trim(self, offset_bytes, length_bytes, false).await
    }

    async fn write_zeroes(
        &self,
        offset_bytes: u64,
        length_bytes: u64,
        may_unmap: bool,
    ) -> io::Result<()> {
        let flags = ZeroFlags {
            no_hole: !may_unmap,
            ..ZeroFlags::default()
        };
        NbdDevice::write_zeroes(self, offset_bytes, length_bytes, flags).await
    }

    async fn admit(&self, kind: Admission, bytes: u64) {
        let kind = match kind {
            Admission::Read => nbd_server::Admission::Read,
            Admission::Write => nbd_server::Admission::Write,
        };
        NbdDevice::admit(self, kind, bytes).await
    }

    fn size_watch(&self) -> Option<tokio::sync::watch::Receiver<u64>> {
        self.watch_size()
    }
}

impl DeviceProvider for VolumeExports {
    type Device = NbdVolume;

    async fn open(&self, name: &str) -> io::Result<Arc<NbdVolume>> {
        ExportProvider::open(self, name).await
    }
}
