//! The single writer of a connection: takes finished replies from a queue
//! and writes everything queued with one vectored write (so many ready
//! replies cost one syscall), then waits for more. Each reply carries the
//! in-flight permits of its request (see `budget`), released once the
//! reply is written. The writer never waits for a permit itself, so
//! permits always come back while the client reads its replies; a client
//! that stops reading is closed after the reply stall timeout (see
//! [`StallWatch`]), which drops the replies and so releases their permits.

use std::future::{poll_fn, Future};
use std::io::{self, IoSlice};
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender};
use tokio::time::{Instant, Sleep};

use crate::budget::Permits;
use crate::reply::Reply;

/// Most replies gathered into one vectored write (well under IOV_MAX).
const MAX_BATCH_REPLIES: usize = 64;
/// Checks of the send queue per stall timeout while a write waits.
const STALL_CHECKS_PER_TIMEOUT: u32 = 4;

/// A finished reply and the permits of the request it answers.
pub(crate) struct Outgoing {
    pub reply: Reply,
    pub _permits: Permits,
}

pub(crate) type ReplySender = UnboundedSender<Outgoing>;

/// What the writer needs of its socket besides writing.
pub(crate) trait ReplySocket {
    /// Bytes written to the socket that its peer has not taken yet (`None`
    /// if it cannot tell). Asked only while a write waits, a few times per
    /// stall timeout.
    fn queued_bytes(&self) -> Option<u64>;

    /// Makes closing the socket drop what it still holds (TCP: reset the
    /// connection) rather than keep it for a peer that does not read.
    fn discard_on_close(&self);
}

/// Why the writer stopped early.
#[derive(Debug)]
pub(crate) enum WriteError {
    Io(io::Error),
    /// The client took no reply bytes for the stall timeout.
    Stalled,
}

/// Writes replies until every sender is gone, then shuts the write side
/// down. Returns the first write error, or `Stalled` when the client made
/// no progress reading replies for `stall_timeout`. `requests_in_tasks`
/// counts requests running in their own task (see `transmission::dispatch`).
pub(crate) async fn write_replies<W: AsyncWrite + ReplySocket + Unpin>(
    mut writer: W,
    mut queue: UnboundedReceiver<Outgoing>,
    requests_in_tasks: Arc<AtomicUsize>,
    stall_timeout: Duration,
) -> Result<(), WriteError> {
    let mut batch: Vec<Outgoing> = Vec::with_capacity(MAX_BATCH_REPLIES);
    let mut watch = StallWatch::new(stall_timeout);
    while queue.recv_many(&mut batch, MAX_BATCH_REPLIES).await > 0 {
        if requests_in_tasks.load(Ordering::Relaxed) > 0 {
            // Request tasks woke us with their first reply; step back so the
            // others that are ready run too and their replies join this
            // write (else each reply would cost its own syscall).
            tokio::task::yield_now().await;
            drain_ready(&mut queue, &mut batch);
        }
        if let Err(error) = write_batch(&mut writer, &batch, &mut watch).await {
            if let WriteError::Stalled = error {
                writer.discard_on_close();
            }
            return Err(error);
        }
        // Dropping the replies releases their permits.
        batch.clear();
    }
    writer.flush().await.map_err(WriteError::Io)?;
    writer.shutdown().await.map_err(WriteError::Io)
}

/// Moves already queued replies into `batch`, up to the batch limit.
fn drain_ready(queue: &mut UnboundedReceiver<Outgoing>, batch: &mut Vec<Outgoing>) {
    while batch.len() < MAX_BATCH_REPLIES {
        match queue.try_recv() {
            Ok(outgoing) => batch.push(outgoing),
            Err(_) => return,
        }
    }
}

