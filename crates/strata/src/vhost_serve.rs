//! `strata serve --vhost-user-dir` / `--vhost-user-socket`: which exports
//! get a vhost-user-blk socket, where, and the sockets systemd passed for
//! them (socket activation keeps a socket, and the frontend's connection
//! attempts, across a restart).

use std::collections::HashMap;
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{bail, Context};
use nbd_server::InheritedListener;
use vhost_user_blk::{Server, ServerConfig};

use crate::cli::VhostArgs;
use crate::nbd_volume::VolumeExports;

/// The exports to serve and their socket paths: `--vhost-user-socket`s,
/// then DIR/VOLUME.sock for each served volume under `--vhost-user-dir`.
pub fn sockets(args: &VhostArgs, served: &[String]) -> anyhow::Result<Vec<(String, PathBuf)>> {
    let mut out = Vec::new();
    for spec in &args.vhost_user_socket {
        let Some((export, path)) = spec.split_once('=') else {
            bail!(
                "--vhost-user-socket {spec:?}: expected EXPORT=PATH, e.g. vm1=/run/strata/vm1.sock"
            );
        };
        if export.is_empty() || path.is_empty() {
            bail!(
                "--vhost-user-socket {spec:?}: expected EXPORT=PATH, e.g. vm1=/run/strata/vm1.sock"
            );
        }
        out.push((export.to_string(), PathBuf::from(path)));
    }
    if let Some(dir) = &args.vhost_user_dir {
        for name in served {
            out.push((name.clone(), dir.join(format!("{name}.sock"))));
        }
    }
    Ok(out)
}

/// Takes the inherited unix listeners bound to a vhost-user socket path
/// (`--vhost-user-socket` paths, or any path in `--vhost-user-dir`); the
/// rest are NBD's.
pub fn take_inherited(
    args: &VhostArgs,
    inherited: Vec<InheritedListener>,
) -> (HashMap<PathBuf, UnixListener>, Vec<InheritedListener>) {
    // A malformed option is refused by `check` before anything is served.
    let explicit: Vec<PathBuf> = sockets(args, &[])
        .unwrap_or_default()
        .into_iter()
        .map(|(_, path)| path)
        .collect();
    let is_vhost = |p: &Path| {
        explicit.iter().any(|e| e == p)
            || args
                .vhost_user_dir
                .as_ref()
                .is_some_and(|d| p.parent() == Some(d.as_path()))
    };
    let mut vhost = HashMap::new();
    let mut rest = Vec::new();
    for l in inherited {
        match l {
            InheritedListener::Unix(u) => {
                let path = u
                    .local_addr()
                    .ok()
                    .and_then(|a| a.as_pathname().map(Path::to_path_buf));
                match path {
                    Some(p) if is_vhost(&p) => {
                        vhost.insert(p, u);
                    }
                    _ => rest.push(InheritedListener::Unix(u)),
                }
            }
            other => rest.push(other),
        }
    }
    (vhost, rest)
}

/// Refuses, before anything is opened or bound, a malformed
/// `--vhost-user-socket` and one whose export does not exist or that this
/// server does not serve (its frontend would be refused at every
/// reconnect, once a second).
pub async fn check(exports: &VolumeExports, args: &VhostArgs) -> anyhow::Result<()> {
    let sockets = sockets(args, &[])?;
    if sockets.is_empty() {
        return Ok(());
    }
    let volumes = exports.engine.list_volumes().await?;
    for (export, path) in &sockets {
        let (volume, snapshot) = match export.split_once('@') {
            Some((v, s)) => (v, Some(s)),
            None => (export.as_str(), None),
        };
        let Some(info) = volumes.iter().find(|v| v.name == volume) else {
            bail!("vhost-user-blk socket {} for {export}: no volume {volume:?} (strata volume list shows them)", path.display());
        };
        if let Some(snapshot) = snapshot {
            if !info.snapshots.iter().any(|s| s.name == snapshot) {
                bail!("vhost-user-blk socket {} for {export}: volume {volume:?} has no snapshot {snapshot:?} (strata snapshot list {volume})", path.display());
            }
        }
        if !exports.serves(volume) {
            bail!("vhost-user-blk socket {} for {export}: this server does not serve volume {volume:?} (add --volume {volume})", path.display());
        }
    }
    Ok(())
}

/// Binds (or adopts) every socket and serves it; prints one line per
/// socket. `None` when no vhost-user option was given.
pub async fn start(
    exports: Arc<VolumeExports>,
    args: &VhostArgs,
    served: &[String],
    mut inherited: HashMap<PathBuf, UnixListener>,
) -> anyhow::Result<Option<Arc<Server<VolumeExports>>>> {
    let sockets = sockets(args, served)?;
    if sockets.is_empty() && args.vhost_user_dir.is_none() {
        return Ok(None);
    }
    if args.vhost_user_queues == 0 {
        bail!("--vhost-user-queues 0: at least one queue is needed");
    }
    if let Some(dir) = &args.vhost_user_dir {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("creating --vhost-user-dir {}", dir.display()))?;
    }
    let config = ServerConfig {
        num_queues: args.vhost_user_queues,
        max_request_bytes: exports.max_request_bytes,
        ..ServerConfig::default()
    };
    let server = Server::new(exports, config);
    for (export, path) in sockets {
        let listener = match inherited.remove(&path) {
            Some(l) => l,
            None => vhost_user_blk::bind(&path).with_context(|| {
                format!("vhost-user-blk socket {} for {export}", path.display())
            })?,
        };
        server
            .serve(&export, listener)
            .with_context(|| format!("serving vhost-user-blk socket {}", path.display()))?;
        println!("vhost-user-blk {export} unix:{}", path.display());
    }
    Ok(Some(server))
}
