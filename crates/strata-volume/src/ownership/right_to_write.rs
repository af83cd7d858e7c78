//! `Ownership`: a volume's right to write while it is open: the local lock
//! and lease it holds, until when writes may be acknowledged (the lease's
//! TTL less a margin, measured from when the last renewal was *sent*), and
//! whether it was fenced.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Instant;

use strata_store::{ObjectNames, Store};
use tokio::sync::Notify;

use super::lease::{release, renew, HeldLease, RenewError};
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

/// A volume's right to write, while open: the lease we hold, until when it
/// lets us write, and whether we were fenced.
pub(crate) struct Ownership {
    pub holder: String,
    pub epoch: u64,
    /// The lease this open replaced was this holder's own: no other server
    /// opened the volume since this one last did (recovery may then trust
    /// a journal of ours that the store has no segment of yet).
    pub last_opened_here: bool,
    pub ttl_ms: u64,
    local_lock: parking_lot::Mutex<Option<LocalLock>>,
    held: tokio::sync::Mutex<HeldLease>,
    started: Instant,
    /// Writes are allowed until this many ms after `started`.
    valid_until_ms: AtomicU64,
    fenced: parking_lot::Mutex<Option<String>>,
    /// `fenced.is_some()`, readable without the lock (every read checks it).
    is_fenced: AtomicBool,
    /// Set once the volume is closed and the lease given up.
    released: AtomicBool,
    renewals: AtomicU64,
    renewal_failures: AtomicU64,
    /// Woken when validity or fencing changes.
    pub changed: Notify,
}

impl Ownership {
    /// `sent_at`: when the write of `held` was sent.
    pub(crate) fn new(holder: String, lock: LocalLock, held: HeldLease, sent_at: Instant) -> Self {
        let ttl_ms = held.lease.ttl_ms;
        let own = Ownership {
            last_opened_here: held.previous_holder.as_deref() == Some(holder.as_str()),
            holder,
            epoch: held.lease.epoch,
            ttl_ms,
            local_lock: parking_lot::Mutex::new(Some(lock)),
            held: tokio::sync::Mutex::new(held),
            started: sent_at,
            valid_until_ms: AtomicU64::new(0),
            fenced: parking_lot::Mutex::new(None),
            is_fenced: AtomicBool::new(false),
            released: AtomicBool::new(false),
            renewals: AtomicU64::new(0),
            renewal_failures: AtomicU64::new(0),
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
    pub(crate) async fn renew(&self, store: &Store, names: &ObjectNames) -> Result<(), RenewError> {
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
                self.renewals.fetch_add(1, Ordering::Relaxed);
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
        let now_ms = self.elapsed_ms(Instant::now());
        let valid_until_ms = self.valid_until_ms.load(Ordering::Acquire);
        let state = if self.is_fenced.load(Ordering::Acquire) {
            LeaseState::Fenced
        } else if self.is_released() {
            LeaseState::Released
        } else if now_ms < valid_until_ms {
            LeaseState::Valid
        } else {
            LeaseState::Lapsed
        };
        LeaseStats {
            state,
            epoch: self.epoch,
            ttl_ms: self.ttl_ms,
            valid_for_ms: valid_until_ms.saturating_sub(now_ms),
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

/// Where a served volume's lease stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LeaseState {
    /// Renewed in time: writes are acknowledged.
    Valid,
    /// Not renewed within TTL less the margin (the store is unreachable):
    /// writes wait until a renewal succeeds or the volume is fenced.
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
/// renewals since it was opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct LeaseStats {
    pub state: LeaseState,
    pub epoch: u64,
    pub ttl_ms: u64,
    /// How much longer writes are allowed without a renewal.
    pub valid_for_ms: u64,
    pub renewals: u64,
    pub renewal_failures: u64,
}
