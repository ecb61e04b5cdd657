//! Thin, errno-preserving wrappers around the raw libc calls used by the test tools.
//!
//! Every wrapper returns [`SysResult`], whose error is the raw [`Errno`], so checks can assert on
//! the exact error code a file system returns.

use std::ffi::CString;
use std::fmt;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::io::RawFd;
use std::path::Path;

/// A raw `errno` value with a readable `Display` (`EEXIST (File exists)`).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Errno(pub i32);

/// Result of a system call: the value or the raw errno.
pub type SysResult<T> = Result<T, Errno>;

impl Errno {
    /// The calling thread's current `errno`.
    pub fn last() -> Errno {
        Errno(std::io::Error::last_os_error().raw_os_error().unwrap_or(0))
    }

    /// Symbolic name (`"ENOENT"`), or `"E?"` for uncommon values.
    pub fn name(self) -> &'static str {
        errno_name(self.0)
    }
}

/// Symbolic name of an errno value.
pub fn errno_name(e: i32) -> &'static str {
    use libc::*;
    match e {
        0 => "0 (success)",
        EPERM => "EPERM",
        ENOENT => "ENOENT",
        ESRCH => "ESRCH",
        EINTR => "EINTR",
        EIO => "EIO",
        ENXIO => "ENXIO",
        E2BIG => "E2BIG",
        EBADF => "EBADF",
        ECHILD => "ECHILD",
        EAGAIN => "EAGAIN/EWOULDBLOCK",
        ENOMEM => "ENOMEM",
        EACCES => "EACCES",
        EFAULT => "EFAULT",
        EBUSY => "EBUSY",
        EEXIST => "EEXIST",
        EXDEV => "EXDEV",
        ENODEV => "ENODEV",
        ENOTDIR => "ENOTDIR",
        EISDIR => "EISDIR",
        EINVAL => "EINVAL",
        ENFILE => "ENFILE",
        EMFILE => "EMFILE",
        ETXTBSY => "ETXTBSY",
        EFBIG => "EFBIG",
        ENOSPC => "ENOSPC",
        ESPIPE => "ESPIPE",
        EROFS => "EROFS",
        EMLINK => "EMLINK",
        EPIPE => "EPIPE",
        ERANGE => "ERANGE",
        EDEADLK => "EDEADLK",
        ENAMETOOLONG => "ENAMETOOLONG",
        ENOLCK => "ENOLCK",
        ENOSYS => "ENOSYS",
        ENOTEMPTY => "ENOTEMPTY",
        ELOOP => "ELOOP",
        ENODATA => "ENODATA",
        EOVERFLOW => "EOVERFLOW",
        EOPNOTSUPP => "EOPNOTSUPP",
        ENOTTY => "ENOTTY",
        EDQUOT => "EDQUOT",
        ESTALE => "ESTALE",
        ENOTCONN => "ENOTCONN",
        EADDRINUSE => "EADDRINUSE",
        _ => "E?",
    }
}

impl fmt::Display for Errno {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0 == 0 {
            return write!(f, "success");
        }
        let msg = std::io::Error::from_raw_os_error(self.0).to_string();
        let msg = msg.split(" (os error").next().unwrap_or("").to_string();
        write!(f, "{} ({}: {})", self.name(), self.0, msg)
    }
}

impl fmt::Debug for Errno {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl std::error::Error for Errno {}

impl From<Errno> for std::io::Error {
    fn from(e: Errno) -> Self {
        std::io::Error::from_raw_os_error(e.0)
    }
}

/// Converts a path to a NUL-terminated C string (paths never contain NUL).
pub fn cstr(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).expect("path contains NUL byte")
}

fn cs(s: &str) -> CString {
    CString::new(s).expect("string contains NUL byte")
}

/// Converts a `-1`-on-error return value.
pub fn cvt(r: libc::c_int) -> SysResult<libc::c_int> {
    if r < 0 {
        Err(Errno::last())
    } else {
        Ok(r)
    }
}

fn cvt_sz(r: isize) -> SysResult<usize> {
    if r < 0 {
        Err(Errno::last())
    } else {
        Ok(r as usize)
    }
}

fn cvt_off(r: libc::off_t) -> SysResult<u64> {
    if r < 0 {
        Err(Errno::last())
    } else {
        Ok(r as u64)
    }
}

