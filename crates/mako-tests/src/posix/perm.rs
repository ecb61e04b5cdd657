//! Permission checks as unprivileged users in forked children (setgroups/setresgid/setresuid):
//! mode bits, ownership changes, sticky and setgid directories, supplementary groups.

use super::*;
use crate::sys::*;
use std::ffi::CString;

pub(super) const CHECKS: CheckTable = &[
    ("perm_open_other_users_file", perm_open_other_users_file),
    ("perm_chmod_chown_not_owner", perm_chmod_chown_not_owner),
    ("perm_dir_search_and_write", perm_dir_search_and_write),
    ("perm_sticky_dir", perm_sticky_dir),
    ("perm_setgid_dir", perm_setgid_dir),
    ("perm_supplementary_groups", perm_supplementary_groups),
];

/// Root-owned check dir made world-accessible so children can reach their files.
fn setup(c: &Ctx, mode: libc::mode_t) -> CheckResult {
    need_root("switching to unprivileged uids")?;
    chmod(&c.dir, mode).ctx("chmod check dir")?;
    Ok(())
}

fn owned_file(p: &Path, uid: u32, gid: u32, mode: libc::mode_t) -> CheckResult {
    write_file(p, b"private", mode).ctx("create")?;
    chown(p, uid, gid).ctx("chown")?;
    chmod(p, mode).ctx("chmod")
}

fn open_as(cred: &sys::Cred, p: &Path, flags: i32) -> Result<SysResult<()>, CheckError> {
    let c = cstr(p);
    in_child(Some(cred), move || {
        child_code(cvt(unsafe {
            libc::open(c.as_ptr(), flags | libc::O_CLOEXEC, 0o644)
        }))
    })
}

fn call_as(cred: &sys::Cred, f: impl FnOnce() -> libc::c_int) -> Result<SysResult<()>, CheckError> {
    in_child(Some(cred), move || child_code(cvt(f())))
}

fn perm_open_other_users_file(c: &Ctx) -> CheckResult {
    setup(c, 0o755)?;
    let f = c.p("f");
    owned_file(&f, UID_A, GID_A, 0o600)?;
    check_eq(
        open_as(&cred_a(c), &f, libc::O_RDWR)?,
        Ok(()),
        "owner opens own 0600 file O_RDWR",
    )?;
    expect_errno(
        open_as(&cred_b(c), &f, libc::O_RDONLY)?,
        &[libc::EACCES],
        "other user opens 0600 file O_RDONLY",
    )?;
    expect_errno(
        open_as(&cred_b(c), &f, libc::O_WRONLY)?,
        &[libc::EACCES],
        "other user opens 0600 file O_WRONLY",
    )?;
    chmod(&f, 0o604).ctx("chmod 604")?;
    check_eq(
        open_as(&cred_b(c), &f, libc::O_RDONLY)?,
        Ok(()),
        "other user reads 0604 file",
    )?;
    expect_errno(
        open_as(&cred_b(c), &f, libc::O_WRONLY)?,
        &[libc::EACCES],
        "other user writes 0604 file",
    )?;
    // Owner bits take precedence even when they grant less than 'other'.
    chmod(&f, 0o066).ctx("chmod 066")?;
    expect_errno(
        open_as(&cred_a(c), &f, libc::O_RDONLY)?,
        &[libc::EACCES],
        "owner with --- owner bits (other has rw)",
    )?;
    // Creating in a root-owned 0755 directory is denied.
    expect_errno(
        open_as(&cred_b(c), &c.p("new"), libc::O_CREAT | libc::O_WRONLY)?,
        &[libc::EACCES],
        "create in dir without write permission",
    )?;
    // O_TRUNC needs write permission.
    chmod(&f, 0o644).ctx("chmod 644")?;
    expect_errno(
        open_as(&cred_b(c), &f, libc::O_RDONLY | libc::O_TRUNC)?,
        &[libc::EACCES],
        "O_TRUNC without write permission",
    )?;
    check_eq(
        stat(&f).ctx("stat")?.st_size,
        7,
        "file not truncated by the denied open",
    )
}

