//! fsx-style randomized, model-based file exerciser: applies a seeded random sequence of writes,
//! reads, truncates, hole punches, zero ranges, fallocates, mmap reads/writes, syncs, reopens and
//! (optionally) remounts to test files, mirroring every change in an in-memory model and
//! checking every read, the file size after every operation, and the whole file periodically.
//!
//! With [`FsxOptions::mounts`] the same directory is reached through several mount points
//! (several nodes of one cluster file system): every operation goes to a random one, and
//! the size is checked through every mount after each operation, so a read or `stat` on
//! one mount after a change completed on another must see that change. The namespace
//! operations (create, unlink, rename, link, mkdir, rmdir, lookup, list: weight 0 unless
//! asked for, see [`OpWeights::cluster`]) work on a few names in `fsx.<seed>.ns/` against a
//! model of the names, their inode numbers and link counts.
//!
//! Entry point: [`run_fsx`]. A failure ([`FsxFailure`]) names the seed, the operation number, the
//! first differing offset with expected vs. actual bytes, the last operations, and the command
//! line that reproduces it.

mod rng;

pub use rng::Rng;

use crate::sys::{self, Errno, Fd, Mmap};
use std::collections::VecDeque;
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Kinds of operations.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum OpKind {
    /// `pwrite` of random data at a random offset (possibly beyond EOF, creating a hole).
    Write,
    /// `pread` compared byte-for-byte with the model.
    Read,
    /// `ftruncate` up or down.
    Truncate,
    /// `fallocate(PUNCH_HOLE | KEEP_SIZE)`.
    PunchHole,
    /// `fallocate(ZERO_RANGE [| KEEP_SIZE])`.
    ZeroRange,
    /// `fallocate(0 | KEEP_SIZE)`.
    Fallocate,
    /// Read through a shared read-only mapping.
    MmapRead,
    /// Write through a `MAP_SHARED` mapping, then `msync`.
    MmapWrite,
    /// `fsync`.
    Fsync,
    /// `fdatasync`.
    Fdatasync,
    /// Close and reopen the file.
    CloseReopen,
    /// Read the whole file and compare with the model.
    Verify,
    /// Close everything, run the remount hook, reopen, verify.
    Remount,
    /// `pwrite` of one 47,008-byte record at a record boundary (ior-hard's record).
    RecordWrite,
    /// `fstat` through every mount: sizes as the model says, the same mtime everywhere.
    Stat,
    /// `open(O_CREAT | O_EXCL)` of a name in the namespace directory.
    Create,
    /// `unlink` of a name.
    Unlink,
    /// `rename` of a name over another (or itself).
    Rename,
    /// `link` of a name to another.
    Link,
    /// `mkdir` of a name.
    Mkdir,
    /// `rmdir` of a name.
    Rmdir,
    /// `lstat` of a name: kind, inode number and link count as the model says.
    Lookup,
    /// `readdir` of the namespace directory: exactly the model's names.
    List,
}

impl OpKind {
    /// All kinds, in a fixed order.
    pub const ALL: [OpKind; OpKind::COUNT] = [
        OpKind::Write,
        OpKind::Read,
        OpKind::Truncate,
        OpKind::PunchHole,
        OpKind::ZeroRange,
        OpKind::Fallocate,
        OpKind::MmapRead,
        OpKind::MmapWrite,
        OpKind::Fsync,
        OpKind::Fdatasync,
        OpKind::CloseReopen,
        OpKind::Verify,
        OpKind::Remount,
        OpKind::RecordWrite,
        OpKind::Stat,
        OpKind::Create,
        OpKind::Unlink,
        OpKind::Rename,
        OpKind::Link,
        OpKind::Mkdir,
        OpKind::Rmdir,
        OpKind::Lookup,
        OpKind::List,
    ];
    /// How many kinds there are.
    pub const COUNT: usize = 23;

    /// Lower-case name (`punch_hole`), as used by `--weights`.
    pub fn name(self) -> &'static str {
        match self {
            OpKind::Write => "write",
            OpKind::Read => "read",
            OpKind::Truncate => "truncate",
            OpKind::PunchHole => "punch_hole",
            OpKind::ZeroRange => "zero_range",
            OpKind::Fallocate => "fallocate",
            OpKind::MmapRead => "mmap_read",
            OpKind::MmapWrite => "mmap_write",
            OpKind::Fsync => "fsync",
            OpKind::Fdatasync => "fdatasync",
            OpKind::CloseReopen => "close_reopen",
            OpKind::Verify => "verify",
            OpKind::Remount => "remount",
            OpKind::RecordWrite => "record_write",
            OpKind::Stat => "stat",
            OpKind::Create => "create",
            OpKind::Unlink => "unlink",
            OpKind::Rename => "rename",
            OpKind::Link => "link",
            OpKind::Mkdir => "mkdir",
            OpKind::Rmdir => "rmdir",
            OpKind::Lookup => "lookup",
            OpKind::List => "list",
        }
    }

    fn idx(self) -> usize {
        OpKind::ALL.iter().position(|&k| k == self).unwrap()
    }
}

/// Relative weights of the randomly chosen operations (0 disables one). Remounts are not drawn
/// at random: they happen every [`FsxOptions::remount_every`] operations.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OpWeights {
    /// Weight per [`OpKind`] (indexed like [`OpKind::ALL`]).
    pub w: [u32; OpKind::COUNT],
}

impl Default for OpWeights {
    fn default() -> Self {
        let mut w = [0u32; OpKind::COUNT];
        for (k, v) in [
            (OpKind::Write, 20),
            (OpKind::Read, 20),
            (OpKind::Truncate, 5),
            (OpKind::PunchHole, 4),
            (OpKind::ZeroRange, 4),
            (OpKind::Fallocate, 4),
            (OpKind::MmapRead, 8),
            (OpKind::MmapWrite, 8),
            (OpKind::Fsync, 1),
            (OpKind::Fdatasync, 1),
            (OpKind::CloseReopen, 2),
            (OpKind::Verify, 0),
        ] {
            w[k.idx()] = v;
        }
        OpWeights { w }
    }
}

impl OpWeights {
    /// Weight of one kind.
    pub fn get(&self, k: OpKind) -> u32 {
        self.w[k.idx()]
    }
    /// Sets the weight of one kind.
    pub fn set(&mut self, k: OpKind, v: u32) {
        self.w[k.idx()] = v;
    }
    /// The defaults plus records, `stat` and the namespace operations: for several mounts
    /// of one cluster file system.
    pub fn cluster() -> OpWeights {
        let mut w = OpWeights::default();
        for (k, v) in [
            (OpKind::RecordWrite, 6),
            (OpKind::Stat, 4),
            (OpKind::Create, 4),
            (OpKind::Unlink, 3),
            (OpKind::Rename, 4),
            (OpKind::Link, 2),
            (OpKind::Mkdir, 2),
            (OpKind::Rmdir, 2),
            (OpKind::Lookup, 6),
            (OpKind::List, 3),
        ] {
            w.set(k, v);
        }
        w
    }

