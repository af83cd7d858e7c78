//! Access profiles of clones (`format/access_profile.rs`): the ranges a
//! clone of a snapshot reads first, recorded on the first clone that finds
//! none, stored beside the snapshot (`<parent>/profiles/<checkpoint>`,
//! create-only: the first recording wins), and read back when later
//! clones open, so hydration fetches those ranges first, in that order
//! (`hydrate.rs`), before their guest asks.
//!
//! A recording covers the first `RECORD_MS` after the first read or
//! `RECORD_BYTES` of reads or `MAX_RANGES` ranges, whichever ends first,
//! merged where reads follow each other; a read of what was recorded
//! already is not recorded again. It is stored when it ends (or the volume
//! closes). The bounds are a boot's, whatever its working set: measured,
//! a boot reading 0.9 GB of files was cut at 256 MiB before (the earlier
//! bound), and a later clone found three quarters of its reads remote.
//! A profile that cannot be read or verified is ignored with one log line:
//! it is a hint, never an I/O error. An encrypted volume's profile is
//! sealed with its data key (`format/sealed_object.rs`: the bucket shows
//! its size, not which ranges the guest reads); a clone shares its
//! image's data key, so its clones can open it.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use parking_lot::Mutex;
use strata_store::{ObjectNames, Store};

use super::Volume;
use crate::at_rest::random_array;
use crate::format::access_profile::{AccessProfile, ProfileRange, MAX_RANGES, MAX_RANGE_BYTES};
use crate::format::key_wrap::Key;
use crate::format::sealed_object::{seal, SealedKind};
use crate::objects::read_profile;

/// A recording ends this long after the clone's first read ...
pub(crate) const RECORD_MS: u64 = 300_000;
/// ... or once this many bytes were read (or `MAX_RANGES` ranges).
pub(crate) const RECORD_BYTES: u64 = 16 << 30;

/// Where a clone's snapshot keeps its profile.
#[derive(Debug, Clone)]
pub(crate) struct ProfilePlace {
    pub store: Store,
    pub names: ObjectNames,
    /// The snapshot's volume and checkpoint, which the profile must name.
    pub uuid: [u8; 16],
    pub checkpoint_seq: u64,
    pub size_bytes: u64,
    /// The snapshot's data key (an encrypted volume's): profiles are
    /// sealed with it.
    pub data_key: Option<Arc<Key>>,
}

impl ProfilePlace {
    fn path(&self) -> object_store::path::Path {
        self.names.profile(self.checkpoint_seq)
    }
}

/// What opening a clone found of its snapshot's profile.
pub(crate) enum Found {
    Profile(AccessProfile),
    None,
    /// There is one, but it cannot be used (logged once).
    Unusable,
}

/// Reads the profile of `place`'s snapshot: `Found::None` when there is
/// none, `Unusable` (one log line) when it cannot be read or verified.
pub(crate) async fn load_profile(volume: &str, place: &ProfilePlace) -> Found {
    match read_profile(
        &place.store,
        &place.names,
        &place.uuid,
        place.checkpoint_seq,
        place.data_key.as_deref(),
    )
    .await
    {
        Ok(Some(p)) => Found::Profile(p),
        Ok(None) => Found::None,
        Err(e) => {
            tracing::warn!(volume, object = %place.path(), error = %strata_store::ErrorText(&e), "access profile ignored (clients' reads are not affected; `strata snapshot profile` shows it)");
            Found::Unusable
        }
    }
}

/// Whether `place`'s snapshot has a profile (one HEAD): `None` when the
/// store cannot say (logged).
pub(crate) async fn profile_exists(volume: &str, place: &ProfilePlace) -> Option<bool> {
    let path = place.path();
    match place.store.object_store().head(&path).await {
        Ok(_) => Some(true),
        Err(object_store::Error::NotFound { .. }) => Some(false),
        Err(e) => {
            tracing::warn!(volume, object = %path, error = %strata_store::ErrorText(&e), "cannot tell whether the snapshot has an access profile; neither recording nor prefetching one");
            None
        }
    }
}

/// A clone's recording in progress.
pub(crate) struct Recording {
    place: ProfilePlace,
    state: Mutex<Recorder>,
    /// Set once the recording ended (then reads skip the lock).
    ended: AtomicBool,
}

#[derive(Default)]
struct Recorder {
    first_read: Option<Instant>,
    ranges: Vec<ProfileRange>,
    bytes: u64,
    /// What `ranges` cover, merged: start -> end (at most one entry per
    /// range).
    covered: BTreeMap<u64, u64>,
}

impl Recorder {
    /// Whether `offset..end` was recorded already.
    fn covers(&self, offset: u64, end: u64) -> bool {
        self.covered
            .range(..=offset)
            .next_back()
            .is_some_and(|(_, &e)| e >= end)
    }

