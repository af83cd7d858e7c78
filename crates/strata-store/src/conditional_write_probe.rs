//! Probing whether a store enforces the conditional writes strata relies on.
//!
//! This module owns the probe ([`probe_conditional_writes`]) and what it
//! finds ([`ProbeReport`]: one [`ConditionCheck`] per [`Condition`]). The
//! lease, the manifest's epoch fencing and segment writes are conditional
//! PUTs: create-only (`If-None-Match: *`, `PutMode::Create`) and
//! compare-and-swap on a version (`If-Match: ETAG`, `PutMode::Update`). A
//! store that accepts those headers and ignores them (Garage; some Ceph RGW
//! versions) lets two hosts both believe they own a volume, so serving on
//! it must be refused. Remembering the verdict is `store_check.rs`'s job.
//!
//! The probe writes two objects under `.strata-probe/` (a name no volume
//! can have: volume names never start with '.') and deletes them whatever
//! happens:
//!
//! 1. `<id>.create`: a create-only PUT (must succeed), a second one (must
//!    fail: AlreadyExists or Precondition), then the content must still be
//!    the first;
//! 2. `<id>.update`: written, updated on the version the PUT returned
//!    (must succeed), updated again on that now stale version (must fail:
//!    Precondition), then the content must be the second.
//!
//! The probe goes through [`Store::put_if`], the call the lease and the
//! manifest use, so it judges what strata actually does: on the embedded
//! store, create-only is the filesystem's `link` (fails if the name exists)
//! and the version check runs under an exclusive `flock` that every strata
//! process using the directory takes (`object_store`'s local backend has no
//! compare-and-swap); the probe verifies that emulation like any store.
//!
//! Writes are retried by the store's retry layer, so an expected success
//! can come back as AlreadyExists / Precondition after a lost reply; the
//! probe then reads the object back and counts it as ours if it holds our
//! unique content (see `retrying_object_store.rs`).

use bytes::Bytes;
use object_store::path::Path;
use object_store::{PutOptions, PutPayload, UpdateVersion};
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

use crate::env::{Entropy, SplitMixEntropy};
use crate::store::Store;

/// Where probe objects are written, under the store's prefix.
pub const PROBE_PREFIX: &str = ".strata-probe";

/// A conditional write strata relies on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Condition {
    /// `If-None-Match: *` on PUT: create only if absent.
    IfNoneMatch,
    /// `If-Match: ETAG` on PUT: replace only the version read.
    IfMatch,
}

impl Condition {
    /// The feature, for messages.
    pub fn feature(self) -> &'static str {
        match self {
            Condition::IfNoneMatch => "If-None-Match on PUT (create-only writes)",
            Condition::IfMatch => "If-Match on PUT (writes conditional on the version read)",
        }
    }

    /// What goes wrong without it, for messages.
    pub fn risk(self) -> &'static str {
        match self {
            Condition::IfNoneMatch => "two strata processes could both own a volume",
            Condition::IfMatch => {
                "a server whose volume was taken over would not be fenced and could overwrite the new owner's manifest"
            }
        }
    }
}

/// What the probe found about one condition.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// The store refused the write that had to fail and accepted the one
    /// that had to succeed.
    Enforced,
    /// The write that had to fail succeeded (or changed the object).
    Ignored,
    /// The store refused the conditional write outright (not implemented,
    /// or refused even when the condition held).
    Unsupported,
}

/// One condition's verdict, and how it was reached (for people).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConditionCheck {
    pub verdict: Verdict,
    pub detail: String,
}

impl ConditionCheck {
    fn enforced(detail: impl Into<String>) -> Self {
        ConditionCheck {
            verdict: Verdict::Enforced,
            detail: detail.into(),
        }
    }

    fn ignored(detail: impl Into<String>) -> Self {
        ConditionCheck {
            verdict: Verdict::Ignored,
            detail: detail.into(),
        }
    }

    fn unsupported(detail: impl Into<String>) -> Self {
        ConditionCheck {
            verdict: Verdict::Unsupported,
            detail: detail.into(),
        }
    }
}

