//! Property test of the whole token layer: random operations by raw nodes (talking to
//! the manager directly) and client nodes (through `TokenClient`, revoking as needed),
//! with the safety invariants checked after every step.

use std::sync::Arc;

use parking_lot::Mutex;
use proptest::prelude::*;

use crate::held_ranges::HeldRanges;
use crate::{
    covers, AcquireRequest, ByteRange, ClientReply, ClientRequest, Grant, ManagerMap,
    ManagerService, NodeId, ResourceId, ResourceKind, TokenClient, TokenClientLimits, TokenError,
    TokenManager, TokenManagerLimits, TokenMode,
};
use mako_rt::{InProcessTransport, Registry, ServiceId};

/// The DESIGN §4 table written out independently of `mode::compatible`, so that a
/// wrong production table is caught here instead of being agreed with.
fn reference_compatible(a: TokenMode, b: TokenMode) -> bool {
    use TokenMode::*;
    match (a, b) {
        (Ro, Ro) => true,
        (Rw, Rw) => true,
        (Ro, Rw) | (Rw, Ro) => false,
        (Xw, _) | (_, Xw) => false,
    }
}

/// Nodes 0 and 1 talk to the manager directly; nodes 2 and 3 use clients.
const RAW_NODES: u32 = 2;
const CLIENT_NODES: u32 = 2;

fn resources() -> [ResourceId; 3] {
    [
        ResourceId::new(1, ResourceKind::ByteRange, 1),
        ResourceId::new(1, ResourceKind::DirBucket, 2),
        ResourceId::new(1, ResourceKind::Inode, 3),
    ]
}

/// A range spec over a small space so that collisions are frequent; `len == 0` makes
/// the range open-ended.
#[derive(Clone, Copy, Debug)]
struct RangeSpec {
    start: u64,
    len: u64,
}

impl RangeSpec {
    fn to_range(self, resource: ResourceId) -> ByteRange {
        if !resource.kind.is_ranged() {
            ByteRange::WHOLE
        } else if self.len == 0 {
            ByteRange::from(self.start)
        } else {
            ByteRange::new(self.start, self.start + self.len)
        }
    }
}

#[derive(Clone, Copy, Debug)]
struct AcquireSpec {
    resource: usize,
    mode: TokenMode,
    required: RangeSpec,
    /// How far desired extends below and above required; `None` = to the edge.
    below: Option<u64>,
    above: Option<u64>,
}

impl AcquireSpec {
    fn ranges(&self) -> (ResourceId, ByteRange, ByteRange) {
        let resource = resources()[self.resource];
        let required = self.required.to_range(resource);
        let desired = if resource.kind.is_ranged() {
            ByteRange::new(
                self.below.map_or(0, |b| required.start.saturating_sub(b)),
                self.above
                    .map_or(u64::MAX, |a| required.end.saturating_add(a)),
            )
        } else {
            ByteRange::WHOLE
        };
        (resource, required, desired)
    }
}

#[derive(Clone, Debug)]
enum Op {
    RawAcquire {
        node: u32,
        spec: AcquireSpec,
    },
    RawRelinquish {
        node: u32,
        resource: usize,
        range: RangeSpec,
    },
    RawDowngrade {
        node: u32,
        resource: usize,
        range: RangeSpec,
        to: TokenMode,
    },
    ReleaseNode {
        node: u32,
    },
    ClientAcquire {
        client: u32,
        spec: AcquireSpec,
    },
    ClientRelease {
        client: u32,
        resource: usize,
        range: RangeSpec,
    },
    ClientReleaseAll {
        client: u32,
    },
}

fn mode() -> impl Strategy<Value = TokenMode> {
    prop_oneof![
        Just(TokenMode::Ro),
        Just(TokenMode::Rw),
        Just(TokenMode::Xw)
    ]
}

fn range_spec() -> impl Strategy<Value = RangeSpec> {
    (0u64..64, 0u64..24).prop_map(|(start, len)| RangeSpec { start, len })
}

fn acquire_spec() -> impl Strategy<Value = AcquireSpec> {
    (
        0usize..3,
        mode(),
        range_spec(),
        proptest::option::of(0u64..32),
        proptest::option::of(0u64..32),
    )
        .prop_map(|(resource, mode, required, below, above)| AcquireSpec {
            resource,
            mode,
            required,
            below,
            above,
        })
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (0..RAW_NODES, acquire_spec()).prop_map(|(node, spec)| Op::RawAcquire { node, spec }),
        1 => (0..RAW_NODES, 0usize..3, range_spec())
            .prop_map(|(node, resource, range)| Op::RawRelinquish { node, resource, range }),
        1 => (0..RAW_NODES, 0usize..3, range_spec(), mode())
            .prop_map(|(node, resource, range, to)| Op::RawDowngrade { node, resource, range, to }),
        1 => (0..RAW_NODES + CLIENT_NODES).prop_map(|node| Op::ReleaseNode { node }),
        4 => (0..CLIENT_NODES, acquire_spec())
            .prop_map(|(client, spec)| Op::ClientAcquire { client, spec }),
        1 => (0..CLIENT_NODES, 0usize..3, range_spec())
            .prop_map(|(client, resource, range)| Op::ClientRelease { client, resource, range }),
        1 => (0..CLIENT_NODES).prop_map(|client| Op::ClientReleaseAll { client }),
    ]
}

