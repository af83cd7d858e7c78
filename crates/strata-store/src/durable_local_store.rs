//! The embedded store's writes, durable when acknowledged.
//!
//! This module owns [`DurableLocalStore`], the innermost wrapper of the
//! embedded store's `LocalFileSystem`: every read, listing and deletion
//! goes to `LocalFileSystem`; a PUT is done here, in the order a power cut
//! cannot break:
//!
//! 1. the bytes go to a staging file next to the object (`<name>#<n>`, the
//!    name `LocalFileSystem` uses and its listings skip), which is synced;
//! 2. only then is it linked (create-only PUT: `hard_link`, which fails if
//!    the object exists) or renamed (overwrite) into place;
//! 3. the directory is synced, so the new name is durable before the PUT
//!    returns; a directory this PUT created is synced into its parent.
//!
//! `LocalFileSystem` writes, then links or renames, and syncs nothing: a
//! power cut could keep the name and lose the bytes (XFS; ext4 for a new
//! name), and strata's power-loss loop (strata-testkit `powerloss`) found
//! exactly that: a segment whose link became durable through a later
//! directory sync, its data lost, and a volume that would not open. Syncing
//! after the link (what `Store::make_durable` did) leaves that window open
//! while the process dies between the two; syncing before closes it, since
//! a name then only ever points at durable bytes. S3 acknowledges durable
//! writes; this makes the embedded store keep the same contract.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path as FsPath, PathBuf};
use std::sync::Arc;

use crate::recycled_files::RecycledFiles;
use async_trait::async_trait;
use futures::stream::BoxStream;
use object_store::path::Path;
use object_store::{
    Error, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore, PutMode,
    PutMultipartOptions, PutOptions, PutPayload, PutResult, Result,
};

const STORE: &str = "LocalFileSystem";

/// See the module doc.
#[derive(Debug)]
pub struct DurableLocalStore {
    inner: Arc<dyn ObjectStore>,
    root: PathBuf,
    /// Files of deleted objects, overwritten by new ones
    /// (`recycled_files.rs`); `None` when the budget is 0.
    recycle: Option<Arc<RecycledFiles>>,
}

impl DurableLocalStore {
    /// `inner`: a `LocalFileSystem` whose prefix is `root`; no recycling.
    pub fn new(inner: Arc<dyn ObjectStore>, root: PathBuf) -> DurableLocalStore {
        DurableLocalStore {
            inner,
            root,
            recycle: None,
        }
    }

    /// Deleted large objects' files are kept (up to the pool's budget) and
    /// overwritten by new large objects.
    pub(crate) fn with_recycling(mut self, recycle: Arc<RecycledFiles>) -> DurableLocalStore {
        self.recycle = Some(recycle);
        self
    }
}

impl std::fmt::Display for DurableLocalStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DurableLocalStore({})", self.inner)
    }
}

/// An I/O error with what failed; the `io::Error` stays in the source
/// chain, where `explaining_object_store.rs` reads its kind (disk full,
/// permission denied).
#[derive(Debug, thiserror::Error)]
#[error("{what} {}", path.display())]
struct LocalIo {
    what: &'static str,
    path: PathBuf,
    #[source]
    source: std::io::Error,
}

fn io_error(what: &'static str, path: &FsPath, source: std::io::Error) -> Error {
    Error::Generic {
        store: STORE,
        source: Box::new(LocalIo {
            what,
            path: path.to_path_buf(),
            source,
        }),
    }
}

