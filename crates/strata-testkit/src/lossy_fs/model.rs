//! The file system itself, without FUSE: inodes, the current and durable
//! namespaces with the log between them, each file's data views, fsync,
//! fsyncdir, garbage collection of unreachable inodes, and the power cut.
//!
//! Every method checks its arguments against the current state and fails
//! with the errno POSIX gives for that case (as an `io::Error` carrying the
//! raw errno), so `fuse.rs` only translates. Unit-tested here directly.
//!
//! An inode lives while anything could still bring it back: a current name,
//! a durable name, an open handle, or a pending namespace op that mentions
//! it (a later cut might keep that op). Once none is left it is deleted with
//! its backing files, so a workload that creates, writes and deletes
//! temporary files keeps no dead data around.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::ffi::{OsStr, OsString};
use std::io;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use super::cut_report::{CutReport, Pending};
use super::data::{DataOpKind, FileData, Keep};
use super::loss_mode::LossMode;
use super::namespace::{Entry, Ino, Namespace, NsOp, ROOT};
use super::rng::SplitMix64;
use super::spill::Spill;

/// Longest name a directory entry may have (as on ext4).
const NAME_MAX_BYTES: usize = 255;

/// Block size reported in `st_blksize` and used for `st_blocks`.
pub(crate) const BLOCK_SIZE_BYTES: u32 = 4096;

/// What an inode is. Nothing else (symlinks, devices) exists here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    File,
    Dir,
    /// A unix socket's name (`bind(2)` makes one; strata's control socket
    /// lives in its data directory). No data; the kernel does the rest.
    Socket,
    /// A named pipe. No data; the kernel does the rest.
    Fifo,
}

/// The attributes `stat` reports.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Attr {
    pub(crate) ino: Ino,
    pub(crate) kind: Kind,
    pub(crate) size_bytes: u64,
    pub(crate) perm: u16,
    pub(crate) nlink: u32,
    pub(crate) uid: u32,
    pub(crate) gid: u32,
    pub(crate) atime: SystemTime,
    pub(crate) mtime: SystemTime,
    pub(crate) ctime: SystemTime,
    pub(crate) crtime: SystemTime,
}

/// What a `setattr` changes (`None`: unchanged).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct SetAttr {
    pub(crate) perm: Option<u16>,
    pub(crate) uid: Option<u32>,
    pub(crate) gid: Option<u32>,
    pub(crate) size_bytes: Option<u64>,
    pub(crate) atime: Option<SystemTime>,
    pub(crate) mtime: Option<SystemTime>,
}

/// `renameat2` flavours.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RenameMode {
    /// Plain rename: replaces the target.
    Replace,
    /// `RENAME_NOREPLACE`.
    NoReplace,
    /// `RENAME_EXCHANGE`.
    Exchange,
}

/// One `readdir` entry.
#[derive(Debug, Clone)]
pub(crate) struct DirEntry {
    pub(crate) ino: Ino,
    pub(crate) kind: Kind,
    pub(crate) name: OsString,
}

/// Who created an inode and with which permission bits.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Owner {
    pub(crate) perm: u16,
    pub(crate) uid: u32,
    pub(crate) gid: u32,
}

/// Attributes kept in memory only (not power-loss modelled: a cut keeps
/// them as they were; sizes come from the data views).
#[derive(Debug, Clone, Copy)]
struct Meta {
    owner: Owner,
    atime: SystemTime,
    mtime: SystemTime,
    ctime: SystemTime,
    crtime: SystemTime,
}

impl Meta {
    fn new(owner: Owner) -> Meta {
        let now = SystemTime::now();
        Meta {
            owner,
            atime: now,
            mtime: now,
            ctime: now,
            crtime: now,
        }
    }

    fn modified(&mut self) {
        let now = SystemTime::now();
        self.mtime = now;
        self.ctime = now;
    }
}

#[derive(Debug)]
enum Body {
    Dir,
    File(FileData),
    /// A socket or fifo: only a name.
    Special(Kind),
}

impl Body {
    fn kind(&self) -> Kind {
        match self {
            Body::Dir => Kind::Dir,
            Body::File(_) => Kind::File,
            Body::Special(kind) => *kind,
        }
    }
}

#[derive(Debug)]
struct Inode {
    meta: Meta,
    body: Body,
    open_count: u32,
    /// Entries the kernel was given for it and has not forgotten: it may
    /// still open or stat it by number (a lookup served from its dentry
    /// cache just before a rename replaced the name), so it is kept, as a
    /// real file system keeps an unlinked inode a process still refers to.
    kernel_lookups: u64,
}

/// The whole file system state.
#[derive(Debug)]
pub(crate) struct Model {
    files_dir: PathBuf,
    inodes: BTreeMap<Ino, Inode>,
    cur: Namespace,
    dur: Namespace,
    /// Namespace ops applied to `cur` but not to `dur`, oldest first.
    ns_log: VecDeque<NsOp>,
    /// How many ops in `ns_log` mention each inode.
    ns_refs: HashMap<Ino, usize>,
    spill: Spill,
    next_ino: Ino,
    next_seq: u64,
    pending_data_ops: usize,
}

fn errno(code: i32) -> io::Error {
    io::Error::from_raw_os_error(code)
}