/// What one probe found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProbeReport {
    /// The store probed ([`Store::description`]).
    pub store: String,
    pub if_none_match: ConditionCheck,
    pub if_match: ConditionCheck,
}

impl ProbeReport {
    /// Each condition with its check, in the order of the probe.
    pub fn checks(&self) -> [(Condition, &ConditionCheck); 2] {
        [
            (Condition::IfNoneMatch, &self.if_none_match),
            (Condition::IfMatch, &self.if_match),
        ]
    }

    /// The conditions the store does not enforce.
    pub fn missing(&self) -> Vec<Condition> {
        self.checks()
            .into_iter()
            .filter(|(_, c)| c.verdict != Verdict::Enforced)
            .map(|(condition, _)| condition)
            .collect()
    }

    /// Whether the store enforces every condition strata relies on.
    pub fn is_safe(&self) -> bool {
        self.missing().is_empty()
    }

    /// What the store lacks and what it risks, in one line (`None` when it
    /// lacks nothing), e.g. "the store at s3://b/p ignores If-None-Match on
    /// PUT (create-only writes): two strata processes could both own a
    /// volume".
    pub fn shortcoming(&self) -> Option<String> {
        let missing: Vec<(Condition, &ConditionCheck)> = self
            .checks()
            .into_iter()
            .filter(|(_, c)| c.verdict != Verdict::Enforced)
            .collect();
        if missing.is_empty() {
            return None;
        }
        let what: Vec<String> = missing
            .iter()
            .map(|(condition, check)| match check.verdict {
                Verdict::Unsupported => format!("does not support {}", condition.feature()),
                _ => format!("ignores {}", condition.feature()),
            })
            .collect();
        let risks: Vec<&str> = missing.iter().map(|(c, _)| c.risk()).collect();
        Some(format!(
            "the store at {} {}: {}",
            self.store,
            what.join(" and "),
            risks.join("; ")
        ))
    }
}

/// Why the probe could not reach a verdict.
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    /// The store's error is in the message, not a `source()`: callers
    /// print error chains, which would repeat it.
    #[error("probing {store} for conditional writes: {step} ({object}) failed: {}", crate::error_text::error_text(.error))]
    Store {
        store: String,
        step: &'static str,
        object: String,
        error: object_store::Error,
    },
    #[error("probing {store} for conditional writes: {what}")]
    Unexpected { store: String, what: String },
}

impl ProbeError {
    /// Whether the store's error already says what to do (an explained
    /// [`crate::StoreFailure`]: credentials, permissions, bucket, disk).
    pub fn is_explained(&self) -> bool {
        match self {
            ProbeError::Store { error, .. } => crate::StoreFailure::find(error).is_some(),
            ProbeError::Unexpected { .. } => false,
        }
    }
}

/// Probes `store` (see the module doc). Probe objects are deleted whatever
/// the outcome; a delete that fails is logged (a leftover probe object is
/// harmless: nothing reads `.strata-probe/`).
pub async fn probe_conditional_writes(store: &Store) -> Result<ProbeReport, ProbeError> {
    let probe = Probe::new(store);
    let create = probe.object("create");
    let update = probe.object("update");
    let checked = async {
        Ok(ProbeReport {
            store: store.description().to_string(),
            if_none_match: probe.check_if_none_match(&create).await?,
            if_match: probe.check_if_match(&update).await?,
        })
    }
    .await;
    let written = std::mem::take(&mut *probe.written.lock());
    for object in &written {
        match store.delete(object).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
            Err(e) => {
                tracing::warn!(object = %object, error = %crate::ErrorText(&e), "cannot delete a store probe object; it is harmless, delete it by hand")
            }
        }
    }
    checked
}

/// One run of the probe: the store, the run's unique id, and the objects
/// it sent a PUT for (to delete: nothing else, so a store that cannot be
/// reached is not sent deletes of objects it never saw).
struct Probe<'a> {
    store: &'a Store,
    id: String,
    written: Mutex<Vec<Path>>,
}

