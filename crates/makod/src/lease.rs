//! Leases, expel and the lease fence in makod (docs/cluster.md "Leases, expel and
//! fencing"; the state machines are `mako_cluster::lease`).
//!
//! - **Renewal.** Every node's `lease-renew` thread sends `LeaseRequest::Renew` to the
//!   cluster manager (the raft leader) every `failureDetectionTime / 5` on a small
//!   lane; a grant extends the node's lease to `failureDetectionTime` after the
//!   request was *sent*.
//! - **The fence.** Every disk a mounted file system uses is wrapped in [`FencedDisk`]:
//!   each read, write and sync first asks the lease and is refused
//!   (`DiskError::Fenced`, so EIO to the application) once the lease ran out, the
//!   node was expelled, or the node holds a newer epoch than the mount was made at. For
//!   a directly attached disk that is the whole fence; an NSD server also refuses an
//!   expelled node's requests itself ([`LeaseFence`]).
//! - **Expel.** On the cluster manager, the `lease-watch` thread keeps a
//!   `LeaseMonitor` of every node; a node whose lease ran out is pinged (state
//!   "arbitrating"), and after `minMissedPingTimeout` of unanswered pings it is
//!   expelled: a `Command::Expel` through raft (so a new manager knows it), logged as
//!   `node X expelled by Y: reason`, then the expel hook on a thread of its own: the
//!   daemon's `recover_expelled`, which has the node recovered on every file system
//!   (`crate::recovery`: by this node or a survivor that mounts it, else at the next
//!   mount; `mako_fs::recovery::recover_failed_node`: its log replayed, its tokens
//!   released, its regions and inode-map segments freed for others). Until that ends
//!   its renewals are answered `LeaseReply::Recovering`, so it does not rejoin yet.
//! - **Rejoin.** A node told it is expelled stops its I/O, proposes `Command::Rejoin`
//!   (a new epoch) and holds a lease again; its mounts made before stay fenced until
//!   they are unmounted and mounted again.

use mako_cluster::lease::{
    Fenced, LeaseMonitor, LeaseReply, LeaseRequest, LeaseTimes, NodeLease, Watch,
};
use mako_cluster::{Command, Quorum, QuorumError};
use mako_disk::nsd::IoTag;
use mako_disk::{Disk, DiskError};
use mako_rt::{CallOptions, Clock, NodeId, Priority, Service, ServiceId, SystemClock, Transport};
use parking_lot::Mutex;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// How long an acquire waits for a token holder that does not answer
/// (`TokenClient::set_holder_down_wait`): long enough for a failed holder to be
/// detected (`failureDetectionTime`, then `minMissedPingTimeout` of pings), expelled
/// through raft and recovered by a survivor (its log replayed: a minute of margin,
/// plus another lease for a renewal in flight and the watch's ticks), and no longer:
/// a holder that is neither answering nor recovered by then makes the acquire fail
/// with EIO instead of hanging. 2 × 35 + 3 + 60 = 133 s with the defaults.
pub fn holder_down_wait(times: LeaseTimes) -> Duration {
    times.lease * 2 + times.missed_ping + Duration::from_secs(60)
}

/// This node's lease, its renewal and (on the manager) the watch of the others.
pub struct Leases {
    me: NodeId,
    quorum: Arc<Quorum>,
    transport: Arc<dyn Transport>,
    pub lease: Arc<NodeLease>,
    monitor: Mutex<LeaseMonitor>,
    /// Nodes the manager is pinging now (for `mako node show`).
    arbitrating: Mutex<BTreeSet<NodeId>>,
    /// What runs after an expel (the daemon's recovery of the node on the file systems
    /// this node mounts), on its own thread.
    on_expel: Mutex<Option<ExpelHook>>,
    /// On the cluster manager: nodes being expelled or recovered now. Their renewals
    /// are answered [`LeaseReply::Recovering`], so they do not rejoin (and mount, and
    /// replay their own log) while a survivor replays it.
    recovering: Arc<Mutex<BTreeSet<NodeId>>>,
    /// On the cluster manager: who recovered each expelled node, per file system, at
    /// which lease epoch (`Daemon::recover_expelled`; for `mako node show`).
    recovered: Mutex<BTreeMap<NodeId, (u64, String)>>,
    /// On the cluster manager: expels whose proposal timed out with its outcome
    /// unknown (lease epoch, reason). If one commits after all, the watch finds the
    /// node expelled by this node and starts its recovery then.
    expel_unknown: Mutex<BTreeMap<NodeId, (u64, String)>>,
    /// A file system panicked on this node (`fs_panicked`): the reason, sent to the
    /// manager in `LeaseRequest::Leave` instead of renewals until it answers that this
    /// node was expelled.
    leaving: Mutex<Option<String>>,
    /// This node's rejoin under way: the lease epoch it was expelled at, when it
    /// first tried, and how many tries so far (for the log).
    rejoining: Mutex<Option<(u64, std::time::Instant, u32)>>,
    stop: Arc<AtomicBool>,
}

