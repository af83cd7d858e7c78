//! Snapshot operations killed at each step (named crash points: the
//! process aborts where `STRATA_CRASH_AT` says, as kill -9 would stop it):
//! a create once its checkpoint is stored but not named, and after the
//! manifest write; a delete after its write; a rollback before and after
//! its write. After each, the restarted server shows the operation done
//! completely or not at all (`snapshot list`, `volume info`), every
//! acknowledged write reads back, and the next operations work.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use common::clients::{qemu_io, qemu_io_verify};
use common::*;

const VOL: u64 = 32 * MIB;
const DATA_MIB: u64 = 8;
const ARGS: [&str; 4] = ["--segment-size", "1MiB", "--gc-grace-ms", "0"];

fn fill(pattern: u8) -> Vec<String> {
    let mut cmds: Vec<String> = (0..DATA_MIB)
        .map(|i| format!("write -P {pattern:#x} {i}M 1M"))
        .collect();
    cmds.push("flush".into());
    cmds
}

fn expect(pattern: u8) -> Vec<String> {
    vec![
        format!("read -P {pattern:#x} 0 {DATA_MIB}M"),
        format!("read -P 0 {DATA_MIB}M {}M", VOL / MIB - DATA_MIB),
    ]
}

fn write(server: &Server, pattern: u8) {
    let out = qemu_io(&server.vol_uri(), &fill(pattern));
    assert!(out.status.success(), "{}", stderr_str(&out));
}

fn snapshots(server: &Server) -> Vec<String> {
    let json = server.cli_ok(&["snapshot", "list", "vol", "--json"]);
    let list: serde_json::Value = serde_json::from_str(&json).unwrap();
    list.as_array()
        .unwrap()
        .iter()
        .map(|s| s["name"].as_str().unwrap().to_string())
        .collect()
}

/// Asks the server (which has `STRATA_CRASH_AT=point`) to run `args` and
/// checks that it aborted there; restarts it without the crash point.
fn crash_server_at(server: &mut Server, point: &str, args: &[&str]) {
    server.expect_crash(point, args);
    server.target = Target::strata_with(&ARGS);
    server.start_again();
}

fn create_killed_at(tmp: &std::path::Path, point: &str, done: bool) {
    let dir = tmp.join(point.replace('.', "-"));
    let crashing = Target::strata_with(&ARGS).with_env("STRATA_CRASH_AT", point);
    let mut server = Server::start(&dir, crashing, &[("vol", VOL)]);
    write(&server, 0x11);
    crash_server_at(&mut server, point, &["snapshot", "create", "vol@s"]);
    let listed = snapshots(&server);
    assert_eq!(
        listed.contains(&"s".to_string()),
        done,
        "{point}: snapshots after the crash: {listed:?}"
    );
    qemu_io_verify(
        &server.vol_uri(),
        &expect(0x11),
        &format!("{point}: the volume"),
    );
    if done {
        qemu_io_verify(
            &server.uri("vol@s"),
            &expect(0x11),
            &format!("{point}: the snapshot"),
        );
    } else {
        server.cli_ok(&["snapshot", "create", "vol@s"]);
    }
    write(&server, 0x22);
    server.cli_ok(&["volume", "gc", "vol", "--wait"]);
    qemu_io_verify(
        &server.uri("vol@s"),
        &expect(0x11),
        &format!("{point}: the snapshot after GC"),
    );
    qemu_io_verify(
        &server.vol_uri(),
        &expect(0x22),
        &format!("{point}: the volume after GC"),
    );
    server.stop();
}

#[test]
fn a_snapshot_create_killed_at_each_step_happened_or_not() {
    require_tools(&["qemu-io"]);
    let _serial = serial();
    let tmp = tempfile::TempDir::new().unwrap();
    assert_eq!(
        strata_volume::SNAPSHOT_CRASH_POINTS.len(),
        12,
        "a crash point without a test (the clone's and flatten's are in clones.rs, the resize's in resize.rs)"
    );
    create_killed_at(tmp.path(), "snapshot.before_manifest", false);
    create_killed_at(tmp.path(), "snapshot.after_create", true);
}

