//! `strata fsck VOL[@SNAP]`: checks what the store holds of a volume, a
//! snapshot or a clone (the engine's `fsck/`), prints the problems and
//! what each affects (or one JSON document), and sets the exit status:
//! 0 no error found, 1 errors found, 2 the check could not run.

use std::process::ExitCode;

use strata_volume::{
    split_export_name, AffectedRanges, Engine, ExportName, FsckOptions, FsckProgress, FsckReport,
    Problem, Severity,
};

use crate::cli::FsckArgs;
use crate::progress::Progress;

/// Exit status when the check found errors.
pub const EXIT_PROBLEMS: u8 = 1;
/// Exit status when the check could not run.
pub const EXIT_NOT_RUN: u8 = 2;
/// Ranges printed per volume or snapshot of a problem (JSON has more).
const PRINTED_RANGES: usize = 8;

pub async fn run(engine: &Engine, args: &FsckArgs) -> anyhow::Result<ExitCode> {
    let (volume, snapshot) = match split_export_name(&args.target) {
        Ok(ExportName::Volume(v)) => (v, None),
        Ok(ExportName::Snapshot { volume, snapshot }) => (volume, Some(snapshot)),
        Err(e) => anyhow::bail!("bad volume or snapshot {:?}: {e}", args.target),
    };
    let progress = match args.quick {
        true => Progress::counting("checking headers", "segments"),
        false => Progress::new("checking"),
    };
    let show = |p: FsckProgress| match args.quick {
        true => progress.show(p.segments_done, p.segments_total),
        false => progress.show(p.bytes_done, p.bytes_total),
    };
    let options = FsckOptions { quick: args.quick };
    let report = engine.fsck(volume, snapshot, options, &show).await;
    progress.finish();
    let report = report?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print_report(&args.target, &report);
    }
    Ok(match report.clean {
        true => ExitCode::SUCCESS,
        false => ExitCode::from(EXIT_PROBLEMS),
    })
}

fn print_report(target: &str, r: &FsckReport) {
    let mode = if r.quick { "quick check" } else { "check" };
    let at = r
        .checkpoint_seq
        .map_or(String::new(), |c| format!(", checkpoint {c}"));
    let clone = r
        .clone_of
        .as_ref()
        .map_or(String::new(), |p| format!(", a clone of {p}"));
    println!("{mode} of {target}{at}{clone}");
    if let Some(holder) = &r.served_by {
        println!("  served by {holder} (checked while served: read only)");
    }
    print_checked(r);
    for p in &r.problems {
        print_problem(target, r, p);
    }
    if r.problems_omitted > 0 {
        println!(
            "({} more problems not listed; --json lists the first {} too)",
            r.problems_omitted,
            r.problems.len()
        );
    }
    let warnings = match r.warnings {
        0 => String::new(),
        1 => ", 1 warning".into(),
        n => format!(", {n} warnings"),
    };
    match r.errors {
        0 => println!("{target}: clean{warnings}"),
        1 => println!("{target}: 1 error{warnings}"),
        n => println!("{target}: {n} errors{warnings}"),
    }
}

fn print_checked(r: &FsckReport) {
    let c = &r.checked;
    let inherited = match c.ancestor_segments {
        0 => String::new(),
        n => format!(" ({n} inherited)"),
    };
    println!(
        "  checked {}, {}, {}, {}, {}{inherited}, {}",
        count(c.checkpoints, "checkpoint"),
        count(c.snapshots, "snapshot"),
        count(c.snapshot_deltas, "delta"),
        count(c.clone_markers, "clone marker"),
        count(c.segments, "segment"),
        count(c.extents, "map extent")
    );
    let data = match r.quick {
        true => "data not read (--quick)".to_string(),
        false => format!("{} of data verified", approx(c.data_bytes_verified)),
    };
    println!("  read {}; {data}", approx(c.bytes_read));
    if let Some(s) = &r.space {
        println!(
            "  space: {}, {} stored, {} live, {} referenced with snapshots, {} unreferenced; {} ({}) pending deletion",
            count(s.stored_segments, "segment"),
            approx(s.stored_bytes),
            approx(s.live_bytes),
            approx(s.referenced_bytes),
            approx(s.unreferenced_bytes),
            count(s.pending_deletions, "object"),
            approx(s.pending_bytes)
        );
    }
    if r.collected_while_checking > 0 {
        println!(
            "  {} deleted by garbage collection while checking (no longer needed: not problems)",
            count(r.collected_while_checking, "object")
        );
    }
}

fn print_problem(target: &str, r: &FsckReport, p: &Problem) {
    let severity = match p.severity {
        Severity::Error => "ERROR",
        Severity::Warning => "warning",
    };
    let kind = serde_json::to_value(p.kind)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default();
    println!("{severity} ({kind}) {}: {}", p.object, p.detail);
    let a = &p.affects;
    if let Some(v) = &a.volume {
        let name = target.split('@').next().unwrap_or(target);
        println!("  affects volume {name}: {}", ranges(v));
    }
    for s in &a.snapshots {
        println!(
            "  affects snapshot {}@{}: {}",
            r.volume,
            s.snapshot,
            ranges(&s.ranges)
        );
    }
    if !a.clones.is_empty() {
        println!("  affects clones: {}", a.clones.join(", "));
    }
}

/// `1 segment`, `2 segments`.
fn count(n: u64, what: &str) -> String {
    match n {
        1 => format!("1 {what}"),
        n => format!("{n} {what}s"),
    }
}

/// `bytes 0..4096, 8192..12288 (8.0 KiB)` or `all of it`.
fn ranges(r: &AffectedRanges) -> String {
    if r.whole {
        return "all of it (its map is lost)".into();
    }
    let listed: Vec<String> = r
        .ranges
        .iter()
        .take(PRINTED_RANGES)
        .map(|b| format!("{}..{}", b.offset, b.offset + b.length))
        .collect();
    let more = r.ranges.len().saturating_sub(PRINTED_RANGES) as u64 + r.ranges_omitted;
    let more = match more {
        0 => String::new(),
        n => format!(" and {n} more ranges"),
    };
    format!("bytes {}{more} ({})", listed.join(", "), approx(r.bytes))
}

/// `4.0 KiB`, `12.3 MiB`: a size for people (exact byte counts are in
/// the JSON).
fn approx(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut value = bytes as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.1} {}", UNITS[unit])
}
