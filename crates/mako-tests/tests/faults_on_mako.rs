//! Fault handling of a real Mako cluster.
//!
//! (a) `full_file_system_gives_enospc_and_recovers`: on a 1-disk file system of 200 MiB
//!     (1 MiB blocks), filling it makes write(2) fail with ENOSPC (not EIO, no crash, no hang);
//!     files written before stay intact and readable; after deleting the filler new writes
//!     succeed again; a `mako down`/`mako up` then finds every file with its contents.
//! (b) `bad_disks_make_up_fail_naming_the_disk`: with makod stopped, a missing disk file, a
//!     disk file truncated to 1 MiB and a disk file that cannot be opened read-write
//!     (`chattr +i`; else a read-only bind mount of the disks directory; else the case is
//!     skipped with the reason) each make `mako up` fail with a message naming the disk,
//!     leave no daemon and no mount behind, and log no panic; restoring the disk makes
//!     `mako up` work again with the data intact.
//! (c) `out_of_range_parameters_are_refused`: `mako config set pagepool=1K` and
//!     `mako fs create … -B 3M` are refused (non-zero exit) naming the parameter and its
//!     allowed range, and change nothing.

use mako_tests::cluster::{is_mounted, process_alive, require_fuse, ClusterOptions, TestCluster};
use mako_tests::pattern;
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

const MIB: usize = 1 << 20;

/// Files written before the faults: (path relative to the mount, contents).
fn keep_files() -> Vec<(String, Vec<u8>)> {
    let mut v: Vec<(String, Vec<u8>)> = (0..5)
        .map(|i| {
            (
                format!("keep/big{i}"),
                pattern(i, 3 * MIB + 17 * i as usize),
            )
        })
        .collect();
    v.push(("keep/small".into(), b"small file\n".to_vec()));
    v.push(("keep/empty".into(), Vec::new()));
    v.push(("keep/sub/odd".into(), pattern(77, 5000)));
    v
}

fn write_keep_files(mnt: &Path) {
    std::fs::create_dir_all(mnt.join("keep/sub")).unwrap();
    for (rel, data) in keep_files() {
        let mut f = std::fs::File::create(mnt.join(&rel)).unwrap();
        f.write_all(&data).unwrap();
        f.sync_all().unwrap();
    }
}

fn check_keep_files(mnt: &Path, when: &str) {
    for (rel, data) in keep_files() {
        let got =
            std::fs::read(mnt.join(&rel)).unwrap_or_else(|e| panic!("{when}: read {rel}: {e}"));
        assert!(
            got == data,
            "{when}: {rel} has wrong contents ({} bytes, want {})",
            got.len(),
            data.len()
        );
    }
}

fn errno_of(e: &std::io::Error) -> i32 {
    e.raw_os_error().unwrap_or(0)
}

