//! POSIX conformance checker: a table of named checks that exercise a directory through real
//! system calls and report pass / fail (with expected vs. actual errno) / skip for each.
//!
//! Every check runs in its own fresh subdirectory of the target directory, removed afterwards by a
//! drop guard even when the check fails or panics. Entry point: [`run_posix_suite`].

mod attr;
mod dir;
mod fileattr;
mod io;
mod locks;
mod misc;
mod namespace;
mod perm;
mod setid;
mod xattr;

use crate::sys::{self, Errno, SysResult};
use std::fmt;
use std::panic::Location;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Outcome of one check.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// All assertions held.
    Pass,
    /// An assertion failed; the message says what, where, expected and actual.
    Fail(String),
    /// The check does not apply here (missing feature, not root, ...); the message says why.
    Skip(String),
}

/// Result of one check in a [`Report`].
#[derive(Clone, Debug)]
pub struct CheckReport {
    /// Check name (e.g. `rename_exchange`).
    pub name: &'static str,
    /// Pass, fail or skip.
    pub outcome: Outcome,
    /// Wall-clock time the check took.
    pub duration: Duration,
}

/// Results of a suite run, in execution order.
#[derive(Clone, Debug, Default)]
pub struct Report {
    /// One entry per check that ran.
    pub results: Vec<CheckReport>,
}

impl Report {
    /// Number of passed checks.
    pub fn passed(&self) -> usize {
        self.results
            .iter()
            .filter(|r| r.outcome == Outcome::Pass)
            .count()
    }
    /// Number of failed checks.
    pub fn failed(&self) -> usize {
        self.failures().count()
    }
    /// Number of skipped checks.
    pub fn skipped(&self) -> usize {
        self.results
            .iter()
            .filter(|r| matches!(r.outcome, Outcome::Skip(_)))
            .count()
    }
    /// `true` if no check failed.
    pub fn all_passed(&self) -> bool {
        self.failed() == 0
    }
    /// The failed checks.
    pub fn failures(&self) -> impl Iterator<Item = &CheckReport> {
        self.results
            .iter()
            .filter(|r| matches!(r.outcome, Outcome::Fail(_)))
    }
    /// Outcome of the named check, if it ran.
    pub fn get(&self, name: &str) -> Option<&Outcome> {
        self.results
            .iter()
            .find(|r| r.name == name)
            .map(|r| &r.outcome)
    }
    /// The summary line: `posix: N passed, M failed`.
    pub fn summary(&self) -> String {
        format!("posix: {} passed, {} failed", self.passed(), self.failed())
    }
}

impl fmt::Display for CheckReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ms = self.duration.as_secs_f64() * 1000.0;
        match &self.outcome {
            Outcome::Pass => write!(f, "PASS {} ({ms:.1} ms)", self.name),
            Outcome::Fail(m) => write!(f, "FAIL {}: {m}", self.name),
            Outcome::Skip(m) => write!(f, "SKIP {}: {m}", self.name),
        }
    }
}

impl fmt::Display for Report {
    /// One line per check, then the skip count and the summary line.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for r in &self.results {
            writeln!(f, "{r}")?;
        }
        writeln!(f, "posix: {} skipped", self.skipped())?;
        write!(f, "{}", self.summary())
    }
}

/// Why a check did not pass.
#[derive(Debug)]
pub enum CheckError {
    /// Assertion failure.
    Fail(String),
    /// Not applicable here.
    Skip(String),
}

/// Result type of a check function.
pub type CheckResult = Result<(), CheckError>;

/// A check function.
pub type CheckFn = fn(&Ctx) -> CheckResult;

/// A module's table of named checks.
pub(crate) type CheckTable = &'static [(&'static str, CheckFn)];

/// Context handed to each check.
pub struct Ctx {
    /// The check's private, freshly created directory (absolute).
    pub dir: PathBuf,
}

impl Ctx {
    /// Absolute path of `name` inside the check directory.
    pub fn p(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }
}

/// A named check.
pub struct Check {
    /// Unique name, used by `--filter`.
    pub name: &'static str,
    /// The check body.
    pub func: CheckFn,
}

/// All checks, in execution order.
pub fn checks() -> Vec<Check> {
    let mut v = Vec::new();
    v.extend(
        attr::CHECKS
            .iter()
            .map(|&(name, func)| Check { name, func }),
    );
    v.extend(
        namespace::CHECKS
            .iter()
            .map(|&(name, func)| Check { name, func }),
    );
    v.extend(io::CHECKS.iter().map(|&(name, func)| Check { name, func }));
    v.extend(dir::CHECKS.iter().map(|&(name, func)| Check { name, func }));
    v.extend(
        xattr::CHECKS
            .iter()
            .map(|&(name, func)| Check { name, func }),
    );
    v.extend(
        locks::CHECKS
            .iter()
            .map(|&(name, func)| Check { name, func }),
    );
    v.extend(
        perm::CHECKS
            .iter()
            .map(|&(name, func)| Check { name, func }),
    );
    v.extend(
        fileattr::CHECKS
            .iter()
            .map(|&(name, func)| Check { name, func }),
    );
    v.extend(
        setid::CHECKS
            .iter()
            .map(|&(name, func)| Check { name, func }),
    );
    v.extend(
        misc::CHECKS
            .iter()
            .map(|&(name, func)| Check { name, func }),
    );
    v
}

