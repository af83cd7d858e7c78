//! Object storage for strata.
//!
//! This crate owns two things: opening a store from what the user typed
//! (`--store PATH_OR_URL`), and the names of every object strata writes
//! (`<volume>/manifest`, `<volume>/segments/<seq:016x>`, ...). The engine
//! talks to the store only through [`Store`], so wrappers (retries, metrics,
//! fault injection) can be stacked on the inner `ObjectStore` later without
//! the engine noticing.
//!
//! Those wrappers live here too, one module per decorator of an
//! `ObjectStore`: retries of transient failures, request metrics, a bound on
//! requests in flight, fault injection for tests, and [`layer`], which
//! stacks them in the standard order. Time and randomness they use sit
//! behind [`Sleeper`] and [`Entropy`] so tests can control them.
//!
//! Errors for people: a store's raw errors explained with what to do
//! ([`StoreFailure`], which also decides retrying), and one line per error
//! chain, each cause once ([`error_text`]).
//!
//! And whether a store enforces the conditional writes strata relies on:
//! the probe ([`probe_conditional_writes`]) and its verdict remembered in
//! the store ([`remembered_or_probed`]).

mod conditional_write_probe;
mod counting_http_connector;
mod credential_source;
mod durable_local_store;
mod env;
mod error_text;
mod explaining_object_store;
mod fault_config;
mod fault_injecting_object_store;
mod instance_metadata;
mod instrumented_object_store;
mod layered_object_store;
mod limited_object_store;
mod local_reader;
mod names;
mod recycled_files;
mod retry_policy;
mod retrying_object_store;
mod s3_config;
mod staged_files;
mod store;
mod store_check;
mod store_failure;
mod store_metrics;
#[cfg(test)]
mod test_support;

pub use conditional_write_probe::{
    probe_conditional_writes, Condition, ConditionCheck, ProbeError, ProbeReport, Verdict,
    PROBE_PREFIX,
};
pub use counting_http_connector::{HttpVersionCounts, HttpVersionSnapshot};
pub use credential_source::{CredentialSource, Credentials};
pub use error_text::{error_text, ErrorText};
pub use explaining_object_store::{ExplainingObjectStore, StorePlace};
pub use instance_metadata::InstanceMetadata;
pub use recycled_files::{RecycleSnapshot, DEFAULT_RECYCLE_BYTES, MIN_RECYCLE_BYTES, RECYCLE_DIR};
pub use s3_config::{HttpMode, S3Config};
pub use staged_files::{
    parse_staged_name, remove_staged_path, write_back, StagedFile, TAG_MAX, TAG_MIN,
};
pub use store_failure::{FailureKind, StoreFailure};

pub use local_reader::LocalFile;
pub use names::{validate_name, validate_volume_name, ObjectNames, MAX_VOLUME_NAME_BYTES};
pub use object_store;
pub use store::{Store, StoreError, StoreStats};
pub use store_check::{
    probe_and_record, read_record, remembered_or_probed, StoreCheckRecord, VerdictSource,
    MAX_RECORD_BYTES, PROBE_FORMAT, STORE_CHECK_OBJECT,
};

pub use env::{unit_interval, up_to_inclusive, Entropy, Sleeper, SplitMixEntropy, TokioSleeper};
pub use fault_config::{FaultConfig, FaultConfigError, FAULT_KEYS};
pub use fault_injecting_object_store::{
    FaultInjectingObjectStore, FaultStats, FaultStatsSnapshot, FAULT_INJECTION_STORE,
};
pub use instrumented_object_store::InstrumentedObjectStore;
pub use layered_object_store::{
    layer, LayerConfig, Layered, LayeredSnapshot, DEFAULT_MAX_IN_FLIGHT_REQUESTS,
};
pub use limited_object_store::{LimitStats, LimitStatsSnapshot, LimitedObjectStore};
pub use retry_policy::RetryPolicy;
pub use retrying_object_store::{
    is_transient, RetriesExhausted, RetryStats, RetryStatsSnapshot, RetryingObjectStore,
    RETRY_LOG_TARGET,
};
pub use store_metrics::{
    OpMetricsSnapshot, StoreMetrics, StoreMetricsSnapshot, StoreOp, LATENCY_BUCKETS,
};
