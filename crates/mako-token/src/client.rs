//! The per-node side of the token protocol (docs/coherence.md section 2): a cache of
//! held tokens answering repeat acquires without asking the manager, the holds of
//! operations in flight, and the revoke protocol in both directions.
//!
//! Per resource the client keeps what it holds, the holds (counted, by range and
//! mode), the ranges being revoked (no new holds there) and a `busy` flag: this node's
//! exchanges with the manager on one resource — acquires, relinquishes, downgrades —
//! happen one at a time, so the manager always records at least what the cache holds
//! (grants go to the manager first, gives-up go to the cache first) whatever order the
//! network delivers messages in.

use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use mako_diag::{Condvar, CountedMutex, LockClass};
use mako_rt::{CallOptions, ServiceId, Transport};
use serde::{Deserialize, Serialize};

use crate::error::TokenError;
use crate::held_ranges::HeldRanges;
use crate::manager::{
    validate_range, validate_request, AcquireRequest, Condition, Grant, HeldToken, Holder,
};
use crate::mode::{compatible, covers, TokenMode};
use crate::protocol::{ClientReply, ClientRequest, ManagerReply, ManagerRequest};
use crate::range::ByteRange;
use crate::resource::{NodeId, ResourceId};

use crate::DetMap;

static CLIENT_SHARD_LOCK: LockClass = LockClass::new("token.client");

/// Shards of a client's table: resources hash to one; holds and revokes of different
/// resources rarely meet on a lock.
const CLIENT_SHARDS: usize = 16;
/// Times an idempotent manager request (relinquish, downgrade) whose connection broke
/// is sent again (`TokenClientInner::ask_manager`).
const IDEMPOTENT_RESENDS_MAX: u32 = 3;

/// The node's cached data behind its tokens (pagepool, kernel caches, the log). Called
/// before a token is given up or weakened, with the range marked revoking and every
/// hold over it released, so no token ever leaves a node with dirty data under it.
pub trait CacheFlush: Send + Sync {
    /// Write back what is dirty under `range` of `resource`, make it durable where the
    /// next holder reads it, and drop the cached copies — or, with `keep`, keep clean
    /// copies that `keep` still covers.
    fn flush_and_invalidate(
        &self,
        resource: ResourceId,
        range: ByteRange,
        keep: Option<TokenMode>,
    ) -> Result<(), TokenError>;
}

/// A node that caches nothing (tests, tools).
pub struct NoCache;

impl CacheFlush for NoCache {
    fn flush_and_invalidate(
        &self,
        _: ResourceId,
        _: ByteRange,
        _: Option<TokenMode>,
    ) -> Result<(), TokenError> {
        Ok(())
    }
}

/// Which node hosts the token manager shard of a resource.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ManagerMap {
    /// Manager nodes; a resource goes to `nodes[hash % len]`.
    pub nodes: Vec<NodeId>,
}

impl ManagerMap {
    pub fn single(node: NodeId) -> ManagerMap {
        ManagerMap { nodes: vec![node] }
    }
    pub fn manager_for(&self, resource: &ResourceId) -> NodeId {
        self.nodes
            .get(self.slot_for(resource))
            .copied()
            .unwrap_or(NodeId(0))
    }

    /// The index in `nodes` of the shard of `resource`. A failed manager node's slot
    /// is taken over by another node (docs/coherence.md section 7b) without moving
    /// any resource to another slot.
    pub fn slot_for(&self, resource: &ResourceId) -> usize {
        if self.nodes.len() <= 1 {
            return 0;
        }
        let mut h = resource.id ^ (u64::from(resource.fs) << 40) ^ ((resource.kind as u64) << 56);
        h = h.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        h ^= h >> 31;
        (h % self.nodes.len() as u64) as usize
    }
}

/// How an acquire may be granted (see the fields of `AcquireRequest`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AcquireOptions {
    pub condition: Option<Condition>,
    pub replace: bool,
    pub upgrade_to: Option<TokenMode>,
    pub alt_mode: Option<TokenMode>,
    /// Take the token only if nobody else holds it in the way: a conflict is returned
    /// (`TokenError::Conflict`) instead of revoked. Ownership of allocation regions and
    /// inode-map segments is handed out this way: a node takes a free one, never
    /// another node's.
    pub no_revoke: bool,
}

/// Limits of one token client.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenClientLimits {
    /// Revoke rounds per acquire before giving up with
    /// `TokenError::AttemptsExhausted`. Waiting in the manager's queue behind older
    /// requests is not counted (it is bounded by `queue_wait_max_ms`): once a request
    /// is the oldest in the way, what it revokes cannot come back before it is served,
    /// so a round or two suffice and running out means the protocol is broken.
    pub acquire_attempts_max: u32,
    /// Deadline of each request to the manager or a holder.
    pub call_deadline_ms: u64,
    /// How long an acquire waits, in all, for holders that do not answer its revoke
    /// (a failed node: its tokens stay in the manager's table until a survivor
    /// recovers it and releases them, `release_failed_node`), retrying every
    /// `holder_down_retry_ms`. Past it the acquire fails with `RevokeFailed`.
    pub holder_down_wait_ms: u64,
    pub holder_down_retry_ms: u64,
    /// Longest wait in the manager's queue behind the same older requests before
    /// giving up with `TokenError::QueueTimeout`. A hang guard only: a dead node's
    /// request leaves the queue after `TokenManagerLimits::waiter_lease_ms`.
    pub queue_wait_max_ms: u64,
    /// A queued acquire waits for the manager to tell it that its turn came
    /// (`ClientRequest::Turn`); it asks again on its own only after this long (doubling
    /// up to 8 times it while nobody ahead is served): a safety net for a lost notice,
    /// a manager that cannot send them, and the check of the nodes ahead
    /// (`QUEUE_PROBE_AFTER`).
    pub queue_poll_ms: u64,
}

impl Default for TokenClientLimits {
    fn default() -> Self {
        TokenClientLimits {
            acquire_attempts_max: 64,
            call_deadline_ms: 60_000,
            holder_down_wait_ms: 600_000,
            holder_down_retry_ms: 10,
            queue_wait_max_ms: 600_000,
            queue_poll_ms: 100,
        }
    }
}

/// Time for queue waits: simulated under a simulation, real otherwise.
fn monotonic_now() -> Duration {
    static START: OnceLock<std::time::Instant> = OnceLock::new();
    match mako_diag::sched::current() {
        Some(s) => s.now(),
        None => START.get_or_init(std::time::Instant::now).elapsed(),
    }
}

/// A request queued behind older ones waits for the manager's `ClientRequest::Turn`,
/// and asks again on its own only after `TokenClientLimits::queue_poll_ms`, doubling
/// while nobody ahead is served up to this many times it. Polling instead (pauses of
/// 200 µs per request ahead, doubling up to 8 ms) cost 32.9 asks per create of 512
/// nodes creating in one directory.
const QUEUE_POLL_GROWTH_MAX: u32 = 8;
/// How long an acquire waits behind the same older requests before it asks their
/// nodes whether they are there (`ClientRequest::Ping`), and again each time this
/// much more passed: a killed node's requests would otherwise hold the queue for the
/// manager's whole waiter lease. Long against a revoke round of a live cluster, so
/// that probes are rare; short against the RPC deadline, within which a live node's
/// request to a dead node's resource is answered (with an error) as before queues.
const QUEUE_PROBE_AFTER: Duration = Duration::from_secs(1);

/// Counters of one client.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenClientStats {
    /// Acquires answered from the cache.
    pub covered: u64,
    /// Acquires that went to the manager (counting each attempt).
    pub manager_calls: u64,
    /// Revokes this node sent to holders.
    pub revokes_sent: u64,
    /// Revokes this node answered for others.
    pub revokes_answered: u64,
    /// Asks refused because an older request of another node waits (fairness).
    pub queued: u64,
    /// `Ping`s sent to nodes whose queued requests an acquire waited behind for
    /// `QUEUE_PROBE_AFTER`.
    pub probes_sent: u64,
    /// Calls to other nodes (revokes, pings) that failed, reported to the manager so
    /// that their queued requests stop holding others (`ManagerRequest::DropWaiters`).
    pub peers_unreachable: u64,
    /// Holds refused because the token was missing or being revoked.
    pub hold_misses: u64,
    /// Notices from the manager that a queued acquire's turn came
    /// (`ClientRequest::Turn`) for an acquire still waiting.
    pub turns: u64,
}

#[derive(Clone, Copy, Debug)]
struct HoldEntry {
    range: ByteRange,
    /// `None`: the hold needs only that some token is held (any mode).
    mode: Option<TokenMode>,
    count: u32,
}

#[derive(Default)]
struct ResState {
    /// The structure version the manager reported with the last grant.
    version: u64,
    /// `ClientInner::grant_clock` when the manager last granted this node something
    /// of the resource (`TokenClient::granted_at`).
    granted_at: u64,
    /// The manager named this node the resource's metanode (with a grant or a
    /// locate) and it has held a write mode since (`TokenClient::named_metanode`).
    metanode: bool,
    held: HeldRanges,
    holds: Vec<HoldEntry>,
    revoking: Vec<ByteRange>,
    busy: bool,
    /// An acquire's request is with the manager (a grant may be on its way): a report
    /// to a rebuilding manager waits for its answer (`ClientInner::held_in`).
    asking: bool,
    /// Pieces being downgraded at the manager (a revoke's step 5): no longer in `held`
    /// meanwhile, but still held in the weaker mode, so reported as held.
    downgrading: Vec<(ByteRange, TokenMode)>,
}

impl ResState {
    fn is_idle(&self) -> bool {
        self.held.is_empty()
            && self.holds.is_empty()
            && self.revoking.is_empty()
            && !self.busy
            && self.version == 0
    }
    fn revoking_overlaps(&self, range: &ByteRange) -> bool {
        self.revoking.iter().any(|r| r.overlaps(range))
    }
    fn holds_overlap(&self, range: &ByteRange) -> bool {
        self.holds.iter().any(|h| h.range.overlaps(range))
    }
    fn covers(&self, range: ByteRange, mode: Option<TokenMode>) -> bool {
        match mode {
            Some(m) => self.held.covering_run(range, m).is_some(),
            None => any_mode_covers(&self.held, range),
        }
    }
}

/// Some token (of any modes, possibly mixed) covers all of `range`.
fn any_mode_covers(held: &HeldRanges, range: ByteRange) -> bool {
    let mut cursor = range.start;
    for (piece, _) in held.pieces() {
        if piece.end <= cursor {
            continue;
        }
        if piece.start > cursor {
            return false;
        }
        cursor = piece.end;
        if cursor >= range.end {
            return true;
        }
    }
    cursor >= range.end
}

struct Shard {
    res: DetMap<ResourceId, ResState>,
}

struct ClientInner {
    id: usize,
    node: NodeId,
    transport: Arc<dyn Transport>,
    /// Changed only when a manager node's slot moves (`ClientRequest::HeldIn`,
    /// `TokenClient::set_managers`).
    managers: parking_lot::RwLock<ManagerMap>,
    cache_flush: OnceLock<Arc<dyn CacheFlush>>,
    shards: Box<[(CountedMutex<Shard>, Condvar)]>,
    limits: TokenClientLimits,
    /// `limits.holder_down_wait_ms`, changeable after the client is made
    /// (`TokenClient::set_holder_down_wait`: makod derives it from the lease times).
    holder_down_wait_ms: AtomicU64,
    /// How long a request whose manager node does not answer waits for the node's slot
    /// to move to another manager node (`TokenClient::set_manager_failover_wait`); 0:
    /// it fails at once.
    failover_wait_ms: AtomicU64,
    covered: AtomicU64,
    manager_calls: AtomicU64,
    revokes_sent: AtomicU64,
    revokes_answered: AtomicU64,
    hold_misses: AtomicU64,
    queued: AtomicU64,
    probes_sent: AtomicU64,
    peers_unreachable: AtomicU64,
    /// Ids of this node's acquires (`AcquireRequest::waiter`).
    acquire_ids: AtomicU64,
    /// Resources whose last grant to this node said other nodes were waiting, with how
    /// many (`Grant::contenders`, `TokenClient::contenders`); only those, so it holds
    /// no more than the contended resources.
    crowds: parking_lot::Mutex<crate::DetMap<ResourceId, u32>>,
    /// Ticks at every grant from the manager (`TokenClient::grant_clock`).
    grant_clock: AtomicU64,
    /// The running acquires that may wait in a manager's queue, by id
    /// (`AcquireRequest::waiter`): their resource (`ClientRequest::PingWaiting`), and
    /// whether the manager said their turn came since they last asked
    /// (`ClientRequest::Turn`). Not a counted lock, like `crowds`.
    turns: parking_lot::Mutex<crate::DetMap<u64, (ResourceId, bool)>>,
    turns_received: AtomicU64,
}

