//! The lease object's protocol: read, acquire, re-claim, release, each a
//! conditional write (If-None-Match / If-Match), so two servers racing for a
//! volume cannot both win and a lost reply of our own write is told from a
//! takeover by the random token. Layout: `format/lease.rs`.
//!
//! A lease is written when its holder changes (open, close, handover,
//! takeover) and when its host starts a new incarnation, never on a timer:
//! its liveness is its host's (`host_liveness.rs`). `standing` says what a
//! lease found in the store stands for.

use object_store::{PutPayload, UpdateVersion};
use strata_store::{ObjectNames, Store};

use super::host_liveness::{declare_expired, read_host_record, HostLiveness};
use crate::clock::now_ms;
use crate::error::VolumeError;
use crate::format::host_record::{HostRecord, HostState};
pub use crate::format::lease::Lease;
use crate::format::lease::LeaseHost;
use crate::objects::{is_condition_refused, read_versioned, store_error};

/// Attempts to take a lease that keeps changing under us.
const MAX_ACQUIRE_ATTEMPTS: u32 = 4;

/// Reads the lease object and its version, if any.
pub async fn read_lease(
    store: &Store,
    names: &ObjectNames,
) -> Result<Option<(Lease, UpdateVersion)>, VolumeError> {
    let hint = "if no server holds the volume, delete this object";
    read_versioned(store, &names.lease(), Lease::decode, hint).await
}

/// What a lease found in the store stands for.
#[derive(Debug)]
pub enum Standing {
    /// Released, expired, or held by an incarnation of a host that is over.
    Free,
    /// Its holder is alive: the detail says who, and for how long it has
    /// been silent at most. `host`: its host's record (a hosted lease).
    Live {
        detail: String,
        host: Option<HostRecord>,
    },
    /// Held through a host that did not renew within its TTL: it may be
    /// taken once that host is declared expired (`declare_expired`).
    HostExpired(HostRecord, UpdateVersion),
}

/// Where `lease` stands at this moment (reads its host's record).
pub async fn standing(store: &Store, lease: &Lease) -> Result<Standing, VolumeError> {
    if lease.released {
        return Ok(Standing::Free);
    }
    let now = now_ms();
    let Some(host) = &lease.host else {
        // Version 1: an older server renews the lease itself.
        let Some(holder) = lease.live_holder(now) else {
            return Ok(Standing::Free);
        };
        let age_s = now.saturating_sub(lease.renewed_unix_ms) / 1000;
        let detail =
            format!("{holder}, lease renewed {age_s} s ago (a server of an older release)");
        return Ok(Standing::Live { detail, host: None });
    };
    let Some((record, version)) = read_host_record(store, &host.id).await? else {
        return Ok(Standing::Free);
    };
    if record.incarnation != host.incarnation || record.state != HostState::Alive {
        return Ok(Standing::Free);
    }
    if record.is_live(now) {
        let detail = format!(
            "{}, its host alive (renewed {} s ago)",
            lease.describe(),
            record.age_ms(now) / 1000
        );
        return Ok(Standing::Live {
            detail,
            host: Some(record),
        });
    }
    Ok(Standing::HostExpired(record, version))
}

/// "holder (pid N, epoch E)" if the lease is held by a live server.
pub async fn live_holder(store: &Store, lease: &Lease) -> Result<Option<String>, VolumeError> {
    Ok(match standing(store, lease).await? {
        Standing::Live { .. } => Some(lease.describe()),
        _ => None,
    })
}

/// The refusal of an open: who holds the volume and what to do. A holder
/// of the previous release (`hosted` false) cannot be asked to let go.
fn busy(volume: &str, detail: &str, ttl_ms: u64, hosted: bool) -> VolumeError {
    let ask = if hosted {
        format!("ask it to let go with `strata volume handover {volume}`, stop that server,")
    } else {
        "stop that server (SIGTERM releases the volume),".to_string()
    };
    VolumeError::Busy(format!(
        "volume {volume:?} is being served by {detail}; {ask} or wait {} s after it died",
        ttl_ms.div_ceil(1000)
    ))
}

/// A lease we wrote, and the version the store gave it.
#[derive(Debug, Clone)]
pub(crate) struct HeldLease {
    pub lease: Lease,
    pub version: UpdateVersion,
    /// Who held the lease this one replaced (None: there was none).
    pub previous_holder: Option<String>,
}

