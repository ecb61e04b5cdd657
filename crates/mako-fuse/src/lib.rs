//! The FUSE adapter: kernel requests in, `mako_fs::FileSystem` calls, replies out.
//!
//! Invariants:
//! - This is the one place where `FsError` becomes an errno (`FsError::errno`).
//! - Kernel references (FUSE lookup counts) are reported to the file system for every
//!   entry handed out (lookup, create, mknod, mkdir, symlink, link, readdirplus), so an
//!   unlinked inode lives exactly as long as the kernel can still reach it.
//! - The kernel keeps attributes and entries for long (`CACHE_TTL`) only while this node
//!   holds the token covering them: attributes under the inode token in `ro` or `xw`,
//!   a name (or its absence: negative entries) under the directory's name token. Without
//!   one the timeout is zero. `Sessions` (the `KernelInvalidator`) takes them back when
//!   the token is revoked or narrowed; a name is recorded in the session's `NameLog`
//!   before the operation that hands it out reads it, so every revoke after that read
//!   finds it (docs/coherence.md section 8).
//! - fuser is kept behind this crate: nothing else in Mako names a fuser type.
//! - One file system may be served at several mount points at once, each its own FUSE
//!   session (its own kernel superblock and caches) over the same `FileSystem`.
//!   `Sessions` is the file system's one `KernelInvalidator`: what the core invalidates
//!   reaches every session, and a change made through one session is invalidated in
//!   the others' caches before its reply, so the other mount points see it at once.
//! - Each session has its own `MountFlags` (read-only, atime policy), which makod may
//!   change while it runs (`mount -o remount`); a read-only session refuses every
//!   change with EROFS itself, whatever the kernel let through.

use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, InitFlags,
    KernelConfig, LockOwner, Notifier, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData,
    ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyIoctl, ReplyLseek, ReplyOpen,
    ReplyStatfs, ReplyStatx, ReplyWrite, ReplyXattr, Request, TimeOrNow, WriteFlags,
};
use mako_format::inode::Timestamp;
use mako_fs::fs::{AtimePolicy, Attr, Ctx, FileSystem, SetAttr, TimeSet, S_IFMT, S_ISGID};
use mako_fs::{FsError, KernelInvalidator};
use std::collections::HashMap;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// How long the kernel may trust attributes and entries without asking again while
/// this node holds the token covering them: a revoke invalidates them sooner. Not
/// unlimited, so that the names a session must remember (`NameLog`) age out.
pub const CACHE_TTL: Duration = Duration::from_secs(3600);
/// How long a session remembers a name after recording it: the kernel's timeout runs
/// from the reply, which comes after the record (an operation may wait for tokens).
const NAME_LOG_KEEP: Duration = Duration::from_secs(2 * 3600 + 60);
/// Most names one session remembers. Past it, names not yet recorded are handed to
/// the kernel with a zero timeout, so memory stays bounded (about 100 bytes a name).
const NAME_LOG_MAX: usize = 1 << 20;
/// Longest wait of a revoke for its kernel name invalidations (`invalidate_names`).
const NAME_INVAL_WAIT: Duration = Duration::from_millis(250);
/// How long a directory whose names' token left this node stays "contended": its names
/// are handed to the kernel with a zero timeout (and not recorded), so the next revoke
/// has no name to invalidate. Invalidating a name takes the kernel's lock of the
/// directory, which a create there holds while it waits for makod — for the very token
/// being revoked when nodes create in one directory — so each such revoke waited
/// `NAME_INVAL_WAIT` (three nodes creating in one directory: 4 to 8 creates/s a node).
const CONTENDED_KEEP: Duration = Duration::from_secs(10);
/// Most contended directories remembered; past it the expired ones are forgotten.
const CONTENDED_MAX: usize = 4096;
/// Least time between two sweeps of expired names.
const NAME_LOG_SWEEP: Duration = Duration::from_secs(10);
/// Longest name a directory holds: only such names are looked up under a name token
/// (`FileSystem::lookup`), so only their absence may be cached.
const NAME_MAX: usize = mako_format::dir_block::NAME_BYTES_MAX;
/// The ioctls through which the kernel's fileattr interface (chattr, lsattr, xfs_io chattr)
/// reaches a FUSE file system (linux/fs.h; x86_64 and the other usual 64-bit ABIs).
const FS_IOC_GETFLAGS: u32 = 0x8008_6601;
const FS_IOC_SETFLAGS: u32 = 0x4008_6602;
const FS_IOC_FSGETXATTR: u32 = 0x801c_581f;
const FS_IOC_FSSETXATTR: u32 = 0x401c_5820;
/// `struct fsxattr`: xflags, extsize, nextents, projid, cowextsize, 8 bytes of padding.
const FSXATTR_BYTES: usize = 28;
/// statx attribute bits for the chattr attributes Mako keeps.
const STATX_ATTR_IMMUTABLE: u64 = 0x10;
const STATX_ATTR_APPEND: u64 = 0x20;
/// File handle bits: how the file was opened.
const FH_DIRECT: u64 = 1;
const FH_APPEND: u64 = 2;

#[derive(Debug, Clone)]
pub struct FuseOptions {
    /// Let the kernel gather small writes in its page cache and send them as large
    /// writes (FUSE writeback cache, `fuseWritebackCache`).
    pub writeback_cache: bool,
    /// Threads serving FUSE requests (`workerThreads`).
    pub threads: usize,
    /// Largest read/write request (`fuseMaxWrite`).
    pub max_write: u32,
    /// Take requests over io_uring when the kernel offers it (`fuseIoUring`).
    pub io_uring: bool,
    /// Files at least this large when opened, and write-only opens, bypass the kernel
    /// page cache (`fuseDirectIoFileSize`); shared so a config change reaches new opens.
    pub direct_io_file_size: Arc<AtomicU64>,
    /// Let every user reach the mount (needs root or user_allow_other).
    pub allow_other: bool,
    pub fs_name: String,
    /// Read-only and atime policy of this mount point (changed by a remount).
    pub flags: Arc<MountFlags>,
    /// Kernel mount flags of this mount point: `nosuid`, `nodev`, `noexec`.
    pub nosuid: bool,
    pub nodev: bool,
    pub noexec: bool,
    /// Every session of this file system (one per mount point).
    pub sessions: Arc<Sessions>,
}

/// The options of one mount point that makod itself honours, changed in place by a
/// remount: whether it is read-only and when reads update atime.
#[derive(Debug, Default)]
pub struct MountFlags {
    read_only: AtomicBool,
    atime: AtomicU8,
}

impl MountFlags {
    pub fn new(read_only: bool, atime: AtimePolicy) -> Arc<MountFlags> {
        let f = Arc::new(MountFlags::default());
        f.set(read_only, atime);
        f
    }

    pub fn set(&self, read_only: bool, atime: AtimePolicy) {
        self.read_only.store(read_only, Ordering::SeqCst);
        let a = match atime {
            AtimePolicy::Relatime => 0,
            AtimePolicy::Strict => 1,
            AtimePolicy::Never => 2,
        };
        self.atime.store(a, Ordering::SeqCst);
    }

    pub fn read_only(&self) -> bool {
        self.read_only.load(Ordering::SeqCst)
    }

    pub fn atime(&self) -> AtimePolicy {
        match self.atime.load(Ordering::Relaxed) {
            1 => AtimePolicy::Strict,
            2 => AtimePolicy::Never,
            _ => AtimePolicy::Relatime,
        }
    }
}

/// The FUSE sessions of one file system (one per mount point), for cache invalidation.
/// The list is replaced, never changed in place, so a notification (which may wait
/// for kernel locks) is sent without holding any lock of Mako's.
/// Each session's id, notifier and the names it handed to its kernel.
type SessionList = Arc<Vec<(u64, Arc<Notifier>, Arc<NameLog>)>>;

/// The names one session handed to its kernel with a timeout (lookup, negative
/// lookup, create, mkdir, readdirplus, …), by directory, with when: the kernel trusts
/// such a dentry until its timeout ends without asking, and FUSE has no notification
/// for "every name of this directory", so when the token covering a directory's names
/// leaves the node (`invalidate_names`), each name recorded is invalidated by name.
/// Names are recorded before the operation reads them under the token (`record`), so
/// a revoke that starts after that read finds them; expired ones are forgotten.
pub struct NameLog {
    inner: Mutex<NameLogInner>,
}

