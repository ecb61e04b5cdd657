//! Idempotency keys for the two requests a node sends again as a new request of the
//! transport (docs/coherence.md section 1, "Application-level resends"): a metanode
//! update sent again after a `Timeout` (`metanode::to_metanode`, `metanode::report`)
//! and a batch of frees sent again after a failed delivery
//! (`ownership::deliver_frees`).
//!
//! - **The key.** Every such request carries a `Key`: the sending node, its
//!   incarnation (drawn when its `Core` is made: a restarted node is a new writer) and
//!   a sequence number, increasing per writer. A resend carries the key of the first
//!   copy, and the same content.
//! - **The writer** keeps the sequence numbers still waiting for an answer
//!   (`outstanding`); every request also carries `acked`, the lowest of them: whatever
//!   is below has its answer, and no copy of it will be sent again.
//! - **The receiver** (`Applied`) remembers, per writer incarnation, the keys it applied
//!   and their outcome, from `acked` up. A copy of a key it applied is answered with the
//!   original outcome and not applied again; a copy of a key below `acked` (answered,
//!   so only a late copy) is dropped as done. The memory is bounded: `WINDOW_MAX` keys
//!   per writer incarnation, `INCARNATIONS_MAX` incarnations per writer node.
//!
//! The receiver's memory is not durable: it covers a copy that reaches the same
//! receiver incarnation. What a resend to another receiver (or to the same node
//! restarted) does is decided per request: a batch of frees is then not sent at all
//! (`FreeBatch::sent_to`: its space leaks until fsck reclaims it, never freed twice);
//! an update's sizes, times and block pointers are idempotent anyway, and its counts
//! are sent (counted twice at worst: a directory that looks non-empty, never one that
//! looks empty with entries in it). docs/coherence.md section 1 has the argument.

use mako_diag::{CountedMutex, LockClass};
use mako_format::DiskAddress;
use mako_token::ResourceId;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};

pub static WRITER_SEQ_LOCK: LockClass = LockClass::new("writerSeq.outstanding");
pub static WRITER_PEERS_LOCK: LockClass = LockClass::new("writerSeq.peers");
pub static FREE_BATCHES_LOCK: LockClass = LockClass::new("writerSeq.freeBatches");
pub static APPLIED_LOCK: LockClass = LockClass::new("writerSeq.applied");
pub static FREE_APPLY_LOCK: LockClass = LockClass::new("writerSeq.freeApply");

/// Keys a receiver remembers per writer incarnation (the oldest go first past it).
pub const WINDOW_MAX: usize = 4096;
/// Writer incarnations a receiver remembers per writer node (the least recently
/// heard from goes first past it).
pub const INCARNATIONS_MAX: usize = 4;

/// The idempotency key of one request (and of every copy of it).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Key {
    pub writer: u32,
    pub incarnation: u64,
    pub seq: u64,
    /// Every sequence number of this writer below this one has its answer.
    pub acked: u64,
}

/// A fresh incarnation: the node's wall clock (the injected one) when its `Core` is
/// made, in nanoseconds: a restarted node is made later. Nothing process-wide goes
/// into it, so that a simulated seed run twice in one process draws the same values
/// (`a_crash_seed_replays_bit_for_bit`); two `Core`s of one node made at the same
/// nanosecond of a frozen clock would share one (no test does that).
pub fn draw_incarnation(wall: std::time::Duration) -> u64 {
    (wall.as_nanos() as u64).max(1)
}

/// A batch of frees in another node's region or segment, with its key: sent (and sent
/// again) as one request with the same content until an owner answers it.
#[derive(Clone, Debug)]
pub struct FreeBatch {
    pub resource: ResourceId,
    pub extents: Vec<(DiskAddress, u32)>,
    pub inos: Vec<u64>,
    pub seq: u64,
    /// The receiver (node, incarnation) a copy went to without an answer: it may have
    /// applied it. Only that receiver can tell (`Applied`); any other must not get it.
    pub sent_to: Option<(u32, u64)>,
}

