//! Serves an in-memory device, for benchmarks against `nbdkit memory`.
//!
//! ```text
//! cargo run --release -p nbd-server --example memserve -- unix:/tmp/x.sock 1G
//! fio --name=t --ioengine=nbd --uri='nbd+unix:///?socket=/tmp/x.sock' ...
//! ```
//!
//! Arguments: listen addresses (`unix:PATH`, `tcp:IP:PORT`), optionally a
//! size (`1G`, `512M`, bytes), and `--yield` to make every device call
//! return `Pending` once (as an engine that waits would), which exercises the
//! spawned-task path instead of the inline one. Stops on Ctrl-C / SIGTERM.

#[path = "../tests/common/mem_device.rs"]
mod mem_device;

use std::error::Error;
use std::io;
use std::sync::Arc;

use mem_device::{Exports, MemDevice};
use nbd_server::{
    BlockDevice, BlockSizes, ExportProvider, Extent, ListenAddr, Server, ServerConfig, ZeroFlags,
};

/// Returns `Pending` once, waking itself at once: the task is rescheduled
/// like one whose I/O just completed (unlike `yield_now`, which also
/// defers to the I/O driver).
fn pending_once() -> impl std::future::Future<Output = ()> {
    let mut pending = true;
    std::future::poll_fn(move |context| {
        if std::mem::take(&mut pending) {
            context.waker().wake_by_ref();
            return std::task::Poll::Pending;
        }
        std::task::Poll::Ready(())
    })
}

/// A device whose every call waits once (see `pending_once`) first.
struct Yielding<D>(D);

impl<D: BlockDevice> BlockDevice for Yielding<D> {
    fn size_bytes(&self) -> u64 {
        self.0.size_bytes()
    }

    fn block_sizes(&self) -> BlockSizes {
        self.0.block_sizes()
    }

    async fn read(&self, offset_bytes: u64, buf: &mut [u8]) -> io::Result<()> {
        pending_once().await;
        self.0.read(offset_bytes, buf).await
    }

    async fn write(&self, offset_bytes: u64, data: &[u8], fua: bool) -> io::Result<()> {
        pending_once().await;
        self.0.write(offset_bytes, data, fua).await
    }

    async fn flush(&self) -> io::Result<()> {
        pending_once().await;
        self.0.flush().await
    }

    async fn trim(&self, offset_bytes: u64, length_bytes: u64, fua: bool) -> io::Result<()> {
        pending_once().await;
        self.0.trim(offset_bytes, length_bytes, fua).await
    }

    async fn write_zeroes(
        &self,
        offset_bytes: u64,
        length_bytes: u64,
        flags: ZeroFlags,
    ) -> io::Result<()> {
        pending_once().await;
        self.0.write_zeroes(offset_bytes, length_bytes, flags).await
    }

    async fn block_status(
        &self,
        offset_bytes: u64,
        length_bytes: u64,
        max_extents: usize,
    ) -> io::Result<Vec<Extent>> {
        pending_once().await;
        self.0
            .block_status(offset_bytes, length_bytes, max_extents)
            .await
    }
}

async fn serve<P: ExportProvider>(provider: P, addrs: &[ListenAddr]) -> Result<(), Box<dyn Error>> {
    let server = Server::bind(Arc::new(provider), addrs, ServerConfig::default()).await?;
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    server
        .run(async move {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = terminate.recv() => {}
            }
        })
        .await?;
    Ok(())
}

fn parse_size_bytes(text: &str) -> Option<u64> {
    let (digits, unit) = match text.char_indices().last()? {
        (index, 'K' | 'k') => (&text[..index], 1 << 10),
        (index, 'M' | 'm') => (&text[..index], 1 << 20),
        (index, 'G' | 'g') => (&text[..index], 1 << 30),
        _ => (text, 1),
    };
    digits.parse::<u64>().ok()?.checked_mul(unit)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn Error>> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "nbd_server=info".into()),
        )
        .init();
    let mut addrs: Vec<ListenAddr> = Vec::new();
    let mut size_bytes = 1 << 30;
    let mut yielding = false;
    for arg in std::env::args().skip(1) {
        if arg == "--yield" {
            yielding = true;
            continue;
        }
        match (arg.parse(), parse_size_bytes(&arg)) {
            (Ok(addr), _) => addrs.push(addr),
            (Err(_), Some(size)) => size_bytes = size,
            (Err(error), None) => return Err(error.into()),
        }
    }
    if addrs.is_empty() {
        addrs.push("unix:/tmp/memserve.sock".parse()?);
    }
    let device = MemDevice::new(size_bytes);
    let description = "in-memory device";
    if yielding {
        let device = Arc::new(Yielding(device));
        serve(Exports::new().with("", description, device), &addrs).await
    } else {
        serve(
            Exports::new().with("", description, Arc::new(device)),
            &addrs,
        )
        .await
    }
}
