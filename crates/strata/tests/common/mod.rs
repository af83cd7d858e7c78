//! Shared harness for strata's end-to-end tests.
//!
//! Every test runs real NBD clients (nbdinfo, qemu-io, qemu-img, nbdcopy, fio,
//! nbdfuse + loop + ext4, libnbd's Python binding) against a server started by
//! [`Server::start`]. The server under test is `strata serve`; the same tests
//! can be pointed at a peer (`nbdkit memory` / `nbdkit file`) by setting
//! `STRATA_E2E_PEER=1`, which is how the plumbing of each test is validated
//! independently of strata.
//!
//! strata keeps its volumes in a store in the test's temp dir, or on S3:
//! [`Target::strata_s3`] with an [`S3Store`], a fresh bucket on a MinIO of
//! `strata-testkit` (the process-wide shared server, or a 4-node cluster).
//! With a shared store a server can move to "another host":
//! [`Server::restart_on_new_host`] / [`Server::set_data_dir`] restart it on
//! an empty data dir, so everything it serves comes from MinIO; servers in
//! different dirs on one store compete for a volume's lease
//! ([`Server::try_start`] for a start that may be refused).
//!
//! The bodies of the real-client tests live in [`clients`] and the crash
//! checker in [`crash_check`], so the local-store tests and the S3 ones run
//! the same checks.
//!
//! Everything a test starts is owned by a guard that stops it on drop, also
//! when the test panics: [`Server`] (kill -9 + wait), [`BgProcess`],
//! [`FuseFile`] (fusermount3 -u), [`LoopDev`] (losetup -d), [`Mount`]
//! (umount). Servers only bind unix sockets inside the test's temp dir.
#![allow(dead_code)]

pub mod clients;
pub mod crash_check;
pub mod guest;
pub mod http_stub;
pub mod nbd_session;
pub mod qmp;

use std::io::{BufRead, BufReader, Read};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::thread;
use std::time::{Duration, Instant};

pub const KIB: u64 = 1024;
pub const MIB: u64 = 1024 * KIB;
pub const GIB: u64 = 1024 * MIB;

/// How long a server gets to print `ready` (or accept connections).
pub const READY_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a clean shutdown (SIGTERM) may take.
pub const STOP_TIMEOUT: Duration = Duration::from_secs(60);

/// The e2e tests are I/O and CPU heavy and the CI machine has 2 cores: tests
/// in one test binary take this lock so they never run concurrently (cargo
/// already runs test binaries one after another). Poisoning is ignored: a
/// failed test must not fail the next one.
pub fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// Path of the strata binary built by cargo for this test run.
pub fn strata_bin() -> &'static str {
    env!("CARGO_BIN_EXE_strata")
}

/// Panics with a clear message if a client tool is missing.
pub fn require_tools(tools: &[&str]) {
    for tool in tools {
        let found = std::env::var_os("PATH")
            .map(|paths| std::env::split_paths(&paths).any(|dir| dir.join(tool).is_file()))
            .unwrap_or(false)
            || Path::new("/usr/sbin").join(tool).is_file()
            || Path::new("/sbin").join(tool).is_file();
        assert!(
            found,
            "required tool `{tool}` not found in PATH; run scripts/install-test-deps"
        );
    }
}

/// Formats a size the way a user would type it on the command line.
pub fn size_arg(bytes: u64) -> String {
    if bytes >= GIB && bytes.trailing_zeros() >= 30 {
        format!("{}GiB", bytes / GIB)
    } else if bytes >= MIB && bytes.trailing_zeros() >= 20 {
        format!("{}MiB", bytes / MIB)
    } else {
        bytes.to_string()
    }
}

fn die_with_parent(cmd: &mut Command) {
    // SAFETY: prctl is async-signal-safe; it only sets a flag on the child.
    unsafe {
        cmd.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            Ok(())
        });
    }
}

/// `cmd` started the way systemd starts a socket-activated service:
/// `listeners` as descriptors 3, 4, ... in order, `LISTEN_FDS` = their
/// number and `LISTEN_PID` = the pid of the process (set by a shell that
/// then execs the command, keeping its pid).
fn socket_activated(
    cmd: &Command,
    listeners: Vec<Arc<std::os::unix::net::UnixListener>>,
) -> Command {
    use std::os::fd::AsRawFd;
    let count = listeners.len() as libc::c_int;
    let mut wrapped = Command::new("sh");
    wrapped
        .arg("-c")
        .arg(format!(
            r#"LISTEN_PID=$$ LISTEN_FDS={count} exec "$0" "$@""#
        ))
        .arg(cmd.get_program())
        .args(cmd.get_args());
    for (key, value) in cmd.get_envs() {
        match value {
            Some(value) => wrapped.env(key, value),
            None => wrapped.env_remove(key),
        };
    }
    let fds: Vec<libc::c_int> = listeners.iter().map(|l| l.as_raw_fd()).collect();
    // SAFETY: dup2, fcntl and close are async-signal-safe; the listeners
    // outlive the spawn (the closure owns references to them); `fds` is
    // allocated before the fork and only read after it.
    unsafe {
        wrapped.pre_exec(move || {
            let _keep = &listeners;
            // Each is first copied above the target range, so that placing
            // one never closes another still to be placed; dup2 onto
            // another number then clears close-on-exec on the copy.
            let mut moved = [0 as libc::c_int; 16];
            if fds.len() > moved.len() {
                return Err(std::io::Error::from_raw_os_error(libc::EMFILE));
            }
            for (i, fd) in fds.iter().enumerate() {
                moved[i] = libc::fcntl(*fd, libc::F_DUPFD_CLOEXEC, 3 + count);
                if moved[i] < 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            for (i, fd) in moved[..fds.len()].iter().enumerate() {
                if libc::dup2(*fd, 3 + i as libc::c_int) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                libc::close(*fd);
            }
            Ok(())
        });
    }
    wrapped
}

fn spawn_collector<R: Read + Send + 'static>(
    mut r: R,
    buf: Arc<Mutex<Vec<u8>>>,
) -> thread::JoinHandle<()> {
    thread::spawn(move || {
        let mut chunk = [0u8; 8192];
        loop {
            match r.read(&mut chunk) {
                Ok(0) | Err(_) => break,
                Ok(n) => buf
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .extend_from_slice(&chunk[..n]),
            }
        }
    })
}

fn text(buf: &Arc<Mutex<Vec<u8>>>) -> String {
    String::from_utf8_lossy(&buf.lock().unwrap_or_else(|e| e.into_inner())).into_owned()
}

fn tail(s: &str, max: usize) -> &str {
    if s.len() <= max {
        s
    } else {
        let mut start = s.len() - max;
        while !s.is_char_boundary(start) {
            start += 1;
        }
        &s[start..]
    }
}

