//! `mako-posix DIR [--filter SUBSTR] [--list]`: runs the POSIX conformance checks against DIR,
//! printing one line per check and a final `posix: N passed, M failed`; exits 1 on any failure.

use clap::Parser;
use std::path::PathBuf;

/// POSIX conformance checker for Mako (works on any directory).
#[derive(Parser)]
#[command(name = "mako-posix", version)]
struct Args {
    /// Directory to test in (each check uses a fresh subdirectory that is removed afterwards).
    dir: PathBuf,
    /// Only run checks whose name contains this substring.
    #[arg(long)]
    filter: Option<String>,
    /// List the (filtered) check names and exit.
    #[arg(long)]
    list: bool,
}

fn main() {
    let args = Args::parse();
    if args.list {
        for n in mako_tests::posix::check_names(args.filter.as_deref()) {
            println!("{n}");
        }
        return;
    }
    if !args.dir.is_dir() {
        eprintln!("mako-posix: {} is not a directory", args.dir.display());
        std::process::exit(2);
    }
    let report = mako_tests::posix::run_posix_suite_with(&args.dir, args.filter.as_deref(), |r| {
        println!("{r}")
    });
    if report.skipped() > 0 {
        println!("posix: {} skipped", report.skipped());
    }
    println!("{}", report.summary());
    if !report.all_passed() {
        std::process::exit(1);
    }
}
