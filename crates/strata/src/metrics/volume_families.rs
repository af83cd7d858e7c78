//! The families of each open volume, labelled `volume`: data and space,
//! uploads and back-pressure (write buffer, journal, writers that waited),
//! garbage collection, snapshots, the lease, and hydration. Volumes not opened by
//! this server have no series.

use std::collections::BTreeMap;
use std::fmt;

use prometheus_client::encoding::DescriptorEncoder;
use strata_volume::{LeaseState, VolumeStats};

use super::collector::label;
use super::families::{counters, gauges, Labels};

type Volumes = BTreeMap<String, VolumeStats>;

#[derive(Clone, Copy)]
enum Kind {
    Counter,
    Gauge,
}
use Kind::{Counter, Gauge};

/// The families that are one number per volume: kind, name, help, value.
type PerVolume = (Kind, &'static str, &'static str, fn(&VolumeStats) -> u64);

/// Data and space, uploads, back-pressure, garbage collection, snapshots.
const PER_VOLUME: &[PerVolume] = &[
    (
        Gauge,
        "strata_volume_mapped_bytes",
        "Bytes of the volume that hold data (not holes).",
        |v| v.mapped_data_bytes,
    ),
    (
        Gauge,
        "strata_volume_stored_bytes",
        "Bytes of the volume's segment objects in the store.",
        |v| v.space.stored_bytes,
    ),
    (
        Gauge,
        "strata_volume_live_bytes",
        "Bytes of stored segments the volume's map points at.",
        |v| v.space.live_bytes,
    ),
    (
        Gauge,
        "strata_volume_garbage_bytes",
        "Stored segment bytes nothing points at: what garbage collection can reclaim.",
        |v| v.space.garbage_bytes,
    ),
    (
        Gauge,
        "strata_volume_stored_segments",
        "Segment objects of the volume in the store.",
        |v| v.space.stored_segments,
    ),
    (
        Counter,
        "strata_volume_uploaded_segments_total",
        "Segments uploaded to the store.",
        |v| v.segments_uploaded,
    ),
    (
        Counter,
        "strata_volume_uploaded_bytes_total",
        "Bytes of segments uploaded to the store.",
        |v| v.bytes_uploaded,
    ),
    (
        Counter,
        "strata_volume_zero_writes_elided_bytes_total",
        "Bytes of writes that were all zeros, recorded as holes instead of stored.",
        |v| v.zero_write_bytes_elided,
    ),
    (
        Counter,
        "strata_volume_placed_write_bytes_total",
        "Bytes of writes (embedded store) that went straight into their segment's file, the journal recording where: written once, not also in the journal.",
        |v| v.placed_write_bytes,
    ),
    (
        Counter,
        "strata_volume_staged_segments_published_total",
        "Segments (embedded store) published from the file their data was written into, without writing that data again.",
        |v| v.staged_segments_published,
    ),
    (
        Counter,
        "strata_volume_flush_seals_total",
        "FLUSHes (embedded store) that sealed and uploaded their bulk data rather than sync it in the journal, so it reached the disk once.",
        |v| v.flush_seals.sealed,
    ),
    (
        Counter,
        "strata_volume_flush_seal_timeouts_total",
        "Of those FLUSHes, the ones whose uploads took too long: the journal's sync covered the data (written to disk twice).",
        |v| v.flush_seals.timed_out,
    ),
    (
        Gauge,
        "strata_volume_upload_pending_segments",
        "Sealed segments not yet in the store (uploading or waiting to).",
        |v| v.upload_pending_segments,
    ),
    (
        Gauge,
        "strata_volume_upload_pending_bytes",
        "Bytes of sealed segments not yet in the store.",
        |v| v.upload_pending_bytes,
    ),
    (
        Gauge,
        "strata_volume_write_buffer_bytes",
        "Bytes of writes held in memory until uploaded (open and sealed segments).",
        |v| v.buffered_bytes,
    ),
    (
        Gauge,
        "strata_volume_write_buffer_budget_bytes",
        "The write buffer's budget (--write-buffer); writers wait when it is full.",
        |v| v.write_buffer_budget_bytes,
    ),
    (
        Gauge,
        "strata_volume_journal_used_bytes",
        "Bytes of the local journal not yet safe in the store.",
        |v| v.journal_used_bytes,
    ),
    (
        Gauge,
        "strata_volume_journal_size_bytes",
        "The local journal's size; writers wait when it is full.",
        |v| v.journal_ring_bytes,
    ),
    (
        Counter,
        "strata_gc_passes_total",
        "Garbage collection passes.",
        |v| v.gc.passes,
    ),
    (
        Counter,
        "strata_gc_segments_rewritten_total",
        "Segments whose live data garbage collection copied out.",
        |v| v.gc.segments_rewritten,
    ),
    (
        Counter,
        "strata_gc_copied_bytes_total",
        "Live bytes garbage collection copied.",
        |v| v.gc.bytes_copied,
    ),
    (
        Counter,
        "strata_gc_objects_deleted_total",
        "Objects garbage collection deleted after their grace period.",
        |v| v.gc.objects_deleted,
    ),
    (
        Counter,
        "strata_gc_reclaimed_bytes_total",
        "Stored bytes garbage collection deleted.",
        |v| v.gc.bytes_reclaimed,
    ),
    (
        Counter,
        "strata_gc_orphans_deleted_total",
        "Objects no manifest names (left by crashes) deleted.",
        |v| v.gc.orphans_deleted,
    ),
    (
        Counter,
        "strata_gc_errors_total",
        "Garbage collection passes that failed (retried later).",
        |v| v.gc.errors,
    ),
    (
        Counter,
        "strata_gc_read_rewrites_total",
        "Fragmented reads whose pieces were rewritten contiguously.",
        |v| v.gc.read_rewrites,
    ),
    (
        Gauge,
        "strata_gc_pending_deletions",
        "Objects waiting for their grace period before deletion.",
        |v| v.gc.pending_deletions,
    ),
    (
        Gauge,
        "strata_gc_pending_deletion_bytes",
        "Bytes of objects waiting for their grace period before deletion.",
        |v| v.gc.pending_bytes,
    ),
    (
        Gauge,
        "strata_volume_snapshots",
        "Snapshots the volume has.",
        |v| v.snapshots.count,
    ),
    (
        Gauge,
        "strata_volume_snapshot_pinned_segments",
        "Segments the volume's snapshots keep from garbage collection.",
        |v| v.snapshot_pinned_segments,
    ),
    (
        Counter,
        "strata_snapshots_created_total",
        "Snapshots taken by this server.",
        |v| v.snapshots.created,
    ),
    (
        Counter,
        "strata_snapshots_deleted_total",
        "Snapshots deleted by this server.",
        |v| v.snapshots.deleted,
    ),
    (
        Counter,
        "strata_snapshot_rollbacks_total",
        "Rollbacks to a snapshot by this server.",
        |v| v.snapshots.rollbacks,
    ),
    (
        Gauge,
        "strata_volume_lease_epoch",
        "The volume's epoch this server holds (bumped by every server that opens the volume).",
        |v| v.lease.epoch,
    ),
    (
        Counter,
        "strata_volume_lease_renewals_total",
        "Lease writes after the open: re-claims after this host was declared expired (leases are not renewed on a timer; the host's liveness is, strata_host_liveness_renewals_total).",
        |v| v.lease.renewals,
    ),
    (
        Counter,
        "strata_volume_lease_renewal_failures_total",
        "Lease re-claims that failed (the store unreachable, or the volume taken over).",
        |v| v.lease.renewal_failures,
    ),
    (
        Gauge,
        "strata_volume_hydration_total_bytes",
        "Bytes of the volume's data in stored segments, as hydration last measured them (0: hydration off).",
        |v| v.hydration.total_bytes,
    ),
    (
        Gauge,
        "strata_volume_hydration_local_bytes",
        "Of those, bytes in the local disk cache: the volume is local when it equals the total.",
        |v| v.hydration.local_bytes,
    ),
    (
        Gauge,
        "strata_volume_hydration_state",
        "Hydration: 0 off, 1 measuring, 2 fetching, 3 done (local), 4 stopped with the disk cache full, 5 stopped by store errors.",
        |v| v.hydration.state as u64,
    ),
    (
        Counter,
        "strata_volume_hydration_fetched_bytes_total",
        "Bytes hydration fetched from the store.",
        |v| v.hydration.fetched_bytes,
    ),
    (
        Counter,
        "strata_volume_hydration_gets_total",
        "GETs hydration sent.",
        |v| v.hydration.gets,
    ),
    (
        Counter,
        "strata_volume_qos_throttled_requests_total",
        "Client requests that waited for the volume's QoS limits (`volume set-qos`).",
        |v| v.qos.throttled_requests,
    ),
];

