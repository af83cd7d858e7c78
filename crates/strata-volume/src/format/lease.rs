//! The lease object's layout: who holds a volume, and what keeps it live.
//!
//! The envelope of `envelope.rs` (magic "STRATLSE", body at most 64 KiB)
//! around a JSON body. The protocol that writes it is `ownership/lease.rs`.
//!
//! Two versions:
//! - **1**: self-contained, live until `renewed_unix_ms + ttl_ms` (what
//!   servers before per-host liveness wrote, renewing it every TTL/3), or
//!   `released`. A released lease is still written as version 1, so an
//!   older server can open a volume a newer one closed cleanly.
//! - **2**: held through a host (`host`): live while that host's record
//!   (`format/host_record.rs`) is alive *and* names the same incarnation.
//!   Written once per change of holder, never on a timer. An older server
//!   refuses version 2 ("a newer strata wrote it: upgrade") rather than take
//!   it for a lease that expired 30 s after it was written.

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use super::envelope;

const MAGIC: &[u8; 8] = b"STRATLSE";
const MAX_BODY_BYTES: usize = 64 << 10;
/// The newest lease version this strata reads and writes.
const VERSION_HOSTED: u16 = 2;

/// The host whose liveness keeps a version 2 lease.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseHost {
    /// The host record's id (`.hosts/<id>`).
    pub id: String,
    /// The host's incarnation when it took (or last re-claimed) the lease.
    pub incarnation: String,
}

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
    /// Version 2: the host whose liveness keeps this lease.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<LeaseHost>,
}

impl Lease {
    /// "holder (pid N, epoch E)", for `volume info` and refusals.
    pub fn describe(&self) -> String {
        format!("{} (pid {}, epoch {})", self.holder, self.pid, self.epoch)
    }

    /// For a self-contained (version 1) lease: `describe()` while it is
    /// live at `now_unix_ms`. A hosted lease's liveness is its host's
    /// (`ownership::lease_liveness`).
    pub fn live_holder(&self, now_unix_ms: u64) -> Option<String> {
        let age_ms = now_unix_ms.saturating_sub(self.renewed_unix_ms);
        (!self.released && self.host.is_none() && age_ms < self.ttl_ms).then(|| self.describe())
    }

    pub fn encode(&self) -> Bytes {
        let body = serde_json::to_vec(self).unwrap_or_default();
        let version = if self.host.is_some() && !self.released {
            VERSION_HOSTED
        } else {
            1
        };
        Bytes::from(envelope::encode_version(MAGIC, version, &body))
    }

    pub fn decode(b: &[u8]) -> Result<Lease, String> {
        let (version, body) =
            envelope::decode_versions(MAGIC, "lease", VERSION_HOSTED, MAX_BODY_BYTES, b)?;
        let lease: Lease = serde_json::from_slice(body).map_err(|e| format!("lease body: {e}"))?;
        if version == VERSION_HOSTED && lease.host.is_none() && !lease.released {
            return Err("lease version 2 names no host".into());
        }
        Ok(lease)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_corruption() {
        let l = Lease {
            holder: "h:/d".into(),
            pid: 7,
            token: "t".into(),
            epoch: 3,
            renewed_unix_ms: 1000,
            ttl_ms: 30_000,
            released: false,
            host: None,
        };
        let b = l.encode();
        assert_eq!(Lease::decode(&b).unwrap(), l);
        let mut c = b.to_vec();
        c[25] ^= 1;
        assert!(Lease::decode(&c).is_err());
        assert!(l.live_holder(2000).unwrap().contains("pid 7"));
        assert_eq!(l.live_holder(40_000), None, "expired");
        assert_eq!(b[8], 1, "a self-contained lease is version 1");
    }

    #[test]
    fn a_hosted_lease_is_version_2_and_released_ones_version_1() {
        let hosted = Lease {
            holder: "h:/d".into(),
            pid: 7,
            token: "t".into(),
            epoch: 3,
            renewed_unix_ms: 1000,
            ttl_ms: 30_000,
            released: false,
            host: Some(LeaseHost {
                id: "a".repeat(32),
                incarnation: "i".into(),
            }),
        };
        let b = hosted.encode();
        assert_eq!(b[8], 2);
        assert_eq!(Lease::decode(&b).unwrap(), hosted);
        // What a reader of version 1 only (the last release) says of it.
        let old = envelope::decode(MAGIC, "lease", MAX_BODY_BYTES, &b).unwrap_err();
        assert!(old.contains("upgrade"), "{old}");
        assert_eq!(hosted.live_holder(2000), None, "its host says");
        let released = Lease {
            released: true,
            ..hosted.clone()
        };
        let r = released.encode();
        assert_eq!(r[8], 1, "an older server may open a released volume");
        assert!(envelope::decode(MAGIC, "lease", MAX_BODY_BYTES, &r).is_ok());
        // Version 2 without a host is not a lease this strata wrote.
        let body = serde_json::to_vec(&Lease {
            host: None,
            ..hosted
        })
        .unwrap();
        let forged = envelope::encode_version(MAGIC, 2, &body);
        assert!(Lease::decode(&forged).is_err());
    }
}
