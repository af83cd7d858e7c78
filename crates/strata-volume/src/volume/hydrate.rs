//! Hydration of one volume: fetching its stored data into the disk cache
//! in the background until the volume is local (`read/hydration.rs` does
//! the fetching and keeps the progress).
//!
//! Whether it runs is decided at open (`hydration_mode`): `--hydrate on`,
//! or `auto` for a clone or a volume this data directory has no journal of
//! (a host that did not write it); never without a disk cache or on the
//! embedded store (its data is a local file already).
//!
//! First, when the clone's snapshot has an access profile, its ranges in
//! the order a clone first read them (`prefetch_profile`), at most
//! `PROFILE_AHEAD_BYTES` ahead of what a reading client has read (flat
//! out while none reads). Then the main
//! pass: one scan of the extent map in windows looked up under the lock
//! (no I/O under it, at most `MAX_WINDOW_PIECES` pieces each) adds up the
//! stored bytes (the total `volume info` shows) and notes, per stored
//! segment, which of its blocks hold live data (`live_blocks.rs`); then
//! units of one segment's live blocks (up to 32 MiB) are fetched, each
//! through the reader of the volume that owns the segment (a clone's
//! ancestors': clones of one image on one host share its blocks, so the
//! second clone finds them local). Every live block a GET brings is kept:
//! each stored byte is fetched once. Data in memory (open, sealed,
//! settling segments) is local already and not counted.
//!
//! The client first (`run_round`): a reader whose reads stay in a region
//! (`reader_follow.rs`: a boot walking files, a copy) is led: the segment
//! it reads and the next ones are fetched whole, on GET slots of their own
//! (`LiveBlocks::take_lead`), so its next files are local before it asks,
//! and the rest waits while it reads. Beside a reader at random, the rest
//! goes on one unit at a time; with no client reading, `UNITS_IN_FLIGHT`
//! at once, in segment order. Segment indexes are fetched ahead of the
//! units (a reader entering a segment would wait for two GETs otherwise).
//!
//! Restarts: the disk cache survives them, so a restarted hydration finds
//! what is local with no GET and fetches the rest. It stops when the
//! volume closes or is fenced, when the disk cache has no free slot left
//! (it never evicts), or after `MAX_FAILED_UNITS` units in a row fail.

use std::collections::BTreeMap;
use std::ops::Range;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};

use futures::StreamExt;

use super::live_blocks::{LiveBlocks, Unit};
use super::profile::{load_profile, Found, ProfilePlace};
use super::reader_follow::{near_segments, Follow};
use super::Volume;
use crate::config::HydrateMode;
use crate::format::access_profile::AccessProfile;
use crate::map::Target;
use crate::read::{
    hydrate_blocks, hydrate_segment, Coalescing, Gaps, Hydration, HydrationState, SharedCaches,
    VolumeReader, BLOCK_BYTES, MAX_GET_BYTES, MAX_HYDRATION_GETS,
};

/// Volume address space one window covers at most.
const WINDOW_BYTES: u64 = 256 << 20;
/// Stored pieces one window collects at most (the lock is held that long).
const MAX_WINDOW_PIECES: usize = 16_384;
/// Segments of one window hydrated at once (their GETs share the
/// server-wide hydration slots).
const SEGMENTS_IN_FLIGHT: usize = 8;

/// One window's stored pieces, `(seq, segment offset, len)`, and where
/// the next window starts.
type Window = (Vec<(u64, u64, u64)>, u64);

/// Why hydration runs for a volume, or why not (`None`: it does not).
pub(crate) fn hydration_mode(
    mode: HydrateMode,
    store_is_local: bool,
    disk_cache_on: bool,
    is_clone: bool,
    journal_was_here: bool,
) -> (String, bool) {
    let name = mode.as_str();
    match mode {
        HydrateMode::Off => ("off".into(), false),
        _ if store_is_local => (format!("{name}: the store is a local directory"), false),
        _ if !disk_cache_on => (format!("{name}: no disk cache"), false),
        HydrateMode::On => ("on".into(), true),
        HydrateMode::Auto if is_clone => ("auto: a clone".into(), true),
        HydrateMode::Auto if !journal_was_here => ("auto: first open on this host".into(), true),
        HydrateMode::Auto => ("auto: written on this host".into(), false),
    }
}

