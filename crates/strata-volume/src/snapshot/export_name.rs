//! The export name of a snapshot: `VOL@SNAP` (a volume is exported under
//! its own name). Neither name may contain `@`, so the split is unique.

use strata_store::validate_volume_name;

use crate::format::manifest::validate_snapshot_name;

/// What an export name or a `VOL@SNAP` argument names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExportName<'a> {
    Volume(&'a str),
    Snapshot { volume: &'a str, snapshot: &'a str },
}

/// Splits `VOL` or `VOL@SNAP`, checking both names.
pub fn split_export_name(name: &str) -> Result<ExportName<'_>, String> {
    match name.split_once('@') {
        None => {
            validate_volume_name(name)?;
            Ok(ExportName::Volume(name))
        }
        Some((volume, snapshot)) => {
            validate_volume_name(volume)?;
            validate_snapshot_name(snapshot)?;
            Ok(ExportName::Snapshot { volume, snapshot })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_and_checks_both_names() {
        assert_eq!(split_export_name("vm1"), Ok(ExportName::Volume("vm1")));
        assert_eq!(
            split_export_name("vm1@before-upgrade"),
            Ok(ExportName::Snapshot {
                volume: "vm1",
                snapshot: "before-upgrade"
            })
        );
        for bad in ["vm1@", "@s", "vm1@a@b", "vm/1@s", "vm1@.s", ""] {
            assert!(split_export_name(bad).is_err(), "{bad:?}");
        }
    }
}
