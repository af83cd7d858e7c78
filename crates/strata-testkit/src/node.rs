//! One server process of a test store (MinIO, SeaweedFS).
//!
//! This module owns a server process's life: how it was started (so it can
//! be started again the same way), killing it, waiting for its health
//! endpoint, and the tail of its log for failure messages.
//! [`crate::MinioServer`] is one node; [`crate::MinioCluster`] is four;
//! [`crate::SeaweedCluster`] is six of four kinds.

use std::io;
use std::path::{Path, PathBuf};
use std::process::{Child, ExitStatus};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::keeper::{self, Spawn};
use crate::s3;

/// How long a server or cluster gets to become healthy. A cold MinIO takes a
/// few seconds; the slack is for a 2-core machine busy compiling.
pub(crate) const HEALTHY_TIMEOUT: Duration = Duration::from_secs(60);

/// Pause between health probes.
const POLL_INTERVAL: Duration = Duration::from_millis(100);

/// The health endpoint that answers 200 only once the server (or, for a
/// cluster, enough drives for write quorum) can serve requests. `/ready` is
/// not it: that one reports the process is up, not that its drives are.
pub(crate) const HEALTH_PATH: &str = "/minio/health/cluster";

pub(crate) struct Node {
    spawn: Spawn,
    /// `http(s)://127.0.0.1:PORT`.
    base_url: String,
    /// The path under `base_url` that answers 200 once the node serves.
    health_path: &'static str,
    /// CA bundle that verifies the node's certificate (TLS only).
    ca: Option<PathBuf>,
    /// `None` once killed.
    child: Mutex<Option<Child>>,
}

/// Why a node did not become healthy.
pub(crate) enum NotHealthy {
    /// The process exited first.
    Exited(ExitStatus),
    /// The deadline passed; the health path asked, and the last status it
    /// gave.
    Timeout(Duration, &'static str, Option<u16>),
}

impl std::fmt::Display for NotHealthy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NotHealthy::Exited(status) => write!(f, "exited ({status}) before it became healthy"),
            NotHealthy::Timeout(after, path, None) => {
                write!(f, "was not healthy within {after:?}: {path} never answered")
            }
            NotHealthy::Timeout(after, path, Some(code)) => {
                write!(
                    f,
                    "was not healthy within {after:?}: {path} last answered {code}"
                )
            }
        }
    }
}

impl Node {
    /// Starts a MinIO process (not waiting for it to be healthy).
    pub(crate) fn start(spawn: Spawn, base_url: String, ca: Option<PathBuf>) -> io::Result<Node> {
        Node::start_with_health(spawn, base_url, ca, HEALTH_PATH)
    }

    /// Starts a process whose health endpoint is `health_path` (not
    /// waiting for it to be healthy).
    pub(crate) fn start_with_health(
        spawn: Spawn,
        base_url: String,
        ca: Option<PathBuf>,
        health_path: &'static str,
    ) -> io::Result<Node> {
        let child = keeper::spawn(spawn.clone())?;
        Ok(Node {
            spawn,
            base_url,
            health_path,
            ca,
            child: Mutex::new(Some(child)),
        })
    }

    pub(crate) fn base_url(&self) -> &str {
        &self.base_url
    }

    pub(crate) fn ca(&self) -> Option<&Path> {
        self.ca.as_deref()
    }

    pub(crate) fn log_path(&self) -> &Path {
        &self.spawn.log
    }

    pub(crate) fn pid(&self) -> Option<u32> {
        self.lock().as_ref().map(Child::id)
    }

    /// SIGKILL and reap. Idempotent.
    pub(crate) fn kill(&self) {
        if let Some(mut child) = self.lock().take() {
            // Errors mean it is already dead; wait reaps it either way.
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Like [`Node::kill`], but gives up when another thread holds the
    /// child: for the process exit handler, which must never block (the
    /// child's PDEATHSIG kills it then anyway).
    pub(crate) fn kill_nonblocking(&self) {
        let mut guard = match self.child.try_lock() {
            Ok(guard) => guard,
            Err(std::sync::TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => return,
        };
        if let Some(mut child) = guard.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the process again with the same arguments, environment and log
    /// (appended to). The node must have been killed.
    pub(crate) fn restart(&self) -> io::Result<()> {
        let mut child = self.lock();
        if child.is_some() {
            return Err(io::Error::other("node is still running; kill it first"));
        }
        *child = Some(keeper::spawn(self.spawn.clone())?);
        Ok(())
    }

    /// The exit status if the process has exited (and is now reaped).
    pub(crate) fn exited(&self) -> Option<ExitStatus> {
        let mut child = self.lock();
        let status = child.as_mut().and_then(|c| c.try_wait().ok().flatten());
        if status.is_some() {
            *child = None;
        }
        status
    }

    /// Status of this node's health endpoint, `None` if no answer.
    pub(crate) fn health(&self) -> Option<u16> {
        s3::http_status(&format!("{}{}", self.base_url, self.health_path), self.ca())
    }

    /// The last lines of the node's log, for panic messages.
    pub(crate) fn log_tail(&self) -> String {
        log_tail(&self.spawn.log)
    }

    fn lock(&self) -> MutexGuard<'_, Option<Child>> {
        // A panic while holding the lock leaves the Option consistent.
        self.child
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Polls until every node in `nodes` answers 200 on its health endpoint.
/// Fails with the index (into `nodes`) of the node at fault when one exits
/// first, or of the first unhealthy one when `timeout` passes.
pub(crate) fn wait_healthy(nodes: &[&Node], timeout: Duration) -> Result<(), (usize, NotHealthy)> {
    let deadline = Instant::now() + timeout;
    loop {
        for (i, node) in nodes.iter().enumerate() {
            if let Some(status) = node.exited() {
                return Err((i, NotHealthy::Exited(status)));
            }
        }
        let mut unhealthy = None;
        for (i, node) in nodes.iter().enumerate() {
            let code = node.health();
            if code != Some(200) {
                unhealthy = Some((i, node.health_path, code));
                break;
            }
        }
        let Some((i, path, code)) = unhealthy else {
            return Ok(());
        };
        if Instant::now() >= deadline {
            return Err((i, NotHealthy::Timeout(timeout, path, code)));
        }
        std::thread::sleep(POLL_INTERVAL);
    }
}

/// A TCP port on 127.0.0.1 nothing listens on right now. Racy by nature
/// (someone may take it before the server binds it); callers retry when
/// the server reports the address in use.
pub(crate) fn free_port() -> io::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// `n` distinct TCP ports on 127.0.0.1 nothing listens on right now (all
/// bound at once, so the OS cannot hand out one twice). Racy like
/// [`free_port`].
pub(crate) fn free_ports(n: usize) -> io::Result<Vec<u16>> {
    let listeners = (0..n)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0"))
        .collect::<io::Result<Vec<_>>>()?;
    listeners
        .iter()
        .map(|l| Ok(l.local_addr()?.port()))
        .collect()
}

/// The last 40 lines of a log file.
pub(crate) fn log_tail(path: &Path) -> String {
    match std::fs::read(path) {
        Ok(bytes) => {
            let text = String::from_utf8_lossy(&bytes);
            let lines: Vec<&str> = text.lines().collect();
            let start = lines.len().saturating_sub(40);
            format!(
                "--- last lines of {} ---\n{}",
                path.display(),
                lines[start..].join("\n")
            )
        }
        Err(e) => format!("(cannot read {}: {e})", path.display()),
    }
}
