//! `strata snapshot`: create, list, delete, roll back. Create and delete
//! go through the server on this host when it serves the volume; a volume
//! nobody serves is opened here (its lease held) for the operation.

use anyhow::{bail, Context};
use std::io::Write;

use strata_volume::{
    split_export_name, AccessProfile, ChangeKind, Engine, ExportName, ImageSink, SnapshotRecord,
};

use crate::cli::{SnapshotCommand, VolumeCommand};
use crate::control::{self, Request};
use crate::progress::Progress;
use crate::size::{format_size, size_option};

pub async fn run(engine: &Engine, cmd: &SnapshotCommand) -> anyhow::Result<()> {
    match cmd {
        SnapshotCommand::Create { target, json } => {
            let (volume, snapshot) = split_target(target)?;
            let req = Request::SnapshotCreate {
                volume: volume.into(),
                snapshot: snapshot.into(),
            };
            let what = format!("take snapshot {target}");
            let command = format!("strata snapshot create {target}");
            let record: SnapshotRecord =
                match control::on_serving_server(engine, volume, &req, &what, &command).await? {
                    Some(v) => serde_json::from_value(v).context("the server's reply")?,
                    None => engine.create_snapshot(volume, snapshot).await?,
                };
            if *json {
                println!("{}", serde_json::to_string_pretty(&record)?);
            } else {
                println!(
                    "created snapshot {volume}@{} (checkpoint {}); served read-only as export {volume}@{}",
                    record.name, record.checkpoint_seq, record.name
                );
            }
        }
        SnapshotCommand::List { volume, json } => {
            let snapshots = engine.list_snapshots(volume).await?;
            if *json {
                println!("{}", serde_json::to_string_pretty(&snapshots)?);
            } else if snapshots.is_empty() {
                println!("volume {volume} has no snapshots");
            } else {
                print_table(&snapshots);
            }
        }
        SnapshotCommand::Delete { target } => {
            let (volume, snapshot) = split_target(target)?;
            let req = Request::SnapshotDelete {
                volume: volume.into(),
                snapshot: snapshot.into(),
            };
            let what = format!("delete snapshot {target}");
            let command = format!("strata snapshot delete {target}");
            if control::on_serving_server(engine, volume, &req, &what, &command)
                .await?
                .is_none()
            {
                engine.delete_snapshot(volume, snapshot).await?;
            }
            println!("deleted snapshot {target}; garbage collection reclaims what only it kept");
        }
        SnapshotCommand::Rollback { target } => {
            let (volume, snapshot) = split_target(target)?;
            let stats = Request::Stats {
                volume: volume.into(),
            };
            let dir = &engine.config().data_dir;
            if let Some(control::Reply::Ok(_)) = control::ask(dir, &stats).await? {
                bail!("volume {volume:?} is being served by the strata server on this host; stop serving it before a rollback (its clients would see the data change under them)");
            }
            let r = engine.rollback_snapshot(volume, snapshot).await?;
            println!(
                "rolled {volume} back to snapshot {} (checkpoint {}); writes since the snapshot are gone",
                r.snapshot, r.checkpoint_seq
            );
        }
        SnapshotCommand::Profile { target, json } => {
            let (volume, snapshot) = split_target(target)?;
            let profile = engine.snapshot_profile(volume, snapshot).await?;
            match profile {
                None if *json => println!("null"),
                None => println!(
                    "snapshot {target} has no access profile yet: the first clone of it served with --profile-record on records one"
                ),
                Some(p) if *json => println!("{}", profile_json(&p)),
                Some(p) => print_profile(target, &p),
            }
        }
    }
    Ok(())
}

