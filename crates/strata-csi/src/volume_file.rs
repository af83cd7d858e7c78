//! A volume as one file on a FUSE mount of this process: what a loop
//! device turns into the block device a pod gets (`attach.rs`), and
//! `strata serve --loop-dir` a host's.
//!
//! Owns [`VolumeFile`]: the mount (a directory with one file, `disk`, the
//! volume's size), the fuser session serving it, and its unmount. Reads,
//! writes, `fsync` and `fallocate` (the loop device's discards) go straight
//! to the engine's `Volume`, no NBD hop between, each from a task of the
//! runtime (the session's threads only read requests), with the kernel's
//! asynchronous direct I/O on: the loop device's queue reaches the engine
//! side by side, up to `MAX_BACKGROUND` requests. The file's size is read
//! from the volume on every `getattr`, so after a resize `losetup -c` finds
//! the new size (nbdfuse could not: an NBD client learns the size once).
//! Opened with `FOPEN_DIRECT_IO`: the page cache never holds the file, so a
//! read after a write elsewhere never sees stale bytes, and the loop device
//! may use direct I/O.

use std::ffi::OsStr;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime};

use fuser::{
    Config, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo,
    InitFlags, KernelConfig, LockOwner, MountOption, OpenFlags, ReplyAttr, ReplyData,
    ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyWrite, Request, Session, WriteFlags,
};
use strata_volume::{Volume, VolumeError};
use tokio::runtime::Handle;

/// The file's name in the mount.
pub const FILE_NAME: &str = "disk";
const ROOT_INO: u64 = 1;
const FILE_INO: u64 = 2;
/// Attributes may be cached this long; the size is asked again after it
/// (a resize shows within a second).
const TTL: Duration = Duration::from_secs(1);
/// Threads reading FUSE requests. Each hands its request to the runtime
/// and reads the next (`VolumeFs::spawn_reply`), so a few keep up with
/// the loop device's queue.
const SESSION_THREADS: usize = 4;
/// Asynchronous requests (the loop device's direct I/O, with
/// FUSE_ASYNC_DIO) the kernel keeps in flight at most: the bound on what
/// one volume file holds in flight, each request at most 1 MiB.
const MAX_BACKGROUND: u16 = 64;
/// How long an unmount waits for the session's threads to end.
const SESSION_EXIT_TIMEOUT: Duration = Duration::from_secs(30);
const BLOCK_BYTES: u32 = 4096;

/// A mounted volume file. Unmount with [`VolumeFile::unmount`]; dropped
/// mounted, it is detached lazily.
#[derive(Debug)]
pub struct VolumeFile {
    mountpoint: PathBuf,
    session: Option<JoinHandle<io::Result<()>>>,
}

struct VolumeFs {
    volume: Arc<Volume>,
    runtime: Handle,
    read_only: bool,
    mounted_at: SystemTime,
}

/// Mounts `volume` as `mountpoint/disk` (an empty directory), served by
/// threads that call into `runtime`.
pub fn mount(
    volume: Arc<Volume>,
    runtime: Handle,
    mountpoint: &Path,
    read_only: bool,
) -> io::Result<VolumeFile> {
    let fs = VolumeFs {
        volume,
        runtime,
        read_only,
        mounted_at: SystemTime::now(),
    };
    let mut config = Config::default();
    config.mount_options = vec![
        MountOption::FSName("strata".into()),
        MountOption::Subtype("strata".into()),
        MountOption::DefaultPermissions,
        if read_only {
            MountOption::RO
        } else {
            MountOption::RW
        },
    ];
    config.n_threads = Some(SESSION_THREADS);
    config.clone_fd = true;
    let session = Session::new(fs, mountpoint, &config)?;
    let thread = std::thread::Builder::new()
        .name("strata-volume-file".into())
        .spawn(move || session.run())?;
    Ok(VolumeFile {
        mountpoint: mountpoint.to_path_buf(),
        session: Some(thread),
    })
}

