//! Serves an in-memory device, for benchmarks against `nbdkit memory`.
//!
//! ```text
//! cargo run --release -p nbd-server --example memserve -- unix:/tmp/x.sock 1G
//! fio --name=t --ioengine=nbd --uri='nbd+unix:///?socket=/tmp/x.sock' ...
//! ```
//!
//! Arguments: listen addresses (`unix:PATH`, `tcp:IP:PORT`), then optionally
//! a size (`1G`, `512M`, bytes). Stops on Ctrl-C / SIGTERM.

#[path = "../tests/common/mem_device.rs"]
mod mem_device;

use std::error::Error;
use std::sync::Arc;

use mem_device::{Exports, MemDevice};
use nbd_server::{ListenAddr, Server, ServerConfig};

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
    for arg in std::env::args().skip(1) {
        match (arg.parse(), parse_size_bytes(&arg)) {
            (Ok(addr), _) => addrs.push(addr),
            (Err(_), Some(size)) => size_bytes = size,
            (Err(error), None) => return Err(error.into()),
        }
    }
    if addrs.is_empty() {
        addrs.push("unix:/tmp/memserve.sock".parse()?);
    }
    let device = Arc::new(MemDevice::new(size_bytes));
    let provider = Arc::new(Exports::new().with("", "in-memory device", device));
    let server = Server::bind(provider, &addrs, ServerConfig::default()).await?;
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
