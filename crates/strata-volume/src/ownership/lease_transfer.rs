//! A lease handed straight to the next holder: the holder of a volume,
//! closing at a standby's request, writes the lease naming the standby's
//! host (If-Match on the version it holds) instead of a released one, and
//! the standby opens the volume without taking the lease itself.
//!
//! Why: a live migration's switchover waits for it. A release followed by
//! the taker's own acquisition costs the taker a poll for the release and
//! three store round trips (read the lease, read its host's record, write
//! its own) before it may even read the manifest; a transfer costs the
//! holder the one write a release costs, and the taker a read of the lease
//! it checks (alongside its manifest read).
//!
//! Safety: the transferred lease is an ordinary hosted lease (`lease.rs`),
//! live while the successor's host is, so nobody else can take the volume
//! between the holder's close and the successor's open. The successor
//! trusts nothing the holder said: it reads the lease and the manifest and
//! opens only if the lease names its host, incarnation and the random
//! token it chose, and the manifest's epoch is the lease's (the holder
//! wrote both, in that order: manifest first, see `volume/close.rs`). A
//! successor that cannot open releases the lease it was given
//! (`release_transferred`), so the volume is not left held by a host that
//! does not serve it.

use object_store::{PutPayload, UpdateVersion};
use strata_store::{ObjectNames, Store};

use super::host_liveness::HostLiveness;
use super::lease::{read_lease, HeldLease};
use crate::clock::now_ms;
use crate::error::VolumeError;
pub use crate::format::host_record::Successor;
use crate::format::lease::{Lease, LeaseHost};
use crate::objects::{is_condition_refused, store_error};

/// This host as a successor, with a fresh token.
pub fn successor_of(host: &HostLiveness) -> Result<Successor, VolumeError> {
    let incarnation = host.incarnation();
    if incarnation.is_empty() {
        return Err(VolumeError::Busy(
            "this host is writing a new liveness record; try again in a moment".into(),
        ));
    }
    Ok(Successor {
        holder: host.holder.clone(),
        pid: std::process::id(),
        host_id: host.id.clone(),
        incarnation,
        token: uuid::Uuid::new_v4().simple().to_string(),
        until_unix_ms: None,
    })
}

fn successor_lease(to: &Successor, epoch: u64, ttl_ms: u64) -> Lease {
    Lease {
        holder: to.holder.clone(),
        pid: to.pid,
        token: to.token.clone(),
        epoch,
        renewed_unix_ms: now_ms(),
        ttl_ms,
        released: false,
        host: Some(LeaseHost {
            id: to.host_id.clone(),
            incarnation: to.incarnation.clone(),
        }),
    }
}

/// Writes the lease naming `to` with `epoch` (If-Match on `held`). False
/// if the lease was no longer ours (fenced: left as it is).
pub(crate) async fn transfer(
    store: &Store,
    names: &ObjectNames,
    held: &HeldLease,
    to: &Successor,
    epoch: u64,
) -> Result<bool, VolumeError> {
    let path = names.lease();
    let lease = successor_lease(to, epoch, held.lease.ttl_ms);
    match store
        .put_if(&path, PutPayload::from(lease.encode()), Some(&held.version))
        .await
    {
        Ok(_) => Ok(true),
        Err(e) if is_condition_refused(&e) => {
            // A retry of our own write whose reply was lost, or a takeover.
            let now = read_lease(store, names).await?;
            Ok(now.is_some_and(|(l, _)| l.token == to.token))
        }
        Err(e) => Err(store_error(store, "write", &path)(e)),
    }
}

