//! `mako perf`: gpfsperf/tsqosperf-style streaming I/O measurement on any path.
//!
//! `mako perf {create|write|read|rw} {seq|rand|strided} PATH` runs threads (and
//! optionally processes) that each move `-n` bytes in `-r` records, either in a file of
//! their own or interleaved in one shared file (`--shared`, ior-hard's layout), and
//! reports data rate, op rate, latency percentiles and thread utilisation.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::fs::OpenOptions;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context};
use serde::{Deserialize, Serialize};

use crate::histogram::{Histogram, LatencySummary};
use crate::pattern::DIRECT_IO_ALIGN_BYTES;
use crate::task::{run_tasks, Access, Direction, StreamSpec, Task, TaskResult};
use crate::units::{format_bytes, format_nanos, format_size_exact, parse_size};
use crate::worker::{worker_executable, ProcJob, WorkerPool};

/// What `mako perf` does to the files.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
pub enum PerfOp {
    /// Create (or truncate) the files and write them.
    Create,
    /// Overwrite existing files in place (absent files are created, and the report says so).
    Write,
    /// Read the files and verify their content.
    Read,
    /// Readers and writers at the same moment on separate files (tsqosperf-style).
    Rw,
}

fn size_arg(text: &str) -> Result<u64, String> {
    parse_size(text)
}

/// Arguments of `mako perf`, shaped like gpfsperf's.
#[derive(clap::Args, Clone, Debug)]
pub struct PerfArgs {
    /// create | write | read | rw
    #[arg(value_enum)]
    pub op: PerfOp,
    /// seq | rand | strided
    #[arg(value_enum)]
    pub access: Access,
    /// A file (threads use PATH.N, or PATH itself for one thread or --shared) or a
    /// directory (files mako-perf.N inside it).
    pub path: PathBuf,
    /// Record (transfer) size, e.g. 4k, 1m, 47008.
    #[arg(short = 'r', long = "record-size", default_value = "1m", value_parser = size_arg)]
    pub record_bytes: u64,
    /// Bytes per thread (the file segment each thread covers), e.g. 128m, 1g.
    #[arg(short = 'n', long = "bytes", default_value = "128m", value_parser = size_arg)]
    pub bytes_per_thread: u64,
    /// Threads per process (gpfsperf -th; `-th 16` works after `normalize_args`).
    #[arg(
        short = 't',
        long = "threads",
        visible_alias = "th",
        default_value_t = 1
    )]
    pub threads: u32,
    /// Processes, each running --threads threads.
    #[arg(long = "procs", default_value_t = 1)]
    pub procs: u32,
    /// Use O_DIRECT with aligned buffers (record size must be a multiple of 4096).
    #[arg(long)]
    pub dio: bool,
    /// fsync each file at the end; counted in the elapsed time.
    #[arg(long)]
    pub fsync: bool,
    /// Run for this many milliseconds (cycling through the segment) instead of -n once.
    #[arg(long)]
    pub millis: Option<u64>,
    /// One shared file; record i belongs to thread i mod (threads × procs).
    #[arg(long)]
    pub shared: bool,
    /// Distance between records for `strided` (default: 2 × record size).
    #[arg(long, value_parser = size_arg)]
    pub stride: Option<u64>,
    /// rw: reader threads per process (default: half of --threads).
    #[arg(long)]
    pub readers: Option<u32>,
    /// rw: writer threads per process (default: the other half).
    #[arg(long)]
    pub writers: Option<u32>,
    /// Seed for `rand` (the same seed repeats the same offsets).
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Do not check the content of records read.
    #[arg(long)]
    pub no_verify: bool,
    /// Print the report as JSON instead of text.
    #[arg(long)]
    pub json: bool,
    /// Executable to start as worker process (default: this one).
    #[arg(long, hide = true)]
    pub worker_exe: Option<PathBuf>,
}

