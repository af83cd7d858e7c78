//! The Prometheus text format (version 0.0.4) from the OpenMetrics text
//! that prometheus-client writes, for scrapers that do not ask for
//! OpenMetrics (`curl`, `promtool check metrics`, older agents). The
//! Prometheus server asks for OpenMetrics and gets it unchanged.
//!
//! For the families strata writes (counters, gauges, histograms) the two
//! formats differ in three things only: OpenMetrics names a counter family
//! without its `_total` suffix in `# HELP` and `# TYPE`, has `# UNIT`
//! lines, and ends with `# EOF`. Samples, labels and escaping are the same.

/// The content type of what [`to_classic`] returns.
pub const CLASSIC_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// `openmetrics` (as prometheus-client encodes it) in the classic format.
pub fn to_classic(openmetrics: &str) -> String {
    let mut out = String::with_capacity(openmetrics.len());
    let mut help: Option<&str> = None;
    for line in openmetrics.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        if let Some(rest) = line.strip_prefix("# HELP ") {
            flush_help(&mut out, help.take(), "");
            help = Some(rest);
            continue;
        }
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap_or((rest, ""));
            let suffix = if kind == "counter" { "_total" } else { "" };
            flush_help(&mut out, help.take(), suffix);
            out.push_str(&format!("# TYPE {name}{suffix} {kind}\n"));
            continue;
        }
        flush_help(&mut out, help.take(), "");
        out.push_str(line);
        out.push('\n');
    }
    flush_help(&mut out, help, "");
    out
}

/// Writes a held `# HELP NAME TEXT` line, with `suffix` after the name.
fn flush_help(out: &mut String, help: Option<&str>, suffix: &str) {
    if let Some(rest) = help {
        let (name, text) = rest.split_once(' ').unwrap_or((rest, ""));
        out.push_str(&format!("# HELP {name}{suffix} {text}\n"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renames_counters_and_drops_openmetrics_lines() {
        let om = "\
# HELP strata_nbd_requests NBD requests answered.
# TYPE strata_nbd_requests counter
strata_nbd_requests_total{op=\"read\"} 5
# HELP strata_cache_used_bytes Bytes in use.
# TYPE strata_cache_used_bytes gauge
# UNIT strata_cache_used_bytes bytes
strata_cache_used_bytes{tier=\"ram\"} 4096
# HELP strata_x_seconds Latency.
# TYPE strata_x_seconds histogram
strata_x_seconds_sum 0.5
strata_x_seconds_bucket{le=\"+Inf\"} 1
# EOF
";
        let classic = to_classic(om);
        assert_eq!(
            classic,
            "\
# HELP strata_nbd_requests_total NBD requests answered.
# TYPE strata_nbd_requests_total counter
strata_nbd_requests_total{op=\"read\"} 5
# HELP strata_cache_used_bytes Bytes in use.
# TYPE strata_cache_used_bytes gauge
strata_cache_used_bytes{tier=\"ram\"} 4096
# HELP strata_x_seconds Latency.
# TYPE strata_x_seconds histogram
strata_x_seconds_sum 0.5
strata_x_seconds_bucket{le=\"+Inf\"} 1
"
        );
    }
}
