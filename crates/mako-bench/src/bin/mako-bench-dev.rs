//! Development driver for mako-bench: the same `perf`/`bench` commands the `mako` CLI
//! offers, so the crate can be exercised (and spawn its workers) on its own.

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "mako-bench-dev", about = "mako perf / mako bench, standalone")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// gpfsperf-style streaming I/O test.
    Perf(mako_bench::PerfArgs),
    /// io500-style phases and score.
    Bench(mako_bench::BenchArgs),
}

fn main() {
    if let Some(code) = mako_bench::maybe_run_worker() {
        std::process::exit(code);
    }
    let cli = Cli::parse_from(mako_bench::normalize_args(std::env::args_os()));
    let result = match &cli.command {
        Command::Perf(args) => mako_bench::run_perf(args).map(drop),
        Command::Bench(args) => {
            mako_bench::run_bench(args, &mako_bench::BenchHooks::default()).map(drop)
        }
    };
    if let Err(e) = result {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}
