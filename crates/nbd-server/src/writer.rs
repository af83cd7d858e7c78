//! The single writer of a connection: takes finished replies from a queue
//! and writes everything queued with one vectored write (so many ready
//! replies cost one syscall), then waits for more. Each reply carries the
//! in-flight permits of its request (see `budget`), released once the
//! reply is written. The writer never waits for a permit itself, so
//! permits always come back while the client reads its replies.

use std::io::{self, IoSlice};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender};

use crate::budget::Permits;
use crate::reply::Reply;

/// Most replies gathered into one vectored write (well under IOV_MAX).
const MAX_BATCH_REPLIES: usize = 64;

/// A finished reply and the permits of the request it answers.
pub(crate) struct Outgoing {
    pub reply: Reply,
    pub _permits: Permits,
}

pub(crate) type ReplySender = UnboundedSender<Outgoing>;

/// Writes replies until every sender is gone, then shuts the write side
/// down. Returns the first write error. `requests_in_tasks` counts requests
/// running in their own task (see `transmission::dispatch`).
pub(crate) async fn write_replies<W: AsyncWrite + Unpin>(
    mut writer: W,
    mut queue: UnboundedReceiver<Outgoing>,
    requests_in_tasks: Arc<AtomicUsize>,
) -> io::Result<()> {
    let mut batch: Vec<Outgoing> = Vec::with_capacity(MAX_BATCH_REPLIES);
    while queue.recv_many(&mut batch, MAX_BATCH_REPLIES).await > 0 {
        if requests_in_tasks.load(Ordering::Relaxed) > 0 {
            // Request tasks woke us with their first reply; step back so the
            // others that are ready run too and their replies join this
            // write (else each reply would cost its own syscall).
            tokio::task::yield_now().await;
            drain_ready(&mut queue, &mut batch);
        }
        write_batch(&mut writer, &batch).await?;
        // Dropping the replies releases their permits.
        batch.clear();
    }
    writer.flush().await?;
    writer.shutdown().await
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
async fn write_batch<W: AsyncWrite + Unpin>(writer: &mut W, batch: &[Outgoing]) -> io::Result<()> {
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
        let written_bytes = writer.write_vectored(&slices[..count]).await?;
        if written_bytes == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        (reply_index, offset_bytes) = advance(batch, reply_index, offset_bytes + written_bytes);
    }
    Ok(())
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
