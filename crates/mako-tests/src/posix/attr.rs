//! Checks for lookup/getattr (stat fields) and setattr (chmod, chown, truncate, utimensat).

use super::*;
use crate::sys::*;

pub(super) const CHECKS: CheckTable = &[
    ("getattr_file", getattr_file),
    ("getattr_dir", getattr_dir),
    ("getattr_symlink", getattr_symlink),
    ("lookup_errors", lookup_errors),
    ("setattr_chmod", setattr_chmod),
    ("setattr_chown", setattr_chown),
    ("setattr_truncate", setattr_truncate),
    ("setattr_utimensat", setattr_utimensat),
];

/// Tolerance for "timestamp is now" comparisons (the server's clock may be coarse).
const SLACK_NS: i128 = 5_000_000_000;

fn ts(st_sec: i64, st_nsec: i64) -> i128 {
    ts_ns(st_sec, st_nsec)
}

#[track_caller]
fn check_time_between(what: &str, t: i128, lo: i128, hi: i128) -> CheckResult {
    ensure(
        t >= lo - SLACK_NS && t <= hi + SLACK_NS,
        format!("{what} = {t} ns is not within [{lo}, {hi}] (±5 s)"),
    )
}

#[track_caller]
fn check_nsec_range(st: &libc::stat) -> CheckResult {
    for (n, v) in [
        ("atime", st.st_atime_nsec),
        ("mtime", st.st_mtime_nsec),
        ("ctime", st.st_ctime_nsec),
    ] {
        ensure(
            (0..1_000_000_000).contains(&v),
            format!("st_{n}_nsec out of range: {v}"),
        )?;
    }
    Ok(())
}

/// Expected gid of a new inode in `parent` (setgid directories propagate their group).
fn expected_gid(parent: &Path) -> libc::gid_t {
    match stat(parent) {
        Ok(st) if st.st_mode & libc::S_ISGID != 0 => st.st_gid,
        _ => unsafe { libc::getegid() },
    }
}

fn getattr_file(c: &Ctx) -> CheckResult {
    let f = c.p("file");
    let t0 = ts_ns(now().tv_sec, now().tv_nsec);
    let fd = open(&f, libc::O_CREAT | libc::O_EXCL | libc::O_RDWR, 0o644).ctx("create file")?;
    fchmod_exact(&fd, 0o640)?;
    let data = pattern(5000, 1);
    pwrite_all(&fd, &data, 0).ctx("write 5000 bytes")?;
    fsync(&fd).ctx("fsync")?;
    let t1 = ts_ns(now().tv_sec, now().tv_nsec);
    let st = stat(&f).ctx("stat file")?;
    check_mode(ftype(&st), libc::S_IFREG, "file type")?;
    check_mode(perms(&st), 0o640, "permission bits")?;
    check_eq(st.st_nlink, 1, "st_nlink of new file")?;
    check_eq(st.st_uid, unsafe { libc::geteuid() }, "st_uid of new file")?;
    check_eq(st.st_gid, expected_gid(&c.dir), "st_gid of new file")?;
    check_eq(st.st_size, 5000, "st_size after writing 5000 bytes")?;
    ensure(
        st.st_blocks > 0,
        format!(
            "st_blocks should be > 0 after fsync of 5000 bytes, got {}",
            st.st_blocks
        ),
    )?;
    ensure(
        st.st_blksize > 0,
        format!("st_blksize should be > 0, got {}", st.st_blksize),
    )?;
    check_nsec_range(&st)?;
    check_time_between("mtime", ts(st.st_mtime, st.st_mtime_nsec), t0, t1)?;
    check_time_between("ctime", ts(st.st_ctime, st.st_ctime_nsec), t0, t1)?;
    check_time_between("atime", ts(st.st_atime, st.st_atime_nsec), t0, t1)?;
    let fst = fstat(&fd).ctx("fstat")?;
    check_eq(
        (fst.st_ino, fst.st_dev, fst.st_size),
        (st.st_ino, st.st_dev, st.st_size),
        "fstat vs stat (ino, dev, size)",
    )?;
    // A sparse file has fewer blocks than its size suggests.
    let s = c.p("sparse");
    let fd2 = open(&s, libc::O_CREAT | libc::O_RDWR, 0o644).ctx("create sparse")?;
    pwrite_all(&fd2, b"x", 64 << 20).ctx("write 1 byte at 64 MiB")?;
    fsync(&fd2).ctx("fsync sparse")?;
    let st = fstat(&fd2).ctx("fstat sparse")?;
    check_eq(st.st_size, (64 << 20) + 1, "size of sparse file")?;
    ensure(
        (st.st_blocks as i64) * 512 < 16 << 20,
        format!(
            "sparse file with 1 written byte uses {} blocks of 512 B",
            st.st_blocks
        ),
    )
}