fn perm_chmod_chown_not_owner(c: &Ctx) -> CheckResult {
    setup(c, 0o755)?;
    let f = c.p("f");
    owned_file(&f, UID_A, GID_A, 0o644)?;
    let fc = relc(c, &f);
    let p = fc.clone();
    expect_errno(
        call_as(&cred_b(c), move || unsafe {
            libc::chmod(p.as_ptr(), 0o777)
        })?,
        &[libc::EPERM],
        "chmod of another user's file",
    )?;
    let p = fc.clone();
    check_eq(
        call_as(&cred_a(c), move || unsafe {
            libc::chmod(p.as_ptr(), 0o640)
        })?,
        Ok(()),
        "owner chmods own file",
    )?;
    check_mode(
        perms(&stat(&f).ctx("stat")?),
        0o640,
        "mode after owner chmod",
    )?;
    let p = fc.clone();
    expect_errno(
        call_as(&cred_a(c), move || unsafe {
            libc::chown(p.as_ptr(), UID_B, u32::MAX)
        })?,
        &[libc::EPERM],
        "owner gives file away (chown to other uid)",
    )?;
    let p = fc.clone();
    expect_errno(
        call_as(&cred_a(c), move || unsafe {
            libc::chown(p.as_ptr(), u32::MAX, GID_B)
        })?,
        &[libc::EPERM],
        "chgrp to a group the owner is not in",
    )?;
    let member = cred(c, UID_A, GID_A, &[GID_SHARED]);
    let p = fc.clone();
    check_eq(
        call_as(&member, move || unsafe {
            libc::chown(p.as_ptr(), u32::MAX, GID_SHARED)
        })?,
        Ok(()),
        "chgrp to a supplementary group of the owner",
    )?;
    check_eq(stat(&f).ctx("stat")?.st_gid, GID_SHARED, "gid after chgrp")?;
    // Non-member owner setting S_ISGID: bit silently cleared.
    let p = fc.clone();
    check_eq(
        call_as(&cred_a(c), move || unsafe {
            libc::chmod(p.as_ptr(), 0o2755)
        })?,
        Ok(()),
        "chmod g+s by owner not in group",
    )?;
    check_mode(
        perms(&stat(&f).ctx("stat")?),
        0o755,
        "S_ISGID dropped for owner not in file's group",
    )?;
    // utimensat with explicit times needs ownership; UTIME_NOW needs write access.
    let p = fc.clone();
    let times = [
        libc::timespec {
            tv_sec: 1,
            tv_nsec: 0,
        },
        libc::timespec {
            tv_sec: 1,
            tv_nsec: 0,
        },
    ];
    expect_errno(
        call_as(&cred_b(c), move || unsafe {
            libc::utimensat(libc::AT_FDCWD, p.as_ptr(), times.as_ptr(), 0)
        })?,
        &[libc::EPERM],
        "utimensat explicit times on another user's file",
    )?;
    let p = fc.clone();
    expect_errno(
        call_as(&cred_b(c), move || unsafe { libc::truncate(p.as_ptr(), 0) })?,
        &[libc::EACCES],
        "truncate without write permission",
    )?;
    // A write as another user clears S_ISUID.
    chmod(&f, 0o4777).ctx("chmod 4777")?;
    let p = fc.clone();
    let r = in_child(Some(&cred_b(c)), move || {
        let fd = unsafe { libc::open(p.as_ptr(), libc::O_WRONLY) };
        if fd < 0 {
            return Errno::last().0;
        }
        child_code(cvt(unsafe {
            libc::write(fd, b"x".as_ptr().cast(), 1) as i32
        }))
    })?;
    check_eq(r, Ok(()), "write by other user to 4777 file")?;
    check_mode(
        perms(&stat(&f).ctx("stat")?) & 0o4000,
        0,
        "S_ISUID cleared by an unprivileged write",
    )
}