/// Let `d` pass: simulated time in the simulation, real time otherwise.
fn pause(d: Duration) {
    if mako_diag::sched::active() {
        mako_diag::sched::sleep(d);
    } else {
        std::thread::sleep(d);
    }
}

static CLIENT_IDS: AtomicUsize = AtomicUsize::new(1);

thread_local! {
    /// Holds this thread has open, per client: a blocking acquire with holds open could
    /// deadlock across nodes (docs/coherence.md R1).
    static THREAD_HOLDS: RefCell<Vec<(usize, u32)>> = const { RefCell::new(Vec::new()) };
}

fn thread_holds(client: usize) -> u32 {
    THREAD_HOLDS.with(|h| {
        h.borrow()
            .iter()
            .find(|(c, _)| *c == client)
            .map_or(0, |(_, n)| *n)
    })
}

fn thread_holds_add(client: usize, delta: i32) {
    THREAD_HOLDS.with(|h| {
        let mut h = h.borrow_mut();
        if let Some(e) = h.iter_mut().find(|(c, _)| *c == client) {
            e.1 = (e.1 as i32 + delta).max(0) as u32;
            if e.1 == 0 {
                h.retain(|(c, _)| *c != client);
            }
        } else if delta > 0 {
            h.push((client, delta as u32));
        }
    });
}

/// One node's token client.
#[derive(Clone)]
pub struct TokenClient {
    inner: Arc<ClientInner>,
}

/// An operation's hold on a token: until it is dropped, the token cannot be revoked
/// from this node (the revoke waits). Holds are taken without waiting (`try_hold`).
pub struct Hold {
    inner: Arc<ClientInner>,
    resource: ResourceId,
    range: ByteRange,
    mode: Option<TokenMode>,
}

impl std::fmt::Debug for Hold {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Hold({} {} {:?})", self.resource, self.range, self.mode)
    }
}

impl Hold {
    pub fn resource(&self) -> ResourceId {
        self.resource
    }
    /// The mode held (`None`: any mode this node has).
    pub fn mode(&self) -> Option<TokenMode> {
        self.mode
    }
    pub fn range(&self) -> ByteRange {
        self.range
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        let (lock, cv) = self.inner.shard(&self.resource);
        let mut shard = lock.lock();
        if let Some(st) = shard.res.get_mut(&self.resource) {
            if let Some(i) = st
                .holds
                .iter()
                .position(|h| h.range == self.range && h.mode == self.mode)
            {
                st.holds[i].count -= 1;
                if st.holds[i].count == 0 {
                    st.holds.swap_remove(i);
                    // Waiting for holds to end: a revoke over the range, and a
                    // replacing acquire that must not take a promise from a hold.
                    cv.notify_all();
                }
            }
            if st.is_idle() {
                shard.res.remove(&self.resource);
            }
        }
        drop(shard);
        thread_holds_add(self.inner.id, -1);
    }
}

impl ClientInner {
    /// A grant of `resource` from the manager goes into the cache (`st`, under its
    /// shard's lock); `replace` drops the held modes it covers first.
    fn record_grant(&self, resource: ResourceId, st: &mut ResState, g: &Grant, replace: bool) {
        if replace {
            st.held.remove(g.range);
        }
        st.held.grant(g.range, g.mode);
        st.version = st.version.max(g.version);
        st.granted_at = self.grant_clock.fetch_add(1, Ordering::SeqCst) + 1;
        st.metanode = g.metanode;
        // Not under a counted lock: a check of it is no preemption point of the
        // simulation (it never waits: nothing else is held under it).
        let mut crowds = self.crowds.lock();
        if g.contenders > 0 {
            crowds.insert(resource, g.contenders);
        } else {
            crowds.remove(&resource);
        }
    }

    fn shard(&self, resource: &ResourceId) -> &(CountedMutex<Shard>, Condvar) {
        let mut h = resource.id ^ ((resource.kind as u64) << 56) ^ u64::from(resource.fs);
        h = h.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        &self.shards[(h >> 59) as usize % self.shards.len()]
    }

    fn options(&self) -> CallOptions {
        CallOptions {
            deadline: Duration::from_millis(self.limits.call_deadline_ms),
            ..CallOptions::default()
        }
    }

    fn ask_manager(
        &self,
        resource: &ResourceId,
        request: ManagerRequest,
    ) -> Result<ManagerReply, TokenError> {
        // A call whose connection broke (`TransportError::Unreachable`) may or may not
        // have been handled. Relinquish and downgrade are idempotent (giving up what is
        // no longer held, weakening to what is already held, change nothing) and this
        // node sends nothing else on the resource meanwhile (it is busy), so they are
        // sent again, a few times: a revoke must not fail because one message was
        // lost. Nothing else is resent (the transport delivers at most once).
        let idempotent = matches!(
            request,
            ManagerRequest::Relinquish { .. } | ManagerRequest::Downgrade { .. }
        );
        let mut resent = 0;
        loop {
            let to = self.managers.read().manager_for(resource);
            match mako_rt::call(
                &*self.transport,
                to,
                ServiceId::TokenManager,
                &request,
                self.options(),
            ) {
                // The manager node failed and another took its slot over meanwhile
                // (docs/coherence.md section 7b): ask the new one. Whatever the failed
                // one did with the request is lost with its table.
                Err(mako_rt::TransportError::Unreachable { .. })
                    if self.managers.read().manager_for(resource) != to => {}
                Err(mako_rt::TransportError::Unreachable { .. })
                    if idempotent && resent < IDEMPOTENT_RESENDS_MAX =>
                {
                    resent += 1;
                    self::pause(Duration::from_millis(
                        self.limits.holder_down_retry_ms.max(1),
                    ));
                }
                // The manager node may have failed: wait for its slot to move
                // (`set_manager_failover_wait`), then ask the new node.
                Err(e @ mako_rt::TransportError::Unreachable { .. }) => {
                    if !self.wait_for_new_manager(resource, to) {
                        return Err(TokenError::Transport(e.to_string()));
                    }
                }
                r => return r.map_err(|e| TokenError::Transport(e.to_string())),
            }
        }
    }

    /// Waits until the slot of `resource` is routed to another node than `failed`
    /// (true), or the manager failover wait ran out (false).
    fn wait_for_new_manager(&self, resource: &ResourceId, failed: NodeId) -> bool {
        let wait_max = Duration::from_millis(self.failover_wait_ms.load(Ordering::Relaxed));
        let retry = Duration::from_millis(self.limits.holder_down_retry_ms.max(1));
        let mut waited = Duration::ZERO;
        loop {
            if self.managers.read().manager_for(resource) != failed {
                return true;
            }
            if waited >= wait_max {
                return false;
            }
            self::pause(retry);
            waited += retry;
        }
    }

    /// A call to `node` failed: its queued requests must not hold the queue of the
    /// manager of `resource` until their lease ends (a killed node's would hold every
    /// other node's request behind it for `TokenManagerLimits::waiter_lease_ms`).
    /// Best effort: if the manager is unreachable too, the lease drops them.
    fn report_unreachable(&self, resource: &ResourceId, node: NodeId) {
        self.peers_unreachable.fetch_add(1, Ordering::Relaxed);
        let _ = self.ask_manager(resource, ManagerRequest::DropWaiters(node));
    }

    /// Asks each of `nodes` (whose queued requests on `resource` an acquire waits
    /// behind) whether it is there, and reports those that do not answer.
    fn probe_waiters(&self, resource: &ResourceId, nodes: &[NodeId]) {
        let ping =
            mako_rt::encode("ping", &ClientRequest::PingWaiting(*resource)).unwrap_or_default();
        let calls = nodes
            .iter()
            .map(|n| (*n, ServiceId::TokenClient, ping.clone()))
            .collect();
        self.probes_sent
            .fetch_add(nodes.len() as u64, Ordering::Relaxed);
        let answers = self.transport.call_many(calls, self.options());
        for (node, answer) in nodes.iter().zip(answers) {
            let reply = answer
                .ok()
                .and_then(|b| mako_rt::decode::<ClientReply>("ping reply", &b).ok());
            match reply {
                Some(ClientReply::Alive) => {}
                // There: its requests other than those of the acquires it runs are
                // left over (a cancel that never arrived, an earlier incarnation's)
                // and hold the queue for nothing. Asking only whether an acquire of
                // the resource runs kept a left-over request as long as the node
                // kept acquiring the resource — for the manager's whole waiter lease
                // when its new acquire was queued behind the very request the
                // left-over one held up (the kill -9 rounds' 180 s recount).
                Some(ClientReply::Waiting(running)) => {
                    let _ = self.ask_manager(
                        resource,
                        ManagerRequest::DropWaitersOn {
                            node: *node,
                            resource: *resource,
                            keep: running,
                        },
                    );
                }
                _ => self.report_unreachable(resource, *node),
            }
        }
    }

    /// The ids of the acquires of `resource` running on this node that may be
    /// queued at its manager (`AcquireRequest::waiter`), lowest first.
    fn waiting_on(&self, resource: &ResourceId) -> Vec<u64> {
        let mut ids: Vec<u64> = self
            .turns
            .lock()
            .iter()
            .filter(|(_, (r, _))| r == resource)
            .map(|(id, _)| *id)
            .collect();
        ids.sort_unstable();
        ids
    }

    /// The manager says queued acquire `waiter` (of `resource`) may ask again: wake it.
    /// A notice for an acquire that ended is dropped.
    fn turn(&self, resource: &ResourceId, waiter: u64) {
        {
            let mut turns = self.turns.lock();
            let Some((_, told)) = turns.get_mut(&waiter) else {
                return;
            };
            *told = true;
        }
        self.turns_received.fetch_add(1, Ordering::Relaxed);
        let (lock, cv) = self.shard(resource);
        let _shard = lock.lock();
        cv.notify_all();
    }

    /// Did the manager say that queued acquire `waiter`'s turn came? Clears it.
    fn take_turn(&self, waiter: Option<u64>) -> bool {
        waiter.is_some_and(|w| {
            self.turns
                .lock()
                .get_mut(&w)
                .is_some_and(|(_, told)| std::mem::take(told))
        })
    }

    /// Pause before asking a rebuilding manager shard again; fails once the wait for
    /// a failed holder (`holder_down_wait_ms`, which `waited` counts) is spent.
    fn wait_rebuild(&self, waited: &mut Duration, e: TokenError) -> Result<(), TokenError> {
        let wait_max = Duration::from_millis(self.holder_down_wait_ms.load(Ordering::Relaxed));
        if *waited >= wait_max {
            return Err(e);
        }
        let retry = Duration::from_millis(self.limits.holder_down_retry_ms.max(1));
        self::pause(retry);
        *waited += retry;
        Ok(())
    }

    fn expect_done(reply: ManagerReply) -> Result<(), TokenError> {
        match reply {
            ManagerReply::Done => Ok(()),
            ManagerReply::Failed(e) => Err(e),
            other => Err(TokenError::Transport(format!(
                "unexpected manager reply {other:?}"
            ))),
        }
    }

