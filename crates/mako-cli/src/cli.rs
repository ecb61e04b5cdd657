//! The command line (clap derive) and the dispatch to the command modules.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context as _, Result};
use clap::{Args, Parser, Subcommand};
use mako_control::{ClusterConfig, DataDir, Request};

use crate::{cluster_cmd, config_cmd, daemon, diag, fs_cmd, fsck_cmd, status};

/// Mako cluster file system administration.
#[derive(Parser, Debug)]
#[command(
    name = "mako",
    version,
    about = "Mako cluster file system administration",
    after_help = "Start here: `mako up` creates a one-node cluster with a file system and mounts it; \
                  `mako status` shows what runs; `mako down` stops it."
)]
pub struct Cli {
    /// Data directory holding cluster.toml, config.toml, disks/, makod.log and the
    /// control socket [default: $MAKO_DATA_DIR, else /var/lib/mako for root, else
    /// ~/.local/share/mako]
    #[arg(long, global = true, value_name = "DIR")]
    pub data_dir: Option<PathBuf>,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Create (first time) and start this node: disks, file system fs1, makod, mount.
    Up(UpArgs),
    /// Stop makod: flush, unmount everything, exit.
    Down,
    /// Node, daemon, file systems, mounts, space, inodes, pagepool.
    Status,
    /// Create a cluster of several makod processes on this machine without starting it
    /// (like mmcrcluster); `mako startup -a` starts it.
    #[command(subcommand)]
    Cluster(ClusterCommand),
    /// The nodes of a multi-process cluster (`mako up --nodes N`).
    #[command(subcommand)]
    Node(NodeCommand),
    /// Start the makod of some or all nodes of a multi-process cluster (like mmstartup).
    Startup(NodeSelection),
    /// Stop the makod of some or all nodes of a multi-process cluster (like
    /// mmshutdown): each writes back, gives its tokens back and unmounts.
    Shutdown(NodeSelection),
    /// Create, show, mount and unmount file systems.
    #[command(subcommand)]
    Fs(FsCommand),
    /// Create and show disks.
    #[command(subcommand)]
    Disk(DiskCommand),
    /// Check a file system, and repair it with -y (like e2fsck; unmounted, or --online).
    /// Exit 0 clean, 1 errors corrected, 4 errors left, 8 operational error,
    /// 16 usage error, 32 cancelled.
    Fsck(FsckArgs),
    /// Show, explain and change configuration parameters.
    #[command(subcommand)]
    Config(ConfigCommand),
    /// Install the mount helper `mount.fuse.mako` (a link to this program), so that
    /// `mount -t fuse.mako mako:fs1 DIR` and /etc/fstab lines work (root only).
    InstallHelper {
        /// Where mount(8) looks for helpers
        #[arg(long, default_value = "/sbin")]
        dir: String,
        /// Remove the helper instead
        #[arg(long)]
        remove: bool,
    },
    /// Diagnostics from the running daemon (like mmdiag).
    #[command(subcommand)]
    Diag(DiagCommand),
    /// Streaming I/O benchmark (gpfsperf-style) on any directory.
    Perf {
        #[command(flatten)]
        args: mako_bench::PerfArgs,
    },
    /// io500-style benchmark phases and score on any directory.
    Bench {
        #[command(flatten)]
        args: mako_bench::BenchArgs,
    },
    /// Write every dirty cached block to disk; with --drop-caches also empty the
    /// pagepool of clean data (benchmarks use it before read phases).
    Sync {
        #[arg(long)]
        drop_caches: bool,
    },
}

#[derive(Subcommand, Debug)]
pub enum ClusterCommand {
    /// Create the cluster: its key, its nodes (node0 … node<N-1>, each with its own data
    /// directory, loopback port and mount point), its disks and file system fs1, as
    /// `mako up --nodes N` does, but start nothing.
    Create(ClusterCreateArgs),
}

