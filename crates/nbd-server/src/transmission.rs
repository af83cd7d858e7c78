//! The transmission phase of one connection. A reader pulls requests from a
//! buffered reader (many per read syscall), validates them, and hands each
//! to the device concurrently: the request's future is polled once in place
//! (a device that answers at once costs no task) and spawned as its own task
//! if it has to wait, so replies go out in completion order. A semaphore of
//! `max_in_flight_per_connection` permits bounds the requests in flight,
//! and the connection's share of the server-wide byte budget, then that
//! budget, the READ/WRITE data (see `budget`); when a request's permits are
//! not free the reader stops reading (TCP back-pressure). Replies go
//! through one queue to the writer task (see `writer`), which releases the
//! permits once a reply is written, and ends the connection if the client
//! stops reading replies for the stall timeout.

use std::fmt;
use std::future::{poll_fn, Future};
use std::io;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, Instant};

use nbd_proto::consts::*;
use nbd_proto::RequestHeader;
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, BufReader};
use tokio::sync::{mpsc, watch, Notify, Semaphore};
use tokio::task::JoinHandle;

use crate::budget::{self, ByteBudget, Permits};
use crate::config::ServerConfig;
use crate::device::BlockDevice;
use crate::execute::{execute, Op};
use crate::export::Export;
use crate::listen::SplitStream;
use crate::metrics::{GroupCounters, NbdOp};
use crate::reply::Reply;
use crate::validate::{self, Limits, Rejection};
use crate::writer::{write_replies, Outgoing, ReplySender, WriteError};

/// Read buffer: room for many small requests per read syscall.
const READ_BUFFER_BYTES: usize = 256 * 1024;
/// Payloads of refused writes up to this size (or `max_request_bytes` if
/// larger) are read and dropped; larger ones end the connection.
const MIN_DISCARD_LIMIT_BYTES: u64 = 64 * 1024 * 1024;

/// Why transmission ended.
pub(crate) enum End {
    /// NBD_CMD_DISC.
    Disconnect,
    /// End of stream between requests.
    ClientClosed,
    /// End of stream inside a request header or payload.
    ClientVanished,
    ReadFailed(io::Error),
    WriteFailed(io::Error),
    /// The client took no reply bytes for the stall timeout; the
    /// connection was dropped.
    RepliesStalled(Duration),
    /// The client broke the protocol; the connection was dropped.
    Protocol(String),
    /// The server is shutting down.
    Shutdown,
}

impl End {
    fn from_read_error(error: io::Error) -> End {
        match error.kind() {
            io::ErrorKind::UnexpectedEof => End::ClientVanished,
            _ => End::ReadFailed(error),
        }
    }

    /// Whether this is a client or protocol fault worth a warning.
    pub(crate) fn is_fault(&self) -> bool {
        matches!(self, End::Protocol(_) | End::RepliesStalled(_))
    }
}

impl fmt::Display for End {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            End::Disconnect => write!(f, "client disconnected"),
            End::ClientClosed => write!(f, "client closed the connection"),
            End::ClientVanished => write!(f, "client vanished in the middle of a request"),
            End::ReadFailed(error) => write!(f, "read failed: {error}"),
            End::WriteFailed(error) => write!(f, "write failed: {error}"),
            End::RepliesStalled(timeout) => write!(
                f,
                "client stopped reading replies for {} s; closing the connection",
                timeout.as_secs_f64()
            ),
            End::Protocol(message) => write!(f, "protocol error, connection dropped: {message}"),
            End::Shutdown => write!(f, "server shutting down"),
        }
    }
}

/// What the tasks of one connection share.
struct Connection<D> {
    export: Export<D>,
    limits: Limits,
    /// Where its requests are counted.
    counters: Arc<GroupCounters>,
    /// Requests that had to wait and run in their own task.
    requests_in_tasks: Arc<AtomicUsize>,
    /// Notified when the connection is torn down: request tasks still
    /// waiting on the device (past the shutdown grace) give up.
    cancel: Arc<Notify>,
}

impl<D> Connection<D> {
    fn new(export: Export<D>, counters: Arc<GroupCounters>) -> Self {
        let limits = Limits {
            params: export.params,
            has_meta_context: export.base_allocation_id.is_some(),
        };
        Connection {
            export,
            limits,
            counters,
            requests_in_tasks: Arc::new(AtomicUsize::new(0)),
            cancel: Arc::new(Notify::new()),
        }
    }
}

/// The in-flight bounds the reader waits on, in the order it takes them.
struct Bounds {
    /// `max_in_flight_per_connection` permits, one per request.
    requests: Arc<Semaphore>,
    /// This connection's share of the budget of READ/WRITE data.
    connection_bytes: ByteBudget,
    /// The server-wide budget of READ/WRITE data.
    server_bytes: ByteBudget,
}

