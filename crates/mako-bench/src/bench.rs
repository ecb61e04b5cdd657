//! `mako bench`: io500-style phases (ior-easy/hard, random 4K, mdtest-easy/hard, find)
//! run by N worker processes on any directory, with the io500 score, optional
//! comparison against a reference directory, JSON and SVG output.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use anyhow::{anyhow, bail, Context};
use serde::{Deserialize, Serialize};

use crate::cache::{drop_caches, CacheDrop};
use crate::histogram::{Histogram, LatencySummary};
use crate::score::{io500_score, Score};
use crate::task::{Access, Direction, FindSpec, MdOp, MdSpec, StreamSpec, Task, TaskResult};
use crate::units::{format_bytes, format_nanos, parse_size};
use crate::worker::{worker_executable, ProcJob, WorkerPool};
use crate::BenchHooks;

/// Preset sizes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
pub enum BenchSize {
    /// Seconds: for CI and smoke tests.
    Small,
    /// About 1–3 minutes on a local disk with 2 processes.
    Default,
}

fn size_arg(text: &str) -> Result<u64, String> {
    parse_size(text)
}

/// Which phases `mako bench` runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
pub enum BenchSuite {
    /// The io500-style phases (ior-easy/hard, mdtest-easy/hard, find).
    Io500,
    /// Metadata only, for the kernel's caches: creates and stats in private directories
    /// and in one shared directory, `find` by names and types and `find` with a stat of
    /// every entry after the caches were dropped, deletes. `--md-easy-files` files per
    /// process in each of the private and the shared directories.
    Meta,
}

/// Arguments of `mako bench`.
#[derive(clap::Args, Clone, Debug)]
pub struct BenchArgs {
    /// Directory to benchmark (a Mako mount, a local disk, tmpfs …). A private
    /// subdirectory is created in it and removed at the end.
    pub dir: PathBuf,
    /// Worker processes.
    #[arg(short = 'N', long = "procs", default_value_t = 2)]
    pub procs: u32,
    /// Preset sizes; the flags below override single values.
    #[arg(long, value_enum, default_value = "default")]
    pub size: BenchSize,
    /// Which phases: the io500-style ones, or `meta` (creates, stats, finds, deletes).
    #[arg(long, value_enum, default_value = "io500")]
    pub suite: BenchSuite,
    /// Another mount point of the same file system as DIR (another node's mount of it):
    /// process p works through mount p mod (1 + number of --also), so the processes of
    /// one run share the file system from several nodes (every suite; a process reading
    /// another's data reads it through its own mount). Each phase then also prints the
    /// figure through each mount, and the pagepool of every mount's node is dropped
    /// before the read phases. Only the target uses them, not --compare's reference.
    #[arg(long = "also", value_name = "DIR")]
    pub also: Vec<PathBuf>,
    /// With `--suite meta`: only the private directories (no shared-directory phases).
    #[arg(long)]
    pub skip_shared: bool,
    /// ior-easy bytes per process (file per process, 1 MiB transfers).
    #[arg(long, value_parser = size_arg)]
    pub easy_bytes: Option<u64>,
    /// ior-easy transfer size.
    #[arg(long, value_parser = size_arg, default_value = "1m")]
    pub easy_transfer: u64,
    /// ior-hard records (of --hard-transfer bytes) per process in the shared file.
    #[arg(long)]
    pub hard_records: Option<u64>,
    /// ior-hard record size (io500: 47008).
    #[arg(long, value_parser = size_arg, default_value = "47008")]
    pub hard_transfer: u64,
    /// Random 4 KiB reads per process over the ior-easy files.
    #[arg(long)]
    pub rnd4k_ops: Option<u64>,
    /// mdtest-easy files per process (empty, a directory per process).
    #[arg(long)]
    pub md_easy_files: Option<u64>,
    /// mdtest-hard files per process (in one shared directory).
    #[arg(long)]
    pub md_hard_files: Option<u64>,
    /// mdtest-hard file size (io500: 3901).
    #[arg(long, value_parser = size_arg, default_value = "3901")]
    pub md_hard_bytes: u64,
    /// fsync every file the mdtest write phases create, before closing it (mdtest -y):
    /// measures the cost of making each create durable. Not part of io500.
    #[arg(long)]
    pub md_fsync: bool,
    /// Stop each write phase after this many seconds (io500 stonewall); 0 = never.
    /// Reads then read exactly what was written.
    #[arg(long)]
    pub stonewall_secs: Option<f64>,
    /// Do not verify data read back.
    #[arg(long)]
    pub no_verify: bool,
    /// Do not drop caches before the read, stat and delete phases (neither the kernel's
    /// nor the hook's).
    #[arg(long)]
    pub no_drop_caches: bool,
    /// Keep the files instead of deleting them at the end.
    #[arg(long)]
    pub keep: bool,
    /// Write all results as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Write a bar chart as SVG to this file.
    #[arg(long)]
    pub svg: Option<PathBuf>,
    /// Run the same phases (same sizes) on this reference directory and compare.
    #[arg(long)]
    pub compare: Option<PathBuf>,
    /// With --compare: run target then reference this many times and compare the
    /// medians (each phase's ratio is the median of the per-pair ratios, with its
    /// range). Use it where the disk's speed varies from minute to minute (VMs).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=99))]
    pub repeat: u32,
    /// Executable to start as worker process (default: this one).
    #[arg(long, hide = true)]
    pub worker_exe: Option<PathBuf>,
}

