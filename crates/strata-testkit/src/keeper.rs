//! Spawning MinIO processes that die with the test process.
//!
//! This module owns the one "keeper" thread every MinIO child is forked from.
//! Children get `PR_SET_PDEATHSIG(SIGKILL)`, but Linux sends that signal when
//! the *thread* that forked the child exits, not the process. Cargo's test
//! harness runs each test on its own short-lived thread, so a server forked
//! there (say the per-process shared one) would be killed as soon as the
//! first test using it returned. The keeper thread lives as long as the
//! process, so its children die exactly when the process does.

use std::ffi::OsString;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::sync::OnceLock;

/// What to run: a program, its arguments and extra environment, the
/// directory it runs in (the test's own when `None`), and the log file its
/// stdout and stderr are appended to.
#[derive(Clone, Debug)]
pub(crate) struct Spawn {
    pub program: PathBuf,
    pub args: Vec<OsString>,
    pub envs: Vec<(String, String)>,
    pub cwd: Option<PathBuf>,
    pub log: PathBuf,
}

struct Request {
    spawn: Spawn,
    reply: mpsc::Sender<io::Result<Child>>,
}

/// Starts `spawn` from the keeper thread and returns the child.
pub(crate) fn spawn(spawn: Spawn) -> io::Result<Child> {
    let keeper = keeper()?;
    let (reply, answer) = mpsc::channel();
    keeper
        .send(Request { spawn, reply })
        .map_err(|_| io::Error::other("the MinIO keeper thread is gone"))?;
    answer
        .recv()
        .map_err(|_| io::Error::other("the MinIO keeper thread dropped a spawn request"))?
}

/// The channel to the keeper thread, started on first use. The sender lives
/// in a static, so the thread's receive loop never ends.
fn keeper() -> io::Result<&'static mpsc::Sender<Request>> {
    static KEEPER: OnceLock<mpsc::Sender<Request>> = OnceLock::new();
    if let Some(tx) = KEEPER.get() {
        return Ok(tx);
    }
    // Two threads may race here; the loser's keeper thread sees its sender
    // dropped and exits before it ever forks anything.
    let (tx, rx) = mpsc::channel::<Request>();
    std::thread::Builder::new()
        .name("minio-keeper".to_owned())
        .spawn(move || {
            for request in rx {
                // A requester that gave up is not the keeper's problem.
                let _ = request.reply.send(spawn_here(&request.spawn));
            }
        })?;
    Ok(KEEPER.get_or_init(|| tx))
}

fn spawn_here(spawn: &Spawn) -> io::Result<Child> {
    let log = open_log(&spawn.log)?;
    let log_err = log.try_clone()?;
    let mut cmd = Command::new(&spawn.program);
    cmd.args(&spawn.args)
        .envs(spawn.envs.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(log_err);
    if let Some(cwd) = &spawn.cwd {
        cmd.current_dir(cwd);
    }
    let parent = std::process::id() as libc::pid_t;
    // SAFETY: between fork and exec the closure only makes async-signal-safe
    // system calls (prctl, getppid) and allocates nothing.
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(
                libc::PR_SET_PDEATHSIG,
                libc::SIGKILL as libc::c_ulong,
                0,
                0,
                0,
            ) != 0
            {
                return Err(io::Error::last_os_error());
            }
            // The test process may have died between fork and prctl; then
            // the signal is never coming. (An OS error code: no allocating
            // after fork.)
            if libc::getppid() != parent {
                return Err(io::Error::from_raw_os_error(libc::ESRCH));
            }
            Ok(())
        });
    }
    cmd.spawn()
}

fn open_log(path: &std::path::Path) -> io::Result<File> {
    OpenOptions::new().create(true).append(true).open(path)
}