    /// Notes `offset..end` as recorded, merged with what it touches.
    fn cover(&mut self, offset: u64, end: u64) {
        let (mut start, mut stop) = (offset, end);
        if let Some((&s, &e)) = self.covered.range(..=offset).next_back() {
            if e >= offset {
                start = s;
                stop = stop.max(e);
            }
        }
        let touching: Vec<u64> = self.covered.range(start..=stop).map(|(&s, _)| s).collect();
        for s in touching {
            if let Some(e) = self.covered.remove(&s) {
                stop = stop.max(e);
            }
        }
        self.covered.insert(start, stop);
    }
}

impl Recording {
    pub fn new(place: ProfilePlace) -> Recording {
        Recording {
            place,
            state: Mutex::new(Recorder::default()),
            ended: AtomicBool::new(false),
        }
    }

    pub fn ended(&self) -> bool {
        self.ended.load(Ordering::Acquire)
    }

    /// Notes a read; true when this read ended the recording (the caller
    /// stores it).
    pub fn note(&self, offset: u64, len: u64) -> bool {
        if len == 0 || self.ended() {
            return false;
        }
        let mut r = self.state.lock();
        let now = Instant::now();
        let first = *r.first_read.get_or_insert(now);
        let at_ms = now.duration_since(first).as_millis() as u64;
        if at_ms > RECORD_MS || r.bytes + len > RECORD_BYTES || r.ranges.len() >= MAX_RANGES {
            return !self.ended.swap(true, Ordering::AcqRel);
        }
        let end = offset.saturating_add(len);
        if r.covers(offset, end) {
            return false;
        }
        r.cover(offset, end);
        r.bytes += len;
        let at_ms = at_ms as u32;
        if let Some(last) = r.ranges.last_mut() {
            if last.offset + last.len == offset && last.len + len <= MAX_RANGE_BYTES {
                last.len += len;
                return false;
            }
        }
        let mut at = offset;
        while at < end && r.ranges.len() < MAX_RANGES {
            let n = (end - at).min(MAX_RANGE_BYTES);
            r.ranges.push(ProfileRange {
                offset: at,
                len: n,
                at_ms,
            });
            at += n;
        }
        false
    }

    /// Ends the recording and stores it (create-only: a profile another
    /// clone stored first stays). Nothing recorded, nothing stored.
    pub async fn store(&self, volume: &str) {
        self.ended.store(true, Ordering::Release);
        let profile = {
            let mut r = self.state.lock();
            if r.ranges.is_empty() {
                return;
            }
            AccessProfile {
                volume_uuid: self.place.uuid,
                checkpoint_seq: self.place.checkpoint_seq,
                size_bytes: self.place.size_bytes,
                recorded_ms: r.first_read.map_or(0, |t| {
                    t.elapsed().as_millis().min(u128::from(RECORD_MS)) as u64
                }),
                ranges: std::mem::take(&mut *r).ranges,
            }
        };
        // A resize while recording may have moved the end: keep what a
        // reader will accept.
        let mut profile = profile;
        let size = profile.size_bytes;
        profile
            .ranges
            .retain(|r| r.offset.saturating_add(r.len) <= size);
        if profile.ranges.is_empty() {
            return;
        }
        let (ranges, bytes) = (profile.ranges.len(), profile.bytes());
        let path = self.place.path();
        let payload = match self.sealed(profile.encode()) {
            Ok(p) => p,
            Err(e) => {
                tracing::warn!(volume, object = %path, error = %e, "access profile not stored (later clones hydrate in address order)");
                return;
            }
        };
        match self.place.store.put_if(&path, payload.into(), None).await {
            Ok(_) => {
                tracing::info!(volume, object = %path, ranges, bytes, "access profile stored: later clones of this snapshot fetch these ranges first");
            }
            Err(
                object_store::Error::AlreadyExists { .. }
                | object_store::Error::Precondition { .. },
            ) => {
                tracing::debug!(volume, object = %path, "another clone stored the snapshot's profile first");
            }
            Err(e) => {
                tracing::warn!(volume, object = %path, error = %strata_store::ErrorText(&e), "access profile not stored (later clones hydrate in address order)");
            }
        }
    }
}

impl Recording {
    /// An encoded profile as stored: sealed for an encrypted volume.
    fn sealed(&self, encoded: Vec<u8>) -> Result<Bytes, crate::error::VolumeError> {
        let Some(key) = &self.place.data_key else {
            return Ok(Bytes::from(encoded));
        };
        let (kind, seq) = (SealedKind::AccessProfile, self.place.checkpoint_seq);
        let salt = random_array()?;
        Ok(Bytes::from(seal(
            &encoded,
            kind,
            seq,
            &self.place.uuid,
            key.bytes(),
            salt,
        )))
    }
}

impl Volume {
    /// Notes a client's read for the profile being recorded, if any.
    pub(crate) fn note_read_for_profile(self: &Arc<Self>, offset: u64, len: u64) {
        let Some(rec) = &self.profile_recording else {
            return;
        };
        if rec.note(offset, len) {
            let vol = self.clone();
            tokio::spawn(async move {
                if let Some(rec) = &vol.profile_recording {
                    rec.store(&vol.name).await;
                }
            });
        }
    }