    /// Wait (through the scheduler seam) until `ready` holds for the resource's state.
    fn wait_until<'a>(
        &'a self,
        resource: &ResourceId,
        mut shard: parking_lot::MutexGuard<'a, Shard>,
        mut ready: impl FnMut(&ResState) -> bool,
    ) -> parking_lot::MutexGuard<'a, Shard> {
        let (_, cv) = self.shard(resource);
        loop {
            let ok = shard.res.get(resource).is_none_or(&mut ready);
            if ok {
                return shard;
            }
            cv.wait(&mut shard);
        }
    }

    /// A manager took over slot `slot` (`ClientRequest::HeldIn`): route by `managers`
    /// from now on and report what this node holds on the slot's resources. Each
    /// resource is read while no acquire of it is with a manager (`asking`): a grant on
    /// its way is in the cache first (the rebuilding manager grants nothing, so only
    /// the failed one's could be). A token being given up is reported until it left
    /// the cache, and pieces being downgraded in their weaker mode; a revoke does not
    /// wait for the report, nor the report for the revoke (whose cache flush may need
    /// a token of the rebuilding slot). Anything given up after the report is
    /// relinquished to the new manager, which may have recorded it from the report
    /// after that; it then records more than is held, never less (see
    /// `TokenManager::apply_report`).
    fn held_in(&self, slot: usize, managers: ManagerMap) -> Vec<HeldToken> {
        *self.managers.write() = managers.clone();
        let mut out = Vec::new();
        for (lock, cv) in self.shards.iter() {
            let mut shard = lock.lock();
            loop {
                let busy = shard
                    .res
                    .iter()
                    .any(|(r, st)| st.asking && managers.slot_for(r) == slot);
                if !busy {
                    break;
                }
                cv.wait(&mut shard);
            }
            out.extend(
                shard
                    .res
                    .iter()
                    .filter(|(r, st)| {
                        managers.slot_for(r) == slot
                            && !(st.held.is_empty() && st.downgrading.is_empty())
                    })
                    .map(|(r, st)| {
                        let mut held = st.held.clone();
                        for (range, mode) in &st.downgrading {
                            held.grant(*range, *mode);
                        }
                        HeldToken {
                            resource: *r,
                            pieces: held.pieces().to_vec(),
                            version: st.version,
                            metanode: st.metanode,
                        }
                    }),
            );
        }
        out.sort_by_key(|t| t.resource);
        out
    }

    /// Steps 1-6 of a revoke (docs/coherence.md section 2), for a request from another
    /// node (`wanted`) or a local release (`wanted` = None: give up everything).
    fn give_up(
        &self,
        resource: ResourceId,
        range: ByteRange,
        wanted: Option<TokenMode>,
    ) -> Result<(), TokenError> {
        let (lock, cv) = self.shard(&resource);
        // 1. Not while this node itself talks to the manager about the resource (a
        //    grant may be on its way: it is applied first).
        let shard = lock.lock();
        let mut shard = self.wait_until(&resource, shard, |st| !st.busy);
        let st = shard.res.entry(resource).or_default();
        st.busy = true;
        // A shared wanted mode lets the holder keep that mode where it holds a mode
        // covering it, instead of dropping its token.
        let keep = wanted.filter(|w| compatible(*w, *w)).filter(|w| {
            st.held
                .pieces()
                .iter()
                .any(|(p, m)| p.overlaps(&range) && covers(*m, *w))
        });
        // 2. No new holds over the range.
        st.revoking.push(range);
        // 3. Operations in flight under it finish first.
        let shard = self.wait_until(&resource, shard, |st| !st.holds_overlap(&range));
        drop(shard);
        // 4. Caches flushed and dropped (or kept clean under `keep`).
        let flushed = match self.cache_flush.get() {
            Some(f) => f.flush_and_invalidate(resource, range, keep),
            None => Ok(()),
        };
        let mut shard = lock.lock();
        let st = shard.res.entry(resource).or_default();
        if let Some(i) = st.revoking.iter().position(|r| *r == range) {
            st.revoking.swap_remove(i);
        }
        if let Err(e) = flushed {
            st.busy = false;
            cv.notify_all();
            return Err(e);
        }
        // Forget the range locally first: from now on the cache claims less than the
        // manager records, never more.
        let kept: Vec<ByteRange> = match keep {
            Some(k) => st
                .held
                .pieces()
                .iter()
                .filter(|(_, m)| covers(*m, k))
                .filter_map(|(p, _)| p.intersect(&range))
                .collect(),
            None => Vec::new(),
        };
        st.held.remove(range);
        if let Some(k) = keep {
            st.downgrading = kept.iter().map(|r| (*r, k)).collect();
        }
        drop(shard);
        // 5. Tell the manager, and wait for its answer.
        let mut rest = vec![range];
        for k in &kept {
            rest = rest
                .iter()
                .flat_map(|r| {
                    let (a, b) = r.subtract(k);
                    [a, b]
                })
                .flatten()
                .collect();
        }
        let mut result = Ok(());
        if let Some(k) = keep {
            for r in &kept {
                let reply = self.ask_manager(
                    &resource,
                    ManagerRequest::Downgrade {
                        node: self.node,
                        resource,
                        range: *r,
                        to: k,
                    },
                );
                result = result.and(reply.and_then(Self::expect_done));
            }
        }
        for r in rest {
            let reply = self.ask_manager(
                &resource,
                ManagerRequest::Relinquish {
                    node: self.node,
                    resource,
                    range: r,
                },
            );
            result = result.and(reply.and_then(Self::expect_done));
        }
        // A downgrade that failed (its manager node failed or was cut off while it
        // was asked) leaves the weakened parts unheld: the caches kept clean under
        // them go too, before anything else can use the resource (`busy` is still
        // set). Keeping them cached without a token let a read trust them after
        // another node changed the file (faults seed 8 of
        // `the_cluster_manager_is_cut_off_in_a_minority`).
        if keep.is_some() && !kept.is_empty() && result.is_err() {
            if let Some(f) = self.cache_flush.get() {
                if let Err(e) = f.flush_and_invalidate(resource, range, None) {
                    result = result.and(Err(e));
                }
            }
        }
        // The weakened parts are held again (the manager records them so).
        let mut shard = lock.lock();
        let st = shard.res.entry(resource).or_default();
        st.downgrading.clear();
        if let (Some(k), true) = (keep, result.is_ok()) {
            for r in kept {
                st.held.grant(r, k);
            }
        }
        // The manager keeps a metanode only while it holds a write mode.
        if !st
            .held
            .pieces()
            .iter()
            .any(|(_, m)| covers(*m, TokenMode::Rw))
        {
            st.metanode = false;
        }
        st.busy = false;
        if st.is_idle() {
            shard.res.remove(&resource);
        }
        cv.notify_all();
        result
    }
}

impl TokenClient {
    /// A client for `node` that reaches its manager shards through `transport`. The
    /// node must also offer the `TokenClient` service (`TokenClient::service`) so that
    /// others can revoke from it. `cache_flush` is set once the node's caches exist
    /// (`set_cache_flush`); until then nothing is flushed on revoke.
    pub fn new(
        node: NodeId,
        transport: Arc<dyn Transport>,
        managers: ManagerMap,
        limits: TokenClientLimits,
    ) -> TokenClient {
        let shards = (0..CLIENT_SHARDS)
            .map(|_| {
                (
                    CountedMutex::new(
                        &CLIENT_SHARD_LOCK,
                        Shard {
                            res: DetMap::default(),
                        },
                    ),
                    Condvar::new(),
                )
            })
            .collect();
        TokenClient {
            inner: Arc::new(ClientInner {
                id: CLIENT_IDS.fetch_add(1, Ordering::Relaxed),
                node,
                transport,
                managers: parking_lot::RwLock::new(managers),
                cache_flush: OnceLock::new(),
                shards,
                limits,
                holder_down_wait_ms: AtomicU64::new(limits.holder_down_wait_ms),
                failover_wait_ms: AtomicU64::new(0),
                covered: AtomicU64::new(0),
                manager_calls: AtomicU64::new(0),
                revokes_sent: AtomicU64::new(0),
                revokes_answered: AtomicU64::new(0),
                hold_misses: AtomicU64::new(0),
                queued: AtomicU64::new(0),
                probes_sent: AtomicU64::new(0),
                peers_unreachable: AtomicU64::new(0),
                acquire_ids: AtomicU64::new(1),
                crowds: parking_lot::Mutex::new(Default::default()),
                grant_clock: AtomicU64::new(0),
                turns: parking_lot::Mutex::new(Default::default()),
                turns_received: AtomicU64::new(0),
            }),
        }
    }

    /// How long an acquire waits for holders that do not answer its revoke
    /// (`TokenClientLimits::holder_down_wait_ms`), from now on. A cluster sets it from
    /// its failure detection: long enough for a failed holder to be expelled and
    /// recovered, so an acquire never fails while a recovery is under way, and no
    /// longer, so it does not hang for the default 10 minutes when none comes.
    pub fn set_holder_down_wait(&self, wait: Duration) {
        let ms = u64::try_from(wait.as_millis()).unwrap_or(u64::MAX);
        self.inner.holder_down_wait_ms.store(ms, Ordering::Relaxed);
    }

    /// How long a request to a manager node that does not answer
    /// (`TransportError::Unreachable`) waits for that node's slot to be taken over by
    /// another manager node (docs/coherence.md section 7b: the routing changes through
    /// `set_managers` or the new manager's `ClientRequest::HeldIn`), then goes to the
    /// new one; past it, or with 0 (the default: a cluster with one manager node, whose
    /// slot has nowhere to go), the request fails. The request is never sent again to
    /// the node that did not answer (it may have handled it).
    pub fn set_manager_failover_wait(&self, wait: Duration) {
        let ms = u64::try_from(wait.as_millis()).unwrap_or(u64::MAX);
        self.inner.failover_wait_ms.store(ms, Ordering::Relaxed);
    }

    pub fn set_cache_flush(&self, flush: Arc<dyn CacheFlush>) {
        let _ = self.inner.cache_flush.set(flush);
    }

    pub fn node(&self) -> NodeId {
        self.inner.node
    }

    /// The service through which other nodes revoke this node's tokens.
    pub fn service(&self) -> Arc<dyn mako_rt::Service> {
        Arc::new(ClientService {
            inner: Arc::downgrade(&self.inner),
        })
    }

    /// Holds the calling thread has open on this client.
    pub fn holds_on_this_thread(&self) -> u32 {
        thread_holds(self.inner.id)
    }

    /// Make sure this node holds `mode` over at least `required` (up to `desired`) of
    /// `resource`, asking the manager and revoking conflicting holders as needed.
    /// Blocks; must be called with no inode lock, no transaction handle and no hold
    /// open on this thread (docs/coherence.md R1). Returns with nothing held for the
    /// caller: take a `try_hold` next (it may fail if a revoke came in between).
    pub fn acquire(
        &self,
        resource: ResourceId,
        mode: TokenMode,
        required: ByteRange,
        desired: ByteRange,
    ) -> Result<(), TokenError> {
        self.acquire_with(resource, mode, required, desired, None, false)
    }

    /// As `acquire`, replacing (not joining) what this node holds over the grant: `ro`
    /// becomes `rw`. Waits for this node's own `ro` holds there to end first.
    pub fn acquire_replacing(
        &self,
        resource: ResourceId,
        mode: TokenMode,
        required: ByteRange,
        desired: ByteRange,
    ) -> Result<(), TokenError> {
        self.acquire_with(resource, mode, required, desired, None, true)
    }

    /// As `acquire`, granted only while the resource version is `condition.seen_version`
    /// (else its fallback; see `AcquireRequest::condition`).
    pub fn acquire_if(
        &self,
        resource: ResourceId,
        mode: TokenMode,
        required: ByteRange,
        desired: ByteRange,
        condition: Option<Condition>,
    ) -> Result<(), TokenError> {
        self.acquire_with(resource, mode, required, desired, condition, false)
    }

