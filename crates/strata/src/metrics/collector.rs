//! What `/metrics` exports: read at scrape time from the counters the
//! server keeps anyway (the NBD server's, the store layers', the caches',
//! each open volume's), so serving metrics adds nothing to the I/O path.
//! This file holds the server-wide families (build, NBD, store, caches);
//! `volume_families.rs` those of each open volume.
//!
//! Labels: `volume` (a volume name), `op` (an NBD command or a store
//! operation), `tier` (a cache tier), `reason`, `state`, `version`: never an
//! offset, an object name or a client address.

use std::fmt;
use std::sync::Arc;

use nbd_server::{GroupSnapshot, NbdMetrics, NbdSnapshot};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;
use strata_store::StoreStats;
use strata_volume::{Engine, ReadPathStats};
use vhost_user_blk::VhostMetrics;

use super::families::{counter, counters, gauge, gauges, histograms, Labels};
use super::latency::Buckets;
use super::volume_families::volume_families;

/// Reads the engine's and the NBD server's counters at each scrape.
pub struct StrataCollector {
    engine: Arc<Engine>,
    nbd: Arc<NbdMetrics>,
    vhost: Option<Arc<VhostMetrics>>,
}

impl StrataCollector {
    pub fn new(
        engine: Arc<Engine>,
        nbd: Arc<NbdMetrics>,
        vhost: Option<Arc<VhostMetrics>>,
    ) -> StrataCollector {
        StrataCollector { engine, nbd, vhost }
    }
}

impl fmt::Debug for StrataCollector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("StrataCollector")
    }
}

impl Collector for StrataCollector {
    fn encode(&self, mut enc: DescriptorEncoder) -> fmt::Result {
        let stats = self.engine.stats();
        let mut nbd = self.nbd.snapshot();
        // Every open volume has its NBD series from the start, at zero
        // (rates and dashboards need no first request to see them).
        for name in stats.volumes.keys() {
            nbd.groups
                .entry(name.clone())
                .or_insert_with(GroupSnapshot::empty);
        }
        build_info(&mut enc)?;
        nbd_families(&mut enc, &nbd)?;
        if let Some(vhost) = &self.vhost {
            vhost_families(&mut enc, vhost)?;
        }
        store_families(&mut enc, &stats.store)?;
        cache_families(&mut enc, &stats.read_path)?;
        if let Some(host) = self.engine.host_stats() {
            host_families(&mut enc, &host)?;
        }
        volume_families(&mut enc, &stats.volumes)
    }
}

/// This host's liveness record (`ownership/host_liveness.rs`): one renewal
/// per host every third of --lease-ttl-ms, whatever the volume count.
fn host_families(enc: &mut DescriptorEncoder, h: &strata_volume::HostStats) -> fmt::Result {
    counter(
        enc,
        "strata_host_liveness_renewals_total",
        "Renewals of this host's liveness record in the store (one keeps every volume of the host).",
        h.renewals,
    )?;
    counter(
        enc,
        "strata_host_liveness_renewal_failures_total",
        "Renewals of this host's liveness record that failed (the store unreachable); writes wait once the TTL less a margin has passed without one.",
        h.renewal_failures,
    )?;
    counter(
        enc,
        "strata_host_incarnations_total",
        "Times another host declared this one expired (it did not renew in time) and it started anew, re-claiming each volume's lease.",
        h.incarnations,
    )?;
    gauge(
        enc,
        "strata_host_liveness_valid",
        "1 while this host's liveness lets its volumes acknowledge writes.",
        u64::from(h.valid),
    )?;
    gauge(
        enc,
        "strata_host_liveness_valid_for_seconds",
        "How much longer writes are acknowledged without another renewal of this host's liveness.",
        h.valid_for_ms as f64 / 1000.0,
    )
}

pub(super) fn label(key: &'static str, value: &str) -> Labels {
    vec![(key, value.to_string())]
}

fn build_info(enc: &mut DescriptorEncoder) -> fmt::Result {
    let version = label("version", env!("CARGO_PKG_VERSION"));
    gauges(
        enc,
        "strata_build_info",
        "Always 1; the version label is the strata version serving.",
        &[(version, 1u64)],
    )
}

