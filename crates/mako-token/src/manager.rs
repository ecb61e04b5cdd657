//! The token manager: the authority on who holds which token, sharded by resource.
//!
//! The manager answers plain requests from node ids. Revoking is the requester's job
//! (see `client.rs`), which keeps the manager's work per acquire to at most two
//! messages. The one message it sends itself is a notice to a queued requester that
//! its turn came (`ClientRequest::Turn`, through the transport given with
//! `TokenManager::notify_through`), sent without waiting, so that waiters do not poll.

use std::collections::BTreeSet;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{OnceLock, Weak};
use std::time::{Duration, Instant};

use mako_rt::{CallOptions, ServiceId, Transport};

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

use crate::client::ManagerMap;
use crate::error::TokenError;
use crate::held_ranges::HeldRanges;
use crate::mode::{compatible, TokenMode};
use crate::range::ByteRange;
use crate::resource::{NodeId, ResourceId};

/// Number of shards when none is given. A power of two well above the core count keeps
/// two acquires on different resources from meeting on one lock.
pub const SHARD_COUNT_DEFAULT: usize = 64;

/// Limits of one token manager.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenManagerLimits {
    /// Most tokens (one per held piece: node, resource, range, mode) the table may
    /// hold. Acquires past it fail with `TokenError::TableFull`. Relinquish and
    /// downgrade may split a token and go past it: giving up must never fail, or a
    /// revoke could never complete.
    pub tokens_max: usize,
    /// A queued request (see `AcquireRequest::waiter`) whose requester has not asked
    /// again for this long is dropped from the queue: its node died or gave up without
    /// a word. Longer than a requester's revoke round can last (two waves of calls
    /// with `TokenClientLimits::call_deadline_ms` each, and the flushes behind them).
    pub waiter_lease_ms: u64,
}

impl Default for TokenManagerLimits {
    fn default() -> Self {
        // About 1M tokens; at the ~56 bytes per byte-range lock noted in the seeds this
        // is tens of MiB on the manager node.
        TokenManagerLimits {
            tokens_max: 1 << 20,
            waiter_lease_ms: 180_000,
        }
    }
}

/// A request for a token. Plain data so it can go over the network unchanged.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AcquireRequest {
    pub node: NodeId,
    pub resource: ResourceId,
    pub mode: TokenMode,
    /// What the requester needs now; the grant always contains it.
    pub required: ByteRange,
    /// How much the requester would like (for example to end of file); the grant
    /// never exceeds it. Must contain `required`.
    pub desired: ByteRange,
    /// Number of revoke answers the requester forwards from its previous attempt
    /// (DESIGN §4: holders answer the requester, which forwards the answers with its
    /// next request). Counted in `TokenStats::revokes`.
    pub revoke_answers: u32,
    /// Grant this request only while the resource's version is still the one the
    /// requester saw; once a holder has changed the structure the request was made
    /// for (the seeds' pitfall: many nodes asking for `xw` to move a directory out of
    /// its inode), the manager grants the fallback instead.
    pub condition: Option<Condition>,
    /// Replace what the node holds over the granted range instead of joining modes: a
    /// node that held `ro` and now wants `rw` gives up `ro`'s promise (it will ask the
    /// metanode for attributes) rather than ending up with `xw`.
    pub replace: bool,
    /// Grant this stronger mode instead when nobody else holds anything in the way
    /// over `required` (the first node to touch an object gets it exclusively, so a
    /// node working alone never asks twice; a later sharer revokes it down).
    pub upgrade_to: Option<TokenMode>,
    /// Grant this mode instead when `mode` conflicts but this one does not (a reader
    /// of an inode that others write shares their `rw` and asks the metanode, rather
    /// than revoking every writer).
    pub alt_mode: Option<TokenMode>,
    /// Queue this request if it cannot be granted now: `(requester's acquire id)`,
    /// unique per node while the acquire lasts. Conflicting requests of one resource
    /// are granted oldest first (docs/coherence.md section 2, fairness): a request
    /// that conflicts with an older waiter of another node is refused with
    /// `TokenError::Queued`, even if nobody holds anything in its way — so a holder
    /// that gives a token up and asks again at once does not jump the queue. `None`:
    /// never queued (a try-acquire such as `AcquireOptions::no_revoke`), though
    /// still refused behind older waiters.
    pub waiter: Option<u64>,
}

/// See [`AcquireRequest::condition`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Condition {
    /// The resource version the requester based its request on.
    pub seen_version: u64,
    /// What to ask for instead when the version moved on.
    pub fallback_mode: TokenMode,
    pub fallback_required: ByteRange,
    pub fallback_desired: ByteRange,
}

impl AcquireRequest {
    /// A request with no forwarded revoke answers.
    pub fn new(
        node: NodeId,
        resource: ResourceId,
        mode: TokenMode,
        required: ByteRange,
        desired: ByteRange,
    ) -> Self {
        AcquireRequest {
            node,
            resource,
            mode,
            required,
            desired,
            revoke_answers: 0,
            condition: None,
            replace: false,
            upgrade_to: None,
            alt_mode: None,
            waiter: None,
        }
    }

    /// A request for a whole resource (inode, allocation region, inode-map segment).
    pub fn whole(node: NodeId, resource: ResourceId, mode: TokenMode) -> Self {
        Self::new(node, resource, mode, ByteRange::WHOLE, ByteRange::WHOLE)
    }
}

/// A token that was granted: `node` now holds at least `mode` over `range`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Grant {
    pub node: NodeId,
    pub resource: ResourceId,
    pub mode: TokenMode,
    pub range: ByteRange,
    /// The resource's structure version at the grant (see `AcquireRequest::condition`).
    pub version: u64,
    /// The manager names `node` the resource's metanode (or it already was): the
    /// grant tells it so, rather than leaving it to find out when its own operation
    /// gets that far while others already ask it (docs/coherence.md section 4).
    pub metanode: bool,
    /// How many other nodes were waiting for modes that conflict with the grant when
    /// it was made: the resource is contended. A holder that may do its work in a
    /// way that shares (a directory that leaves its inode, so that creators need only
    /// `rw` on it and their names' pages) does so when many wait, instead of passing
    /// the exclusive token from node to node (docs/coherence.md section 4).
    pub contenders: u32,
}

/// One node's token on one range of a resource, as reported in copysets and dumps.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Holder {
    pub node: NodeId,
    pub mode: TokenMode,
    pub range: ByteRange,
}

impl fmt::Display for Holder {
    /// `node 2 xw [0, eof)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {} {}", self.node, self.mode, self.range)
    }
}

/// What a node holds on one resource, as it reports it to a rebuilding manager shard
/// (`ClientRequest::HeldIn`, docs/coherence.md section 7b).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeldToken {
    pub resource: ResourceId,
    /// The held pieces, in order, not overlapping.
    pub pieces: Vec<(ByteRange, TokenMode)>,
    /// The structure version the node last heard of (`Grant::version`).
    pub version: u64,
    /// The manager named the node the resource's metanode (or owner) and it still
    /// holds a write mode there.
    pub metanode: bool,
}

/// A shard being rebuilt (`TokenManager::begin_rebuild`).
struct Rebuild {
    /// The routing the rebuilt slot belongs to: only resources routed to `slot` are
    /// refused while it lasts (the same manager may serve other slots meanwhile).
    map: ManagerMap,
    slot: usize,
    /// Live nodes whose report has not arrived.
    reporting: BTreeSet<NodeId>,
    /// Failed nodes not yet recovered (`release_node`): what they held is unknown, and
    /// their logs may hold changes to anything they held, so nothing of the slot is
    /// granted before their recovery replayed them.
    recovering: BTreeSet<NodeId>,
}

impl Rebuild {
    fn done(&self) -> bool {
        self.reporting.is_empty() && self.recovering.is_empty()
    }
}

/// Counters for diagnostics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenStats {
    /// Acquire requests received, granted or not.
    pub acquires: u64,
    /// Acquires refused with a copyset.
    pub conflicts: u64,
    /// Revoke answers forwarded by requesters.
    pub revokes: u64,
    /// Acquires refused because the table was full.
    pub table_full: u64,
    /// Tokens held right now.
    pub tokens: usize,
    /// Conditional requests granted their fallback because the version moved on.
    pub downgraded: u64,
    /// Requests refused because an older conflicting request waits (fairness).
    pub queued: u64,
    /// Queued requests dropped because their requester stopped asking
    /// (`TokenManagerLimits::waiter_lease_ms`).
    pub waiters_expired: u64,
    /// Queued requests dropped because a call to their node failed
    /// (`ManagerRequest::DropWaiters`).
    pub waiters_dropped: u64,
    /// Notices sent to queued requesters that their turn came (`ClientRequest::Turn`).
    pub turns: u64,
    /// Requests refused because the shard was rebuilding (`TokenError::Rebuilding`).
    pub rebuild_refused: u64,
    /// Reports of held tokens taken in by a rebuild (`TokenManager::apply_report`).
    pub reports: u64,
}