impl Model {
    /// An empty file system (a root directory owned by `root`) whose files
    /// live in `files_dir` (an existing, empty directory).
    pub(crate) fn new(files_dir: &Path, root: Owner) -> io::Result<Model> {
        let spill = Spill::create(&files_dir.join("spill"))?;
        let root_inode = Inode {
            meta: Meta::new(root),
            body: Body::Dir,
            open_count: 0,
            kernel_lookups: 0,
        };
        Ok(Model {
            files_dir: files_dir.to_owned(),
            inodes: BTreeMap::from([(ROOT, root_inode)]),
            cur: Namespace::with_root(),
            dur: Namespace::with_root(),
            ns_log: VecDeque::new(),
            ns_refs: HashMap::new(),
            spill,
            next_ino: ROOT + 1,
            next_seq: 0,
            pending_data_ops: 0,
        })
    }

    /// The directory holding the backing files (for `statfs`).
    pub(crate) fn files_dir(&self) -> &Path {
        &self.files_dir
    }

    fn inode(&self, ino: Ino) -> io::Result<&Inode> {
        self.inodes.get(&ino).ok_or_else(|| errno(libc::ENOENT))
    }

    fn inode_mut(&mut self, ino: Ino) -> io::Result<&mut Inode> {
        self.inodes.get_mut(&ino).ok_or_else(|| errno(libc::ENOENT))
    }

    fn file(&self, ino: Ino) -> io::Result<&FileData> {
        match &self.inode(ino)?.body {
            Body::File(data) => Ok(data),
            Body::Dir => Err(errno(libc::EISDIR)),
            Body::Special(_) => Err(errno(libc::EINVAL)),
        }
    }

    pub(crate) fn attr(&self, ino: Ino) -> io::Result<Attr> {
        let inode = self.inode(ino)?;
        let (kind, size_bytes, nlink) = match &inode.body {
            Body::File(data) => (Kind::File, data.size_bytes(), self.cur.links(ino)),
            Body::Dir if self.cur.contains(ino) => {
                let subdirs = u32::try_from(self.cur.subdirs(ino)).unwrap_or(u32::MAX);
                (
                    Kind::Dir,
                    u64::from(BLOCK_SIZE_BYTES),
                    subdirs.saturating_add(2),
                )
            }
            Body::Dir => (Kind::Dir, u64::from(BLOCK_SIZE_BYTES), 0),
            Body::Special(kind) => (*kind, 0, self.cur.links(ino)),
        };
        let m = &inode.meta;
        Ok(Attr {
            ino,
            kind,
            size_bytes,
            perm: m.owner.perm,
            nlink,
            uid: m.owner.uid,
            gid: m.owner.gid,
            atime: m.atime,
            mtime: m.mtime,
            ctime: m.ctime,
            crtime: m.crtime,
        })
    }

    /// The current entries of directory `dir`.
    fn dir_entries(&self, dir: Ino) -> io::Result<&BTreeMap<OsString, Ino>> {
        if let Some(entries) = self.cur.entries(dir) {
            return Ok(entries);
        }
        match self.inode(dir)?.body {
            Body::File(_) | Body::Special(_) => Err(errno(libc::ENOTDIR)),
            // Removed but still known (e.g. open): nothing can be in it.
            Body::Dir => Err(errno(libc::ENOENT)),
        }
    }

    pub(crate) fn lookup(&self, parent: Ino, name: &OsStr) -> io::Result<Attr> {
        let ino = self
            .dir_entries(parent)?
            .get(name)
            .copied()
            .ok_or_else(|| errno(libc::ENOENT))?;
        self.attr(ino)
    }

    pub(crate) fn readdir(&self, dir: Ino) -> io::Result<Vec<DirEntry>> {
        let entries = self.dir_entries(dir)?;
        let dot = |name: &str, ino: Ino| DirEntry {
            ino,
            kind: Kind::Dir,
            name: name.into(),
        };
        let mut out = vec![
            dot(".", dir),
            dot("..", self.cur.parent(dir).unwrap_or(dir)),
        ];
        out.extend(entries.iter().map(|(name, ino)| DirEntry {
            ino: *ino,
            kind: self.inodes.get(ino).map_or(Kind::File, |i| i.body.kind()),
            name: name.clone(),
        }));
        Ok(out)
    }

    /// `name` may be added to directory `parent`.
    fn check_new_name(&self, parent: Ino, name: &OsStr) -> io::Result<()> {
        if name.len() > NAME_MAX_BYTES {
            return Err(errno(libc::ENAMETOOLONG));
        }
        if self.dir_entries(parent)?.contains_key(name) {
            return Err(errno(libc::EEXIST));
        }
        Ok(())
    }

    /// create / mknod (regular file, socket, fifo) / mkdir.
    pub(crate) fn create(
        &mut self,
        parent: Ino,
        name: &OsStr,
        kind: Kind,
        owner: Owner,
    ) -> io::Result<Attr> {
        self.check_new_name(parent, name)?;
        let ino = self.next_ino;
        let body = match kind {
            Kind::File => Body::File(FileData::create(&self.files_dir, ino)?),
            Kind::Dir => Body::Dir,
            Kind::Socket | Kind::Fifo => Body::Special(kind),
        };
        self.next_ino += 1;
        let inode = Inode {
            meta: Meta::new(owner),
            body,
            open_count: 0,
            kernel_lookups: 0,
        };
        self.inodes.insert(ino, inode);
        self.log_ns(NsOp::Link {
            at: Entry::new(parent, name),
            ino,
            new_dir: kind == Kind::Dir,
        });
        self.touch(parent);
        self.attr(ino)
    }