struct NameLogInner {
    dirs: HashMap<u64, HashMap<Vec<u8>, Instant>>,
    count: usize,
    last_sweep: Instant,
    /// Directories whose names' token left this node, with when it last did
    /// (`CONTENDED_KEEP`).
    contended: HashMap<u64, Instant>,
}

impl Default for NameLog {
    fn default() -> Self {
        NameLog {
            inner: Mutex::new(NameLogInner {
                dirs: HashMap::new(),
                count: 0,
                last_sweep: Instant::now(),
                contended: HashMap::new(),
            }),
        }
    }
}

impl NameLog {
    /// Remember `name` in `dir`; false when the log is full, or the directory's names
    /// left this node less than `CONTENDED_KEEP` ago, and the name may only be handed
    /// out with a zero timeout.
    fn record(&self, dir: u64, name: &[u8]) -> bool {
        self.record_as(dir, name, false)
    }

    /// Remember `name` in `dir` even past `NAME_LOG_MAX` (a rename: the kernel moves a
    /// dentry with the timeout it has, whatever the reply says).
    fn record_always(&self, dir: u64, name: &[u8]) {
        self.record_as(dir, name, true);
    }

    fn record_as(&self, dir: u64, name: &[u8], always: bool) -> bool {
        let now = Instant::now();
        let mut g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let inner = &mut *g;
        if inner.count >= NAME_LOG_MAX && now.duration_since(inner.last_sweep) >= NAME_LOG_SWEEP {
            inner.last_sweep = now;
            let mut count = 0;
            inner.dirs.retain(|_, names| {
                names.retain(|_, t| now.duration_since(*t) < NAME_LOG_KEEP);
                count += names.len();
                !names.is_empty()
            });
            inner.count = count;
        }
        let contended = inner
            .contended
            .get(&dir)
            .is_some_and(|t| now.duration_since(*t) < CONTENDED_KEEP);
        if contended && !always {
            return false;
        }
        let full = inner.count >= NAME_LOG_MAX && !always;
        let names = inner.dirs.entry(dir).or_default();
        if let Some(t) = names.get_mut(name) {
            *t = now;
            return true;
        }
        if full {
            return false;
        }
        names.insert(name.to_vec(), now);
        inner.count += 1;
        true
    }

    /// The names of `dir` the kernel may still trust, forgotten here; from now on the
    /// directory is contended for `CONTENDED_KEEP`.
    fn take(&self, dir: u64) -> Vec<Vec<u8>> {
        let now = Instant::now();
        let mut g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if g.contended.len() >= CONTENDED_MAX {
            g.contended
                .retain(|_, t| now.duration_since(*t) < CONTENDED_KEEP);
        }
        g.contended.insert(dir, now);
        let names = g.dirs.remove(&dir).unwrap_or_default();
        g.count = g.count.saturating_sub(names.len());
        drop(g);
        names
            .into_iter()
            .filter(|(_, t)| now.duration_since(*t) < NAME_LOG_KEEP)
            .map(|(n, _)| n)
            .collect()
    }
}

#[derive(Default)]
pub struct Sessions {
    next_id: AtomicU64,
    list: Mutex<SessionList>,
}

impl std::fmt::Debug for Sessions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Sessions({})", self.len())
    }
}

impl Sessions {
    pub fn new() -> Arc<Sessions> {
        Arc::new(Sessions::default())
    }

