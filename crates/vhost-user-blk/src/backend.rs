//! The vhost-user protocol state of one frontend connection: the features
//! agreed, the guest's memory, each ring's setup, the inflight area, and
//! the queue workers started from them (the `vhost` crate reads and
//! answers the messages; this decides what they mean).
//!
//! A ring starts when it has a size, addresses, a kick descriptor and is
//! enabled, and stops at VHOST_USER_GET_VRING_BASE, on disable, reset or
//! disconnect: its worker returns every request it took (and logs what it
//! wrote, during a migration) before the ring is reported stopped. A
//! stopped ring keeps its size, addresses and enabled state (the spec
//! tracks enabling apart from starting); it starts again from the base
//! VHOST_USER_SET_VRING_BASE gives once it has a new kick descriptor.
//!
//! Live migration (the frontend copies guest memory to another host while
//! the guest runs): VHOST_F_LOG_ALL and VHOST_USER_PROTOCOL_F_LOG_SHMFD
//! are offered; the log area and what it must cover are `dirty_log.rs`'s.
//! Nothing else of the device moves: the volume is shared storage, and
//! the rings' state is the frontend's (GET_VRING_BASE on the source,
//! SET_VRING_BASE on the destination).

use std::fs::File;
use std::sync::Arc;

use tokio::sync::Semaphore;
use vhost::vhost_user::message::{
    VhostTransferStateDirection, VhostTransferStatePhase, VhostUserConfigFlags, VhostUserInflight,
    VhostUserLog, VhostUserMemoryRegion, VhostUserProtocolFeatures, VhostUserShMemConfig,
    VhostUserSharedMsg, VhostUserSingleMemoryRegion, VhostUserVringAddrFlags, VhostUserVringState,
};
use vhost::vhost_user::{
    Backend, Error as VuError, GpuBackend, Result as VuResult, VhostUserBackendReqHandlerMut,
    VhostUserVirtioFeatures,
};
use vhost::VhostUserMemoryRegionBase;
use virtio_bindings::virtio_blk::{
    VIRTIO_BLK_F_BLK_SIZE, VIRTIO_BLK_F_DISCARD, VIRTIO_BLK_F_FLUSH, VIRTIO_BLK_F_MQ,
    VIRTIO_BLK_F_RO, VIRTIO_BLK_F_SEG_MAX, VIRTIO_BLK_F_SIZE_MAX, VIRTIO_BLK_F_TOPOLOGY,
    VIRTIO_BLK_F_WRITE_ZEROES,
};
use virtio_bindings::virtio_config::VIRTIO_F_VERSION_1;
use virtio_bindings::virtio_ring::{VIRTIO_RING_F_EVENT_IDX, VIRTIO_RING_F_INDIRECT_DESC};
use vm_memory::{GuestAddress, GuestMemoryAtomic, GuestMemoryMmap, GuestRegionMmap};

use crate::config_space::{config_bytes, Limits};
use crate::device::BlockDevice;
use crate::dirty_log::{check_covered, used_ring_bytes, DirtyLog, LogArea, UsedRingLog};
use crate::error_log::ErrorLog;
use crate::inflight::{create_area, InflightArea, MAX_QUEUE_SIZE};
use crate::metrics::DeviceMetrics;
use crate::queue_worker::{self, QueueSetup, Shared, Worker};

/// VHOST_USER_F_PROTOCOL_FEATURES: rings start disabled, and protocol
/// features are negotiated.
const PROTOCOL_FEATURES_BIT: u64 = 1 << 30;
/// VHOST_F_LOG_ALL (bit 26): while acked, every guest page the backend
/// writes is marked in the dirty log (a migration is copying memory).
const LOG_ALL_BIT: u64 = VhostUserVirtioFeatures::LOG_ALL.bits();
/// Bytes of configuration space a frontend may ask for (what is past the
/// fields served reads as zeros).
const MAX_CONFIG_BYTES: u32 = 256;

/// How a connection's device is offered.
#[derive(Debug, Clone, Copy)]
pub struct DeviceConfig {
    pub num_queues: u16,
    pub limits: Limits,
}

