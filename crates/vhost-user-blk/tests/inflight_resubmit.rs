//! A backend crash with requests in flight, end to end: the test plays the
//! frontend (QEMU's part) with the `vhost` crate's `Frontend` over the
//! server's unix socket, with guest memory in a memfd shared through
//! VHOST_USER_SET_MEM_TABLE and the rings built by hand in it.
//!
//! The first server takes four requests: a read, which completes, and
//! three writes, which its device holds. It then "crashes": its runtime is
//! dropped with the writes pending, so nothing more reaches the used ring.
//! The guest queues a fifth request meanwhile. A second server, given the
//! same inflight area (VHOST_USER_SET_INFLIGHT_FD) and guest memory, must
//! run the three writes again and the fifth request, return each to the
//! used ring exactly once, and not run the read again.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd};
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::watch;
use vhost::vhost_user::message::{VhostUserInflight, VhostUserProtocolFeatures};
use vhost::vhost_user::{Frontend, VhostUserFrontend, VhostUserVirtioFeatures};
use vhost::{VhostBackend, VhostUserMemoryRegionInfo, VringConfigData};
use vhost_user_blk::inflight::InflightArea;
use vhost_user_blk::{bind, BlockDevice, DeviceProvider, Server, ServerConfig};
use virtio_queue::desc::split::Descriptor;
use vm_memory::{Bytes, FileOffset, GuestAddress, GuestMemoryBackend, GuestMemoryMmap};
use vmm_sys_util::eventfd::EventFd;

const MEM_BYTES: usize = 1 << 20;
const QUEUE_SIZE: u16 = 16;
const DESC: u64 = 0x0;
const AVAIL: u64 = 0x1000;
const USED: u64 = 0x2000;
const VOLUME_BYTES: usize = 1 << 20;

const NEXT: u16 = 1;
const WRITE: u16 = 2;
const T_IN: u32 = 0;
const T_OUT: u32 = 1;

const EVENT_IDX_BIT: u64 = 1 << 29;

// ---- the device: writes wait for a gate ---------------------------------

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Event {
    /// (server, offset)
    ReadDone(u8, u64),
    WriteStarted(u8, u64),
    WriteDone(u8, u64),
}

/// What every device instance saw, and the volume they share.
#[derive(Default)]
struct Shared {
    volume: Mutex<Vec<u8>>,
    events: Mutex<Vec<Event>>,
}

impl Shared {
    fn events(&self) -> Vec<Event> {
        self.events.lock().unwrap().clone()
    }

    fn count(&self, f: impl Fn(&Event) -> bool) -> usize {
        self.events().iter().filter(|e| f(e)).count()
    }
}

/// One server's device: reads at once, writes once its gate opens.
struct GatedDevice {
    server: u8,
    shared: Arc<Shared>,
    gate: watch::Receiver<bool>,
}

impl GatedDevice {
    fn log(&self, e: Event) {
        self.shared.events.lock().unwrap().push(e);
    }
}

impl BlockDevice for GatedDevice {
    fn size_bytes(&self) -> u64 {
        VOLUME_BYTES as u64
    }

    fn is_read_only(&self) -> bool {
        false
    }

    fn id(&self) -> String {
        "inflight".to_string()
    }

    async fn read(&self, offset_bytes: u64, buf: &mut [u8]) -> io::Result<()> {
        let at = offset_bytes as usize;
        buf.copy_from_slice(&self.shared.volume.lock().unwrap()[at..at + buf.len()]);
        self.log(Event::ReadDone(self.server, offset_bytes));
        Ok(())
    }

