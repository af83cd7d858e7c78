//! Test 5: a real ext4 filesystem on the export. nbdfuse exposes the export
//! as a file, a loop device turns it into a block device, mkfs.ext4 + mount +
//! files; then everything is torn down, the server restarted, and the files
//! must be identical and `fsck.ext4 -fn` clean.
//!
//! Needs root (loop devices, mount) and /dev/fuse, which CI has.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

const VOL: u64 = 512 * MIB;

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

fn fsck_clean(dev: &str) {
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

#[test]
fn ext4_on_nbdfuse_loop_survives_restart() {
    let _serial = serial();
    require_tools(&[
        "nbdfuse",
        "fusermount3",
        "losetup",
        "mkfs.ext4",
        "fsck.ext4",
        "mount",
        "umount",
    ]);
    let tmp = tempfile::TempDir::new().unwrap();
    let target = Target::under_test(Target::strata(), Target::NbdkitFile);
    let mut server = Server::start(tmp.path(), target, &[("vol", VOL)]);
    let uri = server.vol_uri();
    let fuse_dir = tmp.path().join("fuse");
    let mnt = tmp.path().join("mnt");

    // Round 1: make the filesystem and fill it.
    let fuse = FuseFile::mount(&fuse_dir, &uri);
    assert_eq!(std::fs::metadata(&fuse.file).unwrap().len(), VOL);
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

    let fuse = FuseFile::mount(&fuse_dir, &uri);
    let lo = LoopDev::attach(&fuse.file);
    fsck_clean(&lo.dev);
    let m = Mount::mount_dev(&lo.dev, &mnt);
    check_files(&m.dir, &files);
    for v in &victims {
        assert!(!m.dir.join(v).exists(), "{} came back", v.display());
    }
    m.unmount();
    lo.detach();
    fuse.unmount();
    server.assert_alive();
}
