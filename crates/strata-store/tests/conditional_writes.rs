//! The conditional-write probe against real stores and simulated bad ones:
//! MinIO (strata-testkit), the embedded directory store and memory:// are
//! accepted; a store that ignores If-None-Match or If-Match (the fault
//! layer's `ignore_if_none_match` / `ignore_if_match`, each on its own) is
//! found out and named; the probe leaves nothing behind and survives lost
//! replies; its verdict is remembered in `.strata-store-check`, so a second
//! check costs one GET and no probe.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;

use bytes::Bytes;
use object_store::path::Path;
use object_store::PutPayload;
use strata_store::{
    probe_conditional_writes, remembered_or_probed, Condition, FaultConfig, LayerConfig,
    ProbeReport, Store, Verdict, VerdictSource, PROBE_PREFIX, STORE_CHECK_OBJECT,
};
use strata_testkit::{MinioServer, S3Impl};

fn layers(faults: &str) -> LayerConfig {
    LayerConfig {
        faults: (!faults.is_empty()).then(|| FaultConfig::parse(faults).unwrap()),
        ..LayerConfig::default()
    }
}

async fn minio_store(faults: &str) -> Store {
    let minio = MinioServer::shared();
    let env: HashMap<String, String> = minio.client_env().into_iter().collect();
    let lookup = |k: &str| env.get(k).cloned();
    let spec = format!("s3://{}/p", minio.fresh_bucket());
    Store::s3(&spec, &lookup, &layers(faults)).await.unwrap()
}

/// A store in a fresh bucket of the shared server of `implementation`.
async fn s3_store(implementation: S3Impl) -> Store {
    let (env, bucket) = tokio::task::spawn_blocking(move || {
        let server = implementation.shared();
        (server.client_env(), server.fresh_bucket())
    })
    .await
    .unwrap();
    let env: HashMap<String, String> = env.into_iter().collect();
    let lookup = |k: &str| env.get(k).cloned();
    let spec = format!("s3://{bucket}/p");
    Store::s3(&spec, &lookup, &layers("")).await.unwrap()
}

/// Objects left under the probe's prefix.
async fn leftovers(store: &Store) -> Vec<String> {
    let listed = store.list_all(&Path::from(PROBE_PREFIX)).await.unwrap();
    listed.into_iter().map(|m| m.location.to_string()).collect()
}

fn assert_safe(report: &ProbeReport) {
    assert!(report.is_safe(), "{report:#?}");
    assert_eq!(report.shortcoming(), None);
}

/// The report finds exactly `missing`, as ignored, and says so in one line.
fn assert_ignores(report: &ProbeReport, missing: Condition) {
    assert_eq!(report.missing(), [missing], "{report:#?}");
    let (_, check) = report
        .checks()
        .into_iter()
        .find(|(c, _)| *c == missing)
        .unwrap();
    assert_eq!(check.verdict, Verdict::Ignored, "{report:#?}");
    let line = report.shortcoming().unwrap();
    assert!(
        line.contains(&format!("ignores {}", missing.feature())),
        "{line}"
    );
    assert!(line.contains(&report.store), "{line}");
    assert!(!line.contains('\n'), "{line}");
}

#[tokio::test]
async fn minio_enforces_both_conditions() {
    let store = minio_store("").await;
    let report = probe_conditional_writes(&store).await.unwrap();
    assert_safe(&report);
    assert!(report.if_match.detail.contains("ETag"), "{report:#?}");
    assert_eq!(leftovers(&store).await, Vec::<String>::new());
}

/// The probe decides whether the suites may run on a store: every S3
/// implementation the suites run on must pass it (a release that stops
/// enforcing a condition fails here, with what it lacks).
#[tokio::test]
async fn every_s3_implementation_of_the_suite_enforces_both_conditions() {
    for implementation in S3Impl::ALL {
        let store = s3_store(implementation).await;
        let report = probe_conditional_writes(&store).await.unwrap();
        assert!(report.is_safe(), "{}: {report:#?}", implementation.name());
        assert_eq!(
            leftovers(&store).await,
            Vec::<String>::new(),
            "{}",
            implementation.name()
        );
    }
}

#[tokio::test]
async fn minio_behind_a_layer_that_ignores_the_headers_is_refused() {
    let report = probe_conditional_writes(&minio_store("ignore_if_none_match=1").await)
        .await
        .unwrap();
    assert_ignores(&report, Condition::IfNoneMatch);
    let report = probe_conditional_writes(&minio_store("ignore_if_match=1").await)
        .await
        .unwrap();
    assert_ignores(&report, Condition::IfMatch);
    let store = minio_store("ignore_conditions=1").await;
    let report = probe_conditional_writes(&store).await.unwrap();
    assert_eq!(
        report.missing(),
        [Condition::IfNoneMatch, Condition::IfMatch]
    );
    assert_eq!(leftovers(&store).await, Vec::<String>::new());
}

#[tokio::test]
async fn memory_store_enforces_both_and_each_ignored_condition_is_named() {
    assert_safe(&probe_conditional_writes(&Store::in_memory()).await.unwrap());
    let store = Store::in_memory_with(&layers("ignore_if_none_match=1"));
    assert_ignores(
        &probe_conditional_writes(&store).await.unwrap(),
        Condition::IfNoneMatch,
    );
    assert_eq!(leftovers(&store).await, Vec::<String>::new());
    let store = Store::in_memory_with(&layers("ignore_if_match=1"));
    assert_ignores(
        &probe_conditional_writes(&store).await.unwrap(),
        Condition::IfMatch,
    );
    assert_eq!(leftovers(&store).await, Vec::<String>::new());
}

