//! Files an object is written into before it exists: the embedded store's
//! staged objects.
//!
//! This module owns [`StagedFile`]: a file next to a future object, named
//! `<object>#<tag>` (a name `LocalFileSystem`'s listings skip: a `#`
//! followed by digits), that a writer fills over time with `pwrite`s, syncs
//! when it must, and finally publishes under the object's name. strata's
//! volumes write bulk data straight into the file of the segment it will
//! belong to, so each byte is copied once into the page cache rather than
//! once into the journal and again into the segment (issue 31; the
//! journal then carries a pointer to the bytes, not the bytes).
//!
//! Publishing keeps the contract of a create-only PUT
//! (`durable_local_store.rs`): the file is cut to its length and synced,
//! then hard-linked to the object's name (which fails if the object
//! exists), then the directory is synced. The staging name stays until its
//! owner removes it: recovery may still read bytes through it.
//!
//! A staged file takes a recycled file from the pool when there is one
//! (`recycled_files.rs`), so steady-state writing overwrites pages the
//! kernel already has. A pooled file never has another name (the pool
//! refuses files with more than one link), and a published staged file has
//! two until its staging name is removed: the pool never takes it before.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path as FsPath, PathBuf};
use std::sync::Arc;

use object_store::path::Path;

use crate::local_reader::LocalReader;
use crate::recycled_files::RecycledFiles;

/// Tags are drawn from `[TAG_MIN, TAG_MAX]`: decimal numbers of 16 digits,
/// far above the `#1`, `#2`, ... a PUT's own staging files use, and all
/// digits so that listings skip them.
pub const TAG_MIN: u64 = 1_000_000_000_000_000;
pub const TAG_MAX: u64 = 9_999_999_999_999_999;

/// A file being written for a future object. See the module doc.
pub struct StagedFile {
    file: File,
    staging: PathBuf,
    object: PathBuf,
    location: Path,
    reader: Arc<LocalReader>,
}

impl std::fmt::Debug for StagedFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StagedFile")
            .field("staging", &self.staging)
            .finish_non_exhaustive()
    }
}

/// The staging name of the object at `object` (a filesystem path) with `tag`.
fn staging_path(object: &FsPath, tag: u64) -> PathBuf {
    let mut name = object.as_os_str().to_owned();
    name.push(format!("#{tag}"));
    PathBuf::from(name)
}

/// Whether `name` (a file name) is a staged file's: `<object>#<tag>`, the
/// tag in range. Returns the object's name and the tag.
pub fn parse_staged_name(name: &str) -> Option<(&str, u64)> {
    let (object, tag) = name.rsplit_once('#')?;
    let tag: u64 = tag.parse().ok()?;
    (TAG_MIN..=TAG_MAX).contains(&tag).then_some((object, tag))
}

impl StagedFile {
    /// Creates the staged file of `location` with `tag` (a new name: an
    /// existing file is an error), from a pooled file when `recycle` has
    /// one. Blocking.
    pub(crate) fn create(
        reader: &Arc<LocalReader>,
        recycle: Option<&RecycledFiles>,
        location: &Path,
        tag: u64,
    ) -> io::Result<StagedFile> {
        if !(TAG_MIN..=TAG_MAX).contains(&tag) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("staged file tag {tag} out of range"),
            ));
        }
        let object = reader.root().join(location.as_ref());
        let dir = object.parent().ok_or_else(|| {
            io::Error::new(io::ErrorKind::InvalidInput, "object has no directory")
        })?;
        crate::durable_local_store::create_dirs_durably(reader.root(), dir)?;
        let staging = staging_path(&object, tag);
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&staging)?;
        if let Some(r) = recycle {
            match r.take(&staging) {
                Ok(Some(f)) => file = f,
                Ok(None) => {}
                Err(e) => {
                    let _ = std::fs::remove_file(&staging);
                    return Err(e);
                }
            }
        }
        Ok(StagedFile {
            file,
            staging,
            object,
            location: location.clone(),
            reader: reader.clone(),
        })
    }

    /// Writes `buf` at `offset`.
    pub fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.file.write_all_at(buf, offset)
    }

    /// Starts the writeback of every dirty page of the file and waits for
    /// it (`write_back`). Blocking.
    pub fn write_back(&self) -> io::Result<()> {
        write_back(&self.file, 0, 0)
    }

    /// Makes the bytes written so far survive power loss.
    pub fn sync_data(&self) -> io::Result<()> {
        self.file.sync_data()
    }

    /// Makes the staging name survive power loss.
    pub fn sync_dir(&self) -> io::Result<()> {
        match self.staging.parent() {
            Some(dir) => File::open(dir)?.sync_all(),
            None => Ok(()),
        }
    }

    /// Publishes the first `len` bytes as the object: cut, synced, linked
    /// (create-only), the directory synced. `Ok(false)`: the object exists
    /// already (nothing was linked). Blocking.
    pub fn publish(&self, len: u64) -> io::Result<bool> {
        self.file.set_len(len)?;
        self.file.sync_all()?;
        match std::fs::hard_link(&self.staging, &self.object) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => return Ok(false),
            Err(e) => return Err(e),
        }
        self.reader.invalidate(&self.location);
        self.sync_dir()?;
        Ok(true)
    }

    /// The staging name (to remove it later, `remove_staged_path`).
    pub fn staging_path(&self) -> &FsPath {
        &self.staging
    }
}