#[test]
fn full_file_system_gives_enospc_and_recovers() {
    if !require_fuse("full_file_system_gives_enospc_and_recovers") {
        return;
    }
    let cluster = TestCluster::up(ClusterOptions {
        disks: 1,
        disk_size: "200M".into(),
        block_size: Some("1M".into()),
        ..Default::default()
    })
    .expect("mako up");
    let mnt = cluster.mount();
    write_keep_files(mnt);
    let sv = mako_tests::sys::statvfs(mnt).unwrap();
    println!(
        "before filling: {} of {} blocks of {} bytes free",
        sv.f_bavail, sv.f_blocks, sv.f_frsize
    );

    // Fill: 1 MiB writes until one fails. 200 MiB of disk cannot take 400 MiB. The writes run
    // in a helper thread with a watchdog: a write(2) that does not return within 60 s fails
    // the test (instead of hanging it); the cluster guard's `mako down` then unblocks it.
    let fill = mnt.join("filler");
    let chunk = pattern(1234, MIB);
    let (tx, rx) = std::sync::mpsc::channel::<Result<usize, std::io::Error>>();
    {
        let (fill, chunk) = (fill.clone(), chunk.clone());
        std::thread::spawn(move || {
            let mut f = match std::fs::File::create(&fill) {
                Ok(f) => f,
                Err(e) => return drop(tx.send(Err(e))),
            };
            let mut written = 0usize;
            loop {
                if let Err(e) = f.write_all(&chunk) {
                    let _ = tx.send(Err(e));
                    break;
                }
                written += MIB;
                if tx.send(Ok(written)).is_err() || written > 400 * MIB {
                    break;
                }
            }
            // fsync after ENOSPC: ENOSPC is acceptable (write-behind), anything else is not.
            if let Err(e) = f.sync_all() {
                if errno_of(&e) != libc::ENOSPC {
                    eprintln!("fsync of the filler after ENOSPC: {e}");
                }
            }
        });
    }
    let mut written = 0usize;
    let err = loop {
        match rx.recv_timeout(Duration::from_secs(60)) {
            Ok(Ok(n)) => written = n,
            Ok(Err(e)) => break e,
            Err(_) => {
                let log = std::fs::read_to_string(cluster.data_dir().join("makod.log"))
                    .unwrap_or_default();
                let nospace = log.lines().filter(|l| l.contains("no space left")).count();
                panic!(
                    "MAKO BUG: write(2) of the filler hung for 60 s after {} MiB were accepted on a \
                     {} MiB file system ({} MiB were free) without ENOSPC; makod.log has {nospace} \
                     'no space left' write-behind errors; last line: {}",
                    written / MIB,
                    sv.f_blocks * sv.f_frsize / MIB as u64,
                    sv.f_bavail * sv.f_frsize / MIB as u64,
                    log.lines().last().unwrap_or("")
                );
            }
        }
        assert!(
            written <= 400 * MIB,
            "wrote {} MiB to a 200 MiB file system without ENOSPC",
            written / MIB
        );
    };
    println!(
        "filler: write failed after {} MiB with {err}",
        written / MIB
    );
    assert_eq!(
        errno_of(&err),
        libc::ENOSPC,
        "a full file system must give ENOSPC, got {err}"
    );
    // And makod says why (an admin seeing ENOSPC must find the reason in makod.log).
    let log = std::fs::read_to_string(cluster.data_dir().join("makod.log")).unwrap_or_default();
    assert!(
        log.contains("ENOSPC returned to an application: "),
        "makod.log does not say why a write got ENOSPC; last line: {}",
        log.lines().last().unwrap_or("")
    );
    let free_before_mib = (sv.f_bavail * sv.f_frsize) as usize / MIB;
    assert!(
        written / MIB <= free_before_mib + 1,
        "acknowledged {} MiB but only {free_before_mib} MiB were free",
        written / MIB
    );
    // A second file cannot get space either.
    let more = std::fs::File::create(mnt.join("more"));
    match more {
        Ok(mut g) => {
            let r = g.write_all(&chunk[..MIB]).and_then(|_| g.sync_all());
            let e = r.expect_err("a 1 MiB write to a full file system succeeded");
            assert_eq!(errno_of(&e), libc::ENOSPC, "second file: {e}");
        }
        Err(e) => assert_eq!(
            errno_of(&e),
            libc::ENOSPC,
            "create on a full file system: {e}"
        ),
    }
    check_keep_files(mnt, "when full");
    // The filler's acknowledged bytes are readable, also after a remount.
    let check_filler = |when: &str| {
        let got = std::fs::read(&fill).unwrap();
        assert!(
            got.len() >= written,
            "{when}: filler shorter ({}) than acknowledged ({written})",
            got.len()
        );
        for (i, c) in got[..written].chunks(MIB).enumerate() {
            assert!(c == &chunk[..c.len()], "{when}: filler MiB {i} corrupt");
        }
    };
    check_filler("when full");
    cluster
        .remount()
        .expect("mako down; mako up of a full file system");
    check_keep_files(mnt, "full, after remount");
    check_filler("full, after remount");

    // Delete; writes work again (space may be freed asynchronously: retry briefly).
    std::fs::remove_file(&fill).unwrap();
    let _ = std::fs::remove_file(mnt.join("more"));
    let fresh = pattern(4321, 20 * MIB);
    let mut attempts = 0;
    loop {
        attempts += 1;
        let r = std::fs::File::create(mnt.join("fresh")).and_then(|mut g| {
            g.write_all(&fresh)?;
            g.sync_all()
        });
        match r {
            Ok(()) => break,
            Err(e) if errno_of(&e) == libc::ENOSPC && attempts < 20 => {
                std::thread::sleep(Duration::from_millis(500))
            }
            Err(e) => {
                panic!("writing 20 MiB after deleting the filler failed ({attempts} attempts): {e}")
            }
        }
    }
    println!("20 MiB written after delete ({attempts} attempt(s))");
    check_keep_files(mnt, "after delete");

    cluster.remount().expect("mako down; mako up");
    check_keep_files(mnt, "after remount");
    assert!(
        std::fs::read(mnt.join("fresh")).unwrap() == fresh,
        "fresh file corrupt after remount"
    );
    assert!(
        !mnt.join("filler").exists(),
        "deleted filler is back after remount"
    );
    let sv = mako_tests::sys::statvfs(mnt).unwrap();
    let free_mib = sv.f_bavail * sv.f_frsize / MIB as u64;
    println!("after remount: {free_mib} MiB free");
    assert!(
        free_mib >= 100,
        "after deleting the filler and remounting only {free_mib} MiB are free"
    );
}

