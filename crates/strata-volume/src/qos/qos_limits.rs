//! A volume's QoS limits as its manifest keeps them, and their rules.
//!
//! Six limits, each optional: IOPS and bytes per second of reads, of
//! writes, and of both together (`iops`, `read-iops`, `write-iops`, `bw`,
//! `read-bw`, `write-bw`). Each has a rate and a burst: the bucket holds
//! `burst` tokens and refills at `rate` a second (EBS and librbd's
//! `_burst`), so a volume idle for a while may do `burst` requests (or
//! bytes) at once. The burst is at least the rate (one second's worth,
//! the default). A request counts once against each limit that applies:
//! a read against `read-*` and the total ones. TRIM and WRITE_ZEROES are
//! writes moving no bytes.

use serde::{Deserialize, Serialize};

/// The keys of a QoS spec, in the order they are shown.
pub const QOS_KEYS: [&str; 6] = [
    "iops",
    "read-iops",
    "write-iops",
    "bw",
    "read-bw",
    "write-bw",
];

/// One limit: tokens a second, and the bucket's size.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Limit {
    pub rate: u64,
    pub burst: u64,
}

impl Limit {
    /// A limit of `rate` whose burst is one second's worth.
    pub fn per_second(rate: u64) -> Limit {
        Limit { rate, burst: rate }
    }
}

/// A volume's limits; all `None` is no limit.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct QosLimits {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub iops: Option<Limit>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_iops: Option<Limit>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub write_iops: Option<Limit>,
    /// Bytes per second.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bw: Option<Limit>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_bw: Option<Limit>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub write_bw: Option<Limit>,
}

impl QosLimits {
    /// Whether no limit is set.
    pub fn is_unlimited(&self) -> bool {
        self.limits().iter().all(|(_, l)| l.is_none())
    }

    /// Each key with its limit, in `QOS_KEYS` order.
    pub fn limits(&self) -> [(&'static str, Option<Limit>); 6] {
        [
            ("iops", self.iops),
            ("read-iops", self.read_iops),
            ("write-iops", self.write_iops),
            ("bw", self.bw),
            ("read-bw", self.read_bw),
            ("write-bw", self.write_bw),
        ]
    }

    /// The limit of `key` (one of `QOS_KEYS`), to set.
    pub fn slot(&mut self, key: &str) -> Option<&mut Option<Limit>> {
        Some(match key {
            "iops" => &mut self.iops,
            "read-iops" => &mut self.read_iops,
            "write-iops" => &mut self.write_iops,
            "bw" => &mut self.bw,
            "read-bw" => &mut self.read_bw,
            "write-bw" => &mut self.write_bw,
            _ => return None,
        })
    }

    /// Checks the rules (a manifest is read from the store: untrusted):
    /// no zero rate (that would stop the volume: leave the key out for no
    /// limit), no burst below its rate.
    pub fn validate(&self) -> Result<(), String> {
        for (key, limit) in self.limits() {
            let Some(l) = limit else { continue };
            if l.rate == 0 {
                return Err(format!(
                    "{key}=0 would stop the volume; leave {key} out for no limit"
                ));
            }
            if l.burst < l.rate {
                return Err(format!(
                    "{key}-burst {} is below {key} {}: a burst is at least one second's worth",
                    l.burst, l.rate
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_refuse_zero_rates_and_bursts_below_the_rate() {
        let mut q = QosLimits::default();
        assert!(q.is_unlimited() && q.validate().is_ok());
        q.iops = Some(Limit::per_second(2000));
        assert!(!q.is_unlimited() && q.validate().is_ok());
        q.write_bw = Some(Limit { rate: 10, burst: 9 });
        let e = q.validate().unwrap_err();
        assert!(e.contains("write-bw-burst 9 is below write-bw 10"), "{e}");
        q.write_bw = Some(Limit { rate: 0, burst: 0 });
        assert!(q.validate().unwrap_err().contains("write-bw=0"));
        // A manifest without the field, or with it, reads back the same.
        let json = serde_json::to_string(&QosLimits::default()).unwrap();
        assert_eq!(json, "{}");
        let q = QosLimits {
            read_iops: Some(Limit { rate: 5, burst: 50 }),
            ..QosLimits::default()
        };
        let back: QosLimits = serde_json::from_str(&serde_json::to_string(&q).unwrap()).unwrap();
        assert_eq!(back, q);
    }
}