/// A request waiting for its turn on a resource (see `AcquireRequest::waiter`).
#[derive(Clone, Copy, Debug)]
struct Waiter {
    node: NodeId,
    id: u64,
    /// Order of arrival on this manager: lower is older, served first.
    ticket: u64,
    mode: TokenMode,
    /// The request's `alt_mode`: the requester takes that instead as readily.
    alt: Option<TokenMode>,
    required: ByteRange,
    /// The request's condition: when the version moves past it, the waiter needs only
    /// its fallback (the reason for the stronger request is gone).
    condition: Option<Condition>,
    /// Manager time of the requester's last ask.
    refreshed: Duration,
    /// The requester knows that nobody older is in its way: it was told so
    /// (`ClientRequest::Turn`), or its last ask was refused for holders only (it is
    /// revoking them). Cleared when it is refused behind older requests again.
    told: bool,
}

impl Waiter {
    /// Does this waiter stand in the way of `node` asking `mode` over `required`?
    fn blocks(&self, node: NodeId, mode: TokenMode, required: &ByteRange) -> bool {
        self.node != node && self.conflicts(mode) && self.required.overlaps(required)
    }

    /// `mode` conflicts with what this waiter asks, and with its alternative too (one
    /// that caches an inode others write takes their `rw` as readily as `ro`). Counting
    /// only `mode` made readers and shared writers of a directory take turns revoking
    /// one another: 64 nodes creating in a directory in blocks sent 162 manager
    /// requests per create, 46 on main.
    fn conflicts(&self, mode: TokenMode) -> bool {
        !compatible(self.mode, mode) && self.alt.is_none_or(|a| !compatible(a, mode))
    }
}

/// Everything held on one resource, per node. A handful of nodes share a resource, so
/// a vector scanned linearly beats a map.
#[derive(Default)]
struct ResourceTokens {
    nodes: Vec<(NodeId, HeldRanges)>,
    /// Inodes: the node that owns the inode and its indirect blocks while several
    /// nodes write (docs/coherence.md section 4). Always a node holding `rw` or `xw`.
    metanode: Option<NodeId>,
    /// Structure version set by holders (`set_version`); kept while anything is held.
    version: u64,
    /// Requests refused for conflicts, in order of arrival (oldest first). A resource
    /// stays in the table while anything is held or anyone waits.
    waiters: Vec<Waiter>,
}

impl ResourceTokens {
    fn node(&self, node: NodeId) -> Option<&HeldRanges> {
        self.nodes.iter().find(|(n, _)| *n == node).map(|(_, h)| h)
    }

    /// Foreign pieces (of nodes other than `node`) whose mode is incompatible with `mode`.
    fn conflicting(&self, node: NodeId, mode: TokenMode) -> impl Iterator<Item = Holder> + '_ {
        self.nodes
            .iter()
            .filter(move |(n, _)| *n != node)
            .flat_map(|(n, held)| {
                held.pieces().iter().map(move |&(range, m)| Holder {
                    node: *n,
                    mode: m,
                    range,
                })
            })
            .filter(move |h| !compatible(h.mode, mode))
    }

    /// Does `node` hold a write mode (`rw` or `xw`) somewhere on the resource?
    fn writes(&self, node: NodeId) -> bool {
        self.node(node).is_some_and(|h| {
            h.pieces()
                .iter()
                .any(|(_, m)| matches!(m, TokenMode::Rw | TokenMode::Xw))
        })
    }

    /// The metanode stays only while it holds a write mode.
    fn check_metanode(&mut self) {
        if let Some(m) = self.metanode {
            if !self.writes(m) {
                self.metanode = None;
            }
        }
    }

    fn holders(&self) -> Vec<Holder> {
        let mut out: Vec<Holder> = self
            .nodes
            .iter()
            .flat_map(|(n, held)| {
                held.pieces().iter().map(move |&(range, mode)| Holder {
                    node: *n,
                    mode,
                    range,
                })
            })
            .collect();
        out.sort_by_key(|h| (h.range.start, h.node, h.range.end));
        out
    }

    /// Nothing held and nobody waiting: the entry can leave the table.
    fn is_unused(&self) -> bool {
        self.nodes.is_empty() && self.waiters.is_empty()
    }

    /// The ticket of a queued request (`None`: not queued, so every waiter is older).
    fn ticket_of(&self, node: NodeId, waiter: Option<u64>) -> Option<u64> {
        let id = waiter?;
        self.waiters
            .iter()
            .find(|w| w.node == node && w.id == id)
            .map(|w| w.ticket)
    }

    /// Waiters older than the request (`ticket`) standing in its way.
    fn waiters_ahead(
        &self,
        node: NodeId,
        ticket: Option<u64>,
        mode: TokenMode,
        required: &ByteRange,
    ) -> impl Iterator<Item = &Waiter> + '_ {
        let required = *required;
        self.waiters
            .iter()
            .filter(move |w| ticket.is_none_or(|t| w.ticket < t))
            .filter(move |w| w.blocks(node, mode, &required))
    }

    /// Drop waiters whose requester stopped asking; returns how many.
    fn expire_waiters(&mut self, now: Duration, lease: Duration) -> usize {
        let before = self.waiters.len();
        self.waiters
            .retain(|w| now.saturating_sub(w.refreshed) <= lease);
        before - self.waiters.len()
    }

    fn remove_waiter(&mut self, node: NodeId, id: u64) {
        self.waiters.retain(|w| !(w.node == node && w.id == id));
    }

    /// Queued requests that nobody older stands in the way of any more and whose
    /// requesters do not know it yet: they are told (`ClientRequest::Turn`), instead of
    /// finding out by asking again. Marks them told. The queue is in order of arrival.
    fn turns(&mut self, resource: ResourceId, out: &mut Vec<Turn>) {
        for i in 0..self.waiters.len() {
            let w = self.waiters[i];
            if w.told {
                continue;
            }
            let older = &self.waiters[..i];
            let blocked_in = |m: TokenMode| older.iter().any(|o| o.blocks(w.node, m, &w.required));
            if blocked_in(w.mode) && w.alt.is_none_or(blocked_in) {
                continue;
            }
            self.waiters[i].told = true;
            out.push(Turn {
                node: w.node,
                resource,
                waiter: w.id,
            });
        }
    }

    /// Replace `node`'s holding, dropping empty entries so the table stays bounded by
    /// what is actually held.
    fn set(&mut self, node: NodeId, held: HeldRanges) {
        match self.nodes.iter().position(|(n, _)| *n == node) {
            Some(i) if held.is_empty() => {
                self.nodes.swap_remove(i);
            }
            Some(i) => self.nodes[i].1 = held,
            None if held.is_empty() => {}
            None => self.nodes.push((node, held)),
        }
    }
}

/// A notice owed to a queued requester (`ResourceTokens::turns`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Turn {
    node: NodeId,
    resource: ResourceId,
    waiter: u64,
}

/// Deadline of a turn notice: nobody waits for it; a node that does not take it
/// within this is down or busy, and its waiter asks again on its own anyway.
const TURN_DEADLINE: Duration = Duration::from_secs(5);

#[derive(Default)]
struct Shard {
    resources: crate::DetMap<ResourceId, ResourceTokens>,
}

/// The token manager. All methods take `&self`; state is split into shards by a hash
/// of the resource, each behind its own mutex, and no call holds more than one shard
/// lock at a time (so shards can never deadlock against each other).
pub struct TokenManager {
    shards: Box<[Mutex<Shard>]>,
    limits: TokenManagerLimits,
    tokens: AtomicUsize,
    acquires: AtomicU64,
    conflicts: AtomicU64,
    revokes: AtomicU64,
    table_full: AtomicU64,
    downgraded: AtomicU64,
    queued: AtomicU64,
    waiters_expired: AtomicU64,
    waiters_dropped: AtomicU64,
    /// Order of arrival of queued requests (`Waiter::ticket`).
    tickets: AtomicU64,
    turns_sent: AtomicU64,
    /// How turn notices reach the nodes (`notify_through`); without it waiters find
    /// their turn by asking again (their safety poll).
    notifier: OnceLock<Weak<dyn Transport>>,
    /// Origin of the manager's time when no simulation scheduler is installed.
    start: Instant,
    /// A slot being rebuilt (`begin_rebuild`); `rebuilding` says so without the lock.
    rebuild: Mutex<Option<Rebuild>>,
    rebuilding: AtomicBool,
    rebuild_refused: AtomicU64,
    reports: AtomicU64,
    /// The slots this manager serves (`serve_slots`): the routing and this node. A
    /// request that could grant on a resource of another slot is refused with
    /// `TokenError::Rebuilding` (a client that routes a failed manager node's slot here
    /// before this node began its rebuild asks again). `None`: every resource (one
    /// manager, or a simulation).
    serving: Mutex<Option<(ManagerMap, NodeId)>>,
    /// Nodes released (`release_node`) since this manager started: a rebuild that
    /// begins after a failed node's recovery does not wait for it (section 7b).
    released: Mutex<BTreeSet<NodeId>>,
}

fn resource_of(req: &AcquireRequest) -> ResourceId {
    req.resource
}

impl TokenManager {
    pub fn new(limits: TokenManagerLimits) -> Self {
        Self::with_shards(limits, SHARD_COUNT_DEFAULT)
    }