impl Volume {
    /// Starts hydrating in the background if `self.hydration` says so,
    /// `profile`'s ranges first (those alone when hydration is off).
    pub(crate) fn start_hydration(self: &Arc<Self>, profile: Option<ProfilePlace>) {
        if self.hydration.state() == HydrationState::Off && profile.is_none() {
            return;
        }
        if self.profile_recording.is_some() {
            self.hydration
                .set_profile("recording this clone's first reads".into());
        }
        let weak = Arc::downgrade(self);
        let turns = self.caches.hydrating_volumes.clone();
        tokio::spawn(async move {
            // A bounded number of volumes at once (each holds a window of
            // pieces and its profile in memory); the others wait here.
            let Ok(_turn) = turns.acquire_owned().await else {
                return;
            };
            if let Some(place) = profile {
                let name = name_of(&weak);
                if let Found::Profile(p) = load_profile(&name, &place).await {
                    prefetch_profile(&weak, p).await;
                }
            }
            if weak
                .upgrade()
                .is_some_and(|v| v.hydration.state() != HydrationState::Off)
            {
                hydrate(weak).await;
            }
        });
    }

    /// Appends the stored pieces of volume range `range` that are not in
    /// memory, in address order, up to `max` in `out`; returns where it
    /// stopped (the range's end, or the end of the piece that filled
    /// `out`).
    fn stored_pieces_of(
        &self,
        range: Range<u64>,
        out: &mut Vec<(u64, u64, u64)>,
        max: usize,
    ) -> u64 {
        let end = range.end.min(self.size_bytes());
        if range.start >= end {
            return end;
        }
        let mut stop = end;
        let st = self.state.lock();
        st.map.lookup(range.start, end - range.start, |p| {
            let Some(Target::Data { seq, offset }) = p.target else {
                return;
            };
            if out.len() < max && !st.in_memory(seq) {
                out.push((seq, offset, p.len));
                if out.len() == max {
                    stop = p.start + p.len;
                }
            }
        });
        stop
    }

    fn hydration_should_stop(&self) -> bool {
        self.closed.load(Ordering::Acquire) || self.ownership.fenced().is_some()
    }

    /// The stored pieces of the window starting at `start`, not in memory.
    fn hydration_window(&self, start: u64) -> Window {
        let mut pieces = Vec::new();
        let next = self.stored_pieces_of(
            start..start.saturating_add(WINDOW_BYTES),
            &mut pieces,
            MAX_WINDOW_PIECES,
        );
        (pieces, next)
    }

    /// The readers hydration fetches through: the volume's and its
    /// ancestors'.
    fn hydration_readers(&self) -> Vec<Arc<VolumeReader>> {
        let own = self.reader();
        let mut readers = self.lineage.ancestor_readers(&self.caches, &own);
        readers.push(own);
        readers
    }
}

/// Marks readers as hydrating while alive: their clients' fetches enter
/// the disk cache on the first fetch.
struct Hydrating(Vec<Arc<VolumeReader>>);

impl Hydrating {
    fn new(readers: Vec<Arc<VolumeReader>>) -> Hydrating {
        for r in &readers {
            r.hydrating.fetch_add(1, Ordering::Relaxed);
        }
        Hydrating(readers)
    }
}

