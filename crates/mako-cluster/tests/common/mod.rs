//! Test clusters of quorum members in one process: each node has its own data
//! directory (one temp dir for the cluster, removed on drop) and runs over the
//! in-process transport; a stopped node's service is gone, as a dead daemon's is.
#![allow(dead_code)]

use mako_cluster::{
    ClusterConfig, Command, DiskEntry, FsEntry, Member, NodeEntry, Quorum, QuorumOptions, Role,
};
use mako_rt::{
    CallOptions, InProcessTransport, NodeId, Priority, Registry, ServiceId, Transport,
    TransportError,
};
use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Latencies the nodes' calls take (a network slower than the in-process one, which
/// answers at once and never times out): each call waits its latency first, and a
/// call whose deadline is shorter fails with `TransportError::Timeout` at its
/// deadline, undelivered. Changed while the cluster runs.
#[derive(Default)]
pub struct Latency {
    /// Every call (raft's messages, probes, forwards).
    pub every: parking_lot::Mutex<Duration>,
    /// On top, for calls on the bulk lane (forwarded changes and reads).
    pub bulk: parking_lot::Mutex<Duration>,
}

/// The in-process transport behind [`Latency`].
struct SlowTransport {
    inner: InProcessTransport,
    latency: Arc<Latency>,
}

impl Transport for SlowTransport {
    fn local_node(&self) -> NodeId {
        self.inner.local_node()
    }

    fn call(
        &self,
        to: NodeId,
        service: ServiceId,
        request: Vec<u8>,
        options: CallOptions,
    ) -> Result<Vec<u8>, TransportError> {
        let mut wait = *self.latency.every.lock();
        if matches!(options.priority, Priority::Bulk) {
            wait += *self.latency.bulk.lock();
        }
        if wait > options.deadline {
            std::thread::sleep(options.deadline);
            return Err(TransportError::Timeout {
                node: to,
                service,
                deadline: options.deadline,
            });
        }
        std::thread::sleep(wait);
        self.inner.call(to, service, request, options)
    }
}

/// How long anything that should happen may take before the test fails (a bound, not
/// a measurement: no test asserts on elapsed time).
pub const PATIENCE: Duration = Duration::from_secs(60);

/// Quick elections, so a test that stops a leader does not wait long for the next.
pub fn fast_options() -> QuorumOptions {
    QuorumOptions {
        heartbeat_interval: Duration::from_millis(100),
        election_timeout: (Duration::from_millis(600), Duration::from_millis(1200)),
        deadline: PATIENCE,
        probe_deadline: Duration::from_secs(2),
        ..QuorumOptions::default()
    }
}

pub fn member(id: u32) -> Member {
    Member {
        name: name(id),
        address: address(id).to_string(),
    }
}

pub fn name(id: u32) -> String {
    format!("n{id}")
}

pub fn address(id: u32) -> SocketAddr {
    SocketAddr::from(([10, 0, 0, id as u8], 1191))
}

pub fn node_entry(id: u32, roles: &[Role]) -> NodeEntry {
    NodeEntry {
        id: NodeId(id),
        name: name(id),
        addresses: vec![address(id)],
        roles: roles.iter().copied().collect(),
    }
}

pub fn disk(name: &str, servers: &[u32]) -> DiskEntry {
    DiskEntry {
        name: name.into(),
        size_bytes: 1 << 30,
        servers: servers.iter().map(|s| NodeId(*s)).collect(),
        failure_group: 1,
        pool: "system".into(),
    }
}

pub fn fs(name: &str, disks: &[&str]) -> Command {
    Command::CreateFs(FsEntry {
        name: name.into(),
        disks: disks.iter().map(|d| d.to_string()).collect(),
        mount_options: vec![],
    })
}

pub fn create(name: &str) -> Command {
    Command::CreateCluster {
        name: name.into(),
        uuid: [9; 16],
    }
}

/// Nodes 1..=n of one process.
pub struct Cluster {
    pub dir: tempfile::TempDir,
    pub registry: Arc<Registry>,
    pub options: QuorumOptions,
    pub nodes: BTreeMap<u32, Quorum>,
    /// Every node's calls take this long (none unless a test sets it).
    pub latency: Arc<Latency>,
}

