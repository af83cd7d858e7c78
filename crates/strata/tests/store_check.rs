//! Store compatibility at the command line (issue 13, section 4): strata
//! needs a store that enforces If-None-Match and If-Match on PUT.
//!
//! - `strata store check` prints what it verified and exits 0 on the
//!   embedded store and MinIO; on a store that ignores either condition
//!   (the fault layer's `ignore_if_none_match` / `ignore_if_match`, each on
//!   its own) it says IGNORED and exits 1 with a one-line error naming it.
//! - `strata serve` (and `volume create`) refuse such a store with that
//!   line and a non-zero exit; `--unsafe-single-host` serves it, with a
//!   warning in the log, and the volume works.
//! - The verdict is remembered in `.strata-store-check`: a second start
//!   does not probe, a remembered refusal is honoured until `strata store
//!   check` probes again.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use common::clients::{qemu_io, qemu_io_verify};
use common::*;
use std::path::Path;
use std::process::Output;
use std::time::Duration;

const NONE_MATCH: &str = "If-None-Match on PUT (create-only writes)";
const IF_MATCH: &str = "If-Match on PUT (writes conditional on the version read)";

/// `strata [--inject-faults FAULTS] ARGS` with `dir/data` as data dir.
fn strata(dir: &Path, s3: Option<&S3Store>, faults: &str, args: &[&str]) -> Output {
    let mut c = strata_command(s3, &[]);
    c.arg("--data-dir").arg(dir.join("data"));
    if !faults.is_empty() {
        c.args(["--inject-faults", faults]);
    }
    c.args(args);
    run_timeout(&mut c, Duration::from_secs(120))
}

/// The error line of a failed command: exit 1, and the last line of stderr
/// is strata's one-line error.
fn error_line(out: &Output, what: &str) -> String {
    let err = stderr_str(out);
    assert_eq!(
        out.status.code(),
        Some(1),
        "{what}: {}\n{err}",
        stdout_str(out)
    );
    let line = err.lines().last().unwrap_or_default().to_string();
    assert!(line.starts_with("strata: error: "), "{what}: {err}");
    line
}

fn assert_check_passes(out: &Output, what: &str) {
    let so = stdout_str(out);
    assert!(out.status.success(), "{what}: {so}\n{}", stderr_str(out));
    assert!(
        so.contains(&format!("{NONE_MATCH}: enforced")),
        "{what}: {so}"
    );
    assert!(
        so.contains(&format!("{IF_MATCH}: enforced")),
        "{what}: {so}"
    );
    eprintln!("{what}:\n{so}");
}

/// `store check` refuses, naming exactly `missing` (as IGNORED on stdout
/// and in the error line), and says how to go on anyway.
fn assert_check_refuses(out: &Output, missing: &[&str], what: &str) {
    let so = stdout_str(out);
    let line = error_line(out, what);
    for feature in [NONE_MATCH, IF_MATCH] {
        let ignored = missing.contains(&feature);
        assert_eq!(
            so.contains(&format!("{feature}: IGNORED")),
            ignored,
            "{what}: {so}"
        );
        assert_eq!(
            line.contains(&format!("ignores {feature}")),
            ignored,
            "{what}: {line}"
        );
    }
    assert!(line.contains("--unsafe-single-host"), "{what}: {line}");
    eprintln!("{what}: {line}");
}

#[test]
fn store_check_reports_good_and_bad_stores() {
    let tmp = tempfile::TempDir::new().unwrap();
    let dir = tmp.path();
    let store = dir.join("store");
    let store_arg = store.to_str().unwrap();

    let out = strata(dir, None, "", &["store", "check", store_arg]);
    assert_check_passes(&out, "embedded store");
    assert!(stdout_str(&out).contains("flock"), "{}", stdout_str(&out));
    assert!(store.join(".strata-store-check").is_file());
    let out = strata(
        dir,
        None,
        "",
        &["--store", store_arg, "store", "check", "--json"],
    );
    let record: serde_json::Value = serde_json::from_str(&stdout_str(&out)).unwrap();
    assert_eq!(record["report"]["if_none_match"]["verdict"], "enforced");
    assert_eq!(record["report"]["if_match"]["verdict"], "enforced");

    let bad = dir.join("bad").display().to_string();
    let out = strata(
        dir,
        None,
        "ignore_if_none_match=1",
        &["store", "check", &bad],
    );
    assert_check_refuses(&out, &[NONE_MATCH], "embedded store ignoring If-None-Match");
    let out = strata(
        dir,
        None,
        "ignore_if_match=1",
        &["store", "check", "memory://"],
    );
    assert_check_refuses(&out, &[IF_MATCH], "memory store ignoring If-Match");

    let s3 = S3Store::on_shared("check");
    let url = s3.url();
    assert_check_passes(
        &strata(dir, Some(&s3), "", &["store", "check", &url]),
        "MinIO",
    );
    assert_eq!(
        s3.list(".strata-probe/"),
        Vec::<(String, u64)>::new(),
        "probe objects left behind"
    );
    let out = strata(
        dir,
        Some(&s3),
        "ignore_conditions=1",
        &["store", "check", &url],
    );
    assert_check_refuses(&out, &[NONE_MATCH, IF_MATCH], "MinIO ignoring both");
}

