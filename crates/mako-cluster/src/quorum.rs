//! [`Quorum`]: one node's handle on the replicated configuration. It runs the node's
//! raft instance on a small tokio runtime of its own, serves the `Cluster` service
//! (raft's messages, and changes and reads forwarded to the cluster manager), and
//! offers a synchronous API to the daemon and the CLI, every call bounded by a
//! deadline.
//!
//! A change ([`Quorum::propose`]) is checked for bad input here, then committed by the
//! raft leader — the cluster manager — wherever it was proposed: a follower or a
//! learner forwards it. Before the leader appends anything it asks every quorum node
//! whether it answers; without a majority it refuses at once with
//! [`QuorumError::QuorumLost`], naming the nodes that answer and those that do not,
//! instead of appending an entry that would hang and might commit much later. A
//! proposal carries a unique id, so one retried after a lost reply is applied once.

use crate::model::{ClusterConfig, Command, ConfigError};
use crate::network::{send, ClusterReply, ClusterRequest, Network};
use crate::store::{self, Applied};
use crate::{mako_id, raft_id, Member, Proposal, RaftNodeId, TypeConfig};
use mako_rt::{NodeId, Priority, Registry, Service, ServiceId, Transport, TransportError};
use openraft::error::{ClientWriteError, InitializeError, RaftError};
use openraft::{ChangeMembers, Raft, RaftMetrics, ServerState, SnapshotPolicy};
use parking_lot::{Mutex, RwLock};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The lane of a forwarded change or read: it may wait on the manager for its whole
/// deadline (a quorum to answer, an election), so it must not hold one of the few
/// handler threads that small messages — token revokes, raft heartbeats — rely on.
const FORWARD_PRIORITY: Priority = Priority::Bulk;

/// How a node's quorum member runs.
#[derive(Clone, Debug)]
pub struct QuorumOptions {
    /// How often the leader tells the others it is alive.
    pub heartbeat_interval: Duration,
    /// A follower that hears no leader for a random time in this range starts an
    /// election.
    pub election_timeout: (Duration, Duration),
    /// How long a call waits unless the caller gives its own deadline.
    pub deadline: Duration,
    /// How long a quorum node may take to answer "are you there" before the leader
    /// counts it as not answering.
    pub probe_deadline: Duration,
    /// A snapshot is built after this many log entries since the last one.
    pub snapshot_every: u64,
    /// Log entries kept after a snapshot, so a follower a little behind catches up
    /// from the log rather than from a snapshot.
    pub keep_after_snapshot: u64,
}

impl Default for QuorumOptions {
    fn default() -> Self {
        QuorumOptions {
            heartbeat_interval: Duration::from_millis(250),
            election_timeout: (Duration::from_millis(1500), Duration::from_millis(3000)),
            deadline: Duration::from_secs(30),
            probe_deadline: Duration::from_secs(2),
            snapshot_every: 1000,
            keep_after_snapshot: 100,
        }
    }
}

/// What a node says about itself when asked (`mako node show`, errors, probes).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeStatus {
    pub node: NodeId,
    /// `leader`, `follower`, `candidate`, `learner` or `stopping`.
    pub state: String,
    pub term: u64,
    /// The cluster manager this node knows of.
    pub leader: Option<NodeId>,
    /// The epoch of the configuration this node has applied.
    pub epoch: u64,
    pub voters: Vec<NodeId>,
    pub learners: Vec<NodeId>,
    /// The last log index in this node's snapshot, if it has one.
    pub snapshot: Option<u64>,
}

/// What went wrong with a call on the quorum. Each message says what is wrong and
/// what to do.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
pub enum QuorumError {
    /// The change was refused by validation (it changed nothing).
    #[error("{0}")]
    Refused(#[from] ConfigError),
    #[error(
        "quorum lost: {} of {} quorum nodes answer ({}), {needed} are needed; not answering: {}. \
         Start the quorum nodes that are down (or fix the network) and try again",
        answering.len(), answering.len() + silent.len(), list(answering), list(silent)
    )]
    QuorumLost {
        answering: Vec<String>,
        silent: Vec<String>,
        needed: usize,
    },
    #[error("{node} is not the cluster manager; {}", match leader {
        Some(l) => format!("the cluster manager is {l}: send the request there"),
        None => "no cluster manager is elected yet: try again in a few seconds".to_string(),
    })]
    NotLeader {
        node: String,
        leader: Option<String>,
    },
    #[error("{node} is unreachable: {reason}")]
    Unreachable { node: String, reason: String },
    /// A leader could not confirm its leadership in time for a read, although a
    /// majority answers (a slow heartbeat); a read retries it.
    #[error("{node} could not confirm that it is still the cluster manager: {reason}")]
    Unconfirmed { node: String, reason: String },
    #[error("{what} did not finish within {deadline:?}{}", if *outcome_unknown {
        " (the change may still be applied: read the configuration before trying again)"
    } else { "" })]
    Timeout {
        what: String,
        deadline: Duration,
        outcome_unknown: bool,
    },
    #[error("{node} has no cluster configuration: create the cluster (`mako cluster create`) or add this node to it")]
    NotInitialized { node: String },
    #[error("{node} is already part of a cluster; a cluster is created once")]
    AlreadyInitialized { node: String },
    #[error("cannot create the cluster here: {node} is not among its quorum nodes")]
    NotAMember { node: String },
    #[error("membership change refused: {reason}")]
    Membership { reason: String },
    #[error("cluster store: {reason}")]
    Store { reason: String },
    #[error("{node}'s quorum service is stopped")]
    Stopped { node: String },
}

