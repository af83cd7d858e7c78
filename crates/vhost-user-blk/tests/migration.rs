//! Live migration, end to end: the test plays the frontend (QEMU's part)
//! with the `vhost` crate's `Frontend` over the server's unix socket, with
//! guest memory and the dirty log in memfds, the rings built by hand.
//!
//! - While VHOST_F_LOG_ALL is acked and a log is set
//!   (VHOST_USER_SET_LOG_BASE), exactly the pages the backend writes are
//!   marked: a read's data (across pages), a GET_ID's id, every status
//!   byte, and the used ring, at the ring's `log_guest_addr` (deliberately
//!   not the used ring's own address here, so the test tells them apart);
//!   not the data of a write, which the backend only reads. Nothing is
//!   marked with LOG_ALL off or never acked.
//! - VHOST_USER_GET_VRING_BASE stops a ring only once the requests it
//!   took are returned and logged, and says where it stopped; the ring
//!   restarts from there on the same connection, and on another one (the
//!   destination of a migration: new connection, new inflight area, the
//!   base from the source).
//! - A log too small for guest memory is refused (the connection closes;
//!   the message is checked by backend.rs's unit test), and the server
//!   takes the frontend's next connection.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::watch;
use vhost::vhost_user::message::{VhostUserInflight, VhostUserProtocolFeatures};
use vhost::vhost_user::{Frontend, VhostUserFrontend, VhostUserVirtioFeatures};
use vhost::{VhostBackend, VhostUserDirtyLogRegion, VhostUserMemoryRegionInfo, VringConfigData};
use vhost_user_blk::{bind, BlockDevice, DeviceProvider, Server, ServerConfig};
use virtio_queue::desc::split::Descriptor;
use vm_memory::{Bytes, FileOffset, GuestAddress, GuestMemoryBackend, GuestMemoryMmap};
use vmm_sys_util::eventfd::EventFd;

/// 1 MiB of guest memory: 256 pages of 4 KiB, 32 bytes of dirty log.
const MEM_BYTES: usize = 1 << 20;
const PAGE: u64 = 0x1000;
const LOG_BYTES: u64 = (MEM_BYTES as u64 / PAGE).div_ceil(8);
const QUEUE_SIZE: u16 = 16;
const DESC: u64 = 0x0;
const AVAIL: u64 = 0x1000;
const USED: u64 = 0x2000;
/// The used ring's `log_guest_addr`: page 0x90, where nothing else is.
const USED_LOG: u64 = 0x9_0000;
const VOLUME_BYTES: u64 = 1 << 20;

const NEXT: u16 = 1;
const WRITE: u16 = 2;
const T_IN: u32 = 0;
const T_OUT: u32 = 1;
const T_GET_ID: u32 = 8;

const EVENT_IDX_BIT: u64 = 1 << 29;
const LOG_ALL_BIT: u64 = VhostUserVirtioFeatures::LOG_ALL.bits();
/// VHOST_VRING_F_LOG in SET_VRING_ADDR's flags.
const VRING_F_LOG: u32 = 1;

// ---- the device: the volume reads as its byte offsets; reads wait -------

/// Byte `i` of the volume.
fn volume_byte(i: u64) -> u8 {
    (i % 251) as u8
}

/// Reads wait until the gate opens; writes and flushes do not.
struct Device {
    gate: watch::Receiver<bool>,
    reads_started: AtomicUsize,
    reads_done: AtomicUsize,
}

impl BlockDevice for Device {
    fn size_bytes(&self) -> u64 {
        VOLUME_BYTES
    }

    fn is_read_only(&self) -> bool {
        false
    }

    fn id(&self) -> String {
        "migrating-volume".to_string()
    }

    async fn read(&self, offset_bytes: u64, buf: &mut [u8]) -> io::Result<()> {
        self.reads_started.fetch_add(1, Ordering::SeqCst);
        let mut gate = self.gate.clone();
        gate.wait_for(|open| *open)
            .await
            .map_err(|_| io::Error::other("gate dropped"))?;
        for (i, b) in buf.iter_mut().enumerate() {
            *b = volume_byte(offset_bytes + i as u64);
        }
        self.reads_done.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }

