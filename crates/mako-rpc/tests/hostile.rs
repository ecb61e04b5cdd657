//! What a node that is not a member, or a peer that sends bad bytes, can do: nothing
//! but lose its own connection. Every case checks that no service ran for it and
//! that the server keeps serving the members' connections.

mod common;

use common::*;
use mako_rpc::wire::{self, Header, Kind, HEADER_BYTES};
use mako_rpc::ClusterKey;
use mako_rt::{NodeId, ServiceId, Transport, TransportError};
use std::io::Write;
use std::net::Shutdown;

#[test]
fn a_node_without_the_cluster_key_cannot_join() {
    let (_key, nodes) = cluster(2, |_| {});
    let echo1 = Echo::new("1");
    let echo2 = Echo::new("2");
    nodes[0].register(ServiceId::FileSystem, echo1.clone());
    nodes[1].register(ServiceId::FileSystem, echo2.clone());
    // An intruder with its own key and the right addresses, under a member's id too.
    for intruder_id in [7, 1] {
        let intruder = Node::start(intruder_id, &ClusterKey::random(), |_| {});
        intruder.register(ServiceId::FileSystem, Echo::new("intruder"));
        intruder.transport.set_peer(NodeId(2), nodes[1].addr());
        let refused_before = nodes[1].transport.stats().handshakes_refused;
        match intruder
            .transport
            .call(NodeId(2), ServiceId::FileSystem, b"hi".to_vec(), options())
        {
            Err(TransportError::Unreachable { reason, .. }) => {
                assert!(reason.contains("cluster key"), "{reason}")
            }
            other => panic!("an intruder's call got {other:?}"),
        }
        wait_for("the member to log the refusal", || {
            nodes[1].transport.stats().handshakes_refused > refused_before
        });
        // The other way: a member pointed at the intruder (by mistake) refuses it.
        if intruder_id == 7 {
            nodes[1].transport.set_peer(NodeId(7), intruder.addr());
            match nodes[1]
                .transport
                .call(NodeId(7), ServiceId::FileSystem, vec![], options())
            {
                Err(TransportError::Unreachable { reason, .. }) => {
                    assert!(reason.contains("cluster key"), "{reason}")
                }
                other => panic!("a call to an intruder got {other:?}"),
            }
            assert_eq!(intruder.transport.stats().requests_dispatched, 0);
        }
    }
    assert_eq!(echo2.calls(), 0, "no request of an intruder was dispatched");
    assert_eq!(nodes[1].transport.stats().requests_dispatched, 0);
    // Members still talk.
    nodes[0]
        .transport
        .call(NodeId(2), ServiceId::FileSystem, vec![1], options())
        .unwrap();
    nodes[1]
        .transport
        .call(NodeId(1), ServiceId::FileSystem, vec![1], options())
        .unwrap();
    assert_eq!(echo2.calls(), 1);
    assert_eq!(echo1.calls(), 1);
}

/// Turns a good request frame into a bad one.
type Spoil = Box<dyn Fn(&[u8]) -> Vec<u8>>;

/// A member connection that must survive every bad peer's fate.
fn member_call(nodes: &[Node]) {
    let reply = nodes[0]
        .transport
        .call(NodeId(2), ServiceId::FileSystem, b"ok".to_vec(), options())
        .unwrap();
    assert_eq!(reply, echo_reply("2", NodeId(1), b"ok"));
}