#[derive(Args, Debug, Default)]
pub struct ClusterCreateArgs {
    /// Cluster name [default: mako]
    #[arg(long, value_name = "NAME")]
    pub name: Option<String>,
    /// The quorum nodes, comma-separated (names node0 … or numbers) [default: the
    /// first 1 (1-2 nodes), 3 (3-4) or 5 nodes]
    #[arg(long = "quorum-nodes", value_name = "NODES", value_delimiter = ',')]
    pub quorum_nodes: Vec<String>,
    /// The manager nodes, comma-separated (names or numbers): the token manager is
    /// sharded over them, and the first runs the file-system manager [default: node0]
    #[arg(long = "manager-nodes", value_name = "NODES", value_delimiter = ',')]
    pub manager_nodes: Vec<String>,
    #[command(flatten)]
    pub up: UpArgs,
}

#[derive(Subcommand, Debug)]
pub enum NodeCommand {
    /// Every node with its roles and state, asked over the network (like mmgetstate
    /// -a): active, the cluster manager, or why it does not answer.
    Show,
    /// Add a node to the cluster (like mmaddnode): into the replicated configuration,
    /// with a data directory `<cluster data dir>/NAME` to start it from (`mako startup
    /// -N NAME`). Run in the cluster's overview data directory.
    Add {
        /// The new node's name
        name: String,
        /// Its address, IP:port
        #[arg(long, value_name = "IP:PORT")]
        address: String,
        /// Its roles (only `client` for now: quorum and manager roles are refused)
        #[arg(long, value_name = "ROLES", value_delimiter = ',')]
        roles: Vec<String>,
    },
    /// Remove a node from the cluster (like mmdelnode): refused while it runs, mounts a
    /// file system, serves a disk or is a quorum node; it cannot join again afterwards.
    Remove {
        /// The node's name
        name: String,
    },
}

/// Which nodes `mako startup|shutdown` acts on.
#[derive(Args, Debug, Clone)]
pub struct NodeSelection {
    /// Every node
    #[arg(short = 'a', long = "all", conflicts_with = "nodes")]
    pub all: bool,
    /// These nodes (names or numbers), comma-separated
    #[arg(
        short = 'N',
        long = "nodes",
        value_name = "NODES",
        value_delimiter = ','
    )]
    pub nodes: Vec<String>,
}

#[derive(Args, Debug, Default)]
pub struct UpArgs {
    /// Number of file-backed disks to create (first time only) [default: 4]
    #[arg(long, value_name = "N")]
    pub disks: Option<u32>,
    /// Size of each disk file, created sparse (first time only) [default: 8G]
    #[arg(long, value_name = "SIZE")]
    pub disk_size: Option<String>,
    /// File system block size, 64K to 16M (first time only) [default: 4M]
    #[arg(long, value_name = "SIZE")]
    pub block_size: Option<String>,
    /// Where fs1 is mounted (first time only) [default: /mako/fs1 for root, else ~/mako/fs1]
    #[arg(long, value_name = "PATH")]
    pub mountpoint: Option<PathBuf>,
    /// Cache size of the daemon (stored in config.toml as `pagepool`)
    #[arg(long, value_name = "SIZE")]
    pub pagepool: Option<String>,
    /// A cluster of N makod processes on this machine (first time only): node i has
    /// its own data directory (`<data dir>/node<i>`), loopback port and mount point
    /// (`<mount point>.node<i>`); node 0 runs the managers; the disks are shared files
    #[arg(long, value_name = "N")]
    pub nodes: Option<u32>,
    /// With --nodes: only these nodes (numbers, primary first) open the disk files; they
    /// serve every disk as its NSD servers and the other nodes reach the disks through
    /// them (first time only) [default: every node opens the disk files itself]
    #[arg(long = "nsd-servers", value_name = "NODES", value_delimiter = ',')]
    pub nsd_servers: Vec<u32>,
    /// With --nodes: room for this many nodes in all (recovery logs of the file system),
    /// so `mako node add` can add nodes later (first time only) [default: --nodes]
    #[arg(long = "max-nodes", value_name = "N")]
    pub max_nodes: Option<u32>,
}

