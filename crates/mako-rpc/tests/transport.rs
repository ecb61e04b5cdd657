//! `TcpTransport` between nodes in one process on 127.0.0.1: calls, concurrency,
//! deadlines, unreachable nodes, handlers that call other nodes, small-message lanes,
//! idle connections, connect-to-all, calls from async code.

mod common;

use common::*;
use mako_rt::{call, CallOptions, NodeId, Priority, Service, ServiceId, Transport, TransportError};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

#[test]
fn calls_reach_the_right_service_on_the_right_node() {
    let (_key, nodes) = cluster(3, |_| {});
    let mut echoes = Vec::new();
    for n in &nodes {
        for service in [ServiceId::FileSystem, ServiceId::TokenClient] {
            let e = Echo::new(&format!("{}-{service:?}", n.id.0));
            n.register(service, e.clone());
            echoes.push(e);
        }
    }
    let t1 = &nodes[0].transport;
    for (to, service) in [
        (NodeId(2), ServiceId::FileSystem),
        (NodeId(3), ServiceId::TokenClient),
        (NodeId(2), ServiceId::TokenClient),
        (NodeId(1), ServiceId::FileSystem), // its own node: runs in place
    ] {
        let reply = t1.call(to, service, b"abc".to_vec(), options()).unwrap();
        let tag = format!("{}-{service:?}", to.0);
        assert_eq!(reply, echo_reply(&tag, NodeId(1), b"abc"));
    }
    // Every call ran exactly one handler, the one it named.
    let total: u64 = echoes.iter().map(|e| e.calls()).sum();
    assert_eq!(total, 4);
    // A service the node does not offer is a clear NoService, over the network too.
    let e = t1
        .call(NodeId(3), ServiceId::TokenManager, vec![1], options())
        .unwrap_err();
    assert_eq!(
        e,
        TransportError::NoService {
            node: NodeId(3),
            service: ServiceId::TokenManager
        }
    );
    // Typed calls (postcard) work as through the in-process transport.
    nodes[1].register(ServiceId::FsManager, Arc::new(Adder));
    let sum: u64 = call(
        t1.as_ref(),
        NodeId(2),
        ServiceId::FsManager,
        &(40u64, 2u64),
        options(),
    )
    .unwrap();
    assert_eq!(sum, 42);
    // Empty requests and replies are fine.
    let reply = t1
        .call(NodeId(3), ServiceId::FileSystem, Vec::new(), options())
        .unwrap();
    assert_eq!(reply, echo_reply("3-FileSystem", NodeId(1), b""));
}

struct Adder;
impl Service for Adder {
    fn handle(&self, _from: NodeId, request: &[u8]) -> Vec<u8> {
        let (a, b): (u64, u64) = mako_rt::decode("sum", request).unwrap();
        mako_rt::encode("sum", &(a + b)).unwrap()
    }
}

#[test]
fn concurrent_calls_from_many_threads() {
    let (_key, nodes) = cluster(3, |_| {});
    let echo2 = Echo::new("2");
    let echo3 = Echo::new("3");
    nodes[1].register(ServiceId::FileSystem, echo2.clone());
    nodes[2].register(ServiceId::FileSystem, echo3.clone());
    const THREADS: u64 = 8;
    const CALLS: u64 = 150;
    std::thread::scope(|s| {
        for t in 0..THREADS {
            let transport = nodes[0].transport.clone();
            s.spawn(move || {
                for i in 0..CALLS {
                    let to = NodeId(2 + ((t + i) % 2) as u32);
                    // Mostly small requests, now and then one past the small-message
                    // threshold (bulk lane), and bulk-priority ones.
                    let len = match i % 25 {
                        0 => 600 << 10,
                        1 => 70_000,
                        _ => (i * 37 % 3000) as usize,
                    };
                    let request: Vec<u8> =
                        (0..len).map(|b| (b as u64 * 31 + t + i) as u8).collect();
                    let opts = CallOptions {
                        priority: if i % 7 == 0 {
                            Priority::Bulk
                        } else {
                            Priority::Small
                        },
                        ..options()
                    };
                    let reply = transport
                        .call(to, ServiceId::FileSystem, request.clone(), opts)
                        .unwrap();
                    assert_eq!(reply, echo_reply(&to.0.to_string(), NodeId(1), &request));
                }
            });
        }
    });
    assert_eq!(echo2.calls() + echo3.calls(), THREADS * CALLS);
    // The reader counts a reply just after handing it over: poll for the count.
    wait_for("every reply to be counted", || {
        nodes[0].transport.stats().replies_received == THREADS * CALLS
    });
    let stats = nodes[0].transport.stats();
    assert_eq!(stats.requests_sent, THREADS * CALLS);
    assert_eq!(stats.timeouts, 0);
    assert_eq!(stats.late_replies, 0);
    // Both lanes to each node were used and stayed up.
    assert_eq!(nodes[0].transport.open_connections(NodeId(2)), 2);
    assert_eq!(nodes[0].transport.open_connections(NodeId(3)), 2);
}