/// The sizes a run used, after presets and overrides.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct BenchConfig {
    pub procs: u32,
    pub easy_bytes_per_proc: u64,
    pub easy_transfer_bytes: u64,
    pub hard_records_per_proc: u64,
    pub hard_transfer_bytes: u64,
    pub rnd4k_ops_per_proc: u64,
    pub md_easy_files_per_proc: u64,
    pub md_hard_files_per_proc: u64,
    pub md_hard_file_bytes: u64,
    pub stonewall_secs: f64,
    pub verify: bool,
    /// mdtest -y: each created file is fsynced.
    #[serde(default)]
    pub md_fsync: bool,
}

impl BenchConfig {
    pub fn from_args(args: &BenchArgs) -> anyhow::Result<BenchConfig> {
        // (easy bytes, hard records, rnd4k ops, md-easy files, md-hard files, stonewall s)
        let preset: (u64, u64, u64, u64, u64, f64) = match args.size {
            BenchSize::Small => (8 << 20, 64, 256, 200, 100, 30.0),
            BenchSize::Default => (2 << 30, 8192, 40_000, 50_000, 20_000, 30.0),
        };
        let config = BenchConfig {
            procs: args.procs,
            easy_bytes_per_proc: args.easy_bytes.unwrap_or(preset.0),
            easy_transfer_bytes: args.easy_transfer,
            hard_records_per_proc: args.hard_records.unwrap_or(preset.1),
            hard_transfer_bytes: args.hard_transfer,
            rnd4k_ops_per_proc: args.rnd4k_ops.unwrap_or(preset.2),
            md_easy_files_per_proc: args.md_easy_files.unwrap_or(preset.3),
            md_hard_files_per_proc: args.md_hard_files.unwrap_or(preset.4),
            md_hard_file_bytes: args.md_hard_bytes,
            stonewall_secs: args.stonewall_secs.unwrap_or(preset.5),
            verify: !args.no_verify,
            md_fsync: args.md_fsync,
        };
        if config.procs == 0 {
            bail!("-N must be at least 1 process");
        }
        if config.easy_transfer_bytes < 4096 || config.easy_transfer_bytes % 4096 != 0 {
            bail!(
                "--easy-transfer must be a multiple of 4 KiB (the random 4K phase reads inside it), got {}",
                config.easy_transfer_bytes
            );
        }
        if config.easy_bytes_per_proc < config.easy_transfer_bytes {
            bail!("--easy-bytes must hold at least one --easy-transfer");
        }
        if config.hard_transfer_bytes == 0 || config.hard_records_per_proc == 0 {
            bail!("--hard-transfer and --hard-records must be at least 1");
        }
        if config.md_easy_files_per_proc == 0 || config.md_hard_files_per_proc == 0 {
            bail!("--md-easy-files and --md-hard-files must be at least 1");
        }
        if !config.stonewall_secs.is_finite() || config.stonewall_secs < 0.0 {
            bail!("--stonewall-secs must be 0 (off) or a positive number of seconds");
        }
        Ok(config)
    }

    fn stonewall_ms(&self) -> Option<u64> {
        (self.stonewall_secs > 0.0).then(|| ((self.stonewall_secs * 1000.0).ceil() as u64).max(1))
    }

    fn easy_records(&self) -> u64 {
        self.easy_bytes_per_proc / self.easy_transfer_bytes
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum PhaseKind {
    /// Reported in GiB/s.
    Bandwidth,
    /// Reported in kIOPS.
    Metadata,
}

/// One phase's figures.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct PhaseResult {
    pub name: String,
    pub kind: PhaseKind,
    /// Whether the io500 score includes this phase.
    pub in_score: bool,
    pub value: f64,
    pub unit: String,
    pub seconds: f64,
    pub ops: u64,
    pub bytes: u64,
    pub latency: LatencySummary,
    pub stonewalled: bool,
    /// For read phases: whether caches were dropped before it.
    pub cache: Option<String>,
    pub verify_errors: u64,
    pub first_verify_error: Option<String>,
    /// With several mounts (`--also`): the phase's figure through each of them, in the
    /// order DIR, then the `--also` mounts. Empty with one mount.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub per_mount: Vec<MountFigure>,
}

/// One mount's share of a phase: the processes that worked through it, timed from the
/// first of them starting to the last finishing.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct MountFigure {
    pub mount: PathBuf,
    pub procs: u32,
    pub value: f64,
    pub seconds: f64,
    pub ops: u64,
    pub bytes: u64,
}

/// All phases on one directory.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct BenchRun {
    pub dir: PathBuf,
    pub phases: Vec<PhaseResult>,
    pub score: Score,
    pub elapsed_s: f64,
}

/// target / reference for one phase.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct PhaseRatio {
    pub phase: String,
    pub unit: String,
    pub target: f64,
    pub reference: f64,
    /// None when the reference value is 0.
    pub ratio: Option<f64>,
}

