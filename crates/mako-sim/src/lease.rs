//! Leases, expel and the lease fence in the simulation (issue 14; docs/cluster.md
//! "Leases, expel and fencing"). The state machines are mako-cluster's own
//! (`NodeLease` on every node, `LeaseMonitor` on the cluster manager), driven by the
//! simulated clock; around them, what makod's `lease.rs` does with real threads, as
//! simulated tasks:
//!
//! - the cluster manager is the raft leader of the quorum nodes (`quorum`: nodes 0,
//!   1 and 2 of a cluster of three or more, node 0 alone in a smaller one); it starts
//!   on node 0. The replicated state (who leads, the lease records) is shared memory
//!   here, as raft's committed log is to every node; what raft adds is modelled by
//!   messages: a manager grants a lease, or commits an expel, only after a majority
//!   of the quorum answered it (`confirm`, raft's read-index round), so a manager cut
//!   off in a minority, or stopped, grants nothing, not even to itself, and its own
//!   lease runs out; a quorum node whose renewal failed, if a majority of the quorum
//!   (itself included) has lost the manager too, takes the lead (`elect`: a new term,
//!   the lowest-numbered such node first) and gives every node a whole lease from
//!   then, as makod's watch does when its node becomes the leader;
//! - every node renews its lease with the cluster manager every
//!   `failureDetectionTime / 5` (`renew_loop`, a task of the node: a paused node does
//!   not renew), and at once with the new one after a failed renewal;
//! - the manager watches every lease (`watch_loop`, on every node, working on the
//!   manager's), pings a node whose lease ran out, and after `minMissedPingTimeout`
//!   of unanswered pings expels it: the expel is recorded (the replicated
//!   configuration's lease record) and the expel hook runs on the manager's node
//!   (the runner's recovery of the node by a survivor, after moving the token manager
//!   off it if it hosted it);
//! - every disk of a mount is behind the node's lease (`LeaseDisk`, the copy of
//!   makod's `FencedDisk::check`): an I/O is refused once the lease ran out, the node
//!   was expelled, or it rejoined at a newer epoch than the mount's;
//! - the oracle: a write that reaches a disk from a mount whose lease epoch was
//!   expelled before it landed is recorded (and kept off the disk, so the run goes
//!   on): `SimLeases::fenced_writes` must stay empty.

use crate::net::SimNet;
use crate::sched::Sim;
use mako_cluster::lease::{LeaseMonitor, LeaseReply, LeaseRequest, LeaseTimes, NodeLease, Watch};
use mako_rt::{CallOptions, Clock, NodeId, Service, ServiceId, Transport};
use parking_lot::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// The replicated configuration's lease record of one node.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LeaseRecord {
    pub epoch: u64,
    /// When the manager expelled epoch `epoch` (simulated time), and why.
    pub expelled: Option<(Duration, String)>,
    /// The cluster manager that expelled it.
    pub expelled_by: u32,
}

/// A cluster manager that took the lead from another (`SimLeases::takeovers`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Takeover {
    pub term: u64,
    pub from: u32,
    pub to: u32,
    /// Simulated time of the takeover, and of the old manager's last grant.
    pub at: Duration,
    pub last_grant: Duration,
}

/// A write that reached a disk after its mount's lease epoch was expelled.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FencedWrite {
    pub node: u32,
    pub epoch: u64,
    pub disk: String,
    pub offset: u64,
    pub len: usize,
    pub at: Duration,
    pub expelled_at: Duration,
}

/// Runs after an expel (node, expelled epoch), on a task of the manager.
pub type ExpelHook = Arc<dyn Fn(u32, u64) + Send + Sync>;

