//! The work one thread does in a timed phase — a data stream, a metadata loop or a tree
//! walk — and the per-thread result it reports.
//!
//! Tasks are plain data (serde) so the coordinator can hand them to worker processes
//! over a pipe; `run_tasks` runs one thread per task behind a start gate, so every
//! thread in every process is set up (files open, buffers allocated) before any of them
//! starts the clock.

use std::fs::{File, OpenOptions};
use std::io::ErrorKind;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Barrier};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::histogram::{Histogram, SparseHistogram};
use crate::pattern::{self, AlignedBuffer};

/// How a stream picks its next record.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
pub enum Access {
    /// Records in order, wrapping at the end of the segment.
    Seq,
    /// Uniformly random records of the segment (with replacement), seeded.
    Rand,
    /// Records in order, `--stride` bytes apart (holes between them).
    Strided,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Direction {
    Read,
    Write,
}

/// One thread reading or writing records of one file.
///
/// The stream owns `segment_records` record slots. Slot `j` lives at file offset
/// `(j * streams + rank) * unit`, where `unit` is the stride for strided access and the
/// record size otherwise; with `streams = 1` that is a file of its own, with
/// `streams = T` it is ior-hard's interleaving where record `i` belongs to stream
/// `i mod T`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct StreamSpec {
    pub path: PathBuf,
    pub direction: Direction,
    /// Open with O_CREAT (writes only).
    pub create: bool,
    /// Open with O_TRUNC (writes only; only for files this stream owns alone).
    pub truncate: bool,
    pub access: Access,
    pub record_bytes: u64,
    pub segment_records: u64,
    pub stride_bytes: u64,
    pub streams: u64,
    pub rank: u64,
    /// Stop after this many operations (`u64::MAX` for "until the time limit").
    pub ops_max: u64,
    /// Stop when this much time has passed (gpfsperf `-millis`, io500 stonewall).
    pub time_limit_ms: Option<u64>,
    pub seed: u64,
    pub direct: bool,
    /// fsync before close; counted in the elapsed time and the I/O time.
    pub fsync: bool,
    /// Check the pattern of every record read.
    pub verify: bool,
}

impl StreamSpec {
    /// Bytes between consecutive slots of the whole interleaved file.
    fn unit_bytes(&self) -> u64 {
        match self.access {
            Access::Strided => self.stride_bytes,
            Access::Seq | Access::Rand => self.record_bytes,
        }
    }

    /// File offset of slot `slot`.
    pub fn slot_offset(&self, slot: u64) -> u64 {
        (slot * self.streams + self.rank) * self.unit_bytes()
    }

    /// Smallest file size that holds every record of this stream.
    pub fn required_file_bytes(&self) -> u64 {
        if self.segment_records == 0 {
            return 0;
        }
        self.slot_offset(self.segment_records - 1) + self.record_bytes
    }
}

/// What a metadata task does to each of its files.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum MdOp {
    /// Create an empty file (O_CREAT|O_EXCL), close it: mdtest-easy-write.
    CreateEmpty,
    /// Create, write `bytes` of pattern, close: mdtest-hard-write.
    CreateWrite { bytes: u64 },
    /// stat(2) the file.
    Stat,
    /// Open, read `bytes`, verify, close: mdtest-hard-read.
    Read { bytes: u64 },
    /// unlink(2) the file.
    Delete,
}

/// One thread doing `op` on files `dir/{prefix}{first}` … `dir/{prefix}{first+count-1}`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct MdSpec {
    pub dir: PathBuf,
    pub prefix: String,
    pub first: u64,
    pub count: u64,
    pub op: MdOp,
    pub time_limit_ms: Option<u64>,
    pub verify: bool,
    /// fsync each created file before closing it (mdtest -y).
    #[serde(default)]
    pub fsync: bool,
}

/// One thread walking directory trees and lstat-ing every entry (io500 `find`), or,
/// with `names_only`, looking only at the names and types the listing gives (`find
/// -type f` needs no more: it reads `d_type`).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct FindSpec {
    pub roots: Vec<PathBuf>,
    #[serde(default)]
    pub names_only: bool,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum Task {
    Stream(StreamSpec),
    Md(MdSpec),
    Find(FindSpec),
}

