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
//! Not yet: the manager role sharded over several manager nodes, the manager's
//! takeover when it fails, recovery of a failed node's log and tokens by the others
//! (issue 14), and more than one file system mounted by a node of such a cluster.

use anyhow::{bail, Context, Result};
use mako_config::EffectiveConfig;
use mako_control::{ClusterConfig, DataDir, NodeDef};
use mako_fs::env::NodeEnv;
use mako_rpc::{ClusterKey, RpcConfig, TcpTransport};
use mako_rt::{CallOptions, NodeId, Registry, ServiceId, SystemClock, Transport};
use mako_token::{
    ManagerMap, ManagerReply, ManagerRequest, ManagerService, TokenManager, TokenManagerLimits,
};
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long a node waits for the manager node's token service before it gives up
/// mounting (`MAKO_MANAGER_WAIT_SECS` overrides it, for tests).
const MANAGER_WAIT: Duration = Duration::from_secs(60);
/// How long one probe of the manager may take.
const PROBE_DEADLINE: Duration = Duration::from_secs(2);

/// This node's place in a multi-process cluster.
pub struct NetNode {
    pub me: NodeDef,
    pub manager: NodeDef,
    pub cluster_name: String,
    pub transport: Arc<TcpTransport>,
    pub registry: Arc<Registry>,
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

fn same_dir(a: &Path, b: &Path) -> bool {
    match (a.canonicalize(), b.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => a == b,
    }
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
        let manager = cluster
            .manager_node()
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
        if me.manager {
            let manager = Arc::new(TokenManager::new(TokenManagerLimits {
                tokens_max: 10_000_000,
            }));
            registry.register(
                NodeId(me.id),
                ServiceId::TokenManager,
                Arc::new(ManagerService { manager }),
            );
        }
        let transport = TcpTransport::start(rpc, registry.clone())
            .with_context(|| format!("node {} ({}): starting the network", me.id, me.name))?;
        tracing::info!(
            "node {} ({}) of cluster {} listening on {}; manager: node {} ({}) at {}",
            me.id,
            me.name,
            cluster.cluster_name,
            transport.local_addr(),
            manager.id,
            manager.name,
            manager.address
        );
        Ok(Some(NetNode {
            me,
            manager,
            cluster_name: cluster.cluster_name.clone(),
            transport: Arc::new(transport),
            registry,
        }))
    }

    /// The environment `mount_node` mounts this node's file system with.
    pub fn env(&self, fs_index: u32) -> NodeEnv {
        NodeEnv {
            node: self.me.id,
            fs_index,
            clock: Arc::new(SystemClock::new()),
            transport: self.transport.clone(),
            managers: ManagerMap::single(NodeId(self.manager.id)),
            fs_manager: NodeId(self.manager.id),
            registry: Some(self.registry.clone()),
        }
    }

    /// Waits until the manager node's token service answers (at once on the manager).
    /// A refusal (another cluster key) ends the wait at once.
    pub fn wait_for_manager(&self) -> Result<()> {
        if self.me.manager {
            return Ok(());
        }
        let limit = std::env::var("MAKO_MANAGER_WAIT_SECS")
            .ok()
            .and_then(|s| s.parse::<u64>().ok())
            .map(Duration::from_secs)
            .unwrap_or(MANAGER_WAIT);
        let started = Instant::now();
        let mut logged = false;
        loop {
            let request = mako_rt::encode("token manager probe", &ManagerRequest::Stats)
                .context("encoding a probe")?;
            let r = self.transport.call(
                NodeId(self.manager.id),
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
                            self.manager.id,
                            self.manager.name,
                            started.elapsed().as_secs_f64()
                        );
                        return Ok(());
                    }
                    Ok(other) => format!("it answered {other:?}"),
                    Err(e) => e.to_string(),
                },
                Err(e) => {
                    let text = e.to_string();
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
                     node, the manager first), then this node again (`mako startup -N {}`)",
                    self.manager.id,
                    self.manager.name,
                    self.manager.address,
                    limit.as_secs(),
                    self.manager.name,
                    self.me.name
                );
            }
            if !logged {
                tracing::info!(
                    "waiting for the manager, node {} ({}) at {}: {why}",
                    self.manager.id,
                    self.manager.name,
                    self.manager.address
                );
                logged = true;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Closes every connection (after the file systems are written back).
    pub fn shutdown(&self) {
        self.transport.shutdown();
    }
}