/// A raw node gives up exactly what it is asked to, and records the request.
struct RawHandler {
    node: NodeId,
    manager: Arc<TokenManager>,
    calls: Mutex<u64>,
}

impl mako_rt::Service for RawHandler {
    fn handle(&self, _from: NodeId, request: &[u8]) -> Vec<u8> {
        *self.calls.lock() += 1;
        let reply = match mako_rt::decode::<ClientRequest>("revoke", request) {
            Ok(ClientRequest::Revoke {
                resource, range, ..
            }) => match self.manager.relinquish(self.node, resource, range) {
                Ok(()) => ClientReply::Revoked,
                Err(e) => ClientReply::Failed(e),
            },
            Ok(ClientRequest::Ping) => ClientReply::Alive,
            Ok(ClientRequest::PingWaiting(_)) => ClientReply::Waiting(true),
            Ok(ClientRequest::Turn { .. }) => ClientReply::Alive,
            Ok(ClientRequest::HeldIn { .. }) => {
                ClientReply::Failed(TokenError::Transport("not a token client".into()))
            }
            Err(e) => ClientReply::Failed(TokenError::Transport(e.to_string())),
        };
        mako_rt::encode("revoke reply", &reply).expect("encode")
    }
}

/// The node hosting the manager service (not a token holder).
const MANAGER_NODE: NodeId = NodeId(1000);

struct World {
    manager: Arc<TokenManager>,
    registry: Arc<Registry>,
    clients: Vec<TokenClient>,
}

impl World {
    fn new() -> Self {
        let manager = Arc::new(TokenManager::with_shards(TokenManagerLimits::default(), 2));
        let registry = Registry::new();
        registry.register(
            MANAGER_NODE,
            ServiceId::TokenManager,
            Arc::new(ManagerService {
                manager: Arc::clone(&manager),
            }),
        );
        for n in 0..RAW_NODES {
            let node = NodeId(n);
            registry.register(
                node,
                ServiceId::TokenClient,
                Arc::new(RawHandler {
                    node,
                    manager: Arc::clone(&manager),
                    calls: Mutex::new(0),
                }),
            );
        }
        let mut world = World {
            manager,
            registry,
            clients: Vec::new(),
        };
        world.clients = (0..CLIENT_NODES).map(|c| world.new_client(c)).collect();
        world
    }

    fn new_client(&self, client: u32) -> TokenClient {
        let node = NodeId(RAW_NODES + client);
        let c = TokenClient::new(
            node,
            Arc::new(InProcessTransport::new(node, self.registry.clone())),
            ManagerMap::single(MANAGER_NODE),
            TokenClientLimits::default(),
        );
        self.registry
            .register(node, ServiceId::TokenClient, c.service());
        c
    }

    fn node_held(&self, node: NodeId, resource: ResourceId) -> HeldRanges {
        let mut held = HeldRanges::default();
        for h in self
            .manager
            .holders(resource)
            .into_iter()
            .filter(|h| h.node == node)
        {
            held.grant(h.range, h.mode);
        }
        held
    }

