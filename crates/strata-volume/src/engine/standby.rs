//! Standby exports: a client of a volume another live host holds (the
//! destination QEMU of a live migration connects before the switchover)
//! gets a standby instead of a refusal, and the standby takes the volume
//! over when it must write.
//!
//! 1. The standby registers with the holder (its control socket on this
//!    machine, else a request in its host record, answered within TTL/3);
//!    the holder enters standby mode (`volume/standby_mode.rs`: every FLUSH
//!    uploads) before the registration is answered, and a second standby
//!    of the same volume is refused.
//! 2. Reads are served from the store (`standby/standby_view.rs`), which
//!    holds everything the holder acknowledged a FLUSH for.
//! 3. The first write, TRIM or FLUSH (`StandbyPolicy::Auto`), or an
//!    explicit take (`Engine::take_volume`, `strata volume handover` on
//!    this host; `StandbyPolicy::Explicit`), asks the holder to hand over
//!    (`engine/handover.rs`), opens the volume, and from then on every
//!    request goes to it. Writes wait at most `standby_wait_ms`. The
//!    holder is asked to write the lease over to this host
//!    (`ownership/lease_transfer.rs`): over its control socket on this
//!    machine, else through its host record, which a holder with a standby
//!    looks at every `REQUEST_POLL_MS` (`ownership/request_watch.rs`); the
//!    take is then the holder's close and a round or two of reads here.
//! 4. A standby dropped without taking the volume (the migration was
//!    cancelled: its clients disconnected) tells the holder it is gone.
//!
//! Design and safety argument: `docs/design/live-migration.md`.

use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use serde::Serialize;
use strata_store::{validate_volume_name, ObjectNames};
use tokio::sync::{Notify, OnceCell};

use super::control_client::{control_call, local_control_socket};
use super::handover_outcome::{HandoverOutcome, HandoverReport};
use super::{Engine, OpenAs};
use crate::config::StandbyPolicy;
use crate::error::VolumeError;
use crate::format::host_record::{HostRecord, RequestKind};
use crate::objects::read_manifest;
use crate::ownership::{
    read_host_record, read_lease, release_transferred, send_request_through_store, standing,
    successor_of, Standing, Successor,
};
use crate::standby::StandbyView;
use crate::volume::Volume;

/// How often a registration sent through the store is looked for in the
/// holder's record (it is answered at the holder's next renewal).
const REGISTRATION_POLL: Duration = Duration::from_millis(100);
/// How often a standby that asked through the store looks at the lease
/// for its own token.
const HANDED_POLL: Duration = Duration::from_millis(25);
/// How long a standby looks for the end of a transfer past its deadline:
/// a holder begins none after the deadline (`Successor::until_unix_ms`),
/// and one it began finishes within this (its close uploads at most what
/// standby mode leaves: about a second of writes). The waiting write has
/// failed by then; the volume opened here serves the writes after it.
const TRANSFER_GRACE: Duration = Duration::from_secs(10);
/// Pause between tries while a handover is refused (holder busy, or its
/// host expired and the volume is about to be free).
const TAKE_RETRY: Duration = Duration::from_millis(250);

/// What a client of a volume's export is served.
pub enum Export {
    /// The volume: this engine holds it.
    Volume(Arc<Volume>),
    /// A standby: another live host holds it.
    Standby(Arc<Standby>),
}

/// A volume served here while another host holds it (see the module doc).
pub struct Standby {
    engine: Arc<Engine>,
    name: String,
    view: StandbyView,
    /// Who held the volume when the standby registered (for messages).
    holder: String,
    /// The holder's host record then: where to say the standby is gone.
    holder_host: HostRecord,
    /// This host, as the holder knows the standby.
    by: String,
    taken: OnceCell<Arc<Volume>>,
    /// Woken when `taken` is set (explicit mode's waiting writes).
    taken_now: Notify,
    /// Whether the first write served after the take was logged.
    first_write_logged: std::sync::atomic::AtomicBool,
    /// The handover the take asked for (an explicit take reports it).
    asked: parking_lot::Mutex<Option<HandoverOutcome>>,
}

