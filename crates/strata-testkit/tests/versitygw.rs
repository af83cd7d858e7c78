//! The versitygw gateway: serves S3 with the test credentials, objects
//! round-trip, and buckets keep tests apart.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use strata_testkit::{S3Service, VersitygwServer};

#[test]
fn gateway_stores_and_returns_objects() {
    let server = VersitygwServer::start();
    let a = server.fresh_bucket();
    let b = server.fresh_bucket();
    assert_ne!(a, b);
    let data: Vec<u8> = (0..300_000u32).map(|i| (i * 7 % 251) as u8).collect();
    server.put_object(&a, "dir/object", &data);
    assert!(server.get_object(&a, "dir/object") == data);
    server.put_object(&b, "dir/object", b"other");
    assert_eq!(server.get_object(&b, "dir/object"), b"other");
    assert!(
        server.get_object(&a, "dir/object") == data,
        "buckets are apart"
    );
    let env: std::collections::HashMap<String, String> = server.client_env().into_iter().collect();
    assert_eq!(env["AWS_ENDPOINT_URL"], server.endpoint());
}
