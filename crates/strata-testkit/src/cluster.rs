//! A 4-node erasure-coded MinIO cluster on 127.0.0.1:9001..9004.
//!
//! This module owns [`MinioCluster`]: four MinIO processes with one drive
//! each, forming one erasure set with 2 data and 2 parity shards (EC:2), so
//! tests can kill and restart nodes under a client. With one node down the
//! cluster keeps both read quorum (2 shards) and write quorum (3 drives), so
//! a client should not notice beyond latency.
//!
//! The ports are fixed (MinIO nodes find each other by the endpoint list,
//! which every node must be given identically before any of them has
//! started), so a cluster holds an exclusive `flock` on [`LOCK_PATH`] for
//! its whole life: clusters of concurrent test processes, or of concurrent
//! tests in one process, take turns instead of colliding.

use std::ffi::OsString;
use std::fs::File;
use std::io::{Read, Seek, Write};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use tempfile::TempDir;

use crate::keeper::Spawn;
use crate::node::{self, Node};
use crate::server::server_env;
use crate::{s3, ACCESS_KEY, REGION, SECRET_KEY};

/// The S3 ports of nodes 1..=4.
pub const CLUSTER_PORTS: [u16; 4] = [9001, 9002, 9003, 9004];

/// Lock file serializing clusters across processes (they share the ports).
pub const LOCK_PATH: &str = "/tmp/strata-minio-cluster.lock";

/// How long to wait for another cluster to release the ports. Long enough
/// for another test's cluster to finish; a holder past this is stuck.
const LOCK_TIMEOUT: Duration = Duration::from_secs(600);

/// Four MinIO processes have to find each other; give them twice a single
/// server's time.
const CLUSTER_HEALTHY_TIMEOUT: Duration = Duration::from_secs(120);

/// A running 4-node MinIO cluster; every node is killed when dropped.
pub struct MinioCluster {
    // Field order is drop order: processes die, then their drives are
    // removed, then the ports are handed to the next cluster.
    nodes: Vec<Node>,
    dir: TempDir,
    _lock: File,
}

