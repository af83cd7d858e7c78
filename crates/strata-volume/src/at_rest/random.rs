//! Randomness for keys, salts and nonces: the operating system's, through
//! ring (the crate that does the cryptography).

use ring::rand::{SecureRandom, SystemRandom};

use crate::error::VolumeError;

/// `N` random bytes.
pub(crate) fn random_array<const N: usize>() -> Result<[u8; N], VolumeError> {
    let mut out = [0u8; N];
    SystemRandom::new()
        .fill(&mut out)
        .map_err(|_| VolumeError::Invalid("the system's random number generator failed".into()))?;
    Ok(out)
}
