//! strata-test-store: starts one of the test kit's S3 stores on 127.0.0.1
//! and keeps it up until SIGTERM or SIGINT, so several test processes (and
//! the bench) share one instead of each starting its own.

use std::io::Write;
use std::process::ExitCode;

use strata_testkit::{S3Impl, S3Service, SeaweedCluster};

const USAGE: &str = "usage: strata-test-store seaweedfs";

const HELP: &str = "\
Starts a test store on 127.0.0.1 with the test credentials (see
strata_testkit) and keeps it up until SIGTERM or SIGINT; then stops every
process of it and removes its data.

  seaweedfs   a SeaweedFS cluster: master, three volume servers with
              replication 001, filer, S3 gateway (about 15 s to start: a
              fresh filer holds its announcement to the master for 10 s)

Prints `endpoint http://127.0.0.1:PORT` on stdout once the store has stored
an object. scripts/test starts one and exports
STRATA_TEST_SEAWEEDFS_ENDPOINT, which the test kit's shared SeaweedFS then
uses instead of starting one per test process.";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "-h" || a == "--help") {
        println!("{USAGE}\n\n{HELP}");
        return ExitCode::SUCCESS;
    }
    if args.len() != 1 || S3Impl::parse(&args[0]) != Some(S3Impl::Seaweedfs) {
        eprintln!("strata-test-store: expected one argument, seaweedfs\n{USAGE}");
        return ExitCode::from(2);
    }
    // Before any thread starts: every thread inherits the mask.
    if let Err(e) = strata_testkit::stop_signal::block_stop_signals() {
        eprintln!("strata-test-store: {e}");
        return ExitCode::FAILURE;
    }
    // Panics (with the logs' tails) when the cluster does not start.
    let store = SeaweedCluster::start();
    let mut out = std::io::stdout();
    if writeln!(out, "endpoint {}", S3Service::endpoint(&store))
        .and_then(|()| out.flush())
        .is_err()
    {
        eprintln!("strata-test-store: cannot write to stdout");
        return ExitCode::FAILURE;
    }
    let sig = strata_testkit::stop_signal::wait_for_stop_signal();
    eprintln!("strata-test-store: signal {sig}: stopping");
    drop(store);
    ExitCode::SUCCESS
}