/// Figures for one thread.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ThreadReport {
    pub process: u32,
    pub thread: u32,
    pub file: PathBuf,
    pub bytes: u64,
    pub ops: u64,
    pub elapsed_s: f64,
    pub mib_per_s: f64,
    /// Fraction of the thread's wall time spent inside I/O system calls.
    pub utilization: f64,
}

/// Figures for the readers or the writers of a run.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct GroupReport {
    /// "read" or "write".
    pub role: String,
    pub threads: u64,
    pub bytes: u64,
    pub ops: u64,
    pub elapsed_s: f64,
    pub mb_per_s: f64,
    pub mib_per_s: f64,
    pub ops_per_s: f64,
    pub latency: LatencySummary,
    /// Mean over threads of the fraction of time spent in I/O system calls.
    pub thread_utilization: f64,
    pub thread_utilization_min: f64,
    pub thread_utilization_max: f64,
    pub verify_errors: u64,
    pub first_verify_error: Option<String>,
    pub per_thread: Vec<ThreadReport>,
}

/// Everything `mako perf` measured; the JSON output is this structure.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct PerfReport {
    pub command: String,
    pub op: PerfOp,
    pub access: Access,
    pub path: PathBuf,
    pub record_bytes: u64,
    pub bytes_per_thread: u64,
    pub segment_records: u64,
    pub stride_bytes: u64,
    pub processes: u32,
    pub threads_per_process: u32,
    pub direct_io: bool,
    pub fsync: bool,
    pub time_limit_ms: Option<u64>,
    pub shared_file: bool,
    pub verify: bool,
    pub files: Vec<PathBuf>,
    pub notes: Vec<String>,
    /// One group for create/write/read, "write" then "read" for rw.
    pub groups: Vec<GroupReport>,
    /// rw only: write rate / read rate (seed 003: "Write = 2 x Read").
    pub write_read_ratio: Option<f64>,
    pub verify_errors: u64,
}

/// Rewrites gpfsperf's single-dash long options (`-th 16`, `-dio`, `-fsync`,
/// `-millis 5000`) into the `--` forms clap understands, so the admins' command lines
/// work unchanged. Other arguments are passed through.
pub fn normalize_args<I, T>(args: I) -> Vec<std::ffi::OsString>
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString>,
{
    args.into_iter()
        .map(|arg| {
            let arg: std::ffi::OsString = arg.into();
            match arg.to_str() {
                Some("-th") => "--threads".into(),
                Some("-dio") => "--dio".into(),
                Some("-fsync") => "--fsync".into(),
                Some("-millis") => "--millis".into(),
                Some("-procs") => "--procs".into(),
                _ => arg,
            }
        })
        .collect()
}

/// One planned thread.
struct PlannedStream {
    process: u32,
    thread: u32,
    role: Direction,
    spec: StreamSpec,
}

struct Plan {
    streams: Vec<PlannedStream>,
    segment_records: u64,
    stride_bytes: u64,
    notes: Vec<String>,
}

fn role_name(role: Direction) -> &'static str {
    match role {
        Direction::Read => "read",
        Direction::Write => "write",
    }
}

