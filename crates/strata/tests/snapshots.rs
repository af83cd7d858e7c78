//! Snapshots through real clients: `strata snapshot` on a served volume
//! (the serving server takes it), the snapshot served read-only as
//! `VOL@SNAP` (qemu-io reads it, a write is refused), garbage collection
//! keeping the snapshot's data while the volume is overwritten, restarts,
//! deletion giving the space back, rollback; each on the embedded store and
//! on MinIO.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use common::clients::{qemu_io, qemu_io_verify};
use common::*;

const VOL: u64 = 64 * MIB;
/// Written before the snapshot, then overwritten: 16 segments of 1 MiB.
const DATA_MIB: u64 = 16;
/// Stored bytes are compared with the bytes written (qemu-io's patterns,
/// which lz4 would shrink to almost nothing): volumes stored plain.
const ARGS: [&str; 8] = [
    "--segment-size",
    "1MiB",
    "--gc-grace-ms",
    "0",
    "--gc-interval-ms",
    "200",
    "--compression",
    "none",
];

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

/// `volume info --json` of `vol`.
fn info(server: &Server) -> serde_json::Value {
    serde_json::from_str(&server.cli_ok(&["volume", "info", "vol", "--json"])).unwrap()
}

fn stored_bytes(server: &Server) -> u64 {
    info(server)["stored_bytes"].as_u64().unwrap()
}

fn snapshot_keeps_data_through_overwrites_gc_restarts_and_deletion(target: Target) {
    require_tools(&["qemu-io", "nbdinfo"]);
    let _serial = serial();
    let tmp = tempfile::TempDir::new().unwrap();
    let mut server = Server::start(tmp.path(), target, &[("vol", VOL)]);
    let out = qemu_io(&server.vol_uri(), &fill(0x11));
    assert!(out.status.success(), "{}", stderr_str(&out));
    // Taken by the serving server, with every acknowledged write in it.
    let said = server.cli_ok(&["snapshot", "create", "vol@before"]);
    assert!(said.contains("vol@before"), "{said}");
    let out = qemu_io(&server.vol_uri(), &fill(0x22));
    assert!(out.status.success(), "{}", stderr_str(&out));
    let snap = server.uri("vol@before");
    qemu_io_verify(&snap, &expect(0x11), "the snapshot after overwrites");
    qemu_io_verify(&server.vol_uri(), &expect(0x22), "the volume");
    // A snapshot is read-only.
    let write = qemu_io(&snap, &["write -P 0x33 0 4k".to_string()]);
    assert!(!write.status.success(), "a write to the snapshot worked");
    let list = run_ok(
        std::process::Command::new("nbdinfo")
            .arg("--list")
            .arg(format!("nbd+unix:///?socket={}", server.socket.display())),
        std::time::Duration::from_secs(30),
    );
    let listed = stdout_str(&list);
    assert!(listed.contains("export=\"vol@before\""), "{listed}");

    // GC runs (and is asked for a full pass): the snapshot's segments stay.
    server.cli_ok(&["volume", "gc", "vol", "--wait"]);
    qemu_io_verify(&snap, &expect(0x11), "the snapshot after a GC pass");
    let both = stored_bytes(&server);
    assert!(
        both >= 2 * DATA_MIB * MIB,
        "stored {both} bytes: less than the snapshot's data plus the volume's"
    );
    let stats = info(&server);
    assert_eq!(stats["snapshots"][0]["name"], "before", "{stats}");

    for restart in ["clean restart", "kill -9"] {
        if restart == "kill -9" {
            server.kill9();
            server.start_again();
        } else {
            server.stop();
            server.start_again();
        }
        qemu_io_verify(
            &snap,
            &expect(0x11),
            &format!("the snapshot after a {restart}"),
        );
        qemu_io_verify(
            &server.vol_uri(),
            &expect(0x22),
            &format!("the volume after a {restart}"),
        );
    }

    let list = server.cli_ok(&["snapshot", "list", "vol"]);
    assert!(list.contains("before"), "{list}");
    server.cli_ok(&["snapshot", "delete", "vol@before"]);
    let gone = qemu_io(&snap, &["read 0 4k".to_string()]);
    assert!(!gone.status.success(), "a deleted snapshot is still served");
    server.cli_ok(&["volume", "gc", "vol", "--wait"]);
    // The background collector may hold the pass; give it a few.
    let live = DATA_MIB * MIB;
    let mut left = stored_bytes(&server);
    for _ in 0..20 {
        if left * 2 < live * 3 {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(300));
        server.cli_ok(&["volume", "gc", "vol", "--wait"]);
        left = stored_bytes(&server);
    }
    eprintln!("stored: {both} bytes with the snapshot, {left} after deleting it ({live} live)");
    assert!(
        left * 2 < live * 3,
        "stored {left} bytes for {live} live after the snapshot was deleted: over 1.5x"
    );
    qemu_io_verify(&server.vol_uri(), &expect(0x22), "the volume after GC");
    server.stop();
}

