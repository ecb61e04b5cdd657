//! Mounting Mako as a Linux file system is mounted, with real mount(8): the helper
//! `mount.fuse.mako` (`mount -t fuse.mako mako:fs1 DIR`, an fstab line through
//! `mount -T FILE`), a second mount point of the same file system that sees every
//! change made through the first, `mount -o remount,ro` and back, and the standard
//! options (noexec, nosuid, nodev, noatime, strictatime) checked with real syscalls.
//!
//! The helper is installed in /sbin (where mount(8) looks; it does not search PATH) for
//! the length of each test and removed after it; the tests of this file take turns.

use mako_tests::cluster::{require_fuse, ClusterOptions, TestCluster};
use mako_tests::sys;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;
use std::time::{Duration, Instant};

static HELPER_TURN: Mutex<()> = Mutex::new(());
const HELPER: &str = "/sbin/mount.fuse.mako";

fn small() -> ClusterOptions {
    ClusterOptions {
        disks: 2,
        disk_size: "256M".into(),
        pagepool: "64M".into(),
        block_size: Some("1M".into()),
    }
}

/// The installed helper; removed on drop.
struct Helper;

impl Helper {
    fn install(cluster: &TestCluster) -> Helper {
        let out = cluster.mako(&["install-helper"]).unwrap();
        assert!(out.success(), "mako install-helper: {out}");
        Helper
    }
}

impl Drop for Helper {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(HELPER);
    }
}

/// A directory this test mounts on; whatever is mounted there is lazily unmounted and
/// the directory removed on drop, even when the test fails.
struct MountDir(PathBuf);

impl MountDir {
    fn new(cluster: &TestCluster, name: &str) -> MountDir {
        let p = cluster.root().join(name);
        std::fs::create_dir_all(&p).unwrap();
        MountDir(p)
    }
}

impl Drop for MountDir {
    fn drop(&mut self) {
        let c = sys::cstr(&self.0);
        for _ in 0..4 {
            // SAFETY: umount2 of a directory this test created.
            if unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) } != 0 {
                break;
            }
        }
        let _ = std::fs::remove_dir(&self.0);
    }
}

