//! Object storage for strata.
//!
//! This crate owns two things: opening a store from what the user typed
//! (`--store PATH_OR_URL`), and the names of every object strata writes
//! (`<volume>/manifest`, `<volume>/segments/<seq:016x>`, ...). The engine
//! talks to the store only through [`Store`], so wrappers (retries, metrics,
//! fault injection) can be stacked on the inner `ObjectStore` later without
//! the engine noticing.

mod counting_http_connector;
mod local_reader;
mod names;
mod s3_config;
mod store;

pub use counting_http_connector::{HttpVersionCounts, HttpVersionSnapshot};
pub use s3_config::{Credentials, S3Config};

pub use names::{validate_volume_name, ObjectNames, MAX_VOLUME_NAME_BYTES};
pub use object_store;
pub use store::{Store, StoreError};
