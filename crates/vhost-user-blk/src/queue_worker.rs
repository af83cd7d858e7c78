//! One virtqueue's worker: a task that takes requests from the available
//! ring when the guest kicks, runs them concurrently, and returns each to
//! the used ring (with the inflight area updated around it) as it
//! completes.
//!
//! One worker per queue and nothing shared between queues on the hot
//! path: the queue, its kick and call descriptors and its part of the
//! inflight area belong to its task; the device and the byte budget are
//! shared, as they are between NBD connections.
//!
//! Stopping (VHOST_USER_GET_VRING_BASE, a disconnect, a server shutdown)
//! takes no new request and waits for those running: each is returned to
//! the guest before the worker says where the ring stopped.
//!
//! While a migration logs dirty pages (`dirty_log.rs`), every write of the
//! worker into guest memory is marked after it is made: a completed
//! request's data and status byte, then its used element and the used
//! index, and the used ring's flags or avail_event around each batch
//! (those at the ring's log address, when the frontend asked for them).
//! All of it happens before the request counts as returned, so a stopped
//! ring has logged everything it wrote.

use std::fs::File;
use std::io::Read;
use std::num::Wrapping;
use std::os::fd::AsRawFd;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use tokio::io::unix::AsyncFd;
use tokio::sync::{mpsc, oneshot, Semaphore};
use virtio_queue::{Queue, QueueT};
use vm_memory::{Address, GuestAddress, GuestAddressSpace, GuestMemoryAtomic, GuestMemoryMmap};

use crate::chain::{walk, Table};
use crate::config_space::Limits;
use crate::device::BlockDevice;
use crate::dirty_log::{
    DirtyLog, LogArea, UsedRingLog, USED_ELEM_BYTES, USED_FLAGS_OFFSET, USED_IDX_OFFSET,
    USED_RING_OFFSET,
};
use crate::error_log::ErrorLog;
use crate::execute::{execute, written_spans, Outcome};
use crate::inflight::InflightQueue;
use crate::metrics::{DeviceMetrics, OpKind};
use crate::request::{bytes_of, parse, DeviceShape, Op, Refusal, Request, Span};

/// What the worker of queue `index` starts from.
pub struct QueueSetup {
    pub index: u16,
    pub size: u16,
    /// Guest physical addresses of the descriptor table and the rings.
    pub desc_table: u64,
    pub avail_ring: u64,
    pub used_ring: u64,
    /// VHOST_USER_SET_VRING_BASE: where the available ring resumes.
    pub next_avail: u16,
    pub event_idx: bool,
    pub indirect: bool,
    pub kick: File,
    /// Replaced by VHOST_USER_SET_VRING_CALL at any time.
    pub call: Arc<parking_lot::Mutex<Option<File>>>,
    pub inflight: Option<InflightQueue>,
    /// Where used-ring writes are logged; changed by
    /// VHOST_USER_SET_VRING_ADDR while the ring runs.
    pub used_log: Arc<UsedRingLog>,
}

/// What a worker shares with the other queues of its connection.
pub struct Shared<D> {
    pub device: Arc<D>,
    pub mem: GuestMemoryAtomic<GuestMemoryMmap>,
    pub budget: Arc<Semaphore>,
    pub metrics: Arc<DeviceMetrics>,
    pub limits: Limits,
    pub log: ErrorLog,
    /// The connection's dirty log (live migration).
    pub dirty_log: Arc<DirtyLog>,
}

/// A running worker: stop it to learn where its ring stopped.
pub struct Worker {
    stop: Option<oneshot::Sender<()>>,
    done: oneshot::Receiver<u16>,
}

impl Worker {
    /// Stops taking requests, waits for those running to be returned to
    /// the guest, and gives the next available index. Blocks: call from a
    /// thread that is not a runtime worker.
    pub fn stop_blocking(mut self) -> Option<u16> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        self.done.blocking_recv().ok()
    }
}

/// A request that has run, to return to the guest.
struct Done {
    head: u16,
    /// Where its status byte goes.
    status: GuestAddress,
    kind: OpKind,
    /// Data bytes, for the metrics.
    bytes: u64,
    outcome: Outcome,
    /// Guest buffers the request wrote into (`written_spans`), for the
    /// dirty log.
    written: Vec<Span>,
}