/// Names of all checks whose name contains `filter` (all if `None`).
pub fn check_names(filter: Option<&str>) -> Vec<&'static str> {
    checks()
        .into_iter()
        .filter(|c| filter.is_none_or(|f| c.name.contains(f)))
        .map(|c| c.name)
        .collect()
}

/// Removes a check directory on drop (recursively, restoring permissions as needed).
struct DirGuard {
    path: PathBuf,
    error: Option<String>,
}

impl DirGuard {
    fn cleanup(&mut self) -> Result<(), String> {
        if !self.path.exists() {
            return Ok(());
        }
        make_removable(&self.path);
        std::fs::remove_dir_all(&self.path)
            .map_err(|e| format!("cannot remove check directory {}: {e}", self.path.display()))
    }
}

impl Drop for DirGuard {
    fn drop(&mut self) {
        if let Err(e) = self.cleanup() {
            self.error = Some(e);
        }
    }
}

/// Gives the owner rwx on every directory below `p` and drops immutable-ish obstacles that would
/// stop `remove_dir_all` when not running as root, and the immutable and append-only attributes
/// a failed check may have left (root only can clear those).
fn make_removable(p: &Path) {
    if let Ok(st) = sys::lstat(p) {
        let kind = st.st_mode & libc::S_IFMT;
        if kind == libc::S_IFREG || kind == libc::S_IFDIR {
            let sticky = fileattr::FS_IMMUTABLE_FL | fileattr::FS_APPEND_FL;
            if let Ok(f) = fileattr::get_flags(p) {
                if f & sticky != 0 {
                    let _ = fileattr::set_flags(p, f & !sticky);
                }
            }
        }
        if kind == libc::S_IFDIR {
            let _ = sys::chmod(p, 0o700);
            if let Ok(rd) = std::fs::read_dir(p) {
                for e in rd.flatten() {
                    make_removable(&e.path());
                }
            }
        }
    }
}

static SEQ: AtomicU64 = AtomicU64::new(0);

/// Runs one check in a fresh subdirectory of `dir`.
pub fn run_check(dir: &Path, check: &Check) -> CheckReport {
    let start = Instant::now();
    let seq = SEQ.fetch_add(1, Ordering::Relaxed);
    let sub = dir.join(format!("mp.{}.{}.{}", std::process::id(), seq, check.name));
    let outcome = match sys::mkdir(&sub, 0o755) {
        Err(e) => Outcome::Fail(format!(
            "cannot create check directory {}: {e}",
            sub.display()
        )),
        Ok(()) => {
            // Make the mode independent of the umask (perm checks rely on it).
            let _ = sys::chmod(&sub, 0o755);
            let mut guard = DirGuard {
                path: sub.clone(),
                error: None,
            };
            let ctx = Ctx { dir: sub.clone() };
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| (check.func)(&ctx)));
            let outcome = match r {
                Ok(Ok(())) => Outcome::Pass,
                Ok(Err(CheckError::Fail(m))) => Outcome::Fail(m),
                Ok(Err(CheckError::Skip(m))) => Outcome::Skip(m),
                Err(p) => {
                    let msg = p
                        .downcast_ref::<String>()
                        .cloned()
                        .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                        .unwrap_or_else(|| "unknown panic".into());
                    Outcome::Fail(format!("check panicked: {msg}"))
                }
            };
            let cleanup = guard.cleanup();
            guard.error = None;
            match (outcome, cleanup) {
                (Outcome::Fail(m), _) => Outcome::Fail(m),
                (_, Err(e)) => Outcome::Fail(format!("cleanup failed: {e}")),
                (o, Ok(())) => o,
            }
        }
    };
    CheckReport {
        name: check.name,
        outcome,
        duration: start.elapsed(),
    }
}

/// Runs every check whose name contains `filter` (all if `None`) against `dir` (created if
/// missing; must be writable). Each check runs in its own subdirectory that is removed afterwards.
pub fn run_posix_suite(dir: impl AsRef<Path>, filter: Option<&str>) -> Report {
    run_posix_suite_with(dir.as_ref(), filter, |_| {})
}

