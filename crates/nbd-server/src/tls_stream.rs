//! A TLS connection split for transmission: the request reader and the
//! reply writer each own their half of the socket and share only the
//! rustls session, locked just for the cryptography, never across a
//! socket call. (`tokio::io::split` of a TLS stream locks the whole stream
//! for every read and write, and a half that finds it locked spins: a
//! third of the IOPS went there.) The write half is the plain socket's, so
//! the reply writer still sees its send queue (the stall timeout) and can
//! reset a TCP connection on close.

use std::io::{self, IoSlice, Read};
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{ready, Context, Poll};

use rustls::ServerConnection;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_rustls::server::TlsStream;

use crate::listen::SplitStream;
use crate::writer::ReplySocket;

/// Ciphertext read from the socket per read call.
const READ_CHUNK_BYTES: usize = 64 * 1024;

type Session = Arc<Mutex<ServerConnection>>;

fn lock(session: &Session) -> MutexGuard<'_, ServerConnection> {
    // A panic while holding it leaves no half-done state rustls cares
    // about that a later call would misread; carry on.
    session
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl<S: SplitStream> SplitStream for TlsStream<S> {
    type ReadHalf = TlsReadHalf<S::ReadHalf>;
    type WriteHalf = TlsWriteHalf<S::WriteHalf>;

    fn split_owned(self) -> (Self::ReadHalf, Self::WriteHalf) {
        let (io, session) = self.into_inner();
        let (read, write) = io.split_owned();
        let session = Arc::new(Mutex::new(session));
        let reader = TlsReadHalf {
            io: read,
            session: Arc::clone(&session),
            staged: vec![0u8; READ_CHUNK_BYTES].into_boxed_slice(),
            staged_len: 0,
            staged_pos: 0,
        };
        let writer = TlsWriteHalf {
            io: write,
            session,
            pending: Vec::new(),
            pending_pos: 0,
        };
        (reader, writer)
    }
}

/// The read half: ciphertext from the socket into the session, plaintext
/// out of it.
pub(crate) struct TlsReadHalf<R> {
    io: R,
    session: Session,
    /// Ciphertext read (`staged[..staged_len]`) and not yet taken by the
    /// session (`staged_pos..`): it takes records only while its plaintext
    /// buffer has room.
    staged: Box<[u8]>,
    staged_len: usize,
    staged_pos: usize,
}

impl<R: AsyncRead + Unpin> AsyncRead for TlsReadHalf<R> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        out: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        loop {
            {
                let mut session = lock(&this.session);
                let staged = &this.staged[..this.staged_len];
                feed(&mut session, staged, &mut this.staged_pos)?;
                match session.reader().read(out.initialize_unfilled()) {
                    Ok(n) => {
                        // n == 0: the client's close_notify, the end.
                        out.advance(n);
                        return Poll::Ready(Ok(()));
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    Err(e) => return Poll::Ready(Err(e)),
                }
                if this.staged_pos < this.staged_len {
                    // No plaintext, yet the session takes no more.
                    return Poll::Ready(Err(io::Error::other("TLS session stalled")));
                }
            }
            let mut buf = ReadBuf::new(&mut this.staged);
            ready!(Pin::new(&mut this.io).poll_read(cx, &mut buf))?;
            let n = buf.filled().len();
            if n == 0 {
                return Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "the client closed the connection without a TLS close_notify",
                )));
            }
            (this.staged_len, this.staged_pos) = (n, 0);
        }
    }
}

/// Gives the session what it will take of `staged[*pos..]` and processes it.
fn feed(session: &mut ServerConnection, staged: &[u8], pos: &mut usize) -> io::Result<()> {
    while *pos < staged.len() && session.wants_read() {
        let mut rest = &staged[*pos..];
        let taken = session.read_tls(&mut rest as &mut dyn Read)?;
        *pos += taken;
        session
            .process_new_packets()
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
        if taken == 0 {
            break;
        }
    }
    Ok(())
}

/// The write half: plaintext into the session, its ciphertext to the
/// socket.
pub(crate) struct TlsWriteHalf<W> {
    io: W,
    session: Session,
    /// Ciphertext taken from the session, not yet written to the socket:
    /// at most what one write put in (the session's buffer limit).
    pending: Vec<u8>,
    pending_pos: usize,
}

impl<W: AsyncWrite + Unpin> TlsWriteHalf<W> {
    /// Writes the pending ciphertext to the socket.
    fn poll_drain(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.pending_pos < self.pending.len() {
            let rest = &self.pending[self.pending_pos..];
            let n = ready!(Pin::new(&mut self.io).poll_write(cx, rest))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.pending_pos += n;
        }
        self.pending.clear();
        self.pending_pos = 0;
        Poll::Ready(Ok(()))
    }

    /// Moves what the session has to send into `pending`.
    fn take_ciphertext(&mut self, session: &mut ServerConnection) -> io::Result<()> {
        while session.wants_write() {
            session.write_tls(&mut self.pending)?;
        }
        Ok(())
    }

    fn poll_write_with(
        &mut self,
        cx: &mut Context<'_>,
        write: impl FnOnce(&mut ServerConnection) -> io::Result<usize>,
    ) -> Poll<io::Result<usize>> {
        ready!(self.poll_drain(cx))?;
        let written = {
            let session = Arc::clone(&self.session);
            let mut session = lock(&session);
            let n = write(&mut session)?;
            self.take_ciphertext(&mut session)?;
            n
        };
        // Start sending now; what the socket does not take yet goes out
        // with the next write or the flush that ends each batch.
        if let Poll::Ready(Err(e)) = self.poll_drain(cx) {
            return Poll::Ready(Err(e));
        }
        Poll::Ready(Ok(written))
    }
}

impl<W: AsyncWrite + Unpin> AsyncWrite for TlsWriteHalf<W> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.poll_write_with(cx, |session| io::Write::write(&mut session.writer(), buf))
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.poll_write_with(cx, |session| {
            io::Write::write_vectored(&mut session.writer(), bufs)
        })
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        {
            let session = Arc::clone(&self.session);
            let mut session = lock(&session);
            self.take_ciphertext(&mut session)?;
        }
        ready!(self.poll_drain(cx))?;
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        {
            let session = Arc::clone(&self.session);
            let mut session = lock(&session);
            session.send_close_notify();
            self.take_ciphertext(&mut session)?;
        }
        ready!(self.poll_drain(cx))?;
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

impl<W: ReplySocket> ReplySocket for TlsWriteHalf<W> {
    fn queued_bytes(&self) -> Option<u64> {
        self.io.queued_bytes()
    }

    fn discard_on_close(&self) {
        self.io.discard_on_close()
    }
}