    fn snapshot(&self) -> SessionList {
        self.list.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn add(&self, id: u64, n: Notifier, names: Arc<NameLog>) {
        let mut l = self.list.lock().unwrap_or_else(|e| e.into_inner());
        let mut v = (**l).clone();
        v.push((id, Arc::new(n), names));
        *l = Arc::new(v);
    }

    fn remove(&self, id: u64) {
        let mut l = self.list.lock().unwrap_or_else(|e| e.into_inner());
        let v: Vec<_> = l.iter().filter(|(i, _, _)| *i != id).cloned().collect();
        *l = Arc::new(v);
    }

    /// How many sessions serve the file system now.
    pub fn len(&self) -> usize {
        self.snapshot().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Every session but `except` drops its attributes of `ino` and, if `offset` is not
    /// negative, its cached pages from `offset` (`len` 0: to the end).
    fn inval_inode(&self, except: Option<u64>, ino: u64, offset: i64, len: i64) {
        for (id, n, _) in self.snapshot().iter() {
            if Some(*id) == except {
                continue;
            }
            if let Err(e) = n.inval_inode(INodeNo(ino), offset, len) {
                tracing::debug!("inval_inode {ino} in session {id}: {e}");
            }
        }
    }

    /// Every session but `except` forgets the name `name` in `parent` (an entry or a
    /// negative entry) and the directory's attributes.
    fn inval_entry(&self, except: Option<u64>, parent: u64, name: &[u8]) {
        for (id, n, _) in self.snapshot().iter() {
            if Some(*id) == except {
                continue;
            }
            let _ = n.inval_entry(INodeNo(parent), OsStr::from_bytes(name));
            let _ = n.inval_inode(INodeNo(parent), -1, 0);
        }
    }
}

impl KernelInvalidator for Sessions {
    fn invalidate_inode(&self, ino: u64, offset: i64, len: i64) {
        self.inval_inode(None, ino, offset, len);
    }
    fn invalidate_entry(&self, parent: u64, name: &[u8]) {
        for (_, n, _) in self.snapshot().iter() {
            let _ = n.inval_entry(INodeNo(parent), OsStr::from_bytes(name));
        }
    }
    fn invalidate_names(&self, dir: u64) {
        // Every name of `dir` the kernel may still trust (recorded and not expired),
        // then the directory's own attributes and listing. Taken from the logs now;
        // sent from a thread of their own, waited for at most `NAME_INVAL_WAIT`: the
        // kernel takes the directory's lock for each, which a lookup or create in the
        // directory holds while it waits for makod — possibly for the very token this
        // revoke is giving up (docs/coherence.md section 8, kernel locks). Past the
        // wait the revoke goes on; the notifications follow as soon as that operation
        // is answered, so a dentry it installs is dropped after all.
        type Work = Vec<(u64, Arc<Notifier>, Vec<Vec<u8>>)>;
        let work: Work = self
            .snapshot()
            .iter()
            .map(|(id, n, names)| (*id, n.clone(), names.take(dir)))
            .collect();
        fn send(dir: u64, work: Work) {
            for (id, n, names) in work {
                for name in names {
                    if let Err(e) = n.inval_entry(INodeNo(dir), OsStr::from_bytes(&name)) {
                        tracing::debug!("inval_entry {dir} in session {id}: {e}");
                    }
                }
                if let Err(e) = n.inval_inode(INodeNo(dir), 0, 0) {
                    tracing::debug!("inval_inode {dir} in session {id}: {e}");
                }
            }
        }
        // The work is handed over through a slot, so that if no thread can be had it
        // is taken back and sent here (unbounded, as before the thread).
        let slot: Arc<Mutex<Option<Work>>> = Arc::new(Mutex::new(Some(work)));
        let done = Arc::new((Mutex::new(false), std::sync::Condvar::new()));
        let signal = done.clone();
        let theirs = slot.clone();
        let job = move || {
            let work = theirs.lock().unwrap_or_else(|e| e.into_inner()).take();
            if let Some(work) = work {
                send(dir, work);
            }
            let (lock, cv) = &*signal;
            *lock.lock().unwrap_or_else(|e| e.into_inner()) = true;
            cv.notify_all();
        };
        if let Err(e) = std::thread::Builder::new()
            .name("mako-inval".into())
            .spawn(job)
        {
            // No thread to be had (the closure was dropped unrun): send them here,
            // unbounded, as before the thread.
            tracing::warn!("no thread for name invalidations of {dir}: {e}; sending them inline");
            let work = slot.lock().unwrap_or_else(|e| e.into_inner()).take();
            if let Some(work) = work {
                send(dir, work);
            }
            return;
        }
        let (lock, cv) = &*done;
        let sent = lock.lock().unwrap_or_else(|e| e.into_inner());
        let (sent, wait) = cv
            .wait_timeout_while(sent, NAME_INVAL_WAIT, |sent| !*sent)
            .unwrap_or_else(|e| e.into_inner());
        if wait.timed_out() && !*sent {
            tracing::debug!(
                "name invalidations of directory {dir} still waiting for the kernel's \
                 directory lock after {NAME_INVAL_WAIT:?}; the revoke goes on"
            );
        }
    }
}

/// The kernel references (FUSE lookup counts) one session holds, so that when the
/// session ends — its kernel sends no FORGET at unmount — they are given back to the
/// file system, which another mount point may go on serving.
type Lookups = Arc<Mutex<HashMap<u64, u64>>>;

pub struct MakoFuse {
    fs: FileSystem,
    max_write: u32,
    writeback_cache: bool,
    direct_io_file_size: Arc<AtomicU64>,
    flags: Arc<MountFlags>,
    sessions: Arc<Sessions>,
    /// This session's id in `sessions`.
    id: u64,
    lookups: Lookups,
    /// The names this session handed to its kernel.
    names: Arc<NameLog>,
}

/// An inode time as a `SystemTime`. Every `Timestamp` (any i64 seconds) is representable
/// on Linux; nothing here can overflow, whatever time a user set.
fn ts(t: Timestamp) -> SystemTime {
    let secs = Duration::from_secs(t.sec.unsigned_abs());
    let whole = if t.sec >= 0 {
        UNIX_EPOCH.checked_add(secs)
    } else {
        UNIX_EPOCH.checked_sub(secs)
    };
    let nsec = Duration::from_nanos(u64::from(t.nsec.min(999_999_999)));
    whole
        .and_then(|w| w.checked_add(nsec))
        .or(whole)
        .unwrap_or(UNIX_EPOCH)
}

/// A time from the kernel (utimensat may pass any seconds, i64::MIN included) as an inode
/// time: seconds rounded down and nanoseconds added (-1.5 s is -2 s + 0.5 s), saturating
/// at the ends of i64.
fn from_systime(t: SystemTime) -> Timestamp {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => Timestamp {
            sec: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
            nsec: d.subsec_nanos(),
        },
        Err(e) => {
            let d = e.duration();
            // -(s + n) = -(s + 1) + (1 - n) for a fraction n > 0.
            let (s, n) = match d.subsec_nanos() {
                0 => (d.as_secs(), 0),
                n => (d.as_secs().saturating_add(1), 1_000_000_000 - n),
            };
            match 0i64.checked_sub_unsigned(s) {
                Some(sec) => Timestamp { sec, nsec: n },
                None => Timestamp {
                    sec: i64::MIN,
                    nsec: 0,
                },
            }
        }
    }
}

fn kind(mode: u32) -> FileType {
    match mode & S_IFMT {
        0o040000 => FileType::Directory,
        0o120000 => FileType::Symlink,
        0o010000 => FileType::NamedPipe,
        0o020000 => FileType::CharDevice,
        0o060000 => FileType::BlockDevice,
        0o140000 => FileType::Socket,
        _ => FileType::RegularFile,
    }
}

fn dkind(d_type: u8) -> FileType {
    kind((d_type as u32) << 12)
}

pub fn file_attr(a: &Attr) -> FileAttr {
    FileAttr {
        ino: INodeNo(a.ino),
        size: a.size,
        blocks: a.blocks,
        atime: ts(a.atime),
        mtime: ts(a.mtime),
        ctime: ts(a.ctime),
        crtime: ts(a.crtime),
        kind: kind(a.mode),
        perm: (a.mode & 0o7777) as u16,
        nlink: a.nlink,
        uid: a.uid,
        gid: a.gid,
        rdev: a.rdev,
        blksize: a.blksize,
        flags: 0,
    }
}

/// The attributes of a negative entry (node id 0): the kernel reads only the timeouts.
fn negative_attr() -> FileAttr {
    FileAttr {
        ino: INodeNo(0),
        size: 0,
        blocks: 0,
        atime: UNIX_EPOCH,
        mtime: UNIX_EPOCH,
        ctime: UNIX_EPOCH,
        crtime: UNIX_EPOCH,
        kind: FileType::RegularFile,
        perm: 0,
        nlink: 0,
        uid: 0,
        gid: 0,
        rdev: 0,
        blksize: 0,
        flags: 0,
    }
}

fn errno(e: &FsError) -> Errno {
    if e.is_serious() {
        tracing::error!("{e}");
    } else if matches!(e, FsError::NoSpace(_)) {
        // An admin seeing ENOSPC with space free needs the reason (which node's space,
        // the log, a directory): logged at most once a second, so a full file system
        // does not flood makod.log.
        use std::sync::atomic::{AtomicU64, Ordering};
        static LAST: AtomicU64 = AtomicU64::new(u64::MAX);
        let now = std::time::SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        if LAST.swap(now, Ordering::Relaxed) != now {
            tracing::warn!("ENOSPC returned to an application: {e}");
        }
    }
    Errno::from_i32(e.errno())
}

/// Whether the caller of `req` is in group `gid` (as its fsgid or a supplementary group) or
/// has CAP_FSETID: `in_group_or_capable` in the kernel, which decides whether a setgid bit
/// without group execute survives a change by that caller. A FUSE request carries only the
/// caller's uid, gid and pid; its supplementary groups and capabilities are read from
/// `/proc/<pid>/status`, which names the caller for as long as it waits in its system call.
/// Without it (a request the kernel makes on its own, pid 0), only the gid and root count.
fn caller_in_group_or_capable(req: &Request, gid: u32) -> bool {
    if req.gid() == gid {
        return true;
    }
    let status = match req.pid() {
        0 => None,
        pid => std::fs::read_to_string(format!("/proc/{pid}/status")).ok(),
    };
    let Some(status) = status else {
        return req.uid() == 0;
    };
    const CAP_FSETID: u32 = 4;
    status.lines().any(|l| {
        if let Some(groups) = l.strip_prefix("Groups:") {
            groups.split_whitespace().any(|g| g.parse() == Ok(gid))
        } else if let Some(caps) = l.strip_prefix("CapEff:") {
            u64::from_str_radix(caps.trim(), 16).is_ok_and(|c| c & (1 << CAP_FSETID) != 0)
        } else {
            false
        }
    })
}

fn ctx(req: &Request) -> Ctx {
    Ctx {
        uid: req.uid(),
        gid: req.gid(),
        pid: req.pid(),
    }
}

impl MakoFuse {
    /// How long the kernel may keep `ino`'s attributes: `CACHE_TTL` while this node
    /// holds the inode token in `ro` or `xw` (its revoke invalidates them), else zero —
    /// in particular when it shares the inode with writers on other nodes (`rw`): their
    /// sizes and times reach the metanode without revoking anything here, so the kernel
    /// must ask every time (docs/coherence.md section 8).
    fn ttl(&self, ino: u64) -> Duration {
        if self.fs.kernel_may_cache_attrs(ino) {
            CACHE_TTL
        } else {
            Duration::ZERO
        }
    }

    /// How long the kernel may keep a name handed out by an operation that recorded it
    /// (`logged`) before reading it under the directory's name token.
    fn entry_ttl(logged: bool) -> Duration {
        if logged {
            CACHE_TTL
        } else {
            Duration::ZERO
        }
    }

    /// Record `name` of `parent` before an operation reads it (see `NameLog`): whether
    /// the kernel may keep the entry it gets.
    fn log_name(&self, parent: u64, name: &[u8]) -> bool {
        name != b"." && name != b".." && self.names.record(parent, name)
    }