    /// A new name for `ino` (directories cannot be hard-linked).
    pub(crate) fn link(&mut self, ino: Ino, parent: Ino, name: &OsStr) -> io::Result<Attr> {
        if let Body::Dir = self.inode(ino)?.body {
            return Err(errno(libc::EPERM));
        }
        self.check_new_name(parent, name)?;
        self.log_ns(NsOp::Link {
            at: Entry::new(parent, name),
            ino,
            new_dir: false,
        });
        self.touch(parent);
        self.inode_mut(ino)?.meta.ctime = SystemTime::now();
        self.attr(ino)
    }

    /// unlink (`dir` false) or rmdir (`dir` true).
    pub(crate) fn remove(&mut self, parent: Ino, name: &OsStr, dir: bool) -> io::Result<()> {
        let ino = self
            .dir_entries(parent)?
            .get(name)
            .copied()
            .ok_or_else(|| errno(libc::ENOENT))?;
        self.check_replaceable(ino, dir)?;
        self.log_ns(NsOp::Unlink {
            at: Entry::new(parent, name),
            ino,
        });
        self.touch(parent);
        self.inode_mut(ino)?.meta.ctime = SystemTime::now();
        self.collect(ino);
        Ok(())
    }

    pub(crate) fn rename(&mut self, from: Entry, to: Entry, mode: RenameMode) -> io::Result<()> {
        if to.name.len() > NAME_MAX_BYTES {
            return Err(errno(libc::ENAMETOOLONG));
        }
        let src = self
            .dir_entries(from.dir)?
            .get(&from.name)
            .copied()
            .ok_or_else(|| errno(libc::ENOENT))?;
        let dst = self.dir_entries(to.dir)?.get(&to.name).copied();
        let op = match mode {
            RenameMode::Exchange => self.exchange_op(from, to, src, dst)?,
            RenameMode::NoReplace if dst.is_some() => return Err(errno(libc::EEXIST)),
            _ => match self.rename_op(from, to, src, dst)? {
                Some(op) => op,
                None => return Ok(()),
            },
        };
        for dir in [op_dirs(&op).0, op_dirs(&op).1] {
            self.touch(dir);
        }
        self.log_ns(op);
        if let Some(dst) = dst {
            self.collect(dst);
        }
        Ok(())
    }

    /// The op for a plain rename, or `None` when it changes nothing (both
    /// names are links to one file: POSIX says do nothing).
    fn rename_op(
        &self,
        from: Entry,
        to: Entry,
        src: Ino,
        dst: Option<Ino>,
    ) -> io::Result<Option<NsOp>> {
        let src_dir = self.cur.is_dir(src);
        if let Some(dst) = dst {
            if dst == src {
                return Ok(None);
            }
            self.check_replaceable(dst, src_dir)?;
        }
        if src_dir && self.cur.is_ancestor(src, to.dir) {
            return Err(errno(libc::EINVAL));
        }
        Ok(Some(NsOp::Rename {
            from,
            to,
            ino: src,
            replaced: dst,
        }))
    }

    fn exchange_op(&self, a: Entry, b: Entry, a_ino: Ino, b_ino: Option<Ino>) -> io::Result<NsOp> {
        let b_ino = b_ino.ok_or_else(|| errno(libc::ENOENT))?;
        let into_itself = |moved: Ino, new_dir: Ino| {
            moved != ROOT && self.cur.is_dir(moved) && self.cur.is_ancestor(moved, new_dir)
        };
        if a_ino != b_ino && (into_itself(a_ino, b.dir) || into_itself(b_ino, a.dir)) {
            return Err(errno(libc::EINVAL));
        }
        Ok(NsOp::Exchange { a, b, a_ino, b_ino })
    }

    /// Applies `op` to the current namespace and logs it.
    fn log_ns(&mut self, op: NsOp) {
        self.cur.apply(&op);
        for ino in op.inos() {
            *self.ns_refs.entry(ino).or_insert(0) += 1;
        }
        self.ns_log.push_back(op);
    }

    /// Directory `dir` changed.
    fn touch(&mut self, dir: Ino) {
        if let Some(inode) = self.inodes.get_mut(&dir) {
            inode.meta.modified();
        }
    }

    pub(crate) fn open(&mut self, ino: Ino) -> io::Result<()> {
        self.inode_mut(ino)?.open_count += 1;
        Ok(())
    }

    pub(crate) fn release(&mut self, ino: Ino) {
        if let Some(inode) = self.inodes.get_mut(&ino) {
            inode.open_count = inode.open_count.saturating_sub(1);
        }
        self.collect(ino);
    }

    pub(crate) fn read(&self, ino: Ino, offset_bytes: u64, len_bytes: u32) -> io::Result<Vec<u8>> {
        self.file(ino)?.read(offset_bytes, len_bytes)
    }

    /// One data op on file `ino` (all of them go through here).
    fn data_op(
        &mut self,
        ino: Ino,
        op: impl FnOnce(&mut FileData, u64, &mut Spill) -> io::Result<()>,
    ) -> io::Result<()> {
        let seq = self.next_seq;
        let inode = self
            .inodes
            .get_mut(&ino)
            .ok_or_else(|| errno(libc::ENOENT))?;
        let data = match &mut inode.body {
            Body::File(data) => data,
            Body::Dir => return Err(errno(libc::EISDIR)),
            Body::Special(_) => return Err(errno(libc::EINVAL)),
        };
        op(data, seq, &mut self.spill)?;
        inode.meta.modified();
        self.next_seq += 1;
        self.pending_data_ops += 1;
        Ok(())
    }

