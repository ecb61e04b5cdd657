//! `mako status`: the node, the daemon, every file system with its space, inodes and
//! pagepool, and every disk; with the daemon down, what cluster.toml says.

use std::process::ExitCode;

use anyhow::Result;
use mako_control::{ClusterConfig, DaemonStatus, DataDir};

use crate::cli::Context;
use crate::daemon::{is_mounted, query_status};
use crate::table::Table;
use crate::units::{human_bytes, human_duration, percent};

/// `mako status`.
pub fn status(context: &Context) -> Result<ExitCode> {
    let cluster = context.cluster()?;
    if !cluster.nodes.is_empty() {
        print!(
            "{}",
            crate::nodes_cmd::render_nodes(&cluster, &context.data)
        );
        return Ok(ExitCode::SUCCESS);
    }
    match query_status(&context.data)? {
        Some(status) => print!("{}", render_status(&cluster, &status, &context.data)),
        None => print!("{}", render_offline(&cluster, &context.data)),
    }
    Ok(ExitCode::SUCCESS)
}

/// The status of a running daemon.
pub fn render_status(cluster: &ClusterConfig, status: &DaemonStatus, data: &DataDir) -> String {
    let mut out = String::new();
    out.push_str(&format!(
        "Cluster {}, node {} (id {})\n",
        cluster.cluster_name, status.node_name, status.node_id
    ));
    out.push_str(&format!(
        "makod   running, pid {}, up {}, version {}\n",
        status.pid,
        human_duration(status.uptime_secs),
        status.version
    ));
    out.push_str(&format!(
        "Data    {}  (log: {})\n\n",
        status.data_dir,
        data.log_file().display()
    ));

    let mut filesystems = Table::new(&[
        "File system",
        "Mount point",
        "State",
        "Size",
        "Used",
        "Free",
        "Use%",
        "Inodes used",
        "Inodes max",
        "Pagepool used/size",
        "Dirty",
    ])
    .right_align(&[3, 4, 5, 6, 7, 8, 9, 10]);
    for fs in &status.filesystems {
        let state = match (fs.mounted, fs.read_only) {
            (true, true) => "mounted ro",
            (true, false) => "mounted",
            (false, _) => "not mounted",
        };
        if fs.mounted {
            let used = fs.total_bytes.saturating_sub(fs.free_bytes);
            filesystems.row(vec![
                fs.name.clone(),
                fs.mountpoint.clone(),
                state.to_string(),
                human_bytes(fs.total_bytes),
                human_bytes(used),
                human_bytes(fs.free_bytes),
                format!("{}%", percent(used, fs.total_bytes)),
                fs.inodes_used.to_string(),
                fs.inodes_max.to_string(),
                format!(
                    "{} / {}",
                    human_bytes(fs.pagepool_used_bytes),
                    human_bytes(fs.pagepool_bytes)
                ),
                human_bytes(fs.pagepool_dirty_bytes),
            ]);
        } else {
            let mut row = vec![fs.name.clone(), fs.mountpoint.clone(), state.to_string()];
            row.extend(std::iter::repeat_n("-".to_string(), 8));
            filesystems.row(row);
        }
    }
    // File systems in cluster.toml the daemon does not report (created after it started).
    for fs in &cluster.filesystems {
        if !status.filesystems.iter().any(|s| s.name == fs.name) {
            let mut row = vec![
                fs.name.clone(),
                fs.mountpoint.display().to_string(),
                "unknown to makod".to_string(),
            ];
            row.extend(std::iter::repeat_n("-".to_string(), 8));
            filesystems.row(row);
        }
    }
    if filesystems.is_empty() {
        out.push_str("No file systems. Create one with `mako fs create NAME -d DISK,...`.\n");
    } else {
        out.push_str(&filesystems.render());
    }

    // Every mount point with its options (a file system may be mounted at several).
    let mut mounts = Table::new(&["File system", "Mounted on", "Options"]);
    for fs in &status.filesystems {
        for m in &fs.mounts {
            mounts.row(vec![
                fs.name.clone(),
                m.mountpoint.clone(),
                m.options.clone(),
            ]);
        }
    }
    if !mounts.is_empty() {
        out.push('\n');
        out.push_str(&mounts.render());
    }

    let mut disks = Table::new(&[
        "Disk",
        "File system",
        "Path",
        "Size",
        "Free",
        "Use%",
        "Pool",
        "FG",
        "Usage",
        "Status",
    ])
    .right_align(&[3, 4, 5, 7]);
    for fs in &status.filesystems {
        for disk in &fs.disks {
            let used = disk.size_bytes.saturating_sub(disk.free_bytes);
            disks.row(vec![
                disk.name.clone(),
                fs.name.clone(),
                disk.path.clone(),
                human_bytes(disk.size_bytes),
                if fs.mounted {
                    human_bytes(disk.free_bytes)
                } else {
                    "-".into()
                },
                if fs.mounted {
                    format!("{}%", percent(used, disk.size_bytes))
                } else {
                    "-".into()
                },
                disk.pool.clone(),
                disk.failure_group.to_string(),
                disk.usage.clone(),
                disk.status.clone(),
            ]);
        }
    }
    if !disks.is_empty() {
        out.push('\n');
        out.push_str(&disks.render());
    }
    let attention: Vec<String> = status
        .filesystems
        .iter()
        .flat_map(|fs| fs.disks.iter().map(move |d| (fs, d)))
        .filter(|(_, d)| d.status != "ready")
        .map(|(fs, d)| format!("disk {} of {} is {}", d.name, fs.name, d.status))
        .chain(
            cluster
                .filesystems
                .iter()
                .filter(|f| f.automount)
                .filter(|f| {
                    status
                        .filesystems
                        .iter()
                        .any(|s| s.name == f.name && !s.mounted)
                })
                .map(|f| {
                    format!(
                        "{} should be mounted (automount) but is not: `mako fs mount {}`, \
                         and see the log",
                        f.name, f.name
                    )
                }),
        )
        .collect();
    if !attention.is_empty() {
        out.push_str("\nAttention:\n");
        for line in attention {
            out.push_str(&format!("  - {line}\n"));
        }
    }
    out
}