/// Writes every byte of `batch`, as few syscalls as the socket allows.
async fn write_batch<W: AsyncWrite + ReplySocket + Unpin>(
    writer: &mut W,
    batch: &[Outgoing],
    watch: &mut StallWatch,
) -> Result<(), WriteError> {
    let mut reply_index = 0;
    let mut offset_bytes = 0;
    while reply_index < batch.len() {
        let mut slices = [IoSlice::new(&[]); MAX_BATCH_REPLIES];
        let mut count = 0;
        for (slot, outgoing) in slices.iter_mut().zip(batch.iter().skip(reply_index)) {
            let bytes = outgoing.reply.as_bytes();
            let start = if count == 0 { offset_bytes } else { 0 };
            *slot = IoSlice::new(bytes.get(start..).unwrap_or(&[]));
            count += 1;
        }
        let slices = &slices[..count];
        let write = poll_fn(|context| watch.poll_write(&mut *writer, context, slices));
        let written_bytes = write.await?;
        if written_bytes == 0 {
            return Err(WriteError::Io(io::ErrorKind::WriteZero.into()));
        }
        (reply_index, offset_bytes) = advance(batch, reply_index, offset_bytes + written_bytes);
    }
    // A no-op on a plain socket; inside TLS, the records of what was
    // written may still wait in the session, and nothing else would send
    // them before the next reply.
    poll_fn(|context| watch.poll_flush(&mut *writer, context)).await
}

/// Moves the position (reply, offset into it) forward past whole replies.
fn advance(batch: &[Outgoing], mut reply_index: usize, mut offset_bytes: usize) -> (usize, usize) {
    while let Some(outgoing) = batch.get(reply_index) {
        let length_bytes = outgoing.reply.as_bytes().len();
        if offset_bytes < length_bytes {
            break;
        }
        offset_bytes -= length_bytes;
        reply_index += 1;
    }
    (reply_index, offset_bytes)
}

/// Notices a client that stopped reading its replies: a write that stays
/// pending with no sign of progress for the stall timeout. Progress is a
/// write accepting bytes, or the socket's send queue shrinking between two
/// checks (the client takes bytes, though not yet enough for the socket to
/// accept more: kernels wake a writer only once a good part of the buffer
/// is free, which a slow reader may take longer than the timeout to
/// drain). Costs nothing while writes complete at once; while one waits, a
/// timer checks the send queue a few times per timeout. The first check of
/// a stall takes the send queue's measure, so a client is cut only if its
/// queue did not shrink over the last three quarters of the timeout.
struct StallWatch {
    timeout: Duration,
    check_interval: Duration,
    /// Created at the first stall; past ones leave it disarmed (elapsed or
    /// pushed to `idle_deadline`) so it never wakes the writer for nothing.
    sleep: Option<Pin<Box<Sleep>>>,
    idle_deadline: Instant,
    /// The write waiting right now, if one is.
    stall: Option<Stall>,
}

/// A write that has been pending since `progress_at` or longer.
struct Stall {
    /// The last sign of progress.
    progress_at: Instant,
    /// The send queue at the last check (`None` before the first one).
    queued_bytes: Option<u64>,
}

impl StallWatch {
    fn new(timeout: Duration) -> StallWatch {
        StallWatch {
            timeout,
            check_interval: (timeout / STALL_CHECKS_PER_TIMEOUT).max(Duration::from_millis(1)),
            sleep: None,
            idle_deadline: Instant::now() + Duration::from_secs(86_400 * 365),
            stall: None,
        }
    }

