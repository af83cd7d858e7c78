//! A SeaweedFS cluster on 127.0.0.1: master, three volume servers, a filer
//! and the S3 gateway, six processes.
//!
//! This module owns [`SeaweedCluster`]: starting the cluster (fresh ports,
//! a fresh directory, the gateway's credentials), waiting until the S3
//! gateway answers and every volume server has joined the master, killing
//! and restarting volume servers under a client, and the per-process shared
//! cluster ([`SeaweedCluster::shared`]) tests keep apart by bucket.
//!
//! Layout, as a small production cluster would be: every object's chunks
//! are written to two volume servers (replication `001`: a copy on another
//! server of the same rack), so one volume server can die and every object
//! stays readable. The S3 gateway stores through the filer, the filer its
//! metadata in its own leveldb; only the master (single, `-peers=none`) and
//! the filer are single points, as in SeaweedFS's own quick-start layouts.
//!
//! `master.toml` (read from the master's working directory) makes each new
//! bucket grow 2 volumes instead of SeaweedFS's default of 6, and volumes
//! are capped at 64 MiB: tests make many small buckets, and each bucket is
//! a SeaweedFS collection with volumes of its own.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use tempfile::TempDir;

use crate::keeper::Spawn;
use crate::node::{self, Node};
use crate::{s3, S3Impl, S3Service, ACCESS_KEY, SECRET_KEY};

/// Volume servers in the cluster.
pub const VOLUME_SERVERS: usize = 3;

/// Start attempts: a retry only follows a process finding its freshly
/// picked port taken by someone else in the meantime.
const START_ATTEMPTS: usize = 3;

/// Six processes that find each other through the master; a cold start on
/// a busy 2-core machine takes a few seconds.
const CLUSTER_HEALTHY_TIMEOUT: Duration = Duration::from_secs(120);

/// Ports: an HTTP and a gRPC port for each of the six processes.
const PORTS: usize = 2 * (3 + VOLUME_SERVERS);

/// Health endpoints (200 once the process serves).
const MASTER_HEALTH: &str = "/cluster/status";
const VOLUME_HEALTH: &str = "/status";
const FILER_HEALTH: &str = "/healthz";
const S3_HEALTH: &str = "/healthz";

/// Each new bucket (collection) grows 2 volumes, each on 2 servers.
/// No allocation deferral: a fresh test master has no veteran volume
/// servers to wait for (SeaweedFS's own advice for test setups).
const MASTER_TOML: &str = "\
# Written by strata-testkit: tests make many small buckets.
[master.volume_growth]
copy_1 = 2
copy_2 = 2
copy_3 = 1
copy_other = 1
allocation_deferral = \"0s\"
";

/// The bucket the readiness check writes to.
const READY_BUCKET: &str = "strata-testkit-ready";

/// A running SeaweedFS cluster; every process is killed when dropped.
pub struct SeaweedCluster {
    // Declared before `dir`: the processes die before their data is
    // removed. The gateway first, the master last.
    s3: Node,
    filer: Node,
    volumes: Vec<Node>,
    master: Node,
    /// `127.0.0.1:HTTP.GRPC` of each volume server, as the master lists it
    /// (the HTTP part).
    volume_addrs: Vec<String>,
    endpoint: String,
    dir: TempDir,
}

/// The per-process shared cluster, see [`SeaweedCluster::shared`].
static SHARED: OnceLock<SeaweedCluster> = OnceLock::new();

/// Ports of one start attempt.
struct Ports {
    master: (u16, u16),
    volumes: Vec<(u16, u16)>,
    filer: (u16, u16),
    s3: (u16, u16),
}

impl Ports {
    fn pick() -> Ports {
        let p = match node::free_ports(PORTS) {
            Ok(p) => p,
            Err(e) => panic!("finding free ports on 127.0.0.1: {e}"),
        };
        let pair = |i: usize| (p[2 * i], p[2 * i + 1]);
        Ports {
            master: pair(0),
            volumes: (0..VOLUME_SERVERS).map(|i| pair(1 + i)).collect(),
            filer: pair(1 + VOLUME_SERVERS),
            s3: pair(2 + VOLUME_SERVERS),
        }
    }
}

