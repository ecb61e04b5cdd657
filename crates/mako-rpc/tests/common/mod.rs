//! Test nodes on 127.0.0.1 with ephemeral ports, test services, and a raw client that
//! speaks the wire protocol over a blocking socket.
#![allow(dead_code)]

use mako_rpc::auth::{self, Role, Transcript};
use mako_rpc::wire::{self, Auth, Header, Hello, HelloAck, Kind, LaneClass, HEADER_BYTES};
use mako_rpc::{ClusterKey, RpcConfig, TcpTransport};
use mako_rt::{CallOptions, NodeId, Priority, Registry, Service, ServiceId};
use parking_lot::{Condvar, Mutex};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::time::{Duration, Instant};

/// How long anything that should happen may take before the test fails (a bound, not
/// a measurement: tests never assert on elapsed time).
pub const PATIENCE: Duration = Duration::from_secs(30);

pub fn options() -> CallOptions {
    CallOptions {
        priority: Priority::Small,
        deadline: PATIENCE,
    }
}

pub fn bulk() -> CallOptions {
    CallOptions {
        priority: Priority::Bulk,
        deadline: PATIENCE,
    }
}

/// One node: its registry and its transport.
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

    pub fn addr(&self) -> SocketAddr {
        self.transport.local_addr()
    }

    pub fn register(&self, service: ServiceId, handler: Arc<dyn Service>) {
        self.registry.register(self.id, service, handler);
    }
}

/// Makes every node know every other node's address.
pub fn introduce(nodes: &[&Node]) {
    for a in nodes {
        for b in nodes {
            if a.id != b.id {
                a.transport.set_peer(b.id, b.addr());
            }
        }
    }
}

/// `n` nodes (ids 1..=n) with one key, introduced to each other.
pub fn cluster(n: u32, tweak: impl Fn(&mut RpcConfig)) -> (ClusterKey, Vec<Node>) {
    let key = ClusterKey::random();
    let nodes: Vec<Node> = (1..=n).map(|i| Node::start(i, &key, &tweak)).collect();
    introduce(&nodes.iter().collect::<Vec<_>>());
    (key, nodes)
}

/// Polls `cond` until it holds or `PATIENCE` runs out (then fails, saying `what`).
pub fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
    let end = Instant::now() + PATIENCE;
    while !cond() {
        assert!(Instant::now() < end, "timed out waiting for: {what}");
        std::thread::sleep(Duration::from_millis(2)); // poll
    }
}

/// Answers `<node>/<service>/<from>:` followed by the request reversed; counts calls.
pub struct Echo {
    pub tag: String,
    pub calls: AtomicU64,
}

impl Echo {
    pub fn new(tag: &str) -> Arc<Echo> {
        Arc::new(Echo {
            tag: tag.to_string(),
            calls: AtomicU64::new(0),
        })
    }
    pub fn calls(&self) -> u64 {
        self.calls.load(Ordering::SeqCst)
    }
}

pub fn echo_reply(tag: &str, from: NodeId, request: &[u8]) -> Vec<u8> {
    let mut out = format!("{tag}/{}:", from.0).into_bytes();
    out.extend(request.iter().rev());
    out
}

impl Service for Echo {
    fn handle(&self, from: NodeId, request: &[u8]) -> Vec<u8> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        echo_reply(&self.tag, from, request)
    }
}

/// Blocks every request until opened; counts requests that entered.
pub struct Gate {
    open: Mutex<bool>,
    cv: Condvar,
    pub entered: AtomicU64,
}

impl Gate {
    pub fn new() -> Arc<Gate> {
        Arc::new(Gate {
            open: Mutex::new(false),
            cv: Condvar::new(),
            entered: AtomicU64::new(0),
        })
    }
    pub fn open(&self) {
        *self.open.lock() = true;
        self.cv.notify_all();
    }
    pub fn entered(&self) -> u64 {
        self.entered.load(Ordering::SeqCst)
    }
}