pub struct SimLeases {
    pub times: LeaseTimes,
    sim: Sim,
    clock: Arc<dyn Clock>,
    net: Arc<SimNet>,
    /// Each node's current lease (replaced when it rejoins).
    leases: Mutex<Vec<Arc<NodeLease>>>,
    /// The quorum nodes: the cluster manager is one of them, elected by a majority.
    quorum: Vec<u32>,
    /// The cluster manager last elected and its term (raft's committed leadership).
    manager: Mutex<(u32, u64)>,
    /// Per node, whom it believes to lead, at which term: a deposed manager cut off
    /// from the others still believes it leads.
    views: Mutex<Vec<(u32, u64)>>,
    /// Per node: when (simulated time) the manager last granted its renewal.
    last_grant: Mutex<Vec<Duration>>,
    takeovers: Mutex<Vec<Takeover>>,
    /// Per node, its watch of the others while it is the manager (a new one from each
    /// takeover: a new manager gives every node a whole lease).
    monitors: Vec<Mutex<LeaseMonitor>>,
    records: Mutex<Vec<LeaseRecord>>,
    fenced_writes: Mutex<Vec<FencedWrite>>,
    on_expel: Mutex<Option<ExpelHook>>,
    /// Nodes whose file system panicked (`fs_panicked`), with the reason: they ask to
    /// leave instead of renewing, and do not answer pings, until they rejoin.
    panicked: Mutex<Vec<Option<String>>>,
    stop: AtomicBool,
    /// TEST ONLY: false lets a manager lease without a majority's confirmation
    /// (`ClusterConfig::lease_quorum_check`, the checker's test).
    pub quorum_check: AtomicBool,
}

impl SimLeases {
    /// Leases for `nodes` nodes, every one granted epoch 1 from time zero (as if each
    /// had joined and renewed), watched by the manager from then.
    pub fn new(
        sim: &Sim,
        clock: Arc<dyn Clock>,
        net: Arc<SimNet>,
        nodes: u32,
        times: LeaseTimes,
    ) -> Arc<SimLeases> {
        let monitors = (0..nodes)
            .map(|_| Mutex::new(LeaseMonitor::new(clock.clone(), times)))
            .collect::<Vec<_>>();
        for n in 1..nodes {
            monitors[0].lock().watch(NodeId(n));
        }
        let quorum = if nodes >= 3 { vec![0, 1, 2] } else { vec![0] };
        let leases = (0..nodes)
            .map(|_| {
                let l = Arc::new(NodeLease::new(clock.clone(), times));
                l.rejoined(1, clock.monotonic());
                l
            })
            .collect();
        let leases = Arc::new(SimLeases {
            times,
            sim: sim.clone(),
            clock,
            net: net.clone(),
            leases: Mutex::new(leases),
            quorum,
            manager: Mutex::new((0, 1)),
            views: Mutex::new(vec![(0, 1); nodes as usize]),
            last_grant: Mutex::new(vec![Duration::ZERO; nodes as usize]),
            takeovers: Mutex::new(Vec::new()),
            monitors,
            records: Mutex::new(
                (0..nodes)
                    .map(|_| LeaseRecord {
                        epoch: 1,
                        expelled: None,
                        expelled_by: 0,
                    })
                    .collect(),
            ),
            fenced_writes: Mutex::new(Vec::new()),
            on_expel: Mutex::new(None),
            panicked: Mutex::new(vec![None; nodes as usize]),
            stop: AtomicBool::new(false),
            quorum_check: AtomicBool::new(true),
        });
        // As makod's fence: token, metanode and space requests of an expelled node
        // are refused until it rejoins.
        let weak = Arc::downgrade(&leases);
        net.registry().set_admit(Arc::new(move |from: NodeId, _| {
            let Some(leases) = weak.upgrade() else {
                return Ok(());
            };
            let records = leases.records.lock();
            match records
                .get(from.0 as usize)
                .and_then(|r| r.expelled.as_ref())
            {
                Some((_, why)) => Err(format!("{from} was expelled ({why}); it must rejoin")),
                None => Ok(()),
            }
        }));
        for n in 0..nodes {
            net.registry().register(
                NodeId(n),
                ServiceId::Lease,
                Arc::new(LeaseService {
                    leases: leases.clone(),
                    me: n,
                }),
            );
        }
        leases
    }

    pub fn set_on_expel(&self, hook: ExpelHook) {
        *self.on_expel.lock() = Some(hook);
    }

    /// Start every node's renewal and the manager's watch (from a task).
    pub fn start(self: &Arc<Self>) {
        let n = self.leases.lock().len() as u32;
        for node in 0..n {
            self.start_renewal(node);
        }
        for node in self.quorum.clone() {
            let me = self.clone();
            self.sim
                .spawn_in(Some(node), format!("lease-watch-n{node}"), move || {
                    me.watch_loop(node)
                });
        }
    }