fn nbd_families(enc: &mut DescriptorEncoder, nbd: &NbdSnapshot) -> fmt::Result {
    let rows = |f: &dyn Fn(&nbd_server::OpSnapshot) -> u64| -> Vec<(Labels, u64)> {
        let mut rows = Vec::new();
        for (volume, group) in &nbd.groups {
            for op in &group.ops {
                let labels = vec![("volume", volume.clone()), ("op", op.op.name().into())];
                rows.push((labels, f(op)));
            }
        }
        rows
    };
    counters(
        enc,
        "strata_nbd_requests_total",
        "NBD requests answered, by volume and command (read, write, flush, trim, write_zeroes, cache, block_status, other); requests to a snapshot count under its volume.",
        &rows(&|o| o.requests),
    )?;
    counters(
        enc,
        "strata_nbd_request_errors_total",
        "NBD requests answered with an error (refused as invalid, or failed), by volume and command.",
        &rows(&|o| o.errors),
    )?;
    counters(
        enc,
        "strata_nbd_request_bytes_total",
        "Bytes NBD requests addressed, by volume and command: data read or written, range trimmed, zeroed, cached or queried.",
        &rows(&|o| o.bytes),
    )?;
    let mut latency = Vec::new();
    for (volume, group) in &nbd.groups {
        for op in &group.ops {
            let labels = vec![("volume", volume.clone()), ("op", op.op.name().into())];
            let buckets = Buckets::from_log2(&op.latency_buckets, op.latency_sum_us);
            latency.push((labels, buckets));
        }
    }
    histograms(
        enc,
        "strata_nbd_request_duration_seconds",
        "Time from an NBD request read whole to its reply ready, by volume and command.",
        &latency,
    )?;
    counter(
        enc,
        "strata_nbd_connections_accepted_total",
        "NBD connections accepted.",
        nbd.connections_accepted,
    )?;
    counter(
        enc,
        "strata_nbd_connections_refused_total",
        "NBD connections closed at once because --max-connections were open.",
        nbd.connections_refused,
    )?;
    gauge(
        enc,
        "strata_nbd_connections",
        "NBD connections open (in the handshake or serving requests).",
        nbd.connections_open,
    )?;
    gauge(
        enc,
        "strata_nbd_serving_connections",
        "NBD connections past the handshake, serving requests.",
        nbd.transmissions_open,
    )
}

/// vhost-user-blk devices (with --vhost-user-dir / --vhost-user-socket):
/// requests by volume and kind; a snapshot's under its volume.
fn vhost_families(enc: &mut DescriptorEncoder, vhost: &VhostMetrics) -> fmt::Result {
    let mut by_volume: std::collections::BTreeMap<
        String,
        Vec<(vhost_user_blk::OpKind, vhost_user_blk::OpCounts)>,
    > = std::collections::BTreeMap::new();
    let mut connected: std::collections::BTreeMap<String, u64> = std::collections::BTreeMap::new();
    for (device, snap) in vhost.snapshot() {
        let volume = device.split('@').next().unwrap_or(&device).to_string();
        *connected.entry(volume.clone()).or_default() += snap.connected;
        let ops = by_volume.entry(volume).or_default();
        for (kind, counts) in snap.ops {
            match ops.iter_mut().find(|(k, _)| *k == kind) {
                Some((_, c)) => {
                    c.requests += counts.requests;
                    c.errors += counts.errors;
                    c.bytes += counts.bytes;
                }
                None => ops.push((kind, counts)),
            }
        }
    }
    let rows = |f: &dyn Fn(&vhost_user_blk::OpCounts) -> u64| -> Vec<(Labels, u64)> {
        let mut rows = Vec::new();
        for (volume, ops) in &by_volume {
            for (kind, counts) in ops {
                let labels = vec![("volume", volume.clone()), ("op", kind.name().into())];
                rows.push((labels, f(counts)));
            }
        }
        rows
    };
    counters(
        enc,
        "strata_vhost_requests_total",
        "vhost-user-blk requests returned to guests, by volume and kind (read, write, flush, discard, write_zeroes, get_id, refused: malformed or unsupported).",
        &rows(&|c| c.requests),
    )?;
    counters(
        enc,
        "strata_vhost_request_errors_total",
        "vhost-user-blk requests answered with an error status (IOERR, UNSUPP), by volume and kind.",
        &rows(&|c| c.errors),
    )?;
    counters(
        enc,
        "strata_vhost_request_bytes_total",
        "Bytes vhost-user-blk requests moved or addressed, by volume and kind: data read or written, range discarded or zeroed.",
        &rows(&|c| c.bytes),
    )?;
    counter(
        enc,
        "strata_vhost_connections_accepted_total",
        "vhost-user-blk frontend connections accepted.",
        vhost.connections_accepted(),
    )?;
    let connected: Vec<(Labels, u64)> = connected
        .into_iter()
        .map(|(v, n)| (label("volume", &v), n))
        .collect();
    gauges(
        enc,
        "strata_vhost_frontends",
        "vhost-user-blk frontends (VMs) connected, by volume.",
        &connected,
    )
}