impl SeaweedCluster {
    /// Starts a private cluster and waits until its S3 gateway answers and
    /// all three volume servers have joined the master.
    ///
    /// # Panics
    /// When SeaweedFS is not installed, or the cluster is not ready within
    /// 120 s (the message carries the processes' log tails; their files are
    /// kept).
    pub fn start() -> SeaweedCluster {
        let bin = crate::seaweedfs_bin();
        for attempt in 1..=START_ATTEMPTS {
            let dir = match tempfile::Builder::new()
                .prefix("strata-seaweedfs-")
                .tempdir()
            {
                Ok(dir) => dir,
                Err(e) => panic!("creating a temporary directory for SeaweedFS: {e}"),
            };
            let started = Instant::now();
            match start_in(&bin, dir, Ports::pick()) {
                Ok(cluster) => {
                    eprintln!(
                        "strata-testkit: SeaweedFS cluster (S3 at {}) ready after {:.1?} (logs in {})",
                        cluster.endpoint,
                        started.elapsed(),
                        cluster.dir.path().display()
                    );
                    return cluster;
                }
                Err(failed) if attempt < START_ATTEMPTS && failed.port_taken => continue,
                Err(failed) => {
                    let kept = failed.dir.keep();
                    panic!(
                        "SeaweedFS cluster: {} (files and logs kept in {})\n{}",
                        failed.why,
                        kept.display(),
                        failed.tails
                    );
                }
            }
        }
        unreachable!("the last attempt panics or returns")
    }

    /// The cluster shared by every test of this process, started on first
    /// use. Tests isolate by bucket ([`SeaweedCluster::fresh_bucket`]). The
    /// cluster is killed and its data removed when the process exits.
    ///
    /// # Panics
    /// As [`SeaweedCluster::start`]; a later call tries to start it again.
    pub fn shared() -> &'static SeaweedCluster {
        SHARED.get_or_init(|| {
            let cluster = SeaweedCluster::start();
            // SAFETY: registering a plain extern "C" fn with no captures.
            if unsafe { libc::atexit(stop_shared) } != 0 {
                eprintln!(
                    "strata-testkit: atexit failed; {} will be left behind",
                    cluster.dir.path().display()
                );
            }
            cluster
        })
    }

    /// The directory holding every process's data and log
    /// (`master.log`, `volume1.log`.., `filer.log`, `s3.log`).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// SIGKILLs volume server `n` (1..=3) and reaps it. The master notices
    /// when its heartbeat stream breaks; writes to volumes that had a copy
    /// there fail until the master assigns writes elsewhere.
    ///
    /// # Panics
    /// When `n` is out of range.
    pub fn kill_volume_server(&self, n: usize) {
        self.volume(n).kill();
    }

    /// Starts the killed volume server `n` (1..=3) again on its ports and
    /// data, and waits until it serves and the master lists it again.
    ///
    /// # Panics
    /// When `n` is out of range or still running, or it is not back within
    /// 120 s.
    pub fn restart_volume_server(&self, n: usize) {
        let node = self.volume(n);
        if let Err(e) = node.restart() {
            panic!("restarting SeaweedFS volume server {n}: {e}");
        }
        let started = Instant::now();
        if let Err((_, why)) = node::wait_healthy(&[node], CLUSTER_HEALTHY_TIMEOUT) {
            panic!(
                "SeaweedFS volume server {n} {why} after a restart\n{}",
                node.log_tail()
            );
        }
        if let Err(why) = wait_joined(self.master.base_url(), &self.volume_addrs) {
            panic!(
                "after restarting volume server {n}: {why}\n{}",
                self.log_tails()
            );
        }
        eprintln!(
            "strata-testkit: SeaweedFS volume server {n} back after {:.1?}",
            started.elapsed()
        );
    }

    /// The volume servers the master currently lists as members, by their
    /// `127.0.0.1:PORT`.
    pub fn live_volume_servers(&self) -> Vec<String> {
        let status = master_status(self.master.base_url()).unwrap_or_default();
        self.volume_addrs
            .iter()
            .filter(|addr| status.contains(&format!("\"Url\":\"{addr}\"")))
            .cloned()
            .collect()
    }

    /// The last lines of every process's log, for panic messages.
    pub fn log_tails(&self) -> String {
        let mut nodes: Vec<&Node> = vec![&self.master];
        nodes.extend(self.volumes.iter());
        nodes.extend([&self.filer, &self.s3]);
        nodes
            .iter()
            .map(|n| n.log_tail())
            .collect::<Vec<_>>()
            .join("\n")
    }

    fn volume(&self, n: usize) -> &Node {
        match n.checked_sub(1).and_then(|i| self.volumes.get(i)) {
            Some(node) => node,
            None => panic!("SeaweedFS volume server {n} does not exist (1..={VOLUME_SERVERS})"),
        }
    }
}