    async fn write(&self, _offset_bytes: u64, _data: &[u8]) -> io::Result<()> {
        Ok(())
    }

    async fn flush(&self) -> io::Result<()> {
        Ok(())
    }

    async fn discard(&self, _offset_bytes: u64, _length_bytes: u64) -> io::Result<()> {
        Err(io::Error::other("not in this test"))
    }

    async fn write_zeroes(&self, _offset: u64, _length: u64, _unmap: bool) -> io::Result<()> {
        Err(io::Error::other("not in this test"))
    }
}

struct Provider(Arc<Device>);

impl DeviceProvider for Provider {
    type Device = Device;

    async fn open(&self, _name: &str) -> io::Result<Arc<Device>> {
        Ok(self.0.clone())
    }
}

/// A server on its own runtime, its device, and the device's read gate.
struct Backend {
    runtime: tokio::runtime::Runtime,
    server: Arc<Server<Provider>>,
    device: Arc<Device>,
    gate: watch::Sender<bool>,
}

impl Backend {
    fn start(socket: &Path, reads_open: bool) -> Backend {
        let (gate, rx) = watch::channel(reads_open);
        let device = Arc::new(Device {
            gate: rx,
            reads_started: AtomicUsize::new(0),
            reads_done: AtomicUsize::new(0),
        });
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let config = ServerConfig {
            num_queues: 1,
            ..ServerConfig::default()
        };
        let server = Server::new(Arc::new(Provider(device.clone())), config);
        let listener = bind(socket).unwrap();
        runtime
            .block_on(async { server.serve("vol", listener) })
            .unwrap();
        Backend {
            runtime,
            server,
            device,
            gate,
        }
    }

    fn stop(self) {
        self.runtime.block_on(self.server.shutdown());
    }
}

// ---- the guest: memory, rings, requests -------------------------------

fn memfd(name: &std::ffi::CStr, bytes: u64) -> File {
    // SAFETY: memfd_create takes a NUL-terminated name and flags; the
    // descriptor it returns is owned by the File alone.
    let fd = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
    assert!(fd >= 0, "memfd_create: {}", io::Error::last_os_error());
    // SAFETY: fd was just created and nothing else owns it.
    let file = unsafe { File::from_raw_fd(fd) };
    file.set_len(bytes).unwrap();
    file
}

/// One guest buffer of a request: guest address and bytes.
#[derive(Clone, Copy)]
struct Buf {
    addr: u64,
    len: u32,
}

struct Guest {
    mem: GuestMemoryMmap,
    /// Where this process mapped guest address 0 (the frontend's
    /// addresses, which SET_VRING_ADDR uses).
    host_base: u64,
    next_avail: u16,
}

impl Guest {
    fn new() -> Guest {
        let file = memfd(c"guest-memory", MEM_BYTES as u64);
        let mem = GuestMemoryMmap::<()>::from_ranges_with_files([(
            GuestAddress(0),
            MEM_BYTES,
            Some(FileOffset::new(file, 0)),
        )])
        .unwrap();
        let host_base = mem.find_region(GuestAddress(0)).unwrap().as_ptr() as u64;
        Guest {
            mem,
            host_base,
            next_avail: 0,
        }
    }

    fn region_info(&self) -> VhostUserMemoryRegionInfo {
        VhostUserMemoryRegionInfo::from_guest_region(self.mem.find_region(GuestAddress(0)).unwrap())
            .unwrap()
    }

    /// The ring's addresses; `log_used`: VHOST_VRING_F_LOG, at USED_LOG.
    fn vring_config(&self, log_used: bool) -> VringConfigData {
        VringConfigData {
            queue_max_size: QUEUE_SIZE,
            queue_size: QUEUE_SIZE,
            flags: if log_used { VRING_F_LOG } else { 0 },
            desc_table_addr: self.host_base + DESC,
            used_ring_addr: self.host_base + USED,
            avail_ring_addr: self.host_base + AVAIL,
            log_addr: log_used.then_some(USED_LOG),
        }
    }

