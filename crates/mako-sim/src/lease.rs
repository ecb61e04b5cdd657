//! Leases, expel and the lease fence in the simulation (issue 14; docs/cluster.md
//! "Leases, expel and fencing"). The state machines are mako-cluster's own
//! (`NodeLease` on every node, `LeaseMonitor` on the cluster manager), driven by the
//! simulated clock; around them, what makod's `lease.rs` does with real threads, as
//! simulated tasks:
//!
//! - every node renews its lease with the cluster manager (node 0) every
//!   `failureDetectionTime / 5` (`renew_loop`, a task of the node: a paused node does
//!   not renew);
//! - the manager watches every lease (`watch_loop`), pings a node whose lease ran
//!   out, and after `minMissedPingTimeout` of unanswered pings expels it: the expel is
//!   recorded (the replicated configuration's lease record) and the expel hook runs
//!   (the runner's recovery of the node by a survivor);
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
    monitor: Mutex<LeaseMonitor>,
    records: Mutex<Vec<LeaseRecord>>,
    fenced_writes: Mutex<Vec<FencedWrite>>,
    on_expel: Mutex<Option<ExpelHook>>,
    /// Nodes whose file system panicked (`fs_panicked`), with the reason: they ask to
    /// leave instead of renewing, and do not answer pings, until they rejoin.
    panicked: Mutex<Vec<Option<String>>>,
    stop: AtomicBool,
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
        let mut monitor = LeaseMonitor::new(clock.clone(), times);
        let leases = (0..nodes)
            .map(|n| {
                if n != 0 {
                    monitor.watch(NodeId(n));
                }
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
            monitor: Mutex::new(monitor),
            records: Mutex::new(
                (0..nodes)
                    .map(|_| LeaseRecord {
                        epoch: 1,
                        expelled: None,
                    })
                    .collect(),
            ),
            fenced_writes: Mutex::new(Vec::new()),
            on_expel: Mutex::new(None),
            panicked: Mutex::new(vec![None; nodes as usize]),
            stop: AtomicBool::new(false),
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
        let me = self.clone();
        self.sim
            .spawn_in(Some(0), "lease-watch", move || me.watch_loop());
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

    /// The manager expels `node` now (`reason`), unless it is already, and runs the
    /// expel hook on a task of its own.
    fn expel(&self, n: u32, reason: String) {
        let epoch = {
            let mut r = self.records.lock();
            let rec = &mut r[n as usize];
            if rec.expelled.is_some() {
                return;
            }
            rec.expelled = Some((self.clock.monotonic(), reason));
            rec.epoch
        };
        self.monitor.lock().forget(NodeId(n));
        if let Some(hook) = self.on_expel.lock().clone() {
            self.sim
                .spawn_in(Some(0), format!("expel-n{n}"), move || hook(n, epoch));
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
        self.panicked.lock()[node as usize] = None;
        let lease = Arc::new(NodeLease::new(self.clock.clone(), self.times));
        lease.rejoined(epoch, self.clock.monotonic());
        self.leases.lock()[node as usize] = lease;
        self.monitor.lock().watch(NodeId(node));
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
            match self.call(node, 0, &request) {
                Some(LeaseReply::Granted { epoch }) => lease.granted(epoch, sent),
                Some(
                    LeaseReply::Expelled { epoch, by, reason }
                    | LeaseReply::Recovering { epoch, by, reason },
                ) => lease.expelled(epoch, by, reason),
                _ => {}
            }
            mako_diag::sched::sleep(self.times.renew_interval());
        }
    }

    fn watch_loop(&self) {
        while !self.stop.load(Ordering::SeqCst) {
            let watched = self.monitor.lock().watched();
            for node in watched {
                let n = node.0;
                if self.records.lock()[n as usize].expelled.is_some() {
                    self.monitor.lock().forget(node);
                    continue;
                }
                let step = self.monitor.lock().step(node);
                match step {
                    Watch::Active => {}
                    Watch::Arbitrating => {
                        let answered =
                            matches!(self.call(0, n, &LeaseRequest::Ping), Some(LeaseReply::Pong));
                        self.monitor.lock().pinged(node, answered);
                    }
                    Watch::Expel => {
                        let silent = self.monitor.lock().silent_for(node).unwrap_or_default();
                        let reason = format!(
                            "no lease renewal for {silent:?} (failureDetectionTime {:?}) and no answer to pings for minMissedPingTimeout {:?}",
                            self.times.lease, self.times.missed_ping
                        );
                        self.expel(n, reason);
                    }
                }
            }
            mako_diag::sched::sleep(self.times.renew_interval() / 2);
        }
    }
}

/// The lease service of one node: renewals (answered by the manager, node 0) and the
/// manager's pings (answered by anyone).
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
            Ok(LeaseRequest::Renew { .. } | LeaseRequest::Leave { .. }) if self.me != 0 => {
                LeaseReply::NotManager {
                    leader: Some(NodeId(0)),
                }
            }
            Ok(LeaseRequest::Leave { epoch, reason }) => {
                if l.records.lock()[from.0 as usize].epoch == epoch {
                    l.expel(from.0, reason);
                }
                let rec = l.records.lock()[from.0 as usize].clone();
                let (_, reason) = rec.expelled.unwrap_or_default();
                LeaseReply::Expelled {
                    epoch: rec.epoch,
                    by: NodeId(0),
                    reason,
                }
            }
            Ok(LeaseRequest::Renew { .. }) => {
                let rec = l.records.lock()[from.0 as usize].clone();
                match rec.expelled {
                    Some((_, reason)) => LeaseReply::Expelled {
                        epoch: rec.epoch,
                        by: NodeId(0),
                        reason,
                    },
                    None => {
                        l.monitor.lock().renewed(from);
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