/// Runs a command to completion with a timeout (the child is killed and the
/// test fails if it takes longer). stdin is /dev/null.
pub fn run_timeout(cmd: &mut Command, timeout: Duration) -> Output {
    run_timeout_from(cmd, Stdio::null(), timeout)
}

/// [`run_timeout`] with `stdin` as the command's standard input.
pub fn run_timeout_from(cmd: &mut Command, stdin: Stdio, timeout: Duration) -> Output {
    let desc = format!("{cmd:?}");
    cmd.stdin(stdin)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    die_with_parent(cmd);
    let mut child = cmd
        .spawn()
        .unwrap_or_else(|e| panic!("cannot spawn {desc}: {e}"));
    let out = Arc::new(Mutex::new(Vec::new()));
    let err = Arc::new(Mutex::new(Vec::new()));
    let so = child.stdout.take().expect("stdout piped");
    let se = child.stderr.take().expect("stderr piped");
    let (o2, e2) = (out.clone(), err.clone());
    let t1 = thread::spawn(move || {
        let mut r = so;
        let mut v = Vec::new();
        let _ = r.read_to_end(&mut v);
        o2.lock().unwrap_or_else(|e| e.into_inner()).extend(v);
    });
    let t2 = thread::spawn(move || {
        let mut r = se;
        let mut v = Vec::new();
        let _ = r.read_to_end(&mut v);
        e2.lock().unwrap_or_else(|e| e.into_inner()).extend(v);
    });
    let deadline = Instant::now() + timeout;
    let status = loop {
        if let Some(st) = child.try_wait().expect("try_wait") {
            break st;
        }
        if Instant::now() > deadline {
            kill_group(&child);
            let _ = child.wait();
            let _ = t1.join();
            let _ = t2.join();
            panic!(
                "{desc} timed out after {timeout:?}\n--- stdout ---\n{}\n--- stderr ---\n{}",
                tail(&text(&out), 4000),
                tail(&text(&err), 4000)
            );
        }
        thread::sleep(Duration::from_millis(10));
    };
    let _ = t1.join();
    let _ = t2.join();
    let stdout = std::mem::take(&mut *out.lock().unwrap_or_else(|e| e.into_inner()));
    let stderr = std::mem::take(&mut *err.lock().unwrap_or_else(|e| e.into_inner()));
    Output {
        status,
        stdout,
        stderr,
    }
}

/// Runs a command and asserts that it exits 0; returns its output.
pub fn run_ok(cmd: &mut Command, timeout: Duration) -> Output {
    let desc = format!("{cmd:?}");
    let out = run_timeout(cmd, timeout);
    assert!(
        out.status.success(),
        "{desc} failed with {}\n--- stdout ---\n{}\n--- stderr ---\n{}",
        out.status,
        tail(&String::from_utf8_lossy(&out.stdout), 6000),
        tail(&String::from_utf8_lossy(&out.stderr), 6000)
    );
    out
}