    /// The cluster manager now.
    pub fn manager(&self) -> u32 {
        self.manager.lock().0
    }

    /// Every change of cluster manager so far.
    pub fn takeovers(&self) -> Vec<Takeover> {
        self.takeovers.lock().clone()
    }

    /// Node `n`'s view of who leads: (manager, term).
    fn view(&self, n: u32) -> (u32, u64) {
        self.views.lock()[n as usize]
    }

    /// Node `n` heard from node `from` (raft messages carry the term): it adopts a
    /// newer leader `from` knows of.
    fn learn(&self, n: u32, from: u32) {
        let mut v = self.views.lock();
        if v[from as usize].1 > v[n as usize].1 {
            v[n as usize] = v[from as usize];
        }
    }

    /// Whether node `me` still leads, confirmed by a majority of the quorum answering
    /// it now (itself included): raft's round of heartbeats before a leader serves a
    /// read or commits. A node cut off in a minority confirms nothing; one that hears
    /// of a newer term learns it was deposed.
    fn confirm(&self, me: u32) -> bool {
        self.confirm_for(me) == Some(true)
    }

    /// `confirm`, and for a lease grant: `Some(false)` when node `me` leads on without
    /// a majority, which only the checker's test allows (`quorum_check` off: a manager
    /// granting from its local copy of the configuration, which knows nothing of what
    /// the majority decided since, such as its own expel).
    fn confirm_for(&self, me: u32) -> Option<bool> {
        if self.view(me).0 != me {
            return None;
        }
        let need = self.quorum.len() / 2 + 1;
        let mut have = usize::from(self.quorum.contains(&me));
        for &q in &self.quorum {
            if have >= need {
                break;
            }
            if q == me {
                continue;
            }
            if matches!(
                self.call(me, q, &LeaseRequest::Ping),
                Some(LeaseReply::Pong)
            ) {
                self.learn(me, q);
                have += 1;
            }
        }
        if self.view(me).0 != me {
            return None;
        }
        if have >= need {
            Some(true)
        } else if !self.quorum_check.load(Ordering::Relaxed) {
            Some(false)
        } else {
            None
        }
    }

    /// Node `me` asks every quorum node it reaches who leads (after a failed renewal).
    fn refresh_view(&self, me: u32) {
        for &q in &self.quorum {
            if q != me
                && matches!(
                    self.call(me, q, &LeaseRequest::Ping),
                    Some(LeaseReply::Pong)
                )
            {
                self.learn(me, q);
            }
        }
    }

    /// Node `me`, a quorum node whose renewal with manager `old` failed, stands for
    /// election: it takes the lead (a new term) if a majority of the quorum (itself
    /// included), `old` left out, answers it and has lost `old` too (no grant from it
    /// for a renewal interval: raft's pre-vote, so that one node's bad link does not
    /// depose a manager the others reach). The voters learn the new leader; the others
    /// learn it when they next hear from one that knows.
    fn elect(&self, me: u32, old: u32) {
        if !self.quorum.contains(&me) || self.view(me).0 != old || me == old {
            return;
        }
        let now = self.clock.monotonic();
        let lost = |n: u32| {
            now.saturating_sub(self.last_grant.lock()[n as usize]) >= self.times.renew_interval()
        };
        if !lost(me) {
            return;
        }
        let need = self.quorum.len() / 2 + 1;
        let mut voters = vec![me];
        for &q in &self.quorum {
            if voters.len() >= need {
                break;
            }
            if q == me || q == old {
                continue;
            }
            if matches!(
                self.call(me, q, &LeaseRequest::Ping),
                Some(LeaseReply::Pong)
            ) && lost(q)
                && self.view(q).0 == old
            {
                voters.push(q);
            }
        }
        if voters.len() < need {
            return;
        }
        let mut m = self.manager.lock();
        if m.0 != old {
            return;
        }
        *m = (me, m.1 + 1);
        let view = *m;
        drop(m);
        {
            let mut v = self.views.lock();
            for q in &voters {
                v[*q as usize] = view;
            }
        }
        let last_grant = self.last_grant.lock()[old as usize];
        self.takeovers.lock().push(Takeover {
            term: view.1,
            from: old,
            to: me,
            at: self.clock.monotonic(),
            last_grant,
        });
    }