type Running = Pin<Box<dyn std::future::Future<Output = Done> + Send>>;

/// Starts the worker of a queue on `runtime`.
pub fn start<D: BlockDevice>(
    setup: QueueSetup,
    shared: Arc<Shared<D>>,
    runtime: &tokio::runtime::Handle,
) -> Result<Worker, String> {
    let (stop_tx, stop_rx) = oneshot::channel();
    let (done_tx, done_rx) = oneshot::channel();
    let kick = nonblocking(
        setup
            .kick
            .try_clone()
            .map_err(|e| format!("kick fd: {e}"))?,
    )?;
    let _guard = runtime.enter();
    // SAFETY: `kick` is a File the AsyncFd owns: its descriptor stays
    // open and the same until the AsyncFd is dropped.
    let kick = unsafe { AsyncFd::register_with_interest(kick, tokio::io::Interest::READABLE) }
        .map_err(|e| format!("watching the kick fd: {e}"))?;
    let mut state = QueueState::new(setup, shared)?;
    runtime.spawn(async move {
        state.run(kick, stop_rx).await;
        let _ = done_tx.send(state.queue.next_avail());
    });
    Ok(Worker {
        stop: Some(stop_tx),
        done: done_rx,
    })
}

fn nonblocking(file: File) -> Result<File, String> {
    // SAFETY: fcntl on a descriptor `file` owns; no memory is passed.
    let rc = unsafe {
        let flags = libc::fcntl(file.as_raw_fd(), libc::F_GETFL);
        libc::fcntl(file.as_raw_fd(), libc::F_SETFL, flags | libc::O_NONBLOCK)
    };
    if rc < 0 {
        return Err(format!("kick fd: {}", std::io::Error::last_os_error()));
    }
    Ok(file)
}

struct QueueState<D> {
    index: u16,
    size: u16,
    indirect: bool,
    event_idx: bool,
    used_log: Arc<UsedRingLog>,
    queue: Queue,
    call: Arc<parking_lot::Mutex<Option<File>>>,
    inflight: Option<InflightQueue>,
    counter: u64,
    resubmit: Vec<u16>,
    shared: Arc<Shared<D>>,
    /// Requests done at their first poll, to return after the batch.
    ready: Vec<Done>,
    /// Requests that had to wait run as tasks of their own (a queue's
    /// requests then spread over the runtime's threads, as NBD's do) and
    /// come back here.
    done_tx: mpsc::UnboundedSender<Done>,
    done_rx: mpsc::UnboundedReceiver<Done>,
    spawned: usize,
}

impl<D: BlockDevice> QueueState<D> {
    fn new(setup: QueueSetup, shared: Arc<Shared<D>>) -> Result<Self, String> {
        let mut queue =
            Queue::new(setup.size).map_err(|e| format!("queue size {}: {e}", setup.size))?;
        queue.set_size(setup.size);
        queue.set_desc_table_address(
            Some(setup.desc_table as u32),
            Some((setup.desc_table >> 32) as u32),
        );
        queue.set_avail_ring_address(
            Some(setup.avail_ring as u32),
            Some((setup.avail_ring >> 32) as u32),
        );
        queue.set_used_ring_address(
            Some(setup.used_ring as u32),
            Some((setup.used_ring >> 32) as u32),
        );
        queue.set_event_idx(setup.event_idx);
        queue.set_ready(true);
        let mem = shared.mem.memory();
        if !queue.is_valid(&*mem) {
            return Err(format!(
                "queue {}: rings of {} descriptors at {:#x}/{:#x}/{:#x} are not in guest memory or misaligned",
                setup.index, setup.size, setup.desc_table, setup.avail_ring, setup.used_ring
            ));
        }
        let used = queue
            .used_idx(&*mem, Ordering::Acquire)
            .map_err(|e| format!("queue {}: used index: {e}", setup.index))?;
        queue.set_next_used(used.0);
        let mut next_avail = setup.next_avail;
        let (mut counter, mut resubmit) = (0, Vec::new());
        if let Some(inflight) = &setup.inflight {
            let found = inflight
                .recover(used.0)
                .map_err(|e| format!("queue {}: inflight area: {e}", setup.index))?;
            if !found.resubmit.is_empty() || found.next_counter > 0 {
                // Everything taken is either returned (used) or to be
                // resubmitted: the ring resumes past both.
                next_avail = (Wrapping(used.0) + Wrapping(found.resubmit.len() as u16)).0;
            }
            counter = found.next_counter;
            resubmit = found.resubmit;
            if !resubmit.is_empty() {
                tracing::info!(volume = %shared.log.device(), queue = setup.index, requests = resubmit.len(), "resubmitting the requests a previous backend had taken");
            }
        }
        queue.set_next_avail(next_avail);
        let (done_tx, done_rx) = mpsc::unbounded_channel();
        Ok(QueueState {
            index: setup.index,
            size: setup.size,
            indirect: setup.indirect,
            event_idx: setup.event_idx,
            used_log: setup.used_log,
            queue,
            call: setup.call,
            inflight: setup.inflight,
            counter,
            resubmit,
            shared,
            ready: Vec::new(),
            done_tx,
            done_rx,
            spawned: 0,
        })
    }

