//! What `strata csi` runs: the endpoint, the node, which services, and
//! the settings the services share.

use std::path::PathBuf;

use strata_volume::QosLimits;

use crate::endpoint::Endpoint;

/// Parses a QoS spec as the CLI does (`iops=3000,bw=125MiB`): the binary's
/// parser, so the StorageClass parameter and `--qos` accept the same text.
pub type QosParser = fn(&str) -> Result<QosLimits, String>;

/// What `strata csi` runs.
pub struct DriverConfig {
    /// Where the sidecars and kubelet connect.
    pub endpoint: Endpoint,
    /// This node's name (kubelet's `--hostname-override` or the node name).
    pub node_id: String,
    /// Serve the Controller service (the provisioner's, snapshotter's and
    /// resizer's side).
    pub controller: bool,
    /// Serve the Node service (kubelet's side).
    pub node: bool,
    /// Whether the store is this host's own directory: its volumes are
    /// reachable on this node only (topology), and its free space is the
    /// capacity.
    pub local_store: Option<PathBuf>,
    /// The StorageClass `qos` parameter's parser.
    pub parse_qos: QosParser,
    /// The filesystem made on a mount volume whose capability names none
    /// (`ext4` or `xfs`).
    pub default_fs_type: String,
}