/// What one thread did. Times are wall-clock nanoseconds since the Unix epoch so that
/// results from several processes on one host can be put on one time line.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct TaskResult {
    pub start_ns: u64,
    pub end_ns: u64,
    pub ops: u64,
    pub bytes: u64,
    /// Time spent inside I/O system calls (for thread utilisation).
    pub io_ns: u64,
    pub latency: SparseHistogram,
    pub verify_errors: u64,
    pub first_verify_error: Option<String>,
    /// The time limit stopped the task before its operation count was reached.
    pub stonewalled: bool,
    /// The task failed; ops/bytes describe what it did before that.
    pub error: Option<String>,
}

impl TaskResult {
    pub fn elapsed_ns(&self) -> u64 {
        self.end_ns.saturating_sub(self.start_ns)
    }
}

fn wall_clock_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

/// Accumulates a thread's counters while it runs.
struct Meter {
    start_ns: u64,
    started: Instant,
    histogram: Histogram,
    ops: u64,
    bytes: u64,
    io_ns: u64,
    verify_errors: u64,
    first_verify_error: Option<String>,
    stonewalled: bool,
}

impl Meter {
    fn start() -> Meter {
        Meter {
            start_ns: wall_clock_ns(),
            started: Instant::now(),
            histogram: Histogram::new(),
            ops: 0,
            bytes: 0,
            io_ns: 0,
            verify_errors: 0,
            first_verify_error: None,
            stonewalled: false,
        }
    }

    fn op(&mut self, latency: Duration, bytes: u64) {
        let nanos = latency.as_nanos() as u64;
        self.histogram.record(nanos);
        self.io_ns += nanos;
        self.ops += 1;
        self.bytes += bytes;
    }

    fn verify_failed(&mut self, message: String) {
        self.verify_errors += 1;
        if self.first_verify_error.is_none() {
            self.first_verify_error = Some(message);
        }
    }

    fn finish(self, error: Option<String>) -> TaskResult {
        let elapsed = self.started.elapsed().as_nanos() as u64;
        TaskResult {
            start_ns: self.start_ns,
            end_ns: self.start_ns + elapsed,
            ops: self.ops,
            bytes: self.bytes,
            io_ns: self.io_ns,
            latency: self.histogram.to_sparse(),
            verify_errors: self.verify_errors,
            first_verify_error: self.first_verify_error,
            stonewalled: self.stonewalled,
            error,
        }
    }
}

/// Opens a file the way a stream needs it, with an error that says what to do.
pub fn open_for_stream(spec: &StreamSpec) -> Result<File, String> {
    let mut options = OpenOptions::new();
    match spec.direction {
        Direction::Read => {
            options.read(true);
        }
        Direction::Write => {
            options
                .write(true)
                .create(spec.create)
                .truncate(spec.truncate)
                .mode(0o644);
        }
    }
    if spec.direct {
        options.custom_flags(libc::O_DIRECT);
    }
    options.open(&spec.path).map_err(|e| {
        let mut message = format!("cannot open {}: {e}", spec.path.display());
        if spec.direct && e.raw_os_error() == Some(libc::EINVAL) {
            message
                .push_str(" — this file system refuses O_DIRECT (tmpfs does); run without --dio");
        } else if e.kind() == ErrorKind::NotFound && spec.direction == Direction::Read {
            message.push_str(
                " — create it first (mako perf create ... with the same -r/-n/-th/--procs)",
            );
        }
        message
    })
}

/// A stream ready to run: file open, buffer allocated.
struct PreparedStream {
    spec: StreamSpec,
    file: File,
    buffer: AlignedBuffer,
    key: u64,
}

fn prepare_stream(spec: StreamSpec) -> Result<PreparedStream, String> {
    if spec.record_bytes == 0 {
        return Err("record size is 0".to_string());
    }
    let file = open_for_stream(&spec)?;
    if spec.direction == Direction::Read {
        // Check the length up front: a short file would otherwise look like a very fast
        // read of nothing.
        let length = file
            .metadata()
            .map_err(|e| format!("cannot stat {}: {e}", spec.path.display()))?
            .len();
        let needed = spec.required_file_bytes();
        if length < needed {
            return Err(format!(
                "{} is {length} bytes but this run reads up to byte {needed}; write it first \
                 with the same record size, size and thread/process counts (mako perf create ...)",
                spec.path.display()
            ));
        }
    }
    let buffer = AlignedBuffer::new(spec.record_bytes as usize)?;
    let key = pattern::file_key(&file_name_of(&spec.path));
    Ok(PreparedStream {
        spec,
        file,
        buffer,
        key,
    })
}