fn list(names: &[String]) -> String {
    if names.is_empty() {
        "none".to_string()
    } else {
        names.join(", ")
    }
}

impl From<store::StoreError> for QuorumError {
    fn from(e: store::StoreError) -> Self {
        QuorumError::Store {
            reason: e.to_string(),
        }
    }
}

/// One node's member of the quorum (a voter or a learner). Its methods block their
/// caller (each until its deadline at most), so call them from ordinary threads, and
/// stop or drop it outside any async context (its runtime cannot be stopped there).
pub struct Quorum {
    inner: Arc<Inner>,
    registry: Arc<Registry>,
    runtime: Mutex<Option<tokio::runtime::Runtime>>,
}

struct Inner {
    me: NodeId,
    raft: Raft<TypeConfig>,
    applied: Arc<RwLock<Applied>>,
    transport: Arc<dyn Transport>,
    options: QuorumOptions,
    handle: tokio::runtime::Handle,
}

impl Quorum {
    /// Starts this node's quorum member on `<data_dir>/cluster.redb` (created if
    /// missing: a new node starts empty and waits to be bootstrapped or added) and
    /// offers its `Cluster` service in `registry`, which `transport` serves.
    pub fn start(
        me: NodeId,
        data_dir: &Path,
        transport: Arc<dyn Transport>,
        registry: Arc<Registry>,
        options: QuorumOptions,
    ) -> Result<Quorum, QuorumError> {
        let (log, sm) = store::open(data_dir)?;
        let applied = sm.shared();
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name(format!("cluster-{}", me.0))
            .enable_time()
            .build()
            .map_err(|e| QuorumError::Store {
                reason: format!("cannot start the quorum's threads: {e}"),
            })?;
        let config = openraft::Config {
            cluster_name: "mako".to_string(),
            heartbeat_interval: millis(options.heartbeat_interval),
            election_timeout_min: millis(options.election_timeout.0),
            election_timeout_max: millis(options.election_timeout.1),
            snapshot_policy: SnapshotPolicy::LogsSinceLast(options.snapshot_every),
            max_in_snapshot_log_to_keep: options.keep_after_snapshot,
            ..Default::default()
        }
        .validate()
        .map_err(|e| QuorumError::Store {
            reason: format!("bad quorum timing: {e}"),
        })?;
        let network = Network {
            transport: transport.clone(),
        };
        let raft = run(
            runtime.handle(),
            Raft::new(raft_id(me), Arc::new(config), network, log, sm),
        )
        .ok_or_else(|| QuorumError::Stopped {
            node: me.to_string(),
        })?
        .map_err(|e| QuorumError::Store {
            reason: format!("cannot start raft: {e}"),
        })?;
        let inner = Arc::new(Inner {
            me,
            raft,
            applied,
            transport,
            options,
            handle: runtime.handle().clone(),
        });
        registry.register(
            me,
            ServiceId::Cluster,
            Arc::new(ClusterService {
                inner: inner.clone(),
            }),
        );
        Ok(Quorum {
            inner,
            registry,
            runtime: Mutex::new(Some(runtime)),
        })
    }

    /// This node.
    pub fn node(&self) -> NodeId {
        self.inner.me
    }

    /// Creates the quorum: makes `members` the voters. Call it once, on one of them;
    /// the others must be started (they learn it from the leader).
    pub fn bootstrap(&self, members: &BTreeMap<NodeId, Member>) -> Result<(), QuorumError> {
        check_quorum_size(members.len())?;
        let inner = self.inner.clone();
        let nodes: BTreeMap<RaftNodeId, Member> = members
            .iter()
            .map(|(id, m)| (raft_id(*id), m.clone()))
            .collect();
        let result = self.block(self.inner.options.deadline, "bootstrap", async move {
            inner.raft.initialize(nodes).await
        })?;
        match result {
            Ok(()) => Ok(()),
            Err(RaftError::APIError(InitializeError::NotAllowed(_))) => {
                Err(QuorumError::AlreadyInitialized {
                    node: self.inner.label(self.inner.me),
                })
            }
            Err(RaftError::APIError(InitializeError::NotInMembers(_))) => {
                Err(QuorumError::NotAMember {
                    node: self.inner.label(self.inner.me),
                })
            }
            Err(RaftError::Fatal(e)) => Err(self.inner.fatal(e)),
        }
    }

