//! Nothing a caller passes may break makod: real system calls with hostile arguments on a
//! real mount — offsets near i64::MAX and the largest file size, negative and extreme
//! sizes and times, names of 255, 256 and 1024 bytes and invalid UTF-8, xattr names and
//! values at and past their limits, unknown flags for rename, fallocate and open, odd
//! mknod modes, copy ranges at the edges. Each call runs in a forked child with a deadline
//! (a panic outside makod's handlers used to leave the caller waiting forever) and must
//! answer the errno Linux answers — never EIO, which is what a panicking handler gives.
//! Afterwards the mount must still be writable, not read-only, makod's log must name no
//! bug, `mako diag stats` must count no damage and an online fsck must find none.

use mako_tests::cluster::{require_fuse, ClusterOptions, TestCluster};
use mako_tests::sys::{self, Errno, SysResult};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::time::{Duration, Instant};

/// The format's largest file (`mako_format::inode::FILE_BYTES_MAX`).
const FILE_BYTES_MAX: i64 = 1 << 62;

/// Runs `f` in a forked child, bounded by a deadline: `Err` if it did not finish (the child
/// is killed) or died. The child reports an i64 through a pipe (negative: an errno).
fn bounded(f: impl FnOnce() -> SysResult<i64>) -> Result<SysResult<i64>, String> {
    let mut fds = [0; 2];
    assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork: {}", Errno::last());
    if pid == 0 {
        let v: i64 = match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
            Ok(Ok(v)) => v.max(0),
            Ok(Err(e)) => -(e.0 as i64),
            Err(_) => i64::MIN,
        };
        unsafe {
            libc::write(fds[1], (&v as *const i64).cast(), 8);
            libc::_exit(0);
        }
    }
    unsafe { libc::close(fds[1]) };
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut status = 0;
    let finished = loop {
        let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        if r == pid {
            break true;
        }
        if Instant::now() > deadline {
            unsafe {
                libc::kill(pid, libc::SIGKILL);
                libc::waitpid(pid, &mut status, 0);
            }
            break false;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let mut v: i64 = 0;
    let n = unsafe { libc::read(fds[0], (&mut v as *mut i64).cast(), 8) };
    unsafe { libc::close(fds[0]) };
    if !finished {
        return Err("did not finish within 20 s (a request never answered)".into());
    }
    match (n, v) {
        (8, i64::MIN) => Err("the child panicked".into()),
        (8, v) if v < 0 => Ok(Err(Errno((-v) as i32))),
        (8, v) => Ok(Ok(v)),
        _ => Err(format!("the child died (wait status {status:#x})")),
    }
}

fn cvt64(r: i64) -> SysResult<i64> {
    if r < 0 {
        Err(Errno::last())
    } else {
        Ok(r)
    }
}

/// What a call must answer.
enum Want {
    Value(i64),
    Fails(&'static [i32]),
    /// Any answer but EIO (the call's outcome is the kernel's business, e.g. alignment).
    NotEio,
}

struct Run {
    failures: Vec<String>,
}

impl Run {
    fn check(&mut self, what: &str, want: Want, f: impl FnOnce() -> SysResult<i64>) {
        let got = bounded(f);
        let ok = match (&got, &want) {
            (Ok(Ok(v)), Want::Value(w)) => v == w,
            (Ok(Err(e)), Want::Fails(es)) => es.contains(&e.0),
            (Ok(Ok(_)), Want::NotEio) => true,
            (Ok(Err(e)), Want::NotEio) => e.0 != libc::EIO,
            _ => false,
        };
        if !ok {
            let want = match want {
                Want::Value(v) => format!("{v}"),
                Want::Fails(es) => es
                    .iter()
                    .map(|&e| sys::errno_name(e))
                    .collect::<Vec<_>>()
                    .join(" or "),
                Want::NotEio => "anything but EIO".into(),
            };
            self.failures
                .push(format!("{what}: expected {want}, got {got:?}"));
        }
    }
}

fn open_rw(p: &Path) -> SysResult<sys::Fd> {
    sys::open(p, libc::O_RDWR, 0)
}

/// utimensat with explicit times, then the times stat reports, as (sec, nsec) of mtime.
fn set_and_read_mtime(p: &Path, sec: i64, nsec: i64) -> SysResult<i64> {
    let t = [libc::timespec {
        tv_sec: sec,
        tv_nsec: nsec,
    }; 2];
    sys::utimensat(p, &t, 0)?;
    let st = sys::stat(p)?;
    // Report a mismatch as EDOM so the check shows it.
    if st.st_mtime != sec || st.st_mtime_nsec != nsec {
        eprintln!(
            "utimensat {sec}.{nsec:09}: stat says {}.{:09}",
            st.st_mtime, st.st_mtime_nsec
        );
        return Err(Errno(libc::EDOM));
    }
    Ok(0)
}

#[test]
fn hostile_arguments_give_errors_not_a_broken_mount() {
    if !require_fuse("hostile_arguments_give_errors_not_a_broken_mount") {
        return;
    }
    let cl = TestCluster::up(ClusterOptions {
        disks: 2,
        disk_size: "2G".into(),
        pagepool: "128M".into(),
        block_size: None,
    })
    .unwrap_or_else(|e| panic!("{e:#}"));
    let m = cl.mount().to_path_buf();
    let f = m.join("f");
    sys::write_file(&f, b"some bytes to read", 0o644).unwrap();
    let g = m.join("g");
    sys::write_file(&g, b"", 0o644).unwrap();
    let d = m.join("d");
    sys::mkdir(&d, 0o755).unwrap();
    let mut run = Run {
        failures: Vec::new(),
    };
    use Want::*;
    let big = i64::MAX;

    // --- offsets and sizes ------------------------------------------------------------
    let p = f.clone();
    run.check("pread 5 bytes at i64::MAX-10", Value(0), move || {
        let mut b = [0u8; 5];
        cvt64(unsafe { libc::pread(open_rw(&p)?.raw(), b.as_mut_ptr().cast(), 5, big - 10) } as i64)
    });
    let p = f.clone();
    run.check("pread across i64::MAX", Fails(&[libc::EINVAL]), move || {
        let mut b = [0u8; 100];
        cvt64(
            unsafe { libc::pread(open_rw(&p)?.raw(), b.as_mut_ptr().cast(), 100, big - 10) } as i64,
        )
    });
    let p = g.clone();
    run.check("pwrite at i64::MAX-5", Fails(&[libc::EFBIG]), move || {
        cvt64(
            unsafe { libc::pwrite(open_rw(&p)?.raw(), b"abc".as_ptr().cast(), 3, big - 5) } as i64,
        )
    });
    let p = g.clone();
    run.check(
        "pwrite at the largest file size",
        Fails(&[libc::EFBIG]),
        move || {
            cvt64(unsafe {
                libc::pwrite(
                    open_rw(&p)?.raw(),
                    b"abc".as_ptr().cast(),
                    3,
                    FILE_BYTES_MAX,
                )
            } as i64)
        },
    );
    let p = g.clone();
    run.check(
        "pwrite across the largest file size is short",
        Value(4),
        move || {
            cvt64(unsafe {
                libc::pwrite(
                    open_rw(&p)?.raw(),
                    b"12345678".as_ptr().cast(),
                    8,
                    FILE_BYTES_MAX - 4,
                )
            } as i64)
        },
    );
    // Without the page cache (a write-only open) the request reaches makod whole, and
    // makod shortens it itself.
    let p = g.clone();
    run.check(
        "pwrite across the largest file size through a write-only open is short",
        Value(2),
        move || {
            let fd = sys::open(&p, libc::O_WRONLY, 0)?;
            cvt64(
                unsafe { libc::pwrite(fd.raw(), b"1234".as_ptr().cast(), 4, FILE_BYTES_MAX - 2) }
                    as i64,
            )
        },
    );
    let p = g.clone();
    run.check(
        "the bytes before the limit read back",
        Value(0x3132_3132),
        move || {
            let mut b = [0u8; 4];
            let n = unsafe {
                libc::pread(
                    open_rw(&p)?.raw(),
                    b.as_mut_ptr().cast(),
                    4,
                    FILE_BYTES_MAX - 4,
                )
            };
            cvt64(n as i64)?;
            Ok(i64::from(u32::from_be_bytes(b)))
        },
    );
    let p = g.clone();
    run.check(
        "size is the largest file size",
        Value(FILE_BYTES_MAX),
        move || Ok(sys::stat(&p)?.st_size),
    );
    for (what, len, want) in [
        (
            "ftruncate past the largest file size",
            FILE_BYTES_MAX + 1,
            &[libc::EFBIG][..],
        ),
        ("ftruncate to i64::MAX", big, &[libc::EFBIG]),
        ("ftruncate to -1", -1, &[libc::EINVAL]),
    ] {
        let p = g.clone();
        run.check(what, Fails(want), move || {
            sys::ftruncate(&open_rw(&p)?, len).map(|_| 0)
        });
    }
    for (what, mode, off, len, want) in [
        (
            "fallocate past the largest file size",
            0,
            FILE_BYTES_MAX - 4096,
            8192,
            &[libc::EFBIG][..],
        ),
        (
            "zero range past the largest file size",
            libc::FALLOC_FL_ZERO_RANGE,
            FILE_BYTES_MAX,
            1,
            &[libc::EFBIG],
        ),
        ("fallocate across i64::MAX", 0, big - 1, 2, &[libc::EFBIG]),
        ("fallocate of length 0", 0, 0, 0, &[libc::EINVAL]),
        (
            "fallocate at a negative offset",
            0,
            -4096,
            4096,
            &[libc::EINVAL],
        ),
        (
            "fallocate collapse range",
            libc::FALLOC_FL_COLLAPSE_RANGE,
            0,
            65536,
            &[libc::EOPNOTSUPP, libc::EINVAL],
        ),
        (
            "fallocate insert range",
            libc::FALLOC_FL_INSERT_RANGE,
            0,
            65536,
            &[libc::EOPNOTSUPP, libc::EINVAL],
        ),
        (
            "fallocate unshare range",
            0x40,
            0,
            4096,
            &[libc::EOPNOTSUPP, libc::EINVAL],
        ),
        (
            "fallocate with every mode bit",
            -1,
            0,
            4096,
            &[libc::EOPNOTSUPP, libc::EINVAL],
        ),
        (
            "punch hole without keep size",
            libc::FALLOC_FL_PUNCH_HOLE,
            0,
            4096,
            &[libc::EOPNOTSUPP, libc::EINVAL],
        ),
    ] {
        let p = f.clone();
        run.check(what, Fails(want), move || {
            cvt64(unsafe { libc::fallocate(open_rw(&p)?.raw(), mode, off, len) } as i64)
        });
    }
    for (what, off, whence, want) in [
        (
            "SEEK_DATA at i64::MAX",
            big,
            libc::SEEK_DATA,
            &[libc::ENXIO][..],
        ),
        (
            "SEEK_HOLE at -1",
            -1,
            libc::SEEK_HOLE,
            &[libc::ENXIO, libc::EINVAL],
        ),
        (
            "SEEK_END to before the start",
            -(1 << 40),
            libc::SEEK_END,
            &[libc::EINVAL],
        ),
        ("whence 99", 0, 99, &[libc::EINVAL]),
    ] {
        let p = f.clone();
        run.check(what, Fails(want), move || {
            cvt64(unsafe { libc::lseek(open_rw(&p)?.raw(), off, whence) })
        });
    }
    // --- copy ranges --------------------------------------------------------------------
    for (what, off_in, off_out, len, want) in [
        (
            "copy across the largest file size is short",
            0,
            FILE_BYTES_MAX - 2,
            10,
            Value(2),
        ),
        (
            "copy to the largest file size",
            0,
            FILE_BYTES_MAX,
            10,
            Fails(&[libc::EFBIG]),
        ),
        ("copy from past the end", 1 << 40, 0, 10, Value(0)),
        (
            "copy to a negative offset",
            0,
            -1,
            10,
            Fails(&[libc::EINVAL, libc::EOVERFLOW]),
        ),
        (
            "copy across i64::MAX",
            0,
            big - 2,
            10,
            Fails(&[libc::EFBIG, libc::EOVERFLOW, libc::EINVAL]),
        ),
        (
            "copy of 1 TiB from an 18-byte file",
            0,
            0,
            1 << 40,
            Value(18),
        ),
    ] {
        let (p, q) = (f.clone(), m.join("copy"));
        run.check(what, want, move || {
            let from = sys::open(&p, libc::O_RDONLY, 0)?;
            let to = sys::open(&q, libc::O_RDWR | libc::O_CREAT, 0o644)?;
            let (mut i, mut o): (i64, i64) = (off_in, off_out);
            cvt64(
                unsafe { libc::copy_file_range(from.raw(), &mut i, to.raw(), &mut o, len, 0) }
                    as i64,
            )
        });
    }
    let p = f.clone();
    run.check(
        "copy with unknown flags",
        Fails(&[libc::EINVAL]),
        move || {
            let fd = open_rw(&p)?;
            let (mut i, mut o): (i64, i64) = (0, 100);
            cvt64(unsafe { libc::copy_file_range(fd.raw(), &mut i, fd.raw(), &mut o, 5, 1) } as i64)
        },
    );
    // --- names ------------------------------------------------------------------------
    let name = |n: usize| d.join(std::ffi::OsStr::from_bytes(&vec![b'n'; n]));
    let p = name(255);
    run.check("create a 255-byte name", Value(0), move || {
        sys::write_file(&p, b"x", 0o644).map(|_| 0)
    });
    let p = name(255);
    run.check("stat a 255-byte name", Value(1), move || {
        Ok(sys::stat(&p)?.st_size)
    });
    for n in [256, 1024] {
        let p = name(n);
        run.check(
            &format!("create a {n}-byte name"),
            Fails(&[libc::ENAMETOOLONG]),
            move || sys::write_file(&p, b"x", 0o644).map(|_| 0),
        );
        let p = name(n);
        run.check(
            &format!("stat a {n}-byte name"),
            Fails(&[libc::ENAMETOOLONG]),
            move || sys::stat(&p).map(|_| 0),
        );
        let p = name(n);
        run.check(
            &format!("mkdir a {n}-byte name"),
            Fails(&[libc::ENAMETOOLONG]),
            move || sys::mkdir(&p, 0o755).map(|_| 0),
        );
    }
    let (p, q) = (name(255), name(256));
    run.check(
        "rename to a 256-byte name",
        Fails(&[libc::ENAMETOOLONG]),
        move || sys::rename(&p, &q).map(|_| 0),
    );
    let raw = d.join(std::ffi::OsStr::from_bytes(b"\xff\xfe\x80bad utf-8\xc3"));
    let p = raw.clone();
    run.check("create an invalid UTF-8 name", Value(0), move || {
        sys::write_file(&p, b"", 0o644).map(|_| 0)
    });
    let dd = d.clone();
    run.check(
        "readdir returns the invalid UTF-8 name as it is",
        Value(1),
        move || {
            Ok(std::fs::read_dir(&dd)
                .map_err(|e| Errno(e.raw_os_error().unwrap_or(libc::EIO)))?
                .flatten()
                .filter(|e| e.file_name().as_bytes() == b"\xff\xfe\x80bad utf-8\xc3")
                .count() as i64)
        },
    );
    let p = raw.clone();
    run.check("unlink an invalid UTF-8 name", Value(0), move || {
        sys::unlink(&p).map(|_| 0)
    });
    // --- extended attributes ------------------------------------------------------------
    let xname = |n: usize| format!("user.{}", "x".repeat(n - 5));
    let (p, n) = (f.clone(), xname(255));
    run.check("setxattr with a 255-byte name", Value(0), move || {
        sys::setxattr(&p, &n, b"value", 0, false).map(|_| 0)
    });
    let (p, n) = (f.clone(), xname(255));
    run.check("getxattr with a 255-byte name", Value(5), move || {
        Ok(sys::getxattr(&p, &n)?.len() as i64)
    });
    let (p, n) = (f.clone(), xname(256));
    run.check(
        "setxattr with a 256-byte name",
        Fails(&[libc::ERANGE]),
        move || sys::setxattr(&p, &n, b"v", 0, false).map(|_| 0),
    );
    // The Linux maximum value is stored (in overflow blocks); one byte more is E2BIG.
    for (what, len, want) in [
        ("setxattr with a 64 KiB value", 65536, Want::Value(0)),
        ("setxattr past 64 KiB", 65537, Fails(&[libc::E2BIG])),
    ] {
        let p = f.clone();
        run.check(what, want, move || {
            sys::setxattr(&p, "user.big", &vec![7u8; len], 0, false).map(|_| 0)
        });
    }
    for (what, n, flags, want) in [
        (
            "setxattr with an empty name",
            "",
            0,
            &[libc::ERANGE, libc::EINVAL][..],
        ),
        (
            "setxattr in an unknown namespace",
            "bogus.k",
            0,
            &[libc::EOPNOTSUPP],
        ),
        (
            "setxattr with XATTR_CREATE and XATTR_REPLACE",
            "user.none",
            3,
            &[libc::ENODATA, libc::EEXIST, libc::EINVAL],
        ),
        (
            "setxattr with unknown flags",
            "user.k",
            0x100,
            &[libc::EINVAL],
        ),
    ] {
        let p = f.clone();
        run.check(what, Fails(want), move || {
            sys::setxattr(&p, n, b"v", flags, false).map(|_| 0)
        });
    }
    let p = f.clone();
    run.check(
        "getxattr into a 1-byte buffer",
        Fails(&[libc::ERANGE]),
        move || {
            let mut b = [0u8; 1];
            sys::getxattr_raw(&p, &xname(255), &mut b).map(|n| n as i64)
        },
    );
    let p = f.clone();
    run.check(
        "listxattr into a 1-byte buffer",
        Fails(&[libc::ERANGE]),
        move || {
            let mut b = [0u8; 1];
            sys::listxattr_raw(&p, &mut b).map(|n| n as i64)
        },
    );
    let p = f.clone();
    run.check("a malformed ACL", Fails(&[libc::EINVAL]), move || {
        sys::setxattr(&p, "system.posix_acl_access", b"\x02\0\0\0junk", 0, false).map(|_| 0)
    });
    // --- rename, open, mknod, symlink flags and modes ----------------------------------
    for (what, flags, want) in [
        ("renameat2 with an unknown flag", 8, &[libc::EINVAL][..]),
        ("renameat2 with every flag", u32::MAX, &[libc::EINVAL]),
        ("RENAME_EXCHANGE with RENAME_NOREPLACE", 3, &[libc::EINVAL]),
        (
            "RENAME_EXCHANGE with a missing target",
            libc::RENAME_EXCHANGE,
            &[libc::ENOENT],
        ),
    ] {
        let (p, q) = (f.clone(), m.join("missing"));
        run.check(what, Fails(want), move || {
            sys::renameat2(&p, &q, flags).map(|_| 0)
        });
    }
    let (p, q) = (d.clone(), d.join("inside"));
    run.check(
        "rename a directory into itself",
        Fails(&[libc::EINVAL]),
        move || sys::rename(&p, &q).map(|_| 0),
    );
    for (what, flags, want) in [
        (
            "open a file with O_DIRECTORY",
            libc::O_DIRECTORY,
            Fails(&[libc::ENOTDIR]),
        ),
        (
            "open with O_CREAT|O_DIRECTORY",
            libc::O_CREAT | libc::O_DIRECTORY,
            Fails(&[libc::EINVAL, libc::EEXIST, libc::ENOTDIR]),
        ),
        ("open with every flag bit", -1, NotEio),
        ("open with O_PATH", libc::O_PATH, Value(0)),
        (
            "open with O_NOATIME|O_SYNC|O_DSYNC",
            libc::O_RDWR | libc::O_NOATIME | libc::O_SYNC | libc::O_DSYNC,
            Value(0),
        ),
    ] {
        let p = f.clone();
        run.check(what, want, move || sys::open(&p, flags, 0o644).map(|_| 0));
    }
    let p = d.clone();
    run.check("O_TMPFILE read-only", Fails(&[libc::EINVAL]), move || {
        sys::open(&p, libc::O_TMPFILE | libc::O_RDONLY, 0o600).map(|_| 0)
    });
    for (i, (mode, dev, want)) in [
        (0o070644u32, 0, Fails(&[libc::EINVAL][..])),
        (
            libc::S_IFDIR | 0o755,
            0,
            Fails(&[libc::EPERM, libc::EINVAL]),
        ),
        (0, 0, Value(0)),
        (
            libc::S_IFCHR | 0o7777,
            libc::makedev(0xfff, 0xfffff),
            Value(0),
        ),
        (libc::S_IFIFO | 0o7777, 0, Value(0)),
    ]
    .into_iter()
    .enumerate()
    {
        let p = d.join(format!("node{i}"));
        run.check(&format!("mknod mode {mode:o}"), want, move || {
            sys::mknod(&p, mode, dev).map(|_| 0)
        });
    }
    let p = d.join("node3");
    run.check(
        "the device number is kept",
        Value(libc::makedev(0xfff, 0xfffff) as i64),
        move || Ok(sys::lstat(&p)?.st_rdev as i64),
    );
    let long = "t".repeat(4095);
    let p = d.join("sl");
    run.check("symlink to a 4095-byte target", Value(0), move || {
        sys::symlink(&long, &p).map(|_| 0)
    });
    let p = d.join("sl");
    run.check("readlink of it", Value(4095), move || {
        Ok(sys::readlink(&p)?.len() as i64)
    });
    let long = "t".repeat(4096);
    let p = d.join("sl2");
    run.check(
        "symlink to a 4096-byte target",
        Fails(&[libc::ENAMETOOLONG]),
        move || sys::symlink(&long, &p).map(|_| 0),
    );
    // --- attributes: owners, modes and times at their extremes -------------------------
    let p = f.clone();
    run.check("chown to uid/gid 2^32-2", Value(0xffff_fffe), move || {
        sys::chown(&p, 0xffff_fffe, 0xffff_fffe)?;
        Ok(i64::from(sys::stat(&p)?.st_uid))
    });
    let p = f.clone();
    run.check("chmod with bits past 07777", Value(0o7777), move || {
        sys::chmod(&p, 0o177777)?;
        Ok(i64::from(sys::stat(&p)?.st_mode & 0o7777))
    });
    for (sec, nsec) in [
        (0, 0),
        (-1, 500_000_000),
        (-2, 800_000_000),
        // At the very ends of the range the kernel drops the nanoseconds itself
        // (`timestamp_truncate`); one second inside, they stay.
        (i64::MAX, 0),
        (i64::MIN, 0),
        (i64::MAX - 1, 999_999_999),
        (i64::MIN + 1, 999_999_999),
        (i64::MIN + 1, 1),
    ] {
        let p = f.clone();
        run.check(
            &format!("utimensat to {sec} s {nsec} ns and back"),
            Value(0),
            move || set_and_read_mtime(&p, sec, nsec),
        );
    }
    let p = f.clone();
    run.check(
        "utimensat with 10^9 nanoseconds",
        Fails(&[libc::EINVAL]),
        move || set_and_read_mtime(&p, 0, 1_000_000_000),
    );
    // --- directories --------------------------------------------------------------------
    let dd = d.clone();
    run.check(
        "getdents after seeking to garbage offsets",
        NotEio,
        move || {
            let fd = sys::open(&dd, libc::O_RDONLY | libc::O_DIRECTORY, 0)?;
            let mut buf = vec![0u8; 4096];
            let mut total = 0;
            for off in [i64::MAX, 1 << 62, 3, 123_456_789, -5] {
                unsafe { libc::lseek(fd.raw(), off, libc::SEEK_SET) };
                let n = unsafe {
                    libc::syscall(libc::SYS_getdents64, fd.raw(), buf.as_mut_ptr(), buf.len())
                };
                total += cvt64(n)?;
            }
            Ok(total)
        },
    );

    assert!(
        run.failures.is_empty(),
        "hostile calls answered wrongly ({}):\n{}\n\nmakod.log tail:\n{}",
        run.failures.len(),
        run.failures.join("\n"),
        cl.log_tail(30)
    );
    let after = m.join("after");
    let fd = sys::open(&after, libc::O_RDWR | libc::O_CREAT, 0o644).expect("create after the run");
    sys::pwrite_all(&fd, b"still writable", 0).expect("write after the run");
    sys::fsync(&fd).expect("fsync after the run");
    drop(fd);
    assert_eq!(sys::read_file(&after).unwrap(), b"still writable");
    let log = std::fs::read_to_string(cl.data_dir().join("makod.log")).unwrap_or_default();
    assert!(
        !log.contains("BUG") && !log.contains("panicked") && !log.contains("read-only"),
        "makod's log names a bug or a read-only mount:\n{}",
        cl.log_tail(30)
    );
    let status = cl.mako(&["status"]).unwrap();
    assert!(
        status.success() && status.stdout.contains("mounted"),
        "{status}"
    );
    assert!(
        !status.stdout.contains("read-only"),
        "mount went read-only:\n{status}"
    );
    let stats = cl.mako(&["diag", "stats"]).unwrap();
    for counter in ["corruptions_detected", "background_errors"] {
        let value = stats
            .stdout
            .lines()
            .find(|l| l.starts_with(counter))
            .and_then(|l| l.split_whitespace().nth(1))
            .unwrap_or_else(|| panic!("{counter} missing from mako diag stats:\n{stats}"));
        assert_eq!(value, "0", "{counter} in mako diag stats:\n{stats}");
    }
    // fsck checks the two sparse files of the largest size too, then their removal.
    for step in ["with the largest files", "after removing them"] {
        let fsck = cl.mako(&["fsck", "fs1", "--online"]).unwrap();
        assert!(fsck.success(), "online fsck {step}: {fsck}");
        let _ = sys::unlink(&g);
        let _ = sys::unlink(&m.join("copy"));
    }
    let after = sys::statvfs(&m).unwrap();
    assert!(after.f_files - after.f_ffree < 100, "inodes left in use");
}
