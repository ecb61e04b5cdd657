//! FUSE over io_uring (`fuseIoUring`) on a real Mako mount, and its fallback to /dev/fuse.
//!
//! Proves: with the fuse module offering io_uring (`enable_uring` = Y) and
//! `fuseIoUring = yes`, makod serves the mount over io_uring (its log says so) and the
//! POSIX suite passes on it; with `enable_uring` = N the same configuration mounts over
//! /dev/fuse, says why, and works.
//!
//! `enable_uring` is a machine-wide switch, and turning it off under a mount that uses
//! io_uring hangs that mount's requests in flight. The two tests take one lock, so they
//! never turn it off under each other; turning it off (the fallback test, and putting
//! back N after the io_uring test) is done only while no other Mako mount exists on the
//! machine (a test of another process could be using io_uring): otherwise the fallback
//! test cannot run and the io_uring test leaves the switch on (harmless: only mounts
//! that ask for io_uring use it). A test that cannot run (another Mako mount, a kernel
//! without FUSE io_uring: no parameter file, or a switch that cannot be written) fails
//! like every other (`mako_tests::skip::cannot_run`; `MAKO_ALLOW_SKIP=1` lists it as
//! skipped instead).

use std::sync::Mutex;

use mako_tests::cluster::{require_fuse, ClusterOptions, TestCluster};
use mako_tests::posix::assert_posix_suite_passes;

const ENABLE_URING: &str = "/sys/module/fuse/parameters/enable_uring";

/// Serializes the tests that set `enable_uring`.
static SWITCH: Mutex<()> = Mutex::new(());

/// Sets `enable_uring` for as long as it lives, then puts the old value back.
struct UringSwitch {
    was: String,
}

impl UringSwitch {
    fn set(test: &str, on: bool) -> Option<UringSwitch> {
        let Ok(was) = std::fs::read_to_string(ENABLE_URING) else {
            mako_tests::skip::cannot_run(
                test,
                &format!("no {ENABLE_URING} (a kernel without FUSE over io_uring)"),
            );
            return None;
        };
        if !on && was.trim() != "N" && other_mako_mounts() {
            mako_tests::skip::cannot_run(
                test,
                &format!(
                    "other Mako mounts exist: turning {ENABLE_URING} off under a mount \
                     that uses io_uring would hang its requests"
                ),
            );
            return None;
        }
        if let Err(e) = std::fs::write(ENABLE_URING, if on { "Y" } else { "N" }) {
            mako_tests::skip::cannot_run(test, &format!("cannot write {ENABLE_URING}: {e}"));
            return None;
        }
        Some(UringSwitch {
            was: was.trim().to_string(),
        })
    }
}

impl Drop for UringSwitch {
    fn drop(&mut self) {
        if self.was == "N" && other_mako_mounts() {
            eprintln!("other Mako mounts exist: {ENABLE_URING} left on (was N)");
            return;
        }
        let _ = std::fs::write(ENABLE_URING, &self.was);
    }
}

/// Whether any Mako mount exists (ours are down when this is asked).
fn other_mako_mounts() -> bool {
    std::fs::read_to_string("/proc/mounts")
        .map(|m| m.lines().any(|l| l.split(' ').nth(2) == Some("fuse.mako")))
        .unwrap_or(true)
}

/// A cluster restarted with `fuseIoUring = yes`; the line makod logged for its transport.
fn cluster_asking_for_io_uring() -> (TestCluster, String) {
    let cluster = TestCluster::up(ClusterOptions::default()).expect("mako up");
    let out = cluster
        .mako(&["config", "set", "fuseIoUring=yes"])
        .expect("mako config set");
    assert!(out.success(), "mako config set fuseIoUring=yes: {out}");
    cluster.down().expect("mako down");
    cluster.up_again().expect("mako up again");
    let log = std::fs::read_to_string(cluster.data_dir().join("makod.log")).unwrap_or_default();
    let line = log
        .lines()
        .rfind(|l| l.contains("FUSE transport: "))
        .unwrap_or("")
        .to_string();
    (cluster, line)
}

#[test]
fn posix_suite_passes_over_io_uring() {
    let test = "posix_suite_passes_over_io_uring";
    if !require_fuse(test) {
        return;
    }
    let _one = SWITCH.lock().unwrap_or_else(|e| e.into_inner());
    let Some(_switch) = UringSwitch::set(test, true) else {
        return;
    };
    let (cluster, line) = cluster_asking_for_io_uring();
    assert!(
        line.contains("FUSE transport: io_uring"),
        "makod should serve the mount over io_uring, logged: {line:?}\n{}",
        cluster.log_tail(20)
    );
    assert_posix_suite_passes(cluster.mount(), "over io_uring", || cluster.log_tail(30));
    cluster.down().expect("mako down");
}

#[test]
fn falls_back_to_dev_fuse_when_the_kernel_does_not_offer_io_uring() {
    let test = "falls_back_to_dev_fuse_when_the_kernel_does_not_offer_io_uring";
    if !require_fuse(test) {
        return;
    }
    let _one = SWITCH.lock().unwrap_or_else(|e| e.into_inner());
    let Some(_switch) = UringSwitch::set(test, false) else {
        return;
    };
    let (cluster, line) = cluster_asking_for_io_uring();
    assert!(
        line.contains("FUSE transport: /dev/fuse (the kernel does not offer io_uring"),
        "makod should fall back to /dev/fuse and say why, logged: {line:?}\n{}",
        cluster.log_tail(20)
    );
    let f = cluster.mount().join("f");
    std::fs::write(&f, b"over /dev/fuse").expect("write");
    assert_eq!(std::fs::read(&f).expect("read"), b"over /dev/fuse");
    std::fs::remove_file(&f).expect("unlink");
    cluster.down().expect("mako down");
}
