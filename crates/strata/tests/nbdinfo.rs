//! Test 1: what `nbdinfo` sees of strata's exports: sizes, transmission
//! flags, block size constraints, metadata contexts, one export per volume.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use common::*;
use std::process::Command;
use std::time::Duration;

#[test]
fn nbdinfo_reports_size_flags_block_sizes_and_contexts() {
    let _serial = serial();
    require_tools(&["nbdinfo"]);
    let tmp = tempfile::TempDir::new().unwrap();
    let port = free_tcp_port();
    let tcp = format!("tcp:127.0.0.1:{port}");
    let target = Target::under_test(
        Target::strata_with(&["--listen", &tcp]),
        Target::NbdkitMemory,
    );
    let is_strata = target.is_strata();
    let vols: &[(&str, u64)] = if is_strata {
        &[("vol", 3 * GIB), ("small", 64 * MIB)]
    } else {
        &[("vol", 3 * GIB)]
    };
    let server = Server::start(tmp.path(), target, vols);

    if is_strata {
        // `serve` prints the NBD URI of each volume it knows before `ready`
        // (for each listener).
        let banner = server.banner.join("\n");
        assert!(
            banner.contains(&format!("127.0.0.1:{port}")),
            "no URI for the TCP listener before ready:\n{banner}"
        );
        for (name, _) in vols {
            assert!(
                server
                    .banner
                    .iter()
                    .any(|l| l.contains("nbd") && l.contains(&format!("/{name}"))),
                "serve did not print a URI for volume {name}; stdout before ready:\n{banner}"
            );
        }
    }

    let mut uris: Vec<(String, &str, u64)> = vols
        .iter()
        .map(|(name, size)| (server.uri(name), *name, *size))
        .collect();
    if is_strata {
        // The same exports over the TCP listener.
        for (name, size) in vols {
            uris.push((format!("nbd://127.0.0.1:{port}/{name}"), name, *size));
        }
    }
    for (uri, name, size) in &uris {
        let (uri, name, size) = (uri.as_str(), *name, *size);
        let e = nbdinfo_json(uri);
        eprintln!("nbdinfo {uri}: {e}");
        assert_eq!(e["export-name"].as_str(), Some(name), "{e}");
        assert_eq!(e["export-size"].as_u64(), Some(size), "size of {uri}: {e}");
        assert_eq!(e["is_read_only"].as_bool(), Some(false), "{e}");
        for flag in [
            "can_flush",
            "can_fua",
            "can_trim",
            "can_zero",
            "can_fast_zero",
            "can_multi_conn",
            "can_cache",
        ] {
            assert_eq!(e[flag].as_bool(), Some(true), "{flag} of {uri}: {e}");
        }
        let min = e["block_size_minimum"]
            .as_u64()
            .unwrap_or_else(|| panic!("no block size info (NBD_INFO_BLOCK_SIZE): {e}"));
        let pref = e["block_size_preferred"].as_u64().expect("preferred");
        let max = e["block_size_maximum"].as_u64().expect("maximum");
        assert!(min.is_power_of_two() && min <= 4096, "minimum {min}");
        assert!(
            pref.is_power_of_two() && pref >= min && pref <= max,
            "preferred {pref}"
        );
        assert!(max >= MIB, "maximum block size {max} is < 1 MiB");
        let contexts: Vec<&str> = e["contexts"]
            .as_array()
            .expect("contexts")
            .iter()
            .filter_map(|c| c.as_str())
            .collect();
        assert!(
            contexts.contains(&"base:allocation"),
            "base:allocation not offered: {contexts:?}"
        );

        // A fresh volume is one big hole that reads as zeros.
        let map = nbdinfo_map(uri);
        let total: u64 = map.iter().map(|x| x.length).sum();
        assert_eq!(
            total, size,
            "map of {uri} does not cover the export: {map:?}"
        );
        assert!(
            map.iter().all(|x| x.ty & 3 == 3),
            "fresh {uri} not reported as hole,zero: {map:?}"
        );
    }

    if is_strata {
        // Export listing: every volume of the store is an export.
        let out = run_ok(
            Command::new("nbdinfo")
                .args(["--list", "--json"])
                .arg(format!("nbd+unix://?socket={}", server.socket.display())),
            Duration::from_secs(60),
        );
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let names: Vec<&str> = v["exports"]
            .as_array()
            .expect("exports")
            .iter()
            .filter_map(|e| e["export-name"].as_str())
            .collect();
        for (name, _) in vols {
            assert!(
                names.contains(name),
                "nbdinfo --list lacks {name}: {names:?}"
            );
        }
    }
}
