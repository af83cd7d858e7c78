//! `strata serve --metrics-listen`: `/metrics` scraped before, during and
//! after fio (randrw, then trims, through its libnbd engine), each scrape
//! checked by real parsers: `promtool check metrics` (Debian's
//! `prometheus`) on the classic text format, and Python's
//! `prometheus_client` OpenMetrics parser on what Prometheus asks for.
//! The counters must match what fio did request for request, never go
//! backwards, and carry no high-cardinality label.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use common::*;

const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0";
/// Label keys a strata series may have; anything else (an offset, an
/// object name, a client) would make series without bound.
const ALLOWED_LABELS: [&str; 7] = ["volume", "op", "tier", "reason", "state", "version", "le"];
/// Most samples one family may have on a server with one volume: the
/// largest is a latency histogram, 8 operations x (12 buckets + sum +
/// count).
const MAX_SAMPLES_PER_FAMILY: usize = 8 * 14;

#[test]
fn metrics_parse_and_follow_fio_request_for_request() {
    let _serial = serial();
    require_tools(&["fio", "promtool"]);
    let tmp = tempfile::TempDir::new().unwrap();
    let target = Target::strata_with(&["--metrics-listen", "127.0.0.1:0"]);
    let mut server = Server::start(tmp.path(), target, &[("vol", GIB)]);
    let addr = server.metrics_addr();
    check_other_requests(&addr);
    let before = wait_for_volume(&addr, tmp.path());
    assert_eq!(
        before.value("strata_nbd_requests_total", &vol_op("write")),
        0.0
    );

    let (fio, during) = run_fio_while_scraping(&server, &addr, tmp.path());
    let after = wait_for_uploads(&addr, tmp.path(), &before);
    let mut series = vec![before.clone()];
    series.extend(during);
    series.push(after.clone());
    for pair in series.windows(2) {
        assert_monotonic(&pair[0], &pair[1]);
    }
    for s in &series {
        assert_low_cardinality(s);
    }
    assert_nbd_matches_fio(&after, &fio);
    assert_store_and_volume(&after);

    server.cli_ok(&["snapshot", "create", "vol@m1"]);
    let snap = scrape(&addr, tmp.path());
    assert_eq!(snap.value("strata_snapshots_created_total", &vol()), 1.0);
    assert_eq!(snap.value("strata_volume_snapshots", &vol()), 1.0);
    server.assert_alive();
}

// ---------------------------------------------------------------------------
// The workload
// ---------------------------------------------------------------------------

/// What fio did, summed over its jobs.
#[derive(Debug, Default)]
struct FioTotals {
    reads: u64,
    read_bytes: u64,
    writes: u64,
    write_bytes: u64,
    trims: u64,
    trim_bytes: u64,
}

/// Runs fio (2 jobs of 4 KiB randrw over 32 MiB each, with a flush at the
/// end, then 64 KiB trims) and scrapes every 200 ms while it runs.
fn run_fio_while_scraping(server: &Server, addr: &str, dir: &Path) -> (FioTotals, Vec<Scrape>) {
    let uri = server.vol_uri();
    let args: Vec<String> = [
        "--ioengine=nbd",
        &format!("--uri={uri}"),
        "--name=randrw",
        "--rw=randrw",
        "--bs=4k",
        "--iodepth=16",
        "--numjobs=2",
        "--size=64m",
        "--offset_increment=64m",
        "--end_fsync=1",
        "--name=trim",
        "--stonewall",
        "--rw=randtrim",
        "--bs=64k",
        "--iodepth=4",
        "--numjobs=1",
        "--size=8m",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let fio_dir = dir.to_path_buf();
    let fio = thread::spawn(move || fio_json(&fio_dir, &args, Duration::from_secs(600)));
    let mut during = Vec::new();
    while !fio.is_finished() && during.len() < 300 {
        during.push(scrape(addr, dir));
        thread::sleep(Duration::from_millis(200));
    }
    let jobs = fio.join().expect("fio thread");
    eprintln!("scraped {} times while fio ran", during.len());
    let mut t = FioTotals::default();
    for job in &jobs {
        let n = |dir: &str, key: &str| job[dir][key].as_u64().unwrap();
        t.reads += n("read", "total_ios");
        t.read_bytes += n("read", "io_bytes");
        t.writes += n("write", "total_ios");
        t.write_bytes += n("write", "io_bytes");
        t.trims += n("trim", "total_ios");
        t.trim_bytes += n("trim", "io_bytes");
    }
    assert!(t.reads > 0 && t.writes > 0 && t.trims > 0, "{t:?}");
    (t, during)
}

/// Scrapes until the volume, opened in the background, has its series.
fn wait_for_volume(addr: &str, dir: &Path) -> Scrape {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let s = scrape(addr, dir);
        let epoch = ("strata_volume_lease_epoch".to_string(), vol_labels());
        if s.samples.contains_key(&epoch) {
            return s;
        }
        assert!(Instant::now() < deadline, "volume not open after 60 s");
        thread::sleep(Duration::from_millis(100));
    }
}