#[test]
fn a_missed_deadline_is_a_timeout_and_the_late_reply_is_dropped() {
    let (_key, nodes) = cluster(2, |_| {});
    let gate = Gate::new();
    nodes[1].register(ServiceId::TokenClient, gate.clone());
    let echo = Echo::new("2");
    nodes[1].register(ServiceId::FileSystem, echo.clone());
    let t1 = &nodes[0].transport;
    let short = CallOptions {
        priority: Priority::Small,
        deadline: Duration::from_millis(200),
    };
    // The handler waits for the gate, which opens only after the caller gave up.
    let e = t1
        .call(NodeId(2), ServiceId::TokenClient, vec![0; 10], short)
        .unwrap_err();
    assert_eq!(
        e,
        TransportError::Timeout {
            node: NodeId(2),
            service: ServiceId::TokenClient,
            deadline: Duration::from_millis(200)
        }
    );
    assert_eq!(gate.entered(), 1, "the request reached its handler");
    let connects = t1.stats().connects;
    gate.open();
    wait_for("the late reply to arrive and be dropped", || {
        t1.stats().late_replies == 1
    });
    // The connection survived the late reply and serves the next call.
    let reply = t1
        .call(NodeId(2), ServiceId::FileSystem, b"x".to_vec(), options())
        .unwrap();
    assert_eq!(reply, echo_reply("2", NodeId(1), b"x"));
    assert_eq!(t1.stats().connects, connects, "no reconnect was needed");
    assert_eq!(t1.stats().timeouts, 1);
}

/// A call waiting for a node that does not answer (its handler stuck, as a stopped
/// process's would be) gives up at `give_up_on` (the node was expelled) instead of at
/// its deadline, and is not sent again; later calls reach the node as usual.
#[test]
fn calls_waiting_for_an_expelled_node_give_up() {
    let (_key, nodes) = cluster(2, |_| {});
    let gate = Gate::new();
    nodes[1].register(ServiceId::TokenManager, gate.clone());
    let echo = Echo::new("2");
    nodes[1].register(ServiceId::FileSystem, echo.clone());
    let t1 = nodes[0].transport.clone();
    let long = CallOptions {
        priority: Priority::Small,
        deadline: PATIENCE * 10,
    };
    let waiting = {
        let t1 = t1.clone();
        std::thread::spawn(move || t1.call(NodeId(2), ServiceId::TokenManager, vec![0; 10], long))
    };
    wait_for("the request to reach its handler", || gate.entered() == 1);
    t1.give_up_on(NodeId(2));
    // Without the give-up the call waits for the gate, which answers only after
    // PATIENCE * 2 ("gate never opened"): an answer, not an error.
    match waiting.join().expect("the caller") {
        Err(TransportError::Unreachable { node, reason }) => {
            assert_eq!(node, NodeId(2));
            assert!(reason.contains("expelled"), "{reason}");
        }
        other => panic!("the call did not give up at the expel: {other:?}"),
    }
    gate.open();
    assert_eq!(gate.entered(), 1, "the request was not sent again");
    let reply = t1
        .call(NodeId(2), ServiceId::FileSystem, b"x".to_vec(), options())
        .unwrap();
    assert_eq!(reply, echo_reply("2", NodeId(1), b"x"));
}

