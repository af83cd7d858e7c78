//! How many of hydration's GETs for the rest of a volume (not ahead of a
//! reader) may be in flight, changed while they run: the scheduler
//! (`volume/hydrate.rs`) sets it each tick as clients come and go (one
//! beside a shallow reader at random; all while no client reads or while
//! a reader is led, when no new unit starts but those sent finish), and
//! each GET passes the gate before it is sent.
//!
//! Why per GET and not per unit: a unit is up to 32 MiB of a segment, sent
//! as several GETs at once. Measured (`tests/hydration.rs`, 20 ms store):
//! a client that started reading while eight units were in flight waited
//! behind all their GETs, decoding and disk writes for ~350 ms, and its
//! reads of that time were the whole p99 (130-360 ms against 75 without
//! hydration). A gate per GET holds what was not sent yet the moment the
//! client appears.

use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::sync::Notify;

/// The gate of one volume's hydration.
#[derive(Debug)]
pub(crate) struct RestGate {
    allowed: AtomicUsize,
    in_flight: AtomicUsize,
    wake: Notify,
}

/// A GET past the gate; leaving it lets the next one in.
#[derive(Debug)]
pub(crate) struct RestPass<'a> {
    gate: &'a RestGate,
}

impl RestGate {
    pub fn new(allowed: usize) -> RestGate {
        RestGate {
            allowed: AtomicUsize::new(allowed),
            in_flight: AtomicUsize::new(0),
            wake: Notify::new(),
        }
    }

    /// GETs that may be in flight from now on (those already sent finish).
    pub fn set_allowed(&self, allowed: usize) {
        let before = self.allowed.swap(allowed, Ordering::AcqRel);
        if allowed > before {
            self.wake.notify_waiters();
        }
    }

    /// Waits until fewer GETs than allowed are in flight, and counts one.
    pub async fn enter(&self) -> RestPass<'_> {
        loop {
            // Registered before the check: a pass left or a raise between
            // the check and the wait still wakes this one.
            let woken = self.wake.notified();
            tokio::pin!(woken);
            woken.as_mut().enable();
            let now = self.in_flight.load(Ordering::Acquire);
            if now < self.allowed.load(Ordering::Acquire)
                && self
                    .in_flight
                    .compare_exchange(now, now + 1, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok()
            {
                return RestPass { gate: self };
            }
            woken.await;
        }
    }

    #[cfg(test)]
    fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::Acquire)
    }
}

impl Drop for RestPass<'_> {
    fn drop(&mut self) {
        self.gate.in_flight.fetch_sub(1, Ordering::AcqRel);
        self.gate.wake.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn holds_gets_beyond_the_allowance_until_it_rises_or_one_leaves() {
        let gate = RestGate::new(2);
        let a = gate.enter().await;
        let _b = gate.enter().await;
        let third = tokio::time::timeout(Duration::from_millis(50), gate.enter()).await;
        assert!(third.is_err(), "a third GET passed an allowance of 2");
        drop(a);
        let c = tokio::time::timeout(Duration::from_millis(500), gate.enter()).await;
        assert!(c.is_ok(), "a GET left, the next did not pass");
        gate.set_allowed(0);
        drop(c);
        assert_eq!(gate.in_flight(), 1);
        let held = tokio::time::timeout(Duration::from_millis(50), gate.enter()).await;
        assert!(held.is_err(), "passed an allowance of 0");
        let waiting = gate.enter();
        tokio::pin!(waiting);
        assert!(
            tokio::time::timeout(Duration::from_millis(20), waiting.as_mut())
                .await
                .is_err()
        );
        gate.set_allowed(3);
        let passed = tokio::time::timeout(Duration::from_millis(500), waiting).await;
        assert!(
            passed.is_ok(),
            "a raised allowance did not wake a waiting GET"
        );
        assert_eq!(gate.in_flight(), 2);
    }
}
