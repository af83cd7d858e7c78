//! The `strata` processes of the power-loss loop: the server (started,
//! waited for until `ready`, killed with SIGKILL) and one-shot commands
//! (volume create, snapshots, clones, fsck), all with the same store, data
//! dir and environment.

use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long a server may take to answer `ready` after a power cut (a
/// journal replay, a lease taken over).
const READY_TIMEOUT: Duration = Duration::from_secs(60);
/// How much of a log a failure quotes.
const LOG_TAIL_BYTES: u64 = 4000;

/// What every `strata` invocation of the loop shares.
#[derive(Debug, Clone)]
pub(crate) struct Strata {
    pub bin: PathBuf,
    pub store: String,
    pub data_dir: PathBuf,
    pub env: Vec<(String, String)>,
    /// Appended to by every process (stderr).
    pub log: PathBuf,
}

/// A running `strata serve`.
pub(crate) struct Server {
    child: Child,
}

impl Strata {
    fn command(&self) -> Result<Command, String> {
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .map_err(|e| format!("open {}: {e}", self.log.display()))?;
        let mut cmd = Command::new(&self.bin);
        cmd.arg("--store")
            .arg(&self.store)
            .arg("--data-dir")
            .arg(&self.data_dir)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stderr(log);
        Ok(cmd)
    }

    /// Runs a one-shot command; its stdout, or an error quoting the log.
    pub fn run(&self, args: &[&str]) -> Result<String, String> {
        let out = self
            .command()?
            .args(args)
            .stdout(Stdio::piped())
            .output()
            .map_err(|e| format!("run {}: {e}", self.bin.display()))?;
        if !out.status.success() {
            return Err(format!(
                "`strata {}` failed ({}); log tail:\n{}",
                args.join(" "),
                out.status,
                log_tail(&self.log)
            ));
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Starts `strata serve` and waits until it prints `ready`.
    pub fn serve(&self, socket: &Path, extra: &[String]) -> Result<Server, String> {
        let mut child = self
            .command()?
            .arg("serve")
            .arg("--listen")
            .arg(format!("unix:{}", socket.display()))
            .args(extra)
            .stdout(Stdio::piped())
            .spawn()
            .map_err(|e| format!("start {}: {e}", self.bin.display()))?;
        let Some(stdout) = child.stdout.take() else {
            return Err("serve: no stdout".into());
        };
        let (tx, rx) = std::sync::mpsc::channel();
        // Read to the end: a server whose stdout is closed would fail on
        // its next line.
        std::thread::spawn(move || {
            let mut told = false;
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if !told && line.trim() == "ready" {
                    told = tx.send(true).is_ok();
                }
            }
            if !told {
                let _ = tx.send(false);
            }
        });
        let mut server = Server { child };
        match rx.recv_timeout(READY_TIMEOUT) {
            Ok(true) => Ok(server),
            Ok(false) => {
                let status = server.child.wait().map(|s| s.to_string());
                Err(format!(
                    "the server exited before `ready` ({}); it did not start without manual repair; log tail:\n{}",
                    status.unwrap_or_else(|e| e.to_string()),
                    log_tail(&self.log)
                ))
            }
            Err(_) => {
                server.kill();
                Err(format!(
                    "the server was not ready within {READY_TIMEOUT:?}; log tail:\n{}",
                    log_tail(&self.log)
                ))
            }
        }
    }
}

impl Server {
    /// SIGKILL, and reaped.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGTERM and waited for (a clean stop).
    pub fn stop(&mut self) -> Result<(), String> {
        let Ok(pid) = libc::pid_t::try_from(self.child.id()) else {
            return Err("pid out of range".into());
        };
        // SAFETY: kill(2) on the pid of a child this struct owns and has not
        // reaped; no memory is passed.
        unsafe { libc::kill(pid, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            match self.child.try_wait() {
                Ok(Some(_)) => return Ok(()),
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(20))
                }
                _ => {
                    self.kill();
                    return Err("the server did not stop within 30 s of SIGTERM".into());
                }
            }
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The last few KiB of a log file.
pub(crate) fn log_tail(path: &Path) -> String {
    let Ok(mut f) = File::open(path) else {
        return format!("(no log at {})", path.display());
    };
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    let _ = f.seek(SeekFrom::Start(len.saturating_sub(LOG_TAIL_BYTES)));
    let mut bytes = Vec::new();
    let _ = f.read_to_end(&mut bytes);
    String::from_utf8_lossy(&bytes).into_owned()
}
