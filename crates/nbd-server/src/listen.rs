//! Listening addresses: parsing and printing `unix:` / `tcp:` addresses,
//! binding them (replacing stale unix socket files, refusing live ones),
//! adopting listeners bound by someone else (systemd socket activation),
//! accepting connections (TCP_NODELAY on), splitting accepted streams (the
//! write half telling the reply writer its send queue), and removing our
//! socket files at the end (never those of adopted listeners: their owner
//! keeps them, so clients queue in their backlog while we restart).

use std::fmt;
use std::io;
use std::net::SocketAddr;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::os::unix::io::{AsRawFd, RawFd};
use std::path::{Path, PathBuf};
use std::str::FromStr;

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};

use crate::writer::ReplySocket;

/// Where the server listens: `unix:/path.sock`, `tcp:127.0.0.1:10809`,
/// `tcp:[::1]:10809`. `Display` prints the same form `FromStr` parses.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum ListenAddr {
    Unix(PathBuf),
    Tcp(SocketAddr),
}

/// Why a string is not a [`ListenAddr`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseListenAddrError {
    input: String,
    reason: &'static str,
}

impl fmt::Display for ParseListenAddrError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "invalid listen address {:?}: {}",
            self.input, self.reason
        )
    }
}

impl std::error::Error for ParseListenAddrError {}

impl FromStr for ListenAddr {
    type Err = ParseListenAddrError;

    fn from_str(input: &str) -> Result<Self, Self::Err> {
        let error = |reason| ParseListenAddrError {
            input: input.to_owned(),
            reason,
        };
        if let Some(path) = input.strip_prefix("unix:") {
            if path.is_empty() {
                return Err(error("empty unix socket path"));
            }
            return Ok(ListenAddr::Unix(PathBuf::from(path)));
        }
        if let Some(address) = input.strip_prefix("tcp:") {
            return address.parse().map(ListenAddr::Tcp).map_err(|_| {
                error("expected tcp:IP:PORT, e.g. tcp:127.0.0.1:10809 or tcp:[::1]:10809")
            });
        }
        // A bare IP:PORT is what other NBD servers take; it can only
        // mean TCP.
        if let Ok(address) = input.parse() {
            return Ok(ListenAddr::Tcp(address));
        }
        if input.starts_with('/') {
            return Err(error(
                "a unix socket path needs the unix: prefix, e.g. unix:/run/strata/nbd.sock",
            ));
        }
        Err(error(
            "expected unix:PATH or [tcp:]IP:PORT, e.g. unix:/run/strata/nbd.sock or 127.0.0.1:10809",
        ))
    }
}

impl fmt::Display for ListenAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ListenAddr::Unix(path) => write!(f, "unix:{}", path.display()),
            ListenAddr::Tcp(address) => write!(f, "tcp:{address}"),
        }
    }
}

/// A bound listening socket.
pub(crate) enum Listener {
    /// The listener and its address as printed (the peer label of its
    /// connections: unix peers have no useful address of their own).
    Unix(UnixListener, String),
    Tcp(TcpListener),
}

/// A unix socket file we created; removed at shutdown if still ours.
#[derive(Debug)]
pub(crate) struct SocketFile {
    path: PathBuf,
    device: u64,
    inode: u64,
}

impl SocketFile {
    /// Removes the file unless someone replaced it since we bound it.
    pub(crate) fn remove(&self) {
        let still_ours = std::fs::symlink_metadata(&self.path)
            .map(|meta| meta.dev() == self.device && meta.ino() == self.inode)
            .unwrap_or(false);
        if still_ours {
            if let Err(error) = std::fs::remove_file(&self.path) {
                tracing::warn!(path = %self.path.display(), %error, "cannot remove socket file");
            }
        }
    }
}

/// Binds `addr`; errors name the address and the reason.
pub(crate) async fn bind(addr: &ListenAddr) -> io::Result<(Listener, Option<SocketFile>)> {
    let result = match addr {
        ListenAddr::Tcp(address) => TcpListener::bind(address)
            .await
            .map(|listener| (Listener::Tcp(listener), None)),
        ListenAddr::Unix(path) => bind_unix(path, addr.to_string()).await,
    };
    result.map_err(|error| {
        let hint = bind_hint(addr, error.kind());
        io::Error::new(
            error.kind(),
            format!("cannot listen on {addr}: {error}{hint}"),
        )
    })
}