#[test]
fn bad_frames_close_only_their_own_connection() {
    let (key, nodes) = cluster(2, |c| c.max_frame_bytes = 1 << 20);
    let echo = Echo::new("2");
    nodes[1].register(ServiceId::FileSystem, echo.clone());
    member_call(&nodes);
    let member_connects = nodes[0].transport.stats().connects;
    let addr = nodes[1].addr();
    let good_hello = control_frame(
        wire::VERSION_MIN,
        Kind::Hello,
        &hello(5, wire::VERSION_MIN, wire::VERSION_MAX),
    );

    // Before authentication: each of these is refused and logged, the socket closed.
    let mut bad_crc = good_hello.clone();
    bad_crc[HEADER_BYTES - 1] ^= 0x5a;
    let mut bad_magic = good_hello.clone();
    bad_magic[0] = b'G';
    let mut unknown_version = Header::new(99, Kind::Hello, 0).encode().to_vec();
    unknown_version.extend_from_slice(&good_hello[HEADER_BYTES..]);
    let oversized = Header::new(wire::VERSION_MIN, Kind::Hello, wire::CONTROL_BODY_MAX + 1)
        .encode()
        .to_vec();
    let request_first = request_frame(ServiceId::FileSystem, 1, b"sneaky");
    let garbage = b"GET /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n".to_vec();
    let cases: Vec<(&str, Vec<u8>, bool)> = vec![
        ("bad header checksum", bad_crc, false),
        ("bad magic", bad_magic, false),
        ("unknown version", unknown_version, false),
        ("oversized length", oversized, false),
        ("request before authentication", request_first, false),
        ("not Mako at all", garbage, false),
        (
            "truncated header",
            good_hello[..HEADER_BYTES / 2].to_vec(),
            true,
        ),
        (
            "truncated body",
            good_hello[..good_hello.len() - 3].to_vec(),
            true,
        ),
    ];
    let mut bad = nodes[1].transport.stats().bad_frames;
    for (what, bytes, then_end) in cases {
        let mut s = raw_connect(addr);
        s.write_all(&bytes).unwrap();
        if then_end {
            s.shutdown(Shutdown::Write).unwrap();
        }
        expect_closed(&mut s);
        bad += 1;
        wait_for(what, || nodes[1].transport.stats().bad_frames == bad);
        member_call(&nodes);
    }

    // After authentication, as a member: one request is answered, then a bad frame
    // closes that connection only.
    let post_auth: Vec<(&str, Spoil)> = vec![
        (
            "bad checksum after authentication",
            Box::new(|frame: &[u8]| {
                let mut f = frame.to_vec();
                f[12] ^= 1;
                f
            }),
        ),
        (
            "unknown version after authentication",
            Box::new(|frame: &[u8]| {
                let (h, body) = frame.split_at(HEADER_BYTES);
                let mut h = Header::decode(h.try_into().unwrap(), usize::MAX).unwrap();
                h.version = 77;
                wire::frame_bytes(&h, body)
            }),
        ),
        (
            "oversized request",
            Box::new(|_frame: &[u8]| {
                let h = Header::new(wire::VERSION_MIN, Kind::Request, 2 << 20);
                h.encode().to_vec()
            }),
        ),
        (
            "truncated request",
            Box::new(|frame: &[u8]| frame[..frame.len() - 1].to_vec()),
        ),
        (
            "a reply sent to the server",
            Box::new(|frame: &[u8]| {
                let (h, body) = frame.split_at(HEADER_BYTES);
                let mut h = Header::decode(h.try_into().unwrap(), usize::MAX).unwrap();
                h.kind = Kind::Reply;
                wire::frame_bytes(&h, body)
            }),
        ),
    ];
    let mut dispatched = nodes[1].transport.stats().requests_dispatched;
    for (what, spoil) in post_auth {
        let mut s = raw_authenticate(addr, &key, 5);
        s.write_all(&request_frame(ServiceId::FileSystem, 1, b"fine"))
            .unwrap();
        let (h, body) = raw_read_frame(&mut s);
        assert_eq!((h.kind, h.request_id), (Kind::Reply, 1));
        assert_eq!(body, echo_reply("2", NodeId(5), b"fine"));
        dispatched += 1;
        s.write_all(&spoil(&request_frame(ServiceId::FileSystem, 2, b"spoilt")))
            .unwrap();
        s.shutdown(Shutdown::Write).unwrap();
        expect_closed(&mut s);
        bad += 1;
        wait_for(what, || nodes[1].transport.stats().bad_frames == bad);
        assert_eq!(
            nodes[1].transport.stats().requests_dispatched,
            dispatched,
            "{what}: the spoilt request was dispatched"
        );
        member_call(&nodes);
        dispatched += 1;
    }
    // The member's own connections were never closed.
    assert_eq!(nodes[0].transport.stats().connects, member_connects);
    assert_eq!(nodes[0].transport.open_connections(NodeId(2)), 1);
}

#[test]
fn no_common_version_is_refused_with_a_reason() {
    let (_key, nodes) = cluster(2, |_| {});
    let echo = Echo::new("2");
    nodes[1].register(ServiceId::FileSystem, echo.clone());
    let mut s = raw_connect(nodes[1].addr());
    s.write_all(&control_frame(
        wire::VERSION_MIN,
        Kind::Hello,
        &hello(5, 90, 99),
    ))
    .unwrap();
    let (h, body) = raw_read_frame(&mut s);
    assert_eq!(h.kind, Kind::Refuse);
    let refusal: wire::Refuse = wire::decode_body("refusal", &body).unwrap();
    assert!(
        refusal.reason.contains("no common protocol version") && refusal.reason.contains("90..=99"),
        "{}",
        refusal.reason
    );
    expect_closed(&mut s);
    wait_for("the refusal to be counted", || {
        nodes[1].transport.stats().handshakes_refused == 1
    });
    member_call(&nodes);
    assert_eq!(echo.calls(), 1);
}

