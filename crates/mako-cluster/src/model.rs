//! The replicated cluster configuration: its typed model ([`ClusterConfig`]), the
//! changes an administrator makes to it ([`Command`]) and their validation.
//!
//! Validation happens twice, on purpose. [`Command::check_input`] checks what does not
//! depend on the configuration (names, addresses, parameter values through
//! mako-config) on the node that proposes the change, before it reaches the raft log.
//! [`ClusterConfig::apply`] then checks the change against the configuration it is
//! applied to (a disk in use, a duplicate name) and changes nothing when it fails.
//! `apply` runs on every node for every committed entry, so it must be a function of
//! the configuration and the command only: it never parses parameter values (a newer
//! mako-config on one node would otherwise decide differently from the others) and
//! never reads a clock or the host.

use mako_rt::NodeId;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::net::SocketAddr;

/// Longest node, disk, file system or pool name.
pub const NAME_MAX: usize = 63;
/// Largest failure group number (GPFS accepts -1 to 4000).
pub const FAILURE_GROUP_MAX: i32 = 4000;
/// Smallest failure group number: -1 means "shares no failure with any other disk".
pub const FAILURE_GROUP_MIN: i32 = -1;
/// The storage pool of a disk created without one.
pub const DEFAULT_POOL: &str = "system";
/// Most addresses one node may list.
pub const ADDRESSES_MAX: usize = 8;
/// Most NSD servers one disk may list (GPFS allows eight).
pub const SERVERS_MAX: usize = 8;

/// What a node does in the cluster.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Role {
    /// Keeps a copy of this configuration and votes in the raft quorum.
    Quorum,
    /// May be chosen as a manager (token manager, file system manager).
    Manager,
    /// Never takes a manager role (GPFS's "client" designation).
    Client,
}

impl Role {
    pub fn name(self) -> &'static str {
        match self {
            Role::Quorum => "quorum",
            Role::Manager => "manager",
            Role::Client => "client",
        }
    }

    /// Parses the administrator's spelling (`quorum`, `manager`, `client`).
    pub fn parse(text: &str) -> Result<Role, ConfigError> {
        match text.trim().to_ascii_lowercase().as_str() {
            "quorum" => Ok(Role::Quorum),
            "manager" => Ok(Role::Manager),
            "client" => Ok(Role::Client),
            _ => Err(ConfigError::BadRole {
                given: text.to_string(),
            }),
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One node of the cluster.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeEntry {
    pub id: NodeId,
    pub name: String,
    /// Where the node's daemon listens, the preferred address first.
    pub addresses: Vec<SocketAddr>,
    pub roles: BTreeSet<Role>,
}

/// One disk (NSD) of the cluster.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DiskEntry {
    pub name: String,
    pub size_bytes: u64,
    /// The NSD servers that reach the device, primary first. Empty: every node sees
    /// the device directly (shared SAN).
    pub servers: Vec<NodeId>,
    pub failure_group: i32,
    pub pool: String,
}

/// One file system of the cluster.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FsEntry {
    pub name: String,
    /// Its disks, by name.
    pub disks: Vec<String>,
    /// Default mount options (`-o` words), checked by the mounting node.
    pub mount_options: Vec<String>,
}

/// Where a parameter setting applies.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Scope {
    /// Every node, unless a node has its own value.
    Cluster,
    /// Only these nodes (`mako config set ... -N nodes`).
    Nodes(Vec<NodeId>),
}

/// The whole replicated configuration. Every node that follows the quorum holds the
/// same value at the same epoch.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterConfig {
    /// Empty until [`Command::CreateCluster`] is applied.
    pub name: String,
    /// The cluster's identity, chosen by `mako cluster create`.
    pub uuid: [u8; 16],
    /// Grows by one with every change that was applied (a refused change leaves it).
    pub epoch: u64,
    pub nodes: BTreeMap<NodeId, NodeEntry>,
    pub disks: BTreeMap<String, DiskEntry>,
    pub file_systems: BTreeMap<String, FsEntry>,
    /// Cluster-wide parameter values, by mako-config name, in the administrator's text.
    pub params: BTreeMap<String, String>,
    /// Per-node overrides, which win over the cluster-wide value on that node.
    pub node_params: BTreeMap<NodeId, BTreeMap<String, String>>,
    /// Lease epochs and expels (docs/cluster.md "Leases, expel and fencing"); a node
    /// missing here holds epoch [`FIRST_LEASE_EPOCH`] and was never expelled.
    pub leases: BTreeMap<NodeId, NodeLease>,
}

/// The lease epoch of a node that was never expelled.
pub const FIRST_LEASE_EPOCH: u64 = 1;

/// A node's lease record in the configuration: replicated, so a new cluster manager
/// after a leader change knows every expel.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeLease {
    /// Grows by one each time the node rejoins after an expel; NSD servers refuse a
    /// request carrying an older one.
    pub epoch: u64,
    /// Set while the node is expelled.
    pub expelled: Option<Expel>,
}

impl Default for NodeLease {
    fn default() -> Self {
        NodeLease {
            epoch: FIRST_LEASE_EPOCH,
            expelled: None,
        }
    }
}

