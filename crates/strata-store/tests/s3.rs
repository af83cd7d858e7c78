//! The S3 store against a real MinIO on 127.0.0.1: conditional writes (the
//! lease and the manifest depend on them), HTTP/2 when the server offers it
//! (TLS), connection reuse over plain HTTP, and clear errors.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;

use bytes::Bytes;
use object_store::path::Path;
use object_store::{PutPayload, UpdateVersion};
use strata_store::{LayerConfig, Store};
use strata_testkit::MinioServer;

async fn store_on(minio: &MinioServer, bucket: &str, params: &str) -> Store {
    let env: HashMap<String, String> = minio.client_env().into_iter().collect();
    let lookup = |k: &str| env.get(k).cloned();
    Store::s3(
        &format!("s3://{bucket}/t{params}"),
        &lookup,
        &LayerConfig::default(),
    )
    .await
    .unwrap()
}

fn payload(s: &str) -> PutPayload {
    PutPayload::from(Bytes::from(s.to_string()))
}

#[tokio::test]
async fn conditional_writes_are_enforced_by_the_server() {
    let minio = MinioServer::shared();
    let store = store_on(minio, &minio.fresh_bucket(), "").await;
    let p = Path::from("lease");
    let v1 = store.put_if(&p, payload("one"), None).await.unwrap();
    let err = store.put_if(&p, payload("two"), None).await.unwrap_err();
    assert!(
        matches!(err, object_store::Error::AlreadyExists { .. }),
        "If-None-Match on an existing object: {err}"
    );
    let v2 = store.put_if(&p, payload("three"), Some(&v1)).await.unwrap();
    assert_ne!(v1.e_tag, v2.e_tag);
    let err = store
        .put_if(&p, payload("four"), Some(&v1))
        .await
        .unwrap_err();
    assert!(
        matches!(err, object_store::Error::Precondition { .. }),
        "If-Match with a stale version: {err}"
    );
    let (bytes, v) = store.get_versioned(&p).await.unwrap().unwrap();
    assert_eq!(&bytes[..], b"three");
    assert_eq!(v.e_tag, v2.e_tag);
    let bogus = UpdateVersion {
        e_tag: Some("\"0000\"".into()),
        version: None,
    };
    assert!(store.put_if(&p, payload("x"), Some(&bogus)).await.is_err());
    assert!(store
        .get_versioned(&Path::from("absent"))
        .await
        .unwrap()
        .is_none());
}

/// Established TCP connections from this process to `port`.
fn connections_to(port: u16) -> usize {
    let text = std::fs::read_to_string("/proc/self/net/tcp").unwrap();
    text.lines()
        .skip(1)
        .filter(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let remote_port = f[2].rsplit(':').next().unwrap();
            u16::from_str_radix(remote_port, 16).unwrap() == port && f[3] == "01"
        })
        .count()
}

#[tokio::test]
async fn plain_http_reuses_one_connection() {
    let minio = MinioServer::shared();
    let store = store_on(minio, &minio.fresh_bucket(), "").await;
    for i in 0..200 {
        let p = Path::from(format!("o/{i}"));
        store
            .put_opts(&p, payload("x"), Default::default())
            .await
            .unwrap();
        store.get_range(&p, 0..1).await.unwrap();
    }
    let conns = connections_to(minio.port());
    assert!(
        (1..=2).contains(&conns),
        "400 sequential requests used {conns} connections"
    );
    let http = store.stats().http.unwrap();
    // MinIO has no cleartext HTTP/2 (h2c): HTTP/1.1 with keep-alive.
    assert!(http.http1_responses >= 400, "{http:?}");
    assert_eq!(http.http2_responses, 0, "{http:?}");
}

#[tokio::test]
async fn tls_endpoint_is_spoken_over_http2() {
    let minio = MinioServer::start_tls();
    let bucket = minio.fresh_bucket();
    let store = store_on(&minio, &bucket, "").await;
    for i in 0..50 {
        let p = Path::from(format!("o/{i}"));
        store
            .put_opts(&p, payload("x"), Default::default())
            .await
            .unwrap();
        assert_eq!(&store.get_range(&p, 0..1).await.unwrap()[..], b"x");
    }
    let http = store.stats().http.unwrap();
    assert!(http.http2_responses >= 100, "{http:?}");
    assert_eq!(http.http1_responses, 0, "{http:?}");
    // Concurrent requests share the one HTTP/2 connection.
    let puts = (0..32).map(|i| {
        let store = store.clone();
        async move {
            let p = Path::from(format!("c/{i}"));
            store.put_opts(&p, payload("y"), Default::default()).await
        }
    });
    for r in futures::future::join_all(puts).await {
        r.unwrap();
    }
    assert_eq!(connections_to(minio.port()), 1);
    // Forcing HTTP/1.1 works too, and is what gets counted.
    let h1 = store_on(&minio, &bucket, "?http=1.1").await;
    h1.get_range(&Path::from("o/1"), 0..1).await.unwrap();
    let http = h1.stats().http.unwrap();
    assert!(
        http.http1_responses >= 1 && http.http2_responses == 0,
        "{http:?}"
    );
}