/// Called with the expelled node and its lease epoch once the expel is committed.
pub type ExpelHook = Arc<dyn Fn(NodeId, u64) + Send + Sync>;

impl Leases {
    /// Registers the lease service and starts the renewal and watch threads.
    pub fn start(
        me: NodeId,
        quorum: Arc<Quorum>,
        transport: Arc<dyn Transport>,
        registry: &mako_rt::Registry,
        times: LeaseTimes,
        stop: Arc<AtomicBool>,
    ) -> std::io::Result<(Arc<Leases>, Vec<JoinHandle<()>>)> {
        let clock: Arc<dyn Clock> = Arc::new(SystemClock::new());
        let leases = Arc::new(Leases {
            me,
            quorum,
            transport,
            lease: Arc::new(NodeLease::new(clock.clone(), times)),
            monitor: Mutex::new(LeaseMonitor::new(clock, times)),
            arbitrating: Mutex::new(BTreeSet::new()),
            on_expel: Mutex::new(None),
            recovering: Arc::new(Mutex::new(BTreeSet::new())),
            recovered: Mutex::new(BTreeMap::new()),
            expel_unknown: Mutex::new(BTreeMap::new()),
            leaving: Mutex::new(None),
            rejoining: Mutex::new(None),
            stop,
        });
        registry.register(me, ServiceId::Lease, Arc::new(LeaseService(leases.clone())));
        let renew = {
            let l = leases.clone();
            std::thread::Builder::new()
                .name("lease-renew".into())
                .spawn(move || l.renew_loop())?
        };
        let watch = {
            let l = leases.clone();
            std::thread::Builder::new()
                .name("lease-watch".into())
                .spawn(move || l.watch_loop())?
        };
        Ok((leases, vec![renew, watch]))
    }

    fn times(&self) -> LeaseTimes {
        self.lease.times()
    }

    fn sleep(&self, d: Duration) {
        let end = std::time::Instant::now() + d;
        while !self.stop.load(Ordering::SeqCst) {
            let now = std::time::Instant::now();
            if now >= end {
                return;
            }
            std::thread::sleep((end - now).min(Duration::from_millis(50)));
        }
    }

    fn call(&self, to: NodeId, request: &LeaseRequest) -> Result<LeaseReply, String> {
        mako_rt::transport::call(
            &*self.transport,
            to,
            ServiceId::Lease,
            request,
            CallOptions {
                priority: Priority::Small,
                deadline: self.times().renew_interval(),
            },
        )
        .map_err(|e| e.to_string())
    }

    /// Pings `nodes` at once (one renewal interval to answer); true for each that
    /// answered.
    fn ping_all(&self, nodes: Vec<NodeId>) -> Vec<bool> {
        let Ok(ping) = mako_rt::transport::encode("lease ping", &LeaseRequest::Ping) else {
            return vec![false; nodes.len()];
        };
        let calls = nodes
            .iter()
            .map(|n| (*n, ServiceId::Lease, ping.clone()))
            .collect();
        self.transport
            .call_many(
                calls,
                CallOptions {
                    priority: Priority::Small,
                    deadline: self.times().renew_interval(),
                },
            )
            .into_iter()
            .map(|r| {
                matches!(
                    r.and_then(|b| mako_rt::transport::decode::<LeaseReply>("lease reply", &b)),
                    Ok(LeaseReply::Pong)
                )
            })
            .collect()
    }

    /// Renews this node's lease every renewal interval, for as long as makod runs.
    fn renew_loop(&self) {
        while !self.stop.load(Ordering::SeqCst) {
            self.renew_once();
            self.sleep(self.times().renew_interval());
        }
    }

