//! `makod --local-nodes N`: nodes 0..N of one file system in this one process, each with
//! its own FUSE mount — a test cluster through the real kernel (issue 12).
//!
//! Every node is what a node of a real cluster is: its own `Core` mounted with
//! `mount_node` (its own recovery log, pagepool, caches and token client), its own disk
//! file handles on the shared disks, and its own FUSE session at its own mount point
//! (`<mount point>.node<i>`), whose `Sessions` is that node's kernel invalidator alone:
//! what one node changes reaches another node's kernel only through that node's token
//! revokes. The nodes reach the token manager and file-system manager (node 0) and each
//! other through the in-process transport (`NodeEnv::in_process_cluster`); the network
//! transport of the next issue replaces exactly that, and a real cluster then runs one
//! `makod` per node instead.
//!
//! There is no control socket: the mode is for tests (`mako-tests`'s `MultiNode`). It
//! runs until SIGTERM/SIGINT, or until one of its mounts is unmounted from outside, then
//! unmounts every FUSE session and writes every node back (node N-1 first), so the
//! disks are clean for `mako fsck`. The FUSE settings (TTLs, page-cache and writeback-
//! cache policy, request sizes) are the product's, from config.toml.

use anyhow::{bail, Context, Result};
use mako_control::{ClusterConfig, DataDir};
use mako_format::disk_header::DiskUsage;
use mako_fs::env::NodeEnv;
use mako_fs::{DiskSpec, Mounted};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::daemon::{
    fs_config, raise_fuse_max_pages, raise_readahead, relax_dirty_limit, watch_signals, Daemon,
};

/// Largest node count of this mode: a test tool, not a cluster.
const LOCAL_NODES_MAX: u32 = 16;

/// The mount point of node `i` of a file system mounted at `mountpoint`.
pub fn node_mountpoint(mountpoint: &Path, i: u32) -> PathBuf {
    let mut s = mountpoint.as_os_str().to_owned();
    s.push(format!(".node{i}"));
    PathBuf::from(s)
}

/// One node: its mounted core and its FUSE session.
struct Node {
    mounted: Mounted,
    fuse: Option<mako_fuse::FuseMount>,
    mountpoint: PathBuf,
}