impl MinioCluster {
    /// Takes the cluster lock, starts four nodes and waits until every one
    /// reports the cluster healthy.
    ///
    /// # Panics
    /// When MinIO is not installed, a port of [`CLUSTER_PORTS`] is taken by
    /// another program, the lock is held for 10 minutes, or the cluster does
    /// not become healthy within 120 s (with the nodes' log tails).
    pub fn start() -> MinioCluster {
        let bin = crate::minio_bin();
        let lock = take_lock();
        for port in CLUSTER_PORTS {
            if let Err(e) = std::net::TcpListener::bind(("127.0.0.1", port)) {
                panic!(
                    "MinioCluster needs 127.0.0.1:{port} but cannot bind it ({e}); another \
                     program uses it (a strata test cluster would hold {LOCK_PATH})"
                );
            }
        }
        let dir = match tempfile::Builder::new()
            .prefix("strata-minio-cluster-")
            .tempdir()
        {
            Ok(dir) => dir,
            Err(e) => panic!("creating a temporary directory for the MinIO cluster: {e}"),
        };
        // Identical on every node, and no ellipses: MinIO expands
        // `http://host:900{1...4}/d{1...4}` as a cross product (16 drives),
        // and one drive per node needs distinct paths per host.
        let endpoints: Vec<OsString> = CLUSTER_PORTS
            .iter()
            .enumerate()
            .map(|(i, port)| {
                format!("http://127.0.0.1:{port}{}/d{}", dir.path().display(), i + 1).into()
            })
            .collect();
        let started = Instant::now();
        let mut nodes = Vec::with_capacity(CLUSTER_PORTS.len());
        for (i, port) in CLUSTER_PORTS.into_iter().enumerate() {
            let drive = dir.path().join(format!("d{}", i + 1));
            if let Err(e) = std::fs::create_dir(&drive) {
                panic!("creating {}: {e}", drive.display());
            }
            let console_port = match node::free_port() {
                Ok(p) => p,
                Err(e) => panic!("finding a free port on 127.0.0.1: {e}"),
            };
            let mut args: Vec<OsString> = vec![
                "server".into(),
                "--address".into(),
                format!("127.0.0.1:{port}").into(),
                "--console-address".into(),
                format!("127.0.0.1:{console_port}").into(),
            ];
            args.extend(endpoints.iter().cloned());
            let mut envs = server_env();
            envs.extend([
                // In a container MinIO waits forever for 127.0.0.1 to
                // "resolve to a valid IP"; this names the local endpoint.
                (
                    "_MINIO_SERVER_LOCAL".to_owned(),
                    format!("127.0.0.1:{port}"),
                ),
                ("MINIO_STORAGE_CLASS_STANDARD".to_owned(), "EC:2".to_owned()),
            ]);
            let spawn = Spawn {
                program: bin.clone(),
                args,
                envs,
                cwd: None,
                log: dir.path().join(format!("node{}.log", i + 1)),
            };
            match Node::start(spawn, format!("http://127.0.0.1:{port}"), None) {
                Ok(node) => nodes.push(node),
                Err(e) => panic!("starting {}: {e}", bin.display()),
            }
        }
        let cluster = MinioCluster {
            nodes,
            dir,
            _lock: lock,
        };
        let all: Vec<&Node> = cluster.nodes.iter().collect();
        if let Err((i, why)) = node::wait_healthy(&all, CLUSTER_HEALTHY_TIMEOUT) {
            let tails = cluster.log_tails();
            // Kill the nodes, but keep their drives and logs to look at.
            let MinioCluster { nodes, dir, _lock } = cluster;
            drop(nodes);
            let kept = dir.keep();
            panic!(
                "MinIO cluster node {} {why} (drives and logs kept in {})\n{tails}",
                i + 1,
                kept.display()
            );
        }
        eprintln!(
            "strata-testkit: MinIO cluster at {} healthy after {:.1?} (logs in {})",
            cluster.endpoint(),
            started.elapsed(),
            cluster.dir.path().display()
        );
        cluster
    }

    /// Node 1's `http://127.0.0.1:9001`: what clients talk to.
    pub fn endpoint(&self) -> String {
        self.node(1).base_url().to_owned()
    }

    /// `http://127.0.0.1:900N` of node `n` (1..=4).
    pub fn node_endpoint(&self, n: usize) -> String {
        self.node(n).base_url().to_owned()
    }

