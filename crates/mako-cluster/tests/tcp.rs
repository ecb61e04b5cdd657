//! Three quorum nodes over mako-rpc's TCP transport on 127.0.0.1 (ephemeral ports,
//! one cluster key): the raft messages, forwarding and quorum probes go through real
//! sockets, authentication and framing.

mod common;

use common::{create, disk, fast_options, fs, member, node_entry, PATIENCE};
use mako_cluster::{Command, Member, Quorum, QuorumError, Role};
use mako_rpc::{ClusterKey, RpcConfig, TcpTransport};
use mako_rt::{NodeId, Registry};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

struct TcpNode {
    quorum: Quorum,
    transport: Arc<TcpTransport>,
}

impl TcpNode {
    fn stop(self) {
        self.quorum.shutdown();
        self.transport.shutdown();
    }
}

/// Starts node `id` with its own registry and transport, on an ephemeral port.
fn start(id: u32, key: &ClusterKey, dir: &std::path::Path) -> TcpNode {
    let registry = Registry::new();
    let config = RpcConfig::new(NodeId(id), "127.0.0.1:0".parse().unwrap(), key.clone());
    let transport = Arc::new(TcpTransport::start(config, registry.clone()).expect("transport"));
    let quorum = Quorum::start(
        NodeId(id),
        &dir.join(format!("node{id}")),
        transport.clone(),
        registry,
        fast_options(),
    )
    .expect("quorum member");
    TcpNode { quorum, transport }
}

fn introduce(nodes: &BTreeMap<u32, TcpNode>) {
    for (a, na) in nodes {
        for (b, nb) in nodes {
            if a != b {
                na.transport.set_peer(NodeId(*b), nb.transport.local_addr());
            }
        }
    }
}

/// The leader all running nodes agree on, other than `old`.
fn agreed_leader(nodes: &BTreeMap<u32, TcpNode>, old: Option<u32>) -> u32 {
    let end = Instant::now() + PATIENCE;
    loop {
        let views: Vec<Option<u32>> = nodes
            .values()
            .map(|n| n.quorum.leader().map(|(id, _)| id.0))
            .collect();
        if let Some(Some(l)) = views.first() {
            if views.iter().all(|v| *v == Some(*l))
                && Some(*l) != old
                && nodes[l].quorum.status().state == "leader"
            {
                return *l;
            }
        }
        assert!(Instant::now() < end, "no agreed leader: {views:?}");
        // Polling raft's state until the condition or the deadline.
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn three_quorum_nodes_over_tcp() {
    let dir = tempfile::Builder::new()
        .prefix("mako-cluster-tcp-")
        .tempdir()
        .unwrap();
    let key = ClusterKey::random();
    let mut nodes: BTreeMap<u32, TcpNode> =
        (1..=3).map(|i| (i, start(i, &key, dir.path()))).collect();
    introduce(&nodes);
    let members: BTreeMap<NodeId, Member> = (1..=3).map(|i| (NodeId(i), member(i))).collect();
    nodes[&1].quorum.bootstrap(&members).unwrap();
    let leader = agreed_leader(&nodes, None);
    let follower = *nodes.keys().find(|n| **n != leader).unwrap();

    // Changes proposed on a follower are forwarded over TCP to the cluster manager.
    let q = &nodes[&follower].quorum;
    q.propose(create("c1")).unwrap();
    for i in 1..=3 {
        q.propose(Command::AddNode(node_entry(i, &[Role::Quorum])))
            .unwrap();
    }
    let epoch = q.propose(Command::AddDisk(disk("d1", &[1, 2]))).unwrap();
    assert_eq!(epoch, 5);
    for n in nodes.values() {
        n.quorum.wait_epoch(epoch, PATIENCE).unwrap();
    }
    // Every node answers for itself over TCP and names the same cluster manager.
    let states = nodes[&follower].quorum.node_states();
    assert_eq!(states.len(), 3, "{states:?}");
    for (node, state) in &states {
        let state = state.as_ref().unwrap_or_else(|e| panic!("{node}: {e}"));
        assert_eq!(state.leader, Some(NodeId(leader)), "{states:?}");
        assert_eq!(state.voters.len(), 3, "{states:?}");
    }

    // The leader stops: a new one is elected and the configuration is intact.
    nodes.remove(&leader).unwrap().stop();
    let new = agreed_leader(&nodes, Some(leader));
    let config = nodes[&new].quorum.read_config().unwrap();
    assert_eq!(config.epoch, epoch);
    assert!(config.disks.contains_key("d1"));
    let survivor = *nodes.keys().find(|n| **n != new).unwrap();
    let epoch = nodes[&survivor].quorum.propose(fs("fs1", &["d1"])).unwrap();

    // Two of three down: refused with "quorum lost" within the deadline.
    nodes.remove(&new).unwrap().stop();
    let e = nodes[&survivor]
        .quorum
        .propose_within(
            Command::AddDisk(disk("d2", &[survivor])),
            Duration::from_secs(20),
        )
        .unwrap_err();
    assert!(matches!(e, QuorumError::QuorumLost { .. }), "{e}");
    // Each silent node comes with why: its connection is refused.
    for n in [leader, new] {
        assert!(
            e.to_string()
                .contains(&format!("node {n} (n{n}) (unreachable: cannot connect")),
            "{e}"
        );
    }
    assert!(
        e.to_string()
            .starts_with("quorum lost: 1 of 3 quorum nodes answer"),
        "{e}"
    );

    // One comes back (on a new port, as a restarted daemon may): the quorum works again.
    let back = start(leader, &key, dir.path());
    nodes.insert(leader, back);
    introduce(&nodes);
    let epoch2 = nodes[&survivor]
        .quorum
        .propose(Command::AddDisk(disk("d2", &[survivor])))
        .unwrap();
    assert_eq!(epoch2, epoch + 1);
    let config = nodes[&leader].quorum.wait_epoch(epoch2, PATIENCE).unwrap();
    assert!(config.file_systems.contains_key("fs1") && config.disks.contains_key("d2"));

    for (_, n) in std::mem::take(&mut nodes) {
        n.stop();
    }
}
