//! Clearing of setuid/setgid bits, as the kernel's own file systems do it: every change of a
//! file's data (write, truncate, `O_TRUNC`, fallocate, punch hole, zero range,
//! copy_file_range) by a caller without `CAP_FSETID` clears setuid, and setgid when the group
//! may execute or the caller is outside the file's group; a caller with `CAP_FSETID` keeps
//! them. chmod and an access ACL set by a caller
//! outside the file's group (and without `CAP_FSETID`) drop setgid. Writers are forked
//! children that switch to an unprivileged uid, keeping `CAP_FSETID` or not.

use super::xattr::{acl_encode, ACL_GROUP_OBJ, ACL_MASK, ACL_OTHER, ACL_USER, ACL_USER_OBJ};
use super::*;
use crate::sys::*;

pub(super) const CHECKS: CheckTable = &[
    (
        "setid_cleared_by_data_changes",
        setid_cleared_by_data_changes,
    ),
    ("setgid_cleared_outside_group", setgid_cleared_outside_group),
];

/// One way to change a file's data, run in a child in the check directory.
type DataChange = fn(&std::ffi::CStr, &std::ffi::CStr) -> SysResult<()>;

fn open_c(p: &std::ffi::CStr, flags: i32) -> SysResult<Fd> {
    cvt(unsafe { libc::open(p.as_ptr(), flags | libc::O_CLOEXEC) }).map(Fd::from_raw)
}

fn fallocate_c(p: &std::ffi::CStr, mode: i32) -> SysResult<()> {
    let fd = open_c(p, libc::O_RDWR)?;
    fallocate(&fd, mode, 0, 4096)
}

const DATA_CHANGES: &[(&str, DataChange)] = &[
    ("write (read-write open)", |p, _| {
        pwrite(&open_c(p, libc::O_RDWR)?, b"x", 0).map(|_| ())
    }),
    ("write (write-only open)", |p, _| {
        pwrite(&open_c(p, libc::O_WRONLY)?, b"x", 1).map(|_| ())
    }),
    ("truncate", |p, _| {
        cvt(unsafe { libc::truncate(p.as_ptr(), 3) }).map(|_| ())
    }),
    ("ftruncate", |p, _| {
        ftruncate(&open_c(p, libc::O_WRONLY)?, 2)
    }),
    ("open with O_TRUNC", |p, _| {
        open_c(p, libc::O_WRONLY | libc::O_TRUNC).map(|_| ())
    }),
    ("fallocate", |p, _| fallocate_c(p, 0)),
    ("punch hole", |p, _| {
        fallocate_c(p, libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE)
    }),
    ("zero range", |p, _| {
        fallocate_c(p, libc::FALLOC_FL_ZERO_RANGE)
    }),
    ("copy_file_range into it", |p, src| {
        let from = open_c(src, libc::O_RDONLY)?;
        let to = open_c(p, libc::O_WRONLY)?;
        let n = unsafe {
            libc::copy_file_range(
                from.raw(),
                std::ptr::null_mut(),
                to.raw(),
                std::ptr::null_mut(),
                4,
                0,
            )
        };
        cvt(n as libc::c_int).map(|_| ())
    }),
];

/// Runs `change` on `f` as `cred`; `None` when this file system does not support it.
fn change_as(
    c: &Ctx,
    cred: &Cred,
    change: DataChange,
    f: &Path,
    src: &Path,
) -> Result<Option<SysResult<()>>, CheckError> {
    let (fc, sc) = (relc(c, f), relc(c, src));
    let r = in_child(Some(cred), move || child_code(change(&fc, &sc)))?;
    Ok(match r {
        Err(e) if e.0 == libc::EOPNOTSUPP => None,
        r => Some(r),
    })
}

