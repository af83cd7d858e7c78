//! Garbage collection crashes at each of its steps (named crash points:
//! the server aborts where `STRATA_CRASH_AT` says, as kill -9 would stop
//! it): after the copy's repoint, after the copy's PUT, after the
//! checkpoint that lists what became unreferenced, between deletions,
//! after the deletions before the manifest forgets them. After each, the
//! restarted server reads back every acknowledged write, a new pass
//! resumes where the crashed one stopped, and space comes back.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::time::Duration;

use common::clients::{qemu_io, qemu_io_verify};
use common::*;

const MIB: u64 = 1 << 20;
const VOL: u64 = 64 * MIB;
/// 1 MiB writes each fill a segment: 40 segments, 36 of them then mostly
/// overwritten (25% live: compacted), so a pass copies, checkpoints, and
/// deletes in several batches.
const SEGMENTS: u64 = 40;
const OVERWRITTEN: u64 = 36;
const ARGS: [&str; 6] = [
    "--segment-size",
    "1MiB",
    "--gc",
    "off",
    "--gc-grace-ms",
    "0",
];

fn writes() -> Vec<String> {
    let mut cmds: Vec<String> = (0..SEGMENTS)
        .map(|i| format!("write -P 0x11 {}M 1M", i))
        .collect();
    cmds.extend((0..OVERWRITTEN).map(|i| format!("write -P 0x22 {}M 768K", i)));
    cmds.push("flush".into());
    cmds
}

fn reads() -> Vec<String> {
    let mut cmds: Vec<String> = (0..OVERWRITTEN)
        .flat_map(|i| {
            [
                format!("read -P 0x22 {}M 768K", i),
                format!("read -P 0x11 {} 256K", i * MIB + 768 * 1024),
            ]
        })
        .collect();
    cmds.push(format!(
        "read -P 0x11 {}M {}M",
        OVERWRITTEN,
        SEGMENTS - OVERWRITTEN
    ));
    cmds.push(format!("read -P 0 {}M {}M", SEGMENTS, VOL / MIB - SEGMENTS));
    cmds
}

fn segment_bytes(server: &Server) -> u64 {
    let dir = server.store_dir().join("vol").join("segments");
    std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().metadata().unwrap().len())
        .sum()
}

#[test]
fn a_gc_pass_killed_at_each_step_loses_nothing_and_resumes() {
    require_tools(&["qemu-io"]);
    let _serial = serial();
    let tmp = tempfile::TempDir::new().unwrap();
    assert_eq!(
        strata_volume::GC_CRASH_POINTS.len(),
        5,
        "a crash point without a test"
    );
    for point in strata_volume::GC_CRASH_POINTS {
        let dir = tmp.path().join(point.replace('.', "-"));
        let crashing = Target::strata_with(&ARGS).with_env("STRATA_CRASH_AT", point);
        let mut server = Server::start(&dir, crashing, &[("vol", VOL)]);
        let out = qemu_io(&server.vol_uri(), &writes());
        assert!(
            out.status.success(),
            "{point}: writes failed: {}",
            stderr_str(&out)
        );
        let written = segment_bytes(&server);
        // The CLI (no crash point of its own) asks the server for a pass.
        server.target = Target::strata_with(&ARGS);
        let gc = server.cli(&["volume", "gc", "vol", "--wait"]);
        assert!(
            !gc.status.success(),
            "{point}: the pass did not crash: {}",
            stdout_str(&gc)
        );
        let status = server.wait_exit(Duration::from_secs(30));
        assert!(
            status.is_some_and(|s| !s.success()),
            "{point}: server did not abort: {status:?}"
        );
        assert!(
            server
                .stderr()
                .contains(&format!("STRATA_CRASH_AT={point}")),
            "{point}: aborted elsewhere:\n{}",
            server.stderr()
        );
        server.start_again();
        qemu_io_verify(
            &server.vol_uri(),
            &reads(),
            &format!("after a crash at {point}"),
        );
        let gc = server.cli(&["volume", "gc", "vol", "--wait"]);
        assert!(
            gc.status.success(),
            "{point}: resumed pass failed: {}",
            stderr_str(&gc)
        );
        qemu_io_verify(
            &server.vol_uri(),
            &reads(),
            &format!("after the pass resumed ({point})"),
        );
        let left = segment_bytes(&server);
        let live = SEGMENTS * MIB;
        eprintln!("{point}: segments {written} bytes written, {left} left, {live} live");
        assert!(
            left < live + live / 5,
            "{point}: {left} bytes of segments left for {live} live"
        );
        server.stop();
        server.start_again();
        qemu_io_verify(
            &server.vol_uri(),
            &reads(),
            &format!("after a clean restart ({point})"),
        );
        server.stop();
    }
}

/// What an operator sees: `volume info` shows the space lines; `volume gc`
/// goes through the serving server and prints what it reclaimed; from
/// another data dir (another host) it is refused naming the holder; a
/// volume that does not exist is named.
#[test]
fn volume_gc_and_info_speak_to_the_operator() {
    require_tools(&["qemu-io"]);
    let _serial = serial();
    let tmp = tempfile::TempDir::new().unwrap();
    let mut server = Server::start(tmp.path(), Target::strata_with(&ARGS), &[("vol", VOL)]);
    let out = qemu_io(&server.vol_uri(), &writes());
    assert!(out.status.success(), "{}", stderr_str(&out));
    let info = stdout_str(&server.cli(&["volume", "info", "vol"]));
    for line in ["live:", "garbage:", "pending:", "last GC:"] {
        assert!(info.contains(line), "volume info lacks {line:?}:\n{info}");
    }
    let gc = server.cli(&["volume", "gc", "vol", "--wait"]);
    let said = stdout_str(&gc);
    assert!(
        gc.status.success() && said.contains("reclaimed") && said.contains("rewrote"),
        "{said}{}",
        stderr_str(&gc)
    );
    let info = stdout_str(&server.cli(&["volume", "info", "vol"]));
    assert!(
        info.contains("last GC:") && !info.contains("none yet"),
        "{info}"
    );
    let mut elsewhere = strata_command(None, &[]);
    elsewhere
        .arg("--store")
        .arg(server.store_dir())
        .arg("--data-dir")
        .arg(tmp.path().join("other-host"))
        .args(["volume", "gc", "vol"]);
    let out = run_timeout(&mut elsewhere, Duration::from_secs(60));
    let err = stderr_str(&out);
    assert!(
        !out.status.success() && err.contains("being served by"),
        "{err}"
    );
    let out = server.cli(&["volume", "gc", "nosuch"]);
    assert!(
        !out.status.success() && stderr_str(&out).contains("does not exist"),
        "{}",
        stderr_str(&out)
    );
    server.stop();
}