#[test]
fn a_snapshot_delete_killed_after_its_write_is_done_and_space_comes_back() {
    require_tools(&["qemu-io"]);
    let _serial = serial();
    let tmp = tempfile::TempDir::new().unwrap();
    let point = "snapshot.after_delete";
    let crashing = Target::strata_with(&ARGS).with_env("STRATA_CRASH_AT", point);
    let mut server = Server::start(tmp.path(), crashing, &[("vol", VOL)]);
    write(&server, 0x11);
    server.cli_ok(&["snapshot", "create", "vol@s"]);
    write(&server, 0x22);
    crash_server_at(&mut server, point, &["snapshot", "delete", "vol@s"]);
    assert!(
        snapshots(&server).is_empty(),
        "{point}: the snapshot is still listed"
    );
    qemu_io_verify(
        &server.vol_uri(),
        &expect(0x22),
        "the volume after the crash",
    );
    server.cli_ok(&["volume", "gc", "vol", "--wait"]);
    let info: serde_json::Value =
        serde_json::from_str(&server.cli_ok(&["volume", "info", "vol", "--json"])).unwrap();
    let stored = info["stored_bytes"].as_u64().unwrap();
    let live = DATA_MIB * MIB;
    assert!(
        stored * 2 < live * 3,
        "{point}: {stored} bytes stored for {live} live"
    );
    qemu_io_verify(&server.vol_uri(), &expect(0x22), "the volume after GC");
    server.stop();
}