/// Asserts that `mako up` fails naming disk `d1`, leaves nothing running, and logs no panic.
fn expect_up_fails(cluster: &TestCluster, case: &str) {
    let out = cluster.mako(&["up"]).unwrap();
    println!("--- {case}: mako up ---\n{out}");
    assert!(!out.success(), "{case}: mako up must fail: {out}");
    assert!(!out.timed_out, "{case}: mako up hung");
    let text = out.text();
    let disk_path = cluster.disk_path(1);
    assert!(
        text.contains(disk_path.to_str().unwrap())
            || text.contains("disk d1")
            || text.contains("d1:")
            || text.contains("d1 "),
        "{case}: the message must name the disk (d1 / {}): {out}",
        disk_path.display()
    );
    // No daemon left behind (mako up's failure path may leave makod running: stop it then).
    if cluster.makod_pid().is_some_and(process_alive) {
        println!("{case}: makod still runs after the failed up; mako down");
        let down = cluster.mako(&["down"]).unwrap();
        assert!(down.success(), "{case}: mako down after failed up: {down}");
    }
    assert!(
        !is_mounted(cluster.mount()),
        "{case}: mounted although up failed"
    );
    let log = std::fs::read_to_string(cluster.data_dir().join("makod.log")).unwrap_or_default();
    assert!(
        !log.contains("panicked"),
        "{case}: makod panicked:\n{}",
        cluster.log_tail(40)
    );
}

fn expect_up_works(cluster: &TestCluster, case: &str) {
    cluster
        .up_again()
        .unwrap_or_else(|e| panic!("{case}: mako up after restoring the disk: {e:#}"));
    check_keep_files(cluster.mount(), &format!("{case}: after restore"));
    cluster.down().expect("mako down");
}

/// Clears `chattr +i` on drop (so cleanup can delete the file even after a panic).
struct Immutable(PathBuf);
impl Drop for Immutable {
    fn drop(&mut self) {
        let _ = Command::new("chattr").arg("-i").arg(&self.0).status();
    }
}

/// Unmounts a bind mount on drop.
struct BindMount(PathBuf);
impl Drop for BindMount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