    /// File system `fs` panicked on this node (`mako_fs::core::FsPanic`: it cannot
    /// write its recovery log): the node asks the cluster manager to expel it at once
    /// (`LeaseRequest::Leave`, sent instead of its renewals, at once and then every
    /// renewal interval), so that a survivor replays its log and releases its tokens;
    /// then it rejoins at a new epoch, its mounts made before stay fenced (EIO) until
    /// mounted again.
    pub fn fs_panicked(self: &Arc<Self>, fs: &str, why: &str) {
        {
            let mut l = self.leaving.lock();
            if l.is_some() {
                return;
            }
            *l = Some(format!("file system {fs} panicked on it: {why}"));
        }
        tracing::error!(
            "file system {fs} panicked on this node, {}: asking the cluster manager to expel \
             this node so that a survivor replays its recovery log",
            self.me
        );
        // Not on the thread that met the error (it may hold the file system's locks).
        let me = self.clone();
        if let Err(e) = std::thread::Builder::new()
            .name("lease-leave".into())
            .spawn(move || me.renew_once())
        {
            tracing::warn!("no thread to ask for the expel now ({e}); the renewal thread will");
        }
    }

    fn renew_once(&self) {
        let Some((leader, _)) = self.quorum.leader() else {
            return;
        };
        let sent = self.lease.now();
        let epoch = self.lease.epoch();
        let request = match self.leaving.lock().clone() {
            Some(reason) => LeaseRequest::Leave { epoch, reason },
            None => LeaseRequest::Renew { epoch },
        };
        match self.call(leader, &request) {
            Ok(LeaseReply::Granted { epoch }) => {
                if self.lease.granted(epoch, sent) {
                    *self.rejoining.lock() = None;
                    tracing::warn!(
                        "this node, {}, rejoined the cluster at lease epoch {epoch} (its rejoin \
                         committed after its proposal gave up); file systems mounted before \
                         the expel stay fenced until mounted again",
                        self.me
                    );
                }
            }
            Ok(LeaseReply::Expelled { epoch, by, reason }) => {
                if !matches!(self.lease.check(), Err(Fenced::Expelled { .. })) {
                    tracing::error!(
                        "this node, {}, was expelled by {by} (lease epoch {epoch}): {reason}; \
                         its disk I/O is stopped, its mounts return EIO until they are mounted \
                         again",
                        self.me
                    );
                }
                self.lease.expelled(epoch, by, reason);
                // Asked to leave, and left: renew again after the rejoin.
                *self.leaving.lock() = None;
                self.rejoin(epoch);
            }
            Ok(LeaseReply::Recovering { epoch, by, reason }) => {
                if !matches!(self.lease.check(), Err(Fenced::Expelled { .. })) {
                    tracing::error!(
                        "this node, {}, was expelled by {by} (lease epoch {epoch}): {reason}; \
                         its disk I/O is stopped; it rejoins once a survivor has replayed its log",
                        self.me
                    );
                }
                self.lease.expelled(epoch, by, reason);
            }
            Ok(LeaseReply::NotManager { .. }) | Ok(LeaseReply::Pong) => {}
            Err(e) => tracing::debug!("lease renewal with {leader} failed: {e}"),
        }
    }

    /// Asks for a new epoch after an expel; the lease holds again on success (old
    /// mounts stay fenced: they were made at the old epoch). One try, given a whole
    /// lease to commit (a busy manager took longer than the renewal interval tries had
    /// before); a try that fails is logged with how many were made since the expel,
    /// and the next renewal makes another once the manager still answers that this
    /// node is expelled (not while it is being recovered again, by a new manager): the
    /// mounts waiting for the rejoin bound the wait (`holder_down_wait`, at the
    /// mount). A try that timed out may commit later: a retry is then refused (the
    /// epoch moved on), this node's configuration or the next grant says so.
    fn rejoin(&self, epoch: u64) {
        let sent = self.lease.now();
        let (first, tries) = {
            let mut r = self.rejoining.lock();
            let (first, tries) = match *r {
                Some((e, first, tries)) if e == epoch => (first, tries + 1),
                _ => (std::time::Instant::now(), 1),
            };
            *r = Some((epoch, first, tries));
            (first, tries)
        };
        let command = Command::Rejoin {
            node: self.me,
            epoch,
        };
        let error = match self.quorum.propose_within(command, self.times().lease) {
            Ok(config_epoch) => {
                // The learner's copy may not have applied its own change yet.
                match self
                    .quorum
                    .wait_epoch(config_epoch, self.times().renew_interval())
                {
                    Ok(config) => {
                        let new = config.lease_of(self.me).epoch;
                        self.rejoined(new, sent, tries, first);
                    }
                    // Committed: the next renewal's grant carries the new epoch.
                    Err(e) => tracing::warn!(
                        "rejoined, but the new lease epoch is not known yet ({e}); the next \
                         renewal brings it"
                    ),
                }
                return;
            }
            Err(e) => e,
        };
        // A try that timed out may have committed since.
        let lease = self.quorum.read_local().lease_of(self.me);
        if lease.expelled.is_none() && lease.epoch > epoch {
            self.rejoined(lease.epoch, sent, tries, first);
            return;
        }
        tracing::warn!(
            "rejoining the cluster after an expel (lease epoch {epoch}) failed, try {tries} \
             ({:?} since the first): {error}; the next renewal tries again",
            first.elapsed()
        );
    }

