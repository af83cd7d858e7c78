//! Mounting and unmounting: one fuser session per mount, served by its own
//! threads, and a [`LossyMount`] guard that unmounts it.
//!
//! Unmounting is a plain (not lazy) `umount(2)` — or `fusermount3 -u` when
//! not root — so it fails with "busy" while a file under the mount is still
//! open, instead of detaching a mount someone is still using; then it waits
//! for the session threads to finish, so when it returns the kernel has let
//! go and a power cut may proceed. Only `Drop` falls back to a lazy unmount:
//! the session then lives on until its last open file closes, and the file
//! system counts as mounted (no cut, no new mount) until then.

use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use fuser::{Config, MountOption, Session};

use super::fuse::FuseFs;
use super::shared::Shared;

/// Threads reading FUSE requests (each on its own cloned `/dev/fuse`
/// descriptor). More than one so a slow request does not stall the others'
/// reads; the model itself is behind one mutex.
const SESSION_THREADS: usize = 4;

/// How long an unmount waits for the session threads after the kernel let
/// go (they end within milliseconds).
const SESSION_EXIT_TIMEOUT: Duration = Duration::from_secs(30);
/// Unmount attempts while the mount is busy, and the pause between them.
const BUSY_RETRIES: u32 = 50;
const BUSY_RETRY_PAUSE: Duration = Duration::from_millis(20);

/// A mounted [`LossyFs`](super::LossyFs). Unmounts when dropped (lazily if
/// busy); prefer [`LossyMount::unmount`], which reports failures.
#[derive(Debug)]
pub struct LossyMount {
    mountpoint: PathBuf,
    session: Option<JoinHandle<io::Result<()>>>,
}

/// Clears `mounted` when the session thread ends, however it ends.
struct MountedFlag(Arc<Shared>);

impl Drop for MountedFlag {
    fn drop(&mut self) {
        self.0.mounted.store(false, Ordering::SeqCst);
    }
}

pub(crate) fn mount(shared: &Arc<Shared>, mountpoint: &Path) -> io::Result<LossyMount> {
    let mountpoint = mountpoint.canonicalize()?;
    if std::fs::read_dir(&mountpoint)?.next().is_some() {
        return Err(io::Error::new(
            io::ErrorKind::DirectoryNotEmpty,
            format!(
                "lossy_fs: mount point {} is not empty",
                mountpoint.display()
            ),
        ));
    }
    {
        let _model = shared.model.lock();
        if shared.mounted.swap(true, Ordering::SeqCst) {
            return Err(io::Error::new(
                io::ErrorKind::ResourceBusy,
                "lossy_fs: already mounted (at most one mount at a time)",
            ));
        }
    }
    let flag = MountedFlag(shared.clone());
    let session = Session::new(FuseFs::new(shared.clone()), &mountpoint, &config())?;
    let thread = std::thread::Builder::new()
        .name("lossy-fs".into())
        .spawn(move || {
            let _flag = flag;
            session.run()
        })?;
    Ok(LossyMount {
        mountpoint,
        session: Some(thread),
    })
}

fn config() -> Config {
    let mut config = Config::default();
    config.mount_options = vec![
        MountOption::FSName("lossyfs".into()),
        MountOption::Subtype("lossyfs".into()),
        MountOption::DefaultPermissions,
        MountOption::RW,
    ];
    config.n_threads = Some(SESSION_THREADS);
    config.clone_fd = true;
    config
}

impl LossyMount {
    /// Where it is mounted (canonical).
    pub fn mountpoint(&self) -> &Path {
        &self.mountpoint
    }

    /// Unmounts: waits until the kernel has let go. Fails (then unmounts
    /// lazily, as a drop would) if files are still open under it after
    /// `BUSY_RETRIES` tries: a process another thread is spawning holds a
    /// copy of every descriptor between its fork and its exec, so a file
    /// closed here can keep the mount busy for a moment (a CI flake).
    pub fn unmount(mut self) -> io::Result<()> {
        let Some(session) = self.session.take() else {
            return Ok(());
        };
        let mut tries = 0;
        loop {
            match umount(&self.mountpoint, false) {
                Ok(()) => return wait_for(session),
                Err(e) if e.kind() == io::ErrorKind::ResourceBusy && tries < BUSY_RETRIES => {
                    tries += 1;
                    std::thread::sleep(BUSY_RETRY_PAUSE);
                }
                Err(e) => {
                    self.session = Some(session);
                    return Err(e);
                }
            }
        }
    }
}

impl Drop for LossyMount {
    fn drop(&mut self) {
        let Some(session) = self.session.take() else {
            return;
        };
        if umount(&self.mountpoint, false).is_ok() {
            let _ = wait_for(session);
        } else {
            // Busy: detach; the session ends when the last file closes.
            let _ = umount(&self.mountpoint, true);
        }
    }
}

/// Waits for the session threads to end (the kernel closed the channel).
fn wait_for(session: JoinHandle<io::Result<()>>) -> io::Result<()> {
    let deadline = Instant::now() + SESSION_EXIT_TIMEOUT;
    while !session.is_finished() {
        if Instant::now() > deadline {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "lossy_fs: unmounted, but the FUSE session did not end",
            ));
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    let ended = session
        .join()
        .map_err(|_| io::Error::other("lossy_fs: the FUSE session thread panicked"))?;
    match ended {
        // After our own unmount, a worker reading /dev/fuse may see the
        // connection aborted rather than gone (ENODEV): the same clean end.
        Err(e) if e.raw_os_error() == Some(libc::ECONNABORTED) => Ok(()),
        other => other,
    }
}

/// `umount2(2)`; as a non-root user, `fusermount3 -u` (what mounted it).
fn umount(mountpoint: &Path, lazy: bool) -> io::Result<()> {
    let c_path = CString::new(mountpoint.as_os_str().as_bytes())?;
    let flags = if lazy { libc::MNT_DETACH } else { 0 };
    // SAFETY: c_path is NUL-terminated and outlives the call.
    if unsafe { libc::umount2(c_path.as_ptr(), flags) } == 0 {
        return Ok(());
    }
    let err = io::Error::last_os_error();
    match err.raw_os_error() {
        Some(libc::EBUSY) => Err(busy(mountpoint)),
        Some(libc::EPERM) => fusermount_unmount(mountpoint, lazy),
        _ => Err(io::Error::new(
            err.kind(),
            format!("lossy_fs: unmounting {}: {err}", mountpoint.display()),
        )),
    }
}

fn busy(mountpoint: &Path) -> io::Error {
    io::Error::new(
        io::ErrorKind::ResourceBusy,
        format!(
            "lossy_fs: cannot unmount {}: busy (a file or directory under it is still \
             open, or a process has its working directory there)",
            mountpoint.display()
        ),
    )
}

fn fusermount_unmount(mountpoint: &Path, lazy: bool) -> io::Result<()> {
    let mut cmd = std::process::Command::new("fusermount3");
    cmd.arg("-u").arg("-q");
    if lazy {
        cmd.arg("-z");
    }
    let out = cmd.arg("--").arg(mountpoint).output()?;
    if out.status.success() {
        return Ok(());
    }
    let stderr = String::from_utf8_lossy(&out.stderr);
    if stderr.contains("busy") {
        return Err(busy(mountpoint));
    }
    Err(io::Error::other(format!(
        "lossy_fs: fusermount3 -u {}: {}",
        mountpoint.display(),
        stderr.trim()
    )))
}
