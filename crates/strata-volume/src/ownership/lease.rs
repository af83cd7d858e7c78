//! The lease object's protocol: read, acquire, renew, release, each a
//! conditional write (If-None-Match / If-Match), so two servers racing for a
//! volume cannot both win and a lost reply of our own write is told from a
//! takeover by the random token. Layout: `format/lease.rs`.

use object_store::{PutPayload, UpdateVersion};
use strata_store::{ObjectNames, Store};

use crate::clock::now_ms;
use crate::error::VolumeError;
pub use crate::format::lease::Lease;
use crate::objects::store_error;

/// Attempts to take a lease that keeps changing under us.
const MAX_ACQUIRE_ATTEMPTS: u32 = 4;

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
pub(crate) fn check_free(
    lease: Option<&Lease>,
    holder: &str,
    volume: &str,
) -> Result<(), VolumeError> {
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
pub(crate) struct HeldLease {
    pub lease: Lease,
    pub version: UpdateVersion,
    /// Who held the lease this one replaced (None: there was none).
    pub previous_holder: Option<String>,
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
pub(crate) async fn acquire(
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
            Err(e) if is_conflict(&e) => {
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

/// Why a renewal did not happen.
#[derive(Debug)]
pub(crate) enum RenewError {
    /// Someone else's lease is in place: we were taken over.
    Fenced(String),
    /// The store did not answer; try again.
    Store(VolumeError),
}

/// Renews `held`, conditional on it being unchanged in the store.
pub(crate) async fn renew(
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
        Ok(version) => Ok(HeldLease {
            lease,
            version,
            previous_holder: held.previous_holder.clone(),
        }),
        Err(e) if is_conflict(&e) => match read_lease(store, names).await {
            Ok(Some((l, version))) if l.token == held.lease.token => Ok(HeldLease {
                lease: l,
                version,
                previous_holder: held.previous_holder.clone(),
            }),
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
        Err(e) if is_conflict(&e) => {
            tracing::warn!(object = %path, "lease was no longer ours at close; left as it is");
            Ok(())
        }
        Err(e) => Err(store_error(store, "write", &path)(e)),
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
            ttl_ms: 30_000,
            released: false,
        }
    }

    #[test]
    fn a_live_lease_of_another_holder_refuses_the_open() {
        let l = lease("h:/d", now_ms());
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