/// Runs mount(8) (or umount(8)) with the cluster's data directory in the environment.
fn run(cluster: &TestCluster, program: &str, args: &[&str]) -> (bool, String) {
    let out = Command::new(program)
        .args(args)
        .env("MAKO_DATA_DIR", cluster.data_dir())
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// The mountinfo line of the mount at `dir`: (mount options, type, source, super options).
fn mountinfo(dir: &Path) -> Option<(String, String, String, String)> {
    let text = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let dir = dir.display().to_string();
    text.lines().rev().find_map(|l| {
        let (a, b) = l.split_once(" - ")?;
        let f: Vec<&str> = a.split(' ').collect();
        if f.get(4) != Some(&dir.as_str()) {
            return None;
        }
        let g: Vec<&str> = b.split(' ').collect();
        Some((
            f[5].to_string(),
            g[0].to_string(),
            g[1].to_string(),
            g.get(2).unwrap_or(&"").to_string(),
        ))
    })
}

fn wait_for(what: &str, mut ok: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !ok() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn setup(test: &str) -> Option<(std::sync::MutexGuard<'static, ()>, TestCluster)> {
    if !require_fuse(test) {
        return None;
    }
    let turn = HELPER_TURN.lock().unwrap_or_else(|e| e.into_inner());
    let cluster = TestCluster::up(small()).expect("mako up");
    Some((turn, cluster))
}

#[test]
fn mount_t_fuse_mako_and_an_fstab_line_mount_through_makod() {
    let Some((_turn, cluster)) = setup("mount_t_fuse_mako_and_an_fstab_line_mount_through_makod")
    else {
        return;
    };
    let _helper = Helper::install(&cluster);
    std::fs::write(cluster.mount().join("hello"), b"from the first mount").unwrap();

    let x = MountDir::new(&cluster, "x");
    let (ok, text) = run(
        &cluster,
        "mount",
        &["-t", "fuse.mako", "mako:fs1", x.0.to_str().unwrap()],
    );
    assert!(ok, "mount -t fuse.mako: {text}");
    let (opts, fstype, source, _) = mountinfo(&x.0).expect("mounted");
    assert_eq!(
        (fstype.as_str(), source.as_str()),
        ("fuse.mako", "mako:fs1")
    );
    assert!(opts.starts_with("rw"), "{opts}");
    assert_eq!(
        std::fs::read(x.0.join("hello")).unwrap(),
        b"from the first mount"
    );
    let status = cluster.mako(&["status"]).unwrap().text();
    assert!(status.contains(&x.0.display().to_string()), "{status}");

    // An fstab line, from a private fstab file (`mount -T`), with a plain `fs1`.
    let y = MountDir::new(&cluster, "y");
    let fstab = cluster.root().join("fstab");
    std::fs::write(
        &fstab,
        format!(
            "# Mako\nfs1 {} fuse.mako defaults,nosuid,nodev,noatime,_netdev,x-test 0 0\n",
            y.0.display()
        ),
    )
    .unwrap();
    let (ok, text) = run(
        &cluster,
        "mount",
        &["-T", fstab.to_str().unwrap(), y.0.to_str().unwrap()],
    );
    assert!(ok, "mount -T fstab: {text}");
    let (opts, fstype, _, _) = mountinfo(&y.0).expect("mounted from fstab");
    assert_eq!(fstype, "fuse.mako");
    for o in ["nosuid", "nodev", "noatime"] {
        assert!(opts.split(',').any(|w| w == o), "{o} missing in {opts}");
    }

    // An unknown option: a clear error, nothing mounted.
    let z = MountDir::new(&cluster, "z");
    let (ok, text) = run(
        &cluster,
        "mount",
        &[
            "-t",
            "fuse.mako",
            "-o",
            "bogus",
            "mako:fs1",
            z.0.to_str().unwrap(),
        ],
    );
    assert!(!ok, "mount -o bogus succeeded");
    assert!(text.contains("unknown mount option bogus"), "{text}");
    assert!(
        mountinfo(&z.0).is_none(),
        "something was mounted on {:?}",
        z.0
    );
    // An unknown file system: a clear error too.
    let (ok, text) = run(
        &cluster,
        "mount",
        &["-t", "fuse.mako", "mako:nosuchfs", z.0.to_str().unwrap()],
    );
    assert!(!ok && text.contains("no file system nosuchfs"), "{text}");

    // umount(8) ends a helper mount like any other; makod notices.
    for d in [&x.0, &y.0] {
        let (ok, text) = run(&cluster, "umount", &[d.to_str().unwrap()]);
        assert!(ok, "umount {d:?}: {text}");
    }
    wait_for("mako status without the unmounted mount points", || {
        !cluster
            .mako(&["status"])
            .unwrap()
            .text()
            .contains(&x.0.display().to_string())
    });
    cluster.down().unwrap();
    // With makod down the helper says so and what to do.
    let (ok, text) = run(
        &cluster,
        "mount",
        &["-t", "fuse.mako", "mako:fs1", x.0.to_str().unwrap()],
    );
    assert!(
        !ok && text.contains("makod is not running") && text.contains("mako up"),
        "{text}"
    );
}

#[test]
fn a_second_mount_point_sees_every_change_made_through_the_first() {
    let Some((_turn, cluster)) =
        setup("a_second_mount_point_sees_every_change_made_through_the_first")
    else {
        return;
    };
    let a = cluster.mount().to_path_buf();
    let b = MountDir::new(&cluster, "b");
    let out = cluster
        .mako(&["fs", "mount", "fs1", b.0.to_str().unwrap()])
        .unwrap();
    assert!(out.success(), "mako fs mount fs1 B: {out}");
    assert_eq!(mountinfo(&b.0).expect("B mounted").1, "fuse.mako");

    // B caches the file's attributes, pages and name first.
    std::fs::write(a.join("f"), b"one").unwrap();
    let fb = b.0.join("f");
    assert_eq!(std::fs::read(&fb).unwrap(), b"one");
    let held = std::fs::File::open(&fb).unwrap();
    assert_eq!(std::fs::metadata(&fb).unwrap().len(), 3);
    // A write through A: B's size and data follow at once, through the open file too.
    {
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(a.join("f"))
            .unwrap();
        f.write_all(b" two").unwrap();
    }
    assert_eq!(std::fs::metadata(&fb).unwrap().len(), 7);
    let mut buf = [0u8; 16];
    use std::os::unix::fs::FileExt;
    let n = held.read_at(&mut buf, 0).unwrap();
    assert_eq!(&buf[..n], b"one two");
    drop(held);
    // A name B looked up and found missing (a negative entry) appears.
    assert!(std::fs::metadata(b.0.join("g")).is_err());
    std::fs::write(a.join("g"), b"g").unwrap();
    assert_eq!(std::fs::read(b.0.join("g")).unwrap(), b"g");
    // Rename and unlink through A are seen through B.
    sys::rename(&a.join("f"), &a.join("f2")).unwrap();
    assert!(std::fs::metadata(&fb).is_err(), "B still sees the old name");
    assert_eq!(std::fs::read(b.0.join("f2")).unwrap(), b"one two");
    std::fs::remove_file(a.join("g")).unwrap();
    assert!(std::fs::metadata(b.0.join("g")).is_err(), "B still sees g");
    // And the other way round: a truncate through B.
    std::fs::OpenOptions::new()
        .write(true)
        .open(b.0.join("f2"))
        .unwrap()
        .set_len(1)
        .unwrap();
    assert_eq!(std::fs::metadata(a.join("f2")).unwrap().len(), 1);

    let status = cluster.mako(&["status"]).unwrap().text();
    assert!(
        status.contains(&a.display().to_string()) && status.contains(&b.0.display().to_string()),
        "{status}"
    );
    // Unmounting one mount point says which, and leaves the other.
    let out = cluster
        .mako(&["fs", "unmount", "fs1", b.0.to_str().unwrap()])
        .unwrap();
    assert!(out.success(), "{out}");
    assert!(out.text().contains(&b.0.display().to_string()), "{out}");
    assert!(mountinfo(&b.0).is_none());
    assert_eq!(std::fs::read(a.join("f2")).unwrap(), b"o");
    cluster.down().unwrap();
}

#[test]
fn remount_ro_and_back_to_rw() {
    let Some((_turn, cluster)) = setup("remount_ro_and_back_to_rw") else {
        return;
    };
    let _helper = Helper::install(&cluster);
    let a = cluster.mount().to_path_buf();
    let b = MountDir::new(&cluster, "b");
    let (ok, text) = run(
        &cluster,
        "mount",
        &["-t", "fuse.mako", "mako:fs1", b.0.to_str().unwrap()],
    );
    assert!(ok, "{text}");
    std::fs::write(b.0.join("f"), b"before").unwrap();

    let (ok, text) = run(
        &cluster,
        "mount",
        &["-o", "remount,ro", b.0.to_str().unwrap()],
    );
    assert!(ok, "mount -o remount,ro: {text}");
    assert!(mountinfo(&b.0).unwrap().0.starts_with("ro"));
    let e = std::fs::write(b.0.join("f"), b"x").unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EROFS), "{e}");
    let e = std::fs::write(b.0.join("new"), b"x").unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EROFS), "{e}");
    let status = cluster.mako(&["status"]).unwrap().text();
    assert!(
        status
            .lines()
            .any(|l| l.contains(&b.0.display().to_string()) && l.contains("ro,")),
        "{status}"
    );
    // The other mount point stays writable, and B reads what it writes.
    std::fs::write(a.join("f"), b"through a").unwrap();
    assert_eq!(std::fs::read(b.0.join("f")).unwrap(), b"through a");

    // `mako fs mount -o remount,rw` is the same request, from the CLI.
    let out = cluster
        .mako(&[
            "fs",
            "mount",
            "fs1",
            "-o",
            "remount,rw",
            b.0.to_str().unwrap(),
        ])
        .unwrap();
    assert!(out.success(), "{out}");
    assert!(mountinfo(&b.0).unwrap().0.starts_with("rw"));
    std::fs::write(b.0.join("f"), b"after").unwrap();
    assert_eq!(std::fs::read(a.join("f")).unwrap(), b"after");

    // A remount that bypasses the helper (`mount -i`) is followed by makod.
    let (ok, text) = run(
        &cluster,
        "mount",
        &["-i", "-o", "remount,ro", b.0.to_str().unwrap()],
    );
    assert!(ok, "{text}");
    let b_line = |s: &str| {
        s.lines()
            .find(|l| l.contains(&b.0.display().to_string()))
            .unwrap_or("")
            .to_string()
    };
    wait_for("makod to see the remount", || {
        b_line(&cluster.mako(&["status"]).unwrap().text()).contains("ro,")
    });
    cluster.down().unwrap();
}

