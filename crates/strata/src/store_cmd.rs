//! Store compatibility at the command line: `strata store check`, and the
//! gate every command that writes volumes passes first.
//!
//! The probe and the remembered verdict are `strata_store`'s
//! (`conditional_write_probe.rs`, `store_check.rs`); this module decides
//! what a verdict means for a command: a store that does not enforce
//! If-None-Match and If-Match on PUT is refused, in one line naming what
//! is missing, unless `--unsafe-single-host`, which serves anyway with a
//! warning (nothing then stops a second writer on another host).

use anyhow::bail;
use strata_store::{
    probe_and_record, remembered_or_probed, ProbeError, Store, StoreCheckRecord, Verdict,
    VerdictSource, PROBE_PREFIX, STORE_CHECK_OBJECT,
};

use crate::cli::{Command, SnapshotCommand, VolumeCommand};

/// What a refusal tells the user to do.
const WAY_OUT: &str = "use a store that supports conditional writes (AWS S3, MinIO, ...) or pass --unsafe-single-host if only one host will ever use this store";

/// What to do when the probe cannot run.
const UNREACHABLE: &str = "check that the store is reachable and that strata may write and delete objects under its prefix, then try again";

/// Whether `command` may write volumes (take a lease, write a manifest or
/// segments), and so needs a store that enforces conditional writes.
pub fn writes_volumes(command: &Command) -> bool {
    match command {
        Command::Serve(_) | Command::Csi(_) => true,
        Command::Volume(v) => !matches!(
            v,
            VolumeCommand::List { .. }
                | VolumeCommand::Info { .. }
                | VolumeCommand::Export { .. }
                | VolumeCommand::Diff { .. }
                | VolumeCommand::ExportDiff { .. }
        ),
        Command::Snapshot(s) => !matches!(
            s,
            SnapshotCommand::List { .. } | SnapshotCommand::Profile { .. }
        ),
        Command::Key(_) | Command::Store(_) | Command::Fsck(_) => false,
    }
}

/// Refuses a store that does not enforce conditional writes (see the
/// module doc). The verdict is the one remembered in the store, or the
/// probe's on first use, logged at info level (which only a server shows
/// by default: a command's output is what the user asked for).
pub async fn require_conditional_writes(
    store: &Store,
    unsafe_single_host: bool,
) -> anyhow::Result<()> {
    if unsafe_single_host {
        tracing::warn!(store = %store.description(), "--unsafe-single-host: a store that ignores conditional writes is not refused; nothing protects a volume against a second writer, so only this host may ever use this store");
    }
    let (record, source) = match remembered_or_probed(store).await {
        Ok(found) => found,
        Err(e) if unsafe_single_host => {
            tracing::warn!(error = %strata_store::ErrorText(&e), "cannot check the store's conditional writes; going on (--unsafe-single-host)");
            return Ok(());
        }
        Err(e) => return Err(probe_failed(e)),
    };
    log_verdict(store, &record, source);
    let Some(shortcoming) = record.report.shortcoming() else {
        return Ok(());
    };
    if unsafe_single_host {
        tracing::warn!("{shortcoming} (serving anyway: --unsafe-single-host)");
        return Ok(());
    }
    let when = match source {
        VerdictSource::Probed => String::new(),
        VerdictSource::Remembered => format!(
            " (found {} by strata {}; `strata store check` probes again)",
            record.checked_at, record.strata_version
        ),
    };
    bail!("{shortcoming}; {WAY_OUT}{when}")
}

/// A probe that could not run, said once: an explained store error says
/// what to do itself; another gets the generic advice.
fn probe_failed(e: ProbeError) -> anyhow::Error {
    match e.is_explained() {
        true => anyhow::anyhow!("{e}"),
        false => anyhow::anyhow!("{e}; {UNREACHABLE}"),
    }
}

fn log_verdict(store: &Store, record: &StoreCheckRecord, source: VerdictSource) {
    let store = store.description();
    let safe = record.report.is_safe();
    match source {
        VerdictSource::Probed => {
            tracing::info!(%store, safe, object = STORE_CHECK_OBJECT, "probed the store's conditional writes (first use); verdict recorded")
        }
        VerdictSource::Remembered => {
            tracing::debug!(%store, safe, checked_at = %record.checked_at, "conditional writes: using the remembered verdict")
        }
    }
}

/// `strata store check`: probes `store` now, records the verdict, prints
/// what was verified; an error (non-zero exit) if anything is missing.
pub async fn check(store: &Store, json: bool) -> anyhow::Result<()> {
    if !json {
        println!(
            "probing {} for conditional writes (objects under {PROBE_PREFIX}/, deleted afterwards)",
            store.description()
        );
    }
    let record = probe_and_record(store).await.map_err(probe_failed)?;
    if json {
        println!("{}", serde_json::to_string_pretty(&record)?);
    } else {
        print_record(&record);
    }
    match record.report.shortcoming() {
        None => Ok(()),
        Some(s) => bail!("{s}; strata refuses to serve on it: {WAY_OUT}"),
    }
}

fn print_record(record: &StoreCheckRecord) {
    for (condition, check) in record.report.checks() {
        let verdict = match check.verdict {
            Verdict::Enforced => "enforced",
            Verdict::Ignored => "IGNORED",
            Verdict::Unsupported => "NOT SUPPORTED",
        };
        println!("  {}: {verdict}: {}", condition.feature(), check.detail);
    }
    if record.report.is_safe() {
        println!(
            "the store enforces the conditional writes strata relies on; verdict recorded in {STORE_CHECK_OBJECT}"
        );
    }
}