/// Everything `mako bench` measured; `--json` writes this.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct BenchReport {
    pub config: BenchConfig,
    pub target: BenchRun,
    pub reference: Option<BenchRun>,
    /// With `--repeat N`: the median of the N per-pair ratios of each phase (and the
    /// median values); otherwise the one pair's ratios.
    pub ratios: Vec<PhaseRatio>,
    /// With `--repeat N` (N > 1): every pair's ratios, in run order.
    #[serde(default)]
    pub repeats: Vec<Vec<PhaseRatio>>,
    pub verify_errors: u64,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    match v.len() {
        0 => 0.0,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// Phase by phase, the median target and reference values and the median ratio of
/// several (target, reference) pairs.
pub fn median_ratios(pairs: &[Vec<PhaseRatio>]) -> Vec<PhaseRatio> {
    let Some(first) = pairs.first() else {
        return Vec::new();
    };
    first
        .iter()
        .map(|r| {
            let same: Vec<&PhaseRatio> = pairs
                .iter()
                .filter_map(|p| p.iter().find(|x| x.phase == r.phase))
                .collect();
            let ratios: Vec<f64> = same.iter().filter_map(|x| x.ratio).collect();
            PhaseRatio {
                phase: r.phase.clone(),
                unit: r.unit.clone(),
                target: median(same.iter().map(|x| x.target).collect()),
                reference: median(same.iter().map(|x| x.reference).collect()),
                ratio: (!ratios.is_empty()).then(|| median(ratios)),
            }
        })
        .collect()
}

/// Removes the benchmark's private directory when dropped (also on error), unless
/// `--keep`.
struct ScratchDir {
    root: PathBuf,
    keep: bool,
}

impl ScratchDir {
    fn create(parent: &Path, keep: bool) -> anyhow::Result<ScratchDir> {
        if !parent.is_dir() {
            bail!(
                "{} is not a directory; give an existing directory to benchmark",
                parent.display()
            );
        }
        let stamp = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis())
            .unwrap_or(0);
        let root = parent.join(format!("mako-bench.{}.{stamp}", std::process::id()));
        std::fs::create_dir(&root).with_context(|| {
            format!(
                "cannot create {}; is the directory writable?",
                root.display()
            )
        })?;
        Ok(ScratchDir { root, keep })
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        if self.keep {
            eprintln!("keeping benchmark files in {}", self.root.display());
            return;
        }
        if let Err(e) = std::fs::remove_dir_all(&self.root) {
            eprintln!(
                "warning: could not remove {}: {e}; delete it by hand",
                self.root.display()
            );
        }
    }
}

/// Runs the phases on one directory, printing each as it completes.
struct Suite<'a> {
    config: &'a BenchConfig,
    hooks: &'a BenchHooks,
    pool: &'a mut WorkerPool,
    drop_enabled: bool,
    phases: Vec<PhaseResult>,
    /// The mount points the processes work through: process p through
    /// `mounts[p % mounts.len()]` (DIR, then the `--also` mounts).
    mounts: Vec<PathBuf>,
}

/// A phase's figure over some of its processes' results: total ops or bytes over the
/// time from the first start to the last end.
fn figure(kind: PhaseKind, results: &[&TaskResult]) -> (f64, &'static str, f64, u64, u64) {
    let start = results.iter().map(|r| r.start_ns).min().unwrap_or(0);
    let end = results.iter().map(|r| r.end_ns).max().unwrap_or(0);
    let seconds = (end.saturating_sub(start) as f64 / 1e9).max(1e-9);
    let ops: u64 = results.iter().map(|r| r.ops).sum();
    let bytes: u64 = results.iter().map(|r| r.bytes).sum();
    let (value, unit) = match kind {
        PhaseKind::Bandwidth => (bytes as f64 / (1u64 << 30) as f64 / seconds, "GiB/s"),
        PhaseKind::Metadata => (ops as f64 / 1000.0 / seconds, "kIOPS"),
    };
    (value, unit, seconds, ops, bytes)
}