/// Who expelled a node, and why.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Expel {
    pub by: NodeId,
    pub reason: String,
    /// The configuration epoch the expel was applied at.
    pub config_epoch: u64,
}

/// A change to the configuration: one raft log entry.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Command {
    /// Names the cluster; only once, on an empty configuration.
    CreateCluster {
        name: String,
        uuid: [u8; 16],
    },
    AddNode(NodeEntry),
    /// Removes a node that serves no disk and has no quorum role.
    RemoveNode {
        node: NodeId,
    },
    SetRoles {
        node: NodeId,
        roles: BTreeSet<Role>,
    },
    /// Changes a node's addresses (a node moved to another network).
    SetAddresses {
        node: NodeId,
        addresses: Vec<SocketAddr>,
    },
    AddDisk(DiskEntry),
    /// Deletes a disk no file system uses.
    DeleteDisk {
        name: String,
    },
    CreateFs(FsEntry),
    /// Deletes a file system from the configuration (the caller checks it is mounted
    /// nowhere: mounts are not part of this configuration).
    DeleteFs {
        name: String,
    },
    SetParam {
        name: String,
        value: String,
        scope: Scope,
    },
    UnsetParam {
        name: String,
        scope: Scope,
    },
    /// Several changes applied as one: all of them, in order, or none (one epoch).
    /// `mako cluster create` creates a cluster with its nodes, disks and file systems
    /// in one batch, so that a configuration is never seen half made. Batches do not
    /// nest. (The log's encoding numbers variants in order: new ones go after the
    /// last, never between.)
    Batch(Vec<Command>),
    /// The cluster manager `by` declares `node` failed at lease epoch `epoch`
    /// (refused when the node's epoch moved on or it is already expelled).
    Expel {
        node: NodeId,
        epoch: u64,
        by: NodeId,
        reason: String,
    },
    /// An expelled node comes back: a new lease epoch, no longer expelled.
    Rejoin {
        node: NodeId,
        epoch: u64,
    },
}

impl Command {
    /// A short name for logs and errors.
    pub fn kind(&self) -> &'static str {
        match self {
            Command::CreateCluster { .. } => "create cluster",
            Command::AddNode(_) => "add node",
            Command::RemoveNode { .. } => "remove node",
            Command::SetRoles { .. } => "set roles",
            Command::SetAddresses { .. } => "set addresses",
            Command::AddDisk(_) => "add disk",
            Command::DeleteDisk { .. } => "delete disk",
            Command::CreateFs(_) => "create file system",
            Command::DeleteFs { .. } => "delete file system",
            Command::SetParam { .. } => "set parameter",
            Command::UnsetParam { .. } => "unset parameter",
            Command::Batch(_) => "batch of changes",
            Command::Expel { .. } => "expel node",
            Command::Rejoin { .. } => "rejoin node",
        }
    }

    /// Checks what does not depend on the configuration: names, addresses, sizes and
    /// parameter values. Runs where the change is proposed, before it is logged.
    pub fn check_input(&self) -> Result<(), ConfigError> {
        match self {
            Command::Batch(commands) => {
                for c in commands {
                    if matches!(c, Command::Batch(_)) {
                        return Err(ConfigError::NestedBatch);
                    }
                    c.check_input()?;
                }
                Ok(())
            }
            Command::CreateCluster { name, .. } => check_name("cluster", name),
            Command::AddNode(node) => {
                check_name("node", &node.name)?;
                check_addresses(&node.name, &node.addresses)?;
                check_roles(&node.name, &node.roles)
            }
            Command::RemoveNode { .. } | Command::Rejoin { .. } => Ok(()),
            Command::Expel { reason, .. } => {
                if reason.is_empty() || reason.len() > 1024 {
                    Err(ConfigError::BadExpel {
                        problem: "the reason must be 1 to 1024 bytes".into(),
                    })
                } else {
                    Ok(())
                }
            }
            Command::SetRoles { node, roles } => check_roles(&node.to_string(), roles),
            Command::SetAddresses { node, addresses } => {
                check_addresses(&node.to_string(), addresses)
            }
            Command::AddDisk(disk) => {
                check_name("disk", &disk.name)?;
                check_name("storage pool", &disk.pool)?;
                if disk.size_bytes == 0 {
                    return Err(ConfigError::BadDisk {
                        disk: disk.name.clone(),
                        problem: "its size is 0; give the device's size in bytes".into(),
                    });
                }
                if !(FAILURE_GROUP_MIN..=FAILURE_GROUP_MAX).contains(&disk.failure_group) {
                    return Err(ConfigError::BadDisk {
                        disk: disk.name.clone(),
                        problem: format!(
                            "failure group {} is outside {FAILURE_GROUP_MIN}..={FAILURE_GROUP_MAX}",
                            disk.failure_group
                        ),
                    });
                }
                if disk.servers.len() > SERVERS_MAX {
                    return Err(ConfigError::BadDisk {
                        disk: disk.name.clone(),
                        problem: format!(
                            "{} NSD servers listed; at most {SERVERS_MAX}",
                            disk.servers.len()
                        ),
                    });
                }
                let unique: BTreeSet<_> = disk.servers.iter().collect();
                if unique.len() != disk.servers.len() {
                    return Err(ConfigError::BadDisk {
                        disk: disk.name.clone(),
                        problem: "a server is listed twice; list each server once, primary first"
                            .into(),
                    });
                }
                Ok(())
            }
            Command::DeleteDisk { name } | Command::DeleteFs { name } => {
                if name.is_empty() {
                    Err(ConfigError::BadName {
                        what: "disk or file system".into(),
                        given: String::new(),
                        problem: "it is empty".into(),
                    })
                } else {
                    Ok(())
                }
            }
            Command::CreateFs(fs) => {
                check_name("file system", &fs.name)?;
                if fs.disks.is_empty() {
                    return Err(ConfigError::BadFileSystem {
                        fs: fs.name.clone(),
                        problem: "it has no disk; give at least one".into(),
                    });
                }
                let unique: BTreeSet<_> = fs.disks.iter().collect();
                if unique.len() != fs.disks.len() {
                    return Err(ConfigError::BadFileSystem {
                        fs: fs.name.clone(),
                        problem: "a disk is listed twice".into(),
                    });
                }
                for option in &fs.mount_options {
                    if option.is_empty() || option.contains([',', ' ', '\n', '\t']) {
                        return Err(ConfigError::BadFileSystem {
                            fs: fs.name.clone(),
                            problem: format!(
                                "mount option {option:?} is not one word (give each option alone)"
                            ),
                        });
                    }
                }
                Ok(())
            }
            Command::SetParam { name, value, scope } => {
                let spec = param_spec(name)?;
                mako_config::parse_for(spec, value).map_err(|e| ConfigError::BadParameter {
                    name: name.clone(),
                    reason: e.to_string(),
                })?;
                check_param_scope(spec, scope)
            }
            Command::UnsetParam { name, scope } => {
                let spec = param_spec(name)?;
                check_param_scope(spec, scope)
            }
        }
    }
}

