//! Filesystems and mounts on the node: what is mounted where (from
//! `/proc/self/mountinfo`), making a filesystem on a new volume, mounting,
//! bind-mounting and unmounting, growing a mounted filesystem.

use std::path::Path;

use crate::command::{output, run};

/// The mount points in `/proc/self/mountinfo` text, unescaped.
fn mount_points(mountinfo: &str) -> Vec<String> {
    mountinfo
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(unescape)
        .collect()
}

/// The kernel writes space, tab, newline and backslash as `\ooo`.
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            let v = (b[i + 1] - b'0') as u32 * 64
                + (b[i + 2] - b'0') as u32 * 8
                + (b[i + 3] - b'0') as u32;
            out.push(v as u8);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn mountinfo() -> Result<String, String> {
    std::fs::read_to_string("/proc/self/mountinfo")
        .map_err(|e| format!("read /proc/self/mountinfo: {e}"))
}

/// Whether something is mounted at `path`.
pub fn is_mount_point(path: &Path) -> Result<bool, String> {
    let want = path.to_string_lossy();
    Ok(mount_points(&mountinfo()?).iter().any(|m| *m == want))
}

/// The source (device) of the last mount at `path`, if any.
pub fn mount_source(path: &Path) -> Result<Option<String>, String> {
    let want = path.to_string_lossy();
    Ok(mount_sources(&mountinfo()?)
        .into_iter()
        .rev()
        .find(|(point, _)| *point == want)
        .map(|(_, source)| source))
}

/// (mount point, source) of each line: the source is the second field
/// after the ` - ` separator.
fn mount_sources(mountinfo: &str) -> Vec<(String, String)> {
    mountinfo
        .lines()
        .filter_map(|l| {
            let point = l.split(' ').nth(4)?;
            let (_, tail) = l.split_once(" - ")?;
            let source = tail.split(' ').nth(1)?;
            Some((unescape(point), unescape(source)))
        })
        .collect()
}

/// Detaches whatever is mounted at `target` now and lets go of it when
/// it is no longer busy (`umount -l`): for mounts whose device died with
/// a previous node plugin.
pub async fn unmount_lazily(target: &Path) -> Result<(), String> {
    if is_mount_point(target)? {
        run("umount", &["-l", &target.to_string_lossy()]).await?;
    }
    Ok(())
}

/// The filesystem type on `device` (`None`: none found).
pub async fn fs_type_of(device: &Path) -> Result<Option<String>, String> {
    let dev = device.to_string_lossy();
    // blkid exits 2 when it finds nothing to report.
    let out = output("blkid", &["-p", "-o", "value", "-s", "TYPE", &dev]).await?;
    match out.code {
        Some(0) => Ok(Some(out.stdout.trim().to_string()).filter(|t| !t.is_empty())),
        Some(2) => Ok(None),
        _ => Err(format!("`blkid -p {dev}` failed: {}", out.stderr.trim())),
    }
}

/// Makes a `fs_type` filesystem on `device`.
pub async fn make_fs(device: &Path, fs_type: &str) -> Result<(), String> {
    let dev = device.to_string_lossy();
    match fs_type {
        // No lazy init: the inode tables are written now, not by a kernel
        // thread writing behind the pod's back for minutes.
        "ext4" => {
            run(
                "mkfs.ext4",
                &[
                    "-q",
                    "-F",
                    "-E",
                    "lazy_itable_init=0,lazy_journal_init=0",
                    &dev,
                ],
            )
            .await?
        }
        "xfs" => run("mkfs.xfs", &["-q", "-f", &dev]).await?,
        other => return Err(format!("no mkfs for fs_type {other:?}")),
    };
    Ok(())
}

/// Mounts `device` (a `fs_type` filesystem) at `target`.
pub async fn mount(
    device: &Path,
    target: &Path,
    fs_type: &str,
    options: &[String],
) -> Result<(), String> {
    let mut args = vec!["-t".to_string(), fs_type.to_string()];
    if !options.is_empty() {
        args.push("-o".to_string());
        args.push(options.join(","));
    }
    args.push(device.to_string_lossy().into_owned());
    args.push(target.to_string_lossy().into_owned());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    run("mount", &args).await.map(|_| ())
}

/// Bind-mounts `source` on `target` (read-only if asked: a bind mount is
/// made read-only by a remount).
pub async fn bind(source: &Path, target: &Path, read_only: bool) -> Result<(), String> {
    let (s, t) = (source.to_string_lossy(), target.to_string_lossy());
    run("mount", &["--bind", &s, &t]).await?;
    if read_only {
        if let Err(e) = run("mount", &["-o", "remount,bind,ro", &t]).await {
            let _ = run("umount", &[&t]).await;
            return Err(e);
        }
    }
    Ok(())
}

/// Unmounts `target` if something is mounted there.
pub async fn unmount(target: &Path) -> Result<(), String> {
    if is_mount_point(target)? {
        run("umount", &[&target.to_string_lossy()]).await?;
    }
    Ok(())
}

/// Grows the filesystem mounted at `mount_point` (on `device`) to the
/// device's size.
pub async fn grow_fs(device: &Path, mount_point: &Path) -> Result<(), String> {
    match fs_type_of(device).await?.as_deref() {
        Some("ext4") => match run("resize2fs", &[&device.to_string_lossy()]).await {
            Ok(_) => Ok(()),
            // EXT4_IOC_RESIZE_FS wants CAP_SYS_RESOURCE.
            Err(e) if e.contains("Permission denied") => Err(format!(
                "{e} (growing a mounted ext4 filesystem needs CAP_SYS_RESOURCE: run the node plugin privileged)"
            )),
            Err(e) => Err(e),
        },
        Some("xfs") => run("xfs_growfs", &[&mount_point.to_string_lossy()])
            .await
            .map(|_| ()),
        Some(other) => Err(format!("cannot grow a {other} filesystem")),
        None => Err(format!("no filesystem on {}", device.display())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mount_points_are_read_and_unescaped() {
        let info = "36 35 98:0 / /mnt/a\\040b rw,noatime master:1 - ext4 /dev/loop0 rw\n\
                    37 35 0:5 / /dev rw - devtmpfs udev rw\n";
        assert_eq!(
            mount_points(info),
            vec!["/mnt/a b".to_string(), "/dev".to_string()]
        );
        assert_eq!(unescape("a\\134b"), "a\\b");
        assert_eq!(
            mount_sources(info),
            vec![
                ("/mnt/a b".to_string(), "/dev/loop0".to_string()),
                ("/dev".to_string(), "udev".to_string())
            ]
        );
        assert_eq!(unescape("trailing\\04"), "trailing\\04");
    }

    #[test]
    fn the_root_is_a_mount_point_and_a_temporary_directory_is_not() {
        assert!(is_mount_point(Path::new("/")).unwrap());
        let dir = tempfile::tempdir().unwrap();
        assert!(!is_mount_point(dir.path()).unwrap());
    }
}
