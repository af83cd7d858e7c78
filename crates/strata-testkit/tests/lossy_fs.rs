//! lossy_fs through a real FUSE mount: what survives each kind of power cut,
//! compared with what POSIX promises (std::fs calls on the mount point).
//!
//! Every test mounts under its own tempdir. Without /dev/fuse the tests say
//! so on stderr and return.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, HashSet};
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

use strata_testkit::lossy_fs::{CutReport, LossMode, LossyFs, LossyMount, LOSS_MODES};

/// A file system mounted under a tempdir.
struct Rig {
    fs: LossyFs,
    mnt: PathBuf,
    mount: Option<LossyMount>,
    _tmp: tempfile::TempDir,
}

impl Rig {
    fn new() -> Option<Rig> {
        if !Path::new("/dev/fuse").exists() {
            eprintln!("SKIPPED: /dev/fuse is absent, lossy_fs cannot be mounted here");
            return None;
        }
        let tmp = tempfile::tempdir().unwrap();
        let fs = LossyFs::new(&tmp.path().join("backing")).unwrap();
        let mnt = tmp.path().join("mnt");
        std::fs::create_dir(&mnt).unwrap();
        let mount = Some(fs.mount(&mnt).unwrap());
        Some(Rig {
            fs,
            mnt,
            mount,
            _tmp: tmp,
        })
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.mnt.join(rel)
    }

    fn unmount(&mut self) {
        if let Some(mount) = self.mount.take() {
            mount.unmount().unwrap();
        }
    }

    /// Unmount, cut, mount again.
    fn cut(&mut self, mode: LossMode, seed: u64) -> CutReport {
        self.unmount();
        let report = self.fs.power_cut(mode, seed).unwrap();
        assert_eq!(self.fs.pending().data_ops, 0);
        assert_eq!(self.fs.pending().namespace_ops, 0);
        self.mount = Some(self.fs.mount(&self.mnt).unwrap());
        report
    }

    fn read(&self, rel: &str) -> Option<Vec<u8>> {
        match std::fs::read(self.path(rel)) {
            Ok(data) => Some(data),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => panic!("reading {rel}: {e}"),
        }
    }

    fn write(&self, rel: &str, offset: u64, data: &[u8]) {
        let f = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(self.path(rel))
            .unwrap();
        f.write_all_at(data, offset).unwrap();
    }

    fn fsync(&self, rel: &str) {
        File::open(self.path(rel)).unwrap().sync_all().unwrap();
    }

    fn fdatasync(&self, rel: &str) {
        File::open(self.path(rel)).unwrap().sync_data().unwrap();
    }

    /// Every regular file under the mount, by relative path.
    fn contents(&self) -> BTreeMap<String, Vec<u8>> {
        let mut out = BTreeMap::new();
        let mut dirs = vec![self.mnt.clone()];
        while let Some(dir) = dirs.pop() {
            for entry in std::fs::read_dir(&dir).unwrap() {
                let entry = entry.unwrap();
                let rel = entry.path().strip_prefix(&self.mnt).unwrap().to_owned();
                if entry.file_type().unwrap().is_dir() {
                    dirs.push(entry.path());
                } else {
                    let data = std::fs::read(entry.path()).unwrap();
                    out.insert(rel.to_string_lossy().into_owned(), data);
                }
            }
        }
        out
    }
}

macro_rules! rig {
    () => {
        match Rig::new() {
            Some(rig) => rig,
            None => return,
        }
    };
}