/// Runs nodes `0..n` of file system `fs` (the only one in cluster.toml if `None`).
pub fn run(root: &Path, n: u32, fs: Option<&str>) -> Result<()> {
    if !(2..=LOCAL_NODES_MAX).contains(&n) {
        bail!("--local-nodes {n}: give 2 to {LOCAL_NODES_MAX} nodes (one node is plain makod)");
    }
    let dir = DataDir::new(root);
    let stop = Arc::new(AtomicBool::new(false));
    watch_signals(stop.clone())?;
    let cluster = ClusterConfig::load(root).with_context(|| {
        format!(
            "no cluster in {}; create one with `mako up`",
            root.display()
        )
    })?;
    let fsdef = match fs {
        Some(name) => cluster
            .filesystem(name)
            .with_context(|| format!("--fs {name}: no such file system in cluster.toml"))?,
        None => match cluster.filesystems.as_slice() {
            [only] => only,
            _ => bail!("--local-nodes: cluster.toml has several file systems; say which with --fs"),
        },
    }
    .clone();
    let cfg = Daemon::load_config(&dir)?;
    if unsafe { libc::geteuid() } == 0 {
        raise_fuse_max_pages(cfg.fuse_max_write_bytes().max(16 << 20));
    }
    let mut specs = Vec::new();
    for d in cluster.disks_of(&fsdef) {
        let usage = DiskUsage::parse(&d.usage)
            .with_context(|| format!("disk {}: usage {:?}", d.name, d.usage))?;
        specs.push(DiskSpec {
            name: d.name.clone(),
            path: d.path.clone(),
            pool: d.pool.clone(),
            failure_group: d.failure_group,
            usage,
        });
    }
    let name = fsdef.name.clone();
    tracing::info!(
        "makod {} --local-nodes {n}: nodes 0..{n} of {name} in one process",
        env!("CARGO_PKG_VERSION")
    );
    let direct_io_file_size = Arc::new(AtomicU64::new(cfg.fuse_direct_io_file_size()));
    let mut nodes: Vec<Node> = Vec::new();
    let started = (|| -> Result<()> {
        for env in NodeEnv::in_process_cluster(n) {
            let i = env.node;
            let disks = mako_fs::mount::open_disk_files(&specs)
                .with_context(|| format!("node {i}: opening the disks of {name}"))?;
            let mounted = mako_fs::mount::mount_node(disks, fs_config(&cfg), env)
                .with_context(|| format!("node {i}: mounting {name}"))?;
            let mountpoint = node_mountpoint(&fsdef.mountpoint, i);
            let mut node = Node {
                mounted,
                fuse: None,
                mountpoint,
            };
            let mp = node.mountpoint.clone();
            if let Some(e) = mako_control::mount_table::at(&mp) {
                nodes.push(node);
                bail!(
                    "{} is already a mount point ({} {}); unmount it first",
                    mp.display(),
                    e.fstype,
                    e.source
                );
            }
            std::fs::create_dir_all(&mp)
                .with_context(|| format!("creating mount point {}", mp.display()))?;
            let opts = mako_fuse::FuseOptions {
                direct_io_file_size: direct_io_file_size.clone(),
                writeback_cache: cfg.fuse_writeback_cache(),
                threads: cfg.worker_threads(),
                max_write: cfg.fuse_max_write_bytes(),
                io_uring: cfg.fuse_io_uring(),
                allow_other: unsafe { libc::geteuid() } == 0,
                fs_name: format!("mako:{name}"),
                flags: mako_fuse::MountFlags::new(false, mako_fs::fs::AtimePolicy::Relatime),
                nosuid: false,
                nodev: false,
                noexec: false,
                // This node's sessions only: its kernel caches are invalidated by its
                // own revokes, never directly by another node.
                sessions: mako_fuse::Sessions::new(),
            };
            let r = mako_fuse::mount(node.mounted.fs.clone(), &mp, &opts);
            node.fuse = match r {
                Ok(f) => Some(f),
                Err(e) => {
                    nodes.push(node);
                    bail!(
                        "node {i}: FUSE mount of {name} on {} failed: {e}",
                        mp.display()
                    );
                }
            };
            if cfg.fuse_writeback_cache() {
                relax_dirty_limit(&mp);
            }
            raise_readahead(&mp, node.mounted.core().geo.block_bytes);
            tracing::info!("node {i}: {name} mounted on {}", mp.display());
            nodes.push(node);
        }
        Ok(())
    })();
    if let Err(e) = &started {
        tracing::error!("{e:#}");
    } else {
        // Stop at a signal, or when a mount was unmounted from outside (a test's
        // teardown after a failure): the others go too.
        while !stop.load(Ordering::SeqCst) {
            if let Some(gone) = nodes
                .iter()
                .find(|nd| nd.fuse.as_ref().is_none_or(|f| f.session_ended()))
            {
                tracing::warn!(
                    "{} was unmounted from outside: stopping",
                    gone.mountpoint.display()
                );
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    let mut errors = Vec::new();
    // Every session ends first (no request reaches a node that is writing back), then the
    // nodes are written back, the last first.
    for nd in &mut nodes {
        if let Some(f) = nd.fuse.take() {
            if let Err(e) = f.unmount() {
                errors.push(format!("unmounting {}: {e}", nd.mountpoint.display()));
            }
        }
    }
    for (i, nd) in nodes.into_iter().enumerate().rev() {
        match nd.mounted.unmount() {
            Ok(()) => tracing::info!("node {i}: {name} written back"),
            Err(e) => errors.push(format!("node {i}: writing back {name}: {e}")),
        }
    }
    started?;
    if !errors.is_empty() {
        bail!("stopped with errors: {}", errors.join("; "));
    }
    Ok(())
}