/// The embedded store: create-only is the filesystem's link, If-Match is
/// strata's compare-and-swap under flock. A store below it that ignores
/// If-Match changes nothing (the lock does not rely on it); one that turns
/// create-only writes into overwrites is refused.
#[tokio::test]
async fn local_store_is_safe_by_link_and_flock() {
    let tmp = tempfile::tempdir().unwrap();
    let store = Store::local(tmp.path()).unwrap();
    let report = probe_conditional_writes(&store).await.unwrap();
    assert_safe(&report);
    assert!(report.if_match.detail.contains("flock"), "{report:#?}");
    assert_eq!(leftovers(&store).await, Vec::<String>::new());

    let store = Store::local_with(tmp.path(), &layers("ignore_if_match=1")).unwrap();
    assert_safe(&probe_conditional_writes(&store).await.unwrap());
    let store = Store::local_with(tmp.path(), &layers("ignore_if_none_match=1")).unwrap();
    let report = probe_conditional_writes(&store).await.unwrap();
    assert_ignores(&report, Condition::IfNoneMatch);
    assert_eq!(leftovers(&store).await, Vec::<String>::new());
}

/// A probe that fails midway (the third request fails and is not retried)
/// is an error naming the step, not a verdict, and still deletes what it
/// wrote; stopped at its first PUT, it deletes only that object.
#[tokio::test]
async fn a_failing_probe_is_an_error_and_cleans_up() {
    let once = |faults: &str| LayerConfig {
        retry: strata_store::RetryPolicy {
            max_attempts: 1,
            ..Default::default()
        },
        ..layers(faults)
    };
    let store = Store::in_memory_with(&once("fail_nth=3"));
    let error = probe_conditional_writes(&store).await.unwrap_err();
    let message = error.to_string();
    assert!(
        message.contains("read back") && message.contains("injected fault"),
        "{message}"
    );
    assert_eq!(leftovers(&store).await, Vec::<String>::new());

    let store = Store::in_memory_with(&once("error_rate=1"));
    let error = probe_conditional_writes(&store).await.unwrap_err();
    assert!(error.to_string().contains("create-only PUT"), "{error}");
    let requests = store.stats().layers.requests;
    assert_eq!((requests.put.requests, requests.delete.requests), (1, 1));
}

/// Replies lost after the store acted make an expected success come back
/// as AlreadyExists / Precondition on the retry; the probe must see its
/// own write there, not a broken store. Paused time: backoff passes at once.
#[tokio::test(start_paused = true)]
async fn lost_replies_do_not_make_a_good_store_look_bad() {
    let mut lost = 0;
    for seed in 0..40 {
        let store = Store::in_memory_with(&layers(&format!("lost_reply_rate=0.3,seed={seed}")));
        let report = probe_conditional_writes(&store).await.unwrap();
        assert_safe(&report);
        lost += store.stats().layers.faults.unwrap().lost_replies;
    }
    assert!(lost > 20, "the test must lose replies: {lost}");
}

#[tokio::test]
async fn the_verdict_is_remembered_and_a_second_check_does_not_probe() {
    let tmp = tempfile::tempdir().unwrap();
    let store = Store::local(tmp.path()).unwrap();
    let (first, source) = remembered_or_probed(&store).await.unwrap();
    assert_eq!(source, VerdictSource::Probed);
    assert!(first.report.is_safe());
    assert_eq!(first.strata_version, env!("CARGO_PKG_VERSION"));
    assert!(tmp.path().join(STORE_CHECK_OBJECT).is_file());

    let before = store.stats().layers.requests;
    let (second, source) = remembered_or_probed(&store).await.unwrap();
    let after = store.stats().layers.requests;
    assert_eq!(source, VerdictSource::Remembered);
    assert_eq!(second, first);
    assert_eq!(after.put.requests, before.put.requests, "no probe writes");
    assert_eq!(after.get.requests, before.get.requests + 1, "one GET");
    assert_eq!(after.delete.requests, before.delete.requests);

    // Another strata process on the same directory uses the record too.
    let again = Store::local(tmp.path()).unwrap();
    assert_eq!(
        remembered_or_probed(&again).await.unwrap().1,
        VerdictSource::Remembered
    );
}

/// A refusal is remembered too (until `strata store check` probes again);
/// a record that is not one, or was made for another store, is ignored.
#[tokio::test]
async fn bad_verdicts_are_remembered_and_bad_records_ignored() {
    let store = Store::in_memory_with(&layers("ignore_if_match=1"));
    let (record, source) = remembered_or_probed(&store).await.unwrap();
    assert_eq!(
        (source, record.report.missing()),
        (VerdictSource::Probed, vec![Condition::IfMatch])
    );
    let (again, source) = remembered_or_probed(&store).await.unwrap();
    assert_eq!((source, again), (VerdictSource::Remembered, record.clone()));

    let path = Path::from(STORE_CHECK_OBJECT);
    let put = |body: Vec<u8>| {
        let store = store.clone();
        let path = path.clone();
        async move {
            store
                .put_opts(
                    &path,
                    PutPayload::from(Bytes::from(body)),
                    Default::default(),
                )
                .await
                .unwrap();
        }
    };
    for garbage in [b"not json".to_vec(), vec![b' '; 70 * 1024]] {
        put(garbage).await;
        assert_eq!(
            remembered_or_probed(&store).await.unwrap().1,
            VerdictSource::Probed
        );
    }
    let mut elsewhere = record;
    elsewhere.report.store = "s3://other/p (endpoint http://127.0.0.1:1, region us-east-1)".into();
    put(serde_json::to_vec(&elsewhere).unwrap()).await;
    let (reprobed, source) = remembered_or_probed(&store).await.unwrap();
    assert_eq!(source, VerdictSource::Probed);
    assert_eq!(reprobed.report.store, "memory://");
}