impl Suite<'_> {
    fn procs(&self) -> u64 {
        self.config.procs as u64
    }

    /// Runs one phase: one task per process, then aggregates and prints it.
    fn phase(
        &mut self,
        name: &str,
        kind: PhaseKind,
        in_score: bool,
        cache: Option<CacheDrop>,
        tasks: Vec<Task>,
    ) -> anyhow::Result<Vec<TaskResult>> {
        let jobs = tasks
            .into_iter()
            .map(|task| ProcJob { tasks: vec![task] })
            .collect();
        let results: Vec<TaskResult> = self
            .pool
            .run(jobs)
            .with_context(|| format!("phase {name}"))?
            .into_iter()
            .flatten()
            .collect();
        for (process, result) in results.iter().enumerate() {
            if let Some(e) = &result.error {
                bail!("phase {name}, process {process}: {e}");
            }
        }
        let all: Vec<&TaskResult> = results.iter().collect();
        let (value, unit, seconds, ops, bytes) = figure(kind, &all);
        let mounts = self.mounts.len().max(1);
        let per_mount: Vec<MountFigure> = if mounts > 1 {
            (0..mounts)
                .filter_map(|m| {
                    let mine: Vec<&TaskResult> = results.iter().skip(m).step_by(mounts).collect();
                    if mine.is_empty() {
                        return None;
                    }
                    let (value, _, seconds, ops, bytes) = figure(kind, &mine);
                    Some(MountFigure {
                        mount: self.mounts[m].clone(),
                        procs: mine.len() as u32,
                        value,
                        seconds,
                        ops,
                        bytes,
                    })
                })
                .collect()
        } else {
            Vec::new()
        };
        let mut histogram = Histogram::new();
        for result in &results {
            if let Ok(h) = Histogram::from_sparse(&result.latency) {
                histogram.merge(&h);
            }
        }
        let phase = PhaseResult {
            name: name.to_string(),
            kind,
            in_score,
            value,
            unit: unit.to_string(),
            seconds,
            ops,
            bytes,
            latency: histogram.summary(),
            stonewalled: results.iter().any(|r| r.stonewalled),
            cache: cache.map(|c| format!("{c:?}").to_lowercase()),
            verify_errors: results.iter().map(|r| r.verify_errors).sum(),
            first_verify_error: results.iter().find_map(|r| r.first_verify_error.clone()),
            per_mount,
        };
        println!("{}", format_phase_line(&phase));
        for m in &phase.per_mount {
            println!("{}", format_mount_line(&phase, m));
        }
        self.phases.push(phase);
        Ok(results)
    }

    /// Drops the kernel's caches and, through the hook, the pagepool of every mount's
    /// node (each `--also` mount is another node's).
    fn drop_caches(&self) -> anyhow::Result<CacheDrop> {
        let mut outcome = CacheDrop::Skipped;
        for (i, mount) in self.mounts.iter().enumerate() {
            // The kernel's caches are the machine's: dropping them once is enough.
            let hooks_only = i > 0 && outcome == CacheDrop::Dropped;
            let o = if hooks_only {
                match &self.hooks.drop_caches {
                    Some(hook) if self.drop_enabled => {
                        hook(mount).map_err(|e| {
                            e.context(format!("cache-drop hook for {}", mount.display()))
                        })?;
                        CacheDrop::Dropped
                    }
                    _ => CacheDrop::Dropped,
                }
            } else {
                drop_caches(mount, self.hooks, self.drop_enabled)?
            };
            if i == 0 {
                outcome = o;
            }
        }
        Ok(outcome)
    }

    /// The io500-style phases. `roots[p % roots.len()]` is the scratch directory as
    /// process p sees it (several mounts of one file system: several nodes); a process
    /// that reads another's data (io500's task reordering) reads it through its own
    /// mount, so with several nodes every read phase reads what another node wrote.
    fn run(&mut self, roots: &[PathBuf]) -> anyhow::Result<()> {
        let config = self.config;
        let procs = self.procs();
        let stonewall = config.stonewall_ms();
        let root = &roots[0];
        let root_of = |p: u64| &roots[p as usize % roots.len()];
        for dir in ["ior-easy", "ior-hard", "mdtest-easy", "mdtest-hard"] {
            let dir = root.join(dir);
            std::fs::create_dir(&dir)
                .with_context(|| format!("cannot create {}", dir.display()))?;
        }
        for p in 0..procs {
            let dir = root.join("mdtest-easy").join(format!("p{p}"));
            std::fs::create_dir(&dir)
                .with_context(|| format!("cannot create {}", dir.display()))?;
        }
        let hard_file_of = |p: u64| root_of(p).join("ior-hard").join("shared-file");
        std::fs::File::create(hard_file_of(0))
            .with_context(|| format!("cannot create {}", hard_file_of(0).display()))?;
        let md_easy_dir = |p: u64| root_of(p).join("mdtest-easy");
        let md_hard_dir = |p: u64| root_of(p).join("mdtest-hard");
        // Process p's view of process q's ior-easy file.
        let easy_file = |p: u64, q: u64| root_of(p).join("ior-easy").join(format!("file.p{q}"));
        // Readers use the data of the next process, like io500's task reordering, so a
        // process never reads back what it has just written itself.
        let shifted = |p: u64| (p + 1) % procs;
        let stream = |path: PathBuf, direction: Direction, record: u64, records: u64| StreamSpec {
            path,
            direction,
            create: direction == Direction::Write,
            truncate: direction == Direction::Write,
            access: Access::Seq,
            record_bytes: record,
            segment_records: records,
            stride_bytes: record,
            streams: 1,
            rank: 0,
            ops_max: records,
            time_limit_ms: if direction == Direction::Write {
                stonewall
            } else {
                None
            },
            seed: 0,
            direct: false,
            fsync: direction == Direction::Write,
            verify: config.verify,
        };
        let md = |dir: PathBuf, prefix: String, count: u64, op: MdOp| MdSpec {
            dir,
            prefix,
            first: 0,
            count,
            op,
            time_limit_ms: match op {
                MdOp::CreateEmpty | MdOp::CreateWrite { .. } => stonewall,
                _ => None,
            },
            fsync: config.md_fsync && matches!(op, MdOp::CreateEmpty | MdOp::CreateWrite { .. }),
            verify: config.verify,
        };

        // 1. ior-easy-write
        let tasks = (0..procs)
            .map(|p| {
                Task::Stream(stream(
                    easy_file(p, p),
                    Direction::Write,
                    config.easy_transfer_bytes,
                    config.easy_records(),
                ))
            })
            .collect();
        let easy_written: Vec<u64> = self
            .phase("ior-easy-write", PhaseKind::Bandwidth, true, None, tasks)?
            .iter()
            .map(|r| r.ops)
            .collect();

        // 2. mdtest-easy-write
        let tasks = (0..procs)
            .map(|p| {
                Task::Md(md(
                    md_easy_dir(p).join(format!("p{p}")),
                    "f.".into(),
                    config.md_easy_files_per_proc,
                    MdOp::CreateEmpty,
                ))
            })
            .collect();
        let md_easy_created: Vec<u64> = self
            .phase("mdtest-easy-write", PhaseKind::Metadata, true, None, tasks)?
            .iter()
            .map(|r| r.ops)
            .collect();

        // 3. ior-hard-write: process p writes records p, p+N, p+2N … of one shared file.
        // Process `view`'s part of the records of process `p`.
        let hard_stream = |view: u64, p: u64, direction: Direction, records: u64| {
            let mut spec = stream(
                hard_file_of(view),
                direction,
                config.hard_transfer_bytes,
                records,
            );
            spec.create = false;
            spec.truncate = false;
            spec.streams = procs;
            spec.rank = p;
            spec
        };
        let tasks = (0..procs)
            .map(|p| {
                Task::Stream(hard_stream(
                    p,
                    p,
                    Direction::Write,
                    config.hard_records_per_proc,
                ))
            })
            .collect();
        let hard_written: Vec<u64> = self
            .phase("ior-hard-write", PhaseKind::Bandwidth, true, None, tasks)?
            .iter()
            .map(|r| r.ops)
            .collect();

        // 4. mdtest-hard-write
        let hard_prefix = |p: u64| format!("f.p{p}.");
        let tasks = (0..procs)
            .map(|p| {
                Task::Md(md(
                    md_hard_dir(p),
                    hard_prefix(p),
                    config.md_hard_files_per_proc,
                    MdOp::CreateWrite {
                        bytes: config.md_hard_file_bytes,
                    },
                ))
            })
            .collect();
        let md_hard_created: Vec<u64> = self
            .phase("mdtest-hard-write", PhaseKind::Metadata, true, None, tasks)?
            .iter()
            .map(|r| r.ops)
            .collect();

        // 5. find: the top-level trees are dealt round-robin to the processes.
        let mut trees: Vec<PathBuf> = ["ior-easy", "ior-hard", "mdtest-hard"]
            .iter()
            .map(PathBuf::from)
            .collect();
        trees.extend((0..procs).map(|p| Path::new("mdtest-easy").join(format!("p{p}"))));
        let tasks = (0..procs)
            .map(|p| {
                Task::Find(FindSpec {
                    roots: trees
                        .iter()
                        .skip(p as usize)
                        .step_by(procs as usize)
                        .map(|t| root_of(p).join(t))
                        .collect(),
                    names_only: false,
                })
            })
            .collect();
        self.phase("find", PhaseKind::Metadata, true, None, tasks)?;

        // 6. ior-easy-read: exactly what was written.
        let cache = self.drop_caches()?;
        let tasks = (0..procs)
            .map(|p| {
                let q = shifted(p);
                Task::Stream(stream(
                    easy_file(p, q),
                    Direction::Read,
                    config.easy_transfer_bytes,
                    easy_written[q as usize],
                ))
            })
            .collect();
        self.phase(
            "ior-easy-read",
            PhaseKind::Bandwidth,
            true,
            Some(cache),
            tasks,
        )?;

        // 7. mdtest-easy-stat
        let tasks = (0..procs)
            .map(|p| {
                Task::Md(md(
                    md_easy_dir(p).join(format!("p{p}")),
                    "f.".into(),
                    md_easy_created[p as usize],
                    MdOp::Stat,
                ))
            })
            .collect();
        let cache = self.drop_caches()?;
        self.phase(
            "mdtest-easy-stat",
            PhaseKind::Metadata,
            true,
            Some(cache),
            tasks,
        )?;

        // 8. ior-hard-read: process p reads the records process p+1 wrote.
        let cache = self.drop_caches()?;
        let tasks = (0..procs)
            .map(|p| {
                let q = shifted(p);
                Task::Stream(hard_stream(p, q, Direction::Read, hard_written[q as usize]))
            })
            .collect();
        self.phase(
            "ior-hard-read",
            PhaseKind::Bandwidth,
            true,
            Some(cache),
            tasks,
        )?;

        // 9. ior-rnd4K-read: random 4 KiB reads inside what ior-easy wrote. Not part of
        //    the io500 score (it is an extended-list phase there).
        let cache = self.drop_caches()?;
        let tasks = (0..procs)
            .map(|p| {
                let q = shifted(p);
                let blocks = easy_written[q as usize] * config.easy_transfer_bytes / 4096;
                let mut spec = stream(easy_file(p, q), Direction::Read, 4096, blocks);
                spec.access = Access::Rand;
                spec.ops_max = if blocks == 0 {
                    0
                } else {
                    config.rnd4k_ops_per_proc
                };
                spec.seed = crate::pattern::mix64(p + 0x5eed);
                Task::Stream(spec)
            })
            .collect();
        self.phase(
            "ior-rnd4K-read",
            PhaseKind::Bandwidth,
            false,
            Some(cache),
            tasks,
        )?;

        // 10. mdtest-hard-stat
        let tasks = (0..procs)
            .map(|p| {
                Task::Md(md(
                    md_hard_dir(p),
                    hard_prefix(p),
                    md_hard_created[p as usize],
                    MdOp::Stat,
                ))
            })
            .collect();
        let cache = self.drop_caches()?;
        self.phase(
            "mdtest-hard-stat",
            PhaseKind::Metadata,
            true,
            Some(cache),
            tasks,
        )?;

        // 11. mdtest-easy-delete
        let tasks = (0..procs)
            .map(|p| {
                Task::Md(md(
                    md_easy_dir(p).join(format!("p{p}")),
                    "f.".into(),
                    md_easy_created[p as usize],
                    MdOp::Delete,
                ))
            })
            .collect();
        let cache = self.drop_caches()?;
        self.phase(
            "mdtest-easy-delete",
            PhaseKind::Metadata,
            true,
            Some(cache),
            tasks,
        )?;

        // 12. mdtest-hard-read: the files of the next process.
        let cache = self.drop_caches()?;
        let tasks = (0..procs)
            .map(|p| {
                let q = shifted(p);
                Task::Md(md(
                    md_hard_dir(p),
                    hard_prefix(q),
                    md_hard_created[q as usize],
                    MdOp::Read {
                        bytes: config.md_hard_file_bytes,
                    },
                ))
            })
            .collect();
        self.phase(
            "mdtest-hard-read",
            PhaseKind::Metadata,
            true,
            Some(cache),
            tasks,
        )?;

        // 13. mdtest-hard-delete
        let tasks = (0..procs)
            .map(|p| {
                Task::Md(md(
                    md_hard_dir(p),
                    hard_prefix(p),
                    md_hard_created[p as usize],
                    MdOp::Delete,
                ))
            })
            .collect();
        let cache = self.drop_caches()?;
        self.phase(
            "mdtest-hard-delete",
            PhaseKind::Metadata,
            true,
            Some(cache),
            tasks,
        )?;
        Ok(())
    }
}

