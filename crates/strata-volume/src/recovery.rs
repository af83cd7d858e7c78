//! Opening a volume: recovery from manifest, checkpoint, later segments and
//! the journal.
//!
//! Owns the order of recovery. It is idempotent: a crash during recovery
//! leaves what the next one needs (nothing is deleted that the journal does
//! not also hold), and applying a segment twice changes nothing.
//!
//! 1. manifest -> latest checkpoint (extent map as of segment S)
//! 2. segments S+1, S+2, ... while contiguous; a segment after a gap was
//!    uploaded while an earlier one was not: it is deleted (its writes are
//!    in the journal, whose replay starts before the gap) so numbering stays
//!    contiguous for the next recovery
//! 3. the journal, from the position the last applied segment (or the
//!    checkpoint) recorded, if it is the same journal instance
//! 4. everything replayed sits in the open segment and sealed segments that
//!    are uploaded as usual

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::Arc;

use bytes::Bytes;
use object_store::{PutPayload, UpdateVersion};
use parking_lot::Mutex;
use strata_store::{ObjectNames, Store};
use tokio::sync::Notify;

use crate::checkpoint;
use crate::config::VolumeConfig;
use crate::error::VolumeError;
use crate::extent_map::{ExtentMap, Target};
use crate::journal::{self, record_bytes, Journal, Position, Superblock};
use crate::lease::{self, Ownership, RenewError};
use crate::manifest::Manifest;
use crate::read_path::{fetch_segment_header, SharedCaches};
use crate::segment::{EntryKind, JournalSpan, OpenSegment};
use crate::volume::{apply_op, State, Volume};

pub(crate) fn store_error(
    store: &Store,
    op: &'static str,
    path: &object_store::path::Path,
) -> impl FnOnce(object_store::Error) -> VolumeError {
    let store = store.description().to_string();
    let path = path.to_string();
    move |source| VolumeError::Store {
        store,
        op,
        path,
        source: Box::new(source),
    }
}

/// Reads and verifies a volume's manifest.
pub(crate) async fn read_manifest(store: &Store, name: &str) -> Result<Manifest, VolumeError> {
    Ok(read_manifest_versioned(store, name).await?.0)
}

/// Reads and verifies a volume's manifest, with its version (for a
/// conditional write).
pub(crate) async fn read_manifest_versioned(
    store: &Store,
    name: &str,
) -> Result<(Manifest, UpdateVersion), VolumeError> {
    let path = ObjectNames::new(name).manifest();
    let Some((bytes, version)) = store
        .get_versioned(&path)
        .await
        .map_err(store_error(store, "read", &path))?
    else {
        return Err(VolumeError::NotFound(name.to_string()));
    };
    let m = Manifest::decode(&bytes).map_err(|detail| VolumeError::Corrupt {
        path: path.to_string(),
        detail,
    })?;
    if m.name != name {
        return Err(VolumeError::Corrupt {
            path: path.to_string(),
            detail: format!("manifest names volume {:?}", m.name),
        });
    }
    Ok((m, version))
}

/// Sequence numbers of a volume's stored segments, sorted.
pub(crate) async fn list_segments(
    store: &Store,
    names: &ObjectNames,
) -> Result<Vec<(u64, u64)>, VolumeError> {
    let prefix = names.segments_prefix();
    let metas = store
        .list_all(&prefix)
        .await
        .map_err(store_error(store, "list", &prefix))?;
    let mut seqs: Vec<(u64, u64)> = metas
        .iter()
        .filter_map(|m| ObjectNames::parse_seq(&m.location).map(|s| (s, m.size)))
        .collect();
    seqs.sort_unstable();
    Ok(seqs)
}

pub(crate) fn journal_path(config: &VolumeConfig, name: &str, uuid: &[u8; 16]) -> PathBuf {
    local_path(config, name, uuid, "journal")
}

pub(crate) fn lock_path(config: &VolumeConfig, name: &str, uuid: &[u8; 16]) -> PathBuf {
    local_path(config, name, uuid, "lock")
}