/// What to do about a failed bind, for the one-line error.
fn bind_hint(addr: &ListenAddr, kind: io::ErrorKind) -> String {
    let parent = match addr {
        ListenAddr::Unix(path) => path.parent().map(|p| p.display().to_string()),
        ListenAddr::Tcp(_) => None,
    };
    match (kind, parent) {
        (io::ErrorKind::AddrInUse, _) => {
            "; another process listens there: stop it or give --listen another address".into()
        }
        (io::ErrorKind::NotFound, Some(dir)) => {
            format!("; the directory {dir} does not exist: create it or give --listen another path")
        }
        (io::ErrorKind::PermissionDenied, Some(dir)) => {
            format!(
                "; this user may not create a socket in {dir}: give --listen a writable directory"
            )
        }
        (io::ErrorKind::PermissionDenied, None) => {
            "; ports below 1024 need privileges: give --listen a port above 1023".into()
        }
        (io::ErrorKind::AddrNotAvailable, None) => {
            "; that IP address is not one of this machine's".into()
        }
        _ => String::new(),
    }
}

async fn bind_unix(path: &Path, label: String) -> io::Result<(Listener, Option<SocketFile>)> {
    remove_if_stale(path).await?;
    let listener = UnixListener::bind(path)?;
    let meta = std::fs::symlink_metadata(path)?;
    let file = SocketFile {
        path: path.to_owned(),
        device: meta.dev(),
        inode: meta.ino(),
    };
    Ok((Listener::Unix(listener, label), Some(file)))
}

/// Deletes a socket file nobody listens on; refuses live sockets and
/// files that are not sockets.
async fn remove_if_stale(path: &Path) -> io::Result<()> {
    let meta = match std::fs::symlink_metadata(path) {
        Ok(meta) => meta,
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(error) => return Err(error),
    };
    if !meta.file_type().is_socket() {
        return Err(io::Error::new(
            io::ErrorKind::AlreadyExists,
            "path exists and is not a socket",
        ));
    }
    match UnixStream::connect(path).await {
        Ok(_) => Err(io::Error::new(
            io::ErrorKind::AddrInUse,
            "another server is listening on this socket",
        )),
        Err(error) if error.kind() == io::ErrorKind::ConnectionRefused => {
            tracing::info!(path = %path.display(), "replacing stale unix socket");
            std::fs::remove_file(path)
        }
        Err(error) => Err(error),
    }
}

/// A listening socket bound by another process and passed to this one
/// (systemd's `LISTEN_FDS`): the server accepts on it but never binds,
/// unlinks or closes its address for good; the owner keeps it open across
/// our restarts, so connections wait in its backlog instead of being
/// refused.
#[derive(Debug)]
pub enum InheritedListener {
    Unix(std::os::unix::net::UnixListener),
    Tcp(std::net::TcpListener),
}

/// Registers an inherited listener with the runtime; returns it with its
/// address (an unnamed unix socket is reported as `unix:<inherited>`).
pub(crate) fn adopt(inherited: InheritedListener) -> io::Result<(Listener, ListenAddr)> {
    match inherited {
        InheritedListener::Tcp(listener) => {
            listener.set_nonblocking(true)?;
            let listener = TcpListener::from_std(listener)?;
            let addr = ListenAddr::Tcp(listener.local_addr()?);
            Ok((Listener::Tcp(listener), addr))
        }
        InheritedListener::Unix(listener) => {
            listener.set_nonblocking(true)?;
            let path = listener
                .local_addr()?
                .as_pathname()
                .map_or_else(|| PathBuf::from("<inherited>"), Path::to_path_buf);
            let addr = ListenAddr::Unix(path);
            let listener = UnixListener::from_std(listener)?;
            Ok((Listener::Unix(listener, addr.to_string()), addr))
        }
    }
}

impl Listener {
    /// The bound address (TCP port 0 resolved).
    pub(crate) fn local_addr(&self, requested: &ListenAddr) -> io::Result<ListenAddr> {
        match self {
            Listener::Tcp(listener) => listener.local_addr().map(ListenAddr::Tcp),
            Listener::Unix(..) => Ok(requested.clone()),
        }
    }

    /// Accepts one connection; TCP connections get TCP_NODELAY.
    pub(crate) async fn accept(&self) -> io::Result<Accepted> {
        match self {
            Listener::Tcp(listener) => {
                let (stream, peer) = listener.accept().await?;
                if let Err(error) = stream.set_nodelay(true) {
                    tracing::warn!(%peer, %error, "cannot set TCP_NODELAY");
                }
                Ok(Accepted::Tcp(stream, format!("tcp:{peer}")))
            }
            Listener::Unix(listener, label) => {
                let (stream, _) = listener.accept().await?;
                Ok(Accepted::Unix(stream, label.clone()))
            }
        }
    }
}

/// An accepted connection and a label for logs: `tcp:IP:PORT` of the
/// peer, or the `unix:PATH` it connected to.
pub(crate) enum Accepted {
    Unix(UnixStream, String),
    Tcp(TcpStream, String),
}

impl Accepted {
    /// The label for logs.
    pub(crate) fn peer(&self) -> &str {
        match self {
            Accepted::Unix(_, peer) | Accepted::Tcp(_, peer) => peer,
        }
    }
}

