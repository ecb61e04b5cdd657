//! Checks for advisory locking: flock(2) between open file descriptions, POSIX record locks
//! between processes (F_SETLK/F_GETLK with byte ranges) and open-file-description locks.

use super::*;
use crate::sys::*;

pub(super) const CHECKS: CheckTable = &[
    ("flock_conflict", flock_conflict),
    ("posix_record_locks", posix_record_locks),
    ("ofd_locks", ofd_locks),
];

fn flock_conflict(c: &Ctx) -> CheckResult {
    let f = c.p("f");
    write_file(&f, b"x", 0o644).ctx("create")?;
    let a = open(&f, libc::O_RDWR, 0).ctx("open #1")?;
    let b = open(&f, libc::O_RDWR, 0).ctx("open #2")?;
    unsupported_skip(flock(&a, libc::LOCK_EX | libc::LOCK_NB), "flock")?.ctx("LOCK_EX on fd #1")?;
    expect_errno(
        flock(&b, libc::LOCK_EX | libc::LOCK_NB),
        &[libc::EWOULDBLOCK],
        "LOCK_EX|LOCK_NB on fd #2 while #1 holds LOCK_EX",
    )?;
    expect_errno(
        flock(&b, libc::LOCK_SH | libc::LOCK_NB),
        &[libc::EWOULDBLOCK],
        "LOCK_SH|LOCK_NB on fd #2 while #1 holds LOCK_EX",
    )?;
    // A dup shares the open file description, hence the lock.
    let dup = Fd::from_raw(cvt(unsafe { libc::dup(a.raw()) }).ctx("dup")?);
    flock(&dup, libc::LOCK_EX | libc::LOCK_NB).ctx("LOCK_EX via dup of the holder")?;
    flock(&a, libc::LOCK_UN).ctx("LOCK_UN")?;
    flock(&b, libc::LOCK_SH | libc::LOCK_NB).ctx("LOCK_SH on #2 after unlock")?;
    flock(&a, libc::LOCK_SH | libc::LOCK_NB).ctx("second LOCK_SH on #1")?;
    expect_errno(
        flock(&a, libc::LOCK_EX | libc::LOCK_NB),
        &[libc::EWOULDBLOCK],
        "upgrade to LOCK_EX while #2 holds LOCK_SH",
    )?;
    // Closing the descriptor releases its lock.
    drop(b);
    flock(&a, libc::LOCK_EX | libc::LOCK_NB).ctx("LOCK_EX after the other holder closed")?;
    // The lock also conflicts with another process's open.
    let fc = cstr(&f);
    let r = in_child(None, move || {
        let fd = unsafe { libc::open(fc.as_ptr(), libc::O_RDWR) };
        if fd < 0 {
            return 100;
        }
        child_code(cvt(unsafe {
            libc::flock(fd, libc::LOCK_EX | libc::LOCK_NB)
        }))
    })?;
    expect_errno(
        r,
        &[libc::EWOULDBLOCK],
        "LOCK_EX|LOCK_NB from another process",
    )
}

fn flk(typ: i32, start: i64, len: i64) -> libc::flock {
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = typ as i16;
    fl.l_whence = libc::SEEK_SET as i16;
    fl.l_start = start;
    fl.l_len = len;
    fl
}

fn setlk(fd: RawFdT, cmd: i32, fl: &libc::flock) -> SysResult<()> {
    cvt(unsafe { libc::fcntl(fd, cmd, fl as *const libc::flock) }).map(|_| ())
}

type RawFdT = std::os::unix::io::RawFd;

fn getlk(fd: RawFdT, cmd: i32, mut fl: libc::flock) -> SysResult<libc::flock> {
    cvt(unsafe { libc::fcntl(fd, cmd, &mut fl as *mut libc::flock) }).map(|_| fl)
}

// Child exit codes for the record-lock check.
const C_OPEN: i32 = 100;
const C_GETLK_FAILED: i32 = 101;
const C_GETLK_NO_CONFLICT: i32 = 102;
const C_GETLK_WRONG: i32 = 103;
const C_DISJOINT_FAILED: i32 = 104;
const C_READ_LOCK_GRANTED: i32 = 105;
const C_WRITE_LOCK_GRANTED: i32 = 106;
const C_READ_RANGE_FAILED: i32 = 107;

