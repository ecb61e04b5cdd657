//! mako-bench: `mako perf` (gpfsperf-style streaming I/O) and `mako bench` (io500-style
//! phases and score) as a library, so the `mako` CLI and the tests share one
//! implementation. Everything works on any directory — a Mako mount, a local disk,
//! tmpfs — so one run can measure Mako against a reference.
//!
//! Multi-process phases re-execute the current binary with [`WORKER_ARG`]; a binary
//! that uses this crate must call [`maybe_run_worker`] first thing in `main`.

pub mod bench;
mod cache;
pub mod histogram;
pub mod pattern;
pub mod perf;
pub mod score;
mod svg;
pub mod task;
pub mod units;
mod worker;

pub use bench::BenchArgs;
pub use perf::{normalize_args, PerfArgs};
pub use worker::{maybe_run_worker, WORKER_ARG, WORKER_EXE_ENV};

/// Extra actions the caller can plug into `mako bench`.
#[derive(Default)]
pub struct BenchHooks {
    /// Called before every read phase with the directory being benchmarked, after the
    /// kernel caches were dropped (Mako's CLI clears the daemon's pagepool here).
    #[allow(clippy::type_complexity)]
    pub drop_caches: Option<Box<dyn Fn(&std::path::Path) -> anyhow::Result<()> + Send + Sync>>,
}

/// Runs `mako perf`; prints text (or JSON with `--json`) and returns the report.
pub fn run_perf(args: &PerfArgs) -> anyhow::Result<perf::PerfReport> {
    perf::run_perf(args)
}

/// Runs `mako bench`; prints phases and the score as they complete and returns the report.
pub fn run_bench(args: &BenchArgs, hooks: &BenchHooks) -> anyhow::Result<bench::BenchReport> {
    bench::run_bench(args, hooks)
}
