//! makod as one node of a cluster of several processes (`mako up --nodes N`, issue 13).
//!
//! A node's cluster.toml lists every node (`[[nodes]]`: number, name, address, data
//! directory, which one is the manager). Its makod then reaches the token manager, the
//! file-system manager and the other nodes through a `TcpTransport` (mako-rpc) instead
//! of the in-process transport, and serves its own services — its token client and its
//! file system (metanode requests, frees), registered by `mount_node`, and on the
//! manager node the token manager — to the other nodes on its own address. The core is
//! the same as in one process: only `NodeEnv::transport` changed.
//!
//! - **Joining.** The node proves it knows the cluster key (`<data dir>/cluster.key`) to
//!   every node it connects to, and every node it accepts proves it back; a makod
//!   without the key does not start, and one with another key is refused by the others
//!   (its mount fails with their refusal).
//! - **Start-up order.** The manager node may start after the others: a client node
//!   waits for the manager's token service, up to `MANAGER_WAIT`, before it mounts, and
//!   says whom it waited for if it gives up.
//! - **Shutdown.** A node that unmounts writes everything back, then gives up every
//!   token it holds (`MountedFs::write_back`), so the others never revoke from a node
//!   that is gone. The manager must stop last (`mako down` stops the others first):
//!   its token state lives in its memory only, so a manager that stops while others run
//!   leaves them unable to get tokens until every node is restarted.
//!
//! - **Disks** (docs/nsd.md). Each disk of cluster.toml lists its NSD servers (primary
//!   first) and each node the disks it opens itself (`local_disks`; all of them when
//!   absent). A node that is a server of some disks opens them at start and serves
//!   them (`NsdServer` under `ServiceId::Nsd`) before it listens; at mount, each disk is
//!   opened directly where the node has local access and reached through its servers
//!   (`RemoteDisk`, failing over down the list) where it has not
//!   (`DiskRoute::choose`), so a node with no disk access at all mounts too.
//!
//! A failed manager node's token-manager slot is taken over by another manager node
//! (`crate::shards`). Not yet: more than one file system mounted by a node of such a
//! cluster.

use anyhow::{bail, Context, Result};
use mako_config::EffectiveConfig;
use mako_control::{same_dir, ClusterConfig, DataDir, DiskDef, NodeDef};
use mako_disk::{Disk, DiskError, FileDisk, LocalNsd};
use mako_fs::env::NodeEnv;
use mako_nsd::{DiskRoute, NsdServer, RemoteDisk, RemoteOptions};
use mako_rpc::{ClusterKey, RpcConfig, TcpTransport};
use mako_rt::{CallOptions, NodeId, Registry, ServiceId, SystemClock, Transport};
use mako_token::{
    ManagerMap, ManagerReply, ManagerRequest, ManagerService, TokenManager, TokenManagerLimits,
};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long a node waits for the manager node's token service before it gives up
/// mounting (`MAKO_MANAGER_WAIT_SECS` overrides it, for tests).
const MANAGER_WAIT: Duration = Duration::from_secs(60);
/// How long one probe of the manager may take.
const PROBE_DEADLINE: Duration = Duration::from_secs(2);

/// How long a node waits for the manager node, or for a disk's NSD servers, at mount.
pub fn manager_wait() -> Duration {
    std::env::var("MAKO_MANAGER_WAIT_SECS")
        .ok()
        .and_then(|s| s.parse::<u64>().ok())
        .map(Duration::from_secs)
        .unwrap_or(MANAGER_WAIT)
}

/// This node's place in a multi-process cluster.
pub struct NetNode {
    pub me: NodeDef,
    /// The file-system manager: the first of `managers`.
    pub manager: NodeDef,
    /// The manager nodes in number order; the token manager is sharded over them.
    pub managers: Vec<NodeDef>,
    pub cluster_name: String,
    pub transport: Arc<TcpTransport>,
    pub registry: Arc<Registry>,
    /// The NSD service of this node, if it is a server of some disks.
    pub nsd: Option<Arc<NsdServer>>,
    /// This node's token manager, on a manager node (`crate::shards`).
    pub token_manager: Option<Arc<TokenManager>>,
}

/// How a mounted node reaches one disk (`mako status`).
#[derive(Clone, Debug)]
pub enum DiskAccess {
    /// It opened the disk itself.
    Local,
    /// Through its NSD servers; the disk tells which one it uses now.
    Remote(Arc<RemoteDisk>),
}

