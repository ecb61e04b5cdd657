//! Miscellaneous checks: statfs fields and space accounting, relatime atime behaviour, name and
//! path length limits.

use super::*;
use crate::sys::*;

pub(super) const CHECKS: CheckTable = &[
    ("statfs_fields", statfs_fields),
    ("statfs_space_accounting", statfs_space_accounting),
    ("atime_relatime", atime_relatime),
    ("name_max_255", name_max_255),
    ("path_near_path_max", path_near_path_max),
];

fn statfs_fields(c: &Ctx) -> CheckResult {
    let s = statvfs(&c.dir).ctx("statvfs")?;
    ensure(
        s.f_bsize > 0,
        format!("f_bsize must be > 0, got {}", s.f_bsize),
    )?;
    ensure(
        s.f_frsize > 0,
        format!("f_frsize must be > 0, got {}", s.f_frsize),
    )?;
    ensure(
        s.f_blocks > 0,
        format!("f_blocks must be > 0, got {}", s.f_blocks),
    )?;
    ensure(
        s.f_bfree <= s.f_blocks,
        format!("f_bfree {} > f_blocks {}", s.f_bfree, s.f_blocks),
    )?;
    ensure(
        s.f_bavail <= s.f_bfree,
        format!("f_bavail {} > f_bfree {}", s.f_bavail, s.f_bfree),
    )?;
    ensure(
        s.f_files > 0,
        format!("f_files must be > 0, got {}", s.f_files),
    )?;
    ensure(
        s.f_ffree <= s.f_files,
        format!("f_ffree {} > f_files {}", s.f_ffree, s.f_files),
    )?;
    ensure(
        s.f_namemax >= 255,
        format!("f_namemax must be >= 255, got {}", s.f_namemax),
    )?;
    // fstatvfs on an fd agrees on the geometry.
    let fd = open(&c.dir, libc::O_RDONLY | libc::O_DIRECTORY, 0).ctx("open dir")?;
    let mut s2: libc::statvfs = unsafe { std::mem::zeroed() };
    cvt(unsafe { libc::fstatvfs(fd.raw(), &mut s2) }).ctx("fstatvfs")?;
    check_eq(
        (s2.f_bsize, s2.f_blocks, s2.f_namemax),
        (s.f_bsize, s.f_blocks, s.f_namemax),
        "fstatvfs vs statvfs (bsize, blocks, namemax)",
    )?;
    expect_errno(
        statvfs(&c.p("missing")),
        &[libc::ENOENT],
        "statvfs on missing path",
    )
}

/// Free bytes according to statvfs.
fn free_bytes(p: &Path) -> Result<u64, CheckError> {
    let s = statvfs(p).ctx("statvfs")?;
    Ok(s.f_bfree * s.f_frsize)
}