/// Scrapes until segments have reached the store (sealed when full, so
/// during fio; the age sealer uploads the rest within seconds).
fn wait_for_uploads(addr: &str, dir: &Path, before: &Scrape) -> Scrape {
    let deadline = Instant::now() + Duration::from_secs(120);
    let puts_before = before.value("strata_store_requests_total", &op("put"));
    loop {
        let s = scrape(addr, dir);
        let uploaded = s.value("strata_volume_uploaded_bytes_total", &vol());
        if uploaded > 0.0 && s.value("strata_store_requests_total", &op("put")) > puts_before {
            return s;
        }
        assert!(
            Instant::now() < deadline,
            "no segment uploaded 120 s after fio ended"
        );
        thread::sleep(Duration::from_millis(500));
    }
}

// ---------------------------------------------------------------------------
// Assertions
// ---------------------------------------------------------------------------

fn assert_nbd_matches_fio(s: &Scrape, fio: &FioTotals) {
    let requests = |o| s.value("strata_nbd_requests_total", &vol_op(o));
    let bytes = |o| s.value("strata_nbd_request_bytes_total", &vol_op(o));
    assert_eq!(requests("read"), fio.reads as f64, "NBD reads");
    assert_eq!(bytes("read"), fio.read_bytes as f64, "NBD bytes read");
    assert_eq!(requests("write"), fio.writes as f64, "NBD writes");
    assert_eq!(bytes("write"), fio.write_bytes as f64, "NBD bytes written");
    assert_eq!(requests("trim"), fio.trims as f64, "NBD trims");
    assert_eq!(bytes("trim"), fio.trim_bytes as f64, "NBD bytes trimmed");
    assert!(
        requests("flush") >= 2.0,
        "each randrw job ends with a flush"
    );
    for o in ["read", "write", "trim", "flush"] {
        assert_eq!(s.value("strata_nbd_request_errors_total", &vol_op(o)), 0.0);
        let count = s.value("strata_nbd_request_duration_seconds_count", &vol_op(o));
        assert_eq!(count, requests(o), "one latency sample per {o}");
        let inf = vol_op(o)
            .into_iter()
            .chain([("le", "+Inf")])
            .collect::<Vec<_>>();
        let all = s.value("strata_nbd_request_duration_seconds_bucket", &inf);
        assert_eq!(all, count, "the +Inf bucket holds every {o}");
        assert!(s.value("strata_nbd_request_duration_seconds_sum", &vol_op(o)) > 0.0);
    }
    assert!(s.value("strata_nbd_connections_accepted_total", &[]) >= 3.0);
}

fn assert_store_and_volume(s: &Scrape) {
    let put = op("put");
    assert!(s.value("strata_store_sent_bytes_total", &put) > 0.0);
    assert!(s.value("strata_store_request_duration_seconds_count", &put) > 0.0);
    // A fresh volume's start asks for objects that do not exist yet (its
    // lease, its manifest): answers, counted apart, never errors, so an
    // alert on the error counter does not fire at every start.
    for o in [
        "get",
        "get_range",
        "put",
        "delete",
        "head",
        "list",
        "copy",
        "other",
    ] {
        assert_eq!(
            s.value("strata_store_request_errors_total", &op(o)),
            0.0,
            "{o}"
        );
    }
    assert!(s.value("strata_store_not_found_total", &op("get")) >= 1.0);
    s.value("strata_store_condition_failed_total", &put);
    assert!(s.value("strata_volume_uploaded_segments_total", &vol()) > 0.0);
    assert!(s.value("strata_volume_mapped_bytes", &vol()) > 0.0);
    for tier in ["ram", "disk", "index"] {
        s.value("strata_cache_hits_total", &[("tier", tier)]);
        s.value("strata_cache_budget_bytes", &[("tier", tier)]);
    }
    let state = |st| {
        s.value(
            "strata_volume_lease_state",
            &[("volume", "vol"), ("state", st)],
        )
    };
    assert_eq!(state("valid"), 1.0);
    assert_eq!(state("fenced") + state("lapsed") + state("released"), 0.0);
    assert!(s.value("strata_volume_lease_epoch", &vol()) >= 1.0);
    for reason in ["write_buffer", "journal", "lease", "resize"] {
        let labels = [("volume", "vol"), ("reason", reason)];
        s.value("strata_volume_write_wait_seconds_total", &labels);
    }
    let version = [("version", env!("CARGO_PKG_VERSION"))];
    assert_eq!(s.value("strata_build_info", &version), 1.0);
}