    /// A manager with `shard_count` shards (at least one).
    pub fn with_shards(limits: TokenManagerLimits, shard_count: usize) -> Self {
        let shards = (0..shard_count.max(1))
            .map(|_| Mutex::new(Shard::default()))
            .collect();
        TokenManager {
            shards,
            limits,
            tokens: AtomicUsize::new(0),
            acquires: AtomicU64::new(0),
            conflicts: AtomicU64::new(0),
            revokes: AtomicU64::new(0),
            table_full: AtomicU64::new(0),
            downgraded: AtomicU64::new(0),
            queued: AtomicU64::new(0),
            waiters_expired: AtomicU64::new(0),
            waiters_dropped: AtomicU64::new(0),
            tickets: AtomicU64::new(0),
            turns_sent: AtomicU64::new(0),
            notifier: OnceLock::new(),
            start: Instant::now(),
            rebuild: Mutex::new(None),
            rebuilding: AtomicBool::new(false),
            rebuild_refused: AtomicU64::new(0),
            reports: AtomicU64::new(0),
            serving: Mutex::new(None),
            released: Mutex::new(BTreeSet::new()),
        }
    }

    /// Start rebuilding the slot `slot` of `map` (docs/coherence.md section 7b): this
    /// manager takes over the slot of a manager node that failed, whose table is lost.
    /// Until every node of `live` reported what it holds there (`apply_report`) and
    /// every node of `failed` was recovered (`release_node`), requests that could
    /// grant or name a metanode on a resource of the slot are refused with
    /// `TokenError::Rebuilding`; giving up (relinquish, downgrade, cancel) and
    /// versions are taken as usual. Queued requests of the old table are gone: their
    /// requesters ask again and queue anew. `collect_reports` asks the nodes.
    ///
    /// A failed node already released here (its recovery ended before the rebuild
    /// began) is not waited for: a manager node's slot moves once (a node that
    /// rejoins after losing its table serves no slot again, docs/coherence.md 7b),
    /// so a release recorded here is the one of that failure. If this manager serves only some slots
    /// (`serve_slots`), it serves `slot` of `map` from now on too.
    pub fn begin_rebuild(&self, map: ManagerMap, slot: usize, live: &[NodeId], failed: &[NodeId]) {
        let released = self.released.lock().clone();
        let rebuild = Rebuild {
            map: map.clone(),
            slot,
            reporting: live.iter().copied().collect(),
            recovering: failed
                .iter()
                .copied()
                .filter(|n| !live.contains(n) && !released.contains(n))
                .collect(),
        };
        let done = rebuild.done();
        *self.rebuild.lock() = (!done).then_some(rebuild);
        self.rebuilding.store(!done, Ordering::SeqCst);
        // After the rebuild is in place (the slot is refused until it is done): the
        // slot is this manager's from now on.
        if let Some((served, me)) = self.serving.lock().as_mut() {
            if served.nodes.len() == map.nodes.len() {
                served.nodes[slot] = *me;
            } else {
                *served = map;
            }
        }
    }

    /// Serve only the slots `map` gives to `me` (`serving`); a node's manager in a
    /// cluster of several manager nodes. Slots taken over later are added by
    /// `begin_rebuild`.
    pub fn serve_slots(&self, map: ManagerMap, me: NodeId) {
        *self.serving.lock() = Some((map, me));
    }

    /// The routing this manager serves by, if it serves only some slots.
    pub fn serving(&self) -> Option<ManagerMap> {
        self.serving.lock().as_ref().map(|(m, _)| m.clone())
    }

    /// Is a rebuild running? (Nodes still to report or to be recovered.)
    pub fn is_rebuilding(&self) -> bool {
        self.rebuilding.load(Ordering::SeqCst)
    }

    /// The nodes a running rebuild still waits for: (to report, to be recovered).
    pub fn rebuild_waits_for(&self) -> (Vec<NodeId>, Vec<NodeId>) {
        match &*self.rebuild.lock() {
            Some(r) => (
                r.reporting.iter().copied().collect(),
                r.recovering.iter().copied().collect(),
            ),
            None => (Vec::new(), Vec::new()),
        }
    }

    /// The refusal for a request on `resource` while its slot is rebuilding.
    pub fn rebuild_refusal(&self, resource: ResourceId) -> Option<TokenError> {
        if let Some((map, me)) = self.serving.lock().as_ref() {
            let slot = map.slot_for(&resource);
            if map.nodes.get(slot).is_some_and(|n| n != me) {
                // Not (yet) this node's slot: its takeover has not begun here.
                self.rebuild_refused.fetch_add(1, Ordering::Relaxed);
                return Some(TokenError::Rebuilding {
                    resource,
                    reporting: Vec::new(),
                    recovering: vec![map.nodes[slot]],
                });
            }
        }
        if !self.rebuilding.load(Ordering::SeqCst) {
            return None;
        }
        let rebuild = self.rebuild.lock();
        let r = rebuild.as_ref()?;
        if r.map.slot_for(&resource) != r.slot {
            return None;
        }
        // The claim on a failed node's log is what the recoveries this rebuild waits
        // for take first (`mako_fs::recovery::recover_failed_node`): refusing it until
        // they are done would wait forever. Once every live node reported, the table
        // knows every live holder of a claim; a failed node's claim is absent, and it
        // writes nothing more (fenced), so granting it is safe.
        if resource.kind == crate::ResourceKind::RecoveryLog && r.reporting.is_empty() {
            return None;
        }
        self.rebuild_refused.fetch_add(1, Ordering::Relaxed);
        Some(TokenError::Rebuilding {
            resource,
            reporting: r.reporting.iter().copied().collect(),
            recovering: r.recovering.iter().copied().collect(),
        })
    }

    /// Take in `node`'s report of what it holds in the rebuilt slot. Returns whether it
    /// was taken: a report from a node the rebuild does not wait for (it reported
    /// already, or was recovered meanwhile: it holds nothing) is dropped. Each piece is
    /// recorded as the node reports it; a node that gave part of it up after making
    /// the report may be recorded holding more than it does, never less, and the next
    /// revoke of it clears that (giving up what is not held is answered, and
    /// relinquished, as usual).
    pub fn apply_report(&self, node: NodeId, held: &[HeldToken]) -> bool {
        let mut rebuild = self.rebuild.lock();
        let Some(r) = rebuild.as_mut() else {
            return false;
        };
        if !r.reporting.remove(&node) {
            return false;
        }
        self.reports.fetch_add(1, Ordering::Relaxed);
        for token in held {
            if r.map.slot_for(&token.resource) != r.slot {
                continue;
            }
            let mut shard = self.shard(&token.resource).lock();
            let entry = shard.resources.entry(token.resource).or_default();
            let mut mine = entry.node(node).cloned().unwrap_or_default();
            let old_len = mine.len();
            for (range, mode) in &token.pieces {
                if !range.is_empty() {
                    mine.grant(*range, *mode);
                }
            }
            let new_len = mine.len();
            self.tokens.fetch_add(new_len - old_len, Ordering::Relaxed);
            entry.set(node, mine);
            entry.version = entry.version.max(token.version);
            if token.metanode && entry.metanode.is_none() && entry.writes(node) {
                entry.metanode = Some(node);
            }
            if entry.is_unused() {
                shard.resources.remove(&token.resource);
            }
        }
        if r.done() {
            *rebuild = None;
            self.rebuilding.store(false, Ordering::SeqCst);
        }
        true
    }

    /// Ask every node a running rebuild waits for what it holds in the slot
    /// (`ClientRequest::HeldIn`, all at once), take the answers in, and ask again
    /// those that did not answer after `retry`, until every live node answered or
    /// was recovered (a node that fails meanwhile is recovered like any failed node,
    /// which ends the wait for it). Returns the number of rounds. Recoveries the
    /// rebuild still waits for after that end it when they release their nodes.
    pub fn collect_reports(&self, transport: &dyn Transport, retry: Duration) -> u32 {
        let mut rounds = 0;
        loop {
            let (request, nodes) = {
                let rebuild = self.rebuild.lock();
                let Some(r) = rebuild.as_ref() else {
                    return rounds;
                };
                if r.reporting.is_empty() {
                    return rounds;
                }
                let request = crate::protocol::ClientRequest::HeldIn {
                    slot: u32::try_from(r.slot).unwrap_or(u32::MAX),
                    managers: r.map.clone(),
                };
                (request, r.reporting.iter().copied().collect::<Vec<_>>())
            };
            rounds += 1;
            let body = mako_rt::encode("held in", &request).unwrap_or_default();
            let calls = nodes
                .iter()
                .map(|n| (*n, ServiceId::TokenClient, body.clone()))
                .collect();
            let options = CallOptions {
                deadline: TURN_DEADLINE,
                ..CallOptions::default()
            };
            let answers = transport.call_many(calls, options);
            let mut missing = false;
            for (node, answer) in nodes.iter().zip(answers) {
                let reply = answer.ok().and_then(|b| {
                    mako_rt::decode::<crate::protocol::ClientReply>("held reply", &b).ok()
                });
                match reply {
                    Some(crate::protocol::ClientReply::Held(held)) => {
                        self.apply_report(*node, &held);
                    }
                    _ => missing = true,
                }
            }
            if missing {
                if mako_diag::sched::active() {
                    mako_diag::sched::sleep(retry);
                } else {
                    std::thread::sleep(retry);
                }
            }
        }
    }

