//! The cluster configuration file `DIR/cluster.toml`: which node this is, which disks
//! exist, which file systems are made of which disks and where they are mounted.
//!
//! The file is small and rewritten whole: `save` writes a temporary file, fsyncs it,
//! renames it over the old one and fsyncs the directory, so a crash leaves either the
//! old or the new file. `load` validates everything and names the file and the
//! offending entry in its error.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// File name of the cluster configuration inside a data directory.
pub const CLUSTER_FILE_NAME: &str = "cluster.toml";

/// Usage names a disk may have (the seeds' `mmcrnsd` usage values).
pub const DISK_USAGES: [&str; 4] = ["dataAndMetadata", "dataOnly", "metadataOnly", "descOnly"];

/// Longest disk, file system, cluster or node name.
pub const NAME_BYTES_MAX: usize = 63;

/// Errors reading, validating or writing `cluster.toml`.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// The file does not exist: no cluster was created in this data directory.
    #[error(
        "no cluster in {}: {} does not exist; create one with `mako up` \
         (or pass the right --data-dir)",
        dir.display(), path.display()
    )]
    Missing {
        /// The data directory.
        dir: PathBuf,
        /// The file that was looked for.
        path: PathBuf,
    },
    /// Reading, writing, syncing or renaming failed.
    #[error("cannot {action} {}: {cause}; check the path and its permissions", path.display())]
    Io {
        /// What was being done.
        action: &'static str,
        /// The file concerned.
        path: PathBuf,
        /// The operating system's error.
        cause: std::io::Error,
    },
    /// The file is not valid TOML or has fields of the wrong type.
    #[error("{} is not a valid cluster file: {detail}; fix it or restore it from a backup", path.display())]
    Syntax {
        /// The file.
        path: PathBuf,
        /// The parser's message (with line and column).
        detail: String,
    },
    /// The contents contradict themselves (duplicate names, unknown disks, …).
    #[error("{}: {problem}", path.display())]
    Invalid {
        /// The file (or `cluster.toml` for a configuration not yet saved).
        path: PathBuf,
        /// What is wrong and what to do about it.
        problem: String,
    },
}

/// One disk known to the cluster (a block device or a file used as one).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DiskDef {
    /// Disk (NSD) name, unique in the cluster.
    pub name: String,
    /// Device or file path.
    pub path: PathBuf,
    /// Size in bytes.
    pub size_bytes: u64,
    /// Storage pool (`system` holds metadata).
    #[serde(default = "default_pool")]
    pub pool: String,
    /// Failure group: disks that can fail together share one.
    #[serde(default = "default_failure_group")]
    pub failure_group: i32,
    /// One of `DISK_USAGES`.
    #[serde(default = "default_usage")]
    pub usage: String,
    /// The file system this disk belongs to, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fs: Option<String>,
    /// Its NSD servers, by node name, primary first (docs/nsd.md): the nodes of a
    /// multi-process cluster that have no local access to the disk reach it through
    /// them. Empty: no server; every node that uses the disk opens it directly.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub servers: Vec<String>,
}

fn default_pool() -> String {
    "system".to_string()
}
fn default_failure_group() -> i32 {
    1
}
fn default_usage() -> String {
    "dataAndMetadata".to_string()
}

/// One file system of the cluster.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FsDef {
    /// File system name (the device name, like `fs1`).
    pub name: String,
    /// Names of its disks (each a `DiskDef` whose `fs` is this file system).
    pub disks: Vec<String>,
    /// Where the daemon mounts it.
    pub mountpoint: PathBuf,
    /// Mounted by the daemon when it starts.
    #[serde(default)]
    pub automount: bool,
    /// Options of the mount at `mountpoint` (`mako fs mount NAME -o …`), as `mount -o`
    /// takes them; empty for the defaults (`rw,relatime`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub mount_options: String,
}