    fn step(&mut self, op: &Op) -> Result<(), TestCaseError> {
        match *op {
            Op::RawAcquire { node, spec } => {
                let (resource, required, desired) = spec.ranges();
                let node = NodeId(node);
                let before = self.manager.holders(resource);
                match self.manager.acquire(AcquireRequest::new(
                    node, resource, spec.mode, required, desired,
                )) {
                    Ok(grant) => self.check_grant(&grant, required, desired)?,
                    Err(TokenError::Conflict { copyset, .. }) => {
                        // Exactly the foreign, overlapping, incompatible holders.
                        let expected: Vec<_> = before
                            .iter()
                            .filter(|h| h.node != node)
                            .filter(|h| h.range.overlaps(&required))
                            .filter(|h| !reference_compatible(h.mode, spec.mode))
                            .copied()
                            .collect();
                        let mut got = copyset.clone();
                        got.sort();
                        let mut expected = expected;
                        expected.sort();
                        prop_assert_eq!(got, expected);
                        prop_assert_eq!(
                            self.manager.holders(resource),
                            before,
                            "refusal changed the table"
                        );
                    }
                    Err(e) => prop_assert!(false, "unexpected error {}", e),
                }
            }
            Op::RawRelinquish {
                node,
                resource,
                range,
            } => {
                let resource = resources()[resource];
                let range = range.to_range(resource);
                self.manager
                    .relinquish(NodeId(node), resource, range)
                    .map_err(|e| TestCaseError::fail(e.to_string()))?;
                for h in self.manager.holders(resource) {
                    prop_assert!(
                        h.node != NodeId(node) || !h.range.overlaps(&range),
                        "{} survived relinquish {}",
                        h,
                        range
                    );
                }
            }
            Op::RawDowngrade {
                node,
                resource,
                range,
                to,
            } => {
                let resource = resources()[resource];
                let range = range.to_range(resource);
                let node = NodeId(node);
                let before = self.node_held(node, resource);
                match self.manager.downgrade(node, resource, range, to) {
                    Ok(()) => {
                        for &(piece, m) in self.node_held(node, resource).pieces() {
                            if piece.overlaps(&range) {
                                prop_assert_eq!(m, to);
                            }
                        }
                    }
                    Err(TokenError::NotADowngrade { held, .. }) => {
                        prop_assert!(!covers(held, to));
                        prop_assert_eq!(self.node_held(node, resource), before);
                    }
                    Err(e) => prop_assert!(false, "unexpected error {}", e),
                }
            }
            Op::ReleaseNode { node } => {
                self.manager.release_node(NodeId(node));
                if node >= RAW_NODES {
                    // A client node that failed comes back with an empty cache.
                    let client = node - RAW_NODES;
                    let fresh = self.new_client(client);
                    self.clients[client as usize] = fresh;
                }
                for (_, holders) in self.manager.dump() {
                    prop_assert!(holders.iter().all(|h| h.node != NodeId(node)));
                }
            }
            Op::ClientAcquire { client, spec } => {
                let (resource, required, desired) = spec.ranges();
                let c = &self.clients[client as usize];
                c.acquire(resource, spec.mode, required, desired)
                    .map_err(|e| TestCaseError::fail(format!("client acquire failed: {e}")))?;
                let grant = Grant {
                    node: c.node(),
                    resource,
                    mode: spec.mode,
                    range: required,
                    version: 0,
                    metanode: false,
                    contenders: 0,
                };
                self.check_grant(&grant, required, desired)?;
                prop_assert!(c.try_hold(resource, spec.mode, required).is_some());
            }
            Op::ClientRelease {
                client,
                resource,
                range,
            } => {
                let resource = resources()[resource];
                let range = range.to_range(resource);
                let c = &self.clients[client as usize];
                c.release(resource, range)
                    .map_err(|e| TestCaseError::fail(e.to_string()))?;
                for h in self.manager.holders(resource) {
                    prop_assert!(h.node != c.node() || !h.range.overlaps(&range));
                }
            }
            Op::ClientReleaseAll { client } => {
                let c = &self.clients[client as usize];
                c.release_all()
                    .map_err(|e| TestCaseError::fail(e.to_string()))?;
                prop_assert!(c.held_all().is_empty());
            }
        }
        self.check_invariants()
    }

    /// Every grant contains required, lies within desired, and is really held.
    fn check_grant(
        &self,
        grant: &Grant,
        required: ByteRange,
        desired: ByteRange,
    ) -> Result<(), TestCaseError> {
        prop_assert!(
            grant.range.contains(&required),
            "grant {} misses required {}",
            grant.range,
            required
        );
        prop_assert!(
            desired.contains(&grant.range),
            "grant {} outside desired {}",
            grant.range,
            desired
        );
        prop_assert!(
            self.node_held(grant.node, grant.resource)
                .covering_run(grant.range, grant.mode)
                .is_some(),
            "manager does not record grant {:?}",
            grant
        );
        Ok(())
    }

    fn check_invariants(&self) -> Result<(), TestCaseError> {
        let dump = self.manager.dump();
        // 1. No two nodes hold overlapping ranges in incompatible modes.
        let mut total = 0;
        for (resource, holders) in &dump {
            total += holders.len();
            for (i, a) in holders.iter().enumerate() {
                for b in &holders[i + 1..] {
                    if a.node != b.node && a.range.overlaps(&b.range) {
                        prop_assert!(
                            reference_compatible(a.mode, b.mode),
                            "on {}: {} and {} conflict",
                            resource,
                            a,
                            b
                        );
                    }
                }
            }
        }
        // 2. The token counter matches the table.
        prop_assert_eq!(self.manager.stats().tokens, total);
        // 3. No client claims a token the manager does not record for it.
        for c in &self.clients {
            for (resource, pieces) in c.held_all() {
                let actual = self.node_held(c.node(), resource);
                for (range, mode) in pieces {
                    prop_assert!(
                        actual.covering_run(range, mode).is_some(),
                        "{} caches {} {} on {} but the manager records {:?}",
                        c.node(),
                        mode,
                        range,
                        resource,
                        actual.pieces()
                    );
                }
            }
        }
        Ok(())
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn token_table_never_grants_conflicting_modes(ops in proptest::collection::vec(op(), 1..60)) {
        let mut world = World::new();
        for op in &ops {
            world.step(op)?;
        }
    }
}
