//! CSI snapshot names, claimed store-wide.
//!
//! A CSI snapshot name is unique across every volume, a strata snapshot
//! name only within its volume. Before taking snapshot NAME of volume V,
//! CreateSnapshot claims NAME with a create-only PUT of
//! `.csi/snapshot-names/NAME` holding V: a second claim of NAME for another
//! volume finds V there (ALREADY_EXISTS), a retry for V finds its own. The
//! leading dot keeps the folder out of every listing of volumes (no volume
//! name starts with one). DeleteSnapshot deletes the snapshot, then the
//! claim; a crash between leaves a claim the next CreateSnapshot of NAME
//! for V reuses.
//!
//! Object layout: JSON `{"version":1,"volume":"V"}`, at most
//! `MAX_CLAIM_BYTES`; anything else is refused as corrupt.

use bytes::Bytes;
use object_store::path::Path;
use object_store::PutPayload;
use serde::{Deserialize, Serialize};
use strata_store::Store;
use tonic::Status;

const PREFIX: &str = ".csi/snapshot-names";
const MAX_CLAIM_BYTES: usize = 4096;
const CLAIM_VERSION: u32 = 1;

#[derive(Debug, Serialize, Deserialize)]
struct Claim {
    version: u32,
    volume: String,
}

fn path(snapshot: &str) -> Path {
    Path::from(format!("{PREFIX}/{snapshot}"))
}

fn store_status(what: &str, e: &object_store::Error) -> Status {
    Status::unavailable(format!(
        "{what}: {} (the call is safe to repeat)",
        strata_store::ErrorText(e)
    ))
}

/// The volume snapshot name `snapshot` is claimed for, if any.
pub async fn claimed_by(store: &Store, snapshot: &str) -> Result<Option<String>, Status> {
    let p = path(snapshot);
    let Some((bytes, _)) = store
        .get_versioned(&p)
        .await
        .map_err(|e| store_status(&format!("read the claim {p}"), &e))?
    else {
        return Ok(None);
    };
    if bytes.len() > MAX_CLAIM_BYTES {
        return Err(Status::internal(format!(
            "the claim {p} is {} bytes, more than a claim holds ({MAX_CLAIM_BYTES}): delete it if no snapshot of that name exists",
            bytes.len()
        )));
    }
    match serde_json::from_slice::<Claim>(&bytes) {
        Ok(c) if c.version == CLAIM_VERSION => Ok(Some(c.volume)),
        Ok(c) => Err(Status::internal(format!(
            "the claim {p} has version {}, this driver reads {CLAIM_VERSION}: run a driver at least as new as the one that wrote it",
            c.version
        ))),
        Err(e) => Err(Status::internal(format!(
            "the claim {p} is not a claim ({e}): delete it if no snapshot of that name exists"
        ))),
    }
}

/// Claims `snapshot` for `volume`: Ok if it is now, or already was, claimed
/// for it; ALREADY_EXISTS naming the other volume otherwise.
pub async fn claim(store: &Store, snapshot: &str, volume: &str) -> Result<(), Status> {
    let p = path(snapshot);
    let body = serde_json::to_vec(&Claim {
        version: CLAIM_VERSION,
        volume: volume.to_string(),
    })
    .map_err(|e| Status::internal(format!("encode the claim {p}: {e}")))?;
    match store
        .put_if(&p, PutPayload::from(Bytes::from(body)), None)
        .await
    {
        Ok(_) => return Ok(()),
        Err(
            object_store::Error::AlreadyExists { .. } | object_store::Error::Precondition { .. },
        ) => {}
        Err(e) => return Err(store_status(&format!("write the claim {p}"), &e)),
    }
    match claimed_by(store, snapshot).await? {
        Some(v) if v == volume => Ok(()),
        Some(v) => Err(Status::already_exists(format!(
            "a snapshot named {snapshot:?} exists already, of volume {v:?}: snapshot names are unique across volumes"
        ))),
        // Deleted between the two: the caller's retry claims it.
        None => Err(Status::aborted(format!(
            "the snapshot name {snapshot:?} was released while it was being claimed: try again"
        ))),
    }
}

/// Releases `snapshot`'s claim (absent: nothing to do).
pub async fn release(store: &Store, snapshot: &str) -> Result<(), Status> {
    let p = path(snapshot);
    match store.delete(&p).await {
        Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
        Err(e) => Err(store_status(&format!("delete the claim {p}"), &e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_name_is_claimed_once_and_free_again_after_release() {
        let store = Store::in_memory();
        claim(&store, "daily", "v1").await.unwrap();
        claim(&store, "daily", "v1")
            .await
            .expect("a retry finds its own claim");
        let e = claim(&store, "daily", "v2").await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::AlreadyExists, "{e}");
        assert!(e.message().contains("\"v1\""), "{e}");
        assert_eq!(
            claimed_by(&store, "daily").await.unwrap().as_deref(),
            Some("v1")
        );
        release(&store, "daily").await.unwrap();
        release(&store, "daily").await.expect("releasing nothing");
        claim(&store, "daily", "v2").await.unwrap();
    }

    #[tokio::test]
    async fn a_claim_that_is_not_one_is_refused_with_what_to_do() {
        let store = Store::in_memory();
        for (body, want) in [
            (b"not json".to_vec(), "is not a claim"),
            (br#"{"version":9,"volume":"v"}"#.to_vec(), "version 9"),
            (vec![b' '; MAX_CLAIM_BYTES + 1], "more than a claim holds"),
        ] {
            store
                .put_opts(
                    &path("x"),
                    PutPayload::from(Bytes::from(body)),
                    Default::default(),
                )
                .await
                .unwrap();
            let e = claimed_by(&store, "x").await.unwrap_err();
            assert_eq!(e.code(), tonic::Code::Internal, "{e}");
            assert!(e.message().contains(want), "{e}");
        }
    }
}
