//! A bug must not take the file system down with it: a panic inside a FUSE request
//! handler (made on purpose with the `MAKO_TEST_PANIC_ON_LOOKUP` test hook) gives that
//! caller EIO, leaves makod and the mount serving reads, and turns the mount read-only
//! so that half-changed in-memory state never reaches disk. `mako down` still works.

use mako_tests::cluster::{require_fuse, ClusterOptions, TestCluster};
use std::time::{Duration, Instant};

#[test]
fn a_panicking_handler_gives_eio_and_a_read_only_mount() {
    if !require_fuse("a_panicking_handler_gives_eio_and_a_read_only_mount") {
        return;
    }
    let c = TestCluster::up(ClusterOptions {
        disks: 2,
        disk_size: "1G".into(),
        pagepool: "128M".into(),
        block_size: None,
    })
    .unwrap_or_else(|e| panic!("{e:#}"));
    std::fs::write(c.mount().join("kept"), b"written before the bug").unwrap();
    // Restart makod with the hook armed (the harness passes its own environment).
    c.down().unwrap();
    let data = c.data_dir().to_str().unwrap().to_string();
    let out = std::process::Command::new(c.mako_binary())
        .args(["--data-dir", &data, "up"])
        .env("MAKO_TEST_PANIC_ON_LOOKUP", "boom")
        .env_remove("MAKO_DATA_DIR")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "mako up: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let t = Instant::now();
    while !mako_tests::cluster::is_mounted(c.mount()) {
        assert!(t.elapsed() < Duration::from_secs(15), "not mounted");
        std::thread::sleep(Duration::from_millis(50));
    }
    let pid = c.makod_pid().expect("makod pid");
    // 1. The panicking request gets EIO.
    let e = std::fs::metadata(c.mount().join("boom")).unwrap_err();
    assert_eq!(
        e.raw_os_error(),
        Some(libc::EIO),
        "a handler that panics must answer EIO: {e}"
    );
    // 2. makod and the mount live on, and still serve data.
    assert!(
        mako_tests::cluster::process_alive(pid),
        "makod died of a handler panic"
    );
    for _ in 0..20 {
        // More requests than there are handler threads: none was lost to the panic.
        assert_eq!(
            std::fs::read(c.mount().join("kept")).unwrap(),
            b"written before the bug"
        );
    }
    // 3. The mount refuses changes: in-memory state after a bug is not trusted.
    let e = std::fs::write(c.mount().join("new"), b"x").unwrap_err();
    assert_eq!(
        e.raw_os_error(),
        Some(libc::EROFS),
        "changes after a bug must fail read-only: {e}"
    );
    let log = std::fs::read_to_string(c.data_dir().join("makod.log")).unwrap_or_default();
    assert!(
        log.contains("BUG: FUSE lookup panicked"),
        "the log names the bug:\n{}",
        c.log_tail(20)
    );
    // 4. It still stops cleanly, and a fresh start has the data.
    c.down().unwrap();
    c.up_again().unwrap();
    assert_eq!(
        std::fs::read(c.mount().join("kept")).unwrap(),
        b"written before the bug"
    );
}
