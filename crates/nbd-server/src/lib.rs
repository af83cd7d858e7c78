//! NBD server core: listeners, fixed-newstyle handshake, option haggling and
//! the pipelined transmission loop. Generic over [`ExportProvider`]; it knows
//! no storage engine.
//!
//! Modules, one concept each:
//! - `device`: the `BlockDevice` / `ExportProvider` contract.
//! - `config`: [`ServerConfig`].
//! - `listen`: [`ListenAddr`], binding (stale unix sockets), accepting.
//! - `server`: [`Server`]: accept loop, connection tasks, shutdown.
//! - `connection`: one connection: handshake then transmission, logging.
//! - `handshake`: greeting and option haggling (STARTTLS policy).
//! - `tls`: [`Tls`]: certificates, client verification, [`TlsMode`].
//! - `tls_stream`: a TLS connection split for transmission.
//! - `export`: negotiated export parameters (flags, block sizes).
//! - `transmission`: request reader, in-flight bounds, concurrent dispatch.
//! - `budget`: the in-flight bounds: request count, per-connection and
//!   server-wide data bytes.
//! - `validate`: request checks before the device sees a request.
//! - `execute`: device calls and reply building.
//! - `reply`: reply bytes and errno mapping.
//! - `writer`: the batching reply writer, and the reply stall timeout.
//! - `metrics`: [`NbdMetrics`]: requests, errors, bytes and latency per
//!   command and export group; connections.

mod budget;
mod config;
mod connection;
mod device;
mod execute;
mod export;
mod handshake;
mod listen;
mod metrics;
mod reply;
mod server;
mod tls;
mod tls_stream;
mod transmission;
mod validate;
mod writer;

pub use config::ServerConfig;
pub use device::{
    Admission, Allocation, BlockDevice, BlockSizes, ExportInfo, ExportProvider, Extent, ZeroFlags,
};
pub use listen::{InheritedListener, ListenAddr, ParseListenAddrError};
pub use metrics::{
    GroupSnapshot, NbdMetrics, NbdOp, NbdSnapshot, OpSnapshot, LATENCY_BUCKETS, MAX_GROUPS,
    OVERFLOW_GROUP,
};
pub use server::Server;
pub use tls::{Tls, TlsMode};