impl S3Service for SeaweedCluster {
    fn implementation(&self) -> S3Impl {
        S3Impl::Seaweedfs
    }
    fn endpoint(&self) -> String {
        self.endpoint.clone()
    }
}

extern "C" fn stop_shared() {
    // Nothing may unwind out of an exit handler.
    let _ = std::panic::catch_unwind(|| {
        if let Some(cluster) = SHARED.get() {
            for node in [&cluster.s3, &cluster.filer] {
                node.kill_nonblocking();
            }
            for node in &cluster.volumes {
                node.kill_nonblocking();
            }
            cluster.master.kill_nonblocking();
            let _ = std::fs::remove_dir_all(cluster.dir.path());
        }
    });
}

/// Why a start attempt failed.
struct StartFailed {
    dir: TempDir,
    why: String,
    tails: String,
    /// A process said its address was in use: retry on new ports.
    port_taken: bool,
}

/// Starts the six processes in `dir` on `ports` and waits for them.
fn start_in(bin: &Path, dir: TempDir, ports: Ports) -> Result<SeaweedCluster, StartFailed> {
    let root = dir.path().to_path_buf();
    let master_dir = make_dir(&root, "master");
    write_file(&master_dir.join("master.toml"), MASTER_TOML);
    let s3_config = root.join("s3.json");
    write_file(&s3_config, &identities_json());
    let master_addr = format!("127.0.0.1:{}.{}", ports.master.0, ports.master.1);

    let spawn = |name: &str, args: Vec<String>, cwd: Option<PathBuf>| Spawn {
        program: bin.to_path_buf(),
        args: args.into_iter().map(OsString::from).collect(),
        envs: Vec::new(),
        cwd,
        log: root.join(format!("{name}.log")),
    };
    let http = |port: u16| format!("http://127.0.0.1:{port}");
    let start = |s: Spawn, port: u16, health: &'static str| match Node::start_with_health(
        s,
        http(port),
        None,
        health,
    ) {
        Ok(node) => node,
        Err(e) => panic!("starting {}: {e}", bin.display()),
    };

    let mut master_args = common_args("master", ports.master);
    master_args.extend([
        format!("-mdir={}", master_dir.display()),
        "-peers=none".to_owned(),
        "-defaultReplication=001".to_owned(),
        "-volumeSizeLimitMB=64".to_owned(),
    ]);
    let master = start(
        spawn("master", master_args, Some(master_dir.clone())),
        ports.master.0,
        MASTER_HEALTH,
    );
    // The others find the master at start; one that finds it not yet up
    // retries only after a while.
    if let Err((_, why)) = node::wait_healthy(&[&master], CLUSTER_HEALTHY_TIMEOUT) {
        let tails = master.log_tail();
        drop(master);
        return Err(StartFailed {
            port_taken: tails.contains("address already in use"),
            dir,
            why: format!("master {why}"),
            tails,
        });
    }
    let mut volumes = Vec::new();
    let mut volume_addrs = Vec::new();
    for (i, &pair) in ports.volumes.iter().enumerate() {
        let data = make_dir(&root, &format!("volume{}", i + 1));
        let mut args = common_args("volume", pair);
        args.extend([
            format!("-dir={}", data.display()),
            format!("-master={master_addr}"),
            // 0: as many volumes as the disk has room for.
            "-max=0".to_owned(),
        ]);
        volumes.push(start(
            spawn(&format!("volume{}", i + 1), args, None),
            pair.0,
            VOLUME_HEALTH,
        ));
        volume_addrs.push(format!("127.0.0.1:{}", pair.0));
    }
    let filer_dir = make_dir(&root, "filer");
    let mut filer_args = common_args("filer", ports.filer);
    filer_args.extend([
        format!("-master={master_addr}"),
        format!("-defaultStoreDir={}", filer_dir.display()),
    ]);
    let filer = start(
        spawn("filer", filer_args, None),
        ports.filer.0,
        FILER_HEALTH,
    );
    let mut s3_args = common_args("s3", ports.s3);
    s3_args.extend([
        format!("-filer=127.0.0.1:{}.{}", ports.filer.0, ports.filer.1),
        format!("-config={}", s3_config.display()),
        // Processes sharing the cluster drop their buckets at exit (see
        // s3_service.rs); deleted objects' space comes back only when a
        // bucket's collection goes.
        "-allowDeleteBucketNotEmpty=true".to_owned(),
        // Off: they would listen on fixed ports (8181, 9101).
        "-port.iceberg=0".to_owned(),
        "-port.lance=0".to_owned(),
    ]);
    let s3 = start(spawn("s3", s3_args, None), ports.s3.0, S3_HEALTH);

    let cluster = SeaweedCluster {
        s3,
        filer,
        volumes,
        master,
        volume_addrs,
        endpoint: http(ports.s3.0),
        dir,
    };
    let ready = wait_ready(&cluster);
    match ready {
        Ok(()) => Ok(cluster),
        Err(why) => {
            let tails = cluster.log_tails();
            let port_taken = tails.contains("address already in use");
            let SeaweedCluster { dir, .. } = cluster;
            Err(StartFailed {
                dir,
                why,
                tails,
                port_taken,
            })
        }
    }
}

