//! The host record's layout: one object per host (`.hosts/<id>`) that
//! proves the host alive, so its volumes' leases need no renewal of their
//! own (`ownership/host_liveness.rs` writes it; design note
//! `docs/design/ownership.md`).
//!
//! The envelope of `envelope.rs` (magic "STRATHST", version 1, body at most
//! 64 KiB) around a JSON body:
//!
//! ```text
//! id                32 hex digits: the data directory's id (instance-id),
//!                   or that id, '.', and 12 more for a second process on
//!                   one data directory (an admin command beside a server)
//! holder            "<hostname>:<data dir> (<id, 12 digits>)", as leases name it
//! hostname          the host's name (a control socket is only reachable there)
//! pid               the server process
//! incarnation       random per start, and per restart of liveness after
//!                   another host declared this one expired: a lease names
//!                   the incarnation it was taken under
//! renewed_unix_ms   wall clock at the last renewal
//! ttl_ms            live until renewed_unix_ms + ttl_ms
//! state             "alive" | "stopped" (clean shutdown) | "expired"
//!                   (declared by a host taking a volume over, `expired_by`)
//! control_socket    absolute path of the server's control socket, if any
//! handover_requests requests of other hosts about a volume this one holds
//!                   (at most MAX_HANDOVER_REQUESTS), answered at the next
//!                   renewal: {volume, by, at_unix_ms, kind}, kind
//!                   "handover" (let go of it; the default when absent),
//!                   "standby" (a host stands by to take it: upload on
//!                   FLUSH), "standby_gone", "snapshot" (take snapshot
//!                   `snapshot` of it: a string, checked by the holder as
//!                   any snapshot name) or "resize" (grow it to
//!                   `size_bytes`: a number, checked as any size); a kind
//!                   a holder does not know is skipped (logged), so newer
//!                   askers do not break older holders' records from
//!                   this version on; a handover may name `to`,
//!                   the successor to write the lease over to:
//!                   {holder, pid, host_id, incarnation, token,
//!                   until_unix_ms (optional: no transfer begins after
//!                   it)}, each string 1 to MAX_SUCCESSOR_FIELD_BYTES
//!                   bytes (checked before use, `Successor::validate`)
//! ```

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use super::envelope;

const MAGIC: &[u8; 8] = b"STRATHST";
const MAX_BODY_BYTES: usize = 64 << 10;
/// Handover requests a host record carries at most (more are refused).
pub const MAX_HANDOVER_REQUESTS: usize = 64;

/// Where a host stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HostState {
    /// Renewed on a timer while its server runs.
    Alive,
    /// Its server stopped cleanly (every lease it held was released).
    Stopped,
    /// Another host found it not renewed within its TTL and said so with a
    /// conditional write, before taking a volume of it over: the host's
    /// next renewal fails, and it must re-claim each lease before writing.
    Expired,
}

/// What another host asks of a volume this one holds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RequestKind {
    /// Let go of it (`Engine::hand_over`).
    #[default]
    Handover,
    /// The asker stands by to take it (live migration): FLUSH uploads.
    Standby,
    /// The asker no longer stands by.
    StandbyGone,
    /// Take a snapshot of it (`HandoverRequest::snapshot` names it): a
    /// controller on another host snapshots a volume in use here.
    Snapshot,
    /// Grow it (`HandoverRequest::size_bytes`).
    Resize,
    /// A kind of a newer version: skipped.
    #[serde(other)]
    Unknown,
}

impl RequestKind {
    fn is_handover(&self) -> bool {
        *self == RequestKind::Handover
    }
}

/// Longest string field of a successor a holder accepts (they are ids,
/// paths and hex tokens).
pub const MAX_SUCCESSOR_FIELD_BYTES: usize = 1024;

/// Who a closing holder hands its lease to: a standby's host
/// (`ownership/lease_transfer.rs`). Sent over a control socket, or in a
/// handover request of the holder's record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Successor {
    /// The successor's holder id (`holder_id`).
    pub holder: String,
    pub pid: u32,
    /// Its host record's id and current incarnation.
    pub host_id: String,
    pub incarnation: String,
    /// Random, chosen by the successor: tells the lease it was given.
    pub token: String,
    /// Wall clock the successor waits until: a holder does not begin the
    /// transfer later (the successor's write failed at its bound, and the
    /// volume stays with the holder). Absent: no limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub until_unix_ms: Option<u64>,
}

impl Successor {
    /// Rejects a successor whose fields cannot name a host (a holder checks
    /// what a request gives it before writing it into a lease).
    pub fn validate(&self) -> Result<(), String> {
        let fields = [
            ("holder", &self.holder),
            ("host_id", &self.host_id),
            ("incarnation", &self.incarnation),
            ("token", &self.token),
        ];
        for (name, value) in fields {
            if value.is_empty() || value.len() > MAX_SUCCESSOR_FIELD_BYTES {
                return Err(format!(
                    "successor's {name} must be 1 to {MAX_SUCCESSOR_FIELD_BYTES} bytes"
                ));
            }
        }
        Ok(())
    }
}