    /// This node's rejoin committed at lease epoch `new`.
    fn rejoined(&self, new: u64, sent: Duration, tries: u32, first: std::time::Instant) {
        *self.rejoining.lock() = None;
        tracing::warn!(
            "this node, {}, rejoined the cluster at lease epoch {new} (try {tries}, {:?} \
             after the first); file systems mounted before the expel stay fenced until \
             mounted again",
            self.me,
            first.elapsed()
        );
        self.lease.rejoined(new, sent);
    }

    fn is_manager(&self) -> bool {
        matches!(self.quorum.leader(), Some((id, _)) if id == self.me)
    }

    /// On the cluster manager: watches every node's lease and expels the failed.
    fn watch_loop(&self) {
        let mut was_manager = false;
        while !self.stop.load(Ordering::SeqCst) {
            let manager = self.is_manager();
            if manager && !was_manager {
                tracing::info!(
                    "this node, {}, is the cluster manager now: it watches every node's lease",
                    self.me
                );
                // A new manager gives every node a whole lease from now.
                let config = self.quorum.read_local();
                let mut m = self.monitor.lock();
                for id in config.nodes.keys().filter(|id| **id != self.me) {
                    if config.lease_of(*id).expelled.is_none() {
                        m.watch(*id);
                    }
                }
                drop(m);
                // A node expelled and not rejoined may not have been recovered: the
                // previous manager may have died before or during its recovery (which
                // lives in that manager's memory only). Recovering it again is safe:
                // a log replayed already is empty, and a release of tokens it no
                // longer holds does nothing (`mako_fs::recovery::recover_failed_node`).
                for (id, lease) in config.nodes.keys().map(|id| (*id, config.lease_of(*id))) {
                    if id != self.me && lease.expelled.is_some() {
                        tracing::info!(
                            "{id} (lease epoch {}) is expelled and has not rejoined: its \
                             recovery starts again on this new cluster manager",
                            lease.epoch
                        );
                        self.recovering.lock().insert(id);
                        self.after_expel(id, lease.epoch);
                    }
                }
            }
            if !manager && was_manager {
                *self.monitor.lock() =
                    LeaseMonitor::new(Arc::new(SystemClock::new()) as Arc<dyn Clock>, self.times());
                self.arbitrating.lock().clear();
            }
            was_manager = manager;
            if manager {
                self.watch_once();
            }
            self.sleep(self.times().renew_interval() / 2);
        }
    }

