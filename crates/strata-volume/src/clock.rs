//! Wall-clock time, in one place.
//!
//! A leaf. Only what other hosts must agree on uses the wall clock (lease
//! renewal times, creation stamps); every local deadline uses `Instant`.

/// Milliseconds since the Unix epoch (0 if the clock is before it).
pub(crate) fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}
