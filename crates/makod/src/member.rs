//! makod's member of the cluster-configuration quorum (issue 13 item 2).
//!
//! Every node of a multi-process cluster runs one [`mako_cluster::Quorum`] member over
//! its TcpTransport, its raft log and applied configuration in
//! `<data dir>/cluster.redb`. The nodes marked `quorum = true` in cluster.toml vote;
//! the others follow as raft learners. The raft leader is the cluster manager: every
//! change to the configuration is committed through it, and every node applies it.
//!
//! Two threads per node:
//! - **The steward.** On the lowest-numbered quorum node, a store with no membership
//!   yet is bootstrapped with the quorum nodes of cluster.toml (once: a store that has
//!   a membership never is). On the cluster manager, it fills a configuration that is
//!   not yet created from cluster.toml — the cluster's name, its nodes with their
//!   roles, its disks, its file systems — one idempotent change at a time, so a
//!   manager that fails half-way is completed by the next; and it adds every node
//!   that is not a quorum node as a learner.
//! - **The applier.** When the configuration's epoch changes, it writes this node's
//!   parameter values (its own override, else the cluster-wide value) into the node's
//!   config.toml and gives them to the running daemon: at once for parameters that a
//!   running daemon takes, at the next mount for the others. The names it set are
//!   remembered in `<data dir>/cluster-params` so that a value unset while the node
//!   was down is removed when it comes back.
//!
//! Not yet: changing the quorum nodes of a running cluster, adding or removing nodes
//! through the quorum (the node list is the one of cluster.toml), and moving the token
//! and file-system managers with the cluster manager (they stay on the `manager` node).

use anyhow::{anyhow, bail, Context, Result};
use mako_cluster::{
    ClusterConfig as Replicated, Command, DiskEntry, FsEntry, Member as RaftMember, NodeEntry,
    Quorum, QuorumOptions, Role, Scope,
};
use mako_control::{
    ClusterConfig, ClusterDiskView, ClusterFsView, ClusterView, DataDir, NodeDef, NodeStateView,
};
use mako_rt::{NodeId, Registry, Transport};
use parking_lot::Mutex;
use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How often the steward and the applier look.
const TICK: Duration = Duration::from_millis(200);
/// How long the steward's changes may take (it retries at its next turn).
const STEWARD_DEADLINE: Duration = Duration::from_secs(10);
/// File of the parameter names this node took from the replicated configuration.
const APPLIED_PARAMS_FILE: &str = "cluster-params";

/// Gives a parameter value of the replicated configuration to the running daemon
/// (`None`: unset), after the applier saved it in config.toml.
pub type ApplyParam = Box<dyn Fn(&str, Option<&str>) -> Result<String> + Send + Sync>;

/// Told the replicated configuration at each new epoch (makod gives its transport
/// the nodes' addresses, refuses nodes that were removed, and gives up the calls
/// waiting for nodes that were expelled).
pub type NodesChanged = Box<dyn Fn(&Replicated) + Send + Sync>;

/// This node's member of the quorum and its two threads.
pub struct Member {
    quorum: Arc<Quorum>,
    me: NodeDef,
    nodes: Vec<NodeDef>,
    stop: Arc<AtomicBool>,
    threads: Mutex<Vec<JoinHandle<()>>>,
    /// This node's lease and, on the cluster manager, the watch of the others.
    pub leases: Arc<crate::lease::Leases>,
}

fn member_of(n: &NodeDef) -> RaftMember {
    RaftMember {
        name: n.name.clone(),
        address: n.address.clone(),
    }
}

