//! A manager shard rebuilt from the nodes' held tokens after its node failed
//! (docs/coherence.md section 7b): it grants what the lost one would have, nothing
//! before every live node reported and every failed node was recovered.

use std::sync::Arc;
use std::time::{Duration, Instant};

use mako_rt::{InProcessTransport, Registry, ServiceId, Transport};
use TokenMode::*;

use crate::client::{ManagerMap, TokenClient, TokenClientLimits};
use crate::error::TokenError;
use crate::manager::{AcquireRequest, TokenManager};
use crate::mode::TokenMode;
use crate::protocol::ManagerService;
use crate::range::ByteRange;
use crate::resource::{NodeId, ResourceId, ResourceKind};

const OLD: NodeId = NodeId(0);
const NEW: NodeId = NodeId(9);

fn file(id: u64) -> ResourceId {
    ResourceId::new(1, ResourceKind::ByteRange, id)
}

fn inode(id: u64) -> ResourceId {
    ResourceId::new(1, ResourceKind::Inode, id)
}

fn r(s: u64, e: u64) -> ByteRange {
    ByteRange::new(s, e)
}

/// Nodes 1..=n with token clients (caching nothing until a test sets a cache flush),
/// the manager on node 0.
struct Cluster {
    registry: Arc<Registry>,
    old: Arc<TokenManager>,
    clients: Vec<TokenClient>,
}

impl Cluster {
    fn new(n: u32) -> Cluster {
        let registry = Registry::new();
        let old = Arc::new(TokenManager::default());
        registry.register(
            OLD,
            ServiceId::TokenManager,
            Arc::new(ManagerService {
                manager: old.clone(),
            }),
        );
        let clients = (1..=n)
            .map(|i| {
                let node = NodeId(i);
                let c = TokenClient::new(
                    node,
                    Arc::new(InProcessTransport::new(node, registry.clone())),
                    ManagerMap::single(OLD),
                    TokenClientLimits::default(),
                );
                registry.register(node, ServiceId::TokenClient, c.service());
                c
            })
            .collect();
        Cluster {
            registry,
            old,
            clients,
        }
    }

    fn client(&self, node: u32) -> &TokenClient {
        &self.clients[node as usize - 1]
    }

    /// Node 0 fails: a fresh manager on node 9 takes over its slot, rebuilding from
    /// `live` and waiting for the recovery of `failed`. Returns it and the transport
    /// it asks the nodes through.
    fn take_over(&self, live: &[u32], failed: &[u32]) -> (Arc<TokenManager>, Arc<dyn Transport>) {
        self.registry.unregister_node(OLD);
        let new = Arc::new(TokenManager::default());
        let live: Vec<NodeId> = live.iter().map(|n| NodeId(*n)).collect();
        let mut failed: Vec<NodeId> = failed.iter().map(|n| NodeId(*n)).collect();
        failed.push(OLD);
        new.begin_rebuild(ManagerMap::single(NEW), 0, &live, &failed);
        self.registry.register(
            NEW,
            ServiceId::TokenManager,
            Arc::new(ManagerService {
                manager: new.clone(),
            }),
        );
        let transport: Arc<dyn Transport> =
            Arc::new(InProcessTransport::new(NEW, self.registry.clone()));
        (new, transport)
    }
}

/// Until `done` holds; a hang guard only (two minutes), never a timed assertion.
fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "still waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

fn refused(m: &TokenManager, req: AcquireRequest) -> bool {
    matches!(m.acquire(req), Err(TokenError::Rebuilding { .. }))
}

