//! The per-node side of the token protocol: a cache of held tokens that answers repeat
//! acquires without asking the manager, and the revoke protocol run against the
//! in-process manager and the other nodes' revoke handlers.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::{Mutex, RwLock};
use serde::{Deserialize, Serialize};

use crate::error::TokenError;
use crate::held_ranges::HeldRanges;
use crate::manager::{
    validate_range, validate_request, AcquireRequest, Grant, Holder, TokenManager,
};
use crate::mode::{compatible, covers, TokenMode};
use crate::range::ByteRange;
use crate::resource::{NodeId, ResourceId};

/// What a node does when another node needs part of its token: flush dirty data under
/// `range`, invalidate its caches there, and give up (or weaken) its token so that
/// `wanted` can be granted. Returns once the token is given up.
pub trait RevokeHandler: Send + Sync {
    fn revoke(
        &self,
        resource: ResourceId,
        range: ByteRange,
        wanted: TokenMode,
    ) -> Result<(), TokenError>;
}

/// The node's cached data behind its tokens (page pool, kernel page cache). Called
/// before a token is given up, so no token ever leaves a node with dirty data under it.
pub trait CacheFlush: Send + Sync {
    /// Write back dirty data under `range` of `resource` and drop cached copies of it.
    fn flush_and_invalidate(
        &self,
        resource: ResourceId,
        range: ByteRange,
    ) -> Result<(), TokenError>;
}

/// A node that caches nothing (tests, tools).
pub struct NoCache;

impl CacheFlush for NoCache {
    fn flush_and_invalidate(&self, _: ResourceId, _: ByteRange) -> Result<(), TokenError> {
        Ok(())
    }
}

/// Revoke handlers of all in-process nodes, by node id. Over the network this becomes
/// "send a revoke message to node N".
#[derive(Default)]
pub struct RevokeRegistry {
    handlers: RwLock<HashMap<NodeId, Arc<dyn RevokeHandler>>>,
}

impl RevokeRegistry {
    pub fn new() -> Self {
        Self::default()
    }

    /// Install `handler` for `node`, returning the one it replaces.
    pub fn register(
        &self,
        node: NodeId,
        handler: Arc<dyn RevokeHandler>,
    ) -> Option<Arc<dyn RevokeHandler>> {
        self.handlers.write().insert(node, handler)
    }

    pub fn unregister(&self, node: NodeId) -> Option<Arc<dyn RevokeHandler>> {
        self.handlers.write().remove(&node)
    }

    pub fn handler(&self, node: NodeId) -> Option<Arc<dyn RevokeHandler>> {
        self.handlers.read().get(&node).cloned()
    }

    /// Remove `node`'s handler only if it is still `handler` (a newer client for the
    /// same node may have replaced it).
    fn unregister_if(&self, node: NodeId, handler: &Arc<dyn RevokeHandler>) {
        let mut handlers = self.handlers.write();
        if handlers
            .get(&node)
            .is_some_and(|h| std::ptr::addr_eq(Arc::as_ptr(h), Arc::as_ptr(handler)))
        {
            handlers.remove(&node);
        }
    }
}

/// Limits of one token client.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenClientLimits {
    /// Manager round trips per acquire before giving up with
    /// `TokenError::AttemptsExhausted`. More than one is needed when a revoked holder
    /// re-acquires, or a third node gets in, before the retry arrives.
    pub acquire_attempts_max: u32,
}

impl Default for TokenClientLimits {
    fn default() -> Self {
        TokenClientLimits {
            acquire_attempts_max: 8,
        }
    }
}

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
}

