//! Leases: how a node knows it may still do disk I/O, and how the cluster manager
//! knows when it may declare a node failed (docs/cluster.md "Leases, expel and
//! fencing"). Pure state machines over an injected [`mako_rt::Clock`]; makod sends
//! the messages ([`LeaseRequest`]) and acts on the answers.
//!
//! The one rule that makes this a fence: a node's own lease ends strictly before the
//! manager's view of it ends. The node measures its lease from the moment it *sent*
//! the renewal that was granted ([`NodeLease::granted`] takes that send time); the
//! manager measures from the moment it *received* it, which is later, and then waits
//! a further `minMissedPingTimeout` of failed pings before it expels
//! ([`LeaseMonitor::step`]). Both use monotonic clocks and only durations, never each
//! other's clock readings, so skew between hosts does not matter; a drift in clock
//! *rate* larger than margin/lease would (the same assumption GPFS makes).

use mako_rt::{Clock, NodeId};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

/// The lease timings, from mako-config's parameters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeaseTimes {
    /// `failureDetectionTime`: how long a granted lease lasts.
    pub lease: Duration,
    /// `minMissedPingTimeout`: how long the manager pings a node whose lease ran out
    /// (and gets no answer) before it expels it.
    pub missed_ping: Duration,
}

impl LeaseTimes {
    /// How often a node renews its lease (and the manager pings a node that did
    /// not): a fifth of the lease, so four renewals in a row may be lost before the
    /// lease runs out.
    pub fn renew_interval(&self) -> Duration {
        self.lease / 5
    }

    /// From mako-config's effective configuration.
    pub fn from_config(config: &mako_config::EffectiveConfig) -> LeaseTimes {
        LeaseTimes {
            lease: config.failure_detection_time(),
            missed_ping: config.min_missed_ping_timeout(),
        }
    }
}

/// A node's messages to the cluster manager's lease service
/// (`mako_rt::ServiceId::Lease`), and the manager's ping of a node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum LeaseRequest {
    /// Renew the lease of the calling node, which believes it holds `epoch`.
    Renew { epoch: u64 },
    /// The manager asks a node whose lease ran out whether it still answers.
    Ping,
    /// The calling node (at lease epoch `epoch`) asks to be expelled at once: a file
    /// system panicked on it (it cannot write its recovery log), so a survivor must
    /// replay that log and release its tokens. Answered like a renewal of an expelled
    /// node ([`LeaseReply::Recovering`], then [`LeaseReply::Expelled`]); the node
    /// sends it instead of its renewals until it is told it was expelled.
    Leave { epoch: u64, reason: String },
}

/// The answers.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum LeaseReply {
    /// Renewed: the lease lasts `failureDetectionTime` from when the node sent the
    /// request.
    Granted { epoch: u64 },
    /// The node was expelled (or its epoch is not the current one): it must stop its
    /// I/O and rejoin with a new epoch.
    Expelled {
        epoch: u64,
        by: NodeId,
        reason: String,
    },
    /// The node was expelled and a survivor is still replaying its log: it must stay
    /// fenced and ask again later; it may rejoin only once the answer is
    /// [`LeaseReply::Expelled`] (a node that mounted again while its log was being
    /// replayed by another would have two writers on one log).
    Recovering {
        epoch: u64,
        by: NodeId,
        reason: String,
    },
    /// The node asked is not the cluster manager (the leader moved); ask `leader`.
    NotManager { leader: Option<NodeId> },
    /// Answer to [`LeaseRequest::Ping`].
    Pong,
}

/// What a node knows about its own lease.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LeaseState {
    /// Never granted since this node started: it may not do I/O yet.
    Unleased,
    /// Valid until `until` on this node's monotonic clock.
    Held { epoch: u64, until: Duration },
    /// The manager said this node was expelled: fenced until it rejoins.
    Expelled {
        epoch: u64,
        by: NodeId,
        reason: String,
    },
}

/// This node's lease. Every disk I/O of the node asks [`NodeLease::check`] first; a
/// lease that ran out is the fence for disks the node reaches directly.
pub struct NodeLease {
    clock: Arc<dyn Clock>,
    times: LeaseTimes,
    state: parking_lot::Mutex<LeaseState>,
    /// When this node started (its start-up grace is measured from here).
    started: Duration,
}