    async fn run(&mut self, kick: AsyncFd<File>, mut stop: oneshot::Receiver<()>) {
        for head in std::mem::take(&mut self.resubmit) {
            self.submit(head);
        }
        // Requests queued while no backend ran were kicked into nobody.
        self.take_available();
        self.complete_ready();
        loop {
            tokio::select! {
                _ = &mut stop => break,
                Some(done) = self.done_rx.recv(), if self.spawned > 0 => {
                    self.spawned -= 1;
                    self.complete(done);
                    while let Ok(done) = self.done_rx.try_recv() {
                        self.spawned -= 1;
                        self.complete(done);
                    }
                    self.notify();
                }
                ready = kick.readable() => {
                    match ready {
                        Ok(mut guard) => {
                            let mut value = [0u8; 8];
                            // Clears the eventfd; WouldBlock clears readiness.
                            if let Err(e) = guard.get_inner().read(&mut value) {
                                if e.kind() == std::io::ErrorKind::WouldBlock {
                                    guard.clear_ready();
                                }
                            }
                        }
                        Err(e) => {
                            tracing::error!(volume = %self.shared.log.device(), queue = self.index, error = %e, "kick fd failed; the queue stops");
                            break;
                        }
                    }
                    self.take_available();
                    self.complete_ready();
                }
            }
        }
        while self.spawned > 0 {
            let Some(done) = self.done_rx.recv().await else {
                break;
            };
            self.spawned -= 1;
            self.complete(done);
        }
        self.notify();
    }

    /// Returns the requests that were done at once, and notifies.
    fn complete_ready(&mut self) {
        if self.ready.is_empty() {
            return;
        }
        for done in std::mem::take(&mut self.ready) {
            self.complete(done);
        }
        self.notify();
    }

    /// Takes every request the guest made available, with notifications
    /// off while doing so (EVENT_IDX: the guest kicks only past the index
    /// the device asks for).
    fn take_available(&mut self) {
        loop {
            let mem = self.shared.mem.memory();
            if let Err(e) = self.queue.disable_notification(&*mem) {
                tracing::warn!(volume = %self.shared.log.device(), queue = self.index, error = %e, "disabling notifications");
            }
            // Without EVENT_IDX, disabling writes the used ring's flags.
            if !self.event_idx {
                self.log_used_field(USED_FLAGS_OFFSET);
            }
            let mut heads = Vec::new();
            while let Some(chain) = self.queue.pop_descriptor_chain(&*mem) {
                heads.push(chain.head_index());
            }
            drop(mem);
            for head in heads {
                if let Some(inflight) = &self.inflight {
                    if head < inflight.desc_num() {
                        inflight.taken(head, self.counter);
                        self.counter = self.counter.wrapping_add(1);
                    }
                }
                self.submit(head);
            }
            let mem = self.shared.mem.memory();
            let enabled = self.queue.enable_notification(&*mem);
            // Enabling writes avail_event (EVENT_IDX) or the flags.
            let field = if self.event_idx {
                USED_RING_OFFSET + USED_ELEM_BYTES * u64::from(self.size)
            } else {
                USED_FLAGS_OFFSET
            };
            self.log_used_field(field);
            match enabled {
                Ok(true) => continue,
                Ok(false) => break,
                Err(e) => {
                    tracing::warn!(volume = %self.shared.log.device(), queue = self.index, error = %e, "re-enabling notifications");
                    break;
                }
            }
        }
    }