/// `volume diff`, `export-diff`, `import-diff`, `export`, `import`.
pub async fn data_command(engine: &Engine, cmd: &VolumeCommand) -> anyhow::Result<()> {
    match cmd {
        VolumeCommand::Diff { from, to, json } => {
            let (volume, a, b) = split_pair(from, to)?;
            let changes = engine.diff_snapshots(volume, a, b).await?;
            if *json {
                println!("{}", serde_json::to_string_pretty(&changes)?);
                return Ok(());
            }
            for c in &changes {
                let kind = match c.kind {
                    ChangeKind::Data => "data",
                    ChangeKind::Zero => "zero",
                };
                println!("{:>16} {:>16} {kind}", c.offset, c.length);
            }
            let bytes: u64 = changes.iter().map(|c| c.length).sum();
            eprintln!(
                "{} ranges changed from {from} to {to}, {}",
                changes.len(),
                format_size(bytes)
            );
        }
        VolumeCommand::ExportDiff { from, to, file } => {
            let (volume, a, b) = split_pair(from, to)?;
            let mut out: Box<dyn Write + Send> = if file.as_os_str() == "-" {
                Box::new(std::io::BufWriter::new(std::io::stdout()))
            } else {
                let f = std::fs::File::create(file)
                    .with_context(|| format!("cannot create {}", file.display()))?;
                Box::new(std::io::BufWriter::new(f))
            };
            let progress = Progress::new("exporting");
            let sum = engine
                .export_diff(volume, a, b, &mut out, &|done, total| {
                    progress.show(done, total)
                })
                .await?;
            progress.finish();
            eprintln!(
                "exported {from} -> {to}: {} records, {} of data, {} of zeros",
                sum.records,
                format_size(sum.data_bytes),
                format_size(sum.zero_bytes)
            );
        }
        VolumeCommand::Export { source, file } => {
            let (volume, snapshot) = match split_export_name(source) {
                Ok(ExportName::Volume(v)) => (v, None),
                Ok(ExportName::Snapshot { volume, snapshot }) => (volume, Some(snapshot)),
                Err(e) => bail!("bad volume or snapshot {source:?}: {e}"),
            };
            let progress = Progress::new("exporting");
            let show = |done, total| progress.show(done, total);
            let sum = if file.as_os_str() == "-" {
                let mut out = std::io::BufWriter::new(std::io::stdout());
                engine
                    .export_image(volume, snapshot, ImageSink::Stream(&mut out), &show)
                    .await?
            } else {
                let f = std::fs::OpenOptions::new()
                    .write(true)
                    .create(true)
                    .truncate(true)
                    .open(file)
                    .with_context(|| format!("cannot create {}", file.display()))?;
                engine
                    .export_image(volume, snapshot, ImageSink::File(&f), &show)
                    .await?
            };
            progress.finish();
            eprintln!(
                "exported {source} ({}): {} of data, {} of holes",
                format_size(sum.size_bytes),
                format_size(sum.data_bytes),
                format_size(sum.zero_bytes)
            );
        }
        VolumeCommand::Import { file, volume, size } => {
            let given = size
                .as_deref()
                .map(|s| size_option("--size", s))
                .transpose()?;
            let stdin = file.as_os_str() == "-";
            let size_bytes = match (given, stdin) {
                (Some(s), _) => s,
                (None, false) => {
                    let len = std::fs::metadata(file)
                        .with_context(|| format!("cannot read {}", file.display()))?
                        .len();
                    len.div_ceil(512) * 512
                }
                (None, true) => match engine.volume_info_with(volume, false).await {
                    Ok(v) => v.size_bytes,
                    Err(_) => bail!("importing from standard input into a new volume needs --size"),
                },
            };
            let progress = Progress::new("importing");
            let show = |done, total| progress.show(done, total);
            let sum = if stdin {
                let mut input = std::io::BufReader::new(std::io::stdin());
                engine
                    .import_image(&mut input, volume, size_bytes, &show)
                    .await?
            } else {
                let mut input = std::fs::File::open(file)
                    .with_context(|| format!("cannot open {}", file.display()))?;
                engine
                    .import_image(&mut input, volume, size_bytes, &show)
                    .await?
            };
            progress.finish();
            println!(
                "imported {} into {volume} ({}): {} of data stored, {} of zeros skipped",
                file.display(),
                format_size(sum.size_bytes),
                format_size(sum.data_bytes),
                format_size(sum.zero_bytes)
            );
        }
        VolumeCommand::ImportDiff { file, volume } => {
            let sum = engine.import_diff(file, volume).await?;
            println!(
                "applied {} to {volume}: {} of data, {} of zeros",
                file.display(),
                format_size(sum.data_bytes),
                format_size(sum.zero_bytes)
            );
        }
        _ => {}
    }
    Ok(())
}