    /// As `acquire`, getting `upgrade_to` instead where nobody else is in the way (see
    /// `AcquireRequest::upgrade_to`), and replacing held modes if `replace`.
    pub fn acquire_upgrading(
        &self,
        resource: ResourceId,
        mode: TokenMode,
        required: ByteRange,
        desired: ByteRange,
        upgrade_to: Option<TokenMode>,
        replace: bool,
    ) -> Result<(), TokenError> {
        let options = AcquireOptions {
            replace,
            upgrade_to,
            ..Default::default()
        };
        self.acquire_full(resource, mode, required, desired, options)
    }

    /// The general acquire: `acquire` with `options` (see `AcquireRequest`).
    pub fn acquire_with_options(
        &self,
        resource: ResourceId,
        mode: TokenMode,
        required: ByteRange,
        desired: ByteRange,
        options: AcquireOptions,
    ) -> Result<(), TokenError> {
        self.acquire_full(resource, mode, required, desired, options)
    }

    /// As `acquire_upgrading`, settling for `alt_mode` when `mode` would have to
    /// revoke someone and `alt_mode` would not (see `AcquireRequest::alt_mode`).
    #[allow(clippy::too_many_arguments)]
    pub fn acquire_any(
        &self,
        resource: ResourceId,
        mode: TokenMode,
        alt_mode: Option<TokenMode>,
        required: ByteRange,
        desired: ByteRange,
        upgrade_to: Option<TokenMode>,
        replace: bool,
    ) -> Result<(), TokenError> {
        let options = AcquireOptions {
            replace,
            upgrade_to,
            alt_mode,
            ..Default::default()
        };
        self.acquire_full(resource, mode, required, desired, options)
    }

    fn acquire_with(
        &self,
        resource: ResourceId,
        mode: TokenMode,
        required: ByteRange,
        desired: ByteRange,
        condition: Option<Condition>,
        replace: bool,
    ) -> Result<(), TokenError> {
        let options = AcquireOptions {
            condition,
            replace,
            ..Default::default()
        };
        self.acquire_full(resource, mode, required, desired, options)
    }

    fn acquire_full(
        &self,
        resource: ResourceId,
        mode: TokenMode,
        required: ByteRange,
        desired: ByteRange,
        options: AcquireOptions,
    ) -> Result<(), TokenError> {
        let AcquireOptions {
            condition,
            replace,
            upgrade_to,
            alt_mode,
            no_revoke,
        } = options;
        let inner = &self.inner;
        debug_assert_eq!(
            thread_holds(inner.id),
            0,
            "{}: blocking acquire of {resource} with holds open on this thread (rule R1)",
            inner.node
        );
        let mut req = AcquireRequest::new(inner.node, resource, mode, required, desired);
        req.condition = condition;
        req.replace = replace;
        req.upgrade_to = upgrade_to;
        req.alt_mode = alt_mode;
        // A try-acquire never waits in the manager's queue.
        req.waiter = (!no_revoke).then(|| inner.acquire_ids.fetch_add(1, Ordering::Relaxed));
        validate_request(&req)?;
        let mut left_queued = false;
        if let Some(w) = req.waiter {
            inner.turns.lock().insert(w, (resource, false));
        }
        let result = self.acquire_rounds(req, options, &mut left_queued);
        if let Some(w) = req.waiter {
            inner.turns.lock().remove(&w);
        }
        if let (true, Some(waiter)) = (result.is_err() || left_queued, req.waiter) {
            // Out of the queue, so as not to stand in anyone's way until the lease ends.
            // Best effort: if the manager is unreachable the lease drops it.
            let _ = inner.ask_manager(
                &resource,
                ManagerRequest::Cancel {
                    node: inner.node,
                    resource,
                    waiter,
                },
            );
        }
        result
    }

    /// Ask for tokens nobody else can hold yet in one manager request: each resource
    /// of `wants` (in its mode, over its whole range) that this node neither holds nor
    /// has an acquire or revoke of in progress is asked for, and granted if the manager
    /// can grant it without revoking or queueing anyone (a try, like
    /// `AcquireOptions::no_revoke`). Returns which were granted; the caller acquires the
    /// others as usual (`acquire`), so a refusal or a failed call costs one more round
    /// trip, never a wrong answer. Nothing is asked unless all of `wants` are routed to
    /// one manager node. Made for the inode and data tokens of a number just reserved
    /// for a new inode, which two acquires asked for one after the other. Never waits.
    pub fn try_acquire_fresh(&self, wants: &[(ResourceId, TokenMode)]) -> Vec<bool> {
        let inner = &self.inner;
        let mut granted = vec![false; wants.len()];
        debug_assert_eq!(
            thread_holds(inner.id),
            0,
            "{}: acquire with holds open on this thread (rule R1)",
            inner.node
        );
        {
            let managers = inner.managers.read();
            let Some((first, _)) = wants.first() else {
                return granted;
            };
            let to = managers.manager_for(first);
            if wants.iter().any(|(r, _)| managers.manager_for(r) != to) {
                return granted;
            }
        }
        // Each resource asked for is `busy` (revokes and other acquires of it wait)
        // and `asking` (a rebuilding manager's report waits) until its answer is in
        // the cache, as in `acquire_rounds`. Nothing waits here while any is busy.
        let mut asked = Vec::new();
        let mut requests = Vec::new();
        for (i, &(resource, mode)) in wants.iter().enumerate() {
            let req = AcquireRequest::new(
                inner.node,
                resource,
                mode,
                ByteRange::WHOLE,
                ByteRange::WHOLE,
            );
            if validate_request(&req).is_err() {
                continue;
            }
            let (lock, _) = inner.shard(&resource);
            let mut shard = lock.lock();
            let st = shard.res.entry(resource).or_default();
            let fresh = st.held.is_empty()
                && st.holds.is_empty()
                && st.revoking.is_empty()
                && st.downgrading.is_empty()
                && !st.busy;
            if !fresh {
                continue;
            }
            st.busy = true;
            st.asking = true;
            asked.push(i);
            requests.push(req);
        }
        let Some(&first) = asked.first() else {
            return granted;
        };
        inner.manager_calls.fetch_add(1, Ordering::Relaxed);
        let replies =
            match inner.ask_manager(&wants[first].0, ManagerRequest::AcquireEach(requests)) {
                Ok(ManagerReply::Each(replies)) if replies.len() == asked.len() => replies,
                _ => Vec::new(),
            };
        for (k, &i) in asked.iter().enumerate() {
            let resource = wants[i].0;
            let (lock, cv) = inner.shard(&resource);
            let mut shard = lock.lock();
            let st = shard.res.entry(resource).or_default();
            st.busy = false;
            st.asking = false;
            if let Some(ManagerReply::Granted(g)) = replies.get(k) {
                inner.record_grant(resource, st, g, false);
                granted[i] = true;
            }
            cv.notify_all();
        }
        granted
    }