/// The table rebuilt from the survivors is the lost one without the failed nodes'
/// tokens (versions and metanodes included), and from then on the same requests get
/// the same answers from it as from the lost one. Nothing is granted before the failed
/// node's recovery released it, even on resources it never held.
#[test]
fn a_rebuilt_shard_grants_what_the_lost_one_would() {
    let c = Cluster::new(4);
    // Byte ranges of one file shared in pieces, whole-file tokens, inodes with a
    // metanode and versions; node 4 holds some and fails with the manager.
    c.client(1)
        .acquire(file(1), Xw, r(0, 4096), r(0, 8192))
        .expect("node 1 xw");
    c.client(2)
        .acquire(file(1), Ro, r(16384, 20480), ByteRange::WHOLE)
        .expect("node 2 ro");
    c.client(3)
        .acquire(file(1), Ro, r(20480, 24576), r(20480, 40960))
        .expect("node 3 ro");
    c.client(4)
        .acquire(file(2), Xw, r(0, 1), ByteRange::WHOLE)
        .expect("node 4 xw");
    c.client(1)
        .acquire_whole(inode(7), Rw)
        .expect("node 1 shared writer");
    c.client(2)
        .acquire_whole(inode(7), Rw)
        .expect("node 2 shared writer");
    c.client(1).set_version(inode(7), 3).expect("version");
    c.client(3)
        .acquire_whole(inode(8), Ro)
        .expect("node 3 reader");
    c.client(4)
        .acquire_whole(inode(8), Ro)
        .expect("node 4 reader");
    c.client(4)
        .acquire_whole(inode(9), Xw)
        .expect("node 4 owner");
    let metanode_before = c.old.locate_metanode(NodeId(2), inode(7), false);
    assert_eq!(metanode_before, Some(NodeId(1)));

    let (new, transport) = c.take_over(&[1, 2, 3], &[4]);
    assert!(new.is_rebuilding());
    assert!(refused(&new, AcquireRequest::whole(NodeId(2), file(3), Ro)));
    let rounds = new.collect_reports(&*transport, Duration::from_millis(1));
    assert_eq!(rounds, 1, "every live node answered at once");
    assert_eq!(
        new.rebuild_waits_for(),
        (vec![], vec![NodeId(0), NodeId(4)])
    );
    // Node 4's log may hold changes to anything it held, and what it held is not
    // known: nothing is granted until it is recovered (node 0, the old manager, too).
    assert!(refused(&new, AcquireRequest::whole(NodeId(2), file(3), Ro)));
    assert!(refused(
        &new,
        AcquireRequest::whole(NodeId(2), inode(9), Ro)
    ));
    new.release_node(NodeId(4));
    assert!(new.is_rebuilding());
    new.release_node(OLD);
    assert!(!new.is_rebuilding());

    // The lost table, after the same recoveries.
    c.old.release_node(NodeId(4));
    assert_eq!(new.dump(), c.old.dump());
    assert_eq!(new.stats().tokens, c.old.stats().tokens);
    for res in [file(1), file(2), inode(7), inode(8), inode(9)] {
        assert_eq!(new.version(res), c.old.version(res), "{res}");
        assert_eq!(
            new.locate_metanode(NodeId(3), res, false),
            c.old.locate_metanode(NodeId(3), res, false),
            "{res}"
        );
    }
    // The same requests, the same answers (grants, copysets, widened ranges).
    let probes = [
        AcquireRequest::new(NodeId(2), file(1), Rw, r(4096, 8192), ByteRange::WHOLE),
        AcquireRequest::new(NodeId(3), file(1), Ro, r(0, 10), ByteRange::WHOLE),
        AcquireRequest::new(NodeId(1), file(1), Xw, r(30000, 30001), ByteRange::WHOLE),
        AcquireRequest::new(NodeId(3), file(1), Ro, r(50000, 50001), ByteRange::WHOLE),
        AcquireRequest::whole(NodeId(3), inode(7), Rw),
        AcquireRequest::whole(NodeId(3), inode(8), Xw),
        AcquireRequest::whole(NodeId(1), file(2), Xw),
        AcquireRequest::whole(NodeId(2), inode(9), Ro),
    ];
    for probe in probes {
        let a = c.old.acquire(probe);
        let b = new.acquire(probe);
        assert_eq!(format!("{b:?}"), format!("{a:?}"), "{probe:?}");
    }
    assert_eq!(new.dump(), c.old.dump());
}

