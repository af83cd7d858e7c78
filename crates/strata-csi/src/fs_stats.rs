//! A filesystem's size and free space (`statvfs`): GetCapacity's on a
//! local store, NodeGetVolumeStats' on a mounted volume.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// What `statvfs` says of a filesystem, in bytes and inodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FsStats {
    pub total_bytes: u64,
    pub available_bytes: u64,
    pub used_bytes: u64,
    pub total_inodes: u64,
    pub available_inodes: u64,
    pub used_inodes: u64,
}

/// `statvfs(path)`.
pub fn statvfs(path: &Path) -> std::io::Result<FsStats> {
    let c = CString::new(path.as_os_str().as_bytes()).map_err(|_| {
        std::io::Error::new(std::io::ErrorKind::InvalidInput, "path has a NUL byte")
    })?;
    let mut st = std::mem::MaybeUninit::<libc::statvfs>::zeroed();
    // SAFETY: `c` is a NUL-terminated path and `st` a writable statvfs.
    let rc = unsafe { libc::statvfs(c.as_ptr(), st.as_mut_ptr()) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: statvfs returned 0, so it filled the struct.
    let st = unsafe { st.assume_init() };
    let frsize = st.f_frsize;
    let total_bytes = st.f_blocks * frsize;
    let free_bytes = st.f_bfree * frsize;
    Ok(FsStats {
        total_bytes,
        available_bytes: st.f_bavail * frsize,
        used_bytes: total_bytes.saturating_sub(free_bytes),
        total_inodes: st.f_files,
        available_inodes: st.f_favail,
        used_inodes: st.f_files.saturating_sub(st.f_ffree),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_directory_has_a_size_and_a_missing_one_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let s = statvfs(dir.path()).unwrap();
        assert!(
            s.total_bytes > 0 && s.available_bytes <= s.total_bytes,
            "{s:?}"
        );
        assert!(statvfs(&dir.path().join("missing")).is_err());
    }
}