/// Validates the arguments and decides which thread touches which file where.
fn plan(args: &PerfArgs) -> anyhow::Result<Plan> {
    let mut notes = Vec::new();
    if args.record_bytes == 0 {
        bail!("record size -r is 0; give e.g. -r 4k or -r 1m");
    }
    if args.threads == 0 || args.procs == 0 {
        bail!("--threads and --procs must be at least 1");
    }
    if args.bytes_per_thread < args.record_bytes {
        bail!(
            "-n {} is smaller than one record (-r {}); give -n of at least one record",
            format_size_exact(args.bytes_per_thread),
            format_size_exact(args.record_bytes)
        );
    }
    let segment_records = args.bytes_per_thread / args.record_bytes;
    if args.bytes_per_thread % args.record_bytes != 0 {
        notes.push(format!(
            "-n {} is not a whole number of records; using {segment_records} records ({} bytes) per thread",
            args.bytes_per_thread,
            segment_records * args.record_bytes
        ));
    }
    let stride_bytes = match args.access {
        Access::Strided => args.stride.unwrap_or(2 * args.record_bytes),
        _ => args.record_bytes,
    };
    if stride_bytes < args.record_bytes {
        bail!(
            "--stride {stride_bytes} is smaller than the record size {}; records would overlap",
            args.record_bytes
        );
    }
    if args.dio {
        let align = DIRECT_IO_ALIGN_BYTES as u64;
        if args.record_bytes % align != 0 {
            bail!(
                "--dio needs a record size that is a multiple of {align} bytes, but -r is {} \
                 (O_DIRECT transfers must be block aligned; ior-hard's 47008 cannot use direct I/O). \
                 Use e.g. -r 4k or -r 1m, or drop --dio",
                args.record_bytes
            );
        }
        if stride_bytes % align != 0 {
            bail!("--dio needs --stride to be a multiple of {align} bytes, got {stride_bytes}");
        }
    }
    if args.op != PerfOp::Rw && (args.readers.is_some() || args.writers.is_some()) {
        bail!("--readers/--writers only apply to `mako perf rw`");
    }
    // Threads per process for each role.
    let (writers, readers) = match args.op {
        PerfOp::Create | PerfOp::Write => (args.threads, 0),
        PerfOp::Read => (0, args.threads),
        PerfOp::Rw => {
            let writers = args.writers.unwrap_or_else(|| {
                args.readers.map_or((args.threads / 2).max(1), |r| {
                    args.threads.saturating_sub(r).max(1)
                })
            });
            let readers = args
                .readers
                .unwrap_or_else(|| args.threads.saturating_sub(writers).max(1));
            if writers == 0 || readers == 0 {
                bail!("rw needs at least one reader and one writer thread per process");
            }
            (writers, readers)
        }
    };
    let is_dir = args.path.is_dir();
    let rw = args.op == PerfOp::Rw;
    let mut streams = Vec::new();
    for (role, per_process) in [(Direction::Write, writers), (Direction::Read, readers)] {
        let total = per_process as u64 * args.procs as u64;
        for process in 0..args.procs {
            for index in 0..per_process {
                let global = process as u64 * per_process as u64 + index as u64;
                let role_tag = if rw {
                    if role == Direction::Write {
                        "w"
                    } else {
                        "r"
                    }
                } else {
                    ""
                };
                let path = file_path(&args.path, is_dir, args.shared, total, rw, role_tag, global);
                let spec = StreamSpec {
                    path,
                    direction: role,
                    create: false,
                    truncate: false,
                    access: args.access,
                    record_bytes: args.record_bytes,
                    segment_records,
                    stride_bytes,
                    streams: if args.shared { total } else { 1 },
                    rank: if args.shared { global } else { 0 },
                    ops_max: if args.millis.is_some() {
                        u64::MAX
                    } else {
                        segment_records
                    },
                    time_limit_ms: args.millis,
                    seed: crate::pattern::mix64(
                        args.seed ^ (global << 1 | (role == Direction::Read) as u64),
                    ),
                    direct: args.dio,
                    fsync: args.fsync,
                    verify: !args.no_verify,
                };
                streams.push(PlannedStream {
                    process,
                    thread: index + if role == Direction::Read { writers } else { 0 },
                    role,
                    spec,
                });
            }
        }
    }
    Ok(Plan {
        streams,
        segment_records,
        stride_bytes,
        notes,
    })
}

/// The file a stream uses (see `PerfArgs::path`).
fn file_path(
    path: &Path,
    is_dir: bool,
    shared: bool,
    total: u64,
    rw: bool,
    role_tag: &str,
    global: u64,
) -> PathBuf {
    let base = if is_dir {
        path.join("mako-perf")
    } else {
        path.to_path_buf()
    };
    let mut name = base.into_os_string();
    if shared {
        if is_dir {
            name.push(".shared");
        }
        if rw {
            name.push(format!(".{role_tag}"));
        }
    } else if is_dir || rw || total > 1 {
        name.push(format!(".{role_tag}{global}"));
    }
    PathBuf::from(name)
}