    pub(crate) fn write(&mut self, ino: Ino, offset_bytes: u64, data: &[u8]) -> io::Result<u32> {
        let written = u32::try_from(data.len()).map_err(|_| errno(libc::EINVAL))?;
        if written == 0 {
            return Ok(0);
        }
        self.data_op(ino, |file, seq, spill| {
            file.write(seq, offset_bytes, data, spill)
        })?;
        Ok(written)
    }

    pub(crate) fn setattr(&mut self, ino: Ino, set: SetAttr) -> io::Result<Attr> {
        if let Some(size) = set.size_bytes {
            self.data_op(ino, |file, seq, _| file.set_len(seq, size))?;
        }
        let meta = &mut self.inode_mut(ino)?.meta;
        let now = SystemTime::now();
        if set.perm.is_some() || set.uid.is_some() || set.gid.is_some() {
            meta.ctime = now;
        }
        meta.owner.perm = set.perm.unwrap_or(meta.owner.perm);
        meta.owner.uid = set.uid.unwrap_or(meta.owner.uid);
        meta.owner.gid = set.gid.unwrap_or(meta.owner.gid);
        meta.atime = set.atime.unwrap_or(meta.atime);
        meta.mtime = set.mtime.unwrap_or(meta.mtime);
        self.attr(ino)
    }

    /// fallocate: mode 0 and `KEEP_SIZE` (allocate), `PUNCH_HOLE|KEEP_SIZE`,
    /// `ZERO_RANGE` with or without `KEEP_SIZE`; anything else is
    /// `EOPNOTSUPP`, as on a file system without it.
    pub(crate) fn fallocate(
        &mut self,
        ino: Ino,
        offset_bytes: u64,
        len_bytes: u64,
        mode: i32,
    ) -> io::Result<()> {
        if len_bytes == 0 {
            return Err(errno(libc::EINVAL));
        }
        let end = offset_bytes
            .checked_add(len_bytes)
            .ok_or_else(|| errno(libc::EFBIG))?;
        const KEEP: i32 = libc::FALLOC_FL_KEEP_SIZE;
        const PUNCH: i32 = libc::FALLOC_FL_PUNCH_HOLE;
        const ZERO: i32 = libc::FALLOC_FL_ZERO_RANGE;
        match mode {
            0 if end > self.file(ino)?.size_bytes() => {
                self.data_op(ino, |file, seq, _| file.set_len(seq, end))
            }
            0 | KEEP => self.file(ino).map(|_| ()),
            m if m == PUNCH | KEEP || m == ZERO || m == ZERO | KEEP => {
                let keep_size = m & KEEP != 0;
                self.data_op(ino, |file, seq, _| {
                    file.zero(seq, offset_bytes, len_bytes, keep_size)
                })
            }
            _ => Err(errno(libc::EOPNOTSUPP)),
        }
    }

    /// fsync / fdatasync of a file: its whole data log becomes durable (not
    /// its name). On a directory: `fsyncdir`.
    pub(crate) fn fsync(&mut self, ino: Ino) -> io::Result<()> {
        let inode = self
            .inodes
            .get_mut(&ino)
            .ok_or_else(|| errno(libc::ENOENT))?;
        let data = match &mut inode.body {
            Body::File(data) => data,
            Body::Dir => {
                self.fsyncdir(ino);
                return Ok(());
            }
            Body::Special(_) => return Ok(()),
        };
        let synced = data.sync(&mut self.spill)?;
        self.pending_data_ops -= synced;
        self.reset_spill_if_idle()
    }

    /// fsyncdir: every logged op of directory `dir`, and every op logged
    /// before it, becomes durable.
    pub(crate) fn fsyncdir(&mut self, dir: Ino) {
        if let Some(last) = self.ns_log.iter().rposition(|op| op.touches(dir)) {
            self.make_durable(last + 1);
        }
    }

    /// The first `n` logged namespace ops become durable.
    fn make_durable(&mut self, n: usize) {
        let mut touched = Vec::new();
        for op in self.ns_log.drain(..n) {
            self.dur.apply(&op);
            for ino in op.inos() {
                if let Some(refs) = self.ns_refs.get_mut(&ino) {
                    *refs -= 1;
                    if *refs == 0 {
                        self.ns_refs.remove(&ino);
                    }
                }
                touched.push(ino);
            }
        }
        for ino in touched {
            self.collect(ino);
        }
    }

    /// Whether `ino` has a name, or may get one back from a cut: only then
    /// can its data survive one.
    fn can_survive(&self, ino: Ino) -> bool {
        self.cur.contains(ino) || self.dur.contains(ino) || self.ns_refs.contains_key(&ino)
    }

    /// The kernel was given an entry for `ino` (lookup, create, link).
    pub(crate) fn remember_lookup(&mut self, ino: Ino) {
        if let Some(inode) = self.inodes.get_mut(&ino) {
            inode.kernel_lookups += 1;
        }
    }

    /// The kernel forgot `n` of its entries for `ino` (FUSE FORGET).
    pub(crate) fn forget(&mut self, ino: Ino, n: u64) {
        if let Some(inode) = self.inodes.get_mut(&ino) {
            inode.kernel_lookups = inode.kernel_lookups.saturating_sub(n);
        }
        self.collect(ino);
    }

    /// Whether `ino` may be removed (or replaced) by an operation on a
    /// directory (`dir`) or a non-directory: the errno unlink, rmdir and
    /// rename give otherwise.
    fn check_replaceable(&self, ino: Ino, dir: bool) -> io::Result<()> {
        match (dir, self.cur.is_dir(ino)) {
            (true, false) => Err(errno(libc::ENOTDIR)),
            (false, true) => Err(errno(libc::EISDIR)),
            (true, true) if self.cur.entries(ino).is_some_and(|e| !e.is_empty()) => {
                Err(errno(libc::ENOTEMPTY))
            }
            _ => Ok(()),
        }
    }