/// One ring's setup as the frontend gave it.
struct Vring {
    size: u16,
    /// Descriptor table, available and used ring (guest physical).
    addrs: Option<(u64, u64, u64)>,
    next_avail: u16,
    kick: Option<File>,
    call: Arc<parking_lot::Mutex<Option<File>>>,
    enabled: bool,
    /// VHOST_VRING_F_LOG and log_guest_addr, shared with the worker.
    used_log: Arc<UsedRingLog>,
    worker: Option<Worker>,
}

impl Vring {
    /// A ring the frontend has not set up.
    fn idle() -> Vring {
        Vring {
            size: 0,
            addrs: None,
            next_avail: 0,
            kick: None,
            call: Arc::new(parking_lot::Mutex::new(None)),
            enabled: false,
            used_log: Arc::new(UsedRingLog::default()),
            worker: None,
        }
    }
}

/// A guest memory region: where the frontend's own mapping of it was.
struct Mapping {
    frontend_addr: u64,
    size: u64,
    guest_addr: u64,
}

pub struct BlkBackend<D: BlockDevice> {
    device: Arc<D>,
    config: DeviceConfig,
    runtime: tokio::runtime::Handle,
    budget: Arc<Semaphore>,
    metrics: Arc<DeviceMetrics>,
    name: String,
    acked_features: u64,
    acked_protocol: u64,
    mem: Option<GuestMemoryAtomic<GuestMemoryMmap>>,
    mappings: Vec<Mapping>,
    vrings: Vec<Vring>,
    inflight: Option<Arc<InflightArea>>,
    dirty_log: Arc<DirtyLog>,
    shared: Option<Arc<Shared<D>>>,
}

impl<D: BlockDevice> BlkBackend<D> {
    pub fn new(
        name: &str,
        device: Arc<D>,
        config: DeviceConfig,
        (budget, metrics): (Arc<Semaphore>, Arc<DeviceMetrics>),
        runtime: tokio::runtime::Handle,
    ) -> Self {
        let vrings = (0..config.num_queues).map(|_| Vring::idle()).collect();
        BlkBackend {
            device,
            config,
            runtime,
            budget,
            metrics,
            name: name.to_string(),
            acked_features: 0,
            acked_protocol: 0,
            mem: None,
            mappings: Vec::new(),
            vrings,
            inflight: None,
            dirty_log: Arc::new(DirtyLog::default()),
            shared: None,
        }
    }

    fn offered_features(&self) -> u64 {
        let bit = |b: u32| 1u64 << b;
        let mut f = bit(VIRTIO_F_VERSION_1)
            | bit(VIRTIO_RING_F_INDIRECT_DESC)
            | bit(VIRTIO_RING_F_EVENT_IDX)
            | PROTOCOL_FEATURES_BIT
            | LOG_ALL_BIT
            | bit(VIRTIO_BLK_F_SIZE_MAX)
            | bit(VIRTIO_BLK_F_SEG_MAX)
            | bit(VIRTIO_BLK_F_BLK_SIZE)
            | bit(VIRTIO_BLK_F_TOPOLOGY)
            | bit(VIRTIO_BLK_F_FLUSH)
            | bit(VIRTIO_BLK_F_MQ);
        if self.device.is_read_only() {
            f |= bit(VIRTIO_BLK_F_RO);
        } else {
            f |= bit(VIRTIO_BLK_F_DISCARD) | bit(VIRTIO_BLK_F_WRITE_ZEROES);
        }
        f
    }

    fn vring(&mut self, index: u32) -> VuResult<&mut Vring> {
        self.vrings
            .get_mut(index as usize)
            .ok_or(VuError::InvalidParam)
    }

    fn to_guest(&self, frontend_addr: u64) -> VuResult<u64> {
        self.mappings
            .iter()
            .find(|m| frontend_addr >= m.frontend_addr && frontend_addr - m.frontend_addr < m.size)
            .map(|m| frontend_addr - m.frontend_addr + m.guest_addr)
            .ok_or_else(|| {
                VuError::ReqHandlerError(std::io::Error::other(format!(
                    "ring address {frontend_addr:#x} is in no guest memory region"
                )))
            })
    }

