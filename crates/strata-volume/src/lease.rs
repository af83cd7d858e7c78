//! One writer per volume: a local lock and a lease object in the store.
//!
//! This module owns the right to write a volume. Opening takes, in order:
//!
//! 1. an exclusive `flock` on `<data-dir>/journals/<volume>-<uuid>.lock`
//!    (never unlinked while anyone may hold it): a second process on the same
//!    data directory is refused at once, and holding it proves that an older
//!    lease with *our* holder id belongs to a process that is gone;
//! 2. the lease object `<volume>/lease`: refused while another holder renewed
//!    it within its TTL; taken over when it is ours (a crash of this data
//!    directory's previous server) or expired. It is renewed every TTL/3 and
//!    deleted on clean close, so another host can open the volume at once.
//!
//! Conditional PUTs (If-Match) that make the take-over race-free on S3 and a
//! fenced writer stopping itself come with the S3 issue; on the embedded
//! store the local lock already excludes a second process.
//!
//! ## Object layout
//!
//! The envelope of `envelope.rs` (magic "STRATLSE", body at most 64 KiB).

use std::fs::{File, OpenOptions};
use std::os::unix::io::AsRawFd;
use std::path::Path;

use bytes::Bytes;
use object_store::{PutMode, PutOptions, PutPayload};
use serde::{Deserialize, Serialize};
use strata_store::{ObjectNames, Store};

use crate::envelope;
use crate::error::VolumeError;
use crate::recovery::store_error;

const MAGIC: &[u8; 8] = b"STRATLSE";
const MAX_BODY_BYTES: usize = 64 << 10;
/// A lease not renewed for this long is free to take.
pub const LEASE_TTL_MS: u64 = 30_000;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lease {
    /// `<hostname>:<data dir>`: stable across restarts of one server.
    pub holder: String,
    pub pid: u32,
    pub renewed_unix_ms: u64,
    pub ttl_ms: u64,
}

impl Lease {
    fn encode(&self) -> Vec<u8> {
        let body = serde_json::to_vec(self).unwrap_or_default();
        envelope::encode(MAGIC, &body)
    }

    fn decode(b: &[u8]) -> Result<Lease, String> {
        let body = envelope::decode(MAGIC, "lease", MAX_BODY_BYTES, b)?;
        serde_json::from_slice(body).map_err(|e| format!("lease body: {e}"))
    }
}

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

pub fn holder_id(data_dir: &Path) -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "unknown-host".into());
    let dir = std::fs::canonicalize(data_dir).unwrap_or_else(|_| data_dir.to_path_buf());
    format!("{host}:{}", dir.display())
}

pub(crate) fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Reads the lease object, if any.
pub async fn read_lease(store: &Store, names: &ObjectNames) -> Result<Option<Lease>, VolumeError> {
    let path = names.lease();
    let bytes = match store.object_store().get(&path).await {
        Ok(r) => r.bytes().await.map_err(store_error(store, "read", &path))?,
        Err(object_store::Error::NotFound { .. }) => return Ok(None),
        Err(e) => return Err(store_error(store, "read", &path)(e)),
    };
    Lease::decode(&bytes)
        .map(Some)
        .map_err(|detail| VolumeError::Corrupt {
            path: path.to_string(),
            detail,
        })
}

/// Refuses if someone else holds a live lease.
pub fn check_free(lease: Option<&Lease>, holder: &str, volume: &str) -> Result<(), VolumeError> {
    let Some(l) = lease else { return Ok(()) };
    let age_ms = now_ms().saturating_sub(l.renewed_unix_ms);
    if l.holder != holder && age_ms < l.ttl_ms {
        return Err(VolumeError::Busy(format!(
            "volume {volume:?} is being served by {} (pid {}, lease renewed {} s ago); stop that server first, or wait {} s after it died",
            l.holder,
            l.pid,
            age_ms / 1000,
            l.ttl_ms.div_ceil(1000)
        )));
    }
    Ok(())
}

/// Writes (takes or renews) our lease.
pub async fn write_lease(
    store: &Store,
    names: &ObjectNames,
    holder: &str,
) -> Result<(), VolumeError> {
    let lease = Lease {
        holder: holder.to_string(),
        pid: std::process::id(),
        renewed_unix_ms: now_ms(),
        ttl_ms: LEASE_TTL_MS,
    };
    let path = names.lease();
    let opts = PutOptions {
        mode: PutMode::Overwrite,
        ..PutOptions::default()
    };
    store
        .put_opts(&path, PutPayload::from(Bytes::from(lease.encode())), opts)
        .await
        .map_err(store_error(store, "write", &path))?;
    Ok(())
}

/// Deletes our lease (clean close), if it is still ours.
pub async fn release(store: &Store, names: &ObjectNames, holder: &str) -> Result<(), VolumeError> {
    if let Some(l) = read_lease(store, names).await? {
        if l.holder == holder {
            let path = names.lease();
            store
                .delete(&path)
                .await
                .map_err(store_error(store, "delete", &path))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lease_round_trip_and_liveness() {
        let l = Lease {
            holder: "h:/d".into(),
            pid: 7,
            renewed_unix_ms: now_ms(),
            ttl_ms: LEASE_TTL_MS,
        };
        let b = l.encode();
        assert_eq!(Lease::decode(&b).unwrap(), l);
        let mut c = b.clone();
        c[25] ^= 1;
        assert!(Lease::decode(&c).is_err());
        assert!(check_free(Some(&l), "other:/x", "v").is_err());
        assert!(
            check_free(Some(&l), "h:/d", "v").is_ok(),
            "our own crashed lease"
        );
        let old = Lease {
            renewed_unix_ms: 0,
            ..l
        };
        assert!(check_free(Some(&old), "other:/x", "v").is_ok(), "expired");
        assert!(check_free(None, "x", "v").is_ok());
    }

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