/// A request of another host about a volume this one holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HandoverRequest {
    pub volume: String,
    /// The asking host's holder string (for the log, and who stands by).
    pub by: String,
    pub at_unix_ms: u64,
    #[serde(default, skip_serializing_if = "RequestKind::is_handover")]
    pub kind: RequestKind,
    /// A handover's successor: write the lease over to it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub to: Option<Successor>,
    /// A snapshot request's snapshot name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot: Option<String>,
    /// A resize request's new size.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size_bytes: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostRecord {
    pub id: String,
    pub holder: String,
    pub hostname: String,
    pub pid: u32,
    pub incarnation: String,
    pub renewed_unix_ms: u64,
    pub ttl_ms: u64,
    pub state: HostState,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expired_by: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub control_socket: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub handover_requests: Vec<HandoverRequest>,
}

impl HostRecord {
    /// Whether the host counts as alive at `now_unix_ms`: renewed within
    /// its TTL and neither stopped nor declared expired.
    pub fn is_live(&self, now_unix_ms: u64) -> bool {
        self.state == HostState::Alive && self.age_ms(now_unix_ms) < self.ttl_ms
    }

    pub fn age_ms(&self, now_unix_ms: u64) -> u64 {
        now_unix_ms.saturating_sub(self.renewed_unix_ms)
    }

    pub fn encode(&self) -> Bytes {
        let body = serde_json::to_vec(self).unwrap_or_default();
        Bytes::from(envelope::encode(MAGIC, &body))
    }

    pub fn decode(b: &[u8]) -> Result<HostRecord, String> {
        let body = envelope::decode(MAGIC, "host record", MAX_BODY_BYTES, b)?;
        let r: HostRecord =
            serde_json::from_slice(body).map_err(|e| format!("host record body: {e}"))?;
        if r.handover_requests.len() > MAX_HANDOVER_REQUESTS {
            return Err(format!(
                "host record holds {} handover requests (at most {MAX_HANDOVER_REQUESTS})",
                r.handover_requests.len()
            ));
        }
        if r.ttl_ms == 0 {
            return Err("host record has a TTL of 0".into());
        }
        Ok(r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn record() -> HostRecord {
        HostRecord {
            id: "0123456789abcdef0123456789abcdef".into(),
            holder: "h:/d (0123456789ab)".into(),
            hostname: "h".into(),
            pid: 7,
            incarnation: "i1".into(),
            renewed_unix_ms: 1_000,
            ttl_ms: 30_000,
            state: HostState::Alive,
            expired_by: None,
            control_socket: Some("/d/control.sock".into()),
            handover_requests: vec![
                HandoverRequest {
                    volume: "v".into(),
                    by: "other".into(),
                    at_unix_ms: 5,
                    kind: RequestKind::Standby,
                    to: None,
                    snapshot: None,
                    size_bytes: None,
                },
                HandoverRequest {
                    volume: "v".into(),
                    by: "controller".into(),
                    at_unix_ms: 7,
                    kind: RequestKind::Snapshot,
                    to: None,
                    snapshot: Some("daily".into()),
                    size_bytes: None,
                },
                HandoverRequest {
                    volume: "v".into(),
                    by: "controller".into(),
                    at_unix_ms: 8,
                    kind: RequestKind::Resize,
                    to: None,
                    snapshot: None,
                    size_bytes: Some(1 << 30),
                },
                HandoverRequest {
                    volume: "v".into(),
                    by: "other".into(),
                    at_unix_ms: 6,
                    kind: RequestKind::Handover,
                    to: Some(Successor {
                        holder: "h:/d".into(),
                        pid: 7,
                        host_id: "0".repeat(32),
                        incarnation: "inc".into(),
                        token: "tok".into(),
                        until_unix_ms: Some(9),
                    }),
                    snapshot: None,
                    size_bytes: None,
                },
            ],
        }
    }

    #[test]
    fn round_trip_liveness_and_corruption() {
        let r = record();
        let b = r.encode();
        assert_eq!(HostRecord::decode(&b).unwrap(), r);
        assert!(r.is_live(2_000));
        assert!(!r.is_live(31_000), "expired by time");
        let stopped = HostRecord {
            state: HostState::Stopped,
            ..r.clone()
        };
        assert!(!stopped.is_live(2_000));
        let mut c = b.to_vec();
        c[30] ^= 1;
        assert!(HostRecord::decode(&c).is_err());
        let many = HostRecord {
            handover_requests: vec![r.handover_requests[0].clone(); MAX_HANDOVER_REQUESTS + 1],
            ..r
        };
        let err = HostRecord::decode(&many.encode()).unwrap_err();
        assert!(err.contains("handover requests"), "{err}");
    }

    #[test]
    fn a_kind_this_version_does_not_know_is_read_as_unknown() {
        let body =
            br#"{"id":"0123456789abcdef0123456789abcdef","holder":"h","hostname":"h","pid":1,
            "incarnation":"i","renewed_unix_ms":1,"ttl_ms":30000,"state":"alive",
            "handover_requests":[{"volume":"v","by":"b","at_unix_ms":2,"kind":"defragment"}]}"#;
        let r = HostRecord::decode(&envelope::encode(MAGIC, body)).unwrap();
        assert_eq!(r.handover_requests[0].kind, RequestKind::Unknown);
    }
}