/// State shared between the client and the revoke handler it registers.
struct ClientShared {
    node: NodeId,
    manager: Arc<TokenManager>,
    cache_flush: Arc<dyn CacheFlush>,
    /// What this node holds, as far as it knows. Always a subset of what the manager
    /// records for it: entries are added only after the manager granted them and
    /// removed before the manager is told they are given up.
    cache: RwLock<HashMap<ResourceId, HeldRanges>>,
    /// Serialises "ask the manager, then update the cache" against "update the cache,
    /// then tell the manager", so a local acquire cannot re-insert a range a revoke is
    /// giving up. Never held while calling another node, so nodes cannot deadlock.
    update: Mutex<()>,
    covered: AtomicU64,
    manager_calls: AtomicU64,
    revokes_sent: AtomicU64,
    revokes_answered: AtomicU64,
}

impl ClientShared {
    /// Give up what this node holds over `range`, keeping `keep` where the cached
    /// token covers it (a revoke for `ro` lets an `xw` holder keep `ro`).
    /// The caller holds `update`.
    fn give_up(
        &self,
        resource: ResourceId,
        range: ByteRange,
        keep: Option<TokenMode>,
    ) -> Result<(), TokenError> {
        // 1. Forget the range locally first, so from now on local users go to the
        //    manager instead of trusting a token that is about to go.
        let kept: Vec<ByteRange> = {
            let mut cache = self.cache.write();
            let mut kept = Vec::new();
            if let Some(held) = cache.get_mut(&resource) {
                if let Some(keep) = keep {
                    kept = held
                        .pieces()
                        .iter()
                        .filter(|(_, m)| covers(*m, keep))
                        .filter_map(|(p, _)| p.intersect(&range))
                        .collect();
                }
                held.remove(range);
                if held.is_empty() {
                    cache.remove(&resource);
                }
            }
            kept
        };
        // 2. Write back dirty data and invalidate cached copies under the range.
        self.cache_flush.flush_and_invalidate(resource, range)?;
        // 3. Tell the manager: weaken the kept parts, drop the rest.
        let mut rest = vec![range];
        for &k in &kept {
            rest = rest
                .iter()
                .flat_map(|r| {
                    let (a, b) = r.subtract(&k);
                    [a, b]
                })
                .flatten()
                .collect();
        }
        if let Some(keep) = keep {
            for &k in &kept {
                self.manager.downgrade(self.node, resource, k, keep)?;
            }
        }
        for r in rest {
            self.manager.relinquish(self.node, resource, r)?;
        }
        // 4. Remember the weakened parts again: the manager now records them.
        if let Some(keep) = keep {
            if !kept.is_empty() {
                let mut cache = self.cache.write();
                let held = cache.entry(resource).or_default();
                for k in kept {
                    held.grant(k, keep);
                }
            }
        }
        Ok(())
    }
}

/// The revoke handler a `TokenClient` registers for its node.
struct ClientRevokeHandler {
    shared: Arc<ClientShared>,
}

impl RevokeHandler for ClientRevokeHandler {
    fn revoke(
        &self,
        resource: ResourceId,
        range: ByteRange,
        wanted: TokenMode,
    ) -> Result<(), TokenError> {
        let shared = &self.shared;
        let _update = shared.update.lock();
        shared.revokes_answered.fetch_add(1, Ordering::Relaxed);
        // A shared wanted mode (ro, rw) can coexist with itself, so the holder keeps
        // that mode where it holds something covering it, instead of dropping it.
        let keep = compatible(wanted, wanted).then_some(wanted);
        shared.give_up(resource, range, keep)
    }
}

/// One node's token client.
pub struct TokenClient {
    shared: Arc<ClientShared>,
    handler: Arc<dyn RevokeHandler>,
    registry: Arc<RevokeRegistry>,
    limits: TokenClientLimits,
}