/// The lease a successor was handed, checked against what it chose and
/// the manifest epoch it read: `Some` if it is its to open with.
pub(crate) fn check_transferred(
    found: Option<(Lease, UpdateVersion)>,
    host: &HostLiveness,
    token: &str,
    manifest_epoch: u64,
) -> Result<HeldLease, String> {
    let Some((lease, version)) = found else {
        return Err("the volume has no lease".into());
    };
    let ours = lease.token == token
        && lease.holder == host.holder
        && !lease.released
        && lease
            .host
            .as_ref()
            .is_some_and(|h| h.id == host.id && h.incarnation == host.incarnation());
    if !ours {
        return Err(format!("its lease names {}", lease.describe()));
    }
    if lease.epoch != manifest_epoch {
        return Err(format!(
            "the lease's epoch {} is not the manifest's {manifest_epoch}",
            lease.epoch
        ));
    }
    Ok(HeldLease {
        lease,
        version,
        // Another server wrote the volume last: its journal here is stale.
        previous_holder: None,
    })
}

/// Releases a lease this host was handed but cannot open with (if it is
/// still the one with `token`).
pub(crate) async fn release_transferred(
    store: &Store,
    names: &ObjectNames,
    token: &str,
) -> Result<(), VolumeError> {
    let Some((lease, version)) = read_lease(store, names).await? else {
        return Ok(());
    };
    if lease.token != token || lease.released {
        return Ok(());
    }
    let held = HeldLease {
        lease,
        version,
        previous_holder: None,
    };
    super::lease::release(store, names, &held).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ownership::lease::acquire;

    #[tokio::test]
    async fn a_transferred_lease_is_the_successors_and_no_one_elses() {
        let store = Store::in_memory();
        let (da, db, dc) = (
            tempfile::tempdir().unwrap(),
            tempfile::tempdir().unwrap(),
            tempfile::tempdir().unwrap(),
        );
        let mut hosts = Vec::new();
        for d in [&da, &db, &dc] {
            hosts.push(
                HostLiveness::start(store.clone(), d.path(), 60_000, None)
                    .await
                    .unwrap(),
            );
        }
        let (a, b, c) = (&hosts[0], &hosts[1], &hosts[2]);
        let names = ObjectNames::new("v");
        let held = acquire(&store, &names, a, 1, "v").await.unwrap();
        let to = successor_of(b).unwrap();
        assert!(transfer(&store, &names, &held, &to, 2).await.unwrap());
        // A retry after a lost reply finds its own write.
        assert!(transfer(&store, &names, &held, &to, 2).await.unwrap());
        // Live for B: a third host is refused.
        let err = acquire(&store, &names, c, 3, "v").await.unwrap_err();
        assert!(err.to_string().contains("is being served by"), "{err}");
        let found = read_lease(&store, &names).await.unwrap();
        let mine = check_transferred(found.clone(), b, &to.token, 2).unwrap();
        assert_eq!(mine.lease.epoch, 2);
        // Not for C, not with another token, not at another epoch.
        assert!(check_transferred(found.clone(), c, &to.token, 2).is_err());
        assert!(check_transferred(found.clone(), b, "other", 2).is_err());
        assert!(check_transferred(found, b, &to.token, 3)
            .unwrap_err()
            .contains("epoch"));
        // A's stale version cannot transfer it again.
        let other = successor_of(c).unwrap();
        assert!(!transfer(&store, &names, &held, &other, 2).await.unwrap());
        // B, unable to open, gives it back: free for C.
        release_transferred(&store, &names, &to.token)
            .await
            .unwrap();
        acquire(&store, &names, c, 3, "v").await.unwrap();
    }

    #[test]
    fn a_successor_with_empty_or_huge_fields_is_refused() {
        let s = Successor {
            holder: "h:/d".into(),
            pid: 1,
            host_id: "0".repeat(32),
            incarnation: "i".into(),
            token: "t".into(),
            until_unix_ms: None,
        };
        assert!(s.validate().is_ok());
        let empty = Successor {
            token: String::new(),
            ..s.clone()
        };
        assert!(empty.validate().unwrap_err().contains("token"));
        let huge = Successor {
            holder: "x".repeat(crate::format::host_record::MAX_SUCCESSOR_FIELD_BYTES + 1),
            ..s
        };
        assert!(huge.validate().unwrap_err().contains("holder"));
    }
}