/// What an explicit take did (`strata volume handover` on the taking
/// host): the handover's own fields (`HandoverOutcome`: who held it, how
/// it was asked, the holder's report), and how the volume was taken.
#[derive(Debug, Clone, Serialize)]
pub struct TakeOutcome {
    pub volume: String,
    /// Who held the volume (`None`: nobody had to be asked).
    pub holder: Option<String>,
    /// "control socket", "store", or "none".
    pub via: &'static str,
    /// The holder's own report, over the control socket.
    pub report: Option<HandoverReport>,
    /// Whether a standby of this engine took it (else the engine opened it).
    pub standby: bool,
    /// Whether this engine held it already.
    pub already_held: bool,
    /// From the request to the volume open here.
    pub elapsed_ms: u64,
}

impl Engine {
    /// What a client of volume `name` is served: the volume, or a standby
    /// when another live host holds it (unless `StandbyPolicy::Off`).
    pub async fn open_export(self: &Arc<Self>, name: &str) -> Result<Export, VolumeError> {
        let busy = match self.open_volume(name).await {
            Ok(v) => return Ok(Export::Volume(v)),
            Err(VolumeError::Busy(detail)) => detail,
            Err(e) => return Err(e),
        };
        if self.config.standby == StandbyPolicy::Off {
            return Err(VolumeError::Busy(busy));
        }
        let _one = self.standby_open.lock().await;
        if let Some(s) = self.standby_of(name) {
            return Ok(Export::Standby(s));
        }
        let names = ObjectNames::new(name);
        let Some((lease, _)) = read_lease(&self.store, &names).await? else {
            return Err(VolumeError::Busy(busy));
        };
        let record = match standing(&self.store, &lease).await? {
            Standing::Live { host: Some(r), .. } => r,
            _ => return Err(VolumeError::Busy(busy)),
        };
        let standby = Arc::new(self.new_standby(name, lease.describe(), record).await?);
        self.standbys
            .lock()
            .insert(name.to_string(), Arc::downgrade(&standby));
        Ok(Export::Standby(standby))
    }

    fn standby_of(&self, name: &str) -> Option<Arc<Standby>> {
        let mut standbys = self.standbys.lock();
        standbys.retain(|_, s| s.strong_count() > 0);
        standbys.get(name).and_then(Weak::upgrade)
    }

    /// Registers with the holder, then opens the view (after: the view
    /// then holds at least what the holder uploaded on registering).
    async fn new_standby(
        self: &Arc<Self>,
        name: &str,
        holder: String,
        holder_host: HostRecord,
    ) -> Result<Standby, VolumeError> {
        let by = crate::ownership::holder_id(&self.config.data_dir)?;
        let started = Instant::now();
        let via = self
            .tell_holder(&holder_host, name, &by, RequestKind::Standby)
            .await
            .map_err(|e| match e {
                VolumeError::Busy(d) => VolumeError::Busy(format!(
                    "volume {name:?} is held by {holder}; it cannot stand by here: {d}"
                )),
                e => e,
            })?;
        let m = read_manifest(&self.store, name).await?;
        let key = self.data_key(&m)?.map(Arc::new);
        let view = StandbyView::open(self.store.clone(), &m, self.caches.clone(), key);
        tracing::info!(volume = %name, holder = %holder, via, elapsed_ms = started.elapsed().as_millis() as u64, "serving the volume as a standby: reads from the store, the first write takes it over");
        Ok(Standby {
            engine: self.clone(),
            name: name.to_string(),
            view,
            holder,
            holder_host,
            by,
            taken: OnceCell::new(),
            taken_now: Notify::new(),
            first_write_logged: std::sync::atomic::AtomicBool::new(false),
            asked: parking_lot::Mutex::new(None),
        })
    }

