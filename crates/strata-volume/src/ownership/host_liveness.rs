//! `HostLiveness`: this host's proof of life, one object for all its
//! volumes (`.hosts/<id>`, layout `format/host_record.rs`), renewed every
//! TTL/3 with If-Match on the version this host last wrote.
//!
//! Writes to any volume of this host are allowed only while the last
//! successful renewal was *sent* less than TTL - margin ago (monotonic
//! clock), as a per-volume lease allowed before. A renewal refused by the
//! store (If-Match) is read back:
//! - our own incarnation, alive: another host added a handover request
//!   (kept in `pending`, for the engine to answer), or a lost reply of our
//!   own write; renewed again on the version read;
//! - declared expired (`Expired`), another incarnation, or gone: a host
//!   took one of our volumes over while we were not renewing (paused,
//!   partitioned). We start a new *incarnation* and every open volume must
//!   re-claim its lease (If-Match on the version it wrote) before it writes
//!   again: the one that was taken over finds its lease changed and is
//!   fenced; the others go on (`Ownership::reclaim`).
//!
//! Why the takeover must write our record, not only the lease: a renewal
//! of ours sent before our TTL ran out may land after the other host read
//! the record as expired. The declaration is conditional on the version it
//! read, so exactly one of the two writes wins: either our renewal (and
//! the taker re-reads us alive) or the declaration (and our renewal fails,
//! so our validity is not extended past the moment it read us expired).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use object_store::{PutPayload, UpdateVersion};
use strata_store::{ObjectNames, Store};
use tokio::sync::Notify;

use super::local_lock::{host_identity, lock_locally, LocalLock};
use crate::clock::now_ms;
use crate::error::VolumeError;
use crate::format::host_record::{HandoverRequest, HostRecord, HostState, RequestKind, Successor};
use crate::objects::{is_condition_refused, read_versioned, store_error};

/// Writes of our record retried at once after a conflict we understood.
const MAX_CONFLICT_RETRIES: u32 = 4;
/// A handover request older than this is dropped unanswered.
const HANDOVER_REQUEST_MAX_AGE_MS: u64 = 120_000;
/// Requests remembered as queued (a record holds at most 64).
const SEEN_REQUESTS: usize = 256;

type SeenRequest = (String, String, RequestKind, u64);

/// The record as this host last wrote it, and its version.
struct Written {
    record: HostRecord,
    version: Option<UpdateVersion>,
}

/// This host's liveness, shared by every volume it holds.
pub struct HostLiveness {
    store: Store,
    pub id: String,
    pub holder: String,
    pub ttl_ms: u64,
    /// A second process on a data directory whose server holds the host
    /// lock: its record is its own and deleted when it stops.
    ephemeral: bool,
    written: tokio::sync::Mutex<Written>,
    incarnation: tokio::sync::watch::Sender<String>,
    started: Instant,
    valid_until_ms: AtomicU64,
    stopped: AtomicBool,
    renewals: AtomicU64,
    renewal_failures: AtomicU64,
    incarnations: AtomicU64,
    pending: parking_lot::Mutex<Vec<HandoverRequest>>,
    /// Woken when a handover request arrives through the store.
    pub requests_changed: Notify,
    /// Woken when validity changes.
    pub changed: Notify,
    /// Standbys of volumes this host holds (`request_watch.rs`): while
    /// any, the record is looked at every `REQUEST_POLL_MS` for requests.
    pub(super) request_watchers: std::sync::atomic::AtomicUsize,
    pub(super) request_poll_running: AtomicBool,
    /// The last requests queued (volume, by, kind, stamp): not twice.
    seen_requests: parking_lot::Mutex<std::collections::VecDeque<SeenRequest>>,
    _lock: Option<LocalLock>,
}

/// What `volume info` and `/metrics` show of the host.
#[derive(Debug, Clone, serde::Serialize)]
pub struct HostStats {
    pub id: String,
    pub valid: bool,
    pub valid_for_ms: u64,
    pub ttl_ms: u64,
    pub renewals: u64,
    pub renewal_failures: u64,
    /// New incarnations after another host declared this one expired.
    pub incarnations: u64,
}