// The command line is parsed once; the size difference between variants is irrelevant.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand, Debug)]
pub enum FsCommand {
    /// Create a file system on disks defined with `mako disk create` (like mmcrfs).
    Create(FsCreateArgs),
    /// Delete a file system (like mmdelfs): refused while any node mounts it; its disks
    /// stay defined and free, their headers cleared so it can never be mounted again.
    Delete {
        /// File system
        name: String,
    },
    /// Every descriptor parameter of a file system (like mmlsfs); works with makod down.
    Show {
        /// File system [default: all]
        name: Option<String>,
    },
    /// Mount a file system now and at every start (like mmmount); with a MOUNTPOINT,
    /// mount it there now (one more mount point; not remembered for the next start).
    Mount {
        /// File system
        name: String,
        /// Mount options, as `mount -o` takes them: ro, rw, remount, noatime, relatime,
        /// strictatime, nosuid, nodev, noexec (and their opposites)
        #[arg(short = 'o', value_name = "OPTIONS", default_value = "")]
        options: String,
        /// Where to mount it [default: its mount point, `mako fs show`]
        mountpoint: Option<PathBuf>,
        #[command(flatten)]
        on: FsNodes,
    },
    /// Unmount a file system from every mount point now and stop mounting it at start
    /// (like mmumount); with a MOUNTPOINT, unmount only that one.
    Unmount {
        /// File system
        name: String,
        /// The mount point to unmount [default: all of them]
        mountpoint: Option<PathBuf>,
        #[command(flatten)]
        on: FsNodes,
    },
}

/// On which nodes of a multi-process cluster `mako fs mount|unmount` acts (like
/// mmmount -a / -N); without either, on this data directory's own node.
#[derive(Args, Debug, Clone, Default)]
pub struct FsNodes {
    /// On every node of the cluster
    #[arg(short = 'a', long = "all", conflicts_with = "nodes")]
    pub all: bool,
    /// On these nodes (names or numbers), comma-separated
    #[arg(
        short = 'N',
        long = "nodes",
        value_name = "NODES",
        value_delimiter = ','
    )]
    pub nodes: Vec<String>,
}

impl FsNodes {
    /// True if -a or -N was given.
    pub fn given(&self) -> bool {
        self.all || !self.nodes.is_empty()
    }

    pub fn selection(&self) -> NodeSelection {
        NodeSelection {
            all: self.all,
            nodes: self.nodes.clone(),
        }
    }
}

#[derive(Args, Debug, Clone)]
pub struct FsCreateArgs {
    /// File system name
    pub name: String,
    /// Disks: NAME[:POOL[:FAILUREGROUP[:USAGE]]], comma-separated or repeated
    #[arg(
        short = 'd',
        long = "disks",
        value_name = "DISKSPEC",
        required = true,
        value_delimiter = ','
    )]
    pub disks: Vec<String>,
    /// Block size, a power of two from 64K to 16M
    #[arg(
        short = 'B',
        long = "block-size",
        value_name = "SIZE",
        default_value = "4M"
    )]
    pub block_size: String,
    /// Indirect block size, a power of two from 4K to min(block size, 256K)
    #[arg(
        short = 'I',
        long = "indirect-size",
        value_name = "SIZE",
        default_value = "32K"
    )]
    pub indirect_size: String,
    /// Inode size: 512, 1K or 4K
    #[arg(
        short = 'i',
        long = "inode-size",
        value_name = "SIZE",
        default_value = "4K"
    )]
    pub inode_size: String,
    /// Default metadata replicas (1..3)
    #[arg(short = 'm', value_name = "N", default_value_t = 1)]
    pub metadata_replicas: u8,
    /// Maximum metadata replicas (1..3)
    #[arg(short = 'M', value_name = "N", default_value_t = 2)]
    pub max_metadata_replicas: u8,
    /// Default data replicas (1..3)
    #[arg(short = 'r', value_name = "N", default_value_t = 1)]
    pub data_replicas: u8,
    /// Maximum data replicas (1..3)
    #[arg(short = 'R', value_name = "N", default_value_t = 2)]
    pub max_data_replicas: u8,
    /// Block placement: scatter or cluster
    #[arg(short = 'j', value_name = "LAYOUT", default_value = "scatter")]
    pub layout: String,
    /// Maximum number of inodes [default: derived from the disk space]
    #[arg(long = "inodes", value_name = "N")]
    pub inodes: Option<String>,
    /// Recovery log size per node
    #[arg(long = "log-size", value_name = "SIZE", default_value = "32M")]
    pub log_size: String,
    /// Nodes that may mount the file system: one recovery log each (like mmcrfs -n)
    #[arg(short = 'n', long = "nodes", value_name = "N", default_value_t = 1)]
    pub nodes: u32,
    /// Give directories a full block when they leave the inode
    #[arg(long)]
    pub avoid_dir_fragments: bool,
    /// Pre-split new directories to this hash tree level (0..10)
    #[arg(long = "pre-split-levels", value_name = "N", default_value_t = 0)]
    pub pre_split_levels: u8,
    /// Mount point [default: /mako/NAME for root, else ~/mako/NAME]
    #[arg(short = 'T', long = "mountpoint", value_name = "PATH")]
    pub mountpoint: Option<PathBuf>,
    /// Mount automatically when makod starts: yes or no
    #[arg(short = 'A', value_name = "yes|no", default_value = "yes", value_parser = ["yes", "no"])]
    pub automount: String,
}

