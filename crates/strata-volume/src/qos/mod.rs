//! Per-volume quality of service: the limits a volume is served within
//! (IOPS and bandwidth, for reads, writes and both, each with a burst),
//! kept in its manifest (`QosLimits`), and the token buckets that hold a
//! client's requests back to them (`VolumeQos`).
//!
//! Limits delay requests, never fail them. The NBD server asks before it
//! reads a request's payload or takes any shared budget
//! (`nbd_server::BlockDevice::admit`), so a throttled client holds nothing
//! another volume needs; FLUSH is never held back.

mod qos_limits;
mod token_bucket;
mod volume_qos;

pub use qos_limits::{Limit, QosLimits, QOS_KEYS};
pub use volume_qos::{QosKind, QosStats, VolumeQos};