fn posix_record_locks(c: &Ctx) -> CheckResult {
    let f = c.p("f");
    write_file(&f, &[0u8; 1000], 0o644).ctx("create")?;
    let fd = open(&f, libc::O_RDWR, 0).ctx("open")?;
    let r = setlk(fd.raw(), libc::F_SETLK, &flk(libc::F_WRLCK, 0, 100));
    unsupported_skip(r, "POSIX locks")?.ctx("F_SETLK write lock [0,100)")?;
    setlk(fd.raw(), libc::F_SETLK, &flk(libc::F_RDLCK, 500, 100))
        .ctx("F_SETLK read lock [500,600)")?;
    let parent = std::process::id() as i32;
    let fc = cstr(&f);
    let code = sys::fork_as(None, move || {
        let fd = unsafe { libc::open(fc.as_ptr(), libc::O_RDWR) };
        if fd < 0 {
            return C_OPEN;
        }
        // F_GETLK reports the parent's conflicting lock.
        let got = match getlk(fd, libc::F_GETLK, flk(libc::F_WRLCK, 50, 10)) {
            Ok(g) => g,
            Err(_) => return C_GETLK_FAILED,
        };
        if got.l_type == libc::F_UNLCK as i16 {
            return C_GETLK_NO_CONFLICT;
        }
        if got.l_type != libc::F_WRLCK as i16
            || got.l_start != 0
            || got.l_len != 100
            || got.l_pid != parent
        {
            return C_GETLK_WRONG;
        }
        // Overlapping locks conflict.
        match setlk(fd, libc::F_SETLK, &flk(libc::F_RDLCK, 99, 1)) {
            Err(e) if e.0 == libc::EAGAIN || e.0 == libc::EACCES => {}
            _ => return C_READ_LOCK_GRANTED,
        }
        match setlk(fd, libc::F_SETLK, &flk(libc::F_WRLCK, 550, 1)) {
            Err(e) if e.0 == libc::EAGAIN || e.0 == libc::EACCES => {}
            _ => return C_WRITE_LOCK_GRANTED,
        }
        // Disjoint ranges and shared read locks are fine.
        if setlk(fd, libc::F_SETLK, &flk(libc::F_WRLCK, 100, 400)).is_err() {
            return C_DISJOINT_FAILED;
        }
        if setlk(fd, libc::F_SETLK, &flk(libc::F_RDLCK, 500, 100)).is_err() {
            return C_READ_RANGE_FAILED;
        }
        0
    })
    .ctx("fork")?;
    let msg = match code {
        0 => None,
        C_OPEN => Some("child could not open the file"),
        C_GETLK_FAILED => Some("F_GETLK failed in child"),
        C_GETLK_NO_CONFLICT => {
            Some("F_GETLK in child reported no conflict with parent's write lock [0,100)")
        }
        C_GETLK_WRONG => Some("F_GETLK in child: expected F_WRLCK start 0 len 100 pid=parent"),
        C_READ_LOCK_GRANTED => Some(
            "child got read lock on byte 99 inside parent's write lock (expected EAGAIN/EACCES)",
        ),
        C_WRITE_LOCK_GRANTED => Some(
            "child got write lock on byte 550 inside parent's read lock (expected EAGAIN/EACCES)",
        ),
        C_DISJOINT_FAILED => Some("child could not write-lock the free range [100,500)"),
        C_READ_RANGE_FAILED => Some("child could not share the read lock [500,600)"),
        _ => Some("child failed with an unexpected code"),
    };
    if let Some(m) = msg {
        return fail(format!("{m} (child exit {code})"));
    }
    // The parent's own F_GETLK sees no conflict with its own locks.
    let own =
        getlk(fd.raw(), libc::F_GETLK, flk(libc::F_WRLCK, 0, 1000)).ctx("F_GETLK in parent")?;
    check_eq(
        own.l_type,
        libc::F_UNLCK as i16,
        "F_GETLK over own locks (child's locks died with it)",
    )?;
    // After unlocking, a child can lock the whole file.
    setlk(fd.raw(), libc::F_SETLK, &flk(libc::F_UNLCK, 0, 0)).ctx("F_UNLCK all")?;
    let fc = cstr(&f);
    let r = in_child(None, move || {
        let fd = unsafe { libc::open(fc.as_ptr(), libc::O_RDWR) };
        child_code(setlk(fd, libc::F_SETLK, &flk(libc::F_WRLCK, 0, 0)))
    })?;
    check_eq(
        r,
        Ok(()),
        "child write-locks the whole file after parent unlocked",
    )?;
    // Closing any fd of the file drops the process's POSIX locks.
    setlk(fd.raw(), libc::F_SETLK, &flk(libc::F_WRLCK, 0, 10)).ctx("relock")?;
    drop(open(&f, libc::O_RDONLY, 0).ctx("open+close another fd")?);
    let fc = cstr(&f);
    let r = in_child(None, move || {
        let fd = unsafe { libc::open(fc.as_ptr(), libc::O_RDWR) };
        child_code(setlk(fd, libc::F_SETLK, &flk(libc::F_WRLCK, 0, 10)))
    })?;
    check_eq(
        r,
        Ok(()),
        "POSIX lock released when the process closes any fd of the file",
    )
}

fn ofd_locks(c: &Ctx) -> CheckResult {
    let f = c.p("f");
    write_file(&f, &[0u8; 100], 0o644).ctx("create")?;
    let a = open(&f, libc::O_RDWR, 0).ctx("open #1")?;
    let b = open(&f, libc::O_RDWR, 0).ctx("open #2")?;
    let r = setlk(a.raw(), libc::F_OFD_SETLK, &flk(libc::F_WRLCK, 0, 10));
    if r == Err(Errno(libc::EINVAL)) {
        return skip("F_OFD_SETLK not supported (EINVAL)");
    }
    unsupported_skip(r, "OFD locks")?.ctx("F_OFD_SETLK [0,10) on #1")?;
    expect_errno(
        setlk(b.raw(), libc::F_OFD_SETLK, &flk(libc::F_WRLCK, 5, 1)),
        &[libc::EAGAIN],
        "F_OFD_SETLK on #2 overlapping #1 (same process)",
    )?;
    let g = getlk(b.raw(), libc::F_OFD_GETLK, flk(libc::F_WRLCK, 0, 100)).ctx("F_OFD_GETLK")?;
    check_eq(
        (g.l_type, g.l_start, g.l_len, g.l_pid),
        (libc::F_WRLCK as i16, 0, 10, -1),
        "F_OFD_GETLK (type, start, len, pid)",
    )?;
    setlk(b.raw(), libc::F_OFD_SETLK, &flk(libc::F_WRLCK, 10, 10))
        .ctx("F_OFD_SETLK disjoint range on #2")?;
    setlk(a.raw(), libc::F_OFD_SETLK, &flk(libc::F_UNLCK, 0, 10)).ctx("unlock #1")?;
    setlk(b.raw(), libc::F_OFD_SETLK, &flk(libc::F_WRLCK, 0, 10))
        .ctx("F_OFD_SETLK on #2 after #1 unlocked")
}