    /// Request `kind` at `sector` as the chain head, head+1, head+2:
    /// header (at 0x10000 + 0x100 × head), `data`, `status`, made
    /// available. The status byte starts as 0xff.
    fn submit(&mut self, head: u16, kind: u32, sector: u64, data: Buf, status: u64) {
        let header_addr = 0x10000 + 0x100 * u64::from(head);
        let mut header = [0u8; 16];
        header[0..4].copy_from_slice(&kind.to_le_bytes());
        header[8..16].copy_from_slice(&sector.to_le_bytes());
        let m = &self.mem;
        m.write_slice(&header, GuestAddress(header_addr)).unwrap();
        m.write_obj(0xffu8, GuestAddress(status)).unwrap();
        let data_flags = if kind == T_OUT { 0 } else { WRITE };
        let descs = [
            (header_addr, 16, NEXT),
            (data.addr, data.len, data_flags | NEXT),
            (status, 1, WRITE),
        ];
        for (i, (addr, len, flags)) in descs.into_iter().enumerate() {
            let index = head + i as u16;
            m.write_obj(
                Descriptor::new(addr, len, flags, index + 1),
                GuestAddress(DESC + 16 * u64::from(index)),
            )
            .unwrap();
        }
        let slot = self.next_avail % QUEUE_SIZE;
        m.write_obj(head, GuestAddress(AVAIL + 4 + 2 * u64::from(slot)))
            .unwrap();
        self.next_avail = self.next_avail.wrapping_add(1);
        m.store(self.next_avail, GuestAddress(AVAIL + 2), Ordering::Release)
            .unwrap();
    }

    fn used_idx(&self) -> u16 {
        self.mem
            .load(GuestAddress(USED + 2), Ordering::Acquire)
            .unwrap()
    }

    /// The used ring's entries so far: (head, bytes written).
    fn used(&self) -> Vec<(u32, u32)> {
        (0..self.used_idx())
            .map(|i| {
                let at = USED + 4 + 8 * u64::from(i % QUEUE_SIZE);
                let id: u32 = self.mem.read_obj(GuestAddress(at)).unwrap();
                let len: u32 = self.mem.read_obj(GuestAddress(at + 4)).unwrap();
                (id, len)
            })
            .collect()
    }

    fn byte(&self, addr: u64) -> u8 {
        self.mem.read_obj(GuestAddress(addr)).unwrap()
    }

    fn bytes(&self, addr: u64, len: usize) -> Vec<u8> {
        let mut v = vec![0u8; len];
        self.mem.read_slice(&mut v, GuestAddress(addr)).unwrap();
        v
    }
}

// ---- the dirty log, as the frontend sees it ---------------------------

struct Log(File);

impl Log {
    fn new() -> Log {
        Log(memfd(c"dirty-log", LOG_BYTES))
    }

    fn region(&self, size_bytes: u64) -> VhostUserDirtyLogRegion {
        VhostUserDirtyLogRegion {
            mmap_size: size_bytes,
            mmap_offset: 0,
            mmap_handle: self.0.as_raw_fd(),
        }
    }

    /// The pages marked dirty, in order.
    fn marked_pages(&self) -> Vec<u64> {
        let mut bits = vec![0u8; LOG_BYTES as usize];
        self.0.read_exact_at(&mut bits, 0).unwrap();
        let mut pages = Vec::new();
        for (byte, b) in bits.iter().enumerate() {
            for bit in 0..8 {
                if b & (1 << bit) != 0 {
                    pages.push(byte as u64 * 8 + bit);
                }
            }
        }
        pages
    }

    /// What the frontend does after copying the pages: clear the bits.
    fn clear(&self) {
        self.0
            .write_all_at(&vec![0u8; LOG_BYTES as usize], 0)
            .unwrap();
    }
}

fn page_of(addr: u64) -> u64 {
    addr / PAGE
}

// ---- the frontend -----------------------------------------------------

/// The frontend's side of one connection, queue 0.
struct Connection {
    frontend: Frontend,
    features: u64,
    kick: EventFd,
    call: EventFd,
}