/// For the tests on a mount: creates `mount/posix`, runs the whole suite there, prints the
/// report, and fails the test unless the full check table ran (60 checks or more) with no
/// failure. `on` says where ("on Mako", "over io_uring") and `logs` what to show with a
/// failure (the makod.log tails). Returns the report for further checks.
pub fn assert_posix_suite_passes(mount: &Path, on: &str, logs: impl FnOnce() -> String) -> Report {
    let dir = mount.join("posix");
    std::fs::create_dir(&dir).unwrap_or_else(|e| panic!("mkdir {}: {e}", dir.display()));
    let report = run_posix_suite(&dir, None);
    println!("{report}");
    let failures: Vec<String> = report.failures().map(|r| r.to_string()).collect();
    assert!(
        report.results.len() >= 60,
        "expected the full check table, ran {}",
        report.results.len()
    );
    assert!(
        failures.is_empty(),
        "POSIX checks failed {on} ({}):\n{}\n\nmakod.log tail:\n{}",
        report.summary(),
        failures.join("\n"),
        logs()
    );
    report
}

/// Like [`run_posix_suite`], calling `progress` after each check (the binary prints from it).
pub fn run_posix_suite_with(
    dir: &Path,
    filter: Option<&str>,
    mut progress: impl FnMut(&CheckReport),
) -> Report {
    // Convenience for callers passing e.g. `mount.join("posix")`: create it if missing.
    let _ = std::fs::create_dir_all(dir);
    let dir = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
    let mut report = Report::default();
    for c in checks()
        .iter()
        .filter(|c| filter.is_none_or(|f| c.name.contains(f)))
    {
        let r = run_check(&dir, c);
        progress(&r);
        report.results.push(r);
    }
    report
}

// ---------------------------------------------------------------------------------------------
// Assertion helpers used by the checks. All carry the caller's source location.

pub(crate) fn loc(l: &Location<'_>) -> String {
    format!("{}:{}", l.file().rsplit('/').next().unwrap_or(""), l.line())
}

/// Fails with a message.
#[track_caller]
pub(crate) fn fail<T>(msg: impl fmt::Display) -> Result<T, CheckError> {
    Err(CheckError::Fail(format!(
        "{msg} [{}]",
        loc(Location::caller())
    )))
}

/// Skips with a reason.
pub(crate) fn skip<T>(msg: impl fmt::Display) -> Result<T, CheckError> {
    Err(CheckError::Skip(msg.to_string()))
}

/// Fails unless `cond`.
#[track_caller]
pub(crate) fn ensure(cond: bool, what: impl fmt::Display) -> CheckResult {
    if cond {
        Ok(())
    } else {
        Err(CheckError::Fail(format!(
            "{what} [{}]",
            loc(Location::caller())
        )))
    }
}

/// Fails unless `actual == expected`.
#[track_caller]
pub(crate) fn check_eq<T: PartialEq + fmt::Debug>(
    actual: T,
    expected: T,
    what: impl fmt::Display,
) -> CheckResult {
    if actual == expected {
        Ok(())
    } else {
        Err(CheckError::Fail(format!(
            "{what}: expected {expected:?}, got {actual:?} [{}]",
            loc(Location::caller())
        )))
    }
}

/// Fails unless `actual == expected`, printing octal modes.
#[track_caller]
pub(crate) fn check_mode(
    actual: libc::mode_t,
    expected: libc::mode_t,
    what: impl fmt::Display,
) -> CheckResult {
    if actual == expected {
        Ok(())
    } else {
        Err(CheckError::Fail(format!(
            "{what}: expected mode {expected:o}, got {actual:o} [{}]",
            loc(Location::caller())
        )))
    }
}

/// Fails unless `r` is an error with one of `expected` errnos.
#[track_caller]
pub(crate) fn expect_errno<T: fmt::Debug>(
    r: SysResult<T>,
    expected: &[i32],
    what: impl fmt::Display,
) -> CheckResult {
    let exp: Vec<&str> = expected.iter().map(|&e| sys::errno_name(e)).collect();
    match r {
        Err(e) if expected.contains(&e.0) => Ok(()),
        Err(e) => Err(CheckError::Fail(format!(
            "{what}: expected errno {}, got {e} [{}]",
            exp.join(" or "),
            loc(Location::caller())
        ))),
        Ok(v) => Err(CheckError::Fail(format!(
            "{what}: expected errno {}, got success ({v:?}) [{}]",
            exp.join(" or "),
            loc(Location::caller())
        ))),
    }
}

/// Converts a syscall result into a check result with context.
pub(crate) trait Ctxt<T> {
    /// Fails with "`what`: unexpected error E" on error.
    fn ctx(self, what: impl fmt::Display) -> Result<T, CheckError>;
}

impl<T> Ctxt<T> for SysResult<T> {
    #[track_caller]
    fn ctx(self, what: impl fmt::Display) -> Result<T, CheckError> {
        match self {
            Ok(v) => Ok(v),
            Err(e) => Err(CheckError::Fail(format!(
                "{what}: expected success, got {e} [{}]",
                loc(Location::caller())
            ))),
        }
    }
}