/// An owned file descriptor, closed on drop.
#[derive(Debug)]
pub struct Fd(RawFd);

impl Fd {
    /// Takes ownership of a raw descriptor.
    pub fn from_raw(fd: RawFd) -> Fd {
        Fd(fd)
    }
    /// The raw descriptor.
    pub fn raw(&self) -> RawFd {
        self.0
    }
    /// Closes explicitly, returning the error of `close(2)`.
    pub fn close(self) -> SysResult<()> {
        let fd = self.0;
        std::mem::forget(self);
        cvt(unsafe { libc::close(fd) }).map(|_| ())
    }
}

impl Drop for Fd {
    fn drop(&mut self) {
        unsafe { libc::close(self.0) };
    }
}

/// `open(2)` (always with `O_CLOEXEC`).
pub fn open(p: &Path, flags: libc::c_int, mode: libc::mode_t) -> SysResult<Fd> {
    let c = cstr(p);
    cvt(unsafe { libc::open(c.as_ptr(), flags | libc::O_CLOEXEC, mode as libc::c_uint) }).map(Fd)
}

fn zeroed_stat() -> libc::stat {
    unsafe { std::mem::zeroed() }
}

/// `stat(2)`.
pub fn stat(p: &Path) -> SysResult<libc::stat> {
    let c = cstr(p);
    let mut st = zeroed_stat();
    cvt(unsafe { libc::stat(c.as_ptr(), &mut st) }).map(|_| st)
}

/// `lstat(2)`.
pub fn lstat(p: &Path) -> SysResult<libc::stat> {
    let c = cstr(p);
    let mut st = zeroed_stat();
    cvt(unsafe { libc::lstat(c.as_ptr(), &mut st) }).map(|_| st)
}

/// `fstat(2)`.
pub fn fstat(fd: &Fd) -> SysResult<libc::stat> {
    let mut st = zeroed_stat();
    cvt(unsafe { libc::fstat(fd.0, &mut st) }).map(|_| st)
}

/// `mkdir(2)`.
pub fn mkdir(p: &Path, mode: libc::mode_t) -> SysResult<()> {
    let c = cstr(p);
    cvt(unsafe { libc::mkdir(c.as_ptr(), mode) }).map(|_| ())
}

/// `rmdir(2)`.
pub fn rmdir(p: &Path) -> SysResult<()> {
    let c = cstr(p);
    cvt(unsafe { libc::rmdir(c.as_ptr()) }).map(|_| ())
}

/// `unlink(2)`.
pub fn unlink(p: &Path) -> SysResult<()> {
    let c = cstr(p);
    cvt(unsafe { libc::unlink(c.as_ptr()) }).map(|_| ())
}

/// `symlink(2)`: creates `link` pointing at `target`.
pub fn symlink(target: &str, link: &Path) -> SysResult<()> {
    let t = cs(target);
    let c = cstr(link);
    cvt(unsafe { libc::symlink(t.as_ptr(), c.as_ptr()) }).map(|_| ())
}

/// `readlink(2)`, returning the raw target bytes as a string (lossy).
pub fn readlink(p: &Path) -> SysResult<String> {
    let c = cstr(p);
    let mut buf = vec![0u8; libc::PATH_MAX as usize + 1];
    let n = cvt_sz(unsafe { libc::readlink(c.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) })?;
    Ok(String::from_utf8_lossy(&buf[..n]).into_owned())
}

/// `link(2)`.
pub fn link(old: &Path, new: &Path) -> SysResult<()> {
    let (a, b) = (cstr(old), cstr(new));
    cvt(unsafe { libc::link(a.as_ptr(), b.as_ptr()) }).map(|_| ())
}

/// `rename(2)`.
pub fn rename(old: &Path, new: &Path) -> SysResult<()> {
    let (a, b) = (cstr(old), cstr(new));
    cvt(unsafe { libc::rename(a.as_ptr(), b.as_ptr()) }).map(|_| ())
}

/// `renameat2(2)` via the raw system call (flags: `RENAME_NOREPLACE`, `RENAME_EXCHANGE`).
pub fn renameat2(old: &Path, new: &Path, flags: libc::c_uint) -> SysResult<()> {
    let (a, b) = (cstr(old), cstr(new));
    let r = unsafe {
        libc::syscall(
            libc::SYS_renameat2,
            libc::AT_FDCWD,
            a.as_ptr(),
            libc::AT_FDCWD,
            b.as_ptr(),
            flags,
        )
    };
    if r < 0 {
        Err(Errno::last())
    } else {
        Ok(())
    }
}