#[test]
fn unsynced_write_is_lost_and_synced_write_survives_every_mode() {
    for (i, mode) in LOSS_MODES.into_iter().enumerate() {
        let mut rig = rig!();
        rig.write("f", 0, b"synced data");
        rig.fsync("f");
        rig.fsync("");
        rig.write("g", 0, b"never synced");
        rig.fsync("");
        assert_eq!(rig.fs.pending().data_ops, 1);
        rig.cut(mode, i as u64);
        assert_eq!(rig.read("f").unwrap(), b"synced data", "{mode}");
        let g = rig.read("g").unwrap();
        match mode {
            LossMode::DropAll => assert_eq!(g, b""),
            LossMode::KeepAll => assert_eq!(g, b"never synced"),
            // The only write is the last one: 12 bytes cross no boundary.
            LossMode::Torn => assert_eq!(g, b""),
            LossMode::Subset => assert!(g.is_empty() || g == b"never synced"),
        }
    }
}

#[test]
fn fdatasync_makes_data_durable_but_not_the_name() {
    let mut rig = rig!();
    rig.write("f", 0, b"data");
    rig.fdatasync("f");
    assert_eq!(rig.fs.pending().data_ops, 0);
    assert_eq!(rig.fs.pending().namespace_ops, 1);
    rig.cut(LossMode::DropAll, 0);
    assert_eq!(rig.read("f"), None);
}

#[test]
fn created_and_fsynced_file_in_unsynced_directory_is_gone_after_drop_all() {
    let mut rig = rig!();
    std::fs::create_dir(rig.path("d")).unwrap();
    rig.fsync("");
    rig.write("d/f", 0, b"data");
    rig.fsync("d/f");
    rig.cut(LossMode::DropAll, 0);
    assert!(rig.path("d").is_dir());
    assert_eq!(rig.read("d/f"), None);
    // With the directory synced, it stays.
    rig.write("d/f", 0, b"data");
    rig.fsync("d/f");
    rig.fsync("d");
    rig.cut(LossMode::DropAll, 0);
    assert_eq!(rig.read("d/f").unwrap(), b"data");
}

#[test]
fn unsynced_rename_is_undone_and_synced_rename_survives() {
    let mut rig = rig!();
    std::fs::create_dir(rig.path("d")).unwrap();
    rig.write("a", 0, b"A");
    rig.fsync("a");
    rig.fsync("");
    std::fs::rename(rig.path("a"), rig.path("d/b")).unwrap();
    rig.cut(LossMode::DropAll, 0);
    assert_eq!(rig.read("a").unwrap(), b"A");
    assert_eq!(rig.read("d/b"), None);
    // Rename over an existing target, both directories synced.
    rig.write("d/b", 0, b"old");
    rig.fsync("d/b");
    rig.fsync("d");
    rig.fsync("");
    std::fs::rename(rig.path("a"), rig.path("d/b")).unwrap();
    rig.fsync("d");
    rig.fsync("");
    rig.cut(LossMode::DropAll, 0);
    assert_eq!(rig.read("a"), None);
    assert_eq!(rig.read("d/b").unwrap(), b"A");
}

#[test]
fn unsynced_unlink_is_undone() {
    let mut rig = rig!();
    rig.write("f", 0, b"still here");
    rig.fsync("f");
    rig.fsync("");
    std::fs::remove_file(rig.path("f")).unwrap();
    assert_eq!(rig.read("f"), None);
    rig.cut(LossMode::DropAll, 0);
    assert_eq!(rig.read("f").unwrap(), b"still here");
    std::fs::remove_file(rig.path("f")).unwrap();
    rig.fsync("");
    rig.cut(LossMode::DropAll, 0);
    assert_eq!(rig.read("f"), None);
}

fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8 | 1
        })
        .collect()
}