    /// Starts ring `index`'s worker if it has everything it needs.
    fn maybe_start(&mut self, index: usize) -> VuResult<()> {
        let protocol = self.acked_features & PROTOCOL_FEATURES_BIT != 0;
        let (Some(mem), Some(v)) = (self.mem.clone(), self.vrings.get(index)) else {
            return Ok(());
        };
        let enabled = v.enabled || !protocol;
        let (Some(kick), Some((desc, avail, used))) = (&v.kick, v.addrs) else {
            return Ok(());
        };
        if v.worker.is_some() || !enabled || v.size == 0 {
            return Ok(());
        }
        let kick = kick.try_clone().map_err(VuError::ReqHandlerError)?;
        let shared = self.shared.get_or_insert_with(|| {
            Arc::new(Shared {
                device: self.device.clone(),
                mem,
                budget: self.budget.clone(),
                metrics: self.metrics.clone(),
                limits: self.config.limits,
                log: ErrorLog::new(&self.name),
                dirty_log: self.dirty_log.clone(),
            })
        });
        let setup = QueueSetup {
            index: index as u16,
            size: v.size,
            desc_table: desc,
            avail_ring: avail,
            used_ring: used,
            next_avail: v.next_avail,
            event_idx: self.acked_features & (1 << VIRTIO_RING_F_EVENT_IDX) != 0,
            indirect: self.acked_features & (1 << VIRTIO_RING_F_INDIRECT_DESC) != 0,
            kick,
            call: v.call.clone(),
            inflight: self
                .inflight
                .as_ref()
                .and_then(|a| a.queue(index as u16, v.size)),
            used_log: v.used_log.clone(),
        };
        let worker = queue_worker::start(setup, shared.clone(), &self.runtime).map_err(|e| {
            tracing::warn!(volume = %self.name, queue = index, error = %e, "queue not started");
            VuError::ReqHandlerError(std::io::Error::other(e))
        })?;
        self.vrings[index].worker = Some(worker);
        Ok(())
    }

    /// Stops ring `index`'s worker (blocking until its requests are
    /// returned); the ring resumes where it stopped.
    fn stop_ring(&mut self, index: usize) {
        if let Some(v) = self.vrings.get_mut(index) {
            if let Some(worker) = v.worker.take() {
                if let Some(next_avail) = worker.stop_blocking() {
                    v.next_avail = next_avail;
                }
            }
        }
    }

    /// Stops every ring: for a disconnect, a reset or a shutdown.
    pub fn stop_all(&mut self) {
        for index in 0..self.vrings.len() {
            self.stop_ring(index);
        }
    }

    fn reset(&mut self) {
        self.stop_all();
        for v in &mut self.vrings {
            *v = Vring::idle();
        }
        self.acked_features = 0;
        self.inflight = None;
        self.dirty_log.clear();
        self.shared = None;
    }

    /// Ok when a dirty log of `log_bytes` covers every guest address
    /// `regions` (guest address, bytes) hold and every used ring logged
    /// at its log address; else why not.
    fn check_log_covers(&self, log_bytes: u64, regions: &[(u64, u64)]) -> Result<(), String> {
        let rings = self.vrings.iter().enumerate().filter_map(|(i, v)| {
            v.used_log.get().map(|at| {
                (
                    format!("the used ring of queue {i}"),
                    at,
                    used_ring_bytes(v.size),
                )
            })
        });
        let memory = regions.iter().map(|&(guest_addr, bytes)| {
            (
                format!("the guest memory region at {guest_addr:#x}"),
                guest_addr,
                bytes,
            )
        });
        for (what, addr, bytes) in memory.chain(rings) {
            check_covered(log_bytes, &what, addr, bytes)?;
        }
        Ok(())
    }

    fn regions(&self) -> Vec<(u64, u64)> {
        self.mappings
            .iter()
            .map(|m| (m.guest_addr, m.size))
            .collect()
    }
}

/// A message refused, with why: the connection thread logs it and closes
/// the connection (vhost-user has no error reply for most messages, and
/// none for VHOST_USER_SET_LOG_BASE; QEMU then fails the migration).
fn refused(why: String) -> VuError {
    VuError::ReqHandlerError(std::io::Error::other(why))
}

impl<D: BlockDevice> Drop for BlkBackend<D> {
    fn drop(&mut self) {
        self.stop_all();
    }
}

fn unsupported<T>(what: &'static str) -> VuResult<T> {
    Err(VuError::InvalidOperation(what))
}

