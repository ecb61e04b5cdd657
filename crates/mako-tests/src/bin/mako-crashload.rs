//! `mako-crashload DIR --journal FILE --seed S --ops N`: the crash workload of
//! `mako_tests::crashload`. Runs until the file system fails under it (its daemon was
//! killed) or the operations are done; `--check` instead checks a recovered tree
//! against the journal and exits 1 on any violation.

use clap::Parser;
use std::path::PathBuf;

/// Crash workload for kill -9 tests (writes its promises to a journal elsewhere).
#[derive(Parser)]
#[command(name = "mako-crashload", version)]
struct Args {
    /// Directory the workload works in (created).
    dir: PathBuf,
    /// Journal of intentions and promises, on another file system.
    #[arg(long)]
    journal: PathBuf,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    #[arg(long, default_value_t = u64::MAX)]
    ops: u64,
    /// Check the tree against the journal instead of running the workload.
    #[arg(long)]
    check: bool,
}

fn main() {
    let a = Args::parse();
    if a.check {
        match mako_tests::crashload::check(&a.journal) {
            Ok(n) => println!("{n} files checked: every promise kept"),
            Err(problems) => {
                for p in &problems {
                    eprintln!("VIOLATION: {p}");
                }
                std::process::exit(1);
            }
        }
        return;
    }
    match mako_tests::crashload::run(&a.dir, &a.journal, a.seed, a.ops) {
        Ok(n) => println!("done: {n} operations"),
        // The expected end of a crash run: the file system went away under us.
        Err(e) => println!("stopped: {e}"),
    }
}