#[test]
fn serve_refuses_a_store_that_ignores_conditions() {
    let _serial = serial();
    let tmp = tempfile::TempDir::new().unwrap();
    let dir = tmp.path();
    let store = dir.join("store").display().to_string();
    let serve = ["--store", store.as_str(), "serve", "--create", "vol=64MiB"];
    let out = strata(dir, None, "ignore_if_none_match=1", &serve);
    let line = error_line(&out, "serve ignoring If-None-Match");
    assert!(
        line.contains(&format!("the store at file://{store} ignores {NONE_MATCH}")),
        "{line}"
    );
    assert!(
        line.contains("two strata processes could both own a volume"),
        "{line}"
    );
    assert!(line.contains("--unsafe-single-host"), "{line}");
    assert!(!dir.join("store/vol").exists(), "a volume was created");

    // Other writing commands are refused too; reading ones are not.
    let create = [
        "--store",
        store.as_str(),
        "volume",
        "create",
        "v",
        "--size",
        "1MiB",
    ];
    let line = error_line(&strata(dir, None, "", &create), "volume create");
    assert!(line.contains(&format!("ignores {NONE_MATCH}")), "{line}");
    assert!(line.contains("`strata store check` probes again"), "{line}");
    let list = strata(
        dir,
        None,
        "",
        &["--store", store.as_str(), "volume", "list"],
    );
    assert!(list.status.success(), "{}", stderr_str(&list));
    // STRATA_UNSAFE_SINGLE_HOST=1 is --unsafe-single-host.
    let unsafe_env = [("STRATA_UNSAFE_SINGLE_HOST".to_string(), "1".to_string())];
    let mut c = strata_command(None, &unsafe_env);
    c.arg("--data-dir").arg(dir.join("data")).args(create);
    let out = run_timeout(&mut c, Duration::from_secs(60));
    let err = stderr_str(&out);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains("WARN") && err.contains("--unsafe-single-host"),
        "{err}"
    );

    let s3 = S3Store::on_shared("refuse");
    let url = s3.url();
    let serve = ["--store", url.as_str(), "serve", "--create", "vol=64MiB"];
    let out = strata(dir, Some(&s3), "ignore_if_match=1", &serve);
    let line = error_line(&out, "serve on MinIO ignoring If-Match");
    assert!(line.contains(&format!("ignores {IF_MATCH}")), "{line}");
    assert!(!line.contains(NONE_MATCH), "{line}");
    assert_eq!(
        s3.list("vol/"),
        Vec::<(String, u64)>::new(),
        "the refused server wrote a volume"
    );
}

#[test]
fn unsafe_single_host_serves_with_a_warning() {
    let _serial = serial();
    require_tools(&["qemu-io"]);
    let help = strata(Path::new("/nonexistent"), None, "", &["serve", "--help"]);
    assert!(
        stdout_str(&help).contains("--unsafe-single-host"),
        "not in --help"
    );

    let tmp = tempfile::TempDir::new().unwrap();
    let target = Target::strata_with(&["--unsafe-single-host"])
        .with_env("STRATA_FAULTS", "ignore_if_none_match=1");
    let server = Server::start(tmp.path(), target, &[("vol", 64 * MIB)]);
    let log = server.stderr();
    let warning = log.lines().find(|l| {
        l.contains("WARN") && l.contains("--unsafe-single-host") && l.contains("second writer")
    });
    assert!(warning.is_some(), "no warning in the log:\n{log}");
    assert!(
        log.lines()
            .any(|l| l.contains("WARN") && l.contains(&format!("ignores {NONE_MATCH}"))),
        "the log does not say what the store lacks:\n{log}"
    );
    let uri = server.vol_uri();
    let out = qemu_io(&uri, &["write -P 0x5a 4096 65536".to_string()]);
    assert!(out.status.success(), "{}", stderr_str(&out));
    qemu_io_verify(
        &uri,
        &["read -P 0x5a 4096 65536".to_string()],
        "on an unsafe store",
    );
}

/// The probe leaves its trace in the log of the start that ran it only.
const PROBED: &str = "probed the store's conditional writes (first use)";

#[test]
fn the_remembered_verdict_is_used() {
    let _serial = serial();
    let tmp = tempfile::TempDir::new().unwrap();
    let mut server = Server::start(tmp.path(), Target::strata(), &[("vol", 64 * MIB)]);
    assert!(
        server.last_stderr().contains(PROBED),
        "{}",
        server.last_stderr()
    );
    let record_path = server.store_dir().join(".strata-store-check");
    let record = std::fs::read_to_string(&record_path).unwrap();
    server.restart();
    assert!(
        !server.last_stderr().contains(PROBED),
        "probed again:\n{}",
        server.last_stderr()
    );
    server.stop();
    assert_eq!(
        std::fs::read_to_string(&record_path).unwrap(),
        record,
        "record rewritten"
    );

    // A remembered refusal is honoured without probing (the store is fine)...
    let refused = record.replacen("\"enforced\"", "\"ignored\"", 1);
    assert_ne!(refused, record);
    std::fs::write(&record_path, refused).unwrap();
    let err = match server.try_start_again() {
        Ok(()) => panic!("served on a store remembered as unsafe"),
        Err((_, err)) => err,
    };
    let line = err.lines().last().unwrap_or_default();
    assert!(line.contains(&format!("ignores {NONE_MATCH}")), "{err}");
    assert!(line.contains("`strata store check` probes again"), "{err}");
    assert!(!err.contains(PROBED), "{err}");

    // ...until `strata store check` probes again.
    let out = server.cli(&["store", "check"]);
    assert_check_passes(&out, "store check after a remembered refusal");
    server.start_again();
    assert!(
        !server.last_stderr().contains(PROBED),
        "{}",
        server.last_stderr()
    );
}
