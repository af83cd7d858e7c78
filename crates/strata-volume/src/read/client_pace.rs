//! How far a volume's clients have read since it was opened, so that the
//! access profile's prefetch (`volume/hydrate.rs`) stays ahead of them
//! without running away from them.
//!
//! Why: a later clone's boot reads the profile's ranges in about the order
//! the prefetch fetches them, each read a cache hit once the prefetch is
//! ahead. Fetched flat out (1 GiB in ~4 s at 20 ms a request on a 2-core
//! host), the prefetch's GETs, decoding and disk writes, with the store
//! beside them, left the host's CPUs busy while the reader's requests, one
//! after the other, each waited a little longer for one: measured with
//! every read a hit (`coldboot-big`, later clone), the read took 1.15-1.25x
//! the same read once the volume was local. Paced to stay `ahead` of what
//! the clients have read, the same bytes come in over the whole read.
//!
//! Cheap on the read path: two relaxed atomics per client read.

use std::sync::atomic::{AtomicU64, Ordering};

use super::reader_activity::now_ms;

/// A volume's clients' reads, as the profile's prefetch paces itself.
#[derive(Debug, Default)]
pub(crate) struct ClientPace {
    read_bytes: AtomicU64,
    /// When a client last read, in `now_ms()` (0: never).
    last_read_ms: AtomicU64,
}

impl ClientPace {
    /// Notes a client read of `len` bytes.
    pub fn note(&self, len: u64) {
        self.read_bytes.fetch_add(len, Ordering::Relaxed);
        self.last_read_ms.store(now_ms(), Ordering::Relaxed);
    }

    /// Whether a prefetch that has sent `sent_bytes` waits: a client read
    /// within `active_ms` and the prefetch is `ahead_bytes` or more past
    /// what the clients have read. With no client reading it never waits
    /// (before the boot, or while the guest computes, the prefetch takes
    /// what nobody uses).
    pub fn holds(&self, sent_bytes: u64, ahead_bytes: u64, active_ms: u64) -> bool {
        let last = self.last_read_ms.load(Ordering::Relaxed);
        let active = last != 0 && now_ms().saturating_sub(last) <= active_ms;
        active && sent_bytes >= self.read_bytes.load(Ordering::Relaxed) + ahead_bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holds_only_ahead_of_an_active_client() {
        let p = ClientPace::default();
        assert!(!p.holds(u64::MAX / 2, 10, 1_000), "no client yet");
        p.note(100);
        assert!(!p.holds(109, 10, 1_000), "less than ahead past the client");
        assert!(p.holds(110, 10, 1_000), "ahead past the client");
        p.note(50);
        assert!(!p.holds(110, 10, 1_000), "the client moved on");
        std::thread::sleep(std::time::Duration::from_millis(30));
        assert!(!p.holds(1_000, 10, 10), "the client stopped reading");
    }
}