/// The writer's side, one per `Core`.
pub struct Writer {
    pub node: u32,
    pub incarnation: u64,
    next: AtomicU64,
    outstanding: CountedMutex<BTreeSet<u64>>,
    /// Incarnations of the nodes frees were sent to (`FsRequest::Free::to`).
    peers: CountedMutex<HashMap<u32, u64>>,
    /// Batches of frees not answered yet.
    pub frees: CountedMutex<Vec<FreeBatch>>,
}

impl Writer {
    pub fn new(node: u32, incarnation: u64) -> Writer {
        Writer {
            node,
            incarnation,
            next: AtomicU64::new(1),
            outstanding: CountedMutex::new(&WRITER_SEQ_LOCK, BTreeSet::new()),
            peers: CountedMutex::new(&WRITER_PEERS_LOCK, HashMap::new()),
            frees: CountedMutex::new(&FREE_BATCHES_LOCK, Vec::new()),
        }
    }

    /// A new sequence number, outstanding until `answered`. Drawn and made outstanding
    /// under one lock: a number drawn but not yet outstanding could be passed by
    /// another request's `acked`, and its receiver would take it for an answered one
    /// and drop it.
    pub fn next_seq(&self) -> u64 {
        let mut o = self.outstanding.lock();
        let seq = self.next.fetch_add(1, Ordering::Relaxed);
        o.insert(seq);
        seq
    }

    /// The key of `seq` for one copy (with the current `acked`).
    pub fn key(&self, seq: u64) -> Key {
        let acked = {
            let o = self.outstanding.lock();
            o.first()
                .copied()
                .unwrap_or_else(|| self.next.load(Ordering::Relaxed))
        };
        Key {
            writer: self.node,
            incarnation: self.incarnation,
            seq,
            acked: acked.min(seq),
        }
    }

    /// `seq` has its answer (or was given up): no copy of it is sent again.
    pub fn answered(&self, seq: u64) {
        self.outstanding.lock().remove(&seq);
    }

    pub fn peer(&self, node: u32) -> Option<u64> {
        self.peers.lock().get(&node).copied()
    }

    pub fn set_peer(&self, node: u32, incarnation: u64) {
        self.peers.lock().insert(node, incarnation);
    }
}

/// What a receiver did with a key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Being applied by another copy right now.
    Running,
    Applied,
    /// Applying it failed part way (what it changed may stay): a copy is not applied.
    Failed(String),
}

/// What a receiver must do with a copy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Seen {
    /// Not seen: apply it (`Applied::record` the outcome); marked running meanwhile.
    New,
    /// Seen: answer this, do not apply.
    Copy(Outcome),
    /// Below what the writer acknowledged: a late copy of something answered.
    Acknowledged,
}

#[derive(Default)]
struct Window {
    /// Every key below is acknowledged by the writer (or evicted).
    floor: u64,
    keys: BTreeMap<u64, Outcome>,
    heard: u64,
}

/// The receiver's memory of applied keys, one per `Core`.
pub struct Applied {
    windows: CountedMutex<HashMap<(u32, u64), Window>>,
    tick: AtomicU64,
    /// Serializes applying frees (check, apply, record), so a copy arriving while the
    /// first is applied waits for its outcome instead of being applied beside it.
    pub free_apply: CountedMutex<()>,
}

impl Default for Applied {
    fn default() -> Self {
        Applied {
            windows: CountedMutex::new(&APPLIED_LOCK, HashMap::new()),
            tick: AtomicU64::new(0),
            free_apply: CountedMutex::new(&FREE_APPLY_LOCK, ()),
        }
    }
}

