//! The 4-node EC:2 cluster: survives one node dying, heals when it returns.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use strata_testkit::MinioCluster;

#[test]
fn cluster_serves_reads_and_writes_with_a_node_down() {
    let cluster = MinioCluster::start();
    assert_eq!(cluster.endpoint(), "http://127.0.0.1:9001");
    let bucket = cluster.fresh_bucket();
    let before: Vec<u8> = (0..300_000u32).map(|i| (i * 7 % 256) as u8).collect();
    cluster.put_object(&bucket, "before", &before);

    cluster.kill_node(3);
    assert_eq!(
        cluster.health(3),
        None,
        "node 3 still answers after being killed"
    );
    // 2 data + 2 parity: reads need 2 drives, writes 3; 3 are left.
    assert!(
        cluster.get_object(&bucket, "before") == before,
        "object written before the kill changed"
    );
    let during: Vec<u8> = (0..200_000u32).map(|i| (i * 13 % 256) as u8).collect();
    cluster.put_object(&bucket, "during", &during);
    assert!(
        cluster.get_object(&bucket, "during") == during,
        "object written with node 3 down changed"
    );
    // Node 2 serves the same data as node 1.
    assert_eq!(
        cluster.health(2),
        Some(200),
        "node 2 reports the cluster unhealthy with one node down"
    );

    cluster.restart_node(3);
    for n in 1..=4 {
        assert_eq!(
            cluster.health(n),
            Some(200),
            "node {n} not healthy after node 3 came back"
        );
    }
    assert!(
        cluster.get_object(&bucket, "before") == before,
        "object 'before' changed after restart"
    );
    assert!(
        cluster.get_object(&bucket, "during") == during,
        "object 'during' changed after restart"
    );

    let env: std::collections::HashMap<String, String> = cluster.client_env().into_iter().collect();
    assert_eq!(env["AWS_ENDPOINT_URL"], "http://127.0.0.1:9001");
}
