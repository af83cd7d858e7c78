//! Inflight I/O tracking (VHOST_USER_PROTOCOL_F_INFLIGHT_SHMFD): a shared
//! memory area, kept by the frontend across backend restarts, that says
//! which requests the backend had taken from a queue and not yet
//! returned. A restarted backend resubmits exactly those, oldest first,
//! so a request in flight at a crash is neither lost nor failed.
//!
//! Byte layout, per queue, as QEMU's libvhost-user defines it for split
//! rings (docs/interop/vhost-user.rst, "Inflight I/O tracking"), native
//! endian (the frontend and backend share a host):
//!
//! | offset | field |
//! | --- | --- |
//! | 0 | features (u64) |
//! | 8 | version (u16): 0 until the backend first uses the area |
//! | 10 | desc_num (u16): the queue size |
//! | 12 | last_batch_head (u16): the head being returned |
//! | 14 | used_idx (u16): the used index after the last return |
//! | 16 + 16 × i | descriptor i: inflight (u8), padding (5), next (u16), counter (u64) |
//!
//! each queue's part rounded up to 64 bytes. Returning a request is three
//! steps: last_batch_head = head; the used ring entry and its index;
//! inflight[head] = 0 and used_idx = the new index. A crash between the
//! second and third leaves used_idx behind the ring's: the head in
//! last_batch_head was returned, and recovery clears it.
//!
//! The area is written by the guest's host (the frontend) too, so
//! recovery checks everything it reads: the queue size, each head, each
//! flag.

use std::fs::File;
use std::os::fd::FromRawFd;
use std::sync::atomic::{fence, Ordering};
use std::sync::Arc;

use vm_memory::{Bytes, FileOffset, MmapRegion, VolatileMemory};

/// Version written into an area the backend starts using.
const INFLIGHT_VERSION: u16 = 1;
const HEADER_BYTES: usize = 16;
const DESC_BYTES: usize = 16;
const ALIGNMENT: usize = 64;
/// The largest queue this backend accepts (virtio's split-ring maximum is
/// 32768; QEMU's is 1024).
pub const MAX_QUEUE_SIZE: u16 = 1024;

/// Bytes of one queue's part of the area.
pub fn queue_area_bytes(queue_size: u16) -> usize {
    (HEADER_BYTES + DESC_BYTES * usize::from(queue_size)).div_ceil(ALIGNMENT) * ALIGNMENT
}

/// A new, zeroed area for `num_queues` queues of `queue_size`, as a memfd
/// the frontend keeps (VHOST_USER_GET_INFLIGHT_FD).
pub fn create_area(num_queues: u16, queue_size: u16) -> Result<(File, u64), String> {
    if num_queues == 0 || queue_size == 0 || queue_size > MAX_QUEUE_SIZE {
        return Err(format!(
            "inflight area for {num_queues} queues of {queue_size}: 1..{MAX_QUEUE_SIZE} descriptors and at least one queue needed"
        ));
    }
    let bytes = (queue_area_bytes(queue_size) * usize::from(num_queues)) as u64;
    // SAFETY: memfd_create takes a NUL-terminated name and flags and
    // returns a new descriptor (or -1), which the File then owns.
    let fd = unsafe { libc::memfd_create(c"strata-vhost-inflight".as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(format!(
            "memfd_create for the inflight area: {}",
            std::io::Error::last_os_error()
        ));
    }
    // SAFETY: fd was just created and is owned by nothing else.
    let file = unsafe { File::from_raw_fd(fd) };
    file.set_len(bytes)
        .map_err(|e| format!("sizing the inflight area to {bytes} bytes: {e}"))?;
    Ok((file, bytes))
}

/// The area the frontend gave (VHOST_USER_SET_INFLIGHT_FD), mapped.
pub struct InflightArea {
    region: MmapRegion,
    num_queues: u16,
    queue_size: u16,
}

impl InflightArea {
    /// Maps `file` at `offset`; its `size_bytes` must hold `num_queues`
    /// queues of `queue_size`.
    pub fn map(
        file: File,
        offset: u64,
        size_bytes: u64,
        num_queues: u16,
        queue_size: u16,
    ) -> Result<Arc<InflightArea>, String> {
        let need = (queue_area_bytes(queue_size) * usize::from(num_queues)) as u64;
        if num_queues == 0 || queue_size == 0 || queue_size > MAX_QUEUE_SIZE || size_bytes < need {
            return Err(format!(
                "inflight area of {size_bytes} bytes for {num_queues} queues of {queue_size} descriptors (needs {need} bytes, at most {MAX_QUEUE_SIZE} descriptors)"
            ));
        }
        let region = MmapRegion::from_file(FileOffset::new(file, offset), need as usize)
            .map_err(|e| format!("mapping the inflight area: {e}"))?;
        Ok(Arc::new(InflightArea {
            region,
            num_queues,
            queue_size,
        }))
    }

    /// The part of queue `index`, if the area has one of that size.
    pub fn queue(self: &Arc<Self>, index: u16, queue_size: u16) -> Option<InflightQueue> {
        (index < self.num_queues && queue_size == self.queue_size).then(|| InflightQueue {
            area: self.clone(),
            base: queue_area_bytes(self.queue_size) * usize::from(index),
            desc_num: queue_size,
        })
    }
}

/// What recovery found in a queue's part of the area.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Recovered {
    /// Heads taken and not returned, oldest first: to resubmit.
    pub resubmit: Vec<u16>,
    /// The next counter to give a taken head.
    pub next_counter: u64,
}

/// One queue's part of the area.
pub struct InflightQueue {
    area: Arc<InflightArea>,
    base: usize,
    desc_num: u16,
}