fn fchmod_exact(fd: &Fd, mode: libc::mode_t) -> CheckResult {
    cvt(unsafe { libc::fchmod(fd.raw(), mode) })
        .ctx("fchmod")
        .map(|_| ())
}

fn getattr_dir(c: &Ctx) -> CheckResult {
    let d = c.p("d");
    mkdir(&d, 0o755).ctx("mkdir d")?;
    chmod(&d, 0o751).ctx("chmod d")?;
    let st = stat(&d).ctx("stat d")?;
    check_mode(ftype(&st), libc::S_IFDIR, "dir type")?;
    check_mode(perms(&st), 0o751, "dir permission bits")?;
    check_eq(st.st_nlink, 2, "st_nlink of empty dir")?;
    mkdir(&d.join("sub"), 0o755).ctx("mkdir d/sub")?;
    check_eq(
        stat(&d).ctx("stat d")?.st_nlink,
        3,
        "st_nlink of dir with one subdir",
    )?;
    write_file(&d.join("f"), b"x", 0o644).ctx("create d/f")?;
    check_eq(
        stat(&d).ctx("stat d")?.st_nlink,
        3,
        "st_nlink of dir after adding a file (files do not count)",
    )?;
    let dot = stat(&d.join(".")).ctx("stat d/.")?;
    check_eq(dot.st_ino, st.st_ino, "d/. inode")?;
    let dotdot = stat(&d.join("sub/..")).ctx("stat d/sub/..")?;
    check_eq(dotdot.st_ino, st.st_ino, "d/sub/.. inode")?;
    check_nsec_range(&st)
}

fn getattr_symlink(c: &Ctx) -> CheckResult {
    let f = c.p("target");
    write_file(&f, b"hello", 0o644).ctx("create target")?;
    let l = c.p("link");
    symlink("target", &l).ctx("symlink")?;
    let st = lstat(&l).ctx("lstat link")?;
    check_mode(ftype(&st), libc::S_IFLNK, "lstat type")?;
    check_eq(st.st_size, 6, "lstat size of symlink = target length")?;
    let st2 = stat(&l).ctx("stat link (follows)")?;
    check_mode(ftype(&st2), libc::S_IFREG, "stat type through link")?;
    check_eq(st2.st_size, 5, "stat size through link")?;
    check_eq(
        st2.st_ino,
        stat(&f).ctx("stat target")?.st_ino,
        "stat through link reaches the target inode",
    )
}

fn lookup_errors(c: &Ctx) -> CheckResult {
    expect_errno(stat(&c.p("missing")), &[libc::ENOENT], "stat missing")?;
    expect_errno(lstat(&c.p("missing/x")), &[libc::ENOENT], "lstat missing/x")?;
    write_file(&c.p("f"), b"", 0o644).ctx("create f")?;
    expect_errno(
        stat(&c.p("f/x")),
        &[libc::ENOTDIR],
        "stat through a regular file",
    )?;
    expect_errno(
        stat(&c.p("f/")),
        &[libc::ENOTDIR],
        "stat file with trailing slash",
    )?;
    expect_errno(stat(Path::new("")), &[libc::ENOENT], "stat of empty path")?;
    mkdir(&c.p("d"), 0o755).ctx("mkdir")?;
    stat(&c.p("d/")).ctx("stat dir with trailing slash")?;
    stat(&c.p("d/./../d")).ctx("stat d/./../d")?;
    Ok(())
}