/// How a connection is set up.
struct Setup<'a> {
    /// Ack VHOST_F_LOG_ALL.
    log_all: bool,
    /// VHOST_USER_SET_LOG_BASE with this log, before the rings.
    log: Option<&'a Log>,
    /// VHOST_VRING_F_LOG on the ring.
    log_used: bool,
    /// Where the ring starts (VHOST_USER_SET_VRING_BASE).
    base: u16,
}

/// Negotiates as QEMU does (a fresh inflight area, as on a migration's
/// destination) and starts queue 0.
fn connect(socket: &Path, guest: &Guest, setup: &Setup) -> Connection {
    let mut frontend = Frontend::connect(socket, 1).unwrap();
    frontend.set_owner().unwrap();
    let offered = frontend.get_features().unwrap();
    assert_ne!(offered & LOG_ALL_BIT, 0, "VHOST_F_LOG_ALL offered");
    let mut features = offered & !EVENT_IDX_BIT;
    if !setup.log_all {
        features &= !LOG_ALL_BIT;
    }
    frontend.set_features(features).unwrap();
    let protocol = frontend.get_protocol_features().unwrap();
    assert!(protocol.contains(VhostUserProtocolFeatures::LOG_SHMFD));
    frontend
        .set_protocol_features(
            VhostUserProtocolFeatures::MQ
                | VhostUserProtocolFeatures::INFLIGHT_SHMFD
                | VhostUserProtocolFeatures::LOG_SHMFD,
        )
        .unwrap();
    let ask = VhostUserInflight {
        mmap_size: 0,
        mmap_offset: 0,
        num_queues: 1,
        queue_size: QUEUE_SIZE,
    };
    let (info, file) = frontend.get_inflight_fd(&ask).unwrap();
    frontend.set_inflight_fd(&info, file.as_raw_fd()).unwrap();
    frontend.set_mem_table(&[guest.region_info()]).unwrap();
    if let Some(log) = setup.log {
        frontend
            .set_log_base(0, Some(log.region(LOG_BYTES)))
            .unwrap();
    }
    let call = EventFd::new(libc::EFD_NONBLOCK).unwrap();
    let kick = EventFd::new(libc::EFD_NONBLOCK).unwrap();
    let mut conn = Connection {
        frontend,
        features,
        kick,
        call,
    };
    conn.start_ring(guest, setup.log_used, setup.base);
    conn.frontend.set_vring_enable(0, true).unwrap();
    conn.sync();
    conn
}

impl Connection {
    /// What QEMU's vhost_virtqueue_start sends: size, base, addresses,
    /// kick, call.
    fn start_ring(&self, guest: &Guest, log_used: bool, base: u16) {
        let f = &self.frontend;
        f.set_vring_num(0, QUEUE_SIZE).unwrap();
        f.set_vring_base(0, base).unwrap();
        f.set_vring_addr(0, &guest.vring_config(log_used)).unwrap();
        f.set_vring_kick(0, &self.kick).unwrap();
        f.set_vring_call(0, &self.call).unwrap();
    }

    /// Without REPLY_ACK the messages are not answered: one that is shows
    /// the backend took the ones before it.
    fn sync(&self) {
        self.frontend.get_features().unwrap();
    }

    fn kick(&self) {
        self.kick.write(1).unwrap();
    }

    /// VHOST_USER_GET_VRING_BASE: stops the ring.
    fn stop(&self) -> u32 {
        self.frontend.get_vring_base(0).unwrap()
    }
}

#[track_caller]
fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

// ---- the tests ----------------------------------------------------------