#[tokio::test]
async fn wrong_credentials_and_missing_buckets_are_clear_errors() {
    let minio = MinioServer::shared();
    let mut env: HashMap<String, String> = minio.client_env().into_iter().collect();
    env.insert("AWS_SECRET_ACCESS_KEY".into(), "wrong-secret".into());
    let lookup = |k: &str| env.get(k).cloned();
    let bucket = minio.fresh_bucket();
    let store = Store::s3(&format!("s3://{bucket}"), &lookup, &LayerConfig::default())
        .await
        .unwrap();
    let err = store
        .put_opts(&Path::from("x"), payload("x"), Default::default())
        .await
        .unwrap_err();
    assert!(!strata_store::is_transient(&err), "retried: {err}");
    let err = strata_store::error_text(&err);
    assert!(!err.contains("wrong-secret"), "secret leaked: {err}");
    assert!(
        err.contains("403 SignatureDoesNotMatch")
            && err.contains("the secret access key from the environment does not belong"),
        "{err}"
    );
    let good = store_on(minio, "no-such-bucket-here", "").await;
    let err = good
        .put_opts(&Path::from("x"), payload("x"), Default::default())
        .await
        .unwrap_err();
    assert!(!strata_store::is_transient(&err), "retried: {err}");
    let err = strata_store::error_text(&err);
    assert!(
        err.starts_with("bucket \"no-such-bucket-here\" does not exist at http://127.0.0.1:"),
        "{err}"
    );
}

/// The `x-amz-content-sha256` header of the first PUT a store configured
/// with `params` sends to a loopback listener that answers every request
/// with a 400 (what goes on the wire, not what the config says).
async fn content_sha256_sent(params: &str) -> String {
    use std::io::{BufRead, BufReader, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { return };
            let mut reader = BufReader::new(conn.try_clone().unwrap());
            let mut line = String::new();
            while reader.read_line(&mut line).is_ok_and(|n| n > 0) && line != "\r\n" {
                if let Some((name, value)) = line.split_once(':') {
                    if name.eq_ignore_ascii_case("x-amz-content-sha256") {
                        let _ = tx.send(value.trim().to_string());
                    }
                }
                line.clear();
            }
            let body = "<Error><Code>InvalidRequest</Code></Error>";
            let _ = write!(
                conn,
                "HTTP/1.1 400 Bad Request\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    let env: HashMap<String, String> = [
        ("AWS_ACCESS_KEY_ID", "k"),
        ("AWS_SECRET_ACCESS_KEY", "s"),
        ("AWS_EC2_METADATA_DISABLED", "true"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    let lookup = |k: &str| env.get(k).cloned();
    let url = format!("s3://bucket/t?endpoint=http://127.0.0.1:{port}{params}");
    let store = Store::s3(&url, &lookup, &LayerConfig::default())
        .await
        .unwrap();
    let _ = store
        .put_opts(&Path::from("x"), payload("data"), Default::default())
        .await;
    rx.recv_timeout(std::time::Duration::from_secs(10)).unwrap()
}

#[tokio::test]
async fn payload_signing_is_on_over_plain_http_unless_turned_off() {
    let signed = content_sha256_sent("").await;
    assert!(
        signed.len() == 64 && signed.bytes().all(|b| b.is_ascii_hexdigit()),
        "plain HTTP signs the payload by default: {signed}"
    );
    assert_eq!(
        content_sha256_sent("&payload=unsigned").await,
        "UNSIGNED-PAYLOAD"
    );
    assert_eq!(content_sha256_sent("&payload=signed").await, signed);
    // MinIO takes both (over TLS, `auto` is unsigned: the TLS test's PUTs).
    let minio = MinioServer::shared();
    let bucket = minio.fresh_bucket();
    let data = Bytes::from(vec![7u8; 1 << 20]);
    for params in ["?payload=unsigned", "?payload=signed"] {
        let store = store_on(minio, &bucket, params).await;
        let p = Path::from(format!("big{params}"));
        store
            .put_opts(&p, PutPayload::from(data.clone()), Default::default())
            .await
            .unwrap();
        assert_eq!(store.get_range(&p, 0..(1 << 20)).await.unwrap(), data);
    }
}
