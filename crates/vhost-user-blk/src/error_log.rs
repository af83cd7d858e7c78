//! Log lines for requests a guest got an error status for: the guest sees
//! only IOERR or UNSUPP, the log says which device and why. At most one
//! line per second per device, with the count of lines suppressed, so a
//! guest (or a failing store) cannot flood the log.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

pub struct ErrorLog {
    device: String,
    last_unix_ms: AtomicU64,
    suppressed: AtomicU64,
}

impl ErrorLog {
    pub fn new(device: &str) -> ErrorLog {
        ErrorLog {
            device: device.to_string(),
            last_unix_ms: AtomicU64::new(0),
            suppressed: AtomicU64::new(0),
        }
    }

    /// A request refused or failed: `what` is the guest's fault or the
    /// device's, said in `reason`.
    pub fn request(&self, queue: u16, what: &str, reason: &str) {
        let now_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        let last_ms = self.last_unix_ms.load(Ordering::Relaxed);
        let due = now_ms.saturating_sub(last_ms) >= 1000
            && self
                .last_unix_ms
                .compare_exchange(last_ms, now_ms, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok();
        if due {
            let suppressed = self.suppressed.swap(0, Ordering::Relaxed);
            tracing::warn!(volume = %self.device, queue, suppressed, "vhost-user-blk {what}: {reason}");
        } else {
            self.suppressed.fetch_add(1, Ordering::Relaxed);
        }
    }

    pub fn device(&self) -> &str {
        &self.device
    }
}