#[test]
fn a_migration_logs_exactly_the_pages_the_backend_writes() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("vol.sock");
    let backend = Backend::start(&socket, false);
    let mut guest = Guest::new();
    let log = Log::new();
    let setup = Setup {
        log_all: true,
        log: Some(&log),
        log_used: true,
        base: 0,
    };
    let conn = connect(&socket, &guest, &setup);
    // A ring that starts looks for requests at once, with notifications
    // off meanwhile: it wrote the used ring's flags (no EVENT_IDX).
    wait_until("the ring's start is logged", || {
        log.marked_pages() == [page_of(USED_LOG)]
    });
    log.clear();

    // A read of 8 KiB over three pages (from the middle of one), held by
    // the device.
    let data = Buf {
        addr: 0x2_0800,
        len: 0x2000,
    };
    let status = 0x3_0005;
    guest.submit(0, T_IN, 8, data, status);
    conn.kick();
    wait_until("the device started the read", || {
        backend.device.reads_started.load(Ordering::SeqCst) == 1
    });
    // Taking it wrote the used ring's flags (no EVENT_IDX): its log page.
    assert_eq!(log.marked_pages(), vec![page_of(USED_LOG)]);
    assert_eq!(guest.used_idx(), 0);
    log.clear();

    // The ring stops with the read running: GET_VRING_BASE answers once
    // it is returned, and its writes logged.
    let opener = {
        let gate = backend.gate.clone();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(200));
            gate.send(true).unwrap();
        })
    };
    assert_eq!(conn.stop(), 1, "stopped past the read");
    // The read was returned (and logged, below) before the answer.
    assert_eq!(guest.used(), vec![(0, 0x2001)]);
    assert_eq!(backend.device.reads_done.load(Ordering::SeqCst), 1);
    opener.join().unwrap();
    assert_eq!(guest.byte(status), 0);
    let want: Vec<u8> = (0..0x2000).map(|i| volume_byte(8 * 512 + i)).collect();
    assert_eq!(guest.bytes(data.addr, 0x2000), want);
    assert_eq!(
        log.marked_pages(),
        vec![0x20, 0x21, 0x22, page_of(status), page_of(USED_LOG)],
        "the data's three pages, the status byte's, the used ring's at its log address (not its own, page 2)"
    );
    log.clear();

    // Restarted on the same connection where it stopped (still enabled:
    // no SET_VRING_ENABLE), a GET_ID and a write: the id and both status
    // bytes are marked; the write's data, only read, is not.
    conn.start_ring(&guest, true, 1);
    let id = Buf {
        addr: 0x4_0ff8,
        len: 20,
    };
    guest.submit(3, T_GET_ID, 0, id, 0x4_2000);
    let written = Buf {
        addr: 0x5_0000,
        len: 512,
    };
    guest.submit(6, T_OUT, 0, written, 0x5_1000);
    conn.kick();
    wait_until("both are returned", || guest.used_idx() == 3);
    assert_eq!(conn.stop(), 3);
    assert_eq!(&guest.bytes(id.addr, 16), b"migrating-volume");
    assert_eq!(guest.used()[1..], [(3, 21), (6, 1)]);
    assert_eq!(
        log.marked_pages(),
        vec![0x40, 0x41, 0x42, 0x51, page_of(USED_LOG)],
        "the id across pages 0x40-0x41, both status bytes, the used ring; not the write's data (0x50)"
    );
    log.clear();

    // Migration over: LOG_ALL off. Nothing is marked any more, though the
    // ring still asks for its used ring to be logged.
    conn.frontend
        .set_features(conn.features & !LOG_ALL_BIT)
        .unwrap();
    conn.start_ring(&guest, true, 3);
    guest.submit(
        9,
        T_IN,
        0,
        Buf {
            addr: 0x6_0000,
            len: 512,
        },
        0x6_1000,
    );
    conn.kick();
    wait_until("the read is returned", || guest.used_idx() == 4);
    assert_eq!(conn.stop(), 4);
    assert_eq!(guest.byte(0x6_1000), 0);
    assert_eq!(log.marked_pages(), Vec::<u64>::new());

    drop(conn);
    backend.stop();
}

#[test]
fn without_log_all_nothing_is_marked() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("vol.sock");
    let backend = Backend::start(&socket, true);
    let mut guest = Guest::new();
    let log = Log::new();
    let setup = Setup {
        log_all: false,
        log: Some(&log),
        log_used: true,
        base: 0,
    };
    let conn = connect(&socket, &guest, &setup);
    guest.submit(
        0,
        T_IN,
        0,
        Buf {
            addr: 0x2_0000,
            len: 4096,
        },
        0x3_0000,
    );
    guest.submit(
        3,
        T_GET_ID,
        0,
        Buf {
            addr: 0x4_0000,
            len: 20,
        },
        0x4_1000,
    );
    conn.kick();
    wait_until("both are returned", || guest.used_idx() == 2);
    assert_eq!(conn.stop(), 2);
    assert_eq!(guest.byte(0x3_0000), 0);
    assert_eq!(log.marked_pages(), Vec::<u64>::new());
    drop(conn);
    backend.stop();
}