fn local_path(config: &VolumeConfig, name: &str, uuid: &[u8; 16], ext: &str) -> PathBuf {
    let hex: String = uuid.iter().map(|b| format!("{b:02x}")).collect();
    config.journal_dir().join(format!("{name}-{hex}.{ext}"))
}

/// Takes the local lock, the store lease and a new epoch of volume `name`
/// (see `lease.rs`). Returns the manifest as written with the new epoch.
pub(crate) async fn take_ownership(
    store: &Store,
    config: &VolumeConfig,
    name: &str,
) -> Result<(Ownership, Manifest, UpdateVersion), VolumeError> {
    let (mut manifest, mut version) = read_manifest_versioned(store, name).await?;
    let uuid = manifest.uuid_bytes().map_err(VolumeError::Invalid)?;
    std::fs::create_dir_all(config.journal_dir()).map_err(|source| VolumeError::Io {
        what: format!(
            "create journal directory {}",
            config.journal_dir().display()
        ),
        source,
    })?;
    let lock = lease::lock_locally(&lock_path(config, name, &uuid), name)?;
    let holder = lease::holder_id(&config.data_dir)?;
    let names = ObjectNames::new(name);
    let epoch = manifest.epoch + 1;
    let sent_at = std::time::Instant::now();
    let held = lease::acquire(store, &names, &holder, config.lease_ttl_ms, epoch, name).await?;
    let path = names.manifest();
    loop {
        if manifest.epoch >= epoch {
            return Err(VolumeError::Busy(format!(
                "volume {name:?} was opened by another server (epoch {}) while this one was opening it",
                manifest.epoch
            )));
        }
        manifest.epoch = epoch;
        let payload = PutPayload::from(Bytes::from(manifest.encode()));
        match store.put_if(&path, payload, Some(&version)).await {
            Ok(v) => {
                version = v;
                break;
            }
            Err(object_store::Error::Precondition { .. }) => {
                // Changed since we read it: maybe a lost reply of our own
                // write, maybe a late write of the previous holder.
                (manifest, version) = read_manifest_versioned(store, name).await?;
                if manifest.epoch == epoch {
                    break;
                }
            }
            Err(e) => return Err(store_error(store, "write", &path)(e)),
        }
    }
    let ownership = Ownership::new(holder, lock, held, sent_at);
    Ok((ownership, manifest, version))
}

struct Recovered {
    map: ExtentMap,
    next_seq: u64,
    span: Option<JournalSpan>,
    checkpoint_seq: u64,
}

impl Volume {
    /// Opens (and recovers) volume `name`.
    pub async fn open(
        store: Store,
        name: &str,
        config: Arc<VolumeConfig>,
        caches: Arc<SharedCaches>,
    ) -> Result<Arc<Volume>, VolumeError> {
        config.validate().map_err(VolumeError::Invalid)?;
        let started = std::time::Instant::now();
        let (ownership, manifest, manifest_version) = take_ownership(&store, &config, name).await?;
        let uuid = manifest.uuid_bytes().map_err(VolumeError::Invalid)?;
        let names = ObjectNames::new(name);
        let rec = recover_from_store(&store, &names, &manifest, uuid).await?;
        let jpath = journal_path(&config, name, &uuid);
        let (sb, start) = choose_journal(&jpath, &config, uuid, rec.span)?;
        let mut st = State {
            map: rec.map,
            open: OpenSegment::new(
                rec.next_seq,
                Vec::with_capacity(config.segment_bytes as usize),
                sb.journal_id,
            ),
            sealed: BTreeMap::new(),
            uploaded: BTreeSet::new(),
            buffered_cost_bytes: 0,
            durable_seq: rec.next_seq - 1,
            segments_since_checkpoint: rec.next_seq - 1 - rec.checkpoint_seq,
            last_sealed_span: rec.span.unwrap_or_default(),
            checkpoint_requested_seq: rec.checkpoint_seq,
            checkpoint_done_seq: rec.checkpoint_seq,
            failed: None,
        };
        let (head, replayed) =
            replay_journal(&jpath, sb, start, &mut st, &config, manifest.size_bytes)?;
        let journal = Journal::open(&jpath, sb, head, start.lpos)?;
        let vol = Arc::new(Volume {
            name: name.to_string(),
            uuid,
            size_bytes: manifest.size_bytes,
            store,
            names,
            upload_slots: Arc::new(tokio::sync::Semaphore::new(config.max_parallel_uploads)),
            config,
            journal,
            state: Mutex::new(st),
            space: Notify::new(),
            progress: Notify::new(),
            caches,
            manifest: tokio::sync::Mutex::new((manifest, manifest_version)),
            closed: AtomicBool::new(false),
            buffer_pool: Mutex::new(Vec::new()),
            ownership,
            segments_uploaded: AtomicU64::new(0),
            bytes_uploaded: AtomicU64::new(0),
        });
        vol.start_replayed_uploads();
        vol.start_age_sealer();
        vol.start_lease_renewal();
        tracing::info!(volume = %name, holder = %vol.ownership.holder, epoch = vol.ownership.epoch, replayed_records = replayed, elapsed_ms = started.elapsed().as_millis() as u64, "volume open");
        Ok(vol)
    }