/// Most scan threads `--threads` accepts.
pub const FSCK_THREADS_MAX: u64 = 1024;

#[derive(Args, Debug, Clone)]
pub struct FsckArgs {
    /// File system
    pub name: String,
    /// Check only and change nothing (the default)
    #[arg(short = 'n', long = "no", conflicts_with = "yes")]
    pub no: bool,
    /// Repair everything found, without asking
    #[arg(short = 'y', long = "yes")]
    pub yes: bool,
    /// Threads scanning inode ranges in parallel [default: the number of cores]
    #[arg(long, value_name = "N", value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=FSCK_THREADS_MAX))]
    pub threads: Option<usize>,
    /// Print the report as JSON on stdout (progress stays on stderr)
    #[arg(long)]
    pub json: bool,
    /// Check while makod has the file system mounted: read-only, of its committed
    /// state; new commits (fsync) wait until the check ends, other work goes on
    #[arg(long, conflicts_with = "yes")]
    pub online: bool,
}

#[derive(Subcommand, Debug)]
pub enum DiskCommand {
    /// Define a file-backed disk and create its sparse file (like mmcrnsd).
    Create(DiskCreateArgs),
    /// Delete a disk no file system uses (like mmdelnsd); its file is kept.
    Delete {
        /// Disk name
        name: String,
    },
    /// Every disk with its space, pool, failure group and state (like mmlsdisk).
    Show {
        /// Only the disks of this file system
        fs: Option<String>,
    },
}

#[derive(Args, Debug, Clone)]
pub struct DiskCreateArgs {
    /// Disk name
    pub name: String,
    /// Size of the disk file (created sparse)
    #[arg(long, value_name = "SIZE")]
    pub size: String,
    /// File to create [default: DATA_DIR/disks/NAME.img]
    #[arg(long, value_name = "PATH")]
    pub path: Option<PathBuf>,
    /// Storage pool
    #[arg(long, default_value = "system")]
    pub pool: String,
    /// Failure group [default: one more than the highest in use]
    #[arg(long = "failure-group", value_name = "N")]
    pub failure_group: Option<i32>,
    /// dataAndMetadata, dataOnly, metadataOnly or descOnly
    #[arg(long, default_value = "dataAndMetadata")]
    pub usage: String,
    /// Its NSD servers, node names of a multi-node cluster, primary first (like
    /// mmcrnsd's servers=): nodes without local access reach the disk through them
    #[arg(long, value_name = "NODES", value_delimiter = ',')]
    pub servers: Vec<String>,
}