impl Suite<'_> {
    /// The `meta` suite. `roots[p % roots.len()]` is the scratch directory as process p
    /// sees it (several mounts of one file system: several nodes).
    fn run_meta(&mut self, roots: &[PathBuf], skip_shared: bool) -> anyhow::Result<()> {
        let config = self.config;
        let procs = self.procs();
        let root_of = |p: u64| &roots[p as usize % roots.len()];
        let root = &roots[0];
        std::fs::create_dir(root.join("private"))
            .with_context(|| format!("cannot create {}/private", root.display()))?;
        std::fs::create_dir(root.join("shared"))
            .with_context(|| format!("cannot create {}/shared", root.display()))?;
        for p in 0..procs {
            let dir = root.join("private").join(format!("p{p}"));
            std::fs::create_dir(&dir)
                .with_context(|| format!("cannot create {}", dir.display()))?;
        }
        let private = |p: u64| root_of(p).join("private").join(format!("p{p}"));
        let shared = |p: u64| root_of(p).join("shared");
        let prefix = |p: u64| format!("f.p{p}.");
        let n = config.md_easy_files_per_proc;
        let md = |dir: PathBuf, prefix: String, count: u64, op: MdOp| MdSpec {
            dir,
            prefix,
            first: 0,
            count,
            op,
            time_limit_ms: None,
            fsync: false,
            verify: config.verify,
        };
        type Layout<'a> = &'a dyn Fn(u64) -> (PathBuf, String);
        let private_layout = |p: u64| (private(p), "f.".to_string());
        let shared_layout = |p: u64| (shared(p), prefix(p));
        let all: [(&str, Layout); 2] = [("private", &private_layout), ("shared", &shared_layout)];
        let layouts = &all[..if skip_shared { 1 } else { 2 }];
        for &(name, layout) in layouts {
            let tasks = (0..procs)
                .map(|p| {
                    let (dir, prefix) = layout(p);
                    Task::Md(md(dir, prefix, n, MdOp::CreateEmpty))
                })
                .collect();
            self.phase(
                &format!("create-{name}"),
                PhaseKind::Metadata,
                false,
                None,
                tasks,
            )?;
            // Warm: right after the creates, as `ls -l` after `tar x` would.
            let tasks = (0..procs)
                .map(|p| {
                    let (dir, prefix) = layout(p);
                    Task::Md(md(dir, prefix, n, MdOp::Stat))
                })
                .collect();
            self.phase(
                &format!("stat-{name}"),
                PhaseKind::Metadata,
                false,
                None,
                tasks,
            )?;
        }
        // The files another process created (through another node, with --also).
        if !skip_shared {
            let tasks = (0..procs)
                .map(|p| {
                    let q = (p + 1) % procs;
                    Task::Md(md(shared(p), prefix(q), n, MdOp::Stat))
                })
                .collect();
            self.phase("stat-shared-other", PhaseKind::Metadata, false, None, tasks)?;
        }
        // Cold walks: the top-level trees dealt round-robin to the processes.
        let mut trees: Vec<u64> = if skip_shared { vec![] } else { vec![u64::MAX] };
        trees.extend(0..procs);
        for (name, names_only) in [("find-names", true), ("find-stat", false)] {
            let cache = self.drop_caches()?;
            let tasks = (0..procs)
                .map(|p| {
                    Task::Find(FindSpec {
                        roots: trees
                            .iter()
                            .skip(p as usize)
                            .step_by(procs as usize)
                            .map(|&t| match t {
                                u64::MAX => shared(p),
                                t => root_of(p).join("private").join(format!("p{t}")),
                            })
                            .collect(),
                        names_only,
                    })
                })
                .collect();
            self.phase(name, PhaseKind::Metadata, false, Some(cache), tasks)?;
        }
        for &(name, layout) in layouts {
            let tasks = (0..procs)
                .map(|p| {
                    let (dir, prefix) = layout(p);
                    Task::Md(md(dir, prefix, n, MdOp::Delete))
                })
                .collect();
            self.phase(
                &format!("delete-{name}"),
                PhaseKind::Metadata,
                false,
                None,
                tasks,
            )?;
        }
        Ok(())
    }
}

