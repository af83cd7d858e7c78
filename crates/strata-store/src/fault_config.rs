//! What faults to inject, and the syntax to ask for them.
//!
//! This module owns [`FaultConfig`], the configuration of the fault
//! injecting store (failure and lost-reply rates, added latency and jitter,
//! a call to fail, a seed, conditional writes to ignore, a partition
//! switched by a file), its `key=value,...` syntax as read from the
//! `STRATA_FAULTS` variable ([`FaultConfig::parse`], [`FAULT_KEYS`]) and the
//! errors that syntax can produce ([`FaultConfigError`]). How a
//! configuration is applied to calls is the business of
//! `FaultInjectingObjectStore`.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

/// What to inject. The default injects nothing.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FaultConfig {
    /// Probability in `[0, 1]` that a call fails before reaching the store.
    pub error_rate: f64,
    /// Latency added to every call.
    pub added_latency_ms: u64,
    /// Up to this much more latency, uniformly drawn per call.
    pub latency_jitter_ms: u64,
    /// Probability in `[0, 1]` that a call is slow: `slow_ms` more latency
    /// (a store's latency tail, which hedged reads answer).
    pub slow_rate: f64,
    pub slow_ms: u64,
    /// Fail exactly this call (1-based, counting every call).
    pub fail_nth: Option<u64>,
    /// Probability in `[0, 1]` that a mutating call that succeeded on the
    /// store is reported as failed.
    pub lost_reply_rate: f64,
    /// Seed for the fault and jitter draws (reproducible runs); from the
    /// clock when absent.
    pub seed: Option<u64>,
    /// Turn create-only PUTs (`PutMode::Create`, If-None-Match: *) into
    /// plain overwrites, as a store that ignores the header does.
    pub ignore_if_none_match: bool,
    /// Turn PUTs conditional on a version (`PutMode::Update`, If-Match)
    /// into plain overwrites, as a store that ignores the header does.
    pub ignore_if_match: bool,
    /// While this file exists, every call fails before reaching the store,
    /// as if the network to it were cut: a test partitions one server from
    /// the store (and not another) by creating the file, and heals it by
    /// removing it. Checked at each call (one `stat`).
    pub partition_file: Option<PathBuf>,
}

/// Why a fault string was refused. Every message names the offending key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FaultConfigError {
    #[error("fault config: unknown key {key:?} (known keys: {})", FAULT_KEYS.join(", "))]
    UnknownKey { key: String },
    #[error("fault config: bad value {value:?} for {key}: {reason}")]
    BadValue {
        key: String,
        value: String,
        reason: String,
    },
    #[error("fault config: entry {entry:?} is not of the form key=value")]
    NotKeyValue { entry: String },
    #[error("fault config: key {key} given twice")]
    DuplicateKey { key: String },
}

/// The keys [`FaultConfig::parse`] accepts.
pub const FAULT_KEYS: [&str; 12] = [
    "error_rate",
    "latency_ms",
    "jitter_ms",
    "slow_rate",
    "slow_ms",
    "fail_nth",
    "lost_reply_rate",
    "seed",
    "ignore_if_none_match",
    "ignore_if_match",
    "ignore_conditions",
    "partition_file",
];

impl FaultConfig {
    /// Parses `key=value` pairs separated by commas, e.g.
    /// `error_rate=0.05,latency_ms=20,jitter_ms=10,fail_nth=7,lost_reply_rate=0.01,seed=42`.
    /// `slow_rate=0.05,slow_ms=2000` makes one call in 20 two seconds
    /// slower. `ignore_if_none_match=1`, `ignore_if_match=1` and
    /// `ignore_conditions=1` (both) simulate a store that ignores
    /// conditional writes.
    /// Keys left out keep their default (no fault); an empty string is the
    /// default configuration.
    pub fn parse(text: &str) -> Result<FaultConfig, FaultConfigError> {
        let mut config = FaultConfig::default();
        let mut seen: Vec<&str> = Vec::new();
        for entry in text.split(',').map(str::trim).filter(|e| !e.is_empty()) {
            let Some((key, value)) = entry.split_once('=') else {
                return Err(FaultConfigError::NotKeyValue {
                    entry: entry.to_string(),
                });
            };
            let (key, value) = (key.trim(), value.trim());
            if seen.contains(&key) {
                return Err(FaultConfigError::DuplicateKey {
                    key: key.to_string(),
                });
            }
            config.set(key, value)?;
            seen.push(key);
        }
        Ok(config)
    }