#[derive(Subcommand, Debug)]
pub enum ConfigCommand {
    /// Set a parameter in config.toml; -i also changes the running daemon.
    Set {
        /// NAME=VALUE, e.g. pagepool=4G
        assignment: String,
        /// Apply to the running daemon now as well (parameters that allow it)
        #[arg(short = 'i', long = "immediate")]
        immediate: bool,
        /// In a multi-process cluster: only on these nodes (comma-separated); without
        /// it the value is cluster-wide. A cluster's values are replicated and every
        /// node applies them
        #[arg(
            short = 'N',
            long = "nodes",
            value_name = "NODES",
            value_delimiter = ','
        )]
        nodes: Vec<String>,
    },
    /// Every parameter (or one) with its value, source, default and range.
    Show {
        /// Parameter name
        name: Option<String>,
    },
    /// What a parameter does, its range, default and when changes apply.
    Explain {
        /// Parameter name
        name: String,
    },
    /// Return a parameter to its default.
    Unset {
        /// Parameter name
        name: String,
        /// In a multi-process cluster: remove these nodes' own values (comma-separated);
        /// without it the cluster-wide value
        #[arg(
            short = 'N',
            long = "nodes",
            value_name = "NODES",
            value_delimiter = ','
        )]
        nodes: Vec<String>,
    },
}

#[derive(Subcommand, Debug)]
pub enum DiagCommand {
    /// Recent I/O: start time, R/W, buffer type, disk:sector, sectors, times, thread.
    Iohist {
        /// Number of most recent I/Os
        #[arg(short = 'n', value_name = "N", default_value_t = 50)]
        last: usize,
        #[command(flatten)]
        output: JsonFlag,
    },
    /// Threads blocked longer than a threshold and what they wait for.
    Waiters {
        /// Only waiters blocked at least this long
        #[arg(long = "threshold-ms", value_name = "N", default_value_t = 0)]
        threshold_ms: u64,
        #[command(flatten)]
        output: JsonFlag,
    },
    /// Lock acquisition and contention counters.
    Counters {
        #[command(flatten)]
        output: JsonFlag,
    },
    /// Per file system and per disk I/O counters.
    Stats {
        #[command(flatten)]
        output: JsonFlag,
    },
    /// Tokens held and by whom.
    Tokens {
        #[command(flatten)]
        output: JsonFlag,
    },
    /// The configuration the daemon is running with.
    Config {
        #[command(flatten)]
        output: JsonFlag,
    },
}

#[derive(Args, Debug, Clone, Copy)]
pub struct JsonFlag {
    /// Print JSON for machine reading
    #[arg(long)]
    pub json: bool,
}

/// What every command needs: where the data directory is.
pub struct Context {
    pub data: DataDir,
}

impl Context {
    /// The cluster configuration of this data directory.
    pub fn cluster(&self) -> Result<ClusterConfig> {
        Ok(ClusterConfig::load(&self.data.root)?)
    }
}