    /// Run one request handler. A panic is a Mako bug: the request gets EIO (fuser
    /// replies EIO for a reply that was never sent), the handler thread survives (an
    /// unwinding event-loop thread would end the whole session), and the mount turns
    /// read-only, because in-memory state may be half-changed and must not reach disk.
    fn guard(&self, op: &'static str, f: impl FnOnce()) {
        if let Err(panic) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into());
            tracing::error!("BUG: FUSE {op} panicked: {what}; the mount is now read-only to protect the data, unmount and report it");
            self.fs
                .core
                .go_read_only(&format!("internal error in {op}: {what}"));
        }
    }

    /// For a change that clears setid bits: whether the caller is outside the file's group
    /// (without CAP_FSETID), which matters only for a setgid bit without group execute, so
    /// only then is `/proc` consulted. A concurrent chmod or chgrp can only make this
    /// answer stale for that one bit.
    fn caller_outside_group(&self, req: &Request, ino: u64) -> bool {
        match self.fs.getattr(ino) {
            Ok(a) if a.mode & S_ISGID != 0 && a.mode & 0o010 == 0 => {
                !caller_in_group_or_capable(req, a.gid)
            }
            _ => false,
        }
    }

    /// Feed directory entries after `offset` to `add` in batches until it reports the
    /// reply buffer full (true) or the directory ends.
    fn each_entry(
        &self,
        ino: u64,
        offset: u64,
        batch: usize,
        mut add: impl FnMut(&mako_fs::fs::DirListing, u64) -> bool,
    ) -> Result<(), FsError> {
        let mut after = offset;
        loop {
            let read_at = self.fs.grant_clock();
            let entries = self.fs.readdir(ino, after, batch)?;
            if entries.is_empty() {
                return Ok(());
            }
            for e in &entries {
                if add(e, read_at) {
                    return Ok(());
                }
                after = e.cookie;
            }
        }
    }

    fn new(
        fs: FileSystem,
        opts: &FuseOptions,
        id: u64,
        lookups: Lookups,
        names: Arc<NameLog>,
    ) -> MakoFuse {
        MakoFuse {
            fs,
            max_write: opts.max_write,
            writeback_cache: opts.writeback_cache,
            direct_io_file_size: opts.direct_io_file_size.clone(),
            flags: opts.flags.clone(),
            sessions: opts.sessions.clone(),
            id,
            lookups,
            names,
        }
    }

    /// The kernel holds one more reference to `ino` through this session.
    fn add_lookup(&self, ino: u64) {
        self.fs.add_lookup(ino);
        *self
            .lookups
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(ino)
            .or_insert(0) += 1;
    }

    /// EROFS when this mount point is read-only (`ro`, `remount,ro`). The kernel refuses
    /// most changes on a read-only mount before they reach makod; this covers the rest
    /// (and a remount makod was told about before the kernel applied it).
    fn refuse_if_read_only(&self) -> Result<(), Errno> {
        if self.flags.read_only() {
            Err(Errno::from_i32(libc::EROFS))
        } else {
            Ok(())
        }
    }

    /// The other mount points drop what they cached of `ino` (attributes, and pages
    /// from `offset` if it is not negative).
    fn peers_inode(&self, ino: u64, offset: i64, len: i64) {
        self.sessions.inval_inode(Some(self.id), ino, offset, len);
    }

    /// The other mount points forget `name` in `parent`.
    fn peers_entry(&self, parent: u64, name: &[u8]) {
        self.sessions.inval_entry(Some(self.id), parent, name);
    }

    /// Replies to a request that handed a name to the kernel; `logged`: the name was
    /// recorded before the operation read it (`log_name`).
    fn entry(&self, logged: bool, r: Result<Attr, FsError>, reply: ReplyEntry) {
        match r {
            Ok(a) => {
                self.add_lookup(a.ino);
                reply.entry_with_ttls(
                    &self.ttl(a.ino),
                    &Self::entry_ttl(logged),
                    &file_attr(&a),
                    Generation(a.generation as u64),
                );
            }
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn empty(r: Result<(), FsError>, reply: ReplyEmpty) {
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn xattr_reply(data: Result<Vec<u8>, FsError>, size: u32, reply: ReplyXattr) {
        match data {
            Ok(v) if size == 0 => reply.size(v.len() as u32),
            Ok(v) if v.len() > size as usize => reply.error(Errno::from_i32(libc::ERANGE)),
            Ok(v) => reply.data(&v),
            Err(e) => reply.error(errno(&e)),
        }
    }

    /// File handle bits and open flags for an open with `flags` of a file of `size`
    /// bytes.
    fn open_flags(&self, flags: i32, size: u64) -> (u64, FopenFlags) {
        let mut fh = 0;
        // close() promises nothing on a parallel file system (write-behind and fsync
        // do; POSIX locks are the kernel's), so the kernel need not send FLUSH: one
        // round trip less per close — a quarter of what creating an empty file costs.
        // (With the writeback cache the kernel still writes its dirty pages back first.)
        let mut out = FopenFlags::FOPEN_NOFLUSH;
        if flags & libc::O_DIRECT != 0 {
            fh |= FH_DIRECT;
            out |= FopenFlags::FOPEN_DIRECT_IO;
        } else if self.bypass_page_cache(flags, size) {
            // Served through the pagepool as usual (no FH_DIRECT), but the kernel copies
            // straight between the caller's buffer and makod: one copy instead of two
            // and no page cache pages to allocate (`fuseDirectIoFileSize`). mmap still
            // works: FUSE_DIRECT_IO_ALLOW_MMAP, and the kernel writes back and drops its
            // mapped pages around each direct read and write.
            out |= FopenFlags::FOPEN_DIRECT_IO;
        }
        // No FOPEN_KEEP_CACHE: as in GPFS, the pagepool is the data cache. The kernel's
        // page cache lasts for one open, so every open's first read reaches Mako
        // (which keeps atime right under relatime) and costs only a pagepool hit.
        // With the writeback cache the kernel owns the file size and places appends
        // itself; Mako must write where the kernel says.
        if flags & libc::O_APPEND != 0 && !self.writeback_cache {
            fh |= FH_APPEND;
        }
        (fh, out)
    }

    /// Whether an open (without O_DIRECT) goes past the kernel page cache: never with the
    /// writeback cache (its point is the page cache); always for write-only opens (no
    /// read can use the pages, and each write saves a copy); else by file size.
    fn bypass_page_cache(&self, flags: i32, size: u64) -> bool {
        if self.writeback_cache {
            return false;
        }
        flags & libc::O_ACCMODE == libc::O_WRONLY
            || size >= self.direct_io_file_size.load(Ordering::Relaxed)
    }
}

impl Filesystem for MakoFuse {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        let want = InitFlags::FUSE_POSIX_ACL
            | InitFlags::FUSE_DONT_MASK
            | InitFlags::FUSE_DO_READDIRPLUS
            | InitFlags::FUSE_READDIRPLUS_AUTO
            | InitFlags::FUSE_PARALLEL_DIROPS
            | InitFlags::FUSE_DIRECT_IO_ALLOW_MMAP
            | InitFlags::FUSE_ASYNC_DIO
            | InitFlags::FUSE_MAX_PAGES
            // When a file's mtime changes under the kernel's cached pages (utimensat,
            // another node's write), the kernel drops them, so the next read reaches
            // Mako — which keeps atime (relatime) and serves current data.
            | InitFlags::FUSE_AUTO_INVAL_DATA
            // The kernel says which writes, truncates and opens must clear setuid/setgid
            // (callers without CAP_FSETID; every chown), and makod clears them, in the same
            // transaction where it can: the kernel's own attempt (a getattr and a chmod
            // before the write) does not reach writes that bypass the page cache.
            | InitFlags::FUSE_HANDLE_KILLPRIV_V2
            // Setting an access ACL says whether setgid must go (FUSE_SETXATTR_ACL_KILL_SGID).
            | InitFlags::FUSE_SETXATTR_EXT
            // chattr/lsattr on directories reach the file system too.
            | InitFlags::FUSE_HAS_IOCTL_DIR
            // File handles (NFS export, open_by_handle_at) outlive the kernel's inode
            // cache and remounts: the kernel finds an inode it dropped by asking for "."
            // in its number (and a directory's parent by ".."), and compares the
            // generation, which changes when a number is used again.
            | InitFlags::FUSE_EXPORT_SUPPORT;
        let want = if self.writeback_cache {
            want | InitFlags::FUSE_WRITEBACK_CACHE
        } else {
            want
        };
        let supported = config.capabilities() & want;
        if let Err(missing) = config.add_capabilities(supported) {
            tracing::warn!("kernel refused FUSE capabilities {missing:?}");
        }
        let max_write = match config.set_max_write(self.max_write) {
            Ok(_) => self.max_write,
            Err(nearest) => {
                tracing::warn!(
                    "kernel limits FUSE requests to {nearest} bytes (asked {})",
                    self.max_write
                );
                let _ = config.set_max_write(nearest);
                nearest
            }
        };
        let _ = config.set_max_readahead(max_write);
        let _ = config.set_max_background(64);
        let _ = config.set_congestion_threshold(48);
        tracing::info!(
            "FUSE session: max_write {max_write} bytes, capabilities {:?}",
            supported
        );
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        self.guard("lookup", move || {
            if mako_diag::test_hooks::panic_on_lookup() == Some(name.as_bytes()) {
                panic!(
                    "test hook {}: lookup of {name:?}",
                    mako_diag::test_hooks::PANIC_ON_LOOKUP_ENV
                );
            }
            let name = name.as_bytes();
            let logged = self.log_name(parent.0, name);
            let r = self.fs.lookup(parent.0, name);
            if logged && name.len() <= NAME_MAX && matches!(r, Err(FsError::NotFound(_))) {
                // A negative entry: the kernel keeps the absence (repeated misses, the
                // lookup before a create) until this node's name token goes.
                return reply.entry_with_ttls(
                    &Duration::ZERO,
                    &CACHE_TTL,
                    &negative_attr(),
                    Generation(0),
                );
            }
            self.entry(logged, r, reply);
        })
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        self.guard("forget", move || {
            {
                let mut l = self.lookups.lock().unwrap_or_else(|e| e.into_inner());
                if let Some(c) = l.get_mut(&ino.0) {
                    *c = c.saturating_sub(nlookup);
                    if *c == 0 {
                        l.remove(&ino.0);
                    }
                }
            }
            self.fs.forget(ino.0, nlookup);
        })
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        self.guard("getattr", move || match self.fs.getattr(ino.0) {
            Ok(a) => reply.attr(&self.ttl(a.ino), &file_attr(&a)),
            Err(e) => reply.error(errno(&e)),
        })
    }

    fn setattr_ext(
        &self,
        req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        kill_suidgid: bool,
        reply: ReplyAttr,
    ) {
        self.guard("setattr", move || {
            if let Err(e) = self.refuse_if_read_only() {
                return reply.error(e);
            }
            let t = |x: TimeOrNow| match x {
                TimeOrNow::Now => TimeSet::Now,
                TimeOrNow::SpecificTime(s) => TimeSet::At(from_systime(s)),
            };
            // Only a pure time change (utimensat) drops the kernel's pages: a truncate holds
            // page locks while it waits for this reply, and invalidating under it deadlocks.
            let times = (atime.is_some() || mtime.is_some()) && size.is_none();
            // A setattr that changes nothing is how the kernel's `file_remove_privs` reaches
            // a FUSE file system with FUSE_HANDLE_KILLPRIV_V2 (the kernel strips the mode it
            // would have set, leaving the request): it comes before a fallocate, a punch
            // hole, a zero range or a copy_file_range by a caller without CAP_FSETID whose
            // file has setid bits, and on chown(f, -1, -1). ext4 clears the bits then.
            let nothing = mode.is_none()
                && uid.is_none()
                && gid.is_none()
                && size.is_none()
                && atime.is_none()
                && mtime.is_none()
                && ctime.is_none();
            let clear_setid = kill_suidgid || nothing;
            let set = SetAttr {
                mode,
                uid,
                gid,
                size,
                atime: atime.map(t),
                mtime: mtime.map(t),
                ctime: ctime.map(from_systime),
                clear_setid,
                caller_outside_group: clear_setid && self.caller_outside_group(req, ino.0),
            };
            match self.fs.setattr(ino.0, set) {
                Ok(a) => {
                    if times {
                        // Pages the kernel cached would hide later reads from Mako, and with
                        // them the atime updates that relatime owes after utimens. The
                        // kernel's reverse invalidation takes page locks, not the inode lock
                        // this setattr holds, so it is safe before the reply.
                        if let Some(inv) = self.fs.core.invalidator.read().clone() {
                            inv.invalidate_inode(ino.0, 0, 0);
                        }
                    } else {
                        // The other mount points' pages of a truncated file and their
                        // attributes are stale (this session's kernel knows already).
                        self.peers_inode(ino.0, if size.is_some() { 0 } else { -1 }, 0);
                    }
                    reply.attr(&self.ttl(a.ino), &file_attr(&a));
                }
                Err(e) => reply.error(errno(&e)),
            }
        })
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        self.guard("readlink", move || match self.fs.readlink(ino.0) {
            Ok(d) => reply.data(&d),
            Err(e) => reply.error(errno(&e)),
        })
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        self.guard("mknod", move || {
            if let Err(e) = self.refuse_if_read_only() {
                return reply.error(e);
            }
            let logged = self.log_name(parent.0, name.as_bytes());
            let r = self
                .fs
                .mknod(ctx(req), parent.0, name.as_bytes(), mode, umask, rdev);
            if r.is_ok() {
                self.peers_entry(parent.0, name.as_bytes());
            }
            self.entry(logged, r, reply);
        })
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        self.guard("mkdir", move || {
            if let Err(e) = self.refuse_if_read_only() {
                return reply.error(e);
            }
            let logged = self.log_name(parent.0, name.as_bytes());
            let r = self
                .fs
                .mkdir(ctx(req), parent.0, name.as_bytes(), mode, umask);
            if r.is_ok() {
                self.peers_entry(parent.0, name.as_bytes());
            }
            self.entry(logged, r, reply);
        })
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        self.guard("unlink", move || {
            if let Err(e) = self.refuse_if_read_only() {
                return reply.error(e);
            }
            let r = self.fs.unlink(parent.0, name.as_bytes());
            if r.is_ok() {
                self.peers_entry(parent.0, name.as_bytes());
            }
            Self::empty(r, reply);
        })
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        self.guard("rmdir", move || {
            if let Err(e) = self.refuse_if_read_only() {
                return reply.error(e);
            }
            let r = self.fs.rmdir(parent.0, name.as_bytes());
            if r.is_ok() {
                self.peers_entry(parent.0, name.as_bytes());
            }
            Self::empty(r, reply);
        })
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        self.guard("symlink", move || {
            if let Err(e) = self.refuse_if_read_only() {
                return reply.error(e);
            }
            let logged = self.log_name(parent.0, link_name.as_bytes());
            let r = self.fs.symlink(
                ctx(req),
                parent.0,
                link_name.as_bytes(),
                target.as_os_str().as_bytes(),
            );
            if r.is_ok() {
                self.peers_entry(parent.0, link_name.as_bytes());
            }
            self.entry(logged, r, reply);
        })
    }

    fn rename(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        self.guard("rename", move || {
            if let Err(e) = self.refuse_if_read_only() {
                return reply.error(e);
            }
            // The kernel moves its dentry to the new name with the timeout it had (and,
            // for an exchange or a whiteout, keeps one at the old name): both names are
            // this session's to invalidate from now on, recorded before the change even
            // past the log's limit (the kernel's own move cannot be refused a timeout).
            self.names.record_always(parent.0, name.as_bytes());
            self.names.record_always(newparent.0, newname.as_bytes());
            let r = self.fs.rename_as(
                ctx(req),
                parent.0,
                name.as_bytes(),
                newparent.0,
                newname.as_bytes(),
                flags.bits(),
            );
            if r.is_ok() {
                self.peers_entry(parent.0, name.as_bytes());
                self.peers_entry(newparent.0, newname.as_bytes());
            }
            Self::empty(r, reply);
        })
    }

    fn link(
        &self,
        _req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        self.guard("link", move || {
            if let Err(e) = self.refuse_if_read_only() {
                return reply.error(e);
            }
            let logged = self.log_name(newparent.0, newname.as_bytes());
            let r = self.fs.link(ino.0, newparent.0, newname.as_bytes());
            if r.is_ok() {
                self.peers_entry(newparent.0, newname.as_bytes());
                self.peers_inode(ino.0, -1, 0);
            }
            self.entry(logged, r, reply);
        })
    }

    fn open_ext(
        &self,
        req: &Request,
        ino: INodeNo,
        flags: OpenFlags,
        kill_suidgid: bool,
        reply: ReplyOpen,
    ) {
        self.guard("open", move || {
            let writes =
                flags.0 & libc::O_ACCMODE != libc::O_RDONLY || flags.0 & libc::O_TRUNC != 0;
            if writes {
                if let Err(e) = self.refuse_if_read_only() {
                    return reply.error(e);
                }
            }
            if let Err(e) = self.fs.check_open(ino.0, flags.0) {
                return reply.error(errno(&e));
            }
            match self.fs.open(ino.0) {
                Ok(attr) => {
                    if flags.0 & libc::O_TRUNC != 0 {
                        // Only with FUSE_ATOMIC_O_TRUNC, which Mako does not ask for; kept
                        // for kernels that send it anyway.
                        if let Err(e) = self.fs.setattr(
                            ino.0,
                            SetAttr {
                                size: Some(0),
                                clear_setid: kill_suidgid,
                                caller_outside_group: kill_suidgid
                                    && self.caller_outside_group(req, ino.0),
                                ..Default::default()
                            },
                        ) {
                            let _ = self.fs.release(ino.0);
                            return reply.error(errno(&e));
                        }
                    }
                    let size = if flags.0 & libc::O_TRUNC != 0 {
                        0
                    } else {
                        attr.size
                    };
                    let (fh, out) = self.open_flags(flags.0, size);
                    reply.opened(FileHandle(fh), out);
                }
                Err(e) => reply.error(errno(&e)),
            }
        })
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock: Option<LockOwner>,
        reply: ReplyData,
    ) {
        self.guard("read", move || {
            if fh.0 & FH_DIRECT != 0 {
                match self.fs.read_direct(ino.0, offset, size) {
                    Ok(d) => reply.data(&d),
                    Err(e) => reply.error(errno(&e)),
                }
                return;
            }
            // The reply is written from the pagepool buffer when the range is in one block.
            let mut reply = Some(reply);
            let atime = if self.flags.read_only() {
                // A read-only mount changes nothing, atime included (as the kernel's
                // own file systems do).
                AtimePolicy::Never
            } else {
                self.flags.atime()
            };
            let r = self.fs.read_with_atime(ino.0, offset, size, atime, |d| {
                if let Some(r) = reply.take() {
                    r.data(d)
                }
            });
            if let (Err(e), Some(r)) = (r, reply.take()) {
                r.error(errno(&e));
            }
        })
    }

    fn write(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        self.guard("write", move || {
            if let Err(e) = self.refuse_if_read_only() {
                return reply.error(e);
            }
            // FUSE_HANDLE_KILLPRIV_V2: the kernel flags writes by callers without
            // CAP_FSETID, through the page cache or not; the file system clears the bits.
            if write_flags.contains(WriteFlags::FUSE_WRITE_KILL_SUIDGID) {
                let in_group = |gid| caller_in_group_or_capable(req, gid);
                if let Err(e) = self.fs.clear_setid(ino.0, in_group) {
                    return reply.error(errno(&e));
                }
                // The kernel keeps the mode it had (it checks exec and permissions with
                // it) for as long as the timeout says: it must see the bits gone.
                self.sessions.inval_inode(None, ino.0, -1, 0);
            }
            let r = if fh.0 & FH_DIRECT != 0 {
                self.fs.write_direct(ino.0, offset, data)
            } else {
                self.fs.write(ino.0, offset, data, fh.0 & FH_APPEND != 0)
            };
            match r {
                Ok(n) => {
                    // An append lands at the size, not at `offset`: drop all pages then.
                    let from = if fh.0 & FH_APPEND != 0 { 0 } else { offset };
                    self.peers_inode(ino.0, i64::try_from(from).unwrap_or(i64::MAX), 0);
                    reply.written(n as u32)
                }
                Err(e) => reply.error(errno(&e)),
            }
        })
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock: LockOwner,
        reply: ReplyEmpty,
    ) {
        self.guard("flush", move || {
            // close() does not promise durability; write-behind and fsync do. Opens
            // say FOPEN_NOFLUSH, so this comes only with the writeback cache.
            reply.ok();
        })
    }

    fn release(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _flags: OpenFlags,
        _lock: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        self.guard("release", move || {
            Self::empty(self.fs.release(ino.0), reply);
        })
    }

    fn fsync(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        datasync: bool,
        reply: ReplyEmpty,
    ) {
        self.guard("fsync", move || {
            Self::empty(self.fs.fsync(ino.0, datasync), reply);
        })
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        datasync: bool,
        reply: ReplyEmpty,
    ) {
        self.guard("fsyncdir", move || {
            Self::empty(self.fs.fsync(ino.0, datasync), reply);
        })
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        self.guard("readdir", move || {
            let r = self.each_entry(ino.0, offset, 128, |e, _| {
                reply.add(
                    INodeNo(e.ino),
                    e.cookie,
                    dkind(e.kind),
                    OsStr::from_bytes(&e.name),
                )
            });
            match r {
                Ok(()) => reply.ok(),
                Err(e) => reply.error(errno(&e)),
            }
        })
    }

    fn readdirplus(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        self.guard("readdirplus", move || {
            let r = self.each_entry(ino.0, offset, 64, |e, read_at| {
                // An entry removed between listing and stat is skipped.
                let Ok(attr) = self.fs.getattr(e.ino) else {
                    return false;
                };
                // The name was read before it could be recorded: the kernel keeps it
                // only if the token it was read under is still here, unrevoked (one
                // timeout for the entry and the attributes).
                let dot = e.name == b"." || e.name == b"..";
                let logged = !dot && self.names.record(ino.0, &e.name);
                let ttl = if logged && self.fs.kernel_may_cache_listing(ino.0, read_at) {
                    self.ttl(attr.ino)
                } else {
                    Duration::ZERO
                };
                let full = reply.add(
                    INodeNo(e.ino),
                    e.cookie,
                    OsStr::from_bytes(&e.name),
                    &ttl,
                    &file_attr(&attr),
                    Generation(attr.generation as u64),
                );
                // Entries handed to the kernel (all but . and ..) count as lookups.
                if !full && !dot {
                    self.add_lookup(e.ino);
                }
                full
            });
            match r {
                Ok(()) => reply.ok(),
                Err(e) => reply.error(errno(&e)),
            }
        })
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        self.guard("statfs", move || {
            let s = self.fs.statfs();
            reply.statfs(
                s.blocks,
                s.blocks_free,
                s.blocks_available,
                s.files,
                s.files_free,
                s.block_bytes,
                s.name_max,
                s.fragment_bytes,
            );
        })
    }

    fn setxattr_ext(
        &self,
        _req: &Request,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        _position: u32,
        setxattr_flags: u32,
        reply: ReplyEmpty,
    ) {
        self.guard("setxattr", move || {
            if let Err(e) = self.refuse_if_read_only() {
                return reply.error(e);
            }
            let clear_sgid = setxattr_flags & fuser::consts::FUSE_SETXATTR_ACL_KILL_SGID != 0;
            let r = self
                .fs
                .setxattr_as(ino.0, name.as_bytes(), value, flags, clear_sgid);
            if r.is_ok() {
                // An ACL may change the mode (and clear setgid), ctime changes: this
                // session's kernel too must ask again, it may keep attributes for long.
                self.sessions.inval_inode(None, ino.0, -1, 0);
            }
            Self::empty(r, reply);
        })
    }

    fn getxattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        self.guard("getxattr", move || {
            Self::xattr_reply(self.fs.getxattr(ino.0, name.as_bytes()), size, reply);
        })
    }

    fn listxattr(&self, req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        self.guard("listxattr", move || {
            // trusted.* names are listed only to privileged callers (CAP_SYS_ADMIN; uid 0
            // stands for it here), as local file systems do.
            let privileged = req.uid() == 0;
            let list = self.fs.listxattr(ino.0).map(|l| {
                l.split(|&b| b == 0)
                    .filter(|n| !n.is_empty() && (privileged || !n.starts_with(b"trusted.")))
                    .flat_map(|n| n.iter().copied().chain(std::iter::once(0)))
                    .collect()
            });
            Self::xattr_reply(list, size, reply);
        })
    }

    fn removexattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        self.guard("removexattr", move || {
            if let Err(e) = self.refuse_if_read_only() {
                return reply.error(e);
            }
            let r = self.fs.removexattr(ino.0, name.as_bytes());
            if r.is_ok() {
                // As for setxattr: the mode (an ACL) and ctime change.
                self.sessions.inval_inode(None, ino.0, -1, 0);
            }
            Self::empty(r, reply);
        })
    }

    fn access(&self, _req: &Request, _ino: INodeNo, _mask: fuser::AccessFlags, reply: ReplyEmpty) {
        self.guard("access", move || {
            // The kernel checks permissions itself (default_permissions).
            reply.ok();
        })
    }

    fn create_ext(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        kill_suidgid: bool,
        reply: ReplyCreate,
    ) {
        self.guard("create", move || {
            if let Err(e) = self.refuse_if_read_only() {
                return reply.error(e);
            }
            let logged = self.log_name(parent.0, name.as_bytes());
            let r = self.fs.create(
                ctx(req),
                parent.0,
                name.as_bytes(),
                mode,
                umask,
                flags & libc::O_EXCL != 0,
            );
            match r {
                Ok(a) => {
                    // An existing file (no O_EXCL) may be immutable or append-only.
                    if let Err(e) = self.fs.check_open(a.ino, flags) {
                        return reply.error(errno(&e));
                    }
                    if let Err(e) = self.fs.open(a.ino) {
                        return reply.error(errno(&e));
                    }
                    let a = if flags & libc::O_TRUNC != 0 && a.size > 0 {
                        match self.fs.setattr(
                            a.ino,
                            SetAttr {
                                size: Some(0),
                                clear_setid: kill_suidgid,
                                caller_outside_group: kill_suidgid
                                    && self.caller_outside_group(req, a.ino),
                                ..Default::default()
                            },
                        ) {
                            Ok(a) => a,
                            Err(e) => {
                                let _ = self.fs.release(a.ino);
                                return reply.error(errno(&e));
                            }
                        }
                    } else {
                        a
                    };
                    self.add_lookup(a.ino);
                    self.peers_entry(parent.0, name.as_bytes());
                    if flags & libc::O_TRUNC != 0 {
                        self.peers_inode(a.ino, 0, 0);
                    }
                    let (fh, out) = self.open_flags(flags, a.size);
                    // One timeout for the entry and the attributes.
                    let ttl = if logged {
                        self.ttl(a.ino)
                    } else {
                        Duration::ZERO
                    };
                    reply.created(
                        &ttl,
                        &file_attr(&a),
                        Generation(a.generation as u64),
                        FileHandle(fh),
                        out,
                    );
                }
                Err(e) => reply.error(errno(&e)),
            }
        })
    }

    fn tmpfile(
        &self,
        req: &Request,
        parent: INodeNo,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        self.guard("tmpfile", move || {
            if let Err(e) = self.refuse_if_read_only() {
                return reply.error(e);
            }
            let a = match self.fs.tmpfile(ctx(req), parent.0, mode, umask) {
                Ok(a) => a,
                Err(e) => return reply.error(errno(&e)),
            };
            if let Err(e) = self.fs.open(a.ino) {
                return reply.error(errno(&e));
            }
            // The kernel holds the inode as it holds a looked-up one, and forgets it when
            // the last file closes (no links) or after a link.
            self.add_lookup(a.ino);
            let (fh, out) = self.open_flags(flags, 0);
            reply.created(
                &self.ttl(a.ino),
                &file_attr(&a),
                Generation(a.generation as u64),
                FileHandle(fh),
                out,
            );
        })
    }

    fn fallocate(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        self.guard("fallocate", move || {
            if let Err(e) = self.refuse_if_read_only() {
                return reply.error(e);
            }
            let r = self.fs.fallocate(ino.0, offset, length, mode);
            if r.is_ok() {
                self.peers_inode(ino.0, offset as i64, length as i64);
            }
            Self::empty(r, reply);
        })
    }

    fn ioctl(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _flags: fuser::IoctlFlags,
        cmd: u32,
        in_data: &[u8],
        _out_size: u32,
        reply: ReplyIoctl,
    ) {
        self.guard("ioctl", move || {
            // The kernel checks ownership and CAP_LINUX_IMMUTABLE before it sends a set.
            let word = |i: usize| {
                in_data
                    .get(i * 4..i * 4 + 4)
                    .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            };
            let r = match cmd {
                FS_IOC_GETFLAGS => self
                    .fs
                    .file_attributes(ino.0)
                    .map(|f| f.to_le_bytes().to_vec()),
                FS_IOC_SETFLAGS | FS_IOC_FSSETXATTR if self.flags.read_only() => {
                    return reply.error(Errno::from_i32(libc::EROFS))
                }
                FS_IOC_SETFLAGS => match word(0) {
                    Some(f) => self.fs.set_file_attributes(ino.0, f).map(|()| Vec::new()),
                    None => return reply.error(Errno::from_i32(libc::EINVAL)),
                },
                FS_IOC_FSGETXATTR => self.fs.file_xflags(ino.0).map(|x| {
                    let mut out = vec![0u8; FSXATTR_BYTES];
                    out[..4].copy_from_slice(&x.to_le_bytes());
                    out
                }),
                FS_IOC_FSSETXATTR => match (word(0), word(1), word(3)) {
                    (Some(x), Some(extsize), Some(projid)) => self
                        .fs
                        .set_file_xflags(ino.0, x, extsize, projid)
                        .map(|()| Vec::new()),
                    _ => return reply.error(Errno::from_i32(libc::EINVAL)),
                },
                // Not a file system ioctl Mako knows.
                _ => return reply.error(Errno::from_i32(libc::ENOTTY)),
            };
            if cmd == FS_IOC_SETFLAGS || cmd == FS_IOC_FSSETXATTR {
                // ctime changed behind the kernel's back, in every session.
                self.sessions.inval_inode(None, ino.0, -1, 0);
            }
            match r {
                Ok(out) => reply.ioctl(0, &out),
                Err(e) => reply.error(errno(&e)),
            }
        })
    }

    fn statx(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: Option<FileHandle>,
        _flags: u32,
        _mask: u32,
        reply: ReplyStatx,
    ) {
        self.guard("statx", move || match self.fs.getattr(ino.0) {
            Ok(a) => {
                let mut attributes = 0;
                if a.attributes & mako_fs::attributes::FS_IMMUTABLE_FL != 0 {
                    attributes |= STATX_ATTR_IMMUTABLE;
                }
                if a.attributes & mako_fs::attributes::FS_APPEND_FL != 0 {
                    attributes |= STATX_ATTR_APPEND;
                }
                // `file_attr` carries the birth time (the inode's crtime) as crtime.
                reply.statx(
                    &self.ttl(a.ino),
                    &file_attr(&a),
                    attributes,
                    STATX_ATTR_IMMUTABLE | STATX_ATTR_APPEND,
                );
            }
            Err(e) => reply.error(errno(&e)),
        })
    }

    fn copy_file_range(
        &self,
        _req: &Request,
        ino_in: INodeNo,
        _fh_in: FileHandle,
        offset_in: u64,
        ino_out: INodeNo,
        _fh_out: FileHandle,
        offset_out: u64,
        len: u64,
        flags: fuser::CopyFileRangeFlags,
        reply: ReplyWrite,
    ) {
        self.guard("copy_file_range", move || {
            if !flags.is_empty() {
                return reply.error(Errno::from_i32(libc::EINVAL));
            }
            if let Err(e) = self.refuse_if_read_only() {
                return reply.error(e);
            }
            // The reply carries a 32-bit count; a copy is at most COPY_BYTES_MAX anyway.
            let len = len.min(mako_fs::copy_range::COPY_BYTES_MAX);
            match self
                .fs
                .copy_file_range(ino_in.0, offset_in, ino_out.0, offset_out, len)
            {
                Ok(n) => {
                    self.peers_inode(ino_out.0, offset_out as i64, n as i64);
                    reply.written(n as u32)
                }
                Err(e) => reply.error(errno(&e)),
            }
        })
    }

    fn lseek(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: i64,
        whence: i32,
        reply: ReplyLseek,
    ) {
        self.guard("lseek", move || {
            if offset < 0 {
                return reply.error(Errno::from_i32(libc::ENXIO));
            }
            match self.fs.lseek(ino.0, offset as u64, whence) {
                Ok(o) => reply.offset(o as i64),
                Err(e) => reply.error(errno(&e)),
            }
        })
    }
}