fn setattr_chmod(c: &Ctx) -> CheckResult {
    let f = c.p("f");
    write_file(&f, b"data", 0o644).ctx("create")?;
    for mode in [0o000, 0o755, 0o4711, 0o2750, 0o1777, 0o600] {
        chmod(&f, mode).ctx(format!("chmod {mode:o}"))?;
        check_mode(
            perms(&stat(&f).ctx("stat")?),
            mode,
            format!("mode after chmod {mode:o}"),
        )?;
    }
    check_mode(
        ftype(&stat(&f).ctx("stat")?),
        libc::S_IFREG,
        "type bits preserved by chmod",
    )?;
    let before = stat(&f).ctx("stat")?;
    let (c0, m0) = (
        ts(before.st_ctime, before.st_ctime_nsec),
        ts(before.st_mtime, before.st_mtime_nsec),
    );
    wait_past(c0);
    chmod(&f, 0o640).ctx("chmod 640")?;
    let after = stat(&f).ctx("stat")?;
    let c1 = ts(after.st_ctime, after.st_ctime_nsec);
    ensure(
        c1 > c0,
        format!("ctime must advance on chmod: before {c0}, after {c1}"),
    )?;
    check_eq(
        ts(after.st_mtime, after.st_mtime_nsec),
        m0,
        "mtime must not change on chmod",
    )?;
    expect_errno(
        chmod(&c.p("missing"), 0o644),
        &[libc::ENOENT],
        "chmod missing file",
    )?;
    // chmod through a symlink changes the target.
    symlink("f", &c.p("l")).ctx("symlink")?;
    chmod(&c.p("l"), 0o604).ctx("chmod via symlink")?;
    check_mode(
        perms(&stat(&f).ctx("stat")?),
        0o604,
        "target mode after chmod via symlink",
    )
}

fn setattr_chown(c: &Ctx) -> CheckResult {
    need_root("chown to arbitrary ids")?;
    let f = c.p("f");
    write_file(&f, b"data", 0o644).ctx("create")?;
    let c0 = stat(&f).ctx("stat")?;
    wait_past(ts(c0.st_ctime, c0.st_ctime_nsec));
    chown(&f, UID_A, GID_A).ctx("chown")?;
    let st = stat(&f).ctx("stat")?;
    check_eq(
        (st.st_uid, st.st_gid),
        (UID_A, GID_A),
        "uid/gid after chown",
    )?;
    ensure(
        ts(st.st_ctime, st.st_ctime_nsec) > ts(c0.st_ctime, c0.st_ctime_nsec),
        "ctime must advance on chown",
    )?;
    chown(&f, u32::MAX, GID_B).ctx("chown gid only (uid -1)")?;
    let st = stat(&f).ctx("stat")?;
    check_eq(
        (st.st_uid, st.st_gid),
        (UID_A, GID_B),
        "uid/gid after chown(-1, gid)",
    )?;
    // lchown changes the link, not the target.
    symlink("f", &c.p("l")).ctx("symlink")?;
    lchown(&c.p("l"), UID_B, GID_B).ctx("lchown")?;
    let ls = lstat(&c.p("l")).ctx("lstat")?;
    check_eq(
        (ls.st_uid, ls.st_gid),
        (UID_B, GID_B),
        "symlink owner after lchown",
    )?;
    check_eq(
        stat(&f).ctx("stat")?.st_uid,
        UID_A,
        "target owner unchanged by lchown",
    )?;
    chown(&c.p("l"), 0, 0).ctx("chown via symlink")?;
    check_eq(
        stat(&f).ctx("stat")?.st_uid,
        0,
        "target owner after chown via symlink",
    )?;
    check_eq(
        lstat(&c.p("l")).ctx("lstat")?.st_uid,
        UID_B,
        "symlink owner unchanged by chown via symlink",
    )?;
    // chown of an executable clears set-user-ID.
    chmod(&f, 0o4755).ctx("chmod 4755")?;
    chown(&f, UID_A, u32::MAX).ctx("chown suid file")?;
    check_mode(
        perms(&stat(&f).ctx("stat")?),
        0o755,
        "S_ISUID cleared by chown",
    )?;
    expect_errno(
        chown(&c.p("missing"), 0, 0),
        &[libc::ENOENT],
        "chown missing file",
    )
}

