//! Counters of a vhost-user-blk server, per device and per request kind,
//! read by the binary's Prometheus endpoint at scrape time (the I/O path
//! only adds to atomics).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Request kinds counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum OpKind {
    Read,
    Write,
    Flush,
    Discard,
    WriteZeroes,
    GetId,
    /// Refused before reaching the device (a malformed request or chain,
    /// an unsupported type).
    Refused,
}

impl OpKind {
    pub const ALL: [OpKind; 7] = [
        OpKind::Read,
        OpKind::Write,
        OpKind::Flush,
        OpKind::Discard,
        OpKind::WriteZeroes,
        OpKind::GetId,
        OpKind::Refused,
    ];

    pub fn name(self) -> &'static str {
        match self {
            OpKind::Read => "read",
            OpKind::Write => "write",
            OpKind::Flush => "flush",
            OpKind::Discard => "discard",
            OpKind::WriteZeroes => "write_zeroes",
            OpKind::GetId => "get_id",
            OpKind::Refused => "refused",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// One request kind's counters.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct OpCounts {
    pub requests: u64,
    pub errors: u64,
    /// Data bytes read or written (0 for the other kinds).
    pub bytes: u64,
}

#[derive(Default)]
struct Op {
    requests: AtomicU64,
    errors: AtomicU64,
    bytes: AtomicU64,
}

/// One device's counters (shared by its connections over time).
#[derive(Default)]
pub struct DeviceMetrics {
    ops: [Op; 7],
    connected: AtomicU64,
}

impl DeviceMetrics {
    pub fn record(&self, kind: OpKind, ok: bool, bytes: u64) {
        let op = &self.ops[kind.index()];
        op.requests.fetch_add(1, Ordering::Relaxed);
        if !ok {
            op.errors.fetch_add(1, Ordering::Relaxed);
        }
        op.bytes.fetch_add(bytes, Ordering::Relaxed);
    }

    pub(crate) fn connected(&self, delta: i64) {
        if delta >= 0 {
            self.connected.fetch_add(delta as u64, Ordering::Relaxed);
        } else {
            self.connected
                .fetch_sub(delta.unsigned_abs(), Ordering::Relaxed);
        }
    }
}

/// A snapshot of one device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceSnapshot {
    pub ops: Vec<(OpKind, OpCounts)>,
    /// Frontends connected now (0 or 1).
    pub connected: u64,
}

/// Every device of a server.
#[derive(Default)]
pub struct VhostMetrics {
    devices: parking_lot::Mutex<BTreeMap<String, Arc<DeviceMetrics>>>,
    accepted: AtomicU64,
}

impl VhostMetrics {
    /// The counters of device `name` (created on first use; a server's
    /// devices are its sockets: bounded by its configuration).
    pub fn device(&self, name: &str) -> Arc<DeviceMetrics> {
        self.devices
            .lock()
            .entry(name.to_string())
            .or_default()
            .clone()
    }

    pub(crate) fn accepted(&self) {
        self.accepted.fetch_add(1, Ordering::Relaxed);
    }

    /// Frontend connections accepted since start.
    pub fn connections_accepted(&self) -> u64 {
        self.accepted.load(Ordering::Relaxed)
    }

    pub fn snapshot(&self) -> BTreeMap<String, DeviceSnapshot> {
        let devices = self.devices.lock().clone();
        devices
            .into_iter()
            .map(|(name, d)| {
                let ops = OpKind::ALL
                    .iter()
                    .map(|k| {
                        let op = &d.ops[k.index()];
                        let counts = OpCounts {
                            requests: op.requests.load(Ordering::Relaxed),
                            errors: op.errors.load(Ordering::Relaxed),
                            bytes: op.bytes.load(Ordering::Relaxed),
                        };
                        (*k, counts)
                    })
                    .collect();
                let connected = d.connected.load(Ordering::Relaxed);
                (name, DeviceSnapshot { ops, connected })
            })
            .collect()
    }
}
