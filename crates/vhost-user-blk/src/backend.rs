//! The vhost-user protocol state of one frontend connection: the features
//! agreed, the guest's memory, each ring's setup, the inflight area, and
//! the queue workers started from them (the `vhost` crate reads and
//! answers the messages; this decides what they mean).
//!
//! A ring starts when it has a size, addresses, a kick descriptor and is
//! enabled, and stops at VHOST_USER_GET_VRING_BASE, on disable, reset or
//! disconnect: its worker returns every request it took before the ring
//! is reported stopped.

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
use crate::error_log::ErrorLog;
use crate::inflight::{create_area, InflightArea, MAX_QUEUE_SIZE};
use crate::metrics::DeviceMetrics;
use crate::queue_worker::{self, QueueSetup, Shared, Worker};

/// VHOST_USER_F_PROTOCOL_FEATURES: rings start disabled, and protocol
/// features are negotiated.
const PROTOCOL_FEATURES_BIT: u64 = 1 << 30;
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
            shared: None,
        }
    }

    fn offered_features(&self) -> u64 {
        let bit = |b: u32| 1u64 << b;
        let mut f = bit(VIRTIO_F_VERSION_1)
            | bit(VIRTIO_RING_F_INDIRECT_DESC)
            | bit(VIRTIO_RING_F_EVENT_IDX)
            | PROTOCOL_FEATURES_BIT
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
        self.shared = None;
    }
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
        self.acked_features = features;
        Ok(())
    }

    fn set_mem_table(
        &mut self,
        ctx: &[VhostUserMemoryRegion],
        files: Vec<File>,
        _postcopy_listening: Option<bool>,
    ) -> VuResult<Option<Vec<VhostUserMemoryRegionBase>>> {
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

    fn set_vring_addr(
        &mut self,
        index: u32,
        _flags: VhostUserVringAddrFlags,
        descriptor: u64,
        used: u64,
        available: u64,
        _log: u64,
    ) -> VuResult<()> {
        let addrs = (
            self.to_guest(descriptor)?,
            self.to_guest(available)?,
            self.to_guest(used)?,
        );
        self.vring(index)?.addrs = Some(addrs);
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
        v.kick = None;
        v.enabled = false;
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
            | VhostUserProtocolFeatures::BACKEND_REQ)
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

    fn set_log_base(&mut self, _log: &VhostUserLog, _file: File) -> VuResult<()> {
        unsupported("dirty logging (LOG_SHMFD) is not offered")
    }
}
