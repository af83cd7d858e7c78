//! QoS specs on the command line: `iops=3000,bw=125MiB,write-iops=500`,
//! each limit optionally with a burst (`iops-burst=10000`), or `none`.
//!
//! Keys: `iops`, `read-iops`, `write-iops` (requests a second), `bw`,
//! `read-bw`, `write-bw` (bytes a second: a size, e.g. 50MiB), and each
//! with `-burst` (what a volume idle for a while may do at once: at least
//! the rate; default one second's worth). Bad input is one line saying
//! what is wrong and what is accepted.

use strata_volume::{Limit, QosLimits, QOS_KEYS};

use crate::size::{format_size, parse_size};

/// What a spec accepts, for errors and `--help`.
pub const QOS_HELP: &str = "iops, read-iops, write-iops (requests a second), bw, read-bw, write-bw (bytes a second, e.g. 50MiB), each optionally with KEY-burst (at least the rate; default one second's worth), comma-separated, e.g. iops=3000,iops-burst=9000,bw=125MiB; or none";

/// Parses a spec into limits (`none`: no limit).
pub fn parse_qos(spec: &str) -> Result<QosLimits, String> {
    let spec = spec.trim();
    let mut limits = QosLimits::default();
    if spec.eq_ignore_ascii_case("none") {
        return Ok(limits);
    }
    if spec.is_empty() {
        return Err(format!("empty QoS spec: expected {QOS_HELP}"));
    }
    let mut bursts: Vec<(&str, u64)> = Vec::new();
    for item in spec.split(',') {
        let Some((key, value)) = item.split_once('=') else {
            return Err(format!("{item:?}: expected KEY=VALUE ({QOS_HELP})"));
        };
        let (key, value) = (key.trim(), value.trim());
        let (base, is_burst) = match key.strip_suffix("-burst") {
            Some(base) => (base, true),
            None => (key, false),
        };
        let Some(name) = QOS_KEYS.iter().find(|k| **k == base) else {
            return Err(format!("unknown QoS key {key:?}: expected {QOS_HELP}"));
        };
        let n = parse_value(name, value)?;
        if is_burst {
            bursts.push((name, n));
            continue;
        }
        let slot = limits
            .slot(name)
            .ok_or_else(|| format!("unknown QoS key {key:?}"))?;
        if slot.is_some() {
            return Err(format!("{name} given twice"));
        }
        *slot = Some(Limit::per_second(n));
    }
    for (name, burst) in bursts {
        match limits.slot(name) {
            Some(Some(l)) => l.burst = burst,
            _ => {
                return Err(format!(
                    "{name}-burst without {name}: a burst belongs to a limit"
                ))
            }
        }
    }
    limits.validate()?;
    Ok(limits)
}

fn parse_value(name: &str, value: &str) -> Result<u64, String> {
    if value.starts_with('-') {
        return Err(format!("{name}={value}: a limit cannot be negative"));
    }
    let n = if name.ends_with("bw") {
        let v = value.strip_suffix("/s").unwrap_or(value);
        parse_size(v).map_err(|e| format!("{name}: {e}"))?
    } else {
        value.parse::<u64>().map_err(|_| {
            format!(
                "{name}={value}: expected a whole number of requests a second, e.g. {name}=3000"
            )
        })?
    };
    if n == 0 {
        return Err(format!(
            "{name}=0 would stop the volume; leave {name} out for no limit"
        ));
    }
    Ok(n)
}

/// Limits as a spec `parse_qos` reads back (`none` when there are none).
pub fn format_qos(limits: &QosLimits) -> String {
    let mut parts = Vec::new();
    for (name, limit) in limits.limits() {
        let Some(l) = limit else { continue };
        let show = |n: u64| {
            if name.ends_with("bw") {
                format_size(n)
            } else {
                n.to_string()
            }
        };
        parts.push(format!("{name}={}", show(l.rate)));
        if l.burst != l.rate {
            parts.push(format!("{name}-burst={}", show(l.burst)));
        }
    }
    if parts.is_empty() {
        "none".into()
    } else {
        parts.join(",")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_parse_print_back_and_refuse_bad_input_in_one_line() {
        let q = parse_qos("iops=3000, iops-burst=9000,read-bw=50MiB,write-iops=500").unwrap();
        assert_eq!(
            q.iops,
            Some(Limit {
                rate: 3000,
                burst: 9000
            })
        );
        assert_eq!(q.read_bw, Some(Limit::per_second(50 << 20)));
        assert_eq!(q.write_iops, Some(Limit::per_second(500)));
        assert_eq!(parse_qos(&format_qos(&q)).unwrap(), q);
        assert_eq!(format_qos(&parse_qos("none").unwrap()), "none");
        assert_eq!(
            parse_qos("bw=125MiB/s").unwrap().bw,
            Some(Limit::per_second(125 << 20))
        );
        for (bad, says) in [
            ("iops=-5", "negative"),
            ("iops=0", "would stop the volume"),
            ("iops=100,iops-burst=50", "below"),
            ("speed=5", "unknown QoS key"),
            ("iops", "expected KEY=VALUE"),
            ("iops=fast", "whole number"),
            ("bw=lots", "invalid size"),
            ("iops-burst=10", "without iops"),
            ("iops=1,iops=2", "twice"),
            ("", "empty"),
        ] {
            let e = parse_qos(bad).unwrap_err();
            assert!(e.contains(says), "{bad}: {e}");
            assert!(!e.contains('\n'), "{bad}: {e}");
        }
    }
}
