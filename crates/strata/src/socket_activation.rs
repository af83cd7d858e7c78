//! systemd integration of `strata serve`: the listening sockets systemd
//! passes (socket activation, `LISTEN_FDS`) and the readiness and stopping
//! notices it waits for (`Type=notify`, `NOTIFY_SOCKET`).
//!
//! Why socket activation: the socket then belongs to systemd and outlives
//! every restart of strata. A client that connects while strata restarts
//! (QEMU reconnecting after the old process closed its connection) waits
//! in the socket's backlog and is served by the next process, instead of
//! being refused and retrying on a timer. contrib/systemd has the units.
//!
//! Crates: `listenfd` takes the descriptors (checks `LISTEN_PID`, that each
//! is a unix or TCP stream socket, sets close-on-exec, clears the
//! variables); `sd-notify` speaks the notify protocol. Both are small and
//! widely used; neither links libsystemd.

use anyhow::bail;
use nbd_server::InheritedListener;

/// Takes the listening sockets passed by systemd, in order, and clears the
/// variables that passed them (children must not take them again). Call
/// before any thread starts: it changes the environment.
pub fn take_inherited_listeners() -> anyhow::Result<Vec<InheritedListener>> {
    let mut fds = listenfd::ListenFd::from_env();
    std::env::remove_var("LISTEN_FDNAMES");
    let mut listeners = Vec::with_capacity(fds.len());
    for index in 0..fds.len() {
        // Descriptor numbers start at 3 (SD_LISTEN_FDS_START).
        let fd = index + 3;
        let unix_error = match fds.take_unix_listener(index) {
            Ok(Some(listener)) => {
                listeners.push(InheritedListener::Unix(listener));
                continue;
            }
            Ok(None) => continue,
            Err(error) => error,
        };
        match fds.take_tcp_listener(index) {
            Ok(Some(listener)) => listeners.push(InheritedListener::Tcp(listener)),
            Ok(None) => {}
            Err(tcp_error) => bail!(
                "file descriptor {fd} passed by systemd (LISTEN_FDS) is neither a unix nor a TCP \
                 stream socket ({unix_error}; {tcp_error}): make every ListenStream= of the socket \
                 unit a path or an address"
            ),
        }
    }
    Ok(listeners)
}

/// Tells systemd (when it started us with `Type=notify`) that the server
/// accepts connections.
pub fn notify_ready() {
    notify(sd_notify::NotifyState::Ready);
}

/// Tells systemd that the server is stopping (draining and uploading).
pub fn notify_stopping() {
    notify(sd_notify::NotifyState::Stopping);
}

fn notify(state: sd_notify::NotifyState) {
    // Without NOTIFY_SOCKET this does nothing and succeeds.
    if let Err(error) = sd_notify::notify(false, &[state]) {
        tracing::warn!(%error, "cannot notify systemd (NOTIFY_SOCKET)");
    }
}
