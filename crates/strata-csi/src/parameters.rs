//! A StorageClass's parameters (CreateVolume's `parameters`): checked
//! whole before anything is created, each error naming the key and what
//! it accepts.

use std::collections::HashMap;

use strata_volume::{Compression, QosLimits};

use crate::driver_config::QosParser;

/// Keys the sidecars add (`--extra-create-metadata`: the PVC's name and
/// namespace, the PV's name) and secrets' references: not the driver's.
const SIDECAR_PREFIX: &str = "csi.storage.k8s.io/";

/// The keys this driver reads, for errors.
const KNOWN: &str = "compression (none, lz4, zstd[:LEVEL]), encrypted (true, false), keyFingerprint (the driver key's, from `strata key fingerprint`), qos (e.g. iops=3000,bw=125MiB, or none)";

/// What a StorageClass asks of the volumes it makes.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct VolumeParameters {
    /// `None`: the driver's default.
    pub compression: Option<Compression>,
    /// `Some(true)`: the volume must be encrypted; `Some(false)`: must not.
    pub encrypted: Option<bool>,
    /// The fingerprint the driver's key must have.
    pub key_fingerprint: Option<String>,
    pub qos: QosLimits,
}

impl VolumeParameters {
    /// Parses `params`; an error is the INVALID_ARGUMENT message.
    pub fn parse(
        params: &HashMap<String, String>,
        parse_qos: QosParser,
    ) -> Result<VolumeParameters, String> {
        let mut out = VolumeParameters::default();
        let mut keys: Vec<&String> = params.keys().collect();
        keys.sort();
        for key in keys {
            let value = params[key].trim();
            match key.as_str() {
                "compression" => {
                    let c = value
                        .parse::<Compression>()
                        .map_err(|e| format!("parameter compression={value:?}: {e}"))?;
                    out.compression = Some(c);
                }
                "encrypted" => {
                    out.encrypted = Some(match value {
                        "true" => true,
                        "false" => false,
                        _ => {
                            return Err(format!(
                                "parameter encrypted={value:?}: expected true or false"
                            ))
                        }
                    });
                }
                "keyFingerprint" => {
                    if value.is_empty() {
                        return Err("parameter keyFingerprint is empty: give the fingerprint `strata key fingerprint` prints, or leave it out".to_string());
                    }
                    out.key_fingerprint = Some(value.to_string());
                }
                "qos" => {
                    out.qos =
                        parse_qos(value).map_err(|e| format!("parameter qos={value:?}: {e}"))?;
                }
                k if k.starts_with(SIDECAR_PREFIX) => {}
                k => {
                    return Err(format!(
                        "unknown parameter {k:?}: the StorageClass may set {KNOWN}"
                    ))
                }
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn qos(spec: &str) -> Result<QosLimits, String> {
        match spec {
            "none" => Ok(QosLimits::default()),
            "iops=100" => Ok(QosLimits {
                iops: Some(strata_volume::Limit::per_second(100)),
                ..QosLimits::default()
            }),
            _ => Err("bad spec".to_string()),
        }
    }

    fn params(kv: &[(&str, &str)]) -> HashMap<String, String> {
        kv.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn every_known_key_parses_and_the_sidecars_keys_are_ignored() {
        let p = VolumeParameters::parse(
            &params(&[
                ("compression", "zstd:3"),
                ("encrypted", "true"),
                ("keyFingerprint", "ab12"),
                ("qos", "iops=100"),
                ("csi.storage.k8s.io/pvc/name", "data"),
            ]),
            qos,
        )
        .unwrap();
        assert_eq!(p.compression, Some("zstd:3".parse().unwrap()));
        assert_eq!(p.encrypted, Some(true));
        assert_eq!(p.key_fingerprint.as_deref(), Some("ab12"));
        assert!(!p.qos.is_unlimited());
        assert_eq!(
            VolumeParameters::parse(&HashMap::new(), qos).unwrap(),
            VolumeParameters::default()
        );
    }

    #[test]
    fn a_bad_or_unknown_key_is_named_with_what_is_accepted() {
        let e = VolumeParameters::parse(&params(&[("replicas", "3")]), qos).unwrap_err();
        assert!(
            e.contains("\"replicas\"") && e.contains("compression ("),
            "{e}"
        );
        let e = VolumeParameters::parse(&params(&[("encrypted", "yes")]), qos).unwrap_err();
        assert!(e.contains("true or false"), "{e}");
        let e = VolumeParameters::parse(&params(&[("qos", "fast")]), qos).unwrap_err();
        assert!(e.contains("qos=\"fast\""), "{e}");
        let e = VolumeParameters::parse(&params(&[("compression", "gzip")]), qos).unwrap_err();
        assert!(e.contains("compression=\"gzip\""), "{e}");
    }
}
