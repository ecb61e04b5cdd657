//! Requests a node sends again as new requests of the transport after their answer was
//! lost (docs/coherence.md section 1, "Application-level resends"): a metanode update
//! sent again after a `Timeout`, a batch of frees sent again after a failed delivery.
//! The receiver handled the first copy; the copy must change nothing. Two nodes in one
//! process; node 1's transport loses the answer of one chosen request after the
//! receiver ran it (what a connection that breaks past the transport's resends, or a
//! deadline that passes, leaves: the request may have been handled).

use mako_fs::fs::{Ctx, FileSystem, ROOT_INO};
use mako_fs::metanode::{FsReply, FsRequest, Update};
use mako_fs::test_util::pattern;
use mako_rt::{CallOptions, NodeId, ServiceId, Transport, TransportError};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

mod common;
use common::Nodes;

const CTX: Ctx = Ctx {
    uid: 0,
    gid: 0,
    pid: 1,
};

/// While armed, the answer `Done` to the first file-system request `pick` chooses
/// (sent by either node) is lost after the receiver ran it: the caller gets `Timeout`.
struct Loss {
    armed: AtomicBool,
    pick: fn(&FsRequest) -> bool,
    lost: AtomicU64,
}

/// A node's transport, losing what `Loss` says.
struct LoseOneAnswer {
    inner: Arc<dyn Transport>,
    loss: Arc<Loss>,
}

impl Transport for LoseOneAnswer {
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
        let loss = &self.loss;
        let chosen = service == ServiceId::FileSystem
            && loss.armed.load(Ordering::SeqCst)
            && mako_rt::decode::<FsRequest>("request", &request).is_ok_and(|r| (loss.pick)(&r));
        let reply = self.inner.call(to, service, request, options)?;
        if chosen
            && matches!(
                mako_rt::decode::<FsReply>("reply", &reply),
                Ok(FsReply::Done)
            )
            && loss.armed.swap(false, Ordering::SeqCst)
        {
            loss.lost.fetch_add(1, Ordering::SeqCst);
            return Err(TransportError::Timeout {
                node: to,
                service,
                deadline: Duration::from_secs(30),
            });
        }
        Ok(reply)
    }
}

struct Cluster {
    nodes: Nodes,
    lossy: Arc<Loss>,
}

impl Cluster {
    fn new(pick: fn(&FsRequest) -> bool) -> Cluster {
        let lossy = Arc::new(Loss {
            armed: AtomicBool::new(false),
            pick,
            lost: AtomicU64::new(0),
        });
        let nodes = Nodes::new(2, |mut env| {
            env.transport = Arc::new(LoseOneAnswer {
                inner: env.transport.clone(),
                loss: lossy.clone(),
            });
            env
        });
        Cluster { nodes, lossy }
    }

    fn fs(&self, n: usize) -> &FileSystem {
        self.nodes.fs(n)
    }

    fn stat(&self, n: usize, name: &str) -> u64 {
        self.fs(n)
            .core
            .stats
            .snapshot()
            .into_iter()
            .find(|(k, _)| k == name)
            .unwrap_or_else(|| panic!("no statistic {name}"))
            .1
    }

    fn finish(self) {
        self.nodes.finish();
    }
}

