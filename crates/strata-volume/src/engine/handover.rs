//! Handover on request: a host lets go of a volume another host asks for
//! (every write uploaded, a checkpoint, the lease released), and how a host
//! asks the holder of a volume to let go.
//!
//! The request reaches the holder one of two ways (design note
//! `docs/design/ownership.md`, "Handover"):
//! - its server's control socket, when the holder's host record advertises
//!   one on this machine: answered at once (the socket is the user's own,
//!   mode 0600);
//! - its host record in the store (`request_handover_through_store`): the
//!   holder finds the request when its next renewal fails its If-Match,
//!   within TTL/3 (10 s by default). Anyone with the store's credentials can
//!   ask, as anyone with them can already delete the volume.
//!
//! Either way the asker then waits for the lease to be released.

use std::sync::Arc;
use std::time::{Duration, Instant};

use strata_store::{validate_volume_name, ObjectNames};

use super::control_client::{control_call, local_control_socket};
pub use super::handover_outcome::{HandoverOutcome, HandoverReport};
use super::Engine;
use crate::error::VolumeError;
use crate::format::host_record::RequestKind;
use crate::ownership::{read_lease, request_handover_through_store, standing, Standing, Successor};

/// After handing a volume over, this engine does not take it back for
/// this long (its own clients would otherwise re-open it before the asker
/// does); after it, whoever asks first.
const HANDOVER_HOLD_OFF: Duration = Duration::from_secs(30);
/// How often the asker looks at the lease while waiting for the release.
const RELEASE_POLL: Duration = Duration::from_millis(50);

impl Engine {
    /// Lets go of volume `name` if this engine holds it: closes it (every
    /// write uploaded, the lease released) and does not take it back for
    /// `HANDOVER_HOLD_OFF`.
    pub async fn hand_over(&self, name: &str) -> Result<HandoverReport, VolumeError> {
        self.hand_over_to(name, None).await
    }

    /// `hand_over`, writing the lease naming `to` (a standby's host, which
    /// then opens without taking it) instead of releasing it.
    pub async fn hand_over_to(
        &self,
        name: &str,
        to: Option<&Successor>,
    ) -> Result<HandoverReport, VolumeError> {
        validate_volume_name(name).map_err(VolumeError::Invalid)?;
        if let Some(to) = to {
            to.validate().map_err(VolumeError::Invalid)?;
        }
        let started = Instant::now();
        let Some(vol) = self.served_or_opening(name).await else {
            return Ok(HandoverReport {
                volume: name.to_string(),
                was_open: false,
                bytes_uploaded: 0,
                elapsed_ms: 0,
                transferred: false,
            });
        };
        if let Some(&Successor {
            until_unix_ms: Some(until),
            holder: ref by,
            ..
        }) = to
        {
            let now = crate::clock::now_ms();
            if now >= until {
                tracing::info!(volume = %name, by, late_ms = now - until, "a handover asked for after its asker stopped waiting; the volume stays here");
                return Err(VolumeError::Busy(format!(
                    "volume {name:?}: the standby {by} stopped waiting for it {} ms ago; the volume stays with this server",
                    now - until
                )));
            }
        }
        self.handed_over
            .lock()
            .insert(name.to_string(), Instant::now());
        let uploaded = || {
            vol.bytes_uploaded
                .load(std::sync::atomic::Ordering::Relaxed)
        };
        let before = uploaded();
        let closed = vol.close_handing_to(to).await;
        let bytes_uploaded = uploaded().saturating_sub(before);
        if to.is_some() {
            self.finish_close_later(name, vol.clone());
        }
        self.open.lock().remove(name);
        let transferred = closed?;
        let last_flush_unix_ms = vol
            .last_flush_unix_ms
            .load(std::sync::atomic::Ordering::Relaxed);
        let released_unix_ms = crate::clock::now_ms();
        let to = to.map(|s| s.holder.as_str());
        tracing::info!(volume = %name, bytes_uploaded, elapsed_ms = started.elapsed().as_millis() as u64, last_flush_unix_ms, released_unix_ms, transferred, to, "volume handed over on request");
        Ok(HandoverReport {
            volume: name.to_string(),
            was_open: true,
            bytes_uploaded,
            elapsed_ms: started.elapsed().as_millis() as u64,
            transferred,
        })
    }

    /// Runs what a close that handed volume `name` over left to do here
    /// (`Volume::finish_close`) after the answer; an open of `name` on
    /// this engine waits for it (`wait_for_finishing_close`).
    fn finish_close_later(&self, name: &str, vol: Arc<crate::volume::Volume>) {
        let (done, finished) = tokio::sync::watch::channel(false);
        self.finishing.lock().insert(name.to_string(), finished);
        tokio::spawn(async move {
            vol.finish_close().await;
            let _ = done.send(true);
        });
    }

    /// Waits until the close of volume `name` handed over from this engine
    /// finished here (its journal file is the one an open here reuses).
    pub(super) async fn wait_for_finishing_close(&self, name: &str) {
        let finishing = self.finishing.lock().get(name).cloned();
        if let Some(mut finished) = finishing {
            // An error: the task ended (it cannot end without sending).
            let _ = finished.wait_for(|done| *done).await;
            let mut map = self.finishing.lock();
            if map.get(name).is_some_and(|f| *f.borrow()) {
                map.remove(name);
            }
        }
    }

    /// Refuses to open a volume this engine handed over a moment ago.
    pub(super) fn refuse_if_handed_over(&self, name: &str) -> Result<(), VolumeError> {
        let mut handed = self.handed_over.lock();
        if let Some(at) = handed.get(name) {
            let ago = at.elapsed();
            if ago < HANDOVER_HOLD_OFF {
                return Err(VolumeError::Busy(format!(
                    "volume {name:?} was handed over to another host {} ms ago at its request; this server takes it back only {} s after that",
                    ago.as_millis(),
                    HANDOVER_HOLD_OFF.as_secs()
                )));
            }
            handed.remove(name);
        }
        Ok(())
    }