/// A phase's figure through one of several mounts (printed under its phase line).
pub fn format_mount_line(phase: &PhaseResult, m: &MountFigure) -> String {
    let mut line = format!(
        "         {:<20} {:>12.6} {:<5} : time {:>8.3} seconds  ({} proc",
        "", m.value, phase.unit, m.seconds, m.procs
    );
    if m.procs != 1 {
        line.push('s');
    }
    match phase.kind {
        PhaseKind::Bandwidth => {
            let _ = write!(line, ", {}", format_bytes(m.bytes));
        }
        PhaseKind::Metadata => {
            let _ = write!(line, ", {} ops", m.ops);
        }
    }
    let _ = write!(line, ") via {}", m.mount.display());
    line
}

/// One io500-style result line.
pub fn format_phase_line(phase: &PhaseResult) -> String {
    let mut line = format!(
        "[RESULT] {:<20} {:>12.6} {:<5} : time {:>8.3} seconds",
        phase.name, phase.value, phase.unit, phase.seconds
    );
    match phase.kind {
        PhaseKind::Bandwidth => {
            let _ = write!(line, "  ({}, {} ops", format_bytes(phase.bytes), phase.ops);
        }
        PhaseKind::Metadata => {
            let _ = write!(line, "  ({} ops", phase.ops);
        }
    }
    let _ = write!(
        line,
        ", lat p50 {} p99 {})",
        format_nanos(phase.latency.p50_ns as f64),
        format_nanos(phase.latency.p99_ns as f64)
    );
    if phase.stonewalled {
        line.push_str(" [stonewalled]");
    }
    if !phase.in_score {
        line.push_str(" [not in score]");
    }
    if phase.verify_errors > 0 {
        let _ = write!(
            line,
            "\n!!! VERIFY FAILED in {}: {} wrong; first: {}",
            phase.name,
            phase.verify_errors,
            phase.first_verify_error.as_deref().unwrap_or("")
        );
    }
    line
}

