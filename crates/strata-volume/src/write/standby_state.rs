//! Whether another host stands by to take a volume, and which: the state
//! `volume/standby_mode.rs` acts on (FLUSH uploads while it is set).

use std::sync::atomic::{AtomicBool, Ordering};

/// Who stands by for a volume, if anyone.
#[derive(Debug, Default)]
pub(crate) struct StandbyState {
    on: AtomicBool,
    by: parking_lot::Mutex<Option<String>>,
}

impl StandbyState {
    /// Whether a standby exists (one relaxed-enough load per FLUSH).
    pub(crate) fn is_on(&self) -> bool {
        self.on.load(Ordering::Acquire)
    }

    pub(crate) fn by(&self) -> Option<String> {
        self.by.lock().clone()
    }

    /// Records `by` as the standby. `Err(other)`: another host stands by.
    /// `Ok(true)`: standby mode starts now.
    pub(crate) fn register(&self, by: &str) -> Result<bool, String> {
        let mut current = self.by.lock();
        if let Some(other) = current.as_deref().filter(|o| *o != by) {
            return Err(other.to_string());
        }
        *current = Some(by.to_string());
        Ok(!self.on.swap(true, Ordering::AcqRel))
    }

    /// Forgets `by` if it is the standby; whether it was.
    pub(crate) fn unregister(&self, by: &str) -> bool {
        let mut current = self.by.lock();
        if current.as_deref() != Some(by) {
            return false;
        }
        *current = None;
        self.on.store(false, Ordering::Release);
        true
    }
}
