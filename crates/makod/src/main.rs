//! makod: the Mako daemon. One per node. It reads the cluster configuration from its
//! data directory, mounts the file systems marked `automount` through FUSE, and
//! answers the `mako` CLI on a Unix socket until told to stop (`mako down`, SIGTERM,
//! SIGINT), when it writes everything back and unmounts cleanly.

mod daemon;
mod metrics;
mod mount_state;

use clap::Parser;
use std::path::PathBuf;

#[derive(Parser)]
#[command(
    name = "makod",
    version,
    about = "The Mako daemon (started by `mako up`)"
)]
struct Args {
    /// Data directory holding cluster.toml, config.toml and the control socket.
    #[arg(long)]
    data_dir: Option<PathBuf>,
}

fn main() {
    // Large allocations (FUSE replies, decoded directory blocks) always come from mmap
    // and go back to the system when freed: with glibc's default dynamic threshold,
    // freed multi-MiB chunks stay in per-thread arenas and the daemon's memory outgrows
    // the pagepool it is configured with.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 512 * 1024);
        libc::mallopt(libc::M_ARENA_MAX, 4);
    }
    let args = Args::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("MAKO_LOG")
                .unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .init();
    let dir = args.data_dir.unwrap_or_else(mako_control::default_data_dir);
    match daemon::run(&dir) {
        Ok(()) => {
            tracing::info!("makod stopped cleanly");
        }
        Err(e) => {
            tracing::error!("makod: {e:#}");
            eprintln!("makod: {e:#}");
            std::process::exit(1);
        }
    }
}