/// Creates, truncates or checks the files before the clock starts.
fn prepare_files(args: &PerfArgs, plan: &mut Plan) -> anyhow::Result<Vec<PathBuf>> {
    let mut writer_files = BTreeSet::new();
    let mut reader_files = BTreeSet::new();
    for stream in &plan.streams {
        let set = if stream.role == Direction::Write {
            &mut writer_files
        } else {
            &mut reader_files
        };
        set.insert(stream.spec.path.clone());
    }
    let mut created = 0;
    for path in &writer_files {
        let existed = path.exists();
        let mut options = OpenOptions::new();
        options.write(true).create(true);
        // create truncates so it measures writing a new file; write keeps the blocks
        // so it measures overwriting allocated space.
        if args.op == PerfOp::Create {
            options.truncate(true);
        }
        options.open(path).with_context(|| {
            format!(
                "cannot create {}; check that the directory exists and is writable",
                path.display()
            )
        })?;
        if !existed {
            created += 1;
        }
    }
    match args.op {
        PerfOp::Create => plan.notes.push(format!(
            "{} file(s) created or truncated",
            writer_files.len()
        )),
        PerfOp::Write | PerfOp::Rw => plan.notes.push(format!(
            "writers: {} existing file(s) overwritten in place, {created} absent file(s) created",
            writer_files.len() - created
        )),
        PerfOp::Read => {}
    }
    if args.op == PerfOp::Rw {
        fill_reader_files(plan, &reader_files)?;
    }
    Ok(writer_files.into_iter().chain(reader_files).collect())
}

/// rw is self-contained: reader files that are absent or too short are written now,
/// untimed, so the readers have something to read.
fn fill_reader_files(plan: &mut Plan, files: &BTreeSet<PathBuf>) -> anyhow::Result<()> {
    // A shared file is complete only if it holds every reader's records.
    let mut needed = std::collections::BTreeMap::<PathBuf, u64>::new();
    for stream in plan.streams.iter().filter(|s| s.role == Direction::Read) {
        let entry = needed.entry(stream.spec.path.clone()).or_default();
        *entry = (*entry).max(stream.spec.required_file_bytes());
    }
    let short: BTreeSet<PathBuf> = needed
        .into_iter()
        .filter(|(path, bytes)| std::fs::metadata(path).map(|m| m.len()).unwrap_or(0) < *bytes)
        .map(|(path, _)| path)
        .collect();
    let mut tasks = Vec::new();
    for stream in plan
        .streams
        .iter()
        .filter(|s| s.role == Direction::Read && short.contains(&s.spec.path))
    {
        let mut spec = stream.spec.clone();
        spec.direction = Direction::Write;
        spec.create = true;
        spec.access = match spec.access {
            Access::Rand => Access::Seq,
            other => other,
        };
        spec.ops_max = spec.segment_records;
        spec.time_limit_ms = None;
        spec.fsync = true;
        tasks.push(Task::Stream(spec));
    }
    if tasks.is_empty() {
        return Ok(());
    }
    let mut setup_error = None;
    let results = run_tasks(tasks, &mut |setup| {
        setup.map_err(|e| setup_error = Some(e)).is_ok()
    })
    .ok_or_else(|| {
        anyhow!(
            "preparing reader files: {}",
            setup_error.unwrap_or_default()
        )
    })?;
    for result in &results {
        if let Some(e) = &result.error {
            bail!("preparing reader files: {e}");
        }
    }
    let bytes: u64 = results.iter().map(|r| r.bytes).sum();
    plan.notes.push(format!(
        "readers: wrote {} into {} of {} reader file(s) before the timed run (untimed)",
        format_bytes(bytes),
        short.len(),
        files.len()
    ));
    Ok(())
}