fn setattr_truncate(c: &Ctx) -> CheckResult {
    let f = c.p("f");
    write_file(&f, &[b'a'; 100], 0o644).ctx("create 100 bytes")?;
    truncate(&f, 10000).ctx("truncate up to 10000")?;
    let d = read_file(&f).ctx("read")?;
    check_eq(d.len(), 10000, "size after truncate up")?;
    ensure(
        d[..100].iter().all(|&b| b == b'a'),
        "original bytes preserved after truncate up",
    )?;
    if let Some(i) = d[100..].iter().position(|&b| b != 0) {
        return fail(format!(
            "grown region must read as zeros; byte {} is {:#x}",
            100 + i,
            d[100 + i]
        ));
    }
    truncate(&f, 50).ctx("truncate down to 50")?;
    check_eq(
        read_file(&f).ctx("read")?,
        vec![b'a'; 50],
        "content after truncate down to 50",
    )?;
    truncate(&f, 200).ctx("truncate up to 200")?;
    let d = read_file(&f).ctx("read")?;
    check_eq(d.len(), 200, "size")?;
    ensure(
        d[50..].iter().all(|&b| b == 0),
        "bytes cut off by truncate must not reappear (must read zeros)",
    )?;
    // ftruncate, also within a page with cached data.
    let fd = open(&f, libc::O_RDWR, 0).ctx("open")?;
    pwrite_all(&fd, &[b'z'; 8192], 0).ctx("write 8192")?;
    ftruncate(&fd, 4097).ctx("ftruncate 4097")?;
    check_eq(
        fstat(&fd).ctx("fstat")?.st_size,
        4097,
        "size after ftruncate",
    )?;
    ftruncate(&fd, 8192).ctx("ftruncate 8192")?;
    let mut buf = vec![0xffu8; 8192];
    check_eq(
        pread_full(&fd, &mut buf, 0).ctx("pread")?,
        8192,
        "bytes read",
    )?;
    ensure(
        buf[..4097].iter().all(|&b| b == b'z') && buf[4097..].iter().all(|&b| b == 0),
        "partial-page truncate zeroes the tail",
    )?;
    ftruncate(&fd, 0).ctx("ftruncate 0")?;
    check_eq(
        fstat(&fd).ctx("fstat")?.st_size,
        0,
        "size after ftruncate 0",
    )?;
    // Errors.
    expect_errno(
        truncate(&f, -1),
        &[libc::EINVAL],
        "truncate to negative length",
    )?;
    mkdir(&c.p("d"), 0o755).ctx("mkdir")?;
    expect_errno(
        truncate(&c.p("d"), 0),
        &[libc::EISDIR],
        "truncate a directory",
    )?;
    let ro = open(&f, libc::O_RDONLY, 0).ctx("open O_RDONLY")?;
    expect_errno(
        ftruncate(&ro, 10),
        &[libc::EINVAL, libc::EBADF],
        "ftruncate on read-only fd",
    )?;
    expect_errno(
        truncate(&c.p("missing"), 0),
        &[libc::ENOENT],
        "truncate missing file",
    )
}

fn tsp(sec: i64, nsec: i64) -> libc::timespec {
    libc::timespec {
        tv_sec: sec,
        tv_nsec: nsec,
    }
}