    /// Deletes `ino` if nothing can bring it back any more and it is not
    /// open or known to the kernel.
    fn collect(&mut self, ino: Ino) {
        let held = self
            .inodes
            .get(&ino)
            .is_some_and(|i| i.open_count > 0 || i.kernel_lookups > 0);
        if held || self.can_survive(ino) {
            return;
        }
        if let Some(Inode {
            body: Body::File(data),
            ..
        }) = self.inodes.remove(&ino)
        {
            self.pending_data_ops -= data.log().len();
            data.remove(&mut self.spill);
            let _ = self.reset_spill_if_idle();
        }
    }

    fn reset_spill_if_idle(&mut self) -> io::Result<()> {
        if self.pending_data_ops == 0 {
            self.spill.reset()?;
        }
        Ok(())
    }

    pub(crate) fn pending(&self) -> Pending {
        let mut pending = Pending {
            namespace_ops: self.ns_log.len(),
            ..Pending::default()
        };
        for (ino, inode) in &self.inodes {
            let Body::File(data) = &inode.body else {
                continue;
            };
            if data.log().is_empty() || !self.can_survive(*ino) {
                continue;
            }
            pending.files += 1;
            pending.data_ops += data.log().len();
            for op in data.log() {
                if let DataOpKind::Write { spill, .. } = op.kind {
                    pending.data_bytes += spill.len_bytes;
                }
            }
        }
        pending
    }

    /// The power cut (see the module doc of `lossy_fs` for the modes).
    pub(crate) fn power_cut(&mut self, mode: LossMode, seed: u64) -> io::Result<CutReport> {
        // Nothing is open across a cut; files only open before it are gone
        // (whether the kernel's last release arrived before the unmount
        // must not change the outcome).
        let inos: Vec<Ino> = self.inodes.keys().copied().collect();
        for ino in inos {
            if let Some(inode) = self.inodes.get_mut(&ino) {
                inode.open_count = 0;
                inode.kernel_lookups = 0;
            }
            self.collect(ino);
        }
        let mut rng = SplitMix64::new(seed);
        let ns_total = self.ns_log.len();
        let ns_kept = match mode {
            LossMode::DropAll => 0,
            LossMode::Subset => rng.below(ns_total as u64 + 1) as usize,
            LossMode::Torn | LossMode::KeepAll => ns_total,
        };
        let decisions = self.decide_data(mode, &mut rng);
        let mut report = CutReport {
            namespace_ops_kept: ns_kept,
            namespace_ops_lost: ns_total - ns_kept,
            ..CutReport::default()
        };
        for keep in decisions.keep.values() {
            match keep {
                Keep::All => report.data_ops_kept += 1,
                _ => report.data_ops_lost += 1,
            }
        }
        report.torn = decisions.torn.map(|t| {
            let path = self.cur.path_of(t.ino).or_else(|| self.dur.path_of(t.ino));
            let path = path.unwrap_or_else(|| format!("<unlinked inode {}>", t.ino));
            (path, t.offset_bytes, t.kept_bytes, t.len_bytes)
        });
        for op in self.ns_log.drain(..ns_kept) {
            self.dur.apply(&op);
        }
        self.apply_cut(&decisions.keep)?;
        Ok(report)
    }

    /// Which pending data ops survive, drawn in their global order so the
    /// same seed and history give the same answer.
    fn decide_data(&self, mode: LossMode, rng: &mut SplitMix64) -> Decisions {
        let mut ops: Vec<(u64, Ino, DataOpKind)> = Vec::new();
        for (ino, inode) in &self.inodes {
            if let Body::File(data) = &inode.body {
                ops.extend(data.log().iter().map(|op| (op.seq, *ino, op.kind)));
            }
        }
        ops.sort_unstable_by_key(|(seq, _, _)| *seq);
        let torn_seq = match mode {
            LossMode::Torn => ops
                .iter()
                .rev()
                .find(|(_, _, kind)| matches!(kind, DataOpKind::Write { .. }))
                .map(|(seq, _, _)| *seq),
            _ => None,
        };
        let mut decisions = Decisions {
            keep: BTreeMap::new(),
            torn: None,
        };
        for (seq, ino, kind) in ops {
            let keep = match (mode, kind) {
                (LossMode::DropAll, _) => Keep::Nothing,
                (LossMode::KeepAll, _) => Keep::All,
                (LossMode::Subset, _) if rng.coin() => Keep::All,
                (LossMode::Subset, _) => Keep::Nothing,
                (
                    LossMode::Torn,
                    DataOpKind::Write {
                        offset_bytes,
                        spill,
                    },
                ) if Some(seq) == torn_seq => {
                    let kept_bytes = tear(offset_bytes, spill.len_bytes, rng);
                    decisions.torn = Some(Torn {
                        ino,
                        offset_bytes,
                        kept_bytes,
                        len_bytes: spill.len_bytes,
                    });
                    Keep::Prefix(kept_bytes)
                }
                (LossMode::Torn, _) => Keep::All,
            };
            decisions.keep.insert(seq, keep);
        }
        decisions
    }