/// Starts the writeback of bytes `[offset, offset + len)` of `file` (`len`
/// 0: to its end) and waits until they are on disk (`sync_file_range`: no
/// metadata, no device cache flush; pacing, not durability). Blocking.
pub fn write_back(file: &File, offset: u64, len: u64) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let (Ok(offset), Ok(len)) = (
        libc::off64_t::try_from(offset),
        libc::off64_t::try_from(len),
    ) else {
        return Err(io::Error::from(io::ErrorKind::InvalidInput));
    };
    let flags = libc::SYNC_FILE_RANGE_WAIT_BEFORE
        | libc::SYNC_FILE_RANGE_WRITE
        | libc::SYNC_FILE_RANGE_WAIT_AFTER;
    // SAFETY: on a file descriptor `file` owns and keeps open for the
    // call; no memory is passed.
    if unsafe { libc::sync_file_range(file.as_raw_fd(), offset, len, flags) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Removes a staging name; one already gone is not an error.
pub fn remove_staged_path(path: &FsPath) -> io::Result<()> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// The staged files under a directory of the store: `(object name, tag,
/// staging path)`. Blocking.
pub(crate) fn list_staged(dir: &FsPath) -> io::Result<Vec<(String, u64, PathBuf)>> {
    let mut out = Vec::new();
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(out),
        Err(e) => return Err(e),
    };
    for entry in entries {
        let entry = entry?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if let Some((object, tag)) = parse_staged_name(name) {
            out.push((object.to_string(), tag, entry.path()));
        }
    }
    Ok(out)
}

/// Opens the staged file of `location` with `tag` for reading (recovery).
pub(crate) fn open_staged(root: &FsPath, location: &Path, tag: u64) -> io::Result<File> {
    File::open(staging_path(&root.join(location.as_ref()), tag))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn staged_names_are_recognised_and_others_are_not() {
        assert_eq!(
            parse_staged_name("00000000000000a1#1234567890123456"),
            Some(("00000000000000a1", 1_234_567_890_123_456))
        );
        for other in [
            "00000000000000a1",
            "00000000000000a1#1",
            "x#abc",
            "x#99999999999999999",
        ] {
            assert_eq!(parse_staged_name(other), None, "{other}");
        }
    }

    #[test]
    fn a_published_file_is_the_object_and_keeps_its_staging_name() {
        let dir = tempfile::tempdir().unwrap();
        let reader = Arc::new(LocalReader::new(dir.path().to_path_buf()));
        let loc = Path::from("v/segments/0000000000000001");
        let f = StagedFile::create(&reader, None, &loc, TAG_MIN + 5).unwrap();
        f.write_all_at(b"world", 5).unwrap();
        f.write_all_at(b"hello", 0).unwrap();
        f.sync_data().unwrap();
        assert!(f.publish(10).unwrap());
        let object = dir.path().join("v/segments/0000000000000001");
        assert_eq!(std::fs::read(&object).unwrap(), b"helloworld");
        assert!(f.staging_path().exists());
        let listed = list_staged(&dir.path().join("v/segments")).unwrap();
        assert_eq!(listed.len(), 1);
        assert_eq!(listed[0].1, TAG_MIN + 5);
        // A second publish of another file finds the object: not linked.
        let g = StagedFile::create(&reader, None, &loc, TAG_MIN + 6).unwrap();
        assert!(!g.publish(0).unwrap());
        assert_eq!(std::fs::read(&object).unwrap(), b"helloworld");
        remove_staged_path(f.staging_path()).unwrap();
        remove_staged_path(f.staging_path()).unwrap();
        assert!(object.exists());
        let mut buf = [0u8; 5];
        open_staged(dir.path(), &loc, TAG_MIN + 6)
            .unwrap()
            .read_exact_at(&mut buf, 0)
            .unwrap_err();
    }
}