impl VolumeFile {
    /// The file the loop device is set up on.
    pub fn path(&self) -> PathBuf {
        self.mountpoint.join(FILE_NAME)
    }

    /// Unmounts and waits for the session to end. Fails while the file is
    /// open (the loop device still set up on it); it stays mounted then.
    pub fn unmount(&mut self) -> io::Result<()> {
        let Some(session) = self.session.take() else {
            return Ok(());
        };
        if let Err(e) = umount(&self.mountpoint, false) {
            self.session = Some(session);
            return Err(e);
        }
        let deadline = Instant::now() + SESSION_EXIT_TIMEOUT;
        while !session.is_finished() {
            if Instant::now() > deadline {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!(
                        "{} is unmounted, but its FUSE session did not end",
                        self.mountpoint.display()
                    ),
                ));
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        match session.join() {
            Ok(Err(e)) if e.raw_os_error() != Some(libc::ECONNABORTED) => Err(e),
            Ok(_) => Ok(()),
            Err(_) => Err(io::Error::other("the FUSE session thread panicked")),
        }
    }
}

impl Drop for VolumeFile {
    fn drop(&mut self) {
        if self.session.is_some() {
            let _ = umount(&self.mountpoint, true);
        }
    }
}

fn umount(mountpoint: &Path, lazy: bool) -> io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(mountpoint.as_os_str().as_bytes())?;
    let flags = if lazy { libc::MNT_DETACH } else { 0 };
    // SAFETY: `c` is NUL-terminated and outlives the call.
    if unsafe { libc::umount2(c.as_ptr(), flags) } == 0 {
        return Ok(());
    }
    let e = io::Error::last_os_error();
    Err(io::Error::new(
        e.kind(),
        format!("unmount {}: {e}", mountpoint.display()),
    ))
}

impl VolumeFs {
    fn attr(&self, ino: u64) -> Option<FileAttr> {
        let (kind, perm, size, nlink) = match ino {
            ROOT_INO => (FileType::Directory, 0o755, 0, 2),
            FILE_INO => (
                FileType::RegularFile,
                if self.read_only { 0o400 } else { 0o600 },
                self.volume.size_bytes(),
                1,
            ),
            _ => return None,
        };
        Some(FileAttr {
            ino: INodeNo(ino),
            size,
            blocks: size.div_ceil(512),
            atime: self.mounted_at,
            mtime: self.mounted_at,
            ctime: self.mounted_at,
            crtime: self.mounted_at,
            kind,
            perm,
            nlink,
            uid: 0,
            gid: 0,
            rdev: 0,
            blksize: BLOCK_BYTES,
            flags: 0,
        })
    }

