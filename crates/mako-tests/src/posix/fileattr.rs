//! File attributes through the usual ioctls (what chattr and lsattr use): immutable and
//! append-only, enforced for every caller including root, readable with FS_IOC_GETFLAGS,
//! FS_IOC_FSGETXATTR and statx; settable only with CAP_LINUX_IMMUTABLE. Also statx's birth
//! time.

use super::*;
use crate::sys::*;

pub(super) const CHECKS: CheckTable = &[
    ("chattr_immutable", chattr_immutable),
    ("chattr_append_only", chattr_append_only),
    (
        "chattr_needs_cap_linux_immutable",
        chattr_needs_cap_linux_immutable,
    ),
    ("statx_birth_time", statx_birth_time),
];

pub(crate) const FS_IOC_GETFLAGS: libc::c_ulong = 0x8008_6601;
pub(crate) const FS_IOC_SETFLAGS: libc::c_ulong = 0x4008_6602;
const FS_IOC_FSGETXATTR: libc::c_ulong = 0x801c_581f;
pub(crate) const FS_IMMUTABLE_FL: libc::c_int = 0x10;
pub(crate) const FS_APPEND_FL: libc::c_int = 0x20;
const FS_XFLAG_IMMUTABLE: u32 = 0x8;
const FS_XFLAG_APPEND: u32 = 0x10;

/// FS_IOC_GETFLAGS of the file at `p`.
pub(crate) fn get_flags(p: &Path) -> SysResult<libc::c_int> {
    let fd = open(p, libc::O_RDONLY | libc::O_NONBLOCK, 0)?;
    let mut f: libc::c_int = 0;
    cvt(unsafe { libc::ioctl(fd.raw(), FS_IOC_GETFLAGS, &mut f) })?;
    Ok(f)
}

/// FS_IOC_SETFLAGS on the file at `p`, as chattr does it.
pub(crate) fn set_flags(p: &Path, f: libc::c_int) -> SysResult<()> {
    let fd = open(p, libc::O_RDONLY | libc::O_NONBLOCK, 0)?;
    cvt(unsafe { libc::ioctl(fd.raw(), FS_IOC_SETFLAGS, &f) }).map(|_| ())
}

/// Clears `flag` on `p`, keeping the file system's other flags (ext4 refuses to drop its
/// extents flag, for one).
pub(crate) fn clear_flag(p: &Path, flag: libc::c_int) -> SysResult<()> {
    set_flags(p, get_flags(p)? & !flag)
}

/// `fsx_xflags` from FS_IOC_FSGETXATTR.
fn get_xflags(p: &Path) -> SysResult<u32> {
    let fd = open(p, libc::O_RDONLY | libc::O_NONBLOCK, 0)?;
    let mut fsx = [0u32; 7];
    cvt(unsafe { libc::ioctl(fd.raw(), FS_IOC_FSGETXATTR, fsx.as_mut_ptr()) })?;
    Ok(fsx[0])
}

fn statx_of(p: &Path, mask: u32) -> SysResult<libc::statx> {
    let c = cstr(p);
    let mut st: libc::statx = unsafe { std::mem::zeroed() };
    cvt(unsafe {
        libc::statx(
            libc::AT_FDCWD,
            c.as_ptr(),
            libc::AT_SYMLINK_NOFOLLOW,
            mask,
            &mut st,
        )
    })?;
    Ok(st)
}

/// Sets `flag` on `p` (skips where the file system has no such attributes) and checks that
/// every way of reading it back says so.
fn set_and_read_back(p: &Path, flag: libc::c_int, xflag: u32, statx_attr: u64) -> CheckResult {
    let old = unsupported_skip(
        get_flags(p).map_err(|e| {
            if e.0 == libc::ENOTTY {
                Errno(libc::EOPNOTSUPP)
            } else {
                e
            }
        }),
        "FS_IOC_GETFLAGS",
    )?
    .ctx("FS_IOC_GETFLAGS")?;
    set_flags(p, old | flag).ctx(format!("FS_IOC_SETFLAGS {flag:#x}"))?;
    ensure(
        get_flags(p).ctx("FS_IOC_GETFLAGS")? & flag != 0,
        format!("FS_IOC_GETFLAGS shows {flag:#x} after setting it"),
    )?;
    ensure(
        get_xflags(p).ctx("FS_IOC_FSGETXATTR")? & xflag != 0,
        format!("FS_IOC_FSGETXATTR shows {xflag:#x}"),
    )?;
    let st = statx_of(p, libc::STATX_BASIC_STATS).ctx("statx")?;
    if st.stx_attributes_mask & statx_attr != 0 {
        ensure(
            st.stx_attributes & statx_attr != 0,
            format!("statx attributes show {statx_attr:#x}"),
        )?;
    }
    Ok(())
}