#[test]
fn bad_disks_make_up_fail_naming_the_disk() {
    if !require_fuse("bad_disks_make_up_fail_naming_the_disk") {
        return;
    }
    let cluster = TestCluster::up(ClusterOptions {
        disks: 2,
        disk_size: "256M".into(),
        block_size: Some("1M".into()),
        ..Default::default()
    })
    .expect("mako up");
    write_keep_files(cluster.mount());
    cluster.down().expect("mako down");
    let d1 = cluster.disk_path(1);
    let backup = d1.with_extension("img.bak");

    // Missing disk file.
    std::fs::rename(&d1, &backup).unwrap();
    expect_up_fails(&cluster, "missing disk");
    std::fs::rename(&backup, &d1).unwrap();
    expect_up_works(&cluster, "missing disk");

    // Truncated disk file (1 MiB; the original kept aside).
    std::fs::rename(&d1, &backup).unwrap();
    {
        let src = std::fs::File::open(&backup).unwrap();
        let mut head = vec![0u8; MIB];
        src.read_exact_at(&mut head, 0).unwrap();
        std::fs::write(&d1, &head).unwrap();
    }
    expect_up_fails(&cluster, "truncated disk");
    std::fs::rename(&backup, &d1).unwrap();
    expect_up_works(&cluster, "truncated disk");

    // A disk that cannot be opened read-write.
    let chattr_ok = Command::new("chattr")
        .arg("+i")
        .arg(&d1)
        .status()
        .is_ok_and(|s| s.success());
    if chattr_ok {
        let guard = Immutable(d1.clone());
        assert!(
            std::fs::OpenOptions::new().write(true).open(&d1).is_err(),
            "chattr +i did not make the disk read-only"
        );
        expect_up_fails(&cluster, "immutable disk (chattr +i)");
        drop(guard);
        expect_up_works(&cluster, "immutable disk (chattr +i)");
    } else {
        let dir = d1.parent().unwrap().to_path_buf();
        let bind = Command::new("mount")
            .arg("--bind")
            .arg(&dir)
            .arg(&dir)
            .status()
            .is_ok_and(|s| s.success());
        if !bind {
            return mako_tests::skip::cannot_run(
                "bad_disks_make_up_fail_naming_the_disk (read-only disk case)",
                "neither chattr +i nor a bind mount works here",
            );
        }
        let guard = BindMount(dir.clone());
        let ro = Command::new("mount")
            .args(["-o", "remount,bind,ro"])
            .arg(&dir)
            .status()
            .is_ok_and(|s| s.success());
        if !ro {
            return mako_tests::skip::cannot_run(
                "bad_disks_make_up_fail_naming_the_disk (read-only disk case)",
                "cannot remount the bind mount read-only",
            );
        }
        // Every disk is read-only now; the message must still name one; d0 is opened first.
        let out = cluster.mako(&["up"]).unwrap();
        println!("--- read-only disks directory: mako up ---\n{out}");
        assert!(!out.success(), "mako up on read-only disks must fail");
        assert!(
            out.text().contains("d0") || out.text().contains("d1"),
            "message must name a disk: {out}"
        );
        if cluster.makod_pid().is_some_and(process_alive) {
            assert!(cluster.mako(&["down"]).unwrap().success());
        }
        drop(guard);
        expect_up_works(&cluster, "read-only disks directory");
    }
}

#[test]
fn out_of_range_parameters_are_refused() {
    if !require_fuse("out_of_range_parameters_are_refused") {
        return;
    }
    let cluster = TestCluster::up(ClusterOptions {
        disks: 1,
        disk_size: "512M".into(),
        ..Default::default()
    })
    .expect("mako up");
    let config_before =
        std::fs::read_to_string(cluster.data_dir().join("config.toml")).unwrap_or_default();
    let out = cluster.mako(&["config", "set", "pagepool=1K"]).unwrap();
    println!("--- mako config set pagepool=1K ---\n{out}");
    assert!(!out.success(), "pagepool=1K must be refused: {out}");
    let text = out.text();
    assert!(
        text.contains("pagepool"),
        "message must name the parameter: {out}"
    );
    assert!(
        text.contains("64M") && text.contains("256G"),
        "message must give the range 64M..256G: {out}"
    );
    let config_after =
        std::fs::read_to_string(cluster.data_dir().join("config.toml")).unwrap_or_default();
    assert_eq!(
        config_before, config_after,
        "a refused config set changed config.toml"
    );

    let cluster_before = std::fs::read_to_string(cluster.data_dir().join("cluster.toml")).unwrap();
    let out = cluster
        .mako(&["fs", "create", "fs2", "-d", "d0", "-B", "3M"])
        .unwrap();
    println!("--- mako fs create fs2 -d d0 -B 3M ---\n{out}");
    assert!(!out.success(), "-B 3M must be refused: {out}");
    let text = out.text();
    assert!(
        text.contains("-B") || text.to_lowercase().contains("block size"),
        "message must name the parameter: {out}"
    );
    assert!(
        text.contains("64K") && text.contains("16M"),
        "message must give the range 64K..16M: {out}"
    );
    let cluster_after = std::fs::read_to_string(cluster.data_dir().join("cluster.toml")).unwrap();
    assert_eq!(
        cluster_before, cluster_after,
        "a refused fs create changed cluster.toml"
    );
    assert!(is_mounted(cluster.mount()), "fs1 must stay mounted");
}