impl InflightQueue {
    fn put<T: vm_memory::ByteValued>(&self, at: usize, v: T) {
        // Offsets are within the mapped part (checked at map time), so
        // this cannot fail; if it did, tracking is lost, not memory.
        if let Err(e) = self
            .area
            .region
            .as_volatile_slice()
            .write_obj(v, self.base + at)
        {
            tracing::error!(error = %e, "inflight area write failed");
        }
    }

    fn get<T: vm_memory::ByteValued + Default>(&self, at: usize) -> T {
        self.area
            .region
            .as_volatile_slice()
            .read_obj(self.base + at)
            .unwrap_or_default()
    }

    fn desc_at(head: u16) -> usize {
        HEADER_BYTES + DESC_BYTES * usize::from(head)
    }

    /// Reads what a previous backend left, given the used index in the
    /// guest's ring now. A fresh area (version 0) is taken into use.
    pub fn recover(&self, ring_used_idx: u16) -> Result<Recovered, String> {
        let version: u16 = self.get(8);
        if version == 0 {
            self.put(10, self.desc_num);
            self.put(14, ring_used_idx);
            fence(Ordering::SeqCst);
            self.put(8, INFLIGHT_VERSION);
            return Ok(Recovered::default());
        }
        let desc_num: u16 = self.get(10);
        if desc_num != self.desc_num {
            return Err(format!(
                "inflight area says {desc_num} descriptors, the queue has {}",
                self.desc_num
            ));
        }
        let used_idx: u16 = self.get(14);
        if used_idx != ring_used_idx {
            // Crashed between the used ring's index and clearing the flag:
            // last_batch_head was returned.
            let last: u16 = self.get(12);
            if last >= self.desc_num {
                return Err(format!(
                    "inflight area's last head {last} is past the queue"
                ));
            }
            self.put(Self::desc_at(last), 0u8);
            fence(Ordering::SeqCst);
            self.put(14, ring_used_idx);
        }
        let mut taken = Vec::new();
        for head in 0..self.desc_num {
            match self.get::<u8>(Self::desc_at(head)) {
                0 => {}
                1 => taken.push((self.get::<u64>(Self::desc_at(head) + 8), head)),
                other => return Err(format!("inflight flag {other} for head {head}")),
            }
        }
        taken.sort_unstable();
        let next_counter = taken.last().map_or(0, |(c, _)| c.wrapping_add(1));
        Ok(Recovered {
            resubmit: taken.into_iter().map(|(_, h)| h).collect(),
            next_counter,
        })
    }

    /// Head `head` was taken from the available ring, as the `counter`-th.
    pub fn taken(&self, head: u16, counter: u64) {
        let at = Self::desc_at(head);
        self.put(at + 8, counter);
        fence(Ordering::SeqCst);
        self.put(at, 1u8);
    }

    /// About to put `head` in the used ring.
    pub fn returning(&self, head: u16) {
        self.put(12, head);
        fence(Ordering::SeqCst);
    }

    /// `head` is in the used ring, whose index is now `used_idx`.
    pub fn returned(&self, head: u16, used_idx: u16) {
        fence(Ordering::SeqCst);
        self.put(Self::desc_at(head), 0u8);
        fence(Ordering::SeqCst);
        self.put(14, used_idx);
    }

    pub fn desc_num(&self) -> u16 {
        self.desc_num
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn area(queues: u16, size: u16) -> Arc<InflightArea> {
        let (file, bytes) = create_area(queues, size).unwrap();
        InflightArea::map(file, 0, bytes, queues, size).unwrap()
    }

    #[test]
    fn a_fresh_area_has_nothing_to_resubmit() {
        let a = area(2, 128);
        let q = a.queue(1, 128).unwrap();
        assert_eq!(q.recover(7).unwrap(), Recovered::default());
        assert!(a.queue(2, 128).is_none(), "queue past the area");
        assert!(a.queue(0, 256).is_none(), "another queue size");
    }

    #[test]
    fn taken_heads_come_back_oldest_first_and_returned_ones_do_not() {
        let a = area(1, 8);
        let q = a.queue(0, 8).unwrap();
        q.recover(0).unwrap();
        for (counter, head) in [(0u64, 5u16), (1, 2), (2, 7), (3, 0)] {
            q.taken(head, counter);
        }
        q.returning(2);
        q.returned(2, 1);
        // A crash after the used index moved but before the flag was
        // cleared: the ring says 2, the area 1, last head 7.
        q.returning(7);
        let again = a.queue(0, 8).unwrap();
        let r = again.recover(2).unwrap();
        assert_eq!(r.resubmit, vec![5, 0]);
        assert_eq!(r.next_counter, 4);
    }

    #[test]
    fn a_corrupt_area_is_refused_not_trusted() {
        let a = area(1, 8);
        let q = a.queue(0, 8).unwrap();
        q.recover(0).unwrap();
        q.put(InflightQueue::desc_at(3), 9u8);
        assert!(q.recover(0).unwrap_err().contains("flag 9"));
        q.put(InflightQueue::desc_at(3), 0u8);
        q.put(12, 200u16);
        assert!(q.recover(5).unwrap_err().contains("past the queue"));
        q.put(10, 16u16);
        assert!(q.recover(0).unwrap_err().contains("16 descriptors"));
    }

    #[test]
    fn sizes_are_bounded() {
        assert!(create_area(0, 128).is_err());
        assert!(create_area(1, MAX_QUEUE_SIZE + 1).is_err());
        let (file, bytes) = create_area(1, 128).unwrap();
        assert!(InflightArea::map(file, 0, bytes - 1, 1, 128).is_err());
    }
}