#[test]
fn snapshot_keeps_data_through_overwrites_gc_restarts_and_deletion_embedded() {
    snapshot_keeps_data_through_overwrites_gc_restarts_and_deletion(Target::strata_with(&ARGS));
}

#[test]
fn snapshot_keeps_data_through_overwrites_gc_restarts_and_deletion_s3() {
    let store = S3Store::on_shared("snapshots");
    snapshot_keeps_data_through_overwrites_gc_restarts_and_deletion(Target::strata_s3(
        &store, &ARGS,
    ));
}

/// Rollback: refused while served, then (server stopped) the volume is the
/// snapshot again; later snapshots and the volume's new writes go on.
#[test]
fn rollback_restores_the_snapshot_and_is_refused_while_served() {
    require_tools(&["qemu-io"]);
    let _serial = serial();
    let tmp = tempfile::TempDir::new().unwrap();
    let mut server = Server::start(tmp.path(), Target::strata_with(&ARGS), &[("vol", VOL)]);
    let out = qemu_io(&server.vol_uri(), &fill(0x11));
    assert!(out.status.success(), "{}", stderr_str(&out));
    server.cli_ok(&["snapshot", "create", "vol@one"]);
    let out = qemu_io(
        &server.vol_uri(),
        &[
            "write -P 0x22 0 8M".into(),
            "write -z 8M 8M".into(),
            "flush".into(),
        ],
    );
    assert!(out.status.success(), "{}", stderr_str(&out));
    let refused = server.cli(&["snapshot", "rollback", "vol@one"]);
    assert!(
        !refused.status.success() && stderr_str(&refused).contains("stop serving it"),
        "{}",
        stderr_str(&refused)
    );
    server.stop();
    let said = server.cli_ok(&["snapshot", "rollback", "vol@one"]);
    assert!(said.contains("rolled vol back to snapshot one"), "{said}");
    let shown = server.cli_ok(&["volume", "info", "vol"]);
    assert!(shown.contains("rollback:    to snapshot one"), "{shown}");
    server.start_again();
    qemu_io_verify(
        &server.vol_uri(),
        &expect(0x11),
        "the volume after rollback",
    );
    qemu_io_verify(
        &server.uri("vol@one"),
        &expect(0x11),
        "the snapshot after rollback",
    );
    let out = qemu_io(
        &server.vol_uri(),
        &["write -P 0x44 0 1M".into(), "flush".into()],
    );
    assert!(out.status.success(), "{}", stderr_str(&out));
    server.kill9();
    server.start_again();
    qemu_io_verify(
        &server.vol_uri(),
        &[
            "read -P 0x44 0 1M".into(),
            format!("read -P 0x11 1M {}M", DATA_MIB - 1),
        ],
        "writes after the rollback, after kill -9",
    );
    server.stop();
}

/// What a user gets wrong: a snapshot name that exists, a missing one, a
/// bad name, a volume name where VOL@SNAP is needed.
#[test]
fn snapshot_commands_say_what_is_wrong() {
    let _serial = serial();
    let tmp = tempfile::TempDir::new().unwrap();
    let mut server = Server::start(tmp.path(), Target::strata_with(&ARGS), &[("vol", VOL)]);
    server.cli_ok(&["snapshot", "create", "vol@a"]);
    server.stop();
    let cases: [(&[&str], &str); 6] = [
        (
            &["snapshot", "create", "vol@a"],
            "already has a snapshot named \"a\"",
        ),
        (&["snapshot", "delete", "vol@b"], "has no snapshot \"b\""),
        (&["snapshot", "rollback", "vol@b"], "has no snapshot \"b\""),
        (&["snapshot", "create", "vol"], "give VOLUME@SNAPSHOT"),
        (&["snapshot", "create", "vol@a/b"], "may only contain"),
        (&["snapshot", "list", "nosuch"], "does not exist"),
    ];
    for (args, want) in cases {
        let out = server.cli(args);
        let err = stderr_str(&out);
        assert!(!out.status.success(), "{args:?} succeeded");
        assert!(
            err.contains(want),
            "{args:?}: {err:?} does not say {want:?}"
        );
        assert_eq!(
            err.lines()
                .filter(|l| l.starts_with("strata: error"))
                .count(),
            1,
            "{args:?}: {err}"
        );
    }
}