    fn watch_once(&self) {
        let config = self.quorum.read_local();
        let watched = self.monitor.lock().watched();
        let mut arbitrating = Vec::new();
        let mut expel = Vec::new();
        for node in watched {
            let lease = config.lease_of(node);
            if lease.expelled.is_some() || !config.nodes.contains_key(&node) {
                self.monitor.lock().forget(node);
                self.arbitrating.lock().remove(&node);
                let unknown = self.expel_unknown.lock().remove(&node);
                if let (Some((epoch, reason)), Some(e)) = (unknown, &lease.expelled) {
                    if epoch == lease.epoch && e.by == self.me {
                        // Its expel committed after its proposal timed out: without
                        // this, nobody would recover it (its tokens held for good).
                        self.recovering.lock().insert(node);
                        self.expelled(
                            node,
                            epoch,
                            &format!("{reason} (committed after its proposal timed out)"),
                        );
                    }
                }
                continue;
            }
            let step = self.monitor.lock().step(node);
            match step {
                Watch::Active => {
                    self.arbitrating.lock().remove(&node);
                }
                Watch::Arbitrating => {
                    self.arbitrating.lock().insert(node);
                    arbitrating.push((node, lease.epoch));
                }
                Watch::Expel => expel.push((node, lease.epoch)),
            }
        }
        // Every node whose lease ran out is pinged at once (a partition that cut off
        // many nodes costs one ping deadline, not one per node), and looked at again
        // as soon as its ping is answered or timed out: a ping unanswered for
        // minMissedPingTimeout since it was sent expels now, not a watch round later.
        if !arbitrating.is_empty() {
            let sent = self.monitor.lock().now();
            let answers = self.ping_all(arbitrating.iter().map(|(n, _)| *n).collect());
            let mut m = self.monitor.lock();
            for ((node, epoch), answered) in arbitrating.into_iter().zip(answers) {
                m.pinged_at(node, answered, sent);
                if m.step(node) == Watch::Expel {
                    expel.push((node, epoch));
                }
            }
        }
        for (node, epoch) in expel {
            let silent = self.monitor.lock().silent_for(node).unwrap_or_default();
            let times = self.times();
            let reason = format!(
                "no lease renewal for {:.1} s (failureDetectionTime {} s) and no answer \
                 to pings for minMissedPingTimeout {} s",
                silent.as_secs_f64(),
                times.lease.as_secs(),
                times.missed_ping.as_secs()
            );
            if let Err(e) = self.expel(node, epoch, reason) {
                tracing::warn!("expelling {node} failed: {e}");
            }
        }
        // Nodes that rejoined (or were added) are watched again.
        let mut m = self.monitor.lock();
        let watched: BTreeSet<NodeId> = m.watched().into_iter().collect();
        for id in config.nodes.keys() {
            if *id != self.me && !watched.contains(id) && config.lease_of(*id).expelled.is_none() {
                m.watch(*id);
            }
        }
    }

    /// On the cluster manager: expels `node` at lease epoch `epoch` through the quorum.
    /// An expel whose proposal timed out with its outcome unknown is remembered: if it
    /// commits after all, the watch starts the node's recovery when it sees it.
    fn expel(&self, node: NodeId, epoch: u64, reason: String) -> Result<(), QuorumError> {
        let command = Command::Expel {
            node,
            epoch,
            by: self.me,
            reason: reason.clone(),
        };
        // Marked before the expel commits: its first renewal after it must not be told
        // to rejoin before its log is replayed.
        self.recovering.lock().insert(node);
        match self
            .quorum
            .propose_within(command, self.times().renew_interval())
        {
            Ok(_) => {
                self.expelled(node, epoch, &reason);
                Ok(())
            }
            Err(e) => {
                self.recovering.lock().remove(&node);
                if matches!(
                    e,
                    QuorumError::Timeout {
                        outcome_unknown: true,
                        ..
                    }
                ) {
                    self.expel_unknown.lock().insert(node, (epoch, reason));
                }
                Err(e)
            }
        }
    }

    /// On the cluster manager: this node's expel of `node` (lease epoch `epoch`)
    /// committed: logged, no longer watched, and its recovery started.
    fn expelled(&self, node: NodeId, epoch: u64, reason: &str) {
        tracing::warn!("{node} expelled by {}: {reason}", self.me);
        self.monitor.lock().forget(node);
        self.arbitrating.lock().remove(&node);
        self.after_expel(node, epoch);
    }

    /// On the cluster manager: `node` (at lease epoch `epoch`) asks to be expelled, a
    /// file system having panicked on it (`LeaseRequest::Leave`): expelled at once
    /// through raft and recovered, as a failed node; answered as its renewal would be.
    fn leave(&self, node: NodeId, epoch: u64, why: &str) -> LeaseReply {
        let config = match self.quorum.read_config() {
            Ok(c) => c,
            Err(_) => return LeaseReply::NotManager { leader: None },
        };
        let lease = config.lease_of(node);
        if lease.expelled.is_none() && lease.epoch == epoch {
            let reason = format!("it asked to leave: {why}");
            if let Err(e) = self.expel(node, epoch, reason.clone()) {
                tracing::warn!("expelling {node}, which asked to leave, failed: {e}");
                return LeaseReply::NotManager { leader: None };
            }
            return LeaseReply::Recovering {
                epoch,
                by: self.me,
                reason,
            };
        }
        // A leave for an epoch gone by (it rejoined since): nothing to do.
        self.expelled_reply(node, &lease)
            .unwrap_or(LeaseReply::NotManager { leader: None })
    }