/// `mknod(2)`.
pub fn mknod(p: &Path, mode: libc::mode_t, dev: libc::dev_t) -> SysResult<()> {
    let c = cstr(p);
    cvt(unsafe { libc::mknod(c.as_ptr(), mode, dev) }).map(|_| ())
}

/// `chmod(2)`.
pub fn chmod(p: &Path, mode: libc::mode_t) -> SysResult<()> {
    let c = cstr(p);
    cvt(unsafe { libc::chmod(c.as_ptr(), mode) }).map(|_| ())
}

/// `chown(2)`.
pub fn chown(p: &Path, uid: libc::uid_t, gid: libc::gid_t) -> SysResult<()> {
    let c = cstr(p);
    cvt(unsafe { libc::chown(c.as_ptr(), uid, gid) }).map(|_| ())
}

/// `lchown(2)`.
pub fn lchown(p: &Path, uid: libc::uid_t, gid: libc::gid_t) -> SysResult<()> {
    let c = cstr(p);
    cvt(unsafe { libc::lchown(c.as_ptr(), uid, gid) }).map(|_| ())
}

/// `truncate(2)`.
pub fn truncate(p: &Path, len: i64) -> SysResult<()> {
    let c = cstr(p);
    cvt(unsafe { libc::truncate(c.as_ptr(), len) }).map(|_| ())
}

/// `ftruncate(2)`.
pub fn ftruncate(fd: &Fd, len: i64) -> SysResult<()> {
    cvt(unsafe { libc::ftruncate(fd.0, len) }).map(|_| ())
}

/// `utimensat(2)` relative to the cwd; `times` = [atime, mtime].
pub fn utimensat(p: &Path, times: &[libc::timespec; 2], flags: libc::c_int) -> SysResult<()> {
    let c = cstr(p);
    cvt(unsafe { libc::utimensat(libc::AT_FDCWD, c.as_ptr(), times.as_ptr(), flags) }).map(|_| ())
}

/// `access(2)`.
pub fn access(p: &Path, mode: libc::c_int) -> SysResult<()> {
    let c = cstr(p);
    cvt(unsafe { libc::access(c.as_ptr(), mode) }).map(|_| ())
}

/// One `write(2)` call.
pub fn write(fd: &Fd, buf: &[u8]) -> SysResult<usize> {
    cvt_sz(unsafe { libc::write(fd.0, buf.as_ptr().cast(), buf.len()) })
}

/// One `read(2)` call.
pub fn read(fd: &Fd, buf: &mut [u8]) -> SysResult<usize> {
    cvt_sz(unsafe { libc::read(fd.0, buf.as_mut_ptr().cast(), buf.len()) })
}

/// One `pwrite(2)` call.
pub fn pwrite(fd: &Fd, buf: &[u8], off: u64) -> SysResult<usize> {
    cvt_sz(unsafe { libc::pwrite(fd.0, buf.as_ptr().cast(), buf.len(), off as i64) })
}

/// One `pread(2)` call.
pub fn pread(fd: &Fd, buf: &mut [u8], off: u64) -> SysResult<usize> {
    cvt_sz(unsafe { libc::pread(fd.0, buf.as_mut_ptr().cast(), buf.len(), off as i64) })
}

