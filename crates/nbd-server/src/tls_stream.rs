//! A TLS connection split for transmission: the read half for the request
//! reader, the write half for the reply writer, which still learns the
//! socket's send queue (the stall timeout) and can reset a TCP connection
//! on close, through the descriptor under TLS.

use std::io;
use std::os::unix::io::RawFd;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadHalf, WriteHalf};
use tokio_rustls::server::TlsStream;

use crate::listen::{socket_queued_bytes, RawSocket, SplitStream};
use crate::writer::ReplySocket;

/// The write half of a TLS connection, with its socket's descriptor
/// (valid while either half lives: they share the stream).
pub(crate) struct TlsWriteHalf<S> {
    inner: WriteHalf<TlsStream<S>>,
    fd: RawFd,
    tcp: bool,
}

impl<S> SplitStream for TlsStream<S>
where
    S: RawSocket + AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type ReadHalf = ReadHalf<TlsStream<S>>;
    type WriteHalf = TlsWriteHalf<S>;

    fn split_owned(self) -> (Self::ReadHalf, Self::WriteHalf) {
        let fd = self.get_ref().0.as_raw_fd();
        let (read, write) = tokio::io::split(self);
        let write = TlsWriteHalf {
            inner: write,
            fd,
            tcp: S::TCP,
        };
        (read, write)
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncWrite for TlsWriteHalf<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

impl<S> ReplySocket for TlsWriteHalf<S> {
    fn queued_bytes(&self) -> Option<u64> {
        socket_queued_bytes(self.fd)
    }

    /// As for plain TCP: zero linger, so the close resets the connection.
    fn discard_on_close(&self) {
        if !self.tcp {
            return;
        }
        let linger = libc::linger {
            l_onoff: 1,
            l_linger: 0,
        };
        // SAFETY: SO_LINGER reads one `linger` struct from the pointer,
        // which points to a live value of the size passed; `fd` is the
        // open socket under this TLS stream.
        unsafe {
            libc::setsockopt(
                self.fd,
                libc::SOL_SOCKET,
                libc::SO_LINGER,
                std::ptr::addr_of!(linger).cast(),
                std::mem::size_of::<libc::linger>() as libc::socklen_t,
            );
        }
    }
}