#[test]
fn a_log_too_small_for_guest_memory_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("vol.sock");
    let backend = Backend::start(&socket, true);
    let mut guest = Guest::new();
    let log = Log::new();
    let setup = Setup {
        log_all: true,
        log: None,
        log_used: true,
        base: 0,
    };
    let conn = connect(&socket, &guest, &setup);
    // One byte short of the 32 that 1 MiB of guest memory needs: the
    // backend refuses it and closes the connection (SET_LOG_BASE has no
    // error reply); the frontend sees no reply.
    assert!(conn
        .frontend
        .set_log_base(0, Some(log.region(LOG_BYTES - 1)))
        .is_err());
    assert!(conn.frontend.get_features().is_err(), "connection closed");
    drop(conn);

    // The frontend reconnects; with a log of the right size the ring runs
    // and logs.
    let setup = Setup {
        log: Some(&log),
        ..setup
    };
    let conn = connect(&socket, &guest, &setup);
    guest.submit(
        0,
        T_IN,
        0,
        Buf {
            addr: 0x2_0000,
            len: 512,
        },
        0x3_0000,
    );
    conn.kick();
    wait_until("the read is returned", || guest.used_idx() == 1);
    assert_eq!(conn.stop(), 1);
    assert_eq!(log.marked_pages(), vec![0x20, 0x30, page_of(USED_LOG)]);
    drop(conn);
    backend.stop();
}

#[test]
fn a_stopped_ring_resumes_where_it_stopped_on_the_next_connection() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("vol.sock");
    let backend = Backend::start(&socket, true);
    let mut guest = Guest::new();
    let read = |head: u16| Buf {
        addr: 0x2_0000 + 0x1000 * u64::from(head),
        len: 512,
    };
    let status = |head: u16| 0x3_0000 + u64::from(head);

    // The source: three reads, then the ring stops (the VM is paused for
    // the last pass of the migration).
    let setup = Setup {
        log_all: false,
        log: None,
        log_used: false,
        base: 0,
    };
    let source = connect(&socket, &guest, &setup);
    for head in [0, 3, 6] {
        guest.submit(head, T_IN, u64::from(head), read(head), status(head));
    }
    source.kick();
    wait_until("the three reads are returned", || guest.used_idx() == 3);
    let base = source.stop();
    assert_eq!(base, 3);
    drop(source);

    // Meanwhile the guest queued two more, which nothing took.
    for head in [9, 12] {
        guest.submit(head, T_IN, u64::from(head), read(head), status(head));
    }
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(guest.used_idx(), 3);

    // The destination: a new connection, a fresh inflight area, the ring
    // from the migrated state. It takes the two new reads and none of the
    // three returned already. (QEMU kicks after starting the rings.)
    let setup = Setup {
        base: base as u16,
        ..setup
    };
    let destination = connect(&socket, &guest, &setup);
    destination.kick();
    wait_until("the two new reads are returned", || guest.used_idx() == 5);
    assert_eq!(destination.stop(), 5);
    assert_eq!(backend.device.reads_done.load(Ordering::SeqCst), 5);
    let heads: Vec<u32> = guest.used().iter().map(|&(h, _)| h).collect();
    assert_eq!(heads, [0, 3, 6, 9, 12]);
    for head in [9u16, 12] {
        assert_eq!(guest.byte(status(head)), 0);
        let at = u64::from(head) * 512;
        let want: Vec<u8> = (0..512).map(|i| volume_byte(at + i)).collect();
        assert_eq!(guest.bytes(read(head).addr, 512), want, "head {head}");
    }
    drop(destination);
    backend.stop();
}
