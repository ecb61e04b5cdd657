//! Raft's messages over `mako_rt::Transport`: the requests and replies of the
//! `Cluster` service, and openraft's `RaftNetworkFactory` that sends them.
//!
//! The transport is synchronous (a call blocks its thread until the reply or the
//! deadline), openraft is async: every call runs on tokio's blocking pool, so a slow
//! or dead peer never holds one of raft's tasks. Each call carries openraft's own
//! deadline for it (`RPCOption::hard_ttl`). Heartbeats, votes, log entries and probes
//! go on small-message lanes (their handlers answer at once); snapshots, and changes
//! and reads forwarded to the cluster manager (which may wait for the quorum), on
//! bulk lanes.

use crate::model::ClusterConfig;
use crate::quorum::{NodeStatus, QuorumError};
use crate::{mako_id, Member, Proposal, RaftNodeId, TypeConfig};
use mako_rt::{CallOptions, Priority, ServiceId, Transport, TransportError};
use openraft::error::{
    InstallSnapshotError, NetworkError, RPCError, RaftError, RemoteError, Unreachable,
};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use std::time::Duration;

/// A request to a node's `Cluster` service.
#[derive(Debug, Serialize, Deserialize)]
pub enum ClusterRequest {
    Vote(VoteRequest<RaftNodeId>),
    Append(AppendEntriesRequest<TypeConfig>),
    Snapshot(InstallSnapshotRequest<TypeConfig>),
    /// A change proposed on another node, for the cluster manager to commit within
    /// the proposer's remaining deadline.
    Propose {
        proposal: Proposal,
        deadline: Duration,
    },
    /// A linearizable read, for the cluster manager to answer.
    Read {
        deadline: Duration,
    },
    /// Whether the node answers, and what it knows of the quorum.
    Ping,
}

/// A reply of the `Cluster` service.
#[derive(Debug, Serialize, Deserialize)]
pub enum ClusterReply {
    Vote(Result<VoteResponse<RaftNodeId>, RaftError<RaftNodeId>>),
    Append(Result<AppendEntriesResponse<RaftNodeId>, RaftError<RaftNodeId>>),
    Snapshot(
        Result<InstallSnapshotResponse<RaftNodeId>, RaftError<RaftNodeId, InstallSnapshotError>>,
    ),
    Proposed(Result<u64, QuorumError>),
    Config(Result<ClusterConfig, QuorumError>),
    Pong(NodeStatus),
    /// The request could not be served at all (undecodable, or the node is stopping).
    Refused(String),
}

/// Sends `request` to `to` and waits for the reply, off raft's tasks.
pub(crate) async fn send(
    transport: &Arc<dyn Transport>,
    to: RaftNodeId,
    request: &ClusterRequest,
    priority: Priority,
    deadline: Duration,
) -> Result<ClusterReply, TransportError> {
    let node = mako_id(to).ok_or_else(|| TransportError::Unreachable {
        node: mako_rt::NodeId(u32::MAX),
        reason: format!("raft node id {to} is not a Mako node number"),
    })?;
    let bytes = mako_rt::encode("cluster request", request)?;
    let transport = transport.clone();
    let options = CallOptions { priority, deadline };
    let reply = tokio::task::spawn_blocking(move || {
        transport.call(node, ServiceId::Cluster, bytes, options)
    })
    .await
    .map_err(|e| TransportError::Unreachable {
        node,
        reason: format!("the call's thread failed: {e}"),
    })??;
    mako_rt::decode("cluster reply", &reply)
}

/// Makes one connection object per peer; they are cheap (the transport keeps the
/// sockets).
pub struct Network {
    pub(crate) transport: Arc<dyn Transport>,
}

impl RaftNetworkFactory<TypeConfig> for Network {
    type Network = Connection;

    async fn new_client(&mut self, target: RaftNodeId, _node: &Member) -> Connection {
        Connection {
            transport: self.transport.clone(),
            target,
        }
    }
}

/// Raft's view of one peer.
pub struct Connection {
    transport: Arc<dyn Transport>,
    target: RaftNodeId,
}

/// A transport failure as openraft understands it: a node that is down or unknown is
/// `Unreachable` (openraft backs off), anything else a network error.
fn rpc_error<E: std::error::Error>(e: TransportError) -> RPCError<RaftNodeId, Member, E> {
    match e {
        TransportError::Unreachable { .. } | TransportError::NoService { .. } => {
            RPCError::Unreachable(Unreachable::new(&e))
        }
        _ => RPCError::Network(NetworkError::new(&e)),
    }
}

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct Unexpected(String);

fn unexpected<E: std::error::Error>(reply: ClusterReply) -> RPCError<RaftNodeId, Member, E> {
    let text = match reply {
        ClusterReply::Refused(reason) => format!("refused: {reason}"),
        other => format!("unexpected reply {other:?}"),
    };
    RPCError::Network(NetworkError::new(&Unexpected(text)))
}

impl Connection {
    fn remote<E: std::error::Error>(&self, e: E) -> RPCError<RaftNodeId, Member, E> {
        RPCError::RemoteError(RemoteError::new(self.target, e))
    }
}

impl RaftNetwork<TypeConfig> for Connection {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<
        AppendEntriesResponse<RaftNodeId>,
        RPCError<RaftNodeId, Member, RaftError<RaftNodeId>>,
    > {
        let request = ClusterRequest::Append(rpc);
        match send(
            &self.transport,
            self.target,
            &request,
            Priority::Small,
            option.hard_ttl(),
        )
        .await
        {
            Ok(ClusterReply::Append(Ok(r))) => Ok(r),
            Ok(ClusterReply::Append(Err(e))) => Err(self.remote(e)),
            Ok(other) => Err(unexpected(other)),
            Err(e) => Err(rpc_error(e)),
        }
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<
        InstallSnapshotResponse<RaftNodeId>,
        RPCError<RaftNodeId, Member, RaftError<RaftNodeId, InstallSnapshotError>>,
    > {
        let request = ClusterRequest::Snapshot(rpc);
        match send(
            &self.transport,
            self.target,
            &request,
            Priority::Bulk,
            option.hard_ttl(),
        )
        .await
        {
            Ok(ClusterReply::Snapshot(Ok(r))) => Ok(r),
            Ok(ClusterReply::Snapshot(Err(e))) => Err(self.remote(e)),
            Ok(other) => Err(unexpected(other)),
            Err(e) => Err(rpc_error(e)),
        }
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<RaftNodeId>,
        option: RPCOption,
    ) -> Result<VoteResponse<RaftNodeId>, RPCError<RaftNodeId, Member, RaftError<RaftNodeId>>> {
        let request = ClusterRequest::Vote(rpc);
        match send(
            &self.transport,
            self.target,
            &request,
            Priority::Small,
            option.hard_ttl(),
        )
        .await
        {
            Ok(ClusterReply::Vote(Ok(r))) => Ok(r),
            Ok(ClusterReply::Vote(Err(e))) => Err(self.remote(e)),
            Ok(other) => Err(unexpected(other)),
            Err(e) => Err(rpc_error(e)),
        }
    }
}
