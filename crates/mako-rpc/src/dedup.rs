//! The server's memory of the requests of its version 2 clients, so that a request
//! sent again after its connection closed (`FLAG_RESENT`) runs once: a copy of a
//! request still running waits for its answer, a copy of a request that ran gets the
//! answer it gave, and a copy of a request the client has since acknowledged is
//! dropped.
//!
//! Bounds: a client acknowledges with every request (`acked`) the ids below which it
//! waits for nothing, and the server forgets those; answers larger than
//! [`ANSWER_KEEP_MAX`] or beyond [`ANSWERS_BYTES_MAX`] per client are not kept (a copy
//! then gets `WireError::ReplyLost`: it ran, its answer is gone); a client's memory
//! holds at most [`ENTRIES_MAX`] requests, the oldest forgotten first (then a copy of a
//! forgotten one is answered `ReplyLost` too, never run again: ids below the oldest
//! kept are "done"). A client that connects under a new incarnation (restarted) has
//! its old memory dropped.

use crate::io::OutFrame;
use crate::stats::Counters;
use crate::wire::{self, Header, Kind, WireError};
use bytes::Bytes;
use mako_rt::NodeId;
use parking_lot::Mutex;
use std::collections::{BTreeMap, HashMap};
use tokio::sync::mpsc::UnboundedSender;

/// Answers up to this size are kept for copies; larger ones (block reads) are not.
pub const ANSWER_KEEP_MAX: usize = 64 << 10;
/// Bytes of kept answers per client.
pub const ANSWERS_BYTES_MAX: usize = 16 << 20;
/// Requests remembered per client.
pub const ENTRIES_MAX: usize = 65_536;

enum Entry {
    /// Running; copies that arrived meanwhile wait here for its answer.
    Running(Vec<(UnboundedSender<OutFrame>, Header)>),
    /// Answered: the answer's kind and body, if kept.
    Done(Option<(Kind, Bytes)>),
}

#[derive(Default)]
struct Client {
    incarnation: u64,
    /// Ids below this are done: a copy of one is not run.
    floor: u64,
    entries: BTreeMap<u64, Entry>,
    kept_bytes: usize,
}

impl Client {
    fn forget_below(&mut self, floor: u64) {
        if floor <= self.floor {
            return;
        }
        self.floor = floor;
        let keep = self.entries.split_off(&floor);
        for (_, e) in std::mem::replace(&mut self.entries, keep) {
            if let Entry::Done(Some((_, body))) = e {
                self.kept_bytes -= body.len();
            }
        }
    }
}

/// What the server does with a request of a version 2 client.
pub enum Admit {
    /// New: run it, then call [`Dedup::answered`].
    Run,
    /// A copy: it was answered here, or waits for the running original, or was dropped.
    Handled,
}

/// Per client node: the incarnation it speaks under and its remembered requests.
#[derive(Default)]
pub struct Dedup {
    clients: Mutex<HashMap<NodeId, Client>>,
}

fn answer_header(request: &Header, kind: Kind, body_len: usize) -> Header {
    let mut h = Header::new(request.version, kind, body_len);
    h.service = request.service;
    h.request_id = request.request_id;
    h
}

fn lost_frame(request: &Header) -> OutFrame {
    let body = Bytes::from(wire::encode_body(&WireError::ReplyLost));
    OutFrame::new(&answer_header(request, Kind::Error, body.len()), body)
}

impl Dedup {
    /// A request `h` from `node` under `incarnation`, arriving on the connection whose
    /// frames go to `tx`.
    pub fn admit(
        &self,
        node: NodeId,
        incarnation: u64,
        h: &Header,
        tx: &UnboundedSender<OutFrame>,
        stats: &Counters,
    ) -> Admit {
        let mut clients = self.clients.lock();
        let c = clients.entry(node).or_default();
        if c.incarnation != incarnation {
            // A new incarnation (restarted): nothing of the old one can come again.
            *c = Client {
                incarnation,
                ..Client::default()
            };
        }
        c.forget_below(h.request_id.saturating_sub(h.acked.into()));
        let id = h.request_id;
        if id < c.floor {
            // Done and acknowledged, or forgotten for room: never run twice.
            Counters::add(&stats.copies_lost);
            let _ = tx.send(lost_frame(h));
            return Admit::Handled;
        }
        match c.entries.get_mut(&id) {
            None => {
                c.entries.insert(id, Entry::Running(Vec::new()));
                while c.entries.len() > ENTRIES_MAX {
                    let oldest = *c.entries.keys().next().unwrap_or(&id);
                    c.forget_below(oldest + 1);
                }
                Admit::Run
            }
            Some(Entry::Running(waiting)) => {
                Counters::add(&stats.copies_joined);
                waiting.push((tx.clone(), *h));
                Admit::Handled
            }
            Some(Entry::Done(Some((kind, body)))) => {
                Counters::add(&stats.copies_answered);
                let _ = tx.send(OutFrame::new(
                    &answer_header(h, *kind, body.len()),
                    body.clone(),
                ));
                Admit::Handled
            }
            Some(Entry::Done(None)) => {
                Counters::add(&stats.copies_lost);
                let _ = tx.send(lost_frame(h));
                Admit::Handled
            }
        }
    }

