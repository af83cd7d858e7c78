//! One writer per volume: a local lock, a lease object, and an epoch.
//!
//! This module owns the right to write a volume. Opening takes, in order:
//!
//! 1. an exclusive `flock` on `<data-dir>/journals/<volume>-<uuid>.lock`
//!    (never unlinked while anyone may hold it): a second process on the same
//!    data directory is refused at once, and holding it proves that an older
//!    lease with *our* holder id belongs to a process that is gone;
//! 2. the lease object `<volume>/lease`, written with a conditional PUT
//!    (If-None-Match when absent, If-Match on the version read otherwise), so
//!    two hosts racing for an expired lease cannot both win. It is refused
//!    while another holder renewed it within its TTL; taken when it is ours
//!    (a crash of this data directory's previous server), released or expired;
//! 3. an epoch bump in the manifest (also If-Match), done by `recovery.rs`.
//!    Every later manifest write is conditional on the version we wrote, so a
//!    writer whose volume was taken over fails its next manifest write.
//!
//! While open, the lease is renewed every TTL/3 with If-Match on the version
//! we wrote. Writes and uploads are allowed only while the last successful
//! renewal was *sent* less than TTL - margin ago (monotonic clock): past
//! that, another host may take the lease, so writers wait. A renewal that
//! finds someone else's lease means we were taken over: the volume is
//! *fenced* and stops serving. A clean close writes a released lease, so
//! another host opens the volume at once.
//!
//! Safety rests on hosts' wall clocks agreeing to well within the margin
//! (the expiry test reads the holder's `renewed_unix_ms`): run NTP. Segment
//! objects are written with If-None-Match, so even a writer paused past its
//! lease cannot overwrite a segment of the new holder.
//!
//! ## Object layout
//!
//! The envelope of `envelope.rs` (magic "STRATLSE", body at most 64 KiB).

use std::fs::{File, OpenOptions};
use std::os::unix::io::AsRawFd;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use bytes::Bytes;
use object_store::{PutPayload, UpdateVersion};
use serde::{Deserialize, Serialize};
use strata_store::{ObjectNames, Store};
use tokio::sync::Notify;

use crate::envelope;
use crate::error::VolumeError;
use crate::recovery::store_error;

const MAGIC: &[u8; 8] = b"STRATLSE";
const MAX_BODY_BYTES: usize = 64 << 10;
/// A lease not renewed for this long is free to take (default).
pub const DEFAULT_LEASE_TTL_MS: u64 = 30_000;
/// Shortest TTL accepted (tests use a few seconds).
pub const MIN_LEASE_TTL_MS: u64 = 1_000;
/// Attempts to take a lease that keeps changing under us.
const MAX_ACQUIRE_ATTEMPTS: u32 = 4;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lease {
    /// `<hostname>:<data dir> (<data dir id>)`: stable across restarts of
    /// one server, unique per data directory.
    pub holder: String,
    pub pid: u32,
    /// Random per open: tells our lease from an older one of the same holder
    /// (and a reply lost after our write landed from a takeover).
    #[serde(default)]
    pub token: String,
    /// The manifest epoch this holder writes under.
    #[serde(default)]
    pub epoch: u64,
    pub renewed_unix_ms: u64,
    pub ttl_ms: u64,
    /// Written by a clean close: free to take at once.
    #[serde(default)]
    pub released: bool,
}

impl Lease {
    /// "holder (pid N)" while the lease is live, for `volume info`.
    pub fn live_holder(&self) -> Option<String> {
        let age_ms = now_ms().saturating_sub(self.renewed_unix_ms);
        (!self.released && age_ms < self.ttl_ms)
            .then(|| format!("{} (pid {}, epoch {})", self.holder, self.pid, self.epoch))
    }