    /// Parses the chain at `head` and starts it (or answers at once).
    fn submit(&mut self, head: u16) {
        if head >= self.size {
            // Not a descriptor: nothing can be returned for it.
            self.shared.log.request(
                self.index,
                "request refused",
                &format!("head index {head} past a queue of {}", self.size),
            );
            return;
        }
        let mem = self.shared.mem.memory().into_inner();
        let table = Table {
            addr: GuestAddress(self.queue.desc_table()),
            len: u32::from(self.size),
        };
        let segments = match walk(&*mem, table, head, self.indirect) {
            Ok(s) => s,
            Err(e) => return self.unusable(head, &e.to_string()),
        };
        let shape = DeviceShape {
            capacity_bytes: self.shared.device.size_bytes(),
            read_only: self.shared.device.is_read_only(),
            limits: self.shared.limits,
        };
        let request = match parse(&*mem, &segments, &shape) {
            Ok(r) => r,
            Err(e) => return self.unusable(head, &e),
        };
        let shared = self.shared.clone();
        let (kind, bytes) = kind_of(&request.op);
        let mut request: Running = Box::pin(async move {
            let Request { status, op } = request;
            let (outcome, written) = match op {
                Ok(op) => {
                    let outcome = execute(&*shared.device, &*mem, &op, &shared.budget).await;
                    (outcome, written_spans(op))
                }
                Err(refusal) => (
                    Outcome {
                        status: refusal.status,
                        written_bytes: 0,
                        failure: Some(refusal.reason),
                        device_error: false,
                    },
                    Vec::new(),
                ),
            };
            Done {
                head,
                status,
                kind,
                bytes,
                outcome,
                written,
            }
        });
        // Polled once here: a request the device answers at once (a read
        // from cache) costs no task.
        match futures::FutureExt::now_or_never(&mut request) {
            Some(done) => self.ready.push(done),
            None => {
                self.spawned += 1;
                let tx = self.done_tx.clone();
                tokio::spawn(async move {
                    // The worker outlives its tasks (it waits for every
                    // one before it ends), so the send cannot fail.
                    let _ = tx.send(request.await);
                });
            }
        }
    }

    /// A chain with no place for a status: returned with nothing written.
    fn unusable(&mut self, head: u16, why: &str) {
        self.shared.log.request(self.index, "chain refused", why);
        self.shared.metrics.record(OpKind::Refused, false, 0);
        let dirty = self.dirty_log();
        let log = dirty.as_deref().and_then(DirtyLog::writer);
        self.put_used(head, 0, log.as_deref());
        drop(log);
        self.notify();
    }

    fn complete(&mut self, done: Done) {
        let Done {
            head,
            status,
            kind,
            bytes,
            outcome,
            written,
        } = done;
        let ok = outcome.failure.is_none();
        self.shared
            .metrics
            .record(kind, ok, if ok { bytes } else { 0 });
        // A device's failure is in its own log line already.
        if let (Some(why), false) = (&outcome.failure, outcome.device_error) {
            self.shared.log.request(self.index, "request failed", why);
        }
        let mem = self.shared.mem.memory();
        let status_written = match vm_memory::Bytes::write_obj(&*mem, outcome.status, status) {
            Ok(()) => true,
            Err(e) => {
                self.shared
                    .log
                    .request(self.index, "status not written", &e.to_string());
                false
            }
        };
        drop(mem);
        let dirty = self.dirty_log();
        let log = dirty.as_deref().and_then(DirtyLog::writer);
        if let Some(log) = log.as_deref() {
            for span in &written {
                self.log_guest(log, span.addr.raw_value(), u64::from(span.len_bytes));
            }
            if status_written {
                self.log_guest(log, status.raw_value(), 1);
            }
        }
        // The status byte counts as written.
        self.put_used(
            head,
            outcome.written_bytes.saturating_add(1),
            log.as_deref(),
        );
    }

