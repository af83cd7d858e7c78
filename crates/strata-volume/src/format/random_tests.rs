//! Randomized robustness of every decoder in `format/` on the stable
//! toolchain (the fuzz targets in `crates/strata-volume/fuzz` go further):
//! random bytes, truncations and bit flips of valid objects. Nothing may
//! panic; a truncated or flipped object must be rejected, not misread.

use super::checkpoint::{self, CheckpointInfo};
use super::fuzzing::{decode_everything, decode_with_valid_checksums};
use super::journal::{encode_record, RecordHeader, RecordKind, Superblock, MIN_RING_BYTES};
use super::lease::Lease;
use super::manifest::Manifest;
use super::segment::{
    encode_header, Entry, EntryKind, FixedHeader, JournalSpan, SegmentIndex, FIXED_HEADER_BYTES,
};
use super::snapshot_delta;
use crate::map::{ExtentMap, Target};

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

fn span() -> JournalSpan {
    JournalSpan {
        journal_id: [2; 16],
        first_jseq: 4,
        last_jseq: 9,
        end_lpos: 999,
    }
}

fn valid_segment() -> Vec<u8> {
    let data: Vec<u8> = (0..9000u32).map(|i| (i * 13) as u8).collect();
    let entries = [
        Entry {
            kind: EntryKind::Write,
            offset: 8192,
            len: 9000,
            data_offset: 0,
        },
        Entry {
            kind: EntryKind::Unmap,
            offset: 0,
            len: 4096,
            data_offset: 9000,
        },
    ];
    let mut b = encode_header(3, &[7; 16], &span(), &entries, &data);
    b.extend_from_slice(&data);
    b
}

fn valid_checkpoint() -> Vec<u8> {
    let mut map = ExtentMap::new();
    map.set(0, 4096, Some(Target::Data { seq: 2, offset: 0 }));
    map.set(1 << 20, 8192, Some(Target::Zero));
    map.set(70_000, 5, Some(Target::Data { seq: 3, offset: 9 }));
    let info = CheckpointInfo {
        seq: 3,
        volume_uuid: [7; 16],
        span: span(),
        volume_size_bytes: 1 << 30,
    };
    checkpoint::encode(&info, &map)
}

fn valid_snapshot_delta() -> Vec<u8> {
    let info = snapshot_delta::DeltaInfo {
        to_seq: 9,
        from_seq: 4,
        volume_uuid: [7; 16],
        volume_size_bytes: 1 << 30,
    };
    let pieces = [
        snapshot_delta::DeltaPiece {
            start: 4096,
            len: 8192,
            after: Some(Target::Data { seq: 8, offset: 0 }),
            before: Some((2, 4096)),
        },
        snapshot_delta::DeltaPiece {
            start: 1 << 20,
            len: 4096,
            after: None,
            before: Some((4, 0)),
        },
    ];
    snapshot_delta::encode(&info, &pieces)
}

fn valid_objects() -> Vec<Vec<u8>> {
    let manifest = Manifest {
        name: "vm1".into(),
        uuid: "0123456789abcdef0123456789abcdef".into(),
        size_bytes: 1 << 30,
        created_unix_ms: 5,
        checkpoint_seq: Some(3),
        epoch: 2,
        pending_deletions: Vec::new(),
        last_gc: None,
        snapshots: Vec::new(),
        last_rollback: None,
        parent: None,
        compression: None,
        encryption: None,
        qos: None,
    };
    let lease = Lease {
        holder: "h:/d (x)".into(),
        pid: 9,
        token: "t".into(),
        epoch: 2,
        renewed_unix_ms: 10,
        ttl_ms: 30_000,
        released: false,
        host: Some(super::lease::LeaseHost {
            id: "a".repeat(32),
            incarnation: "i".into(),
        }),
    };
    let sb = Superblock {
        volume_uuid: [7; 16],
        journal_id: [2; 16],
        ring_bytes: MIN_RING_BYTES,
        start_jseq: 1,
    };
    let mut record = Vec::new();
    encode_record(
        &mut record,
        &[2; 16],
        RecordKind::Write,
        4,
        512,
        5,
        b"hello",
    );
    vec![
        valid_segment(),
        valid_checkpoint(),
        manifest.encode(),
        lease.encode().to_vec(),
        sb.encode(),
        record,
        valid_snapshot_delta(),
        valid_host_record(),
    ]
}