    /// Commits `command` through the cluster manager (forwarded if this node is not
    /// it) and returns the new epoch once the manager has applied it; this node may
    /// apply it a moment later ([`Quorum::wait_epoch`] waits for that).
    pub fn propose(&self, command: Command) -> Result<u64, QuorumError> {
        self.propose_within(command, self.inner.options.deadline)
    }

    /// [`Quorum::propose`] with its own deadline.
    pub fn propose_within(&self, command: Command, deadline: Duration) -> Result<u64, QuorumError> {
        command.check_input()?;
        let proposal = Proposal {
            id: *uuid::Uuid::new_v4().as_bytes(),
            command,
        };
        let inner = self.inner.clone();
        let end = Instant::now() + deadline;
        self.block(deadline, "the change", async move {
            inner.propose_anywhere(proposal, end).await
        })?
    }

    /// Commits `command` only if this node is the cluster manager; otherwise refuses
    /// with [`QuorumError::NotLeader`], naming the manager.
    pub fn propose_here(&self, command: Command, deadline: Duration) -> Result<u64, QuorumError> {
        command.check_input()?;
        let proposal = Proposal {
            id: *uuid::Uuid::new_v4().as_bytes(),
            command,
        };
        let inner = self.inner.clone();
        let end = Instant::now() + deadline;
        self.block(deadline, "the change", async move {
            inner.propose_as_leader(proposal, end).await
        })?
    }

    /// The configuration as the cluster manager has it now (a linearizable read: it
    /// includes every change committed before the call).
    pub fn read_config(&self) -> Result<ClusterConfig, QuorumError> {
        let inner = self.inner.clone();
        let end = Instant::now() + self.inner.options.deadline;
        self.block(self.inner.options.deadline, "the read", async move {
            inner.read_anywhere(end).await
        })?
    }

    /// The configuration this node has applied; possibly behind the manager's.
    pub fn read_local(&self) -> ClusterConfig {
        self.inner.applied.read().state.config.clone()
    }

    /// The cluster manager (raft leader) this node knows of.
    pub fn leader(&self) -> Option<(NodeId, Member)> {
        let m = self.inner.metrics();
        let leader = m.current_leader?;
        let member = m
            .membership_config
            .membership()
            .get_node(&leader)
            .cloned()
            .unwrap_or_default();
        Some((mako_id(leader)?, member))
    }

    /// What this node knows of itself and the quorum.
    pub fn status(&self) -> NodeStatus {
        self.inner.status()
    }

    /// Every node's own account of itself (`mako node show`): the nodes of the
    /// configuration and of raft's membership, each asked directly with the probe
    /// deadline; a node that does not answer comes with why (not running,
    /// unreachable, no answer in time).
    pub fn node_states(&self) -> Vec<(NodeId, Result<NodeStatus, String>)> {
        let inner = self.inner.clone();
        let deadline = self.inner.options.probe_deadline;
        self.block(deadline, "asking the nodes", async move {
            inner.node_states(deadline).await
        })
        .unwrap_or_default()
    }

    /// Waits until some node is the cluster manager and this node knows it.
    pub fn wait_leader(&self, deadline: Duration) -> Result<NodeId, QuorumError> {
        let inner = self.inner.clone();
        let end = Instant::now() + deadline;
        self.block(deadline, "the election", async move {
            inner
                .wait_until(end, |m, _| m.current_leader.and_then(mako_id))
                .await
                .ok_or(())
        })?
        .map_err(|()| QuorumError::Timeout {
            what: "the election of a cluster manager".into(),
            deadline,
            outcome_unknown: false,
        })
    }

    /// Waits until this node has applied the configuration of `epoch` or later.
    pub fn wait_epoch(&self, epoch: u64, deadline: Duration) -> Result<ClusterConfig, QuorumError> {
        let inner = self.inner.clone();
        let end = Instant::now() + deadline;
        self.block(deadline, "catching up", async move {
            inner
                .wait_until(end, |_, a| {
                    (a.state.config.epoch >= epoch).then(|| a.state.config.clone())
                })
                .await
                .ok_or(())
        })?
        .map_err(|()| QuorumError::Timeout {
            what: format!(
                "applying epoch {epoch} on {}",
                self.inner.label(self.inner.me)
            ),
            deadline,
            outcome_unknown: false,
        })
    }

    /// Makes `node` a learner: it receives every change but does not vote (client and
    /// non-quorum nodes). Only on the cluster manager; waits until the learner has
    /// caught up.
    pub fn add_learner(
        &self,
        node: NodeId,
        member: Member,
        deadline: Duration,
    ) -> Result<(), QuorumError> {
        let inner = self.inner.clone();
        let end = Instant::now() + deadline;
        self.block(deadline, "adding the learner", async move {
            inner.require_leader()?;
            let write = inner.raft.add_learner(raft_id(node), member, true);
            match tokio::time::timeout(remaining(end), write).await {
                Ok(result) => inner.membership_result(result.map(|_| ())),
                Err(_) => Err(QuorumError::Timeout {
                    what: format!("{} catching up as a learner", inner.label(node)),
                    deadline,
                    outcome_unknown: true,
                }),
            }
        })?
    }

