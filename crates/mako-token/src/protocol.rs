//! The token protocol's messages and the manager's service: what travels between a
//! node's `TokenClient` and its token manager shard, and between a requester and the
//! holders it revokes (docs/coherence.md section 2). Plain data, postcard on the wire.

use crate::client::ManagerMap;
use crate::error::TokenError;
use crate::manager::{AcquireRequest, Grant, HeldToken, Holder, TokenManager, TokenStats};
use crate::mode::TokenMode;
use crate::range::ByteRange;
use crate::resource::{NodeId, ResourceId};
use mako_rt::{decode, encode, Service};
use serde::{Deserialize, Serialize};
use std::sync::Arc;

/// Requests to a token manager shard.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum ManagerRequest {
    Acquire(AcquireRequest),
    /// Several acquires in one message, each answered as `Acquire` would be, in
    /// order (`ManagerReply::Each`). Sent only with requests that never queue
    /// (`AcquireRequest::waiter` is `None`), for resources of one manager node
    /// (`TokenClient::try_acquire_fresh`).
    AcquireEach(Vec<AcquireRequest>),
    Relinquish {
        node: NodeId,
        resource: ResourceId,
        range: ByteRange,
    },
    Downgrade {
        node: NodeId,
        resource: ResourceId,
        range: ByteRange,
        to: TokenMode,
    },
    /// The requester of queued request `waiter` stopped waiting.
    Cancel {
        node: NodeId,
        resource: ResourceId,
        waiter: u64,
    },
    /// A call to `node` failed (it is unreachable, or its token client stopped): its
    /// queued requests on this manager stand in nobody's way any more. What it holds
    /// stays (only recovery may take that from it); if it lives and still waits, it
    /// is queued again, at the back, when it asks again.
    DropWaiters(NodeId),
    /// `node` answered which of its acquires of `resource` run (`ClientRequest::
    /// PingWaiting`): its queued requests there other than `keep` are left over (a
    /// cancel that never arrived, an earlier incarnation of the node) and stand in
    /// nobody's way. One of `node`'s acquires that began after its answer and was
    /// queued meanwhile is dropped too: it is queued again, at the back, when it asks
    /// again (as after `DropWaiters`).
    DropWaitersOn {
        node: NodeId,
        resource: ResourceId,
        keep: Vec<u64>,
    },
    /// Drop everything a node holds (it unmounted, or recovery released it).
    ReleaseNode(NodeId),
    LocateMetanode {
        node: NodeId,
        resource: ResourceId,
        become_if_none: bool,
    },
    ResignMetanode {
        node: NodeId,
        resource: ResourceId,
    },
    SetVersion {
        resource: ResourceId,
        version: u64,
    },
    Holders(ResourceId),
    Dump,
    Stats,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum ManagerReply {
    Granted(Grant),
    Done,
    Metanode(Option<NodeId>),
    Holders(Vec<Holder>),
    Dump(Vec<(ResourceId, Vec<Holder>)>),
    Stats(TokenStats),
    /// Conflicts come back as `TokenError::Conflict` with the copyset.
    Failed(TokenError),
    /// The answers to `ManagerRequest::AcquireEach`, one per request, in order.
    Each(Vec<ManagerReply>),
}