/// Requests during the rebuild wait for it (refused, asked again), conflicting or
/// not; once it is done they are served as usual: the conflicting one revokes the
/// holder the rebuild learned of.
#[test]
fn requests_during_a_rebuild_wait_for_it() {
    let c = Cluster::new(3);
    c.client(1)
        .acquire_whole(inode(5), Xw)
        .expect("node 1 holds the inode");
    let (new, transport) = c.take_over(&[1, 2, 3], &[]);
    let waiters: Vec<_> = [(2u32, inode(5), Xw), (3, file(6), Ro)]
        .into_iter()
        .map(|(n, res, mode)| {
            let client = c.client(n).clone();
            client.set_managers(ManagerMap::single(NEW));
            std::thread::spawn(move || client.acquire_whole(res, mode))
        })
        .collect();
    wait_for("both requests refused", || new.stats().rebuild_refused >= 2);
    assert!(new.dump().is_empty(), "nothing granted during the rebuild");
    new.collect_reports(&*transport, Duration::from_millis(1));
    new.release_node(OLD);
    assert!(!new.is_rebuilding());
    for w in waiters {
        w.join()
            .expect("no panic")
            .expect("served after the rebuild");
    }
    assert!(c.client(1).held(inode(5)).is_empty(), "revoked from node 1");
    assert_eq!(c.client(2).held(inode(5)), vec![(ByteRange::WHOLE, Xw)]);
    let holders = new.holders(inode(5));
    assert_eq!(holders.len(), 1);
    assert_eq!(holders[0].node, NodeId(2));
}

/// A node that does not answer at first is asked again until it does, and nothing is
/// granted meanwhile; a report made before a token was given up, arriving after the
/// relinquish, records more than is held (never less), which the next revoke clears;
/// a report from a node that was recovered meanwhile is dropped.
#[test]
fn a_late_report_is_waited_for_and_a_stale_one_is_harmless() {
    let c = Cluster::new(3);
    c.client(1)
        .acquire_whole(file(1), Xw)
        .expect("node 1 holds file 1");
    c.client(2)
        .acquire_whole(file(2), Xw)
        .expect("node 2 holds file 2");
    // Node 2 does not answer yet (its token client is not reachable).
    c.registry.unregister(NodeId(2), ServiceId::TokenClient);
    let (new, transport) = c.take_over(&[1, 2, 3], &[]);
    new.release_node(OLD);
    let collector = {
        let new = new.clone();
        std::thread::spawn(move || new.collect_reports(&*transport, Duration::from_millis(1)))
    };
    wait_for("nodes 1 and 3 reported", || new.stats().reports >= 2);
    assert_eq!(new.rebuild_waits_for(), (vec![NodeId(2)], vec![]));
    assert!(refused(&new, AcquireRequest::whole(NodeId(3), file(2), Ro)));
    assert!(refused(&new, AcquireRequest::whole(NodeId(3), file(4), Ro)));
    c.registry
        .register(NodeId(2), ServiceId::TokenClient, c.client(2).service());
    let rounds = collector.join().expect("no panic");
    assert!(rounds >= 2, "node 2 was asked again ({rounds} rounds)");
    assert!(!new.is_rebuilding());
    assert_eq!(
        new.holders(file(2)).len(),
        1,
        "node 2's late report counted"
    );

    // A stale report: node 1 reported file 1, then gave it up, and the relinquish
    // reached the manager before the report did.
    let stale = c.client(1).report_for_tests(0, ManagerMap::single(NEW));
    assert_eq!(stale.len(), 1);
    c.client(1).set_managers(ManagerMap::single(NEW));
    c.client(1)
        .release(file(1), ByteRange::WHOLE)
        .expect("released");
    let (newer, transport) = {
        let m = Arc::new(TokenManager::default());
        m.begin_rebuild(ManagerMap::single(NEW), 0, &[NodeId(1), NodeId(3)], &[]);
        c.registry.register(
            NEW,
            ServiceId::TokenManager,
            Arc::new(ManagerService { manager: m.clone() }),
        );
        let t: Arc<dyn Transport> = Arc::new(InProcessTransport::new(NEW, c.registry.clone()));
        (m, t)
    };
    assert!(newer.apply_report(NodeId(1), &stale));
    assert!(
        !newer.apply_report(NodeId(1), &stale),
        "one report per node is taken"
    );
    newer.collect_reports(&*transport, Duration::from_millis(1));
    assert!(!newer.is_rebuilding());
    assert_eq!(
        newer.holders(file(1)).len(),
        1,
        "recorded from the stale report"
    );
    c.client(3).set_managers(ManagerMap::single(NEW));
    c.client(3)
        .acquire_whole(file(1), Xw)
        .expect("the revoke of what node 1 no longer holds clears it");
    assert_eq!(newer.holders(file(1))[0].node, NodeId(3));

    // A report from a node recovered meanwhile is dropped.
    let m = TokenManager::default();
    m.begin_rebuild(ManagerMap::single(NEW), 0, &[NodeId(1), NodeId(2)], &[]);
    m.release_node(NodeId(2));
    assert!(!m.apply_report(NodeId(2), &stale));
    assert!(m.is_rebuilding(), "node 1 has not reported");
}