    fn encode(&self) -> Bytes {
        let body = serde_json::to_vec(self).unwrap_or_default();
        Bytes::from(envelope::encode(MAGIC, &body))
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

pub(crate) fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Reads the lease object and its version, if any.
pub async fn read_lease(
    store: &Store,
    names: &ObjectNames,
) -> Result<Option<(Lease, UpdateVersion)>, VolumeError> {
    let path = names.lease();
    let Some((bytes, version)) = store
        .get_versioned(&path)
        .await
        .map_err(store_error(store, "read", &path))?
    else {
        return Ok(None);
    };
    let lease = Lease::decode(&bytes).map_err(|detail| VolumeError::Corrupt {
        path: path.to_string(),
        detail: format!("{detail} (if no server holds the volume, delete this object)"),
    })?;
    Ok(Some((lease, version)))
}

/// Refuses if someone else holds a live lease.
pub fn check_free(lease: Option<&Lease>, holder: &str, volume: &str) -> Result<(), VolumeError> {
    let Some(l) = lease else { return Ok(()) };
    let age_ms = now_ms().saturating_sub(l.renewed_unix_ms);
    if l.holder != holder && !l.released && age_ms < l.ttl_ms {
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

/// A lease we wrote, and the version the store gave it.
#[derive(Debug, Clone)]
pub struct HeldLease {
    pub lease: Lease,
    pub version: UpdateVersion,
}

fn is_conflict(e: &object_store::Error) -> bool {
    matches!(
        e,
        object_store::Error::AlreadyExists { .. }
            | object_store::Error::Precondition { .. }
            | object_store::Error::NotFound { .. }
    )
}

/// Takes the lease for `epoch`, or says who holds it.
pub async fn acquire(
    store: &Store,
    names: &ObjectNames,
    holder: &str,
    ttl_ms: u64,
    epoch: u64,
    volume: &str,
) -> Result<HeldLease, VolumeError> {
    let path = names.lease();
    let lease = Lease {
        holder: holder.to_string(),
        pid: std::process::id(),
        token: uuid::Uuid::new_v4().simple().to_string(),
        epoch,
        renewed_unix_ms: now_ms(),
        ttl_ms,
        released: false,
    };
    for _ in 0..MAX_ACQUIRE_ATTEMPTS {
        let current = read_lease(store, names).await?;
        check_free(current.as_ref().map(|c| &c.0), holder, volume)?;
        let lease = Lease {
            renewed_unix_ms: now_ms(),
            ..lease.clone()
        };
        let expected = current.as_ref().map(|c| &c.1);
        match store
            .put_if(&path, PutPayload::from(lease.encode()), expected)
            .await
        {
            Ok(version) => return Ok(HeldLease { lease, version }),
            Err(e) if is_conflict(&e) => {
                // Someone raced us, or a retry of our own write found it
                // already done: the token tells.
                if let Some((l, version)) = read_lease(store, names).await? {
                    if l.token == lease.token {
                        return Ok(HeldLease { lease: l, version });
                    }
                }
            }
            Err(e) => return Err(store_error(store, "write", &path)(e)),
        }
    }
    Err(VolumeError::Busy(format!(
        "volume {volume:?}: its lease kept changing while this server tried to take it; another server is starting on it"
    )))
}

/// Why a renewal did not happen.
#[derive(Debug)]
pub enum RenewError {
    /// Someone else's lease is in place: we were taken over.
    Fenced(String),
    /// The store did not answer; try again.
    Store(VolumeError),
}

/// Renews `held`, conditional on it being unchanged in the store.
pub async fn renew(
    store: &Store,
    names: &ObjectNames,
    held: &HeldLease,
) -> Result<HeldLease, RenewError> {
    let path = names.lease();
    let lease = Lease {
        renewed_unix_ms: now_ms(),
        ..held.lease.clone()
    };
    let put = store
        .put_if(&path, PutPayload::from(lease.encode()), Some(&held.version))
        .await;
    match put {
        Ok(version) => Ok(HeldLease { lease, version }),
        Err(e) if is_conflict(&e) => match read_lease(store, names).await {
            Ok(Some((l, version))) if l.token == held.lease.token => {
                Ok(HeldLease { lease: l, version })
            }
            Ok(Some((l, _))) => Err(RenewError::Fenced(format!(
                "taken over by {} (pid {}, epoch {})",
                l.holder, l.pid, l.epoch
            ))),
            Ok(None) => Err(RenewError::Fenced(
                "its lease object was deleted (volume deleted?)".into(),
            )),
            Err(e) => Err(RenewError::Store(e)),
        },
        Err(e) => Err(RenewError::Store(store_error(store, "write", &path)(e))),
    }
}

/// Writes a released lease (clean close), if the lease is still ours.
pub async fn release(
    store: &Store,
    names: &ObjectNames,
    held: &HeldLease,
) -> Result<(), VolumeError> {
    let path = names.lease();
    let lease = Lease {
        renewed_unix_ms: 0,
        released: true,
        ..held.lease.clone()
    };
    match store
        .put_if(&path, PutPayload::from(lease.encode()), Some(&held.version))
        .await
    {
        Ok(_) => Ok(()),
        Err(e) if is_conflict(&e) => {
            tracing::warn!(object = %path, "lease was no longer ours at close; left as it is");
            Ok(())
        }
        Err(e) => Err(store_error(store, "write", &path)(e)),
    }
}

/// A volume's right to write, while open: the lease we hold, until when it
/// lets us write, and whether we were fenced.
pub(crate) struct Ownership {
    pub holder: String,
    pub epoch: u64,
    pub ttl_ms: u64,
    local_lock: parking_lot::Mutex<Option<LocalLock>>,
    held: tokio::sync::Mutex<HeldLease>,
    started: Instant,
    /// Writes are allowed until this many ms after `started`.
    valid_until_ms: AtomicU64,
    fenced: parking_lot::Mutex<Option<String>>,
    /// `fenced.is_some()`, readable without the lock (every read checks it).
    is_fenced: std::sync::atomic::AtomicBool,
    /// Set once the volume is closed and the lease given up.
    released: std::sync::atomic::AtomicBool,
    /// Woken when validity or fencing changes.
    pub changed: Notify,
}

impl Ownership {
    /// `sent_at`: when the write of `held` was sent.
    pub fn new(holder: String, lock: LocalLock, held: HeldLease, sent_at: Instant) -> Self {
        let ttl_ms = held.lease.ttl_ms;
        let own = Ownership {
            holder,
            epoch: held.lease.epoch,
            ttl_ms,
            local_lock: parking_lot::Mutex::new(Some(lock)),
            held: tokio::sync::Mutex::new(held),
            started: sent_at,
            valid_until_ms: AtomicU64::new(0),
            fenced: parking_lot::Mutex::new(None),
            is_fenced: std::sync::atomic::AtomicBool::new(false),
            released: std::sync::atomic::AtomicBool::new(false),
            changed: Notify::new(),
        };
        own.extend(sent_at);
        own
    }

    /// The margin kept below the TTL for clock-rate differences and for a
    /// request in flight when validity ends.
    fn margin_ms(&self) -> u64 {
        (self.ttl_ms / 6).max(200)
    }

    fn elapsed_ms(&self, t: Instant) -> u64 {
        t.saturating_duration_since(self.started).as_millis() as u64
    }

    fn extend(&self, sent_at: Instant) {
        let until = self.elapsed_ms(sent_at) + self.ttl_ms.saturating_sub(self.margin_ms());
        self.valid_until_ms.fetch_max(until, Ordering::AcqRel);
        self.changed.notify_waiters();
    }

    /// Whether writes may be acknowledged now.
    pub fn is_valid(&self) -> bool {
        self.elapsed_ms(Instant::now()) < self.valid_until_ms.load(Ordering::Acquire)
    }

    pub fn fenced(&self) -> Option<String> {
        if !self.is_fenced.load(Ordering::Acquire) {
            return None;
        }
        self.fenced.lock().clone()
    }

    pub fn fence(&self, detail: String) {
        self.fenced.lock().get_or_insert(detail);
        self.is_fenced.store(true, Ordering::Release);
        self.changed.notify_waiters();
    }

    /// Waits until writing is allowed; `Err` with the reason once fenced.
    pub async fn wait_valid(&self) -> Result<(), String> {
        loop {
            let notified = self.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if let Some(d) = self.fenced() {
                return Err(d);
            }
            if self.is_valid() {
                return Ok(());
            }
            notified.await;
        }
    }

    /// One renewal attempt. On a takeover the caller fences the volume
    /// (`Volume::fence`, which words the reason clients and logs see).
    pub async fn renew(&self, store: &Store, names: &ObjectNames) -> Result<(), RenewError> {
        let mut held = self.held.lock().await;
        if self.is_released() {
            // A renewal must not resurrect a lease released meanwhile.
            return Ok(());
        }
        let sent_at = Instant::now();
        match renew(store, names, &held).await {
            Ok(h) => {
                *held = h;
                self.extend(sent_at);
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    /// Lets another process on this data directory open the volume.
    pub fn drop_local_lock(&self) {
        self.released.store(true, Ordering::Release);
        self.local_lock.lock().take();
    }

    pub fn is_released(&self) -> bool {
        self.released.load(Ordering::Acquire)
    }

    /// Releases the lease (unless fenced) and the local lock.
    pub async fn release(&self, store: &Store, names: &ObjectNames) -> Result<(), VolumeError> {
        self.released.store(true, Ordering::Release);
        let result = if self.fenced().is_none() {
            release(store, names, &*self.held.lock().await).await
        } else {
            Ok(())
        };
        self.local_lock.lock().take();
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(holder: &str, renewed_unix_ms: u64) -> Lease {
        Lease {
            holder: holder.into(),
            pid: 7,
            token: "t".into(),
            epoch: 3,
            renewed_unix_ms,
            ttl_ms: DEFAULT_LEASE_TTL_MS,
            released: false,
        }
    }

    #[test]
    fn lease_round_trip_and_liveness() {
        let l = lease("h:/d", now_ms());
        let b = l.encode();
        assert_eq!(Lease::decode(&b).unwrap(), l);
        let mut c = b.to_vec();
        c[25] ^= 1;
        assert!(Lease::decode(&c).is_err());
        let err = check_free(Some(&l), "other:/x", "v")
            .unwrap_err()
            .to_string();
        assert!(err.contains("h:/d") && err.contains("pid 7"), "{err}");
        assert!(
            check_free(Some(&l), "h:/d", "v").is_ok(),
            "our own crashed lease"
        );
        assert!(
            check_free(Some(&lease("h:/d", 0)), "other:/x", "v").is_ok(),
            "expired"
        );
        let released = Lease {
            released: true,
            ..l.clone()
        };
        assert!(check_free(Some(&released), "other:/x", "v").is_ok());
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

    async fn lease_protocol_on(store: Store) {
        let names = ObjectNames::new("v");
        let a = acquire(&store, &names, "A", 60_000, 1, "v").await.unwrap();
        let err = acquire(&store, &names, "B", 60_000, 2, "v")
            .await
            .unwrap_err();
        assert!(err.to_string().contains("served by A"), "{err}");
        let a = renew(&store, &names, &a).await.unwrap();
        // A stale copy of our own lease is a conflict, but the token says
        // it is ours (a retried write whose first reply was lost).
        let stale = HeldLease {
            version: UpdateVersion {
                e_tag: Some("\"stale\"".into()),
                version: None,
            },
            ..a.clone()
        };
        let a = renew(&store, &names, &stale).await.unwrap();
        release(&store, &names, &a).await.unwrap();
        let b = acquire(&store, &names, "B", 60_000, 2, "v").await.unwrap();
        match renew(&store, &names, &a).await {
            Err(RenewError::Fenced(d)) => assert!(d.contains("by B"), "{d}"),
            other => panic!("A was not fenced: {other:?}"),
        }
        assert_eq!(
            read_lease(&store, &names).await.unwrap().unwrap().0,
            b.lease
        );
    }

    #[tokio::test]
    async fn conditional_lease_protocol_in_memory() {
        lease_protocol_on(Store::in_memory()).await;
    }

    #[tokio::test]
    async fn conditional_lease_protocol_on_a_directory() {
        let dir = tempfile::tempdir().unwrap();
        lease_protocol_on(Store::local(dir.path()).unwrap()).await;
    }
}