fn incarnation_id() -> String {
    uuid::Uuid::new_v4().simple().to_string()
}

/// Reads host `id`'s record and its version, if any.
pub async fn read_host_record(
    store: &Store,
    id: &str,
) -> Result<Option<(HostRecord, UpdateVersion)>, VolumeError> {
    let hint = "if that host's server is stopped, delete this object";
    read_versioned(
        store,
        &ObjectNames::host_record(id),
        HostRecord::decode,
        hint,
    )
    .await
}

/// Declares host `record` expired (If-Match `version`): after this, its
/// renewal fails and it must re-claim each lease. `Ok(false)`: the record
/// changed meanwhile (renewed, or declared by someone else); read again.
pub(crate) async fn declare_expired(
    store: &Store,
    record: &HostRecord,
    version: &UpdateVersion,
    by: &str,
) -> Result<bool, VolumeError> {
    let path = ObjectNames::host_record(&record.id);
    let declared = HostRecord {
        state: HostState::Expired,
        expired_by: Some(by.to_string()),
        handover_requests: Vec::new(),
        ..record.clone()
    };
    match store
        .put_if(&path, PutPayload::from(declared.encode()), Some(version))
        .await
    {
        Ok(_) => {
            tracing::warn!(host = %record.holder, age_ms = record.age_ms(now_ms()), ttl_ms = record.ttl_ms, "host declared expired: it did not renew its liveness in time, and a volume of it is being taken over");
            Ok(true)
        }
        Err(e) if is_condition_refused(&e) => Ok(false),
        Err(e) => Err(store_error(store, "write", &path)(e)),
    }
}

/// Adds a handover request for `volume` to host `id`'s record, which that
/// host reads at its next renewal. `Ok(false)`: the host is not alive.
pub async fn request_handover_through_store(
    store: &Store,
    id: &str,
    volume: &str,
    by: &str,
) -> Result<bool, VolumeError> {
    send_request_through_store(store, id, volume, by, RequestKind::Handover, None)
        .await
        .map(|sent| sent.is_some())
}

/// Adds a request of `kind` about `volume` to host `id`'s record, which
/// that host reads at its next renewal (replacing an earlier one of the
/// same kind, volume and asker). `Ok(None)`: the host is not alive;
/// `Ok(Some(at_unix_ms))`: the request's stamp, to see it answered.
pub(crate) async fn send_request_through_store(
    store: &Store,
    id: &str,
    volume: &str,
    by: &str,
    kind: RequestKind,
    to: Option<&Successor>,
) -> Result<Option<u64>, VolumeError> {
    let request = HandoverRequest {
        volume: volume.to_string(),
        by: by.to_string(),
        at_unix_ms: 0,
        kind,
        to: to.cloned(),
        snapshot: None,
        size_bytes: None,
    };
    push_request(store, id, request).await
}

/// Adds `request` (its `at_unix_ms` set now) to host `id`'s record,
/// replacing an earlier one of the same kind, volume, asker and snapshot.
/// `Ok(None)`: the host is not alive; `Ok(Some(at_unix_ms))`: the stamp.
pub(crate) async fn push_request(
    store: &Store,
    id: &str,
    request: HandoverRequest,
) -> Result<Option<u64>, VolumeError> {
    let volume = request.volume.as_str();
    let path = ObjectNames::host_record(id);
    for _ in 0..MAX_CONFLICT_RETRIES * 4 {
        let Some((mut record, version)) = read_host_record(store, id).await? else {
            return Ok(None);
        };
        if !record.is_live(now_ms()) {
            return Ok(None);
        }
        let now = now_ms();
        record.handover_requests.retain(|r| {
            let same = r.volume == request.volume
                && r.kind == request.kind
                && r.by == request.by
                && r.snapshot == request.snapshot;
            !same && now.saturating_sub(r.at_unix_ms) < HANDOVER_REQUEST_MAX_AGE_MS
        });
        if record.handover_requests.len() >= crate::format::host_record::MAX_HANDOVER_REQUESTS {
            return Err(VolumeError::Busy(format!(
                "host {} has {} handover requests waiting; try again in a few seconds",
                record.holder,
                record.handover_requests.len()
            )));
        }
        record.handover_requests.push(HandoverRequest {
            at_unix_ms: now,
            ..request.clone()
        });
        match store
            .put_if(&path, PutPayload::from(record.encode()), Some(&version))
            .await
        {
            Ok(_) => return Ok(Some(now)),
            Err(e) if is_condition_refused(&e) => continue,
            Err(e) => return Err(store_error(store, "write", &path)(e)),
        }
    }
    Err(VolumeError::Busy(format!(
        "the record of the host holding {volume:?} kept changing; try again"
    )))
}