    /// Time for waiter leases: simulated time under a simulation, real otherwise.
    fn now(&self) -> Duration {
        match mako_diag::sched::current() {
            Some(s) => s.now(),
            None => self.start.elapsed(),
        }
    }

    pub fn limits(&self) -> TokenManagerLimits {
        self.limits
    }

    /// Send turn notices (`ClientRequest::Turn`) through `transport`, the hosting
    /// node's (held weakly: the transport serves this manager). Set once; later calls
    /// change nothing.
    pub fn notify_through(&self, transport: Weak<dyn Transport>) {
        let _ = self.notifier.set(transport);
    }

    /// Tell the requesters of `turns` (after the shard lock is released).
    fn send_turns(&self, turns: Vec<Turn>) {
        if turns.is_empty() {
            return;
        }
        self.turns_sent
            .fetch_add(turns.len() as u64, Ordering::Relaxed);
        let Some(transport) = self.notifier.get().and_then(Weak::upgrade) else {
            return;
        };
        let options = CallOptions {
            deadline: TURN_DEADLINE,
            ..CallOptions::default()
        };
        for t in turns {
            let request = crate::protocol::ClientRequest::Turn {
                resource: t.resource,
                waiter: t.waiter,
            };
            if let Ok(body) = mako_rt::encode("turn", &request) {
                transport.post(t.node, ServiceId::TokenClient, body, options);
            }
        }
    }

    fn shard(&self, resource: &ResourceId) -> &Mutex<Shard> {
        // A multiplicative mix of the fields; cheaper than SipHash and deterministic,
        // so a printed seed reproduces the same shard placement.
        let mut h = resource.id ^ (u64::from(resource.fs) << 40) ^ ((resource.kind as u64) << 56);
        h = h.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        h ^= h >> 29;
        let index = (h % self.shards.len() as u64) as usize;
        &self.shards[index]
    }

    /// Grant `req.mode` over the widest range that contains `req.required`, lies within
    /// `req.desired` and conflicts with no other node's token. If `required` itself
    /// conflicts, nothing changes and the error lists exactly the conflicting holders.
    /// A node never conflicts with itself: re-acquiring merges with, or upgrades, what
    /// it already holds.
    pub fn acquire(&self, req: AcquireRequest) -> Result<Grant, TokenError> {
        let mut turns = Vec::new();
        let result = self.acquire_inner(req, &mut turns);
        self.send_turns(turns);
        result
    }

    fn acquire_inner(
        &self,
        req: AcquireRequest,
        turns: &mut Vec<Turn>,
    ) -> Result<Grant, TokenError> {
        self.acquires.fetch_add(1, Ordering::Relaxed);
        self.revokes
            .fetch_add(u64::from(req.revoke_answers), Ordering::Relaxed);
        validate_request(&req)?;
        if let Some(e) = self.rebuild_refusal(req.resource) {
            return Err(e);
        }
        let mut shard = self.shard(&resource_of(&req)).lock();
        if let Some(t) = shard.resources.get_mut(&req.resource) {
            let lease = Duration::from_millis(self.limits.waiter_lease_ms);
            let expired = t.expire_waiters(self.now(), lease);
            self.waiters_expired
                .fetch_add(expired as u64, Ordering::Relaxed);
            if expired > 0 {
                t.turns(req.resource, turns);
            }
        }
        let req = match req.condition {
            Some(c)
                if shard
                    .resources
                    .get(&req.resource)
                    .is_some_and(|t| t.version > c.seen_version) =>
            {
                // The reason for the request is gone: ask for what is needed now.
                self.downgraded.fetch_add(1, Ordering::Relaxed);
                let r = AcquireRequest {
                    mode: c.fallback_mode,
                    required: c.fallback_required,
                    desired: c.fallback_desired,
                    condition: None,
                    ..req
                };
                validate_request(&r)?;
                r
            }
            _ => req,
        };
        let AcquireRequest {
            node,
            resource,
            mut mode,
            required,
            desired,
            ..
        } = req;
        let tokens = shard.resources.get(&resource);
        let ticket = tokens.and_then(|t| t.ticket_of(node, req.waiter));
        // In the way of `m`: a conflicting holder, or an older conflicting waiter.
        let blocked = |m: TokenMode| {
            tokens.is_some_and(|t| {
                t.conflicting(node, m).any(|h| h.range.overlaps(&required))
                    || t.waiters_ahead(node, ticket, m, &required).next().is_some()
            })
        };
        if let Some(alt) = req.alt_mode {
            if blocked(mode) && !blocked(alt) {
                mode = alt;
            }
        }
        if let Some(up) = req.upgrade_to.filter(|up| crate::mode::covers(*up, mode)) {
            // Exclusively only if nobody holds or waits for anything in the way (a
            // younger waiter too: it would have to revoke what it could have shared).
            let free = tokens.is_none_or(|t| {
                t.conflicting(node, up)
                    .all(|h| !h.range.overlaps(&required))
                    && !t.waiters.iter().any(|w| w.blocks(node, up, &required))
            });
            if free {
                mode = up;
            }
        }

        // 1. Conflicts over the required range: refuse with the copyset, or, when an
        //    older request of another node is in the way, refuse with its place in the
        //    queue (it is served first; fairness, docs/coherence.md section 2).
        let copyset: Vec<Holder> = tokens
            .map(|t| {
                t.conflicting(node, mode)
                    .filter(|h| h.range.overlaps(&required))
                    .collect()
            })
            .unwrap_or_default();
        let mut ahead: Vec<NodeId> = tokens
            .map(|t| {
                t.waiters_ahead(node, ticket, mode, &required)
                    .map(|w| w.node)
                    .collect()
            })
            .unwrap_or_default();
        ahead.dedup();
        if !copyset.is_empty() || !ahead.is_empty() {
            let metanode = tokens
                .and_then(|t| t.metanode)
                .filter(|m| copyset.iter().any(|h| h.node == *m));
            if let Some(id) = req.waiter {
                let now = self.now();
                let t = shard.resources.entry(resource).or_default();
                match t.waiters.iter_mut().find(|w| w.node == node && w.id == id) {
                    // Keeps its place; what it asks for may have changed (a fallback).
                    Some(w) => {
                        w.mode = mode;
                        w.alt = req.alt_mode;
                        w.required = required;
                        w.condition = req.condition;
                        w.refreshed = now;
                        w.told = ahead.is_empty();
                    }
                    None => t.waiters.push(Waiter {
                        node,
                        id,
                        ticket: self.tickets.fetch_add(1, Ordering::Relaxed),
                        mode,
                        alt: req.alt_mode,
                        required,
                        condition: req.condition,
                        refreshed: now,
                        told: ahead.is_empty(),
                    }),
                }
                // What it asks may have changed (a fallback, an alternative mode):
                // requests behind it may have their turn now.
                t.turns(resource, turns);
            }
            if !ahead.is_empty() {
                self.queued.fetch_add(1, Ordering::Relaxed);
                return Err(TokenError::Queued {
                    resource,
                    mode,
                    required,
                    ahead,
                    copyset,
                });
            }
            self.conflicts.fetch_add(1, Ordering::Relaxed);
            return Err(TokenError::Conflict {
                resource,
                mode,
                required,
                copyset,
                metanode,
            });
        }

        // 2. Widen: clip `desired` at the nearest conflicting piece on each side, and
        //    at what other nodes wait for in a conflicting mode.
        let mut granted = desired;
        if let Some(t) = tokens {
            let waited = t
                .waiters
                .iter()
                .filter(|w| w.node != node && w.conflicts(mode))
                .map(|w| w.required);
            for range in t.conflicting(node, mode).map(|h| h.range).chain(waited) {
                if range.end <= required.start {
                    granted.start = granted.start.max(range.end);
                } else if range.start >= required.end {
                    granted.end = granted.end.min(range.start);
                } else if t.conflicting(node, mode).any(|h| h.range == range) {
                    unreachable!("{range} overlaps required {required} but was not in the copyset");
                }
                // A younger waiter over `required` itself: this older request goes
                // first, the waiter revokes it after.
            }
        }
        assert!(
            granted.contains(&required),
            "grant {granted} lost required {required}"
        );
        assert!(
            desired.contains(&granted),
            "grant {granted} outside desired {desired}"
        );

        // 3. Merge into what the node already holds (joining modes where it overlaps;
        //    `join_preserves_compatibility` in mode.rs is why checking only `mode` in
        //    steps 1 and 2 suffices).
        let old = tokens.and_then(|t| t.node(node));
        let old_len = old.map_or(0, HeldRanges::len);
        let mut held = old.cloned().unwrap_or_default();
        if req.replace {
            held.remove(granted);
        }
        held.grant(granted, mode);

        // 4. Reserve table space for new pieces before changing anything.
        let new_len = held.len();
        if new_len > old_len && !self.reserve(new_len - old_len) {
            self.table_full.fetch_add(1, Ordering::Relaxed);
            return Err(TokenError::TableFull {
                node,
                resource,
                tokens_max: self.limits.tokens_max,
            });
        }
        if new_len < old_len {
            self.tokens.fetch_sub(old_len - new_len, Ordering::Relaxed);
        }

        // 5. Commit, then re-check the invariant this whole crate exists for.
        let entry = shard.resources.entry(resource).or_default();
        entry.set(node, held);
        if let Some(id) = req.waiter {
            entry.remove_waiter(node, id);
            entry.turns(resource, turns);
        }
        if resource.kind == crate::ResourceKind::Inode {
            // The exclusive writer owns the inode; the first shared writer becomes its
            // metanode (docs/coherence.md section 4).
            if mode == TokenMode::Xw || (mode == TokenMode::Rw && entry.metanode.is_none()) {
                entry.metanode = Some(node);
            }
        } else if matches!(
            resource.kind,
            crate::ResourceKind::AllocRegion | crate::ResourceKind::InodeMapSegment
        ) && mode == TokenMode::Xw
        {
            // The holder of a region or segment owns it: frees other nodes make there
            // are sent to it (`locate_metanode` finds it).
            entry.metanode = Some(node);
        }
        entry.check_metanode();
        let version = entry.version;
        let metanode = entry.metanode == Some(node);
        let mut waiting: Vec<NodeId> = entry
            .waiters
            .iter()
            .filter(|w| w.node != node && w.conflicts(mode))
            .map(|w| w.node)
            .collect();
        waiting.sort();
        waiting.dedup();
        let contenders = u32::try_from(waiting.len()).unwrap_or(u32::MAX);
        if let Some(bad) = entry
            .conflicting(node, mode)
            .find(|h| h.range.overlaps(&granted))
        {
            panic!("token table invariant broken: granted {mode} {granted} on {resource} to {node} over {bad}");
        }
        Ok(Grant {
            node,
            resource,
            mode,
            range: granted,
            version,
            metanode,
            contenders,
        })
    }

