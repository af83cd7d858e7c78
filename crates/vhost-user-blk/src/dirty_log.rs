//! The dirty log of a live migration: which guest pages this backend
//! wrote while the frontend copies guest memory to another host
//! (VHOST_F_LOG_ALL with VHOST_USER_PROTOCOL_F_LOG_SHMFD,
//! docs/interop/vhost-user.rst, "Migration"). Owns the log area the
//! frontend shares (VHOST_USER_SET_LOG_BASE), whether logging is on, the
//! marking of pages in the area, the rule that the area covers what is
//! logged, and where each ring's used-ring writes are logged
//! (VHOST_VRING_F_LOG and `log_guest_addr` of VHOST_USER_SET_VRING_ADDR).
//!
//! The log is a bitmap over guest physical addresses, from the area's
//! offset in its file: bit `p % 8` of byte `p / 8` is the 4 KiB page `p`.
//! The frontend reads and clears it while the backend writes (QEMU swaps
//! 64-bit words with zero), so a bit is only ever set by an atomic OR,
//! after the write it records, with Release ordering: a frontend that
//! sees the bit and then copies the page copies what was written.
//!
//! Why explicit marking rather than `vm-memory`'s dirty bitmap (a
//! `GuestMemoryMmap<B>` whose bitmap sees every write, as
//! vhost-user-backend's `BitmapMmapRegion` does):
//! - the spec logs a ring's used-ring writes at that ring's
//!   `log_guest_addr`, and only while its flags have VHOST_VRING_F_LOG; a
//!   bitmap under the memory regions knows guest addresses, not rings;
//! - logging follows VHOST_F_LOG_ALL (on at the start of a migration, off
//!   at its end); a bitmap under the memory marks whenever a log is set
//!   (vhost-user-backend's keeps marking after the migration);
//! - this backend writes guest memory in few places, all on the queue
//!   worker's completion path: the data of a read or a GET_ID, the status
//!   byte, and the used ring (an element and the index on each return,
//!   the flags or avail_event around each batch). A bitmap under the
//!   memory would cost a lock or an atomic pointer on every write through
//!   `vm-memory`, migration or not, and change the memory's type in every
//!   module; here a worker pays one relaxed load (`DirtyLog::writer`) per
//!   completed request, or per batch for the notification fields, when no
//!   migration runs.
//!
//! An area serves one period of logging: from VHOST_USER_SET_LOG_BASE
//! until VHOST_F_LOG_ALL goes off. QEMU frees its log when logging stops
//! and sends a new one when it starts again; an old area kept would only
//! make a later, larger memory table fail against a size nobody reads any
//! more.

use std::fs::File;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};

use parking_lot::{MappedRwLockReadGuard, RwLock, RwLockReadGuard};
use vm_memory::{FileOffset, MmapRegion, VolatileMemory};

/// Bytes of guest memory one bit of the log stands for (VHOST_LOG_PAGE).
pub const LOG_PAGE_BYTES: u64 = 0x1000;
/// The largest log accepted: 1 GiB covers 32 TiB of guest physical
/// address space (QEMU sends one bit per page up to the end of the
/// highest region, in 8-byte words: 16 KiB for 512 MiB from address 0).
pub const MAX_LOG_BYTES: u64 = 1 << 30;

// A split ring's used ring (virtio 1.2 §2.7.8): flags (le16), idx (le16),
// the elements, avail_event (le16).
/// Offset of the used ring's flags.
pub const USED_FLAGS_OFFSET: u64 = 0;
/// Offset of the used ring's idx.
pub const USED_IDX_OFFSET: u64 = 2;
/// Offset of the used ring's first element.
pub const USED_RING_OFFSET: u64 = 4;
/// Bytes of a used element: id (le32), len (le32).
pub const USED_ELEM_BYTES: u64 = 8;

/// Bytes of the used ring of a queue of `size` descriptors, avail_event
/// included.
pub fn used_ring_bytes(size: u16) -> u64 {
    USED_RING_OFFSET + USED_ELEM_BYTES * u64::from(size) + 2
}