fn store_families(enc: &mut DescriptorEncoder, store: &StoreStats) -> fmt::Result {
    let layers = &store.layers;
    let ops = layers.requests.ops();
    let rows = |f: &dyn Fn(&strata_store::OpMetricsSnapshot) -> u64| -> Vec<(Labels, u64)> {
        ops.iter()
            .map(|(op, m)| (label("op", op.name()), f(m)))
            .collect()
    };
    counters(
        enc,
        "strata_store_requests_total",
        "Object store requests, every attempt (retries included), by operation (get, get_range, put, delete, head, list, copy, other).",
        &rows(&|m| m.requests),
    )?;
    counters(
        enc,
        "strata_store_request_errors_total",
        "Object store requests that failed (and failed body reads of successful gets), by operation. A \"no such object\" answer or a refused condition is not an error: see the next two.",
        &rows(&|m| m.errors),
    )?;
    counters(
        enc,
        "strata_store_not_found_total",
        "Object store requests answered \"no such object\", by operation: strata asks on purpose (a lease or manifest not written yet), so a few per start are normal.",
        &rows(&|m| m.not_found),
    )?;
    counters(
        enc,
        "strata_store_condition_failed_total",
        "Conditional object store requests refused because the condition did not hold (If-None-Match on an existing object, a stale If-Match), by operation: lease races and the store probe ask on purpose.",
        &rows(&|m| m.condition_failed),
    )?;
    counters(
        enc,
        "strata_store_received_bytes_total",
        "Bytes received from the object store, by operation.",
        &rows(&|m| m.bytes_read),
    )?;
    counters(
        enc,
        "strata_store_sent_bytes_total",
        "Bytes sent to the object store, by operation.",
        &rows(&|m| m.bytes_written),
    )?;
    let latency: Vec<(Labels, Buckets)> = ops
        .iter()
        .map(|(op, m)| {
            let buckets = Buckets::from_log2(&m.latency_buckets, m.latency_sum_us);
            (label("op", op.name()), buckets)
        })
        .collect();
    histograms(
        enc,
        "strata_store_request_duration_seconds",
        "Object store request latency (one attempt), by operation.",
        &latency,
    )?;
    counter(
        enc,
        "strata_store_retries_total",
        "Object store attempts after the first (transient errors retried with backoff), all operations.",
        layers.retries.retries,
    )?;
    counter(
        enc,
        "strata_store_gave_up_total",
        "Object store calls that still failed after their last retry, all operations.",
        layers.retries.gave_up,
    )?;
    counter(
        enc,
        "strata_store_throttled_requests_total",
        "Object store requests that waited for one of --max-store-requests slots.",
        layers.limit.waited_requests,
    )?;
    if let Some(r) = &store.recycle {
        counter(
            enc,
            "strata_store_recycled_files_total",
            "Large objects (segments) the embedded store wrote over the file of a deleted one: pages and blocks the kernel already had (see --recycle-size).",
            r.reused_files,
        )?;
        counter(
            enc,
            "strata_store_new_files_total",
            "Large objects (segments) the embedded store wrote as a new file, finding no deleted one to overwrite.",
            r.new_files,
        )?;
        gauge(
            enc,
            "strata_store_recycled_bytes",
            "Bytes of deleted segment files the embedded store keeps to overwrite (at most --recycle-size).",
            r.pool_bytes,
        )?;
    }
    if let Some(faults) = &layers.faults {
        counter(
            enc,
            "strata_store_injected_faults_total",
            "Errors injected by STRATA_FAULTS (tests only).",
            faults.injected_errors,
        )?;
    }
    if let Some(http) = &store.http {
        let versions = [
            (label("version", "1.x"), http.http1_responses),
            (label("version", "2"), http.http2_responses),
            (label("version", "other"), http.other_responses),
        ];
        counters(
            enc,
            "strata_store_http_responses_total",
            "HTTP responses from the S3 endpoint, by HTTP version.",
            &versions,
        )?;
    }
    Ok(())
}

