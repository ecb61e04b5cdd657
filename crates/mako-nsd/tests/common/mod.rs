//! Test nodes over real TCP on 127.0.0.1 (mako-rpc's `TcpTransport`), NSD servers on
//! them, and disk files in a temporary directory.
#![allow(dead_code)]

use mako_disk::{Disk, FileDisk, LocalNsd, Nsd};
use mako_nsd::NsdServer;
use mako_rpc::{ClusterKey, RpcConfig, TcpTransport};
use mako_rt::{NodeId, Registry, ServiceId, Transport};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long anything that should happen may take before the test fails (a bound, not
/// a measurement: no test asserts on elapsed time).
pub const PATIENCE: Duration = Duration::from_secs(30);

pub struct Node {
    pub id: NodeId,
    pub registry: Arc<Registry>,
    pub transport: Arc<TcpTransport>,
}

impl Node {
    pub fn start(id: u32, key: &ClusterKey, tweak: impl FnOnce(&mut RpcConfig)) -> Node {
        let mut config = RpcConfig::new(NodeId(id), "127.0.0.1:0".parse().unwrap(), key.clone());
        tweak(&mut config);
        let registry = Registry::new();
        let transport = Arc::new(TcpTransport::start(config, registry.clone()).expect("start"));
        Node {
            id: NodeId(id),
            registry,
            transport,
        }
    }

    pub fn dyn_transport(&self) -> Arc<dyn Transport> {
        self.transport.clone()
    }

    /// Serves `nsd`'s disks from this node; returns the server (for its counters).
    pub fn serve(&self, nsd: Arc<dyn Nsd>) -> Arc<NsdServer> {
        let server =
            Arc::new(NsdServer::new(nsd, mako_nsd::server::MAX_IO_BYTES_DEFAULT).expect("serve"));
        self.registry
            .register(self.id, ServiceId::Nsd, server.clone());
        server
    }
}

/// `n` nodes (ids 1..=n) sharing a key, each knowing every other's address.
pub fn cluster(n: u32) -> Vec<Node> {
    cluster_with(n, |_| {})
}

/// `cluster` with each node's transport configuration changed by `tweak`.
pub fn cluster_with(n: u32, tweak: impl Fn(&mut RpcConfig)) -> Vec<Node> {
    let key = ClusterKey::random();
    let nodes: Vec<Node> = (1..=n).map(|i| Node::start(i, &key, &tweak)).collect();
    for a in &nodes {
        for b in &nodes {
            if a.id != b.id {
                a.transport.set_peer(b.id, b.transport.local_addr());
            }
        }
    }
    nodes
}

/// Disk files `d0..dn` of `bytes` each in a fresh temporary directory (removed on drop).
pub struct DiskFiles {
    pub dir: tempfile::TempDir,
    pub names: Vec<String>,
}

impl DiskFiles {
    pub fn new(n: usize, bytes: u64) -> DiskFiles {
        let dir = tempfile::tempdir().expect("tempdir");
        let names: Vec<String> = (0..n).map(|i| format!("d{i}")).collect();
        for name in &names {
            FileDisk::create(name, &dir.path().join(format!("{name}.img")), bytes).expect("create");
        }
        DiskFiles { dir, names }
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(format!("{name}.img"))
    }

    /// The disks opened afresh (a new handle each time: what another node with local
    /// access to the same files sees).
    pub fn open(&self) -> Vec<Arc<dyn Disk>> {
        self.names
            .iter()
            .map(|n| Arc::new(FileDisk::open(n, &self.path(n)).expect("open")) as Arc<dyn Disk>)
            .collect()
    }

    pub fn local_nsd(&self) -> Arc<dyn Nsd> {
        Arc::new(LocalNsd::new(self.open(), 64))
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

/// Polls `cond` until it holds or `PATIENCE` runs out (then fails, saying `what`).
pub fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
    let end = Instant::now() + PATIENCE;
    while !cond() {
        assert!(Instant::now() < end, "timed out waiting for: {what}");
        std::thread::sleep(Duration::from_millis(2)); // poll
    }
}

/// Deterministic bytes.
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}