/// Polls `cond` (re-reading free space after a sync) for up to 10 s; the file system may release
/// space asynchronously. Returns the last reading.
fn poll_free(p: &Path, cond: impl Fn(u64) -> bool) -> Result<(u64, bool), CheckError> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        if let Ok(fd) = open(p, libc::O_RDONLY | libc::O_DIRECTORY, 0) {
            unsafe { libc::syncfs(fd.raw()) };
        }
        let f = free_bytes(p)?;
        if cond(f) || std::time::Instant::now() > deadline {
            return Ok((f, cond(f)));
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

fn statfs_space_accounting(c: &Ctx) -> CheckResult {
    const SIZE: u64 = 64 << 20;
    let s = statvfs(&c.dir).ctx("statvfs")?;
    if s.f_bavail * s.f_frsize < 4 * SIZE {
        return skip(format!("needs {} MiB free", (4 * SIZE) >> 20));
    }
    // Other processes may use the same file system concurrently: accept the first of 3 attempts
    // in which both the drop and the recovery are visible (each judged against the reading
    // right before it, with 25% slack).
    let mut last = String::new();
    for attempt in 1..=3 {
        let f = c.p(&format!("big{attempt}"));
        let before = poll_free(&c.dir, |_| true)?.0;
        let fd = open(&f, libc::O_CREAT | libc::O_WRONLY | libc::O_TRUNC, 0o644).ctx("create")?;
        let chunk = vec![0x5au8; 1 << 20];
        for i in 0..(SIZE >> 20) {
            pwrite_all(&fd, &chunk, i << 20).ctx("write 64 MiB")?;
        }
        fsync(&fd).ctx("fsync")?;
        drop(fd);
        let (after, dropped) = poll_free(&c.dir, |f| f + SIZE * 3 / 4 <= before)?;
        unlink(&f).ctx("unlink")?;
        let (released, recovered) = poll_free(&c.dir, |f| f >= after + SIZE * 3 / 4)?;
        if dropped && recovered {
            return Ok(());
        }
        last = format!(
            "attempt {attempt}: free before {before}, after writing 64 MiB {after} (dropped {}), after unlink {released} (recovered {})",
            before as i128 - after as i128,
            released as i128 - after as i128
        );
    }
    fail(format!(
        "free space did not follow a 64 MiB write + unlink (need >= 48 MiB each way): {last}"
    ))
}

fn atime_relatime(c: &Ctx) -> CheckResult {
    let flags = statvfs(&c.dir).ctx("statvfs")?.f_flag;
    if flags & libc::ST_NOATIME != 0 {
        return skip("mounted noatime");
    }
    let relatime = flags & libc::ST_RELATIME != 0;
    let f = c.p("f");
    write_file(&f, b"some data", 0o644).ctx("create")?;
    // atime well before mtime: the next read must update atime.
    let old_a = libc::timespec {
        tv_sec: 1_500_000_000,
        tv_nsec: 0,
    };
    let old_m = libc::timespec {
        tv_sec: 1_600_000_000,
        tv_nsec: 0,
    };
    utimensat(&f, &[old_a, old_m], 0).ctx("set atime < mtime")?;
    // relatime also updates while atime <= ctime; let the clock move past the ctime just set.
    let st = stat(&f).ctx("stat")?;
    wait_past(ts_ns(st.st_ctime, st.st_ctime_nsec));
    let fd = open(&f, libc::O_RDONLY, 0).ctx("open")?;
    let mut buf = [0u8; 4];
    pread(&fd, &mut buf, 0).ctx("first read")?;
    let a1 = stat(&f).ctx("stat")?;
    ensure(
        a1.st_atime > old_m.tv_sec,
        format!(
            "atime must be updated by a read when atime <= mtime: atime {} (was {}, mtime {})",
            a1.st_atime, old_a.tv_sec, old_m.tv_sec
        ),
    )?;
    check_eq(a1.st_mtime, old_m.tv_sec, "mtime unchanged by read")?;
    if !relatime {
        return Ok(()); // strictatime: a second read may legitimately update atime again
    }
    pread(&fd, &mut buf, 0).ctx("second read")?;
    drop(fd);
    let fd = open(&f, libc::O_RDONLY, 0).ctx("reopen")?;
    pread(&fd, &mut buf, 0).ctx("third read")?;
    let a2 = stat(&f).ctx("stat")?;
    check_eq(
        (a2.st_atime, a2.st_atime_nsec),
        (a1.st_atime, a1.st_atime_nsec),
        "relatime: atime not updated by later reads when atime > mtime",
    )?;
    // Writing (mtime moves past atime) re-arms the update.
    utimensat(
        &f,
        &[
            libc::timespec {
                tv_sec: 1_500_000_000,
                tv_nsec: 0,
            },
            libc::timespec {
                tv_sec: 0,
                tv_nsec: libc::UTIME_NOW,
            },
        ],
        0,
    )
    .ctx("set atime old, mtime now")?;
    pread(&fd, &mut buf, 0).ctx("read after mtime moved")?;
    // The kernel's attribute cache (FUSE entry/attr TTL, 2 s on Mako) may answer stat
    // with the old atime for a while; once it expires, stat asks the file system, which
    // must have seen the read (a read the kernel served from its page cache would leave
    // the stored atime old). Poll until the update shows, for well past the TTL.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let a3 = stat(&f).ctx("stat")?;
        if a3.st_atime > 1_500_000_000 {
            return Ok(());
        }
        if std::time::Instant::now() > deadline {
            return ensure(
                false,
                "relatime: atime updated when mtime is newer than atime (still old after 10 s)",
            );
        }
        std::thread::sleep(std::time::Duration::from_millis(50)); // poll
    }
}