fn perm_dir_search_and_write(c: &Ctx) -> CheckResult {
    setup(c, 0o755)?;
    let d = c.p("d");
    mkdir(&d, 0o700).ctx("mkdir")?;
    write_file(&d.join("f"), b"x", 0o644).ctx("create d/f")?;
    chown(&d, UID_A, GID_A).ctx("chown d")?;
    chmod(&d, 0o700).ctx("chmod d")?;
    let inner = relc(c, &d.join("f"));
    let p = inner.clone();
    expect_errno(
        call_as(&cred_b(c), move || {
            let mut st: libc::stat = unsafe { std::mem::zeroed() };
            unsafe { libc::stat(p.as_ptr(), &mut st) }
        })?,
        &[libc::EACCES],
        "stat through a 0700 dir of another user",
    )?;
    chmod(&d, 0o711).ctx("chmod 711")?;
    check_eq(
        open_as(&cred_b(c), &d.join("f"), libc::O_RDONLY)?,
        Ok(()),
        "open via search-only (x) dir",
    )?;
    expect_errno(
        open_as(&cred_b(c), &d, libc::O_RDONLY | libc::O_DIRECTORY)?,
        &[libc::EACCES],
        "opendir of a dir without read permission",
    )?;
    let p = inner.clone();
    expect_errno(
        call_as(&cred_b(c), move || unsafe { libc::unlink(p.as_ptr()) })?,
        &[libc::EACCES],
        "unlink in dir without write permission",
    )?;
    chmod(&d, 0o777).ctx("chmod 777")?;
    let p = inner.clone();
    check_eq(
        call_as(&cred_b(c), move || unsafe { libc::unlink(p.as_ptr()) })?,
        Ok(()),
        "unlink of root's file in a 0777 dir",
    )?;
    let p = relc(c, &d.join("newdir"));
    check_eq(
        call_as(&cred_b(c), move || unsafe {
            libc::mkdir(p.as_ptr(), 0o755)
        })?,
        Ok(()),
        "mkdir in a 0777 dir",
    )?;
    let st = stat(&d.join("newdir")).ctx("stat newdir")?;
    check_eq(
        (st.st_uid, st.st_gid),
        (UID_B, GID_B),
        "owner of a dir created by uid B",
    )
}

fn perm_sticky_dir(c: &Ctx) -> CheckResult {
    setup(c, 0o755)?;
    let d = c.p("tmp");
    mkdir(&d, 0o777).ctx("mkdir")?;
    chmod(&d, 0o1777).ctx("chmod 1777")?;
    owned_file(&d.join("a_file"), UID_A, GID_A, 0o666)?;
    let af = relc(c, &d.join("a_file"));
    let target = relc(c, &d.join("renamed"));
    let p = af.clone();
    expect_errno(
        call_as(&cred_b(c), move || unsafe { libc::unlink(p.as_ptr()) })?,
        &[libc::EPERM, libc::EACCES],
        "unlink another user's file in a sticky dir",
    )?;
    let (p, t) = (af.clone(), target.clone());
    expect_errno(
        call_as(&cred_b(c), move || unsafe {
            libc::rename(p.as_ptr(), t.as_ptr())
        })?,
        &[libc::EPERM, libc::EACCES],
        "rename another user's file in a sticky dir",
    )?;
    // B can still create and remove its own files there.
    let bf = relc(c, &d.join("b_file"));
    let p = bf.clone();
    let r = in_child(Some(&cred_b(c)), move || {
        let fd = unsafe { libc::open(p.as_ptr(), libc::O_CREAT | libc::O_WRONLY, 0o644) };
        if fd < 0 {
            return Errno::last().0;
        }
        unsafe { libc::close(fd) };
        child_code(cvt(unsafe { libc::unlink(p.as_ptr()) }))
    })?;
    check_eq(r, Ok(()), "create and unlink own file in a sticky dir")?;
    // The owner of the file may delete it.
    let p = af.clone();
    check_eq(
        call_as(&cred_a(c), move || unsafe { libc::unlink(p.as_ptr()) })?,
        Ok(()),
        "owner unlinks own file in a sticky dir",
    )?;
    // Without the sticky bit, B may delete A's file.
    chmod(&d, 0o777).ctx("chmod 777")?;
    owned_file(&d.join("a_file"), UID_A, GID_A, 0o600)?;
    let p = af.clone();
    check_eq(
        call_as(&cred_b(c), move || unsafe { libc::unlink(p.as_ptr()) })?,
        Ok(()),
        "unlink another user's file in a non-sticky 0777 dir",
    )
}

