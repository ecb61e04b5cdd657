//! A refused frame or peer is logged with the peer's address and the reason (its own
//! test binary: it installs the process-wide log subscriber).

mod common;

use common::*;
use mako_rpc::wire::{self, Kind, HEADER_BYTES};
use mako_rt::ServiceId;
use parking_lot::Mutex;
use std::io::Write;
use std::sync::Arc;

#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Captured {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock()).into_owned()
    }
}

#[test]
fn refusals_are_logged_with_peer_and_reason() {
    let log = Captured::default();
    let writer = log.clone();
    tracing_subscriber::fmt()
        .with_ansi(false)
        .with_max_level(tracing::Level::WARN)
        .with_writer(move || writer.clone())
        .init();
    let (_key, nodes) = cluster(2, |_| {});
    nodes[1].register(ServiceId::FileSystem, Echo::new("2"));

    let mut frame = control_frame(
        wire::VERSION_MIN,
        Kind::Hello,
        &hello(5, wire::VERSION_MIN, wire::VERSION_MAX),
    );
    frame[HEADER_BYTES - 1] ^= 1;
    let mut s = raw_connect(nodes[1].addr());
    let peer = s.local_addr().unwrap().to_string();
    s.write_all(&frame).unwrap();
    expect_closed(&mut s);
    wait_for("the bad checksum to be logged", || {
        log.text()
            .lines()
            .any(|l| l.contains(&peer) && l.contains("bad header checksum"))
    });

    let intruder = Node::start(7, &mako_rpc::ClusterKey::random(), |_| {});
    intruder
        .transport
        .set_peer(mako_rt::NodeId(2), nodes[1].addr());
    let _ = mako_rt::Transport::call(
        intruder.transport.as_ref(),
        mako_rt::NodeId(2),
        ServiceId::FileSystem,
        vec![],
        options(),
    )
    .unwrap_err();
    wait_for("both sides to log the refusal", || {
        let text = log.text();
        // The member names the peer it refused; the intruder names why it gave up.
        text.lines()
            .any(|l| l.contains("refused a connection") && l.contains("127.0.0.1:"))
            && text
                .lines()
                .any(|l| l.contains("cannot connect") && l.contains("cluster key"))
    });
}
