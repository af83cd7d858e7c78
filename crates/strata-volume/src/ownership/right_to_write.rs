//! `Ownership`: a volume's right to write while it is open: the local lock
//! and lease it holds, and whether writes may be acknowledged now: while
//! its host is valid (`host_liveness.rs`) and the lease stands under the
//! host's current incarnation; never once fenced.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use strata_store::{ObjectNames, Store};
use tokio::sync::Notify;

use super::host_liveness::HostLiveness;
use super::lease::{reclaim, release, HeldLease, RenewError};
use super::lease_transfer::{transfer, Successor};
use super::local_lock::LocalLock;
use crate::error::VolumeError;

/// Why a write that needs the right to write (a segment, the manifest) was
/// not made.
#[derive(Debug)]
pub(crate) enum WriteRefused {
    /// The volume was already fenced; the detail says why.
    Fenced(String),
    /// The store shows that another server took the volume over. The
    /// caller must fence the volume with this detail.
    TakenOver(String),
}

/// A volume's right to write, while open: the lease we hold, the host
/// whose liveness keeps it, and whether we were fenced.
pub(crate) struct Ownership {
    pub holder: String,
    pub epoch: u64,
    /// The lease this open replaced was this holder's own: no other server
    /// opened the volume since this one last did (recovery may then trust
    /// a journal of ours that the store has no segment of yet).
    pub last_opened_here: bool,
    host: Arc<HostLiveness>,
    local_lock: parking_lot::Mutex<Option<LocalLock>>,
    held: tokio::sync::Mutex<HeldLease>,
    /// The host incarnation the lease stands under.
    claimed: parking_lot::Mutex<String>,
    fenced: parking_lot::Mutex<Option<String>>,
    /// `fenced.is_some()`, readable without the lock (every read checks it).
    is_fenced: AtomicBool,
    /// Set once the volume is closed and the lease given up.
    released: AtomicBool,
    /// Lease writes after the open (re-claims under a new incarnation).
    renewals: AtomicU64,
    renewal_failures: AtomicU64,
    /// Woken when fencing changes or the lease is re-claimed.
    pub changed: Notify,
}

impl Ownership {
    pub(crate) fn new(host: Arc<HostLiveness>, lock: LocalLock, held: HeldLease) -> Self {
        let claimed = held
            .lease
            .host
            .as_ref()
            .map(|h| h.incarnation.clone())
            .unwrap_or_default();
        Ownership {
            last_opened_here: held.previous_holder.as_deref() == Some(host.holder.as_str()),
            holder: host.holder.clone(),
            epoch: held.lease.epoch,
            host,
            local_lock: parking_lot::Mutex::new(Some(lock)),
            held: tokio::sync::Mutex::new(held),
            claimed: parking_lot::Mutex::new(claimed),
            fenced: parking_lot::Mutex::new(None),
            is_fenced: AtomicBool::new(false),
            released: AtomicBool::new(false),
            renewals: AtomicU64::new(0),
            renewal_failures: AtomicU64::new(0),
            changed: Notify::new(),
        }
    }

    pub fn host(&self) -> &Arc<HostLiveness> {
        &self.host
    }

    /// Whether writes may be acknowledged now (an empty incarnation, while
    /// the host writes a new one, never equals a claimed one).
    pub fn is_valid(&self) -> bool {
        self.host.is_valid() && *self.claimed.lock() == self.host.incarnation()
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
        self.host.changed.notify_waiters();
    }

    /// Waits until writing is allowed; `Err` with the reason once fenced.
    pub async fn wait_valid(&self) -> Result<(), String> {
        loop {
            let own = self.changed.notified();
            let host = self.host.changed.notified();
            tokio::pin!(own, host);
            own.as_mut().enable();
            host.as_mut().enable();
            if let Some(d) = self.fenced() {
                return Err(d);
            }
            if self.is_valid() {
                return Ok(());
            }
            // Validity comes back only by a renewal or a re-claim, and
            // each notifies (ending by time alone is no reason to wake).
            tokio::select! {
                () = own => {}
                () = host => {}
            }
        }
    }