    /// Drops learners `nodes` from raft's membership (nodes removed from the
    /// configuration); a voter among them is refused. Only on the cluster manager.
    pub fn remove_learners(
        &self,
        nodes: &BTreeSet<NodeId>,
        deadline: Duration,
    ) -> Result<(), QuorumError> {
        let ids: BTreeSet<RaftNodeId> = nodes.iter().map(|n| raft_id(*n)).collect();
        let inner = self.inner.clone();
        let end = Instant::now() + deadline;
        self.block(deadline, "removing learners", async move {
            inner.require_leader()?;
            let write = inner
                .raft
                .change_membership(ChangeMembers::RemoveNodes(ids), true);
            match tokio::time::timeout(remaining(end), write).await {
                Ok(result) => inner.membership_result(result.map(|_| ())),
                Err(_) => Err(QuorumError::Timeout {
                    what: "removing learners".into(),
                    deadline,
                    outcome_unknown: true,
                }),
            }
        })?
    }

    /// Makes `voters` the quorum nodes (each must already be a voter or a learner);
    /// voters left out stay as learners. Only on the cluster manager.
    pub fn change_membership(
        &self,
        voters: &BTreeSet<NodeId>,
        deadline: Duration,
    ) -> Result<(), QuorumError> {
        check_quorum_size(voters.len())?;
        let ids: BTreeSet<RaftNodeId> = voters.iter().map(|n| raft_id(*n)).collect();
        let inner = self.inner.clone();
        let end = Instant::now() + deadline;
        self.block(deadline, "the quorum change", async move {
            inner.require_leader()?;
            if let Some(lost) = inner.lost().await {
                return Err(lost);
            }
            let write = inner
                .raft
                .change_membership(ChangeMembers::ReplaceAllVoters(ids), true);
            match tokio::time::timeout(remaining(end), write).await {
                Ok(result) => inner.membership_result(result.map(|_| ())),
                Err(_) => Err(QuorumError::Timeout {
                    what: "the quorum change".into(),
                    deadline,
                    outcome_unknown: true,
                }),
            }
        })?
    }

    /// Asks raft to build a snapshot now (tests and `mako cluster` maintenance).
    pub fn trigger_snapshot(&self) -> Result<(), QuorumError> {
        let inner = self.inner.clone();
        self.block(self.inner.options.deadline, "the snapshot", async move {
            inner.raft.trigger().snapshot().await
        })?
        .map_err(|e| self.inner.fatal(e))
    }

    /// Stops this node's member: its service goes, raft stops, its threads end. The
    /// store stays; a new `start` on the same directory continues from it.
    pub fn shutdown(&self) {
        self.registry.unregister(self.inner.me, ServiceId::Cluster);
        let Some(runtime) = self.runtime.lock().take() else {
            return;
        };
        let inner = self.inner.clone();
        let _ = run(runtime.handle(), async move { inner.raft.shutdown().await });
        runtime.shutdown_timeout(Duration::from_secs(5));
    }

    /// Runs `future` on this member's runtime and waits for it, at most `deadline`
    /// plus a margin (the futures themselves end by their deadline).
    fn block<T: Send + 'static>(
        &self,
        deadline: Duration,
        what: &str,
        future: impl Future<Output = T> + Send + 'static,
    ) -> Result<T, QuorumError> {
        let stopped = || QuorumError::Stopped {
            node: self.inner.label(self.inner.me),
        };
        let guard = self.runtime.lock();
        let handle = guard.as_ref().ok_or_else(stopped)?.handle().clone();
        drop(guard);
        // The futures end by their own deadline and may then ask the quorum nodes why
        // (one probe); this bound is only the last resort. The timer must be made on
        // the runtime, inside the task.
        let bound = deadline + self.inner.options.probe_deadline * 2;
        let timed = async move { tokio::time::timeout(bound, future).await };
        match run(&handle, timed) {
            None => Err(stopped()),
            Some(Ok(value)) => Ok(value),
            Some(Err(_)) => Err(QuorumError::Timeout {
                what: what.to_string(),
                deadline,
                // Changes and quorum changes may have reached the log.
                outcome_unknown: matches!(
                    what,
                    "the change" | "the quorum change" | "adding the learner"
                ),
            }),
        }
    }
}

impl Drop for Quorum {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// The quorum sizes Mako accepts. An even number tolerates no more failures than the
/// odd number below it and needs one more answer for every change; more than five
/// only slows every change down.
pub const QUORUM_SIZES: [usize; 3] = [1, 3, 5];

fn check_quorum_size(n: usize) -> Result<(), QuorumError> {
    if QUORUM_SIZES.contains(&n) {
        Ok(())
    } else {
        Err(QuorumError::Membership {
            reason: format!(
                "{n} quorum nodes: choose 1, 3 or 5 (an even number survives no more \
                 failures than one less, and more than 5 only slows every change)"
            ),
        })
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1)
}

fn remaining(end: Instant) -> Duration {
    end.saturating_duration_since(Instant::now())
}

/// Runs `future` on `handle` and waits for its output on this thread, which may be any
/// thread (even one of another runtime's, where `block_on` would panic). `None`: the
/// runtime is shutting down.
fn run<T: Send + 'static>(
    handle: &tokio::runtime::Handle,
    future: impl Future<Output = T> + Send + 'static,
) -> Option<T> {
    let (tx, rx) = std::sync::mpsc::sync_channel(1);
    handle.spawn(async move {
        let _ = tx.send(future.await);
    });
    rx.recv().ok()
}

