//! makod: the Mako daemon. One per node. It reads the cluster configuration from its
//! data directory, mounts the file systems marked `automount` through FUSE, and
//! answers the `mako` CLI on a Unix socket until told to stop (`mako down`, SIGTERM,
//! SIGINT), when it writes everything back and unmounts cleanly.

mod daemon;
mod fuse_guard;
mod lease;
mod local_nodes;
mod member;
mod metrics;
mod mount_state;
mod net;
mod recovery;
mod shards;

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
    /// Test cluster: run nodes 0..N of one file system in this process, node i mounted
    /// at `<mount point>.node<i>` (no control socket; stops at SIGTERM). The file system
    /// needs N logs (`mako fs create -n N`).
    #[arg(long, value_name = "N")]
    local_nodes: Option<u32>,
    /// The file system of --local-nodes [default: the only one in cluster.toml]
    #[arg(long, value_name = "NAME", requires = "local_nodes")]
    fs: Option<String>,
    /// Internal: the FUSE guard of makod PID (started by makod itself; see
    /// `fuse_guard`).
    #[arg(long, value_name = "PID", hide = true)]
    fuse_guard: Option<u32>,
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
                // openraft narrates every vote and replication at info.
                .unwrap_or_else(|_| "info,openraft=warn".into()),
        )
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .init();
    if let Some(pid) = args.fuse_guard {
        fuse_guard::run(pid);
        return;
    }
    let dir = args.data_dir.unwrap_or_else(mako_control::default_data_dir);
    let result = match args.local_nodes {
        Some(n) => local_nodes::run(&dir, n, args.fs.as_deref()),
        None => daemon::run(&dir),
    };
    match result {
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