    async fn write(&self, offset_bytes: u64, data: &[u8]) -> io::Result<()> {
        self.log(Event::WriteStarted(self.server, offset_bytes));
        let mut gate = self.gate.clone();
        gate.wait_for(|open| *open)
            .await
            .map_err(|_| io::Error::other("gate dropped"))?;
        let at = offset_bytes as usize;
        self.shared.volume.lock().unwrap()[at..at + data.len()].copy_from_slice(data);
        self.log(Event::WriteDone(self.server, offset_bytes));
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

struct Provider(Arc<GatedDevice>);

impl DeviceProvider for Provider {
    type Device = GatedDevice;

    async fn open(&self, _name: &str) -> io::Result<Arc<GatedDevice>> {
        Ok(self.0.clone())
    }
}

/// A server on its own runtime, with its device's gate.
struct Backend {
    runtime: tokio::runtime::Runtime,
    server: Arc<Server<Provider>>,
    gate: watch::Sender<bool>,
}

fn start_backend(server_no: u8, shared: &Arc<Shared>, socket: &Path) -> Backend {
    let (gate, rx) = watch::channel(false);
    let device = Arc::new(GatedDevice {
        server: server_no,
        shared: shared.clone(),
        gate: rx,
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
    let server = Server::new(Arc::new(Provider(device)), config);
    let listener = bind(socket).unwrap();
    runtime
        .block_on(async { server.serve("vol", listener) })
        .unwrap();
    Backend {
        runtime,
        server,
        gate,
    }
}

// ---- the guest: memory and rings --------------------------------------

fn memfd(name: &std::ffi::CStr, bytes: usize) -> File {
    // SAFETY: memfd_create takes a NUL-terminated name and flags; the
    // descriptor it returns is owned by the File alone.
    let fd = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
    assert!(fd >= 0, "memfd_create: {}", io::Error::last_os_error());
    // SAFETY: fd was just created and nothing else owns it.
    let file = unsafe { File::from_raw_fd(fd) };
    file.set_len(bytes as u64).unwrap();
    file
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
        let file = memfd(c"guest-memory", MEM_BYTES);
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

    fn vring_config(&self) -> VringConfigData {
        VringConfigData {
            queue_max_size: QUEUE_SIZE,
            queue_size: QUEUE_SIZE,
            flags: 0,
            desc_table_addr: self.host_base + DESC,
            used_ring_addr: self.host_base + USED,
            avail_ring_addr: self.host_base + AVAIL,
            log_addr: None,
        }
    }

    fn header_addr(head: u16) -> u64 {
        0x10000 + 0x100 * u64::from(head)
    }

    fn data_addr(head: u16) -> u64 {
        0x20000 + 0x1000 * u64::from(head)
    }

    fn status_addr(head: u16) -> u64 {
        0x30000 + u64::from(head)
    }

    /// Request `kind` of one sector at `sector` as the chain head, head+1,
    /// head+2 (header, data, status), made available. A write's data is
    /// `fill` repeated.
    fn submit(&mut self, head: u16, kind: u32, sector: u64, fill: u8) {
        let mut header = [0u8; 16];
        header[0..4].copy_from_slice(&kind.to_le_bytes());
        header[8..16].copy_from_slice(&sector.to_le_bytes());
        let m = &self.mem;
        m.write_slice(&header, GuestAddress(Self::header_addr(head)))
            .unwrap();
        m.write_slice(&[fill; 512], GuestAddress(Self::data_addr(head)))
            .unwrap();
        m.write_obj(0xffu8, GuestAddress(Self::status_addr(head)))
            .unwrap();
        let data_flags = if kind == T_IN { WRITE } else { 0 };
        let descs = [
            (Self::header_addr(head), 16, NEXT),
            (Self::data_addr(head), 512, data_flags | NEXT),
            (Self::status_addr(head), 1, WRITE),
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

    fn status(&self, head: u16) -> u8 {
        self.mem
            .read_obj(GuestAddress(Self::status_addr(head)))
            .unwrap()
    }

    fn data(&self, head: u16) -> Vec<u8> {
        let mut v = vec![0u8; 512];
        self.mem
            .read_slice(&mut v, GuestAddress(Self::data_addr(head)))
            .unwrap();
        v
    }
}

/// The frontend's side of one connection.
struct Connection {
    _frontend: Frontend,
    kick: EventFd,
    _call: EventFd,
}

/// Negotiates as QEMU does and starts queue 0 at `base`. `inflight`:
/// the area to give (a reconnect), or None to ask the backend for one.
fn connect(
    socket: &Path,
    guest: &Guest,
    inflight: Option<&(VhostUserInflight, File)>,
    base: u16,
) -> (Connection, Option<(VhostUserInflight, File)>) {
    let mut frontend = Frontend::connect(socket, 1).unwrap();
    frontend.set_owner().unwrap();
    let offered = frontend.get_features().unwrap();
    assert_ne!(
        offered & VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits(),
        0
    );
    frontend.set_features(offered & !EVENT_IDX_BIT).unwrap();
    let protocol = frontend.get_protocol_features().unwrap();
    assert!(protocol.contains(VhostUserProtocolFeatures::INFLIGHT_SHMFD));
    frontend
        .set_protocol_features(
            VhostUserProtocolFeatures::MQ | VhostUserProtocolFeatures::INFLIGHT_SHMFD,
        )
        .unwrap();
    assert_eq!(frontend.get_queue_num().unwrap(), 1);
    let created = match inflight {
        Some(_) => None,
        None => {
            let ask = VhostUserInflight {
                mmap_size: 0,
                mmap_offset: 0,
                num_queues: 1,
                queue_size: QUEUE_SIZE,
            };
            let (info, file) = frontend.get_inflight_fd(&ask).unwrap();
            assert_eq!((info.num_queues, info.queue_size), (1, QUEUE_SIZE));
            assert!(info.mmap_size > 0);
            Some((info, file))
        }
    };
    let (info, file) = inflight.or(created.as_ref()).unwrap();
    frontend.set_inflight_fd(info, file.as_raw_fd()).unwrap();
    frontend.set_mem_table(&[guest.region_info()]).unwrap();
    frontend.set_vring_num(0, QUEUE_SIZE).unwrap();
    frontend.set_vring_addr(0, &guest.vring_config()).unwrap();
    frontend.set_vring_base(0, base).unwrap();
    let call = EventFd::new(libc::EFD_NONBLOCK).unwrap();
    let kick = EventFd::new(libc::EFD_NONBLOCK).unwrap();
    frontend.set_vring_call(0, &call).unwrap();
    frontend.set_vring_kick(0, &kick).unwrap();
    frontend.set_vring_enable(0, true).unwrap();
    // Without REPLY_ACK the messages above are not answered: a request
    // that is answered shows the backend took them all and is still there.
    assert_eq!(frontend.get_features().unwrap(), offered);
    (
        Connection {
            _frontend: frontend,
            kick,
            _call: call,
        },
        created,
    )
}

#[track_caller]
fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn requests_in_flight_at_a_crash_are_resubmitted_once_and_returned_ones_are_not() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("vol.sock");
    let shared = Arc::new(Shared::default());
    shared.volume.lock().unwrap().resize(VOLUME_BYTES, 0x11);
    let mut guest = Guest::new();
    let (read, writes) = (0u16, [3u16, 6, 9]);
    let late = 12u16;
    let sector_of = |head: u16| u64::from(head) * 8;

    // The first server takes a read and three writes; the writes hang.
    let first = start_backend(1, &shared, &socket);
    let (conn, inflight) = connect(&socket, &guest, None, 0);
    let inflight = inflight.unwrap();
    guest.submit(read, T_IN, sector_of(read), 0);
    for (i, &head) in writes.iter().enumerate() {
        guest.submit(head, T_OUT, sector_of(head), 0xa0 + i as u8);
    }
    conn.kick.write(1).unwrap();
    wait_until("the first server started the three writes", || {
        shared.count(|e| matches!(e, Event::WriteStarted(1, _))) == 3
    });
    wait_until("the read is returned", || guest.used_idx() == 1);
    assert_eq!(guest.used(), vec![(u32::from(read), 513)]);
    assert_eq!(guest.status(read), 0);
    assert_eq!(guest.data(read), vec![0x11; 512]);

    // The crash: the runtime goes with the writes still pending, then the
    // connection closes. Nothing more is returned.
    first.runtime.shutdown_timeout(Duration::from_secs(10));
    drop(conn);
    drop(first.gate);
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(guest.used_idx(), 1, "a crashed backend returned a request");
    assert_eq!(shared.count(|e| matches!(e, Event::WriteDone(..))), 0);

    // The guest queues another request while no backend runs.
    guest.submit(late, T_OUT, sector_of(late), 0xbb);

    // The second server, on the same inflight area and guest memory. The
    // frontend resumes the ring at the used index (QEMU's
    // virtio_queue_restore_last_avail_idx after a lost backend).
    let second = start_backend(2, &shared, &socket);
    let (conn, none) = connect(&socket, &guest, Some(&inflight), guest.used_idx());
    assert!(none.is_none());
    wait_until("the second server started four writes", || {
        shared.count(|e| matches!(e, Event::WriteStarted(2, _))) >= 4
    });
    std::thread::sleep(Duration::from_millis(100));
    let mut started: Vec<u64> = shared
        .events()
        .iter()
        .filter_map(|e| match e {
            Event::WriteStarted(2, at) => Some(*at),
            _ => None,
        })
        .collect();
    started.sort_unstable();
    let expected: Vec<u64> = writes
        .iter()
        .chain([&late])
        .map(|&h| sector_of(h) * 512)
        .collect();
    assert_eq!(started, expected, "the writes resubmitted and the late one");
    assert_eq!(guest.used_idx(), 1, "returned before the writes completed");

    // Let them complete: each returned once, the read never run again.
    second.gate.send(true).unwrap();
    wait_until("all five requests are returned", || guest.used_idx() == 5);
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(guest.used_idx(), 5, "a request was returned twice");
    let mut used = guest.used();
    assert_eq!(used.remove(0), (u32::from(read), 513));
    used.sort_unstable();
    let want: Vec<(u32, u32)> = writes
        .iter()
        .chain([&late])
        .map(|&h| (u32::from(h), 1))
        .collect();
    assert_eq!(used, want);
    for &head in writes.iter().chain([&late]) {
        assert_eq!(guest.status(head), 0, "status of head {head}");
    }
    assert_eq!(
        shared.count(|e| matches!(e, Event::ReadDone(..))),
        1,
        "the returned read ran again: {:?}",
        shared.events()
    );
    assert_eq!(shared.count(|e| matches!(e, Event::WriteDone(2, _))), 4);
    let volume = shared.volume.lock().unwrap().clone();
    for (i, &head) in writes.iter().enumerate() {
        let at = (sector_of(head) * 512) as usize;
        assert_eq!(volume[at..at + 512], [0xa0 + i as u8; 512], "head {head}");
    }
    let at = (sector_of(late) * 512) as usize;
    assert_eq!(volume[at..at + 512], [0xbb; 512]);

    // A clean stop, and nothing left in flight for a third backend.
    drop(conn);
    second.runtime.block_on(second.server.shutdown());
    drop(second.runtime);
    let (info, file) = inflight;
    let area = InflightArea::map(file, info.mmap_offset, info.mmap_size, 1, QUEUE_SIZE).unwrap();
    let left = area.queue(0, QUEUE_SIZE).unwrap().recover(5).unwrap();
    assert_eq!(left.resubmit, Vec::<u16>::new());
}