    /// Returns `head` in the used ring; `log`: the dirty log to mark the
    /// element and the index in.
    fn put_used(&mut self, head: u16, len: u32, log: Option<&LogArea>) {
        let mem = self.shared.mem.memory();
        if let Some(inflight) = &self.inflight {
            inflight.returning(head);
        }
        let slot = self.queue.next_used() % self.size;
        let added = self.queue.add_used(&*mem, head, len);
        drop(mem);
        // Logged even when add_used failed: it may have written the
        // element and not the index.
        let elem = USED_RING_OFFSET + USED_ELEM_BYTES * u64::from(slot);
        self.log_used(log, elem, USED_ELEM_BYTES);
        self.log_used(log, USED_IDX_OFFSET, 2);
        if let Err(e) = added {
            self.shared
                .log
                .request(self.index, "used ring", &e.to_string());
            return;
        }
        if let Some(inflight) = &self.inflight {
            inflight.returned(head, self.queue.next_used());
        }
    }

    /// The connection's dirty log while a migration logs; None (one
    /// relaxed load) otherwise. Callers take `DirtyLog::writer` from it.
    fn dirty_log(&self) -> Option<Arc<DirtyLog>> {
        self.shared
            .dirty_log
            .is_active()
            .then(|| self.shared.dirty_log.clone())
    }

    /// Marks a write of a 2-byte field of the used ring (flags,
    /// avail_event) while a migration logs.
    fn log_used_field(&self, offset: u64) {
        if let Some(log) = self.shared.dirty_log.writer() {
            self.log_used(Some(&log), offset, 2);
        }
    }

    /// Marks a write of `len_bytes` at guest address `addr`.
    fn log_guest(&self, log: &LogArea, addr: u64, len_bytes: u64) {
        if let Err(e) = log.mark(addr, len_bytes) {
            self.shared
                .log
                .request(self.index, "dirty page not logged", &e);
        }
    }

    /// Marks a write of `len_bytes` at `offset` in the used ring, at the
    /// ring's log address, if the frontend asked for used-ring logging.
    fn log_used(&self, log: Option<&LogArea>, offset: u64, len_bytes: u64) {
        let (Some(log), Some(base)) = (log, self.used_log.get()) else {
            return;
        };
        // SET_VRING_ADDR refused a log address whose ring wraps.
        self.log_guest(log, base.saturating_add(offset), len_bytes);
    }

    fn notify(&mut self) {
        let mem = self.shared.mem.memory();
        let needed = self.queue.needs_notification(&*mem).unwrap_or(true);
        if !needed {
            return;
        }
        if let Some(call) = self.call.lock().as_ref() {
            // An eventfd adds what is written; a full counter (EAGAIN)
            // already means "notified".
            let one = 1u64.to_ne_bytes();
            let _ = std::io::Write::write(&mut &*call, &one);
        }
    }
}

/// What a request counts as, and its data bytes.
fn kind_of(op: &Result<Op, Refusal>) -> (OpKind, u64) {
    match op {
        Ok(Op::Read { data, .. }) => (OpKind::Read, bytes_of(data)),
        Ok(Op::Write { data, .. }) => (OpKind::Write, bytes_of(data)),
        Ok(Op::Flush) => (OpKind::Flush, 0),
        Ok(Op::GetId { .. }) => (OpKind::GetId, 0),
        Ok(Op::Discard { ranges }) => {
            (OpKind::Discard, ranges.iter().map(|r| r.length_bytes).sum())
        }
        Ok(Op::WriteZeroes { ranges }) => (
            OpKind::WriteZeroes,
            ranges.iter().map(|r| r.length_bytes).sum(),
        ),
        Err(_) => (OpKind::Refused, 0),
    }
}