#[test]
fn an_unreachable_node_is_reported_without_waiting_for_the_deadline() {
    let (_key, nodes) = cluster(1, |_| {});
    // A port that was just free: nothing listens there.
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let t = &nodes[0].transport;
    t.set_peer(NodeId(9), closed);
    let hour = CallOptions {
        priority: Priority::Small,
        deadline: Duration::from_secs(3600),
    };
    for _ in 0..3 {
        match t.call(NodeId(9), ServiceId::FileSystem, vec![1], hour) {
            Err(TransportError::Unreachable { node, reason }) => {
                assert_eq!(node, NodeId(9));
                assert!(reason.contains(&closed.to_string()), "{reason}");
            }
            other => panic!("expected Unreachable, got {other:?}"),
        }
    }
    // A node with no address at all.
    match t.call(NodeId(10), ServiceId::FileSystem, vec![1], hour) {
        Err(TransportError::Unreachable { node, reason }) => {
            assert_eq!(node, NodeId(10));
            assert!(reason.contains("no address"), "{reason}");
        }
        other => panic!("expected Unreachable, got {other:?}"),
    }
    // call_many reports each call's own fate.
    nodes[0].register(ServiceId::FileSystem, Echo::new("1"));
    let results = t.call_many(
        vec![
            (NodeId(9), ServiceId::FileSystem, vec![1]),
            (NodeId(1), ServiceId::FileSystem, vec![2]),
        ],
        hour,
    );
    assert!(matches!(
        results[0],
        Err(TransportError::Unreachable { .. })
    ));
    assert_eq!(
        results[1].as_ref().unwrap(),
        &echo_reply("1", NodeId(1), &[2])
    );
}

#[test]
fn a_handler_may_call_other_nodes_and_back() {
    // Few handler threads, so a design that ran handlers on the I/O threads or
    // waited for a reply on them would deadlock here.
    let (_key, nodes) = cluster(3, |c| {
        c.handler_threads = 2;
        c.small_handler_threads = 2;
        c.io_threads = 1;
    });
    for n in &nodes {
        n.register(ServiceId::FileSystem, Echo::new(&n.id.0.to_string()));
    }
    // Node 2's relay calls node 3 and then back node 1, the caller.
    let relay = Arc::new(Relay {
        transport: OnceLock::new(),
        targets: vec![
            (NodeId(3), ServiceId::FileSystem),
            (NodeId(1), ServiceId::FileSystem),
        ],
    });
    relay
        .transport
        .set(Arc::downgrade(&nodes[1].transport))
        .ok()
        .unwrap();
    nodes[1].register(ServiceId::TokenManager, relay);
    std::thread::scope(|s| {
        for t in 0..4u8 {
            let transport = nodes[0].transport.clone();
            s.spawn(move || {
                for i in 0..25u8 {
                    let request = vec![t, i];
                    let reply = transport
                        .call(
                            NodeId(2),
                            ServiceId::TokenManager,
                            request.clone(),
                            options(),
                        )
                        .unwrap();
                    let mut expected = b"relay|".to_vec();
                    expected.extend(echo_reply("3", NodeId(2), &request));
                    expected.push(b'|');
                    expected.extend(echo_reply("1", NodeId(2), &request));
                    assert_eq!(reply, expected);
                }
            });
        }
    });
}

/// Starts a bulk stream that the server cannot drain: one bulk request holds the only
/// bulk handler (its gate is shut) and another waits behind it, so the bulk side of
/// the connection stands still. Returns once both requests are on their way.
fn stall_bulk<'scope>(nodes: &[Node], gate: &Arc<Gate>, s: &'scope std::thread::Scope<'scope, '_>) {
    let sent = nodes[0].transport.stats().requests_sent;
    for _ in 0..2 {
        let transport = nodes[0].transport.clone();
        s.spawn(move || {
            let reply = transport
                .call(NodeId(2), ServiceId::FsManager, vec![9; 4 << 20], bulk())
                .unwrap();
            assert_eq!(reply, (4u64 << 20).to_le_bytes());
        });
    }
    wait_for("the bulk handler to hold its gate", || gate.entered() == 1);
    wait_for("both bulk requests to be queued", || {
        nodes[0].transport.stats().requests_sent == sent + 2
    });
}