/// Waits until every process answers its health endpoint, every volume
/// server has joined the master, and the gateway stores an object.
///
/// The last is the one that takes time: a filer on a fresh store holds its
/// announcement to the master for 10 s (SeaweedFS's
/// `emptyMembershipConfirmTimeout`, waiting for peers that might disprove
/// an empty cluster), and until it is announced the gateway's writes fail
/// ("no lock server found"). Health endpoints answer long before.
fn wait_ready(c: &SeaweedCluster) -> Result<(), String> {
    let mut all: Vec<&Node> = vec![&c.master];
    all.extend(c.volumes.iter());
    all.extend([&c.filer, &c.s3]);
    let names = ["master", "volume1", "volume2", "volume3", "filer", "s3"];
    if let Err((i, why)) = node::wait_healthy(&all, CLUSTER_HEALTHY_TIMEOUT) {
        return Err(format!("{} {why}", names.get(i).unwrap_or(&"a process")));
    }
    wait_joined(c.master.base_url(), &c.volume_addrs)?;
    let deadline = Instant::now() + CLUSTER_HEALTHY_TIMEOUT;
    let mut bucket_made = false;
    loop {
        let attempt = if bucket_made {
            s3::request(
                &c.endpoint,
                None,
                "PUT",
                &format!("{READY_BUCKET}/ready"),
                Some(b"ready"),
            )
        } else {
            s3::request(&c.endpoint, None, "PUT", READY_BUCKET, None)
        };
        match attempt {
            Ok(_) if bucket_made => return Ok(()),
            Ok(_) => bucket_made = true,
            Err(e) if Instant::now() >= deadline => {
                return Err(format!(
                    "the S3 gateway did not store an object within {CLUSTER_HEALTHY_TIMEOUT:?}: {e}"
                ));
            }
            Err(_) => std::thread::sleep(Duration::from_millis(200)),
        }
    }
}

/// Polls the master until it lists every address of `volumes`.
fn wait_joined(master: &str, volumes: &[String]) -> Result<(), String> {
    let deadline = Instant::now() + CLUSTER_HEALTHY_TIMEOUT;
    loop {
        let status = master_status(master).unwrap_or_default();
        let missing: Vec<&String> = volumes
            .iter()
            .filter(|addr| !status.contains(&format!("\"Url\":\"{addr}\"")))
            .collect();
        if missing.is_empty() {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(format!(
                "volume servers {missing:?} had not joined the master after {CLUSTER_HEALTHY_TIMEOUT:?}"
            ));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The master's topology (`/dir/status`, JSON), `None` if it does not
/// answer.
fn master_status(master: &str) -> Option<String> {
    s3::http_body(&format!("{master}/dir/status"), None)
}

/// The flags every process gets: loopback only, and its two ports.
fn common_args(command: &str, (port, grpc): (u16, u16)) -> Vec<String> {
    vec![
        command.to_owned(),
        "-ip=127.0.0.1".to_owned(),
        "-ip.bind=127.0.0.1".to_owned(),
        format!("-port={port}"),
        format!("-port.grpc={grpc}"),
    ]
}

/// The gateway's identities: the test credentials, allowed everything.
fn identities_json() -> String {
    format!(
        r#"{{"identities":[{{"name":"strata-test","credentials":[{{"accessKey":"{ACCESS_KEY}","secretKey":"{SECRET_KEY}"}}],"actions":["Admin","Read","Write","List","Tagging"]}}]}}"#
    )
}

fn make_dir(root: &Path, name: &str) -> PathBuf {
    let dir = root.join(name);
    if let Err(e) = std::fs::create_dir(&dir) {
        panic!("creating {}: {e}", dir.display());
    }
    dir
}

fn write_file(path: &Path, text: &str) {
    if let Err(e) = std::fs::write(path, text) {
        panic!("writing {}: {e}", path.display());
    }
}