/// Counters (and histogram counts, sums and buckets) never decrease
/// between two scrapes of one server.
fn assert_monotonic(earlier: &Scrape, later: &Scrape) {
    for (key, value) in &earlier.samples {
        let cumulative = earlier.counter_like(&key.0);
        if !cumulative {
            continue;
        }
        let now = later
            .samples
            .get(key)
            .unwrap_or_else(|| panic!("series {key:?} vanished"));
        assert!(now >= value, "{key:?} went from {value} to {now}");
    }
}

fn assert_low_cardinality(s: &Scrape) {
    let mut per_family: BTreeMap<&str, usize> = BTreeMap::new();
    for (name, labels) in s.samples.keys() {
        *per_family.entry(s.family_of(name)).or_default() += 1;
        for (k, v) in labels {
            assert!(
                ALLOWED_LABELS.contains(&k.as_str()),
                "{name} has label {k}={v}"
            );
            if k == "volume" {
                assert_eq!(v, "vol", "{name}: a volume label is a volume name");
            }
            assert!(!v.contains('/'), "{name}: {k}={v} looks like a path");
        }
    }
    for (family, n) in per_family {
        assert!(n <= MAX_SAMPLES_PER_FAMILY, "{family} has {n} samples");
    }
}

/// Anything but GET /metrics is refused.
fn check_other_requests(addr: &str) {
    let (status, _, _) = http(addr, "GET", "/", None);
    assert_eq!(status, 404);
    let (status, _, _) = http(addr, "GET", "/metrics/x", None);
    assert_eq!(status, 404);
    let (status, _, _) = http(addr, "POST", "/metrics", None);
    assert_eq!(status, 405);
}

// ---------------------------------------------------------------------------
// Scraping and parsing
// ---------------------------------------------------------------------------

type Key = (String, BTreeMap<String, String>);

/// One scrape, as Python's OpenMetrics parser read it.
#[derive(Debug, Clone)]
struct Scrape {
    /// Family name -> type.
    families: BTreeMap<String, String>,
    /// Sample name -> its family's name.
    family: BTreeMap<String, String>,
    samples: BTreeMap<Key, f64>,
}

impl Scrape {
    /// The value of the one sample `name` whose labels include `labels`.
    fn value(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        let found: Vec<f64> = self
            .samples
            .iter()
            .filter(|((n, l), _)| {
                n == name
                    && labels
                        .iter()
                        .all(|(k, v)| l.get(*k).map(String::as_str) == Some(v))
            })
            .map(|(_, v)| *v)
            .collect();
        assert_eq!(
            found.len(),
            1,
            "expected one sample {name} {labels:?}, found {found:?}"
        );
        found[0]
    }

    /// The family a sample belongs to, as the parser grouped them.
    fn family_of<'a>(&'a self, sample: &'a str) -> &'a str {
        self.family.get(sample).map_or(sample, String::as_str)
    }

    fn counter_like(&self, sample: &str) -> bool {
        let kind = self.families.get(self.family_of(sample));
        match kind.map(String::as_str) {
            Some("counter") => true,
            Some("histogram") => !sample.ends_with("_created"),
            _ => false,
        }
    }
}

/// Scrapes both formats: the classic one must pass `promtool check
/// metrics` and Python's classic parser; the OpenMetrics one Python's
/// OpenMetrics parser, which gives the samples returned.
fn scrape(addr: &str, dir: &Path) -> Scrape {
    let (status, content_type, classic) = http(addr, "GET", "/metrics", None);
    assert_eq!(status, 200);
    assert!(
        content_type.starts_with("text/plain; version=0.0.4"),
        "{content_type}"
    );
    promtool_check(&classic, dir);
    let classic_parsed = python_parse("classic", &classic);
    let (status, content_type, om) = http(addr, "GET", "/metrics", Some(OPENMETRICS));
    assert_eq!(status, 200);
    assert!(
        content_type.starts_with("application/openmetrics-text"),
        "{content_type}"
    );
    let parsed = python_parse("openmetrics", &om);
    let names = |s: &Scrape| s.samples.keys().cloned().collect::<BTreeSet<Key>>();
    let volumes = |s: &Scrape| {
        let labels = s.samples.keys().flat_map(|(_, l)| l.get("volume").cloned());
        labels.collect::<BTreeSet<String>>()
    };
    // Unless a volume opened between the two requests:
    if volumes(&classic_parsed) == volumes(&parsed) {
        assert_eq!(
            names(&classic_parsed),
            names(&parsed),
            "both formats hold the same series"
        );
    }
    parsed
}