pub fn stdout_str(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

pub fn stderr_str(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The NBD URI of `export` on a unix socket.
pub fn nbd_uri(socket: &Path, export: &str) -> String {
    format!("nbd+unix:///{export}?socket={}", socket.display())
}

/// A Python 3 interpreter that has libnbd's binding (`import nbd`). Debian's
/// python3-libnbd installs into the system interpreter, which is not
/// necessarily the first `python3` in PATH (pyenv etc.).
pub fn python_with_nbd() -> &'static str {
    static PY: OnceLock<String> = OnceLock::new();
    PY.get_or_init(|| {
        for cand in ["/usr/bin/python3", "python3"] {
            let ok = Command::new(cand)
                .args(["-c", "import nbd"])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .map(|s| s.success())
                .unwrap_or(false);
            if ok {
                return cand.to_string();
            }
        }
        panic!("no python3 with libnbd's binding (module `nbd`); run scripts/install-test-deps")
    })
}

// ---------------------------------------------------------------------------
// Servers
// ---------------------------------------------------------------------------

/// What serves the export(s).
#[derive(Clone, Debug)]
pub enum Target {
    /// `strata serve` with its data dir in the test's temp dir and its store
    /// there too, or on S3 (MinIO) when `s3` is set. `extra` are appended to
    /// `strata serve` (e.g. `--write-buffer 64MiB`), `env` is set for it.
    Strata {
        extra: Vec<String>,
        s3: Option<S3Store>,
        env: Vec<(String, String)>,
    },
    /// `nbdkit memory SIZE`: RAM, lost on restart. Any export name works.
    NbdkitMemory,
    /// `nbdkit file DIR/peer.img`: survives restart and kill -9 (page cache).
    NbdkitFile,
}

impl Target {
    pub fn strata() -> Target {
        Target::strata_with(&[])
    }

    pub fn strata_with(extra: &[&str]) -> Target {
        Target::Strata {
            extra: extra.iter().map(|s| s.to_string()).collect(),
            s3: None,
            env: Vec::new(),
        }
    }

    /// strata with its volumes in `store` (an S3 bucket on MinIO).
    pub fn strata_s3(store: &S3Store, extra: &[&str]) -> Target {
        Target::Strata {
            extra: extra.iter().map(|s| s.to_string()).collect(),
            s3: Some(store.clone()),
            env: Vec::new(),
        }
    }

    /// The same target with more `strata serve` arguments.
    pub fn with_args(mut self, more: &[&str]) -> Target {
        if let Target::Strata { extra, .. } = &mut self {
            extra.extend(more.iter().map(|s| s.to_string()));
        }
        self
    }

    /// The same target with an extra environment variable for strata.
    pub fn with_env(mut self, key: &str, value: &str) -> Target {
        if let Target::Strata { env, .. } = &mut self {
            env.push((key.to_string(), value.to_string()));
        }
        self
    }

    /// The target of a test: strata, unless `STRATA_E2E_PEER=1` asks for the
    /// given peer (used to validate a test's plumbing without strata).
    pub fn under_test(strata: Target, peer: Target) -> Target {
        match std::env::var("STRATA_E2E_PEER").as_deref() {
            Ok("1") | Ok("true") => peer,
            _ => strata,
        }
    }

    pub fn is_strata(&self) -> bool {
        matches!(self, Target::Strata { .. })
    }

    /// The S3 store, for strata on MinIO.
    pub fn s3(&self) -> Option<&S3Store> {
        match self {
            Target::Strata { s3, .. } => s3.as_ref(),
            _ => None,
        }
    }
}

// ---------------------------------------------------------------------------
// S3 stores (MinIO, SeaweedFS)
// ---------------------------------------------------------------------------

/// Where a strata server keeps its volumes on S3: a fresh bucket on a
/// server of `strata-testkit` (the process-wide shared MinIO or SeaweedFS
/// cluster, or a MinIO cluster), and the environment (`AWS_*`) a client
/// needs to reach it.
#[derive(Clone, Debug)]
pub struct S3Store {
    pub bucket: String,
    /// Key prefix inside the bucket (no leading or trailing `/`).
    pub prefix: String,
    /// `http://127.0.0.1:PORT`.
    pub endpoint: String,
    pub env: Vec<(String, String)>,
}

impl S3Store {
    /// A fresh bucket on the S3 server shared by the tests of this process
    /// (started on first use, killed at exit): MinIO, or the implementation
    /// `STRATA_TEST_S3` names (`scripts/test` runs the S3 suites again on
    /// SeaweedFS that way).
    pub fn on_shared(prefix: &str) -> S3Store {
        Self::on(strata_testkit::S3Impl::from_env(), prefix)
    }

    /// A fresh bucket on the MinIO server shared by the tests of this
    /// process, whatever `STRATA_TEST_S3` says: for tests of MinIO itself
    /// or of what only it is set up for here.
    pub fn on_shared_minio(prefix: &str) -> S3Store {
        Self::on(strata_testkit::S3Impl::Minio, prefix)
    }

    fn on(implementation: strata_testkit::S3Impl, prefix: &str) -> S3Store {
        let server = implementation.shared();
        S3Store {
            bucket: server.fresh_bucket(),
            prefix: prefix.to_string(),
            endpoint: server.endpoint(),
            env: server.client_env(),
        }
    }

    /// A fresh bucket on a MinIO cluster; strata talks to node 1.
    pub fn on_cluster(cluster: &strata_testkit::MinioCluster, prefix: &str) -> S3Store {
        S3Store {
            bucket: cluster.fresh_bucket(),
            prefix: prefix.to_string(),
            endpoint: cluster.endpoint(),
            env: cluster.client_env(),
        }
    }

    /// A fresh bucket on a SeaweedFS cluster, through its S3 gateway.
    pub fn on_seaweed_cluster(cluster: &strata_testkit::SeaweedCluster, prefix: &str) -> S3Store {
        use strata_testkit::S3Service;
        S3Store {
            bucket: cluster.fresh_bucket(),
            prefix: prefix.to_string(),
            endpoint: cluster.endpoint(),
            env: cluster.client_env(),
        }
    }

    /// `s3://BUCKET/PREFIX`, what `--store` takes.
    pub fn url(&self) -> String {
        if self.prefix.is_empty() {
            format!("s3://{}", self.bucket)
        } else {
            format!("s3://{}/{}", self.bucket, self.prefix)
        }
    }

    /// The object keys under `PREFIX/<sub>` (e.g. `vol/segments/`), with
    /// their sizes, listed with curl (ListObjectsV2, every page).
    pub fn list(&self, sub: &str) -> Vec<(String, u64)> {
        let full = if self.prefix.is_empty() {
            sub.to_string()
        } else {
            format!("{}/{sub}", self.prefix)
        };
        let mut keys = Vec::new();
        let mut token: Option<String> = None;
        loop {
            let mut url = format!(
                "{}/{}?list-type=2&prefix={}",
                self.endpoint,
                self.bucket,
                url_encode(&full)
            );
            if let Some(t) = &token {
                url.push_str(&format!("&continuation-token={}", url_encode(t)));
            }
            let body = stdout_str(&self.curl(&url));
            for item in body.split("<Contents>").skip(1) {
                let key = xml_field(item, "Key").unwrap_or_default();
                let size = xml_field(item, "Size")
                    .and_then(|s| s.parse().ok())
                    .unwrap_or(0);
                keys.push((key, size));
            }
            match xml_field(&body, "NextContinuationToken") {
                Some(t) if xml_field(&body, "IsTruncated").as_deref() == Some("true") => {
                    token = Some(t)
                }
                _ => break,
            }
        }
        keys
    }

    /// Number and total size of the segment objects of `volume`.
    pub fn segments(&self, volume: &str) -> (usize, u64) {
        let segments = self.list(&format!("{volume}/segments/"));
        (segments.len(), segments.iter().map(|(_, size)| size).sum())
    }

    /// Writes `body` as the object `PREFIX/<sub>` (a signed PUT with
    /// curl), e.g. to damage an object on purpose.
    pub fn put(&self, sub: &str, body: &[u8]) {
        let file = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(file.path(), body).unwrap();
        let key = if self.prefix.is_empty() {
            sub.to_string()
        } else {
            format!("{}/{sub}", self.prefix)
        };
        let url = format!("{}/{}/{key}", self.endpoint, self.bucket);
        let data = format!("@{}", file.path().display());
        self.curl_with(&url, &["-X", "PUT", "--data-binary", &data]);
    }

    /// A signed GET with curl; panics unless it answers 2xx.
    fn curl(&self, url: &str) -> Output {
        self.curl_with(url, &[])
    }

    /// A signed request with curl and `extra` arguments; panics unless it
    /// answers 2xx.
    fn curl_with(&self, url: &str, extra: &[&str]) -> Output {
        let env: std::collections::HashMap<_, _> = self.env.iter().cloned().collect();
        let user = format!(
            "{}:{}",
            env["AWS_ACCESS_KEY_ID"], env["AWS_SECRET_ACCESS_KEY"]
        );
        let sigv4 = format!("aws:amz:{}:s3", env["AWS_REGION"]);
        run_ok(
            Command::new("curl")
                .args(["-sS", "--fail-with-body", "--max-time", "120"])
                .arg("--user")
                .arg(user)
                .arg("--aws-sigv4")
                .arg(sigv4)
                // curl signs the payload's hash without sending it; versitygw
                // (as AWS) refuses a request without the header.
                .args(["-H", "x-amz-content-sha256: UNSIGNED-PAYLOAD"])
                .args(extra)
                .arg(url),
            Duration::from_secs(150),
        )
    }
}

/// Percent-encodes everything but unreserved characters (for query values).
fn url_encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// The text of the first `<name>...</name>` in `xml`.
fn xml_field(xml: &str, name: &str) -> Option<String> {
    let open = format!("<{name}>");
    let start = xml.find(&open)? + open.len();
    let end = xml[start..].find(&format!("</{name}>"))? + start;
    Some(xml[start..end].to_string())
}

/// A running NBD server. Dropping it kills it (SIGKILL) and reaps it.
pub struct Server {
    pub target: Target,
    pub dir: PathBuf,
    pub socket: PathBuf,
    /// (name, size in bytes) of the volumes to serve / create.
    pub volumes: Vec<(String, u64)>,
    /// strata's `--data-dir`: `DIR/data` unless moved ("another host").
    data_dir: PathBuf,
    child: Option<Child>,
    stderr: Arc<Mutex<Vec<u8>>>,
    /// Length of `stderr` when the last start began.
    stderr_mark: usize,
    /// stdout lines printed before `ready` on the last start.
    pub banner: Vec<String>,
    starts: u32,
    stderr_shown: bool,
    /// The listening socket this harness holds and passes to every start
    /// (systemd socket activation): clients queue in it across restarts.
    held_socket: Option<Arc<std::os::unix::net::UnixListener>>,
    /// More sockets held and passed the same way, after `held_socket`
    /// (e.g. vhost-user-blk sockets): see [`Server::hold_extra_socket`].
    held_extra: Vec<Arc<std::os::unix::net::UnixListener>>,
    /// Reads the running server's stderr into `stderr`; done at its EOF.
    stderr_collector: Option<thread::JoinHandle<()>>,
    /// The command and its arguments after strata's global options:
    /// `serve` unless [`Server::start_csi`] made it `csi ...`.
    subcommand: Vec<String>,
}

impl Server {
    /// The address printed as `metrics http://ADDR/metrics` before `ready`
    /// (a server started with `--metrics-listen`).
    pub fn metrics_addr(&self) -> String {
        self.banner
            .iter()
            .find_map(|l| l.strip_prefix("metrics http://"))
            .and_then(|rest| rest.strip_suffix("/metrics"))
            .unwrap_or_else(|| panic!("no metrics line in {:?}", self.banner))
            .to_string()
    }

    /// Starts a server in `dir` (store, data dir and socket live there) and
    /// waits until it is ready. For strata the volumes are created with
    /// `--create NAME=SIZE`; for nbdkit the first volume's size is used.
    pub fn start(dir: &Path, target: Target, volumes: &[(&str, u64)]) -> Server {
        let mut s = Server::new(dir, target, volumes);
        s.launch();
        s
    }

    /// Like [`Server::start`], for a server that is expected to refuse to
    /// start: `Err` with its exit status and stderr when it exits before
    /// printing `ready`. Any other failure to start panics.
    pub fn try_start(
        dir: &Path,
        target: Target,
        volumes: &[(&str, u64)],
    ) -> Result<Server, (ExitStatus, String)> {
        let mut s = Server::new(dir, target, volumes);
        match s.try_launch() {
            Ok(()) => Ok(s),
            Err(LaunchError::Exited(st)) => {
                s.stderr_shown = true;
                let err = s.last_stderr();
                Err((st, err))
            }
            Err(LaunchError::Other(why)) => s.fail_start(&why),
        }
    }

    /// A server that is not started: for running the CLI on its store and
    /// data dir.
    pub fn new_stopped(dir: &Path, target: Target) -> Server {
        Server::new(dir, target, &[])
    }

    fn new(dir: &Path, target: Target, volumes: &[(&str, u64)]) -> Server {
        std::fs::create_dir_all(dir).expect("create the server's directory");
        Server {
            target,
            dir: dir.to_path_buf(),
            socket: dir.join("nbd.sock"),
            volumes: volumes.iter().map(|(n, s)| (n.to_string(), *s)).collect(),
            data_dir: dir.join("data"),
            child: None,
            stderr: Arc::new(Mutex::new(Vec::new())),
            stderr_mark: 0,
            banner: Vec::new(),
            starts: 0,
            stderr_shown: false,
            held_socket: None,
            held_extra: Vec::new(),
            stderr_collector: None,
            subcommand: vec!["serve".to_string()],
        }
    }

    /// Starts `strata csi CSI_ARGS...` (the NBD server of `strata serve`
    /// with the CSI endpoint beside it) in `dir` as [`Server::start`]
    /// starts `strata serve`, and waits until it is ready.
    pub fn start_csi(dir: &Path, target: Target, csi_args: &[&str]) -> Server {
        let mut s = Server::new(dir, target, &[]);
        s.subcommand = std::iter::once("csi")
            .chain(csi_args.iter().copied())
            .map(str::to_string)
            .collect();
        s.launch();
        s
    }

    /// From the next start on, the server gets its listening socket the
    /// way systemd passes it (`LISTEN_FDS=1`, `LISTEN_PID`, descriptor 3)
    /// instead of `--listen`: the harness binds `socket` once and keeps it
    /// across stops, kills and restarts, as systemd does.
    pub fn hold_socket(&mut self) {
        let _ = std::fs::remove_file(&self.socket);
        let listener = std::os::unix::net::UnixListener::bind(&self.socket)
            .unwrap_or_else(|e| panic!("bind {}: {e}", self.socket.display()));
        self.held_socket = Some(Arc::new(listener));
    }

    /// Binds one more listening socket at `path`, held like the one of
    /// [`Server::hold_socket`] and passed after it, in the order of the
    /// calls. strata serves a passed socket whose path is one of its
    /// vhost-user socket paths as that one (`--vhost-user-dir`,
    /// `--vhost-user-socket`).
    pub fn hold_extra_socket(&mut self, path: &Path) {
        let _ = std::fs::remove_file(path);
        let listener = std::os::unix::net::UnixListener::bind(path)
            .unwrap_or_else(|e| panic!("bind {}: {e}", path.display()));
        self.held_extra.push(Arc::new(listener));
    }

    pub fn store_dir(&self) -> PathBuf {
        self.dir.join("store")
    }

    pub fn data_dir(&self) -> PathBuf {
        self.data_dir.clone()
    }

    /// Uses `dir` as the data dir from the next start on (the server must
    /// be stopped): with a new, empty directory the server is "another
    /// host" with empty caches and journals, which only works when the
    /// store is shared (S3).
    pub fn set_data_dir(&mut self, dir: &Path) {
        assert!(self.child.is_none(), "server still running");
        self.data_dir = dir.to_path_buf();
    }

    /// Stops the server cleanly and starts it again with a new, empty data
    /// dir (`DIR/data-N`): everything it serves then comes from the store.
    pub fn restart_on_new_host(&mut self) {
        self.stop();
        let mut n = 2;
        while self.dir.join(format!("data-{n}")).exists() {
            n += 1;
        }
        let fresh = self.dir.join(format!("data-{n}"));
        self.set_data_dir(&fresh);
        eprintln!(
            "[harness] restarting on a new host (data dir {})",
            fresh.display()
        );
        self.start_again();
    }

    pub fn uri(&self, export: &str) -> String {
        nbd_uri(&self.socket, export)
    }

    /// URI of the first volume.
    pub fn vol_uri(&self) -> String {
        self.uri(&self.volumes[0].0)
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("server running").id()
    }

    /// Everything the server wrote on stderr so far (all starts).
    pub fn stderr(&self) -> String {
        text(&self.stderr)
    }

    /// What the server wrote on stderr since its last start began.
    pub fn last_stderr(&self) -> String {
        let buf = self.stderr.lock().unwrap_or_else(|e| e.into_inner());
        String::from_utf8_lossy(&buf[self.stderr_mark.min(buf.len())..]).into_owned()
    }

    /// Sends `signal` to the running server (e.g. SIGSTOP / SIGCONT).
    pub fn signal(&self, signal: libc::c_int) {
        let pid = self.pid() as libc::pid_t;
        // SAFETY: plain kill(2) on our own child.
        let rc = unsafe { libc::kill(pid, signal) };
        assert_eq!(rc, 0, "kill({pid}, {signal}) failed");
    }

    /// Runs the strata CLI (`strata --store .. --data-dir .. ARGS`) against
    /// this server's store and data dir, with its environment.
    pub fn cli(&self, args: &[&str]) -> Output {
        let Target::Strata { s3, env, .. } = &self.target else {
            panic!("the strata CLI needs a strata target");
        };
        let mut c = strata_command(s3.as_ref(), env);
        c.arg("--store")
            .arg(self.store_arg())
            .arg("--data-dir")
            .arg(self.data_dir())
            .args(args);
        run_timeout(&mut c, Duration::from_secs(60))
    }

    /// [`Server::cli`], which must succeed; its stdout.
    pub fn cli_ok(&self, args: &[&str]) -> String {
        let out = self.cli(args);
        assert!(
            out.status.success(),
            "strata {args:?} failed:\n{}{}",
            stdout_str(&out),
            stderr_str(&out)
        );
        stdout_str(&out)
    }

    /// Runs the CLI `args` against this server, which runs with
    /// `STRATA_CRASH_AT=point`: the command fails and the server aborts
    /// there (its stderr says so). The server is left stopped.
    pub fn expect_crash(&mut self, point: &str, args: &[&str]) {
        let out = self.cli(args);
        assert!(
            !out.status.success(),
            "{point}: {args:?} did not fail: {}",
            stdout_str(&out)
        );
        let status = self.wait_exit(Duration::from_secs(30));
        assert!(
            status.is_some_and(|s| !s.success()),
            "{point}: server did not abort: {status:?}"
        );
        assert!(
            self.stderr().contains(&format!("STRATA_CRASH_AT={point}")),
            "{point}: aborted elsewhere:\n{}",
            self.stderr()
        );
    }

    /// [`Server::cli`], which must fail; its stderr.
    pub fn cli_err(&self, args: &[&str]) -> String {
        let out = self.cli(args);
        assert!(!out.status.success(), "strata {args:?} succeeded");
        stderr_str(&out)
    }

    fn store_arg(&self) -> std::ffi::OsString {
        match self.target.s3() {
            Some(s3) => s3.url().into(),
            None => self.store_dir().into(),
        }
    }

    fn launch(&mut self) {
        match self.try_launch() {
            Ok(()) => {}
            Err(LaunchError::Exited(st)) => {
                self.fail_start(&format!("server exited during startup: {st}"))
            }
            Err(LaunchError::Other(why)) => self.fail_start(&why),
        }
    }

    fn try_launch(&mut self) -> Result<(), LaunchError> {
        self.starts += 1;
        let mut cmd = match &self.target {
            Target::Strata { extra, s3, env } => {
                let mut c = strata_command(s3.as_ref(), env);
                c.arg("--store")
                    .arg(self.store_arg())
                    .arg("--data-dir")
                    .arg(self.data_dir())
                    .args(&self.subcommand);
                if self.held_socket.is_none() {
                    c.arg("--listen")
                        .arg(format!("unix:{}", self.socket.display()));
                }
                for (name, size) in &self.volumes {
                    c.arg("--create").arg(format!("{name}={}", size_arg(*size)));
                }
                c.args(extra);
                let held: Vec<_> = self
                    .held_socket
                    .iter()
                    .chain(&self.held_extra)
                    .cloned()
                    .collect();
                if held.is_empty() {
                    c
                } else {
                    socket_activated(&c, held)
                }
            }
            Target::NbdkitMemory | Target::NbdkitFile => {
                // nbdkit refuses to start on a leftover socket.
                let _ = std::fs::remove_file(&self.socket);
                let size = self.volumes[0].1;
                let mut c = Command::new("nbdkit");
                c.arg("--foreground")
                    .arg("--exit-with-parent")
                    .arg("--unix")
                    .arg(&self.socket)
                    // Advertise block sizes like strata does.
                    .arg("--filter=blocksize-policy");
                if matches!(self.target, Target::NbdkitMemory) {
                    c.arg("memory").arg(size.to_string());
                } else {
                    let img = self.dir.join("peer.img");
                    if !img.exists() {
                        let f = std::fs::File::create(&img).expect("create peer.img");
                        f.set_len(size).expect("size peer.img");
                    }
                    c.arg("file").arg(&img);
                }
                c.args([
                    "blocksize-minimum=1",
                    "blocksize-preferred=4096",
                    "blocksize-maximum=33554432",
                ]);
                c
            }
        };
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        die_with_parent(&mut cmd);
        let desc = format!("{cmd:?}");
        let mut child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("cannot spawn {desc}: {e}"));
        {
            let mut e = self.stderr.lock().unwrap_or_else(|e| e.into_inner());
            self.stderr_mark = e.len();
            e.extend_from_slice(format!("=== start #{}: {desc}\n", self.starts).as_bytes());
        }
        self.stderr_collector = Some(spawn_collector(
            child.stderr.take().expect("stderr piped"),
            self.stderr.clone(),
        ));
        let stdout = child.stdout.take().expect("stdout piped");
        let (tx, rx) = mpsc::channel::<String>();
        thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    // Keep draining so the server never blocks on stdout.
                    continue;
                }
            }
        });
        self.child = Some(child);
        let t0 = Instant::now();
        self.banner.clear();
        if self.target.is_strata() {
            loop {
                let left = READY_TIMEOUT.saturating_sub(t0.elapsed());
                match rx.recv_timeout(left.max(Duration::from_millis(1))) {
                    Ok(line) if line.trim() == "ready" => break,
                    Ok(line) => self.banner.push(line),
                    Err(mpsc::RecvTimeoutError::Timeout) => {
                        return Err(LaunchError::Other(format!(
                            "no `ready` line on stdout within {READY_TIMEOUT:?}"
                        )))
                    }
                    Err(mpsc::RecvTimeoutError::Disconnected) => {
                        // stdout closed: the server exited.
                        return match self.wait_exit(Duration::from_secs(5)) {
                            Some(st) => {
                                // Let the stderr collector catch up.
                                thread::sleep(Duration::from_millis(100));
                                Err(LaunchError::Exited(st))
                            }
                            None => Err(LaunchError::Other(
                                "server closed stdout before printing `ready` and kept running"
                                    .to_string(),
                            )),
                        };
                    }
                }
            }
            // Keep draining stdout in the background (the channel's receiver
            // is dropped; the reader thread ignores send errors).
            drop(rx);
        } else {
            loop {
                if std::os::unix::net::UnixStream::connect(&self.socket).is_ok() {
                    break;
                }
                if let Some(st) = self
                    .child
                    .as_mut()
                    .and_then(|c| c.try_wait().ok().flatten())
                {
                    self.child = None;
                    return Err(LaunchError::Exited(st));
                }
                if t0.elapsed() > READY_TIMEOUT {
                    return Err(LaunchError::Other(
                        "socket never accepted connections".to_string(),
                    ));
                }
                thread::sleep(Duration::from_millis(20));
            }
        }
        eprintln!(
            "[harness] {} ready in {:.2?} (start #{})",
            self.kind(),
            t0.elapsed(),
            self.starts
        );
        Ok(())
    }

    fn kind(&self) -> &'static str {
        match self.target {
            Target::Strata { s3: None, .. } => "strata",
            Target::Strata { s3: Some(_), .. } => "strata (S3)",
            Target::NbdkitMemory => "nbdkit-memory",
            Target::NbdkitFile => "nbdkit-file",
        }
    }

    fn fail_start(&mut self, why: &str) -> ! {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        thread::sleep(Duration::from_millis(100)); // let the collector finish
        self.stderr_shown = true;
        panic!(
            "{} failed to start: {why}\n--- server stderr ---\n{}",
            self.kind(),
            tail(&self.stderr(), 8000)
        );
    }

    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let child = self.child.as_mut()?;
        let t0 = Instant::now();
        loop {
            if let Ok(Some(st)) = child.try_wait() {
                self.child = None;
                self.drain_stderr();
                return Some(st);
            }
            if t0.elapsed() > timeout {
                return None;
            }
            thread::sleep(Duration::from_millis(10));
        }
    }

    /// Waits (up to 5 s) until the collector has read the exited server's
    /// stderr to its end, so what it wrote last (an abort message) is in
    /// `stderr()` when the caller looks.
    fn drain_stderr(&mut self) {
        let Some(collector) = self.stderr_collector.take() else {
            return;
        };
        let t0 = Instant::now();
        while !collector.is_finished() && t0.elapsed() < Duration::from_secs(5) {
            thread::sleep(Duration::from_millis(5));
        }
    }

    /// Asserts the server process is still alive.
    pub fn assert_alive(&mut self) {
        let child = self.child.as_mut().expect("server was stopped");
        if let Ok(Some(st)) = child.try_wait() {
            self.child = None;
            thread::sleep(Duration::from_millis(100));
            self.stderr_shown = true;
            panic!(
                "server exited unexpectedly ({st})\n--- server stderr ---\n{}",
                tail(&self.stderr(), 8000)
            );
        }
    }

    /// Crash: SIGKILL and reap.
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Clean shutdown: SIGTERM, wait; asserts exit status 0.
    pub fn stop(&mut self) {
        self.stop_with(libc::SIGTERM);
    }

    /// Clean shutdown with `signal` (SIGTERM or SIGINT); asserts exit 0.
    pub fn stop_with(&mut self, signal: libc::c_int) {
        let Some(child) = self.child.as_ref() else {
            return;
        };
        let pid = child.id() as libc::pid_t;
        // SAFETY: plain kill(2) on our own child.
        unsafe {
            libc::kill(pid, signal);
        }
        match self.wait_exit(STOP_TIMEOUT) {
            Some(st) => {
                if !st.success() {
                    thread::sleep(Duration::from_millis(100));
                    self.stderr_shown = true;
                    panic!(
                        "{} did not exit 0 on signal {signal}: {st}\n--- server stderr ---\n{}",
                        self.kind(),
                        tail(&self.stderr(), 8000)
                    );
                }
            }
            None => {
                self.kill9();
                self.stderr_shown = true;
                panic!(
                    "{} did not exit within {STOP_TIMEOUT:?} of signal {signal}\n--- server stderr ---\n{}",
                    self.kind(),
                    tail(&self.stderr(), 8000)
                );
            }
        }
    }

    /// Starts the server again with the same arguments (after stop/kill9).
    pub fn start_again(&mut self) {
        assert!(self.child.is_none(), "server still running");
        self.launch();
    }

    /// Like [`Server::start_again`], for a start that may be refused: `Err`
    /// with the exit status and the stderr of this start when the server
    /// exits before printing `ready`.
    pub fn try_start_again(&mut self) -> Result<(), (ExitStatus, String)> {
        assert!(self.child.is_none(), "server still running");
        match self.try_launch() {
            Ok(()) => Ok(()),
            Err(LaunchError::Exited(st)) => Err((st, self.last_stderr())),
            Err(LaunchError::Other(why)) => self.fail_start(&why),
        }
    }

    /// Sends `signal` (SIGTERM, SIGINT) and returns the exit status, whatever
    /// it is; panics (after SIGKILL) if the server does not exit in time.
    pub fn stop_status(&mut self, signal: libc::c_int) -> ExitStatus {
        let pid = self.pid() as libc::pid_t;
        // SAFETY: plain kill(2) on our own child.
        unsafe {
            libc::kill(pid, signal);
        }
        match self.wait_exit(STOP_TIMEOUT) {
            Some(st) => st,
            None => {
                self.kill9();
                self.stderr_shown = true;
                panic!(
                    "{} did not exit within {STOP_TIMEOUT:?} of signal {signal}\n--- server stderr ---\n{}",
                    self.kind(),
                    tail(&self.stderr(), 8000)
                );
            }
        }
    }

    /// Clean restart (SIGTERM, start).
    pub fn restart(&mut self) {
        self.stop();
        self.start_again();
    }

    /// Crash restart (SIGKILL, start): the server must recover.
    pub fn crash_restart(&mut self) {
        self.kill9();
        self.start_again();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill9();
        if thread::panicking() && !self.stderr_shown && self.starts > 0 {
            eprintln!(
                "--- {} stderr (test failed) ---\n{}",
                self.kind(),
                tail(&self.stderr(), 8000)
            );
        }
    }
}