impl HostLiveness {
    /// Writes this host's record (a new incarnation) and starts renewing
    /// it. `control_socket`: where this host's server answers handover
    /// requests, advertised in the record.
    pub async fn start(
        store: Store,
        data_dir: &std::path::Path,
        ttl_ms: u64,
        control_socket: Option<String>,
    ) -> Result<Arc<HostLiveness>, VolumeError> {
        std::fs::create_dir_all(data_dir).map_err(|source| VolumeError::Io {
            what: format!("create the data directory {}", data_dir.display()),
            source,
        })?;
        let (holder, data_dir_id) = host_identity(data_dir)?;
        // One host record per data directory: its server holds this lock.
        // A second process there (an admin command beside the server) gets
        // a record of its own.
        let lock = lock_locally(&data_dir.join("host.lock"), "this host's liveness").ok();
        let ephemeral = lock.is_none();
        let id = if ephemeral {
            format!("{data_dir_id}.{}", &incarnation_id()[..12])
        } else {
            data_dir_id
        };
        let hostname = super::local_lock::hostname();
        let record = HostRecord {
            id: id.clone(),
            holder: holder.clone(),
            hostname,
            pid: std::process::id(),
            incarnation: incarnation_id(),
            renewed_unix_ms: now_ms(),
            ttl_ms,
            state: HostState::Alive,
            expired_by: None,
            control_socket: if ephemeral { None } else { control_socket },
            handover_requests: Vec::new(),
        };
        let host = Arc::new(HostLiveness {
            store,
            id,
            holder,
            ttl_ms,
            ephemeral,
            incarnation: tokio::sync::watch::channel(record.incarnation.clone()).0,
            written: tokio::sync::Mutex::new(Written {
                record,
                version: None,
            }),
            started: Instant::now(),
            valid_until_ms: AtomicU64::new(0),
            stopped: AtomicBool::new(false),
            renewals: AtomicU64::new(0),
            renewal_failures: AtomicU64::new(0),
            incarnations: AtomicU64::new(0),
            pending: parking_lot::Mutex::new(Vec::new()),
            requests_changed: Notify::new(),
            changed: Notify::new(),
            request_watchers: std::sync::atomic::AtomicUsize::new(0),
            request_poll_running: AtomicBool::new(false),
            seen_requests: parking_lot::Mutex::new(std::collections::VecDeque::new()),
            _lock: lock,
        });
        host.claim_record().await?;
        host.start_renewal();
        tracing::debug!(host = %host.holder, id = %host.id, ttl_ms, "host liveness started");
        Ok(host)
    }

    /// Writes our record over whatever is there: at start (the host lock
    /// proves an earlier process of this data directory is gone) and as a
    /// new incarnation after being declared expired.
    async fn claim_record(&self) -> Result<(), VolumeError> {
        let path = ObjectNames::host_record(&self.id);
        let mut w = self.written.lock().await;
        for _ in 0..MAX_CONFLICT_RETRIES {
            let current = read_host_record(&self.store, &self.id).await?;
            let sent_at = Instant::now();
            let record = HostRecord {
                renewed_unix_ms: now_ms(),
                ..w.record.clone()
            };
            let expected = current.as_ref().map(|c| &c.1);
            match self
                .store
                .put_if(&path, PutPayload::from(record.encode()), expected)
                .await
            {
                Ok(v) => {
                    w.record = record;
                    w.version = Some(v);
                    self.extend(sent_at);
                    return Ok(());
                }
                Err(e) if is_condition_refused(&e) => continue,
                Err(e) => return Err(store_error(&self.store, "write", &path)(e)),
            }
        }
        Err(VolumeError::Busy(format!(
            "this host's liveness record {path} kept changing while it was written; is another strata server using the data directory's id?"
        )))
    }