    /// Parses `write=20,read=10,...` on top of the defaults.
    pub fn parse(spec: &str) -> Result<OpWeights, String> {
        OpWeights::parse_on(OpWeights::default(), spec)
    }

    /// Parses `write=20,read=10,...` on top of `base`.
    pub fn parse_on(base: OpWeights, spec: &str) -> Result<OpWeights, String> {
        let mut w = base;
        for part in spec.split(',').filter(|s| !s.is_empty()) {
            let (k, v) = part
                .split_once('=')
                .ok_or_else(|| format!("bad weight {part:?}, expected name=N"))?;
            let kind = OpKind::ALL
                .iter()
                .copied()
                .find(|o| o.name() == k.trim())
                .ok_or_else(|| format!("unknown op {k:?}"))?;
            w.set(
                kind,
                v.trim()
                    .parse()
                    .map_err(|e| format!("bad weight {v:?}: {e}"))?,
            );
        }
        Ok(w)
    }
}

/// Remount hook: must leave the file system mounted at the same place with the files intact.
pub type RemountFn = Box<dyn FnMut() -> anyhow::Result<()>>;

/// Options of an fsx run. Build with [`FsxOptions::new`] and adjust fields.
pub struct FsxOptions {
    /// Directory the test files are created in.
    pub dir: PathBuf,
    /// The same directory as `dir` reached through other mount points (other nodes of a
    /// cluster file system); every operation goes to a random one of `dir` and these.
    pub mounts: Vec<PathBuf>,
    /// RNG seed; the same seed on the same file system replays the same operations.
    pub seed: u64,
    /// Number of operations.
    pub ops: u64,
    /// Maximum file size in bytes (default 16 MiB).
    pub max_size: u64,
    /// Maximum length of one read/write/fallocate (default 256 KiB).
    pub max_op_len: u64,
    /// Number of test files (default 1); each op picks one at random.
    pub files: usize,
    /// Remount hook (library form of `--remount-cmd`).
    pub remount: Option<RemountFn>,
    /// Human-readable remount command for the reproduction line (set by the binary).
    pub remount_cmd: Option<String>,
    /// Remount every this many operations when a hook is given (default 10,000).
    pub remount_every: u64,
    /// Use mmap reads/writes (default true).
    pub mmap: bool,
    /// Use fallocate / punch hole / zero range (default true).
    pub fallocate: bool,
    /// How many recent operations to print on failure (default 32).
    pub log_last: usize,
    /// Full-file verify every this many operations (default 1,000; 0 = only at the end).
    pub verify_every: u64,
    /// Operation weights.
    pub weights: OpWeights,
    /// Keep the test file(s) and write `<file>.fsxgood` model copies on failure (default true).
    pub keep_on_failure: bool,
    /// Print warnings and progress to stderr (default false).
    pub verbose: bool,
    /// Testing aid: at the first write at or after this op number, write one extra byte behind
    /// the model's back, so the run must fail.
    #[doc(hidden)]
    pub inject_bug: Option<u64>,
}

impl fmt::Debug for FsxOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FsxOptions")
            .field("dir", &self.dir)
            .field("mounts", &self.mounts)
            .field("seed", &self.seed)
            .field("ops", &self.ops)
            .field("max_size", &self.max_size)
            .field("max_op_len", &self.max_op_len)
            .field("files", &self.files)
            .field("remount", &self.remount.as_ref().map(|_| "<hook>"))
            .field("remount_every", &self.remount_every)
            .field("mmap", &self.mmap)
            .field("fallocate", &self.fallocate)
            .field("verify_every", &self.verify_every)
            .finish_non_exhaustive()
    }
}

impl FsxOptions {
    /// Defaults for `dir`, `seed` and `ops`.
    pub fn new(dir: impl Into<PathBuf>, seed: u64, ops: u64) -> FsxOptions {
        FsxOptions {
            dir: dir.into(),
            mounts: Vec::new(),
            seed,
            ops,
            max_size: 16 << 20,
            max_op_len: 256 << 10,
            files: 1,
            remount: None,
            remount_cmd: None,
            remount_every: 10_000,
            mmap: true,
            fallocate: true,
            log_last: 32,
            verify_every: 1_000,
            weights: OpWeights::default(),
            keep_on_failure: true,
            verbose: false,
            inject_bug: None,
        }
    }

    /// The `mako-fsx` command line that reproduces this run.
    pub fn repro_command(&self) -> String {
        let d = FsxOptions::new(&self.dir, 0, 0);
        let mut s = format!(
            "mako-fsx {} --seed {} --ops {}",
            shell_quote(&self.dir.to_string_lossy()),
            self.seed,
            self.ops
        );
        for m in &self.mounts {
            s += &format!(" --other-mount {}", shell_quote(&m.to_string_lossy()));
        }
        if self.max_size != d.max_size {
            s += &format!(" --max-size {}", self.max_size);
        }
        if self.max_op_len != d.max_op_len {
            s += &format!(" --max-op-len {}", self.max_op_len);
        }
        if self.files != d.files {
            s += &format!(" --files {}", self.files);
        }
        if let Some(c) = &self.remount_cmd {
            s += &format!(" --remount-cmd {}", shell_quote(c));
        } else if self.remount.is_some() {
            s += " --remount-cmd '<the remount hook>'";
        }
        if self.remount.is_some() && self.remount_every != d.remount_every {
            s += &format!(" --remount-every {}", self.remount_every);
        }
        if !self.mmap {
            s += " --no-mmap";
        }
        if !self.fallocate {
            s += " --no-fallocate";
        }
        if self.verify_every != d.verify_every {
            s += &format!(" --verify-every {}", self.verify_every);
        }
        if self.weights != d.weights {
            let w: Vec<String> = OpKind::ALL
                .iter()
                .filter(|k| self.weights.get(**k) != d.weights.get(**k))
                .map(|k| format!("{}={}", k.name(), self.weights.get(*k)))
                .collect();
            s += &format!(" --weights {}", w.join(","));
        }
        if let Some(n) = self.inject_bug {
            s += &format!(" --inject-bug {n}");
        }
        s
    }
}

fn shell_quote(s: &str) -> String {
    if !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "/._-=,:".contains(c))
    {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', "'\\''"))
    }
}

