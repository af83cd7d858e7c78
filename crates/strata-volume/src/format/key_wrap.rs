//! Keys of an encrypted volume (design: `docs/design/data-at-rest.md`):
//! the key-encryption key (KEK) the user holds, and the volume's data key
//! (DEK), stored in the manifest wrapped by the KEK. Pure: the caller
//! brings the randomness (nonces, new keys).
//!
//! ## Wrapped key (hex in the manifest's JSON)
//!
//! ```text
//!  0 12  nonce (random)
//! 12 32  the data key, AES-256-GCM under the KEK, associated data = the
//!        volume's uuid (a wrapped key copied to another volume fails)
//! 44 16  tag
//! ```
//!
//! Unwrapping is the key check: a wrong KEK fails the tag, and the volume
//! does not open. The manifest also keeps the KEK's fingerprint (the first
//! 8 bytes of SHA-256 of "strata kek" and the key, in hex) so the error can
//! say which key the volume wants; it reveals nothing of a random key.

use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM};

pub const KEY_BYTES: usize = 32;
const NONCE_BYTES: usize = 12;
const WRAPPED_BYTES: usize = NONCE_BYTES + KEY_BYTES + 16;

/// A 256-bit key; its bytes are wiped when dropped.
#[derive(Clone, PartialEq, Eq)]
pub struct Key([u8; KEY_BYTES]);

impl std::fmt::Debug for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Key(..)")
    }
}

impl Drop for Key {
    fn drop(&mut self) {
        // Best effort: volatile so the wipe is not optimised away.
        for b in self.0.iter_mut() {
            // SAFETY: `b` is a valid, aligned, exclusive reference.
            unsafe { std::ptr::write_volatile(b, 0) };
        }
    }
}

impl Key {
    pub fn from_bytes(bytes: [u8; KEY_BYTES]) -> Key {
        Key(bytes)
    }

    pub fn bytes(&self) -> &[u8; KEY_BYTES] {
        &self.0
    }

    /// 64 hex digits (surrounding whitespace ignored), as in a key file or
    /// `STRATA_KEY`.
    pub fn from_hex(text: &str) -> Result<Key, String> {
        let text = text.trim();
        let bytes = decode_hex(text)
            .filter(|b| b.len() == KEY_BYTES)
            .ok_or_else(|| {
                format!(
                "a key is {} hex digits (as `strata key generate` writes); this is {} characters",
                KEY_BYTES * 2,
                text.len()
            )
            })?;
        let mut key = [0u8; KEY_BYTES];
        key.copy_from_slice(&bytes);
        Ok(Key(key))
    }

    pub fn to_hex(&self) -> String {
        encode_hex(&self.0)
    }

    /// Which key this is, safe to show and store: 16 hex digits.
    pub fn fingerprint(&self) -> String {
        let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
        ctx.update(b"strata kek");
        ctx.update(&self.0);
        encode_hex(&ctx.finish().as_ref()[..8])
    }

    fn aead(&self) -> LessSafeKey {
        // Any 32 bytes make an AES-256 key.
        match UnboundKey::new(&AES_256_GCM, &self.0) {
            Ok(k) => LessSafeKey::new(k),
            Err(_) => unreachable!("AES-256-GCM takes any 32-byte key"),
        }
    }
}

/// `data_key` wrapped by `kek` for the volume with `volume_uuid`, with a
/// fresh random `nonce`: hex for the manifest.
pub fn wrap(kek: &Key, data_key: &Key, volume_uuid: &[u8; 16], nonce: [u8; NONCE_BYTES]) -> String {
    let mut sealed = data_key.0.to_vec();
    let n = Nonce::assume_unique_for_key(nonce);
    if kek
        .aead()
        .seal_in_place_append_tag(n, Aad::from(volume_uuid), &mut sealed)
        .is_err()
    {
        unreachable!("AES-GCM sealing of 32 bytes");
    }
    let mut out = nonce.to_vec();
    out.extend_from_slice(&sealed);
    encode_hex(&out)
}

/// Why a wrapped key was not unwrapped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UnwrapError {
    /// Not a wrapped key at all (damaged manifest).
    Malformed(String),
    /// The tag does not match: another key, or another volume's.
    WrongKey,
}

/// The data key `wrapped` holds, if `kek` is the key it was wrapped with
/// for this volume.
pub fn unwrap(kek: &Key, wrapped: &str, volume_uuid: &[u8; 16]) -> Result<Key, UnwrapError> {
    let raw = decode_hex(wrapped)
        .filter(|b| b.len() == WRAPPED_BYTES)
        .ok_or_else(|| {
            UnwrapError::Malformed(format!("a wrapped key is {} hex digits", WRAPPED_BYTES * 2))
        })?;
    let mut nonce = [0u8; NONCE_BYTES];
    nonce.copy_from_slice(&raw[..NONCE_BYTES]);
    let mut sealed = raw[NONCE_BYTES..].to_vec();
    let n = Nonce::assume_unique_for_key(nonce);
    let plain = kek
        .aead()
        .open_in_place(n, Aad::from(volume_uuid), &mut sealed)
        .map_err(|_| UnwrapError::WrongKey)?;
    let mut key = [0u8; KEY_BYTES];
    key.copy_from_slice(plain);
    sealed.iter_mut().for_each(|b| *b = 0);
    Ok(Key(key))
}

fn encode_hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn decode_hex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) || !text.is_ascii() {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&text[i..i + 2], 16).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const UUID: [u8; 16] = [9; 16];

    #[test]
    fn a_wrapped_key_opens_with_its_kek_for_its_volume_only() {
        let kek = Key::from_bytes([1; 32]);
        let dek = Key::from_bytes([2; 32]);
        let wrapped = wrap(&kek, &dek, &UUID, [3; 12]);
        assert_eq!(wrapped.len(), WRAPPED_BYTES * 2);
        assert_eq!(unwrap(&kek, &wrapped, &UUID), Ok(dek.clone()));
        let other = Key::from_bytes([4; 32]);
        assert_eq!(unwrap(&other, &wrapped, &UUID), Err(UnwrapError::WrongKey));
        assert_eq!(unwrap(&kek, &wrapped, &[8; 16]), Err(UnwrapError::WrongKey));
        let mut flipped = wrapped.clone().into_bytes();
        flipped[30] = if flipped[30] == b'0' { b'1' } else { b'0' };
        let flipped = String::from_utf8(flipped).unwrap();
        assert_eq!(unwrap(&kek, &flipped, &UUID), Err(UnwrapError::WrongKey));
        assert!(matches!(
            unwrap(&kek, &wrapped[2..], &UUID),
            Err(UnwrapError::Malformed(_))
        ));
        assert!(matches!(
            unwrap(&kek, "zz", &UUID),
            Err(UnwrapError::Malformed(_))
        ));
    }

    #[test]
    fn keys_read_from_hex_and_fingerprints_differ() {
        let k = Key::from_bytes([0xab; 32]);
        let again = Key::from_hex(&format!("  {}\n", k.to_hex())).unwrap();
        assert_eq!(again, k);
        assert_eq!(k.fingerprint().len(), 16);
        assert_ne!(k.fingerprint(), Key::from_bytes([0xac; 32]).fingerprint());
        for bad in ["", "abc", &"g".repeat(64), &"a".repeat(62), &"é".repeat(32)] {
            let e = Key::from_hex(bad).unwrap_err();
            assert!(e.contains("64 hex digits"), "{e}");
        }
    }
}