/// `VOL@A` and `VOL@B` of one volume.
fn split_pair<'a>(from: &'a str, to: &'a str) -> anyhow::Result<(&'a str, &'a str, &'a str)> {
    let (va, a) = split_target(from)?;
    let (vb, b) = split_target(to)?;
    if va != vb {
        bail!("{from} and {to} are snapshots of different volumes; a diff is between two snapshots of one volume");
    }
    Ok((va, a, b))
}

/// `VOLUME@SNAPSHOT`, both names checked.
pub fn split_target(target: &str) -> anyhow::Result<(&str, &str)> {
    match split_export_name(target) {
        Ok(ExportName::Snapshot { volume, snapshot }) => Ok((volume, snapshot)),
        Ok(ExportName::Volume(_)) => {
            bail!("{target:?} names a volume; give VOLUME@SNAPSHOT, e.g. {target}@before-upgrade")
        }
        Err(e) => bail!("bad snapshot {target:?}: {e}"),
    }
}

fn print_table(snapshots: &[SnapshotRecord]) {
    println!(
        "{:<32} {:>20} {:>12} {:>11}",
        "NAME", "CREATED (UTC)", "SIZE", "CHECKPOINT"
    );
    for s in snapshots {
        let deleting = if s.deleting { "  (being deleted)" } else { "" };
        println!(
            "{:<32} {:>20} {:>12} {:>11}{deleting}",
            s.name,
            utc(s.created_unix_ms),
            format_size(s.size_bytes),
            s.checkpoint_seq
        );
    }
}

/// `YYYY-MM-DD HH:MM:SS` of a Unix time in milliseconds.
fn utc(unix_ms: u64) -> String {
    let secs = (unix_ms / 1000) as i64;
    chrono::DateTime::from_timestamp(secs, 0).map_or_else(
        || unix_ms.to_string(),
        |t| t.format("%Y-%m-%d %H:%M:%S").to_string(),
    )
}

/// `snapshot profile --json`: the header and every range.
fn profile_json(p: &AccessProfile) -> String {
    let ranges: Vec<serde_json::Value> = p
        .ranges
        .iter()
        .map(|r| serde_json::json!({"offset": r.offset, "len": r.len, "at_ms": r.at_ms}))
        .collect();
    let v = serde_json::json!({
        "checkpoint_seq": p.checkpoint_seq,
        "size_bytes": p.size_bytes,
        "recorded_ms": p.recorded_ms,
        "bytes": p.bytes(),
        "ranges": ranges,
    });
    serde_json::to_string_pretty(&v).unwrap_or_default()
}

/// `snapshot profile`: a summary and the first ranges.
fn print_profile(target: &str, p: &AccessProfile) {
    const SHOWN: usize = 20;
    println!(
        "access profile of {target} (checkpoint {}): {} ranges, {} read in the first {:.1} s",
        p.checkpoint_seq,
        p.ranges.len(),
        format_size(p.bytes()),
        p.recorded_ms as f64 / 1000.0
    );
    println!("{:>10} {:>16} {:>12}", "AT", "OFFSET", "LENGTH");
    for r in p.ranges.iter().take(SHOWN) {
        println!(
            "{:>8}ms {:>16} {:>12}",
            r.at_ms,
            r.offset,
            format_size(r.len)
        );
    }
    if p.ranges.len() > SHOWN {
        println!(
            "... and {} more (--json lists them all)",
            p.ranges.len() - SHOWN
        );
    }
}