/// A TCP port on 127.0.0.1 that was free a moment ago.
pub fn free_tcp_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
    l.local_addr().expect("local_addr").port()
}

/// Why a server did not start.
enum LaunchError {
    /// It exited (e.g. refused to serve a volume another server holds).
    Exited(ExitStatus),
    Other(String),
}

/// A `strata` command with a clean environment: no `STRATA_*` settings
/// from the caller, and S3 pointed at `s3`'s MinIO, or (without S3) at a
/// closed local port so nothing ever reaches the internet. `env` last.
pub fn strata_command(s3: Option<&S3Store>, env: &[(String, String)]) -> Command {
    let mut c = Command::new(strata_bin());
    c.env_remove("STRATA_STORE")
        .env_remove("STRATA_DATA_DIR")
        .env_remove("STRATA_FAULTS")
        .env_remove("STRATA_UNSAFE_SINGLE_HOST")
        .env_remove("AWS_PROFILE")
        .env_remove("AWS_CA_BUNDLE")
        .env_remove("AWS_SESSION_TOKEN")
        .env_remove("AWS_METADATA_ENDPOINT")
        .env_remove("AWS_EC2_METADATA_SERVICE_ENDPOINT")
        // No test asks 169.254.169.254, on an EC2 machine or not: those
        // that test instance metadata point AWS_METADATA_ENDPOINT at a
        // stub on 127.0.0.1 and turn this off.
        .env("AWS_EC2_METADATA_DISABLED", "true")
        .env("RUST_BACKTRACE", "1");
    match s3 {
        Some(s3) => {
            c.envs(s3.env.iter().map(|(k, v)| (k, v)));
        }
        None => {
            c.env("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
                .env("AWS_ENDPOINT", "http://127.0.0.1:9")
                .env("AWS_ALLOW_HTTP", "true")
                .env("AWS_REGION", "us-east-1")
                .env("AWS_ACCESS_KEY_ID", "strata-e2e-dummy")
                .env("AWS_SECRET_ACCESS_KEY", "strata-e2e-dummy");
        }
    }
    c.envs(env.iter().map(|(k, v)| (k, v)));
    c
}

/// Runs the strata CLI against the given store/data dir (no server needed).
pub fn strata_cli(store: &Path, data_dir: &Path, args: &[&str]) -> Output {
    let mut c = strata_command(None, &[]);
    c.arg("--store")
        .arg(store)
        .arg("--data-dir")
        .arg(data_dir)
        .args(args);
    run_timeout(&mut c, Duration::from_secs(60))
}

// ---------------------------------------------------------------------------
// Background processes and mount guards
// ---------------------------------------------------------------------------

/// A background child (fio load, writer script, nbdfuse). Killed on drop.
pub struct BgProcess {
    pub name: String,
    child: Option<Child>,
    stdout: Arc<Mutex<Vec<u8>>>,
    stderr: Arc<Mutex<Vec<u8>>>,
}

impl BgProcess {
    /// Spawns `cmd` in its own process group; `kill` (and drop) kill the
    /// whole group, so helpers it forks (fio's job processes) go too.
    pub fn spawn(name: &str, cmd: &mut Command) -> BgProcess {
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0);
        die_with_parent(cmd);
        let desc = format!("{cmd:?}");
        let mut child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("cannot spawn {desc}: {e}"));
        let stdout = Arc::new(Mutex::new(Vec::new()));
        let stderr = Arc::new(Mutex::new(Vec::new()));
        spawn_collector(child.stdout.take().expect("piped"), stdout.clone());
        spawn_collector(child.stderr.take().expect("piped"), stderr.clone());
        BgProcess {
            name: name.to_string(),
            child: Some(child),
            stdout,
            stderr,
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    pub fn stdout(&self) -> String {
        text(&self.stdout)
    }

    pub fn stderr(&self) -> String {
        text(&self.stderr)
    }

    /// Exit status if it has exited.
    pub fn try_status(&mut self) -> Option<ExitStatus> {
        self.child
            .as_mut()
            .and_then(|c| c.try_wait().ok().flatten())
    }

    /// Waits for exit up to `timeout`; kills it and panics on timeout.
    pub fn wait(&mut self, timeout: Duration) -> ExitStatus {
        let t0 = Instant::now();
        loop {
            if let Some(st) = self.try_status() {
                self.child = None;
                thread::sleep(Duration::from_millis(50)); // collectors
                return st;
            }
            if t0.elapsed() > timeout {
                self.kill();
                panic!(
                    "{} did not exit within {timeout:?}\n--- stderr ---\n{}",
                    self.name,
                    tail(&self.stderr(), 4000)
                );
            }
            thread::sleep(Duration::from_millis(10));
        }
    }

    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            kill_group(&c);
            let _ = c.wait();
        }
    }
}

