//! Encryption and compression through the CLI and a served volume: `strata
//! key generate`, a volume created encrypted under `--key-file`, written
//! and read back by nbdcopy and qemu-io, no plaintext in the store, the
//! compression changed while it is served, and the errors a user meets: no
//! key, a wrong key, a key file others can read, a rekeyed volume's old
//! key. (Damaged and swapped chunks: `strata-volume/tests/at_rest.rs`.)
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::clients::qemu_io;
use common::*;

const VOL: u64 = 64 * MIB;
const MARKER: &[u8] = b"a line of text that must never be stored in the clear; ";

fn generate_key(path: &Path) -> String {
    let out = run_ok(
        Command::new(strata_bin())
            .args(["key", "generate"])
            .arg(path),
        Duration::from_secs(10),
    );
    let text = stdout_str(&out);
    let mode = std::fs::metadata(path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "{text}");
    // "... (fingerprint XXXXXXXXXXXXXXXX) ..."
    let at = text.find("fingerprint ").expect("fingerprint printed") + "fingerprint ".len();
    text[at..at + 16].to_string()
}

/// 4 MiB of text, then 4 MiB of random bytes.
fn image(path: &Path) -> Vec<u8> {
    let mut data: Vec<u8> = MARKER
        .iter()
        .cycle()
        .take(4 * MIB as usize)
        .copied()
        .collect();
    let mut random = vec![0u8; 4 * MIB as usize];
    Rng::new(5).fill(&mut random);
    data.extend_from_slice(&random);
    std::fs::write(path, &data).unwrap();
    data
}

fn copy_out_equals(server: &Server, scratch: &Path, want: &[u8], what: &str) {
    let back = scratch.join("back.img");
    let _ = std::fs::remove_file(&back);
    run_ok(
        Command::new("nbdcopy").arg(server.vol_uri()).arg(&back),
        Duration::from_secs(60),
    );
    let back = std::fs::read(&back).unwrap();
    assert!(back[..want.len()] == want[..], "{what}: data differs");
}

fn store_holds_marker(store: &Path) -> bool {
    let mut stack = vec![store.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else if std::fs::read(&p)
                .unwrap()
                .windows(MARKER.len())
                .any(|w| w == MARKER)
            {
                return true;
            }
        }
    }
    false
}

#[test]
fn an_encrypted_volume_is_served_with_its_key_and_refused_without_it() {
    require_tools(&["nbdcopy", "qemu-io"]);
    let _serial = serial();
    let tmp = tempfile::TempDir::new().unwrap();
    let key = tmp.path().join("key");
    let fingerprint = generate_key(&key);
    let key_arg = key.to_str().unwrap();
    let dir = tmp.path().join("srv");
    let mut server = Server::start(
        &dir,
        Target::strata_with(&["--key-file", key_arg]),
        &[("vol", VOL)],
    );
    let src = tmp.path().join("src.img");
    let data = image(&src);
    run_ok(
        Command::new("nbdcopy").arg(&src).arg(server.vol_uri()),
        Duration::from_secs(60),
    );
    copy_out_equals(&server, tmp.path(), &data, "served");
    let info = server.cli_ok(&["--key-file", key_arg, "volume", "info", "vol"]);
    assert!(info.contains("compression: lz4"), "{info}");
    assert!(
        info.contains(&format!("aes-256-gcm, key fingerprint {fingerprint}")),
        "{info}"
    );
    // The compression changes while clients are connected; new writes use it.
    let out = server.cli_ok(&["volume", "set-compression", "vol", "zstd:5"]);
    assert!(out.contains("lz4 -> zstd:5"), "{out}");
    let cmds = vec![
        "write -P 0x5a 32M 1M".to_string(),
        "read -P 0x5a 32M 1M".to_string(),
    ];
    let out = qemu_io(&server.vol_uri(), &cmds);
    assert!(out.status.success(), "{}", stderr_str(&out));
    server.stop();
    let info = server.cli_ok(&["volume", "info", "vol"]);
    assert!(info.contains("compression: zstd:5"), "{info}");
    assert!(
        !store_holds_marker(&server.store_dir()),
        "plaintext in the store"
    );

    // Without the key, with another key: `serve --volume` refuses, naming
    // the key the volume wants, in one line.
    let other = tmp.path().join("other");
    let other_fp = generate_key(&other);
    for (args, says) in [
        (vec!["--volume", "vol"], "is encrypted"),
        (
            vec!["--volume", "vol", "--key-file", other.to_str().unwrap()],
            "does not open",
        ),
    ] {
        server.target = Target::strata_with(&args);
        let (status, stderr) = match Server::try_start(&dir, server.target.clone(), &[]) {
            Ok(_) => panic!("served without its key ({args:?})"),
            Err(e) => e,
        };
        assert!(!status.success());
        assert!(stderr.contains(says), "{args:?}: {stderr}");
        assert!(stderr.contains(&fingerprint), "{args:?}: {stderr}");
        assert_eq!(
            stderr.matches(&fingerprint).count(),
            1,
            "said once: {stderr}"
        );
    }

    // Rekey (nobody serves it: the CLI does it), then only the new key opens.
    let out = server.cli_ok(&[
        "--key-file",
        key_arg,
        "volume",
        "rekey",
        "vol",
        "--new-key-file",
        other.to_str().unwrap(),
    ]);
    assert!(out.contains(&other_fp), "{out}");
    server.target = Target::strata_with(&["--key-file", key_arg, "--volume", "vol"]);
    let refused = Server::try_start(&dir, server.target.clone(), &[]);
    assert!(refused.is_err(), "the old key still opens the volume");
    // The new key in STRATA_KEY instead of a file.
    let hex = std::fs::read_to_string(&other).unwrap();
    server.target = Target::strata_with(&["--volume", "vol"]).with_env("STRATA_KEY", hex.trim());
    server.start_again();
    copy_out_equals(&server, tmp.path(), &data, "after rekey");
    let out = qemu_io(&server.vol_uri(), &["read -P 0x5a 32M 1M".to_string()]);
    assert!(out.status.success(), "{}", stderr_str(&out));
}

#[test]
fn key_files_must_be_private_and_keys_well_formed() {
    let _serial = serial();
    let tmp = tempfile::TempDir::new().unwrap();
    let key = tmp.path().join("key");
    generate_key(&key);
    // Never overwritten.
    let out = run_timeout(
        Command::new(strata_bin())
            .args(["key", "generate"])
            .arg(&key),
        Duration::from_secs(10),
    );
    assert!(!out.status.success());
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
    let server = Server::new_stopped(&tmp.path().join("srv"), Target::strata());
    let err = server.cli_err(&["--key-file", key.to_str().unwrap(), "volume", "list"]);
    assert!(err.contains("chmod 600"), "{err}");
    let server = Server::new_stopped(
        &tmp.path().join("srv2"),
        Target::strata().with_env("STRATA_KEY", "abc"),
    );
    let err = server.cli_err(&["volume", "list"]);
    assert!(
        err.contains("STRATA_KEY") && err.contains("64 hex digits"),
        "{err}"
    );
    let server = Server::new_stopped(&tmp.path().join("srv3"), Target::strata());
    let err = server.cli_err(&[
        "volume",
        "create",
        "v",
        "--size",
        "1M",
        "--compression",
        "gzip",
    ]);
    assert!(err.contains("lz4") && err.contains("zstd"), "{err}");
}
