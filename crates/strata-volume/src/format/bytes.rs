//! Little-endian field readers shared by the byte layouts of this folder.
//!
//! Callers pass slices they have already bounds-checked against the layout
//! (a fixed header of known length); these only convert.

/// The u64 in the first 8 bytes of `b` (`b` has at least 8).
pub(crate) fn le_u64(b: &[u8]) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[..8]);
    u64::from_le_bytes(a)
}

/// The u32 in the first 4 bytes of `b` (`b` has at least 4).
pub(crate) fn le_u32(b: &[u8]) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[..4]);
    u32::from_le_bytes(a)
}

/// The first 16 bytes of `b` (`b` has at least 16).
pub(crate) fn array16(b: &[u8]) -> [u8; 16] {
    let mut a = [0u8; 16];
    a.copy_from_slice(&b[..16]);
    a
}