fn setattr_utimensat(c: &Ctx) -> CheckResult {
    let f = c.p("f");
    write_file(&f, b"x", 0o644).ctx("create")?;
    let (a, m) = (
        (1_000_000_000i64, 123_456_789i64),
        (1_200_000_000i64, 987_654_321i64),
    );
    utimensat(&f, &[tsp(a.0, a.1), tsp(m.0, m.1)], 0).ctx("utimensat explicit")?;
    let st = stat(&f).ctx("stat")?;
    check_eq(
        (st.st_atime, st.st_atime_nsec),
        a,
        "atime (sec, nsec) after explicit utimensat",
    )?;
    check_eq(
        (st.st_mtime, st.st_mtime_nsec),
        m,
        "mtime (sec, nsec) after explicit utimensat",
    )?;
    // UTIME_OMIT leaves atime, sets mtime.
    utimensat(&f, &[tsp(0, libc::UTIME_OMIT), tsp(1_300_000_000, 5)], 0)
        .ctx("utimensat OMIT/explicit")?;
    let st = stat(&f).ctx("stat")?;
    check_eq(
        (st.st_atime, st.st_atime_nsec),
        a,
        "atime unchanged with UTIME_OMIT",
    )?;
    check_eq(
        (st.st_mtime, st.st_mtime_nsec),
        (1_300_000_000, 5),
        "mtime after UTIME_OMIT call",
    )?;
    // UTIME_NOW sets atime to now, UTIME_OMIT keeps mtime.
    let t0 = ts_ns(now().tv_sec, now().tv_nsec);
    utimensat(&f, &[tsp(0, libc::UTIME_NOW), tsp(0, libc::UTIME_OMIT)], 0)
        .ctx("utimensat NOW/OMIT")?;
    let t1 = ts_ns(now().tv_sec, now().tv_nsec);
    let st = stat(&f).ctx("stat")?;
    check_time_between(
        "atime after UTIME_NOW",
        ts(st.st_atime, st.st_atime_nsec),
        t0,
        t1,
    )?;
    check_eq(
        (st.st_mtime, st.st_mtime_nsec),
        (1_300_000_000, 5),
        "mtime unchanged with UTIME_OMIT",
    )?;
    check_time_between(
        "ctime after utimensat",
        ts(st.st_ctime, st.st_ctime_nsec),
        t0,
        t1,
    )?;
    // NULL times = both now.
    let c = cstr(&f);
    cvt(unsafe { libc::utimensat(libc::AT_FDCWD, c.as_ptr(), std::ptr::null(), 0) })
        .ctx("utimensat NULL")?;
    let st = stat(&f).ctx("stat")?;
    let t2 = ts_ns(now().tv_sec, now().tv_nsec);
    check_time_between(
        "mtime after utimensat(NULL)",
        ts(st.st_mtime, st.st_mtime_nsec),
        t0,
        t2,
    )?;
    // AT_SYMLINK_NOFOLLOW changes the link itself.
    let l = f.with_file_name("l");
    symlink("f", &l).ctx("symlink")?;
    utimensat(
        &l,
        &[tsp(1_100_000_000, 1), tsp(1_100_000_000, 2)],
        libc::AT_SYMLINK_NOFOLLOW,
    )
    .ctx("utimensat nofollow")?;
    let ls = lstat(&l).ctx("lstat")?;
    check_eq(
        (ls.st_mtime, ls.st_mtime_nsec),
        (1_100_000_000, 2),
        "symlink mtime after utimensat AT_SYMLINK_NOFOLLOW",
    )?;
    check_time_between(
        "target mtime untouched",
        ts(
            stat(&f).ctx("stat")?.st_mtime,
            stat(&f).ctx("stat")?.st_mtime_nsec,
        ),
        t0,
        t2,
    )?;
    // Errors.
    expect_errno(
        utimensat(&f.with_file_name("missing"), &[tsp(1, 0), tsp(1, 0)], 0),
        &[libc::ENOENT],
        "utimensat missing file",
    )?;
    expect_errno(
        utimensat(&f, &[tsp(1, 1_000_000_000), tsp(1, 0)], 0),
        &[libc::EINVAL],
        "utimensat with tv_nsec = 1e9",
    )
}