fn param_spec(name: &str) -> Result<&'static mako_config::ParamSpec, ConfigError> {
    mako_config::lookup(name).map_err(|e| ConfigError::BadParameter {
        name: name.to_string(),
        reason: e.to_string(),
    })
}

fn check_param_scope(spec: &mako_config::ParamSpec, scope: &Scope) -> Result<(), ConfigError> {
    match scope {
        Scope::Cluster => Ok(()),
        Scope::Nodes(nodes) if nodes.is_empty() => Err(ConfigError::BadParameter {
            name: spec.name.to_string(),
            reason: "-N names no node; leave it out to set the value cluster-wide".into(),
        }),
        Scope::Nodes(_) if spec.scope == mako_config::Scope::Cluster => {
            Err(ConfigError::BadParameter {
                name: spec.name.to_string(),
                reason: "it must be the same on every node, so it cannot be set per node; \
                         leave out -N"
                    .into(),
            })
        }
        Scope::Nodes(_) => Ok(()),
    }
}

fn check_name(what: &'static str, name: &str) -> Result<(), ConfigError> {
    let bad = |problem: &str| ConfigError::BadName {
        what: what.to_string(),
        given: name.to_string(),
        problem: problem.to_string(),
    };
    if name.is_empty() {
        return Err(bad("it is empty"));
    }
    if name.len() > NAME_MAX {
        return Err(bad(&format!("it is longer than {NAME_MAX} bytes")));
    }
    if !name.starts_with(|c: char| c.is_ascii_alphanumeric()) {
        return Err(bad("it must start with a letter or a digit"));
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.')))
    {
        return Err(bad(&format!(
            "{c:?} is not allowed (letters, digits, '_', '-' and '.' are)"
        )));
    }
    Ok(())
}

fn check_addresses(node: &str, addresses: &[SocketAddr]) -> Result<(), ConfigError> {
    let bad = |problem: String| ConfigError::BadAddress {
        node: node.to_string(),
        problem,
    };
    if addresses.is_empty() {
        return Err(bad(
            "no address given; give IP:port, e.g. 10.0.0.1:1191".into()
        ));
    }
    if addresses.len() > ADDRESSES_MAX {
        return Err(bad(format!(
            "{} addresses; at most {ADDRESSES_MAX}",
            addresses.len()
        )));
    }
    for a in addresses {
        if a.port() == 0 {
            return Err(bad(format!("{a} has port 0; give the daemon's port")));
        }
        if a.ip().is_unspecified() || a.ip().is_multicast() {
            return Err(bad(format!(
                "{} is not an address another node can reach",
                a.ip()
            )));
        }
    }
    let unique: BTreeSet<_> = addresses.iter().collect();
    if unique.len() != addresses.len() {
        return Err(bad("an address is listed twice".into()));
    }
    Ok(())
}

/// Parses one node address as the administrator types it (`IP:port`, `[IPv6]:port`).
pub fn parse_address(node: &str, text: &str) -> Result<SocketAddr, ConfigError> {
    text.trim()
        .parse::<SocketAddr>()
        .map_err(|e| ConfigError::BadAddress {
            node: node.to_string(),
            problem: format!(
                "{text:?} is not IP:port ({e}); host names are not supported yet, \
                 give e.g. 10.0.0.1:1191 or [fd00::1]:1191"
            ),
        })
}

fn check_roles(node: &str, roles: &BTreeSet<Role>) -> Result<(), ConfigError> {
    if roles.contains(&Role::Manager) && roles.contains(&Role::Client) {
        return Err(ConfigError::BadRoles {
            node: node.to_string(),
            problem: "manager and client exclude each other; choose one".into(),
        });
    }
    Ok(())
}

impl ClusterConfig {
    /// Whether `mako cluster create` has been applied.
    pub fn is_created(&self) -> bool {
        !self.name.is_empty()
    }

    pub fn node_by_name(&self, name: &str) -> Option<&NodeEntry> {
        self.nodes.values().find(|n| n.name == name)
    }

    /// The nodes' names, comma-separated, for an error about an unknown node.
    pub fn node_names(&self) -> String {
        let names: Vec<&str> = self.nodes.values().map(|e| e.name.as_str()).collect();
        names.join(", ")
    }

    /// The quorum nodes' ids (the raft voters should be exactly these).
    pub fn quorum_nodes(&self) -> BTreeSet<NodeId> {
        self.nodes
            .values()
            .filter(|n| n.roles.contains(&Role::Quorum))
            .map(|n| n.id)
            .collect()
    }

    /// The file system that uses `disk`, if one does.
    pub fn fs_using(&self, disk: &str) -> Option<&FsEntry> {
        self.file_systems
            .values()
            .find(|fs| fs.disks.iter().any(|d| d == disk))
    }

    /// The value of parameter `name` on `node`: its own, else the cluster-wide one.
    pub fn param_for(&self, node: NodeId, name: &str) -> Option<&str> {
        self.node_params
            .get(&node)
            .and_then(|p| p.get(name))
            .or_else(|| self.params.get(name))
            .map(String::as_str)
    }

    fn node_label(&self, id: NodeId) -> String {
        match self.nodes.get(&id) {
            Some(n) => format!("{id} ({})", n.name),
            None => id.to_string(),
        }
    }

    fn require_node(&self, id: NodeId) -> Result<&NodeEntry, ConfigError> {
        self.nodes
            .get(&id)
            .ok_or(ConfigError::NoSuchNode { node: id })
    }

    /// Checks `command` against this configuration and applies it, returning the new
    /// epoch. A refused command changes nothing (not even the epoch).
    pub fn apply(&mut self, command: &Command) -> Result<u64, ConfigError> {
        self.check(command)?;
        self.change(command);
        self.epoch += 1;
        Ok(self.epoch)
    }

    /// Every refusal `apply` makes, without changing anything.
    pub fn check(&self, command: &Command) -> Result<(), ConfigError> {
        if let Command::Batch(commands) = command {
            // Each change is checked against the configuration the ones before it make.
            let mut after = self.clone();
            for c in commands {
                if matches!(c, Command::Batch(_)) {
                    return Err(ConfigError::NestedBatch);
                }
                after.check(c)?;
                after.change(c);
            }
            return Ok(());
        }
        if !self.is_created() && !matches!(command, Command::CreateCluster { .. }) {
            return Err(ConfigError::NotCreated);
        }
        match command {
            Command::CreateCluster { .. } => {
                if self.is_created() {
                    return Err(ConfigError::AlreadyCreated {
                        name: self.name.clone(),
                    });
                }
            }
            Command::AddNode(node) => {
                if let Some(existing) = self.nodes.get(&node.id) {
                    return Err(ConfigError::DuplicateNode {
                        problem: format!(
                            "{} is already the number of node {}",
                            node.id, existing.name
                        ),
                    });
                }
                if let Some(existing) = self.node_by_name(&node.name) {
                    return Err(ConfigError::DuplicateNode {
                        problem: format!(
                            "the name {} is already taken by {}",
                            node.name, existing.id
                        ),
                    });
                }
                self.check_addresses_free(node.id, &node.addresses)?;
            }
            Command::RemoveNode { node } => {
                let entry = self.require_node(*node)?;
                if entry.roles.contains(&Role::Quorum) {
                    return Err(ConfigError::NodeInUse {
                        node: self.node_label(*node),
                        problem: "it is a quorum node; take its quorum role away first \
                                  (the quorum changes with it)"
                            .into(),
                    });
                }
                if let Some(disk) = self.disks.values().find(|d| d.servers.contains(node)) {
                    return Err(ConfigError::NodeInUse {
                        node: self.node_label(*node),
                        problem: format!(
                            "it is an NSD server of disk {}; change that disk's servers first",
                            disk.name
                        ),
                    });
                }
            }
            Command::SetRoles { node, roles } => {
                let entry = self.require_node(*node)?;
                let quorum_after = self.quorum_nodes().len()
                    - usize::from(entry.roles.contains(&Role::Quorum))
                    + usize::from(roles.contains(&Role::Quorum));
                if quorum_after == 0 {
                    return Err(ConfigError::NodeInUse {
                        node: self.node_label(*node),
                        problem:
                            "it is the last quorum node; give another node the quorum role first"
                                .into(),
                    });
                }
            }
            Command::SetAddresses { node, addresses } => {
                self.require_node(*node)?;
                self.check_addresses_free(*node, addresses)?;
            }
            Command::AddDisk(disk) => {
                if self.disks.contains_key(&disk.name) {
                    return Err(ConfigError::DuplicateDisk {
                        disk: disk.name.clone(),
                    });
                }
                for server in &disk.servers {
                    if !self.nodes.contains_key(server) {
                        return Err(ConfigError::BadDisk {
                            disk: disk.name.clone(),
                            problem: format!(
                                "NSD server {server} is not a node of this cluster; add the node first"
                            ),
                        });
                    }
                }
            }
            Command::DeleteDisk { name } => {
                if !self.disks.contains_key(name) {
                    return Err(ConfigError::NoSuchDisk { disk: name.clone() });
                }
                if let Some(fs) = self.fs_using(name) {
                    return Err(ConfigError::DiskInUse {
                        disk: name.clone(),
                        fs: fs.name.clone(),
                    });
                }
            }
            Command::CreateFs(fs) => {
                if self.file_systems.contains_key(&fs.name) {
                    return Err(ConfigError::DuplicateFileSystem {
                        fs: fs.name.clone(),
                    });
                }
                for disk in &fs.disks {
                    if !self.disks.contains_key(disk) {
                        return Err(ConfigError::NoSuchDisk { disk: disk.clone() });
                    }
                    if let Some(other) = self.fs_using(disk) {
                        return Err(ConfigError::DiskInUse {
                            disk: disk.clone(),
                            fs: other.name.clone(),
                        });
                    }
                }
            }
            Command::DeleteFs { name } => {
                if !self.file_systems.contains_key(name) {
                    return Err(ConfigError::NoSuchFileSystem { fs: name.clone() });
                }
            }
            Command::SetParam { scope, .. } | Command::UnsetParam { scope, .. } => {
                if let Scope::Nodes(nodes) = scope {
                    for node in nodes {
                        self.require_node(*node)?;
                    }
                }
            }
            Command::Expel { node, epoch, .. } => {
                self.require_node(*node)?;
                let lease = self.lease_of(*node);
                if lease.epoch != *epoch {
                    return Err(ConfigError::BadExpel {
                        problem: format!(
                            "{} holds lease epoch {}, not {epoch}: it rejoined since",
                            self.node_label(*node),
                            lease.epoch
                        ),
                    });
                }
                if let Some(e) = &lease.expelled {
                    return Err(ConfigError::BadExpel {
                        problem: format!(
                            "{} is already expelled (by {}: {})",
                            self.node_label(*node),
                            e.by,
                            e.reason
                        ),
                    });
                }
            }
            Command::Rejoin { node, epoch } => {
                self.require_node(*node)?;
                let lease = self.lease_of(*node);
                if lease.expelled.is_none() || lease.epoch != *epoch {
                    return Err(ConfigError::BadExpel {
                        problem: format!(
                            "{} is not expelled at lease epoch {epoch} (it holds epoch {}{})",
                            self.node_label(*node),
                            lease.epoch,
                            if lease.expelled.is_some() {
                                ", expelled"
                            } else {
                                ""
                            }
                        ),
                    });
                }
            }
            // Checked whole at the top.
            Command::Batch(_) => {}
        }
        Ok(())
    }

    fn check_addresses_free(
        &self,
        id: NodeId,
        addresses: &[SocketAddr],
    ) -> Result<(), ConfigError> {
        for other in self.nodes.values().filter(|n| n.id != id) {
            if let Some(a) = addresses.iter().find(|a| other.addresses.contains(a)) {
                return Err(ConfigError::DuplicateNode {
                    problem: format!("address {a} is already node {}'s", other.name),
                });
            }
        }
        Ok(())
    }

    /// `node`'s lease record (the first epoch, not expelled, when it has none).
    pub fn lease_of(&self, node: NodeId) -> NodeLease {
        self.leases.get(&node).cloned().unwrap_or_default()
    }

    /// Applies a command `check` accepted.
    fn change(&mut self, command: &Command) {
        match command {
            Command::Batch(commands) => {
                for c in commands {
                    self.change(c);
                }
            }
            Command::CreateCluster { name, uuid } => {
                self.name = name.clone();
                self.uuid = *uuid;
            }
            Command::AddNode(node) => {
                self.nodes.insert(node.id, node.clone());
            }
            Command::RemoveNode { node } => {
                self.nodes.remove(node);
                self.node_params.remove(node);
                self.leases.remove(node);
            }
            Command::Expel {
                node, by, reason, ..
            } => {
                let config_epoch = self.epoch + 1;
                self.leases.entry(*node).or_default().expelled = Some(Expel {
                    by: *by,
                    reason: reason.clone(),
                    config_epoch,
                });
            }
            Command::Rejoin { node, .. } => {
                let lease = self.leases.entry(*node).or_default();
                lease.epoch += 1;
                lease.expelled = None;
            }
            Command::SetRoles { node, roles } => {
                if let Some(n) = self.nodes.get_mut(node) {
                    n.roles = roles.clone();
                }
            }
            Command::SetAddresses { node, addresses } => {
                if let Some(n) = self.nodes.get_mut(node) {
                    n.addresses = addresses.clone();
                }
            }
            Command::AddDisk(disk) => {
                self.disks.insert(disk.name.clone(), disk.clone());
            }
            Command::DeleteDisk { name } => {
                self.disks.remove(name);
            }
            Command::CreateFs(fs) => {
                self.file_systems.insert(fs.name.clone(), fs.clone());
            }
            Command::DeleteFs { name } => {
                self.file_systems.remove(name);
            }
            Command::SetParam { name, value, scope } => match scope {
                Scope::Cluster => {
                    self.params.insert(name.clone(), value.clone());
                }
                Scope::Nodes(nodes) => {
                    for node in nodes {
                        self.node_params
                            .entry(*node)
                            .or_default()
                            .insert(name.clone(), value.clone());
                    }
                }
            },
            Command::UnsetParam { name, scope } => match scope {
                Scope::Cluster => {
                    self.params.remove(name);
                }
                Scope::Nodes(nodes) => {
                    for node in nodes {
                        if let Some(p) = self.node_params.get_mut(node) {
                            p.remove(name);
                            if p.is_empty() {
                                self.node_params.remove(node);
                            }
                        }
                    }
                }
            },
        }
    }
}

/// Why a change to the configuration was refused. Each message says what is wrong and
/// what to do; the type travels between nodes inside replies.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
pub enum ConfigError {
    #[error("the cluster is not created yet; run `mako cluster create` first")]
    NotCreated,
    #[error("the cluster is already created (its name is {name})")]
    AlreadyCreated { name: String },
    #[error("bad {what} name {given:?}: {problem}")]
    BadName {
        what: String,
        given: String,
        problem: String,
    },
    #[error("bad address for node {node}: {problem}")]
    BadAddress { node: String, problem: String },
    #[error("unknown role {given:?}: the roles are quorum, manager and client")]
    BadRole { given: String },
    #[error("bad roles for node {node}: {problem}")]
    BadRoles { node: String, problem: String },
    #[error("node not added: {problem}")]
    DuplicateNode { problem: String },
    #[error("{node} is not a node of this cluster (see `mako node show`)")]
    NoSuchNode { node: NodeId },
    #[error("node {node} cannot be removed: {problem}")]
    NodeInUse { node: String, problem: String },
    #[error("bad disk {disk}: {problem}")]
    BadDisk { disk: String, problem: String },
    #[error("disk {disk} already exists")]
    DuplicateDisk { disk: String },
    #[error("there is no disk {disk} (see `mako disk show`)")]
    NoSuchDisk { disk: String },
    #[error("disk {disk} is in use by file system {fs}; delete the file system or take the disk out of it first")]
    DiskInUse { disk: String, fs: String },
    #[error("bad file system {fs}: {problem}")]
    BadFileSystem { fs: String, problem: String },
    #[error("file system {fs} already exists")]
    DuplicateFileSystem { fs: String },
    #[error("there is no file system {fs} (see `mako fs show`)")]
    NoSuchFileSystem { fs: String },
    #[error("parameter {name}: {reason}")]
    BadParameter { name: String, reason: String },
    #[error("a batch of changes holds another batch; batches do not nest")]
    NestedBatch,
    #[error("expel or rejoin refused: {problem}")]
    BadExpel { problem: String },
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(id: u32, name: &str, port: u16, roles: &[Role]) -> NodeEntry {
        NodeEntry {
            id: NodeId(id),
            name: name.into(),
            addresses: vec![SocketAddr::from(([10, 0, 0, id as u8], port))],
            roles: roles.iter().copied().collect(),
        }
    }

    #[test]
    fn an_expel_is_recorded_once_and_a_rejoin_gives_a_new_epoch() {
        let mut c = ClusterConfig::default();
        c.apply(&Command::CreateCluster {
            name: "c".into(),
            uuid: [1; 16],
        })
        .unwrap();
        c.apply(&Command::AddNode(node(1, "n1", 1191, &[Role::Quorum])))
            .unwrap();
        c.apply(&Command::AddNode(node(2, "n2", 1191, &[Role::Client])))
            .unwrap();
        assert_eq!(c.lease_of(NodeId(2)), NodeLease::default());
        let expel = Command::Expel {
            node: NodeId(2),
            epoch: FIRST_LEASE_EPOCH,
            by: NodeId(1),
            reason: "lease expired".into(),
        };
        expel.check_input().unwrap();
        let at = c.apply(&expel).unwrap();
        let lease = c.lease_of(NodeId(2));
        assert_eq!(lease.epoch, FIRST_LEASE_EPOCH);
        assert_eq!(
            lease.expelled,
            Some(Expel {
                by: NodeId(1),
                reason: "lease expired".into(),
                config_epoch: at
            })
        );
        // A second expel (a new manager that saw the same silence) changes nothing.
        let before = c.clone();
        assert!(matches!(c.apply(&expel), Err(ConfigError::BadExpel { .. })));
        assert_eq!(c, before);
        // Rejoin at the expelled epoch: a new epoch; a stale rejoin is refused.
        c.apply(&Command::Rejoin {
            node: NodeId(2),
            epoch: FIRST_LEASE_EPOCH,
        })
        .unwrap();
        assert_eq!(c.lease_of(NodeId(2)).epoch, FIRST_LEASE_EPOCH + 1);
        assert!(c.lease_of(NodeId(2)).expelled.is_none());
        assert!(c
            .apply(&Command::Rejoin {
                node: NodeId(2),
                epoch: FIRST_LEASE_EPOCH,
            })
            .is_err());
        // An expel naming the old epoch (decided before the rejoin) is refused.
        assert!(c.apply(&expel).is_err());
        assert!(c
            .apply(&Command::Expel {
                node: NodeId(9),
                epoch: 1,
                by: NodeId(1),
                reason: "x".into()
            })
            .is_err());
    }

    #[test]
    fn a_batch_is_applied_whole_or_not_at_all_in_one_epoch() {
        let create = Command::CreateCluster {
            name: "c1".into(),
            uuid: [7; 16],
        };
        let n1 = node(1, "n1", 1, &[Role::Quorum, Role::Manager]);
        let disk = DiskEntry {
            name: "d1".into(),
            size_bytes: 1 << 30,
            servers: Vec::new(),
            failure_group: 1,
            pool: "system".into(),
        };
        let fs = FsEntry {
            name: "fs1".into(),
            disks: vec!["d1".into()],
            mount_options: Vec::new(),
        };
        // A file system on a disk the batch has not added yet: refused, nothing made.
        let mut c = ClusterConfig::default();
        let bad = Command::Batch(vec![
            create.clone(),
            Command::AddNode(n1.clone()),
            Command::CreateFs(fs.clone()),
            Command::AddDisk(disk.clone()),
        ]);
        assert_eq!(
            c.apply(&bad),
            Err(ConfigError::NoSuchDisk { disk: "d1".into() })
        );
        assert_eq!(c, ClusterConfig::default());
        let good = Command::Batch(vec![
            create,
            Command::AddNode(n1),
            Command::AddDisk(disk),
            Command::CreateFs(fs),
        ]);
        good.check_input().unwrap();
        assert_eq!(c.apply(&good), Ok(1));
        assert!(c.is_created() && c.file_systems.contains_key("fs1"));
        let nested = Command::Batch(vec![Command::Batch(Vec::new())]);
        assert_eq!(nested.check_input(), Err(ConfigError::NestedBatch));
        assert_eq!(c.apply(&nested), Err(ConfigError::NestedBatch));
    }

    fn created() -> ClusterConfig {
        let mut c = ClusterConfig::default();
        c.apply(&Command::CreateCluster {
            name: "c1".into(),
            uuid: [7; 16],
        })
        .unwrap();
        c
    }

    #[test]
    fn nothing_but_create_before_create() {
        let mut c = ClusterConfig::default();
        let e = c
            .apply(&Command::AddNode(node(1, "a", 1191, &[Role::Quorum])))
            .unwrap_err();
        assert_eq!(e, ConfigError::NotCreated);
        assert_eq!(c.epoch, 0);
        let mut c = created();
        let e = c
            .apply(&Command::CreateCluster {
                name: "c2".into(),
                uuid: [1; 16],
            })
            .unwrap_err();
        assert!(e.to_string().contains("already created"), "{e}");
        assert_eq!(c.epoch, 1);
    }

    #[test]
    fn disk_in_use_is_refused_and_changes_nothing() {
        let mut c = created();
        c.apply(&Command::AddNode(node(1, "a", 1191, &[Role::Quorum])))
            .unwrap();
        let disk = DiskEntry {
            name: "d1".into(),
            size_bytes: 1 << 30,
            servers: vec![NodeId(1)],
            failure_group: 1,
            pool: DEFAULT_POOL.into(),
        };
        c.apply(&Command::AddDisk(disk)).unwrap();
        c.apply(&Command::CreateFs(FsEntry {
            name: "fs1".into(),
            disks: vec!["d1".into()],
            mount_options: vec![],
        }))
        .unwrap();
        let before = c.clone();
        let e = c
            .apply(&Command::DeleteDisk { name: "d1".into() })
            .unwrap_err();
        assert_eq!(
            e,
            ConfigError::DiskInUse {
                disk: "d1".into(),
                fs: "fs1".into()
            }
        );
        assert!(e.to_string().contains("in use by file system fs1"), "{e}");
        assert_eq!(c, before);
        // The server of a disk cannot go either.
        let mut after = c.clone();
        after
            .apply(&Command::SetRoles {
                node: NodeId(1),
                roles: [Role::Quorum].into(),
            })
            .unwrap();
        let e = c
            .check(&Command::RemoveNode { node: NodeId(1) })
            .unwrap_err();
        assert!(matches!(e, ConfigError::NodeInUse { .. }), "{e}");
        c.apply(&Command::DeleteFs { name: "fs1".into() }).unwrap();
        c.apply(&Command::DeleteDisk { name: "d1".into() }).unwrap();
        assert!(c.disks.is_empty());
    }

    #[test]
    fn duplicate_names_and_addresses_are_refused() {
        let mut c = created();
        c.apply(&Command::AddNode(node(1, "a", 1191, &[Role::Quorum])))
            .unwrap();
        let e = c
            .apply(&Command::AddNode(node(2, "a", 1191, &[])))
            .unwrap_err();
        assert!(
            e.to_string().contains("name a is already taken by node 1"),
            "{e}"
        );
        let e = c
            .apply(&Command::AddNode(node(1, "b", 1191, &[])))
            .unwrap_err();
        assert!(
            e.to_string().contains("already the number of node a"),
            "{e}"
        );
        let mut same_address = node(2, "b", 1191, &[]);
        same_address.addresses = c.nodes[&NodeId(1)].addresses.clone();
        let e = c.apply(&Command::AddNode(same_address)).unwrap_err();
        assert!(e.to_string().contains("already node a's"), "{e}");
        assert_eq!(c.nodes.len(), 1);
    }

    #[test]
    fn bad_input_gets_clear_errors() {
        let e = parse_address("n1", "node1.example:1191").unwrap_err();
        assert!(e.to_string().contains("not IP:port"), "{e}");
        let mut n = node(1, "a b", 1191, &[]);
        let e = Command::AddNode(n.clone()).check_input().unwrap_err();
        assert!(e.to_string().contains("bad node name \"a b\""), "{e}");
        n.name = "a".into();
        n.addresses = vec![SocketAddr::from(([0, 0, 0, 0], 1191))];
        let e = Command::AddNode(n.clone()).check_input().unwrap_err();
        assert!(
            e.to_string()
                .contains("not an address another node can reach"),
            "{e}"
        );
        n.addresses = vec![SocketAddr::from(([10, 0, 0, 1], 0))];
        assert!(Command::AddNode(n.clone()).check_input().is_err());
        n.addresses = vec![];
        assert!(Command::AddNode(n.clone()).check_input().is_err());
        n.addresses = vec![SocketAddr::from(([10, 0, 0, 1], 1191))];
        n.roles = [Role::Manager, Role::Client].into();
        let e = Command::AddNode(n).check_input().unwrap_err();
        assert!(e.to_string().contains("exclude each other"), "{e}");
        assert!(Role::parse("quorum").is_ok());
        assert!(Role::parse("boss")
            .unwrap_err()
            .to_string()
            .contains("quorum, manager and client"));

        let e = Command::SetParam {
            name: "pagepol".into(),
            value: "1G".into(),
            scope: Scope::Cluster,
        }
        .check_input()
        .unwrap_err();
        assert!(e.to_string().contains("pagepool"), "a suggestion: {e}");
        let e = Command::SetParam {
            name: "pagepool".into(),
            value: "lots".into(),
            scope: Scope::Cluster,
        }
        .check_input()
        .unwrap_err();
        assert!(matches!(e, ConfigError::BadParameter { .. }), "{e}");
        Command::SetParam {
            name: "pagepool".into(),
            value: "1G".into(),
            scope: Scope::Nodes(vec![NodeId(1)]),
        }
        .check_input()
        .unwrap();
        let e = Command::SetParam {
            name: "maxTcpConnsPerNodeConn".into(),
            value: "2".into(),
            scope: Scope::Nodes(vec![NodeId(1)]),
        }
        .check_input()
        .unwrap_err();
        assert!(e.to_string().contains("cannot be set per node"), "{e}");
        let e = Command::AddDisk(DiskEntry {
            name: "d1".into(),
            size_bytes: 0,
            servers: vec![],
            failure_group: 1,
            pool: DEFAULT_POOL.into(),
        })
        .check_input()
        .unwrap_err();
        assert!(e.to_string().contains("size is 0"), "{e}");
    }

    #[test]
    fn per_node_values_override_the_cluster_value() {
        let mut c = created();
        c.apply(&Command::AddNode(node(1, "a", 1191, &[Role::Quorum])))
            .unwrap();
        c.apply(&Command::AddNode(node(2, "b", 1191, &[Role::Client])))
            .unwrap();
        let set = |value: &str, scope: Scope| Command::SetParam {
            name: "pagepool".into(),
            value: value.into(),
            scope,
        };
        c.apply(&set("1G", Scope::Cluster)).unwrap();
        c.apply(&set("2G", Scope::Nodes(vec![NodeId(2)]))).unwrap();
        assert_eq!(c.param_for(NodeId(1), "pagepool"), Some("1G"));
        assert_eq!(c.param_for(NodeId(2), "pagepool"), Some("2G"));
        let e = c
            .apply(&set("2G", Scope::Nodes(vec![NodeId(9)])))
            .unwrap_err();
        assert_eq!(e, ConfigError::NoSuchNode { node: NodeId(9) });
        c.apply(&Command::UnsetParam {
            name: "pagepool".into(),
            scope: Scope::Nodes(vec![NodeId(2)]),
        })
        .unwrap();
        assert_eq!(c.param_for(NodeId(2), "pagepool"), Some("1G"));
        assert!(c.node_params.is_empty());
        // The last quorum node keeps its role.
        let e = c
            .apply(&Command::SetRoles {
                node: NodeId(1),
                roles: BTreeSet::new(),
            })
            .unwrap_err();
        assert!(e.to_string().contains("last quorum node"), "{e}");
    }
}