impl Member {
    /// Starts the member of node `cluster.node_id` and its steward; the applier starts
    /// with [`Member::start_applier`] once the daemon can take parameter values.
    pub fn start(
        dir: &DataDir,
        cluster: &ClusterConfig,
        transport: Arc<dyn Transport>,
        registry: Arc<Registry>,
        times: mako_cluster::lease::LeaseTimes,
    ) -> Result<Arc<Member>> {
        let me = cluster
            .node(cluster.node_id)
            .context("this node is not in cluster.toml's node list")?
            .clone();
        let quorum = Arc::new(
            Quorum::start(
                NodeId(me.id),
                &dir.root,
                transport.clone(),
                registry.clone(),
                QuorumOptions::default(),
            )
            .map_err(|e| anyhow!("node {} ({}): the quorum member: {e}", me.id, me.name))?,
        );
        let stop = Arc::new(AtomicBool::new(false));
        let (leases, lease_threads) = crate::lease::Leases::start(
            NodeId(me.id),
            quorum.clone(),
            transport,
            &registry,
            times,
            stop.clone(),
        )
        .context("starting the lease threads")?;
        let member = Arc::new(Member {
            quorum,
            me,
            nodes: cluster.nodes.clone(),
            stop,
            threads: Mutex::new(lease_threads),
            leases,
        });
        let steward = {
            let m = member.clone();
            let cluster = cluster.clone();
            std::thread::Builder::new()
                .name("cluster-steward".into())
                .spawn(move || m.steward(&cluster))
                .context("starting the cluster steward")?
        };
        member.threads.lock().push(steward);
        Ok(member)
    }

    /// Starts the applier, which gives this node's parameter values to `apply`.
    pub fn start_applier(
        self: &Arc<Self>,
        dir: &DataDir,
        apply: ApplyParam,
        nodes_changed: NodesChanged,
    ) -> Result<()> {
        let m = self.clone();
        let dir = dir.clone();
        let t = std::thread::Builder::new()
            .name("cluster-applier".into())
            .spawn(move || m.applier(&dir, apply, nodes_changed))
            .context("starting the cluster applier")?;
        self.threads.lock().push(t);
        Ok(())
    }

    fn stopped(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }

    fn quorum_defs(&self) -> Vec<&NodeDef> {
        let marked: Vec<&NodeDef> = self.nodes.iter().filter(|n| n.quorum).collect();
        if marked.is_empty() {
            // As `ClusterConfig::quorum_nodes`: the first manager node alone.
            self.nodes
                .iter()
                .filter(|n| n.manager)
                .min_by_key(|n| n.id)
                .into_iter()
                .collect()
        } else {
            marked
        }
    }

    fn steward(&self, cluster: &ClusterConfig) {
        let quorum_ids: BTreeSet<u32> = self.quorum_defs().iter().map(|n| n.id).collect();
        let first = quorum_ids.iter().next().copied();
        let mut last_problem = String::new();
        while !self.stopped() {
            if let Err(e) = self.steward_turn(cluster, first, &quorum_ids) {
                let text = format!("{e:#}");
                // Say each new problem once, not every turn.
                if text != last_problem {
                    tracing::info!("cluster configuration: {text}");
                    last_problem = text;
                }
            } else {
                last_problem.clear();
            }
            sleep_unless(&self.stop, TICK);
        }
    }

