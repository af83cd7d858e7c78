//! Test 3: bulk copies with qemu-img convert and nbdcopy. A 1 GiB sparse raw
//! image (deterministic random 1 MiB chunks and holes) goes into the volume and
//! back out byte-identical; `nbdinfo --map` shows the image's holes as holes,
//! including where a second image turns previously written data into holes
//! (the copy tools zero/trim those ranges and the server must unmap them).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

const SIZE: u64 = GIB;
const CHUNK: u64 = MIB;
const CHUNKS: u64 = SIZE / CHUNK;

/// Writes a sparse image: each 1 MiB chunk is random data with probability
/// `data_pct`% and a hole otherwise; first and last chunks are data. Returns
/// the per-chunk layout (true = data).
fn make_image(path: &Path, seed: u64, data_pct: u64) -> Vec<bool> {
    let f = File::create(path).unwrap();
    f.set_len(SIZE).unwrap();
    let mut rng = Rng::new(seed);
    let mut buf = vec![0u8; CHUNK as usize];
    let mut layout = Vec::with_capacity(CHUNKS as usize);
    for i in 0..CHUNKS {
        let data = i == 0 || i == CHUNKS - 1 || rng.below(100) < data_pct;
        if data {
            rng.fill(&mut buf);
            f.write_all_at(&buf, i * CHUNK).unwrap();
        }
        layout.push(data);
    }
    f.sync_all().unwrap();
    layout
}

/// Asserts that every hole chunk of `layout` is reported as a hole and every
/// data chunk as allocated data.
fn assert_map_matches(uri: &str, layout: &[bool], what: &str) {
    let map = nbdinfo_map(uri);
    assert_eq!(
        map.iter().map(|e| e.length).sum::<u64>(),
        SIZE,
        "{what}: map size"
    );
    let mut bad = Vec::new();
    for e in &map {
        let first = e.offset / CHUNK;
        let last = (e.offset + e.length - 1) / CHUNK;
        for c in first..=last {
            let hole = e.ty & 1 == 1;
            if layout[c as usize] == hole {
                bad.push(format!(
                    "chunk {c} ({}) reported as type {} by extent {}+{}",
                    if layout[c as usize] { "data" } else { "hole" },
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

#[test]
fn qemu_img_and_nbdcopy_round_trip_a_sparse_1gib_image() {
    let _serial = serial();
    require_tools(&["qemu-img", "nbdcopy", "nbdinfo", "cmp"]);
    let tmp = tempfile::TempDir::new().unwrap();
    let target = Target::under_test(Target::strata(), Target::NbdkitMemory);
    let server = Server::start(tmp.path(), target, &[("vol", SIZE)]);
    let uri = server.vol_uri();
    let work = tempfile::TempDir::new().unwrap();

    let img_a = work.path().join("a.raw");
    let img_b = work.path().join("b.raw");
    let layout_a = make_image(&img_a, 1, 40);
    let layout_b = make_image(&img_b, 2, 40);
    let data_a = layout_a.iter().filter(|d| **d).count();
    let turned_holes = layout_a
        .iter()
        .zip(&layout_b)
        .filter(|(a, b)| **a && !**b)
        .count();
    assert!(
        data_a > 300 && turned_holes > 150,
        "{data_a} {turned_holes}"
    );

    // qemu-img convert into the existing export (-n: do not create).
    let t = Instant::now();
    run_ok(
        Command::new("qemu-img")
            .args(["convert", "-n", "-f", "raw", "-O", "raw"])
            .arg(&img_a)
            .arg(&uri),
        Duration::from_secs(300),
    );
    eprintln!(
        "qemu-img convert in: {:.1?} ({data_a} MiB of data)",
        t.elapsed()
    );
    assert_map_matches(&uri, &layout_a, "after qemu-img convert of image A");

    let out_a = work.path().join("a.out");
    let t = Instant::now();
    run_ok(
        Command::new("qemu-img")
            .args(["convert", "-f", "raw", "-O", "raw"])
            .arg(&uri)
            .arg(&out_a),
        Duration::from_secs(300),
    );
    eprintln!("qemu-img convert out: {:.1?}", t.elapsed());
    assert_cmp(&img_a, &out_a);
    std::fs::remove_file(&out_a).unwrap();

    // nbdcopy image B over it: A's data chunks that are holes in B must be
    // unmapped by the zero/trim requests nbdcopy sends for them.
    let t = Instant::now();
    run_ok(
        Command::new("nbdcopy").arg(&img_b).arg(&uri),
        Duration::from_secs(300),
    );
    eprintln!("nbdcopy in: {:.1?}", t.elapsed());
    assert_map_matches(&uri, &layout_b, "after nbdcopy of image B over image A");

    let out_b = work.path().join("b.out");
    let t = Instant::now();
    run_ok(
        Command::new("nbdcopy").arg(&uri).arg(&out_b),
        Duration::from_secs(300),
    );
    eprintln!("nbdcopy out: {:.1?}", t.elapsed());
    assert_cmp(&img_b, &out_b);

    // And qemu-img reading what nbdcopy wrote agrees too.
    std::fs::remove_file(&out_b).unwrap();
    run_ok(
        Command::new("qemu-img")
            .args(["convert", "-f", "raw", "-O", "raw"])
            .arg(&uri)
            .arg(&out_b),
        Duration::from_secs(300),
    );
    assert_cmp(&img_b, &out_b);
}
