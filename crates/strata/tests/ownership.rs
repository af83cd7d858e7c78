//! placeholder (being written)
#![allow(clippy::unwrap_used, clippy::expect_used)]
mod common;