/// Runs the planned streams: in this process for `--procs 1`, else in worker processes.
fn execute(args: &PerfArgs, plan: &Plan) -> anyhow::Result<Vec<TaskResult>> {
    if args.procs == 1 {
        let tasks = plan
            .streams
            .iter()
            .map(|s| Task::Stream(s.spec.clone()))
            .collect();
        let mut setup_error = None;
        return run_tasks(tasks, &mut |setup| {
            setup.map_err(|e| setup_error = Some(e)).is_ok()
        })
        .ok_or_else(|| anyhow!("{}", setup_error.unwrap_or_default()));
    }
    let executable = worker_executable(args.worker_exe.as_ref())?;
    let mut pool = WorkerPool::start(args.procs as usize, &executable)?;
    let mut jobs: Vec<ProcJob> = (0..args.procs)
        .map(|_| ProcJob { tasks: Vec::new() })
        .collect();
    let mut order: Vec<Vec<usize>> = vec![Vec::new(); args.procs as usize];
    for (index, stream) in plan.streams.iter().enumerate() {
        jobs[stream.process as usize]
            .tasks
            .push(Task::Stream(stream.spec.clone()));
        order[stream.process as usize].push(index);
    }
    let per_process = pool.run(jobs)?;
    // Put results back in plan order.
    let mut results: Vec<Option<TaskResult>> = vec![None; plan.streams.len()];
    for (process, process_results) in per_process.into_iter().enumerate() {
        for (slot, result) in order[process].iter().zip(process_results) {
            results[*slot] = Some(result);
        }
    }
    results
        .into_iter()
        .map(|r| r.ok_or_else(|| anyhow!("a worker returned fewer results than threads")))
        .collect()
}

fn group_report(role: Direction, plan: &Plan, results: &[TaskResult]) -> Option<GroupReport> {
    let members: Vec<(&PlannedStream, &TaskResult)> = plan
        .streams
        .iter()
        .zip(results)
        .filter(|(stream, _)| stream.role == role)
        .collect();
    if members.is_empty() {
        return None;
    }
    let start = members.iter().map(|(_, r)| r.start_ns).min().unwrap_or(0);
    let end = members.iter().map(|(_, r)| r.end_ns).max().unwrap_or(0);
    let elapsed_s = (end.saturating_sub(start) as f64 / 1e9).max(1e-9);
    let mut histogram = Histogram::new();
    let mut per_thread = Vec::new();
    let (mut bytes, mut ops, mut verify_errors) = (0, 0, 0);
    let mut first_verify_error = None;
    for (stream, result) in &members {
        if let Ok(h) = Histogram::from_sparse(&result.latency) {
            histogram.merge(&h);
        }
        bytes += result.bytes;
        ops += result.ops;
        verify_errors += result.verify_errors;
        if first_verify_error.is_none() {
            first_verify_error = result.first_verify_error.clone();
        }
        let thread_elapsed = (result.elapsed_ns() as f64 / 1e9).max(1e-9);
        per_thread.push(ThreadReport {
            process: stream.process,
            thread: stream.thread,
            file: stream.spec.path.clone(),
            bytes: result.bytes,
            ops: result.ops,
            elapsed_s: thread_elapsed,
            mib_per_s: result.bytes as f64 / (1 << 20) as f64 / thread_elapsed,
            utilization: (result.io_ns as f64 / 1e9 / thread_elapsed).min(1.0),
        });
    }
    let utilizations: Vec<f64> = per_thread.iter().map(|t| t.utilization).collect();
    Some(GroupReport {
        role: role_name(role).to_string(),
        threads: members.len() as u64,
        bytes,
        ops,
        elapsed_s,
        mb_per_s: bytes as f64 / 1e6 / elapsed_s,
        mib_per_s: bytes as f64 / (1 << 20) as f64 / elapsed_s,
        ops_per_s: ops as f64 / elapsed_s,
        latency: histogram.summary(),
        thread_utilization: utilizations.iter().sum::<f64>() / utilizations.len() as f64,
        thread_utilization_min: utilizations.iter().cloned().fold(f64::INFINITY, f64::min),
        thread_utilization_max: utilizations.iter().cloned().fold(0.0, f64::max),
        verify_errors,
        first_verify_error,
        per_thread,
    })
}

