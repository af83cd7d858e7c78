//! The real-client test bodies, shared by the local-store tests (qemu_io.rs,
//! copy.rs, fio_verify.rs, filesystem.rs) and the S3 ones (s3_clients.rs,
//! s3_faults.rs, s3_cluster.rs): each takes the [`Target`] to run against,
//! and hands back what a caller needs to check the data again later (e.g.
//! after a restart on another host, reading everything from the store).

use super::*;
use std::collections::BTreeMap;
use std::fs::File;
use std::os::unix::fs::FileExt;

// ---------------------------------------------------------------------------
// qemu-io: unaligned pattern writes
// ---------------------------------------------------------------------------

/// Volume size of the qemu-io test.
pub const QEMU_IO_VOL: u64 = 64 * MIB;

/// (pattern, offset, length), applied in order.
fn qemu_io_writes() -> Vec<(u8, u64, u64)> {
    const VOL: u64 = QEMU_IO_VOL;
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
    let vol = model.len() as u64;
    let mut ranges: Vec<(u64, u64)> = ws
        .iter()
        .map(|&(_, off, len)| (off.saturating_sub(4096), (off + len + 4096).min(vol)))
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

pub fn qemu_io(uri: &str, cmds: &[String]) -> Output {
    qemu_io_opts(uri, &[], cmds)
}

/// Writes each (pattern, offset, length) through qemu-io, then a FLUSH if
/// `flush`; every write must succeed.
pub fn write_patterns(uri: &str, ws: &[(u8, u64, u64)], flush: bool) {
    let mut cmds: Vec<String> = ws
        .iter()
        .map(|&(p, off, len)| format!("write -P 0x{p:02x} {off} {len}"))
        .collect();
    if flush {
        cmds.push("flush".to_string());
    }
    let out = qemu_io(uri, &cmds);
    assert!(
        out.status.success() && !stdout_str(&out).contains("failed"),
        "writing through {uri}: {}{}",
        stdout_str(&out),
        stderr_str(&out)
    );
}

/// The qemu-io commands that read back what `write_patterns` wrote.
pub fn pattern_reads(ws: &[(u8, u64, u64)]) -> Vec<String> {
    ws.iter()
        .map(|&(p, off, len)| format!("read -P 0x{p:02x} {off} {len}"))
        .collect()
}

fn qemu_io_opts(uri: &str, opts: &[&str], cmds: &[String]) -> Output {
    let mut c = Command::new("qemu-io");
    c.args(["-f", "raw"]).args(opts).arg(uri);
    for cmd in cmds {
        c.arg("-c").arg(cmd);
    }
    run_timeout(&mut c, Duration::from_secs(120))
}

/// Runs the `read -P` commands `reads` (opened read-only, so read-only
/// exports such as snapshots work too); panics (naming `when`) on any
/// mismatch or failure.
pub fn qemu_io_verify(uri: &str, reads: &[String], when: &str) {
    let out = qemu_io_opts(uri, &["-r"], reads);
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

/// qemu-io writes byte patterns at unaligned, scattered offsets with
/// sub-4 KiB lengths (including overlapping rewrites and the last bytes of
/// the volume) and reads every byte of the touched areas back: before and
/// after a clean restart, after a crash restart, and from the store alone
/// (fresh data dir) after a clean SIGINT shutdown. Serves one volume "vol"
/// of [`QEMU_IO_VOL`] from `dir`. Returns the server, stopped, and the read
/// commands that check the final contents ([`qemu_io_verify`]).
pub fn qemu_io_patterns(dir: &Path, target: Target) -> (Server, Vec<String>) {
    require_tools(&["qemu-io"]);
    let mut server = Server::start(dir, target, &[("vol", QEMU_IO_VOL)]);
    let uri = server.vol_uri();

    let ws = qemu_io_writes();
    let mut model = vec![0u8; QEMU_IO_VOL as usize];
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

    qemu_io_verify(&uri, &reads, "before restart");
    // Also with a flush in between and through a second client at once.
    let out = qemu_io(&uri, &["flush".to_string()]);
    assert!(out.status.success(), "{}", stderr_str(&out));

    server.restart();
    qemu_io_verify(&uri, &reads, "after a clean restart");

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
    qemu_io_verify(&uri, &reads2, "after a rewrite");

    server.crash_restart();
    qemu_io_verify(&uri, &reads2, "after kill -9 and restart");

    if server.target.is_strata() {
        // A clean shutdown (SIGINT this time) makes everything durable in the
        // store: a server with a fresh data dir (no journal, no cache, as on
        // another host) serves the same contents.
        server.stop_with(libc::SIGINT);
        let data_dir = server.data_dir();
        let moved = dir.join("old-data-dir");
        std::fs::rename(&data_dir, &moved).unwrap();
        server.start_again();
        qemu_io_verify(
            &uri,
            &reads2,
            "after SIGINT and restart with a fresh data dir",
        );
    }
    server.stop();
    (server, reads2)
}

// ---------------------------------------------------------------------------
// qemu-img / nbdcopy: sparse image round trips
// ---------------------------------------------------------------------------

pub const COPY_CHUNK: u64 = MIB;

/// A sparse raw image of deterministic random 1 MiB chunks and holes.
pub struct SparseImage {
    pub path: PathBuf,
    /// Per 1 MiB chunk: true = data, false = hole.
    pub layout: Vec<bool>,
}

impl SparseImage {
    /// Writes an image of `size` bytes: each 1 MiB chunk is random data
    /// with probability `data_pct`% and a hole otherwise; first and last
    /// chunks are data.
    pub fn create(path: &Path, size: u64, seed: u64, data_pct: u64) -> SparseImage {
        let chunks = size / COPY_CHUNK;
        let f = File::create(path).unwrap();
        f.set_len(size).unwrap();
        let mut rng = Rng::new(seed);
        let mut buf = vec![0u8; COPY_CHUNK as usize];
        let mut layout = Vec::with_capacity(chunks as usize);
        for i in 0..chunks {
            let data = i == 0 || i == chunks - 1 || rng.below(100) < data_pct;
            if data {
                rng.fill(&mut buf);
                f.write_all_at(&buf, i * COPY_CHUNK).unwrap();
            }
            layout.push(data);
        }
        f.sync_all().unwrap();
        SparseImage {
            path: path.to_path_buf(),
            layout,
        }
    }

    pub fn size(&self) -> u64 {
        self.layout.len() as u64 * COPY_CHUNK
    }

    /// Asserts that every hole chunk is reported as a hole by
    /// `nbdinfo --map` of `uri` and every data chunk as allocated data.
    pub fn assert_map_matches(&self, uri: &str, what: &str) {
        let map = nbdinfo_map(uri);
        assert_eq!(
            map.iter().map(|e| e.length).sum::<u64>(),
            self.size(),
            "{what}: map size"
        );
        let mut bad = Vec::new();
        for e in &map {
            let first = e.offset / COPY_CHUNK;
            let last = (e.offset + e.length - 1) / COPY_CHUNK;
            for c in first..=last {
                let hole = e.ty & 1 == 1;
                if self.layout[c as usize] == hole {
                    bad.push(format!(
                        "chunk {c} ({}) reported as type {} by extent {}+{}",
                        if self.layout[c as usize] {
                            "data"
                        } else {
                            "hole"
                        },
                        e.ty,
                        e.offset,
                        e.length
                    ));
                }
            }
        }
        bad.dedup();
        assert!(
            bad.is_empty(),
            "{what}: {} mismatches between image layout and nbdinfo --map, first: {:#?}",
            bad.len(),
            &bad[..bad.len().min(10)]
        );
    }

    /// Copies the export out with nbdcopy and compares it with the image;
    /// also checks the map. `scratch` holds the copy for the comparison.
    pub fn assert_export_equals(&self, uri: &str, scratch: &Path, what: &str) {
        self.assert_map_matches(uri, what);
        let out = scratch.join("export.out");
        let _ = std::fs::remove_file(&out);
        let t = Instant::now();
        run_ok(
            Command::new("nbdcopy").arg(uri).arg(&out),
            Duration::from_secs(300),
        );
        eprintln!("{what}: nbdcopy out: {:.1?}", t.elapsed());
        assert_cmp(&self.path, &out);
        std::fs::remove_file(&out).unwrap();
    }
}

/// A 1 GiB (or `size`) sparse raw image (deterministic random 1 MiB chunks
/// and holes) goes into the volume "vol" with qemu-img convert and back out
/// byte-identical; a second image is written over it with nbdcopy and read
/// back with nbdcopy and qemu-img; `nbdinfo --map` shows each image's
/// holes as holes, including where image B turns image A's data into holes
/// (the copy tools zero/trim those ranges and the server must unmap them).
/// Images live in `work`. Returns the running server and image B (what the
/// volume holds now).
pub fn copy_round_trip(
    dir: &Path,
    work: &Path,
    target: Target,
    size: u64,
) -> (Server, SparseImage) {
    require_tools(&["qemu-img", "nbdcopy", "nbdinfo", "cmp"]);
    let server = Server::start(dir, target, &[("vol", size)]);
    let uri = server.vol_uri();

    let img_a = SparseImage::create(&work.join("a.raw"), size, 1, 40);
    let img_b = SparseImage::create(&work.join("b.raw"), size, 2, 40);
    let chunks = img_a.layout.len();
    let data_a = img_a.layout.iter().filter(|d| **d).count();
    let turned_holes = img_a
        .layout
        .iter()
        .zip(&img_b.layout)
        .filter(|(a, b)| **a && !**b)
        .count();
    // (300 and 150 of 1024 chunks for 1 GiB.)
    assert!(
        data_a > chunks * 300 / 1024 && turned_holes > chunks * 150 / 1024,
        "{data_a} {turned_holes}"
    );

    // qemu-img convert into the existing export (-n: do not create).
    let t = Instant::now();
    run_ok(
        Command::new("qemu-img")
            .args(["convert", "-n", "-f", "raw", "-O", "raw"])
            .arg(&img_a.path)
            .arg(&uri),
        Duration::from_secs(300),
    );
    eprintln!(
        "qemu-img convert in: {:.1?} ({data_a} MiB of data)",
        t.elapsed()
    );
    img_a.assert_map_matches(&uri, "after qemu-img convert of image A");

    let out_a = work.join("a.out");
    let t = Instant::now();
    run_ok(
        Command::new("qemu-img")
            .args(["convert", "-f", "raw", "-O", "raw"])
            .arg(&uri)
            .arg(&out_a),
        Duration::from_secs(300),
    );
    eprintln!("qemu-img convert out: {:.1?}", t.elapsed());
    assert_cmp(&img_a.path, &out_a);
    std::fs::remove_file(&out_a).unwrap();

    // nbdcopy image B over it: A's data chunks that are holes in B must be
    // unmapped by the zero/trim requests nbdcopy sends for them.
    let t = Instant::now();
    run_ok(
        Command::new("nbdcopy").arg(&img_b.path).arg(&uri),
        Duration::from_secs(300),
    );
    eprintln!("nbdcopy in: {:.1?}", t.elapsed());
    img_b.assert_map_matches(&uri, "after nbdcopy of image B over image A");

    let out_b = work.join("b.out");
    let t = Instant::now();
    run_ok(
        Command::new("nbdcopy").arg(&uri).arg(&out_b),
        Duration::from_secs(300),
    );
    eprintln!("nbdcopy out: {:.1?}", t.elapsed());
    assert_cmp(&img_b.path, &out_b);

    // And qemu-img reading what nbdcopy wrote agrees too.
    std::fs::remove_file(&out_b).unwrap();
    run_ok(
        Command::new("qemu-img")
            .args(["convert", "-f", "raw", "-O", "raw"])
            .arg(&uri)
            .arg(&out_b),
        Duration::from_secs(300),
    );
    assert_cmp(&img_b.path, &out_b);
    std::fs::remove_file(&out_b).unwrap();
    (server, img_b)
}

// ---------------------------------------------------------------------------
// fio: random writes verified with crc32c
// ---------------------------------------------------------------------------

/// One stonewalled group of fio jobs: `jobs` jobs of random writes of `bs`
/// blocks, job i writing each block of `offset + i * size .. + size` once.
#[derive(Clone, Debug)]
pub struct FioGroup {
    pub name: &'static str,
    pub bs: &'static str,
    pub offset: u64,
    pub size: u64,
}

/// A fio crc32c-verify workload through fio's libnbd engine: 32 requests
/// in flight per job, one NBD connection per job (multi-conn).
#[derive(Clone, Debug)]
pub struct FioVerify {
    pub jobs: u64,
    pub groups: Vec<FioGroup>,
}

impl FioVerify {
    /// fio_verify.rs: 4 jobs x (64 MiB of random 4 KiB writes at 0, then
    /// 192 MiB of random 64 KiB writes at 1 GiB); needs a 2 GiB volume.
    pub fn standard() -> FioVerify {
        FioVerify::scaled(1)
    }

    /// [`FioVerify::standard`] with every region `1/div` the size (same
    /// offsets, so the volume must still be 2 GiB, or larger than 1 GiB +
    /// 4 x the 64 KiB region).
    pub fn scaled(div: u64) -> FioVerify {
        FioVerify {
            jobs: 4,
            groups: vec![
                FioGroup {
                    name: "rand4k",
                    bs: "4k",
                    offset: 0,
                    size: 64 * MIB / div,
                },
                FioGroup {
                    name: "rand64k",
                    bs: "64k",
                    offset: GIB,
                    size: 192 * MIB / div,
                },
            ],
        }
    }

    /// Bytes written (and verified) in all.
    pub fn total_bytes(&self) -> u64 {
        self.jobs * self.groups.iter().map(|g| g.size).sum::<u64>()
    }

    fn args(&self, uri: &str, verify_only: bool) -> Vec<String> {
        let mut args: Vec<String> = vec![
            "--ioengine=nbd".into(),
            format!("--uri={uri}"),
            "--rw=randwrite".into(),
            "--verify=crc32c".into(),
            "--do_verify=1".into(),
            "--verify_fatal=1".into(),
            format!("--numjobs={}", self.jobs),
            "--iodepth=32".into(),
            "--group_reporting=0".into(),
        ];
        if verify_only {
            // Replays the same (seeded) write sequence as reads and checks
            // every block's checksum and header (offset, length).
            args.push("--verify_only=1".into());
        }
        for g in &self.groups {
            args.extend([
                format!("--name={}", g.name),
                "--stonewall".into(),
                format!("--bs={}", g.bs),
                format!("--offset={}", g.offset),
                format!("--size={}", g.size),
                format!("--offset_increment={}", g.size),
            ]);
        }
        args
    }

    /// Writes every block of every job's region once and reads it back for
    /// verification; asserts fio exits 0 and reports no error and every
    /// byte written and verified.
    pub fn write_and_verify(&self, dir: &Path, uri: &str, timeout: Duration) {
        require_tools(&["fio"]);
        let t = Instant::now();
        let jobs = fio_json(dir, &self.args(uri, false), timeout);
        self.check(&jobs, false);
        eprintln!(
            "fio: wrote and verified {} MiB in {:.1?}",
            self.total_bytes() / MIB,
            t.elapsed()
        );
    }

    /// Reads back what [`FioVerify::write_and_verify`] wrote (fio
    /// `--verify_only`) and verifies every block.
    pub fn verify_only(&self, dir: &Path, uri: &str, timeout: Duration) {
        require_tools(&["fio"]);
        let t = Instant::now();
        let jobs = fio_json(dir, &self.args(uri, true), timeout);
        self.check(&jobs, true);
        eprintln!(
            "fio: verified {} MiB in {:.1?} (verify only)",
            self.total_bytes() / MIB,
            t.elapsed()
        );
    }

    /// The negative control of [`FioVerify::verify_only`]: on an export
    /// that does not hold this workload's data, fio must fail.
    pub fn verify_only_fails(&self, dir: &Path, uri: &str) {
        require_tools(&["fio"]);
        let out = run_timeout(
            Command::new("fio")
                .current_dir(dir)
                .arg("--thread")
                .args(self.args(uri, true)),
            Duration::from_secs(300),
        );
        assert!(
            !out.status.success(),
            "fio --verify_only passed on {uri}, which does not hold the data: \
             the verification cannot fail\n{}",
            tail(&stdout_str(&out), 4000)
        );
    }

    fn check(&self, jobs: &[serde_json::Value], verify_only: bool) {
        assert_eq!(
            jobs.len() as u64,
            self.jobs * self.groups.len() as u64,
            "fio jobs"
        );
        for g in &self.groups {
            let mine: Vec<_> = jobs.iter().filter(|j| j["jobname"] == g.name).collect();
            assert_eq!(mine.len() as u64, self.jobs, "{} jobs", g.name);
            for j in mine {
                let w = j["write"]["io_bytes"].as_u64().unwrap();
                let r = j["read"]["io_bytes"].as_u64().unwrap();
                eprintln!(
                    "{}: wrote {} MiB ({} IOPS), verified {} MiB",
                    g.name,
                    w / MIB,
                    j["write"]["iops"].as_f64().unwrap_or(0.0) as u64,
                    r / MIB
                );
                // Every block of the job's region written once and read
                // back for verification. With --verify_only fio counts the
                // writes it skips (a dry run: no I/O, 0 IOPS) as written;
                // the S3 tests check that the store got no new segment.
                if !verify_only {
                    assert_eq!(w, g.size, "{} wrote {w} bytes", g.name);
                }
                assert_eq!(
                    r, g.size,
                    "{} verified only {r} of {} bytes",
                    g.name, g.size
                );
            }
        }
    }
}

// ---------------------------------------------------------------------------
// ext4 on nbdfuse + loop
// ---------------------------------------------------------------------------

/// Volume size of the ext4 test.
pub const EXT4_VOL: u64 = 512 * MIB;

/// What the ext4 filesystem holds: files and their contents, and files
/// that were deleted and must stay gone.
pub struct Ext4Contents {
    pub files: BTreeMap<PathBuf, Vec<u8>>,
    pub deleted: Vec<PathBuf>,
}

fn write_files(root: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut rng = Rng::new(5);
    let mut files = BTreeMap::new();
    // A few MiB of random data in large files.
    for (i, size) in [(0, 3 * MIB + 17), (1, MIB), (2, 2 * MIB - 1)] {
        let mut data = vec![0u8; size as usize];
        rng.fill(&mut data);
        files.insert(PathBuf::from(format!("big-{i}.bin")), data);
    }
    // Many small files in nested directories, sizes 0..12 KiB.
    for i in 0..600u64 {
        let len = rng.below(12 * 1024) as usize;
        let mut data = vec![0u8; len];
        rng.fill(&mut data);
        files.insert(
            PathBuf::from(format!("d{}/e{}/small-{i}.dat", i % 7, i % 13)),
            data,
        );
    }
    for (rel, data) in &files {
        let p = root.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, data).unwrap();
    }
    // A file written then truncated and a removed file exercise metadata.
    std::fs::write(root.join("gone"), vec![7u8; 100_000]).unwrap();
    std::fs::remove_file(root.join("gone")).unwrap();
    files
}

fn check_files(root: &Path, files: &BTreeMap<PathBuf, Vec<u8>>) {
    let mut bad = Vec::new();
    for (rel, data) in files {
        match std::fs::read(root.join(rel)) {
            Ok(got) if got == *data => {}
            Ok(got) => bad.push(format!(
                "{}: content differs ({} vs {} bytes)",
                rel.display(),
                got.len(),
                data.len()
            )),
            Err(e) => bad.push(format!("{}: {e}", rel.display())),
        }
    }
    assert!(
        bad.is_empty(),
        "{} files differ after restart: {:#?}",
        bad.len(),
        &bad[..bad.len().min(10)]
    );
}

/// `fsck.ext4 -fn` of `dev` is clean.
pub fn fsck_clean(dev: &str) {
    let out = run_timeout(
        Command::new("fsck.ext4").arg("-fn").arg(dev),
        Duration::from_secs(300),
    );
    assert!(
        out.status.success(),
        "fsck.ext4 -fn {dev} not clean ({}):\n{}\n{}",
        out.status,
        stdout_str(&out),
        stderr_str(&out)
    );
}

/// A real ext4 filesystem on the export "vol" of [`EXT4_VOL`] served from
/// `dir`. nbdfuse exposes the export as a file, a loop device turns it into
/// a block device, mkfs.ext4 + mount + files; then everything is torn down,
/// the server restarted, and the files must be identical and
/// `fsck.ext4 -fn` clean; half of the files are deleted (fstrim) and more
/// written, and after another restart the filesystem is checked again
/// ([`ext4_check`]). Returns the running server and what the filesystem
/// holds. Needs root (loop devices, mount) and /dev/fuse.
pub fn ext4_survives_restart(dir: &Path, target: Target) -> (Server, Ext4Contents) {
    require_tools(&[
        "nbdfuse",
        "fusermount3",
        "losetup",
        "mkfs.ext4",
        "fsck.ext4",
        "mount",
        "umount",
    ]);
    let mut server = Server::start(dir, target, &[("vol", EXT4_VOL)]);
    let uri = server.vol_uri();
    let fuse_dir = dir.join("fuse");
    let mnt = dir.join("mnt");

    // Round 1: make the filesystem and fill it.
    let fuse = FuseFile::mount(&fuse_dir, &uri);
    assert_eq!(std::fs::metadata(&fuse.file).unwrap().len(), EXT4_VOL);
    let lo = LoopDev::attach(&fuse.file);
    run_ok(
        Command::new("mkfs.ext4")
            .args(["-q", "-F", "-E", "nodiscard"])
            .arg(&lo.dev),
        Duration::from_secs(300),
    );
    let m = Mount::mount_dev(&lo.dev, &mnt);
    let files = write_files(&m.dir);
    check_files(&m.dir, &files);
    run_ok(&mut Command::new("sync"), Duration::from_secs(120));
    m.unmount();
    fsck_clean(&lo.dev);
    lo.detach();
    fuse.unmount();

    // Clean restart of the server: the filesystem comes back from the store.
    server.restart();

    let fuse = FuseFile::mount(&fuse_dir, &uri);
    let lo = LoopDev::attach(&fuse.file);
    fsck_clean(&lo.dev);
    let m = Mount::mount_dev(&lo.dev, &mnt);
    check_files(&m.dir, &files);
    assert!(!m.dir.join("gone").exists());
    // Delete half of the files (frees blocks; ext4 may discard), write more.
    let mut files = files;
    let victims: Vec<PathBuf> = files.keys().step_by(2).cloned().collect();
    for v in &victims {
        std::fs::remove_file(m.dir.join(v)).unwrap();
        files.remove(v);
    }
    let mut extra = vec![0u8; 4 * MIB as usize];
    Rng::new(55).fill(&mut extra);
    std::fs::write(m.dir.join("after-restart.bin"), &extra).unwrap();
    files.insert(PathBuf::from("after-restart.bin"), extra);
    run_ok(Command::new("fstrim").arg(&m.dir), Duration::from_secs(120));
    m.unmount();
    lo.detach();
    fuse.unmount();

    server.restart();
    let contents = Ext4Contents {
        files,
        deleted: victims,
    };
    ext4_check(&server, &contents);
    (server, contents)
}

/// Mounts the filesystem of `server`'s volume (nbdfuse + loop, in the
/// server's directory), checks it is fsck-clean and holds exactly
/// `contents`, and unmounts it again.
pub fn ext4_check(server: &Server, contents: &Ext4Contents) {
    let fuse = FuseFile::mount(&server.dir.join("fuse"), &server.vol_uri());
    let lo = LoopDev::attach(&fuse.file);
    fsck_clean(&lo.dev);
    let m = Mount::mount_dev(&lo.dev, &server.dir.join("mnt"));
    check_files(&m.dir, &contents.files);
    for v in &contents.deleted {
        assert!(!m.dir.join(v).exists(), "{} came back", v.display());
    }
    m.unmount();
    lo.detach();
    fuse.unmount();
}