/// SIGKILL to the process group led by `child` (spawned with
/// `process_group(0)`), or to the child alone if it already exited.
fn kill_group(child: &Child) {
    let pid = child.id() as libc::pid_t;
    // SAFETY: kill(2) on a process group we created (pgid = our child's pid).
    unsafe {
        if libc::kill(-pid, libc::SIGKILL) != 0 {
            libc::kill(pid, libc::SIGKILL);
        }
    }
}

impl Drop for BgProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The export as a regular file through nbdfuse (`DIR/nbd`).
pub struct FuseFile {
    pub mountpoint: PathBuf,
    pub file: PathBuf,
    proc_: BgProcess,
}

impl FuseFile {
    pub fn mount(mountpoint: &Path, uri: &str) -> FuseFile {
        std::fs::create_dir_all(mountpoint).expect("mkdir fuse mountpoint");
        let pidfile = mountpoint.with_extension("pid");
        let _ = std::fs::remove_file(&pidfile);
        let file = mountpoint.join("nbd");
        // nbdfuse MOUNTPOINT/FILENAME URI; the pidfile appears once the FUSE
        // mount is ready.
        let mut proc_ = BgProcess::spawn(
            "nbdfuse",
            Command::new("nbdfuse")
                .arg("-P")
                .arg(&pidfile)
                .arg(&file)
                .arg(uri),
        );
        let t0 = Instant::now();
        loop {
            if pidfile.exists() && file.exists() {
                break;
            }
            if let Some(st) = proc_.try_status() {
                panic!("nbdfuse exited ({st}): {}", proc_.stderr());
            }
            assert!(
                t0.elapsed() < Duration::from_secs(30),
                "nbdfuse not ready after 30 s: {}",
                proc_.stderr()
            );
            thread::sleep(Duration::from_millis(20));
        }
        FuseFile {
            mountpoint: mountpoint.to_path_buf(),
            file,
            proc_,
        }
    }