/// One node of a cluster of several makod processes (`mako up --nodes N`). The list is
/// the same in every node's cluster.toml and in the cluster's overview directory.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeDef {
    /// Node number: selects its recovery log and names it on the network.
    pub id: u32,
    /// Node name.
    pub name: String,
    /// `IP:port` where its makod accepts the other nodes' connections.
    pub address: String,
    /// Its data directory on this machine (control socket, log, cluster key).
    pub data_dir: PathBuf,
    /// Runs the token manager and the file-system manager of every file system (one
    /// node for now; sharding over several manager nodes comes later).
    #[serde(default)]
    pub manager: bool,
    /// Keeps a copy of the replicated cluster configuration and votes in its raft
    /// quorum (1, 3 or 5 nodes). The other nodes follow it as learners.
    #[serde(default)]
    pub quorum: bool,
    /// The disks this node can open itself (`path` of their `[[disks]]` entry), by
    /// name; it reaches every other disk through the disk's NSD servers. Absent: every
    /// disk (the disk files are shared by the nodes of this machine). Empty: none (a
    /// node with no disk access of its own).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub local_disks: Option<Vec<String>>,
}

impl NodeDef {
    /// True if this node opens disk `name` itself.
    pub fn has_local(&self, name: &str) -> bool {
        self.local_disks
            .as_ref()
            .is_none_or(|l| l.iter().any(|d| d == name))
    }
}

/// File name of the cluster key inside a node's data directory: the secret that lets
/// its makod join the cluster (hex, one line, readable by its owner only).
pub const CLUSTER_KEY_FILE_NAME: &str = "cluster.key";

/// The whole cluster configuration file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterConfig {
    /// Cluster name.
    pub cluster_name: String,
    /// This node's name.
    pub node_name: String,
    /// This node's number (selects its recovery log).
    pub node_id: u32,
    /// Every disk known to the cluster.
    #[serde(default)]
    pub disks: Vec<DiskDef>,
    /// Every file system.
    #[serde(default)]
    pub filesystems: Vec<FsDef>,
    /// The nodes of a multi-process cluster; empty for one makod that is the whole
    /// cluster (what `mako up` makes).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nodes: Vec<NodeDef>,
}

impl ClusterConfig {
    /// A cluster with no disks or file systems.
    pub fn new(cluster_name: &str, node_name: &str, node_id: u32) -> Self {
        ClusterConfig {
            cluster_name: cluster_name.to_string(),
            node_name: node_name.to_string(),
            node_id,
            disks: Vec::new(),
            filesystems: Vec::new(),
            nodes: Vec::new(),
        }
    }

    /// Reads and validates `DIR/cluster.toml`.
    pub fn load(dir: &Path) -> Result<Self, ClusterError> {
        let path = dir.join(CLUSTER_FILE_NAME);
        let text = match fs::read_to_string(&path) {
            Ok(text) => text,
            Err(cause) if cause.kind() == std::io::ErrorKind::NotFound => {
                return Err(ClusterError::Missing {
                    dir: dir.to_path_buf(),
                    path,
                })
            }
            Err(cause) => {
                return Err(ClusterError::Io {
                    action: "read",
                    path,
                    cause,
                })
            }
        };
        Self::from_toml(&path, &text)
    }

    /// True if `DIR/cluster.toml` exists.
    pub fn exists(dir: &Path) -> bool {
        dir.join(CLUSTER_FILE_NAME).exists()
    }

    /// Parses and validates the text of a cluster file; `path` is used in errors.
    pub fn from_toml(path: &Path, text: &str) -> Result<Self, ClusterError> {
        let config: ClusterConfig = toml::from_str(text).map_err(|e| ClusterError::Syntax {
            path: path.to_path_buf(),
            detail: e.to_string().trim_end().replace('\n', " "),
        })?;
        config.validate_at(path)?;
        Ok(config)
    }

    /// The file's text.
    pub fn to_toml(&self) -> String {
        let body = toml::to_string_pretty(self)
            .unwrap_or_else(|e| unreachable!("a ClusterConfig always serializes: {e}"));
        format!(
            "# Mako cluster configuration, written by `mako`. Edit with care: \
             `mako status` checks it.\n{body}"
        )
    }