impl<D: BlockDevice> VhostUserBackendReqHandlerMut for BlkBackend<D> {
    fn set_owner(&mut self) -> VuResult<()> {
        Ok(())
    }

    fn reset_owner(&mut self) -> VuResult<()> {
        self.reset();
        Ok(())
    }

    fn reset_device(&mut self) -> VuResult<()> {
        self.reset();
        Ok(())
    }

    fn get_features(&mut self) -> VuResult<u64> {
        Ok(self.offered_features())
    }

    fn set_features(&mut self, features: u64) -> VuResult<()> {
        if features & !self.offered_features() != 0 {
            return Err(VuError::InvalidParam);
        }
        let log_all = features & LOG_ALL_BIT != 0;
        if log_all != (self.acked_features & LOG_ALL_BIT != 0) {
            tracing::info!(volume = %self.name, on = log_all, "vhost-user dirty logging (migration) turned {}", if log_all { "on" } else { "off" });
        }
        // Running rings see LOG_ALL at their next write: the frontend
        // turns it on and off while they run.
        self.dirty_log.set_log_all(log_all);
        self.acked_features = features;
        Ok(())
    }

    fn set_mem_table(
        &mut self,
        ctx: &[VhostUserMemoryRegion],
        files: Vec<File>,
        _postcopy_listening: Option<bool>,
    ) -> VuResult<Option<Vec<VhostUserMemoryRegionBase>>> {
        // A dirty log being filled must cover the new table; QEMU grows
        // its log before it grows the table, and shrinks it after.
        if let Some(log_bytes) = self.dirty_log.area_bytes() {
            let table: Vec<(u64, u64)> = ctx
                .iter()
                .map(|r| (r.guest_phys_addr, r.memory_size))
                .collect();
            self.check_log_covers(log_bytes, &table).map_err(refused)?;
        }
        let mut regions = Vec::with_capacity(ctx.len());
        let mut mappings = Vec::with_capacity(ctx.len());
        for (region, file) in ctx.iter().zip(files) {
            let mapped = GuestRegionMmap::new(
                region.mmap_region(file)?,
                GuestAddress(region.guest_phys_addr),
            )
            .ok_or(VuError::InvalidParam)?;
            regions.push(mapped);
            mappings.push(Mapping {
                frontend_addr: region.user_addr,
                size: region.memory_size,
                guest_addr: region.guest_phys_addr,
            });
        }
        let mem = GuestMemoryMmap::from_regions(regions)
            .map_err(|e| VuError::ReqHandlerError(std::io::Error::other(e)))?;
        match &self.mem {
            // Running workers see the new table at their next access.
            Some(atomic) => atomic
                .lock()
                .map_err(|_| VuError::BackendInternalError)?
                .replace(mem),
            None => self.mem = Some(GuestMemoryAtomic::new(mem)),
        }
        self.mappings = mappings;
        Ok(None)
    }

    fn set_vring_num(&mut self, index: u32, num: u32) -> VuResult<()> {
        if num == 0 || num > u32::from(MAX_QUEUE_SIZE) || !num.is_power_of_two() {
            return Err(VuError::InvalidParam);
        }
        self.vring(index)?.size = num as u16;
        Ok(())
    }

    /// Also sent to a running ring, to turn the logging of its used ring
    /// on or off at the start and end of a migration: the addresses must
    /// then be the ones it runs on.
    fn set_vring_addr(
        &mut self,
        index: u32,
        flags: VhostUserVringAddrFlags,
        descriptor: u64,
        used: u64,
        available: u64,
        log: u64,
    ) -> VuResult<()> {
        let addrs = (
            self.to_guest(descriptor)?,
            self.to_guest(available)?,
            self.to_guest(used)?,
        );
        let log_area = self.dirty_log.area_bytes();
        let v = self.vring(index)?;
        if v.worker.is_some() && v.addrs != Some(addrs) {
            return Err(refused(format!(
                "queue {index} is running: its rings cannot move (stop it with VHOST_USER_GET_VRING_BASE first)"
            )));
        }
        let used_log = if flags.contains(VhostUserVringAddrFlags::VHOST_VRING_F_LOG) {
            let what = format!("the used ring of queue {index}");
            // The spec: the log must have a bit for the ring's last byte.
            check_covered(
                log_area.unwrap_or(u64::MAX),
                &what,
                log,
                used_ring_bytes(v.size),
            )
            .map_err(refused)?;
            Some(log)
        } else {
            None
        };
        v.addrs = Some(addrs);
        v.used_log.set(used_log);
        Ok(())
    }

