//! Snapshots, clones and rollback under a real filesystem: ext4 on a
//! served volume (nbdfuse + loop + mount), files written, a snapshot taken
//! by the serving server, files changed and deleted; the snapshot's
//! read-only export (copied out with nbdcopy) fscks clean and holds the old
//! files; a clone of it mounts as a writable ext4 whose changes stay its
//! own; a rollback brings the old files back.
//!
//! Needs root (loop devices, mount) and /dev/fuse, which CI has.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::clients::fsck_clean;
use common::*;

const VOL: u64 = 256 * MIB;

type Files = BTreeMap<PathBuf, Vec<u8>>;

/// A filesystem on `uri` (or on an image file), mounted at `dir/mnt`.
struct Fs {
    mount: Option<Mount>,
    lo: Option<LoopDev>,
    fuse: Option<FuseFile>,
}

impl Fs {
    fn on_export(dir: &Path, uri: &str) -> Fs {
        let fuse = FuseFile::mount(&dir.join("fuse"), uri);
        let lo = LoopDev::attach(&fuse.file);
        Fs::finish(dir, lo, Some(fuse))
    }

    fn on_image(dir: &Path, image: &Path) -> Fs {
        let lo = LoopDev::attach(image);
        Fs::finish(dir, lo, None)
    }

    fn finish(dir: &Path, lo: LoopDev, fuse: Option<FuseFile>) -> Fs {
        fsck_clean(&lo.dev);
        let mount = Mount::mount_dev(&lo.dev, &dir.join("mnt"));
        Fs {
            mount: Some(mount),
            lo: Some(lo),
            fuse,
        }
    }

    fn root(&self) -> PathBuf {
        self.mount.as_ref().unwrap().dir.clone()
    }

    fn close(mut self) {
        run_ok(&mut Command::new("sync"), Duration::from_secs(120));
        self.mount.take().unwrap().unmount();
        let lo = self.lo.take().unwrap();
        fsck_clean(&lo.dev);
        lo.detach();
        if let Some(f) = self.fuse.take() {
            f.unmount();
        }
    }
}

fn write_files(root: &Path, files: &Files) {
    for (rel, data) in files {
        let p = root.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, data).unwrap();
    }
}

/// Exactly `files` under `root` (no others).
fn assert_files(root: &Path, files: &Files, what: &str) {
    let mut found = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.file_name().is_some_and(|n| n == "lost+found") {
                continue;
            }
            if p.is_dir() {
                stack.push(p);
            } else {
                found.push(p.strip_prefix(root).unwrap().to_path_buf());
            }
        }
    }
    found.sort();
    let want: Vec<PathBuf> = files.keys().cloned().collect();
    assert_eq!(found, want, "{what}: the files");
    for (rel, data) in files {
        assert!(
            std::fs::read(root.join(rel)).unwrap() == *data,
            "{what}: {} differs",
            rel.display()
        );
    }
}

fn files(seed: u64, n: u64) -> Files {
    let mut rng = Rng::new(seed);
    (0..n)
        .map(|i| {
            let mut data = vec![0u8; (rng.next_u64() % (256 * KIB)) as usize];
            rng.fill(&mut data);
            (PathBuf::from(format!("d{}/f{seed}-{i}", i % 5)), data)
        })
        .collect()
}

#[test]
fn ext4_snapshot_clone_and_rollback() {
    require_tools(&[
        "nbdfuse",
        "fusermount3",
        "losetup",
        "mkfs.ext4",
        "fsck.ext4",
        "nbdcopy",
    ]);
    let _serial = serial();
    let tmp = tempfile::TempDir::new().unwrap();
    let mut server = Server::start(tmp.path(), Target::strata(), &[("vol", VOL)]);
    let work = tmp.path().join("work");

    // ext4 with the old files.
    let fuse = FuseFile::mount(&work.join("fuse"), &server.vol_uri());
    let lo = LoopDev::attach(&fuse.file);
    run_ok(
        Command::new("mkfs.ext4")
            .args(["-q", "-F", "-E", "nodiscard"])
            .arg(&lo.dev),
        Duration::from_secs(300),
    );
    lo.detach();
    fuse.unmount();
    let old = files(1, 60);
    let fs = Fs::on_export(&work, &server.vol_uri());
    write_files(&fs.root(), &old);
    fs.close();
    server.cli_ok(&["snapshot", "create", "vol@before"]);

    // Changed and deleted after the snapshot.
    let mut new = old.clone();
    let fs = Fs::on_export(&work, &server.vol_uri());
    for rel in old.keys().step_by(3) {
        std::fs::remove_file(fs.root().join(rel)).unwrap();
        new.remove(rel);
    }
    let more = files(2, 20);
    write_files(&fs.root(), &more);
    new.extend(more);
    run_ok(
        Command::new("fstrim").arg(fs.root()),
        Duration::from_secs(120),
    );
    assert_files(&fs.root(), &new, "the volume after changes");
    fs.close();

    // The snapshot, copied out through its read-only export.
    let image = tmp.path().join("before.img");
    run_ok(
        Command::new("nbdcopy")
            .arg(server.uri("vol@before"))
            .arg(&image),
        Duration::from_secs(300),
    );
    let fs = Fs::on_image(&tmp.path().join("img"), &image);
    assert_files(&fs.root(), &old, "the snapshot");
    fs.close();

    // A clone of it: a writable ext4 of its own.
    server.cli_ok(&["volume", "clone", "vol@before", "c1"]);
    let fs = Fs::on_export(&work, &server.uri("c1"));
    assert_files(&fs.root(), &old, "the clone");
    let mine = files(3, 10);
    write_files(&fs.root(), &mine);
    std::fs::remove_file(fs.root().join(old.keys().next().unwrap())).unwrap();
    fs.close();
    let fs = Fs::on_export(&work, &server.vol_uri());
    assert_files(&fs.root(), &new, "the volume after the clone's changes");
    fs.close();

    // Rollback (not served meanwhile): the old files again.
    server.stop();
    server.cli_ok(&["snapshot", "rollback", "vol@before"]);
    server.start_again();
    let fs = Fs::on_export(&work, &server.vol_uri());
    assert_files(&fs.root(), &old, "the volume after rollback");
    fs.close();
    server.stop();
}