    /// Sends a standby request to the holder whose host is `record` and
    /// waits for its answer: over its control socket when it is on this
    /// machine, else through its host record (answered at its next
    /// renewal). Returns how it went.
    async fn tell_holder(
        &self,
        record: &HostRecord,
        volume: &str,
        by: &str,
        kind: RequestKind,
    ) -> Result<&'static str, VolumeError> {
        if let Some(path) = local_control_socket(record) {
            let on = kind == RequestKind::Standby;
            let request =
                serde_json::json!({"op": "standby", "volume": volume, "by": by, "on": on});
            match control_call(&path, &request).await {
                Ok(_) => return Ok("control socket"),
                Err(e) if e.starts_with("the holder refused") => {
                    return Err(VolumeError::Busy(e));
                }
                Err(e) => {
                    tracing::info!(socket = %path, error = %e, "the holder's control socket did not answer; asking through the store");
                }
            }
        }
        let sent =
            send_request_through_store(&self.store, &record.id, volume, by, kind, None).await?;
        let Some(at_unix_ms) = sent else {
            return Err(VolumeError::Busy(format!(
                "its holder's host {} is no longer alive; try again",
                record.holder
            )));
        };
        let deadline = Instant::now() + Duration::from_millis(record.ttl_ms);
        loop {
            let answered = match read_host_record(&self.store, &record.id).await? {
                None => true,
                Some((r, _)) => !r.handover_requests.iter().any(|q| {
                    q.volume == volume && q.kind == kind && q.by == by && q.at_unix_ms == at_unix_ms
                }),
            };
            if answered {
                return Ok("store");
            }
            if Instant::now() >= deadline {
                return Err(VolumeError::Busy(format!(
                    "its holder {} did not answer through the store within {} ms",
                    record.holder, record.ttl_ms
                )));
            }
            tokio::time::sleep(REGISTRATION_POLL).await;
        }
    }

    /// A standby of `volume` registered (`on`) or left (on the holder:
    /// the control socket's and the store's requests end here).
    pub async fn standby_request(
        &self,
        volume: &str,
        by: &str,
        on: bool,
    ) -> Result<(), VolumeError> {
        validate_volume_name(volume).map_err(VolumeError::Invalid)?;
        let Some(vol) = self.served(volume) else {
            return Err(VolumeError::NotFound(format!(
                "this server does not hold volume {volume:?}"
            )));
        };
        if on {
            vol.standby_registered(by).await
        } else {
            vol.standby_gone(by);
            Ok(())
        }
    }

    /// Takes volume `name` for this engine (an explicit switchover): its
    /// standby here takes it, or the engine asks the holder to hand over
    /// and opens it. Waits at most `timeout`.
    pub async fn take_volume(
        self: &Arc<Self>,
        name: &str,
        timeout: Duration,
    ) -> Result<TakeOutcome, VolumeError> {
        validate_volume_name(name).map_err(VolumeError::Invalid)?;
        let started = Instant::now();
        let outcome = |asked: Option<HandoverOutcome>, standby, already_held| TakeOutcome {
            volume: name.to_string(),
            holder: asked.as_ref().and_then(|a| a.holder.clone()),
            via: asked.as_ref().map_or("none", |a| a.via),
            report: asked.and_then(|a| a.report),
            standby,
            already_held,
            elapsed_ms: started.elapsed().as_millis() as u64,
        };
        if self.served(name).is_some() {
            return Ok(outcome(None, false, true));
        }
        if let Some(s) = self.standby_of(name) {
            s.take(timeout).await?;
            let asked = s.asked.lock().clone();
            return Ok(outcome(asked, true, false));
        }
        let (_, asked) = take(self, name, Instant::now() + timeout, "").await?;
        Ok(outcome(asked, false, false))
    }
}