impl DiskAccess {
    /// "local", or "via node1 (servers node1,node2; 1 failover)".
    pub fn describe(&self, names: &dyn Fn(NodeId) -> String) -> String {
        match self {
            DiskAccess::Local => "local".into(),
            DiskAccess::Remote(d) => {
                let list: Vec<String> = d.servers().iter().map(|s| names(*s)).collect();
                let mut t = format!(
                    "via {} (servers {})",
                    names(d.current_server()),
                    list.join(",")
                );
                match d.failovers() {
                    0 => {}
                    1 => t.push_str(", 1 failover"),
                    n => t.push_str(&format!(", {n} failovers")),
                }
                t
            }
        }
    }
}

/// How a node reaches each disk of a file system, by disk name.
pub type DiskAccessList = Vec<(String, DiskAccess)>;

/// Opens disk `d` itself: a disk file or block device this node has local access to.
fn open_local(d: &DiskDef) -> Result<Arc<dyn Disk>, DiskError> {
    let disk = FileDisk::open(&d.name, &d.path)?;
    if disk.size_bytes() < mako_format::descriptor::RESERVED_BYTES {
        return Err(DiskError::Open {
            disk: d.name.clone(),
            path: d.path.display().to_string(),
            source: std::io::Error::other(format!(
                "the file is truncated: {} bytes, smaller than a disk header",
                disk.size_bytes()
            )),
        });
    }
    Ok(Arc::new(disk))
}

/// Reads the cluster key of the node whose data directory is `dir`.
pub fn read_key(dir: &DataDir, cluster_name: &str) -> Result<ClusterKey> {
    let path = dir.key_file();
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => bail!(
            "no cluster key at {}: this node cannot join cluster {cluster_name}. Copy \
             cluster.key from another node's data directory (keep it mode 0600), then start \
             makod again",
            path.display()
        ),
        Err(e) => bail!("cannot read the cluster key {}: {e}", path.display()),
    };
    ClusterKey::from_hex(&text).map_err(|e| {
        anyhow::anyhow!(
            "the cluster key {} is not valid ({e}); copy cluster.key from another node's \
             data directory",
            path.display()
        )
    })
}

