//! `mako-fsx DIR --seed S --ops N [...]`: fsx-style randomized model-based file exerciser.
//! Prints the seed first, and on failure the op, offset, expected vs. actual bytes, the last
//! operations and the exact command line to reproduce; exits 1 on failure.

use clap::Parser;
use mako_tests::fsx::{run_fsx, FsxOptions, OpWeights};
use std::path::PathBuf;

/// Randomized model-based file exerciser for Mako (works on any directory).
#[derive(Parser)]
#[command(name = "mako-fsx", version)]
struct Args {
    /// Directory to create the test file(s) in.
    dir: PathBuf,
    /// The same directory through another mount point (another node of a cluster file
    /// system); repeat for more. Each operation goes to a random mount.
    #[arg(long = "other-mount", value_name = "DIR")]
    other_mounts: Vec<PathBuf>,
    /// Start from the cluster weights: records, stat and namespace operations too.
    #[arg(long)]
    cluster_ops: bool,
    /// RNG seed (default: derived from the clock; always printed).
    #[arg(long)]
    seed: Option<u64>,
    /// Number of operations.
    #[arg(long, default_value_t = 100_000)]
    ops: u64,
    /// Maximum file size in bytes.
    #[arg(long, default_value_t = 16 << 20)]
    max_size: u64,
    /// Maximum length of one read/write/fallocate in bytes.
    #[arg(long, default_value_t = 256 << 10)]
    max_op_len: u64,
    /// Number of test files.
    #[arg(long, default_value_t = 1)]
    files: usize,
    /// Shell command (run via `sh -c`) that unmounts and remounts the file system.
    #[arg(long)]
    remount_cmd: Option<String>,
    /// Remount every N operations (with --remount-cmd).
    #[arg(long, default_value_t = 10_000)]
    remount_every: u64,
    /// Disable mmap reads and writes.
    #[arg(long)]
    no_mmap: bool,
    /// Disable fallocate, punch hole and zero range.
    #[arg(long)]
    no_fallocate: bool,
    /// Number of recent operations to print on failure.
    #[arg(long, default_value_t = 32)]
    log_last: usize,
    /// Verify the whole file every N operations (0 = only at the end).
    #[arg(long, default_value_t = 1_000)]
    verify_every: u64,
    /// Operation weights, e.g. `write=20,read=20,truncate=5,punch_hole=4,zero_range=4,fallocate=4,mmap_read=8,mmap_write=8,fsync=1,fdatasync=1,close_reopen=2,verify=0`; also `record_write`, `stat`, `create`, `unlink`, `rename`, `link`, `mkdir`, `rmdir`, `lookup`, `list` (0 by default).
    #[arg(long)]
    weights: Option<String>,
    /// Delete the test files even on failure.
    #[arg(long)]
    no_keep: bool,
    /// Testing aid: corrupt one byte behind the model's back at the first write at/after op N.
    #[arg(long, hide = true)]
    inject_bug: Option<u64>,
}

fn main() {
    let a = Args::parse();
    let seed = a.seed.unwrap_or_else(|| {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        (t.as_nanos() as u64 ^ (std::process::id() as u64) << 32) % 1_000_000_007
    });
    let mut o = FsxOptions::new(&a.dir, seed, a.ops);
    o.mounts = a.other_mounts.clone();
    if a.cluster_ops {
        o.weights = OpWeights::cluster();
    }
    o.max_size = a.max_size.max(1);
    o.max_op_len = a.max_op_len.max(1);
    o.files = a.files.max(1);
    o.remount_every = a.remount_every;
    o.mmap = !a.no_mmap;
    o.fallocate = !a.no_fallocate;
    o.log_last = a.log_last;
    o.verify_every = a.verify_every;
    o.keep_on_failure = !a.no_keep;
    o.verbose = true;
    o.inject_bug = a.inject_bug;
    if let Some(w) = &a.weights {
        o.weights = match OpWeights::parse_on(o.weights.clone(), w) {
            Ok(w) => w,
            Err(e) => {
                eprintln!("mako-fsx: --weights: {e}");
                std::process::exit(2);
            }
        };
    }
    if let Some(cmd) = a.remount_cmd.clone() {
        o.remount_cmd = Some(cmd.clone());
        o.remount = Some(Box::new(move || {
            let st = std::process::Command::new("sh")
                .arg("-c")
                .arg(&cmd)
                .status()?;
            anyhow::ensure!(st.success(), "remount command {cmd:?} exited with {st}");
            Ok(())
        }));
    }
    match run_fsx(&mut o) {
        Ok(stats) => println!("{stats}"),
        Err(f) => {
            eprintln!("{f}");
            eprintln!("fsx: seed {seed}: FAILED at op #{}", f.op);
            std::process::exit(1);
        }
    }
}