/// Bytes a log needs to have a bit for every page of `len_bytes` at
/// `addr`; None when the range wraps the address space.
pub fn log_bytes_needed(addr: u64, len_bytes: u64) -> Option<u64> {
    if len_bytes == 0 {
        return Some(0);
    }
    let last = addr.checked_add(len_bytes - 1)?;
    Some(last / LOG_PAGE_BYTES / 8 + 1)
}

/// Ok when a log of `log_bytes` has a bit for every page of `what`, else
/// why not (with the size the frontend should have sent).
pub fn check_covered(log_bytes: u64, what: &str, addr: u64, len_bytes: u64) -> Result<(), String> {
    let Some(needed) = log_bytes_needed(addr, len_bytes) else {
        return Err(format!(
            "{what} at {addr:#x} of {len_bytes} bytes wraps the address space: it cannot be logged"
        ));
    };
    if needed <= log_bytes {
        return Ok(());
    }
    Err(format!(
        "the dirty log of {log_bytes} bytes covers guest addresses below {:#x}, but {what} reaches {:#x}: a log of at least {needed} bytes is needed (one bit per 4 KiB page from guest address 0)",
        log_bytes.saturating_mul(8 * LOG_PAGE_BYTES),
        addr.saturating_add(len_bytes),
    ))
}

/// The byte index and bit mask of each byte of the log holding pages
/// `first_page..=last_page` (a byte holds 8 pages).
fn page_masks(first_page: u64, last_page: u64) -> impl Iterator<Item = (u64, u8)> {
    let (first_byte, last_byte) = (first_page / 8, last_page / 8);
    (first_byte..=last_byte).map(move |byte| {
        let low = if byte == first_byte {
            first_page % 8
        } else {
            0
        };
        let high = if byte == last_byte { last_page % 8 } else { 7 };
        // Bits low..=high set.
        let mask = (0xffu8 << low) & (0xffu8 >> (7 - high));
        (byte, mask)
    })
}

/// The log area the frontend shared, mapped read-write.
pub struct LogArea {
    region: MmapRegion,
    /// Where the log starts in the mapping: the mapping starts at the host
    /// page at or below the frontend's offset (mmap needs page alignment,
    /// the protocol does not promise it).
    start: usize,
    size_bytes: u64,
}

impl LogArea {
    /// Maps `size_bytes` of `file` from `offset` (VhostUserLog's
    /// mmap_offset and mmap_size), shared and writable.
    pub fn map(file: File, offset: u64, size_bytes: u64) -> Result<LogArea, String> {
        if size_bytes == 0 || size_bytes > MAX_LOG_BYTES {
            return Err(format!(
                "dirty log of {size_bytes} bytes: 1 to {MAX_LOG_BYTES} bytes accepted"
            ));
        }
        let end = offset
            .checked_add(size_bytes)
            .ok_or_else(|| format!("dirty log at offset {offset:#x} wraps"))?;
        // Touching a mapping past the end of its file kills the process
        // (SIGBUS): the file must hold the whole log now. (QEMU seals its
        // log memfd against shrinking.)
        let meta = file
            .metadata()
            .map_err(|e| format!("dirty log file: {e}"))?;
        if !meta.is_file() {
            return Err("dirty log: the descriptor is not a shared memory file".to_string());
        }
        if meta.len() < end {
            return Err(format!(
                "dirty log of {size_bytes} bytes at offset {offset} in a file of {} bytes",
                meta.len()
            ));
        }
        let page = host_page_bytes();
        let start = offset % page;
        let map_bytes = usize::try_from(start + size_bytes)
            .map_err(|_| format!("dirty log of {size_bytes} bytes does not fit in memory"))?;
        let region = MmapRegion::from_file(FileOffset::new(file, offset - start), map_bytes)
            .map_err(|e| format!("mapping the dirty log: {e}"))?;
        Ok(LogArea {
            region,
            start: start as usize,
            size_bytes,
        })
    }

    pub fn size_bytes(&self) -> u64 {
        self.size_bytes
    }