impl Drop for Hydrating {
    fn drop(&mut self) {
        for r in &self.0 {
            r.hydrating.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

/// Volume bytes of a profile's ranges hydrated as one batch (in order;
/// inside a batch, segments in parallel).
const PROFILE_BATCH_BYTES: u64 = 32 << 20;
/// How far the profile's prefetch runs ahead of what a reading client has
/// read: about a second of a boot's reads at 100 MB/s, several batches at
/// 20 ms a GET. Why paced: a later clone's boot reads the profile's ranges
/// in about the prefetch's order, each a hit once the prefetch is ahead.
/// Fetched flat out (1 GiB in ~4 s at 20 ms on a 2-core host), its GETs,
/// decoding and disk writes, with the store beside them, kept the CPUs
/// busy while the boot's requests, one after the other, each waited a
/// little longer for one: with every read a hit (`coldboot-big`, later
/// clone) the read took 1.15-1.42x the same read once local. Paced, the
/// same bytes come in over the whole read.
const PROFILE_AHEAD_BYTES: u64 = 128 << 20;
/// How often a held prefetch looks at the client again.
const PACE_TICK_MS: u64 = 10;
/// A profile's blocks this close in a segment share one GET: a boot's
/// reads are many small files' blocks, and what lies between them is
/// mostly not local yet either (measured: a whole-image profile took
/// 1,900 GETs of ~130 KiB with no gap, where address order takes 75).
const PROFILE_GAPS: Gaps = Gaps {
    coalescing: Coalescing {
        max_gap_bytes: 256 << 10,
        max_get_bytes: MAX_GET_BYTES,
    },
    cache_between: true,
    lead: false,
    yields: false,
};
/// The main pass: missing blocks up to 1 MiB apart share a GET, and only
/// they are written. Measured: with no gap, a volume under a client's
/// random reads (blocks it read already local, scattered) hydrated in
/// 1,587 GETs averaging 0.7 MiB, 8.0 s for 1 GiB at 20 ms a request.
const HYDRATION_GAPS: Gaps = Gaps {
    coalescing: Coalescing {
        max_gap_bytes: 1 << 20,
        max_get_bytes: MAX_GET_BYTES,
    },
    cache_between: false,
    lead: false,
    yields: true,
};
/// The main pass planned while a client reads: GETs of 2 MiB, so a read
/// that needs a block such a GET is fetching waits about what its own
/// GET would take, not an 8 MiB transfer.
const BESIDE_CLIENT_GAPS: Gaps = Gaps {
    coalescing: Coalescing {
        max_gap_bytes: 1 << 20,
        max_get_bytes: 2 << 20,
    },
    ..HYDRATION_GAPS
};
/// Units ahead of a reader: GETs of 2 MiB, on slots of their own, so the
/// blocks right after the reader arrive first (measured at 20 ms through
/// the proxy beside hydration: an 8 MiB GET took ~200 ms to arrive, as
/// long as the reader takes to read 23 MB).
const LEAD_GAPS: Gaps = Gaps {
    coalescing: Coalescing {
        max_gap_bytes: 1 << 20,
        max_get_bytes: 2 << 20,
    },
    cache_between: false,
    lead: true,
    yields: false,
};

/// Fetches a profile's ranges into the disk cache, in the order they were
/// first read, before any client asks (the guest's boot reads them next).
async fn prefetch_profile(weak: &Weak<Volume>, profile: AccessProfile) {
    let Some(vol) = weak.upgrade() else { return };
    let h = vol.hydration.clone();
    let marks = Hydrating::new(vol.hydration_readers());
    let (count, bytes) = (profile.ranges.len(), profile.bytes());
    h.set_profile(format!(
        "prefetching {count} ranges ({bytes} bytes) in the order a clone first read them"
    ));
    tracing::info!(volume = %vol.name, ranges = count, bytes, "prefetching the snapshot's access profile");
    drop(vol);
    let mut local = 0u64;
    let mut batch: Vec<(u64, u64, u64)> = Vec::new();
    let mut batch_bytes = 0u64;
    let mut sent_bytes = 0u64;
    let last = profile.ranges.len().saturating_sub(1);
    for (i, r) in profile.ranges.iter().enumerate() {
        let Some(vol) = weak.upgrade() else { return };
        if vol.hydration_should_stop() {
            return;
        }
        // A range is at most 32 MiB (`MAX_RANGE_BYTES`), so its pieces are
        // bounded; the batch is sent once it holds a window's worth.
        let range = r.offset..r.offset.saturating_add(r.len);
        vol.stored_pieces_of(range, &mut batch, usize::MAX);
        batch_bytes += r.len;
        if batch_bytes >= PROFILE_BATCH_BYTES || batch.len() >= MAX_WINDOW_PIECES || i == last {
            drop(vol);
            while prefetch_holds(&h, &marks.0, sent_bytes) {
                tokio::time::sleep(std::time::Duration::from_millis(PACE_TICK_MS)).await;
            }
            let Some(vol) = weak.upgrade().filter(|v| !v.hydration_should_stop()) else {
                return;
            };
            let pieces = std::mem::take(&mut batch);
            local += hydrate_window(&vol, &h, pieces, PROFILE_GAPS).await;
            h.profile_bytes.store(local, Ordering::Relaxed);
            sent_bytes += batch_bytes;
            batch_bytes = 0;
        }
    }
    let s = h.stats();
    h.set_profile(format!("prefetched {count} ranges: {local} bytes local"));
    tracing::info!(volume = %name_of(weak), ranges = count, local_bytes = local, gets = s.gets, elapsed_ms = s.elapsed_ms, "access profile prefetched");
}

/// Whether the profile's prefetch, `sent_bytes` into the profile, waits:
/// a client read within `CLIENT_ACTIVE_MS` (through any of `readers`) and
/// the prefetch is `PROFILE_AHEAD_BYTES` or more past what the clients
/// have read. With no client reading it never waits (before the boot, or
/// while the guest computes, it takes what nobody uses).
fn prefetch_holds(h: &Hydration, readers: &[Arc<VolumeReader>], sent_bytes: u64) -> bool {
    let active = readers
        .iter()
        .any(|r| r.activity.read_within(CLIENT_ACTIVE_MS));
    ahead_of_clients(
        sent_bytes,
        h.client_read_bytes.load(Ordering::Relaxed),
        active,
    )
}

fn ahead_of_clients(sent_bytes: u64, read_bytes: u64, active: bool) -> bool {
    active && sent_bytes >= read_bytes.saturating_add(PROFILE_AHEAD_BYTES)
}

async fn hydrate(weak: Weak<Volume>) {
    let Some(vol) = weak.upgrade() else { return };
    let h = vol.hydration.clone();
    let _marks = Hydrating::new(vol.hydration_readers());
    drop(vol);
    let Some((total, live)) = scan(&weak, 0).await else {
        return;
    };
    h.total_bytes.store(total, Ordering::Relaxed);
    h.set_state(HydrationState::Running);
    let rate = weak
        .upgrade()
        .map_or(0, |v| v.caches.hydration_rate.bytes_per_sec());
    tracing::info!(volume = %name_of(&weak), mode = %h.mode, total_bytes = total, rate_limit_bytes_per_sec = rate, "hydrating: fetching the volume's data into the disk cache");
    let outcome = fetch_all(&weak, &h, live).await;
    let Some(vol) = weak.upgrade() else { return };
    let Some(Tally {
        local,
        remote,
        failed,
        ..
    }) = outcome
    else {
        return;
    };
    h.total_bytes.store(local + remote, Ordering::Relaxed);
    h.local_bytes.store(local, Ordering::Relaxed);
    let s = h.stats();
    let elapsed_ms = h.elapsed().as_millis() as u64;
    if local + remote == 0 {
        h.set_state(HydrationState::Done);
        tracing::debug!(volume = %vol.name, "nothing stored to hydrate");
    } else if remote == 0 {
        h.set_state(HydrationState::Done);
        tracing::info!(volume = %vol.name, local_bytes = local, fetched_bytes = s.fetched_bytes, gets = s.gets, elapsed_ms, "volume is local: every stored byte is in the disk cache");
    } else if failed {
        h.set_state(HydrationState::Failed);
        tracing::warn!(volume = %vol.name, local_bytes = local, remote_bytes = remote, "hydration stopped before the volume was local (store errors); reads still go to the store, and the next open tries again");
    } else {
        h.set_state(HydrationState::CacheFull);
        tracing::info!(volume = %vol.name, local_bytes = local, remote_bytes = remote, "hydration stopped: the disk cache has no free room for the rest (hydration never evicts; a larger --disk-cache-size holds the whole volume)");
    }
}

fn name_of(weak: &Weak<Volume>) -> String {
    weak.upgrade().map(|v| v.name.clone()).unwrap_or_default()
}

/// One pass over the extent map: the stored bytes of the whole volume and
/// the live blocks of the segments from `from` on (as many as
/// `LiveBlocks` holds). `None`: the volume closed.
async fn scan(weak: &Weak<Volume>, from: u64) -> Option<(u64, LiveBlocks)> {
    let mut live = LiveBlocks::new(from);
    let mut total = 0u64;
    let mut at = 0u64;
    loop {
        let vol = weak.upgrade()?;
        if vol.hydration_should_stop() {
            return None;
        }
        let (pieces, next) = vol.hydration_window(at);
        for (seq, offset, len) in pieces {
            total += len;
            live.add(seq, offset, len);
        }
        if next >= vol.size_bytes() || next <= at {
            return Some((total, live));
        }
        at = next;
        drop(vol);
        // Other tasks run between windows (a window holds the lock).
        tokio::task::yield_now().await;
    }
}

/// What the main pass found: bytes local and not, and whether a store
/// error (rather than a full cache) left some not local.
#[derive(Default)]
struct Tally {
    local: u64,
    remote: u64,
    failed: bool,
    /// Units in a row that failed.
    failed_in_row: u32,
}

/// The main pass, round after round (one per `LiveBlocks` that fits in
/// memory): `None` when the volume closed or was fenced.
async fn fetch_all(weak: &Weak<Volume>, h: &Arc<Hydration>, first: LiveBlocks) -> Option<Tally> {
    let mut t = Tally::default();
    let mut live = first;
    loop {
        let cutoff = live.cutoff();
        let stopped = !run_round(weak, h, &mut live, &mut t).await?;
        if stopped {
            // What was not visited counts as remote.
            let total = h.total_bytes.load(Ordering::Relaxed);
            t.remote = total.saturating_sub(t.local).max(t.remote);
            return Some(t);
        }
        if cutoff == u64::MAX {
            return Some(t);
        }
        live = scan(weak, cutoff + 1).await?.1;
    }
}

/// Blocks of one unit at most: one segment's blocks, fetched in GETs of up
/// to 8 MiB under the server's hydration slots (32 MiB).
const UNIT_BLOCKS: u64 = (32 << 20) / BLOCK_BYTES;
/// Units in flight at once while no client reads ...
const UNITS_IN_FLIGHT: usize = 8;
/// ... and while one does (read within `CLIENT_ACTIVE_MS`), apart from
/// the units ahead of a reader: the client comes first. The same bound
/// holds the GETs of units already in flight beside a shallow reader
/// (`RestGate`: one GET), and units planned beside a client GET 2 MiB at
/// a time. Measured
/// (`hydration.rs::a_clients_reads_keep_their_latency_while_hydration_runs`,
/// 20 ms store): with 8 segments' GETs at once beside a client, its 4 KiB
/// reads' p99 was 250-790 ms against 75 ms with no hydration; with one
/// unit beside it, 79-360 ms, all of the tail in the first 350 ms, while
/// units sent before the client came ran to their end; with the gate,
/// 69-77 ms against 73-75 (4 runs).
const UNITS_BESIDE_CLIENT: usize = 1;
const CLIENT_ACTIVE_MS: u64 = 200;
/// A reader's lead: the segment it reads and the next ones, whole, up to
/// this many (`LiveBlocks::take_lead`), at most `LEAD_BLOCKS` a look. A
/// boot reads file after file of a region, back and forth within a
/// directory; one GET of 20 ms brings 2 MiB as easily as 64 KiB, so the
/// reader's next files are local before it asks. Measured: a lead of 64
/// MiB after the reader in its segment only (a segment is 16 MiB) left
/// the first clone of `coldboot-big` at 2.4x local; each segment entered
/// cost the reader a miss and its index's two GETs.
const LEAD_SEGMENTS: u64 = 4;
const LEAD_BLOCKS: u64 = (64 << 20) / BLOCK_BYTES;
/// Segments after a lead's whose indexes (two GETs each, one after the
/// other) are fetched with it: the reader goes there next.
const LEAD_INDEXES_AHEAD: usize = 2;
/// How often the scheduler looks at the readers when nothing woke it.
const TICK_MS: u64 = 20;
/// Units in a row that fail before hydration gives up (until the volume
/// is opened again).
const MAX_FAILED_UNITS: u32 = 16;

/// One round: every unit of `live` fetched, those ahead of a reader
/// first, the rest in segment order as the clients leave room. `None`:
/// the volume closed; `Some(false)`: hydration stops (cache full, store
/// failing).
async fn run_round(
    weak: &Weak<Volume>,
    h: &Arc<Hydration>,
    live: &mut LiveBlocks,
    t: &mut Tally,
) -> Option<bool> {
    let readers = weak.upgrade()?.hydration_readers();
    prefetch_indexes(weak.clone(), live.first_segments(MAX_INDEX_PREFETCH));
    let mut units = futures::stream::FuturesUnordered::new();
    let mut leads = 0usize;
    let mut follows = vec![Follow::default(); readers.len()];
    // Segments this round fetches from: a reader's positions spread over
    // them (and those local already), so "near" narrows on fewer.
    let near = near_segments(live.segment_count());
    loop {
        let vol = weak.upgrade()?;
        if vol.hydration_should_stop() {
            return None;
        }
        let mut followed = false;
        for (r, follow) in readers.iter().zip(follows.iter_mut()) {
            let Some((seq, block)) = r.activity.position() else {
                continue;
            };
            let fetches = r.activity.fetches_in_flight();
            let active = r.activity.read_within(CLIENT_ACTIVE_MS);
            if !follow.note((seq, block), fetches, near) || !active {
                continue;
            }
            followed = true;
            // Leads only: units of the rest may be held at the gate.
            if leads >= UNITS_IN_FLIGHT {
                continue;
            }
            follow.led(seq);
            let lead = live.take_lead(seq, LEAD_SEGMENTS, UNIT_BLOCKS, LEAD_BLOCKS);
            if let Some(last) = lead.last() {
                let next = live.segments_after(last.seq, LEAD_INDEXES_AHEAD);
                prefetch_indexes(weak.clone(), next);
            }
            for u in lead {
                units.push(run_unit(vol.clone(), h.clone(), u, LEAD_GAPS));
                leads += 1;
            }
        }
        let limit = rest_in_flight(&readers, &follows, followed || leads > 0);
        let alone = limit >= UNITS_IN_FLIGHT;
        // Beside a shallow reader at random, the GETs of units sent before
        // wait too. Beside a led reader no new unit starts, but those sent
        // finish: holding them too (measured, coldclone at 0 ms) made the
        // first read 6.1 s against 4.3 and the volume local after 7.0 s
        // against 3.6: the reader reads it all, and the rest was its.
        let shallow = limit == UNITS_BESIDE_CLIENT;
        h.rest_gate
            .set_allowed(if shallow { limit } else { MAX_HYDRATION_GETS });
        let gaps = if alone {
            HYDRATION_GAPS
        } else {
            BESIDE_CLIENT_GAPS
        };
        while units.len() - leads < limit {
            let Some(u) = live.take_next(UNIT_BLOCKS) else {
                break;
            };
            units.push(run_unit(vol.clone(), h.clone(), u, gaps));
        }
        drop(vol);
        if units.is_empty() && live.is_empty() {
            // Nothing in flight and nothing left to take: the round is done.
            return Some(true);
        }
        let woken = futures::future::select_all(
            readers.iter().map(|r| Box::pin(r.activity.wake.notified())),
        );
        tokio::select! {
            Some(done) = units.next() => {
                leads -= usize::from(done.lead);
                if !tally(weak, h, t, done)? {
                    return Some(false);
                }
            }
            _ = woken => {}
            _ = tokio::time::sleep(std::time::Duration::from_millis(TICK_MS)) => {}
        }
    }
}

/// Units of the rest (not ahead of a reader) that may be in flight: all
/// while no client reads, or only deep ones (more than 32 fetches at the store:
/// reading for throughput, which local data serves best: measured, one
/// unit at a time beside `coldrandread`'s 128 reads in flight took its
/// IOPS from 0.88x/0.93x local to 0.60x/0.70x); none beside a reader that
/// hydration follows (`following`: the store, the disk and the CPU are
/// its, and what it reads next is ahead of it, not in the rest);
/// `UNITS_BESIDE_CLIENT` beside a shallow one reading at random (its
/// latency first: `tests/hydration.rs`, p99 within 2x).
fn rest_in_flight(readers: &[Arc<VolumeReader>], follows: &[Follow], following: bool) -> usize {
    let active: Vec<bool> = readers
        .iter()
        .zip(follows)
        .filter(|(r, _)| r.activity.read_within(CLIENT_ACTIVE_MS))
        .map(|(_, f)| f.deep())
        .collect();
    if active.iter().all(|&deep| deep) {
        UNITS_IN_FLIGHT
    } else if following {
        0
    } else {
        UNITS_BESIDE_CLIENT
    }
}

/// What one unit's fetch found.
struct UnitOutcome {
    local: u64,
    remote: u64,
    /// The store failed (not a segment GC deleted meanwhile).
    failed: bool,
    /// A unit ahead of a reader.
    lead: bool,
}

/// Segment indexes a round fetches ahead of its units, at most, and at once:
/// a client entering a segment would otherwise wait for its index's two
/// GETs, one after the other, before its data's (measured: most of what
/// kept the first clone of `coldboot-big` at 1.4x local at 20 ms). Each
/// index is fetched once anyway (the units need it); this only moves it
/// early. Bounded so the indexes fit the index cache (16 KiB for a 16 MiB
/// segment: 16 MiB for 1,024).
const MAX_INDEX_PREFETCH: usize = 1024;
const INDEX_PREFETCHES_IN_FLIGHT: usize = 4;

/// Fetches the indexes of segments `seqs`, in order, in a task of its
/// own that stops when the volume closes (each fetched once however many
/// ask; a failure is the reader's to see later).
fn prefetch_indexes(weak: Weak<Volume>, seqs: Vec<u64>) {
    tokio::spawn(async move {
        futures::stream::iter(seqs)
            .for_each_concurrent(INDEX_PREFETCHES_IN_FLIGHT, |seq| {
                let weak = weak.clone();
                async move {
                    let Some(vol) = weak.upgrade().filter(|v| !v.hydration_should_stop()) else {
                        return;
                    };
                    let own = vol.reader();
                    let (caches, reader) = (vol.caches.clone(), vol.lineage.reader_for(&vol.caches, &own, seq));
                    drop(vol);
                    if let Err(e) = reader.segment_index(&caches, seq).await {
                        tracing::debug!(volume = %reader.name, seq, error = %strata_store::ErrorText(&e), "index prefetch failed");
                    }
                }
            })
            .await;
    });
}

async fn run_unit(vol: Arc<Volume>, h: Arc<Hydration>, u: Unit, gaps: Gaps) -> UnitOutcome {
    let own = vol.reader();
    let reader = vol.lineage.reader_for(&vol.caches, &own, u.seq);
    let count = u.blocks.len() as u64;
    let lead = gaps.lead;
    match hydrate_blocks(&vol.caches, &reader, u.seq, &u.blocks, &h, gaps).await {
        Ok(local_blocks) => {
            let local =
                (u128::from(u.bytes) * u128::from(local_blocks) / u128::from(count.max(1))) as u64;
            UnitOutcome {
                local,
                remote: u.bytes - local.min(u.bytes),
                failed: false,
                lead,
            }
        }
        // GC moved the data and deleted the segment: the copy is in a
        // segment this volume wrote, local once uploaded.
        Err(_) if vol.any_deleted(&[u.seq]) => UnitOutcome {
            local: 0,
            remote: 0,
            failed: false,
            lead,
        },
        Err(e) => {
            tracing::debug!(volume = %vol.name, seq = u.seq, error = %strata_store::ErrorText(&e), "hydration of a segment's blocks failed");
            UnitOutcome {
                local: 0,
                remote: u.bytes,
                failed: true,
                lead,
            }
        }
    }
}

/// Counts a finished unit; false when hydration stops (no free disk-cache
/// slot left, or too many failures in a row), `None` when the volume is
/// gone.
fn tally(weak: &Weak<Volume>, h: &Hydration, t: &mut Tally, done: UnitOutcome) -> Option<bool> {
    t.local += done.local;
    t.remote += done.remote;
    t.failed |= done.failed;
    t.failed_in_row = if done.failed { t.failed_in_row + 1 } else { 0 };
    h.local_bytes.store(t.local, Ordering::Relaxed);
    let vol = weak.upgrade()?;
    Some(t.failed_in_row < MAX_FAILED_UNITS && vol.caches.disk.has_free_slots())
}

/// A batch of a profile's pieces: grouped by segment, each segment's
/// missing blocks fetched; returns the bytes of the pieces local after.
async fn hydrate_window(
    vol: &Arc<Volume>,
    h: &Hydration,
    pieces: Vec<(u64, u64, u64)>,
    gaps: Gaps,
) -> u64 {
    let mut by_seq: BTreeMap<u64, Vec<(u64, u64)>> = BTreeMap::new();
    for (seq, offset, len) in pieces {
        by_seq.entry(seq).or_default().push((offset, len));
    }
    let own = vol.reader();
    let caches: &SharedCaches = &vol.caches;
    let jobs = by_seq.into_iter().map(|(seq, pieces)| {
        let reader = vol.lineage.reader_for(caches, &own, seq);
        async move {
            let result = hydrate_segment(caches, &reader, seq, &pieces, h, gaps).await;
            (seq, result)
        }
    });
    let results: Vec<_> = futures::stream::iter(jobs)
        .buffer_unordered(SEGMENTS_IN_FLIGHT)
        .collect()
        .await;
    let mut local = 0;
    for (seq, result) in results {
        match result {
            Ok(o) => local += o.local_bytes,
            // A hint: what failed is fetched by the main pass or the reads.
            Err(e) => {
                tracing::debug!(volume = %vol.name, seq, error = %strata_store::ErrorText(&e), "prefetch of a profile's blocks failed");
            }
        }
    }
    local
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_profile_waits_only_ahead_of_a_reading_client() {
        let ahead = PROFILE_AHEAD_BYTES;
        assert!(!ahead_of_clients(u64::MAX / 2, 0, false), "no client yet");
        assert!(
            !ahead_of_clients(100 + ahead - 1, 100, true),
            "less than ahead past the client"
        );
        assert!(
            ahead_of_clients(100 + ahead, 100, true),
            "ahead past the client"
        );
        assert!(
            !ahead_of_clients(100 + ahead, 150, true),
            "the client moved on"
        );
        assert!(
            !ahead_of_clients(1 << 40, 100, false),
            "the client stopped reading"
        );
    }

    #[test]
    fn auto_hydrates_clones_and_volumes_new_here_only() {
        let m =
            |mode, local, disk, clone, journal| hydration_mode(mode, local, disk, clone, journal).1;
        assert!(m(HydrateMode::Auto, false, true, true, true));
        assert!(m(HydrateMode::Auto, false, true, false, false));
        assert!(!m(HydrateMode::Auto, false, true, false, true));
        assert!(m(HydrateMode::On, false, true, false, true));
        assert!(!m(HydrateMode::Off, false, true, true, false));
        assert!(
            !m(HydrateMode::On, true, true, true, false),
            "embedded store"
        );
        assert!(
            !m(HydrateMode::On, false, false, true, false),
            "no disk cache"
        );
        assert_eq!(
            hydration_mode(HydrateMode::Auto, false, true, false, true).0,
            "auto: written on this host"
        );
    }
}