    /// The rounds of `acquire_full`: ask the manager; on a conflict revoke the holders
    /// and ask again; behind older requests wait for them to be served.
    fn acquire_rounds(
        &self,
        mut req: AcquireRequest,
        options: AcquireOptions,
        left_queued: &mut bool,
    ) -> Result<(), TokenError> {
        let AcquireOptions {
            replace,
            alt_mode,
            no_revoke,
            ..
        } = options;
        let AcquireRequest {
            resource,
            mode,
            required,
            desired,
            ..
        } = req;
        let inner = &self.inner;
        let (lock, cv) = inner.shard(&resource);
        // Time spent waiting for holders that did not answer (`holder_down_wait_ms`).
        let mut waited_down = Duration::ZERO;
        let mut attempts = 0u32;
        // Waiting in the queue: behind whom, since when, and the next pause.
        let mut queued: Option<(Vec<NodeId>, Duration)> = None;
        let poll_first = Duration::from_millis(inner.limits.queue_poll_ms.max(1));
        let mut pause = poll_first;
        // When the nodes ahead were last asked whether they are there.
        let mut probed: Option<Duration> = None;
        // The manager refused a request of this acquire: with a waiter id it queued
        // it (`AcquireRequest::waiter`), and it stays queued until a grant to it or a
        // cancel.
        let mut refused = false;
        loop {
            // 1. Covered already (and not being revoked)?
            let shard = lock.lock();
            // A replacing grant must not take a promise from this node's own holds.
            let mut shard = inner.wait_until(&resource, shard, |st| {
                !st.busy
                    && (!replace
                        || !st.holds.iter().any(|h| {
                            h.range.overlaps(&desired) && h.mode.is_some_and(|m| !covers(mode, m))
                        }))
            });
            let st = shard.res.entry(resource).or_default();
            let covered = st.covers(required, Some(mode))
                || alt_mode.is_some_and(|a| st.covers(required, Some(a)));
            if covered && !st.revoking_overlaps(&required) {
                inner.covered.fetch_add(1, Ordering::Relaxed);
                // Granted to another acquire of this node meanwhile: a request this
                // one left in the manager's queue must not stand in anyone's way.
                // Every refusal counts, also one followed only by waits for a holder
                // that did not answer (no attempt counted, `queued` reset): counting
                // only attempts and queue waits left a survivor's request queued
                // after a killed holder's recovery, where it held the recovery's
                // recount (and the node's own later acquires, which kept answering
                // `PingWaiting`) for the manager's whole waiter lease (180 s).
                *left_queued = refused;
                return Ok(());
            }
            st.busy = true;
            st.asking = true;
            drop(shard);
            // 2. Ask the manager; a grant goes into the cache before anyone can revoke
            //    it (revokes wait while `busy`). A turn notice from before this ask is
            //    answered by it.
            inner.take_turn(req.waiter);
            inner.manager_calls.fetch_add(1, Ordering::Relaxed);
            let reply = inner.ask_manager(&resource, ManagerRequest::Acquire(req));
            let mut shard = lock.lock();
            let st = shard.res.entry(resource).or_default();
            st.busy = false;
            st.asking = false;
            cv.notify_all();
            refused |= matches!(
                reply,
                Ok(ManagerReply::Failed(
                    TokenError::Conflict { .. } | TokenError::Queued { .. }
                ))
            );
            let (copyset, wanted, effective_required, metanode) = match reply {
                Ok(ManagerReply::Granted(g)) => {
                    inner.record_grant(resource, st, &g, replace);
                    return Ok(());
                }
                // The manager answers for the request it considered (a conditional
                // request may have fallen back to a weaker one).
                Ok(ManagerReply::Failed(TokenError::Conflict {
                    copyset,
                    mode,
                    required,
                    metanode,
                    ..
                })) => (copyset, mode, required, metanode),
                // Older requests of other nodes are in the way: they go first (their
                // requesters revoke); ask again after a pause, without revoking.
                Ok(ManagerReply::Failed(TokenError::Queued {
                    ahead,
                    mode: wanted,
                    required: effective_required,
                    copyset,
                    ..
                })) => {
                    inner.queued.fetch_add(1, Ordering::Relaxed);
                    if no_revoke {
                        if st.is_idle() {
                            shard.res.remove(&resource);
                        }
                        return Err(TokenError::Conflict {
                            resource,
                            mode: wanted,
                            required: effective_required,
                            copyset,
                            metanode: None,
                        });
                    }
                    let now = monotonic_now();
                    match &queued {
                        Some((before, _)) if *before == ahead => {}
                        // Someone ahead was served (or the request is new): progress.
                        _ => {
                            queued = Some((ahead.clone(), now));
                            pause = poll_first;
                            probed = None;
                        }
                    }
                    let since = queued.as_ref().map_or(now, |q| q.1);
                    let waited = now.saturating_sub(since);
                    if now.saturating_sub(probed.unwrap_or(since)) >= QUEUE_PROBE_AFTER {
                        // Still behind the same requests: are their nodes there? Those
                        // that are not leave the queue, and the next ask revokes what
                        // they hold (failing as it would have without queues).
                        probed = Some(now);
                        drop(shard);
                        inner.probe_waiters(&resource, &ahead);
                        req.revoke_answers = 0;
                        continue;
                    }
                    if waited > Duration::from_millis(inner.limits.queue_wait_max_ms) {
                        return Err(TokenError::QueueTimeout {
                            node: inner.node,
                            resource,
                            mode: wanted,
                            required: effective_required,
                            waited_ms: u64::try_from(waited.as_millis()).unwrap_or(u64::MAX),
                            ahead,
                        });
                    }
                    // Until the manager says the turn came (or the safety poll).
                    let until = now + pause;
                    loop {
                        if inner.take_turn(req.waiter) {
                            break;
                        }
                        let now = monotonic_now();
                        if now >= until {
                            break;
                        }
                        cv.wait_for(&mut shard, until - now);
                    }
                    pause = (pause * 2).min(poll_first * QUEUE_POLL_GROWTH_MAX);
                    req.revoke_answers = 0;
                    continue;
                }
                // The manager shard is rebuilding its table (its node failed): ask
                // again once it is done, as for a failed holder.
                Ok(ManagerReply::Failed(e @ TokenError::Rebuilding { .. })) => {
                    drop(shard);
                    inner.wait_rebuild(&mut waited_down, e)?;
                    req.revoke_answers = 0;
                    queued = None;
                    continue;
                }
                Ok(ManagerReply::Failed(e)) => {
                    if st.is_idle() {
                        shard.res.remove(&resource);
                    }
                    return Err(e);
                }
                Ok(other) => {
                    return Err(TokenError::Transport(format!(
                        "unexpected manager reply {other:?}"
                    )))
                }
                Err(e) => return Err(e),
            };
            if no_revoke {
                // Someone else holds it: say so instead of taking it from them.
                if shard.res.get(&resource).is_some_and(|st| st.is_idle()) {
                    shard.res.remove(&resource);
                }
                return Err(TokenError::Conflict {
                    resource,
                    mode: wanted,
                    required: effective_required,
                    copyset,
                    metanode,
                });
            }
            drop(shard);
            // 3. Ask every conflicting holder to give up what overlaps `required`, all
            //    at once, holding nothing ourselves (a holder may be revoking from us) —
            //    except the metanode, asked once the others answered: their revokes
            //    report sizes and block addresses to it, which it can no longer take
            //    once its own revoke began.
            let mut copyset = copyset;
            copyset.sort_by_key(|h| Some(h.node) == metanode);
            let first_wave = copyset
                .iter()
                .position(|h| Some(h.node) == metanode)
                .unwrap_or(copyset.len());
            let make_call = |h: &Holder| {
                let range = h.range.intersect(&effective_required).unwrap_or(h.range);
                let body = mako_rt::encode(
                    "revoke",
                    &ClientRequest::Revoke {
                        resource,
                        range,
                        wanted,
                    },
                )
                .unwrap_or_default();
                (h.node, ServiceId::TokenClient, body)
            };
            inner
                .revokes_sent
                .fetch_add(copyset.len() as u64, Ordering::Relaxed);
            let mut answers = inner.transport.call_many(
                copyset[..first_wave].iter().map(make_call).collect(),
                inner.options(),
            );
            if first_wave < copyset.len() {
                answers.extend(inner.transport.call_many(
                    copyset[first_wave..].iter().map(make_call).collect(),
                    inner.options(),
                ));
            }
            let mut unreachable = None;
            for (h, answer) in copyset.iter().zip(answers) {
                let answer = match answer {
                    // The holder did not answer: it may have failed. Its queued
                    // requests, if any, must not hold others; its tokens stay in the
                    // manager's table until it is recovered (a survivor replays its
                    // log, then releases them): wait for that.
                    Err(e) => {
                        inner.report_unreachable(&resource, h.node);
                        unreachable.get_or_insert((*h, e.to_string()));
                        continue;
                    }
                    Ok(b) => mako_rt::decode::<ClientReply>("revoke reply", &b)
                        .map_err(|e| TokenError::Transport(e.to_string())),
                };
                let e = match answer {
                    Ok(ClientReply::Revoked) => continue,
                    // A fenced holder (a node back from a pause past its lease): wait
                    // for its recovery as for one that does not answer.
                    Ok(ClientReply::Failed(TokenError::HolderFenced { reason, .. })) => {
                        unreachable.get_or_insert((*h, reason));
                        continue;
                    }
                    // A holder the others refuse (it was expelled) could not give its
                    // token back either: the same wait.
                    Ok(ClientReply::Failed(e)) if mako_rt::is_refusal(&e.to_string()) => {
                        unreachable.get_or_insert((*h, e.to_string()));
                        continue;
                    }
                    Ok(ClientReply::Failed(e)) | Err(e) => e,
                    Ok(other) => {
                        TokenError::Transport(format!("unexpected revoke reply {other:?}"))
                    }
                };
                return Err(TokenError::RevokeFailed {
                    node: h.node,
                    resource,
                    range: h.range,
                    source: Box::new(e),
                });
            }
            if let Some((h, why)) = unreachable {
                let retry = Duration::from_millis(inner.limits.holder_down_retry_ms.max(1));
                let wait_max = inner.holder_down_wait_ms.load(Ordering::Relaxed);
                if waited_down >= Duration::from_millis(wait_max) {
                    return Err(TokenError::RevokeFailed {
                        node: h.node,
                        resource,
                        range: h.range,
                        source: Box::new(TokenError::Transport(format!(
                            "{why}; waited {waited_down:?} for it to answer or be recovered"
                        ))),
                    });
                }
                self::pause(retry);
                waited_down += retry;
                // Waiting for a failed holder is not an attempt.
                req.revoke_answers = 0;
                queued = None;
                continue;
            }
            // 4. Retry, forwarding how many answered.
            req.revoke_answers = u32::try_from(copyset.len()).unwrap_or(u32::MAX);
            queued = None;
            attempts += 1;
            if attempts >= inner.limits.acquire_attempts_max {
                return Err(TokenError::AttemptsExhausted {
                    node: inner.node,
                    resource,
                    mode,
                    required,
                    attempts,
                    last_copyset: copyset,
                });
            }
        }
    }

    /// Whole-resource acquire (inode, allocation region, inode-map segment).
    pub fn acquire_whole(&self, resource: ResourceId, mode: TokenMode) -> Result<(), TokenError> {
        self.acquire(resource, mode, ByteRange::WHOLE, ByteRange::WHOLE)
    }