fn op_name(op: PerfOp) -> &'static str {
    match op {
        PerfOp::Create => "create",
        PerfOp::Write => "write",
        PerfOp::Read => "read",
        PerfOp::Rw => "rw",
    }
}

fn access_name(access: Access) -> &'static str {
    match access {
        Access::Seq => "seq",
        Access::Rand => "rand",
        Access::Strided => "strided",
    }
}

/// Runs `mako perf`, prints the report (text, or JSON with `--json`) and returns it.
///
/// A verification failure prints the report and then returns an error, so the
/// command's exit code is nonzero.
pub fn run_perf(args: &PerfArgs) -> anyhow::Result<PerfReport> {
    let mut plan = plan(args)?;
    let files = prepare_files(args, &mut plan)?;
    let results = execute(args, &plan)?;
    for (stream, result) in plan.streams.iter().zip(&results) {
        if let Some(e) = &result.error {
            bail!(
                "process {} thread {}: {e} (after {} of I/O)",
                stream.process,
                stream.thread,
                format_bytes(result.bytes)
            );
        }
    }
    let groups: Vec<GroupReport> = [Direction::Write, Direction::Read]
        .into_iter()
        .filter_map(|role| group_report(role, &plan, &results))
        .collect();
    let write_read_ratio = if args.op == PerfOp::Rw && groups.len() == 2 && groups[1].mb_per_s > 0.0
    {
        Some(groups[0].mb_per_s / groups[1].mb_per_s)
    } else {
        None
    };
    let verify_errors = groups.iter().map(|g| g.verify_errors).sum();
    let report = PerfReport {
        command: format!(
            "mako perf {} {} {}",
            op_name(args.op),
            access_name(args.access),
            args.path.display()
        ),
        op: args.op,
        access: args.access,
        path: args.path.clone(),
        record_bytes: args.record_bytes,
        bytes_per_thread: args.bytes_per_thread,
        segment_records: plan.segment_records,
        stride_bytes: plan.stride_bytes,
        processes: args.procs,
        threads_per_process: args.threads,
        direct_io: args.dio,
        fsync: args.fsync,
        time_limit_ms: args.millis,
        shared_file: args.shared,
        verify: !args.no_verify,
        files,
        notes: plan.notes,
        groups,
        write_read_ratio,
        verify_errors,
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", format_perf_text(&report));
    }
    if report.verify_errors > 0 {
        let first = report
            .groups
            .iter()
            .find_map(|g| g.first_verify_error.clone())
            .unwrap_or_default();
        eprintln!(
            "!!! VERIFICATION FAILED: {} record(s) read back wrong. First: {first}",
            report.verify_errors
        );
        bail!(
            "verification failed: {} record(s) differ from what was written (first: {first}); \
             if these files were not written by mako perf, rerun with --no-verify",
            report.verify_errors
        );
    }
    Ok(report)
}