pub(super) fn volume_families(enc: &mut DescriptorEncoder, volumes: &Volumes) -> fmt::Result {
    for &(kind, name, help, value) in PER_VOLUME {
        let rows: Vec<(Labels, u64)> = volumes
            .iter()
            .map(|(volume, v)| (label("volume", volume), value(v)))
            .collect();
        match kind {
            Counter => counters(enc, name, help, &rows)?,
            Gauge => gauges(enc, name, help, &rows)?,
        }
    }
    write_wait_families(enc, volumes)?;
    let waited: Vec<(Labels, f64)> = volumes
        .iter()
        .map(|(name, v)| (label("volume", name), v.qos.wait_ms as f64 / 1e3))
        .collect();
    counters(
        enc,
        "strata_volume_qos_wait_seconds_total",
        "Time client requests spent waiting for the volume's QoS limits.",
        &waited,
    )?;
    lease_families(enc, volumes)
}

fn write_wait_families(enc: &mut DescriptorEncoder, volumes: &Volumes) -> fmt::Result {
    let mut waits = Vec::new();
    let mut waited = Vec::new();
    for (name, v) in volumes {
        for w in &v.write_waits {
            let labels = vec![("volume", name.clone()), ("reason", w.reason.to_string())];
            waits.push((labels.clone(), w.writes));
            waited.push((labels, w.waited_us as f64 / 1e6));
        }
    }
    counters(
        enc,
        "strata_volume_write_waits_total",
        "Writes that waited for room before they were accepted, by what they waited for first: write_buffer (uploads behind), journal (full), lease (not renewed in time), resize, host_write_buffer (the server's --write-buffer-total, this volume over its share).",
        &waits,
    )?;
    counters(
        enc,
        "strata_volume_write_wait_seconds_total",
        "Time writes spent waiting for room, by what they waited for first.",
        &waited,
    )
}

fn lease_families(enc: &mut DescriptorEncoder, volumes: &Volumes) -> fmt::Result {
    let mut states = Vec::new();
    for (name, v) in volumes {
        for state in LeaseState::ALL {
            let labels = vec![("volume", name.clone()), ("state", state.name().into())];
            states.push((labels, u64::from(v.lease.state == state)));
        }
    }
    gauges(
        enc,
        "strata_volume_lease_state",
        "1 for the state the volume's lease is in: valid (writes acknowledged), lapsed (not renewed in time: writes wait), fenced (another server took the volume over), released (closed).",
        &states,
    )?;
    let valid: Vec<(Labels, f64)> = volumes
        .iter()
        .map(|(name, v)| (label("volume", name), v.lease.valid_for_ms as f64 / 1e3))
        .collect();
    gauges(
        enc,
        "strata_volume_lease_valid_seconds",
        "How much longer writes are acknowledged without another lease renewal.",
        &valid,
    )
}