    fn try_hold_inner(
        &self,
        resource: ResourceId,
        mode: Option<TokenMode>,
        range: ByteRange,
    ) -> Option<Hold> {
        let inner = &self.inner;
        let (lock, _) = inner.shard(&resource);
        let mut shard = lock.lock();
        let Some(st) = shard.res.get_mut(&resource) else {
            inner.hold_misses.fetch_add(1, Ordering::Relaxed);
            return None;
        };
        if !st.covers(range, mode) || st.revoking_overlaps(&range) {
            inner.hold_misses.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        match st
            .holds
            .iter_mut()
            .find(|h| h.range == range && h.mode == mode)
        {
            Some(h) => h.count += 1,
            None => st.holds.push(HoldEntry {
                range,
                mode,
                count: 1,
            }),
        }
        drop(shard);
        thread_holds_add(inner.id, 1);
        Some(Hold {
            inner: inner.clone(),
            resource,
            range,
            mode,
        })
    }

    /// Hold `mode` over `range` if this node holds it and no revoke is taking it away;
    /// never waits.
    pub fn try_hold(
        &self,
        resource: ResourceId,
        mode: TokenMode,
        range: ByteRange,
    ) -> Option<Hold> {
        self.try_hold_inner(resource, Some(mode), range)
    }

    /// Hold whatever token this node has over `range` (any mode): enough to trust a
    /// cached copy that every mode covers (an inode handle, say).
    pub fn try_hold_any(&self, resource: ResourceId, range: ByteRange) -> Option<Hold> {
        self.try_hold_inner(resource, None, range)
    }

    /// Acquire then hold, retrying if a revoke slips in between. The same rule as
    /// `acquire` applies: no locks, handles or holds on this thread.
    pub fn hold(
        &self,
        resource: ResourceId,
        mode: TokenMode,
        required: ByteRange,
        desired: ByteRange,
    ) -> Result<Hold, TokenError> {
        for _ in 0..self.inner.limits.acquire_attempts_max {
            if let Some(h) = self.try_hold(resource, mode, required) {
                return Ok(h);
            }
            self.acquire(resource, mode, required, desired)?;
        }
        Err(TokenError::AttemptsExhausted {
            node: self.inner.node,
            resource,
            mode,
            required,
            attempts: self.inner.limits.acquire_attempts_max,
            last_copyset: Vec::new(),
        })
    }

    /// The strongest statement this node can make about `range` of `resource` right
    /// now: the weakest mode held over all of it (no hold taken).
    pub fn held_mode(&self, resource: ResourceId, range: ByteRange) -> Option<TokenMode> {
        let (lock, _) = self.inner.shard(&resource);
        let shard = lock.lock();
        let st = shard.res.get(&resource)?;
        let mut weakest: Option<TokenMode> = None;
        let mut cursor = range.start;
        for (p, m) in st.held.pieces() {
            if p.end <= cursor {
                continue;
            }
            if p.start > cursor {
                return None;
            }
            weakest = Some(match weakest {
                None => *m,
                Some(w) if covers(*m, w) => w,
                Some(w) if covers(w, *m) => *m,
                // ro next to rw: neither covers the other; report ro (the reader's view).
                Some(_) => TokenMode::Ro,
            });
            cursor = p.end;
            if cursor >= range.end {
                break;
            }
        }
        (cursor >= range.end).then_some(weakest).flatten()
    }

    /// The structure version of `resource` as of this node's last grant on it.
    pub fn version_hint(&self, resource: ResourceId) -> u64 {
        let (lock, _) = self.inner.shard(&resource);
        lock.lock().res.get(&resource).map_or(0, |st| st.version)
    }

    /// Does this node hold anything at all on `resource` over `range`?
    pub fn holds_any(&self, resource: ResourceId, range: ByteRange) -> bool {
        let (lock, _) = self.inner.shard(&resource);
        let shard = lock.lock();
        shard
            .res
            .get(&resource)
            .is_some_and(|st| any_mode_covers(&st.held, range))
    }

    /// Does this node hold a token over all of `range` that no revoke is taking away?
    /// A cache filled under this answer, while the caller holds the lock the revoke
    /// handler takes to drop that cache, is dropped by the revoke (if one starts after)
    /// or never filled (if one started before).
    pub fn holds_steadily(&self, resource: ResourceId, range: ByteRange) -> bool {
        let (lock, _) = self.inner.shard(&resource);
        let shard = lock.lock();
        shard
            .res
            .get(&resource)
            .is_some_and(|st| any_mode_covers(&st.held, range) && !st.revoking_overlaps(&range))
    }

    /// Give up this node's tokens over `range` (cache eviction): flush first, then tell
    /// the manager. Blocks; the same rule as `acquire` applies.
    pub fn release(&self, resource: ResourceId, range: ByteRange) -> Result<(), TokenError> {
        validate_range(self.inner.node, resource, range)?;
        if !self.holds_any_part(resource, range) {
            return Ok(());
        }
        self.inner.give_up(resource, range, None)
    }

    fn holds_any_part(&self, resource: ResourceId, range: ByteRange) -> bool {
        let (lock, _) = self.inner.shard(&resource);
        let shard = lock.lock();
        shard
            .res
            .get(&resource)
            .is_some_and(|st| st.held.pieces().iter().any(|(p, _)| p.overlaps(&range)))
    }

    /// A clock that ticks at every grant this node receives from the manager. A cache
    /// filled from disk at clock `t` may hold an old copy of a resource granted after
    /// `t` (`granted_at(r) > t`): another node may have changed it on disk before the
    /// grant. Caches that span several resources (a chunk of the inode file) stamp
    /// themselves with it.
    pub fn grant_clock(&self) -> u64 {
        self.inner.grant_clock.load(Ordering::SeqCst)
    }

    /// `grant_clock` when the manager last granted this node something of `resource`
    /// (0 if this node holds nothing of it).
    pub fn granted_at(&self, resource: ResourceId) -> u64 {
        let (lock, _) = self.inner.shard(&resource);
        let shard = lock.lock();
        shard.res.get(&resource).map_or(0, |st| st.granted_at)
    }

    /// Give up every token (unmount), flushing each resource first.
    pub fn release_all(&self) -> Result<(), TokenError> {
        let mut resources: Vec<ResourceId> = Vec::new();
        for (lock, _) in self.inner.shards.iter() {
            resources.extend(lock.lock().res.keys().copied());
        }
        resources.sort();
        let mut result = Ok(());
        for r in resources {
            result = result.and(self.inner.give_up(r, ByteRange::WHOLE, None));
        }
        let any = ResourceId::new(0, crate::ResourceKind::Inode, 0);
        let reply = self
            .inner
            .ask_manager(&any, ManagerRequest::ReleaseNode(self.inner.node));
        result.and(reply.and_then(ClientInner::expect_done))
    }

    /// Recovery of a failed node (issue 14): drop every token `node` holds, in every
    /// manager shard, so that acquires waiting for it (see `holder_down_wait_ms`)
    /// proceed. Call only once what `node` held dirty is safe: its recovery log
    /// replayed (`mako_fs::recovery::recover_failed_node`).
    pub fn release_failed_node(&self, node: NodeId) -> Result<(), TokenError> {
        let mut managers = self.inner.managers.read().nodes.clone();
        managers.sort();
        managers.dedup();
        // The failed node's own shard went with it (section 7b: its slot is rebuilt
        // by another manager node, which is in the routing too).
        if managers.len() > 1 {
            managers.retain(|m| *m != node);
        }
        if managers.is_empty() {
            managers.push(NodeId(0));
        }
        let mut result = Ok(());
        for m in managers {
            let reply = mako_rt::call(
                &*self.inner.transport,
                m,
                ServiceId::TokenManager,
                &ManagerRequest::ReleaseNode(node),
                self.inner.options(),
            )
            .map_err(|e| TokenError::Transport(e.to_string()));
            result = result.and(reply.and_then(ClientInner::expect_done));
        }
        result
    }

    /// The metanode of inode resource `resource`; with `become_if_none` this node
    /// becomes it if there is none and it holds a write mode.
    pub fn locate_metanode(
        &self,
        resource: ResourceId,
        become_if_none: bool,
    ) -> Result<Option<NodeId>, TokenError> {
        let mut waited = Duration::ZERO;
        loop {
            match self.inner.ask_manager(
                &resource,
                ManagerRequest::LocateMetanode {
                    node: self.inner.node,
                    resource,
                    become_if_none,
                },
            )? {
                ManagerReply::Failed(e @ TokenError::Rebuilding { .. }) => {
                    self.inner.wait_rebuild(&mut waited, e)?;
                }
                reply => return self.metanode_located(resource, reply),
            }
        }
    }

    fn metanode_located(
        &self,
        resource: ResourceId,
        reply: ManagerReply,
    ) -> Result<Option<NodeId>, TokenError> {
        match reply {
            ManagerReply::Metanode(m) => {
                if m == Some(self.inner.node) {
                    let (lock, _) = self.inner.shard(&resource);
                    if let Some(st) = lock.lock().res.get_mut(&resource) {
                        st.metanode = !st.held.is_empty();
                    }
                }
                Ok(m)
            }
            ManagerReply::Failed(e) => Err(e),
            other => Err(TokenError::Transport(format!(
                "unexpected manager reply {other:?}"
            ))),
        }
    }

    /// Whether the manager named this node the metanode of `resource` (told with the
    /// grant, or by a locate) and it still holds a write mode there. A node named so
    /// serves metanode requests from then on, even before its own operation that
    /// asked for the token gets to the inode (docs/coherence.md section 4).
    pub fn named_metanode(&self, resource: ResourceId) -> bool {
        let (lock, _) = self.inner.shard(&resource);
        let shard = lock.lock();
        shard.res.get(&resource).is_some_and(|st| st.metanode)
    }

    /// How many other nodes were waiting for conflicting modes when the manager last
    /// granted `resource` to this node (`Grant::contenders`). Meaningful while this
    /// node holds what that grant gave.
    pub fn contenders(&self, resource: ResourceId) -> u32 {
        self.inner
            .crowds
            .lock()
            .get(&resource)
            .copied()
            .unwrap_or(0)
    }

    pub fn resign_metanode(&self, resource: ResourceId) -> Result<(), TokenError> {
        {
            let (lock, _) = self.inner.shard(&resource);
            if let Some(st) = lock.lock().res.get_mut(&resource) {
                st.metanode = false;
            }
        }
        self.inner
            .ask_manager(
                &resource,
                ManagerRequest::ResignMetanode {
                    node: self.inner.node,
                    resource,
                },
            )
            .and_then(ClientInner::expect_done)
    }

    /// Record a structural change of `resource` (see `AcquireRequest::condition`).
    pub fn set_version(&self, resource: ResourceId, version: u64) -> Result<(), TokenError> {
        self.inner
            .ask_manager(&resource, ManagerRequest::SetVersion { resource, version })
            .and_then(ClientInner::expect_done)?;
        let (lock, _) = self.inner.shard(&resource);
        let mut shard = lock.lock();
        let st = shard.res.entry(resource).or_default();
        st.version = st.version.max(version);
        Ok(())
    }

    /// Everyone holding tokens on `resource`, as the manager records it.
    pub fn manager_holders(&self, resource: ResourceId) -> Result<Vec<Holder>, TokenError> {
        match self
            .inner
            .ask_manager(&resource, ManagerRequest::Holders(resource))?
        {
            ManagerReply::Holders(h) => Ok(h),
            ManagerReply::Failed(e) => Err(e),
            other => Err(TokenError::Transport(format!(
                "unexpected manager reply {other:?}"
            ))),
        }
    }

    /// What this node believes it holds on `resource`.
    pub fn held(&self, resource: ResourceId) -> Vec<(ByteRange, TokenMode)> {
        let (lock, _) = self.inner.shard(&resource);
        lock.lock()
            .res
            .get(&resource)
            .map(|h| h.held.pieces().to_vec())
            .unwrap_or_default()
    }

    /// Route by `managers` from now on: a failed manager node's slot was taken over
    /// by another node (docs/coherence.md section 7b). The new manager's
    /// `ClientRequest::HeldIn` does the same; this tells a node before it is asked.
    pub fn set_managers(&self, managers: ManagerMap) {
        *self.inner.managers.write() = managers;
    }

    /// What this node would answer to `ClientRequest::HeldIn` (tests).
    #[cfg(test)]
    pub(crate) fn report_for_tests(&self, slot: usize, managers: ManagerMap) -> Vec<HeldToken> {
        self.inner.held_in(slot, managers)
    }

    /// The manager routing in use.
    pub fn managers(&self) -> ManagerMap {
        self.inner.managers.read().clone()
    }

    /// The manager node whose token manager shard keeps `resource`.
    pub fn manager_of(&self, resource: &ResourceId) -> NodeId {
        self.inner.managers.read().manager_for(resource)
    }

    /// Every resource with cached tokens, with what is held on it.
    pub fn held_all(&self) -> Vec<(ResourceId, Vec<(ByteRange, TokenMode)>)> {
        let mut out = Vec::new();
        for (lock, _) in self.inner.shards.iter() {
            out.extend(
                lock.lock()
                    .res
                    .iter()
                    .filter(|(_, st)| !st.held.is_empty())
                    .map(|(r, st)| (*r, st.held.pieces().to_vec())),
            );
        }
        out.sort_by_key(|(r, _)| *r);
        out
    }

    /// Holds open right now, by resource (diagnostics, invariant checks).
    pub fn holds_all(&self) -> Vec<(ResourceId, ByteRange, Option<TokenMode>, u32)> {
        let mut out = Vec::new();
        for (lock, _) in self.inner.shards.iter() {
            for (r, st) in lock.lock().res.iter() {
                for h in &st.holds {
                    out.push((*r, h.range, h.mode, h.count));
                }
            }
        }
        out.sort_by_key(|x| (x.0, x.1));
        out
    }

    pub fn stats(&self) -> TokenClientStats {
        let s = &self.inner;
        TokenClientStats {
            covered: s.covered.load(Ordering::Relaxed),
            manager_calls: s.manager_calls.load(Ordering::Relaxed),
            revokes_sent: s.revokes_sent.load(Ordering::Relaxed),
            revokes_answered: s.revokes_answered.load(Ordering::Relaxed),
            queued: s.queued.load(Ordering::Relaxed),
            probes_sent: s.probes_sent.load(Ordering::Relaxed),
            peers_unreachable: s.peers_unreachable.load(Ordering::Relaxed),
            hold_misses: s.hold_misses.load(Ordering::Relaxed),
            turns: s.turns_received.load(Ordering::Relaxed),
        }
    }
}

/// The `TokenClient` service of a node: other nodes' revokes.
struct ClientService {
    inner: std::sync::Weak<ClientInner>,
}

impl mako_rt::Service for ClientService {
    fn handle(&self, from: NodeId, request: &[u8]) -> Vec<u8> {
        let reply = match (
            self.inner.upgrade(),
            mako_rt::decode::<ClientRequest>("token client request", request),
        ) {
            (None, _) => {
                ClientReply::Failed(TokenError::Transport("the token client has stopped".into()))
            }
            (_, Err(e)) => ClientReply::Failed(TokenError::Transport(e.to_string())),
            (Some(_), Ok(ClientRequest::Ping)) => ClientReply::Alive,
            (Some(inner), Ok(ClientRequest::PingWaiting(resource))) => {
                ClientReply::Waiting(inner.waiting_on(&resource))
            }
            (Some(inner), Ok(ClientRequest::Turn { resource, waiter })) => {
                inner.turn(&resource, waiter);
                ClientReply::Alive
            }
            (Some(inner), Ok(ClientRequest::HeldIn { slot, managers })) => {
                ClientReply::Held(inner.held_in(slot as usize, managers))
            }
            (
                Some(inner),
                Ok(ClientRequest::Revoke {
                    resource,
                    range,
                    wanted,
                }),
            ) => {
                let _ = from;
                inner.revokes_answered.fetch_add(1, Ordering::Relaxed);
                match inner.give_up(resource, range, Some(wanted)) {
                    Ok(()) => ClientReply::Revoked,
                    Err(e) => ClientReply::Failed(e),
                }
            }
        };
        mako_rt::encode("token client reply", &reply).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manager::TokenManager;
    use crate::protocol::ManagerService;
    use crate::resource::ResourceKind;
    use mako_rt::{InProcessTransport, Registry};
    use parking_lot::Mutex;
    use TokenMode::*;

    const A: NodeId = NodeId(1);
    const B: NodeId = NodeId(2);

    fn file() -> ResourceId {
        ResourceId::new(1, ResourceKind::ByteRange, 9)
    }

    fn r(s: u64, e: u64) -> ByteRange {
        ByteRange::new(s, e)
    }

    /// A node cache that records every flush, and can be told to fail.
    #[derive(Default)]
    struct RecordingCache {
        calls: Mutex<Vec<(ResourceId, ByteRange, Option<TokenMode>)>>,
        fail: std::sync::atomic::AtomicBool,
    }

    impl CacheFlush for RecordingCache {
        fn flush_and_invalidate(
            &self,
            resource: ResourceId,
            range: ByteRange,
            keep: Option<TokenMode>,
        ) -> Result<(), TokenError> {
            self.calls.lock().push((resource, range, keep));
            if self.fail.load(Ordering::Relaxed) {
                return Err(TokenError::FlushFailed {
                    node: A,
                    resource,
                    range,
                    reason: "injected disk error".into(),
                });
            }
            Ok(())
        }
    }

    struct Cluster {
        manager: Arc<TokenManager>,
        registry: Arc<Registry>,
    }

    impl Cluster {
        fn new() -> Self {
            let registry = Registry::new();
            let manager = Arc::new(TokenManager::default());
            registry.register(
                NodeId(0),
                ServiceId::TokenManager,
                Arc::new(ManagerService {
                    manager: manager.clone(),
                }),
            );
            Cluster { manager, registry }
        }

        fn client(&self, node: NodeId, cache: Arc<RecordingCache>) -> TokenClient {
            let c = TokenClient::new(
                node,
                Arc::new(InProcessTransport::new(node, self.registry.clone())),
                ManagerMap::single(NodeId(0)),
                TokenClientLimits::default(),
            );
            c.set_cache_flush(cache);
            self.registry
                .register(node, ServiceId::TokenClient, c.service());
            c
        }
    }

    /// A new inode's two tokens: one manager request grants both.
    #[test]
    fn fresh_tokens_come_in_one_manager_request() {
        let c = Cluster::new();
        let a = c.client(A, Arc::default());
        let inode = ResourceId::new(1, ResourceKind::Inode, 7);
        let data = ResourceId::new(1, ResourceKind::ByteRange, 7);
        assert_eq!(
            a.try_acquire_fresh(&[(inode, Xw), (data, Xw)]),
            [true, true]
        );
        assert_eq!(a.stats().manager_calls, 1);
        assert_eq!(c.manager.stats().acquires, 2);
        for r in [inode, data] {
            assert_eq!(a.held_mode(r, ByteRange::WHOLE), Some(Xw), "{r}");
            assert!(a.try_hold(r, Xw, ByteRange::WHOLE).is_some(), "{r}");
        }
        // Held already: nothing is asked.
        assert_eq!(
            a.try_acquire_fresh(&[(inode, Xw), (data, Xw)]),
            [false, false]
        );
        assert_eq!(a.stats().manager_calls, 1);
    }

    /// What another node holds is neither revoked nor granted over it: that token is
    /// left for a normal acquire, which then still works (nothing was left busy).
    #[test]
    fn a_fresh_acquire_takes_nothing_from_another_node() {
        let c = Cluster::new();
        let cache_b = Arc::new(RecordingCache::default());
        let a = c.client(A, Arc::default());
        let b = c.client(B, cache_b.clone());
        let inode = ResourceId::new(1, ResourceKind::Inode, 8);
        let data = ResourceId::new(1, ResourceKind::ByteRange, 8);
        b.acquire(data, Ro, ByteRange::WHOLE, ByteRange::WHOLE)
            .expect("b reads");
        assert_eq!(
            a.try_acquire_fresh(&[(inode, Xw), (data, Xw)]),
            [true, false]
        );
        assert_eq!(a.stats().manager_calls, 1);
        assert!(cache_b.calls.lock().is_empty(), "no revoke");
        assert_eq!(b.held_mode(data, ByteRange::WHOLE), Some(Ro));
        assert_eq!(a.held_mode(data, ByteRange::WHOLE), None);
        assert_eq!(a.held_mode(inode, ByteRange::WHOLE), Some(Xw));
        a.acquire(data, Xw, ByteRange::WHOLE, ByteRange::WHOLE)
            .expect("a normal acquire revokes b");
        assert_eq!(cache_b.calls.lock().len(), 1);
        assert_eq!(b.held_mode(data, ByteRange::WHOLE), None);
    }

    /// Resources of two manager nodes cannot go in one request: nothing is asked.
    #[test]
    fn a_fresh_acquire_across_manager_nodes_asks_nothing() {
        let registry = Registry::new();
        let managers = ManagerMap {
            nodes: vec![NodeId(0), NodeId(3)],
        };
        let a = TokenClient::new(
            A,
            Arc::new(InProcessTransport::new(A, registry.clone())),
            managers.clone(),
            TokenClientLimits::default(),
        );
        let first = ResourceId::new(1, ResourceKind::Inode, 1);
        let other = (2..1000)
            .map(|i| ResourceId::new(1, ResourceKind::ByteRange, i))
            .find(|r| managers.slot_for(r) != managers.slot_for(&first))
            .expect("a resource of the other slot");
        assert_eq!(
            a.try_acquire_fresh(&[(first, Xw), (other, Xw)]),
            [false, false]
        );
        assert_eq!(a.stats().manager_calls, 0);
    }

    #[test]
    fn covered_acquire_skips_the_manager() {
        let c = Cluster::new();
        let a = c.client(A, Arc::default());
        a.acquire(file(), Xw, r(0, 10), ByteRange::WHOLE)
            .expect("first");
        let before = c.manager.stats().acquires;
        a.acquire(file(), Ro, r(500, 600), r(0, 1000))
            .expect("covered by xw");
        a.acquire(file(), Rw, r(5, 6), r(5, 6)).expect("covered");
        assert_eq!(
            c.manager.stats().acquires,
            before,
            "no manager call on a hit"
        );
        assert_eq!(a.stats().covered, 2);
        assert_eq!(a.stats().manager_calls, 1);
        // A hit still validates the request like the manager would.
        assert!(a.acquire(file(), Ro, r(5, 6), r(7, 8)).is_err());
        let h = a
            .try_hold(file(), Xw, r(0, 4096))
            .expect("hold on a held token");
        assert_eq!(a.holds_on_this_thread(), 1);
        drop(h);
        assert_eq!(a.holds_on_this_thread(), 0);
        assert!(a.try_hold(file(), Xw, r(0, 10)).is_some());
    }

    #[test]
    fn revoke_flow_between_two_clients() {
        let c = Cluster::new();
        let cache_a = Arc::new(RecordingCache::default());
        let cache_b = Arc::new(RecordingCache::default());
        let a = c.client(A, Arc::clone(&cache_a));
        let b = c.client(B, Arc::clone(&cache_b));

        a.acquire(file(), Xw, r(0, 4096), ByteRange::WHOLE)
            .expect("a writes");
        // B wants to write [8192, 12288): A must give up that part (and nothing else).
        b.acquire(file(), Xw, r(8192, 12288), ByteRange::WHOLE)
            .expect("b after revoke");
        assert_eq!(
            *cache_a.calls.lock(),
            vec![(file(), r(8192, 12288), None)],
            "A flushed exactly the required part"
        );
        assert!(cache_b.calls.lock().is_empty());
        assert_eq!(
            a.held(file()),
            vec![(r(0, 8192), Xw), (r(12288, u64::MAX), Xw)]
        );
        assert_eq!(b.held(file()), vec![(r(8192, 12288), Xw)]);
        assert_eq!((a.stats().revokes_answered, b.stats().revokes_sent), (1, 1));

        // A reader revoking a writer lets the writer keep ro (downgrade, not drop).
        b.acquire(file(), Ro, r(0, 100), r(0, 100))
            .expect("b reads");
        assert_eq!(cache_a.calls.lock()[1], (file(), r(0, 100), Some(Ro)));
        assert_eq!(a.held(file())[0], (r(0, 100), Ro));
        let calls = a.stats().manager_calls;
        a.acquire(file(), Ro, r(10, 20), r(10, 20)).expect("hit");
        assert_eq!(a.stats().manager_calls, calls);
    }

    #[test]
    fn a_failed_flush_keeps_the_token_and_names_the_cause() {
        let c = Cluster::new();
        let cache_a = Arc::new(RecordingCache::default());
        let a = c.client(A, Arc::clone(&cache_a));
        let b = c.client(B, Arc::default());
        a.acquire(file(), Xw, r(0, 10), r(0, 10)).expect("a");
        cache_a.fail.store(true, Ordering::Relaxed);
        let e = b.acquire(file(), Ro, r(0, 1), r(0, 1)).unwrap_err();
        assert!(matches!(e, TokenError::RevokeFailed { node: A, .. }), "{e}");
        assert!(e.to_string().contains("injected disk error"), "{e}");
        assert_eq!(c.manager.holders(file())[0].node, A);
        assert!(
            a.try_hold(file(), Xw, r(0, 10)).is_some(),
            "A still holds it"
        );
    }

    #[test]
    fn a_stopped_holder_is_a_clear_error() {
        let c = Cluster::new();
        let a = c.client(A, Arc::default());
        a.acquire(file(), Xw, r(0, 10), r(0, 10)).expect("a");
        drop(a);
        let b = c.client(B, Arc::default());
        let e = b.acquire(file(), Ro, r(0, 1), r(0, 1)).unwrap_err();
        assert!(e.to_string().contains("stopped"), "{e}");
    }

    #[test]
    fn release_and_release_all() {
        let c = Cluster::new();
        let cache = Arc::new(RecordingCache::default());
        let a = c.client(A, Arc::clone(&cache));
        let inode = ResourceId::new(1, ResourceKind::Inode, 9);
        a.acquire_whole(inode, Ro).expect("inode");
        a.acquire(file(), Rw, r(0, 100), r(0, 100)).expect("data");
        a.release(file(), r(0, 50)).expect("release part");
        assert_eq!(a.held(file()), vec![(r(50, 100), Rw)]);
        assert_eq!(
            cache.calls.lock().len(),
            1,
            "released data is flushed first"
        );
        a.release_all().expect("all");
        assert!(a.held_all().is_empty());
        assert!(c.manager.dump().is_empty());
    }

    #[test]
    fn metanode_follows_the_write_tokens() {
        let c = Cluster::new();
        let a = c.client(A, Arc::default());
        let b = c.client(B, Arc::default());
        let ino = ResourceId::new(1, ResourceKind::Inode, 5);
        a.acquire_whole(ino, Xw).expect("a xw");
        assert_eq!(b.locate_metanode(ino, true).expect("locate"), Some(A));
        // A second writer shares: A keeps rw and stays metanode.
        b.acquire_whole(ino, Rw).expect("b rw");
        assert_eq!(a.held(ino), vec![(ByteRange::WHOLE, Rw)]);
        assert_eq!(b.locate_metanode(ino, true).expect("locate"), Some(A));
        // A gives up: no metanode until a writer asks to become it.
        a.release(ino, ByteRange::WHOLE).expect("a releases");
        assert_eq!(a.locate_metanode(ino, false).expect("locate"), None);
        assert_eq!(
            a.locate_metanode(ino, true).expect("locate"),
            None,
            "A holds nothing"
        );
        assert_eq!(b.locate_metanode(ino, true).expect("locate"), Some(B));
        b.resign_metanode(ino).expect("resign");
        assert_eq!(b.locate_metanode(ino, false).expect("locate"), None);
    }
}

#[cfg(test)]
mod unreachable_waiter_tests {
    use super::*;
    use crate::manager::TokenManager;
    use crate::protocol::ManagerService;
    use crate::resource::ResourceKind;
    use mako_rt::{InProcessTransport, Registry};
    use TokenMode::*;