    /// Unmounts and waits for nbdfuse to exit; asserts both succeed.
    pub fn unmount(mut self) {
        run_ok(
            Command::new("fusermount3").arg("-u").arg(&self.mountpoint),
            Duration::from_secs(60),
        );
        let st = self.proc_.wait(Duration::from_secs(60));
        assert!(
            st.success(),
            "nbdfuse exited with {st}: {}",
            self.proc_.stderr()
        );
    }
}

impl Drop for FuseFile {
    fn drop(&mut self) {
        if self.proc_.child.is_some() {
            let _ = Command::new("fusermount3")
                .arg("-u")
                .arg(&self.mountpoint)
                .stderr(Stdio::null())
                .status();
            if self.proc_.try_status().is_none() {
                let _ = Command::new("fusermount3")
                    .arg("-uz")
                    .arg(&self.mountpoint)
                    .stderr(Stdio::null())
                    .status();
            }
            self.proc_.kill();
        }
    }
}

/// A loop device attached to a file.
pub struct LoopDev {
    pub dev: String,
    attached: bool,
}

impl LoopDev {
    pub fn attach(file: &Path) -> LoopDev {
        let out = run_ok(
            Command::new("losetup").args(["--find", "--show"]).arg(file),
            Duration::from_secs(60),
        );
        let dev = stdout_str(&out).trim().to_string();
        assert!(dev.starts_with("/dev/loop"), "losetup printed {dev:?}");
        LoopDev {
            dev,
            attached: true,
        }
    }