    fn set(&mut self, key: &str, value: &str) -> Result<(), FaultConfigError> {
        match key {
            "error_rate" => self.error_rate = parse_probability(key, value)?,
            "latency_ms" => self.added_latency_ms = parse_u64(key, value)?,
            "jitter_ms" => self.latency_jitter_ms = parse_u64(key, value)?,
            "slow_rate" => self.slow_rate = parse_probability(key, value)?,
            "slow_ms" => self.slow_ms = parse_u64(key, value)?,
            "fail_nth" => self.fail_nth = Some(parse_call_number(key, value)?),
            "lost_reply_rate" => self.lost_reply_rate = parse_probability(key, value)?,
            "seed" => self.seed = Some(parse_u64(key, value)?),
            "ignore_if_none_match" => self.ignore_if_none_match = parse_bool(key, value)?,
            "ignore_if_match" => self.ignore_if_match = parse_bool(key, value)?,
            "partition_file" => {
                if value.is_empty() || value.contains(',') {
                    return Err(bad_value(key, value, "expected a file path without commas"));
                }
                self.partition_file = Some(PathBuf::from(value));
            }
            "ignore_conditions" => {
                let ignore = parse_bool(key, value)?;
                self.ignore_if_none_match |= ignore;
                self.ignore_if_match |= ignore;
            }
            _ => {
                return Err(FaultConfigError::UnknownKey {
                    key: key.to_string(),
                })
            }
        }
        Ok(())
    }
}

impl FromStr for FaultConfig {
    type Err = FaultConfigError;

    fn from_str(text: &str) -> Result<FaultConfig, FaultConfigError> {
        FaultConfig::parse(text)
    }
}

/// The syntax [`FaultConfig::parse`] reads, for logs.
impl fmt::Display for FaultConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "error_rate={},latency_ms={},jitter_ms={},lost_reply_rate={}",
            self.error_rate, self.added_latency_ms, self.latency_jitter_ms, self.lost_reply_rate
        )?;
        if self.slow_rate > 0.0 {
            write!(f, ",slow_rate={},slow_ms={}", self.slow_rate, self.slow_ms)?;
        }
        if let Some(n) = self.fail_nth {
            write!(f, ",fail_nth={n}")?;
        }
        if let Some(seed) = self.seed {
            write!(f, ",seed={seed}")?;
        }
        if self.ignore_if_none_match {
            f.write_str(",ignore_if_none_match=1")?;
        }
        if self.ignore_if_match {
            f.write_str(",ignore_if_match=1")?;
        }
        if let Some(path) = &self.partition_file {
            write!(f, ",partition_file={}", path.display())?;
        }
        Ok(())
    }
}

fn bad_value(key: &str, value: &str, reason: impl Into<String>) -> FaultConfigError {
    FaultConfigError::BadValue {
        key: key.to_string(),
        value: value.to_string(),
        reason: reason.into(),
    }
}

fn parse_u64(key: &str, value: &str) -> Result<u64, FaultConfigError> {
    value
        .parse::<u64>()
        .map_err(|e| bad_value(key, value, format!("expected a whole number: {e}")))
}

fn parse_bool(key: &str, value: &str) -> Result<bool, FaultConfigError> {
    match value {
        "1" | "true" => Ok(true),
        "0" | "false" => Ok(false),
        _ => Err(bad_value(key, value, "expected 1, 0, true or false")),
    }
}