/// A connected stream that splits into independently owned halves.
pub(crate) trait SplitStream: AsyncRead + AsyncWrite + Unpin + Send + 'static {
    type ReadHalf: AsyncRead + Unpin + Send + 'static;
    type WriteHalf: AsyncWrite + ReplySocket + Unpin + Send + 'static;

    fn split_owned(self) -> (Self::ReadHalf, Self::WriteHalf);
}

impl SplitStream for TcpStream {
    type ReadHalf = tokio::net::tcp::OwnedReadHalf;
    type WriteHalf = tokio::net::tcp::OwnedWriteHalf;

    fn split_owned(self) -> (Self::ReadHalf, Self::WriteHalf) {
        self.into_split()
    }
}

impl SplitStream for UnixStream {
    type ReadHalf = tokio::net::unix::OwnedReadHalf;
    type WriteHalf = tokio::net::unix::OwnedWriteHalf;

    fn split_owned(self) -> (Self::ReadHalf, Self::WriteHalf) {
        self.into_split()
    }
}

impl ReplySocket for tokio::net::tcp::OwnedWriteHalf {
    fn queued_bytes(&self) -> Option<u64> {
        socket_queued_bytes(self.as_ref().as_raw_fd())
    }

    /// Zero linger: the close resets the connection and frees the send
    /// queue at once (else the kernel would keep it, and the client would
    /// not even see the end of the stream behind its unread replies).
    fn discard_on_close(&self) {
        let _ = self.as_ref().set_zero_linger();
    }
}

impl ReplySocket for tokio::net::unix::OwnedWriteHalf {
    fn queued_bytes(&self) -> Option<u64> {
        socket_queued_bytes(self.as_ref().as_raw_fd())
    }

    /// Nothing to do: what a unix socket sent waits in the peer's receive
    /// queue, freed when the peer reads it or closes.
    fn discard_on_close(&self) {}
}

/// Bytes in the send queue of socket `fd` (SIOCOUTQ): for TCP, sent but not
/// yet acknowledged or not yet sent; for a unix stream socket, written but
/// not yet read by the peer (counting the kernel's buffer overhead).
#[cfg(target_os = "linux")]
fn socket_queued_bytes(fd: RawFd) -> Option<u64> {
    let mut queued_bytes: libc::c_int = 0;
    // SAFETY: SIOCOUTQ (= TIOCOUTQ) stores one int through the pointer,
    // which points to a live c_int; `fd` is an open socket borrowed from
    // its owner for the duration of the call.
    let result = unsafe { libc::ioctl(fd, libc::TIOCOUTQ, &mut queued_bytes) };
    match result {
        0 => u64::try_from(queued_bytes).ok(),
        _ => None,
    }
}

/// Unknown elsewhere: only writes accepting bytes count as progress.
#[cfg(not(target_os = "linux"))]
fn socket_queued_bytes(_fd: RawFd) -> Option<u64> {
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_prints_addresses() {
        for text in [
            "unix:/tmp/x.sock",
            "unix:relative.sock",
            "tcp:127.0.0.1:10809",
            "tcp:[::1]:10809",
            "tcp:0.0.0.0:0",
        ] {
            let addr: ListenAddr = text.parse().unwrap();
            assert_eq!(addr.to_string(), text);
        }
        assert_eq!(
            "127.0.0.1:10809".parse::<ListenAddr>().unwrap().to_string(),
            "tcp:127.0.0.1:10809",
            "a bare IP:PORT is TCP"
        );
        assert_eq!(
            "unix:/a b".parse::<ListenAddr>().unwrap(),
            ListenAddr::Unix(PathBuf::from("/a b"))
        );
    }

    #[test]
    fn rejects_bad_addresses() {
        for text in [
            "",
            "unix:",
            "tcp:",
            "tcp:localhost:10809",
            "tcp:127.0.0.1",
            "tcp:::1:10809",
            "udp:127.0.0.1:1",
            "/tmp/x.sock",
        ] {
            let error = text.parse::<ListenAddr>().unwrap_err();
            assert!(
                error.to_string().contains("invalid listen address"),
                "{text}"
            );
        }
        let error = "/tmp/x.sock".parse::<ListenAddr>().unwrap_err();
        assert!(error.to_string().contains("unix: prefix"), "{error}");
    }

    #[tokio::test]
    async fn bind_errors_say_what_to_do() {
        let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = ListenAddr::Tcp(taken.local_addr().unwrap());
        let error = bind(&addr).await.err().unwrap().to_string();
        assert!(error.contains("cannot listen on tcp:127.0.0.1:"), "{error}");
        assert!(error.contains("another process listens there"), "{error}");
        let addr: ListenAddr = "unix:/nonexistent-dir/x.sock".parse().unwrap();
        let error = bind(&addr).await.err().unwrap().to_string();
        assert!(
            error.contains("the directory /nonexistent-dir does not exist"),
            "{error}"
        );
    }
}