    /// Validates, then atomically replaces `DIR/cluster.toml`.
    ///
    /// 1. Write the whole file to a temporary name in the same directory.
    /// 2. fsync it, so its contents are durable before it has the real name.
    /// 3. Rename it over the old file (atomic within a directory).
    /// 4. fsync the directory, so the rename is durable.
    pub fn save(&self, dir: &Path) -> Result<(), ClusterError> {
        let path = dir.join(CLUSTER_FILE_NAME);
        self.validate_at(&path)?;
        let temporary = dir.join(format!(".{CLUSTER_FILE_NAME}.tmp.{}", std::process::id()));
        let io = |action: &'static str, path: &Path| {
            let path = path.to_path_buf();
            move |cause| ClusterError::Io {
                action,
                path,
                cause,
            }
        };
        let written = (|| {
            // 1.
            let mut file = OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .open(&temporary)
                .map_err(io("create", &temporary))?;
            file.write_all(self.to_toml().as_bytes())
                .map_err(io("write", &temporary))?;
            // 2.
            file.sync_all().map_err(io("fsync", &temporary))?;
            // 3.
            fs::rename(&temporary, &path).map_err(io("rename into place", &path))
        })();
        if written.is_err() {
            let _ = fs::remove_file(&temporary);
            return written;
        }
        // 4.
        File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(io("fsync the directory", dir))
    }

    /// Checks the configuration as if it were the file `DIR/cluster.toml`.
    pub fn validate(&self) -> Result<(), ClusterError> {
        self.validate_at(Path::new(CLUSTER_FILE_NAME))
    }

    fn validate_at(&self, path: &Path) -> Result<(), ClusterError> {
        self.problem().map_or(Ok(()), |problem| {
            Err(ClusterError::Invalid {
                path: path.to_path_buf(),
                problem,
            })
        })
    }

    /// The first inconsistency found, as a sentence that says what to fix.
    fn problem(&self) -> Option<String> {
        if let Err(p) = check_name("cluster_name", &self.cluster_name) {
            return Some(p);
        }
        if let Err(p) = check_name("node_name", &self.node_name) {
            return Some(p);
        }
        let mut disks: BTreeMap<&str, &DiskDef> = BTreeMap::new();
        let mut paths: BTreeMap<&Path, &str> = BTreeMap::new();
        for disk in &self.disks {
            if let Err(p) = check_name("disk name", &disk.name) {
                return Some(p);
            }
            if disks.insert(&disk.name, disk).is_some() {
                return Some(format!(
                    "disk `{}` is defined twice; disk names must be unique",
                    disk.name
                ));
            }
            if let Some(other) = paths.insert(&disk.path, &disk.name) {
                return Some(format!(
                    "disks `{other}` and `{}` both use {}; each disk needs its own device or file",
                    disk.name,
                    disk.path.display()
                ));
            }
            if !DISK_USAGES.contains(&disk.usage.as_str()) {
                return Some(format!(
                    "disk `{}` has usage `{}`; use one of {}",
                    disk.name,
                    disk.usage,
                    DISK_USAGES.join(", ")
                ));
            }
            if let Err(p) = check_name("pool name", &disk.pool) {
                return Some(format!("disk `{}`: {p}", disk.name));
            }
            if disk.size_bytes == 0 {
                return Some(format!("disk `{}` has size 0", disk.name));
            }
        }
        let mut filesystems = BTreeSet::new();
        let mut owner: BTreeMap<&str, &str> = BTreeMap::new();
        for fs in &self.filesystems {
            if let Err(p) = check_name("file system name", &fs.name) {
                return Some(p);
            }
            if !filesystems.insert(fs.name.as_str()) {
                return Some(format!(
                    "file system `{}` is defined twice; file system names must be unique",
                    fs.name
                ));
            }
            if fs.disks.is_empty() {
                return Some(format!("file system `{}` has no disks", fs.name));
            }
            if !fs.mountpoint.is_absolute() {
                return Some(format!(
                    "file system `{}` has mount point `{}`; it must be an absolute path",
                    fs.name,
                    fs.mountpoint.display()
                ));
            }
            for name in &fs.disks {
                let Some(disk) = disks.get(name.as_str()) else {
                    return Some(format!(
                        "file system `{}` uses disk `{name}`, which is not defined; \
                         add a [[disks]] entry or remove it from the file system",
                        fs.name
                    ));
                };
                if let Some(other) = owner.insert(name, &fs.name) {
                    return Some(if other == fs.name {
                        format!("file system `{}` lists disk `{name}` twice", fs.name)
                    } else {
                        format!(
                            "disk `{name}` is in two file systems, `{other}` and `{}`; \
                             a disk belongs to at most one file system",
                            fs.name
                        )
                    });
                }
                if disk.fs.as_deref() != Some(fs.name.as_str()) {
                    return Some(format!(
                        "disk `{name}` is listed by file system `{}` but its `fs` field says {}; \
                         set `fs = \"{}\"` on the disk",
                        fs.name,
                        disk.fs
                            .as_deref()
                            .map_or("none".to_string(), |f| format!("`{f}`")),
                        fs.name
                    ));
                }
            }
        }
        if let Some(p) = self.nodes_problem() {
            return Some(p);
        }
        if self.nodes.is_empty() {
            if let Some(d) = self.disks.iter().find(|d| !d.servers.is_empty()) {
                return Some(format!(
                    "disk `{}` lists NSD servers, but this cluster has no [[nodes]]: its one \
                     node opens every disk itself; remove `servers`",
                    d.name
                ));
            }
        }
        for disk in &self.disks {
            if let Some(fs) = &disk.fs {
                if owner.get(disk.name.as_str()) != Some(&fs.as_str()) {
                    return Some(format!(
                        "disk `{}` says it belongs to file system `{fs}`, which does not list it; \
                         fix the disk's `fs` field or the file system's `disks`",
                        disk.name
                    ));
                }
            }
        }
        None
    }

    /// The first inconsistency of the node list.
    fn nodes_problem(&self) -> Option<String> {
        if self.nodes.is_empty() {
            return None;
        }
        let mut ids = BTreeSet::new();
        let mut names = BTreeSet::new();
        let mut addresses = BTreeSet::new();
        for n in &self.nodes {
            if let Err(p) = check_name("node name", &n.name) {
                return Some(p);
            }
            if !ids.insert(n.id) {
                return Some(format!("node number {} is used twice in [[nodes]]", n.id));
            }
            if !names.insert(n.name.as_str()) {
                return Some(format!("node name `{}` is used twice in [[nodes]]", n.name));
            }
            let Ok(addr) = n.address.parse::<std::net::SocketAddr>() else {
                return Some(format!(
                    "node `{}` has address `{}`; give an IP address and a port, like 127.0.0.1:1191",
                    n.name, n.address
                ));
            };
            if !addresses.insert(addr) {
                return Some(format!(
                    "address {addr} is given to two nodes; each node needs its own"
                ));
            }
            if !n.data_dir.is_absolute() {
                return Some(format!(
                    "node `{}` has data_dir `{}`; it must be an absolute path",
                    n.name,
                    n.data_dir.display()
                ));
            }
        }
        if !self.nodes.iter().any(|n| n.manager) {
            return Some(
                "no node is marked `manager = true`; mark one or more nodes (the token \
                 manager is sharded over them, and the first runs the file-system manager)"
                    .to_string(),
            );
        }
        match self.nodes.iter().filter(|n| n.quorum).count() {
            0 | 1 | 3 | 5 => {}
            k => {
                return Some(format!(
                    "{k} nodes are marked `quorum = true`; choose 1, 3 or 5 quorum nodes (an \
                     even number survives no more failures than one less)"
                ))
            }
        }
        for n in &self.nodes {
            for d in n.local_disks.iter().flatten() {
                if self.disk(d).is_none() {
                    return Some(format!(
                        "node `{}` lists disk `{d}` in local_disks, which is not defined; \
                         add a [[disks]] entry or remove it from the node",
                        n.name
                    ));
                }
            }
        }
        for disk in &self.disks {
            let mut seen = BTreeSet::new();
            for s in &disk.servers {
                let Some(n) = self.nodes.iter().find(|n| &n.name == s) else {
                    return Some(format!(
                        "disk `{}` lists NSD server `{s}`, which is not a node of [[nodes]]; \
                         give node names",
                        disk.name
                    ));
                };
                if !seen.insert(s.as_str()) {
                    return Some(format!("disk `{}` lists NSD server `{s}` twice", disk.name));
                }
                if !n.has_local(&disk.name) {
                    return Some(format!(
                        "disk `{}` lists NSD server `{s}`, which has no local access to it \
                         (its local_disks leave it out); a server must open the disk itself",
                        disk.name
                    ));
                }
            }
        }
        if !ids.contains(&self.node_id) {
            return Some(format!(
                "node_id {} is not among the [[nodes]] ({}); fix node_id or the node list",
                self.node_id,
                ids.iter()
                    .map(|i| i.to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
        None
    }

    /// The node that runs the file-system manager: the manager node with the lowest
    /// number (multi-process clusters).
    pub fn manager_node(&self) -> Option<&NodeDef> {
        self.manager_nodes().into_iter().next()
    }

    /// The manager nodes in number order: the token manager is sharded over them (a
    /// resource goes to `mako_token::ManagerMap`'s hash of it over this list).
    pub fn manager_nodes(&self) -> Vec<&NodeDef> {
        let mut m: Vec<&NodeDef> = self.nodes.iter().filter(|n| n.manager).collect();
        m.sort_by_key(|n| n.id);
        m
    }

    /// The nodes that keep the replicated configuration and vote in its quorum: those
    /// marked `quorum = true`, or the manager node alone in a cluster.toml written
    /// before quorum nodes existed.
    pub fn quorum_nodes(&self) -> Vec<&NodeDef> {
        let marked: Vec<&NodeDef> = self.nodes.iter().filter(|n| n.quorum).collect();
        if marked.is_empty() {
            self.manager_node().into_iter().collect()
        } else {
            marked
        }
    }

    /// The node numbered `id`.
    pub fn node(&self, id: u32) -> Option<&NodeDef> {
        self.nodes.iter().find(|n| n.id == id)
    }

    /// The disk called `name`.
    pub fn disk(&self, name: &str) -> Option<&DiskDef> {
        self.disks.iter().find(|d| d.name == name)
    }

    /// The file system called `name`.
    pub fn filesystem(&self, name: &str) -> Option<&FsDef> {
        self.filesystems.iter().find(|f| f.name == name)
    }

    /// The file system called `name`, for changing it.
    pub fn filesystem_mut(&mut self, name: &str) -> Option<&mut FsDef> {
        self.filesystems.iter_mut().find(|f| f.name == name)
    }

    /// The disks of file system `fs`, in the order the file system lists them.
    pub fn disks_of(&self, fs: &FsDef) -> Vec<&DiskDef> {
        fs.disks.iter().filter_map(|n| self.disk(n)).collect()
    }

    /// The file system whose mount point contains `path`, if any (the deepest one).
    pub fn filesystem_containing(&self, path: &Path) -> Option<&FsDef> {
        self.filesystems
            .iter()
            .filter(|fs| path.starts_with(&fs.mountpoint))
            .max_by_key(|fs| fs.mountpoint.components().count())
    }
}

/// A name is 1..=63 bytes of letters, digits, `_`, `-` and `.`, not starting with `-`
/// or `.` (it becomes part of file names and command lines).
fn check_name(what: &str, name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= NAME_BYTES_MAX
        && !name.starts_with(['-', '.'])
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'));
    if ok {
        Ok(())
    } else {
        Err(format!(
            "{what} `{name}` is not valid; use 1 to {NAME_BYTES_MAX} letters, digits, `_`, `-` \
             or `.`, not starting with `-` or `.`"
        ))
    }
}

/// Public form of the name check, for commands that create names.
pub fn validate_name(what: &str, name: &str) -> Result<(), String> {
    check_name(what, name)
}

/// True if `a` and `b` name the same directory (compared after resolving symbolic links
/// and `..` when both exist, as written otherwise): how a command or a daemon finds its
/// own node among cluster.toml's nodes.
pub fn same_dir(a: &Path, b: &Path) -> bool {
    match (a.canonicalize(), b.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => a == b,
    }
}

/// The names of the files in a data directory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DataDir {
    /// The data directory itself.
    pub root: PathBuf,
}

impl DataDir {
    /// The data directory `root`.
    pub fn new(root: impl Into<PathBuf>) -> Self {
        DataDir { root: root.into() }
    }
    /// `cluster.toml`.
    pub fn cluster_file(&self) -> PathBuf {
        self.root.join(CLUSTER_FILE_NAME)
    }
    /// `config.toml`, the mako-config `ConfigStore` file.
    pub fn config_file(&self) -> PathBuf {
        self.root.join("config.toml")
    }
    /// `makod.sock`, the control socket.
    pub fn socket_file(&self) -> PathBuf {
        self.root.join("makod.sock")
    }
    /// `makod.pid`, written by `mako up`.
    pub fn pid_file(&self) -> PathBuf {
        self.root.join("makod.pid")
    }
    /// `makod.log`, the daemon's stderr.
    pub fn log_file(&self) -> PathBuf {
        self.root.join("makod.log")
    }
    /// `cluster.key`, the secret a node of a multi-process cluster joins with.
    pub fn key_file(&self) -> PathBuf {
        self.root.join(CLUSTER_KEY_FILE_NAME)
    }
    /// `disks/`, where file-backed disks are created.
    pub fn disks_dir(&self) -> PathBuf {
        self.root.join("disks")
    }
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

fn home_dir() -> PathBuf {
    std::env::var_os("HOME")
        .filter(|h| !h.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/tmp"))
}

/// `/var/lib/mako` for root; otherwise `$XDG_DATA_HOME/mako` or `~/.local/share/mako`.
pub fn default_data_dir() -> PathBuf {
    if is_root() {
        return PathBuf::from("/var/lib/mako");
    }
    match std::env::var_os("XDG_DATA_HOME").filter(|x| !x.is_empty()) {
        Some(xdg) => PathBuf::from(xdg).join("mako"),
        None => home_dir().join(".local/share/mako"),
    }
}

/// `/mako/fs1` for root; otherwise `~/mako/fs1`.
pub fn default_mountpoint() -> PathBuf {
    if is_root() {
        PathBuf::from("/mako/fs1")
    } else {
        home_dir().join("mako/fs1")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> ClusterConfig {
        let mut c = ClusterConfig::new("mako", "node1", 1);
        for i in 0..3 {
            c.disks.push(DiskDef {
                name: format!("d{i}"),
                path: PathBuf::from(format!("/var/lib/mako/disks/d{i}.img")),
                size_bytes: 8 << 30,
                pool: "system".into(),
                failure_group: i + 1,
                usage: "dataAndMetadata".into(),
                fs: (i < 2).then(|| "fs1".to_string()),
                servers: Vec::new(),
            });
        }
        c.filesystems.push(FsDef {
            name: "fs1".into(),
            disks: vec!["d0".into(), "d1".into()],
            mountpoint: PathBuf::from("/mako/fs1"),
            automount: true,
            mount_options: String::new(),
        });
        c
    }

    fn problem(c: &ClusterConfig) -> String {
        c.validate().unwrap_err().to_string()
    }

    fn with_nodes(n: u32) -> ClusterConfig {
        let mut c = sample();
        c.node_id = 1;
        c.nodes = (0..n)
            .map(|i| NodeDef {
                id: i,
                name: format!("node{i}"),
                address: format!("127.0.0.1:{}", 2000 + i),
                data_dir: PathBuf::from(format!("/var/lib/mako/node{i}")),
                manager: i == 0,
                quorum: i == 0,
                local_disks: None,
            })
            .collect();
        c
    }

    #[test]
    fn nsd_servers_and_local_disks_are_checked_and_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let mut c = with_nodes(3);
        c.nodes[1].local_disks = Some(vec![]);
        c.nodes[2].local_disks = Some(vec!["d0".into()]);
        c.disks[0].servers = vec!["node0".into(), "node2".into()];
        c.save(dir.path()).unwrap();
        let back = ClusterConfig::load(dir.path()).unwrap();
        assert_eq!(back, c);
        assert!(back.nodes[0].has_local("d1") && !back.nodes[1].has_local("d0"));
        assert!(back.nodes[2].has_local("d0") && !back.nodes[2].has_local("d1"));

        let mut bad = c.clone();
        bad.disks[1].servers = vec!["node2".into()];
        assert!(
            problem(&bad).contains("no local access"),
            "{}",
            problem(&bad)
        );
        let mut bad = c.clone();
        bad.disks[1].servers = vec!["node9".into()];
        assert!(problem(&bad).contains("not a node"), "{}", problem(&bad));
        let mut bad = c.clone();
        bad.disks[0].servers = vec!["node0".into(), "node0".into()];
        assert!(problem(&bad).contains("twice"), "{}", problem(&bad));
        let mut bad = c.clone();
        bad.nodes[2].local_disks = Some(vec!["d7".into()]);
        assert!(problem(&bad).contains("d7"), "{}", problem(&bad));
        let mut bad = sample();
        bad.disks[0].servers = vec!["node0".into()];
        assert!(problem(&bad).contains("no [[nodes]]"), "{}", problem(&bad));
    }

    #[test]
    fn a_node_list_round_trips_and_a_single_node_file_has_none() {
        let dir = tempfile::tempdir().unwrap();
        let c = with_nodes(3);
        c.save(dir.path()).unwrap();
        assert_eq!(ClusterConfig::load(dir.path()).unwrap(), c);
        assert_eq!(c.manager_node().unwrap().id, 0);
        // A one-node cluster.toml says nothing about nodes, as before.
        assert!(!sample().to_toml().contains("nodes"));
    }

    #[test]
    fn a_bad_node_list_is_refused_with_what_to_fix() {
        let mut c = with_nodes(3);
        c.nodes[2].address = "localhost".into();
        assert!(
            problem(&c).contains("give an IP address and a port"),
            "{}",
            problem(&c)
        );
        let mut c = with_nodes(3);
        c.nodes[2].address = c.nodes[1].address.clone();
        assert!(
            problem(&c).contains("given to two nodes"),
            "{}",
            problem(&c)
        );
        // Several manager nodes shard the token manager; the first (by number) runs
        // the file-system manager. None is refused.
        let mut c = with_nodes(3);
        c.nodes[2].manager = true;
        assert!(c.validate().is_ok(), "{}", problem(&c));
        let ids: Vec<u32> = c.manager_nodes().iter().map(|n| n.id).collect();
        assert_eq!(ids, [0, 2]);
        assert_eq!(c.manager_node().unwrap().id, 0);
        c.nodes[0].manager = false;
        assert_eq!(c.manager_node().unwrap().id, 2);
        let mut c = with_nodes(3);
        c.nodes[0].manager = false;
        assert!(
            problem(&c).contains("no node is marked `manager = true`"),
            "{}",
            problem(&c)
        );
        // Quorum nodes: 1, 3 or 5; none marked means the manager alone.
        let mut c = with_nodes(3);
        c.nodes[1].quorum = true;
        assert!(
            problem(&c).contains("choose 1, 3 or 5 quorum nodes"),
            "{}",
            problem(&c)
        );
        c.nodes[2].quorum = true;
        assert!(c.validate().is_ok());
        assert_eq!(c.quorum_nodes().len(), 3);
        for n in &mut c.nodes {
            n.quorum = false;
        }
        let q: Vec<u32> = c.quorum_nodes().iter().map(|n| n.id).collect();
        assert_eq!(q, [0]);
        let mut c = with_nodes(3);
        c.node_id = 7;
        assert!(
            problem(&c).contains("node_id 7 is not among"),
            "{}",
            problem(&c)
        );
        let mut c = with_nodes(3);
        c.nodes[2].id = 1;
        assert!(problem(&c).contains("used twice"), "{}", problem(&c));
        let mut c = with_nodes(3);
        c.nodes[2].data_dir = PathBuf::from("rel/node2");
        assert!(problem(&c).contains("absolute"), "{}", problem(&c));
    }

    #[test]
    fn round_trip_through_a_file() {
        let dir = tempfile::tempdir().unwrap();
        let c = sample();
        c.save(dir.path()).unwrap();
        let loaded = ClusterConfig::load(dir.path()).unwrap();
        assert_eq!(loaded, c);
        let text = fs::read_to_string(dir.path().join(CLUSTER_FILE_NAME)).unwrap();
        assert!(text.contains("[[disks]]"), "{text}");
        assert!(text.contains("[[filesystems]]"), "{text}");
        let names: Vec<_> = fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(names.len(), 1, "no temporary left behind");
    }

    #[test]
    fn missing_file_says_how_to_create_one() {
        let dir = tempfile::tempdir().unwrap();
        let message = ClusterConfig::load(dir.path()).unwrap_err().to_string();
        assert!(message.contains("mako up"), "{message}");
        assert!(message.contains("cluster.toml"), "{message}");
    }

    #[test]
    fn defaults_for_optional_fields() {
        let text = "cluster_name = \"c\"\nnode_name = \"n\"\nnode_id = 0\n\
                    [[disks]]\nname = \"d0\"\npath = \"/dev/sdb\"\nsize_bytes = 1000\n";
        let c = ClusterConfig::from_toml(Path::new("x.toml"), text).unwrap();
        assert_eq!(c.disks[0].pool, "system");
        assert_eq!(c.disks[0].usage, "dataAndMetadata");
        assert_eq!(c.disks[0].failure_group, 1);
        assert_eq!(c.disks[0].fs, None);
    }

    #[test]
    fn syntax_errors_name_the_file() {
        for text in [
            "cluster_name = ",
            "cluster_name = \"c\"\n",
            "node_id = \"x\"",
            "\0",
        ] {
            let message = ClusterConfig::from_toml(Path::new("/d/cluster.toml"), text)
                .unwrap_err()
                .to_string();
            assert!(message.starts_with("/d/cluster.toml"), "{message}");
        }
    }

    #[test]
    fn validation_errors() {
        let mut c = sample();
        c.disks[1].name = "d0".into();
        assert!(problem(&c).contains("disk `d0` is defined twice"));

        let mut c = sample();
        c.filesystems.push(FsDef {
            name: "fs2".into(),
            disks: vec!["d1".into()],
            mountpoint: "/mako/fs2".into(),
            automount: false,
            mount_options: String::new(),
        });
        let p = problem(&c);
        assert!(p.contains("disk `d1` is in two file systems"), "{p}");

        let mut c = sample();
        c.filesystems[0].disks.push("nope".into());
        assert!(problem(&c).contains("uses disk `nope`, which is not defined"));

        let mut c = sample();
        c.filesystems.push(c.filesystems[0].clone());
        assert!(problem(&c).contains("file system `fs1` is defined twice"));

        let mut c = sample();
        c.disks[2].usage = "both".into();
        assert!(problem(&c).contains("use one of dataAndMetadata"));

        let mut c = sample();
        c.disks[2].fs = Some("fs9".into());
        assert!(problem(&c).contains("says it belongs to file system `fs9`"));

        let mut c = sample();
        c.disks[0].fs = None;
        assert!(problem(&c).contains("its `fs` field says none"));

        let mut c = sample();
        c.disks[2].path = c.disks[0].path.clone();
        assert!(problem(&c).contains("both use"));

        let mut c = sample();
        c.filesystems[0].name = "bad name".into();
        assert!(problem(&c).contains("file system name `bad name` is not valid"));

        let mut c = sample();
        c.filesystems[0].mountpoint = "relative/dir".into();
        assert!(problem(&c).contains("absolute path"));

        let mut c = sample();
        c.filesystems[0].disks.clear();
        c.disks[0].fs = None;
        c.disks[1].fs = None;
        assert!(problem(&c).contains("has no disks"));

        // An invalid configuration is never written.
        let dir = tempfile::tempdir().unwrap();
        assert!(c.save(dir.path()).is_err());
        assert!(!dir.path().join(CLUSTER_FILE_NAME).exists());
    }

    #[test]
    fn filesystem_containing_a_path() {
        let c = sample();
        assert_eq!(
            c.filesystem_containing(Path::new("/mako/fs1/dir/file"))
                .map(|f| f.name.as_str()),
            Some("fs1")
        );
        assert!(c.filesystem_containing(Path::new("/mako/fs10")).is_none());
        assert!(c.filesystem_containing(Path::new("/tmp")).is_none());
    }
}
