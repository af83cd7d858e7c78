//! Command-line interface: what the user can type, with `--help` text.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

/// strata: log-structured virtual disks on object storage, served over NBD.
///
/// Volumes live in a store (a local directory by default); writes land in a
/// local journal first (durable at once) and reach the store as immutable
/// segments. Serve them to QEMU, nbdinfo, nbdcopy, fio or nbd-client.
#[derive(Debug, Parser)]
#[command(name = "strata", version, propagate_version = true)]
pub struct Cli {
    /// Where volumes are stored: a directory path, file:///path, or
    /// memory:// (gone at exit). Default: <data-dir>/store.
    #[arg(long, global = true, env = "STRATA_STORE", value_name = "PATH_OR_URL")]
    pub store: Option<String>,

    /// Local state: journals (and caches). Default:
    /// $XDG_DATA_HOME/strata or ~/.local/share/strata.
    #[arg(long, global = true, env = "STRATA_DATA_DIR", value_name = "DIR")]
    pub data_dir: Option<PathBuf>,

    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Create, list, inspect and delete volumes.
    #[command(subcommand)]
    Volume(VolumeCommand),
    /// Serve every volume of the store over NBD (export name = volume name).
    Serve(ServeArgs),
}

#[derive(Debug, Subcommand)]
pub enum VolumeCommand {
    /// Create an empty volume.
    Create {
        /// Volume name: letters, digits, '.', '_', '-' (at most 64).
        name: String,
        /// Size, e.g. 10GiB, 512M, 1T (K/M/G/T are powers of 1024).
        #[arg(long)]
        size: String,
    },
    /// List volumes.
    List {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Show one volume.
    Info {
        name: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Delete a volume and everything it stored. Not undoable.
    Delete { name: String },
}

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Where to listen: unix:/path.sock or tcp:IP:PORT (repeatable).
    /// Default: unix:<data-dir>/strata.sock. TCP is only as private as the
    /// address: keep 127.0.0.1 unless the network is trusted.
    #[arg(long, value_name = "ADDR")]
    pub listen: Vec<String>,

    /// Create volume NAME of SIZE first if it does not exist (repeatable),
    /// e.g. --create vm1=10GiB.
    #[arg(long, value_name = "NAME=SIZE")]
    pub create: Vec<String>,

    #[command(flatten)]
    pub budgets: Budgets,

    /// Requests in flight per connection before the server stops reading.
    #[arg(long, default_value_t = 128, value_name = "N")]
    pub max_in_flight: usize,

    /// READ/WRITE data in flight across all connections; clients wait
    /// (the server stops reading) beyond it. At least 32 MiB.
    #[arg(long, default_value = "256MiB", value_name = "SIZE")]
    pub max_in_flight_bytes: String,

    /// A client whose replies make no progress for this long is
    /// disconnected (its share of the in-flight budget is returned).
    #[arg(long, default_value_t = 60_000, value_name = "MS")]
    pub reply_stall_timeout_ms: u64,

    /// Connections served at once; more are closed at once (and logged).
    #[arg(long, default_value_t = 1024, value_name = "N")]
    pub max_connections: usize,
}

/// Memory and disk budgets of the engine. Sizes stay strings until the
/// command parses them, so a bad one gets strata's one-line error.
#[derive(Debug, Args)]
pub struct Budgets {
    /// Segment size: data is uploaded in objects of about this size.
    #[arg(long, default_value = "16MiB", value_name = "SIZE")]
    pub segment_size: String,

    /// Seal a segment that is this old even if not full, in milliseconds.
    #[arg(long, default_value_t = 5000, value_name = "MS")]
    pub segment_age_ms: u64,

    /// Per-volume memory for written data not yet in the store; writers
    /// wait beyond it. At least 2 segments + 32 MiB.
    #[arg(long, default_value = "128MiB", value_name = "SIZE")]
    pub write_buffer: String,

    /// Per-volume journal file size (local disk). At least write buffer + 64 MiB.
    #[arg(long, default_value = "256MiB", value_name = "SIZE")]
    pub journal_size: String,

    /// RAM cache for data read back from the store, shared by all volumes.
    #[arg(long, default_value = "256MiB", value_name = "SIZE")]
    pub cache_size: String,

    /// Segment uploads in flight per volume.
    #[arg(long, default_value_t = 4, value_name = "N")]
    pub parallel_uploads: usize,
}