    /// Segments sealed during replay could not be uploaded before the volume
    /// existed; start them now.
    fn start_replayed_uploads(self: &Arc<Self>) {
        let sealed: Vec<_> = self.state.lock().sealed.values().cloned().collect();
        for s in sealed {
            let vol = self.clone();
            tokio::spawn(async move { vol.upload(s, None).await });
        }
    }

    /// Renews the store lease every third of its TTL while open (every
    /// second after a failure); fences the volume on a takeover.
    fn start_lease_renewal(self: &Arc<Self>) {
        let weak = Arc::downgrade(self);
        let ttl_ms = self.ownership.ttl_ms;
        tokio::spawn(async move {
            let mut delay_ms = ttl_ms / 3;
            loop {
                tokio::time::sleep(std::time::Duration::from_millis(delay_ms)).await;
                let Some(vol) = weak.upgrade() else { return };
                // Renewals go on while a close uploads what is left (its
                // uploads need a valid lease), until the lease is released.
                if vol.ownership.is_released() {
                    return;
                }
                delay_ms = match vol.ownership.renew(&vol.store, &vol.names).await {
                    Ok(()) => {
                        vol.space.notify_waiters();
                        ttl_ms / 3
                    }
                    Err(RenewError::Fenced(detail)) => {
                        vol.fence(detail);
                        return;
                    }
                    Err(RenewError::Store(e)) => {
                        let valid = vol.ownership.is_valid();
                        tracing::warn!(volume = %vol.name, error = %e, writes_allowed = valid, "cannot renew the lease; retrying (writes wait once it may have expired)");
                        (ttl_ms / 10).clamp(100, 1000)
                    }
                };
            }
        });
    }

    /// Seals segments that are old enough, so idle volumes reach the store.
    fn start_age_sealer(self: &Arc<Self>) {
        let weak = Arc::downgrade(self);
        let period =
            std::time::Duration::from_millis((self.config.segment_max_age_ms / 4).clamp(50, 1000));
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(period);
            loop {
                tick.tick().await;
                let Some(vol) = weak.upgrade() else { return };
                if vol.closed.load(std::sync::atomic::Ordering::Acquire) {
                    return;
                }
                vol.seal_if_old();
            }
        });
    }
}