    /// Marks every page of `len_bytes` at guest address `addr` dirty. The
    /// pages past the log are not marked, and make it an error (the
    /// backend checks that the log covers what it logs, so this means the
    /// frontend broke that contract).
    pub fn mark(&self, addr: u64, len_bytes: u64) -> Result<(), String> {
        if len_bytes == 0 {
            return Ok(());
        }
        let last = addr
            .checked_add(len_bytes - 1)
            .ok_or_else(|| format!("write at {addr:#x} of {len_bytes} bytes wraps"))?;
        let (first_page, last_page) = (addr / LOG_PAGE_BYTES, last / LOG_PAGE_BYTES);
        let log_pages = self.size_bytes * 8;
        if first_page < log_pages {
            for (byte, mask) in page_masks(first_page, last_page.min(log_pages - 1)) {
                // Within the mapping: byte < size_bytes (a usize, see map).
                let at = self.start + byte as usize;
                let bits = self
                    .region
                    .get_atomic_ref::<AtomicU8>(at)
                    .map_err(|e| format!("dirty log byte {byte}: {e}"))?;
                bits.fetch_or(mask, Ordering::Release);
            }
        }
        check_covered(self.size_bytes, "a write", addr, len_bytes)
    }

    #[cfg(test)]
    fn byte(&self, index: u64) -> u8 {
        self.region
            .get_atomic_ref::<AtomicU8>(self.start + index as usize)
            .map_or(0, |b| b.load(Ordering::Relaxed))
    }
}

fn host_page_bytes() -> u64 {
    // SAFETY: sysconf reads a system constant; no memory is passed.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    u64::try_from(page).unwrap_or(4096).max(1)
}

/// The log being marked: held for the marks of one completion, so a new
/// area (or the end of logging) waits for them and no mark lands in an
/// area the frontend has let go of.
pub type LogWriter<'a> = MappedRwLockReadGuard<'a, LogArea>;

/// A connection's dirty logging: VHOST_F_LOG_ALL and the log area.
pub struct DirtyLog {
    /// LOG_ALL is acked and an area is set: the one load a worker pays
    /// when no migration runs. Relaxed: the area itself is reached under
    /// `state`'s lock. A worker that reads a stale `false` as logging
    /// starts misses only a completion racing the message that started
    /// it, whose pages the frontend's first pass (all of guest memory,
    /// after that message is answered) copies anyway.
    active: AtomicBool,
    state: RwLock<State>,
}

#[derive(Default)]
struct State {
    log_all: bool,
    area: Option<LogArea>,
}

impl Default for DirtyLog {
    fn default() -> Self {
        DirtyLog {
            active: AtomicBool::new(false),
            state: RwLock::new(State::default()),
        }
    }
}

impl DirtyLog {
    fn update(&self, state: &State) {
        self.active
            .store(state.log_all && state.area.is_some(), Ordering::Relaxed);
    }

    /// VHOST_F_LOG_ALL acked or not. Turning it off ends the period of
    /// logging: the area is let go (a new period brings a new one).
    /// Returns the area's size when one was let go.
    pub fn set_log_all(&self, on: bool) -> Option<u64> {
        let mut state = self.state.write();
        let ended = state.log_all && !on;
        state.log_all = on;
        let dropped = if ended { state.area.take() } else { None };
        self.update(&state);
        dropped.map(|a| a.size_bytes())
    }

    /// VHOST_USER_SET_LOG_BASE: `area` replaces the previous one once
    /// every mark in progress is done.
    pub fn set_area(&self, area: LogArea) {
        let mut state = self.state.write();
        state.area = Some(area);
        self.update(&state);
    }

    /// A reset: logging off, no area.
    pub fn clear(&self) {
        let mut state = self.state.write();
        *state = State::default();
        self.update(&state);
    }

    /// The size of the area set, if any (what the memory table and the
    /// rings' log addresses are checked against).
    pub fn area_bytes(&self) -> Option<u64> {
        self.state.read().area.as_ref().map(LogArea::size_bytes)
    }