impl NetNode {
    /// Starts the node's transport if cluster.toml lists several nodes (`None` for a
    /// makod that is the whole cluster).
    pub fn start(
        dir: &DataDir,
        cluster: &ClusterConfig,
        config: &EffectiveConfig,
    ) -> Result<Option<NetNode>> {
        if cluster.nodes.is_empty() {
            return Ok(None);
        }
        let me = cluster
            .node(cluster.node_id)
            .with_context(|| {
                format!(
                    "node_id {} is not among the nodes of {}",
                    cluster.node_id,
                    dir.cluster_file().display()
                )
            })?
            .clone();
        if !same_dir(&me.data_dir, &dir.root) {
            bail!(
                "{} describes node {} ({}), whose data directory is {}, not this one: this \
                 is the cluster's overview directory (`mako up --nodes`) or a copy. Each node \
                 runs from its own data directory: `makod --data-dir {}`",
                dir.cluster_file().display(),
                me.id,
                me.name,
                me.data_dir.display(),
                me.data_dir.display()
            );
        }
        let managers: Vec<NodeDef> = cluster.manager_nodes().into_iter().cloned().collect();
        let manager = managers
            .first()
            .context("no node of cluster.toml is the manager")?
            .clone();
        let key = read_key(dir, &cluster.cluster_name)?;
        let listen: SocketAddr = me.address.parse().with_context(|| {
            format!("node {}: address {:?} is not IP:port", me.name, me.address)
        })?;
        let mut rpc = RpcConfig::from_effective(NodeId(me.id), listen.ip(), key, config);
        rpc.listen = listen;
        for n in &cluster.nodes {
            let addr: SocketAddr = n.address.parse().with_context(|| {
                format!("node {}: address {:?} is not IP:port", n.name, n.address)
            })?;
            rpc.peers.insert(NodeId(n.id), addr);
        }
        let registry = Registry::new();
        let nsd = Self::serve_disks(cluster, &me, &registry, config)?;
        let token_manager = me.manager.then(|| {
            let manager = Arc::new(TokenManager::new(TokenManagerLimits {
                tokens_max: 10_000_000,
                ..TokenManagerLimits::default()
            }));
            registry.register(
                NodeId(me.id),
                ServiceId::TokenManager,
                Arc::new(ManagerService {
                    manager: manager.clone(),
                }),
            );
            manager
        });
        let transport = Arc::new(
            TcpTransport::start(rpc, registry.clone())
                .with_context(|| format!("node {} ({}): starting the network", me.id, me.name))?,
        );
        if let Some(manager) = &token_manager {
            // Queued requesters are told when their turn comes (`ClientRequest::Turn`).
            let weak: std::sync::Weak<dyn Transport> = {
                let t: Arc<dyn Transport> = transport.clone();
                Arc::downgrade(&t)
            };
            manager.notify_through(weak);
        }
        tracing::info!(
            "node {} ({}) of cluster {} listening on {}; file-system manager: node {} ({}) \
             at {}; token manager shards: {}",
            me.id,
            me.name,
            cluster.cluster_name,
            transport.local_addr(),
            manager.id,
            manager.name,
            manager.address,
            managers
                .iter()
                .map(|n| n.name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        );
        Ok(Some(NetNode {
            me,
            manager,
            managers,
            cluster_name: cluster.cluster_name.clone(),
            transport,
            registry,
            nsd,
            token_manager,
        }))
    }

    /// Opens the disks this node is an NSD server of and registers their `NsdServer`
    /// (before the node listens, so a client never finds it without its service).
    fn serve_disks(
        cluster: &ClusterConfig,
        me: &NodeDef,
        registry: &Arc<Registry>,
        config: &EffectiveConfig,
    ) -> Result<Option<Arc<NsdServer>>> {
        let served: Vec<&DiskDef> = cluster
            .disks
            .iter()
            .filter(|d| d.servers.contains(&me.name))
            .collect();
        if served.is_empty() {
            return Ok(None);
        }
        let mut disks = Vec::with_capacity(served.len());
        for d in &served {
            let disk = open_local(d).with_context(|| {
                format!(
                    "node {} is an NSD server of disk {} but cannot open it; fix the path or \
                     the disk's server list in cluster.toml",
                    me.name, d.name
                )
            })?;
            disks.push(disk);
        }
        let server = NsdServer::new(
            Arc::new(LocalNsd::new(disks, config.iohist_size())),
            mako_nsd::server::MAX_IO_BYTES_DEFAULT,
        )
        .context("starting the NSD service")?;
        let server = Arc::new(server);
        registry.register(NodeId(me.id), ServiceId::Nsd, server.clone());
        tracing::info!(
            "node {} serves disks {} (NSD server)",
            me.name,
            server.disks().join(", ")
        );
        Ok(Some(server))
    }

    /// The disks of a file system as this node reaches them, in `names`' order: opened
    /// directly where it has local access, through the disks' NSD servers elsewhere.
    pub fn open_disks(
        &self,
        cluster: &ClusterConfig,
        names: &[String],
    ) -> Result<(Vec<Arc<dyn Disk>>, DiskAccessList)> {
        let transport: Arc<dyn Transport> = self.transport.clone();
        let mut disks = Vec::with_capacity(names.len());
        let mut access = Vec::with_capacity(names.len());
        for name in names {
            let d = cluster
                .disk(name)
                .with_context(|| format!("disk {name} is not in cluster.toml"))?;
            let servers: Vec<NodeId> = d
                .servers
                .iter()
                .filter_map(|s| cluster.nodes.iter().find(|n| &n.name == s))
                .map(|n| NodeId(n.id))
                .collect();
            let local = if self.me.has_local(name) {
                open_local(d)
            } else {
                if servers.is_empty() {
                    bail!(
                        "disk {name}: node {} has no local access to it (local_disks in \
                         cluster.toml) and the disk has no NSD servers; list servers for the \
                         disk or give the node access",
                        self.me.name
                    );
                }
                Err(DiskError::Open {
                    disk: name.clone(),
                    path: d.path.display().to_string(),
                    source: std::io::Error::other("this node has no local access to it"),
                })
            };
            let route = DiskRoute::choose(name, local, &servers, NodeId(self.me.id))
                .with_context(|| format!("disk {name}"))?;
            let disk = match route {
                DiskRoute::Local(d) => {
                    access.push((name.clone(), DiskAccess::Local));
                    d
                }
                DiskRoute::Servers { name: n, servers } => {
                    let remote = Arc::new(
                        self.connect_remote(&n, servers, &transport)
                            .with_context(|| format!("disk {name}: reaching its NSD servers"))?,
                    );
                    access.push((name.clone(), DiskAccess::Remote(remote.clone())));
                    remote as Arc<dyn Disk>
                }
            };
            tracing::info!(
                "disk {name}: {}",
                access
                    .last()
                    .map(|(_, a)| a.describe(&|id| self.node_name(cluster, id)))
                    .unwrap_or_default()
            );
            disks.push(disk);
        }
        Ok((disks, access))
    }

    /// Connects to disk `name` through `servers`, waiting (up to the manager wait) while
    /// none of them answers yet: the servers may start after this node.
    fn connect_remote(
        &self,
        name: &str,
        servers: Vec<NodeId>,
        transport: &Arc<dyn Transport>,
    ) -> Result<RemoteDisk> {
        let limit = manager_wait();
        let started = Instant::now();
        let mut logged = false;
        loop {
            match RemoteDisk::connect(
                name,
                servers.clone(),
                transport.clone(),
                RemoteOptions::default(),
            ) {
                Ok(d) => return Ok(d),
                Err(e @ DiskError::NoServer { .. }) if started.elapsed() < limit => {
                    if !logged {
                        tracing::info!("disk {name}: waiting for its NSD servers: {e}");
                        logged = true;
                    }
                    std::thread::sleep(Duration::from_millis(200));
                }
                Err(e) => return Err(e.into()),
            }
        }
    }

    fn node_name(&self, cluster: &ClusterConfig, id: NodeId) -> String {
        cluster
            .node(id.0)
            .map_or_else(|| id.to_string(), |n| n.name.clone())
    }

    /// The manager nodes of cluster.toml, slot by slot.
    pub fn manager_ids(&self) -> Vec<NodeId> {
        self.managers.iter().map(|n| NodeId(n.id)).collect()
    }

    /// The environment `mount_node` mounts this node's file system with, routing
    /// token requests by `managers` (`crate::shards::token_routing`).
    pub fn env(&self, fs_index: u32, managers: ManagerMap) -> NodeEnv {
        NodeEnv {
            node: self.me.id,
            fs_index,
            clock: Arc::new(SystemClock::new()),
            transport: self.transport.clone(),
            managers,
            fs_manager: NodeId(self.manager.id),
            registry: Some(self.registry.clone()),
        }
    }

    /// Waits until the token service of every manager node that serves a slot of
    /// `routing` answers (this node's own at once): a mount takes tokens from every
    /// shard. A refusal (another cluster key) ends the wait at once.
    pub fn wait_for_manager(&self, routing: &ManagerMap) -> Result<()> {
        for manager in &self.managers {
            if manager.id != self.me.id && routing.nodes.contains(&NodeId(manager.id)) {
                self.wait_for_one_manager(manager)?;
            }
        }
        Ok(())
    }

    fn wait_for_one_manager(&self, manager: &NodeDef) -> Result<()> {
        let limit = manager_wait();
        let started = Instant::now();
        let mut logged = false;
        loop {
            let request = mako_rt::encode("token manager probe", &ManagerRequest::Stats)
                .context("encoding a probe")?;
            let r = self.transport.call(
                NodeId(manager.id),
                ServiceId::TokenManager,
                request,
                CallOptions {
                    deadline: PROBE_DEADLINE,
                    ..CallOptions::default()
                },
            );
            let why = match r {
                Ok(reply) => match mako_rt::decode::<ManagerReply>("probe reply", &reply) {
                    Ok(ManagerReply::Stats(_)) => {
                        tracing::info!(
                            "the manager, node {} ({}), answers after {:.1} s",
                            manager.id,
                            manager.name,
                            started.elapsed().as_secs_f64()
                        );
                        return Ok(());
                    }
                    Ok(other) => format!("it answered {other:?}"),
                    Err(e) => e.to_string(),
                },
                // Refused by the fence of expelled nodes: this node rejoined, and that
                // manager has not applied the rejoin yet (or it will be recovered
                // first). Wait, as for a manager not started yet.
                Err(e) if mako_rt::is_refusal(&e.to_string()) => e.to_string(),
                Err(e) => {
                    let text = e.to_string();
                    if text.contains("was removed from the cluster") {
                        bail!(
                            "node {} ({}) cannot join cluster {}: {text}",
                            self.me.id,
                            self.me.name,
                            self.cluster_name
                        );
                    }
                    // The transport's own words for a failed handshake: no point in
                    // waiting, the other side will never accept this node's key.
                    if text.contains("cluster key")
                        || text.contains("refused the connection")
                        || text.contains("refused this node")
                    {
                        bail!(
                            "node {} ({}) cannot join cluster {}: {text}. Its cluster key ({}) \
                             is not the cluster's; copy cluster.key from another node's data \
                             directory",
                            self.me.id,
                            self.me.name,
                            self.cluster_name,
                            self.me.data_dir.join("cluster.key").display()
                        );
                    }
                    text
                }
            };
            if started.elapsed() >= limit {
                bail!(
                    "the manager, node {} ({}) at {}, did not answer within {} s ({why}); start \
                     its makod first (`mako startup -N {}`; `mako startup -a` starts every \
                     node, the manager nodes first), then this node again (`mako startup -N {}`)",
                    manager.id,
                    manager.name,
                    manager.address,
                    limit.as_secs(),
                    manager.name,
                    self.me.name
                );
            }
            if !logged {
                tracing::info!(
                    "waiting for the manager, node {} ({}) at {}: {why}",
                    manager.id,
                    manager.name,
                    manager.address
                );
                logged = true;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Closes every connection (after the file systems are written back).
    pub fn shutdown(&self) {
        if let Some(nsd) = &self.nsd {
            tracing::info!(
                "NSD service of node {}: {} requests served, {} refused",
                self.me.name,
                nsd.served(),
                nsd.refused()
            );
        }
        self.transport.shutdown();
    }
}