    /// What an expelled node is told when it asks for a lease or to leave: that it is
    /// being recovered, or was expelled (by whom, why). `None`: it is not expelled.
    fn expelled_reply(
        &self,
        node: NodeId,
        lease: &mako_cluster::model::NodeLease,
    ) -> Option<LeaseReply> {
        let e = lease.expelled.clone()?;
        Some(if self.recovering.lock().contains(&node) {
            LeaseReply::Recovering {
                epoch: lease.epoch,
                by: e.by,
                reason: e.reason,
            }
        } else {
            LeaseReply::Expelled {
                epoch: lease.epoch,
                by: e.by,
                reason: e.reason,
            }
        })
    }

    /// Sets what runs after each expel (`Daemon::recover_expelled`).
    pub fn set_on_expel(&self, hook: ExpelHook) {
        *self.on_expel.lock() = Some(hook);
    }

    /// Where recovery of an expelled node starts (log replay by a survivor, release of
    /// its tokens: `mako_fs::recovery::recover_failed_node`), on a thread of its own so
    /// the watch of the other nodes goes on. The expel is committed and the node's
    /// lease ended before it (the lease invariant), so it no longer writes.
    fn after_expel(&self, node: NodeId, epoch: u64) {
        let Some(hook) = self.on_expel.lock().clone() else {
            self.recovering.lock().remove(&node);
            tracing::warn!(
                "{node} (lease epoch {epoch}) expelled, but nothing on this node recovers it:                  its tokens stay held until it mounts again"
            );
            return;
        };
        let recovering = self.recovering.clone();
        let spawned = std::thread::Builder::new()
            .name(format!("recover-{}", node.0))
            .spawn(move || {
                hook(node, epoch);
                recovering.lock().remove(&node);
            });
        if let Err(e) = spawned {
            self.recovering.lock().remove(&node);
            tracing::error!(
                "{node} (lease epoch {epoch}) expelled, but no thread could be had to recover                  it ({e}): its tokens stay held until it mounts again"
            );
        }
    }

    /// The manager's lease state of `node` for `mako node show`: `Some("arbitrating")`
    /// while it pings it.
    pub fn arbitrating(&self, node: NodeId) -> bool {
        self.arbitrating.lock().contains(&node)
    }

    /// On the cluster manager: what the recovery of `node` expelled at lease epoch
    /// `epoch` did ("being recovered" while it runs), for `mako node show`.
    pub fn recovery_of(&self, node: NodeId, epoch: u64) -> Option<String> {
        if self.recovering.lock().contains(&node) {
            return Some("being recovered".into());
        }
        match self.recovered.lock().get(&node) {
            Some((e, what)) if *e == epoch => Some(what.clone()),
            _ => None,
        }
    }

    /// Notes what the recovery of `node` (lease epoch `epoch`) did (`recovery_of`).
    pub fn note_recovered(&self, node: NodeId, epoch: u64, what: String) {
        self.recovered.lock().insert(node, (epoch, what));
    }
}

struct LeaseService(Arc<Leases>);

impl Service for LeaseService {
    fn handle(&self, from: NodeId, request: &[u8]) -> Vec<u8> {
        let l = &self.0;
        let reply = match mako_rt::transport::decode::<LeaseRequest>("lease request", request) {
            Ok(LeaseRequest::Ping) => LeaseReply::Pong,
            Ok(LeaseRequest::Leave { epoch, reason }) if l.is_manager() => {
                l.leave(from, epoch, &reason)
            }
            Ok(LeaseRequest::Leave { .. }) => LeaseReply::NotManager {
                leader: l.quorum.leader().map(|(id, _)| id),
            },
            Ok(LeaseRequest::Renew { .. }) => {
                if !l.is_manager() {
                    LeaseReply::NotManager {
                        leader: l.quorum.leader().map(|(id, _)| id),
                    }
                } else {
                    // Leadership confirmed first, and the configuration as committed: a
                    // restarted former manager believes it still leads for a moment,
                    // with the configuration it had when it stopped (no expel of
                    // itself in it), and granted itself a lease from it.
                    let config = match l.quorum.read_config() {
                        Ok(config) if l.is_manager() => config,
                        _ => {
                            let reply = LeaseReply::NotManager { leader: None };
                            return mako_rt::transport::encode("lease reply", &reply)
                                .unwrap_or_default();
                        }
                    };
                    let lease = config.lease_of(from);
                    l.expelled_reply(from, &lease).unwrap_or_else(|| {
                        l.monitor.lock().renewed(from);
                        LeaseReply::Granted { epoch: lease.epoch }
                    })
                }
            }
            // An undecodable request gets no lease.
            Err(_) => LeaseReply::NotManager { leader: None },
        };
        mako_rt::transport::encode("lease reply", &reply).unwrap_or_default()
    }
}