impl TokenClient {
    /// A client for `node`, registering its revoke handler in `registry` (replacing
    /// any earlier one for the same node, as after a restart).
    pub fn new(
        node: NodeId,
        manager: Arc<TokenManager>,
        registry: Arc<RevokeRegistry>,
        cache_flush: Arc<dyn CacheFlush>,
        limits: TokenClientLimits,
    ) -> Self {
        let shared = Arc::new(ClientShared {
            node,
            manager,
            cache_flush,
            cache: RwLock::new(HashMap::new()),
            update: Mutex::new(()),
            covered: AtomicU64::new(0),
            manager_calls: AtomicU64::new(0),
            revokes_sent: AtomicU64::new(0),
            revokes_answered: AtomicU64::new(0),
        });
        let handler: Arc<dyn RevokeHandler> = Arc::new(ClientRevokeHandler {
            shared: Arc::clone(&shared),
        });
        registry.register(node, Arc::clone(&handler));
        TokenClient {
            shared,
            handler,
            registry,
            limits,
        }
    }

    pub fn node(&self) -> NodeId {
        self.shared.node
    }

    /// Get `mode` over at least `required` (and up to `desired`) of `resource`,
    /// revoking conflicting holders as needed.
    pub fn acquire(
        &self,
        resource: ResourceId,
        mode: TokenMode,
        required: ByteRange,
        desired: ByteRange,
    ) -> Result<Grant, TokenError> {
        let node = self.shared.node;
        let mut req = AcquireRequest::new(node, resource, mode, required, desired);
        validate_request(&req)?;

        // 1. Hot path: already covered by a cached token, so no manager call.
        if let Some(run) = self.covered(resource, required, mode) {
            self.shared.covered.fetch_add(1, Ordering::Relaxed);
            let range = run.intersect(&desired).unwrap_or(required);
            return Ok(Grant {
                node,
                resource,
                mode,
                range,
            });
        }

        let mut last_copyset = Vec::new();
        for _attempt in 0..self.limits.acquire_attempts_max {
            // 2. Ask the manager, forwarding how many holders answered our revokes.
            //    On a grant, cache it before anyone can revoke it (we hold `update`).
            let copyset = {
                let _update = self.shared.update.lock();
                self.shared.manager_calls.fetch_add(1, Ordering::Relaxed);
                match self.shared.manager.acquire(req) {
                    Ok(grant) => {
                        self.shared
                            .cache
                            .write()
                            .entry(resource)
                            .or_default()
                            .grant(grant.range, grant.mode);
                        return Ok(grant);
                    }
                    Err(TokenError::Conflict { copyset, .. }) => copyset,
                    Err(other) => return Err(other),
                }
            };
            // 3. Conflict: ask each holder in the copyset to give up the part of its
            //    token that overlaps what we require (not holding our own lock, since
            //    the holder may at the same time be revoking from us).
            for holder in &copyset {
                self.revoke(resource, holder, required, mode)?;
            }
            // 4. Retry, forwarding the answers.
            req.revoke_answers = u32::try_from(copyset.len()).unwrap_or(u32::MAX);
            last_copyset = copyset;
        }
        Err(TokenError::AttemptsExhausted {
            node,
            resource,
            mode,
            required,
            attempts: self.limits.acquire_attempts_max,
            last_copyset,
        })
    }

    /// Whole-resource acquire (inode, allocation region, inode-map segment).
    pub fn acquire_whole(
        &self,
        resource: ResourceId,
        mode: TokenMode,
    ) -> Result<Grant, TokenError> {
        self.acquire(resource, mode, ByteRange::WHOLE, ByteRange::WHOLE)
    }

    /// The cache lookup of the hot path: one hash lookup under a shared lock, then a
    /// binary search over the node's few pieces on that resource.
    fn covered(
        &self,
        resource: ResourceId,
        range: ByteRange,
        mode: TokenMode,
    ) -> Option<ByteRange> {
        self.shared
            .cache
            .read()
            .get(&resource)
            .and_then(|held| held.covering_run(range, mode))
    }

    fn revoke(
        &self,
        resource: ResourceId,
        holder: &Holder,
        required: ByteRange,
        wanted: TokenMode,
    ) -> Result<(), TokenError> {
        let range = holder.range.intersect(&required).unwrap_or(holder.range);
        let handler = self
            .registry
            .handler(holder.node)
            .ok_or(TokenError::NoRevokeHandler {
                node: holder.node,
                resource,
            })?;
        self.shared.revokes_sent.fetch_add(1, Ordering::Relaxed);
        handler
            .revoke(resource, range, wanted)
            .map_err(|source| TokenError::RevokeFailed {
                node: holder.node,
                resource,
                range,
                source: Box::new(source),
            })
    }