fn promtool_check(text: &str, dir: &Path) {
    let file = dir.join("scrape.prom");
    std::fs::write(&file, text).unwrap();
    let input = Stdio::from(std::fs::File::open(&file).unwrap());
    let out = run_timeout_from(
        Command::new("promtool").args(["check", "metrics"]),
        input,
        Duration::from_secs(60),
    );
    assert!(
        out.status.success(),
        "promtool check metrics failed ({}):\n{}{}",
        out.status,
        stdout_str(&out),
        stderr_str(&out)
    );
}

/// Parses `text` with Python's prometheus_client (Debian's
/// python3-prometheus-client, in the system interpreter).
fn python_parse(format: &str, text: &str) -> Scrape {
    const SCRIPT: &str = r#"
import json, math, sys
fmt = sys.argv[1]
if fmt == "openmetrics":
    from prometheus_client.openmetrics.parser import text_string_to_metric_families
else:
    from prometheus_client.parser import text_string_to_metric_families
out = {"families": {}, "samples": []}
for f in text_string_to_metric_families(sys.stdin.read()):
    out["families"][f.name] = f.type
    for s in f.samples:
        v = s.value
        if isinstance(v, float) and math.isinf(v):
            v = str(v)
        out["samples"].append([s.name, s.labels, v, f.name])
print(json.dumps(out))
"#;
    let mut child = Command::new("/usr/bin/python3")
        .args(["-c", SCRIPT, format])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run /usr/bin/python3 (scripts/install-test-deps installs it)");
    let mut stdin = child.stdin.take().unwrap();
    let input = text.to_string();
    let writer = thread::spawn(move || stdin.write_all(input.as_bytes()));
    let out = child.wait_with_output().unwrap();
    writer.join().unwrap().unwrap();
    assert!(
        out.status.success(),
        "Python's {format} parser rejected the scrape: {}\n--- scrape ---\n{}",
        stderr_str(&out),
        &text[..text.len().min(4000)]
    );
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let families = json["families"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(k, v)| (k.clone(), v.as_str().unwrap().to_string()))
        .collect();
    let mut samples = BTreeMap::new();
    let mut family = BTreeMap::new();
    for s in json["samples"].as_array().unwrap() {
        let name = s[0].as_str().unwrap().to_string();
        family.insert(name, s[3].as_str().unwrap().to_string());
        let labels: BTreeMap<String, String> = s[1]
            .as_object()
            .unwrap()
            .iter()
            .map(|(k, v)| (k.clone(), v.as_str().unwrap().to_string()))
            .collect();
        let value = s[2].as_f64().unwrap_or(f64::INFINITY);
        let key = (s[0].as_str().unwrap().to_string(), labels);
        assert!(
            samples.insert(key.clone(), value).is_none(),
            "duplicate {key:?}"
        );
    }
    Scrape {
        families,
        family,
        samples,
    }
}

/// One HTTP/1.1 request; the server closes the connection after its
/// response. Returns the status, the content type and the body.
fn http(addr: &str, method: &str, path: &str, accept: Option<&str>) -> (u16, String, String) {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let accept = accept.map_or(String::new(), |a| format!("Accept: {a}\r\n"));
    let request =
        format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\n{accept}Content-Length: 0\r\n\r\n");
    stream.write_all(request.as_bytes()).unwrap();
    let mut response = Vec::new();
    stream.read_to_end(&mut response).unwrap();
    let response = String::from_utf8(response).unwrap();
    let (head, body) = response.split_once("\r\n\r\n").unwrap();
    let status = head.split(' ').nth(1).unwrap().parse().unwrap();
    let content_type = head
        .lines()
        .find_map(|l| {
            l.to_ascii_lowercase()
                .strip_prefix("content-type: ")
                .map(str::to_string)
        })
        .unwrap_or_default();
    (status, content_type, body.to_string())
}

fn vol_labels() -> BTreeMap<String, String> {
    BTreeMap::from([("volume".to_string(), "vol".to_string())])
}

fn vol() -> Vec<(&'static str, &'static str)> {
    vec![("volume", "vol")]
}

fn op(op: &'static str) -> Vec<(&'static str, &'static str)> {
    vec![("op", op)]
}

fn vol_op(op: &'static str) -> Vec<(&'static str, &'static str)> {
    vec![("volume", "vol"), ("op", op)]
}