fn time_pair(sec: i64) -> [libc::timespec; 2] {
    [libc::timespec {
        tv_sec: sec,
        tv_nsec: 0,
    }; 2]
}

fn chattr_immutable(c: &Ctx) -> CheckResult {
    need_root("setting the immutable attribute (CAP_LINUX_IMMUTABLE)")?;
    let f = c.p("f");
    write_file(&f, b"constant", 0o644).ctx("create")?;
    setxattr(&f, "user.k", b"v", 0, false).ctx("setxattr before +i")?;
    let early = open(&f, libc::O_RDWR, 0).ctx("open read-write before +i")?;
    let d = c.p("d");
    mkdir(&d, 0o755).ctx("mkdir")?;
    write_file(&d.join("in"), b"x", 0o644).ctx("create d/in")?;
    set_and_read_back(
        &f,
        FS_IMMUTABLE_FL,
        FS_XFLAG_IMMUTABLE,
        libc::STATX_ATTR_IMMUTABLE as u64,
    )?;
    set_and_read_back(
        &d,
        FS_IMMUTABLE_FL,
        FS_XFLAG_IMMUTABLE,
        libc::STATX_ATTR_IMMUTABLE as u64,
    )?;
    // Root is refused everything that would change the file.
    let eperm = |r: SysResult<()>, what: &str| expect_errno(r, &[libc::EPERM], what);
    eperm(
        open(&f, libc::O_WRONLY, 0).map(|_| ()),
        "open O_WRONLY of an immutable file",
    )?;
    eperm(
        open(&f, libc::O_RDWR, 0).map(|_| ()),
        "open O_RDWR of an immutable file",
    )?;
    // Through a descriptor opened before +i, ext4 (and Mako) refuse every change; tmpfs
    // lets writes through (a known deviation: chattr is not POSIX).
    let tmpfs = super::io::statvfs_type(&c.dir) == Some(super::io::TMPFS_MAGIC);
    if !tmpfs {
        eperm(
            pwrite(&early, b"y", 0).map(|_| ()),
            "write through an fd opened before +i",
        )?;
        eperm(
            ftruncate(&early, 1),
            "ftruncate through an fd opened before +i",
        )?;
        eperm(
            fallocate(&early, 0, 0, 4096),
            "fallocate of an immutable file",
        )?;
    }
    eperm(truncate(&f, 0), "truncate of an immutable file")?;
    eperm(chmod(&f, 0o600), "chmod of an immutable file")?;
    eperm(chown(&f, UID_A, GID_A), "chown of an immutable file")?;
    eperm(
        utimensat(&f, &time_pair(1), 0),
        "utimensat of an immutable file",
    )?;
    eperm(link(&f, &c.p("g")), "link to an immutable file")?;
    eperm(unlink(&f), "unlink of an immutable file")?;
    eperm(rename(&f, &c.p("h")), "rename of an immutable file")?;
    eperm(
        setxattr(&f, "user.k", b"w", 0, false),
        "setxattr on an immutable file",
    )?;
    eperm(
        removexattr(&f, "user.k"),
        "removexattr on an immutable file",
    )?;
    // An immutable directory takes no new entries and loses none.
    eperm(
        write_file(&d.join("new"), b"", 0o644),
        "create in an immutable directory",
    )?;
    eperm(
        mkdir(&d.join("sub"), 0o755),
        "mkdir in an immutable directory",
    )?;
    eperm(unlink(&d.join("in")), "unlink in an immutable directory")?;
    eperm(
        rename(&d.join("in"), &d.join("in2")),
        "rename in an immutable directory",
    )?;
    // Reading is fine, and the content is what it was.
    if !tmpfs {
        check_eq(
            read_file(&f).ctx("read")?,
            b"constant".to_vec(),
            "content of the immutable file",
        )?;
    }
    // Cleared again, everything works.
    clear_flag(&f, FS_IMMUTABLE_FL).ctx("chattr -i file")?;
    clear_flag(&d, FS_IMMUTABLE_FL).ctx("chattr -i dir")?;
    check_eq(
        get_flags(&f).ctx("FS_IOC_GETFLAGS")? & FS_IMMUTABLE_FL,
        0,
        "flag cleared",
    )?;
    pwrite(&early, b"y", 0).ctx("write after -i")?;
    unlink(&d.join("in")).ctx("unlink in the directory after -i")?;
    unlink(&f).ctx("unlink after -i")
}