    /// Whether logging is on and there is an area to mark.
    pub fn is_active(&self) -> bool {
        self.active.load(Ordering::Relaxed)
    }

    /// The area to mark, while logging is on.
    pub fn writer(&self) -> Option<LogWriter<'_>> {
        if !self.is_active() {
            return None;
        }
        let state = self.state.read();
        if !state.log_all {
            return None;
        }
        RwLockReadGuard::try_map(state, |s| s.area.as_ref()).ok()
    }
}

/// Where a ring's used-ring writes are logged: its `log_guest_addr`,
/// while its flags (VHOST_USER_SET_VRING_ADDR) have VHOST_VRING_F_LOG.
/// Shared by the connection and the ring's worker, which sees a change
/// at its next write: the frontend turns it on and off on running rings.
pub struct UsedRingLog(AtomicU64);

/// Not logged. No used ring can be logged at this address: its first
/// byte would be the last of the address space (SET_VRING_ADDR refuses
/// a log address whose ring wraps).
const NOT_LOGGED: u64 = u64::MAX;

impl Default for UsedRingLog {
    fn default() -> Self {
        UsedRingLog(AtomicU64::new(NOT_LOGGED))
    }
}

impl UsedRingLog {
    pub fn set(&self, log_guest_addr: Option<u64>) {
        self.0
            .store(log_guest_addr.unwrap_or(NOT_LOGGED), Ordering::Relaxed);
    }