/// Why this node may not do I/O now.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Fenced {
    #[error("this node has no lease from the cluster manager yet")]
    Unleased,
    #[error("this node's lease (epoch {epoch}) ran out {ago:?} ago: it could not renew it with the cluster manager within failureDetectionTime, so the cluster may consider it failed")]
    Expired { epoch: u64, ago: Duration },
    #[error("this node was expelled from the cluster by {by} (lease epoch {epoch}): {reason}; unmount and mount again once it rejoined")]
    Expelled {
        epoch: u64,
        by: NodeId,
        reason: String,
    },
}

impl NodeLease {
    pub fn new(clock: Arc<dyn Clock>, times: LeaseTimes) -> NodeLease {
        let started = clock.monotonic();
        NodeLease {
            clock,
            times,
            state: parking_lot::Mutex::new(LeaseState::Unleased),
            started,
        }
    }

    pub fn times(&self) -> LeaseTimes {
        self.times
    }

    /// The current monotonic time: what a renewal records as its send time.
    pub fn now(&self) -> Duration {
        self.clock.monotonic()
    }

    /// A renewal sent at `sent` (from [`NodeLease::now`] before the call) was granted
    /// at `epoch`. Never shortens a lease a later renewal already extended. While
    /// expelled, a grant at the expelled epoch (a reply in flight before the expel) is
    /// ignored; one at a later epoch is a rejoin that committed after this node's
    /// proposal of it gave up (the manager grants the epoch the configuration holds,
    /// and only a rejoin raises it): the node holds its lease again, as after
    /// [`NodeLease::rejoined`]. True then (else it would stay expelled for good: the
    /// manager no longer answers that it is).
    pub fn granted(&self, epoch: u64, sent: Duration) -> bool {
        let until = sent + self.times.lease;
        let mut state = self.state.lock();
        match &*state {
            LeaseState::Expelled {
                epoch: expelled, ..
            } if epoch <= *expelled => false,
            LeaseState::Expelled { .. } => {
                *state = LeaseState::Held { epoch, until };
                true
            }
            LeaseState::Held {
                epoch: held,
                until: old,
            } if *held == epoch && *old >= until => false,
            _ => {
                *state = LeaseState::Held { epoch, until };
                false
            }
        }
    }

    /// The manager answered that this node is expelled.
    pub fn expelled(&self, epoch: u64, by: NodeId, reason: String) {
        *self.state.lock() = LeaseState::Expelled { epoch, by, reason };
    }

    /// The node rejoined with a new epoch: leased again (its old mounts stay fenced
    /// by the caller until they are mounted again).
    pub fn rejoined(&self, epoch: u64, sent: Duration) {
        *self.state.lock() = LeaseState::Held {
            epoch,
            until: sent + self.times.lease,
        };
    }

    pub fn state(&self) -> LeaseState {
        self.state.lock().clone()
    }

    /// The epoch this node's requests carry (0 before the first grant).
    pub fn epoch(&self) -> u64 {
        match &*self.state.lock() {
            LeaseState::Unleased => 0,
            LeaseState::Held { epoch, .. } | LeaseState::Expelled { epoch, .. } => *epoch,
        }
    }

    /// Never granted a lease yet, within `failureDetectionTime` of the start: the
    /// start-up grace in which a mount may do I/O before a cluster manager is elected
    /// (the quorum nodes start one after another; docs/cluster.md says what this
    /// leaves open).
    pub fn in_startup_grace(&self) -> bool {
        matches!(*self.state.lock(), LeaseState::Unleased)
            && self.clock.monotonic() < self.started + self.times.lease
    }

    /// May this node do disk I/O now? `Ok(epoch)` while the lease holds.
    pub fn check(&self) -> Result<u64, Fenced> {
        let now = self.clock.monotonic();
        match &*self.state.lock() {
            LeaseState::Unleased => Err(Fenced::Unleased),
            LeaseState::Held { epoch, until } if now < *until => Ok(*epoch),
            LeaseState::Held { epoch, until } => Err(Fenced::Expired {
                epoch: *epoch,
                ago: now - *until,
            }),
            LeaseState::Expelled { epoch, by, reason } => Err(Fenced::Expelled {
                epoch: *epoch,
                by: *by,
                reason: reason.clone(),
            }),
        }
    }
}

/// How the manager sees one node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Watch {
    /// Renewed within the lease.
    Active,
    /// Its lease (as the manager counts it) ran out; the manager pings it.
    Arbitrating,
    /// Lease out and pings unanswered for `minMissedPingTimeout`: expel it.
    Expel,
}

#[derive(Clone, Copy, Debug)]
struct Watched {
    /// Manager's monotonic time of the last renewal received (or of when the
    /// manager started watching: a new manager gives every node a whole lease).
    renewed: Duration,
    /// When the pings began to fail, if the last one failed.
    unanswered_since: Option<Duration>,
    /// A renewal of it reached this manager since it began watching.
    heard: bool,
}