#[test]
fn noexec_nosuid_nodev_and_atime_options_hold() {
    let Some((_turn, cluster)) = setup("noexec_nosuid_nodev_and_atime_options_hold") else {
        return;
    };
    let a = cluster.mount().to_path_buf();
    // A program and a device node, on the file system.
    std::fs::copy("/bin/true", a.join("true")).unwrap();
    sys::mknod(&a.join("null"), libc::S_IFCHR | 0o666, libc::makedev(1, 3)).unwrap();
    std::fs::write(a.join("data"), b"data").unwrap();
    // Where the options are the defaults, both work.
    assert!(Command::new(a.join("true")).status().unwrap().success());
    std::fs::OpenOptions::new()
        .write(true)
        .open(a.join("null"))
        .unwrap();

    let n = MountDir::new(&cluster, "n");
    let out = cluster
        .mako(&[
            "fs",
            "mount",
            "fs1",
            "-o",
            "noexec,nosuid,nodev,noatime",
            n.0.to_str().unwrap(),
        ])
        .unwrap();
    assert!(out.success(), "{out}");
    let (opts, _, _, _) = mountinfo(&n.0).unwrap();
    for o in ["noexec", "nosuid", "nodev", "noatime"] {
        assert!(opts.split(',').any(|w| w == o), "{o} missing in {opts}");
    }
    let e = Command::new(n.0.join("true")).status().unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EACCES), "exec on noexec: {e}");
    let e = std::fs::OpenOptions::new()
        .write(true)
        .open(n.0.join("null"))
        .unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EACCES), "device on nodev: {e}");

    // atime: set it an hour in the past (after mtime, so relatime leaves it too), then
    // read through each mount point; only strictatime moves it.
    let s = MountDir::new(&cluster, "s");
    let out = cluster
        .mako(&[
            "fs",
            "mount",
            "fs1",
            "-o",
            "strictatime",
            s.0.to_str().unwrap(),
        ])
        .unwrap();
    assert!(out.success(), "{out}");
    // The kernel shows strictatime as neither relatime nor noatime.
    let opts = mountinfo(&s.0).unwrap().0;
    assert!(
        !opts.split(',').any(|w| w == "relatime" || w == "noatime"),
        "{opts}"
    );
    // The atime makod holds now (AT_STATX_FORCE_SYNC: past the kernel's attribute cache).
    let atime = || {
        let c = sys::cstr(&a.join("data"));
        let mut st: libc::statx = unsafe { std::mem::zeroed() };
        // SAFETY: statx into a zeroed struct with a NUL-terminated path.
        let r = unsafe {
            libc::statx(
                libc::AT_FDCWD,
                c.as_ptr(),
                libc::AT_STATX_FORCE_SYNC,
                libc::STATX_ATIME,
                &mut st,
            )
        };
        assert_eq!(r, 0, "statx");
        st.stx_atime.tv_sec
    };
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    let hour_ago = [
        libc::timespec {
            tv_sec: now - 3600,
            tv_nsec: 0,
        },
        libc::timespec {
            tv_sec: now - 7200,
            tv_nsec: 0,
        },
    ];
    // utimensat sets ctime to now, so relatime would move this atime (older than ctime)
    // at the next read: noatime must not, strictatime must.
    sys::utimensat(&a.join("data"), &hour_ago, 0).unwrap();
    assert_eq!(atime(), now - 3600);
    std::fs::read(n.0.join("data")).unwrap();
    assert_eq!(
        atime(),
        now - 3600,
        "a read through a noatime mount moved atime"
    );
    std::fs::read(s.0.join("data")).unwrap();
    assert!(
        atime() >= now,
        "a read through a strictatime mount left atime"
    );
    for d in [&n.0, &s.0] {
        let out = cluster
            .mako(&["fs", "unmount", "fs1", d.to_str().unwrap()])
            .unwrap();
        assert!(out.success(), "{out}");
    }
    cluster.down().unwrap();
}