/// A cache flush that takes another token first (as a data flush allocates space).
struct FlushTakes {
    client: std::sync::OnceLock<TokenClient>,
    resource: ResourceId,
}

impl crate::client::CacheFlush for FlushTakes {
    fn flush_and_invalidate(
        &self,
        _: ResourceId,
        _: ByteRange,
        _: Option<TokenMode>,
    ) -> Result<(), TokenError> {
        let client = self.client.get().expect("set");
        client.acquire_whole(self.resource, Xw)
    }
}

/// A revoke under way when the manager failed may need a token of the rebuilding
/// shard to flush (it waits for the rebuild); the holder's report does not wait for
/// the revoke (that would never end): it reports the token, still held, and the
/// revoke completes once the rebuild is done.
#[test]
fn a_report_does_not_wait_for_a_revoke_that_waits_for_the_rebuild() {
    let c = Cluster::new(2);
    let flush = Arc::new(FlushTakes {
        client: std::sync::OnceLock::new(),
        resource: file(3),
    });
    let holder = c.client(2).clone();
    let _ = flush.client.set(holder.clone());
    holder.set_cache_flush(flush);
    holder
        .acquire_whole(file(1), Xw)
        .expect("node 2 holds file 1");
    let (new, transport) = c.take_over(&[1, 2], &[]);
    new.release_node(OLD);
    holder.set_managers(ManagerMap::single(NEW));
    // Node 1's revoke, sent before the manager failed, reaches node 2 now.
    let revoke = {
        let t = InProcessTransport::new(NodeId(1), c.registry.clone());
        std::thread::spawn(move || {
            mako_rt::call::<_, crate::protocol::ClientReply>(
                &t,
                NodeId(2),
                ServiceId::TokenClient,
                &crate::protocol::ClientRequest::Revoke {
                    resource: file(1),
                    range: ByteRange::WHOLE,
                    wanted: Xw,
                },
                mako_rt::CallOptions::default(),
            )
        })
    };
    wait_for("the flush's acquire refused", || {
        new.stats().rebuild_refused >= 1
    });
    let collector = {
        let new = new.clone();
        std::thread::spawn(move || new.collect_reports(&*transport, Duration::from_millis(1)))
    };
    wait_for("the rebuild", || !new.is_rebuilding());
    collector.join().expect("no panic");
    let reply = revoke.join().expect("no panic").expect("answered");
    assert!(
        matches!(reply, crate::protocol::ClientReply::Revoked),
        "{reply:?}"
    );
    assert!(
        new.holders(file(1)).is_empty(),
        "relinquished after the rebuild"
    );
    assert_eq!(new.holders(file(3))[0].node, NodeId(2));
}

