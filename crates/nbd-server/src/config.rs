//! Server tuning knobs and their defaults.

use std::io;
use std::time::Duration;

/// Limits and timeouts of a [`Server`](crate::Server).
///
/// Memory for request data is bounded by configuration, not by clients:
/// READ/WRITE data in flight is at most `max_in_flight_bytes` server-wide
/// (of which one connection holds at most its
/// [share](ServerConfig::in_flight_bytes_per_connection)), and per
/// connection the server holds about a fixed 256 KiB read buffer plus
/// `max_in_flight_per_connection` small replies on top, for at most
/// `max_connections` connections. A client that stops reading its replies
/// gives its share back when `reply_stall_timeout_ms` closes it.
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
    /// Bytes of `max_in_flight_bytes` one connection may hold at once, so
    /// that no single client (say one that stopped reading its replies) can
    /// take the whole budget and stall the others. `None` (the default):
    /// a quarter of `max_in_flight_bytes`, at least `max_request_bytes`
    /// (see [`in_flight_bytes_per_connection`](Self::in_flight_bytes_per_connection)).
    /// If set, must be at least `max_request_bytes` (checked by
    /// [`validate`](Self::validate)); more than `max_in_flight_bytes` means
    /// all of it.
    pub max_in_flight_bytes_per_connection: Option<u64>,
    /// A connection whose reply writer makes no progress for this long
    /// (the client stopped reading: no reply bytes leave for the socket,
    /// nor does the socket's send queue shrink) is closed, and everything
    /// it holds of the in-flight bounds is released. A client reading
    /// slowly but steadily is never cut. At least 1.
    pub reply_stall_timeout_ms: u64,
    /// Connections served at once (at least 1), handshakes included.
    /// Further connections are accepted and closed at once, with a
    /// rate-limited warning.
    pub max_connections: usize,
    /// Largest READ or WRITE accepted (also caps the advertised maximum
    /// block size, which also bounds CACHE and WRITE_ZEROES without
    /// FAST_ZERO). Larger requests get EINVAL.
    pub max_request_bytes: u32,
    /// Time a client has from connecting to entering transmission, not
    /// counting the provider's opening of the export (which bounds itself:
    /// a strata standby registers with its holder in up to a third of the
    /// lease TTL when they reach each other through the store).
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
            max_in_flight_bytes_per_connection: None,
            reply_stall_timeout_ms: 60_000,
            max_connections: 1024,
            max_request_bytes: 32 * 1024 * 1024,
            handshake_timeout_ms: 10_000,
            shutdown_grace_ms: 5_000,
        }
    }
}

impl ServerConfig {
    /// The bytes of READ/WRITE data one connection may have in flight:
    /// `max_in_flight_bytes_per_connection`, by default a quarter of
    /// `max_in_flight_bytes` but at least `max_request_bytes`; never more
    /// than `max_in_flight_bytes`.
    pub fn in_flight_bytes_per_connection(&self) -> u64 {
        let share = self
            .max_in_flight_bytes_per_connection
            .unwrap_or_else(|| (self.max_in_flight_bytes / 4).max(self.max_request_bytes.into()));
        share.min(self.max_in_flight_bytes)
    }

    /// `reply_stall_timeout_ms` as a duration.
    pub(crate) fn reply_stall_timeout(&self) -> Duration {
        Duration::from_millis(self.reply_stall_timeout_ms)
    }

    /// Checks the limits fit together: the byte budget, and a connection's
    /// share of it, must hold a request of the maximum size (else such a
    /// request would wait forever), at least one connection must be
    /// allowed, and the reply stall timeout must not be zero. An
    /// `InvalidInput` error naming the fields otherwise.
    pub fn validate(&self) -> io::Result<()> {
        let invalid = |message: String| Err(io::Error::new(io::ErrorKind::InvalidInput, message));
        if self.max_in_flight_bytes < u64::from(self.max_request_bytes) {
            return invalid(format!(
                "invalid server config: max_in_flight_bytes ({}) is smaller than \
                 max_request_bytes ({}); a request of the maximum size could never run",
                self.max_in_flight_bytes, self.max_request_bytes
            ));
        }
        if let Some(share) = self.max_in_flight_bytes_per_connection {
            if share < u64::from(self.max_request_bytes) {
                return invalid(format!(
                    "invalid server config: max_in_flight_bytes_per_connection ({share}) is \
                     smaller than max_request_bytes ({}); a request of the maximum size could \
                     never run",
                    self.max_request_bytes
                ));
            }
        }
        if self.reply_stall_timeout_ms == 0 {
            return invalid(
                "invalid server config: reply_stall_timeout_ms must be at least 1".into(),
            );
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

    #[test]
    fn connection_share_defaults_to_a_quarter_at_least_one_request() {
        let default = ServerConfig::default();
        assert_eq!(default.in_flight_bytes_per_connection(), 64 << 20);
        let small = ServerConfig {
            max_in_flight_bytes: 40 << 20,
            ..ServerConfig::default()
        };
        assert_eq!(small.in_flight_bytes_per_connection(), 32 << 20);
        let explicit = ServerConfig {
            max_in_flight_bytes_per_connection: Some(48 << 20),
            ..ServerConfig::default()
        };
        assert_eq!(explicit.in_flight_bytes_per_connection(), 48 << 20);
        let above_the_budget = ServerConfig {
            max_in_flight_bytes_per_connection: Some(1 << 40),
            ..ServerConfig::default()
        };
        assert_eq!(above_the_budget.in_flight_bytes_per_connection(), 256 << 20);
        assert!(above_the_budget.validate().is_ok());
    }

    #[test]
    fn rejects_a_connection_share_below_the_request_size() {
        let config = ServerConfig {
            max_in_flight_bytes_per_connection: Some((32 << 20) - 1),
            ..ServerConfig::default()
        };
        let error = config.validate().unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::InvalidInput);
        let message = error.to_string();
        assert!(
            message.contains("max_in_flight_bytes_per_connection")
                && message.contains("max_request_bytes"),
            "{message}"
        );
        let equal = ServerConfig {
            max_in_flight_bytes_per_connection: Some(32 << 20),
            ..ServerConfig::default()
        };
        assert!(equal.validate().is_ok());
    }

    #[test]
    fn rejects_a_zero_stall_timeout() {
        let config = ServerConfig {
            reply_stall_timeout_ms: 0,
            ..ServerConfig::default()
        };
        let error = config.validate().unwrap_err();
        assert!(
            error.to_string().contains("reply_stall_timeout_ms"),
            "{error}"
        );
    }
}