    /// Take `count` tokens from the budget, or nothing if that would pass `tokens_max`.
    fn reserve(&self, count: usize) -> bool {
        self.tokens
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |current| {
                current
                    .checked_add(count)
                    .filter(|&total| total <= self.limits.tokens_max)
            })
            .is_ok()
    }

    /// Apply `change` to `node`'s holding on `resource` and keep the token count right.
    fn update_node<T>(
        &self,
        node: NodeId,
        resource: ResourceId,
        change: impl FnOnce(&mut HeldRanges) -> Result<T, TokenError>,
    ) -> Result<Option<T>, TokenError> {
        let mut shard = self.shard(&resource).lock();
        let Some(tokens) = shard.resources.get_mut(&resource) else {
            return Ok(None);
        };
        let Some(old) = tokens.node(node) else {
            return Ok(None);
        };
        let old_len = old.len();
        let mut held = old.clone();
        let out = change(&mut held)?;
        let new_len = held.len();
        // Giving up may split a piece and pass tokens_max; see TokenManagerLimits.
        if new_len > old_len {
            self.tokens.fetch_add(new_len - old_len, Ordering::Relaxed);
        } else {
            self.tokens.fetch_sub(old_len - new_len, Ordering::Relaxed);
        }
        tokens.set(node, held);
        tokens.check_metanode();
        if tokens.is_unused() {
            shard.resources.remove(&resource);
        }
        Ok(Some(out))
    }

    /// Drop `node`'s tokens over `range`, splitting held pieces that straddle it.
    /// Relinquishing what is not held is not an error, so a retried message is harmless.
    pub fn relinquish(
        &self,
        node: NodeId,
        resource: ResourceId,
        range: ByteRange,
    ) -> Result<(), TokenError> {
        validate_range(node, resource, range)?;
        self.update_node(node, resource, |held| {
            held.remove(range);
            Ok(())
        })?;
        Ok(())
    }

    /// Weaken `node`'s tokens over `range` to `to`. Every held piece there must cover
    /// `to` (`xw` to `rw` or `ro`); otherwise nothing changes and the error says which
    /// piece. Parts of `range` that are not held stay unheld.
    pub fn downgrade(
        &self,
        node: NodeId,
        resource: ResourceId,
        range: ByteRange,
        to: TokenMode,
    ) -> Result<(), TokenError> {
        validate_range(node, resource, range)?;
        self.update_node(node, resource, |held| {
            held.downgrade(range, to)
                .map_err(|(range, held)| TokenError::NotADowngrade {
                    node,
                    resource,
                    range,
                    held,
                    to,
                })
        })?;
        Ok(())
    }

    /// Drop every token `node` holds, for example after it failed. Returns how many
    /// tokens were dropped.
    pub fn release_node(&self, node: NodeId) -> usize {
        let mut dropped = 0;
        let mut turns = Vec::new();
        for shard in self.shards.iter() {
            let mut shard = shard.lock();
            shard.resources.retain(|resource, tokens| {
                if let Some(i) = tokens.nodes.iter().position(|(n, _)| *n == node) {
                    dropped += tokens.nodes.swap_remove(i).1.len();
                }
                let before = tokens.waiters.len();
                tokens.waiters.retain(|w| w.node != node);
                if tokens.waiters.len() < before {
                    tokens.turns(*resource, &mut turns);
                }
                tokens.check_metanode();
                !tokens.is_unused()
            });
        }
        self.tokens.fetch_sub(dropped, Ordering::Relaxed);
        self.send_turns(turns);
        // A released node holds nothing: a rebuild waits for it no more, nor one that
        // begins later.
        self.released.lock().insert(node);
        let mut rebuild = self.rebuild.lock();
        if let Some(r) = rebuild.as_mut() {
            r.reporting.remove(&node);
            r.recovering.remove(&node);
            if r.done() {
                *rebuild = None;
                self.rebuilding.store(false, Ordering::SeqCst);
            }
        }
        dropped
    }

    /// The metanode of inode resource `resource`. With `become_if_none`, a node that
    /// holds a write mode on it and finds no metanode becomes it.
    pub fn locate_metanode(
        &self,
        node: NodeId,
        resource: ResourceId,
        become_if_none: bool,
    ) -> Option<NodeId> {
        let mut shard = self.shard(&resource).lock();
        let tokens = shard.resources.get_mut(&resource)?;
        if tokens.metanode.is_none() && become_if_none && tokens.writes(node) {
            tokens.metanode = Some(node);
        }
        tokens.metanode
    }

    /// `node` stops being the metanode of `resource` (it wrote the inode in place).
    pub fn resign_metanode(&self, node: NodeId, resource: ResourceId) {
        let mut shard = self.shard(&resource).lock();
        if let Some(t) = shard.resources.get_mut(&resource) {
            if t.metanode == Some(node) {
                t.metanode = None;
            }
        }
    }

    /// Record that a holder changed the structure of `resource` (see
    /// [`AcquireRequest::condition`]). Versions only grow.
    pub fn set_version(&self, resource: ResourceId, version: u64) {
        let mut turns = Vec::new();
        let mut shard = self.shard(&resource).lock();
        if let Some(t) = shard.resources.get_mut(&resource) {
            t.version = t.version.max(version);
            // Queued requests made for the structure that just changed need only their
            // fallback now: they stop standing in the way of others' shared modes.
            let version = t.version;
            for w in &mut t.waiters {
                if let Some(c) = w.condition.filter(|c| version > c.seen_version) {
                    w.mode = c.fallback_mode;
                    w.required = c.fallback_required;
                    w.condition = None;
                }
            }
            t.turns(resource, &mut turns);
        }
        drop(shard);
        self.send_turns(turns);
    }

    /// The requester of queued request `waiter` stopped waiting (it failed, or its
    /// operation gave up): it no longer stands in anyone's way.
    pub fn cancel(&self, node: NodeId, resource: ResourceId, waiter: u64) {
        let mut turns = Vec::new();
        let mut shard = self.shard(&resource).lock();
        if let Some(t) = shard.resources.get_mut(&resource) {
            t.remove_waiter(node, waiter);
            t.turns(resource, &mut turns);
            if t.is_unused() {
                shard.resources.remove(&resource);
            }
        }
        drop(shard);
        self.send_turns(turns);
    }

    /// A call to `node` failed: drop its queued requests everywhere (they would hold
    /// everyone behind them until their lease ran out); returns how many. What it
    /// holds stays.
    pub fn drop_waiters(&self, node: NodeId) -> usize {
        let mut dropped = 0;
        let mut turns = Vec::new();
        for shard in self.shards.iter() {
            let mut shard = shard.lock();
            shard.resources.retain(|resource, t| {
                let before = t.waiters.len();
                t.waiters.retain(|w| w.node != node);
                if t.waiters.len() < before {
                    dropped += before - t.waiters.len();
                    t.turns(*resource, &mut turns);
                }
                !t.is_unused()
            });
        }
        self.waiters_dropped
            .fetch_add(dropped as u64, Ordering::Relaxed);
        self.send_turns(turns);
        dropped
    }

    /// Drop `node`'s queued requests on `resource` other than those of its acquires
    /// `keep` (it answered which of them run: `ManagerRequest::DropWaitersOn`);
    /// returns how many.
    pub fn drop_waiters_on(&self, node: NodeId, resource: ResourceId, keep: &[u64]) -> usize {
        let mut shard = self.shard(&resource).lock();
        let Some(t) = shard.resources.get_mut(&resource) else {
            return 0;
        };
        let before = t.waiters.len();
        t.waiters.retain(|w| w.node != node || keep.contains(&w.id));
        let dropped = before - t.waiters.len();
        let mut turns = Vec::new();
        t.turns(resource, &mut turns);
        if t.is_unused() {
            shard.resources.remove(&resource);
        }
        drop(shard);
        self.waiters_dropped
            .fetch_add(dropped as u64, Ordering::Relaxed);
        self.send_turns(turns);
        dropped
    }

    /// The nodes with queued requests on `resource`, oldest first (diagnostics, tests).
    pub fn waiters(&self, resource: ResourceId) -> Vec<NodeId> {
        let shard = self.shard(&resource).lock();
        let Some(t) = shard.resources.get(&resource) else {
            return Vec::new();
        };
        let mut w: Vec<&Waiter> = t.waiters.iter().collect();
        w.sort_by_key(|w| w.ticket);
        w.into_iter().map(|w| w.node).collect()
    }

    /// The structure version of `resource` (0 when nothing is held on it).
    pub fn version(&self, resource: ResourceId) -> u64 {
        self.shard(&resource)
            .lock()
            .resources
            .get(&resource)
            .map_or(0, |t| t.version)
    }

    /// Everyone holding tokens on `resource`, ordered by range start then node.
    pub fn holders(&self, resource: ResourceId) -> Vec<Holder> {
        self.shard(&resource)
            .lock()
            .resources
            .get(&resource)
            .map(ResourceTokens::holders)
            .unwrap_or_default()
    }

    /// The whole table, ordered by resource, for `mako diag tokens`. Each shard is
    /// copied under its own lock, so the dump is consistent per resource, not globally.
    pub fn dump(&self) -> Vec<(ResourceId, Vec<Holder>)> {
        let mut out = Vec::new();
        for shard in self.shards.iter() {
            let shard = shard.lock();
            out.extend(
                shard
                    .resources
                    .iter()
                    .filter(|(_, t)| !t.nodes.is_empty())
                    .map(|(r, t)| (*r, t.holders())),
            );
        }
        out.sort_by_key(|(r, _)| *r);
        out
    }

    pub fn stats(&self) -> TokenStats {
        TokenStats {
            acquires: self.acquires.load(Ordering::Relaxed),
            conflicts: self.conflicts.load(Ordering::Relaxed),
            revokes: self.revokes.load(Ordering::Relaxed),
            table_full: self.table_full.load(Ordering::Relaxed),
            tokens: self.tokens.load(Ordering::Relaxed),
            downgraded: self.downgraded.load(Ordering::Relaxed),
            queued: self.queued.load(Ordering::Relaxed),
            waiters_expired: self.waiters_expired.load(Ordering::Relaxed),
            waiters_dropped: self.waiters_dropped.load(Ordering::Relaxed),
            turns: self.turns_sent.load(Ordering::Relaxed),
            rebuild_refused: self.rebuild_refused.load(Ordering::Relaxed),
            reports: self.reports.load(Ordering::Relaxed),
        }
    }
}