/// Whether `answering` holds a majority of every configuration of `joint` (two during
/// a membership change, one otherwise).
fn has_quorum(joint: &[BTreeSet<RaftNodeId>], answering: &BTreeSet<RaftNodeId>) -> bool {
    joint
        .iter()
        .all(|config| config.intersection(answering).count() * 2 > config.len())
}

impl Inner {
    fn metrics(&self) -> RaftMetrics<RaftNodeId, Member> {
        self.raft.metrics().borrow().clone()
    }

    /// "node 2 (b)", or "node 2" for a node the membership does not name.
    fn label(&self, node: NodeId) -> String {
        let name = {
            let m = self.raft.metrics();
            let m = m.borrow();
            m.membership_config
                .membership()
                .get_node(&raft_id(node))
                .map(|m| m.name.clone())
        };
        match name {
            Some(name) if !name.is_empty() => format!("{node} ({name})"),
            _ => node.to_string(),
        }
    }

    fn raft_label(&self, id: RaftNodeId) -> String {
        match mako_id(id) {
            Some(node) => self.label(node),
            None => format!("raft node {id}"),
        }
    }

    fn status(&self) -> NodeStatus {
        let m = self.metrics();
        let membership = m.membership_config.membership();
        NodeStatus {
            node: self.me,
            state: match m.state {
                ServerState::Leader => "leader",
                ServerState::Follower => "follower",
                ServerState::Candidate => "candidate",
                ServerState::Learner => "learner",
                ServerState::Shutdown => "stopping",
            }
            .to_string(),
            term: m.current_term,
            leader: m.current_leader.and_then(mako_id),
            epoch: self.applied.read().state.config.epoch,
            voters: membership.voter_ids().filter_map(mako_id).collect(),
            learners: membership.learner_ids().filter_map(mako_id).collect(),
            snapshot: m.snapshot.map(|s| s.index),
        }
    }

    fn fatal(&self, e: openraft::error::Fatal<RaftNodeId>) -> QuorumError {
        match e {
            openraft::error::Fatal::StorageError(e) => QuorumError::Store {
                reason: e.to_string(),
            },
            openraft::error::Fatal::Panicked | openraft::error::Fatal::Stopped => {
                QuorumError::Stopped {
                    node: self.label(self.me),
                }
            }
        }
    }

    fn not_leader(&self, leader: Option<RaftNodeId>) -> QuorumError {
        QuorumError::NotLeader {
            node: self.label(self.me),
            leader: leader.map(|l| self.raft_label(l)),
        }
    }

    fn require_leader(&self) -> Result<(), QuorumError> {
        let m = self.metrics();
        if m.membership_config
            .membership()
            .voter_ids()
            .next()
            .is_none()
        {
            return Err(QuorumError::NotInitialized {
                node: self.label(self.me),
            });
        }
        if m.current_leader == Some(raft_id(self.me)) && m.state == ServerState::Leader {
            Ok(())
        } else {
            Err(self.not_leader(m.current_leader))
        }
    }

    fn membership_result(
        &self,
        result: Result<(), RaftError<RaftNodeId, ClientWriteError<RaftNodeId, Member>>>,
    ) -> Result<(), QuorumError> {
        match result {
            Ok(()) => Ok(()),
            Err(RaftError::APIError(ClientWriteError::ForwardToLeader(f))) => {
                Err(self.not_leader(f.leader_id))
            }
            Err(RaftError::APIError(ClientWriteError::ChangeMembershipError(e))) => {
                Err(QuorumError::Membership {
                    reason: e.to_string(),
                })
            }
            Err(RaftError::Fatal(e)) => Err(self.fatal(e)),
        }
    }