impl<'a> Probe<'a> {
    fn new(store: &'a Store) -> Self {
        let entropy = SplitMixEntropy::from_clock();
        let id = format!(
            "{:016x}{:08x}",
            entropy.next_u64(),
            std::process::id() ^ (entropy.next_u64() as u32)
        );
        Probe {
            store,
            id,
            written: Mutex::new(Vec::new()),
        }
    }

    /// Called before the first PUT of `object`.
    fn will_write(&self, object: &Path) {
        self.written.lock().push(object.clone());
    }

    fn object(&self, what: &str) -> Path {
        Path::from(format!("{PROBE_PREFIX}/{}.{what}", self.id))
    }

    /// Content unique to this run and step, so a read-back tells our
    /// writes from anyone else's.
    fn body(&self, step: &str) -> Bytes {
        Bytes::from(format!(
            "strata conditional write probe {} {step}\n",
            self.id
        ))
    }

    fn store_error(
        &self,
        step: &'static str,
        object: &Path,
        error: object_store::Error,
    ) -> ProbeError {
        ProbeError::Store {
            store: self.store.description().to_string(),
            step,
            object: object.to_string(),
            error,
        }
    }

    fn unexpected(&self, what: String) -> ProbeError {
        ProbeError::Unexpected {
            store: self.store.description().to_string(),
            what,
        }
    }

    /// Step 1 of the module doc.
    async fn check_if_none_match(&self, object: &Path) -> Result<ConditionCheck, ProbeError> {
        let first = self.body("first");
        if let Err(check) = self.create(object, &first).await? {
            return Ok(check);
        }
        let second = PutPayload::from(self.body("second"));
        match self.store.put_if(object, second, None).await {
            Ok(_) => Ok(ConditionCheck::ignored(
                "a second create-only PUT of an existing object succeeded and replaced it",
            )),
            Err(
                object_store::Error::AlreadyExists { .. }
                | object_store::Error::Precondition { .. },
            ) => {
                if self.read(object).await?.0 != first {
                    return Ok(ConditionCheck::ignored(
                        "a second create-only PUT was refused, yet the object changed",
                    ));
                }
                Ok(ConditionCheck::enforced(self.how_create_is_enforced()))
            }
            Err(object_store::Error::NotImplemented) => Ok(ConditionCheck::unsupported(
                "the store does not implement create-only PUTs",
            )),
            Err(e) => Err(self.store_error("second create-only PUT", object, e)),
        }
    }

    /// Step 2 of the module doc.
    async fn check_if_match(&self, object: &Path) -> Result<ConditionCheck, ProbeError> {
        // A plain PUT: this step must not depend on create-only writes.
        self.will_write(object);
        let v1: UpdateVersion = self
            .store
            .put_opts(
                object,
                PutPayload::from(self.body("v1")),
                PutOptions::default(),
            )
            .await
            .map_err(|e| self.store_error("PUT", object, e))?
            .into();
        let v2_body = self.body("v2");
        let current = self
            .store
            .put_if(object, PutPayload::from(v2_body.clone()), Some(&v1))
            .await;
        match current {
            Ok(_) => {}
            Err(object_store::Error::Precondition { .. }) => {
                // Maybe our own update, retried after a lost reply.
                if self.read(object).await?.0 != v2_body {
                    return Ok(ConditionCheck::unsupported(
                        "a PUT with If-Match on the object's current version was refused",
                    ));
                }
            }
            Err(object_store::Error::NotImplemented) => {
                return Ok(ConditionCheck::unsupported(
                    "the store does not implement PUTs conditional on a version",
                ))
            }
            Err(e) => {
                return Err(self.store_error("PUT with If-Match on the current version", object, e))
            }
        }
        let stale = PutPayload::from(self.body("v3"));
        match self.store.put_if(object, stale, Some(&v1)).await {
            Ok(_) => Ok(ConditionCheck::ignored(
                "a PUT with If-Match on a stale version succeeded and replaced the object",
            )),
            Err(
                object_store::Error::Precondition { .. }
                | object_store::Error::AlreadyExists { .. },
            ) => {
                if self.read(object).await?.0 != v2_body {
                    return Ok(ConditionCheck::ignored(
                        "a PUT with If-Match on a stale version was refused, yet the object changed",
                    ));
                }
                Ok(ConditionCheck::enforced(self.how_update_is_enforced()))
            }
            Err(e) => Err(self.store_error("PUT with If-Match on a stale version", object, e)),
        }
    }