/// Opens volume `name`, asking its holder to hand it over while it is
/// held elsewhere, until `deadline`; with the last handover asked.
async fn take(
    engine: &Engine,
    name: &str,
    deadline: Instant,
    holder: &str,
) -> Result<(Arc<Volume>, Option<HandoverOutcome>), VolumeError> {
    let started = Instant::now();
    let mut asked = None;
    loop {
        let why = match engine.open_volume_to_take(name).await {
            Ok(v) => return Ok((v, asked)),
            Err(VolumeError::Busy(detail)) => detail,
            Err(e) => return Err(e),
        };
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(VolumeError::Busy(format!(
                "volume {name:?}: not handed over within {} ms{holder}: {why}",
                started.elapsed().as_millis()
            )));
        }
        match engine.request_handover(name, left).await {
            Ok(outcome) => asked = Some(outcome),
            Err(VolumeError::Busy(d)) => {
                tracing::info!(volume = %name, reason = %d, "handover not done yet; trying again");
                tokio::time::sleep(TAKE_RETRY.min(left)).await;
            }
            Err(e) => return Err(e),
        }
    }
}

impl Standby {
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The volume once taken.
    pub fn taken(&self) -> Option<&Arc<Volume>> {
        self.taken.get()
    }

    pub fn size_bytes(&self) -> u64 {
        match self.taken.get() {
            Some(v) => v.size_bytes(),
            None => self.view.size_bytes(),
        }
    }

    /// Reads from the volume once taken, from the store until then.
    pub async fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), VolumeError> {
        match self.taken.get() {
            Some(v) => v.read(offset, buf).await,
            None => self.view.read(offset, buf).await,
        }
    }

    pub async fn block_status(
        &self,
        offset: u64,
        len: u64,
        max_extents: usize,
    ) -> Result<Vec<(u64, crate::map::Allocation)>, VolumeError> {
        match self.taken.get() {
            Some(v) => v.block_status(offset, len, max_extents),
            None => self.view.block_status(offset, len, max_extents).await,
        }
    }

    /// The volume, for a write, TRIM or FLUSH: taken now (`Auto`), or once
    /// an explicit take gave it (`Explicit`), waiting at most
    /// `standby_wait_ms`.
    pub async fn volume_to_write(self: &Arc<Self>) -> Result<Arc<Volume>, VolumeError> {
        if let Some(v) = self.taken.get() {
            return Ok(v.clone());
        }
        let wait = Duration::from_millis(self.engine.config.standby_wait_ms);
        if self.engine.config.standby == StandbyPolicy::Auto {
            return self.take(wait).await;
        }
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let woken = self.taken_now.notified();
            tokio::pin!(woken);
            woken.as_mut().enable();
            if let Some(v) = self.taken.get() {
                return Ok(v.clone());
            }
            if tokio::time::timeout_at(deadline, woken).await.is_err() {
                return Err(VolumeError::Busy(format!(
                    "volume {:?}: this server stands by for it (--standby explicit) and was not given it within {} ms; run `strata volume handover {}` on this host at the switchover",
                    self.name,
                    wait.as_millis(),
                    self.name
                )));
            }
        }
    }

    /// A write through the taken volume was answered: the first is logged
    /// with the wall clock (the storage part of a migration's downtime
    /// ends there; the old holder logged its last FLUSH's).
    pub fn write_served(&self) {
        use std::sync::atomic::Ordering;
        // A load first: every later write of the connection comes here.
        if self.taken.get().is_some()
            && !self.first_write_logged.load(Ordering::Relaxed)
            && !self.first_write_logged.swap(true, Ordering::AcqRel)
        {
            let unix_ms = crate::clock::now_ms();
            tracing::info!(volume = %self.name, first_write_unix_ms = unix_ms, "first write served after the takeover");
        }
    }

    /// Takes the volume: asks the holder to hand over, opens it; waits at
    /// most `timeout`, all steps together.
    ///
    /// The take runs in a task of its own: a write that stops waiting at
    /// its bound does not cut it short (an open cut half-way could leave
    /// the lease naming this host with no volume open here), and the
    /// writes after it wait for the same take.
    pub async fn take(self: &Arc<Self>, timeout: Duration) -> Result<Arc<Volume>, VolumeError> {
        if let Some(v) = self.taken.get() {
            return Ok(v.clone());
        }
        let deadline = Instant::now() + timeout;
        let me = self.clone();
        let taking = tokio::spawn(async move { me.take_once(deadline).await });
        let waited =
            tokio::time::timeout_at(tokio::time::Instant::from_std(deadline), taking).await;
        match waited {
            Ok(Ok(taken)) => taken,
            Ok(Err(e)) => Err(VolumeError::Failed {
                name: self.name.clone(),
                detail: format!("the takeover stopped: {e}"),
            }),
            Err(_) => {
                tracing::warn!(volume = %self.name, timeout_ms = timeout.as_millis() as u64, holder = %self.holder, "a write waited its bound for the takeover, which goes on; the write fails");
                Err(VolumeError::Busy(format!(
                    "volume {:?}: not taken over from {} within {} ms (--standby-wait-ms); the takeover goes on, later writes use it once done",
                    self.name,
                    self.holder,
                    timeout.as_millis()
                )))
            }
        }
    }

    /// The take itself, once per standby (the writes that arrive while it
    /// runs wait for it), its steps bounded by `deadline`.
    async fn take_once(&self, deadline: Instant) -> Result<Arc<Volume>, VolumeError> {
        let holder = format!(" by {}", self.holder);
        let taken = self
            .taken
            .get_or_try_init(|| async {
                let started = Instant::now();
                let (v, asked) = match self.take_handed(deadline).await {
                    Some(taken) => taken,
                    None => take(&self.engine, &self.name, deadline, &holder).await?,
                };
                let handover_ms = asked.as_ref().map(|a| a.elapsed_ms);
                *self.asked.lock() = asked;
                // Once per standby, however many writes waited for it.
                tracing::info!(volume = %self.name, elapsed_ms = started.elapsed().as_millis() as u64, handover_ms, "the standby took the volume over");
                Ok::<_, VolumeError>(v)
            })
            .await?;
        self.taken_now.notify_waiters();
        Ok(taken.clone())
    }
}