fn setid_cleared_by_data_changes(c: &Ctx) -> CheckResult {
    need_root("switching to unprivileged uids")?;
    chmod(&c.dir, 0o777).ctx("chmod check dir")?;
    let src = c.p("src");
    write_file(&src, b"copied bytes", 0o644).ctx("create copy source")?;
    let f = c.p("f");
    let other = cred_b(c);
    let other_fsetid = Cred {
        caps: vec![CAP_FSETID],
        ..cred_b(c)
    };
    for (i, &(what, change)) in DATA_CHANGES.iter().enumerate() {
        for (who, cred, kept) in [
            ("another user without CAP_FSETID", &other, false),
            ("another user with CAP_FSETID", &other_fsetid, true),
        ] {
            let _ = unlink(&f);
            write_file(&f, &pattern(8192, i as u8), 0o644).ctx("create")?;
            chown(&f, UID_A, GID_A).ctx("chown")?;
            chmod(&f, 0o6777).ctx("chmod 6777")?;
            let Some(r) = change_as(c, cred, change, &f, &src)? else {
                break; // e.g. zero range on tmpfs
            };
            check_eq(r, Ok(()), format!("{what} by {who}"))?;
            let expected = if kept { 0o6777 } else { 0o777 };
            check_mode(
                perms(&stat(&f).ctx("stat")?),
                expected,
                format!("mode after {what} by {who}"),
            )?;
        }
    }
    // The owner's own write clears the bits too (setuid is about privilege, not ownership).
    let _ = unlink(&f);
    write_file(&f, b"data", 0o644).ctx("create")?;
    chown(&f, UID_A, GID_A).ctx("chown")?;
    chmod(&f, 0o6755).ctx("chmod 6755")?;
    let write = DATA_CHANGES[0].1;
    let r = change_as(c, &cred_a(c), write, &f, &src)?;
    check_eq(r, Some(Ok(())), "write by the owner")?;
    check_mode(
        perms(&stat(&f).ctx("stat")?),
        0o755,
        "mode after the owner's write",
    )?;
    // Setgid without group execute survives a write by a member of the file's group, and
    // goes with a write by anyone else without CAP_FSETID (Linux 6.2 and later).
    for (who, cred, expected) in [
        (
            "a member of the group",
            cred(c, UID_B, GID_B, &[GID_A]),
            0o2666,
        ),
        ("someone outside the group", cred_b(c), 0o666),
    ] {
        chmod(&f, 0o2666).ctx("chmod 2666")?;
        let r = change_as(c, &cred, write, &f, &src)?;
        check_eq(r, Some(Ok(())), format!("write to a 2666 file by {who}"))?;
        check_mode(
            perms(&stat(&f).ctx("stat")?),
            expected,
            format!("mode of a 2666 file after a write by {who}"),
        )?;
    }
    // Root has CAP_FSETID.
    chmod(&f, 0o6777).ctx("chmod 6777")?;
    let fd = open(&f, libc::O_WRONLY, 0).ctx("open as root")?;
    pwrite(&fd, b"r", 0).ctx("write as root")?;
    check_mode(
        perms(&stat(&f).ctx("stat")?),
        0o6777,
        "mode after a write by root",
    )
}

fn setgid_cleared_outside_group(c: &Ctx) -> CheckResult {
    need_root("switching to unprivileged uids")?;
    chmod(&c.dir, 0o777).ctx("chmod check dir")?;
    let f = c.p("f");
    write_file(&f, b"data", 0o644).ctx("create")?;
    // Owned by A, group B: A is not in the file's group.
    chown(&f, UID_A, GID_B).ctx("chown")?;
    let fc = relc(c, &f);
    // chmod g+s by the owner outside the group: the kernel drops setgid.
    chmod(&f, 0o775).ctx("chmod 775")?;
    let p = fc.clone();
    let r = in_child(Some(&cred_a(c)), move || {
        child_code(cvt(unsafe { libc::chmod(p.as_ptr(), 0o2775) }))
    })?;
    check_eq(r, Ok(()), "chmod 2775 by the owner outside the group")?;
    check_mode(
        perms(&stat(&f).ctx("stat")?),
        0o775,
        "setgid dropped by chmod outside the group",
    )?;
    // An access ACL set by the owner: setgid goes unless the owner is in the group or
    // has CAP_FSETID. The ACL's mask gives the group bits.
    let acl = acl_encode(&[
        (ACL_USER_OBJ, 7, u32::MAX),
        (ACL_USER, 7, UID_B),
        (ACL_GROUP_OBJ, 5, u32::MAX),
        (ACL_MASK, 7, u32::MAX),
        (ACL_OTHER, 5, u32::MAX),
    ]);
    let minimal = acl_encode(&[
        (ACL_USER_OBJ, 7, u32::MAX),
        (ACL_GROUP_OBJ, 5, u32::MAX),
        (ACL_OTHER, 5, u32::MAX),
    ]);
    let member = cred(c, UID_A, GID_A, &[GID_B]);
    let with_fsetid = Cred {
        caps: vec![CAP_FSETID],
        ..cred_a(c)
    };
    for (what, value, cred, expected) in [
        ("ACL by the owner outside the group", &acl, cred_a(c), 0o775),
        (
            "minimal ACL by the owner outside the group",
            &minimal,
            cred_a(c),
            0o755,
        ),
        ("ACL by the owner in the group", &acl, member, 0o2775),
        (
            "ACL by the owner with CAP_FSETID",
            &acl,
            with_fsetid,
            0o2775,
        ),
    ] {
        let _ = removexattr(&f, "system.posix_acl_access");
        chmod(&f, 0o2775).ctx("chmod 2775 as root")?;
        let (p, v) = (fc.clone(), value.clone());
        let r = in_child(Some(&cred), move || {
            let n = c"system.posix_acl_access";
            child_code(cvt(unsafe {
                libc::setxattr(p.as_ptr(), n.as_ptr(), v.as_ptr().cast(), v.len(), 0)
            }))
        })?;
        unsupported_skip(r, "POSIX ACLs")?.ctx(what)?;
        check_mode(
            perms(&stat(&f).ctx("stat")?),
            expected,
            format!("mode after {what}"),
        )?;
    }
    Ok(())
}
