//! Object storage.