/// A mounted FUSE session.
pub struct FuseMount {
    session: Option<fuser::BackgroundSession>,
    pub mountpoint: PathBuf,
    fs: FileSystem,
    sessions: Arc<Sessions>,
    id: u64,
    lookups: Lookups,
}

impl FuseMount {
    /// True once the FUSE session has ended: the kernel closed the connection (the
    /// file system was unmounted from outside, e.g. by `umount`, or the connection was
    /// aborted) and the request threads have returned. Nothing is served any more.
    pub fn session_ended(&self) -> bool {
        self.session.as_ref().is_none_or(|s| s.guard.is_finished())
    }

    /// Unmount from the kernel and wait for the request threads to finish.
    pub fn unmount(mut self) -> std::io::Result<()> {
        let r = match self.session.take() {
            Some(s) => s.umount_and_join(),
            None => Ok(()),
        };
        self.end();
        r
    }

    /// After the session's end: it no longer gets invalidations, and the references its
    /// kernel held (an unmounting kernel sends no FORGET) go back to the file system.
    fn end(&mut self) {
        self.sessions.remove(self.id);
        let held: Vec<(u64, u64)> = self
            .lookups
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .drain()
            .collect();
        for (ino, n) in held {
            self.fs.forget(ino, n);
        }
    }
}

