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
    /// Where volumes are stored: a directory path, file:///path,
    /// s3://BUCKET[/PREFIX][?endpoint=URL&region=R&addressing=path|virtual&http=auto|1.1|2&payload=auto|signed|unsigned]
    /// (any S3-compatible service), or memory:// (gone at exit).
    /// Default: <data-dir>/store. S3 credentials come from
    /// AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, ~/.aws/credentials
    /// (AWS_PROFILE), web identity (AWS_WEB_IDENTITY_TOKEN_FILE,
    /// AWS_ROLE_ARN) or, on an EC2 instance (or at AWS_METADATA_ENDPOINT;
    /// AWS_EC2_METADATA_DISABLED=true never), the instance's role; never
    /// from arguments. AWS_ENDPOINT_URL (or AWS_ENDPOINT), AWS_REGION and
    /// AWS_CA_BUNDLE are read too.
    #[arg(long, global = true, env = "STRATA_STORE", value_name = "PATH_OR_URL")]
    pub store: Option<String>,

    /// Store requests in flight at once (all volumes).
    #[arg(long, global = true, default_value_t = 64, value_name = "N")]
    pub max_store_requests: usize,

    /// Attempts per store request before an error is returned (transient
    /// errors only: 5xx, throttling, timeouts, dropped connections), with
    /// exponential backoff and jitter.
    #[arg(long, global = true, default_value_t = 8, value_name = "N")]
    pub store_attempts: u32,

    /// Embedded store only: disk space (bytes, K/M/G suffixes) kept in
    /// files of deleted segments, which new segments overwrite instead of
    /// writing new files (on a VM, pages and blocks a file has never held
    /// cost several times more to write). 0 turns recycling off.
    /// Files unused for 10 s are unlinked, and all of them when the disk
    /// is full.
    #[arg(long, global = true, default_value = "1G", value_name = "SIZE")]
    pub recycle_size: String,

    /// Testing only: objects of at least this size are recycled (default
    /// 256KiB; the power-loss loop lowers it for its small segments).
    #[arg(
        long,
        global = true,
        default_value = "256KiB",
        value_name = "SIZE",
        hide = true
    )]
    pub recycle_min_size: String,

    /// Testing only: inject store faults, e.g.
    /// error_rate=0.05,latency_ms=20,jitter_ms=10,fail_nth=7,lost_reply_rate=0.01,seed=1;
    /// ignore_if_none_match=1, ignore_if_match=1 or ignore_conditions=1
    /// make conditional PUTs plain overwrites (a store that ignores them);
    /// partition_file=PATH fails every request while PATH exists (a
    /// network partition from the store, healed by removing the file).
    #[arg(long, global = true, env = "STRATA_FAULTS", value_name = "SPEC")]
    pub inject_faults: Option<String>,

    /// Local state: journals (and caches). Default:
    /// $XDG_DATA_HOME/strata or ~/.local/share/strata.
    #[arg(long, global = true, env = "STRATA_DATA_DIR", value_name = "DIR")]
    pub data_dir: Option<PathBuf>,

    /// Key of encrypted volumes: a file holding 64 hex digits that only its
    /// owner may read (mode 0600; `strata key generate FILE` makes one).
    /// The key may instead be given in STRATA_KEY (64 hex digits), never
    /// as an argument. Volumes created while a key is given are encrypted
    /// (AES-256-GCM); opening one needs the same key.
    #[arg(long, global = true, env = "STRATA_KEY_FILE", value_name = "FILE")]
    pub key_file: Option<PathBuf>,

    /// Log lines on stderr: `text` for people, `json` (one object per line:
    /// timestamp, level, target, message and fields such as volume and
    /// object) for log shippers. STRATA_LOG sets the levels (default:
    /// info for `serve`; warn for other commands, whose store retries are
    /// counted in their final error instead: STRATA_LOG=info shows them).
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text, env = "STRATA_LOG_FORMAT")]
    pub log_format: LogFormat,

    /// Serve and write volumes even on a store that does not enforce
    /// conditional writes (If-None-Match / If-Match on PUT; `strata store
    /// check` tells). Then nothing protects a volume against a second
    /// writer: two hosts could serve it at once and corrupt it. Only for a
    /// store that one host will ever use. A warning is logged at start.
    #[arg(
        long,
        global = true,
        env = "STRATA_UNSAFE_SINGLE_HOST",
        value_parser = clap::builder::FalseyValueParser::new()
    )]
    pub unsafe_single_host: bool,

    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Create, list, inspect and delete volumes.
    #[command(subcommand)]
    Volume(VolumeCommand),
    /// Snapshots: a volume as it was at one moment, kept until deleted,
    /// served read-only as export VOL@NAME. Taken in constant time (no
    /// data is copied); garbage collection keeps what they need.
    #[command(subcommand)]
    Snapshot(SnapshotCommand),
    /// Serve every volume of the store over NBD (export name = volume name).
    Serve(Box<ServeArgs>),
    /// Check a volume, a snapshot (VOLUME@SNAPSHOT) or a clone as the
    /// store holds it: manifest, checkpoints, snapshot deltas, clone
    /// markers and every segment its maps read.
    ///
    /// Verifies checksums (segment headers and tables, every frame and
    /// 4 KiB chunk of data; authentication too for an encrypted volume,
    /// whose key it needs), that every map extent lies inside its
    /// segment's data and in the write that put it there, and the space
    /// accounting (live bytes each checkpoint records against its
    /// extents; stored objects nothing references are leaks: warnings).
    /// Each problem names the object and what it affects: byte ranges of
    /// the volume and of each snapshot, and the clones that read them.
    ///
    /// Safe while a server serves the volume: it only reads (no lease, no
    /// writes, no deletions), and an object garbage collection deletes
    /// meanwhile is not reported once the manifest, read again, no longer
    /// needs it.
    ///
    /// Exit status: 0 no error found (warnings may be printed); 1 errors
    /// found; 2 the check could not run (no such volume or snapshot, a
    /// missing or wrong key, the store failing, a bad argument).
    Fsck(FsckArgs),
    /// Keys for encrypted volumes.
    #[command(subcommand)]
    Key(KeyCommand),
    /// The store itself: whether strata can safely use it.
    #[command(subcommand)]
    Store(StoreCommand),
    /// The Kubernetes CSI driver: `strata serve` with the CSI endpoint
    /// beside it. The Controller service makes, snapshots, clones, grows
    /// and deletes volumes (the provisioner's, snapshotter's and
    /// resizer's calls); the Node service gives pods a block device or a
    /// filesystem (kubelet's). Volumes open when a node stages them, not
    /// at start. See docs/design/csi.md and deploy/kubernetes/.
    Csi(Box<CsiArgs>),
}

