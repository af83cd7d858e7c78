//! vhost-user-blk backend: block devices served to VMs through shared
//! memory (QEMU's `vhost-user-blk-pci`, Cloud Hypervisor), one unix
//! socket per device.
//!
//! The data path, in files:
//! - `server.rs`: sockets, one frontend per socket, shutdown;
//! - `backend.rs`: the vhost-user protocol state of a connection (on the
//!   `vhost` crate's message handler);
//! - `queue_worker.rs`: one task per virtqueue taking and returning
//!   requests (on `virtio-queue`);
//! - `chain.rs` then `request.rs`: a descriptor chain walked and parsed
//!   into a checked request (every index, length, sector and address);
//! - `execute.rs`: the request run against the `BlockDevice`;
//! - `inflight.rs`: the shared area that lets a restarted backend resubmit
//!   what the previous one had taken;
//! - `dirty_log.rs`: the guest pages the backend writes, marked for the
//!   frontend while a live migration copies guest memory;
//! - `config_space.rs`: what the guest reads of the device.
//!
//! Like `nbd-server`, it knows nothing of strata's engine: the `strata`
//! binary adapts a volume to `BlockDevice`.

mod backend;
mod backend_channel;
pub mod chain;
pub mod config_space;
mod device;
mod dirty_log;
mod error_log;
pub mod execute;
#[doc(hidden)]
pub mod fuzzing;
pub mod inflight;
pub mod metrics;
mod queue_worker;
pub mod request;
mod server;

pub use device::{Admission, BlockDevice, DeviceProvider};
pub use metrics::{DeviceSnapshot, OpCounts, OpKind, VhostMetrics};
pub use server::{bind, Server, ServerConfig};