#[test]
fn a_silent_connection_is_closed_after_the_handshake_time() {
    let (_key, nodes) = cluster(2, |c| {
        c.handshake_timeout = std::time::Duration::from_millis(100)
    });
    nodes[1].register(ServiceId::FileSystem, Echo::new("2"));
    let mut s = raw_connect(nodes[1].addr());
    s.write_all(b"M").unwrap();
    expect_closed(&mut s);
    member_call(&nodes);
}

/// A client that skips checking the server and just sends a proof made with another
/// key: the server refuses it, and requests it sends anyway are never dispatched.
#[test]
fn a_wrong_proof_is_refused_and_nothing_is_dispatched() {
    let (_key, nodes) = cluster(2, |_| {});
    let echo = Echo::new("2");
    nodes[1].register(ServiceId::FileSystem, echo.clone());
    let wrong = ClusterKey::random();
    let mut s = raw_connect(nodes[1].addr());
    let hello = hello(5, wire::VERSION_MIN, wire::VERSION_MAX);
    s.write_all(&control_frame(wire::VERSION_MIN, Kind::Hello, &hello))
        .unwrap();
    let (h, body) = raw_read_frame(&mut s);
    assert_eq!(h.kind, Kind::HelloAck);
    let ack: wire::HelloAck = wire::decode_body("ack", &body).unwrap();
    let t = mako_rpc::auth::Transcript {
        version: ack.version,
        client_node: 5,
        server_node: ack.node,
        lane: hello.lane,
        client_nonce: hello.nonce,
        server_nonce: ack.nonce,
    };
    // Also the server's own proof reflected back is refused (roles differ).
    for proof in [
        mako_rpc::auth::proof(&wrong, mako_rpc::auth::Role::Client, &t),
        ack.proof,
    ] {
        let mut s = if proof == ack.proof {
            // A fresh connection for the second try: the first one is closed.
            let mut s = raw_connect(nodes[1].addr());
            s.write_all(&control_frame(wire::VERSION_MIN, Kind::Hello, &hello))
                .unwrap();
            let (_, body) = raw_read_frame(&mut s);
            let ack: wire::HelloAck = wire::decode_body("ack", &body).unwrap();
            let mut bytes =
                control_frame(ack.version, Kind::Auth, &wire::Auth { proof: ack.proof });
            bytes.extend(request_frame(ServiceId::FileSystem, 1, b"anyway"));
            s.write_all(&bytes).unwrap();
            s
        } else {
            let mut bytes = control_frame(ack.version, Kind::Auth, &wire::Auth { proof });
            // Requests right behind the proof, without waiting for the answer.
            bytes.extend(request_frame(ServiceId::FileSystem, 1, b"anyway"));
            s.try_clone().unwrap().write_all(&bytes).unwrap();
            s.try_clone().unwrap()
        };
        let (h, body) = raw_read_frame(&mut s);
        assert_eq!(h.kind, Kind::Refuse);
        let refusal: wire::Refuse = wire::decode_body("refusal", &body).unwrap();
        assert!(refusal.reason.contains("cluster key"), "{}", refusal.reason);
        expect_closed(&mut s);
    }
    wait_for("both refusals to be counted", || {
        nodes[1].transport.stats().handshakes_refused == 2
    });
    assert_eq!(echo.calls(), 0);
    assert_eq!(nodes[1].transport.stats().requests_dispatched, 0);
    member_call(&nodes);
}