/// The text report, laid out like gpfsperf's so the familiar last line is there.
pub fn format_perf_text(report: &PerfReport) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "{}", report.command);
    let _ = writeln!(
        out,
        "  recSize {} nBytes {} per thread ({} records){}",
        format_size_exact(report.record_bytes),
        format_size_exact(report.record_bytes * report.segment_records),
        report.segment_records,
        if report.access == Access::Strided {
            format!(", stride {}", format_size_exact(report.stride_bytes))
        } else {
            String::new()
        }
    );
    let _ = writeln!(
        out,
        "  nProcesses {} nThreadsPerProcess {}, {}",
        report.processes,
        report.threads_per_process,
        if report.shared_file {
            "one shared file, records interleaved across threads".to_string()
        } else {
            format!("file per thread ({} files)", report.files.len())
        }
    );
    let _ = writeln!(
        out,
        "  {}, {}, {}",
        if report.direct_io {
            "using direct I/O"
        } else {
            "not using direct I/O"
        },
        if report.fsync {
            "fsync at end of test"
        } else {
            "no fsync at end of test"
        },
        match report.time_limit_ms {
            Some(ms) => format!("time limit {ms} ms (offsets cycle through the same file segment)"),
            None => "stops after nBytes".to_string(),
        }
    );
    let _ = writeln!(
        out,
        "  {}",
        if report.verify {
            "content verified on read"
        } else {
            "content NOT verified (--no-verify)"
        }
    );
    for note in &report.notes {
        let _ = writeln!(out, "  note: {note}");
    }
    for group in &report.groups {
        let _ = writeln!(
            out,
            "{}: {} bytes ({}) in {:.3} s by {} thread(s)",
            group.role,
            group.bytes,
            format_bytes(group.bytes),
            group.elapsed_s,
            group.threads
        );
        let _ = writeln!(
            out,
            "  data rate    {:.2} MB/s ({:.2} MiB/s)",
            group.mb_per_s, group.mib_per_s
        );
        let _ = writeln!(
            out,
            "  op rate      {:.1} ops/s ({} ops)",
            group.ops_per_s, group.ops
        );
        let latency = &group.latency;
        let _ = writeln!(
            out,
            "  latency      avg {}  p50 {}  p99 {}  p99.9 {}  max {}",
            format_nanos(latency.avg_ns),
            format_nanos(latency.p50_ns as f64),
            format_nanos(latency.p99_ns as f64),
            format_nanos(latency.p999_ns as f64),
            format_nanos(latency.max_ns as f64)
        );
        let _ = writeln!(
            out,
            "  thread util  {:.3} (min {:.3}, max {:.3}; fraction of time inside I/O calls)",
            group.thread_utilization, group.thread_utilization_min, group.thread_utilization_max
        );
        if group.verify_errors > 0 {
            let _ = writeln!(
                out,
                "  !!! VERIFY   {} record(s) WRONG; first: {}",
                group.verify_errors,
                group.first_verify_error.as_deref().unwrap_or("")
            );
        }
        const SHOWN_THREADS_MAX: usize = 64;
        let _ = writeln!(
            out,
            "  proc thread        bytes      ops     MiB/s   util  file"
        );
        for thread in group.per_thread.iter().take(SHOWN_THREADS_MAX) {
            let _ = writeln!(
                out,
                "  {:>4} {:>6} {:>12} {:>8} {:>9.2} {:>6.3}  {}",
                thread.process,
                thread.thread,
                thread.bytes,
                thread.ops,
                thread.mib_per_s,
                thread.utilization,
                thread.file.display()
            );
        }
        if group.per_thread.len() > SHOWN_THREADS_MAX {
            let _ = writeln!(
                out,
                "  ... {} more threads (see --json)",
                group.per_thread.len() - SHOWN_THREADS_MAX
            );
        }
        // gpfsperf's summary line (Kbytes = 1000 bytes), for scripts that grep it.
        let _ = writeln!(
            out,
            "  Data rate was {:.2} Kbytes/sec, Op Rate was {:.2} Ops/sec, Avg Latency was {:.3} milliseconds, thread utilization {:.3}, bytesTransferred {}",
            group.mb_per_s * 1000.0,
            group.ops_per_s,
            group.latency.avg_ns / 1e6,
            group.thread_utilization,
            group.bytes
        );
    }
    if let Some(ratio) = report.write_read_ratio {
        let _ = writeln!(
            out,
            "write/read ratio {ratio:.2} (1.00 = fair; 2.00 = writes get twice the rate of reads)"
        );
    }
    out
}