#[test]
fn torn_keeps_a_boundary_prefix_of_the_last_write_and_all_earlier_writes() {
    for seed in 0..6u64 {
        let mut rig = rig!();
        rig.write("f", 0, &[]);
        rig.fsync("");
        let first = pattern(1, 3000);
        let second = pattern(2, 2000);
        let last = pattern(3, 20_000);
        rig.write("f", 0, &first);
        rig.write("g", 0, &second);
        rig.fsync("");
        // Buffered and starting mid-page: the kernel sends [1000, 4096) as
        // one FUSE write and the rest as another, the one torn.
        rig.write("f", 1000, &last);
        let report = rig.cut(LossMode::Torn, seed);
        let (path, offset, kept, len) = report.torn.clone().unwrap();
        assert_eq!((path.as_str(), offset + len), ("f", 21_000), "{report:?}");
        assert!(offset >= 1000 && kept < len, "{report:?}");
        let cut_at = offset + kept;
        assert!(cut_at.is_multiple_of(512) && cut_at > 1000, "{report:?}");
        let mut want = first.clone();
        let end = cut_at as usize;
        want.resize(want.len().max(end), 0);
        want[1000..end].copy_from_slice(&last[..end - 1000]);
        assert_eq!(rig.read("f").unwrap(), want, "seed {seed}");
        assert_eq!(rig.read("g").unwrap(), second);
    }
}

/// The history the Subset tests run: several writes to one synced file,
/// then a few creates.
fn subset_history(rig: &Rig) {
    rig.write("f", 0, &[]);
    rig.fsync("f");
    rig.fsync("");
    for i in 0..10u8 {
        rig.write("f", u64::from(i) * 100, &[i + 1; 100]);
    }
    for i in 0..4 {
        rig.write(&format!("n{i}"), 0, b"x");
    }
}

#[test]
fn subset_is_reproducible_and_over_seeds_keeps_and_loses() {
    let mut outcomes = Vec::new();
    for seed in 0..6u64 {
        let mut runs = Vec::new();
        for _ in 0..2 {
            let mut rig = rig!();
            subset_history(&rig);
            let report = rig.cut(LossMode::Subset, seed);
            runs.push((format!("{report:?}"), report, rig.contents()));
        }
        assert_eq!(runs[0].0, runs[1].0, "seed {seed}");
        assert_eq!(runs[0].2, runs[1].2, "seed {seed}");
        let (_, report, contents) = runs.remove(0);
        // Every 100-byte slot of f holds its write or zeros.
        for (i, chunk) in contents["f"].chunks(100).enumerate() {
            assert!(
                chunk == [i as u8 + 1; 100] || chunk == [0; 100],
                "seed {seed}"
            );
        }
        outcomes.push((report, contents));
    }
    let total: Vec<(usize, usize, usize, usize)> = outcomes
        .iter()
        .map(|(r, _)| {
            (
                r.data_ops_kept,
                r.data_ops_lost,
                r.namespace_ops_kept,
                r.namespace_ops_lost,
            )
        })
        .collect();
    assert!(total.iter().any(|t| t.0 > 0), "{total:?}");
    assert!(total.iter().any(|t| t.1 > 0), "{total:?}");
    assert!(total.iter().any(|t| t.2 > 0), "{total:?}");
    assert!(total.iter().any(|t| t.3 > 0), "{total:?}");
    let distinct: HashSet<_> = outcomes.iter().map(|(_, c)| format!("{c:?}")).collect();
    assert!(distinct.len() > 1);
}

fn punch(file: &File, offset: u64, len: u64) {
    let mode = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
    // SAFETY: plain syscall on a descriptor `file` owns.
    let rc = unsafe { libc::fallocate(file.as_raw_fd(), mode, offset as i64, len as i64) };
    assert_eq!(rc, 0, "{}", std::io::Error::last_os_error());
}