    /// Stores the recording when its time is up even if reads stopped.
    pub(crate) fn start_profile_timer(self: &Arc<Self>) {
        if self.profile_recording.is_none() {
            return;
        }
        let weak = Arc::downgrade(self);
        tokio::spawn(async move {
            // From open: the first read comes soon after (a VM's boot).
            tokio::time::sleep(Duration::from_millis(RECORD_MS + 1_000)).await;
            let Some(vol) = weak.upgrade() else { return };
            if let Some(rec) = &vol.profile_recording {
                if !rec.ended() {
                    rec.store(&vol.name).await;
                }
            }
        });
    }

    /// At close: a recording still running is stored as it is.
    pub(crate) async fn store_profile_at_close(&self) {
        if let Some(rec) = &self.profile_recording {
            if !rec.ended() {
                rec.store(&self.name).await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn place() -> ProfilePlace {
        ProfilePlace {
            store: Store::in_memory(),
            names: ObjectNames::new("img"),
            uuid: [3; 16],
            checkpoint_seq: 9,
            size_bytes: 1 << 30,
            data_key: None,
        }
    }

    #[tokio::test]
    async fn an_encrypted_volumes_profile_is_sealed_and_needs_its_key() {
        let at = ProfilePlace {
            data_key: Some(Arc::new(Key::from_bytes([7; 32]))),
            ..place()
        };
        let rec = Recording::new(at.clone());
        rec.note(123 << 20, 4096);
        rec.store("c1").await;
        let Found::Profile(p) = load_profile("c2", &at).await else {
            panic!("no profile");
        };
        assert_eq!((p.ranges[0].offset, p.ranges[0].len), (123 << 20, 4096));
        // The bucket holds the sealed envelope, not the ranges.
        let path = at.names.profile(at.checkpoint_seq);
        let stored = at.store.get_range(&path, 0..8).await.unwrap();
        assert_eq!(&stored[..], b"STRATSLD");
        // Without the key, or with another, it is unusable, not an error.
        let keyless = ProfilePlace {
            data_key: None,
            ..at.clone()
        };
        assert!(matches!(
            load_profile("c3", &keyless).await,
            Found::Unusable
        ));
        let wrong = ProfilePlace {
            data_key: Some(Arc::new(Key::from_bytes([8; 32]))),
            ..at.clone()
        };
        assert!(matches!(load_profile("c4", &wrong).await, Found::Unusable));
        // And an unencrypted profile where a sealed one belongs is refused.
        let plain = ProfilePlace {
            store: Store::in_memory(),
            ..keyless
        };
        let rec = Recording::new(plain.clone());
        rec.note(0, 4096);
        rec.store("c5").await;
        let swapped = ProfilePlace {
            data_key: at.data_key.clone(),
            ..plain
        };
        assert!(matches!(
            load_profile("c6", &swapped).await,
            Found::Unusable
        ));
    }

    #[tokio::test]
    async fn reads_are_merged_stored_once_and_read_back() {
        let at = place();
        let rec = Recording::new(at.clone());
        assert!(!rec.note(0, 4096));
        assert!(!rec.note(4096, 4096), "merged with the one before");
        assert!(!rec.note(1 << 20, 8192));
        assert!(!rec.note(0, 4096), "read again: not recorded again");
        assert!(!rec.note(4096, 8192), "partly new: recorded");
        assert!(!rec.note((1 << 20) + 4096, 4096), "inside a recorded range");
        rec.store("c1").await;
        assert!(rec.ended() && !rec.note(5 << 20, 4096));
        let Found::Profile(p) = load_profile("c2", &at).await else {
            panic!("no profile");
        };
        let ranges: Vec<(u64, u64)> = p.ranges.iter().map(|r| (r.offset, r.len)).collect();
        assert_eq!(ranges, vec![(0, 8192), (1 << 20, 8192), (4096, 8192)]);
        // A second recording does not replace the first.
        let other = Recording::new(at.clone());
        other.note(7 << 20, 4096);
        other.store("c3").await;
        let Found::Profile(again) = load_profile("c4", &at).await else {
            panic!("no profile");
        };
        assert_eq!(again, p);
    }

    #[tokio::test]
    async fn a_damaged_or_foreign_profile_is_unusable_not_an_error() {
        let at = place();
        assert!(matches!(load_profile("c", &at).await, Found::None));
        let path = at.names.profile(at.checkpoint_seq);
        let garbage = Bytes::from_static(b"STRATPRF garbage");
        at.store.put_if(&path, garbage.into(), None).await.unwrap();
        assert!(matches!(load_profile("c", &at).await, Found::Unusable));
        // A valid profile, of another snapshot, copied under this name.
        let other = ProfilePlace {
            store: Store::in_memory(),
            checkpoint_seq: 10,
            ..place()
        };
        let rec = Recording::new(other.clone());
        rec.note(0, 4096);
        rec.store("c").await;
        let bytes = other
            .store
            .get_range(&other.names.profile(10), 0..(64 + 16))
            .await
            .unwrap();
        let fresh = place();
        let path = fresh.names.profile(9);
        fresh.store.put_if(&path, bytes.into(), None).await.unwrap();
        assert!(matches!(load_profile("c", &fresh).await, Found::Unusable));
    }
}