    /// A create-only PUT that must succeed: `Ok(Ok(version))`, or
    /// `Ok(Err(check))` when the store does not support it at all.
    async fn create(
        &self,
        object: &Path,
        body: &Bytes,
    ) -> Result<Result<UpdateVersion, ConditionCheck>, ProbeError> {
        let payload = PutPayload::from(body.clone());
        self.will_write(object);
        match self.store.put_if(object, payload, None).await {
            Ok(version) => Ok(Ok(version)),
            Err(
                object_store::Error::AlreadyExists { .. }
                | object_store::Error::Precondition { .. },
            ) => {
                // Maybe our own create, retried after a lost reply.
                let (found, version) = self.read(object).await?;
                if found != *body {
                    return Err(self.unexpected(format!(
                        "{object} existed before the probe created it (another process uses the same name?); run the probe again"
                    )));
                }
                Ok(Ok(version))
            }
            Err(object_store::Error::NotImplemented) => Ok(Err(ConditionCheck::unsupported(
                "the store does not implement create-only PUTs",
            ))),
            Err(e) => Err(self.store_error("create-only PUT", object, e)),
        }
    }

    /// The object's content and version; it must exist.
    async fn read(&self, object: &Path) -> Result<(Bytes, UpdateVersion), ProbeError> {
        match self.store.get_versioned(object).await {
            Ok(Some(found)) => Ok(found),
            Ok(None) => {
                Err(self.unexpected(format!("{object} vanished right after the probe wrote it")))
            }
            Err(e) => Err(self.store_error("read back", object, e)),
        }
    }

    fn how_create_is_enforced(&self) -> String {
        if self.store.is_local() {
            "a second create-only PUT was refused (the embedded store links the file into place, which fails if the name exists)".into()
        } else {
            "a second PUT with If-None-Match: * was refused and the object kept its content".into()
        }
    }

    fn how_update_is_enforced(&self) -> String {
        if self.store.is_local() {
            "a PUT on a stale version was refused and one on the current version accepted (the embedded store compares versions under an exclusive flock on .strata-cas.lock in its directory, which every strata process using the directory takes)".into()
        } else {
            "a PUT with If-Match on a stale ETag was refused and one on the current ETag accepted"
                .into()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(none_match: Verdict, if_match: Verdict) -> ProbeReport {
        let check = |verdict| ConditionCheck {
            verdict,
            detail: String::new(),
        };
        ProbeReport {
            store: "s3://b/p".into(),
            if_none_match: check(none_match),
            if_match: check(if_match),
        }
    }

    #[test]
    fn shortcoming_names_each_missing_feature_and_its_risk() {
        assert_eq!(
            report(Verdict::Enforced, Verdict::Enforced).shortcoming(),
            None
        );
        let one = report(Verdict::Ignored, Verdict::Enforced)
            .shortcoming()
            .unwrap();
        assert_eq!(
            one,
            "the store at s3://b/p ignores If-None-Match on PUT (create-only writes): two strata processes could both own a volume"
        );
        let both = report(Verdict::Ignored, Verdict::Unsupported)
            .shortcoming()
            .unwrap();
        assert!(
            both.contains("ignores If-None-Match") && both.contains("does not support If-Match"),
            "{both}"
        );
        assert!(!both.contains('\n'), "{both}");
        assert_eq!(
            report(Verdict::Enforced, Verdict::Ignored).missing(),
            [Condition::IfMatch]
        );
    }
}
