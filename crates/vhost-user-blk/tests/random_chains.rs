//! The fuzz target's harness (`vhost_user_blk::fuzzing::parse_chain`, run
//! by fuzz/ under cargo-fuzz) on stable, from a fixed seed: mostly
//! well-formed requests lightly mutated, and plain random bytes. Nothing
//! may panic (the harness checks the device contract and each outcome),
//! and the inputs must reach every stage, or the test proves nothing.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;

use vhost_user_blk::fuzzing::{parse_chain, sample_input, Reached, CONFIG_BYTES};

/// A tiny xorshift64* generator: deterministic, no dependencies.
struct XorShift(u64);

impl XorShift {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}

fn kind(r: Reached) -> &'static str {
    match r {
        Reached::ChainRefused => "chain refused",
        Reached::NoStatus => "no status",
        Reached::Refused(1) => "refused IOERR",
        Reached::Refused(2) => "refused UNSUPP",
        Reached::Refused(_) => "refused other",
        Reached::Ran(0) => "ran OK",
        Reached::Ran(1) => "ran IOERR",
        Reached::Ran(_) => "ran other",
    }
}

#[test]
fn sampled_requests_never_panic_and_reach_every_stage() {
    let mut seen: BTreeMap<&str, usize> = BTreeMap::new();
    for seed in 0..20_000 {
        *seen
            .entry(kind(parse_chain(&sample_input(seed))))
            .or_default() += 1;
    }
    println!("{seen:?}");
    for stage in [
        "chain refused",
        "no status",
        "refused IOERR",
        "refused UNSUPP",
        "ran OK",
    ] {
        assert!(
            seen.get(stage).copied().unwrap_or(0) >= 50,
            "{stage}: too few inputs get there: {seen:?}"
        );
    }
    assert_eq!(seen.get("refused other"), None);
    assert_eq!(seen.get("ran other"), None);
}

#[test]
fn random_bytes_never_panic() {
    let mut rng = XorShift(0x5eed_cafe_f00d_0001);
    for _ in 0..5000 {
        let len = CONFIG_BYTES + (rng.next() % 0x4100) as usize;
        let mut input: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
        // Small descriptor tables at low addresses, so that some random
        // chains walk.
        input[3] %= 0x40;
        input[4] = 0;
        parse_chain(&input);
    }
    for len in 0..64 {
        parse_chain(&vec![0u8; len]);
        parse_chain(&vec![0xff; len]);
    }
}
