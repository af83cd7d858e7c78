//! The control socket: how `strata volume gc`, `info` and `snapshot
//! create`/`delete` reach the server that holds a volume on this host.
//!
//! `strata serve` listens on `<data-dir>/control.sock` (mode 0600: only
//! the user running the server may ask). Protocol: one JSON request line,
//! one JSON reply line, then the connection closes.
//!
//! ```text
//! {"op":"gc","volume":"vm1","wait":true}  -> {"ok":{...GcPassReport...}}
//! {"op":"stats","volume":"vm1"}           -> {"ok":{...VolumeStats...}}
//! {"op":"snapshot_create","volume":"vm1","snapshot":"s"} -> {"ok":{...SnapshotRecord...}}
//! {"op":"snapshot_delete","volume":"vm1","snapshot":"s"} -> {"ok":null}
//! {"op":"resize","volume":"vm1","size_bytes":N,"allow_shrink":false} -> {"ok":OLD_SIZE}
//! {"op":"flatten","volume":"vm1"}         -> {"ok":BYTES_COPIED}
//! {"op":"set_compression","volume":"vm1","compression":"zstd:3"} -> {"ok":"lz4"}
//! {"op":"rekey","volume":"vm1","new_key_file":"/abs/path"} -> {"ok":"FINGERPRINT"}
//! {"op":"set_qos","volume":"vm1","qos":{"iops":{"rate":3000,"burst":3000}}} -> {"ok":{...previous...}}
//! {"op":"handover","volume":"vm1"}      -> {"ok":{...HandoverReport...}} (let go of it)
//! {"op":"handover","volume":"vm1","to":{...Successor...}} -> the same, the lease written over to `to`
//! {"op":"standby","volume":"vm1","by":"HOST","on":true} -> {"ok":null} (HOST stands by / left)
//! {"op":"take","volume":"vm1","timeout_ms":N} -> {"ok":{...TakeOutcome...}} (take it here)
//! any error                               -> {"error":"...","not_served":bool}
//! ```
//! Requests are bounded (`MAX_REQUEST_BYTES`); a volume this server does
//! not have open is answered `not_served`, so the caller can say where it is.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context;
use serde::{Deserialize, Serialize};
use strata_volume::Engine;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};

const MAX_REQUEST_BYTES: u64 = 4096;
/// A connection that sends no request line within this is closed.
const REQUEST_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Request {
    Gc {
        volume: String,
        wait: bool,
    },
    Stats {
        volume: String,
    },
    SnapshotCreate {
        volume: String,
        snapshot: String,
    },
    SnapshotDelete {
        volume: String,
        snapshot: String,
    },
    Resize {
        volume: String,
        size_bytes: u64,
        allow_shrink: bool,
    },
    Flatten {
        volume: String,
    },
    SetCompression {
        volume: String,
        compression: String,
    },
    SetQos {
        volume: String,
        qos: strata_volume::QosLimits,
    },
    /// Let go of the volume: upload, checkpoint, release the lease
    /// (`Engine::hand_over`). Another server asks this when it needs the
    /// volume; the engine's `request_handover` sends it.
    Handover {
        volume: String,
        /// A standby's host to write the lease over to (it then opens the
        /// volume without taking the lease); absent: release it.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        to: Option<strata_volume::Successor>,
    },
    /// Host `by` stands by to take the volume (`on`), or no longer does
    /// (`Engine::standby_request`); its engine sends this.
    Standby {
        volume: String,
        by: String,
        on: bool,
    },
    /// Take the volume for this server: its standby of it takes it, or it
    /// asks the holder to hand over and opens it (`Engine::take_volume`;
    /// `strata volume handover` run on this server's data dir).
    Take {
        volume: String,
        timeout_ms: u64,
    },
    /// The server reads the new key from this file (an absolute path):
    /// key material never travels through the socket.
    Rekey {
        volume: String,
        new_key_file: PathBuf,
    },
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Reply {
    Ok(serde_json::Value),
    Error { error: String, not_served: bool },
}

pub fn socket_path(data_dir: &Path) -> PathBuf {
    data_dir.join("control.sock")
}

/// Listens on the control socket until the task is dropped. A stale socket
/// file (no server behind it) is replaced; a live one is an error.
pub async fn listen(engine: Arc<Engine>) -> anyhow::Result<tokio::task::JoinHandle<()>> {
    // The data directory exists: `engine()` made it for `serve`.
    let dir = &engine.config().data_dir;
    let path = socket_path(dir);
    if UnixStream::connect(&path).await.is_ok() {
        anyhow::bail!(
            "another strata server uses the data directory (its control socket {} answers); give this one another --data-dir",
            path.display()
        );
    }
    let _ = std::fs::remove_file(&path);
    // Serving does not depend on it: without the socket (a data dir path
    // too long for a unix socket, say), `strata volume gc` says so.
    let listener = match UnixListener::bind(&path) {
        Ok(l) => l,
        Err(e) if data_dir_unusable(&e) => anyhow::bail!(
            "the data directory {} is not writable (cannot create {}: {}); give --data-dir a writable directory with free space",
            dir.display(),
            path.display(),
            e
        ),
        Err(e) => {
            tracing::warn!(socket = %path.display(), error = %strata_store::ErrorText(&e), "no control socket: `strata volume gc` and `info` cannot reach this server (the volumes are served all the same)");
            return Ok(tokio::spawn(async {}));
        }
    };
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))
            .with_context(|| format!("chmod {}", path.display()))?;
    }
    Ok(tokio::spawn(async move {
        loop {
            let Ok((conn, _)) = listener.accept().await else {
                continue;
            };
            let engine = engine.clone();
            tokio::spawn(async move {
                if let Err(e) = serve_one(&engine, conn).await {
                    tracing::warn!(error = %strata_store::ErrorText(e.as_ref()), "control request failed");
                }
            });
        }
    }))
}

