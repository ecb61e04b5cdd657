//! The full POSIX conformance suite (`mako_tests::posix`) on a real Mako mount.
//!
//! Proves: through the FUSE mount of a freshly created one-node cluster (4 disks of 2G,
//! pagepool 256M) every POSIX check — namespace, I/O, attributes, permissions, xattrs,
//! locks, directories — passes (no failures; skips only where the check itself says it needs
//! something this machine lacks). The report is printed either way.

use mako_tests::cluster::{require_fuse, ClusterOptions, TestCluster};
use mako_tests::posix::{assert_posix_suite_passes, Outcome};

#[test]
fn posix_suite_passes_on_mako() {
    if !require_fuse("posix_suite_passes_on_mako") {
        return;
    }
    let cluster = TestCluster::up(ClusterOptions::default()).expect("mako up");
    let report = assert_posix_suite_passes(cluster.mount(), "on Mako", || cluster.log_tail(30));
    let skips: Vec<String> = report
        .results
        .iter()
        .filter_map(|r| match &r.outcome {
            Outcome::Skip(why) => Some(format!("{}: {why}", r.name)),
            _ => None,
        })
        .collect();
    assert!(
        skips.is_empty(),
        "POSIX checks skipped on Mako (as root with FUSE every check should run):\n{}",
        skips.join("\n")
    );
    assert!(
        std::fs::read_dir(cluster.mount().join("posix"))
            .unwrap()
            .next()
            .is_none(),
        "the suite must remove its check directories"
    );
}
