//! CRC32C of a write's data computed once, per 4 KiB chunk, and used twice:
//! the journal record's CRC is combined from them, and the open segment
//! keeps them as its chunk table entries when the write lands on a chunk
//! boundary (`format/segment.rs` `encode_header`).
//!
//! Why: a byte written on the embedded store was CRC'd twice, once over the
//! whole record (journal) and once per 4 KiB chunk at the seal (segment).
//! Profiled under 1 MiB writes with FLUSHes, CRC32C was 12.8% of all
//! samples on the machine (`docs/design/one-write.md`). Combining costs a
//! 32-step XOR per chunk with the operator for 4 KiB of zeros built once
//! (what zlib's `crc32_combine` builds per call).
//!
//! No byte layout lives here: the CRCs are those the formats define.

use std::sync::OnceLock;

use super::segment::CHUNK_BYTES;

/// The CRC32C of each whole 4 KiB chunk of `data` from its start (a tail
/// shorter than a chunk has none).
pub fn whole_chunk_crcs(data: &[u8]) -> Vec<u32> {
    data.chunks_exact(CHUNK_BYTES as usize)
        .map(crc32c::crc32c)
        .collect()
}

/// `crc32c_append(crc, data)`, given `chunk_crcs`, the CRCs of `data`'s
/// whole chunks (`whole_chunk_crcs`): only the tail is read.
pub fn append_with_chunk_crcs(crc: u32, data: &[u8], chunk_crcs: &[u32]) -> u32 {
    let chunk = CHUNK_BYTES as usize;
    debug_assert_eq!(chunk_crcs.len(), data.len() / chunk);
    let op = chunk_shift();
    let crc = chunk_crcs
        .iter()
        .fold(crc, |crc, &next| op.apply(crc) ^ next);
    crc32c::crc32c_append(crc, &data[chunk_crcs.len() * chunk..])
}

/// The linear map that takes crc32c(A) to the value that, XORed with
/// crc32c(B), gives crc32c(AB) for any B of 4 KiB: column `i` is the image
/// of bit `i`.
struct Shift([u32; 32]);

impl Shift {
    fn apply(&self, crc: u32) -> u32 {
        let mut out = 0;
        let mut bits = crc;
        while bits != 0 {
            let i = bits.trailing_zeros();
            out ^= self.0[i as usize];
            bits &= bits - 1;
        }
        out
    }
}

fn chunk_shift() -> &'static Shift {
    static SHIFT: OnceLock<Shift> = OnceLock::new();
    SHIFT.get_or_init(|| {
        // `crc32c_combine(x, 0, n)` is the map applied to x (zlib's
        // combine: the zeros operator on crc1, XOR crc2).
        let mut cols = [0u32; 32];
        for (i, col) in cols.iter_mut().enumerate() {
            *col = crc32c::crc32c_combine(1 << i, 0, CHUNK_BYTES as usize);
        }
        Shift(cols)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn combined_crcs_equal_the_crc_of_the_bytes() {
        let data: Vec<u8> = (0..(3 << 20) + 777u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect();
        for len in [
            0usize,
            1,
            4095,
            4096,
            4097,
            8192,
            65_536 + 100,
            1 << 20,
            data.len(),
        ] {
            let d = &data[..len];
            let crcs = whole_chunk_crcs(d);
            assert_eq!(crcs.len(), len / 4096);
            for seed in [0u32, 0xdead_beef, crc32c::crc32c(b"journal id")] {
                assert_eq!(
                    append_with_chunk_crcs(seed, d, &crcs),
                    crc32c::crc32c_append(seed, d),
                    "len {len}, seed {seed:#x}"
                );
            }
        }
    }
}