/// Statistics of a successful run.
#[derive(Clone, Debug)]
pub struct FsxStats {
    /// Seed used.
    pub seed: u64,
    /// Operations performed.
    pub ops: u64,
    /// Wall-clock duration.
    pub elapsed: Duration,
    /// Count per operation kind (indexed like [`OpKind::ALL`]); no-ops (e.g. mmap of an empty
    /// file) are counted too.
    pub op_counts: [u64; OpKind::COUNT],
    /// Wall-clock time spent per operation kind (the operation and the size check after it),
    /// to see where a slow run spends its time.
    pub op_time: [Duration; OpKind::COUNT],
    /// Wall-clock time spent in periodic and final full-file verifies.
    pub verify_time: Duration,
    /// Operation kinds disabled because the file system does not support them, with the reason.
    pub disabled: Vec<(OpKind, String)>,
    /// How many times an unsupported error (EOPNOTSUPP/ENOSYS/ENODEV) was returned.
    pub unsupported_errors: u64,
    /// Full-file verifications done.
    pub verifies: u64,
    /// Remounts done.
    pub remounts: u64,
    /// Final size of each file.
    pub final_sizes: Vec<u64>,
}

impl FsxStats {
    /// Operations per second.
    pub fn ops_per_sec(&self) -> f64 {
        self.ops as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
    /// `fsx: seed 7: 100000 ops ok (12345 ops/s)`.
    pub fn summary(&self) -> String {
        format!(
            "fsx: seed {}: {} ops ok ({:.0} ops/s)",
            self.seed,
            self.ops,
            self.ops_per_sec()
        )
    }
}

impl fmt::Display for FsxStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let counts: Vec<String> = OpKind::ALL
            .iter()
            .filter(|k| self.op_counts[k.idx()] > 0)
            .map(|k| format!("{}={}", k.name(), self.op_counts[k.idx()]))
            .collect();
        writeln!(f, "fsx: ops by kind: {}", counts.join(" "))?;
        let times: Vec<String> = OpKind::ALL
            .iter()
            .filter(|k| self.op_counts[k.idx()] > 0)
            .map(|k| format!("{}={:.1}s", k.name(), self.op_time[k.idx()].as_secs_f64()))
            .collect();
        writeln!(
            f,
            "fsx: time by kind: {} verify={:.1}s",
            times.join(" "),
            self.verify_time.as_secs_f64()
        )?;
        writeln!(
            f,
            "fsx: {} full verifies, {} remounts, final sizes {:?}",
            self.verifies, self.remounts, self.final_sizes
        )?;
        for (k, why) in &self.disabled {
            writeln!(f, "fsx: disabled {} (unsupported: {why})", k.name())?;
        }
        if !self.disabled.is_empty() {
            writeln!(
                f,
                "fsx: {} unsupported-operation errors",
                self.unsupported_errors
            )?;
        }
        write!(f, "{}", self.summary())
    }
}

/// A detected divergence or unexpected error.
#[derive(Clone, Debug)]
pub struct FsxFailure {
    /// Seed of the run.
    pub seed: u64,
    /// Number (1-based) of the operation that detected the problem (0 = setup).
    pub op: u64,
    /// That operation, e.g. `read 0x1000 thru 0x1fff (0x1000 bytes)`.
    pub op_desc: String,
    /// File being operated on.
    pub file: PathBuf,
    /// First differing file offset, for data mismatches.
    pub offset: Option<u64>,
    /// What went wrong (expected vs. actual).
    pub message: String,
    /// The last operations (oldest first).
    pub recent_ops: Vec<String>,
    /// Command line that reproduces the run.
    pub repro: String,
    /// Offset written behind the model's back by `inject_bug`, if any.
    #[doc(hidden)]
    pub injected_offset: Option<u64>,
}

impl fmt::Display for FsxFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "fsx: FAILURE at op #{} (seed {}): {}",
            self.op, self.seed, self.op_desc
        )?;
        writeln!(f, "fsx: file {}", self.file.display())?;
        if let Some(o) = self.offset {
            writeln!(f, "fsx: first bad offset {o} ({o:#x})")?;
        }
        writeln!(f, "fsx: {}", self.message)?;
        writeln!(
            f,
            "fsx: last {} operations (oldest first):",
            self.recent_ops.len()
        )?;
        for l in &self.recent_ops {
            writeln!(f, "  {l}")?;
        }
        write!(f, "fsx: reproduce with: {}", self.repro)
    }
}

impl std::error::Error for FsxFailure {}

#[derive(Clone, Copy)]
struct LogEntry {
    n: u64,
    kind: OpKind,
    file: usize,
    /// The mount the operation went to (0: `dir`).
    mount: usize,
    /// The names a namespace operation used (from, to).
    names: Option<(u8, u8)>,
    off: u64,
    len: u64,
    size_before: u64,
    size_after: u64,
    note: &'static str,
}

impl LogEntry {
    fn describe(&self) -> String {
        let range = if self.len > 0 {
            format!(
                " {:#x} thru {:#x} ({:#x} bytes)",
                self.off,
                self.off + self.len - 1,
                self.len
            )
        } else {
            String::new()
        };
        let file = format!("[f{} @m{}] ", self.file, self.mount);
        let range = match self.names {
            Some((a, b)) if a != b || matches!(self.kind, OpKind::Rename | OpKind::Link) => {
                format!(" n{a} -> n{b}")
            }
            Some((a, _)) => format!(" n{a}"),
            None => range,
        };
        format!(
            "#{} {file}{}{range} size {:#x} -> {:#x}{}{}",
            self.n,
            self.kind.name(),
            self.size_before,
            self.size_after,
            if self.note.is_empty() { "" } else { " " },
            self.note
        )
    }
    fn covers(&self, off: u64) -> bool {
        self.len > 0 && off >= self.off && off < self.off + self.len
    }
}

struct TestFile {
    /// The file's path through each mount.
    paths: Vec<PathBuf>,
    /// An open descriptor through each mount.
    fds: Vec<Option<Fd>>,
    model: Vec<u8>,
    /// The newest mtime seen (ns): mtimes never go back.
    mtime: i128,
}

/// What a name in the namespace directory is, in the model.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Slot {
    Empty,
    /// A file: index into `Names::files`.
    File(usize),
    /// An (always empty) directory.
    Dir,
}

/// A file of the namespace model: its inode number (from `fstat` at create) and links.
#[derive(Clone, Copy, Debug)]
struct NameFile {
    ino: u64,
    nlink: u64,
}

/// The namespace model: a few names in one directory.
struct Names {
    /// The directory through each mount.
    dirs: Vec<PathBuf>,
    slots: Vec<Slot>,
    files: Vec<NameFile>,
}

/// How many names the namespace operations use: few, so they collide often.
const NAME_SLOTS: usize = 6;
/// ior-hard's record size.
const RECORD_BYTES: u64 = 47_008;

