//! The daemon's life cycle against the kernel's mount table, with real processes:
//!
//! - after `kill -9` of makod its FUSE mount stays behind, dead (ENOTCONN); `mako up`
//!   must recognise it as its own, clean it up (lazy unmount, stale socket and pid
//!   file), say so, and start;
//! - a plain `umount` under a running makod must be noticed: `mako status` says the
//!   file system is not mounted, `mako fs mount` and `mako up` mount it again (never
//!   "already mounted" with nothing mounted), and nothing written before is lost.

use mako_tests::cluster::{is_mounted, require_fuse, ClusterOptions, TestCluster};
use std::path::Path;
use std::time::{Duration, Instant};

fn small() -> ClusterOptions {
    ClusterOptions {
        disks: 2,
        disk_size: "256M".into(),
        pagepool: "64M".into(),
        block_size: Some("1M".into()),
    }
}

fn errno_of_stat(path: &Path) -> Option<i32> {
    std::fs::metadata(path).err().and_then(|e| e.raw_os_error())
}

fn umount(path: &Path) -> std::io::Result<()> {
    let c = mako_tests::sys::cstr(path);
    // SAFETY: a plain umount(2) of a path this test mounted.
    if unsafe { libc::umount2(c.as_ptr(), 0) } == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// The state column of file system fs1 in `mako status`.
fn fs1_state(cluster: &TestCluster) -> String {
    let out = cluster.mako(&["status"]).unwrap();
    assert!(out.success(), "mako status: {out}");
    let line = out
        .stdout
        .lines()
        .find(|l| l.starts_with("fs1 "))
        .unwrap_or_else(|| panic!("no fs1 row in mako status:\n{out}"))
        .to_string();
    let mp = cluster.mount().display().to_string();
    let rest = line.split_once(&mp).map(|(_, r)| r).unwrap_or(&line);
    let state: Vec<&str> = rest.split_whitespace().take(2).collect();
    if state.first() == Some(&"not") {
        "not mounted".to_string()
    } else {
        state.first().copied().unwrap_or("").to_string()
    }
}

#[test]
fn up_after_kill_9_cleans_up_the_dead_mount_and_starts() {
    if !require_fuse("up_after_kill_9_cleans_up_the_dead_mount_and_starts") {
        return;
    }
    let cluster = TestCluster::up(small()).unwrap_or_else(|e| panic!("{e:#}"));
    let file = cluster.mount().join("kept");
    {
        use std::io::Write;
        let mut f = std::fs::File::create(&file).unwrap();
        f.write_all(b"fsynced before the crash").unwrap();
        f.sync_all().unwrap();
    }
    let old_pid = cluster.makod_pid().expect("makod.pid");
    cluster.crash().unwrap();
    // The dead mount is still in the table; its connection is gone.
    assert!(
        is_mounted(cluster.mount()),
        "the FUSE mount should outlive a killed makod"
    );
    let errno = errno_of_stat(cluster.mount());
    assert!(
        matches!(errno, Some(libc::ENOTCONN | libc::ECONNABORTED)),
        "stat of the dead mount: {errno:?}"
    );
    assert!(cluster.data_dir().join("makod.pid").exists());

    let out = cluster.mako(&["up"]).unwrap();
    assert!(out.success(), "mako up after kill -9 must succeed: {out}");
    let text = out.text();
    assert!(
        text.contains("Cleaned up after makod")
            && text.contains("dead FUSE mount of fs1")
            && text.contains("pid file"),
        "mako up must say what it cleaned up:\n{out}"
    );
    assert!(text.contains("Mako is up."), "{out}");
    assert!(is_mounted(cluster.mount()));
    let new_pid = cluster.makod_pid().expect("makod.pid");
    assert_ne!(new_pid, old_pid);
    assert!(mako_tests::cluster::process_alive(new_pid));
    assert_eq!(
        std::fs::read(&file).unwrap(),
        b"fsynced before the crash",
        "fsynced data after the crash"
    );
    // Exactly one Mako mount at the mount point (the dead one is gone).
    let at_mnt = mako_tests::cluster::kernel_mounts()
        .into_iter()
        .filter(|m| m == cluster.mount())
        .count();
    assert_eq!(at_mnt, 1, "stacked mounts at {}", cluster.mount().display());
    // A second `mako up` finds everything up.
    let out = cluster.mako(&["up"]).unwrap();
    assert!(out.success() && out.text().contains("already up"), "{out}");
    cluster.down().unwrap();
}

#[test]
fn a_plain_umount_is_noticed_and_mounted_again() {
    if !require_fuse("a_plain_umount_is_noticed_and_mounted_again") {
        return;
    }
    let cluster = TestCluster::up(small()).unwrap_or_else(|e| panic!("{e:#}"));
    let file = cluster.mount().join("kept");
    // Not fsynced: the write-back when makod notices the unmount must keep it.
    std::fs::write(&file, b"written, not fsynced").unwrap();
    let pid = cluster.makod_pid().expect("makod.pid");
    assert_eq!(fs1_state(&cluster), "mounted");

    // 1. umount under a running makod: status says so, `mako fs mount` mounts again.
    umount(cluster.mount()).expect("umount of the idle mount");
    assert!(!is_mounted(cluster.mount()));
    assert_eq!(fs1_state(&cluster), "not mounted");
    let status = cluster.mako(&["status"]).unwrap();
    assert!(
        status.stdout.contains("fs1 should be mounted"),
        "mako status must point at the missing mount:\n{status}"
    );
    let out = cluster.mako(&["fs", "mount", "fs1"]).unwrap();
    assert!(out.success(), "mako fs mount: {out}");
    assert!(
        !out.text().contains("already mounted"),
        "nothing was mounted, yet: {out}"
    );
    assert!(is_mounted(cluster.mount()), "mako fs mount mounted nothing");
    assert_eq!(fs1_state(&cluster), "mounted");
    assert_eq!(std::fs::read(&file).unwrap(), b"written, not fsynced");
    assert_eq!(cluster.makod_pid(), Some(pid), "the same makod serves it");

    // 2. Again, and `mako up` mounts it (and says so) instead of "already up".
    std::fs::write(&file, b"second version").unwrap();
    umount(cluster.mount()).expect("umount of the idle mount");
    let out = cluster.mako(&["up"]).unwrap();
    assert!(out.success(), "mako up: {out}");
    assert!(
        !out.text().contains("already up"),
        "mako up with nothing mounted must not say it is already up: {out}"
    );
    assert!(
        out.text().contains("fs1 is not mounted"),
        "mako up must say what it found: {out}"
    );
    assert!(is_mounted(cluster.mount()), "mako up mounted nothing");
    assert_eq!(std::fs::read(&file).unwrap(), b"second version");
    assert_eq!(cluster.makod_pid(), Some(pid), "the same makod serves it");

    // 3. makod's log says what happened.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let log = std::fs::read_to_string(cluster.data_dir().join("makod.log")).unwrap();
        if log.matches("unmounted from outside").count() >= 2 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "makod.log does not record the two outside unmounts:\n{}",
            cluster.log_tail(30)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    cluster.down().unwrap();
}

/// SIGTERM and SIGINT stop makod as `mako down` does: written back, unmounted, its pid
/// file and socket removed, so the next `mako up` has nothing to clean up.
#[test]
fn sigterm_and_sigint_stop_makod_cleanly() {
    if !require_fuse("sigterm_and_sigint_stop_makod_cleanly") {
        return;
    }
    let cluster = TestCluster::up(small()).unwrap_or_else(|e| panic!("{e:#}"));
    let file = cluster.mount().join("kept");
    for (round, signal) in [(1, libc::SIGTERM), (2, libc::SIGINT)] {
        let content = format!("round {round}, not fsynced");
        std::fs::write(&file, &content).unwrap();
        let pid = cluster.makod_pid().expect("makod.pid");
        // SAFETY: kill(2) of the makod this test started.
        assert_eq!(unsafe { libc::kill(pid as libc::pid_t, signal) }, 0);
        let deadline = Instant::now() + Duration::from_secs(60);
        while mako_tests::cluster::process_alive(pid) {
            assert!(
                Instant::now() < deadline,
                "makod (pid {pid}) still runs 60 s after signal {signal}:\n{}",
                cluster.log_tail(20)
            );
            std::thread::sleep(Duration::from_millis(20)); // poll
        }
        let log = std::fs::read_to_string(cluster.data_dir().join("makod.log")).unwrap();
        assert!(
            log.contains(&format!("signal {signal}: stopping")),
            "{}",
            cluster.log_tail(20)
        );
        assert!(
            log.trim_end().ends_with("makod stopped cleanly"),
            "{}",
            cluster.log_tail(20)
        );
        assert!(!is_mounted(cluster.mount()), "still mounted after the stop");
        assert!(!cluster.data_dir().join("makod.pid").exists());
        assert!(!cluster.data_dir().join("makod.sock").exists());
        let out = cluster.mako(&["up"]).unwrap();
        assert!(out.success(), "{out}");
        assert!(
            !out.text().contains("Cleaned up"),
            "nothing to clean: {out}"
        );
        assert!(is_mounted(cluster.mount()));
        assert_eq!(std::fs::read_to_string(&file).unwrap(), content);
    }
    cluster.down().unwrap();
}

/// `umount -l` while a file is open detaches the mount but keeps serving that file:
/// makod reports it as not mounted, refuses to mount a second copy while the old one
/// still serves (saying why), and once the file is closed mounts it again. `mako down`
/// with such a mount ends it and writes back what came through the open file.
#[test]
fn a_lazy_umount_with_an_open_file_is_detached_until_it_closes() {
    if !require_fuse("a_lazy_umount_with_an_open_file_is_detached_until_it_closes") {
        return;
    }
    let cluster = TestCluster::up(small()).unwrap_or_else(|e| panic!("{e:#}"));
    let path = cluster.mount().join("open");
    std::fs::write(&path, b"before").unwrap();
    let mut open = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .unwrap();
    lazy_unmount(cluster.mount());
    assert!(!is_mounted(cluster.mount()));
    // The open file is still served.
    {
        use std::io::{Read, Seek, SeekFrom, Write};
        open.seek(SeekFrom::End(0)).unwrap();
        open.write_all(b", after").unwrap();
        open.sync_all().unwrap();
        let mut back = String::new();
        open.seek(SeekFrom::Start(0)).unwrap();
        open.read_to_string(&mut back).unwrap();
        assert_eq!(back, "before, after");
    }
    assert_eq!(fs1_state(&cluster), "not mounted");
    let out = cluster.mako(&["fs", "mount", "fs1"]).unwrap();
    assert!(
        !out.success(),
        "a second mount while the first serves: {out}"
    );
    assert!(
        out.text().contains("detached") && out.text().contains("open"),
        "the refusal must say why: {out}"
    );
    assert!(!is_mounted(cluster.mount()));
    // Closing the last file ends the session; makod writes back and mounts again.
    drop(open);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let out = cluster.mako(&["fs", "mount", "fs1"]).unwrap();
        if out.success() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "still refused 30 s after the close: {out}"
        );
        std::thread::sleep(Duration::from_millis(100)); // poll
    }
    assert!(is_mounted(cluster.mount()));
    assert_eq!(std::fs::read(&path).unwrap(), b"before, after");

    // `mako down` with a detached mount still serving a file: makod aborts that
    // connection, writes everything back (also what came through the open file) and stops.
    let mut open = std::fs::OpenOptions::new()
        .append(true)
        .open(&path)
        .unwrap();
    lazy_unmount(cluster.mount());
    {
        use std::io::Write;
        open.write_all(b", detached").unwrap();
    }
    cluster.down().unwrap();
    {
        use std::io::Write;
        let late = open.write_all(b", too late").and_then(|()| open.sync_all());
        assert!(late.is_err(), "the aborted connection must refuse writes");
    }
    drop(open);
    assert!(
        std::fs::read_to_string(cluster.data_dir().join("makod.log"))
            .unwrap()
            .contains("aborting its FUSE connection"),
        "{}",
        cluster.log_tail(20)
    );
    cluster.up_again().unwrap();
    assert_eq!(std::fs::read(&path).unwrap(), b"before, after, detached");
    cluster.down().unwrap();
}

fn lazy_unmount(path: &Path) {
    let c = mako_tests::sys::cstr(path);
    // SAFETY: umount2(MNT_DETACH) of a path this test mounted.
    assert_eq!(unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) }, 0);
}
