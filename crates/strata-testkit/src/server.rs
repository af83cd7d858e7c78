//! A single-node MinIO server on 127.0.0.1, over http or https.
//!
//! This module owns [`MinioServer`]: a private server per caller, or one
//! shared per test process ([`MinioServer::shared`]) that tests keep apart by
//! bucket ([`MinioServer::fresh_bucket`]). In TLS mode it also owns the test
//! certificate authority the client must trust.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Instant;

use tempfile::TempDir;

use crate::keeper::Spawn;
use crate::node::{self, Node, NotHealthy, HEALTHY_TIMEOUT};
use crate::{s3, ACCESS_KEY, REGION, SECRET_KEY};

/// Start attempts: a retry only follows MinIO finding its freshly picked
/// port taken by someone else in the meantime.
const START_ATTEMPTS: usize = 3;

/// A running single-node MinIO server; killed (SIGKILL) when dropped.
pub struct MinioServer {
    // Declared before `dir`: the process dies before its data is removed.
    node: Node,
    port: u16,
    endpoint: String,
    dir: TempDir,
}

/// The per-process shared server, see [`MinioServer::shared`].
static SHARED: OnceLock<MinioServer> = OnceLock::new();

impl MinioServer {
    /// Starts a private server over plain http and waits until it is
    /// healthy.
    ///
    /// # Panics
    /// When MinIO is not installed, or does not become healthy within 60 s
    /// (the message carries the tail of its log).
    pub fn start() -> MinioServer {
        start(false)
    }

    /// Starts a private server over https, with a certificate for 127.0.0.1
    /// and `localhost` issued by a fresh test CA ([`MinioServer::ca_cert`]),
    /// and waits until it is healthy.
    ///
    /// HTTP/2: this MinIO offers h2 in ALPN but lists http/1.1 first, and
    /// Go's TLS picks by the server's order, so a client offering both gets
    /// HTTP/1.1; only a client offering h2 alone gets HTTP/2. (Over plain
    /// http there is no HTTP/2 at all: neither prior knowledge nor upgrade.)
    ///
    /// # Panics
    /// As [`MinioServer::start`], and when `openssl` fails.
    pub fn start_tls() -> MinioServer {
        start(true)
    }