struct Runner<'a> {
    o: &'a mut FsxOptions,
    rng: Rng,
    files: Vec<TestFile>,
    log: VecDeque<LogEntry>,
    enabled: [bool; OpKind::COUNT],
    stats: FsxStats,
    buf: Vec<u8>,
    page: u64,
    injected: Option<u64>,
    cur: LogEntry,
    names: Names,
}

type R<T> = Result<T, Box<FsxFailure>>;

/// Runs fsx with `opts`. Creates `opts.files` files named `fsx.<seed>.<i>` in `opts.dir` and
/// removes them on success (on failure they are kept, next to `<file>.fsxgood` model copies,
/// unless `keep_on_failure` is false). Takes `&mut` because the remount hook is `FnMut`.
#[allow(clippy::result_large_err)] // the error is the cold path; keep it a plain struct for callers
pub fn run_fsx(opts: &mut FsxOptions) -> Result<FsxStats, FsxFailure> {
    let start = Instant::now();
    let mut enabled = [false; OpKind::COUNT];
    for k in OpKind::ALL {
        enabled[k.idx()] = opts.weights.get(k) > 0;
    }
    if !opts.mmap {
        enabled[OpKind::MmapRead.idx()] = false;
        enabled[OpKind::MmapWrite.idx()] = false;
    }
    if !opts.fallocate {
        for k in [OpKind::PunchHole, OpKind::ZeroRange, OpKind::Fallocate] {
            enabled[k.idx()] = false;
        }
    }
    let views: Vec<PathBuf> = std::iter::once(opts.dir.clone())
        .chain(opts.mounts.iter().cloned())
        .collect();
    let files = (0..opts.files.max(1))
        .map(|i| TestFile {
            paths: views
                .iter()
                .map(|d| d.join(format!("fsx.{}.{i}", opts.seed)))
                .collect(),
            fds: views.iter().map(|_| None).collect(),
            model: Vec::new(),
            mtime: i128::MIN,
        })
        .collect();
    let names = Names {
        dirs: views
            .iter()
            .map(|d| d.join(format!("fsx.{}.ns", opts.seed)))
            .collect(),
        slots: vec![Slot::Empty; NAME_SLOTS],
        files: Vec::new(),
    };
    let max_op_len = opts.max_op_len.clamp(1, opts.max_size.max(1)) as usize;
    let mut r = Runner {
        rng: Rng::new(opts.seed),
        files,
        log: VecDeque::with_capacity(opts.log_last + 1),
        enabled,
        stats: FsxStats {
            seed: opts.seed,
            ops: 0,
            elapsed: Duration::ZERO,
            op_counts: [0; OpKind::COUNT],
            op_time: [Duration::ZERO; OpKind::COUNT],
            verify_time: Duration::ZERO,
            disabled: Vec::new(),
            unsupported_errors: 0,
            verifies: 0,
            remounts: 0,
            final_sizes: Vec::new(),
        },
        buf: vec![0u8; max_op_len.max(1 << 20)],
        page: sys::page_size() as u64,
        injected: None,
        names,
        cur: LogEntry {
            n: 0,
            kind: OpKind::Verify,
            file: 0,
            mount: 0,
            names: None,
            off: 0,
            len: 0,
            size_before: 0,
            size_after: 0,
            note: "",
        },
        o: opts,
    };
    if r.o.verbose {
        eprintln!(
            "fsx: seed {}: {} ops in {} (reproduce: {})",
            r.o.seed,
            r.o.ops,
            r.o.dir.display(),
            r.o.repro_command()
        );
    }
    let res = r.run();
    match res {
        Ok(()) => {
            r.stats.elapsed = start.elapsed();
            r.stats.final_sizes = r.files.iter().map(|f| f.model.len() as u64).collect();
            r.remove_all();
            Ok(r.stats)
        }
        Err(fail) => {
            if r.o.keep_on_failure {
                for f in &r.files {
                    let mut good = f.paths[0].clone().into_os_string();
                    good.push(".fsxgood");
                    let _ = std::fs::write(good, &f.model);
                }
            } else {
                r.remove_all();
            }
            Err(*fail)
        }
    }
}