fn perm_setgid_dir(c: &Ctx) -> CheckResult {
    setup(c, 0o755)?;
    let d = c.p("sg");
    mkdir(&d, 0o775).ctx("mkdir")?;
    chown(&d, 0, GID_SHARED).ctx("chown dir to group")?;
    chmod(&d, 0o2777).ctx("chmod 2777")?;
    check_mode(perms(&stat(&d).ctx("stat")?), 0o2777, "setgid dir mode")?;
    write_file(&d.join("rootfile"), b"", 0o644).ctx("create as root")?;
    check_eq(
        stat(&d.join("rootfile")).ctx("stat")?.st_gid,
        GID_SHARED,
        "gid of file created in setgid dir",
    )?;
    mkdir(&d.join("sub"), 0o755).ctx("mkdir in setgid dir")?;
    let st = stat(&d.join("sub")).ctx("stat sub")?;
    check_eq(st.st_gid, GID_SHARED, "gid of subdir created in setgid dir")?;
    ensure(
        st.st_mode & libc::S_ISGID != 0,
        format!(
            "subdir of setgid dir must inherit S_ISGID, mode is {:o}",
            perms(&st)
        ),
    )?;
    // An unprivileged user who is not in the group also gets the directory's group.
    let p = relc(c, &d.join("bfile"));
    let q = relc(c, &d.join("bdir"));
    let r = in_child(Some(&cred_b(c)), move || {
        let fd = unsafe { libc::open(p.as_ptr(), libc::O_CREAT | libc::O_WRONLY, 0o644) };
        if fd < 0 {
            return Errno::last().0;
        }
        child_code(cvt(unsafe { libc::mkdir(q.as_ptr(), 0o755) }))
    })?;
    check_eq(
        r,
        Ok(()),
        "uid B creates a file and a dir in the setgid dir",
    )?;
    let st = stat(&d.join("bfile")).ctx("stat bfile")?;
    check_eq(
        (st.st_uid, st.st_gid),
        (UID_B, GID_SHARED),
        "owner of B's file in setgid dir",
    )?;
    let st = stat(&d.join("bdir")).ctx("stat bdir")?;
    check_eq(st.st_gid, GID_SHARED, "gid of B's dir in setgid dir")?;
    ensure(
        st.st_mode & libc::S_ISGID != 0,
        "B's subdir inherits S_ISGID",
    )?;
    // A plain directory does not propagate its group.
    let plain = c.p("plain");
    mkdir(&plain, 0o777).ctx("mkdir plain")?;
    chown(&plain, 0, GID_SHARED).ctx("chown")?;
    write_file(&plain.join("f"), b"", 0o644).ctx("create")?;
    check_eq(
        stat(&plain.join("f")).ctx("stat")?.st_gid,
        unsafe { libc::getegid() },
        "gid of file in non-setgid dir is the creator's",
    )
}

fn perm_supplementary_groups(c: &Ctx) -> CheckResult {
    setup(c, 0o755)?;
    let f = c.p("f");
    owned_file(&f, UID_A, GID_SHARED, 0o640)?;
    let member = cred(c, UID_B, GID_B, &[GID_A, GID_SHARED]);
    check_eq(
        open_as(&member, &f, libc::O_RDONLY)?,
        Ok(()),
        "read via supplementary group with g=r",
    )?;
    expect_errno(
        open_as(&member, &f, libc::O_WRONLY)?,
        &[libc::EACCES],
        "write via supplementary group with g=r",
    )?;
    expect_errno(
        open_as(&cred_b(c), &f, libc::O_RDONLY)?,
        &[libc::EACCES],
        "read as non-member with o=---",
    )?;
    // Primary group works too.
    let primary = cred(c, UID_B, GID_SHARED, &[]);
    check_eq(
        open_as(&primary, &f, libc::O_RDONLY)?,
        Ok(()),
        "read via primary group",
    )?;
    // Group bits take precedence over other bits.
    chmod(&f, 0o604).ctx("chmod 604")?;
    expect_errno(
        open_as(&member, &f, libc::O_RDONLY)?,
        &[libc::EACCES],
        "group member with g=--- (other has r)",
    )?;
    // Directory access via group.
    let d = c.p("d");
    mkdir(&d, 0o770).ctx("mkdir")?;
    chown(&d, UID_A, GID_SHARED).ctx("chown")?;
    chmod(&d, 0o770).ctx("chmod")?;
    let p: CString = relc(c, &d.join("created_by_member"));
    check_eq(
        call_as(&member, move || unsafe { libc::mkdir(p.as_ptr(), 0o700) })?,
        Ok(()),
        "mkdir in a 0770 dir via supplementary group",
    )?;
    let p: CString = relc(c, &d.join("x"));
    expect_errno(
        call_as(&cred_b(c), move || unsafe {
            libc::mkdir(p.as_ptr(), 0o700)
        })?,
        &[libc::EACCES],
        "mkdir in 0770 dir as non-member",
    )
}