/// `pwrite(2)` until the whole buffer is written (a zero-byte write is reported as `EIO`).
pub fn pwrite_all(fd: &Fd, mut buf: &[u8], mut off: u64) -> SysResult<()> {
    while !buf.is_empty() {
        match pwrite(fd, buf, off) {
            Ok(0) => return Err(Errno(libc::EIO)),
            Ok(n) => {
                buf = &buf[n..];
                off += n as u64;
            }
            Err(Errno(libc::EINTR)) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// `write(2)` until the whole buffer is written.
pub fn write_all(fd: &Fd, mut buf: &[u8]) -> SysResult<()> {
    while !buf.is_empty() {
        match write(fd, buf) {
            Ok(0) => return Err(Errno(libc::EIO)),
            Ok(n) => buf = &buf[n..],
            Err(Errno(libc::EINTR)) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// `pread(2)` until the buffer is full or EOF; returns the number of bytes read.
pub fn pread_full(fd: &Fd, buf: &mut [u8], off: u64) -> SysResult<usize> {
    let mut done = 0;
    while done < buf.len() {
        match pread(fd, &mut buf[done..], off + done as u64) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(Errno(libc::EINTR)) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(done)
}

/// Reads a whole file from offset 0 to EOF.
pub fn read_file(p: &Path) -> SysResult<Vec<u8>> {
    let fd = open(p, libc::O_RDONLY, 0)?;
    let mut out = Vec::new();
    let mut buf = vec![0u8; 1 << 16];
    loop {
        let n = pread_full(&fd, &mut buf, out.len() as u64)?;
        if n == 0 {
            break;
        }
        out.extend_from_slice(&buf[..n]);
    }
    Ok(out)
}

/// Creates (or truncates) `p` with mode `mode` and writes `data` to it.
pub fn write_file(p: &Path, data: &[u8], mode: libc::mode_t) -> SysResult<()> {
    let fd = open(p, libc::O_CREAT | libc::O_TRUNC | libc::O_WRONLY, mode)?;
    pwrite_all(&fd, data, 0)?;
    fd.close()
}

/// `lseek(2)`.
pub fn lseek(fd: &Fd, off: i64, whence: libc::c_int) -> SysResult<u64> {
    cvt_off(unsafe { libc::lseek(fd.0, off, whence) })
}

/// `fsync(2)`.
pub fn fsync(fd: &Fd) -> SysResult<()> {
    cvt(unsafe { libc::fsync(fd.0) }).map(|_| ())
}

/// `fdatasync(2)`.
pub fn fdatasync(fd: &Fd) -> SysResult<()> {
    cvt(unsafe { libc::fdatasync(fd.0) }).map(|_| ())
}

/// `fallocate(2)`.
pub fn fallocate(fd: &Fd, mode: libc::c_int, off: u64, len: u64) -> SysResult<()> {
    cvt(unsafe { libc::fallocate(fd.0, mode, off as i64, len as i64) }).map(|_| ())
}

/// `flock(2)`.
pub fn flock(fd: &Fd, op: libc::c_int) -> SysResult<()> {
    cvt(unsafe { libc::flock(fd.0, op) }).map(|_| ())
}

/// `statvfs(3)`.
pub fn statvfs(p: &Path) -> SysResult<libc::statvfs> {
    let c = cstr(p);
    let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
    cvt(unsafe { libc::statvfs(c.as_ptr(), &mut s) }).map(|_| s)
}

/// `setxattr(2)` (or `lsetxattr` when `nofollow`).
pub fn setxattr(
    p: &Path,
    name: &str,
    value: &[u8],
    flags: libc::c_int,
    nofollow: bool,
) -> SysResult<()> {
    let (c, n) = (cstr(p), cs(name));
    let r = unsafe {
        if nofollow {
            libc::lsetxattr(
                c.as_ptr(),
                n.as_ptr(),
                value.as_ptr().cast(),
                value.len(),
                flags,
            )
        } else {
            libc::setxattr(
                c.as_ptr(),
                n.as_ptr(),
                value.as_ptr().cast(),
                value.len(),
                flags,
            )
        }
    };
    cvt(r).map(|_| ())
}

/// `getxattr(2)` into a caller-sized buffer (`size` 0 queries the length); returns the length.
pub fn getxattr_raw(p: &Path, name: &str, buf: &mut [u8]) -> SysResult<usize> {
    let (c, n) = (cstr(p), cs(name));
    let ptr = if buf.is_empty() {
        std::ptr::null_mut()
    } else {
        buf.as_mut_ptr()
    };
    cvt_sz(unsafe { libc::getxattr(c.as_ptr(), n.as_ptr(), ptr.cast(), buf.len()) })
}

/// `getxattr(2)` returning the whole value.
pub fn getxattr(p: &Path, name: &str) -> SysResult<Vec<u8>> {
    let mut buf = vec![0u8; 65536];
    let n = getxattr_raw(p, name, &mut buf)?;
    buf.truncate(n);
    Ok(buf)
}

/// `listxattr(2)` into a caller-sized buffer; returns the length.
pub fn listxattr_raw(p: &Path, buf: &mut [u8]) -> SysResult<usize> {
    let c = cstr(p);
    let ptr = if buf.is_empty() {
        std::ptr::null_mut()
    } else {
        buf.as_mut_ptr()
    };
    cvt_sz(unsafe { libc::listxattr(c.as_ptr(), ptr.cast(), buf.len()) })
}

/// `listxattr(2)` returning the names.
pub fn listxattr(p: &Path) -> SysResult<Vec<String>> {
    let mut buf = vec![0u8; 65536];
    let n = listxattr_raw(p, &mut buf)?;
    Ok(buf[..n]
        .split(|&b| b == 0)
        .filter(|s| !s.is_empty())
        .map(|s| String::from_utf8_lossy(s).into_owned())
        .collect())
}

/// `removexattr(2)`.
pub fn removexattr(p: &Path, name: &str) -> SysResult<()> {
    let (c, n) = (cstr(p), cs(name));
    cvt(unsafe { libc::removexattr(c.as_ptr(), n.as_ptr()) }).map(|_| ())
}

/// Current `CLOCK_REALTIME` as a timespec.
pub fn now() -> libc::timespec {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    unsafe { libc::clock_gettime(libc::CLOCK_REALTIME, &mut ts) };
    ts
}

/// Timespec to nanoseconds since the epoch.
pub fn ts_ns(sec: i64, nsec: i64) -> i128 {
    sec as i128 * 1_000_000_000 + nsec as i128
}

/// Identity a forked child switches to (see [`fork_as`]).
#[derive(Clone, Debug)]
pub struct Cred {
    /// Real, effective and saved uid.
    pub uid: libc::uid_t,
    /// Real, effective and saved gid.
    pub gid: libc::gid_t,
    /// Supplementary groups.
    pub groups: Vec<libc::gid_t>,
    /// Directory to `chdir` into before dropping privileges, so the child can use relative paths
    /// even when an ancestor of the test directory is not searchable by the new identity.
    pub cwd: Option<std::path::PathBuf>,
    /// Capabilities (`CAP_*` numbers) the child keeps, effective and permitted, after it
    /// switches to a non-zero uid (which otherwise clears them all), e.g. `CAP_FSETID` for a
    /// non-root writer that keeps setuid bits.
    pub caps: Vec<u32>,
}

/// `CAP_FSETID`: writes keep setuid/setgid bits; setgid may be set outside the group.
pub const CAP_FSETID: u32 = 4;
/// `CAP_LINUX_IMMUTABLE`: may set and clear the immutable and append-only attributes.
pub const CAP_LINUX_IMMUTABLE: u32 = 9;

/// Sets the calling thread's effective and permitted capabilities to exactly `caps`
/// (capset(2), version 3 of the interface).
pub fn set_caps(caps: &[u32]) -> SysResult<()> {
    #[repr(C)]
    struct Header {
        version: u32,
        pid: i32,
    }
    #[repr(C)]
    #[derive(Clone, Copy, Default)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    let mut data = [Data::default(); 2];
    for &c in caps {
        let (word, bit) = ((c / 32) as usize, 1u32 << (c % 32));
        data[word].effective |= bit;
        data[word].permitted |= bit;
    }
    let header = Header {
        version: 0x2008_0522,
        pid: 0,
    };
    cvt(unsafe { libc::syscall(libc::SYS_capset, &header, data.as_ptr()) as libc::c_int })
        .map(|_| ())
}

/// Exit code of a child whose credential switch failed.
pub const CHILD_SETUP_FAILED: i32 = 250;
/// Exit code of a child that panicked.
pub const CHILD_PANICKED: i32 = 251;

/// Forks; the child runs `f` (optionally after switching to `cred`) and exits with its return
/// value. Returns the child's exit code, or an error string if it died from a signal.
///
/// The child never returns into the caller: it always leaves through `_exit`.
pub fn fork_as<F: FnOnce() -> i32>(cred: Option<&Cred>, f: F) -> Result<i32, String> {
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(format!("fork failed: {}", Errno::last()));
    }
    if pid == 0 {
        let code = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            if let Some(c) = cred {
                if let Some(d) = &c.cwd {
                    let d = cstr(d);
                    if unsafe { libc::chdir(d.as_ptr()) } != 0 {
                        return CHILD_SETUP_FAILED;
                    }
                }
                unsafe {
                    // Keep the permitted set across the uid switch when capabilities stay.
                    if !c.caps.is_empty() && libc::prctl(libc::PR_SET_KEEPCAPS, 1, 0, 0, 0) != 0 {
                        return CHILD_SETUP_FAILED;
                    }
                    if libc::setgroups(c.groups.len(), c.groups.as_ptr()) != 0
                        || libc::setresgid(c.gid, c.gid, c.gid) != 0
                        || libc::setresuid(c.uid, c.uid, c.uid) != 0
                    {
                        return CHILD_SETUP_FAILED;
                    }
                }
                if !c.caps.is_empty() && set_caps(&c.caps).is_err() {
                    return CHILD_SETUP_FAILED;
                }
            }
            f()
        }))
        .unwrap_or(CHILD_PANICKED);
        unsafe { libc::_exit(code) };
    }
    let mut status = 0;
    loop {
        let r = unsafe { libc::waitpid(pid, &mut status, 0) };
        if r == pid {
            break;
        }
        if r < 0 && Errno::last().0 != libc::EINTR {
            return Err(format!("waitpid failed: {}", Errno::last()));
        }
    }
    if libc::WIFEXITED(status) {
        Ok(libc::WEXITSTATUS(status))
    } else if libc::WIFSIGNALED(status) {
        Err(format!("child killed by signal {}", libc::WTERMSIG(status)))
    } else {
        Err(format!("child ended with wait status {status:#x}"))
    }
}

/// In a forked child: maps a syscall result to an exit code (0 = success, else errno).
pub fn child_code<T>(r: SysResult<T>) -> i32 {
    match r {
        Ok(_) => 0,
        Err(e) => e.0,
    }
}

/// `true` when running with effective uid 0.
pub fn is_root() -> bool {
    unsafe { libc::geteuid() == 0 }
}

/// A page/sector-aligned heap buffer (for `O_DIRECT`), freed on drop.
pub struct AlignedBuf {
    ptr: *mut u8,
    len: usize,
}

impl AlignedBuf {
    /// Allocates `len` zeroed bytes aligned to `align` with `posix_memalign`.
    pub fn new(len: usize, align: usize) -> AlignedBuf {
        let mut p: *mut libc::c_void = std::ptr::null_mut();
        let r = unsafe { libc::posix_memalign(&mut p, align, len) };
        assert!(
            r == 0 && !p.is_null(),
            "posix_memalign({len}, {align}) failed: {r}"
        );
        unsafe { std::ptr::write_bytes(p as *mut u8, 0, len) };
        AlignedBuf { ptr: p.cast(), len }
    }
    /// The buffer as a slice.
    pub fn as_slice(&self) -> &[u8] {
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
    /// The buffer as a mutable slice.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        unsafe { libc::free(self.ptr.cast()) };
    }
}

/// A shared memory mapping of part of a file, unmapped on drop.
pub struct Mmap {
    ptr: *mut u8,
    len: usize,
}

impl Mmap {
    /// `mmap(2)` `len` bytes of `fd` at page-aligned `off` with `MAP_SHARED`.
    pub fn new(fd: &Fd, off: u64, len: usize, writable: bool) -> SysResult<Mmap> {
        let prot = if writable {
            libc::PROT_READ | libc::PROT_WRITE
        } else {
            libc::PROT_READ
        };
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                prot,
                libc::MAP_SHARED,
                fd.raw(),
                off as i64,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(Errno::last());
        }
        Ok(Mmap { ptr: p.cast(), len })
    }
    /// The mapping as a slice.
    pub fn as_slice(&self) -> &[u8] {
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
    /// The mapping as a mutable slice (only valid for writable mappings).
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
    /// `msync(MS_SYNC)` over the whole mapping.
    pub fn msync(&self) -> SysResult<()> {
        cvt(unsafe { libc::msync(self.ptr.cast(), self.len, libc::MS_SYNC) }).map(|_| ())
    }
}

impl std::fmt::Debug for Mmap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Mmap({:p}, {} bytes)", self.ptr, self.len)
    }
}

impl Drop for Mmap {
    fn drop(&mut self) {
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

/// System page size.
pub fn page_size() -> usize {
    unsafe { libc::sysconf(libc::_SC_PAGESIZE) as usize }
}
