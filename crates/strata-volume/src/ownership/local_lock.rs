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
    host_identity(data_dir).map(|(holder, _)| holder)
}

/// The holder id and the data directory's whole id (32 hex digits), which
/// names this host's liveness record.
pub fn host_identity(data_dir: &Path) -> Result<(String, String), VolumeError> {
    let host = hostname();
    let dir = std::fs::canonicalize(data_dir).unwrap_or_else(|_| data_dir.to_path_buf());
    let id_path = data_dir.join("instance-id");
    let io = |source| VolumeError::Io {
        what: format!("data directory id {}", id_path.display()),
        source,
    };
    let id = match read_id(&id_path) {
        Some(id) => id,
        None => create_id(data_dir, &id_path).map_err(io)?,
    };
    Ok((format!("{host}:{} ({})", dir.display(), &id[..12]), id))
}

/// This machine's host name (`unknown-host` if it cannot be read).
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "unknown-host".into())
}

fn read_id(path: &Path) -> Option<String> {
    let text = std::fs::read_to_string(path).ok()?;
    let id = text.trim();
    // Untrusted: only what create_id writes (32 hex digits) is an id.
    let valid = id.len() == 32 && id.bytes().all(|b| b.is_ascii_hexdigit());
    valid.then(|| id.to_string())
}

/// Makes the data directory's id, once: a server opens its volumes
/// concurrently, and on a fresh data directory each open comes here. The
/// first to link its own temporary file in place wins; the others read
/// the winner's id (two ids would make a restarted server see its own
/// leases as another host's). A damaged id file is replaced. Synced, file
/// and directory, before it is used: an id lost to a power cut would make
/// this server's own leases look foreign after a reboot, and its volumes
/// refuse to open until their leases expire.
fn create_id(data_dir: &Path, id_path: &Path) -> std::io::Result<String> {
    let id = uuid::Uuid::new_v4().simple().to_string();
    let tmp = data_dir.join(format!("instance-id.{id}.tmp"));
    {
        let mut f = std::fs::File::create(&tmp)?;
        std::io::Write::write_all(&mut f, id.as_bytes())?;
        f.sync_all()?;
    }
    let linked = std::fs::hard_link(&tmp, id_path);
    let outcome = match linked {
        Ok(()) => Ok(id),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => match read_id(id_path) {
            Some(winner) => Ok(winner),
            None => std::fs::rename(&tmp, id_path).map(|()| id),
        },
        // A file system without hard links: rename, as before the link
        // (concurrent first opens may then disagree once).
        Err(_) => std::fs::rename(&tmp, id_path).map(|()| id),
    };
    let _ = std::fs::remove_file(&tmp);
    std::fs::File::open(data_dir)?.sync_all()?;
    outcome
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

    #[test]
    fn concurrent_first_opens_agree_on_one_holder_id() {
        for _ in 0..20 {
            let dir = tempfile::tempdir().unwrap();
            let ids: Vec<String> = std::thread::scope(|s| {
                let opens: Vec<_> = (0..8)
                    .map(|_| s.spawn(|| holder_id(dir.path()).unwrap()))
                    .collect();
                opens.into_iter().map(|t| t.join().unwrap()).collect()
            });
            assert!(ids.iter().all(|i| *i == ids[0]), "{ids:?}");
            assert_eq!(holder_id(dir.path()).unwrap(), ids[0]);
            let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
            assert_eq!(left.len(), 1, "temporary files left: {left:?}");
        }
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("instance-id"), "damaged").unwrap();
        let id = holder_id(dir.path()).unwrap();
        assert_eq!(holder_id(dir.path()).unwrap(), id);
        // 32 bytes, a multi-byte character across byte 12.
        let damaged = format!("{}é{}", "a".repeat(11), "b".repeat(19));
        assert_eq!(damaged.len(), 32);
        std::fs::write(dir.path().join("instance-id"), damaged).unwrap();
        let id = holder_id(dir.path()).unwrap();
        assert_eq!(holder_id(dir.path()).unwrap(), id);
    }
}