    /// Polls a write of `slices`, watching for a stall while it is pending.
    fn poll_write<W: AsyncWrite + ReplySocket + Unpin>(
        &mut self,
        writer: &mut W,
        context: &mut Context<'_>,
        slices: &[IoSlice<'_>],
    ) -> Poll<Result<usize, WriteError>> {
        match Pin::new(&mut *writer).poll_write_vectored(context, slices) {
            Poll::Ready(result) => {
                self.progressed();
                Poll::Ready(result.map_err(WriteError::Io))
            }
            Poll::Pending => self
                .poll_stalled(context, writer)
                .map(|()| Err(WriteError::Stalled)),
        }
    }

    /// Polls a flush, watching for a stall while it is pending.
    fn poll_flush<W: AsyncWrite + ReplySocket + Unpin>(
        &mut self,
        writer: &mut W,
        context: &mut Context<'_>,
    ) -> Poll<Result<(), WriteError>> {
        match Pin::new(&mut *writer).poll_flush(context) {
            Poll::Ready(result) => {
                self.progressed();
                Poll::Ready(result.map_err(WriteError::Io))
            }
            Poll::Pending => self
                .poll_stalled(context, writer)
                .map(|()| Err(WriteError::Stalled)),
        }
    }

    /// A write completed: ends the stall, if any.
    fn progressed(&mut self) {
        if self.stall.take().is_some() {
            if let Some(sleep) = self.sleep.as_mut().filter(|sleep| !sleep.is_elapsed()) {
                // Pushing the deadline out is cheap and keeps the timer
                // from waking the writer later.
                sleep.as_mut().reset(self.idle_deadline);
            }
        }
    }

    /// A write is pending: starts or goes on with the stall; `Ready` when
    /// it has lasted the timeout without progress. Registers the timer
    /// with `context` otherwise.
    fn poll_stalled(&mut self, context: &mut Context<'_>, socket: &impl ReplySocket) -> Poll<()> {
        let sleep = match &mut self.sleep {
            Some(sleep) => sleep,
            None => self
                .sleep
                .insert(Box::pin(tokio::time::sleep_until(self.idle_deadline))),
        };
        let stall = match &mut self.stall {
            Some(stall) => stall,
            None => {
                let now = Instant::now();
                sleep.as_mut().reset(now + self.check_interval);
                self.stall.insert(Stall {
                    progress_at: now,
                    queued_bytes: None,
                })
            }
        };
        while sleep.as_mut().poll(context).is_ready() {
            let now = Instant::now();
            let queued_bytes = socket.queued_bytes();
            if let (Some(before), Some(after)) = (stall.queued_bytes, queued_bytes) {
                if after < before {
                    stall.progress_at = now;
                }
            }
            stall.queued_bytes = queued_bytes;
            let deadline = stall.progress_at + self.timeout;
            if now >= deadline {
                return Poll::Ready(());
            }
            sleep
                .as_mut()
                .reset(deadline.min(now + self.check_interval));
        }
        Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;
    use std::task::Waker;

    use tokio::sync::{mpsc, Semaphore};
    use tokio::task::JoinHandle;

    use super::*;

    const TIMEOUT: Duration = Duration::from_millis(1000);
    const KIB: usize = 1024;

    /// A socket buffer as the kernel keeps one: takes writes until it
    /// holds `capacity` bytes, then only once the peer drained it to a
    /// quarter (kernels wake writers only when much of the buffer is free).
    struct Buffer {
        queued_bytes: usize,
        capacity_bytes: usize,
        full: bool,
        waker: Option<Waker>,
        /// Whether `queued_bytes` is reported (SIOCOUTQ).
        measurable: bool,
        received_bytes: usize,
        discarded: bool,
    }

    #[derive(Clone)]
    struct MockSocket(Arc<Mutex<Buffer>>);

    impl MockSocket {
        fn new(capacity_bytes: usize, measurable: bool) -> MockSocket {
            MockSocket(Arc::new(Mutex::new(Buffer {
                queued_bytes: 0,
                capacity_bytes,
                full: false,
                waker: None,
                measurable,
                received_bytes: 0,
                discarded: false,
            })))
        }

        /// The peer reads up to `bytes`.
        fn take(&self, bytes: usize) -> usize {
            let mut buffer = self.0.lock().unwrap();
            let taken = bytes.min(buffer.queued_bytes);
            buffer.queued_bytes -= taken;
            buffer.received_bytes += taken;
            if buffer.full && buffer.queued_bytes <= buffer.capacity_bytes / 4 {
                buffer.full = false;
                if let Some(waker) = buffer.waker.take() {
                    waker.wake();
                }
            }
            taken
        }

        fn received_bytes(&self) -> usize {
            self.0.lock().unwrap().received_bytes
        }
    }

    impl ReplySocket for MockSocket {
        fn queued_bytes(&self) -> Option<u64> {
            let buffer = self.0.lock().unwrap();
            buffer.measurable.then_some(buffer.queued_bytes as u64)
        }

        fn discard_on_close(&self) {
            self.0.lock().unwrap().discarded = true;
        }
    }

    impl AsyncWrite for MockSocket {
        fn poll_write(
            self: Pin<&mut Self>,
            context: &mut Context<'_>,
            data: &[u8],
        ) -> Poll<io::Result<usize>> {
            let mut buffer = self.0.lock().unwrap();
            if buffer.full {
                buffer.waker = Some(context.waker().clone());
                return Poll::Pending;
            }
            let accepted = data.len().min(buffer.capacity_bytes - buffer.queued_bytes);
            buffer.queued_bytes += accepted;
            buffer.full = buffer.queued_bytes == buffer.capacity_bytes;
            Poll::Ready(Ok(accepted))
        }

        fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }

        fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }

    /// Runs a writer over `socket` with `replies` replies of `reply_bytes`
    /// queued at once, each holding a permit of the returned semaphore.
    fn start(
        socket: &MockSocket,
        replies: usize,
        reply_bytes: usize,
    ) -> (JoinHandle<Result<(), WriteError>>, Arc<Semaphore>) {
        let permits = Arc::new(Semaphore::new(replies));
        let (sender, queue) = mpsc::unbounded_channel();
        for handle in 0..replies {
            let count = Arc::clone(&permits).try_acquire_owned().unwrap();
            let outgoing = Outgoing {
                reply: Reply::Bytes(vec![handle as u8; reply_bytes]),
                _permits: Permits {
                    _count: count,
                    _bytes: None,
                },
            };
            assert!(sender.send(outgoing).is_ok());
        }
        drop(sender);
        let in_tasks = Arc::new(AtomicUsize::new(0));
        let writer = tokio::spawn(write_replies(socket.clone(), queue, in_tasks, TIMEOUT));
        (writer, permits)
    }

    #[tokio::test(start_paused = true)]
    async fn a_client_that_stops_reading_is_cut_after_the_timeout() {
        for measurable in [true, false] {
            let socket = MockSocket::new(64 * KIB, measurable);
            let started = Instant::now();
            let (writer, permits) = start(&socket, 8, 64 * KIB);
            // Reads a little at first, then nothing.
            tokio::time::sleep(TIMEOUT / 2).await;
            socket.take(8 * KIB);
            let result = writer.await.unwrap();
            assert!(matches!(result, Err(WriteError::Stalled)), "{result:?}");
            let elapsed = started.elapsed();
            assert!(elapsed >= TIMEOUT, "cut after {elapsed:?}");
            assert!(elapsed <= TIMEOUT * 2, "cut after {elapsed:?}");
            // Every reply, written or not, is dropped: all permits are back.
            assert_eq!(permits.available_permits(), 8);
            assert!(socket.0.lock().unwrap().discarded);
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_slow_but_steady_reader_is_never_cut() {
        // Drains 4 KiB per eighth of the timeout: the buffer frees to a
        // quarter (48 KiB read) only every 1.5 timeouts, so only the send
        // queue shrinking shows the progress.
        let socket = MockSocket::new(64 * KIB, true);
        let total_bytes = 4 * 64 * KIB;
        let (writer, permits) = start(&socket, 4, 64 * KIB);
        let started = Instant::now();
        while socket.received_bytes() < total_bytes {
            tokio::time::sleep(TIMEOUT / 8).await;
            socket.take(4 * KIB);
        }
        assert!(writer.await.unwrap().is_ok());
        assert!(started.elapsed() > TIMEOUT * 5);
        assert_eq!(permits.available_permits(), 4);
    }

    #[tokio::test(start_paused = true)]
    async fn without_a_send_queue_writes_accepting_bytes_are_the_progress() {
        // Frees the buffer to a quarter in half the timeout each time.
        let socket = MockSocket::new(64 * KIB, false);
        let total_bytes = 8 * 64 * KIB;
        let (writer, _permits) = start(&socket, 8, 64 * KIB);
        while socket.received_bytes() < total_bytes {
            tokio::time::sleep(TIMEOUT / 8).await;
            socket.take(12 * KIB);
        }
        assert!(writer.await.unwrap().is_ok());
        // The slow reader above, without a send queue to watch: cut.
        let socket = MockSocket::new(64 * KIB, false);
        let (writer, _permits) = start(&socket, 4, 64 * KIB);
        let reader = async {
            loop {
                tokio::time::sleep(TIMEOUT / 8).await;
                socket.take(4 * KIB);
            }
        };
        tokio::select! {
            result = writer => assert!(matches!(result.unwrap(), Err(WriteError::Stalled))),
            () = reader => {}
        }
    }
}