    /// Answers handover requests that arrive through this host's record in
    /// the store, until the engine's host stops. Sleeps on them otherwise.
    pub async fn answer_store_requests(self: Arc<Self>) {
        let host = loop {
            match self.host().await {
                Ok(host) => break host,
                Err(e) => {
                    // The volumes' opens report it (one line, where the
                    // user looks); this retries until the store answers.
                    tracing::debug!(error = %e, "cannot start this host's liveness record; retrying");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
        };
        loop {
            let notified = host.requests_changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            for r in host.take_pending_requests() {
                let done = match r.kind {
                    RequestKind::Handover => self
                        .hand_over_to(&r.volume, r.to.as_ref())
                        .await
                        .map(|_| ()),
                    RequestKind::Standby => self.standby_request(&r.volume, &r.by, true).await,
                    RequestKind::StandbyGone => self.standby_request(&r.volume, &r.by, false).await,
                    RequestKind::Snapshot | RequestKind::Resize => self.answer_holder_op(&r).await,
                    RequestKind::Unknown => Err(VolumeError::Invalid(
                        "a request of a kind this release does not know (from a newer strata): skipped".into(),
                    )),
                };
                if let Err(e) = done {
                    tracing::warn!(volume = %r.volume, by = %r.by, kind = ?r.kind, error = %e, "request through the store failed");
                }
            }
            notified.await;
        }
    }

    /// Asks the holder of volume `name` to let go, and waits (at most
    /// `timeout`) until its lease is released. Nothing to do when nobody
    /// holds it; an error when its holder's host is gone (the next server
    /// to open it takes it over) or runs a release without host liveness.
    pub async fn request_handover(
        &self,
        name: &str,
        timeout: Duration,
    ) -> Result<HandoverOutcome, VolumeError> {
        validate_volume_name(name).map_err(VolumeError::Invalid)?;
        let started = Instant::now();
        let names = ObjectNames::new(name);
        let nobody = || HandoverOutcome {
            volume: name.to_string(),
            holder: None,
            via: "none",
            report: None,
            elapsed_ms: 0,
        };
        let Some((lease, _)) = read_lease(&self.store, &names).await? else {
            return Ok(nobody());
        };
        let record = match standing(&self.store, &lease).await? {
            Standing::Free => return Ok(nobody()),
            Standing::HostExpired(r, _) => {
                return Err(VolumeError::Busy(format!(
                    "volume {name:?} is held by {}, whose host stopped renewing its liveness {} s ago: it cannot answer; the next server to open the volume takes it over",
                    lease.describe(),
                    r.age_ms(crate::clock::now_ms()) / 1000
                )))
            }
            Standing::Live { host: None, detail } => {
                return Err(VolumeError::Busy(format!(
                    "volume {name:?} is held by {detail}, which cannot hand over on request: stop that server (SIGTERM) to release it"
                )))
            }
            Standing::Live {
                host: Some(r),
                detail: _,
            } => r,
        };
        let holder = Some(lease.describe());
        let socket = local_control_socket(&record);
        let (via, report) = match socket.as_deref() {
            Some(path) => match ask_over_socket(path, name).await {
                Ok(report) => ("control socket", Some(report)),
                Err(e) => {
                    tracing::info!(socket = %path, error = %e, "the holder's control socket did not answer; asking through the store");
                    self.ask_through_store(name, &record.id).await?;
                    ("store", None)
                }
            },
            None => {
                self.ask_through_store(name, &record.id).await?;
                ("store", None)
            }
        };
        self.wait_released(name, &lease.token, started + timeout)
            .await?;
        Ok(HandoverOutcome {
            volume: name.to_string(),
            holder,
            via,
            report,
            elapsed_ms: started.elapsed().as_millis() as u64,
        })
    }

    async fn ask_through_store(&self, name: &str, host_id: &str) -> Result<(), VolumeError> {
        let by = crate::ownership::holder_id(&self.config.data_dir)
            .unwrap_or_else(|_| "a strata command".into());
        if !request_handover_through_store(&self.store, host_id, name, &by).await? {
            // It stopped meanwhile: the lease is released or free to take.
            tracing::info!(volume = %name, "the holder's host is no longer alive");
        }
        Ok(())
    }

    /// Waits until the lease `token` names is no longer held.
    async fn wait_released(
        &self,
        name: &str,
        token: &str,
        deadline: Instant,
    ) -> Result<(), VolumeError> {
        let names = ObjectNames::new(name);
        loop {
            match read_lease(&self.store, &names).await? {
                None => return Ok(()),
                Some((l, _)) if l.token != token || l.released => return Ok(()),
                Some((l, _)) => {
                    if !matches!(standing(&self.store, &l).await?, Standing::Live { .. }) {
                        return Ok(());
                    }
                }
            }
            if Instant::now() >= deadline {
                return Err(VolumeError::Busy(format!(
                    "volume {name:?}: its holder did not release it in time (it may be uploading a large journal; try again, or give a longer --timeout)"
                )));
            }
            tokio::time::sleep(RELEASE_POLL).await;
        }
    }
}

/// One handover request over a holder's control socket (the JSON-lines
/// protocol of `strata serve`'s `control.rs`: `{"op":"handover",...}`).
async fn ask_over_socket(path: &str, volume: &str) -> Result<HandoverReport, String> {
    let request = serde_json::json!({"op": "handover", "volume": volume});
    let ok = control_call(path, &request).await?;
    serde_json::from_value(ok).map_err(|e| format!("reply from {path}: {e}"))
}
