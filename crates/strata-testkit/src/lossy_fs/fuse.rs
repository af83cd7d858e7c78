//! The FUSE adapter: translates fuser 0.18's `Filesystem` calls into
//! [`Model`](super::model::Model) calls and the model's errno-carrying
//! `io::Error`s back into replies. No file-system logic lives here; the only
//! state of its own is the directory listings open `readdir` streams
//! iterate over (a snapshot per handle, taken at offset 0, so entries
//! removed while a program iterates never make it skip others).

use std::collections::HashMap;
use std::ffi::OsStr;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use fuser::{
    AccessFlags, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation,
    INodeNo, LockOwner, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory,
    ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, Request, TimeOrNow, WriteFlags,
};
use parking_lot::Mutex;

use super::model::{Attr, DirEntry, Kind, Model, Owner, RenameMode, SetAttr, BLOCK_SIZE_BYTES};
use super::namespace::Entry;
use super::shared::Shared;

/// How long the kernel may cache entries and attributes. Short, though any
/// value would do: this mount is the only writer, and a cut needs an
/// unmount, which drops every cache.
const TTL: Duration = Duration::from_secs(1);

pub(crate) struct FuseFs {
    shared: Arc<Shared>,
    dirs: Mutex<HashMap<u64, Vec<DirEntry>>>,
    next_fh: AtomicU64,
}

impl FuseFs {
    pub(crate) fn new(shared: Arc<Shared>) -> FuseFs {
        FuseFs {
            shared,
            dirs: Mutex::new(HashMap::new()),
            next_fh: AtomicU64::new(1),
        }
    }
}

fn errno(err: io::Error) -> Errno {
    Errno::from(err)
}

fn file_attr(a: &Attr) -> FileAttr {
    FileAttr {
        ino: INodeNo(a.ino),
        size: a.size_bytes,
        blocks: a.size_bytes.div_ceil(512),
        atime: a.atime,
        mtime: a.mtime,
        ctime: a.ctime,
        crtime: a.crtime,
        kind: file_type(a.kind),
        perm: a.perm,
        nlink: a.nlink,
        uid: a.uid,
        gid: a.gid,
        rdev: 0,
        blksize: BLOCK_SIZE_BYTES,
        flags: 0,
    }
}

fn file_type(kind: Kind) -> FileType {
    match kind {
        Kind::File => FileType::RegularFile,
        Kind::Dir => FileType::Directory,
        Kind::Socket => FileType::Socket,
        Kind::Fifo => FileType::NamedPipe,
    }
}

fn owner(req: &Request, mode: u32, umask: u32) -> Owner {
    Owner {
        perm: (mode & !umask & 0o7777) as u16,
        uid: req.uid(),
        gid: req.gid(),
    }
}

fn time(t: TimeOrNow) -> SystemTime {
    match t {
        TimeOrNow::SpecificTime(t) => t,
        TimeOrNow::Now => SystemTime::now(),
    }
}

/// Counts an entry about to be given to the kernel (see `forget`).
fn remembered(model: &mut Model, attr: io::Result<Attr>) -> io::Result<Attr> {
    if let Ok(a) = &attr {
        model.remember_lookup(a.ino);
    }
    attr
}

fn entry(reply: ReplyEntry, attr: io::Result<Attr>) {
    match attr {
        Ok(attr) => reply.entry(&TTL, &file_attr(&attr), Generation(0)),
        Err(e) => reply.error(errno(e)),
    }
}

fn empty(reply: ReplyEmpty, result: io::Result<()>) {
    match result {
        Ok(()) => reply.ok(),
        Err(e) => reply.error(errno(e)),
    }
}

fn is_regular(mode: u32) -> bool {
    mode & libc::S_IFMT == libc::S_IFREG
}

/// `statvfs(2)` of the backing directory.
fn statvfs(path: &std::path::Path) -> io::Result<libc::statvfs> {
    use std::os::unix::ffi::OsStrExt;
    let c_path = std::ffi::CString::new(path.as_os_str().as_bytes())?;
    // SAFETY: an all-zero statvfs is a valid value of this plain C struct.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: c_path is NUL-terminated and st is a valid out pointer; both
    // outlive the call.
    let rc = unsafe { libc::statvfs(c_path.as_ptr(), &mut st) };
    if rc == 0 {
        Ok(st)
    } else {
        Err(io::Error::last_os_error())
    }
}