impl Drop for FuseMount {
    fn drop(&mut self) {
        if let Some(s) = self.session.take() {
            let _ = s.umount_and_join();
            self.end();
        }
    }
}

/// Largest read request the kernel sends (the `max_read` mount option); see `mount`.
pub const MAX_READ_REQUEST: u32 = 1 << 20;

/// The kernel's per-mount flags for these options (`MS_*` of mount(2)).
fn ms_flags(read_only: bool, nosuid: bool, nodev: bool, noexec: bool, atime: AtimePolicy) -> u64 {
    let mut f = 0;
    for (on, flag) in [
        (read_only, libc::MS_RDONLY),
        (nosuid, libc::MS_NOSUID),
        (nodev, libc::MS_NODEV),
        (noexec, libc::MS_NOEXEC),
        (atime == AtimePolicy::Never, libc::MS_NOATIME),
        (atime == AtimePolicy::Relatime, libc::MS_RELATIME),
        (atime == AtimePolicy::Strict, libc::MS_STRICTATIME),
    ] {
        if on {
            f |= flag;
        }
    }
    f
}

/// Changes the options of the mount at `mountpoint` in the kernel (`mount -o remount`):
/// the superblock's read-only flag and the mount's nosuid, nodev, noexec and atime flags.
pub fn remount(
    mountpoint: &Path,
    read_only: bool,
    nosuid: bool,
    nodev: bool,
    noexec: bool,
    atime: AtimePolicy,
) -> std::io::Result<()> {
    let flags = libc::MS_REMOUNT | ms_flags(read_only, nosuid, nodev, noexec, atime);
    sys_mount(mountpoint, flags)
}