    pub fn detach(mut self) {
        self.attached = false;
        run_ok(
            Command::new("losetup").arg("-d").arg(&self.dev),
            Duration::from_secs(60),
        );
    }
}

impl Drop for LoopDev {
    fn drop(&mut self) {
        if self.attached {
            let _ = Command::new("losetup")
                .arg("-d")
                .arg(&self.dev)
                .stderr(Stdio::null())
                .status();
        }
    }
}

/// A mounted filesystem.
pub struct Mount {
    pub dir: PathBuf,
    mounted: bool,
}

impl Mount {
    pub fn mount_dev(dev: &str, dir: &Path) -> Mount {
        std::fs::create_dir_all(dir).expect("mkdir mountpoint");
        run_ok(
            Command::new("mount").arg(dev).arg(dir),
            Duration::from_secs(60),
        );
        Mount {
            dir: dir.to_path_buf(),
            mounted: true,
        }
    }

    pub fn unmount(mut self) {
        self.mounted = false;
        run_ok(
            Command::new("umount").arg(&self.dir),
            Duration::from_secs(120),
        );
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        if self.mounted {
            let ok = Command::new("umount")
                .arg(&self.dir)
                .stderr(Stdio::null())
                .status()
                .map(|s| s.success())
                .unwrap_or(false);
            if !ok {
                let _ = Command::new("umount").arg("-l").arg(&self.dir).status();
            }
        }
    }
}

