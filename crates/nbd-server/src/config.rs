//! Server tuning knobs and their defaults.

use std::io;

/// Limits and timeouts of a [`Server`](crate::Server).
///
/// Memory for request data is bounded by configuration, not by clients:
/// READ/WRITE data in flight is at most `max_in_flight_bytes` server-wide,
/// and per connection the server holds about a fixed 256 KiB read buffer
/// plus `max_in_flight_per_connection` small replies on top, for at most
/// `max_connections` connections.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerConfig {
    /// Requests one connection may have in flight (at least 1); when
    /// reached, the server stops reading from that connection until a reply
    /// has been written.
    pub max_in_flight_per_connection: usize,
    /// Bytes of READ and WRITE data in flight across all connections: a
    /// WRITE's payload from before it is read off the socket, a READ's reply
    /// buffer from before it is allocated, each until its reply has been
    /// written. A connection whose next request does not fit stops reading
    /// until enough is released. Must be at least `max_request_bytes`
    /// (checked by [`Server::bind`](crate::Server::bind)).
    pub max_in_flight_bytes: u64,
    /// Connections served at once (at least 1), handshakes included.
    /// Further connections are accepted and closed at once, with a
    /// rate-limited warning.
    pub max_connections: usize,
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
            max_in_flight_bytes: 256 * 1024 * 1024,
            max_connections: 1024,
            max_request_bytes: 32 * 1024 * 1024,
            handshake_timeout_ms: 10_000,
            shutdown_grace_ms: 5_000,
        }
    }
}

impl ServerConfig {
    /// Checks the limits fit together: the byte budget must hold a request
    /// of the maximum size (else such a request would wait forever), and at
    /// least one connection must be allowed. An `InvalidInput` error
    /// naming the fields otherwise.
    pub fn validate(&self) -> io::Result<()> {
        let invalid = |message: String| Err(io::Error::new(io::ErrorKind::InvalidInput, message));
        if self.max_in_flight_bytes < u64::from(self.max_request_bytes) {
            return invalid(format!(
                "invalid server config: max_in_flight_bytes ({}) is smaller than \
                 max_request_bytes ({}); a request of the maximum size could never run",
                self.max_in_flight_bytes, self.max_request_bytes
            ));
        }
        if self.max_connections == 0 {
            return invalid("invalid server config: max_connections must be at least 1".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_is_valid() {
        assert!(ServerConfig::default().validate().is_ok());
    }

    #[test]
    fn rejects_a_budget_below_the_request_size() {
        let config = ServerConfig {
            max_in_flight_bytes: 1 << 20,
            max_request_bytes: (1 << 20) + 1,
            ..ServerConfig::default()
        };
        let error = config.validate().unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::InvalidInput);
        assert!(error.to_string().contains("max_in_flight_bytes"), "{error}");
        let equal = ServerConfig {
            max_in_flight_bytes: 1 << 20,
            max_request_bytes: 1 << 20,
            ..ServerConfig::default()
        };
        assert!(equal.validate().is_ok());
        let no_connections = ServerConfig {
            max_connections: 0,
            ..ServerConfig::default()
        };
        assert!(no_connections.validate().is_err());
    }
}