    /// After the cut's namespace prefix reached `dur`: the kept data reaches
    /// the surviving files, the unreachable inodes go, and the current state
    /// becomes the durable one.
    fn apply_cut(&mut self, keep: &BTreeMap<u64, Keep>) -> io::Result<()> {
        self.ns_log.clear();
        self.ns_refs.clear();
        for (ino, inode) in &mut self.inodes {
            if let Body::File(data) = &mut inode.body {
                if self.dur.contains(*ino) && !data.log().is_empty() {
                    let decide = |op: &super::data::DataOp| {
                        keep.get(&op.seq).copied().unwrap_or(Keep::Nothing)
                    };
                    data.cut(decide, &mut self.spill)?;
                }
            }
        }
        let dead: Vec<Ino> = self
            .inodes
            .keys()
            .copied()
            .filter(|ino| !self.dur.contains(*ino))
            .collect();
        for ino in dead {
            if let Some(Inode {
                body: Body::File(data),
                ..
            }) = self.inodes.remove(&ino)
            {
                data.remove(&mut self.spill);
            }
        }
        self.cur = self.dur.clone();
        self.pending_data_ops = 0;
        self.spill.reset()
    }

    /// Inodes that exist (for tests and sanity checks).
    #[cfg(test)]
    fn inode_count(&self) -> usize {
        debug_assert!(self.dur.reachable().all(|i| self.inodes.contains_key(&i)));
        self.inodes.len()
    }
}

/// The two directories a namespace op changes (the same one twice if one).
fn op_dirs(op: &NsOp) -> (Ino, Ino) {
    match op {
        NsOp::Link { at, .. } | NsOp::Unlink { at, .. } => (at.dir, at.dir),
        NsOp::Rename { from, to, .. } => (from.dir, to.dir),
        NsOp::Exchange { a, b, .. } => (a.dir, b.dir),
    }
}

/// Where the torn write was cut.
#[derive(Debug, Clone, Copy)]
struct Torn {
    ino: Ino,
    offset_bytes: u64,
    kept_bytes: u64,
    len_bytes: u64,
}

struct Decisions {
    keep: BTreeMap<u64, Keep>,
    torn: Option<Torn>,
}