fn stalled_cluster(max_conns: usize, pct: u8) -> (Vec<Node>, Arc<Gate>, Arc<Echo>) {
    let (_key, nodes) = cluster(2, |c| {
        c.max_tcp_conns_per_node_conn = max_conns;
        c.small_msg_tcp_conn_pct = pct;
        c.handler_threads = 1;
        c.small_handler_threads = 2;
    });
    let gate = Gate::new();
    nodes[1].register(ServiceId::FsManager, gate.clone());
    let echo = Echo::new("2");
    nodes[1].register(ServiceId::TokenClient, echo.clone());
    (nodes, gate, echo)
}

#[test]
fn small_calls_pass_a_stalled_bulk_stream() {
    let (nodes, gate, echo) = stalled_cluster(2, 50);
    std::thread::scope(|s| {
        stall_bulk(&nodes, &gate, s);
        // While the bulk side stands still, revokes go through the small lane.
        for i in 0..20u8 {
            let reply = nodes[0]
                .transport
                .call(NodeId(2), ServiceId::TokenClient, vec![i], options())
                .unwrap();
            assert_eq!(reply, echo_reply("2", NodeId(1), &[i]));
        }
        assert_eq!(echo.calls(), 20);
        assert_eq!(gate.entered(), 1, "the bulk stream was still stalled");
        gate.open();
    });
}

/// The control of the test above: with no connection reserved, the same small call
/// queues behind the stalled bulk stream (so the test above tests the lanes).
#[test]
fn without_small_lanes_a_small_call_queues_behind_bulk() {
    let (nodes, gate, echo) = stalled_cluster(1, 0);
    std::thread::scope(|s| {
        stall_bulk(&nodes, &gate, s);
        let short = CallOptions {
            priority: Priority::Small,
            deadline: Duration::from_millis(300),
        };
        let e = nodes[0]
            .transport
            .call(NodeId(2), ServiceId::TokenClient, vec![1], short)
            .unwrap_err();
        assert!(matches!(e, TransportError::Timeout { .. }), "{e}");
        assert_eq!(echo.calls(), 0);
        gate.open();
    });
    // Once the bulk stream drains, the small request is found expired and not run
    // (its caller gave up), or answered late and dropped.
    wait_for("the small request's answer to be dropped", || {
        nodes[0].transport.stats().late_replies == 1
    });
}

#[test]
fn idle_connections_close_and_calls_reconnect() {
    let (_key, nodes) = cluster(2, |c| {
        c.idle_socket_timeout = Some(Duration::from_millis(50));
    });
    nodes[1].register(ServiceId::FileSystem, Echo::new("2"));
    let t1 = &nodes[0].transport;
    for round in 0..2u8 {
        t1.call(NodeId(2), ServiceId::FileSystem, vec![round], options())
            .unwrap();
        wait_for("the idle connection to close", || {
            t1.open_connections(NodeId(2)) == 0
        });
        wait_for("the server to see it close", || {
            nodes[1].transport.inbound_connections() == 0
        });
    }
    // At least one connection per round (a call may also find its connection
    // closing under it and take a new one).
    assert!(t1.stats().connects >= 2);
    assert!(t1.stats().idle_closed >= 2);
}

#[test]
fn all_to_all_connects_at_start() {
    let key = mako_rpc::ClusterKey::random();
    let n2 = Node::start(2, &key, |_| {});
    let n3 = Node::start(3, &key, |_| {});
    let n1 = Node::start(1, &key, |c| {
        c.all_to_all_connection = true;
        c.peers.insert(NodeId(2), n2.addr());
        c.peers.insert(NodeId(3), n3.addr());
    });
    wait_for("connections to every node", || {
        n1.transport.open_connections(NodeId(2)) == 2
            && n1.transport.open_connections(NodeId(3)) == 2
    });
    assert_eq!(n1.transport.stats().requests_sent, 0);
    // Without it, nothing connects before the first call.
    assert_eq!(n2.transport.open_connections(NodeId(3)), 0);
}