    /// Give up this node's tokens over `range`, flushing cached data there first.
    pub fn release(&self, resource: ResourceId, range: ByteRange) -> Result<(), TokenError> {
        validate_range(self.shared.node, resource, range)?;
        let _update = self.shared.update.lock();
        self.shared.give_up(resource, range, None)
    }

    /// Give up every token this node holds (unmount), flushing each resource first.
    pub fn release_all(&self) -> Result<(), TokenError> {
        let _update = self.shared.update.lock();
        let resources: Vec<ResourceId> = self.shared.cache.read().keys().copied().collect();
        for resource in resources {
            self.shared.give_up(resource, ByteRange::WHOLE, None)?;
        }
        // The manager may record tokens the cache under-claims; drop those too.
        self.shared.manager.release_node(self.shared.node);
        Ok(())
    }

    /// What this node believes it holds on `resource`.
    pub fn held(&self, resource: ResourceId) -> Vec<(ByteRange, TokenMode)> {
        self.shared
            .cache
            .read()
            .get(&resource)
            .map(|h| h.pieces().to_vec())
            .unwrap_or_default()
    }

    /// Every resource with cached tokens, with what is held on it.
    pub fn held_all(&self) -> Vec<(ResourceId, Vec<(ByteRange, TokenMode)>)> {
        let mut out: Vec<_> = self
            .shared
            .cache
            .read()
            .iter()
            .map(|(r, h)| (*r, h.pieces().to_vec()))
            .collect();
        out.sort_by_key(|(r, _)| *r);
        out
    }

    pub fn stats(&self) -> TokenClientStats {
        let s = &self.shared;
        TokenClientStats {
            covered: s.covered.load(Ordering::Relaxed),
            manager_calls: s.manager_calls.load(Ordering::Relaxed),
            revokes_sent: s.revokes_sent.load(Ordering::Relaxed),
            revokes_answered: s.revokes_answered.load(Ordering::Relaxed),
        }
    }
}

impl Drop for TokenClient {
    /// Stop answering revokes for this node. Tokens stay with the manager until the
    /// node releases them or is recovered, as after a crash.
    fn drop(&mut self) {
        self.registry.unregister_if(self.shared.node, &self.handler);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manager::TokenManagerLimits;
    use crate::resource::ResourceKind;
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
        calls: Mutex<Vec<(ResourceId, ByteRange)>>,
        fail: std::sync::atomic::AtomicBool,
    }