    /// Re-claims the lease under the host's current incarnation (after it
    /// was declared expired). On a takeover the caller fences the volume
    /// (`Volume::fence`, which words the reason clients and logs see).
    pub(crate) async fn reclaim(
        &self,
        store: &Store,
        names: &ObjectNames,
    ) -> Result<(), RenewError> {
        let mut held = self.held.lock().await;
        if self.is_released() {
            // A re-claim must not resurrect a lease released meanwhile.
            return Ok(());
        }
        let incarnation = self.host.incarnation();
        if incarnation.is_empty() || *self.claimed.lock() == incarnation {
            // Empty: the host's new record is not written yet; the
            // re-claim comes when it is (`HostLiveness::publish_incarnation`).
            return Ok(());
        }
        match reclaim(store, names, &held, &incarnation).await {
            Ok(h) => {
                *held = h;
                *self.claimed.lock() = incarnation;
                self.renewals.fetch_add(1, Ordering::Relaxed);
                self.changed.notify_waiters();
                Ok(())
            }
            Err(e) => {
                self.renewal_failures.fetch_add(1, Ordering::Relaxed);
                Err(e)
            }
        }
    }

    /// The lease as monitoring sees it.
    pub fn stats(&self) -> LeaseStats {
        let state = if self.is_fenced.load(Ordering::Acquire) {
            LeaseState::Fenced
        } else if self.is_released() {
            LeaseState::Released
        } else if self.is_valid() {
            LeaseState::Valid
        } else {
            LeaseState::Lapsed
        };
        LeaseStats {
            state,
            epoch: self.epoch,
            ttl_ms: self.host.ttl_ms,
            valid_for_ms: if state == LeaseState::Valid {
                self.host.valid_for_ms()
            } else {
                0
            },
            renewals: self.renewals.load(Ordering::Relaxed),
            renewal_failures: self.renewal_failures.load(Ordering::Relaxed),
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

    /// Hands the lease to `to` at `epoch` (unless fenced) and lets go of
    /// the local lock. False when the lease was not ours to hand over.
    pub async fn transfer(
        &self,
        store: &Store,
        names: &ObjectNames,
        to: &Successor,
        epoch: u64,
    ) -> Result<bool, VolumeError> {
        let held = self.held.lock().await;
        self.released.store(true, Ordering::Release);
        let result = if self.fenced().is_none() {
            transfer(store, names, &held, to, epoch).await
        } else {
            Ok(false)
        };
        self.local_lock.lock().take();
        result
    }

    /// Releases the lease (unless fenced) and the local lock.
    pub async fn release(&self, store: &Store, names: &ObjectNames) -> Result<(), VolumeError> {
        let held = self.held.lock().await;
        self.released.store(true, Ordering::Release);
        let result = if self.fenced().is_none() {
            release(store, names, &held).await
        } else {
            Ok(())
        };
        self.local_lock.lock().take();
        result
    }
}

/// Where a served volume's lease stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LeaseState {
    /// Renewed in time: writes are acknowledged.
    Valid,
    /// Its host's liveness not renewed within TTL less the margin (the
    /// store is unreachable), or the lease not yet re-claimed after the
    /// host was declared expired: writes wait until it is, or the volume
    /// is fenced.
    Lapsed,
    /// Another server took the volume over; this one stopped serving it.
    Fenced,
    /// Given up by a clean close.
    Released,
}

impl LeaseState {
    pub const ALL: [LeaseState; 4] = [
        LeaseState::Valid,
        LeaseState::Lapsed,
        LeaseState::Fenced,
        LeaseState::Released,
    ];

    pub fn name(self) -> &'static str {
        match self {
            LeaseState::Valid => "valid",
            LeaseState::Lapsed => "lapsed",
            LeaseState::Fenced => "fenced",
            LeaseState::Released => "released",
        }
    }
}

/// A served volume's lease: its state, the epoch this server holds, and
/// lease writes since it was opened (re-claims: a lease is not renewed on
/// a timer, its host is).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct LeaseStats {
    pub state: LeaseState,
    pub epoch: u64,
    pub ttl_ms: u64,
    /// How much longer writes are allowed without a renewal of the host.
    pub valid_for_ms: u64,
    pub renewals: u64,
    pub renewal_failures: u64,
}