#[test]
fn keep_all_keeps_everything_and_punch_hole_and_set_len_behave() {
    let mut rig = rig!();
    let data = pattern(9, 10_000);
    rig.write("f", 0, &data);
    rig.fsync("f");
    rig.fsync("");
    let f = OpenOptions::new().write(true).open(rig.path("f")).unwrap();
    punch(&f, 1000, 3000);
    f.set_len(8000).unwrap();
    f.set_len(9000).unwrap();
    let mut want = data.clone();
    want[1000..4000].fill(0);
    want.truncate(8000);
    want.resize(9000, 0);
    assert_eq!(rig.read("f").unwrap(), want, "pending");
    assert_eq!(rig.fs.pending().data_ops, 3);
    drop(f);
    rig.write("new", 0, b"new");
    std::fs::create_dir(rig.path("dir")).unwrap();
    rig.cut(LossMode::KeepAll, 0);
    assert_eq!(rig.read("f").unwrap(), want, "kept");
    assert_eq!(rig.read("new").unwrap(), b"new");
    assert!(rig.path("dir").is_dir());
    // The same ops lost, then synced.
    rig.write("f", 0, &data);
    rig.fsync("f");
    let f = OpenOptions::new().write(true).open(rig.path("f")).unwrap();
    punch(&f, 1000, 3000);
    f.set_len(8000).unwrap();
    drop(f);
    rig.cut(LossMode::DropAll, 0);
    assert_eq!(rig.read("f").unwrap(), data, "lost");
    let f = OpenOptions::new().write(true).open(rig.path("f")).unwrap();
    punch(&f, 1000, 3000);
    f.set_len(8000).unwrap();
    f.sync_all().unwrap();
    drop(f);
    rig.cut(LossMode::DropAll, 0);
    let mut want = data;
    want[1000..4000].fill(0);
    want.truncate(8000);
    assert_eq!(rig.read("f").unwrap(), want, "synced");
}

#[test]
fn staging_hard_link_then_unlink_survives_when_the_directory_is_synced() {
    let mut rig = rig!();
    std::fs::create_dir_all(rig.path("store/objects")).unwrap();
    rig.fsync("store");
    rig.fsync("");
    rig.write("store/objects/.tmp-1", 0, b"object bytes");
    rig.fsync("store/objects/.tmp-1");
    std::fs::hard_link(
        rig.path("store/objects/.tmp-1"),
        rig.path("store/objects/obj"),
    )
    .unwrap();
    assert_eq!(
        std::fs::metadata(rig.path("store/objects/obj"))
            .unwrap()
            .nlink(),
        2
    );
    std::fs::remove_file(rig.path("store/objects/.tmp-1")).unwrap();
    // Not synced yet: the link (and the staging file) are lost.
    rig.cut(LossMode::DropAll, 0);
    assert_eq!(rig.contents(), BTreeMap::new());
    rig.write("store/objects/.tmp-1", 0, b"object bytes");
    rig.fsync("store/objects/.tmp-1");
    std::fs::hard_link(
        rig.path("store/objects/.tmp-1"),
        rig.path("store/objects/obj"),
    )
    .unwrap();
    std::fs::remove_file(rig.path("store/objects/.tmp-1")).unwrap();
    rig.fsync("store/objects");
    for (i, mode) in LOSS_MODES.into_iter().enumerate() {
        rig.cut(mode, i as u64);
        let want = BTreeMap::from([("store/objects/obj".to_owned(), b"object bytes".to_vec())]);
        assert_eq!(rig.contents(), want, "{mode}");
        assert_eq!(
            std::fs::metadata(rig.path("store/objects/obj"))
                .unwrap()
                .nlink(),
            1
        );
    }
}

#[test]
fn flock_works_in_the_mount() {
    let rig = rig!();
    rig.write("lock", 0, b"");
    let a = File::open(rig.path("lock")).unwrap();
    let b = File::open(rig.path("lock")).unwrap();
    let flock = |f: &File, op: i32| {
        // SAFETY: plain syscall on a descriptor `f` owns.
        unsafe { libc::flock(f.as_raw_fd(), op) }
    };
    assert_eq!(flock(&a, libc::LOCK_EX | libc::LOCK_NB), 0);
    assert_eq!(flock(&b, libc::LOCK_EX | libc::LOCK_NB), -1);
    assert_eq!(
        std::io::Error::last_os_error().raw_os_error(),
        Some(libc::EWOULDBLOCK)
    );
    assert_eq!(flock(&a, libc::LOCK_UN), 0);
    assert_eq!(flock(&b, libc::LOCK_EX | libc::LOCK_NB), 0);
}