    /// A node that died (kill -9) with a request queued: it offers no service, so
    /// any call to it fails, as a call to a killed makod does.
    const DEAD: NodeId = NodeId(3);

    fn inode(n: u64) -> ResourceId {
        ResourceId::new(1, ResourceKind::Inode, n)
    }

    fn setup() -> (Arc<TokenManager>, Arc<Registry>) {
        let registry = Registry::new();
        let manager = Arc::new(TokenManager::default());
        registry.register(
            NodeId(0),
            ServiceId::TokenManager,
            Arc::new(ManagerService {
                manager: manager.clone(),
            }),
        );
        (manager, registry)
    }

    fn client(registry: &Arc<Registry>, node: NodeId) -> TokenClient {
        client_with(registry, node, TokenClientLimits::default())
    }

    fn client_with(
        registry: &Arc<Registry>,
        node: NodeId,
        limits: TokenClientLimits,
    ) -> TokenClient {
        let c = TokenClient::new(
            node,
            Arc::new(InProcessTransport::new(node, registry.clone())),
            ManagerMap::single(NodeId(0)),
            limits,
        );
        registry.register(node, ServiceId::TokenClient, c.service());
        c
    }

    /// The dead node's request, older than everyone's, is queued on `resource`.
    fn dead_waits(m: &TokenManager, resource: ResourceId) {
        let mut req = AcquireRequest::whole(DEAD, resource, Xw);
        req.waiter = Some(1);
        assert!(matches!(m.acquire(req), Err(TokenError::Conflict { .. })));
        assert_eq!(m.waiters(resource), vec![DEAD]);
    }