    /// Stop the renewal and watch tasks (they end at their next wake-up).
    pub fn stop(&self) {
        self.stop.store(true, Ordering::SeqCst);
    }

    fn start_renewal(self: &Arc<Self>, node: u32) {
        let lease = self.leases.lock()[node as usize].clone();
        let me = self.clone();
        self.sim
            .spawn_in(Some(node), format!("lease-renew-n{node}"), move || {
                me.renew_loop(node, lease)
            });
    }

    /// Node `node`'s current lease.
    pub fn lease(&self, node: u32) -> Arc<NodeLease> {
        self.leases.lock()[node as usize].clone()
    }

    pub fn record(&self, node: u32) -> LeaseRecord {
        self.records.lock()[node as usize].clone()
    }

    /// Writes that reached a disk from an expelled mount (must be none).
    pub fn fenced_writes(&self) -> Vec<FencedWrite> {
        self.fenced_writes.lock().clone()
    }

    /// When (simulated time) lease epoch `epoch` of `node` was expelled, if it was.
    pub fn expelled_at(&self, node: u32, epoch: u64) -> Option<Duration> {
        let r = &self.records.lock()[node as usize];
        if r.epoch > epoch {
            // A newer epoch exists: the old one was expelled before (or the node
            // rejoined, which only happens after an expel).
            return Some(Duration::ZERO);
        }
        match &r.expelled {
            Some((at, _)) if r.epoch == epoch => Some(*at),
            _ => None,
        }
    }

    /// The oracle of the fence: a write of `node`'s mount made at `epoch` lands now on
    /// `disk`. False (and recorded) if that epoch was expelled: the write must not
    /// reach the disk.
    pub fn admit_write(&self, node: u32, epoch: u64, disk: &str, offset: u64, len: usize) -> bool {
        let Some(expelled_at) = self.expelled_at(node, epoch) else {
            return true;
        };
        self.fenced_writes.lock().push(FencedWrite {
            node,
            epoch,
            disk: disk.to_string(),
            offset,
            len,
            at: self.clock.monotonic(),
            expelled_at,
        });
        false
    }

    /// Node `node`'s file system panicked (`mako_fs::core::FsPanic`): as makod's
    /// `Leases::fs_panicked`, it sends `LeaseRequest::Leave` instead of its renewals
    /// (and answers no ping), so the manager expels it at once and has a survivor
    /// recover it.
    pub fn fs_panicked(&self, node: u32, why: &str) {
        let mut p = self.panicked.lock();
        if p[node as usize].is_none() {
            p[node as usize] = Some(format!("its file system panicked: {why}"));
        }
    }

    fn silent(&self, node: u32) -> bool {
        self.panicked.lock()[node as usize].is_some()
    }

    /// Manager `by` expels `node` now (`reason`), unless it is already, and runs the
    /// expel hook on a task of its node. The caller confirmed its lead (`confirm`).
    fn expel(&self, by: u32, n: u32, reason: String) {
        let epoch = {
            let mut r = self.records.lock();
            let rec = &mut r[n as usize];
            if rec.expelled.is_some() {
                return;
            }
            rec.expelled = Some((self.clock.monotonic(), reason));
            rec.expelled_by = by;
            rec.epoch
        };
        self.monitors[by as usize].lock().forget(NodeId(n));
        // Calls waiting for an answer from the expelled node give up (as makod's
        // transport does at an expel): a token manager node paused past its lease no
        // longer holds its callers for their whole call deadline.
        self.net.give_up_on(NodeId(n));
        if let Some(hook) = self.on_expel.lock().clone() {
            self.sim
                .spawn_in(Some(by), format!("expel-n{n}"), move || hook(n, epoch));
        }
    }

