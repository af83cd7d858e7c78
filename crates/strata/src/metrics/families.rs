//! Writing one metric family into a scrape: the name, its HELP text (the
//! documentation of each metric), its unit, and one sample per label set.
//! Thin helpers over prometheus-client's encoder, so the collector reads
//! as a list of metrics.

use std::fmt;

use prometheus_client::encoding::{
    DescriptorEncoder, EncodeCounterValue, EncodeGaugeValue, EncodeMetric, MetricEncoder,
    NoLabelSet,
};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Unit;

use super::latency::Buckets;

/// Label pairs of one sample. Values are low-cardinality by construction:
/// an operation, a cache tier, a reason, a lease state, or a volume name.
pub type Labels = Vec<(&'static str, String)>;

static BYTES: Unit = Unit::Bytes;
static SECONDS: Unit = Unit::Seconds;

/// The family's descriptor, from the full name of its samples (the name
/// users query, e.g. `strata_gc_copied_bytes_total`): the encoder appends
/// `_total` to counters and the unit itself, so both are split off here,
/// and a name ending in `_bytes` or `_seconds` gets that unit (OpenMetrics
/// `# UNIT`).
fn descriptor<'s>(
    enc: &'s mut DescriptorEncoder<'_>,
    full_name: &'s str,
    help: &str,
    kind: MetricType,
) -> Result<MetricEncoder<'s>, fmt::Error> {
    let name = match kind {
        MetricType::Counter => full_name.strip_suffix("_total").unwrap_or(full_name),
        _ => full_name,
    };
    let (name, unit) = if let Some(stem) = name.strip_suffix("_bytes") {
        (stem, Some(&BYTES))
    } else if let Some(stem) = name.strip_suffix("_seconds") {
        (stem, Some(&SECONDS))
    } else {
        (name, None)
    };
    enc.encode_descriptor(name, help, unit, kind)
}

/// A counter family, one sample per label set.
pub fn counters<V: EncodeCounterValue + Copy>(
    enc: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    rows: &[(Labels, V)],
) -> fmt::Result {
    let mut family = descriptor(enc, name, help, MetricType::Counter)?;
    for (labels, value) in rows {
        ConstCounter::new(*value).encode(family.encode_family(labels)?)?;
    }
    Ok(())
}

/// A counter without labels.
pub fn counter(enc: &mut DescriptorEncoder<'_>, name: &str, help: &str, value: u64) -> fmt::Result {
    let family = descriptor(enc, name, help, MetricType::Counter)?;
    ConstCounter::new(value).encode(family)
}

/// A gauge family, one sample per label set.
pub fn gauges<V: EncodeGaugeValue + Copy>(
    enc: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    rows: &[(Labels, V)],
) -> fmt::Result {
    let mut family = descriptor(enc, name, help, MetricType::Gauge)?;
    for (labels, value) in rows {
        ConstGauge::new(*value).encode(family.encode_family(labels)?)?;
    }
    Ok(())
}

/// A gauge without labels.
pub fn gauge<V: EncodeGaugeValue>(
    enc: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    value: V,
) -> fmt::Result {
    let family = descriptor(enc, name, help, MetricType::Gauge)?;
    ConstGauge::new(value).encode(family)
}

/// A histogram family of latencies in seconds, one per label set.
pub fn histograms(
    enc: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    rows: &[(Labels, Buckets)],
) -> fmt::Result {
    let mut family = descriptor(enc, name, help, MetricType::Histogram)?;
    for (labels, h) in rows {
        let mut sample = family.encode_family(labels)?;
        sample.encode_histogram::<NoLabelSet>(h.sum_seconds, h.count, &h.buckets, None)?;
    }
    Ok(())
}
