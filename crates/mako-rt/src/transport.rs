//! How nodes talk: a request to a service on a node, a reply back (docs/coherence.md
//! section 1). Requests and replies are encoded with postcard, so what works through
//! the in-process and simulated transports is exactly what the network will carry.
//!
//! A service handler runs on whatever thread the transport gives it (the caller's, in
//! process; a server thread over the network). It must follow the rules of the
//! requests it serves (docs/coherence.md R4: leaf requests never wait for tokens).

use mako_diag::{CountedRwLock, LockClass};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

/// A cluster node.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct NodeId(pub u32);

impl fmt::Display for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "node {}", self.0)
    }
}

/// The services a node can offer (stable numbers: they go over the wire).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[repr(u16)]
pub enum ServiceId {
    /// The token manager (one shard per manager node).
    TokenManager = 1,
    /// A node's token client: revokes.
    TokenClient = 2,
    /// A node's file systems: metanode requests, frees for regions it owns.
    FileSystem = 3,
    /// The file-system manager: allocation regions and inode-map segments.
    FsManager = 4,
    /// The replicated cluster configuration (mako-cluster): raft messages between
    /// quorum nodes and learners, and changes forwarded to the cluster manager.
    Cluster = 5,
    /// An NSD server: block I/O on the disks this node serves to nodes without local
    /// access to them (mako-nsd).
    Nsd = 6,
    /// The cluster manager's lease service (mako-cluster's `lease`): renewals from
    /// every node, and the manager's pings of a node whose lease ran out.
    Lease = 7,
    /// A node's recovery of failed nodes: the cluster manager asks a surviving node
    /// that mounts a file system to replay an expelled node's log there (makod).
    Recovery = 8,
}

/// Priority class of a request: small metadata messages must never queue behind bulk
/// data (the network transport keeps separate connections for them).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Priority {
    Small,
    Bulk,
}

/// Per-call options.
#[derive(Clone, Copy, Debug)]
pub struct CallOptions {
    pub priority: Priority,
    /// How long the caller waits for the reply before `TransportError::Timeout`.
    pub deadline: Duration,
}

