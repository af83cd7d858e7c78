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
}

impl DurableLocalStore {
    /// `inner`: a `LocalFileSystem` whose prefix is `root`.
    pub fn new(inner: Arc<dyn ObjectStore>, root: PathBuf) -> DurableLocalStore {
        DurableLocalStore { inner, root }
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
fn create_dirs_durably(root: &FsPath, dir: &FsPath) -> std::io::Result<()> {
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
    let written = payload
        .iter()
        .try_for_each(|chunk| file.write_all(chunk))
        .and_then(|()| file.sync_all())
        .and_then(|()| file.metadata());
    let meta = match written {
        Ok(m) => m,
        Err(e) => {
            let _ = std::fs::remove_file(&staging);
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
        tokio::task::spawn_blocking(move || put_durably(&root, &location, payload, create))
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
    use object_store::local::LocalFileSystem;

    fn store(dir: &FsPath) -> DurableLocalStore {
        let fs = LocalFileSystem::new_with_prefix(dir).unwrap();
        DurableLocalStore::new(Arc::new(fs), dir.to_path_buf())
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