impl Service for Gate {
    fn handle(&self, _from: NodeId, request: &[u8]) -> Vec<u8> {
        self.entered.fetch_add(1, Ordering::SeqCst);
        let mut open = self.open.lock();
        let end = Instant::now() + PATIENCE * 2;
        while !*open {
            if self.cv.wait_until(&mut open, end).timed_out() {
                return b"gate never opened".to_vec();
            }
        }
        (request.len() as u64).to_le_bytes().to_vec()
    }
}

/// Calls `target`'s `service` through its own node's transport and returns that
/// reply with a prefix: a handler that calls another node.
pub struct Relay {
    pub transport: OnceLock<Weak<TcpTransport>>,
    pub targets: Vec<(NodeId, ServiceId)>,
}

impl Service for Relay {
    fn handle(&self, _from: NodeId, request: &[u8]) -> Vec<u8> {
        use mako_rt::Transport;
        let t = self
            .transport
            .get()
            .and_then(Weak::upgrade)
            .expect("relay wired");
        let mut out = b"relay".to_vec();
        for &(node, service) in &self.targets {
            match t.call(node, service, request.to_vec(), options()) {
                Ok(r) => {
                    out.push(b'|');
                    out.extend(r);
                }
                Err(e) => out.extend(format!("|error {e}").into_bytes()),
            }
        }
        out
    }
}

// --- A raw client over a blocking socket. ---

pub fn raw_connect(addr: SocketAddr) -> TcpStream {
    let s = TcpStream::connect(addr).expect("raw connect");
    s.set_read_timeout(Some(PATIENCE)).unwrap();
    s
}

pub fn raw_read_frame(s: &mut TcpStream) -> (Header, Vec<u8>) {
    let mut h = [0u8; HEADER_BYTES];
    s.read_exact(&mut h).expect("frame header");
    let h = Header::decode(&h, 1 << 20).expect("valid header");
    let mut body = vec![0u8; h.body_len as usize];
    s.read_exact(&mut body).expect("frame body");
    (h, body)
}

/// Reads until the server closes the connection; fails if it stays open.
pub fn expect_closed(s: &mut TcpStream) {
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return,
            Ok(_) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return,
            Err(e) => panic!("the server did not close the connection: {e}"),
        }
    }
}

pub fn hello(node: u32, min: u16, max: u16) -> Hello {
    Hello {
        node,
        min_version: min,
        max_version: max,
        lane: LaneClass::Small,
        nonce: [7; 32],
    }
}

pub fn control_frame<T: serde::Serialize>(version: u16, kind: Kind, body: &T) -> Vec<u8> {
    let body = wire::encode_body(body);
    wire::frame_bytes(&Header::new(version, kind, body.len()), &body)
}

/// Hello and authentication as node `me` with `key`, by hand, speaking protocol
/// version 1 only (as an older release would: no incarnation, no resent requests):
/// the stream is then a member's connection on which `request_frame`s may be sent.
pub fn raw_authenticate(addr: SocketAddr, key: &ClusterKey, me: u32) -> TcpStream {
    let mut s = raw_connect(addr);
    let hello = hello(me, wire::VERSION_MIN, wire::VERSION_MIN);
    s.write_all(&control_frame(wire::VERSION_MIN, Kind::Hello, &hello))
        .unwrap();
    let (h, body) = raw_read_frame(&mut s);
    assert_eq!(h.kind, Kind::HelloAck);
    let ack: HelloAck = wire::decode_body("ack", &body).unwrap();
    let t = Transcript {
        version: ack.version,
        client_node: me,
        server_node: ack.node,
        lane: hello.lane,
        client_nonce: hello.nonce,
        server_nonce: ack.nonce,
    };
    assert!(auth::verify(key, Role::Server, &t, &ack.proof));
    let proof = auth::proof(key, Role::Client, &t);
    s.write_all(&control_frame(ack.version, Kind::Auth, &Auth { proof }))
        .unwrap();
    let (h, _) = raw_read_frame(&mut s);
    assert_eq!(h.kind, Kind::AuthOk);
    s
}

pub fn request_frame(service: ServiceId, id: u64, body: &[u8]) -> Vec<u8> {
    let mut h = Header::new(wire::VERSION_MIN, Kind::Request, body.len());
    h.service = service as u16;
    h.request_id = id;
    h.deadline_ms = 30_000;
    wire::frame_bytes(&h, body)
}