/// Errors that say the data directory cannot be written at all (the
/// journals would fail next), as opposed to a socket path too long.
fn data_dir_unusable(e: &std::io::Error) -> bool {
    use std::io::ErrorKind;
    matches!(
        e.kind(),
        ErrorKind::ReadOnlyFilesystem | ErrorKind::PermissionDenied | ErrorKind::StorageFull
    )
}

async fn serve_one(engine: &Arc<Engine>, conn: UnixStream) -> anyhow::Result<()> {
    let (read, mut write) = conn.into_split();
    let mut line = String::new();
    let mut reader = BufReader::new(read.take(MAX_REQUEST_BYTES));
    let request = tokio::time::timeout(REQUEST_TIMEOUT, reader.read_line(&mut line));
    request.await.context("no control request within 10 s")??;
    let reply = match serde_json::from_str::<Request>(&line) {
        Ok(req) => answer(engine, req).await,
        Err(e) => Reply::Error {
            error: format!("bad control request: {e}"),
            not_served: false,
        },
    };
    let mut out = serde_json::to_vec(&reply)?;
    out.push(b'\n');
    write.write_all(&out).await?;
    Ok(())
}

async fn answer(engine: &Arc<Engine>, req: Request) -> Reply {
    // Not about a volume this server holds: answered by the engine.
    let not_held = match &req {
        Request::Standby { volume, by, on } => Some(
            engine
                .standby_request(volume, by, *on)
                .await
                .map(|()| serde_json::Value::Null)
                .map_err(anyhow::Error::from),
        ),
        Request::Take { volume, timeout_ms } => {
            let timeout = std::time::Duration::from_millis(*timeout_ms);
            let taken = engine.take_volume(volume, timeout).await;
            Some(
                taken
                    .map_err(anyhow::Error::from)
                    .and_then(|t| Ok(serde_json::to_value(t)?)),
            )
        }
        _ => None,
    };
    if let Some(result) = not_held {
        return match result {
            Ok(v) => Reply::Ok(v),
            Err(e) => Reply::Error {
                error: format!("{e:#}"),
                not_served: false,
            },
        };
    }
    let volume = match &req {
        Request::Standby { volume, .. } | Request::Take { volume, .. } => volume.clone(),
        Request::Gc { volume, .. }
        | Request::Stats { volume }
        | Request::SnapshotCreate { volume, .. }
        | Request::SnapshotDelete { volume, .. }
        | Request::Resize { volume, .. }
        | Request::Flatten { volume }
        | Request::SetCompression { volume, .. }
        | Request::SetQos { volume, .. }
        | Request::Rekey { volume, .. }
        | Request::Handover { volume, .. } => volume.clone(),
    };
    let Some(vol) = engine.served_or_opening(&volume).await else {
        return Reply::Error {
            error: format!("this server does not have volume {volume:?} open"),
            not_served: true,
        };
    };
    let result = match req {
        Request::Gc { wait, .. } => vol
            .gc_now(wait)
            .await
            .map_err(anyhow::Error::from)
            .and_then(|r| Ok(serde_json::to_value(r)?)),
        Request::Stats { .. } => serde_json::to_value(vol.stats()).map_err(anyhow::Error::from),
        Request::SnapshotCreate { snapshot, .. } => vol
            .create_snapshot(&snapshot)
            .await
            .map_err(anyhow::Error::from)
            .and_then(|r| Ok(serde_json::to_value(r)?)),
        Request::Flatten { .. } => vol
            .flatten()
            .await
            .map(serde_json::Value::from)
            .map_err(anyhow::Error::from),
        Request::Resize {
            size_bytes,
            allow_shrink,
            ..
        } => vol
            .resize(size_bytes, allow_shrink)
            .await
            .map(serde_json::Value::from)
            .map_err(anyhow::Error::from),
        Request::SetCompression { compression, .. } => match compression.parse() {
            Ok(c) => vol
                .set_compression(c)
                .await
                .map(|previous| serde_json::Value::from(previous.to_string()))
                .map_err(anyhow::Error::from),
            Err(e) => Err(anyhow::anyhow!(e)),
        },
        Request::SetQos { qos, .. } => vol
            .set_qos(qos)
            .await
            .map_err(anyhow::Error::from)
            .and_then(|previous| Ok(serde_json::to_value(previous)?)),
        Request::Rekey { new_key_file, .. } => match strata_volume::load_key_file(&new_key_file) {
            Ok(key) => vol
                .rekey(&key)
                .await
                .map(serde_json::Value::from)
                .map_err(anyhow::Error::from),
            Err(e) => Err(anyhow::Error::from(e)),
        },
        Request::Handover { to, .. } => engine
            .hand_over_to(&volume, to.as_ref())
            .await
            .map_err(anyhow::Error::from)
            .and_then(|r| Ok(serde_json::to_value(r)?)),
        Request::SnapshotDelete { snapshot, .. } => {
            let deleted = engine.delete_snapshot(&volume, &snapshot).await;
            deleted
                .map(|()| serde_json::Value::Null)
                .map_err(anyhow::Error::from)
        }
        // Answered at the top (they are not about a volume held here).
        Request::Standby { .. } | Request::Take { .. } => Err(anyhow::anyhow!(
            "standby and take requests are answered by the engine"
        )),
    };
    match result {
        Ok(v) => Reply::Ok(v),
        Err(e) => Reply::Error {
            error: strata_store::error_text(e.as_ref()),
            not_served: false,
        },
    }
}

