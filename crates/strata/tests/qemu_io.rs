//! Test 2: qemu-io writes byte patterns at unaligned, scattered offsets with
//! sub-4 KiB lengths (including overlapping rewrites and the last bytes of the
//! volume) and reads every byte of the touched areas back: before and after a
//! clean restart, after a crash restart, and from the store alone (fresh data
//! dir) after a clean SIGINT shutdown.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use std::process::Command;
use std::time::Duration;

const VOL: u64 = 64 * MIB;

/// (pattern, offset, length), applied in order.
fn writes() -> Vec<(u8, u64, u64)> {
    vec![
        (0x11, 0, 512),
        (0x22, 1, 100),
        (0x33, 511, 2),
        (0x44, 4097, 3000),
        (0x55, MIB - 3, 7),
        (0x66, VOL - 4096, 4096),
        (0x77, VOL - 1, 1),
        (0x78, VOL - 4097, 2),
        (0x88, 8 * MIB + 123, 4000),
        (0x99, 4000, 200), // overlaps the end of 0x11.. and start of 0x44
        (0xaa, 8 * MIB + 1000, 5000), // overlaps the tail of 0x88
        (0xbb, 2 * MIB, 64 * KIB), // aligned, larger
        (0xcc, 2 * MIB + 4095, 10), // straddles a 4 KiB boundary inside 0xbb
        (0xdd, 2 * MIB + 8191, 4098), // straddles two boundaries inside 0xbb
        (0x00, 2 * MIB + 20000, 333), // explicit zeros inside data
        (0xee, 33 * MIB + 17, 1), // a lone byte
        (0xef, 4097 + 2999, 3), // rewrites the last byte of 0x44 and beyond
        (0x44, 3 * MIB - 2048, 4096), // same pattern as another write, elsewhere
    ]
}

/// Read commands covering every touched byte plus 4 KiB margins, one per run
/// of equal bytes in the expected contents.
fn read_cmds(model: &[u8], ws: &[(u8, u64, u64)]) -> Vec<String> {
    let mut ranges: Vec<(u64, u64)> = ws
        .iter()
        .map(|&(_, off, len)| (off.saturating_sub(4096), (off + len + 4096).min(VOL)))
        .collect();
    ranges.sort();
    let mut merged: Vec<(u64, u64)> = Vec::new();
    for (s, e) in ranges {
        match merged.last_mut() {
            Some(last) if s <= last.1 => last.1 = last.1.max(e),
            _ => merged.push((s, e)),
        }
    }
    let mut cmds = Vec::new();
    for (s, e) in merged {
        let mut i = s;
        while i < e {
            let b = model[i as usize];
            let mut j = i + 1;
            while j < e && model[j as usize] == b {
                j += 1;
            }
            cmds.push(format!("read -P 0x{b:02x} {i} {}", j - i));
            i = j;
        }
    }
    cmds
}

fn qemu_io(uri: &str, cmds: &[String]) -> std::process::Output {
    let mut c = Command::new("qemu-io");
    c.args(["-f", "raw", uri]);
    for cmd in cmds {
        c.arg("-c").arg(cmd);
    }
    run_timeout(&mut c, Duration::from_secs(120))
}

fn verify(uri: &str, reads: &[String], when: &str) {
    let out = qemu_io(uri, reads);
    let so = stdout_str(&out);
    assert!(
        out.status.success() && !so.contains("verification failed") && !so.contains("failed"),
        "readback {when} failed ({}):\n{}\n{}",
        out.status,
        so.lines()
            .filter(|l| l.contains("fail"))
            .take(20)
            .collect::<Vec<_>>()
            .join("\n"),
        stderr_str(&out)
    );
    let n = so.lines().filter(|l| l.starts_with("read ")).count();
    assert_eq!(n, reads.len(), "not every read ran {when}:\n{so}");
}

#[test]
fn unaligned_pattern_writes_read_back_across_restarts() {
    let _serial = serial();
    require_tools(&["qemu-io"]);
    let tmp = tempfile::TempDir::new().unwrap();
    let target = Target::under_test(Target::strata(), Target::NbdkitFile);
    let mut server = Server::start(tmp.path(), target, &[("vol", VOL)]);
    let uri = server.vol_uri();

    let ws = writes();
    let mut model = vec![0u8; VOL as usize];
    for &(p, off, len) in &ws {
        model[off as usize..(off + len) as usize].fill(p);
    }
    let write_cmds: Vec<String> = ws
        .iter()
        .map(|&(p, off, len)| format!("write -P 0x{p:02x} {off} {len}"))
        .collect();
    // Each write in its own qemu-io run for the first half, one run for the
    // rest: exercises both fresh connections and a long-lived one.
    let (first, rest) = write_cmds.split_at(write_cmds.len() / 2);
    for w in first {
        let out = qemu_io(&uri, std::slice::from_ref(w));
        assert!(
            out.status.success(),
            "{w}: {}{}",
            stdout_str(&out),
            stderr_str(&out)
        );
    }
    let out = qemu_io(&uri, rest);
    assert!(
        out.status.success(),
        "{}{}",
        stdout_str(&out),
        stderr_str(&out)
    );
    assert_eq!(
        stdout_str(&out)
            .lines()
            .filter(|l| l.starts_with("wrote "))
            .count(),
        rest.len()
    );

    let reads = read_cmds(&model, &ws);
    assert!(reads.len() > 30, "{reads:?}");

    // The checker must be able to fail: a wrong pattern is detected.
    let bad = qemu_io(&uri, &["read -P 0x23 1 100".to_string()]);
    assert!(
        !bad.status.success() || stdout_str(&bad).contains("verification failed"),
        "qemu-io did not report a pattern mismatch: {}",
        stdout_str(&bad)
    );

    verify(&uri, &reads, "before restart");
    // Also with a flush in between and through a second client at once.
    let out = qemu_io(&uri, &["flush".to_string()]);
    assert!(out.status.success(), "{}", stderr_str(&out));

    server.restart();
    verify(&uri, &reads, "after a clean restart");

    // Rewrite one region after the restart, then crash and recover.
    let extra = (0x5a, 4097 + 100, 1000);
    let out = qemu_io(
        &uri,
        &[format!(
            "write -P 0x{:02x} {} {}",
            extra.0, extra.1, extra.2
        )],
    );
    assert!(out.status.success(), "{}", stderr_str(&out));
    model[extra.1 as usize..(extra.1 + extra.2) as usize].fill(extra.0);
    let mut ws2 = ws.clone();
    ws2.push(extra);
    let reads2 = read_cmds(&model, &ws2);
    verify(&uri, &reads2, "after a rewrite");

    server.crash_restart();
    verify(&uri, &reads2, "after kill -9 and restart");

    if server.target.is_strata() {
        // A clean shutdown (SIGINT this time) makes everything durable in the
        // store: a server with a fresh data dir (no journal, no cache, as on
        // another host) serves the same contents.
        server.stop_with(libc::SIGINT);
        let data_dir = server.data_dir();
        let moved = tmp.path().join("old-data-dir");
        std::fs::rename(&data_dir, &moved).unwrap();
        server.start_again();
        verify(
            &uri,
            &reads2,
            "after SIGINT and restart with a fresh data dir",
        );
    }
    server.stop();
}