#[test]
fn open_flags_and_metadata_behave() {
    let rig = rig!();
    let mut f = OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(rig.path("f"))
        .unwrap();
    f.write_all(b"hello").unwrap();
    drop(f);
    assert!(OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(rig.path("f"))
        .is_err());
    let mut f = OpenOptions::new().append(true).open(rig.path("f")).unwrap();
    f.write_all(b" world").unwrap();
    drop(f);
    assert_eq!(rig.read("f").unwrap(), b"hello world");
    use std::os::unix::fs::OpenOptionsExt;
    let f = OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_DIRECT)
        .open(rig.path("f"))
        .unwrap();
    f.write_all_at(&[7u8; 4096], 0).unwrap();
    drop(f);
    std::fs::write(rig.path("f"), b"short").unwrap();
    assert_eq!(rig.read("f").unwrap(), b"short");
    let meta = std::fs::metadata(rig.path("f")).unwrap();
    assert_eq!(
        (meta.len(), meta.nlink(), meta.uid()),
        (5, 1, unsafe { libc::getuid() })
    );
    assert!(std::os::unix::fs::symlink("f", rig.path("l")).is_err());
    // A unix socket binds (and is reachable) in the mount.
    let listener = std::os::unix::net::UnixListener::bind(rig.path("sock")).unwrap();
    let _client = std::os::unix::net::UnixStream::connect(rig.path("sock")).unwrap();
    let (_server, _) = listener.accept().unwrap();
    assert!(std::fs::symlink_metadata(rig.path("sock"))
        .unwrap()
        .file_type()
        .is_socket());
    std::fs::remove_file(rig.path("sock")).unwrap();
    std::fs::create_dir(rig.path("d")).unwrap();
    std::fs::create_dir(rig.path("d/e")).unwrap();
    assert_eq!(std::fs::metadata(rig.path("d")).unwrap().nlink(), 3);
    assert!(std::fs::remove_dir(rig.path("d")).is_err());
    for i in 0..300 {
        rig.write(&format!("d/many-{i}"), 0, b"");
    }
    std::fs::remove_dir_all(rig.path("d")).unwrap();
    assert!(!rig.path("d").exists());
    let st = statvfs(&rig.mnt);
    assert!(st.f_blocks > 0);
}

fn statvfs(path: &Path) -> libc::statvfs {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).unwrap();
    // SAFETY: zeroed plain C struct, valid NUL-terminated path.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    assert_eq!(unsafe { libc::statvfs(c.as_ptr(), &mut st) }, 0);
    st
}

