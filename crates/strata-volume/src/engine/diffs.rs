//! Diffs between two snapshots of a volume, by name: the changed ranges
//! (`snapshot/diff.rs`), written to a diff file (`format/diff_file.rs`),
//! and a diff file applied to another volume that has the older snapshot,
//! ending with the newer snapshot taken there.
//!
//! An import verifies the whole file (every checksum, order, bounds, the
//! end record) before it writes anything, so a damaged file changes
//! nothing.

use std::io::{Read, Write};
use std::path::Path;

use serde::Serialize;
use strata_store::ObjectNames;

use super::Engine;
use crate::error::VolumeError;
use crate::format::diff_file::{
    encode_record, DiffHeader, RecordHeader, RecordKind, HEADER_PREFIX_BYTES,
    MAX_DATA_RECORD_BYTES, RECORD_HEADER_BYTES,
};
use crate::format::key_wrap::Key;
use crate::format::manifest::{validate_snapshot_name, Manifest, SnapshotRecord};
use crate::format::snapshot_delta::DeltaPiece;
use crate::map::ExtentMap;
use crate::objects::{read_manifest, read_snapshot_delta, read_snapshot_map};
use crate::snapshot::{changes_of, data_map, diff_maps, overlay, Change, ChangeKind};

/// What an export or an import carried.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct DiffSummary {
    pub records: u64,
    pub data_bytes: u64,
    pub zero_bytes: u64,
}

fn snapshot_of(m: &Manifest, name: &str) -> Result<SnapshotRecord, VolumeError> {
    m.snapshot(name)
        .cloned()
        .ok_or_else(|| VolumeError::SnapshotNotFound {
            volume: m.name.clone(),
            snapshot: name.to_string(),
        })
}

fn io_error(what: &str) -> impl FnOnce(std::io::Error) -> VolumeError + '_ {
    move |source| VolumeError::Io {
        what: what.to_string(),
        source,
    }
}

/// What a diff found: the changes, and the newer snapshot's data where it
/// changed (the whole map when the diff compared whole maps).
struct Found {
    manifest: Manifest,
    to: SnapshotRecord,
    changes: Vec<Change>,
    data: ExtentMap,
}

impl Engine {
    /// The ranges that changed from snapshot `from` to snapshot `to` of
    /// `volume` (`from` the older). Reads the deltas of the snapshots
    /// after `from` up to `to` (what changed, nothing else), or compares
    /// the two snapshots' whole maps where that chain is cut.
    pub async fn diff_snapshots(
        &self,
        volume: &str,
        from: &str,
        to: &str,
    ) -> Result<Vec<Change>, VolumeError> {
        Ok(self.find_changes(volume, from, to, true).await?.changes)
    }

    /// As `diff_snapshots`, always comparing the whole maps (what the
    /// deltas are checked against in tests).
    #[doc(hidden)]
    pub async fn diff_snapshots_whole(
        &self,
        volume: &str,
        from: &str,
        to: &str,
    ) -> Result<Vec<Change>, VolumeError> {
        Ok(self.find_changes(volume, from, to, false).await?.changes)
    }

    async fn find_changes(
        &self,
        volume: &str,
        from: &str,
        to: &str,
        use_deltas: bool,
    ) -> Result<Found, VolumeError> {
        validate_snapshot_name(from).map_err(VolumeError::Invalid)?;
        validate_snapshot_name(to).map_err(VolumeError::Invalid)?;
        let m = read_manifest(&self.store, volume).await?;
        let (a, b) = (snapshot_of(&m, from)?, snapshot_of(&m, to)?);
        if a.checkpoint_seq > b.checkpoint_seq {
            return Err(VolumeError::Invalid(format!(
                "snapshot {volume}@{from} is newer than {volume}@{to}: give the older one first"
            )));
        }
        let uuid = m.uuid_bytes().map_err(VolumeError::Invalid)?;
        let names = ObjectNames::new(volume);
        let key = self.data_key(&m)?;
        let key = key.as_ref();
        if use_deltas {
            if let Some(pieces) = self.chained_deltas(&m, &names, uuid, &a, &b, key).await {
                return Ok(Found {
                    changes: changes_of(&pieces, b.size_bytes),
                    data: data_map(&pieces),
                    manifest: m,
                    to: b,
                });
            }
        }
        let older = read_snapshot_map(&self.store, &names, volume, uuid, &a, key).await?;
        let newer = read_snapshot_map(&self.store, &names, volume, uuid, &b, key).await?;
        Ok(Found {
            changes: diff_maps(&older, &newer, b.size_bytes),
            data: newer,
            manifest: m,
            to: b,
        })
    }