fn score_of(phases: &[PhaseResult]) -> Score {
    let values = |kind: PhaseKind| -> Vec<f64> {
        phases
            .iter()
            .filter(|p| p.kind == kind && p.in_score)
            .map(|p| p.value)
            .collect()
    };
    io500_score(&values(PhaseKind::Bandwidth), &values(PhaseKind::Metadata))
}

fn score_line(score: &Score) -> String {
    format!(
        "[SCORE ] Bandwidth {:.6} GiB/s : IOPS {:.6} kiops : TOTAL {:.6}",
        score.bandwidth_gib_s, score.metadata_kiops, score.total
    )
}

fn run_on(
    dir: &Path,
    also: &[PathBuf],
    config: &BenchConfig,
    args: &BenchArgs,
    hooks: &BenchHooks,
    pool: &mut WorkerPool,
) -> anyhow::Result<BenchRun> {
    let started = Instant::now();
    let scratch = ScratchDir::create(dir, args.keep)?;
    // The scratch directory as the other mount points show it.
    let mut roots = vec![scratch.root.clone()];
    if let Some(name) = scratch.root.file_name() {
        roots.extend(also.iter().map(|a| a.join(name)));
    }
    for r in &roots[1..] {
        if !r.is_dir() {
            bail!(
                "--also: {} does not show {} (is it a mount point of the same file system?)",
                r.display(),
                scratch.root.display()
            );
        }
    }
    if args.suite == BenchSuite::Meta {
        println!(
            "mako bench {} — {} processes through {} mount(s), {} files/proc in private and in shared directories",
            dir.display(),
            config.procs,
            roots.len(),
            config.md_easy_files_per_proc
        );
    } else {
        println!(
        "mako bench {} — {} processes through {} mount(s), ior-easy {}/proc, ior-hard {} × {} B/proc, md-easy {} files/proc, md-hard {} files/proc, stonewall {}",
        dir.display(),
        config.procs,
        roots.len(),
        format_bytes(config.easy_bytes_per_proc),
        config.hard_records_per_proc,
        config.hard_transfer_bytes,
        config.md_easy_files_per_proc,
        config.md_hard_files_per_proc,
        if config.stonewall_secs > 0.0 { format!("{} s", config.stonewall_secs) } else { "off".into() }
    );
    }
    let mut suite = Suite {
        config,
        hooks,
        pool,
        drop_enabled: !args.no_drop_caches,
        phases: Vec::new(),
        mounts: std::iter::once(dir.to_path_buf())
            .chain(also.iter().cloned())
            .collect(),
    };
    match args.suite {
        BenchSuite::Io500 => suite.run(&roots)?,
        BenchSuite::Meta => suite.run_meta(&roots, args.skip_shared)?,
    }
    let phases = suite.phases;
    let score = score_of(&phases);
    if args.suite == BenchSuite::Io500 {
        println!("{}", score_line(&score));
    }
    drop(scratch);
    Ok(BenchRun {
        dir: dir.to_path_buf(),
        phases,
        score,
        elapsed_s: started.elapsed().as_secs_f64(),
    })
}

/// Compares phase by phase.
pub fn ratios(target: &BenchRun, reference: &BenchRun) -> Vec<PhaseRatio> {
    let mut out: Vec<PhaseRatio> = target
        .phases
        .iter()
        .filter_map(|phase| {
            let other = reference.phases.iter().find(|p| p.name == phase.name)?;
            Some(PhaseRatio {
                phase: phase.name.clone(),
                unit: phase.unit.clone(),
                target: phase.value,
                reference: other.value,
                ratio: (other.value > 0.0).then(|| phase.value / other.value),
            })
        })
        .collect();
    if !target.phases.iter().any(|p| p.in_score) {
        return out;
    }
    for (name, unit, pick) in [
        (
            "score-bandwidth",
            "GiB/s",
            (|s: &Score| s.bandwidth_gib_s) as fn(&Score) -> f64,
        ),
        ("score-metadata", "kIOPS", |s: &Score| s.metadata_kiops),
        ("score-total", "", |s: &Score| s.total),
    ] {
        let (t, r) = (pick(&target.score), pick(&reference.score));
        out.push(PhaseRatio {
            phase: name.to_string(),
            unit: unit.to_string(),
            target: t,
            reference: r,
            ratio: (r > 0.0).then(|| t / r),
        });
    }
    out
}