    /// The request `h` admitted with [`Admit::Run`] was answered with `kind` and
    /// `body` (already sent on its own connection): copies waiting get it too, and it
    /// is kept for later copies if small enough.
    pub fn answered(&self, node: NodeId, incarnation: u64, h: &Header, kind: Kind, body: &Bytes) {
        let mut clients = self.clients.lock();
        let Some(c) = clients.get_mut(&node) else {
            return;
        };
        if c.incarnation != incarnation {
            return;
        }
        let Some(entry) = c.entries.get_mut(&h.request_id) else {
            // Acknowledged meanwhile (its caller gave up).
            return;
        };
        let keep = body.len() <= ANSWER_KEEP_MAX && c.kept_bytes + body.len() <= ANSWERS_BYTES_MAX;
        let before = std::mem::replace(entry, Entry::Done(keep.then(|| (kind, body.clone()))));
        if keep {
            c.kept_bytes += body.len();
        }
        if let Entry::Running(waiting) = before {
            for (tx, copy) in waiting {
                let _ = tx.send(OutFrame::new(
                    &answer_header(&copy, kind, body.len()),
                    body.clone(),
                ));
            }
        }
    }

    /// Requests remembered for `node` (for tests and diagnostics).
    pub fn remembered(&self, node: NodeId) -> usize {
        self.clients
            .lock()
            .get(&node)
            .map_or(0, |c| c.entries.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{HEADER_BYTES, VERSION_RESEND};
    use tokio::sync::mpsc::unbounded_channel;

    fn request(id: u64, acked: u16) -> Header {
        let mut h = Header::new(VERSION_RESEND, Kind::Request, 3);
        h.request_id = id;
        h.acked = acked;
        h
    }

    fn decode(f: &OutFrame) -> Header {
        let bytes: [u8; HEADER_BYTES] = f.header;
        Header::decode(&bytes, 1 << 20).unwrap()
    }

    #[test]
    fn a_copy_runs_never_and_gets_the_answer() {
        let d = Dedup::default();
        let st = Counters::default();
        let (tx, mut rx) = unbounded_channel();
        let n = NodeId(4);
        assert!(matches!(
            d.admit(n, 7, &request(10, 0), &tx, &st),
            Admit::Run
        ));
        // A copy while it runs waits, and gets the answer when it comes.
        assert!(matches!(
            d.admit(n, 7, &request(10, 0), &tx, &st),
            Admit::Handled
        ));
        assert!(rx.try_recv().is_err());
        d.answered(
            n,
            7,
            &request(10, 0),
            Kind::Reply,
            &Bytes::from_static(b"ok"),
        );
        let f = rx.try_recv().unwrap();
        assert_eq!((decode(&f).kind, decode(&f).request_id), (Kind::Reply, 10));
        assert_eq!(&f.body[..], b"ok");
        // A copy after it ran gets the kept answer.
        assert!(matches!(
            d.admit(n, 7, &request(10, 0), &tx, &st),
            Admit::Handled
        ));
        assert_eq!(&rx.try_recv().unwrap().body[..], b"ok");
        // Acknowledged (a later request says ids below 11 are done): forgotten, and a
        // copy is answered "lost", never run.
        assert!(matches!(
            d.admit(n, 7, &request(12, 1), &tx, &st),
            Admit::Run
        ));
        assert_eq!(d.remembered(n), 1);
        assert!(matches!(
            d.admit(n, 7, &request(10, 0), &tx, &st),
            Admit::Handled
        ));
        assert_eq!(decode(&rx.try_recv().unwrap()).kind, Kind::Error);
        // A new incarnation starts from nothing.
        assert!(matches!(
            d.admit(n, 8, &request(10, 0), &tx, &st),
            Admit::Run
        ));
        let s = st.snapshot();
        assert_eq!(
            (s.copies_joined, s.copies_answered, s.copies_lost),
            (1, 1, 1)
        );
    }

    #[test]
    fn large_answers_are_not_kept_and_memory_is_bounded() {
        let d = Dedup::default();
        let st = Counters::default();
        let (tx, mut rx) = unbounded_channel();
        let n = NodeId(1);
        assert!(matches!(
            d.admit(n, 1, &request(1, 0), &tx, &st),
            Admit::Run
        ));
        let big = Bytes::from(vec![0u8; ANSWER_KEEP_MAX + 1]);
        d.answered(n, 1, &request(1, 0), Kind::Reply, &big);
        assert!(matches!(
            d.admit(n, 1, &request(1, 0), &tx, &st),
            Admit::Handled
        ));
        assert_eq!(decode(&rx.try_recv().unwrap()).kind, Kind::Error);
        // A client that acknowledges as little as it can: at most ENTRIES_MAX
        // remembered, the oldest forgotten (and a copy of it not run again).
        for id in 2..(ENTRIES_MAX as u64 + 10) {
            assert!(matches!(
                d.admit(n, 1, &request(id, u16::MAX), &tx, &st),
                Admit::Run
            ));
        }
        assert!(d.remembered(n) <= ENTRIES_MAX);
        assert!(d.remembered(n) > ENTRIES_MAX / 2);
        assert!(matches!(
            d.admit(n, 1, &request(3, 0), &tx, &st),
            Admit::Handled
        ));
    }
}