/// A manager of several (makod's manager nodes, `serve_slots`) refuses the slots it
/// does not serve until it begins their rebuild (a client that saw the slot move first
/// asks again), and a failed node whose recovery released it before the rebuild began
/// is not waited for (the release would otherwise be lost, and the slot refused for
/// good).
#[test]
fn a_manager_serves_its_slots_only_and_counts_a_release_made_before_the_rebuild() {
    let m = TokenManager::default();
    let before = ManagerMap {
        nodes: vec![NEW, OLD],
    };
    let after = ManagerMap {
        nodes: vec![NEW, NEW],
    };
    let in_slot = |slot: usize| {
        (1..)
            .map(inode)
            .find(|r| before.slot_for(r) == slot)
            .expect("a resource of the slot")
    };
    let (mine, lost) = (in_slot(0), in_slot(1));
    m.serve_slots(before.clone(), NEW);
    assert_eq!(m.serving(), Some(before));
    m.acquire(AcquireRequest::whole(NodeId(1), mine, Ro))
        .expect("its own slot is served");
    assert!(
        refused(&m, AcquireRequest::whole(NodeId(1), lost, Ro)),
        "a slot not taken over yet is refused"
    );
    // The failed node's recovery comes first, then the takeover.
    m.release_node(OLD);
    m.begin_rebuild(after.clone(), 1, &[NodeId(1), NodeId(2)], &[OLD]);
    assert_eq!(m.serving(), Some(after));
    assert_eq!(
        m.rebuild_waits_for(),
        (vec![NodeId(1), NodeId(2)], Vec::new()),
        "the failed node was released before: only the reports are waited for"
    );
    assert!(refused(&m, AcquireRequest::whole(NodeId(2), lost, Ro)));
    assert!(m.apply_report(NodeId(1), &[]));
    assert!(m.apply_report(NodeId(2), &[]));
    assert!(!m.is_rebuilding());
    m.acquire(AcquireRequest::whole(NodeId(2), lost, Xw))
        .expect("the rebuilt slot is served");
    m.acquire(AcquireRequest::whole(NodeId(1), mine, Ro))
        .expect("its own slot still is");
}

/// A transport to which one node is dead: calls to it are `Unreachable`.
struct DeadNode(Arc<dyn Transport>, NodeId);

impl Transport for DeadNode {
    fn local_node(&self) -> NodeId {
        self.0.local_node()
    }
    fn call(
        &self,
        to: NodeId,
        service: ServiceId,
        request: Vec<u8>,
        options: mako_rt::CallOptions,
    ) -> Result<Vec<u8>, mako_rt::TransportError> {
        if to == self.1 {
            return Err(mako_rt::TransportError::Unreachable {
                node: to,
                reason: "killed".into(),
            });
        }
        self.0.call(to, service, request, options)
    }
}

/// A request to a manager node that does not answer waits for its slot to move
/// (`set_manager_failover_wait`) and then goes to the new node; without the wait
/// (one manager node: nowhere to move) it fails at once, as does one whose wait runs
/// out.
#[test]
fn a_request_to_a_dead_manager_waits_for_its_slot_to_move() {
    let registry = Registry::new();
    let new = Arc::new(TokenManager::default());
    registry.register(
        NEW,
        ServiceId::TokenManager,
        Arc::new(ManagerService {
            manager: new.clone(),
        }),
    );
    let me = NodeId(1);
    let transport: Arc<dyn Transport> = Arc::new(DeadNode(
        Arc::new(InProcessTransport::new(me, registry.clone())),
        OLD,
    ));
    let client = TokenClient::new(
        me,
        transport,
        ManagerMap::single(OLD),
        TokenClientLimits::default(),
    );
    // No wait: the transport's error at once.
    let e = client
        .acquire(inode(1), Ro, ByteRange::WHOLE, ByteRange::WHOLE)
        .expect_err("the only manager is dead");
    assert!(matches!(e, TokenError::Transport(_)), "{e}");
    // A wait that runs out fails the same way.
    client.set_manager_failover_wait(Duration::from_millis(50));
    let e = client
        .acquire(inode(1), Ro, ByteRange::WHOLE, ByteRange::WHOLE)
        .expect_err("nothing moves the slot");
    assert!(matches!(e, TokenError::Transport(_)), "{e}");
    // The slot moves while the request waits: it is served by the new node.
    client.set_manager_failover_wait(Duration::from_secs(600));
    let asking = {
        let client = client.clone();
        std::thread::spawn(move || client.acquire(inode(1), Ro, ByteRange::WHOLE, ByteRange::WHOLE))
    };
    std::thread::sleep(Duration::from_millis(20));
    client.set_managers(ManagerMap::single(NEW));
    asking
        .join()
        .expect("the acquire's thread")
        .expect("granted by the slot's new node");
    wait_for("the new manager to record the grant", || {
        new.holders(inode(1)).iter().any(|h| h.node == me)
    });
}
