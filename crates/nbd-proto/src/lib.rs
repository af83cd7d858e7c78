//! NBD wire protocol.