impl Filesystem for FuseFs {
    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let mut model = self.shared.model.lock();
        let found = model.lookup(parent.0, name);
        entry(reply, remembered(&mut model, found));
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        self.shared.model.lock().forget(ino.0, nlookup);
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.shared.model.lock().attr(ino.0) {
            Ok(attr) => reply.attr(&TTL, &file_attr(&attr)),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let set = SetAttr {
            perm: mode.map(|m| (m & 0o7777) as u16),
            uid,
            gid,
            size_bytes: size,
            atime: atime.map(time),
            mtime: mtime.map(time),
        };
        match self.shared.model.lock().setattr(ino.0, set) {
            Ok(attr) => reply.attr(&TTL, &file_attr(&attr)),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        _rdev: u32,
        reply: ReplyEntry,
    ) {
        let kind = match mode & libc::S_IFMT {
            libc::S_IFREG => Kind::File,
            libc::S_IFSOCK => Kind::Socket,
            libc::S_IFIFO => Kind::Fifo,
            // mknod(2): the file system does not support this node type.
            _ => return reply.error(Errno::EPERM),
        };
        let owner = owner(req, mode, umask);
        let mut model = self.shared.model.lock();
        let created = model.create(parent.0, name, kind, owner);
        entry(reply, remembered(&mut model, created));
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        let owner = owner(req, mode, umask);
        let mut model = self.shared.model.lock();
        let made = model.create(parent.0, name, Kind::Dir, owner);
        entry(reply, remembered(&mut model, made));
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        empty(
            reply,
            self.shared.model.lock().remove(parent.0, name, false),
        );
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        empty(reply, self.shared.model.lock().remove(parent.0, name, true));
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let mode = if flags.is_empty() {
            RenameMode::Replace
        } else if flags == RenameFlags::RENAME_NOREPLACE {
            RenameMode::NoReplace
        } else if flags == RenameFlags::RENAME_EXCHANGE {
            RenameMode::Exchange
        } else {
            return reply.error(Errno::EINVAL);
        };
        let from = Entry::new(parent.0, name);
        let to = Entry::new(newparent.0, newname);
        empty(reply, self.shared.model.lock().rename(from, to, mode));
    }

    fn link(
        &self,
        _req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        let mut model = self.shared.model.lock();
        let linked = model.link(ino.0, newparent.0, newname);
        entry(reply, remembered(&mut model, linked));
    }

    fn open(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        // O_TRUNC arrives as a setattr (no atomic_o_trunc), O_APPEND offsets
        // are the kernel's, O_DIRECT/O_SYNC need nothing: every write is
        // already synchronous to the model.
        match self.shared.model.lock().open(ino.0) {
            Ok(()) => reply.opened(FileHandle(0), FopenFlags::empty()),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        match self.shared.model.lock().read(ino.0, offset, size) {
            Ok(data) => reply.data(&data),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        match self.shared.model.lock().write(ino.0, offset, data) {
            Ok(n) => reply.written(n),
            Err(e) => reply.error(errno(e)),
        }
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

    fn release(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        self.shared.model.lock().release(ino.0);
        reply.ok();
    }

    fn fsync(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        empty(reply, self.shared.model.lock().fsync(ino.0));
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        if let Err(e) = self.shared.model.lock().readdir(ino.0) {
            return reply.error(errno(e));
        }
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        self.dirs.lock().insert(fh, Vec::new());
        reply.opened(FileHandle(fh), FopenFlags::empty());
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let mut dirs = self.dirs.lock();
        let listing = dirs.entry(fh.0).or_default();
        if offset == 0 || listing.is_empty() {
            match self.shared.model.lock().readdir(ino.0) {
                Ok(entries) => *listing = entries,
                Err(e) => return reply.error(errno(e)),
            }
        }
        let start = usize::try_from(offset).unwrap_or(usize::MAX);
        for (i, e) in listing.iter().enumerate().skip(start) {
            if reply.add(INodeNo(e.ino), i as u64 + 1, file_type(e.kind), &e.name) {
                break;
            }
        }
        reply.ok();
    }

    fn releasedir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        self.dirs.lock().remove(&fh.0);
        reply.ok();
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        self.shared.model.lock().fsyncdir(ino.0);
        reply.ok();
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let dir = self.shared.model.lock().files_dir().to_owned();
        match statvfs(&dir) {
            Ok(st) => reply.statfs(
                st.f_blocks,
                st.f_bfree,
                st.f_bavail,
                st.f_files,
                st.f_ffree,
                st.f_bsize as u32,
                st.f_namemax as u32,
                st.f_frsize as u32,
            ),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn access(&self, _req: &Request, ino: INodeNo, _mask: AccessFlags, reply: ReplyEmpty) {
        // The kernel checks permissions itself (default_permissions).
        empty(reply, self.shared.model.lock().attr(ino.0).map(|_| ()));
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        _flags: i32,
        reply: ReplyCreate,
    ) {
        if !is_regular(mode) {
            return reply.error(Errno::EPERM);
        }
        let mut model = self.shared.model.lock();
        let created = model
            .create(parent.0, name, Kind::File, owner(req, mode, umask))
            .and_then(|attr| model.open(attr.ino).map(|()| attr));
        let created = remembered(&mut model, created);
        match created {
            Ok(attr) => reply.created(
                &TTL,
                &file_attr(&attr),
                Generation(0),
                FileHandle(0),
                FopenFlags::empty(),
            ),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn fallocate(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        empty(
            reply,
            self.shared
                .model
                .lock()
                .fallocate(ino.0, offset, length, mode),
        );
    }
}