    /// The deltas from snapshot `a` to `b` overlaid, if each snapshot
    /// after `a` up to `b` has one leading from the one before; `None`
    /// (logged if a delta is unreadable) to compare whole maps instead.
    async fn chained_deltas(
        &self,
        m: &Manifest,
        names: &ObjectNames,
        uuid: [u8; 16],
        a: &SnapshotRecord,
        b: &SnapshotRecord,
        key: Option<&Key>,
    ) -> Option<Vec<DeltaPiece>> {
        let start = m.snapshots.iter().position(|s| s.name == a.name)?;
        let end = m.snapshots.iter().position(|s| s.name == b.name)?;
        let mut pieces: Vec<DeltaPiece> = Vec::new();
        for pair in m.snapshots.get(start..=end)?.windows(2) {
            let (prev, next) = (&pair[0], &pair[1]);
            let delta = next.delta_from(prev.checkpoint_seq)?;
            match read_snapshot_delta(&self.store, names, uuid, next, delta, key).await {
                Ok(newer) => pieces = overlay(&pieces, &newer),
                Err(e) => {
                    tracing::warn!(volume = %m.name, snapshot = %next.name, error = %strata_store::ErrorText(&e), "snapshot delta unreadable; comparing whole snapshots instead");
                    return None;
                }
            }
        }
        Some(pieces)
    }

    /// Writes the diff from `from` to `to` to `out`; `progress(done, total)`
    /// in bytes of changed ranges.
    pub async fn export_diff(
        &self,
        volume: &str,
        from: &str,
        to: &str,
        out: &mut (dyn Write + Send),
        progress: &(dyn Fn(u64, u64) + Sync),
    ) -> Result<DiffSummary, VolumeError> {
        let found = self.find_changes(volume, from, to, true).await?;
        let (m, changes) = (&found.manifest, &found.changes);
        let view = self.snapshot_view(m, found.to.clone(), found.data).await?;
        let header = DiffHeader {
            volume_size_bytes: view.size_bytes(),
            volume_uuid: m.uuid_bytes().map_err(VolumeError::Invalid)?,
            from_snapshot: from.to_string(),
            to_snapshot: to.to_string(),
        };
        let write_err = io_error("write the diff file");
        out.write_all(&header.encode()).map_err(write_err)?;
        let total: u64 = changes.iter().map(|c| c.length).sum();
        let mut sum = DiffSummary::default();
        let mut done = 0u64;
        let mut buf = vec![0u8; MAX_DATA_RECORD_BYTES as usize];
        for c in changes {
            if c.kind == ChangeKind::Zero {
                let raw = encode_record(RecordKind::Zero, c.offset, c.length, &[]);
                out.write_all(&raw)
                    .map_err(io_error("write the diff file"))?;
                sum.records += 1;
                sum.zero_bytes += c.length;
                done += c.length;
                progress(done, total);
                continue;
            }
            let mut pos = c.offset;
            while pos < c.offset + c.length {
                let n = (c.offset + c.length - pos).min(MAX_DATA_RECORD_BYTES);
                let data = &mut buf[..n as usize];
                view.read(pos, data).await?;
                let raw = encode_record(RecordKind::Data, pos, n, data);
                out.write_all(&raw)
                    .map_err(io_error("write the diff file"))?;
                out.write_all(data)
                    .map_err(io_error("write the diff file"))?;
                sum.records += 1;
                sum.data_bytes += n;
                pos += n;
                done += n;
                progress(done, total);
            }
        }
        let end = encode_record(RecordKind::End, sum.records, sum.data_bytes, &[]);
        out.write_all(&end)
            .map_err(io_error("write the diff file"))?;
        out.flush().map_err(io_error("write the diff file"))?;
        Ok(sum)
    }

    /// Applies the diff file at `path` to `volume`, which must have the
    /// diff's older snapshot and not its newer one; then takes the newer
    /// snapshot there. Refused while another server holds the volume.
    pub async fn import_diff(&self, path: &Path, volume: &str) -> Result<DiffSummary, VolumeError> {
        let (header, sum) = verify_diff_file(path)?;
        let m = read_manifest(&self.store, volume).await?;
        snapshot_of(&m, &header.from_snapshot).map_err(|e| {
            VolumeError::Invalid(format!(
                "{e}: the diff goes from snapshot {:?}, which the target must have",
                header.from_snapshot
            ))
        })?;
        if m.snapshot(&header.to_snapshot).is_some() {
            return Err(VolumeError::Invalid(format!(
                "volume {volume:?} already has snapshot {:?}, the one this diff leads to",
                header.to_snapshot
            )));
        }
        if header.volume_size_bytes != m.size_bytes {
            return Err(VolumeError::Invalid(format!(
                "the diff is of a {}-byte volume and {volume:?} is {} bytes",
                header.volume_size_bytes, m.size_bytes
            )));
        }
        let to = header.to_snapshot.clone();
        self.with_volume(volume, |vol| async move {
            apply_records(path, &vol).await?;
            vol.flush().await?;
            vol.create_snapshot(&to).await?;
            Ok(())
        })
        .await?;
        Ok(sum)
    }
}