impl Cluster {
    /// Starts nodes `ids` (not bootstrapped).
    pub fn start(ids: &[u32], options: QuorumOptions) -> Cluster {
        let dir = tempfile::Builder::new()
            .prefix("mako-cluster-test-")
            .tempdir()
            .expect("temp dir");
        let mut cluster = Cluster {
            dir,
            registry: Registry::new(),
            options,
            nodes: BTreeMap::new(),
            latency: Arc::default(),
        };
        for id in ids {
            cluster.start_node(*id);
        }
        cluster
    }

    pub fn data_dir(&self, id: u32) -> PathBuf {
        self.dir.path().join(format!("node{id}"))
    }

    /// Starts (or restarts, on its existing store) node `id`.
    pub fn start_node(&mut self, id: u32) {
        let transport = Arc::new(SlowTransport {
            inner: InProcessTransport::new(NodeId(id), self.registry.clone()),
            latency: self.latency.clone(),
        });
        let q = Quorum::start(
            NodeId(id),
            &self.data_dir(id),
            transport,
            self.registry.clone(),
            self.options.clone(),
        )
        .expect("start quorum member");
        self.nodes.insert(id, q);
    }

    /// Stops node `id` (its store stays).
    pub fn stop_node(&mut self, id: u32) {
        let q = self.nodes.remove(&id).expect("running node");
        q.shutdown();
    }

    pub fn node(&self, id: u32) -> &Quorum {
        &self.nodes[&id]
    }

    /// Bootstraps the voters `voters` from the first of them, and waits for a leader.
    pub fn bootstrap(&self, voters: &[u32]) -> u32 {
        let members: BTreeMap<NodeId, Member> =
            voters.iter().map(|i| (NodeId(*i), member(*i))).collect();
        self.node(voters[0]).bootstrap(&members).expect("bootstrap");
        self.leader()
    }

    /// The leader every running member agrees on, waiting up to `PATIENCE`.
    pub fn leader(&self) -> u32 {
        self.leader_other_than(None)
    }

    /// A leader every running node agrees on that is not `old`.
    pub fn leader_other_than(&self, old: Option<u32>) -> u32 {
        let end = Instant::now() + PATIENCE;
        loop {
            // Nodes not yet part of the cluster (no voters known) have no say.
            let views: BTreeSet<Option<u32>> = self
                .nodes
                .values()
                .filter(|q| !q.status().voters.is_empty())
                .map(|q| q.leader().map(|(n, _)| n.0))
                .collect();
            if views.len() == 1 {
                if let Some(Some(leader)) = views.into_iter().next() {
                    if Some(leader) != old && self.nodes.contains_key(&leader) {
                        let status = self.node(leader).status();
                        if status.state == "leader" {
                            return leader;
                        }
                    }
                }
            }
            assert!(
                Instant::now() < end,
                "no agreed leader within {PATIENCE:?}: {:?}",
                self.nodes.values().map(|q| q.status()).collect::<Vec<_>>()
            );
            // Polling raft's state between checks (not a synchronisation by sleep: the
            // loop ends on the condition or the deadline).
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Any running node that is not `leader`.
    pub fn follower(&self, leader: u32) -> u32 {
        *self
            .nodes
            .keys()
            .find(|id| **id != leader)
            .expect("a follower")
    }

    /// Creates a cluster "c1" with `quorum` as quorum nodes in the configuration.
    pub fn create(&self, quorum: &[u32]) -> u64 {
        let any = *self.nodes.keys().next().unwrap();
        let mut epoch = self
            .node(any)
            .propose(create("c1"))
            .expect("create cluster");
        for id in quorum {
            epoch = self
                .node(any)
                .propose(Command::AddNode(node_entry(
                    *id,
                    &[Role::Quorum, Role::Manager],
                )))
                .expect("add quorum node");
        }
        epoch
    }

    /// Waits until every running node has applied `epoch`, and returns their configs.
    pub fn converge(&self, epoch: u64) -> Vec<ClusterConfig> {
        self.nodes
            .values()
            .map(|q| q.wait_epoch(epoch, PATIENCE).expect("node catches up"))
            .collect()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        // Stop every member before the temp dir goes.
        for (_, q) in std::mem::take(&mut self.nodes) {
            q.shutdown();
        }
    }
}