impl Runner<'_> {
    fn fail(&self, msg: impl Into<String>, offset: Option<u64>) -> Box<FsxFailure> {
        let mut recent: Vec<String> = self.log.iter().map(|e| e.describe()).collect();
        if let Some(off) = offset {
            let touching: Vec<String> = self
                .log
                .iter()
                .filter(|e| e.covers(off))
                .map(|e| format!("#{}", e.n))
                .collect();
            if !touching.is_empty() {
                recent.push(format!(
                    "(recent ops covering offset {off:#x}: {})",
                    touching.join(", ")
                ));
            }
        }
        if let Some(i) = self.injected {
            recent.push(format!(
                "(inject-bug wrote 1 byte at offset {i:#x} behind the model's back)"
            ));
        }
        Box::new(FsxFailure {
            seed: self.o.seed,
            op: self.cur.n,
            op_desc: self.cur.describe(),
            file: self
                .files
                .get(self.cur.file)
                .map(|f| f.paths[self.cur.mount.min(f.paths.len() - 1)].clone())
                .unwrap_or_default(),
            offset,
            message: msg.into(),
            recent_ops: recent,
            repro: self.o.repro_command(),
            injected_offset: self.injected,
        })
    }

    fn sysfail<T>(&self, what: &str, r: sys::SysResult<T>) -> R<T> {
        r.map_err(|e| self.fail(format!("{what} failed: {e}"), None))
    }

    /// File `i`'s descriptor through the current operation's mount.
    fn fd(&self, i: usize) -> &Fd {
        self.files[i].fds[self.cur.mount]
            .as_ref()
            .expect("file open")
    }

    /// Opens every file through every mount (creating it through the first).
    fn open_all(&mut self, create: bool) -> R<()> {
        for i in 0..self.files.len() {
            for m in 0..self.files[i].paths.len() {
                let flags = libc::O_RDWR
                    | if create && m == 0 {
                        libc::O_CREAT | libc::O_TRUNC
                    } else {
                        0
                    };
                let fd = sys::open(&self.files[i].paths[m], flags, 0o644);
                let fd = fd.map_err(|e| {
                    self.fail(
                        format!("open {} failed: {e}", self.files[i].paths[m].display()),
                        None,
                    )
                })?;
                self.files[i].fds[m] = Some(fd);
            }
        }
        Ok(())
    }

    /// Closes and removes the test files and the namespace directory's names.
    fn remove_all(&mut self) {
        for f in &mut self.files {
            for fd in &mut f.fds {
                *fd = None;
            }
            let _ = sys::unlink(&f.paths[0]);
        }
        let dir = &self.names.dirs[0];
        for k in 0..NAME_SLOTS {
            let p = dir.join(format!("n{k}"));
            let _ = sys::unlink(&p);
            let _ = sys::rmdir(&p);
        }
        let _ = sys::rmdir(dir);
    }

    fn run(&mut self) -> R<()> {
        self.open_all(true)?;
        let names_used = [
            OpKind::Create,
            OpKind::Unlink,
            OpKind::Rename,
            OpKind::Link,
            OpKind::Mkdir,
            OpKind::Rmdir,
            OpKind::Lookup,
            OpKind::List,
        ]
        .iter()
        .any(|k| self.enabled[k.idx()]);
        if names_used {
            let r = sys::mkdir(&self.names.dirs[0], 0o755);
            self.sysfail("mkdir of the namespace directory", r)?;
        }
        for n in 1..=self.o.ops {
            let remount_now = self.o.remount.is_some()
                && self.o.remount_every > 0
                && n % self.o.remount_every == 0;
            let kind = if remount_now {
                OpKind::Remount
            } else {
                self.pick_kind()
            };
            let file = if self.files.len() > 1 {
                self.rng.below(self.files.len() as u64) as usize
            } else {
                0
            };
            // Drawn only with several mounts, so one mount's seeds replay as before.
            let views = self.names.dirs.len();
            let mount = if views > 1 {
                self.rng.below(views as u64) as usize
            } else {
                0
            };
            let size = self.files[file].model.len() as u64;
            self.cur = LogEntry {
                n,
                kind,
                file,
                mount,
                names: None,
                off: 0,
                len: 0,
                size_before: size,
                size_after: size,
                note: "",
            };
            self.stats.op_counts[kind.idx()] += 1;
            let started = Instant::now();
            self.do_op(kind, file)?;
            self.cur.size_after = self.files[file].model.len() as u64;
            self.push_log();
            self.check_size(file)?;
            self.stats.op_time[kind.idx()] += started.elapsed();
            self.stats.ops = n;
            if self.o.verify_every > 0 && n % self.o.verify_every == 0 {
                let started = Instant::now();
                self.verify_all()?;
                self.stats.verify_time += started.elapsed();
            }
            if self.o.verbose && n % 10_000 == 0 {
                eprintln!("fsx: {n} ops");
            }
        }
        self.cur = LogEntry {
            n: self.o.ops,
            kind: OpKind::Verify,
            file: 0,
            mount: 0,
            names: None,
            off: 0,
            len: 0,
            size_before: 0,
            size_after: 0,
            note: "final",
        };
        self.verify_all()
    }

    fn push_log(&mut self) {
        if self.o.log_last == 0 {
            return;
        }
        if self.log.len() == self.o.log_last {
            self.log.pop_front();
        }
        self.log.push_back(self.cur);
    }

    fn pick_kind(&mut self) -> OpKind {
        let total: u64 = OpKind::ALL
            .iter()
            .filter(|k| self.enabled[k.idx()] && **k != OpKind::Remount)
            .map(|k| self.o.weights.get(*k) as u64)
            .sum();
        if total == 0 {
            return OpKind::Verify;
        }
        let mut x = self.rng.below(total);
        for k in OpKind::ALL {
            if !self.enabled[k.idx()] || k == OpKind::Remount {
                continue;
            }
            let w = self.o.weights.get(k) as u64;
            if x < w {
                return k;
            }
            x -= w;
        }
        unreachable!()
    }

    /// Random length: tiny, page-multiple, or uniform.
    fn pick_len(&mut self) -> u64 {
        let max = self.o.max_op_len.max(1);
        match self.rng.below(8) {
            0 => self.rng.range(1, 16.min(max)),
            1 | 2 => (self.rng.range(1, (max / self.page).max(1)) * self.page).min(max),
            _ => self.rng.range(1, max),
        }
    }

    /// Random offset: inside the file, near/beyond EOF, possibly page aligned.
    fn pick_off(&mut self, size: u64, allow_beyond: bool) -> u64 {
        let max = self.o.max_size.max(1);
        let mut off = match self.rng.below(10) {
            0 if allow_beyond => size + self.rng.below(self.o.max_op_len.max(1) * 4),
            1 => size.saturating_sub(self.rng.below(64)),
            _ => self.rng.below(size.max(1)),
        };
        if self.rng.one_in(4) {
            off &= !(self.page - 1);
        }
        off.min(max - 1)
    }

    /// A range for data-changing ops, clipped to `max_size`.
    fn pick_range(&mut self, size: u64) -> (u64, u64) {
        let off = self.pick_off(size, true);
        let len = self.pick_len().min(self.o.max_size - off).max(1);
        (off, len)
    }

    fn disable(&mut self, kind: OpKind, e: Errno) -> bool {
        let unsupported = e.0 == libc::EOPNOTSUPP || e.0 == libc::ENOSYS || e.0 == libc::ENODEV;
        if unsupported {
            self.stats.unsupported_errors += 1;
            let kinds: &[OpKind] = match kind {
                OpKind::MmapRead | OpKind::MmapWrite => &[OpKind::MmapRead, OpKind::MmapWrite],
                k => &[k],
            };
            for &k in kinds {
                if self.enabled[k.idx()] {
                    self.enabled[k.idx()] = false;
                    let why = format!("{e} at op #{}", self.cur.n);
                    if self.o.verbose {
                        eprintln!("fsx: warning: disabling {} ({why})", k.name());
                    }
                    self.stats.disabled.push((k, why));
                }
            }
            self.cur.note = "(unsupported; op disabled)";
        }
        unsupported
    }

    fn do_op(&mut self, kind: OpKind, i: usize) -> R<()> {
        let size = self.files[i].model.len() as u64;
        match kind {
            OpKind::Write => {
                let (off, len) = self.pick_range(size);
                self.cur.off = off;
                self.cur.len = len;
                let mut data = std::mem::take(&mut self.buf);
                self.rng.fill(&mut data[..len as usize]);
                let r = sys::pwrite_all(self.fd(i), &data[..len as usize], off);
                let m = &mut self.files[i].model;
                if off + len > m.len() as u64 {
                    m.resize((off + len) as usize, 0);
                }
                m[off as usize..(off + len) as usize].copy_from_slice(&data[..len as usize]);
                self.buf = data;
                self.sysfail("pwrite", r)?;
                self.maybe_inject(i, off, len)?;
            }
            OpKind::Read => {
                let off = if self.rng.one_in(20) {
                    size + self.rng.below(4096)
                } else {
                    self.pick_off(size, false)
                };
                let len = self.pick_len();
                self.cur.off = off;
                self.cur.len = len;
                let mut buf = std::mem::take(&mut self.buf);
                let r = sys::pread_full(self.fd(i), &mut buf[..len as usize], off);
                let res = self.sysfail("pread", r).and_then(|got| {
                    let expect_n = size.saturating_sub(off).min(len) as usize;
                    if got != expect_n {
                        return Err(self.fail(format!("pread returned {got} bytes, expected {expect_n} (file size {size})"), Some(off + got as u64)));
                    }
                    self.compare(i, off, &buf[..got], "pread")
                });
                self.buf = buf;
                res?;
            }
            OpKind::Truncate => {
                let mut ns = if self.rng.one_in(3) {
                    self.rng.below(size + 1)
                } else {
                    self.rng.below(self.o.max_size + 1)
                };
                if self.rng.one_in(4) {
                    ns &= !(self.page - 1);
                }
                self.cur.off = ns;
                let r = sys::ftruncate(self.fd(i), ns as i64);
                self.files[i].model.resize(ns as usize, 0);
                self.sysfail("ftruncate", r)?;
            }
            OpKind::PunchHole | OpKind::ZeroRange | OpKind::Fallocate => {
                let (off, len) = if kind == OpKind::PunchHole {
                    let off = self.pick_off(size, false);
                    (off, self.pick_len().min(self.o.max_size - off).max(1))
                } else {
                    self.pick_range(size)
                };
                self.cur.off = off;
                self.cur.len = len;
                let keep = kind == OpKind::PunchHole || self.rng.one_in(2);
                let mode = match kind {
                    OpKind::PunchHole => libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                    OpKind::ZeroRange => {
                        libc::FALLOC_FL_ZERO_RANGE
                            | if keep { libc::FALLOC_FL_KEEP_SIZE } else { 0 }
                    }
                    _ => {
                        if keep {
                            libc::FALLOC_FL_KEEP_SIZE
                        } else {
                            0
                        }
                    }
                };
                if keep && kind != OpKind::PunchHole {
                    self.cur.note = "KEEP_SIZE";
                }
                match sys::fallocate(self.fd(i), mode, off, len) {
                    Ok(()) => {
                        let m = &mut self.files[i].model;
                        if kind != OpKind::Fallocate {
                            let end = (off + len).min(m.len() as u64);
                            if off < end {
                                m[off as usize..end as usize].fill(0);
                            }
                        }
                        if !keep && off + len > m.len() as u64 {
                            m.resize((off + len) as usize, 0);
                        }
                    }
                    Err(e) if self.disable(kind, e) => {}
                    Err(e) => {
                        return Err(
                            self.fail(format!("fallocate(mode {mode:#x}) failed: {e}"), None)
                        )
                    }
                }
            }
            OpKind::MmapRead => {
                if size == 0 {
                    self.cur.note = "(skipped: empty file)";
                    return Ok(());
                }
                let off = self.rng.below(size);
                let len = self.pick_len().min(size - off);
                self.cur.off = off;
                self.cur.len = len;
                let moff = off & !(self.page - 1);
                match Mmap::new(self.fd(i), moff, (off + len - moff) as usize, false) {
                    Ok(m) => {
                        let view = &m.as_slice()[(off - moff) as usize..];
                        self.compare(i, off, view, "mmap read")?;
                    }
                    Err(e) if self.disable(kind, e) => {}
                    Err(e) => return Err(self.fail(format!("mmap PROT_READ failed: {e}"), None)),
                }
            }
            OpKind::MmapWrite => {
                let (off, len) = self.pick_range(size);
                self.cur.off = off;
                self.cur.len = len;
                if off + len > size {
                    let r = sys::ftruncate(self.fd(i), (off + len) as i64);
                    self.files[i].model.resize((off + len) as usize, 0);
                    self.sysfail("ftruncate (extend for mmap write)", r)?;
                    self.cur.note = "(extended by ftruncate first)";
                }
                let moff = off & !(self.page - 1);
                match Mmap::new(self.fd(i), moff, (off + len - moff) as usize, true) {
                    Ok(mut m) => {
                        let mut data = std::mem::take(&mut self.buf);
                        self.rng.fill(&mut data[..len as usize]);
                        m.as_mut_slice()[(off - moff) as usize..]
                            .copy_from_slice(&data[..len as usize]);
                        self.files[i].model[off as usize..(off + len) as usize]
                            .copy_from_slice(&data[..len as usize]);
                        self.buf = data;
                        let r = m.msync();
                        self.sysfail("msync", r)?;
                    }
                    Err(e) if self.disable(kind, e) => {}
                    Err(e) => return Err(self.fail(format!("mmap PROT_WRITE failed: {e}"), None)),
                }
            }
            OpKind::Fsync => {
                let r = sys::fsync(self.fd(i));
                self.sysfail("fsync", r)?;
            }
            OpKind::Fdatasync => {
                let r = sys::fdatasync(self.fd(i));
                self.sysfail("fdatasync", r)?;
            }
            OpKind::CloseReopen => {
                let m = self.cur.mount;
                let fd = self.files[i].fds[m].take().expect("open");
                let r = fd.close();
                self.sysfail("close", r)?;
                let r = sys::open(&self.files[i].paths[m], libc::O_RDWR, 0);
                self.files[i].fds[m] = Some(self.sysfail("reopen", r)?);
            }
            OpKind::Verify => self.verify(i)?,
            OpKind::Remount => {
                for f in &mut self.files {
                    for fd in &mut f.fds {
                        if let Some(fd) = fd.take() {
                            let _ = fd.close();
                        }
                    }
                }
                let hook = self.o.remount.as_mut().expect("remount hook");
                if let Err(e) = hook() {
                    return Err(self.fail(format!("remount hook failed: {e:#}"), None));
                }
                self.stats.remounts += 1;
                self.open_all(false)?;
                self.verify_all()?;
            }
            OpKind::RecordWrite => {
                let records = (self.o.max_size / RECORD_BYTES).max(1);
                let off = self.rng.below(records) * RECORD_BYTES;
                let len = RECORD_BYTES.min(self.o.max_size - off);
                self.cur.off = off;
                self.cur.len = len;
                let mut data = std::mem::take(&mut self.buf);
                if data.len() < len as usize {
                    data.resize(len as usize, 0);
                }
                self.rng.fill(&mut data[..len as usize]);
                let r = sys::pwrite_all(self.fd(i), &data[..len as usize], off);
                let m = &mut self.files[i].model;
                if off + len > m.len() as u64 {
                    m.resize((off + len) as usize, 0);
                }
                m[off as usize..(off + len) as usize].copy_from_slice(&data[..len as usize]);
                self.buf = data;
                self.sysfail("pwrite (record)", r)?;
            }
            OpKind::Stat => self.stat_everywhere(i)?,
            OpKind::Create
            | OpKind::Unlink
            | OpKind::Rename
            | OpKind::Link
            | OpKind::Mkdir
            | OpKind::Rmdir
            | OpKind::Lookup
            | OpKind::List => self.name_op(kind)?,
        }
        Ok(())
    }

    /// `fstat` of file `i` through every mount: one mtime everywhere, never going back.
    fn stat_everywhere(&mut self, i: usize) -> R<()> {
        let mut seen: Option<(usize, i128)> = None;
        for m in 0..self.files[i].fds.len() {
            let Some(fd) = self.files[i].fds[m].as_ref() else {
                continue;
            };
            let st = self.sysfail("fstat", sys::fstat(fd))?;
            let mtime = sys::ts_ns(st.st_mtime, st.st_mtime_nsec);
            match seen {
                Some((m0, t0)) if t0 != mtime => {
                    return Err(self.fail(
                        format!("mtime through mount m{m0} is {t0} ns, through m{m} {mtime} ns"),
                        None,
                    ))
                }
                _ => seen = Some((m, mtime)),
            }
        }
        if let Some((m, t)) = seen {
            if t < self.files[i].mtime {
                return Err(self.fail(
                    format!(
                        "mtime went back: {t} ns through m{m}, {} ns seen before",
                        self.files[i].mtime
                    ),
                    None,
                ));
            }
            self.files[i].mtime = t;
        }
        Ok(())
    }

    /// A namespace operation on random names, through the current mount, checked
    /// against the model of the names.
    fn name_op(&mut self, kind: OpKind) -> R<()> {
        let a = self.rng.below(NAME_SLOTS as u64) as usize;
        let b = self.rng.below(NAME_SLOTS as u64) as usize;
        let dir = self.names.dirs[self.cur.mount].clone();
        let (pa, pb) = (dir.join(format!("n{a}")), dir.join(format!("n{b}")));
        let (sa, sb) = (self.names.slots[a], self.names.slots[b]);
        self.cur.names = Some(match kind {
            OpKind::Rename | OpKind::Link => (a as u8, b as u8),
            _ => (a as u8, a as u8),
        });
        // The outcome the model expects: Ok, or the errno.
        let expect = |got: sys::SysResult<()>, want: Result<(), i32>, what: &str| -> R<()> {
            match (got, want) {
                (Ok(()), Ok(())) => Ok(()),
                (Err(e), Err(w)) if e.0 == w => Ok(()),
                (got, want) => Err(self.fail(
                    format!(
                        "{what}: got {}, the model expects {}",
                        match got {
                            Ok(()) => "success".to_string(),
                            Err(e) => e.to_string(),
                        },
                        match want {
                            Ok(()) => "success".to_string(),
                            Err(w) => sys::Errno(w).to_string(),
                        }
                    ),
                    None,
                )),
            }
        };
        match kind {
            OpKind::Create => {
                let r = sys::open(&pa, libc::O_CREAT | libc::O_EXCL | libc::O_WRONLY, 0o644);
                match (r, sa) {
                    (Ok(fd), Slot::Empty) => {
                        let st = self.sysfail("fstat of a new file", sys::fstat(&fd))?;
                        drop(fd);
                        self.names.files.push(NameFile {
                            ino: st.st_ino,
                            nlink: 1,
                        });
                        self.names.slots[a] = Slot::File(self.names.files.len() - 1);
                    }
                    (r, _) => {
                        let want = if sa == Slot::Empty {
                            Ok(())
                        } else {
                            Err(libc::EEXIST)
                        };
                        expect(r.map(drop), want, "create")?;
                    }
                }
            }
            OpKind::Unlink => {
                let want = match sa {
                    Slot::Empty => Err(libc::ENOENT),
                    Slot::Dir => Err(libc::EISDIR),
                    Slot::File(_) => Ok(()),
                };
                expect(sys::unlink(&pa), want, "unlink")?;
                if let Slot::File(f) = sa {
                    self.names.files[f].nlink -= 1;
                    self.names.slots[a] = Slot::Empty;
                }
            }
            OpKind::Rename => {
                let want = match (sa, sb) {
                    (Slot::Empty, _) => Err(libc::ENOENT),
                    _ if a == b => Ok(()),
                    (Slot::File(_), Slot::Dir) => Err(libc::EISDIR),
                    (Slot::Dir, Slot::File(_)) => Err(libc::ENOTDIR),
                    _ => Ok(()),
                };
                expect(sys::rename(&pa, &pb), want, "rename")?;
                match (sa, sb) {
                    _ if want.is_err() || a == b => {}
                    // Two links of one file: rename does nothing (POSIX).
                    (Slot::File(x), Slot::File(y)) if x == y => {}
                    (_, old) => {
                        if let Slot::File(y) = old {
                            self.names.files[y].nlink -= 1;
                        }
                        self.names.slots[b] = sa;
                        self.names.slots[a] = Slot::Empty;
                    }
                }
            }
            OpKind::Link => {
                let want = match (sa, sb) {
                    (Slot::Empty, _) => Err(libc::ENOENT),
                    (_, Slot::File(_) | Slot::Dir) => Err(libc::EEXIST),
                    (Slot::Dir, _) => Err(libc::EPERM),
                    (Slot::File(_), Slot::Empty) => Ok(()),
                };
                expect(sys::link(&pa, &pb), want, "link")?;
                if let (Ok(()), Slot::File(x)) = (want, sa) {
                    self.names.files[x].nlink += 1;
                    self.names.slots[b] = sa;
                }
            }
            OpKind::Mkdir => {
                let want = match sa {
                    Slot::Empty => Ok(()),
                    _ => Err(libc::EEXIST),
                };
                expect(sys::mkdir(&pa, 0o755), want, "mkdir")?;
                if want.is_ok() {
                    self.names.slots[a] = Slot::Dir;
                }
            }
            OpKind::Rmdir => {
                let want = match sa {
                    Slot::Empty => Err(libc::ENOENT),
                    Slot::File(_) => Err(libc::ENOTDIR),
                    Slot::Dir => Ok(()),
                };
                expect(sys::rmdir(&pa), want, "rmdir")?;
                if want.is_ok() {
                    self.names.slots[a] = Slot::Empty;
                }
            }
            OpKind::Lookup => match (sys::lstat(&pa), sa) {
                (Err(e), Slot::Empty) if e.0 == libc::ENOENT => {}
                (Ok(st), Slot::File(f))
                    if st.st_mode & libc::S_IFMT == libc::S_IFREG
                        && st.st_ino == self.names.files[f].ino
                        && st.st_nlink == self.names.files[f].nlink => {}
                (Ok(st), Slot::Dir)
                    if st.st_mode & libc::S_IFMT == libc::S_IFDIR && st.st_nlink == 2 => {}
                (got, want) => {
                    let got = match got {
                        Ok(st) => format!(
                            "mode {:o} ino {} nlink {}",
                            st.st_mode, st.st_ino, st.st_nlink
                        ),
                        Err(e) => e.to_string(),
                    };
                    let want = match want {
                        Slot::Empty => "ENOENT".to_string(),
                        Slot::Dir => "a directory with 2 links".to_string(),
                        Slot::File(f) => format!(
                            "a file, ino {} nlink {}",
                            self.names.files[f].ino, self.names.files[f].nlink
                        ),
                    };
                    return Err(
                        self.fail(format!("lstat: got {got}, the model expects {want}"), None)
                    );
                }
            },
            OpKind::List => {
                let rd = std::fs::read_dir(&dir).and_then(|it| {
                    it.map(|e| e.map(|e| e.file_name()))
                        .collect::<Result<Vec<_>, _>>()
                });
                let mut got: Vec<String> = match rd {
                    Ok(v) => v
                        .into_iter()
                        .map(|n| n.to_string_lossy().into_owned())
                        .collect(),
                    Err(e) => {
                        return Err(self.fail(format!("readdir {}: {e}", dir.display()), None))
                    }
                };
                got.sort();
                let want: Vec<String> = (0..NAME_SLOTS)
                    .filter(|k| self.names.slots[*k] != Slot::Empty)
                    .map(|k| format!("n{k}"))
                    .collect();
                if got != want {
                    return Err(self.fail(
                        format!("readdir: got {got:?}, the model expects {want:?}"),
                        None,
                    ));
                }
            }
            _ => unreachable!("not a namespace operation"),
        }
        Ok(())
    }

    /// After a write of [off, off+len): at the first write at/after `inject_bug`, corrupt one
    /// byte next to the written range (inside the file) without updating the model.
    fn maybe_inject(&mut self, i: usize, off: u64, len: u64) -> R<()> {
        let Some(at) = self.o.inject_bug else {
            return Ok(());
        };
        if self.injected.is_some() || self.cur.n < at {
            return Ok(());
        }
        let size = self.files[i].model.len() as u64;
        let victim = if off + len < size {
            off + len
        } else if off > 0 {
            off - 1
        } else {
            return Ok(());
        };
        let bad = [self.files[i].model[victim as usize] ^ 0xff];
        let r = sys::pwrite_all(self.fd(i), &bad, victim);
        self.sysfail("inject-bug pwrite", r)?;
        self.injected = Some(victim);
        self.cur.note = "(inject-bug: +1 byte behind the model's back)";
        if self.o.verbose {
            eprintln!("fsx: inject-bug: op #{} wrote 1 byte at offset {victim:#x} behind the model's back", self.cur.n);
        }
        Ok(())
    }

    fn compare(&self, i: usize, off: u64, got: &[u8], what: &str) -> R<()> {
        if got.is_empty() {
            return Ok(());
        }
        let exp = &self.files[i].model[off as usize..off as usize + got.len()];
        if exp == got {
            return Ok(());
        }
        let d = exp.iter().zip(got).position(|(a, b)| a != b).unwrap();
        let bad_off = off + d as u64;
        let lo = d.saturating_sub(4);
        let hi = (d + 12).min(got.len());
        let mut ndiff = 0;
        let mut last = d;
        for (k, (a, b)) in exp.iter().zip(got).enumerate().skip(d) {
            if a != b {
                ndiff += 1;
                last = k;
            }
        }
        let hole = exp[d] != 0 && got[d] == 0;
        Err(self.fail(
            format!(
                "{what} mismatch at offset {bad_off} ({bad_off:#x}): expected byte {:#04x}, got {:#04x}{}; \
                 {ndiff} differing bytes in this {}-byte {what}, last at {:#x}; \
                 expected [{:#x}..{:#x}] = {}, actual = {}",
                exp[d],
                got[d],
                if hole { " (zero: looks like a lost write or a stray hole)" } else { "" },
                got.len(),
                off + last as u64,
                off + lo as u64,
                off + hi as u64,
                hex(&exp[lo..hi]),
                hex(&got[lo..hi]),
            ),
            Some(bad_off),
        ))
    }

    /// The size through every mount is the model's.
    fn check_size(&self, i: usize) -> R<()> {
        let model = self.files[i].model.len() as u64;
        for (m, fd) in self.files[i].fds.iter().enumerate() {
            let Some(fd) = fd.as_ref() else {
                continue;
            };
            let st = self.sysfail("fstat", sys::fstat(fd))?;
            if st.st_size as u64 != model {
                return Err(self.fail(
                    format!(
                        "fstat size through mount m{m} {} ({:#x}) != model size {model} ({model:#x})",
                        st.st_size, st.st_size
                    ),
                    None,
                ));
            }
        }
        Ok(())
    }

    fn verify(&mut self, i: usize) -> R<()> {
        self.check_size(i)?;
        self.stats.verifies += 1;
        let size = self.files[i].model.len() as u64;
        let mut buf = std::mem::take(&mut self.buf);
        let chunk = buf.len() as u64;
        let mut off = 0;
        let mut res = Ok(());
        while off < size {
            let want = chunk.min(size - off) as usize;
            match sys::pread_full(self.fd(i), &mut buf[..want], off) {
                Ok(n) if n == want => {}
                Ok(n) => {
                    res = Err(self.fail(format!("full verify: short read of {n} bytes at {off}, expected {want} (size {size})"), Some(off + n as u64)));
                    break;
                }
                Err(e) => {
                    res = Err(self.fail(format!("full verify: pread at {off} failed: {e}"), None));
                    break;
                }
            }
            if let Err(e) = self.compare(i, off, &buf[..want], "full-file verify") {
                res = Err(e);
                break;
            }
            off += want as u64;
        }
        if res.is_ok() {
            let mut one = [0u8; 1];
            match sys::pread(self.fd(i), &mut one, size) {
                Ok(0) => {}
                Ok(_) => {
                    res = Err(self.fail(
                        format!("full verify: data readable past model EOF {size}"),
                        Some(size),
                    ))
                }
                Err(e) => {
                    res = Err(self.fail(format!("full verify: pread at EOF failed: {e}"), None))
                }
            }
        }
        self.buf = buf;
        res
    }

    /// Every file read whole through every mount.
    fn verify_all(&mut self) -> R<()> {
        let (file, mount) = (self.cur.file, self.cur.mount);
        for i in 0..self.files.len() {
            for m in 0..self.files[i].fds.len() {
                if self.files[i].fds[m].is_none() {
                    continue;
                }
                self.cur.file = i;
                self.cur.mount = m;
                self.verify(i)?;
            }
        }
        self.cur.file = file;
        self.cur.mount = mount;
        Ok(())
    }
}

fn hex(b: &[u8]) -> String {
    b.iter()
        .map(|x| format!("{x:02x}"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// Convenience: runs fsx on `dir` with defaults for `seed` and `ops`.
#[allow(clippy::result_large_err)]
pub fn run_fsx_default(dir: &Path, seed: u64, ops: u64) -> Result<FsxStats, FsxFailure> {
    run_fsx(&mut FsxOptions::new(dir, seed, ops))
}
