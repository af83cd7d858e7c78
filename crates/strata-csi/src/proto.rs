//! The CSI types and gRPC services, generated at build time from
//! `proto/csi.proto` (`build.rs`): messages, `*_server` traits the
//! driver implements, `*_client` stubs the tests call.

#![allow(
    clippy::all,
    clippy::pedantic,
    clippy::unwrap_used,
    clippy::expect_used
)]

tonic::include_proto!("csi.v1");
