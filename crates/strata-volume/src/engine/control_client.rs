//! Talking to another server's control socket (`strata serve`'s
//! `control.rs`: one JSON line each way), as a handover or a standby does
//! with a holder on this machine.

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};

use crate::format::host_record::HostRecord;

/// Largest reply read from a control socket.
const MAX_REPLY_BYTES: u64 = 64 << 10;

/// The holder's control socket if it can be reached from here: advertised
/// in its host record, on this machine, and present.
pub(crate) fn local_control_socket(record: &HostRecord) -> Option<String> {
    let here = crate::ownership::hostname();
    record
        .control_socket
        .clone()
        .filter(|_| record.hostname == here)
        .filter(|p| std::path::Path::new(p).exists())
}

/// One request over a server's control socket (one JSON line each way);
/// its `ok` value, or why not ("the holder refused: ..." when it answered
/// with an error).
pub(crate) async fn control_call(
    path: &str,
    request: &serde_json::Value,
) -> Result<serde_json::Value, String> {
    let mut conn = tokio::net::UnixStream::connect(path)
        .await
        .map_err(|e| format!("connect {path}: {e}"))?;
    let mut line = request.to_string().into_bytes();
    line.push(b'\n');
    conn.write_all(&line)
        .await
        .map_err(|e| format!("send to {path}: {e}"))?;
    let mut reply = String::new();
    BufReader::new(conn.take(MAX_REPLY_BYTES))
        .read_line(&mut reply)
        .await
        .map_err(|e| format!("read from {path}: {e}"))?;
    let value: serde_json::Value =
        serde_json::from_str(&reply).map_err(|e| format!("unreadable reply from {path}: {e}"))?;
    if let Some(ok) = value.get("ok") {
        return Ok(ok.clone());
    }
    // `{"error":{"error":"...","not_served":bool}}` (control.rs's Reply).
    let error = value
        .get("error")
        .and_then(|e| e.as_str().or_else(|| e.get("error")?.as_str()))
        .unwrap_or("no answer");
    Err(format!("the holder refused: {error}"))
}