/// Creates the directories from `root` down to `dir` that are missing,
/// each synced into its parent.
pub(crate) fn create_dirs_durably(root: &FsPath, dir: &FsPath) -> std::io::Result<()> {
    let Ok(rel) = dir.strip_prefix(root) else {
        return std::fs::create_dir_all(dir);
    };
    let mut at = root.to_path_buf();
    for part in rel.components() {
        let parent = at.clone();
        at.push(part);
        match std::fs::create_dir(&at) {
            Ok(()) => File::open(&parent)?.sync_all()?,
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// A new staging file next to `path`: `<path>#<n>`.
fn staging_file(path: &FsPath) -> std::io::Result<(File, PathBuf)> {
    for n in 1u32.. {
        let mut name = path.as_os_str().to_owned();
        name.push(format!("#{n}"));
        let staging = PathBuf::from(name);
        let opened = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&staging);
        match opened {
            Ok(f) => return Ok((f, staging)),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e),
        }
    }
    Err(std::io::Error::other("no free staging name"))
}

/// `LocalFileSystem`'s ETag of a file: inode, mtime (µs) and size in hex,
/// so a later HEAD through it gives the same.
fn e_tag(meta: &std::fs::Metadata) -> String {
    use std::os::unix::fs::MetadataExt;
    let mtime_us = meta
        .modified()
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .unwrap_or_default()
        .as_micros();
    format!("{:x}-{mtime_us:x}-{:x}", meta.ino(), meta.len())
}

/// The blocking part of a PUT (see the module doc).
fn put_durably(
    root: &FsPath,
    location: &Path,
    payload: PutPayload,
    create: bool,
    recycle: Option<&RecycledFiles>,
) -> Result<PutResult> {
    let path = root.join(location.as_ref());
    let Some(dir) = path.parent() else {
        return Err(io_error(
            "no parent directory for",
            &path,
            std::io::ErrorKind::InvalidInput.into(),
        ));
    };
    create_dirs_durably(root, dir).map_err(|e| io_error("create directory", dir, e))?;
    let (mut file, staging) = staging_file(&path).map_err(|e| io_error("create", &path, e))?;
    let len = payload.content_length() as u64;
    // A large create-only PUT (a segment) overwrites a recycled file:
    // pages and blocks the kernel already has. Only create-only PUTs, so a
    // compare-and-swap's ETag (inode, mtime, size) is never a reused one.
    let recycled = match recycle.filter(|r| create && r.wants(len)) {
        Some(r) => r.take(&staging).map_err(|e| {
            let _ = std::fs::remove_file(&staging);
            io_error("reuse a recycled file as", &staging, e)
        })?,
        None => None,
    };
    let reused = recycled.is_some();
    if let Some(f) = recycled {
        file = f;
    }
    let written = payload
        .iter()
        .try_for_each(|chunk| file.write_all(chunk))
        // A recycled file may be longer than the new object.
        .and_then(|()| if reused { file.set_len(len) } else { Ok(()) })
        .and_then(|()| file.sync_all())
        .and_then(|()| file.metadata());
    let meta = match written {
        Ok(m) => m,
        Err(e) => {
            let _ = std::fs::remove_file(&staging);
            if let (Some(r), Some(libc::ENOSPC)) = (recycle, e.raw_os_error()) {
                r.drain();
            }
            return Err(io_error("write", &staging, e));
        }
    };
    drop(file);
    let placed = if create {
        std::fs::hard_link(&staging, &path)
    } else {
        std::fs::rename(&staging, &path)
    };
    if create || placed.is_err() {
        let _ = std::fs::remove_file(&staging);
    }
    match placed {
        Ok(()) => {}
        Err(e) if create && e.kind() == std::io::ErrorKind::AlreadyExists => {
            return Err(Error::AlreadyExists {
                path: location.to_string(),
                source: Box::new(e),
            })
        }
        Err(e) => return Err(io_error("put into place", &path, e)),
    }
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| io_error("sync directory", dir, e))?;
    Ok(PutResult {
        e_tag: Some(e_tag(&meta)),
        version: None,
    })
}

#[async_trait]
impl ObjectStore for DurableLocalStore {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> Result<PutResult> {
        let create = match opts.mode {
            PutMode::Overwrite => false,
            PutMode::Create => true,
            // Compare-and-swap: `Store::put_if` does it under its lock.
            PutMode::Update(_) => return Err(Error::NotImplemented),
        };
        if !opts.attributes.is_empty() {
            return Err(Error::NotImplemented);
        }
        let (root, location) = (self.root.clone(), location.clone());
        let recycle = self.recycle.clone();
        tokio::task::spawn_blocking(move || {
            put_durably(&root, &location, payload, create, recycle.as_deref())
        })
        .await
        .map_err(|e| Error::Generic {
            store: STORE,
            source: Box::new(e),
        })?
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> Result<Box<dyn MultipartUpload>> {
        self.inner.put_multipart_opts(location, opts).await
    }

    async fn get_opts(&self, location: &Path, options: GetOptions) -> Result<GetResult> {
        self.inner.get_opts(location, options).await
    }