    /// Waits until `check` returns something, looking again at every change of raft's
    /// metrics (an applied entry, a new leader); `None` at `end`.
    async fn wait_until<T>(
        &self,
        end: Instant,
        check: impl Fn(&RaftMetrics<RaftNodeId, Member>, &Applied) -> Option<T>,
    ) -> Option<T> {
        let mut rx = self.raft.metrics();
        loop {
            {
                let m = rx.borrow_and_update().clone();
                let applied = self.applied.read();
                if let Some(found) = check(&m, &applied) {
                    return Some(found);
                }
            }
            match tokio::time::timeout(remaining(end), rx.changed()).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) | Err(_) => return None,
            }
        }
    }

    /// Asks every quorum node whether it answers (this node answers for itself), until
    /// a quorum answered or the others are silent. Returns the ones that answered, the
    /// silent ones with why (complete only when there is no quorum), and the voter
    /// configurations a majority is needed in.
    ///
    /// Each node gets the whole probe deadline, whatever is left of the caller's: a
    /// ping cut short says nothing about the node (a node that had not learnt the
    /// cluster manager yet, its deadline spent waiting for one, called the quorum lost
    /// after pings of 1 ms). A call that probes after its deadline ends at most one
    /// probe deadline late (`Quorum::block` allows for two).
    async fn probe(
        &self,
    ) -> (
        BTreeSet<RaftNodeId>,
        Vec<(RaftNodeId, String)>,
        Vec<BTreeSet<RaftNodeId>>,
    ) {
        let m = self.metrics();
        let membership = m.membership_config.membership();
        let joint: Vec<BTreeSet<RaftNodeId>> = membership.get_joint_config().clone();
        let voters: BTreeSet<RaftNodeId> = membership.voter_ids().collect();
        let deadline = self.options.probe_deadline;
        let mut answering = BTreeSet::new();
        let mut silent = Vec::new();
        // Answers come in as they arrive: once a quorum answered, the others are not
        // waited for (a stopped node's ping would take the whole probe deadline, and
        // with it the time a proposal after the probe had left: an expel of that very
        // node timed out, its outcome unknown).
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let mut asked = 0usize;
        for id in voters {
            if id == raft_id(self.me) {
                answering.insert(id);
                continue;
            }
            let transport = self.transport.clone();
            let tx = tx.clone();
            asked += 1;
            tokio::spawn(async move {
                let r = send(
                    &transport,
                    id,
                    &ClusterRequest::Ping,
                    Priority::Small,
                    deadline,
                )
                .await;
                let _ = tx.send((id, r));
            });
        }
        drop(tx);
        while asked > 0 && !has_quorum(&joint, &answering) {
            let Some((id, r)) = rx.recv().await else {
                break;
            };
            asked -= 1;
            match r {
                Ok(ClusterReply::Pong(_)) => {
                    answering.insert(id);
                }
                Ok(other) => silent.push((id, format!("answered {other:?}"))),
                Err(e) => silent.push((id, short_reason(&e))),
            }
        }
        (answering, silent, joint)
    }

    async fn node_states(&self, deadline: Duration) -> Vec<(NodeId, Result<NodeStatus, String>)> {
        let mut nodes: BTreeSet<NodeId> = self
            .applied
            .read()
            .state
            .config
            .nodes
            .keys()
            .copied()
            .collect();
        {
            let m = self.raft.metrics();
            let m = m.borrow();
            nodes.extend(
                m.membership_config
                    .membership()
                    .nodes()
                    .filter_map(|(id, _)| mako_id(*id)),
            );
        }
        let mut calls = Vec::new();
        for node in nodes {
            if node == self.me {
                calls.push((node, None));
                continue;
            }
            let transport = self.transport.clone();
            calls.push((
                node,
                Some(tokio::spawn(async move {
                    send(
                        &transport,
                        raft_id(node),
                        &ClusterRequest::Ping,
                        Priority::Small,
                        deadline,
                    )
                    .await
                })),
            ));
        }
        let mut out = Vec::new();
        for (node, call) in calls {
            let state = match call {
                None => Ok(self.status()),
                Some(call) => match call.await {
                    Ok(Ok(ClusterReply::Pong(status))) => Ok(status),
                    Ok(Ok(other)) => Err(format!("answered {other:?}")),
                    Ok(Err(e)) => Err(short_reason(&e)),
                    Err(e) => Err(format!("probe failed: {e}")),
                },
            };
            out.push((node, state));
        }
        out
    }

    /// `QuorumLost` if the quorum nodes that answer now hold no majority (each asked
    /// with the whole probe deadline: [`Inner::probe`]).
    async fn lost(&self) -> Option<QuorumError> {
        let (answering, silent, joint) = self.probe().await;
        if has_quorum(&joint, &answering) {
            return None;
        }
        let needed = joint.iter().map(|c| c.len() / 2 + 1).max().unwrap_or(1);
        Some(QuorumError::QuorumLost {
            answering: answering.iter().map(|id| self.raft_label(*id)).collect(),
            silent: silent
                .iter()
                .map(|(id, why)| format!("{} ({why})", self.raft_label(*id)))
                .collect(),
            needed,
        })
    }

    /// Commits `proposal` with this node as the leader, or refuses.
    async fn propose_as_leader(
        &self,
        proposal: Proposal,
        end: Instant,
    ) -> Result<u64, QuorumError> {
        self.require_leader()?;
        // Append nothing a majority cannot commit: it would hang, and commit whenever
        // the quorum comes back, long after the caller gave up.
        if let Some(lost) = self.lost().await {
            return Err(lost);
        }
        let deadline = remaining(end);
        match tokio::time::timeout(deadline, self.raft.client_write(proposal)).await {
            Ok(Ok(response)) => response.data.0.map_err(QuorumError::Refused),
            Ok(Err(RaftError::APIError(ClientWriteError::ForwardToLeader(f)))) => {
                Err(self.not_leader(f.leader_id))
            }
            Ok(Err(RaftError::APIError(ClientWriteError::ChangeMembershipError(e)))) => {
                Err(QuorumError::Membership {
                    reason: e.to_string(),
                })
            }
            Ok(Err(RaftError::Fatal(e))) => Err(self.fatal(e)),
            Err(_) => {
                // The entry is in the log and may still commit, whenever a majority
                // answers again: say so, with why it did not commit in time.
                let why = match self.lost().await {
                    Some(lost) => format!("the change ({lost})"),
                    None => "the change".to_string(),
                };
                Err(QuorumError::Timeout {
                    what: why,
                    deadline,
                    outcome_unknown: true,
                })
            }
        }
    }

    /// Waits for a cluster manager to be known, briefly: one election's worth of time.
    /// `None` if there is none by then (or by `end`).
    async fn await_leader(&self, end: Instant) -> Option<RaftNodeId> {
        let election = self.options.election_timeout.1 * 2;
        let until = end.min(Instant::now() + election);
        self.wait_until(until, |m, _| m.current_leader).await
    }

    /// Waits a little for the leader to change from `old` (after it stopped answering).
    async fn await_new_leader(&self, old: RaftNodeId, end: Instant) {
        let election = self.options.election_timeout.1 * 2;
        let until = end.min(Instant::now() + election);
        let _ = self
            .wait_until(until, |m, _| (m.current_leader != Some(old)).then_some(()))
            .await;
    }

    /// Commits `proposal` through whichever node is the cluster manager.
    async fn propose_anywhere(&self, proposal: Proposal, end: Instant) -> Result<u64, QuorumError> {
        let began = Instant::now();
        let mut last_error = None;
        while Instant::now() < end {
            if self
                .metrics()
                .membership_config
                .membership()
                .voter_ids()
                .next()
                .is_none()
            {
                return Err(QuorumError::NotInitialized {
                    node: self.label(self.me),
                });
            }
            let Some(leader) = self.await_leader(end).await else {
                // No manager after an election's time: say why if the quorum is gone.
                if let Some(lost) = self.lost().await {
                    return Err(lost);
                }
                last_error = Some(self.not_leader(None));
                continue;
            };
            if leader == raft_id(self.me) {
                match self.propose_as_leader(proposal.clone(), end).await {
                    Err(QuorumError::NotLeader { .. }) => {
                        self.await_new_leader(leader, end).await;
                        continue;
                    }
                    other => return other,
                }
            }
            let request = ClusterRequest::Propose {
                proposal: proposal.clone(),
                deadline: remaining(end),
            };
            match send(
                &self.transport,
                leader,
                &request,
                FORWARD_PRIORITY,
                remaining(end),
            )
            .await
            {
                Ok(ClusterReply::Proposed(Err(e @ QuorumError::NotLeader { .. }))) => {
                    last_error = Some(e);
                    self.await_new_leader(leader, end).await;
                }
                Ok(ClusterReply::Proposed(result)) => return result,
                Ok(other) => {
                    last_error = Some(QuorumError::Unreachable {
                        node: self.raft_label(leader),
                        reason: format!("unexpected reply {other:?}"),
                    });
                    self.await_new_leader(leader, end).await;
                }
                Err(e) => {
                    // The manager does not answer us. Retrying is safe: the proposal's
                    // id makes a second commit answer with the first one's outcome.
                    last_error = Some(QuorumError::Unreachable {
                        node: format!("the cluster manager {}", self.raft_label(leader)),
                        reason: short_reason(&e),
                    });
                    if let Some(lost) = self.lost().await {
                        return Err(lost);
                    }
                    self.await_new_leader(leader, end).await;
                }
            }
        }
        // The deadline passed. A forward whose reply was lost may still commit.
        Err(match last_error {
            Some(e @ QuorumError::Unreachable { .. }) => QuorumError::Timeout {
                what: format!("the change ({e})"),
                deadline: end.saturating_duration_since(began),
                outcome_unknown: true,
            },
            Some(e) => e,
            None => QuorumError::Timeout {
                what: "the change".into(),
                deadline: Duration::ZERO,
                outcome_unknown: false,
            },
        })
    }

    /// A linearizable read with this node as the leader.
    async fn read_as_leader(&self, end: Instant) -> Result<ClusterConfig, QuorumError> {
        self.require_leader()?;
        match tokio::time::timeout(remaining(end), self.raft.ensure_linearizable()).await {
            Ok(Ok(_)) => Ok(self.applied.read().state.config.clone()),
            Ok(Err(RaftError::APIError(openraft::error::CheckIsLeaderError::ForwardToLeader(
                f,
            )))) => Err(self.not_leader(f.leader_id)),
            Ok(Err(RaftError::APIError(openraft::error::CheckIsLeaderError::QuorumNotEnough(
                e,
            )))) => {
                // Openraft gives each heartbeat of the check only one heartbeat
                // interval: a slow answer fails it while the quorum is there.
                match self.lost().await {
                    Some(lost) => Err(lost),
                    None => Err(QuorumError::Unconfirmed {
                        node: self.label(self.me),
                        reason: e.to_string(),
                    }),
                }
            }
            Err(_) => match self.lost().await {
                Some(lost) => Err(lost),
                None => Err(QuorumError::Timeout {
                    what: "the read".into(),
                    deadline: self.options.deadline,
                    outcome_unknown: false,
                }),
            },
            Ok(Err(RaftError::Fatal(e))) => Err(self.fatal(e)),
        }
    }

    async fn read_anywhere(&self, end: Instant) -> Result<ClusterConfig, QuorumError> {
        let mut last_error = None;
        while Instant::now() < end {
            if self
                .metrics()
                .membership_config
                .membership()
                .voter_ids()
                .next()
                .is_none()
            {
                return Err(QuorumError::NotInitialized {
                    node: self.label(self.me),
                });
            }
            let Some(leader) = self.await_leader(end).await else {
                if let Some(lost) = self.lost().await {
                    return Err(lost);
                }
                last_error = Some(self.not_leader(None));
                continue;
            };
            let result = if leader == raft_id(self.me) {
                self.read_as_leader(end).await
            } else {
                let request = ClusterRequest::Read {
                    deadline: remaining(end),
                };
                match send(
                    &self.transport,
                    leader,
                    &request,
                    FORWARD_PRIORITY,
                    remaining(end),
                )
                .await
                {
                    Ok(ClusterReply::Config(result)) => result,
                    Ok(other) => Err(QuorumError::Unreachable {
                        node: self.raft_label(leader),
                        reason: format!("unexpected reply {other:?}"),
                    }),
                    Err(e) => Err(QuorumError::Unreachable {
                        node: format!("the cluster manager {}", self.raft_label(leader)),
                        reason: short_reason(&e),
                    }),
                }
            };
            match result {
                Err(e @ (QuorumError::NotLeader { .. } | QuorumError::Unreachable { .. })) => {
                    last_error = Some(e);
                    self.await_new_leader(leader, end).await;
                }
                Err(e @ QuorumError::Unconfirmed { .. }) => {
                    // The same leader, asked again after a heartbeat.
                    last_error = Some(e);
                    tokio::time::sleep(self.options.heartbeat_interval.min(remaining(end))).await;
                }
                other => return other,
            }
        }
        Err(last_error.unwrap_or(QuorumError::Timeout {
            what: "the read".into(),
            deadline: Duration::ZERO,
            outcome_unknown: false,
        }))
    }

    async fn serve(&self, request: ClusterRequest) -> ClusterReply {
        match request {
            ClusterRequest::Vote(r) => ClusterReply::Vote(self.raft.vote(r).await),
            ClusterRequest::Append(r) => ClusterReply::Append(self.raft.append_entries(r).await),
            ClusterRequest::Snapshot(r) => {
                ClusterReply::Snapshot(self.raft.install_snapshot(r).await)
            }
            ClusterRequest::Propose { proposal, deadline } => {
                let end = Instant::now() + deadline;
                let result = match proposal.command.check_input() {
                    Err(e) => Err(QuorumError::Refused(e)),
                    Ok(()) => self.propose_as_leader(proposal, end).await,
                };
                ClusterReply::Proposed(result)
            }
            ClusterRequest::Read { deadline } => {
                ClusterReply::Config(self.read_as_leader(Instant::now() + deadline).await)
            }
            ClusterRequest::Ping => ClusterReply::Pong(self.status()),
        }
    }
}

