//! Single-node MinIO over plain http: private and shared servers, bucket
//! isolation, object round trips, and that a server dies with its guard.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use strata_testkit::MinioServer;

/// Every byte value, then a pseudo-random MiB: catches any text mangling
/// between curl, the pipe and MinIO.
fn test_bytes() -> Vec<u8> {
    let mut data: Vec<u8> = (0..=255).collect();
    let mut x: u32 = 0x1234_5678;
    data.extend((0..1 << 20).map(|_| {
        x = x.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
        (x >> 24) as u8
    }));
    data
}

fn process_alive(pid: u32) -> bool {
    // Signal 0 checks existence; a reaped child is gone.
    unsafe { libc::kill(pid as libc::pid_t, 0) == 0 }
}

#[test]
fn private_server_round_trips_an_object_and_dies_on_drop() {
    let server = MinioServer::start();
    assert!(
        server.endpoint().starts_with("http://127.0.0.1:"),
        "endpoint {}",
        server.endpoint()
    );
    assert_eq!(
        server.endpoint(),
        format!("http://127.0.0.1:{}", server.port())
    );

    let bucket = server.fresh_bucket();
    let data = test_bytes();
    server.put_object(&bucket, "dir/object", &data);
    let back = server.get_object(&bucket, "dir/object");
    assert!(
        back == data,
        "GET returned {} bytes, PUT stored {} (or contents differ)",
        back.len(),
        data.len()
    );

    let pid = server.pid().expect("server has a process");
    let data_dir = server.log_path().parent().unwrap().to_path_buf();
    assert!(
        process_alive(pid),
        "minio pid {pid} not running while its guard lives"
    );
    drop(server);
    assert!(!process_alive(pid), "minio pid {pid} survived its guard");
    assert!(
        !data_dir.exists(),
        "{} survived the guard",
        data_dir.display()
    );
}

#[test]
fn shared_server_outlives_the_thread_that_started_it() {
    // PDEATHSIG fires when the forking thread exits: starting the shared
    // server from a thread that then ends must not kill it.
    let endpoint = std::thread::spawn(|| MinioServer::shared().endpoint())
        .join()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(500));
    let server = MinioServer::shared();
    assert_eq!(
        server.endpoint(),
        endpoint,
        "shared() started a second server"
    );
    let bucket = server.fresh_bucket();
    server.put_object(&bucket, "k", b"still here");
    assert_eq!(server.get_object(&bucket, "k"), b"still here");
}

#[test]
fn shared_server_buckets_isolate_tests() {
    let server = MinioServer::shared();
    let a = server.fresh_bucket();
    let b = server.fresh_bucket();
    assert_ne!(a, b, "fresh_bucket repeated a name");
    server.put_object(&a, "same-key", b"in a");
    server.put_object(&b, "same-key", b"in b");
    assert_eq!(server.get_object(&a, "same-key"), b"in a");
    assert_eq!(server.get_object(&b, "same-key"), b"in b");
}

#[test]
fn create_bucket_by_name_and_missing_key_panics() {
    let server = MinioServer::shared();
    let name = format!("named-bucket-{}", std::process::id());
    server.create_bucket(&name);
    server.put_object(&name, "x", b"1");
    let missing = std::panic::catch_unwind(|| server.get_object(&name, "no-such-key"));
    let message = missing.expect_err("GET of a missing key succeeded");
    let message = message
        .downcast_ref::<String>()
        .cloned()
        .unwrap_or_default();
    assert!(
        message.contains("NoSuchKey"),
        "panic message lacks MinIO's error: {message}"
    );
}

#[test]
fn client_env_names_endpoint_and_credentials() {
    let server = MinioServer::shared();
    let env: std::collections::HashMap<String, String> = server.client_env().into_iter().collect();
    assert_eq!(env["AWS_ENDPOINT_URL"], server.endpoint());
    assert_eq!(env["AWS_ACCESS_KEY_ID"], server.access_key());
    assert_eq!(env["AWS_SECRET_ACCESS_KEY"], server.secret_key());
    assert_eq!(env["AWS_REGION"], "us-east-1");
    assert_eq!(env["AWS_ALLOW_HTTP"], "true");
    assert!(
        !env.contains_key("AWS_CA_BUNDLE"),
        "plain http server names a CA bundle"
    );
}