fn name_max_255(c: &Ctx) -> CheckResult {
    let n255 = "a".repeat(255);
    let p = c.p(&n255);
    write_file(&p, b"x", 0o644).ctx("create file with 255-byte name")?;
    check_eq(
        read_file(&p).ctx("read")?,
        b"x".to_vec(),
        "content of 255-byte-name file",
    )?;
    let listed =
        std::fs::read_dir(&c.dir).map_err(|e| CheckError::Fail(format!("read_dir: {e}")))?;
    ensure(
        listed.flatten().any(|e| e.file_name().len() == 255),
        "255-byte name listed by readdir",
    )?;
    let d255 = "d".repeat(255);
    mkdir(&c.p(&d255), 0o755).ctx("mkdir with 255-byte name")?;
    symlink(&n255, &c.p(&"s".repeat(255))).ctx("symlink with 255-byte name")?;
    rename(&p, &c.p(&"b".repeat(255))).ctx("rename to 255-byte name")?;
    let n256 = "a".repeat(256);
    expect_errno(
        open(&c.p(&n256), libc::O_CREAT | libc::O_WRONLY, 0o644),
        &[libc::ENAMETOOLONG],
        "create with 256-byte name",
    )?;
    expect_errno(
        mkdir(&c.p(&n256), 0o755),
        &[libc::ENAMETOOLONG],
        "mkdir with 256-byte name",
    )?;
    expect_errno(
        stat(&c.p(&n256)),
        &[libc::ENAMETOOLONG],
        "stat with 256-byte name",
    )?;
    expect_errno(
        rename(&c.p(&"b".repeat(255)), &c.p(&n256)),
        &[libc::ENAMETOOLONG],
        "rename to 256-byte name",
    )?;
    expect_errno(
        symlink("x", &c.p(&n256)),
        &[libc::ENAMETOOLONG],
        "symlink with 256-byte name",
    )
}

fn path_near_path_max(c: &Ctx) -> CheckResult {
    let base = c.dir.as_os_str().len();
    let comp = "p".repeat(200);
    // Build nested dirs with *at calls so no single call exceeds PATH_MAX while building.
    let mut path = c.dir.clone();
    let mut dfd = open(&c.dir, libc::O_RDONLY | libc::O_DIRECTORY, 0).ctx("open check dir")?;
    // Leave room for "/" + a final file name of 20 bytes.
    while path.as_os_str().len() + 1 + comp.len() + 1 + 20 < 4095 {
        let cc = std::ffi::CString::new(comp.as_str()).unwrap();
        cvt(unsafe { libc::mkdirat(dfd.raw(), cc.as_ptr(), 0o755) })
            .ctx(format!("mkdirat at depth {}", path.as_os_str().len()))?;
        let nfd = cvt(unsafe {
            libc::openat(
                dfd.raw(),
                cc.as_ptr(),
                libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
            )
        })
        .ctx("openat")?;
        dfd = Fd::from_raw(nfd);
        path.push(&comp);
    }
    if path.as_os_str().len() <= base + 2000 {
        return skip(format!(
            "check directory path is too long ({base} bytes) to build a deep path"
        ));
    }
    // Pad the final name so the full path is exactly 4095 bytes (PATH_MAX incl. NUL).
    let fill = 4095 - path.as_os_str().len() - 1;
    let file = path.join("f".repeat(fill));
    check_eq(file.as_os_str().len(), 4095, "constructed path length")?;
    write_file(&file, b"deep", 0o644).ctx("create file via a 4095-byte absolute path")?;
    check_eq(
        read_file(&file).ctx("read via 4095-byte path")?,
        b"deep".to_vec(),
        "content via long path",
    )?;
    stat(&file).ctx("stat via 4095-byte path")?;
    let too_long = path.join("f".repeat(fill + 1));
    expect_errno(
        stat(&too_long),
        &[libc::ENAMETOOLONG],
        "stat of a 4096-byte path",
    )?;
    expect_errno(
        open(&too_long, libc::O_CREAT | libc::O_WRONLY, 0o644),
        &[libc::ENAMETOOLONG],
        "create via a 4096-byte path",
    )?;
    unlink(&file).ctx("unlink via 4095-byte path")
}