// ---------------------------------------------------------------------------
// Client helpers
// ---------------------------------------------------------------------------

/// `nbdinfo --json URI`, parsed; returns the first export object.
pub fn nbdinfo_json(uri: &str) -> serde_json::Value {
    let out = run_ok(
        Command::new("nbdinfo").arg("--json").arg(uri),
        Duration::from_secs(60),
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "nbdinfo --json output is not JSON ({e}): {}",
            stdout_str(&out)
        )
    });
    v["exports"][0].clone()
}

/// One extent of `nbdinfo --map --json`.
#[derive(Clone, Debug)]
pub struct Extent {
    pub offset: u64,
    pub length: u64,
    /// base:allocation flags: bit 0 = hole, bit 1 = zero.
    pub ty: u64,
}

pub fn nbdinfo_map(uri: &str) -> Vec<Extent> {
    let out = run_ok(
        Command::new("nbdinfo").args(["--map", "--json"]).arg(uri),
        Duration::from_secs(120),
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "nbdinfo --map --json is not JSON ({e}): {}",
            stdout_str(&out)
        )
    });
    v.as_array()
        .expect("map is an array")
        .iter()
        .map(|e| Extent {
            offset: e["offset"].as_u64().expect("offset"),
            length: e["length"].as_u64().expect("length"),
            ty: e["type"].as_u64().expect("type"),
        })
        .collect()
}

/// Runs fio in `dir` (it leaves state files in its working directory) with
/// `--output-format=json`, asserts exit 0 and that no job reports an error;
/// returns the `jobs` array.
pub fn fio_json(dir: &Path, args: &[String], timeout: Duration) -> Vec<serde_json::Value> {
    let out = run_timeout(
        Command::new("fio")
            .current_dir(dir)
            // Jobs as threads: one process to watch and to kill.
            .arg("--thread")
            .arg("--output-format=json")
            .args(args),
        timeout,
    );
    let so = stdout_str(&out);
    // fio may print warnings before the JSON document.
    let start = so.find('{').unwrap_or(0);
    let v: Result<serde_json::Value, _> = serde_json::from_str(&so[start..]);
    assert!(
        out.status.success(),
        "fio failed ({})\n--- stdout ---\n{}\n--- stderr ---\n{}",
        out.status,
        tail(&so, 6000),
        tail(&stderr_str(&out), 4000)
    );
    let v = v.unwrap_or_else(|e| panic!("fio output is not JSON ({e}): {}", tail(&so, 4000)));
    let jobs = v["jobs"].as_array().expect("fio json has jobs").clone();
    for j in &jobs {
        assert_eq!(
            j["error"].as_i64(),
            Some(0),
            "fio job {} reported error {}\n{}",
            j["jobname"],
            j["error"],
            tail(&stderr_str(&out), 4000)
        );
    }
    jobs
}

/// Reads `/proc/PID/status` fields VmRSS and VmHWM in bytes.
pub fn rss_hwm(pid: u32) -> Option<(u64, u64)> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |name: &str| -> Option<u64> {
        let line = s.lines().find(|l| l.starts_with(name))?;
        let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
        Some(kb * 1024)
    };
    Some((field("VmRSS:")?, field("VmHWM:")?))
}

/// Deterministic PRNG (xorshift64*), so generated images are reproducible.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }

    pub fn fill(&mut self, buf: &mut [u8]) {
        for chunk in buf.chunks_mut(8) {
            let v = self.next_u64().to_le_bytes();
            chunk.copy_from_slice(&v[..chunk.len()]);
        }
    }
}

/// Compares two files with `cmp`; panics with cmp's message if they differ.
pub fn assert_cmp(a: &Path, b: &Path) {
    let out = run_timeout(Command::new("cmp").arg(a).arg(b), Duration::from_secs(300));
    assert!(
        out.status.success(),
        "{} and {} differ: {}{}",
        a.display(),
        b.display(),
        stdout_str(&out),
        stderr_str(&out)
    );
}
