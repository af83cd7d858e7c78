//! Server tuning knobs and their defaults.

/// Limits and timeouts of a [`Server`](crate::Server).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerConfig {
    /// Requests one connection may have in flight (at least 1); when
    /// reached, the server stops reading from that connection until a reply
    /// has been written.
    pub max_in_flight_per_connection: usize,
    /// Largest READ or WRITE accepted (also caps the advertised maximum
    /// block size, which also bounds CACHE and WRITE_ZEROES without
    /// FAST_ZERO). Larger requests get EINVAL.
    pub max_request_bytes: u32,
    /// Time a client has from connecting to entering transmission.
    pub handshake_timeout_ms: u64,
    /// On shutdown, time in-flight requests get to finish before the
    /// remaining connections are cut (requests still in the device then
    /// are cancelled: their futures are dropped).
    pub shutdown_grace_ms: u64,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            max_in_flight_per_connection: 128,
            max_request_bytes: 32 * 1024 * 1024,
            handshake_timeout_ms: 10_000,
            shutdown_grace_ms: 5_000,
        }
    }
}