    /// Without `Ping` and `DropWaiters`, the live node's acquire waited behind the
    /// dead node's request for the manager's whole waiter lease (180 s; the netcluster
    /// kill -9 test gives up after 150 s).
    #[test]
    fn a_dead_nodes_queued_request_does_not_hold_the_others() {
        let (m, registry) = setup();
        let a = client(&registry, NodeId(1));
        let b = client(&registry, NodeId(2));
        a.acquire_whole(inode(7), Xw).expect("a holds");
        dead_waits(&m, inode(7));
        // B is behind the dead node's request; after QUEUE_PROBE_AFTER it pings the
        // dead node, which does not answer, and the manager drops its request: B
        // revokes A and is served.
        b.acquire_whole(inode(7), Xw)
            .expect("served once the dead node's request is dropped");
        assert!(b.stats().probes_sent >= 1, "{:?}", b.stats());
        assert_eq!(m.stats().waiters_dropped, 1, "{:?}", m.stats());
        assert!(m.waiters(inode(7)).is_empty());
    }

    /// A live node's request left in the queue (its cancel never arrived, or an
    /// earlier incarnation of the node queued it) held the others for the manager's
    /// whole waiter lease (180 s: sim fault seeds 5 and 17, a survivor's operation in
    /// the kill -9 rounds): the node answered `Ping`. Asked whether it still waits for
    /// the resource, it says no, and the manager drops its request there.
    #[test]
    fn a_live_nodes_left_over_request_does_not_hold_the_others() {
        let (m, registry) = setup();
        let a = client(&registry, NodeId(1));
        let b = client(&registry, NodeId(2));
        let c = client(&registry, NodeId(3));
        a.acquire_whole(inode(7), Xw).expect("a holds");
        // Node 3 is there, but nothing on it waits for inode 7.
        let mut req = AcquireRequest::whole(NodeId(3), inode(7), Xw);
        req.waiter = Some(1);
        assert!(matches!(m.acquire(req), Err(TokenError::Conflict { .. })));
        assert_eq!(m.waiters(inode(7)), vec![NodeId(3)]);
        b.acquire_whole(inode(7), Xw)
            .expect("served once the left-over request is dropped");
        assert!(b.stats().probes_sent >= 1, "{:?}", b.stats());
        assert_eq!(m.stats().waiters_dropped, 1, "{:?}", m.stats());
        assert!(m.waiters(inode(7)).is_empty());
        // Node 3 itself still works, and is not dropped from elsewhere.
        c.acquire_whole(inode(7), Ro).expect("c is served");
    }

    /// A revoke that cannot reach a holder fails the acquire once the wait for the
    /// holder's recovery is over (none here: `holder_down_wait_ms` 0), and the
    /// holder's queued requests elsewhere are dropped.
    #[test]
    fn a_failed_revoke_drops_the_holders_queued_requests() {
        let (m, registry) = setup();
        let a = client(&registry, NodeId(1));
        let b = client_with(
            &registry,
            NodeId(2),
            TokenClientLimits {
                holder_down_wait_ms: 0,
                ..TokenClientLimits::default()
            },
        );
        m.acquire(AcquireRequest::whole(DEAD, inode(8), Ro))
            .expect("the dead node held a token");
        a.acquire_whole(inode(9), Xw).expect("a holds");
        dead_waits(&m, inode(9));
        let e = b
            .acquire_whole(inode(8), Xw)
            .expect_err("the holder is dead");
        assert!(
            matches!(e, TokenError::RevokeFailed { node: DEAD, .. }),
            "{e}"
        );
        assert_eq!(b.stats().peers_unreachable, 1, "{:?}", b.stats());
        assert!(
            m.waiters(inode(9)).is_empty(),
            "dropped with the failed revoke"
        );
        // What the dead node holds stays until recovery releases it.
        assert_eq!(m.holders(inode(8)).len(), 1);
        b.acquire_whole(inode(9), Xw)
            .expect("nobody ahead: revokes a and is served");
        assert_eq!(b.stats().probes_sent, 0, "{:?}", b.stats());
    }

    /// Two acquires of one node wait for a killed holder (its revokes fail; the
    /// manager queued both requests when it refused them). Once recovery releases the
    /// holder's tokens one is granted and the other finds the token in the cache: it
    /// must take its request out of the manager's queue. It did not (only attempts
    /// and queue waits counted as having left a request there), and the left-over
    /// request held every other node's conflicting acquire — the killed node's
    /// recovering survivor's recount in the kill -9 rounds, 179.6 s — while the node's
    /// own later acquires of the resource kept it alive by answering `PingWaiting`,
    /// for the manager's whole waiter lease.
    #[test]
    fn acquires_that_waited_for_a_killed_holder_leave_no_request_queued() {
        let (m, registry) = setup();
        let b = client(&registry, NodeId(2));
        m.acquire(AcquireRequest::whole(DEAD, inode(5), Xw))
            .expect("the killed node held the directory");
        let threads: Vec<_> = (0..2)
            .map(|_| {
                let b = b.clone();
                std::thread::spawn(move || b.acquire_whole(inode(5), Xw))
            })
            .collect();
        // Both were refused for the killed holder and found it unreachable: both are
        // queued at the manager.
        wait_for("both acquires to be refused for the killed holder", || {
            m.waiters(inode(5)).len() == 2
        });
        assert_eq!(m.waiters(inode(5)), vec![NodeId(2), NodeId(2)]);
        assert!(b.stats().peers_unreachable >= 1, "{:?}", b.stats());
        // Recovery releases what the killed node held.
        m.release_node(DEAD);
        for t in threads {
            t.join()
                .expect("an acquire thread")
                .expect("served once the killed holder's tokens are released");
        }
        assert_eq!(
            m.waiters(inode(5)),
            Vec::<NodeId>::new(),
            "a request of an acquire that ended is still queued"
        );
        // Another node is served at once, without waiting behind a left-over request.
        let c = client(&registry, NodeId(4));
        c.acquire_whole(inode(5), Xw)
            .expect("c revokes b and is served");
        assert_eq!(c.stats().queued, 0, "{:?}", c.stats());
    }

    /// A cache whose flushes wait until the test opens the gate: a revoke that lasts
    /// as long as the test wants, whatever the machine's speed.
    #[derive(Default)]
    struct GateCache {
        open: parking_lot::Mutex<bool>,
        opened: parking_lot::Condvar,
        entered: AtomicU64,
    }

    impl CacheFlush for GateCache {
        fn flush_and_invalidate(
            &self,
            _: ResourceId,
            _: ByteRange,
            _: Option<TokenMode>,
        ) -> Result<(), TokenError> {
            self.entered.fetch_add(1, Ordering::SeqCst);
            let mut open = self.open.lock();
            while !*open {
                self.opened.wait(&mut open);
            }
            Ok(())
        }
    }

    /// Hang guard of the tests below: far beyond what they need on a loaded machine.
    const HANG_GUARD: Duration = Duration::from_secs(120);

    fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
        let start = std::time::Instant::now();
        while !done() {
            assert!(start.elapsed() < HANG_GUARD, "gave up waiting for {what}");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// A live node's left-over request (a cancel that never arrived) is dropped even
    /// while the node runs another acquire of the resource. Asked only whether an
    /// acquire of the resource ran, the node said yes, and the left-over request held
    /// the others — in the kill -9 rounds for the manager's whole waiter lease, the
    /// node's new acquire being queued behind the very request the left-over one held
    /// up. Asked which acquires run, it names only the running one.
    #[test]
    fn a_left_over_request_goes_while_the_node_acquires_again() {
        let (m, registry) = setup();
        let a = client(&registry, NodeId(1));
        let b = client(&registry, NodeId(2));
        let c = client(&registry, NodeId(3));
        let gate = Arc::new(GateCache::default());
        a.set_cache_flush(gate.clone());
        a.acquire_whole(inode(7), Xw).expect("a holds");
        // Node 3's left-over request: queued, its acquire long gone.
        let mut req = AcquireRequest::whole(NodeId(3), inode(7), Xw);
        req.waiter = Some(1000);
        assert!(matches!(m.acquire(req), Err(TokenError::Conflict { .. })));
        // Node 3 acquires the inode again: it revokes a, whose flush waits at the gate.
        let c2 = c.clone();
        let tc = std::thread::spawn(move || c2.acquire_whole(inode(7), Xw));
        wait_for("a's flush", || gate.entered.load(Ordering::SeqCst) == 1);
        // b is queued behind node 3's two requests; after QUEUE_PROBE_AFTER it asks
        // node 3 which of its acquires run, and the left-over request goes.
        let b2 = b.clone();
        let tb = std::thread::spawn(move || b2.acquire_whole(inode(7), Xw));
        wait_for("the left-over request to be dropped", || {
            m.stats().waiters_dropped == 1
        });
        assert_eq!(m.waiters(inode(7)), vec![NodeId(3), NodeId(2)]);
        assert!(b.stats().probes_sent >= 1, "{:?}", b.stats());
        *gate.open.lock() = true;
        gate.opened.notify_all();
        tc.join().expect("c's thread").expect("c is served");
        tb.join().expect("b's thread").expect("b is served after c");
        assert!(m.waiters(inode(7)).is_empty());
    }

    /// A request queued behind an older one is told by the manager when its turn
    /// comes (`ClientRequest::Turn`) and asks again then, not before: with its own
    /// safety poll set to an hour, it is served only if the notice arrives, and it
    /// asks the manager three times in all (queued; told, refused for the holder,
    /// revokes it; granted). Before the notices it asked every 200 µs to 8 ms while
    /// the request ahead was served.
    #[test]
    fn a_queued_acquire_is_told_its_turn_instead_of_polling() {
        let (m, registry) = setup();
        let manager_transport: Arc<dyn Transport> =
            Arc::new(InProcessTransport::new(NodeId(0), registry.clone()));
        m.notify_through(Arc::downgrade(&manager_transport));
        let limits = TokenClientLimits {
            queue_poll_ms: 3_600_000,
            ..TokenClientLimits::default()
        };
        const A: NodeId = NodeId(1);
        const B: NodeId = NodeId(2);
        const C: NodeId = NodeId(4);
        let a = client_with(&registry, A, limits);
        let b = client_with(&registry, B, limits);
        let c = client_with(&registry, C, limits);
        let gate = Arc::new(GateCache::default());
        a.set_cache_flush(gate.clone());
        a.acquire_whole(inode(1), Xw).expect("a holds");
        // b asks first and revokes a, whose flush waits at the gate.
        let b2 = b.clone();
        let tb = std::thread::spawn(move || b2.acquire_whole(inode(1), Xw));
        wait_for("a's flush", || gate.entered.load(Ordering::SeqCst) == 1);
        // c asks now: queued behind b.
        let (done_tx, done_rx) = std::sync::mpsc::channel();
        let c2 = c.clone();
        std::thread::spawn(move || {
            let _ = done_tx.send(c2.acquire_whole(inode(1), Xw));
        });
        wait_for("c to be queued", || c.stats().queued == 1);
        assert_eq!(m.waiters(inode(1)), vec![B, C]);
        *gate.open.lock() = true;
        gate.opened.notify_all();
        tb.join().expect("b's thread").expect("b is served");
        let c_result = done_rx
            .recv_timeout(HANG_GUARD)
            .expect("c was never told that its turn came");
        c_result.expect("c is served");
        let stats = c.stats();
        assert_eq!(stats.turns, 1, "{stats:?}");
        assert_eq!(stats.manager_calls, 3, "{stats:?}");
        assert_eq!(stats.queued, 1, "{stats:?}");
        assert!(m.stats().turns >= 1, "{:?}", m.stats());
        assert!(m.waiters(inode(1)).is_empty());
    }
}
