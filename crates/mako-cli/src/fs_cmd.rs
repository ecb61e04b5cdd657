//! File system and disk commands: `mako fs create|show|mount|unmount` and
//! `mako disk create|show`. Creation and `show` work on the disks directly (the daemon
//! may be down); mount and unmount go through the daemon.

use std::collections::BTreeSet;
use std::fs::OpenOptions;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{anyhow, bail, Context as _, Result};
use mako_control::{ClusterConfig, DaemonStatus, DataDir, DiskDef, FsDef, Request, DISK_USAGES};
use mako_format::descriptor::{Descriptor, LayoutMap};
use mako_format::disk_header::DiskUsage;
use mako_format::geometry::{default_subblocks, BLOCK_BYTES_MAX, BLOCK_BYTES_MIN};
use mako_fs::mkfs::{DiskSpec, MkfsParams};

use crate::cli::{Context, DiskCreateArgs, FsCreateArgs};
use crate::daemon::{self, query_status};
use crate::diskspec::parse_disk_spec;
use crate::table::Table;
use crate::units::{
    human_bytes, local_date_time, parse_count_flag, parse_size_flag, percent, short_bytes,
};

/// Most replicas of anything (`-m -M -r -R`).
const REPLICAS_MAX: u8 = 3;
/// Largest `--pre-split-levels` (the `DirPreSplitLevels` range).
const PRE_SPLIT_LEVELS_MAX: u8 = 10;
/// Recovery log size range (`--log-size`).
const LOG_BYTES_MIN: u64 = 1 << 20;
const LOG_BYTES_MAX: u64 = 16 << 30;
/// Largest indirect block (`-I`).
const INDIRECT_BYTES_MAX: u32 = 256 << 10;
/// Smallest indirect block (`-I`).
const INDIRECT_BYTES_MIN: u32 = 4 << 10;

/// Reads a block size given to `flag` (`-B` or `--block-size`).
pub fn parse_block_size(flag: &str, text: &str) -> Result<u32> {
    let bytes = parse_size_flag(flag, text)?;
    let ok = (u64::from(BLOCK_BYTES_MIN)..=u64::from(BLOCK_BYTES_MAX)).contains(&bytes)
        && bytes.is_power_of_two();
    if !ok {
        bail!("{flag} {text}: block size must be a power of two from 64K to 16M");
    }
    Ok(u32::try_from(bytes).unwrap_or(BLOCK_BYTES_MAX))
}

/// Reads `-I` for a file system of `block_bytes` blocks.
fn parse_indirect_size(text: &str, block_bytes: u32) -> Result<u32> {
    let bytes = parse_size_flag("-I", text)?;
    let limit = block_bytes.min(INDIRECT_BYTES_MAX);
    let ok = (u64::from(INDIRECT_BYTES_MIN)..=u64::from(limit)).contains(&bytes)
        && bytes.is_power_of_two();
    if !ok {
        bail!(
            "-I {text}: indirect block size must be a power of two from 4K to {} \
             (the smaller of the block size and 256K)",
            short_bytes(u64::from(limit))
        );
    }
    let indirect = u32::try_from(bytes).unwrap_or(limit);
    let subblock = block_bytes / default_subblocks(block_bytes).unwrap_or(32);
    if indirect < subblock {
        bail!(
            "-I {text}: indirect block size must be at least the subblock size, {} for -B {}",
            short_bytes(u64::from(subblock)),
            short_bytes(u64::from(block_bytes))
        );
    }
    Ok(indirect)
}

/// Reads `-i`.
fn parse_inode_size(text: &str) -> Result<u32> {
    let bytes = parse_size_flag("-i", text)?;
    match bytes {
        512 | 1024 | 4096 => Ok(bytes as u32),
        _ => bail!("-i {text}: inode size must be 512, 1K or 4K"),
    }
}

fn check_replicas(flag: &str, what: &str, value: u8) -> Result<()> {
    if !(1..=REPLICAS_MAX).contains(&value) {
        bail!("{flag} {value}: {what} must be from 1 to {REPLICAS_MAX}");
    }
    Ok(())
}

/// Creates a sparse file of `size_bytes`; refuses to overwrite.
pub fn create_sparse_file(path: &Path, size_bytes: u64) -> Result<()> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)
            .with_context(|| format!("cannot create directory {}", parent.display()))?;
    }
    let file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)
        .with_context(|| format!("cannot create disk file {}", path.display()))?;
    file.set_len(size_bytes).with_context(|| {
        format!(
            "cannot size disk file {} to {size_bytes} bytes",
            path.display()
        )
    })?;
    file.sync_all()
        .with_context(|| format!("cannot fsync disk file {}", path.display()))?;
    Ok(())
}

/// The `mako_fs` view of cluster.toml disks.
pub fn disk_specs(disks: &[DiskDef]) -> Result<Vec<DiskSpec>> {
    disks
        .iter()
        .map(|d| {
            let usage = DiskUsage::parse(&d.usage).ok_or_else(|| {
                anyhow!(
                    "disk {} has usage `{}`; use one of {}",
                    d.name,
                    d.usage,
                    DISK_USAGES.join(", ")
                )
            })?;
            Ok(DiskSpec {
                name: d.name.clone(),
                path: d.path.clone(),
                pool: d.pool.clone(),
                failure_group: d.failure_group,
                usage,
            })
        })
        .collect()
}

/// Default mount point of file system `name`: beside `default_mountpoint()`.
fn default_mountpoint_for(name: &str) -> PathBuf {
    let fs1 = mako_control::default_mountpoint();
    fs1.parent()
        .map_or_else(|| PathBuf::from("/mako").join(name), |p| p.join(name))
}