    /// Node `node`, expelled, rejoins: a new epoch, a new lease held from now, watched
    /// again, renewing again (from a task). Returns the new epoch.
    pub fn rejoin(self: &Arc<Self>, node: u32) -> u64 {
        let epoch = {
            let mut r = self.records.lock();
            let rec = &mut r[node as usize];
            rec.epoch += 1;
            rec.expelled = None;
            rec.epoch
        };
        self.net.stop_giving_up_on(NodeId(node));
        self.panicked.lock()[node as usize] = None;
        let lease = Arc::new(NodeLease::new(self.clock.clone(), self.times));
        let now = self.clock.monotonic();
        lease.rejoined(epoch, now);
        self.last_grant.lock()[node as usize] = now;
        self.leases.lock()[node as usize] = lease;
        // Its rejoin is a raft write: it knows the leader from then.
        let view = *self.manager.lock();
        self.views.lock()[node as usize] = view;
        self.monitors[view.0 as usize].lock().watch(NodeId(node));
        self.start_renewal(node);
        epoch
    }

    fn call(&self, from: u32, to: u32, request: &LeaseRequest) -> Option<LeaseReply> {
        let t = self.net.transport(NodeId(from));
        let options = CallOptions {
            deadline: self.times.renew_interval(),
            ..CallOptions::default()
        };
        mako_rt::call(
            &*t as &dyn Transport,
            NodeId(to),
            ServiceId::Lease,
            request,
            options,
        )
        .ok()
    }

    fn renew_loop(&self, node: u32, lease: Arc<NodeLease>) {
        while !self.stop.load(Ordering::SeqCst) {
            // A rejoin replaced the lease: a new loop renews the new one.
            if !Arc::ptr_eq(&self.leases.lock()[node as usize], &lease) {
                return;
            }
            let sent = lease.now();
            let epoch = lease.epoch();
            let leaving = self.panicked.lock()[node as usize].clone();
            let request = match leaving {
                Some(reason) => LeaseRequest::Leave { epoch, reason },
                None => LeaseRequest::Renew { epoch },
            };
            let manager = self.view(node).0;
            let renewed = match self.call(node, manager, &request) {
                Some(LeaseReply::Granted { epoch }) => {
                    lease.granted(epoch, sent);
                    self.last_grant.lock()[node as usize] = sent;
                    true
                }
                Some(
                    LeaseReply::Expelled { epoch, by, reason }
                    | LeaseReply::Recovering { epoch, by, reason },
                ) => {
                    lease.expelled(epoch, by, reason);
                    true
                }
                _ => false,
            };
            if renewed {
                mako_diag::sched::sleep(self.times.renew_interval());
            } else {
                // The manager did not answer: stand for election if it is lost, ask
                // who leads now, and try again soon.
                self.elect(node, manager);
                self.refresh_view(node);
                mako_diag::sched::sleep(self.times.renew_interval() / 4);
            }
        }
    }

    /// Node `me`'s watch of every lease, while it is the cluster manager.
    fn watch_loop(&self, me: u32) {
        let mut was_manager = self.view(me).0 == me;
        while !self.stop.load(Ordering::SeqCst) {
            let manager = self.view(me).0 == me;
            if manager && !was_manager {
                // A new manager gives every node a whole lease from now.
                let mut m = LeaseMonitor::new(self.clock.clone(), self.times);
                let records = self.records.lock();
                for (n, r) in records.iter().enumerate() {
                    if n as u32 != me && r.expelled.is_none() {
                        m.watch(NodeId(n as u32));
                    }
                }
                *self.monitors[me as usize].lock() = m;
            }
            was_manager = manager;
            if manager {
                self.watch_once(me);
            }
            mako_diag::sched::sleep(self.times.renew_interval() / 2);
        }
    }

    fn watch_once(&self, me: u32) {
        let monitor = &self.monitors[me as usize];
        let watched = monitor.lock().watched();
        for node in watched {
            let n = node.0;
            if self.records.lock()[n as usize].expelled.is_some() {
                monitor.lock().forget(node);
                continue;
            }
            let step = monitor.lock().step(node);
            match step {
                Watch::Active => {}
                Watch::Arbitrating => {
                    let answered = matches!(
                        self.call(me, n, &LeaseRequest::Ping),
                        Some(LeaseReply::Pong)
                    );
                    monitor.lock().pinged(node, answered);
                }
                Watch::Expel => {
                    // An expel is a raft write: only a confirmed manager commits it.
                    if !self.confirm(me) {
                        return;
                    }
                    let silent = monitor.lock().silent_for(node).unwrap_or_default();
                    let reason = format!(
                        "no lease renewal for {silent:?} (failureDetectionTime {:?}) and no answer to pings for minMissedPingTimeout {:?}",
                        self.times.lease, self.times.missed_ping
                    );
                    self.expel(me, n, reason);
                }
            }
        }
    }
}