/// Node 1 frees the blocks of a file node 0 wrote (in node 0's regions); the answer to
/// the batch is lost after node 0 freed them; node 0 hands the blocks to a new file;
/// node 1 sends the batch again. Without the key, node 0 freed them a second time:
/// the new file's blocks free in the map (fsck: `block_marked_free`, and the next
/// allocation hands them to a third file).
#[test]
fn a_batch_of_frees_sent_again_frees_nothing_twice() {
    let c = Cluster::new(|r| matches!(r, FsRequest::Free { .. }));
    let (a, b) = (c.fs(0), c.fs(1));
    let bb = 64 * 1024usize;
    let f = a.create(CTX, ROOT_INO, b"f", 0o644, 0, true).unwrap().ino;
    a.write(f, 0, &pattern(1, 8 * bb), false).unwrap();
    a.fsync(f, false).unwrap();
    b.unlink(ROOT_INO, b"f").unwrap();
    // The unlink's transaction committed and checkpointed: its frees go to node 0.
    let core1 = &b.core;
    core1.journal.commit(core1).unwrap();
    core1.journal.checkpoint(core1).unwrap();

    c.lossy.armed.store(true, Ordering::SeqCst);
    let first = mako_fs::ownership::deliver_frees(core1);
    assert!(first.is_err(), "the answer was lost: {first:?}");
    assert_eq!(c.lossy.lost.load(Ordering::SeqCst), 1, "an answer was lost");
    // Two batches (the blocks, in node 0's regions; the inode number, in its
    // segment): node 0 freed both, the answer to the first was lost.
    let served = c.stat(0, "foreign_frees_served");
    assert!(served >= 1, "node 0 freed the batches");
    let (batches, _) = mako_fs::ownership::frees_queued(core1);
    assert!(batches >= 1, "the batch stays queued");

    // Node 0 reuses the space: the freed blocks are free after its checkpoint.
    let core0 = &a.core;
    core0.journal.commit(core0).unwrap();
    core0.journal.checkpoint(core0).unwrap();
    let g = a.create(CTX, ROOT_INO, b"g", 0o644, 0, true).unwrap().ino;
    a.write(g, 0, &pattern(2, 8 * bb), false).unwrap();
    a.fsync(g, false).unwrap();
    core0.journal.commit(core0).unwrap();
    core0.journal.checkpoint(core0).unwrap();

    mako_fs::ownership::deliver_frees(core1).expect("the copy is answered");
    assert_eq!(mako_fs::ownership::frees_queued(core1).0, 0);
    let counted = (
        c.stat(0, "foreign_frees_served"),
        c.stat(0, "copies_answered"),
        c.stat(1, "foreign_frees_abandoned"),
    );
    // A third file must not get g's blocks.
    let h = a.create(CTX, ROOT_INO, b"h", 0o644, 0, true).unwrap().ino;
    a.write(h, 0, &pattern(3, 8 * bb), false).unwrap();
    a.fsync(h, false).unwrap();
    assert_eq!(a.read(g, 0, (8 * bb) as u32).unwrap(), pattern(2, 8 * bb));
    assert_eq!(a.read(h, 0, (8 * bb) as u32).unwrap(), pattern(3, 8 * bb));
    c.finish();
    // Applied once, the copy answered, nothing given up.
    assert_eq!(counted, (served, 1, 0));
}

/// An update carrying an entry count reaches the metanode twice (the copy
/// `to_metanode` sends after its answer was lost): counted once. Without the key the
/// directory's count went up twice. (Sent here by hand: which node becomes a shared
/// writer of a directory depends on operations running at once, the simulation's
/// ground; this checks the metanode's side of the contract.)
#[test]
fn a_metanode_update_sent_twice_counts_once() {
    let c = Cluster::new(|_| false);
    let (a, b) = (c.fs(0), c.fs(1));
    let d = a.mkdir(CTX, ROOT_INO, b"d", 0o755, 0).unwrap().ino;
    for i in 0..10 {
        a.create(CTX, d, format!("a{i}").as_bytes(), 0o644, 0, true)
            .unwrap();
    }
    let entries = |fs: &FileSystem| {
        let h = fs.core.cached_handle(d).expect("node 0 has the directory");
        let st = h.state.read();
        assert!(st.metanode, "node 0 owns the directory");
        st.inode.entries
    };
    assert_eq!(entries(a), 10);
    let update = |delta: i64| {
        let w = &b.core.writer;
        FsRequest::Update(Update {
            ino: d,
            size_at_least: 0,
            mtime: (0, 0),
            ctime: (0, 0),
            sets: Vec::new(),
            entries_delta: delta,
            nlink_delta: 0,
            key: Some(w.key(w.next_seq())),
        })
    };
    let send = |req: &FsRequest| -> FsReply {
        mako_rt::call(
            &*b.core.env.transport,
            NodeId(0),
            ServiceId::FileSystem,
            req,
            CallOptions::default(),
        )
        .expect("node 0 answers")
    };
    let up = update(1);
    for copy in 0..2 {
        assert!(
            matches!(send(&up), FsReply::Done),
            "copy {copy} answered Done"
        );
    }
    let after_copies = entries(a);
    let answered = c.stat(0, "copies_answered");
    // Back to the names there are (a new key), for fsck.
    assert!(matches!(send(&update(-1)), FsReply::Done));
    c.finish();
    assert_eq!(after_copies, 11, "the update counted once");
    assert_eq!(answered, 1, "the copy was answered");
}