/// Runs `req` on the server on this host that has `volume` open. `Some`:
/// it did, with its answer. `None`: no server here has it open and no
/// other server holds it, so the caller runs the operation itself. An
/// error when it failed there, or when another server holds the volume
/// (`what` is what the user asked for, `command` the command to run on
/// the host that serves it).
pub async fn on_serving_server(
    engine: &Engine,
    volume: &str,
    req: &Request,
    what: &str,
    command: &str,
) -> anyhow::Result<Option<serde_json::Value>> {
    match ask(&engine.config().data_dir, req).await? {
        Some(Reply::Ok(v)) => return Ok(Some(v)),
        Some(Reply::Error {
            error,
            not_served: false,
        }) => anyhow::bail!("the server on this host could not {what}: {error}"),
        Some(Reply::Error { .. }) | None => {}
    }
    let info = engine.volume_info_with(volume, false).await?;
    if let Some(holder) = info.served_by {
        anyhow::bail!("volume {volume:?} is being served by {holder}: run `{command}` on that host (with its --data-dir), where the serving server does it");
    }
    Ok(None)
}

/// Sends `req` to the server on this data directory. `Ok(None)`: no server
/// listens there.
pub async fn ask(data_dir: &Path, req: &Request) -> anyhow::Result<Option<Reply>> {
    let path = socket_path(data_dir);
    let mut conn = match UnixStream::connect(&path).await {
        Ok(c) => c,
        // No server there (or none this user may ask): the caller goes on
        // with what the store says.
        Err(e) => {
            tracing::debug!(socket = %path.display(), error = %strata_store::ErrorText(&e), "no control socket");
            return Ok(None);
        }
    };
    let mut line = serde_json::to_vec(req)?;
    line.push(b'\n');
    conn.write_all(&line).await?;
    let mut reply = String::new();
    BufReader::new(conn).read_line(&mut reply).await?;
    let reply = serde_json::from_str(&reply)
        .with_context(|| format!("unreadable reply from the server on {}", path.display()))?;
    Ok(Some(reply))
}