/// What cluster.toml says, for a daemon that is down.
pub fn render_offline(cluster: &ClusterConfig, data: &DataDir) -> String {
    let mut out = String::new();
    out.push_str(&format!(
        "Cluster {}, node {} (id {})\n",
        cluster.cluster_name, cluster.node_name, cluster.node_id
    ));
    out.push_str("makod   NOT RUNNING: start it with `mako up`\n");
    out.push_str(&format!(
        "Data    {}  (log: {})\n\n",
        data.root.display(),
        data.log_file().display()
    ));
    let mut filesystems = Table::new(&[
        "File system",
        "Mount point",
        "Automount",
        "Disks",
        "Kernel mount",
    ]);
    let mut stale = Vec::new();
    for fs in &cluster.filesystems {
        let mounted = is_mounted(&fs.mountpoint);
        if mounted {
            stale.push(fs.mountpoint.clone());
        }
        filesystems.row(vec![
            fs.name.clone(),
            fs.mountpoint.display().to_string(),
            if fs.automount { "yes" } else { "no" }.to_string(),
            fs.disks.join(","),
            if mounted { "STALE (no daemon)" } else { "none" }.to_string(),
        ]);
    }
    if filesystems.is_empty() {
        out.push_str("No file systems.\n");
    } else {
        out.push_str(&filesystems.render());
    }
    let mut disks = Table::new(&["Disk", "File system", "Path", "Size", "Pool", "FG", "Usage"])
        .right_align(&[3, 5]);
    for disk in &cluster.disks {
        disks.row(vec![
            disk.name.clone(),
            disk.fs.clone().unwrap_or_else(|| "(free)".into()),
            disk.path.display().to_string(),
            human_bytes(disk.size_bytes),
            disk.pool.clone(),
            disk.failure_group.to_string(),
            disk.usage.clone(),
        ]);
    }
    if !disks.is_empty() {
        out.push('\n');
        out.push_str(&disks.render());
    }
    out.push_str("\nSpace, inodes and pagepool are reported by the daemon only.\n");
    for m in stale {
        out.push_str(&format!(
            "warning: {} is still mounted although makod is down (left by a makod that was \
             killed or crashed?); `mako up` cleans it up and starts makod, `mako down` only \
             cleans up\n",
            m.display()
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use mako_control::{DiskDef, DiskStatusView, FsDef, FsStatus};
    use std::path::PathBuf;

    fn cluster() -> ClusterConfig {
        let mut c = ClusterConfig::new("mako", "node1", 0);
        c.disks.push(DiskDef {
            name: "d0".into(),
            path: PathBuf::from("/data/disks/d0.img"),
            size_bytes: 8 << 30,
            pool: "system".into(),
            failure_group: 1,
            usage: "dataAndMetadata".into(),
            fs: Some("fs1".into()),
            servers: Vec::new(),
        });
        c.filesystems.push(FsDef {
            name: "fs1".into(),
            disks: vec!["d0".into()],
            mountpoint: PathBuf::from("/nonexistent/mako/fs1"),
            automount: true,
            mount_options: String::new(),
        });
        c
    }

    fn daemon_status(mounted: bool) -> DaemonStatus {
        DaemonStatus {
            node_name: "node1".into(),
            node_id: 0,
            pid: 4242,
            data_dir: "/data".into(),
            uptime_secs: 3725,
            version: "0.1.0".into(),
            filesystems: vec![FsStatus {
                name: "fs1".into(),
                mountpoint: "/nonexistent/mako/fs1".into(),
                mounted,
                block_bytes: 4 << 20,
                subblock_bytes: 8 << 10,
                inode_bytes: 4096,
                total_bytes: 8 << 30,
                free_bytes: 6 << 30,
                inodes_used: 12,
                inodes_max: 65536,
                pagepool_bytes: 1 << 30,
                pagepool_used_bytes: 10 << 20,
                pagepool_dirty_bytes: 0,
                read_only: false,
                mounts: Vec::new(),
                disks: vec![DiskStatusView {
                    name: "d0".into(),
                    path: "/data/disks/d0.img".into(),
                    size_bytes: 8 << 30,
                    free_bytes: 6 << 30,
                    pool: "system".into(),
                    failure_group: 1,
                    usage: "dataAndMetadata".into(),
                    status: "ready".into(),
                }],
            }],
        }
    }

    #[test]
    fn renders_a_running_daemon() {
        let text = render_status(&cluster(), &daemon_status(true), &DataDir::new("/data"));
        assert!(text.contains("Cluster mako, node node1 (id 0)"), "{text}");
        assert!(text.contains("running, pid 4242, up 1h 02m"), "{text}");
        assert!(text.contains("/data/makod.log"), "{text}");
        let fs_line = text.lines().find(|l| l.starts_with("fs1 ")).unwrap();
        for cell in [
            "mounted",
            "8.0 GiB",
            "2.0 GiB",
            "6.0 GiB",
            "25%",
            "12",
            "65536",
            "10.0 MiB / 1.0 GiB",
        ] {
            assert!(fs_line.contains(cell), "{cell} missing: {fs_line}");
        }
        let disk_line = text.lines().find(|l| l.starts_with("d0 ")).unwrap();
        assert!(disk_line.contains("/data/disks/d0.img"), "{disk_line}");
        assert!(disk_line.contains("ready"), "{disk_line}");
        assert!(!text.contains("Attention"), "{text}");
    }

    #[test]
    fn flags_what_needs_attention() {
        let mut status = daemon_status(false);
        status.filesystems[0].disks[0].status = "down".into();
        let text = render_status(&cluster(), &status, &DataDir::new("/data"));
        assert!(text.contains("not mounted"), "{text}");
        assert!(text.contains("disk d0 of fs1 is down"), "{text}");
        assert!(text.contains("`mako fs mount fs1`"), "{text}");
    }

    #[test]
    fn renders_a_stopped_daemon() {
        let text = render_offline(&cluster(), &DataDir::new("/data"));
        assert!(
            text.contains("NOT RUNNING: start it with `mako up`"),
            "{text}"
        );
        assert!(text.contains("/nonexistent/mako/fs1"), "{text}");
        assert!(text.contains("8.0 GiB"), "{text}");
    }
}