async fn recover_from_store(
    store: &Store,
    names: &ObjectNames,
    manifest: &Manifest,
    uuid: [u8; 16],
) -> Result<Recovered, VolumeError> {
    let (mut map, base, mut span) = match manifest.checkpoint_seq {
        Some(seq) => {
            let path = names.checkpoint(seq);
            let bytes = store
                .object_store()
                .get(&path)
                .await
                .map_err(store_error(store, "read", &path))?
                .bytes()
                .await
                .map_err(store_error(store, "read", &path))?;
            let corrupt = |detail: String| VolumeError::Corrupt {
                path: path.to_string(),
                detail,
            };
            let (info, map) = checkpoint::decode(&bytes).map_err(corrupt)?;
            if info.seq != seq
                || info.volume_uuid != uuid
                || info.volume_size_bytes != manifest.size_bytes
            {
                return Err(corrupt("checkpoint does not match the manifest".into()));
            }
            (map, seq, Some(info.span))
        }
        None => (ExtentMap::new(), 0, None),
    };
    let segments = list_segments(store, names).await?;
    let mut next = base + 1;
    let mut orphans = Vec::new();
    for &(seq, _) in segments.iter().filter(|s| s.0 > base) {
        if seq != next {
            orphans.push(seq);
            continue;
        }
        let (idx, entries) =
            fetch_segment_header(store, names, seq, uuid, manifest.size_bytes).await?;
        for e in &entries {
            let target = match e.kind {
                EntryKind::Write => Some(Target::Data {
                    seq,
                    offset: e.data_offset,
                }),
                EntryKind::Zero => Some(Target::Zero),
                EntryKind::Unmap => None,
            };
            map.set(e.offset, e.len, target);
        }
        span = Some(idx.fixed.span);
        next += 1;
    }
    for seq in orphans {
        tracing::warn!(volume = %names.volume_prefix(), seq, "deleting segment stored after a missing one; the journal replays its writes");
        let path = names.segment(seq);
        store
            .delete(&path)
            .await
            .map_err(store_error(store, "delete", &path))?;
    }
    Ok(Recovered {
        map,
        next_seq: next,
        span,
        checkpoint_seq: base,
    })
}

/// Picks the journal to replay, or makes a fresh one.
fn choose_journal(
    path: &std::path::Path,
    config: &VolumeConfig,
    uuid: [u8; 16],
    span: Option<JournalSpan>,
) -> Result<(Superblock, Position), VolumeError> {
    let existing = match journal::read_superblock(path) {
        Ok(sb) => sb,
        Err(e) => {
            tracing::warn!(error = %e, "unreadable journal; starting a new one");
            None
        }
    };
    if let Some(sb) = existing.filter(|sb| sb.volume_uuid == uuid) {
        match span {
            Some(s) if s.journal_id == sb.journal_id => {
                return Ok((
                    sb,
                    Position {
                        lpos: s.end_lpos,
                        jseq: s.last_jseq + 1,
                    },
                ));
            }
            None => {
                return Ok((
                    sb,
                    Position {
                        lpos: 0,
                        jseq: sb.start_jseq,
                    },
                ))
            }
            Some(_) => {
                tracing::warn!(journal = %path.display(), "journal is older than the store's state (volume was served elsewhere); starting a new one")
            }
        }
    }
    let start_jseq = span.map_or(1, |s| s.last_jseq + 1);
    let sb = Superblock {
        volume_uuid: uuid,
        journal_id: *uuid::Uuid::new_v4().as_bytes(),
        ring_bytes: config.journal_bytes,
        start_jseq,
    };
    journal::create(path, sb)?;
    Ok((
        sb,
        Position {
            lpos: 0,
            jseq: start_jseq,
        },
    ))
}

/// Replays journal records into the open segment (sealing as it fills).
fn replay_journal(
    path: &std::path::Path,
    sb: Superblock,
    start: Position,
    st: &mut State,
    config: &VolumeConfig,
    size: u64,
) -> Result<(Position, u64), VolumeError> {
    let mut scanner = journal::Scanner::open(path, sb, start)?;
    let mut n = 0u64;
    loop {
        let before = scanner.position();
        let rec = scanner.next_record().map_err(|source| VolumeError::Io {
            what: format!("replay journal {}", path.display()),
            source,
        })?;
        let Some(rec) = rec else { break };
        if rec.offset.checked_add(rec.len).is_none_or(|end| end > size) {
            tracing::warn!(journal = %path.display(), jseq = rec.jseq, "journal record beyond the volume's end; replay stops there");
            return Ok((before, n));
        }
        let cost = record_bytes(rec.payload.len());
        apply_op(
            st,
            rec.kind,
            rec.offset,
            rec.len,
            &rec.payload,
            cost,
            rec.jseq,
            rec.end_lpos,
        );
        n += 1;
        if st.open.cost_bytes >= config.segment_bytes {
            st.seal_open(Vec::with_capacity(config.segment_bytes as usize));
        }
    }
    Ok((scanner.position(), n))
}