/// Serves requests until the client leaves, breaks the protocol, or `stop`
/// turns true; then lets in-flight requests finish and their replies go out.
pub(crate) async fn serve<S: SplitStream, D: BlockDevice>(
    stream: S,
    export: Export<D>,
    counters: Arc<GroupCounters>,
    config: &ServerConfig,
    byte_budget: &ByteBudget,
    stop: &mut watch::Receiver<bool>,
) -> End {
    let (read_half, write_half) = stream.split_owned();
    let (sender, queue) = mpsc::unbounded_channel();
    let connection = Arc::new(Connection::new(export, counters));
    let in_tasks = Arc::clone(&connection.requests_in_tasks);
    let stall_timeout = config.reply_stall_timeout();
    let writing = write_replies(write_half, queue, in_tasks, stall_timeout);
    let mut writer = AbortOnDrop(tokio::spawn(writing));
    let mut cancel_if_cut = CancelOnDrop(Some(Arc::clone(&connection.cancel)));
    let permit_count = config
        .max_in_flight_per_connection
        .clamp(1, Semaphore::MAX_PERMITS);
    let bounds = Bounds {
        requests: Arc::new(Semaphore::new(permit_count)),
        connection_bytes: ByteBudget::new(config.in_flight_bytes_per_connection()),
        server_bytes: byte_budget.clone(),
    };
    let discard_limit_bytes = MIN_DISCARD_LIMIT_BYTES.max(config.max_request_bytes.into());
    let mut reader = BufReader::with_capacity(READ_BUFFER_BYTES, read_half);
    let finish = tokio::select! {
        biased;
        end = read_requests(&mut reader, &connection, &bounds, &sender, discard_limit_bytes) => {
            Finish::Reader(end)
        }
        // The writer only ends this early when writing failed: stop reading.
        result = &mut writer.0 => Finish::Writer(result),
        _ = stop.wait_for(|stopping| *stopping) => Finish::Reader(End::Shutdown),
    };
    drop(sender);
    let end = conclude(finish, &mut writer.0, stall_timeout).await;
    // Ended by itself (not cut): let running requests finish on their own.
    cancel_if_cut.0 = None;
    end
}

/// Waits for the writer to send what is queued (a client that does not
/// read gets the stall timeout); the end reason, with a write failure
/// taking precedence over a benign end.
async fn conclude(finish: Finish, writer: &mut WriterTask, stall_timeout: Duration) -> End {
    let (end, written) = match finish {
        Finish::Reader(end) => (end, writer.await),
        Finish::Writer(result) => (End::WriteFailed(io::Error::other("writer ended")), result),
    };
    match written {
        _ if end.is_fault() => end,
        Ok(Err(WriteError::Stalled)) => End::RepliesStalled(stall_timeout),
        Ok(Err(WriteError::Io(error))) => End::WriteFailed(error),
        Err(error) => End::WriteFailed(io::Error::other(error)),
        Ok(Ok(())) => end,
    }
}

type WriterTask = JoinHandle<Result<(), WriteError>>;

/// Which side of the connection stopped first.
enum Finish {
    Reader(End),
    Writer(Result<Result<(), WriteError>, tokio::task::JoinError>),
}

/// Cancels the request tasks of a connection when dropped armed: when the
/// connection is cut at the end of the shutdown grace, not when it ends by
/// itself (then running requests finish; their replies are dropped).
struct CancelOnDrop(Option<Arc<Notify>>);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        if let Some(cancel) = self.0.take() {
            cancel.notify_waiters();
        }
    }
}