    fn set_vring_base(&mut self, index: u32, base: u32) -> VuResult<()> {
        self.vring(index)?.next_avail = base as u16;
        Ok(())
    }

    fn get_vring_base(&mut self, index: u32) -> VuResult<VhostUserVringState> {
        self.vring(index)?;
        self.stop_ring(index as usize);
        let v = self.vring(index)?;
        // Stopped, not disabled: it starts again at its next kick
        // descriptor, enabled as it was (the spec tracks enabling apart
        // from starting, and a frontend need not enable it again).
        v.kick = None;
        Ok(VhostUserVringState::new(index, u32::from(v.next_avail)))
    }

    fn set_vring_kick(&mut self, index: u8, fd: Option<File>) -> VuResult<()> {
        // Without a kick descriptor the backend would have to poll.
        let fd = fd.ok_or(VuError::InvalidParam)?;
        self.vring(u32::from(index))?.kick = Some(fd);
        self.maybe_start(usize::from(index))
    }

    fn set_vring_call(&mut self, index: u8, fd: Option<File>) -> VuResult<()> {
        *self.vring(u32::from(index))?.call.lock() = fd;
        Ok(())
    }

    fn set_vring_err(&mut self, index: u8, _fd: Option<File>) -> VuResult<()> {
        self.vring(u32::from(index))?;
        Ok(())
    }

    fn get_protocol_features(&mut self) -> VuResult<VhostUserProtocolFeatures> {
        Ok(VhostUserProtocolFeatures::MQ
            | VhostUserProtocolFeatures::CONFIG
            | VhostUserProtocolFeatures::INFLIGHT_SHMFD
            | VhostUserProtocolFeatures::BACKEND_REQ
            | VhostUserProtocolFeatures::LOG_SHMFD)
    }

    fn set_protocol_features(&mut self, features: u64) -> VuResult<()> {
        self.acked_protocol = features;
        Ok(())
    }

    fn get_queue_num(&mut self) -> VuResult<u64> {
        Ok(u64::from(self.config.num_queues))
    }

    fn set_vring_enable(&mut self, index: u32, enable: bool) -> VuResult<()> {
        self.vring(index)?.enabled = enable;
        if enable {
            self.maybe_start(index as usize)
        } else {
            self.stop_ring(index as usize);
            Ok(())
        }
    }

    fn get_config(
        &mut self,
        offset: u32,
        size: u32,
        _flags: VhostUserConfigFlags,
    ) -> VuResult<Vec<u8>> {
        let end = offset.checked_add(size).ok_or(VuError::InvalidParam)?;
        if end > MAX_CONFIG_BYTES {
            return Err(VuError::InvalidParam);
        }
        let mut space = config_bytes(
            self.device.size_bytes(),
            self.config.num_queues,
            &self.config.limits,
        )
        .to_vec();
        space.resize(MAX_CONFIG_BYTES as usize, 0);
        Ok(space[offset as usize..end as usize].to_vec())
    }

    fn set_config(
        &mut self,
        _offset: u32,
        _buf: &[u8],
        _flags: VhostUserConfigFlags,
    ) -> VuResult<()> {
        // Nothing is writable: CONFIG_WCE is not offered.
        unsupported("the configuration space is read-only")
    }

    /// The channel itself is kept by the connection thread
    /// (`backend_channel.rs`): the vhost crate's `Backend` cannot send
    /// VHOST_USER_BACKEND_CONFIG_CHANGE_MSG.
    fn set_backend_req_fd(&mut self, _backend: Backend) {}

    fn set_gpu_socket(&mut self, _gpu_backend: GpuBackend) -> VuResult<()> {
        unsupported("not a GPU")
    }

    fn get_shared_object(&mut self, _uuid: VhostUserSharedMsg) -> VuResult<File> {
        unsupported("no shared objects")
    }

