//! Randomized robustness: feed pseudo-random bytes (and mutated valid
//! messages) into every decoder. Nothing may panic, and whatever decodes
//! must re-encode to the same bytes (checked by `fuzzing`).

use crate::consts::*;
use crate::fuzzing::decode_everything;
use crate::*;

/// A tiny xorshift64* generator: deterministic, no dependencies.
struct XorShift(u64);

impl XorShift {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, bound: usize) -> usize {
        (self.next() % bound.max(1) as u64) as usize
    }

    fn bytes(&mut self, length: usize) -> Vec<u8> {
        (0..length).map(|_| self.next() as u8).collect()
    }
}

#[test]
fn random_bytes_never_panic() {
    let mut rng = XorShift(0x9e37_79b9_7f4a_7c15);
    for _ in 0..200_000 {
        let length = rng.below(64);
        let data = rng.bytes(length);
        decode_everything(&data);
    }
}

#[test]
fn random_long_inputs_never_panic() {
    let mut rng = XorShift(12345);
    for _ in 0..2_000 {
        let length = rng.below(10_000);
        let data = rng.bytes(length);
        decode_everything(&data);
    }
}

fn valid_messages() -> Vec<Vec<u8>> {
    let mut messages = vec![
        Greeting { handshake_flags: 3 }.encode().to_vec(),
        OptionHeader {
            option: OPT_GO,
            length_bytes: 10,
        }
        .encode()
        .to_vec(),
        RequestHeader {
            flags: 1,
            command_type: 1,
            handle: 7,
            offset_bytes: 0,
            length_bytes: 4096,
        }
        .encode()
        .to_vec(),
        encode_error_chunk(1, EIO, "message"),
        encode_none_chunk(1).to_vec(),
    ];
    let fallible = [
        InfoRequest {
            export_name: "disk".into(),
            info_types: vec![0, 3],
        }
        .encode(),
        MetaContextRequest {
            export_name: "disk".into(),
            queries: vec!["base:allocation".into()],
        }
        .encode(),
        InfoReply::BlockSize {
            minimum_bytes: 1,
            preferred_bytes: 4096,
            maximum_bytes: 1 << 25,
        }
        .encode(),
        ServerEntry {
            name: "a".into(),
            description: "b".into(),
        }
        .encode(),
    ];
    messages.extend(fallible.into_iter().map(|m| m.unwrap()));
    let descriptors = [BlockDescriptor {
        length_bytes: 1,
        status_flags: 3,
    }];
    let chunk = encode_block_status_chunk(1, 1, &descriptors).unwrap();
    messages.push(chunk[20..].to_vec());
    messages
}

#[test]
fn mutated_valid_messages_never_panic() {
    let mut rng = XorShift(0xdead_beef);
    let messages = valid_messages();
    for _ in 0..100_000 {
        let mut data = messages[rng.below(messages.len())].clone();
        for _ in 0..1 + rng.below(4) {
            match rng.below(3) {
                0 if !data.is_empty() => {
                    let index = rng.below(data.len());
                    data[index] = rng.next() as u8;
                }
                1 => data.truncate(rng.below(data.len() + 1)),
                _ => data.push(rng.next() as u8),
            }
        }
        decode_everything(&data);
    }
}