fn chattr_append_only(c: &Ctx) -> CheckResult {
    need_root("setting the append-only attribute (CAP_LINUX_IMMUTABLE)")?;
    let f = c.p("f");
    write_file(&f, b"log:", 0o644).ctx("create")?;
    let d = c.p("d");
    mkdir(&d, 0o755).ctx("mkdir")?;
    write_file(&d.join("in"), b"x", 0o644).ctx("create d/in")?;
    set_and_read_back(
        &f,
        FS_APPEND_FL,
        FS_XFLAG_APPEND,
        libc::STATX_ATTR_APPEND as u64,
    )?;
    set_and_read_back(
        &d,
        FS_APPEND_FL,
        FS_XFLAG_APPEND,
        libc::STATX_ATTR_APPEND as u64,
    )?;
    let eperm = |r: SysResult<()>, what: &str| expect_errno(r, &[libc::EPERM], what);
    eperm(
        open(&f, libc::O_WRONLY, 0).map(|_| ()),
        "open O_WRONLY without O_APPEND",
    )?;
    eperm(
        open(&f, libc::O_WRONLY | libc::O_APPEND | libc::O_TRUNC, 0).map(|_| ()),
        "open with O_TRUNC",
    )?;
    let a = open(&f, libc::O_WRONLY | libc::O_APPEND, 0).ctx("open O_APPEND")?;
    write(&a, b"one").ctx("append")?;
    // With O_APPEND the offset is ignored: the bytes go to the end.
    pwrite(&a, b"two", 0).ctx("pwrite with O_APPEND")?;
    check_eq(
        read_file(&f).ctx("read")?,
        b"log:onetwo".to_vec(),
        "appended content",
    )?;
    eperm(truncate(&f, 0), "truncate of an append-only file")?;
    eperm(ftruncate(&a, 0), "ftruncate of an append-only file")?;
    eperm(
        fallocate(
            &a,
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            0,
            4,
        ),
        "punch hole in an append-only file",
    )?;
    eperm(chmod(&f, 0o600), "chmod of an append-only file")?;
    eperm(
        utimensat(&f, &time_pair(1), 0),
        "explicit times on an append-only file",
    )?;
    let now = [libc::timespec {
        tv_sec: 0,
        tv_nsec: libc::UTIME_NOW,
    }; 2];
    utimensat(&f, &now, 0).ctx("utimensat to now on an append-only file")?;
    eperm(link(&f, &c.p("g")), "link to an append-only file")?;
    eperm(unlink(&f), "unlink of an append-only file")?;
    eperm(rename(&f, &c.p("h")), "rename of an append-only file")?;
    eperm(
        setxattr(&f, "user.k", b"v", 0, false),
        "setxattr on an append-only file",
    )?;
    // An append-only directory takes new entries but loses none.
    write_file(&d.join("new"), b"", 0o644).ctx("create in an append-only directory")?;
    eperm(unlink(&d.join("in")), "unlink in an append-only directory")?;
    eperm(
        rename(&d.join("in"), &d.join("in2")),
        "rename in an append-only directory",
    )?;
    clear_flag(&f, FS_APPEND_FL).ctx("chattr -a file")?;
    clear_flag(&d, FS_APPEND_FL).ctx("chattr -a dir")?;
    truncate(&f, 0).ctx("truncate after -a")?;
    unlink(&d.join("in")).ctx("unlink in the directory after -a")
}

