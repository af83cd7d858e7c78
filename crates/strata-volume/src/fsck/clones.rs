//! The clone markers under a volume (`<volume>/clones/<snapshot>/<clone>`):
//! each read and checked, and which live clones read each snapshot. A
//! damaged marker is an error (deleting its snapshot fails on it); one
//! whose clone does not exist is a warning (left by a clone that failed or
//! was deleted; removed when the snapshot is).

use std::collections::BTreeMap;

use super::findings::{Findings, Reach, ReadFailure};
use super::report::{Checked, ProblemKind, Severity};
use super::scope::Scope;
use crate::error::VolumeError;
use crate::objects::read_clone_markers;

/// Live clones by the snapshot they were made from.
pub(crate) async fn check_markers(
    scope: &Scope,
    findings: &mut Findings,
    checked: &mut Checked,
) -> Result<BTreeMap<String, Vec<String>>, VolumeError> {
    let prefix = match &scope.snapshot {
        Some(s) => scope.names.snapshot_clones_prefix(&s.name),
        None => scope.names.clone_markers_prefix(),
    };
    let mut live: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (path, read) in read_clone_markers(&scope.store, &prefix).await? {
        checked.clone_markers += 1;
        let parts: Vec<String> = path.parts().map(|p| p.as_ref().to_string()).collect();
        let snapshot = parts.len().checked_sub(2).map_or("", |i| parts[i].as_str());
        let object = path.to_string();
        match read.map_err(ReadFailure::of) {
            Ok(found) if found.live => {
                let clones = live.entry(snapshot.to_string()).or_default();
                clones.push(found.marker.clone);
            }
            Ok(found) => {
                let detail = format!("clone marker of {:?}, which does not exist (left by a clone that failed or was deleted; removed when snapshot {snapshot} is deleted)", found.marker.clone);
                let kind = ProblemKind::CloneMarker;
                findings.add(Severity::Warning, kind, object, detail, Reach::Nothing);
            }
            Err(ReadFailure::Damaged(detail)) => {
                let detail =
                    format!("{detail} (deleting snapshot {snapshot} fails until it is repaired)");
                let kind = ProblemKind::CloneMarker;
                findings.add(Severity::Error, kind, object, detail, Reach::Nothing);
            }
            Err(ReadFailure::Gone) => {}
            Err(ReadFailure::Failed(e)) => return Err(e),
        }
    }
    Ok(live)
}