    pub fn access_key(&self) -> &'static str {
        ACCESS_KEY
    }

    pub fn secret_key(&self) -> &'static str {
        SECRET_KEY
    }

    pub fn region(&self) -> &'static str {
        REGION
    }

    /// Node `n`'s MinIO stdout and stderr (1..=4).
    pub fn node_log_path(&self, n: usize) -> &std::path::Path {
        self.node(n).log_path()
    }

    /// As [`crate::MinioServer::client_env`], pointing at node 1.
    pub fn client_env(&self) -> Vec<(String, String)> {
        crate::client_env(&self.endpoint(), None)
    }

    /// SIGKILLs node `n` (1..=4) and reaps it. The other nodes notice on
    /// their own, within seconds.
    ///
    /// # Panics
    /// When `n` is out of range.
    pub fn kill_node(&self, n: usize) {
        self.node(n).kill();
    }

    /// Starts the killed node `n` (1..=4) again with its arguments,
    /// environment and drive, and waits until it and node 1 both report the
    /// cluster healthy.
    ///
    /// # Panics
    /// When `n` is out of range or still running, or the cluster is not
    /// healthy within 120 s.
    pub fn restart_node(&self, n: usize) {
        let node = self.node(n);
        if let Err(e) = node.restart() {
            panic!("restarting MinIO node {n}: {e}");
        }
        let started = Instant::now();
        let mut watch = vec![node];
        if n != 1 {
            watch.push(self.node(1));
        }
        if let Err((i, why)) = node::wait_healthy(&watch, CLUSTER_HEALTHY_TIMEOUT) {
            let which = if i == 0 { n } else { 1 };
            panic!(
                "after restarting MinIO cluster node {n}, node {which} {why}\n{}",
                self.log_tails()
            );
        }
        eprintln!(
            "strata-testkit: MinIO node {n} back and cluster healthy after {:.1?}",
            started.elapsed()
        );
    }

    /// Status code of node `n`'s `/minio/health/cluster` (1..=4), `None`
    /// when it does not answer.
    pub fn health(&self, n: usize) -> Option<u16> {
        self.node(n).health()
    }

    /// Creates bucket `name` through node 1.
    ///
    /// # Panics
    /// When MinIO refuses, with its error.
    pub fn create_bucket(&self, name: &str) {
        s3::create_bucket(&self.endpoint(), None, name);
    }

    /// Creates a bucket with a name no other call in this process got, and
    /// returns the name.
    ///
    /// # Panics
    /// As [`MinioCluster::create_bucket`].
    pub fn fresh_bucket(&self) -> String {
        let name = crate::unique_bucket_name();
        self.create_bucket(&name);
        name
    }

    /// Stores `data` at `bucket/key` through node 1 (`key` URL-safe).
    ///
    /// # Panics
    /// When MinIO refuses, with its error.
    pub fn put_object(&self, bucket: &str, key: &str, data: &[u8]) {
        s3::put_object(&self.endpoint(), None, bucket, key, data);
    }

    /// The bytes at `bucket/key`, read through node 1 (`key` URL-safe).
    ///
    /// # Panics
    /// When MinIO refuses, with its error.
    pub fn get_object(&self, bucket: &str, key: &str) -> Vec<u8> {
        s3::get_object(&self.endpoint(), None, bucket, key)
    }

    fn node(&self, n: usize) -> &Node {
        match n.checked_sub(1).and_then(|i| self.nodes.get(i)) {
            Some(node) => node,
            None => panic!(
                "MinIO cluster node {n} does not exist (nodes are 1..={})",
                self.nodes.len()
            ),
        }
    }

    fn log_tails(&self) -> String {
        self.nodes
            .iter()
            .map(Node::log_tail)
            .collect::<Vec<_>>()
            .join("\n")
    }
}

/// Takes the exclusive cluster lock, waiting for another holder to finish.
fn take_lock() -> File {
    let mut file = match std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(LOCK_PATH)
    {
        Ok(file) => file,
        Err(e) => panic!("opening {LOCK_PATH}: {e}"),
    };
    let deadline = Instant::now() + LOCK_TIMEOUT;
    let mut said = false;
    loop {
        // SAFETY: flock on a descriptor we own; no memory involved.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
            break;
        }
        let err = std::io::Error::last_os_error();
        if err.raw_os_error() != Some(libc::EWOULDBLOCK) {
            panic!("locking {LOCK_PATH}: {err}");
        }
        let mut holder = String::new();
        let _ = file
            .rewind()
            .and_then(|()| file.read_to_string(&mut holder));
        // Empty when the holder has not written its pid yet.
        let holder = match holder.trim() {
            "" => "another process".to_owned(),
            pid => format!("process {pid}"),
        };
        if Instant::now() >= deadline {
            panic!("{holder} has held the MinIO cluster lock {LOCK_PATH} for {LOCK_TIMEOUT:?}");
        }
        if !said {
            eprintln!(
                "strata-testkit: waiting for the MinIO cluster of {holder} to finish ({LOCK_PATH})"
            );
            said = true;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    // Who holds it, for whoever waits next. Best effort.
    let _ = file
        .set_len(0)
        .and_then(|()| file.rewind())
        .and_then(|()| write!(file, "{}", std::process::id()));
    file
}
