//! mako-cluster: the replicated cluster configuration (DESIGN.md, issue 13 item 2).
//!
//! Nodes, roles, disks with their NSD servers, file systems and configuration
//! parameters live in one [`ClusterConfig`] that the quorum nodes (1, 3 or 5) keep with
//! openraft; every change is a raft log entry ([`Command`]) applied in the same order on
//! every node, and the raft leader is the cluster manager. Client nodes follow as raft
//! learners: they receive every change but do not vote.
//!
//! - `model`: the configuration, the commands and their validation.
//! - `codec`: the versioned, checksummed encoding of everything stored.
//! - `store`: the raft log and the applied state in one redb file per node
//!   (`<data_dir>/cluster.redb`), snapshots included.
//! - `network`: raft's messages over `mako_rt::Transport` (the `Cluster` service), so
//!   the same code runs over mako-rpc's TCP transport and in one process.
//! - `quorum`: [`Quorum`], the synchronous handle the daemon and the CLI use, and
//!   [`QuorumError`], which says what is wrong (no quorum and who answers, not the
//!   leader and who is, a node unreachable).
//!
//! Only the configuration goes through raft: tokens, I/O and per-operation traffic
//! never do.

pub mod codec;
pub mod lease;
pub mod model;
pub mod network;
pub mod quorum;
pub mod store;

pub use model::{
    parse_address, ClusterConfig, Command, ConfigError, DiskEntry, Expel, FsEntry, NodeEntry,
    NodeLease, Role, Scope, FIRST_LEASE_EPOCH,
};
pub use quorum::{Quorum, QuorumError, QuorumOptions};

use serde::{Deserialize, Serialize};
use std::fmt;
// The snapshot type `declare_raft_types!` names by default.
use std::io::Cursor;

/// Raft's node ids are `mako_rt::NodeId` numbers widened to u64.
pub type RaftNodeId = u64;

/// What raft's membership records about a node: enough to name it in errors and for
/// the daemon to give its transport the node's address.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Member {
    pub name: String,
    /// `IP:port` of the node's daemon.
    pub address: String,
}

impl fmt::Display for Member {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} at {}", self.name, self.address)
    }
}

/// One raft log entry: a command with the proposal's unique id. A proposal may reach
/// the log twice (a forwarded proposal retried after its reply was lost); the state
/// machine remembers the outcomes of recent ids and answers a repeat with the first
/// outcome instead of applying the command again.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Proposal {
    pub id: [u8; 16],
    pub command: Command,
}

impl fmt::Display for Proposal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.command.kind())
    }
}

/// The outcome of one applied command, as raft returns it to the proposer: the new
/// epoch, or why the configuration refused it (it then changed nothing).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Outcome(pub Result<u64, ConfigError>);

openraft::declare_raft_types!(
    /// The raft types of the cluster configuration.
    pub TypeConfig:
        D = Proposal,
        R = Outcome,
        NodeId = RaftNodeId,
        Node = Member,
);

/// A mako node's raft id.
pub fn raft_id(node: mako_rt::NodeId) -> RaftNodeId {
    u64::from(node.0)
}

/// The mako node of a raft id (raft ids are only ever made by [`raft_id`]).
pub fn mako_id(id: RaftNodeId) -> Option<mako_rt::NodeId> {
    u32::try_from(id).ok().map(mako_rt::NodeId)
}