/// Reads a diff file's header and every record, verified; nothing is
/// applied. Returns the header and what the file carries.
fn verify_diff_file(path: &Path) -> Result<(DiffHeader, DiffSummary), VolumeError> {
    let what = format!("read diff file {}", path.display());
    let file = std::fs::File::open(path).map_err(io_error(&what))?;
    let mut r = std::io::BufReader::new(file);
    let bad = |detail: String| VolumeError::Corrupt {
        path: path.display().to_string(),
        detail,
    };
    let header = read_header(&mut r, &what).and_then(|b| DiffHeader::decode(&b).map_err(bad))?;
    let mut sum = DiffSummary::default();
    let mut next_offset = 0u64;
    let mut data = vec![0u8; MAX_DATA_RECORD_BYTES as usize];
    loop {
        let mut raw = [0u8; RECORD_HEADER_BYTES];
        r.read_exact(&mut raw)
            .map_err(|_| bad("the file ends before its end record".into()))?;
        let h = RecordHeader::decode(&raw).map_err(bad)?;
        let body = match h.kind {
            RecordKind::Data => {
                let d = &mut data[..h.length as usize];
                r.read_exact(d)
                    .map_err(|_| bad("a data record is truncated".into()))?;
                &data[..h.length as usize]
            }
            _ => &data[..0],
        };
        if !h.verify(&raw, body) {
            return Err(bad(format!(
                "record at offset {} fails its checksum",
                h.offset
            )));
        }
        if h.kind == RecordKind::End {
            if h.offset != sum.records || h.length != sum.data_bytes {
                return Err(bad(
                    "the end record's counts do not match the records".into()
                ));
            }
            let mut rest = [0u8; 1];
            if r.read(&mut rest).map_err(io_error(&what))? != 0 {
                return Err(bad("bytes after the end record".into()));
            }
            return Ok((header, sum));
        }
        let end = h
            .offset
            .checked_add(h.length)
            .filter(|&e| e <= header.volume_size_bytes);
        if h.offset < next_offset || end.is_none() || h.length == 0 {
            return Err(bad(format!(
                "record {}+{} is out of order or beyond the volume",
                h.offset, h.length
            )));
        }
        next_offset = h.offset + h.length;
        sum.records += 1;
        match h.kind {
            RecordKind::Data => sum.data_bytes += h.length,
            _ => sum.zero_bytes += h.length,
        }
    }
}

fn read_header(r: &mut impl Read, what: &str) -> Result<Vec<u8>, VolumeError> {
    let mut b = vec![0u8; HEADER_PREFIX_BYTES];
    r.read_exact(&mut b).map_err(io_error(what))?;
    let len = DiffHeader::announced_len(&b).map_err(|detail| VolumeError::Corrupt {
        path: what.to_string(),
        detail,
    })?;
    b.resize(len, 0);
    r.read_exact(&mut b[HEADER_PREFIX_BYTES..])
        .map_err(io_error(what))?;
    Ok(b)
}

/// Applies the records of a verified diff file to `vol`.
async fn apply_records(
    path: &Path,
    vol: &std::sync::Arc<crate::volume::Volume>,
) -> Result<(), VolumeError> {
    let what = format!("read diff file {}", path.display());
    let file = std::fs::File::open(path).map_err(io_error(&what))?;
    let mut r = std::io::BufReader::new(file);
    read_header(&mut r, &what)?;
    let mut data = vec![0u8; MAX_DATA_RECORD_BYTES as usize];
    loop {
        let mut raw = [0u8; RECORD_HEADER_BYTES];
        r.read_exact(&mut raw).map_err(io_error(&what))?;
        let h = RecordHeader::decode(&raw).map_err(|detail| VolumeError::Corrupt {
            path: path.display().to_string(),
            detail,
        })?;
        match h.kind {
            RecordKind::End => return Ok(()),
            RecordKind::Zero => vol.trim(h.offset, h.length, false).await?,
            RecordKind::Data => {
                let d = &mut data[..h.length as usize];
                r.read_exact(d).map_err(io_error(&what))?;
                // Verified once already; the file could change in between.
                if !h.verify(&raw, d) {
                    return Err(VolumeError::Corrupt {
                        path: path.display().to_string(),
                        detail: "the file changed while it was applied".into(),
                    });
                }
                vol.write(h.offset, d, false).await?;
            }
        }
    }
}
