//! Ranged reads of the embedded store's files without a thread hand-off.
//!
//! `object_store`'s local backend runs every read on tokio's blocking pool
//! and opens the file each time; profiled under fio randrw that hand-off
//! (futex wake-ups and context switches) cost ~20% of the server's CPU. Here
//! a read is a `pread` on a cached descriptor, on the calling thread: for
//! the page-cache hits that dominate, a few microseconds. A cold read blocks
//! that worker for one disk read, which the budgeted read path tolerates.
//!
//! Objects are immutable once written, but a name can be deleted and
//! written again, so every put or delete through [`crate::Store`]
//! invalidates the name's descriptor.

use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::Arc;

use bytes::Bytes;
use object_store::path::Path;
use parking_lot::Mutex;

/// Open descriptors kept at most (the process's fd budget for reads).
const MAX_OPEN_FILES: usize = 256;

pub(crate) struct LocalReader {
    root: PathBuf,
    files: Mutex<HashMap<String, Arc<File>>>,
    /// This process's turn at the compare-and-swap lock (`cas_lock`).
    cas_turn: Arc<tokio::sync::Mutex<()>>,
}

/// The directory's compare-and-swap lock, held: this process's turn and
/// the `flock` that excludes other processes. Released on drop.
pub(crate) struct CasLock {
    _file: File,
    _turn: tokio::sync::OwnedMutexGuard<()>,
}

impl LocalReader {
    pub(crate) fn new(root: PathBuf) -> Self {
        LocalReader {
            root,
            files: Mutex::new(HashMap::new()),
            cas_turn: Arc::new(tokio::sync::Mutex::new(())),
        }
    }

    pub(crate) fn root(&self) -> &std::path::Path {
        &self.root
    }

    fn file(&self, location: &Path) -> io::Result<Arc<File>> {
        if let Some(f) = self.files.lock().get(location.as_ref()) {
            return Ok(f.clone());
        }
        let f = Arc::new(File::open(self.root.join(location.as_ref()))?);
        let mut files = self.files.lock();
        if files.len() >= MAX_OPEN_FILES {
            // Crude but bounded: drop an arbitrary half.
            let victims: Vec<String> = files.keys().take(MAX_OPEN_FILES / 2).cloned().collect();
            for v in victims {
                files.remove(&v);
            }
        }
        files.insert(location.as_ref().to_string(), f.clone());
        Ok(f)
    }

    /// Takes the directory's compare-and-swap lock (see `Store::put_if`);
    /// released when the returned guard is dropped. Holders keep it for one
    /// small read and write.
    ///
    /// This process's callers queue on an async mutex first, so at most one
    /// of them waits in `flock` on the blocking pool: measured, 1,000
    /// volumes opening at once put 512 `flock` waiters on tokio's 512
    /// blocking threads, and the holder's own write, which needs one of
    /// those threads, never ran (a deadlock).
    pub(crate) async fn cas_lock(&self) -> io::Result<CasLock> {
        let turn = self.cas_turn.clone().lock_owned().await;
        let path = self.root.join(".strata-cas.lock");
        let file = tokio::task::spawn_blocking(move || {
            use std::os::unix::io::AsRawFd;
            let file = std::fs::OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .open(&path)?;
            // SAFETY: flock only operates on the descriptor, which `file`
            // owns and keeps open for the duration of the call.
            if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) } != 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(file)
        })
        .await
        .map_err(io::Error::other)??;
        Ok(CasLock {
            _file: file,
            _turn: turn,
        })
    }

    pub(crate) fn invalidate(&self, location: &Path) {
        self.files.lock().remove(location.as_ref());
    }

    pub(crate) fn read_range(
        &self,
        location: &Path,
        range: Range<u64>,
    ) -> object_store::Result<Bytes> {
        let to_err = |source| read_error(location, source);
        let len = usize::try_from(range.end.saturating_sub(range.start))
            .map_err(|_| to_err(io::Error::other("range too large")))?;
        let file = self.file(location).map_err(to_err)?;
        let mut buf = vec![0u8; len];
        file.read_exact_at(&mut buf, range.start).map_err(to_err)?;
        Ok(Bytes::from(buf))
    }

    /// The open file of `location`, for callers that read it repeatedly
    /// into their own buffers (see `Store::local_file`).
    pub(crate) fn open(&self, location: &Path) -> object_store::Result<LocalFile> {
        let file = self.file(location).map_err(|e| read_error(location, e))?;
        Ok(LocalFile {
            file,
            location: location.clone(),
        })
    }
}

/// An object of the embedded store, open for `pread`s into the caller's
/// buffers.
pub struct LocalFile {
    file: Arc<File>,
    location: Path,
}

impl LocalFile {
    /// Fills `buf` from byte `offset` of the object; errors as `get_range`'s.
    pub fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> object_store::Result<()> {
        self.file
            .read_exact_at(buf, offset)
            .map_err(|e| read_error(&self.location, e))
    }
}

/// A failed local read as the store's error (NotFound stays NotFound).
fn read_error(location: &Path, source: io::Error) -> object_store::Error {
    if source.kind() == io::ErrorKind::NotFound {
        object_store::Error::NotFound {
            path: location.to_string(),
            source: Box::new(source),
        }
    } else {
        object_store::Error::Generic {
            store: "LocalFileSystem",
            source: Box::new(io::Error::new(
                source.kind(),
                format!("{location}: {source}"),
            )),
        }
    }
}