#[test]
fn calls_from_async_code_do_not_panic() {
    let (key, nodes) = cluster(2, |_| {});
    nodes[1].register(ServiceId::FileSystem, Echo::new("2"));
    let t = nodes[0].transport.clone();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .build()
        .unwrap();
    let t2 = t.clone();
    let reply = rt
        .block_on(async move {
            tokio::spawn(
                async move { t2.call(NodeId(2), ServiceId::FileSystem, vec![1], options()) },
            )
            .await
        })
        .unwrap()
        .unwrap();
    assert_eq!(reply, echo_reply("2", NodeId(1), &[1]));
    let current = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let reply = current
        .block_on(async { t.call(NodeId(2), ServiceId::FileSystem, vec![2], options()) })
        .unwrap();
    assert_eq!(reply, echo_reply("2", NodeId(1), &[2]));
    // A transport may also be started, used and dropped from async code.
    rt.block_on(async {
        let n3 = Node::start(3, &key, |_| {});
        n3.transport.set_peer(NodeId(2), nodes[1].addr());
        let reply = n3
            .transport
            .call(NodeId(2), ServiceId::FileSystem, vec![3], options())
            .unwrap();
        assert_eq!(reply, echo_reply("2", NodeId(3), &[3]));
        drop(n3);
    });
}

struct Panics;
impl Service for Panics {
    fn handle(&self, _from: NodeId, _request: &[u8]) -> Vec<u8> {
        panic!("test handler panics on purpose");
    }
}

#[test]
fn a_panicking_handler_is_an_error_not_a_dead_server() {
    let (_key, nodes) = cluster(2, |_| {});
    nodes[1].register(ServiceId::FsManager, Arc::new(Panics));
    nodes[1].register(ServiceId::FileSystem, Echo::new("2"));
    let t = &nodes[0].transport;
    for _ in 0..3 {
        match t.call(NodeId(2), ServiceId::FsManager, vec![], options()) {
            Err(TransportError::Unreachable { reason, .. }) => {
                assert!(
                    reason.contains("panicked (test handler panics on purpose)"),
                    "{reason}"
                )
            }
            other => panic!("expected an error, got {other:?}"),
        }
        t.call(NodeId(2), ServiceId::FileSystem, vec![1], options())
            .unwrap();
    }
    assert_eq!(nodes[1].transport.stats().handler_panics, 3);
}

/// Handlers on two nodes that each wait until both have been entered: they return
/// "together" only if call_many sent both requests before waiting for either.
struct Rendezvous {
    count: Arc<(parking_lot::Mutex<u32>, parking_lot::Condvar)>,
}
impl Service for Rendezvous {
    fn handle(&self, _from: NodeId, _request: &[u8]) -> Vec<u8> {
        let (count, cv) = &*self.count;
        let mut n = count.lock();
        *n += 1;
        cv.notify_all();
        let end = std::time::Instant::now() + Duration::from_secs(5);
        while *n < 2 {
            if cv.wait_until(&mut n, end).timed_out() {
                return b"alone".to_vec();
            }
        }
        b"together".to_vec()
    }
}

#[test]
fn call_many_overlaps_its_calls() {
    let (_key, nodes) = cluster(3, |_| {});
    let count = Arc::new((parking_lot::Mutex::new(0), parking_lot::Condvar::new()));
    for n in &nodes[1..] {
        n.register(
            ServiceId::TokenClient,
            Arc::new(Rendezvous {
                count: count.clone(),
            }),
        );
    }
    let results = nodes[0].transport.call_many(
        vec![
            (NodeId(2), ServiceId::TokenClient, vec![]),
            (NodeId(3), ServiceId::TokenClient, vec![]),
        ],
        options(),
    );
    for r in results {
        assert_eq!(r.unwrap(), b"together");
    }
}

#[test]
fn shutdown_fails_waiting_calls_at_once() {
    let (_key, nodes) = cluster(2, |_| {});
    let gate = Gate::new();
    nodes[1].register(ServiceId::TokenClient, gate.clone());
    let t1 = nodes[0].transport.clone();
    let waiting = std::thread::spawn({
        let t1 = t1.clone();
        move || {
            let hour = CallOptions {
                priority: Priority::Small,
                deadline: Duration::from_secs(3600),
            };
            t1.call(NodeId(2), ServiceId::TokenClient, vec![], hour)
        }
    });
    wait_for("the call to reach its handler", || gate.entered() == 1);
    t1.shutdown();
    let result = waiting.join().unwrap();
    assert!(
        matches!(result, Err(TransportError::Unreachable { .. })),
        "{result:?}"
    );
    let again = t1.call(NodeId(2), ServiceId::TokenClient, vec![], options());
    assert!(matches!(again, Err(TransportError::Unreachable { .. })));
    gate.open();
}