    async fn delete(&self, location: &Path) -> Result<()> {
        if let Some(recycle) = self.recycle.clone() {
            let path = self.root.join(location.as_ref());
            let kept = tokio::task::spawn_blocking(move || recycle.keep(&path)).await;
            if let Ok(Ok(true)) = kept {
                return Ok(());
            }
            // Not kept (small, pool full) or not there: unlinked as before,
            // with `LocalFileSystem`'s answers (NotFound included).
        }
        self.inner.delete(location).await
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, Result<ObjectMeta>> {
        self.inner.list(prefix)
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> Result<ListResult> {
        self.inner.list_with_delimiter(prefix).await
    }

    async fn copy(&self, from: &Path, to: &Path) -> Result<()> {
        self.inner.copy(from, to).await
    }

    async fn copy_if_not_exists(&self, from: &Path, to: &Path) -> Result<()> {
        self.inner.copy_if_not_exists(from, to).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::recycled_files::RECYCLE_DIR;
    use futures::StreamExt;
    use object_store::local::LocalFileSystem;

    fn store(dir: &FsPath) -> DurableLocalStore {
        let fs = LocalFileSystem::new_with_prefix(dir).unwrap();
        DurableLocalStore::new(Arc::new(fs), dir.to_path_buf())
    }

    fn recycling_store(dir: &FsPath, budget_bytes: u64) -> (DurableLocalStore, Arc<RecycledFiles>) {
        let pool = RecycledFiles::open(dir, budget_bytes, crate::MIN_RECYCLE_BYTES)
            .unwrap()
            .unwrap();
        (store(dir).with_recycling(pool.clone()), pool)
    }

    fn create() -> PutOptions {
        PutOptions {
            mode: PutMode::Create,
            ..PutOptions::default()
        }
    }

    fn inode(path: &FsPath) -> u64 {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata(path).unwrap().ino()
    }

    #[tokio::test]
    async fn a_deleted_segment_file_is_overwritten_by_the_next_and_never_shows_old_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let (s, pool) = recycling_store(dir.path(), 64 << 20);
        let old = Path::from("vol/segments/0001");
        let old_bytes = vec![0xAAu8; 3 << 20];
        s.put_opts(&old, old_bytes.clone().into(), create())
            .await
            .unwrap();
        let old_inode = inode(&dir.path().join("vol/segments/0001"));
        s.delete(&old).await.unwrap();
        assert!(matches!(s.get(&old).await, Err(Error::NotFound { .. })));
        assert_eq!(pool.snapshot().pool_files, 1);
        // Shorter than the old object: the file is cut to the new length.
        let new = Path::from("vol/segments/0002");
        let new_bytes = vec![0x55u8; 2 << 20];
        s.put_opts(&new, new_bytes.clone().into(), create())
            .await
            .unwrap();
        let got = s.get(&new).await.unwrap().bytes().await.unwrap();
        assert_eq!(got.len(), new_bytes.len());
        assert!(got.iter().all(|&b| b == 0x55), "old bytes showed through");
        assert_eq!(
            inode(&dir.path().join("vol/segments/0002")),
            old_inode,
            "not recycled"
        );
        let snap = pool.snapshot();
        // The first PUT found the pool empty.
        assert_eq!(
            (snap.reused_files, snap.new_files, snap.pool_files),
            (1, 1, 0)
        );
        // The pool is empty now: the next large PUT is a new file.
        s.put_opts(&Path::from("vol/segments/0003"), new_bytes.into(), create())
            .await
            .unwrap();
        assert_eq!(pool.snapshot().new_files, 2);
        // No staging or pooled name is listed.
        let listed: Vec<_> = s
            .list(None)
            .map(|m| m.unwrap().location.to_string())
            .collect()
            .await;
        assert_eq!(listed.len(), 2, "{listed:?}");
    }

    #[tokio::test]
    async fn small_objects_and_what_exceeds_the_budget_are_unlinked() {
        let dir = tempfile::tempdir().unwrap();
        let (s, pool) = recycling_store(dir.path(), 5 << 20);
        let small = Path::from("vol/manifest");
        s.put_opts(&small, vec![1u8; 1000].into(), PutOptions::default())
            .await
            .unwrap();
        s.delete(&small).await.unwrap();
        for n in 1..=3 {
            let p = Path::from(format!("vol/segments/{n:04}"));
            s.put_opts(&p, vec![n as u8; 2 << 20].into(), create())
                .await
                .unwrap();
        }
        for n in 1..=3 {
            s.delete(&Path::from(format!("vol/segments/{n:04}")))
                .await
                .unwrap();
        }
        let snap = pool.snapshot();
        assert_eq!((snap.pool_files, snap.pool_bytes), (2, 4 << 20));
        assert_eq!((snap.kept_files, snap.unlinked_files), (2, 1));
        let pooled = std::fs::read_dir(dir.path().join(RECYCLE_DIR))
            .unwrap()
            .count();
        assert_eq!(pooled, 2);
        // Deleting what is not there still answers NotFound.
        let gone = s
            .delete(&Path::from("vol/segments/0001"))
            .await
            .unwrap_err();
        assert!(matches!(gone, Error::NotFound { .. }), "{gone}");
        // A new process finds the pool; a smaller budget unlinks the rest.
        let reopened = RecycledFiles::open(dir.path(), 3 << 20, crate::MIN_RECYCLE_BYTES)
            .unwrap()
            .unwrap();
        assert_eq!(reopened.snapshot().pool_files, 1);
        assert_eq!(
            std::fs::read_dir(dir.path().join(RECYCLE_DIR))
                .unwrap()
                .count(),
            1
        );
        reopened.drain();
        assert_eq!(reopened.snapshot().pool_bytes, 0);
        assert_eq!(
            std::fs::read_dir(dir.path().join(RECYCLE_DIR))
                .unwrap()
                .count(),
            0
        );
    }

    #[tokio::test]
    async fn the_pool_holds_at_most_its_file_count_however_small_the_files() {
        use crate::recycled_files::MAX_RECYCLED_FILES;
        let dir = tempfile::tempdir().unwrap();
        let pool = RecycledFiles::open(dir.path(), 1 << 30, 1)
            .unwrap()
            .unwrap();
        let s = store(dir.path()).with_recycling(pool.clone());
        let n = MAX_RECYCLED_FILES + 10;
        for i in 0..n {
            let p = Path::from(format!("vol/segments/{i:04}"));
            s.put_opts(&p, vec![7u8; 10].into(), create())
                .await
                .unwrap();
        }
        for i in 0..n {
            s.delete(&Path::from(format!("vol/segments/{i:04}")))
                .await
                .unwrap();
        }
        let snap = pool.snapshot();
        assert_eq!(
            (snap.pool_files, snap.kept_files),
            (MAX_RECYCLED_FILES, MAX_RECYCLED_FILES)
        );
        assert_eq!(snap.unlinked_files, 10);
        let on_disk = std::fs::read_dir(dir.path().join(RECYCLE_DIR))
            .unwrap()
            .count() as u64;
        assert_eq!(on_disk, MAX_RECYCLED_FILES);
        // A new process adopts them (they are fresh), within the same cap.
        let again = RecycledFiles::open(dir.path(), 1 << 30, 1)
            .unwrap()
            .unwrap();
        assert_eq!(again.snapshot().pool_files, MAX_RECYCLED_FILES);
    }

    #[tokio::test]
    async fn a_file_with_another_name_is_never_overwritten() {
        let dir = tempfile::tempdir().unwrap();
        let (s, pool) = recycling_store(dir.path(), 64 << 20);
        let seg = |n: u32| Path::from(format!("vol/segments/{n:04}"));
        let backup = dir.path().join("backup");
        // Linked before the delete (a user's `cp -al`): unlinked, not kept.
        s.put_opts(&seg(1), vec![1u8; 1 << 20].into(), create())
            .await
            .unwrap();
        std::fs::hard_link(dir.path().join("vol/segments/0001"), &backup).unwrap();
        s.delete(&seg(1)).await.unwrap();
        assert_eq!(pool.snapshot().pool_files, 0);
        // Linked while pooled: the next PUT writes a new file.
        s.put_opts(&seg(2), vec![2u8; 1 << 20].into(), create())
            .await
            .unwrap();
        s.delete(&seg(2)).await.unwrap();
        let pooled = std::fs::read_dir(dir.path().join(RECYCLE_DIR))
            .unwrap()
            .next()
            .unwrap()
            .unwrap()
            .path();
        let backup2 = dir.path().join("backup2");
        std::fs::hard_link(&pooled, &backup2).unwrap();
        s.put_opts(&seg(3), vec![3u8; 1 << 20].into(), create())
            .await
            .unwrap();
        assert_eq!(pool.snapshot().reused_files, 0);
        let got = s.get(&seg(3)).await.unwrap().bytes().await.unwrap();
        assert!(got.len() == 1 << 20 && got.iter().all(|&b| b == 3));
        for (path, byte) in [(&backup, 1u8), (&backup2, 2u8)] {
            let kept = std::fs::read(path).unwrap();
            assert!(
                kept.len() == 1 << 20 && kept.iter().all(|&b| b == byte),
                "{path:?}"
            );
        }
    }

    #[tokio::test]
    async fn puts_create_and_overwrite_like_local_file_system() {
        let dir = tempfile::tempdir().unwrap();
        let s = store(dir.path());
        let p = Path::from("vol/segments/0001");
        let create = PutOptions {
            mode: PutMode::Create,
            ..PutOptions::default()
        };
        let put = s.put_opts(&p, "one".into(), create.clone()).await.unwrap();
        // The ETag is LocalFileSystem's own (put_if compares them).
        assert_eq!(put.e_tag, s.head(&p).await.unwrap().e_tag);
        let again = s.put_opts(&p, "two".into(), create).await.unwrap_err();
        assert!(matches!(again, Error::AlreadyExists { .. }), "{again}");
        s.put_opts(&p, "three".into(), PutOptions::default())
            .await
            .unwrap();
        let got = s.get(&p).await.unwrap().bytes().await.unwrap();
        assert_eq!(&got[..], b"three");
        // No staging file is left, and listings show the object once.
        let names: Vec<_> = std::fs::read_dir(dir.path().join("vol/segments"))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from("0001")]);
        let update = PutOptions {
            mode: PutMode::Update(object_store::UpdateVersion {
                e_tag: None,
                version: None,
            }),
            ..PutOptions::default()
        };
        assert!(matches!(
            s.put_opts(&p, "x".into(), update).await,
            Err(Error::NotImplemented)
        ));
    }
}