/// Takes the lease for `epoch` through `host`, or says who holds it. A
/// lease of this same holder (data directory) is ours to take: the local
/// lock proves the process that wrote it is gone.
pub(crate) async fn acquire(
    store: &Store,
    names: &ObjectNames,
    host: &HostLiveness,
    epoch: u64,
    volume: &str,
) -> Result<HeldLease, VolumeError> {
    let path = names.lease();
    let incarnation = host.incarnation();
    if incarnation.is_empty() {
        return Err(VolumeError::Busy(format!(
            "volume {volume:?}: this host is writing a new liveness record (another host found it silent past its TTL); try again in a moment"
        )));
    }
    let lease = Lease {
        holder: host.holder.clone(),
        pid: std::process::id(),
        token: uuid::Uuid::new_v4().simple().to_string(),
        epoch,
        renewed_unix_ms: now_ms(),
        ttl_ms: host.ttl_ms,
        released: false,
        host: Some(LeaseHost {
            id: host.id.clone(),
            incarnation,
        }),
    };
    for _ in 0..MAX_ACQUIRE_ATTEMPTS {
        let current = read_lease(store, names).await?;
        if let Some((l, _)) = current.as_ref().filter(|(l, _)| l.holder != host.holder) {
            match standing(store, l).await? {
                Standing::Free => {}
                Standing::Live { detail, host: h } => {
                    let hosted = h.is_some();
                    let ttl_ms = h.map_or(l.ttl_ms, |h| h.ttl_ms);
                    return Err(busy(volume, &detail, ttl_ms, hosted));
                }
                Standing::HostExpired(record, version) => {
                    if !declare_expired(store, &record, &version, &host.holder).await? {
                        continue;
                    }
                }
            }
        }
        let lease = Lease {
            renewed_unix_ms: now_ms(),
            ..lease.clone()
        };
        let expected = current.as_ref().map(|c| &c.1);
        let previous_holder = current.as_ref().map(|c| c.0.holder.clone());
        match store
            .put_if(&path, PutPayload::from(lease.encode()), expected)
            .await
        {
            Ok(version) => {
                return Ok(HeldLease {
                    lease,
                    version,
                    previous_holder,
                })
            }
            Err(e) if is_condition_refused(&e) => {
                // Someone raced us, or a retry of our own write found it
                // already done: the token tells.
                if let Some((l, version)) = read_lease(store, names).await? {
                    if l.token == lease.token {
                        return Ok(HeldLease {
                            lease: l,
                            version,
                            previous_holder,
                        });
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

/// Why a re-claim did not happen.
#[derive(Debug)]
pub(crate) enum RenewError {
    /// Someone else's lease is in place: we were taken over.
    Fenced(String),
    /// The store did not answer; try again.
    Store(VolumeError),
}

/// Re-claims `held` for our host's new `incarnation`, conditional on the
/// lease being unchanged in the store since we wrote it.
pub(crate) async fn reclaim(
    store: &Store,
    names: &ObjectNames,
    held: &HeldLease,
    incarnation: &str,
) -> Result<HeldLease, RenewError> {
    let path = names.lease();
    let lease = Lease {
        renewed_unix_ms: now_ms(),
        host: held.lease.host.as_ref().map(|h| LeaseHost {
            id: h.id.clone(),
            incarnation: incarnation.to_string(),
        }),
        ..held.lease.clone()
    };
    let put = store
        .put_if(&path, PutPayload::from(lease.encode()), Some(&held.version))
        .await;
    match put {
        Ok(version) => Ok(HeldLease {
            lease,
            version,
            previous_holder: held.previous_holder.clone(),
        }),
        Err(e) if is_condition_refused(&e) => match read_lease(store, names).await {
            Ok(Some((l, version))) if l.token == held.lease.token && l.host == lease.host => {
                Ok(HeldLease {
                    lease: l,
                    version,
                    previous_holder: held.previous_holder.clone(),
                })
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
pub(crate) async fn release(
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
        Err(e) if is_condition_refused(&e) => {
            tracing::warn!(object = %path, "lease was no longer ours at close; left as it is");
            Ok(())
        }
        Err(e) => Err(store_error(store, "write", &path)(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn host(store: &Store, dir: &std::path::Path) -> std::sync::Arc<HostLiveness> {
        HostLiveness::start(store.clone(), dir, 60_000, None)
            .await
            .unwrap()
    }

    #[tokio::test]
    async fn a_self_contained_lease_is_live_until_its_ttl() {
        let store = Store::in_memory();
        let mut l = Lease {
            holder: "h:/d".into(),
            pid: 7,
            token: "t".into(),
            epoch: 3,
            renewed_unix_ms: now_ms(),
            ttl_ms: 30_000,
            released: false,
            host: None,
        };
        let s = standing(&store, &l).await.unwrap();
        assert!(
            matches!(&s, Standing::Live { detail, .. } if detail.contains("pid 7")),
            "{s:?}"
        );
        l.renewed_unix_ms = 0;
        assert!(matches!(
            standing(&store, &l).await.unwrap(),
            Standing::Free
        ));
        l.renewed_unix_ms = now_ms();
        l.released = true;
        assert!(matches!(
            standing(&store, &l).await.unwrap(),
            Standing::Free
        ));
    }

    async fn lease_protocol_on(store: Store) {
        let (da, db) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let (ha, hb) = (host(&store, da.path()).await, host(&store, db.path()).await);
        let names = ObjectNames::new("v");
        let a = acquire(&store, &names, &ha, 1, "v").await.unwrap();
        let err = acquire(&store, &names, &hb, 2, "v").await.unwrap_err();
        assert!(err.to_string().contains("is being served by"), "{err}");
        assert!(
            err.to_string().contains("strata volume handover v"),
            "{err}"
        );
        // A lost reply: a stale version of our own lease, the token says
        // it is ours.
        let stale = HeldLease {
            version: UpdateVersion {
                e_tag: Some("\"stale\"".into()),
                version: None,
            },
            ..a.clone()
        };
        let a = reclaim(&store, &names, &a, &ha.incarnation())
            .await
            .unwrap();
        let _ = reclaim(&store, &names, &stale, &ha.incarnation()).await;
        release(&store, &names, &a).await.unwrap();
        let b = acquire(&store, &names, &hb, 2, "v").await.unwrap();
        match reclaim(&store, &names, &a, "new").await {
            Err(RenewError::Fenced(d)) => assert!(d.contains("epoch 2"), "{d}"),
            other => panic!("A was not fenced: {other:?}"),
        }
        assert_eq!(
            read_lease(&store, &names).await.unwrap().unwrap().0,
            b.lease
        );
        // Once B's host stops, its lease is free even unreleased.
        hb.stop().await;
        acquire(&store, &names, &ha, 3, "v").await.unwrap();
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

    /// A host declared expired (as a taker does, with If-Match on the
    /// record it read) fails its next renewal, starts a new incarnation,
    /// and re-claims the leases nobody took; the one another host took
    /// stays lost to it.
    #[tokio::test]
    async fn a_host_declared_expired_starts_anew_and_loses_only_what_was_taken() {
        let store = Store::in_memory();
        let (da, db) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let a = HostLiveness::start(store.clone(), da.path(), 60_000, None)
            .await
            .unwrap();
        let b = HostLiveness::start(store.clone(), db.path(), 60_000, None)
            .await
            .unwrap();
        let (kept, taken) = (ObjectNames::new("kept"), ObjectNames::new("taken"));
        let held_kept = acquire(&store, &kept, &a, 1, "kept").await.unwrap();
        let held_taken = acquire(&store, &taken, &a, 1, "taken").await.unwrap();
        let first = a.incarnation();

        // B finds A silent (as if past its TTL) and declares it expired,
        // then takes one volume: the lease is free once A is expired.
        let (record, version) = read_host_record(&store, &a.id).await.unwrap().unwrap();
        assert!(declare_expired(&store, &record, &version, &b.holder)
            .await
            .unwrap());
        let (lease, _) = read_lease(&store, &taken).await.unwrap().unwrap();
        assert!(matches!(
            standing(&store, &lease).await.unwrap(),
            Standing::Free
        ));
        acquire(&store, &taken, &b, 2, "taken").await.unwrap();

        // A's renewal fails its If-Match, reads "expired": a new
        // incarnation, published once its record is stored.
        let watch = a.watch_incarnation();
        a.renew().await.unwrap();
        let second = a.incarnation();
        assert!(!second.is_empty() && second != first, "{first} -> {second}");
        assert!(watch.has_changed().unwrap());
        let (stored, _) = read_host_record(&store, &a.id).await.unwrap().unwrap();
        assert_eq!(
            (stored.state, stored.incarnation.as_str()),
            (HostState::Alive, second.as_str())
        );
        assert_eq!(a.stats().incarnations, 1);

        // The lease nobody took is re-claimed; the taken one is lost.
        let kept_again = reclaim(&store, &kept, &held_kept, &second).await.unwrap();
        assert_eq!(kept_again.lease.host.unwrap().incarnation, second);
        match reclaim(&store, &taken, &held_taken, &second).await {
            Err(RenewError::Fenced(detail)) => assert!(detail.contains("epoch 2"), "{detail}"),
            other => panic!("the taken volume was re-claimed: {other:?}"),
        }
        // B sees A alive again: a lease under A's new incarnation is live.
        let (lease, _) = read_lease(&store, &kept).await.unwrap().unwrap();
        assert!(matches!(
            standing(&store, &lease).await.unwrap(),
            Standing::Live { .. }
        ));
    }

    /// A renewal that lands before the taker's declaration makes the
    /// declaration fail (both are If-Match on the same version).
    #[tokio::test]
    async fn a_renewal_and_a_declaration_cannot_both_win() {
        let store = Store::in_memory();
        let da = tempfile::tempdir().unwrap();
        let a = HostLiveness::start(store.clone(), da.path(), 60_000, None)
            .await
            .unwrap();
        let (record, version) = read_host_record(&store, &a.id).await.unwrap().unwrap();
        a.renew().await.unwrap();
        assert!(!declare_expired(&store, &record, &version, "taker")
            .await
            .unwrap());
        let first = a.incarnation();
        a.renew().await.unwrap();
        assert_eq!(a.incarnation(), first, "no new incarnation");
        assert_eq!(a.stats().incarnations, 0);
    }
}
