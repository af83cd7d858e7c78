//! Pipelined READ/WRITE traffic of 256 KiB blocks with verified data: what
//! the memory-bound tests run on their connections.

use std::sync::Arc;

use nbd_proto::consts::*;
use nbd_proto::RequestHeader;
use tokio::io::AsyncWriteExt;

use super::raw::{read_reply_from, RawClient, RawReply};

pub const KIB: u64 = 1024;
pub const MIB: u64 = 1024 * KIB;
/// Request size of the pipelines.
pub const BLOCK: u64 = 256 * KIB;

pub fn request(command_type: u16, handle: u64, offset_bytes: u64, length_bytes: u64) -> Vec<u8> {
    RequestHeader {
        flags: 0,
        command_type,
        handle,
        offset_bytes,
        length_bytes: length_bytes as u32,
    }
    .encode()
    .to_vec()
}

/// The bytes block `block` of connection `connection` holds after `round`.
pub fn pattern(connection: u64, block: u64, round: u64) -> Vec<u8> {
    let seed = (connection * 64 + block * 4 + round) as u8;
    (0..BLOCK as usize)
        .map(|i| seed.wrapping_add((i / 4096) as u8))
        .collect()
}

/// One request of a pipeline, with what its reply must carry.
pub enum Step {
    Write { block: u64, round: u64 },
    Read { block: u64, round: u64 },
}

/// Sends `steps` on a pipelined connection while reading the replies
/// concurrently (as real clients do), checking every reply and READ data.
pub async fn pipeline(
    client: RawClient,
    connection: u64,
    base: u64,
    steps: Vec<Step>,
) -> RawClient {
    let (mut read_half, mut write_half) = tokio::io::split(client.stream);
    let count = steps.len();
    let steps = Arc::new(steps);
    let sender = {
        let steps = Arc::clone(&steps);
        async move {
            for (handle, step) in steps.iter().enumerate() {
                let handle = handle as u64;
                let bytes = match *step {
                    Step::Write { block, round } => {
                        let mut bytes = request(CMD_WRITE, handle, base + block * BLOCK, BLOCK);
                        bytes.extend_from_slice(&pattern(connection, block, round));
                        bytes
                    }
                    Step::Read { block, .. } => {
                        request(CMD_READ, handle, base + block * BLOCK, BLOCK)
                    }
                };
                write_half.write_all(&bytes).await.unwrap();
            }
            write_half
        }
    };
    let receiver = async {
        let mut answered = vec![false; count];
        for _ in 0..count {
            let length = |handle: u64| match steps[handle as usize] {
                Step::Read { .. } => BLOCK as usize,
                Step::Write { .. } => 0,
            };
            let reply = read_reply_from(&mut read_half, length).await;
            assert_eq!(reply.error(), 0, "{reply:?}");
            let handle = reply.handle();
            let data = match reply {
                RawReply::Simple { data, .. } => data,
                RawReply::Chunk { header, payload } => {
                    assert_ne!(header.flags & REPLY_FLAG_DONE, 0);
                    payload.get(8..).unwrap_or_default().to_vec()
                }
            };
            match steps[handle as usize] {
                Step::Read { block, round } => {
                    assert!(data == pattern(connection, block, round), "block {block}");
                }
                Step::Write { .. } => assert!(data.is_empty()),
            }
            assert!(!std::mem::replace(&mut answered[handle as usize], true));
        }
    };
    let (write_half, ()) = tokio::join!(sender, receiver);
    RawClient {
        stream: Box::pin(read_half.unsplit(write_half)),
    }
}

/// Writes `blocks` blocks of round `round` at `base`, then reads them back:
/// two pipelines, every reply and READ data checked.
pub async fn write_then_read(
    client: RawClient,
    connection: u64,
    base: u64,
    blocks: u64,
    round: u64,
) -> RawClient {
    let writes = (0..blocks)
        .map(|block| Step::Write { block, round })
        .collect();
    let client = pipeline(client, connection, base, writes).await;
    let reads = (0..blocks)
        .map(|block| Step::Read { block, round })
        .collect();
    pipeline(client, connection, base, reads).await
}