    fn start_renewal(self: &Arc<Self>) {
        let weak = Arc::downgrade(self);
        let ttl_ms = self.ttl_ms;
        tokio::spawn(async move {
            let mut delay_ms = ttl_ms / 3;
            loop {
                tokio::time::sleep(Duration::from_millis(delay_ms)).await;
                let Some(host) = weak.upgrade() else { return };
                if host.stopped.load(Ordering::Acquire) {
                    return;
                }
                delay_ms = match host.renew().await {
                    Ok(()) => ttl_ms / 3,
                    Err(e) => {
                        host.renewal_failures.fetch_add(1, Ordering::Relaxed);
                        tracing::warn!(host = %host.holder, error = %strata_store::ErrorText(&e), writes_allowed = host.is_valid(), "cannot renew this host's liveness; retrying (writes wait once it may have expired)");
                        (ttl_ms / 10).clamp(100, 1000)
                    }
                };
            }
        });
    }

    /// One renewal: If-Match our last version; a conflict is read back
    /// (module doc).
    pub(crate) async fn renew(&self) -> Result<(), VolumeError> {
        let path = ObjectNames::host_record(&self.id);
        let mut w = self.written.lock().await;
        if self.stopped.load(Ordering::Acquire) {
            return Ok(());
        }
        for _ in 0..MAX_CONFLICT_RETRIES {
            let sent_at = Instant::now();
            let record = HostRecord {
                renewed_unix_ms: now_ms(),
                handover_requests: Vec::new(),
                ..w.record.clone()
            };
            let put = self
                .store
                .put_if(&path, PutPayload::from(record.encode()), w.version.as_ref())
                .await;
            match put {
                Ok(v) => {
                    w.record = record;
                    w.version = Some(v);
                    self.extend(sent_at);
                    self.publish_incarnation(&w.record.incarnation);
                    self.renewals.fetch_add(1, Ordering::Relaxed);
                    return Ok(());
                }
                Err(e) if is_condition_refused(&e) => {}
                Err(e) => return Err(store_error(&self.store, "write", &path)(e)),
            }
            match read_host_record(&self.store, &self.id).await? {
                Some((r, v))
                    if r.incarnation == w.record.incarnation && r.state == HostState::Alive =>
                {
                    if r.renewed_unix_ms == record.renewed_unix_ms && r.handover_requests.is_empty()
                    {
                        // Our own write; its reply was lost.
                        w.record = r;
                        w.version = Some(v);
                        self.extend(sent_at);
                        self.renewals.fetch_add(1, Ordering::Relaxed);
                        return Ok(());
                    }
                    self.take_requests(&r.handover_requests);
                    w.version = Some(v);
                }
                other => {
                    let by = other.as_ref().and_then(|(r, _)| r.expired_by.clone());
                    tracing::warn!(host = %self.holder, declared_by = by.as_deref().unwrap_or("-"), "this host was declared expired while it did not renew (paused or cut off from the store); starting a new incarnation: each volume re-claims its lease before writing, and one taken over stops");
                    // No incarnation until the new record is in the store:
                    // every volume stops writing now (its lease names the
                    // old one), and none re-claims its lease under an
                    // incarnation another host cannot see yet (it would
                    // take that lease for one of a host that is over).
                    self.incarnation.send_replace(String::new());
                    w.record.incarnation = incarnation_id();
                    w.record.state = HostState::Alive;
                    w.record.expired_by = None;
                    w.version = other.map(|(_, v)| v);
                    drop(w);
                    self.incarnations.fetch_add(1, Ordering::Relaxed);
                    self.claim_record().await?;
                    let inc = self.written.lock().await.record.incarnation.clone();
                    self.publish_incarnation(&inc);
                    return Ok(());
                }
            }
        }
        Err(VolumeError::Busy(format!(
            "this host's liveness record {path} kept changing under its renewal"
        )))
    }