    fn steward_turn(
        &self,
        cluster: &ClusterConfig,
        first: Option<u32>,
        quorum_ids: &BTreeSet<u32>,
    ) -> Result<()> {
        let status = self.quorum.status();
        if status.voters.is_empty() {
            if first == Some(self.me.id) {
                let members: BTreeMap<NodeId, RaftMember> = self
                    .quorum_defs()
                    .into_iter()
                    .map(|n| (NodeId(n.id), member_of(n)))
                    .collect();
                tracing::info!(
                    "creating the quorum: nodes {}",
                    self.quorum_defs()
                        .iter()
                        .map(|n| n.name.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                );
                match self.quorum.bootstrap(&members) {
                    Ok(()) | Err(mako_cluster::QuorumError::AlreadyInitialized { .. }) => {}
                    Err(e) => bail!("creating the quorum: {e}"),
                }
            }
            return Ok(());
        }
        if status.state != "leader" {
            return Ok(());
        }
        // This node is the cluster manager: create the configuration (once, whole, in
        // one batch: afterwards it changes only through admin commands, so a disk or
        // file system deleted is not made again from cluster.toml), then the learners.
        let config = self.quorum.read_local();
        if !config.is_created() && !self.stopped() {
            let batch = Command::Batch(seed_commands(cluster, &config)?);
            let epoch = match self.quorum.propose_within(batch, STEWARD_DEADLINE) {
                Ok(epoch) => epoch,
                // Another manager created it meanwhile.
                Err(mako_cluster::QuorumError::Refused(
                    mako_cluster::ConfigError::AlreadyCreated { .. },
                )) => self.quorum.read_local().epoch,
                Err(e) => bail!("creating the configuration: {e}"),
            };
            tracing::info!(
                "cluster configuration created from cluster.toml: {} nodes, {} disks, {} file \
                 systems (epoch {epoch})",
                cluster.nodes.len(),
                cluster.disks.len(),
                cluster.filesystems.len()
            );
        }
        let members: BTreeSet<NodeId> = status
            .voters
            .iter()
            .chain(status.learners.iter())
            .copied()
            .collect();
        // The learners: every node of the configuration (cluster.toml's list only until
        // it is created) that is not a voter; a learner the configuration no longer has
        // (`mako node remove`) leaves raft's membership.
        let config = self.quorum.read_local();
        let wanted: Vec<NodeDef> = if config.is_created() {
            config_defs(&config)
        } else {
            self.nodes.clone()
        };
        for n in &wanted {
            if quorum_ids.contains(&n.id) || members.contains(&NodeId(n.id)) || self.stopped() {
                continue;
            }
            self.quorum
                .add_learner(NodeId(n.id), member_of(n), STEWARD_DEADLINE)
                .map_err(|e| anyhow!("adding {} as a learner: {e}", n.name))?;
            tracing::info!("cluster configuration: {} follows as a learner", n.name);
        }
        if config.is_created() {
            let gone: BTreeSet<NodeId> = status
                .learners
                .iter()
                .filter(|id| !config.nodes.contains_key(id))
                .copied()
                .collect();
            if !gone.is_empty() && !self.stopped() {
                self.quorum
                    .remove_learners(&gone, STEWARD_DEADLINE)
                    .map_err(|e| anyhow!("removing learners {gone:?}: {e}"))?;
                tracing::info!(
                    "cluster configuration: nodes {} removed from the quorum's learners",
                    gone.iter()
                        .map(|n| n.0.to_string())
                        .collect::<Vec<_>>()
                        .join(", ")
                );
            }
        }
        Ok(())
    }

    fn applier(&self, dir: &DataDir, apply: ApplyParam, nodes_changed: NodesChanged) {
        let mut applied_epoch = None;
        let mut nodes_epoch = None;
        let mut last_problem = String::new();
        while !self.stopped() {
            let config = self.quorum.read_local();
            if config.is_created() && nodes_epoch != Some(config.epoch) {
                nodes_changed(&config);
                nodes_epoch = Some(config.epoch);
            }
            if config.is_created() && applied_epoch != Some(config.epoch) {
                match self.apply_params(dir, &config, &apply) {
                    Ok(()) => {
                        applied_epoch = Some(config.epoch);
                        last_problem.clear();
                    }
                    Err(e) => {
                        let text = format!("{e:#}");
                        if text != last_problem {
                            tracing::error!(
                                "applying the cluster configuration of epoch {}: {text}",
                                config.epoch
                            );
                            last_problem = text;
                        }
                    }
                }
            }
            sleep_unless(&self.stop, TICK);
        }
    }

    /// Makes config.toml and the running daemon hold this node's values of `config`.
    fn apply_params(&self, dir: &DataDir, config: &Replicated, apply: &ApplyParam) -> Result<()> {
        let me = NodeId(self.me.id);
        let mut wanted: BTreeMap<String, String> = BTreeMap::new();
        let names = config.params.keys().chain(
            config
                .node_params
                .get(&me)
                .into_iter()
                .flat_map(|p| p.keys()),
        );
        for name in names {
            if let Some(v) = config.param_for(me, name) {
                wanted.insert(name.clone(), v.to_string());
            }
        }
        let record = dir.root.join(APPLIED_PARAMS_FILE);
        let before: BTreeSet<String> = std::fs::read_to_string(&record)
            .unwrap_or_default()
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .map(String::from)
            .collect();
        let mut store = mako_config::ConfigStore::load_or_default(dir.config_file())?;
        let mut changed: Vec<(String, Option<String>)> = Vec::new();
        for (name, value) in &wanted {
            let now = store.get(name)?.map(|v| v.to_string());
            if now.as_deref() != Some(value.as_str()) {
                store
                    .set(name, value)
                    .with_context(|| format!("{name} = {value}"))?;
                changed.push((name.clone(), Some(value.clone())));
            }
        }
        for name in before.difference(&wanted.keys().cloned().collect()) {
            if store.unset(name)?.is_some() {
                changed.push((name.clone(), None));
            }
        }
        if !changed.is_empty() {
            store.save()?;
        }
        let text: String = wanted.keys().map(|n| format!("{n}\n")).collect();
        if before != wanted.keys().cloned().collect::<BTreeSet<_>>() {
            let tmp = dir.root.join(format!(".{APPLIED_PARAMS_FILE}.tmp"));
            std::fs::write(&tmp, text)
                .and_then(|()| std::fs::rename(&tmp, &record))
                .with_context(|| format!("writing {}", record.display()))?;
        }
        for (name, value) in changed {
            let said = apply(&name, value.as_deref())?;
            tracing::info!(
                "cluster configuration epoch {}: {name} {}: {said}",
                config.epoch,
                match &value {
                    Some(v) => format!("= {v}"),
                    None => "unset".to_string(),
                }
            );
        }
        Ok(())
    }

    /// The configuration and every node's state (`mako node show`, `mako status`).
    pub fn view(&self) -> ClusterView {
        let config = self.quorum.read_local();
        let states: BTreeMap<NodeId, Result<mako_cluster::quorum::NodeStatus, String>> =
            self.quorum.node_states().into_iter().collect();
        let name_of = |id: NodeId| -> String {
            config
                .nodes
                .get(&id)
                .map(|n| n.name.clone())
                .or_else(|| {
                    self.nodes
                        .iter()
                        .find(|n| n.id == id.0)
                        .map(|n| n.name.clone())
                })
                .unwrap_or_else(|| format!("node {}", id.0))
        };
        let quorum_ids: BTreeSet<u32> = self.quorum_defs().iter().map(|n| n.id).collect();
        // The configuration's nodes once it is created (nodes added and removed since
        // start included), else cluster.toml's.
        let listed: Vec<NodeDef> = if config.is_created() {
            config_defs(&config)
        } else {
            self.nodes.clone()
        };
        let nodes = listed
            .iter()
            .map(|n| {
                let id = NodeId(n.id);
                let roles = match config.nodes.get(&id) {
                    Some(e) => e
                        .roles
                        .iter()
                        .map(|r| r.name())
                        .collect::<Vec<_>>()
                        .join(","),
                    None => roles_of(n, quorum_ids.contains(&n.id))
                        .iter()
                        .map(|r| r.name())
                        .collect::<Vec<_>>()
                        .join(","),
                };
                let lease = config.lease_of(id);
                let (state, answers, term, epoch) = match states.get(&id) {
                    Some(found) if lease.expelled.is_some() => {
                        let e = lease.expelled.as_ref().expect("checked");
                        let mut expel = format!(
                            "expelled by {} (lease epoch {}): {}",
                            name_of(e.by),
                            lease.epoch,
                            e.reason
                        );
                        // Known to the cluster manager only (it drives the recovery).
                        if let Some(r) = self.leases.recovery_of(id, lease.epoch) {
                            expel += &format!("; {r}");
                        }
                        match found {
                            Ok(_) => (expel, true, 0, 0),
                            // Keeps "down: …" first: a down node is also expelled.
                            Err(why) => (format!("{why}; {expel}"), false, 0, 0),
                        }
                    }
                    Some(Ok(s)) if self.leases.arbitrating(id) => (
                        format!(
                            "arbitrating: lease expired, pinged by the cluster manager ({})",
                            s.state
                        ),
                        true,
                        s.term,
                        s.epoch,
                    ),
                    Some(Err(why)) if self.leases.arbitrating(id) => (
                        format!(
                            "arbitrating: lease expired, pinged by the cluster manager ({why})"
                        ),
                        false,
                        0,
                        0,
                    ),
                    Some(Ok(s)) => (s.state.clone(), true, s.term, s.epoch),
                    Some(Err(why)) => (why.clone(), false, 0, 0),
                    None => (
                        "not in the quorum's membership yet".to_string(),
                        false,
                        0,
                        0,
                    ),
                };
                NodeStateView {
                    id: n.id,
                    name: n.name.clone(),
                    roles,
                    address: n.address.clone(),
                    state,
                    answers,
                    term,
                    epoch,
                }
            })
            .collect();
        let params = config
            .params
            .iter()
            .map(|(k, v)| (k.clone(), v.clone(), "cluster".to_string()))
            .chain(config.node_params.iter().flat_map(|(node, p)| {
                let who = name_of(*node);
                p.iter()
                    .map(move |(k, v)| (k.clone(), v.clone(), who.clone()))
            }))
            .collect();
        ClusterView {
            answered_by: self.me.name.clone(),
            name: config.name.clone(),
            epoch: config.epoch,
            manager: self.quorum.leader().map(|(id, _)| name_of(id)),
            nodes,
            disks: config
                .disks
                .values()
                .map(|d| ClusterDiskView {
                    name: d.name.clone(),
                    size_bytes: d.size_bytes,
                    servers: d.servers.iter().map(|s| name_of(*s)).collect(),
                    failure_group: d.failure_group,
                    pool: d.pool.clone(),
                })
                .collect(),
            filesystems: config
                .file_systems
                .values()
                .map(|f| ClusterFsView {
                    name: f.name.clone(),
                    disks: f.disks.clone(),
                })
                .collect(),
            params,
        }
    }

    /// Sets (`value` given) or unsets parameter `name` cluster-wide or on `nodes`
    /// through the cluster manager; returns what to tell the administrator.
    pub fn set_param(&self, name: &str, value: Option<&str>, nodes: &[String]) -> Result<String> {
        let spec = mako_config::lookup(name)?;
        let config = self.quorum.read_local();
        if !config.is_created() {
            bail!(
                "the cluster's configuration is not created yet (the cluster manager creates \
                 it once a majority of the quorum nodes runs): see `mako node show`"
            );
        }
        let scope = if nodes.is_empty() {
            Scope::Cluster
        } else {
            let mut ids = Vec::new();
            for n in nodes {
                let Some(e) = config.node_by_name(n) else {
                    bail!(
                        "-N {n}: no such node; the nodes are {}",
                        config.node_names()
                    );
                };
                ids.push(e.id);
            }
            Scope::Nodes(ids)
        };
        let command = match value {
            Some(v) => Command::SetParam {
                name: spec.name.to_string(),
                value: v.to_string(),
                scope: scope.clone(),
            },
            None => Command::UnsetParam {
                name: spec.name.to_string(),
                scope: scope.clone(),
            },
        };
        let epoch = self.quorum.propose(command).map_err(|e| anyhow!("{e}"))?;
        let where_ = match &scope {
            Scope::Cluster => "on every node".to_string(),
            Scope::Nodes(_) => format!("on {}", nodes.join(", ")),
        };
        Ok(match value {
            Some(v) => format!(
                "{} = {v} {where_} (configuration epoch {epoch}); each node applies it{}",
                spec.name,
                if spec.apply == mako_config::Apply::Immediate {
                    " at once"
                } else {
                    " at its next mount"
                }
            ),
            None => format!("{} unset {where_} (configuration epoch {epoch})", spec.name),
        })
    }

    /// Deletes disk (`fs` false) or file system `name` from the replicated configuration
    /// through the cluster manager; one it does not have is deleted already.
    pub fn delete(&self, name: &str, fs: bool) -> Result<String> {
        let config = self.quorum.read_local();
        if !config.is_created() {
            bail!(
                "the cluster's configuration is not created yet (the cluster manager creates \
                 it once a majority of the quorum nodes runs): see `mako node show`"
            );
        }
        let (command, what) = if fs {
            (
                Command::DeleteFs {
                    name: name.to_string(),
                },
                "file system",
            )
        } else {
            (
                Command::DeleteDisk {
                    name: name.to_string(),
                },
                "disk",
            )
        };
        match self.quorum.propose(command) {
            Ok(epoch) => Ok(format!(
                "{what} {name} deleted from the cluster's configuration (epoch {epoch})"
            )),
            Err(mako_cluster::QuorumError::Refused(
                mako_cluster::ConfigError::NoSuchDisk { .. }
                | mako_cluster::ConfigError::NoSuchFileSystem { .. },
            )) => Ok(format!(
                "{what} {name} is not in the cluster's configuration (deleted before)"
            )),
            Err(e) => Err(anyhow!("{e}")),
        }
    }

    /// The quorum handle (the NSD server's fence reads the configuration through it).
    pub fn quorum(&self) -> Arc<Quorum> {
        self.quorum.clone()
    }

    /// Adds node `id` to the replicated configuration (`mako node add`) as a client:
    /// the cluster manager's steward then makes it a raft learner and every node's
    /// applier gives its transport the new peer. A quorum or manager role is refused
    /// (see docs/cluster.md "Adding and removing nodes").
    pub fn add_node(&self, id: u32, name: &str, address: &str, roles: &[String]) -> Result<String> {
        let config = self.quorum.read_local();
        if !config.is_created() {
            bail!(
                "the cluster's configuration is not created yet (the cluster manager creates \
                 it once a majority of the quorum nodes runs): see `mako node show`"
            );
        }
        let mut set = BTreeSet::new();
        for r in roles {
            set.insert(Role::parse(r).map_err(|e| anyhow!("{e}"))?);
        }
        if set.contains(&Role::Quorum) {
            bail!(
                "{name}: a new node cannot be a quorum node: raft's voters go from 1 to 3 or \
                 from 3 to 5, never to an even number, and `mako node add` adds one node at a \
                 time, so nothing was added. Add it as a client (without --roles), or create \
                 the cluster with the quorum nodes it needs (`mako cluster create \
                 --quorum-nodes`)"
            );
        }
        if set.contains(&Role::Manager) {
            bail!(
                "{name}: a new node cannot be a manager node yet: the token and file-system \
                 managers run on the node marked manager in cluster.toml and do not move or \
                 shard to added nodes, so nothing was added. Add it as a client (without \
                 --roles)"
            );
        }
        set.insert(Role::Client);
        let addr: SocketAddr =
            mako_cluster::model::parse_address(name, address).map_err(|e| anyhow!("{e}"))?;
        let epoch = self
            .quorum
            .propose(Command::AddNode(NodeEntry {
                id: NodeId(id),
                name: name.to_string(),
                addresses: vec![addr],
                roles: set,
            }))
            .map_err(|e| anyhow!("{e}"))?;
        Ok(format!(
            "node {name} (id {id}, {address}, client) added to the cluster's configuration \
             (epoch {epoch}); every node learns its address, and it follows the quorum as a \
             learner once it runs"
        ))
    }

    /// Removes node `name` from the replicated configuration (`mako node remove`):
    /// refused while it answers (it may mount a file system), while it is a quorum node
    /// or an NSD server. Its raft membership goes with the cluster manager's steward,
    /// and every node refuses its connections from then on.
    pub fn remove_node(&self, name: &str) -> Result<String> {
        let config = self.quorum.read_local();
        let Some(entry) = config.node_by_name(name).cloned() else {
            bail!(
                "{name}: no such node in the cluster's configuration; the nodes are {}",
                config.node_names()
            );
        };
        if entry.roles.contains(&Role::Quorum) {
            let quorum = config.quorum_nodes().len();
            bail!(
                "{name} is a quorum node ({quorum} of {quorum}{}): removing one would change \
                 the quorum, which `mako node remove` does not do; nothing was removed",
                if quorum == 1 { ", the last one" } else { "" }
            );
        }
        if let Some(d) = config
            .disks
            .values()
            .find(|d| d.servers.contains(&entry.id))
        {
            bail!(
                "{name} is an NSD server of disk {}: the disk's other nodes reach it through \
                 {name}. Give the disk other servers first (the disk's `servers` in \
                 cluster.toml; `mako disk change` does not exist yet), then remove it; \
                 nothing was removed",
                d.name
            );
        }
        if entry.id.0 == self.me.id {
            bail!(
                "{name} is the node that answered this request, so it is up: stop it first \
                 (`mako shutdown -N {name}`), then run `mako node remove {name}` again; nothing was removed"
            );
        }
        let states = self.quorum.node_states();
        if let Some((_, Ok(s))) = states.iter().find(|(id, _)| *id == entry.id) {
            bail!(
                "{name} is up ({}, epoch {}), and may mount file systems: stop it first \
                 (`mako shutdown -N {name}`), then run `mako node remove {name}` again; \
                 nothing was removed",
                s.state,
                s.epoch
            );
        }
        let epoch = self
            .quorum
            .propose(Command::RemoveNode { node: entry.id })
            .map_err(|e| anyhow!("{e}"))?;
        Ok(format!(
            "node {name} (id {}) removed from the cluster's configuration (epoch {epoch}); \
             the other nodes refuse its connections from now on",
            entry.id.0
        ))
    }

    /// Stops the threads and the member (before the transport closes).
    pub fn shutdown(&self) {
        self.stop.store(true, Ordering::SeqCst);
        for t in self.threads.lock().drain(..) {
            let _ = t.join();
        }
        self.quorum.shutdown();
    }
}

/// The nodes of the replicated configuration as node definitions (no data directory:
/// that is each node's own).
fn config_defs(config: &Replicated) -> Vec<NodeDef> {
    config
        .nodes
        .values()
        .map(|e| NodeDef {
            id: e.id.0,
            name: e.name.clone(),
            address: e
                .addresses
                .first()
                .map(|a| a.to_string())
                .unwrap_or_default(),
            data_dir: Default::default(),
            manager: e.roles.contains(&Role::Manager),
            quorum: e.roles.contains(&Role::Quorum),
            local_disks: None,
        })
        .collect()
}

/// The roles of a node of cluster.toml.
fn roles_of(n: &NodeDef, quorum: bool) -> BTreeSet<Role> {
    let mut roles = BTreeSet::new();
    if quorum {
        roles.insert(Role::Quorum);
    }
    roles.insert(if n.manager {
        Role::Manager
    } else {
        Role::Client
    });
    roles
}

/// The changes that bring `config` to what cluster.toml describes, for what it lacks
/// (nothing once it is complete): the cluster, then nodes, disks, file systems.
fn seed_commands(cluster: &ClusterConfig, config: &Replicated) -> Result<Vec<Command>> {
    let mut out = Vec::new();
    if !config.is_created() {
        out.push(Command::CreateCluster {
            name: cluster.cluster_name.clone(),
            uuid: *uuid_bytes()?,
        });
    }
    let quorum_ids: BTreeSet<u32> = cluster.quorum_nodes().iter().map(|n| n.id).collect();
    for n in &cluster.nodes {
        if config.nodes.contains_key(&NodeId(n.id)) {
            continue;
        }
        let addr: SocketAddr = n
            .address
            .parse()
            .with_context(|| format!("node {}: address {:?}", n.name, n.address))?;
        out.push(Command::AddNode(NodeEntry {
            id: NodeId(n.id),
            name: n.name.clone(),
            addresses: vec![addr],
            roles: roles_of(n, quorum_ids.contains(&n.id)),
        }));
    }
    for d in &cluster.disks {
        if config.disks.contains_key(&d.name) {
            continue;
        }
        out.push(Command::AddDisk(DiskEntry {
            name: d.name.clone(),
            size_bytes: d.size_bytes,
            // Its NSD servers (none: every node opens the disk files directly).
            servers: d
                .servers
                .iter()
                .filter_map(|s| cluster.nodes.iter().find(|n| &n.name == s))
                .map(|n| NodeId(n.id))
                .collect(),
            failure_group: d.failure_group,
            pool: d.pool.clone(),
        }));
    }
    for f in &cluster.filesystems {
        if config.file_systems.contains_key(&f.name) {
            continue;
        }
        out.push(Command::CreateFs(FsEntry {
            name: f.name.clone(),
            disks: f.disks.clone(),
            mount_options: f
                .mount_options
                .split(',')
                .map(str::trim)
                .filter(|o| !o.is_empty())
                .map(String::from)
                .collect(),
        }));
    }
    Ok(out)
}

/// 16 random bytes for the cluster's identity.
fn uuid_bytes() -> Result<Box<[u8; 16]>> {
    let mut b = [0u8; 16];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut b))
        .context("reading /dev/urandom for the cluster's identity")?;
    Ok(Box::new(b))
}

/// Sleeps `d`, waking early when `stop` is set.
fn sleep_unless(stop: &AtomicBool, d: Duration) {
    let end = Instant::now() + d;
    while !stop.load(Ordering::SeqCst) {
        let now = Instant::now();
        if now >= end {
            return;
        }
        std::thread::sleep((end - now).min(Duration::from_millis(50)));
    }
}