/// The cluster manager's view of every node's lease.
pub struct LeaseMonitor {
    clock: Arc<dyn Clock>,
    times: LeaseTimes,
    nodes: BTreeMap<NodeId, Watched>,
}

impl LeaseMonitor {
    pub fn new(clock: Arc<dyn Clock>, times: LeaseTimes) -> LeaseMonitor {
        LeaseMonitor {
            clock,
            times,
            nodes: BTreeMap::new(),
        }
    }

    /// Watch `node` from now (a new manager, a node that rejoined): it has a whole
    /// lease before it can be found expired, and until its first renewal reaches this
    /// manager a second one (the start-up grace of the watch: a node whose makod is
    /// still starting, or which learns who the manager is only after its raft log
    /// caught up, on a loaded machine). That does not weaken the fence: a node's lease
    /// ends `failureDetectionTime` after it *sent* the renewal that was granted, so a
    /// lease granted before this watch began ends within one lease of it; an expel
    /// later than that only delays the recovery of a node that is really gone.
    pub fn watch(&mut self, node: NodeId) {
        let now = self.clock.monotonic();
        self.nodes.insert(
            node,
            Watched {
                renewed: now,
                unanswered_since: None,
                heard: false,
            },
        );
    }

    /// Stop watching `node` (expelled, or no longer in the configuration).
    pub fn forget(&mut self, node: NodeId) {
        self.nodes.remove(&node);
    }

    pub fn watched(&self) -> Vec<NodeId> {
        self.nodes.keys().copied().collect()
    }

    /// `node`'s renewal arrived now.
    pub fn renewed(&mut self, node: NodeId) {
        let now = self.clock.monotonic();
        let w = self.nodes.entry(node).or_insert(Watched {
            renewed: now,
            unanswered_since: None,
            heard: true,
        });
        w.renewed = w.renewed.max(now);
        w.unanswered_since = None;
        w.heard = true;
    }

    /// A ping of `node` was answered (`true`) or not, now.
    pub fn pinged(&mut self, node: NodeId, answered: bool) {
        let now = self.clock.monotonic();
        self.pinged_at(node, answered, now);
    }

    /// A ping sent to `node` at `sent` (this monitor's clock, [`LeaseMonitor::now`])
    /// was answered or not. An unanswered ping counts from when it was sent: the node
    /// did not answer from then on, and the time the ping waited for its deadline is
    /// part of `minMissedPingTimeout`, not added to it (a stopped node was expelled
    /// about two ping deadlines after failureDetectionTime + minMissedPingTimeout).
    pub fn pinged_at(&mut self, node: NodeId, answered: bool, sent: Duration) {
        if let Some(w) = self.nodes.get_mut(&node) {
            if answered {
                w.unanswered_since = None;
            } else if w.unanswered_since.is_none() && sent >= w.renewed {
                // (A ping sent before a renewal that reached us since says nothing
                // about the new lease: counted, it would expel the node the moment
                // that lease ends.)
                w.unanswered_since = Some(sent);
            }
        }
    }

    /// This monitor's clock now (the send time of a ping, [`LeaseMonitor::pinged_at`]).
    pub fn now(&self) -> Duration {
        self.clock.monotonic()
    }

    /// Where `node` stands now.
    pub fn step(&self, node: NodeId) -> Watch {
        let Some(w) = self.nodes.get(&node) else {
            return Watch::Active;
        };
        let now = self.clock.monotonic();
        let grace = if w.heard {
            Duration::ZERO
        } else {
            self.times.lease
        };
        let lease_end = w.renewed + self.times.lease + grace;
        if now < lease_end {
            return Watch::Active;
        }
        // Expel only when pings failed for the whole missed-ping period, counted
        // from the lease end at the earliest; a node that answers pings but does not
        // renew is expelled once a second lease passed without a renewal.
        let failing_from = w.unanswered_since.map(|t| t.max(lease_end));
        match failing_from {
            Some(t) if now >= t + self.times.missed_ping => Watch::Expel,
            _ if now >= lease_end + self.times.lease => Watch::Expel,
            _ => Watch::Arbitrating,
        }
    }