/// The lease service of one node: renewals (answered by the cluster manager, once a
/// majority of the quorum confirmed it leads) and the manager's pings (answered by
/// anyone).
struct LeaseService {
    leases: Arc<SimLeases>,
    me: u32,
}

impl Service for LeaseService {
    fn handle(&self, from: NodeId, request: &[u8]) -> Vec<u8> {
        let l = &self.leases;
        let reply = match mako_rt::transport::decode::<LeaseRequest>("lease request", request) {
            // A node whose file system panicked does not answer (`fs_panicked`).
            Ok(LeaseRequest::Ping) if l.silent(self.me) => LeaseReply::NotManager { leader: None },
            Ok(LeaseRequest::Ping) => LeaseReply::Pong,
            Ok(LeaseRequest::Renew { .. } | LeaseRequest::Leave { .. })
                if l.view(self.me).0 != self.me =>
            {
                LeaseReply::NotManager {
                    leader: Some(NodeId(l.view(self.me).0)),
                }
            }
            // Not confirmed by a majority (cut off, or deposed meanwhile): no grant.
            Ok(LeaseRequest::Leave { .. }) if !l.confirm(self.me) => {
                LeaseReply::NotManager { leader: None }
            }
            Ok(LeaseRequest::Leave { epoch, reason }) => {
                if l.records.lock()[from.0 as usize].epoch == epoch {
                    l.expel(self.me, from.0, reason);
                }
                let rec = l.records.lock()[from.0 as usize].clone();
                let (_, reason) = rec.expelled.unwrap_or_default();
                LeaseReply::Expelled {
                    epoch: rec.epoch,
                    by: NodeId(rec.expelled_by),
                    reason,
                }
            }
            Ok(LeaseRequest::Renew { .. }) => {
                let rec = l.records.lock()[from.0 as usize].clone();
                let confirmed = l.confirm_for(self.me);
                match rec.expelled {
                    // Not confirmed by a majority (cut off, or deposed meanwhile): no
                    // grant.
                    _ if confirmed.is_none() => LeaseReply::NotManager { leader: None },
                    // TEST ONLY: a manager without a majority grants from its local
                    // copy of the configuration, which knows of no expel since.
                    Some(_) if confirmed == Some(false) => LeaseReply::Granted { epoch: rec.epoch },
                    Some((_, reason)) => LeaseReply::Expelled {
                        epoch: rec.epoch,
                        by: NodeId(rec.expelled_by),
                        reason,
                    },
                    None => {
                        l.monitors[self.me as usize].lock().renewed(from);
                        LeaseReply::Granted { epoch: rec.epoch }
                    }
                }
            }
            Err(_) => LeaseReply::NotManager { leader: None },
        };
        mako_rt::transport::encode("lease reply", &reply).unwrap_or_default()
    }
}

/// How a mount's disks are behind its node's lease.
#[derive(Clone)]
pub struct MountLease {
    pub leases: Arc<SimLeases>,
    pub node: u32,
    /// The lease epoch the mount was made at.
    pub epoch: u64,
    /// TEST ONLY: false turns the node's own fence off (the checker's test): its I/O
    /// is no longer refused after its lease ran out; the oracle still sees it.
    pub enforce: bool,
}

impl MountLease {
    /// makod's `FencedDisk::check`: may this mount do I/O now?
    pub fn check(&self, disk: &str) -> Result<(), mako_disk::DiskError> {
        if !self.enforce {
            return Ok(());
        }
        let lease = self.leases.lease(self.node);
        let refuse = |reason: String| mako_disk::DiskError::Fenced {
            disk: disk.to_string(),
            by: "this node's lease".into(),
            reason,
        };
        match lease.check() {
            Ok(e) if e == self.epoch => Ok(()),
            Ok(e) => Err(refuse(format!(
                "mounted at lease epoch {}, the node rejoined at epoch {e} since",
                self.epoch
            ))),
            Err(f) => Err(refuse(f.to_string())),
        }
    }
}
