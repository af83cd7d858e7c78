//! The SeaweedFS cluster the S3 suites share: serves S3 with the test
//! credentials, objects round-trip, buckets keep tests apart. (Killing and
//! restarting its volume servers under a client is
//! `crates/strata/tests/s3_seaweedfs.rs`, on a cluster of its own.)
#![allow(clippy::unwrap_used, clippy::expect_used)]

use strata_testkit::S3Impl;

#[test]
fn the_shared_cluster_stores_and_returns_objects() {
    let store = S3Impl::Seaweedfs.shared();
    assert_eq!(store.implementation(), S3Impl::Seaweedfs);
    let a = store.fresh_bucket();
    let b = store.fresh_bucket();
    assert_ne!(a, b);
    let data: Vec<u8> = (0..300_000u32).map(|i| (i * 7 % 251) as u8).collect();
    store.put_object(&a, "dir/object", &data);
    assert!(store.get_object(&a, "dir/object") == data);
    store.put_object(&b, "dir/object", b"other");
    assert_eq!(store.get_object(&b, "dir/object"), b"other");
    assert!(
        store.get_object(&a, "dir/object") == data,
        "buckets are apart"
    );
    let env: std::collections::HashMap<String, String> = store.client_env().into_iter().collect();
    assert_eq!(env["AWS_ENDPOINT_URL"], store.endpoint());
}

#[test]
fn the_suites_pick_their_store_by_name() {
    assert_eq!(S3Impl::parse(""), Some(S3Impl::Minio));
    assert_eq!(S3Impl::parse("seaweedfs"), Some(S3Impl::Seaweedfs));
    assert_eq!(S3Impl::parse("versitygw"), Some(S3Impl::Versitygw));
    assert_eq!(S3Impl::parse("garage"), None);
    for i in S3Impl::ALL {
        assert_eq!(S3Impl::parse(i.name()), Some(i));
    }
}