impl Applied {
    /// Look `key` up; a new one is marked `Running` until `record`ed or `forget`ten.
    pub fn check(&self, key: &Key) -> Seen {
        let tick = self.tick.fetch_add(1, Ordering::Relaxed);
        let mut w = self.windows.lock();
        if !w.contains_key(&(key.writer, key.incarnation)) {
            let mine: Vec<(u64, u64)> = w
                .iter()
                .filter(|((n, _), _)| *n == key.writer)
                .map(|((_, inc), win)| (win.heard, *inc))
                .collect();
            if mine.len() >= INCARNATIONS_MAX {
                let oldest = mine.iter().min().expect("not empty").1;
                w.remove(&(key.writer, oldest));
            }
        }
        let win = w.entry((key.writer, key.incarnation)).or_default();
        win.heard = tick;
        if key.acked > win.floor {
            win.floor = key.acked;
            win.keys = win.keys.split_off(&key.acked);
        }
        if key.seq < win.floor {
            return Seen::Acknowledged;
        }
        if let Some(o) = win.keys.get(&key.seq) {
            return Seen::Copy(o.clone());
        }
        win.keys.insert(key.seq, Outcome::Running);
        while win.keys.len() > WINDOW_MAX {
            let (&low, _) = win.keys.iter().next().expect("not empty");
            tracing::warn!(
                "node {} incarnation {:x}: more than {WINDOW_MAX} requests unacknowledged; \
                 the oldest ({low}) is forgotten",
                key.writer,
                key.incarnation
            );
            win.keys.remove(&low);
            win.floor = low + 1;
        }
        Seen::New
    }

    /// The outcome of a key `check` found new.
    pub fn record(&self, key: &Key, outcome: Outcome) {
        if let Some(win) = self.windows.lock().get_mut(&(key.writer, key.incarnation)) {
            if let Some(o) = win.keys.get_mut(&key.seq) {
                *o = outcome;
            }
        }
    }

    /// A key `check` found new was not applied after all (nothing changed): a copy may
    /// apply it.
    pub fn forget(&self, key: &Key) {
        if let Some(win) = self.windows.lock().get_mut(&(key.writer, key.incarnation)) {
            win.keys.remove(&key.seq);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(seq: u64, acked: u64) -> Key {
        Key {
            writer: 1,
            incarnation: 7,
            seq,
            acked,
        }
    }

    #[test]
    fn a_copy_is_answered_with_the_first_outcome() {
        let a = Applied::default();
        assert_eq!(a.check(&key(1, 1)), Seen::New);
        assert_eq!(a.check(&key(1, 1)), Seen::Copy(Outcome::Running));
        a.record(&key(1, 1), Outcome::Applied);
        assert_eq!(a.check(&key(1, 1)), Seen::Copy(Outcome::Applied));
        // Acknowledged: forgotten, and a late copy is dropped.
        assert_eq!(a.check(&key(2, 2)), Seen::New);
        assert_eq!(a.check(&key(1, 1)), Seen::Acknowledged);
        // Not applied after all: a copy applies it.
        a.forget(&key(2, 2));
        assert_eq!(a.check(&key(2, 2)), Seen::New);
        // Another incarnation of the writer is another writer.
        let other = Key {
            incarnation: 8,
            ..key(2, 1)
        };
        assert_eq!(a.check(&other), Seen::New);
    }

    #[test]
    fn the_memory_is_bounded() {
        let a = Applied::default();
        for s in 1..=(WINDOW_MAX as u64 + 10) {
            assert_eq!(a.check(&key(s, 1)), Seen::New);
        }
        assert_eq!(a.check(&key(1, 1)), Seen::Acknowledged);
        for inc in 0..10 {
            a.check(&Key {
                incarnation: 100 + inc,
                ..key(1, 1)
            });
        }
        let w = a.windows.lock();
        assert_eq!(w.len(), INCARNATIONS_MAX);
    }

    #[test]
    fn the_writer_acknowledges_up_to_its_oldest_outstanding() {
        let w = Writer::new(3, 9);
        let a = w.next_seq();
        let b = w.next_seq();
        assert_eq!(w.key(b).acked, a);
        w.answered(a);
        assert_eq!(w.key(b).acked, b);
        w.answered(b);
        let c = w.next_seq();
        assert_eq!(w.key(c).acked, c);
    }
}
