//! The SeaweedFS cluster: serves S3 with the test credentials, keeps every
//! object readable and writable with one volume server dead (each chunk
//! has a copy on another server), and takes the server back.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use strata_testkit::{S3Impl, SeaweedCluster, VOLUME_SERVERS};

#[test]
fn cluster_serves_reads_and_writes_with_a_volume_server_down() {
    let cluster = SeaweedCluster::start();
    assert_eq!(cluster.live_volume_servers().len(), VOLUME_SERVERS);
    let bucket = cluster.fresh_bucket();
    // Several objects, so the bucket's volumes (and so both copies) spread
    // over the servers: whichever dies holds a copy of some of them.
    let objects: Vec<(String, Vec<u8>)> = (0..12u32)
        .map(|n| {
            let data = (0..300_000u32).map(|i| ((i * 7 + n) % 251) as u8).collect();
            (format!("before/{n}"), data)
        })
        .collect();
    for (key, data) in &objects {
        cluster.put_object(&bucket, key, data);
    }

    cluster.kill_volume_server(2);
    for (key, data) in &objects {
        assert!(
            cluster.get_object(&bucket, key) == *data,
            "{key} changed or unreadable with volume server 2 down"
        );
    }
    let during: Vec<u8> = (0..200_000u32).map(|i| (i * 13 % 256) as u8).collect();
    cluster.put_object(&bucket, "during", &during);
    assert!(cluster.get_object(&bucket, "during") == during);
    assert_eq!(
        cluster.live_volume_servers().len(),
        VOLUME_SERVERS - 1,
        "the master still lists the killed volume server"
    );

    cluster.restart_volume_server(2);
    assert_eq!(cluster.live_volume_servers().len(), VOLUME_SERVERS);
    for (key, data) in &objects {
        assert!(
            cluster.get_object(&bucket, key) == *data,
            "{key} after restart"
        );
    }
    let env: std::collections::HashMap<String, String> = cluster.client_env().into_iter().collect();
    assert_eq!(env["AWS_ENDPOINT_URL"], cluster.endpoint());
}

#[test]
fn the_suites_pick_their_store_by_name() {
    assert_eq!(S3Impl::parse(""), Some(S3Impl::Minio));
    assert_eq!(S3Impl::parse("seaweedfs"), Some(S3Impl::Seaweedfs));
    assert_eq!(S3Impl::parse("garage"), None);
    for i in S3Impl::ALL {
        assert_eq!(S3Impl::parse(i.name()), Some(i));
    }
}