impl Default for CallOptions {
    fn default() -> Self {
        CallOptions {
            priority: Priority::Small,
            deadline: Duration::from_secs(60),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TransportError {
    #[error("{node} offers no {service:?} service (not started, or not a member of this cluster)")]
    NoService { node: NodeId, service: ServiceId },
    #[error("{node} did not answer a {service:?} request within {deadline:?}")]
    Timeout {
        node: NodeId,
        service: ServiceId,
        deadline: Duration,
    },
    #[error("could not encode a {what}: {reason}")]
    Encode { what: &'static str, reason: String },
    #[error("could not decode a {what} ({bytes} bytes): {reason}")]
    Decode {
        what: &'static str,
        bytes: usize,
        reason: String,
    },
    #[error("{node} is unreachable: {reason}")]
    Unreachable { node: NodeId, reason: String },
    /// `node` refused to serve this node (`Registry::admit`): e.g. this node was
    /// expelled from the cluster and must rejoin first.
    #[error("{node} refused this node's {service:?} request: {reason}")]
    Refused {
        node: NodeId,
        service: ServiceId,
        reason: String,
    },
}

/// A service: takes an encoded request from `from`, returns an encoded reply. A handler
/// answers every request; errors of the service travel inside its reply type.
pub trait Service: Send + Sync {
    fn handle(&self, from: NodeId, request: &[u8]) -> Vec<u8>;
}

/// One node's view of the cluster's transport.
pub trait Transport: Send + Sync {
    /// This node.
    fn local_node(&self) -> NodeId;
    /// Send `request` to `service` on `to` and wait for the reply.
    fn call(
        &self,
        to: NodeId,
        service: ServiceId,
        request: Vec<u8>,
        options: CallOptions,
    ) -> Result<Vec<u8>, TransportError>;
    /// Several calls at once (revokes to every holder of a copyset). The default sends
    /// them one after another; transports that can overlap them do.
    fn call_many(
        &self,
        calls: Vec<(NodeId, ServiceId, Vec<u8>)>,
        options: CallOptions,
    ) -> Vec<Result<Vec<u8>, TransportError>> {
        calls
            .into_iter()
            .map(|(to, service, request)| self.call(to, service, request, options))
            .collect()
    }
    /// Send `request` without waiting for its reply, which is dropped: a notice the
    /// sender does not depend on (the token manager telling a queued requester that its
    /// turn came). It may be lost like any message; its receiver must have a slower
    /// way to the same end. The default makes the call and ignores the result
    /// (the in-process transport runs the handler at once); transports whose calls
    /// take time send it in the background.
    fn post(&self, to: NodeId, service: ServiceId, request: Vec<u8>, options: CallOptions) {
        let _ = self.call(to, service, request, options);
    }
}

pub fn encode<T: Serialize>(what: &'static str, value: &T) -> Result<Vec<u8>, TransportError> {
    postcard::to_stdvec(value).map_err(|e| TransportError::Encode {
        what,
        reason: e.to_string(),
    })
}

pub fn decode<T: DeserializeOwned>(what: &'static str, bytes: &[u8]) -> Result<T, TransportError> {
    postcard::from_bytes(bytes).map_err(|e| TransportError::Decode {
        what,
        bytes: bytes.len(),
        reason: e.to_string(),
    })
}

/// A typed call: encode `request`, send it, decode the reply.
pub fn call<Req: Serialize, Rep: DeserializeOwned>(
    transport: &dyn Transport,
    to: NodeId,
    service: ServiceId,
    request: &Req,
    options: CallOptions,
) -> Result<Rep, TransportError> {
    let bytes = encode("request", request)?;
    let reply = transport.call(to, service, bytes, options)?;
    decode("reply", &reply)
}

static REGISTRY_LOCK: LockClass = LockClass::new("transport.registry");

/// The words every `TransportError::Refused` shows: errors that reach the file system
/// as text (`FsError::Token`) are recognised as a refusal by them (`is_refusal`).
pub const REFUSED_WORDS: &str = "refused this node's";

/// True if `text` tells of a `TransportError::Refused` (this node is not served:
/// fenced, e.g. expelled).
pub fn is_refusal(text: &str) -> bool {
    text.contains(REFUSED_WORDS)
}

/// Whether node `from` may be served by `service` here; `Err` says why not.
pub type Admit = Arc<dyn Fn(NodeId, ServiceId) -> Result<(), String> + Send + Sync>;

impl ServiceId {
    /// The services whose requests change the file system state shared by the
    /// nodes (tokens, metanode updates, space): a node expelled from the cluster is
    /// refused them (`Registry::set_admit`) until it rejoins, so one that comes back
    /// from a pause or a partition cannot undo what a survivor recovered. Leases, the
    /// cluster configuration and recovery stay open to it (it must rejoin through
    /// them); NSD servers fence disk requests themselves.
    pub fn fenced(self) -> bool {
        matches!(
            self,
            ServiceId::TokenManager
                | ServiceId::TokenClient
                | ServiceId::FileSystem
                | ServiceId::FsManager
        )
    }
}

/// The services of the nodes in one process, by (node, service).
pub struct Registry {
    services: CountedRwLock<BTreeMap<(NodeId, ServiceId), Arc<dyn Service>>>,
    admit: std::sync::OnceLock<Admit>,
}

impl Default for Registry {
    fn default() -> Self {
        Registry {
            services: CountedRwLock::new(&REGISTRY_LOCK, BTreeMap::new()),
            admit: std::sync::OnceLock::new(),
        }
    }
}

impl Registry {
    pub fn new() -> Arc<Registry> {
        Arc::new(Registry::default())
    }

    /// Offer `service` on `node` (replacing what was there).
    pub fn register(&self, node: NodeId, id: ServiceId, service: Arc<dyn Service>) {
        self.services.write().insert((node, id), service);
    }

    pub fn unregister(&self, node: NodeId, id: ServiceId) {
        self.services.write().remove(&(node, id));
    }

    /// Withdraw every service of `node` (it stopped).
    pub fn unregister_node(&self, node: NodeId) {
        self.services.write().retain(|(n, _), _| *n != node);
    }

    pub fn service(&self, node: NodeId, id: ServiceId) -> Option<Arc<dyn Service>> {
        self.services.read().get(&(node, id)).cloned()
    }

    /// Sets the fence every transport asks before it runs a request of a fenced
    /// service (`ServiceId::fenced`) for another node. Set once; false if one was set.
    pub fn set_admit(&self, admit: Admit) -> bool {
        self.admit.set(admit).is_ok()
    }

    /// `admit` for a call from `from` to `service` on node `to`, refused as the
    /// transport says it (`TransportError::Refused`).
    pub fn admit_call(
        &self,
        from: NodeId,
        to: NodeId,
        service: ServiceId,
    ) -> Result<(), TransportError> {
        self.admit(from, service)
            .map_err(|reason| TransportError::Refused {
                node: to,
                service,
                reason,
            })
    }

    /// Whether a request from `from` to `service` is served (always, without a fence
    /// or for a service that is not fenced).
    pub fn admit(&self, from: NodeId, service: ServiceId) -> Result<(), String> {
        match self.admit.get() {
            Some(admit) if service.fenced() => admit(from, service),
            _ => Ok(()),
        }
    }
}

/// Calls between nodes of one process: the handler runs on the caller's thread, at
/// once. Used by a single-node `makod` (its own services) and by several nodes in one
/// process.
pub struct InProcessTransport {
    me: NodeId,
    registry: Arc<Registry>,
}

impl InProcessTransport {
    pub fn new(me: NodeId, registry: Arc<Registry>) -> InProcessTransport {
        InProcessTransport { me, registry }
    }
    pub fn registry(&self) -> &Arc<Registry> {
        &self.registry
    }
}

impl Transport for InProcessTransport {
    fn local_node(&self) -> NodeId {
        self.me
    }

    fn call(
        &self,
        to: NodeId,
        service: ServiceId,
        request: Vec<u8>,
        _options: CallOptions,
    ) -> Result<Vec<u8>, TransportError> {
        self.registry.admit_call(self.me, to, service)?;
        let handler = self
            .registry
            .service(to, service)
            .ok_or(TransportError::NoService { node: to, service })?;
        Ok(handler.handle(self.me, &request))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Serialize, Deserialize, Debug, PartialEq)]
    enum EchoRequest {
        Add(u32, u32),
        Name,
    }

    struct Echo(NodeId);
    impl Service for Echo {
        fn handle(&self, from: NodeId, request: &[u8]) -> Vec<u8> {
            let reply: String = match decode::<EchoRequest>("echo", request) {
                Ok(EchoRequest::Add(a, b)) => format!("{}", a + b),
                Ok(EchoRequest::Name) => format!("{} asked {}", from, self.0),
                Err(e) => e.to_string(),
            };
            encode("echo reply", &reply).expect("encode")
        }
    }

    #[test]
    fn typed_calls_between_nodes_of_one_process() {
        let reg = Registry::new();
        reg.register(NodeId(2), ServiceId::FileSystem, Arc::new(Echo(NodeId(2))));
        let t = InProcessTransport::new(NodeId(1), reg.clone());
        let r: String = call(
            &t,
            NodeId(2),
            ServiceId::FileSystem,
            &EchoRequest::Add(2, 3),
            CallOptions::default(),
        )
        .expect("call");
        assert_eq!(r, "5");
        let r: String = call(
            &t,
            NodeId(2),
            ServiceId::FileSystem,
            &EchoRequest::Name,
            CallOptions::default(),
        )
        .expect("call");
        assert_eq!(r, "node 1 asked node 2");
        let e = call::<_, String>(
            &t,
            NodeId(3),
            ServiceId::FileSystem,
            &EchoRequest::Name,
            CallOptions::default(),
        )
        .unwrap_err();
        assert!(matches!(e, TransportError::NoService { .. }), "{e}");
        assert!(e.to_string().contains("node 3"), "{e}");
        reg.unregister_node(NodeId(2));
        assert!(reg.service(NodeId(2), ServiceId::FileSystem).is_none());
        // A reply of the wrong type is a clear decode error, never a panic.
        reg.register(NodeId(2), ServiceId::FileSystem, Arc::new(Echo(NodeId(2))));
        let e = call::<_, (u64, u64, u64)>(
            &t,
            NodeId(2),
            ServiceId::FileSystem,
            &EchoRequest::Add(1, 1),
            CallOptions::default(),
        )
        .unwrap_err();
        assert!(matches!(e, TransportError::Decode { .. }), "{e}");
    }
}