#[derive(Debug, Args)]
pub struct CsiArgs {
    /// Where the sidecars and kubelet connect: unix:///PATH (e.g.
    /// unix:///csi/csi.sock).
    #[arg(long, value_name = "unix:///PATH")]
    pub endpoint: String,

    /// This node's name, as Kubernetes knows it (the pod's
    /// spec.nodeName): the topology of volumes on a local store.
    #[arg(long, value_name = "ID")]
    pub node_id: String,

    /// Serve the Controller service (the controller Deployment's pod).
    /// Without --controller and --node: both.
    #[arg(long)]
    pub controller: bool,

    /// Serve the Node service (the node DaemonSet's pods). Without
    /// --controller and --node: both.
    #[arg(long)]
    pub node: bool,

    /// The filesystem made on a mount volume whose capability (the
    /// PersistentVolume's fsType) names none.
    #[arg(long, default_value = "ext4", value_parser = ["ext4", "xfs"], value_name = "FS")]
    pub default_fs_type: String,

    #[command(flatten)]
    pub serve: ServeArgs,
}

#[derive(Debug, Subcommand)]
pub enum StoreCommand {
    /// Probe whether the store enforces the conditional writes that the
    /// lease, fencing and GC rely on (If-None-Match and If-Match on PUT):
    /// writes and deletes two objects under .strata-probe/, prints what
    /// was verified, and records the verdict in .strata-store-check (which
    /// `strata serve` reads instead of probing). Exits non-zero if the
    /// store lacks either. Commands that write volumes probe a store on
    /// first use by themselves; run this after the store was upgraded.
    Check {
        /// The store (as --store; default: --store, STRATA_STORE or
        /// <data-dir>/store).
        #[arg(value_name = "PATH_OR_URL")]
        url: Option<String>,
        /// Print the recorded verdict as JSON.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Args)]
pub struct FsckArgs {
    /// VOLUME or VOLUME@SNAPSHOT.
    pub target: String,
    /// Read segment headers and tables only (a small ranged GET or two
    /// per segment), not their data: finds missing, truncated and
    /// mismatched segments, damaged headers, tables and maps, and maps
    /// pointing past a segment's end, but not damaged data.
    #[arg(long)]
    pub quick: bool,
    /// Print one JSON document on stdout: what was checked, counts, space,
    /// and each problem with what it affects.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Subcommand)]
pub enum KeyCommand {
    /// Write a new random key to FILE (created with mode 0600; an existing
    /// file is never overwritten) and print its fingerprint. Keep a copy
    /// somewhere safe: without it, volumes encrypted under it cannot be
    /// read by anyone.
    Generate { file: PathBuf },
    /// Print the fingerprint of the key given by --key-file or STRATA_KEY
    /// (`strata volume info` shows the fingerprint a volume wants).
    Fingerprint,
}

#[derive(Debug, Subcommand)]
pub enum VolumeCommand {
    /// Create an empty volume. With a key (--key-file or STRATA_KEY), the
    /// volume is encrypted under it.
    Create {
        /// Volume name: letters, digits, '.', '_', '-' (at most 64).
        name: String,
        /// Size, e.g. 10GiB, 512M, 1T (K/M/G/T are powers of 1024).
        #[arg(long)]
        size: String,
        /// How data is compressed in the store, per 4 KiB chunk: lz4
        /// (fast), zstd or zstd:LEVEL (1-19; smaller, slower), none. Data
        /// that does not shrink is stored as it is; all-zero writes are
        /// never stored. Changeable later (`volume set-compression`).
        #[arg(long, default_value = "lz4", value_name = "CODEC")]
        compression: String,
        /// Limits its clients are served within (kept in the volume: any
        /// server applies them): iops, read-iops, write-iops (requests a
        /// second), bw, read-bw, write-bw (bytes a second, e.g. 50MiB),
        /// each with an optional KEY-burst (default one second's worth),
        /// e.g. iops=3000,iops-burst=9000,bw=125MiB. Requests over a limit
        /// wait; none fails. Changeable live (`volume set-qos`).
        #[arg(long, value_name = "SPEC")]
        qos: Option<String>,
    },
    /// Change a volume's QoS limits, live: through the server on this
    /// host if it serves the volume (requests already waiting get the new
    /// limits within 100 ms), kept in the volume's manifest.
    SetQos {
        name: String,
        /// iops, read-iops, write-iops (requests a second), bw, read-bw,
        /// write-bw (bytes a second, e.g. 50MiB), each with an optional
        /// KEY-burst, comma-separated; `none` removes every limit.
        spec: String,
    },
    /// Change how a volume's new data is compressed (lz4, zstd[:LEVEL],
    /// none); what is stored keeps its compression until GC rewrites it.
    /// Through the server on this host if it serves the volume.
    SetCompression {
        name: String,
        /// lz4, zstd, zstd:LEVEL (1-19) or none.
        compression: String,
    },
    /// Change the key of an encrypted volume: its data key is wrapped
    /// again under the new key, in one manifest write (no data is
    /// rewritten). The current key comes from --key-file or STRATA_KEY.
    /// Through the server on this host if it serves the volume.
    Rekey {
        name: String,
        /// The new key's file (mode 0600; `strata key generate`).
        #[arg(long, value_name = "FILE")]
        new_key_file: PathBuf,
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
    /// Delete a volume and everything it stored. Not undoable. Refused
    /// while clones of its snapshots exist.
    Delete { name: String },
    /// Write a volume or a snapshot as a raw image to FILE ('-': standard
    /// output). Only allocated ranges are read; holes stay holes in a file.
    /// A volume a server serves cannot be exported itself: export a
    /// snapshot of it (`strata snapshot create` first).
    Export {
        /// VOLUME or VOLUME@SNAPSHOT
        source: String,
        file: PathBuf,
    },
    /// Read a raw image from FILE ('-': standard input) into VOLUME,
    /// created with the image's size if it does not exist. All-zero
    /// chunks are not stored.
    Import {
        file: PathBuf,
        volume: String,
        /// The image's size (needed for '-' when VOLUME does not exist;
        /// default: the file's size, rounded up to 512 bytes).
        #[arg(long)]
        size: Option<String>,
    },
    /// Make a clone independent of its parent: copy what it still reads
    /// from the parent's snapshot into its own segments (clients may keep
    /// writing meanwhile), then drop the link, so the snapshot can be
    /// deleted. Through the server on this host if it serves the clone.
    Flatten { name: String },
    /// Change a volume's size. Growing works while the volume is served
    /// (the server on this host does it; new connections see the new
    /// size). Shrinking drops everything past the new end, so it needs
    /// --allow-shrink; the cut range's space is reclaimed by GC.
    Resize {
        name: String,
        /// The new size, e.g. 20GiB.
        #[arg(long)]
        size: String,
        /// Allow a smaller size.
        #[arg(long)]
        allow_shrink: bool,
    },
    /// List the ranges that changed from one snapshot of a volume to a
    /// later one: new data, and ranges that became zeros. Exact (a garbage
    /// collection pass that only moved data changes nothing) and quick
    /// (it compares the two maps; no data is read).
    Diff {
        /// VOLUME@OLDER
        from: String,
        /// VOLUME@NEWER
        to: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Write what changed from one snapshot to a later one into FILE ('-':
    /// standard output), for `import-diff` on another volume (a nightly
    /// incremental backup). The format is versioned and checksummed
    /// (docs/design/snapshots.md).
    ExportDiff {
        /// VOLUME@OLDER
        from: String,
        /// VOLUME@NEWER
        to: String,
        file: PathBuf,
    },
    /// Apply a diff file to VOLUME, which must have the diff's older
    /// snapshot and not its newer one; the newer snapshot is then taken
    /// there. The whole file is verified before anything is written.
    /// Refused while a server serves the volume.
    ImportDiff {
        file: PathBuf,
        /// The volume to apply it to.
        volume: String,
    },
    /// Make a writable clone of a snapshot, in constant time: the new
    /// volume starts as the snapshot and shares its data (nothing is
    /// copied); its writes are its own. Clones of clones nest up to 16
    /// deep. The snapshot cannot be deleted while the clone exists.
    Clone {
        /// PARENT@SNAPSHOT
        source: String,
        /// The new volume's name.
        name: String,
        /// The parent's prefix in the same S3 bucket, when it lives under
        /// another prefix than --store's (e.g. `images` for
        /// s3://bucket/images/PARENT).
        #[arg(long, value_name = "PREFIX")]
        parent_prefix: Option<String>,
    },
    /// Ask the server holding a volume to let go of it: it uploads what its
    /// journal holds, writes a checkpoint and releases the lease, so the
    /// next server to open the volume (any host) takes it at once. The
    /// request goes to the holder's control socket when it runs on this
    /// machine, otherwise through its host record in the store (answered
    /// at its next liveness renewal, within a third of --lease-ttl-ms).
    /// The holder does not take the volume back for 30 s. When a server
    /// runs on this --data-dir, it takes the volume itself (its standby of
    /// it, a live migration's destination, switches over: the holder then
    /// writes the lease over to this host rather than releasing it).
    /// Prints who held it and how long the handover took.
    Handover {
        /// The volume.
        name: String,
        /// Give up waiting for the release after this long.
        #[arg(long, default_value_t = 120_000, value_name = "MS")]
        timeout_ms: u64,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Reclaim space now: rewrite partly-dead segments and delete what
    /// nothing references. Asks the server on this host that serves the
    /// volume (through <data-dir>/control.sock); when nobody serves it,
    /// runs the pass itself, holding the volume's lease meanwhile. Prints
    /// what it reclaimed. Servers also collect garbage in the background.
    Gc {
        /// The volume.
        name: String,
        /// Wait until the objects the pass makes unreferenced are deleted
        /// (after the grace period, --gc-grace-ms of the server; 30 s by
        /// default). Without it, they are deleted later in the background.
        #[arg(long)]
        wait: bool,
        /// Grace period when this command runs the pass itself.
        #[arg(long, default_value_t = 30_000, value_name = "MS")]
        gc_grace_ms: u64,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Subcommand)]
pub enum SnapshotCommand {
    /// Take a snapshot of every write acknowledged so far. On a volume
    /// served by the strata server on this host, that server takes it
    /// (through <data-dir>/control.sock) without stopping its clients; a
    /// volume nobody serves is opened here for the moment it takes.
    Create {
        /// VOLUME@SNAPSHOT; snapshot names are letters, digits, '.', '_',
        /// '-' (at most 64).
        target: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// List a volume's snapshots, oldest first.
    List {
        volume: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Delete a snapshot. The space only it kept is reclaimed by the next
    /// garbage collection passes.
    Delete {
        /// VOLUME@SNAPSHOT
        target: String,
    },
    /// Make a volume what it was when the snapshot was taken, dropping
    /// every write since (the snapshot stays). Refused while any server
    /// serves the volume: stop serving it first.
    Rollback {
        /// VOLUME@SNAPSHOT
        target: String,
    },
    /// Show the snapshot's access profile: the ranges the first clone of
    /// it read first (a VM's first boot), in order, which later clones
    /// fetch before their guest asks (`serve --profile-record`,
    /// `--profile-prefetch`).
    Profile {
        /// VOLUME@SNAPSHOT
        target: String,
        /// Print every range as JSON.
        #[arg(long)]
        json: bool,
    },
}

/// Garbage collection in the background of a server.
#[derive(Debug, Args)]
pub struct GcArgs {
    /// Background garbage collection: `on` rewrites segments that are
    /// mostly overwritten or trimmed and deletes what nothing references;
    /// `off` keeps every object (space is then never reclaimed, except by
    /// `strata volume gc`).
    #[arg(long, value_enum, default_value_t = OnOff::On)]
    pub gc: OnOff,

    /// An object nothing references is deleted this long after it became
    /// so: a margin for reads that looked it up just before (they also
    /// look again if they find it gone). Garbage made meanwhile stays.
    /// Default: 30000 on S3 (a GET may queue behind others and retries),
    /// 2000 on the embedded store (a read there is a `pread` that does not
    /// queue; deleted segment files are recycled sooner).
    #[arg(long, value_name = "MS")]
    pub gc_grace_ms: Option<u64>,

    /// Segments with less than this percentage of live data are rewritten.
    #[arg(long, default_value_t = 60, value_name = "PERCENT")]
    pub gc_live_threshold: u32,

    /// While stored segment bytes exceed this percentage of the live data,
    /// fuller segments are rewritten too (emptiest first).
    #[arg(long, default_value_t = 140, value_name = "PERCENT")]
    pub gc_space_target: u32,

    /// Copy bandwidth of garbage collection per volume, per second. It
    /// also only copies while the write buffer is at most half full, unless
    /// the store holds over (space target + 100)% of the live data.
    #[arg(long, default_value = "64MiB", value_name = "SIZE")]
    pub gc_rate: String,

    /// How often the background collector looks for work.
    #[arg(long, default_value_t = 2_000, value_name = "MS")]
    pub gc_interval_ms: u64,

    /// A large read that finds its data scattered over many segments
    /// (a volume written randomly, read sequentially: backups, image
    /// copies) writes what it read back contiguously, so the next read of
    /// that range is one run. Only while the write buffer is at most half
    /// full (the read never waits for it); the old copies become garbage
    /// for GC. Costs store writes (uploads on S3) the first time a
    /// fragmented range is read. Needs --gc on. `auto`: on for the
    /// embedded store; off for S3, where the rewrite is an upload and the
    /// local disk cache already serves such reads.
    #[arg(long, value_enum, default_value_t = OnOffAuto::Auto)]
    pub gc_rewrite_reads: OnOffAuto,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum OnOffAuto {
    On,
    Off,
    Auto,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum OnOff {
    On,
    Off,
}

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Where to listen: unix:/path.sock, or tcp:IP:PORT (the tcp: may be
    /// left out) (repeatable).
    /// Default: unix:<data-dir>/strata.sock. TCP is only as private as the
    /// address: keep 127.0.0.1 unless the network is trusted.
    #[arg(long, value_name = "ADDR")]
    pub listen: Vec<String>,

    /// Create volume NAME of SIZE first if it does not exist (repeatable),
    /// e.g. --create vm1=10GiB. Encrypted when a key is given (--key-file
    /// or STRATA_KEY).
    #[arg(long, value_name = "NAME=SIZE")]
    pub create: Vec<String>,

    /// Compression of the volumes --create makes: lz4, zstd[:LEVEL], none
    /// (existing volumes keep theirs: `strata volume set-compression`).
    #[arg(long, default_value = "lz4", value_name = "CODEC")]
    pub compression: String,

    /// Serve only this volume (repeatable). Each is opened at start, and
    /// the server exits with the reason if one cannot be (e.g. another
    /// server holds it). Default: every volume of the store, each opened
    /// in the background; on a store shared by several hosts, name the
    /// volumes this host serves.
    #[arg(long = "volume", value_name = "NAME")]
    pub volumes: Vec<String>,

    /// When FLUSH and FUA writes complete: `local` = in the journal on
    /// local disk (survives a crash or power loss of this host); `remote`
    /// = in the object store (survives loss of this host; each FLUSH
    /// uploads a segment, so FLUSH takes a store round trip).
    #[arg(long, value_enum, default_value_t = DurabilityArg::Local)]
    pub durability: DurabilityArg,

    /// A client of a volume another live server holds (the destination
    /// QEMU of a live migration connects before the switchover): `auto` =
    /// served as a standby (reads from the store; the holder uploads on
    /// every FLUSH meanwhile) whose first write asks the holder to hand the
    /// volume over and waits for it; `explicit` = a standby whose writes
    /// wait for `strata volume handover NAME` run on this host (at QEMU's
    /// pre-switchover pause); `off` = refused, naming the holder.
    #[arg(long, value_enum, default_value_t = StandbyArg::Auto)]
    pub standby: StandbyArg,

    /// Longest a standby's write waits for its volume (the holder's
    /// handover), then fails with an I/O error.
    #[arg(long, default_value_t = strata_volume::DEFAULT_STANDBY_WAIT_MS, value_name = "MS")]
    pub standby_wait_ms: u64,

    /// This host proves it is alive with one object in the store, renewed
    /// every third of this; its volumes may be taken over by another server
    /// once it has not renewed for this long (a volume's lease is written
    /// only when its holder changes). Writes stop here before then.
    #[arg(long, default_value_t = 30_000, value_name = "MS")]
    pub lease_ttl_ms: u64,

    /// Write counters (store requests, caches, volumes) as JSON to this
    /// file every --stats-interval-ms and at exit.
    #[arg(long, value_name = "PATH")]
    pub stats_file: Option<PathBuf>,

    /// How often counters are written to --stats-file and logged.
    #[arg(long, default_value_t = 10_000, value_name = "MS")]
    pub stats_interval_ms: u64,

    /// Serve Prometheus metrics at http://ADDR/metrics (IP:PORT, e.g.
    /// 127.0.0.1:9187; port 0 picks a free one, printed at start). Plain
    /// HTTP without authentication: keep it on a private address.
    #[arg(long, value_name = "ADDR")]
    pub metrics_listen: Option<String>,

    #[command(flatten)]
    pub budgets: Budgets,

    #[command(flatten)]
    pub gc: GcArgs,

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

    #[command(flatten)]
    pub tls: TlsArgs,

    #[command(flatten)]
    pub vhost: VhostArgs,

    /// Also attach every served volume as a block device of this host,
    /// where the kernel has no `nbd` module: the volume as the file
    /// DIR/VOLUME/disk on a FUSE mount of this server, set up as a loop
    /// device with direct I/O (needs root, /dev/fuse and loop devices).
    /// Prints `loop VOLUME /dev/loopN` for each before `ready`; detached
    /// at shutdown. Volumes opened later by clients get no device.
    #[arg(long, value_name = "DIR")]
    pub loop_dir: Option<PathBuf>,
}

/// vhost-user-blk: VMs attach volumes through shared memory (QEMU's
/// `vhost-user-blk-pci` with `-chardev socket,path=SOCKET,reconnect=1`
/// and guest memory shared: `-object memory-backend-memfd,share=on`).
#[derive(Debug, Clone, clap::Args)]
pub struct VhostArgs {
    /// Also serve every served volume over vhost-user-blk, on the socket
    /// DIR/VOLUME.sock (DIR is created). Volumes created later get no
    /// socket until the next start.
    #[arg(long, value_name = "DIR")]
    pub vhost_user_dir: Option<PathBuf>,

    /// Serve EXPORT (a volume, or VOLUME@SNAPSHOT read-only) over
    /// vhost-user-blk on the socket PATH. Repeatable.
    #[arg(long, value_name = "EXPORT=PATH")]
    pub vhost_user_socket: Vec<String>,

    /// Queues offered to each vhost-user-blk frontend (QEMU's num-queues
    /// must not exceed it; by default QEMU asks one per vCPU).
    #[arg(long, default_value_t = 16, value_name = "N")]
    pub vhost_user_queues: u16,
}

/// NBD over TLS (the protocol's STARTTLS; clients use `nbds://` and
/// `nbds+unix://` URIs, or QEMU's `tls-creds-x509` object).
#[derive(Debug, Args)]
pub struct TlsArgs {
    /// `require`: clients must negotiate TLS before anything else (no
    /// export is listed or served in plaintext); `optional`: clients
    /// choose; `off`. Default: `require` when --tls-cert is given, else
    /// `off`.
    #[arg(long, value_enum, value_name = "MODE")]
    pub tls: Option<TlsModeArg>,

    /// The server's certificate chain, PEM (the server's own first).
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,

    /// The server's private key, PEM (PKCS#8, RSA or EC).
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,

    /// Require a client certificate issued by this CA (PEM); clients
    /// without one, or with one from another CA, are refused.
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    pub tls_ca: Option<PathBuf>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum TlsModeArg {
    Require,
    Optional,
    Off,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum DurabilityArg {
    Local,
    Remote,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum StandbyArg {
    Auto,
    Explicit,
    Off,
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
    /// wait beyond it. At least 2 segments + 32 MiB. A cap of each volume's
    /// use of --write-buffer-total.
    #[arg(long, default_value = "128MiB", value_name = "SIZE")]
    pub write_buffer: String,

    /// Memory for written data not yet in the store, all volumes of the
    /// server together (0: no server-wide limit). Shared fairly: a volume
    /// may always hold its share (the total divided by the volumes
    /// writing), and more while others leave room; one above its share
    /// waits, never one below it.
    #[arg(long, default_value = "512MiB", value_name = "SIZE")]
    pub write_buffer_total: String,

    /// Per-volume journal file size (local disk). At least write buffer + 64 MiB.
    #[arg(long, default_value = "256MiB", value_name = "SIZE")]
    pub journal_size: String,

    /// Testing only: released journal bytes written since the last FLUSH
    /// are punched out of the ring rather than synced from this much
    /// (default 8MiB, at most an eighth of the ring; the power-loss loop
    /// lowers it so its small writes are punched under the power cuts).
    #[arg(long, default_value = "8MiB", value_name = "SIZE", hide = true)]
    pub journal_punch_min_size: String,

    /// Testing only: on the embedded store, a FLUSH that finds this much
    /// written since the journal's last sync and not yet in a segment
    /// seals and uploads it rather than syncing those bytes in the journal
    /// (default 8MiB; 0 never does; the power-loss loop lowers it so its
    /// small writes take that path under the power cuts).
    #[arg(long, default_value = "8MiB", value_name = "SIZE", hide = true)]
    pub flush_seal_min_size: String,

    /// On the embedded store, writes of at least this size to a volume that
    /// neither compresses nor encrypts go straight into their segment's
    /// file, the journal recording where (default 64KiB; 0 never: every
    /// write's bytes go through the journal; the power-loss loop lowers it
    /// so its small writes take that path under the power cuts).
    #[arg(long, default_value = "64KiB", value_name = "SIZE", hide = true)]
    pub bulk_write_min_size: String,

    /// RAM cache for data read back from the store, shared by all volumes.
    #[arg(long, default_value = "256MiB", value_name = "SIZE")]
    pub cache_size: String,

    /// Local-disk cache of volume data, in <data-dir>/cache/blocks, shared
    /// by all volumes and kept across restarts: data written on this host
    /// stays readable from local disk after its upload, and data read twice
    /// from the store is kept. 0 disables it. `auto`: for remote stores 10%
    /// of the data dir's free space (1GiB to 256GiB; an existing cache
    /// keeps its size), 0 for the embedded store (its data is on local
    /// disk already).
    #[arg(long, default_value = "auto", value_name = "SIZE")]
    pub disk_cache_size: String,

    /// Largest read-ahead window of a reader whose reads follow each other
    /// (sequential, or skipping ahead at most 1 MiB: the files of a
    /// directory); 0 disables.
    /// `auto`: 8MiB for remote stores, 0 for the embedded store.
    #[arg(long, default_value = "auto", value_name = "SIZE")]
    pub readahead: String,

    /// Segment uploads in flight per volume.
    #[arg(long, default_value_t = 4, value_name = "N")]
    pub parallel_uploads: usize,

    /// Segment uploads in flight, all volumes of the server together (0:
    /// no server-wide limit). Shared fairly: a volume may always have its
    /// share in flight (this over the volumes uploading), more while the
    /// total has room; --parallel-uploads caps each volume.
    #[arg(long, default_value_t = 32, value_name = "N")]
    pub parallel_uploads_total: usize,

    /// Fetch a volume's data from the store into the disk cache in the
    /// background, in large GETs, until the volume is local (progress in
    /// `strata volume info` and /metrics; a log line when done). Clients'
    /// reads go first; hydration fills free cache space only, never
    /// evicting, so a volume larger than the disk cache keeps what clients
    /// use. `auto`: clones, and volumes opened on a host that did not
    /// write them (no journal of theirs in this data dir). Needs a disk
    /// cache and a remote store.
    #[arg(long, value_enum, default_value_t = OnOffAuto::Auto)]
    pub hydrate: OnOffAuto,

    /// Bandwidth of hydration, server-wide, per second (e.g. 100MiB);
    /// 0 = no limit (it still takes at most 8 of the store's request
    /// slots).
    #[arg(long, default_value = "0", value_name = "SIZE")]
    pub hydrate_rate: String,

    /// A client's read GET (up to 1 MiB) that takes longer than the
    /// store's recent 95th percentile (and twice its median) is sent a
    /// second time; the first answer wins and the other is cancelled. At
    /// most one GET in 20 is hedged.
    #[arg(long, value_enum, default_value_t = OnOff::On)]
    pub hedge_reads: OnOff,

    /// Record what a clone reads first (its first 5 minutes of reads, up
    /// to 65,532 ranges: a VM's first boot, whatever its size) when its
    /// snapshot has no access profile yet, and store it beside the
    /// snapshot (an encrypted volume's sealed with its data key).
    #[arg(long, value_enum, default_value_t = OnOff::On)]
    pub profile_record: OnOff,

    /// When a clone opens and its snapshot has an access profile, fetch
    /// the profile's ranges into the disk cache at once, in the order
    /// they were first read, before the guest asks (then hydrate the rest
    /// if --hydrate says so).
    #[arg(long, value_enum, default_value_t = OnOff::On)]
    pub profile_prefetch: OnOff,
}
