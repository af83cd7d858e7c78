//! A versitygw S3 gateway on 127.0.0.1, storing into a POSIX directory.
//!
//! This module owns [`VersitygwServer`]: one `versitygw` process with its
//! POSIX backend (objects are files; ETags and metadata are extended
//! attributes, so the directory must be on a file system with user xattrs,
//! as the tempdir's ext4 or tmpfs are), a private one per caller or one
//! shared per test process ([`VersitygwServer::shared`]) that tests keep
//! apart by bucket. It starts in well under a second.
//!
//! `--keep-alive`: without it the gateway answers every request with
//! `Connection: close`, and a client opens a connection per request.

use std::ffi::OsString;
use std::sync::OnceLock;
use std::time::Instant;

use tempfile::TempDir;

use crate::keeper::Spawn;
use crate::node::{self, Node, NotHealthy, HEALTHY_TIMEOUT};
use crate::{S3Impl, S3Service, ACCESS_KEY, REGION, SECRET_KEY};

/// Start attempts: a retry only follows the gateway finding its freshly
/// picked port taken by someone else in the meantime.
const START_ATTEMPTS: usize = 3;

/// The health endpoint the gateway is started with (it has none unless
/// asked).
const HEALTH_PATH: &str = "/health";

/// A running versitygw; killed (SIGKILL) when dropped.
pub struct VersitygwServer {
    // Declared before `dir`: the process dies before its data is removed.
    node: Node,
    endpoint: String,
    dir: TempDir,
}

/// The per-process shared server, see [`VersitygwServer::shared`].
static SHARED: OnceLock<VersitygwServer> = OnceLock::new();

impl VersitygwServer {
    /// Starts a private gateway and waits until it is healthy.
    ///
    /// # Panics
    /// When versitygw is not installed, or does not become healthy within
    /// 60 s (the message carries the tail of its log).
    pub fn start() -> VersitygwServer {
        let bin = crate::versitygw_bin();
        let dir = match tempfile::Builder::new()
            .prefix("strata-versitygw-")
            .tempdir()
        {
            Ok(dir) => dir,
            Err(e) => panic!("creating a temporary directory for versitygw: {e}"),
        };
        let data = dir.path().join("data");
        if let Err(e) = std::fs::create_dir(&data) {
            panic!("creating {}: {e}", data.display());
        }
        let log = dir.path().join("versitygw.log");
        for attempt in 1..=START_ATTEMPTS {
            let _ = std::fs::remove_file(&log);
            let port = match node::free_port() {
                Ok(p) => p,
                Err(e) => panic!("finding a free port on 127.0.0.1: {e}"),
            };
            let endpoint = format!("http://127.0.0.1:{port}");
            let args: Vec<OsString> = vec![
                "--port".into(),
                format!("127.0.0.1:{port}").into(),
                "--region".into(),
                REGION.into(),
                "--health".into(),
                HEALTH_PATH.into(),
                "--keep-alive".into(),
                "--quiet".into(),
                "posix".into(),
                data.clone().into(),
            ];
            let spawn = Spawn {
                program: bin.clone(),
                args,
                // The root credentials: from the environment, not argv
                // (which any process can read).
                envs: vec![
                    ("ROOT_ACCESS_KEY_ID".to_owned(), ACCESS_KEY.to_owned()),
                    ("ROOT_SECRET_ACCESS_KEY".to_owned(), SECRET_KEY.to_owned()),
                ],
                cwd: None,
                log: log.clone(),
            };
            let started = Instant::now();
            let node = match Node::start_with_health(spawn, endpoint.clone(), None, HEALTH_PATH) {
                Ok(node) => node,
                Err(e) => panic!("starting {}: {e}", bin.display()),
            };
            match node::wait_healthy(&[&node], HEALTHY_TIMEOUT) {
                Ok(()) => {
                    eprintln!(
                        "strata-testkit: versitygw at {endpoint} healthy after {:.1?} (log {})",
                        started.elapsed(),
                        log.display()
                    );
                    return VersitygwServer {
                        node,
                        endpoint,
                        dir,
                    };
                }
                Err((_, NotHealthy::Exited(_)))
                    if attempt < START_ATTEMPTS
                        && node.log_tail().contains("address already in use") =>
                {
                    continue;
                }
                Err((_, why)) => {
                    let tail = node.log_tail();
                    drop(node);
                    let kept = dir.keep();
                    panic!(
                        "versitygw at {endpoint} {why} (its files are kept in {})\n{tail}",
                        kept.display()
                    );
                }
            }
        }
        panic!(
            "versitygw found its port taken {START_ATTEMPTS} times\n{}",
            node::log_tail(&log)
        );
    }

    /// The gateway shared by every test of this process, started on first
    /// use. Tests isolate by bucket. Killed and its data removed when the
    /// process exits.
    ///
    /// # Panics
    /// As [`VersitygwServer::start`]; a later call tries to start it again.
    pub fn shared() -> &'static VersitygwServer {
        SHARED.get_or_init(|| {
            let server = VersitygwServer::start();
            // SAFETY: registering a plain extern "C" fn with no captures.
            if unsafe { libc::atexit(stop_shared) } != 0 {
                eprintln!(
                    "strata-testkit: atexit failed; {} will be left behind",
                    server.dir.path().display()
                );
            }
            server
        })
    }
}

impl S3Service for VersitygwServer {
    fn implementation(&self) -> S3Impl {
        S3Impl::Versitygw
    }
    fn endpoint(&self) -> String {
        self.endpoint.clone()
    }
}

extern "C" fn stop_shared() {
    // Nothing may unwind out of an exit handler.
    let _ = std::panic::catch_unwind(|| {
        if let Some(server) = SHARED.get() {
            server.node.kill_nonblocking();
            let _ = std::fs::remove_dir_all(server.dir.path());
        }
    });
}