#[test]
fn unmount_fails_clearly_while_busy_and_cut_needs_an_unmount() {
    let mut rig = rig!();
    rig.write("f", 0, b"x");
    let err = rig.fs.power_cut(LossMode::DropAll, 0).unwrap_err();
    assert!(err.to_string().contains("unmount first"), "{err}");
    let err = rig.fs.mount(&rig.mnt).unwrap_err();
    assert!(err.to_string().contains("already mounted") || err.to_string().contains("not empty"));
    let open = File::open(rig.path("f")).unwrap();
    let err = rig.mount.take().unwrap().unmount().unwrap_err();
    assert!(err.to_string().contains("busy"), "{err}");
    // The failed unmount detached the mount lazily: still "mounted" until
    // the last file closes.
    assert!(rig.fs.power_cut(LossMode::DropAll, 0).is_err());
    drop(open);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while rig.fs.power_cut(LossMode::DropAll, 0).is_err() {
        assert!(
            std::time::Instant::now() < deadline,
            "lazy unmount never finished"
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    rig.mount = Some(rig.fs.mount(&rig.mnt).unwrap());
    assert_eq!(rig.read("f"), None);
}

#[test]
fn concurrent_writers_and_syncs() {
    let mut rig = rig!();
    std::thread::scope(|s| {
        for t in 0..4u64 {
            let rig = &rig;
            s.spawn(move || {
                let name = format!("t{t}");
                for i in 0..50u64 {
                    rig.write(&name, i * 4096, &pattern(t * 1000 + i, 4096));
                    if i % 10 == 9 {
                        rig.fdatasync(&name);
                    }
                }
            });
        }
    });
    rig.fsync("");
    assert_eq!(rig.fs.pending().data_ops, 0);
    rig.cut(LossMode::DropAll, 0);
    for t in 0..4u64 {
        let got = rig.read(&format!("t{t}")).unwrap();
        let want: Vec<u8> = (0..50).flat_map(|i| pattern(t * 1000 + i, 4096)).collect();
        assert_eq!(got, want);
    }
}

// ---------------------------------------------------------------------
// Randomized: the mount against a reference model of the POSIX rules.
// ---------------------------------------------------------------------

/// An unsynced data op in the reference.
#[derive(Debug, Clone)]
enum RefData {
    Write {
        seq: u64,
        offset: u64,
        data: Vec<u8>,
    },
    SetLen(u64),
}

impl RefData {
    fn apply(&self, content: &mut Vec<u8>, write_limit: Option<u64>) {
        match self {
            RefData::Write { offset, data, .. } => {
                let len = write_limit.map_or(data.len(), |n| n as usize);
                if len == 0 {
                    return;
                }
                let (start, end) = (*offset as usize, *offset as usize + len);
                if content.len() < end {
                    content.resize(end, 0);
                }
                content[start..end].copy_from_slice(&data[..len]);
            }
            RefData::SetLen(size) => content.resize(*size as usize, 0),
        }
    }
}

#[derive(Debug, Clone, Default)]
struct RefFile {
    durable: Vec<u8>,
    current: Vec<u8>,
    pending: Vec<RefData>,
}

#[derive(Debug, Clone)]
enum RefNs {
    Create(String, usize),
    Rename(String, String),
    Unlink(String),
}

fn dir_of(path: &str) -> &str {
    path.rsplit_once('/').map_or("", |(d, _)| d)
}

impl RefNs {
    fn touches(&self, dir: &str) -> bool {
        match self {
            RefNs::Create(p, _) | RefNs::Unlink(p) => dir_of(p) == dir,
            RefNs::Rename(a, b) => dir_of(a) == dir || dir_of(b) == dir,
        }
    }

    fn apply(&self, names: &mut BTreeMap<String, usize>) {
        match self {
            RefNs::Create(p, id) => {
                names.insert(p.clone(), *id);
            }
            RefNs::Rename(a, b) => {
                if let Some(id) = names.remove(a) {
                    names.insert(b.clone(), id);
                }
            }
            RefNs::Unlink(p) => {
                names.remove(p);
            }
        }
    }
}

/// What POSIX promises, for a tree of `d/` and the root.
#[derive(Debug, Default)]
struct Reference {
    files: Vec<RefFile>,
    current: BTreeMap<String, usize>,
    durable: BTreeMap<String, usize>,
    log: Vec<RefNs>,
    next_seq: u64,
}

impl Reference {
    fn ns(&mut self, op: RefNs) {
        op.apply(&mut self.current);
        self.log.push(op);
    }

    fn data(&mut self, path: &str, op: RefData) {
        let file = &mut self.files[self.current[path]];
        op.apply(&mut file.current, None);
        file.pending.push(op);
    }

    fn fsync(&mut self, path: &str) {
        let file = &mut self.files[self.current[path]];
        for op in file.pending.drain(..) {
            op.apply(&mut file.durable, None);
        }
    }

    fn fsyncdir(&mut self, dir: &str) {
        if let Some(last) = self.log.iter().rposition(|op| op.touches(dir)) {
            for op in self.log.drain(..=last) {
                op.apply(&mut self.durable);
            }
        }
    }

    /// Namespace after keeping the first `k` pending ops.
    fn names_after(&self, k: usize) -> BTreeMap<String, usize> {
        let mut names = self.durable.clone();
        for op in &self.log[..k] {
            op.apply(&mut names);
        }
        names
    }

    /// Files that may still come back (whose pending ops lossy_fs counts).
    fn live(&self) -> HashSet<usize> {
        let mut live: HashSet<usize> = self.current.values().copied().collect();
        live.extend(self.durable.values().copied());
        for op in &self.log {
            if let RefNs::Create(_, id) = op {
                live.insert(*id);
            }
        }
        live
    }

    fn live_pending_ops(&self) -> usize {
        self.live()
            .iter()
            .map(|id| self.files[*id].pending.len())
            .sum()
    }

    /// The most recent pending write of a live file: (file, seq).
    fn last_write(&self) -> Option<(usize, u64)> {
        let mut best = None;
        for id in self.live() {
            for op in &self.files[id].pending {
                if let RefData::Write { seq, .. } = op {
                    if best.is_none_or(|(_, s)| *seq > s) {
                        best = Some((id, *seq));
                    }
                }
            }
        }
        best
    }
}

/// Every content reachable from `base` by applying a subsequence of `ops`.
fn subset_outcomes(base: &[u8], ops: &[RefData]) -> HashSet<Vec<u8>> {
    let mut states = HashSet::from([base.to_vec()]);
    for op in ops {
        let next: Vec<Vec<u8>> = states
            .iter()
            .map(|s| {
                let mut s = s.clone();
                op.apply(&mut s, None);
                s
            })
            .collect();
        states.extend(next);
    }
    states
}

fn direct_write(path: &Path, offset: u64, data: &[u8]) {
    use std::os::unix::fs::OpenOptionsExt;
    let f = OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_DIRECT)
        .open(path)
        .unwrap();
    f.write_all_at(data, offset).unwrap();
}

const NAMES: [&str; 5] = ["a", "b", "c", "d/a", "d/b"];

struct Lcg(u64);

impl Lcg {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) % n
    }
}