/// Aborts the task when dropped (a connection cut at the end of the
/// shutdown grace takes its writer with it).
struct AbortOnDrop<T>(JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

async fn read_requests<R: AsyncRead + Unpin, D: BlockDevice>(
    reader: &mut BufReader<R>,
    connection: &Arc<Connection<D>>,
    bounds: &Bounds,
    sender: &ReplySender,
    discard_limit_bytes: u64,
) -> End {
    let mut header_bytes = [0u8; REQUEST_HEADER_BYTES];
    loop {
        // First the count permit, then (below) the byte permits: the one
        // order everywhere.
        let Ok(count_permit) = budget::acquire(&bounds.requests, 1).await else {
            return End::Protocol("request limiter closed".into());
        };
        match read_header(reader, &mut header_bytes).await {
            Ok(true) => {}
            Ok(false) => return End::ClientClosed,
            Err(error) => return End::from_read_error(error),
        }
        let header = match RequestHeader::decode(&header_bytes) {
            Ok(header) => header,
            Err(error) => return End::Protocol(error.to_string()),
        };
        if header.command_type == CMD_DISC {
            return End::Disconnect;
        }
        let mut op = match validate::check(&connection.limits, &header) {
            Ok(op) => op,
            Err(rejection) => {
                if header.command_type == CMD_WRITE {
                    let length_bytes = u64::from(header.length_bytes);
                    if let Err(end) = discard(reader, length_bytes, discard_limit_bytes).await {
                        return end;
                    }
                }
                let permits = Permits {
                    _count: count_permit,
                    _bytes: None,
                };
                refuse(connection, &header, rejection, sender, permits);
                continue;
            }
        };
        // The device's rate limits first: a request held back holds no
        // byte budget other devices need.
        if let Some((kind, bytes)) = op.admission() {
            connection.export.device.admit(kind, bytes).await;
        }
        // Before the WRITE payload is read or the READ buffer allocated:
        // the connection's share, then the server-wide budget.
        let bytes = budget::acquire_bytes(
            &bounds.connection_bytes,
            &bounds.server_bytes,
            op.data_bytes(),
        );
        let Ok(byte_permits) = bytes.await else {
            return End::Protocol("byte budget closed".into());
        };
        let permits = Permits {
            _count: count_permit,
            _bytes: byte_permits,
        };
        if let Err(error) = read_payload(reader, &mut op).await {
            return End::from_read_error(error);
        }
        dispatch(connection, header.handle, op, sender, permits).await;
    }
}

/// Answers a refused request with its error.
fn refuse<D>(
    connection: &Connection<D>,
    header: &RequestHeader,
    rejection: Rejection,
    sender: &ReplySender,
    permits: Permits,
) {
    let structured = connection.export.structured_replies;
    let op = NbdOp::of_command(header.command_type);
    connection.counters.record_refused(op);
    let reply = Reply::error(
        structured,
        header.handle,
        rejection.errno,
        rejection.message,
    );
    let _ = sender.send(Outgoing {
        reply,
        _permits: permits,
    });
}

/// Reads one request header. `Ok(false)`: clean end of stream.
async fn read_header<R: AsyncRead + Unpin>(
    reader: &mut BufReader<R>,
    header_bytes: &mut [u8; REQUEST_HEADER_BYTES],
) -> io::Result<bool> {
    if let Some(buffered) = reader.buffer().get(..REQUEST_HEADER_BYTES) {
        header_bytes.copy_from_slice(buffered);
        reader.consume(REQUEST_HEADER_BYTES);
        return Ok(true);
    }
    if reader.fill_buf().await?.is_empty() {
        return Ok(false);
    }
    reader.read_exact(header_bytes).await?;
    Ok(true)
}

/// Reads the data of a validated WRITE into its operation.
async fn read_payload<R: AsyncRead + Unpin>(
    reader: &mut BufReader<R>,
    op: &mut Op,
) -> io::Result<()> {
    if let Op::Write {
        length_bytes, data, ..
    } = op
    {
        *data = vec![0u8; *length_bytes as usize];
        reader.read_exact(data).await?;
    }
    Ok(())
}

/// Skips the payload of a refused WRITE, or gives up on the connection if
/// it is too large to skip sanely.
async fn discard<R: AsyncRead + Unpin>(
    reader: &mut BufReader<R>,
    length_bytes: u64,
    limit_bytes: u64,
) -> Result<(), End> {
    if length_bytes > limit_bytes {
        return Err(End::Protocol(format!(
            "refused write carries {length_bytes} bytes, more than the {limit_bytes} we skip"
        )));
    }
    let mut payload = reader.take(length_bytes);
    match tokio::io::copy(&mut payload, &mut tokio::io::sink()).await {
        Ok(copied_bytes) if copied_bytes == length_bytes => Ok(()),
        Ok(_) => Err(End::ClientVanished),
        Err(error) => Err(End::from_read_error(error)),
    }
}

/// Runs `op` concurrently with the reader: polled once here, spawned as a
/// task only if the device is not done yet. The reply goes to the writer.
async fn dispatch<D: BlockDevice>(
    connection: &Arc<Connection<D>>,
    handle: u64,
    op: Op,
    sender: &ReplySender,
    permits: Permits,
) {
    let mut task = Box::pin(run_request(
        Arc::clone(connection),
        handle,
        op,
        sender.clone(),
        permits,
    ));
    let finished = poll_fn(|context| Poll::Ready(task.as_mut().poll(context).is_ready())).await;
    if !finished {
        let requests_in_tasks = Arc::clone(&connection.requests_in_tasks);
        let cancel = Arc::clone(&connection.cancel);
        requests_in_tasks.fetch_add(1, Ordering::Relaxed);
        tokio::spawn(async move {
            tokio::select! {
                biased;
                () = &mut task => {}
                () = cancel.notified() => {}
            }
            requests_in_tasks.fetch_sub(1, Ordering::Relaxed);
        });
    }
}

async fn run_request<D: BlockDevice>(
    connection: Arc<Connection<D>>,
    handle: u64,
    op: Op,
    sender: ReplySender,
    permits: Permits,
) {
    let (kind, length_bytes) = (op.kind(), op.length_bytes());
    let started = Instant::now();
    let reply = execute(&connection.export, handle, op).await;
    let failed = reply.is_error();
    let counters = &connection.counters;
    counters.record(kind, length_bytes, started.elapsed(), failed);
    // A closed queue means the client is gone; the reply is moot.
    let _ = sender.send(Outgoing {
        reply,
        _permits: permits,
    });
}