/// File name used for the pattern key (lossy is fine: both sides compute it the same way).
pub fn file_name_of(path: &Path) -> String {
    path.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// Reads exactly `buffer.len()` bytes at `offset`, retrying short reads; EOF is an error.
fn read_full_at(file: &File, buffer: &mut [u8], offset: u64) -> std::io::Result<()> {
    let mut done = 0;
    while done < buffer.len() {
        match file.read_at(&mut buffer[done..], offset + done as u64) {
            Ok(0) => {
                return Err(std::io::Error::new(
                    ErrorKind::UnexpectedEof,
                    format!("end of file after {} bytes of the record", done),
                ))
            }
            Ok(n) => done += n,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

fn run_stream(mut stream: PreparedStream) -> TaskResult {
    let spec = &stream.spec;
    let record = spec.record_bytes as usize;
    let mut meter = Meter::start();
    let deadline = spec
        .time_limit_ms
        .map(|ms| meter.started + Duration::from_millis(ms));
    let mut random = spec.seed | 1;
    let mut error = None;
    let mut now = meter.started;
    let mut index: u64 = 0;
    while index < spec.ops_max && spec.segment_records > 0 {
        if deadline.is_some_and(|d| now >= d) {
            meter.stonewalled = true;
            break;
        }
        let slot = match spec.access {
            Access::Seq | Access::Strided => index % spec.segment_records,
            Access::Rand => {
                random = pattern::mix64(random.wrapping_add(0x9e37_79b9_7f4a_7c15));
                random % spec.segment_records
            }
        };
        let offset = spec.slot_offset(slot);
        let buffer = &mut stream.buffer.as_mut_slice()[..record];
        let result = match spec.direction {
            Direction::Write => {
                pattern::fill(buffer, offset, stream.key);
                let begin = Instant::now();
                let result = stream.file.write_all_at(buffer, offset);
                now = Instant::now();
                meter.op(now - begin, record as u64);
                result
            }
            Direction::Read => {
                let begin = Instant::now();
                let result = read_full_at(&stream.file, buffer, offset);
                now = Instant::now();
                meter.op(now - begin, record as u64);
                if result.is_ok() && spec.verify {
                    if let Some(bad) = pattern::verify(buffer, offset, stream.key) {
                        meter.verify_failed(format!(
                            "{}: record at offset {offset} ({record} bytes) differs from the written pattern at byte {bad}",
                            spec.path.display()
                        ));
                    }
                }
                result
            }
        };
        if let Err(e) = result {
            let verb = if spec.direction == Direction::Write {
                "write"
            } else {
                "read"
            };
            error = Some(format!(
                "{verb} of {record} bytes at offset {offset} in {} failed: {e}",
                spec.path.display()
            ));
            // Do not count the failed operation's bytes as transferred.
            meter.bytes -= record as u64;
            break;
        }
        index += 1;
    }
    if error.is_none() && spec.fsync && spec.direction == Direction::Write {
        let begin = Instant::now();
        if let Err(e) = stream.file.sync_all() {
            error = Some(format!("fsync of {} failed: {e}", spec.path.display()));
        }
        meter.io_ns += begin.elapsed().as_nanos() as u64;
    }
    // Close inside the timed region: on network and FUSE file systems close can flush.
    let begin = Instant::now();
    drop(stream.file);
    meter.io_ns += begin.elapsed().as_nanos() as u64;
    meter.finish(error)
}

fn run_md(spec: &MdSpec) -> TaskResult {
    let mut meter = Meter::start();
    let deadline = spec
        .time_limit_ms
        .map(|ms| meter.started + Duration::from_millis(ms));
    let mut now = meter.started;
    let mut error = None;
    let mut data = Vec::new();
    for index in spec.first..spec.first + spec.count {
        if deadline.is_some_and(|d| now >= d) {
            meter.stonewalled = true;
            break;
        }
        let name = format!("{}{index}", spec.prefix);
        let path = spec.dir.join(&name);
        if let MdOp::CreateWrite { bytes } = spec.op {
            // Pattern generation happens before the clock starts: it is not file-system time.
            data.resize(bytes as usize, 0);
            pattern::fill(&mut data, 0, pattern::file_key(&name));
        }
        let begin = Instant::now();
        let (result, bytes) = match spec.op {
            MdOp::CreateEmpty => (
                OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(0o644)
                    .open(&path)
                    .and_then(|file| if spec.fsync { file.sync_all() } else { Ok(()) }),
                0,
            ),
            MdOp::CreateWrite { bytes } => (
                OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(0o644)
                    .open(&path)
                    .and_then(|file| {
                        file.write_all_at(&data, 0)?;
                        if spec.fsync {
                            file.sync_all()?;
                        }
                        Ok(())
                    }),
                bytes,
            ),
            MdOp::Stat => (lstat(&path).map(drop), 0),
            MdOp::Read { bytes } => {
                data.resize(bytes as usize, 0);
                let result = File::open(&path).and_then(|file| read_full_at(&file, &mut data, 0));
                (result, bytes)
            }
            MdOp::Delete => (std::fs::remove_file(&path), 0),
        };
        now = Instant::now();
        meter.op(now - begin, bytes);
        if let Err(e) = result {
            meter.ops -= 1;
            meter.bytes -= bytes;
            error = Some(format!("{:?} of {}: {e}", spec.op, path.display()));
            break;
        }
        if let MdOp::Read { .. } = spec.op {
            if spec.verify {
                if let Some(bad) = pattern::verify(&data, 0, pattern::file_key(&name)) {
                    meter.verify_failed(format!(
                        "{}: content differs from the written pattern at byte {bad}",
                        path.display()
                    ));
                }
            }
        }
    }
    meter.finish(error)
}

/// lstat(2) as mdtest and find call it (`newfstatat`, the basic attributes). Rust's
/// `symlink_metadata` asks statx for the birth time too, which a FUSE kernel never
/// caches from a lookup's reply: every such call would reach the file system.
fn lstat(path: &Path) -> std::io::Result<libc::stat> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| std::io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: a NUL-terminated path and a zeroed stat buffer lstat fills.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    if unsafe { libc::lstat(c.as_ptr(), &mut st) } == 0 {
        Ok(st)
    } else {
        Err(std::io::Error::last_os_error())
    }
}

fn run_find(spec: &FindSpec) -> TaskResult {
    let mut meter = Meter::start();
    let mut error = None;
    let mut pending: Vec<PathBuf> = spec.roots.clone();
    'walk: while let Some(dir) = pending.pop() {
        let begin = Instant::now();
        let entries = match std::fs::read_dir(&dir) {
            Ok(entries) => entries,
            Err(e) => {
                error = Some(format!("cannot list {}: {e}", dir.display()));
                break;
            }
        };
        meter.io_ns += begin.elapsed().as_nanos() as u64;
        for entry in entries {
            // Like `find -size`, look at every entry's attributes, not only its name;
            // or, like `find -type f`, only at the type the listing carries.
            let begin = Instant::now();
            let result = entry.and_then(|entry| {
                let is_dir = if spec.names_only {
                    entry.file_type()?.is_dir()
                } else {
                    lstat(&entry.path())?.st_mode & libc::S_IFMT == libc::S_IFDIR
                };
                Ok((entry.path(), is_dir))
            });
            meter.op(begin.elapsed(), 0);
            match result {
                Ok((path, true)) => pending.push(path),
                Ok(_) => {}
                Err(e) => {
                    error = Some(format!("reading an entry of {}: {e}", dir.display()));
                    break 'walk;
                }
            }
        }
    }
    meter.finish(error)
}

enum Prepared {
    Stream(PreparedStream),
    Md(MdSpec),
    Find(FindSpec),
}

fn prepare(task: Task) -> Result<Prepared, String> {
    Ok(match task {
        Task::Stream(spec) => Prepared::Stream(prepare_stream(spec)?),
        Task::Md(spec) => Prepared::Md(spec),
        Task::Find(spec) => Prepared::Find(spec),
    })
}

fn run_prepared(prepared: Prepared) -> TaskResult {
    match prepared {
        Prepared::Stream(stream) => run_stream(stream),
        Prepared::Md(spec) => run_md(&spec),
        Prepared::Find(spec) => run_find(&spec),
    }
}

/// Runs one thread per task.
///
/// 1. Every thread prepares its task (opens files, allocates buffers) and reports.
/// 2. `gate` gets the combined setup outcome; it returns whether to start (a worker
///    process uses it to tell the coordinator "ready" and wait for "go").
/// 3. All threads pass one barrier together and start their clocks.
///
/// Returns `None` when the gate said not to start.
pub fn run_tasks(
    tasks: Vec<Task>,
    gate: &mut dyn FnMut(Result<(), String>) -> bool,
) -> Option<Vec<TaskResult>> {
    let task_count = tasks.len();
    let barrier = Arc::new(Barrier::new(task_count + 1));
    let abort = Arc::new(AtomicBool::new(false));
    let (setup_sender, setup_receiver) = mpsc::channel::<Result<(), String>>();
    let mut handles = Vec::with_capacity(tasks.len());
    for task in tasks {
        let barrier = Arc::clone(&barrier);
        let abort = Arc::clone(&abort);
        let setup_sender = setup_sender.clone();
        handles.push(std::thread::spawn(move || {
            let prepared = prepare(task);
            let _ = setup_sender.send(prepared.as_ref().map(|_| ()).map_err(Clone::clone));
            drop(setup_sender);
            barrier.wait();
            match prepared {
                Ok(prepared) if !abort.load(Ordering::SeqCst) => Some(run_prepared(prepared)),
                _ => None,
            }
        }));
    }
    drop(setup_sender);
    let mut setup = Ok(());
    // Exactly one message per thread (the senders stay alive until the threads end, so
    // iterating until the channel closes would wait forever).
    for outcome in setup_receiver.iter().take(task_count) {
        if let (Ok(()), Err(e)) = (&setup, outcome) {
            setup = Err(e);
        }
    }
    let start = gate(setup);
    abort.store(!start, Ordering::SeqCst);
    barrier.wait();
    let mut results = Vec::with_capacity(handles.len());
    for handle in handles {
        match handle.join() {
            Ok(Some(result)) => results.push(result),
            Ok(None) => {}
            Err(_) => {
                let mut result = Meter::start().finish(Some(
                    "benchmark thread panicked (a bug in mako-bench; please report it)".into(),
                ));
                result.end_ns = result.start_ns;
                results.push(result);
            }
        }
    }
    start.then_some(results)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(access: Access, streams: u64, rank: u64) -> StreamSpec {
        StreamSpec {
            path: PathBuf::from("/nonexistent"),
            direction: Direction::Write,
            create: false,
            truncate: false,
            access,
            record_bytes: 4096,
            segment_records: 5,
            stride_bytes: 3 * 4096,
            streams,
            rank,
            ops_max: 5,
            time_limit_ms: None,
            seed: 1,
            direct: false,
            fsync: false,
            verify: true,
        }
    }

    #[test]
    fn shared_interleaving_gives_record_i_to_stream_i_mod_t() {
        // Record i of the shared file sits at i * r and belongs to stream i mod T.
        let streams = 3;
        for rank in 0..streams {
            let s = spec(Access::Seq, streams, rank);
            for slot in 0..5 {
                let offset = s.slot_offset(slot);
                let record = offset / 4096;
                assert_eq!(offset % 4096, 0);
                assert_eq!(record % streams, rank);
                assert_eq!(record, slot * streams + rank);
            }
        }
        assert_eq!(spec(Access::Seq, 3, 2).required_file_bytes(), 15 * 4096);
        assert_eq!(spec(Access::Seq, 1, 0).required_file_bytes(), 5 * 4096);
        // Strided: 4 gaps of 3 records, then the last record.
        assert_eq!(
            spec(Access::Strided, 1, 0).required_file_bytes(),
            4 * 3 * 4096 + 4096
        );
    }
}
