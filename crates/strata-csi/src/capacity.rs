//! The size a CreateVolume or ControllerExpandVolume asks for, from CSI's
//! capacity range, in strata's units.

use strata_volume::MAX_VOLUME_BYTES;
use tonic::Status;

use crate::proto::CapacityRange;

/// A volume made without a size asked for.
pub const DEFAULT_VOLUME_BYTES: u64 = 1 << 30;
/// Sizes are rounded up to this (a filesystem's block; strata needs 512).
pub const SIZE_STEP_BYTES: u64 = 4096;

/// The bounds a range sets: (at least, at most; 0 for no bound).
pub fn bounds(range: Option<&CapacityRange>) -> Result<(u64, u64), Status> {
    let Some(r) = range else {
        return Ok((0, 0));
    };
    if r.required_bytes < 0 || r.limit_bytes < 0 {
        return Err(Status::invalid_argument(format!(
            "capacity_range: required_bytes ({}) and limit_bytes ({}) must not be negative",
            r.required_bytes, r.limit_bytes
        )));
    }
    let (required, limit) = (r.required_bytes as u64, r.limit_bytes as u64);
    if limit != 0 && limit < required {
        return Err(Status::invalid_argument(format!(
            "capacity_range: limit_bytes ({limit}) is below required_bytes ({required})"
        )));
    }
    Ok((required, limit))
}

/// The size to make: the least multiple of `SIZE_STEP_BYTES` at or above
/// what is required (`DEFAULT_VOLUME_BYTES` when nothing is, or the limit
/// if that is smaller), within the limit and strata's largest volume.
pub fn size_for(range: Option<&CapacityRange>) -> Result<u64, Status> {
    let (required, limit) = bounds(range)?;
    let wanted = match (required, limit) {
        (0, 0) => DEFAULT_VOLUME_BYTES,
        (0, limit) => DEFAULT_VOLUME_BYTES.min(limit / SIZE_STEP_BYTES * SIZE_STEP_BYTES),
        (required, _) => required,
    };
    let size = wanted
        .checked_next_multiple_of(SIZE_STEP_BYTES)
        .filter(|s| *s > 0)
        .ok_or_else(|| {
            Status::out_of_range(format!("capacity_range: {wanted} bytes cannot be made"))
        })?;
    if limit != 0 && size > limit {
        return Err(Status::out_of_range(format!(
            "capacity_range: sizes are multiples of {SIZE_STEP_BYTES} bytes and none lies between required_bytes ({required}) and limit_bytes ({limit})"
        )));
    }
    if size > MAX_VOLUME_BYTES {
        return Err(Status::out_of_range(format!(
            "capacity_range: {size} bytes is more than a strata volume may hold ({MAX_VOLUME_BYTES} bytes, 1 PiB)"
        )));
    }
    Ok(size)
}

/// Whether an existing volume of `size_bytes` satisfies `range`.
pub fn fits(size_bytes: u64, range: Option<&CapacityRange>) -> Result<bool, Status> {
    let (required, limit) = bounds(range)?;
    Ok(size_bytes >= required && (limit == 0 || size_bytes <= limit))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn range(required: i64, limit: i64) -> Option<CapacityRange> {
        Some(CapacityRange {
            required_bytes: required,
            limit_bytes: limit,
        })
    }

    #[test]
    fn sizes_round_up_within_the_limit() {
        assert_eq!(size_for(None).unwrap(), DEFAULT_VOLUME_BYTES);
        assert_eq!(size_for(range(1, 0).as_ref()).unwrap(), 4096);
        assert_eq!(size_for(range(0, 10 << 20).as_ref()).unwrap(), 10 << 20);
        assert_eq!(size_for(range(5000, 8192).as_ref()).unwrap(), 8192);
        let e = size_for(range(5000, 6000).as_ref()).unwrap_err();
        assert_eq!(e.code(), tonic::Code::OutOfRange, "{e}");
        let e = size_for(range(MAX_VOLUME_BYTES as i64 + 1, 0).as_ref()).unwrap_err();
        assert_eq!(e.code(), tonic::Code::OutOfRange, "{e}");
        assert!(e.message().contains("1 PiB"), "{e}");
    }

    #[test]
    fn bad_ranges_are_invalid_arguments() {
        for r in [range(-1, 0), range(0, -1), range(10, 5)] {
            let e = size_for(r.as_ref()).unwrap_err();
            assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e}");
        }
    }

    #[test]
    fn an_existing_size_fits_a_range_it_lies_in() {
        assert!(fits(4096, None).unwrap());
        assert!(fits(8192, range(4096, 0).as_ref()).unwrap());
        assert!(!fits(8192, range(4096, 4096).as_ref()).unwrap());
        assert!(!fits(4096, range(8192, 0).as_ref()).unwrap());
    }
}