    impl CacheFlush for RecordingCache {
        fn flush_and_invalidate(
            &self,
            resource: ResourceId,
            range: ByteRange,
        ) -> Result<(), TokenError> {
            self.calls.lock().push((resource, range));
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

    /// A revoke handler that records calls and otherwise does what it is told.
    struct RecordingHandler {
        node: NodeId,
        manager: Arc<TokenManager>,
        give_up: bool,
        calls: Mutex<Vec<(ResourceId, ByteRange, TokenMode)>>,
    }

    impl RevokeHandler for RecordingHandler {
        fn revoke(
            &self,
            resource: ResourceId,
            range: ByteRange,
            wanted: TokenMode,
        ) -> Result<(), TokenError> {
            self.calls.lock().push((resource, range, wanted));
            if self.give_up {
                self.manager.relinquish(self.node, resource, range)?;
            }
            Ok(())
        }
    }

    struct Cluster {
        manager: Arc<TokenManager>,
        registry: Arc<RevokeRegistry>,
    }

    impl Cluster {
        fn new() -> Self {
            Cluster {
                manager: Arc::new(TokenManager::new(TokenManagerLimits::default())),
                registry: Arc::new(RevokeRegistry::new()),
            }
        }

        fn client(&self, node: NodeId, cache: Arc<RecordingCache>) -> TokenClient {
            TokenClient::new(
                node,
                Arc::clone(&self.manager),
                Arc::clone(&self.registry),
                cache,
                TokenClientLimits::default(),
            )
        }
    }

    #[test]
    fn covered_acquire_skips_the_manager() {
        let c = Cluster::new();
        let a = c.client(A, Arc::default());
        let g = a
            .acquire(file(), Xw, r(0, 10), ByteRange::WHOLE)
            .expect("first");
        assert_eq!(g.range, ByteRange::WHOLE);
        let before = c.manager.stats().acquires;
        let g = a
            .acquire(file(), Ro, r(500, 600), r(0, 1000))
            .expect("covered by xw");
        assert_eq!(
            g.range,
            r(0, 1000),
            "hit reports the cached run within desired"
        );
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
        let g = b
            .acquire(file(), Xw, r(8192, 12288), ByteRange::WHOLE)
            .expect("b after revoke");
        assert_eq!(
            *cache_a.calls.lock(),
            vec![(file(), r(8192, 12288))],
            "A flushed exactly the required part"
        );
        assert!(cache_b.calls.lock().is_empty());
        assert_eq!(
            g.range,
            r(8192, 12288),
            "clipped by what A still holds on both sides"
        );
        assert_eq!(
            a.held(file()),
            vec![(r(0, 8192), Xw), (r(12288, u64::MAX), Xw)]
        );
        assert_eq!(b.held(file()), vec![(r(8192, 12288), Xw)]);
        assert_eq!((a.stats().revokes_answered, b.stats().revokes_sent), (1, 1));
        assert_eq!(
            c.manager.stats().revokes,
            1,
            "answers were forwarded with the retry"
        );

        // A reader revoking a writer lets the writer keep ro (downgrade, not drop).
        b.acquire(file(), Ro, r(0, 100), r(0, 100))
            .expect("b reads");
        assert_eq!(a.held(file())[0], (r(0, 100), Ro));
        assert!(c.manager.holders(file()).contains(&Holder {
            node: A,
            mode: Ro,
            range: r(0, 100)
        }));
        // A's repeat read there is still a hit.
        let calls = a.stats().manager_calls;
        a.acquire(file(), Ro, r(10, 20), r(10, 20)).expect("hit");
        assert_eq!(a.stats().manager_calls, calls);
    }

    #[test]
    fn raw_handler_is_called_with_holder_part_and_wanted_mode() {
        let c = Cluster::new();
        let handler = Arc::new(RecordingHandler {
            node: A,
            manager: Arc::clone(&c.manager),
            give_up: true,
            calls: Mutex::new(Vec::new()),
        });
        c.registry.register(A, handler.clone());
        c.manager
            .acquire(AcquireRequest::new(A, file(), Ro, r(0, 100), r(0, 100)))
            .expect("a");
        let b = c.client(B, Arc::default());
        b.acquire(file(), Rw, r(50, 200), r(50, 200)).expect("b");
        assert_eq!(*handler.calls.lock(), vec![(file(), r(50, 100), Rw)]);
        assert_eq!(
            c.manager.holders(file()),
            vec![
                Holder {
                    node: A,
                    mode: Ro,
                    range: r(0, 50)
                },
                Holder {
                    node: B,
                    mode: Rw,
                    range: r(50, 200)
                },
            ]
        );
    }

    #[test]
    fn revoke_errors_are_clear() {
        let c = Cluster::new();
        c.manager
            .acquire(AcquireRequest::new(A, file(), Xw, r(0, 10), r(0, 10)))
            .expect("a");
        let b = c.client(B, Arc::default());
        let e = b.acquire(file(), Ro, r(0, 1), r(0, 1)).unwrap_err();
        assert!(
            matches!(e, TokenError::NoRevokeHandler { node: A, .. }),
            "{e}"
        );
        assert!(e.to_string().contains("release_node"), "{e}");

        // A holder that answers but never gives up exhausts the attempts.
        c.registry.register(
            A,
            Arc::new(RecordingHandler {
                node: A,
                manager: Arc::clone(&c.manager),
                give_up: false,
                calls: Mutex::new(Vec::new()),
            }),
        );
        let e = b.acquire(file(), Ro, r(0, 1), r(0, 1)).unwrap_err();
        match &e {
            TokenError::AttemptsExhausted {
                attempts,
                last_copyset,
                ..
            } => {
                assert_eq!(*attempts, TokenClientLimits::default().acquire_attempts_max);
                assert_eq!(last_copyset[0].node, A);
            }
            other => panic!("expected AttemptsExhausted, got {other}"),
        }

        // A holder whose flush fails keeps its token and the error names it.
        c.manager.release_node(A);
        let cache_a = Arc::new(RecordingCache::default());
        let a = c.client(A, Arc::clone(&cache_a));
        a.acquire(file(), Xw, r(0, 10), r(0, 10)).expect("a again");
        cache_a.fail.store(true, Ordering::Relaxed);
        let e = b.acquire(file(), Ro, r(0, 1), r(0, 1)).unwrap_err();
        assert!(matches!(e, TokenError::RevokeFailed { node: A, .. }), "{e}");
        assert!(e.to_string().contains("injected disk error"), "{e}");
        assert_eq!(c.manager.holders(file())[0].node, A);
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
    fn dropping_a_client_unregisters_only_its_own_handler() {
        let c = Cluster::new();
        let old = c.client(A, Arc::default());
        let new = c.client(A, Arc::default());
        drop(old);
        assert!(
            c.registry.handler(A).is_some(),
            "the newer client's handler stays"
        );
        drop(new);
        assert!(c.registry.handler(A).is_none());
    }

    /// Several nodes on threads fight over one file. Nothing may deadlock, every
    /// failure must be contention (attempts exhausted), and at the end the table holds
    /// no conflicting tokens and no cache claims more than the manager records.
    #[test]
    fn concurrent_clients_stay_coherent() {
        use rand::{Rng, SeedableRng};
        let c = Arc::new(Cluster::new());
        let clients: Vec<Arc<TokenClient>> = (0..3)
            .map(|n| Arc::new(c.client(NodeId(n), Arc::default())))
            .collect();
        let threads: Vec<_> = clients
            .iter()
            .enumerate()
            .map(|(seed, client)| {
                let client = Arc::clone(client);
                std::thread::spawn(move || {
                    let mut rng = rand::rngs::StdRng::seed_from_u64(seed as u64);
                    for _ in 0..2000 {
                        let mode = TokenMode::ALL[rng.gen_range(0..3)];
                        let start = rng.gen_range(0..64);
                        let required = r(start, start + rng.gen_range(1..16));
                        if rng.gen_bool(0.1) {
                            client.release(file(), required).expect("release");
                            continue;
                        }
                        match client.acquire(file(), mode, required, ByteRange::WHOLE) {
                            Ok(g) => assert!(g.range.contains(&required)),
                            Err(TokenError::AttemptsExhausted { .. }) => {}
                            Err(e) => panic!("unexpected error under contention: {e}"),
                        }
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().expect("client thread panicked");
        }
        let holders = c.manager.holders(file());
        for (i, a) in holders.iter().enumerate() {
            for b in &holders[i + 1..] {
                if a.node != b.node && a.range.overlaps(&b.range) {
                    assert!(compatible(a.mode, b.mode), "{a} and {b} conflict");
                }
            }
        }
        for client in &clients {
            let mut actual = HeldRanges::default();
            for h in holders.iter().filter(|h| h.node == client.node()) {
                actual.grant(h.range, h.mode);
            }
            for (range, mode) in client.held(file()) {
                assert!(
                    actual.covering_run(range, mode).is_some(),
                    "{} caches {mode} {range}",
                    client.node()
                );
            }
        }
    }
}