fn cache_families(enc: &mut DescriptorEncoder, read: &ReadPathStats) -> fmt::Result {
    let (ram, disk, index) = (&read.ram_chunks, &read.disk_cache, &read.segment_indexes);
    let tiers = |r: u64, d: u64, i: u64| {
        vec![
            (label("tier", "ram"), r),
            (label("tier", "disk"), d),
            (label("tier", "index"), i),
        ]
    };
    counters(
        enc,
        "strata_cache_hits_total",
        "Cache lookups served, by tier: ram and disk count 4 KiB chunks, index counts segment indexes.",
        &tiers(ram.hits, disk.hits, index.hits),
    )?;
    counters(
        enc,
        "strata_cache_misses_total",
        "Cache lookups not served, by tier (the read goes to the next tier, then the store).",
        &tiers(ram.misses, disk.misses, index.misses),
    )?;
    counters(
        enc,
        "strata_cache_insertions_total",
        "Entries added to the cache, by tier (disk: 64 KiB blocks, written or fetched data).",
        &tiers(
            ram.insertions,
            disk.written_insertions + disk.fetched_insertions,
            index.insertions,
        ),
    )?;
    counters(
        enc,
        "strata_cache_evictions_total",
        "Entries evicted to stay within the budget, by tier.",
        &tiers(ram.evictions, disk.evictions, index.evictions),
    )?;
    gauges(
        enc,
        "strata_cache_used_bytes",
        "Bytes held by the cache, by tier.",
        &tiers(ram.used_bytes, disk.used_bytes, index.used_bytes),
    )?;
    gauges(
        enc,
        "strata_cache_budget_bytes",
        "The cache's budget, by tier (0: the tier is off).",
        &tiers(ram.budget_bytes, disk.budget_bytes, index.budget_bytes),
    )?;
    disk_cache_families(enc, read)?;
    read_path_families(enc, read)
}

fn disk_cache_families(enc: &mut DescriptorEncoder, read: &ReadPathStats) -> fmt::Result {
    let disk = &read.disk_cache;
    counter(
        enc,
        "strata_disk_cache_verify_failures_total",
        "Disk cache chunks that did not match their checksum (dropped, read from the store).",
        disk.verify_failures,
    )?;
    counter(
        enc,
        "strata_disk_cache_io_errors_total",
        "Failed reads and writes of the disk cache file.",
        disk.io_errors,
    )?;
    counter(
        enc,
        "strata_disk_cache_skipped_writes_total",
        "Disk cache blocks not written because its writer was behind.",
        disk.skipped_writes,
    )?;
    gauge(
        enc,
        "strata_disk_cache_disabled",
        "1 when the disk cache switched itself off after a write failed (e.g. a full disk).",
        u64::from(disk.disabled_by_error),
    )
}

fn read_path_families(enc: &mut DescriptorEncoder, read: &ReadPathStats) -> fmt::Result {
    counter(
        enc,
        "strata_read_store_gets_total",
        "Ranged GETs of segment data by the read path (reads and read-ahead).",
        read.store.data_gets,
    )?;
    counter(
        enc,
        "strata_read_store_get_bytes_total",
        "Bytes of segment data fetched by the read path.",
        read.store.data_get_bytes,
    )?;
    counter(
        enc,
        "strata_readahead_bytes_total",
        "Bytes fetched ahead of sequential reads.",
        read.readahead.bytes_prefetched,
    )
}
