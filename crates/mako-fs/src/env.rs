//! How one node of a file system reaches the world (docs/coherence.md section 1): its
//! identity, its clock, and the cluster's services through a transport. A single-node
//! `makod` builds one with `NodeEnv::single_node`; several nodes in one process (the
//! simulation, the two-mount test) share a registry; the network transport comes next.

use mako_rt::{Clock, InProcessTransport, NodeId, Registry, ServiceId, SystemClock, Transport};
use mako_token::{ManagerMap, ManagerService, TokenManager, TokenManagerLimits};
use std::sync::Arc;

#[derive(Clone)]
pub struct NodeEnv {
    /// This node; also the index of its recovery log in the file system.
    pub node: u32,
    /// The file system's number in the cluster (token resources are per file system).
    pub fs_index: u32,
    pub clock: Arc<dyn Clock>,
    pub transport: Arc<dyn Transport>,
    /// Where the token manager shards live.
    pub managers: ManagerMap,
    /// The node running the file-system manager (allocation regions, inode-map
    /// segments). It also keeps the descriptor.
    pub fs_manager: NodeId,
    /// Where this node's own services go (`mount` registers them).
    pub registry: Option<Arc<Registry>>,
}

impl NodeEnv {
    /// One node that is its own token manager and file-system manager, reached through
    /// the in-process transport: the same code paths as a cluster.
    pub fn single_node(node: u32) -> NodeEnv {
        let registry = Registry::new();
        let manager = Arc::new(TokenManager::new(TokenManagerLimits {
            tokens_max: 10_000_000,
            ..TokenManagerLimits::default()
        }));
        let transport: Arc<dyn Transport> =
            Arc::new(InProcessTransport::new(NodeId(node), registry.clone()));
        manager.notify_through(Arc::downgrade(&transport));
        registry.register(
            NodeId(node),
            ServiceId::TokenManager,
            Arc::new(ManagerService { manager }),
        );
        NodeEnv {
            node,
            fs_index: 0,
            clock: Arc::new(SystemClock::new()),
            transport,
            managers: ManagerMap::single(NodeId(node)),
            fs_manager: NodeId(node),
            registry: Some(registry),
        }
    }

    /// Nodes `0..n` of one cluster in this process (the two-mount test, `makod
    /// --local-nodes`): one registry, the token manager and the file-system manager on
    /// node 0, each node reaching them and the others through the in-process transport.
    /// The network transport of the next issue replaces exactly this.
    pub fn in_process_cluster(n: u32) -> Vec<NodeEnv> {
        Self::in_process_nodes(&(0..n).collect::<Vec<_>>())
    }

    /// Nodes `nodes` of one cluster in this process, as `in_process_cluster`, with the
    /// token manager and the file-system manager on node 0 whether or not node 0 is
    /// one of them. The manager tells queued requests their turn through node 0's
    /// transport when node 0 is one of them; otherwise its waiters find their turn by
    /// their safety poll.
    pub fn in_process_nodes(nodes: &[u32]) -> Vec<NodeEnv> {
        let registry = Registry::new();
        let manager = Arc::new(TokenManager::new(TokenManagerLimits {
            tokens_max: 10_000_000,
            ..TokenManagerLimits::default()
        }));
        registry.register(
            NodeId(0),
            ServiceId::TokenManager,
            Arc::new(ManagerService {
                manager: manager.clone(),
            }),
        );
        let transports: Vec<Arc<dyn Transport>> = nodes
            .iter()
            .map(|&node| {
                Arc::new(InProcessTransport::new(NodeId(node), registry.clone()))
                    as Arc<dyn Transport>
            })
            .collect();
        // Node 0's transport lives as long as node 0's environment.
        if let Some(i) = nodes.iter().position(|&n| n == 0) {
            manager.notify_through(Arc::downgrade(&transports[i]));
        }
        nodes
            .iter()
            .zip(transports)
            .map(|(&node, transport)| NodeEnv {
                node,
                fs_index: 0,
                clock: Arc::new(SystemClock::new()),
                transport,
                managers: ManagerMap::single(NodeId(0)),
                fs_manager: NodeId(0),
                registry: Some(registry.clone()),
            })
            .collect()
    }

    pub fn node_id(&self) -> NodeId {
        NodeId(self.node)
    }

    /// True if this node runs the file-system manager.
    pub fn is_fs_manager(&self) -> bool {
        self.fs_manager == self.node_id()
    }
}