/// A transport error in a few words for a list of silent nodes.
fn short_reason(e: &TransportError) -> String {
    match e {
        TransportError::NoService { .. } => "not running".to_string(),
        TransportError::Timeout { deadline, .. } => format!("no answer within {deadline:?}"),
        TransportError::Unreachable { reason, .. } => format!("unreachable: {reason}"),
        other => other.to_string(),
    }
}

/// The `Cluster` service of one node.
struct ClusterService {
    inner: Arc<Inner>,
}

impl Service for ClusterService {
    fn handle(&self, _from: NodeId, request: &[u8]) -> Vec<u8> {
        let reply = match mako_rt::decode::<ClusterRequest>("cluster request", request) {
            Err(e) => ClusterReply::Refused(e.to_string()),
            Ok(request) => {
                let inner = self.inner.clone();
                run(
                    &self.inner.handle,
                    async move { inner.serve(request).await },
                )
                .unwrap_or_else(|| {
                    ClusterReply::Refused(format!(
                        "{} is stopping",
                        self.inner.label(self.inner.me)
                    ))
                })
            }
        };
        mako_rt::encode("cluster reply", &reply).unwrap_or_else(|e| {
            // A reply that cannot be encoded is a bug; the caller gets a refusal that says so.
            mako_rt::encode("cluster reply", &ClusterReply::Refused(e.to_string()))
                .unwrap_or_default()
        })
    }
}
