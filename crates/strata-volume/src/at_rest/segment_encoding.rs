//! A sealed segment as the object that is stored: version 1 (header, then
//! the data as written: no copy) when the volume neither compresses nor
//! encrypts, else version 2 (header with frame table, then the frames),
//! encoded on the blocking pool (compressing a segment takes milliseconds,
//! which would stall the async workers that serve clients).

use std::sync::Arc;

use bytes::Bytes;

use super::random::random_array;
use super::settings::AtRest;
use crate::error::VolumeError;
use crate::format::frame::Compression;
use crate::format::key_wrap::Key;
use crate::format::segment::{encode_segment_v2_into, FrameSettings};
use crate::write::open_segment::SealedSegment;

/// The stored object of `sealed`: its header and its data area.
pub(crate) async fn encode_sealed(
    at_rest: &AtRest,
    volume_uuid: [u8; 16],
    sealed: &Arc<SealedSegment>,
    buffer: impl FnOnce() -> Vec<u8>,
) -> Result<(Bytes, Bytes), VolumeError> {
    if !at_rest.writes_frames() {
        let header = Bytes::from(sealed.encode_header(&volume_uuid));
        return Ok((header, sealed.data_bytes()));
    }
    // A fresh salt per object: a segment written again under its number
    // after a crash gets another key, so no nonce repeats under a key.
    let salt = random_array::<32>()?;
    let compression = at_rest.compression();
    let data_key = at_rest.data_key().cloned();
    let sealed = sealed.clone();
    let mut frames = buffer();
    let encoded = tokio::task::spawn_blocking(move || {
        let key = data_key.as_deref();
        let header = encode(&sealed, volume_uuid, compression, key, salt, &mut frames);
        (header, Bytes::from(frames))
    });
    encoded
        .await
        .map_err(|e| VolumeError::Invalid(format!("encoding a segment failed (a bug): {e}")))
}

fn encode(
    sealed: &SealedSegment,
    volume_uuid: [u8; 16],
    compression: Compression,
    data_key: Option<&Key>,
    salt: [u8; 32],
    frames: &mut Vec<u8>,
) -> Bytes {
    let settings = FrameSettings {
        compression,
        encryption: data_key.map(|k| (k.bytes(), salt)),
    };
    let header = encode_segment_v2_into(
        sealed.seq,
        &volume_uuid,
        &sealed.span,
        &sealed.entries,
        &sealed.data,
        settings,
        frames,
    );
    Bytes::from(header)
}