/// Runs a parsed command line.
pub fn run(cli: Cli) -> Result<ExitCode> {
    let root = cli
        .data_dir
        .clone()
        .or_else(|| {
            std::env::var_os("MAKO_DATA_DIR")
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
        })
        .unwrap_or_else(mako_control::default_data_dir);
    let context = Context {
        data: DataDir::new(root),
    };
    match cli.command {
        Command::Up(args) => daemon::up(&context, &args),
        Command::Down => daemon::down(&context),
        Command::Status => status::status(&context),
        Command::Cluster(ClusterCommand::Create(args)) => {
            crate::nodes_cmd::cluster_create(&context, &args)
        }
        Command::Node(NodeCommand::Show) => cluster_cmd::node_show(&context),
        Command::Node(NodeCommand::Add {
            name,
            address,
            roles,
        }) => crate::nodes_cmd::node_add(&context, &name, &address, &roles),
        Command::Node(NodeCommand::Remove { name }) => {
            crate::nodes_cmd::node_remove(&context, &name)
        }
        Command::Startup(sel) => cluster_cmd::startup(&context, &sel),
        Command::Shutdown(sel) => cluster_cmd::shutdown(&context, &sel),
        Command::Fs(FsCommand::Create(args)) => fs_cmd::create(&context, &args),
        Command::Fs(FsCommand::Delete { name }) => fs_cmd::fs_delete(&context, &name),
        Command::Fs(FsCommand::Show { name }) => fs_cmd::show(&context, name.as_deref()),
        Command::Fs(FsCommand::Mount {
            name,
            options,
            mountpoint,
            on,
        }) => fs_cmd::mount(&context, &name, true, &options, mountpoint.as_deref(), &on),
        Command::Fs(FsCommand::Unmount {
            name,
            mountpoint,
            on,
        }) => fs_cmd::mount(&context, &name, false, "", mountpoint.as_deref(), &on),
        Command::InstallHelper { dir, remove } => {
            crate::mount_helper::install(std::path::Path::new(&dir), remove)
        }
        Command::Disk(DiskCommand::Create(args)) => fs_cmd::disk_create(&context, &args),
        Command::Disk(DiskCommand::Delete { name }) => fs_cmd::disk_delete(&context, &name),
        Command::Disk(DiskCommand::Show { fs }) => fs_cmd::disk_show(&context, fs.as_deref()),
        Command::Fsck(args) => Ok(fsck_cmd::run(&context, &args)),
        Command::Config(command) => config_cmd::run(&context, command),
        Command::Diag(command) => diag::run(&context, command),
        Command::Perf { args } => {
            mako_bench::run_perf(&args)?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Bench { args } => {
            let hooks = bench_hooks(&context, &args.dir);
            mako_bench::run_bench(&args, &hooks)?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Sync { drop_caches } => {
            let request = if drop_caches {
                Request::ClearCache { fs: None }
            } else {
                Request::Sync
            };
            let message = daemon::call_ok(&context, &request)?;
            println!("{message}");
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// When a benchmarked directory is inside a Mako mount, read phases must start with a
/// cold pagepool as well as a cold kernel cache: ask the mount's makod to drop its
/// cache. With a cluster of several makod processes on this machine (`mako up --nodes
/// N`, run from its overview data directory) every node's mount point is known, so
/// `mako bench DIR --also DIR2 …` drops the pagepool of each node it works through.
fn bench_hooks(context: &Context, _dir: &std::path::Path) -> mako_bench::BenchHooks {
    let Ok(cluster) = ClusterConfig::load(&context.data.root) else {
        return mako_bench::BenchHooks::default();
    };
    let mounts = bench_mounts(context, &cluster);
    if mounts.is_empty() {
        return mako_bench::BenchHooks::default();
    }
    mako_bench::BenchHooks {
        drop_caches: Some(Box::new(move |dir| {
            let absolute = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
            let Some((mountpoint, socket, fs_name)) = mounts
                .iter()
                .filter(|(m, _, _)| absolute.starts_with(m))
                .max_by_key(|(m, _, _)| m.components().count())
            else {
                // Not a Mako mount (a reference directory): the kernel's drop is all.
                return Ok(());
            };
            let mut client = mako_control::ControlClient::connect(socket).with_context(|| {
                format!(
                    "cannot reach the makod of {} ({})",
                    mountpoint.display(),
                    socket.display()
                )
            })?;
            match client.call(&Request::ClearCache {
                fs: Some(fs_name.clone()),
            })? {
                mako_control::Response::Ok { .. } => Ok(()),
                mako_control::Response::Error { message } => Err(anyhow::anyhow!(
                    "makod of {} could not clear the cache of {fs_name}: {message}",
                    mountpoint.display()
                )),
                other => Err(anyhow::anyhow!(
                    "makod answered clear_cache with `{}`",
                    other.name()
                )),
            }
            .context("dropping the pagepool before a read phase")
        })),
    }
}

/// Every mount point of this data directory's cluster on this machine, with the control
/// socket of the makod that serves it and the file system's name: the file systems'
/// own mount points (one makod), and each node's (several makod processes).
fn bench_mounts(
    context: &Context,
    cluster: &ClusterConfig,
) -> Vec<(std::path::PathBuf, std::path::PathBuf, String)> {
    let mut mounts = Vec::new();
    for fs in &cluster.filesystems {
        mounts.push((
            fs.mountpoint.clone(),
            context.data.socket_file(),
            fs.name.clone(),
        ));
    }
    for node in &cluster.nodes {
        let data = DataDir::new(&node.data_dir);
        if mako_control::same_dir(&node.data_dir, &context.data.root) {
            continue;
        }
        let Ok(own) = ClusterConfig::load(&node.data_dir) else {
            continue;
        };
        for fs in &own.filesystems {
            mounts.push((fs.mountpoint.clone(), data.socket_file(), fs.name.clone()));
        }
    }
    mounts
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    fn parse(line: &str) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(line.split_whitespace())
    }

    #[test]
    fn command_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn every_command_parses() {
        let lines = [
            "mako up",
            "mako up --disks 2 --disk-size 1G --block-size 1M --mountpoint /tmp/m --pagepool 1G",
            "mako --data-dir /tmp/x down",
            "mako up --nodes 3 --nsd-servers 1,0",
            "mako status --data-dir /tmp/x",
            "mako fs create fs2 -d d4,d5:system:2:dataOnly -B 1M -I 16K -i 512 -m 1 -M 2 -r 1 -R 2 \
             -j cluster --inodes 1M --log-size 16M --avoid-dir-fragments --pre-split-levels 2 -T /mnt/fs2 -A no",
            "mako fs create fs2 -d d4 -d d5",
            "mako fs show",
            "mako fs show fs1",
            "mako fs mount fs1",
            "mako fs unmount fs1",
            "mako fs mount fs1 -a",
            "mako fs mount fs1 -N node1,node2 -o ro",
            "mako fs unmount fs1 -N node2",
            "mako disk create d9 --size 10G --path /tmp/d9.img --pool data --failure-group 3 --usage dataOnly",
            "mako disk create d9 --size 1G --servers node0,node1",
            "mako disk show",
            "mako disk delete d9",
            "mako fs delete fs2",
            "mako disk show fs1",
            "mako config set pagepool=4G",
            "mako config set maxMBpS=4096 -i",
            "mako config show",
            "mako config show pagepool",
            "mako config explain pagepool",
            "mako config unset pagepool",
            "mako config set maxMBpS=4096 -N node1,node2",
            "mako config unset maxMBpS -N node1",
            "mako node show",
            "mako cluster create --nodes 3",
            "mako cluster create --name c1 --nodes 4 --quorum-nodes node0,node1,node3 --disks 2 --disk-size 1G",
            "mako startup -a",
            "mako shutdown -N node1,node2",
            "mako diag iohist -n 10 --json",
            "mako diag waiters --threshold-ms 100",
            "mako diag counters",
            "mako diag stats --json",
            "mako diag tokens",
            "mako diag config",
            "mako sync",
            "mako bench /tmp",
            "mako fsck fs1",
            "mako fsck fs1 -n",
            "mako fsck fs1 -y --threads 4 --json",
            "mako fsck fs1 --online -n",
        ];
        for line in lines {
            if let Err(e) = parse(line) {
                panic!("{line}: {e}");
            }
        }
        let cli = parse("mako fs create fs2 -d d4,d5:system:2 -d d6").unwrap();
        match cli.command {
            Command::Fs(FsCommand::Create(args)) => {
                assert_eq!(args.disks, ["d4", "d5:system:2", "d6"]);
                assert_eq!(args.block_size, "4M");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn perf_accepts_gpfsperf_options() {
        let args =
            mako_bench::normalize_args("mako perf write seq /tmp/x -th 4".split_whitespace());
        assert!(Cli::try_parse_from(args).is_ok());
    }

    #[test]
    fn bad_command_lines_are_refused() {
        for line in [
            "mako fs create fs2",
            "mako fs create fs2 -d d1 -A maybe",
            "mako disk create d9",
            "mako config set",
            "mako diag iohist -n lots",
            "mako frobnicate",
            "mako fsck",
            "mako fsck fs1 -n -y",
            "mako fsck fs1 --threads 0",
            "mako fsck fs1 --online -y",
            "mako startup -a -N node1",
            "mako fs mount fs1 -a -N node1",
        ] {
            assert!(parse(line).is_err(), "{line}");
        }
    }
}