    pub fn get(&self) -> Option<u64> {
        let addr = self.0.load(Ordering::Relaxed);
        (addr != NOT_LOGGED).then_some(addr)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::os::fd::FromRawFd;

    use super::*;

    fn memfd(bytes: u64) -> File {
        // SAFETY: memfd_create takes a NUL-terminated name and flags; the
        // descriptor it returns is owned by the File alone.
        let fd = unsafe { libc::memfd_create(c"dirty-log-test".as_ptr(), libc::MFD_CLOEXEC) };
        assert!(fd >= 0);
        // SAFETY: fd was just created and nothing else owns it.
        let file = unsafe { File::from_raw_fd(fd) };
        file.set_len(bytes).unwrap();
        file
    }

    fn area(size_bytes: u64) -> LogArea {
        LogArea::map(memfd(size_bytes), 0, size_bytes).unwrap()
    }

    fn bytes(a: &LogArea) -> Vec<u8> {
        (0..a.size_bytes()).map(|i| a.byte(i)).collect()
    }

    const PAGE: u64 = LOG_PAGE_BYTES;

    #[test]
    fn a_write_marks_the_pages_it_touches_and_no_other() {
        let a = area(4);
        // One byte: the page it is in.
        a.mark(5 * PAGE + 17, 1).unwrap();
        assert_eq!(bytes(&a), [0b0010_0000, 0, 0, 0]);
        // The last byte of a page and the first of the next are two pages.
        a.mark(PAGE - 1, 2).unwrap();
        assert_eq!(bytes(&a), [0b0010_0011, 0, 0, 0]);
        // Exactly one page, aligned: one bit.
        a.mark(9 * PAGE, PAGE).unwrap();
        assert_eq!(bytes(&a), [0b0010_0011, 0b0000_0010, 0, 0]);
        // A buffer spanning pages 14..=17: across a byte of the log.
        a.mark(14 * PAGE + 100, 3 * PAGE).unwrap();
        assert_eq!(bytes(&a), [0b0010_0011, 0b1100_0010, 0b0000_0011, 0]);
        // Zero bytes mark nothing.
        a.mark(30 * PAGE, 0).unwrap();
        assert_eq!(bytes(&a)[3], 0);
    }

    #[test]
    fn a_long_write_fills_whole_bytes() {
        let a = area(4);
        a.mark(3 * PAGE, 26 * PAGE).unwrap();
        assert_eq!(bytes(&a), [0b1111_1000, 0xff, 0xff, 0b0001_1111]);
    }

    #[test]
    fn the_last_page_of_the_log_is_marked_and_the_next_is_refused() {
        let a = area(2);
        a.mark(15 * PAGE + PAGE - 1, 1).unwrap();
        assert_eq!(bytes(&a), [0, 0b1000_0000]);
        // Straddling the end: the covered page is marked, the rest is an
        // error that says what size was needed.
        let e = a.mark(15 * PAGE, 2 * PAGE).unwrap_err();
        assert!(e.contains("at least 3 bytes"), "{e}");
        let e = a.mark(16 * PAGE, 1).unwrap_err();
        assert!(e.contains("below 0x10000"), "{e}");
        assert_eq!(bytes(&a), [0, 0b1000_0000]);
        assert!(a.mark(u64::MAX, 2).is_err(), "a wrapping write");
    }

    #[test]
    fn marks_keep_bits_set_by_others() {
        let a = area(1);
        a.region
            .get_atomic_ref::<AtomicU8>(0)
            .unwrap()
            .store(0b1000_0001, Ordering::Relaxed);
        a.mark(2 * PAGE, 1).unwrap();
        assert_eq!(bytes(&a), [0b1000_0101]);
    }

    #[test]
    fn coverage_is_one_bit_per_page_from_address_zero() {
        assert_eq!(log_bytes_needed(0, 1), Some(1));
        assert_eq!(log_bytes_needed(0, 8 * PAGE), Some(1));
        assert_eq!(log_bytes_needed(0, 8 * PAGE + 1), Some(2));
        // 256 MiB of guest memory: 65536 pages, 8 KiB of log.
        assert_eq!(log_bytes_needed(0, 256 << 20), Some(8192));
        assert_eq!(log_bytes_needed(u64::MAX, 2), None);
        assert!(check_covered(8192, "memory", 0, 256 << 20).is_ok());
        let e = check_covered(8191, "guest memory", 0, 256 << 20).unwrap_err();
        assert!(e.contains("at least 8192 bytes"), "{e}");
        assert!(e.contains("reaches 0x10000000"), "{e}");
    }

    #[test]
    fn an_area_is_checked_against_its_file() {
        assert!(LogArea::map(memfd(4096), 0, 0).is_err());
        assert!(LogArea::map(memfd(4096), 0, MAX_LOG_BYTES + 1).is_err());
        let e = LogArea::map(memfd(4096), 4000, 100).err().unwrap();
        assert!(e.contains("file of 4096 bytes"), "{e}");
        assert!(LogArea::map(memfd(4096), u64::MAX, 2).is_err());
        // An offset that is not page aligned is where guest address 0 is.
        let a = LogArea::map(memfd(8192), 4097, 2).unwrap();
        a.mark(9 * PAGE, 1).unwrap();
        assert_eq!(bytes(&a), [0, 0b0000_0010]);
    }

    #[test]
    fn logging_needs_log_all_and_an_area_and_ends_with_log_all() {
        let log = DirtyLog::default();
        assert!(log.writer().is_none());
        log.set_log_all(true);
        assert!(log.writer().is_none(), "no area yet");
        log.set_area(area(1));
        log.writer().unwrap().mark(0, 1).unwrap();
        assert_eq!(log.set_log_all(false), Some(1));
        assert!(log.writer().is_none());
        assert_eq!(log.area_bytes(), None, "the period ended with its area");
        // An area set before LOG_ALL (QEMU's order) is kept when it comes.
        log.set_area(area(2));
        assert_eq!(log.set_log_all(false), None);
        log.set_log_all(true);
        assert_eq!(log.area_bytes(), Some(2));
        assert!(log.writer().is_some());
        log.clear();
        assert!(log.writer().is_none());
    }

    #[test]
    fn a_used_ring_log_address_is_optional() {
        let r = UsedRingLog::default();
        assert_eq!(r.get(), None);
        r.set(Some(0x2000));
        assert_eq!(r.get(), Some(0x2000));
        r.set(None);
        assert_eq!(r.get(), None);
        assert_eq!(used_ring_bytes(16), 4 + 16 * 8 + 2);
    }
}