    fn get_inflight_fd(
        &mut self,
        inflight: &VhostUserInflight,
    ) -> VuResult<(VhostUserInflight, File)> {
        if inflight.num_queues > self.config.num_queues {
            return Err(VuError::InvalidParam);
        }
        let (file, bytes) = create_area(inflight.num_queues, inflight.queue_size)
            .map_err(|e| VuError::ReqHandlerError(std::io::Error::other(e)))?;
        let reply = VhostUserInflight {
            mmap_size: bytes,
            mmap_offset: 0,
            num_queues: inflight.num_queues,
            queue_size: inflight.queue_size,
        };
        Ok((reply, file))
    }

    fn set_inflight_fd(&mut self, inflight: &VhostUserInflight, file: File) -> VuResult<()> {
        let area = InflightArea::map(
            file,
            inflight.mmap_offset,
            inflight.mmap_size,
            inflight.num_queues,
            inflight.queue_size,
        )
        .map_err(|e| VuError::ReqHandlerError(std::io::Error::other(e)))?;
        self.inflight = Some(area);
        Ok(())
    }

    fn get_max_mem_slots(&mut self) -> VuResult<u64> {
        unsupported("CONFIGURE_MEM_SLOTS is not offered")
    }

    fn add_mem_region(
        &mut self,
        _region: &VhostUserSingleMemoryRegion,
        _fd: File,
        _postcopy_listening: Option<bool>,
    ) -> VuResult<Option<VhostUserMemoryRegionBase>> {
        unsupported("CONFIGURE_MEM_SLOTS is not offered")
    }

    fn remove_mem_region(&mut self, _region: &VhostUserSingleMemoryRegion) -> VuResult<()> {
        unsupported("CONFIGURE_MEM_SLOTS is not offered")
    }

    fn set_device_state_fd(
        &mut self,
        _direction: VhostTransferStateDirection,
        _phase: VhostTransferStatePhase,
        _fd: File,
    ) -> VuResult<Option<File>> {
        unsupported("no device state to migrate: the volume is shared storage")
    }

    fn check_device_state(&mut self) -> VuResult<()> {
        unsupported("no device state to migrate")
    }

    fn get_shmem_config(&mut self) -> VuResult<VhostUserShMemConfig> {
        unsupported("no shared memory regions")
    }