/// The side-by-side table printed by `--compare`.
pub fn format_compare_table(report: &BenchReport) -> String {
    let mut out = String::new();
    let reference = match &report.reference {
        Some(reference) => reference,
        None => return out,
    };
    let _ = writeln!(out, "target    = {}", report.target.dir.display());
    let _ = writeln!(out, "reference = {}", reference.dir.display());
    let n = report.repeats.len();
    if n > 1 {
        let _ = writeln!(
            out,
            "medians of {n} (target, reference) pairs; range = lowest..highest pair ratio"
        );
    }
    let _ = writeln!(
        out,
        "{:<20} {:>14} {:>14} {:>8}  {:<6}{}",
        "phase",
        "target",
        "reference",
        "ratio",
        "unit",
        if n > 1 { "  range" } else { "" }
    );
    for ratio in &report.ratios {
        let range = if n > 1 {
            let all: Vec<f64> = report
                .repeats
                .iter()
                .filter_map(|p| p.iter().find(|x| x.phase == ratio.phase)?.ratio)
                .collect();
            let lo = all.iter().cloned().fold(f64::INFINITY, f64::min);
            let hi = all.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            if all.is_empty() {
                String::new()
            } else {
                format!("  {lo:.3}..{hi:.3}")
            }
        } else {
            String::new()
        };
        let _ = writeln!(
            out,
            "{:<20} {:>14.4} {:>14.4} {:>8}  {:<6}{}",
            ratio.phase,
            ratio.target,
            ratio.reference,
            ratio.ratio.map_or("n/a".to_string(), |r| format!("{r:.3}")),
            ratio.unit,
            range
        );
    }
    out
}

/// Runs `mako bench`; see [`BenchArgs`]. Prints as it goes, writes `--json`/`--svg`,
/// and returns an error after writing them if any read came back wrong.
pub fn run_bench(args: &BenchArgs, hooks: &BenchHooks) -> anyhow::Result<BenchReport> {
    let config = BenchConfig::from_args(args)?;
    if let Some(reference) = &args.compare {
        if !reference.is_dir() {
            bail!("--compare {}: not a directory", reference.display());
        }
    }
    if args.no_drop_caches {
        println!("note: --no-drop-caches: read phases may be served from cache");
    } else if !crate::cache::is_root() {
        println!("note: not root, cannot drop the kernel page cache; read phases may be served from memory");
    }
    let executable = worker_executable(args.worker_exe.as_ref())?;
    let mut pool = WorkerPool::start(config.procs as usize, &executable)?;
    let repeat = if args.compare.is_some() {
        args.repeat.max(1)
    } else {
        1
    };
    let mut pairs = Vec::new();
    let mut verify_errors = 0;
    let mut last = None;
    for i in 0..repeat {
        if repeat > 1 {
            println!("=== pair {} of {repeat} ===", i + 1);
        }
        let target = run_on(&args.dir, &args.also, &config, args, hooks, &mut pool)?;
        let reference = match &args.compare {
            Some(dir) => Some(run_on(dir, &[], &config, args, hooks, &mut pool)?),
            None => None,
        };
        verify_errors += target
            .phases
            .iter()
            .chain(reference.iter().flat_map(|r| r.phases.iter()))
            .map(|p| p.verify_errors)
            .sum::<u64>();
        if let Some(r) = &reference {
            pairs.push(ratios(&target, r));
        }
        last = Some((target, reference));
    }
    drop(pool);
    let (target, reference) = last.expect("at least one run");
    let ratios = median_ratios(&pairs);
    let report = BenchReport {
        config,
        target,
        reference,
        ratios,
        repeats: if pairs.len() > 1 { pairs } else { Vec::new() },
        verify_errors,
    };
    if report.reference.is_some() {
        print!("{}", format_compare_table(&report));
    }
    if let Some(path) = &args.json {
        let text = serde_json::to_string_pretty(&report)?;
        std::fs::write(path, text)
            .with_context(|| format!("cannot write --json {}", path.display()))?;
    }
    if let Some(path) = &args.svg {
        std::fs::write(path, crate::svg::render(&report))
            .with_context(|| format!("cannot write --svg {}", path.display()))?;
    }
    if report.verify_errors > 0 {
        eprintln!(
            "!!! VERIFICATION FAILED: {} read(s) returned data that differs from what was written",
            report.verify_errors
        );
        return Err(anyhow!(
            "verification failed: {} read(s) returned wrong data; see the !!! lines above",
            report.verify_errors
        ));
    }
    Ok(report)
}

#[cfg(test)]
mod repeat_tests {
    use super::*;

    fn pr(phase: &str, t: f64, r: f64) -> PhaseRatio {
        PhaseRatio {
            phase: phase.into(),
            unit: "GiB/s".into(),
            target: t,
            reference: r,
            ratio: (r > 0.0).then(|| t / r),
        }
    }

    #[test]
    fn medians_of_pairs_per_phase() {
        let pairs = vec![
            vec![pr("ior-easy-read", 1.0, 2.0), pr("find", 5.0, 0.0)],
            vec![pr("ior-easy-read", 3.0, 3.0), pr("find", 7.0, 0.0)],
            vec![pr("ior-easy-read", 0.5, 5.0), pr("find", 6.0, 0.0)],
        ];
        let m = median_ratios(&pairs);
        assert_eq!(m[0].phase, "ior-easy-read");
        assert_eq!(m[0].target, 1.0);
        assert_eq!(m[0].reference, 3.0);
        // ratios 0.5, 1.0, 0.1: the median ratio, not the ratio of medians.
        assert_eq!(m[0].ratio, Some(0.5));
        assert_eq!(m[1].target, 6.0);
        assert_eq!(m[1].ratio, None, "no ratio when every reference is 0");
        assert_eq!(median(vec![4.0, 1.0, 3.0, 2.0]), 2.5);
        assert!(median_ratios(&[]).is_empty());
    }
}