/// One random step, on the mount and on the reference.
fn random_step(rig: &Rig, r: &mut Reference, rng: &mut Lcg) {
    let name = NAMES[rng.below(NAMES.len() as u64) as usize];
    let exists = r.current.contains_key(name);
    // At most 8 pending ops per file keeps the Subset check's search small.
    let busy = exists && r.files[r.current[name]].pending.len() >= 8;
    match (rng.below(10), exists) {
        (0..=4, true) if busy => {
            rig.fsync(name);
            r.fsync(name);
        }
        (0..=2, true) => {
            let offset = rng.below(6000);
            let len = 1 + rng.below(5000) as usize;
            r.next_seq += 1;
            let data = pattern(r.next_seq, len);
            // O_DIRECT: one FUSE write per pwrite (a buffered write starting
            // mid-page reaches the file system as two).
            direct_write(&rig.path(name), offset, &data);
            let seq = r.next_seq;
            r.data(name, RefData::Write { seq, offset, data });
        }
        (3, true) => {
            let size = rng.below(8000);
            let f = OpenOptions::new().write(true).open(rig.path(name)).unwrap();
            f.set_len(size).unwrap();
            r.data(name, RefData::SetLen(size));
        }
        (4, true) => {
            rig.fsync(name);
            r.fsync(name);
        }
        (5, true) => {
            let to = NAMES[rng.below(NAMES.len() as u64) as usize];
            if to != name {
                std::fs::rename(rig.path(name), rig.path(to)).unwrap();
                r.ns(RefNs::Rename(name.into(), to.into()));
            }
        }
        (6, true) => {
            std::fs::remove_file(rig.path(name)).unwrap();
            r.ns(RefNs::Unlink(name.into()));
        }
        (_, false) if rng.below(2) == 0 => {
            File::create_new(rig.path(name)).unwrap();
            r.files.push(RefFile::default());
            r.ns(RefNs::Create(name.into(), r.files.len() - 1));
        }
        _ => {
            let dir = if rng.below(2) == 0 { "" } else { "d" };
            rig.fsync(dir);
            r.fsyncdir(dir);
        }
    }
}