/// `mako fs create`.
pub fn create(context: &Context, args: &FsCreateArgs) -> Result<ExitCode> {
    let mut cluster = context.cluster()?;
    let (params, chosen, mountpoint) = plan_create(&cluster, args)?;

    // The disk files must exist at their size: `mako disk create` made them.
    for disk in &chosen {
        let metadata = std::fs::metadata(&disk.path).with_context(|| {
            format!(
                "disk {}: cannot open {}; recreate it with `mako disk create {} --size {}`",
                disk.name,
                disk.path.display(),
                disk.name,
                short_bytes(disk.size_bytes)
            )
        })?;
        if metadata.is_file() && metadata.len() < disk.size_bytes {
            bail!(
                "disk {}: {} is {} but cluster.toml says {}; fix the file or the entry",
                disk.name,
                disk.path.display(),
                human_bytes(metadata.len()),
                human_bytes(disk.size_bytes)
            );
        }
    }
    let specs = disk_specs(&chosen)?;
    eprintln!(
        "Formatting {} on {} disks ({}) …",
        args.name,
        chosen.len(),
        chosen
            .iter()
            .map(|d| d.name.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    );
    let descriptor = mako_fs::mkfs::format(&specs, &params)
        .map_err(|e| anyhow!("cannot create file system {}: {e}", args.name))?;

    for chosen_disk in &chosen {
        if let Some(disk) = cluster
            .disks
            .iter_mut()
            .find(|d| d.name == chosen_disk.name)
        {
            *disk = chosen_disk.clone();
            disk.fs = Some(args.name.clone());
        }
    }
    let fs = FsDef {
        name: args.name.clone(),
        disks: chosen.iter().map(|d| d.name.clone()).collect(),
        mountpoint,
        automount: args.automount == "yes",
        mount_options: String::new(),
    };
    cluster.filesystems.push(fs.clone());
    cluster.save(&context.data.root).with_context(|| {
        format!(
            "file system {} was formatted but cluster.toml could not be updated",
            args.name
        )
    })?;

    println!("File system {} created.\n", args.name);
    print!("{}", render_descriptor(&descriptor, &fs, "no"));
    println!();
    let daemon_up = query_status(&context.data).ok().flatten().is_some();
    match (fs.automount, daemon_up) {
        (_, true) => println!("Mount it now:  mako fs mount {}", fs.name),
        (true, false) => println!(
            "It will be mounted on {} at the next `mako up`.",
            fs.mountpoint.display()
        ),
        (false, false) => println!(
            "Start makod with `mako up`, then mount it with `mako fs mount {}`.",
            fs.name
        ),
    }
    Ok(ExitCode::SUCCESS)
}

/// Checks every `fs create` argument against the cluster; returns the mkfs
/// parameters, the chosen disks (with the DISKSPEC overrides applied) and the mount
/// point. Nothing is changed.
pub fn plan_create(
    cluster: &ClusterConfig,
    args: &FsCreateArgs,
) -> Result<(MkfsParams, Vec<DiskDef>, PathBuf)> {
    mako_control::cluster::validate_name("file system name", &args.name).map_err(|p| anyhow!(p))?;
    if cluster.filesystem(&args.name).is_some() {
        bail!(
            "file system {} exists already (`mako fs show {}`); choose another name",
            args.name,
            args.name
        );
    }
    let block_bytes = parse_block_size("-B", &args.block_size)?;
    let indirect_bytes = parse_indirect_size(&args.indirect_size, block_bytes)?;
    let inode_bytes = parse_inode_size(&args.inode_size)?;
    check_replicas("-m", "default metadata replicas", args.metadata_replicas)?;
    check_replicas(
        "-M",
        "maximum metadata replicas",
        args.max_metadata_replicas,
    )?;
    check_replicas("-r", "default data replicas", args.data_replicas)?;
    check_replicas("-R", "maximum data replicas", args.max_data_replicas)?;
    if args.metadata_replicas > args.max_metadata_replicas {
        bail!(
            "-m {} -M {}: default metadata replicas cannot exceed the maximum (-M)",
            args.metadata_replicas,
            args.max_metadata_replicas
        );
    }
    if args.data_replicas > args.max_data_replicas {
        bail!(
            "-r {} -R {}: default data replicas cannot exceed the maximum (-R)",
            args.data_replicas,
            args.max_data_replicas
        );
    }
    let layout = LayoutMap::parse(&args.layout)
        .ok_or_else(|| anyhow!("-j {}: layout must be scatter or cluster", args.layout))?;
    let inodes_max = args
        .inodes
        .as_deref()
        .map(|text| parse_count_flag("--inodes", text))
        .transpose()?;
    if inodes_max == Some(0) {
        bail!("--inodes 0: a file system needs at least one inode; leave it out for the default");
    }
    let log_bytes = parse_size_flag("--log-size", &args.log_size)?;
    if !(LOG_BYTES_MIN..=LOG_BYTES_MAX).contains(&log_bytes) {
        bail!(
            "--log-size {}: recovery log size must be from {} to {}",
            args.log_size,
            short_bytes(LOG_BYTES_MIN),
            short_bytes(LOG_BYTES_MAX)
        );
    }
    if !(1..=mako_fs::mkfs::NODES_MAX).contains(&args.nodes) {
        bail!(
            "-n {}: a file system is created for 1 to {} nodes (each node's recovery log is made at its first mount)",
            args.nodes,
            mako_fs::mkfs::NODES_MAX
        );
    }
    if args.pre_split_levels > PRE_SPLIT_LEVELS_MAX {
        bail!(
            "--pre-split-levels {}: must be from 0 to {PRE_SPLIT_LEVELS_MAX}",
            args.pre_split_levels
        );
    }

    let mut chosen: Vec<DiskDef> = Vec::new();
    for text in &args.disks {
        let spec = parse_disk_spec(text)?;
        let Some(disk) = cluster.disk(&spec.name) else {
            bail!(
                "-d {text}: no disk `{}` in cluster.toml; create it with `mako disk create {} --size SIZE` \
                 (`mako disk show` lists the disks)",
                spec.name,
                spec.name
            );
        };
        if let Some(owner) = &disk.fs {
            bail!(
                "-d {text}: disk {} already belongs to file system {owner}; pick a free disk \
                 (`mako disk show` lists them) or create one with `mako disk create`",
                disk.name
            );
        }
        if chosen.iter().any(|d| d.name == disk.name) {
            bail!("-d {text}: disk {} is given twice", disk.name);
        }
        let mut disk = disk.clone();
        if let Some(pool) = spec.pool {
            disk.pool = pool;
        }
        if let Some(fg) = spec.failure_group {
            disk.failure_group = fg;
        }
        if let Some(usage) = spec.usage {
            disk.usage = usage;
        }
        chosen.push(disk);
    }
    let groups = |holds: fn(DiskUsage) -> bool| -> usize {
        chosen
            .iter()
            .filter(|d| DiskUsage::parse(&d.usage).is_some_and(holds))
            .map(|d| d.failure_group)
            .collect::<BTreeSet<_>>()
            .len()
    };
    let metadata_groups = groups(DiskUsage::holds_metadata);
    let data_groups = groups(DiskUsage::holds_data);
    if metadata_groups == 0 {
        bail!("-d: no disk holds metadata; give at least one disk usage dataAndMetadata or metadataOnly");
    }
    if data_groups == 0 {
        bail!("-d: no disk holds data; give at least one disk usage dataAndMetadata or dataOnly");
    }
    if usize::from(args.metadata_replicas) > metadata_groups {
        bail!(
            "-m {}: each metadata replica needs its own failure group, but the metadata disks \
             given are in {metadata_groups}; add disks in other failure groups or lower -m",
            args.metadata_replicas
        );
    }
    if usize::from(args.data_replicas) > data_groups {
        bail!(
            "-r {}: each data replica needs its own failure group, but the data disks given \
             are in {data_groups}; add disks in other failure groups or lower -r",
            args.data_replicas
        );
    }
    let mountpoint = match &args.mountpoint {
        Some(path) => daemon::absolute(path)?,
        None => default_mountpoint_for(&args.name),
    };
    if let Some(other) = cluster
        .filesystems
        .iter()
        .find(|f| f.mountpoint == mountpoint)
    {
        bail!(
            "-T {}: file system {} is mounted there already; choose another mount point",
            mountpoint.display(),
            other.name
        );
    }
    let params = MkfsParams {
        name: args.name.clone(),
        block_bytes,
        subblocks_per_block: None,
        inode_bytes,
        indirect_bytes,
        default_metadata_replicas: args.metadata_replicas,
        max_metadata_replicas: args.max_metadata_replicas,
        default_data_replicas: args.data_replicas,
        max_data_replicas: args.max_data_replicas,
        layout,
        inodes_max,
        log_bytes,
        avoid_dir_fragments: args.avoid_dir_fragments,
        dir_pre_split_levels: args.pre_split_levels,
        regions: None,
        log_count: args.nodes,
        reproducible: None,
    };
    Ok((params, chosen, mountpoint))
}

/// `xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`.
fn uuid_text(bytes: &[u8; 16]) -> String {
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}

/// The mmlsfs-style flag/value/description table of a descriptor.
pub fn render_descriptor(descriptor: &Descriptor, fs: &FsDef, mounted: &str) -> String {
    let g = &descriptor.geometry;
    let bytes = |b: u64| format!("{b}");
    let yes_no = |b: bool| if b { "yes" } else { "no" }.to_string();
    let disk_name = |index: u32| {
        descriptor
            .disks
            .iter()
            .find(|d| d.index == index)
            .map_or_else(|| format!("#{index}"), |d| d.name.clone())
    };
    let rows: Vec<(&str, String, String)> = vec![
        (
            "-f",
            bytes(u64::from(g.subblock_bytes())),
            format!(
                "Minimum fragment (subblock) size in bytes ({})",
                human_bytes(u64::from(g.subblock_bytes()))
            ),
        ),
        (
            "-i",
            bytes(u64::from(g.inode_bytes)),
            "Inode size in bytes".into(),
        ),
        (
            "-I",
            bytes(u64::from(g.indirect_bytes)),
            "Indirect block size in bytes".into(),
        ),
        (
            "-m",
            descriptor.default_metadata_replicas.to_string(),
            "Default number of metadata replicas".into(),
        ),
        (
            "-M",
            descriptor.max_metadata_replicas.to_string(),
            "Maximum number of metadata replicas".into(),
        ),
        (
            "-r",
            descriptor.default_data_replicas.to_string(),
            "Default number of data replicas".into(),
        ),
        (
            "-R",
            descriptor.max_data_replicas.to_string(),
            "Maximum number of data replicas".into(),
        ),
        (
            "-j",
            descriptor.layout.name().to_string(),
            "Block allocation type".into(),
        ),
        (
            "-B",
            bytes(u64::from(g.block_bytes)),
            format!("Block size ({})", human_bytes(u64::from(g.block_bytes))),
        ),
        (
            "--subblocks-per-full-block",
            g.subblocks_per_block.to_string(),
            "Number of subblocks per full block".into(),
        ),
        (
            "--inode-limit",
            descriptor.inodes_max.to_string(),
            "Maximum number of inodes".into(),
        ),
        (
            "-L",
            bytes(descriptor.log_bytes),
            format!(
                "Recovery log size per node ({})",
                human_bytes(descriptor.log_bytes)
            ),
        ),
        (
            "--avoid-dir-fragments",
            yes_no(descriptor.avoid_dir_fragments),
            "avoidDirFragments: directories skip fragments".into(),
        ),
        (
            "--pre-split-levels",
            descriptor.dir_pre_split_levels.to_string(),
            "DirPreSplitLevels: new directories pre-split to this level".into(),
        ),
        (
            "--regions",
            descriptor.regions.to_string(),
            "Allocation regions".into(),
        ),
        (
            "-d",
            descriptor
                .disks
                .iter()
                .map(|d| d.name.clone())
                .collect::<Vec<_>>()
                .join(";"),
            "Disks in file system".into(),
        ),
        (
            "--desc-disks",
            descriptor
                .descriptor_disks
                .iter()
                .map(|&i| disk_name(i))
                .collect::<Vec<_>>()
                .join(";"),
            format!(
                "Disks holding a descriptor replica ({} copies)",
                descriptor.descriptor_disks.len()
            ),
        ),
        (
            "--generation",
            descriptor.generation.to_string(),
            "Descriptor generation".into(),
        ),
        (
            "-V",
            descriptor.version.to_string(),
            "On-disk format version".into(),
        ),
        (
            "--uid",
            uuid_text(&descriptor.fs_uuid),
            "File system UUID".into(),
        ),
        (
            "--create-time",
            local_date_time(descriptor.created_unix),
            "File system creation time".into(),
        ),
        (
            "-T",
            fs.mountpoint.display().to_string(),
            "Default mount point".into(),
        ),
        (
            "-A",
            yes_no(fs.automount),
            "Automatic mount when makod starts".into(),
        ),
        ("--mounted", mounted.to_string(), "Mounted now".into()),
    ];
    let mut table = Table::new(&["flag", "value", "description"]);
    for (flag, value, description) in rows {
        table.row(vec![format!(" {flag}"), value, description]);
    }
    format!(
        "File system {} (device {})\n{}",
        descriptor.fs_name,
        fs.name,
        table.render()
    )
}

fn mounted_text(
    status: Option<&DaemonStatus>,
    fs: &FsDef,
    descriptor: Option<&Descriptor>,
) -> String {
    match status {
        Some(status) => match status.filesystems.iter().find(|s| s.name == fs.name) {
            Some(s) if s.mounted => format!("yes, on {}", s.mountpoint),
            Some(_) => "no".to_string(),
            None => "no (unknown to the running makod)".to_string(),
        },
        None if descriptor.is_some_and(|d| d.mounted) => {
            "no (makod down; last stop was not clean: the log is replayed at the next mount)"
                .to_string()
        }
        None => "no (makod not running)".to_string(),
    }
}

/// Reads the descriptor of a file system from its disks.
pub(crate) fn read_descriptor(cluster: &ClusterConfig, fs: &FsDef) -> Result<Descriptor> {
    let disks: Vec<DiskDef> = cluster.disks_of(fs).into_iter().cloned().collect();
    let specs = disk_specs(&disks)?;
    mako_fs::mount::read_descriptor(&specs).map_err(|e| {
        anyhow!(
            "cannot read the descriptor of {} from its disks ({}): {e}",
            fs.name,
            disks
                .iter()
                .map(|d| d.path.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        )
    })
}

/// `mako fs show [NAME]`.
pub fn show(context: &Context, name: Option<&str>) -> Result<ExitCode> {
    let cluster = context.cluster()?;
    let filesystems: Vec<&FsDef> = match name {
        Some(name) => vec![cluster
            .filesystem(name)
            .ok_or_else(|| no_such_fs(&cluster, name))?],
        None => cluster.filesystems.iter().collect(),
    };
    if filesystems.is_empty() {
        println!("No file systems. Create one with `mako fs create NAME -d DISK,...`.");
        return Ok(ExitCode::SUCCESS);
    }
    let status = query_status(&context.data).ok().flatten();
    let mut failed = false;
    for (i, fs) in filesystems.iter().enumerate() {
        if i > 0 {
            println!();
        }
        match read_descriptor(&cluster, fs) {
            Ok(descriptor) => {
                let mounted = mounted_text(status.as_ref(), fs, Some(&descriptor));
                print!("{}", render_descriptor(&descriptor, fs, &mounted));
            }
            Err(error) => {
                failed = true;
                eprintln!("mako: error: {error:#}");
            }
        }
    }
    Ok(if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

pub fn no_such_fs(cluster: &ClusterConfig, name: &str) -> anyhow::Error {
    let names: Vec<&str> = cluster
        .filesystems
        .iter()
        .map(|f| f.name.as_str())
        .collect();
    anyhow!(
        "no file system `{name}` in this cluster; {}",
        if names.is_empty() {
            "there are none yet (`mako fs create`)".to_string()
        } else {
            format!("known: {}", names.join(", "))
        }
    )
}

/// `mako fs mount NAME` (`mount = true`) and `mako fs unmount NAME`.
pub fn mount(
    context: &Context,
    name: &str,
    mount: bool,
    options: &str,
    mountpoint: Option<&Path>,
    on: &crate::cli::FsNodes,
) -> Result<ExitCode> {
    let mut cluster = context.cluster()?;
    if cluster.nodes.is_empty() {
        if on.given() {
            bail!(
                "-a and -N name nodes of a cluster of several makod processes (`mako up \
                 --nodes N`); the cluster in {} is one makod: leave them out",
                context.data.root.display()
            );
        }
    } else {
        let own = cluster
            .node(cluster.node_id)
            .is_some_and(|n| mako_control::same_dir(&n.data_dir, &context.data.root));
        if on.given() || !own {
            if mountpoint.is_some() {
                bail!(
                    "a MOUNTPOINT is for one node: give it with that node's --data-dir and \
                     without -a/-N (each node mounts at its own mount point otherwise)"
                );
            }
            return crate::cluster_cmd::fs_mount_nodes(context, name, mount, options, on);
        }
    }
    let fs = cluster
        .filesystem(name)
        .ok_or_else(|| no_such_fs(&cluster, name))?
        .clone();
    // Options are checked here too, so a typo is reported even with makod down.
    let request_options =
        mako_control::mount_options::MountRequestOptions::parse(options, &Default::default())
            .map_err(|e| anyhow!("{e}"))?;
    let mountpoint = mountpoint.map(mako_control::mount_table::canonical_mountpoint);
    let remount = request_options.remount;
    if remount && !mount {
        bail!("`remount` is an option of `mako fs mount`");
    }
    let daemon_up = daemon::try_connect(&context.data)?.is_some();
    if daemon_up {
        let request = if mount {
            let at = mountpoint.clone().unwrap_or_else(|| fs.mountpoint.clone());
            if !remount {
                std::fs::create_dir_all(&at)
                    .with_context(|| format!("cannot create mount point {}", at.display()))?;
            }
            Request::Mount {
                fs: name.to_string(),
                mountpoint: mountpoint.as_ref().map(|p| p.display().to_string()),
                options: options.to_string(),
            }
        } else {
            Request::Unmount {
                fs: name.to_string(),
                mountpoint: mountpoint.as_ref().map(|p| p.display().to_string()),
            }
        };
        let message = daemon::call_ok(context, &request)?;
        if !message.is_empty() {
            println!("{message}");
        }
    }
    // A mount at another mount point, or a remount, is for now only (as `mount` without
    // fstab); the file system's own mount point, its options and whether it is mounted
    // at start are remembered in cluster.toml (as `mmmount` does).
    if mountpoint.is_some() || remount {
        if !daemon_up {
            eprintln!(
                "mako: error: makod is not running, so {name} is not {}; start it with `mako up`",
                if mount { "mounted" } else { "mounted anywhere" }
            );
            return Ok(ExitCode::FAILURE);
        }
        return Ok(ExitCode::SUCCESS);
    }
    if let Some(entry) = cluster.filesystem_mut(name) {
        entry.automount = mount;
        if mount {
            entry.mount_options = options.to_string();
        }
    }
    cluster.save(&context.data.root)?;
    match (mount, daemon_up) {
        (true, true) => {
            println!(
                "{name} is mounted on {} and will be mounted at every `mako up`{}.",
                fs.mountpoint.display(),
                if options.is_empty() {
                    String::new()
                } else {
                    format!(" with {}", request_options.options)
                }
            );
            Ok(ExitCode::SUCCESS)
        }
        (false, true) => {
            println!("{name} is unmounted and will not be mounted at `mako up` (`mako fs mount {name}` undoes this).");
            Ok(ExitCode::SUCCESS)
        }
        (true, false) => {
            eprintln!(
                "mako: error: makod is not running, so {name} is not mounted now. It is set to \
                 mount at start: run `mako up`."
            );
            Ok(ExitCode::FAILURE)
        }
        (false, false) => {
            println!("makod is not running, so {name} is not mounted; it will not be mounted at the next `mako up`.");
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// `mako disk create`.
pub fn disk_create(context: &Context, args: &DiskCreateArgs) -> Result<ExitCode> {
    let mut cluster = context.cluster()?;
    mako_control::cluster::validate_name("disk name", &args.name).map_err(|p| anyhow!(p))?;
    if cluster.disk(&args.name).is_some() {
        bail!(
            "disk {} exists already (`mako disk show`); choose another name",
            args.name
        );
    }
    let size_bytes = parse_size_flag("--size", &args.size)?;
    let size_min = 2 * u64::from(BLOCK_BYTES_MAX);
    if size_bytes < size_min {
        bail!(
            "--size {}: a disk must be at least {}",
            args.size,
            short_bytes(size_min)
        );
    }
    let usage = DISK_USAGES
        .iter()
        .find(|u| u.eq_ignore_ascii_case(&args.usage))
        .ok_or_else(|| {
            anyhow!(
                "--usage {}: must be one of {}",
                args.usage,
                DISK_USAGES.join(", ")
            )
        })?;
    let path = match &args.path {
        Some(path) => daemon::absolute(path)?,
        None => context.data.disks_dir().join(format!("{}.img", args.name)),
    };
    if path.exists() {
        bail!(
            "--path {}: exists already; Mako does not overwrite files. Choose another path or \
             remove it if it is not needed",
            path.display()
        );
    }
    let failure_group = args.failure_group.unwrap_or_else(|| {
        cluster
            .disks
            .iter()
            .map(|d| d.failure_group)
            .max()
            .unwrap_or(0)
            + 1
    });
    let disk = DiskDef {
        name: args.name.clone(),
        path: path.clone(),
        size_bytes,
        pool: args.pool.clone(),
        failure_group,
        usage: usage.to_string(),
        fs: None,
        servers: args.servers.clone(),
    };
    cluster.disks.push(disk);
    cluster.validate()?;
    create_sparse_file(&path, size_bytes)?;
    if let Err(error) = cluster.save(&context.data.root) {
        let _ = std::fs::remove_file(&path);
        return Err(error.into());
    }
    println!(
        "Disk {} created: {} ({}, sparse), pool {}, failure group {failure_group}, {usage}.",
        args.name,
        path.display(),
        human_bytes(size_bytes),
        args.pool
    );
    println!("Use it:  mako fs create NAME -d {}", args.name);
    Ok(ExitCode::SUCCESS)
}

/// `mako disk show [FS]`.
pub fn disk_show(context: &Context, fs_name: Option<&str>) -> Result<ExitCode> {
    let cluster = context.cluster()?;
    if let Some(name) = fs_name {
        cluster
            .filesystem(name)
            .ok_or_else(|| no_such_fs(&cluster, name))?;
    }
    let status = query_status(&context.data).ok().flatten();
    let mut table = Table::new(&[
        "Disk",
        "File system",
        "Path",
        "Size",
        "Used",
        "Free",
        "Use%",
        "Pool",
        "FG",
        "Usage",
        "Status",
        "Desc",
    ])
    .right_align(&[3, 4, 5, 6, 8]);
    let mut notes: Vec<String> = Vec::new();
    let mut usage_missing = false;
    for fs in cluster
        .filesystems
        .iter()
        .filter(|f| fs_name.is_none_or(|n| n == f.name))
    {
        let descriptor = match read_descriptor(&cluster, fs) {
            Ok(d) => Some(d),
            Err(e) => {
                notes.push(format!("{e:#}"));
                None
            }
        };
        let fs_status = status
            .as_ref()
            .and_then(|s| s.filesystems.iter().find(|x| x.name == fs.name))
            .filter(|s| s.mounted);
        for disk in cluster.disks_of(fs) {
            let entry = descriptor
                .as_ref()
                .and_then(|d| d.disks.iter().find(|e| e.name == disk.name));
            let holds_descriptor = match (&descriptor, entry) {
                (Some(d), Some(e)) => {
                    if d.descriptor_disks.contains(&e.index) {
                        "yes"
                    } else {
                        "no"
                    }
                }
                _ => "?",
            };
            let live = fs_status.and_then(|s| s.disks.iter().find(|x| x.name == disk.name));
            let (used, free, pct, state) = match live {
                Some(l) => {
                    let used = l.size_bytes.saturating_sub(l.free_bytes);
                    (
                        human_bytes(used),
                        human_bytes(l.free_bytes),
                        format!("{}%", percent(used, l.size_bytes)),
                        l.status.clone(),
                    )
                }
                None => {
                    usage_missing = true;
                    (
                        "-".into(),
                        "-".into(),
                        "-".into(),
                        entry.map_or("?".to_string(), |e| e.status.name().to_string()),
                    )
                }
            };
            table.row(vec![
                disk.name.clone(),
                fs.name.clone(),
                // A node that reaches the disk through NSD servers says which it uses.
                live.map_or_else(|| disk.path.display().to_string(), |l| l.path.clone()),
                human_bytes(disk.size_bytes),
                used,
                free,
                pct,
                disk.pool.clone(),
                disk.failure_group.to_string(),
                disk.usage.clone(),
                state,
                holds_descriptor.to_string(),
            ]);
        }
    }
    if fs_name.is_none() {
        for disk in cluster.disks.iter().filter(|d| d.fs.is_none()) {
            table.row(vec![
                disk.name.clone(),
                "(free)".into(),
                disk.path.display().to_string(),
                human_bytes(disk.size_bytes),
                "-".into(),
                "-".into(),
                "-".into(),
                disk.pool.clone(),
                disk.failure_group.to_string(),
                disk.usage.clone(),
                "free".into(),
                "no".into(),
            ]);
        }
    }
    if table.is_empty() {
        println!("No disks. Create one with `mako disk create NAME --size SIZE`.");
        return Ok(ExitCode::SUCCESS);
    }
    print!("{}", table.render());
    if usage_missing {
        if status.is_none() {
            println!("\ndaemon down: usage not available (start it with `mako up`).");
        } else {
            println!("\nUsage is shown for mounted file systems only.");
        }
    }
    for note in &notes {
        eprintln!("warning: {note}");
    }
    Ok(ExitCode::SUCCESS)
}

/// Every cluster.toml that describes this cluster on this machine: the data
/// directory's own, every node's, and the overview a node's directory lies in.
fn cluster_files(context: &Context, cluster: &ClusterConfig) -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = vec![context.data.root.clone()];
    for n in &cluster.nodes {
        dirs.push(n.data_dir.clone());
        if let Some(parent) = n.data_dir.parent() {
            let overview = ClusterConfig::load(parent).ok();
            if overview.is_some_and(|o| o.nodes == cluster.nodes) {
                dirs.push(parent.to_path_buf());
            }
        }
    }
    let mut out: Vec<PathBuf> = Vec::new();
    for d in dirs {
        if ClusterConfig::exists(&d) && !out.iter().any(|o| mako_control::same_dir(o, &d)) {
            out.push(d);
        }
    }
    out
}

/// Applies `edit` to every cluster.toml of [`cluster_files`].
pub(crate) fn edit_cluster_files(
    context: &Context,
    cluster: &ClusterConfig,
    edit: impl Fn(&mut ClusterConfig),
) -> Result<()> {
    for dir in cluster_files(context, cluster) {
        let mut c = ClusterConfig::load(&dir)?;
        edit(&mut c);
        c.save(&dir)?;
    }
    Ok(())
}

/// Where `name` is mounted among the nodes of this cluster on this machine (makod's
/// account and the kernel's mount table), and the nodes that cannot tell.
fn mounted_where(
    context: &Context,
    cluster: &ClusterConfig,
    name: &str,
) -> (Vec<String>, Vec<String>) {
    let mut places: Vec<(String, DataDir)> = Vec::new();
    if cluster.nodes.is_empty() {
        places.push((cluster.node_name.clone(), context.data.clone()));
    } else {
        for n in &cluster.nodes {
            places.push((n.name.clone(), DataDir::new(&n.data_dir)));
        }
    }
    let (mut mounted, mut unknown) = (Vec::new(), Vec::new());
    for (node, dir) in places {
        let mountpoint = ClusterConfig::load(&dir.root)
            .ok()
            .and_then(|c| c.filesystem(name).map(|f| f.mountpoint.clone()));
        let in_kernel = mountpoint
            .as_ref()
            .is_some_and(|mp| mako_control::mount_table::is_mako_mount_of(mp, name));
        match daemon::query_status(&dir) {
            Ok(Some(s)) if s.filesystems.iter().any(|f| f.name == name && f.mounted) => {
                mounted.push(node)
            }
            _ if in_kernel => mounted.push(node),
            Ok(_) => {}
            Err(e) => unknown.push(format!("{node} ({e:#})")),
        }
    }
    (mounted, unknown)
}

/// Zeroes the disk header and the descriptor slot of `disk`, so that the file system
/// it belonged to cannot be found on it any more.
fn clear_disk_headers(disk: &DiskDef) -> Result<()> {
    use std::os::unix::fs::FileExt;
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(&disk.path)
        .with_context(|| format!("disk {}: cannot open {}", disk.name, disk.path.display()))?;
    let zeros = vec![
        0u8;
        mako_format::descriptor::DESCRIPTOR_OFFSET as usize
            + mako_format::descriptor::DESCRIPTOR_BYTES_MAX
    ];
    f.write_all_at(&zeros, 0)
        .and_then(|()| f.sync_all())
        .with_context(|| format!("disk {}: cannot clear {}", disk.name, disk.path.display()))?;
    Ok(())
}

/// `mako fs delete NAME` (like mmdelfs).
pub fn fs_delete(context: &Context, name: &str) -> Result<ExitCode> {
    let cluster = context.cluster()?;
    let fs = cluster
        .filesystem(name)
        .ok_or_else(|| no_such_fs(&cluster, name))?
        .clone();
    let multi = !cluster.nodes.is_empty();
    let (mounted, unknown) = mounted_where(context, &cluster, name);
    if !mounted.is_empty() {
        bail!(
            "{name} is mounted on {}; nothing was deleted. Unmount it first (`mako fs unmount \
             {name}{}`), then delete it",
            mounted.join(", "),
            if multi {
                format!(" -N {}", mounted.join(","))
            } else {
                String::new()
            }
        );
    }
    if !unknown.is_empty() {
        bail!(
            "cannot tell whether {name} is mounted on {}: its makod does not answer; nothing was \
             deleted. Stop or restart that node (`mako shutdown -N …`), then delete it",
            unknown.join(", ")
        );
    }
    if multi {
        let request = Request::ClusterDeleteFs {
            name: name.to_string(),
        };
        crate::cluster_cmd::change(context, &request, "; nothing was deleted")?;
    }
    let disks: Vec<DiskDef> = cluster.disks_of(&fs).into_iter().cloned().collect();
    for d in &disks {
        clear_disk_headers(d).with_context(|| {
            format!("{name} is deleted from the configuration, but its disks are not all cleared; run `mako fs delete {name}` again after fixing this")
        })?;
    }
    edit_cluster_files(context, &cluster, |c| {
        c.filesystems.retain(|f| f.name != name);
        for d in &mut c.disks {
            if d.fs.as_deref() == Some(name) {
                d.fs = None;
            }
        }
    })?;
    let names: Vec<&str> = disks.iter().map(|d| d.name.as_str()).collect();
    println!(
        "{name} deleted: its disks {} hold no file system any more (headers cleared) and are \
         free for `mako fs create` or `mako disk delete`.",
        names.join(", ")
    );
    Ok(ExitCode::SUCCESS)
}

/// `mako disk delete NAME` (like mmdelnsd).
pub fn disk_delete(context: &Context, name: &str) -> Result<ExitCode> {
    let cluster = context.cluster()?;
    let Some(disk) = cluster.disk(name).cloned() else {
        let known: Vec<&str> = cluster.disks.iter().map(|d| d.name.as_str()).collect();
        bail!(
            "there is no disk {name} (the disks are {}; `mako disk show`)",
            if known.is_empty() {
                "none".to_string()
            } else {
                known.join(", ")
            }
        );
    };
    let owner = cluster
        .filesystems
        .iter()
        .find(|f| f.disks.iter().any(|d| d == name))
        .map(|f| f.name.clone())
        .or_else(|| disk.fs.clone());
    if let Some(fs) = owner {
        bail!(
            "disk {name} belongs to file system {fs}; nothing was deleted. Delete the file system \
             first (`mako fs delete {fs}`, once it is unmounted everywhere)"
        );
    }
    if !cluster.nodes.is_empty() {
        let request = Request::ClusterDeleteDisk {
            name: name.to_string(),
        };
        crate::cluster_cmd::change(context, &request, "; nothing was deleted")?;
    }
    edit_cluster_files(context, &cluster, |c| c.disks.retain(|d| d.name != name))?;
    println!(
        "disk {name} deleted; its file {} is kept (remove it yourself if you do not need it).",
        disk.path.display()
    );
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    fn fs_create_args(line: &str) -> FsCreateArgs {
        let cli = crate::cli::Cli::try_parse_from(line.split_whitespace()).unwrap();
        match cli.command {
            crate::cli::Command::Fs(crate::cli::FsCommand::Create(args)) => args,
            other => panic!("{other:?}"),
        }
    }

    fn cluster_with_disks(dir: &Path, count: i32) -> ClusterConfig {
        let mut c = ClusterConfig::new("mako", "node1", 0);
        for i in 0..count {
            c.disks.push(DiskDef {
                name: format!("d{i}"),
                path: dir.join(format!("d{i}.img")),
                size_bytes: 64 << 20,
                pool: "system".into(),
                failure_group: i + 1,
                usage: "dataAndMetadata".into(),
                fs: None,
                servers: Vec::new(),
            });
        }
        c
    }

    fn plan_error(cluster: &ClusterConfig, line: &str) -> String {
        plan_create(cluster, &fs_create_args(line))
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn out_of_range_values_name_the_flag_and_range() {
        let c = cluster_with_disks(Path::new("/tmp"), 3);
        let cases = [
            (
                "-B 3M",
                "-B 3M: block size must be a power of two from 64K to 16M",
            ),
            (
                "-B 32M",
                "-B 32M: block size must be a power of two from 64K to 16M",
            ),
            ("-B 32K", "from 64K to 16M"),
            (
                "-B 1M -I 512K",
                "-I 512K: indirect block size must be a power of two from 4K to 256K",
            ),
            ("-B 64K -I 128K", "from 4K to 64K"),
            (
                "-I 4K",
                "-I 4K: indirect block size must be at least the subblock size, 8K for -B 4M",
            ),
            ("-i 2K", "-i 2K: inode size must be 512, 1K or 4K"),
            (
                "-m 4",
                "-m 4: default metadata replicas must be from 1 to 3",
            ),
            ("-R 0", "-R 0: maximum data replicas must be from 1 to 3"),
            (
                "-m 2 -M 1",
                "-m 2 -M 1: default metadata replicas cannot exceed the maximum",
            ),
            ("-j round", "-j round: layout must be scatter or cluster"),
            (
                "--log-size 4K",
                "--log-size 4K: recovery log size must be from 1M to 16G",
            ),
            (
                "--pre-split-levels 11",
                "--pre-split-levels 11: must be from 0 to 10",
            ),
            ("--inodes lots", "--inodes lots: cannot read a number"),
            ("-B 4Q", "-B 4Q: cannot read a size"),
        ];
        for (flags, expected) in cases {
            let message = plan_error(&c, &format!("mako fs create fs2 -d d0,d1 {flags}"));
            assert!(message.contains(expected), "{flags}: {message}");
        }
    }

    #[test]
    fn disks_are_checked() {
        let mut c = cluster_with_disks(Path::new("/tmp"), 3);
        c.disks[2].fs = Some("fs1".into());
        c.filesystems.push(FsDef {
            name: "fs1".into(),
            disks: vec!["d2".into()],
            mountpoint: "/mako/fs1".into(),
            automount: true,
            mount_options: String::new(),
        });
        let message = plan_error(&c, "mako fs create fs2 -d d0,d2");
        assert!(
            message.contains("disk d2 already belongs to file system fs1"),
            "{message}"
        );
        let message = plan_error(&c, "mako fs create fs2 -d d0,d9");
        assert!(
            message.contains("no disk `d9` in cluster.toml"),
            "{message}"
        );
        let message = plan_error(&c, "mako fs create fs2 -d d0,d0");
        assert!(message.contains("given twice"), "{message}");
        let message = plan_error(&c, "mako fs create fs1 -d d0");
        assert!(message.contains("exists already"), "{message}");
        let message = plan_error(&c, "mako fs create fs2 -d d0:system:1,d1:system:1 -m 2");
        assert!(
            message.contains("-m 2: each metadata replica needs its own failure group"),
            "{message}"
        );
        let message = plan_error(&c, "mako fs create fs2 -d d0:::dataOnly");
        assert!(message.contains("no disk holds metadata"), "{message}");
        let message = plan_error(&c, "mako fs create fs2 -d d0 -T /mako/fs1");
        assert!(
            message.contains("file system fs1 is mounted there already"),
            "{message}"
        );

        let (params, chosen, mountpoint) = plan_create(
            &c,
            &fs_create_args("mako fs create fs2 -d d0:data:7:dataOnly,d1 -B 1M -i 512 -I 16K -m 1 -r 2 -T /mnt/x"),
        )
        .unwrap();
        assert_eq!(params.block_bytes, 1 << 20);
        assert_eq!(params.inode_bytes, 512);
        assert_eq!(params.indirect_bytes, 16 << 10);
        assert_eq!(params.default_data_replicas, 2);
        assert_eq!(chosen[0].pool, "data");
        assert_eq!(chosen[0].failure_group, 7);
        assert_eq!(chosen[0].usage, "dataOnly");
        assert_eq!(chosen[1].pool, "system");
        assert_eq!(mountpoint, PathBuf::from("/mnt/x"));
    }

    #[test]
    fn create_formats_and_show_reads_back() {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        std::fs::create_dir_all(&data).unwrap();
        let mut cluster = cluster_with_disks(&data.join("disks"), 3);
        for d in &mut cluster.disks {
            d.size_bytes = 256 << 20;
        }
        cluster.save(&data).unwrap();
        for d in &cluster.disks {
            create_sparse_file(&d.path, d.size_bytes).unwrap();
        }
        let context = Context {
            data: mako_control::DataDir::new(&data),
        };
        let args = fs_create_args(&format!(
            "mako fs create fs2 -d d0,d1,d2:system:9 -B 1M -i 1K -I 64K -m 2 -M 3 -r 1 -R 2 \
             -j cluster --inodes 20000 --log-size 4M --avoid-dir-fragments --pre-split-levels 2 -T {}",
            dir.path().join("mnt").display()
        ));
        create(&context, &args).unwrap();

        let cluster = ClusterConfig::load(&data).unwrap();
        let fs = cluster.filesystem("fs2").unwrap().clone();
        assert_eq!(fs.disks, ["d0", "d1", "d2"]);
        assert!(fs.automount);
        assert_eq!(cluster.disk("d2").unwrap().failure_group, 9);
        assert_eq!(cluster.disk("d0").unwrap().fs.as_deref(), Some("fs2"));

        let descriptor = read_descriptor(&cluster, &fs).unwrap();
        assert_eq!(descriptor.fs_name, "fs2");
        assert_eq!(descriptor.geometry.block_bytes, 1 << 20);
        assert_eq!(descriptor.geometry.inode_bytes, 1024);
        assert_eq!(descriptor.geometry.indirect_bytes, 64 << 10);
        assert_eq!(descriptor.default_metadata_replicas, 2);
        assert_eq!(descriptor.max_metadata_replicas, 3);
        assert_eq!(descriptor.default_data_replicas, 1);
        assert_eq!(descriptor.max_data_replicas, 2);
        assert_eq!(descriptor.layout, LayoutMap::Cluster);
        assert!(descriptor.avoid_dir_fragments);
        assert_eq!(descriptor.dir_pre_split_levels, 2);
        assert_eq!(descriptor.log_bytes, 4 << 20);
        assert_eq!(descriptor.disks.len(), 3);

        let text = render_descriptor(&descriptor, &fs, "no");
        assert!(text.contains(" -B    "), "{text}");
        assert!(text.contains("1048576"), "{text}");
        assert!(text.contains("cluster"), "{text}");
        assert!(text.contains("d0;d1;d2"), "{text}");

        // The disks now belong to fs2.
        let again = plan_create(&cluster, &fs_create_args("mako fs create fs3 -d d1"));
        assert!(again
            .unwrap_err()
            .to_string()
            .contains("already belongs to file system fs2"));
    }
}