/// Requests to a node's token client.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum ClientRequest {
    /// Give up (or weaken to what `wanted` can share with) the tokens over `range`.
    Revoke {
        resource: ResourceId,
        range: ByteRange,
        wanted: TokenMode,
    },
    /// Are you there? Asked of the nodes whose queued requests an acquire has waited
    /// behind for a while: if one does not answer, its requests are dropped from the
    /// manager's queue (`ManagerRequest::DropWaiters`).
    Ping,
    /// Are you there, and which of your acquires of `resource` run? Asked like
    /// `Ping`; the node's queued requests on the resource of acquires that no longer
    /// run are dropped (`ManagerRequest::DropWaitersOn`), which otherwise would hold
    /// the queue for the manager's whole waiter lease.
    PingWaiting(ResourceId),
    /// From the manager: queued request `waiter` of this node on `resource` has nobody
    /// older in its way any more — ask again now (docs/coherence.md section 2). Sent
    /// without waiting for the answer (`Transport::post`); a lost one costs the waiter
    /// its slow safety poll (`TokenClientLimits::queue_poll_ms`).
    Turn { resource: ResourceId, waiter: u64 },
    /// From a manager that took over slot `slot` of the routing (its previous node
    /// failed) and rebuilds its table (docs/coherence.md section 7b): route by
    /// `managers` from now on, and report every token held on a resource of the slot.
    HeldIn { slot: u32, managers: ManagerMap },
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum ClientReply {
    Revoked,
    /// The answer to `Ping`.
    Alive,
    /// The answer to `PingWaiting`: the ids (`AcquireRequest::waiter`) of the
    /// node's running acquires of the resource, which may be queued.
    Waiting(Vec<u64>),
    /// The answer to `HeldIn`.
    Held(Vec<HeldToken>),
    Failed(TokenError),
}

/// The token manager as a service of the node hosting it.
pub struct ManagerService {
    pub manager: Arc<TokenManager>,
}

impl ManagerService {
    pub fn answer(&self, request: ManagerRequest) -> ManagerReply {
        let m = &self.manager;
        match request {
            ManagerRequest::Acquire(req) => match m.acquire(req) {
                Ok(g) => ManagerReply::Granted(g),
                Err(e) => ManagerReply::Failed(e),
            },
            ManagerRequest::AcquireEach(reqs) => ManagerReply::Each(
                reqs.into_iter()
                    .map(|req| match m.acquire(req) {
                        Ok(g) => ManagerReply::Granted(g),
                        Err(e) => ManagerReply::Failed(e),
                    })
                    .collect(),
            ),
            ManagerRequest::Relinquish {
                node,
                resource,
                range,
            } => match m.relinquish(node, resource, range) {
                Ok(()) => ManagerReply::Done,
                Err(e) => ManagerReply::Failed(e),
            },
            ManagerRequest::Downgrade {
                node,
                resource,
                range,
                to,
            } => match m.downgrade(node, resource, range, to) {
                Ok(()) => ManagerReply::Done,
                Err(e) => ManagerReply::Failed(e),
            },
            ManagerRequest::Cancel {
                node,
                resource,
                waiter,
            } => {
                m.cancel(node, resource, waiter);
                ManagerReply::Done
            }
            ManagerRequest::DropWaiters(node) => {
                m.drop_waiters(node);
                ManagerReply::Done
            }
            ManagerRequest::DropWaitersOn {
                node,
                resource,
                keep,
            } => {
                m.drop_waiters_on(node, resource, &keep);
                ManagerReply::Done
            }
            ManagerRequest::ReleaseNode(node) => {
                m.release_node(node);
                ManagerReply::Done
            }
            ManagerRequest::LocateMetanode {
                node,
                resource,
                become_if_none,
            } => match m.rebuild_refusal(resource) {
                // The metanode may be a node that has not reported yet.
                Some(e) => ManagerReply::Failed(e),
                None => ManagerReply::Metanode(m.locate_metanode(node, resource, become_if_none)),
            },
            ManagerRequest::ResignMetanode { node, resource } => {
                m.resign_metanode(node, resource);
                ManagerReply::Done
            }
            ManagerRequest::SetVersion { resource, version } => {
                m.set_version(resource, version);
                ManagerReply::Done
            }
            ManagerRequest::Holders(r) => ManagerReply::Holders(m.holders(r)),
            ManagerRequest::Dump => ManagerReply::Dump(m.dump()),
            ManagerRequest::Stats => ManagerReply::Stats(m.stats()),
        }
    }
}

impl Service for ManagerService {
    fn handle(&self, _from: NodeId, request: &[u8]) -> Vec<u8> {
        let reply = match decode::<ManagerRequest>("token manager request", request) {
            Ok(r) => self.answer(r),
            Err(e) => ManagerReply::Failed(TokenError::Transport(e.to_string())),
        };
        encode("token manager reply", &reply).unwrap_or_default()
    }
}
