//! The CSI driver: what Kubernetes' sidecars and kubelet call to make,
//! snapshot, grow and delete volumes and to give a pod a block device or a
//! filesystem (`docs/design/csi.md`).
//!
//! Owns the three CSI services over a `strata_volume::Engine` (the engine
//! knows nothing of CSI): `identity.rs`, `controller.rs` and `node.rs`; how
//! CSI names map to volumes and snapshots (`ids.rs`), the StorageClass's
//! parameters (`parameters.rs`), the spec's error codes for the engine's
//! errors (`status.rs`) and the endpoint (`endpoint.rs`); on a node, the
//! volume's device (`attach.rs`: a FUSE file of this process,
//! `volume_file.rs`, on a loop device) and its filesystem (`mounts.rs`).
//! The types and services are generated from the spec's `csi.proto`
//! (`proto/`, `build.rs`).

mod attach;
mod capabilities;
mod capacity;
mod command;
mod controller;
mod driver_config;
mod endpoint;
mod fs_stats;
mod identity;
mod ids;
mod mounts;
mod node;
mod parameters;
pub mod proto;
mod server;
mod snapshot_names;
mod status;
mod volume_file;

pub use attach::{attach, Attached};
pub use driver_config::{DriverConfig, QosParser};
pub use endpoint::Endpoint;
pub use ids::DRIVER_NAME;
pub use server::{bind, Bound};
