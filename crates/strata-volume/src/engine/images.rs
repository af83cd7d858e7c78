//! Whole volumes to and from raw images: `strata volume export` (a volume
//! or a snapshot into a file or a stream) and `import` (a file or a stream
//! into a volume, created if missing). Sparse-aware both ways: an export
//! reads only allocated ranges (block status) and leaves holes in a file;
//! an import stores no all-zero chunk.

use std::io::{Read, Write};
use std::os::unix::fs::FileExt;
use std::sync::Arc;

use serde::Serialize;

use super::Engine;
use crate::error::VolumeError;
use crate::map::Allocation;
use crate::snapshot::SnapshotView;
use crate::volume::Volume;

/// Bytes read or written per step.
const CHUNK_BYTES: u64 = 4 << 20;
/// Block status asked for at most this much at once.
const STATUS_BYTES: u64 = 1 << 30;

/// Where an export goes.
pub enum ImageSink<'a> {
    /// A file: holes stay holes.
    File(&'a std::fs::File),
    /// A stream (standard output): holes are written as zeros.
    Stream(&'a mut (dyn Write + Send)),
}

/// What an export or an import moved.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct ImageSummary {
    pub size_bytes: u64,
    /// Bytes of data read or written.
    pub data_bytes: u64,
    /// Bytes skipped as holes or zeros.
    pub zero_bytes: u64,
}

enum Source {
    View(Arc<SnapshotView>),
    Volume(Arc<Volume>),
}

impl Source {
    fn size_bytes(&self) -> u64 {
        match self {
            Source::View(v) => v.size_bytes(),
            Source::Volume(v) => v.size_bytes(),
        }
    }

    async fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), VolumeError> {
        match self {
            Source::View(v) => v.read(offset, buf).await,
            Source::Volume(v) => v.read(offset, buf).await,
        }
    }

    fn runs(&self, offset: u64, len: u64) -> Result<Vec<(u64, Allocation)>, VolumeError> {
        match self {
            Source::View(v) => v.block_status(offset, len, 4096),
            Source::Volume(v) => v.block_status(offset, len, 4096),
        }
    }
}

fn write_error(source: std::io::Error) -> VolumeError {
    VolumeError::Io {
        what: "write the image".into(),
        source,
    }
}

impl Engine {
    /// Exports snapshot `volume@snapshot`, or the volume itself (opened
    /// here: refused while a server serves it; export a snapshot then).
    pub async fn export_image(
        &self,
        volume: &str,
        snapshot: Option<&str>,
        mut sink: ImageSink<'_>,
        progress: &(dyn Fn(u64, u64) + Sync),
    ) -> Result<ImageSummary, VolumeError> {
        match snapshot {
            Some(s) => {
                let view = self.open_snapshot(volume, s).await?;
                export_from(&Source::View(view), &mut sink, progress).await
            }
            None => {
                self.with_volume(volume, |vol| async move {
                    export_from(&Source::Volume(vol), &mut sink, progress).await
                })
                .await
            }
        }
    }

    /// Imports a raw image from `input` into `volume`: created with
    /// `size_bytes` if missing, otherwise at least that large. Holes and
    /// all-zero chunks are not stored (on an existing volume they are
    /// trimmed, so they read as zeros).
    pub async fn import_image(
        &self,
        input: &mut (dyn Read + Send),
        volume: &str,
        size_bytes: u64,
        progress: &(dyn Fn(u64, u64) + Sync),
    ) -> Result<ImageSummary, VolumeError> {
        let created = match self.create_volume(volume, size_bytes).await {
            Ok(_) => true,
            Err(VolumeError::AlreadyExists(_)) => false,
            Err(e) => return Err(e),
        };
        self.with_volume(volume, |vol| async move {
            if vol.size_bytes() < size_bytes {
                return Err(VolumeError::Invalid(format!(
                    "the image is {size_bytes} bytes and volume {volume:?} {} bytes: resize it first (`strata volume resize`)",
                    vol.size_bytes()
                )));
            }
            import_into(&vol, input, size_bytes, created, progress).await
        })
        .await
    }
}

async fn export_from(
    src: &Source,
    sink: &mut ImageSink<'_>,
    progress: &(dyn Fn(u64, u64) + Sync),
) -> Result<ImageSummary, VolumeError> {
    let size = src.size_bytes();
    let mut sum = ImageSummary {
        size_bytes: size,
        ..ImageSummary::default()
    };
    if let ImageSink::File(f) = sink {
        f.set_len(size).map_err(write_error)?;
    }
    let mut buf = vec![0u8; CHUNK_BYTES as usize];
    let mut pos = 0u64;
    while pos < size {
        let runs = src.runs(pos, STATUS_BYTES.min(size - pos))?;
        for (len, alloc) in runs {
            let end = pos + len;
            while pos < end {
                let n = (end - pos).min(CHUNK_BYTES);
                let chunk = &mut buf[..n as usize];
                if alloc == Allocation::Data {
                    src.read(pos, chunk).await?;
                    sum.data_bytes += n;
                } else {
                    chunk.fill(0);
                    sum.zero_bytes += n;
                }
                match sink {
                    ImageSink::File(f) if alloc == Allocation::Data => {
                        f.write_all_at(chunk, pos).map_err(write_error)?
                    }
                    ImageSink::File(_) => {}
                    ImageSink::Stream(w) => w.write_all(chunk).map_err(write_error)?,
                }
                pos += n;
                progress(pos, size);
            }
        }
    }
    match sink {
        ImageSink::File(f) => f.sync_all().map_err(write_error)?,
        ImageSink::Stream(w) => w.flush().map_err(write_error)?,
    }
    Ok(sum)
}

async fn import_into(
    vol: &Arc<Volume>,
    input: &mut (dyn Read + Send),
    size: u64,
    fresh: bool,
    progress: &(dyn Fn(u64, u64) + Sync),
) -> Result<ImageSummary, VolumeError> {
    let mut sum = ImageSummary {
        size_bytes: size,
        ..ImageSummary::default()
    };
    let mut buf = vec![0u8; CHUNK_BYTES as usize];
    let mut pos = 0u64;
    while pos < size {
        let want = (size - pos).min(CHUNK_BYTES) as usize;
        let n = read_full(input, &mut buf[..want])?;
        if n == 0 {
            break;
        }
        let chunk = &buf[..n];
        if chunk.iter().all(|&b| b == 0) {
            if !fresh {
                vol.trim(pos, n as u64, false).await?;
            }
            sum.zero_bytes += n as u64;
        } else {
            vol.write(pos, chunk, false).await?;
            sum.data_bytes += n as u64;
        }
        pos += n as u64;
        progress(pos, size);
    }
    let mut extra = [0u8; 1];
    if read_full(input, &mut extra)? != 0 {
        return Err(VolumeError::Invalid(format!(
            "the image is longer than the {size} bytes given; pass its size (--size)"
        )));
    }
    vol.flush().await?;
    Ok(sum)
}

/// Reads until `buf` is full or the input ends; the bytes read.
fn read_full(input: &mut (dyn Read + Send), buf: &mut [u8]) -> Result<usize, VolumeError> {
    let mut got = 0;
    while got < buf.len() {
        match input.read(&mut buf[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(source) => {
                return Err(VolumeError::Io {
                    what: "read the image".into(),
                    source,
                })
            }
        }
    }
    Ok(got)
}