    /// The log area of a migration (the `vhost` crate checked LOG_SHMFD
    /// was acked, took the descriptor, and sends the reply the frontend
    /// waits for once this returns). It must cover the memory table and
    /// the used rings logged; it replaces the previous area.
    fn set_log_base(&mut self, log: &VhostUserLog, file: File) -> VuResult<()> {
        self.check_log_covers(log.mmap_size, &self.regions())
            .map_err(refused)?;
        let area = LogArea::map(file, log.mmap_offset, log.mmap_size).map_err(refused)?;
        tracing::info!(volume = %self.name, size_bytes = log.mmap_size, "vhost-user dirty log set");
        self.dirty_log.set_area(area);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::io;
    use std::os::fd::FromRawFd;

    use super::*;
    use crate::execute::budget;
    use crate::metrics::VhostMetrics;

    struct NullDevice;

    impl BlockDevice for NullDevice {
        fn size_bytes(&self) -> u64 {
            1 << 20
        }

        fn is_read_only(&self) -> bool {
            false
        }

        fn id(&self) -> String {
            "null".to_string()
        }

        async fn read(&self, _offset_bytes: u64, _buf: &mut [u8]) -> io::Result<()> {
            Ok(())
        }

        async fn write(&self, _offset_bytes: u64, _data: &[u8]) -> io::Result<()> {
            Ok(())
        }

        async fn flush(&self) -> io::Result<()> {
            Ok(())
        }

        async fn discard(&self, _offset_bytes: u64, _length_bytes: u64) -> io::Result<()> {
            Ok(())
        }

        async fn write_zeroes(&self, _offset: u64, _length: u64, _unmap: bool) -> io::Result<()> {
            Ok(())
        }
    }

    fn memfd(bytes: u64) -> File {
        // SAFETY: memfd_create takes a NUL-terminated name and flags; the
        // descriptor it returns is owned by the File alone.
        let fd = unsafe { libc::memfd_create(c"backend-test".as_ptr(), libc::MFD_CLOEXEC) };
        assert!(fd >= 0);
        // SAFETY: fd was just created and nothing else owns it.
        let file = unsafe { File::from_raw_fd(fd) };
        file.set_len(bytes).unwrap();
        file
    }

    /// Where the "frontend" mapped guest address 0.
    const USER_BASE: u64 = 0x7f00_0000_0000;
    const MIB: u64 = 1 << 20;

    fn backend(runtime: &tokio::runtime::Runtime) -> BlkBackend<NullDevice> {
        let config = DeviceConfig {
            num_queues: 1,
            limits: Limits::new(16, 1 << 20),
        };
        let metrics = VhostMetrics::default().device("vol");
        BlkBackend::new(
            "vol",
            Arc::new(NullDevice),
            config,
            (budget(1 << 20, 1 << 20), metrics),
            runtime.handle().clone(),
        )
    }

    fn set_memory(b: &mut BlkBackend<NullDevice>, bytes: u64) -> VuResult<()> {
        let region = VhostUserMemoryRegion::new(0, bytes, USER_BASE, 0);
        b.set_mem_table(&[region], vec![memfd(bytes)], None)
            .map(|_| ())
    }

    fn error_of<T>(r: VuResult<T>) -> String {
        match r {
            Ok(_) => panic!("accepted"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn migration_features_are_offered() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let mut b = backend(&runtime);
        assert_ne!(b.get_features().unwrap() & (1 << 26), 0, "VHOST_F_LOG_ALL");
        assert!(b
            .get_protocol_features()
            .unwrap()
            .contains(VhostUserProtocolFeatures::LOG_SHMFD));
    }

    #[test]
    fn a_log_that_does_not_cover_guest_memory_is_refused_with_the_size_needed() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let mut b = backend(&runtime);
        // 1 MiB of guest memory: 256 pages, 32 bytes of log.
        set_memory(&mut b, MIB).unwrap();
        b.set_features(b.offered_features()).unwrap();
        let e = error_of(b.set_log_base(&VhostUserLog::new(31, 0), memfd(31)));
        assert!(e.contains("at least 32 bytes"), "{e}");
        assert!(e.contains("guest memory region at 0x0"), "{e}");
        assert_eq!(b.dirty_log.area_bytes(), None);
        // A file shorter than the log it is said to hold.
        let e = error_of(b.set_log_base(&VhostUserLog::new(64, 0), memfd(32)));
        assert!(e.contains("file of 32 bytes"), "{e}");
        b.set_log_base(&VhostUserLog::new(32, 0), memfd(32))
            .unwrap();
        assert_eq!(b.dirty_log.area_bytes(), Some(32));

        // The table cannot outgrow the log being filled.
        let e = error_of(set_memory(&mut b, 2 * MIB));
        assert!(e.contains("at least 64 bytes"), "{e}");
        assert_eq!(b.regions(), vec![(0, MIB)], "the old table stays");
        // A used ring logged past the log's end.
        b.set_vring_num(0, 16).unwrap();
        let log_flag = || VhostUserVringAddrFlags::VHOST_VRING_F_LOG;
        let (desc, avail, used) = (USER_BASE, USER_BASE + 0x1000, USER_BASE + 0x2000);
        let e = error_of(b.set_vring_addr(0, log_flag(), desc, used, avail, MIB));
        assert!(e.contains("used ring of queue 0"), "{e}");
        b.set_vring_addr(0, log_flag(), desc, used, avail, 0x2000)
            .unwrap();
        assert_eq!(b.vrings[0].used_log.get(), Some(0x2000));
        // A larger log replaces it, and the larger table then fits.
        b.set_log_base(&VhostUserLog::new(64, 0), memfd(64))
            .unwrap();
        set_memory(&mut b, 2 * MIB).unwrap();
        // Logging off ends the period: the area goes, the table is free.
        b.set_features(b.offered_features() & !LOG_ALL_BIT).unwrap();
        assert_eq!(b.dirty_log.area_bytes(), None);
        set_memory(&mut b, 4 * MIB).unwrap();
        b.set_vring_addr(0, VhostUserVringAddrFlags::empty(), desc, used, avail, 0)
            .unwrap();
        assert_eq!(b.vrings[0].used_log.get(), None);
    }
}
