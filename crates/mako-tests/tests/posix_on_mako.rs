//! The full POSIX conformance suite (`mako_tests::posix`) on a real Mako mount.
//!
//! Proves: through the FUSE mount of a freshly created one-node cluster (4 disks of 2G,
//! pagepool 256M) every POSIX check — namespace, I/O, attributes, permissions, xattrs,
//! locks, directories — passes (no failures; skips only where the check itself says it needs
//! something this machine lacks). The report is printed either way.

use mako_tests::cluster::{require_fuse, ClusterOptions, TestCluster};
use mako_tests::posix::{run_posix_suite, Outcome};

#[test]
fn posix_suite_passes_on_mako() {
    if !require_fuse("posix_suite_passes_on_mako") {
        return;
    }
    let cluster = TestCluster::up(ClusterOptions::default()).expect("mako up");
    let dir = cluster.mount().join("posix");
    std::fs::create_dir(&dir).expect("mkdir posix");
    let report = run_posix_suite(&dir, None);
    println!("{report}");
    let failures: Vec<String> = report.failures().map(|r| r.to_string()).collect();
    let skips: Vec<String> = report
        .results
        .iter()
        .filter_map(|r| match &r.outcome {
            Outcome::Skip(why) => Some(format!("{}: {why}", r.name)),
            _ => None,
        })
        .collect();
    assert!(
        report.results.len() >= 60,
        "expected the full check table, ran {}",
        report.results.len()
    );
    assert!(
        failures.is_empty(),
        "POSIX checks failed on Mako ({}):\n{}\n\nmakod.log tail:\n{}",
        report.summary(),
        failures.join("\n"),
        cluster.log_tail(30)
    );
    assert!(
        skips.is_empty(),
        "POSIX checks skipped on Mako (as root with FUSE every check should run):\n{}",
        skips.join("\n")
    );
    assert!(
        std::fs::read_dir(&dir).unwrap().next().is_none(),
        "the suite must remove its check directories"
    );
}