impl<T> Ctxt<T> for Result<T, String> {
    #[track_caller]
    fn ctx(self, what: impl fmt::Display) -> Result<T, CheckError> {
        self.map_err(|e| CheckError::Fail(format!("{what}: {e} [{}]", loc(Location::caller()))))
    }
}

/// Runs `f` in a forked child (as `cred` if given) and returns its result as a [`SysResult`]
/// (child exit 0 = success, otherwise the exit code is the errno).
#[track_caller]
pub(crate) fn in_child(
    cred: Option<&sys::Cred>,
    f: impl FnOnce() -> i32,
) -> Result<SysResult<()>, CheckError> {
    let l = Location::caller();
    match sys::fork_as(cred, f) {
        Ok(0) => Ok(Ok(())),
        Ok(sys::CHILD_SETUP_FAILED) => Err(CheckError::Fail(format!(
            "child could not switch to credentials {cred:?} [{}]",
            loc(l)
        ))),
        Ok(sys::CHILD_PANICKED) => Err(CheckError::Fail(format!("child panicked [{}]", loc(l)))),
        Ok(code) => Ok(Err(Errno(code))),
        Err(e) => Err(CheckError::Fail(format!("{e} [{}]", loc(l)))),
    }
}

/// Skips unless running as root.
pub(crate) fn need_root(what: &str) -> CheckResult {
    if sys::is_root() {
        Ok(())
    } else {
        skip(format!("{what} requires root"))
    }
}

/// Skips when `r` says the feature is unsupported (EOPNOTSUPP/ENOTSUP/ENOSYS), else returns it.
pub(crate) fn unsupported_skip<T>(r: SysResult<T>, what: &str) -> Result<SysResult<T>, CheckError> {
    match r {
        Err(e) if e.0 == libc::EOPNOTSUPP || e.0 == libc::ENOSYS => {
            skip(format!("{what} not supported here ({e})"))
        }
        other => Ok(other),
    }
}

/// Mode type bits of a stat.
pub(crate) fn ftype(st: &libc::stat) -> libc::mode_t {
    st.st_mode & libc::S_IFMT
}

/// Permission bits (incl. suid/sgid/sticky) of a stat.
pub(crate) fn perms(st: &libc::stat) -> libc::mode_t {
    st.st_mode & 0o7777
}

/// Two unprivileged test identities and some groups (no passwd entries needed).
pub(crate) const UID_A: libc::uid_t = 10001;
pub(crate) const UID_B: libc::uid_t = 10002;
pub(crate) const GID_A: libc::gid_t = 20001;
pub(crate) const GID_B: libc::gid_t = 20002;
pub(crate) const GID_SHARED: libc::gid_t = 20003;

/// Identity `uid`/`gid`/`groups` whose child starts in the check directory.
pub(crate) fn cred(
    c: &Ctx,
    uid: libc::uid_t,
    gid: libc::gid_t,
    groups: &[libc::gid_t],
) -> sys::Cred {
    sys::Cred {
        uid,
        gid,
        groups: groups.to_vec(),
        cwd: Some(c.dir.clone()),
        caps: Vec::new(),
    }
}

pub(crate) fn cred_a(c: &Ctx) -> sys::Cred {
    cred(c, UID_A, GID_A, &[])
}

pub(crate) fn cred_b(c: &Ctx) -> sys::Cred {
    cred(c, UID_B, GID_B, &[])
}

/// `p` relative to the check directory, as a C string for use in a child started there.
pub(crate) fn relc(c: &Ctx, p: &Path) -> std::ffi::CString {
    sys::cstr(p.strip_prefix(&c.dir).unwrap_or(p))
}

/// Deterministic test data.
pub(crate) fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| {
            (i as u32)
                .wrapping_mul(31)
                .wrapping_add(seed as u32 * 7 + 1) as u8
                | 1
        })
        .collect()
}

/// The process umask, read from /proc/self/status (does not change it; 022 if unavailable).
pub(crate) fn current_umask() -> libc::mode_t {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Umask:"))
                .and_then(|v| libc::mode_t::from_str_radix(v.trim(), 8).ok())
        })
        .unwrap_or(0o022)
}

/// Waits until the coarse realtime clock has moved at least 20 ms past `t` (so a subsequent ctime
/// update is observable even on coarse-granularity clocks). Deterministic: waits for the clock.
pub(crate) fn wait_past(t: i128) {
    loop {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        unsafe { libc::clock_gettime(libc::CLOCK_REALTIME_COARSE, &mut ts) };
        if sys::ts_ns(ts.tv_sec, ts.tv_nsec) > t + 20_000_000 {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}