impl Standby {
    /// The quick take, when the holder is on this machine: it closes and
    /// writes the lease naming this host (`ownership/lease_transfer.rs`),
    /// which opens with that lease: no poll for a release, no lease of its
    /// own to take. `None` when it could not be done that way (no socket,
    /// the holder let go already, the lease not as promised): the caller
    /// then takes the volume the ordinary way, which also copes with a
    /// lease handed over whose reply was lost (it names this host).
    async fn take_handed(
        &self,
        deadline: Instant,
    ) -> Option<(Arc<Volume>, Option<HandoverOutcome>)> {
        let started = Instant::now();
        let to = match self.engine.host().await.and_then(|h| successor_of(&h)) {
            Ok(to) => Successor {
                until_unix_ms: Some(crate::clock::now_ms() + millis_until(deadline)),
                ..to
            },
            Err(e) => {
                tracing::info!(volume = %self.name, error = %e, "cannot name this host as the successor; taking the volume the ordinary way");
                return None;
            }
        };
        let (via, report) = match local_control_socket(&self.holder_host) {
            Some(socket) => (
                "control socket",
                Some(self.hand_over_socket(&socket, &to, deadline).await?),
            ),
            None => ("store", self.hand_over_store(&to, deadline).await?),
        };
        let handed_ms = started.elapsed().as_millis() as u64;
        let opened = self
            .engine
            .open_volume_as(&self.name, OpenAs::Successor(&to.token))
            .await;
        let open_ms = started.elapsed().as_millis() as u64 - handed_ms;
        tracing::info!(volume = %self.name, via, handed_ms, open_ms, opened = opened.is_ok(), "the holder handed the volume to this host");
        let vol = match opened {
            Ok(v) => v,
            Err(e) => {
                tracing::warn!(volume = %self.name, error = %e, "cannot open the volume handed over; giving its lease back");
                let names = ObjectNames::new(&self.name);
                if let Err(e) = release_transferred(&self.engine.store, &names, &to.token).await {
                    tracing::warn!(volume = %self.name, error = %e, "could not give the handed lease back; it is free once this host stops");
                }
                return None;
            }
        };
        let asked = HandoverOutcome {
            volume: self.name.clone(),
            holder: Some(self.holder.clone()),
            via,
            report,
            elapsed_ms: started.elapsed().as_millis() as u64,
        };
        Some((vol, Some(asked)))
    }