#[test]
fn bulk_payloads_travel_as_bytes() {
    let (_key, nodes) = cluster(2, |_| {});
    nodes[1].register(ServiceId::FileSystem, Echo::new("2"));
    let block = bytes::Bytes::from(
        (0..(4u32 << 20))
            .map(|i| (i % 251) as u8)
            .collect::<Vec<u8>>(),
    );
    let reply = nodes[0]
        .transport
        .call_bytes(NodeId(2), ServiceId::FileSystem, block.clone(), bulk())
        .unwrap();
    assert_eq!(&reply[..], &echo_reply("2", NodeId(1), &block)[..]);
}

/// Replies with this many bytes.
struct Big(usize);
impl Service for Big {
    fn handle(&self, _from: NodeId, _request: &[u8]) -> Vec<u8> {
        vec![0xb1; self.0]
    }
}

#[test]
fn a_message_over_the_frame_limit_fails_alone() {
    let (_key, nodes) = cluster(2, |c| c.max_frame_bytes = 1 << 20);
    nodes[1].register(ServiceId::FileSystem, Echo::new("2"));
    nodes[1].register(ServiceId::FsManager, Arc::new(Big(2 << 20)));
    let t = &nodes[0].transport;
    t.call(NodeId(2), ServiceId::FileSystem, vec![1], options())
        .unwrap();
    t.call(NodeId(2), ServiceId::FileSystem, vec![2; 512 << 10], bulk())
        .unwrap();
    let connects = t.stats().connects;
    match t.call(NodeId(2), ServiceId::FileSystem, vec![3; 2 << 20], bulk()) {
        Err(TransportError::Encode {
            what: "request",
            reason,
        }) => {
            assert!(reason.contains("frame limit"), "{reason}")
        }
        other => panic!("an oversized request got {other:?}"),
    }
    match t.call(NodeId(2), ServiceId::FsManager, vec![], options()) {
        Err(TransportError::Encode {
            what: "reply",
            reason,
        }) => {
            assert!(reason.contains("frame limit"), "{reason}")
        }
        other => panic!("an oversized reply got {other:?}"),
    }
    // Neither closed a connection: the others' calls go on where they were.
    for priority in [bulk(), options()] {
        t.call(NodeId(2), ServiceId::FileSystem, vec![4; 1000], priority)
            .unwrap();
    }
    assert_eq!(t.stats().connects, connects);
    assert_eq!(t.open_connections(NodeId(2)), 2);
    assert_eq!(
        t.stats().bad_frames + nodes[1].transport.stats().bad_frames,
        0
    );
}

/// `post` (the token manager's turn notices) returns without waiting for the handler
/// on the other node, which runs all the same; a post to a node that is not there is
/// dropped without holding the sender.
#[test]
fn a_post_is_delivered_and_nobody_waits_for_its_reply() {
    let (_key, nodes) = cluster(2, |_| {});
    let gate = Gate::new();
    nodes[1].register(ServiceId::TokenClient, gate.clone());
    let t1 = &nodes[0].transport;
    // The handler blocks until the gate opens: the post has returned long before.
    t1.post(
        NodeId(2),
        ServiceId::TokenClient,
        b"turn".to_vec(),
        options(),
    );
    wait_for("the posted request to reach its handler", || {
        gate.entered() == 1
    });
    gate.open();
    // Nobody there: nothing to wait for, nothing delivered.
    t1.post(
        NodeId(9),
        ServiceId::TokenClient,
        b"turn".to_vec(),
        options(),
    );
    let echo = Echo::new("1-TokenClient");
    nodes[0].register(ServiceId::TokenClient, echo.clone());
    // To its own node: runs in place (on the posting thread or its own).
    t1.post(NodeId(1), ServiceId::TokenClient, b"x".to_vec(), options());
    wait_for("the post to its own node", || echo.calls() == 1);
}