fn sys_mount(mountpoint: &Path, flags: u64) -> std::io::Result<()> {
    let path = std::ffi::CString::new(mountpoint.as_os_str().as_bytes())
        .map_err(|_| std::io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: mount(2) with a NUL-terminated path and null source, type and data, as a
    // remount takes them.
    let r = unsafe {
        libc::mount(
            std::ptr::null(),
            path.as_ptr(),
            std::ptr::null(),
            flags,
            std::ptr::null(),
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Mount `fs` at `mountpoint` and serve it from a pool of threads: one more session of
/// `opts.sessions`, which becomes (stays) the file system's kernel invalidator.
pub fn mount(fs: FileSystem, mountpoint: &Path, opts: &FuseOptions) -> std::io::Result<FuseMount> {
    use fuser::MountOption;
    let atime = opts.flags.atime();
    let read_only = opts.flags.read_only();
    let mut config = fuser::Config::default();
    config.mount_options = vec![
        MountOption::FSName(opts.fs_name.clone()),
        MountOption::Subtype("mako".into()),
        MountOption::DefaultPermissions,
        if read_only {
            MountOption::RO
        } else {
            MountOption::RW
        },
        if opts.nodev {
            MountOption::NoDev
        } else {
            MountOption::Dev
        },
        if opts.nosuid {
            MountOption::NoSuid
        } else {
            MountOption::Suid
        },
        if opts.noexec {
            MountOption::NoExec
        } else {
            MountOption::Exec
        },
        if atime == AtimePolicy::Never {
            MountOption::NoAtime
        } else {
            MountOption::Atime
        },
    ];
    // Read requests of at most 1 MiB. The kernel's readahead windows (max_readahead,
    // a whole block) start wherever the reader's first read put them, so 4 MiB requests
    // mostly straddle two blocks, and a reply must be one contiguous buffer: each
    // straddling request cost a 4 MiB copy. 1 MiB requests (on 1 MiB boundaries) lie in
    // one block and go out straight from the pagepool buffer; four requests in flight
    // instead of one also spread the copies over the FUSE threads. Measured on a 2 GiB
    // streaming read: ~2.0 CPU-s instead of ~2.9, 1.0-1.5 GB/s instead of 0.64-0.83.
    config
        .mount_options
        .push(MountOption::CUSTOM(format!("max_read={MAX_READ_REQUEST}")));
    if opts.allow_other {
        config.acl = fuser::SessionACL::All;
    }
    config.n_threads = Some(opts.threads.max(1));
    config.clone_fd = true;
    if opts.io_uring {
        // One queue per CPU, each served by threads/CPUs threads: an entry per thread.
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        config.io_uring_depth = Some(opts.threads.max(1).div_ceil(cpus).clamp(1, 64));
    }
    fs.core
        .invalidator
        .write()
        .replace(opts.sessions.clone() as Arc<dyn KernelInvalidator>);
    let id = opts.sessions.next_id.fetch_add(1, Ordering::Relaxed);
    let lookups: Lookups = Arc::default();
    let names: Arc<NameLog> = Arc::default();
    let session = fuser::spawn_mount(
        MakoFuse::new(fs.clone(), opts, id, lookups.clone(), names.clone()),
        mountpoint,
        &config,
    )?;
    opts.sessions.add(id, session.notifier(), names);
    let mut mount = FuseMount {
        session: Some(session),
        mountpoint: mountpoint.to_path_buf(),
        fs,
        sessions: opts.sessions.clone(),
        id,
        lookups,
    };
    // fuser has no word for strictatime (a new mount is relatime unless told
    // otherwise), so the mount's flags are set once more, all of them, the way
    // `mount -o remount,strictatime` sets them.
    if atime == AtimePolicy::Strict {
        let flags = libc::MS_REMOUNT
            | libc::MS_BIND
            | ms_flags(read_only, opts.nosuid, opts.nodev, opts.noexec, atime);
        if let Err(e) = sys_mount(mountpoint, flags) {
            let _ = mount.session.take().map(|s| s.umount_and_join());
            mount.end();
            return Err(std::io::Error::new(
                e.kind(),
                format!("setting strictatime on {}: {e}", mountpoint.display()),
            ));
        }
    }
    Ok(mount)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Once a directory's names were revoked from this node, its names are handed out
    /// unrecorded (zero timeout), so the next revoke has nothing to invalidate under
    /// the kernel's directory lock; other directories, and renames, are unaffected.
    #[test]
    fn a_directory_whose_names_were_revoked_hands_out_names_uncached() {
        let log = NameLog::default();
        assert!(log.record(7, b"a"));
        assert!(log.record(8, b"b"));
        assert_eq!(log.take(7), vec![b"a".to_vec()]);
        assert!(
            !log.record(7, b"c"),
            "a contended directory's name was recorded"
        );
        assert!(log.take(7).is_empty(), "nothing left to invalidate");
        assert!(log.record(8, b"d"), "another directory became contended");
        log.record_always(7, b"renamed");
        assert_eq!(log.take(7), vec![b"renamed".to_vec()]);
        let mut left = log.take(8);
        left.sort();
        assert_eq!(left, vec![b"b".to_vec(), b"d".to_vec()]);
    }

    /// Times a user may set with utimensat round-trip exactly, the ends of i64 included.
    #[test]
    fn timestamps_round_trip_without_overflow() {
        for (sec, nsec) in [
            (0, 0),
            (-1, 500_000_000),
            (-2, 800_000_000),
            (1_700_000_000, 123),
            (i64::MAX, 999_999_999),
            (i64::MIN, 0),
            (i64::MIN, 999_999_999),
        ] {
            let t = Timestamp { sec, nsec };
            assert_eq!(from_systime(ts(t)), t, "{sec} s {nsec} ns");
        }
    }
}
