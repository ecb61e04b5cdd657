//! `mako-tree DIR --files N [--per-dir D] [--threads T] [--bytes B]`: creates N files
//! (D per directory, in DIR/dNNNNNN/fNNNNNN) with T threads, each of B bytes, and
//! prints how long it took. Used by `bench/fsck-speed` to fill a file system; works on
//! any directory.

use clap::Parser;
use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// Create a tree of many small files.
#[derive(Parser)]
#[command(name = "mako-tree", version)]
struct Args {
    /// Directory to create the tree in (created if missing).
    dir: PathBuf,
    /// Number of files.
    #[arg(long)]
    files: u64,
    /// Files per directory.
    #[arg(long, default_value_t = 1000)]
    per_dir: u64,
    /// Threads creating files (each takes whole directories).
    #[arg(long, default_value_t = 2)]
    threads: u64,
    /// Bytes written into each file.
    #[arg(long, default_value_t = 0)]
    bytes: usize,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    anyhow::ensure!(
        args.per_dir > 0 && args.threads > 0,
        "--per-dir and --threads must be at least 1"
    );
    std::fs::create_dir_all(&args.dir)?;
    let dirs = args.files.div_ceil(args.per_dir);
    let next = AtomicU64::new(0);
    let made = AtomicU64::new(0);
    let start = Instant::now();
    let data = vec![b'm'; args.bytes];
    std::thread::scope(|s| -> anyhow::Result<()> {
        let workers: Vec<_> = (0..args.threads)
            .map(|_| {
                s.spawn(|| -> anyhow::Result<()> {
                    loop {
                        let d = next.fetch_add(1, Ordering::Relaxed);
                        if d >= dirs {
                            return Ok(());
                        }
                        let dir = args.dir.join(format!("d{d:06}"));
                        std::fs::create_dir(&dir)?;
                        let first = d * args.per_dir;
                        for f in first..(first + args.per_dir).min(args.files) {
                            let mut file = std::fs::File::create(dir.join(format!("f{f:07}")))?;
                            if !data.is_empty() {
                                file.write_all(&data)?;
                            }
                            made.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                })
            })
            .collect();
        for w in workers {
            w.join().expect("a creating thread panicked")?;
        }
        Ok(())
    })?;
    let secs = start.elapsed().as_secs_f64();
    let n = made.load(Ordering::Relaxed);
    println!(
        "created {n} files in {dirs} directories in {secs:.1} s ({:.0} files/s)",
        n as f64 / secs.max(1e-9)
    );
    Ok(())
}