/// How many bytes of a write at `offset` of `len` bytes survive a tear: up
/// to a random 512-byte or 4 KiB boundary (of the file offset) strictly
/// inside the write; 0 when it crosses none.
fn tear(offset_bytes: u64, len_bytes: u64, rng: &mut SplitMix64) -> u64 {
    let end = offset_bytes + len_bytes;
    let boundaries = |g: u64| {
        let first = (offset_bytes / g + 1) * g;
        let last = end.saturating_sub(1) / g * g;
        (first <= last).then(|| (first, (last - first) / g + 1, g))
    };
    let pick = if rng.coin() {
        boundaries(4096).or_else(|| boundaries(512))
    } else {
        boundaries(512)
    };
    match pick {
        Some((first, count, g)) => first + rng.below(count) * g - offset_bytes,
        None => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const OWNER: Owner = Owner {
        perm: 0o644,
        uid: 0,
        gid: 0,
    };

    fn model() -> (tempfile::TempDir, Model) {
        let dir = tempfile::tempdir().unwrap();
        let m = Model::new(dir.path(), OWNER).unwrap();
        (dir, m)
    }

    fn name(s: &str) -> &OsStr {
        OsStr::new(s)
    }

    /// Inode at `path` ("a/b"), if it exists.
    fn resolve(m: &Model, path: &str) -> Option<Ino> {
        let mut at = ROOT;
        for part in path.split('/') {
            at = m.lookup(at, name(part)).ok()?.ino;
        }
        Some(at)
    }

    fn content(m: &Model, path: &str) -> Option<Vec<u8>> {
        Some(m.read(resolve(m, path)?, 0, u32::MAX).unwrap())
    }

    fn new_file(m: &mut Model, parent: Ino, n: &str) -> Ino {
        m.create(parent, name(n), Kind::File, OWNER).unwrap().ino
    }

    #[test]
    fn unsynced_write_is_lost_synced_write_survives_every_mode() {
        for mode in crate::lossy_fs::LOSS_MODES {
            let (_d, mut m) = model();
            let f = new_file(&mut m, ROOT, "f");
            m.write(f, 0, b"synced").unwrap();
            m.fsync(f).unwrap();
            m.fsyncdir(ROOT);
            m.write(f, 0, b"UNSYNC").unwrap();
            let report = m.power_cut(mode, 3).unwrap();
            let got = content(&m, "f").unwrap();
            match mode {
                LossMode::DropAll => assert_eq!(got, b"synced"),
                LossMode::KeepAll => assert_eq!(got, b"UNSYNC"),
                LossMode::Torn => {
                    assert_eq!(got, b"synced");
                    assert_eq!(report.torn, Some(("f".into(), 0, 0, 6)));
                }
                LossMode::Subset => assert!(got == b"synced" || got == b"UNSYNC"),
            }
            assert_eq!(m.pending().data_ops, 0);
        }
    }

    #[test]
    fn file_synced_in_an_unsynced_directory_is_gone_after_drop_all() {
        let (_d, mut m) = model();
        let f = new_file(&mut m, ROOT, "f");
        m.write(f, 0, b"data").unwrap();
        m.fsync(f).unwrap();
        assert_eq!(m.pending().namespace_ops, 1);
        m.power_cut(LossMode::DropAll, 0).unwrap();
        assert_eq!(resolve(&m, "f"), None);
        assert_eq!(m.inode_count(), 1);
    }

    #[test]
    fn rename_and_unlink_are_undone_unless_the_directory_is_synced() {
        let (_d, mut m) = model();
        let f = new_file(&mut m, ROOT, "a");
        m.write(f, 0, b"x").unwrap();
        m.fsync(f).unwrap();
        m.fsyncdir(ROOT);
        m.rename(
            Entry::new(ROOT, name("a")),
            Entry::new(ROOT, name("b")),
            RenameMode::Replace,
        )
        .unwrap();
        m.power_cut(LossMode::DropAll, 0).unwrap();
        assert_eq!(content(&m, "a").unwrap(), b"x");
        assert_eq!(resolve(&m, "b"), None);
        m.remove(ROOT, name("a"), false).unwrap();
        m.power_cut(LossMode::DropAll, 0).unwrap();
        assert_eq!(content(&m, "a").unwrap(), b"x");
        m.rename(
            Entry::new(ROOT, name("a")),
            Entry::new(ROOT, name("b")),
            RenameMode::Replace,
        )
        .unwrap();
        m.fsyncdir(ROOT);
        m.power_cut(LossMode::DropAll, 0).unwrap();
        assert_eq!(content(&m, "b").unwrap(), b"x");
    }

    #[test]
    fn fsyncdir_makes_the_prefix_durable_across_directories() {
        let (_d, mut m) = model();
        let d = m.create(ROOT, name("d"), Kind::Dir, OWNER).unwrap().ino;
        let f = new_file(&mut m, d, "f");
        new_file(&mut m, ROOT, "later");
        // Syncing d also makes its mkdir (an earlier op of the root) durable.
        m.fsyncdir(d);
        assert_eq!(m.pending().namespace_ops, 1);
        m.power_cut(LossMode::DropAll, 0).unwrap();
        assert_eq!(resolve(&m, "d/f"), Some(f));
        assert_eq!(resolve(&m, "later"), None);
    }

    #[test]
    fn staging_hard_link_pattern_survives_and_temporaries_are_collected() {
        let (_d, mut m) = model();
        let s = new_file(&mut m, ROOT, "staging");
        m.write(s, 0, b"object").unwrap();
        m.fsync(s).unwrap();
        m.link(s, ROOT, name("final")).unwrap();
        m.remove(ROOT, name("staging"), false).unwrap();
        m.fsyncdir(ROOT);
        let t = new_file(&mut m, ROOT, "tmp");
        m.write(t, 0, &[1u8; 100_000]).unwrap();
        m.remove(ROOT, name("tmp"), false).unwrap();
        m.fsyncdir(ROOT);
        assert_eq!(m.inode_count(), 2);
        assert_eq!(m.pending().data_ops, 0);
        m.power_cut(LossMode::DropAll, 0).unwrap();
        assert_eq!(content(&m, "final").unwrap(), b"object");
        assert_eq!(m.attr(s).unwrap().nlink, 1);
    }

    #[test]
    fn open_unlinked_file_lives_until_released() {
        let (_d, mut m) = model();
        let f = new_file(&mut m, ROOT, "f");
        m.open(f).unwrap();
        m.remove(ROOT, name("f"), false).unwrap();
        m.fsyncdir(ROOT);
        m.write(f, 0, b"abc").unwrap();
        assert_eq!(m.read(f, 0, 10).unwrap(), b"abc");
        m.release(f);
        assert_eq!(m.inode_count(), 1);
    }

    /// The history the Subset tests replay.
    fn subset_history(m: &mut Model) {
        let f = new_file(m, ROOT, "f");
        m.fsyncdir(ROOT);
        for i in 0..12u8 {
            m.write(f, u64::from(i) * 10, &[i + 1; 10]).unwrap();
        }
        for i in 0..6 {
            new_file(m, ROOT, &format!("n{i}"));
        }
    }

    fn listing(m: &Model) -> Vec<(OsString, Vec<u8>)> {
        m.readdir(ROOT)
            .unwrap()
            .into_iter()
            .skip(2)
            .map(|e| (e.name.clone(), m.read(e.ino, 0, u32::MAX).unwrap()))
            .collect()
    }

    #[test]
    fn subset_is_reproducible_and_keeps_some_and_loses_some() {
        let mut outcomes = Vec::new();
        for seed in 0..16 {
            let mut runs = Vec::new();
            for _ in 0..2 {
                let (_d, mut m) = model();
                subset_history(&mut m);
                let report = m.power_cut(LossMode::Subset, seed).unwrap();
                runs.push((report, listing(&m)));
            }
            assert_eq!(
                format!("{:?}", runs[0]),
                format!("{:?}", runs[1]),
                "seed {seed}"
            );
            outcomes.push(runs.remove(0));
        }
        assert!(outcomes.iter().any(|(r, _)| r.data_ops_kept > 0));
        assert!(outcomes.iter().any(|(r, _)| r.data_ops_lost > 0));
        assert!(outcomes.iter().any(|(r, _)| r.namespace_ops_kept > 0));
        assert!(outcomes.iter().any(|(r, _)| r.namespace_ops_lost > 0));
        for (report, listing) in &outcomes {
            assert_eq!(listing.len(), 1 + report.namespace_ops_kept);
            assert_eq!(report.data_ops_kept + report.data_ops_lost, 12);
        }
    }

    #[test]
    fn subset_keeps_each_write_or_not_in_order() {
        for seed in 0..32 {
            let (_d, mut m) = model();
            subset_history(&mut m);
            m.power_cut(LossMode::Subset, seed).unwrap();
            let got = content(&m, "f").unwrap();
            // Each 10-byte slot holds its write or zeros; the size ends at
            // the last kept write.
            for (i, chunk) in got.chunks(10).enumerate() {
                assert!(
                    chunk == [i as u8 + 1; 10] || chunk == [0u8; 10],
                    "{seed}: {got:?}"
                );
            }
            assert!(got.is_empty() || got[got.len() - 1] != 0);
        }
    }

    #[test]
    fn torn_cuts_the_last_write_at_a_boundary() {
        for seed in 0..20 {
            let (_d, mut m) = model();
            let f = new_file(&mut m, ROOT, "f");
            m.fsyncdir(ROOT);
            m.write(f, 0, &[1u8; 1000]).unwrap();
            m.write(f, 100, &[2u8; 10_000]).unwrap();
            let report = m.power_cut(LossMode::Torn, seed).unwrap();
            let (path, offset, kept, len) = report.torn.clone().unwrap();
            assert_eq!((path.as_str(), offset, len), ("f", 100, 10_000));
            assert!(
                kept > 0 && kept < len && (offset + kept).is_multiple_of(512),
                "{kept}"
            );
            let got = content(&m, "f").unwrap();
            assert_eq!(got.len() as u64, 1000.max(offset + kept));
            assert!(got[..100].iter().all(|b| *b == 1));
            assert!(got[100..(100 + kept) as usize].iter().all(|b| *b == 2));
            assert!(got[(100 + kept) as usize..].iter().all(|b| *b == 1));
            assert_eq!((report.data_ops_kept, report.data_ops_lost), (1, 1));
        }
    }

    #[test]
    fn tear_boundaries() {
        let mut rng = SplitMix64::new(1);
        for _ in 0..200 {
            assert_eq!(tear(0, 512, &mut rng), 0);
            assert_eq!(tear(1, 511, &mut rng), 0);
            assert_eq!(tear(100, 500, &mut rng), 412);
            let k = tear(4000, 9000, &mut rng);
            assert!(k > 0 && k < 9000 && (4000 + k).is_multiple_of(512));
        }
        let fours = (0..200)
            .filter(|_| (4000 + tear(4000, 9000, &mut rng)).is_multiple_of(4096))
            .count();
        assert!(fours > 50, "{fours}");
    }

    #[test]
    fn namespace_errors() {
        let (_d, mut m) = model();
        let d = m.create(ROOT, name("d"), Kind::Dir, OWNER).unwrap().ino;
        let f = new_file(&mut m, d, "f");
        let code = |r: io::Result<()>| r.unwrap_err().raw_os_error();
        assert_eq!(code(m.remove(ROOT, name("d"), true)), Some(libc::ENOTEMPTY));
        assert_eq!(code(m.remove(ROOT, name("d"), false)), Some(libc::EISDIR));
        assert_eq!(code(m.remove(d, name("f"), true)), Some(libc::ENOTDIR));
        let into_self = m.rename(
            Entry::new(ROOT, name("d")),
            Entry::new(d, name("x")),
            RenameMode::Replace,
        );
        assert_eq!(code(into_self), Some(libc::EINVAL));
        let noreplace = m.rename(
            Entry::new(d, name("f")),
            Entry::new(ROOT, name("d")),
            RenameMode::NoReplace,
        );
        assert_eq!(code(noreplace), Some(libc::EEXIST));
        assert_eq!(
            m.link(d, ROOT, name("l")).unwrap_err().raw_os_error(),
            Some(libc::EPERM)
        );
        let into_itself = m.rename(
            Entry::new(d, name("f")),
            Entry::new(ROOT, name("d")),
            RenameMode::Exchange,
        );
        assert_eq!(code(into_itself), Some(libc::EINVAL));
        let x = new_file(&mut m, ROOT, "x");
        let exch = m.rename(
            Entry::new(d, name("f")),
            Entry::new(ROOT, name("x")),
            RenameMode::Exchange,
        );
        assert!(exch.is_ok());
        assert_eq!((resolve(&m, "x"), resolve(&m, "d/f")), (Some(f), Some(x)));
        assert_eq!(
            m.fallocate(f, 0, 10, libc::FALLOC_FL_COLLAPSE_RANGE)
                .unwrap_err()
                .raw_os_error(),
            Some(libc::EOPNOTSUPP)
        );
    }

    #[test]
    fn fallocate_and_set_len_are_data_ops() {
        let (_d, mut m) = model();
        let f = new_file(&mut m, ROOT, "f");
        m.fsyncdir(ROOT);
        m.write(f, 0, &[9u8; 8192]).unwrap();
        m.fsync(f).unwrap();
        m.fallocate(
            f,
            1000,
            2000,
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
        )
        .unwrap();
        m.fallocate(f, 0, 10_000, 0).unwrap();
        assert_eq!(m.attr(f).unwrap().size_bytes, 10_000);
        assert_eq!(m.pending().data_ops, 2);
        let mut keep = content(&m, "f").unwrap();
        m.power_cut(LossMode::KeepAll, 0).unwrap();
        assert_eq!(content(&m, "f").unwrap(), keep);
        assert!(keep[1000..3000].iter().all(|b| *b == 0));
        m.setattr(
            f,
            SetAttr {
                size_bytes: Some(5),
                ..SetAttr::default()
            },
        )
        .unwrap();
        m.power_cut(LossMode::DropAll, 0).unwrap();
        assert_eq!(content(&m, "f").unwrap(), keep);
        m.setattr(
            f,
            SetAttr {
                size_bytes: Some(5),
                ..SetAttr::default()
            },
        )
        .unwrap();
        m.fsync(f).unwrap();
        m.power_cut(LossMode::DropAll, 0).unwrap();
        keep.truncate(5);
        assert_eq!(content(&m, "f").unwrap(), keep);
    }
}