fn expected(
    names: &BTreeMap<String, usize>,
    content: impl Fn(usize) -> Vec<u8>,
) -> BTreeMap<String, Vec<u8>> {
    names
        .iter()
        .map(|(p, id)| (p.clone(), content(*id)))
        .collect()
}

/// Checks the mount after a cut against what the reference allows.
fn check_cut(mode: LossMode, r: &Reference, report: &CutReport, got: &BTreeMap<String, Vec<u8>>) {
    match mode {
        LossMode::DropAll => {
            let want = expected(&r.durable, |id| r.files[id].durable.clone());
            assert_eq!(got, &want);
        }
        LossMode::KeepAll => {
            let want = expected(&r.current, |id| r.files[id].current.clone());
            assert_eq!(got, &want);
        }
        LossMode::Torn => check_torn(r, report, got),
        LossMode::Subset => check_subset(r, report, got),
    }
}

fn check_torn(r: &Reference, report: &CutReport, got: &BTreeMap<String, Vec<u8>>) {
    let last = r.last_write();
    let torn = report.torn.clone();
    assert_eq!(last.is_some(), torn.is_some(), "{report:?}");
    let content = |id: usize| {
        let file = &r.files[id];
        let mut c = file.durable.clone();
        for op in &file.pending {
            let limit = match (op, &torn, last) {
                (RefData::Write { seq, offset, data }, Some((_, off, kept, len)), Some((_, s)))
                    if *seq == s =>
                {
                    assert_eq!((*off, *len), (*offset, data.len() as u64));
                    Some(*kept)
                }
                _ => None,
            };
            op.apply(&mut c, limit);
        }
        c
    };
    if let (Some((path, off, kept, len)), Some((id, _))) = (&torn, last) {
        assert!(
            *kept < *len && (*kept == 0 || (off + kept).is_multiple_of(512)),
            "{report:?}"
        );
        let named = |names: &BTreeMap<String, usize>| names.get(path.as_str()) == Some(&id);
        assert!(
            path.starts_with('<') || named(&r.current) || named(&r.durable),
            "{report:?}"
        );
    }
    let want = expected(&r.current, content);
    assert_eq!(got, &want);
}

fn check_subset(r: &Reference, report: &CutReport, got: &BTreeMap<String, Vec<u8>>) {
    assert_eq!(
        report.namespace_ops_kept + report.namespace_ops_lost,
        r.log.len()
    );
    let names = r.names_after(report.namespace_ops_kept);
    let got_names: Vec<&String> = got.keys().collect();
    assert_eq!(got_names, names.keys().collect::<Vec<_>>(), "{report:?}");
    for (path, id) in &names {
        let file = &r.files[*id];
        let allowed = subset_outcomes(&file.durable, &file.pending);
        assert!(
            allowed.contains(&got[path]),
            "{path}: not durable + a subset of its ops in order"
        );
    }
}

#[test]
fn randomized_histories_match_the_reference_after_every_kind_of_cut() {
    let mut runs = 0;
    for (m, mode) in LOSS_MODES.into_iter().enumerate() {
        for seed in 0..8u64 {
            let mut rig = rig!();
            std::fs::create_dir(rig.path("d")).unwrap();
            rig.fsync("");
            let mut r = Reference::default();
            let mut rng = Lcg(seed * 31 + m as u64);
            for _ in 0..80 {
                random_step(&rig, &mut r, &mut rng);
            }
            rig.unmount();
            let pending = rig.fs.pending();
            assert_eq!(pending.namespace_ops, r.log.len());
            assert_eq!(pending.data_ops, r.live_pending_ops());
            let report = rig.cut(mode, seed);
            check_cut(mode, &r, &report, &rig.contents());
            runs += 1;
        }
    }
    assert_eq!(runs, 32);
}