pub use crate::shards::ShardWatch;

/// A disk of a mounted file system behind this node's lease: every I/O is refused
/// once the lease ran out, the node was expelled, or it rejoined at a newer epoch
/// than `epoch` (the one the mount was made at), or another token-manager shard was
/// lost (`shards`).
pub struct FencedDisk {
    pub inner: Arc<dyn Disk>,
    pub lease: Arc<NodeLease>,
    /// The lease epoch of the mount; 0 for a mount made in the start-up grace, which
    /// takes the first epoch granted.
    pub epoch: std::sync::atomic::AtomicU64,
    /// The other token-manager shards of the mount.
    pub shards: Arc<ShardWatch>,
}

impl FencedDisk {
    /// May this mount do I/O now (and answer operations: `Core::mount_fence`)?
    pub(crate) fn check(&self) -> Result<(), DiskError> {
        if let Err(reason) = self.shards.check() {
            return Err(DiskError::Fenced {
                disk: self.inner.name().to_string(),
                by: "the loss of a token manager shard".into(),
                reason,
            });
        }
        let mine = self.epoch.load(Ordering::SeqCst);
        if mine == 0 && self.lease.in_startup_grace() {
            return Ok(());
        }
        let refuse = |reason: String| DiskError::Fenced {
            disk: self.inner.name().to_string(),
            by: "this node's lease".into(),
            reason,
        };
        match self.lease.check() {
            Ok(e) if e == mine => Ok(()),
            Ok(e)
                if mine == 0
                    && self
                        .epoch
                        .compare_exchange(0, e, Ordering::SeqCst, Ordering::SeqCst)
                        .is_ok() =>
            {
                Ok(())
            }
            Ok(e) => Err(refuse(format!(
                "this file system was mounted at lease epoch {}, and the node was expelled \
                 and rejoined at epoch {e} since; unmount and mount it again",
                self.epoch.load(Ordering::SeqCst)
            ))),
            Err(f) => Err(refuse(f.to_string())),
        }
    }
}

impl Disk for FencedDisk {
    fn name(&self) -> &str {
        self.inner.name()
    }
    fn size_bytes(&self) -> u64 {
        self.inner.size_bytes()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<(), DiskError> {
        self.check()?;
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> Result<(), DiskError> {
        self.check()?;
        self.inner.write_at(buf, offset)
    }
    fn sync(&self) -> Result<(), DiskError> {
        self.check()?;
        self.inner.sync()
    }
    fn sync_in_parallel(&self) -> bool {
        self.inner.sync_in_parallel()
    }
    fn read_tagged(&self, buf: &mut [u8], offset: u64, tag: IoTag) -> Result<(), DiskError> {
        self.check()?;
        self.inner.read_tagged(buf, offset, tag)
    }
    fn write_tagged(&self, buf: &[u8], offset: u64, tag: IoTag) -> Result<(), DiskError> {
        self.check()?;
        self.inner.write_tagged(buf, offset, tag)
    }
}

/// An NSD server's fence: refuses requests from a node the replicated configuration
/// lists as expelled.
pub struct LeaseFence(pub Arc<Quorum>);

impl mako_nsd::server::Fence for LeaseFence {
    fn admit(&self, from: NodeId) -> Result<(), String> {
        match self.0.read_local().lease_of(from).expelled {
            Some(e) => Err(format!(
                "{from} was expelled by {}: {}; it must rejoin and mount again",
                e.by, e.reason
            )),
            None => Ok(()),
        }
    }
}