impl Default for TokenManager {
    fn default() -> Self {
        Self::new(TokenManagerLimits::default())
    }
}

/// A range named in a request must be non-empty, and whole for non-ranged resources.
pub(crate) fn validate_range(
    node: NodeId,
    resource: ResourceId,
    range: ByteRange,
) -> Result<(), TokenError> {
    if range.is_empty() {
        return Err(TokenError::EmptyRange {
            node,
            resource,
            range,
        });
    }
    if !resource.kind.is_ranged() && range != ByteRange::WHOLE {
        return Err(TokenError::WholeRangeRequired {
            node,
            resource,
            range,
        });
    }
    Ok(())
}

/// Checks shared by the manager and the client's hot path, so a request that the
/// manager would refuse is never answered from a client cache.
pub(crate) fn validate_request(req: &AcquireRequest) -> Result<(), TokenError> {
    validate_range(req.node, req.resource, req.required)?;
    validate_range(req.node, req.resource, req.desired)?;
    if !req.desired.contains(&req.required) {
        return Err(TokenError::RequiredOutsideDesired {
            node: req.node,
            resource: req.resource,
            required: req.required,
            desired: req.desired,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resource::ResourceKind;
    use TokenMode::*;

    const A: NodeId = NodeId(1);
    const B: NodeId = NodeId(2);
    const C: NodeId = NodeId(3);

    fn file() -> ResourceId {
        ResourceId::new(1, ResourceKind::ByteRange, 7)
    }

    fn inode() -> ResourceId {
        ResourceId::new(1, ResourceKind::Inode, 7)
    }

    fn r(s: u64, e: u64) -> ByteRange {
        ByteRange::new(s, e)
    }

    fn req(
        node: NodeId,
        mode: TokenMode,
        required: ByteRange,
        desired: ByteRange,
    ) -> AcquireRequest {
        AcquireRequest::new(node, file(), mode, required, desired)
    }

    fn copyset(e: TokenError) -> Vec<Holder> {
        match e {
            TokenError::Conflict { copyset, .. } => copyset,
            other => panic!("expected a conflict, got {other}"),
        }
    }

    #[test]
    fn whole_resource_table() {
        let m = TokenManager::default();
        m.acquire(AcquireRequest::whole(A, inode(), Ro))
            .expect("first ro");
        m.acquire(AcquireRequest::whole(B, inode(), Ro))
            .expect("ro shares with ro");
        let cs = copyset(
            m.acquire(AcquireRequest::whole(C, inode(), Rw))
                .unwrap_err(),
        );
        assert_eq!(cs.len(), 2, "both readers block a writer: {cs:?}");
        m.release_node(A);
        m.release_node(B);
        m.acquire(AcquireRequest::whole(A, inode(), Rw))
            .expect("rw");
        m.acquire(AcquireRequest::whole(B, inode(), Rw))
            .expect("rw shares with rw");
        let cs = copyset(
            m.acquire(AcquireRequest::whole(C, inode(), Ro))
                .unwrap_err(),
        );
        assert_eq!(cs.iter().map(|h| h.node).collect::<Vec<_>>(), vec![A, B]);
        let cs = copyset(
            m.acquire(AcquireRequest::whole(C, inode(), Xw))
                .unwrap_err(),
        );
        assert_eq!(cs.len(), 2);
        assert_eq!(m.stats().conflicts, 3);
    }

    #[test]
    fn widest_grant_clips_at_nearest_conflicts() {
        let m = TokenManager::default();
        m.acquire(req(A, Xw, r(0, 100), r(0, 100))).expect("a");
        m.acquire(req(B, Xw, r(1000, 1100), r(1000, 1100)))
            .expect("b");
        m.acquire(req(B, Xw, r(5000, 5100), r(5000, 5100)))
            .expect("b far");
        let g = m
            .acquire(req(C, Ro, r(400, 500), ByteRange::WHOLE))
            .expect("between them");
        assert_eq!(g.range, r(100, 1000), "clipped at A's end and B's start");
        // Within a narrower desired range, desired wins.
        let g = m
            .acquire(req(C, Xw, r(2000, 2100), r(1500, 3000)))
            .expect("c");
        assert_eq!(g.range, r(1500, 3000));
        // Compatible holders do not clip.
        let g = m
            .acquire(req(A, Ro, r(200, 300), r(100, 1000)))
            .expect("ro next to ro");
        assert_eq!(g.range, r(100, 1000));
    }

    #[test]
    fn conflict_lists_exactly_the_conflicting_holders() {
        let m = TokenManager::default();
        m.acquire(req(A, Ro, r(0, 100), r(0, 100))).expect("a");
        m.acquire(req(B, Ro, r(50, 150), r(50, 150))).expect("b");
        m.acquire(req(C, Ro, r(500, 600), r(500, 600)))
            .expect("c, elsewhere");
        let before = m.dump();
        let cs = copyset(
            m.acquire(AcquireRequest::new(
                NodeId(4),
                file(),
                Xw,
                r(90, 95),
                ByteRange::WHOLE,
            ))
            .unwrap_err(),
        );
        assert_eq!(
            cs,
            vec![
                Holder {
                    node: A,
                    mode: Ro,
                    range: r(0, 100)
                },
                Holder {
                    node: B,
                    mode: Ro,
                    range: r(50, 150)
                },
            ]
        );
        assert_eq!(m.dump(), before, "a refused acquire changes nothing");
    }

    #[test]
    fn same_node_merges_and_upgrades() {
        let m = TokenManager::default();
        m.acquire(req(A, Ro, r(0, 100), r(0, 100))).expect("ro");
        m.acquire(req(A, Ro, r(100, 200), r(100, 200)))
            .expect("adjacent ro");
        assert_eq!(
            m.holders(file()),
            vec![Holder {
                node: A,
                mode: Ro,
                range: r(0, 200)
            }]
        );
        m.acquire(req(A, Xw, r(50, 60), r(50, 60)))
            .expect("upgrade part, no self conflict");
        assert_eq!(
            m.holders(file()),
            vec![
                Holder {
                    node: A,
                    mode: Ro,
                    range: r(0, 50)
                },
                Holder {
                    node: A,
                    mode: Xw,
                    range: r(50, 60)
                },
                Holder {
                    node: A,
                    mode: Ro,
                    range: r(60, 200)
                },
            ]
        );
        // Asking for less than held keeps the stronger token (dirty data may be under it).
        m.acquire(req(A, Ro, r(50, 60), r(50, 60)))
            .expect("ro under xw");
        assert_eq!(m.holders(file())[1].mode, Xw);
        // ro joined with rw is xw: the node asked for both promises.
        m.acquire(req(A, Rw, r(0, 10), r(0, 10)))
            .expect("rw over ro");
        assert_eq!(
            m.holders(file())[0],
            Holder {
                node: A,
                mode: Xw,
                range: r(0, 10)
            }
        );
        // A second reader now conflicts only with the xw parts.
        let g = m
            .acquire(req(B, Ro, r(100, 110), ByteRange::WHOLE))
            .expect("b ro");
        assert_eq!(g.range, r(60, u64::MAX));
    }

    #[test]
    fn relinquish_splits_and_downgrade_weakens() {
        let m = TokenManager::default();
        m.acquire(req(A, Xw, r(0, 100), r(0, 100))).expect("xw");
        m.relinquish(A, file(), r(40, 60))
            .expect("relinquish middle");
        assert_eq!(m.stats().tokens, 2);
        m.relinquish(A, file(), r(1000, 2000))
            .expect("relinquishing nothing is fine");
        m.downgrade(A, file(), r(0, 40), Ro).expect("xw to ro");
        let err = m.downgrade(A, file(), r(0, 10), Rw).unwrap_err();
        assert!(
            matches!(
                err,
                TokenError::NotADowngrade {
                    held: Ro,
                    to: Rw,
                    ..
                }
            ),
            "{err}"
        );
        m.acquire(req(B, Ro, r(10, 20), r(10, 20)))
            .expect("ro shares the downgraded part");
        let cs = copyset(m.acquire(req(B, Ro, r(10, 70), r(10, 70))).unwrap_err());
        assert_eq!(
            cs,
            vec![Holder {
                node: A,
                mode: Xw,
                range: r(60, 100)
            }]
        );
        assert_eq!(m.release_node(A), 2);
        assert_eq!(
            m.holders(file()),
            vec![Holder {
                node: B,
                mode: Ro,
                range: r(10, 20)
            }]
        );
        m.relinquish(B, file(), ByteRange::WHOLE).expect("all");
        assert!(m.dump().is_empty(), "empty resources leave the table");
        assert_eq!(m.stats().tokens, 0);
    }

    #[test]
    fn bad_requests_are_refused() {
        let m = TokenManager::default();
        let e = m.acquire(req(A, Ro, r(10, 20), r(15, 30))).unwrap_err();
        assert!(
            matches!(e, TokenError::RequiredOutsideDesired { .. }),
            "{e}"
        );
        assert!(e.to_string().contains("widen desired"), "{e}");
        let e = m.acquire(req(A, Ro, r(10, 10), r(0, 30))).unwrap_err();
        assert!(matches!(e, TokenError::EmptyRange { .. }), "{e}");
        let e = m
            .acquire(AcquireRequest::new(A, inode(), Ro, r(0, 10), r(0, 10)))
            .unwrap_err();
        assert!(matches!(e, TokenError::WholeRangeRequired { .. }), "{e}");
        let e = m.relinquish(A, file(), r(5, 1)).unwrap_err();
        assert!(matches!(e, TokenError::EmptyRange { .. }), "{e}");
    }

    #[test]
    fn table_full_is_reported_and_recoverable() {
        let m = TokenManager::new(TokenManagerLimits {
            tokens_max: 2,
            ..TokenManagerLimits::default()
        });
        m.acquire(req(A, Xw, r(0, 10), r(0, 10))).expect("1");
        m.acquire(req(A, Xw, r(10, 20), r(10, 20)))
            .expect("merges, still 1");
        m.acquire(req(B, Xw, r(30, 40), r(30, 40))).expect("2");
        let e = m.acquire(req(C, Xw, r(50, 60), r(50, 60))).unwrap_err();
        assert!(
            matches!(e, TokenError::TableFull { tokens_max: 2, .. }),
            "{e}"
        );
        assert!(e.to_string().contains("raise tokens_max"), "{e}");
        assert_eq!(m.stats().table_full, 1);
        m.relinquish(B, file(), ByteRange::WHOLE).expect("free one");
        m.acquire(req(C, Xw, r(50, 60), r(50, 60)))
            .expect("fits again");
    }

    #[test]
    fn dump_and_stats() {
        let m = TokenManager::with_shards(TokenManagerLimits::default(), 4);
        for i in 0..20 {
            let res = ResourceId::new(1, ResourceKind::Inode, i);
            m.acquire(AcquireRequest::whole(A, res, Ro)).expect("ro");
        }
        let d = m.dump();
        assert_eq!(d.len(), 20);
        assert!(d.windows(2).all(|w| w[0].0 < w[1].0), "dump is sorted");
        let s = m.stats();
        assert_eq!((s.acquires, s.tokens), (20, 20));
        assert_eq!(d[0].1[0].to_string(), "node 1 ro [0, eof)");
    }
}

#[cfg(test)]
mod condition_tests {
    use super::*;
    use crate::resource::ResourceKind;
    use TokenMode::*;

    #[test]
    fn a_request_whose_reason_is_gone_gets_its_fallback() {
        let m = TokenManager::default();
        let dir = ResourceId::new(1, ResourceKind::DirBucket, 3);
        let (a, b) = (NodeId(1), NodeId(2));
        m.acquire(AcquireRequest::new(
            a,
            dir,
            Ro,
            ByteRange::new(0, 10),
            ByteRange::new(0, 10),
        ))
        .expect("a reads part");
        // B asks for the whole directory exclusively to restructure it, having seen
        // version 0. Meanwhile someone else restructured it (version 1).
        m.set_version(dir, 1);
        let mut req = AcquireRequest::new(b, dir, Xw, ByteRange::WHOLE, ByteRange::WHOLE);
        req.condition = Some(Condition {
            seen_version: 0,
            fallback_mode: Xw,
            fallback_required: ByteRange::new(100, 200),
            fallback_desired: ByteRange::new(100, 200),
        });
        let g = m.acquire(req).expect("fallback granted without revoking A");
        assert_eq!(g.range, ByteRange::new(100, 200));
        assert_eq!(m.stats().downgraded, 1);
        // With the current version the full request is considered (and conflicts).
        req.condition = Some(Condition {
            seen_version: 1,
            ..req.condition.expect("set")
        });
        match m.acquire(req) {
            Err(TokenError::Conflict { required, .. }) => assert_eq!(required, ByteRange::WHOLE),
            other => panic!("expected a conflict, got {other:?}"),
        }
        assert_eq!(m.version(dir), 1);
    }
}

#[cfg(test)]
mod fairness_tests {
    use super::*;
    use crate::resource::ResourceKind;
    use std::sync::Arc;
    use TokenMode::*;

    fn dir() -> ResourceId {
        ResourceId::new(1, ResourceKind::Inode, 16)
    }

    fn ask(m: &TokenManager, node: u32, id: u64, mode: TokenMode) -> Result<Grant, TokenError> {
        let mut req = AcquireRequest::whole(NodeId(node), dir(), mode);
        req.waiter = Some(id);
        m.acquire(req)
    }

    /// The starvation of issue 12: a holder that gives its `xw` up when revoked and
    /// asks again at once, before the revoker's retry arrives, used to be granted
    /// every time (the revoker gave up after 64 rounds). Served oldest first, each of
    /// `N` contenders against such a holder gets the token within a bounded number of
    /// rounds, every time, and nobody is ever refused without a queue position.
    #[test]
    fn a_holder_asking_again_does_not_jump_the_queue() {
        const N: u32 = 5;
        const TURNS: u32 = 6;
        let m = TokenManager::default();
        let greedy = NodeId(0);
        ask(&m, 0, 1, Xw).expect("the greedy holder starts with xw");
        let mut granted = vec![0u32; N as usize + 1];
        // Rounds each contender waited for its current turn.
        let mut waited = vec![0u32; N as usize + 1];
        let mut next_id = 100;
        let mut ids: Vec<u64> = (0..=N as u64).collect();
        // The greedy holder's request while it does not hold the token.
        let mut greedy_wants: Option<u64> = None;
        for round in 0..N * TURNS * 4 {
            // Every contender still wanting a turn asks, in an order that rotates so
            // none is favoured; the greedy holder answers revokes and asks again at
            // once, always before the revoker's retry.
            for k in 0..N {
                let c = 1 + (round + k) % N;
                if granted[c as usize] >= TURNS {
                    continue;
                }
                match ask(&m, c, ids[c as usize], Xw) {
                    Ok(_) => {
                        granted[c as usize] += 1;
                        assert!(
                            waited[c as usize] <= 2 * N + 2,
                            "node {c} waited {} rounds for its turn",
                            waited[c as usize]
                        );
                        waited[c as usize] = 0;
                        next_id += 1;
                        ids[c as usize] = next_id;
                        // It does its work and lets go at once.
                        m.relinquish(NodeId(c), dir(), ByteRange::WHOLE)
                            .expect("relinquish");
                    }
                    Err(TokenError::Conflict { copyset, .. }) => {
                        waited[c as usize] += 1;
                        // The revoke: each holder gives up, and the greedy one asks
                        // again before this contender's retry.
                        for h in copyset {
                            m.relinquish(h.node, dir(), ByteRange::WHOLE)
                                .expect("revoked");
                            if h.node == greedy {
                                next_id += 1;
                                greedy_wants = Some(next_id);
                            }
                        }
                        if let Some(id) = greedy_wants {
                            if ask(&m, 0, id, Xw).is_ok() {
                                greedy_wants = None;
                            }
                        }
                    }
                    Err(TokenError::Queued { ahead, .. }) => {
                        waited[c as usize] += 1;
                        assert!(!ahead.contains(&NodeId(c)), "{ahead:?}");
                    }
                    Err(e) => panic!("node {c}: {e}"),
                }
            }
            // The greedy node, waiting, asks again too (and revokes when it is first).
            if let Some(id) = greedy_wants {
                match ask(&m, 0, id, Xw) {
                    Ok(_) => greedy_wants = None,
                    Err(TokenError::Conflict { copyset, .. }) => {
                        for h in copyset {
                            m.relinquish(h.node, dir(), ByteRange::WHOLE)
                                .expect("revoked");
                        }
                    }
                    Err(TokenError::Queued { .. }) => {}
                    Err(e) => panic!("greedy: {e}"),
                }
            }
        }
        assert_eq!(
            granted[1..],
            vec![TURNS; N as usize],
            "every contender got all its turns"
        );
        assert!(m.stats().queued > 0, "{:?}", m.stats());
    }

    /// Node `node` asks for the directory in `xw` to restructure it, as waiter `id`,
    /// having seen version 0; `rw` is enough once the version moved.
    fn conditional_xw(m: &TokenManager, node: u32, id: u64) -> Result<Grant, TokenError> {
        let mut req = AcquireRequest::whole(NodeId(node), dir(), Xw);
        req.waiter = Some(id);
        req.condition = Some(Condition {
            seen_version: 0,
            fallback_mode: Rw,
            fallback_required: ByteRange::WHOLE,
            fallback_desired: ByteRange::WHOLE,
        });
        m.acquire(req)
    }

    #[test]
    fn a_queued_request_whose_reason_is_gone_stops_blocking_sharers() {
        let m = TokenManager::default();
        ask(&m, 1, 1, Rw).expect("a writer");
        // Node 2 wants xw to restructure (seen version 0), node 3 too: both queue.
        let conditional = |node: u32, id: u64| conditional_xw(&m, node, id);
        assert!(matches!(
            conditional(2, 1),
            Err(TokenError::Conflict { .. })
        ));
        assert!(matches!(conditional(3, 1), Err(TokenError::Queued { .. })));
        // A plain sharer is behind them, as is the holder asking for more.
        assert!(matches!(ask(&m, 4, 1, Rw), Err(TokenError::Queued { .. })));
        assert_eq!(m.waiters(dir()), vec![NodeId(2), NodeId(3), NodeId(4)]);
        // The holder restructured it itself: the queued xw requests need only rw now,
        // which shares with everyone.
        m.set_version(dir(), 1);
        ask(&m, 4, 1, Rw).expect("no longer behind exclusive requests");
        let g = conditional(3, 1).expect("fallback granted");
        assert_eq!(g.mode, Rw);
        let g = conditional(2, 1).expect("fallback granted");
        assert_eq!(g.mode, Rw);
        assert!(m.waiters(dir()).is_empty());
    }

    /// Records the notices the manager posts instead of sending them.
    #[derive(Default)]
    struct Notices(Mutex<Vec<(NodeId, u64)>>);

    impl Transport for Notices {
        fn local_node(&self) -> NodeId {
            NodeId(0)
        }
        fn call(
            &self,
            _: NodeId,
            _: ServiceId,
            _: Vec<u8>,
            _: CallOptions,
        ) -> Result<Vec<u8>, mako_rt::TransportError> {
            unreachable!("the manager only posts")
        }
        fn post(&self, to: NodeId, service: ServiceId, request: Vec<u8>, _: CallOptions) {
            assert_eq!(service, ServiceId::TokenClient);
            match mako_rt::decode("turn", &request).expect("decodes") {
                crate::protocol::ClientRequest::Turn { resource, waiter } => {
                    assert_eq!(resource, dir());
                    self.0.lock().push((to, waiter));
                }
                other => panic!("posted {other:?}"),
            }
        }
    }

    fn told(n: &Notices) -> Vec<(NodeId, u64)> {
        std::mem::take(&mut *n.0.lock())
    }

    /// A queued request is told once that nobody older is in its way any more (the
    /// request ahead was granted, cancelled, or fell back to a mode that shares), and
    /// only then: not while an older request still blocks it, not when it was refused
    /// for holders only (it revokes them itself).
    #[test]
    fn queued_requests_are_told_when_their_turn_comes() {
        let m = TokenManager::default();
        let notices = Arc::new(Notices::default());
        let t: Arc<dyn Transport> = notices.clone();
        m.notify_through(Arc::downgrade(&t));
        ask(&m, 1, 1, Xw).expect("holder");
        assert!(matches!(
            ask(&m, 2, 7, Xw),
            Err(TokenError::Conflict { .. })
        ));
        assert!(matches!(ask(&m, 3, 8, Xw), Err(TokenError::Queued { .. })));
        assert!(matches!(ask(&m, 4, 9, Xw), Err(TokenError::Queued { .. })));
        assert_eq!(told(&notices), vec![], "nobody's turn yet");
        // Node 2 revokes node 1 and is served: node 3 is next, node 4 still behind it.
        m.relinquish(NodeId(1), dir(), ByteRange::WHOLE)
            .expect("revoked");
        assert_eq!(
            told(&notices),
            vec![],
            "a holder leaving is node 2's business"
        );
        ask(&m, 2, 7, Xw).expect("served");
        assert_eq!(told(&notices), vec![(NodeId(3), 8)]);
        // Node 3 asks: refused for the holder only, no notice; it gives up.
        assert!(matches!(
            ask(&m, 3, 8, Xw),
            Err(TokenError::Conflict { .. })
        ));
        assert_eq!(told(&notices), vec![]);
        m.cancel(NodeId(3), dir(), 8);
        assert_eq!(told(&notices), vec![(NodeId(4), 9)]);
        // Told once per refusal: nothing more until node 4 asks and is queued again.
        m.cancel(NodeId(3), dir(), 8);
        assert_eq!(told(&notices), vec![]);
        assert_eq!(m.stats().turns, 2);
    }

    /// Conditional requests whose reason is gone (`set_version`) stop blocking the
    /// sharers queued behind them, who are told at once.
    #[test]
    fn sharers_behind_requests_whose_reason_is_gone_are_told() {
        let m = TokenManager::default();
        let notices = Arc::new(Notices::default());
        let t: Arc<dyn Transport> = notices.clone();
        m.notify_through(Arc::downgrade(&t));
        ask(&m, 1, 1, Rw).expect("a writer");
        let conditional = |node: u32, id: u64| conditional_xw(&m, node, id);
        assert!(matches!(
            conditional(2, 5),
            Err(TokenError::Conflict { .. })
        ));
        assert!(matches!(conditional(3, 6), Err(TokenError::Queued { .. })));
        assert!(matches!(ask(&m, 4, 7, Rw), Err(TokenError::Queued { .. })));
        assert_eq!(told(&notices), vec![]);
        m.set_version(dir(), 1);
        assert_eq!(told(&notices), vec![(NodeId(3), 6), (NodeId(4), 7)]);
    }

    #[test]
    fn cancelled_and_expired_waiters_leave_the_queue() {
        let m = TokenManager::new(TokenManagerLimits {
            waiter_lease_ms: 0,
            ..TokenManagerLimits::default()
        });
        ask(&m, 1, 1, Xw).expect("holder");
        assert!(matches!(
            ask(&m, 2, 1, Xw),
            Err(TokenError::Conflict { .. })
        ));
        m.cancel(NodeId(2), dir(), 1);
        assert!(m.waiters(dir()).is_empty());
        assert!(matches!(
            ask(&m, 2, 2, Xw),
            Err(TokenError::Conflict { .. })
        ));
        // Node 2 died without a word; its lease (0 ms here) runs out.
        std::thread::sleep(Duration::from_millis(2));
        m.relinquish(NodeId(1), dir(), ByteRange::WHOLE)
            .expect("relinquish");
        ask(&m, 3, 1, Xw).expect("not blocked by a dead waiter");
        assert_eq!(m.stats().waiters_expired, 1);
        // A node's waiters go with release_node too.
        assert!(matches!(
            ask(&m, 4, 1, Ro),
            Err(TokenError::Conflict { .. })
        ));
        m.release_node(NodeId(4));
        assert!(m.waiters(dir()).is_empty());
    }
}