    /// Asks the holder over its control socket to hand the volume to
    /// `to`; its report if it did.
    async fn hand_over_socket(
        &self,
        socket: &str,
        to: &Successor,
        deadline: Instant,
    ) -> Option<HandoverReport> {
        let request = serde_json::json!({"op": "handover", "volume": self.name, "to": to});
        // A transfer the holder began before the deadline is seen through.
        let timeout = (deadline + TRANSFER_GRACE).saturating_duration_since(Instant::now());
        let reply = tokio::time::timeout(timeout, control_call(socket, &request)).await;
        let report: HandoverReport = match reply {
            Ok(Ok(v)) => match serde_json::from_value(v) {
                Ok(r) => r,
                Err(e) => {
                    tracing::info!(volume = %self.name, socket = %socket, error = %e, "unreadable handover reply; taking the volume the ordinary way");
                    return None;
                }
            },
            Ok(Err(e)) => {
                tracing::info!(volume = %self.name, socket = %socket, error = %e, "the holder did not hand the volume over through its control socket; taking it the ordinary way");
                return None;
            }
            Err(_) => {
                tracing::info!(volume = %self.name, socket = %socket, timeout_ms = timeout.as_millis() as u64, "the holder did not answer in time; taking the volume the ordinary way");
                return None;
            }
        };
        report.transferred.then_some(report)
    }

    /// Asks the holder through its host record (another machine) to hand
    /// the volume to `to`, and waits for the lease to name `to` (the
    /// holder, in standby mode, looks at its record every
    /// `REQUEST_POLL_MS`). `Some(None)` once it does; `None` when the
    /// holder let go otherwise, or did not answer within its TTL.
    async fn hand_over_store(
        &self,
        to: &Successor,
        deadline: Instant,
    ) -> Option<Option<HandoverReport>> {
        let store = &self.engine.store;
        let record = &self.holder_host;
        let sent = send_request_through_store(
            store,
            &record.id,
            &self.name,
            &self.by,
            RequestKind::Handover,
            Some(to),
        )
        .await;
        match sent {
            Ok(Some(_)) => {}
            Ok(None) => return None,
            Err(e) => {
                tracing::info!(volume = %self.name, error = %e, "cannot ask the holder through the store; taking the volume the ordinary way");
                return None;
            }
        }
        // A transfer the holder began before the deadline is seen through.
        let deadline =
            (deadline + TRANSFER_GRACE).min(Instant::now() + Duration::from_millis(record.ttl_ms));
        let names = ObjectNames::new(&self.name);
        loop {
            match read_lease(store, &names).await {
                Ok(Some((l, _))) if l.token == to.token => return Some(None),
                Ok(Some((l, _)))
                    if l.released || l.host.as_ref().is_none_or(|h| h.id != record.id) =>
                {
                    return None
                }
                Ok(None) => return None,
                Ok(Some(_)) | Err(_) => {}
            }
            if Instant::now() >= deadline {
                tracing::info!(volume = %self.name, "the holder did not hand the volume over through the store in time; taking it the ordinary way");
                return None;
            }
            tokio::time::sleep(HANDED_POLL).await;
        }
    }
}

/// Whole milliseconds from now until `deadline` (0 once past).
fn millis_until(deadline: Instant) -> u64 {
    deadline
        .saturating_duration_since(Instant::now())
        .as_millis() as u64
}

impl Drop for Standby {
    /// A standby that never took its volume tells the holder it is gone
    /// (best effort: the holder leaves standby mode; FLUSH stays correct
    /// either way, only slower).
    fn drop(&mut self) {
        if self.taken.get().is_some() {
            return;
        }
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let engine = self.engine.clone();
        let (record, volume, by) = (self.holder_host.clone(), self.name.clone(), self.by.clone());
        rt.spawn(async move {
            let said = engine
                .tell_holder(&record, &volume, &by, RequestKind::StandbyGone)
                .await;
            if let Err(e) = said {
                tracing::info!(volume = %volume, error = %e, "could not tell the holder this standby is gone");
            }
        });
    }
}