#[test]
fn random_bytes_never_panic() {
    let mut rng = XorShift(0x9e37_79b9_7f4a_7c15);
    for _ in 0..5_000 {
        let length = rng.below(300);
        decode_everything(&rng.bytes(length));
    }
}

#[test]
fn random_bytes_with_valid_checksums_never_panic() {
    let mut rng = XorShift(77);
    for _ in 0..5_000 {
        let length = rng.below(400);
        decode_with_valid_checksums(&rng.bytes(length));
    }
    // Mutations of valid objects, re-stamped: field checks, not CRCs, must
    // reject them.
    for object in valid_objects() {
        for _ in 0..500 {
            let mut m = object.clone();
            let at = rng.below(m.len());
            m[at] = rng.next() as u8;
            decode_with_valid_checksums(&m);
        }
    }
}

#[test]
fn truncated_and_mutated_objects_never_panic() {
    let mut rng = XorShift(4242);
    for object in valid_objects() {
        decode_everything(&object);
        for cut in 0..object.len().min(400) {
            decode_everything(&object[..cut]);
        }
        for _ in 0..1_000 {
            let mut m = object.clone();
            for _ in 0..1 + rng.below(4) {
                let at = rng.below(m.len());
                m[at] ^= 1 << rng.below(8);
            }
            decode_everything(&m);
        }
    }
}

#[test]
fn truncated_or_flipped_objects_are_rejected() {
    let seg = valid_segment();
    let fixed = FixedHeader::decode(&seg).unwrap();
    let tables = &seg[FIXED_HEADER_BYTES..fixed.header_bytes as usize];
    assert!(SegmentIndex::decode_tables(fixed, tables, 1 << 30, None).is_ok());
    for cut in 0..FIXED_HEADER_BYTES {
        assert!(
            FixedHeader::decode(&seg[..cut]).is_err(),
            "header cut at {cut}"
        );
    }
    for cut in 0..tables.len() {
        assert!(SegmentIndex::decode_tables(fixed, &tables[..cut], 1 << 30, None).is_err());
    }
    let ckpt = valid_checkpoint();
    for cut in 0..ckpt.len() {
        assert!(
            checkpoint::decode(&ckpt[..cut]).is_err(),
            "checkpoint cut at {cut}"
        );
    }
    for bit in 0..ckpt.len() * 8 {
        let mut m = ckpt.clone();
        m[bit / 8] ^= 1 << (bit % 8);
        assert!(checkpoint::decode(&m).is_err(), "checkpoint bit {bit}");
    }
    let delta = valid_snapshot_delta();
    for cut in 0..delta.len() {
        assert!(
            snapshot_delta::decode(&delta[..cut]).is_err(),
            "delta cut at {cut}"
        );
    }
    for bit in 0..delta.len() * 8 {
        let mut m = delta.clone();
        m[bit / 8] ^= 1 << (bit % 8);
        assert!(snapshot_delta::decode(&m).is_err(), "delta bit {bit}");
    }
    let m = valid_objects()[2].clone();
    for cut in 0..m.len() {
        assert!(
            Manifest::decode(&m[..cut]).is_err(),
            "manifest cut at {cut}"
        );
    }
    let rec = valid_objects()[5].clone();
    let h = RecordHeader::decode(&rec).unwrap();
    for bit in 0..rec.len() * 8 {
        let mut m = rec.clone();
        m[bit / 8] ^= 1 << (bit % 8);
        let ok = RecordHeader::decode(&m).is_some_and(|h2| h2.verify(&[2; 16], &m, &m[40..45]));
        assert!(
            !ok || m[..45] == rec[..45],
            "record bit {bit} accepted: {h:?}"
        );
    }
}

fn valid_host_record() -> Vec<u8> {
    use super::host_record::{HostRecord, HostState};
    HostRecord {
        id: "a".repeat(32),
        holder: "h:/d (aaaaaaaaaaaa)".into(),
        hostname: "h".into(),
        pid: 3,
        incarnation: "i".into(),
        renewed_unix_ms: 5,
        ttl_ms: 30_000,
        state: HostState::Alive,
        expired_by: None,
        control_socket: None,
        handover_requests: Vec::new(),
    }
    .encode()
    .to_vec()
}
