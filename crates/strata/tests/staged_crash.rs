//! Placed writes (bulk writes go straight into their segment's file, the
//! journal recording where) and the segment published from that file,
//! crashed at each step (named crash points: the server aborts where
//! `STRATA_CRASH_AT` says, as kill -9 would stop it): a record appended
//! before its bytes are written, a FLUSH between the files' sync and the
//! journal's, a publication before its sync and link, and after the link.
//! After each, the restarted server reads back every acknowledged write,
//! and again after a clean restart.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::time::Duration;

use common::clients::{qemu_io, qemu_io_verify};
use common::*;

const MIB: u64 = 1 << 20;
const VOL: u64 = 32 * MIB;
const WRITES: u64 = 24;
/// 1 MiB segments: each 1 MiB write fills one, so writes and publications
/// interleave and the crash cuts both. Plain volumes: placed writes are
/// for segments that hold the bytes as written.
const ARGS: [&str; 6] = [
    "--segment-size",
    "1MiB",
    "--gc",
    "off",
    "--compression",
    "none",
];

/// Pattern of write `i` (qemu-io's `-P` takes a byte).
fn pattern(i: u64) -> u64 {
    0x21 + i
}

/// Offsets (in MiB) of the writes qemu-io says were done.
fn acknowledged(stdout: &str) -> Vec<u64> {
    stdout
        .lines()
        .filter_map(|l| l.strip_prefix("wrote 1048576/1048576 bytes at offset "))
        .filter_map(|n| n.trim().parse::<u64>().ok())
        .map(|off| off / MIB)
        .collect()
}

#[test]
fn a_segment_publication_killed_at_each_step_loses_no_acknowledged_write() {
    require_tools(&["qemu-io"]);
    let _serial = serial();
    let tmp = tempfile::TempDir::new().unwrap();
    assert_eq!(
        strata_volume::STAGED_CRASH_POINTS.len(),
        4,
        "a crash point without a test"
    );
    for point in strata_volume::STAGED_CRASH_POINTS {
        let dir = tmp.path().join(point.replace('.', "-"));
        // The fifth time there: some segments are in the store already.
        let at = format!("{point}:5");
        let crashing = Target::strata_with(&ARGS).with_env("STRATA_CRASH_AT", &at);
        let mut server = Server::start(&dir, crashing, &[("vol", VOL)]);
        // A FLUSH after every second write: the fifth FLUSH is the tenth
        // write's.
        let writes: Vec<String> = (0..WRITES)
            .flat_map(|i| {
                let w = format!("write -P {} {i}M 1M", pattern(i));
                if i % 2 == 1 {
                    vec![w, "flush".to_string()]
                } else {
                    vec![w]
                }
            })
            .collect();
        let out = qemu_io(&server.vol_uri(), &writes);
        let acked = acknowledged(&stdout_str(&out));
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
        assert!(acked.len() >= 4, "{point}: only {acked:?} acknowledged");
        let reads: Vec<String> = acked
            .iter()
            .map(|&i| format!("read -P {} {i}M 1M", pattern(i)))
            .collect();
        server.target = Target::strata_with(&ARGS);
        server.start_again();
        qemu_io_verify(
            &server.vol_uri(),
            &reads,
            &format!("after a crash at {point}"),
        );
        server.stop();
        server.start_again();
        qemu_io_verify(
            &server.vol_uri(),
            &reads,
            &format!("after a clean restart ({point})"),
        );
        server.stop();
    }
}