fn parse_call_number(key: &str, value: &str) -> Result<u64, FaultConfigError> {
    match parse_u64(key, value)? {
        0 => Err(bad_value(key, value, "calls are numbered from 1")),
        n => Ok(n),
    }
}

fn parse_probability(key: &str, value: &str) -> Result<f64, FaultConfigError> {
    let p = value
        .parse::<f64>()
        .map_err(|e| bad_value(key, value, format!("expected a number: {e}")))?;
    if !(0.0..=1.0).contains(&p) {
        return Err(bad_value(key, value, "must be between 0 and 1"));
    }
    Ok(p)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_accepts_the_documented_example() {
        let text = "error_rate=0.05,latency_ms=20,jitter_ms=10,fail_nth=7,lost_reply_rate=0.01";
        let config = FaultConfig::parse(text).unwrap();
        let expected = FaultConfig {
            error_rate: 0.05,
            added_latency_ms: 20,
            latency_jitter_ms: 10,
            fail_nth: Some(7),
            lost_reply_rate: 0.01,
            seed: None,
            ..FaultConfig::default()
        };
        assert_eq!(config, expected);
        assert_eq!(FaultConfig::parse(&config.to_string()).unwrap(), config);
        assert_eq!(FaultConfig::parse("").unwrap(), FaultConfig::default());
        let spaced: FaultConfig = " seed = 3 , error_rate=1 ,".parse().unwrap();
        assert_eq!((spaced.seed, spaced.error_rate), (Some(3), 1.0));
    }

    #[test]
    fn ignoring_conditions_parses_and_round_trips() {
        let one = FaultConfig::parse("ignore_if_none_match=1").unwrap();
        assert!(one.ignore_if_none_match && !one.ignore_if_match);
        let other = FaultConfig::parse("ignore_if_match=true").unwrap();
        assert!(!other.ignore_if_none_match && other.ignore_if_match);
        let both = FaultConfig::parse("ignore_conditions=1").unwrap();
        assert!(both.ignore_if_none_match && both.ignore_if_match);
        assert_eq!(FaultConfig::parse(&both.to_string()).unwrap(), both);
        assert_eq!(
            FaultConfig::parse("ignore_conditions=0").unwrap(),
            FaultConfig::default()
        );
    }

    #[test]
    fn a_partition_file_parses_and_round_trips() {
        let config = FaultConfig::parse("partition_file=/tmp/x/cut,seed=1").unwrap();
        assert_eq!(config.partition_file, Some(PathBuf::from("/tmp/x/cut")));
        assert_eq!(FaultConfig::parse(&config.to_string()).unwrap(), config);
        assert!(FaultConfig::parse("partition_file=").is_err());
    }

    #[test]
    fn parse_rejects_bad_input_naming_the_key() {
        let cases = [
            ("error_rate=2", "error_rate"),
            ("foo=1", "foo"),
            ("latency_ms=x", "latency_ms"),
            ("lost_reply_rate=-0.1", "lost_reply_rate"),
            ("fail_nth=0", "fail_nth"),
            ("jitter_ms=1.5", "jitter_ms"),
            ("error_rate", "error_rate"),
            ("seed=1,seed=2", "seed"),
            ("ignore_if_match=yes", "ignore_if_match"),
        ];
        for (text, key) in cases {
            let error = FaultConfig::parse(text).unwrap_err().to_string();
            assert!(error.contains(key), "{text:?} gave {error:?}");
        }
        let error = FaultConfig::parse("error_rate=2").unwrap_err();
        assert!(
            matches!(error, FaultConfigError::BadValue { .. }),
            "{error}"
        );
        let error = FaultConfig::parse("foo=1").unwrap_err();
        assert!(
            matches!(error, FaultConfigError::UnknownKey { .. }),
            "{error}"
        );
    }
}