fn chattr_needs_cap_linux_immutable(c: &Ctx) -> CheckResult {
    need_root("switching to unprivileged uids")?;
    chmod(&c.dir, 0o777).ctx("chmod check dir")?;
    let f = c.p("f");
    write_file(&f, b"x", 0o644).ctx("create")?;
    chown(&f, UID_A, GID_A).ctx("chown")?;
    unsupported_skip(
        get_flags(&f).map_err(|e| {
            if e.0 == libc::ENOTTY {
                Errno(libc::EOPNOTSUPP)
            } else {
                e
            }
        }),
        "FS_IOC_GETFLAGS",
    )?
    .ctx("FS_IOC_GETFLAGS")?;
    let base = get_flags(&f).ctx("FS_IOC_GETFLAGS")?;
    let set_as = |cred: &Cred, flag: libc::c_int| {
        let p = relc(c, &f);
        in_child(Some(cred), move || {
            let fd = unsafe { libc::open(p.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) };
            if fd < 0 {
                return Errno::last().0;
            }
            child_code(cvt(unsafe { libc::ioctl(fd, FS_IOC_SETFLAGS, &flag) }))
        })
    };
    for flag in [FS_IMMUTABLE_FL, FS_APPEND_FL] {
        expect_errno(
            set_as(&cred_a(c), base | flag)?,
            &[libc::EPERM],
            format!("owner without CAP_LINUX_IMMUTABLE sets {flag:#x}"),
        )?;
        expect_errno(
            set_as(&cred_b(c), base | flag)?,
            &[libc::EPERM],
            format!("another user sets {flag:#x}"),
        )?;
        let with_cap = Cred {
            caps: vec![CAP_LINUX_IMMUTABLE],
            ..cred_a(c)
        };
        check_eq(
            set_as(&with_cap, base | flag)?,
            Ok(()),
            format!("owner with CAP_LINUX_IMMUTABLE sets {flag:#x}"),
        )?;
        check_eq(
            get_flags(&f).ctx("FS_IOC_GETFLAGS")? & flag,
            flag,
            "flag set",
        )?;
        expect_errno(
            set_as(&cred_a(c), base)?,
            &[libc::EPERM],
            format!("owner without CAP_LINUX_IMMUTABLE clears {flag:#x}"),
        )?;
        clear_flag(&f, flag).ctx("clear as root")?;
    }
    Ok(())
}

fn statx_birth_time(c: &Ctx) -> CheckResult {
    let before = now();
    wait_past(sys::ts_ns(before.tv_sec, before.tv_nsec));
    let f = c.p("f");
    write_file(&f, b"born", 0o644).ctx("create")?;
    let st = statx_of(&f, libc::STATX_BASIC_STATS | libc::STATX_BTIME).ctx("statx")?;
    if st.stx_mask & libc::STATX_BTIME == 0 {
        return skip("this file system reports no birth time (statx STATX_BTIME)");
    }
    let ns = |t: libc::statx_timestamp| sys::ts_ns(t.tv_sec, t.tv_nsec as i64);
    let btime = ns(st.stx_btime);
    ensure(
        btime > sys::ts_ns(before.tv_sec, before.tv_nsec),
        format!("birth time {btime} after the time before the create"),
    )?;
    ensure(
        btime <= ns(st.stx_ctime),
        "birth time not after the change time",
    )?;
    // Later changes move mtime and ctime, never the birth time.
    wait_past(ns(st.stx_ctime));
    let fd = open(&f, libc::O_WRONLY, 0).ctx("open")?;
    pwrite(&fd, b"grown", 4).ctx("write")?;
    drop(fd);
    chmod(&f, 0o600).ctx("chmod")?;
    let st2 =
        statx_of(&f, libc::STATX_BASIC_STATS | libc::STATX_BTIME).ctx("statx after changes")?;
    ensure(ns(st2.stx_ctime) > ns(st.stx_ctime), "ctime moved")?;
    check_eq(
        ns(st2.stx_btime),
        btime,
        "birth time after a write and a chmod",
    )
}