    /// Runs an engine call on the runtime and replies from there: the
    /// session thread goes back for the kernel's next request at once, so
    /// the loop device's requests reach the engine side by side (as many
    /// as the kernel keeps in flight), not one per session thread. An
    /// error is logged; the kernel hears EIO (EINVAL out of range).
    fn spawn_reply<T, F, Fut, R>(&self, what: &'static str, op: F, reply: R)
    where
        T: Send + 'static,
        F: FnOnce(Arc<Volume>) -> Fut,
        Fut: std::future::Future<Output = Result<T, VolumeError>> + Send + 'static,
        R: FnOnce(Result<T, Errno>) + Send + 'static,
    {
        let fut = op(self.volume.clone());
        let volume = self.volume.clone();
        self.runtime.spawn(async move {
            let result = fut.await.map_err(|e| {
                tracing::warn!(volume = %volume.name(), error = %strata_store::ErrorText(&e), "{what} through the volume file failed");
                match e {
                    VolumeError::OutOfRange { .. } => Errno::EINVAL,
                    _ => Errno::EIO,
                }
            });
            reply(result);
        });
    }

    /// `len` bytes at `offset` clamped to the volume's end.
    fn clamp(&self, offset: u64, len: u64) -> u64 {
        self.volume.size_bytes().saturating_sub(offset).min(len)
    }
}

impl Filesystem for VolumeFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> io::Result<()> {
        // The loop device's direct I/O is asynchronous: with ASYNC_DIO the
        // kernel keeps many of its requests in flight (up to the
        // background limit) instead of one per loop worker.
        if let Err(missing) = config.add_capabilities(InitFlags::FUSE_ASYNC_DIO) {
            tracing::info!(volume = %self.volume.name(), ?missing, "this kernel's FUSE has no asynchronous direct I/O: the volume file serves one request per loop worker");
        }
        let _ = config.set_max_background(MAX_BACKGROUND);
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        match (parent.0, name.to_str()) {
            (ROOT_INO, Some(FILE_NAME)) => match self.attr(FILE_INO) {
                Some(a) => reply.entry(&TTL, &a, Generation(0)),
                None => reply.error(Errno::ENOENT),
            },
            _ => reply.error(Errno::ENOENT),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.attr(ino.0) {
            Some(a) => reply.attr(&TTL, &a),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn open(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        match ino.0 {
            FILE_INO => reply.opened(FileHandle(0), FopenFlags::FOPEN_DIRECT_IO),
            _ => reply.error(Errno::EISDIR),
        }
    }

    fn read(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let len = self.clamp(offset, u64::from(size));
        let read = move |volume: Arc<Volume>| async move {
            let mut buf = vec![0u8; len as usize];
            if len > 0 {
                volume.read(offset, &mut buf).await?;
            }
            Ok(buf)
        };
        self.spawn_reply("a read", read, move |r| match r {
            Ok(buf) => reply.data(&buf),
            Err(e) => reply.error(e),
        });
    }

    fn write(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        if self.read_only {
            return reply.error(Errno::EROFS);
        }
        if self.clamp(offset, data.len() as u64) < data.len() as u64 {
            // The volume does not grow by writes past its end.
            return reply.error(Errno::ENOSPC);
        }
        // Copied: the session's buffer is its next request's.
        let data = data.to_vec();
        let written = data.len() as u32;
        let write =
            move |volume: Arc<Volume>| async move { volume.write(offset, &data, false).await };
        self.spawn_reply("a write", write, move |r| match r {
            Ok(()) => reply.written(written),
            Err(e) => reply.error(e),
        });
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        reply.ok();
    }

    fn fsync(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        let flush = |volume: Arc<Volume>| async move { volume.flush().await };
        self.spawn_reply("an fsync", flush, move |r| match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        });
    }

    fn fallocate(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        if self.read_only {
            return reply.error(Errno::EROFS);
        }
        let len = self.clamp(offset, length);
        let punch = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
        let done = move |r: Result<(), Errno>| match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        };
        if mode == punch {
            // The loop device's discard: the range reads as zeros and
            // costs no storage.
            let trim =
                move |volume: Arc<Volume>| async move { volume.trim(offset, len, false).await };
            self.spawn_reply("a discard", trim, done);
        } else if mode & libc::FALLOC_FL_ZERO_RANGE != 0 {
            let zero = move |volume: Arc<Volume>| async move {
                volume.write_zeroes(offset, len, true, false).await
            };
            self.spawn_reply("a zeroing", zero, done);
        } else if mode == 0 && len == length {
            // Allocating what exists: nothing to do.
            done(Ok(()));
        } else {
            done(Err(Errno::EOPNOTSUPP));
        }
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        match ino.0 {
            ROOT_INO => reply.opened(FileHandle(0), FopenFlags::empty()),
            _ => reply.error(Errno::ENOTDIR),
        }
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        if ino.0 != ROOT_INO {
            return reply.error(Errno::ENOTDIR);
        }
        let entries = [
            (ROOT_INO, FileType::Directory, "."),
            (ROOT_INO, FileType::Directory, ".."),
            (FILE_INO, FileType::RegularFile, FILE_NAME),
        ];
        for (i, (ino, kind, name)) in entries.iter().enumerate().skip(offset as usize) {
            if reply.add(INodeNo(*ino), i as u64 + 1, *kind, name) {
                break;
            }
        }
        reply.ok();
    }
}