    /// Lets volumes re-claim their leases under `incarnation`, once its
    /// record is in the store (a no-op when already published).
    fn publish_incarnation(&self, incarnation: &str) {
        if *self.incarnation.borrow() != incarnation {
            self.incarnation.send_replace(incarnation.to_string());
            self.changed.notify_waiters();
        }
    }

    /// Queues the fresh requests of `requests` not queued before (a look
    /// and the renewal it starts may both find one: it is answered once).
    pub(super) fn take_requests(&self, requests: &[HandoverRequest]) {
        if requests.is_empty() {
            return;
        }
        let now = now_ms();
        let mut pending = self.pending.lock();
        let mut seen = self.seen_requests.lock();
        for r in requests {
            let fresh = now.saturating_sub(r.at_unix_ms) < HANDOVER_REQUEST_MAX_AGE_MS;
            let key = (r.volume.clone(), r.by.clone(), r.kind, r.at_unix_ms);
            if fresh && !seen.contains(&key) {
                tracing::info!(volume = %r.volume, by = %r.by, kind = ?r.kind, "request through the store");
                if seen.len() >= SEEN_REQUESTS {
                    seen.pop_front();
                }
                seen.push_back(key);
                pending.push(r.clone());
            }
        }
        drop((pending, seen));
        self.requests_changed.notify_waiters();
    }

    pub(super) fn store(&self) -> &Store {
        &self.store
    }

    /// Handover requests that came through the store, taken once.
    pub fn take_pending_requests(&self) -> Vec<HandoverRequest> {
        std::mem::take(&mut *self.pending.lock())
    }

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

    /// Whether this host may acknowledge writes now (its volumes must also
    /// hold their leases under the current incarnation).
    pub fn is_valid(&self) -> bool {
        !self.stopped.load(Ordering::Acquire)
            && self.elapsed_ms(Instant::now()) < self.valid_until_ms.load(Ordering::Acquire)
    }

    /// Whether `stop` was called (a stopped host cannot be renewed again).
    pub fn is_stopped(&self) -> bool {
        self.stopped.load(Ordering::Acquire)
    }

    pub fn valid_for_ms(&self) -> u64 {
        let now = self.elapsed_ms(Instant::now());
        self.valid_until_ms
            .load(Ordering::Acquire)
            .saturating_sub(now)
    }

    /// The current incarnation; empty while a new one is being written
    /// (no lease may be claimed under it, no volume writes).
    pub fn incarnation(&self) -> String {
        self.incarnation.borrow().clone()
    }

    /// Changes of incarnation (each volume re-claims its lease on one).
    pub fn watch_incarnation(&self) -> tokio::sync::watch::Receiver<String> {
        self.incarnation.subscribe()
    }

    pub fn stats(&self) -> HostStats {
        HostStats {
            id: self.id.clone(),
            valid: self.is_valid(),
            valid_for_ms: self.valid_for_ms(),
            ttl_ms: self.ttl_ms,
            renewals: self.renewals.load(Ordering::Relaxed),
            renewal_failures: self.renewal_failures.load(Ordering::Relaxed),
            incarnations: self.incarnations.load(Ordering::Relaxed),
        }
    }

    /// Stops renewing and says so in the record (a second process's own
    /// record is deleted). Call once every volume of this host is closed:
    /// a lease still held through this host becomes free at once.
    pub async fn stop(&self) {
        let path = ObjectNames::host_record(&self.id);
        let w = self.written.lock().await;
        if self.stopped.swap(true, Ordering::AcqRel) {
            return;
        }
        self.changed.notify_waiters();
        let result = if self.ephemeral {
            self.store.delete(&path).await
        } else {
            let record = HostRecord {
                state: HostState::Stopped,
                handover_requests: Vec::new(),
                ..w.record.clone()
            };
            let put = self
                .store
                .put_if(&path, PutPayload::from(record.encode()), w.version.as_ref())
                .await;
            put.map(|_| ())
        };
        match result {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
            Err(e) => {
                tracing::warn!(host = %self.holder, error = %strata_store::ErrorText(&e), "cannot mark this host stopped in the store; its record expires after its TTL")
            }
        }
    }
}