/// A middle snapshot's deletion killed after its write: the next
/// snapshot's delta now leads from the one before (the merge was stored
/// before the write), `volume diff` across the gap says what changed, and
/// the deltas nothing names are gone after a GC pass.
#[test]
fn a_middle_snapshot_delete_killed_after_its_write_keeps_diffs_whole() {
    require_tools(&["qemu-io"]);
    let _serial = serial();
    let tmp = tempfile::TempDir::new().unwrap();
    let point = "snapshot.after_delete";
    let crashing = Target::strata_with(&ARGS).with_env("STRATA_CRASH_AT", point);
    let mut server = Server::start(tmp.path(), crashing, &[("vol", VOL)]);
    write(&server, 0x11);
    server.cli_ok(&["snapshot", "create", "vol@s0"]);
    let out = qemu_io(&server.vol_uri(), &["write -P 0x22 1M 1M".to_string()]);
    assert!(out.status.success(), "{}", stderr_str(&out));
    server.cli_ok(&["snapshot", "create", "vol@s1"]);
    let out = qemu_io(&server.vol_uri(), &["write -P 0x33 5M 1M".to_string()]);
    assert!(out.status.success(), "{}", stderr_str(&out));
    server.cli_ok(&["snapshot", "create", "vol@s2"]);
    crash_server_at(&mut server, point, &["snapshot", "delete", "vol@s1"]);
    assert_eq!(snapshots(&server), ["s0", "s2"], "{point}");
    let json = server.cli_ok(&["snapshot", "list", "vol", "--json"]);
    let list: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(
        list[1]["delta"]["from_checkpoint_seq"], list[0]["checkpoint_seq"],
        "s2's delta leads from s0: {json}"
    );
    let diff = server.cli_ok(&["volume", "diff", "vol@s0", "vol@s2", "--json"]);
    let changes: serde_json::Value = serde_json::from_str(&diff).unwrap();
    let ranges: Vec<(u64, u64)> = changes
        .as_array()
        .unwrap()
        .iter()
        .map(|c| (c["offset"].as_u64().unwrap(), c["length"].as_u64().unwrap()))
        .collect();
    assert_eq!(ranges, [(MIB, MIB), (5 * MIB, MIB)], "{diff}");
    server.cli_ok(&["volume", "gc", "vol", "--wait"]);
    let deltas: Vec<String> = std::fs::read_dir(server.store_dir().join("vol/deltas"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(deltas.len(), 1, "delta objects left: {deltas:?}");
    server.stop();
}

/// A delete killed once the snapshot is marked as being deleted (before
/// it checks for clones): the snapshot is still there, no clone can be made
/// of it, and the next delete finishes the job.
#[test]
fn a_snapshot_delete_killed_after_marking_is_finished_by_the_next() {
    require_tools(&["qemu-io"]);
    let _serial = serial();
    let tmp = tempfile::TempDir::new().unwrap();
    let point = "snapshot.marked_deleting";
    let crashing = Target::strata_with(&ARGS).with_env("STRATA_CRASH_AT", point);
    let mut server = Server::start(tmp.path(), crashing, &[("vol", VOL)]);
    write(&server, 0x11);
    server.cli_ok(&["snapshot", "create", "vol@s"]);
    crash_server_at(&mut server, point, &["snapshot", "delete", "vol@s"]);
    assert_eq!(snapshots(&server), vec!["s".to_string()], "{point}");
    let listed = server.cli_ok(&["snapshot", "list", "vol"]);
    assert!(listed.contains("(being deleted)"), "{listed}");
    qemu_io_verify(
        &server.uri("vol@s"),
        &expect(0x11),
        "the snapshot after the crash",
    );
    let out = server.cli(&["volume", "clone", "vol@s", "c"]);
    assert!(
        !out.status.success() && stderr_str(&out).contains("is being deleted"),
        "{}",
        stderr_str(&out)
    );
    server.cli_ok(&["snapshot", "delete", "vol@s"]);
    assert!(snapshots(&server).is_empty());
    qemu_io_verify(&server.vol_uri(), &expect(0x11), "the volume");
    server.stop();
}

/// Rollback runs in the CLI (nobody may serve the volume): the CLI is what
/// aborts.
#[test]
fn a_rollback_killed_before_and_after_its_write_happened_or_not() {
    require_tools(&["qemu-io"]);
    let _serial = serial();
    let tmp = tempfile::TempDir::new().unwrap();
    for (point, done) in [
        ("rollback.before_manifest", false),
        ("rollback.after_manifest", true),
    ] {
        let dir = tmp.path().join(point.replace('.', "-"));
        let mut server = Server::start(&dir, Target::strata_with(&ARGS), &[("vol", VOL)]);
        write(&server, 0x11);
        server.cli_ok(&["snapshot", "create", "vol@s"]);
        write(&server, 0x22);
        server.stop();
        server.target = Target::strata_with(&ARGS).with_env("STRATA_CRASH_AT", point);
        let out = server.cli(&["snapshot", "rollback", "vol@s"]);
        assert!(
            !out.status.success() && stderr_str(&out).contains(&format!("STRATA_CRASH_AT={point}")),
            "{point}: rollback did not abort there: {}",
            stderr_str(&out)
        );
        server.target = Target::strata_with(&ARGS);
        let info = server.cli_ok(&["volume", "info", "vol"]);
        assert_eq!(info.contains("rollback:"), done, "{point}:\n{info}");
        server.start_again();
        let now = if done { 0x11 } else { 0x22 };
        qemu_io_verify(
            &server.vol_uri(),
            &expect(now),
            &format!("{point}: the volume"),
        );
        qemu_io_verify(
            &server.uri("vol@s"),
            &expect(0x11),
            &format!("{point}: the snapshot"),
        );
        server.stop();
        if !done {
            server.cli_ok(&["snapshot", "rollback", "vol@s"]);
            server.start_again();
            qemu_io_verify(
                &server.vol_uri(),
                &expect(0x11),
                &format!("{point}: rolled back after all"),
            );
            server.stop();
        }
    }
}