/// A server that answers the hello without knowing the key (an impostor at a
/// member's address): the member refuses it and sends it no request.
#[test]
fn a_member_refuses_a_server_without_the_key() {
    let (_key, nodes) = cluster(1, |_| {});
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let impostor = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        s.set_read_timeout(Some(PATIENCE)).unwrap();
        let (h, _) = raw_read_frame(&mut s);
        assert_eq!(h.kind, Kind::Hello);
        let ack = wire::HelloAck {
            node: 7,
            version: wire::VERSION_MIN,
            nonce: [3; 32],
            proof: [0; 32],
        };
        s.write_all(&control_frame(wire::VERSION_MIN, Kind::HelloAck, &ack))
            .unwrap();
        let (h, _) = raw_read_frame(&mut s);
        if h.kind == Kind::Auth {
            // A member fooled into authenticating would send its requests next.
            s.write_all(&control_frame(wire::VERSION_MIN, Kind::AuthOk, &()))
                .unwrap();
            let (h, _) = raw_read_frame(&mut s);
            return h.kind;
        }
        h.kind
    });
    nodes[0].transport.set_peer(NodeId(7), addr);
    match nodes[0].transport.call(
        NodeId(7),
        ServiceId::FileSystem,
        b"secret".to_vec(),
        options(),
    ) {
        Err(TransportError::Unreachable { reason, .. }) => {
            assert!(reason.contains("cluster key"), "{reason}")
        }
        other => panic!("a call to an impostor got {other:?}"),
    }
    assert_eq!(impostor.join().unwrap(), Kind::Refuse);
    assert_eq!(nodes[0].transport.stats().requests_sent, 0);
}

/// A member naming a service this node does not know (a newer release) gets an error
/// answer, and its connection stays usable.
#[test]
fn an_unknown_service_number_is_answered_not_fatal() {
    let (key, nodes) = cluster(2, |_| {});
    nodes[1].register(ServiceId::FileSystem, Echo::new("2"));
    let mut s = raw_authenticate(nodes[1].addr(), &key, 5);
    let mut h = Header::new(wire::VERSION_MIN, Kind::Request, 3);
    h.service = 999;
    h.request_id = 41;
    h.deadline_ms = 30_000;
    s.write_all(&wire::frame_bytes(&h, b"new")).unwrap();
    let (answer, body) = raw_read_frame(&mut s);
    assert_eq!((answer.kind, answer.request_id), (Kind::Error, 41));
    let e: wire::WireError = wire::decode_body("error", &body).unwrap();
    assert_eq!(e, wire::WireError::UnknownService(999));
    // A known service that is not registered here: NoService.
    s.write_all(&request_frame(ServiceId::TokenManager, 42, b""))
        .unwrap();
    let (answer, body) = raw_read_frame(&mut s);
    assert_eq!((answer.kind, answer.request_id), (Kind::Error, 42));
    let e: wire::WireError = wire::decode_body("error", &body).unwrap();
    assert_eq!(e, wire::WireError::NoService);
    s.write_all(&request_frame(ServiceId::FileSystem, 43, b"ok"))
        .unwrap();
    let (answer, body) = raw_read_frame(&mut s);
    assert_eq!((answer.kind, answer.request_id), (Kind::Reply, 43));
    assert_eq!(body, echo_reply("2", NodeId(5), b"ok"));
    assert_eq!(nodes[1].transport.stats().bad_frames, 0);
}

/// A node removed from the cluster (`remove_member`) is refused although it proves
/// the key, its open connections close, and `set_peer` admits it again.
#[test]
fn a_removed_member_is_refused_even_with_the_key() {
    let (_key, nodes) = cluster(2, |_| {});
    let echo2 = Echo::new("2");
    nodes[1].register(ServiceId::FileSystem, echo2.clone());
    nodes[0]
        .transport
        .call(NodeId(2), ServiceId::FileSystem, vec![1], options())
        .unwrap();
    assert_eq!(echo2.calls(), 1);
    nodes[1].transport.remove_member(NodeId(1));
    // A connection it still had is closed at its next request; a new one is refused.
    let mut refused = false;
    for _ in 0..3 {
        match nodes[0]
            .transport
            .call(NodeId(2), ServiceId::FileSystem, vec![2], options())
        {
            Err(TransportError::Unreachable { reason, .. }) => {
                if reason.contains("was removed from the cluster") {
                    refused = true;
                    break;
                }
            }
            other => panic!("a removed node's call got {other:?}"),
        }
    }
    assert!(refused, "the removed node was never told it was removed");
    assert_eq!(
        echo2.calls(),
        1,
        "no request of the removed node was dispatched"
    );
    nodes[1].transport.set_peer(NodeId(1), nodes[0].addr());
    nodes[0]
        .transport
        .call(NodeId(2), ServiceId::FileSystem, vec![3], options())
        .unwrap();
    assert_eq!(echo2.calls(), 2);
}