    /// The plain-http server shared by every test of this process, started
    /// on first use. Tests isolate by bucket ([`MinioServer::fresh_bucket`]).
    /// The server is killed and its data removed when the process exits.
    ///
    /// # Panics
    /// As [`MinioServer::start`]; a later call tries to start it again.
    pub fn shared() -> &'static MinioServer {
        SHARED.get_or_init(|| {
            let server = MinioServer::start();
            // Statics are never dropped; without this the data directory
            // would outlive every test run.
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

    /// `http://127.0.0.1:PORT`, or `https://...` in TLS mode.
    pub fn endpoint(&self) -> String {
        self.endpoint.clone()
    }

    pub fn port(&self) -> u16 {
        self.port
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

    /// The CA certificate (PEM) that verifies the server's certificate, in
    /// TLS mode.
    pub fn ca_cert(&self) -> Option<&Path> {
        self.node.ca()
    }

    /// MinIO's stdout and stderr.
    pub fn log_path(&self) -> &Path {
        self.node.log_path()
    }

    /// OS process id of the MinIO server.
    pub fn pid(&self) -> Option<u32> {
        self.node.pid()
    }

    /// Environment for a client process: `AWS_ACCESS_KEY_ID`,
    /// `AWS_SECRET_ACCESS_KEY`, `AWS_REGION`, `AWS_ENDPOINT_URL`,
    /// `AWS_ALLOW_HTTP=true`, and in TLS mode `AWS_CA_BUNDLE`.
    pub fn client_env(&self) -> Vec<(String, String)> {
        crate::client_env(&self.endpoint, self.ca_cert())
    }

    /// Creates bucket `name`.
    ///
    /// # Panics
    /// When MinIO refuses (the message carries its error), e.g. because the
    /// bucket exists.
    pub fn create_bucket(&self, name: &str) {
        s3::create_bucket(&self.endpoint, self.ca_cert(), name);
    }

    /// Creates a bucket with a name no other call in this process got, and
    /// returns the name.
    ///
    /// # Panics
    /// As [`MinioServer::create_bucket`].
    pub fn fresh_bucket(&self) -> String {
        let name = crate::unique_bucket_name();
        self.create_bucket(&name);
        name
    }

    /// Stores `data` at `bucket/key` (`key` must be URL-safe; `/` is fine).
    ///
    /// # Panics
    /// When MinIO refuses, with its error.
    pub fn put_object(&self, bucket: &str, key: &str, data: &[u8]) {
        s3::put_object(&self.endpoint, self.ca_cert(), bucket, key, data);
    }

    /// The bytes at `bucket/key` (`key` must be URL-safe).
    ///
    /// # Panics
    /// When MinIO refuses (e.g. no such key), with its error.
    pub fn get_object(&self, bucket: &str, key: &str) -> Vec<u8> {
        s3::get_object(&self.endpoint, self.ca_cert(), bucket, key)
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

/// Starts MinIO in a fresh directory and waits until it is healthy,
/// retrying with new ports while the ports it was given turn out taken.
fn start(tls: bool) -> MinioServer {
    let bin = crate::minio_bin();
    let files = ServerFiles::create(tls);
    for attempt in 1..=START_ATTEMPTS {
        // A fresh log per attempt, so the port check below reads this one.
        let _ = std::fs::remove_file(&files.log);
        let Some((port, console_port)) = two_free_ports() else {
            continue;
        };
        let endpoint = format!("{}://127.0.0.1:{port}", files.scheme());
        let started = Instant::now();
        let node = spawn_node(&bin, &files, port, console_port, &endpoint);
        match node::wait_healthy(&[&node], HEALTHY_TIMEOUT) {
            Ok(()) => {
                eprintln!(
                    "strata-testkit: MinIO at {endpoint} healthy after {:.1?} (log {})",
                    started.elapsed(),
                    files.log.display()
                );
                return MinioServer {
                    node,
                    port,
                    endpoint,
                    dir: files.dir,
                };
            }
            // MinIO says "Specified port is already in use".
            Err((_, NotHealthy::Exited(_)))
                if attempt < START_ATTEMPTS && node.log_tail().contains("already in use") =>
            {
                continue;
            }
            Err((_, why)) => give_up(node, files.dir, &endpoint, &why),
        }
    }
    panic!(
        "MinIO found its port taken {START_ATTEMPTS} times\n{}",
        node::log_tail(&files.log)
    );
}

/// The files of one server, made once and shared by its start attempts
/// (only the ports change between them).
struct ServerFiles {
    /// Removed when the server is dropped, unless kept for a post-mortem.
    dir: TempDir,
    /// MinIO's data directory.
    data: PathBuf,
    /// MinIO's stdout and stderr.
    log: PathBuf,
    /// The CA certificate and the `--certs-dir`, in TLS mode.
    tls: Option<(PathBuf, PathBuf)>,
}

impl ServerFiles {
    /// A temporary directory with an empty data directory and, in TLS mode,
    /// a fresh test PKI.
    fn create(tls: bool) -> ServerFiles {
        let dir = match tempfile::Builder::new().prefix("strata-minio-").tempdir() {
            Ok(dir) => dir,
            Err(e) => panic!("creating a temporary directory for MinIO: {e}"),
        };
        let data = dir.path().join("data");
        if let Err(e) = std::fs::create_dir(&data) {
            panic!("creating {}: {e}", data.display());
        }
        let tls = tls.then(|| make_certs(dir.path()));
        let log = dir.path().join("minio.log");
        ServerFiles {
            dir,
            data,
            log,
            tls,
        }
    }

    fn scheme(&self) -> &'static str {
        if self.tls.is_some() {
            "https"
        } else {
            "http"
        }
    }

    fn ca(&self) -> Option<PathBuf> {
        self.tls.as_ref().map(|(ca, _)| ca.clone())
    }
}

/// Two distinct free ports on 127.0.0.1 (API, console); `None` when the OS
/// happened to hand out the same one twice, which the caller retries.
fn two_free_ports() -> Option<(u16, u16)> {
    match (node::free_port(), node::free_port()) {
        (Ok(a), Ok(b)) if a != b => Some((a, b)),
        (Err(e), _) | (_, Err(e)) => panic!("finding a free port on 127.0.0.1: {e}"),
        _ => None,
    }
}

/// Launches MinIO on the given ports; does not wait for it.
fn spawn_node(
    bin: &Path,
    files: &ServerFiles,
    port: u16,
    console_port: u16,
    endpoint: &str,
) -> Node {
    let mut args: Vec<OsString> = vec![
        "server".into(),
        files.data.clone().into(),
        "--address".into(),
        format!("127.0.0.1:{port}").into(),
        "--console-address".into(),
        format!("127.0.0.1:{console_port}").into(),
    ];
    if let Some((_, certs)) = &files.tls {
        args.push("--certs-dir".into());
        args.push(certs.clone().into());
    }
    let spawn = Spawn {
        program: bin.to_path_buf(),
        args,
        envs: server_env(),
        cwd: None,
        log: files.log.clone(),
    };
    match Node::start(spawn, endpoint.to_owned(), files.ca()) {
        Ok(node) => node,
        Err(e) => panic!("starting {}: {e}", bin.display()),
    }
}

/// Panics with the tail of MinIO's log, after killing it and keeping its
/// files for a post-mortem.
fn give_up(node: Node, dir: TempDir, endpoint: &str, why: &NotHealthy) -> ! {
    let tail = node.log_tail();
    drop(node);
    let kept = dir.keep();
    panic!(
        "MinIO at {endpoint} {why} (its files are kept in {})\n{tail}",
        kept.display()
    );
}

/// Environment of every test MinIO server.
pub(crate) fn server_env() -> Vec<(String, String)> {
    vec![
        ("MINIO_ROOT_USER".to_owned(), ACCESS_KEY.to_owned()),
        ("MINIO_ROOT_PASSWORD".to_owned(), SECRET_KEY.to_owned()),
        // Drives on the root filesystem are fine for tests.
        ("MINIO_CI_CD".to_owned(), "1".to_owned()),
    ]
}

/// Generates the test PKI (`crate::pki`) and lays out the server's
/// `<dir>/certs/public.crt` + `private.key` (where `--certs-dir` wants
/// them). Returns (CA certificate, certs dir).
fn make_certs(dir: &Path) -> (PathBuf, PathBuf) {
    let pki_dir = dir.join("ca");
    let certs = dir.join("certs");
    for d in [&pki_dir, &certs] {
        if let Err(e) = std::fs::create_dir_all(d) {
            panic!("creating {}: {e}", d.display());
        }
    }
    let pki = crate::pki::TestPki::generate(&pki_dir);
    for (from, to) in [
        (&pki.server_cert, "public.crt"),
        (&pki.server_key, "private.key"),
    ] {
        if let Err(e) = std::fs::copy(from, certs.join(to)) {
            panic!("copying {}: {e}", from.display());
        }
    }
    (pki.ca_cert, certs)
}
