//! The local half of ownership: an exclusive `flock` per volume in the data
//! directory, and the holder id that names this data directory in leases.

use std::fs::{File, OpenOptions};
use std::os::unix::io::AsRawFd;
use std::path::Path;

use crate::error::VolumeError;

/// The exclusive local lock; released when dropped (the file stays).
#[derive(Debug)]
pub struct LocalLock {
    _file: File,
}

/// Takes the local lock of a volume, or says who has it.
pub fn lock_locally(path: &Path, volume: &str) -> Result<LocalLock, VolumeError> {
    let io = |what: &str, source| VolumeError::Io {
        what: format!("{what} {}", path.display()),
        source,
    };
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .map_err(|e| io("open lock file", e))?;
    // SAFETY: flock only operates on the descriptor, which `file` owns and
    // keeps open for the duration of the call; no memory is passed.
    let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if rc != 0 {
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
            return Err(VolumeError::Busy(format!(
                "volume {volume:?} is being served by another strata process using the same data directory (lock {} is held); stop that server first",
                path.display()
            )));
        }
        return Err(io("lock", e));
    }
    Ok(LocalLock { _file: file })
}

/// Our holder id: host, data directory, and a random id kept in the data
/// directory (two hosts may share a hostname and a path).
pub fn holder_id(data_dir: &Path) -> Result<String, VolumeError> {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "unknown-host".into());
    let dir = std::fs::canonicalize(data_dir).unwrap_or_else(|_| data_dir.to_path_buf());
    let id_path = data_dir.join("instance-id");
    let io = |source| VolumeError::Io {
        what: format!("data directory id {}", id_path.display()),
        source,
    };
    let id = match std::fs::read_to_string(&id_path) {
        Ok(s) if s.trim().len() == 32 => s.trim().to_string(),
        Ok(_) | Err(_) => {
            let id = uuid::Uuid::new_v4().simple().to_string();
            let tmp = data_dir.join("instance-id.tmp");
            std::fs::write(&tmp, &id).map_err(io)?;
            std::fs::rename(&tmp, &id_path).map_err(io)?;
            id
        }
    };
    Ok(format!("{host}:{} ({})", dir.display(), &id[..12]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_lock_excludes_a_second_holder() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("v.lock");
        let a = lock_locally(&p, "v").unwrap();
        let err = lock_locally(&p, "v").unwrap_err();
        assert!(matches!(err, VolumeError::Busy(_)), "{err}");
        drop(a);
        lock_locally(&p, "v").unwrap();
    }
}