/// Counts the requests it runs; the first one waits for `release` (if set) and may
/// shut the caller's connections down before answering, so its answer is lost.
struct Once {
    runs: std::sync::atomic::AtomicU64,
    started: std::sync::atomic::AtomicBool,
    release: Arc<Gate>,
    hold_first: bool,
    drop_first_answer: std::sync::OnceLock<std::sync::Weak<mako_rpc::TcpTransport>>,
}

impl mako_rt::Service for Once {
    fn handle(&self, from: NodeId, request: &[u8]) -> Vec<u8> {
        use std::sync::atomic::Ordering::SeqCst;
        let n = self.runs.fetch_add(1, SeqCst);
        if n == 0 {
            self.started.store(true, SeqCst);
            if self.hold_first {
                self.release.handle(from, request);
            }
            if let Some(t) = self.drop_first_answer.get().and_then(|w| w.upgrade()) {
                // The answer goes out after this: onto a connection shut down.
                t.reset_inbound(from);
            }
        }
        format!("run {n}").into_bytes()
    }
}

fn once(hold_first: bool) -> Arc<Once> {
    Arc::new(Once {
        runs: Default::default(),
        started: Default::default(),
        release: Gate::new(),
        hold_first,
        drop_first_answer: Default::default(),
    })
}

/// The connection closes while the server runs the request: the caller sends it again
/// on a new connection, the server does not run it again but answers the copy when the
/// original finishes. Without the server's memory the copy would run (`run 1`).
#[test]
fn a_request_whose_connection_closes_while_it_runs_is_sent_again_and_runs_once() {
    use std::sync::atomic::Ordering::SeqCst;
    let (_key, nodes) = cluster(2, |_| {});
    let svc = once(true);
    nodes[1].register(ServiceId::FileSystem, svc.clone());
    let t1 = nodes[0].transport.clone();
    let caller =
        std::thread::spawn(move || t1.call(NodeId(2), ServiceId::FileSystem, vec![1], options()));
    wait_for("the request to run", || svc.started.load(SeqCst));
    nodes[0].transport.reset_connections(NodeId(2));
    wait_for("the copy to arrive", || {
        nodes[1].transport.stats().copies_joined == 1
    });
    svc.release.open();
    let reply = caller.join().unwrap().expect("the call succeeds");
    assert_eq!(&reply[..], b"run 0");
    assert_eq!(svc.runs.load(SeqCst), 1);
    assert_eq!(nodes[0].transport.stats().resends, 1);
}

/// The answer is lost with its connection after the request ran: the copy gets the
/// answer the server kept, and the request is not run again.
#[test]
fn a_request_whose_answer_is_lost_gets_the_kept_answer_and_runs_once() {
    use std::sync::atomic::Ordering::SeqCst;
    let (_key, nodes) = cluster(2, |_| {});
    let svc = once(false);
    let _ = svc
        .drop_first_answer
        .set(Arc::downgrade(&nodes[1].transport));
    nodes[1].register(ServiceId::FileSystem, svc.clone());
    let reply = nodes[0]
        .transport
        .call(NodeId(2), ServiceId::FileSystem, vec![1], options())
        .expect("the call succeeds");
    assert_eq!(&reply[..], b"run 0");
    assert_eq!(svc.runs.load(SeqCst), 1);
    let (client, server) = (nodes[0].transport.stats(), nodes[1].transport.stats());
    assert!(client.resends >= 1, "{client:?}");
    // The copy met the original running (its answer not sent yet) or finished.
    assert!(
        server.copies_answered + server.copies_joined >= 1,
        "{server:?}"
    );
    assert_eq!(server.copies_lost, 0, "{server:?}");
}

/// Answered requests are forgotten as the caller acknowledges them: the server's
/// memory stays as small as the calls in flight.
#[test]
fn answered_requests_are_forgotten_as_they_are_acknowledged() {
    let (_key, nodes) = cluster(2, |_| {});
    nodes[1].register(ServiceId::FileSystem, Echo::new("2"));
    for i in 0..500u32 {
        nodes[0]
            .transport
            .call(
                NodeId(2),
                ServiceId::FileSystem,
                i.to_le_bytes().to_vec(),
                options(),
            )
            .unwrap();
    }
    // Each request acknowledges every earlier one: only the last is remembered.
    assert_eq!(nodes[1].transport.remembered_requests(NodeId(1)), 1);
}