    /// Time since `node`'s last renewal reached the manager.
    pub fn silent_for(&self, node: NodeId) -> Option<Duration> {
        let now = self.clock.monotonic();
        self.nodes.get(&node).map(|w| now.saturating_sub(w.renewed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use parking_lot::Mutex;

    /// A clock that moves only when told.
    struct FakeClock(Mutex<Duration>);
    impl FakeClock {
        fn advance(&self, d: Duration) {
            *self.0.lock() += d;
        }
    }
    impl Clock for FakeClock {
        fn wall(&self) -> Duration {
            *self.0.lock()
        }
        fn monotonic(&self) -> Duration {
            *self.0.lock()
        }
        fn sleep(&self, d: Duration) {
            self.advance(d)
        }
    }

    fn times() -> LeaseTimes {
        LeaseTimes {
            lease: Duration::from_secs(10),
            missed_ping: Duration::from_secs(3),
        }
    }

    fn s(n: u64) -> Duration {
        Duration::from_secs(n)
    }

    #[test]
    fn a_node_is_fenced_until_granted_and_after_its_lease_runs_out() {
        let clock = Arc::new(FakeClock(Mutex::new(s(100))));
        let lease = NodeLease::new(clock.clone(), times());
        assert_eq!(lease.check(), Err(Fenced::Unleased));
        assert!(lease.in_startup_grace());
        let sent = lease.now();
        clock.advance(s(1)); // the reply takes a second
        lease.granted(7, sent);
        assert_eq!(lease.check(), Ok(7));
        assert!(!lease.in_startup_grace());
        // Measured from the send time: 10 s after sending, not after the reply.
        clock.advance(s(8));
        assert_eq!(lease.check(), Ok(7));
        clock.advance(s(1));
        assert_eq!(
            lease.check(),
            Err(Fenced::Expired {
                epoch: 7,
                ago: s(0)
            })
        );
        // A renewal granted late (sent before the last one) does not shorten it.
        let early = lease.now();
        lease.granted(7, early);
        lease.granted(7, early - s(5));
        clock.advance(s(9));
        assert_eq!(lease.check(), Ok(7));
    }

    #[test]
    fn the_start_up_grace_ends_after_one_lease() {
        let clock = Arc::new(FakeClock(Mutex::new(s(3))));
        let lease = NodeLease::new(clock.clone(), times());
        clock.advance(s(9));
        assert!(lease.in_startup_grace());
        clock.advance(s(1));
        assert!(!lease.in_startup_grace());
    }

    #[test]
    fn an_expelled_node_stays_fenced_until_it_rejoins() {
        let clock = Arc::new(FakeClock(Mutex::new(s(0))));
        let lease = NodeLease::new(clock.clone(), times());
        lease.granted(1, lease.now());
        lease.expelled(1, NodeId(0), "lease expired".into());
        assert!(matches!(lease.check(), Err(Fenced::Expelled { .. })));
        // A stale grant (a reply in flight before the expel) changes nothing.
        lease.granted(1, lease.now());
        assert!(matches!(lease.check(), Err(Fenced::Expelled { .. })));
        lease.rejoined(2, lease.now());
        assert_eq!(lease.check(), Ok(2));
        assert_eq!(lease.epoch(), 2);
    }

    #[test]
    fn a_grant_at_a_later_epoch_ends_an_expel_whose_rejoin_committed_late() {
        let clock = Arc::new(FakeClock(Mutex::new(s(0))));
        let lease = NodeLease::new(clock.clone(), times());
        assert!(!lease.granted(1, lease.now()));
        lease.expelled(1, NodeId(0), "lease expired".into());
        assert!(!lease.granted(1, lease.now()));
        assert!(matches!(lease.check(), Err(Fenced::Expelled { .. })));
        // The node's rejoin (epoch 2) timed out on its side but committed: the
        // manager grants epoch 2 and never says "expelled" again.
        assert!(lease.granted(2, lease.now()));
        assert_eq!(lease.check(), Ok(2));
        assert!(!lease.granted(2, lease.now()));
        assert_eq!(lease.epoch(), 2);
    }

    #[test]
    fn the_manager_expels_only_after_lease_plus_missed_pings() {
        let clock = Arc::new(FakeClock(Mutex::new(s(0))));
        let mut m = LeaseMonitor::new(clock.clone(), times());
        let n = NodeId(2);
        m.watch(n);
        m.renewed(n);
        clock.advance(s(9));
        assert_eq!(m.step(n), Watch::Active);
        clock.advance(s(1));
        assert_eq!(m.step(n), Watch::Arbitrating);
        // Pings fail from now; expel after minMissedPingTimeout of failures.
        m.pinged(n, false);
        clock.advance(s(2));
        m.pinged(n, false);
        assert_eq!(m.step(n), Watch::Arbitrating);
        clock.advance(s(1));
        assert_eq!(m.step(n), Watch::Expel);
        // A renewal arriving resets it.
        m.renewed(n);
        assert_eq!(m.step(n), Watch::Active);
    }

    #[test]
    fn an_unanswered_ping_counts_from_when_it_was_sent() {
        // A stopped node: its pings wait out their deadline (here the whole
        // minMissedPingTimeout) before they fail. It is expelled when the first one
        // fails, at lease + minMissedPingTimeout, not a ping deadline later.
        let clock = Arc::new(FakeClock(Mutex::new(s(0))));
        let mut m = LeaseMonitor::new(clock.clone(), times());
        let n = NodeId(2);
        m.watch(n);
        m.renewed(n);
        clock.advance(s(10));
        assert_eq!(m.step(n), Watch::Arbitrating);
        let sent = m.now();
        clock.advance(s(3)); // the ping's deadline
        m.pinged_at(n, false, sent);
        assert_eq!(m.step(n), Watch::Expel);
        // A ping sent before a renewal that arrived while it waited says nothing
        // about the new lease.
        m.renewed(n);
        m.pinged_at(n, false, sent);
        clock.advance(s(10));
        assert_eq!(m.step(n), Watch::Arbitrating);
    }

    #[test]
    fn pings_failing_before_the_lease_end_count_from_the_lease_end() {
        let clock = Arc::new(FakeClock(Mutex::new(s(0))));
        let mut m = LeaseMonitor::new(clock.clone(), times());
        let n = NodeId(1);
        m.watch(n);
        m.renewed(n);
        clock.advance(s(2));
        m.pinged(n, false);
        clock.advance(s(8)); // lease end
        assert_eq!(m.step(n), Watch::Arbitrating);
        clock.advance(s(3));
        assert_eq!(m.step(n), Watch::Expel);
    }

    #[test]
    fn a_node_that_answers_pings_but_never_renews_is_expelled_after_a_second_lease() {
        let clock = Arc::new(FakeClock(Mutex::new(s(0))));
        let mut m = LeaseMonitor::new(clock.clone(), times());
        let n = NodeId(3);
        m.watch(n);
        m.renewed(n);
        clock.advance(s(10));
        m.pinged(n, true);
        clock.advance(s(9));
        m.pinged(n, true);
        assert_eq!(m.step(n), Watch::Arbitrating);
        clock.advance(s(1));
        assert_eq!(m.step(n), Watch::Expel);
    }

    /// A node never heard from since the watch began (still starting) has a second
    /// lease before it is pinged; its first renewal ends that grace.
    #[test]
    fn a_node_not_heard_from_yet_has_a_second_lease() {
        let clock = Arc::new(FakeClock(Mutex::new(s(0))));
        let mut m = LeaseMonitor::new(clock.clone(), times());
        let (late, heard) = (NodeId(1), NodeId(2));
        m.watch(late);
        m.watch(heard);
        m.renewed(heard);
        clock.advance(s(19));
        assert_eq!(m.step(late), Watch::Active);
        assert_eq!(m.step(heard), Watch::Arbitrating);
        clock.advance(s(1));
        assert_eq!(m.step(late), Watch::Arbitrating);
        m.pinged(late, false);
        clock.advance(s(3));
        assert_eq!(m.step(late), Watch::Expel);
        // Heard from once, it has one lease from each renewal, as every node.
        m.renewed(late);
        clock.advance(s(10));
        assert_eq!(m.step(late), Watch::Arbitrating);
    }

    /// The fence: whatever the delays, the node's own lease has run out before the
    /// manager may expel it.
    #[test]
    fn the_node_lease_always_ends_before_the_manager_may_expel() {
        for reply_delay in [0, 1, 4, 9] {
            for request_delay in [0, 1, 4, 9] {
                let clock = Arc::new(FakeClock(Mutex::new(s(50))));
                let node = NodeLease::new(clock.clone(), times());
                let mut m = LeaseMonitor::new(clock.clone(), times());
                let n = NodeId(1);
                m.watch(n);
                let sent = node.now();
                clock.advance(s(request_delay));
                m.renewed(n);
                clock.advance(s(reply_delay));
                node.granted(1, sent);
                // Step a second at a time; pings never answered.
                for _ in 0..40 {
                    m.pinged(n, false);
                    if m.step(n) == Watch::Expel {
                        assert!(node.check().is_err(), "expel while the node held its lease");
                    }
                    if node.check().is_ok() {
                        assert_eq!(m.step(n), Watch::Active);
                    }
                    clock.advance(s(1));
                }
                assert_eq!(m.step(n), Watch::Expel);
            }
        }
    }
}
