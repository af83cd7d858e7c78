//! The lease object's layout: who holds a volume, until when.
//!
//! The envelope of `envelope.rs` (magic "STRATLSE", body at most 64 KiB)
//! around a JSON body. The protocol that writes it is `ownership/lease.rs`.

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use super::envelope;

const MAGIC: &[u8; 8] = b"STRATLSE";
const MAX_BODY_BYTES: usize = 64 << 10;

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
    /// "holder (pid N, epoch E)" while the lease is live at `now_unix_ms`,
    /// for `volume info`.
    pub fn live_holder(&self, now_unix_ms: u64) -> Option<String> {
        let age_ms = now_unix_ms.saturating_sub(self.renewed_unix_ms);
        (!self.released && age_ms < self.ttl_ms)
            .then(|| format!("{} (pid {}, epoch {})", self.holder, self.pid, self.epoch))
    }

    pub fn encode(&self) -> Bytes {
        let body = serde_json::to_vec(self).unwrap_or_default();
        Bytes::from(envelope::encode(MAGIC, &body))
    }

    pub fn decode(b: &[u8]) -> Result<Lease, String> {
        let body = envelope::decode(MAGIC, "lease", MAX_BODY_BYTES, b)?;
        serde_json::from_slice(body).map_err(|e| format!("lease body: {e}"))
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
        };
        let b = l.encode();
        assert_eq!(Lease::decode(&b).unwrap(), l);
        let mut c = b.to_vec();
        c[25] ^= 1;
        assert!(Lease::decode(&c).is_err());
        assert!(l.live_holder(2000).unwrap().contains("pid 7"));
        assert_eq!(l.live_holder(40_000), None, "expired");
    }
}
