//! Test 4: fio through its libnbd engine, 4 jobs x iodepth 32 (one NBD
//! connection each, multi-conn), random 4 KiB then random 64 KiB writes, each
//! job in its own region, every block verified with crc32c after writing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use std::time::Duration;

#[test]
fn fio_random_writes_verify_crc32c() {
    let _serial = serial();
    require_tools(&["fio"]);
    let tmp = tempfile::TempDir::new().unwrap();
    let target = Target::under_test(Target::strata(), Target::NbdkitMemory);
    let mut server = Server::start(tmp.path(), target, &[("vol", 2 * GIB)]);
    let uri = server.vol_uri();

    const JOBS: u64 = 4;
    // (job name, block size, first offset, per-job region size)
    let groups = [
        ("rand4k", "4k", 0, 64 * MIB),
        ("rand64k", "64k", GIB, 192 * MIB),
    ];
    let mut args: Vec<String> = vec![
        "--ioengine=nbd".into(),
        format!("--uri={uri}"),
        "--rw=randwrite".into(),
        "--verify=crc32c".into(),
        "--do_verify=1".into(),
        "--verify_fatal=1".into(),
        format!("--numjobs={JOBS}"),
        "--iodepth=32".into(),
        "--group_reporting=0".into(),
    ];
    for (name, bs, off, size) in groups {
        args.extend([
            format!("--name={name}"),
            "--stonewall".into(),
            format!("--bs={bs}"),
            format!("--offset={off}"),
            format!("--size={size}"),
            format!("--offset_increment={size}"),
        ]);
    }
    let jobs = fio_json(tmp.path(), &args, Duration::from_secs(600));
    assert_eq!(jobs.len() as u64, JOBS * groups.len() as u64, "fio jobs");
    for (name, _, _, size) in groups {
        let mine: Vec<_> = jobs.iter().filter(|j| j["jobname"] == name).collect();
        assert_eq!(mine.len() as u64, JOBS, "{name} jobs");
        for j in mine {
            let w = j["write"]["io_bytes"].as_u64().unwrap();
            let r = j["read"]["io_bytes"].as_u64().unwrap();
            eprintln!(
                "{name}: wrote {} MiB ({} IOPS), verified {} MiB",
                w / MIB,
                j["write"]["iops"].as_f64().unwrap_or(0.0) as u64,
                r / MIB
            );
            // Every block of the job's region written once and read back for
            // verification.
            assert_eq!(w, size, "{name} wrote {w} bytes");
            assert_eq!(r, size, "{name} verified only {r} of {size} bytes");
        }
    }
    server.assert_alive();
}
